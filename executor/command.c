/* command.c - a command job's task (see command.h): config -> restore the
 * checkpoint directory (attempt >= 2) -> rendezvous (each task publishes
 * the address its program will listen on) -> environment -> fork/exec in a
 * new process group -> forward output, parse metric lines, relay stops ->
 * upload the newest checkpoint file (chief) -> the program's exit status.
 * Metrics and periodic checkpoints go through the report sender
 * (executor/report.h), as the training worker's do. */
#include "command.h"
#include "container.h"
#include "proc.h"
#include "report.h"
#include "exit_codes.h"
#include "../client/blobxfer.h"
#include "../client/client.h"
#include "../common/util.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CMD_STOP_GRACE_MS 5000      /* SIGTERM -> SIGKILL of the program's group (the agent
                                     * allows the worker 10 s: the rest is for the upload) */
#define CMD_DRAIN_MS 2000           /* output still read after the program exited */
#define CMD_LINE_MAX 65536          /* longer lines are forwarded in pieces, never parsed */
#define CMD_RDV_DEADLINE_S 600      /* peers that have not published by then: give up */
#define CMD_RDV_WAIT_S 20           /* one long-poll of the rendezvous */
#define CMD_STEP_MS 100             /* at most ~10 step metrics a second */
#define CMD_FINAL_FLUSH_S 900       /* how long a finished task waits for the server */
#define CMD_STOP_FLUSH_S 4          /* ... and a stopped one (the agent kills it soon) */
#define CMD_HEADER_MAX (1 << 16)    /* the safetensors header of a wrapped file */
#define CMD_CKPT_POLL_MS 10000      /* the chief looks for a new checkpoint file this often */
#define CMD_CKPT_SETTLE_MS 2000     /* ... and uploads one untouched for this long */
#define CMD_FOLLOW_MS 2000          /* the evaluator looks for a new job checkpoint this often */
#define METRIC_PREFIX "trainyard-metric "

/* ---------------------------------------------------------------- config */

typedef struct cmd_addr {
    char host[256];
    int port;
} cmd_addr;

typedef struct cconfig {
    int64_t job;
    int64_t team;                /* the job's team: whose pulls of an image count (container.h) */
    int attempt;
    char api[512];
    char token[256];
    int is_ps;                   /* task type ps (else worker; "chief" is worker 0) */
    int is_eval;                 /* task type evaluator: beside the gang, not in its cluster */
    int index;
    int n_workers, n_ps;
    cmd_addr *workers;           /* (n_workers) from cluster.worker: node and scheduler port */
    cmd_addr *ps;                /* (n_ps) */
    int n_cpu;                   /* cpu:N devices of this task */
    char gpus[256];              /* "0,1": the gpu:N devices ("" for CPU tasks) */
    cJSON *devices;              /* owned copy of config.devices */
} cconfig;

static int parse_hostport(const cJSON *hp, cmd_addr *a) {
    const char *colon = cJSON_IsString(hp) ? strrchr(hp->valuestring, ':') : NULL;
    long p = 0;
    if (!colon || parse_long(colon + 1, 1, 65535, &p) < 0) return -1;
    size_t hl = (size_t)(colon - hp->valuestring);
    if (hl == 0 || hl >= sizeof a->host) return -1;
    memcpy(a->host, hp->valuestring, hl);
    a->host[hl] = '\0';
    a->port = (int)p;
    return 0;
}

static int parse_addrs(const cJSON *arr, cmd_addr **out, int *n, const char *what, char *err, size_t errlen) {
    *n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (*n > 4096) {
        snprintf(err, errlen, "TRAINYARD_CONFIG has %d %s tasks", *n, what);
        return -1;
    }
    *out = xcalloc((size_t)(*n ? *n : 1), sizeof **out);
    int i = 0;
    const cJSON *hp;
    cJSON_ArrayForEach(hp, arr) {
        if (parse_hostport(hp, &(*out)[i]) < 0) {
            snprintf(err, errlen, "TRAINYARD_CONFIG cluster.%s[%d] is not host:port", what, i);
            return -1;
        }
        i++;
    }
    return 0;
}

static int config_parse(const char *text, cconfig *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    int rc = -1;
    cJSON *o = cJSON_Parse(text);
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(o, "job");
    const cJSON *api = cJSON_GetObjectItemCaseSensitive(o, "api");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "token");
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(o, "task");
    const cJSON *cluster = cJSON_GetObjectItemCaseSensitive(o, "cluster");
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(job) || !cJSON_IsString(api) || !cJSON_IsString(tok) ||
        !cJSON_IsObject(task) || !cJSON_IsObject(cluster)) {
        snprintf(err, errlen, "TRAINYARD_CONFIG lacks job, api, token, task or cluster");
        goto out;
    }
    if (!(job->valuedouble >= 1 && job->valuedouble <= 9007199254740992.0)) {
        snprintf(err, errlen, "TRAINYARD_CONFIG job is not a job id");
        goto out;
    }
    c->job = (int64_t)job->valuedouble;
    const cJSON *att = cJSON_GetObjectItemCaseSensitive(o, "attempt");
    c->attempt = cJSON_IsNumber(att) ? att->valueint : 1;
    const cJSON *team = cJSON_GetObjectItemCaseSensitive(o, "team");
    c->team = cJSON_IsNumber(team) && team->valuedouble >= 1 && team->valuedouble <= 9007199254740992.0
                  ? (int64_t)team->valuedouble
                  : 0;
    if (sfmt(c->api, sizeof c->api, "%s", api->valuestring) < 0 ||
        sfmt(c->token, sizeof c->token, "%s", tok->valuestring) < 0) {
        snprintf(err, errlen, "TRAINYARD_CONFIG api or token too long");
        goto out;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(task, "type");
    const cJSON *ix = cJSON_GetObjectItemCaseSensitive(task, "index");
    c->is_ps = cJSON_IsString(ty) && strcmp(ty->valuestring, "ps") == 0;
    c->is_eval = cJSON_IsString(ty) && strcmp(ty->valuestring, "evaluator") == 0;
    c->index = cJSON_IsNumber(ix) ? ix->valueint : 0;
    if (parse_addrs(cJSON_GetObjectItemCaseSensitive(cluster, "worker"), &c->workers, &c->n_workers, "worker", err,
                    errlen) < 0 ||
        parse_addrs(cJSON_GetObjectItemCaseSensitive(cluster, "ps"), &c->ps, &c->n_ps, "ps", err, errlen) < 0)
        goto out;
    if (c->n_workers < 1) {
        snprintf(err, errlen, "TRAINYARD_CONFIG cluster.worker is empty");
        goto out;
    }
    if (c->is_eval ? c->index != 0 : c->index < 0 || c->index >= (c->is_ps ? c->n_ps : c->n_workers)) {
        snprintf(err, errlen, "task index %d is not one of the %d %s tasks", c->index,
                 c->is_ps ? c->n_ps : c->n_workers, c->is_ps ? "ps" : "worker");
        goto out;
    }
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(o, "devices");
    c->devices = cJSON_IsArray(devs) ? cJSON_Duplicate(devs, 1) : cJSON_CreateArray();
    if (!c->devices) abort();
    buf g;
    buf_init(&g, sizeof c->gpus - 1);
    const cJSON *d;
    cJSON_ArrayForEach(d, c->devices) {
        if (!cJSON_IsString(d)) continue;
        if (strncmp(d->valuestring, "cpu", 3) == 0) c->n_cpu++;
        if (strncmp(d->valuestring, "gpu:", 4) == 0 &&
            buf_printf(&g, "%s%s", g.len ? "," : "", d->valuestring + 4) < 0) {
            buf_release(&g);
            snprintf(err, errlen, "too many gpu devices");
            goto out;
        }
    }
    snprintf(c->gpus, sizeof c->gpus, "%s", g.data ? g.data : "");
    buf_release(&g);
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

static void config_release(cconfig *c) {
    free(c->workers);
    free(c->ps);
    cJSON_Delete(c->devices);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- run state */

/* One version of a file of the checkpoint directory. */
typedef struct ck_ident {
    char name[256];              /* "" = none */
    off_t size;
    struct timespec mtime;
} ck_ident;

static int ident_eq(const ck_ident *a, const ck_ident *b) {
    return strcmp(a->name, b->name) == 0 && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec;
}

typedef struct cmd_run {
    const jobspec *spec;
    cconfig cfg;
    volatile sig_atomic_t *stop;
    int chief;                   /* worker 0: reports metrics, uploads the checkpoint */
    char task_name[32];          /* "worker-0", "ps-1", "evaluator-0" */
    client cl;
    int have_client;
    char scratch[PATH_MAX];      /* the task's scratch dir (removed at the end) */
    char ckdir[PATH_MAX];        /* scratch/checkpoint: TRAINYARD_CHECKPOINT_DIR */
    char restored[256];          /* the file restored there ("" none) */
    ck_ident restored_id;
    int64_t next_ck_poll_ms;     /* chief: when to look at the checkpoint directory again */
    int64_t follow_id;           /* evaluator: the job checkpoint now in its directory (0 none) */
    int64_t next_follow_ms;      /* evaluator: when to look at the job's checkpoints again */
    cmd_addr *peer_w, *peer_ps;  /* addresses published by the tasks (rendezvous) */
    report_sender *snd;          /* chief: the metrics and checkpoint sender */
    int64_t last_step_ms;        /* when the last step metric was queued */
    cJSON *held_step;            /* a step metric held back by the rate limit */
    long seen_step, seen_epoch;  /* latest step / epoch in metric lines (checkpoint label) */
    long metric_lines, metric_bad;
    int in_ctr;                  /* the program runs in the spec's image (container.h) */
    ctr_opts ctr;
    char wd[PATH_MAX];           /* the program's working directory ("" this worker's) */
    int64_t last_seq;            /* chief: the job's last metric seq before this attempt */
    char **envp;                 /* the program's environment */
    char *const *argv;           /* the program: the spec's command, or own_argv */
    char **own_argv;             /* an interactive job's program (run_program), owned */
    char nb_token[65];           /* a notebook's Jupyter token ("" none) */
    report_sender sender;        /* what snd points to once started */
    int ret;                     /* the exit status (command.h) */
    char err[512];               /* why the task ended early */
} cmd_run;

/* ---------------------------------------------------------------- resume state */

/* The job's last metric seq (metrics continue after it, across attempts). */
static int fetch_last_seq(cmd_run *r, int64_t *out, char *err, size_t errlen) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?last=1", (long long)r->cfg.job);
    int64_t backoff = 0;
    for (;;) {
        client_reply rep;
        int e = client_request(&r->cl, "GET", path, NULL, 0, NULL, &rep);
        if (e == 0 && rep.status == 200) {
            cJSON *o = cJSON_ParseWithLength(rep.body.data ? rep.body.data : "", rep.body.len);
            const cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "last_seq");
            /* within +-2^53, or the cast would be undefined behaviour */
            int ok = cJSON_IsNumber(ls) && ls->valuedouble >= 0 && ls->valuedouble <= 9007199254740992.0;
            if (ok) *out = (int64_t)ls->valuedouble;
            cJSON_Delete(o);
            client_reply_release(&rep);
            if (!ok) snprintf(err, errlen, "GET %s: no last_seq in the answer", path);
            return ok ? 0 : -1;
        }
        long st = e < 0 ? 0 : rep.status;
        client_reply_release(&rep);
        if (st >= 400 && st < 500) {
            snprintf(err, errlen, "GET %s answered %ld", path, st);
            return -1;
        }
        if (report_wait_retry(r->stop, &backoff) < 0) {
            snprintf(err, errlen, "stopped before the program started");
            return -1;
        }
    }
}

