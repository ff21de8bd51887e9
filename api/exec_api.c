/* exec_api.c - shells into a job's tasks (see exec_api.h).
 *
 * A session's life: the client's handler makes it (the splice, the entry
 * for the agent), wakes the node's long-poll and parks (http_wait on
 * HTTP_WAKE_EXEC, the session's serial). The agent's poll takes the entry
 * (exec_api_take); its relay connects to the node route, which answers
 * side 1 of the splice and wakes the client's handler, which answers side
 * 0. Past EXEC_CONNECT_MS without the agent the client hears 504 and the
 * session goes; an agent that comes later hears 404. The table is this
 * process's memory: a restart ends every shell (their TCP connections end
 * with it). */
#include "exec_api.h"
#include "activity.h"
#include "exec_common.h"
#include "scope.h"
#include "../common/ws.h"
#include "../server/proxy.h"
#include "../server/server.h"
#include "../storage/store.h"

#include <ctype.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define EXEC_CONNECT_MS 10000      /* the agent's connection back */
#define EXEC_MAX_SESSIONS 256      /* sessions waiting for their agent at once */
#define EXEC_ARGV_MAX 64           /* command= values */
#define EXEC_ARG_MAX 4096          /* bytes of one */
#define EXEC_SUBPROTOCOL "trainyard.exec.v1"

typedef struct xsession {
    char id[33];                   /* hex, random: the agent's path */
    int64_t serial;                /* the client's wake id */
    int64_t job, task, node;
    char task_name[48];
    char actor[96];
    char what[160];                /* the command as the timeline shows it */
    cJSON *entry;                  /* for the agent, until taken (owned) */
    int agent_came, client_done;   /* client_done: answered (101 or an error) or gone */
    int64_t deadline;              /* mono ms */
    int64_t opened_ms;             /* wall ms of the client's 101 */
    server *srv;
    proxy_splice *sp;
    int refs;                      /* the table's, the splice's (until end) */
    /* the status frame, read as it passes (side 1 to side 0) */
    unsigned char hdr[14];
    size_t hdr_len, need;
    uint64_t left;
    int in_status, status_len;
    char status[256];
    int exit_code, have_exit;
    struct xsession *next;
} xsession;

/* a shell attached counts as activity for idle culling (api/activity.h) */
static void exec_touch(server *srv, int64_t job) { activity_touch(srv, job); }
static void exec_attach(server *srv, int64_t job, int delta) { activity_attach(srv, job, delta); }

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static xsession *g_sessions;
static int g_n;
static int64_t g_serial;

static void xs_release(xsession *s) {
    pthread_mutex_lock(&g_mu);
    int left = --s->refs;
    pthread_mutex_unlock(&g_mu);
    if (left) return;
    cJSON_Delete(s->entry);
    if (s->sp) proxy_splice_release(s->sp);
    free(s);
}

/* Off the table (under g_mu): no handler finds it any more. */
static void xs_unlink(xsession *s) {
    for (xsession **pp = &g_sessions; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            g_n--;
            s->refs--; /* the table's: the caller holds one of its own */
            return;
        }
}

static xsession *xs_by_serial(int64_t serial) {
    pthread_mutex_lock(&g_mu);
    xsession *s = g_sessions;
    while (s && s->serial != serial) s = s->next;
    if (s) s->refs++;
    pthread_mutex_unlock(&g_mu);
    return s;
}

cJSON *exec_api_take(int64_t node) {
    cJSON *arr = NULL;
    pthread_mutex_lock(&g_mu);
    for (xsession *s = g_sessions; s; s = s->next) {
        if (s->node != node || !s->entry || s->client_done) continue;
        if (!arr) arr = cJSON_CreateArray();
        if (!arr) abort();
        cJSON_AddItemToArray(arr, s->entry);
        s->entry = NULL;
    }
    pthread_mutex_unlock(&g_mu);
    return arr;
}

/* ---------------------------------------------------------------- the splice's hooks */

/* The frames the agent sends pass here: the status frame (binary, channel
 * 3, JSON) is kept for the timeline. Frames from the agent are not masked. */
