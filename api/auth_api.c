/* auth_api.c - single sign-on's routes: sign-in, callback, sign-out and the
 * device flow (see auth_api.h; docs/sso.md). The protocol is server/oidc.c's;
 * this file holds the one relying party, its lazy retry, the device logins
 * in progress, and what a sign-in makes here: the user, their memberships
 * from the groups claim, a session or a personal token. */
#include "auth_api.h"
#include "../server/oidc.h"
#include "../server/server.h"
#include "../storage/audit.h"
#include "../storage/store.h"
#include "../storage/users.h"
#include "../common/errbuf.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRY_MS_DEFAULT 30000               /* a provider that failed is asked again at most this often */
#define DEVICE_TOKEN_TTL_MS (30LL * 86400 * 1000) /* `trainyard login`'s personal token */
#define DEVICE_HANDLE_PREFIX "tyd_"

/* ---------------------------------------------------------------- state */

typedef struct device_login {
    char handle[UTOK_LEN + 8];               /* what the CLI holds; "" = a free slot */
    char device_code[512];                   /* what the provider knows it by: never handed out */
    int64_t expires_ms, next_poll_ms;        /* wall clock */
    int interval_s;
    int polling;                             /* a poll is at the provider now */
} device_login;

static struct {
    pthread_mutex_t mu;
    int configured;                          /* --oidc-issuer given */
    oidc *rp;                                /* NULL until discovery succeeds */
    int trying;                              /* a discovery is under way (offload thread) */
    char issuer[256], client_id[128], secret[512], redirect[300], groups_claim[64], group_map[128];
    char reason[ERR_MAX];                    /* why rp is NULL */
    int64_t last_try_ms, retry_ms;           /* monotonic */
    device_login dev[AUTH_DEVICE_MAX];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The relying party, or NULL with the reason in why (why_n bytes). */
static oidc *rp_get(char *why, size_t why_n) {
    pthread_mutex_lock(&g.mu);
    oidc *o = g.rp;
    if (!o) snprintf(why, why_n, "%s", g.configured ? g.reason : "the server was started without --oidc-issuer");
    pthread_mutex_unlock(&g.mu);
    return o;
}

/* 1 when a discovery should be tried now (the caller then runs rp_retry on
 * the offload thread). */
static int rp_retry_due(void) {
    pthread_mutex_lock(&g.mu);
    int due = g.configured && !g.rp && !g.trying && mono_ms() - g.last_try_ms >= g.retry_ms;
    if (due) g.trying = 1;
    pthread_mutex_unlock(&g.mu);
    return due;
}

/* Discovery (blocking: the offload thread, or the start). The relying
 * party, or NULL with g.reason logged. */
static oidc *rp_try(void) {
    oidc_config c = {g.issuer, g.client_id, g.secret, g.redirect, g.groups_claim, 0};
    char err[ERR_MAX] = "";
    oidc *o = oidc_new(&c, err, sizeof err);
    pthread_mutex_lock(&g.mu);
    g.trying = 0;
    g.last_try_ms = mono_ms();
    if (o && !g.rp) g.rp = o;
    else if (!o) snprintf(g.reason, sizeof g.reason, "%s", err);
    oidc *now = g.rp;
    pthread_mutex_unlock(&g.mu);
    if (o && o != now) oidc_free(o);
    if (now) log_info("sso: signing in with %s (redirect URI %s)", g.issuer, g.redirect);
    else
        log_warn("sso: single sign-on is not available: %s (token users are unaffected; retried at a sign-in, "
                 "at most every %lld s)",
                 err, (long long)(g.retry_ms / 1000));
    return now;
}

/* The relying party, trying discovery again when it is due (blocking: the
 * offload thread only), or NULL after answering 503 with the reason. */
static oidc *rp_need(http_res *res) {
    char why[ERR_MAX];
    oidc *o = rp_get(why, sizeof why);
    if (!o && rp_retry_due()) {
        o = rp_try();
        if (!o) rp_get(why, sizeof why);
    }
    if (!o)
        http_error(res, 503, "sso_unavailable", NULL, "single sign-on is %s: %s",
                   g.configured ? "not available" : "not configured", why);
    return o;
}

static int read_secret(const char *path, char *out, size_t n, char *err, size_t errlen) {
    size_t len = 0;
    char *s = file_read_all(path, 4096, &len);
    if (!s) {
        snprintf(err, errlen, "cannot read --oidc-client-secret-file %s: %s", path, strerror(errno));
        return -1;
    }
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ')) s[--len] = '\0';
    int rc = len == 0 || strlen(s) != len ? -1 : sfmt(out, n, "%s", s);
    free(s);
    if (rc < 0) snprintf(err, errlen, "--oidc-client-secret-file %s holds no secret (one line, under %zu bytes)", path, n);
    return rc;
}

int api_auth_start(server *srv, char *err, size_t errlen) {
    const server_options *o = &srv->opt;
    if (!o->oidc_issuer[0]) return 0;
    if (read_secret(o->oidc_client_secret_file, g.secret, sizeof g.secret, err, errlen) < 0) return -1;
    if (sfmt(g.issuer, sizeof g.issuer, "%s", o->oidc_issuer) < 0 ||
        sfmt(g.client_id, sizeof g.client_id, "%s", o->oidc_client_id) < 0 ||
        sfmt(g.redirect, sizeof g.redirect, "%s/auth/callback", srv->public_url) < 0 ||
        sfmt(g.groups_claim, sizeof g.groups_claim, "%s", o->oidc_groups_claim) < 0 ||
        sfmt(g.group_map, sizeof g.group_map, "%s", o->oidc_group_map) < 0) {
        snprintf(err, errlen, "single sign-on: an option is too long");
        return -1;
    }
    const char *e = getenv("TRAINYARD_OIDC_RETRY_MS"); /* tests: a provider that comes up later */
    long ms = RETRY_MS_DEFAULT;
    if (e && *e && parse_long(e, 0, 3600000, &ms) < 0) ms = RETRY_MS_DEFAULT;
    g.retry_ms = ms;
    g.configured = 1;
    g.trying = 1;
    rp_try();
    return 0;
}

/* ---------------------------------------------------------------- groups */

/* The team and role group names under the --oidc-group-map format fmt:
 * for each role, the format with {role} filled in must match the group
 * with {team} standing for a team's name. 0 with *out filled, or -1. */
static int group_grant(const char *fmt, const char *group, member_grant *out) {
    static const team_role roles[] = {ROLE_VIEWER, ROLE_MEMBER, ROLE_ADMIN};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        char pat[256];
        const char *r = strstr(fmt, "{role}");
        if (!r || sfmt(pat, sizeof pat, "%.*s%s%s", (int)(r - fmt), fmt, role_name(roles[i]), r + 6) < 0) return -1;
        const char *t = strstr(pat, "{team}");
        if (!t) return -1;
        size_t pre = (size_t)(t - pat), post = strlen(t + 6), n = strlen(group);
        if (n <= pre + post || strncmp(group, pat, pre) != 0 || strcmp(group + n - post, t + 6) != 0) continue;
        size_t tn = n - pre - post;
        if (tn >= sizeof out->team) continue;
        memcpy(out->team, group + pre, tn);
        out->team[tn] = '\0';
        int ok = 1;
        for (size_t k = 0; k < tn; k++) {
            char c = out->team[k];
            ok &= (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        }
        if (!ok) continue;
        out->role = roles[i];
        return 0;
    }
    return -1;
}

/* What a sign-in makes here: the user (made on the first), their 'oidc'
 * memberships exactly as the groups give (the highest role when two
 * groups name one team). 0 with *uid, or -1 with err. */
static int sign_in(server *srv, const oidc_identity *id, int64_t *uid, int *granted, char *err, size_t errlen) {
    int created = 0;
    if (!users_name_ok(id->username)) {
        snprintf(err, errlen, "preferred_username '%s' is not a user name here (1-63 letters, digits, '.', '_', '-', "
                 "starting with a letter or digit)", id->username);
        return -1;
    }
    if (users_signed_in(srv->db, id->username, id->email, uid, &created) != STORE_OK) {
        snprintf(err, errlen, "the database is unavailable; retry");
        return -1;
    }
    member_grant gr[64];
    int n = 0;
    for (int i = 0; i < id->ngroups && n < 64; i++) {
        member_grant one;
        if (group_grant(g.group_map, id->groups[i], &one) < 0) continue;
        int k = 0;
        while (k < n && strcmp(gr[k].team, one.team) != 0) k++;
        if (k < n) {
            if (one.role > gr[k].role) gr[k].role = one.role;
        } else {
            gr[n++] = one;
        }
    }
    int skipped = 0;
    if (members_sync(srv->db, *uid, gr, n, &skipped) != STORE_OK) {
        snprintf(err, errlen, "the database is unavailable; retry");
        return -1;
    }
    *granted = n - skipped;
    if (created) log_info("sso: user %s made at their first sign-in", id->username);
    return 0;
}

/* One audit row for a sign-in (no request of theirs carried a credential). */
static void audit_sign_in(server *srv, http_req *req, const char *user, int64_t uid, int64_t token_id, int status) {
    audit_row a;
    memset(&a, 0, sizeof a);
    a.at = now_ms();
    snprintf(a.actor, sizeof a.actor, "user:%s", user);
    a.user_id = uid;
    a.token_id = token_id;
    snprintf(a.method, sizeof a.method, "%s", req->method);
    snprintf(a.route, sizeof a.route, "%s", req->route ? req->route->pattern : req->path);
    http_client_addr(req, a.client, sizeof a.client);
    a.status = status;
    if (audit_insert(srv->db, &a, NULL) != STORE_OK) log_warn("audit: cannot write the sign-in of %s", user);
}

/* ---------------------------------------------------------------- pages */

static int wants_html(http_req *req) {
    const char *a = http_header(req, "Accept");
    return a && strstr(a, "text/html") != NULL;
}

/* A refused sign-in: an HTML page for a browser, else the JSON error; the
 * reason either way. */
static void refuse(http_req *req, http_res *res, int status, const char *code, const char *reason) {
    if (!wants_html(req)) {
        http_error(res, status, code, NULL, "sign-in refused: %s", reason);
        return;
    }
    buf b;
    buf_init(&b, 16384);
    int rc = buf_appends(&b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign-in refused - "
                             "trainyard</title><link rel=\"stylesheet\" href=\"/app.css\"></head><body><main><div "
                             "class=\"signin card\"><h1>Sign-in refused</h1><p class=\"alert\" id=\"reason\">");
    for (const char *p = reason; *p && rc == 0; p++) {
        switch (*p) {
        case '<': rc = buf_appends(&b, "&lt;"); break;
        case '>': rc = buf_appends(&b, "&gt;"); break;
        case '&': rc = buf_appends(&b, "&amp;"); break;
        case '"': rc = buf_appends(&b, "&quot;"); break;
        case '\'': rc = buf_appends(&b, "&#39;"); break;
        default: rc = buf_append(&b, p, 1);
        }
    }
    if (rc == 0) rc = buf_appends(&b, "</p><p><a href=\"/auth/login\">Try again</a> or <a href=\"/\">go to the "
                                      "dashboard</a>.</p></div></main></body></html>\n");
    if (rc < 0) http_error(res, status, code, NULL, "sign-in refused: %s", reason);
    else http_text(res, status, "text/html; charset=utf-8", b.data, b.len);
    buf_release(&b);
}

/* The session cookie's attributes: Secure when the browser reaches us over
 * HTTPS (our TLS, or a proxy's named by --public-url). */
static void set_cookie(server *srv, http_res *res, const char *value, long max_age) {
    int secure = srv->tls_cert_pem != NULL || strncmp(srv->public_url, "https://", 8) == 0;
    snprintf(res->xhdr_name, sizeof res->xhdr_name, "Set-Cookie");
    snprintf(res->xhdr_value, sizeof res->xhdr_value, "%s=%s; HttpOnly; SameSite=Lax; Path=/; Max-Age=%ld%s",
             HTTP_SESSION_COOKIE, value, max_age, secure ? "; Secure" : "");
}

/* ---------------------------------------------------------------- sign-in */

static void login_redirect(oidc *o, http_req *req, http_res *res) {
    const char *rt = http_query(req, "return_to");
    if (oidc_login_url(o, rt && *rt ? rt : "/", res->location, sizeof res->location) < 0) {
        http_error(res, 400, "invalid_value", "return_to",
                   "return_to must be a path of this server (/..., not //host), under 1024 bytes");
        return;
    }
    res->status = 302;
}

static void login_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    oidc *o = rp_need(res);
    if (o) login_redirect(o, req, res);
}

