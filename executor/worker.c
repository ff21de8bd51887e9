/* worker.c - `trainyard worker` (see worker.h): config -> spec -> resume ->
 * train_run with hooks -> metrics and checkpoints handed to the report
 * sender (executor/report.h), which batches them to the API and retries
 * with backoff while the server is away, so that training never waits. */
#include "worker.h"
#include "command.h"
#include "evaluator.h"
#include "report.h"
#include "train_loop.h"
#include "../client/client.h"
#include "../spec/jobspec.h"
#include "../common/util.h"
#include "comm/comm.h"
#include "cuda/nccl_comm.h"
#include "data/dataroot.h"
#include "strategy/engine.h"
#include "strategy/ps.h"
#include "strategy/replicas.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STEP_REPORT_MS 100          /* at most ~10 step metrics a second */
#define FINAL_FLUSH_S 900           /* how long a finished worker waits for the server */
#define STOP_FLUSH_S 8              /* a stopped one (SIGTERM): inside the agent's 10 s grace */
#define STOP_FLUSH_DOWN_S 2         /* ... when the server was unreachable at the last try */
#define RUNG_ASK_S 900              /* how long an ASHA trial at a rung's end waits for the server */
#define CKPT_UPLOAD_MAX (1L << 30)  /* the API's limit */

static volatile sig_atomic_t g_stop = 0;

static void on_term(int sig) {
    (void)sig;
    g_stop = 1;
}

/* ---------------------------------------------------------------- config */

typedef struct wconfig {
    int64_t job;
    int attempt;
    char api[512];
    char token[256];
    char type[32];
    int index;
    int n_workers;               /* cluster.worker entries (>= 1) */
    char (*worker_addr)[COMM_ADDR_MAX]; /* (n_workers) host of each worker, owned */
    int *worker_port;            /* (n_workers) its port (given by the scheduler) */
    int n_ps;                    /* cluster.ps entries (parameter_server) */
    ps_addr *ps;                 /* (n_ps) owned */
    int threads;                 /* cpu devices given to this task */
    int gpus;                    /* gpu devices given to this task ("gpu:N"; the agent sets
                                  * CUDA_VISIBLE_DEVICES to them, so they are ordinals 0..gpus-1) */
    char *spec_json;             /* owned */
    int has_secret;              /* config.secret: the attempt's, which every connection */
    unsigned char secret[32];    /* between its tasks proves (docs/comm.md, "Who may join") */
    int rung_max_epochs;         /* config.sweep.max_epochs: an ASHA trial asks at each rung's end
                                  * short of it whether it goes on (0: not such a trial) */
} wconfig;

