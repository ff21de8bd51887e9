/* check_contexts.c - a team's code folder as a context, on the real server
 * binary over loopback with its SQLite file: POST /api/v1/contexts (201
 * with the id, the sha256 of the bytes; the same bytes again 200), the
 * list with the team's usage, the bytes fetched back with their checksum,
 * another team's 404, the size limit and the quota (413 with limit_bytes),
 * hostile tars (a `..` path, an absolute path, a device, a link leading
 * out) and a body that is not gzip refused 422 naming the entry, with
 * nothing stored; jobs naming a context (422 for one the team does not
 * hold, the 409 of a DELETE while a job needs it, 204 after its cancel),
 * fetching by the node and the task that run such a job, the collection of
 * unused contexts past their grace, and contexts kept across a restart; an
 * agent fetching a 200 MB context through a slow link (a throttling proxy
 * on loopback) keeps its heartbeats and starts another job meanwhile, and
 * a cancel stops that download. */
#include "testlib.h"

#include <archive.h>
#include <archive_entry.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/sysmacros.h>

static ty_proc srv;
static char team_a[160], team_b[160], admin[160];

/* ---------------------------------------------------------------- tars */

typedef struct tar_entry {
    const char *path;
    int type;                 /* AE_IFREG, AE_IFDIR, AE_IFLNK, AE_IFCHR */
    const char *data;         /* a file's bytes (NUL-terminated), or NULL with size random bytes */
    size_t size;
    const char *link;         /* a symbolic link's target */
} tar_entry;

/* A gzip'd tar (ustar/pax) of the entries, in memory: the bytes (the
 * caller frees) and their length. */
static char *make_tar(const tar_entry *e, int n, size_t *len) {
    size_t cap = 8u << 20;
    char *out = xmalloc(cap);
    struct archive *a = archive_write_new();
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    size_t used = 0;
    ck_assert_int_eq(archive_write_open_memory(a, out, cap, &used), ARCHIVE_OK);
    for (int i = 0; i < n; i++) {
        struct archive_entry *ae = archive_entry_new();
        archive_entry_set_pathname(ae, e[i].path);
        archive_entry_set_filetype(ae, (unsigned)e[i].type);
        archive_entry_set_perm(ae, e[i].type == AE_IFDIR ? 0755 : 0644);
        archive_entry_set_mtime(ae, 1700000000, 0);
        char *rnd = NULL;
        size_t size = 0;
        if (e[i].type == AE_IFREG) {
            size = e[i].data ? strlen(e[i].data) : e[i].size;
            if (!e[i].data) {
                rnd = xmalloc(size);
                for (size_t off = 0; off < size;) {
                    ssize_t r = getrandom(rnd + off, size - off, 0);
                    ck_assert_int_gt(r, 0);
                    off += (size_t)r;
                }
            }
        }
        if (e[i].type == AE_IFLNK) archive_entry_set_symlink(ae, e[i].link);
        if (e[i].type == AE_IFCHR) archive_entry_set_rdev(ae, makedev(1, 3));
        archive_entry_set_size(ae, (la_int64_t)size);
        ck_assert_int_eq(archive_write_header(a, ae), ARCHIVE_OK);
        if (size) ck_assert_int_eq(archive_write_data(a, e[i].data ? e[i].data : rnd, size), (la_ssize_t)size);
        free(rnd);
        archive_entry_free(ae);
    }
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    *len = used;
    return out;
}

/* A small project: two files and a directory. seed makes its bytes differ. */
static char *project_tar(const char *seed, size_t *len) {
    static char code[128];
    snprintf(code, sizeof code, "print('trained %s')\n", seed);
    const tar_entry e[] = {
        {"train.py", AE_IFREG, code, 0, NULL},
        {"lib", AE_IFDIR, NULL, 0, NULL},
        {"lib/util.py", AE_IFREG, "def f():\n    return 1\n", 0, NULL},
    };
    return make_tar(e, 3, len);
}

/* ---------------------------------------------------------------- requests */

/* Any method with a binary body (application/gzip): the status, *out the
 * parsed JSON answer (or NULL when not JSON / not asked). */
static long req_bytes(const char *token, const char *method, const char *path, const void *body, size_t len,
                      cJSON **out) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, token), 0);
    client_reply r;
    int rc = client_request(&c, method, path, body, len, body ? "application/gzip" : NULL, &r);
    client_release(&c);
    ck_assert_msg(rc == 0, "request failed: %s", r.error);
    long status = r.status;
    if (out) *out = r.body.len ? cJSON_ParseWithLength(r.body.data, r.body.len) : NULL;
    client_reply_release(&r);
    return status;
}

static long upload(const char *token, const void *tar, size_t len, cJSON **out) {
    return req_bytes(token, "POST", "/api/v1/contexts", tar, len, out);
}

/* The id a context of these bytes must have. */
static void id_of(const void *tar, size_t len, char id[80]) {
    char hex[65];
    sha256_hex(tar, len, hex);
    snprintf(id, 80, "sha256:%s", hex);
}

