/* exec_api.c - agents' and workers' endpoints (docs/api-executors.md) and
 * the running job as users see it. Rows are storage/exec_store.c; what a
 * task report means for its job is scheduler/lifecycle.c.
 *
 * Scope: a task token touches only its own job, a team token its team's
 * jobs, the admin all; another job is a 404 (ids do not leak). A node token
 * (minted at registration) acts for its own node: its assignments, its
 * tasks' reports, logs of jobs with a task on it; another node's is a 403. */
#include "exec_api.h"
#include "../common/json_out.h"
#include "retention_api.h"
#include "scheduling.h"
#include "scope.h"
#include "sweeps_api.h"
#include "teams_api.h"
#include "../spec/jobspec.h"
#include "../scheduler/lifecycle.h"
#include "../server/server.h"
#include "../storage/cluster.h"
#include "../storage/exec_store.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define POLL_MS 150                 /* long-poll and event-stream database poll period */
#define WAIT_MAX_S 60
#define STOP_GRACE_S 10
#define MAX_START 64                /* tasks handed out per answer */
#define METRICS_MAX 5000            /* metrics per POST */
#define LOG_READ_MAX (1L << 20)
#define RDV_VALUE_MAX (64 * 1024)
#define CKPT_MAX_BODY (1ull << 30)
#define PRUNE_MAX 64

static void db_unavailable(http_res *res) {
    http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
}


/* Loads job `id` when the request's token may see it: 0, or -1 with the
 * answer (404 / 503) in res. */
static int job_scope(server *srv, http_req *req, http_res *res, int64_t id, int with_spec, exec_job *j) {
    int rc = exec_job_get(srv->db, id, with_spec, j);
    if (rc == STORE_OK) {
        if (j->deleted || /* DELETE /jobs/{id}: gone for everyone */
            (req->who.kind == TOKEN_TASK && req->who.job_id != id) ||
            (req->who.kind == TOKEN_TEAM && req->who.team_id != j->team_id)) {
            exec_job_release(j);
            rc = STORE_NOT_FOUND;
        }
    }
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return -1;
    }
    if (rc != STORE_OK) {
        db_unavailable(res);
        return -1;
    }
    return 0;
}

static int64_t job_param(server *srv, http_req *req, http_res *res, int with_spec, exec_job *j) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return -1;
    if (job_scope(srv, req, res, id, with_spec, j) < 0) return -1;
    return id;
}

/* ---------------------------------------------------------------- assignments */

/* The stop set last sent to each node (hash of its task ids), so a long-poll
 * answers at once only when something changed, not on every poll while a
 * task takes its grace period to exit. */
#define STOP_SLOTS 1024
static pthread_mutex_t g_stop_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int64_t node;
    uint64_t hash;
    uint64_t gen;                /* registrations of the node seen by this server */
} g_stop_sent[STOP_SLOTS];

static uint64_t stop_hash(const cJSON *stop) {
    uint64_t h = 1469598103934665603ull;
    const cJSON *it;
    cJSON_ArrayForEach(it, stop) {
        uint64_t v = (uint64_t)cJSON_GetObjectItem(it, "task")->valuedouble;
        h = (h ^ v) * 1099511628211ull;
    }
    return cJSON_GetArraySize(stop) ? h : 0;
}

/* The node's slot (claimed when free), or -1 when the table is full; call
 * with g_stop_lock held. */
static int node_slot(int64_t node) {
    for (int i = 0; i < STOP_SLOTS; i++) {
        int k = (int)(((uint64_t)node + (uint64_t)i) % STOP_SLOTS);
        if (g_stop_sent[k].node == node || g_stop_sent[k].node == 0) {
            g_stop_sent[k].node = node;
            return k;
        }
    }
    return -1;
}

static uint64_t stop_sent_get(int64_t node) {
    pthread_mutex_lock(&g_stop_lock);
    int k = node_slot(node);
    uint64_t h = k >= 0 ? g_stop_sent[k].hash : 0;
    pthread_mutex_unlock(&g_stop_lock);
    return h;
}

static uint64_t node_gen(int64_t node) {
    pthread_mutex_lock(&g_stop_lock);
    int k = node_slot(node);
    uint64_t g = k >= 0 ? g_stop_sent[k].gen : 0;
    pthread_mutex_unlock(&g_stop_lock);
    return g;
}

void exec_node_registered(int64_t node) {
    pthread_mutex_lock(&g_stop_lock);
    int k = node_slot(node);
    if (k >= 0) g_stop_sent[k].gen++;
    pthread_mutex_unlock(&g_stop_lock);
}

static void stop_sent_set(int64_t node, uint64_t hash) {
    pthread_mutex_lock(&g_stop_lock);
    int k = node_slot(node);
    if (k >= 0) g_stop_sent[k].hash = hash;
    pthread_mutex_unlock(&g_stop_lock);
}

/* Hands one assigned task out: mints its token and builds the start item.
 * NULL when it was handed out meanwhile or on a store error (*err set). */
static cJSON *handout(server *srv, int64_t task_id, int *err) {
    exec_task t;
    exec_job j;
    memset(&j, 0, sizeof j);
    cJSON *item = NULL, *cluster = NULL, *devices = NULL;
    char tok[128], hash[65];
    if (exec_task_get(srv->db, task_id, &t) != STORE_OK) goto fail;
    if (exec_job_get(srv->db, t.job_id, 1, &j) != STORE_OK) goto fail;
    if (random_token(tok, sizeof tok) < 0) goto fail;
    sha256_hex(tok, strlen(tok), hash);
    if (db_begin(srv->db) < 0) goto fail;
    int rc = exec_task_handout(srv->db, task_id, hash);
    if (rc == STORE_OK) rc = store_token_add(srv->db, tok, TOKEN_TASK, j.team_id, t.job_id);
    if (rc == STORE_OK && db_commit(srv->db) < 0) rc = STORE_ERROR;
    if (rc != STORE_OK) {
        db_rollback(srv->db);
        exec_job_release(&j);
        if (rc != STORE_CONFLICT) *err = 1;
        return NULL;
    }
    if (exec_attempt_cluster(srv->db, t.job_id, t.attempt, &cluster) != STORE_OK ||
        exec_task_devices(srv->db, task_id, &devices) != STORE_OK)
        goto fail;
    item = cJSON_CreateObject();
    cJSON_AddNumberToObject(item, "task", (double)t.id);
    cJSON_AddNumberToObject(item, "job", (double)t.job_id);
    cJSON_AddNumberToObject(item, "attempt", t.attempt);
    cJSON_AddStringToObject(item, "type", t.type);
    cJSON_AddNumberToObject(item, "index", t.index);
    cJSON_AddNumberToObject(item, "port", t.port);
    cJSON_AddItemToObject(item, "devices", cJSON_Duplicate(devices, 1));
    cJSON_AddStringToObject(item, "token", tok);
    cJSON *cfg = cJSON_AddObjectToObject(item, "config");
    cJSON_AddItemToObject(cfg, "cluster", cluster);
    cluster = NULL;
    cJSON *task = cJSON_AddObjectToObject(cfg, "task");
    cJSON_AddStringToObject(task, "type", t.type);
    cJSON_AddNumberToObject(task, "index", t.index);
    cJSON_AddItemToObject(cfg, "devices", devices);
    devices = NULL;
    cJSON_AddNumberToObject(cfg, "job", (double)t.job_id);
    cJSON_AddNumberToObject(cfg, "team", (double)j.team_id);
    cJSON_AddNumberToObject(cfg, "attempt", t.attempt);
    cJSON_AddNumberToObject(cfg, "memory_mb", (double)t.memory_mb);
    cJSON_AddStringToObject(cfg, "api", srv->public_url);
    cJSON_AddStringToObject(cfg, "token", tok);
    /* the attempt's secret: its tasks prove it to each other (collectives, ps) */
    char secret[65];
    server_attempt_secret(srv, t.job_id, t.attempt, secret);
    cJSON_AddStringToObject(cfg, "secret", secret);
    explicit_bzero(secret, sizeof secret);
    cJSON *spec = cJSON_Parse(j.spec);
    cJSON_AddItemToObject(cfg, "spec", spec ? spec : cJSON_CreateObject());
    exec_job_release(&j);
    /* an ASHA trial's worker asks at each rung's end whether it goes on */
    if (api_sweeps_trial_config(srv, t.job_id, cfg) < 0) log_warn("job %lld: cannot read its sweep", (long long)t.job_id);
    return item;
fail:
    cJSON_Delete(cluster);
    cJSON_Delete(devices);
    exec_job_release(&j);
    *err = 1;
    return NULL;
}

