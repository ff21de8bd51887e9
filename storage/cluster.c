/* cluster.c - nodes, devices, tasks, allocations, team shares and failure
 * memory in SQLite. Every statement is prepared through db_prepare. See
 * cluster.h for the contract. */
#include "cluster.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#define GROW(arr, n, cap)                                                   \
    do {                                                                    \
        if ((n) >= (cap)) {                                                 \
            (cap) = (cap) ? (cap) * 2 : 64;                                 \
            (arr) = xrealloc((arr), (size_t)(cap) * sizeof *(arr));         \
        }                                                                   \
    } while (0)

static void col_text(db_stmt *st, int col, char *out, size_t cap)
{
    const char *t = db_col_text(st, col);
    if (sfmt(out, cap, "%s", t ? (const char *)t : "") < 0) out[cap - 1] = '\0';
}

static int exec_stmt(db *d, const char *sql)
{
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) {
        log_error("cluster: %s: %s", sql, db_errmsg(d));
        return -1;
    }
    return 0;
}

/* A statement whose $1 is ids as a PostgreSQL bigint[] literal ({1,2,3},
 * bound as text), prepared and bound: NULL on error. */
static db_stmt *prepare_ids(db *d, const char *sql, const int64_t *ids, int n)
{
    buf b;
    buf_init(&b, (size_t)n * 21 + 8); /* "{", each id and its comma, "}" */
    int bad = buf_appends(&b, "{");
    for (int k = 0; k < n && !bad; k++) bad = buf_printf(&b, "%s%lld", k ? "," : "", (long long)ids[k]);
    db_stmt *st = bad || buf_appends(&b, "}") ? NULL : db_prepare(d, sql);
    if (st) db_bind_text(st, 1, b.data, (int)b.len);
    buf_release(&b);
    return st;
}

/* ================================================================ load
 * One column list and one row reader per table, shared by the full load
 * (cluster_load) and the by-id reads the scheduler's mirror makes
 * (cluster_read_*): a column added to what the pass reads is added here,
 * in the *_COLS list and its row_* function, and both follow. */

/* Moves after every change of a node's state, devices or memory made here
 * (cluster_nodes_version). */
static uint64_t g_nodes_version = 1;

static void nodes_changed(void)
{
    __atomic_add_fetch(&g_nodes_version, 1, __ATOMIC_RELEASE);
}

uint64_t cluster_nodes_version(void)
{
    return __atomic_load_n(&g_nodes_version, __ATOMIC_ACQUIRE);
}

static int64_t hb_kept(const db *d, int64_t node); /* heartbeats kept in memory, below */

static const char SQL_END_READ[] = "COMMIT";

#define NODE_COLS                                                                               \
    "SELECT id, hostname, address, cpu_slots, state, registered_at, last_heartbeat_at, memory_mb," \
    " isolation, runtimes FROM nodes "
static const char SQL_NODES[] = NODE_COLS "ORDER BY id";
static const char SQL_NODE_BY_ID[] = NODE_COLS "WHERE id = ?1";

static void row_node(db_stmt *st, void *out)
{
    cl_node *n = out;
    n->id = db_col_int64(st, 0);
    col_text(st, 1, n->hostname, sizeof n->hostname);
    col_text(st, 2, n->address, sizeof n->address);
    n->cpu_slots = db_col_int(st, 3);
    col_text(st, 4, n->state, sizeof n->state);
    n->registered_at = db_col_int64(st, 5);
    n->last_heartbeat_at = db_col_int64(st, 6);
    n->memory_mb = db_col_int64(st, 7);
    const char *iso = db_col_text(st, 8);
    n->isolation = iso ? xstrdup((const char *)iso) : NULL;
    n->runtimes = cluster_runtimes_bits(db_col_text(st, 9));
}

static const char SQL_NODES_RUNTIME[] =
    "SELECT count(*), coalesce(sum(EXISTS(SELECT 1 FROM json_each(CASE WHEN json_valid(runtimes)"
    " THEN runtimes ELSE '[]' END) WHERE value = ?1)), 0) FROM nodes";
static const char SQL_NODES_RUNTIME_PG[] =
    "SELECT count(*), coalesce(sum(CASE WHEN ty_json_valid(runtimes) AND jsonb_typeof(runtimes::jsonb) = 'array'"
    " AND jsonb_exists(runtimes::jsonb, $1::text) THEN 1 ELSE 0 END), 0) FROM nodes";

