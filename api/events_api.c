/* events_api.c - a job's timeline, /jobs/{id}/events: read by users as JSON
 * or followed as server-sent events (its state changes and events, and its
 * metrics as they come), and written by the job's tasks (what happened on
 * their node: an image pull). Rows are storage/store.c (events) and
 * storage/exec_store.c (metrics). A team token sees its team's jobs only;
 * another job is a 404. */
#include "events_api.h"
#include "exec_common.h"
#include "../common/json_out.h"
#include "scheduling.h"
#include "../scheduler/lifecycle.h"
#include "../server/server.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the stream */

/* 1 when the request's Accept header asks for text/event-stream. */
static int wants_event_stream(http_req *req) {
    const char *a = http_header(req, "Accept");
    return a && strstr(a, "text/event-stream") != NULL;
}

typedef struct sse {
    server *srv;
    http_req *req;                /* lives as long as the stream */
    int64_t job;
    int64_t after_event;
    int64_t after_seq;
    buf out;                      /* formatted, not yet sent */
    size_t sent;                  /* of out */
    int64_t last_write_ms;
    int finishing;                /* job finished: end after flushing */
} sse;

/* Appends what happened since the last call; 1 when something was added. */
static int sse_fill(sse *s) {
    cJSON *ev = NULL, *ms = NULL;
    int64_t last_seq = 0;
    int added = 0;
    if (store_job_events(s->srv->db, s->job, s->after_event, 100, &ev) == STORE_OK) {
        cJSON *e;
        cJSON_ArrayForEach(e, ev) {
            s->after_event = (int64_t)cJSON_GetObjectItem(e, "id")->valuedouble;
            char *t = json_print(e, NULL);
            if (t) {
                const cJSON *kind = cJSON_GetObjectItem(e, "kind");
                buf_printf(&s->out, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)s->after_event,
                           cJSON_IsString(kind) && strcmp(kind->valuestring, "state") != 0 ? "event" : "state", t);
                free(t);
                added = 1;
            }
        }
        cJSON_Delete(ev);
    }
    if (exec_store_metrics_list(s->srv->db, s->job, s->after_seq, NULL, 200, &ms, &last_seq) == STORE_OK) {
        cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            s->after_seq = (int64_t)cJSON_GetObjectItem(m, "seq")->valuedouble;
            char *t = json_print(m, NULL);
            if (t) {
                buf_printf(&s->out, "event: metric\ndata: %s\n\n", t);
                free(t);
                added = 1;
            }
        }
        cJSON_Delete(ms);
    }
    if (!added) {
        char state[16];
        if (store_job_state(s->srv->db, s->job, state, NULL) == STORE_OK && store_is_terminal(state)) {
            /* one more look: an event may have landed between the two reads */
            cJSON *more = NULL;
            if (store_job_events(s->srv->db, s->job, s->after_event, 1, &more) == STORE_OK &&
                cJSON_GetArraySize(more) == 0)
                s->finishing = 1;
            cJSON_Delete(more);
        }
    }
    return added;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    sse *s = cls;
    for (;;) {
        if (s->sent < s->out.len) {
            size_t n = s->out.len - s->sent;
            if (n > max) n = max;
            memcpy(out, s->out.data + s->sent, n);
            s->sent += n;
            if (s->sent == s->out.len) {
                buf_reset(&s->out);
                s->sent = 0;
            }
            s->last_write_ms = mono_ms();
            return (ssize_t)n;
        }
        if (s->finishing || s->srv->stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (sse_fill(s)) continue;
        if (s->finishing) continue;
        if (mono_ms() - s->last_write_ms >= 15000) {
            buf_appends(&s->out, ": keep-alive\n\n");
            continue;
        }
        return http_stream_wait(s->req, EXEC_POLL_MS);
    }
}

static void sse_free(void *cls) {
    sse *s = cls;
    buf_release(&s->out);
    free(s);
}

/* Answers GET /jobs/{id}/events as server-sent events (the caller checked
 * the job exists and the token may see it): every job event after ?after=ID
 * (or Last-Event-ID) as `event: state`, and metrics with seq > ?since=SEQ
 * (default: only new ones) as `event: metric`; ends when the job is
 * finished and everything was sent, or when the server stops. */