/* ---------------------------------------------------------------- the long-poll
 * A parked long-poll waits for its node's wake: every commit that gives a
 * node a task to start or to stop wakes it (db_wake_node: the scheduler's
 * placements, store_job_stop_tasks for preemptions, cancels and a gang's
 * end), and http_wait_watch makes a wake that comes while the poll looks
 * run it again rather than be lost. So a parked poll looks at the database
 * on its first run, when woken, and at its deadline, never on a timer:
 * with thousands of agents, a look every POLL_MS per poll was most of the
 * server's work (a resume, a handler run and a lookup each; 33,000 a second
 * for 5,000 agents) and, when a wake came during such a look, the task
 * waited for the next look (docs/scheduler.md, "A server for thousands of
 * agents"). TRAINYARD_POLL_RECHECK=query: a look with two queries every
 * POLL_MS, as the server once did (bench/cluster's before/after). */
static int recheck_query_mode(void) {
    static int mode = -1;
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *e = getenv("TRAINYARD_POLL_RECHECK");
        m = e && strcmp(e, "query") == 0;
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return m;
}

/* GET /api/v1/nodes/{id}/assignments?wait=S */
static void node_assignments(server *srv, http_req *req, http_res *res) {
    int64_t node = http_param_id(req, res, 0, "node");
    if (node < 0) return;
    if (api_node_scope(req, res, node) < 0) return;
    long wait;
    if (http_query_long(req, res, "wait", 0, WAIT_MAX_S, 0, &wait) < 0) return;
    int rc = req->calls ? STORE_OK : exec_node_exists(srv->db, node);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no node %lld (register with POST /api/v1/nodes)", (long long)node);
        return;
    }
    if (rc != STORE_OK) {
        db_unavailable(res);
        return;
    }
    if (req->calls == 0) { /* the poll's first run: later runs (http_wait) keep these */
        req->keep[0] = mono_ms() + wait * 1000;
        req->keep[1] = (int64_t)stop_sent_get(node);
        req->keep[2] = (int64_t)node_gen(node);
    }
    int64_t deadline = req->keep[0];
    uint64_t sent = (uint64_t)req->keep[1], gen = (uint64_t)req->keep[2];
    http_wait_watch(req, HTTP_WAKE_NODE, node); /* before the look: a wake during it is not lost */
    int64_t ids[MAX_START];
    int n = 0;
    cJSON *stop = NULL;
    if (node_gen(node) != gen) {
        /* The node registered again since this poll began: the poll is
         * its agent's previous life (dead, or about to poll again). A
         * task handed out here could be lost: answer empty, now. */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddArrayToObject(o, "start");
        cJSON_AddArrayToObject(o, "stop");
        http_json(res, 200, o);
        return;
    }
    int last;
    if (exec_node_pending(srv->db, node, ids, MAX_START, &n) != STORE_OK ||
        exec_node_stopping(srv->db, node, &stop) != STORE_OK) {
        db_unavailable(res);
        return;
    }
    uint64_t h = stop_hash(stop);
    last = mono_ms() >= deadline || srv->stopping;
    if (n > 0 || h != sent || last) {
        cJSON *o = cJSON_CreateObject();
        cJSON *start = cJSON_AddArrayToObject(o, "start");
        int err = 0;
        for (int i = 0; i < n; i++) {
            cJSON *item = handout(srv, ids[i], &err);
            if (item) cJSON_AddItemToArray(start, item);
        }
        if (err && cJSON_GetArraySize(start) == 0) {
            cJSON_Delete(o);
            cJSON_Delete(stop);
            db_unavailable(res);
            return;
        }
        cJSON *it;
        cJSON_ArrayForEach(it, stop) cJSON_AddNumberToObject(it, "grace_s", STOP_GRACE_S);
        cJSON_AddItemToObject(o, "stop", stop);
        stop_sent_set(node, h);
        http_json(res, 200, o);
        return;
    }
    cJSON_Delete(stop);
    /* nothing yet: wait for this node's wake (a task placed on it or asked
     * to stop), until the deadline */
    int64_t left = deadline - mono_ms();
    int ms = left > 0 ? (left < INT_MAX ? (int)left : INT_MAX) : 1;
    if (recheck_query_mode() && ms > POLL_MS) ms = POLL_MS;
    http_wait(req, res, ms, HTTP_WAKE_NODE, node);
}

/* ---------------------------------------------------------------- task status */

static int json_int(const cJSON *v, long lo, long hi, long *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (d != floor(d) || d < (double)lo || d > (double)hi) return -1;
    *out = (long)d;
    return 0;
}

/* POST /api/v1/tasks/{id}/status {"state":"running"} |
 * {"state":"exited","exit_code":N,"signal":S,"reason":"...","log_tail":"..."} */
