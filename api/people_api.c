/* people_api.c - users, members, personal tokens, me, audit (see people_api.h). */
#include "people_api.h"
#include "usage_api.h"
#include "../server/server.h"
#include "../storage/audit.h"
#include "../storage/store.h"
#include "../storage/users.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_EXPIRES_DEFAULT_S (30LL * 86400)
#define TOKEN_EXPIRES_MAX_S (366LL * 86400)

/* ---------------------------------------------------------------- helpers */

/* The user named by path parameter i: its id, or -1 after answering 404. */
static int64_t user_param(server *srv, http_req *req, http_res *res, int i) {
    int64_t id = 0;
    int rc = users_name_ok(req->params[i]) ? users_find(srv->db, req->params[i], &id) : STORE_NOT_FOUND;
    if (rc == STORE_OK) return id;
    if (rc == STORE_NOT_FOUND) http_error(res, 404, "not_found", "user", "no user named '%s'", req->params[i]);
    else http_db_unavailable(res);
    return -1;
}

/* The team named by path parameter i, if req holds `need` in it: its id,
 * or -1 after answering (404, 403). */
static int64_t team_param(server *srv, http_req *req, http_res *res, int i, team_role need) {
    int64_t id = 0;
    int rc = store_team_find(srv->db, req->params[i], &id);
    if (rc == STORE_ERROR) {
        http_db_unavailable(res);
        return -1;
    }
    if (rc != STORE_OK) {
        http_error(res, 404, "not_found", "team", "no team named '%s'", req->params[i]);
        return -1;
    }
    return http_team_role_check(srv->db, req, res, id, req->params[i], need) < 0 ? -1 : id;
}

static int is_person(http_req *req, http_res *res) {
    if (req->who.user_id > 0) return 1;
    http_error(res, 403, "forbidden", NULL,
               "personal tokens belong to people: sign in (trainyard login) or ask the cluster admin "
               "(POST /api/v1/users/NAME/tokens); a team's token is its service account");
    return 0;
}

/* ---------------------------------------------------------------- users */

/* POST /api/v1/users {"name", "email"} */
static void user_create(server *srv, http_req *req, http_res *res) {
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *name = NULL, *email = NULL;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "name") == 0 || strcmp(f->string, "email") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", f->string, "%s must be a string", f->string);
                goto out;
            }
            if (f->string[0] == 'n') name = f->valuestring;
            else email = f->valuestring;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: name, email)", f->string);
            goto out;
        }
    }
    if (!name) {
        http_error(res, 422, "missing_field", "name", "name is required");
        goto out;
    }
    if (!users_name_ok(name)) {
        http_error(res, 422, "invalid_value", "name",
                   "name must be 1-63 characters of letters, digits, '.', '_' and '-', starting with a letter or digit");
        goto out;
    }
    if (email && (strlen(email) > 254 || !strchr(email, '@') || strpbrk(email, " \t\r\n<>\","))) {
        http_error(res, 422, "invalid_value", "email", "email must be an address (name@domain), 254 characters at most");
        goto out;
    }
    int64_t id = 0;
    if (db_begin(srv->db) < 0) {
        http_db_unavailable(res);
        goto out;
    }
    int rc = users_create(srv->db, name, email, "admin", &id);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc == STORE_CONFLICT) http_error(res, 409, "conflict", "name", "a user named '%s' exists", name);
        else http_db_unavailable(res);
        goto out;
    }
    cJSON *u = users_get(srv->db, id);
    if (!u) http_db_unavailable(res);
    else {
        snprintf(res->location, sizeof res->location, "/api/v1/users/%s", name);
        http_json(res, 201, u);
    }
out:
    cJSON_Delete(body);
}

/* GET /api/v1/users */
static void users_get_all(server *srv, http_req *req, http_res *res) {
    (void)req;
    cJSON *arr = users_list(srv->db);
    if (!arr) {
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "users", arr);
    http_json(res, 200, o);
}

