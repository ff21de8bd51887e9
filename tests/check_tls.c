/* check_tls.c - HTTPS between our processes, against the real binary on
 * loopback: `server --tls auto` makes a CA and a certificate and serves
 * HTTPS only (no answer in the clear, none to a client that does not trust
 * the CA), TLS 1.2 and 1.3 with AEAD ciphers only; `up --tls auto` trains a
 * job whose worker reports over it; an agent joins with the CA's hash and is
 * refused with a wrong one; a given certificate and key are served, and a
 * bad, mismatched or expired one, or plain HTTP off loopback, stops the
 * server before it makes or starts anything, with one line naming the file.
 * While it runs: --tls auto's certificate is renewed (same CA, same
 * process) with clients going on across it; a --tls-cert that expires
 * within 30 days is warned about; SIGHUP serves the files anew, or keeps
 * the served pair when they are bad. (tests/testssl.sh scans the profile.) */
#include "testlib.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include "../common/tls.h"

static ty_proc srv;

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "tls");
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

static void tls_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/tls/%s", srv.dir, name); }

static int file_mode(const char *path) {
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "no %s", path);
    return (int)(st.st_mode & 0777);
}

/* Runs the binary with args (NULL-terminated), stderr into err (bounded);
 * its exit status, or -1 when it was killed after timeout_s. */