static void task_status(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "task");
    if (id < 0) return;
    if (req->who.kind == TOKEN_NODE) {
        int64_t on = 0;
        int rc = cluster_task_node(srv->db, id, &on);
        if (rc < 0) {
            db_unavailable(res);
            return;
        }
        if (rc == 0 && api_node_scope(req, res, on) < 0) return;
    }
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *state = NULL, *reason = NULL, *tail = NULL;
    long code = 0, sig = 0;
    int has_code = 0;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "state") == 0) {
            if (!cJSON_IsString(f) || (strcmp(f->valuestring, "running") != 0 && strcmp(f->valuestring, "exited") != 0)) {
                http_error(res, 422, "invalid_value", "state", "state must be 'running' or 'exited'");
                goto out;
            }
            state = f->valuestring;
        } else if (strcmp(f->string, "exit_code") == 0) {
            if (json_int(f, -255, 255, &code) < 0) {
                http_error(res, 422, "invalid_value", "exit_code", "exit_code must be an integer between -255 and 255");
                goto out;
            }
            has_code = 1;
        } else if (strcmp(f->string, "signal") == 0) {
            if (json_int(f, 0, 128, &sig) < 0) {
                http_error(res, 422, "invalid_value", "signal", "signal must be an integer between 0 and 128");
                goto out;
            }
        } else if (strcmp(f->string, "reason") == 0) {
            if (!cJSON_IsString(f) || strlen(f->valuestring) > 1000) {
                http_error(res, 422, "invalid_type", "reason", "reason must be a string of at most 1000 characters");
                goto out;
            }
            reason = f->valuestring;
        } else if (strcmp(f->string, "log_tail") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "log_tail", "log_tail must be a string");
                goto out;
            }
            tail = f->valuestring;
            size_t n = strlen(tail);
            if (n > 2000) tail += n - 2000; /* the last lines are what matter */
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: state, exit_code, signal, reason, log_tail)", f->string);
            goto out;
        }
    }
    if (!state) {
        http_error(res, 422, "missing_field", "state", "state is required ('running' or 'exited')");
        goto out;
    }
    if (strcmp(state, "exited") == 0 && !has_code && !sig) {
        http_error(res, 422, "missing_field", "exit_code", "an exited task needs exit_code (or signal)");
        goto out;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    int flags = 0, rc;
    if (strcmp(state, "running") == 0) {
        rc = lifecycle_task_running(srv->db, id, actor, &flags);
    } else {
        lifecycle_exit e = {.exit_code = has_code ? (int)code : 128 + (int)sig,
                            .signal = (int)sig, .reason = reason, .log_tail = tail};
        rc = lifecycle_task_exited(srv->db, id, &e, actor, &flags);
    }
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no task %lld", (long long)id);
        goto out;
    }
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", "state", "task %lld has already exited", (long long)id);
        goto out;
    }
    if (rc != STORE_OK) {
        db_unavailable(res);
        goto out;
    }
    if (flags) api_kick_scheduler(srv);
    if (flags & LC_JOB_CHANGED) api_sweeps_kick(); /* a trial's job may have ended: decide now */
    exec_task t;
    cJSON *o = cJSON_CreateObject();
    if (exec_task_get(srv->db, id, &t) == STORE_OK) {
        cJSON_AddNumberToObject(o, "task", (double)t.id);
        cJSON_AddNumberToObject(o, "job", (double)t.job_id);
        cJSON_AddStringToObject(o, "state", t.state);
    }
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
}

/* ---------------------------------------------------------------- events */

/* POST /api/v1/jobs/{id}/events {"kind", "message", "attempt"} (a task of
 * the job): what happened on its node that belongs on the job's timeline.
 * kind "image": a pull began or ended; "image_pull_failed": the image cannot
 * be had, so the attempt fails for good, without spending the restart
 * budget (another attempt would meet the same registry). */
static void events_post(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) goto out_job;
    const char *kind = NULL, *msg = NULL;
    long attempt = -1;
    for (const cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "kind") == 0 && cJSON_IsString(f)) kind = f->valuestring;
        else if (strcmp(f->string, "message") == 0 && cJSON_IsString(f)) msg = f->valuestring;
        else if (strcmp(f->string, "attempt") == 0 && cJSON_IsNumber(f)) attempt = (long)f->valuedouble;
        else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown or mistyped field '%s' (allowed: kind, message, attempt)", f->string);
            goto out;
        }
    }
    if (!kind || (strcmp(kind, "image") != 0 && strcmp(kind, "image_pull_failed") != 0)) {
        http_error(res, 422, kind ? "invalid_value" : "missing_field", "kind",
                   "kind must be \"image\" or \"image_pull_failed\"");
        goto out;
    }
    if (!msg || !msg[0] || strlen(msg) > 1000) {
        http_error(res, 422, msg ? "invalid_value" : "missing_field", "message", "message must be 1 to 1000 bytes");
        goto out;
    }
    if (attempt < 1) {
        http_error(res, 422, "missing_field", "attempt", "attempt (the task's attempt, >= 1) is required");
        goto out;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    int rc;
    if (strcmp(kind, "image_pull_failed") == 0) {
        rc = lifecycle_job_fail_now(srv->db, j.id, (int)attempt, msg, actor);
        if (rc == STORE_OK) api_kick_scheduler(srv);
    } else {
        rc = attempt == j.attempt ? store_event_add(srv->db, j.id, kind, actor, msg) : STORE_CONFLICT;
    }
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", "attempt", "job %lld is %s at attempt %d: not attempt %ld", (long long)j.id,
                   j.state, j.attempt, attempt);
        goto out;
    }
    if (rc != STORE_OK) {
        db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddStringToObject(o, "kind", kind);
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
out_job:
    exec_job_release(&j);
}

/* ---------------------------------------------------------------- metrics */

/* step, epoch, test: the chief's sequence; eval: the evaluator's, a
 * sequence of its own (storage/exec_store.h). */
static int valid_kind(const char *k) {
    return strcmp(k, "step") == 0 || strcmp(k, "epoch") == 0 || strcmp(k, "test") == 0 ||
           strcmp(k, "eval") == 0;
}