int cluster_nodes_with_runtime(db *d, const char *name, int *with, int *all)
{
    *with = *all = 0;
    db_stmt *st = db_prepare2(d, SQL_NODES_RUNTIME, SQL_NODES_RUNTIME_PG);
    if (!st) return -1;
    db_bind_text(st, 1, name, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *all = db_col_int(st, 0);
        *with = db_col_int(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? 0 : -1;
}

int cluster_runtimes_bits(const char *json)
{
    if (!json) return CL_RUNTIME_HOST;
    int bits = 0;
    /* the agent's array as stored: ["host","podman"]; names are whole words */
    if (strstr(json, "\"host\"")) bits |= CL_RUNTIME_HOST;
    if (strstr(json, "\"podman\"")) bits |= CL_RUNTIME_PODMAN;
    return bits ? bits : CL_RUNTIME_HOST;
}

#define DEVICE_COLS                                                        \
    "SELECT d.id, d.node_id, d.kind, d.idx, d.model, d.memory_mb, a.job_id, a.task_id" \
    " FROM devices d LEFT JOIN allocations a ON a.device_id = d.id "
static const char SQL_DEVICES[] = DEVICE_COLS "ORDER BY d.node_id, d.kind, d.idx";
static const char SQL_DEVICE_BY_ID[] = DEVICE_COLS "WHERE d.id = ?1";
static const char SQL_DEVICES_OF_NODE[] = DEVICE_COLS "WHERE d.node_id = ?1 ORDER BY d.kind, d.idx";

static void row_device(db_stmt *st, void *out)
{
    cl_device *v = out;
    v->id = db_col_int64(st, 0);
    v->node_id = db_col_int64(st, 1);
    const char *k = db_col_text(st, 2);
    v->kind = k && strcmp((const char *)k, "gpu") == 0 ? 1 : 0;
    v->idx = db_col_int(st, 3);
    col_text(st, 4, v->model, sizeof v->model);
    v->memory_mb = db_col_int64(st, 5);
    v->job_id = db_col_int64(st, 6);
    v->task_id = db_col_int64(st, 7);
}

/* ports of the tasks holding devices */
#define PORT_COLS "SELECT DISTINCT t.node_id, t.port FROM allocations a JOIN tasks t ON t.id = a.task_id "
static const char SQL_PORTS[] = PORT_COLS "ORDER BY t.node_id, t.port";
/* one node's: the same rows, one per task (the distinct ports, in order,
 * made in C: DISTINCT and ORDER BY here cost SQLite two temporary b-trees
 * per call, and the pass reads the nodes whose tasks changed each time) */
static const char SQL_PORTS_OF_NODE[] =
    "SELECT t.node_id, t.port FROM tasks t WHERE t.node_id = ?1"
    " AND EXISTS(SELECT 1 FROM allocations a WHERE a.task_id = t.id)";

static void row_port(db_stmt *st, void *out)
{
    cl_port *p = out;
    p->node_id = db_col_int64(st, 0);
    p->port = db_col_int(st, 1);
}

/* the memory of live tasks (those holding devices, and evaluators, which hold
 * none), per node and job */
#define MEM_COLS                                                              \
    "SELECT t.node_id, t.job_id, sum(t.memory_mb) FROM tasks t"               \
    " WHERE (t.id IN (SELECT task_id FROM allocations) OR (t.type = 'evaluator' AND t.state != 'exited'))" \
    " AND t.memory_mb > 0 "
static const char SQL_MEM[] = MEM_COLS "GROUP BY t.node_id, t.job_id ORDER BY t.node_id, t.job_id";
/* one node's: each live task's memory, summed per job in C (no temporary
 * b-trees for GROUP BY and ORDER BY) */
static const char SQL_MEM_OF_NODE[] =
    "SELECT t.node_id, t.job_id, t.memory_mb FROM tasks t"
    " WHERE (t.id IN (SELECT task_id FROM allocations) OR (t.type = 'evaluator' AND t.state != 'exited'))"
    " AND t.memory_mb > 0 AND t.node_id = ?1";

static void row_mem(db_stmt *st, void *out)
{
    cl_mem *m = out;
    m->node_id = db_col_int64(st, 0);
    m->job_id = db_col_int64(st, 1);
    m->mb = db_col_int64(st, 2);
}

static const char SQL_TEAMS[] =
    "SELECT id, name, weight, guarantee, quota, usage, usage_at, max_interactive FROM teams ORDER BY id";

static void row_team(db_stmt *st, void *out)
{
    cl_team *t = out;
    t->id = db_col_int64(st, 0);
    col_text(st, 1, t->name, sizeof t->name);
    t->weight = db_col_double(st, 2);
    t->guarantee = db_col_int(st, 3);
    t->quota = db_col_type(st, 4) == DB_NULL ? -1 : db_col_int(st, 4);
    t->usage = db_col_double(st, 5);
    t->usage_at = db_col_int64(st, 6);
    t->max_interactive = db_col_type(st, 7) == DB_NULL ? -1 : db_col_int(st, 7);
}

static const char SQL_USER_USAGE[] =
    "SELECT team_id, user_id, usage, usage_at FROM user_usage ORDER BY team_id, user_id";

static void row_user_usage(db_stmt *st, void *out)
{
    cl_user_usage *u = out;
    u->team_id = db_col_int64(st, 0);
    u->user_id = db_col_int64(st, 1);
    u->usage = db_col_double(st, 2);
    u->usage_at = db_col_int64(st, 3);
}

#define JOB_COLS_HEAD                                                                   \
    "SELECT j.id, j.team_id, j.state, j.priority, j.workers, j.devices_per_worker,"     \
    " j.device, j.ps, j.preemptible, j.queue_if_infeasible, j.attempt, j.max_restarts," \
    " j.max_runtime_s, j.queued_at, j.last_checkpoint_at, j.reason, j.memory_mb,"       \
    " CASE WHEN j.state = 'queued' THEN NULL ELSE (SELECT min(t.created_at) FROM tasks t" \
    "   WHERE t.job_id = j.id AND t.attempt = j.attempt) END,"                          \
    " CASE WHEN j.state = 'queued' THEN 0 WHEN EXISTS(SELECT 1 FROM tasks t"            \
    "   WHERE t.job_id = j.id AND t.attempt = j.attempt AND t.state = 'stopping') THEN 1 ELSE 0 END," \
    " j.workers_min, j.workers_now, j.resize_to,"
#define JOB_COLS                                                                        \
    JOB_COLS_HEAD                                                                       \
    " json_extract(j.spec, '$.environment.image') IS NOT NULL, coalesce(j.user_id, 0),"  \
    " json_extract(j.spec, '$.interactive.type') IS NOT NULL"                           \
    " FROM jobs j "
/* PostgreSQL: a spec whose text lacks the key is not parsed (ty_json_text
 * parses it in a subtransaction: 180 of 250 ms of a 100,000-job load). A key
 * SQLite's json_extract matches is in the text as written, quotes and all
 * (docs/postgres.md, the JSON helpers), so the answer is SQLite's. */
#define JOB_COLS_PG                                                                     \
    JOB_COLS_HEAD                                                                       \
    " CASE WHEN strpos(j.spec, '\"image\"') = 0 THEN false"                              \
    "   ELSE ty_json_text(j.spec, '$.environment.image') IS NOT NULL END,"               \
    " coalesce(j.user_id, 0),"                                                          \
    " CASE WHEN strpos(j.spec, '\"interactive\"') = 0 THEN false"                        \
    "   ELSE ty_json_text(j.spec, '$.interactive.type') IS NOT NULL END"                 \
    " FROM jobs j "
#define JOBS_LIVE_WHERE "WHERE j.state IN ('queued','starting','running') ORDER BY j.id"
#define JOBS_HOLDING_WHERE                                                              \
    "WHERE j.id IN (SELECT DISTINCT job_id FROM allocations)"                           \
    " AND j.state NOT IN ('queued','starting','running') ORDER BY j.id"
#define JOB_BY_ID_WHERE                                                                 \
    "WHERE j.id = ?1 AND (j.state IN ('queued','starting','running')"                   \
    " OR EXISTS(SELECT 1 FROM allocations a WHERE a.job_id = ?1))"
static const char SQL_JOBS_LIVE[] = JOB_COLS JOBS_LIVE_WHERE;
static const char SQL_JOBS_LIVE_PG[] = JOB_COLS_PG JOBS_LIVE_WHERE;
static const char SQL_JOBS_HOLDING[] = JOB_COLS JOBS_HOLDING_WHERE;
static const char SQL_JOBS_HOLDING_PG[] = JOB_COLS_PG JOBS_HOLDING_WHERE;
/* the job when cluster_load has it (live, or holding devices) */
static const char SQL_JOB_BY_ID[] = JOB_COLS JOB_BY_ID_WHERE;
static const char SQL_JOB_BY_ID_PG[] = JOB_COLS_PG JOB_BY_ID_WHERE;

static void row_job(db_stmt *st, void *out)
{
    cl_job *j = out;
    memset(j, 0, sizeof *j);
    j->id = db_col_int64(st, 0);
    j->team_id = db_col_int64(st, 1);
    col_text(st, 2, j->state, sizeof j->state);
    j->priority = db_col_int(st, 3);
    j->workers = db_col_int(st, 4);
    j->devices_per_worker = db_col_int(st, 5);
    const char *dev = db_col_text(st, 6);
    j->kind = dev && strcmp((const char *)dev, "gpu") == 0 ? 1 : 0;
    j->ps = db_col_int(st, 7);
    j->preemptible = db_col_int(st, 8);
    j->queue_if_infeasible = db_col_int(st, 9);
    j->attempt = db_col_int(st, 10);
    j->max_restarts = db_col_int(st, 11);
    j->max_runtime_s = db_col_int64(st, 12);
    j->queued_at = db_col_int64(st, 13);
    j->last_checkpoint_at = db_col_int64(st, 14);
    col_text(st, 15, j->reason, sizeof j->reason);
    j->memory_mb = db_col_int64(st, 16);
    j->attempt_started_at = db_col_int64(st, 17);
    j->stopping = db_col_int(st, 18);
    j->workers_min = db_col_int(st, 19);
    j->workers_now = db_col_int(st, 20);
    j->resize_to = db_col_int(st, 21);
    j->runtime = db_col_int(st, 22) ? CL_RUNTIME_PODMAN : 0;
    j->user_id = db_col_int64(st, 23);
    j->interactive = db_col_int(st, 24);
}

#define AVOID_COLS "SELECT job_id, node_id FROM node_failures WHERE count >= 2 "
static const char SQL_AVOID[] = AVOID_COLS "ORDER BY job_id, node_id";
static const char SQL_AVOID_OF_JOB[] = AVOID_COLS "AND job_id = ?1 ORDER BY node_id";

static void row_avoid(db_stmt *st, void *out)
{
    cl_avoid *a = out;
    a->job_id = db_col_int64(st, 0);
    a->node_id = db_col_int64(st, 1);
}

/* Steps st to its end, appending each row through fn (an element of size
 * sz) to *arr (*n rows, *cap allocated). Resets st. 0 or -1. */
static int read_rows(db_stmt *st, void **arr, int *n, int *cap, size_t sz,
                     void (*fn)(db_stmt *, void *))
{
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        if (*n >= *cap) {
            *cap = *cap ? *cap * 2 : 64;
            *arr = xrealloc(*arr, (size_t)*cap * sz);
        }
        char *e = (char *)*arr + (size_t)*n * sz;
        memset(e, 0, sz);
        fn(st, e);
        (*n)++;
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

#define READ_ROWS(st, arr, n, cap, fn) \
    read_rows((st), (void **)&(arr), &(n), &(cap), sizeof *(arr), (fn))

/* The rows of sql for one id (?1) through fn, into a fresh array: 0, or -1
 * with nothing held. */
static int read_rows_of(db *d, const char *sql, int64_t id, void **arr, int *n, size_t sz,
                        void (*fn)(db_stmt *, void *))
{
    *arr = NULL; *n = 0;
    int cap = 0;
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    db_bind_int64(st, 1, id);
    if (read_rows(st, arr, n, &cap, sz, fn) == 0) return 0;
    free(*arr); *arr = NULL; *n = 0;
    return -1;
}

#define READ_ROWS_OF(d, sql, id, arr, n, fn) read_rows_of((d), (sql), (id), (void **)(arr), (n), sizeof **(arr), (fn))

int cluster_load(db *d, cluster_state *cs)
{
    memset(cs, 0, sizeof *cs);
    int cap;
    db_stmt *st;
    if (db_begin_read(d) < 0) return -1;
    cap = 0;
    if (!(st = db_prepare(d, SQL_NODES)) || READ_ROWS(st, cs->nodes, cs->n_nodes, cap, row_node) < 0) goto fail;
    for (int i = 0; i < cs->n_nodes; i++) { /* heartbeats kept in memory, not yet written */
        int64_t kept = hb_kept(d, cs->nodes[i].id);
        if (kept > cs->nodes[i].last_heartbeat_at) cs->nodes[i].last_heartbeat_at = kept;
    }
    cap = 0;
    if (!(st = db_prepare(d, SQL_DEVICES)) || READ_ROWS(st, cs->devices, cs->n_devices, cap, row_device) < 0)
        goto fail;
    cap = 0;
    if (!(st = db_prepare(d, SQL_PORTS)) || READ_ROWS(st, cs->ports, cs->n_ports, cap, row_port) < 0) goto fail;
    cap = 0;
    if (!(st = db_prepare(d, SQL_MEM)) || READ_ROWS(st, cs->mem, cs->n_mem, cap, row_mem) < 0) goto fail;
    cap = 0;
    if (!(st = db_prepare(d, SQL_TEAMS)) || READ_ROWS(st, cs->teams, cs->n_teams, cap, row_team) < 0) goto fail;
    cap = 0;
    if (!(st = db_prepare(d, SQL_USER_USAGE)) || READ_ROWS(st, cs->uusage, cs->n_uusage, cap, row_user_usage) < 0)
        goto fail;
    cap = 0;
    if (!(st = db_prepare2(d, SQL_JOBS_LIVE, SQL_JOBS_LIVE_PG)) || READ_ROWS(st, cs->jobs, cs->n_jobs, cap, row_job) < 0) goto fail;
    if (!(st = db_prepare2(d, SQL_JOBS_HOLDING, SQL_JOBS_HOLDING_PG)) || READ_ROWS(st, cs->jobs, cs->n_jobs, cap, row_job) < 0)
        goto fail;
    cap = 0;
    if (!(st = db_prepare(d, SQL_AVOID)) || READ_ROWS(st, cs->avoid, cs->n_avoid, cap, row_avoid) < 0) goto fail;
    if (exec_stmt(d, SQL_END_READ) < 0) goto fail;
    return 0;
fail:
    log_error("cluster: load failed: %s", db_errmsg(d));
    db_rollback(d);
    cluster_state_release(cs);
    return -1;
}

/* ---------------------------------------------------------------- by id */

int cluster_read_begin(db *d) { return db_begin_read(d); }

/* ---------------------------------------------------------------- prefetch
 * (cluster.h, cluster_prefetch_*): this thread's rows of each kind, sorted
 * by their key (id, or node id), and the keys asked for (sorted): a key
 * asked for and without a row has none. */
enum { PF_DEVICE, PF_TASK, PF_JOB, PF_PORT, PF_MEM, PF_AVOID, PF_KINDS };
typedef struct pf_task {
    int64_t id, job_id, node_id;
} pf_task;
typedef struct prefetch {
    int on;
    int64_t *keys;
    int n_keys;
    char *rows;
    int n, cap;
    size_t sz;
} prefetch;
static __thread prefetch t_pf[PF_KINDS];

static void pf_clear(int kind)
{
    prefetch *p = &t_pf[kind];
    free(p->keys);
    free(p->rows);
    memset(p, 0, sizeof *p);
}

static void pf_clear_all(void)
{
    for (int k = 0; k < PF_KINDS; k++) pf_clear(k);
}

static int cmp_key(const void *a, const void *b) /* every row starts with its int64 key */
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_key2(const void *a, const void *b) /* avoid rows: by job, then node */
{
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

static void row_pf_task(db_stmt *st, void *out)
{
    pf_task *t = out;
    t->id = db_col_int64(st, 0);
    t->job_id = db_col_int64(st, 1);
    t->node_id = db_col_int64(st, 2);
}

/* The rows of sql ($1: the keys as a bigint[] literal) into kind's store. */
static int pf_fetch(db *d, int kind, const char *sql, const int64_t *keys, int n, size_t sz,
                    void (*fn)(db_stmt *, void *), int (*cmp)(const void *, const void *))
{
    pf_clear(kind);
    if (strcmp(db_engine(d), "postgres") != 0 || n < 2) return 0; /* one by one, as always */
    prefetch *p = &t_pf[kind];
    db_stmt *st = prepare_ids(d, sql, keys, n);
    if (!st) return -1;
    void *rows = NULL;
    if (read_rows(st, &rows, &p->n, &p->cap, sz, fn) < 0) {
        free(rows);
        pf_clear(kind);
        return -1;
    }
    p->rows = rows;
    p->sz = sz;
    if (p->n > 1) qsort(p->rows, (size_t)p->n, sz, cmp);
    p->keys = xmalloc((size_t)n * sizeof *p->keys);
    memcpy(p->keys, keys, (size_t)n * sizeof *p->keys);
    qsort(p->keys, (size_t)n, sizeof *p->keys, cmp_key);
    p->n_keys = n;
    p->on = 1;
    return 0;
}

/* 1 when kind's store answers for key: its rows are *first..+*count (maybe
 * none); 0 when the key was not asked for (query it). */
static int pf_find(int kind, int64_t key, const char **first, int *count)
{
    const prefetch *p = &t_pf[kind];
    if (!p->on || !bsearch(&key, p->keys, (size_t)p->n_keys, sizeof *p->keys, cmp_key)) return 0;
    int lo = 0, hi = p->n; /* the first row with a key >= key */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (*(const int64_t *)(p->rows + (size_t)mid * p->sz) < key) lo = mid + 1;
        else hi = mid;
    }
    int end = lo;
    while (end < p->n && *(const int64_t *)(p->rows + (size_t)end * p->sz) == key) end++;
    *first = p->rows + (size_t)lo * p->sz;
    *count = end - lo;
    return 1;
}

/* A copy of kind's rows for key into a fresh array (*out, *n): 1, or 0
 * when the key was not asked for. */
static int pf_copy(int kind, int64_t key, void **out, int *n)
{
    const char *first;
    int count;
    if (!pf_find(kind, key, &first, &count)) return 0;
    size_t sz = t_pf[kind].sz;
    *out = xmalloc((size_t)(count + 1) * sz);
    if (count) memcpy(*out, first, (size_t)count * sz);
    *n = count;
    return 1;
}

static const char SQL_PF_DEVICES[] = DEVICE_COLS "WHERE d.id = ANY($1::bigint[])";
static const char SQL_PF_TASKS[] = "SELECT id, job_id, node_id FROM tasks WHERE id = ANY($1::bigint[])";
static const char SQL_PF_JOBS[] =
    JOB_COLS_PG "WHERE j.id = ANY($1::bigint[]) AND (j.state IN ('queued','starting','running')"
    " OR EXISTS(SELECT 1 FROM allocations a WHERE a.job_id = j.id))";
static const char SQL_PF_AVOID[] = AVOID_COLS "AND job_id = ANY($1::bigint[])";
static const char SQL_PF_PORTS[] =
    "SELECT t.node_id, t.port FROM tasks t WHERE t.node_id = ANY($1::bigint[])"
    " AND EXISTS(SELECT 1 FROM allocations a WHERE a.task_id = t.id)";
static const char SQL_PF_MEM[] =
    "SELECT t.node_id, t.job_id, t.memory_mb FROM tasks t"
    " WHERE (EXISTS(SELECT 1 FROM allocations a WHERE a.task_id = t.id)"
    " OR (t.type = 'evaluator' AND t.state != 'exited'))"
    " AND t.memory_mb > 0 AND t.node_id = ANY($1::bigint[])";

int cluster_prefetch_devices(db *d, const int64_t *ids, int n)
{
    return pf_fetch(d, PF_DEVICE, SQL_PF_DEVICES, ids, n, sizeof(cl_device), row_device, cmp_key);
}

int cluster_prefetch_tasks(db *d, const int64_t *ids, int n)
{
    return pf_fetch(d, PF_TASK, SQL_PF_TASKS, ids, n, sizeof(pf_task), row_pf_task, cmp_key);
}

int cluster_prefetch_jobs(db *d, const int64_t *ids, int n)
{
    if (pf_fetch(d, PF_JOB, SQL_PF_JOBS, ids, n, sizeof(cl_job), row_job, cmp_key) < 0) return -1;
    return pf_fetch(d, PF_AVOID, SQL_PF_AVOID, ids, n, sizeof(cl_avoid), row_avoid, cmp_key2);
}

int cluster_prefetch_node_use(db *d, const int64_t *node_ids, int n)
{
    if (pf_fetch(d, PF_PORT, SQL_PF_PORTS, node_ids, n, sizeof(cl_port), row_port, cmp_key) < 0) return -1;
    return pf_fetch(d, PF_MEM, SQL_PF_MEM, node_ids, n, sizeof(cl_mem), row_mem, cmp_key);
}

int cluster_read_end(db *d)
{
    pf_clear_all();
    if (exec_stmt(d, SQL_END_READ) == 0) return 0;
    db_rollback(d);
    return -1;
}

/* One row by id: 0 found, 1 none, -1 error. */
static int read_one(db *d, const char *sql, int64_t id, void *out, void (*fn)(db_stmt *, void *))
{
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    db_bind_int64(st, 1, id);
    int rc = db_step(st);
    if (rc == DB_ROW) fn(st, out);
    db_done(st);
    return rc == DB_ROW ? 0 : rc == DB_DONE ? 1 : -1;
}

int cluster_read_node(db *d, int64_t id, cl_node *out)
{
    memset(out, 0, sizeof *out);
    return read_one(d, SQL_NODE_BY_ID, id, out, row_node);
}

int cluster_read_device(db *d, int64_t id, cl_device *out)
{
    memset(out, 0, sizeof *out);
    const char *row;
    int n;
    if (pf_find(PF_DEVICE, id, &row, &n)) {
        if (n) memcpy(out, row, sizeof *out);
        return n ? 0 : 1;
    }
    return read_one(d, SQL_DEVICE_BY_ID, id, out, row_device);
}

int cluster_read_job(db *d, int64_t id, cl_job *out)
{
    const char *row;
    int n;
    if (pf_find(PF_JOB, id, &row, &n)) {
        if (n) memcpy(out, row, sizeof *out);
        return n ? 0 : 1;
    }
    return read_one(d, db_sql(d, SQL_JOB_BY_ID, SQL_JOB_BY_ID_PG), id, out, row_job);
}

int cluster_read_node_devices(db *d, int64_t node_id, cl_device **out, int *n)
{
    return READ_ROWS_OF(d, SQL_DEVICES_OF_NODE, node_id, out, n, row_device);
}

static int cmp_port(const void *a, const void *b)
{
    int x = ((const cl_port *)a)->port, y = ((const cl_port *)b)->port;
    return (x > y) - (x < y);
}

static int cmp_mem_job(const void *a, const void *b)
{
    int64_t x = ((const cl_mem *)a)->job_id, y = ((const cl_mem *)b)->job_id;
    return (x > y) - (x < y);
}

int cluster_read_node_ports(db *d, int64_t node_id, cl_port **out, int *n)
{
    if (!pf_copy(PF_PORT, node_id, (void **)out, n) && READ_ROWS_OF(d, SQL_PORTS_OF_NODE, node_id, out, n, row_port) < 0)
        return -1;
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_port);
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (k == 0 || (*out)[i].port != (*out)[k - 1].port) (*out)[k++] = (*out)[i];
    *n = k;
    return 0;
}

int cluster_read_node_mem(db *d, int64_t node_id, cl_mem **out, int *n)
{
    if (!pf_copy(PF_MEM, node_id, (void **)out, n) && READ_ROWS_OF(d, SQL_MEM_OF_NODE, node_id, out, n, row_mem) < 0)
        return -1;
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_mem_job);
    int k = 0;
    for (int i = 0; i < *n; i++) {
        if (k > 0 && (*out)[i].job_id == (*out)[k - 1].job_id) (*out)[k - 1].mb += (*out)[i].mb;
        else (*out)[k++] = (*out)[i];
    }
    *n = k;
    return 0;
}

int cluster_read_job_avoid(db *d, int64_t job_id, cl_avoid **out, int *n)
{
    if (pf_copy(PF_AVOID, job_id, (void **)out, n)) return 0;
    return READ_ROWS_OF(d, SQL_AVOID_OF_JOB, job_id, out, n, row_avoid);
}

int cluster_read_teams(db *d, cl_team **out, int *n)
{
    *out = NULL; *n = 0;
    int cap = 0;
    db_stmt *st = db_prepare(d, SQL_TEAMS);
    if (!st) return -1;
    if (READ_ROWS(st, *out, *n, cap, row_team) == 0) return 0;
    free(*out); *out = NULL; *n = 0;
    return -1;
}

int cluster_read_user_usage(db *d, cl_user_usage **out, int *n)
{
    *out = NULL; *n = 0;
    int cap = 0;
    db_stmt *st = db_prepare(d, SQL_USER_USAGE);
    if (!st) return -1;
    if (READ_ROWS(st, *out, *n, cap, row_user_usage) == 0) return 0;
    free(*out); *out = NULL; *n = 0;
    return -1;
}

static const char SQL_TASK_JOB[] = "SELECT job_id, node_id FROM tasks WHERE id = ?1";

int cluster_read_task_job(db *d, int64_t task_id, int64_t *job_id, int64_t *node_id)
{
    const char *row;
    int n;
    if (pf_find(PF_TASK, task_id, &row, &n)) {
        if (!n) return 1;
        const pf_task *t = (const pf_task *)row;
        *job_id = t->job_id;
        if (node_id) *node_id = t->node_id;
        return 0;
    }
    db_stmt *st = db_prepare(d, SQL_TASK_JOB);
    if (!st) return -1;
    db_bind_int64(st, 1, task_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *job_id = db_col_int64(st, 0);
        if (node_id) *node_id = db_col_int64(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? 0 : rc == DB_DONE ? 1 : -1;
}

static const char SQL_TASKS_JOBS_PG[] = "SELECT job_id FROM tasks WHERE id = ANY($1::bigint[])";

int cluster_jobs_of_tasks(db *d, const int64_t *tasks, int n, int64_t *jobs)
{
    int k = 0;
    if (n > 1 && cluster_batches_writes(d)) {
        db_stmt *st = prepare_ids(d, SQL_TASKS_JOBS_PG, tasks, n);
        if (!st) return -1;
        int rc;
        while ((rc = db_step(st)) == DB_ROW && k < n) jobs[k++] = db_col_int64(st, 0);
        db_done(st);
        return rc == DB_DONE || rc == DB_ROW ? k : -1;
    }
    for (int x = 0; x < n; x++) {
        int64_t job = 0;
        int rc = cluster_read_task_job(d, tasks[x], &job, NULL);
        if (rc < 0) return -1;
        if (rc == 0) jobs[k++] = job;
    }
    return k;
}

void cluster_state_release(cluster_state *cs)
{
    for (int i = 0; i < cs->n_nodes; i++) free(cs->nodes[i].isolation);
    free(cs->nodes); free(cs->devices); free(cs->ports); free(cs->mem); free(cs->teams);
    free(cs->uusage); free(cs->jobs); free(cs->avoid);
    memset(cs, 0, sizeof *cs);
}

/* ================================================================ nodes */

static const char SQL_NODE_FIND[] = "SELECT id FROM nodes WHERE hostname = ?";
static const char SQL_NODE_INSERT[] =
    "INSERT INTO nodes(hostname, address, cpu_slots, state, registered_at, last_heartbeat_at, memory_mb, isolation,"
    " runtimes) VALUES(?, ?, ?, 'ready', ?, ?, ?, ?, ?) RETURNING id";
static const char SQL_NODE_UPDATE[] =
    "UPDATE nodes SET address = ?2, cpu_slots = ?3, state = 'ready', last_heartbeat_at = ?4,"
    " memory_mb = ?5, isolation = ?6, runtimes = ?7 WHERE id = ?1";
static const char SQL_DEVICE_UPSERT[] =
    "INSERT INTO devices(node_id, kind, idx, model, memory_mb) VALUES(?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT(node_id, kind, idx) DO UPDATE SET model = excluded.model, memory_mb = excluded.memory_mb";
/* devices beyond what the node now reports, unless held */
static const char SQL_DEVICE_PRUNE_CPU[] =
    "DELETE FROM devices WHERE node_id = ?1 AND kind = 'cpu' AND idx >= ?2"
    " AND id NOT IN (SELECT device_id FROM allocations)";
static const char SQL_DEVICE_PRUNE_GPU[] =
    "DELETE FROM devices WHERE node_id = ?1 AND kind = 'gpu' AND idx NOT IN (SELECT value FROM json_each(?2))"
    " AND id NOT IN (SELECT device_id FROM allocations)";
static const char SQL_DEVICE_PRUNE_GPU_PG[] =
    "DELETE FROM devices WHERE node_id = $1 AND kind = 'gpu'"
    " AND idx NOT IN (SELECT jsonb_array_elements_text($2::text::jsonb)::bigint)"
    " AND id NOT IN (SELECT device_id FROM allocations)";

int cluster_node_upsert(db *d, const char *hostname, const char *address, int cpu_slots,
                        int n_gpu, const int *gpu_idx, const char *const *gpu_model,
                        const int64_t *gpu_memory_mb, int64_t memory_mb, const char *isolation,
                        int64_t now, int64_t *id_out, int *created)
{
    return cluster_node_upsert_rt(d, hostname, address, cpu_slots, n_gpu, gpu_idx, gpu_model, gpu_memory_mb,
                                  memory_mb, isolation, NULL, now, id_out, created);
}

int cluster_node_upsert_rt(db *d, const char *hostname, const char *address, int cpu_slots,
                           int n_gpu, const int *gpu_idx, const char *const *gpu_model,
                           const int64_t *gpu_memory_mb, int64_t memory_mb, const char *isolation,
                           const char *runtimes, int64_t now, int64_t *id_out, int *created)
{
    if (db_begin(d) < 0) return -1;
    int64_t id = 0;
    int rc;
    db_stmt *st = db_prepare(d, SQL_NODE_FIND);
    if (!st) goto fail;
    db_bind_text(st, 1, hostname, -1);
    rc = db_step(st);
    if (rc == DB_ROW) id = db_col_int64(st, 0);
    db_done(st);
    if (rc != DB_ROW && rc != DB_DONE) goto fail;
    if (created) *created = id == 0;
    if (id == 0) {
        if (!(st = db_prepare(d, SQL_NODE_INSERT))) goto fail;
        db_bind_text(st, 1, hostname, -1);
        db_bind_text(st, 2, address, -1);
        db_bind_int(st, 3, cpu_slots);
        db_bind_int64(st, 4, now);
        db_bind_int64(st, 5, now);
        db_bind_int64(st, 6, memory_mb);
        if (isolation) db_bind_text(st, 7, isolation, -1);
        if (runtimes) db_bind_text(st, 8, runtimes, -1);
        rc = db_step(st);
        id = rc == DB_ROW ? db_col_int64(st, 0) : 0;
        if (rc == DB_ROW && db_step(st) != DB_DONE) rc = DB_ERR; /* to the end: store_step_id says why */
        db_done(st);
        if (rc != DB_ROW) goto fail;
    } else {
        if (!(st = db_prepare(d, SQL_NODE_UPDATE))) goto fail;
        db_bind_int64(st, 1, id);
        db_bind_text(st, 2, address, -1);
        db_bind_int(st, 3, cpu_slots);
        db_bind_int64(st, 4, now);
        db_bind_int64(st, 5, memory_mb);
        if (isolation) db_bind_text(st, 6, isolation, -1);
        if (runtimes) db_bind_text(st, 7, runtimes, -1);
        rc = db_step(st);
        db_done(st);
        if (rc != DB_DONE) goto fail;
    }
    for (int c = 0; c < cpu_slots; c++) {
        if (!(st = db_prepare(d, SQL_DEVICE_UPSERT))) goto fail;
        db_bind_int64(st, 1, id);
        db_bind_text_static(st, 2, "cpu", -1);
        db_bind_int(st, 3, c);
        rc = db_step(st);
        db_done(st);
        if (rc != DB_DONE) goto fail;
    }
    buf idx;
    buf_init(&idx, 1 << 20);
    int bad = buf_appends(&idx, "[") < 0;
    for (int g = 0; g < n_gpu; g++) {
        bad |= buf_printf(&idx, "%s%d", g ? "," : "", gpu_idx[g]) < 0;
        if (!(st = db_prepare(d, SQL_DEVICE_UPSERT))) { buf_release(&idx); goto fail; }
        db_bind_int64(st, 1, id);
        db_bind_text_static(st, 2, "gpu", -1);
        db_bind_int(st, 3, gpu_idx[g]);
        if (gpu_model && gpu_model[g]) db_bind_text(st, 4, gpu_model[g], -1);
        if (gpu_memory_mb) db_bind_int64(st, 5, gpu_memory_mb[g]);
        rc = db_step(st);
        db_done(st);
        if (rc != DB_DONE) { buf_release(&idx); goto fail; }
    }
    bad |= buf_appends(&idx, "]") < 0;
    if (bad) { buf_release(&idx); goto fail; }
    if (!(st = db_prepare(d, SQL_DEVICE_PRUNE_CPU))) { buf_release(&idx); goto fail; }
    db_bind_int64(st, 1, id);
    db_bind_int(st, 2, cpu_slots);
    rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) { buf_release(&idx); goto fail; }
    if (!(st = db_prepare2(d, SQL_DEVICE_PRUNE_GPU, SQL_DEVICE_PRUNE_GPU_PG))) { buf_release(&idx); goto fail; }
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, idx.data, (int)idx.len);
    rc = db_step(st);
    db_done(st);
    buf_release(&idx);
    if (rc != DB_DONE) goto fail;
    db_change_note(d, DB_CH_NODE, id);
    if (db_commit(d) < 0) goto fail;
    nodes_changed();
    if (id_out) *id_out = id;
    return 0;
fail:
    log_error("cluster: node upsert %s: %s", hostname, db_errmsg(d));
    db_rollback(d);
    return -1;
}

/* Runs an UPDATE ... RETURNING state of one node: 0 with the state in
 * `state` (may be NULL), 1 when no node matched, -1 on a store error. */
static int step_returning_state(db_stmt *st, char state[16])
{
    int rc = db_step(st);
    int found = rc == DB_ROW;
    if (found && state) snprintf(state, 16, "%s", db_col_text(st, 0));
    while (rc == DB_ROW) rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) return -1;
    return found ? 0 : 1;
}

