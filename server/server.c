/* server.c - `trainyard server`: data directory, bootstrap tokens, the HTTP
 * daemon and the scheduler thread, and a clean stop on SIGINT/SIGTERM. */
#include "server.h"
#include "http.h"
#include "../common/size.h"
#include "../common/tls.h"
#include "../common/flags.h"
#include "../common/util.h"
#include "../storage/blob.h"
#include "../storage/cluster.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void server_options_default(server_options *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->host, sizeof o->host, "127.0.0.1");
    o->port = 8080;
    o->apps_port = -1;
    snprintf(o->data_dir, sizeof o->data_dir, "./.trainyard");
    o->heartbeat_timeout_s = 30;
    o->resize_interval_s = 30;
    o->log_level = LOG_INFO;
    o->log_format = LOG_TEXT;
    o->auth_fail_limit = 100;
    o->db_resident_mb = 2048;
    o->context_max_mb = 64;
    o->context_max_files = 100000;
    o->context_max_unpacked_mb = 1024;
    o->context_quota_mb = 2048;
    o->context_grace_s = 86400;
    o->log_retention_ms = 30LL * 86400 * 1000;
    o->audit_retention_ms = 365LL * 86400 * 1000;
    o->disk_reserve_bytes = 2LL << 30;
    o->log_max_per_job_default_mb = 1024;
    o->log_max_per_job_mb = 16 * 1024;
    snprintf(o->oidc_groups_claim, sizeof o->oidc_groups_claim, "groups");
    snprintf(o->oidc_group_map, sizeof o->oidc_group_map, "{team}:{role}");
    o->session_hours = 12;
    snprintf(o->blob_store, sizeof o->blob_store, "DATA");
    o->blob_url_ttl_s = 900;
    o->blob_upload_max_age_s = 21600;
    o->lease_ttl_ms = 6000;
}

int server_parse_listen(server_options *o, const char *s) {
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof o->host) return -1;
    long port;
    if (parse_long(colon + 1, 0, 65535, &port) < 0) return -1;
    memcpy(o->host, s, (size_t)(colon - s));
    o->host[colon - s] = '\0';
    o->port = (int)port;
    return 0;
}

/* Makes sure the token in DIR/name exists (creating it) and is known to the
 * database with the given kind and team. */