/* ---------------------------------------------------------------- metric lines */

/* Checks one metric as the API will (docs/api-executors.md), so that one bad
 * line never costs a whole batch: NULL when fine, else the reason. */
static const char *metric_invalid(cJSON *m) {
    if (!cJSON_IsObject(m)) return "not a JSON object";
    cJSON_DeleteItemFromObjectCaseSensitive(m, "seq"); /* trainyard numbers metrics itself */
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(m, "kind");
    if (k && (!cJSON_IsString(k) || (strcmp(k->valuestring, "step") != 0 && strcmp(k->valuestring, "epoch") != 0 &&
                                     strcmp(k->valuestring, "test") != 0)))
        return "kind must be \"step\", \"epoch\" or \"test\"";
    static const char *const ints[] = {"step", "epoch"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, ints[i]);
        if (!v || cJSON_IsNull(v)) continue;
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (d < 0 || d > 9007199254740992.0 || d != (double)(long long)d)
            return i == 0 ? "step must be a non-negative integer" : "epoch must be a non-negative integer";
    }
    for (const cJSON *v = m->child; v; v = v->next)
        if (!(cJSON_IsNumber(v) || cJSON_IsString(v) || cJSON_IsBool(v) || cJSON_IsNull(v)))
            return "values must be numbers, strings, booleans or null";
    if (cJSON_GetArraySize(m) == 0) return "empty";
    if (!k && !cJSON_AddStringToObject(m, "kind", "step")) abort();
    return NULL;
}

static void held_flush(cmd_run *r) {
    if (!r->held_step) return;
    report_push(r->snd, r->held_step);
    r->held_step = NULL;
    r->last_step_ms = mono_ms();
}

/* A `trainyard-metric {json}` line of the chief's stdout. Step metrics: the
 * first at once, then at most one per CMD_STEP_MS (the newest wins, the
 * last one always goes); epoch and test metrics always, in order. */
static void metric_line(cmd_run *r, const char *json) {
    r->metric_lines++;
    cJSON *m = cJSON_Parse(json);
    const char *why = m ? metric_invalid(m) : "not JSON";
    if (why) {
        cJSON_Delete(m);
        if (r->metric_bad++ < 20) log_warn("metric line ignored (%s): %.200s", why, json);
        return;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "step");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(m, "epoch");
    if (cJSON_IsNumber(st)) r->seen_step = (long)st->valuedouble;
    if (cJSON_IsNumber(ep)) r->seen_epoch = (long)ep->valuedouble;
    const char *kind = cJSON_GetObjectItemCaseSensitive(m, "kind")->valuestring;
    if (strcmp(kind, "step") == 0) {
        int64_t now = mono_ms();
        if (r->last_step_ms == 0 || now - r->last_step_ms >= CMD_STEP_MS) {
            cJSON_Delete(r->held_step);
            r->held_step = m;
            held_flush(r);
        } else {
            cJSON_Delete(r->held_step); /* superseded by a newer step */
            r->held_step = m;
        }
        return;
    }
    held_flush(r);
    report_push(r->snd, m);
}

/* ---------------------------------------------------------------- rendezvous */

/* A TCP port free now on this node: want when it can be bound, else one
 * the kernel picks. The program binds it after us (torch's store, a TF
 * server); 0 when no port can be had. */
static int port_pick(int want) {
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return 0;
        /* as servers bind (torch's store, gRPC): a port in TIME_WAIT is free */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)(attempt == 0 ? want : 0));
        socklen_t len = sizeof a;
        int port = 0;
        if ((attempt == 1 || want > 0) && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        close(fd);
        if (port) return port;
    }
    return 0;
}

/* One task's {addr, port} from the rendezvous (key "command-TYPE-INDEX"). */
static int rdv_read(const report_api *a, const char *key, int64_t deadline, cmd_addr *out, char *err, size_t errlen) {
    cJSON *o = NULL;
    int rc = report_rdv_get(a, key, CMD_RDV_WAIT_S, deadline, &o, err, errlen);
    if (rc == REPORT_RDV_TIMEOUT) snprintf(err, errlen, "task %s did not join within %d s", key + 8, CMD_RDV_DEADLINE_S);
    if (rc < 0) return -1;
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(o, "addr");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "port");
    int ok = cJSON_IsString(ad) && cJSON_IsNumber(p) && p->valueint > 0 && p->valueint <= 65535 &&
             sfmt(out->host, sizeof out->host, "%s", ad->valuestring) == 0;
    if (ok) out->port = p->valueint;
    cJSON_Delete(o);
    if (!ok) snprintf(err, errlen, "task %s published a malformed address", key + 8);
    return ok ? 0 : -1;
}

/* Publishes this task's {addr, port} as command-TYPE-INDEX in the attempt's
 * rendezvous and reads every task's: all of them have started when it returns 0. */
static int rendezvous(cmd_run *r, char *err, size_t errlen) {
    const cconfig *c = &r->cfg;
    report_api a = {&r->cl, c->job, r->stop, "stopped before the program started"};
    char key[64];
    if (c->is_eval) goto read; /* the evaluator is not in the cluster: it only reads it */
    cmd_addr me = c->is_ps ? c->ps[c->index] : c->workers[c->index];
    int port = port_pick(me.port);
    if (!port) {
        snprintf(err, errlen, "no free TCP port on this node");
        return -1;
    }
    if (port != me.port) log_info("port %d is taken: the program gets port %d", me.port, port);
    me.port = port;
    snprintf(key, sizeof key, "command-%s-%d", c->is_ps ? "ps" : "worker", c->index);
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "addr", me.host) || !cJSON_AddNumberToObject(o, "port", me.port)) abort();
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) abort();
    int published = report_rdv_put(&a, key, body, err, errlen);
    free(body);
    if (published < 0) return -1;
read:
    r->peer_w = xcalloc((size_t)c->n_workers, sizeof *r->peer_w);
    r->peer_ps = xcalloc((size_t)(c->n_ps ? c->n_ps : 1), sizeof *r->peer_ps);
    int64_t deadline = mono_ms() + (int64_t)CMD_RDV_DEADLINE_S * 1000;
    for (int i = 0; i < c->n_workers; i++) {
        snprintf(key, sizeof key, "command-worker-%d", i);
        if (rdv_read(&a, key, deadline, &r->peer_w[i], err, errlen) < 0) return -1;
    }
    for (int i = 0; i < c->n_ps; i++) {
        snprintf(key, sizeof key, "command-ps-%d", i);
        if (rdv_read(&a, key, deadline, &r->peer_ps[i], err, errlen) < 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- environment */

static cJSON *addr_list(const cmd_addr *a, int n) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) abort();
    for (int i = 0; i < n; i++) {
        char hp[300];
        snprintf(hp, sizeof hp, "%s:%d", a[i].host, a[i].port);
        cJSON *s = cJSON_CreateString(hp);
        if (!s || !cJSON_AddItemToArray(arr, s)) abort();
    }
    return arr;
}

