/* sweeps_api.c - hyperparameter sweeps: POST/GET /api/v1/sweeps, GET
 * /api/v1/sweeps/{id}, POST /api/v1/sweeps/{id}/cancel, POST
 * /api/v1/jobs/{id}/rung, and the controller that turns a sweep's trials
 * into jobs, on its own thread (sweeps_api.h).
 *
 * The search itself (its parameters, the trials' values, ASHA's rungs and
 * promotions) is scheduler/sweep.c; the rows are storage/sweep_store.c.
 * Here: a sweep is refused whole, before anything is stored, when any of
 * its trials' specs would be; a trial is submitted as a job of the sweep's
 * team through POST /jobs's admission and insert (so fair share, priority
 * and quotas treat it as any job), with its row in the same transaction;
 * a trial whose job ends is scored from the job's metrics rows. ASHA
 * promotes a trial at its rung's end, when its worker asks (POST
 * /jobs/{id}/rung): it trains on in its process; or later, when a slot
 * frees, by requeuing the same job with the next rung's epochs, so its
 * worker resumes from the job's newest checkpoint.
 *
 * Scope: a team token sees its own sweeps (another team's is the same 404
 * as an unknown one); the admin token sees all. */
#include "sweeps_api.h"
#include "scope.h"
#include "../storage/users.h"
#include "exec_common.h"
#include "admission.h"
#include "contexts_api.h"
#include "scheduling.h"
#include "../scheduler/sweep.h"
#include "../server/server.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"
#include "../storage/sweep_store.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ACTOR "sweeps"                 /* who the controller's decisions name on job timelines */
#define SWEEP_NAME_MAX 100             /* leaves room for "-t999" within a job name's 127 */
#define TICK_SWEEPS 16                 /* sweeps one controller pass looks at */
#define CONTROLLER_EVERY_S 1           /* a pass at least this often, kicked or not */

static int64_t scope_team(const http_req *req) { return req->who.kind == TOKEN_ADMIN ? 0 : req->who.team_id; }

/* ---------------------------------------------------------------- a loaded sweep */

/* A sweep's stored request, parsed: the job spec as submitted and the
 * search. */
typedef struct sweep_ctx {
    cJSON *spec;                       /* {"name", "job", "search"} */
    const cJSON *job;                  /* in spec */
    sweep_search search;
    int n_rungs;
    int rungs[SWEEP_MAX_RUNGS];        /* ASHA: each rung's epochs */
} sweep_ctx;

static void ctx_release(sweep_ctx *c) {
    cJSON_Delete(c->spec);
    sweep_search_release(&c->search);
    memset(c, 0, sizeof *c);
}

/* 0, or -1 when the stored text does not parse (it was written by this
 * service, so only a damaged database gets there). */
static int ctx_load(const char *text, sweep_ctx *c) {
    memset(c, 0, sizeof *c);
    c->spec = text ? cJSON_Parse(text) : NULL;
    if (!c->spec) return -1;
    c->job = cJSON_GetObjectItemCaseSensitive(c->spec, "job");
    const cJSON *search = cJSON_GetObjectItemCaseSensitive(c->spec, "search");
    spec_error e;
    if (!cJSON_IsObject(c->job) || sweep_search_parse(search, &c->search, &e) < 0) {
        cJSON_Delete(c->spec);
        memset(c, 0, sizeof *c);
        return -1;
    }
    int n = asha_rung_epochs(&c->search, c->rungs, SWEEP_MAX_RUNGS);
    c->n_rungs = n > SWEEP_MAX_RUNGS ? SWEEP_MAX_RUNGS : n;
    return 0;
}

/* The spec trial `trial` runs: the job spec with its params written in
 * (sweep_apply), named "<sweep>-t<N>", and for ASHA trained to `epochs`
 * (0: the spec's own). 0 with *out (the caller frees) and *parsed (the
 * caller releases); -1 with *e and param (the parameter at fault, "" when
 * none). */
static int trial_spec(const sweep_ctx *c, const char *sweep_name, int trial, const cJSON *params, int epochs,
                      char **out, jobspec *parsed, spec_error *e, char *param, size_t paramlen) {
    *out = NULL;
    param[0] = '\0';
    char *applied = NULL;
    if (sweep_apply(c->job, params, &applied, param, paramlen, e) < 0) return -1;
    cJSON *o = cJSON_Parse(applied);
    free(applied);
    if (!o) {
        snprintf(e->message, sizeof e->message, "out of memory");
        e->status = 500;
        return -1;
    }
    char name[JOBSPEC_NAME_MAX];
    snprintf(name, sizeof name, "%.*s-t%d", SWEEP_NAME_MAX, sweep_name, trial);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "name");
    cJSON_AddStringToObject(o, "name", name);
    if (epochs > 0) {
        cJSON *fit = cJSON_GetObjectItemCaseSensitive(o, "fit");
        if (!cJSON_IsObject(fit)) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, "fit");
            fit = cJSON_AddObjectToObject(o, "fit");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(fit, "epochs");
        cJSON_AddNumberToObject(fit, "epochs", epochs);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) {
        snprintf(e->message, sizeof e->message, "out of memory");
        e->status = 500;
        return -1;
    }
    if (jobspec_parse(text, strlen(text), parsed, e) < 0) {
        free(text);
        return -1;
    }
    *out = text;
    return 0;
}

/* ---------------------------------------------------------------- JSON forms */

static void add_time(cJSON *o, const char *k, int64_t ms) { store_json_time_ms(o, k, ms); }

static int better(const sweep_ctx *c, double a, double b) {
    return c->search.mode_max ? a > b : a < b;
}

/* The sweep as GET /sweeps/{id} answers it. Running trials' metric and
 * epochs are read from their jobs' metrics now; ended ones are as stored
 * when they ended, cancelled ones as their jobs' metrics say. NULL on a
 * database error. */
