/* sigv4.c - AWS Signature Version 4 for S3 (sigv4.h): canonical request,
 * string to sign, signing key, presigned query and Authorization header,
 * on hmac_sha256 / sha256_hex of common/util (OpenSSL underneath). */
#include "sigv4.h"
#include "util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARAMS 48
#define ALGO "AWS4-HMAC-SHA256"
#define CANON_MAX (64 * 1024)

typedef struct pair {
    char *name;  /* encoded (query) or lower-cased (headers) */
    char *value; /* encoded (query) or trimmed (headers) */
} pair;

typedef struct pairs {
    pair p[MAX_PARAMS];
    int n;
} pairs;

static void pairs_free(pairs *ps) {
    for (int i = 0; i < ps->n; i++) {
        free(ps->p[i].name);
        free(ps->p[i].value);
    }
    ps->n = 0;
}

static int unreserved(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.' || c == '~';
}

static int encode_n(const char *in, size_t n, int keep_slash, char *out, size_t cap) {
    static const char hx[] = "0123456789ABCDEF";
    size_t o = 0;
    if (!out || cap == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            if (o + 1 >= cap) goto full;
            out[o++] = (char)c;
        } else {
            if (o + 3 >= cap) goto full;
            out[o++] = '%';
            out[o++] = hx[c >> 4];
            out[o++] = hx[c & 15];
        }
    }
    out[o] = '\0';
    return 0;
full:
    out[0] = '\0';
    return -1;
}

int sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t cap) {
    if (!in) return -1;
    return encode_n(in, strlen(in), keep_slash, out, cap);
}

static char *encode_dup(const char *in, size_t n) {
    size_t cap = n * 3 + 1;
    char *out = xmalloc(cap);
    if (encode_n(in, n, 0, out, cap) < 0) { /* cannot happen: 3 bytes a byte */
        free(out);
        return NULL;
    }
    return out;
}

/* "name=value" items (unencoded) into ps, encoded */
static int add_query(pairs *ps, const char *const *q) {
    for (; q && *q; q++) {
        if (ps->n >= MAX_PARAMS) return -1;
        const char *eq = strchr(*q, '=');
        size_t nlen = eq ? (size_t)(eq - *q) : strlen(*q);
        if (nlen == 0) return -1;
        char *name = encode_dup(*q, nlen);
        char *value = encode_dup(eq ? eq + 1 : "", eq ? strlen(eq + 1) : 0);
        if (!name || !value) {
            free(name);
            free(value);
            return -1;
        }
        ps->p[ps->n].name = name;
        ps->p[ps->n].value = value;
        ps->n++;
    }
    return 0;
}

/* "name:value" items into ps: names lower-cased, values trimmed with inner runs of spaces collapsed */
static int add_headers(pairs *ps, const char *const *h) {
    for (; h && *h; h++) {
        if (ps->n >= MAX_PARAMS) return -1;
        const char *colon = strchr(*h, ':');
        if (!colon || colon == *h) return -1;
        size_t nlen = (size_t)(colon - *h);
        char *name = xmalloc(nlen + 1);
        for (size_t i = 0; i < nlen; i++) {
            unsigned char c = (unsigned char)(*h)[i];
            if (c <= 0x20 || c >= 0x7f) {
                free(name);
                return -1;
            }
            name[i] = (char)tolower(c);
        }
        name[nlen] = '\0';
        const char *v = colon + 1;
        size_t vlen = strlen(v);
        char *value = xmalloc(vlen + 1);
        size_t o = 0;
        int space = 0;
        for (size_t i = 0; i < vlen; i++) {
            unsigned char c = (unsigned char)v[i];
            if (c == '\r' || c == '\n') {
                free(name);
                free(value);
                return -1;
            }
            if (c == ' ' || c == '\t') {
                space = 1;
                continue;
            }
            if (space && o > 0) value[o++] = ' ';
            space = 0;
            value[o++] = (char)c;
        }
        value[o] = '\0';
        for (int i = 0; i < ps->n; i++)
            if (strcmp(ps->p[i].name, name) == 0) { /* one of each */
                free(name);
                free(value);
                return -1;
            }
        ps->p[ps->n].name = name;
        ps->p[ps->n].value = value;
        ps->n++;
    }
    return 0;
}