static void xs_observe(void *cls, const char *data, size_t len) {
    xsession *s = cls;
    const unsigned char *p = (const unsigned char *)data;
    while (len) {
        if (s->left == 0 && s->need == 0) { /* a frame's head begins */
            s->hdr_len = 0;
            s->need = 2;
            s->in_status = -1;
        }
        if (s->need) {
            while (len && s->hdr_len < s->need) {
                s->hdr[s->hdr_len++] = *p++;
                len--;
            }
            if (s->hdr_len < s->need) return;
            unsigned l7 = s->hdr[1] & 0x7f;
            size_t full = 2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0) + ((s->hdr[1] & 0x80) ? 4 : 0);
            if (s->need < full) {
                s->need = full;
                continue;
            }
            uint64_t n = l7;
            if (l7 == 126) n = ((uint64_t)s->hdr[2] << 8) | s->hdr[3];
            if (l7 == 127) {
                n = 0;
                for (int i = 0; i < 8; i++) n = (n << 8) | s->hdr[2 + i];
            }
            s->need = 0;
            s->left = n;
            s->in_status = (s->hdr[0] & 0x0f) == 2 ? -1 : 0; /* binary: the channel byte tells */
            s->status_len = 0;
            if (n == 0) continue;
        }
        size_t k = len < s->left ? len : (size_t)s->left;
        for (size_t i = 0; i < k; i++) {
            if (s->in_status == -1) s->in_status = p[i] == 3 ? 1 : 0;
            else if (s->in_status == 1 && s->status_len < (int)sizeof s->status - 1) s->status[s->status_len++] = (char)p[i];
        }
        p += k;
        len -= k;
        s->left -= k;
        if (s->left == 0 && s->in_status == 1) {
            s->status[s->status_len] = '\0';
            cJSON *o = cJSON_Parse(s->status);
            const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "exit") : NULL;
            if (cJSON_IsNumber(e)) {
                s->exit_code = e->valueint;
                s->have_exit = 1;
            }
            cJSON_Delete(o);
            s->in_status = 0;
        }
    }
}

static void xs_activity(void *cls) {
    xsession *s = cls;
    exec_touch(s->srv, s->job);
}

static void xs_end(void *cls) {
    xsession *s = cls;
    pthread_mutex_lock(&g_mu);
    xs_unlink(s); /* gone from the table when it was still there */
    s->refs++;
    int opened = s->opened_ms != 0;
    pthread_mutex_unlock(&g_mu);
    if (opened) {
        exec_attach(s->srv, s->job, -1);
        char why[320];
        long secs = (long)((now_ms() - s->opened_ms + 500) / 1000);
        if (s->have_exit)
            snprintf(why, sizeof why, "shell in %s ended: exit %d after %ld s (%s)", s->task_name, s->exit_code, secs,
                     s->what);
        else
            snprintf(why, sizeof why, "shell in %s closed after %ld s before the command ended (%s)", s->task_name,
                     secs, s->what);
        if (store_event_add(s->srv->db, s->job, "shell", s->actor, why) != STORE_OK)
            log_warn("exec: job %lld: cannot write the shell's end to the timeline", (long long)s->job);
    }
    xs_release(s); /* the one taken above */
    xs_release(s); /* the splice's */
}

static const proxy_splice_ops g_ops = {xs_observe, xs_activity, xs_end};

/* ---------------------------------------------------------------- the client's route */

/* The command= values of the query, in order, as a JSON array. -1 after
 * answering 400 when one is too long or there are too many. */
typedef struct argv_acc {
    cJSON *arr;
    int n, bad;
} argv_acc;

static enum MHD_Result argv_each(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    argv_acc *a = cls;
    if (strcmp(key, "command") != 0) return MHD_YES;
    if (!value || ++a->n > EXEC_ARGV_MAX || strlen(value) > EXEC_ARG_MAX) {
        a->bad = 1;
        return MHD_NO;
    }
    cJSON_AddItemToArray(a->arr, cJSON_CreateString(value));
    return MHD_YES;
}

/* The task named (its "name", or its id in digits) among the job's current
 * attempt's: its row (owned), or NULL after answering. */