/* GET /auth/login[?return_to=/path] */
static void auth_login(server *srv, http_req *req, http_res *res) {
    (void)srv;
    char why[ERR_MAX];
    oidc *o = rp_get(why, sizeof why);
    if (o) {
        login_redirect(o, req, res);
        return;
    }
    if (g.configured) { /* discovery again, when due, off the pool thread (it waits for the provider) */
        http_offload(req, res, login_offloaded);
        return;
    }
    http_error(res, 503, "sso_unavailable", NULL, "single sign-on is not configured: %s", why);
}

static void callback_offloaded(server *srv, http_req *req, http_res *res) {
    oidc *o = rp_need(res);
    if (!o) return;
    const char *code = http_query(req, "code"), *state = http_query(req, "state");
    oidc_identity *id = xcalloc(1, sizeof *id);
    char rt[1100] = "/", err[ERR_MAX] = "";
    if (oidc_callback(o, code, state, id, rt, sizeof rt, err, sizeof err) < 0) {
        log_warn("sso: sign-in refused: %s", err);
        refuse(req, res, 401, "sign_in_refused", err);
        free(id);
        return;
    }
    int64_t uid = 0, tid = 0;
    int granted = 0;
    if (sign_in(srv, id, &uid, &granted, err, sizeof err) < 0) {
        log_warn("sso: sign-in of %s refused: %s", id->username, err);
        refuse(req, res, strstr(err, "database") ? 503 : 403, "sign_in_refused", err);
        free(id);
        return;
    }
    long max_age = (long)srv->opt.session_hours * 3600;
    utok_new n = {.session = 1, .name = "dashboard", .team_id = 0, .scopes = SCOPE_READ | SCOPE_WRITE,
                  .via = "oidc", .expires_at = now_ms() + (int64_t)max_age * 1000};
    char session[UTOK_LEN];
    if (utok_create(srv->db, uid, &n, session, &tid) != STORE_OK) {
        refuse(req, res, 503, "unavailable", "the database is unavailable; retry");
        free(id);
        return;
    }
    set_cookie(srv, res, session, max_age);
    memset(session, 0, sizeof session);
    snprintf(res->location, sizeof res->location, "%s", rt);
    res->status = 302;
    log_info("sso: %s signed in (%d team role%s from the groups claim)", id->username, granted, granted == 1 ? "" : "s");
    audit_sign_in(srv, req, id->username, uid, tid, 302);
    free(id);
}