/* GET /api/v1/users/{name} */
static void user_get_one(server *srv, http_req *req, http_res *res) {
    int64_t id = user_param(srv, req, res, 0);
    if (id < 0) return;
    cJSON *u = users_get(srv->db, id);
    if (!u) http_db_unavailable(res);
    else http_json(res, 200, u);
}

/* ---------------------------------------------------------------- members */

/* GET /api/v1/teams/{team}/members */
static void members_get(server *srv, http_req *req, http_res *res) {
    int64_t team = team_param(srv, req, res, 0, ROLE_VIEWER);
    if (team < 0) return;
    cJSON *arr = members_list(srv->db, team);
    if (!arr) {
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "team", req->params[0]);
    cJSON_AddItemToObject(o, "members", arr);
    http_json(res, 200, o);
}

/* PUT /api/v1/teams/{team}/members/{user} {"role": "viewer"|"member"|"admin"} */
static void member_put(server *srv, http_req *req, http_res *res) {
    if (http_require_json(req, res) < 0) return;
    int64_t team = team_param(srv, req, res, 0, ROLE_ADMIN); /* who may, before what they sent */
    if (team < 0) return;
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    team_role role = ROLE_NONE;
    int has_role = 0;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "role") != 0) {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: role)", f->string);
            goto out;
        }
        if (!cJSON_IsString(f) || role_parse(f->valuestring, &role) < 0) {
            http_error(res, 422, "invalid_value", "role", "role must be one of viewer, member, admin");
            goto out;
        }
        has_role = 1;
    }
    if (!has_role) {
        http_error(res, 422, "missing_field", "role", "role is required (viewer, member or admin)");
        goto out;
    }
    int64_t user = 0;
    int rc = users_name_ok(req->params[1]) ? users_find(srv->db, req->params[1], &user) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 422, "invalid_value", "user",
                   "no user named '%s': the cluster admin makes users (POST /api/v1/users), or they sign in once",
                   req->params[1]);
        goto out;
    }
    int created = 0;
    if (rc != STORE_OK || db_begin(srv->db) < 0) {
        http_db_unavailable(res);
        goto out;
    }
    rc = members_put(srv->db, team, user, role, "api", &created);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        http_db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "team", req->params[0]);
    cJSON_AddStringToObject(o, "user", req->params[1]);
    cJSON_AddStringToObject(o, "role", role_name(role));
    http_json(res, created ? 201 : 200, o);
out:
    cJSON_Delete(body);
}

/* DELETE /api/v1/teams/{team}/members/{user} */
static void member_delete(server *srv, http_req *req, http_res *res) {
    int64_t team = team_param(srv, req, res, 0, ROLE_ADMIN);
    if (team < 0) return;
    int64_t user = user_param(srv, req, res, 1);
    if (user < 0) return;
    if (db_begin(srv->db) < 0) {
        http_db_unavailable(res);
        return;
    }
    int rc = members_delete(srv->db, team, user);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc == STORE_NOT_FOUND)
            http_error(res, 404, "not_found", "user", "user %s is not a member of team %s", req->params[1],
                       req->params[0]);
        else http_db_unavailable(res);
        return;
    }
    http_text(res, 204, "application/json", "", 0);
}

/* ---------------------------------------------------------------- tokens */