static cJSON *sweep_json(server *srv, const sweep_info *s, int with_trials) {
    sweep_ctx c;
    int loaded = ctx_load(s->spec, &c) == 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)s->id);
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddStringToObject(o, "team", s->team);
    if (s->user[0]) cJSON_AddStringToObject(o, "user", s->user);
    else cJSON_AddNullToObject(o, "user");
    cJSON_AddStringToObject(o, "state", s->state);
    if (s->reason) cJSON_AddStringToObject(o, "reason", s->reason);
    else cJSON_AddNullToObject(o, "reason");
    add_time(o, "created_at", s->created_at);
    add_time(o, "updated_at", s->updated_at);
    add_time(o, "finished_at", s->finished_at);
    cJSON *search = loaded ? sweep_search_to_json(&c.search) : NULL;
    if (search) cJSON_AddItemToObject(o, "search", search);
    else cJSON_AddNullToObject(o, "search");
    cJSON_AddNumberToObject(o, "n_trials", s->trials);
    if (!with_trials) {
        if (loaded) ctx_release(&c);
        return o;
    }
    if (loaded) {
        const cJSON *job = c.job;
        cJSON_AddItemToObject(o, "job", cJSON_Duplicate(job, 1));
    }
    sweep_trial_row *t = NULL;
    int n = 0;
    if (sweep_store_trials(srv->db, s->id, &t, &n) != STORE_OK) {
        cJSON_Delete(o);
        if (loaded) ctx_release(&c);
        return NULL;
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "trials");
    int best = -1;
    double best_v = 0;
    int err = 0;
    for (int i = 0; i < n; i++) {
        sweep_trial_row *r = &t[i];
        /* running: so far; cancelled: what it trained before its job stopped */
        if (loaded && r->job_id && (strcmp(r->state, "running") == 0 || strcmp(r->state, "cancelled") == 0)) {
            sweep_metric m;
            if (sweep_store_job_metric(srv->db, r->job_id, c.search.metric, c.search.mode_max, &m) != STORE_OK) {
                err = 1;
                break;
            }
            r->epochs = m.epochs;
            if (m.has_best) {
                r->has_metric = 1;
                r->metric = m.best;
            }
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "trial", r->trial);
        cJSON *p = r->params ? cJSON_Parse(r->params) : NULL;
        cJSON_AddItemToObject(x, "params", p ? p : cJSON_CreateObject());
        if (r->job_id) cJSON_AddNumberToObject(x, "job_id", (double)r->job_id);
        else cJSON_AddNullToObject(x, "job_id");
        cJSON_AddStringToObject(x, "state", r->state);
        if (r->reason) cJSON_AddStringToObject(x, "reason", r->reason);
        else cJSON_AddNullToObject(x, "reason");
        if (r->has_metric && isfinite(r->metric)) cJSON_AddNumberToObject(x, "metric", r->metric);
        else cJSON_AddNullToObject(x, "metric");
        cJSON_AddNumberToObject(x, "epochs", r->epochs);
        cJSON_AddNumberToObject(x, "rung", r->rung);
        cJSON_AddItemToArray(arr, x);
        if (loaded && r->has_metric && isfinite(r->metric) && (best < 0 || better(&c, r->metric, best_v))) {
            best = i;
            best_v = r->metric;
        }
    }
    if (!err && best >= 0) {
        cJSON *b = cJSON_AddObjectToObject(o, "best");
        cJSON_AddNumberToObject(b, "trial", t[best].trial);
        cJSON_AddNumberToObject(b, "job_id", (double)t[best].job_id);
        cJSON_AddNumberToObject(b, "metric", best_v);
        cJSON *p = t[best].params ? cJSON_Parse(t[best].params) : NULL;
        cJSON_AddItemToObject(b, "params", p ? p : cJSON_CreateObject());
        int64_t ck = 0;
        if (sweep_store_newest_checkpoint(srv->db, t[best].job_id, &ck) != STORE_OK) err = 1;
        if (ck) cJSON_AddNumberToObject(b, "checkpoint", (double)ck);
        else cJSON_AddNullToObject(b, "checkpoint");
    } else {
        cJSON_AddNullToObject(o, "best");
    }
    sweep_trials_release(t, n);
    if (loaded) ctx_release(&c);
    if (err) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void sweep_step_now(server *srv, int64_t id);

/* ---------------------------------------------------------------- POST /sweeps */

static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > SWEEP_NAME_MAX) return 0;
    for (; *s; s++) {
        char ch = *s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* A value for a message: its JSON, at most about 60 characters. */
static void value_text(const cJSON *v, char *out, size_t cap) {
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    snprintf(out, cap, "%.60s%s", t ? t : "null", t && strlen(t) > 60 ? "..." : "");
    free(t);
}

/* POST /sweeps, by phase: the body's fields and the sweep's name, the
 * search, the job as it is, the number of trials, every trial's spec
 * checked and admitted, the sweep stored, the answer and its first step.
 * One sweep_new holds what the phases share; a phase returns 0, or -1
 * after answering. */
typedef struct sweep_new {
    const cJSON *job, *search;   /* in the body */
    const char *name;
    sweep_ctx c;                 /* its search parsed; spec not owned here */
    spec_error e;
    int n;                       /* trials */
    char **params;               /* (n) each trial's parameters as JSON, owned */
    char *stored;                /* the request as stored, owned */
    const char *idem_key;        /* the request's Idempotency-Key (in req), NULL = none */
    int replay;                  /* the key's first sweep answered, nothing made */
    int64_t id;
} sweep_new;

/* {"name", "job", "search"}: no other field, job and search present, the
 * name (else the job's, else "sweep") usable in its trials' names. */
static int create_fields(http_res *res, const cJSON *body, sweep_new *w) {
    if (!cJSON_IsObject(body)) {
        http_error(res, 422, "invalid_type", NULL, "the body must be an object {\"name\", \"job\", \"search\"}");
        return -1;
    }
    for (const cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "name") && strcmp(f->string, "job") && strcmp(f->string, "search")) {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: name, job, search)",
                       f->string);
            return -1;
        }
    }
    const cJSON *jname = cJSON_GetObjectItemCaseSensitive(body, "name");
    w->job = cJSON_GetObjectItemCaseSensitive(body, "job");
    w->search = cJSON_GetObjectItemCaseSensitive(body, "search");
    if (!w->job) {
        http_error(res, 422, "missing_field", "job", "a sweep needs \"job\": the job spec its trials run");
        return -1;
    }
    if (!cJSON_IsObject(w->job)) {
        http_error(res, 422, "invalid_type", "job", "job must be an object: a job spec (docs/jobspec.md)");
        return -1;
    }
    if (!w->search) {
        http_error(res, 422, "missing_field", "search", "a sweep needs \"search\": the parameters to vary and how");
        return -1;
    }
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(w->job, "name");
    w->name = cJSON_IsString(jname) ? jname->valuestring : cJSON_IsString(jn) ? jn->valuestring : "sweep";
    if (jname && !cJSON_IsString(jname)) {
        http_error(res, 422, "invalid_type", "name", "name must be a string");
        return -1;
    }
    if (!name_ok(w->name)) {
        http_error(res, 422, "invalid_value", "name",
                   "must be 1 to %d characters of A-Z a-z 0-9 . _ - (its trials are named NAME-tN)",
                   SWEEP_NAME_MAX);
        return -1;
    }
    return 0;
}