/* GET /api/v1/contexts/{id} into memory: the status; on 200 the bytes (the
 * caller frees) with their length, and the X-Checksum-Sha256 header. */
static long fetch(const char *token, const char *id, char **bytes, size_t *len, char sha_hdr[65]) {
    char path[200], file[400], sha_got[65], loc[8], err[256];
    snprintf(path, sizeof path, "/api/v1/contexts/%s", id);
    snprintf(file, sizeof file, "%s/fetched.tgz", srv.dir);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, token), 0);
    long status = 0;
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 1 << 16);
    int rc = client_download(&c, path, file, &status, sha_hdr, sha_got, loc, sizeof loc, &size, &eb, err, sizeof err);
    client_release(&c);
    buf_release(&eb);
    ck_assert_msg(rc == 0, "GET %s: %s", path, err);
    if (bytes) *bytes = NULL;
    if (status == 200 && bytes) {
        *bytes = file_read_all(file, 64u << 20, len);
        ck_assert_ptr_nonnull(*bytes);
    }
    unlink(file);
    return status;
}

static long get_json(const char *token, const char *path, cJSON **out) {
    return ty_http(srv.url, token, "GET", path, NULL, out);
}

static long del(const char *token, const char *id) {
    char path[200];
    snprintf(path, sizeof path, "/api/v1/contexts/%s", id);
    return req_bytes(token, "DELETE", path, NULL, 0, NULL);
}

/* The team's list as GET /contexts answers it (the caller deletes). */
static cJSON *list(const char *token) {
    cJSON *o = NULL;
    ck_assert_int_eq(get_json(token, "/api/v1/contexts", &o), 200);
    return o;
}

/* The entry of the list with this id, or NULL. */
static cJSON *listed(cJSON *l, const char *id) {
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(l, "contexts"))
        if (strcmp(ty_str(it, "id"), id) == 0) return it;
    return NULL;
}

/* Whether DATA/contexts/<hex> exists. */
static int file_kept(const char *id) {
    char path[512];
    snprintf(path, sizeof path, "%s/contexts/%s", srv.dir, id + 7);
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Files in DATA/contexts (temporary ones included). */
static int files_in_store(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/contexts", srv.dir);
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

/* A command job naming the context (queued: no node ever joins unless the
 * case registers one). */
static long submit_with(const char *token, const char *id, cJSON **out) {
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"name\":\"ctx-job\",\"command\":{\"argv\":[\"python3\",\"train.py\"],\"context\":\"%s\"},"
             "\"resources\":{\"workers\":1,\"device\":\"cpu\"}}",
             id);
    return ty_http(srv.url, token, "POST", "/api/v1/jobs", spec, out);
}

static void assert_error_msg(cJSON *o, const char *code, const char *field, const char *needle) {
    ck_assert_ptr_nonnull(o);
    ty_assert_error(o, code, field);
    const char *msg = ty_str(cJSON_GetObjectItem(o, "error"), "message");
    ck_assert_msg(strstr(msg, needle) != NULL, "the message '%s' does not name '%s'", msg, needle);
}

/* ---------------------------------------------------------------- fixture */

static void start_with(const char *const *extra) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "contexts");
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_a, sizeof team_a);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin, "POST", "/api/v1/teams", "{\"name\":\"teamb\"}", &o), 201);
    snprintf(team_b, sizeof team_b, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
}

static void start(void) { start_with(NULL); }