static int hex_nibble(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A JSON number as an int64, when it lies within +-2^53 (the integers a
 * double holds exactly): 0, or -1 (not a number, or out of range: a cast
 * would be undefined behaviour). */
static int json_i64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -9007199254740992.0 && v->valuedouble <= 9007199254740992.0))
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* "host:port" (a JSON string) into host (cap bytes) and *port. 0 or -1. */
static int parse_hostport(const cJSON *hp, char *host, size_t cap, int *port) {
    const char *colon = cJSON_IsString(hp) ? strrchr(hp->valuestring, ':') : NULL;
    long p = colon ? strtol(colon + 1, NULL, 10) : 0;
    size_t hl = colon ? (size_t)(colon - hp->valuestring) : 0;
    if (!colon || hl == 0 || hl >= cap || p <= 0 || p > 65535) return -1;
    memcpy(host, hp->valuestring, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

static int config_parse(const char *text, wconfig *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    cJSON *o = cJSON_Parse(text);
    int rc = -1;
    if (!cJSON_IsObject(o)) {
        snprintf(err, errlen, "TRAINYARD_CONFIG is not a JSON object");
        goto out;
    }
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(o, "job");
    const cJSON *api = cJSON_GetObjectItemCaseSensitive(o, "api");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "token");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(o, "spec");
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(o, "task");
    if (!cJSON_IsNumber(job) || !cJSON_IsString(api) || !cJSON_IsString(tok) || !cJSON_IsObject(spec)) {
        snprintf(err, errlen, "TRAINYARD_CONFIG lacks job, api, token or spec");
        goto out;
    }
    if (json_i64(job, &w->job) < 0 || w->job < 1) {
        snprintf(err, errlen, "TRAINYARD_CONFIG job is not a job id");
        goto out;
    }
    const cJSON *att = cJSON_GetObjectItemCaseSensitive(o, "attempt");
    w->attempt = cJSON_IsNumber(att) ? att->valueint : 1;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(o, "secret");
    if (sec) {
        if (!cJSON_IsString(sec) || strlen(sec->valuestring) != 2 * sizeof w->secret) {
            snprintf(err, errlen, "TRAINYARD_CONFIG secret is not %zu hex digits", 2 * sizeof w->secret);
            goto out;
        }
        for (size_t i = 0; i < sizeof w->secret; i++) {
            int hi = hex_nibble(sec->valuestring[2 * i]), lo = hex_nibble(sec->valuestring[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                snprintf(err, errlen, "TRAINYARD_CONFIG secret is not %zu hex digits", 2 * sizeof w->secret);
                goto out;
            }
            w->secret[i] = (unsigned char)(hi << 4 | lo);
        }
        w->has_secret = 1;
    }
    if (sfmt(w->api, sizeof w->api, "%s", api->valuestring) < 0 ||
        sfmt(w->token, sizeof w->token, "%s", tok->valuestring) < 0) {
        snprintf(err, errlen, "TRAINYARD_CONFIG api or token too long");
        goto out;
    }
    snprintf(w->type, sizeof w->type, "worker");
    if (cJSON_IsObject(task)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(task, "type");
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(task, "index");
        if (cJSON_IsString(ty)) snprintf(w->type, sizeof w->type, "%s", ty->valuestring);
        if (cJSON_IsNumber(ix)) w->index = ix->valueint;
    }
    const cJSON *sweep = cJSON_GetObjectItemCaseSensitive(o, "sweep");
    if (sweep) {
        const cJSON *me = cJSON_GetObjectItemCaseSensitive(sweep, "max_epochs");
        if (!cJSON_IsObject(sweep) || !cJSON_IsNumber(me) || me->valuedouble < 1 || me->valuedouble > 1e6) {
            snprintf(err, errlen, "TRAINYARD_CONFIG sweep is not {\"max_epochs\": N, ...}");
            goto out;
        }
        w->rung_max_epochs = me->valueint;
    }
    const cJSON *cluster = cJSON_GetObjectItemCaseSensitive(o, "cluster");
    const cJSON *workers = cluster ? cJSON_GetObjectItemCaseSensitive(cluster, "worker") : NULL;
    w->n_workers = cJSON_IsArray(workers) && cJSON_GetArraySize(workers) > 0 ? cJSON_GetArraySize(workers) : 1;
    if (w->n_workers > COMM_MAX_RANKS) {
        snprintf(err, errlen, "TRAINYARD_CONFIG has %d workers, at most %d", w->n_workers, COMM_MAX_RANKS);
        goto out;
    }
    w->worker_addr = xcalloc((size_t)w->n_workers, sizeof *w->worker_addr);
    w->worker_port = xcalloc((size_t)w->n_workers, sizeof *w->worker_port);
    if (cJSON_IsArray(workers)) {
        int i = 0;
        const cJSON *hp;
        cJSON_ArrayForEach(hp, workers) {
            if (parse_hostport(hp, w->worker_addr[i], COMM_ADDR_MAX, &w->worker_port[i]) < 0) {
                snprintf(err, errlen, "TRAINYARD_CONFIG cluster.worker[%d] is not host:port", i);
                goto out;
            }
            i++;
        }
    }
    const cJSON *ps = cluster ? cJSON_GetObjectItemCaseSensitive(cluster, "ps") : NULL;
    if (cJSON_IsArray(ps) && cJSON_GetArraySize(ps) > 0) {
        w->n_ps = cJSON_GetArraySize(ps);
        if (w->n_ps > PS_MAX) {
            snprintf(err, errlen, "TRAINYARD_CONFIG has %d ps tasks, at most %d", w->n_ps, PS_MAX);
            goto out;
        }
        w->ps = xcalloc((size_t)w->n_ps, sizeof *w->ps);
        int i = 0;
        const cJSON *hp;
        cJSON_ArrayForEach(hp, ps) {
            if (parse_hostport(hp, w->ps[i].host, sizeof w->ps[i].host, &w->ps[i].port) < 0) {
                snprintf(err, errlen, "TRAINYARD_CONFIG cluster.ps[%d] is not host:port", i);
                goto out;
            }
            i++;
        }
    }
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(o, "devices")) {
        if (cJSON_IsString(d) && strncmp(d->valuestring, "cpu", 3) == 0) w->threads++;
        if (cJSON_IsString(d) && strncmp(d->valuestring, "gpu:", 4) == 0) w->gpus++;
    }
    if (w->threads < 1) w->threads = 1;
    w->spec_json = cJSON_PrintUnformatted(spec);
    if (!w->spec_json) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* ---------------------------------------------------------------- checkpoint uploads */

/* A checkpoint handed to the sender: the file's bytes. */
typedef struct wckpt {
    unsigned char *data;         /* (len) owned */
    size_t len;
} wckpt;

typedef struct wupload {
    const wconfig *w;
    CURL *raw;                   /* reused across uploads (the sender's checkpoint thread's) */
    volatile sig_atomic_t *cancel; /* report_ckpt_cancel of the sender */
} wupload;

static void wckpt_release(void *p) {
    wckpt *k = p;
    free(k->data);
    free(k);
}

/* report_ckpt_ops.upload: the bytes as the job's checkpoint, to the store
 * (or the server when it keeps them itself). */
static int wckpt_upload(void *ctx, void *p, long step, long epoch, char *err, size_t errlen) {
    const wupload *u = ctx;
    const wckpt *k = p;
    char sha[65];
    report_ckpt_bytes b = {.api = u->w->api, .token = u->w->token, .job = u->w->job, .attempt = u->w->attempt,
                           .step = step, .epoch = epoch, .head = k->data, .head_len = k->len, .fd = -1,
                           .total = k->len, .stop = u->cancel};
    long st = report_upload_ckpt(u->raw, &b, sha, err, errlen);
    if (st == 201 || st == 200) {
        log_info("checkpoint uploaded: step %ld, epoch %ld, %zu bytes, sha256 %.16s...", step, epoch, k->len, sha);
        return 0;
    }
    /* 507: the server's disk is at its reserve or the team at its storage
     * quota; retrying the same bytes would not help, training goes on and
     * the next checkpoint is tried */
    if (st == 0 || (st >= 500 && st != 507) || st == 429) {
        if (st) snprintf(err, errlen, "server error");
        return -2;
    }
    if (st == 507) log_error("checkpoint upload refused (%s): training goes on; the next checkpoint is tried", err);
    else log_error("checkpoint upload %s (dropped)", err);
    return -1;
}

static const report_ckpt_ops wckpt_ops = {wckpt_upload, wckpt_release, NULL};

/* ---------------------------------------------------------------- resume state */

/* What the job reported before this attempt: the next seq, and the last
 * step/epoch/test already recorded (never reported again). */
typedef struct reported {
    int64_t last_seq;
    long max_step;
    int max_epoch;               /* 1-based epochs with an epoch metric */
    int has_test;
} reported;

static int fetch_reported(client *c, const wconfig *w, reported *rep, char *err, size_t errlen) {
    memset(rep, 0, sizeof *rep);
    int64_t since = 0, backoff = 0;
    for (int pages = 0; pages < 100000;) {
        char path[160];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?since=%lld&limit=1000", (long long)w->job,
                 (long long)since);
        client_reply r;
        int e = client_request(c, "GET", path, NULL, 0, NULL, &r);
        if (e < 0 || r.status >= 500) {
            log_warn("cannot read the job's metrics (%s); retrying", e < 0 ? r.error : "server error");
            client_reply_release(&r);
            if (report_wait_retry(&g_stop, &backoff) < 0) {
                snprintf(err, errlen, "stopped before training started");
                return -1;
            }
            continue;
        }
        backoff = 0;
        pages++;
        if (r.status != 200) {
            snprintf(err, errlen, "GET %s answered %ld: %.200s", path, r.status, r.body.data ? r.body.data : "");
            client_reply_release(&r);
            return -1;
        }
        cJSON *o = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        client_reply_release(&r);
        const cJSON *arr = o ? cJSON_GetObjectItemCaseSensitive(o, "metrics") : NULL;
        const cJSON *ls = o ? cJSON_GetObjectItemCaseSensitive(o, "last_seq") : NULL;
        if (!cJSON_IsArray(arr)) {
            cJSON_Delete(o);
            snprintf(err, errlen, "GET %s: no metrics array in the answer", path);
            return -1;
        }
        int64_t iv;
        if (json_i64(ls, &iv) == 0 && iv > rep->last_seq) rep->last_seq = iv;
        int64_t page_max = since;
        const cJSON *m;
        cJSON_ArrayForEach(m, arr) {
            const cJSON *seq = cJSON_GetObjectItemCaseSensitive(m, "seq");
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(m, "kind");
            const cJSON *step = cJSON_GetObjectItemCaseSensitive(m, "step");
            const cJSON *ep = cJSON_GetObjectItemCaseSensitive(m, "epoch");
            if (json_i64(seq, &iv) == 0 && iv > page_max) page_max = iv;
            if (!cJSON_IsString(kind)) continue;
            if (strcmp(kind->valuestring, "step") == 0 && json_i64(step, &iv) == 0 && iv > rep->max_step)
                rep->max_step = (long)iv;
            if (strcmp(kind->valuestring, "epoch") == 0 && cJSON_IsNumber(ep) && ep->valueint > rep->max_epoch)
                rep->max_epoch = ep->valueint;
            if (strcmp(kind->valuestring, "test") == 0) rep->has_test = 1;
        }
        int n = cJSON_GetArraySize(arr);
        cJSON_Delete(o);
        if (page_max > rep->last_seq) rep->last_seq = page_max;
        if (n == 0 || page_max <= since) break;
        since = page_max;
    }
    return 0;
}

/* ---------------------------------------------------------------- communicator */

#define RDV_WAIT_S 20                /* one long-poll of the rendezvous */
#define RDV_DEADLINE_S 600           /* peers that have not published by then: give up */
#define COMM_TIMEOUT_MS 30000        /* a silent peer during training */

/* Joins the job's workers: listen on the scheduler's port (any free port
 * when it is taken), publish "comm-INDEX" = {addr, port, host_id} in the
 * attempt's rendezvous, read every peer's, then comm_init. Returns the
 * communicator, or NULL with a message in err. */
static comm *comm_join(client *c, const wconfig *w, char *err, size_t errlen) {
    char cerr[ERR_MAX];
    int port = 0;
    int fd = comm_listen(NULL, w->worker_port[w->index], &port, cerr);
    if (fd < 0) {
        log_warn("cannot listen on port %d (%s): taking any free port", w->worker_port[w->index], cerr);
        fd = comm_listen(NULL, 0, &port, cerr);
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot listen for the other workers: %s", cerr);
        return NULL;
    }
    comm_peer *peers = xcalloc((size_t)w->n_workers, sizeof *peers);
    comm *cm = NULL;
    char hid[COMM_HOST_ID_MAX];
    if (comm_host_id(hid) < 0) {
        snprintf(err, errlen, "cannot read this host's identity (/proc/sys/kernel/random/boot_id)");
        goto out;
    }
    cJSON *me = cJSON_CreateObject();
    cJSON_AddStringToObject(me, "addr", w->worker_addr[w->index]);
    cJSON_AddNumberToObject(me, "port", port);
    cJSON_AddStringToObject(me, "host_id", hid);
    char *body = cJSON_PrintUnformatted(me);
    cJSON_Delete(me);
    if (!body) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    report_api a = {c, w->job, &g_stop, "stopped before training started"};
    char key[32];
    snprintf(key, sizeof key, "comm-%d", w->index);
    int published = report_rdv_put(&a, key, body, err, errlen);
    free(body);
    if (published < 0) goto out;
    int64_t deadline = mono_ms() + (int64_t)RDV_DEADLINE_S * 1000;
    for (int i = 0; i < w->n_workers; i++) {
        snprintf(key, sizeof key, "comm-%d", i);
        cJSON *o = NULL;
        int got = report_rdv_get(&a, key, RDV_WAIT_S, deadline, &o, err, errlen);
        if (got == REPORT_RDV_TIMEOUT) snprintf(err, errlen, "worker %d did not join within %d s", i, RDV_DEADLINE_S);
        if (got < 0) goto out;
        const cJSON *ad = cJSON_GetObjectItemCaseSensitive(o, "addr");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "port");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "host_id");
        int ok = cJSON_IsString(ad) && cJSON_IsNumber(p) && cJSON_IsString(h) &&
                 sfmt(peers[i].addr, sizeof peers[i].addr, "%s", ad->valuestring) == 0 &&
                 sfmt(peers[i].host_id, sizeof peers[i].host_id, "%s", h->valuestring) == 0 && p->valueint > 0 &&
                 p->valueint <= 65535;
        if (ok) peers[i].port = p->valueint;
        cJSON_Delete(o);
        if (!ok) {
            snprintf(err, errlen, "worker %d published a malformed address", i);
            goto out;
        }
    }
    char session[64];
    snprintf(session, sizeof session, "j%lld-a%d", (long long)w->job, w->attempt);
    comm_options co = {.timeout_ms = COMM_TIMEOUT_MS, .transport = COMM_TRANSPORT_AUTO, .session = session,
                       .secret = w->has_secret ? w->secret : NULL};
    log_info("joining %d workers (worker %d listens on port %d)", w->n_workers, w->index, port);
    if (comm_init(&cm, w->index, w->n_workers, peers, fd, &co, cerr) < 0) {
        fd = -1; /* comm_init took it */
        snprintf(err, errlen, "cannot connect the workers: %s", cerr);
        cm = NULL;
        goto out;
    }
    fd = -1;
