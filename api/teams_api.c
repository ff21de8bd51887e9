/* teams_api.c - GET /teams (a team sees itself, the admin sees all) and
 * POST /teams (admin): creates a team and returns its token once. */
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
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "name") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "name", "name must be a string");
                goto out;
            }
            name = f->valuestring;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: name)", f->string);
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
    if (rc == STORE_OK) rc = store_token_add(srv->db, tok, TOKEN_TEAM, id, 0);
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
    cJSON_AddStringToObject(o, "note", "the token is shown once; store it now");
    snprintf(res->location, sizeof res->location, "/api/v1/teams/%s", name);
    http_json(res, 201, o);
out:
    cJSON_Delete(body);
}

const route api_teams_routes[] = {
    {"GET", "/api/v1/teams", teams_list, ALLOW_USER, 0},
    {"POST", "/api/v1/teams", teams_create, ALLOW_ADMIN, 0},
    {NULL, NULL, NULL, 0, 0},
};