static void start_big(void) {
    static const char *const extra[] = {"--context-max-mb", "256", NULL};
    start_with(extra);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- cases */

START_TEST(upload_list_fetch) {
    size_t len = 0;
    char *tar = project_tar("a", &len);
    char id[80];
    id_of(tar, len, id);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, tar, len, &o), 201);
    ck_assert_str_eq(ty_str(o, "id"), id);
    ck_assert_int_eq((int64_t)ty_num(o, "bytes"), (int64_t)len);
    ck_assert_int_eq((int)ty_num(o, "files"), 2);
    ck_assert_int_eq((int)ty_num(o, "unpacked_bytes"), (int)(strlen("print('trained a')\n") + 22));
    ck_assert_str_ne(ty_str(o, "created_at"), "");
    cJSON_Delete(o);
    ck_assert(file_kept(id));

    /* the same bytes again: the same id, 200, nothing new */
    ck_assert_int_eq(upload(team_a, tar, len, &o), 200);
    ck_assert_str_eq(ty_str(o, "id"), id);
    cJSON_Delete(o);

    cJSON *l = list(team_a);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(l, "contexts")), 1);
    cJSON *it = listed(l, id);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_eq((int64_t)ty_num(it, "bytes"), (int64_t)len);
    ck_assert_int_eq((int)ty_num(it, "jobs"), 0);
    ck_assert_int_eq((int64_t)ty_num(l, "used_bytes"), (int64_t)len);
    ck_assert_int_eq((int64_t)ty_num(l, "quota_bytes"), 2048LL << 20);
    cJSON_Delete(l);

    /* the exact bytes back, with their checksum */
    char *got = NULL, sha[65];
    size_t glen = 0;
    ck_assert_int_eq(fetch(team_a, id, &got, &glen, sha), 200);
    ck_assert_int_eq(glen, len);
    ck_assert(memcmp(got, tar, len) == 0);
    ck_assert_str_eq(sha, id + 7);
    free(got);

    /* another team: the same 404 as an unknown id; it lists nothing */
    char unknown[80] = "sha256:";
    memset(unknown + 7, 'e', 64);
    unknown[71] = '\0';
    ck_assert_int_eq(fetch(team_b, id, NULL, NULL, sha), 404);
    ck_assert_int_eq(fetch(team_a, unknown, NULL, NULL, sha), 404);
    ck_assert_int_eq(del(team_b, id), 404);
    l = list(team_b);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(l, "contexts")), 0);
    ck_assert_int_eq((int64_t)ty_num(l, "used_bytes"), 0);
    cJSON_Delete(l);
    ck_assert_int_eq(fetch(team_a, id, NULL, NULL, sha), 200); /* B's DELETE changed nothing */

    /* a malformed id */
    ck_assert_int_eq(get_json(team_a, "/api/v1/contexts/sha256:XYZ", &o), 422);
    ty_assert_error(o, "invalid_value", "id");
    cJSON_Delete(o);

    /* contexts belong to a team: the admin is told so */
    ck_assert_int_eq(upload(admin, tar, len, &o), 403);
    assert_error_msg(o, "forbidden", "team", "team");
    cJSON_Delete(o);

    /* team B uploads the same bytes: its own context, one file; A's delete
     * leaves the file to B */
    ck_assert_int_eq(upload(team_b, tar, len, &o), 201);
    ck_assert_str_eq(ty_str(o, "id"), id);
    cJSON_Delete(o);
    ck_assert_int_eq(del(team_a, id), 204);
    ck_assert_int_eq(fetch(team_a, id, NULL, NULL, sha), 404);
    ck_assert(file_kept(id));
    ck_assert_int_eq(fetch(team_b, id, &got, &glen, sha), 200);
    ck_assert(glen == len && memcmp(got, tar, len) == 0);
    free(got);
    ck_assert_int_eq(del(team_b, id), 204);
    ck_assert(!file_kept(id));
    ck_assert_int_eq(del(team_b, id), 404);
    free(tar);
}
END_TEST

/* Each hostile archive is refused naming its entry; nothing is kept. */
START_TEST(hostile_tars_refused) {
    const tar_entry dotdot[] = {{"ok.py", AE_IFREG, "x\n", 0, NULL}, {"../evil-dotdot", AE_IFREG, "x\n", 0, NULL}};
    const tar_entry absolute[] = {{"/etc/evil-absolute", AE_IFREG, "x\n", 0, NULL}};
    const tar_entry device[] = {{"evil-device", AE_IFCHR, NULL, 0, NULL}};
    const tar_entry link_out[] = {{"evil-link", AE_IFLNK, NULL, 0, "../../../etc/passwd"}};
    const struct {
        const tar_entry *e;
        int n;
        const char *names;
    } cases[] = {{dotdot, 2, "../evil-dotdot"}, {absolute, 1, "evil-absolute"}, {device, 1, "evil-device"},
                 {link_out, 1, "evil-link"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = 0;
        char *tar = make_tar(cases[i].e, cases[i].n, &len);
        cJSON *o = NULL;
        ck_assert_int_eq(upload(team_a, tar, len, &o), 422);
        assert_error_msg(o, "invalid_context", "body", cases[i].names);
        cJSON_Delete(o);
        free(tar);
    }
    /* not gzip at all */
    cJSON *o = NULL;
    const char *text = "print('not an archive')\n";
    ck_assert_int_eq(upload(team_a, text, strlen(text), &o), 422);
    ty_assert_error(o, "invalid_context", "body");
    cJSON_Delete(o);
    ck_assert_int_eq(upload(team_a, "", 0, &o), 422);
    ty_assert_error(o, "invalid_context", "body");
    cJSON_Delete(o);
    cJSON *l = list(team_a);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(l, "contexts")), 0);
    ck_assert_int_eq((int64_t)ty_num(l, "used_bytes"), 0);
    cJSON_Delete(l);
    ck_assert_int_eq(files_in_store(), 0);
}
END_TEST

/* --context-max-mb 1 and --context-quota-mb 1: a body past the limit is
 * 413 too_large, a context past the team's quota 413 quota_exceeded; both
 * with limit_bytes, and nothing kept. */
