/* check_blobxfer.c - a task's checkpoint upload straight to the blob store
 * (client/blobxfer.c, executor/report.c's report_upload_ckpt) and the
 * downloads that follow the server's 307 to it (client/client.c), against
 * the real server and a real S3 store (radosgw by scripts/s3-dev.sh,
 * tests/s3_fixture.h): the parts of a multi-part upload retried across a
 * store pause, an expired part or download URL asked again, the 307 followed without
 * the token (the store refuses a request carrying it), the fallback to the
 * PUT with the data directory's store, and the job events of a spell of
 * store failures (one when it begins, one when uploads reach it again).
 * Without radosgw the S3 cases say SKIP (S3_TEST_REQUIRED=1: they fail). */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>

#include "testlib.h"
#include "s3_fixture.h"
#include "../client/blobxfer.h"
#include "../executor/report.h"

static s3_dev S3;
static int have_s3;
static char s3_why[256];

static ty_proc srv;
static char team_tok[128], node_join[128], node_tok[256], task_tok[256];
static int64_t job_id, node_id;
static char bucket[64];

#define SPEC                                                                                                   \
    "{\"name\":\"blobs\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":4,\"activation\":\"relu\","      \
    "\"input_shape\":[4]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"                      \
    "\"compile\":{\"optimizer\":{\"type\":\"sgd\"},\"loss\":\"binary_crossentropy\"},"                         \
    "\"data\":{\"source\":\"synthetic\",\"examples\":100,\"features\":4},\"fit\":{\"epochs\":1,\"batch_size\":10}}"

/* ---------------------------------------------------------------- the stack */

/* The server (extra flags), one node registered by hand, one job handed to
 * it: its task token in task_tok (what a worker holds). */
static void stack_start(const char *const *extra) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "blobxfer");
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "node.token", node_join, sizeof node_join);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, node_join, "POST", "/api/v1/nodes",
                             "{\"hostname\":\"bx\",\"address\":\"127.0.0.1\",\"cpu_slots\":4}", &o),
                     201);
    node_id = (int64_t)ty_num(o, "id");
    snprintf(node_tok, sizeof node_tok, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    job_id = ty_submit(srv.url, team_tok, SPEC);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=2", (long long)node_id);
    task_tok[0] = '\0';
    for (int i = 0; i < 20 && !task_tok[0]; i++) {
        ck_assert_int_eq(ty_http(srv.url, node_tok, "GET", path, NULL, &o), 200);
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            if ((int64_t)ty_num(it, "job") == job_id) snprintf(task_tok, sizeof task_tok, "%s", ty_str(it, "token"));
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(task_tok[0], "job %lld was not handed to the node", (long long)job_id);
}

static void s3_setup_ttl(const char *ttl) {
    if (!have_s3) {
        if (s3_required()) ck_abort_msg("no S3 store: %s", s3_why);
        return;
    }
    s3_resume(&S3); /* a case that failed while the store was stopped left it so */
    static int n;
    snprintf(bucket, sizeof bucket, "bx-%d-%d", (int)getpid(), n++);
    ck_assert_int_eq(s3_bucket(&S3, bucket), 0);
    char spec[256];
    s3_spec(&S3, bucket, spec, sizeof spec);
    const char *extra[] = {"--blob-store", spec, "--blob-credentials", S3.creds, "--blob-url-ttl", ttl, NULL};
    stack_start(extra);
}

static void s3_setup(void) { s3_setup_ttl("900"); }

/* The s3 server with a real agent of 2 slots (no hand-made node or job). */
static pid_t agent;
static void s3_agent_setup(void) {
    if (!have_s3) {
        if (s3_required()) ck_abort_msg("no S3 store: %s", s3_why);
        return;
    }
    s3_resume(&S3);
    static int n;
    snprintf(bucket, sizeof bucket, "bxa-%d-%d", (int)getpid(), n++);
    ck_assert_int_eq(s3_bucket(&S3, bucket), 0);
    char spec[256];
    s3_spec(&S3, bucket, spec, sizeof spec);
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "blobxfer");
    const char *extra[] = {"--blob-store", spec, "--blob-credentials", S3.creds, NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    agent = ty_agent_start(&srv, "bx-node", "2");
}
static void s3_setup_short_ttl(void) { s3_setup_ttl("2"); }

static void data_setup(void) { stack_start(NULL); }

static void teardown(void) {
    if (S3.rgw > 0) s3_resume(&S3);
    if (agent > 0) {
        ty_proc a = {.pid = agent};
        ty_kill(&a, SIGTERM);
        agent = 0;
    }
    if (srv.pid) ty_kill(&srv, SIGTERM);
    if (srv.dir[0]) ty_rmrf(srv.dir);
    memset(&srv, 0, sizeof srv);
}

#define NEED_S3()                                                                                              \
    do {                                                                                                       \
        if (!have_s3) {                                                                                        \
            fprintf(stderr, "SKIP %s: %s\n", __func__, s3_why);                                                \
            return;                                                                                            \
        }                                                                                                      \
    } while (0)

/* ---------------------------------------------------------------- sources */

/* size bytes of a fixed pseudo-random sequence. */
static unsigned char *make_bytes(size_t size, uint32_t seed) {
    unsigned char *b = xmalloc(size ? size : 1);
    uint32_t x = seed | 1;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (unsigned char)x;
    }
    return b;
}

/* A source over memory that can pause the store or sleep at the second
 * read of an offset (the first is the read pass; the second, the part's PUT). */
typedef struct memsrc {
    const unsigned char *data;
    size_t size;
    uint64_t trap_off;           /* the offset watched */
    int trap_reads;              /* reads seen there */
    int pause_store_ms;          /* at the second: SIGSTOP radosgw this long (a thread resumes it) */
    int sleep_ms;                /* at the second: sleep this long */
    pthread_mutex_t mu;
} memsrc;

static void *resume_later(void *arg) {
    int ms = *(int *)arg;
    ty_sleep_ms(ms);
    s3_resume(&S3);
    return NULL;
}