/* {"name", "expires_in", "team"?, "scopes"?} for user_id: 201 with the secret once. */
static void token_make(server *srv, http_req *req, http_res *res, int64_t user_id, const char *user) {
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *name = NULL, *team = NULL;
    int64_t expires_in = TOKEN_EXPIRES_DEFAULT_S, team_id = 0;
    unsigned scopes = SCOPE_READ | SCOPE_WRITE;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "name") == 0 || strcmp(f->string, "team") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", f->string, "%s must be a string", f->string);
                goto out;
            }
            if (f->string[0] == 'n') name = f->valuestring;
            else team = f->valuestring;
        } else if (strcmp(f->string, "expires_in") == 0) {
            if (!cJSON_IsNumber(f) || f->valuedouble != (double)(int64_t)f->valuedouble || f->valuedouble < 60 ||
                f->valuedouble > (double)TOKEN_EXPIRES_MAX_S) {
                http_error(res, 422, "invalid_value", "expires_in", "expires_in must be 60 to %lld seconds",
                           (long long)TOKEN_EXPIRES_MAX_S);
                goto out;
            }
            expires_in = (int64_t)f->valuedouble;
        } else if (strcmp(f->string, "scopes") == 0) {
            scopes = 0;
            cJSON *s;
            int bad = !cJSON_IsArray(f) || cJSON_GetArraySize(f) == 0;
            cJSON_ArrayForEach(s, f) {
                if (cJSON_IsString(s) && strcmp(s->valuestring, "read") == 0) scopes |= SCOPE_READ;
                else if (cJSON_IsString(s) && strcmp(s->valuestring, "write") == 0) scopes |= SCOPE_WRITE | SCOPE_READ;
                else bad = 1;
            }
            if (bad) {
                http_error(res, 422, "invalid_value", "scopes", "scopes must be a list of \"read\" and \"write\"");
                goto out;
            }
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: name, expires_in, team, scopes)", f->string);
            goto out;
        }
    }
    if (!name || !name[0] || strlen(name) > 100) {
        http_error(res, 422, name ? "invalid_value" : "missing_field", "name",
                   "name is required: 1-100 characters saying what the token is for");
        goto out;
    }
    if (team) {
        team_role role = ROLE_NONE;
        int rc = store_team_find(srv->db, team, &team_id);
        if (rc == STORE_OK) rc = members_role(srv->db, team_id, user_id, &role);
        if (rc == STORE_ERROR) {
            http_db_unavailable(res);
            goto out;
        }
        if (rc != STORE_OK || role == ROLE_NONE) {
            http_error(res, 422, "invalid_value", "team", "user %s is not a member of team '%.64s'", user, team);
            goto out;
        }
    }
    char tok[UTOK_LEN];
    int64_t id = 0;
    utok_new n = {.name = name, .team_id = team_id, .scopes = scopes, .via = "api",
                  .expires_at = now_ms() + expires_in * 1000};
    if (db_begin(srv->db) < 0) {
        http_db_unavailable(res);
        goto out;
    }
    if (utok_create(srv->db, user_id, &n, tok, &id) != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        http_db_unavailable(res);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "user", user);
    if (team) cJSON_AddStringToObject(o, "team", team);
    else cJSON_AddNullToObject(o, "team");
    cJSON *sc = cJSON_AddArrayToObject(o, "scopes");
    cJSON_AddItemToArray(sc, cJSON_CreateString("read"));
    if (scopes & SCOPE_WRITE) cJSON_AddItemToArray(sc, cJSON_CreateString("write"));
    store_json_time_ms(o, "expires_at", n.expires_at);
    cJSON_AddStringToObject(o, "token", tok);
    http_json(res, 201, o);
out:
    cJSON_Delete(body);
}

/* POST /api/v1/tokens */
static void token_create(server *srv, http_req *req, http_res *res) {
    if (!is_person(req, res)) return;
    token_make(srv, req, res, req->who.user_id, req->who.user);
}

/* POST /api/v1/users/{name}/tokens */
static void user_token_create(server *srv, http_req *req, http_res *res) {
    if (http_require_json(req, res) < 0) return;
    int64_t id = user_param(srv, req, res, 0);
    if (id < 0) return;
    token_make(srv, req, res, id, req->params[0]);
}

/* GET /api/v1/tokens */
static void tokens_list(server *srv, http_req *req, http_res *res) {
    if (!is_person(req, res)) return;
    cJSON *arr = utok_list(srv->db, req->who.user_id);
    if (!arr) {
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "tokens", arr);
    http_json(res, 200, o);
}