START_TEST(limit_and_quota) {
    stop();
    static const char *const extra[] = {"--context-max-mb", "1", "--context-quota-mb", "1", NULL};
    start_with(extra);
    size_t big_len = (3u << 20) / 2;
    char *big = xmalloc(big_len);
    memset(big, 'z', big_len);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, big, big_len, &o), 413);
    assert_error_msg(o, "too_large", "body", "1 MiB");
    ck_assert_int_eq((int64_t)ty_num(cJSON_GetObjectItem(o, "error"), "limit_bytes"), 1 << 20);
    cJSON_Delete(o);
    free(big);

    /* two contexts of 600 KiB of random bytes each (gzip cannot shrink them) */
    const tar_entry first[] = {{"weights-1.bin", AE_IFREG, NULL, 600u << 10, NULL}};
    const tar_entry second[] = {{"weights-2.bin", AE_IFREG, NULL, 600u << 10, NULL}};
    size_t l1 = 0, l2 = 0;
    char *t1 = make_tar(first, 1, &l1), *t2 = make_tar(second, 1, &l2);
    ck_assert_int_eq(upload(team_a, t1, l1, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(upload(team_a, t2, l2, &o), 413);
    assert_error_msg(o, "quota_exceeded", "body", "1 MiB");
    ck_assert_int_eq((int64_t)ty_num(cJSON_GetObjectItem(o, "error"), "limit_bytes"), 1 << 20);
    cJSON_Delete(o);
    /* the quota is per team: B may */
    ck_assert_int_eq(upload(team_b, t2, l2, &o), 201);
    cJSON_Delete(o);
    cJSON *l = list(team_a);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(l, "contexts")), 1);
    ck_assert_int_eq((int64_t)ty_num(l, "used_bytes"), (int64_t)l1);
    ck_assert_int_eq((int64_t)ty_num(l, "quota_bytes"), 1 << 20);
    cJSON_Delete(l);
    ck_assert_int_eq(files_in_store(), 2);
    free(t1);
    free(t2);
}
END_TEST

/* Jobs name contexts the team holds; a context a job still needs stays. */
START_TEST(jobs_name_contexts) {
    size_t len = 0;
    char *tar = project_tar("jobs", &len);
    char id[80];
    id_of(tar, len, id);
    cJSON *o = NULL;
    ck_assert_int_eq(submit_with(team_a, id, &o), 422);
    assert_error_msg(o, "invalid_value", "command.context", "POST /api/v1/contexts");
    cJSON_Delete(o);
    ck_assert_int_eq(get_json(team_a, "/api/v1/jobs", &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0); /* nothing stored */
    cJSON_Delete(o);

    ck_assert_int_eq(upload(team_a, tar, len, &o), 201);
    cJSON_Delete(o);
    /* team B does not hold it: the same 422 */
    ck_assert_int_eq(submit_with(team_b, id, &o), 422);
    ty_assert_error(o, "invalid_value", "command.context");
    cJSON_Delete(o);

    ck_assert_int_eq(submit_with(team_a, id, &o), 201);
    int64_t job = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    cJSON *j = ty_job_get(srv.url, team_a, job);
    cJSON *cmd = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "command");
    ck_assert_str_eq(ty_str(cmd, "context"), id);
    ck_assert_str_eq(ty_str(j, "state"), "queued");
    cJSON_Delete(j);
    cJSON *l = list(team_a);
    ck_assert_int_eq((int)ty_num(listed(l, id), "jobs"), 1);
    cJSON_Delete(l);

    /* needed by the queued job: kept */
    char path[200];
    snprintf(path, sizeof path, "/api/v1/contexts/%s", id);
    ck_assert_int_eq(req_bytes(team_a, "DELETE", path, NULL, 0, &o), 409);
    ty_assert_error(o, "conflict", NULL);
    cJSON_Delete(o);
    ck_assert(file_kept(id));
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, team_a, "POST", path, NULL, NULL), 200);
    ck_assert_int_eq(del(team_a, id), 204);
    ck_assert(!file_kept(id));
    char sha[65];
    ck_assert_int_eq(fetch(team_a, id, NULL, NULL, sha), 404);
    free(tar);
}
END_TEST

/* The node a job's task runs on and the task itself fetch its context;
 * other nodes, other tasks and contexts their jobs do not name are 404. */
START_TEST(node_and_task_fetch) {
    size_t len = 0, olen = 0;
    char *tar = project_tar("node", &len), *other = project_tar("other", &olen);
    char id[80], oid[80];
    id_of(tar, len, id);
    id_of(other, olen, oid);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, tar, len, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(upload(team_a, other, olen, &o), 201);
    cJSON_Delete(o);
    char join[160], node_tok[2][200];
    int64_t node[2];
    ty_token(&srv, "node.token", join, sizeof join);
    for (int i = 0; i < 2; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"hostname\":\"ctx-n%d\",\"address\":\"127.0.0.1\",\"cpu_slots\":%d}", i,
                 i == 0 ? 1 : 0);
        ck_assert_int_eq(ty_http(srv.url, join, "POST", "/api/v1/nodes", body, &o), 201);
        node[i] = (int64_t)ty_num(o, "id");
        snprintf(node_tok[i], sizeof node_tok[i], "%s", ty_str(o, "token"));
        cJSON_Delete(o);
    }
    char sha[65];
    ck_assert_int_eq(fetch(node_tok[0], id, NULL, NULL, sha), 404); /* no job needs it there yet */
    ck_assert_int_eq(submit_with(team_a, id, &o), 201);
    int64_t job = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    /* take the task as n0's agent would */
    char path[160], task_tok[200] = "";
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=2", (long long)node[0]);
    for (int i = 0; i < 20 && !task_tok[0]; i++) {
        ck_assert_int_eq(ty_http(srv.url, node_tok[0], "GET", path, NULL, &o), 200);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start"))
            if ((int64_t)ty_num(it, "job") == job) snprintf(task_tok, sizeof task_tok, "%s", ty_str(it, "token"));
        cJSON_Delete(o);
    }
    ck_assert_msg(task_tok[0], "job %lld was not handed out to n0", (long long)job);
    char *got = NULL;
    size_t glen = 0;
    ck_assert_int_eq(fetch(node_tok[0], id, &got, &glen, sha), 200);
    ck_assert(glen == len && memcmp(got, tar, len) == 0);
    ck_assert_str_eq(sha, id + 7);
    free(got);
    ck_assert_int_eq(fetch(task_tok, id, &got, &glen, sha), 200);
    ck_assert(glen == len && memcmp(got, tar, len) == 0);
    free(got);
    ck_assert_int_eq(fetch(node_tok[1], id, NULL, NULL, sha), 404);
    ck_assert_int_eq(fetch(node_tok[0], oid, NULL, NULL, sha), 404);
    ck_assert_int_eq(fetch(task_tok, oid, NULL, NULL, sha), 404);
    /* a task token may not list or delete */
    ck_assert_int_eq(del(task_tok, id), 403);
    free(tar);
    free(other);
}
END_TEST

