/* check_oidc.c - the OpenID Connect relying party (server/oidc.c) against a
 * real OpenID Provider: panva's oidc-provider run by node
 * (tests/oidc/provider.mjs) on loopback. Discovery, and its failures named
 * by URL; the login URL's PKCE, state and nonce; the authorization code
 * flow end to end, libcurl playing the browser on the provider's login
 * page; forged ID tokens handed out by the provider's own token endpoint
 * (its forge mode), each refused naming the check; a key added to the
 * provider's JWKS found by one re-fetch; the device flow approved and
 * denied through the provider's device pages.
 *
 * Without node or node_modules/oidc-provider (`npm ci`) the suite says SKIP
 * and passes, unless OIDC_TEST_REQUIRED=1 (tests/run_all.sh sets it). */
#include <check.h>
#include <cjose/cjose.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"
#include "../server/oidc.h"
#include "oidc_fixture.h"

#define REDIRECT "http://127.0.0.1:1/auth/callback"
#define ERR_MAX_T 256

static oidc_op g_op;

/* ---------------------------------------------------------------- the provider */

static void provider_start(void) { oidc_op_start(&g_op, "oidc", REDIRECT, "s3cret-of-trainyard", 0); }
static void provider_stop(void) { oidc_op_stop(&g_op); }

static oidc *rp_new(void) {
    oidc_config c = {g_op.issuer, "trainyard", "s3cret-of-trainyard", REDIRECT, NULL, 0};
    char err[ERR_MAX_T];
    oidc *o = oidc_new(&c, err, sizeof err);
    ck_assert_msg(o != NULL, "%s", err);
    return o;
}

/* ---------------------------------------------------------------- HTTP as a test sees it */

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud) {
    return buf_append(ud, p, size * nmemb) == 0 ? size * nmemb : 0;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
    size_t n = size * nmemb;
    if (n > 10 && !strncasecmp(p, "location:", 9)) {
        char *loc = ud;
        size_t s = 9;
        while (s < n && p[s] == ' ') s++;
        size_t e = n;
        while (e > s && (p[e - 1] == '\r' || p[e - 1] == '\n')) e--;
        snprintf(loc, 2048, "%.*s", (int)(e - s), p + s);
    }
    return n;
}

/* One request on h (which keeps its cookies): the status, the body into
 * body (if any) and the Location header into loc (2048 bytes, if any). */
static long req(CURL *h, const char *method, const char *url, const char *body, const char *ctype, buf *out,
                char *loc) {
    char lbuf[2048] = "";
    buf tmp;
    buf_init(&tmp, 1 << 20);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out ? out : &tmp);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, lbuf);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
    struct curl_slist *hdr = NULL;
    char ct[128];
    if (body) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
        hdr = curl_slist_append(hdr, ct);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, url, curl_easy_strerror(rc));
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (loc) snprintf(loc, 2048, "%s", lbuf);
    buf_release(&tmp);
    return status;
}

/* A request to the control port with a JSON body; its answer parsed. */
static cJSON *control(const char *method, const char *path, const char *json) {
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s%s", g_op.control, path);
    buf out;
    buf_init(&out, 1 << 20);
    long st = req(h, method, url, json, "application/json", &out, NULL);
    curl_easy_cleanup(h);
    cJSON *j = cJSON_Parse(out.data ? out.data : "");
    ck_assert_msg(st == 200 && j, "%s %s: %ld %s", method, path, st, out.data ? out.data : "");
    buf_release(&out);
    return j;
}

/* A query parameter of url, into out. 0 or -1 (absent). */
static int query_param(const char *url, const char *name, char *out, size_t n) {
    const char *q = strchr(url, '?');
    size_t nl = strlen(name);
    for (const char *p = q; p && *p; p = strchr(p + 1, '&')) {
        if (!strncmp(p + 1, name, nl) && p[1 + nl] == '=') {
            const char *v = p + 2 + nl;
            size_t vl = strcspn(v, "&#");
            int ol = 0;
            char *d = curl_easy_unescape(NULL, v, (int)vl, &ol);
            snprintf(out, n, "%s", d);
            curl_free(d);
            return 0;
        }
    }
    return -1;
}