static int run_bin(const char *const *args, char *err, size_t errlen, int timeout_s) {
    char errf[400];
    snprintf(errf, sizeof errf, "%s/run.err", srv.dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(errf, "w", stderr);
        (void)f;
        const char *argv[40];
        int n = 0;
        argv[n++] = ty_bin();
        for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0, done = 0;
    for (int i = 0; i < timeout_s * 20 && !done; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) done = 1;
        else ty_sleep_ms(50);
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    size_t len = 0;
    char *s = file_read_all(errf, 1 << 20, &len);
    snprintf(err, errlen, "%s", s ? s : "");
    free(s);
    return done && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_text(const char *path, const char *text) {
    ck_assert_int_eq(file_write_atomic(path, text, strlen(text), 0600), 0);
}

/* A plain HTTP request to host:port of url: the bytes that came back (at most n-1). */
static size_t plain_request(const char *url, char *out, size_t n) {
    const char *hp = strstr(url, "://");
    ck_assert_ptr_nonnull(hp);
    int port = atoi(strrchr(hp, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char req[] = "GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd, out + got, n - 1 - got)) > 0) got += (size_t)r;
    out[got] = '\0';
    close(fd);
    return got;
}

/* ---------------------------------------------------------------- a TLS client of our own (OpenSSL) */

static int url_port(const char *url) {
    const char *c = strrchr(url, ':');
    ck_assert_ptr_nonnull(c);
    return atoi(c + 1);
}

/* A TCP connection to 127.0.0.1:port with 5 s timeouts. */
static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

typedef struct tls_conn {
    SSL_CTX *ctx;
    SSL *ssl;
    int fd;
} tls_conn;

/* What a handshake showed. */
typedef struct tls_seen {
    tls_cert_info cert;               /* the server's certificate */
    int version;                      /* TLS1_2_VERSION, ... */
    int aead;                         /* the cipher is an AEAD one */
    char cipher[64];
} tls_seen;

static void tls_conn_close(tls_conn *t) {
    if (t->ssl) SSL_free(t->ssl);
    if (t->ctx) SSL_CTX_free(t->ctx);
    if (t->fd >= 0) close(t->fd);
    t->ssl = NULL;
    t->ctx = NULL;
    t->fd = -1;
}

/* A handshake with 127.0.0.1:port offering protocols min..max (and, when
 * ciphers12, only those TLS 1.2 suites); with cafile, the server's chain
 * must verify against it and name 127.0.0.1. 0 with t open and seen
 * filled, or -1 (t closed) when the handshake failed. */
static int tls_open(tls_conn *t, int port, int min, int max, const char *ciphers12, const char *cafile, tls_seen *seen) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->ctx = SSL_CTX_new(TLS_client_method());
    ck_assert_ptr_nonnull(t->ctx);
    SSL_CTX_set_security_level(t->ctx, 0); /* so that the client offers TLS 1.0 and 1.1 when asked to */
    ck_assert_int_eq(SSL_CTX_set_min_proto_version(t->ctx, min), 1);
    ck_assert_int_eq(SSL_CTX_set_max_proto_version(t->ctx, max), 1);
    ck_assert_int_eq(SSL_CTX_set_cipher_list(t->ctx, ciphers12 ? ciphers12 : "ALL:@SECLEVEL=0"), 1);
    if (cafile) {
        ck_assert_int_eq(SSL_CTX_load_verify_locations(t->ctx, cafile, NULL), 1);
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
        ck_assert_int_eq(X509_VERIFY_PARAM_set1_ip_asc(SSL_CTX_get0_param(t->ctx), "127.0.0.1"), 1);
    } else {
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_NONE, NULL);
    }
    t->fd = tcp_connect(port);
    t->ssl = SSL_new(t->ctx);
    ck_assert_ptr_nonnull(t->ssl);
    ck_assert_int_eq(SSL_set_fd(t->ssl, t->fd), 1);
    if (SSL_connect(t->ssl) != 1) {
        ERR_clear_error();
        tls_conn_close(t);
        return -1;
    }
    memset(seen, 0, sizeof *seen);
    X509 *x = SSL_get1_peer_certificate(t->ssl);
    ck_assert_ptr_nonnull(x);
    BIO *b = BIO_new(BIO_s_mem());
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(PEM_write_bio_X509(b, x), 1);
    char *pem = NULL;
    long n = BIO_get_mem_data(b, &pem);
    char err[256];
    ck_assert_msg(tls_cert_read(pem, (size_t)n, &seen->cert, err, sizeof err) == 0, "%s", err);
    BIO_free(b);
    X509_free(x);
    const SSL_CIPHER *c = SSL_get_current_cipher(t->ssl);
    seen->version = SSL_version(t->ssl);
    seen->aead = c && SSL_CIPHER_is_aead(c);
    snprintf(seen->cipher, sizeof seen->cipher, "%s", c ? SSL_CIPHER_get_name(c) : "?");
    return 0;
}

/* GET /api/v1/health on an open connection (kept alive): the status. */
static int tls_get_health(tls_conn *t) {
    static const char req[] = "GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if (SSL_write(t->ssl, req, (int)sizeof req - 1) != (int)sizeof req - 1) return -1;
    char in[4096];
    size_t got = 0;
    long want = -1;
    char *body = NULL;
    while (got + 1 < sizeof in) {
        int r = SSL_read(t->ssl, in + got, (int)(sizeof in - 1 - got));
        if (r <= 0) return -1;
        got += (size_t)r;
        in[got] = '\0';
        if (!body && (body = strstr(in, "\r\n\r\n"))) {
            body += 4;
            const char *cl = strcasestr(in, "Content-Length:");
            if (!cl) return -1;
            want = atol(cl + 15);
        }
        if (body && (long)(in + got - body) >= want) break;
    }
    return body && strncmp(in, "HTTP/1.1 ", 9) == 0 ? atoi(in + 9) : -1;
}

START_TEST(tls_auto_serves_https_only) {
    const char *extra[] = {"--tls", "auto", NULL};
    ty_server_start_args(&srv, "server", extra);
    ck_assert_msg(strncmp(srv.url, "https://127.0.0.1:", 18) == 0, "url %s", srv.url);
    char ca[400], cakey[400], crt[400], key[400];
    tls_path(ca, sizeof ca, "ca.crt");
    tls_path(cakey, sizeof cakey, "ca.key");
    tls_path(crt, sizeof crt, "server.crt");
    tls_path(key, sizeof key, "server.key");
    ck_assert_int_eq(file_mode(ca), 0644);
    ck_assert_int_eq(file_mode(crt), 0644);
    ck_assert_int_eq(file_mode(cakey), 0600);
    ck_assert_int_eq(file_mode(key), 0600);
    char tok[128];
    ty_token(&srv, "token", tok, sizeof tok);

    /* a client that does not trust the CA gets no answer: verification fails */
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/cluster", NULL, 0, NULL, &r), -1);
    ck_assert_msg(strstr(r.error, "TRAINYARD_CA") != NULL, "the error does not say what to do: %s", r.error);
    client_reply_release(&r);
    client_release(&c);

    /* plain HTTP to the TLS port: no HTTP answer in the clear */
    char back[512];
    size_t n = plain_request(srv.url, back, sizeof back);
    ck_assert_msg(n == 0 || strncmp(back, "HTTP/", 5) != 0, "a plain request got an HTTP answer: %.60s", back);

    /* trusting the CA: the API answers, and says it is served over TLS with this CA */
    char err[512];
    ck_assert_msg(client_trust_ca_file(ca, "ca", err, sizeof err) == 0, "%s", err);
    cJSON *cl = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, &cl), 200);
    cJSON *tr = cJSON_GetObjectItem(cl, "transport");
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(tr, "tls")));
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(tr, "insecure_http")));
    size_t clen = 0;
    char *capem = file_read_all(ca, 1 << 20, &clen);
    ck_assert_ptr_nonnull(capem);
    char pin[TLS_PIN_LEN];
    ty_ca_pin(&srv, pin);
    ck_assert_str_eq(ty_str(tr, "ca_hash"), pin);
    cJSON_Delete(cl);
    /* the CA is public: GET /api/v1/tls/ca without a token gives the file */
    char *served = ty_http_text(srv.url, NULL, "/api/v1/tls/ca");
    ck_assert_str_eq(served, capem);
    free(served);

    /* a restart keeps the CA and the certificate: clients that trust it go on */
    size_t slen = 0;
    char *crt1 = file_read_all(crt, 1 << 20, &slen);
    ck_assert_ptr_nonnull(crt1);
    ty_kill(&srv, SIGTERM);
    ty_server_start_args(&srv, "server", extra);
    char *ca2 = file_read_all(ca, 1 << 20, &clen), *crt2 = file_read_all(crt, 1 << 20, &slen);
    ck_assert_str_eq(ca2, capem);
    ck_assert_str_eq(crt2, crt1);
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, NULL), 200);
    free(ca2);
    free(crt2);
    free(crt1);
    free(capem);
}
END_TEST