/* TF_CONFIG as TensorFlow's TFConfigClusterResolver reads it. No "chief"
 * job: worker 0 is the chief (TF's multi_worker_util.is_chief, and
 * Kubeflow's TFJob for MultiWorkerMirroredStrategy); "ps" only when the job
 * has parameter servers. */
static char *tf_config(const cmd_run *r) {
    const cconfig *c = &r->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON *cl = cJSON_AddObjectToObject(o, "cluster");
    if (!o || !cl) abort();
    cJSON_AddItemToObject(cl, "worker", addr_list(r->peer_w, c->n_workers));
    if (c->n_ps) cJSON_AddItemToObject(cl, "ps", addr_list(r->peer_ps, c->n_ps));
    cJSON *t = cJSON_AddObjectToObject(o, "task");
    if (!t || !cJSON_AddStringToObject(t, "type", c->is_eval ? "evaluator" : c->is_ps ? "ps" : "worker") ||
        !cJSON_AddNumberToObject(t, "index", c->index))
        abort();
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) abort();
    return s;
}

/* TRAINYARD_CONFIG for the program (docs/command-jobs.md). */
static char *ty_config(const cmd_run *r) {
    const cconfig *c = &r->cfg;
    cJSON *o = cJSON_CreateObject();
    if (!o) abort();
    cJSON_AddNumberToObject(o, "job", (double)c->job);
    cJSON_AddNumberToObject(o, "attempt", c->attempt);
    cJSON *t = cJSON_AddObjectToObject(o, "task");
    cJSON_AddStringToObject(t, "type", c->is_eval ? "evaluator" : c->is_ps ? "ps" : "worker");
    cJSON_AddNumberToObject(t, "index", c->index);
    cJSON_AddBoolToObject(o, "chief", r->chief);
    /* this task among the job's tasks of its type on the same node (e.g. to
     * do node-local work once) */
    const cmd_addr *same = c->is_ps ? c->ps : c->workers;
    int n_same = c->is_ps ? c->n_ps : c->n_workers, local = 0, local_n = 0;
    for (int i = 0; i < n_same && !c->is_eval; i++) {
        if (strcmp(same[i].host, same[c->index].host) != 0) continue;
        if (i < c->index) local++;
        local_n++;
    }
    cJSON *nl = cJSON_AddObjectToObject(o, "node_local");
    cJSON_AddNumberToObject(nl, "index", local);
    cJSON_AddNumberToObject(nl, "count", c->is_eval ? 1 : local_n);
    cJSON *cl = cJSON_AddObjectToObject(o, "cluster");
    cJSON_AddItemToObject(cl, "worker", addr_list(r->peer_w, c->n_workers));
    cJSON_AddItemToObject(cl, "ps", addr_list(r->peer_ps, c->n_ps));
    cJSON_AddItemToObject(o, "devices", cJSON_Duplicate(c->devices, 1));
    /* api: one URL, as a program joins it with a path: the server this
     * runner reached last; servers: every one it was given (the agent's
     * list, docs/command-jobs.md) */
    cJSON_AddStringToObject(o, "api", r->cl.url[0] ? r->cl.url : c->api);
    cJSON *sv = cJSON_AddArrayToObject(o, "servers");
    char one[512];
    for (int i = 0; sv && client_url_at(c->api, i, one, sizeof one) == 0; i++)
        cJSON_AddItemToArray(sv, cJSON_CreateString(one));
    cJSON_AddStringToObject(o, "token", c->token);
    cJSON_AddStringToObject(o, "checkpoint_dir", r->ckdir);
    if (r->restored[0]) cJSON_AddStringToObject(o, "restored", r->restored);
    else cJSON_AddNullToObject(o, "restored");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) abort();
    return s;
}

static int env_name_eq(const char *entry, const char *name_eq) {
    size_t n = strcspn(name_eq, "=");
    return strncmp(entry, name_eq, n) == 0 && entry[n] == '=';
}

static int env_has(char *const *list, int n, const char *entry) {
    for (int i = 0; i < n; i++)
        if (list[i] && env_name_eq(entry, list[i])) return 1;
    return 0;
}

static char *env_fmt(const char *name, const char *value) {
    size_t n = strlen(name) + strlen(value) + 2;
    char *s = xmalloc(n);
    snprintf(s, n, "%s=%s", name, value);
    return s;
}

/* The program's environment: trainyard's variables, then the spec's env,
 * then the worker's own (without its TRAINYARD_CONFIG). Every string is
 * owned; NULL-terminated. */
static char **env_build(const cmd_run *r) {
    const cconfig *c = &r->cfg;
    const command_spec *cs = &r->spec->command;
    char *ours[24];
    int n = 0;
    char num[32];
    char *tf = tf_config(r), *ty = ty_config(r);
    ours[n++] = env_fmt("TF_CONFIG", tf);
    ours[n++] = env_fmt("TRAINYARD_CONFIG", ty);
    free(tf);
    free(ty);
    ours[n++] = env_fmt("TRAINYARD_CHECKPOINT_DIR", r->ckdir);
    ours[n++] = env_fmt("MASTER_ADDR", r->peer_w[0].host);
    snprintf(num, sizeof num, "%d", r->peer_w[0].port);
    ours[n++] = env_fmt("MASTER_PORT", num);
    snprintf(num, sizeof num, "%d", c->n_workers);
    ours[n++] = env_fmt("WORLD_SIZE", num);
    if (!c->is_ps && !c->is_eval) {
        /* One process per task, which sees only its own devices (as a
         * Kubeflow PyTorchJob pod does): local rank 0 of 1, so that
         * torch.cuda.set_device(LOCAL_RANK) is the task's first GPU. The
         * position among the job's tasks on the node is in TRAINYARD_CONFIG. */
        snprintf(num, sizeof num, "%d", c->index);
        ours[n++] = env_fmt("RANK", num);
        ours[n++] = env_fmt("LOCAL_RANK", "0");
        ours[n++] = env_fmt("LOCAL_WORLD_SIZE", "1");
        /* elastic jobs: the job's most workers, and how many micro-batches
         * each rank splits its share of a global batch into so that the
         * global batch stays what it is at the most workers (as torchrun's
         * elastic agent leaves to the script: docs/command-jobs.md) */
        int wmax = r->spec->resources.workers > c->n_workers ? r->spec->resources.workers : c->n_workers;
        snprintf(num, sizeof num, "%d", wmax);
        ours[n++] = env_fmt("TRAINYARD_WORKERS_MAX", num);
        snprintf(num, sizeof num, "%d", (wmax + c->n_workers - 1) / (c->n_workers > 0 ? c->n_workers : 1));
        ours[n++] = env_fmt("TRAINYARD_ACCUMULATION", num);
    }
    ours[n++] = env_fmt("CUDA_VISIBLE_DEVICES", c->gpus);
    /* a notebook's token in its environment, not its argv (which every
     * user of the node may read in /proc) */
    if (r->nb_token[0]) ours[n++] = env_fmt("JUPYTER_TOKEN", r->nb_token);
    /* defaults the spec's env may change: live output from Python, and as
     * many OpenMP threads as the task has CPU slots */
    if (!env_has(cs->env, cs->n_env, "PYTHONUNBUFFERED=")) ours[n++] = env_fmt("PYTHONUNBUFFERED", "1");
    if (c->n_cpu > 0 && !env_has(cs->env, cs->n_env, "OMP_NUM_THREADS=")) {
        snprintf(num, sizeof num, "%d", c->n_cpu);
        ours[n++] = env_fmt("OMP_NUM_THREADS", num);
    }
    size_t n_env = 0;
    while (environ && environ[n_env]) n_env++;
    char **envp = xcalloc((size_t)n + (size_t)cs->n_env + n_env + 1, sizeof *envp);
    size_t k = 0;
    for (int i = 0; i < n; i++) envp[k++] = ours[i];
    for (int i = 0; i < cs->n_env; i++) envp[k++] = xstrdup(cs->env[i]);
    for (size_t i = 0; i < n_env; i++) {
        if (env_name_eq(environ[i], "TRAINYARD_CONFIG=") || env_has(ours, n, environ[i]) ||
            env_has(cs->env, cs->n_env, environ[i]))
            continue;
        envp[k++] = xstrdup(environ[i]);
    }
    envp[k] = NULL;
    return envp;
}

static void env_free(char **envp) {
    for (size_t i = 0; envp && envp[i]; i++) free(envp[i]);
    free(envp);
}

static const char *env_get(char *const *envp, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; envp[i]; i++)
        if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=') return envp[i] + n + 1;
    return NULL;
}

/* The program's path: argv0 itself when it holds a '/' (relative to the
 * working directory), else the first executable match in the PATH of envp. */
static int exe_resolve(const char *argv0, char *const *envp, char *out, size_t cap) {
    if (strchr(argv0, '/')) return sfmt(out, cap, "%s", argv0);
    const char *path = env_get(envp, "PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        struct stat sb;
        if (sfmt(out, cap, "%.*s%s%s", (int)n, path, n ? "/" : "", argv0) == 0 && stat(out, &sb) == 0 &&
            S_ISREG(sb.st_mode) && access(out, X_OK) == 0)
            return 0;
        path += n;
        if (*path == ':') path++;
    }
    return -1;
}

