/* check_checkpoints_s3.c - checkpoints in an S3 store end to end: the real
 * server (TRAINYARD_BIN) with --blob-store s3://BUCKET?endpoint=... and
 * --blob-credentials, real agents and workers, and a real radosgw
 * (tests/s3_fixture.h: one Ceph for the binary, a bucket per case). The
 * test's own look at the bucket (lists, open uploads) is signed by
 * scripts/s3-dev.sh's python3, and its downloads follow the 307s by hand
 * (libcurl, no Authorization to the store), independent of the code under
 * test.
 *
 *   start_refused            closed port, wrong secret, no bucket: exit 1, one line naming
 *                            the store (no secret in it), nothing listened
 *   url_bound_to_object      job A's part URL rewritten to job B's key: 403;
 *                            the same URL as a GET: 403; A's token on B's upload: refused
 *   url_expired              --blob-url-ttl 2: a URL 3 s old is 403; /parts re-signs it
 *   killed_upload_no_row     2 of 5 parts sent, then nothing: no checkpoint
 *                            row; --blob-upload-max-age 3 aborts it, nothing left
 *   keep_and_delete          checkpoint.keep 2 of 5 uploads: 2 objects;
 *                            DELETE /jobs: the prefix empty
 *   server_killed_mid_upload the server killed (-9) during two uploads: after
 *                            the restart one completes, the other is aborted
 *                            past --blob-upload-max-age, nothing of it left
 *   kill_resume_no_credentials_on_nodes
 *                            a 2-worker gang, worker-1 killed (-9) after 2
 *                            checkpoints: attempt 2 resumes from the store
 *                            (the sha256 worker-0 names); once ended the job
 *                            keeps one row and one object, whose 307
 *                            download is its sha256; the agent's and the
 *                            workers' environ and cmdline and every file under
 *                            the agent's directory hold neither the secret nor
 *                            the credentials' path, no log (the tasks', the
 *                            agent's, the server's) the secret or a presigned
 *                            URL's signature
 *   multipart_300mb          a command job's 300 MiB file: a multipart object
 *                            (ETag "-N", N >= 2), the server's peak memory
 *                            grows < 32 MB, the 307 download is its sha256
 *   context_fetched_from_store
 *                            a command job's context is contexts/<hex> in the
 *                            bucket; the agent fetches it by the 307 (the
 *                            server sends no byte of it), the program runs from it
 *
 * The cases of "start_refused" and "store" play the tasks themselves (as
 * tests/check_faults.c does); those of "agents" run a real agent.
 *
 * Without radosgw (or not root) the suite says SKIP and passes, unless
 * S3_TEST_REQUIRED=1 (tests/run_all.sh sets it when radosgw is on the PATH). */
#include "testlib.h"

#include <curl/curl.h>
#include <ftw.h>
#include <openssl/evp.h>

#include "s3_fixture.h"

static s3_dev s3;
static ty_proc srv;
static char team_tok[128], node_tok[128];
static char bucket[64], store_spec[256];
static pid_t agent_pid;
static char agent_dir[256]; /* the agent's state file, task and cache directories: "" when none */

/* ---------------------------------------------------------------- processes */

static const char *srv_extra[24]; /* the server's flags, kept for a restart */

/* A fresh bucket `name` and a server on it (heartbeat timeout 3 s unless
 * more says otherwise). */
static void server_on_bucket(const char *name, const char *const *more) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "cks3");
    snprintf(bucket, sizeof bucket, "%s", name);
    ck_assert_int_eq(s3_bucket(&s3, bucket), 0);
    s3_spec(&s3, bucket, store_spec, sizeof store_spec);
    int n = 0, hb = 0;
    srv_extra[n++] = "--blob-store";
    srv_extra[n++] = store_spec;
    srv_extra[n++] = "--blob-credentials";
    srv_extra[n++] = s3.creds;
    for (int i = 0; more && more[i] && n < 21; i++) {
        hb |= !strcmp(more[i], "--heartbeat-timeout");
        srv_extra[n++] = more[i];
    }
    if (!hb) {
        srv_extra[n++] = "--heartbeat-timeout";
        srv_extra[n++] = "3";
    }
    srv_extra[n] = NULL;
    ty_server_start_args(&srv, "server", srv_extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
}

/* An agent of 2 CPU slots whose every file (state, job directories,
 * context cache) lies under agent_dir. */
static void agent_up(const char *host) {
    ty_mkdtemp_shared(agent_dir, sizeof agent_dir, "cks3agent");
    char tokfile[400], logf[400], statef[400], tasks[400], cache[400];
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent.log", srv.dir);
    snprintf(statef, sizeof statef, "%s/agent.state", agent_dir);
    snprintf(tasks, sizeof tasks, "%s/tasks", agent_dir);
    snprintf(cache, sizeof cache, "%s/cache", agent_dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(logf, "a", stderr)) _exit(126);
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token-file", tokfile, "--hostname", host,
              "--cpu-slots", "2", "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, "--task-dir", tasks,
              "--cache-dir", cache, (char *)NULL);
        _exit(127);
    }
    agent_pid = pid;
}

static void teardown(void) {
    if (agent_pid > 0) {
        ty_proc a = {.pid = agent_pid};
        ty_kill(&a, SIGTERM);
        agent_pid = 0;
    }
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    if (agent_dir[0]) ty_rmrf(agent_dir);
    agent_dir[0] = '\0';
}

/* ---------------------------------------------------------------- raw HTTP (libcurl) */

typedef struct xfer {
    long status;
    buf body;
    char location[4096];
    char checksum[80];
    EVP_MD_CTX *sha; /* when set the body is hashed, not kept */
    size_t got;
} xfer;

static size_t xfer_write(char *p, size_t sz, size_t n, void *ud) {
    xfer *x = ud;
    x->got += sz * n;
    if (x->sha) return EVP_DigestUpdate(x->sha, p, sz * n) == 1 ? sz * n : 0;
    return buf_append(&x->body, p, sz * n) == 0 ? sz * n : 0;
}

static size_t xfer_header(char *p, size_t sz, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = sz * n;
    char line[4200];
    if (len >= sizeof line) return len;
    memcpy(line, p, len);
    line[len] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    if (strncasecmp(line, "Location:", 9) == 0) snprintf(x->location, sizeof x->location, "%s", line + 9 + strspn(line + 9, " "));
    if (strncasecmp(line, "X-Checksum-Sha256:", 18) == 0)
        snprintf(x->checksum, sizeof x->checksum, "%s", line + 18 + strspn(line + 18, " "));
    return len;
}