START_TEST(up_tls_trains_a_job) {
    const char *extra[] = {"--tls", "auto", "--cpu-slots", "1", "--isolation", "none", NULL};
    ty_server_start_args(&srv, "up", extra);
    char ca[400], err[512], tok[128];
    tls_path(ca, sizeof ca, "ca.crt");
    ck_assert_msg(client_trust_ca_file(ca, "ca", err, sizeof err) == 0, "%s", err);
    ty_token(&srv, "token", tok, sizeof tok);
    int64_t id = ty_submit(srv.url, tok,
                           "{\"name\": \"over-tls\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16, "
                           "\"activation\": \"relu\"}, {\"type\": \"dense\", \"units\": 10, \"activation\": \"softmax\"}]},"
                           " \"compile\": {\"optimizer\": \"adam\", \"loss\": \"sparse_categorical_crossentropy\", "
                           "\"metrics\": [\"accuracy\"]}, \"data\": {\"source\": \"fashion-mnist\", \"limit\": 1500},"
                           " \"fit\": {\"epochs\": 2, \"batch_size\": 64}, \"checkpoint\": {\"every_epochs\": 1}}");
    cJSON *j = NULL;
    for (int i = 0; i < 600; i++) {
        cJSON_Delete(j);
        j = ty_job_get(srv.url, tok, id);
        const char *st = ty_str(j, "state");
        if (strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0) break;
        ty_sleep_ms(200);
    }
    ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "the job over TLS: %s (%s)", ty_str(j, "state"),
                  ty_str(j, "reason"));
    cJSON_Delete(j);
    /* the worker's metrics and checkpoints came back over HTTPS */
    cJSON *m = ty_metrics_all(srv.url, tok, id);
    ck_assert_int_gt(cJSON_GetArraySize(m), 0);
    cJSON_Delete(m);
    cJSON *ck = NULL;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &ck), 200);
    ck_assert_int_gt(cJSON_GetArraySize(cJSON_GetObjectItem(ck, "checkpoints")), 0);
    cJSON_Delete(ck);
}
END_TEST

static int nodes_in_cluster(const char *tok) {
    cJSON *cl = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, &cl), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(cl, "nodes"));
    cJSON_Delete(cl);
    return n;
}

