/* tls.c - certificates (OpenSSL): see tls.h. */
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define TLS_FILE_MAX (1u << 20)
#define CA_DAYS 3650

static void ssl_reason(char *out, size_t n) {
    unsigned long e = ERR_get_error();
    if (e) ERR_error_string_n(e, out, n);
    else snprintf(out, n, "no reason given");
    ERR_clear_error();
}

static X509 *pem_cert(const char *pem, size_t n) {
    BIO *b = BIO_new_mem_buf(pem, (int)n);
    if (!b) return NULL;
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    return x;
}

static EVP_PKEY *pem_key(const char *pem, size_t n) {
    BIO *b = BIO_new_mem_buf(pem, (int)n);
    if (!b) return NULL;
    /* no passphrase callback: an encrypted key fails instead of prompting */
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, (void *)"");
    BIO_free(b);
    return k;
}

static char *bio_text(BIO *b) {
    char *p = NULL;
    long n = BIO_get_mem_data(b, &p);
    if (n <= 0 || !p) return NULL;
    return xstrndup(p, (size_t)n);
}

static char *cert_pem_text(X509 *x) {
    BIO *b = BIO_new(BIO_s_mem());
    if (!b) return NULL;
    char *s = PEM_write_bio_X509(b, x) == 1 ? bio_text(b) : NULL;
    BIO_free(b);
    return s;
}

static char *key_pem_text(EVP_PKEY *k) {
    BIO *b = BIO_new(BIO_s_mem());
    if (!b) return NULL;
    char *s = PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) == 1 ? bio_text(b) : NULL;
    BIO_free(b);
    return s;
}

static void asn1_time_text(const ASN1_TIME *t, char *out, size_t n) {
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) == 1) strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
    else snprintf(out, n, "an unreadable date");
}

/* t as unix seconds: 0, or -1 when it does not parse. */
static int asn1_time_unix(const ASN1_TIME *t, int64_t *out) {
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) != 1) return -1;
    time_t u = timegm(&tm);
    if (u == (time_t)-1) return -1;
    *out = (int64_t)u;
    return 0;
}

/* 0 when x is valid now; -1 with "what: the certificate expired on ..." */
static int check_dates(X509 *x, const char *what, char *err, size_t errlen) {
    char when[40];
    if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0) {
        asn1_time_text(X509_get0_notAfter(x), when, sizeof when);
        snprintf(err, errlen, "%s: the certificate expired on %s", what, when);
        return -1;
    }
    if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
        asn1_time_text(X509_get0_notBefore(x), when, sizeof when);
        snprintf(err, errlen, "%s: the certificate is not valid before %s", what, when);
        return -1;
    }
    return 0;
}

int tls_name_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 253) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == ':'))
            return 0;
    }
    return 1;
}

static int is_ip(const char *s) {
    unsigned char a[16];
    return inet_pton(AF_INET, s, a) == 1 || inet_pton(AF_INET6, s, a) == 1;
}

static int add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value) {
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, ctx, nid, value);
    if (!e) return -1;
    int ok = X509_add_ext(x, e, -1) == 1;
    X509_EXTENSION_free(e);
    return ok ? 0 : -1;
}

