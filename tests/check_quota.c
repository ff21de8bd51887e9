/* check_quota.c - what bounds the server's disk, end to end on
 * `trainyard up --cpu-slots 2`: a team's storage quota (PATCH /teams/{name},
 * GET /teams's storage_quota and storage_used), a checkpoint past it
 * refused 507 storage_quota while another team's job checkpoints and
 * succeeds, a chatty job's log stopped at the quota with one note line, a
 * context upload past it 413 quota_exceeded; the per-job log cap
 * (logs.max_size, --log-max-per-job-default) with its note, a program
 * printing 150 MB as fast as it can; the disk reserve (507 disk_reserve);
 * and a restarted server that keeps quotas and use. */
#include "testlib.h"

#include <limits.h>

static ty_proc srv;
static char admin_tok[128], team_tok[128];
static char tmpdir[256];

static void start_with(const char *const *more) {
    const char *extra[16] = {"--cpu-slots", "2"};
    int n = 2;
    for (int i = 0; more && more[i] && n < 15; i++) extra[n++] = more[i];
    extra[n] = NULL;
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

static void setup_plain(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "quota");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "quotatmp");
    start_with(NULL);
}

static void setup_cap(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "quota");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "quotatmp");
    const char *more[] = {"--log-max-per-job-default", "48MiB", "--log-max-per-job", "1GiB", NULL};
    start_with(more);
}

static void setup_reserve(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "quota");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "quotatmp");
    const char *more[] = {"--disk-reserve", "1000TiB", NULL};
    start_with(more);
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("TY_KEEP")) fprintf(stderr, "check_quota: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
}

/* ---------------------------------------------------------------- helpers */

/* A new team (POST /teams as the admin): its token into tok. */
static void team_make(const char *name, char *tok, size_t n) {
    char body[128];
    snprintf(body, sizeof body, "{\"name\":\"%s\"}", name);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", body, &o), 201);
    snprintf(tok, n, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
}

static long patch_team(const char *tok, const char *name, const char *body, cJSON **out) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/teams/%s", name);
    return ty_http(srv.url, tok, "PATCH", path, body, out);
}

/* The team `name` of GET /teams (admin), detached (the caller deletes). */
static cJSON *team_of(const char *name) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    cJSON *arr = cJSON_GetObjectItem(o, "teams");
    for (int i = 0; i < cJSON_GetArraySize(arr); i++) {
        if (strcmp(ty_str(cJSON_GetArrayItem(arr, i), "name"), name) == 0) {
            cJSON *t = cJSON_DetachItemFromArray(arr, i);
            cJSON_Delete(o);
            return t;
        }
    }
    cJSON_Delete(o);
    ck_abort_msg("no team %s in GET /teams", name);
    return NULL;
}

static double used_of(const cJSON *team, const char *kind) {
    return ty_num(cJSON_GetObjectItem(team, "storage_used"), kind);
}

/* A command job of the team running `sh -c script` (JSON-escaped by the caller). */
static int64_t submit_sh(const char *tok, const char *name, const char *script, const char *more) {
    char spec[4096];
    snprintf(spec, sizeof spec, "{\"name\":\"%s\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\",\"%s\"]},\"max_restarts\":0%s}",
             name, script, more ? more : "");
    return ty_submit(srv.url, tok, spec);
}

static cJSON *wait_end(const char *tok, int64_t id, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, tok, id);
        const char *s = ty_str(o, "state");
        if (strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 || strcmp(s, "cancelled") == 0) return o;
        ck_assert_msg(mono_ms() < end, "job %lld still %s after %d s", (long long)id, s, timeout_s);
        cJSON_Delete(o);
        ty_sleep_ms(200);
    }
}

/* The whole log file of a job's task as the server keeps it (the API reads
 * at most 1 MiB at a time). On PostgreSQL the log is in the database: read
 * whole through the API, a page at a time. */