/* ---------------------------------------------------------------- scratch and checkpoints */

/* A restored file's name must stay a plain name inside the directory. */
static int safe_file_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && s[0] != '.' && !strchr(s, '/');
}

/* Reads a wrapped checkpoint (a safetensors file with one U8 tensor "file"
 * and the file's name in the metadata) and writes the file into ckdir under
 * that name. 0, or -1 with err. */
static int ckpt_unwrap(cmd_run *r, const char *wrapped, char *err, size_t errlen) {
    int rc = -1, in = -1, outfd = -1;
    char *hdr = NULL;
    cJSON *h = NULL;
    char tmp[PATH_MAX + 64] = "", dst[PATH_MAX + 300];
    in = open(wrapped, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    unsigned char lenb[8];
    if (in < 0 || fstat(in, &sb) < 0 || read(in, lenb, 8) != 8) {
        snprintf(err, errlen, "cannot read the downloaded checkpoint: %s", strerror(errno));
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen < 2 || hlen > CMD_HEADER_MAX || (uint64_t)sb.st_size < 8 + hlen) {
        snprintf(err, errlen, "the job's latest checkpoint is not a safetensors file");
        goto out;
    }
    hdr = xmalloc((size_t)hlen + 1);
    if (read(in, hdr, (size_t)hlen) != (ssize_t)hlen) {
        snprintf(err, errlen, "the job's latest checkpoint is truncated");
        goto out;
    }
    hdr[hlen] = '\0';
    h = cJSON_Parse(hdr);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(meta, "format");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(meta, "file_name");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "file");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "trainyard-file") != 0 || !cJSON_IsString(name) ||
        cJSON_GetArraySize(offs) != 2) {
        snprintf(err, errlen, "the job's latest checkpoint is not a wrapped file (format \"trainyard-file\")");
        goto out;
    }
    if (!safe_file_name(name->valuestring)) {
        snprintf(err, errlen, "the checkpoint's file name is not a plain name");
        goto out;
    }
    double a = cJSON_GetArrayItem(offs, 0)->valuedouble, b = cJSON_GetArrayItem(offs, 1)->valuedouble;
    uint64_t start = 8 + hlen + (uint64_t)a, end = 8 + hlen + (uint64_t)b;
    if (a < 0 || b < a || end != (uint64_t)sb.st_size) {
        snprintf(err, errlen, "the checkpoint's data offsets do not match its size");
        goto out;
    }
    if (sfmt(tmp, sizeof tmp, "%s/.restore.tmp", r->ckdir) < 0 ||
        sfmt(dst, sizeof dst, "%s/%s", r->ckdir, name->valuestring) < 0) {
        snprintf(err, errlen, "checkpoint path too long");
        goto out;
    }
    outfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (outfd < 0 || lseek(in, (off_t)start, SEEK_SET) < 0) {
        snprintf(err, errlen, "cannot write %.300s: %s", tmp, strerror(errno));
        goto out;
    }
    char chunk[1 << 16];
    for (uint64_t left = end - start; left > 0;) {
        ssize_t got = read(in, chunk, left < sizeof chunk ? (size_t)left : sizeof chunk);
        if (got <= 0) {
            snprintf(err, errlen, "cannot read the downloaded checkpoint");
            goto out;
        }
        for (ssize_t off = 0; off < got;) {
            ssize_t w = write(outfd, chunk + off, (size_t)(got - off));
            if (w < 0) {
                snprintf(err, errlen, "cannot write %.300s: %s", tmp, strerror(errno));
                goto out;
            }
            off += w;
        }
        left -= (uint64_t)got;
    }
    if (close(outfd) < 0) {
        outfd = -1;
        snprintf(err, errlen, "cannot write %.300s: %s", tmp, strerror(errno));
        goto out;
    }
    outfd = -1;
    struct stat rs;
    if (rename(tmp, dst) < 0 || stat(dst, &rs) < 0) {
        snprintf(err, errlen, "cannot rename into %.300s: %s", dst, strerror(errno));
        goto out;
    }
    tmp[0] = '\0';
    snprintf(r->restored, sizeof r->restored, "%s", name->valuestring);
    snprintf(r->restored_id.name, sizeof r->restored_id.name, "%s", r->restored);
    r->restored_id.size = rs.st_size;
    r->restored_id.mtime = rs.st_mtim;
    log_info("checkpoint restored: %s (%llu bytes) in %s", r->restored, (unsigned long long)(end - start), r->ckdir);
    rc = 0;
out:
    if (outfd >= 0) close(outfd);
    if (tmp[0]) unlink(tmp);
    if (in >= 0) close(in);
    cJSON_Delete(h);
    free(hdr);
    return rc;
}

/* Attempt >= 2: the job's latest checkpoint into ckdir (none: an empty dir). */
static int ckpt_restore(cmd_run *r, char *err, size_t errlen) {
    char wrapped[PATH_MAX + 32], sha[65];
    if (sfmt(wrapped, sizeof wrapped, "%s/latest.safetensors", r->scratch) < 0) {
        snprintf(err, errlen, "scratch path too long");
        return -1;
    }
    report_api a = {&r->cl, r->cfg.job, r->stop, "stopped before the program started"};
    int got = report_fetch_ckpt(&a, wrapped, sha, err, errlen);
    if (got == 0)
        log_info("attempt %d: the job has no checkpoint yet: the checkpoint directory starts empty", r->cfg.attempt);
    if (got == 1 && ckpt_unwrap(r, wrapped, err, errlen) < 0) log_warn("%s: the checkpoint directory starts empty", err);
    unlink(wrapped);
    return got < 0 ? -1 : 0;
}

/* The evaluator: when the job has a checkpoint newer than the one in ckdir,
 * it is unwrapped there (under its file name, written to a temporary name
 * and renamed: a program watching the directory never sees half a file).
 * One try: the server away or a torn transfer waits for the next look. */
static void ckpt_follow(cmd_run *r) {
    char path[128], wrapped[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)r->cfg.job);
    client_reply rep;
    if (client_request(&r->cl, "GET", path, NULL, 0, NULL, &rep) < 0 || rep.status != 200) {
        client_reply_release(&rep);
        return;
    }
    cJSON *o = cJSON_ParseWithLength(rep.body.data ? rep.body.data : "", rep.body.len);
    client_reply_release(&rep);
    const cJSON *newest = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "checkpoints"), 0); /* newest first */
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(newest, "id");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(newest, "sha256");
    if (!cJSON_IsNumber(id) || !cJSON_IsString(sha) || (int64_t)id->valuedouble <= r->follow_id) {
        cJSON_Delete(o);
        return;
    }
    int64_t cid = (int64_t)id->valuedouble;
    char want[65];
    snprintf(want, sizeof want, "%s", sha->valuestring);
    long step = (long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(newest, "step"));
    long epoch = (long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(newest, "epoch"));
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)r->cfg.job, (long long)cid);
    if (sfmt(wrapped, sizeof wrapped, "%s/follow.safetensors", r->scratch) < 0) return;
    long st = 0;
    char sha_hdr[65] = "", sha_got[65] = "";
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 4096);
    int e = client_download(&r->cl, path, wrapped, &st, sha_hdr, sha_got, NULL, 0, &size, &eb, err, sizeof err);
    buf_release(&eb);
    if (e == 0 && st == 200 && strcasecmp(sha_got, want) == 0) {
        if (ckpt_unwrap(r, wrapped, err, sizeof err) == 0) {
            log_info("job checkpoint %lld (step %ld, epoch %ld) is %s in the checkpoint directory", (long long)cid,
                     step, epoch, r->restored);
            r->follow_id = cid;
        } else {
            log_warn("job checkpoint %lld: %s", (long long)cid, err);
            r->follow_id = cid; /* not a wrapped file: never will be */
        }
    }
    unlink(wrapped);
}

/* The newest regular file directly in ckdir (names starting with '.' are
 * temporary and skipped): 1 with its name and stat, 0 when none. */