/* DELETE /api/v1/tokens/{id}: one's own; the admin's any */
static void token_delete(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "token");
    if (id < 0) return;
    if (req->who.kind != TOKEN_ADMIN && !is_person(req, res)) return;
    int rc = utok_revoke(srv->db, req->who.kind == TOKEN_ADMIN ? 0 : req->who.user_id, id);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no live token %lld of yours", (long long)id);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    http_text(res, 204, "application/json", "", 0);
}

/* ---------------------------------------------------------------- me */

/* GET /api/v1/me */
static void me_get(server *srv, http_req *req, http_res *res) {
    const principal *w = &req->who;
    cJSON *o = cJSON_CreateObject();
    if (w->kind == TOKEN_ADMIN) {
        cJSON_AddStringToObject(o, "kind", "admin");
        cJSON_AddStringToObject(o, "name", "admin");
        cJSON_AddStringToObject(o, "signed_in_via", "admin token");
        cJSON_AddBoolToObject(o, "cluster_admin", 1);
        cJSON_AddItemToObject(o, "teams", cJSON_CreateArray());
    } else if (w->user_id > 0) {
        cJSON *u = users_get(srv->db, w->user_id);
        cJSON *teams = members_teams(srv->db, w->user_id);
        if (!u || !teams) {
            cJSON_Delete(u);
            cJSON_Delete(teams);
            cJSON_Delete(o);
            http_db_unavailable(res);
            return;
        }
        cJSON_AddStringToObject(o, "kind", "user");
        cJSON_AddStringToObject(o, "name", w->user);
        cJSON *email = cJSON_DetachItemFromObject(u, "email");
        cJSON_AddItemToObject(o, "email", email ? email : cJSON_CreateNull());
        cJSON_Delete(u);
        cJSON_AddStringToObject(o, "signed_in_via",
                                w->session ? "oidc session" : strcmp(w->via, "device") == 0 ? "oidc device login"
                                                                                            : "personal token");
        cJSON_AddBoolToObject(o, "cluster_admin", 0);
        cJSON_AddItemToObject(o, "teams", teams);
        cJSON *t = cJSON_AddObjectToObject(o, "credential");
        cJSON_AddNumberToObject(t, "id", (double)w->token_id);
        cJSON_AddStringToObject(t, "kind", w->session ? "session" : "token");
        store_json_time_ms(t, "expires_at", w->expires_at);
        if (w->token_team > 0) cJSON_AddStringToObject(t, "team", w->team);
        const char *cookie = w->session ? http_cookie(req, HTTP_SESSION_COOKIE) : NULL;
        if (cookie) { /* the page's own requests send it with every change (X-CSRF-Token) */
            char csrf[65];
            utok_csrf_of(cookie, csrf);
            cJSON_AddStringToObject(o, "csrf", csrf);
        }
    } else {
        cJSON_AddStringToObject(o, "kind", "service");
        char name[96];
        snprintf(name, sizeof name, "team:%s (service)", w->team);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "signed_in_via", "team token");
        cJSON_AddBoolToObject(o, "cluster_admin", 0);
        cJSON *teams = cJSON_AddArrayToObject(o, "teams");
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "team", w->team);
        cJSON_AddStringToObject(t, "role", "admin");
        cJSON_AddStringToObject(t, "source", "service account");
        cJSON_AddItemToArray(teams, t);
    }
    http_json(res, 200, o);
}

/* ---------------------------------------------------------------- audit */

