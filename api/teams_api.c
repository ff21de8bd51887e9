/* teams_api.c - GET /teams (a team sees itself, the admin sees all, each
 * with its storage quota and use), POST /teams (admin): creates a team and
 * returns its token once, PATCH|POST /teams/{name} (admin): its shares
 * (weight, guarantee, quota) and its storage quota, and
 * POST /teams/{name}/tokens (the admin, or the team itself): a new token,
 * expiring or not, optionally rotating the team's others out after a grace.
 * Also the check every bulk write passes (api_storage_admit). */
#include "teams_api.h"
#include "scheduling.h"
#include "../spec/jobspec.h"
#include "../server/server.h"
#include "../storage/cluster.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void unavailable(http_res *res) {
    http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
}

/* ---------------------------------------------------------------- storage */

int api_storage_admit(server *srv, int64_t team_id, int64_t len, const char *what, int quota_status, http_res *res) {
    int64_t free_b, reserve;
    unsigned ep;
    char lb[32], b1[32], b2[32];
    quota_fmt_bytes(len, lb, sizeof lb);
    if (quota_disk_low(srv->db, len, &free_b, &reserve, &ep) == 1) {
        quota_fmt_bytes(free_b, b1, sizeof b1);
        quota_fmt_bytes(reserve, b2, sizeof b2);
        http_error(res, 507, "disk_reserve", NULL,
                   "the server's disk has %s free (%lld bytes): this %s (%s) would take it under its reserve of %s "
                   "(%lld); nothing was stored",
                   b1, (long long)free_b, what, lb, b2, (long long)reserve);
        return -1;
    }
    int64_t quota;
    quota_use use;
    if (quota_check(srv->db, team_id, len, &quota, &use, &ep) != 1) return 0;
    char team[64];
    if (quota_team_name(srv->db, team_id, team, sizeof team) != STORE_OK)
        snprintf(team, sizeof team, "%lld", (long long)team_id);
    int64_t used = quota_use_total(&use);
    quota_fmt_bytes(quota, b1, sizeof b1);
    quota_fmt_bytes(used, b2, sizeof b2);
    /* short enough to show whole in a worker's log line */
    if (quota_status == 413)
        http_error_limit(res, 413, "quota_exceeded", "body", quota,
                         "team %s's storage quota is %s (%lld bytes), %s used (%lld): this %s (%s) would pass it; "
                         "nothing was stored",
                         team, b1, (long long)quota, b2, (long long)used, what, lb);
    else
        http_error(res, 507, "storage_quota", NULL,
                   "team %s's storage quota is %s (%lld bytes), %s used (%lld): this %s (%s) would pass it; "
                   "nothing was stored",
                   team, b1, (long long)quota, b2, (long long)used, what, lb);
    return -1;
}

int api_team_storage_json(server *srv, cJSON *team) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(team, "id");
    if (!cJSON_IsNumber(id)) return -1;
    quota_use u;
    int64_t quota = -1;
    if (quota_use_read(srv->db, (int64_t)id->valuedouble, &u, &quota) != STORE_OK) return -1;
    if (quota >= 0) cJSON_AddNumberToObject(team, "storage_quota", (double)quota);
    else cJSON_AddNullToObject(team, "storage_quota");
    cJSON *o = cJSON_AddObjectToObject(team, "storage_used");
    if (!o) return -1;
    cJSON_AddNumberToObject(o, "logs", (double)u.bytes[QUOTA_LOGS]);
    cJSON_AddNumberToObject(o, "checkpoints", (double)u.bytes[QUOTA_CHECKPOINTS]);
    cJSON_AddNumberToObject(o, "contexts", (double)u.bytes[QUOTA_CONTEXTS]);
    cJSON_AddNumberToObject(o, "total", (double)quota_use_total(&u));
    return 0;
}

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
    for (cJSON *t = arr ? arr->child : NULL; t; t = t->next) {
        if (api_team_storage_json(srv, t) < 0) {
            cJSON_Delete(arr);
            arr = NULL;
            break;
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
    if (t && api_team_storage_json(srv, t) < 0) {
        cJSON_Delete(t);
        t = NULL;
    }
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

/* ---------------------------------------------------------------- shares and storage quota */

/* An integer field in [lo, hi]: 0, or -1 after answering 422 naming it. */
static int int_field(http_res *res, const cJSON *v, const char *field, long lo, long hi, long *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        http_error(res, 422, "invalid_type", field, "%s must be an integer", field);
        return -1;
    }
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        http_error(res, 422, "invalid_value", field, "%s must be between %ld and %ld", field, lo, hi);
        return -1;
    }
    *out = (long)v->valuedouble;
    return 0;
}

/* storage_quota: a size (JOBSPEC_SIZE_STORAGE_QUOTA: a string or an
 * integer of bytes, 0 to 64 TiB either way) or null (none): 0 with *out
 * (-1: none), or -1 after a 422 naming it. */
