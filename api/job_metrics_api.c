/* job_metrics_api.c - /jobs/{id}/metrics: what a job's chief (and its
 * evaluator) report as it trains, stored once per seq and fenced by
 * attempt, and read back by users; each post that adds a metric recomputes
 * the job's progress (step, epoch, throughput, ETA) shown by GET /jobs/{id}.
 * Rows are storage/exec_store.c. (GET /metrics, the service's Prometheus
 * families, is metrics_api.c.) */
#include "job_metrics_api.h"
#include "exec_common.h"
#include "../common/json_out.h"
#include "../spec/jobspec.h"
#include "../server/server.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX 5000 /* metrics per POST */

/* step, epoch, test: the chief's sequence; eval: the evaluator's, a
 * sequence of its own (storage/exec_store.h). */
static int valid_kind(const char *k) {
    return strcmp(k, "step") == 0 || strcmp(k, "epoch") == 0 || strcmp(k, "test") == 0 ||
           strcmp(k, "eval") == 0;
}

/* ---------------------------------------------------------------- progress */

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
    if (exec_store_metric_latest(srv->db, j->id, "step", &step) != STORE_OK ||
        exec_store_metric_latest(srv->db, j->id, "epoch", &epoch) != STORE_OK ||
        exec_store_metric_latest(srv->db, j->id, "test", &test) != STORE_OK ||
        exec_store_metric_latest(srv->db, j->id, "eval", &eval) != STORE_OK) {
        cJSON_Delete(step);
        cJSON_Delete(epoch);
        cJSON_Delete(test);
        cJSON_Delete(eval);
        return STORE_ERROR;
    }
    int ep_n = 0;
    double ep_samples = 0, ep_secs = 0;
    if (exec_store_epoch_throughput(srv->db, j->id, &ep_n, &ep_samples, &ep_secs) != STORE_OK) {
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
    int rc = exec_store_progress_set(srv->db, j->id, s);
    free(s);
    return rc;
}

/* ---------------------------------------------------------------- posts and reads */

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
    if (api_json_int(f, 1, (1L << 53), &v) < 0) {
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
        if (api_json_int(f, 0, (1L << 53), &v) < 0) {
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
    if (api_job_param(srv, req, res, 1, &j) < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) goto out_job;
    cJSON *arr = NULL;
    long sender_attempt = 0; /* 0: not said (clients older than the field) */
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "attempt") == 0) {
            if (api_json_int(f, 1, INT32_MAX, &sender_attempt) < 0) {
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
        http_db_unavailable(res);
        goto out;
    }
    /* a report of an earlier attempt (a worker of a gang already requeued,
     * still flushing) is refused in the same transaction that would store
     * it: the next attempt's chief read the metrics after the requeue, so
     * what it found is all it must not report again */
    int current = 0;
    int rc = exec_store_job_attempt(srv->db, j.id, &current);
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
        rc = exec_store_metric_add(srv->db, j.id, seq, current, kind, hs ? &step : NULL, he ? &epoch : NULL, data, &ins);
        free(data);
        added += ins;
    }
    if (rc == STORE_OK && added) rc = progress_update(srv, &j);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        http_db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "acked", (double)last);
    cJSON_AddNumberToObject(o, "stored", added);
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
out_job:
    exec_store_job_release(&j);
}

/* GET /api/v1/jobs/{id}/metrics?since=SEQ&kind=&limit=&last=1 */
static void metrics_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
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
        rc = exec_store_metric_latest(srv->db, j.id, kind, &m);
        if (rc == STORE_OK) rc = exec_store_metrics_list(srv->db, j.id, 0, kind, 0, NULL, &last_seq);
        arr = cJSON_CreateArray();
        if (m) cJSON_AddItemToArray(arr, m);
    } else {
        rc = exec_store_metrics_list(srv->db, j.id, since, kind, (int)limit, &arr, &last_seq);
    }
    if (rc != STORE_OK) {
        cJSON_Delete(arr);
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddItemToObject(o, "metrics", arr);
    cJSON_AddNumberToObject(o, "last_seq", (double)last_seq);
    http_json(res, 200, o);
}

const route api_job_metrics_routes[] = {
    {"POST", "/api/v1/jobs/{id}/metrics", metrics_post, ALLOW_TASK, 8u << 20, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/metrics", metrics_get, ALLOW_USER | ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