/* ---------------------------------------------------------------- heartbeats
 * Every agent heartbeats every 5 s: 1,000 a second for 5,000 agents. Written
 * one by one, each was a write transaction of its own on an HTTP pool
 * thread (waiting for the write turn behind the scheduler's pass, a WAL
 * append, a commit), and each commit moved the database's generation, so
 * every answer and token the server kept (docs/server.md, "Answers kept
 * until the next commit") was thrown away a thousand times a second.
 *
 * Now a heartbeat of a node that is not lost is a read (the node's state)
 * and an entry in memory (node id -> the newest time heard). The lost-node
 * check (cluster_nodes_mark_lost, the scheduler's upkeep, every pass)
 * reads the kept time of each node whose written one is older than the
 * timeout: lost only if the kept one is too; otherwise the kept time is
 * written then, in its transaction. So the check sees every heartbeat the
 * server answered, the pool threads never wait for the write turn on a
 * heartbeat's account, and a node's row is written about once a timeout
 * (30 s) rather than on every heartbeat (5 s). A lost node that beats is
 * made ready at once, by a write as before. cluster_load shows the kept times
 * (GET /cluster).
 *
 * A crash loses the kept heartbeats not yet written (up to a timeout's
 * worth). That is safe: a heartbeat is no acknowledged work, and a server
 * that starts declares no node lost before a whole heartbeat timeout has
 * passed (the scheduler's node_loss_not_before_ms), by which time every
 * live agent has beaten again.
 *
 * TRAINYARD_HEARTBEAT_WRITE=1 selects the old path (a write transaction per
 * heartbeat), for before/after measurements (bench/cluster). */

