/* admission.c - whether a parsed job spec may be submitted here, and its
 * jobs row (see admission.h). */
#include "admission.h"

#include <stdio.h>
#include <string.h>

#include "../server/server.h"
#include "../storage/cluster.h"

/* Could any set of ready nodes ever hold this job? 0 yes (or no node has
 * joined yet: it waits), 1 no, with the numbers in msg; -1 store error. */
static int admit(server *srv, const jobspec *spec, char *msg, size_t cap, const char **field) {
    const char *kind = device_kind_name(spec->resources.device);
    /* an elastic job needs its min to run */
    int dpw = spec->resources.devices_per_worker, w = spec->resources.workers_min, ps = spec->resources.ps;
    int64_t mem = spec->resources.memory_mb;
    store_capacity c;
    if (store_cluster_capacity(srv->db, kind, dpw, mem, &c) != STORE_OK) return -1;
    if (c.nodes == 0) return 0;
    if (spec->environment.image[0]) {
        /* an image runs only where the agent has a container runtime */
        int with = 0, all = 0;
        if (cluster_nodes_with_runtime(srv->db, "podman", &with, &all) < 0) return -1;
        if (with == 0) {
            *field = "environment.image";
            snprintf(msg, cap,
                     "no node can run an image: none of the %d node%s has an agent with podman (GET /cluster: "
                     "runtimes); a node needs podman and runc, and its agent running as root",
                     all, all == 1 ? "" : "s");
            return 1;
        }
    }
    if (dpw > c.largest) {
        *field = "resources.devices_per_worker";
        snprintf(msg, cap, "a worker needs %d %s on one node; the largest node has %d", dpw, kind, c.largest);
        return 1;
    }
    if (w * dpw > c.total) {
        *field = "resources.workers";
        snprintf(msg, cap, "the job needs %d %s in all; the cluster has %d", w * dpw, kind, c.total);
        return 1;
    }
    if (w > c.workers_fit) {
        *field = "resources.workers";
        snprintf(msg, cap, "%d workers of %d %s each, every worker on one node: the nodes can hold %d such workers",
                 w, dpw, kind, c.workers_fit);
        return 1;
    }
    /* memory: among the nodes that report it; a node that reports none holds any */
    if (mem > 0 && c.mem_nodes > 0 && c.mem_hold == 0) {
        *field = "resources.memory";
        snprintf(msg, cap, "asks %lld MiB per task; the largest node offers %lld MiB", (long long)mem,
                 (long long)c.mem_largest);
        return 1;
    }
    if (mem > 0 && c.mem_nodes > 0 && w > c.mem_workers_fit) {
        *field = "resources.memory";
        snprintf(msg, cap,
                 "%d workers of %d %s and %lld MiB each, every worker on one node: the nodes can hold %d such workers",
                 w, dpw, kind, (long long)mem, c.mem_workers_fit);
        return 1;
    }
    int cpu_need = ps + (spec->resources.device == DEVICE_CPU ? w * dpw : 0);
    if (ps > 0 && cpu_need > c.cpu_total) {
        *field = "resources.ps";
        snprintf(msg, cap, "the job needs %d cpu slots (workers and parameter servers); the cluster has %d",
                 cpu_need, c.cpu_total);
        return 1;
    }
    return 0;
}

int api_job_admit(server *srv, const jobspec *spec, const char **code, const char **field, char *msg, size_t cap) {
    *code = "invalid_value";
    *field = NULL;
    if (spec->logs.max_mb > srv->opt.log_max_per_job_mb) {
        *field = "logs.max_size";
        snprintf(msg, cap, "logs.max_size may be at most %lld MiB on this server (--log-max-per-job), got %lld MiB",
                 (long long)srv->opt.log_max_per_job_mb, (long long)spec->logs.max_mb);
        return 1;
    }
    char why[256];
    int adm = admit(srv, spec, why, sizeof why, field);
    if (adm < 0) return -1;
    if (adm > 0 && !spec->queue_if_infeasible) {
        *code = "infeasible";
        snprintf(msg, cap,
                 "%s; no registered nodes could ever run it (set \"queue_if_infeasible\": true to queue it "
                 "for nodes that have not joined yet)", why);
        return 1;
    }
    *field = NULL;
    return 0;
}

void api_job_row(const jobspec *spec, store_new_job *row) {
    memset(row, 0, sizeof *row);
    row->name = spec->name;
    row->priority = spec->priority;
    row->max_restarts = spec->max_restarts;
    row->workers = spec->resources.workers;
    row->devices_per_worker = spec->resources.devices_per_worker;
    row->workers_min = jobspec_elastic(spec) ? spec->resources.workers_min : 0;
    row->ps = spec->resources.ps;
    row->device = device_kind_name(spec->resources.device);
    row->strategy = strategy_name(spec->strategy.type);
    row->max_runtime_s = spec->max_runtime_s;
    row->preemptible = spec->preemptible;
    row->queue_if_infeasible = spec->queue_if_infeasible;
    row->memory_mb = spec->resources.memory_mb;
    row->context = spec->command.context[0] ? spec->command.context + 7 : NULL;
}

int api_idempotency_key(http_req *req, http_res *res, const char **key) {
    const char *k = http_header(req, "Idempotency-Key");
    *key = NULL;
    if (!k) return 0;
    size_t n = strlen(k);
    int ok = n >= 1 && n <= 255;
    for (size_t i = 0; ok && i < n; i++)
        if (k[i] <= 0x20 || k[i] >= 0x7f) ok = 0;
    if (!ok) {
        http_error(res, 400, "invalid_value", "Idempotency-Key",
                   "Idempotency-Key must be 1-255 printable ASCII characters without spaces (a UUID)");
        return -1;
    }
    *key = k;
    return 0;
}