static int create_search(http_res *res, sweep_new *w) {
    spec_error *e = &w->e;
    if (sweep_search_parse(w->search, &w->c.search, e) < 0) {
        http_error(res, e->status ? e->status : 422, e->code[0] ? e->code : "invalid_value",
                   e->field[0] ? e->field : "search", "%s", e->message);
        return -1;
    }
    return 0;
}

/* The job as it is, before any trial's values: its own errors name job.*;
 * a command job cannot be trained in ASHA's rungs. */
static int create_job(http_res *res, sweep_new *w) {
    spec_error *e = &w->e;
    char *jt = cJSON_PrintUnformatted(w->job);
    jobspec js;
    int ok = jt && jobspec_parse(jt, strlen(jt), &js, e) == 0;
    free(jt);
    if (!ok) {
        char f[JOBSPEC_FIELD_MAX + 8];
        snprintf(f, sizeof f, "job%s%s", e->field[0] ? "." : "", e->field);
        http_error(res, e->status ? e->status : 422, e->code[0] ? e->code : "invalid_value", f, "%s", e->message);
        return -1;
    }
    int command = js.kind == JOB_KIND_COMMAND;
    jobspec_release(&js);
    if (command && w->c.search.method == SWEEP_ASHA) {
        http_error(res, 422, "unsupported", "search.method",
                   "asha trains each trial in rungs of fit.epochs, so it needs a built-in training job; a "
                   "command job supports grid and random (its trials read their values from command.env.*)");
        return -1;
    }
    return 0;
}

/* ASHA's rungs, and the number of trials: 1 to SWEEP_MAX_TRIALS. */
static int create_size(http_res *res, sweep_new *w) {
    w->c.job = w->job;
    int r = asha_rung_epochs(&w->c.search, w->c.rungs, SWEEP_MAX_RUNGS);
    w->c.n_rungs = r > SWEEP_MAX_RUNGS ? SWEEP_MAX_RUNGS : r;
    w->n = sweep_n_trials(&w->c.search);
    if (w->n < 1 || w->n > SWEEP_MAX_TRIALS) {
        http_error(res, 422, "invalid_value", "search.max_trials", "a sweep runs 1 to %d trials, this one %d",
                   SWEEP_MAX_TRIALS, w->n);
        return -1;
    }
    return 0;
}

/* Trial i's spec made, checked and admitted (the first's context held by
 * the team), its parameters kept as text in w->params[i]. */