static char *log_file(int64_t id, const char *task, size_t *len) {
    if (ty_pg_url()) {
        buf b;
        buf_init(&b, 1u << 30);
        for (;;) {
            char page[160];
            snprintf(page, sizeof page, "/api/v1/jobs/%lld/logs?task=%s&since=%zu", (long long)id, task, b.len);
            char *t = ty_http_text(srv.url, admin_tok, page);
            size_t n = strlen(t);
            ck_assert_int_eq(buf_append(&b, t, n), 0);
            free(t);
            if (!n) break;
        }
        char *s = buf_detach(&b, len);
        return s ? s : xstrdup("");
    }
    char path[512];
    snprintf(path, sizeof path, "%s/logs/%lld/%s.log", srv.dir, (long long)id, task);
    char *s = file_read_all(path, 1u << 30, len);
    if (!s) {
        *len = 0;
        return xstrdup("");
    }
    return s;
}

/* The log once it holds needle (output is shipped once a second and at
 * the task's exit, which may come after the job's end). */
static char *wait_log_has(int64_t id, const char *needle, size_t *len, int timeout_ms) {
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        char *l = log_file(id, "worker-0", len);
        if (strstr(l, needle)) return l;
        ck_assert_msg(mono_ms() < end, "job %lld's log has no '%s'; it ends: %.600s", (long long)id, needle,
                      *len > 600 ? l + *len - 600 : l);
        free(l);
        ty_sleep_ms(200);
    }
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static int checkpoints_of(const char *tok, int64_t id, double *size) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &o), 200);
    cJSON *arr = cJSON_GetObjectItem(o, "checkpoints");
    int n = cJSON_GetArraySize(arr);
    if (size) *size = n ? ty_num(cJSON_GetArrayItem(arr, 0), "size") : 0;
    cJSON_Delete(o);
    return n;
}

/* POST /contexts with a small gzip'd tar made here: the status, the body. */
static long context_upload(const char *tok, cJSON **out) {
    char cmd[2048], tgz[300];
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/ctx && echo 'print(1)' > %s/ctx/run.py && tar czf %s -C %s/ctx .", tmpdir,
             tmpdir, tgz, tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    size_t len = 0;
    char *body = file_read_all(tgz, 1 << 20, &len);
    ck_assert_ptr_nonnull(body);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/contexts", body, len, "application/gzip", &r), 0);
    long st = r.status;
    *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    ck_assert_ptr_nonnull(*out);
    client_reply_release(&r);
    client_release(&c);
    free(body);
    return st;
}

/* ---------------------------------------------------------------- PATCH /teams */

