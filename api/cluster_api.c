/* cluster_api.c - POST /nodes (register or re-register by hostname, with
 * the join token; answers the node's own token), POST /nodes/{id}/heartbeat,
 * DELETE /nodes/{id}/token (revoke), GET /cluster (nodes, devices, holders,
 * utilisation), GET /queue (the order the scheduler considers jobs, why each
 * waits, estimated starts). A team token sees its own jobs only: another
 * team's holder or queue entry shows without its job id. (A team's shares,
 * PATCH /teams/{name}, are api/teams_api.c's.) */
#include "cluster_api.h"
#include "assignments_api.h"
#include "../storage/exec_store.h"
#include "scheduling.h"
#include "scope.h"
#include "../scheduler/scheduler.h"
#include "../server/server.h"
#include "../storage/cluster.h"
#include "../storage/store.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NODE_MAX_GPUS 64
#define NODE_MAX_TASKS 4096          /* POST /nodes tasks: the ids an agent still runs */
#define NODE_MAX_CPU_SLOTS 4096

static void unavailable(http_res *res)
{
    http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
}

/* An integer field in [lo, hi]: 0, or -1 after answering 422 naming it. */
static int int_field(http_res *res, const cJSON *v, const char *field, long lo, long hi, long *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        http_error(res, 422, "invalid_type", field, "%s must be an integer", field);
        return -1;
    }
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        http_error(res, 422, "invalid_value", field, "%s must be between %ld and %ld", field, lo, hi);
        return -1;
    }
    *out = (long)v->valuedouble;
    return 0;
}

