/* proxy_api.c - a job's web ports through the server (see proxy_api.h). */
#include "proxy_api.h"
#include "activity.h"
#include "../server/proxy.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/ports_store.h"
#include "../storage/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROXY_BODY_MAX (64u << 20)          /* a body going up to an app (a notebook saved with its
                                             * images): read whole by the daemon first, then sent */



/* The job of the path, if req's team may see it: 0, or -1 after answering 404. */
static int job_visible(server *srv, http_req *req, http_res *res, int64_t id, char state[16]) {
    int64_t team = 0;
    int rc = store_job_state(srv->db, id, state, &team);
    if (rc == STORE_OK && req->who.kind != TOKEN_ADMIN && team != req->who.team_id) rc = STORE_NOT_FOUND;
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

/* ANY /proxy/jobs/{id}/{name}/{rest*} */
static void proxy_job(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char state[16];
    if (job_visible(srv, req, res, id, state) < 0) return;
    const char *name = req->params[1];
    /* a WebSocket into an app (a kernel, a terminal) acts: a member's */
    const char *upg = http_header(req, "Upgrade");
    if (upg && req->who.kind == TOKEN_USER && req->who.role < ROLE_MEMBER) {
        http_error(res, 403, "forbidden", "role", "a WebSocket into job %lld's apps needs the member role; %s is a viewer",
                   (long long)id, req->who.user);
        return;
    }
    char have[512];
    ports_hit hit;
    int rc = ports_store_find_hit(srv->db, id, name, &hit, have, sizeof have);
    if (rc == STORE_ERROR) {
        http_db_unavailable(res);
        return;
    }
    if (rc != STORE_OK) {
        int declared = 0;
        for (const char *p = have; *p;) { /* is name among the declared ones? */
            size_t n = strcspn(p, ",");
            if (n == strlen(name) && strncmp(p, name, n) == 0) declared = 1;
            p += n + (p[n] == ',');
        }
        if (declared)
            http_error(res, 404, "not_found", "name",
                       "job %lld's port '%s' is not served now: the job is %s and no task of it reported the port",
                       (long long)id, name, state);
        else if (have[0])
            http_error(res, 404, "not_found", "name", "job %lld has no port '%s' (its ports: %s)", (long long)id, name,
                       have);
        else
            http_error(res, 404, "not_found", "name", "job %lld has no port '%s': it declares none (\"ports\")",
                       (long long)id, name);
        return;
    }
    char prefix[192];
    snprintf(prefix, sizeof prefix, "/proxy/jobs/%lld/%s", (long long)id, name);
    proxy_target t;
    memset(&t, 0, sizeof t);
    t.host = hit.host;
    t.port = hit.port;
    t.prefix = prefix;
    /* a notebook job's Jupyter is let in with the token its worker gave it
     * (derived from the task's token; the caller's own credentials are
     * dropped by the proxy and the user never sees this one) */
    char auth[96];
    const char *add[] = {auth, NULL};
    if (hit.notebook && strcmp(name, "notebook") == 0 && hit.token_hash[0]) {
        char secret[65];
        jobspec_notebook_secret(hit.token_hash, secret);
        snprintf(auth, sizeof auth, "Authorization: token %s", secret);
        t.add = add;
    }
    activity_proxy_begin(srv, id, &t); /* a request, and the bytes of its relay, keep the job from idling */
    proxy_forward(req, res, &t);
    activity_proxy_end();
}

/* GET /proxy/jobs/{id}/{name}: the app's root is the path with its slash */
static void proxy_job_slash(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char state[16];
    if (job_visible(srv, req, res, id, state) < 0) return;
    snprintf(res->location, sizeof res->location, "/proxy/jobs/%lld/%s/", (long long)id, req->params[1]);
    http_text(res, 308, "text/plain; charset=utf-8", "", 0);
}

/* POST /api/v1/jobs/{id}/proxy-session: a one-time ticket that gives a
 * browser tab a cookie for the job's ports with this request's credential
 * (http_grant_ticket), and the origin they are served at */
static void proxy_session(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    char state[16];
    if (job_visible(srv, req, res, id, state) < 0) return;
    char prefix[64], ticket[48];
    snprintf(prefix, sizeof prefix, "/proxy/jobs/%lld/", (long long)id);
    if (http_grant_ticket(req, prefix, (int64_t)HTTP_GRANT_MAX_AGE_S * 1000, ticket) < 0) {
        http_error(res, 400, "bad_request", "Authorization", "no credential to stand for");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) abort();
    cJSON_AddStringToObject(o, "ticket", ticket);
    cJSON_AddStringToObject(o, "param", HTTP_GRANT_PARAM);
    cJSON_AddStringToObject(o, "apps_url", srv->apps_url);
    cJSON_AddStringToObject(o, "prefix", prefix);
    cJSON_AddNumberToObject(o, "expires_in_s", 60);
    explicit_bzero(ticket, sizeof ticket);
    http_json(res, 201, o);
}

#define PROXY_ROUTES                                                                                      \
    {"*", "/proxy/jobs/{id}/{name}/{rest*}", proxy_job, ALLOW_USER | ALLOW_ORIGIN, PROXY_BODY_MAX, ROLE_NONE}, \
    {"GET", "/proxy/jobs/{id}/{name}", proxy_job_slash, ALLOW_USER, 0, ROLE_NONE}

const route api_proxy_routes[] = {
    PROXY_ROUTES,
    {"POST", "/api/v1/jobs/{id}/proxy-session", proxy_session, ALLOW_USER, 0, ROLE_VIEWER},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};

const route api_proxy_app_routes[] = {
    PROXY_ROUTES,
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
