/* jobs_api.c - health and the job endpoints: submit, list, get (with the
 * running job's progress and tasks), cancel and delete (the job's timeline
 * is events_api.c). Validation is spec/jobspec.c; rows are storage/store.c.
 * A team token sees only its team's jobs (another team's job is a 404, not a
 * 403, so ids do not leak); the admin token sees all. */
#include "jobs_api.h"
#include "exec_common.h"
#include "admission.h"
#include "scheduling.h"
#include "scope.h"
#include "../common/version.h"
#include "../spec/jobspec.h"
#include "contexts_api.h"
#include "answer_cache.h"
#include "retention_api.h"
#include "blobs_api.h"
#include "../server/server.h"
#include "../storage/store.h"
#include "../storage/users.h"
#include "../storage/cluster.h"
#include "../storage/retention.h"
#include "../storage/exec_store.h"
#include "../storage/ports_store.h"
#include "../storage/sweep_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t g_started_ms;

/* The team a request is scoped to: 0 for admin (all teams). */
static int64_t scope_team(const http_req *req) {
    return req->who.kind == TOKEN_ADMIN ? 0 : req->who.team_id;
}

/* GET /api/v1/health: 200 on a leader and on a standby (its role says
 * which; ?role=leader makes a standby's 503, for load balancers), 503 when
 * the database does not answer. */
static void health(server *srv, http_req *req, http_res *res) {
    if (!g_started_ms) g_started_ms = now_ms();
    int v = db_version(srv->db);
    if (v < 0) {
        http_error(res, 503, "unavailable", NULL, "the database does not answer");
        return;
    }
    const char *want = http_query(req, "role");
    if (want && strcmp(want, "leader") != 0) {
        http_error(res, 400, "invalid_value", "role", "role must be leader (or left out)");
        return;
    }
    int leads = db_role(srv->db) == DB_LEADER;
    char leader[512];
    int64_t left = 0;
    db_leader(srv->db, leader, sizeof leader, &left);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "version", TRAINYARD_VERSION);
    cJSON_AddNumberToObject(o, "schema_version", v);
    cJSON_AddStringToObject(o, "store", db_engine(srv->db));
    cJSON_AddStringToObject(o, "role", leads ? "leader" : "standby");
    if (strcmp(db_engine(srv->db), "sqlite") == 0) cJSON_AddStringToObject(o, "leader", srv->public_url);
    else if (leader[0]) cJSON_AddStringToObject(o, "leader", leader);
    else cJSON_AddNullToObject(o, "leader");
    cJSON_AddNumberToObject(o, "epoch", (double)db_epoch(srv->db));
    if (leads && left > 0) cJSON_AddNumberToObject(o, "lease_ms_left", (double)left);
    if (want && !leads) { /* ?role=leader: a load balancer's readiness check */
        cJSON_Delete(o);
        http_error(res, 503, "standby", NULL, "this server is a standby; the leader is %s",
                   leader[0] ? leader : "none yet");
        return;
    }
    http_json(res, 200, o);
}

/* A submission waiting for its group commit. */
typedef struct submit_wait {
    server *srv;
    http_req *req;
    char context[72];                 /* command.context, "" = none */
    const char *context_field;        /* where the spec names it (command.context, interactive.context) */
} submit_wait;

/* On the db's committer thread, once the batch holding the job committed
 * (rc STORE_OK) or failed: the answer, and the request resumed. */
