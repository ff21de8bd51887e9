/* evaluator.c - the evaluator side-car of a train job. See evaluator.h. */
#include "evaluator.h"
#include "report.h"
#include "exit_codes.h"
#include "../client/client.h"
#include "../common/util.h"
#include "data/dataroot.h"
#include "data/dataset.h"
#include "nn/checkpoint.h"
#include "nn/model.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define STOP_FLUSH_S 3              /* after a stop: what is left of the agent's 10 s grace */
#define FINAL_FLUSH_S 60            /* after the final checkpoint */
#define STOP_EVAL_MS 6000           /* after a stop: evaluating older checkpoints too until then */

/* One checkpoint as GET /jobs/{id}/checkpoints lists it. */
typedef struct ev_ckpt {
    int64_t id;
    long step, epoch;
    char sha[65];
} ev_ckpt;

typedef struct evaluator {
    client c;
    int64_t job;
    const jobspec *spec;
    volatile sig_atomic_t *stop;
    char dir[PATH_MAX];          /* scratch: downloaded checkpoints */
    model *m;
    const dataset *data;         /* the split evaluated on */
    const char *split;           /* "validation" or "test" */
    int64_t *done;               /* (n_done) checkpoint ids evaluated (by this or an earlier attempt) */
    int n_done, cap_done;
    report_sender snd;
} evaluator;

static int json_i64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 9007199254740992.0)) return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int is_done(const evaluator *e, int64_t id) {
    for (int i = 0; i < e->n_done; i++)
        if (e->done[i] == id) return 1;
    return 0;
}

static void mark_done(evaluator *e, int64_t id) {
    if (is_done(e, id)) return;
    if (e->n_done == e->cap_done) {
        e->cap_done = e->cap_done ? e->cap_done * 2 : 16;
        e->done = xrealloc(e->done, (size_t)e->cap_done * sizeof *e->done);
    }
    e->done[e->n_done++] = id;
}

/* GET path as JSON: 0 with *out (the caller deletes), 1 when the server
 * is away (a transport error or a 5xx: try again later), -1 with err on any
 * other answer. */
static int get_json(evaluator *e, const char *path, cJSON **out, char *err, size_t errlen) {
    *out = NULL;
    client_reply r;
    int rc = client_request(&e->c, "GET", path, NULL, 0, NULL, &r);
    if (rc < 0 || r.status >= 500 || r.status == 429) {
        client_reply_release(&r);
        return 1;
    }
    if (r.status != 200) {
        snprintf(err, errlen, "GET %s answered %ld: %.200s", path, r.status, r.body.data ? r.body.data : "");
        client_reply_release(&r);
        return -1;
    }
    *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    client_reply_release(&r);
    if (!*out) {
        snprintf(err, errlen, "GET %s: the answer is not JSON", path);
        return -1;
    }
    return 0;
}

/* The evaluator's sequence so far: *last_seq, and the checkpoints evaluated
 * already (a new attempt's evaluator does not evaluate them again). 0, or
 * -1 with err (a stop while the server is away included). */
static int read_done(evaluator *e, int64_t *last_seq, char *err, size_t errlen) {
    *last_seq = 0;
    int64_t since = 0, backoff = 0;
    for (;;) {
        char path[160];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?kind=eval&since=%lld&limit=1000", (long long)e->job,
                 (long long)since);
        cJSON *o = NULL;
        int rc = get_json(e, path, &o, err, errlen);
        if (rc < 0) return -1;
        if (rc > 0) {
            if (report_wait_retry(e->stop, &backoff) < 0) {
                snprintf(err, errlen, "stopped before the first evaluation");
                return -1;
            }
            continue;
        }
        backoff = 0;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "metrics"), *m;
        int64_t v, page_max = since;
        if (json_i64(cJSON_GetObjectItemCaseSensitive(o, "last_seq"), &v) == 0 && v > *last_seq) *last_seq = v;
        int n = cJSON_GetArraySize(arr);
        cJSON_ArrayForEach(m, arr) {
            if (json_i64(cJSON_GetObjectItemCaseSensitive(m, "seq"), &v) == 0 && v > page_max) page_max = v;
            if (json_i64(cJSON_GetObjectItemCaseSensitive(m, "checkpoint"), &v) == 0) mark_done(e, v);
        }
        cJSON_Delete(o);
        if (page_max > *last_seq) *last_seq = page_max;
        if (n == 0 || page_max <= since) return 0;
        since = page_max;
    }
}