out:
    if (fd >= 0) close(fd);
    free(peers);
    return cm;
}

/* The NCCL id of a GPU job of several workers: the chief makes one and
 * publishes it as "nccl-id" = {"id": HEX} in the attempt's rendezvous (a new
 * one each attempt); the others wait for it. 0 with hex filled, or -1. */
static int nccl_id_join(client *c, const wconfig *w, char hex[GPU_NCCL_ID_HEX], char *err, size_t errlen) {
    report_api a = {c, w->job, &g_stop, "stopped before training started"};
    char gerr[ERR_MAX];
    if (w->index == 0) {
        if (gpu_nccl_unique_id(hex, gerr) < 0) {
            snprintf(err, errlen, "cannot make the NCCL id: %s", gerr);
            return -1;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", hex);
        char *body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!body) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        int rc = report_rdv_put(&a, "nccl-id", body, err, errlen);
        free(body);
        if (rc == 0) log_info("published the NCCL id (rendezvous key nccl-id)");
        return rc < 0 ? -1 : 0;
    }
    cJSON *o = NULL;
    int got = report_rdv_get(&a, "nccl-id", RDV_WAIT_S, mono_ms() + (int64_t)RDV_DEADLINE_S * 1000, &o, err, errlen);
    if (got == REPORT_RDV_TIMEOUT) snprintf(err, errlen, "the chief did not publish the NCCL id within %d s", RDV_DEADLINE_S);
    if (got < 0) return -1;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    int ok = cJSON_IsString(id) && strlen(id->valuestring) == GPU_NCCL_ID_HEX - 1 &&
             strspn(id->valuestring, "0123456789abcdef") == GPU_NCCL_ID_HEX - 1;
    if (ok) memcpy(hex, id->valuestring, GPU_NCCL_ID_HEX);
    cJSON_Delete(o);
    if (!ok) {
        snprintf(err, errlen, "the chief published a malformed NCCL id (rendezvous key nccl-id)");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- hooks */

typedef struct wctx {
    const wconfig *w;
    int chief;
    client *c;                   /* the worker's client (the training thread's between steps) */
    report_sender *snd;
    reported rep;
    int64_t last_step_ms;
    double loss_acc;             /* losses of the steps since the last step metric */
    long loss_n, ex_n;
    int64_t window_ms;
    long last_step, last_reported_step;
    int first_logged;
    int epochs;
} wctx;

static void emit_step(wctx *c, long step, int epoch) {
    if (!c->loss_n) return;
    int64_t now = mono_ms();
    double secs = c->window_ms ? (double)(now - c->window_ms) / 1000.0 : 0.0;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "kind", "step");
    cJSON_AddNumberToObject(m, "step", (double)step);
    cJSON_AddNumberToObject(m, "epoch", epoch);
    cJSON_AddNumberToObject(m, "loss", c->loss_acc / (double)c->loss_n);
    if (secs > 0) cJSON_AddNumberToObject(m, "samples_per_sec", (double)c->ex_n / secs);
    cJSON_AddNumberToObject(m, "workers", c->w->n_workers); /* an elastic job's size over time */
    report_push(c->snd, m);
    c->loss_acc = 0;
    c->loss_n = 0;
    c->ex_n = 0;
    c->window_ms = now;
    c->last_step_ms = now;
    c->last_reported_step = step;
}

static void hook_step(void *ctx, const train_step_info *s) {
    wctx *c = ctx;
    c->last_step = s->step;
    int first = !c->first_logged;
    if (first) {
        c->first_logged = 1;
        log_info("first training step: step %ld, epoch %d, loss %.4f", s->step, s->epoch + 1, s->loss);
    }
    if (!c->chief || s->step <= c->rep.max_step) {
        c->window_ms = mono_ms();
        return; /* recorded by an earlier attempt */
    }
    c->loss_acc += s->loss;
    c->loss_n++;
    c->ex_n += s->n;
    int64_t now = mono_ms();
    /* the first step at once (it marks "training started"), then ~10 a second */
    if (c->last_reported_step == 0 || now - c->last_step_ms >= STEP_REPORT_MS) {
        if (first) c->window_ms = 0; /* data loading is not training time: no rate for this one */
        emit_step(c, s->step, s->epoch);
        if (first) report_flush_soon(c->snd);
    }
}

static void hook_epoch(void *ctx, const train_epoch_metrics *e) {
    wctx *c = ctx;
    log_info("epoch %d/%d: step %ld, loss %.4f, accuracy %.4f%s%.4f%s%.4f, %.0f samples/s", e->epoch, e->epochs, e->step,
             e->loss, e->accuracy, e->has_val ? ", val_loss " : "", e->has_val ? e->val_loss : 0.0,
             e->has_val ? ", val_accuracy " : "", e->has_val ? e->val_accuracy : 0.0, e->samples_per_sec);
    if (!c->chief) return;
    if (e->step > c->rep.max_step) emit_step(c, e->step, e->epoch - 1); /* the epoch's last step */
    if (e->epoch <= c->rep.max_epoch) return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "kind", "epoch");
    cJSON_AddNumberToObject(m, "epoch", e->epoch);
    cJSON_AddNumberToObject(m, "epochs", e->epochs);
    cJSON_AddNumberToObject(m, "step", (double)e->step);
    cJSON_AddNumberToObject(m, "loss", e->loss);
    cJSON_AddNumberToObject(m, "accuracy", e->accuracy);
    if (e->has_val) {
        cJSON_AddNumberToObject(m, "val_loss", e->val_loss);
        cJSON_AddNumberToObject(m, "val_accuracy", e->val_accuracy);
    }
    cJSON_AddNumberToObject(m, "seconds", e->seconds);
    cJSON_AddNumberToObject(m, "samples_per_sec", e->samples_per_sec);
    cJSON_AddNumberToObject(m, "workers", c->w->n_workers);
    report_push(c->snd, m);
}

