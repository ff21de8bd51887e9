/* server.h - the control plane process: database, bootstrap tokens, HTTP
 * daemon and (when linked) the scheduler loop, under one context struct.
 *
 * defines: server_app, server_options_default, server_open, server_serve,
 *          server_close, server_parse_flags, cmd_server */
#ifndef TRAINYARD_SERVER_H
#define TRAINYARD_SERVER_H

#include <limits.h>
#include <signal.h>
#include "../storage/db.h"

typedef struct server_options {
    char host[64];                    /* default 127.0.0.1 */
    int port;                         /* default 8080; 0 = any free port */
    char data_dir[PATH_MAX];          /* default ./.trainyard */
    int durability_full;              /* synchronous=FULL */
    int heartbeat_timeout_s;          /* node lost after this long without heartbeat */
    int resize_interval_s;            /* an elastic job grows at most once per this (default 30) */
    int quiet;                        /* log warnings and errors only */
    int log_level;                    /* --log-level (a log_level; default info) */
    int log_format;                   /* --log-format (a log_format; default text) */
    char access_log[PATH_MAX];        /* --access-log: "" = DIR/access.log, "none" = off */
    char public_url[128];             /* the URL workers are given (config.api); "" = url */
    char apps_host[64];               /* --apps-listen ADDR:PORT: a job's apps (the proxy) on an
                                       * origin of their own; apps_port -1: none (the API's origin) */
    int apps_port;
    char apps_url[128];               /* --apps-url: where browsers reach it; "" = http[s]://ADDR:PORT */
    int tls_auto;                     /* --tls auto: a private CA and certificate under DATA/tls */
    char tls_cert[PATH_MAX];          /* --tls-cert FILE (with --tls-key): HTTPS with these */
    char tls_key[PATH_MAX];
    int insecure_http;                /* --insecure-http: plain HTTP off loopback, with a warning */
    long db_resident_mb;              /* --db-resident-mb: the database kept in memory up to this (0: off) */
    int auth_fail_limit;              /* --auth-fail-limit: failed authentications an address may
                                       * make in a minute before 429 (default 100; 0: no limit) */
    /* contexts (POST /api/v1/contexts, docs/command-jobs.md) */
    long context_max_mb;              /* --context-max-mb: one upload's bytes (default 64) */
    long context_max_files;           /* --context-max-files: entries in one (default 100,000) */
    long context_max_unpacked_mb;     /* --context-max-unpacked-mb: its bytes unpacked (default 1024) */
    long context_quota_mb;            /* --context-quota-mb: a team's contexts together (default 2048) */
    long context_grace_s;             /* --context-grace-s: an unused context is dropped after this (86400) */
    /* what finished jobs leave on the disk (docs/server.md, "Retention") */
    int64_t log_retention_ms;         /* --log-retention-days: a finished job's logs go this long after
                                       * its end (default 30 days; 0: kept forever) */
    int64_t audit_retention_ms;       /* --audit-retention-days: audit rows go this long after they
                                       * were written (default 365 days; 0: kept forever) */
    /* the server's disk (docs/reliability.md, "What bounds the server's disk") */
    int64_t disk_reserve_bytes;       /* --disk-reserve SIZE: free space kept on the data directory's
                                       * file system (default 2 GiB; 0 with pct 0: none) */
    int disk_reserve_pct;             /* --disk-reserve N%: the same as a share of the file system */
    int64_t log_max_per_job_default_mb; /* --log-max-per-job-default: a job's log bytes unless its spec
                                       * says (logs.max_size; default 1 GiB) */
    int64_t log_max_per_job_mb;       /* --log-max-per-job: the most a spec may ask (default 16 GiB) */
    /* single sign-on (docs/sso.md): the OpenID Provider people sign in with */
    char oidc_issuer[256];            /* --oidc-issuer URL; "" = no single sign-on */
    char oidc_client_id[128];         /* --oidc-client-id */
    char oidc_client_secret_file[PATH_MAX]; /* --oidc-client-secret-file: the secret, alone in a file */
    char oidc_groups_claim[64];       /* --oidc-groups-claim (default "groups") */
    char oidc_group_map[128];         /* --oidc-group-map: a group that gives a role, with {team} and
                                       * {role} (default "{team}:{role}") */
    int session_hours;                /* --session-hours: a dashboard session lasts this long (12) */
    /* periodic backups (docs/reliability.md, "Backups and restore") */
    char backup_to[PATH_MAX];         /* --backup-to DIR or s3://...: "" = none */
    char backup_credentials[PATH_MAX];/* --backup-credentials FILE: an s3 destination's (POST /backups too);
                                       * default --blob-credentials */
    int64_t backup_every_ms;          /* --backup-every DURATION (default 1 day; 0 until parsed) */
    int backup_keep;                  /* --backup-keep N: complete backups kept (default 7; 0 until parsed) */
    /* where checkpoint and context bytes live (docs/server.md, "Blob store") */
    char blob_store[1024];            /* --blob-store: "DATA" (default), "file:///abs" or "s3://..." */
    char blob_credentials[PATH_MAX];  /* --blob-credentials FILE: AWS shared credentials (s3) */
    int blob_url_ttl_s;               /* --blob-url-ttl: life of a presigned URL (default 900) */
    int blob_upload_max_age_s;        /* --blob-upload-max-age: an open upload older is aborted (21600) */
    /* the state in PostgreSQL, shared with other servers (docs/ha.md) */
    char db_url[1024];                /* --db postgres://...: "" = DATA/trainyard.db (SQLite) */
    char db_password_file[PATH_MAX];  /* --db-password-file FILE: the database password, alone in a file */
    int lease_ttl_ms;                 /* --lease-ttl: a leader's lease lasts this long unrenewed (6000) */
} server_options;

