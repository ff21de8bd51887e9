/* registry_api.c - a team's logins for private container registries, for
 * the images of its command jobs (docs/command-jobs.md, "Images").
 *
 *   PUT    /api/v1/registries/{host}  {"username", "password"}   (a team)
 *   GET    /api/v1/registries                                    (a team)
 *   DELETE /api/v1/registries/{host}                             (a team)
 *   GET    /api/v1/jobs/{id}/registry-auth                       (a task of the job)
 *
 * The password is sealed (AES-256-GCM, a key derived from DATA/attempt.key,
 * the row's team and host as associated data) before it is stored, and is
 * answered only to a task of one of the team's jobs whose image lives on
 * that registry, which hands it to podman in a file only root reads. No
 * answer to a person, no log line and no other team ever shows it. */
#include "registry_api.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/exec_store.h"
#include "../storage/registry_store.h"
#include "../storage/store.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#define SEAL_NONCE 12
#define SEAL_TAG 16
#define PASSWORD_MAX 1024

/* The sealing key: HMAC-SHA256(attempt key, a label), so a key file stolen
 * from one use opens no other. */
static void seal_key(const server *srv, unsigned char key[32]) {
    static const char label[] = "trainyard registry credentials v1";
    const void *part[1] = {label};
    const size_t len[1] = {sizeof label - 1};
    if (hmac_sha256(srv->attempt_key, sizeof srv->attempt_key, 1, part, len, key) < 0) abort(); /* OpenSSL broken */
}

static void seal_aad(int64_t team, const char *host, char *out, size_t cap) {
    snprintf(out, cap, "%lld|%s", (long long)team, host);
}

/* nonce || ciphertext || tag into out (cap >= len + 28). The length, or -1. */
static int seal(const server *srv, int64_t team, const char *host, const char *plain, unsigned char *out,
                size_t cap) {
    size_t n = strlen(plain);
    if (cap < n + SEAL_NONCE + SEAL_TAG) return -1;
    unsigned char key[32];
    char aad[REG_HOST_MAX + 32];
    seal_key(srv, key);
    seal_aad(team, host, aad, sizeof aad);
    if (getrandom(out, SEAL_NONCE, 0) != SEAL_NONCE) return -1;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, fin = 0, ok = c && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, out) == 1 &&
                                  EVP_EncryptUpdate(c, NULL, &len, (const unsigned char *)aad, (int)strlen(aad)) == 1 &&
                                  EVP_EncryptUpdate(c, out + SEAL_NONCE, &len, (const unsigned char *)plain, (int)n) == 1 &&
                                  EVP_EncryptFinal_ex(c, out + SEAL_NONCE + len, &fin) == 1 &&
                                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG, out + SEAL_NONCE + len + fin) == 1;
    EVP_CIPHER_CTX_free(c);
    OPENSSL_cleanse(key, sizeof key);
    return ok ? SEAL_NONCE + len + fin + SEAL_TAG : -1;
}

/* The password back into out (cap bytes, NUL-terminated): 0, or -1 when
 * the seal does not open (another server's key, a row moved). */
static int unseal(const server *srv, int64_t team, const char *host, const unsigned char *in, size_t n, char *out,
                  size_t cap) {
    if (n < SEAL_NONCE + SEAL_TAG || n - SEAL_NONCE - SEAL_TAG >= cap) return -1;
    unsigned char key[32];
    char aad[REG_HOST_MAX + 32];
    seal_key(srv, key);
    seal_aad(team, host, aad, sizeof aad);
    size_t clen = n - SEAL_NONCE - SEAL_TAG;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, fin = 0;
    int ok = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, in) == 1 &&
             EVP_DecryptUpdate(c, NULL, &len, (const unsigned char *)aad, (int)strlen(aad)) == 1 &&
             EVP_DecryptUpdate(c, (unsigned char *)out, &len, in + SEAL_NONCE, (int)clen) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG, (void *)(in + n - SEAL_TAG)) == 1 &&
             EVP_DecryptFinal_ex(c, (unsigned char *)out + len, &fin) == 1;
    EVP_CIPHER_CTX_free(c);
    OPENSSL_cleanse(key, sizeof key);
    if (!ok) {
        OPENSSL_cleanse(out, cap);
        return -1;
    }
    out[len + fin] = '\0';
    return 0;
}

/* A registry host as image references name it: letters, digits, '-', '.',
 * and an optional :port. */
static int valid_host(const char *h) {
    size_t n = strlen(h);
    if (n < 1 || n >= REG_HOST_MAX) return 0;
    const char *colon = strchr(h, ':');
    size_t hn = colon ? (size_t)(colon - h) : n;
    if (hn == 0 || h[0] == '-' || h[0] == '.') return 0;
    for (size_t i = 0; i < hn; i++)
        if (!((h[i] >= 'a' && h[i] <= 'z') || (h[i] >= 'A' && h[i] <= 'Z') || (h[i] >= '0' && h[i] <= '9') ||
              h[i] == '-' || h[i] == '.'))
            return 0;
    if (colon) {
        size_t pn = n - hn - 1;
        if (pn < 1 || pn > 5) return 0;
        for (size_t i = hn + 1; i < n; i++)
            if (h[i] < '0' || h[i] > '9') return 0;
    }
    return 1;
}

static int team_only(http_req *req, http_res *res) {
    if (req->who.kind != TOKEN_TEAM) {
        http_error(res, 403, "forbidden", NULL, "registry logins belong to a team: use the team's token");
        return -1;
    }
    return 0;
}

static int host_param(http_req *req, http_res *res) {
    if (!valid_host(req->params[0])) {
        http_error(res, 422, "invalid_value", "registry",
                   "a registry host is letters, digits, '-' and '.', with an optional :port (\"registry.example.com:5000\")");
        return -1;
    }
    return 0;
}