static void hook_checkpoint(void *ctx, const char *path, const ckpt_meta *meta) {
    wctx *c = ctx;
    if (!c->chief) return;
    size_t len = 0;
    char *data = file_read_all(path, (size_t)CKPT_UPLOAD_MAX, &len);
    if (!data) {
        log_error("cannot read the checkpoint just written (%s): %s", path, strerror(errno));
        return;
    }
    log_info("checkpoint written: epoch %ld, step %ld%s (%zu bytes)", meta->epoch, meta->step,
             meta->batch_pos ? " (mid-epoch)" : "", len);
    wckpt *k = xmalloc(sizeof *k);
    k->data = (unsigned char *)data;
    k->len = len;
    report_set_ckpt(c->snd, k, meta->step, meta->epoch);
}

/* An ASHA trial at the end of a rung short of the sweep's last (train_hooks.extend,
 * docs/sweeps.md): its metrics delivered first (the server ranks it by
 * them), then POST /jobs/{id}/rung asks whether it goes on, retrying while
 * the server is away. The epochs to train in all: the next rung's when it
 * goes on, in this process, else `epochs` (it ends; its checkpoint is
 * written and uploaded as at any end, for a later promotion to resume
 * from). */
static int hook_extend(void *ctx, int done, int epochs) {
    wctx *c = ctx;
    const wconfig *w = c->w;
    if (!c->chief || w->rung_max_epochs <= 0 || done >= w->rung_max_epochs) return epochs;
    int64_t t0 = mono_ms();
    if (report_drain(c->snd, RUNG_ASK_S) < 0 || report_attempt_over(c->snd)) {
        log_warn("rung end at epoch %d: the metrics were not delivered; it ends here", done);
        return epochs;
    }
    char path[96], body[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rung", (long long)w->job);
    snprintf(body, sizeof body, "{\"attempt\":%d,\"epoch\":%d}", w->attempt, done);
    int64_t backoff = 0, deadline = t0 + (int64_t)RUNG_ASK_S * 1000;
    for (;;) {
        client_reply r;
        int e = client_request(c->c, "POST", path, body, strlen(body), NULL, &r);
        if (e == 0 && r.status == 200) {
            cJSON *o = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
            client_reply_release(&r);
            const cJSON *go = cJSON_GetObjectItemCaseSensitive(o, "continue");
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "epochs");
            const cJSON *why = cJSON_GetObjectItemCaseSensitive(o, "reason");
            int more = cJSON_IsTrue(go) && cJSON_IsNumber(n) && n->valuedouble > done &&
                               n->valuedouble <= w->rung_max_epochs
                           ? n->valueint
                           : epochs;
            log_info("rung end at epoch %d (asked in %lld ms): %s", done, (long long)(mono_ms() - t0),
                     cJSON_IsString(why) ? why->valuestring : more > epochs ? "it goes on" : "it ends here");
            cJSON_Delete(o);
            return more;
        }
        if (e == 0 && r.status < 500 && r.status != 429) {
            log_warn("rung end at epoch %d: POST %s answered %ld: %.300s; it ends here", done, path, r.status,
                     r.body.data ? r.body.data : "");
            client_reply_release(&r);
            return epochs;
        }
        log_warn("rung end at epoch %d: cannot ask the server (%s); retrying", done,
                 e < 0 ? r.error : "server error");
        client_reply_release(&r);
        if (mono_ms() > deadline || report_wait_retry(&g_stop, &backoff) < 0) {
            log_warn("rung end at epoch %d: no answer; it ends here", done);
            return epochs;
        }
    }
}