/* The browser: from the login URL through the provider's login form (and
 * its consent, which the fixture grants) to the redirect to our callback;
 * its code and state into code and state. */
static void browse(const char *login_url, const char *user, const char *password, char *code, char *state) {
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_COOKIEFILE, ""); /* the cookie engine, in memory */
    char url[2048], loc[2048];
    snprintf(url, sizeof url, "%s", login_url);
    const char *form = NULL;
    char fbuf[256];
    for (int hop = 0; hop < 20; hop++) {
        buf page;
        buf_init(&page, 1 << 20);
        long st = req(h, form ? "POST" : "GET", url, form, "application/x-www-form-urlencoded", &page, loc);
        form = NULL;
        if (st >= 300 && st < 400) {
            buf_release(&page);
            if (!strncmp(loc, REDIRECT, strlen(REDIRECT))) {
                ck_assert_int_eq(query_param(loc, "code", code, 2048), 0);
                ck_assert_int_eq(query_param(loc, "state", state, 128), 0);
                curl_easy_cleanup(h);
                return;
            }
            if (loc[0] == '/') {
                snprintf(url, sizeof url, "%s%.1900s", g_op.issuer, loc);
            } else {
                snprintf(url, sizeof url, "%s", loc);
            }
            continue;
        }
        ck_assert_msg(st == 200, "%s: %ld %s", url, st, page.data ? page.data : "");
        const char *a = page.data ? strstr(page.data, "action=\"/interaction/") : NULL;
        ck_assert_msg(a != NULL, "no login form at %s: %s", url, page.data ? page.data : "");
        a += strlen("action=\"");
        snprintf(url, sizeof url, "%s%.*s", g_op.issuer, (int)strcspn(a, "\""), a);
        snprintf(fbuf, sizeof fbuf, "login=%s&password=%s", user, password);
        form = fbuf;
        buf_release(&page);
    }
    ck_abort_msg("the browser did not reach the callback in 20 hops");
}

/* A full login: the URL, the browser as user, the callback. Returns its
 * result; the login's nonce into nonce (if any). */
static int login_as(oidc *o, const char *user, const char *password, oidc_identity *id, char *return_to, char *nonce,
                    char *err) {
    char url[4096], code[2048], state[128];
    ck_assert_int_eq(oidc_login_url(o, "/jobs?team=vision", url, sizeof url), 0);
    if (nonce) ck_assert_int_eq(query_param(url, "nonce", nonce, 64), 0);
    browse(url, user, password, code, state);
    return oidc_callback(o, code, state, id, return_to, 1024, err, ERR_MAX_T);
}

/* ---------------------------------------------------------------- forging tokens */

static char *b64u(const void *p, size_t n) {
    char *s = NULL;
    size_t len = 0;
    cjose_err e;
    ck_assert(cjose_base64url_encode(p, n, &s, &len, &e));
    return s;
}

static cjose_jwk_t *provider_key(void) {
    size_t n = 0;
    char *json = file_read_all(g_op.keyfile, 65536, &n);
    ck_assert_ptr_nonnull(json);
    cjose_err e;
    cjose_jwk_t *k = cjose_jwk_import(json, n, &e);
    ck_assert_msg(k != NULL, "%s", cjose_err_message(e.code));
    free(json);
    return k;
}

/* The claims a good token has, as JSON (exp in an hour): the caller edits. */
static cJSON *claims(const char *nonce) {
    cJSON *c = cJSON_CreateObject();
    int64_t now = now_ms() / 1000;
    cJSON_AddStringToObject(c, "iss", g_op.issuer);
    cJSON_AddStringToObject(c, "aud", "trainyard");
    cJSON_AddStringToObject(c, "sub", "ada");
    cJSON_AddStringToObject(c, "preferred_username", "ada");
    cJSON_AddNumberToObject(c, "iat", (double)now);
    cJSON_AddNumberToObject(c, "exp", (double)(now + 3600));
    if (nonce) cJSON_AddStringToObject(c, "nonce", nonce);
    cJSON *g = cJSON_AddArrayToObject(c, "groups");
    cJSON_AddItemToArray(g, cJSON_CreateString("vision:admin"));
    return c;
}