int tls_make_cert(const char *cn, long not_before_s, long not_after_s, const char *const *names, int n_names,
                  const char *ca_cert_pem, const char *ca_key_pem, char **cert_pem, char **key_pem, char *err,
                  size_t errlen) {
    *cert_pem = *key_pem = NULL;
    X509 *x = NULL, *ca = NULL;
    EVP_PKEY *key = NULL, *ca_key = NULL;
    BIGNUM *bn = NULL;
    buf san;
    buf_init(&san, 16384);
    int rc = -1;
    char why[256];
    if (ca_cert_pem) {
        ca = pem_cert(ca_cert_pem, strlen(ca_cert_pem));
        ca_key = ca_key_pem ? pem_key(ca_key_pem, strlen(ca_key_pem)) : NULL;
        if (!ca || !ca_key) {
            snprintf(err, errlen, "the CA's certificate or key does not parse");
            goto done;
        }
    }
    for (int i = 0; i < n_names; i++) {
        if (!tls_name_ok(names[i])) {
            snprintf(err, errlen, "'%.80s' cannot be a certificate's name (a host name or an IP address)", names[i]);
            goto done;
        }
        if (buf_printf(&san, "%s%s:%s", san.len ? "," : "", is_ip(names[i]) ? "IP" : "DNS", names[i]) < 0) {
            snprintf(err, errlen, "too many names for one certificate");
            goto done;
        }
    }
    key = EVP_EC_gen("P-256");
    x = X509_new();
    bn = BN_new();
    if (!key || !x || !bn) goto ssl_fail;
    /* a random positive 127-bit serial (RFC 5280: at most 20 octets) */
    if (BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1) goto ssl_fail;
    if (X509_set_version(x, 2) != 1 || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x))) goto ssl_fail;
    if (!X509_gmtime_adj(X509_getm_notBefore(x), not_before_s) || !X509_gmtime_adj(X509_getm_notAfter(x), not_after_s))
        goto ssl_fail;
    if (X509_set_pubkey(x, key) != 1) goto ssl_fail;
    X509_NAME *subj = X509_get_subject_name(x);
    if (X509_NAME_add_entry_by_txt(subj, "O", MBSTRING_UTF8, (const unsigned char *)"trainyard", -1, -1, 0) != 1 ||
        X509_NAME_add_entry_by_txt(subj, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0) != 1)
        goto ssl_fail;
    if (X509_set_issuer_name(x, ca ? X509_get_subject_name(ca) : subj) != 1) goto ssl_fail;
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, ca ? ca : x, x, NULL, NULL, 0);
    if (!ca) {
        if (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
            add_ext(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
            add_ext(x, &ctx, NID_subject_key_identifier, "hash") < 0)
            goto ssl_fail;
    } else {
        if (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
            add_ext(x, &ctx, NID_key_usage, "critical,digitalSignature,keyEncipherment") < 0 ||
            add_ext(x, &ctx, NID_ext_key_usage, "serverAuth") < 0 ||
            add_ext(x, &ctx, NID_subject_key_identifier, "hash") < 0 ||
            add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always") < 0)
            goto ssl_fail;
    }
    if (san.len && add_ext(x, &ctx, NID_subject_alt_name, san.data) < 0) goto ssl_fail;
    if (X509_sign(x, ca ? ca_key : key, EVP_sha256()) <= 0) goto ssl_fail;
    *cert_pem = cert_pem_text(x);
    *key_pem = key_pem_text(key);
    if (!*cert_pem || !*key_pem) goto ssl_fail;
    rc = 0;
    goto done;
ssl_fail:
    ssl_reason(why, sizeof why);
    snprintf(err, errlen, "cannot make a certificate for %s: %s", cn, why);
    free(*cert_pem);
    free(*key_pem);
    *cert_pem = *key_pem = NULL;
done:
    buf_release(&san);
    BN_free(bn);
    X509_free(x);
    X509_free(ca);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    return rc;
}

static char *read_file(const char *path, const char *what, char *err, size_t errlen) {
    size_t n = 0;
    errno = 0;
    char *s = file_read_all(path, TLS_FILE_MAX, &n);
    if (!s) {
        snprintf(err, errlen, "%s %s: %s", what, path, errno ? strerror(errno) : "cannot be read (or over 1 MiB)");
        return NULL;
    }
    return s;
}

int tls_load_pair(const char *cert_file, const char *key_file, char **cert_pem, char **key_pem, char *err,
                  size_t errlen) {
    *cert_pem = *key_pem = NULL;
    char *c = read_file(cert_file, "--tls-cert", err, errlen);
    if (!c) return -1;
    char *k = read_file(key_file, "--tls-key", err, errlen);
    if (!k) {
        free(c);
        return -1;
    }
    X509 *x = pem_cert(c, strlen(c));
    EVP_PKEY *key = x ? pem_key(k, strlen(k)) : NULL;
    int rc = -1;
    if (!x) snprintf(err, errlen, "--tls-cert %s: no PEM certificate in it", cert_file);
    else if (!key)
        snprintf(err, errlen, "--tls-key %s: no PEM private key in it (or the key is encrypted)", key_file);
    else if (X509_check_private_key(x, key) != 1)
        snprintf(err, errlen, "--tls-key %s is not the key of the certificate in --tls-cert %s", key_file, cert_file);
    else if (check_dates(x, cert_file, err, errlen) == 0)
        rc = 0;
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(key);
    if (rc == 0) {
        *cert_pem = c;
        *key_pem = k;
    } else {
        free(c);
        explicit_bzero(k, strlen(k));
        free(k);
    }
    return rc;
}

int tls_ca_pin(const char *pem, size_t n, char out[TLS_PIN_LEN], char *err, size_t errlen) {
    X509 *x = pem_cert(pem, n);
    if (!x) {
        ERR_clear_error();
        snprintf(err, errlen, "no PEM certificate to take the hash of");
        return -1;
    }
    unsigned char *der = NULL;
    int len = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(x), &der);
    X509_free(x);
    if (len <= 0) {
        ERR_clear_error();
        snprintf(err, errlen, "the certificate's public key cannot be encoded");
        return -1;
    }
    char hex[65];
    sha256_hex(der, (size_t)len, hex);
    OPENSSL_free(der);
    snprintf(out, TLS_PIN_LEN, "sha256:%s", hex);
    return 0;
}