static int str_field(http_res *res, const cJSON *v, const char *field, size_t max, const char **out)
{
    if (!cJSON_IsString(v)) {
        http_error(res, 422, "invalid_type", field, "%s must be a string", field);
        return -1;
    }
    size_t n = strlen(v->valuestring);
    if (n == 0 || n >= max) {
        http_error(res, 422, "invalid_value", field, "%s must be 1 to %zu characters", field, max - 1);
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

/* ================================================================ nodes */

#define NODE_MAX_MEMORY_MB (1LL << 40)
#define ISOLATION_MAX_ENFORCED 16
#define ISOLATION_REASON_MAX 256

static const char *const ISOLATION_MODES[] = {"none", "user", NULL};
static const char *const ISOLATION_CGROUPS[] = {"v1", "v2", "none", NULL};
static const char *const ISOLATION_ENFORCED[] = {"uid", "private_tmp", "hidepid", "memory", "cpu", "pids",
                                                 "devices", NULL};

static int name_in(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return 1;
    return 0;
}

/* A string field that must be one of names: 0, or -1 after answering 422. */
static int enum_field(http_res *res, const cJSON *v, const char *field, const char *const *names,
                      const char *list)
{
    if (!cJSON_IsString(v)) {
        http_error(res, 422, "invalid_type", field, "%s must be a string: %s", field, list);
        return -1;
    }
    if (!name_in(names, v->valuestring)) {
        char got[48];
        size_t n = 0;
        for (const char *p = v->valuestring; *p && n < 40; p++)
            got[n++] = (*p >= 0x20 && *p < 0x7f && *p != '"') ? *p : '?';
        got[n] = '\0';
        http_error(res, 422, "invalid_value", field, "%s must be %s, got \"%s\"", field, list, got);
        return -1;
    }
    return 0;
}

/* The agent's isolation report: {"mode": "none"|"user", "cgroup":
 * "v1"|"v2"|"none", "enforced": [known names], "reason": "..."}. 0, or -1
 * after answering 422 naming the field. */
static int isolation_check(http_res *res, const cJSON *iso)
{
    if (!cJSON_IsObject(iso)) {
        http_error(res, 422, "invalid_type", "isolation", "isolation must be an object");
        return -1;
    }
    int mode = 0;
    for (const cJSON *f = iso->child; f; f = f->next) {
        if (strcmp(f->string, "mode") == 0) {
            if (enum_field(res, f, "isolation.mode", ISOLATION_MODES, "\"none\" or \"user\"") < 0) return -1;
            mode = 1;
        } else if (strcmp(f->string, "cgroup") == 0) {
            if (enum_field(res, f, "isolation.cgroup", ISOLATION_CGROUPS, "\"v1\", \"v2\" or \"none\"") < 0)
                return -1;
        } else if (strcmp(f->string, "enforced") == 0) {
            if (!cJSON_IsArray(f)) {
                http_error(res, 422, "invalid_type", "isolation.enforced", "isolation.enforced must be an array of strings");
                return -1;
            }
            int n = cJSON_GetArraySize(f);
            if (n > ISOLATION_MAX_ENFORCED) {
                http_error(res, 422, "invalid_value", "isolation.enforced",
                           "isolation.enforced has at most %d entries, got %d", ISOLATION_MAX_ENFORCED, n);
                return -1;
            }
            int i = 0;
            for (const cJSON *e = f->child; e; e = e->next, i++) {
                char sub[48];
                snprintf(sub, sizeof sub, "isolation.enforced[%d]", i);
                if (enum_field(res, e, sub, ISOLATION_ENFORCED,
                               "one of uid, private_tmp, hidepid, memory, cpu, pids, devices") < 0)
                    return -1;
                for (const cJSON *p = f->child; p != e; p = p->next)
                    if (strcmp(p->valuestring, e->valuestring) == 0) {
                        http_error(res, 422, "invalid_value", sub, "\"%s\" appears twice in isolation.enforced",
                                   e->valuestring);
                        return -1;
                    }
            }
        } else if (strcmp(f->string, "reason") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "isolation.reason", "isolation.reason must be a string");
                return -1;
            }
            if (strlen(f->valuestring) > ISOLATION_REASON_MAX) {
                http_error(res, 422, "invalid_value", "isolation.reason", "isolation.reason is at most %d bytes, got %zu",
                           ISOLATION_REASON_MAX, strlen(f->valuestring));
                return -1;
            }
        } else {
            char sub[96];
            snprintf(sub, sizeof sub, "isolation.%.60s", f->string);
            http_error(res, 422, "unknown_field", sub,
                       "unknown field '%.60s' (allowed: mode, cgroup, enforced, reason)", f->string);
            return -1;
        }
    }
    if (!mode) {
        http_error(res, 422, "missing_field", "isolation.mode", "isolation.mode is required (\"none\" or \"user\")");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- POST /nodes, by phase
 *
 * The body's fields read and checked, its devices read, the node stored
 * (its handouts reset when it joins again), its own token issued, the
 * answer. One node_join holds what the phases share; a phase returns 0, or
 * -1 after answering. */

typedef struct node_join {
    const char *hostname, *address;
    long cpu_slots, memory_mb;
    const cJSON *devices, *isolation, *tasks, *runtimes;
    char *iso_text, *keep, *rt_text; /* owned (cJSON_free) */
    int idx[NODE_MAX_GPUS];
    const char *model[NODE_MAX_GPUS];
    int64_t mem[NODE_MAX_GPUS];
    int ngpu;
    int64_t id;
    int created;
    char tok[128];                   /* the node's own token */
} node_join;

/* runtimes: what the agent can run a task in, "host", "podman" (an image
 * job's). */
static int join_runtimes(http_res *res, const cJSON *f)
{
    int ri = 0, ok = cJSON_IsArray(f) && cJSON_GetArraySize(f) <= 8;
    for (const cJSON *r = ok ? f->child : NULL; r && ok; r = r->next, ri++)
        ok = cJSON_IsString(r) && (strcmp(r->valuestring, "host") == 0 || strcmp(r->valuestring, "podman") == 0);
    if (!ok) {
        http_error(res, 422, "invalid_value", "runtimes", "runtimes must be an array of \"host\" and \"podman\"");
        return -1;
    }
    return 0;
}

/* tasks: the tasks this agent (not restarted: its token was revoked) still
 * runs. */
static int join_tasks(http_res *res, const cJSON *f)
{
    if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > NODE_MAX_TASKS) {
        http_error(res, 422, cJSON_IsArray(f) ? "invalid_value" : "invalid_type", "tasks",
                   "tasks must be an array of at most %d task ids", NODE_MAX_TASKS);
        return -1;
    }
    int ti = 0;
    for (const cJSON *t = f->child; t; t = t->next, ti++) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 1 || t->valuedouble > 9007199254740991.0 ||
            t->valuedouble != (double)(int64_t)t->valuedouble) {
            char field[32];
            snprintf(field, sizeof field, "tasks[%d]", ti);
            http_error(res, 422, "invalid_value", field, "%s must be a task id (a positive integer)", field);
            return -1;
        }
    }
    return 0;
}