typedef struct { int64_t node, at; } hb_slot;

static struct {
    pthread_mutex_t mu;
    const db *owner;       /* the store these times belong to */
    hb_slot *slot;         /* open addressing, node 0 = empty */
    size_t cap, used;      /* cap a power of two; used <= cap / 2 */
} g_hb = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int hb_write_mode(void)
{
    static int mode = -1;
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *e = getenv("TRAINYARD_HEARTBEAT_WRITE");
        m = e && strcmp(e, "1") == 0;
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return m;
}

static size_t hb_hash(int64_t node, size_t cap)
{
    uint64_t x = (uint64_t)node * 0x9e3779b97f4a7c15ULL;
    return (size_t)(x >> 17) & (cap - 1);
}

/* The slot of node (mu held): its own, or the empty one it would take. */
static hb_slot *hb_find(int64_t node)
{
    size_t i = hb_hash(node, g_hb.cap);
    while (g_hb.slot[i].node && g_hb.slot[i].node != node) i = (i + 1) & (g_hb.cap - 1);
    return &g_hb.slot[i];
}

/* Keeps node's newest heartbeat time (mu held). */
static void hb_put(const db *d, int64_t node, int64_t at)
{
    if (g_hb.owner != d) { /* another store (tests open several): its times are not ours */
        g_hb.used = 0;
        if (g_hb.slot) memset(g_hb.slot, 0, g_hb.cap * sizeof *g_hb.slot);
        g_hb.owner = d;
    }
    if ((g_hb.used + 1) * 2 > g_hb.cap) {
        size_t oc = g_hb.cap, nc = oc ? oc * 2 : 1024;
        hb_slot *old = g_hb.slot;
        g_hb.slot = xcalloc(nc, sizeof *g_hb.slot);
        g_hb.cap = nc;
        for (size_t i = 0; i < oc; i++)
            if (old[i].node) *hb_find(old[i].node) = old[i];
        free(old);
    }
    hb_slot *s = hb_find(node);
    if (!s->node) {
        s->node = node;
        s->at = at;
        g_hb.used++;
    } else if (at > s->at) {
        s->at = at;
    }
}