static double num_or(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* Training examples per epoch as the loaders would give them; 0 unknown. */
static long spec_train_examples(const jobspec *s) {
    long n = 0;
    switch (s->data.source) {
    case DATA_FASHION_MNIST:
    case DATA_MNIST: n = 60000; break;
    case DATA_SYNTHETIC: n = s->data.examples; break;
    case DATA_CSV: n = 0; break;
    }
    if (s->data.limit > 0 && (n == 0 || s->data.limit < n)) n = s->data.limit;
    if (n > 0) n -= (long)((double)n * s->data.validation_split);
    return n;
}

/* Recomputes jobs.progress from the newest metrics of each kind. */
static int progress_update(server *srv, const exec_job *j) {
    cJSON *step = NULL, *epoch = NULL, *test = NULL, *eval = NULL;
    if (exec_metric_latest(srv->db, j->id, "step", &step) != STORE_OK ||
        exec_metric_latest(srv->db, j->id, "epoch", &epoch) != STORE_OK ||
        exec_metric_latest(srv->db, j->id, "test", &test) != STORE_OK ||
        exec_metric_latest(srv->db, j->id, "eval", &eval) != STORE_OK) {
        cJSON_Delete(step);
        cJSON_Delete(epoch);
        cJSON_Delete(test);
        cJSON_Delete(eval);
        return STORE_ERROR;
    }
    int ep_n = 0;
    double ep_samples = 0, ep_secs = 0;
    if (exec_epoch_throughput(srv->db, j->id, &ep_n, &ep_samples, &ep_secs) != STORE_OK) {
        cJSON_Delete(step);
        cJSON_Delete(epoch);
        cJSON_Delete(test);
        cJSON_Delete(eval);
        return STORE_ERROR;
    }
    jobspec *spec = xcalloc(1, sizeof *spec);
    spec_error se;
    int have_spec = j->spec && jobspec_parse(j->spec, strlen(j->spec), spec, &se) == 0;
    cJSON *p = cJSON_CreateObject();
    double cur_step = step ? num_or(step, "step", 0) : epoch ? num_or(epoch, "step", 0) : 0;
    double cur_epoch = step ? num_or(step, "epoch", 0) : epoch ? num_or(epoch, "epoch", 0) : 0;
    cJSON_AddNumberToObject(p, "step", cur_step);
    cJSON_AddNumberToObject(p, "epoch", cur_epoch);
    double total = step ? num_or(step, "total_steps", 0) : 0;
    double spe = step ? num_or(step, "steps_per_epoch", 0) : 0;
    int epochs = have_spec ? spec->fit.epochs : 0;
    if (epochs > 0) cJSON_AddNumberToObject(p, "epochs", epochs);
    if (total <= 0 && have_spec && epochs > 0) {
        if (spe <= 0) {
            long n = spec_train_examples(spec);
            if (n > 0 && spec->fit.batch_size > 0)
                spe = (double)((n + spec->fit.batch_size - 1) / spec->fit.batch_size);
            if (spec->fit.steps_per_epoch > 0 && (spe <= 0 || spec->fit.steps_per_epoch < spe))
                spe = (double)spec->fit.steps_per_epoch;
        }
        if (spe > 0) total = spe * epochs;
    }
    if (spe > 0) cJSON_AddNumberToObject(p, "steps_per_epoch", spe);
    if (total > 0) cJSON_AddNumberToObject(p, "total_steps", total);
    else cJSON_AddNullToObject(p, "total_steps");
    double sps = step ? num_or(step, "samples_per_sec", 0) : 0;
    if (sps <= 0 && epoch) sps = num_or(epoch, "samples_per_sec", 0);
    if (sps > 0) cJSON_AddNumberToObject(p, "samples_per_sec", sps);
    else cJSON_AddNullToObject(p, "samples_per_sec");
    /* the run's mean: the completed epochs' samples over their training
     * time (what a finished job shows; samples_per_sec is the newest figure) */
    if (ep_n > 0 && ep_secs > 0) {
        cJSON_AddNumberToObject(p, "mean_samples_per_sec", ep_samples / ep_secs);
        cJSON_AddNumberToObject(p, "train_seconds", ep_secs);
    } else {
        cJSON_AddNullToObject(p, "mean_samples_per_sec");
        cJSON_AddNullToObject(p, "train_seconds");
    }
    /* samples_per_sec is what the reporting worker (the chief) trains; each
     * worker takes batch_size / workers examples of every global step. */
    int workers = have_spec && spec->resources.workers > 0 ? spec->resources.workers : 1;
    double per_worker = have_spec ? (double)spec->fit.batch_size / workers : 0;
    if (test) {
        cJSON_AddNumberToObject(p, "eta_s", 0);
    } else if (total > 0 && sps > 0 && per_worker > 0) {
        double left = total - cur_step;
        cJSON_AddNumberToObject(p, "eta_s", round((left > 0 ? left : 0) * per_worker / sps * 10) / 10);
    } else {
        cJSON_AddNullToObject(p, "eta_s");
    }
    if (total > 0) {
        double f = cur_step / total;
        cJSON_AddNumberToObject(p, "fraction", f > 1 ? 1 : f);
    }
    cJSON_AddItemToObject(p, "latest", step ? step : cJSON_CreateNull());
    cJSON_AddItemToObject(p, "latest_epoch", epoch ? epoch : cJSON_CreateNull());
    cJSON_AddItemToObject(p, "test", test ? test : cJSON_CreateNull());
    cJSON_AddItemToObject(p, "eval", eval ? eval : cJSON_CreateNull());
    if (have_spec) jobspec_release(spec);
    free(spec);
    char *s = json_print(p, NULL);
    cJSON_Delete(p);
    if (!s) return STORE_ERROR;
    int rc = exec_progress_set(srv->db, j->id, s);
    free(s);
    return rc;
}

/* Validates one metric; 0, or -1 with the 422 in res. */
static int metric_check(const cJSON *m, int i, http_res *res, int64_t *seq, const char **kind, int64_t *step,
                        int *has_step, int64_t *epoch, int *has_epoch) {
    char field[64];
    if (!cJSON_IsObject(m)) {
        snprintf(field, sizeof field, "metrics[%d]", i);
        http_error(res, 422, "invalid_type", field, "each metric must be an object");
        return -1;
    }
    long v;
    const cJSON *f = cJSON_GetObjectItem(m, "seq");
    snprintf(field, sizeof field, "metrics[%d].seq", i);
    if (!f) {
        http_error(res, 422, "missing_field", field, "every metric needs its seq");
        return -1;
    }
    if (json_int(f, 1, (1L << 53), &v) < 0) {
        http_error(res, 422, "invalid_value", field, "seq must be an integer of at least 1");
        return -1;
    }
    *seq = v;
    f = cJSON_GetObjectItem(m, "kind");
    snprintf(field, sizeof field, "metrics[%d].kind", i);
    if (!f) {
        *kind = "step";
    } else if (!cJSON_IsString(f) || !valid_kind(f->valuestring)) {
        http_error(res, 422, "invalid_value", field, "kind must be step, epoch, test or eval");
        return -1;
    } else {
        *kind = f->valuestring;
    }
    const char *ints[2] = {"step", "epoch"};
    int64_t *outs[2] = {step, epoch};
    int *has[2] = {has_step, has_epoch};
    for (int k = 0; k < 2; k++) {
        *has[k] = 0;
        f = cJSON_GetObjectItem(m, ints[k]);
        if (!f || cJSON_IsNull(f)) continue;
        snprintf(field, sizeof field, "metrics[%d].%s", i, ints[k]);
        if (json_int(f, 0, (1L << 53), &v) < 0) {
            http_error(res, 422, "invalid_value", field, "%s must be a non-negative integer", ints[k]);
            return -1;
        }
        *outs[k] = v;
        *has[k] = 1;
    }
    for (const cJSON *g = m->child; g; g = g->next) {
        if (cJSON_IsNumber(g) || cJSON_IsString(g) || cJSON_IsBool(g) || cJSON_IsNull(g)) continue;
        snprintf(field, sizeof field, "metrics[%d].%.40s", i, g->string);
        http_error(res, 422, "invalid_type", field, "metric values must be numbers, strings or booleans");
        return -1;
    }
    return 0;
}

/* POST /api/v1/jobs/{id}/metrics {"metrics":[{"seq":1,"kind":"step",...}]} */
static void metrics_post(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 1, &j) < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) goto out_job;
    cJSON *arr = NULL;
    long sender_attempt = 0; /* 0: not said (clients older than the field) */
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "attempt") == 0) {
            if (json_int(f, 1, INT32_MAX, &sender_attempt) < 0) {
                http_error(res, 422, "invalid_value", "attempt", "attempt must be an integer >= 1");
                goto out;
            }
            continue;
        }
        if (strcmp(f->string, "metrics") != 0) {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: metrics, attempt)",
                       f->string);
            goto out;
        }
        arr = f;
    }
    if (!arr) {
        http_error(res, 422, "missing_field", "metrics", "metrics (an array) is required");
        goto out;
    }
    if (!cJSON_IsArray(arr)) {
        http_error(res, 422, "invalid_type", "metrics", "metrics must be an array");
        goto out;
    }
    int n = cJSON_GetArraySize(arr);
    if (n > METRICS_MAX) {
        http_error(res, 422, "invalid_value", "metrics", "at most %d metrics per request; got %d", METRICS_MAX, n);
        goto out;
    }
    /* Validate everything before storing anything. */
    int i = 0;
    int64_t last = 0;
    for (cJSON *m = arr->child; m; m = m->next, i++) {
        int64_t seq, step, epoch;
        const char *kind;
        int hs, he;
        if (metric_check(m, i, res, &seq, &kind, &step, &hs, &epoch, &he) < 0) goto out;
        if (seq > last) last = seq;
    }
    if (db_begin(srv->db) < 0) {
        db_unavailable(res);
        goto out;
    }
    /* a report of an earlier attempt (a worker of a gang already requeued,
     * still flushing) is refused in the same transaction that would store
     * it: the next attempt's chief read the metrics after the requeue, so
     * what it found is all it must not report again */
    int current = 0;
    int rc = exec_job_attempt(srv->db, j.id, &current);
    if (rc == STORE_OK && sender_attempt > 0 && sender_attempt != current) {
        db_rollback(srv->db);
        http_error(res, 409, "conflict", "attempt", "job %lld is at attempt %d: metrics of attempt %ld are refused",
                   (long long)j.id, current, sender_attempt);
        goto out;
    }
    int added = 0;
    for (cJSON *m = arr->child; m && rc == STORE_OK; m = m->next) {
        int64_t seq, step, epoch;
        const char *kind;
        int hs, he, ins = 0;
        metric_check(m, 0, res, &seq, &kind, &step, &hs, &epoch, &he);
        cJSON *copy = cJSON_Duplicate(m, 1);
        cJSON_DeleteItemFromObject(copy, "seq");
        cJSON_DeleteItemFromObject(copy, "kind");
        char *data = json_print(copy, NULL);
        cJSON_Delete(copy);
        if (!data) {
            rc = STORE_ERROR;
            break;
        }
        rc = exec_metric_add(srv->db, j.id, seq, current, kind, hs ? &step : NULL, he ? &epoch : NULL, data, &ins);
        free(data);
        added += ins;
    }
    if (rc == STORE_OK && added) rc = progress_update(srv, &j);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "acked", (double)last);
    cJSON_AddNumberToObject(o, "stored", added);
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
out_job:
    exec_job_release(&j);
}