static int pair_cmp(const void *a, const void *b) {
    const pair *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

static int join_query(pairs *ps, buf *b) {
    qsort(ps->p, (size_t)ps->n, sizeof ps->p[0], pair_cmp);
    for (int i = 0; i < ps->n; i++)
        if (buf_printf(b, "%s%s=%s", i ? "&" : "", ps->p[i].name, ps->p[i].value) < 0) return -1;
    return 0;
}

static int copy_out(buf *b, char *out, size_t cap) {
    if (!out || cap == 0) return -1;
    if (b->len + 1 > cap) {
        out[0] = '\0';
        return -1;
    }
    memcpy(out, b->data ? b->data : "", b->len);
    out[b->len] = '\0';
    return 0;
}

int sigv4_query_string(const sigv4_req *r, char *out, size_t cap) {
    if (out && cap) out[0] = '\0';
    if (!r) return -1;
    pairs ps = {0};
    buf b;
    buf_init(&b, CANON_MAX);
    int rc = add_query(&ps, r->query) == 0 && join_query(&ps, &b) == 0 ? copy_out(&b, out, cap) : -1;
    pairs_free(&ps);
    buf_release(&b);
    return rc;
}

void sigv4_amz_date(time_t t, char out[17]) {
    struct tm tm;
    gmtime_r(&t, &tm);
    if (strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm) != 16) snprintf(out, 17, "19700101T000000Z");
}

static int hex64_ok(const char *h) {
    if (strlen(h) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)h[i]) || isupper((unsigned char)h[i])) return 0;
    return 1;
}

int sigv4_canonical_request(const sigv4_req *r, const char *const *extra_query, const char *const *extra_headers,
                            char *out, size_t cap, char *signed_headers, size_t sh_cap) {
    if (out && cap) out[0] = '\0';
    if (signed_headers && sh_cap) signed_headers[0] = '\0';
    if (!r || !r->method || !*r->method || !r->host || !*r->host || !r->path || r->path[0] != '/') return -1;
    const char *payload = r->payload_hash ? r->payload_hash : SIGV4_UNSIGNED;
    if (strcmp(payload, SIGV4_UNSIGNED) != 0 && !hex64_ok(payload)) return -1;
    pairs q = {0}, h = {0};
    buf b, sh;
    buf_init(&b, CANON_MAX);
    buf_init(&sh, 4096);
    int rc = -1;
    char *path = xmalloc(strlen(r->path) * 3 + 1);
    char hosthdr[512];
    const char *hostv[2] = {hosthdr, NULL};
    if (sfmt(hosthdr, sizeof hosthdr, "host:%s", r->host) < 0) goto out;
    if (add_query(&q, r->query) < 0 || add_query(&q, extra_query) < 0) goto out;
    if (add_headers(&h, hostv) < 0 || add_headers(&h, r->headers) < 0 || add_headers(&h, extra_headers) < 0) goto out;
    if (sigv4_uri_encode(r->path, 1, path, strlen(r->path) * 3 + 1) < 0) goto out;
    if (buf_printf(&b, "%s\n%s\n", r->method, path) < 0 || join_query(&q, &b) < 0 || buf_appends(&b, "\n") < 0) goto out;
    qsort(h.p, (size_t)h.n, sizeof h.p[0], pair_cmp);
    for (int i = 0; i < h.n; i++) {
        if (buf_printf(&b, "%s:%s\n", h.p[i].name, h.p[i].value) < 0) goto out;
        if (buf_printf(&sh, "%s%s", i ? ";" : "", h.p[i].name) < 0) goto out;
    }
    if (buf_printf(&b, "\n%s\n%s", sh.data, payload) < 0) goto out;
    if (copy_out(&b, out, cap) < 0) goto out;
    if (signed_headers && copy_out(&sh, signed_headers, sh_cap) < 0) goto out;
    rc = 0;
out:
    if (rc < 0 && out && cap) out[0] = '\0';
    free(path);
    pairs_free(&q);
    pairs_free(&h);
    buf_release(&b);
    buf_release(&sh);
    return rc;
}

