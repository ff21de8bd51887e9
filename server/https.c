/* https.c - the certificate handed to each TLS handshake (GnuTLS): see https.h. */
#include "https.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "../common/util.h"

/* The most certificates a chain may hold (the server's, intermediates, a root). */
#define HTTPS_CHAIN_MAX 16

/* A parsed pair: the chain and the key, copied for each handshake (from
 * parsed certificates: parsing the DER again would be 30 us a certificate,
 * copying a parsed one is 4 us). */
typedef struct https_pair {
    gnutls_x509_crt_t crt[HTTPS_CHAIN_MAX];
    unsigned n;
    gnutls_x509_privkey_t key;
} https_pair;

/* g_mu guards g_cur and every copy made from it: the copies read the
 * parsed certificates, which GnuTLS does not promise may be read by two
 * threads at once (a copy takes about 10 us under it). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static https_pair *g_cur;             /* NULL: none */
static int g_open;                    /* https_open'ed and not closed */

static void pair_free(https_pair *p) {
    if (!p) return;
    for (unsigned i = 0; i < p->n; i++) gnutls_x509_crt_deinit(p->crt[i]);
    if (p->key) gnutls_x509_privkey_deinit(p->key);
    free(p);
}

/* A copy of p for one handshake: 0, or a GnuTLS error code. */
static int pair_copy(const https_pair *p, gnutls_pcert_st **certs, unsigned *ncerts, gnutls_privkey_t *key) {
    *certs = NULL;
    *ncerts = 0;
    *key = NULL;
    gnutls_pcert_st *pc = gnutls_malloc(p->n * sizeof *pc);
    if (!pc) return GNUTLS_E_MEMORY_ERROR;
    unsigned done = 0;
    int rc = 0;
    for (; done < p->n; done++)
        if ((rc = gnutls_pcert_import_x509(&pc[done], p->crt[done], 0)) < 0) break;
    gnutls_privkey_t k = NULL;
    if (rc == 0 && (rc = gnutls_privkey_init(&k)) == 0 &&
        (rc = gnutls_privkey_import_x509(k, p->key, GNUTLS_PRIVKEY_IMPORT_COPY)) == 0) {
        *certs = pc;
        *ncerts = p->n;
        *key = k;
        return 0;
    }
    if (k) gnutls_privkey_deinit(k);
    for (unsigned i = 0; i < done; i++) gnutls_pcert_deinit(&pc[i]);
    gnutls_free(pc);
    return rc;
}

/* Parses and checks a pair: the pair, or NULL with err. */
static https_pair *pair_parse(const char *cert_pem, const char *key_pem, char *err, size_t errlen) {
    https_pair *p = xcalloc(1, sizeof *p);
    gnutls_x509_crt_t *crts = NULL;
    unsigned ncrts = 0;
    gnutls_datum_t cd = {(unsigned char *)cert_pem, (unsigned)strlen(cert_pem)};
    gnutls_datum_t kd = {(unsigned char *)key_pem, (unsigned)strlen(key_pem)};
    int rc = gnutls_x509_crt_list_import2(&crts, &ncrts, &cd, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0 || ncrts == 0) {
        snprintf(err, errlen, "the certificate does not parse: %s", rc < 0 ? gnutls_strerror(rc) : "none in it");
        goto fail;
    }
    if (ncrts > HTTPS_CHAIN_MAX) {
        snprintf(err, errlen, "the certificate's chain holds %u certificates, over %d", ncrts, HTTPS_CHAIN_MAX);
        goto fail;
    }
    /* the pair owns them from here */
    for (; p->n < ncrts; p->n++) p->crt[p->n] = crts[p->n];
    gnutls_free(crts);
    ncrts = 0;
    if ((rc = gnutls_x509_privkey_init(&p->key)) < 0 ||
        (rc = gnutls_x509_privkey_import2(p->key, &kd, GNUTLS_X509_FMT_PEM, NULL, GNUTLS_PKCS_PLAIN)) < 0) {
        snprintf(err, errlen, "the key does not parse (or is encrypted): %s", gnutls_strerror(rc));
        goto fail;
    }
    unsigned char cid[64], kid[64];
    size_t cn = sizeof cid, kn = sizeof kid;
    if ((rc = gnutls_x509_crt_get_key_id(p->crt[0], 0, cid, &cn)) < 0 ||
        (rc = gnutls_x509_privkey_get_key_id(p->key, 0, kid, &kn)) < 0) {
        snprintf(err, errlen, "the key's id cannot be taken: %s", gnutls_strerror(rc));
        goto fail;
    }
    if (cn != kn || memcmp(cid, kid, cn) != 0) {
        snprintf(err, errlen, "the key is not the certificate's");
        goto fail;
    }
    /* what each handshake will do, once now: a pair it cannot copy fails here */
    gnutls_pcert_st *pc;
    unsigned npc;
    gnutls_privkey_t k;
    if ((rc = pair_copy(p, &pc, &npc, &k)) < 0) {
        snprintf(err, errlen, "the certificate or key cannot be served: %s", gnutls_strerror(rc));
        goto fail;
    }
    for (unsigned i = 0; i < npc; i++) gnutls_pcert_deinit(&pc[i]);
    gnutls_free(pc);
    gnutls_privkey_deinit(k);
    return p;
fail:
    for (unsigned i = 0; i < ncrts; i++) gnutls_x509_crt_deinit(crts[i]);
    gnutls_free(crts);
    pair_free(p);
    return NULL;
}

