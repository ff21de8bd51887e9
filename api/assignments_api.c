/* assignments_api.c - GET /nodes/{id}/assignments: the long-poll by which an
 * agent is given the tasks to start (each with its token and config) and
 * to stop (docs/api-executors.md). Rows are storage/exec_store.c. A node's
 * token polls for its own node only (scope.h). */
#include "assignments_api.h"
#include "exec_api.h"
#include "exec_common.h"
#include "scope.h"
#include "sweeps_api.h"
#include "../server/server.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define STOP_GRACE_S 10
#define MAX_START 64 /* tasks handed out per answer */

/* ---------------------------------------------------------------- hand-out */

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

void api_assignments_node_registered(int64_t node) {
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
    if (exec_store_task_get(srv->db, task_id, &t) != STORE_OK) goto fail;
    if (exec_store_job_get(srv->db, t.job_id, 1, &j) != STORE_OK) goto fail;
    if (random_token(tok, sizeof tok) < 0) goto fail;
    sha256_hex(tok, strlen(tok), hash);
    if (db_begin(srv->db) < 0) goto fail;
    int rc = exec_store_task_handout(srv->db, task_id, hash);
    if (rc == STORE_OK) rc = store_token_add(srv->db, tok, TOKEN_TASK, j.team_id, t.job_id);
    if (rc == STORE_OK && db_commit(srv->db) < 0) rc = STORE_ERROR;
    if (rc != STORE_OK) {
        db_rollback(srv->db);
        exec_store_job_release(&j);
        if (rc != STORE_CONFLICT) *err = 1;
        return NULL;
    }
    if (exec_store_attempt_cluster(srv->db, t.job_id, t.attempt, &cluster) != STORE_OK ||
        exec_store_task_devices(srv->db, task_id, &devices) != STORE_OK)
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
    exec_store_job_release(&j);
    /* an ASHA trial's worker asks at each rung's end whether it goes on */
    if (api_sweeps_trial_config(srv, t.job_id, cfg) < 0) log_warn("job %lld: cannot read its sweep", (long long)t.job_id);
    return item;
fail:
    cJSON_Delete(cluster);
    cJSON_Delete(devices);
    exec_store_job_release(&j);
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
 * with thousands of agents, a look every EXEC_POLL_MS per poll was most of the
 * server's work (a resume, a handler run and a lookup each; 33,000 a second
 * for 5,000 agents) and, when a wake came during such a look, the task
 * waited for the next look (docs/scheduler.md, "A server for thousands of
 * agents"). TRAINYARD_POLL_RECHECK=query: a look with two queries every
 * EXEC_POLL_MS, as the server once did (bench/cluster's before/after). */
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
    if (http_query_long(req, res, "wait", 0, EXEC_WAIT_MAX_S, 0, &wait) < 0) return;
    int rc = req->calls ? STORE_OK : exec_store_node_exists(srv->db, node);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no node %lld (register with POST /api/v1/nodes)", (long long)node);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
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
    if (exec_store_node_pending(srv->db, node, ids, MAX_START, &n) != STORE_OK ||
        exec_store_node_stopping(srv->db, node, &stop) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    uint64_t h = stop_hash(stop);
    last = mono_ms() >= deadline || srv->stopping;
    cJSON *execs = exec_api_take(node); /* shells asked for in its tasks */
    if (n > 0 || h != sent || last || execs) {
        cJSON *o = cJSON_CreateObject();
        if (execs) cJSON_AddItemToObject(o, "exec", execs);
        cJSON *start = cJSON_AddArrayToObject(o, "start");
        int err = 0;
        for (int i = 0; i < n; i++) {
            cJSON *item = handout(srv, ids[i], &err);
            if (item) cJSON_AddItemToArray(start, item);
        }
        if (err && cJSON_GetArraySize(start) == 0) {
            cJSON_Delete(o);
            cJSON_Delete(stop);
            http_db_unavailable(res);
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
    if (recheck_query_mode() && ms > EXEC_POLL_MS) ms = EXEC_POLL_MS;
    http_wait(req, res, ms, HTTP_WAKE_NODE, node);
}

const route api_assignments_routes[] = {
    {"GET", "/api/v1/nodes/{id}/assignments", node_assignments, ALLOW_NODE | ALLOW_ADMIN, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
