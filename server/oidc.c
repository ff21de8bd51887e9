/* oidc.c - the OpenID Connect relying party (oidc.h; docs/sso.md). */
#include "oidc.h"

#include <cjose/cjose.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/errbuf.h"
#include "../common/util.h"

#define OIDC_BODY_MAX (1u << 20)
#define OIDC_MAX_KEYS 64
#define OIDC_MAX_ALGS 16
#define OIDC_LOGINS 1024
#define OIDC_LOGIN_LIFE_MS (10 * 60 * 1000)
#define OIDC_NONCES 4096
#define OIDC_JWKS_MIN_MS (10 * 1000)
#define OIDC_RETURN_MAX 1024

typedef struct login {
    char state[48];
    char nonce[48];
    char verifier[48];
    char return_to[OIDC_RETURN_MAX];
    int64_t expires_ms; /* mono_ms; 0: a free slot */
} login;

typedef struct used_nonce {
    char nonce[128];
    int64_t exp_s; /* 0: a free slot */
} used_nonce;

struct oidc {
    pthread_mutex_t mu;
    char *issuer, *client_id, *client_secret, *redirect_uri, *groups_claim;
    int64_t skew_s;
    char *authorization_ep, *token_ep, *jwks_uri, *device_ep; /* device_ep may be NULL */
    int auth_post;     /* client_secret_post rather than client_secret_basic */
    int scope_groups;  /* the provider lists a "groups" scope */
    int nalgs;
    char algs[OIDC_MAX_ALGS][16];
    /* the JWKS, under mu */
    int nkeys;
    cjose_jwk_t *keys[OIDC_MAX_KEYS];
    char *kids[OIDC_MAX_KEYS]; /* NULL: the key has none */
    int64_t jwks_refreshed_ms; /* mono_ms of the last re-fetch for an unknown kid; 0: none yet */
    login logins[OIDC_LOGINS];
    used_nonce nonces[OIDC_NONCES];
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---------------------------------------------------------------- encoding */

/* base64url without padding of n bytes into out (4 * ceil(n / 3) + 1 bytes). */
static void b64url(const unsigned char *p, size_t n, char *out) {
    int len = EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    while (len > 0 && out[len - 1] == '=') len--;
    out[len] = '\0';
    for (int i = 0; i < len; i++) {
        if (out[i] == '+') out[i] = '-';
        else if (out[i] == '/') out[i] = '_';
    }
}

/* 32 random bytes as 43 url-safe characters into out (48 bytes). */
static int random_b64url(char out[48]) {
    unsigned char r[32];
    if (RAND_bytes(r, sizeof r) != 1) return -1;
    b64url(r, sizeof r, out);
    return 0;
}

/* Appends s percent-encoded (RFC 3986: all but the unreserved characters). */
static int buf_append_pct(buf *b, const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int unreserved = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                         *p == '-' || *p == '.' || *p == '_' || *p == '~';
        char e[3] = {'%', hex[*p >> 4], hex[*p & 15]};
        if (unreserved ? buf_append(b, p, 1) : buf_append(b, e, 3)) return -1;
    }
    return 0;
}

/* "&name=value" (no "&" when first), value percent-encoded. */
static int buf_param(buf *b, int first, const char *name, const char *value) {
    if (!first && buf_appends(b, "&")) return -1;
    if (buf_appends(b, name) || buf_appends(b, "=")) return -1;
    return buf_append_pct(b, value);
}

/* ---------------------------------------------------------------- HTTP */

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    buf *b = ud;
    size_t n = size * nmemb;
    return buf_append(b, p, n) == 0 ? n : 0;
}

/* GET url (form NULL) or POST form (urlencoded; authenticated as the
 * client with basic when basic), with timeout_ms. Returns the parsed JSON
 * answer and *status, or NULL with err ("oidc: URL: why"); an answer that
 * is not JSON is an error only when it came with a 2xx status (*json_out
 * NULL otherwise, status set). */
