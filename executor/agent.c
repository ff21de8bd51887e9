/* agent.c - `trainyard agent` (see agent.h): a single-threaded poll() loop
 * over the tasks' output pipes and a signal self-pipe, plus one thread that
 * only long-polls GET /nodes/{id}/assignments and hands each answer over
 * through a queue and a wake pipe, and a few threads (ctxfetch.h) that
 * fetch and unpack job contexts, handing each back through the same pipe.
 * Every process is forked from the main thread, so PR_SET_PDEATHSIG ties
 * the workers' lives to the agent's. */
#include "agent.h"
#include "container.h"
#include "ctxfetch.h"
#include "exec_relay.h"
#include "proc.h"
#include "../client/client.h"
#include "../spec/jobspec.h"
#include "../common/flags.h"
#include "../common/util.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef TRAINYARD_CUDA
#include <cuda_runtime_api.h>
#endif

#define AGENT_MAX_TASKS 256
#define LOG_PENDING_MAX (4u << 20)   /* unshipped output kept per task */
#define LOG_BATCH_MAX (1u << 20)     /* bytes per POST /logs */
#define TAIL_KEEP 8192               /* bytes of recent output kept for the exit report */
#define TAIL_LINES 20
#define OUTBOX_MAX 4096
#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 5000
#define AGENT_POLL_REST_MS 20       /* after an answer with entries (poller) */
#define RECENT_MAX 256
#define AGENT_MAX_RELAYS 64         /* shells into tasks at once (exec_relay.h) */

/* ---------------------------------------------------------------- state */

typedef struct task {
    int64_t id, job;
    int attempt, index;
    char name[48];               /* "worker-0": the log stream's name */
    pid_t pid;
    unsigned long long start_ticks; /* /proc start time: tells our pid from a reused one */
    int fd;                      /* read end of the output pipe; -1 once closed */
    int exited;                  /* reaped */
    int status;                  /* wait status when exited */
    int64_t exited_at_ms;
    int stop_sent;               /* SIGTERM sent */
    int64_t kill_at_ms;          /* SIGKILL when still alive then (0 = not armed) */
    int killed;
    char stop_reason[128];
    buf logs;                    /* output not shipped yet */
    long dropped;                /* bytes dropped because logs overflowed */
    int64_t read_since_ms;       /* output read since then (the last time it was all shipped), */
    long read_bytes;             /* for the rate a drop note gives */
    char tail[TAIL_KEEP];        /* the last output, for log_tail */
    size_t tail_len;
    int exit_queued;
    /* parameter_server: a non-chief worker that dies is started again here
     * (the others train on); its environment is kept for that */
    int restartable;
    int restarts;
    char **env;                  /* (NULL-terminated) owned, when restartable */
    iso_task iso;                /* its uid, job directory and cgroup (isolate.h) */
    char ctr_name[128];          /* its container (an image job), "" none */
    char ctx_tmp[PATH_MAX];      /* its copy of the context outside a job directory ("" none) */
    char ctx_dir[PATH_MAX];      /* TRAINYARD_CONTEXT_DIR of its worker ("" none): a shell's too */
    /* a task whose context is made ready (ctxfetch.h) before its worker
     * starts: pid 0, no output pipe, what the start still needs kept */
    ctxf_req *prep;              /* in the pool until it comes back done */
    cJSON *assign;               /* the assignment's entry (owned) */
    char *e_ctr;                 /* TRAINYARD_CONTAINER=... (owned), NULL none */
    /* the job's web ports (spec "ports"): the free port of this node each
     * got, in TRAINYARD_PORT_<NAME> and the running report */
    int n_ports;
    char port_names[JOBSPEC_MAX_PORTS][JOBSPEC_PORT_NAME_MAX];
    int ports[JOBSPEC_MAX_PORTS];
} task;

#define PS_WORKER_RESTARTS 10    /* restarts of one task before its failure counts */

typedef struct outmsg {          /* a status report waiting to be delivered */
    char path[128];
    char *body;
    int64_t exit_of;             /* the task whose exit this reports (0: not an exit) */
} outmsg;

typedef struct recent {          /* a finished task: its exit report, to resend */
    int64_t id;
    char *body;
} recent;

typedef struct agent {
    agent_options opt;
    char exe[PATH_MAX];
    client http;                 /* main thread only */
    int64_t node_id;             /* guarded by mu for the poller */
    char node_token[256];        /* this node's own token from POST /nodes (memory only); guarded by mu */
    int need_register;

    task *tasks[AGENT_MAX_TASKS];
    int n_tasks;

    outmsg outbox[OUTBOX_MAX];
    int out_head, out_len;

    recent recents[RECENT_MAX];
    int n_recent, recent_next;

    isolator iso;                /* what keeps the tasks apart on this node */
    pid_t relays[AGENT_MAX_RELAYS]; /* exec relays running (shells into tasks; not tasks) */
    int n_relays;
    char podman[PATH_MAX];       /* the podman binary when image jobs run here, else "" */
    char cache_dir[PATH_MAX];    /* contexts fetched from the server, by digest */
    ctxf_pool ctx;               /* fetches and unpacks them off this loop */
    char state_path[PATH_MAX];   /* tasks this agent answers for, across its restarts */
    int state_dirty;
    int64_t backoff_ms, down_until_ms;
    int reg_failures;            /* registrations refused in a row */
    int64_t next_hb_ms, next_logs_ms;

    /* poller thread -> main thread */
    pthread_mutex_t mu;
    char **inbox;                /* assignment replies (JSON text) */
    int inbox_len, inbox_cap;
    int wake_r, wake_w;
    volatile int quit;
} agent;

/* ---------------------------------------------------------------- server link */

static void server_ok(agent *a) {
    if (a->backoff_ms) a->next_logs_ms = 0; /* back: what waited is shipped on this turn, not a second later */
    a->backoff_ms = 0;
    a->down_until_ms = 0;
}

static void server_down(agent *a, const char *what, const char *err) {
    if (a->backoff_ms == 0) log_warn("server unreachable (%s: %s); retrying with backoff", what, err);
    a->backoff_ms = a->backoff_ms ? a->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (a->backoff_ms > BACKOFF_MAX_MS) a->backoff_ms = BACKOFF_MAX_MS;
    a->down_until_ms = mono_ms() + a->backoff_ms;
}

static int server_usable(const agent *a) { return mono_ms() >= a->down_until_ms; }

/* One request on the main thread's client. Returns the status (0 = not
 * reached, backoff armed); *body gets the reply body when asked. */
static long agent_call(agent *a, const char *method, const char *path, const char *body, size_t len,
                       const char *ctype, char **out) {
    client_reply r;
    if (out) *out = NULL;
    int was = a->http.cur;
    int rc = client_request(&a->http, method, path, body, len, ctype, &r);
    if (a->http.cur != was && rc == 0)
        log_info("speaking to %s now (%s did not lead or answer)", a->http.url, a->http.urls[was]);
    if (rc < 0) {
        server_down(a, path, r.error);
        client_reply_release(&r);
        return 0;
    }
    long st = r.status;
    if (st >= 500) {
        char e[64];
        snprintf(e, sizeof e, "HTTP %ld", st);
        server_down(a, path, e);
    } else {
        server_ok(a);
    }
    if (out) *out = buf_detach(&r.body, NULL);
    client_reply_release(&r);
    return st;
}

/* Drops trailing newlines (for log lines that quote a reply). */
static const char *trim_nl(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* ---------------------------------------------------------------- devices */

#ifdef TRAINYARD_CUDA
/* The /dev/nvidiaN minor of CUDA device i: the driver lists it by PCI bus
 * id in /proc/driver/nvidia/gpus/BUS/information ("Device Minor: N"); the
 * index itself when that cannot be read. */
static int gpu_minor(int i) {
    char bus[32], path[128];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) != cudaSuccess) return i;
    for (char *c = bus; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", bus);
    size_t len = 0;
    char *s = file_read_all(path, 1 << 14, &len);
    const char *m = s ? strstr(s, "Device Minor:") : NULL;
    int minor = m ? atoi(m + 13) : i;
    free(s);
    return minor;
}
#endif

/* The node's GPUs for POST /nodes; each one's device minor into o (the
 * other GPUs are denied to a task). */
static cJSON *devices_json(iso_options *o) {
    cJSON *arr = cJSON_CreateArray();
    o->n_gpus = 0;
#ifdef TRAINYARD_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0; /* no driver or no GPU: a CPU node */
    for (int i = 0; i < n && i < ISO_MAX_GPUS; i++) {
        o->gpu_minor[i] = gpu_minor(i);
        o->n_gpus = i + 1;
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "kind", "gpu");
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddStringToObject(d, "model", p.name);
        cJSON_AddNumberToObject(d, "memory_mb", (double)(p.totalGlobalMem >> 20));
        cJSON_AddItemToArray(arr, d);
    }
#endif
    return arr;
}

/* A refused registration (4xx, no id): try again later, backing off. */
static void register_refused(agent *a) {
    int64_t d = (int64_t)BACKOFF_MIN_MS << (a->reg_failures < 5 ? a->reg_failures : 5);
    if (d > BACKOFF_MAX_MS) d = BACKOFF_MAX_MS;
    a->reg_failures++;
    a->down_until_ms = mono_ms() + d;
}

/* POST /nodes. 0 when registered (a->node_id set), -1 to retry later. */
static int agent_register(agent *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "hostname", a->opt.hostname);
    cJSON_AddStringToObject(o, "address", a->opt.address);
    cJSON_AddNumberToObject(o, "cpu_slots", a->opt.cpu_slots);
    cJSON *devs = devices_json(&a->iso.opt);
    int n_gpu = cJSON_GetArraySize(devs);
    cJSON_AddItemToObject(o, "devices", devs);
    cJSON_AddNumberToObject(o, "memory_mb", (double)a->iso.memory_mb);
    char *iso = iso_describe(&a->iso);
    cJSON *isoj = cJSON_Parse(iso);
    free(iso);
    if (isoj) cJSON_AddItemToObject(o, "isolation", isoj);
    cJSON *rts = cJSON_AddArrayToObject(o, "runtimes");
    cJSON_AddItemToArray(rts, cJSON_CreateString("host"));
    if (a->podman[0]) cJSON_AddItemToArray(rts, cJSON_CreateString("podman"));
    /* registering again while tasks run (the node's token was revoked): the
     * server keeps their tokens, which their workers hold */
    if (a->n_tasks > 0) {
        cJSON *ids = cJSON_AddArrayToObject(o, "tasks");
        for (int i = 0; ids && i < a->n_tasks; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)a->tasks[i]->id));
    }
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) return -1;
    char *reply = NULL;
    /* Registration uses the join token (--token, DATA/node.token); every
     * other call the node's own token that it answers. */
    snprintf(a->http.token, sizeof a->http.token, "%s", a->opt.token);
    long st = agent_call(a, "POST", "/api/v1/nodes", body, strlen(body), NULL, &reply);
    free(body);
    int rc = -1;
    if (st == 200 || st == 201) {
        cJSON *r = cJSON_Parse(reply ? reply : "");
        cJSON *id = r ? cJSON_GetObjectItem(r, "id") : NULL;
        cJSON *tok = r ? cJSON_GetObjectItem(r, "token") : NULL;
        if (cJSON_IsNumber(id) && id->valuedouble > 0 && id->valuedouble <= 9007199254740992.0) {
            pthread_mutex_lock(&a->mu);
            a->node_id = (int64_t)id->valuedouble;
            if (cJSON_IsString(tok) && tok->valuestring[0] && strlen(tok->valuestring) < sizeof a->node_token)
                snprintf(a->node_token, sizeof a->node_token, "%s", tok->valuestring);
            else
                a->node_token[0] = '\0'; /* a server without per-node tokens: keep the one given */
            pthread_mutex_unlock(&a->mu);
            a->need_register = 0;
            a->reg_failures = 0;
            log_info("registered as node %lld (%s, %d CPU slots, %d GPUs) with %s", (long long)a->node_id,
                     a->opt.hostname, a->opt.cpu_slots, n_gpu, a->opt.server);
            rc = 0;
        } else {
            log_error("POST /nodes answered %ld without an id", st);
            register_refused(a);
        }
        cJSON_Delete(r);
    } else if (st) {
        log_error("POST /nodes answered %ld: %.300s", st, reply ? trim_nl(reply) : "");
        if (st == 401 || st == 403) log_error("is --token the node token (DATA/node.token)?");
        register_refused(a);
    }
    free(reply);
    snprintf(a->http.token, sizeof a->http.token, "%s", a->node_token[0] ? a->node_token : a->opt.token);
    return rc;
}