static ssize_t mem_read_at(void *ctx, void *out, size_t n, uint64_t off) {
    memsrc *m = ctx;
    if (off >= m->size) return 0;
    pthread_mutex_lock(&m->mu);
    int second = off == m->trap_off && ++m->trap_reads == 2;
    pthread_mutex_unlock(&m->mu);
    if (second && m->pause_store_ms) {
        s3_pause(&S3);
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, resume_later, &m->pause_store_ms), 0);
        pthread_detach(t);
    }
    if (second && m->sleep_ms) ty_sleep_ms(m->sleep_ms);
    size_t k = m->size - (size_t)off < n ? m->size - (size_t)off : n;
    memcpy(out, m->data + off, k);
    return (ssize_t)k;
}

/* ---------------------------------------------------------------- helpers */

/* GET path with the team token into memory through client_download: the
 * status; on 200 the bytes (caller frees), the 307's checksum and loc. */
static long download(const char *token, const char *path, unsigned char **bytes, size_t *len, char sha_hdr[65],
                     char sha_got[65], char *loc, size_t locn) {
    char file[400], err[512] = "";
    snprintf(file, sizeof file, "%s/dl.bin", srv.dir);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, token), 0);
    long st = 0;
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 1 << 16);
    int rc = client_download(&c, path, file, &st, sha_hdr, sha_got, loc, locn, &size, &eb, err, sizeof err);
    client_release(&c);
    ck_assert_msg(rc == 0, "GET %s: %s", path, err);
    if (st != 200) fprintf(stderr, "GET %s: %ld %.300s\n", path, st, eb.data ? eb.data : "");
    buf_release(&eb);
    *bytes = NULL;
    if (st == 200) {
        *bytes = (unsigned char *)file_read_all(file, 256u << 20, len);
        ck_assert_ptr_nonnull(*bytes);
        ck_assert_uint_eq(*len, size);
    }
    unlink(file);
    return st;
}

/* One raw GET (no redirect followed): the status, the Location header. */
typedef struct raw_get {
    char loc[4096];
    buf body;
} raw_get;

static size_t raw_hdr(char *p, size_t size, size_t n, void *ud) {
    raw_get *g = ud;
    size_t len = size * n;
    if (len > 9 && strncasecmp(p, "Location:", 9) == 0) {
        size_t i = 9;
        while (i < len && p[i] == ' ') i++;
        size_t k = len - i;
        while (k && (p[i + k - 1] == '\r' || p[i + k - 1] == '\n')) k--;
        if (k < sizeof g->loc) {
            memcpy(g->loc, p + i, k);
            g->loc[k] = '\0';
        }
    }
    return len;
}

static size_t raw_body(char *p, size_t size, size_t n, void *ud) {
    (void)buf_append(&((raw_get *)ud)->body, p, size * n);
    return size * n;
}

static long raw(const char *url, const char *bearer, raw_get *g) {
    memset(g->loc, 0, sizeof g->loc);
    buf_init(&g->body, 1 << 20);
    CURL *h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    struct curl_slist *hdr = NULL;
    char auth[320];
    if (bearer) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
        hdr = curl_slist_append(hdr, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, raw_hdr);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, g);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, raw_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, g);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
    long st = 0;
    ck_assert_int_eq(curl_easy_perform(h), CURLE_OK);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return st;
}

/* The job's checkpoint_store events, in order (the caller deletes). */
static cJSON *store_events(void) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)job_id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *out = cJSON_CreateArray();
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(o, "events")) {
        const cJSON *k = cJSON_GetObjectItem(e, "kind");
        if (cJSON_IsString(k) && strcmp(k->valuestring, "checkpoint_store") == 0)
            cJSON_AddItemToArray(out, cJSON_Duplicate(e, 1));
    }
    cJSON_Delete(o);
    return out;
}

/* An event's text (the timeline calls it its reason). */
static const char *event_text(const cJSON *e) {
    const cJSON *r = cJSON_GetObjectItem(e, "reason");
    if (!cJSON_IsString(r)) r = cJSON_GetObjectItem(e, "message");
    return cJSON_IsString(r) ? r->valuestring : "";
}

/* ---------------------------------------------------------------- the cases */

/* 13 MiB in three 5 MiB parts, two at a time; radosgw stopped for 6 s as
 * part 2 starts: the stalled parts are tried again and the upload ends
 * published, its object whole in the store, no upload left open. Then the
 * server's 307 is followed to the store without the token, and the bytes
 * match the 307's checksum. */