/* GET /api/v1/jobs/{id}/metrics?since=SEQ&kind=&limit=&last=1 */
static void metrics_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    long since, limit, last;
    if (http_query_long(req, res, "since", 0, (long)INT64_MAX, 0, &since) < 0) return;
    if (http_query_long(req, res, "limit", 1, 10000, 1000, &limit) < 0) return;
    if (http_query_long(req, res, "last", 0, 1, 0, &last) < 0) return;
    const char *kind = http_query(req, "kind");
    if (kind && !valid_kind(kind)) {
        http_error(res, 400, "invalid_value", "kind", "kind must be step, epoch, test or eval; got '%s'", kind);
        return;
    }
    cJSON *arr = NULL;
    int64_t last_seq = 0;
    int rc;
    if (last) {
        cJSON *m = NULL;
        rc = exec_metric_latest(srv->db, j.id, kind, &m);
        if (rc == STORE_OK) rc = exec_metrics_list(srv->db, j.id, 0, kind, 0, NULL, &last_seq);
        arr = cJSON_CreateArray();
        if (m) cJSON_AddItemToArray(arr, m);
    } else {
        rc = exec_metrics_list(srv->db, j.id, since, kind, (int)limit, &arr, &last_seq);
    }
    if (rc != STORE_OK) {
        cJSON_Delete(arr);
        db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddItemToObject(o, "metrics", arr);
    cJSON_AddNumberToObject(o, "last_seq", (double)last_seq);
    http_json(res, 200, o);
}

/* ---------------------------------------------------------------- logs */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

static int valid_task_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 32 || !islower((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return 0;
    return 1;
}

static int log_path(server *srv, int64_t job, const char *task, char *out, size_t cap, int mkdir) {
    char dir[PATH_MAX];
    if (sfmt(dir, sizeof dir, "%s/%lld", srv->log_dir, (long long)job) < 0) return -1;
    if (mkdir && mkdir_p(dir, 0700) < 0) return -1;
    return sfmt(out, cap, "%s/%s.log", dir, task);
}

static const char *task_query(http_req *req, http_res *res, int required) {
    const char *task = http_query(req, "task");
    if (!task) {
        if (!required) return "worker-0";
        http_error(res, 400, "missing_field", "task", "the query argument task is required (e.g. task=worker-0)");
        return NULL;
    }
    if (!valid_task_name(task)) {
        http_error(res, 400, "invalid_value", "task", "task must look like worker-0 or ps-1");
        return NULL;
    }
    return task;
}

/* What of a log post is kept: the first `take` bytes of the body, then
 * `note` (a line saying why the rest is dropped; "" when none). Bounds,
 * first met first: the disk reserve, the job's log cap, the team's quota.
 * A post past a bound is still a 200 (with "dropped"): the agent would
 * retry an error forever. */
typedef struct log_admit {
    size_t take;
    char note[512];
} log_admit;

/* The job's log cap in bytes: its spec's logs.max_size, else the server's
 * default; never more than --log-max-per-job. */
static int64_t log_cap_bytes(const server *srv, const char *max_size) {
    int64_t mb = srv->opt.log_max_per_job_default_mb;
    spec_error se;
    int64_t want = 0;
    if (max_size[0] && jobspec_size_text(max_size, &JOBSPEC_SIZE_LOG_MAX, &want, &se) == 0 && want > 0) mb = want;
    if (mb > srv->opt.log_max_per_job_mb) mb = srv->opt.log_max_per_job_mb;
    return mb << 20;
}

static void log_admit_decide(server *srv, const exec_job *j, const char *body, size_t len, log_admit *a) {
    a->take = len;
    a->note[0] = '\0';
    if (!len) return;
    char nl[2] = "";
    int64_t free_b, reserve;
    unsigned ep;
    if (quota_disk_low(srv->db, (int64_t)len, &free_b, &reserve, &ep) == 1) {
        a->take = 0;
        if (quota_note_once(srv->db, j->id, QUOTA_NOTE_DISK, ep)) {
            char fb[32], rb[32];
            quota_fmt_bytes(free_b, fb, sizeof fb);
            quota_fmt_bytes(reserve, rb, sizeof rb);
            snprintf(a->note, sizeof a->note,
                     "[trainyard server: the server's disk has %s free, under its reserve of %s: output of this job "
                     "is dropped until space is freed]\n",
                     fb, rb);
        }
        return;
    }
    int64_t kept = 0;
    char max_size[64];
    if (exec_job_log_state(srv->db, j->id, &kept, max_size, sizeof max_size) == STORE_OK) {
        int64_t cap = log_cap_bytes(srv, max_size);
        if (kept >= cap) { /* noted when it got there */
            a->take = 0;
            return;
        }
        if (kept + (int64_t)len > cap) {
            a->take = (size_t)(cap - kept);
            if (a->take && body[a->take - 1] != '\n') nl[0] = '\n';
            char cb[32];
            quota_fmt_bytes(cap, cb, sizeof cb);
            if (quota_note_once(srv->db, j->id, QUOTA_NOTE_CAP, 0))
                snprintf(a->note, sizeof a->note,
                         "%s[trainyard server: this job's log reached its cap of %s: further output is dropped (set "
                         "\"logs\": {\"max_size\": \"...\"} in the job's spec to keep more, up to %lld MiB)]\n",
                         nl, cb, (long long)srv->opt.log_max_per_job_mb);
            return;
        }
    }
    int64_t quota;
    quota_use use;
    if (quota_check(srv->db, j->team_id, (int64_t)len, &quota, &use, &ep) == 1) {
        int64_t room = quota - quota_use_total(&use);
        a->take = room > 0 ? (size_t)room : 0;
        if (a->take && body[a->take - 1] != '\n') nl[0] = '\n';
        if (quota_note_once(srv->db, j->id, QUOTA_NOTE_TEAM, ep)) {
            char team[64] = "", qb[32], ub[32];
            if (quota_team_name(srv->db, j->team_id, team, sizeof team) != STORE_OK)
                snprintf(team, sizeof team, "%lld", (long long)j->team_id);
            quota_fmt_bytes(quota, qb, sizeof qb);
            quota_fmt_bytes(quota_use_total(&use) + (int64_t)a->take, ub, sizeof ub); /* with what is taken */
            snprintf(a->note, sizeof a->note,
                     "%s[trainyard server: team %s is at its storage quota (%s of %s): further output of this job "
                     "is dropped]\n",
                     nl, team, ub, qb);
        }
    }
}

/* POST /api/v1/jobs/{id}/logs?task=worker-0 (raw text lines) */
static void logs_post(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    if (req->who.kind == TOKEN_NODE) {
        int on = cluster_node_runs_job(srv->db, req->who.node_id, j.id);
        if (on <= 0) {
            exec_job_release(&j);
            if (on < 0) db_unavailable(res);
            else http_error(res, 403, "forbidden", NULL, "node %lld runs no task of job %lld",
                            (long long)req->who.node_id, (long long)j.id);
            return;
        }
    }
    if (j.logs_purged_at) { /* a late post would bring back what the retention removed */
        api_logs_purged_answer(srv, res, j.id, j.logs_purged_at);
        return;
    }
    const char *task = task_query(req, res, 1);
    if (!task) return;
    char path[PATH_MAX + 64];
    if (log_path(srv, j.id, task, path, sizeof path, 1) < 0) {
        http_error(res, 500, "internal", NULL, "cannot create the log directory: %s", strerror(errno));
        return;
    }
    log_admit adm;
    log_admit_decide(srv, &j, req->body.data, req->body.len, &adm);
    size_t nlen = strlen(adm.note), total = adm.take + nlen;
    pthread_mutex_lock(&g_log_lock);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    struct stat sb;
    int64_t off = -1;
    int ok = fd >= 0 && fstat(fd, &sb) == 0;
    if (ok) {
        off = (int64_t)sb.st_size;
        size_t done = 0;
        while (ok && done < total) {
            const char *from = done < adm.take ? req->body.data + done : adm.note + (done - adm.take);
            size_t want = done < adm.take ? adm.take - done : total - done;
            ssize_t w = write(fd, from, want);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) ok = 0;
            else done += (size_t)w;
        }
        if (!ok && ftruncate(fd, (off_t)off) < 0) log_warn("cannot undo a partial log write to %s", path);
    }
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&g_log_lock);
    if (!ok) {
        http_error(res, 500, "internal", NULL, "cannot write the log: %s", strerror(errno));
        return;
    }
    if (total) {
        if (exec_log_chunk_add(srv->db, j.id, task, j.attempt, off, (int64_t)total) != STORE_OK)
            log_warn("job %lld: cannot record a log chunk of %s", (long long)j.id, task);
        else quota_add(srv->db, j.team_id, QUOTA_LOGS, (int64_t)total);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "offset", (double)off);
    cJSON_AddNumberToObject(o, "next_offset", (double)(off + (int64_t)total));
    cJSON_AddNumberToObject(o, "dropped", (double)(req->body.len - adm.take));
    http_json(res, 200, o);
}