static int http_json(const oidc *o, const char *url, const char *form, int basic, long timeout_ms, long *status,
                     cJSON **json_out, char *err, size_t errlen) {
    pthread_once(&g_once, global_init);
    *json_out = NULL;
    *status = 0;
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "oidc: %s: curl_easy_init failed", url);
        return -1;
    }
    buf body;
    buf_init(&body, OIDC_BODY_MAX);
    buf user, pass;
    buf_init(&user, 4096);
    buf_init(&pass, 4096);
    struct curl_slist *hdr = curl_slist_append(NULL, "Accept: application/json");
    int rc = -1;
    if (!hdr) {
        snprintf(err, errlen, "oidc: %s: out of memory", url);
        goto out;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (form) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, form);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(form));
    }
    if (basic) {
        /* RFC 6749, 2.3.1: id and secret form-encoded, then basic */
        if (buf_append_pct(&user, o->client_id) || buf_append_pct(&pass, o->client_secret)) {
            snprintf(err, errlen, "oidc: %s: the client id or secret is too long", url);
            goto out;
        }
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        curl_easy_setopt(h, CURLOPT_USERNAME, user.data);
        curl_easy_setopt(h, CURLOPT_PASSWORD, pass.data);
    }
    CURLcode cc = curl_easy_perform(h);
    if (cc != CURLE_OK) {
        long os_errno = 0;
        if (curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &os_errno) != CURLE_OK) os_errno = 0;
        if (cc == CURLE_WRITE_ERROR)
            snprintf(err, errlen, "oidc: %s: the answer is over %u bytes", url, OIDC_BODY_MAX);
        else if (cc == CURLE_COULDNT_CONNECT && os_errno)
            snprintf(err, errlen, "oidc: %s: %s", url, strerror((int)os_errno));
        else
            snprintf(err, errlen, "oidc: %s: %s", url, curl_easy_strerror(cc));
        goto out;
    }
    if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status) != CURLE_OK) *status = 0;
    *json_out = cJSON_ParseWithLength(body.data ? body.data : "", body.len);
    if (*status >= 200 && *status < 300 && !cJSON_IsObject(*json_out)) {
        snprintf(err, errlen, "oidc: %s: HTTP %ld, the answer is not a JSON object", url, *status);
        cJSON_Delete(*json_out);
        *json_out = NULL;
        goto out;
    }
    rc = 0;
out:
    curl_slist_free_all(hdr);
    buf_release(&body);
    buf_release(&user);
    buf_release(&pass);
    curl_easy_cleanup(h);
    return rc;
}

/* ---------------------------------------------------------------- discovery and JWKS */

static const char *json_str(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

static int is_http_url(const char *s) { return s && (!strncmp(s, "https://", 8) || !strncmp(s, "http://", 7)); }

static int list_has(const cJSON *arr, const char *s) {
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) if (cJSON_IsString(v) && !strcmp(v->valuestring, s)) return 1;
    return 0;
}

static void keys_clear(oidc *o) {
    for (int i = 0; i < o->nkeys; i++) {
        cjose_jwk_release(o->keys[i]);
        free(o->kids[i]);
    }
    o->nkeys = 0;
}

/* Fetches the JWKS and replaces the keys (kept as they were on failure).
 * Keys for encryption ("use": "enc") and of types cjose cannot import are
 * left out. 0, or -1 with err. Called with mu held, or before o is shared. */
static int jwks_fetch(oidc *o, char *err, size_t errlen) {
    long status;
    cJSON *j;
    if (http_json(o, o->jwks_uri, NULL, 0, 5000, &status, &j, err, errlen) < 0) return -1;
    int rc = -1;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "keys");
    if (status != 200) {
        snprintf(err, errlen, "oidc: %s: HTTP %ld", o->jwks_uri, status);
        goto out;
    }
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "oidc: %s: no \"keys\" array", o->jwks_uri);
        goto out;
    }
    cjose_jwk_t *keys[OIDC_MAX_KEYS];
    char *kids[OIDC_MAX_KEYS];
    int n = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, arr) {
        const char *use = json_str(k, "use");
        if (n == OIDC_MAX_KEYS || (use && strcmp(use, "sig"))) continue;
        char *text = cJSON_PrintUnformatted(k);
        if (!text) continue;
        cjose_err cerr;
        cjose_jwk_t *jwk = cjose_jwk_import(text, strlen(text), &cerr);
        cJSON_free(text);
        if (!jwk) {
            log_warn("oidc: %s: a key is left out (%s)", o->jwks_uri, cjose_err_message(cerr.code));
            continue;
        }
        const char *kid = json_str(k, "kid");
        keys[n] = jwk;
        kids[n] = kid ? xstrdup(kid) : NULL;
        n++;
    }
    if (n == 0) {
        snprintf(err, errlen, "oidc: %s: no signing key this relying party can use", o->jwks_uri);
        goto out;
    }
    keys_clear(o);
    memcpy(o->keys, keys, sizeof keys[0] * (size_t)n);
    memcpy(o->kids, kids, sizeof kids[0] * (size_t)n);
    o->nkeys = n;
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