/* One request, redirects not followed; bearer (or NULL) as Authorization;
 * md5 (or NULL) as Content-MD5. The status (0: no answer). */
static long http_raw(const char *method, const char *url, const char *bearer, const char *md5, const void *data,
                     size_t len, xfer *x) {
    memset(x, 0, sizeof *x);
    buf_init(&x->body, 4u << 20);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    struct curl_slist *h = NULL;
    char line[300];
    if (bearer) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", bearer);
        h = curl_slist_append(h, line);
    }
    if (md5) {
        snprintf(line, sizeof line, "Content-MD5: %s", md5);
        h = curl_slist_append(h, line);
    }
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, xfer_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, xfer_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    if (data) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return x->status;
}

static void xfer_release(xfer *x) { buf_release(&x->body); }

/* GET path of the API (team token), expecting a 307 to the store: follows
 * it without the token and checks the bytes against X-Checksum-Sha256.
 * The sha256 of the bytes in sha, their count returned. */
static size_t download_307(const char *path, char sha[65]) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    xfer x;
    long st = http_raw("GET", url, team_tok, NULL, NULL, 0, &x);
    ck_assert_msg(st == 307, "GET %s answered %ld (not a 307 to the store): %.300s", path, st,
                  x.body.data ? x.body.data : "");
    char loc[4096], want[80];
    snprintf(loc, sizeof loc, "%s", x.location);
    snprintf(want, sizeof want, "%s", x.checksum);
    xfer_release(&x);
    ck_assert_msg(strncmp(loc, s3.endpoint, strlen(s3.endpoint)) == 0, "the 307 goes to %.200s, not the store", loc);
    ck_assert_int_eq((int)strlen(want), 64);
    xfer d;
    memset(&d, 0, sizeof d);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL), 1);
    /* http_raw clears x; hash through a second struct set after */
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    buf_init(&d.body, 1);
    d.sha = ctx;
    curl_easy_setopt(c, CURLOPT_URL, loc);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, xfer_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &d);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
    ck_assert_int_eq(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &d.status);
    curl_easy_cleanup(c);
    ck_assert_msg(d.status == 200, "the store answered %ld to the presigned GET", d.status);
    unsigned char md[32];
    unsigned int mdn = 0;
    ck_assert_int_eq(EVP_DigestFinal_ex(ctx, md, &mdn), 1);
    EVP_MD_CTX_free(ctx);
    for (int i = 0; i < 32; i++) snprintf(sha + 2 * i, 3, "%02x", md[i]);
    ck_assert_str_eq(sha, want);
    buf_release(&d.body);
    return d.got;
}

/* ---------------------------------------------------------------- the test as an agent */

static int64_t register_node(const char *host) {
    char body[256];
    snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"127.0.0.1\",\"cpu_slots\":4,\"devices\":[]}", host);
    cJSON *o = NULL;
    long st = ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o);
    ck_assert_msg(st == 200 || st == 201, "POST /nodes answered %ld", st);
    int64_t id = (int64_t)ty_num(o, "id");
    if (ty_str(o, "token")[0]) snprintf(node_tok, sizeof node_tok, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    return id;
}

typedef struct played {
    int64_t job, task;
    char token[160];
} played;

/* A small CPU job the test plays the worker of; keep: checkpoint.keep (0: default). */
static int64_t submit_played(const char *name, int keep) {
    char spec[1024], ck[64] = "";
    if (keep) snprintf(ck, sizeof ck, ",\"checkpoint\":{\"keep\":%d}", keep);
    snprintf(spec, sizeof spec,
             "{\"name\":\"%s\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
             "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},"
             "\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"synthetic\",\"examples\":100,\"features\":4},"
             "\"fit\":{\"epochs\":1,\"batch_size\":10}%s}",
             name, ck);
    return ty_submit(srv.url, team_tok, spec);
}

/* Takes the starts of jobs[0..n) from the node's assignments and reports
 * each task running. */
static void take_starts(int64_t node, const int64_t *jobs, int n, played *out) {
    memset(out, 0, sizeof *out * (size_t)n);
    int got = 0;
    for (int round = 0; round < 40 && got < n; round++) {
        char p[96];
        snprintf(p, sizeof p, "/api/v1/nodes/%lld/assignments?wait=1", (long long)node);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, node_tok, "GET", p, NULL, &o), 200);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            int64_t job = (int64_t)ty_num(it, "job");
            for (int i = 0; i < n; i++) {
                if (jobs[i] != job || out[i].task) continue;
                out[i].job = job;
                out[i].task = (int64_t)ty_num(it, "task");
                snprintf(out[i].token, sizeof out[i].token, "%s", ty_str(it, "token"));
                got++;
            }
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(got == n, "%d of %d jobs handed out", got, n);
    for (int i = 0; i < n; i++) {
        char p[96];
        snprintf(p, sizeof p, "/api/v1/tasks/%lld/status", (long long)out[i].task);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", p, "{\"state\":\"running\"}", &o), 200);
        cJSON_Delete(o);
    }
}

/* n bytes of a pattern seeded by seed. */
static char *pattern(size_t n, unsigned seed) {
    char *p = xmalloc(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (char)(x >> 24);
    }
    return p;
}

/* An open upload: its token and the parts' URLs and Content-MD5s. */
typedef struct upload {
    char token[128];
    int parts;
    char url[16][4096];
    char md5[16][32];
} upload;

static void parts_of(const cJSON *arr, upload *u) {
    const cJSON *p;
    cJSON_ArrayForEach(p, arr) {
        int n = (int)ty_num(p, "n");
        ck_assert_msg(n >= 1 && n <= 16, "part number %d", n);
        ck_assert_msg(strlen(ty_str(p, "url")) < sizeof u->url[0], "a part URL over 4 KiB");
        snprintf(u->url[n - 1], sizeof u->url[0], "%s", ty_str(p, "url"));
        snprintf(u->md5[n - 1], sizeof u->md5[0], "%s", ty_str(cJSON_GetObjectItem(p, "headers"), "Content-MD5"));
    }
}