/* Signs claims (consumed) with key under kid, RS256: a compact JWS (free it). */
static char *sign(cjose_jwk_t *key, const char *kid, cJSON *c) {
    char *payload = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    cjose_err e;
    cjose_header_t *h = cjose_header_new(&e);
    ck_assert(cjose_header_set(h, CJOSE_HDR_ALG, CJOSE_HDR_ALG_RS256, &e));
    ck_assert(cjose_header_set(h, CJOSE_HDR_KID, kid, &e));
    cjose_jws_t *jws = cjose_jws_sign(key, h, (const uint8_t *)payload, strlen(payload), &e);
    ck_assert_msg(jws != NULL, "%s", cjose_err_message(e.code));
    const char *ser = NULL;
    ck_assert(cjose_jws_export(jws, &ser, &e));
    char *out = xstrdup(ser);
    cjose_jws_release(jws);
    cjose_header_release(h);
    free(payload);
    return out;
}

/* A compact token made by hand: header and claims (consumed); alg "none"
 * with an empty signature, or HS256 with key (klen bytes). */
static char *hand_token(const char *header, cJSON *c, const void *key, size_t klen) {
    char *payload = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    char *h64 = b64u(header, strlen(header)), *p64 = b64u(payload, strlen(payload));
    buf t;
    buf_init(&t, 1 << 20);
    ck_assert_int_eq(buf_printf(&t, "%s.%s.", h64, p64), 0);
    if (key) {
        unsigned char mac[32];
        unsigned int ml = 0;
        ck_assert_ptr_nonnull(HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)t.data, t.len - 1, mac, &ml));
        char *s64 = b64u(mac, ml);
        ck_assert_int_eq(buf_appends(&t, s64), 0);
        cjose_get_dealloc()(s64);
    }
    cjose_get_dealloc()(h64);
    cjose_get_dealloc()(p64);
    free(payload);
    return buf_detach(&t, NULL);
}

/* The provider's token endpoint answers tok (freed) for the next login;
 * the login's callback must fail with want in its message. */
static void forged_login_refused(oidc *o, char *(*make)(const char *nonce, void *ud), void *ud, const char *want) {
    char url[4096], code[2048], state[128], nonce[64], rt[1024], err[ERR_MAX_T];
    ck_assert_int_eq(oidc_login_url(o, "/", url, sizeof url), 0);
    ck_assert_int_eq(query_param(url, "nonce", nonce, sizeof nonce), 0);
    char *tok = make(nonce, ud);
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "id_token", tok);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(control("PUT", "/forge", text));
    free(text);
    cJSON_Delete(body);
    free(tok);
    browse(url, "ada", "ada-password", code, state);
    oidc_identity id;
    int rc = oidc_callback(o, code, state, &id, rt, sizeof rt, err, sizeof err);
    cJSON_Delete(control("DELETE", "/forge", NULL));
    ck_assert_msg(rc == -1, "a forged token (%s) was accepted", want);
    ck_assert_msg(strstr(err, want) != NULL, "wanted '%s' in: %s", want, err);
    ck_assert_ptr_null(strchr(err, '\n'));
}

#define FORGE(name, body)                                                         \
    static char *name(const char *nonce, void *ud) {                               \
        (void)ud;                                                                  \
        cJSON *c = claims(nonce);                                                  \
        body;                                                                      \
    }