START_TEST(patch_validates_and_is_admin_only) {
    char b_tok[128];
    team_make("b", b_tok, sizeof b_tok);
    cJSON *o = NULL;
    /* a team's token: 403, even for itself; an unknown team: 404 */
    ck_assert_int_eq(patch_team(b_tok, "b", "{\"storage_quota\":\"1GiB\"}", &o), 403);
    ty_assert_error(o, "forbidden", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(patch_team(admin_tok, "nobody", "{\"storage_quota\":\"1GiB\"}", &o), 404);
    cJSON_Delete(o);
    /* bad values: 422 naming the field, nothing changed */
    static const char *const bad[] = {"{\"storage_quota\":\"lots\"}", "{\"storage_quota\":true}",
                                      "{\"storage_quota\":-1}", "{\"storage_quota\":1.5}",
                                      "{\"storage_quota\":\"-5GiB\"}", "{\"storage_quota\":\"1GiB\",\"weight\":0}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(patch_team(admin_tok, "b", bad[i], &o), 422);
        cJSON *e = cJSON_GetObjectItem(o, "error");
        ck_assert_msg(strcmp(ty_str(e, "field"), "storage_quota") == 0 || strcmp(ty_str(e, "field"), "weight") == 0,
                      "%s: field %s", bad[i], ty_str(e, "field"));
        cJSON_Delete(o);
        cJSON *t = team_of("b");
        ck_assert_msg(cJSON_IsNull(cJSON_GetObjectItem(t, "storage_quota")), "%s changed the quota", bad[i]);
        cJSON_Delete(t);
    }
    /* a size as resources.memory takes it, bytes, null */
    ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":\"500GiB\"}", &o), 200);
    ck_assert_double_eq(ty_num(o, "storage_quota"), 500.0 * 1073741824.0);
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(o, "storage_used"));
    cJSON_Delete(o);
    ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":1048576}", &o), 200);
    ck_assert_double_eq(ty_num(o, "storage_quota"), 1048576.0);
    cJSON_Delete(o);
    cJSON *t = team_of("b");
    ck_assert_double_eq(ty_num(t, "storage_quota"), 1048576.0);
    ck_assert_double_eq(used_of(t, "total"), 0);
    cJSON_Delete(t);
    ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":null}", &o), 200);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "storage_quota")));
    cJSON_Delete(o);
    /* a team sees its own storage in GET /teams */
    ck_assert_int_eq(ty_http(srv.url, b_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    cJSON *mine = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "teams"), 0);
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(mine, "storage_used"));
    cJSON_Delete(o);
    /* logs.max_size past --log-max-per-job (16 GiB): 422 naming it, nothing stored */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs",
                             "{\"command\":{\"argv\":[\"true\"]},\"logs\":{\"max_size\":\"32GiB\"}}", &o),
                     422);
    ty_assert_error(o, "invalid_value", "logs.max_size");
    ck_assert_ptr_nonnull(strstr(ty_str(cJSON_GetObjectItem(o, "error"), "message"), "16384 MiB"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- sizes as text and as bytes */

/* One size written two ways (a string, a JSON integer of bytes) at or past a
 * bound of its field: accepted alike with the same value, or refused alike. */
typedef struct size_pair {
    const char *text; /* JSON string literal, quotes included */
    const char *bytes; /* JSON number */
    double want;       /* the value kept, or -1: refused */
} size_pair;

START_TEST(size_fields_alike_as_text_and_bytes) {
    char b_tok[128];
    team_make("b", b_tok, sizeof b_tok);
    cJSON *o = NULL;
    /* storage_quota: 0 to 64 TiB whichever way it is written */
    static const size_pair quota[] = {
        {"\"0\"", "0", 0},
        {"\"0B\"", "0", 0},
        {"\"-1\"", "-1", -1},
        {"\"-1B\"", "-1", -1},
        {"\"8MiB\"", "8388608", 8388608},
        {"\"1.5KiB\"", "1536", 1536},
        {"\"1 M\"", "1000000", 1000000},
        {"\"64TiB\"", "70368744177664", 70368744177664.0},
        {"\"70368744177664\"", "70368744177664", 70368744177664.0},
        {"\"70368744177665\"", "70368744177665", -1},
        {"\"64.000000001TiB\"", "70368744177665", -1},
        {"\"65TiB\"", "71468255805440", -1},
    };
    for (size_t i = 0; i < sizeof quota / sizeof quota[0]; i++) {
        const char *forms[2] = {quota[i].text, quota[i].bytes};
        for (int f = 0; f < 2; f++) {
            /* a known quota first, so that a refusal can be seen to change nothing */
            ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":12345}", &o), 200);
            cJSON_Delete(o);
            char body[128];
            snprintf(body, sizeof body, "{\"storage_quota\":%s}", forms[f]);
            long st = patch_team(admin_tok, "b", body, &o);
            if (quota[i].want < 0) {
                ck_assert_msg(st == 422, "%s: %ld", body, st);
                ty_assert_error(o, "invalid_value", "storage_quota");
                const char *msg = ty_str(cJSON_GetObjectItem(o, "error"), "message");
                ck_assert_msg(strstr(msg, "between 0B and 64TiB"), "%s: %s", body, msg);
            } else {
                ck_assert_msg(st == 200, "%s: %ld", body, st);
                ck_assert_msg(ty_num(o, "storage_quota") == quota[i].want, "%s: %.0f", body,
                              ty_num(o, "storage_quota"));
            }
            cJSON_Delete(o);
            cJSON *t = team_of("b");
            double have = ty_num(t, "storage_quota");
            cJSON_Delete(t);
            ck_assert_msg(have == (quota[i].want < 0 ? 12345 : quota[i].want), "%s: the team has %.0f", body, have);
        }
    }
    /* logs.max_size: 16 MiB (the spec's bound) to 16 GiB (this server's --log-max-per-job) */
    static const size_pair logs[] = {
        {"\"16MiB\"", "16777216", 16},
        {"\"16777216\"", "16777216", 16},
        {"\"16777215\"", "16777215", -1},
        {"\"16383KiB\"", "16776192", -1},
        {"\"15.9999999MiB\"", "16777215", -1},
        {"\"16GiB\"", "17179869184", 16384},
        {"\"17179869185\"", "17179869185", -1},
        {"\"16.000000001GiB\"", "17179869185", -1},
        {"\"64TiB\"", "70368744177664", -1},
        {"\"65TiB\"", "71468255805440", -1},
    };
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        const char *forms[2] = {logs[i].text, logs[i].bytes};
        for (int f = 0; f < 2; f++) {
            ck_assert_int_eq(ty_http(srv.url, b_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
            int before = cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs"));
            cJSON_Delete(o);
            char spec[256];
            snprintf(spec, sizeof spec, "{\"command\":{\"argv\":[\"true\"]},\"logs\":{\"max_size\":%s}}", forms[f]);
            long st = ty_http(srv.url, b_tok, "POST", "/api/v1/jobs", spec, &o);
            if (logs[i].want < 0) {
                ck_assert_msg(st == 422, "%s: %ld", spec, st);
                ty_assert_error(o, "invalid_value", "logs.max_size");
                cJSON_Delete(o);
                ck_assert_int_eq(ty_http(srv.url, b_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
                ck_assert_msg(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")) == before, "%s stored a job", spec);
            } else {
                ck_assert_msg(st == 201, "%s: %ld", spec, st); /* the cap it keeps: log_cap_per_job */
            }
            cJSON_Delete(o);
        }
    }
}
END_TEST

/* ---------------------------------------------------------------- the team quota */

#define B_QUOTA 1048576

START_TEST(team_quota_bounds_checkpoints_logs_and_contexts) {
    char b_tok[128];
    team_make("b", b_tok, sizeof b_tok);
    cJSON *o = NULL;
    ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":1048576}", &o), 200);
    cJSON_Delete(o);

    /* team b's checkpoint (2 MiB) passes its quota; team a's (default), at
     * the same time, does not */
    int64_t bj = submit_sh(b_tok, "b-ckpt",
                           "head -c 2097152 /dev/zero > $TRAINYARD_CHECKPOINT_DIR/model.bin; echo b wrote it", NULL);
    int64_t aj = submit_sh(team_tok, "a-ckpt",
                           "head -c 300000 /dev/zero > $TRAINYARD_CHECKPOINT_DIR/model.bin; echo a wrote it", NULL);
    cJSON *jb = wait_end(b_tok, bj, 90), *ja = wait_end(team_tok, aj, 90);
    ck_assert_str_eq(ty_str(ja, "state"), "succeeded");
    ck_assert_msg(strcmp(ty_str(jb, "state"), "succeeded") == 0, "team b's job %s: %s", ty_str(jb, "state"),
                  ty_str(jb, "reason"));
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    size_t len = 0;
    char *l = wait_log_has(bj, "checkpoint upload refused", &len, 10000);
    ck_assert_msg(strstr(l, "507") && strstr(l, "storage_quota") && strstr(l, "team b"),
                  "the refusal names the quota: %s", l);
    free(l);
    ck_assert_int_eq(checkpoints_of(b_tok, bj, NULL), 0);
    double asize = 0;
    ck_assert_int_eq(checkpoints_of(team_tok, aj, &asize), 1);
    ck_assert_double_gt(asize, 300000);

    /* a chatty job of b: its log stops at the quota with one note, and it
     * ends as its program says */
    int64_t cj = submit_sh(b_tok, "b-chatty",
                           "i=0; while [ $i -lt 30000 ]; do echo \\\"line $i of a chatty program, padded to be long "
                           "enough\\\"; i=$((i+1)); done; exit 3",
                           NULL);
    cJSON *jc = wait_end(b_tok, cj, 120);
    ck_assert_str_eq(ty_str(jc, "state"), "failed");
    ck_assert_ptr_nonnull(strstr(ty_str(jc, "reason"), "3"));
    cJSON_Delete(jc);
    l = wait_log_has(cj, "is at its storage quota", &len, 10000);
    ck_assert_int_eq(count_of(l, "[trainyard server: team b is at its storage quota"), 1);
    ck_assert_ptr_nonnull(strstr(l, "of 1.0 MiB"));
    ck_assert_ptr_null(strstr(l, "line 29999 of"));
    free(l);

    /* GET /teams: the use matches what is on the disk */
    size_t l1 = 0, l2 = 0;
    free(log_file(bj, "worker-0", &l1));
    free(log_file(cj, "worker-0", &l2));
    cJSON *t = team_of("b");
    ck_assert_double_eq(ty_num(t, "storage_quota"), B_QUOTA);
    ck_assert_double_eq(used_of(t, "logs"), (double)(l1 + l2));
    ck_assert_double_eq(used_of(t, "checkpoints"), 0);
    ck_assert_double_eq(used_of(t, "contexts"), 0);
    ck_assert_double_eq(used_of(t, "total"), (double)(l1 + l2));
    ck_assert_double_le(used_of(t, "total"), B_QUOTA + 1024); /* the quota, and the note */
    ck_assert_double_ge(used_of(t, "total"), B_QUOTA);
    cJSON_Delete(t);
    t = team_of("default");
    ck_assert_double_eq(used_of(t, "checkpoints"), asize);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(t, "storage_quota")));
    cJSON_Delete(t);

    /* a context past the team's quota: 413 quota_exceeded naming it; the
     * other team's goes in */
    ck_assert_int_eq(context_upload(b_tok, &o), 413);
    ty_assert_error(o, "quota_exceeded", "body");
    ck_assert_ptr_nonnull(strstr(ty_str(cJSON_GetObjectItem(o, "error"), "message"), "team b"));
    cJSON_Delete(o);
    ck_assert_int_eq(context_upload(team_tok, &o), 201);
    cJSON_Delete(o);

    /* a restart keeps the quota and the use */
    ty_kill(&srv, SIGTERM);
    start_with(NULL);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    t = team_of("b");
    ck_assert_double_eq(ty_num(t, "storage_quota"), B_QUOTA);
    ck_assert_double_eq(used_of(t, "total"), (double)(l1 + l2));
    cJSON_Delete(t);
    /* and b's next job is still held at it: only the note is kept */
    int64_t dj = submit_sh(b_tok, "b-after", "echo after the restart; exit 0", NULL);
    jc = wait_end(b_tok, dj, 90);
    ck_assert_str_eq(ty_str(jc, "state"), "succeeded");
    cJSON_Delete(jc);
    l = wait_log_has(dj, "is at its storage quota", &len, 10000);
    ck_assert_ptr_null(strstr(l, "after the restart"));
    ck_assert_int_eq(count_of(l, "[trainyard server:"), 1);
    free(l);
    /* raising the quota lets b write again */
    ck_assert_int_eq(patch_team(admin_tok, "b", "{\"storage_quota\":\"1GiB\"}", &o), 200);
    cJSON_Delete(o);
    int64_t ej = submit_sh(b_tok, "b-raised", "echo room again", NULL);
    jc = wait_end(b_tok, ej, 90);
    cJSON_Delete(jc);
    free(wait_log_has(ej, "room again", &len, 10000));
}
END_TEST