/* The body's fields, in their order; hostname and address required. */
static int join_fields(http_res *res, const cJSON *body, node_join *j)
{
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "hostname") == 0) {
            if (str_field(res, f, "hostname", CL_NAME_MAX, &j->hostname) < 0) return -1;
        } else if (strcmp(f->string, "address") == 0) {
            if (str_field(res, f, "address", CL_NAME_MAX, &j->address) < 0) return -1;
        } else if (strcmp(f->string, "cpu_slots") == 0) {
            if (int_field(res, f, "cpu_slots", 0, NODE_MAX_CPU_SLOTS, &j->cpu_slots) < 0) return -1;
        } else if (strcmp(f->string, "devices") == 0) {
            if (!cJSON_IsArray(f)) {
                http_error(res, 422, "invalid_type", "devices", "devices must be an array");
                return -1;
            }
            j->devices = f;
        } else if (strcmp(f->string, "memory_mb") == 0) {
            if (int_field(res, f, "memory_mb", 0, NODE_MAX_MEMORY_MB, &j->memory_mb) < 0) return -1;
        } else if (strcmp(f->string, "isolation") == 0) {
            if (isolation_check(res, f) < 0) return -1;
            j->isolation = f;
        } else if (strcmp(f->string, "runtimes") == 0) {
            if (join_runtimes(res, f) < 0) return -1;
            j->runtimes = f;
        } else if (strcmp(f->string, "tasks") == 0) {
            if (join_tasks(res, f) < 0) return -1;
            j->tasks = f;
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: hostname, address, cpu_slots, devices, memory_mb, isolation,"
                       " runtimes, tasks)", f->string);
            return -1;
        }
    }
    if (!j->hostname) { http_error(res, 422, "missing_field", "hostname", "hostname is required"); return -1; }
    if (!j->address) { http_error(res, 422, "missing_field", "address", "address is required"); return -1; }
    return 0;
}