START_TEST(agent_joins_with_the_ca_hash) {
    const char *extra[] = {"--tls", "auto", NULL};
    ty_server_start_args(&srv, "server", extra);
    char ca[400], err[2048], admin[128], tokfile[400], pin[TLS_PIN_LEN];
    tls_path(ca, sizeof ca, "ca.crt");
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    ty_ca_pin(&srv, pin);
    ck_assert_msg(client_trust_ca_file(ca, "ca", err, sizeof err) == 0, "%s", err);

    /* a wrong hash: the agent stops before it registers, naming both hashes */
    const char *wrong = "sha256:00000000000000000000000000000000000000000000000000000000000000ff";
    const char *bad[] = {"agent", "--server", srv.url, "--token-file", tokfile, "--ca-hash", wrong,
                         "--isolation", "none", NULL};
    int rc = run_bin(bad, err, sizeof err, 20);
    ck_assert_msg(rc == 1, "the agent with a wrong hash exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, wrong) && strstr(err, pin), "the error names neither hash: %s", err);
    ck_assert_int_eq(nodes_in_cluster(admin), 0);
    /* a hash that is not one */
    const char *junk[] = {"agent", "--server", srv.url, "--token-file", tokfile, "--ca-hash", "sha256:xyz",
                          "--isolation", "none", NULL};
    ck_assert_int_eq(run_bin(junk, err, sizeof err, 20), 1);
    ck_assert_msg(strstr(err, "--ca-hash") != NULL, "%s", err);

    /* the right hash: the agent (which trusts nothing else) registers */
    char statef[400], logf[400];
    snprintf(statef, sizeof statef, "%s/agent.state", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent.log", srv.dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        unsetenv("TRAINYARD_CA");
        unsetenv("TRAINYARD_CA_PEM");
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token-file", tokfile, "--ca-hash", pin,
              "--isolation", "none", "--heartbeat", "1", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    int joined = 0;
    for (int i = 0; i < 100 && !joined; i++) {
        joined = nodes_in_cluster(admin) == 1;
        if (!joined) ty_sleep_ms(100);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    ck_assert_msg(joined, "the agent with the right hash did not join; see %s", logf);
}
END_TEST

START_TEST(given_certificate_is_served) {
    char err[512], *ca_c, *ca_k, *c, *k;
    const char *names[] = {"127.0.0.1", "localhost"};
    ck_assert_msg(tls_make_cert("test CA", -60, 3600, NULL, 0, NULL, NULL, &ca_c, &ca_k, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tls_make_cert("127.0.0.1", -60, 3600, names, 2, ca_c, ca_k, &c, &k, err, sizeof err) == 0, "%s", err);
    char cf[400], kf[400], caf[400];
    snprintf(cf, sizeof cf, "%s/given.crt", srv.dir);
    snprintf(kf, sizeof kf, "%s/given.key", srv.dir);
    snprintf(caf, sizeof caf, "%s/given-ca.crt", srv.dir);
    write_text(cf, c);
    write_text(kf, k);
    write_text(caf, ca_c);
    char data[400];
    snprintf(data, sizeof data, "%s", srv.dir);
    const char *extra[] = {"--tls-cert", cf, "--tls-key", kf, NULL};
    ty_server_start_args(&srv, "server", extra);
    ck_assert_msg(client_trust_ca_file(caf, "ca", err, sizeof err) == 0, "%s", err);
    char tok[128];
    ty_token(&srv, "token", tok, sizeof tok);
    cJSON *cl = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, &cl), 200);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(cl, "transport"), "tls")));
    cJSON_Delete(cl);
    /* no CA of its own to hand out */
    cJSON *e = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/api/v1/tls/ca", NULL, &e), 404);
    cJSON_Delete(e);
    free(ca_c);
    free(ca_k);
    free(c);
    free(k);
}
END_TEST

/* The server with args refuses to start: exit 1, one line naming `names`,
 * and the data directory it was given not made. */
static void refused(const char *const *args, const char *names) {
    char err[2048];
    int rc = run_bin(args, err, sizeof err, 20);
    ck_assert_msg(rc == 1, "exit %d for %s: %s", rc, args[1], err);
    ck_assert_msg(strstr(err, names) != NULL, "the error does not name %s: %s", names, err);
    size_t lines = 0;
    for (const char *p = err; *p; p++) lines += *p == '\n';
    ck_assert_msg(lines == 1, "%zu lines: %s", lines, err);
}