/* A node's kept heartbeat time, 0 when none. */
static int64_t hb_kept(const db *d, int64_t node)
{
    int64_t at = 0;
    pthread_mutex_lock(&g_hb.mu);
    if (g_hb.owner == d && g_hb.used) at = hb_find(node)->at;
    pthread_mutex_unlock(&g_hb.mu);
    return at;
}

static const char SQL_HEARTBEAT_SET[] =
    "UPDATE nodes SET last_heartbeat_at = CASE WHEN last_heartbeat_at > ?2 THEN last_heartbeat_at ELSE ?2 END WHERE id = ?1";

static const char SQL_HEARTBEAT[] =
    "UPDATE nodes SET last_heartbeat_at = ?2, state = CASE WHEN state = 'lost' THEN 'ready' ELSE state END"
    " WHERE id = ?1 RETURNING state";
static const char SQL_NODE_STATE[] = "SELECT state FROM nodes WHERE id = ?";

int cluster_node_heartbeat_state(db *d, int64_t node_id, int64_t now, char state[16])
{
    char cur[16] = "";
    db_stmt *st = db_prepare(d, SQL_NODE_STATE);
    if (!st) return -1;
    db_bind_int64(st, 1, node_id);
    int rc = db_step(st);
    if (rc == DB_ROW) col_text(st, 0, cur, sizeof cur);
    db_done(st);
    if (rc == DB_DONE) return 1;
    if (rc != DB_ROW) return -1;
    int lost = strcmp(cur, "lost") == 0;
    if (!lost && !hb_write_mode()) {
        pthread_mutex_lock(&g_hb.mu);
        hb_put(d, node_id, now);
        pthread_mutex_unlock(&g_hb.mu);
        if (state) snprintf(state, 16, "%s", cur);
        return 0;
    }
    /* the old path, or a lost node heard from again: written at once */
    st = db_prepare(d, SQL_HEARTBEAT);
    if (!st) return -1;
    db_bind_int64(st, 1, node_id);
    db_bind_int64(st, 2, now);
    rc = step_returning_state(st, state);
    if (rc == 0 && lost) nodes_changed();
    return rc;
}

int cluster_node_heartbeat(db *d, int64_t node_id, int64_t now)
{
    return cluster_node_heartbeat_state(d, node_id, now, NULL);
}

static const char SQL_NODE_DRAIN[] =
    "UPDATE nodes SET state = CASE WHEN ?2 THEN 'drained' WHEN state = 'drained' THEN 'ready' ELSE state END"
    " WHERE id = ?1 RETURNING state";
/* PostgreSQL's CASE wants a boolean, not the integer 0/1 bound */
static const char SQL_NODE_DRAIN_PG[] =
    "UPDATE nodes SET state = CASE WHEN $2 <> 0 THEN 'drained' WHEN state = 'drained' THEN 'ready' ELSE state END"
    " WHERE id = $1 RETURNING state";

int cluster_node_drain(db *d, int64_t node_id, int drain, char state[16])
{
    db_stmt *st = db_prepare2(d, SQL_NODE_DRAIN, SQL_NODE_DRAIN_PG);
    if (!st) return -1;
    db_bind_int64(st, 1, node_id);
    db_bind_int(st, 2, drain ? 1 : 0);
    int rc = step_returning_state(st, state);
    if (rc == 0) {
        db_change_note(d, DB_CH_NODE, node_id);
        nodes_changed();
    }
    return rc;
}

/* a draining node whose agent went quiet is lost as a ready one is */
static const char SQL_NODES_STALE[] =
    "SELECT id FROM nodes WHERE state IN ('ready','drained') AND last_heartbeat_at < ?";
static const char SQL_NODE_LOST[] =
    "UPDATE nodes SET state = 'lost' WHERE id = ? AND state IN ('ready','drained')";

static int collect_ids(db_stmt *st, int64_t **ids)
{
    int n = 0, cap = 0, rc;
    *ids = NULL;
    while ((rc = db_step(st)) == DB_ROW) {
        GROW(*ids, n, cap);
        (*ids)[n++] = db_col_int64(st, 0);
    }
    db_done(st);
    if (rc != DB_DONE) { free(*ids); *ids = NULL; return -1; }
    return n;
}

/* The nodes whose written heartbeat is older than `before` are the
 * candidates; one whose kept heartbeat (in memory) is not has its kept time
 * written (so it is no candidate again for about a timeout), the others are
 * lost. So a node's row is written about once a heartbeat timeout, not on
 * each of its heartbeats, and every heartbeat the server answered counts. */
int cluster_nodes_mark_lost(db *d, int64_t before, int64_t **ids)
{
    *ids = NULL;
    db_stmt *st = db_prepare(d, SQL_NODES_STALE);
    if (!st) return -1;
    db_bind_int64(st, 1, before);
    int64_t *stale = NULL;
    int ns = collect_ids(st, &stale);
    if (ns < 0) return -1;
    int n = 0;
    for (int i = 0; i < ns; i++) {
        int64_t at = hb_kept(d, stale[i]);
        int lost = at < before;
        st = db_prepare(d, lost ? SQL_NODE_LOST : SQL_HEARTBEAT_SET);
        if (!st) goto fail;
        db_bind_int64(st, 1, stale[i]);
        if (!lost) db_bind_int64(st, 2, at);
        int rc = db_step(st);
        int changed = db_changes(d);
        db_done(st);
        if (rc != DB_DONE) goto fail;
        if (lost && changed > 0) {
            stale[n++] = stale[i];
            db_change_note(d, DB_CH_NODE, stale[i]);
        }
    }
    if (n > 0) nodes_changed(); /* before the caller's commit: readers keep an older picture at most a second */
    if (n > 0) *ids = stale;
    else free(stale);
    return n;
fail:
    free(stale);
    return -1;
}

/* ================================================================ tasks */

static const char SQL_TASK_INSERT[] =
    "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at, memory_mb, gpus, cpus)"
    " VALUES(?, ?, ?, ?, ?, ?, 'assigned', ?, ?, ?, ?) RETURNING id";
static const char SQL_ALLOC_INSERT[] =
    "INSERT INTO allocations(device_id, task_id, job_id) VALUES(?, ?, ?) ON CONFLICT DO NOTHING";
static const char SQL_JOB_START[] =
    "UPDATE jobs SET attempt = attempt + 1, updated_at = ?2 WHERE id = ?1 AND state = 'starting'"
    " RETURNING attempt";
static const char SQL_JOB_REASON[] = "UPDATE jobs SET reason = ?2 WHERE id = ?1 AND state = 'queued'";
static const char SQL_JOB_RUN_REASON[] =
    "UPDATE jobs SET reason = ?2 WHERE id = ?1 AND state = 'running'";
static const char SQL_TEAM_USAGE[] = "UPDATE teams SET usage = ?2, usage_at = ?3 WHERE id = ?1";

int cluster_task_insert(db *d, int64_t job_id, int attempt, const char *type, int idx,
                        int64_t node_id, int port, int64_t memory_mb, int gpus, int cpus, int64_t now,
                        int64_t *task_id)
{
    db_stmt *st = db_prepare(d, SQL_TASK_INSERT);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    db_bind_text_static(st, 3, type, -1);
    db_bind_int(st, 4, idx);
    db_bind_int64(st, 5, node_id);
    db_bind_int(st, 6, port);
    db_bind_int64(st, 7, now);
    db_bind_int64(st, 8, memory_mb);
    db_bind_int(st, 9, gpus);
    db_bind_int(st, 10, cpus);
    int rc = db_step(st);
    if (rc == DB_ROW) *task_id = db_col_int64(st, 0);
    if (rc == DB_ROW && db_step(st) != DB_DONE) rc = DB_ERR; /* to the end: store_step_id says why */
    db_done(st);
    return rc == DB_ROW ? 0 : -1;
}