static int create_trial(server *srv, http_req *req, http_res *res, sweep_new *w, int i) {
    cJSON *p = sweep_trial_params(&w->c.search, i);
    if (!p) {
        http_error(res, 500, "internal", NULL, "cannot make trial %d's parameters", i);
        return -1;
    }
    char param[SWEEP_PATH_MAX + 8], *text = NULL;
    jobspec js;
    spec_error e;
    memset(&e, 0, sizeof e);
    /* ASHA's longest rung is what its trials may reach */
    int epochs = w->c.n_rungs > 0 ? w->c.rungs[w->c.n_rungs - 1] : 0;
    if (trial_spec(&w->c, w->name, i, p, epochs, &text, &js, &e, param, sizeof param) < 0) {
        if (e.status >= 500) {
            http_error(res, 500, "internal", NULL, "%s", e.message);
        } else {
            char f[JOBSPEC_FIELD_MAX + 32], v[80];
            const cJSON *pv = param[0] ? cJSON_GetObjectItemCaseSensitive(p, param) : NULL;
            value_text(pv, v, sizeof v);
            if (param[0]) snprintf(f, sizeof f, "search.parameters.%s", param);
            else snprintf(f, sizeof f, "search.parameters");
            http_error(res, 422, e.code[0] ? e.code : "invalid_value", f,
                       "trial %d: %s = %s makes an invalid job spec: %s%s%s%s", i, param[0] ? param : "the values",
                       v, e.message, e.field[0] ? " (" : "", e.field, e.field[0] ? ")" : "");
        }
        cJSON_Delete(p);
        return -1;
    }
    free(text);
    const char *code = NULL, *field = NULL;
    char msg[512];
    int adm = api_job_admit(srv, &js, &code, &field, msg, sizeof msg);
    if (adm == 0 && i == 0 && js.command.context[0] &&
        api_context_check_held(srv, req->who.team_id,
                               js.kind == JOB_KIND_INTERACTIVE ? "interactive.context" : "command.context",
                               js.command.context, res) < 0) {
        jobspec_release(&js);
        cJSON_Delete(p);
        return -1;
    }
    jobspec_release(&js);
    if (adm < 0) {
        cJSON_Delete(p);
        http_db_unavailable(res);
        return -1;
    }
    if (adm > 0) {
        char f[JOBSPEC_FIELD_MAX + 8];
        snprintf(f, sizeof f, "job%s%s", field ? "." : "", field ? field : "");
        http_error(res, 422, code, f, "trial %d: %s", i, msg);
        cJSON_Delete(p);
        return -1;
    }
    w->params[i] = cJSON_PrintUnformatted(p);
    cJSON_Delete(p);
    if (!w->params[i]) {
        http_error(res, 500, "internal", NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* Every trial's spec, checked now: a sweep is refused whole rather than
 * failing trials one by one later. */
static int create_trials(server *srv, http_req *req, http_res *res, sweep_new *w) {
    w->params = xcalloc((size_t)w->n, sizeof *w->params);
    for (int i = 0; i < w->n; i++)
        if (create_trial(srv, req, res, w, i) < 0) return -1;
    return 0;
}

/* The sweep stored: its request {"name", "job", "search"} (the search in
 * its normal form) and its trials' parameters. */
static int create_store(server *srv, http_req *req, http_res *res, sweep_new *w) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "name", w->name);
    cJSON_AddItemToObject(s, "job", cJSON_Duplicate(w->job, 1));
    cJSON *ns = sweep_search_to_json(&w->c.search);
    if (ns) cJSON_AddItemToObject(s, "search", ns);
    w->stored = ns ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    if (!w->stored) {
        http_error(res, 500, "internal", NULL, "out of memory");
        return -1;
    }
    /* the key with the sweep in one transaction (storage/sweep_store.h);
     * "the same request" is the same body, byte for byte, as POST /jobs's
     * same spec */
    char sha[65] = "";
    if (w->idem_key) sha256_hex(req->body.data ? req->body.data : "", req->body.len, sha);
    int rc = sweep_store_create(srv->db, req->who.team_id, req->who.user_id, w->name, w->stored, w->n, w->params,
                                w->idem_key, w->idem_key ? sha : NULL, &w->id);
    if (rc == STORE_CONFLICT) {
        http_error(res, 422, "idempotency_key_reused", "Idempotency-Key",
                   "this Idempotency-Key was used within a day for another request (sweep %lld): make a new key for"
                   " a new sweep", (long long)w->id);
        return -1;
    }
    if (rc != STORE_OK && rc != STORE_EXPIRED) {
        http_db_unavailable(res);
        return -1;
    }
    w->replay = rc == STORE_EXPIRED;
    return 0;
}

/* 201 with the sweep as stored; then its first step. A replay (the same
 * Idempotency-Key and request): 200 with the first sweep as it is now,
 * marked Idempotent-Replayed, and no step (it has had its own). */
static int create_answer(server *srv, http_res *res, const sweep_new *w) {
    sweep_info si;
    cJSON *o = NULL;
    if (sweep_store_get(srv->db, w->id, 0, &si) == STORE_OK) {
        o = sweep_json(srv, &si, 1);
        sweep_info_release(&si);
    }
    if (!o) {
        http_db_unavailable(res);
        return -1;
    }
    snprintf(res->location, sizeof res->location, "/api/v1/sweeps/%lld", (long long)w->id);
    if (w->replay) {
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Idempotent-Replayed");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "true");
        http_json(res, 200, o);
        return 0;
    }
    http_json(res, 201, o);
    sweep_step_now(srv, w->id); /* its first trials go in now rather than at the next pass */
    return 0;
}

/* On the offload thread: checking every trial's spec, the insert and the
 * sweep's first step (its first trials submitted, which may wait for the
 * controller's pass over other sweeps) never hold a pool thread. */
static void sweep_create_run(server *srv, http_req *req, http_res *res) {
    /* Idempotency-Key: a client's retry of a sweep whose answer it lost (a
     * failover) gets the first sweep back, not a second one */
    const char *idem = NULL;
    if (api_idempotency_key(req, res, &idem) < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    sweep_new w;
    memset(&w, 0, sizeof w);
    w.idem_key = idem;
    if (create_fields(res, body, &w) == 0 && create_search(res, &w) == 0 && create_job(res, &w) == 0 &&
        create_size(res, &w) == 0 && create_trials(srv, req, res, &w) == 0 && create_store(srv, req, res, &w) == 0)
        create_answer(srv, res, &w);
    if (w.params)
        for (int i = 0; i < w.n; i++) free(w.params[i]);
    free(w.params);
    free(w.stored);
    sweep_search_release(&w.c.search);
    cJSON_Delete(body);
}

static void sweep_create(server *srv, http_req *req, http_res *res) {
    (void)srv;
    if (http_require_json(req, res) < 0) return;
    http_offload(req, res, sweep_create_run);
}

/* ---------------------------------------------------------------- GET, cancel */

static void sweep_list(server *srv, http_req *req, http_res *res) {
    long limit, before;
    if (http_query_long(req, res, "limit", 1, 200, 50, &limit) < 0) return;
    if (http_query_long(req, res, "before", 1, (long)INT64_MAX, 0, &before) < 0) return;
    const char *user = http_query(req, "user");
    if (user && !users_name_ok(user)) {
        http_error(res, 400, "invalid_value", "user", "user must be a user's name (1-63 of a-z, A-Z, 0-9, '.', '_', '-')");
        return;
    }
    sweep_info *rows = NULL;
    int n = 0;
    int64_t next = 0;
    if (sweep_store_list(srv->db, scope_team(req), user, before, (int)limit, &rows, &n, &next) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "sweeps");
    for (int i = 0; i < n; i++) {
        cJSON_AddItemToArray(arr, sweep_json(srv, &rows[i], 0));
        sweep_info_release(&rows[i]);
    }
    free(rows);
    if (next) cJSON_AddNumberToObject(o, "next_before", (double)next);
    else cJSON_AddNullToObject(o, "next_before");
    http_json(res, 200, o);
}

/* The {id} sweep within the caller's scope: STORE_OK, or -1 after answering. */
static int sweep_of_path(server *srv, http_req *req, http_res *res, sweep_info *s) {
    int64_t id = http_param_id(req, res, 0, "sweep");
    if (id < 0) return -1;
    int rc = sweep_store_get(srv->db, id, scope_team(req), s);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no sweep %lld", (long long)id);
        return -1;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return -1;
    }
    return 0;
}

static void sweep_get(server *srv, http_req *req, http_res *res) {
    sweep_info s;
    if (sweep_of_path(srv, req, res, &s) < 0) return;
    cJSON *o = sweep_json(srv, &s, 1);
    sweep_info_release(&s);
    if (!o) {
        http_db_unavailable(res);
        return;
    }
    http_json(res, 200, o);
}

#define CANCEL_JOBS_MAX SWEEP_MAX_CONCURRENT

static void sweep_cancel(server *srv, http_req *req, http_res *res) {
    sweep_info s;
    if (sweep_of_path(srv, req, res, &s) < 0) return;
    if (api_own_or_admin(srv->db, req, res, 1, s.id) < 0) {
        sweep_info_release(&s);
        return;
    }
    char actor[96], why[160];
    http_actor(req, actor, sizeof actor);
    snprintf(why, sizeof why, "sweep %lld cancelled by %s", (long long)s.id, actor);
    int64_t jobs[CANCEL_JOBS_MAX];
    int n = 0;
    if (db_begin(srv->db) < 0) {
        sweep_info_release(&s);
        http_db_unavailable(res);
        return;
    }
    int rc = sweep_store_cancel(srv->db, s.id, why, jobs, CANCEL_JOBS_MAX, &n);
    for (int i = 0; rc == STORE_OK && i < n; i++) {
        int t = store_job_transition(srv->db, jobs[i], NULL, "cancelled", actor, why);
        if (t == STORE_CONFLICT) continue; /* it ended meanwhile: its result stays */
        if (t != STORE_OK || api_job_stop_tasks(srv, jobs[i], "cancelled") < 0) rc = STORE_ERROR;
    }
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc == STORE_CONFLICT)
            http_error(res, 409, "conflict", NULL, "sweep %lld is already %s", (long long)s.id, s.state);
        else
            http_db_unavailable(res);
        sweep_info_release(&s);
        return;
    }
    api_kick_scheduler(srv);
    int64_t id = s.id;
    sweep_info_release(&s);
    cJSON *o = NULL;
    if (sweep_store_get(srv->db, id, 0, &s) == STORE_OK) {
        o = sweep_json(srv, &s, 1);
        sweep_info_release(&s);
    }
    if (!o) {
        http_db_unavailable(res);
        return;
    }
    http_json(res, 200, o);
}

