/* shell.c - `trainyard shell` (see shell.h): the client end of the exec
 * WebSocket, one poll() loop over stdin, the socket and a signal pipe. */
#include "shell.h"
#include "client.h"
#include "upgrade.h"
#include "../common/util.h"
#include "../common/ws.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#define SH_FRAME_MAX (1u << 20)              /* a server frame's most bytes */
#define SH_IN_MAX (SH_FRAME_MAX + WS_HEAD_MAX)
#define SH_CHUNK (16u << 10)                 /* one read of stdin */
#define SH_OUT_LOW (256u << 10)              /* frames waiting for the socket: stdin waits past this */
#define SH_OUT_MAX (SH_OUT_LOW + SH_CHUNK + SH_IN_MAX + 4096)
#define SH_UPGRADE_MS 30000                  /* the server waits 10 s for the node's agent */
#define SH_LINGER_MS 2000                    /* after our Close: the server's answer awaited */

enum { EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_LOST = 255 };

/* ---------------------------------------------------------------- terminal */

static struct termios g_saved;
static int g_raw;                /* the terminal is raw: restore it */

static void term_restore(void) {
    if (!g_raw) return;
    tcsetattr(0, TCSADRAIN, &g_saved);
    g_raw = 0;
}

static int term_raw(void) {
    if (tcgetattr(0, &g_saved) < 0) return -1;
    struct termios t = g_saved;
    cfmakeraw(&t);
    if (tcsetattr(0, TCSADRAIN, &t) < 0) return -1;
    g_raw = 1;
    atexit(term_restore); /* and every return below restores it first */
    return 0;
}

static int g_sig_w = -1;

static void on_signal(int sig) {
    int e = errno;
    unsigned char c = (unsigned char)sig;
    ssize_t w = write(g_sig_w, &c, 1);
    (void)w;
    errno = e;
}

/* SIGWINCH, SIGINT, SIGTERM and SIGHUP as bytes on a pipe; SIGPIPE ignored. */
static int signals_open(void) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
    g_sig_w = p[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGWINCH, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return p[0];
}

/* ---------------------------------------------------------------- helpers */

/* An error answer as one line: "error: message (field: f) [HTTP 404 not_found]". */
static void print_refusal(long status, const char *body, size_t len) {
    cJSON *o = cJSON_ParseWithLength(body ? body : "", len);
    const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "error") : NULL;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *field = cJSON_GetObjectItemCaseSensitive(e, "field");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    if (cJSON_IsString(msg)) {
        fprintf(stderr, "error: %s", msg->valuestring);
        if (cJSON_IsString(field) && field->valuestring[0]) fprintf(stderr, " (field: %s)", field->valuestring);
        fprintf(stderr, " [HTTP %ld %s]\n", status, cJSON_IsString(code) ? code->valuestring : "-");
    } else {
        int n = (int)(len > 200 ? 200 : len);
        fprintf(stderr, "error: HTTP %ld: %.*s\n", status, n, body ? body : "");
    }
    cJSON_Delete(o);
}

static int query_add(buf *q, const char *name, const char *value) {
    if (buf_printf(q, "%c%s=", q->len ? '&' : '?', name) < 0) return -1;
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                    *p == '_' || *p == '.' || *p == '~';
        if ((plain ? buf_append(q, p, 1) : buf_printf(q, "%%%02X", *p)) < 0) return -1;
    }
    return 0;
}

/* The job's first running task (GET /jobs/{id}): its name into out. 0, or
 * an exit code (said on stderr). */
static int first_running(const shell_opts *o, char *out, size_t n) {
    client c;
    if (client_init(&c, o->url, o->token) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        return EXIT_REFUSED;
    }
    snprintf(c.team, sizeof c.team, "%s", o->team ? o->team : "");
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%s", o->job);
    client_reply r;
    int rc = client_request(&c, "GET", path, NULL, 0, NULL, &r);
    client_release(&c);
    if (rc < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
        client_reply_release(&r);
        return EXIT_UNREACHABLE;
    }
    if (r.status >= 400) {
        print_refusal(r.status, r.body.data, r.body.len);
        client_reply_release(&r);
        return r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
    }
    cJSON *j = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    client_reply_release(&r);
    const cJSON *t;
    int found = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(j, "tasks")) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(t, "state");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (cJSON_IsString(st) && strcmp(st->valuestring, "running") == 0 && cJSON_IsString(name) &&
            sfmt(out, n, "%s", name->valuestring) == 0) {
            found = 1;
            break;
        }
    }
    if (!found) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
        fprintf(stderr, "error: job %s has no running task (it is %s)\n", o->job,
                cJSON_IsString(st) ? st->valuestring : "unknown");
    }
    cJSON_Delete(j);
    return found ? 0 : EXIT_REFUSED;
}