/* POST .../checkpoints/uploads as the task for data (len bytes, parts of
 * part_bytes): the status; on 201 u is filled. */
static long upload_begin(const played *t, const char *data, size_t len, size_t part_bytes, int step, upload *u,
                         cJSON **reply) {
    memset(u, 0, sizeof *u);
    int parts = (int)((len + part_bytes - 1) / part_bytes);
    ck_assert(parts >= 1 && parts <= 16);
    char sha[65];
    sha256_hex(data, len, sha);
    buf b;
    buf_init(&b, 1 << 16);
    buf_printf(&b, "{\"step\":%d,\"epoch\":%d,\"size\":%zu,\"sha256\":\"%s\",\"part_bytes\":%zu,\"md5\":[", step, step,
               len, sha, part_bytes);
    for (int i = 0; i < parts; i++) {
        size_t off = (size_t)i * part_bytes, n = len - off < part_bytes ? len - off : part_bytes;
        unsigned char md[16];
        char b64[32];
        md5_raw(data + off, n, md);
        ck_assert_int_ge(base64_encode(md, 16, b64, sizeof b64), 0);
        buf_printf(&b, "%s\"%s\"", i ? "," : "", b64);
    }
    buf_appends(&b, "]}");
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)t->job);
    cJSON *o = NULL;
    long st = ty_http(srv.url, t->token, "POST", path, b.data, &o);
    buf_release(&b);
    if (st == 201) {
        snprintf(u->token, sizeof u->token, "%s", ty_str(o, "upload"));
        ck_assert_msg(u->token[0], "no upload token in the 201");
        u->parts = cJSON_GetArraySize(cJSON_GetObjectItem(o, "parts"));
        ck_assert_int_eq(u->parts, parts);
        parts_of(cJSON_GetObjectItem(o, "parts"), u);
    }
    if (reply) *reply = o;
    else cJSON_Delete(o);
    return st;
}

/* PUT part n (1-based) of data to url: the store's status. */
static long put_part(const char *url, const char *md5, const char *data, size_t len, size_t part_bytes, int n) {
    size_t off = (size_t)(n - 1) * part_bytes, cnt = len - off < part_bytes ? len - off : part_bytes;
    xfer x;
    long st = http_raw("PUT", url, NULL, md5, data + off, cnt, &x);
    xfer_release(&x);
    return st;
}

static long upload_complete(const played *t, const upload *u, cJSON **reply) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/complete", (long long)t->job, u->token);
    cJSON *o = NULL;
    long st = ty_http(srv.url, t->token, "POST", path, "{}", &o);
    if (reply) *reply = o;
    else cJSON_Delete(o);
    return st;
}

/* A whole checkpoint through the store as task t: begin, every part, complete (201). */
static void upload_all(const played *t, const char *data, size_t len, size_t part_bytes, int step) {
    upload u;
    cJSON *o = NULL;
    long st = upload_begin(t, data, len, part_bytes, step, &u, &o);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 201, "POST uploads answered %ld: %s", st, txt);
    free(txt);
    cJSON_Delete(o);
    for (int i = 1; i <= u.parts; i++)
        ck_assert_int_eq(put_part(u.url[i - 1], u.md5[i - 1], data, len, part_bytes, i), 200);
    st = upload_complete(t, &u, &o);
    txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 201, "complete answered %ld: %s", st, txt);
    free(txt);
    cJSON_Delete(o);
}

static int checkpoint_rows(int64_t job) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints"));
    cJSON_Delete(o);
    return n;
}

static int keys_of(int64_t job) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "checkpoints/%lld/", (long long)job);
    int n = s3_keys(&s3, bucket, prefix, NULL, 0);
    ck_assert_int_ge(n, 0);
    return n;
}

/* Waits up to timeout_s for the job's prefix to hold want keys. */
static void wait_keys(int64_t job, int want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    int have;
    while ((have = keys_of(job)) != want && mono_ms() < end) ty_sleep_ms(250);
    if (have != want) {
        char keys[4][256] = {"", "", "", ""};
        int all = s3_keys(&s3, bucket, "", keys, 4);
        ck_abort_msg("job %lld: %d objects under checkpoints/%lld/, not %d (after %d s); the bucket holds %d: %s %s %s %s",
                     (long long)job, have, (long long)job, want, timeout_s, all, keys[0], keys[1], keys[2], keys[3]);
    }
}

/* ================================================================ start refusals */

/* Runs the server on spec with credentials creds; asserts it exits 1 within
 * 30 s with one line on stderr naming the store, free of the secret, and
 * never wrote its URL (nothing listened). */
static void refused(const char *spec, const char *creds, const char *names, const char *secret) {
    char dir[256], err[400], urlfile[400];
    ty_mkdtemp(dir, sizeof dir, "cks3ref");
    snprintf(err, sizeof err, "%s/stderr", dir);
    snprintf(urlfile, sizeof urlfile, "%s/server.url", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(err, "w", stderr)) _exit(126);
        execl(ty_bin(), ty_bin(), "server", "--listen", "127.0.0.1:0", "--data", dir, "--blob-store", spec,
              "--blob-credentials", creds, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    int64_t end = mono_ms() + 30000;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && mono_ms() < end) ty_sleep_ms(50);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("the server on %s did not exit within 30 s", spec);
    }
    size_t len = 0;
    char *text = file_read_all(err, 1 << 16, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "the server on %s: status %d, stderr: %.600s", spec,
                  status, text);
    ck_assert_msg(access(urlfile, F_OK) != 0, "the server on %s wrote its URL (it listened)", spec);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    ck_assert_msg(lines == 1, "%d lines on stderr, not one: %.600s", lines, text);
    ck_assert_msg(strstr(text, names) != NULL, "stderr does not name %s: %.600s", names, text);
    ck_assert_msg(strstr(text, secret) == NULL, "stderr holds the secret: %.600s", text);
    fprintf(stderr, "cks3: refused: %s", text);
    free(text);
    ty_rmrf(dir);
}

