/* https.h - what the HTTPS daemon offers (libmicrohttpd over GnuTLS): the
 * protocols and cipher suites (HTTPS_PRIORITIES), and the certificate each
 * handshake is handed, which may be replaced while the daemon runs (a
 * renewed `--tls auto` certificate, a `--tls-cert` re-read on SIGHUP)
 * without a restart: each handshake takes its own copy of the current one
 * (GnuTLS frees it with the session), so connections made before a swap
 * keep theirs and every later handshake is handed the new one.
 *
 * One certificate a process: GnuTLS's certificate callback brings no
 * pointer of ours, so the current one is this module's (the server runs one
 * daemon; https_open refuses a second).
 *
 * defines: HTTPS_PRIORITIES, https_open, https_set, https_close, https_retrieve */
#ifndef TRAINYARD_HTTPS_H
#define TRAINYARD_HTTPS_H

#include <stddef.h>
#include <gnutls/abstract.h>

/* Mozilla's "intermediate" server profile (Server Side TLS 5.7,
 * https://wiki.mozilla.org/Security/Server_Side_TLS#Intermediate_compatibility_.28recommended.29)
 * as a GnuTLS priority string: TLS 1.3 and 1.2 only; AEAD ciphers only
 * (AES-GCM, ChaCha20-Poly1305: no CBC, so neither BEAST nor LUCKY13 has a
 * suite to work on), each with forward secrecy (ECDHE; TLS 1.3's are so by
 * design); the profile's groups X25519, P-256 and P-384; SECURE's
 * signature algorithms (no SHA-1). The profile's three DHE-RSA suites are
 * left out: every client that speaks TLS 1.2 has ECDHE. `--tls auto`'s
 * P-256 key is served through ECDHE-ECDSA (and TLS 1.3), an RSA key given
 * with --tls-cert through ECDHE-RSA. `gnutls-cli --priority STRING -l`
 * lists the nine suites it yields (docs/server.md, "TLS"). */
#define HTTPS_PRIORITIES                                                                                          \
    "SECURE:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:"      \
    "-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1:+GROUP-SECP384R1"

/* Makes cert_pem (PEM: the certificate, then its chain) and key_pem (PEM,
 * unencrypted; the certificate's key) what handshakes are handed: 0, or -1
 * with err (a second daemon in this process, a PEM that does not parse, a
 * key that is not the certificate's). */
int https_open(const char *cert_pem, const char *key_pem, char *err, size_t errlen);

/* Replaces the certificate and key every later handshake is handed
 * (checked as https_open does): 0, or -1 with err, the current pair kept. */
int https_set(const char *cert_pem, const char *key_pem, char *err, size_t errlen);

/* Drops the current pair (after the daemon stopped): https_open may be
 * called again. */
void https_close(void);

/* libmicrohttpd's MHD_OPTION_HTTPS_CERT_CALLBACK2: a copy of the current
 * chain and key for one handshake, freed by GnuTLS with the session
 * (GNUTLS_CERT_RETR_DEINIT_ALL); -1 (the handshake fails) when none is set
 * or memory runs out. */
int https_retrieve(gnutls_session_t session, const struct gnutls_cert_retr_st *info, gnutls_pcert_st **certs,
                   unsigned int *certs_length, gnutls_ocsp_data_st **ocsp, unsigned int *ocsp_length,
                   gnutls_privkey_t *privkey, unsigned int *flags);

#endif