int cluster_alloc_insert(db *d, int64_t device_id, int64_t task_id, int64_t job_id)
{
    db_stmt *st = db_prepare(d, SQL_ALLOC_INSERT);
    if (!st) return -1;
    db_bind_int64(st, 1, device_id);
    db_bind_int64(st, 2, task_id);
    db_bind_int64(st, 3, job_id);
    int rc = db_step(st);
    db_done(st);
    if (rc == DB_CONSTRAINT || (rc == DB_DONE && db_changes(d) == 0)) return 1; /* the device is taken */
    return rc == DB_DONE ? 0 : -1;
}

/* The whole start of jobs as one statement: each job (still queued, and
 * its devices all there and free in the statement's snapshot) to
 * 'starting' with its next attempt and size, its timeline's row, its tasks
 * and their devices; a job that is not so is left alone, the others placed.
 * The jobs are $1-$3 (jk: their ordinal), the tasks $6-$13 (with their
 * job's ordinal; k: the task's ordinal), the devices $14 with their task's
 * ordinal $15. A device finds its task through the task's ordinal and
 * (type, idx), unique in an attempt. One row per job placed. */
static const char SQL_PLACE_PG[] =
    "WITH jin AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[]) WITH ORDINALITY"
    " AS jin(id, why, workers, jk)),"
    " v AS (SELECT * FROM unnest($6::bigint[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[],"
    " $11::bigint[], $12::bigint[], $13::bigint[]) WITH ORDINALITY"
    " AS v(jk, type, idx, node_id, port, memory_mb, gpus, cpus, k)),"
    " x AS (SELECT * FROM unnest($14::bigint[], $15::bigint[]) AS x(dev, k)),"
    " bad AS (SELECT DISTINCT v.jk FROM x JOIN v ON v.k = x.k"
    " WHERE NOT EXISTS(SELECT 1 FROM devices WHERE id = x.dev)"
    " OR EXISTS(SELECT 1 FROM allocations WHERE device_id = x.dev)),"
    " j AS (UPDATE jobs SET state = 'starting', reason = jin.why, updated_at = $4, attempt = jobs.attempt + 1,"
    " workers_now = jin.workers, resize_to = 0"
    " FROM jin WHERE jobs.id = jin.id AND jobs.state = 'queued' AND jin.jk NOT IN (SELECT jk FROM bad)"
    " RETURNING jobs.id, jobs.attempt, jin.jk, jin.why),"
    " e AS (INSERT INTO job_events(job_id, ts, kind, from_state, to_state, actor, reason)"
    " SELECT id, $5, 'state', 'queued', 'starting', 'scheduler', why FROM j),"
    " t AS (INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at, memory_mb, gpus, cpus)"
    " SELECT j.id, j.attempt, v.type, v.idx, v.node_id, v.port, 'assigned', $4, v.memory_mb, v.gpus, v.cpus"
    " FROM j JOIN v ON v.jk = j.jk RETURNING id, job_id, type, idx),"
    " a AS (INSERT INTO allocations(device_id, task_id, job_id)"
    " SELECT x.dev, t.id, t.job_id FROM x JOIN v ON v.k = x.k JOIN j ON j.jk = v.jk"
    " JOIN t ON t.job_id = j.id AND t.type = v.type AND t.idx = v.idx RETURNING job_id)"
    " SELECT j.jk, j.attempt, coalesce(tn.n, 0), coalesce(an.n, 0) FROM j"
    " LEFT JOIN (SELECT job_id, count(*) AS n FROM t GROUP BY job_id) AS tn ON tn.job_id = j.id"
    " LEFT JOIN (SELECT job_id, count(*) AS n FROM a GROUP BY job_id) AS an ON an.job_id = j.id";

/* s as an element of a PostgreSQL array literal: quoted, \ and " escaped. */
static int array_text(buf *b, const char *sep, const char *s)
{
    if (buf_appends(b, sep) || buf_appends(b, "\"")) return -1;
    for (const char *p = s; *p; p++) {
        if ((*p == '"' || *p == '\\') && buf_appends(b, "\\")) return -1;
        if (buf_append(b, p, 1)) return -1;
    }
    return buf_appends(b, "\"");
}

int cluster_place_many(db *d, cl_place_job *jobs, int n, int64_t now)
{
    if (!cluster_batches_writes(d)) return -2;
    if (n <= 0) return 0;
    /* the jobs', the tasks' and the devices' columns, each an array literal */
    enum { JID, WHY, WORKERS, TJOB, TYPE, IDX, NODE, PORT, MEM, GPUS, CPUS, DEVS, DEV_TASK, NCOLS };
    buf col[NCOLS];
    int n_task = 0, n_dev = 0, bad = 0;
    for (int c = 0; c < NCOLS; c++) {
        buf_init(&col[c], 1u << 24);
        bad |= buf_appends(&col[c], "{");
    }
    for (int q = 0; q < n && !bad; q++) {
        cl_place_job *pj = &jobs[q];
        pj->attempt = 0;
        if (pj->n_tasks <= 0) bad = 1;
        const char *js = q ? "," : "";
        bad = bad || buf_printf(&col[JID], "%s%lld", js, (long long)pj->job_id) || array_text(&col[WHY], js, pj->why) ||
              buf_printf(&col[WORKERS], "%s%d", js, pj->workers);
        for (int k = 0; k < pj->n_tasks && !bad; k++, n_task++) {
            const cl_place_task *tk = &pj->tasks[k];
            if (strcmp(tk->type, "worker") != 0 && strcmp(tk->type, "ps") != 0) bad = 1;
            const char *sep = n_task ? "," : "";
            bad = bad || buf_printf(&col[TJOB], "%s%d", sep, q + 1) || buf_printf(&col[TYPE], "%s%s", sep, tk->type) ||
                  buf_printf(&col[IDX], "%s%d", sep, tk->idx) ||
                  buf_printf(&col[NODE], "%s%lld", sep, (long long)tk->node_id) ||
                  buf_printf(&col[PORT], "%s%d", sep, tk->port) ||
                  buf_printf(&col[MEM], "%s%lld", sep, (long long)tk->memory_mb) ||
                  buf_printf(&col[GPUS], "%s%d", sep, tk->gpus) || buf_printf(&col[CPUS], "%s%d", sep, tk->cpus);
            for (int x = 0; x < tk->n_devices && !bad; x++, n_dev++)
                bad = buf_printf(&col[DEVS], "%s%lld", n_dev ? "," : "", (long long)tk->devices[x]) ||
                      buf_printf(&col[DEV_TASK], "%s%d", n_dev ? "," : "", n_task + 1);
        }
    }
    for (int c = 0; c < NCOLS && !bad; c++) bad = buf_appends(&col[c], "}");
    db_stmt *st = bad ? NULL : db_prepare(d, SQL_PLACE_PG);
    int rc = DB_ERR, placed = 0, wrong = 0;
    if (st) {
        static const int param[NCOLS] = {1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        for (int c = 0; c < NCOLS; c++) db_bind_text(st, param[c], col[c].data, (int)col[c].len);
        db_bind_int64(st, 4, now);
        db_bind_int64(st, 5, now_ms());
        while ((rc = db_step(st)) == DB_ROW) {
            int q = db_col_int(st, 0) - 1;
            if (q < 0 || q >= n || jobs[q].attempt) { wrong = 1; continue; }
            cl_place_job *pj = &jobs[q];
            int want_dev = 0;
            for (int k = 0; k < pj->n_tasks; k++) want_dev += pj->tasks[k].n_devices;
            pj->attempt = db_col_int(st, 1);
            int64_t made_tasks = db_col_int64(st, 2), made_devs = db_col_int64(st, 3);
            if (pj->attempt <= 0 || made_tasks != pj->n_tasks || made_devs != want_dev) {
                log_error("cluster: job %lld placed with %lld of %d tasks and %lld of %d devices",
                          (long long)pj->job_id, (long long)made_tasks, pj->n_tasks, (long long)made_devs, want_dev);
                wrong = 1;
            }
            placed++;
        }
        db_done(st);
    }
    for (int c = 0; c < NCOLS; c++) buf_release(&col[c]);
    if (rc != DB_DONE || wrong) return -1;
    for (int q = 0; q < n; q++) {
        if (!jobs[q].attempt) continue;
        /* the console's line, as store_job_transition's event gives it */
        int rl = (int)strcspn(jobs[q].why, "\n");
        if (rl > 300) rl = 300;
        db_note(d, "job %lld: queued -> starting (scheduler): %.*s", (long long)jobs[q].job_id, rl, jobs[q].why);
    }
    return placed;
}

int cluster_place(db *d, int64_t job_id, const char *why, int workers, int64_t now, const cl_place_task *tasks,
                  int n_tasks)
{
    if (n_tasks <= 0) return cluster_batches_writes(d) ? -1 : -2;
    cl_place_job pj = {job_id, why, workers, tasks, n_tasks, 0};
    int rc = cluster_place_many(d, &pj, 1, now);
    return rc < 0 ? rc : pj.attempt;
}

int cluster_job_next_attempt(db *d, int64_t job_id, int64_t now)
{
    db_stmt *st = db_prepare(d, SQL_JOB_START);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, now);
    int rc = db_step(st);
    int attempt = rc == DB_ROW ? db_col_int(st, 0) : -1;
    db_done(st);
    return attempt;
}

int cluster_job_set_reason(db *d, int64_t job_id, const char *reason)
{
    db_stmt *st = db_prepare(d, SQL_JOB_REASON);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, reason, -1);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

int cluster_batches_writes(db *d)
{
    return strcmp(db_engine(d), "postgres") == 0;
}

static const char SQL_JOB_REASONS_PG[] =
    "UPDATE jobs SET reason = v.r FROM unnest($1::bigint[], $2::text[]) AS v(id, r)"
    " WHERE jobs.id = v.id AND jobs.state = 'queued'";