START_TEST(start_refused) {
    char spec[256], closed_store[128], creds[400], dir[256];
    ck_assert_int_eq(s3_bucket(&s3, "refusals"), 0);
    /* a closed port: nothing listens there */
    snprintf(closed_store, sizeof closed_store, "http://127.0.0.1:%d", ty_free_port());
    snprintf(spec, sizeof spec, "s3://refusals?endpoint=%s&region=us-east-1", closed_store);
    refused(spec, s3.creds, "s3://refusals", s3.secret);
    /* the right store, a wrong secret */
    ty_mkdtemp(dir, sizeof dir, "cks3creds");
    snprintf(creds, sizeof creds, "%s/credentials", dir);
    char text[400], wrong[128];
    snprintf(wrong, sizeof wrong, "%s", s3.secret);
    wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
    int n = snprintf(text, sizeof text, "[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", s3.akid,
                     wrong);
    ck_assert_int_eq(file_write_atomic(creds, text, (size_t)n, 0600), 0);
    s3_spec(&s3, "refusals", spec, sizeof spec);
    refused(spec, creds, "s3://refusals", wrong);
    /* no such bucket */
    s3_spec(&s3, "nosuchbucket", spec, sizeof spec);
    refused(spec, s3.creds, "s3://nosuchbucket", s3.secret);
    ty_rmrf(dir);
}
END_TEST

/* ================================================================ presigned URLs */

#define PART (5u << 20)

START_TEST(url_bound_to_object) {
    server_on_bucket("urlbound", NULL);
    int64_t node = register_node("urlbound-node");
    int64_t jobs[2] = {submit_played("job-a", 0), submit_played("job-b", 0)};
    played t[2];
    take_starts(node, jobs, 2, t);
    size_t len = 6u << 20; /* two parts: 5 MiB and 1 MiB */
    char *a = pattern(len, 1), *b = pattern(len, 2);
    upload ua, ub;
    ck_assert_int_eq(upload_begin(&t[0], a, len, PART, 10, &ua, NULL), 201);
    ck_assert_int_eq(upload_begin(&t[1], b, len, PART, 10, &ub, NULL), 201);
    ck_assert_int_eq(ua.parts, 2);
    /* A's URL for part 2 with its path replaced by B's part 2's: 403 */
    char forged[8192];
    const char *qa = strchr(ua.url[1], '?'), *qb = strchr(ub.url[1], '?');
    ck_assert(qa && qb);
    snprintf(forged, sizeof forged, "%.*s%s", (int)(qb - ub.url[1]), ub.url[1], qa);
    ck_assert_msg(strcmp(forged, ua.url[1]) != 0, "A and B have the same object path");
    long st = put_part(forged, ua.md5[1], a, len, PART, 2);
    ck_assert_msg(st == 403, "A's signature on B's object: %ld, not 403", st);
    /* the same URL as a GET: 403 */
    xfer x;
    st = http_raw("GET", ua.url[1], NULL, NULL, NULL, 0, &x);
    xfer_release(&x);
    ck_assert_msg(st == 403, "a PUT URL used for a GET: %ld, not 403", st);
    /* other bytes than the signed Content-MD5: refused */
    st = put_part(ua.url[1], ua.md5[1], b, len, PART, 2);
    ck_assert_msg(st >= 400 && st < 500, "other bytes under part 2's Content-MD5: %ld", st);
    /* A's token on B's upload: refused, B's upload unchanged */
    char path[256];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/parts", (long long)t[1].job, ub.token);
    cJSON *o = NULL;
    st = ty_http(srv.url, t[0].token, "POST", path, "{\"parts\":[1]}", &o);
    cJSON_Delete(o);
    ck_assert_msg(st == 403 || st == 404, "A's task token on B's upload: %ld", st);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/complete", (long long)t[0].job, ub.token);
    st = ty_http(srv.url, t[0].token, "POST", path, "{}", &o);
    cJSON_Delete(o);
    ck_assert_msg(st == 403 || st == 404, "B's upload completed under A's job: %ld", st);
    /* and the URLs do what they are for: both complete, each object is its job's bytes */
    for (int k = 0; k < 2; k++) {
        upload *u = k ? &ub : &ua;
        const char *d = k ? b : a;
        for (int i = 1; i <= 2; i++) ck_assert_int_eq(put_part(u->url[i - 1], u->md5[i - 1], d, len, PART, i), 200);
        ck_assert_int_eq(upload_complete(&t[k], u, NULL), 201);
        char p2[96], sha[65], want[65];
        snprintf(p2, sizeof p2, "/api/v1/jobs/%lld/checkpoints/latest", (long long)t[k].job);
        ck_assert_uint_eq(download_307(p2, sha), len);
        sha256_hex(d, len, want);
        ck_assert_str_eq(sha, want);
        ck_assert_int_eq(keys_of(t[k].job), 1);
    }
    free(a);
    free(b);
}
END_TEST

START_TEST(url_expired) {
    const char *more[] = {"--blob-url-ttl", "2", NULL};
    server_on_bucket("urlttl", more);
    int64_t node = register_node("urlttl-node");
    int64_t job = submit_played("ttl", 0);
    played t;
    take_starts(node, &job, 1, &t);
    size_t len = 1u << 20;
    char *d = pattern(len, 3);
    upload u;
    ck_assert_int_eq(upload_begin(&t, d, len, len, 5, &u, NULL), 201);
    ty_sleep_ms(3200);
    long st = put_part(u.url[0], u.md5[0], d, len, len, 1);
    ck_assert_msg(st == 403, "a URL past its 2 s: %ld, not 403", st);
    /* a fresh signature for part 1 works */
    char path[256];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/parts", (long long)job, u.token);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, t.token, "POST", path, "{\"parts\":[1]}", &o), 200);
    parts_of(cJSON_GetObjectItem(o, "parts"), &u);
    cJSON_Delete(o);
    ck_assert_int_eq(put_part(u.url[0], u.md5[0], d, len, len, 1), 200);
    ck_assert_int_eq(upload_complete(&t, &u, NULL), 201);
    ck_assert_int_eq(checkpoint_rows(job), 1);
    free(d);
}
END_TEST

/* ================================================================ uploads that never finish */