/* PUT /api/v1/registries/{host} {"username", "password"} */
static void registry_put(server *srv, http_req *req, http_res *res) {
    if (team_only(req, res) < 0 || host_param(req, res) < 0) return;
    const char *host = req->params[0];
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *user = NULL, *pw = NULL;
    for (const cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "username") == 0 || strcmp(f->string, "password") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", f->string, "%s must be a string", f->string);
                goto out;
            }
            if (f->string[0] == 'u') user = f->valuestring;
            else pw = f->valuestring;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: username, password)",
                       f->string);
            goto out;
        }
    }
    if (!user || !user[0] || strlen(user) >= REG_USER_MAX || strchr(user, ':')) {
        http_error(res, 422, user ? "invalid_value" : "missing_field", "username",
                   "username must be 1 to %d bytes without ':'", REG_USER_MAX - 1);
        goto out;
    }
    if (!pw || !pw[0] || strlen(pw) > PASSWORD_MAX) {
        http_error(res, 422, pw ? "invalid_value" : "missing_field", "password", "password must be 1 to %d bytes",
                   PASSWORD_MAX);
        goto out;
    }
    unsigned char sealed[REG_SEALED_MAX];
    int n = seal(srv, req->who.team_id, host, pw, sealed, sizeof sealed);
    OPENSSL_cleanse((void *)pw, strlen(pw));
    if (n < 0) {
        http_error(res, 500, "internal", NULL, "cannot seal the password");
        goto out;
    }
    int created = 0;
    if (reg_cred_put(srv->db, req->who.team_id, host, user, sealed, (size_t)n, now_ms(), &created) != STORE_OK) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        goto out;
    }
    log_info("team %s stored a login for registry %s (user %s)", req->who.team, host, user);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "registry", host);
    cJSON_AddStringToObject(o, "username", user);
    snprintf(res->location, sizeof res->location, "/api/v1/registries/%.200s", host);
    http_json(res, created ? 201 : 200, o);
out:
    cJSON_Delete(body);
}

/* GET /api/v1/registries */
static void registry_list(server *srv, http_req *req, http_res *res) {
    if (team_only(req, res) < 0) return;
    cJSON *arr = NULL;
    if (reg_cred_list(srv->db, req->who.team_id, &arr) != STORE_OK) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "registries", arr);
    http_json(res, 200, o);
}

/* DELETE /api/v1/registries/{host} */
static void registry_delete(server *srv, http_req *req, http_res *res) {
    if (team_only(req, res) < 0 || host_param(req, res) < 0) return;
    int rc = reg_cred_delete(srv->db, req->who.team_id, req->params[0]);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "the team has no login for registry %.200s", req->params[0]);
        return;
    }
    if (rc != STORE_OK) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "registry", req->params[0]);
    cJSON_AddBoolToObject(o, "deleted", 1);
    http_json(res, 200, o);
}

/* GET /api/v1/jobs/{id}/registry-auth (a task of that job): the team's
 * login for the registry of the job's image; 404 when it has none. */
static void registry_auth(server *srv, http_req *req, http_res *res) {
    int64_t id = http_param_id(req, res, 0, "job");
    if (id < 0) return;
    if (req->who.kind != TOKEN_TASK || req->who.job_id != id) {
        http_error(res, 404, "not_found", NULL, "no job %lld", (long long)id);
        return;
    }
    exec_job j;
    int rc = exec_store_job_get(srv->db, id, 1, &j);
    if (rc != STORE_OK) {
        http_error(res, rc == STORE_NOT_FOUND ? 404 : 503, rc == STORE_NOT_FOUND ? "not_found" : "unavailable", NULL,
                   rc == STORE_NOT_FOUND ? "no such job" : "the database is busy or unavailable; retry");
        return;
    }
    jobspec *spec = xcalloc(1, sizeof *spec);
    spec_error se;
    char host[256] = "";
    if (jobspec_parse(j.spec, strlen(j.spec), spec, &se) == 0) {
        if (spec->environment.image[0]) jobspec_image_registry(spec->environment.image, host, sizeof host);
        jobspec_release(spec);
    }
    free(spec);
    exec_store_job_release(&j);
    reg_cred c;
    rc = host[0] ? reg_cred_get(srv->db, req->who.team_id, host, &c) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "the team has no login for the job's registry");
        return;
    }
    if (rc != STORE_OK) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    char pw[PASSWORD_MAX + 1];
    if (unseal(srv, req->who.team_id, host, c.sealed, c.sealed_len, pw, sizeof pw) < 0) {
        log_warn("the login of team %s for registry %s does not open with this server's key: stored again?",
                 req->who.team, host);
        http_error(res, 404, "not_found", NULL, "the team's login for the job's registry cannot be read; store it again");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "registry", host);
    cJSON_AddStringToObject(o, "username", c.username);
    cJSON_AddStringToObject(o, "password", pw);
    OPENSSL_cleanse(pw, sizeof pw);
    http_json(res, 200, o);
}

const route api_registry_routes[] = {
    {"PUT", "/api/v1/registries/{host}", registry_put, ALLOW_TEAM | ALLOW_ADMIN, 0, ROLE_ADMIN},
    {"GET", "/api/v1/registries", registry_list, ALLOW_TEAM | ALLOW_ADMIN, 0, ROLE_ADMIN},
    {"DELETE", "/api/v1/registries/{host}", registry_delete, ALLOW_TEAM | ALLOW_ADMIN, 0, ROLE_ADMIN},
    {"GET", "/api/v1/jobs/{id}/registry-auth", registry_auth, ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