static int ensure_token(server *s, const char *name, token_kind kind, int64_t team_id, char *err,
                        size_t errlen) {
    char path[PATH_MAX + 32];
    if (sfmt(path, sizeof path, "%s/%s", s->opt.data_dir, name) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    char tok[128];
    size_t len = 0;
    char *have = file_read_all(path, 1024, &len);
    if (have) {
        while (len && (have[len - 1] == '\n' || have[len - 1] == '\r' || have[len - 1] == ' ')) have[--len] = '\0';
        if (len == 0 || len >= sizeof tok) {
            free(have);
            snprintf(err, errlen, "%s is not a valid token file; remove it to make a new token", path);
            return -1;
        }
        memcpy(tok, have, len + 1);
        free(have);
        principal who;
        int rc = store_token_lookup(s->db, tok, &who);
        if (rc == STORE_OK) return 0;
        if (rc == STORE_EXPIRED) { /* rotated away: the file is kept, the token no longer works */
            log_warn("%s holds a token that has expired (rotated): remove the file and restart for a new one",
                     path);
            return 0;
        }
        if (rc == STORE_ERROR || store_token_add(s->db, tok, kind, team_id, 0) != STORE_OK) {
            snprintf(err, errlen, "cannot record the token of %s", path);
            return -1;
        }
        return 0;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    if (random_token(tok, sizeof tok) < 0) {
        snprintf(err, errlen, "cannot make a random token: %s", strerror(errno));
        return -1;
    }
    /* The hash goes in first: a crash before the file is written leaves an
     * orphan hash (harmless); the file is never without its hash. */
    if (store_token_add(s->db, tok, kind, team_id, 0) != STORE_OK) {
        snprintf(err, errlen, "cannot store a new %s token", token_kind_name(kind));
        return -1;
    }
    char line[160];
    int n = snprintf(line, sizeof line, "%s\n", tok);
    if (file_write_atomic(path, line, (size_t)n, 0600) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    log_info("created %s (%s token)", path, token_kind_name(kind));
    if (kind == TOKEN_JOIN) {
        /* a new join token replaces the old one (rotation: remove the file, restart) */
        char hash[65];
        sha256_hex(tok, strlen(tok), hash);
        int revoked = cluster_join_tokens_revoke(s->db, hash, now_ms());
        if (revoked < 0) {
            snprintf(err, errlen, "cannot revoke the previous join token");
            return -1;
        }
        if (revoked > 0) log_info("revoked the previous join token");
    }
    return 0;
}

/* DATA/attempt.key (0600): 32 random bytes, made once; each attempt's
 * secret is derived from it, so nothing per attempt is stored, and a
 * restarted server hands the tasks of a running attempt the same secret. */
static int ensure_attempt_key(server *s, char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    if (sfmt(path, sizeof path, "%s/attempt.key", s->opt.data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    size_t n = 0;
    unsigned char *have = (unsigned char *)file_read_all(path, 64, &n);
    if (have && n == sizeof s->attempt_key) {
        memcpy(s->attempt_key, have, n);
        explicit_bzero(have, n);
        free(have);
        return 0;
    }
    if (have) {
        free(have);
        snprintf(err, errlen, "%s is not %zu bytes: remove it to make a new one (running jobs' tasks then fail to join)",
                 path, sizeof s->attempt_key);
        return -1;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    if (getrandom(s->attempt_key, sizeof s->attempt_key, 0) != (ssize_t)sizeof s->attempt_key ||
        file_write_atomic(path, s->attempt_key, sizeof s->attempt_key, 0600) < 0) {
        snprintf(err, errlen, "cannot make %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

void server_attempt_secret(const server *s, int64_t job, int attempt, char out[65]) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "trainyard-attempt %lld %d", (long long)job, attempt);
    const void *part[1] = {msg};
    size_t len[1] = {(size_t)n};
    unsigned char mac[32];
    if (hmac_sha256(s->attempt_key, sizeof s->attempt_key, 1, part, len, mac) < 0) abort(); /* OpenSSL broken */
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", mac[i]);
    explicit_bzero(mac, sizeof mac);
}

/* One server per data directory: a second would be a second writer of its
 * database (two schedulers placing the same jobs, and the answers and
 * tokens kept on db_generation going stale). flock, so the kernel lets go
 * when the holder dies, kill -9 included; the file names the holder. */
static int lock_data_dir(server *s, char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    if (sfmt(path, sizeof path, "%s/server.lock", s->opt.data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK)
            snprintf(err, errlen, "the data directory %s is in use by another trainyard server (pid %s); stop it or give another --data",
                     s->opt.data_dir, holder[0] ? holder : "unknown");
        else
            snprintf(err, errlen, "cannot lock %s: %s", path, strerror(e));
        return -1;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        log_warn("cannot write the pid into %s: %s", path, strerror(errno));
    s->lock_fd = fd;
    return 0;
}

int server_host_is_loopback(const char *host) {
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* The names --tls auto's certificate carries: this host's name, the
 * --public-url host, the --listen address unless a wildcard, and loopback. */
static int tls_names(const server_options *o, char names[][256], int max) {
    int n = 0;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) == 0 && tls_name_ok(host)) snprintf(names[n++], 256, "%s", host);
    if (o->public_url[0]) {
        const char *h = strstr(o->public_url, "://");
        h = h ? h + 3 : o->public_url;
        char pu[256];
        snprintf(pu, sizeof pu, "%s", h);
        if (pu[0] == '[') { /* [v6]:port */
            memmove(pu, pu + 1, strlen(pu));
            pu[strcspn(pu, "]")] = '\0';
        } else
            pu[strcspn(pu, ":/")] = '\0';
        if (tls_name_ok(pu) && n < max) snprintf(names[n++], 256, "%s", pu);
    }
    if (strcmp(o->host, "0.0.0.0") != 0 && tls_name_ok(o->host) && n < max) snprintf(names[n++], 256, "%s", o->host);
    const char *fixed[] = {"localhost", "127.0.0.1", "::1"};
    for (int i = 0; i < 3 && n < max; i++) snprintf(names[n++], 256, "%s", fixed[i]);
    /* no name twice */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int j = 0; j < m; j++) dup |= strcmp(names[i], names[j]) == 0;
        if (!dup && m != i) memcpy(names[m], names[i], 256);
        if (!dup) m++;
    }
    return m;
}

static void tls_release(server *s) {
    free(s->tls_cert_pem);
    if (s->tls_key_pem) explicit_bzero(s->tls_key_pem, strlen(s->tls_key_pem));
    free(s->tls_key_pem);
    free(s->tls_ca_pem);
    s->tls_cert_pem = s->tls_key_pem = s->tls_ca_pem = NULL;
    s->tls_ca_pin[0] = '\0';
}

/* A --tls-cert within this many days of its end is warned about, at start and daily. */
#define TLS_WARN_DAYS 30
/* TRAINYARD_TLS_AUTO_LIFETIME_S's least: a certificate renewed every few seconds. */
#define TLS_AUTO_LIFETIME_MIN_S 6

/* TRAINYARD_TLS_AUTO_LIFETIME_S, a setting for tests (a --tls auto
 * certificate that renews within seconds): 0 with *out (TLS_AUTO_LIFETIME_S
 * when unset), or -1 with err. */
static int tls_auto_lifetime(long *out, char *err, size_t errlen) {
    const char *e = getenv("TRAINYARD_TLS_AUTO_LIFETIME_S");
    *out = TLS_AUTO_LIFETIME_S;
    if (!e || !*e) return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || end == e || *end || v < TLS_AUTO_LIFETIME_MIN_S || v > 10 * TLS_AUTO_LIFETIME_S) {
        snprintf(err, errlen, "TRAINYARD_TLS_AUTO_LIFETIME_S (a setting for tests) wants seconds from %d to %ld, got '%.40s'",
                 TLS_AUTO_LIFETIME_MIN_S, 10 * TLS_AUTO_LIFETIME_S, e);
        return -1;
    }
    *out = v;
    return 0;
}

/* --tls auto's CA and server certificate under DATA/tls, made, kept or
 * renewed (tls_auto): 0 with the PEMs (the caller's), or -1 with err. */
static int tls_auto_pair(const server *s, char **cert, char **key, char **ca, char *err, size_t errlen) {
    char names[8][256], dir[PATH_MAX + 8];
    const char *np[8];
    int n = tls_names(&s->opt, names, 8);
    for (int i = 0; i < n; i++) np[i] = names[i];
    if (sfmt(dir, sizeof dir, "%s/tls", s->opt.data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    return tls_auto(dir, np, n, s->tls_auto_lifetime_s, cert, key, ca, err, errlen);
}

/* Notes what the certificate in pem (the one served now) says of its
 * life, and when the serve loop looks at it next: --tls auto's renewal
 * time, at once for --tls-cert (its expiry warning). 0, or -1 with err. */
static int tls_note(server *s, const char *pem, char *err, size_t errlen) {
    tls_cert_info info;
    if (tls_cert_read(pem, strlen(pem), &info, err, errlen) < 0) return -1;
    s->tls_not_after = info.not_after;
    snprintf(s->tls_not_after_text, sizeof s->tls_not_after_text, "%s", info.not_after_text);
    snprintf(s->tls_serial, sizeof s->tls_serial, "%s", info.serial);
    s->tls_next_check = s->opt.tls_auto ? tls_auto_renew_at(info.not_after, s->tls_auto_lifetime_s) : 0;
    return 0;
}

static void explicit_free(char *p) {
    if (p) explicit_bzero(p, strlen(p));
    free(p);
}

/* --tls auto on a running server (its timer, or SIGHUP): tls_auto again,
 * which renews the certificate when due, and handshakes are handed the new
 * one; said in the log, with why. A failure is logged and tried again
 * within a minute; the certificate served stays. */
static void tls_auto_renew(server *s, const char *why) {
    char err[512];
    char *cert = NULL, *key = NULL, *ca = NULL;
    int64_t now = (int64_t)time(NULL);
    long retry = s->tls_auto_lifetime_s / 6 < 60 ? s->tls_auto_lifetime_s / 6 : 60;
    if (tls_auto_pair(s, &cert, &key, &ca, err, sizeof err) < 0) {
        log_error("tls: cannot renew the server certificate (%s): %s; serial %s is served until %s, trying again in %ld s",
                  why, err, s->tls_serial, s->tls_not_after_text, retry);
        s->tls_next_check = now + retry;
        return;
    }
    tls_cert_info info;
    if (strcmp(ca, s->tls_ca_pem) != 0) {
        /* the CA's files were removed and tls_auto made another: clients
         * trust the old one, so the old chain stays until a restart */
        log_error("tls: %s/tls/ca.crt is no longer the CA this server started with: the server certificate is not "
                  "renewed; restart the server to serve the new CA (and give clients its ca.crt)",
                  s->opt.data_dir);
        s->tls_next_check = now + 86400;
    } else if (tls_cert_read(cert, strlen(cert), &info, err, sizeof err) < 0) {
        log_error("tls: the renewed server certificate (%s): %s; trying again in %ld s", why, err, retry);
        s->tls_next_check = now + retry;
    } else if (strcmp(info.serial, s->tls_serial) == 0) {
        if (strcmp(why, "SIGHUP") == 0)
            log_info("tls: SIGHUP: %s/tls/server.crt is current (serial %s, valid until %s)", s->opt.data_dir,
                     s->tls_serial, s->tls_not_after_text);
        s->tls_next_check = tls_auto_renew_at(info.not_after, s->tls_auto_lifetime_s);
        if (s->tls_next_check <= now) s->tls_next_check = now + retry;
    } else if (http_tls_replace(s->http, cert, key, err, sizeof err) < 0) {
        log_error("tls: cannot serve the renewed server certificate (%s): %s; serial %s is served until %s, trying "
                  "again in %ld s",
                  why, err, s->tls_serial, s->tls_not_after_text, retry);
        s->tls_next_check = now + retry;
    } else {
        char old[48];
        snprintf(old, sizeof old, "%s", s->tls_serial);
        if (tls_note(s, cert, err, sizeof err) < 0) s->tls_next_check = now + retry; /* read above: cannot fail */
        time_t next = (time_t)s->tls_next_check;
        struct tm tm;
        char when[32] = "?";
        if (gmtime_r(&next, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        log_info("tls: renewed the server certificate (%s): %s/tls/server.crt, serial %s (was %s), valid until %s, "
                 "same CA; the next renewal at %s",
                 why, s->opt.data_dir, s->tls_serial, old, s->tls_not_after_text, when);
    }
    free(cert);
    explicit_free(key);
    free(ca);
}

/* --tls-cert within TLS_WARN_DAYS of its end (or past it): a warning naming
 * the file and the date; looked at again in a day. */
static void tls_cert_warn(server *s) {
    int64_t now = (int64_t)time(NULL);
    double days = (double)(s->tls_not_after - now) / 86400.0;
    if (days <= 0)
        log_error("tls: --tls-cert %s expired on %s: clients refuse it; put a valid certificate (and its --tls-key) "
                  "there and send SIGHUP (kill -HUP %d)",
                  s->opt.tls_cert, s->tls_not_after_text, (int)getpid());
    else if (days < TLS_WARN_DAYS)
        log_warn("tls: --tls-cert %s expires on %s (in %.1f %s): put a new certificate (and its --tls-key) there "
                 "and send SIGHUP (kill -HUP %d)",
                 s->opt.tls_cert, s->tls_not_after_text, days < 1 ? days * 24 : days, days < 1 ? "hours" : "days",
                 (int)getpid());
    s->tls_next_check = now + 86400;
}

/* SIGHUP: --tls-cert and --tls-key read again and served from the next
 * handshake on; a pair that fails tls_load_pair's checks is logged with why
 * and the one served stays. --tls auto: renewed if due. */
static void tls_reread(server *s) {
    if (!s->tls_cert_pem) {
        log_info("SIGHUP: the server serves plain HTTP: no certificate to read again");
        return;
    }
    if (s->opt.tls_auto) {
        tls_auto_renew(s, "SIGHUP");
        return;
    }
    char err[1024], why[512];
    char *cert = NULL, *key = NULL;
    int ok = tls_load_pair(s->opt.tls_cert, s->opt.tls_key, &cert, &key, why, sizeof why) == 0 &&
             http_tls_replace(s->http, cert, key, why, sizeof why) == 0;
    if (!ok) {
        log_error("tls: SIGHUP: %s; still serving the certificate read before (serial %s, valid until %s)", why,
                  s->tls_serial, s->tls_not_after_text);
    } else if (tls_note(s, cert, err, sizeof err) < 0) {
        log_error("tls: SIGHUP: %s: %s", s->opt.tls_cert, err); /* tls_load_pair read it: cannot happen */
    } else {
        log_info("tls: SIGHUP: serving %s now (serial %s, valid until %s)", s->opt.tls_cert, s->tls_serial,
                 s->tls_not_after_text);
        tls_cert_warn(s);
    }
    free(cert);
    explicit_free(key);
}

/* TLS from the options: a given pair checked, or --tls auto's made or
 * read; plain HTTP off loopback refused unless --insecure-http. */
static int tls_setup(server *s, char *err, size_t errlen) {
    const server_options *o = &s->opt;
    if (o->tls_cert[0] || o->tls_key[0]) {
        if (!o->tls_cert[0] || !o->tls_key[0]) {
            snprintf(err, errlen, "--tls-cert and --tls-key go together");
            return -1;
        }
        if (tls_load_pair(o->tls_cert, o->tls_key, &s->tls_cert_pem, &s->tls_key_pem, err, errlen) < 0) return -1;
        char why[256];
        if (tls_note(s, s->tls_cert_pem, why, sizeof why) < 0) {
            snprintf(err, errlen, "--tls-cert %s: %s", o->tls_cert, why);
            return -1;
        }
        return 0;
    }
    if (o->tls_auto) {
        if (tls_auto_lifetime(&s->tls_auto_lifetime_s, err, errlen) < 0) return -1;
        if (tls_auto_pair(s, &s->tls_cert_pem, &s->tls_key_pem, &s->tls_ca_pem, err, errlen) < 0) return -1;
        if (tls_ca_pin(s->tls_ca_pem, strlen(s->tls_ca_pem), s->tls_ca_pin, err, errlen) < 0) return -1;
        return tls_note(s, s->tls_cert_pem, err, errlen);
    }
    if (o->apps_port >= 0 && !server_host_is_loopback(o->apps_host) && !o->insecure_http) {
        snprintf(err, errlen, "refusing plain HTTP for a job's apps on %s: give --tls auto (or --tls-cert and "
                 "--tls-key), or --insecure-http", o->apps_host);
        return -1;
    }
    if (!server_host_is_loopback(o->host) && !o->insecure_http) {
        snprintf(err, errlen,
                 "refusing plain HTTP on %s: every token would cross the network in the clear; give --tls auto "
                 "(or --tls-cert FILE --tls-key FILE), or --insecure-http to serve in the clear anyway",
                 o->host);
        return -1;
    }
    return 0;
}

/* --db-password-file: read once, handed to libpq, wiped. */
static int db_password_from_file(const char *path, char *err, size_t errlen) {
    if (!path[0]) return 0;
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--db-password-file %s: not a readable file", path);
        return -1;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "--db-password-file %s: mode %03o lets others read it; chmod 600 it", path,
                 (unsigned)(st.st_mode & 0777));
        return -1;
    }
    size_t n = 0;
    char *pw = file_read_all(path, 4096, &n);
    if (!pw) {
        snprintf(err, errlen, "--db-password-file %s: %s", path, strerror(errno));
        return -1;
    }
    while (n && (pw[n - 1] == '\n' || pw[n - 1] == '\r')) pw[--n] = '\0';
    if (!n || memchr(pw, '\0', n) || memchr(pw, '\n', n)) {
        explicit_bzero(pw, n);
        free(pw);
        snprintf(err, errlen, "--db-password-file %s: not one line of password", path);
        return -1;
    }
    db_set_password(pw);
    explicit_bzero(pw, n);
    free(pw);
    return 0;
}

/* This server's id among those sharing a database: DATA/server.id, made
 * on its first start. */
static int server_id(server *s, char id[33], char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    if (sfmt(path, sizeof path, "%s/server.id", s->opt.data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    size_t n = 0;
    char *have = file_read_all(path, 64, &n);
    if (have && n >= 32) {
        memcpy(id, have, 32);
        id[32] = '\0';
        free(have);
        return 0;
    }
    free(have);
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        snprintf(err, errlen, "cannot make a server id: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 16; i++) snprintf(id + 2 * i, 3, "%02x", r[i]);
    char line[40];
    int m = snprintf(line, sizeof line, "%.32s\n", id);
    if (file_write_atomic(path, line, (size_t)m, 0644) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* PostgreSQL: the attempts' key is the database's (ty_meta), the first
 * leader's DATA/attempt.key, so every server derives the same secrets. */
static int shared_attempt_key(server *s, char *err, size_t errlen) {
    char mine[2 * sizeof s->attempt_key + 1], got[2 * sizeof s->attempt_key + 8];
    for (size_t i = 0; i < sizeof s->attempt_key; i++) snprintf(mine + 2 * i, 3, "%02x", s->attempt_key[i]);
    if (db_meta_ensure(s->db, "attempt_key", mine, got, sizeof got) < 0 || strlen(got) != 2 * sizeof s->attempt_key) {
        snprintf(err, errlen, "cannot read the attempts' key from the database");
        return -1;
    }
    for (size_t i = 0; i < sizeof s->attempt_key; i++) {
        unsigned v = 0;
        if (sscanf(got + 2 * i, "%2x", &v) != 1) {
            snprintf(err, errlen, "the database's attempts' key is not hex");
            return -1;
        }
        s->attempt_key[i] = (unsigned char)v;
    }
    explicit_bzero(mine, sizeof mine);
    explicit_bzero(got, sizeof got);
    return 0;
}

/* What a leader makes sure of before it serves: the team 'default', the
 * attempts' key and the three tokens. On a database another server set up
 * (PostgreSQL, several servers) the tokens it made are left as they are:
 * this server's DATA gets no new ones (they would be other valid admin and
 * join tokens, and a new join token revokes the old), and the key every
 * attempt's secret comes from is the database's (ty_meta), so a task's
 * secret is the same whichever server leads. */
static int leader_setup(server *s, char *err, size_t errlen) {
    int64_t team_id = 0;
    int rc = store_team_find(s->db, "default", &team_id);
    if (rc == STORE_NOT_FOUND) rc = store_team_create(s->db, "default", &team_id);
    if (rc == STORE_CONFLICT) rc = store_team_find(s->db, "default", &team_id); /* another server made it */
    if (rc != STORE_OK) {
        snprintf(err, errlen, "cannot create the team 'default'");
        return -1;
    }
    if (ensure_attempt_key(s, err, errlen) < 0) return -1;
    if (strcmp(db_engine(s->db), "postgres") == 0 && shared_attempt_key(s, err, errlen) < 0) return -1;
    char path[PATH_MAX + 32];
    int64_t admins = 0;
    if (strcmp(db_engine(s->db), "postgres") == 0 && sfmt(path, sizeof path, "%s/admin.token", s->opt.data_dir) == 0 &&
        access(path, F_OK) != 0 && store_token_count(s->db, TOKEN_ADMIN, &admins) == STORE_OK && admins > 0) {
        log_info("the tokens of this cluster were made by the server that set the database up: copy its "
                 "admin.token, token and node.token into %s to use them from here", s->opt.data_dir);
        return 0;
    }
    if (ensure_token(s, "admin.token", TOKEN_ADMIN, 0, err, errlen) < 0 ||
        ensure_token(s, "token", TOKEN_TEAM, team_id, err, errlen) < 0 ||
        ensure_token(s, "node.token", TOKEN_JOIN, 0, err, errlen) < 0)
        return -1;
    return 0;
}

/* With the state in PostgreSQL: take part in the election. The first look
 * at the lease decides how this server starts (a free lease is taken at
 * once); a standby serves its health and 503s until it leads. */
static int lead(server *s, char *err, size_t errlen) {
    char id[33], url[160];
    if (server_id(s, id, err, errlen) < 0) return -1;
    if (s->opt.public_url[0]) snprintf(url, sizeof url, "%s", s->opt.public_url);
    else
        snprintf(url, sizeof url, "%s://%s:%d", s->opt.tls_auto || s->opt.tls_cert[0] ? "https" : "http", s->opt.host,
                 s->opt.port);
    db_lease_cfg cfg = {.holder = id, .url = url, .ttl_ms = s->opt.lease_ttl_ms,
                        .renew_ms = s->opt.lease_ttl_ms / 6, .deadline_ms = s->opt.lease_ttl_ms * 2 / 3};
    if (db_lease_start(s->db, &cfg, err, errlen) < 0) return -1;
    if (db_lease_wait(s->db, 1500) < 0) {
        char leader[512];
        int64_t left = 0;
        db_leader(s->db, leader, sizeof leader, &left);
        log_info("standing by: %s%s", leader[0] ? "the leader is " : "",
                 leader[0] ? leader : "no server leads; the lease is free within seconds");
    }
    return 0;
}

int server_open(server *s, const server_options *opt, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->opt = *opt;
    s->lock_fd = -1;
    /* a bad certificate or key, or plain HTTP off loopback: nothing made or started */
    if (!opt->tls_auto && tls_setup(s, err, errlen) < 0) return -1;
    if (mkdir_p(opt->data_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", opt->data_dir, strerror(errno));
        return -1;
    }
    if (lock_data_dir(s, err, errlen) < 0) {
        tls_release(s);
        return -1;
    }
    if (opt->tls_auto && tls_setup(s, err, errlen) < 0) goto fail;
    char path[PATH_MAX + 32];
    if (sfmt(path, sizeof path, "%s/trainyard.db", opt->data_dir) < 0 ||
        sfmt(s->checkpoint_dir, sizeof s->checkpoint_dir, "%s/checkpoints", opt->data_dir) < 0 ||
        sfmt(s->log_dir, sizeof s->log_dir, "%s/logs", opt->data_dir) < 0 ||
        sfmt(s->context_dir, sizeof s->context_dir, "%s/contexts", opt->data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        goto fail;
    }
    if (mkdir_p(s->checkpoint_dir, 0700) < 0 || mkdir_p(s->log_dir, 0700) < 0 || mkdir_p(s->context_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot create directories under %s: %s", opt->data_dir, strerror(errno));
        goto fail;
    }
    /* DATA/relay: the temporary copies of objects a ?via=server download
     * relays (api/blobs_api.c), unlinked once opened; what a crash left */
    char relay[PATH_MAX + 16];
    if (sfmt(relay, sizeof relay, "%s/relay", opt->data_dir) == 0) rm_tree(relay);
    /* the blob store: opened and probed before anything is served; a store
     * that does not answer as it should is one line and no server */
    blob_err be;
    memset(&be, 0, sizeof be);
    int brc = blob_store_open(opt->blob_store, opt->blob_credentials[0] ? opt->blob_credentials : NULL,
                              opt->data_dir, &s->blobs, &be);
    if (brc == BLOB_OK) brc = blob_store_check(s->blobs, &be);
    if (brc != BLOB_OK) {
        const char *url = s->blobs && blob_store_url(s->blobs)[0] ? blob_store_url(s->blobs) : NULL;
        char answer[400];
        if (be.http) snprintf(answer, sizeof answer, "%d %s: %s", be.http, be.code, be.msg);
        else if (be.code[0]) snprintf(answer, sizeof answer, "%s: %s", be.code, be.msg);
        else snprintf(answer, sizeof answer, "%s", be.msg[0] ? be.msg : blob_strerror(brc));
        if (url) snprintf(err, errlen, "blob store %s: %s", url, answer);
        else if (strcmp(opt->blob_store, "DATA") == 0)
            snprintf(err, errlen, "blob store DATA (%s): %s", opt->data_dir, answer);
        else snprintf(err, errlen, "--blob-store: %s", answer);
        goto fail;
    }
    db_set_durability_full(opt->durability_full);
    db_set_resident_max_mb(opt->db_resident_mb);
    if (opt->db_url[0]) {
        if (db_password_from_file(opt->db_password_file, err, errlen) < 0) goto fail;
        /* a leader that stepped down starts again as a standby (cmd_server)
         * and waits for the database it may have lost; a first start says
         * once why it cannot and exits */
        for (int said = 0; db_open(&s->db, opt->db_url, err, errlen) < 0; said = 1) {
            if (!getenv("TRAINYARD_STANDBY_AGAIN")) goto fail;
            if (!said) log_warn("%s; trying again every second", err);
            sleep(1);
        }
        if (lead(s, err, errlen) < 0) goto fail;
    } else if (db_open(&s->db, path, err, errlen) < 0) {
        goto fail;
    }
    quota_disk_reserve_set(s->db, opt->data_dir, opt->disk_reserve_bytes, opt->disk_reserve_pct);
    if (db_role(s->db) == DB_LEADER && leader_setup(s, err, errlen) < 0) goto fail;
    return 0;
fail:
    db_close(s->db);
    s->db = NULL;
    blob_store_close(s->blobs);
    s->blobs = NULL;
    close(s->lock_fd);
    s->lock_fd = -1;
    tls_release(s);
    return -1;
}

static volatile sig_atomic_t g_stop = 0;
static volatile sig_atomic_t g_reread = 0;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void on_hup(int sig) {
    (void)sig;
    g_reread = 1;
}

int server_serve(server *s, const server_app *app, volatile sig_atomic_t *stop) {
    char err[256];
    if (!stop) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sa.sa_handler = on_hup; /* the certificate read again (tls_reread) */
        sigaction(SIGHUP, &sa, NULL);
        stop = &g_stop;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(s->opt.access_log, "none") != 0) {
        char path[PATH_MAX + 32];
        if (s->opt.access_log[0]) snprintf(path, sizeof path, "%s", s->opt.access_log);
        else snprintf(path, sizeof path, "%s/access.log", s->opt.data_dir);
        if (http_access_log_open(path) < 0) log_warn("cannot open the access log %s: %s", path, strerror(errno));
    }
    http_set_auth_fail_limit(s->opt.auth_fail_limit);
    s->http = http_start(s, s->db, s->opt.context_max_mb, s->opt.host, s->opt.port, app->routes, s->tls_cert_pem,
                         s->tls_key_pem, &s->port, err, sizeof err);
    if (!s->http) {
        log_error("%s", err);
        return 1;
    }
    snprintf(s->url, sizeof s->url, "%s://%s:%d", s->tls_cert_pem ? "https" : "http", s->opt.host, s->port);
    snprintf(s->public_url, sizeof s->public_url, "%s", s->opt.public_url[0] ? s->opt.public_url : s->url);
    db_lease_set_url(s->db, s->public_url); /* the port bound, where --listen said 0 */
    if (s->opt.apps_port >= 0 && app->apps_routes) {
        /* a job's apps on an origin of their own: their pages cannot read the
         * dashboard's storage nor ride its session (docs/server.md, "Origins") */
        int apps_port = 0;
        s->apps_http = http_start(s, s->db, s->opt.context_max_mb, s->opt.apps_host, s->opt.apps_port,
                                  app->apps_routes, s->tls_cert_pem, s->tls_key_pem, &apps_port, err, sizeof err);
        if (!s->apps_http) {
            log_error("the apps' listener: %s", err);
            http_stop(s->http);
            s->http = NULL;
            return 1;
        }
        http_set_apps_only(s->apps_http);
        if (s->opt.apps_url[0]) snprintf(s->apps_url, sizeof s->apps_url, "%s", s->opt.apps_url);
        else
            snprintf(s->apps_url, sizeof s->apps_url, "%s://%s:%d", s->tls_cert_pem ? "https" : "http",
                     s->opt.apps_host, apps_port);
        if (http_set_moved(s->http, "/proxy/", s->apps_url) < 0) log_warn("the apps' URL is too long to redirect to");
        char apath[PATH_MAX + 32], aline[200];
        int an = snprintf(aline, sizeof aline, "%s\n", s->apps_url);
        if (sfmt(apath, sizeof apath, "%s/apps.url", s->opt.data_dir) == 0 && an > 0 && (size_t)an < sizeof aline)
            if (file_write_atomic(apath, aline, (size_t)an, 0644) < 0) log_warn("cannot write %s", apath);
        log_info("a job's apps are served at %s (its own origin)", s->apps_url);
    }
    int leads = db_role(s->db) == DB_LEADER, started = 0;
    if (leads && app->start && app->start(s, err, sizeof err) < 0) {
        log_error("%s", err);
        if (s->apps_http) http_stop(s->apps_http);
        s->apps_http = NULL;
        http_stop(s->http);
        s->http = NULL;
        return 1;
    }
    started = leads;
    /* Tests and scripts find a server started on port 0 through this file. */
    char path[PATH_MAX + 32], line[160];
    int n = snprintf(line, sizeof line, "%s\n", s->url);
    if (sfmt(path, sizeof path, "%s/server.url", s->opt.data_dir) == 0)
        if (file_write_atomic(path, line, (size_t)n, 0644) < 0) log_warn("cannot write %s", path);
    log_info("listening on %s (data in %s)", s->url, s->opt.data_dir);
    if (s->tls_ca_pin[0])
        log_info("tls: clients trust %s/tls/ca.crt; agents join with --ca-hash %s", s->opt.data_dir, s->tls_ca_pin);
    if (s->tls_cert_pem)
        log_info("tls: serving %s (serial %s, valid until %s)%s", s->opt.tls_auto ? "tls/server.crt" : s->opt.tls_cert,
                 s->tls_serial, s->tls_not_after_text,
                 s->opt.tls_auto ? "; renewed when a third of its life is left" : "");
    if (!s->tls_cert_pem && !server_host_is_loopback(s->opt.host))
        log_warn("serving plain HTTP on %s (--insecure-http): tokens cross the network in the clear", s->opt.host);
    char tokpath[PATH_MAX + 32];
    if (sfmt(tokpath, sizeof tokpath, "%s/admin.token", s->opt.data_dir) == 0 && access(tokpath, F_OK) == 0)
        log_info("tokens: admin %s/admin.token, team 'default' %s/token, agents join with %s/node.token",
                 s->opt.data_dir, s->opt.data_dir, s->opt.data_dir);
    int rc = 0;
    for (int i = 1; !*stop && !s->stopping; i++) {
        /* several servers on one database: a standby that took the lease
         * starts leading here; a leader that lost it stops (it may no longer
         * write: the fence refuses it) and comes back as a standby */
        int role = db_role(s->db);
        if (role == DB_LEADER && !started) {
            if (leader_setup(s, err, sizeof err) < 0 || (app->start && app->start(s, err, sizeof err) < 0)) {
                log_error("cannot start leading: %s", err);
                rc = SERVER_RESTART;
                break;
            }
            started = 1;
            log_info("leading: scheduling and accepting writes");
        } else if (role != DB_LEADER && started) {
            log_warn("no longer the leader: stopping, to start again as a standby");
            rc = SERVER_RESTART;
            break;
        }
        /* the certificate: --tls-cert's expiry warned about (now, then
         * daily), --tls auto's renewed when due, either read again on SIGHUP */
        if (g_reread) {
            g_reread = 0;
            tls_reread(s);
        }
        if (s->tls_cert_pem && (int64_t)time(NULL) >= s->tls_next_check) {
            if (s->opt.tls_auto) tls_auto_renew(s, "a third of its life left");
            else tls_cert_warn(s);
        }
        usleep(100 * 1000);
        if (app->tick && started && i % 10 == 0) app->tick(s);
    }
    log_info("stopping");
    db_abandon(s->db); /* a database that hangs cannot hold the stop (storage/db.h) */
    if (app->stop && started) app->stop(s);
    if (s->apps_http) http_stop(s->apps_http);
    s->apps_http = NULL;
    http_stop(s->http);
    s->http = NULL;
    http_access_log_open(NULL);
    log_info("stopped");
    return rc;
}

void server_close(server *s) {
    tls_release(s);
    db_close(s->db);
    s->db = NULL;
    blob_store_close(s->blobs);
    s->blobs = NULL;
    if (s->lock_fd >= 0) close(s->lock_fd); /* the directory is free again */
    s->lock_fd = -1;
}

static void server_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard server [--listen ADDR:PORT] [--data DIR] [--durability full|normal]\n"
            "                        [--heartbeat-timeout SECONDS] [--resize-interval SECONDS]\n"
            "                        [--quiet] [--log-level L]\n"
            "                        [--log-format text|json] [--access-log FILE|none] [--public-url URL]\n"
            "                        [--tls auto | --tls-cert FILE --tls-key FILE] [--insecure-http]\n"
            "                        [--auth-fail-limit N] [--db-resident-mb N]\n"
            "                        [--context-max-mb N] [--context-max-files N] [--context-max-unpacked-mb N]\n"
            "                        [--context-quota-mb N] [--context-grace-s SECONDS]\n"
            "                        [--log-retention-days N] [--audit-retention-days N]\n"
            "                        [--disk-reserve SIZE|N%%] [--log-max-per-job-default SIZE]\n"
            "                        [--log-max-per-job SIZE]\n"
            "                        [--oidc-issuer URL --oidc-client-id ID --oidc-client-secret-file FILE\n"
            "                         [--oidc-groups-claim NAME] [--oidc-group-map FORMAT]] [--session-hours N]\n"
            "                        [--backup-to DIR|s3://... [--backup-every DURATION] [--backup-keep N]]\n"
            "                        [--backup-credentials FILE]\n"
            "                        [--blob-store DATA|file:///DIR|s3://BUCKET[/PREFIX]?endpoint=URL&region=R]\n"
            "                        [--blob-credentials FILE] [--blob-url-ttl SECONDS]\n"
            "                        [--blob-upload-max-age SECONDS]\n"
            "                        [--db postgres://USER@HOST[:PORT]/DB [--db-password-file FILE]]\n"
            "                        [--lease-ttl DURATION]\n"
            "  --listen      address to bind (default 127.0.0.1:8080; port 0 = any free port)\n"
            "  --data        data directory (default ./.trainyard)\n"
            "  --resize-interval  an elastic job grows into free devices at most once per this\n"
            "                many seconds of its attempt (default 30; 0: at once)\n"
            "  --log-level   debug|info|warn|error (default info: what happened to the service,\n"
            "                its nodes and jobs; debug adds every request)\n"
            "  --log-format  text (default) or json (one object a line: time, level, component,\n"
            "                message)\n"
            "  --access-log  every request in the Common Log Format (default DATA/access.log;\n"
            "                none: no file)\n"
            "  --public-url  the URL workers reach the server at (their config's api; default\n"
            "                http://ADDR:PORT of --listen, which is wrong for 0.0.0.0 or a proxy)\n"
            "  --apps-listen ADDR:PORT  serve a job's apps (/proxy/jobs/ID/NAME/: notebooks,\n"
            "                TensorBoards) there, on an origin of their own, and redirect them there\n"
            "                from --listen: their pages cannot read the dashboard's token or use its\n"
            "                session (recommended wherever people open other teams' apps)\n"
            "  --apps-url URL  the origin browsers reach --apps-listen at (default http[s]://ADDR:PORT)\n"
            "  --tls auto    HTTPS with a private CA and certificate made on the first start under\n"
            "                DATA/tls (ca.crt for clients; agents join with the CA's hash, logged)\n"
            "  --tls-cert, --tls-key  HTTPS with this certificate (PEM, chain after it) and key\n"
            "  --db-resident-mb N  keep the database and its WAL in memory (locked), up to N MiB\n"
            "                (default 2048; 0: leave them to the page cache)\n"
            "  --auth-fail-limit N  failed authentications one address may make in a minute;\n"
            "                past it, 429 with Retry-After until the minute ends (default 100;\n"
            "                0: no limit); tokens that authenticated lately still pass\n"
            "  --insecure-http  serve plain HTTP on an address other than loopback (refused\n"
            "                without it: tokens would cross the network in the clear)\n"
            "  --context-max-mb N  the largest context (gzip'd tar) a team may upload (default 64)\n"
            "  --context-max-files N  entries in one context (default 100000)\n"
            "  --context-max-unpacked-mb N  a context's bytes once unpacked (default 1024)\n"
            "  --context-quota-mb N  a team's contexts together (default 2048)\n"
            "  --context-grace-s S  a context no job to run names is dropped S seconds after its\n"
            "                last use and its jobs' end (default 86400)\n"
            "  --log-retention-days N  a finished job's logs are removed N days after its end\n"
            "                (default 30; 0: kept forever); N may be fractional (0.5), or a\n"
            "                duration with a unit: 90s, 30m, 12h, 7d\n"
            "  --audit-retention-days N  audit rows (GET /api/v1/audit) are removed N days\n"
            "                after they were written (default 365; 0: kept forever); the\n"
            "                same forms as --log-retention-days\n"
            "  --disk-reserve SIZE|N%%  free space kept on the data directory's file system:\n"
            "                checkpoint uploads, log appends and context uploads that would take\n"
            "                it below are refused (507 disk_reserve; default 2GiB; 0: none)\n"
            "  --log-max-per-job-default SIZE  the log bytes a job keeps unless its spec's\n"
            "                logs.max_size says (default 1GiB); past it, output is dropped with a note\n"
            "  --log-max-per-job SIZE  the most logs.max_size may ask (default 16GiB)\n"
            "  --oidc-issuer URL  single sign-on with this OpenID Provider (its discovery's issuer,\n"
            "                exactly): the dashboard's \"Sign in\" and `trainyard login` (docs/sso.md);\n"
            "                the provider's redirect URI is PUBLIC_URL/auth/callback\n"
            "  --oidc-client-id ID  our client at the provider\n"
            "  --oidc-client-secret-file FILE  the client's secret, alone in a file\n"
            "  --oidc-groups-claim NAME  the ID token's claim listing the person's groups\n"
            "                (default groups)\n"
            "  --oidc-group-map FORMAT  a group that gives a role in a team, with {team} and\n"
            "                {role} (default {team}:{role}: group vision:admin makes the person an\n"
            "                admin of team vision at each sign-in); other groups are ignored\n"
            "  --session-hours N  a dashboard session lasts N hours (default 12)\n"
            "  --backup-to DIR  take a backup (as `trainyard backup DIR`) every --backup-every\n"
            "                (a duration: 90s, 30m, 12h, 1d; default 1d) and keep the newest\n"
            "                --backup-keep complete ones (default 7); older and unfinished ones are\n"
            "                removed; a failure is logged, /metrics has the last success's time;\n"
            "                DIR may be s3://BUCKET[/PREFIX]?endpoint=URL&region=R (backups/ under it)\n"
            "  --backup-credentials FILE  an s3 destination's AWS shared-credentials file (0600),\n"
            "                for --backup-to and for `trainyard backup s3://...` (default --blob-credentials)\n"
            "  --blob-store SPEC  where checkpoints and contexts are kept: DATA (default: under\n"
            "                the data directory), file:///DIR (the same layout on a shared file\n"
            "                system) or s3://BUCKET[/PREFIX]?endpoint=URL&region=R (tasks upload\n"
            "                and download over presigned URLs); checked at start\n"
            "  --blob-credentials FILE  the s3 store's AWS shared-credentials file ([default]:\n"
            "                aws_access_key_id, aws_secret_access_key), mode 0600; never in the URL\n"
            "  --blob-url-ttl S  life of a presigned URL (default 900)\n"
            "  --blob-upload-max-age S  an upload not completed after S seconds is aborted and\n"
            "                its parts removed (default 21600)\n"
            "  --db URL      keep the state in this PostgreSQL database (postgres://USER@HOST:PORT/DB,\n"
            "                libpq's parameters after ?) instead of DATA/trainyard.db; servers that\n"
            "                share one elect a leader, the others stand by (docs/ha.md)\n"
            "  --db-password-file FILE  the database password, alone in a file (mode 0600);\n"
            "                else libpq's passfile (?passfile=, PGPASSFILE) or PGPASSWORD\n"
            "  --lease-ttl D  how long a leader's lease lasts unrenewed (default 6s): a standby\n"
            "                takes over within about this long of the leader's end\n");
}

int server_parse_retention(const char *s, int64_t *ms) {
    /* days by default, so the option reads as its name says; a unit makes
     * short settings (tests, a scratch server) possible */
    return duration_parse_ms(s, 86400e3, 100.0 * 365 * 86400e3, ms);
}

/* Parses the server's flags; unknown flags are an error. Returns 0, 1 for
 * --help, -1 on a bad flag. */
/* ---------------------------------------------------------------- flags
 *
 * The server's flags, one row each (common/flags.h); the parsers below are
 * for the flags a kind does not say. A parser returns 0 or -1 (the row's
 * "wants" is said). */

static int flag_listen(void *opts, const char *arg) { return server_parse_listen(opts, arg); }

static int flag_apps_listen(void *opts, const char *arg) {
    server_options *o = opts, tmp;
    if (server_parse_listen(&tmp, arg) < 0) return -1;
    snprintf(o->apps_host, sizeof o->apps_host, "%s", tmp.host);
    o->apps_port = tmp.port;
    return 0;
}

static int flag_apps_url(void *opts, const char *arg) {
    server_options *o = opts;
    size_t n = strlen(arg);
    while (n && arg[n - 1] == '/') n--; /* paths are appended: /proxy/jobs/... */
    size_t sch = strncmp(arg, "http://", 7) == 0 ? 7 : strncmp(arg, "https://", 8) == 0 ? 8 : 0;
    if (!sch || n <= sch || n >= sizeof o->apps_url || strcspn(arg, " \t\r\n?#") < n) return -1;
    if (memchr(arg + sch, '/', n - sch)) return -1; /* an origin: no path */
    snprintf(o->apps_url, sizeof o->apps_url, "%.*s", (int)n, arg);
    return 0;
}

static int flag_tls(void *opts, const char *arg)
{
    if (strcmp(arg, "auto") != 0) return -1;
    ((server_options *)opts)->tls_auto = 1;
    return 0;
}

static int flag_log_level(void *opts, const char *arg)
{
    log_level l;
    if (log_level_parse(arg, &l) < 0) return -1;
    ((server_options *)opts)->log_level = (int)l;
    return 0;
}

static int flag_log_format(void *opts, const char *arg)
{
    log_format f;
    if (log_format_parse(arg, &f) < 0) return -1;
    ((server_options *)opts)->log_format = (int)f;
    return 0;
}

static int flag_public_url(void *opts, const char *arg)
{
    server_options *o = opts;
    size_t n = strlen(arg);
    while (n && arg[n - 1] == '/') n--; /* workers append /api/v1/... */
    size_t sch = strncmp(arg, "http://", 7) == 0 ? 7 : strncmp(arg, "https://", 8) == 0 ? 8 : 0;
    if (!sch || n <= sch || n >= sizeof o->public_url || strcspn(arg, " \t\r\n?#") < n) return -1;
    snprintf(o->public_url, sizeof o->public_url, "%.*s", (int)n, arg);
    return 0;
}

/* a size (2GiB) or a share of the file system (5%) */
static int flag_disk_reserve(void *opts, const char *arg)
{
    server_options *o = opts;
    size_t n = strlen(arg);
    if (n > 1 && arg[n - 1] == '%') {
        char num[16] = "";
        long v = 0;
        if (n - 1 < sizeof num) snprintf(num, sizeof num, "%.*s", (int)(n - 1), arg);
        if (!num[0] || parse_long(num, 0, 90, &v) < 0) return -1;
        o->disk_reserve_pct = (int)v;
        o->disk_reserve_bytes = 0;
        return 0;
    }
    int64_t b = 0;
    if (size_parse(arg, 0, SERVER_SIZE_FLAG_MAX, &b, NULL) != SIZE_OK) return -1;
    o->disk_reserve_bytes = b;
    o->disk_reserve_pct = 0;
    return 0;
}

/* a size of 1MiB to 1PiB, kept in whole MiB rounded up (as logs.max_size is) */
static int log_size_mb(const char *arg, int64_t *mb)
{
    int64_t b = 0;
    if (size_parse(arg, 1LL << 20, SERVER_SIZE_FLAG_MAX, &b, NULL) != SIZE_OK) return -1;
    *mb = (b + (1LL << 20) - 1) >> 20;
    return 0;
}

static int flag_log_max_default(void *opts, const char *arg)
{
    return log_size_mb(arg, &((server_options *)opts)->log_max_per_job_default_mb);
}

static int flag_log_max(void *opts, const char *arg)
{
    return log_size_mb(arg, &((server_options *)opts)->log_max_per_job_mb);
}

static int flag_log_retention(void *opts, const char *arg)
{
    return server_parse_retention(arg, &((server_options *)opts)->log_retention_ms);
}

static int flag_audit_retention(void *opts, const char *arg)
{
    return server_parse_retention(arg, &((server_options *)opts)->audit_retention_ms);
}

static int flag_oidc_issuer(void *opts, const char *arg)
{
    server_options *o = opts;
    int http = strncmp(arg, "http://", 7) == 0, https = strncmp(arg, "https://", 8) == 0;
    if ((!http && !https) || strlen(arg) <= (size_t)(https ? 8 : 7) || strcspn(arg, " \t\r\n?#") < strlen(arg))
        return -1;
    return sfmt(o->oidc_issuer, sizeof o->oidc_issuer, "%s", arg);
}

/* a format with {team} and {role}, each once, and nothing else in braces */
static int flag_oidc_group_map(void *opts, const char *arg)
{
    server_options *o = opts;
    const char *t = strstr(arg, "{team}"), *r = strstr(arg, "{role}");
    if (!t || !r || strstr(t + 1, "{team}") || strstr(r + 1, "{role}")) return -1;
    int braces = 0;
    for (const char *p = arg; *p; p++) braces += *p == '{' || *p == '}';
    if (braces != 4 || (r > t ? r == t + 6 : t == r + 6)) return -1; /* {team}{role} side by side: ambiguous */
    return sfmt(o->oidc_group_map, sizeof o->oidc_group_map, "%s", arg);
}

/* a folder (absolute) or an s3 store's URL (storage/blob.h's spec) */
static int flag_backup_to(void *opts, const char *arg)
{
    server_options *o = opts;
    if (arg[0] != '/' && strncmp(arg, "s3://", 5) != 0) return -1;
    return sfmt(o->backup_to, sizeof o->backup_to, "%s", arg);
}

/* a duration: seconds bare, or 90s, 30m, 12h, 7d; at least a second */
static int flag_backup_every(void *opts, const char *arg)
{
    int64_t ms = 0;
    if (duration_parse_ms(arg, 1e3, 366.0 * 86400e3, &ms) < 0 || ms < 1000) return -1;
    ((server_options *)opts)->backup_every_ms = ms;
    return 0;
}

/* --db: a PostgreSQL URL (the password never in it: db_open refuses one) */
static int flag_db(void *opts, const char *arg)
{
    server_options *o = opts;
    if (!db_is_url(arg)) return -1;
    return sfmt(o->db_url, sizeof o->db_url, "%s", arg);
}

/* --lease-ttl: renewals every ttl/6, a leader gives up after 2/3 of it */
static int flag_lease_ttl(void *opts, const char *arg)
{
    int64_t ms = 0;
    if (duration_parse_ms(arg, 1e3, 600e3, &ms) < 0 || ms < 3000) return -1;
    ((server_options *)opts)->lease_ttl_ms = (int)ms;
    return 0;
}

static const char *const DURABILITY[] = {"normal", "full", NULL}; /* the index is durability_full */

#define SO server_options
static const flag_def SERVER_FLAGS[] = {
    FLAG_FUNC_AT("listen", flag_listen, "ADDR:PORT"),
    FLAG_TEXT_AT("data", SO, data_dir, "a directory (a shorter path)"),
    FLAG_CHOICE_AT("durability", SO, durability_full, DURABILITY, "full or normal"),
    FLAG_INT_AT("heartbeat-timeout", SO, heartbeat_timeout_s, 1, 86400, "seconds (1-86400)"),
    FLAG_INT_AT("resize-interval", SO, resize_interval_s, 0, 86400, "seconds (0-86400)"),
    FLAG_SWITCH_AT("quiet", SO, quiet),
    FLAG_FUNC_AT("log-level", flag_log_level, "debug, info, warn or error"),
    FLAG_FUNC_AT("log-format", flag_log_format, "text or json"),
    FLAG_TEXT_AT("access-log", SO, access_log, "a file (a shorter path), or none"),
    FLAG_FUNC_AT("public-url", flag_public_url, "http[s]://HOST[:PORT] (under 128 bytes)"),
    FLAG_FUNC_AT("apps-listen", flag_apps_listen, "ADDR:PORT"),
    FLAG_FUNC_AT("apps-url", flag_apps_url, "http[s]://HOST[:PORT], an origin (under 128 bytes)"),
    FLAG_FUNC_AT("tls", flag_tls, "auto (or give --tls-cert and --tls-key)"),
    FLAG_TEXT_AT("tls-cert", SO, tls_cert, "a PEM file (a shorter path)"),
    FLAG_TEXT_AT("tls-key", SO, tls_key, "a PEM file (a shorter path)"),
    FLAG_SWITCH_AT("insecure-http", SO, insecure_http),
    FLAG_INT_AT("auth-fail-limit", SO, auth_fail_limit, 0, 1000000,
                "failures a minute (0-1000000; 0: no limit)"),
    FLAG_LONG_AT("db-resident-mb", SO, db_resident_mb, 0, 1L << 30, "MiB (0: off)"),
    /* a context's body is held in memory while it is checked */
    FLAG_LONG_AT("context-max-mb", SO, context_max_mb, 1, 4096, "MiB (1-4096)"),
    FLAG_LONG_AT("context-max-files", SO, context_max_files, 1, 1L << 30, "a number of entries (1-1073741824)"),
    FLAG_LONG_AT("context-max-unpacked-mb", SO, context_max_unpacked_mb, 1, 1L << 24, "MiB (1-16777216)"),
    FLAG_LONG_AT("context-quota-mb", SO, context_quota_mb, 1, 1L << 30, "MiB (1-1073741824)"),
    FLAG_LONG_AT("context-grace-s", SO, context_grace_s, 1, 10L * 365 * 86400, "seconds (1-315360000)"),
    FLAG_FUNC_AT("disk-reserve", flag_disk_reserve, "a size of 0B to 1PiB (2GiB) or a percentage (0%-90%)"),
    FLAG_FUNC_AT("log-max-per-job-default", flag_log_max_default, "a size of 1MiB to 1PiB (such as 1GiB)"),
    FLAG_FUNC_AT("log-max-per-job", flag_log_max, "a size of 1MiB to 1PiB (such as 1GiB)"),
    FLAG_FUNC_AT("log-retention-days", flag_log_retention,
                 "days (30, 0.5; 0: keep forever) or a duration (90s, 30m, 12h, 7d) up to 100 years"),
    FLAG_FUNC_AT("audit-retention-days", flag_audit_retention,
                 "days (365, 0.5; 0: keep forever) or a duration (90s, 30m, 12h, 7d) up to 100 years"),
    FLAG_FUNC_AT("oidc-issuer", flag_oidc_issuer, "http[s]://HOST[:PORT][/PATH] (under 256 bytes)"),
    FLAG_TEXT_AT("oidc-client-id", SO, oidc_client_id, "a client id (under 128 bytes)"),
    FLAG_PATH_AT("oidc-client-secret-file", SO, oidc_client_secret_file, "an absolute path to a file"),
    FLAG_TEXT_AT("oidc-groups-claim", SO, oidc_groups_claim, "a claim's name (under 64 bytes)"),
    FLAG_FUNC_AT("oidc-group-map", flag_oidc_group_map,
                 "a format with {team} and {role} once each, not side by side (such as trainyard-{team}-{role})"),
    FLAG_INT_AT("session-hours", SO, session_hours, 1, 24 * 366, "hours (1-8784)"),
    FLAG_FUNC_AT("backup-to", flag_backup_to, "an absolute path to a folder, or s3://BUCKET[/PREFIX]?endpoint=URL"),
    FLAG_PATH_AT("backup-credentials", SO, backup_credentials, "an absolute path to a file"),
    FLAG_FUNC_AT("backup-every", flag_backup_every, "a duration of 1s to 366d (90s, 30m, 12h, 1d)"),
    FLAG_INT_AT("backup-keep", SO, backup_keep, 1, 10000, "a number of backups (1-10000)"),
    FLAG_TEXT_AT("blob-store", SO, blob_store, "DATA, file:///DIR or s3://BUCKET[/PREFIX]?endpoint=URL&region=R"),
    FLAG_PATH_AT("blob-credentials", SO, blob_credentials, "an absolute path to a file"),
    FLAG_INT_AT("blob-url-ttl", SO, blob_url_ttl_s, 1, 604800, "seconds (1-604800)"),
    FLAG_INT_AT("blob-upload-max-age", SO, blob_upload_max_age_s, 1, 30 * 86400, "seconds (1-2592000)"),
    FLAG_FUNC_AT("db", flag_db, "postgres://[USER@]HOST[:PORT]/DBNAME[?PARAMS], without a password"),
    FLAG_PATH_AT("db-password-file", SO, db_password_file, "an absolute path to a file"),
    FLAG_FUNC_AT("lease-ttl", flag_lease_ttl, "a duration of 3s to 10m (6s, 15s)"),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL},
};
#undef SO

int server_parse_flags(server_options *o, int argc, char **argv) {
    int rc = flags_parse(SERVER_FLAGS, o, argc, argv, "trainyard", server_usage);
    if (rc != 0) return rc;
    if (o->log_max_per_job_default_mb > o->log_max_per_job_mb) {
        fprintf(stderr, "trainyard: --log-max-per-job-default (%lld MiB) is more than --log-max-per-job (%lld MiB)\n",
                (long long)o->log_max_per_job_default_mb, (long long)o->log_max_per_job_mb);
        return -1;
    }
    if (o->oidc_issuer[0] && (!o->oidc_client_id[0] || !o->oidc_client_secret_file[0])) {
        fprintf(stderr, "trainyard: --oidc-issuer needs --oidc-client-id and --oidc-client-secret-file\n");
        return -1;
    }
    if (!o->oidc_issuer[0] && (o->oidc_client_id[0] || o->oidc_client_secret_file[0])) {
        fprintf(stderr, "trainyard: --oidc-client-id and --oidc-client-secret-file go with --oidc-issuer\n");
        return -1;
    }
    if ((o->backup_every_ms || o->backup_keep) && !o->backup_to[0]) {
        fprintf(stderr, "trainyard: --backup-every and --backup-keep go with --backup-to DIR\n");
        return -1;
    }
    if (!o->backup_credentials[0] && o->blob_credentials[0]) /* the blob store's serve backups too */
        snprintf(o->backup_credentials, sizeof o->backup_credentials, "%s", o->blob_credentials);
    if (strncmp(o->backup_to, "s3://", 5) == 0 && !o->backup_credentials[0]) {
        fprintf(stderr, "trainyard: --backup-to s3://... needs --backup-credentials FILE (or --blob-credentials)\n");
        return -1;
    }
    if (!o->backup_every_ms) o->backup_every_ms = 86400LL * 1000; /* the defaults, once none was given */
    if (!o->backup_keep) o->backup_keep = 7;
    if (o->tls_auto && (o->tls_cert[0] || o->tls_key[0])) {
        fprintf(stderr, "trainyard: --tls auto makes its own certificate: give it or --tls-cert/--tls-key, not both\n");
        return -1;
    }
    return 0;
}

int cmd_server(int argc, char **argv, const server_app *app) {
    /* kept before the flags are parsed (getopt reorders argv): a server
     * that stops leading starts again, as a standby, from these */
    char **again = xcalloc((size_t)argc + 2, sizeof *again);
    again[0] = "trainyard";
    for (int i = 0; i < argc; i++) again[i + 1] = argv[i];
    server_options o;
    server_options_default(&o);
    int rc = server_parse_flags(&o, argc, argv);
    if (rc != 0) {
        free(again);
        return rc > 0 ? 0 : 2;
    }
    log_set_prefix("server");
    log_set_level(o.quiet && o.log_level < LOG_WARN ? LOG_WARN : (log_level)o.log_level);
    log_set_format((log_format)o.log_format);
    server s;
    char err[512];
    if (server_open(&s, &o, err, sizeof err) < 0) {
        log_error("%s", err);
        free(again);
        return 1;
    }
    rc = server_serve(&s, app, NULL);
    server_close(&s);
    if (rc == SERVER_RESTART) {
        /* a fresh process: nothing of the leader's state (threads, caches,
         * the scheduler's mirror) survives into the standby */
        setenv("TRAINYARD_STANDBY_AGAIN", "1", 1);
        execv("/proc/self/exe", again);
        log_error("cannot start again as a standby: %s", strerror(errno));
        rc = 75;
    }
    free(again);
    return rc;
}