static int discover(oidc *o, char *err, size_t errlen) {
    buf url;
    buf_init(&url, 4096);
    size_t il = strlen(o->issuer);
    while (il > 0 && o->issuer[il - 1] == '/') il--;
    if (buf_append(&url, o->issuer, il) || buf_appends(&url, "/.well-known/openid-configuration")) {
        snprintf(err, errlen, "oidc: the issuer is too long");
        buf_release(&url);
        return -1;
    }
    long status;
    cJSON *d = NULL;
    int rc = -1;
    if (http_json(o, url.data, NULL, 0, 5000, &status, &d, err, errlen) < 0) goto out;
    if (status != 200) {
        snprintf(err, errlen, "oidc: %s: HTTP %ld", url.data, status);
        goto out;
    }
    const char *iss = json_str(d, "issuer");
    if (!iss || strcmp(iss, o->issuer)) {
        snprintf(err, errlen, "oidc: %s: the provider names itself '%.200s', not the configured issuer '%.200s'",
                 url.data, iss ? iss : "", o->issuer);
        goto out;
    }
    const char *names[] = {"authorization_endpoint", "token_endpoint", "jwks_uri"};
    char **dst[] = {&o->authorization_ep, &o->token_ep, &o->jwks_uri};
    for (int i = 0; i < 3; i++) {
        const char *v = json_str(d, names[i]);
        if (!is_http_url(v)) {
            snprintf(err, errlen, "oidc: %s: no http(s) %s", url.data, names[i]);
            goto out;
        }
        *dst[i] = xstrdup(v);
    }
    const char *dev = json_str(d, "device_authorization_endpoint");
    if (is_http_url(dev)) o->device_ep = xstrdup(dev);
    const cJSON *algs = cJSON_GetObjectItemCaseSensitive(d, "id_token_signing_alg_values_supported");
    const cJSON *a;
    cJSON_ArrayForEach(a, algs) {
        if (cJSON_IsString(a) && o->nalgs < OIDC_MAX_ALGS && strlen(a->valuestring) < sizeof o->algs[0])
            snprintf(o->algs[o->nalgs++], sizeof o->algs[0], "%s", a->valuestring);
    }
    if (o->nalgs == 0) {
        snprintf(err, errlen, "oidc: %s: no id_token_signing_alg_values_supported", url.data);
        goto out;
    }
    const cJSON *pkce = cJSON_GetObjectItemCaseSensitive(d, "code_challenge_methods_supported");
    if (pkce && !list_has(pkce, "S256")) {
        snprintf(err, errlen, "oidc: %s: the provider does not support PKCE S256", url.data);
        goto out;
    }
    const cJSON *auth = cJSON_GetObjectItemCaseSensitive(d, "token_endpoint_auth_methods_supported");
    if (auth && !list_has(auth, "client_secret_basic")) {
        if (!list_has(auth, "client_secret_post")) {
            snprintf(err, errlen, "oidc: %s: neither client_secret_basic nor client_secret_post is supported",
                     url.data);
            goto out;
        }
        o->auth_post = 1;
    }
    o->scope_groups = list_has(cJSON_GetObjectItemCaseSensitive(d, "scopes_supported"), "groups");
    rc = jwks_fetch(o, err, errlen);
out:
    cJSON_Delete(d);
    buf_release(&url);
    return rc;
}

oidc *oidc_new(const oidc_config *c, char *err, size_t errlen) {
    const char *need[] = {c->issuer, c->client_id, c->client_secret, c->redirect_uri};
    const char *what[] = {"issuer", "client_id", "client_secret", "redirect_uri"};
    for (int i = 0; i < 4; i++) {
        if (!need[i] || !need[i][0]) {
            snprintf(err, errlen, "oidc: no %s configured", what[i]);
            return NULL;
        }
    }
    if (!is_http_url(c->issuer)) {
        snprintf(err, errlen, "oidc: the issuer '%.200s' is not an http(s) URL", c->issuer);
        return NULL;
    }
    oidc *o = xcalloc(1, sizeof *o);
    if (pthread_mutex_init(&o->mu, NULL) != 0) {
        snprintf(err, errlen, "oidc: pthread_mutex_init failed");
        free(o);
        return NULL;
    }
    o->issuer = xstrdup(c->issuer);
    o->client_id = xstrdup(c->client_id);
    o->client_secret = xstrdup(c->client_secret);
    o->redirect_uri = xstrdup(c->redirect_uri);
    o->groups_claim = xstrdup(c->groups_claim && c->groups_claim[0] ? c->groups_claim : "groups");
    o->skew_s = c->skew_s > 0 ? c->skew_s : 60;
    if (discover(o, err, errlen) < 0) {
        oidc_free(o);
        return NULL;
    }
    return o;
}

