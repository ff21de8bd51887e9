/* agent.h - `trainyard agent`: one per node. Registers the node's devices
 * (POST /nodes), heartbeats, long-polls its assignments and runs one
 * `trainyard worker` process group per task, shipping the tasks' output to
 * the job's logs and their start and exit to POST /tasks/{id}/status.
 * Server outages are ridden out with backoff; tasks keep running.
 * Contract: docs/api-executors.md; behaviour: docs/executors.md.
 *
 * defines: agent_options, agent_options_default, agent_parse_flags, agent_run,
 *          cmd_agent */
#ifndef TRAINYARD_AGENT_H
#define TRAINYARD_AGENT_H

#include "isolate.h"

#include <limits.h>

typedef struct agent_options {
    char server[512];          /* base URL, e.g. http://127.0.0.1:8080 */
    char token[256];           /* node token */
    int cpu_slots;             /* 0 = the number of online cores */
    char data_root[PATH_MAX];  /* "" = none; else TRAINYARD_DATA_ROOT of workers */
    char hostname[256];        /* "" = gethostname() */
    char address[256];         /* "" = 127.0.0.1 for a loopback server, else hostname */
    int heartbeat_s;           /* default 5 */
    int poll_wait_s;           /* long-poll wait, default 20 */
    int stop_grace_s;          /* grace on the agent's own shutdown, default 10 */
    int worker_nice;           /* nice value of the tasks' processes, 0-19 (default 0;
                                * `trainyard up` uses 10: its server shares the cores) */
    int worker_idle;           /* tasks under SCHED_IDLE (--worker-sched idle; `trainyard up` sets it) */
    char state_file[PATH_MAX]; /* "" = $XDG_RUNTIME_DIR|$TMPDIR|/tmp/trainyard-agent-HASH.json,
                                * HASH of server URL, hostname and uid */
    iso_options iso;           /* --isolation, --task-uids, --task-dir, --task-pids-max, --memory */
    char ca_hash[80];          /* --ca-hash sha256:HEX: fetch the server's CA, trust it if it hashes so */
    char podman[PATH_MAX];     /* --podman: the container runtime for image jobs ("" = podman on PATH;
                                * "none": no images here) */
    char podman_runtime[64];   /* --podman-runtime: podman's OCI runtime ("" its default) */
    char cache_dir[PATH_MAX];  /* --cache-dir: contexts fetched once per node (default
                                * /var/cache/trainyard as root, else $TMPDIR/trainyard-cache-UID) */
    int64_t cache_max_mb;      /* --cache-max-mb: the cache's bound, LRU (default 4096) */
} agent_options;

void agent_options_default(agent_options *o);

/* Parses `agent` flags: 0, 1 after --help, -1 on a bad flag (message on
 * stderr). */
int agent_parse_flags(agent_options *o, int argc, char **argv);

/* Runs until SIGTERM/SIGINT: then stops its tasks (SIGTERM, grace, SIGKILL),
 * reports their exits if it can, and returns 0. Returns 1 when it cannot
 * start (e.g. no binary to run workers with). */
int agent_run(const agent_options *o);

/* `trainyard agent ...` */
int cmd_agent(int argc, char **argv);

#endif