/* ---------------------------------------------------------------- the controller */

/* A trial whose job ended: scored and recorded (one transaction). ASHA: a
 * trial that trained its rung (short of the last) is paused there with
 * its score at the rung's last epoch, for asha_next to rank. */
static void trial_ended(server *srv, int64_t sweep_id, const sweep_ctx *c, sweep_trial_row *t) {
    sweep_metric m;
    if (sweep_store_job_metric(srv->db, t->job_id, c->search.metric, c->search.mode_max, &m) != STORE_OK) return;
    if (c->search.method == SWEEP_ASHA && strcmp(t->job_state, "succeeded") == 0 && t->rung < c->n_rungs &&
        m.epochs < c->rungs[t->rung]) {
        /* it was sent on to this rung at its rung's end, but its worker
         * never heard (the answer was lost) and ended: it trains the rest */
        char why[300];
        snprintf(why, sizeof why,
                 "trained %d epoch%s of rung %d's %d: its worker ended before it heard that it goes on; it resumes "
                 "from its checkpoint",
                 m.epochs, m.epochs == 1 ? "" : "s", t->rung, c->rungs[t->rung]);
        if (sweep_store_trial_requeue(srv->db, sweep_id, t->trial, t->job_id, ACTOR, why) == STORE_OK) {
            log_warn("sweep %lld: trial %d %s", (long long)sweep_id, t->trial, why);
            snprintf(t->job_state, sizeof t->job_state, "queued");
            api_kick_scheduler(srv);
        }
        return;
    }
    const char *state = "failed";
    char why[600];
    int rung = -1;
    double rung_metric = 0;
    if (strcmp(t->job_state, "succeeded") == 0) {
        state = "succeeded";
        snprintf(why, sizeof why, "its job succeeded after %d epoch%s", m.epochs, m.epochs == 1 ? "" : "s");
        if (c->search.method == SWEEP_ASHA) {
            if (!m.has_last) {
                state = "failed";
                snprintf(why, sizeof why, "its job reported no %s at epoch %d, so it cannot be ranked",
                         c->search.metric, m.epochs);
            } else {
                rung = t->rung;
                rung_metric = m.last;
                if (t->rung + 1 < c->n_rungs) {
                    state = "paused";
                    snprintf(why, sizeof why, "rung %d done (%d epoch%s): %s %.6g", t->rung, m.epochs,
                             m.epochs == 1 ? "" : "s", c->search.metric, m.last);
                } else {
                    snprintf(why, sizeof why, "last rung %d done (%d epoch%s): %s %.6g", t->rung, m.epochs,
                             m.epochs == 1 ? "" : "s", c->search.metric, m.last);
                }
            }
        }
    } else if (strcmp(t->job_state, "cancelled") == 0) {
        state = "cancelled";
        snprintf(why, sizeof why, "its job was cancelled: %.500s", t->job_reason ? t->job_reason : "");
    } else {
        snprintf(why, sizeof why, "its job failed: %.500s", t->job_reason ? t->job_reason : "");
    }
    int rc = sweep_store_trial_end(srv->db, sweep_id, t->trial, state, m.epochs, m.has_best, m.best, why, rung,
                                   rung_metric, ACTOR);
    if (rc == STORE_OK) {
        snprintf(t->state, sizeof t->state, "%s", state);
        t->epochs = m.epochs;
        if (m.has_best) {
            t->has_metric = 1;
            t->metric = m.best;
        }
    }
}

/* Submits trial `trial` at `rung` as a job of the sweep's team. A spec the
 * server refuses now (no node could ever hold it any more, its context was
 * collected) fails that trial only, with the reason. 0 started, 1 failed,
 * -1 database error. */
static int trial_start(server *srv, const sweep_info *s, const sweep_ctx *c, sweep_trial_row *t, int rung) {
    cJSON *params = t->params ? cJSON_Parse(t->params) : NULL;
    if (!params) return -1;
    char *text = NULL, param[SWEEP_PATH_MAX + 8], why[700] = "";
    jobspec js;
    spec_error e;
    memset(&e, 0, sizeof e);
    int epochs = c->n_rungs > 0 ? c->rungs[rung] : 0;
    int have = trial_spec(c, s->name, t->trial, params, epochs, &text, &js, &e, param, sizeof param) == 0;
    cJSON_Delete(params);
    int64_t job_id = 0;
    int rc = STORE_OK;
    if (!have) {
        snprintf(why, sizeof why, "its spec is refused: %s%s%s%s", e.message, e.field[0] ? " (" : "", e.field,
                 e.field[0] ? ")" : "");
    } else {
        const char *code = NULL, *field = NULL;
        char msg[512];
        int adm = api_job_admit(srv, &js, &code, &field, msg, sizeof msg);
        if (adm > 0) snprintf(why, sizeof why, "not submitted: %s", msg);
        if (adm == 0) {
            store_new_job row;
            api_job_row(&js, &row);
            row.sweep_id = s->id;
            row.trial = t->trial;
            rc = sweep_store_trial_start(srv->db, s->id, t->trial, rung, s->team_id, text, &row, ACTOR, &job_id);
            if (rc == STORE_NOT_FOUND)
                snprintf(why, sizeof why, "not submitted: the team no longer holds its context %s",
                         js.command.context);
        }
        jobspec_release(&js);
        free(text);
        if (adm < 0) return -1;
        if (rc == STORE_CONFLICT) return 1;       /* no longer pending (cancelled meanwhile) */
        if (rc != STORE_OK && rc != STORE_NOT_FOUND) return -1;
    }
    if (why[0]) {
        /* refused now: that trial fails, with why; it takes no slot */
        log_warn("sweep %lld: trial %d %s", (long long)s->id, t->trial, why);
        if (sweep_store_trial_fail_pending(srv->db, s->id, t->trial, why) != STORE_OK) return -1;
        snprintf(t->state, sizeof t->state, "failed");
        return 1;
    }
    t->job_id = job_id;
    t->rung = rung;
    snprintf(t->state, sizeof t->state, "running");
    snprintf(t->job_state, sizeof t->job_state, "queued");
    api_kick_scheduler(srv);
    return 0;
}

static int count_state(const sweep_trial_row *t, int n, const char *state) {
    int k = 0;
    for (int i = 0; i < n; i++) k += strcmp(t[i].state, state) == 0;
    return k;
}

/* One sweep's step: its ended jobs scored, then trials started or promoted
 * while slots are free, or the sweep ended when nothing is left. */