START_TEST(multipart_across_a_store_pause) {
    NEED_S3();
    size_t size = (13u << 20) + 12345;
    unsigned char *data = make_bytes(size, 7);
    char want[65];
    sha256_hex(data, size, want);
    memsrc m = {.data = data, .size = size, .trap_off = 5u << 20, .pause_store_ms = 6000};
    pthread_mutex_init(&m.mu, NULL);
    blobxfer_src src = {mem_read_at, &m, size};
    blobxfer_opts o = {.part_bytes = 5 << 20, .parallel = 2, .stall_s = 1, .backoff_min_ms = 100,
                       .backoff_max_ms = 800};
    blobxfer_result res;
    int64_t t0 = mono_ms();
    blobxfer_ckpt_upload(srv.url, task_tok, job_id, 30, 2, &src, &o, &res);
    int64_t took = mono_ms() - t0;
    ck_assert_msg(res.status == 201, "upload: %ld %s", res.status, res.err);
    ck_assert_int_eq(res.parts, 3);
    ck_assert_str_eq(res.sha256, want);
    ck_assert_msg(res.part_retries >= 1, "no part was tried again across the pause");
    ck_assert_msg(took >= 5500, "the upload ended in %lld ms, before the store came back", (long long)took);
    ck_assert_ptr_nonnull(res.answer);
    int64_t cid = (int64_t)ty_num(res.answer, "id");
    ck_assert_int_gt(cid, 0);
    ck_assert_str_eq(ty_str(res.answer, "sha256"), want);
    ck_assert_int_eq((long)ty_num(res.answer, "step"), 30);
    ck_assert_int_eq((long long)ty_num(res.answer, "size"), (long long)size);
    cJSON_Delete(res.answer);
    fprintf(stderr, "multipart: %zu bytes, 3 parts, %d part retries across a 6 s pause, %lld ms\n", size,
            res.part_retries, (long long)took);
    ck_assert_int_eq(s3_keys(&S3, bucket, "checkpoints/", NULL, 0), 1);
    ck_assert_int_eq(s3_open_uploads(&S3, bucket, ""), 0);
    ck_assert_int_eq(blobxfer_via_server(), 0);

    /* the 307 to the store, followed without the token */
    char path[128], sha_hdr[65], sha_got[65], loc[1024];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job_id, (long long)cid);
    unsigned char *got = NULL;
    size_t len = 0;
    ck_assert_int_eq(download(team_tok, path, &got, &len, sha_hdr, sha_got, loc, sizeof loc), 200);
    ck_assert_uint_eq(len, size);
    ck_assert(memcmp(got, data, size) == 0);
    ck_assert_str_eq(sha_hdr, want);
    ck_assert_str_eq(sha_got, want);
    ck_assert_msg(strncmp(loc, S3.endpoint, strlen(S3.endpoint)) == 0 && !strchr(loc, '?'),
                  "loc '%s' is not the store's URL without its query", loc);
    free(got);
    /* latest too, for the next attempt's restore (report_fetch_ckpt) */
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, task_tok), 0);
    volatile sig_atomic_t stop = 0;
    report_api a = {&c, job_id, &stop, "stopped"};
    char file[400], sha[65], err[256] = "";
    snprintf(file, sizeof file, "%s/restore.bin", srv.dir);
    ck_assert_msg(report_fetch_ckpt(&a, file, sha, err, sizeof err) == 1, "restore: %s", err);
    ck_assert_str_eq(sha, want);
    client_release(&c);
    unlink(file);
    free(data);
}
END_TEST

/* The store refuses a request that carries the token beside the URL's
 * signature (two auth mechanisms): the 307 must be followed without it,
 * and client_download does. The CLI's download goes the same way. */
START_TEST(redirect_followed_without_the_token) {
    NEED_S3();
    size_t size = 300000;
    unsigned char *data = make_bytes(size, 11);
    memsrc m = {.data = data, .size = size, .trap_off = UINT64_MAX};
    pthread_mutex_init(&m.mu, NULL);
    blobxfer_src src = {mem_read_at, &m, size};
    blobxfer_result res;
    blobxfer_ckpt_upload(srv.url, task_tok, job_id, 5, 1, &src, NULL, &res);
    ck_assert_msg(res.status == 201, "upload: %ld %s", res.status, res.err);
    ck_assert_int_eq(res.parts, 1);
    cJSON_Delete(res.answer);

    char url[512];
    snprintf(url, sizeof url, "%s/api/v1/jobs/%lld/checkpoints/latest", srv.url, (long long)job_id);
    raw_get g;
    ck_assert_int_eq(raw(url, team_tok, &g), 307);
    buf_release(&g.body);
    char loc[4096];
    snprintf(loc, sizeof loc, "%s", g.loc);
    ck_assert_msg(strncmp(loc, S3.endpoint, strlen(S3.endpoint)) == 0, "Location %.80s... is not the store", loc);
    long with = raw(loc, team_tok, &g);
    ck_assert_msg(with == 400 || with == 403, "the store answered %ld to the URL with a bearer token: %.300s", with,
                  g.body.data ? g.body.data : "");
    buf_release(&g.body);
    ck_assert_int_eq(raw(loc, NULL, &g), 200);
    ck_assert_uint_eq(g.body.len, size);
    ck_assert(memcmp(g.body.data, data, size) == 0);
    buf_release(&g.body);

    /* trainyard checkpoints J --download -o FILE */
    char out[400], cmd[1400];
    snprintf(out, sizeof out, "%s/cli.safetensors", srv.dir);
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL='%s' TRAINYARD_TOKEN='%s' '%s' checkpoints %lld --download -o '%s' >'%s/cli.out' 2>&1",
             srv.url, team_tok, ty_bin(), (long long)job_id, out, srv.dir);
    ck_assert_msg(system(cmd) == 0, "trainyard checkpoints --download failed (see %s/cli.out)", srv.dir);
    size_t len = 0;
    char *got = file_read_all(out, 1 << 20, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(len, size);
    ck_assert(memcmp(got, data, size) == 0);
    free(got);
    free(data);
}
END_TEST

/* URLs live 2 s; one part at a time, the first part's bytes come 3 s late:
 * the next part's URL has expired when its PUT starts, the store answers
 * 403, and a fresh URL is asked for (no try spent). */
START_TEST(expired_part_url_renewed) {
    NEED_S3();
    size_t size = (10u << 20) + 1;
    unsigned char *data = make_bytes(size, 13);
    char want[65];
    sha256_hex(data, size, want);
    memsrc m = {.data = data, .size = size, .trap_off = 0, .sleep_ms = 3000};
    pthread_mutex_init(&m.mu, NULL);
    blobxfer_src src = {mem_read_at, &m, size};
    blobxfer_opts o = {.part_bytes = 5 << 20, .parallel = 1, .backoff_min_ms = 100, .backoff_max_ms = 400};
    blobxfer_result res;
    blobxfer_ckpt_upload(srv.url, task_tok, job_id, 8, 1, &src, &o, &res);
    ck_assert_msg(res.status == 201, "upload: %ld %s", res.status, res.err);
    ck_assert_int_eq(res.parts, 3);
    ck_assert_msg(res.url_refreshes >= 1, "no URL was asked again (%d part retries)", res.part_retries);
    ck_assert_str_eq(ty_str(res.answer, "sha256"), want);
    cJSON_Delete(res.answer);
    ck_assert_int_eq(s3_open_uploads(&S3, bucket, ""), 0);
    free(data);
}
END_TEST