int tls_check_ca(const char *pem, size_t n, const char *what, char *err, size_t errlen) {
    X509 *x = pem_cert(pem, n);
    if (!x) {
        ERR_clear_error();
        snprintf(err, errlen, "%s: no PEM certificate in it", what);
        return -1;
    }
    int rc = check_dates(x, what, err, errlen);
    X509_free(x);
    return rc;
}

int64_t tls_auto_renew_at(int64_t not_after, long lifetime_s) {
    if (lifetime_s <= 0) lifetime_s = TLS_AUTO_LIFETIME_S;
    return not_after - (int64_t)lifetime_s / 3;
}

int tls_cert_read(const char *pem, size_t n, tls_cert_info *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    X509 *x = pem_cert(pem, n);
    if (!x) {
        ERR_clear_error();
        snprintf(err, errlen, "no PEM certificate in it");
        return -1;
    }
    int rc = -1;
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
    char *hex = bn ? BN_bn2hex(bn) : NULL;
    if (asn1_time_unix(X509_get0_notBefore(x), &out->not_before) < 0 ||
        asn1_time_unix(X509_get0_notAfter(x), &out->not_after) < 0)
        snprintf(err, errlen, "the certificate's dates do not parse");
    else if (!hex || sfmt(out->serial, sizeof out->serial, "%s", hex) < 0)
        snprintf(err, errlen, "the certificate's serial number cannot be read (or is over 20 octets)");
    else
        rc = 0;
    if (rc == 0) asn1_time_text(X509_get0_notAfter(x), out->not_after_text, sizeof out->not_after_text);
    OPENSSL_free(hex);
    BN_free(bn);
    X509_free(x);
    ERR_clear_error();
    return rc;
}

/* 1 when the server certificate in pem was signed by ca, is not yet due
 * for renewal (tls_auto_renew_at) and names every one of names. */
static int server_cert_fits(const char *pem, X509 *ca, const char *const *names, int n_names, long lifetime_s) {
    X509 *x = pem_cert(pem, strlen(pem));
    int ok = 0;
    int64_t not_after = 0;
    if (!x) goto out;
    EVP_PKEY *ca_pub = X509_get0_pubkey(ca);
    if (!ca_pub || X509_verify(x, ca_pub) != 1) goto out;
    if (asn1_time_unix(X509_get0_notAfter(x), &not_after) < 0) goto out;
    if ((int64_t)time(NULL) >= tls_auto_renew_at(not_after, lifetime_s)) goto out;
    for (int i = 0; i < n_names; i++) {
        int m = is_ip(names[i]) ? X509_check_ip_asc(x, names[i], 0) : X509_check_host(x, names[i], 0, 0, NULL);
        if (m != 1) goto out;
    }
    ok = 1;
out:
    ERR_clear_error();
    X509_free(x);
    return ok;
}

static int write_file(const char *dir, const char *name, const char *text, int mode, char *err, size_t errlen) {
    char path[4200];
    if (sfmt(path, sizeof path, "%s/%s", dir, name) < 0 || file_write_atomic(path, text, strlen(text), mode) < 0) {
        snprintf(err, errlen, "cannot write %s/%s: %s", dir, name, strerror(errno));
        return -1;
    }
    return 0;
}