START_TEST(bad_tls_input_starts_nothing) {
    char err[512], *ca_c, *ca_k, *c1, *k1, *c2, *k2, *ce, *ke;
    const char *names[] = {"127.0.0.1"};
    ck_assert_int_eq(tls_make_cert("CA", -60, 3600, NULL, 0, NULL, NULL, &ca_c, &ca_k, err, sizeof err), 0);
    ck_assert_int_eq(tls_make_cert("one", -60, 3600, names, 1, ca_c, ca_k, &c1, &k1, err, sizeof err), 0);
    ck_assert_int_eq(tls_make_cert("two", -60, 3600, names, 1, ca_c, ca_k, &c2, &k2, err, sizeof err), 0);
    ck_assert_int_eq(tls_make_cert("old", -7200, -3600, names, 1, ca_c, ca_k, &ce, &ke, err, sizeof err), 0);
    char f_c1[400], f_k2[400], f_ce[400], f_ke[400], f_junk[400], f_k1[400], data[400];
    snprintf(f_c1, sizeof f_c1, "%s/one.crt", srv.dir);
    snprintf(f_k1, sizeof f_k1, "%s/one.key", srv.dir);
    snprintf(f_k2, sizeof f_k2, "%s/two.key", srv.dir);
    snprintf(f_ce, sizeof f_ce, "%s/old.crt", srv.dir);
    snprintf(f_ke, sizeof f_ke, "%s/old.key", srv.dir);
    snprintf(f_junk, sizeof f_junk, "%s/junk.pem", srv.dir);
    snprintf(data, sizeof data, "%s/data", srv.dir);
    write_text(f_c1, c1);
    write_text(f_k1, k1);
    write_text(f_k2, k2);
    write_text(f_ce, ce);
    write_text(f_ke, ke);
    write_text(f_junk, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n");
    const char *missing[] = {"server", "--listen", "127.0.0.1:0", "--data", data, "--tls-cert", "/nonexistent/x.crt",
                             "--tls-key", f_k1, NULL};
    refused(missing, "/nonexistent/x.crt");
    const char *junk[] = {"server", "--listen", "127.0.0.1:0", "--data", data, "--tls-cert", f_junk,
                          "--tls-key", f_k1, NULL};
    refused(junk, f_junk);
    const char *junk_key[] = {"server", "--listen", "127.0.0.1:0", "--data", data, "--tls-cert", f_c1,
                              "--tls-key", f_junk, NULL};
    refused(junk_key, f_junk);
    const char *mismatch[] = {"server", "--listen", "127.0.0.1:0", "--data", data, "--tls-cert", f_c1,
                              "--tls-key", f_k2, NULL};
    refused(mismatch, f_k2);
    const char *expired[] = {"server", "--listen", "127.0.0.1:0", "--data", data, "--tls-cert", f_ce,
                             "--tls-key", f_ke, NULL};
    refused(expired, "expired");
    /* plain HTTP on an address other than loopback */
    const char *plain[] = {"server", "--listen", "0.0.0.0:0", "--data", data, NULL};
    refused(plain, "--insecure-http");
    struct stat st;
    ck_assert_msg(stat(data, &st) < 0 && errno == ENOENT, "a refused server made %s", data);
    /* an agent given a CA file that holds none */
    const char *agent[] = {"agent", "--server", "https://127.0.0.1:1", "--token", "x", "--ca-cert", f_junk, NULL};
    ck_assert_int_eq(run_bin(agent, err, sizeof err, 20), 2);
    ck_assert_msg(strstr(err, f_junk) != NULL, "%s", err);
    /* the CLI given an expired CA */
    const char *cli[] = {"jobs", "--url", "https://127.0.0.1:1", "--token", "x", "--ca-cert", f_ce, NULL};
    ck_assert_int_eq(run_bin(cli, err, sizeof err, 20), 2);
    ck_assert_msg(strstr(err, "expired") != NULL, "%s", err);
    free(ca_c), free(ca_k), free(c1), free(k1), free(c2), free(k2), free(ce), free(ke);
}
END_TEST

START_TEST(insecure_http_is_said) {
    /* on 0.0.0.0 (the later --listen wins; reached through 127.0.0.1):
     * allowed, said at start and in /cluster */
    const char *extra[] = {"--listen", "0.0.0.0:0", "--insecure-http", NULL};
    ty_server_start_args(&srv, "server", extra);
    int port = atoi(strrchr(srv.url, ':') + 1);
    snprintf(srv.url, sizeof srv.url, "http://127.0.0.1:%d", port);
    char tok[128];
    ty_token(&srv, "token", tok, sizeof tok);
    cJSON *cl = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, &cl), 200);
    cJSON *tr = cJSON_GetObjectItem(cl, "transport");
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(tr, "tls")));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(tr, "insecure_http")));
    cJSON_Delete(cl);
    char logf[400];
    snprintf(logf, sizeof logf, "%s/server.log", srv.dir);
    size_t n = 0;
    char *log = file_read_all(logf, 1 << 20, &n);
    ck_assert_msg(log && strstr(log, "in the clear"), "no warning at start: %s", log ? log : "");
    free(log);
}
END_TEST