/* URLs live 2 s; the store stopped for 3.5 s when the download starts: the
 * 307's URL has expired when the store reads the request, it answers 403,
 * and client_download asks the server once more (a URL that old is refused:
 * shown on the first 307's own URL). */
START_TEST(expired_download_url_asked_again) {
    NEED_S3();
    size_t size = 200000;
    unsigned char *data = make_bytes(size, 17);
    char want[65];
    sha256_hex(data, size, want);
    memsrc m = {.data = data, .size = size, .trap_off = UINT64_MAX};
    pthread_mutex_init(&m.mu, NULL);
    blobxfer_src src = {mem_read_at, &m, size};
    blobxfer_result res;
    blobxfer_ckpt_upload(srv.url, task_tok, job_id, 2, 1, &src, NULL, &res);
    ck_assert_msg(res.status == 201, "upload: %ld %s", res.status, res.err);
    cJSON_Delete(res.answer);

    char url[512], path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job_id);
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    raw_get g;
    ck_assert_int_eq(raw(url, team_tok, &g), 307);
    buf_release(&g.body);
    char old[4096];
    snprintf(old, sizeof old, "%s", g.loc);

    s3_pause(&S3);
    static int resume_ms = 3500;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, resume_later, &resume_ms), 0);
    int64_t t0 = mono_ms();
    unsigned char *got = NULL;
    size_t len = 0;
    char sha_hdr[65], sha_got[65], loc[1024];
    long st = download(team_tok, path, &got, &len, sha_hdr, sha_got, loc, sizeof loc);
    int64_t took = mono_ms() - t0;
    pthread_join(t, NULL);
    ck_assert_msg(st == 200, "the download after the URL expired answered %ld", st);
    ck_assert_msg(took >= 3000, "the download took %lld ms: the store was not stopped", (long long)took);
    ck_assert_uint_eq(len, size);
    ck_assert(memcmp(got, data, size) == 0);
    ck_assert_str_eq(sha_got, want);
    free(got);
    long again = raw(old, NULL, &g);
    ck_assert_msg(again == 403, "the store answered %ld to a URL past its life", again);
    buf_release(&g.body);
    free(data);
}
END_TEST

/* What the command runner sends: a head from memory and a file read with
 * pread (whatever the descriptor's offset), in two parts to the store. */
START_TEST(head_and_file_to_the_store) {
    NEED_S3();
    char file[400];
    snprintf(file, sizeof file, "%s/ckpt.bin", srv.dir);
    size_t fsize = (7u << 20) + 3;
    unsigned char *fdata = make_bytes(fsize, 23);
    ck_assert_int_eq(file_write_atomic(file, fdata, fsize, 0600), 0);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(lseek(fd, 12345, SEEK_SET), 12345);
    static const char head[] = "a head of 27 bytes, then...";
    blobxfer_opts o = {.part_bytes = 5 << 20};
    report_ckpt_bytes b = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 7, .epoch = 1,
                           .head = head, .head_len = sizeof head - 1, .fd = fd, .total = sizeof head - 1 + fsize,
                           .xfer = &o};
    char sha[65], err[600] = "", want[65];
    long st = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
    close(fd);
    ck_assert_msg(st == 201, "upload: %ld %s", st, err);
    size_t total = sizeof head - 1 + fsize;
    unsigned char *whole = xmalloc(total);
    memcpy(whole, head, sizeof head - 1);
    memcpy(whole + sizeof head - 1, fdata, fsize);
    sha256_hex(whole, total, want);
    ck_assert_str_eq(sha, want);
    ck_assert_int_eq(blobxfer_via_server(), 0);
    char path[128], sha_hdr[65], sha_got[65], loc[1024];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job_id);
    unsigned char *got = NULL;
    size_t len = 0;
    ck_assert_int_eq(download(team_tok, path, &got, &len, sha_hdr, sha_got, loc, sizeof loc), 200);
    ck_assert_uint_eq(len, total);
    ck_assert(memcmp(got, whole, total) == 0);
    ck_assert_str_eq(sha_hdr, want);
    free(got);
    free(whole);
    free(fdata);
}
END_TEST

/* The team at its storage quota: the begin answers 507 and the upload ends
 * at once with it (no try repeated, no part sent: training goes on and the
 * next checkpoint is tried), without a store event. */
START_TEST(quota_refused_at_once) {
    NEED_S3();
    char admin_tok[128];
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"storage_quota\":\"1MiB\"}", &o),
                     200);
    cJSON_Delete(o);
    size_t size = 2u << 20;
    unsigned char *data = make_bytes(size, 29);
    report_ckpt_bytes b = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 1, .epoch = 1,
                           .head = data, .head_len = size, .fd = -1, .total = size};
    char sha[65], err[600] = "";
    int64_t t0 = mono_ms();
    long st = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
    int64_t took = mono_ms() - t0;
    ck_assert_msg(st == 507, "over the quota: %ld %s", st, err);
    ck_assert_msg(took < 5000, "a 507 took %lld ms: tried again?", (long long)took);
    ck_assert_int_eq(s3_keys(&S3, bucket, "checkpoints/", NULL, 0), 0);
    cJSON *ev = store_events();
    ck_assert_int_eq(cJSON_GetArraySize(ev), 0);
    cJSON_Delete(ev);
    free(data);
}
END_TEST

/* A context uploaded to a server on the store: its bytes go to
 * contexts/<hex> in the bucket, and its GET (what an agent's ctxfetch does)
 * follows the 307 to the store without the token, its sha256 the id's. */