static cJSON *find_task(server *srv, http_res *res, const exec_job *j, const char *want) {
    cJSON *tasks = NULL;
    if (exec_store_job_tasks(srv->db, j->id, j->attempt, &tasks) != STORE_OK) {
        http_db_unavailable(res);
        return NULL;
    }
    char names[512] = "";
    size_t off = 0;
    cJSON *t, *found = NULL;
    cJSON_ArrayForEach(t, tasks) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
        char idtxt[24];
        snprintf(idtxt, sizeof idtxt, "%lld", cJSON_IsNumber(id) ? (long long)id->valuedouble : -1LL);
        if ((cJSON_IsString(name) && strcmp(name->valuestring, want) == 0) || strcmp(idtxt, want) == 0) found = t;
        if (cJSON_IsString(name) && off < sizeof names - 64) {
            int n = snprintf(names + off, sizeof names - off, "%s%s", off ? ", " : "", name->valuestring);
            if (n > 0) off += (size_t)n;
        }
    }
    if (!found) {
        http_error(res, 404, "not_found", "task", "job %lld has no task '%.64s' in attempt %d (its tasks: %s)",
                   (long long)j->id, want, j->attempt, names[0] ? names : "none");
        cJSON_Delete(tasks);
        return NULL;
    }
    cJSON *row = cJSON_DetachItemViaPointer(tasks, found);
    cJSON_Delete(tasks);
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(row, "state");
    if (!cJSON_IsString(state) || strcmp(state->valuestring, "running") != 0) {
        http_error(res, 409, "conflict", "task", "task %.64s of job %lld is %s, not running: a shell needs a running task",
                   want, (long long)j->id, cJSON_IsString(state) ? state->valuestring : "unknown");
        cJSON_Delete(row);
        return NULL;
    }
    return row;
}

static int term_ok(const char *t) {
    size_t n = strlen(t);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && !strchr("._+-", t[i])) return 0;
    return 1;
}

/* The first run: checks, then the session; 0 with *out (a reference of
 * the caller's), or -1 after answering. */