/* GET /auth/callback?code=&state= (or ?error=&error_description= from the provider) */
static void auth_callback(server *srv, http_req *req, http_res *res) {
    (void)srv;
    const char *e = http_query(req, "error");
    if (e) {
        const char *d = http_query(req, "error_description");
        char why[600];
        snprintf(why, sizeof why, "the provider answered %.64s%s%.400s", e, d ? ": " : "", d ? d : "");
        log_warn("sso: sign-in refused: %s", why);
        refuse(req, res, strcmp(e, "access_denied") == 0 ? 403 : 400, strcmp(e, "access_denied") == 0 ? "access_denied" : "sign_in_refused", why);
        return;
    }
    const char *code = http_query(req, "code"), *state = http_query(req, "state");
    if (!code || !*code || !state || !*state) {
        refuse(req, res, 400, "missing_field", "the provider's redirect has no code or no state");
        return;
    }
    http_offload(req, res, callback_offloaded);
}

/* POST /auth/logout: the credential used, revoked; the cookie cleared. */
static void auth_logout(server *srv, http_req *req, http_res *res) {
    const char *tok = NULL;
    if (req->who.session) {
        tok = http_cookie(req, HTTP_SESSION_COOKIE);
    } else {
        const char *h = http_header(req, "Authorization");
        if (h && strncasecmp(h, "Bearer ", 7) == 0) {
            tok = h + 7;
            while (*tok == ' ') tok++;
        }
    }
    int rc = tok ? utok_revoke_value(srv->db, tok) : STORE_NOT_FOUND;
    if (rc == STORE_ERROR) {
        http_db_unavailable(res);
        return;
    }
    set_cookie(srv, res, "", 0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "signed_out", req->who.user);
    cJSON_AddStringToObject(o, "revoked", req->who.session ? "session" : "token");
    http_json(res, 200, o);
}

