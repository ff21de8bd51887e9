/* teams_api.c - GET /teams (a team sees itself, the admin sees all),
 * POST /teams (admin): creates a team and returns its token once, and
 * POST /teams/{name}/tokens (the admin, or the team itself): a new token,
 * expiring or not, optionally rotating the team's others out after a grace. */
#include "routes.h"
#include "../server/server.h"
#include "../storage/store.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static void teams_list(server *srv, http_req *req, http_res *res) {
    cJSON *arr;
    if (req->who.kind == TOKEN_ADMIN) {
        arr = store_teams_list(srv->db);
    } else {
        arr = cJSON_CreateArray();
        cJSON *t = store_team_get(srv->db, req->who.team_id);
        if (t) cJSON_AddItemToArray(arr, t);
        else {
            cJSON_Delete(arr);
            arr = NULL;
        }
    }
    if (!arr) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "teams", arr);
    http_json(res, 200, o);
}

#define EXPIRES_MAX_S (10LL * 366 * 86400)
#define GRACE_MAX_S (30LL * 86400)

/* An integer number of seconds in [lo, hi] into *out: 0, or -1 with a 422 in res. */
static int seconds_field(const cJSON *f, const char *name, int64_t lo, int64_t hi, int64_t *out, http_res *res) {
    if (!cJSON_IsNumber(f) || f->valuedouble != (double)(int64_t)f->valuedouble) {
        http_error(res, 422, "invalid_type", name, "%s must be a whole number of seconds", name);
        return -1;
    }
    if (f->valuedouble < (double)lo || f->valuedouble > (double)hi) {
        http_error(res, 422, "invalid_value", name, "%s must be %lld to %lld seconds", name, (long long)lo,
                   (long long)hi);
        return -1;
    }
    *out = (int64_t)f->valuedouble;
    return 0;
}

static int valid_team_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 63) return 0;
    if (!islower((unsigned char)s[0]) && !isdigit((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return 0;
    return 1;
}

/* POST /api/v1/teams {"name": "vision"} -> 201 {"team": {...}, "token": "..."} */
static void teams_create(server *srv, http_req *req, http_res *res) {
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *name = NULL;
    int64_t expires_in = 0;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "name") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "name", "name must be a string");
                goto out;
            }
            name = f->valuestring;
        } else if (strcmp(f->string, "expires_in") == 0) {
            if (seconds_field(f, "expires_in", 60, EXPIRES_MAX_S, &expires_in, res) < 0) goto out;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: name, expires_in)", f->string);
            goto out;
        }
    }
    if (!name) {
        http_error(res, 422, "missing_field", "name", "name is required");
        goto out;
    }
    if (!valid_team_name(name)) {
        http_error(res, 422, "invalid_value", "name",
                   "name must be 1-63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit");
        goto out;
    }
    char tok[128];
    if (random_token(tok, sizeof tok) < 0) {
        http_error(res, 500, "internal", NULL, "cannot make a token");
        goto out;
    }
    int64_t id = 0;
    if (db_begin(srv->db) < 0) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    int rc = store_team_create(srv->db, name, &id);
    int64_t expires_at = expires_in ? now_ms() + expires_in * 1000 : 0;
    if (rc == STORE_OK) rc = store_token_add_expiring(srv->db, tok, id, expires_at);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc == STORE_CONFLICT) http_error(res, 409, "conflict", "name", "a team named '%s' exists", name);
        else http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *t = store_team_get(srv->db, id);
    cJSON_AddItemToObject(o, "team", t ? t : cJSON_CreateNull());
    cJSON_AddStringToObject(o, "token", tok);
    if (expires_at) store_json_time_ms(o, "expires_at", expires_at);
    else cJSON_AddNullToObject(o, "expires_at");
    cJSON_AddStringToObject(o, "note", "the token is shown once; store it now");
    snprintf(res->location, sizeof res->location, "/api/v1/teams/%s", name);
    http_json(res, 201, o);
out:
    cJSON_Delete(body);
}

/* POST /api/v1/teams/{name}/tokens {"expires_in": 86400, "rotate": true, "grace_s": 3600}
 * -> 201 {"token", "team", "expires_at", "rotated", "others_expire_at"}: a new
 * team token (expiring after expires_in, or never); with rotate, every other
 * live token of the team expires grace_s (default 3600) from now, unless it
 * expires sooner. The admin for any team, a team's token for its own. */
static void team_token_create(server *srv, http_req *req, http_res *res) {
    const char *name = req->params[0];
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    int64_t team_id = 0;
    int rc = store_team_find(srv->db, name, &team_id);
    if (rc == STORE_ERROR) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    if (rc != STORE_OK || (req->who.kind != TOKEN_ADMIN && req->who.team_id != team_id)) {
        http_error(res, 404, "not_found", "name", "no team '%s' of yours", name);
        goto out;
    }
    int64_t expires_in = 0, grace = 3600;
    int rotate = 0;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "expires_in") == 0) {
            if (seconds_field(f, "expires_in", 60, EXPIRES_MAX_S, &expires_in, res) < 0) goto out;
        } else if (strcmp(f->string, "grace_s") == 0) {
            if (seconds_field(f, "grace_s", 0, GRACE_MAX_S, &grace, res) < 0) goto out;
        } else if (strcmp(f->string, "rotate") == 0) {
            if (!cJSON_IsBool(f)) {
                http_error(res, 422, "invalid_type", "rotate", "rotate must be true or false");
                goto out;
            }
            rotate = cJSON_IsTrue(f);
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: expires_in, rotate, grace_s)", f->string);
            goto out;
        }
    }
    char tok[128];
    if (random_token(tok, sizeof tok) < 0) {
        http_error(res, 500, "internal", NULL, "cannot make a token");
        goto out;
    }
    int64_t now = now_ms(), expires_at = expires_in ? now + expires_in * 1000 : 0, others_at = now + grace * 1000;
    int rotated = 0;
    if (db_begin(srv->db) < 0) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    rc = store_token_add_expiring(srv->db, tok, team_id, expires_at);
    if (rc == STORE_OK && rotate) rc = store_team_tokens_expire(srv->db, team_id, tok, others_at, &rotated);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", tok);
    cJSON_AddStringToObject(o, "team", name);
    if (expires_at) store_json_time_ms(o, "expires_at", expires_at);
    else cJSON_AddNullToObject(o, "expires_at");
    cJSON_AddNumberToObject(o, "rotated", rotated);
    if (rotate) store_json_time_ms(o, "others_expire_at", others_at);
    else cJSON_AddNullToObject(o, "others_expire_at");
    cJSON_AddStringToObject(o, "note", "the token is shown once; store it now");
    http_json(res, 201, o);
out:
    cJSON_Delete(body);
}

const route api_teams_routes[] = {
    {"GET", "/api/v1/teams", teams_list, ALLOW_USER, 0},
    {"POST", "/api/v1/teams", teams_create, ALLOW_ADMIN, 0},
    {"POST", "/api/v1/teams/{name}/tokens", team_token_create, ALLOW_USER, 0},
    {NULL, NULL, NULL, 0, 0},
};