/* ---------------------------------------------------------------- the session */

typedef struct session {
    client_conn k;
    ws_decoder dec;
    buf in, out;
    uint8_t *chunk;
    int tty;
    int sock_pending;
    int stdin_open;
    int close_sent, close_got, gone;
    int64_t linger_until;
    int have_status, exit_code;
    int out_gone;                /* our stdout or stderr was closed (EPIPE): the session ends */
} session;

static void send_frame(session *s, const void *p, size_t n) {
    if (s->close_sent || s->gone) return;
    if (ws_frame(&s->out, WS_BINARY, p, n, 1) < 0) s->gone = 1; /* the bounds leave room: cannot happen */
}

static void send_close(session *s, int code) {
    if (s->close_sent || s->gone) return;
    uint8_t p[2] = {(uint8_t)(code >> 8), (uint8_t)code};
    if (ws_frame(&s->out, WS_CLOSE, p, 2, 1) < 0) s->gone = 1;
    s->close_sent = 1;
    s->linger_until = mono_ms() + SH_LINGER_MS;
}

static void send_resize(session *s) {
    struct winsize ws;
    if (!s->tty || ioctl(0, TIOCGWINSZ, &ws) < 0 || !ws.ws_col || !ws.ws_row) return;
    char p[64];
    int n = snprintf(p, sizeof p, "%c{\"cols\":%u,\"rows\":%u}", 4, ws.ws_col, ws.ws_row);
    send_frame(s, p, (size_t)n);
}

/* Writes all of p to fd (a terminal or a pipe, perhaps non-blocking): 0,
 * or -1 when fd is closed (EPIPE: the reader has gone). */
static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
            continue;
        }
        if (w <= 0) return -1; /* closed: the rest has nowhere to go */
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Output for fd; a reader that has gone ends the session as SIGPIPE would
 * end a plain program (`trainyard shell 1 -- yes | head -1`). */
static void output(session *s, int fd, const uint8_t *p, size_t n) {
    if (s->out_gone) return;
    if (write_all(fd, p, n) < 0 && errno == EPIPE) {
        s->out_gone = 1;
        send_close(s, 1000);
    }
}

static void on_status(session *s, const uint8_t *p, size_t n) {
    cJSON *o = cJSON_ParseWithLength((const char *)p, n);
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(o, "exit");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsNumber(ex) && ex->valuedouble >= 0 && ex->valuedouble <= 255) {
        s->have_status = 1;
        s->exit_code = (int)ex->valuedouble;
    }
    if (cJSON_IsString(err)) {
        term_restore();
        fprintf(stderr, "error: %s\n", err->valuestring);
    }
    cJSON_Delete(o);
}

static void on_message(session *s, const ws_msg *m) {
    switch (m->opcode) {
    case WS_BINARY:
        if (!m->len) break;
        if (m->data[0] == 1) output(s, 1, m->data + 1, m->len - 1);
        else if (m->data[0] == 2) output(s, 2, m->data + 1, m->len - 1);
        else if (m->data[0] == 3) on_status(s, m->data + 1, m->len - 1);
        break;
    case WS_TEXT:
        output(s, 1, m->data, m->len);
        break;
    case WS_PING:
        if (!s->close_sent && ws_frame(&s->out, WS_PONG, m->data, m->len, 1) < 0) s->gone = 1;
        break;
    case WS_CLOSE:
        s->close_got = 1;
        send_close(s, m->close_code == 1005 ? 1000 : m->close_code);
        break;
    default:
        break;
    }
}

static int can_read_sock(const session *s) { return !s->gone && !s->close_got && s->out.len < SH_OUT_LOW; }