/* --context-grace-s 1: an unused context goes within seconds, file and
 * all; one a queued job names stays, and goes once the job has ended and
 * the grace has passed. */
START_TEST(unused_contexts_collected) {
    stop();
    static const char *const extra[] = {"--context-grace-s", "1", NULL};
    start_with(extra);
    size_t l1 = 0, l2 = 0;
    char *unused = project_tar("unused", &l1), *needed = project_tar("needed", &l2);
    char uid[80], nid[80];
    id_of(unused, l1, uid);
    id_of(needed, l2, nid);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, unused, l1, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(upload(team_a, needed, l2, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(submit_with(team_a, nid, &o), 201);
    int64_t job = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    char sha[65];
    int gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        ty_sleep_ms(100);
        gone = fetch(team_a, uid, NULL, NULL, sha) == 404;
    }
    ck_assert_msg(gone, "the unused context is still there after 10 s");
    ck_assert(!file_kept(uid));
    ty_sleep_ms(2500); /* past the grace again: the needed one stays */
    ck_assert_int_eq(fetch(team_a, nid, NULL, NULL, sha), 200);
    ck_assert(file_kept(nid));
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, team_a, "POST", path, NULL, NULL), 200);
    gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        ty_sleep_ms(100);
        gone = fetch(team_a, nid, NULL, NULL, sha) == 404;
    }
    ck_assert_msg(gone, "the context of the cancelled job is still there after 10 s");
    ck_assert(!file_kept(nid));
    size_t llen = 0;
    char *log = file_read_all(srv.log, 16u << 20, &llen);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, uid + 7) && strstr(log, "contexts: dropped"), "the drop is not in the server's log");
    free(log);
    free(unused);
    free(needed);
}
END_TEST

/* A restarted server keeps the contexts: rows and files. */
START_TEST(kept_across_restart) {
    size_t len = 0;
    char *tar = project_tar("restart", &len);
    char id[80];
    id_of(tar, len, id);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, tar, len, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_kill(&srv, SIGTERM), 0);
    ty_server_start(&srv);
    cJSON *l = list(team_a);
    ck_assert_ptr_nonnull(listed(l, id));
    ck_assert_int_eq((int64_t)ty_num(l, "used_bytes"), (int64_t)len);
    cJSON_Delete(l);
    char *got = NULL, sha[65];
    size_t glen = 0;
    ck_assert_int_eq(fetch(team_a, id, &got, &glen, sha), 200);
    ck_assert(glen == len && memcmp(got, tar, len) == 0);
    free(got);
    ck_assert_int_eq(upload(team_a, tar, len, &o), 200);
    cJSON_Delete(o);
    free(tar);
}
END_TEST

/* ---------------------------------------------------------------- a slow link */

/* A gzip'd tar at path holding one file of mb MiB of random bytes (gzip
 * cannot shrink them): its size. */
static size_t big_tar_file(const char *path, int mb) {
    struct archive *a = archive_write_new();
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_set_filter_option(a, "gzip", "compression-level", "1"), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_open_filename(a, path), ARCHIVE_OK);
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, "weights.bin");
    archive_entry_set_filetype(ae, AE_IFREG);
    archive_entry_set_perm(ae, 0644);
    archive_entry_set_size(ae, (la_int64_t)mb << 20);
    ck_assert_int_eq(archive_write_header(a, ae), ARCHIVE_OK);
    char *chunk = xmalloc(1 << 20);
    for (int i = 0; i < mb; i++) {
        for (size_t off = 0; off < (1u << 20);) {
            ssize_t r = getrandom(chunk + off, (1u << 20) - off, 0);
            ck_assert_int_gt(r, 0);
            off += (size_t)r;
        }
        ck_assert_int_eq(archive_write_data(a, chunk, 1 << 20), 1 << 20);
    }
    free(chunk);
    archive_entry_free(ae);
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return (size_t)sb.st_size;
}