START_TEST(only_tls12_and_13_with_aead) {
    const char *extra[] = {"--tls", "auto", NULL};
    ty_server_start_args(&srv, "server", extra);
    int port = url_port(srv.url);
    char ca[400];
    tls_path(ca, sizeof ca, "ca.crt");
    tls_conn t;
    tls_seen seen;
    /* TLS 1.0 and 1.1: no handshake */
    ck_assert_msg(tls_open(&t, port, TLS1_VERSION, TLS1_VERSION, NULL, NULL, &seen) < 0, "TLS 1.0 was accepted");
    ck_assert_msg(tls_open(&t, port, TLS1_1_VERSION, TLS1_1_VERSION, NULL, NULL, &seen) < 0, "TLS 1.1 was accepted");
    /* TLS 1.2 offering only CBC suites, or only AES-CCM (AEAD, but not the profile's) */
    const char *refused_suites[] = {"ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA:"
                                    "ECDHE-ECDSA-AES256-SHA",
                                    "ECDHE-ECDSA-AES128-CCM:ECDHE-ECDSA-AES256-CCM:ECDHE-ECDSA-AES128-CCM8"};
    for (int i = 0; i < 2; i++)
        ck_assert_msg(tls_open(&t, port, TLS1_2_VERSION, TLS1_2_VERSION, refused_suites[i], NULL, &seen) < 0,
                      "TLS 1.2 with only %s was accepted (%s)", refused_suites[i], seen.cipher);
    /* TLS 1.2 with everything offered: an AEAD suite with ECDHE, verified against the CA */
    ck_assert_int_eq(tls_open(&t, port, TLS1_2_VERSION, TLS1_2_VERSION, NULL, ca, &seen), 0);
    ck_assert_msg(seen.aead && strncmp(seen.cipher, "ECDHE-ECDSA-", 12) == 0, "TLS 1.2 chose %s", seen.cipher);
    ck_assert_int_eq(tls_get_health(&t), 200);
    tls_conn_close(&t);
    /* each of the profile's three TLS 1.2 suites for the auto certificate's P-256 key */
    const char *suites[] = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                            "ECDHE-ECDSA-CHACHA20-POLY1305"};
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(tls_open(&t, port, TLS1_2_VERSION, TLS1_2_VERSION, suites[i], ca, &seen) == 0, "%s refused",
                      suites[i]);
        ck_assert_str_eq(seen.cipher, suites[i]);
        tls_conn_close(&t);
    }
    /* TLS 1.3 by default */
    ck_assert_int_eq(tls_open(&t, port, TLS1_VERSION, TLS1_3_VERSION, NULL, ca, &seen), 0);
    ck_assert_int_eq(seen.version, TLS1_3_VERSION);
    ck_assert(seen.aead);
    ck_assert_int_eq(tls_get_health(&t), 200);
    tls_conn_close(&t);
}
END_TEST

static int log_has(const char *needle) {
    size_t n = 0;
    char *log = file_read_all(srv.log, 1 << 22, &n);
    int has = log && strstr(log, needle) != NULL;
    free(log);
    return has;
}

/* The serial of the certificate in file (PEM). */
static void file_serial(const char *file, char out[48]) {
    size_t n = 0;
    char *pem = file_read_all(file, 1 << 20, &n), err[256];
    ck_assert_ptr_nonnull(pem);
    tls_cert_info info;
    ck_assert_msg(tls_cert_read(pem, n, &info, err, sizeof err) == 0, "%s: %s", file, err);
    snprintf(out, 48, "%s", info.serial);
    free(pem);
}

