/* tasks_api.c - POST /tasks/{id}/status: an agent reports that its task
 * runs or has exited (docs/api-executors.md). What the report means for the
 * task's job is scheduler/lifecycle.c. A node's token reports only for the
 * tasks on its own node (scope.h). */
#include "tasks_api.h"
#include "exec_common.h"
#include "scheduling.h"
#include "scope.h"
#include "sweeps_api.h"
#include "../scheduler/lifecycle.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/cluster.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"

#include <stdio.h>
#include <string.h>

/* A running report's "ports": {"tensorboard": 41234, ...}, the ports of
 * its node the agent gave the task (docs/api-executors.md): at most 8, each
 * a port name (spec/jobspec.h) and 1-65535. 0, or -1 with the 422 made. */
static int parse_ports(const cJSON *f, lifecycle_ports *out, http_res *res) {
    if (!cJSON_IsObject(f)) {
        http_error(res, 422, "invalid_type", "ports",
                   "ports must be an object of name: port, e.g. {\"tensorboard\": 41234}");
        return -1;
    }
    out->n = 0;
    for (const cJSON *p = f->child; p; p = p->next) {
        char field[64];
        snprintf(field, sizeof field, "ports.%.40s", p->string);
        if (out->n == 8) {
            http_error(res, 422, "invalid_value", "ports", "ports may name at most 8 ports");
            return -1;
        }
        if (!jobspec_port_name_ok(p->string)) {
            http_error(res, 422, "invalid_value", field,
                       "a port's name is 1 to 32 of a-z, 0-9, '-' and '_', starting with a letter");
            return -1;
        }
        long port = 0;
        if (api_json_int(p, 1, 65535, &port) < 0) {
            http_error(res, 422, "invalid_value", field, "a port must be an integer between 1 and 65535");
            return -1;
        }
        for (int i = 0; i < out->n; i++)
            if (strcmp(out->names[i], p->string) == 0) {
                http_error(res, 422, "invalid_value", field, "port '%s' is given twice", p->string);
                return -1;
            }
        snprintf(out->names[out->n], sizeof out->names[out->n], "%s", p->string);
        out->ports[out->n++] = (int)port;
    }
    return 0;
}

/* POST /api/v1/tasks/{id}/status {"state":"running"[,"ports":{"name":port}]} |
 * {"state":"exited","exit_code":N,"signal":S,"reason":"...","log_tail":"..."} */
static void task_status(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "task");
    if (id < 0) return;
    if (req->who.kind == TOKEN_NODE) {
        int64_t on = 0;
        int rc = cluster_task_node(srv->db, id, &on);
        if (rc < 0) {
            http_db_unavailable(res);
            return;
        }
        if (rc == 0 && api_node_scope(req, res, on) < 0) return;
    }
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *state = NULL, *reason = NULL, *tail = NULL;
    long code = 0, sig = 0;
    int has_code = 0, has_ports = 0;
    lifecycle_ports ports;
    memset(&ports, 0, sizeof ports);
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "state") == 0) {
            if (!cJSON_IsString(f) || (strcmp(f->valuestring, "running") != 0 && strcmp(f->valuestring, "exited") != 0)) {
                http_error(res, 422, "invalid_value", "state", "state must be 'running' or 'exited'");
                goto out;
            }
            state = f->valuestring;
        } else if (strcmp(f->string, "exit_code") == 0) {
            if (api_json_int(f, -255, 255, &code) < 0) {
                http_error(res, 422, "invalid_value", "exit_code", "exit_code must be an integer between -255 and 255");
                goto out;
            }
            has_code = 1;
        } else if (strcmp(f->string, "signal") == 0) {
            if (api_json_int(f, 0, 128, &sig) < 0) {
                http_error(res, 422, "invalid_value", "signal", "signal must be an integer between 0 and 128");
                goto out;
            }
        } else if (strcmp(f->string, "reason") == 0) {
            if (!cJSON_IsString(f) || strlen(f->valuestring) > 1000) {
                http_error(res, 422, "invalid_type", "reason", "reason must be a string of at most 1000 characters");
                goto out;
            }
            reason = f->valuestring;
        } else if (strcmp(f->string, "log_tail") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "log_tail", "log_tail must be a string");
                goto out;
            }
            tail = f->valuestring;
            size_t n = strlen(tail);
            if (n > 2000) tail += n - 2000; /* the last lines are what matter */
        } else if (strcmp(f->string, "ports") == 0) {
            if (parse_ports(f, &ports, res) < 0) goto out;
            has_ports = 1;
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: state, exit_code, signal, reason, log_tail, ports)", f->string);
            goto out;
        }
    }
    if (!state) {
        http_error(res, 422, "missing_field", "state", "state is required ('running' or 'exited')");
        goto out;
    }
    if (has_ports && strcmp(state, "running") != 0) {
        http_error(res, 422, "invalid_value", "ports", "ports come with the running report, not with an exit");
        goto out;
    }
    if (strcmp(state, "exited") == 0 && !has_code && !sig) {
        http_error(res, 422, "missing_field", "exit_code", "an exited task needs exit_code (or signal)");
        goto out;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    int flags = 0, rc;
    if (strcmp(state, "running") == 0) {
        rc = lifecycle_task_running(srv->db, id, has_ports ? &ports : NULL, actor, &flags);
    } else {
        lifecycle_exit e = {.exit_code = has_code ? (int)code : 128 + (int)sig,
                            .signal = (int)sig, .reason = reason, .log_tail = tail};
        rc = lifecycle_task_exited(srv->db, id, &e, actor, &flags);
    }
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no task %lld", (long long)id);
        goto out;
    }
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", "state", "task %lld has already exited", (long long)id);
        goto out;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    if (flags) api_kick_scheduler(srv);
    if (flags & LC_JOB_CHANGED) api_sweeps_kick(); /* a trial's job may have ended: decide now */
    exec_task t;
    cJSON *o = cJSON_CreateObject();
    if (exec_store_task_get(srv->db, id, &t) == STORE_OK) {
        cJSON_AddNumberToObject(o, "task", (double)t.id);
        cJSON_AddNumberToObject(o, "job", (double)t.job_id);
        cJSON_AddStringToObject(o, "state", t.state);
    }
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
}

const route api_tasks_routes[] = {
    {"POST", "/api/v1/tasks/{id}/status", task_status, ALLOW_NODE | ALLOW_ADMIN, 64 * 1024, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