/* ---------------------------------------------------------------- device flow */

/* The slot of handle, or -1; with g.mu held. Expired logins are freed. */
static int dev_find(const char *handle, int64_t now) {
    for (int i = 0; i < AUTH_DEVICE_MAX; i++) {
        device_login *d = &g.dev[i];
        if (!d->handle[0]) continue;
        if (d->expires_ms <= now - 60000) memset(d, 0, sizeof *d); /* a minute past: forgotten */
        else if (strcmp(d->handle, handle) == 0) return i;
    }
    return -1;
}

static void device_start_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    (void)req;
    oidc *o = rp_need(res);
    if (!o) return;
    oidc_device *dv = xcalloc(1, sizeof *dv);
    char err[ERR_MAX];
    if (oidc_device_start(o, dv, err, sizeof err) < 0) {
        log_warn("sso: a device login could not start: %s", err);
        http_error(res, 502, "provider_error", NULL, "the provider refused to start a device login: %s", err);
        free(dv);
        return;
    }
    char handle[UTOK_LEN + 8], raw[UTOK_LEN];
    if (random_token(raw, sizeof raw) < 0) {
        http_error(res, 503, "unavailable", NULL, "no random bytes; retry");
        free(dv);
        return;
    }
    snprintf(handle, sizeof handle, DEVICE_HANDLE_PREFIX "%s", raw + 3);
    int64_t now = now_ms();
    pthread_mutex_lock(&g.mu);
    int slot = -1;
    (void)dev_find("", now); /* frees the expired */
    for (int i = 0; i < AUTH_DEVICE_MAX && slot < 0; i++)
        if (!g.dev[i].handle[0]) slot = i;
    if (slot >= 0) {
        device_login *d = &g.dev[slot];
        snprintf(d->handle, sizeof d->handle, "%s", handle);
        snprintf(d->device_code, sizeof d->device_code, "%s", dv->device_code);
        d->interval_s = dv->interval > 0 ? dv->interval : 5;
        d->expires_ms = now + (int64_t)(dv->expires_in > 0 ? dv->expires_in : 600) * 1000;
        d->next_poll_ms = now;
    }
    pthread_mutex_unlock(&g.mu);
    if (slot < 0) {
        http_error(res, 503, "busy", NULL, "%d device logins are in progress: retry in a few minutes", AUTH_DEVICE_MAX);
        free(dv);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "device", handle);
    cJSON_AddStringToObject(j, "user_code", dv->user_code);
    cJSON_AddStringToObject(j, "verification_uri", dv->verification_uri);
    cJSON_AddStringToObject(j, "verification_uri_complete",
                            dv->verification_uri_complete[0] ? dv->verification_uri_complete : dv->verification_uri);
    cJSON_AddNumberToObject(j, "interval", dv->interval > 0 ? dv->interval : 5);
    cJSON_AddNumberToObject(j, "expires_in", dv->expires_in > 0 ? dv->expires_in : 600);
    http_json(res, 200, j);
    free(dv);
}