START_TEST(killed_upload_no_row) {
    const char *more[] = {"--blob-upload-max-age", "3", NULL};
    server_on_bucket("killedupload", more);
    int64_t node = register_node("killed-node");
    int64_t job = submit_played("killed", 0);
    played t;
    take_starts(node, &job, 1, &t);
    size_t len = 5 * (size_t)PART;
    char *d = pattern(len, 4);
    upload u;
    ck_assert_int_eq(upload_begin(&t, d, len, PART, 7, &u, NULL), 201);
    ck_assert_int_eq(u.parts, 5);
    for (int i = 1; i <= 2; i++) ck_assert_int_eq(put_part(u.url[i - 1], u.md5[i - 1], d, len, PART, i), 200);
    /* the uploader stops here: no checkpoint row, one open upload in the store */
    ck_assert_int_eq(checkpoint_rows(job), 0);
    ck_assert_int_eq(s3_open_uploads(&s3, bucket, "checkpoints/"), 1);
    /* past --blob-upload-max-age the server aborts it: nothing in the bucket */
    int64_t end = mono_ms() + 30000;
    int open_n = 1;
    while ((open_n = s3_open_uploads(&s3, bucket, "checkpoints/")) != 0 && mono_ms() < end) ty_sleep_ms(500);
    ck_assert_msg(open_n == 0, "%d uploads still open 30 s after their 3 s max age", open_n);
    ck_assert_int_eq(s3_keys(&s3, bucket, "", NULL, 0), 0);
    ck_assert_int_eq(checkpoint_rows(job), 0);
    /* the upload is gone for the task too: completing it makes no row */
    long st = upload_complete(&t, &u, NULL);
    ck_assert_msg(st != 201 && st >= 400 && st < 500, "completing an aborted upload: %ld", st);
    ck_assert_int_eq(checkpoint_rows(job), 0);
    free(d);
}
END_TEST

/* The server killed (-9) in the middle of two uploads: its rows were
 * committed before the store's uploads began, so after the restart the
 * first one's remaining parts go up and it completes (the row, the object,
 * the sha256 of its 307 download), and the second, left alone, is aborted
 * by the tick past --blob-upload-max-age: no open upload, no object of it. */
START_TEST(server_killed_mid_upload) {
    const char *more[] = {"--blob-upload-max-age", "12", "--heartbeat-timeout", "3600", NULL};
    server_on_bucket("serverkilled", more);
    int64_t node = register_node("serverkilled-node");
    int64_t jobs[2] = {submit_played("killed-a", 0), submit_played("killed-b", 0)};
    played t[2];
    take_starts(node, jobs, 2, t);
    size_t len = 3 * (size_t)PART;
    char *a = pattern(len, 21), *b = pattern(len, 22);
    upload ua, ub;
    ck_assert_int_eq(upload_begin(&t[0], a, len, PART, 3, &ua, NULL), 201);
    ck_assert_int_eq(upload_begin(&t[1], b, len, PART, 3, &ub, NULL), 201);
    ck_assert_int_eq(put_part(ua.url[0], ua.md5[0], a, len, PART, 1), 200);
    ck_assert_int_eq(put_part(ub.url[0], ub.md5[0], b, len, PART, 1), 200);
    ck_assert_int_eq(ty_kill(&srv, SIGKILL), SIGKILL);
    ty_server_start_args(&srv, "server", srv_extra);
    /* A goes on where it was */
    for (int i = 2; i <= 3; i++) ck_assert_int_eq(put_part(ua.url[i - 1], ua.md5[i - 1], a, len, PART, i), 200);
    cJSON *o = NULL;
    long st = upload_complete(&t[0], &ua, &o);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 201, "complete after the restart answered %ld: %s", st, txt);
    free(txt);
    cJSON_Delete(o);
    char path[96], sha[65], want[65];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)t[0].job);
    ck_assert_uint_eq(download_307(path, sha), len);
    sha256_hex(a, len, want);
    ck_assert_str_eq(sha, want);
    /* B is aborted past its max age: nothing of it left */
    ck_assert_int_eq(checkpoint_rows(t[1].job), 0);
    int64_t end = mono_ms() + 40000;
    int open_n;
    while ((open_n = s3_open_uploads(&s3, bucket, "checkpoints/")) != 0 && mono_ms() < end) ty_sleep_ms(500);
    ck_assert_msg(open_n == 0, "%d uploads still open 40 s after the restart", open_n);
    ck_assert_int_eq(keys_of(t[1].job), 0);
    ck_assert_int_eq(keys_of(t[0].job), 1);
    ck_assert_int_eq(checkpoint_rows(t[0].job), 1);
    ck_assert_int_eq(checkpoint_rows(t[1].job), 0);
    free(a);
    free(b);
}
END_TEST

/* ================================================================ retention */

START_TEST(keep_and_delete) {
    server_on_bucket("keepdelete", NULL);
    int64_t node = register_node("keep-node");
    int64_t job = submit_played("keep", 2);
    played t;
    take_starts(node, &job, 1, &t);
    size_t len = 64u << 10;
    for (int i = 1; i <= 5; i++) {
        char *d = pattern(len, 10 + (unsigned)i);
        upload_all(&t, d, len, len, i * 10);
        free(d);
    }
    ck_assert_int_eq(checkpoint_rows(job), 2);
    wait_keys(job, 2, 10);
    /* the job ends; DELETE /jobs removes its objects */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)t.task);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", path, "{\"state\":\"exited\",\"exit_code\":0}", &o), 200);
    cJSON_Delete(o);
    /* the job ends at the scheduler's next upkeep: seconds, or more beside
     * make test's loop (this suite runs niced there) */
    int64_t end = mono_ms() + 60000;
    long st = 0;
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)job);
    while (mono_ms() < end) {
        st = ty_http(srv.url, team_tok, "DELETE", path, NULL, NULL);
        if (st != 409) break;
        ty_sleep_ms(200);
    }
    ck_assert_msg(st == 200 || st == 202 || st == 204, "DELETE %s answered %ld", path, st);
    wait_keys(job, 0, 10);
}
END_TEST

/* ================================================================ real agents and workers */

static void job_state(int64_t id, char *state, size_t n, int *attempt) {
    cJSON *o = ty_job_get(srv.url, team_tok, id);
    snprintf(state, n, "%s", ty_str(o, "state"));
    if (attempt) *attempt = (int)ty_num(o, "attempt");
    cJSON_Delete(o);
}

static void wait_state(int64_t id, const char *want, int timeout_s) {
    char state[32] = "";
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (mono_ms() < end) {
        job_state(id, state, sizeof state, NULL);
        if (strcmp(state, want) == 0) return;
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(100);
    }
    char *l0 = ty_task_log(srv.url, team_tok, id, "worker-0");
    ck_abort_msg("job %lld is %s, not %s (after up to %d s); worker-0: %.1500s", (long long)id, state, want,
                 timeout_s, l0);
}