static void agent_heartbeat(agent *a) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/heartbeat", (long long)a->node_id);
    long st = agent_call(a, "POST", path, "{}", 2, NULL, NULL);
    if (st == 404) {
        log_warn("the server does not know node %lld: registering again", (long long)a->node_id);
        a->need_register = 1;
    } else if (st == 401) {
        /* the node's token was revoked (DELETE /nodes/{id}/token) or the
         * server lost it: a new one comes with a new registration */
        log_warn("the server refused node %lld's token (revoked?): registering again with the join token",
                 (long long)a->node_id);
        a->need_register = 1;
    } else if (st && st != 200 && st != 204) {
        log_warn("heartbeat answered %ld", st);
    }
}

/* Stopping: asks the server to hand this node no new task (POST
 * /nodes/{id}/drain), so jobs submitted meanwhile wait for another node
 * instead of for this one to be declared lost. Best effort and quick: a
 * server that does not answer within 1.5 s is left to find out from the
 * heartbeats, and nothing is kept for a later agent. */
static void agent_drain(agent *a) {
    if (!a->node_id || a->need_register || !server_usable(a)) return;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/drain", (long long)a->node_id);
    long keep = a->http.timeout_ms;
    a->http.timeout_ms = 1500;
    long st = agent_call(a, "POST", path, "{}", 2, NULL, NULL);
    a->http.timeout_ms = keep;
    if (st == 200) log_info("node %lld drained: the server hands it no new task", (long long)a->node_id);
    else log_warn("could not drain node %lld (%ld): the server finds out from the heartbeats", (long long)a->node_id, st);
}

/* ---------------------------------------------------------------- outbox */

static void outbox_push(agent *a, const char *path, char *body /* owned */, int64_t exit_of) {
    if (a->out_len == OUTBOX_MAX) {
        /* Bounded: the oldest report goes (logged); never happens with sane task counts. */
        outmsg *old = &a->outbox[a->out_head];
        log_error("status outbox full: dropping %s %s", old->path, old->body);
        free(old->body);
        a->out_head = (a->out_head + 1) % OUTBOX_MAX;
        a->out_len--;
    }
    outmsg *m = &a->outbox[(a->out_head + a->out_len) % OUTBOX_MAX];
    snprintf(m->path, sizeof m->path, "%s", path);
    m->body = body;
    m->exit_of = exit_of;
    a->out_len++;
    a->state_dirty = 1;
}

/* Delivers the reports in order; stops at the first one the server could
 * not take (retried after the backoff). */
static void outbox_flush(agent *a) {
    while (a->out_len && server_usable(a)) {
        outmsg *m = &a->outbox[a->out_head];
        char *reply = NULL;
        long st = agent_call(a, "POST", m->path, m->body, strlen(m->body), NULL, &reply);
        if (st == 0 || st >= 500 || st == 401) {
            if (st == 401) a->need_register = 1; /* the node's token is gone: keep the report, register again */
            free(reply);
            return;
        }
        if (st >= 300) log_warn("%s answered %ld: %.200s (report dropped)", m->path, st, reply ? reply : "");
        free(reply);
        free(m->body);
        m->body = NULL;
        if (m->exit_of) a->state_dirty = 1;
        a->out_head = (a->out_head + 1) % OUTBOX_MAX;
        a->out_len--;
    }
}

/* {"state": "running"}, with the task's ports when it has any:
 * "ports": {"tensorboard": 41234}. */
static void report_running(agent *a, const task *t) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)t->id);
    buf b;
    buf_init(&b, 4096);
    int ok = buf_appends(&b, "{\"state\":\"running\"") == 0;
    for (int i = 0; ok && i < t->n_ports; i++) /* names are [a-z0-9_-]: nothing to escape */
        ok = buf_printf(&b, "%s\"%s\":%d", i ? "," : ",\"ports\":{", t->port_names[i], t->ports[i]) == 0;
    if (ok && t->n_ports) ok = buf_appends(&b, "}") == 0;
    ok = ok && buf_appends(&b, "}") == 0;
    if (!ok) abort(); /* 8 short names in 4 KiB */
    outbox_push(a, path, buf_detach(&b, NULL), 0);
}

static void recent_add(agent *a, int64_t id, const char *body) {
    recent *r = &a->recents[a->recent_next];
    free(r->body);
    r->id = id;
    r->body = xstrdup(body);
    a->recent_next = (a->recent_next + 1) % RECENT_MAX;
    if (a->n_recent < RECENT_MAX) a->n_recent++;
}

static const recent *recent_find(const agent *a, int64_t id) {
    for (int i = 0; i < a->n_recent; i++)
        if (a->recents[i].id == id) return &a->recents[i];
    return NULL;
}

static char *exit_body(int exit_code, int sig, const char *reason, const char *tail) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", "exited");
    cJSON_AddNumberToObject(o, "exit_code", exit_code);
    cJSON_AddNumberToObject(o, "signal", sig);
    cJSON_AddStringToObject(o, "reason", reason);
    cJSON_AddStringToObject(o, "log_tail", tail);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    return s;
}

/* ---------------------------------------------------------------- tasks */

static task *task_find(agent *a, int64_t id) {
    for (int i = 0; i < a->n_tasks; i++)
        if (a->tasks[i]->id == id) return a->tasks[i];
    return NULL;
}

static void task_free(task *t) {
    if (t->fd >= 0) close(t->fd);
    buf_release(&t->logs);
    for (int i = 0; t->env && t->env[i]; i++) free(t->env[i]);
    free(t->env);
    free(t->prep);
    cJSON_Delete(t->assign);
    free(t->e_ctr);
    free(t);
}

/* The last TAIL_LINES lines of a task's output. */
static void task_tail(const task *t, char *out, size_t outlen) {
    size_t end = t->tail_len;
    while (end && (t->tail[end - 1] == '\n' || t->tail[end - 1] == '\r')) end--;
    size_t start = end;
    int lines = 0;
    while (start > 0) {
        if (t->tail[start - 1] == '\n' && ++lines == TAIL_LINES) break;
        start--;
    }
    size_t n = end - start;
    if (n >= outlen) {
        start = end - (outlen - 1);
        n = outlen - 1;
    }
    memcpy(out, t->tail + start, n);
    out[n] = '\0';
}

static int task_ship_logs(agent *a, task *t);

static void task_output(agent *a, task *t, const char *p, size_t n) {
    /* tail: keep the last TAIL_KEEP bytes */
    if (n >= TAIL_KEEP) {
        memcpy(t->tail, p + n - TAIL_KEEP, TAIL_KEEP);
        t->tail_len = TAIL_KEEP;
    } else {
        if (t->tail_len + n > TAIL_KEEP) {
            size_t drop = t->tail_len + n - TAIL_KEEP;
            memmove(t->tail, t->tail + drop, t->tail_len - drop);
            t->tail_len -= drop;
        }
        memcpy(t->tail + t->tail_len, p, n);
        t->tail_len += n;
    }
    if (!t->read_since_ms) t->read_since_ms = mono_ms();
    t->read_bytes += (long)n;
    /* a program that writes faster than the once-a-second shipping: ship
     * now, while the server takes it, rather than drop */
    if (t->logs.len + n > LOG_PENDING_MAX / 2 && server_usable(a) && !a->need_register) task_ship_logs(a, t);
    if (buf_append(&t->logs, p, n) < 0) {
        /* Still full: the server does not take it (away, or refusing), or
         * the program writes faster than it does. Keep the newest output,
         * and say which. */
        long lost = (long)t->logs.len;
        t->dropped += lost;
        buf_reset(&t->logs);
        char note[320];
        double secs = (double)(mono_ms() - t->read_since_ms) / 1000.0;
        if (a->backoff_ms > 0 || !server_usable(a) || a->need_register)
            snprintf(note, sizeof note,
                     "[trainyard agent: %ld bytes of output dropped (%ld in all): the server has not taken this "
                     "task's output for %.1f s; the newest %u MiB are kept]\n",
                     lost, t->dropped, secs, LOG_PENDING_MAX >> 20);
        else
            snprintf(note, sizeof note,
                     "[trainyard agent: %ld bytes of output dropped (%ld in all): the program wrote %.1f MB/s, faster "
                     "than the agent ships it to the server; the newest %u MiB are kept]\n",
                     lost, t->dropped, secs > 0.001 ? (double)t->read_bytes / secs / 1e6 : 0.0, LOG_PENDING_MAX >> 20);
        if (buf_appends(&t->logs, note) < 0 || buf_append(&t->logs, p, n) < 0) t->dropped += (long)n;
    }
}