void oidc_free(oidc *o) {
    if (!o) return;
    keys_clear(o);
    free(o->issuer);
    free(o->client_id);
    free(o->client_secret);
    free(o->redirect_uri);
    free(o->groups_claim);
    free(o->authorization_ep);
    free(o->token_ep);
    free(o->jwks_uri);
    free(o->device_ep);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

/* ---------------------------------------------------------------- login: state, nonce, PKCE */

static const char *scopes(const oidc *o) { return o->scope_groups ? "openid profile email groups" : "openid profile email"; }

static int return_to_ok(const char *s) {
    if (s[0] != '/' || s[1] == '/' || s[1] == '\\' || strlen(s) >= OIDC_RETURN_MAX) return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return 0;
    return 1;
}

int oidc_login_url(oidc *o, const char *return_to, char *url, size_t n) {
    if (!return_to) return_to = "/";
    if (!return_to_ok(return_to)) return -1;
    login l;
    memset(&l, 0, sizeof l);
    if (random_b64url(l.state) || random_b64url(l.nonce) || random_b64url(l.verifier)) return -1;
    snprintf(l.return_to, sizeof l.return_to, "%s", return_to);
    unsigned char dig[32];
    unsigned int dlen = 0;
    if (EVP_Digest(l.verifier, strlen(l.verifier), dig, &dlen, EVP_sha256(), NULL) != 1 || dlen != 32) return -1;
    char challenge[48];
    b64url(dig, sizeof dig, challenge);

    buf b;
    buf_init(&b, n ? n - 1 : 0);
    int bad = buf_appends(&b, o->authorization_ep) || buf_appends(&b, strchr(o->authorization_ep, '?') ? "&" : "?") ||
              buf_param(&b, 1, "response_type", "code") || buf_param(&b, 0, "client_id", o->client_id) ||
              buf_param(&b, 0, "redirect_uri", o->redirect_uri) || buf_param(&b, 0, "scope", scopes(o)) ||
              buf_param(&b, 0, "state", l.state) || buf_param(&b, 0, "nonce", l.nonce) ||
              buf_param(&b, 0, "code_challenge", challenge) || buf_param(&b, 0, "code_challenge_method", "S256");
    if (bad || n == 0) {
        buf_release(&b);
        return -1;
    }
    memcpy(url, b.data, b.len + 1);
    buf_release(&b);

    pthread_mutex_lock(&o->mu);
    int64_t now = mono_ms();
    int slot = -1, oldest = 0;
    for (int i = 0; i < OIDC_LOGINS; i++) {
        if (o->logins[i].expires_ms <= now) {
            slot = i;
            break;
        }
        if (o->logins[i].expires_ms < o->logins[oldest].expires_ms) oldest = i;
    }
    if (slot < 0) {
        log_warn("oidc: %d logins in progress; the oldest is forgotten", OIDC_LOGINS);
        slot = oldest;
    }
    l.expires_ms = now + OIDC_LOGIN_LIFE_MS;
    o->logins[slot] = l;
    pthread_mutex_unlock(&o->mu);
    return 0;
}

/* Takes (and forgets) the login of state into *out: 0, or -1 when none lives. */
static int login_take(oidc *o, const char *state, login *out) {
    int rc = -1;
    size_t sl = strlen(state);
    pthread_mutex_lock(&o->mu);
    int64_t now = mono_ms();
    for (int i = 0; i < OIDC_LOGINS; i++) {
        login *l = &o->logins[i];
        if (l->expires_ms == 0 || strlen(l->state) != sl || !mem_equal_ct(l->state, state, sl)) continue;
        if (l->expires_ms > now) {
            *out = *l;
            rc = 0;
        }
        memset(l, 0, sizeof *l);
        break;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* ---------------------------------------------------------------- the ID token */

int oidc_username_valid(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* The key type an alg needs ("RSA", "EC", "OKP") into *kty; NULL for an
 * alg that is not an asymmetric signature. */
static const char *alg_family(const char *alg, cjose_jwk_kty_t *kty) {
    static const char *rsa[] = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"};
    static const char *ec[] = {"ES256", "ES384", "ES512"};
    for (size_t i = 0; i < sizeof rsa / sizeof rsa[0]; i++) {
        if (!strcmp(alg, rsa[i])) {
            *kty = CJOSE_JWK_KTY_RSA;
            return "RSA";
        }
    }
    for (size_t i = 0; i < sizeof ec / sizeof ec[0]; i++) {
        if (!strcmp(alg, ec[i])) {
            *kty = CJOSE_JWK_KTY_EC;
            return "EC";
        }
    }
    if (!strcmp(alg, "EdDSA")) {
        *kty = (cjose_jwk_kty_t)-1; /* cjose 0.6 has no OKP keys: no key of the JWKS matches */
        return "OKP";
    }
    return NULL;
}

/* The JWS header (the first segment, base64url JSON), decoded by cjose. */
static cJSON *jws_header(const char *jwt) {
    const char *dot = strchr(jwt, '.');
    if (!dot || dot == jwt) return NULL;
    uint8_t *raw = NULL;
    size_t rlen = 0;
    cjose_err cerr;
    if (!cjose_base64url_decode(jwt, (size_t)(dot - jwt), &raw, &rlen, &cerr)) return NULL;
    cJSON *h = cJSON_ParseWithLength((const char *)raw, rlen);
    cjose_get_dealloc()(raw);
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

/* The key for kid (NULL: the one key of kty, if one only); mu held. */
static cjose_jwk_t *key_find(oidc *o, const char *kid, cjose_jwk_kty_t kty) {
    cjose_jwk_t *only = NULL;
    int n = 0;
    for (int i = 0; i < o->nkeys; i++) {
        cjose_err cerr;
        if (cjose_jwk_get_kty(o->keys[i], &cerr) != kty) continue;
        if (kid && o->kids[i] && !strcmp(kid, o->kids[i])) return o->keys[i];
        if (!kid) {
            only = o->keys[i];
            n++;
        }
    }
    return n == 1 ? only : NULL;
}

/* A claim that is a number (JSON numbers only; an integer in seconds). */
static int claim_time(const cJSON *p, const char *name, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > -1e15 && v->valuedouble < 1e15)) return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* Copies the string claim name into dst (cap bytes): 1 copied, 0 absent,
 * -1 not a string or too long (err written). */
static int claim_copy(const cJSON *p, const char *name, char *dst, size_t cap, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, name);
    if (!v) return 0;
    if (!cJSON_IsString(v)) {
        snprintf(err, errlen, "id token: %s is not a string", name);
        return -1;
    }
    if (strlen(v->valuestring) >= cap) {
        snprintf(err, errlen, "id token: %s is longer than %zu bytes", name, cap - 1);
        return -1;
    }
    snprintf(dst, cap, "%s", v->valuestring);
    return 1;
}

/* The claims' checks after the signature; mu held. */
static int check_claims(oidc *o, const cJSON *p, const char *nonce, oidc_identity *id, char *err, size_t errlen) {
    int64_t now = now_ms() / 1000, exp, iat, nbf;
    const char *iss = json_str(p, "iss");
    if (!iss || strcmp(iss, o->issuer)) {
        snprintf(err, errlen, "id token: iss '%.100s' is not the issuer '%.100s'", iss ? iss : "", o->issuer);
        return -1;
    }
    const cJSON *aud = cJSON_GetObjectItemCaseSensitive(p, "aud");
    int naud = 0, ours = 0;
    if (cJSON_IsString(aud)) {
        naud = 1;
        ours = !strcmp(aud->valuestring, o->client_id);
    } else if (cJSON_IsArray(aud)) {
        const cJSON *a;
        cJSON_ArrayForEach(a, aud) {
            naud++;
            if (cJSON_IsString(a) && !strcmp(a->valuestring, o->client_id)) ours = 1;
        }
    }
    if (!ours) {
        snprintf(err, errlen, "id token: aud does not contain client_id '%.100s'", o->client_id);
        return -1;
    }
    const cJSON *azp = cJSON_GetObjectItemCaseSensitive(p, "azp");
    if ((naud > 1 || azp) && !(cJSON_IsString(azp) && !strcmp(azp->valuestring, o->client_id))) {
        snprintf(err, errlen, "id token: azp is not client_id '%.100s'%s", o->client_id,
                 naud > 1 ? " (aud has several audiences)" : "");
        return -1;
    }
    if (claim_time(p, "exp", &exp) < 0) {
        snprintf(err, errlen, "id token: no exp");
        return -1;
    }
    if (exp <= now - o->skew_s) {
        snprintf(err, errlen, "id token: expired (exp %lld is %lld s ago, over the %lld s of skew)", (long long)exp,
                 (long long)(now - exp), (long long)o->skew_s);
        return -1;
    }
    if (claim_time(p, "iat", &iat) < 0) {
        snprintf(err, errlen, "id token: no iat");
        return -1;
    }
    if (iat > now + o->skew_s) {
        snprintf(err, errlen, "id token: iat %lld is in the future (%lld s ahead, over the %lld s of skew)",
                 (long long)iat, (long long)(iat - now), (long long)o->skew_s);
        return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(p, "nbf") && (claim_time(p, "nbf", &nbf) < 0 || nbf > now + o->skew_s)) {
        snprintf(err, errlen, "id token: nbf is not a time, or in the future");
        return -1;
    }
    const char *tnonce = json_str(p, "nonce");
    if (nonce) {
        size_t nl = strlen(nonce);
        if (!tnonce) {
            snprintf(err, errlen, "id token: no nonce (the login sent one)");
            return -1;
        }
        if (strlen(tnonce) != nl || !mem_equal_ct(tnonce, nonce, nl)) {
            snprintf(err, errlen, "id token: nonce does not match the login's");
            return -1;
        }
    }
    if (tnonce) {
        if (strlen(tnonce) >= sizeof o->nonces[0].nonce) {
            snprintf(err, errlen, "id token: nonce is too long");
            return -1;
        }
        for (int i = 0; i < OIDC_NONCES; i++) {
            if (o->nonces[i].exp_s && !strcmp(o->nonces[i].nonce, tnonce)) {
                snprintf(err, errlen, "id token: nonce already used (a replayed token)");
                return -1;
            }
        }
    }
    memset(id, 0, sizeof *id);
    int r = claim_copy(p, "sub", id->sub, sizeof id->sub, err, errlen);
    if (r <= 0 || !id->sub[0]) {
        if (r == 0 || !id->sub[0]) snprintf(err, errlen, "id token: no sub");
        return -1;
    }
    r = claim_copy(p, "preferred_username", id->username, sizeof id->username, err, errlen);
    if (r < 0) return -1;
    if (r == 0) {
        snprintf(err, errlen, "id token has no preferred_username");
        return -1;
    }
    if (!oidc_username_valid(id->username)) {
        snprintf(err, errlen,
                 "id token: preferred_username '%.64s' is not a user name (1-63 letters, digits, '.', '_', '-')",
                 id->username);
        return -1;
    }
    if (claim_copy(p, "email", id->email, sizeof id->email, err, errlen) < 0) return -1;
    if (claim_copy(p, "name", id->name, sizeof id->name, err, errlen) < 0) return -1;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(p, o->groups_claim);
    if (groups) {
        const cJSON *g;
        if (!cJSON_IsArray(groups)) {
            snprintf(err, errlen, "id token: %.64s is not an array of strings", o->groups_claim);
            return -1;
        }
        cJSON_ArrayForEach(g, groups) {
            if (!cJSON_IsString(g) || strlen(g->valuestring) >= sizeof id->groups[0] ||
                id->ngroups == (int)(sizeof id->groups / sizeof id->groups[0])) {
                snprintf(err, errlen, "id token: %.64s is not an array of at most 64 strings under 128 bytes",
                         o->groups_claim);
                return -1;
            }
            snprintf(id->groups[id->ngroups++], sizeof id->groups[0], "%s", g->valuestring);
        }
    }
    if (tnonce) {
        /* remembered until the token expires; a full table forgets the nearest expiry */
        int slot = 0;
        for (int i = 0; i < OIDC_NONCES; i++) {
            if (o->nonces[i].exp_s < now - o->skew_s) {
                slot = i;
                break;
            }
            if (o->nonces[i].exp_s < o->nonces[slot].exp_s) slot = i;
        }
        snprintf(o->nonces[slot].nonce, sizeof o->nonces[slot].nonce, "%s", tnonce);
        o->nonces[slot].exp_s = exp;
    }
    return 0;
}

static int verify_locked(oidc *o, const char *jwt, const char *nonce, oidc_identity *id, char *err, size_t errlen) {
    cJSON *hdr = jws_header(jwt);
    cjose_jws_t *jws = NULL;
    cJSON *payload = NULL;
    int rc = -1;
    if (!hdr) {
        snprintf(err, errlen, "id token: not a JWS compact serialization (no JSON header)");
        goto out;
    }
    const char *alg = json_str(hdr, "alg");
    const char *kid = json_str(hdr, "kid");
    cjose_jwk_kty_t kty;
    if (!alg) {
        snprintf(err, errlen, "id token: the header has no alg");
        goto out;
    }
    if (!strcmp(alg, "none")) {
        snprintf(err, errlen, "id token: alg 'none' refused: the token is not signed");
        goto out;
    }
    if (alg[0] == 'H' && alg[1] == 'S') {
        snprintf(err, errlen, "id token: alg '%.16s' refused: a symmetric alg (only RS*, PS*, ES*, EdDSA)", alg);
        goto out;
    }
    if (!alg_family(alg, &kty)) {
        snprintf(err, errlen, "id token: alg '%.32s' refused: not an asymmetric signature alg", alg);
        goto out;
    }
    int listed = 0;
    for (int i = 0; i < o->nalgs; i++) listed |= !strcmp(o->algs[i], alg);
    if (!listed) {
        snprintf(err, errlen, "id token: alg '%.32s' is not in the provider's id_token_signing_alg_values_supported",
                 alg);
        goto out;
    }
    cjose_err cerr;
    jws = cjose_jws_import(jwt, strlen(jwt), &cerr);
    if (!jws) {
        snprintf(err, errlen, "id token: not a JWS compact serialization (%s)", cjose_err_message(cerr.code));
        goto out;
    }
    cjose_jwk_t *key = key_find(o, kid, kty);
    if (!key && kid && (o->jwks_refreshed_ms == 0 || mono_ms() - o->jwks_refreshed_ms >= OIDC_JWKS_MIN_MS)) {
        char ferr[ERR_MAX];
        o->jwks_refreshed_ms = mono_ms();
        if (jwks_fetch(o, ferr, sizeof ferr) < 0) log_warn("%s", ferr);
        key = key_find(o, kid, kty);
    }
    if (!key) {
        if (kid)
            snprintf(err, errlen, "id token: no %s key with kid '%.64s' in the provider's JWKS", alg_family(alg, &kty),
                     kid);
        else
            snprintf(err, errlen, "id token: no kid, and not one %s key only in the provider's JWKS",
                     alg_family(alg, &kty));
        goto out;
    }
    if (!cjose_jws_verify(jws, key, &cerr)) {
        snprintf(err, errlen, "id token: the signature does not verify with key '%.64s'", kid ? kid : "(no kid)");
        goto out;
    }
    uint8_t *plain = NULL;
    size_t plen = 0;
    if (!cjose_jws_get_plaintext(jws, &plain, &plen, &cerr)) {
        snprintf(err, errlen, "id token: no payload (%s)", cjose_err_message(cerr.code));
        goto out;
    }
    payload = cJSON_ParseWithLength((const char *)plain, plen);
    if (!cJSON_IsObject(payload)) {
        snprintf(err, errlen, "id token: the payload is not a JSON object");
        goto out;
    }
    rc = check_claims(o, payload, nonce, id, err, errlen);
out:
    cJSON_Delete(hdr);
    cJSON_Delete(payload);
    if (jws) cjose_jws_release(jws);
    return rc;
}

int oidc_verify_id_token(oidc *o, const char *jwt, const char *nonce, oidc_identity *id, char *err, size_t errlen) {
    if (!jwt || strlen(jwt) > OIDC_BODY_MAX) {
        snprintf(err, errlen, "id token: none, or over %u bytes", OIDC_BODY_MAX);
        return -1;
    }
    pthread_mutex_lock(&o->mu);
    int rc = verify_locked(o, jwt, nonce, id, err, errlen);
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* ---------------------------------------------------------------- the token endpoint */

/* Adds the client's credentials to a form when it authenticates by post. */
static int form_client(const oidc *o, buf *form) {
    if (!o->auth_post) return 0; /* client_secret_basic: the Authorization header */
    return buf_param(form, 0, "client_id", o->client_id) || buf_param(form, 0, "client_secret", o->client_secret);
}

/* POSTs form to url as the client. 0 with *j and *status, or -1 with err. */
static int client_post(const oidc *o, const char *url, buf *form, long *status, cJSON **j, char *err, size_t errlen) {
    if (form_client(o, form)) {
        snprintf(err, errlen, "oidc: %s: the request is too long", url);
        return -1;
    }
    return http_json(o, url, form->data, !o->auth_post, 10000, status, j, err, errlen);
}

/* The provider's error answer as one line: "oidc: URL: HTTP 400 invalid_grant: ..." */
static void provider_error(const char *url, long status, const cJSON *j, char *err, size_t errlen) {
    const char *e = json_str(j, "error"), *d = json_str(j, "error_description");
    snprintf(err, errlen, "oidc: %s: HTTP %ld%s%.64s%s%.120s", url, status, e ? " " : "", e ? e : "", d ? ": " : "",
             d ? d : "");
}

/* The id_token of a 200 token answer, verified with nonce. */
static int token_identity(oidc *o, long status, const cJSON *j, const char *nonce, oidc_identity *id, char *err,
                          size_t errlen) {
    if (status != 200) {
        provider_error(o->token_ep, status, j, err, errlen);
        return -1;
    }
    const char *idt = json_str(j, "id_token");
    if (!idt) {
        snprintf(err, errlen, "oidc: %s: the answer has no id_token", o->token_ep);
        return -1;
    }
    return oidc_verify_id_token(o, idt, nonce, id, err, errlen);
}

int oidc_callback(oidc *o, const char *code, const char *state, oidc_identity *id, char *return_to, size_t rtlen,
                  char *err, size_t errlen) {
    login l;
    if (!state || !state[0] || login_take(o, state, &l) < 0) {
        snprintf(err, errlen, "unknown or expired state");
        return -1;
    }
    if (!code || !code[0] || strlen(code) > 4096) {
        snprintf(err, errlen, "oidc: no code (or one over 4096 bytes) in the callback");
        return -1;
    }
    buf form;
    buf_init(&form, 16384);
    long status = 0;
    cJSON *j = NULL;
    int rc = -1;
    if (buf_param(&form, 1, "grant_type", "authorization_code") || buf_param(&form, 0, "code", code) ||
        buf_param(&form, 0, "redirect_uri", o->redirect_uri) || buf_param(&form, 0, "code_verifier", l.verifier)) {
        snprintf(err, errlen, "oidc: the token request is too long");
        goto out;
    }
    if (client_post(o, o->token_ep, &form, &status, &j, err, errlen) < 0) goto out;
    if (token_identity(o, status, j, l.nonce, id, err, errlen) < 0) goto out;
    if (sfmt(return_to, rtlen, "%s", l.return_to) < 0) {
        snprintf(err, errlen, "oidc: return_to does not fit in %zu bytes", rtlen);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(j);
    buf_release(&form);
    return rc;
}

/* ---------------------------------------------------------------- the device flow (RFC 8628) */

int oidc_device_start(oidc *o, oidc_device *out, char *err, size_t errlen) {
    if (!o->device_ep) {
        snprintf(err, errlen, "oidc: the provider %s has no device_authorization_endpoint", o->issuer);
        return -1;
    }
    buf form;
    buf_init(&form, 4096);
    long status = 0;
    cJSON *j = NULL;
    int rc = -1;
    if (buf_param(&form, 1, "scope", scopes(o))) {
        snprintf(err, errlen, "oidc: the device request is too long");
        goto out;
    }
    if (client_post(o, o->device_ep, &form, &status, &j, err, errlen) < 0) goto out;
    if (status != 200) {
        provider_error(o->device_ep, status, j, err, errlen);
        goto out;
    }
    memset(out, 0, sizeof *out);
    const char *dc = json_str(j, "device_code"), *uc = json_str(j, "user_code");
    const char *vu = json_str(j, "verification_uri"), *vc = json_str(j, "verification_uri_complete");
    const cJSON *iv = cJSON_GetObjectItemCaseSensitive(j, "interval");
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(j, "expires_in");
    if (!dc || !uc || !vu || !cJSON_IsNumber(ex) || sfmt(out->device_code, sizeof out->device_code, "%s", dc) ||
        sfmt(out->user_code, sizeof out->user_code, "%s", uc) ||
        sfmt(out->verification_uri, sizeof out->verification_uri, "%s", vu) ||
        (vc && sfmt(out->verification_uri_complete, sizeof out->verification_uri_complete, "%s", vc))) {
        snprintf(err, errlen,
                 "oidc: %s: the answer lacks device_code, user_code, verification_uri or expires_in, or they do not fit",
                 o->device_ep);
        goto out;
    }
    out->interval = cJSON_IsNumber(iv) && iv->valuedouble >= 1 && iv->valuedouble <= 3600 ? (int)iv->valuedouble : 5;
    out->expires_in = ex->valuedouble >= 1 && ex->valuedouble <= 86400 ? (int)ex->valuedouble : 600;
    rc = 0;
out:
    cJSON_Delete(j);
    buf_release(&form);
    return rc;
}

int oidc_device_poll(oidc *o, const char *device_code, oidc_identity *id, char *err, size_t errlen) {
    if (!device_code || !device_code[0]) {
        snprintf(err, errlen, "oidc: no device_code");
        return OIDC_ERROR;
    }
    buf form;
    buf_init(&form, 8192);
    long status = 0;
    cJSON *j = NULL;
    int rc = OIDC_ERROR;
    if (buf_param(&form, 1, "grant_type", "urn:ietf:params:oauth:grant-type:device_code") ||
        buf_param(&form, 0, "device_code", device_code)) {
        snprintf(err, errlen, "oidc: the device_code is too long");
        goto out;
    }
    if (client_post(o, o->token_ep, &form, &status, &j, err, errlen) < 0) goto out;
    if (status != 200) {
        const char *e = json_str(j, "error");
        static const struct { const char *name; int rc; } map[] = {
            {"authorization_pending", OIDC_PENDING},
            {"slow_down", OIDC_SLOW_DOWN},
            {"access_denied", OIDC_DENIED},
            {"expired_token", OIDC_EXPIRED},
        };
        for (size_t i = 0; e && i < sizeof map / sizeof map[0]; i++) {
            if (!strcmp(e, map[i].name)) {
                rc = map[i].rc;
                goto out;
            }
        }
        provider_error(o->token_ep, status, j, err, errlen);
        goto out;
    }
    if (token_identity(o, status, j, NULL, id, err, errlen) == 0) rc = OIDC_OK;
out:
    cJSON_Delete(j);
    buf_release(&form);
    return rc;
}