/* The job's checkpoints, oldest first: their count (*out malloc'd), -2 when
 * the server is away, -1 with err. */
static int list_ckpts(evaluator *e, ev_ckpt **out, char *err, size_t errlen) {
    *out = NULL;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)e->job);
    cJSON *o = NULL;
    int rc = get_json(e, path, &o, err, errlen);
    if (rc != 0) return rc > 0 ? -2 : -1;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "checkpoints"), *k;
    int n = 0, cap = cJSON_GetArraySize(arr);
    *out = xcalloc((size_t)cap + 1, sizeof **out);
    cJSON_ArrayForEach(k, arr) {
        ev_ckpt c;
        int64_t id, step, epoch;
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(k, "sha256");
        if (json_i64(cJSON_GetObjectItemCaseSensitive(k, "id"), &id) < 0 ||
            json_i64(cJSON_GetObjectItemCaseSensitive(k, "step"), &step) < 0 ||
            json_i64(cJSON_GetObjectItemCaseSensitive(k, "epoch"), &epoch) < 0 || !cJSON_IsString(sha) ||
            strlen(sha->valuestring) != 64)
            continue;
        c.id = id;
        c.step = (long)step;
        c.epoch = (long)epoch;
        snprintf(c.sha, sizeof c.sha, "%s", sha->valuestring);
        /* the list is newest first: keep it oldest first */
        int at = n++;
        while (at > 0 && (*out)[at - 1].id > c.id) {
            (*out)[at] = (*out)[at - 1];
            at--;
        }
        (*out)[at] = c;
    }
    cJSON_Delete(o);
    return n;
}

/* Downloads and evaluates checkpoint k, queueing its eval metric: 0 done,
 * 1 gone (pruned meanwhile) or torn, -2 the server is away, -1 with err
 * (a checkpoint that does not fit the model: the evaluator fails). */
static int eval_one(evaluator *e, const ev_ckpt *k, char *err, size_t errlen) {
    char path[128], file[PATH_MAX + 64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)e->job, (long long)k->id);
    snprintf(file, sizeof file, "%s/ckpt-%lld.safetensors", e->dir, (long long)k->id);
    long st = 0;
    char sha_hdr[65] = "", sha_got[65] = "", derr[256] = "";
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 4096);
    long saved = e->c.timeout_ms;
    e->c.timeout_ms = 600000;
    int rc = client_download(&e->c, path, file, &st, sha_hdr, sha_got, NULL, 0, &size, &eb, derr, sizeof derr);
    e->c.timeout_ms = saved;
    buf_release(&eb);
    if (rc < 0 || st >= 500 || st == 429) {
        unlink(file);
        return -2;
    }
    if (st == 404 || st == 410) {
        log_info("checkpoint %lld is gone (pruned before it was evaluated)", (long long)k->id);
        return 1;
    }
    if (st != 200) {
        unlink(file);
        snprintf(err, errlen, "GET %s answered %ld", path, st);
        return -1;
    }
    if (strcasecmp(sha_got, k->sha) != 0) {
        unlink(file);
        log_warn("checkpoint %lld: sha256 %.16s... is not the listed %.16s...; fetching again", (long long)k->id,
                 sha_got, k->sha);
        return 1;
    }
    double t0 = mono_s();
    ckpt_meta meta;
    char cerr[ERR_MAX];
    rc = checkpoint_load(file, e->m, &meta, cerr);
    unlink(file);
    if (rc) {
        snprintf(err, errlen, "checkpoint %lld does not load into the spec's model: %s", (long long)k->id, cerr);
        return -1;
    }
    double loss = 0, acc = 0;
    model_evaluate(e->m, e->data->x, e->data->y, e->data->n, &loss, &acc);
    double secs = mono_s() - t0;
    log_info("checkpoint %lld (epoch %ld, step %ld): eval_loss %.4f, eval_accuracy %.4f on %ld %s examples (%.2f s)",
             (long long)k->id, k->epoch, k->step, loss, acc, e->data->n, e->split, secs);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "kind", "eval");
    cJSON_AddNumberToObject(m, "checkpoint", (double)k->id);
    cJSON_AddNumberToObject(m, "step", (double)k->step);
    cJSON_AddNumberToObject(m, "epoch", (double)k->epoch);
    cJSON_AddNumberToObject(m, "eval_loss", loss);
    cJSON_AddNumberToObject(m, "eval_accuracy", acc);
    cJSON_AddNumberToObject(m, "eval_examples", (double)e->data->n);
    cJSON_AddStringToObject(m, "split", e->split);
    cJSON_AddNumberToObject(m, "seconds", round(secs * 1000) / 1000);
    report_push(&e->snd, m);
    report_flush_soon(&e->snd);
    return 0;
}