static int storage_quota_field(http_res *res, const cJSON *v, int64_t *out) {
    if (cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    spec_error se;
    if (jobspec_size_value(v, &JOBSPEC_SIZE_STORAGE_QUOTA, out, &se) < 0) {
        http_error(res, se.status, se.code, se.field, "storage_quota %s", se.message);
        return -1;
    }
    return 0;
}

/* PATCH|POST /api/v1/teams/{name} {"weight": 2, "guarantee": 8, "quota": 16 | null,
 * "storage_quota": "500GiB" | BYTES | null, "max_interactive": 2 | null} -> 200 the team */
static void team_patch(server *srv, http_req *req, http_res *res) {
    const char *name = req->params[0];
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    double weight = 0;
    long guarantee = 0, quota = -1, max_inter = -1;
    int64_t storage_quota = -1;
    int set_w = 0, set_g = 0, set_q = 0, set_sq = 0, set_mi = 0;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "weight") == 0) {
            if (!cJSON_IsNumber(f)) {
                http_error(res, 422, "invalid_type", "weight", "weight must be a number");
                goto out;
            }
            if (!(f->valuedouble > 0 && f->valuedouble <= 1e6)) {
                http_error(res, 422, "invalid_value", "weight", "weight must be above 0 and at most 1000000");
                goto out;
            }
            weight = f->valuedouble;
            set_w = 1;
        } else if (strcmp(f->string, "guarantee") == 0) {
            if (int_field(res, f, "guarantee", 0, 1000000, &guarantee) < 0) goto out;
            set_g = 1;
        } else if (strcmp(f->string, "quota") == 0) {
            if (!cJSON_IsNull(f) && int_field(res, f, "quota", 0, 1000000, &quota) < 0) goto out;
            set_q = 1;
        } else if (strcmp(f->string, "storage_quota") == 0) {
            if (storage_quota_field(res, f, &storage_quota) < 0) goto out;
            set_sq = 1;
        } else if (strcmp(f->string, "max_interactive") == 0) {
            if (!cJSON_IsNull(f) && int_field(res, f, "max_interactive", 0, 1000000, &max_inter) < 0) goto out;
            set_mi = 1;
        } else {
            http_error(res, 422, "unknown_field", f->string,
                       "unknown field '%s' (allowed: weight, guarantee, quota, storage_quota, max_interactive)",
                       f->string);
            goto out;
        }
    }
    if (!set_w && !set_g && !set_q && !set_sq && !set_mi) {
        http_error(res, 422, "missing_field", NULL,
                   "give at least one of weight, guarantee, quota, storage_quota, max_interactive");
        goto out;
    }
    int64_t id = 0;
    int rc = store_team_find(srv->db, name, &id);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no team named '%s'", name);
        goto out;
    }
    if (rc != STORE_OK) {
        unavailable(res);
        goto out;
    }
    if (set_g || set_q) {
        /* the guarantee may not exceed the quota */
        cJSON *cur = store_team_get(srv->db, id);
        if (!cur) {
            unavailable(res);
            goto out;
        }
        const cJSON *cq = cJSON_GetObjectItemCaseSensitive(cur, "quota");
        const cJSON *cg = cJSON_GetObjectItemCaseSensitive(cur, "guarantee");
        long q = set_q ? quota : (cJSON_IsNumber(cq) ? (long)cq->valuedouble : -1);
        long g = set_g ? guarantee : (cJSON_IsNumber(cg) ? (long)cg->valuedouble : 0);
        cJSON_Delete(cur);
        if (q >= 0 && g > q) {
            http_error(res, 422, "invalid_value", set_g ? "guarantee" : "quota",
                       "the guarantee (%ld) may not exceed the quota (%ld)", g, q);
            goto out;
        }
    }
    /* the shares and the storage quota together, or neither */
    if (db_begin(srv->db) < 0) {
        unavailable(res);
        goto out;
    }
    rc = STORE_OK;
    if ((set_w || set_g || set_q) &&
        cluster_team_set_shares(srv->db, name, weight, (int)guarantee, set_g, (int)quota, set_q) != 0)
        rc = STORE_ERROR;
    if (rc == STORE_OK && set_sq) rc = quota_team_set(srv->db, id, storage_quota);
    if (rc == STORE_OK && set_mi && cluster_team_set_max_interactive(srv->db, name, (int)max_inter) != 0)
        rc = STORE_ERROR;
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        unavailable(res);
        goto out;
    }
    char actor[96];
    http_actor(req, actor, sizeof actor);
    if (set_w || set_g || set_q || set_mi) {
        log_info("team %s shares changed by %s", name, actor);
        api_kick_scheduler(srv);
    }
    if (set_sq) {
        quota_forget(srv->db, id); /* the figure follows the committed quota */
        char qb[32] = "none";
        if (storage_quota >= 0) quota_fmt_bytes(storage_quota, qb, sizeof qb);
        log_info("team %s storage quota set to %s by %s", name, qb, actor);
    }
    cJSON *t = store_team_get(srv->db, id);
    if (!t || api_team_storage_json(srv, t) < 0) {
        cJSON_Delete(t);
        unavailable(res);
        goto out;
    }
    http_json(res, 200, t);
out:
    cJSON_Delete(body);
}

const route api_teams_routes[] = {
    {"GET", "/api/v1/teams", teams_list, ALLOW_USER, 0, ROLE_NONE},
    {"POST", "/api/v1/teams", teams_create, ALLOW_ADMIN, 0, ROLE_NONE},
    {"PATCH", "/api/v1/teams/{name}", team_patch, ALLOW_ADMIN, 0, ROLE_NONE},
    {"POST", "/api/v1/teams/{name}", team_patch, ALLOW_ADMIN, 0, ROLE_NONE},
    {"POST", "/api/v1/teams/{name}/tokens", team_token_create, ALLOW_USER, 0, ROLE_ADMIN},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