START_TEST(context_download_follows_the_redirect) {
    NEED_S3();
    char cmd[1200], tgz[400];
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", srv.dir);
    snprintf(cmd, sizeof cmd,
             "set -e; d='%s/proj'; mkdir -p \"$d/lib\"; echo \"print('bx')\" > \"$d/train.py\"; "
             "echo 'x = 1' > \"$d/lib/util.py\"; tar -C \"$d\" -czf '%s' train.py lib",
             srv.dir, tgz);
    ck_assert_int_eq(system(cmd), 0);
    size_t len = 0;
    char *tar = file_read_all(tgz, 1 << 20, &len);
    ck_assert_ptr_nonnull(tar);
    char hex[65], id[80];
    sha256_hex(tar, len, hex);
    snprintf(id, sizeof id, "sha256:%s", hex);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/contexts", tar, len, "application/gzip", &r), 0);
    long st = r.status;
    client_reply_release(&r);
    client_release(&c);
    ck_assert_msg(st == 201 || st == 200, "POST /contexts answered %ld", st);
    char key[128];
    snprintf(key, sizeof key, "contexts/%s", hex);
    ck_assert_int_eq(s3_keys(&S3, bucket, key, NULL, 0), 1);
    char path[200], sha_hdr[65], sha_got[65], loc[1024];
    snprintf(path, sizeof path, "/api/v1/contexts/%s", id);
    unsigned char *got = NULL;
    size_t glen = 0;
    ck_assert_int_eq(download(team_tok, path, &got, &glen, sha_hdr, sha_got, loc, sizeof loc), 200);
    ck_assert_uint_eq(glen, len);
    ck_assert(memcmp(got, tar, len) == 0);
    ck_assert_str_eq(sha_got, hex);
    ck_assert_msg(strncmp(loc, S3.endpoint, strlen(S3.endpoint)) == 0, "the context came from %s", loc);
    free(got);
    free(tar);
}
END_TEST

/* report_sender's ops over memory, through report_upload_ckpt (the
 * worker's way), with quick stalls. */
typedef struct memck {
    unsigned char *data;
    size_t len;
} memck;

static blobxfer_opts quick = {.max_tries = 2, .stall_s = 1, .backoff_min_ms = 50, .backoff_max_ms = 100};

static int memck_upload(void *ctx, void *p, long step, long epoch, char *err, size_t errlen) {
    report_sender *snd = ctx; /* as the worker does: its stop cancels the upload */
    const memck *k = p;
    char sha[65];
    report_ckpt_bytes b = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = step,
                           .epoch = epoch, .head = k->data, .head_len = k->len, .fd = -1, .total = k->len,
                           .xfer = &quick, .stop = report_ckpt_cancel(snd)};
    long st = report_upload_ckpt(NULL, &b, sha, err, errlen);
    return st == 201 ? 0 : st == 0 || st >= 500 ? -2 : -1;
}

static void memck_release(void *p) {
    memck *k = p;
    free(k->data);
    free(k);
}

static const report_ckpt_ops memck_ops = {memck_upload, memck_release, NULL};

/* The store stopped while the sender uploads a checkpoint: its metrics
 * still reach the server (the checkpoint has a thread of its own); the
 * store back, the checkpoint lands and the sender drains. */
START_TEST(metrics_flow_while_the_store_is_stopped) {
    NEED_S3();
    report_sender snd;
    ck_assert_int_eq(report_start(&snd, srv.url, task_tok, job_id, 1, &memck_ops, &snd, NULL), 0);
    report_set_attempt(&snd, 1);
    memck *k = xmalloc(sizeof *k);
    k->len = 1u << 20;
    k->data = make_bytes(k->len, 31);
    s3_pause(&S3);
    report_set_ckpt(&snd, k, 4, 0);
    ty_sleep_ms(300); /* its part is on its way to the stopped store */
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "kind", "step");
    cJSON_AddNumberToObject(m, "step", 4);
    cJSON_AddNumberToObject(m, "loss", 0.25);
    report_push(&snd, m);
    report_flush_soon(&snd);
    int n = 0;
    int64_t t0 = mono_ms();
    while (mono_ms() - t0 < 4000) {
        cJSON *all = ty_metrics_all(srv.url, team_tok, job_id);
        n = cJSON_GetArraySize(all);
        cJSON_Delete(all);
        if (n) break;
        ty_sleep_ms(100);
    }
    long up = report_uploaded_step(&snd);
    int64_t took = mono_ms() - t0;
    s3_resume(&S3);
    ck_assert_msg(n == 1, "the metric did not reach the server in 4 s while the store was stopped");
    ck_assert_msg(up == -1, "the checkpoint was uploaded to a stopped store");
    fprintf(stderr, "metrics with the store stopped: delivered in %lld ms\n", (long long)took);
    ck_assert_int_eq(report_drain(&snd, 120), 0);
    ck_assert_int_eq(report_uploaded_step(&snd), 4);
    report_stop(&snd);
}
END_TEST

/* The sender stopped while its upload hangs on a stopped store (eight
 * tries of a 1 s stall: over 10 s): report_stop cancels it and returns at
 * once, before an agent's grace would run out. */
START_TEST(stop_cancels_an_upload_in_flight) {
    NEED_S3();
    static blobxfer_opts slow = {.stall_s = 1, .backoff_min_ms = 250, .backoff_max_ms = 2000};
    quick = slow; /* memck_upload's opts: the default eight tries */
    report_sender snd;
    ck_assert_int_eq(report_start(&snd, srv.url, task_tok, job_id, 1, &memck_ops, &snd, NULL), 0);
    memck *k = xmalloc(sizeof *k);
    k->len = 1u << 20;
    k->data = make_bytes(k->len, 41);
    s3_pause(&S3);
    report_set_ckpt(&snd, k, 6, 0);
    ty_sleep_ms(1500); /* its part stalled once, backing off or trying again */
    int64_t t0 = mono_ms();
    report_stop(&snd);
    int64_t took = mono_ms() - t0;
    s3_resume(&S3);
    ck_assert_msg(took < 5000, "report_stop took %lld ms with an upload in flight", (long long)took);
    fprintf(stderr, "stop with an upload in flight: %lld ms\n", (long long)took);
    cJSON *ev = store_events();
    ck_assert_int_le(cJSON_GetArraySize(ev), 1); /* the stall said once; the cancel is no store failure */
    cJSON_Delete(ev);
}
END_TEST