/* A TCP proxy on loopback to the server's port: what the server sends goes
 * on at most rate bytes a second per connection (after a burst of 256 KiB,
 * so small answers pass at once); what the client sends, as it comes. The
 * bytes passed from the server, in all, are counted in *relayed (shared
 * memory). Runs in a child process (dies with the test's); its port into
 * *port. */
#define PROXY_CONNS 64
#define PROXY_BURST (256 << 10)
typedef struct pconn {
    int c, u;                            /* client and upstream fds, -1 when free */
    char up[65536], down[65536];
    size_t up_len, up_off, down_len, down_off;
    double tokens;
} pconn;

static void pconn_close(pconn *k) {
    if (k->c >= 0) close(k->c);
    if (k->u >= 0) close(k->u);
    k->c = k->u = -1;
}

static void proxy_loop(int lfd, int upstream_port, double rate, _Atomic long long *relayed) {
    static pconn k[PROXY_CONNS];
    for (int i = 0; i < PROXY_CONNS; i++) k[i].c = k[i].u = -1;
    int64_t last = mono_ms();
    for (;;) {
        struct pollfd pf[1 + 2 * PROXY_CONNS];
        int who[1 + 2 * PROXY_CONNS], n = 0;
        pf[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        who[n++] = -1;
        int64_t now = mono_ms();
        for (int i = 0; i < PROXY_CONNS; i++) {
            if (k[i].c < 0) continue;
            k[i].tokens += rate * (double)(now - last) / 1000.0;
            if (k[i].tokens > PROXY_BURST) k[i].tokens = PROXY_BURST;
            short ce = 0, ue = 0;
            if (k[i].up_len == 0) ce |= POLLIN;
            if (k[i].up_len > 0) ue |= POLLOUT;
            if (k[i].down_len == 0 && k[i].tokens >= 1) ue |= POLLIN;
            if (k[i].down_len > 0) ce |= POLLOUT;
            pf[n] = (struct pollfd){.fd = k[i].c, .events = ce};
            who[n++] = i;
            pf[n] = (struct pollfd){.fd = k[i].u, .events = ue};
            who[n++] = i;
        }
        last = now;
        if (poll(pf, (nfds_t)n, 10) < 0 && errno != EINTR) _exit(1);
        if (pf[0].revents & POLLIN) {
            int c = accept(lfd, NULL, NULL);
            int slot = -1;
            for (int i = 0; i < PROXY_CONNS && slot < 0; i++)
                if (k[i].c < 0) slot = i;
            int u = c >= 0 && slot >= 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
            struct sockaddr_in a;
            memset(&a, 0, sizeof a);
            a.sin_family = AF_INET;
            a.sin_port = htons((uint16_t)upstream_port);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (u >= 0 && connect(u, (struct sockaddr *)&a, sizeof a) == 0) {
                memset(&k[slot], 0, sizeof k[slot]);
                k[slot].c = c;
                k[slot].u = u;
                k[slot].tokens = PROXY_BURST;
            } else {
                if (c >= 0) close(c);
                if (u >= 0) close(u);
            }
        }
        for (int j = 1; j < n; j++) {
            pconn *q = &k[who[j]];
            if (q->c < 0 || !pf[j].revents) continue;
            int is_c = pf[j].fd == q->c;
            if (pf[j].revents & (POLLERR | POLLNVAL)) {
                pconn_close(q);
                continue;
            }
            if (is_c && (pf[j].revents & (POLLIN | POLLHUP)) && q->up_len == 0) {
                ssize_t r = read(q->c, q->up, sizeof q->up);
                if (r <= 0) {
                    pconn_close(q);
                    continue;
                }
                q->up_len = (size_t)r;
                q->up_off = 0;
            }
            if (!is_c && (pf[j].revents & POLLOUT) && q->up_len > 0) {
                ssize_t w = write(q->u, q->up + q->up_off, q->up_len - q->up_off);
                if (w <= 0) {
                    pconn_close(q);
                    continue;
                }
                q->up_off += (size_t)w;
                if (q->up_off == q->up_len) q->up_len = q->up_off = 0;
            }
            if (!is_c && (pf[j].revents & (POLLIN | POLLHUP)) && q->down_len == 0 && q->tokens >= 1) {
                size_t want = q->tokens < (double)sizeof q->down ? (size_t)q->tokens : sizeof q->down;
                ssize_t r = read(q->u, q->down, want);
                if (r <= 0) {
                    pconn_close(q);
                    continue;
                }
                q->tokens -= (double)r;
                q->down_len = (size_t)r;
                q->down_off = 0;
            }
            if (is_c && (pf[j].revents & POLLOUT) && q->down_len > 0) {
                ssize_t w = write(q->c, q->down + q->down_off, q->down_len - q->down_off);
                if (w <= 0) {
                    pconn_close(q);
                    continue;
                }
                q->down_off += (size_t)w;
                atomic_fetch_add(relayed, (long long)w);
                if (q->down_off == q->down_len) q->down_len = q->down_off = 0;
            }
        }
    }
}

static pid_t proxy_start(int upstream_port, double rate, _Atomic long long *relayed, int *port) {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(lfd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(lfd, 64), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGPIPE, SIG_IGN);
        proxy_loop(lfd, upstream_port, rate, relayed);
        _exit(0);
    }
    close(lfd);
    return pid;
}

