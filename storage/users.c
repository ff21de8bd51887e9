/* users.c - users, members, personal tokens, sessions, audit (see users.h). */
#include "users.h"

#include <ctype.h>
#include <string.h>
#include <openssl/crypto.h>


int users_name_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > 63 || !isalnum((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

/* ---------------------------------------------------------------- users */

static const char SQL_USER_INSERT[] =
    "INSERT INTO users(name, email, source, created_at) VALUES(?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id";
static const char SQL_USER_FIND[] = "SELECT id FROM users WHERE name = ?";

int users_create(db *d, const char *name, const char *email, const char *source, int64_t *id) {
    db_stmt *st = db_prepare(d, SQL_USER_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, name, -1);
    if (email && email[0]) db_bind_text(st, 2, email, -1);
    db_bind_text(st, 3, source, -1);
    db_bind_int64(st, 4, now_ms());
    return store_step_id(st, id); /* no row: the name (or the email) is taken */
}

int users_find(db *d, const char *name, int64_t *id) {
    db_stmt *st = db_prepare(d, SQL_USER_FIND);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, name, -1);
    int rc = db_step(st);
    if (rc == DB_ROW && id) *id = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_USER_LOGIN[] =
    "UPDATE users SET last_login_at = ?2, email = coalesce(?3, email) WHERE id = ?1";

int users_signed_in(db *d, const char *name, const char *email, int64_t *id, int *created) {
    *created = 0;
    int rc = users_find(d, name, id);
    if (rc == STORE_NOT_FOUND) {
        rc = users_create(d, name, email, "oidc", id);
        if (rc == STORE_CONFLICT) rc = users_find(d, name, id); /* made meanwhile */
        else if (rc == STORE_OK) *created = 1;
    }
    if (rc != STORE_OK) return rc;
    db_stmt *st = db_prepare(d, SQL_USER_LOGIN);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, *id);
    db_bind_int64(st, 2, now_ms());
    if (email && email[0]) db_bind_text(st, 3, email, -1);
    return store_step_done(st);
}

static const char SQL_USERS[] =
    "SELECT u.id, u.name, u.email, u.source, u.created_at, u.last_login_at,"
    " (SELECT json_group_array(json_object('team', t.name, 'role', m.role, 'source', m.source))"
    "  FROM members m JOIN teams t ON t.id = m.team_id WHERE m.user_id = u.id)"
    " FROM users u WHERE (?1 = 0 OR u.id = ?1) ORDER BY u.name";
static const char SQL_USERS_PG[] =
    "SELECT u.id, u.name, u.email, u.source, u.created_at, u.last_login_at,"
    " (SELECT coalesce(json_agg(json_build_object('team', t.name, 'role', m.role, 'source', m.source)"
    "   ORDER BY m.team_id), '[]')::text"
    "  FROM members m JOIN teams t ON t.id = m.team_id WHERE m.user_id = u.id)"
    " FROM users u WHERE ($1 = 0 OR u.id = $1) ORDER BY u.name";

static cJSON *user_row(db_stmt *st) {
    cJSON *u = cJSON_CreateObject();
    store_json_text(u, "name", st, 1);
    store_json_text(u, "email", st, 2);
    store_json_text(u, "source", st, 3);
    store_json_time(u, "created_at", st, 4);
    store_json_time(u, "last_login_at", st, 5);
    const char *teams = db_col_text(st, 6);
    cJSON *t = teams ? cJSON_Parse(teams) : NULL;
    cJSON_AddItemToObject(u, "teams", t ? t : cJSON_CreateArray());
    return u;
}

cJSON *users_list(db *d) {
    db_stmt *st = db_prepare2(d, SQL_USERS, SQL_USERS_PG);
    if (!st) return NULL;
    db_bind_int64(st, 1, 0);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) cJSON_AddItemToArray(arr, user_row(st));
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

cJSON *users_get(db *d, int64_t id) {
    db_stmt *st = db_prepare2(d, SQL_USERS, SQL_USERS_PG);
    if (!st) return NULL;
    db_bind_int64(st, 1, id);
    cJSON *u = db_step(st) == DB_ROW ? user_row(st) : NULL;
    db_done(st);
    return u;
}

/* ---------------------------------------------------------------- members */

static const char SQL_MEMBER_GET[] = "SELECT role, source FROM members WHERE team_id = ? AND user_id = ?";
static const char SQL_MEMBER_PUT[] =
    "INSERT INTO members(team_id, user_id, role, source, created_at) VALUES(?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT(team_id, user_id) DO UPDATE SET role = ?3, source = ?4";
static const char SQL_MEMBER_DELETE[] = "DELETE FROM members WHERE team_id = ? AND user_id = ?";

int members_role(db *d, int64_t team_id, int64_t user_id, team_role *role) {
    db_stmt *st = db_prepare(d, SQL_MEMBER_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, user_id);
    int rc = db_step(st);
    *role = ROLE_NONE;
    if (rc == DB_ROW && role_parse(db_col_text(st, 0), role) < 0) *role = ROLE_NONE;
    db_done(st);
    return rc == DB_ROW || rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

int members_put(db *d, int64_t team_id, int64_t user_id, team_role role, const char *source, int *created) {
    team_role old;
    if (members_role(d, team_id, user_id, &old) != STORE_OK) return STORE_ERROR;
    if (created) *created = old == ROLE_NONE;
    db_stmt *st = db_prepare(d, SQL_MEMBER_PUT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, user_id);
    db_bind_text_static(st, 3, role_name(role), -1);
    db_bind_text(st, 4, source, -1);
    db_bind_int64(st, 5, now_ms());
    return store_step_done(st);
}

int members_delete(db *d, int64_t team_id, int64_t user_id) {
    db_stmt *st = db_prepare(d, SQL_MEMBER_DELETE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, user_id);
    int rc = store_step_done(st);
    if (rc == STORE_OK && db_changes(d) == 0) return STORE_NOT_FOUND;
    return rc;
}

static const char SQL_MEMBERS[] =
    "SELECT u.name, u.email, m.role, m.source, m.created_at FROM members m JOIN users u ON u.id = m.user_id"
    " WHERE m.team_id = ? ORDER BY u.name";

cJSON *members_list(db *d, int64_t team_id) {
    db_stmt *st = db_prepare(d, SQL_MEMBERS);
    if (!st) return NULL;
    db_bind_int64(st, 1, team_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *m = cJSON_CreateObject();
        store_json_text(m, "user", st, 0);
        store_json_text(m, "email", st, 1);
        store_json_text(m, "role", st, 2);
        store_json_text(m, "source", st, 3);
        store_json_time(m, "since", st, 4);
        cJSON_AddItemToArray(arr, m);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

static const char SQL_USER_TEAMS[] =
    "SELECT t.id, t.name, m.role, m.source FROM members m JOIN teams t ON t.id = m.team_id"
    " WHERE m.user_id = ? ORDER BY t.name";

cJSON *members_teams(db *d, int64_t user_id) {
    db_stmt *st = db_prepare(d, SQL_USER_TEAMS);
    if (!st) return NULL;
    db_bind_int64(st, 1, user_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *m = cJSON_CreateObject();
        store_json_text(m, "team", st, 1);
        store_json_text(m, "role", st, 2);
        store_json_text(m, "source", st, 3);
        cJSON_AddItemToArray(arr, m);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

int members_only_team(db *d, int64_t user_id, int64_t *team_id, char team[64], team_role *role) {
    db_stmt *st = db_prepare(d, SQL_USER_TEAMS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, user_id);
    int n = 0, rc;
    while (n < 2 && (rc = db_step(st)) == DB_ROW) {
        if (n++ == 0) {
            *team_id = db_col_int64(st, 0);
            const char *t = db_col_text(st, 1);
            snprintf(team, 64, "%s", t ? t : "");
            if (role_parse(db_col_text(st, 2), role) < 0) *role = ROLE_NONE;
        }
    }
    if (n < 2 && rc != DB_DONE) {
        db_done(st);
        return STORE_ERROR;
    }
    db_done(st);
    return n == 1 ? STORE_OK : n == 0 ? STORE_NOT_FOUND : STORE_CONFLICT;
}

static const char SQL_MEMBERS_OIDC[] = "SELECT team_id FROM members WHERE user_id = ? AND source = 'oidc'";

int members_sync(db *d, int64_t user_id, const member_grant *g, int n, int *skipped) {
    int own = !db_in_tx(d);
    if (own && db_begin(d) < 0) return STORE_ERROR;
    int rc = STORE_OK;
    int64_t kept[64];
    int nkept = 0;
    *skipped = 0;
    for (int i = 0; rc == STORE_OK && i < n; i++) {
        int64_t team_id;
        int f = store_team_find(d, g[i].team, &team_id);
        if (f == STORE_NOT_FOUND) {
            (*skipped)++;
            continue;
        }
        if (f != STORE_OK) {
            rc = STORE_ERROR;
            break;
        }
        db_stmt *st = db_prepare(d, SQL_MEMBER_GET);
        if (!st) {
            rc = STORE_ERROR;
            break;
        }
        db_bind_int64(st, 1, team_id);
        db_bind_int64(st, 2, user_id);
        int api = db_step(st) == DB_ROW && strcmp(db_col_text(st, 1), "api") == 0;
        db_done(st);
        if (nkept < 64) kept[nkept++] = team_id;
        if (!api) rc = members_put(d, team_id, user_id, g[i].role, "oidc", NULL);
    }
    /* what the claim no longer gives */
    int64_t gone[64];
    int ngone = 0;
    db_stmt *st = rc == STORE_OK ? db_prepare(d, SQL_MEMBERS_OIDC) : NULL;
    if (rc == STORE_OK && !st) rc = STORE_ERROR;
    if (st) {
        db_bind_int64(st, 1, user_id);
        while (db_step(st) == DB_ROW && ngone < 64) {
            int64_t t = db_col_int64(st, 0);
            int keep = 0;
            for (int k = 0; k < nkept; k++) keep |= kept[k] == t;
            if (!keep) gone[ngone++] = t;
        }
        db_done(st);
    }
    for (int i = 0; rc == STORE_OK && i < ngone; i++) {
        int r = members_delete(d, gone[i], user_id);
        if (r != STORE_OK && r != STORE_NOT_FOUND) rc = r;
    }
    if (own) {
        if (rc != STORE_OK) db_rollback(d);
        else if (db_commit(d) < 0) rc = STORE_ERROR;
    }
    return rc;
}

/* ---------------------------------------------------------------- tokens and sessions */

static int make_secret(const char *prefix, char out[UTOK_LEN]) {
    char raw[64];
    if (random_token(raw, sizeof raw) < 0) return -1; /* "ty_" + 43 */
    snprintf(out, UTOK_LEN, "%.4s%.43s", prefix, raw + 3);
    return 0;
}

static const char SQL_UTOK_INSERT[] =
    "INSERT INTO user_tokens(hash, kind, user_id, name, team_id, scopes, via, created_at, expires_at)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id";

static const char *scopes_text(unsigned s) {
    return (s & SCOPE_WRITE) && (s & SCOPE_READ) ? "read,write" : (s & SCOPE_WRITE) ? "write" : "read";
}

int utok_create(db *d, int64_t user_id, const utok_new *n, char token[UTOK_LEN], int64_t *id) {
    char hash[65];
    if (make_secret(n->session ? SESSION_PREFIX : USER_TOKEN_PREFIX, token) < 0) return STORE_ERROR;
    sha256_hex(token, strlen(token), hash);
    db_stmt *st = db_prepare(d, SQL_UTOK_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    db_bind_text_static(st, 2, n->session ? "session" : "token", -1);
    db_bind_int64(st, 3, user_id);
    db_bind_text(st, 4, n->name ? n->name : "", -1);
    if (n->team_id > 0) db_bind_int64(st, 5, n->team_id);
    db_bind_text_static(st, 6, scopes_text(n->scopes), -1);
    db_bind_text(st, 7, n->via ? n->via : "api", -1);
    db_bind_int64(st, 8, now_ms());
    db_bind_int64(st, 9, n->expires_at);
    int rc = store_step_id(st, id);
    return rc == STORE_CONFLICT ? STORE_ERROR : rc;
}

static const char SQL_UTOK_LOOKUP[] =
    "SELECT k.id, k.kind, k.user_id, u.name, k.team_id, coalesce(t.name, ''), k.scopes, k.via, k.expires_at, k.hash"
    " FROM user_tokens k JOIN users u ON u.id = k.user_id LEFT JOIN teams t ON t.id = k.team_id"
    " WHERE k.hash = ? AND k.revoked_at IS NULL";

int utok_lookup(db *d, const char *token, principal *who) {
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    db_stmt *st = db_prepare(d, SQL_UTOK_LOOKUP);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    int rc = db_step(st);
    int ret = rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    if (rc == DB_ROW) {
        const char *stored = db_col_text(st, 9);
        if (stored && strlen(stored) == 64 && CRYPTO_memcmp(stored, hash, 64) == 0) {
            memset(who, 0, sizeof *who);
            who->kind = TOKEN_USER;
            who->token_id = db_col_int64(st, 0);
            const char *kind = db_col_text(st, 1);
            who->session = kind && strcmp(kind, "session") == 0;
            who->user_id = db_col_int64(st, 2);
            const char *u = db_col_text(st, 3);
            snprintf(who->user, sizeof who->user, "%s", u ? u : "");
            who->token_team = db_col_int64(st, 4);
            if (who->token_team > 0) {
                who->team_id = who->token_team;
                const char *t = db_col_text(st, 5);
                snprintf(who->team, sizeof who->team, "%s", t ? t : "");
            }
            const char *sc = db_col_text(st, 6);
            who->scopes = (sc && strstr(sc, "read") ? SCOPE_READ : 0) | (sc && strstr(sc, "write") ? SCOPE_WRITE : 0);
            const char *via = db_col_text(st, 7);
            snprintf(who->via, sizeof who->via, "%s", via ? via : "api");
            who->expires_at = db_col_int64(st, 8);
            ret = who->expires_at > 0 && now_ms() >= who->expires_at ? STORE_EXPIRED : STORE_OK;
        } else {
            ret = STORE_NOT_FOUND;
        }
    }
    db_done(st);
    return ret;
}

void utok_csrf_of(const char *session, char out[65]) {
    char in[UTOK_LEN + 8];
    int n = snprintf(in, sizeof in, "csrf:%s", session);
    sha256_hex(in, n > 0 && (size_t)n < sizeof in ? (size_t)n : 0, out);
}

int utok_csrf_ok(const char *session, const char *csrf) {
    if (!session || !csrf || strlen(csrf) != 64) return 0;
    char want[65];
    utok_csrf_of(session, want);
    return CRYPTO_memcmp(want, csrf, 64) == 0;
}

static const char SQL_UTOK_LIST[] =
    "SELECT k.id, k.name, t.name, k.scopes, k.via, k.created_at, k.expires_at, u.at, k.revoked_at"
    " FROM user_tokens k LEFT JOIN teams t ON t.id = k.team_id LEFT JOIN token_use u ON u.token_id = k.id"
    " WHERE k.user_id = ? AND k.kind = 'token' ORDER BY k.id DESC LIMIT 1000";

cJSON *utok_list(db *d, int64_t user_id) {
    db_stmt *st = db_prepare(d, SQL_UTOK_LIST);
    if (!st) return NULL;
    db_bind_int64(st, 1, user_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", (double)db_col_int64(st, 0));
        store_json_text(t, "name", st, 1);
        store_json_text(t, "team", st, 2);
        cJSON *sc = cJSON_AddArrayToObject(t, "scopes");
        const char *s = db_col_text(st, 3);
        if (s && strstr(s, "read")) cJSON_AddItemToArray(sc, cJSON_CreateString("read"));
        if (s && strstr(s, "write")) cJSON_AddItemToArray(sc, cJSON_CreateString("write"));
        store_json_text(t, "via", st, 4);
        store_json_time(t, "created_at", st, 5);
        store_json_time(t, "expires_at", st, 6);
        store_json_time(t, "last_used_at", st, 7);
        store_json_time(t, "revoked_at", st, 8);
        int64_t exp = db_col_int64(st, 6);
        cJSON_AddBoolToObject(t, "active",
                              db_col_type(st, 8) == DB_NULL && (exp <= 0 || exp > now_ms()));
        cJSON_AddItemToArray(arr, t);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

static const char SQL_UTOK_REVOKE[] =
    "UPDATE user_tokens SET revoked_at = ?3 WHERE id = ?1 AND (?2 = 0 OR user_id = ?2) AND revoked_at IS NULL";
static const char SQL_UTOK_REVOKE_VALUE[] =
    "UPDATE user_tokens SET revoked_at = ?2 WHERE hash = ?1 AND revoked_at IS NULL";

int utok_revoke(db *d, int64_t user_id, int64_t id) {
    db_stmt *st = db_prepare(d, SQL_UTOK_REVOKE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_int64(st, 2, user_id);
    db_bind_int64(st, 3, now_ms());
    int rc = store_step_done(st);
    if (rc == STORE_OK && db_changes(d) == 0) return STORE_NOT_FOUND;
    return rc;
}

int utok_revoke_value(db *d, const char *token) {
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    db_stmt *st = db_prepare(d, SQL_UTOK_REVOKE_VALUE);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    db_bind_int64(st, 2, now_ms());
    int rc = store_step_done(st);
    if (rc == STORE_OK && db_changes(d) == 0) return STORE_NOT_FOUND;
    return rc;
}

static const char SQL_UTOK_TOUCH[] =
    "INSERT INTO token_use(token_id, at) VALUES(?1, ?2)"
    " ON CONFLICT(token_id) DO UPDATE SET at = ?2 WHERE token_use.at < ?2 - 60000";

/* Each thread remembers the last uses it wrote, so a busy token costs a
 * write a minute, not one a request. */
#define TOUCH_SLOTS 64
static __thread int64_t t_touch_id[TOUCH_SLOTS], t_touch_at[TOUCH_SLOTS];

void utok_touch(db *d, int64_t token_id) {
    int64_t now = now_ms();
    size_t s = (size_t)token_id % TOUCH_SLOTS;
    if (t_touch_id[s] == token_id && now - t_touch_at[s] < 60000) return;
    t_touch_id[s] = token_id;
    t_touch_at[s] = now;
    db_stmt *st = db_prepare(d, SQL_UTOK_TOUCH);
    if (!st) return;
    db_bind_int64(st, 1, token_id);
    db_bind_int64(st, 2, now);
    (void)store_step_done(st); /* a lost "last used" is no failure of the request */
}