static void sweep_step(server *srv, int64_t id) {
    sweep_info s;
    if (sweep_store_get(srv->db, id, 0, &s) != STORE_OK) return;
    sweep_ctx c;
    if (ctx_load(s.spec, &c) < 0) {
        log_error("sweep %lld: its stored request does not parse; it is failed", (long long)id);
        sweep_store_finish(srv->db, id, "failed", "its stored request does not parse");
        sweep_info_release(&s);
        return;
    }
    sweep_trial_row *t = NULL;
    int n = 0;
    if (sweep_store_trials(srv->db, id, &t, &n) != STORE_OK) goto out;
    /* a succeeded job has no task left; a failed or cancelled one is scored
     * at once, whatever its stopping tasks still send */
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].state, "running") == 0 && t[i].job_id && store_is_terminal(t[i].job_state))
            trial_ended(srv, id, &c, &t[i]);
    sweep_rung_row *rr = NULL;
    int nr = 0;
    if (sweep_store_rungs(srv->db, id, &rr, &nr) != STORE_OK) goto out;
    asha_rung_entry *ent = xcalloc((size_t)nr + 1, sizeof *ent);
    for (int i = 0; i < nr; i++)
        ent[i] = (asha_rung_entry){.trial = rr[i].trial, .rung = rr[i].rung, .metric = rr[i].metric,
                                   .promoted = rr[i].promoted};
    free(rr);
    for (int guard = 0; guard <= c.search.max_concurrent; guard++) {
        int started = n - count_state(t, n, "pending");
        int running = count_state(t, n, "running");
        int trial = -1, rung = 0;
        int d = asha_next(&c.search, ent, nr, started, running, &trial, &rung);
        if (d < 0 || d == ASHA_WAIT) break;
        if (d == ASHA_DONE) {
            int failed = count_state(t, n, "failed");
            int stopped = count_state(t, n, "paused");
            char why[200];
            if (failed == n)
                snprintf(why, sizeof why, "every trial failed (%d)", n);
            else
                snprintf(why, sizeof why, "%d trial%s ran: %d succeeded, %d stopped early, %d failed", n,
                         n == 1 ? "" : "s", count_state(t, n, "succeeded"), stopped, failed);
            sweep_store_finish(srv->db, id, failed == n ? "failed" : "succeeded", why);
            break;
        }
        if (trial < 0 || trial >= n) break;
        sweep_trial_row *x = &t[trial];
        if (d == ASHA_START) {
            if (strcmp(x->state, "pending") != 0 || trial_start(srv, &s, &c, x, 0) < 0) break;
            continue;
        }
        /* ASHA_PROMOTE: the same job, the next rung's epochs, a new attempt */
        int from = rung - 1;
        if (from < 0 || rung >= c.n_rungs || strcmp(x->state, "paused") != 0 || x->rung != from) break;
        cJSON *params = x->params ? cJSON_Parse(x->params) : NULL;
        char *text = NULL, param[SWEEP_PATH_MAX + 8];
        jobspec js;
        spec_error e;
        int ok = params && trial_spec(&c, s.name, trial, params, c.rungs[rung], &text, &js, &e, param,
                                      sizeof param) == 0;
        cJSON_Delete(params);
        if (!ok) break;
        jobspec_release(&js);
        char why[300];
        double at = 0;
        for (int i = 0; i < nr; i++)
            if (ent[i].trial == trial && ent[i].rung == from) at = ent[i].metric;
        snprintf(why, sizeof why,
                 "promoted to rung %d (%d epochs): its %s %.6g at rung %d (%d epoch%s) ranks in the top 1/%d; it "
                 "resumes from its checkpoint",
                 rung, c.rungs[rung], c.search.metric, at, from, c.rungs[from], c.rungs[from] == 1 ? "" : "s",
                 c.search.reduction_factor);
        int rc = sweep_store_trial_promote(srv->db, id, trial, from, x->job_id, text, ACTOR, why);
        free(text);
        if (rc != STORE_OK) break; /* its job is not back to rest yet, or was deleted: next time */
        for (int i = 0; i < nr; i++)
            if (ent[i].trial == trial && ent[i].rung == from) ent[i].promoted = 1;
        snprintf(x->state, sizeof x->state, "running");
        x->rung = rung;
        api_kick_scheduler(srv);
    }
    free(ent);
out:
    sweep_trials_release(t, n);
    ctx_release(&c);
    sweep_info_release(&s);
}

/* One controller at a time: the controller's thread, a new sweep's first
 * step on its request's thread, and a trial's question at a rung's end.
 * (Each step is safe against any other writer on its own: every write
 * checks the state it expects.) */
static pthread_mutex_t g_controller = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_cursor;               /* round robin over running sweeps: bounded work per call */

static void sweep_step_now(server *srv, int64_t id) {
    pthread_mutex_lock(&g_controller);
    sweep_step(srv, id);
    pthread_mutex_unlock(&g_controller);
}

/* The controller's pass: at most TICK_SWEEPS running sweeps, round robin. */
static void sweeps_pass(server *srv) {
    int64_t ids[TICK_SWEEPS];
    int n = 0;
    pthread_mutex_lock(&g_controller);
    int rc = sweep_store_running(srv->db, g_cursor, ids, TICK_SWEEPS, &n);
    if (rc == STORE_OK && n == 0 && g_cursor) {
        g_cursor = 0;
        rc = sweep_store_running(srv->db, 0, ids, TICK_SWEEPS, &n);
    }
    if (rc == STORE_OK) {
        for (int i = 0; i < n; i++) sweep_step(srv, ids[i]);
        g_cursor = n == TICK_SWEEPS ? ids[n - 1] : 0;
    }
    pthread_mutex_unlock(&g_controller);
}

/* The controller's thread: a pass when kicked (a job ended), else once a
 * second. Kicks that come during a pass make one more pass after it. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, quit, kicked;
    server *srv;
} g_ctl = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *controller_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_ctl.mu);
    while (!g_ctl.quit) {
        if (!g_ctl.kicked) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += CONTROLLER_EVERY_S;
            while (!g_ctl.kicked && !g_ctl.quit)
                if (pthread_cond_timedwait(&g_ctl.cv, &g_ctl.mu, &until) == ETIMEDOUT) break;
            if (g_ctl.quit) break;
        }
        g_ctl.kicked = 0;
        pthread_mutex_unlock(&g_ctl.mu);
        sweeps_pass(g_ctl.srv);
        pthread_mutex_lock(&g_ctl.mu);
    }
    pthread_mutex_unlock(&g_ctl.mu);
    return NULL;
}

int api_sweeps_start(server *srv) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) return -1;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&g_ctl.cv, &ca) == 0 ? 0 : -1;
    pthread_condattr_destroy(&ca);
    if (rc < 0) return -1;
    g_ctl.srv = srv;
    g_ctl.quit = 0;
    g_ctl.kicked = 1; /* a first pass at once: sweeps left running by the server before */
    if (pthread_create(&g_ctl.thread, NULL, controller_main, NULL) != 0) {
        pthread_cond_destroy(&g_ctl.cv);
        return -1;
    }
    g_ctl.started = 1;
    return 0;
}