/* devices[di] {kind: "gpu", index, model, memory_mb}, added to j's GPUs. */
static int join_device(http_res *res, const cJSON *dv, int di, node_join *j)
{
    char field[64];
    snprintf(field, sizeof field, "devices[%d]", di);
    if (!cJSON_IsObject(dv)) {
        http_error(res, 422, "invalid_type", field, "%s must be an object", field);
        return -1;
    }
    if (j->ngpu >= NODE_MAX_GPUS) {
        http_error(res, 422, "invalid_value", "devices", "at most %d devices per node", NODE_MAX_GPUS);
        return -1;
    }
    long index = -1, memory = 0;
    const char *kind = NULL, *mdl = NULL;
    for (const cJSON *g = dv->child; g; g = g->next) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s.%s", field, g->string);
        if (strcmp(g->string, "kind") == 0) {
            if (str_field(res, g, sub, 16, &kind) < 0) return -1;
        } else if (strcmp(g->string, "index") == 0) {
            if (int_field(res, g, sub, 0, 1023, &index) < 0) return -1;
        } else if (strcmp(g->string, "model") == 0) {
            if (str_field(res, g, sub, CL_NAME_MAX, &mdl) < 0) return -1;
        } else if (strcmp(g->string, "memory_mb") == 0) {
            if (int_field(res, g, sub, 0, 1L << 30, &memory) < 0) return -1;
        } else {
            http_error(res, 422, "unknown_field", sub,
                       "unknown field '%s' (allowed: kind, index, model, memory_mb)", g->string);
            return -1;
        }
    }
    char sub[96];
    snprintf(sub, sizeof sub, "%s.kind", field);
    if (!kind || strcmp(kind, "gpu") != 0) {
        http_error(res, 422, "invalid_value", sub,
                   "%s must be \"gpu\" (CPU capacity is given by cpu_slots)", sub);
        return -1;
    }
    snprintf(sub, sizeof sub, "%s.index", field);
    if (index < 0) { http_error(res, 422, "missing_field", sub, "%s is required", sub); return -1; }
    for (int k = 0; k < j->ngpu; k++)
        if (j->idx[k] == index) {
            http_error(res, 422, "invalid_value", sub, "gpu index %ld appears twice", index);
            return -1;
        }
    j->idx[j->ngpu] = (int)index;
    j->model[j->ngpu] = mdl;
    j->mem[j->ngpu++] = memory;
    return 0;
}

static int join_devices(http_res *res, node_join *j)
{
    int di = 0;
    for (const cJSON *dv = j->devices ? j->devices->child : NULL; dv; dv = dv->next, di++)
        if (join_device(res, dv, di, j) < 0) return -1;
    return 0;
}

/* The node stored, new or by its hostname. An agent that registers again
 * has restarted, or lost its token: tasks handed to it and never reported
 * started are handed out again with new tokens, but those it says it runs
 * (tasks) keep theirs: their workers hold them. */
static int join_store(server *srv, http_res *res, node_join *j)
{
    if (j->isolation && !(j->iso_text = cJSON_PrintUnformatted(j->isolation))) {
        http_error(res, 500, "internal", NULL, "out of memory");
        return -1;
    }
    if (j->runtimes && !(j->rt_text = cJSON_PrintUnformatted(j->runtimes))) {
        http_error(res, 500, "internal", NULL, "out of memory");
        return -1;
    }
    if (cluster_node_upsert_rt(srv->db, j->hostname, j->address, (int)j->cpu_slots, j->ngpu, j->idx, j->model,
                               j->mem, j->memory_mb, j->iso_text, j->rt_text, now_ms(), &j->id, &j->created) < 0) {
        unavailable(res);
        return -1;
    }
    if (j->tasks && !(j->keep = cJSON_PrintUnformatted(j->tasks))) {
        http_error(res, 500, "internal", NULL, "out of memory");
        return -1;
    }
    if (!j->created && exec_store_node_reset_handouts(srv->db, j->id, j->keep ? j->keep : "[]") != STORE_OK) {
        unavailable(res);
        return -1;
    }
    return 0;
}

/* The node's own token, from now on the only one it may use: minted here,
 * shown once, stored hashed; the node's earlier tokens are revoked (an
 * agent that restarts registers again with the join token). */
static int join_token(server *srv, http_res *res, node_join *j)
{
    char hash[65];
    if (random_token(j->tok, sizeof j->tok) < 0) {
        http_error(res, 500, "internal", NULL, "cannot make a random token");
        return -1;
    }
    sha256_hex(j->tok, strlen(j->tok), hash);
    if (cluster_node_token_issue(srv->db, j->id, hash, now_ms()) < 0) {
        unavailable(res);
        return -1;
    }
    return 0;
}

/* The node told to the executors and the scheduler, logged (a warning
 * when its teams are not isolated), and answered: 201 new, 200 again. */