/* The job's checkpoints (the caller deletes). */
static cJSON *checkpoints(int64_t id) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *arr = cJSON_DetachItemFromObject(o, "checkpoints");
    cJSON_Delete(o);
    ck_assert(cJSON_IsArray(arr));
    return arr;
}

static void wait_checkpoints(int64_t id, int n, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    int have = 0;
    while (mono_ms() < end && (have = checkpoint_rows(id)) < n) ty_sleep_ms(20);
    ck_assert_msg(have >= n, "job %lld has %d checkpoints, not %d, after %d s", (long long)id, have, n, timeout_s);
}

/* The worker process of task `name` among the agent's children. */
static pid_t task_pid(const char *name) {
    pid_t wk[8];
    int n = ty_children_named(agent_pid, "worker", wk, 8);
    char want[96];
    snprintf(want, sizeof want, "TRAINYARD_TASK_NAME=%s", name);
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)wk[i]);
        size_t len = 0;
        char *env = file_read_all(path, 1 << 20, &len);
        int yes = 0;
        for (size_t off = 0; env && off < len; off += strlen(env + off) + 1) yes |= strcmp(env + off, want) == 0;
        free(env);
        if (yes) return wk[i];
    }
    return 0;
}

/* What a node must never hold: the secret and the credentials' path. */
static void assert_clean(const char *what, const char *data, size_t len) {
    const char *needles[] = {s3.secret, s3.creds};
    for (int k = 0; k < 2; k++)
        ck_assert_msg(!memmem(data, len, needles[k], strlen(needles[k])), "%s holds the store's %s", what,
                      k ? "credentials path" : "secret");
}

static void assert_proc_clean(pid_t pid, const char *who) {
    const char *files[] = {"environ", "cmdline"};
    for (int k = 0; k < 2; k++) {
        char path[64], what[128];
        snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, files[k]);
        snprintf(what, sizeof what, "%s's %s (pid %d)", who, files[k], (int)pid);
        size_t len = 0;
        char *d = file_read_all(path, 1 << 22, &len);
        ck_assert_msg(d != NULL, "cannot read %s", path);
        assert_clean(what, d, len);
        free(d);
    }
}

static int scan_file(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode)) return 0;
    size_t len = 0;
    char *d = file_read_all(path, (size_t)1 << 31, &len);
    if (!d) return 0; /* gone meanwhile (a task's temporary file) */
    assert_clean(path, d, len);
    free(d);
    return 0;
}

/* The agent, its workers and every file under the agent's directory hold
 * neither the secret nor the credentials' path. */
static void assert_nodes_clean(void) {
    assert_proc_clean(agent_pid, "the agent");
    pid_t wk[8];
    int n = ty_children_named(agent_pid, "worker", wk, 8);
    for (int i = 0; i < n; i++) assert_proc_clean(wk[i], "a worker");
    ck_assert_int_eq(nftw(agent_dir, scan_file, 16, FTW_PHYS), 0);
    char logf[400];
    snprintf(logf, sizeof logf, "%s/agent.log", srv.dir);
    size_t len = 0;
    char *d = file_read_all(logf, 1 << 26, &len);
    if (d) assert_clean("the agent's log", d, len);
    free(d);
}

/* How many lines of the server's access log (DATA/access.log) hold both
 * needles (the second may be NULL). */
static int access_lines(const char *a, const char *b) {
    char path[400];
    snprintf(path, sizeof path, "%s/access.log", srv.dir);
    size_t len = 0;
    char *log = file_read_all(path, 1 << 28, &len);
    ck_assert_msg(log != NULL, "cannot read %s", path);
    int n = 0;
    for (char *line = log, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (strstr(line, a) && (!b || strstr(line, b))) n++;
    }
    free(log);
    return n;
}

/* No checkpoint of job id went through the server (PUT .../checkpoints),
 * and at least one was published by a store upload's complete (201). */
static void assert_via_store(int64_t id) {
    char put[128], done[128];
    snprintf(put, sizeof put, "\"PUT /api/v1/jobs/%lld/checkpoints", (long long)id);
    snprintf(done, sizeof done, "\"POST /api/v1/jobs/%lld/checkpoints/uploads/", (long long)id);
    int64_t end = mono_ms() + 5000; /* the access log is written after the answer */
    int n;
    while ((n = access_lines(done, "/complete HTTP/1.1\" 201")) == 0 && mono_ms() < end) ty_sleep_ms(100);
    ck_assert_msg(n > 0, "no upload of job %lld was completed through the store (access log)", (long long)id);
    ck_assert_msg(access_lines(put, NULL) == 0, "a checkpoint of job %lld went through the server: %s",
                  (long long)id, put);
}

#define GANG_EPOCHS 24
#define GANG_BATCH 64 /* 3200 / 64 = 50 steps an epoch */

/* A 2-worker gang on the store loses worker-1 to kill -9 after 2
 * checkpoints; attempt 2 resumes from attempt 1's latest (worker-0 says
 * which sha256), every checkpoint row is an object under checkpoints/J/,
 * the latest comes back from the store by its 307 with its sha256. While
 * it trains, the agent, its workers and the agent's files carry neither
 * the store's secret nor the credentials' path. */