static int ckpt_newest(const char *dir, char name[256], struct stat *out) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= 256) continue;
        char p[PATH_MAX + 300];
        struct stat sb;
        if (sfmt(p, sizeof p, "%s/%s", dir, e->d_name) < 0 || lstat(p, &sb) < 0 || !S_ISREG(sb.st_mode)) continue;
        int newer = !found || sb.st_mtim.tv_sec > out->st_mtim.tv_sec ||
                    (sb.st_mtim.tv_sec == out->st_mtim.tv_sec && sb.st_mtim.tv_nsec > out->st_mtim.tv_nsec);
        if (newer) {
            *out = sb;
            snprintf(name, 256, "%s", e->d_name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Uploads one version of a checkpoint file (id) as the job's checkpoint,
 * wrapped in a safetensors file that keeps its name (docs/command-jobs.md),
 * to the blob store or the server (report_upload_ckpt); cancel (or NULL)
 * raised gives a store upload in flight up (the sender's, at its stop).
 * Retries while the server is away until deadline_s (0: one try). Returns 0
 * when uploaded; -1 when refused or unreadable, or when the file is no
 * longer that version (changed or gone: nothing to retry); -2 when the
 * server could not be reached or answered 5xx/429; -3 when it answered 507
 * (its disk at the reserve, the team at its storage quota). */
static int ckpt_upload_file(const cconfig *c, const char *ckdir, const char *task_name, const ck_ident *id,
                            long step, long epoch, int deadline_s, volatile sig_atomic_t *cancel) {
    char path[PATH_MAX + 300];
    if (sfmt(path, sizeof path, "%s/%s", ckdir, id->name) < 0) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0 || sb.st_size != id->size || sb.st_mtim.tv_sec != id->mtime.tv_sec ||
        sb.st_mtim.tv_nsec != id->mtime.tv_nsec) {
        if (fd >= 0) close(fd);
        return -1; /* rewritten since it was seen: the newer version comes next */
    }
    /* past what the server's PUT takes, known to be the way: not even read
     * (with a store the limit is the store's) */
    if (blobxfer_via_server() && (uint64_t)sb.st_size + CMD_HEADER_MAX > (uint64_t)REPORT_PUT_MAX) {
        log_error("checkpoint %s is %lld bytes: more than the server takes (1 GiB); not uploaded", id->name,
                  (long long)sb.st_size);
        close(fd);
        return -1;
    }
    /* the header: the file's name and where it came from, one U8 tensor */
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    char v[64];
    if (!h || !meta) abort();
    cJSON_AddStringToObject(meta, "format", "trainyard-file");
    cJSON_AddStringToObject(meta, "file_name", id->name);
    snprintf(v, sizeof v, "%lld", (long long)c->job);
    cJSON_AddStringToObject(meta, "job", v);
    snprintf(v, sizeof v, "%d", c->attempt);
    cJSON_AddStringToObject(meta, "attempt", v);
    cJSON_AddStringToObject(meta, "task", task_name);
    snprintf(v, sizeof v, "%ld", step);
    cJSON_AddStringToObject(meta, "step", v);
    snprintf(v, sizeof v, "%ld", epoch);
    cJSON_AddStringToObject(meta, "epoch", v);
    cJSON *t = cJSON_AddObjectToObject(h, "file");
    cJSON_AddStringToObject(t, "dtype", "U8");
    cJSON *shape = cJSON_AddArrayToObject(t, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)sb.st_size));
    cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
    cJSON_AddItemToArray(offs, cJSON_CreateNumber(0));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)sb.st_size));
    char *hj = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!hj) abort();
    size_t hl = strlen(hj), padded = (hl + 7) / 8 * 8;
    char *head = xmalloc(8 + padded);
    for (int i = 0; i < 8; i++) head[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(head + 8, hj, hl);
    memset(head + 8 + hl, ' ', padded - hl);
    free(hj);
    uint64_t total = 8 + padded + (uint64_t)sb.st_size;
    int rc = -1;
    char err[512] = "", sha[65] = "";
    int64_t end = mono_ms() + (int64_t)deadline_s * 1000, backoff = 0;
    /* streamed from the file (read once for the checksums, once as sent):
     * straight to the store, or to the server when it keeps checkpoints */
    report_ckpt_bytes b = {.api = c->api, .token = c->token, .job = c->job, .attempt = c->attempt, .step = step,
                           .epoch = epoch, .head = head, .head_len = 8 + padded, .fd = fd, .total = total,
                           .deadline_ms = deadline_s ? end : 0, .stop = cancel};
    for (;;) {
        long st = report_upload_ckpt(NULL, &b, sha, err, sizeof err);
        if (st == 409 && !sha[0]) { /* shorter than it was: being rewritten, the next version comes */
            log_info("checkpoint %s changed while read (%s): the next version is uploaded", id->name, err);
            break;
        }
        if (st == 201 || st == 200) {
            log_info("checkpoint uploaded: %s (%lld bytes, step %ld, epoch %ld, sha256 %.16s...)", id->name,
                     (long long)sb.st_size, step, epoch, sha);
            rc = 0;
            break;
        }
        if (st == 507) { /* no room (disk reserve, team quota): the same bytes would not fit later either */
            log_error("checkpoint upload refused: %s; the program goes on, the next checkpoint is tried", err);
            rc = -3;
            break;
        }
        if (st && st < 500 && st != 429) {
            log_error("checkpoint upload refused: %s", err);
            break;
        }
        if (mono_ms() >= end) {
            if (deadline_s) log_error("checkpoint upload failed (%s); giving up", err[0] ? err : "server error");
            else log_warn("checkpoint upload failed (%s); trying again later", err[0] ? err : "server error");
            rc = -2;
            break;
        }
        log_warn("checkpoint upload failed (%s); retrying", err);
        backoff = backoff ? backoff * 2 : REPORT_BACKOFF_MIN_MS;
        if (backoff > REPORT_BACKOFF_MAX_MS) backoff = REPORT_BACKOFF_MAX_MS;
        usleep((useconds_t)backoff * 1000);
    }
    close(fd);
    free(head);
    return rc;
}

/* The newest file of the checkpoint directory as an ident: 1, or 0 when
 * there is none. */
static int ckpt_newest_ident(const char *ckdir, ck_ident *id) {
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    memset(id, 0, sizeof *id);
    if (!ckpt_newest(ckdir, id->name, &sb)) return 0;
    id->size = sb.st_size;
    id->mtime = sb.st_mtim;
    return 1;
}

/* report_ckpt_ops for the sender: a checkpoint is a ck_ident (heap copy). */
static int ck_upload(void *ctx, void *ck, long step, long epoch, char *err, size_t errlen) {
    const cmd_run *r = ctx;
    (void)err; /* ckpt_upload_file logs why itself */
    (void)errlen;
    int rc = ckpt_upload_file(&r->cfg, r->ckdir, r->task_name, ck, step, epoch, 0, report_ckpt_cancel(r->snd));
    return rc == -3 ? -1 : rc; /* refused: dropped, not retried */
}

static int ck_same(const void *a, const void *b) { return ident_eq(a, b); }

static const report_ckpt_ops ck_ops = {ck_upload, free, ck_same};

/* While the program runs (chief, every CMD_CKPT_POLL_MS): a new version of
 * the newest file, untouched for CMD_CKPT_SETTLE_MS, goes to the sender. */
static void ckpt_poll(cmd_run *r) {
    ck_ident id;
    if (!r->snd || !ckpt_newest_ident(r->ckdir, &id)) return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t age_ms = (int64_t)(now.tv_sec - id.mtime.tv_sec) * 1000 + (now.tv_nsec - id.mtime.tv_nsec) / 1000000;
    if (age_ms < CMD_CKPT_SETTLE_MS) return; /* perhaps still being written */
    ck_ident *k = xmalloc(sizeof *k);
    *k = id;
    report_set_ckpt(r->snd, k, r->seen_step, r->seen_epoch); /* dropped when uploaded or pending already */
}

/* The chief, once its program is gone: the newest file of the checkpoint
 * directory, unless it is the version uploaded (or restored) already; a
 * periodic upload not started yet is dropped (superseded), one in flight is
 * waited for. Retries while the server is away, until deadline_s. 0 when
 * uploaded or nothing to upload, -1 when it could not be delivered. */
static int ckpt_upload_final(cmd_run *r, int deadline_s) {
    ck_ident done = r->restored_id;
    if (r->snd) {
        const ck_ident *d = report_ckpt_settle(r->snd);
        if (d) done = *d;
    }
    ck_ident id;
    if (!ckpt_newest_ident(r->ckdir, &id)) {
        log_info("no file in the checkpoint directory: no checkpoint uploaded");
        return 0;
    }
    if (ident_eq(&id, &done)) {
        log_info("checkpoint %s unchanged since it was %s: not uploaded again", id.name,
                 ident_eq(&id, &r->restored_id) ? "restored" : "uploaded");
        return 0;
    }
    int rc = ckpt_upload_file(&r->cfg, r->ckdir, r->task_name, &id, r->seen_step, r->seen_epoch, deadline_s, NULL);
    /* no room on the server (507, logged above): the job ends as its
     * program did, without this checkpoint, rather than failing for it */
    return rc == 0 || rc == -3 ? 0 : -1;
}

/* ---------------------------------------------------------------- the program */

typedef struct linebuf {
    int fd;                      /* -1 once closed */
    int is_stdout;
    char *data;                  /* (CMD_LINE_MAX) */
    size_t len;
} linebuf;

/* One line of the program's output: to the worker's stdout (the agent ships
 * it as the task's log), and a metric when it is one on the chief's stdout. */
static void line_out(cmd_run *r, linebuf *lb, const char *s, size_t n, int whole) {
    char *line = xmalloc(n + 2);
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    fwrite(line, 1, n + 1, stdout);
    fflush(stdout);
    line[n] = '\0';
    size_t pl = sizeof METRIC_PREFIX - 1;
    if (whole && lb->is_stdout && r->snd && n > pl && strncmp(line, METRIC_PREFIX, pl) == 0) metric_line(r, line + pl);
    free(line);
}

/* Reads what is there (at most 16 reads, so that a program that never
 * stops writing cannot starve the stop checks); splits it into lines.
 * Closes fd at EOF. */