/* The node's last_heartbeat_at as GET /cluster shows it ("" none yet). */
static void last_heartbeat(char *out, size_t n) {
    cJSON *o = NULL;
    ck_assert_int_eq(get_json(admin, "/api/v1/cluster", &o), 200);
    cJSON *node = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "nodes"), 0);
    const cJSON *hb = node ? cJSON_GetObjectItem(node, "last_heartbeat_at") : NULL;
    snprintf(out, n, "%s", cJSON_IsString(hb) ? hb->valuestring : "");
    cJSON_Delete(o);
}

static void job_state(int64_t id, char *out, size_t n) {
    cJSON *o = ty_job_get(srv.url, team_a, id);
    snprintf(out, n, "%s", ty_str(o, "state"));
    cJSON_Delete(o);
}

/* The job once it has ended (30 s at most), asserted to be in state want
 * (the caller deletes it). */
static cJSON *expect_ended(int64_t id, const char *want) {
    int64_t end = mono_ms() + 30000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, team_a, id);
        const char *st = ty_str(o, "state");
        int done = strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0;
        if (done || mono_ms() > end) {
            ck_assert_msg(strcmp(st, want) == 0, "job %lld is %s (%s), not %s", (long long)id, st,
                          ty_str(o, "reason"), want);
            return o;
        }
        cJSON_Delete(o);
        ty_sleep_ms(100);
    }
}

static int64_t submit_cmd(const char *ctx, const char *script) {
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\":\"ctx-job\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\",\"%s\"]%s%s%s},"
             "\"resources\":{\"workers\":1,\"device\":\"cpu\"},\"max_restarts\":0}",
             script, ctx ? ",\"context\":\"" : "", ctx ? ctx : "", ctx ? "\"" : "");
    return ty_submit(srv.url, team_a, spec);
}

/* A 200 MB context the node fetches at 8 MiB/s (about 25 s) through a
 * throttling proxy between the agent and the server: while it downloads,
 * the node's heartbeats go on (last_heartbeat_at moves at least every 4 s,
 * the agent sends one a second) and another job (with a small context of
 * its own) starts within a few seconds; cancelling the big job stops the
 * download (the proxy passes nothing more) and leaves nothing of it in the
 * node's cache. */