int sigv4_signing_key(const char *secret, const char *date8, const char *region, unsigned char key[32]) {
    if (!secret || !date8 || strlen(date8) != 8 || !region || !*region) return -1;
    char k0[300];
    if (sfmt(k0, sizeof k0, "AWS4%s", secret) < 0) return -1;
    unsigned char a[32], b2[32];
    const void *part[1];
    size_t len[1];
    int rc = -1;
    part[0] = date8, len[0] = 8;
    if (hmac_sha256(k0, strlen(k0), 1, part, len, a) < 0) goto out;
    part[0] = region, len[0] = strlen(region);
    if (hmac_sha256(a, 32, 1, part, len, b2) < 0) goto out;
    part[0] = "s3", len[0] = 2;
    if (hmac_sha256(b2, 32, 1, part, len, a) < 0) goto out;
    part[0] = "aws4_request", len[0] = 12;
    if (hmac_sha256(a, 32, 1, part, len, key) < 0) goto out;
    rc = 0;
out:
    explicit_bzero(k0, sizeof k0);
    explicit_bzero(a, sizeof a);
    explicit_bzero(b2, sizeof b2);
    return rc;
}

static int creds_ok(const sigv4_creds *c) {
    return c && c->akid && *c->akid && c->secret && *c->secret && c->region && *c->region;
}

/* hex(HMAC(signing key, string to sign)) of a canonical request */
static int sign(const sigv4_creds *c, const char amz_date[17], const char *canonical, char sig[65]) {
    char date8[9], scope[128], creq_hash[65], sts[512];
    memcpy(date8, amz_date, 8);
    date8[8] = '\0';
    if (sfmt(scope, sizeof scope, "%s/%s/s3/aws4_request", date8, c->region) < 0) return -1;
    sha256_hex(canonical, strlen(canonical), creq_hash);
    if (sfmt(sts, sizeof sts, ALGO "\n%s\n%s\n%s", amz_date, scope, creq_hash) < 0) return -1;
    unsigned char key[32], mac[32];
    if (sigv4_signing_key(c->secret, date8, c->region, key) < 0) return -1;
    const void *part[1] = {sts};
    size_t len[1] = {strlen(sts)};
    int rc = hmac_sha256(key, 32, 1, part, len, mac);
    explicit_bzero(key, sizeof key);
    if (rc < 0) return -1;
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        sig[2 * i] = hx[mac[i] >> 4];
        sig[2 * i + 1] = hx[mac[i] & 15];
    }
    sig[64] = '\0';
    return 0;
}

/* r->headers must not carry what the signer adds itself */
static int reserved_header(const char *const *h) {
    static const char *const names[] = {"host", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token",
                                        "authorization", NULL};
    for (; h && *h; h++) {
        const char *colon = strchr(*h, ':');
        size_t n = colon ? (size_t)(colon - *h) : strlen(*h);
        for (int i = 0; names[i]; i++)
            if (strlen(names[i]) == n && strncasecmp(*h, names[i], n) == 0) return 1;
    }
    return 0;
}

/* rejects query names the presigned URL sets itself */
static int reserved_query(const char *const *q) {
    for (; q && *q; q++)
        if (strncasecmp(*q, "X-Amz-", 6) == 0) return 1;
    return 0;
}