/* Sleeps ms in 50 ms steps: 0, or -1 when a stop came. */
static int nap(volatile sig_atomic_t *stop, int ms) {
    for (int t = 0; t < ms && !*stop; t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return *stop ? -1 : 0;
}

/* One look at the list: evaluates what is new, oldest first. 1 when the
 * final checkpoint has been evaluated, 0 otherwise, -1 with err. */
static int round_once(evaluator *e, char *err, size_t errlen) {
    ev_ckpt *ks = NULL;
    int n = list_ckpts(e, &ks, err, errlen);
    if (n == -2) {
        free(ks);
        return 0;
    }
    if (n < 0) return -1;
    int final = 0;
    for (int i = 0; i < n && !*e->stop && !report_attempt_over(&e->snd); i++) {
        const ev_ckpt *k = &ks[i];
        int is_final = k->epoch >= e->spec->fit.epochs;
        if (is_done(e, k->id)) {
            final |= is_final;
            continue;
        }
        int rc = eval_one(e, k, err, errlen);
        if (rc == -1) {
            free(ks);
            return -1;
        }
        if (rc == -2) break; /* the server is away: the next round */
        if (rc == 0 || i < n - 1) mark_done(e, k->id); /* a gone one is not looked at again */
        final |= rc == 0 && is_final;
    }
    free(ks);
    return final;
}

/* After SIGTERM: when the newest checkpoint is the final one (the chief
 * finished), it first, then the others not evaluated yet, oldest first,
 * while mono_ms() < deadline_ms. A gang stopped before its end (cancel,
 * preemption, a failure) has no final checkpoint: nothing is evaluated.
 * 1 when the final checkpoint is evaluated, 0 when not, -1 with err. */
static int round_final(evaluator *e, int64_t deadline_ms, char *err, size_t errlen) {
    ev_ckpt *ks = NULL;
    int n = list_ckpts(e, &ks, err, errlen);
    if (n <= 0) {
        free(ks);
        return n == -1 ? -1 : 0;
    }
    const ev_ckpt *last = &ks[n - 1];
    int final = 0;
    if (last->epoch >= e->spec->fit.epochs) {
        int rc = is_done(e, last->id) ? 0 : eval_one(e, last, err, errlen);
        if (rc == -1) {
            free(ks);
            return -1;
        }
        if (rc == 0) {
            mark_done(e, last->id);
            final = 1;
        }
        for (int i = 0; final && i < n - 1 && mono_ms() < deadline_ms; i++) {
            if (is_done(e, ks[i].id)) continue;
            if (eval_one(e, &ks[i], err, errlen) == -1) {
                free(ks);
                return -1;
            }
            mark_done(e, ks[i].id);
        }
    }
    free(ks);
    return final;
}

int evaluator_run(const char *api, const char *token, int64_t job, int attempt, const jobspec *spec,
                  volatile sig_atomic_t *stop) {
    evaluator e;
    memset(&e, 0, sizeof e);
    e.job = job;
    e.spec = spec;
    e.stop = stop;
    char err[600] = "";
    int ret = WORKER_EXIT_FAILED, have_client = 0, loaded = 0;
    dataset_splits splits;
    memset(&splits, 0, sizeof splits);
    openblas_set_num_threads(1);

    /* the data: the validation split, else the source's test split */
    data_spec ds = spec->data;
    char data_path[PATH_MAX + JOBSPEC_PATH_MAX + 2];
    if (spec->data.path[0]) {
        if (data_path_confine(spec->data.path, getenv("TRAINYARD_DATA_ROOT"), data_path, sizeof data_path, err,
                              sizeof err) < 0)
            goto fail;
        if (sfmt(ds.path, sizeof ds.path, "%s", data_path) < 0) {
            snprintf(err, sizeof err, "data.path resolves to a path longer than %zu bytes", sizeof ds.path - 1);
            goto fail;
        }
    }
    char derr[ERR_MAX];
    if (dataset_load(&ds, &splits, derr)) {
        snprintf(err, sizeof err, "cannot load the job's data: %s", derr);
        goto fail;
    }
    loaded = 1;
    if (splits.val.n > 0) {
        e.data = &splits.val;
        e.split = "validation";
    } else if (splits.test.n > 0) {
        e.data = &splits.test;
        e.split = "test";
    } else {
        snprintf(err, sizeof err, "nothing to evaluate on: data.validation_split is 0 and data.source %s has no "
                 "test split", data_source_name(spec->data.source));
        goto fail;
    }
    char merr[ERR_MAX];
    int max_batch = spec->fit.batch_size > 0 && spec->fit.batch_size < 1024 ? spec->fit.batch_size : 1024;
    if (model_build(&e.m, spec, max_batch, spec->data.seed, merr)) {
        snprintf(err, sizeof err, "cannot build the model: %s", merr);
        goto fail;
    }
    const char *tmp = getenv("TMPDIR");
    if (sfmt(e.dir, sizeof e.dir, "%s/trainyard-eval%lld-XXXXXX", tmp && *tmp ? tmp : "/tmp", (long long)job) < 0 ||
        !mkdtemp(e.dir)) {
        snprintf(err, sizeof err, "cannot make a temporary directory: %s", strerror(errno));
        e.dir[0] = '\0';
        goto fail;
    }
    if (client_init(&e.c, api, token) < 0) {
        snprintf(err, sizeof err, "cannot make an HTTP client");
        goto fail;
    }
    have_client = 1;
    e.c.timeout_ms = 30000;
    int64_t last_seq = 0;
    if (read_done(&e, &last_seq, err, sizeof err) < 0) {
        if (*stop) {
            log_info("%s", err);
            ret = WORKER_EXIT_STOPPED;
            goto out;
        }
        goto fail;
    }
    if (report_start(&e.snd, api, token, job, last_seq + 1, NULL, NULL, NULL) < 0) {
        snprintf(err, sizeof err, "cannot start the sender thread");
        goto fail;
    }
    /* each batch says its attempt: once the job is at another (the gang
     * was requeued), the server refuses them and this evaluator is done */
    report_set_attempt(&e.snd, attempt);
    log_info("job %lld attempt %d: evaluating each new checkpoint on %ld %s examples (%d checkpoint(s) evaluated "
             "before)", (long long)job, attempt, e.data->n, e.split, e.n_done);

    int final = 0;
    while (!*stop && !report_attempt_over(&e.snd)) {
        final = round_once(&e, err, sizeof err);
        if (final < 0) goto fail;
        if (final) break;
        nap(stop, EVALUATOR_POLL_MS);
    }
    if (!final && !report_attempt_over(&e.snd)) {
        /* stopped: the chief finished (its final checkpoint is there) or the
         * gang is stopping (cancel, preemption, a failure): only the final
         * checkpoint is worth the agent's grace period (10 s to SIGKILL) */
        final = round_final(&e, mono_ms() + STOP_EVAL_MS, err, sizeof err);
        if (final < 0) goto fail;
    }
    if (report_drain(&e.snd, final && !*stop ? FINAL_FLUSH_S : STOP_FLUSH_S) < 0)
        log_warn("could not deliver every eval metric before exiting");
    if (report_attempt_over(&e.snd)) {
        /* its results are refused: the next attempt's evaluator evaluates
         * what this one could not record */
        log_info("attempt %d is over (the job was requeued): the evaluator stops", attempt);
        ret = WORKER_EXIT_STOPPED;
    } else if (final) {
        log_info("done: the final checkpoint is evaluated");
        ret = WORKER_EXIT_OK;
    } else {
        log_info("stopped by SIGTERM");
        ret = WORKER_EXIT_STOPPED;
    }
    goto out;
fail:
    fprintf(stderr, "trainyard worker: error: %s\n", err);
    fflush(stderr);
out:
    report_stop(&e.snd);
    if (have_client) client_release(&e.c);
    if (e.dir[0]) rmdir(e.dir);
    model_free(e.m);
    if (loaded) dataset_splits_free(&splits);
    free(e.done);
    return ret;
}