static int exec_open(server *srv, http_req *req, http_res *res, xsession **out) {
    exec_job j;
    int64_t id = api_job_param(srv, req, res, 0, &j);
    if (id < 0) return -1;
    exec_store_job_release(&j);
    if (api_own_or_admin(srv->db, req, res, 0, id) < 0) return -1;
    const char *up = http_header(req, "Upgrade"), *key = http_header(req, "Sec-WebSocket-Key");
    const char *ver = http_header(req, "Sec-WebSocket-Version");
    if (!up || strcasecmp(up, "websocket") != 0 || !key || strlen(key) != 24) {
        http_error(res, 400, "bad_request", "Upgrade",
                   "a shell is a WebSocket: send Upgrade: websocket with a Sec-WebSocket-Key (trainyard shell does)");
        return -1;
    }
    if (!ver || strcmp(ver, "13") != 0) {
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Sec-WebSocket-Version");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "13");
        http_error(res, 426, "upgrade_required", "Sec-WebSocket-Version", "WebSocket version 13 only");
        return -1;
    }
    long tty, cols, rows;
    if (http_query_long(req, res, "tty", 0, 1, 0, &tty) < 0 || http_query_long(req, res, "cols", 1, 1000, 80, &cols) < 0 ||
        http_query_long(req, res, "rows", 1, 1000, 24, &rows) < 0)
        return -1;
    const char *term = http_query(req, "term");
    if (!term) term = "xterm-256color";
    if (!term_ok(term)) {
        http_error(res, 400, "bad_request", "term", "term must be 1 to 64 letters, digits, '.', '_', '+' or '-'");
        return -1;
    }
    argv_acc acc = {cJSON_CreateArray(), 0, 0};
    if (!acc.arr) abort();
    MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, argv_each, &acc);
    if (acc.bad) {
        cJSON_Delete(acc.arr);
        http_error(res, 400, "bad_request", "command", "a command has at most %d arguments of %d bytes each",
                   EXEC_ARGV_MAX, EXEC_ARG_MAX);
        return -1;
    }
    if (exec_store_job_get(srv->db, id, 0, &j) != STORE_OK) {
        cJSON_Delete(acc.arr);
        http_db_unavailable(res);
        return -1;
    }
    cJSON *row = find_task(srv, res, &j, req->params[1]);
    exec_store_job_release(&j);
    if (!row) {
        cJSON_Delete(acc.arr);
        return -1;
    }
    xsession *s = xcalloc(1, sizeof *s);
    char rnd[48];
    if (random_token(rnd, sizeof rnd) < 0) {
        free(s);
        cJSON_Delete(acc.arr);
        cJSON_Delete(row);
        http_error(res, 503, "unavailable", NULL, "no randomness for the session; retry");
        return -1;
    }
    char hex[65];
    sha256_hex(rnd, strlen(rnd), hex); /* 128 of its bits, in hex: the agent's path */
    memcpy(s->id, hex, 32);
    s->id[32] = '\0';
    explicit_bzero(rnd, sizeof rnd);
    s->srv = srv;
    s->job = id;
    s->task = (int64_t)cJSON_GetObjectItemCaseSensitive(row, "id")->valuedouble;
    s->node = (int64_t)cJSON_GetObjectItemCaseSensitive(row, "node_id")->valuedouble;
    snprintf(s->task_name, sizeof s->task_name, "%s", cJSON_GetObjectItemCaseSensitive(row, "name")->valuestring);
    cJSON_Delete(row);
    http_actor(req, s->actor, sizeof s->actor);
    size_t off = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, acc.arr) {
        int n = snprintf(s->what + off, sizeof s->what - off, "%s%s", off ? " " : "", a->valuestring);
        if (n < 0 || (size_t)n >= sizeof s->what - off) {
            snprintf(s->what + sizeof s->what - 4, 4, "...");
            break;
        }
        off += (size_t)n;
    }
    if (!off) snprintf(s->what, sizeof s->what, "a login shell");
    s->entry = cJSON_CreateObject();
    if (!s->entry) abort();
    cJSON_AddStringToObject(s->entry, "session", s->id);
    cJSON_AddNumberToObject(s->entry, "task", (double)s->task);
    cJSON_AddItemToObject(s->entry, "command", acc.arr);
    cJSON_AddBoolToObject(s->entry, "tty", tty != 0);
    cJSON_AddNumberToObject(s->entry, "cols", (double)cols);
    cJSON_AddNumberToObject(s->entry, "rows", (double)rows);
    cJSON_AddStringToObject(s->entry, "term", term);
    cJSON_AddStringToObject(s->entry, "user", s->actor);
    s->deadline = mono_ms() + EXEC_CONNECT_MS;
    s->sp = proxy_splice_new(&g_ops, s);
    if (!s->sp) {
        cJSON_Delete(s->entry);
        free(s);
        http_error(res, 503, "unavailable", NULL, "too many connections through the server at once; retry");
        return -1;
    }
    pthread_mutex_lock(&g_mu);
    if (g_n >= EXEC_MAX_SESSIONS) {
        pthread_mutex_unlock(&g_mu);
        proxy_splice_release(s->sp);
        cJSON_Delete(s->entry);
        free(s);
        http_error(res, 503, "unavailable", NULL, "%d shells are being opened at once; retry", EXEC_MAX_SESSIONS);
        return -1;
    }
    s->serial = ++g_serial;
    s->refs = 3; /* the table's, the splice's (xs_end), the caller's */
    s->next = g_sessions;
    g_sessions = s;
    g_n++;
    pthread_mutex_unlock(&g_mu);
    *out = s;
    return 0;
}

/* The client gave up or was refused: the session goes (an agent that comes
 * now hears 404; one already there is closed with the splice). */
static void exec_give_up(xsession *s) {
    pthread_mutex_lock(&g_mu);
    s->client_done = 1;
    pthread_mutex_unlock(&g_mu);
    proxy_splice_abandon(s->sp, 0);
}