static void lb_read(cmd_run *r, linebuf *lb) {
    for (int reads = 0; reads < 16; reads++) {
        ssize_t got = read(lb->fd, lb->data + lb->len, CMD_LINE_MAX - lb->len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (got <= 0) {
            if (lb->len) line_out(r, lb, lb->data, lb->len, 1);
            lb->len = 0;
            close(lb->fd);
            lb->fd = -1;
            return;
        }
        lb->len += (size_t)got;
        size_t start = 0;
        for (size_t i = lb->len - (size_t)got; i < lb->len; i++) {
            if (lb->data[i] != '\n') continue;
            size_t end = i;
            if (end > start && lb->data[end - 1] == '\r') end--;
            line_out(r, lb, lb->data + start, end - start, 1);
            start = i + 1;
        }
        memmove(lb->data, lb->data + start, lb->len - start);
        lb->len -= start;
        if (lb->len == CMD_LINE_MAX) { /* a very long line: forwarded in pieces */
            line_out(r, lb, lb->data, lb->len, 0);
            lb->len = 0;
        }
    }
}

/* errno as text without stdio, for the child between fork and exec */
static void child_fail(const char *what, const char *arg, int err) {
    char msg[512];
    size_t n = 0;
    const char *parts[] = {"trainyard worker: error: ", what, arg, ": ",
                           err == ENOENT ? "no such file or directory" : err == EACCES ? "permission denied"
                                                                       : err == ENOEXEC ? "not an executable format"
                                                                                        : "cannot execute",
                           "\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i]; *p && n < sizeof msg; p++) msg[n++] = *p;
    ssize_t w = write(2, msg, n);
    (void)w;
}

/* ---------------------------------------------------------------- image */

/* A line on the job's timeline (POST /jobs/{id}/events); best effort for
 * "image", retried while the server is away for "image_pull_failed". */
static long job_event(cmd_run *r, const char *kind, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", kind);
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddNumberToObject(o, "attempt", r->cfg.attempt);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) return 0;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)r->cfg.job);
    long st = 0;
    int tries = strcmp(kind, "image") == 0 ? 1 : 30;
    for (int i = 0; i < tries && !*r->stop; i++) {
        client_reply rep;
        int e = client_request(&r->cl, "POST", path, body, strlen(body), NULL, &rep);
        st = e == 0 ? rep.status : 0;
        client_reply_release(&rep);
        if (st && st < 500) break;
        sleep(1);
    }
    free(body);
    return st;
}

static void pull_note(void *ctx, int pulling, const char *image, double seconds) {
    cmd_run *r = ctx;
    char host[256] = "this node", msg[600];
    if (gethostname(host, sizeof host) < 0) snprintf(host, sizeof host, "this node");
    host[sizeof host - 1] = '\0';
    if (pulling) snprintf(msg, sizeof msg, "pulling image %s on %s", image, host);
    else snprintf(msg, sizeof msg, "pulled image %s on %s in %.1f s", image, host, seconds);
    log_info("%s", msg);
    job_event(r, "image", msg);
}

/* The team's login for the image's registry, when it stored one
 * (GET /jobs/{id}/registry-auth): into an auth file only root reads. */
static void registry_login(cmd_run *r, char *authfile, size_t cap) {
    authfile[0] = '\0';
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/registry-auth", (long long)r->cfg.job);
    client_reply rep;
    if (client_request(&r->cl, "GET", path, NULL, 0, NULL, &rep) == 0 && rep.status == 200) {
        cJSON *o = cJSON_ParseWithLength(rep.body.data ? rep.body.data : "", rep.body.len);
        const cJSON *reg = cJSON_GetObjectItemCaseSensitive(o, "registry");
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "username");
        const cJSON *pw = cJSON_GetObjectItemCaseSensitive(o, "password");
        if (cJSON_IsString(reg) && cJSON_IsString(u) && cJSON_IsString(pw) && r->ctr.lock_dir[0] &&
            mkdir_p(r->ctr.lock_dir, 0700) == 0 &&
            ctr_authfile(r->ctr.lock_dir, reg->valuestring, u->valuestring, pw->valuestring, authfile, cap) < 0)
            log_warn("cannot write the registry login for %s: pulling without it", reg->valuestring);
        if (cJSON_IsString(pw)) explicit_bzero(pw->valuestring, strlen(pw->valuestring));
        cJSON_Delete(o);
    }
    if (rep.body.data) explicit_bzero(rep.body.data, rep.body.len);
    client_reply_release(&rep);
}

/* The image on this node before the gang starts: pulled (once per node,
 * under a lock), or the attempt fails for good with the registry's answer. */
static int image_ready(cmd_run *r, char *err, size_t errlen) {
    const environment_spec *env = &r->spec->environment;
    char authfile[PATH_MAX];
    registry_login(r, authfile, sizeof authfile);
    int rc = ctr_pull(&r->ctr, env->image, env->pull == PULL_ALWAYS, r->cfg.team, authfile, pull_note, r, err, errlen);
    if (authfile[0]) unlink(authfile);
    if (rc == 0) return 0;
    log_error("%s", err);
    job_event(r, "image_pull_failed", err);
    return -1;
}

/* fork + exec in a new process group; the pipes' read ends in out/errfd. */
/* Frees a NULL-terminated argv of heap strings (NULL: nothing). */
static void argv_free(char **av) {
    if (!av) return;
    for (size_t i = 0; av[i]; i++) free(av[i]);
    free(av);
}

static pid_t program_start(const char *exe, char *const argv[], char *const envp[], const char *wd, int *outfd,
                           int *errfd) {
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
        if (po[0] >= 0) close(po[0]), close(po[1]);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        return -1;
    }
    if (pid == 0) {
        /* only async-signal-safe calls from here to exec */
        /* the worker gone: so is the program */
        if (proc_child_setup(parent, 1, SIGKILL, 1) < 0) _exit(126);
        if (dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) _exit(126);
        /* none of the worker's descriptors (its sockets to the server) goes on */
        if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) _exit(126);
        if (wd[0] && chdir(wd) < 0) {
            child_fail("cannot enter the working directory ", wd, errno);
            _exit(126);
        }
        execve(exe, argv, envp);
        child_fail("cannot start ", exe, errno);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: a signal right after fork finds the group */
    close(po[1]);
    close(pe[1]);
    fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
    fcntl(pe[0], F_SETFL, fcntl(pe[0], F_GETFL) | O_NONBLOCK);
    *outfd = po[0];
    *errfd = pe[0];
    return pid;
}

/* Runs the program to its end: forwards its output, relays a stop (SIGTERM
 * to its group, SIGKILL after the grace period), kills what it left in its
 * group once it exited. Returns its wait status; *stopped when a stop came
 * before it exited. */
static int program_wait(cmd_run *r, pid_t pid, int outfd, int errfd, int *stopped) {
    linebuf lb[2] = {{outfd, 1, xmalloc(CMD_LINE_MAX), 0}, {errfd, 0, xmalloc(CMD_LINE_MAX), 0}};
    int exited = 0, status = 0, term_sent = 0, kill_sent = 0;
    int64_t kill_at = 0, exit_ms = 0;
    *stopped = 0;
    for (;;) {
        struct pollfd p[2];
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (lb[i].fd >= 0) p[n++] = (struct pollfd){.fd = lb[i].fd, .events = POLLIN};
        if (n == 0 && exited) break;
        if (n) poll(p, (nfds_t)n, 100);
        else usleep(50 * 1000);
        for (int i = 0; i < 2; i++)
            if (lb[i].fd >= 0) lb_read(r, &lb[i]);
        int64_t now = mono_ms();
        if (r->held_step && now - r->last_step_ms >= CMD_STEP_MS) held_flush(r);
        if (r->snd && !exited && !term_sent && now >= r->next_ck_poll_ms) {
            ckpt_poll(r);
            r->next_ck_poll_ms = now + CMD_CKPT_POLL_MS;
        }
        if (r->cfg.is_eval && !exited && !term_sent && now >= r->next_follow_ms) {
            ckpt_follow(r);
            r->next_follow_ms = mono_ms() + CMD_FOLLOW_MS;
        }
        if (!exited) {
            siginfo_t si;
            memset(&si, 0, sizeof si);
            /* WNOWAIT: the zombie keeps its pid (and so its group id) from
             * reuse while the group is killed */
            if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid) {
                kill(-pid, SIGKILL); /* whatever it left running in its group */
                waitpid(pid, &status, 0);
                exited = 1;
                exit_ms = now;
                continue;
            }
            if (*r->stop && !term_sent) {
                log_info("stop: SIGTERM to the program (SIGKILL in %d s)", CMD_STOP_GRACE_MS / 1000);
                kill(-pid, SIGTERM);
                term_sent = 1;
                *stopped = 1;
                kill_at = now + CMD_STOP_GRACE_MS;
            } else if (term_sent && !kill_sent && now >= kill_at) {
                log_warn("the program did not exit within %d s of SIGTERM: SIGKILL", CMD_STOP_GRACE_MS / 1000);
                kill(-pid, SIGKILL);
                kill_sent = 1;
            }
        } else if (now - exit_ms > CMD_DRAIN_MS) {
            break; /* something outside the group still holds the pipes */
        }
    }
    for (int i = 0; i < 2; i++) {
        if (lb[i].fd >= 0) {
            if (lb[i].len) line_out(r, &lb[i], lb[i].data, lb[i].len, 1);
            close(lb[i].fd);
        }
        free(lb[i].data);
    }
    held_flush(r);
    return status;
}