/* Handles the whole frames that s->in holds. */
static void sock_decode(session *s) {
    size_t at = 0;
    for (;;) {
        size_t used = 0;
        ws_msg m;
        int rc = ws_decode(&s->dec, (uint8_t *)s->in.data + at, s->in.len - at, &used, &m);
        at += used;
        if (rc < 0) {
            term_restore();
            fprintf(stderr, "error: the server broke the WebSocket protocol: %s\n", s->dec.err);
            send_close(s, s->dec.close_code);
            s->close_got = 1;
            break;
        }
        if (rc == 1) on_message(s, &m);
        if (!used || s->close_got) break;
    }
    if (at) {
        memmove(s->in.data, s->in.data + at, s->in.len - at);
        s->in.len -= at;
    }
}

static void sock_read(session *s) {
    while (can_read_sock(s)) {
        size_t room = SH_IN_MAX - s->in.len;
        ssize_t n = client_conn_recv(&s->k, s->chunk, room < 65536 ? room : 65536);
        if (n == -2) {
            s->sock_pending = 0;
            return;
        }
        if (n <= 0) {
            s->gone = 1;
            return;
        }
        buf_append(&s->in, s->chunk, (size_t)n); /* room was checked */
        sock_decode(s);
        s->sock_pending = 1;
    }
}

static void sock_write(session *s) {
    while (s->out.len && !s->gone) {
        ssize_t n = client_conn_send(&s->k, s->out.data, s->out.len);
        if (n < 0) {
            s->gone = 1;
            break;
        }
        if (n == 0) return;
        memmove(s->out.data, s->out.data + n, s->out.len - (size_t)n);
        s->out.len -= (size_t)n;
    }
}

static void stdin_read(session *s) {
    s->chunk[0] = 0;
    ssize_t n = read(0, s->chunk + 1, SH_CHUNK);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) {
        send_frame(s, s->chunk, (size_t)n + 1);
        return;
    }
    /* the end of stdin: the command's too (pipes); a terminal's ^D is the command's own */
    s->stdin_open = 0;
    if (!s->tty) {
        uint8_t eof = 5;
        send_frame(s, &eof, 1);
    }
}

static int session_loop(session *s, int sigfd) {
    int sig_got = 0;
    for (;;) {
        int64_t now = mono_ms();
        if (s->gone) break;
        if (s->close_sent && !s->out.len && (s->close_got || now >= s->linger_until)) break;
        struct pollfd pf[3];
        pf[0].fd = sigfd;
        pf[0].events = POLLIN;
        pf[1].fd = s->k.fd;
        pf[1].events = (short)((can_read_sock(s) ? POLLIN : 0) | (s->out.len ? POLLOUT : 0));
        pf[2].fd = s->stdin_open && !s->close_sent && s->out.len < SH_OUT_LOW ? 0 : -1;
        pf[2].events = POLLIN;
        int timeout = -1;
        if (s->close_sent) timeout = (int)(s->linger_until > now ? s->linger_until - now : 0);
        if (s->sock_pending && can_read_sock(s)) timeout = 0;
        int pr = poll(pf, 3, timeout);
        if (pr < 0 && errno != EINTR) break;
        if (pr < 0) continue;
        if (pf[0].revents) {
            unsigned char b[32];
            ssize_t n;
            while ((n = read(sigfd, b, sizeof b)) > 0)
                for (ssize_t i = 0; i < n; i++) {
                    if (b[i] == SIGWINCH) send_resize(s);
                    else if (!sig_got) { /* a stop: the command is ended (SIGHUP) by the Close */
                        sig_got = b[i];
                        send_close(s, 1000);
                    }
                }
        }
        if (pf[2].fd >= 0 && pf[2].revents) stdin_read(s);
        if ((pf[1].revents & (POLLIN | POLLERR | POLLHUP)) || s->sock_pending) sock_read(s);
        if (s->out.len) sock_write(s);
    }
    if (s->have_status) return s->exit_code;
    if (sig_got) return 128 + sig_got;
    if (s->out_gone) return 128 + SIGPIPE;
    term_restore();
    fprintf(stderr, "error: the connection ended before the command's exit status came\n");
    return EXIT_LOST;
}