START_TEST(slow_context_holds_nothing_up) {
    char dir[400], path[600];
    snprintf(dir, sizeof dir, "%s/slow", srv.dir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/big.tgz", dir);
    size_t big_len = big_tar_file(path, 200);
    size_t len = 0;
    char *big = file_read_all(path, 256u << 20, &len);
    ck_assert_ptr_nonnull(big);
    ck_assert_uint_eq(len, big_len);
    char big_id[80], small_id[80];
    id_of(big, len, big_id);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_a), 0);
    c.timeout_ms = 300000;
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/contexts", big, len, "application/gzip", &r), 0);
    ck_assert_msg(r.status == 201, "upload of %zu bytes answered %ld: %.300s", len, r.status,
                  r.body.data ? r.body.data : "");
    client_reply_release(&r);
    client_release(&c);
    free(big);
    size_t slen = 0;
    char *small = project_tar("small", &slen);
    id_of(small, slen, small_id);
    cJSON *o = NULL;
    ck_assert_int_eq(upload(team_a, small, slen, &o), 201);
    cJSON_Delete(o);
    free(small);

    /* the agent reaches the server through the slow link only */
    _Atomic long long *relayed = mmap(NULL, sizeof *relayed, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(relayed, MAP_FAILED);
    atomic_store(relayed, 0);
    int server_port = atoi(strrchr(srv.url, ':') + 1), proxy_port = 0;
    pid_t proxy = proxy_start(server_port, 8 << 20, relayed, &proxy_port);
    char url[64], tokfile[500], statef[500], logf[500], cache[500];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", proxy_port);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(statef, sizeof statef, "%s/agent.state", dir);
    snprintf(logf, sizeof logf, "%s/agent.log", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    pid_t agent = fork();
    ck_assert_int_ge(agent, 0);
    if (agent == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(logf, "a", stderr)) _exit(126);
        execl(ty_bin(), ty_bin(), "agent", "--server", url, "--token-file", tokfile, "--hostname", "slow-link",
              "--cpu-slots", "2", "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, "--cache-dir",
              cache, "--podman", "none", (char *)NULL);
        _exit(127);
    }
    char hb[64] = "";
    for (int i = 0; i < 200 && !hb[0]; i++) {
        last_heartbeat(hb, sizeof hb);
        if (!hb[0]) ty_sleep_ms(100);
    }
    ck_assert_msg(hb[0], "the agent did not join through the proxy");

    int64_t big_job = submit_cmd(big_id, "echo big-started");
    /* its download is under way */
    int64_t end = mono_ms() + 60000;
    while (atomic_load(relayed) < (8LL << 20) && mono_ms() < end) ty_sleep_ms(100);
    ck_assert_msg(atomic_load(relayed) >= (8LL << 20), "the big context's download did not start");

    /* another job starts meanwhile */
    int64_t t0 = mono_ms();
    int64_t small_job = submit_cmd(small_id, "cat train.py");
    char st[32] = "";
    for (;;) {
        job_state(small_job, st, sizeof st);
        if (strcmp(st, "running") == 0 || strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 ||
            mono_ms() - t0 > 60000)
            break;
        ty_sleep_ms(50);
    }
    int64_t started_ms = mono_ms() - t0;
    fprintf(stderr, "check_contexts: a job started %lld ms after its submission while the node downloaded a "
            "200 MB context (%lld MB so far)\n", (long long)started_ms, atomic_load(relayed) >> 20);
    ck_assert_msg(strcmp(st, "running") == 0 || strcmp(st, "succeeded") == 0, "the small job is %s", st);
    ck_assert_msg(started_ms < 5000, "the small job started %lld ms after its submission", (long long)started_ms);
    /* the heartbeats go on: last_heartbeat_at moves at least every 4 s */
    last_heartbeat(hb, sizeof hb);
    int64_t changed = mono_ms(), worst = 0;
    for (int64_t stop_at = mono_ms() + 6000; mono_ms() < stop_at;) {
        ty_sleep_ms(100);
        char now[64];
        last_heartbeat(now, sizeof now);
        if (strcmp(now, hb) != 0) {
            if (mono_ms() - changed > worst) worst = mono_ms() - changed;
            changed = mono_ms();
            snprintf(hb, sizeof hb, "%s", now);
        }
    }
    if (mono_ms() - changed > worst) worst = mono_ms() - changed;
    fprintf(stderr, "check_contexts: the longest wait between two heartbeats seen: %lld ms\n", (long long)worst);
    ck_assert_msg(worst < 4000, "no heartbeat for %lld ms while the context downloaded", (long long)worst);
    cJSON_Delete(expect_ended(small_job, "succeeded"));
    char *log = ty_task_log(srv.url, team_a, small_job, "worker-0");
    ck_assert_msg(strstr(log, "trained small") != NULL, "the small job's context: %s", log);
    free(log);
    /* all of that while the big one was still downloading */
    job_state(big_job, st, sizeof st);
    ck_assert_str_eq(st, "starting");
    long long so_far = atomic_load(relayed);
    ck_assert_msg(so_far < (long long)big_len, "the whole context (%zu bytes) came through already", big_len);

    /* cancel: the download stops, nothing of it stays */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)big_job);
    ck_assert_int_eq(ty_http(srv.url, team_a, "POST", path, NULL, NULL), 200);
    cJSON_Delete(expect_ended(big_job, "cancelled"));
    ty_sleep_ms(1500); /* what the proxy had buffered drains */
    long long after = atomic_load(relayed);
    ty_sleep_ms(1500);
    /* heartbeats and long-polls pass a few hundred bytes; the download, 12 MiB in 1.5 s */
    long long later = atomic_load(relayed);
    ck_assert_msg(later - after < (1 << 20), "the download goes on after the cancel (%lld -> %lld bytes)", after,
                  later);
    ck_assert_msg(after < (long long)big_len, "the whole context came through before the cancel");
    snprintf(path, sizeof path, "%s/contexts/%s.tar.gz", cache, big_id + 7);
    ck_assert_msg(access(path, F_OK) != 0, "%s is in the cache", path);
    snprintf(path, sizeof path, "%s/contexts/%s.tar.gz.part", cache, big_id + 7);
    ck_assert_msg(access(path, F_OK) != 0, "%s is left in the cache", path);
    size_t llen = 0;
    char *alog = file_read_all(logf, 16 << 20, &llen);
    ck_assert_ptr_nonnull(alog);
    ck_assert_msg(strstr(alog, "while its context is made ready: cancelled") != NULL, "agent log:\n%.4000s", alog);
    free(alog);

    ty_proc ap = {.pid = agent};
    ck_assert_int_eq(ty_kill(&ap, SIGTERM), 0);
    kill(proxy, SIGKILL);
    waitpid(proxy, NULL, 0);
    munmap(relayed, sizeof *relayed);
}
END_TEST

int main(void) {
    Suite *s = suite_create("contexts");
    TCase *tc = ty_tcase(s, "contexts", start, stop, 60);
    tcase_add_test(tc, upload_list_fetch);
    tcase_add_test(tc, hostile_tars_refused);
    tcase_add_test(tc, limit_and_quota);
    tcase_add_test(tc, jobs_name_contexts);
    tcase_add_test(tc, node_and_task_fetch);
    tcase_add_test(tc, unused_contexts_collected);
    tcase_add_test(tc, kept_across_restart);
    /* an agent through a slow link: the server takes 200 MB contexts */
    TCase *slow = ty_tcase(s, "slow link", start_big, stop, 180);
    tcase_add_test(slow, slow_context_holds_nothing_up);
    return ty_run_suite(s);
}