static void submit_done(void *arg, int rc, int64_t id, cJSON *job) {
    submit_wait *w = arg;
    http_res *a = http_res_new();
    if (rc == STORE_EXPIRED && job) { /* a retry of a submission made before: its job, nothing new */
        snprintf(a->location, sizeof a->location, "/api/v1/jobs/%lld", (long long)id);
        snprintf(a->xhdr_name, sizeof a->xhdr_name, "Idempotent-Replayed");
        snprintf(a->xhdr_value, sizeof a->xhdr_value, "true");
        http_json(a, 200, job);
    } else if (rc == STORE_CONFLICT) {
        cJSON_Delete(job);
        http_error(a, 422, "idempotency_key_reused", "Idempotency-Key",
                   "this Idempotency-Key was used within a day for another spec (job %lld): make a new key for a new"
                   " submission", (long long)id);
    } else if (rc == STORE_OK && job) {
        if (w->req->audit) { /* written with the job (store_job_submit) */
            w->req->audit_id = -1;
            w->req->audit_status = 201;
        }
        snprintf(a->location, sizeof a->location, "/api/v1/jobs/%lld", (long long)id);
        http_json(a, 201, job);
        api_kick_scheduler(w->srv);
    } else if (rc == STORE_NOT_FOUND) { /* its context went since the check (deleted, collected) */
        cJSON_Delete(job);
        api_context_not_held(a, w->context_field, w->context);
    } else {
        cJSON_Delete(job);
        http_db_unavailable(a);
    }
    http_resume(w->req, a);
    free(w);
}