FORGE(forge_none, return hand_token("{\"alg\":\"none\",\"kid\":\"fixture-rsa-1\"}", c, NULL, 0))
FORGE(forge_foreign, {
    cjose_err e;
    cjose_jwk_t *k = cjose_jwk_create_RSA_random(2048, NULL, 0, &e);
    char *t = sign(k, "fixture-rsa-1", c);
    cjose_jwk_release(k);
    return t;
})
FORGE(forge_aud, {
    cJSON_ReplaceItemInObject(c, "aud", cJSON_CreateString("another-client"));
    cjose_jwk_t *k = provider_key();
    char *t = sign(k, "fixture-rsa-1", c);
    cjose_jwk_release(k);
    return t;
})
FORGE(forge_iss, {
    cJSON_ReplaceItemInObject(c, "iss", cJSON_CreateString("http://127.0.0.1:1"));
    cjose_jwk_t *k = provider_key();
    char *t = sign(k, "fixture-rsa-1", c);
    cjose_jwk_release(k);
    return t;
})
FORGE(forge_old, {
    cJSON_ReplaceItemInObject(c, "exp", cJSON_CreateNumber((double)(now_ms() / 1000 - 3600)));
    cJSON_ReplaceItemInObject(c, "iat", cJSON_CreateNumber((double)(now_ms() / 1000 - 7200)));
    cjose_jwk_t *k = provider_key();
    char *t = sign(k, "fixture-rsa-1", c);
    cjose_jwk_release(k);
    return t;
})
FORGE(forge_future, {
    cJSON_ReplaceItemInObject(c, "iat", cJSON_CreateNumber((double)(now_ms() / 1000 + 600)));
    cjose_jwk_t *k = provider_key();
    char *t = sign(k, "fixture-rsa-1", c);
    cjose_jwk_release(k);
    return t;
})

/* HS256 keyed with the bytes of the provider's public key (its JWK's n). */
static char *forge_hs256(const char *nonce, void *ud) {
    (void)ud;
    cjose_jwk_t *k = provider_key();
    cjose_err e;
    char *pub = cjose_jwk_to_json(k, false, &e);
    ck_assert_ptr_nonnull(pub);
    char *t = hand_token("{\"alg\":\"HS256\",\"kid\":\"fixture-rsa-1\"}", claims(nonce), pub, strlen(pub));
    cjose_get_dealloc()(pub);
    cjose_jwk_release(k);
    return t;
}

/* A token captured earlier (ud), its nonce another login's. */
static char *forge_replay(const char *nonce, void *ud) {
    (void)nonce;
    return xstrdup(ud);
}

/* ---------------------------------------------------------------- tests */

START_TEST(discovery) {
    oidc *o = rp_new();
    oidc_free(o);
    char err[ERR_MAX_T];
    oidc_config c = {"http://127.0.0.1:9", "trainyard", "s", REDIRECT, NULL, 0};
    ck_assert_ptr_null(oidc_new(&c, err, sizeof err));
    ck_assert_str_eq(err, "oidc: http://127.0.0.1:9/.well-known/openid-configuration: Connection refused");

    /* the provider's URL with another path: no discovery there */
    char other[300], want[800];
    snprintf(other, sizeof other, "%s/other", g_op.issuer);
    c.issuer = other;
    ck_assert_ptr_null(oidc_new(&c, err, sizeof err));
    snprintf(want, sizeof want, "oidc: %s/.well-known/openid-configuration: HTTP 404", other);
    ck_assert_str_eq(err, want);

    /* the same provider by another name: its discovery names itself otherwise */
    char port[16];
    snprintf(port, sizeof port, "%s", strrchr(g_op.issuer, ':') + 1);
    snprintf(other, sizeof other, "http://localhost:%s", port);
    ck_assert_ptr_null(oidc_new(&c, err, sizeof err));
    snprintf(want, sizeof want, "oidc: %s/.well-known/openid-configuration: the provider names itself '%s'", other,
             g_op.issuer);
    ck_assert_msg(!strncmp(err, want, strlen(want)), "%s", err);
    ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

START_TEST(login_url) {
    oidc *o = rp_new();
    char a[4096], b[4096], v[256];
    ck_assert_int_eq(oidc_login_url(o, "/jobs", a, sizeof a), 0);
    ck_assert_int_eq(oidc_login_url(o, "/jobs", b, sizeof b), 0);
    ck_assert_str_ne(a, b);
    char auth[300];
    snprintf(auth, sizeof auth, "%s/auth?", g_op.issuer);
    ck_assert_msg(!strncmp(a, auth, strlen(auth)), "%s", a);
    ck_assert_int_eq(query_param(a, "response_type", v, sizeof v), 0);
    ck_assert_str_eq(v, "code");
    ck_assert_int_eq(query_param(a, "code_challenge_method", v, sizeof v), 0);
    ck_assert_str_eq(v, "S256");
    ck_assert_int_eq(query_param(a, "code_challenge", v, sizeof v), 0);
    ck_assert_uint_eq(strlen(v), 43);
    ck_assert_int_eq(query_param(a, "state", v, sizeof v), 0);
    ck_assert_uint_ge(strlen(v), 22); /* >= 128 bits */
    ck_assert_uint_eq(strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), strlen(v));
    ck_assert_int_eq(query_param(a, "nonce", v, sizeof v), 0);
    ck_assert_uint_ge(strlen(v), 22);
    ck_assert_int_eq(query_param(a, "scope", v, sizeof v), 0);
    ck_assert_str_eq(v, "openid profile email groups");
    ck_assert_int_eq(query_param(a, "redirect_uri", v, sizeof v), 0);
    ck_assert_str_eq(v, REDIRECT);
    ck_assert_int_eq(query_param(a, "client_id", v, sizeof v), 0);
    ck_assert_str_eq(v, "trainyard");
    /* return_to is a path of ours, never another site */
    ck_assert_int_eq(oidc_login_url(o, "//evil.example/", a, sizeof a), -1);
    ck_assert_int_eq(oidc_login_url(o, "https://evil.example/", a, sizeof a), -1);
    ck_assert_int_eq(oidc_login_url(o, "/", a, 40), -1); /* does not fit */
    oidc_identity id;
    char rt[64], err[ERR_MAX_T];
    ck_assert_int_eq(oidc_callback(o, "code", "no-such-state", &id, rt, sizeof rt, err, sizeof err), -1);
    ck_assert_str_eq(err, "unknown or expired state");
    oidc_free(o);
}
END_TEST