/* The X-Next-Offset header of a log read. */
static void next_offset(http_res *res, long long off) {
    snprintf(res->xhdr_name, sizeof res->xhdr_name, "X-Next-Offset");
    snprintf(res->xhdr_value, sizeof res->xhdr_value, "%lld", off);
}

/* GET /api/v1/jobs/{id}/logs?task=worker-0&since=OFFSET&limit=BYTES -> text.
 * The next offset is since + the length of the body, also when the task has
 * written nothing yet (a follower keeps asking from there). */
static void logs_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    if (j.logs_purged_at) { /* a 410 that says when and why, not an empty log */
        api_logs_purged_answer(srv, res, j.id, j.logs_purged_at);
        return;
    }
    const char *task = task_query(req, res, 0);
    if (!task) return;
    long since, limit;
    if (http_query_long(req, res, "since", 0, (long)INT64_MAX, 0, &since) < 0) return;
    if (http_query_long(req, res, "limit", 1, LOG_READ_MAX, LOG_READ_MAX, &limit) < 0) return;
    char path[PATH_MAX + 64];
    if (log_path(srv, j.id, task, path, sizeof path, 0) < 0) {
        http_error(res, 500, "internal", NULL, "log path too long");
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        http_text(res, 200, "text/plain; charset=utf-8", "", 0);
        next_offset(res, since);
        return;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        http_error(res, 500, "internal", NULL, "cannot read the log");
        return;
    }
    size_t n = since >= sb.st_size ? 0 : (size_t)(sb.st_size - since);
    if (n > (size_t)limit) n = (size_t)limit;
    char *b = xmalloc(n + 1);
    ssize_t got = n ? pread(fd, b, n, (off_t)since) : 0;
    close(fd);
    if (got < 0) {
        free(b);
        http_error(res, 500, "internal", NULL, "cannot read the log");
        return;
    }
    http_text(res, 200, "text/plain; charset=utf-8", b, (size_t)got);
    free(b);
    next_offset(res, (long long)since + (long long)got);
}

/* ---------------------------------------------------------------- checkpoints */

static int query_int64(http_req *req, http_res *res, const char *key, int64_t *out) {
    long v;
    if (http_query_long(req, res, key, 0, (long)INT64_MAX, 0, &v) < 0) return -1;
    *out = v;
    return 0;
}

/* PUT /api/v1/jobs/{id}/checkpoints?step=S&epoch=E (X-Checksum-Sha256: HEX) */
static void ckpt_put(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 1, &j) < 0) return;
    int64_t step, epoch;
    if (query_int64(req, res, "step", &step) < 0 || query_int64(req, res, "epoch", &epoch) < 0) goto out;
    const char *want = http_header(req, "X-Checksum-Sha256");
    if (!want) {
        http_error(res, 422, "missing_field", "X-Checksum-Sha256", "the header X-Checksum-Sha256 (hex sha256 of the body) is required");
        goto out;
    }
    if (req->body.len == 0) {
        http_error(res, 422, "invalid_value", "body", "the checkpoint is empty");
        goto out;
    }
    char got[65];
    sha256_hex(req->body.data, req->body.len, got);
    if (strlen(want) != 64 || strcasecmp(want, got) != 0) {
        http_error(res, 422, "checksum_mismatch", "X-Checksum-Sha256",
                   "the body's sha256 is %s, not %.64s; nothing was stored", got, want);
        goto out;
    }
    /* the disk reserve and the team's storage quota: refused whole rather
     * than written half */
    if (api_storage_admit(srv, j.team_id, (int64_t)req->body.len, "checkpoint", 507, res) < 0) goto out;
    int64_t cid = 0;
    if (exec_ckpt_reserve(srv->db, j.id, j.attempt, step, epoch, (int64_t)req->body.len, got, &cid) != STORE_OK) {
        db_unavailable(res);
        goto out;
    }
    char dir[PATH_MAX], rel[256], path[PATH_MAX + 300];
    if (sfmt(dir, sizeof dir, "%s/%lld", srv->checkpoint_dir, (long long)j.id) < 0 ||
        sfmt(rel, sizeof rel, "%lld/%lld.safetensors", (long long)j.id, (long long)cid) < 0 ||
        sfmt(path, sizeof path, "%s/%s", srv->checkpoint_dir, rel) < 0 || mkdir_p(dir, 0700) < 0 ||
        file_write_atomic(path, req->body.data, req->body.len, 0600) < 0) {
        int e = errno;
        exec_ckpt_discard(srv->db, cid);
        http_error(res, 507, "storage_full", NULL, "cannot write the checkpoint: %s", strerror(e));
        goto out;
    }
    /* Record it and prune in one transaction; the files go after the commit. */
    int keep = 3;
    jobspec *spec = xcalloc(1, sizeof *spec);
    spec_error se;
    if (jobspec_parse(j.spec, strlen(j.spec), spec, &se) == 0) {
        keep = spec->checkpoint.keep;
        jobspec_release(spec);
    }
    free(spec);
    if (keep < 1) keep = 1;
    char (*old)[256] = xcalloc(PRUNE_MAX, sizeof *old);
    int nold = 0;
    int rc = db_begin(srv->db) < 0 ? STORE_ERROR : STORE_OK;
    if (rc == STORE_OK) rc = exec_ckpt_publish(srv->db, cid, rel);
    if (rc == STORE_OK) rc = exec_job_checkpointed(srv->db, j.id, now_ms());
    if (rc == STORE_OK) rc = exec_ckpt_prune(srv->db, j.id, keep, old, PRUNE_MAX, &nold);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        free(old);
        unlink(path);
        exec_ckpt_discard(srv->db, cid);
        db_unavailable(res);
        goto out;
    }
    quota_add(srv->db, j.team_id, QUOTA_CHECKPOINTS, (int64_t)req->body.len);
    if (nold) quota_forget(srv->db, j.team_id); /* the pruned ones no longer count */
    for (int i = 0; i < nold; i++) {
        char p[PATH_MAX + 300];
        if (sfmt(p, sizeof p, "%s/%s", srv->checkpoint_dir, old[i]) == 0 && old[i][0] && unlink(p) < 0 &&
            errno != ENOENT)
            log_warn("cannot remove old checkpoint %s: %s", p, strerror(errno));
    }
    free(old);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)cid);
    cJSON_AddStringToObject(o, "sha256", got);
    cJSON_AddNumberToObject(o, "size", (double)req->body.len);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "epoch", (double)epoch);
    cJSON_AddNumberToObject(o, "attempt", j.attempt);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)j.id,
             (long long)cid);
    http_json(res, 201, o);