/* ---------------------------------------------------------------- ps task */

/* A ps task: serves its shard on the scheduler's port until the chief ends
 * the job (exit 0) or SIGTERM (exit 143). */
static int run_ps(const wconfig *w, const jobspec *spec, char *err, size_t errlen) {
    if (w->index < 0 || w->index >= w->n_ps) {
        snprintf(err, errlen, "ps index %d is not one of the %d ps tasks", w->index, w->n_ps);
        return WORKER_EXIT_FAILED;
    }
    char cerr[ERR_MAX];
    int port = 0;
    int fd = comm_listen(NULL, w->ps[w->index].port, &port, cerr);
    if (fd < 0) {
        snprintf(err, errlen, "ps %d cannot listen on port %d: %s", w->index, w->ps[w->index].port, cerr);
        return WORKER_EXIT_FAILED;
    }
    log_info("job %lld attempt %d: ps %d of %d on port %d", (long long)w->job, w->attempt, w->index, w->n_ps, port);
    char perr[ERR_MAX];
    int rc = ps_serve(spec, w->index, w->n_ps, fd, w->has_secret ? w->secret : NULL, &g_stop, perr);
    if (rc < 0) {
        snprintf(err, errlen, "ps %d failed: %s", w->index, perr);
        return WORKER_EXIT_FAILED;
    }
    snprintf(err, errlen, rc == 1 ? "ps %d stopped by SIGTERM" : "ps %d: the chief ended the job", w->index);
    return rc == 1 ? WORKER_EXIT_STOPPED : WORKER_EXIT_OK;
}