START_TEST(code_flow) {
    oidc *o = rp_new();
    oidc_identity id;
    char rt[1024], err[ERR_MAX_T], url[4096], code[2048], state[128];
    ck_assert_msg(login_as(o, "ada", "ada-password", &id, rt, NULL, err) == 0, "%s", err);
    ck_assert_str_eq(id.sub, "ada");
    ck_assert_str_eq(id.username, "ada");
    ck_assert_str_eq(id.email, "ada@example.org");
    ck_assert_str_eq(id.name, "Ada Lovelace");
    ck_assert_int_eq(id.ngroups, 1);
    ck_assert_str_eq(id.groups[0], "vision:admin");
    ck_assert_str_eq(rt, "/jobs?team=vision");

    ck_assert_msg(login_as(o, "bob", "bob-password", &id, rt, NULL, err) == 0, "%s", err);
    ck_assert_str_eq(id.username, "bob");
    ck_assert_int_eq(id.ngroups, 2);
    ck_assert_str_eq(id.groups[0], "vision:viewer");
    ck_assert_str_eq(id.groups[1], "nlp:member");

    /* a state is used once: the second callback with it is refused */
    ck_assert_int_eq(oidc_login_url(o, "/", url, sizeof url), 0);
    browse(url, "ada", "ada-password", code, state);
    ck_assert_msg(oidc_callback(o, code, state, &id, rt, sizeof rt, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(oidc_callback(o, code, state, &id, rt, sizeof rt, err, sizeof err), -1);
    ck_assert_str_eq(err, "unknown or expired state");

    /* the provider's real token, shown again: its nonce was used */
    cJSON *st = control("GET", "/stats", NULL);
    char *last = xstrdup(cJSON_GetObjectItem(st, "last_id_token")->valuestring);
    cJSON_Delete(st);
    ck_assert_int_eq(oidc_verify_id_token(o, last, NULL, &id, err, sizeof err), -1);
    ck_assert_str_eq(err, "id token: nonce already used (a replayed token)");
    /* and handed to another login's callback, its nonce is not that login's */
    forged_login_refused(o, forge_replay, last, "id token: nonce does not match the login's");
    free(last);
    oidc_free(o);
}
END_TEST

START_TEST(forged_tokens) {
    oidc *o = rp_new();
    forged_login_refused(o, forge_none, NULL, "id token: alg 'none' refused: the token is not signed");
    forged_login_refused(o, forge_hs256, NULL, "id token: alg 'HS256' refused: a symmetric alg");
    forged_login_refused(o, forge_foreign, NULL, "id token: the signature does not verify with key 'fixture-rsa-1'");
    forged_login_refused(o, forge_aud, NULL, "id token: aud does not contain client_id 'trainyard'");
    char want[400];
    snprintf(want, sizeof want, "id token: iss 'http://127.0.0.1:1' is not the issuer '%s'", g_op.issuer);
    forged_login_refused(o, forge_iss, NULL, want);
    forged_login_refused(o, forge_old, NULL, "id token: expired (exp ");
    forged_login_refused(o, forge_future, NULL, "id token: iat ");
    oidc_free(o);
}
END_TEST

/* Claims checked without the browser: a token signed by the provider's key. */
START_TEST(claims_checked) {
    oidc *o = rp_new();
    cjose_jwk_t *k = provider_key();
    oidc_identity id;
    char err[ERR_MAX_T];
    struct {
        const char *field, *value; /* value NULL: the claim removed */
        const char *want;
    } cases[] = {
        {"preferred_username", NULL, "id token has no preferred_username"},
        {"preferred_username", "ada lovelace", "id token: preferred_username 'ada lovelace' is not a user name"},
        {"preferred_username", "../root", "is not a user name"},
        {"sub", NULL, "id token: no sub"},
        {"aud", "[\"trainyard\",\"other\"]", "id token: azp is not client_id 'trainyard' (aud has several"},
        {"groups", "\"vision:admin\"", "id token: groups is not an array of strings"},
        {"nonce", "\"another\"", "id token: nonce does not match the login's"},
        {"iat", NULL, "id token: no iat"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *c = claims("n-good");
        cJSON_DeleteItemFromObject(c, cases[i].field);
        if (cases[i].value) {
            cJSON *v = cases[i].value[0] == '[' || cases[i].value[0] == '"' ? cJSON_Parse(cases[i].value)
                                                                             : cJSON_CreateString(cases[i].value);
            cJSON_AddItemToObject(c, cases[i].field, v);
        }
        char *t = sign(k, "fixture-rsa-1", c);
        ck_assert_int_eq(oidc_verify_id_token(o, t, "n-good", &id, err, sizeof err), -1);
        ck_assert_msg(strstr(err, cases[i].want) != NULL, "case %zu: wanted '%s' in: %s", i, cases[i].want, err);
        free(t);
    }
    /* several audiences with azp ours: accepted, once */
    cJSON *c = claims("n-azp");
    cJSON_ReplaceItemInObject(c, "aud", cJSON_Parse("[\"trainyard\",\"other\"]"));
    cJSON_AddStringToObject(c, "azp", "trainyard");
    char *t = sign(k, "fixture-rsa-1", c);
    ck_assert_msg(oidc_verify_id_token(o, t, "n-azp", &id, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(oidc_verify_id_token(o, t, "n-azp", &id, err, sizeof err), -1);
    ck_assert_str_eq(err, "id token: nonce already used (a replayed token)");
    free(t);
    cjose_jwk_release(k);
    oidc_free(o);
}
END_TEST

static int jwks_fetches(void) {
    cJSON *st = control("GET", "/stats", NULL);
    int n = cJSON_GetObjectItem(st, "jwks_fetches")->valueint;
    cJSON_Delete(st);
    return n;
}

static void jwks_add(cjose_jwk_t *k) {
    cjose_err e;
    char *pub = cjose_jwk_to_json(k, false, &e);
    ck_assert_ptr_nonnull(pub);
    cJSON_Delete(control("POST", "/jwks", pub));
    cjose_get_dealloc()(pub);
}

/* A key the provider adds to its JWKS after discovery: a token under its
 * kid makes one re-fetch, which finds it; another unknown kid within 10 s
 * is refused without a re-fetch. */
START_TEST(jwks_refresh) {
    oidc *o = rp_new();
    cjose_err e;
    oidc_identity id;
    char err[ERR_MAX_T];
    cjose_jwk_t *k2 = cjose_jwk_create_RSA_random(2048, NULL, 0, &e);
    cjose_jwk_t *k3 = cjose_jwk_create_RSA_random(2048, NULL, 0, &e);
    ck_assert_ptr_nonnull(k2);
    ck_assert_ptr_nonnull(k3);
    ck_assert(cjose_jwk_set_kid(k2, "rotated-2", 9, &e));
    ck_assert(cjose_jwk_set_kid(k3, "rotated-3", 9, &e));
    char *t2 = sign(k2, "rotated-2", claims("n-rot-2"));
    char *t3 = sign(k3, "rotated-3", claims("n-rot-3"));

    jwks_add(k2);
    int before = jwks_fetches();
    ck_assert_msg(oidc_verify_id_token(o, t2, "n-rot-2", &id, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(id.username, "ada");
    ck_assert_int_eq(jwks_fetches(), before + 1);

    jwks_add(k3);
    ck_assert_int_eq(oidc_verify_id_token(o, t3, "n-rot-3", &id, err, sizeof err), -1);
    ck_assert_str_eq(err, "id token: no RSA key with kid 'rotated-3' in the provider's JWKS");
    ck_assert_int_eq(jwks_fetches(), before + 1);

    free(t2);
    free(t3);
    cjose_jwk_release(k2);
    cjose_jwk_release(k3);
    oidc_free(o);
}
END_TEST

START_TEST(device_flow) {
    oidc *o = rp_new();
    oidc_device d;
    oidc_identity id;
    char err[ERR_MAX_T], body[256];
    ck_assert_msg(oidc_device_start(o, &d, err, sizeof err) == 0, "%s", err);
    ck_assert(d.device_code[0] && d.user_code[0]);
    char want[300];
    snprintf(want, sizeof want, "%s/device", g_op.issuer);
    ck_assert_str_eq(d.verification_uri, want);
    ck_assert_int_eq(d.interval, 5);
    ck_assert_int_gt(d.expires_in, 0);
    ck_assert_int_eq(oidc_device_poll(o, d.device_code, &id, err, sizeof err), OIDC_PENDING);

    snprintf(body, sizeof body, "{\"user_code\":\"%s\",\"username\":\"bob\"}", d.user_code);
    cJSON_Delete(control("POST", "/device/approve", body));
    ck_assert_msg(oidc_device_poll(o, d.device_code, &id, err, sizeof err) == OIDC_OK, "%s", err);
    ck_assert_str_eq(id.username, "bob");
    ck_assert_int_eq(id.ngroups, 2);
    ck_assert_str_eq(id.groups[1], "nlp:member");

    /* a second device, refused by its user */
    ck_assert_msg(oidc_device_start(o, &d, err, sizeof err) == 0, "%s", err);
    snprintf(body, sizeof body, "{\"user_code\":\"%s\"}", d.user_code);
    cJSON_Delete(control("POST", "/device/deny", body));
    ck_assert_int_eq(oidc_device_poll(o, d.device_code, &id, err, sizeof err), OIDC_DENIED);
    ck_assert_int_eq(oidc_device_poll(o, "no-such-code", &id, err, sizeof err), OIDC_ERROR);
    ck_assert_msg(strstr(err, "invalid_grant") != NULL, "%s", err);
    oidc_free(o);
}
END_TEST

int main(void) {
    char why[200];
    if (!oidc_have_provider(why, sizeof why)) {
        const char *req = getenv("OIDC_TEST_REQUIRED");
        printf("check_oidc: SKIP: %s\n", why);
        return req && !strcmp(req, "1") ? 1 : 0;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("oidc");
    TCase *tc = tcase_create("oidc");
    tcase_add_unchecked_fixture(tc, provider_start, provider_stop);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, discovery);
    tcase_add_test(tc, login_url);
    tcase_add_test(tc, code_flow);
    tcase_add_test(tc, forged_tokens);
    tcase_add_test(tc, claims_checked);
    tcase_add_test(tc, jwks_refresh);
    tcase_add_test(tc, device_flow);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