int cluster_jobs_set_reasons(db *d, const int64_t *job_ids, const char *const *reasons, int n)
{
    if (n <= 0) return 0;
    if (!cluster_batches_writes(d)) {
        for (int k = 0; k < n; k++)
            if (cluster_job_set_reason(d, job_ids[k], reasons[k]) < 0) return -1;
        return 0;
    }
    /* two array literals: {1,2} and {"a","b \"quoted\""} */
    buf ids, txt;
    buf_init(&ids, (size_t)n * 21 + 8);
    buf_init(&txt, (size_t)n * (2 * CL_REASON_MAX + 3) + 8);
    int bad = buf_appends(&ids, "{") || buf_appends(&txt, "{");
    for (int k = 0; k < n && !bad; k++) {
        bad = buf_printf(&ids, "%s%lld", k ? "," : "", (long long)job_ids[k]) || buf_appends(&txt, k ? ",\"" : "\"");
        for (const char *c = reasons[k]; *c && !bad; c++) {
            if ((*c == '"' || *c == '\\') && buf_append(&txt, "\\", 1)) bad = 1;
            else bad = buf_append(&txt, c, 1);
        }
        if (!bad) bad = buf_appends(&txt, "\"");
    }
    if (bad || buf_appends(&ids, "}") || buf_appends(&txt, "}")) {
        buf_release(&ids);
        buf_release(&txt);
        return -1;
    }
    db_stmt *st = db_prepare(d, SQL_JOB_REASONS_PG);
    int rc = DB_ERR;
    if (st) {
        db_bind_text(st, 1, ids.data, (int)ids.len);
        db_bind_text(st, 2, txt.data, (int)txt.len);
        rc = db_step(st);
        db_done(st);
    }
    buf_release(&ids);
    buf_release(&txt);
    return rc == DB_DONE ? 0 : -1;
}

int cluster_job_set_running_reason(db *d, int64_t job_id, const char *reason)
{
    db_stmt *st = db_prepare(d, SQL_JOB_RUN_REASON);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, reason, -1);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

static const char SQL_JOB_SIZE[] = "UPDATE jobs SET workers_now = ?2, resize_to = ?3 WHERE id = ?1";

int cluster_job_set_size(db *d, int64_t job_id, int workers_now, int resize_to)
{
    db_stmt *st = db_prepare(d, SQL_JOB_SIZE);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, workers_now);
    db_bind_int(st, 3, resize_to);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE && db_changes(d) == 1 ? 0 : -1;
}

int cluster_team_set_usage(db *d, int64_t team_id, double usage, int64_t at)
{
    db_stmt *st = db_prepare(d, SQL_TEAM_USAGE);
    if (!st) return -1;
    db_bind_int64(st, 1, team_id);
    db_bind_double(st, 2, usage);
    db_bind_int64(st, 3, at);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

static const char SQL_USER_USAGE_SET[] =
    "INSERT INTO user_usage(team_id, user_id, usage, usage_at) VALUES (?1, ?2, ?3, ?4)"
    " ON CONFLICT(team_id, user_id) DO UPDATE SET usage = excluded.usage, usage_at = excluded.usage_at";

int cluster_user_set_usage(db *d, int64_t team_id, int64_t user_id, double usage, int64_t at)
{
    db_stmt *st = db_prepare(d, SQL_USER_USAGE_SET);
    if (!st) return -1;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, user_id);
    db_bind_double(st, 3, usage);
    db_bind_int64(st, 4, at);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

static const char SQL_TEAM_SHARES[] =
    "UPDATE teams SET weight = CASE WHEN ?2 > 0 THEN ?2 ELSE weight END,"
    " guarantee = CASE WHEN ?4 THEN ?3 ELSE guarantee END,"
    " quota = CASE WHEN ?6 THEN ?5 ELSE quota END WHERE name = ?1";
/* PostgreSQL's CASE wants a boolean, not the integer 0/1 bound */
static const char SQL_TEAM_SHARES_PG[] =
    "UPDATE teams SET weight = CASE WHEN $2 > 0 THEN $2 ELSE weight END,"
    " guarantee = CASE WHEN $4 <> 0 THEN $3 ELSE guarantee END,"
    " quota = CASE WHEN $6 <> 0 THEN $5 ELSE quota END WHERE name = $1";

int cluster_team_set_shares(db *d, const char *name, double weight, int guarantee, int set_guarantee,
                            int quota, int set_quota)
{
    db_stmt *st = db_prepare2(d, SQL_TEAM_SHARES, SQL_TEAM_SHARES_PG);
    if (!st) return -1;
    db_bind_text(st, 1, name, -1);
    db_bind_double(st, 2, weight);
    db_bind_int(st, 3, guarantee);
    db_bind_int(st, 4, set_guarantee);
    if (quota >= 0) db_bind_int(st, 5, quota);
    db_bind_int(st, 6, set_quota);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return -1;
    return changed == 1 ? 0 : 1;
}

static const char SQL_TEAM_MAX_INTERACTIVE[] = "UPDATE teams SET max_interactive = ?2 WHERE name = ?1";

int cluster_team_set_max_interactive(db *d, const char *name, int max_interactive)
{
    db_stmt *st = db_prepare(d, SQL_TEAM_MAX_INTERACTIVE);
    if (!st) return -1;
    db_bind_text(st, 1, name, -1);
    if (max_interactive >= 0) db_bind_int(st, 2, max_interactive);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return -1;
    return changed == 1 ? 0 : 1;
}

/* ================================================================ failures */

static const char SQL_NODE_TASKS_LOST[] =
    "UPDATE tasks SET state = 'exited', reason = ?2, finished_at = ?3"
    " WHERE node_id = ?1 AND state IN ('assigned','running','stopping')"
    " RETURNING CASE WHEN type = 'evaluator' THEN -job_id ELSE job_id END";
static const char SQL_FAILURE_ADD[] =
    "INSERT INTO node_failures(job_id, node_id, count) VALUES(?1, ?2, 1)"
    " ON CONFLICT(job_id, node_id) DO UPDATE SET count = node_failures.count + 1";
static const char SQL_RELEASE_EXITED[] =
    "DELETE FROM allocations WHERE task_id IN (SELECT id FROM tasks WHERE state = 'exited')";
#define ALL_EXITED                                                                          \
    "SELECT j.id, j.attempt, j.max_restarts,"                                               \
    " (SELECT t.reason FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt"        \
    "   AND t.type != 'evaluator'"                                                          \
    "   AND (t.reason LIKE 'preempted%' OR t.reason LIKE 'resize%' OR t.reason LIKE 'node % lost%'"         \
    "     OR t.reason LIKE 'max_runtime%')"                                                   \
    "   ORDER BY t.id LIMIT 1)"                                                             \
    " FROM jobs j WHERE j.state IN ('starting','running')"                                  \
    " AND EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt)"    \
    " AND NOT EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt" \
    "   AND t.state != 'exited')"
static const char SQL_ALL_EXITED[] = ALL_EXITED;
static const char SQL_ALL_EXITED_OF[] = ALL_EXITED " AND j.id = ?1";
static const char SQL_ALL_EXITED_OF_PG[] = ALL_EXITED " AND j.id = ANY($1::bigint[]) ORDER BY j.id";
static const char SQL_RELEASE_EXITED_TASK[] =
    "DELETE FROM allocations WHERE task_id = ?1 AND EXISTS(SELECT 1 FROM tasks WHERE id = ?1 AND state = 'exited')";
static const char SQL_RELEASE_EXITED_TASKS_PG[] =
    "DELETE FROM allocations a USING tasks t WHERE t.id = ANY($1::bigint[]) AND t.state = 'exited'"
    " AND a.task_id = t.id";


int cluster_node_tasks_lost(db *d, int64_t node_id, const char *reason, int64_t now, int64_t **jobs)
{
    db_stmt *st = db_prepare(d, SQL_NODE_TASKS_LOST);
    if (!st) return -1;
    db_bind_int64(st, 1, node_id);
    db_bind_text(st, 2, reason, -1);
    db_bind_int64(st, 3, now);
    int n = collect_ids(st, jobs);
    if (n <= 1) return n;
    /* distinct job ids */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < m; k++) seen |= (*jobs)[k] == (*jobs)[i];
        if (!seen) (*jobs)[m++] = (*jobs)[i];
    }
    return m;
}

int cluster_failure_add(db *d, int64_t job_id, int64_t node_id)
{
    db_stmt *st = db_prepare(d, SQL_FAILURE_ADD);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, node_id);
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) return -1;
    db_change_note(d, DB_CH_AVOID, job_id);
    return 0;
}

int cluster_release_exited(db *d)
{
    db_stmt *st = db_prepare(d, SQL_RELEASE_EXITED);
    if (!st) return -1;
    int rc = db_step(st);
    int n = db_changes(d);
    db_done(st);
    return rc == DB_DONE ? n : -1;
}