/* Reads what the pipe holds; closes it at EOF. */
static void task_read(agent *a, task *t) {
    char b[16384];
    for (;;) {
        ssize_t n = read(t->fd, b, sizeof b);
        if (n > 0) {
            task_output(a, t, b, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        close(t->fd); /* EOF or error */
        t->fd = -1;
        return;
    }
}

/* Ships a task's pending output: 0 when nothing is left, -1 to retry. */
static int task_ship_logs(agent *a, task *t) {
    while (t->logs.len && server_usable(a)) {
        size_t n = t->logs.len < LOG_BATCH_MAX ? t->logs.len : LOG_BATCH_MAX;
        char path[160];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=%s", (long long)t->job, t->name);
        long st = agent_call(a, "POST", path, t->logs.data, n, "text/plain", NULL);
        if (st == 0 || st >= 500) return -1;
        if (st == 401) { /* the node's token is gone: keep the output, register again */
            a->need_register = 1;
            return -1;
        }
        if (st >= 300) log_warn("%s answered %ld: %zu bytes of output dropped", path, st, n);
        memmove(t->logs.data, t->logs.data + n, t->logs.len - n);
        t->logs.len -= n;
        t->logs.data[t->logs.len] = '\0';
    }
    if (!t->logs.len) { /* all shipped: the rate counts from here */
        t->read_since_ms = 0;
        t->read_bytes = 0;
    }
    return t->logs.len ? -1 : 0;
}

static int json_int(const cJSON *o, const char *k, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    /* within +-2^53 (exact in a double): a cast out of int64's range is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -9007199254740992.0 && v->valuedouble <= 9007199254740992.0))
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* The directory a task's context is unpacked into: in its job directory
 * (its uid's) or, without isolation, one of its own under the cache. 0, or
 * -1 with why. */
static int context_dir(agent *a, task *t, char *out, size_t outlen, uid_t *uid, char *why, size_t whylen) {
    *uid = (uid_t)-1;
    if (t->iso.dir[0]) {
        if (sfmt(out, outlen, "%s/context", t->iso.dir) < 0 || mkdir(out, 0700) < 0) {
            snprintf(why, whylen, "cannot make the context directory: %s", strerror(errno));
            return -1;
        }
        if (t->iso.uid) {
            *uid = (uid_t)t->iso.uid;
            if (chown(out, *uid, *uid) < 0) {
                snprintf(why, whylen, "cannot give the context directory to uid %u: %s", t->iso.uid, strerror(errno));
                return -1;
            }
        }
        return 0;
    }
    char runs[PATH_MAX + 8];
    if (sfmt(runs, sizeof runs, "%s/run", a->cache_dir) < 0 || mkdir_p(runs, 0700) < 0 ||
        sfmt(t->ctx_tmp, sizeof t->ctx_tmp, "%s/task%lld-XXXXXX", runs, (long long)t->id) < 0 || !mkdtemp(t->ctx_tmp)) {
        snprintf(why, whylen, "cannot make the context directory under %.300s: %s", a->cache_dir, strerror(errno));
        t->ctx_tmp[0] = '\0';
        return -1;
    }
    snprintf(out, outlen, "%s", t->ctx_tmp);
    return 0;
}

/* Hands the task's context (id "sha256:HEX") to the pool: fetched once per
 * node into the cache (its sha256 checked), unpacked into the task's own
 * directory, off this loop; the task starts when it comes back
 * (ctx_collect). 0, or -1 with why. */
static int context_begin(agent *a, task *t, const char *id, char *why, size_t whylen) {
    ctxf_req *r = xcalloc(1, sizeof *r);
    r->task = t->id;
    r->job = t->job;
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->token, sizeof r->token, "%s", a->http.token);
    if (context_dir(a, t, r->dir, sizeof r->dir, &r->uid, why, whylen) < 0) {
        free(r);
        return -1;
    }
    if (ctxf_submit(&a->ctx, r) < 0) {
        snprintf(why, whylen, "cannot fetch context %s: no thread to fetch it", id);
        free(r);
        return -1;
    }
    t->prep = r;
    log_info("task %lld (job %lld): context %.19s... being made ready (the worker starts once it is)",
             (long long)t->id, (long long)t->job, id);
    return 0;
}

/* What the worker of an image task needs to start its container
 * (container.h: TRAINYARD_CONTAINER). Heap "NAME=value", or NULL. */
static char *container_env(agent *a, task *t, const char *gpus) {
    if (sfmt(t->ctr_name, sizeof t->ctr_name, "trainyard-%s", strrchr(t->iso.dir, '/') + 1) < 0) return NULL;
    /* its parent cgroup, watched for an OOM kill (the container's own
     * cgroup is gone by the time the task's exit is reported) */
    char cg_parent[PATH_MAX], cg_err[PATH_MAX + 128] = "";
    if (iso_ctr_cgroup(&a->iso, &t->iso, t->ctr_name, cg_parent, sizeof cg_parent, cg_err, sizeof cg_err) < 0)
        log_warn("task %lld: %s: an out-of-memory kill of its container will read as exit code 137",
                 (long long)t->id, cg_err);
    struct rlimit nf = {0, 0};
    getrlimit(RLIMIT_NOFILE, &nf);
    long nofile = nf.rlim_max == RLIM_INFINITY || nf.rlim_max > 1048576 ? 1048576 : (long)nf.rlim_max;
    char root[PATH_MAX] = "";
    if (a->opt.data_root[0] && !realpath(a->opt.data_root, root)) root[0] = '\0';
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "podman", a->podman);
    cJSON_AddStringToObject(o, "runtime", a->opt.podman_runtime);
    cJSON_AddStringToObject(o, "name", t->ctr_name);
    cJSON_AddNumberToObject(o, "uid", t->iso.uid);
    cJSON_AddNumberToObject(o, "memory_mb", (double)t->iso.memory_mb);
    cJSON_AddNumberToObject(o, "pids", a->opt.iso.pids_max);
    cJSON_AddNumberToObject(o, "cpu_shares", 1024.0 * (t->iso.slots > 0 ? t->iso.slots : 1));
    cJSON_AddNumberToObject(o, "nofile", (double)nofile);
    /* RLIMIT_NPROC counts the uid's processes: the task's pids limit */
    cJSON_AddNumberToObject(o, "nproc", a->opt.iso.pids_max > 0 ? a->opt.iso.pids_max : 4096);
    cJSON_AddStringToObject(o, "dir", t->iso.dir);
    cJSON_AddStringToObject(o, "data_root", root);
    cJSON_AddStringToObject(o, "gpus", gpus);
    cJSON_AddStringToObject(o, "lock_dir", "/run/trainyard/pulls");
    cJSON_AddStringToObject(o, "cgroup_parent", cg_parent);
    cJSON_AddNumberToObject(o, "agent", (double)getpid());
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) return NULL;
    size_t n = strlen(j) + sizeof "TRAINYARD_CONTAINER=";
    char *e = xmalloc(n);
    snprintf(e, n, "TRAINYARD_CONTAINER=%s", j);
    cJSON_free(j);
    return e;
}

/* Starts a task of an assignment's `start` list. */
/* CUDA_VISIBLE_DEVICES=... of a config's devices into cuda, with the
 * number of its GPUs and CPU slots. 0, or -1 when it does not fit. */
static int config_devices(const cJSON *config, buf *cuda, int *n_gpu, int *n_cpu) {
    *n_gpu = *n_cpu = 0;
    int ok = buf_appends(cuda, "CUDA_VISIBLE_DEVICES=") == 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(config, "devices")) {
        if (cJSON_IsString(d) && strncmp(d->valuestring, "gpu:", 4) == 0)
            ok = ok && buf_printf(cuda, "%s%s", (*n_gpu)++ ? "," : "", d->valuestring + 4) == 0;
        else if (cJSON_IsString(d) && strncmp(d->valuestring, "cpu:", 4) == 0)
            (*n_cpu)++;
    }
    return ok ? 0 : -1;
}

/* A task whose worker never started: its exit (code, why) is reported and
 * what it held on the node is freed; it leaves the task list. */
static void task_abandon(agent *a, task *t, int code, const char *why, int stopped) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)t->id);
    if (stopped) log_info("task %lld (job %lld): %s", (long long)t->id, (long long)t->job, why);
    else log_error("task %lld (job %lld): %s", (long long)t->id, (long long)t->job, why);
    char *body = exit_body(code, 0, why, "");
    recent_add(a, t->id, body);
    outbox_push(a, path, body, t->id);
    for (int i = 0; i < a->n_tasks; i++)
        if (a->tasks[i] == t) {
            a->tasks[i] = a->tasks[--a->n_tasks];
            a->state_dirty = 1;
            break;
        }
    if (t->ctx_tmp[0]) rm_tree(t->ctx_tmp);
    int oom;
    iso_task_finish(&a->iso, &t->iso, &oom);
    task_free(t);
}

/* ---------------------------------------------------------------- ports */

/* Whether a task of this agent other than t holds port. */
static int port_held(const agent *a, const task *t, int port) {
    for (int i = 0; i < a->n_tasks; i++) {
        const task *o = a->tasks[i];
        if (o == t || o->exit_queued) continue;
        for (int j = 0; j < o->n_ports; j++)
            if (o->ports[j] == port) return 1;
    }
    for (int j = 0; j < t->n_ports; j++)
        if (t->ports[j] == port) return 1;
    return 0;
}

/* A TCP port of this node free now: one the kernel gives a socket bound to
 * 0.0.0.0:0, read back and released (the task binds it next), none that a
 * task of this agent holds. 0 when none could be had. */
static int port_pick(const agent *a, const task *t) {
    for (int tries = 0; tries < 32; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return 0;
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
        socklen_t len = sizeof sa;
        int port = 0;
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
            port = ntohs(sa.sin_port);
        close(fd);
        if (port <= 0) return 0;
        if (!port_held(a, t, port)) return port;
    }
    return 0;
}

/* The ports the task's job declares (its spec, parsed as the worker will:
 * a notebook's own "notebook" included), each given a free port of this
 * node. 0, or -1 with why. */
static int task_ports(const agent *a, task *t, const cJSON *config, char *why, size_t whylen) {
    t->n_ports = 0;
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(config, "spec");
    if (!cJSON_IsObject(spec) || !cJSON_GetObjectItemCaseSensitive(spec, "ports")) {
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(spec, "interactive");
        if (!in) return 0; /* declares none: the common case costs no parse */
    }
    char *text = cJSON_PrintUnformatted(spec);
    if (!text) abort();
    jobspec *js = xcalloc(1, sizeof *js);
    spec_error se;
    int rc = jobspec_parse(text, strlen(text), js, &se);
    free(text);
    if (rc < 0) { /* the worker says why the spec is bad */
        free(js);
        return 0;
    }
    for (int i = 0; i < js->n_ports; i++) {
        int port = port_pick(a, t);
        if (!port) {
            snprintf(why, whylen, "cannot start the worker: no free TCP port on this node for port \"%s\"",
                     js->ports[i].name);
            t->n_ports = 0;
            jobspec_release(js);
            free(js);
            return -1;
        }
        snprintf(t->port_names[i], sizeof t->port_names[i], "%s", js->ports[i].name);
        t->ports[i] = port;
        t->n_ports = i + 1;
    }
    jobspec_release(js);
    free(js);
    return 0;
}

/* The task's config as text for its worker: its "api" (the URL the
 * server tells workers, its --public-url) followed by this agent's servers
 * that it does not name already, so the worker finds the leader as the
 * agent does when the server that handed out the task goes. NULL when out
 * of memory. */
static char *task_config_text(const agent *a, const cJSON *config) {
    const cJSON *api = cJSON_GetObjectItemCaseSensitive(config, "api");
    char list[512];
    if (!cJSON_IsString(api) || client_url_list_merge(api->valuestring, a->opt.server, list, sizeof list) < 0 ||
        strcmp(list, api->valuestring) == 0)
        return cJSON_PrintUnformatted(config);
    cJSON *dup = cJSON_Duplicate(config, 1);
    if (!dup) return NULL;
    cJSON *s = cJSON_CreateString(list);
    if (!s || !cJSON_ReplaceItemInObjectCaseSensitive(dup, "api", s)) {
        cJSON_Delete(s);
        cJSON_Delete(dup);
        return NULL;
    }
    char *text = cJSON_PrintUnformatted(dup);
    cJSON_Delete(dup);
    return text;
}

/* Starts the worker of a task (t->assign) prepared by task_start, its
 * context (when it has one) ready in ctxdir. */
