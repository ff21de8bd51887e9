/* rendezvous_api.c - /jobs/{id}/rendezvous/{key}: a key-value store for the
 * tasks of one attempt of a job (addresses, ids of collectives), read with
 * a long-poll that a put of the same job wakes. Rows are
 * storage/exec_store.c. */
#include "rendezvous_api.h"
#include "exec_common.h"
#include "../server/server.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define RDV_VALUE_MAX (64 * 1024)

static int valid_key(const char *k) {
    size_t n = strlen(k);
    if (n < 1 || n > 100) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)k[i]) && k[i] != '-' && k[i] != '_' && k[i] != '.' && k[i] != ':') return 0;
    return 1;
}

static const char *rdv_key(http_req *req, http_res *res) {
    const char *k = req->nparams > 1 ? req->params[1] : "";
    if (!valid_key(k)) {
        http_error(res, 400, "invalid_value", "key", "a key is 1-100 characters of A-Z a-z 0-9 - _ . :");
        return NULL;
    }
    return k;
}

/* PUT /api/v1/jobs/{id}/rendezvous/{key} (body: the value, any bytes up to 64 KiB) */
static void rdv_put(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    const char *key = rdv_key(req, res);
    if (!key) return;
    if (req->body.len > RDV_VALUE_MAX) {
        http_error(res, 413, "too_large", NULL, "a rendezvous value is at most %d bytes", RDV_VALUE_MAX);
        return;
    }
    if (exec_store_rdv_put(srv->db, j.id, j.attempt, key, req->body.data ? req->body.data : "", req->body.len) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    http_wake(srv->http, HTTP_WAKE_RDV, j.id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddNumberToObject(o, "attempt", j.attempt);
    cJSON_AddNumberToObject(o, "size", (double)req->body.len);
    http_json(res, 200, o);
}

/* GET /api/v1/jobs/{id}/rendezvous/{key}?wait=S -> the value as stored
 * (404 when absent after waiting up to S seconds). */
static void rdv_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    const char *key = rdv_key(req, res);
    if (!key) return;
    long wait;
    if (http_query_long(req, res, "wait", 0, EXEC_WAIT_MAX_S, 0, &wait) < 0) return;
    if (req->calls == 0) req->keep[0] = mono_ms() + wait * 1000;
    char *v = NULL;
    size_t n = 0;
    int rc = exec_store_rdv_get(srv->db, j.id, j.attempt, key, &v, &n);
    if (rc == STORE_OK) {
        cJSON *probe = cJSON_ParseWithLength(v, n);
        http_text(res, 200, probe ? "application/json" : "application/octet-stream", v, n);
        cJSON_Delete(probe);
        free(v);
        return;
    }
    if (rc != STORE_NOT_FOUND) {
        http_db_unavailable(res);
        return;
    }
    if (mono_ms() >= req->keep[0] || srv->stopping) {
        http_error(res, 404, "not_found", "key", "no key '%s' in attempt %d of job %lld", key, j.attempt,
                   (long long)j.id);
        return;
    }
    /* look again in EXEC_POLL_MS, or at once when a key of this job is put */
    http_wait(req, res, EXEC_POLL_MS, HTTP_WAKE_RDV, j.id);
}

const route api_rendezvous_routes[] = {
    {"PUT", "/api/v1/jobs/{id}/rendezvous/{key}", rdv_put, ALLOW_TASK, RDV_VALUE_MAX, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/rendezvous/{key}", rdv_get, ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