int sigv4_presign(const sigv4_creds *c, const sigv4_req *r, char *query_out, size_t cap) {
    if (query_out && cap) query_out[0] = '\0';
    if (!creds_ok(c) || !r || !query_out || r->expires_s < 1 || r->expires_s > 604800) return -1;
    if (r->payload_hash && strcmp(r->payload_hash, SIGV4_UNSIGNED) != 0) return -1;
    if (reserved_header(r->headers) || reserved_query(r->query)) return -1;
    char amz_date[17], credential[300], expires[16], signed_headers[1024];
    sigv4_amz_date(r->now, amz_date);
    if (sfmt(credential, sizeof credential, "X-Amz-Credential=%s/%.8s/%s/s3/aws4_request", c->akid, amz_date, c->region) < 0)
        return -1;
    snprintf(expires, sizeof expires, "%d", r->expires_s);
    /* the signed header names, for X-Amz-SignedHeaders, from a first canonical pass */
    char *canon = xmalloc(CANON_MAX);
    int rc = -1;
    buf b;
    buf_init(&b, CANON_MAX);
    pairs q = {0};
    char date_q[32], exp_q[32], sh_q[1100];
    char *token_q = NULL;
    if (sigv4_canonical_request(r, NULL, NULL, canon, CANON_MAX, signed_headers, sizeof signed_headers) < 0) goto out;
    snprintf(date_q, sizeof date_q, "X-Amz-Date=%s", amz_date);
    snprintf(exp_q, sizeof exp_q, "X-Amz-Expires=%s", expires);
    if (sfmt(sh_q, sizeof sh_q, "X-Amz-SignedHeaders=%s", signed_headers) < 0) goto out;
    if (c->token) token_q = xasprintf("X-Amz-Security-Token=%s", c->token);
    const char *extra[] = {"X-Amz-Algorithm=" ALGO, credential, date_q, exp_q, sh_q, token_q, NULL};
    sigv4_req rr = *r;
    rr.payload_hash = SIGV4_UNSIGNED;
    if (sigv4_canonical_request(&rr, extra, NULL, canon, CANON_MAX, NULL, 0) < 0) goto out;
    char sig[65];
    if (sign(c, amz_date, canon, sig) < 0) goto out;
    if (add_query(&q, r->query) < 0 || add_query(&q, extra) < 0 || join_query(&q, &b) < 0) goto out;
    if (buf_printf(&b, "&X-Amz-Signature=%s", sig) < 0) goto out;
    rc = copy_out(&b, query_out, cap);
out:
    if (token_q) {
        explicit_bzero(token_q, strlen(token_q));
        free(token_q);
    }
    free(canon);
    pairs_free(&q);
    buf_release(&b);
    return rc;
}

int sigv4_authorize(const sigv4_creds *c, const sigv4_req *r, char *auth_out, size_t cap, char amz_date[17]) {
    if (auth_out && cap) auth_out[0] = '\0';
    if (!creds_ok(c) || !r || !auth_out || !amz_date || reserved_header(r->headers)) return -1;
    sigv4_amz_date(r->now, amz_date);
    char date_h[40], sha_h[100];
    snprintf(date_h, sizeof date_h, "x-amz-date:%s", amz_date);
    if (sfmt(sha_h, sizeof sha_h, "x-amz-content-sha256:%s", r->payload_hash ? r->payload_hash : SIGV4_UNSIGNED) < 0)
        return -1;
    char *token_h = c->token ? xasprintf("x-amz-security-token:%s", c->token) : NULL;
    const char *extra[] = {date_h, sha_h, token_h, NULL};
    char *canon = xmalloc(CANON_MAX);
    char signed_headers[1024], sig[65];
    int rc = -1;
    if (sigv4_canonical_request(r, NULL, extra, canon, CANON_MAX, signed_headers, sizeof signed_headers) < 0) goto out;
    if (sign(c, amz_date, canon, sig) < 0) goto out;
    rc = sfmt(auth_out, cap, ALGO " Credential=%s/%.8s/%s/s3/aws4_request,SignedHeaders=%s,Signature=%s", c->akid,
              amz_date, c->region, signed_headers, sig);
    if (rc < 0) auth_out[0] = '\0';
out:
    if (token_h) {
        explicit_bzero(token_h, strlen(token_h));
        free(token_h);
    }
    free(canon);
    return rc;
}