static void task_launch(agent *a, task *t, const char *ctxdir) {
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(t->assign, "config");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t->assign, "type");
    /* Environment: the config, and what the worker needs from this node. */
    char *cfg = task_config_text(a, config);
    if (!cfg) abort();
    buf e_cfg, e_cuda;
    buf_init(&e_cfg, 64u << 20);
    buf_init(&e_cuda, 4096);
    char e_task[64], e_root[PATH_MAX + 32], e_name[80], e_ctx[PATH_MAX + 32] = "";
    int ok = buf_printf(&e_cfg, "TRAINYARD_CONFIG=%s", cfg) == 0;
    free(cfg);
    snprintf(e_task, sizeof e_task, "TRAINYARD_TASK_ID=%lld", (long long)t->id);
    snprintf(e_name, sizeof e_name, "TRAINYARD_TASK_NAME=%s", t->name);
    snprintf(e_root, sizeof e_root, "TRAINYARD_DATA_ROOT=%s", a->opt.data_root);
    int n_gpu = 0, n_cpu = 0;
    ok = ok && config_devices(config, &e_cuda, &n_gpu, &n_cpu) == 0;
    if (ctxdir && ctxdir[0]) snprintf(e_ctx, sizeof e_ctx, "TRAINYARD_CONTEXT_DIR=%s", ctxdir);
    snprintf(t->ctx_dir, sizeof t->ctx_dir, "%s", ctxdir ? ctxdir : "");
    /* an isolated task's home is its job directory, its /tmp private (or
     * the job directory's tmp where no mount namespace could be made) */
    char e_home[PATH_MAX + 8], e_tmp[PATH_MAX + 8];
    snprintf(e_home, sizeof e_home, "HOME=%s", t->iso.dir);
    snprintf(e_tmp, sizeof e_tmp, "TMPDIR=%s", t->iso.mount_ns && !t->iso.keep_root ? "/tmp" : t->iso.tmp);
    /* the uid has no passwd entry: a name in USER and LOGNAME, which
     * getpass.getuser() and friends read first (PyTorch's cache directories
     * are named from it, and without it `import torch` fails) */
    char e_user[48], e_logname[48];
    snprintf(e_user, sizeof e_user, "USER=trainyard-%u", (unsigned)t->iso.uid);
    snprintf(e_logname, sizeof e_logname, "LOGNAME=trainyard-%u", (unsigned)t->iso.uid);
    /* the CA the agent trusts, for its workers' requests (not secret) */
    char *e_ca = NULL;
    if (client_trusted_ca()) {
        size_t n = strlen(client_trusted_ca()) + sizeof "TRAINYARD_CA_PEM=";
        e_ca = xmalloc(n);
        snprintf(e_ca, n, "TRAINYARD_CA_PEM=%s", client_trusted_ca());
    }
    char why_ports[256] = "";
    if (task_ports(a, t, config, why_ports, sizeof why_ports) < 0) ok = 0;
    char e_ports[JOBSPEC_MAX_PORTS][96];
    char *env[16 + JOBSPEC_MAX_PORTS];
    int ne = 0;
    env[ne++] = e_cfg.data;
    env[ne++] = e_task;
    env[ne++] = e_name;
    if (a->opt.data_root[0]) env[ne++] = e_root;
    if (n_gpu) env[ne++] = e_cuda.data;
    if (e_ca) env[ne++] = e_ca;
    if (e_ctx[0]) env[ne++] = e_ctx;
    if (t->e_ctr) env[ne++] = t->e_ctr;
    for (int i = 0; i < t->n_ports; i++) {
        char name[64];
        jobspec_port_env(t->port_names[i], name);
        snprintf(e_ports[i], sizeof e_ports[i], "%s=%d", name, t->ports[i]);
        env[ne++] = e_ports[i];
    }
    if (t->iso.on && t->iso.uid) {
        env[ne++] = e_home;
        env[ne++] = e_tmp;
        env[ne++] = e_user;
        env[ne++] = e_logname;
    }
    env[ne] = NULL;
    char *argv[] = {a->exe, "worker", NULL};
    /* the evaluator side-car yields to every other task: nice 19 and
     * SCHED_IDLE whatever --worker-nice and --worker-sched say, so it runs
     * only on CPU time the workers leave (docs/executors.md, The evaluator) */
    int evaluator = cJSON_IsString(type) && strcmp(type->valuestring, "evaluator") == 0;
    int nice_v = evaluator ? 19 : a->opt.worker_nice, idle_v = evaluator ? 1 : a->opt.worker_idle;
    if (ok) t->pid = proc_spawn(a->exe, argv, env, nice_v, idle_v, &t->iso, &t->fd);
    int spawn_errno = errno;
    /* a parameter_server job trains on without a dead non-chief worker:
     * keep what it takes to start it again */
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(config, "spec");
    const cJSON *strat = spec ? cJSON_GetObjectItemCaseSensitive(spec, "strategy") : NULL;
    const cJSON *stype = strat ? cJSON_GetObjectItemCaseSensitive(strat, "type") : NULL;
    if (ok && t->pid > 0 && t->index > 0 && cJSON_IsString(type) && strcmp(type->valuestring, "worker") == 0 &&
        cJSON_IsString(stype) && strcmp(stype->valuestring, "parameter_server") == 0) {
        t->env = xcalloc((size_t)ne + 1, sizeof *t->env);
        for (int i = 0; i < ne; i++) t->env[i] = xstrdup(env[i]);
        t->restartable = 1;
    }
    buf_release(&e_cfg);
    free(e_ca);
    buf_release(&e_cuda);
    if (!ok || t->pid <= 0) {
        char why[256];
        if (why_ports[0]) snprintf(why, sizeof why, "%s", why_ports);
        else snprintf(why, sizeof why, "cannot start the worker: %s", ok ? strerror(spawn_errno) : "config too large");
        t->pid = 0;
        task_abandon(a, t, 127, why, 0);
        return;
    }
    t->start_ticks = proc_start_ticks(t->pid);
    if (!task_find(a, t->id)) a->tasks[a->n_tasks++] = t;
    a->state_dirty = 1;
    log_info("task %lld: job %lld attempt %d %s started as pid %d", (long long)t->id, (long long)t->job, t->attempt,
             t->name, (int)t->pid);
    for (int i = 0; i < t->n_ports; i++)
        log_info("task %lld: port \"%s\" is %d on this node", (long long)t->id, t->port_names[i], t->ports[i]);
    report_running(a, t);
}

/* Starts a task of an assignment's `start` list: its uid, job directory,
 * cgroup and container first; a context is made ready off this loop
 * (context_begin), and the worker starts when it is (ctx_collect). */
static void task_start(agent *a, const cJSON *s) {
    int64_t id = 0, job = 0, attempt = 0, index = 0;
    if (json_int(s, "task", &id) < 0 || json_int(s, "job", &job) < 0) {
        log_error("assignment without task/job ids: ignored");
        return;
    }
    json_int(s, "attempt", &attempt);
    json_int(s, "index", &index);
    if (task_find(a, id)) return; /* handed out again: it already runs here */
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(s, "config");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)id);
    if (a->quit) {
        /* Stopping: a task handed out now (say a job requeued on this node by
         * the exit of one we stopped) would start after our SIGTERMs and hold
         * the stop up to its deadline. Hand it back as not started. */
        log_info("task %lld: not started: the agent is stopping", (long long)id);
        outbox_push(a, path, exit_body(-1, 0, "not started: the agent on this node is stopping", ""), id);
        return;
    }
    if (a->n_tasks == AGENT_MAX_TASKS || !cJSON_IsObject(config)) {
        const char *why = cJSON_IsObject(config) ? "too many tasks on this agent" : "assignment without a config";
        log_error("task %lld: %s", (long long)id, why);
        outbox_push(a, path, exit_body(1, 0, why, ""), id);
        return;
    }
    task *t = xcalloc(1, sizeof *t);
    t->id = id;
    t->job = job;
    t->attempt = (int)attempt;
    t->index = (int)index;
    t->fd = -1;
    buf_init(&t->logs, LOG_PENDING_MAX);
    snprintf(t->name, sizeof t->name, "%s-%d", cJSON_IsString(type) ? type->valuestring : "worker", t->index);
    t->assign = cJSON_Duplicate(s, 1);
    if (!t->assign) abort();
    config = cJSON_GetObjectItemCaseSensitive(t->assign, "config");

    buf e_cuda;
    buf_init(&e_cuda, 4096);
    int n_gpu = 0, n_cpu = 0;
    if (config_devices(config, &e_cuda, &n_gpu, &n_cpu) < 0) {
        buf_release(&e_cuda);
        task_abandon(a, t, 127, "cannot start the worker: config too large", 0);
        return;
    }
    const char *gpus = n_gpu ? e_cuda.data + strlen("CUDA_VISIBLE_DEVICES=") : "";
    /* its uid, job directory and cgroup (memory_mb: the scheduler's; 0 or
     * absent: this node's share for its devices) */
    int64_t memory_mb = 0;
    json_int(config, "memory_mb", &memory_mb);
    char iso_err[512] = "", why[900] = "";
    if (iso_task_prepare(&a->iso, id, job, memory_mb, n_cpu, gpus, &t->iso, iso_err, sizeof iso_err) < 0)
        snprintf(why, sizeof why, "cannot isolate the task: %s", iso_err);
    /* a command (or interactive) job's context and image (its spec, in the config) */
    const cJSON *jspec = cJSON_GetObjectItemCaseSensitive(config, "spec");
    const cJSON *jcmd = jspec ? cJSON_GetObjectItemCaseSensitive(jspec, "command") : NULL;
    if (!jcmd && jspec) jcmd = cJSON_GetObjectItemCaseSensitive(jspec, "interactive");
    const cJSON *jctx = jcmd ? cJSON_GetObjectItemCaseSensitive(jcmd, "context") : NULL;
    const cJSON *jenv = jspec ? cJSON_GetObjectItemCaseSensitive(jspec, "environment") : NULL;
    const cJSON *jimg = jenv ? cJSON_GetObjectItemCaseSensitive(jenv, "image") : NULL;
    if (!why[0] && cJSON_IsString(jimg)) {
        if (!a->podman[0] || !t->iso.on || !t->iso.uid)
            snprintf(why, sizeof why, "the job runs in image %.300s, but this node's agent runs no container "
                     "runtime (podman, as root with isolation)", jimg->valuestring);
        else if (!(t->e_ctr = container_env(a, t, gpus)))
            snprintf(why, sizeof why, "cannot describe the task's container");
        else
            t->iso.keep_root = 1;
    }
    buf_release(&e_cuda);
    if (!why[0] && cJSON_IsString(jctx) && strlen(jctx->valuestring) == 71 &&
        context_begin(a, t, jctx->valuestring, why, sizeof why) == 0) {
        /* on the list while its context is made ready: a stop finds it */
        a->tasks[a->n_tasks++] = t;
        a->state_dirty = 1;
        return;
    }
    if (why[0]) {
        task_abandon(a, t, 127, why, 0);
        return;
    }
    task_launch(a, t, "");
}

/* Tasks whose context came back from the pool: started when it is ready,
 * else ended (a failure, reported as the start's failure was; or a stop
 * that came meanwhile). */
static void ctx_collect(agent *a) {
    for (ctxf_req *r = ctxf_take_done(&a->ctx), *next; r; r = next) {
        next = r->next;
        task *t = task_find(a, r->task);
        if (!t || t->prep != r) { /* cannot happen: a request's task waits for it */
            free(r);
            continue;
        }
        t->prep = NULL;
        if (r->rc == CTXF_OK && !t->stop_sent) {
            log_info("task %lld: context %.19s... ready (%s, unpacked in %.0f ms)", (long long)t->id, r->id,
                     r->fetched ? "fetched" : "cached", r->unpack_ms);
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s", r->dir);
            free(r);
            task_launch(a, t, dir);
        } else if (t->stop_sent) {
            char why[400];
            snprintf(why, sizeof why, "not started: stopped (%.200s) while its context was made ready",
                     t->stop_reason);
            free(r);
            task_abandon(a, t, -1, why, 1);
        } else {
            char why[sizeof r->why];
            snprintf(why, sizeof why, "%s", r->why);
            free(r);
            task_abandon(a, t, 127, why, 0);
        }
    }
}