out:
    exec_job_release(&j);
}

/* The upload's work (a sha256 of up to CKPT_MAX_BODY, the file written and
 * fsynced, its directory fsynced, two transactions) takes milliseconds of
 * disk waits: it runs on the offload thread, so the pool thread's other
 * connections are not held behind it (server/http.h http_offload). */
static void ckpt_put_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, ckpt_put);
}

/* GET /api/v1/jobs/{id}/checkpoints */
static void ckpt_list(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 1, &j) < 0) return;
    cJSON *arr = NULL;
    if (exec_ckpt_list(srv->db, j.id, &arr) != STORE_OK) {
        exec_job_release(&j);
        db_unavailable(res);
        return;
    }
    api_ckpt_mark_best(srv, j.id, j.spec, arr); /* checkpoint.best: the one kept beside the newest */
    exec_job_release(&j);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddItemToObject(o, "checkpoints", arr);
    http_json(res, 200, o);
}

static void ckpt_send(server *srv, http_res *res, int64_t job, int64_t cid) {
    exec_ckpt c;
    int rc = exec_ckpt_get(srv->db, job, cid, &c);
    if (rc == STORE_NOT_FOUND) {
        if (cid) http_error(res, 404, "not_found", NULL, "job %lld has no checkpoint %lld", (long long)job, (long long)cid);
        else http_error(res, 404, "not_found", NULL, "job %lld has no checkpoint yet", (long long)job);
        return;
    }
    if (rc != STORE_OK) {
        db_unavailable(res);
        return;
    }
    char path[PATH_MAX + 300];
    int fd = sfmt(path, sizeof path, "%s/%s", srv->checkpoint_dir, c.path) == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        if (fd >= 0) close(fd);
        http_error(res, 410, "gone", NULL, "the file of checkpoint %lld is missing", (long long)c.id);
        return;
    }
    res->status = 200;
    res->fd = fd;
    res->fd_size = (uint64_t)sb.st_size;
    res->content_type = "application/octet-stream";
    snprintf(res->etag, sizeof res->etag, "%s", c.sha256);
    snprintf(res->disposition, sizeof res->disposition, "attachment; filename=\"job-%lld-checkpoint-%lld.safetensors\"",
             (long long)job, (long long)c.id);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job,
             (long long)c.id);
}

/* GET /api/v1/jobs/{id}/checkpoints/latest */
static void ckpt_latest(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    ckpt_send(srv, res, j.id, 0);
}

/* GET /api/v1/jobs/{id}/checkpoints/{cid} */
static void ckpt_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    int64_t cid = http_param_id(req, res, 1, "checkpoint");
    if (cid < 0) return;
    ckpt_send(srv, res, j.id, cid);
}

/* ---------------------------------------------------------------- rendezvous */

static int valid_key(const char *k) {
    size_t n = strlen(k);
    if (n < 1 || n > 100) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)k[i]) && k[i] != '-' && k[i] != '_' && k[i] != '.' && k[i] != ':') return 0;
    return 1;
}

static const char *rdv_key(http_req *req, http_res *res) {
    const char *k = req->nparams > 1 ? req->params[1] : "";
    if (!valid_key(k)) {
        http_error(res, 400, "invalid_value", "key", "a key is 1-100 characters of A-Z a-z 0-9 - _ . :");
        return NULL;
    }
    return k;
}

/* PUT /api/v1/jobs/{id}/rendezvous/{key} (body: the value, any bytes up to 64 KiB) */
static void rdv_put(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    const char *key = rdv_key(req, res);
    if (!key) return;
    if (req->body.len > RDV_VALUE_MAX) {
        http_error(res, 413, "too_large", NULL, "a rendezvous value is at most %d bytes", RDV_VALUE_MAX);
        return;
    }
    if (exec_rdv_put(srv->db, j.id, j.attempt, key, req->body.data ? req->body.data : "", req->body.len) != STORE_OK) {
        db_unavailable(res);
        return;
    }
    http_wake(srv->http, HTTP_WAKE_RDV, j.id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddNumberToObject(o, "attempt", j.attempt);
    cJSON_AddNumberToObject(o, "size", (double)req->body.len);
    http_json(res, 200, o);
}

/* GET /api/v1/jobs/{id}/rendezvous/{key}?wait=S -> the value as stored
 * (404 when absent after waiting up to S seconds). */
static void rdv_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (job_param(srv, req, res, 0, &j) < 0) return;
    const char *key = rdv_key(req, res);
    if (!key) return;
    long wait;
    if (http_query_long(req, res, "wait", 0, WAIT_MAX_S, 0, &wait) < 0) return;
    if (req->calls == 0) req->keep[0] = mono_ms() + wait * 1000;
    char *v = NULL;
    size_t n = 0;
    int rc = exec_rdv_get(srv->db, j.id, j.attempt, key, &v, &n);
    if (rc == STORE_OK) {
        cJSON *probe = cJSON_ParseWithLength(v, n);
        http_text(res, 200, probe ? "application/json" : "application/octet-stream", v, n);
        cJSON_Delete(probe);
        free(v);
        return;
    }
    if (rc != STORE_NOT_FOUND) {
        db_unavailable(res);
        return;
    }
    if (mono_ms() >= req->keep[0] || srv->stopping) {
        http_error(res, 404, "not_found", "key", "no key '%s' in attempt %d of job %lld", key, j.attempt,
                   (long long)j.id);
        return;
    }
    /* look again in POLL_MS, or at once when a key of this job is put */
    http_wait(req, res, POLL_MS, HTTP_WAKE_RDV, j.id);
}