static void join_answer(server *srv, http_res *res, const node_join *j)
{
    api_assignments_node_registered(j->id);
    api_kick_scheduler(srv);
    const cJSON *im = j->isolation ? cJSON_GetObjectItemCaseSensitive(j->isolation, "mode") : NULL;
    int iso_none = cJSON_IsString(im) && strcmp(im->valuestring, "none") == 0;
    char iso_say[64];
    if (!cJSON_IsString(im)) snprintf(iso_say, sizeof iso_say, "isolation not reported");
    else if (iso_none) snprintf(iso_say, sizeof iso_say, "teams are NOT isolated on it");
    else snprintf(iso_say, sizeof iso_say, "tasks isolated (%.40s)", im->valuestring);
    log_msg(iso_none ? LOG_WARN : LOG_INFO, "node %lld (%s, %s) %s: %ld CPU slots, %d GPUs, %lld MiB; %s",
            (long long)j->id, j->hostname, j->address, j->created ? "joined" : "joined again", j->cpu_slots,
            j->ngpu, (long long)j->memory_mb, iso_say);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)j->id);
    cJSON_AddStringToObject(o, "token", j->tok);
    cJSON_AddStringToObject(o, "hostname", j->hostname);
    cJSON_AddNumberToObject(o, "gpus", j->ngpu);
    cJSON_AddNumberToObject(o, "cpu_slots", (double)j->cpu_slots);
    cJSON_AddNumberToObject(o, "memory_mb", (double)j->memory_mb);
    cJSON_AddBoolToObject(o, "created", j->created);
    snprintf(res->location, sizeof res->location, "/api/v1/nodes/%lld", (long long)j->id);
    http_json(res, j->created ? 201 : 200, o);
}

/* POST /api/v1/nodes {"hostname","address","cpu_slots","devices":[{kind,index,model,memory_mb}],
 *                     "memory_mb","isolation","tasks":[ids]} */
static void node_register(server *srv, http_req *req, http_res *res)
{
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    node_join j;
    memset(&j, 0, sizeof j);
    if (join_fields(res, body, &j) == 0 && join_devices(res, &j) == 0 && join_store(srv, res, &j) == 0 &&
        join_token(srv, res, &j) == 0)
        join_answer(srv, res, &j);
    cJSON_free(j.iso_text);
    cJSON_free(j.rt_text);
    cJSON_free(j.keep);
    cJSON_Delete(body);
}

/* POST /api/v1/nodes/{id}/heartbeat */
static void node_heartbeat(server *srv, http_req *req, http_res *res)
{
    int64_t id = http_param_id(req, res, 0, "node");
    if (id < 0) return;
    if (api_node_scope(req, res, id) < 0) return;
    if (http_require_json(req, res) < 0) return; /* its body ({}) is JSON, as on every JSON route */
    char state[16] = "ready";
    int rc = cluster_node_heartbeat_state(srv->db, id, now_ms(), state);
    if (rc < 0) { unavailable(res); return; }
    if (rc > 0) {
        http_error(res, 404, "not_found", NULL, "no node %lld; register with POST /api/v1/nodes", (long long)id);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "state", state);
    http_json(res, 200, o);
}

/* POST /api/v1/nodes/{id}/drain: no new tasks for the node (its agent is
 * stopping, or an admin takes it out of service); DELETE: back in service. */
static void node_drain_set(server *srv, http_req *req, http_res *res, int drain)
{
    int64_t id = http_param_id(req, res, 0, "node");
    if (id < 0) return;
    if (api_node_scope(req, res, id) < 0) return;
    char state[16] = "";
    int rc = cluster_node_drain(srv->db, id, drain, state);
    if (rc < 0) { unavailable(res); return; }
    if (rc > 0) {
        http_error(res, 404, "not_found", NULL, "no node %lld", (long long)id);
        return;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    log_info("node %lld: %s by %s (now %s)", (long long)id, drain ? "drained" : "back in service", actor, state);
    if (!drain) api_kick_scheduler(srv);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "state", state);
    http_json(res, 200, o);
}