START_TEST(auto_certificate_renews_while_serving) {
    /* a 9 s certificate: renewed when 3 s of it are left, every 6 s */
    ck_assert_int_eq(setenv("TRAINYARD_TLS_AUTO_LIFETIME_S", "9", 1), 0);
    const char *extra[] = {"--tls", "auto", NULL};
    ty_server_start_args(&srv, "server", extra);
    unsetenv("TRAINYARD_TLS_AUTO_LIFETIME_S");
    pid_t pid = srv.pid;
    int port = url_port(srv.url);
    char ca[400], crt[400], err[512], tok[128];
    tls_path(ca, sizeof ca, "ca.crt");
    tls_path(crt, sizeof crt, "server.crt");
    ck_assert_msg(client_trust_ca_file(ca, "ca", err, sizeof err) == 0, "%s", err);
    ty_token(&srv, "token", tok, sizeof tok);
    size_t n = 0;
    char *ca_before = file_read_all(ca, 1 << 20, &n);
    ck_assert_ptr_nonnull(ca_before);

    /* a connection made before any renewal, kept open throughout */
    tls_conn kept;
    tls_seen first, seen;
    ck_assert_int_eq(tls_open(&kept, port, TLS1_2_VERSION, TLS1_3_VERSION, NULL, ca, &first), 0);
    ck_assert_int_le(first.cert.not_after - first.cert.not_before, 9 + 3600 + 1); /* backdated an hour */
    char serials[8][48];
    int64_t not_after[8];
    int nserials = 1, requests = 0;
    snprintf(serials[0], 48, "%s", first.cert.serial);
    not_after[0] = first.cert.not_after;
    /* 4 times a second for up to 30 s: a new connection (its certificate
     * noted), a request through our client (a new connection, trusting the
     * CA only) and one on the kept connection; until two renewals are seen */
    for (int i = 0; i < 120 && nserials < 3; i++) {
        tls_conn t;
        ck_assert_msg(tls_open(&t, port, TLS1_2_VERSION, TLS1_3_VERSION, NULL, ca, &seen) == 0,
                      "a handshake trusting the CA failed after %d requests; see %s", requests, srv.log);
        ck_assert_int_eq(tls_get_health(&t), 200);
        tls_conn_close(&t);
        if (strcmp(seen.cert.serial, serials[nserials - 1]) != 0) {
            ck_assert_msg(seen.cert.not_after > not_after[nserials - 1], "a renewed certificate ends no later");
            snprintf(serials[nserials], 48, "%s", seen.cert.serial);
            not_after[nserials++] = seen.cert.not_after;
        }
        ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, NULL), 200);
        ck_assert_msg(tls_get_health(&kept) == 200, "the connection made before the renewal failed");
        requests += 3;
        ty_sleep_ms(250);
    }
    ck_assert_msg(nserials >= 3, "%d certificates served in 30 s (want a renewal every 6 s); see %s", nserials, srv.log);
    /* the same process all along, the same CA, the renewed certificate on disk */
    ck_assert_int_eq(srv.pid, pid);
    ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), 0);
    ck_assert_msg(log_has("tls: renewed the server certificate"), "no renewal logged in %s", srv.log);
    char *ca_after = file_read_all(ca, 1 << 20, &n);
    ck_assert_ptr_nonnull(ca_after);
    ck_assert_str_eq(ca_after, ca_before);
    char on_disk[48];
    file_serial(crt, on_disk);
    ck_assert_msg(strcmp(on_disk, serials[0]) != 0, "server.crt still holds the first certificate");
    free(ca_after);
    free(ca_before);
    tls_conn_close(&kept);
}
END_TEST

/* Waits up to 10 s for the certificate served to new connections to have
 * serial want; 1 when it did. */
static int served_serial_becomes(int port, const char *cafile, const char *want) {
    for (int i = 0; i < 100; i++) {
        tls_conn t;
        tls_seen seen;
        if (tls_open(&t, port, TLS1_2_VERSION, TLS1_3_VERSION, NULL, cafile, &seen) == 0) {
            tls_conn_close(&t);
            if (strcmp(seen.cert.serial, want) == 0) return 1;
        }
        ty_sleep_ms(100);
    }
    return 0;
}

/* Waits up to 10 s for the server's log to hold needle. */
static int log_gets(const char *needle) {
    for (int i = 0; i < 100; i++) {
        if (log_has(needle)) return 1;
        ty_sleep_ms(100);
    }
    return 0;
}