/* A `stop` entry: SIGTERM to the group now, SIGKILL after grace_s. */
static void task_stop(agent *a, const cJSON *s) {
    int64_t id = 0, grace = 10;
    if (json_int(s, "task", &id) < 0) return;
    json_int(s, "grace_s", &grace);
    if (grace < 0) grace = 0;
    if (grace > 3600) grace = 3600;
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(s, "reason");
    task *t = task_find(a, id);
    if (!t) {
        /* Not here (finished already, or started by an agent before a restart). */
        char path[96];
        snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)id);
        const recent *r = recent_find(a, id);
        if (r) {
            outbox_push(a, path, xstrdup(r->body), id);
        } else {
            char *body = exit_body(-1, 0, "not running on this node (the agent restarted)", "");
            recent_add(a, id, body);
            outbox_push(a, path, body, id);
        }
        return;
    }
    if (t->stop_sent || t->exited) return; /* the same stop, listed again */
    snprintf(t->stop_reason, sizeof t->stop_reason, "%s", cJSON_IsString(reason) ? reason->valuestring : "stopped");
    if (t->prep) { /* no worker yet: its context stops being made ready, and it ends then */
        log_info("task %lld: stopping (%s) while its context is made ready: cancelled", (long long)id,
                 t->stop_reason);
        t->stop_sent = 1;
        ctxf_cancel(t->prep);
        return;
    }
    log_info("task %lld: stopping (%s): SIGTERM to group %d, SIGKILL in %lld s", (long long)id, t->stop_reason,
             (int)t->pid, (long long)grace);
    t->stop_sent = 1;
    t->kill_at_ms = mono_ms() + grace * 1000;
    if (proc_signal_group(t->pid, SIGTERM) < 0 && errno != ESRCH) log_warn("kill: %s", strerror(errno));
}

/* Reaps exited tasks; queues the exit report once the output is drained. */
static void tasks_check(agent *a) {
    int64_t now = mono_ms();
    for (int i = 0; i < a->n_tasks; i++) {
        task *t = a->tasks[i];
        if (t->prep) continue; /* no worker yet (ctx_collect) */
        if (!t->exited) {
            int st;
            int r = proc_reap(t->pid, &st);
            if (r == 1) {
                t->exited = 1;
                t->status = st;
                t->exited_at_ms = now;
                /* Nothing else should be signalled by this pgid number later. */
                proc_signal_group(t->pid, SIGKILL);
            } else if (r < 0) {
                t->exited = 1;
                t->status = 0xff00; /* unknown */
                t->exited_at_ms = now;
            } else if (t->kill_at_ms && now >= t->kill_at_ms && !t->killed) {
                log_warn("task %lld: still running after the grace period: SIGKILL", (long long)t->id);
                proc_signal_group(t->pid, SIGKILL);
                t->killed = 1;
            }
        }
        if (t->exited && t->fd >= 0) {
            task_read(a, t);
            /* a grandchild holding the pipe open must not hold the report back */
            if (t->fd >= 0 && now - t->exited_at_ms > 2000) {
                close(t->fd);
                t->fd = -1;
            }
        }
        if (t->exited && t->fd < 0 && !t->exit_queued && t->restartable && !t->stop_sent &&
            t->restarts < PS_WORKER_RESTARTS && !(WIFEXITED(t->status) && WEXITSTATUS(t->status) == 0)) {
            int code, sig;
            char why[160];
            proc_exit_describe(t->status, &code, &sig, why, sizeof why);
            char note[400];
            snprintf(note, sizeof note,
                     "trainyard agent: %s %s; parameter_server trains on: starting it again (restart %d of %d)\n",
                     t->name, why, t->restarts + 1, PS_WORKER_RESTARTS);
            log_warn("task %lld (job %lld %s): %s: restarting it (parameter_server)", (long long)t->id,
                     (long long)t->job, t->name, why);
            buf_appends(&t->logs, note);
            task_ship_logs(a, t);
            char *argv[] = {a->exe, "worker", NULL};
            pid_t pid = proc_spawn(a->exe, argv, t->env, a->opt.worker_nice, a->opt.worker_idle, &t->iso, &t->fd);
            if (pid > 0) {
                t->pid = pid;
                t->restarts++;
                t->exited = 0;
                t->status = 0;
                t->start_ticks = proc_start_ticks(t->pid);
                a->state_dirty = 1;
                continue;
            }
            log_error("task %lld: cannot start it again: %s", (long long)t->id, strerror(errno));
            t->restartable = 0; /* report the exit below */
        }
        if (t->exited && t->fd < 0 && !t->exit_queued) {
            int code, sig, oom = 0;
            char why[160], reason[320], tail[4096];
            int64_t limit_mb = t->iso.memory_mb;
            /* a worker killed before its container ended leaves it running */
            if (t->ctr_name[0] && a->podman[0] && (t->stop_sent || !WIFEXITED(t->status)))
                ctr_remove(a->podman, t->ctr_name, 15);
            /* what it left behind goes: processes, cgroup, job directory, uid */
            iso_task_finish(&a->iso, &t->iso, &oom);
            if (t->ctx_tmp[0]) rm_tree(t->ctx_tmp);
            proc_exit_describe(t->status, &code, &sig, why, sizeof why);
            if (oom && limit_mb > 0) {
                char lim[32];
                iso_format_mb(limit_mb, lim, sizeof lim);
                snprintf(why, sizeof why, "out of memory (limit %s)", lim);
            }
            if (t->stop_sent)
                snprintf(reason, sizeof reason, "%s after stop (%s)", why, t->stop_reason);
            else
                snprintf(reason, sizeof reason, "%s", why);
            task_tail(t, tail, sizeof tail);
            log_info("task %lld (job %lld %s): %s", (long long)t->id, (long long)t->job, t->name, reason);
            char *body = exit_body(code, sig, reason, tail);
            recent_add(a, t->id, body);
            char path[96];
            snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)t->id);
            /* Logs first, so a reader of the job sees the output before the end. */
            task_ship_logs(a, t);
            outbox_push(a, path, body, t->id);
            t->exit_queued = 1;
        }
    }
    /* Forget tasks whose exit is queued and whose output is shipped. */
    for (int i = 0; i < a->n_tasks;) {
        task *t = a->tasks[i];
        if (t->exit_queued && t->logs.len == 0) {
            task_free(t);
            a->tasks[i] = a->tasks[--a->n_tasks];
            a->state_dirty = 1;
        } else {
            i++;
        }
    }
}


/* ---------------------------------------------------------------- state file */

/* The agent writes the tasks it answers for (running, or exited with the
 * report not delivered) to a small JSON file. An agent killed with -9 takes
 * its workers with it (PR_SET_PDEATHSIG), but the server still believes
 * they run; the next agent on the node reads the file and reports each of
 * them exited ("lost"), so the job fails over and resumes from its latest
 * checkpoint instead of waiting forever. */

static void state_save(agent *a) {
    if (!a->state_dirty || !a->state_path[0]) return;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "tasks");
    for (int i = 0; i < a->n_tasks; i++) {
        const task *t = a->tasks[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "task", (double)t->id);
        cJSON_AddNumberToObject(e, "pid", t->exited ? 0 : t->pid);
        cJSON_AddNumberToObject(e, "start_ticks", (double)t->start_ticks);
        cJSON_AddItemToArray(arr, e);
    }
    for (int i = 0; i < a->out_len; i++) {
        const outmsg *m = &a->outbox[(a->out_head + i) % OUTBOX_MAX];
        if (!m->exit_of || task_find(a, m->exit_of)) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "task", (double)m->exit_of);
        cJSON_AddNumberToObject(e, "pid", 0);
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) abort();
    if (file_write_atomic(a->state_path, s, strlen(s), 0600) < 0)
        log_warn("cannot write %s: %s", a->state_path, strerror(errno));
    else
        a->state_dirty = 0;
    free(s);
}

/* Reports the tasks an earlier agent on this node left behind as lost. */
static void state_recover(agent *a) {
    size_t len = 0;
    char *s = file_read_all(a->state_path, 1 << 20, &len);
    if (!s) return;
    cJSON *o = cJSON_Parse(s);
    free(s);
    const cJSON *e;
    int n = 0;
    const cJSON *list = o ? cJSON_GetObjectItemCaseSensitive(o, "tasks") : NULL;
    cJSON_ArrayForEach(e, list) {
        int64_t id = 0, pid = 0, ticks = 0;
        if (json_int(e, "task", &id) < 0 || id <= 0) continue;
        json_int(e, "pid", &pid);
        json_int(e, "start_ticks", &ticks);
        /* Normally gone already (it died with its agent); if it lingers, end it. */
        if (pid > 0 && ticks > 0 && proc_start_ticks((pid_t)pid) == (unsigned long long)ticks)
            proc_signal_group((pid_t)pid, SIGKILL);
        char path[96];
        snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)id);
        char *body = exit_body(-1, 0, "lost: the agent that ran it on this node stopped without reporting it", "");
        recent_add(a, id, body);
        outbox_push(a, path, body, id);
        n++;
    }
    cJSON_Delete(o);
    /* A long-poll of the dead agent may still wait in the server; it answers
     * empty once this agent registers (api_assignments_node_registered), so the reports
     * go out at once and no task is handed to the dead one. */
    if (n) log_warn("%d task(s) of an earlier agent on this node were lost: reporting them", n);
    a->state_dirty = 1;
}

/* ---------------------------------------------------------------- poller */

static void *poller_main(void *arg) {
    agent *a = arg;
    client c;
    if (client_init(&c, a->opt.server, a->opt.token) < 0) {
        log_error("poller: cannot make an HTTP client");
        return NULL;
    }
    c.timeout_ms = (long)(a->opt.poll_wait_s + 15) * 1000;
    c.failover_ms = 0; /* one try of each server, then the backoff below */
    int64_t backoff = 0;
    while (!a->quit) {
        pthread_mutex_lock(&a->mu);
        int64_t node = a->node_id;
        if (a->node_token[0]) snprintf(c.token, sizeof c.token, "%s", a->node_token);
        pthread_mutex_unlock(&a->mu);
        if (!node) {
            usleep(200 * 1000);
            continue;
        }
        char path[128];
        snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=%d", (long long)node, a->opt.poll_wait_s);
        client_reply r;
        int rc = client_request(&c, "GET", path, NULL, 0, NULL, &r);
        if (rc < 0 || r.status != 200) {
            if (rc == 0 && r.status != 200)
                log_warn("assignments answered %ld: %.200s", r.status, r.body.data ? r.body.data : "");
            client_reply_release(&r);
            backoff = backoff ? backoff * 2 : BACKOFF_MIN_MS;
            if (backoff > BACKOFF_MAX_MS) backoff = BACKOFF_MAX_MS;
            usleep((useconds_t)backoff * 1000);
            continue;
        }
        backoff = 0;
        int nonempty = r.body.data && (strstr(r.body.data, "\"task\"") != NULL);
        pthread_mutex_lock(&a->mu);
        if (a->inbox_len == a->inbox_cap) {
            a->inbox_cap = a->inbox_cap ? a->inbox_cap * 2 : 8;
            a->inbox = xrealloc(a->inbox, (size_t)a->inbox_cap * sizeof *a->inbox);
        }
        a->inbox[a->inbox_len++] = buf_detach(&r.body, NULL);
        pthread_mutex_unlock(&a->mu);
        client_reply_release(&r);
        char one = 1;
        ssize_t w = write(a->wake_w, &one, 1);
        (void)w;
        /* The server lists a task to start once (its token is minted when it
         * is handed out) and a set of stops once until it changes, so the
         * next poll parks: a short breath after a non-empty answer only
         * guards against spinning should that ever not hold. (It was 500 ms,
         * when stops were listed until their tasks exited: most of a gang's
         * submit -> start time at scale, bench/cluster.) */
        if (nonempty) usleep(AGENT_POLL_REST_MS * 1000);
    }
    client_release(&c);
    return NULL;
}

/* ---------------------------------------------------------------- shells (exec) */

/* An `exec` entry of the assignments: a shell into one of this agent's
 * running tasks. One `trainyard exec-relay` per session (exec_relay.h) gets
 * what it needs in TRAINYARD_EXEC; a task that does not run here is still
 * connected to, with the status's error, so the client hears why. */