START_TEST(kill_resume_no_credentials_on_nodes) {
    server_on_bucket("killresume", NULL);
    agent_up("killresume-node");
    char spec[4096];
    snprintf(spec, sizeof spec,
             "{\"name\":\"gang-s3\",\"model\":{\"layers\":["
             "{\"type\":\"dense\",\"units\":256,\"activation\":\"relu\",\"input_shape\":[64]},"
             "{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
             "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},"
             "\"loss\":\"binary_crossentropy\",\"metrics\":[\"accuracy\"]},"
             "\"data\":{\"source\":\"synthetic\",\"examples\":3200,\"features\":64,\"seed\":5},"
             "\"fit\":{\"epochs\":%d,\"batch_size\":%d},\"strategy\":{\"type\":\"multi_worker_mirrored\"},"
             "\"resources\":{\"workers\":2,\"devices_per_worker\":1,\"device\":\"cpu\"},"
             "\"checkpoint\":{\"every_epochs\":1,\"keep\":100},\"max_restarts\":3}",
             GANG_EPOCHS, GANG_BATCH);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    wait_checkpoints(id, 2, 120);
    assert_nodes_clean();
    pid_t victim = task_pid("worker-1");
    ck_assert_int_gt(victim, 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    /* every row seen until the end (once the job has ended the server keeps
     * its newest alone, and attempt 1's go) */
    cJSON *seen = cJSON_CreateArray();
    char state[32] = "";
    int attempt = 0;
    int64_t end = mono_ms() + 240000;
    for (;;) {
        job_state(id, state, sizeof state, &attempt);
        cJSON *now = checkpoints(id), *c;
        cJSON_ArrayForEach(c, now) {
            int dup = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, seen) dup |= ty_num(e, "id") == ty_num(c, "id");
            if (!dup) cJSON_AddItemToArray(seen, cJSON_Duplicate(c, 1));
        }
        cJSON_Delete(now);
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled") ||
            mono_ms() > end)
            break;
        ty_sleep_ms(200);
    }
    char *l0 = ty_task_log(srv.url, team_tok, id, "worker-0");
    ck_assert_msg(!strcmp(state, "succeeded"), "job %lld is %s; worker-0: %.1500s", (long long)id, state, l0);
    ck_assert_int_eq(attempt, 2);
    const cJSON *last1 = NULL, *c;
    cJSON_ArrayForEach(c, seen) if ((int)ty_num(c, "attempt") == 1 && (!last1 || ty_num(c, "step") > ty_num(last1, "step")))
        last1 = c;
    ck_assert_msg(last1 != NULL, "no checkpoint of attempt 1");
    char want[128];
    snprintf(want, sizeof want, "resuming from the job's latest checkpoint (sha256 %.16s", ty_str(last1, "sha256"));
    ck_assert_msg(strstr(l0, want) != NULL, "worker-0's log lacks '%s': %.1500s", want, l0);
    free(l0);
    /* the ended job keeps its newest: one row, one object (the others' objects
     * removed with their rows), and its bytes come back by the 307 */
    int rows = 0;
    end = mono_ms() + 20000;
    while ((rows = checkpoint_rows(id)) != 1 && mono_ms() < end) ty_sleep_ms(200);
    ck_assert_int_eq(rows, 1);
    wait_keys(id, 1, 20);
    cJSON *cks = checkpoints(id);
    const cJSON *latest = cJSON_GetArrayItem(cks, 0);
    char path[96], sha[65];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)id);
    size_t got = download_307(path, sha);
    ck_assert_str_eq(sha, ty_str(latest, "sha256"));
    ck_assert_uint_eq(got, (size_t)ty_num(latest, "size"));
    assert_via_store(id);
    /* no log holds the secret or a presigned URL's signature */
    char *logs[3] = {ty_task_log(srv.url, team_tok, id, "worker-0"), ty_task_log(srv.url, team_tok, id, "worker-1"),
                     NULL};
    size_t slen = 0;
    logs[2] = file_read_all(srv.log, 1 << 26, &slen);
    ck_assert_ptr_nonnull(logs[2]);
    const char *names[3] = {"worker-0's log", "worker-1's log", "the server's log"};
    for (int i = 0; i < 3; i++) {
        if (i < 2) assert_clean(names[i], logs[i], strlen(logs[i])); /* the server may name its credentials file */
        else ck_assert_msg(!strstr(logs[i], s3.secret), "the server's log holds the secret");
        ck_assert_msg(!strstr(logs[i], "X-Amz-Signature"), "%s holds a presigned URL's signature", names[i]);
        free(logs[i]);
    }
    fprintf(stderr, "cks3: gang: %d checkpoints seen, attempt 1's last at step %.0f, the kept one at step %.0f\n",
            cJSON_GetArraySize(seen), ty_num(last1, "step"), ty_num(latest, "step"));
    cJSON_Delete(seen);
    cJSON_Delete(cks);
    assert_nodes_clean();
}
END_TEST

/* The server's peak resident memory (VmHWM), in kB. */
static long server_hwm_kb(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)srv.pid);
    size_t len = 0;
    char *st = file_read_all(path, 1 << 16, &len);
    ck_assert_ptr_nonnull(st);
    const char *h = strstr(st, "VmHWM:");
    long kb = h ? strtol(h + 6, NULL, 10) : -1;
    free(st);
    ck_assert_int_gt(kb, 0);
    return kb;
}

/* The ETag of the one object under prefix, from ListObjectsV2. */
static void etag_of(const char *prefix, char *out, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "/%s?list-type=2&prefix=%s", bucket, prefix);
    buf r;
    buf_init(&r, 1 << 20);
    ck_assert_int_eq(s3_req(&s3, "GET", path, NULL, &r), 200);
    const char *p = r.data;
    ck_assert_int_eq(s3__xml(&p, "ETag", out, n), 0);
    buf_release(&r);
}

/* A command job writes a 300 MB file into its checkpoint directory and
 * exits: the chief uploads it through the store in parts (the object's
 * ETag is a multipart one, "-N" with N >= 2) without the bytes passing
 * through the server (its peak memory grows < 32 MB), and the 307 download
 * is the row's sha256. */