static int reaped_rows(db_stmt *st, cl_reaped **out, int *n, int *cap)
{
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        GROW(*out, *n, *cap);
        cl_reaped *r = &(*out)[(*n)++];
        r->job_id = db_col_int64(st, 0);
        r->attempt = db_col_int(st, 1);
        r->max_restarts = db_col_int(st, 2);
        col_text(st, 3, r->reason, sizeof r->reason);
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

int cluster_jobs_all_exited(db *d, cl_reaped **out)
{
    *out = NULL;
    db_stmt *st = db_prepare(d, SQL_ALL_EXITED);
    if (!st) return -1;
    int n = 0, cap = 0;
    if (reaped_rows(st, out, &n, &cap) < 0) { free(*out); *out = NULL; return -1; }
    return n;
}

int cluster_jobs_all_exited_of(db *d, const int64_t *jobs, int n_jobs, cl_reaped **out)
{
    *out = NULL;
    int n = 0, cap = 0;
    if (n_jobs > 1 && cluster_batches_writes(d)) { /* one statement: the ids in order, as one by one */
        db_stmt *st = prepare_ids(d, SQL_ALL_EXITED_OF_PG, jobs, n_jobs);
        if (!st || reaped_rows(st, out, &n, &cap) < 0) { free(*out); *out = NULL; return -1; }
        return n;
    }
    for (int k = 0; k < n_jobs; k++) {
        db_stmt *st = db_prepare(d, SQL_ALL_EXITED_OF);
        if (!st) { free(*out); *out = NULL; return -1; }
        db_bind_int64(st, 1, jobs[k]);
        if (reaped_rows(st, out, &n, &cap) < 0) { free(*out); *out = NULL; return -1; }
    }
    return n;
}

int cluster_release_exited_tasks(db *d, const int64_t *tasks, int n_tasks)
{
    int freed = 0;
    if (n_tasks > 1 && cluster_batches_writes(d)) {
        db_stmt *st = prepare_ids(d, SQL_RELEASE_EXITED_TASKS_PG, tasks, n_tasks);
        if (!st) return -1;
        int rc = db_step(st);
        freed = (int)db_changes(d);
        db_done(st);
        return rc == DB_DONE ? freed : -1;
    }
    for (int k = 0; k < n_tasks; k++) {
        db_stmt *st = db_prepare(d, SQL_RELEASE_EXITED_TASK);
        if (!st) return -1;
        db_bind_int64(st, 1, tasks[k]);
        int rc = db_step(st);
        freed += db_changes(d);
        db_done(st);
        if (rc != DB_DONE) return -1;
    }
    return freed;
}

/* ================================================================ node tokens */

static const char SQL_NODE_TOKEN_REVOKE[] =
    "UPDATE tokens SET revoked_at = ? WHERE node_id = ? AND kind = 'node' AND revoked_at IS NULL";
static const char SQL_NODE_TOKEN_INSERT[] =
    "INSERT INTO tokens(hash, kind, node_id, created_at) VALUES(?, 'node', ?, ?)";
static const char SQL_JOIN_REVOKE[] =
    "UPDATE tokens SET revoked_at = ? WHERE kind = 'node' AND node_id IS NULL AND revoked_at IS NULL AND hash != ?";
static const char SQL_NODE_HOSTNAME[] = "SELECT hostname FROM nodes WHERE id = ?";
static const char SQL_TASK_NODE[] = "SELECT node_id FROM tasks WHERE id = ?";
static const char SQL_NODE_RUNS_JOB[] = "SELECT 1 FROM tasks WHERE job_id = ? AND node_id = ? LIMIT 1";

static int node_token_revoke(db *d, int64_t node_id, int64_t now)
{
    db_stmt *st = db_prepare(d, SQL_NODE_TOKEN_REVOKE);
    if (!st) return -1;
    db_bind_int64(st, 1, now);
    db_bind_int64(st, 2, node_id);
    int rc = db_step(st);
    int n = db_changes(d);
    db_done(st);
    return rc == DB_DONE ? n : -1;
}

int cluster_node_token_issue(db *d, int64_t node_id, const char *hash, int64_t now)
{
    if (db_begin(d) < 0) return -1;
    if (node_token_revoke(d, node_id, now) < 0) goto fail;
    db_stmt *st = db_prepare(d, SQL_NODE_TOKEN_INSERT);
    if (!st) goto fail;
    db_bind_text(st, 1, hash, -1);
    db_bind_int64(st, 2, node_id);
    db_bind_int64(st, 3, now);
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) goto fail;
    if (db_commit(d) < 0) goto fail;
    return 0;
fail:
    log_error("cluster: node %lld token: %s", (long long)node_id, db_errmsg(d));
    db_rollback(d);
    return -1;
}

int cluster_node_token_revoke(db *d, int64_t node_id, int64_t now, char *hostname, size_t cap)
{
    db_stmt *st = db_prepare(d, SQL_NODE_HOSTNAME);
    if (!st) return -1;
    db_bind_int64(st, 1, node_id);
    int rc = db_step(st);
    if (rc == DB_ROW && hostname) col_text(st, 0, hostname, cap);
    db_done(st);
    if (rc == DB_DONE) return -2;
    if (rc != DB_ROW) return -1;
    return node_token_revoke(d, node_id, now);
}

int cluster_task_node(db *d, int64_t task_id, int64_t *node_id)
{
    db_stmt *st = db_prepare(d, SQL_TASK_NODE);
    if (!st) return -1;
    db_bind_int64(st, 1, task_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *node_id = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? 0 : rc == DB_DONE ? 1 : -1;
}

int cluster_node_runs_job(db *d, int64_t node_id, int64_t job_id)
{
    db_stmt *st = db_prepare(d, SQL_NODE_RUNS_JOB);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, node_id);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}

int cluster_join_tokens_revoke(db *d, const char *keep_hash, int64_t now)
{
    db_stmt *st = db_prepare(d, SQL_JOIN_REVOKE);
    if (!st) return -1;
    db_bind_int64(st, 1, now);
    db_bind_text(st, 2, keep_hash, -1);
    int rc = db_step(st);
    int n = db_changes(d);
    db_done(st);
    return rc == DB_DONE ? n : -1;
}

/* ================================================================ evaluators */

#define EVAL_WANTED_TAIL                                                                \
    " AND EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt)"  \
    " AND NOT EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt" \
    "   AND (t.type = 'evaluator' OR t.state IN ('stopping','exited')))"                 \
    " ORDER BY j.id"
/* The active jobs whose spec names "evaluator": the partial index
 * jobs_evaluator (schema 22), whose predicate the query repeats word for
 * word (both engines match it so); only their specs are parsed. SQLite,
 * without statistics, would take jobs_state and read every active job:
 * INDEXED BY names the index (present: db_open migrates first). */
#define EVAL_WANTED_HEAD(indexed)                                                                          \
    "SELECT j.id, j.attempt, j.memory_mb,"                                                                 \
    " (SELECT t.node_id FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt AND t.type = 'worker'" \
    "   AND t.idx = 0)"                                                                                    \
    " FROM jobs j" indexed " WHERE j.state IN ('starting','running') AND j.spec LIKE '%\"evaluator\"%'"
static const char SQL_EVAL_WANTED[] = EVAL_WANTED_HEAD(" INDEXED BY jobs_evaluator")
    " AND json_valid(j.spec) AND json_extract(j.spec, '$.resources.evaluator') = 1" EVAL_WANTED_TAIL;
/* PostgreSQL: ty_json_* parse in a subtransaction each (42 ms a pass over
 * 5,700 running jobs when every spec was parsed), as JOB_COLS_PG */
static const char SQL_EVAL_WANTED_PG[] = EVAL_WANTED_HEAD("")
    " AND ty_json_valid(j.spec) AND ty_json_num(j.spec, '$.resources.evaluator') = 1" EVAL_WANTED_TAIL;
static const char SQL_EVAL_AVOID[] = "SELECT node_id FROM node_failures WHERE job_id = ? AND count >= 2";
static const char SQL_EVAL_NODES[] =
    "SELECT n.id, n.state = 'ready', n.cpu_slots, n.memory_mb,"
    " (SELECT coalesce(sum(t.memory_mb), 0) FROM tasks t WHERE t.node_id = n.id AND t.state != 'exited'"
    "   AND (t.type = 'evaluator' OR t.id IN (SELECT task_id FROM allocations))), n.hostname"
    " FROM nodes n ORDER BY n.id";
/* An evaluator holds memory on its node but no device (gpus, cpus 0): it
 * runs at idle priority in what the gang leaves, so usage does not bill it. */
static const char SQL_EVAL_INSERT[] =
    "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at, memory_mb, gpus, cpus)"
    " SELECT ?1, ?2, 'evaluator', 0, ?3, 0, 'assigned', ?4, ?5, 0, 0 WHERE EXISTS(SELECT 1 FROM jobs"
    "   WHERE id = ?1 AND attempt = ?2 AND state IN ('starting','running'))"
    " AND NOT EXISTS(SELECT 1 FROM tasks WHERE job_id = ?1 AND attempt = ?2 AND type = 'evaluator')";

int cluster_evaluators_wanted(db *d, cl_eval_want **out)
{
    *out = NULL;
    db_stmt *st = db_prepare2(d, SQL_EVAL_WANTED, SQL_EVAL_WANTED_PG);
    if (!st) return -1;
    int n = 0, cap = 0, rc;
    while ((rc = db_step(st)) == DB_ROW) {
        GROW(*out, n, cap);
        cl_eval_want *w = &(*out)[n++];
        memset(w, 0, sizeof *w);
        w->job_id = db_col_int64(st, 0);
        w->attempt = db_col_int(st, 1);
        w->memory_mb = db_col_int64(st, 2);
        w->chief_node = db_col_int64(st, 3);
    }
    db_done(st);
    for (int i = 0; rc == DB_DONE && i < n; i++) {
        if (!(st = db_prepare(d, SQL_EVAL_AVOID))) { rc = DB_ERR; break; }
        db_bind_int64(st, 1, (*out)[i].job_id);
        while ((rc = db_step(st)) == DB_ROW)
            if ((*out)[i].n_avoid < CL_EVAL_AVOID_MAX)
                (*out)[i].avoid[(*out)[i].n_avoid++] = db_col_int64(st, 0);
        db_done(st);
    }
    if (rc != DB_DONE) { free(*out); *out = NULL; return -1; }
    return n;
}

int cluster_eval_nodes(db *d, cl_eval_node **out)
{
    *out = NULL;
    db_stmt *st = db_prepare(d, SQL_EVAL_NODES);
    if (!st) return -1;
    int n = 0, cap = 0, rc;
    while ((rc = db_step(st)) == DB_ROW) {
        GROW(*out, n, cap);
        cl_eval_node *e = &(*out)[n++];
        e->id = db_col_int64(st, 0);
        e->ready = db_col_int(st, 1);
        e->cpu_slots = db_col_int(st, 2);
        e->memory_mb = db_col_int64(st, 3);
        e->used_mb = db_col_int64(st, 4);
        col_text(st, 5, e->hostname, sizeof e->hostname);
    }
    db_done(st);
    if (rc != DB_DONE) { free(*out); *out = NULL; return -1; }
    return n;
}

int cluster_evaluator_insert(db *d, int64_t job_id, int attempt, int64_t node_id, int64_t memory_mb, int64_t now)
{
    db_stmt *st = db_prepare(d, SQL_EVAL_INSERT);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    db_bind_int64(st, 3, node_id);
    db_bind_int64(st, 4, now);
    db_bind_int64(st, 5, memory_mb);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return -1;
    return changed == 1 ? 0 : 1;
}

static const char SQL_EVENT_EXISTS[] = "SELECT 1 FROM job_events WHERE job_id = ? AND kind = ? AND reason = ? LIMIT 1";

int cluster_event_exists(db *d, int64_t job_id, const char *kind, const char *reason)
{
    db_stmt *st = db_prepare(d, SQL_EVENT_EXISTS);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, kind, -1);
    db_bind_text(st, 3, reason, -1);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}