static void must(int rc) {
    if (rc != 0) abort(); /* a mutex misused: a bug, not a condition */
}

int https_open(const char *cert_pem, const char *key_pem, char *err, size_t errlen) {
    https_pair *p = pair_parse(cert_pem, key_pem, err, errlen);
    if (!p) return -1;
    must(pthread_mutex_lock(&g_mu));
    int busy = g_open;
    if (!busy) {
        g_cur = p;
        g_open = 1;
    }
    must(pthread_mutex_unlock(&g_mu));
    if (busy) {
        pair_free(p);
        snprintf(err, errlen, "this process serves HTTPS already (one HTTPS daemon a process)");
        return -1;
    }
    return 0;
}

int https_set(const char *cert_pem, const char *key_pem, char *err, size_t errlen) {
    https_pair *p = pair_parse(cert_pem, key_pem, err, errlen);
    if (!p) return -1;
    must(pthread_mutex_lock(&g_mu));
    https_pair *old = g_open ? g_cur : p;
    int was_open = g_open;
    if (was_open) g_cur = p;
    must(pthread_mutex_unlock(&g_mu));
    /* no handshake holds old now: each copies under g_mu */
    pair_free(old);
    if (!was_open) {
        snprintf(err, errlen, "no HTTPS daemon runs: nothing to replace");
        return -1;
    }
    return 0;
}

void https_close(void) {
    must(pthread_mutex_lock(&g_mu));
    https_pair *old = g_cur;
    g_cur = NULL;
    g_open = 0;
    must(pthread_mutex_unlock(&g_mu));
    pair_free(old);
}

int https_retrieve(gnutls_session_t session, const struct gnutls_cert_retr_st *info, gnutls_pcert_st **certs,
                   unsigned int *certs_length, gnutls_ocsp_data_st **ocsp, unsigned int *ocsp_length,
                   gnutls_privkey_t *privkey, unsigned int *flags) {
    (void)session;
    (void)info;
    *certs = NULL;
    *certs_length = 0;
    *ocsp = NULL;
    *ocsp_length = 0;
    *privkey = NULL;
    must(pthread_mutex_lock(&g_mu));
    int rc = g_cur ? pair_copy(g_cur, certs, certs_length, privkey) : GNUTLS_E_INSUFFICIENT_CREDENTIALS;
    must(pthread_mutex_unlock(&g_mu));
    if (rc < 0) {
        log_warn("tls: a handshake got no certificate: %s", gnutls_strerror(rc));
        return -1;
    }
    *flags = GNUTLS_CERT_RETR_DEINIT_ALL;
    return 0;
}