/* POST /api/v1/jobs */
static void job_submit(server *srv, http_req *req, http_res *res) {
    if (http_require_json(req, res) < 0) return;
    /* Idempotency-Key: a client's retry of a submission whose answer it
     * lost (a failover) gets the first job back, not a second one */
    const char *idem = NULL;
    if (api_idempotency_key(req, res, &idem) < 0) return;
    if (req->body.len == 0) {
        http_error(res, 400, "bad_json", NULL, "the request body is empty; a job spec (JSON) was expected");
        return;
    }
    jobspec spec;
    spec_error e;
    if (jobspec_parse(req->body.data, req->body.len, &spec, &e) < 0) {
        http_error(res, e.status, e.code, e.field[0] ? e.field : NULL, "%s", e.message);
        return;
    }
    char msg[512];
    const char *code = NULL, *field = NULL;
    int adm = api_job_admit(srv, &spec, &code, &field, msg, sizeof msg);
    if (adm < 0) {
        jobspec_release(&spec);
        http_db_unavailable(res);
        return;
    }
    if (adm > 0) {
        jobspec_release(&spec);
        http_error(res, 422, code, field, "%s", msg);
        return;
    }
    /* a context the team holds, marked used with the insert (store_job_submit) */
    const char *ctx_field = spec.kind == JOB_KIND_INTERACTIVE ? "interactive.context" : "command.context";
    if (spec.command.context[0] && api_context_check_held(srv, req->who.team_id, ctx_field, spec.command.context, res) < 0) {
        jobspec_release(&spec);
        return;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    store_new_job row;
    api_job_row(&spec, &row);
    row.user_id = req->who.user_id;
    row.idem_key = idem;
    /* The job joins the next group commit (storage/db.h): the connection is
     * suspended until the batch holding it has committed, and only then is
     * the 201 sent, so a 201 means the job is in the database. */
    submit_wait *w = xmalloc(sizeof *w);
    w->srv = srv;
    w->req = req;
    snprintf(w->context, sizeof w->context, "%s", spec.command.context);
    w->context_field = ctx_field;
    if (http_defer(req, res) < 0) {
        free(w);
        jobspec_release(&spec);
        http_error(res, 503, "unavailable", NULL, "the server is stopping; retry");
        return;
    }
    int rc = store_job_submit(srv->db, req->who.team_id, req->body.data, req->body.len, &row, actor, req->audit,
                              submit_done, w);
    jobspec_release(&spec);
    if (rc != STORE_OK) { /* not queued: answer now */
        free(w);
        http_res *a = http_res_new();
        http_db_unavailable(a);
        http_resume(req, a);
    }
}

static int valid_state(const char *s) {
    static const char *states[] = {"queued", "starting", "running", "succeeded", "failed", "cancelled"};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        if (strcmp(s, states[i]) == 0) return 1;
    return 0;
}

/* GET /api/v1/jobs?state=&limit=&before= */
static void job_list(server *srv, http_req *req, http_res *res) {
    const char *state = http_query(req, "state");
    if (state && !valid_state(state)) {
        http_error(res, 400, "invalid_value", "state",
                   "state must be one of queued, starting, running, succeeded, failed, cancelled; got '%s'",
                   state);
        return;
    }
    long limit, before;
    if (http_query_long(req, res, "limit", 1, 1000, 50, &limit) < 0) return;
    if (http_query_long(req, res, "before", 1, (long)INT64_MAX, 0, &before) < 0) return;
    const char *user = http_query(req, "user");
    if (user && !users_name_ok(user)) {
        http_error(res, 400, "invalid_value", "user", "user must be a user's name (1-63 of a-z, A-Z, 0-9, '.', '_', '-')");
        return;
    }
    char key[ANSWER_KEY_MAX];
    snprintf(key, sizeof key, "jobs %lld %s %ld %ld %s", (long long)scope_team(req), state ? state : "-", limit, before,
             user ? user : "-");
    answer_ref ref;
    if (answer_cache_get(srv->db, key, res, &ref)) return;
    /* written as text from the rows: a page of 50 as a cJSON tree was
     * mostly allocations (docs/server.md, "Answers") */
    buf b;
    buf_init(&b, 64u << 20);
    int64_t next = 0;
    int rc = buf_appends(&b, "{\"jobs\":") == 0 &&
                     store_jobs_list(srv->db, scope_team(req), state, user, before, (int)limit, &b, &next) == STORE_OK
                 ? 0
                 : -1;
    if (rc == 0) rc = next ? buf_printf(&b, ",\"next_before\":%lld}\n", (long long)next)
                           : buf_appends(&b, ",\"next_before\":null}\n");
    if (rc < 0) {
        buf_release(&b);
        http_db_unavailable(res);
        return;
    }
    http_text(res, 200, "application/json", b.data, b.len);
    buf_release(&b);
    answer_cache_put(&ref, res);
}

/* The names a job's spec declares in "ports" (a notebook's own included). */
typedef struct declared_ports {
    int n;
    char names[JOBSPEC_MAX_PORTS][JOBSPEC_PORT_NAME_MAX];
} declared_ports;

/* The job's model as Keras' model.summary() shows it (spec/jobspec.h,
 * jobspec_model_summary), from its stored spec: "model_summary", null for a
 * command job (or a stored spec this server's parser no longer reads); and
 * the names of the ports it declares into *ports. Only the single job's
 * answer carries it: a parse of the spec per job would be most of a list
 * page's cost, and the answer is kept (answer_cache.c). */
static void add_model_summary(cJSON *job, declared_ports *ports) {
    cJSON *summary = NULL;
    ports->n = 0;
    const cJSON *stored = cJSON_GetObjectItemCaseSensitive(job, "spec");
    char *text = cJSON_IsObject(stored) ? cJSON_PrintUnformatted(stored) : NULL;
    if (text) {
        jobspec *spec = xmalloc(sizeof *spec);
        if (jobspec_parse(text, strlen(text), spec, NULL) == 0) {
            summary = jobspec_model_summary(spec);
            for (int i = 0; i < spec->n_ports; i++)
                snprintf(ports->names[ports->n++], sizeof ports->names[0], "%s", spec->ports[i].name);
            jobspec_release(spec);
        }
        free(spec);
        free(text);
    }
    if (summary) cJSON_AddItemToObject(job, "model_summary", summary);
    else cJSON_AddNullToObject(job, "model_summary");
}

/* "ports": each port the job declares, as its live tasks serve it
 * ({"name", "task", "task_name", "node", "address", "port", "url"}, one per
 * task that reported it), or {"name", "url"} while none does (before it
 * runs). 0, or -1 when the read failed (the answer is not kept). */
static int add_ports(server *srv, int64_t job_id, cJSON *job, const declared_ports *declared) {
    cJSON *rows = NULL, *out = cJSON_CreateArray();
    int rc = ports_store_list(srv->db, job_id, &rows);
    for (int i = 0; i <= declared->n; i++) {
        /* i == n: what tasks reported that the spec does not name */
        const char *name = i < declared->n ? declared->names[i] : NULL;
        int seen = 0;
        for (cJSON *r = rows ? rows->child : NULL, *next; r; r = next) {
            next = r->next;
            const char *rn = cJSON_GetObjectItemCaseSensitive(r, "name")->valuestring;
            if (name && strcmp(rn, name) != 0) continue;
            char url[128];
            snprintf(url, sizeof url, "/proxy/jobs/%lld/%s/", (long long)job_id, rn);
            cJSON *e = cJSON_DetachItemViaPointer(rows, r);
            cJSON_AddStringToObject(e, "url", url);
            cJSON_AddItemToArray(out, e);
            seen = 1;
        }
        if (name && !seen) {
            char url[128];
            snprintf(url, sizeof url, "/proxy/jobs/%lld/%s/", (long long)job_id, name);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddStringToObject(e, "url", url);
            cJSON_AddItemToArray(out, e);
        }
    }
    cJSON_Delete(rows);
    cJSON_DeleteItemFromObject(job, "ports");
    cJSON_AddItemToObject(job, "ports", out);
    return rc == STORE_OK ? 0 : -1;
}

/* Adds "progress" (epoch, step, latest metrics, ETA; null before the first
 * metric) and "tasks" (the current attempt's tasks: type, index, node,
 * port, state, exit code) to a job's JSON form. 0, or -1 when a read
 * failed and a part is missing (null progress or no tasks): such an answer
 * is not kept. */
static int job_decorate(server *srv, int64_t job_id, cJSON *job) {
    char *p = NULL;
    int ok = 1;
    cJSON_DeleteItemFromObject(job, "progress");
    if (exec_store_progress_get(srv->db, job_id, &p) == STORE_ERROR) ok = 0;
    if (p) store_json_stored(job, "progress", p);
    else cJSON_AddNullToObject(job, "progress");
    free(p);
    const cJSON *a = cJSON_GetObjectItem(job, "attempt");
    cJSON *tasks = NULL;
    if (!cJSON_IsNumber(a) || exec_store_job_tasks(srv->db, job_id, (int)a->valuedouble, &tasks) != STORE_OK) {
        tasks = cJSON_CreateArray();
        ok = 0;
    }
    cJSON_DeleteItemFromObject(job, "tasks");
    cJSON_AddItemToObject(job, "tasks", tasks);
    return ok ? 0 : -1;
}

/* GET /api/v1/jobs/{id} */
static void job_get(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    int64_t scope = scope_team(req);
    char key[ANSWER_KEY_MAX];
    snprintf(key, sizeof key, "job %lld %lld", (long long)id, (long long)scope);
    answer_ref ref;
    if (answer_cache_get(srv->db, key, res, &ref)) return;
    cJSON *job = NULL;
    int rc = store_job_get(srv->db, id, scope, 1, &job);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    declared_ports declared;
    add_model_summary(job, &declared);
    int whole = job_decorate(srv, id, job) == 0;
    if (add_ports(srv, id, job, &declared) < 0) whole = 0;
    http_json(res, 200, job);
    if (whole) answer_cache_put(&ref, res);
}

/* POST /api/v1/jobs/{id}/cancel  (optional body {"reason": "..."}) */
static void job_cancel(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char reason[256] = "cancelled by the user";
    if (req->body.len) {
        cJSON *body = http_body_json(req, res);
        if (!body) return;
        for (cJSON *f = body->child; f; f = f->next) {
            if (strcmp(f->string, "reason") != 0) {
                http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: reason)", f->string);
                cJSON_Delete(body);
                return;
            }
            if (!cJSON_IsString(f) || strlen(f->valuestring) > 200) {
                http_error(res, 422, "invalid_type", "reason", "reason must be a string of at most 200 characters");
                cJSON_Delete(body);
                return;
            }
            snprintf(reason, sizeof reason, "%s", f->valuestring);
        }
        cJSON_Delete(body);
    }
    char state[16];
    int64_t team = 0;
    int rc = store_job_state(srv->db, id, state, &team);
    if (rc == STORE_OK && scope_team(req) && team != scope_team(req)) rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    if (api_own_or_admin(srv->db, req, res, 0, id) < 0) return;
    char actor[96];
    http_actor(req, actor, sizeof actor);
    if (db_begin(srv->db) < 0) {
        http_db_unavailable(res);
        return;
    }
    rc = store_job_transition(srv->db, id, NULL, "cancelled", actor, reason);
    if (rc == STORE_OK && api_job_stop_tasks(srv, id, "cancelled") < 0) rc = STORE_ERROR;
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc == STORE_CONFLICT) {
            store_job_state(srv->db, id, state, NULL);
            http_error(res, 409, "conflict", NULL, "job %lld is already %s", (long long)id, state);
        } else {
            http_db_unavailable(res);
        }
        return;
    }
    api_kick_scheduler(srv);
    cJSON *job = NULL;
    if (store_job_get(srv->db, id, 0, 0, &job) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    http_json(res, 200, job);
}