/* A training job on a real agent: its chief's checkpoints reach the store
 * (the worker logs it), the server's data directory holds none, each lists
 * with the sha256 its 307 download has. */
START_TEST(training_job_checkpoints_to_the_store) {
    NEED_S3();
    static const char spec[] =
        "{\"name\":\"bx-train\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":8,\"activation\":\"relu\","
        "\"input_shape\":[4]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
        "\"compile\":{\"optimizer\":{\"type\":\"sgd\"},\"loss\":\"binary_crossentropy\"},"
        "\"data\":{\"source\":\"synthetic\",\"examples\":400,\"features\":4},\"fit\":{\"epochs\":3,\"batch_size\":20},"
        "\"checkpoint\":{\"every_epochs\":1,\"keep\":5}}";
    int64_t id = ty_submit(srv.url, team_tok, spec);
    char state[32] = "";
    for (int i = 0; i < 1200; i++) {
        cJSON *j = ty_job_get(srv.url, team_tok, id);
        snprintf(state, sizeof state, "%s", ty_str(j, "state"));
        cJSON_Delete(j);
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(100);
    }
    ck_assert_str_eq(state, "succeeded");
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    /* The job has ended: the housekeeping pass keeps its newest checkpoint
     * and removes the rows, then the objects, of the older ones (a newer
     * one may also have superseded one not sent yet). Wait for that, so
     * nothing listed is removed before it is downloaded. */
    cJSON *l = NULL;
    const cJSON *cks = NULL;
    int n = 0, keys = -1;
    for (int i = 0; i < 300; i++) {
        cJSON_Delete(l);
        l = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &l), 200);
        cks = cJSON_GetObjectItem(l, "checkpoints");
        n = cJSON_GetArraySize(cks);
        keys = s3_keys(&S3, bucket, "checkpoints/", NULL, 0);
        if (n == 1 && keys == 1) break;
        ty_sleep_ms(100);
    }
    ck_assert_msg(n == 1 && keys == 1, "30 s after the end: %d checkpoints listed, %d objects", n, keys);
    ck_assert_int_eq((long)ty_num(cJSON_GetArrayItem(cks, 0), "epoch"), 3); /* the newest: the final one */
    const cJSON *c;
    cJSON_ArrayForEach(c, cks) {
        char p[160], sha_hdr[65], sha_got[65], loc[1024];
        snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)id, (long long)ty_num(c, "id"));
        unsigned char *got = NULL;
        size_t len = 0;
        ck_assert_int_eq(download(team_tok, p, &got, &len, sha_hdr, sha_got, loc, sizeof loc), 200);
        ck_assert_str_eq(sha_got, ty_str(c, "sha256"));
        ck_assert_str_eq(sha_hdr, ty_str(c, "sha256"));
        ck_assert_msg(strncmp(loc, S3.endpoint, strlen(S3.endpoint)) == 0, "checkpoint from %s", loc);
        free(got);
    }
    cJSON_Delete(l);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/checkpoints/%lld", srv.dir, (long long)id);
    ck_assert_msg(access(dir, F_OK) != 0, "%s exists: bytes went through the server", dir);
    char *logs = ty_task_log(srv.url, team_tok, id, "worker-0");
    ck_assert_ptr_nonnull(logs);
    ck_assert_msg(strstr(logs, "checkpoint in the store"), "worker-0's log: %.1500s", logs);
    ck_assert_msg(!strstr(logs, "X-Amz-Signature"), "a presigned URL's signature in the log");
    free(logs);
}
END_TEST

/* The store stopped while the next attempt restores: a GET of the store
 * gives up after the client's stall_s without a byte (not hanging on it),
 * and report_fetch_ckpt
 * tries again (asking the server for a fresh 307), and once the store is
 * back the restore has the bytes. */
START_TEST(restore_waits_out_a_store_pause) {
    NEED_S3();
    size_t size = 100000;
    unsigned char *data = make_bytes(size, 37);
    char want[65];
    sha256_hex(data, size, want);
    memsrc m = {.data = data, .size = size, .trap_off = UINT64_MAX};
    pthread_mutex_init(&m.mu, NULL);
    blobxfer_src src = {mem_read_at, &m, size};
    blobxfer_result res;
    blobxfer_ckpt_upload(srv.url, task_tok, job_id, 9, 1, &src, NULL, &res);
    ck_assert_msg(res.status == 201, "upload: %ld %s", res.status, res.err);
    cJSON_Delete(res.answer);

    client c;
    ck_assert_int_eq(client_init(&c, srv.url, task_tok), 0);
    c.stall_s = 1;
    char file[400], sha[65], err[256] = "";
    snprintf(file, sizeof file, "%s/restore.bin", srv.dir);
    /* one GET: it gives up rather than wait on the stopped store */
    s3_pause(&S3);
    char path[128], sha_hdr[65], sha_got[65];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job_id);
    long st = 0;
    uint64_t got_size = 0;
    buf eb;
    buf_init(&eb, 4096);
    int64_t t1 = mono_ms();
    int e = client_download(&c, path, file, &st, sha_hdr, sha_got, NULL, 0, &got_size, &eb, err, sizeof err);
    int64_t gave_up = mono_ms() - t1;
    buf_release(&eb);
    s3_resume(&S3);
    ck_assert_msg(e == -1, "a GET of the stopped store answered %ld", st);
    ck_assert_msg(gave_up < 15000, "it gave up after %lld ms", (long long)gave_up);
    ck_assert_msg(!strchr(err, '?'), "the store's URL with its query in: %s", err);
    ck_assert_int_ne(access(file, F_OK), 0);
    /* the restore: tried again until the store is back */
    s3_pause(&S3);
    static int resume_ms = 6000;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, resume_later, &resume_ms), 0);
    volatile sig_atomic_t stop = 0;
    report_api a = {&c, job_id, &stop, "stopped"};
    int64_t t0 = mono_ms();
    int rc = report_fetch_ckpt(&a, file, sha, err, sizeof err);
    int64_t took = mono_ms() - t0;
    pthread_join(t, NULL);
    client_release(&c);
    ck_assert_msg(rc == 1, "restore: %d %s", rc, err);
    ck_assert_str_eq(sha, want);
    ck_assert_msg(took >= 5500, "restored in %lld ms: before the store came back", (long long)took);
    size_t len = 0;
    char *got = file_read_all(file, 1 << 20, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(len, size);
    ck_assert(memcmp(got, data, size) == 0);
    fprintf(stderr, "restore across a 6 s store pause: %lld ms\n", (long long)took);
    free(got);
    unlink(file);
    free(data);
}
END_TEST