void api_sweeps_stop(void) {
    if (!g_ctl.started) return;
    pthread_mutex_lock(&g_ctl.mu);
    g_ctl.quit = 1;
    pthread_cond_broadcast(&g_ctl.cv);
    pthread_mutex_unlock(&g_ctl.mu);
    pthread_join(g_ctl.thread, NULL);
    pthread_cond_destroy(&g_ctl.cv);
    g_ctl.started = 0;
}

void api_sweeps_kick(void) {
    pthread_mutex_lock(&g_ctl.mu);
    g_ctl.kicked = 1;
    if (g_ctl.started) pthread_cond_signal(&g_ctl.cv);
    pthread_mutex_unlock(&g_ctl.mu);
}

/* ---------------------------------------------------------------- a trial at a rung's end */

/* The running ASHA trial whose job is job_id, loaded: 1 (s, c, *t and
 * its sweep's rung rows set; the caller releases them), 0 when the job is
 * not a trial running in a running ASHA sweep, -1 on a database error. */
typedef struct trial_of_job {
    sweep_info s;
    sweep_ctx c;
    sweep_trial_row *rows;
    int n;
    sweep_trial_row *t;                /* in rows */
    asha_rung_entry *ent;              /* (nr) every rung row */
    int nr;
} trial_of_job;

static void trial_of_job_release(trial_of_job *x) {
    sweep_trials_release(x->rows, x->n);
    free(x->ent);
    ctx_release(&x->c);
    sweep_info_release(&x->s);
    memset(x, 0, sizeof *x);
}

static int trial_of_job_load(server *srv, int64_t job_id, trial_of_job *x) {
    memset(x, 0, sizeof *x);
    int64_t sweep_id = 0;
    int trial = 0;
    int in = sweep_store_job_in_running_sweep(srv->db, job_id, &sweep_id, &trial);
    if (in <= 0) return in;
    int rc = sweep_store_get(srv->db, sweep_id, 0, &x->s);
    if (rc != STORE_OK) return rc == STORE_NOT_FOUND ? 0 : -1;
    if (ctx_load(x->s.spec, &x->c) < 0 || x->c.search.method != SWEEP_ASHA) {
        sweep_info_release(&x->s);
        return 0;
    }
    sweep_rung_row *rr = NULL;
    if (sweep_store_trials(srv->db, sweep_id, &x->rows, &x->n) != STORE_OK ||
        sweep_store_rungs(srv->db, sweep_id, &rr, &x->nr) != STORE_OK) {
        trial_of_job_release(x);
        return -1;
    }
    x->ent = xcalloc((size_t)x->nr + 1, sizeof *x->ent);
    for (int i = 0; i < x->nr; i++)
        x->ent[i] = (asha_rung_entry){.trial = rr[i].trial, .rung = rr[i].rung, .metric = rr[i].metric,
                                      .promoted = rr[i].promoted};
    free(rr);
    for (int i = 0; i < x->n; i++)
        if (x->rows[i].trial == trial && x->rows[i].job_id == job_id && strcmp(x->rows[i].state, "running") == 0)
            x->t = &x->rows[i];
    if (!x->t || x->t->rung < 0 || x->t->rung >= x->c.n_rungs) {
        trial_of_job_release(x);
        return 0;
    }
    return 1;
}

int api_sweeps_trial_config(server *srv, int64_t job_id, cJSON *config) {
    trial_of_job x;
    int in = trial_of_job_load(srv, job_id, &x);
    if (in <= 0) return in;
    cJSON *o = cJSON_AddObjectToObject(config, "sweep");
    cJSON_AddNumberToObject(o, "id", (double)x.s.id);
    cJSON_AddNumberToObject(o, "trial", x.t->trial);
    cJSON_AddNumberToObject(o, "max_epochs", x.c.search.max_epochs);
    trial_of_job_release(&x);
    return 1;
}

/* The answer to a trial's question: its rung after the decision, whether
 * it goes on, the epochs to train to, and why. */
static void rung_answer(http_res *res, int64_t job, const trial_of_job *x, int rung, int go_on, int epochs,
                        const char *why) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)job);
    cJSON_AddNumberToObject(o, "sweep", (double)x->s.id);
    cJSON_AddNumberToObject(o, "trial", x->t->trial);
    cJSON_AddNumberToObject(o, "rung", rung);
    cJSON_AddBoolToObject(o, "continue", go_on);
    cJSON_AddNumberToObject(o, "epochs", epochs);
    cJSON_AddStringToObject(o, "reason", why);
    http_json(res, 200, o);
}

/* POST /api/v1/jobs/{id}/rung {"attempt", "epoch"} (the job's task): an
 * ASHA trial's worker has trained `epoch` epochs, the end of its rung, and
 * asks before it exits whether it goes on. ASHA decides at once
 * (asha_continues): in the rung's top 1/eta so far, it goes on in its
 * process (the rung row promoted, the trial at the next rung, the job's
 * fit.epochs the next rung's, all in one transaction): {"continue": true,
 * "epochs": the next rung's}; else it stops there ({"continue": false}),
 * and its job's end is scored as before. Asking again after a "continue"
 * whose answer was lost gets the same answer. */
