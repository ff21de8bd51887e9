/* state_fixture.h - what check_backup and check_migrate share: a cluster's
 * state read through the API before it is moved (a backup restored, a
 * SQLite store migrated to PostgreSQL) and compared after, but for the
 * fields that move on their own; jobs of the checkpointing script and the
 * bytes of their checkpoints. The suite says where its server is in a
 * ty_state it fills once (its globals).
 *
 *   ty_job_state(s, id, out, cap)        the job's state, from GET /jobs/{id}
 *   ty_wait_job_state(s, id, want, t)    waits t seconds for it
 *   ty_ckpt_count(s, id)                 the job's checkpoints listed
 *   ty_submit_script(s, name, vals, wait) a job of the script: losses vals,
 *                                        waiting for the file wait ("-": none)
 *   ty_ckpt_sha(s, job, cid, out)        the sha256 of a checkpoint's bytes as
 *                                        served (and as its header says)
 *   ty_team_with_member(s, team_tok, n)  team "vision" (its token into
 *                                        team_tok) and user "ada" in it
 *   ty_record(r, n, s, tok, path)        an answer kept (at most TY_NREC)
 *   ty_record_jobs(r, n, s, ids, k)      the answers every such test keeps:
 *                                        the job lists, users, teams, members,
 *                                        and each job's row, events, metrics and
 *                                        checkpoints
 *   ty_record_ckpts(s, ids, k, out, max) each checkpoint of the jobs, with the
 *                                        sha256 of its bytes
 *   ty_json_diff(a, b, at, after, out, cap)  "" when equal but for the
 *                                        volatile fields, else where they differ
 *   ty_compare_all(r, n, s, when)        every kept answer asked again and
 *                                        compared (ck_assert)
 *
 * Failures abort the test (ck_assert). */
#ifndef TRAINYARD_TESTS_STATE_FIXTURE_H
#define TRAINYARD_TESTS_STATE_FIXTURE_H

#include "testlib.h"

typedef struct ty_state {
    const ty_proc *srv;       /* the suite's server: its url and log */
    const char *admin_tok;
    const char *team_tok;     /* team "vision"'s (ty_team_with_member) */
    const char *script;       /* the checkpointing script */
    const char *scratch;      /* a directory for downloads */
    const char *agent_dir;    /* named in a failure: its agent.log */
} ty_state;

static inline const char *ty_job_state(const ty_state *s, int64_t id, char *out, size_t cap) {
    cJSON *o = ty_job_get(s->srv->url, s->team_tok, id);
    snprintf(out, cap, "%s", ty_str(o, "state"));
    cJSON_Delete(o);
    return out;
}

static inline void ty_wait_job_state(const ty_state *s, int64_t id, const char *want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    char st[32];
    while (strcmp(ty_job_state(s, id, st, sizeof st), want) != 0) {
        ck_assert_msg(mono_ms() < end, "job %lld is %s, not %s (see %s, %s/agent.log)", (long long)id, st, want,
                      s->srv->log, s->agent_dir);
        ty_sleep_ms(200);
    }
}

static inline int ty_ckpt_count(const ty_state *s, int64_t id) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(s->srv->url, s->team_tok, "GET", path, NULL, &o), 200);
    cJSON *arr = cJSON_IsArray(o) ? o : cJSON_GetObjectItem(o, "checkpoints");
    int n = cJSON_GetArraySize(arr);
    cJSON_Delete(o);
    return n;
}

static inline int64_t ty_submit_script(const ty_state *s, const char *name, const char *vals, const char *wait) {
    char spec[1600];
    snprintf(spec, sizeof spec,
             "{\"name\":\"%s\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\",\"%s\",\"%s\"]},\"max_restarts\":0}",
             name, s->script, vals, wait);
    return ty_submit(s->srv->url, s->team_tok, spec);
}

static inline void ty_ckpt_sha(const ty_state *s, int64_t job, int64_t cid, char out[65]) {
    char path[160], file[400], hdr[65], err[256];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job, (long long)cid);
    snprintf(file, sizeof file, "%s/dl.bin", s->scratch);
    client c;
    ck_assert_int_eq(client_init(&c, s->srv->url, s->team_tok), 0);
    long status = 0;
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 4096);
    int rc = client_download(&c, path, file, &status, hdr, out, NULL, 0, &size, &eb, err, sizeof err);
    client_release(&c);
    buf_release(&eb);
    ck_assert_msg(rc == 0 && status == 200, "GET %s: %ld %s (%s)", path, status, err, s->srv->log);
    ck_assert_str_eq(hdr, out);
    unlink(file);
}

static inline void ty_team_with_member(const ty_state *s, char *team_tok, size_t n) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(s->srv->url, s->admin_tok, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 201);
    snprintf(team_tok, n, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(s->srv->url, s->admin_tok, "POST", "/api/v1/users",
                             "{\"name\":\"ada\",\"email\":\"ada@example.com\"}", &o),
                     201);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(s->srv->url, s->admin_tok, "PUT", "/api/v1/teams/vision/members/ada",
                             "{\"role\":\"member\"}", &o),
                     201);
    cJSON_Delete(o);
}

/* ---------------------------------------------------------------- answers kept and compared */

/* Fields that move on their own between two reads (times of life, the
 * queue's reasons and estimates, a running job's progress, a context's
 * last use). */
static const char *const TY_VOLATILE[] = {"last_heartbeat_at", "heartbeat_at", "last_seen_at", "queue_reason",
                                          "reason", "reasons", "eta", "eta_s", "eta_at", "estimated_start",
                                          "progress", "now", "age_s", "wait_s", "waited_s", "updated_at",
                                          "elapsed_s", "runtime_s", "uptime_s", "position", "used_at", NULL};