/* GET /api/v1/jobs/{id}/tasks/{task}/exec */
static void task_exec(server *srv, http_req *req, http_res *res) {
    xsession *s = NULL;
    if (req->calls == 0) {
        if (exec_open(srv, req, res, &s) < 0) return;
        req->keep[0] = s->serial;
        http_wake(srv->http, HTTP_WAKE_NODE, s->node);
    } else if (!(s = xs_by_serial(req->keep[0]))) { /* cannot be: the client holds it */
        http_error(res, 500, "internal", NULL, "the shell's session is gone");
        return;
    }
    http_wait_watch(req, HTTP_WAKE_EXEC, s->serial);
    pthread_mutex_lock(&g_mu);
    int came = s->agent_came;
    pthread_mutex_unlock(&g_mu);
    if (came) {
        char accept[29], h_accept[96];
        const char *proto = http_header(req, "Sec-WebSocket-Protocol");
        const char *hdrs[5] = {"Upgrade: websocket", "Connection: Upgrade", h_accept, NULL, NULL};
        if (proto && strstr(proto, EXEC_SUBPROTOCOL)) hdrs[3] = "Sec-WebSocket-Protocol: " EXEC_SUBPROTOCOL;
        if (ws_accept_key(http_header(req, "Sec-WebSocket-Key"), accept) < 0 ||
            snprintf(h_accept, sizeof h_accept, "Sec-WebSocket-Accept: %s", accept) < 0 ||
            proxy_splice_answer(s->sp, 0, req, res, hdrs) < 0) {
            exec_give_up(s);
            http_error(res, 500, "internal", NULL, "cannot answer the WebSocket");
        } else {
            pthread_mutex_lock(&g_mu);
            s->client_done = 1;
            s->opened_ms = now_ms();
            pthread_mutex_unlock(&g_mu);
            exec_attach(srv, s->job, 1);
            http_audit_read(req);
            char why[320];
            snprintf(why, sizeof why, "shell in %s opened: %s", s->task_name, s->what);
            if (store_event_add(srv->db, s->job, "shell", s->actor, why) != STORE_OK)
                log_warn("exec: job %lld: cannot write the shell to the timeline", (long long)s->job);
        }
        xs_release(s);
        return;
    }
    int64_t left = s->deadline - mono_ms();
    if (left <= 0 || srv->stopping) {
        exec_give_up(s);
        if (srv->stopping) http_error(res, 503, "unavailable", NULL, "the server is stopping; retry");
        else
            http_error(res, 504, "gateway_timeout", "task",
                       "the agent of node %lld did not take the shell within %d s (is it running?)", (long long)s->node,
                       EXEC_CONNECT_MS / 1000);
        xs_release(s);
        return;
    }
    xs_release(s);
    http_wait(req, res, left < INT_MAX ? (int)left : INT_MAX, HTTP_WAKE_EXEC, req->keep[0]);
}

/* GET /api/v1/nodes/{node}/exec/{session}: the agent's side */
static void node_exec(server *srv, http_req *req, http_res *res) {
    int64_t node = http_param_id(req, res, 0, "node");
    if (node < 0) return;
    if (api_node_scope(req, res, node) < 0) return;
    const char *up = http_header(req, "Upgrade");
    if (!up || strcasecmp(up, "trainyard-exec") != 0) {
        http_error(res, 400, "bad_request", "Upgrade", "the agent's side of a shell sends Upgrade: trainyard-exec");
        return;
    }
    pthread_mutex_lock(&g_mu);
    xsession *s = g_sessions;
    while (s && strcmp(s->id, req->params[1]) != 0) s = s->next;
    int code = !s ? 404 : s->node != node ? 403 : s->client_done || mono_ms() > s->deadline ? 404 : s->agent_came ? 409 : 0;
    if (!code) {
        s->agent_came = 1;
        s->refs++;
    }
    pthread_mutex_unlock(&g_mu);
    if (code == 403) {
        http_error(res, 403, "forbidden", "session", "the session is another node's");
        return;
    }
    if (code) {
        http_error(res, code, code == 409 ? "conflict" : "not_found", "session",
                   code == 409 ? "the session has its agent already" : "no such session (the client gave up)");
        return;
    }
    static const char *const hdrs[] = {"Upgrade: trainyard-exec", "Connection: Upgrade", NULL};
    if (proxy_splice_answer(s->sp, 1, req, res, hdrs) < 0)
        http_error(res, 500, "internal", NULL, "cannot answer the upgrade");
    http_wake(srv->http, HTTP_WAKE_EXEC, s->serial);
    xs_release(s);
}

const route api_exec_routes[] = {
    {"GET", "/api/v1/jobs/{id}/tasks/{task}/exec", task_exec, ALLOW_USER, 0, ROLE_MEMBER},
    {"GET", "/api/v1/nodes/{id}/exec/{session}", node_exec, ALLOW_NODE | ALLOW_ADMIN, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