/* ---------------------------------------------------------------- run, by phase
 *
 * A task: its config and spec; the roles that do not train here (a
 * command, the evaluator, a ps); a worker's checks; its scratch directory
 * and clients; what the job already recorded, its checkpoint and the
 * report sender; the communicator; the train options and hooks; the
 * training and its outcome delivered; the end (the reason said, everything
 * freed). One wrun holds what the phases share; each phase answers how the
 * run goes on. */

enum {
    RUN_ON,   /* the next phase */
    RUN_FAIL, /* ended: err to stderr */
    RUN_MSG,  /* ended: err logged */
    RUN_DONE  /* ended, nothing to say */
};

typedef struct wrun {
    const char *config;
    wconfig w;
    jobspec *spec;
    char err[512];
    int ret;                     /* the exit status, WORKER_EXIT_* */
    char dir[PATH_MAX], ckpt_path[PATH_MAX + 32], resume_path[PATH_MAX + 32];
    char data_path[PATH_MAX + JOBSPEC_PATH_MAX + 2];
    client c;
    int have_client;
    wupload up;
    report_sender snd;
    comm *cm;
    int chief, replicas;
    wctx ctx;
    int have_ckpt;
    char nccl_id[GPU_NCCL_ID_HEX];
    train_options opt;
    train_hooks hooks;
} wrun;

/* The config (TRAINYARD_CONFIG), the log prefix, the job spec. */
static int run_config(wrun *r) {
    if (config_parse(r->config, &r->w, r->err, sizeof r->err) < 0) return RUN_FAIL;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s-%d", r->w.type, r->w.index);
    log_set_prefix(prefix);
    spec_error se;
    if (jobspec_parse(r->w.spec_json, strlen(r->w.spec_json), r->spec, &se) < 0) {
        snprintf(r->err, sizeof r->err, "the job spec is invalid: %s: %s", se.field, se.message);
        return RUN_FAIL;
    }
    return RUN_ON;
}

/* The tasks that do not train here: a command job's, the evaluator, a ps. */
static int run_role(wrun *r) {
    const wconfig *w = &r->w;
    const jobspec *spec = r->spec;
    if (spec->kind == JOB_KIND_COMMAND || spec->kind == JOB_KIND_INTERACTIVE) {
        /* the team's own program, or the notebook or shell an interactive
         * job opens: executor/command.c */
        r->ret = command_run(r->config, spec, &g_stop);
        return RUN_DONE;
    }
    if (strcmp(w->type, "evaluator") == 0) { /* the side-car: executor/evaluator.c */
        r->ret = evaluator_run(w->api, w->token, w->job, w->attempt, spec, &g_stop);
        return RUN_DONE;
    }
    if (spec->strategy.type == STRAT_PARAMETER_SERVER && w->n_ps < 1) {
        snprintf(r->err, sizeof r->err, "strategy parameter_server but the cluster has no ps task");
        return RUN_FAIL;
    }
    if (strcmp(w->type, "ps") == 0) {
        r->ret = run_ps(w, spec, r->err, sizeof r->err);
        return r->ret == WORKER_EXIT_FAILED ? RUN_FAIL : RUN_MSG;
    }
    return RUN_ON;
}

/* A training worker: its index, the cluster's size against the spec's, its
 * type; the GPUs it was given. */
static int run_checks(wrun *r) {
    const wconfig *w = &r->w;
    const jobspec *spec = r->spec;
    if (w->index < 0 || w->index >= w->n_workers) {
        snprintf(r->err, sizeof r->err, "task index %d is not one of the %d workers", w->index, w->n_workers);
        return RUN_FAIL;
    }
    if (w->n_workers > spec->resources.workers || w->n_workers < spec->resources.workers_min) {
        if (jobspec_elastic(spec))
            snprintf(r->err, sizeof r->err, "the cluster has %d workers but the spec asks for %d to %d", w->n_workers,
                     spec->resources.workers_min, spec->resources.workers);
        else
            snprintf(r->err, sizeof r->err, "the cluster has %d workers but the spec asks for %d", w->n_workers,
                     spec->resources.workers);
        return RUN_FAIL;
    }
    if (strcmp(w->type, "worker") != 0 && strcmp(w->type, "chief") != 0) {
        snprintf(r->err, sizeof r->err, "task type '%s' is not supported by this worker yet", w->type);
        return RUN_FAIL;
    }
    r->chief = w->index == 0;
    r->replicas = spec->resources.devices_per_worker;
    log_info("job %lld attempt %d: %s, strategy %s, %d epoch(s) of batch %d, %d worker(s) x %d replica(s)",
             (long long)w->job, w->attempt, spec->name, strategy_name(spec->strategy.type), spec->fit.epochs,
             spec->fit.batch_size, w->n_workers, r->replicas);
    /* GPUs given: the GPU engine or a clear failure, never the CPU in their place */
    char eerr[ERR_MAX];
    if (engine_gpu_check(spec, w->gpus, w->n_workers, eerr) < 0) {
        snprintf(r->err, sizeof r->err, "%s", eerr);
        return RUN_FAIL;
    }
    if (w->gpus > 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        log_info("engine: GPU, %d device(s) (CUDA_VISIBLE_DEVICES=%s)%s", w->gpus, vis ? vis : "(unset)",
                 w->gpus * w->n_workers > 1 ? ", gradients all-reduced with NCCL" : "");
    }
    return RUN_ON;
}

/* The scratch directory of the checkpoint files, the API client, the
 * uploads' handle. */