/* ---------------------------------------------------------------- run, by phase
 *
 * The config and the cluster's size; the container runtime; the working
 * directory; the scratch and checkpoint directories and the API client;
 * the image, the resume state and the rendezvous; the program started (and
 * the chief's report sender); its end awaited and the chief's last
 * checkpoint and metrics delivered; the end (the reason said, everything
 * freed). cmd_run holds what the phases share. A phase returns 0 to go on,
 * or -1 when the task ends early: the reason in r->err, the exit status in
 * r->ret. */

/* A failure a stop explains: 143 when the stop flag is up. */
static int fail_stop(cmd_run *r) {
    if (*r->stop) r->ret = WORKER_EXIT_STOPPED;
    return -1;
}

/* The config (TRAINYARD_CONFIG): which task this is, the cluster's size
 * against the spec's. */
static int run_config(cmd_run *r, const char *config) {
    const jobspec *spec = r->spec;
    if (config_parse(config, &r->cfg, r->err, sizeof r->err) < 0) return -1;
    const cconfig *c = &r->cfg;
    r->chief = !c->is_ps && !c->is_eval && c->index == 0;
    snprintf(r->task_name, sizeof r->task_name, "%s-%d", c->is_eval ? "evaluator" : c->is_ps ? "ps" : "worker",
             c->index);
    if (!c->is_ps && (c->n_workers > spec->resources.workers || c->n_workers < spec->resources.workers_min)) {
        if (jobspec_elastic(spec))
            snprintf(r->err, sizeof r->err, "the cluster has %d workers but the spec asks for %d to %d", c->n_workers,
                     spec->resources.workers_min, spec->resources.workers);
        else
            snprintf(r->err, sizeof r->err, "the cluster has %d workers but the spec asks for %d", c->n_workers,
                     spec->resources.workers);
        return -1;
    }
    if (spec->kind == JOB_KIND_INTERACTIVE)
        log_info("job %lld attempt %d: interactive %s, %s%s%s", (long long)c->job, c->attempt,
                 interactive_name(spec->interactive), r->task_name, spec->environment.image[0] ? " in image " : "",
                 spec->environment.image);
    else
        log_info("job %lld attempt %d: command %s (%d argument(s)), %s of %d worker(s)%s%s%s", (long long)c->job,
                 c->attempt, spec->command.argv[0], spec->command.argc - 1, r->task_name, c->n_workers,
                 c->n_ps ? " and ps" : "", spec->environment.image[0] ? " in image " : "", spec->environment.image);
    return 0;
}

/* The container runtime the agent named (container.h), which a job in an
 * image needs. */
static int run_container(cmd_run *r) {
    const cconfig *c = &r->cfg;
    r->in_ctr = ctr_parse(&r->ctr, r->err, sizeof r->err);
    if (r->in_ctr < 0) return -1;
    r->ctr.job = c->job;
    r->ctr.attempt = c->attempt;
    snprintf(r->ctr.task, sizeof r->ctr.task, "%s", r->task_name);
    if (r->spec->environment.image[0] && !r->in_ctr) {
        snprintf(r->err, sizeof r->err,
                 "the job runs in image %.200s, but this node's agent runs no container runtime",
                 r->spec->environment.image);
        return -1;
    }
    return 0;
}

/* The working directory: in the task's copy of the context, else under the
 * agent's data root (else its cwd). */