struct http_daemon;
struct blob_store;
struct server;
struct route;

/* What a server serves, given by the program that runs it (cmd/main.c
 * passes the API's, api/routes.h): the route tables (NULL-terminated) and
 * the services started beside HTTP and stopped before it (the scheduler
 * thread). The server itself knows no route. */
typedef struct server_app {
    const struct route *const *routes;
    const struct route *const *apps_routes; /* the apps' daemon's (--apps-listen) */
    int (*start)(struct server *s, char *err, size_t errlen); /* 0, or -1 with err */
    void (*stop)(struct server *s);
    /* Periodic housekeeping, about once a second on the thread that runs
     * server_serve (never an HTTP thread: it may wait for the disk); NULL:
     * none. */
    void (*tick)(struct server *s);
} server_app;

typedef struct server {
    server_options opt;
    db *db;
    struct http_daemon *http;
    int port;                         /* the bound port */
    struct http_daemon *apps_http;    /* --apps-listen's daemon, or NULL */
    char apps_url[160];               /* its origin as browsers reach it; "" = the API's own */
    char url[128];                    /* http://host:port */
    char public_url[128];             /* what workers are told: opt.public_url, else url */
    char checkpoint_dir[PATH_MAX];
    char log_dir[PATH_MAX];
    char context_dir[PATH_MAX];       /* DIR/contexts: the uploaded contexts, one file per digest */
    volatile sig_atomic_t stopping;
    int lock_fd;                      /* DIR/server.lock, flock'ed while the server runs */
    char *tls_cert_pem;               /* HTTPS: the certificate chain and key the server started
                                       * with; NULL = plain HTTP. A renewal or a SIGHUP re-read
                                       * hands handshakes another (http_tls_replace), not these */
    char *tls_key_pem;
    char *tls_ca_pem;                 /* the CA agents fetch (GET /api/v1/tls/ca): --tls auto's; NULL otherwise */
    char tls_ca_pin[72];              /* "sha256:..." of tls_ca_pem's public key, or "" */
    /* the certificate served now, looked after by the serve loop alone
     * (docs/server.md, "TLS"): --tls auto's renewed, --tls-cert's expiry
     * warned about; both re-read on SIGHUP */
    long tls_auto_lifetime_s;         /* --tls auto's certificates last this long (TLS_AUTO_LIFETIME_S;
                                       * TRAINYARD_TLS_AUTO_LIFETIME_S, for tests) */
    int64_t tls_not_after;            /* the served certificate's notAfter, unix seconds */
    char tls_not_after_text[24];
    char tls_serial[48];              /* its serial number, hex */
    int64_t tls_next_check;           /* unix seconds: --tls auto's renewal, --tls-cert's next warning */
    unsigned char attempt_key[32];    /* DATA/attempt.key: each attempt's secret is derived from it */
    struct blob_store *blobs;         /* --blob-store, opened and checked by server_open */
} server;

/* The secret of one attempt of a job, handed to its tasks alone (their
 * config's "secret"), which every connection between them proves:
 * hex of HMAC-SHA256(attempt_key, job | attempt), 64 digits and a NUL. */
void server_attempt_secret(const server *s, int64_t job, int attempt, char out[65]);

/* server_serve's answer when the server stopped leading (the lease was
 * lost): cmd_server starts the program again, as a standby. */
#define SERVER_RESTART 75

/* 1 when host (an IPv4 address) is a loopback one (127.0.0.0/8). */
int server_host_is_loopback(const char *host);

void server_options_default(server_options *o);

/* The most any size flag takes (--disk-reserve, --log-max-per-job,
 * --log-max-per-job-default: common/size.h's size_parse; their bounds are
 * docs/jobspec.md's "Sizes" table). */
#define SERVER_SIZE_FLAG_MAX (1LL << 50) /* 1 PiB */

/* Parses "HOST:PORT" into o->host and o->port: 0 or -1. */
int server_parse_listen(server_options *o, const char *s);

/* Takes the data directory (DIR/server.lock: one server per directory, as
 * the database has one writer), opens it and the database and makes sure the admin token,
 * the team `default` with its token, and the node token exist (DIR/admin.token,
 * DIR/token, DIR/node.token, mode 0600). Returns 0, or -1 with err. */
int server_open(server *s, const server_options *opt, char *err, size_t errlen);

/* Starts HTTP with app's routes, then app's services, and serves until
 * *stop becomes non-zero (SIGINT/SIGTERM set it when stop is NULL; then
 * SIGHUP re-reads the certificate). While it serves HTTPS it renews --tls
 * auto's certificate when a third of its life is left and warns, at start
 * and daily, of a --tls-cert that expires within 30 days. Returns the exit
 * status. */
int server_serve(server *s, const server_app *app, volatile sig_atomic_t *stop);

void server_close(server *s);

/* --log-retention-days: "N" days (fractional allowed) or a duration with
 * a unit ("90s", "30m", "12h", "7d") into *ms (0: forever); 0 or -1. */
int server_parse_retention(const char *s, int64_t *ms);

/* Parses the server flags into o: 0, 1 after --help, -1 on a bad flag. */
int server_parse_flags(server_options *o, int argc, char **argv);

/* `trainyard server ...`: parses flags, serves app until a signal. */
int cmd_server(int argc, char **argv, const server_app *app);

#endif