static void exec_begin(agent *a, const cJSON *e) {
    const cJSON *sess = cJSON_GetObjectItemCaseSensitive(e, "session");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(e, "user");
    const cJSON *term = cJSON_GetObjectItemCaseSensitive(e, "term");
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(e, "command");
    int64_t id = 0, cols = 80, rows = 24;
    if (!cJSON_IsString(sess) || strlen(sess->valuestring) != 32 ||
        strspn(sess->valuestring, "0123456789abcdef") != 32 || json_int(e, "task", &id) < 0) {
        log_warn("exec entry without a session (32 hex) or task id: ignored");
        return;
    }
    if (a->n_relays == AGENT_MAX_RELAYS) {
        log_warn("exec session %s (task %lld): %d shells run already here: refused", sess->valuestring, (long long)id,
                 AGENT_MAX_RELAYS);
        return;
    }
    json_int(e, "cols", &cols);
    json_int(e, "rows", &rows);
    task *t = task_find(a, id);
    char why[160] = "";
    if (!t || t->prep || t->pid <= 0 || t->exited || t->exit_queued || t->stop_sent)
        snprintf(why, sizeof why, "task %lld is not running on this node", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "server", a->opt.server);
    cJSON_AddNumberToObject(o, "node", (double)a->node_id);
    cJSON_AddStringToObject(o, "session", sess->valuestring);
    cJSON_AddStringToObject(o, "token", a->http.token);
    cJSON_AddNumberToObject(o, "task", (double)id);
    cJSON *argv = cJSON_AddArrayToObject(o, "command");
    const cJSON *v;
    cJSON_ArrayForEach(v, cmd) {
        if (!cJSON_IsString(v)) {
            snprintf(why, sizeof why, "the command's arguments must be strings");
            break;
        }
        cJSON_AddItemToArray(argv, cJSON_CreateString(v->valuestring));
    }
    cJSON_AddBoolToObject(o, "tty", cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "tty")));
    cJSON_AddNumberToObject(o, "cols", (double)(cols >= 1 && cols <= 65535 ? cols : 80));
    cJSON_AddNumberToObject(o, "rows", (double)(rows >= 1 && rows <= 65535 ? rows : 24));
    if (cJSON_IsString(term) && strlen(term->valuestring) < 64) cJSON_AddStringToObject(o, "term", term->valuestring);
    if (!why[0]) {
        /* the task's isolation: its worker's mount namespace, cgroups, uid and job directory */
        int own = t->iso.on && t->iso.uid;
        cJSON_AddNumberToObject(o, "worker_pid", (double)t->pid);
        cJSON_AddNumberToObject(o, "worker_ticks", (double)t->start_ticks);
        cJSON_AddNumberToObject(o, "uid", own ? t->iso.uid : 0);
        cJSON_AddBoolToObject(o, "mount_ns", own && t->iso.mount_ns && !t->iso.keep_root);
        cJSON *cg = cJSON_AddArrayToObject(o, "cgroups");
        for (int i = 0; t->iso.on && i < t->iso.n_cg; i++) cJSON_AddItemToArray(cg, cJSON_CreateString(t->iso.cg[i]));
        cJSON_AddStringToObject(o, "dir", t->iso.dir[0] ? t->iso.dir : t->ctx_dir[0] ? t->ctx_dir : a->opt.data_root);
        if (own) cJSON_AddStringToObject(o, "tmp", t->iso.mount_ns && !t->iso.keep_root ? "/tmp" : t->iso.tmp);
        if (t->ctr_name[0] && a->podman[0]) {
            cJSON_AddStringToObject(o, "container", t->ctr_name);
            cJSON_AddStringToObject(o, "podman", a->podman);
            cJSON_AddStringToObject(o, "runtime", a->opt.podman_runtime);
        }
        /* the task's own variables, less the secret ones (TRAINYARD_CONFIG) */
        cJSON *env = cJSON_AddArrayToObject(o, "env");
        char s[PATH_MAX + 64];
        snprintf(s, sizeof s, "TRAINYARD_TASK_ID=%lld", (long long)t->id);
        cJSON_AddItemToArray(env, cJSON_CreateString(s));
        snprintf(s, sizeof s, "TRAINYARD_TASK_NAME=%s", t->name);
        cJSON_AddItemToArray(env, cJSON_CreateString(s));
        if (a->opt.data_root[0] && sfmt(s, sizeof s, "TRAINYARD_DATA_ROOT=%s", a->opt.data_root) == 0)
            cJSON_AddItemToArray(env, cJSON_CreateString(s));
        if (t->ctx_dir[0] && sfmt(s, sizeof s, "TRAINYARD_CONTEXT_DIR=%s", t->ctx_dir) == 0)
            cJSON_AddItemToArray(env, cJSON_CreateString(s));
        for (int i = 0; i < t->n_ports; i++) {
            char name[64];
            jobspec_port_env(t->port_names[i], name);
            snprintf(s, sizeof s, "%s=%d", name, t->ports[i]);
            cJSON_AddItemToArray(env, cJSON_CreateString(s));
        }
    }
    if (why[0]) cJSON_AddStringToObject(o, "error", why);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!json) abort();
    /* the CA the agent trusts, as its workers get it */
    char *e_ca = NULL;
    if (client_trusted_ca()) {
        size_t n = strlen(client_trusted_ca()) + sizeof "TRAINYARD_CA_PEM=";
        e_ca = xmalloc(n);
        snprintf(e_ca, n, "TRAINYARD_CA_PEM=%s", client_trusted_ca());
    }
    char *env_add[] = {e_ca, NULL};
    pid_t pid = exec_relay_spawn(a->exe, json, env_add);
    explicit_bzero(json, strlen(json)); /* it holds the node's token */
    cJSON_free(json);
    free(e_ca);
    if (pid < 0) {
        log_error("exec session %s (task %lld): cannot start the relay: %s", sess->valuestring, (long long)id,
                  strerror(errno));
        return;
    }
    a->relays[a->n_relays++] = pid;
    log_info("exec session %s: a shell into task %lld%s%s (relay pid %d)%s%s", sess->valuestring, (long long)id,
             cJSON_IsString(user) ? " for " : "", cJSON_IsString(user) ? user->valuestring : "", (int)pid,
             why[0] ? ": " : "", why);
}

/* Reaps the exec relays that ended (they are not tasks: nothing is reported). */
static void relays_reap(agent *a) {
    for (int i = 0; i < a->n_relays;) {
        int st;
        if (proc_reap(a->relays[i], &st) != 0) a->relays[i] = a->relays[--a->n_relays];
        else i++;
    }
}

static void inbox_process(agent *a) {
    char buf_[64];
    while (read(a->wake_r, buf_, sizeof buf_) > 0) {
    }
    pthread_mutex_lock(&a->mu);
    char **items = a->inbox;
    int n = a->inbox_len;
    a->inbox = NULL;
    a->inbox_len = a->inbox_cap = 0;
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_Parse(items[i] ? items[i] : "");
        if (!o) {
            log_warn("assignments: reply is not JSON: %.200s", items[i] ? items[i] : "");
        } else {
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "stop")) task_stop(a, e);
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "start")) task_start(a, e);
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "exec")) exec_begin(a, e);
        }
        cJSON_Delete(o);
        free(items[i]);
    }
    free(items);
}

/* ---------------------------------------------------------------- main loop */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The agent outlives agent_run for its detached poller thread, which may
 * still be in a long-poll when the process exits. volatile: a static only
 * written is otherwise optimised away, and LeakSanitizer then reports the
 * agent as leaked whenever the poller has returned before the exit. */
static agent *volatile g_agent;

/* agent_run, by phase: the CA pinned; this binary and the isolation of
 * tasks; podman; the context cache; the signal and wake pipes, the client
 * and the context fetcher; the state file and the tasks it recovers; the
 * poller thread; the main loop (each turn: the server link, the end of a
 * stop, a poll and what it brought, a stop signal, the tasks' checks and
 * the state saved); the shutdown. */

/* The main loop's own state. */
typedef struct loop_state {
    int sigfd;                   /* SIGCHLD and SIGTERM as bytes (proc_sigpipe_open) */
    int stopping;                /* a stop signal came: the tasks are being stopped */
    int64_t stop_deadline;       /* ... and the loop ends by then */
} loop_state;

/* --ca-hash: the server's CA pinned before anything speaks to it. */
static int setup_trust(const agent_options *o) {
    if (o->ca_hash[0]) {
        char err[700];
        if (client_trust_pinned(o->server, o->ca_hash, err, sizeof err) < 0) {
            log_error("%s", err);
            return -1;
        }
        log_info("trusting the server's CA %s", o->ca_hash);
    }
    return 0;
}

/* This binary (the workers run it) and what keeps the tasks apart
 * (isolate.h). */
static int setup_isolation(agent *a, const agent_options *o) {
    if (proc_self_exe(a->exe, sizeof a->exe) < 0) {
        log_error("cannot find the trainyard binary (/proc/self/exe)");
        return -1;
    }
    a->opt.iso.cpu_slots = o->cpu_slots;
    snprintf(a->opt.iso.data_root, sizeof a->opt.iso.data_root, "%s", o->data_root);
    char iso_err[512] = "";
    if (iso_init(&a->iso, &a->opt.iso, a->exe, iso_err, sizeof iso_err) < 0) {
        log_error("cannot isolate tasks: %s", iso_err);
        return -1;
    }
    if (!a->iso.user) log_warn("teams are not isolated on this node: %s", a->iso.reason);
    else log_info("tasks run as uids %u-%u%s; cgroup %s%s%s; node memory %lld MiB",
                  a->opt.iso.uid_first, a->opt.iso.uid_last,
                  a->iso.mount_ns ? " with a private /tmp and /dev/shm" : "",
                  a->iso.cg == ISO_CG_V1 ? "v1" : a->iso.cg == ISO_CG_V2 ? "v2" : "none (no limits)",
                  a->iso.reason[0] ? ": " : "", a->iso.reason, (long long)a->iso.memory_mb);
    return 0;
}

/* Images: podman, when tasks are isolated as root (the container runs as
 * the task's uid); the containers an earlier agent left swept. */
static void setup_podman(agent *a, const agent_options *o) {
    if (strcmp(o->podman, "none") == 0) return;
    char ver[128] = "";
    if (!a->iso.user) {
        if (o->podman[0]) log_warn("--podman %s: images need the agent to isolate tasks as root: none here", o->podman);
    } else if (ctr_probe(o->podman[0] ? o->podman : "podman", a->podman, sizeof a->podman, ver, sizeof ver) == 0) {
        /* runc where it is installed: crun (podman's first choice when
         * both are) refuses the hybrid cgroup layout of many hosts */
        char runc[PATH_MAX], rver[128];
        if (!o->podman_runtime[0] && ctr_probe("runc", runc, sizeof runc, rver, sizeof rver) == 0)
            snprintf(a->opt.podman_runtime, sizeof a->opt.podman_runtime, "runc");
        log_info("images run here with %s (%s)%s%s", a->podman, ver, a->opt.podman_runtime[0] ? ", runtime " : "",
                 a->opt.podman_runtime);
        ctr_sweep(a->podman, (long)getpid());
    } else if (o->podman[0]) {
        log_warn("--podman %s does not run: no images here", o->podman);
    }
}

/* Where fetched contexts are kept: --cache-dir, else root's
 * /var/cache/trainyard, else a user's directory under TMPDIR. */