/* ---------------------------------------------------------------- the per-job cap */

START_TEST(log_cap_per_job) {
    cJSON *o = NULL;
    /* a job asking for 16 MiB, printing about 20 */
    int64_t id = submit_sh(team_tok, "capped", "head -c 20000000 /dev/zero | tr '\\\\0' x | fold -w 100",
                           ",\"logs\":{\"max_size\":\"16MiB\"}");
    cJSON *j = wait_end(team_tok, id, 120);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    size_t len = 0;
    char *l = wait_log_has(id, "reached its cap of 16.0 MiB", &len, 20000);
    ck_assert_int_eq(count_of(l, "[trainyard server:"), 1);
    ck_assert_ptr_nonnull(strstr(l, "logs"));
    ck_assert_uint_ge(len, 16u << 20);
    ck_assert_uint_le(len, (16u << 20) + 1024);
    free(l);
    /* the same cap written as a number of bytes: the same cut */
    id = submit_sh(team_tok, "capped-bytes", "head -c 20000000 /dev/zero | tr '\\\\0' x | fold -w 100",
                   ",\"logs\":{\"max_size\":16777216}");
    j = wait_end(team_tok, id, 120);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    l = wait_log_has(id, "reached its cap of 16.0 MiB", &len, 20000);
    ck_assert_int_eq(count_of(l, "[trainyard server:"), 1);
    ck_assert_uint_ge(len, 16u << 20);
    ck_assert_uint_le(len, (16u << 20) + 1024);
    free(l);
    /* --log-max-per-job (1 GiB here) bounds what a spec may ask */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs",
                             "{\"command\":{\"argv\":[\"true\"]},\"logs\":{\"max_size\":\"2GiB\"}}", &o),
                     422);
    ty_assert_error(o, "invalid_value", "logs.max_size");
    cJSON_Delete(o);

    /* a program printing 150 MB as fast as it can: its log keeps output up
     * to the cap (48 MiB, --log-max-per-job-default) with the cap's note, or
     * the agent's note says the program outran it; never that the server
     * was away */
    int64_t t0 = mono_ms();
    id = submit_sh(team_tok, "flood", "head -c 150000000 /dev/zero | tr '\\\\0' x | fold -w 100", NULL);
    j = wait_end(team_tok, id, 240);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    ty_sleep_ms(1500);
    l = log_file(id, "worker-0", &len);
    fprintf(stderr, "check_quota: 150 MB of output: %zu bytes kept in %lld ms\n", len, (long long)(mono_ms() - t0));
    ck_assert_msg(strstr(l, "reached its cap of 48.0 MiB") || strstr(l, "faster than the agent ships"),
                  "neither the cap's note nor the agent's rate note: %.300s", len > 300 ? l + len - 300 : l);
    ck_assert_msg(!strstr(l, "the server has not taken"), "a drop blamed on the server");
    ck_assert_uint_le(len, (48u << 20) + 2048);
    free(l);
    /* the default team's use counts both logs */
    cJSON *t = team_of("default");
    ck_assert_double_ge(used_of(t, "logs"), (double)(16u << 20) + (double)len);
    cJSON_Delete(t);
}
END_TEST