static void events_stream(server *srv, http_req *req, http_res *res, int64_t job_id) {
    long after, since;
    const char *lei = http_header(req, "Last-Event-ID");
    if (http_query_long(req, res, "after", 0, (long)INT64_MAX, 0, &after) < 0) return;
    if (lei && parse_long(lei, 0, (long)INT64_MAX, &after) < 0) after = 0;
    int64_t last_seq = 0;
    if (!http_query(req, "since") && exec_store_metrics_list(srv->db, job_id, 0, NULL, 0, NULL, &last_seq) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    if (http_query_long(req, res, "since", 0, (long)INT64_MAX, (long)last_seq, &since) < 0) return;
    sse *s = xcalloc(1, sizeof *s);
    s->srv = srv;
    s->req = req;
    s->job = job_id;
    s->after_event = after;
    s->after_seq = since;
    buf_init(&s->out, 8u << 20);
    buf_appends(&s->out, "retry: 2000\n\n");
    s->last_write_ms = mono_ms();
    res->status = 200;
    res->content_type = "text/event-stream";
    res->stream = sse_read;
    res->stream_cls = s;
    res->stream_free = sse_free;
}

/* ---------------------------------------------------------------- reading and writing */

/* GET /api/v1/jobs/{id}/events?after=ID: the job's timeline (JSON). */
static void job_events(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char state[16];
    int64_t team = 0;
    int64_t scope = req->who.kind == TOKEN_ADMIN ? 0 : req->who.team_id; /* 0: all teams */
    int rc = store_job_state(srv->db, id, state, &team);
    if (rc == STORE_OK && scope && team != scope) rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return;
    }
    if (rc == STORE_OK && wants_event_stream(req)) {
        events_stream(srv, req, res, id);
        return;
    }
    long after, limit;
    if (http_query_long(req, res, "after", 0, (long)INT64_MAX, 0, &after) < 0) return;
    if (http_query_long(req, res, "limit", 1, 1000, 200, &limit) < 0) return;
    cJSON *arr = NULL;
    if (rc != STORE_OK || store_job_events(srv->db, id, after, (int)limit, &arr) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)id);
    cJSON_AddStringToObject(o, "state", state);
    cJSON_AddItemToObject(o, "events", arr);
    http_json(res, 200, o);
}

/* POST /api/v1/jobs/{id}/events {"kind", "message", "attempt"} (a task of
 * the job): what happened on its node that belongs on the job's timeline.
 * kind "image": a pull began or ended; "image_pull_failed": the image cannot
 * be had, so the attempt fails for good, without spending the restart
 * budget (another attempt would meet the same registry); "checkpoint_store":
 * checkpoint uploads to the blob store began failing (training goes on) or
 * reach it again, one event each way per spell (an event, no state change). */
static void events_post(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) goto out_job;
    const char *kind = NULL, *msg = NULL;
    long attempt = -1;
    for (const cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "kind") == 0 && cJSON_IsString(f)) kind = f->valuestring;
        else if (strcmp(f->string, "message") == 0 && cJSON_IsString(f)) msg = f->valuestring;
        else if (strcmp(f->string, "attempt") == 0 && cJSON_IsNumber(f)) attempt = (long)f->valuedouble;
        else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown or mistyped field '%s' (allowed: kind, message, attempt)", f->string);
            goto out;
        }
    }
    if (!kind || (strcmp(kind, "image") != 0 && strcmp(kind, "image_pull_failed") != 0 &&
                  strcmp(kind, "checkpoint_store") != 0)) {
        http_error(res, 422, kind ? "invalid_value" : "missing_field", "kind",
                   "kind must be \"image\", \"image_pull_failed\" or \"checkpoint_store\"");
        goto out;
    }
    if (!msg || !msg[0] || strlen(msg) > 1000) {
        http_error(res, 422, msg ? "invalid_value" : "missing_field", "message", "message must be 1 to 1000 bytes");
        goto out;
    }
    if (attempt < 1) {
        http_error(res, 422, "missing_field", "attempt", "attempt (the task's attempt, >= 1) is required");
        goto out;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    int rc;
    if (strcmp(kind, "image_pull_failed") == 0) {
        rc = lifecycle_job_fail_now(srv->db, j.id, (int)attempt, msg, actor);
        if (rc == STORE_OK) api_kick_scheduler(srv);
    } else {
        rc = attempt == j.attempt ? store_event_add(srv->db, j.id, kind, actor, msg) : STORE_CONFLICT;
    }
    if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", "attempt", "job %lld is %s at attempt %d: not attempt %ld", (long long)j.id,
                   j.state, j.attempt, attempt);
        goto out;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddStringToObject(o, "kind", kind);
    http_json(res, 200, o);
out:
    cJSON_Delete(body);
out_job:
    exec_store_job_release(&j);
}

const route api_events_routes[] = {
    {"GET", "/api/v1/jobs/{id}/events", job_events, ALLOW_USER, 0, ROLE_NONE},
    {"POST", "/api/v1/jobs/{id}/events", events_post, ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