static int run_workdir(cmd_run *r) {
    const jobspec *spec = r->spec;
    char *wd = r->wd;
    const char *root = getenv("TRAINYARD_DATA_ROOT");
    const char *ctxdir = getenv("TRAINYARD_CONTEXT_DIR");
    if (spec->command.context[0]) {
        struct stat sb;
        if (!ctxdir || !*ctxdir) {
            snprintf(r->err, sizeof r->err, "the job names context %.80s, but the agent gave this task none",
                     spec->command.context);
            return -1;
        }
        if (sfmt(wd, sizeof r->wd, "%s%s%s", ctxdir, spec->command.working_dir[0] ? "/" : "",
                 spec->command.working_dir) < 0) {
            snprintf(r->err, sizeof r->err, "command.working_dir too long");
            return -1;
        }
        if (stat(wd, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
            snprintf(r->err, sizeof r->err,
                     "command.working_dir %.200s is not a directory of the context %.80s (%s)",
                     spec->command.working_dir, spec->command.context, strerror(errno ? errno : ENOTDIR));
            return -1;
        }
    } else if (spec->command.working_dir[0]) {
        struct stat sb;
        if (sfmt(wd, sizeof r->wd, "%s/%s", root && *root ? root : ".", spec->command.working_dir) < 0) {
            snprintf(r->err, sizeof r->err, "command.working_dir too long");
            return -1;
        }
        if (stat(wd, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
            snprintf(r->err, sizeof r->err, "command.working_dir %.200s is not a directory under %s (%s)",
                     spec->command.working_dir, root && *root ? root : "the agent's working directory",
                     strerror(errno ? errno : ENOTDIR));
            return -1;
        }
    } else if (root && *root) {
        snprintf(wd, sizeof r->wd, "%s", root);
    }
    return 0;
}

/* What an interactive job runs, in its job directory (or its context's):
 * a notebook, Jupyter on its port TRAINYARD_PORT_NOTEBOOK under the
 * proxy's path, with the token derived from this task's (in JUPYTER_TOKEN,
 * env_build); a shell, a long sleep that holds the task (and its container)
 * until it is stopped, for shells to attach to. A command job's program is
 * its spec's. */
static int run_program(cmd_run *r) {
    const jobspec *spec = r->spec;
    if (spec->kind != JOB_KIND_INTERACTIVE) {
        r->argv = spec->command.argv;
        return 0;
    }
    const char *ctxdir = getenv("TRAINYARD_CONTEXT_DIR");
    if (ctxdir && *ctxdir) snprintf(r->wd, sizeof r->wd, "%s", ctxdir);
    else if (r->in_ctr) snprintf(r->wd, sizeof r->wd, "%s", r->ctr.dir);
    else if (!getcwd(r->wd, sizeof r->wd)) {
        snprintf(r->err, sizeof r->err, "cannot read the job directory: %s", strerror(errno));
        return -1;
    }
    char **av = xcalloc(16, sizeof *av);
    int n = 0;
    if (spec->interactive == INTERACTIVE_SHELL) {
        av[n++] = xstrdup("sleep");
        av[n++] = xstrdup("2147483647"); /* 68 years: GNU's and busybox's sleep both take it */
    } else {
        const char *port = getenv("TRAINYARD_PORT_NOTEBOOK");
        char *end = NULL;
        long p = port ? strtol(port, &end, 10) : 0;
        if (!port || end == port || *end || p < 1 || p > 65535) {
            free(av);
            snprintf(r->err, sizeof r->err, "a notebook job, but the agent gave this task no port \"notebook\" "
                     "(TRAINYARD_PORT_NOTEBOOK=%.20s)", port ? port : "");
            return -1;
        }
        char hash[65];
        sha256_hex(r->cfg.token, strlen(r->cfg.token), hash);
        jobspec_notebook_secret(hash, r->nb_token);
        av[n++] = xstrdup("jupyter-notebook");
        av[n++] = xstrdup("--no-browser");
        av[n++] = xstrdup("--allow-root"); /* root in an image that says so, or an agent without isolation */
        av[n++] = xstrdup("--ip=0.0.0.0");
        char a[PATH_MAX + 64];
        snprintf(a, sizeof a, "--port=%ld", p);
        av[n++] = xstrdup(a);
        av[n++] = xstrdup("--NotebookApp.port_retries=0"); /* its own port or none: the proxy knows that one */
        snprintf(a, sizeof a, "--NotebookApp.base_url=/proxy/jobs/%lld/notebook/", (long long)r->cfg.job);
        av[n++] = xstrdup(a);
        av[n++] = xstrdup("--NotebookApp.allow_remote_access=True");
        snprintf(a, sizeof a, "--notebook-dir=%s", r->wd);
        av[n++] = xstrdup(a);
    }
    av[n] = NULL;
    r->own_argv = av;
    r->argv = av;
    return 0;
}

/* The task's scratch directory with its checkpoint directory (the
 * program's uid's, in an image), and the API client. */
static int run_scratch(cmd_run *r) {
    const cconfig *c = &r->cfg;
    const char *tmp = getenv("TMPDIR");
    if (sfmt(r->scratch, sizeof r->scratch, "%s/trainyard-job%lld-XXXXXX", tmp && *tmp ? tmp : "/tmp",
             (long long)c->job) < 0 ||
        !mkdtemp(r->scratch)) {
        snprintf(r->err, sizeof r->err, "cannot make a scratch directory: %s", strerror(errno));
        r->scratch[0] = '\0';
        return -1;
    }
    if (sfmt(r->ckdir, sizeof r->ckdir, "%s/checkpoint", r->scratch) < 0 || mkdir(r->ckdir, 0700) < 0) {
        snprintf(r->err, sizeof r->err, "cannot make the checkpoint directory: %s", strerror(errno));
        return -1;
    }
    /* in an image the program runs as the task's uid; this worker as root */
    if (r->in_ctr && (chown(r->scratch, r->ctr.uid, r->ctr.uid) < 0 || chown(r->ckdir, r->ctr.uid, r->ctr.uid) < 0)) {
        snprintf(r->err, sizeof r->err, "cannot give the checkpoint directory to uid %u: %s", r->ctr.uid,
                 strerror(errno));
        return -1;
    }
    if (client_init(&r->cl, c->api, c->token) < 0) {
        snprintf(r->err, sizeof r->err, "cannot make an HTTP client");
        return -1;
    }
    r->have_client = 1;
    r->cl.timeout_ms = 30000;
    return 0;
}

/* Before the program: the image pulled, the chief's metric seq, the
 * checkpoint directory restored (the evaluator: the job's newest
 * checkpoint), every task met at the rendezvous. */
static int run_join(cmd_run *r) {
    const cconfig *c = &r->cfg;
    if (r->in_ctr && image_ready(r, r->err, sizeof r->err) < 0) return fail_stop(r);
    if (r->chief && fetch_last_seq(r, &r->last_seq, r->err, sizeof r->err) < 0) return fail_stop(r);
    if (c->is_eval) ckpt_follow(r); /* the job's newest checkpoint, from the start */
    else if (c->attempt >= 2 && ckpt_restore(r, r->err, sizeof r->err) < 0) return fail_stop(r);
    if (r->in_ctr) chown_tree(r->ckdir, r->ctr.uid);
    if (rendezvous(r, r->err, sizeof r->err) < 0) return fail_stop(r);
    if (c->is_eval)
        log_info("all %d task(s) joined: MASTER_ADDR=%s MASTER_PORT=%d; this task is the evaluator", c->n_workers + c->n_ps,
                 r->peer_w[0].host, r->peer_w[0].port);
    else
        log_info("all %d task(s) joined: MASTER_ADDR=%s MASTER_PORT=%d, this task %s:%d", c->n_workers + c->n_ps,
                 r->peer_w[0].host, r->peer_w[0].port,
                 c->is_ps ? r->peer_ps[c->index].host : r->peer_w[c->index].host,
                 c->is_ps ? r->peer_ps[c->index].port : r->peer_w[c->index].port);
    return 0;
}

/* The program started in its process group with its environment: podman
 * run in an image, else the program found on the PATH (127 when it is
 * not). *pid, *outfd, *errfd: the process and its output's pipes. */
static int run_launch(cmd_run *r, pid_t *pid, int *outfd, int *errfd) {
    const jobspec *spec = r->spec;
    const char *wd = r->wd;
    r->envp = env_build(r);
    char **envp = r->envp;
    char exe[PATH_MAX];
    char **ctr_av = NULL;
    if (r->in_ctr) {
        /* podman run in place of the program: the program's environment
         * passes by name; the image's own PATH finds the program */
        snprintf(exe, sizeof exe, "%s", r->ctr.podman);
        ctr_gpu_renumber(envp, r->ctr.gpus);
        size_t ne = 0;
        while (envp[ne]) ne++;
        char **pass = xcalloc(ne + 1, sizeof *pass);
        size_t np = 0;
        for (size_t i = 0; i < ne; i++)
            if (ctr_env_passes(envp[i], spec->command.env)) pass[np++] = envp[i];
        ctr_av = ctr_argv(&r->ctr, spec->environment.image, wd, r->argv, pass);
        free(pass);
    } else if (exe_resolve(r->argv[0], envp, exe, sizeof exe) < 0) {
        snprintf(r->err, sizeof r->err, "command not found: %.200s (PATH=%.200s)%s", r->argv[0],
                 env_get(envp, "PATH") ? env_get(envp, "PATH") : "",
                 spec->interactive == INTERACTIVE_NOTEBOOK
                     ? ": a notebook job runs the node's jupyter-notebook (Debian's package jupyter-notebook) "
                       "or its image's"
                     : "");
        r->ret = 127;
        return -1;
    }
    if (*r->stop) {
        argv_free(ctr_av);
        snprintf(r->err, sizeof r->err, "stopped before the program started");
        return fail_stop(r);
    }
    /* in an image, podman's own working directory is the job directory;
     * the program's is --workdir */
    *pid = program_start(exe, ctr_av ? ctr_av : r->argv, envp, ctr_av ? r->ctr.dir : wd, outfd, errfd);
    int start_errno = errno;
    argv_free(ctr_av);
    if (*pid < 0) {
        snprintf(r->err, sizeof r->err, "cannot start %.200s: %s", exe, strerror(start_errno));
        return -1;
    }
    if (r->in_ctr)
        log_info("started %s in image %s as container %s (pid %d)%s%s", r->argv[0],
                 spec->environment.image, r->ctr.name, (int)*pid, wd[0] ? " in " : "", wd);
    else
        log_info("started %s (pid %d)%s%s", exe, (int)*pid, wd[0] ? " in " : "", wd);
    return 0;
}

/* The chief's report sender (a thread: only after the fork, the child runs
 * no code of ours); the version restored is not uploaded again. */
static void run_sender(cmd_run *r) {
    if (!r->chief) return;
    const cconfig *c = &r->cfg;
    ck_ident *done = xmalloc(sizeof *done);
    *done = r->restored_id;
    if (report_start(&r->sender, c->api, c->token, c->job, r->last_seq + 1, &ck_ops, r, done) < 0) abort();
    report_set_attempt(&r->sender, c->attempt); /* the server refuses a requeued attempt's metrics */
    r->snd = &r->sender;
    r->next_ck_poll_ms = mono_ms() + CMD_CKPT_POLL_MS;
}

/* The chief, the program ended: its newest checkpoint and its metrics
 * delivered; a program that succeeded fails when they are not. */
static int run_deliver(cmd_run *r, int stopped) {
    int budget = stopped ? CMD_STOP_FLUSH_S : CMD_FINAL_FLUSH_S;
    int up = ckpt_upload_final(r, budget);
    int drained = report_drain(&r->sender, budget);
    if (r->metric_lines)
        log_info("%ld metric line(s) read, %ld ignored%s", r->metric_lines, r->metric_bad,
                 report_dropped(&r->sender) ? " (some step metrics dropped while the server was away)" : "");
    if ((up < 0 || drained < 0) && r->ret == 0) {
        snprintf(r->err, sizeof r->err, "the program succeeded, but the server did not take its %s",
                 up < 0 ? "checkpoint" : "metrics");
        r->ret = WORKER_EXIT_FAILED;
        return -1;
    }
    return 0;
}

/* The program run to its end (program_wait); the exit status is its own,
 * 143 when stopped; a container podman left running removed; the chief's
 * delivery. */
static int run_await(cmd_run *r, pid_t pid, int outfd, int errfd) {
    int stopped = 0;
    int64_t t0 = mono_ms();
    int status = program_wait(r, pid, outfd, errfd, &stopped);
    int code, sig;
    char why[128];
    proc_exit_describe(status, &code, &sig, why, sizeof why);
    log_info("the program %s after %.1f s%s", why, (double)(mono_ms() - t0) / 1000.0,
             stopped ? " (stopped)" : "");
    r->ret = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    if (stopped) r->ret = WORKER_EXIT_STOPPED; /* a stop is never reported as success */
    /* podman killed before the container ended leaves it running: gone now */
    if (r->in_ctr && (stopped || WIFSIGNALED(status))) ctr_remove(r->ctr.podman, r->ctr.name, 30);
    return r->chief ? run_deliver(r, stopped) : 0;
}

/* The reason of an early end said (rc < 0: logged for a stop, else on
 * stderr), the sender stopped, everything freed and the scratch directory
 * removed; the exit status. */
static int run_end(cmd_run *r, int rc) {
    if (rc < 0) {
        if (r->ret == WORKER_EXIT_STOPPED) {
            log_info("%s", r->err);
        } else {
            fprintf(stderr, "trainyard worker: error: %s\n", r->err);
            fflush(stderr);
        }
    }
    int ret = r->ret;
    report_stop(&r->sender);
    cJSON_Delete(r->held_step);
    env_free(r->envp);
    argv_free(r->own_argv);
    if (r->have_client) client_release(&r->cl);
    rm_tree(r->scratch);
    free(r->peer_w);
    free(r->peer_ps);
    config_release(&r->cfg);
    free(r);
    return ret;
}

int command_run(const char *config, const jobspec *spec, volatile sig_atomic_t *stop) {
    cmd_run *r = xcalloc(1, sizeof *r);
    r->spec = spec;
    r->stop = stop;
    r->ret = WORKER_EXIT_FAILED;
    pid_t pid = -1;
    int outfd = -1, errfd = -1;
    int rc = run_config(r, config);
    if (!rc) rc = run_container(r);
    if (!rc) rc = run_workdir(r);
    if (!rc) rc = run_program(r);
    if (!rc) rc = run_scratch(r);
    if (!rc) rc = run_join(r);
    if (!rc) rc = run_launch(r, &pid, &outfd, &errfd);
    if (!rc) {
        run_sender(r);
        rc = run_await(r, pid, outfd, errfd);
    }
    return run_end(r, rc);
}