static int run_scratch(wrun *r) {
    const char *tmp = getenv("TMPDIR");
    if (sfmt(r->dir, sizeof r->dir, "%s/trainyard-job%lld-XXXXXX", tmp && *tmp ? tmp : "/tmp",
             (long long)r->w.job) < 0 ||
        !mkdtemp(r->dir)) {
        snprintf(r->err, sizeof r->err, "cannot make a temporary directory: %s", strerror(errno));
        r->dir[0] = '\0';
        return RUN_FAIL;
    }
    snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s/checkpoint.safetensors", r->dir);
    snprintf(r->resume_path, sizeof r->resume_path, "%s/resume.safetensors", r->dir);
    if (client_init(&r->c, r->w.api, r->w.token) < 0) {
        snprintf(r->err, sizeof r->err, "cannot make an HTTP client");
        return RUN_FAIL;
    }
    r->have_client = 1;
    r->c.timeout_ms = 30000;
    r->up.raw = curl_easy_init();
    if (!r->up.raw) {
        snprintf(r->err, sizeof r->err, "cannot make an HTTP client");
        return RUN_FAIL;
    }
    return RUN_ON;
}

/* What the job already has (the chief's part): the metrics an earlier
 * attempt recorded, the latest checkpoint to resume from; then the report
 * sender. */
static int run_resume(wrun *r) {
    const wconfig *w = &r->w;
    report_api api = {&r->c, w->job, &g_stop, "stopped before training started"};
    wctx *ctx = &r->ctx;
    ctx->w = w;
    ctx->chief = r->chief;
    ctx->c = &r->c;
    ctx->snd = &r->snd;
    if (r->chief && fetch_reported(&r->c, w, &ctx->rep, r->err, sizeof r->err) < 0) return RUN_FAIL;
    char sha[65];
    /* several workers: the chief resumes and broadcasts what it loaded */
    r->have_ckpt = r->chief ? report_fetch_ckpt(&api, r->resume_path, sha, r->err, sizeof r->err) : 0;
    if (r->have_ckpt < 0) return RUN_FAIL;
    if (r->have_ckpt) log_info("resuming from the job's latest checkpoint (sha256 %.16s...)", sha);
    if (r->chief && ctx->rep.last_seq)
        log_info("metrics continue at seq %lld (steps up to %ld, epochs up to %d already recorded)",
                 (long long)ctx->rep.last_seq + 1, ctx->rep.max_step, ctx->rep.max_epoch);
    if (g_stop) {
        snprintf(r->err, sizeof r->err, "stopped before training started");
        r->ret = WORKER_EXIT_STOPPED;
        return RUN_MSG;
    }
    if (report_start(&r->snd, w->api, w->token, w->job, ctx->rep.last_seq + 1, &wckpt_ops, &r->up, NULL) < 0) {
        snprintf(r->err, sizeof r->err, "cannot start the sender thread");
        return RUN_FAIL;
    }
    report_set_attempt(&r->snd, w->attempt);
    return RUN_ON;
}

/* Several workers: the communicator (not parameter_server's), and on GPUs
 * the chief's NCCL id. */
static int run_join(wrun *r) {
    const wconfig *w = &r->w;
    if (w->n_workers > 1 && r->spec->strategy.type != STRAT_PARAMETER_SERVER) {
        r->cm = comm_join(&r->c, w, r->err, sizeof r->err);
        if (!r->cm) {
            if (g_stop) r->ret = WORKER_EXIT_STOPPED;
            return RUN_FAIL;
        }
    }
    if (w->gpus > 0 && w->n_workers > 1 && nccl_id_join(&r->c, w, r->nccl_id, r->err, sizeof r->err) < 0) {
        if (g_stop) r->ret = WORKER_EXIT_STOPPED;
        return RUN_FAIL;
    }
    return RUN_ON;
}

/* The train options (this worker's part, the strategy's, the spec's hash,
 * the data path confined to the data roots) and the hooks. */
static int run_options(wrun *r) {
    const wconfig *w = &r->w;
    const jobspec *spec = r->spec;
    train_options *opt = &r->opt;
    int chief = r->chief, replicas = r->replicas;
    opt->threads = w->threads;
    opt->gpus = w->gpus;
    opt->nccl_id = r->nccl_id[0] ? r->nccl_id : NULL;
    opt->checkpoint_path = chief ? r->ckpt_path : NULL;
    opt->resume_path = r->have_ckpt ? r->resume_path : NULL;
    opt->worker = w->index;
    opt->workers = w->n_workers;
    opt->comm = r->cm;
    opt->no_eval = !chief && !r->cm; /* workers in a communicator evaluate together (train_loop.c) */
    opt->replicas = replicas;
    /* gradient accumulation: the micro-batch size of the job's full size */
    opt->micro_batches = jobspec_micro_batches(spec, w->n_workers);
    log_info("gradient accumulation: %d micro-batch(es) of at most %d rows per replica and step "
             "(fit.gradient_accumulation_steps %d, %d of %d workers)",
             opt->micro_batches,
             (spec->fit.batch_size / (w->n_workers * (replicas > 0 ? replicas : 1)) + opt->micro_batches - 1) /
                 opt->micro_batches,
             spec->fit.gradient_accumulation_steps, w->n_workers, spec->resources.workers);
    opt->replica_vars = spec->strategy.type == STRAT_CENTRAL_STORAGE ? REPLICA_VARS_CENTRAL : REPLICA_VARS_MIRRORED;
    opt->replica_reduce =
        spec->strategy.cross_device_ops == CDO_REDUCTION_TO_ONE_DEVICE ? REPLICA_REDUCE_ONE : REPLICA_REDUCE_ALL;
    if (spec->strategy.type == STRAT_PARAMETER_SERVER) {
        opt->n_ps = w->n_ps;
        opt->ps = w->ps;
        opt->ps_secret = w->has_secret ? w->secret : NULL;
        opt->replicas = 1;
    }
    sha256_hex(w->spec_json, strlen(w->spec_json), opt->spec_hash);
    /* data.path stays inside the agent's data roots: no "..", no symlink out (executor/data/dataroot.h) */
    if (spec->data.path[0]) {
        if (data_path_confine(spec->data.path, getenv("TRAINYARD_DATA_ROOT"), r->data_path, sizeof r->data_path,
                              r->err, sizeof r->err) < 0)
            return RUN_FAIL;
        opt->data_path = r->data_path;
    }
    train_hooks *hooks = &r->hooks;
    hooks->ctx = &r->ctx;
    hooks->on_step = hook_step;
    hooks->on_epoch = hook_epoch;
    hooks->on_checkpoint = hook_checkpoint;
    hooks->stop = &g_stop;
    if (w->rung_max_epochs > 0) hooks->extend = hook_extend; /* every worker: the loop broadcasts rank 0's answer */
    return RUN_ON;
}