static void setup_cache_dir(agent *a, const agent_options *o) {
    if (o->cache_dir[0]) snprintf(a->cache_dir, sizeof a->cache_dir, "%s", o->cache_dir);
    else if (geteuid() == 0) snprintf(a->cache_dir, sizeof a->cache_dir, "/var/cache/trainyard");
    else {
        const char *tmpd = getenv("TMPDIR");
        snprintf(a->cache_dir, sizeof a->cache_dir, "%s/trainyard-cache-%u", tmpd && *tmpd ? tmpd : "/tmp",
                 (unsigned)geteuid());
    }
}

/* The poller's lock, the signal pipe (ls->sigfd), the wake pipe, the API
 * client and the context fetcher. */
static int setup_io(agent *a, const agent_options *o, loop_state *ls) {
    pthread_mutex_init(&a->mu, NULL);
    int wp[2];
    ls->sigfd = proc_sigpipe_open();
    if (ls->sigfd < 0 || pipe2(wp, O_CLOEXEC | O_NONBLOCK) < 0 || client_init(&a->http, o->server, o->token) < 0) {
        log_error("cannot set up the agent: %s", strerror(errno));
        return -1;
    }
    /* One try of each server per call, then the loop's own backoff: the
     * main thread must not wait out a takeover inside one request. */
    a->http.failover_ms = 0;
    a->wake_r = wp[0];
    a->wake_w = wp[1];
    if (ctxf_start(&a->ctx, o->server, a->cache_dir, (int64_t)a->opt.cache_max_mb << 20, a->wake_w) < 0) {
        log_error("cannot set up the context fetcher");
        return -1;
    }
    a->http.timeout_ms = 10000;
    a->need_register = 1;
    return 0;
}

/* The state file: --state-file, else one named by the server, host and
 * uid under XDG_RUNTIME_DIR (else TMPDIR, else /tmp). */
static void setup_state_path(agent *a, const agent_options *o) {
    if (o->state_file[0]) {
        snprintf(a->state_path, sizeof a->state_path, "%s", o->state_file);
        return;
    }
    char key[1024], sum[65];
    snprintf(key, sizeof key, "%s|%s|%u", o->server, o->hostname, (unsigned)getuid());
    sha256_hex(key, strlen(key), sum);
    const char *dir = getenv("XDG_RUNTIME_DIR");
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    if (sfmt(a->state_path, sizeof a->state_path, "%s/trainyard-agent-%.16s.json", dir, sum) < 0)
        a->state_path[0] = '\0';
}

/* The poller thread (poller_main), detached. */
static int start_poller(agent *a) {
    pthread_t poller;
    if (pthread_create(&poller, NULL, poller_main, a) != 0) {
        log_error("cannot start the poller thread");
        return -1;
    }
    pthread_detach(poller);
    return 0;
}

/* Registration, heartbeat, reports, logs: each only when the server is
 * usable. */
static void loop_server(agent *a, int64_t now) {
    if (a->need_register && server_usable(a)) agent_register(a);
    if (!a->need_register && now >= a->next_hb_ms && server_usable(a)) {
        agent_heartbeat(a);
        a->next_hb_ms = mono_ms() + (int64_t)a->opt.heartbeat_s * 1000;
    }
    if (now >= a->next_logs_ms) {
        for (int i = 0; i < a->n_tasks; i++) task_ship_logs(a, a->tasks[i]);
        a->next_logs_ms = mono_ms() + 1000;
    }
    if (!a->need_register) outbox_flush(a);
}

/* Stopping: 1 when the loop ends (every task gone and reported, the
 * deadline passed, or the tasks exited with the server unreachable). */
static int loop_stopped(agent *a, const loop_state *ls) {
    int live = 0;
    for (int i = 0; i < a->n_tasks; i++) live += !a->tasks[i]->exited;
    if ((!live && !a->out_len && !a->n_tasks) || mono_ms() > ls->stop_deadline) return 1;
    /* Every task has exited but the server is unreachable: the state
     * file keeps the undelivered exits for the next agent. */
    if (!live && a->down_until_ms > 0) {
        log_warn("the server is unreachable: leaving %d exit report(s) to the next agent (%s)", a->out_len,
                 a->state_path[0] ? a->state_path : "no state file");
        return 1;
    }
    return 0;
}

/* Sleeps until a signal, the wake pipe or a task's output, or the next
 * timer (a second at most; the server's backoff, a kill due), then takes
 * what came: the signals (*got_term), the poller's assignments, the tasks'
 * output. -1 when poll fails. */
static int loop_poll(agent *a, const loop_state *ls, int64_t now, int *got_term) {
    struct pollfd pf[AGENT_MAX_TASKS + 2];
    task *pft[AGENT_MAX_TASKS + 2];
    int64_t wake = now + 1000;
    if (a->down_until_ms > now) wake = min64(wake, a->down_until_ms);
    for (int i = 0; i < a->n_tasks; i++)
        if (a->tasks[i]->kill_at_ms && !a->tasks[i]->exited) wake = min64(wake, a->tasks[i]->kill_at_ms);
    int nf = 0;
    pf[nf].fd = ls->sigfd;
    pf[nf].events = POLLIN;
    pft[nf++] = NULL;
    pf[nf].fd = a->wake_r;
    pf[nf].events = POLLIN;
    pft[nf++] = NULL;
    for (int i = 0; i < a->n_tasks; i++) {
        if (a->tasks[i]->fd < 0) continue;
        pf[nf].fd = a->tasks[i]->fd;
        pf[nf].events = POLLIN;
        pft[nf++] = a->tasks[i];
    }
    int timeout = (int)(wake - mono_ms());
    if (timeout < 0) timeout = 0;
    int pr = poll(pf, (nfds_t)nf, timeout);
    if (pr < 0 && errno != EINTR) {
        log_error("poll: %s", strerror(errno));
        return -1;
    }
    int got_chld = 0;
    *got_term = 0;
    if (pr > 0) {
        if (pf[0].revents) proc_sigpipe_drain(ls->sigfd, &got_chld, got_term);
        if (pf[1].revents) inbox_process(a);
        for (int i = 2; i < nf; i++)
            if (pf[i].revents) task_read(a, pft[i]);
    }
    return 0;
}

/* A stop signal: the first stops the tasks (SIGTERM, SIGKILL after the
 * grace) and the hand-out of more; a second kills every task now. */
static void loop_stop_signal(agent *a, loop_state *ls) {
    if (ls->stopping) {
        log_warn("second stop signal: killing every task now");
        for (int i = 0; i < a->n_tasks; i++)
            if (!a->tasks[i]->exited && a->tasks[i]->pid > 0) proc_signal_group(a->tasks[i]->pid, SIGKILL);
        ls->stop_deadline = mono_ms() + 1000;
        return;
    }
    ls->stopping = 1;
    a->quit = 1;    /* from here a task handed out is handed back */
    agent_drain(a); /* and the server hands out no more (before the exits requeue their jobs) */
    log_info("stopping: SIGTERM to %d task(s), SIGKILL after %d s", a->n_tasks, a->opt.stop_grace_s);
    for (int i = 0; i < a->n_tasks; i++) {
        task *t = a->tasks[i];
        if (t->exited || t->stop_sent) continue;
        snprintf(t->stop_reason, sizeof t->stop_reason, "agent stopping");
        t->stop_sent = 1;
        if (t->prep) { /* no worker yet: ends once its context comes back */
            ctxf_cancel(t->prep);
            continue;
        }
        t->kill_at_ms = mono_ms() + (int64_t)a->opt.stop_grace_s * 1000;
        proc_signal_group(t->pid, SIGTERM);
    }
    /* grace, then a few seconds to report the exits */
    ls->stop_deadline = mono_ms() + (int64_t)a->opt.stop_grace_s * 1000 + 5000;
    a->quit = 1;
}

/* The main loop, until a stop has ended (or poll fails). */
static void main_loop(agent *a, loop_state *ls) {
    for (;;) {
        int64_t now = mono_ms();
        loop_server(a, now);
        if (ls->stopping && loop_stopped(a, ls)) break;
        int got_term = 0;
        if (loop_poll(a, ls, now, &got_term) < 0) break;
        ctx_collect(a); /* contexts made ready (the same wake pipe) */
        if (got_term) loop_stop_signal(a, ls);
        tasks_check(a);
        if (a->n_relays) relays_reap(a);
        if (a->iso.n_grave) iso_sweep(&a->iso);
        state_save(a);
    }
}

/* The contexts still made ready cancelled, every task killed and its
 * isolation and files gone, what the agent holds freed. The poller thread
 * may sit in a long-poll: it dies with the process. Its state (a, the
 * inbox) is left for the process exit to reclaim. */
static void agent_shutdown(agent *a) {
    ctxf_stop(&a->ctx);
    for (int i = 0; i < a->n_relays; i++) kill(a->relays[i], SIGTERM); /* each ends its session */
    for (ctxf_req *r = ctxf_take_done(&a->ctx), *next; r; r = next) {
        next = r->next;
        task *t = task_find(a, r->task);
        if (t && t->prep == r) t->prep = NULL;
        free(r);
    }
    for (int i = 0; i < a->n_tasks; i++) {
        if (!a->tasks[i]->exited && a->tasks[i]->pid > 0) proc_signal_group(a->tasks[i]->pid, SIGKILL);
        if (a->tasks[i]->ctr_name[0] && a->podman[0] && !a->tasks[i]->exited && a->tasks[i]->pid > 0)
            ctr_remove(a->podman, a->tasks[i]->ctr_name, 15);
        int oom;
        iso_task_finish(&a->iso, &a->tasks[i]->iso, &oom);
        if (a->tasks[i]->ctx_tmp[0]) rm_tree(a->tasks[i]->ctx_tmp);
        task_free(a->tasks[i]);
    }
    iso_release(&a->iso);
    while (a->out_len) {
        free(a->outbox[a->out_head].body);
        a->out_head = (a->out_head + 1) % OUTBOX_MAX;
        a->out_len--;
    }
    for (int i = 0; i < a->n_recent; i++) free(a->recents[i].body);
    client_release(&a->http);
    a->quit = 1;
    log_info("stopped");
}

int agent_run(const agent_options *o) {
    if (setup_trust(o) < 0) return 1;
    agent *a = xcalloc(1, sizeof *a);
    g_agent = a;
    a->opt = *o;
    loop_state ls;
    memset(&ls, 0, sizeof ls);
    if (setup_isolation(a, o) < 0) {
        free(a);
        return 1;
    }
    setup_podman(a, o);
    setup_cache_dir(a, o);
    if (setup_io(a, o, &ls) < 0) {
        free(a);
        return 1;
    }
    setup_state_path(a, o);
    state_recover(a);
    int ret = 1;
    if (start_poller(a) == 0) {
        main_loop(a, &ls);
        ret = 0;
        if (a->out_len) log_warn("%d status report(s) not delivered", a->out_len);
    }
    agent_shutdown(a);
    return ret;
}

/* ---------------------------------------------------------------- flags */

void agent_options_default(agent_options *o) {
    memset(o, 0, sizeof *o);
    client_default_url(o->server, sizeof o->server);
    const char *t = getenv("TRAINYARD_TOKEN");
    if (t && *t) snprintf(o->token, sizeof o->token, "%s", t);
    o->heartbeat_s = 5;
    o->poll_wait_s = 20;
    o->stop_grace_s = 10;
    o->cache_max_mb = 4096;
    iso_options_default(&o->iso);
}