START_TEST(multipart_300mb) {
    server_on_bucket("multipart", NULL);
    agent_up("multipart-node");
    char dir[256], script[400], spec[1024];
    ty_mkdtemp_shared(dir, sizeof dir, "cks3mp"); /* the program runs as another uid */
    snprintf(script, sizeof script, "%s/big.py", dir);
    static const char py[] =
        "import hashlib, os\n"
        "d = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
        "h = hashlib.sha256()\n"
        "with open(d + '/.big.tmp', 'wb') as f:\n"
        "    for i in range(300):\n"
        "        block = hashlib.sha256(b'seed %d' % i).digest() * 32768  # 1 MiB\n"
        "        h.update(block)\n"
        "        f.write(block)\n"
        "os.rename(d + '/.big.tmp', d + '/big.bin')\n"
        "print('wrote 300 MiB, sha256', h.hexdigest(), flush=True)\n";
    ck_assert_int_eq(file_write_atomic(script, py, sizeof py - 1, 0644), 0);
    snprintf(spec, sizeof spec,
             "{\"name\":\"big-ckpt\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\"]},\"max_restarts\":0}", script);
    long hwm0 = server_hwm_kb();
    int64_t id = ty_submit(srv.url, team_tok, spec);
    wait_state(id, "succeeded", 300);
    long hwm1 = server_hwm_kb();
    cJSON *cks = checkpoints(id);
    ck_assert_int_eq(cJSON_GetArraySize(cks), 1);
    const cJSON *ck = cJSON_GetArrayItem(cks, 0);
    double size = ty_num(ck, "size");
    ck_assert_msg(size > 300.0 * 1048576, "the checkpoint is %.0f bytes", size);
    char prefix[64], etag[128];
    snprintf(prefix, sizeof prefix, "checkpoints/%lld/", (long long)id);
    ck_assert_int_eq(keys_of(id), 1);
    assert_via_store(id);
    etag_of(prefix, etag, sizeof etag);
    const char *dash = strrchr(etag, '-');
    ck_assert_msg(dash && atoi(dash + 1) >= 2, "the object's ETag %s is not a multipart upload's", etag);
    fprintf(stderr, "cks3: 300 MiB checkpoint: %.0f bytes, ETag %s, server VmHWM %ld -> %ld kB\n", size, etag, hwm0,
            hwm1);
    ck_assert_msg(hwm1 - hwm0 < 32 * 1024, "the server's peak memory grew %ld kB", hwm1 - hwm0);
    char path[96], sha[65];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)id);
    ck_assert_uint_eq(download_307(path, sha), (size_t)size);
    ck_assert_str_eq(sha, ty_str(ck, "sha256"));
    cJSON_Delete(cks);
    ty_rmrf(dir);
}
END_TEST

/* A command job's context (POST /contexts) lies in the bucket as
 * contexts/<hex>; the agent fetches it through the server's 307 from the
 * store (the server never sends its bytes: the access log has the 307 and
 * no 200 for it), the program runs from it, and its checkpoint goes up
 * through the store. */
START_TEST(context_fetched_from_store) {
    server_on_bucket("context", NULL);
    agent_up("context-node");
    char dir[256], src[320], tgz[320], cmd[1200];
    ty_mkdtemp(dir, sizeof dir, "cks3ctx");
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", dir);
    static const char py[] =
        "import os\n"
        "d = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
        "open(d + '/.m.tmp', 'wb').write(b'context checkpoint ' * 1000)\n"
        "os.rename(d + '/.m.tmp', d + '/model.bin')\n"
        "print('ran from the context:', open('data.txt').read().strip(), flush=True)\n";
    ck_assert_int_eq(mkdir(src, 0755), 0);
    char f[400];
    snprintf(f, sizeof f, "%s/train.py", src);
    ck_assert_int_eq(file_write_atomic(f, py, sizeof py - 1, 0644), 0);
    snprintf(f, sizeof f, "%s/data.txt", src);
    ck_assert_int_eq(file_write_atomic(f, "marker-7f3a\n", 12, 0644), 0);
    snprintf(cmd, sizeof cmd, "tar -C '%s' -czf '%s' train.py data.txt", src, tgz);
    ck_assert_int_eq(system(cmd), 0);
    size_t n = 0;
    char *bytes = file_read_all(tgz, 1 << 20, &n);
    ck_assert_ptr_nonnull(bytes);
    char digest[65], url[512];
    sha256_hex(bytes, n, digest);
    snprintf(url, sizeof url, "%s/api/v1/contexts", srv.url);
    xfer x;
    long st = http_raw("POST", url, team_tok, NULL, bytes, n, &x);
    ck_assert_msg(st == 201 || st == 200, "POST /contexts answered %ld: %.300s", st, x.body.data ? x.body.data : "");
    xfer_release(&x);
    free(bytes);
    char keys[4][256], key[96];
    snprintf(key, sizeof key, "contexts/%s", digest);
    ck_assert_int_eq(s3_keys(&s3, bucket, "contexts/", keys, 4), 1);
    ck_assert_str_eq(keys[0], key);
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\":\"from-context\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"train.py\"],"
             "\"context\":\"sha256:%s\"},\"max_restarts\":0}",
             digest);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    wait_state(id, "succeeded", 120);
    char *l0 = NULL;
    int64_t end = mono_ms() + 10000;
    for (;;) {
        l0 = ty_task_log(srv.url, team_tok, id, "worker-0");
        if (strstr(l0, "ran from the context: marker-7f3a") || mono_ms() > end) break;
        free(l0);
        ty_sleep_ms(200);
    }
    ck_assert_msg(strstr(l0, "ran from the context: marker-7f3a") != NULL, "worker-0's log: %.1500s", l0);
    free(l0);
    char get[128];
    snprintf(get, sizeof get, "\"GET /api/v1/contexts/sha256:%s", digest);
    ck_assert_msg(access_lines(get, "HTTP/1.1\" 307") >= 1, "the agent did not get the context by a 307");
    ck_assert_msg(access_lines(get, "HTTP/1.1\" 200") == 0, "the server sent the context's bytes itself");
    ck_assert_int_eq(checkpoint_rows(id), 1);
    assert_via_store(id);
    wait_keys(id, 1, 10);
    assert_nodes_clean();
    ty_rmrf(dir);
}
END_TEST

int main(void) {
    char why[256];
    if (!s3_have(why, sizeof why)) {
        printf("check_checkpoints_s3: SKIP: %s\n", why);
        return s3_required() ? 1 : 0;
    }
    if (s3_start(&s3, "cks3dev", 2048) != 0) return 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("checkpoints_s3");
    tcase_add_test(ty_tcase(s, "start_refused", NULL, NULL, 120), start_refused);
    TCase *tc = ty_tcase(s, "store", NULL, teardown, 180);
    tcase_add_test(tc, url_bound_to_object);
    tcase_add_test(tc, url_expired);
    tcase_add_test(tc, killed_upload_no_row);
    tcase_add_test(tc, keep_and_delete);
    tcase_add_test(tc, server_killed_mid_upload);
    TCase *ta = ty_tcase(s, "agents", NULL, teardown, 360);
    tcase_add_test(ta, kill_resume_no_credentials_on_nodes);
    tcase_add_test(ta, multipart_300mb);
    tcase_add_test(ta, context_fetched_from_store);
    int rc = ty_run_suite(s);
    if (rc) s3.keep = 1;
    if (s3_stop(&s3) != 0) rc = 1; /* scripts/s3-dev.sh stop left a daemon running */
    curl_global_cleanup();
    return rc;
}