static inline int ty_volatile_key(const char *k) {
    for (int i = 0; TY_VOLATILE[i]; i++)
        if (strcmp(k, TY_VOLATILE[i]) == 0) return 1;
    return 0;
}

/* "" in out when a and b are equal but for the volatile fields, else where
 * they differ ("after": "after the restore", "after the move"). */
static inline void ty_json_diff(const cJSON *a, const cJSON *b, const char *at, const char *after, char *out,
                                size_t cap) {
    if (out[0]) return;
    if ((a->type & 0xff) != (b->type & 0xff)) {
        snprintf(out, cap, "%s: type differs", at);
        return;
    }
    char sub[512];
    if (cJSON_IsObject(a)) {
        for (const cJSON *x = a->child; x; x = x->next) {
            if (ty_volatile_key(x->string)) continue;
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
            snprintf(sub, sizeof sub, "%s.%s", at, x->string);
            if (!y) {
                snprintf(out, cap, "%s: missing %s", sub, after);
                return;
            }
            ty_json_diff(x, y, sub, after, out, cap);
        }
        for (const cJSON *y = b->child; y; y = y->next)
            if (!ty_volatile_key(y->string) && !cJSON_GetObjectItemCaseSensitive(a, y->string)) {
                snprintf(out, cap, "%s.%s: new %s", at, y->string, after);
                return;
            }
        return;
    }
    if (cJSON_IsArray(a)) {
        int n = cJSON_GetArraySize(a);
        if (n != cJSON_GetArraySize(b)) {
            snprintf(out, cap, "%s: %d items, then %d", at, n, cJSON_GetArraySize(b));
            return;
        }
        for (int i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s[%d]", at, i);
            ty_json_diff(cJSON_GetArrayItem(a, i), cJSON_GetArrayItem(b, i), sub, after, out, cap);
        }
        return;
    }
    if (!cJSON_Compare(a, b, 1)) {
        char *ta = cJSON_PrintUnformatted(a), *tb = cJSON_PrintUnformatted(b);
        snprintf(out, cap, "%s: %.120s, then %.120s", at, ta ? ta : "?", tb ? tb : "?");
        free(ta);
        free(tb);
    }
}

#define TY_NREC 64
typedef struct ty_recorded {
    char path[160];
    const char *tok;
    cJSON *body;
} ty_recorded;

static inline void ty_record(ty_recorded *r, int *n, const ty_state *s, const char *tok, const char *path) {
    ck_assert_int_lt(*n, TY_NREC);
    ty_recorded *x = &r[(*n)++];
    snprintf(x->path, sizeof x->path, "%s", path);
    x->tok = tok;
    ck_assert_msg(ty_http(s->srv->url, tok, "GET", path, NULL, &x->body) == 200, "GET %s", path);
}

static inline void ty_record_jobs(ty_recorded *r, int *n, const ty_state *s, const int64_t *ids, int k) {
    ty_record(r, n, s, s->admin_tok, "/api/v1/jobs?limit=100");
    ty_record(r, n, s, s->team_tok, "/api/v1/jobs?limit=100");
    ty_record(r, n, s, s->admin_tok, "/api/v1/users");
    ty_record(r, n, s, s->admin_tok, "/api/v1/teams");
    ty_record(r, n, s, s->team_tok, "/api/v1/teams/vision/members");
    static const char *const fmt[] = {"/api/v1/jobs/%lld", "/api/v1/jobs/%lld/events", "/api/v1/jobs/%lld/metrics",
                                      "/api/v1/jobs/%lld/checkpoints"};
    char path[160];
    for (int i = 0; i < k; i++)
        for (int f = 0; f < 4; f++) {
            snprintf(path, sizeof path, fmt[f], (long long)ids[i]);
            ty_record(r, n, s, s->team_tok, path);
        }
}

typedef struct ty_ckpt {
    int64_t job, id;
    char sha[65];
} ty_ckpt;

/* Each checkpoint the jobs list, its bytes' sha256 checked against the
 * row's: how many (at most max). */
static inline int ty_record_ckpts(const ty_state *s, const int64_t *ids, int k, ty_ckpt *out, int max) {
    int n = 0;
    char path[160];
    for (int i = 0; i < k; i++) {
        cJSON *o = NULL;
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)ids[i]);
        ck_assert_int_eq(ty_http(s->srv->url, s->team_tok, "GET", path, NULL, &o), 200);
        cJSON *arr = cJSON_IsArray(o) ? o : cJSON_GetObjectItem(o, "checkpoints");
        cJSON *c;
        cJSON_ArrayForEach(c, arr) {
            ck_assert_int_lt(n, max);
            out[n].job = ids[i];
            out[n].id = (int64_t)ty_num(c, "id");
            ty_ckpt_sha(s, ids[i], out[n].id, out[n].sha);
            ck_assert_str_eq(out[n].sha, ty_str(c, "sha256"));
            n++;
        }
        cJSON_Delete(o);
    }
    return n;
}

/* Every kept answer asked again: equal but for the volatile fields. */
static inline void ty_compare_all(const ty_recorded *rec, int nrec, const ty_state *s, const char *when) {
    for (int i = 0; i < nrec; i++) {
        cJSON *now = NULL;
        ck_assert_msg(ty_http(s->srv->url, rec[i].tok, "GET", rec[i].path, NULL, &now) == 200, "GET %s %s",
                      rec[i].path, when);
        char diff[600] = "";
        ty_json_diff(rec[i].body, now, rec[i].path, when, diff, sizeof diff);
        ck_assert_msg(diff[0] == '\0', "%s: %s", when, diff);
        cJSON_Delete(now);
    }
}

#endif