int tls_auto(const char *dir, const char *const *names, int n_names, long lifetime_s, char **cert_pem,
             char **key_pem, char **ca_pem, char *err, size_t errlen) {
    *cert_pem = *key_pem = *ca_pem = NULL;
    if (lifetime_s <= 0) lifetime_s = TLS_AUTO_LIFETIME_S;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot make %s: %s", dir, strerror(errno));
        return -1;
    }
    char path[4200];
    char *ca_c = NULL, *ca_k = NULL, *srv_c = NULL, *srv_k = NULL;
    X509 *ca = NULL;
    int rc = -1;
    size_t n;
    if (sfmt(path, sizeof path, "%s/ca.crt", dir) < 0) goto fail_long;
    ca_c = file_read_all(path, TLS_FILE_MAX, &n);
    if (sfmt(path, sizeof path, "%s/ca.key", dir) < 0) goto fail_long;
    ca_k = file_read_all(path, TLS_FILE_MAX, &n);
    if (ca_c && ca_k) {
        ca = pem_cert(ca_c, strlen(ca_c));
        EVP_PKEY *k = pem_key(ca_k, strlen(ca_k));
        int match = ca && k && X509_check_private_key(ca, k) == 1;
        EVP_PKEY_free(k);
        ERR_clear_error();
        if (!match) {
            snprintf(err, errlen, "%s/ca.crt and %s/ca.key are not a certificate and its key: remove both to make a new CA",
                     dir, dir);
            goto done;
        }
        if (check_dates(ca, "the CA in ca.crt", err, errlen) < 0) goto done;
    } else if (ca_c || ca_k) {
        snprintf(err, errlen, "%s holds one of ca.crt and ca.key without the other: remove it to make a new CA", dir);
        goto done;
    } else {
        char host[256] = "";
        if (gethostname(host, sizeof host - 1) < 0 || !tls_name_ok(host)) snprintf(host, sizeof host, "localhost");
        char cn[300];
        snprintf(cn, sizeof cn, "trainyard CA (%s)", host);
        if (tls_make_cert(cn, -3600, (long)CA_DAYS * 86400, NULL, 0, NULL, NULL, &ca_c, &ca_k, err, errlen) < 0)
            goto done;
        if (write_file(dir, "ca.key", ca_k, 0600, err, errlen) < 0 || write_file(dir, "ca.crt", ca_c, 0644, err, errlen) < 0)
            goto done;
        ca = pem_cert(ca_c, strlen(ca_c));
        if (!ca) goto done;
        log_info("tls: made a private CA in %s/ca.crt", dir);
    }
    if (sfmt(path, sizeof path, "%s/server.crt", dir) < 0) goto fail_long;
    srv_c = file_read_all(path, TLS_FILE_MAX, &n);
    if (sfmt(path, sizeof path, "%s/server.key", dir) < 0) goto fail_long;
    srv_k = file_read_all(path, TLS_FILE_MAX, &n);
    int fits = 0;
    if (srv_c && srv_k && server_cert_fits(srv_c, ca, names, n_names, lifetime_s)) {
        X509 *x = pem_cert(srv_c, strlen(srv_c));
        EVP_PKEY *k = pem_key(srv_k, strlen(srv_k));
        fits = x && k && X509_check_private_key(x, k) == 1;
        X509_free(x);
        EVP_PKEY_free(k);
        ERR_clear_error();
    }
    if (!fits) {
        free(srv_c);
        free(srv_k);
        srv_c = srv_k = NULL;
        if (tls_make_cert(n_names ? names[0] : "localhost", -3600, lifetime_s, names, n_names, ca_c, ca_k, &srv_c,
                          &srv_k, err, errlen) < 0)
            goto done;
        if (write_file(dir, "server.key", srv_k, 0600, err, errlen) < 0 ||
            write_file(dir, "server.crt", srv_c, 0644, err, errlen) < 0)
            goto done;
        log_info("tls: made a server certificate in %s/server.crt for %d names, valid %ld s", dir, n_names, lifetime_s);
    }
    /* the chain a client is shown: the server's certificate, then the CA */
    buf chain;
    buf_init(&chain, 4 * TLS_FILE_MAX);
    if (buf_appends(&chain, srv_c) < 0 || buf_appends(&chain, ca_c) < 0) {
        buf_release(&chain);
        goto fail_long;
    }
    *cert_pem = buf_detach(&chain, &n);
    *key_pem = srv_k;
    *ca_pem = ca_c;
    srv_k = NULL;
    ca_c = NULL;
    rc = 0;
    goto done;
fail_long:
    snprintf(err, errlen, "the TLS directory's path is too long: %s", dir);
done:
    X509_free(ca);
    free(ca_c);
    if (ca_k) explicit_bzero(ca_k, strlen(ca_k));
    free(ca_k);
    free(srv_c);
    if (srv_k) explicit_bzero(srv_k, strlen(srv_k));
    free(srv_k);
    return rc;
}