/* ---------------------------------------------------------------- job view */

int exec_job_decorate(server *srv, int64_t job_id, cJSON *job) {
    char *p = NULL;
    int ok = 1;
    cJSON_DeleteItemFromObject(job, "progress");
    if (exec_progress_get(srv->db, job_id, &p) == STORE_ERROR) ok = 0;
    if (p) store_json_stored(job, "progress", p);
    else cJSON_AddNullToObject(job, "progress");
    free(p);
    const cJSON *a = cJSON_GetObjectItem(job, "attempt");
    cJSON *tasks = NULL;
    if (!cJSON_IsNumber(a) || exec_job_tasks(srv->db, job_id, (int)a->valuedouble, &tasks) != STORE_OK) {
        tasks = cJSON_CreateArray();
        ok = 0;
    }
    cJSON_DeleteItemFromObject(job, "tasks");
    cJSON_AddItemToObject(job, "tasks", tasks);
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- events */

int exec_wants_event_stream(http_req *req) {
    const char *a = http_header(req, "Accept");
    return a && strstr(a, "text/event-stream") != NULL;
}

typedef struct sse {
    server *srv;
    http_req *req;                /* lives as long as the stream */
    int64_t job;
    int64_t after_event;
    int64_t after_seq;
    buf out;                      /* formatted, not yet sent */
    size_t sent;                  /* of out */
    int64_t last_write_ms;
    int finishing;                /* job finished: end after flushing */
} sse;

/* Appends what happened since the last call; 1 when something was added. */
static int sse_fill(sse *s) {
    cJSON *ev = NULL, *ms = NULL;
    int64_t last_seq = 0;
    int added = 0;
    if (store_job_events(s->srv->db, s->job, s->after_event, 100, &ev) == STORE_OK) {
        cJSON *e;
        cJSON_ArrayForEach(e, ev) {
            s->after_event = (int64_t)cJSON_GetObjectItem(e, "id")->valuedouble;
            char *t = json_print(e, NULL);
            if (t) {
                const cJSON *kind = cJSON_GetObjectItem(e, "kind");
                buf_printf(&s->out, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)s->after_event,
                           cJSON_IsString(kind) && strcmp(kind->valuestring, "state") != 0 ? "event" : "state", t);
                free(t);
                added = 1;
            }
        }
        cJSON_Delete(ev);
    }
    if (exec_metrics_list(s->srv->db, s->job, s->after_seq, NULL, 200, &ms, &last_seq) == STORE_OK) {
        cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            s->after_seq = (int64_t)cJSON_GetObjectItem(m, "seq")->valuedouble;
            char *t = json_print(m, NULL);
            if (t) {
                buf_printf(&s->out, "event: metric\ndata: %s\n\n", t);
                free(t);
                added = 1;
            }
        }
        cJSON_Delete(ms);
    }
    if (!added) {
        char state[16];
        if (store_job_state(s->srv->db, s->job, state, NULL) == STORE_OK && store_is_terminal(state)) {
            /* one more look: an event may have landed between the two reads */
            cJSON *more = NULL;
            if (store_job_events(s->srv->db, s->job, s->after_event, 1, &more) == STORE_OK &&
                cJSON_GetArraySize(more) == 0)
                s->finishing = 1;
            cJSON_Delete(more);
        }
    }
    return added;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    sse *s = cls;
    for (;;) {
        if (s->sent < s->out.len) {
            size_t n = s->out.len - s->sent;
            if (n > max) n = max;
            memcpy(out, s->out.data + s->sent, n);
            s->sent += n;
            if (s->sent == s->out.len) {
                buf_reset(&s->out);
                s->sent = 0;
            }
            s->last_write_ms = mono_ms();
            return (ssize_t)n;
        }
        if (s->finishing || s->srv->stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (sse_fill(s)) continue;
        if (s->finishing) continue;
        if (mono_ms() - s->last_write_ms >= 15000) {
            buf_appends(&s->out, ": keep-alive\n\n");
            continue;
        }
        return http_stream_wait(s->req, POLL_MS);
    }
}

static void sse_free(void *cls) {
    sse *s = cls;
    buf_release(&s->out);
    free(s);
}

void exec_events_stream(server *srv, http_req *req, http_res *res, int64_t job_id) {
    long after, since;
    const char *lei = http_header(req, "Last-Event-ID");
    if (http_query_long(req, res, "after", 0, (long)INT64_MAX, 0, &after) < 0) return;
    if (lei && parse_long(lei, 0, (long)INT64_MAX, &after) < 0) after = 0;
    int64_t last_seq = 0;
    if (!http_query(req, "since") && exec_metrics_list(srv->db, job_id, 0, NULL, 0, NULL, &last_seq) != STORE_OK) {
        db_unavailable(res);
        return;
    }
    if (http_query_long(req, res, "since", 0, (long)INT64_MAX, (long)last_seq, &since) < 0) return;
    sse *s = xcalloc(1, sizeof *s);
    s->srv = srv;
    s->req = req;
    s->job = job_id;
    s->after_event = after;
    s->after_seq = since;
    buf_init(&s->out, 8u << 20);
    buf_appends(&s->out, "retry: 2000\n\n");
    s->last_write_ms = mono_ms();
    res->status = 200;
    res->content_type = "text/event-stream";
    res->stream = sse_read;
    res->stream_cls = s;
    res->stream_free = sse_free;
}

/* ---------------------------------------------------------------- routes */

const route api_exec_routes[] = {
    {"GET", "/api/v1/nodes/{id}/assignments", node_assignments, ALLOW_NODE | ALLOW_ADMIN, 0},
    {"POST", "/api/v1/tasks/{id}/status", task_status, ALLOW_NODE | ALLOW_ADMIN, 64 * 1024},
    {"POST", "/api/v1/jobs/{id}/metrics", metrics_post, ALLOW_TASK, 8u << 20},
    {"POST", "/api/v1/jobs/{id}/events", events_post, ALLOW_TASK, 0},
    {"GET", "/api/v1/jobs/{id}/metrics", metrics_get, ALLOW_USER | ALLOW_TASK, 0},
    {"POST", "/api/v1/jobs/{id}/logs", logs_post, ALLOW_NODE | ALLOW_TASK, 0},
    {"GET", "/api/v1/jobs/{id}/logs", logs_get, ALLOW_USER | ALLOW_TASK, 0},
    {"PUT", "/api/v1/jobs/{id}/checkpoints", ckpt_put_offloaded, ALLOW_TASK, CKPT_MAX_BODY},
    {"GET", "/api/v1/jobs/{id}/checkpoints", ckpt_list, ALLOW_USER | ALLOW_TASK, 0},
    {"GET", "/api/v1/jobs/{id}/checkpoints/latest", ckpt_latest, ALLOW_USER | ALLOW_TASK, 0},
    {"GET", "/api/v1/jobs/{id}/checkpoints/{cid}", ckpt_get, ALLOW_USER | ALLOW_TASK, 0},
    {"PUT", "/api/v1/jobs/{id}/rendezvous/{key}", rdv_put, ALLOW_TASK, RDV_VALUE_MAX},
    {"GET", "/api/v1/jobs/{id}/rendezvous/{key}", rdv_get, ALLOW_TASK, 0},
    {NULL, NULL, NULL, 0, 0},
};