/* DELETE /api/v1/jobs/{id}: a finished job's logs, checkpoints and metrics
 * go; its row and tasks stay (usage is computed from them) and the API
 * answers 404 for it from then on. The rows are marked in one commit, the
 * files removed after it (the housekeeping sweep finishes a removal a crash
 * cut short). Runs on the offload thread: it waits for the disk. */
static void job_delete_run(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char actor[96], state[16];
    http_actor(req, actor, sizeof actor);
    /* a running sweep's trial is the sweep's: a paused ASHA trial's job may
     * yet be promoted (its checkpoint is what it resumes from). A sweep only
     * ever leaves running, so this check cannot go stale the wrong way. */
    int64_t sweep = 0;
    int trial = 0;
    int in = sweep_store_job_in_running_sweep(srv->db, id, &sweep, &trial);
    if (in < 0) {
        http_db_unavailable(res);
        return;
    }
    if (in > 0) {
        exec_job j;
        int mine = exec_store_job_get(srv->db, id, 0, &j) == STORE_OK &&
                   (req->who.kind == TOKEN_ADMIN || j.team_id == req->who.team_id);
        if (mine) exec_store_job_release(&j);
        if (!mine) {
            http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
            return;
        }
        http_error(res, 409, "conflict", NULL,
                   "job %lld is trial %d of sweep %lld, which is still running: cancel the sweep first "
                   "(POST /api/v1/sweeps/%lld/cancel)",
                   (long long)id, trial, (long long)sweep, (long long)sweep);
        return;
    }
    if (api_own_or_admin(srv->db, req, res, 0, id) < 0) return;
    int live = 0;
    int64_t in_db = 0; /* its logs' bytes in the database (PostgreSQL), gone with the mark */
    if (exec_store_log_db_bytes(srv->db, id, &in_db) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    int rc = retention_job_delete_mark(srv->db, id, scope_team(req), now_ms(), actor, state, &live);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return;
    }
    if (rc == STORE_CONFLICT && store_is_terminal(state)) { /* ended, but a task is still stopping */
        http_error(res, 409, "conflict", NULL,
                   "job %lld is %s but %d of its tasks %s not exited yet (a stopping task may still upload its "
                   "last checkpoint); retry once they have",
                   (long long)id, state, live, live == 1 ? "has" : "have");
        return;
    }
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", NULL,
                   "job %lld is %s: only a finished job (succeeded, failed, cancelled) can be deleted; cancel it "
                   "first (POST /api/v1/jobs/%lld/cancel)",
                   (long long)id, state, (long long)id);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    int64_t freed = 0;
    api_retention_delete_files(srv, id, &freed);
    freed += in_db;
    api_blob_job_deleted(srv, id, &freed); /* its objects in the blob store, its open uploads */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddBoolToObject(o, "deleted", 1);
    cJSON_AddNumberToObject(o, "freed_bytes", (double)freed);
    http_json(res, 200, o);
}

static void job_delete(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, job_delete_run);
}

const route api_jobs_routes[] = {
    {"GET", "/api/v1/health", health, ALLOW_NONE | ALLOW_STANDBY, 0, ROLE_NONE},
    {"POST", "/api/v1/jobs", job_submit, ALLOW_TEAM, 0, ROLE_NONE},
    {"GET", "/api/v1/jobs", job_list, ALLOW_USER, 0, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}", job_get, ALLOW_USER, 0, ROLE_NONE},
    {"DELETE", "/api/v1/jobs/{id}", job_delete, ALLOW_USER, 0, ROLE_NONE},
    {"POST", "/api/v1/jobs/{id}/cancel", job_cancel, ALLOW_USER, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