/* POST /api/v1/auth/device */
static void auth_device(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, device_start_offloaded);
}

/* RFC 8628, 3.5: a pending answer (400 with its error code). */
static void pending(http_res *res, const char *code, const char *msg, int interval) {
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddNullToObject(e, "field");
    if (interval > 0) cJSON_AddNumberToObject(o, "interval", interval);
    http_json(res, 400, o);
}

static void device_token_offloaded(server *srv, http_req *req, http_res *res) {
    oidc *o = rp_need(res);
    if (!o) return;
    /* the handler found the login and marked it polling (no other poll of
     * it runs meanwhile): its slot is in keep[0] */
    char code[512];
    pthread_mutex_lock(&g.mu);
    int slot = (int)req->keep[0];
    device_login *d = slot >= 0 && slot < AUTH_DEVICE_MAX && g.dev[slot].handle[0] ? &g.dev[slot] : NULL;
    if (d) snprintf(code, sizeof code, "%s", d->device_code);
    pthread_mutex_unlock(&g.mu);
    if (!d) {
        pending(res, "expired_token", "this device login is unknown or over: run trainyard login again", 0);
        return;
    }
    oidc_identity *id = xcalloc(1, sizeof *id);
    char err[ERR_MAX] = "";
    int rc = oidc_device_poll(o, code, id, err, sizeof err);
    memset(code, 0, sizeof code);
    pthread_mutex_lock(&g.mu);
    int interval = d->interval_s;
    if (rc == OIDC_SLOW_DOWN) interval = d->interval_s += 5;
    d->polling = 0;
    d->next_poll_ms = now_ms() + (int64_t)d->interval_s * 1000;
    if (rc != OIDC_PENDING && rc != OIDC_SLOW_DOWN) memset(d, 0, sizeof *d); /* over, one way or another */
    pthread_mutex_unlock(&g.mu);
    switch (rc) {
    case OIDC_PENDING:
        pending(res, "authorization_pending", "the code has not been entered and approved yet", interval);
        free(id);
        return;
    case OIDC_SLOW_DOWN:
        pending(res, "slow_down", "polled too often: wait the interval (5 s more) between polls", interval);
        free(id);
        return;
    case OIDC_DENIED:
        pending(res, "access_denied", "the sign-in was refused at the provider", 0);
        free(id);
        return;
    case OIDC_EXPIRED:
        pending(res, "expired_token", "the code expired before it was approved: run trainyard login again", 0);
        free(id);
        return;
    case OIDC_OK: break;
    default:
        log_warn("sso: device login refused: %s", err);
        http_error(res, 401, "sign_in_refused", NULL, "sign-in refused: %s", err);
        free(id);
        return;
    }
    int64_t uid = 0, tid = 0;
    int granted = 0;
    if (sign_in(srv, id, &uid, &granted, err, sizeof err) < 0) {
        log_warn("sso: device login of %s refused: %s", id->username, err);
        http_error(res, strstr(err, "database") ? 503 : 403, "sign_in_refused", NULL, "sign-in refused: %s", err);
        free(id);
        return;
    }
    int64_t expires = now_ms() + DEVICE_TOKEN_TTL_MS;
    utok_new n = {.session = 0, .name = "trainyard login", .team_id = 0, .scopes = SCOPE_READ | SCOPE_WRITE,
                  .via = "device", .expires_at = expires};
    char token[UTOK_LEN];
    if (utok_create(srv->db, uid, &n, token, &tid) != STORE_OK) {
        http_db_unavailable(res);
        free(id);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "token", token);
    memset(token, 0, sizeof token);
    cJSON_AddStringToObject(j, "user", id->username);
    cJSON_AddNumberToObject(j, "token_id", (double)tid);
    store_json_time_ms(j, "expires_at", expires);
    http_json(res, 201, j);
    log_info("sso: %s signed in with a device login (%d team role%s from the groups claim)", id->username, granted,
             granted == 1 ? "" : "s");
    audit_sign_in(srv, req, id->username, uid, tid, 201);
    free(id);
}