static void trial_rung(server *srv, http_req *req, http_res *res) {
    exec_job j;
    int64_t id = api_job_param(srv, req, res, 0, &j); /* the job's own task only (ALLOW_TASK) */
    if (id < 0) return;
    int rc;
    cJSON *body = http_body_json(req, res);
    if (!body) {
        exec_store_job_release(&j);
        return;
    }
    long attempt = -1, epoch = -1;
    trial_of_job x;
    memset(&x, 0, sizeof x);
    int locked = 0;
    for (const cJSON *f = body->child; f; f = f->next) {
        /* an integer from 1 to INT32_MAX, range first: a cast of a larger double is undefined */
        int num = cJSON_IsNumber(f) && f->valuedouble >= 1 && f->valuedouble <= INT32_MAX &&
                  f->valuedouble == floor(f->valuedouble);
        if (strcmp(f->string, "attempt") == 0 && num) {
            attempt = (long)f->valuedouble;
        } else if (strcmp(f->string, "epoch") == 0 && num && f->valuedouble <= SWEEP_MAX_EPOCHS) {
            epoch = (long)f->valuedouble;
        } else if (strcmp(f->string, "attempt") == 0 || strcmp(f->string, "epoch") == 0) {
            http_error(res, 422, "invalid_value", f->string, "%s must be an integer from 1 to %d", f->string,
                       strcmp(f->string, "epoch") == 0 ? SWEEP_MAX_EPOCHS : INT32_MAX);
            goto out;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: attempt, epoch)",
                       f->string);
            goto out;
        }
    }
    if (attempt < 0 || epoch < 0) {
        const char *miss = attempt < 0 ? "attempt" : "epoch";
        http_error(res, 422, "missing_field", miss, "%s is required (%s)", miss,
                   attempt < 0 ? "the task's attempt, >= 1" : "the epochs trained, the end of the trial's rung");
        goto out;
    }
    if (strcmp(j.state, "running") != 0 || attempt != j.attempt) {
        http_error(res, 409, "conflict", "attempt", "job %lld is %s at attempt %d: not attempt %ld",
                   (long long)j.id, j.state, j.attempt, attempt);
        goto out;
    }
    pthread_mutex_lock(&g_controller);
    locked = 1;
    int in = trial_of_job_load(srv, id, &x);
    if (in < 0) {
        http_db_unavailable(res);
        goto out;
    }
    if (in == 0) {
        http_error(res, 409, "conflict", NULL,
                   "job %lld is not a running trial of a running asha sweep: it trains its own epochs", (long long)id);
        goto out;
    }
    sweep_ctx *c = &x.c;
    sweep_trial_row *t = x.t;
    int k = t->rung;
    char why[400];
    if (k > 0 && epoch == c->rungs[k - 1]) {
        /* asked again: the answer to the first question was lost */
        for (int i = 0; i < x.nr; i++)
            if (x.ent[i].trial == t->trial && x.ent[i].rung == k - 1 && x.ent[i].promoted) {
                snprintf(why, sizeof why,
                         "rung %d done (%ld epoch%s): promoted to rung %d (%d epochs) as answered before, it goes on "
                         "in its process",
                         k - 1, epoch, epoch == 1 ? "" : "s", k, c->rungs[k]);
                rung_answer(res, id, &x, k, 1, c->rungs[k], why);
                goto out;
            }
    }
    if (epoch != c->rungs[k]) {
        http_error(res, 409, "conflict", "epoch", "trial %d trains rung %d, to %d epochs: not %ld", t->trial, k,
                   c->rungs[k], epoch);
        goto out;
    }
    if (k + 1 >= c->n_rungs) {
        snprintf(why, sizeof why, "rung %d (%ld epochs) is the last: it ends here", k, epoch);
        rung_answer(res, id, &x, k, 0, (int)epoch, why);
        goto out;
    }
    sweep_metric m;
    if (sweep_store_job_metric(srv->db, id, c->search.metric, c->search.mode_max, &m) != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    if (m.epochs != epoch || !m.has_last) {
        snprintf(why, sizeof why, "no %s at epoch %ld among its metrics yet: it stops here, ranked once its job ends",
                 c->search.metric, epoch);
        rung_answer(res, id, &x, k, 0, (int)epoch, why);
        goto out;
    }
    int at_rung = 1;
    for (int i = 0; i < x.nr; i++) at_rung += x.ent[i].rung == k;
    int go = asha_continues(&c->search, x.ent, x.nr, t->trial, k, m.last);
    if (go < 0) {
        http_error(res, 409, "conflict", NULL, "trial %d has a result at rung %d already", t->trial, k);
        goto out;
    }
    if (!go) {
        snprintf(why, sizeof why,
                 "rung %d done (%ld epoch%s): its %s %.6g is not in the top 1/%d of the %d result%s at rung %d: it "
                 "stops here",
                 k, epoch, epoch == 1 ? "" : "s", c->search.metric, m.last, c->search.reduction_factor, at_rung,
                 at_rung == 1 ? "" : "s", k);
        log_info("sweep %lld: trial %d (job %lld) %s", (long long)x.s.id, t->trial, (long long)id, why);
        rung_answer(res, id, &x, k, 0, (int)epoch, why);
        goto out;
    }
    cJSON *params = t->params ? cJSON_Parse(t->params) : NULL;
    char *text = NULL, param[SWEEP_PATH_MAX + 8];
    jobspec js;
    spec_error e;
    memset(&e, 0, sizeof e);
    int ok = params && trial_spec(c, x.s.name, t->trial, params, c->rungs[k + 1], &text, &js, &e, param,
                                  sizeof param) == 0;
    cJSON_Delete(params);
    if (!ok) {
        snprintf(why, sizeof why, "its spec for rung %d is refused (%s): it stops here", k + 1, e.message);
        rung_answer(res, id, &x, k, 0, (int)epoch, why);
        goto out;
    }
    jobspec_release(&js);
    snprintf(why, sizeof why,
             "rung %d done (%ld epoch%s): its %s %.6g ranks in the top 1/%d of the %d result%s at rung %d: promoted "
             "to rung %d (%d epochs), it goes on in its process",
             k, epoch, epoch == 1 ? "" : "s", c->search.metric, m.last, c->search.reduction_factor, at_rung,
             at_rung == 1 ? "" : "s", k, k + 1, c->rungs[k + 1]);
    rc = sweep_store_trial_continue(srv->db, x.s.id, t->trial, k, id, (int)attempt, m.last, text, ACTOR, why);
    free(text);
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", NULL, "trial %d of sweep %lld changed meanwhile; it stops here", t->trial,
                   (long long)x.s.id);
        goto out;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    log_info("sweep %lld: trial %d (job %lld) %s", (long long)x.s.id, t->trial, (long long)id, why);
    rung_answer(res, id, &x, k + 1, 1, c->rungs[k + 1], why);
out:
    if (locked) pthread_mutex_unlock(&g_controller);
    trial_of_job_release(&x);
    cJSON_Delete(body);
    exec_store_job_release(&j);
}

const route api_sweeps_routes[] = {
    {"POST", "/api/v1/sweeps", sweep_create, ALLOW_TEAM, 0, ROLE_NONE},
    {"GET", "/api/v1/sweeps", sweep_list, ALLOW_USER, 0, ROLE_NONE},
    {"GET", "/api/v1/sweeps/{id}", sweep_get, ALLOW_USER, 0, ROLE_NONE},
    {"POST", "/api/v1/sweeps/{id}/cancel", sweep_cancel, ALLOW_USER, 0, ROLE_NONE},
    {"POST", "/api/v1/jobs/{id}/rung", trial_rung, ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