static void agent_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard agent --server URL (--token T | --token-file FILE) [--cpu-slots N]\n"
            "                       [--data-root DIR] [--hostname H] [--address A]\n"
            "  --server      the trainyard server (default $TRAINYARD_URL or http://127.0.0.1:8080);\n"
            "                several servers on one database: URL1,URL2,... (the agent speaks to the\n"
            "                one that leads, moving past one that is down or a standby, and hands\n"
            "                the list to its tasks)\n"
            "  --token       the node token (DATA/node.token of the server; or $TRAINYARD_TOKEN)\n"
            "  --token-file  read the node token from FILE\n"
            "  --ca-hash sha256:HEX  an https:// server's CA: fetched, and trusted only if the\n"
            "                sha256 of its public key is HEX (the server logs it; as kubeadm join's\n"
            "                --discovery-token-ca-cert-hash); over a list, from the first server that\n"
            "                answers, and it must have signed every server's certificate\n"
            "  --ca-cert FILE  trust this CA for an https:// server (default $TRAINYARD_CA, else\n"
            "                the system's store); its workers trust the same\n"
            "  --cpu-slots   CPU slots this node offers (default: the number of cores)\n"
            "  --data-root   directory relative data.path values and a command's working_dir\n"
            "                resolve against; tasks read it (read-only, mode o+rX) (default: the\n"
            "                agent's working directory)\n"
            "  --hostname    the node's name (default: gethostname)\n"
            "  --address     the address peers reach this node's workers at\n"
            "                (default 127.0.0.1 for a loopback server, else the hostname)\n"
            "  --worker-nice run the tasks' processes at this nice value, 0-19 (default 0): they then\n"
            "                yield the cores to the agent and anything else on the node when both want them\n"
            "  --worker-sched normal|idle  idle: the tasks' processes run under SCHED_IDLE, on the\n"
            "                CPU time no other process wants, so the agent, a server beside them or a\n"
            "                shell never waits for a core behind them (`trainyard up` sets idle;\n"
            "                default normal)\n"
            "  --state-file  where the agent keeps the tasks it answers for, so a restarted agent\n"
            "                reports the tasks of a killed one as lost (default: a file in\n"
            "                $XDG_RUNTIME_DIR, $TMPDIR or /tmp named by server, hostname and uid)\n"
            "  --isolation auto|user|none  user: each job's tasks run under a uid of their own from\n"
            "                --task-uids, with a private /tmp, /var/tmp and /dev/shm, a /proc that\n"
            "                hides other users, and a job directory of their own (needs root);\n"
            "                auto (default): user when the agent runs as root; none: as the agent\n"
            "  --task-uids A-B   the uids (and gids) tasks run under (default 200000-299999)\n"
            "  --task-dir DIR    where job directories are made (default /var/lib/trainyard-tasks)\n"
            "  --task-pids-max N processes and threads one task may have (default 4096; 0: no limit)\n"
            "  --memory SIZE     memory this node offers its tasks, e.g. 64GiB (default: its memory,\n"
            "                or its cgroup's limit, less a tenth kept for the system, at most 4 GiB)\n"
            "  --podman PATH     the container runtime that runs jobs with an image (default: podman\n"
            "                on the PATH, when the agent isolates tasks as root; none: no images here)\n"
            "  --podman-runtime NAME  podman's OCI runtime (default: runc when installed, else podman's choice)\n"
            "  --cache-dir DIR   where contexts are kept once fetched (default /var/cache/trainyard as\n"
            "                root, else $TMPDIR/trainyard-cache-UID)\n"
            "  --cache-max-mb N  contexts kept there, least recently used dropped first (default 4096)\n"
            "  --log-level debug|info|warn|error   --log-format text|json   (default info, text)\n");
}

static int read_token_file(const char *path, char *out, size_t outlen) {
    size_t len = 0;
    char *s = file_read_all(path, 1024, &len);
    if (!s) {
        fprintf(stderr, "trainyard agent: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ')) s[--len] = '\0';
    int rc = (len && sfmt(out, outlen, "%s", s) == 0) ? 0 : -1;
    free(s);
    if (rc < 0) fprintf(stderr, "trainyard agent: %s holds no token\n", path);
    return rc;
}

/* Whether every server of the list is on this machine. */
static int url_is_loopback(const char *list) {
    char url[512];
    int any = 0;
    for (int i = 0; client_url_at(list, i, url, sizeof url) == 0; i++) {
        const char *h = strstr(url, "://");
        h = h ? h + 3 : url;
        if (strncmp(h, "127.", 4) != 0 && strncmp(h, "localhost", 9) != 0 && strncmp(h, "[::1]", 5) != 0) return 0;
        any = 1;
    }
    return any;
}

/* ---------------------------------------------------------------- flags
 *
 * The agent's flags, one row each (common/flags.h); the parsers below are
 * for the flags a kind does not say: 0, -1 (the row's "wants" is said) or
 * -2 (they said why themselves). */

static int flag_ca_cert(void *opts, const char *arg)
{
    (void)opts;
    char err[600];
    if (client_trust_ca_file(arg, "--ca-cert", err, sizeof err) < 0) {
        fprintf(stderr, "trainyard agent: %s\n", err);
        return -2;
    }
    return 0;
}

static int flag_token_file(void *opts, const char *arg)
{
    agent_options *o = opts;
    return read_token_file(arg, o->token, sizeof o->token) < 0 ? -2 : 0;
}

/* FIRST-LAST, 0 < FIRST <= LAST */
static int flag_task_uids(void *opts, const char *arg)
{
    agent_options *o = opts;
    long lo = 0, hi = 0;
    const char *dash = strchr(arg, '-');
    char first[32];
    if (!dash || (size_t)(dash - arg) >= sizeof first) return -1;
    memcpy(first, arg, (size_t)(dash - arg));
    first[dash - arg] = '\0';
    if (parse_long(first, 1, 4294967294L, &lo) < 0 || parse_long(dash + 1, 1, 4294967294L, &hi) < 0 || hi < lo)
        return -1;
    o->iso.uid_first = (unsigned)lo;
    o->iso.uid_last = (unsigned)hi;
    return 0;
}

static int flag_podman_runtime(void *opts, const char *arg)
{
    agent_options *o = opts;
    return arg[0] == '-' || sfmt(o->podman_runtime, sizeof o->podman_runtime, "%s", arg) < 0 ? -1 : 0;
}

static int flag_cache_max_mb(void *opts, const char *arg)
{
    long v = 0;
    if (parse_long(arg, 1, 1L << 24, &v) < 0) return -1;
    ((agent_options *)opts)->cache_max_mb = v;
    return 0;
}

static int flag_memory(void *opts, const char *arg)
{
    int64_t mb = 0;
    spec_error se;
    if (jobspec_size_text(arg, &JOBSPEC_SIZE_MEMORY, &mb, &se) < 0) {
        fprintf(stderr, "trainyard agent: --memory: %s\n", se.message);
        return -2;
    }
    ((agent_options *)opts)->iso.memory_mb = mb;
    return 0;
}

/* the agent's log settings take effect at once (its own log lines) */
static int flag_log_level(void *opts, const char *arg)
{
    (void)opts;
    log_level l;
    if (log_level_parse(arg, &l) < 0) return -1;
    log_set_level(l);
    return 0;
}

static int flag_log_format(void *opts, const char *arg)
{
    (void)opts;
    log_format f;
    if (log_format_parse(arg, &f) < 0) return -1;
    log_set_format(f);
    return 0;
}

static const char *const WORKER_SCHED[] = {"normal", "idle", NULL}; /* the index is worker_idle */
static const char *const ISOLATION[] = {"auto", "none", "user", NULL}; /* ISO_AUTO, ISO_NONE, ISO_USER */

#define AO agent_options
static const flag_def AGENT_FLAGS[] = {
    FLAG_TEXT_AT("server", AO, server, "the server's URL, or a comma-separated list of them (under 512 bytes)"),
    FLAG_TEXT_AT("token", AO, token, "the node token (under 256 bytes)"),
    FLAG_FUNC_AT("ca-cert", flag_ca_cert, "a PEM file of CA certificates"),
    FLAG_TEXT_AT("ca-hash", AO, ca_hash, "sha256: and 64 hex digits"),
    FLAG_FUNC_AT("token-file", flag_token_file, "a file holding the node token"),
    FLAG_INT_AT("cpu-slots", AO, cpu_slots, 0, 100000, "a number (0-100000; 0: the online cores)"),
    FLAG_TEXT_AT("data-root", AO, data_root, "a directory (a shorter path)"),
    FLAG_TEXT_AT("hostname", AO, hostname, "a name (under 256 bytes)"),
    FLAG_TEXT_AT("address", AO, address, "an address (under 256 bytes)"),
    FLAG_INT_AT("heartbeat", AO, heartbeat_s, 1, 3600, "seconds (1-3600)"),
    FLAG_INT_AT("poll-wait", AO, poll_wait_s, 1, 60, "seconds (1-60)"),
    FLAG_TEXT_AT("state-file", AO, state_file, "a file (a shorter path)"),
    FLAG_INT_AT("worker-nice", AO, worker_nice, 0, 19, "a number (0-19)"),
    FLAG_CHOICE_AT("worker-sched", AO, worker_idle, WORKER_SCHED, "normal or idle"),
    FLAG_CHOICE_AT("isolation", AO, iso.mode, ISOLATION, "auto, user or none"),
    FLAG_FUNC_AT("task-uids", flag_task_uids, "FIRST-LAST with 0 < FIRST <= LAST, e.g. 200000-299999"),
    FLAG_PATH_AT("task-dir", AO, iso.task_root, "an absolute path"),
    FLAG_INT_AT("task-pids-max", AO, iso.pids_max, 0, 4194304, "a number (0-4194304)"),
    FLAG_FUNC_AT("memory", flag_memory, "a size"),
    FLAG_TEXT_AT("podman", AO, podman, "a program (a shorter path), or none"),
    FLAG_FUNC_AT("podman-runtime", flag_podman_runtime, "a runtime's name (runc, crun)"),
    FLAG_PATH_AT("cache-dir", AO, cache_dir, "an absolute path"),
    FLAG_FUNC_AT("cache-max-mb", flag_cache_max_mb, "a number of MiB (1-16777216)"),
    FLAG_FUNC_AT("log-level", flag_log_level, "debug, info, warn or error"),
    FLAG_FUNC_AT("log-format", flag_log_format, "text or json"),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL},
};
#undef AO

int agent_parse_flags(agent_options *o, int argc, char **argv) {
    int rc = flags_parse(AGENT_FLAGS, o, argc, argv, "trainyard agent", agent_usage);
    if (rc != 0) return rc;
    char err[300];
    int n_urls = 0;
    if (client_url_list_check(o->server, "--server", &n_urls, err, sizeof err) < 0) {
        fprintf(stderr, "trainyard agent: %s\n", err);
        return -1;
    }
    if (!o->token[0]) {
        fprintf(stderr, "trainyard agent: no token: pass --token or --token-file (the server's DATA/node.token)\n");
        return -1;
    }
    /* relative data paths and a command's working directory resolve where
     * the agent was started, as they did when tasks inherited its cwd */
    if (!o->data_root[0] && !getcwd(o->data_root, sizeof o->data_root)) o->data_root[0] = '\0';
    if (!o->hostname[0] && gethostname(o->hostname, sizeof o->hostname - 1) < 0)
        snprintf(o->hostname, sizeof o->hostname, "localhost");
    if (!o->address[0])
        snprintf(o->address, sizeof o->address, "%s", url_is_loopback(o->server) ? "127.0.0.1" : o->hostname);
    if (o->cpu_slots == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->cpu_slots = n > 0 ? (int)n : 1;
    }
    return 0;
}

int cmd_agent(int argc, char **argv) {
    agent_options o;
    agent_options_default(&o);
    int rc = agent_parse_flags(&o, argc, argv);
    if (rc != 0) return rc > 0 ? 0 : 2;
    log_set_prefix("agent");
    return agent_run(&o);
}