/* GET /api/v1/audit?since=&until=&user=&team=&action=&limit=&before= */
static void audit_get(server *srv, http_req *req, http_res *res) {
    audit_filter f = {0};
    if (api_time_arg(req, res, "since", &f.since) < 0 || api_time_arg(req, res, "until", &f.until) < 0) return;
    long limit, before;
    if (http_query_long(req, res, "limit", 1, 10000, 500, &limit) < 0) return;
    if (http_query_long(req, res, "before", 1, (long)INT64_MAX, 0, &before) < 0) return;
    f.limit = (int)limit;
    f.before = before;
    f.user = http_query(req, "user");
    if (f.user && !users_name_ok(f.user)) {
        http_error(res, 400, "invalid_value", "user", "user must be a user's name");
        return;
    }
    f.action = http_query(req, "action");
    if (f.action && strlen(f.action) > 200) {
        http_error(res, 400, "invalid_value", "action", "action is at most 200 characters");
        return;
    }
    const char *team = http_query(req, "team");
    if (!team) team = http_header(req, HTTP_TEAM_HEADER);
    const principal *w = &req->who;
    if (w->kind == TOKEN_TEAM && !team) team = w->team; /* a team's token: its own */
    if (team) {
        int64_t id = 0;
        int rc = store_team_find(srv->db, team, &id);
        if (rc == STORE_ERROR) {
            http_db_unavailable(res);
            return;
        }
        if (rc != STORE_OK) {
            http_error(res, 400, "invalid_value", "team", "no team named '%.64s'", team);
            return;
        }
        if (http_team_role_check(srv->db, req, res, id, team, ROLE_ADMIN) < 0) return;
        f.team_id = id;
    } else if (w->kind != TOKEN_ADMIN) {
        http_error(res, 400, "missing_field", "team",
                   "a team's admin reads the audit trail of a team: name it (?team=NAME); all of it is the "
                   "cluster admin's");
        return;
    }
    int csv = api_wants_csv(req);
    buf b;
    buf_init(&b, 64u << 20);
    int64_t next = 0;
    int rc = csv ? 0 : buf_appends(&b, "{\"audit\":");
    if (rc == 0 && audit_query(srv->db, &f, csv, &b, &next) != STORE_OK) rc = -1;
    if (rc == 0 && !csv)
        rc = next ? buf_printf(&b, ",\"next_before\":%lld}\n", (long long)next) : buf_appends(&b, ",\"next_before\":null}\n");
    if (rc < 0) {
        buf_release(&b);
        http_db_unavailable(res);
        return;
    }
    http_text(res, 200, csv ? "text/csv; charset=utf-8" : "application/json", b.data, b.len);
    buf_release(&b);
}

#define PEOPLE (ALLOW_ADMIN | ALLOW_TEAM | ALLOW_PERSON)

const route api_people_routes[] = {
    {"POST", "/api/v1/users", user_create, ALLOW_ADMIN, 0, ROLE_NONE},
    {"GET", "/api/v1/users", users_get_all, ALLOW_ADMIN, 0, ROLE_NONE},
    {"GET", "/api/v1/users/{name}", user_get_one, ALLOW_ADMIN, 0, ROLE_NONE},
    {"POST", "/api/v1/users/{name}/tokens", user_token_create, ALLOW_ADMIN, 0, ROLE_NONE},
    {"GET", "/api/v1/teams/{team}/members", members_get, PEOPLE, 0, ROLE_VIEWER},
    {"PUT", "/api/v1/teams/{team}/members/{user}", member_put, PEOPLE, 0, ROLE_ADMIN},
    {"DELETE", "/api/v1/teams/{team}/members/{user}", member_delete, PEOPLE, 0, ROLE_ADMIN},
    {"POST", "/api/v1/tokens", token_create, ALLOW_PERSON, 0, ROLE_NONE},
    {"GET", "/api/v1/tokens", tokens_list, ALLOW_PERSON, 0, ROLE_NONE},
    {"DELETE", "/api/v1/tokens/{id}", token_delete, ALLOW_PERSON | ALLOW_ADMIN, 0, ROLE_NONE},
    {"GET", "/api/v1/me", me_get, PEOPLE, 0, ROLE_NONE},
    {"GET", "/api/v1/audit", audit_get, PEOPLE, 0, ROLE_ADMIN},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