/* Stopped by SIGTERM: the checkpoint and the metrics delivered within the
 * agent's grace. */
static int run_stopped(wrun *r, const train_result *res) {
    log_info("stopped at step %ld: delivering the checkpoint and metrics", res->steps);
    int reachable = report_server_ok(&r->snd);
    if (report_drain(&r->snd, reachable ? STOP_FLUSH_S : STOP_FLUSH_DOWN_S) < 0)
        log_error("could not deliver everything before stopping (the server is %s)",
                  reachable ? "slow" : "unreachable");
    r->ret = WORKER_EXIT_STOPPED;
    snprintf(r->err, sizeof r->err, "stopped by SIGTERM at step %ld (checkpoint uploaded: %s)", res->steps,
             r->chief && report_uploaded_step(&r->snd) == res->steps ? "yes" : "no");
    return RUN_MSG;
}

/* Trained to the end: the test metric (the chief's, unless recorded), and
 * everything delivered. */
static int run_finished(wrun *r, const train_result *res) {
    if (res->has_test) {
        log_info("test: loss %.4f, accuracy %.4f", res->test_loss, res->test_accuracy);
        if (r->chief && !r->ctx.rep.has_test) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "kind", "test");
            cJSON_AddNumberToObject(m, "step", (double)res->steps);
            cJSON_AddNumberToObject(m, "test_loss", res->test_loss);
            cJSON_AddNumberToObject(m, "test_accuracy", res->test_accuracy);
            report_push(&r->snd, m);
        }
    }
    if (report_drain(&r->snd, FINAL_FLUSH_S) < 0) {
        snprintf(r->err, sizeof r->err, "trained, but the server did not take the metrics/checkpoint within %d s",
                 FINAL_FLUSH_S);
        return RUN_FAIL;
    }
    long dropped = report_dropped(&r->snd);
    if (dropped) log_warn("%ld step metric(s) were dropped while the server was away (buffer full)", dropped);
    log_info("done: %d epoch(s), %ld steps, %.0f samples/s", res->epochs_done, res->steps, res->samples_per_sec);
    r->ret = WORKER_EXIT_OK;
    return RUN_DONE;
}

/* The training (train_loop.c), then its outcome delivered. */
static int run_train(wrun *r) {
    train_result res;
    char terr[ERR_MAX];
    r->ctx.window_ms = mono_ms();
    if (train_run(r->spec, &r->opt, &r->hooks, &res, terr) < 0) {
        snprintf(r->err, sizeof r->err, "training failed: %s", terr);
        report_drain(&r->snd, 10); /* what was recorded before the failure */
        return RUN_FAIL;
    }
    return res.stopped ? run_stopped(r, &res) : run_finished(r, &res);
}

/* The reason said (how: RUN_FAIL, RUN_MSG), the sender stopped, everything
 * freed and the scratch files removed; the exit status. */
static int run_end(wrun *r, int how) {
    if (how == RUN_FAIL) {
        fprintf(stderr, "trainyard worker: error: %s\n", r->err);
        fflush(stderr);
    } else if (how == RUN_MSG) {
        log_info("%s", r->err);
    }
    report_stop(&r->snd);
    comm_free(r->cm);
    if (r->have_client) client_release(&r->c);
    if (r->up.raw) curl_easy_cleanup(r->up.raw);
    if (r->ckpt_path[0]) unlink(r->ckpt_path);
    if (r->resume_path[0]) unlink(r->resume_path);
    if (r->dir[0]) rmdir(r->dir);
    jobspec_release(r->spec);
    free(r->spec);
    free(r->w.spec_json);
    free(r->w.worker_addr);
    free(r->w.worker_port);
    free(r->w.ps);
    return r->ret;
}

int worker_run(const char *config) {
    wrun r;
    memset(&r, 0, sizeof r);
    r.config = config;
    r.spec = xcalloc(1, sizeof *r.spec);
    r.ret = WORKER_EXIT_FAILED;
    r.up.w = &r.w;
    r.up.cancel = report_ckpt_cancel(&r.snd);
    int how = run_config(&r);
    if (how == RUN_ON) how = run_role(&r);
    if (how == RUN_ON) how = run_checks(&r);
    if (how == RUN_ON) how = run_scratch(&r);
    if (how == RUN_ON) how = run_resume(&r);
    if (how == RUN_ON) how = run_join(&r);
    if (how == RUN_ON) how = run_options(&r);
    if (how == RUN_ON) how = run_train(&r);
    return run_end(&r, how);
}

int cmd_worker(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: trainyard worker\n"
               "  Started by `trainyard agent`, one process per task, with TRAINYARD_CONFIG in the\n"
               "  environment (docs/api-executors.md). Exit 0: trained to the end; 143: stopped by\n"
               "  SIGTERM after a checkpoint; 1: failed (the reason is the last log line).\n");
        return 0;
    }
    const char *cfg = getenv("TRAINYARD_CONFIG");
    if (!cfg || !*cfg) {
        fprintf(stderr, "trainyard worker: error: TRAINYARD_CONFIG is not set (workers are started by the agent)\n");
        return WORKER_EXIT_FAILED;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    log_set_prefix("worker");
    return worker_run(cfg);
}
