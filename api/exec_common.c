/* exec_common.c - what the endpoints of running jobs share (see exec_common.h). */
#include "exec_common.h"
#include "../server/server.h"
#include "../storage/store.h"

#include <math.h>

/* Loads job `id` when the request's token may see it: 0, or -1 with the
 * answer (404 / 503) in res. */
static int job_scope(server *srv, http_req *req, http_res *res, int64_t id, int with_spec, exec_job *j) {
    int rc = exec_store_job_get(srv->db, id, with_spec, j);
    if (rc == STORE_OK) {
        if (j->deleted || /* DELETE /jobs/{id}: gone for everyone */
            (req->who.kind == TOKEN_TASK && req->who.job_id != id) ||
            (req->who.kind == TOKEN_TEAM && req->who.team_id != j->team_id)) {
            exec_store_job_release(j);
            rc = STORE_NOT_FOUND;
        }
    }
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return -1;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return -1;
    }
    return 0;
}

int64_t api_job_param(server *srv, http_req *req, http_res *res, int with_spec, exec_job *j) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return -1;
    if (job_scope(srv, req, res, id, with_spec, j) < 0) return -1;
    return id;
}

int api_json_int(const cJSON *v, long lo, long hi, long *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (d != floor(d) || d < (double)lo || d > (double)hi) return -1;
    *out = (long)d;
    return 0;
}