static void node_drain(server *srv, http_req *req, http_res *res) { node_drain_set(srv, req, res, 1); }
static void node_undrain(server *srv, http_req *req, http_res *res) { node_drain_set(srv, req, res, 0); }

/* DELETE /api/v1/nodes/{id}/token (admin): revokes the node's tokens; its
 * agent's requests get 401 until it registers again with the join token. */
static void node_token_revoke(server *srv, http_req *req, http_res *res)
{
    int64_t id = http_param_id(req, res, 0, "node");
    if (id < 0) return;
    char hostname[CL_NAME_MAX] = "";
    int n = cluster_node_token_revoke(srv->db, id, now_ms(), hostname, sizeof hostname);
    if (n == -2) {
        http_error(res, 404, "not_found", NULL, "no node %lld", (long long)id);
        return;
    }
    if (n < 0) { unavailable(res); return; }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    log_info("node %lld (%s): %d token(s) revoked by %s", (long long)id, hostname, n, actor);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "hostname", hostname);
    cJSON_AddNumberToObject(o, "revoked", n);
    http_json(res, 200, o);
}

/* ================================================================ cluster */

typedef struct job_team { int64_t id, team; } job_team;
typedef struct job_slots { int64_t id; int slots; } job_slots;

static int job_team_cmp(const void *a, const void *b)
{
    const job_team *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* The team of a job holding devices (0 when unknown), by binary search. */
static int64_t team_of(const job_team *jt, int n, int64_t id)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (jt[mid].id == id) return jt[mid].team;
        if (jt[mid].id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* GET /api/v1/cluster */
static void cluster_get(server *srv, http_req *req, http_res *res)
{
    cluster_state cs;
    if (cluster_load(srv->db, &cs) < 0) { unavailable(res); return; }
    int64_t scope = req->who.kind == TOKEN_ADMIN ? 0 : req->who.team_id;
    job_team *jt = xcalloc((size_t)cs.n_jobs + 1, sizeof *jt);
    for (int j = 0; j < cs.n_jobs; j++) jt[j] = (job_team){cs.jobs[j].id, cs.jobs[j].team_id};
    if (cs.n_jobs > 1) qsort(jt, (size_t)cs.n_jobs, sizeof *jt, job_team_cmp);
    cJSON *o = cJSON_CreateObject();
    cJSON *nodes = cJSON_AddArrayToObject(o, "nodes");
    long tot[2] = {0, 0}, used[2] = {0, 0};
    int64_t mem_tot = 0, mem_used = 0;
    int ready = 0, d = 0, m = 0;
    for (int i = 0; i < cs.n_nodes; i++) {
        const cl_node *n = &cs.nodes[i];
        cJSON *jn = cJSON_CreateObject();
        cJSON_AddNumberToObject(jn, "id", (double)n->id);
        cJSON_AddStringToObject(jn, "hostname", n->hostname);
        cJSON_AddStringToObject(jn, "address", n->address);
        cJSON_AddStringToObject(jn, "state", n->state);
        store_json_time_ms(jn, "registered_at", n->registered_at);
        store_json_time_ms(jn, "last_heartbeat_at", n->last_heartbeat_at);
        int is_ready = strcmp(n->state, "ready") == 0;
        ready += is_ready;
        cJSON *gpus = cJSON_AddArrayToObject(jn, "gpus");
        long ntot[2] = {0, 0}, nused[2] = {0, 0};
        job_slots *held = NULL; /* CPU slot holders of this node */
        int nheld = 0;
        while (d < cs.n_devices && cs.devices[d].node_id < n->id) d++;
        for (; d < cs.n_devices && cs.devices[d].node_id == n->id; d++) {
            const cl_device *v = &cs.devices[d];
            ntot[v->kind]++;
            if (v->job_id) nused[v->kind]++;
            if (v->kind == 0 && v->job_id) {
                int h = 0;
                while (h < nheld && held[h].id != v->job_id) h++;
                if (h == nheld) {
                    held = xrealloc(held, (size_t)(nheld + 1) * sizeof *held);
                    held[nheld++] = (job_slots){v->job_id, 0};
                }
                held[h].slots++;
            }
            if (v->kind != 1) continue;
            cJSON *g = cJSON_CreateObject();
            cJSON_AddNumberToObject(g, "index", v->idx);
            if (v->model[0]) cJSON_AddStringToObject(g, "model", v->model);
            else cJSON_AddNullToObject(g, "model");
            cJSON_AddNumberToObject(g, "memory_mb", (double)v->memory_mb);
            if (!v->job_id) cJSON_AddNullToObject(g, "job");
            else if (!scope || team_of(jt, cs.n_jobs, v->job_id) == scope)
                cJSON_AddNumberToObject(g, "job", (double)v->job_id);
            else cJSON_AddStringToObject(g, "job", "another team");
            cJSON_AddItemToArray(gpus, g);
        }
        /* CPU slots: counts, and the jobs holding them */
        cJSON *cpu = cJSON_AddObjectToObject(jn, "cpu_slots");
        cJSON_AddNumberToObject(cpu, "total", (double)ntot[0]);
        cJSON_AddNumberToObject(cpu, "used", (double)nused[0]);
        cJSON *holders = cJSON_AddArrayToObject(cpu, "holders");
        for (int h = 0; h < nheld; h++) {
            cJSON *x = cJSON_CreateObject();
            if (!scope || team_of(jt, cs.n_jobs, held[h].id) == scope)
                cJSON_AddNumberToObject(x, "job", (double)held[h].id);
            else cJSON_AddStringToObject(x, "job", "another team");
            cJSON_AddNumberToObject(x, "slots", held[h].slots);
            cJSON_AddItemToArray(holders, x);
        }
        free(held);
        cJSON_AddNumberToObject(jn, "gpus_used", (double)nused[1]);
        /* memory: offered, and held by the live tasks placed here */
        int64_t nmem = 0;
        while (m < cs.n_mem && cs.mem[m].node_id < n->id) m++;
        for (; m < cs.n_mem && cs.mem[m].node_id == n->id; m++) nmem += cs.mem[m].mb;
        cJSON_AddNumberToObject(jn, "memory_mb", (double)n->memory_mb);
        cJSON_AddNumberToObject(jn, "memory_used_mb", (double)nmem);
        cJSON *iso = n->isolation ? cJSON_Parse(n->isolation) : NULL;
        if (!iso) {
            iso = cJSON_CreateObject();
            cJSON_AddStringToObject(iso, "mode", "unknown");
        }
        cJSON_AddItemToObject(jn, "isolation", iso);
        cJSON *rts = cJSON_AddArrayToObject(jn, "runtimes");
        if (n->runtimes & CL_RUNTIME_HOST) cJSON_AddItemToArray(rts, cJSON_CreateString("host"));
        if (n->runtimes & CL_RUNTIME_PODMAN) cJSON_AddItemToArray(rts, cJSON_CreateString("podman"));
        if (is_ready) {
            for (int k = 0; k < 2; k++) { tot[k] += ntot[k]; used[k] += nused[k]; }
            mem_tot += n->memory_mb;
            mem_used += nmem;
        }
        cJSON_AddItemToArray(nodes, jn);
    }
    cJSON *u = cJSON_AddObjectToObject(o, "utilisation");
    cJSON_AddNumberToObject(u, "nodes", cs.n_nodes);
    cJSON_AddNumberToObject(u, "nodes_ready", ready);
    cJSON_AddNumberToObject(u, "gpus", (double)tot[1]);
    cJSON_AddNumberToObject(u, "gpus_used", (double)used[1]);
    cJSON_AddNumberToObject(u, "gpu_utilisation", tot[1] ? (double)used[1] / (double)tot[1] : 0);
    cJSON_AddNumberToObject(u, "cpu_slots", (double)tot[0]);
    cJSON_AddNumberToObject(u, "cpu_slots_used", (double)used[0]);
    cJSON_AddNumberToObject(u, "cpu_utilisation", tot[0] ? (double)used[0] / (double)tot[0] : 0);
    cJSON_AddNumberToObject(u, "memory_mb", (double)mem_tot);
    cJSON_AddNumberToObject(u, "memory_used_mb", (double)mem_used);
    /* how requests reach this server: a user can tell a server in the clear */
    cJSON *tr = cJSON_AddObjectToObject(o, "transport");
    cJSON_AddBoolToObject(tr, "tls", srv->tls_cert_pem != NULL);
    cJSON_AddBoolToObject(tr, "insecure_http", !srv->tls_cert_pem && !server_host_is_loopback(srv->opt.host));
    if (srv->tls_ca_pin[0]) cJSON_AddStringToObject(tr, "ca_hash", srv->tls_ca_pin);
    free(jt);
    cluster_state_release(&cs);
    http_json(res, 200, o);
}

/* GET /api/v1/tls/ca (public): the CA of `--tls auto`, which an agent
 * trusts only if its hash is the one it was given (--ca-hash) */
static void tls_ca_get(server *srv, http_req *req, http_res *res) {
    (void)req;
    if (!srv->tls_ca_pem) {
        http_error(res, 404, "not_found", NULL, "this server has no CA of its own to give (it runs without --tls auto)");
        return;
    }
    http_text(res, 200, "application/x-pem-file", srv->tls_ca_pem, strlen(srv->tls_ca_pem));
}

/* ================================================================ queue */

/* GET /api/v1/queue */
static void queue_get(server *srv, http_req *req, http_res *res)
{
    sched_config cfg;
    sched_config_current(&cfg);
    sched_queue_entry *e = NULL;
    int n = 0;
    int64_t now = now_ms();
    if (sched_queue_view(srv->db, &cfg, now, &e, &n) < 0) { unavailable(res); return; }
    int64_t scope = req->who.kind == TOKEN_ADMIN ? 0 : req->who.team_id;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "queued", n);
    cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int k = 0; k < n; k++) {
        if (scope && e[k].team_id != scope) continue;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "position", e[k].rank + 1);
        cJSON_AddNumberToObject(j, "id", (double)e[k].job_id);
        cJSON_AddStringToObject(j, "team", e[k].team);
        cJSON_AddNumberToObject(j, "priority", e[k].priority);
        cJSON_AddNumberToObject(j, "effective_priority", e[k].eff_priority);
        store_json_time_ms(j, "queued_at", e[k].queued_at_ms);
        cJSON_AddStringToObject(j, "reason", e[k].reason);
        store_json_time_ms(j, "estimated_start", e[k].est_start_ms);
        cJSON_AddItemToArray(arr, j);
    }
    free(e);
    http_json(res, 200, o);
}

const route api_cluster_routes[] = {
    {"POST", "/api/v1/nodes", node_register, ALLOW_JOIN | ALLOW_ADMIN, 0, ROLE_NONE},
    {"POST", "/api/v1/nodes/{id}/heartbeat", node_heartbeat, ALLOW_NODE | ALLOW_ADMIN, 0, ROLE_NONE},
    {"DELETE", "/api/v1/nodes/{id}/token", node_token_revoke, ALLOW_ADMIN, 0, ROLE_NONE},
    {"POST", "/api/v1/nodes/{id}/drain", node_drain, ALLOW_NODE | ALLOW_ADMIN, 0, ROLE_NONE},
    {"DELETE", "/api/v1/nodes/{id}/drain", node_undrain, ALLOW_NODE | ALLOW_ADMIN, 0, ROLE_NONE},
    {"GET", "/api/v1/cluster", cluster_get, ALLOW_USER, 0, ROLE_NONE},
    {"GET", "/api/v1/tls/ca", tls_ca_get, ALLOW_NONE, 0, ROLE_NONE},
    {"GET", "/api/v1/queue", queue_get, ALLOW_USER, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
