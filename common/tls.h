/* tls.h - certificates for HTTPS between our processes (OpenSSL): the
 * private CA and server certificate a server makes on its first start
 * (`--tls auto`), the checks a given certificate and key pass before
 * anything starts, and the CA's pin an agent joins with (as kubeadm's
 * --discovery-token-ca-cert-hash: sha256 of the CA's public key).
 *
 * Every function returns 0, or -1 with a one-line reason in err that names
 * the file or the hash. PEM strings handed back are the caller's to free.
 *
 * defines: tls_load_pair, tls_auto, tls_auto_renew_at, tls_cert_read,
 *          tls_ca_pin, tls_check_ca, tls_make_cert, tls_name_ok */
#ifndef TRAINYARD_TLS_H
#define TRAINYARD_TLS_H

#include <stddef.h>
#include <stdint.h>

/* The size of "sha256:" and 64 hex digits, with the NUL. */
#define TLS_PIN_LEN 72

/* How long `--tls auto`'s server certificate is valid unless told otherwise. */
#define TLS_AUTO_LIFETIME_S (365L * 86400)

/* What a certificate says of its own life. */
typedef struct tls_cert_info {
    int64_t not_before;               /* unix seconds */
    int64_t not_after;
    char not_after_text[24];          /* "2027-03-01T12:00:00Z" */
    char serial[48];                  /* hex digits, as `openssl x509 -serial` prints them */
} tls_cert_info;

/* Reads cert_file (PEM: the certificate, then any intermediates) and
 * key_file (PEM, unencrypted) and checks that the key is the certificate's
 * and that the certificate is valid now. */
int tls_load_pair(const char *cert_file, const char *key_file, char **cert_pem, char **key_pem, char *err,
                  size_t errlen);

/* `--tls auto`: in dir (made 0755 if missing) ca.crt (0644) and ca.key
 * (0600), a P-256 CA valid 10 years, made once; server.crt (0644) and
 * server.key (0600), signed by it for names (host names and IP addresses),
 * valid lifetime_s seconds (<= 0: TLS_AUTO_LIFETIME_S), made again when one
 * of names is not in it, when the CA did not sign it, or when its renewal
 * time (tls_auto_renew_at) has come. Hands back the server's certificate
 * (with the CA after it), key and the CA. Calling it again on a running
 * server renews the certificate when due and hands back the same one
 * otherwise. */
int tls_auto(const char *dir, const char *const *names, int n_names, long lifetime_s, char **cert_pem,
             char **key_pem, char **ca_pem, char *err, size_t errlen);

/* When `--tls auto` makes its server certificate again: once less than a
 * third of its lifetime (lifetime_s; <= 0: TLS_AUTO_LIFETIME_S) is left
 * before not_after (unix seconds). */
int64_t tls_auto_renew_at(int64_t not_after, long lifetime_s);

/* The dates and serial number of the first certificate in pem (n bytes). */
int tls_cert_read(const char *pem, size_t n, tls_cert_info *out, char *err, size_t errlen);

/* "sha256:HEX": the hash of the DER SubjectPublicKeyInfo of the first
 * certificate in pem (n bytes). */
int tls_ca_pin(const char *pem, size_t n, char out[TLS_PIN_LEN], char *err, size_t errlen);

/* pem (n bytes, read from what: a file name or a URL, for the message)
 * holds at least one certificate, and the first is valid now. */
int tls_check_ca(const char *pem, size_t n, const char *what, char *err, size_t errlen);

/* A P-256 key and a certificate for cn valid from now + not_before_s to now
 * + not_after_s seconds (negative: in the past), with names as its
 * subjectAltName; signed by (ca_cert_pem, ca_key_pem), or self-signed as a
 * CA when those are NULL. The server's `--tls auto` and the tests (an
 * expired certificate) make theirs with it. */
int tls_make_cert(const char *cn, long not_before_s, long not_after_s, const char *const *names, int n_names,
                  const char *ca_cert_pem, const char *ca_key_pem, char **cert_pem, char **key_pem, char *err,
                  size_t errlen);

/* 1 when s may go into a certificate's subjectAltName: a host name or an
 * IPv4/IPv6 address (letters, digits, '.', '-', ':'; under 254 bytes). */
int tls_name_ok(const char *s);

#endif