/* ---------------------------------------------------------------- the disk reserve */

START_TEST(disk_reserve_refuses_bulk_writes) {
    cJSON *o = NULL;
    /* the reserve (1000 TiB) is more than any disk here has free */
    ck_assert_int_eq(context_upload(team_tok, &o), 507);
    ty_assert_error(o, "disk_reserve", NULL);
    const char *msg = ty_str(cJSON_GetObjectItem(o, "error"), "message");
    ck_assert_msg(strstr(msg, "free") && strstr(msg, "1000.0 TiB"), "%s", msg);
    cJSON_Delete(o);
    int64_t id = submit_sh(team_tok, "reserve",
                           "head -c 100000 /dev/zero > $TRAINYARD_CHECKPOINT_DIR/model.bin; echo wrote it", NULL);
    cJSON *j = wait_end(team_tok, id, 90);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    ck_assert_int_eq(checkpoints_of(team_tok, id, NULL), 0);
    size_t len = 0;
    char *l = wait_log_has(id, "under its reserve", &len, 10000);
    ck_assert_int_eq(count_of(l, "[trainyard server:"), 1);
    ck_assert_ptr_null(strstr(l, "wrote it"));
    free(l);
    /* said once at warn on the console */
    char *log = file_read_all(srv.log, 1 << 24, &len);
    ck_assert_ptr_nonnull(log);
    ck_assert_int_eq(count_of(log, "under the disk reserve"), 1);
    free(log);
}
END_TEST

int main(void) {
    Suite *s = suite_create("quota");
    TCase *p = ty_tcase(s, "patch", setup_plain, teardown, 60);
    tcase_add_test(p, patch_validates_and_is_admin_only);
    tcase_add_test(p, size_fields_alike_as_text_and_bytes);
    TCase *q = ty_tcase(s, "team", setup_plain, teardown, 300);
    tcase_add_test(q, team_quota_bounds_checkpoints_logs_and_contexts);
    TCase *c = ty_tcase(s, "cap", setup_cap, teardown, 400);
    tcase_add_test(c, log_cap_per_job);
    TCase *r = ty_tcase(s, "reserve", setup_reserve, teardown, 120);
    tcase_add_test(r, disk_reserve_refuses_bulk_writes);
    return ty_run_suite(s);
}