/* POST /api/v1/auth/device/token {"device": "tyd_..."} */
static void auth_device_token(server *srv, http_req *req, http_res *res) {
    (void)srv;
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(body, "device");
    if (!cJSON_IsString(h) || strncmp(h->valuestring, DEVICE_HANDLE_PREFIX, 4) != 0 || strlen(h->valuestring) >= UTOK_LEN + 8) {
        cJSON_Delete(body);
        http_error(res, 400, "invalid_value", "device", "device must be the handle POST /api/v1/auth/device gave");
        return;
    }
    int64_t now = now_ms();
    pthread_mutex_lock(&g.mu);
    int slot = dev_find(h->valuestring, now);
    cJSON_Delete(body);
    device_login *d = slot >= 0 ? &g.dev[slot] : NULL;
    int expired = d && d->expires_ms <= now, early = d && !expired && (d->polling || now < d->next_poll_ms - 1000);
    int interval = d ? d->interval_s : 0;
    if (d && expired) memset(d, 0, sizeof *d);
    if (early) d->interval_s += 5; /* RFC 8628, 3.5: a client that polls too fast slows down */
    if (d && !expired && !early) d->polling = 1;
    pthread_mutex_unlock(&g.mu);
    if (!d || expired) {
        pending(res, "expired_token", "this device login is unknown or expired: run trainyard login again", 0);
        return;
    }
    if (early) {
        pending(res, "slow_down", "polled before the interval: wait it (5 s more from now on) between polls", interval + 5);
        return;
    }
    req->keep[0] = slot;
    http_offload(req, res, device_token_offloaded);
}

/* ---------------------------------------------------------------- routes */

const route api_auth_routes[] = {
    {"GET", "/auth/login", auth_login, ALLOW_NONE, 0, ROLE_NONE},
    {"GET", "/auth/callback", auth_callback, ALLOW_NONE, 0, ROLE_NONE},
    {"POST", "/auth/logout", auth_logout, ALLOW_PERSON, 0, ROLE_NONE},
    {"POST", "/api/v1/auth/device", auth_device, ALLOW_NONE, 4096, ROLE_NONE},
    {"POST", "/api/v1/auth/device/token", auth_device_token, ALLOW_NONE, 4096, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