/* With the data directory's store the server answers 409
 * upload_via_server: report_upload_ckpt PUTs the bytes instead (from memory
 * and from a file), and the process remembers it. */
START_TEST(put_when_the_server_keeps_checkpoints) {
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)job_id);
    cJSON *o = NULL;
    char body[400];
    snprintf(body, sizeof body, "{\"step\":1,\"epoch\":0,\"size\":3,\"sha256\":\"%064d\",\"part_bytes\":8388608,"
             "\"md5\":[\"AAAAAAAAAAAAAAAAAAAAAA==\"]}", 0);
    ck_assert_int_eq(ty_http(srv.url, task_tok, "POST", path, body, &o), 409);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "code")->valuestring, "upload_via_server");
    cJSON_Delete(o);

    const char *bytes = "weights kept by the server";
    char sha[65], err[512] = "", want[65];
    sha256_hex(bytes, strlen(bytes), want);
    ck_assert_int_eq(blobxfer_via_server(), 0);
    report_ckpt_bytes b = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 3, .epoch = 1,
                           .head = bytes, .head_len = strlen(bytes), .fd = -1, .total = strlen(bytes)};
    long st = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
    ck_assert_msg(st == 201, "upload: %ld %s", st, err);
    ck_assert_str_eq(sha, want);
    ck_assert_int_eq(blobxfer_via_server(), 1);

    /* a head and a file, as the command runner sends them */
    char file[400];
    snprintf(file, sizeof file, "%s/ckpt.bin", srv.dir);
    size_t fsize = 3u << 20;
    unsigned char *fdata = make_bytes(fsize, 5);
    ck_assert_int_eq(file_write_atomic(file, fdata, fsize, 0600), 0);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(lseek(fd, 4096, SEEK_SET), 4096); /* read from offset 0 whatever the fd's offset */
    report_ckpt_bytes f = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 4, .epoch = 1,
                           .head = "HEAD", .head_len = 4, .fd = fd, .total = 4 + fsize};
    st = report_upload_ckpt(NULL, &f, sha, err, sizeof err);
    close(fd);
    ck_assert_msg(st == 201, "upload: %ld %s", st, err);
    unsigned char *whole = xmalloc(4 + fsize);
    memcpy(whole, "HEAD", 4);
    memcpy(whole + 4, fdata, fsize);
    sha256_hex(whole, 4 + fsize, want);
    ck_assert_str_eq(sha, want);

    /* past what the PUT takes (1 GiB, a sparse file): 413 without a byte sent */
    char big[400];
    snprintf(big, sizeof big, "%s/big.bin", srv.dir);
    int bfd = open(big, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(bfd, 0);
    ck_assert_int_eq(ftruncate(bfd, REPORT_PUT_MAX), 0);
    report_ckpt_bytes g = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 5, .epoch = 1,
                           .head = "H", .head_len = 1, .fd = bfd, .total = 1 + (uint64_t)REPORT_PUT_MAX};
    st = report_upload_ckpt(NULL, &g, sha, err, sizeof err);
    close(bfd);
    unlink(big);
    ck_assert_msg(st == 413 && strstr(err, "1 GiB"), "1 GiB + 1 through the PUT: %ld %s", st, err);

    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job_id);
    unsigned char *got = NULL;
    size_t len = 0;
    char sha_hdr[65], sha_got[65], loc[256];
    ck_assert_int_eq(download(team_tok, path, &got, &len, sha_hdr, sha_got, loc, sizeof loc), 200);
    ck_assert_uint_eq(len, 4 + fsize);
    ck_assert(memcmp(got, whole, len) == 0);
    ck_assert_str_eq(sha_hdr, want);
    free(got);
    free(whole);
    free(fdata);
}
END_TEST

/* The store stopped: two uploads fail and ONE checkpoint_store event says
 * so; back, the next upload succeeds and one more says uploads reach the
 * store again; a later success says nothing. */
START_TEST(one_event_per_spell) {
    NEED_S3();
    size_t size = 1u << 20;
    unsigned char *data = make_bytes(size, 3);
    blobxfer_opts o = {.max_tries = 2, .stall_s = 1, .backoff_min_ms = 50, .backoff_max_ms = 100};
    report_ckpt_bytes b = {.api = srv.url, .token = task_tok, .job = job_id, .attempt = 1, .step = 10, .epoch = 1,
                           .head = data, .head_len = size, .fd = -1, .total = size, .xfer = &o};
    char sha[65], err[600];
    s3_pause(&S3);
    long st1[2];
    for (int i = 0; i < 2; i++) {
        b.step = 10 + i;
        st1[i] = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
        fprintf(stderr, "store stopped: upload %d answered %ld: %s\n", i + 1, st1[i], err);
    }
    cJSON *ev = store_events();
    s3_resume(&S3);
    ck_assert_msg(st1[0] != 201 && st1[1] != 201, "uploaded with the store stopped");
    ck_assert_int_eq(cJSON_GetArraySize(ev), 1);
    const char *msg = event_text(cJSON_GetArrayItem(ev, 0));
    ck_assert_msg(strstr(msg, "failed") && strstr(msg, "training goes on"), "event: %s", msg);
    ck_assert_msg(!strstr(msg, "X-Amz-Signature") && !strstr(msg, "?"), "a URL's query in the event: %s", msg);
    cJSON_Delete(ev);
    for (int i = 0; i < 2; i++) {
        b.step = 20 + i;
        data[0] = (unsigned char)i; /* another version */
        long st = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
        ck_assert_msg(st == 201, "upload after the store came back: %ld %s", st, err);
    }
    ev = store_events();
    ck_assert_int_eq(cJSON_GetArraySize(ev), 2);
    msg = event_text(cJSON_GetArrayItem(ev, 1));
    ck_assert_msg(strstr(msg, "again") && strstr(msg, "step 20"), "event: %s", msg);
    cJSON_Delete(ev);
    /* saved = completed: the job's latest is the last one uploaded */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)job_id);
    cJSON *l = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &l), 200);
    const cJSON *newest = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "checkpoints"), 0);
    ck_assert_int_eq((long)ty_num(newest, "step"), 21);
    cJSON_Delete(l);
    free(data);
}
END_TEST