int shell_run(const shell_opts *o) {
    long id;
    if (parse_long(o->job, 1, 1L << 53, &id) < 0) {
        fprintf(stderr, "error: '%s' is not a job id\n", o->job);
        return EXIT_USAGE;
    }
    char task[64];
    if (o->task) {
        if (sfmt(task, sizeof task, "%s", o->task) < 0 || !task[0] ||
            strspn(task, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(task)) {
            fprintf(stderr, "error: --task wants a task's name like worker-0, or its id\n");
            return EXIT_USAGE;
        }
    } else {
        int rc = first_running(o, task, sizeof task);
        if (rc) return rc;
    }
    int tty = isatty(0);
    struct winsize ws = {.ws_col = 80, .ws_row = 24};
    if (tty && (ioctl(0, TIOCGWINSZ, &ws) < 0 || !ws.ws_col || !ws.ws_row)) ws.ws_col = 80, ws.ws_row = 24;
    buf q;
    buf_init(&q, 256u << 10);
    int ok = 1;
    for (int i = 0; ok && i < o->argc; i++) ok = query_add(&q, "command", o->argv[i]) == 0;
    char num[16];
    ok = ok && query_add(&q, "tty", tty ? "1" : "0") == 0;
    if (tty) {
        snprintf(num, sizeof num, "%u", ws.ws_col);
        ok = ok && query_add(&q, "cols", num) == 0;
        snprintf(num, sizeof num, "%u", ws.ws_row);
        ok = ok && query_add(&q, "rows", num) == 0;
        const char *term = getenv("TERM");
        if (term && *term && strlen(term) < 64) ok = ok && query_add(&q, "term", term) == 0;
    }
    buf path;
    buf_init(&path, 300u << 10);
    ok = ok && buf_printf(&path, "/api/v1/jobs/%ld/tasks/%s/exec%s", id, task, q.data ? q.data : "") == 0;
    buf_release(&q);
    char key[25], want[29], got[64], hdr[256];
    if (!ok || ws_key_new(key) < 0 || ws_accept_key(key, want) < 0) {
        fprintf(stderr, "error: the command is too long\n");
        buf_release(&path);
        return EXIT_USAGE;
    }
    snprintf(hdr, sizeof hdr,
             "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
             "Sec-WebSocket-Protocol: trainyard.exec.v1\r\n",
             key);
    client c;
    if (client_init(&c, o->url, o->token) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        buf_release(&path);
        return EXIT_REFUSED;
    }
    snprintf(c.team, sizeof c.team, "%s", o->team ? o->team : "");
    session s;
    memset(&s, 0, sizeof s);
    char err[1500];
    int rc = client_upgrade(&c, path.data, hdr, SH_UPGRADE_MS, &s.k, err, sizeof err);
    client_release(&c);
    buf_release(&path);
    if (rc < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", err);
        return EXIT_UNREACHABLE;
    }
    if (s.k.status != 101) {
        print_refusal(s.k.status, s.k.body.data, s.k.body.len);
        long st = s.k.status;
        client_conn_close(&s.k);
        return st >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
    }
    if (!client_conn_header(&s.k, "Sec-WebSocket-Accept", got, sizeof got) || strcmp(got, want) != 0) {
        fprintf(stderr, "error: the server's answer is not a WebSocket (no Sec-WebSocket-Accept for our key)\n");
        client_conn_close(&s.k);
        return EXIT_UNREACHABLE;
    }
    int sigfd = signals_open();
    if (sigfd < 0) {
        fprintf(stderr, "error: cannot watch signals: %s\n", strerror(errno));
        client_conn_close(&s.k);
        return EXIT_REFUSED;
    }
    ws_decoder_init(&s.dec, 0, SH_FRAME_MAX, SH_FRAME_MAX);
    buf_init(&s.in, SH_IN_MAX);
    buf_init(&s.out, SH_OUT_MAX);
    s.chunk = xmalloc(65536 > SH_CHUNK + 1 ? 65536 : SH_CHUNK + 1);
    if (s.k.extra.len) buf_append(&s.in, s.k.extra.data, s.k.extra.len);
    s.sock_pending = 1;
    s.tty = tty;
    s.stdin_open = 1;
    if (tty && term_raw() < 0) {
        fprintf(stderr, "error: cannot put the terminal in raw mode: %s\n", strerror(errno));
        s.tty = 0;
    }
    sock_decode(&s); /* what came with the 101 */
    int code = session_loop(&s, sigfd);
    term_restore();
    client_conn_close(&s.k);
    ws_decoder_release(&s.dec);
    buf_release(&s.in);
    buf_release(&s.out);
    free(s.chunk);
    close(sigfd);
    return code;
}
