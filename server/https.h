/* https.h - what the HTTPS daemon offers (libmicrohttpd over GnuTLS): the
 * protocols and cipher suites, as one GnuTLS priority string.
 *
 * defines: HTTPS_PRIORITIES */
#ifndef TRAINYARD_HTTPS_H
#define TRAINYARD_HTTPS_H

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

#endif