/* A command job on a real agent with a context: the agent fetches the
 * context from the store through the 307 (ctxfetch.c), the program sees its
 * files, and the file it leaves in its checkpoint directory goes from disk
 * to the store (the command runner's upload), downloadable with its sha256. */
START_TEST(command_job_context_and_checkpoint_through_the_store) {
    NEED_S3();
    char cmd[1200], tgz[400];
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", srv.dir);
    snprintf(cmd, sizeof cmd,
             "set -e; d='%s/proj'; mkdir -p \"$d\"; echo 'from the store' > \"$d/hello.txt\"; "
             "tar -C \"$d\" -czf '%s' hello.txt", srv.dir, tgz);
    ck_assert_int_eq(system(cmd), 0);
    size_t len = 0;
    char *tar = file_read_all(tgz, 1 << 20, &len);
    ck_assert_ptr_nonnull(tar);
    char hex[65];
    sha256_hex(tar, len, hex);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/contexts", tar, len, "application/gzip", &r), 0);
    long st = r.status;
    client_reply_release(&r);
    client_release(&c);
    free(tar);
    ck_assert_msg(st == 201 || st == 200, "POST /contexts answered %ld", st);
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\":\"bx-cmd\",\"command\":{\"argv\":[\"sh\",\"-c\",\"grep -q 'from the store' hello.txt && "
             "head -c 6000000 /dev/urandom > \\\"$TRAINYARD_CHECKPOINT_DIR/model.pt\\\" && echo ctx-ok\"],"
             "\"context\":\"sha256:%s\"}}", hex);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    char state[32] = "";
    for (int i = 0; i < 1200; i++) {
        cJSON *j = ty_job_get(srv.url, team_tok, id);
        snprintf(state, sizeof state, "%s", ty_str(j, "state"));
        cJSON_Delete(j);
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(100);
    }
    char *logs = ty_task_log(srv.url, team_tok, id, "worker-0");
    ck_assert_msg(!strcmp(state, "succeeded"), "job %s; worker-0's log: %.2000s", state, logs ? logs : "");
    ck_assert_msg(logs && strstr(logs, "ctx-ok") && strstr(logs, "checkpoint in the store"), "worker-0's log: %.2000s",
                  logs ? logs : "");
    free(logs);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *l = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &l), 200);
    const cJSON *ck = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "checkpoints"), 0);
    ck_assert_ptr_nonnull(ck);
    ck_assert_int_gt((long long)ty_num(ck, "size"), 6000000);
    char p2[160], sha_hdr[65], sha_got[65], loc[1024];
    snprintf(p2, sizeof p2, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)id, (long long)ty_num(ck, "id"));
    unsigned char *got = NULL;
    size_t glen = 0;
    ck_assert_int_eq(download(team_tok, p2, &got, &glen, sha_hdr, sha_got, loc, sizeof loc), 200);
    ck_assert_str_eq(sha_got, ty_str(ck, "sha256"));
    ck_assert_msg(strncmp(loc, S3.endpoint, strlen(S3.endpoint)) == 0, "checkpoint from %s", loc);
    free(got);
    cJSON_Delete(l);
}
END_TEST

static Suite *blobxfer_suite(void) {
    Suite *s = suite_create("blobxfer");
    TCase *tc = ty_tcase(s, "s3", s3_setup, teardown, 180);
    tcase_add_test(tc, multipart_across_a_store_pause);
    tcase_add_test(tc, redirect_followed_without_the_token);
    tcase_add_test(tc, one_event_per_spell);
    tcase_add_test(tc, head_and_file_to_the_store);
    tcase_add_test(tc, quota_refused_at_once);
    tcase_add_test(tc, metrics_flow_while_the_store_is_stopped);
    tcase_add_test(tc, context_download_follows_the_redirect);
    tcase_add_test(tc, restore_waits_out_a_store_pause);
    tcase_add_test(tc, stop_cancels_an_upload_in_flight);
    tc = ty_tcase(s, "s3_agent", s3_agent_setup, teardown, 240);
    tcase_add_test(tc, training_job_checkpoints_to_the_store);
    tcase_add_test(tc, command_job_context_and_checkpoint_through_the_store);
    tc = ty_tcase(s, "s3_short_ttl", s3_setup_short_ttl, teardown, 120);
    tcase_add_test(tc, expired_part_url_renewed);
    tcase_add_test(tc, expired_download_url_asked_again);
    tc = ty_tcase(s, "data", data_setup, teardown, 60);
    tcase_add_test(tc, put_when_the_server_keeps_checkpoints);
    return s;
}

int main(void) {
    have_s3 = s3_have(s3_why, sizeof s3_why);
    if (have_s3 && s3_start(&S3, "blobxfer", 1024) < 0) {
        have_s3 = 0;
        snprintf(s3_why, sizeof s3_why, "scripts/s3-dev.sh could not start a store");
    }
    if (!have_s3 && s3_required()) fprintf(stderr, "check_blobxfer: no S3 store (%s): the S3 cases fail\n", s3_why);
    int rc = ty_run_suite(blobxfer_suite());
    if (have_s3) s3_stop(&S3);
    return rc;
}