START_TEST(given_certificate_warned_and_reread_on_sighup) {
    char err[512], *ca_c, *ca_k, *c1, *k1, *c2, *k2, *c3, *k3;
    const char *names[] = {"127.0.0.1", "localhost"};
    ck_assert_int_eq(tls_make_cert("test CA", -60, 90 * 86400, NULL, 0, NULL, NULL, &ca_c, &ca_k, err, sizeof err), 0);
    /* one that expires in 10 days, one in 60 (not warned about), one of another key */
    ck_assert_int_eq(tls_make_cert("127.0.0.1", -60, 10 * 86400, names, 2, ca_c, ca_k, &c1, &k1, err, sizeof err), 0);
    ck_assert_int_eq(tls_make_cert("127.0.0.1", -60, 60 * 86400, names, 2, ca_c, ca_k, &c2, &k2, err, sizeof err), 0);
    ck_assert_int_eq(tls_make_cert("127.0.0.1", -60, 60 * 86400, names, 2, ca_c, ca_k, &c3, &k3, err, sizeof err), 0);
    tls_cert_info i1, i2;
    ck_assert_int_eq(tls_cert_read(c1, strlen(c1), &i1, err, sizeof err), 0);
    ck_assert_int_eq(tls_cert_read(c2, strlen(c2), &i2, err, sizeof err), 0);
    char cf[400], kf[400], caf[400];
    snprintf(cf, sizeof cf, "%s/given.crt", srv.dir);
    snprintf(kf, sizeof kf, "%s/given.key", srv.dir);
    snprintf(caf, sizeof caf, "%s/given-ca.crt", srv.dir);
    write_text(cf, c1);
    write_text(kf, k1);
    write_text(caf, ca_c);
    const char *extra[] = {"--tls-cert", cf, "--tls-key", kf, NULL};
    ty_server_start_args(&srv, "server", extra);
    pid_t pid = srv.pid;
    int port = url_port(srv.url);
    ck_assert_msg(client_trust_ca_file(caf, "ca", err, sizeof err) == 0, "%s", err);
    char tok[128];
    ty_token(&srv, "token", tok, sizeof tok);

    /* at start: a warning naming the file and the date */
    char want[1024];
    snprintf(want, sizeof want, "tls: --tls-cert %s expires on %s", cf, i1.not_after_text);
    ck_assert_msg(log_gets(want), "no '%s' in %s", want, srv.log);
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, NULL), 200);

    /* new files and SIGHUP: the new certificate is served by the same process, not warned about */
    write_text(cf, c2);
    write_text(kf, k2);
    ck_assert_int_eq(kill(pid, SIGHUP), 0);
    ck_assert_msg(served_serial_becomes(port, caf, i2.serial), "the new certificate is not served; see %s", srv.log);
    snprintf(want, sizeof want, "tls: SIGHUP: serving %s now (serial %s", cf, i2.serial);
    ck_assert_msg(log_gets(want), "no '%s' in %s", want, srv.log);
    snprintf(want, sizeof want, "expires on %s", i2.not_after_text);
    ck_assert_msg(!log_has(want), "a certificate of 60 days was warned about");
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, NULL), 200);

    /* a file that is no certificate, then a key that is not the certificate's:
     * logged with why, and the one served stays */
    write_text(cf, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n");
    ck_assert_int_eq(kill(pid, SIGHUP), 0);
    snprintf(want, sizeof want, "tls: SIGHUP: --tls-cert %s: no PEM certificate in it; still serving the certificate "
                                "read before (serial %s",
             cf, i2.serial);
    ck_assert_msg(log_gets(want), "no '%s' in %s", want, srv.log);
    write_text(cf, c3);
    ck_assert_int_eq(kill(pid, SIGHUP), 0);
    snprintf(want, sizeof want, "tls: SIGHUP: --tls-key %s is not the key of the certificate in --tls-cert %s", kf, cf);
    ck_assert_msg(log_gets(want), "no '%s' in %s", want, srv.log);
    ck_assert(served_serial_becomes(port, caf, i2.serial));
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/cluster", NULL, NULL), 200);
    ck_assert_int_eq(srv.pid, pid);
    ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), 0);
    free(ca_c), free(ca_k), free(c1), free(k1), free(c2), free(k2), free(c3), free(k3);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tls");
    TCase *tc = ty_tcase(s, "tls", setup, teardown, 120);
    tcase_add_test(tc, tls_auto_serves_https_only);
    tcase_add_test(tc, up_tls_trains_a_job);
    tcase_add_test(tc, agent_joins_with_the_ca_hash);
    tcase_add_test(tc, given_certificate_is_served);
    tcase_add_test(tc, bad_tls_input_starts_nothing);
    tcase_add_test(tc, insecure_http_is_said);
    tcase_add_test(tc, only_tls12_and_13_with_aead);
    tcase_add_test(tc, auto_certificate_renews_while_serving);
    tcase_add_test(tc, given_certificate_warned_and_reread_on_sighup);
    return ty_run_suite(s);
}
