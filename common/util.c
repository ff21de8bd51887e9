/* util.c - checked allocation, bounded buffers, logging, time, durable file
 * writes, sha256 (OpenSSL) and random tokens (getrandom). See util.h. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <libgen.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

/* ---------------------------------------------------------------- memory */

static void oom(size_t n) {
    fprintf(stderr, "trainyard: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) oom(SIZE_MAX);
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s);
    char *p = xmalloc(n + 1);
    memcpy(p, s, n + 1);
    return p;
}

char *xstrndup(const char *s, size_t n) {
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---------------------------------------------------------------- buffer */

void buf_init(buf *b, size_t max) {
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

int buf_append(buf *b, const void *p, size_t n) {
    if (n > b->max || b->len > b->max - n) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) oom(SIZE_MAX);
            cap *= 2;
        }
        if (b->max < SIZE_MAX && cap > b->max + 1) cap = b->max + 1; /* max + 1 wraps at SIZE_MAX */
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int buf_appends(buf *b, const char *s) { return buf_append(b, s, strlen(s)); }

int buf_printf(buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof small) return buf_append(b, small, (size_t)n);
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

char *xasprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int r = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (r < 0) abort();
    return s;
}

int buf_csv_field(buf *b, const char *s) {
    if (!s) return 0;
    if (!strpbrk(s, ",\"\r\n")) return buf_appends(b, s);
    int rc = buf_appends(b, "\"");
    for (const char *p = s; *p && rc == 0; p++) rc = *p == '"' ? buf_appends(b, "\"\"") : buf_append(b, p, 1);
    return rc | buf_appends(b, "\"");
}

void buf_reset(buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void buf_release(buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *buf_detach(buf *b, size_t *len) {
    if (!b->data) buf_append(b, "", 0);
    char *p = b->data;
    if (len) *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

/* ---------------------------------------------------------------- logging */

static log_level g_level = LOG_INFO;
static char g_prefix[32] = "trainyard";

void log_set_level(log_level lvl) { g_level = lvl; }

void log_set_prefix(const char *prefix) { snprintf(g_prefix, sizeof g_prefix, "%s", prefix); }

static log_format g_format = LOG_TEXT;
static const char *const g_level_names[] = {"debug", "info", "warn", "error"};

void log_set_format(log_format f) { g_format = f; }

int log_level_parse(const char *s, log_level *out) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, g_level_names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    return -1;
}

int log_format_parse(const char *s, log_format *out) {
    if (strcmp(s, "text") == 0) *out = LOG_TEXT;
    else if (strcmp(s, "json") == 0) *out = LOG_JSON;
    else return -1;
    return 0;
}

/* s as the inside of a JSON string into out (bounded, NUL-terminated). */
static size_t json_escape_into(char *out, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)c;
        } else if (c < 0x20) {
            k += (size_t)snprintf(out + k, cap - k, "\\u%04x", c);
        } else {
            out[k++] = (char)c;
        }
    }
    out[k] = '\0';
    return k;
}

void log_msg(log_level lvl, const char *fmt, ...) {
    if (lvl < g_level) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[96], msg[2048], line[4608];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    size_t len;
    if (g_format == LOG_JSON) {
        char esc[4200];
        json_escape_into(esc, sizeof esc, msg);
        int n = snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"component\":\"%s\",\"message\":\"%s\"}",
                         when, g_level_names[lvl], g_prefix, esc);
        len = n < 0 ? 0 : (size_t)n;
    } else {
        int n = snprintf(line, sizeof line, "%s %s %s: %s", when, g_prefix, g_level_names[lvl], msg);
        len = n < 0 ? 0 : (size_t)n;
    }
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    /* One write(2) a line, no lock: a line is never split between threads
     * (pipes: atomic up to PIPE_BUF; files opened O_APPEND: atomic). */
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(STDERR_FILENO, line + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
}

/* ---------------------------------------------------------------- time */

int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- files */

int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

int file_write_atomic(const char *path, const void *data, size_t len, int mode) {
    char tmp[PATH_MAX], dirbuf[PATH_MAX];
    if (sfmt(dirbuf, sizeof dirbuf, "%s", path) < 0) { errno = ENAMETOOLONG; return -1; }
    char *dir = dirname(dirbuf);
    char namebuf[PATH_MAX];
    if (sfmt(namebuf, sizeof namebuf, "%s", path) < 0) { errno = ENAMETOOLONG; return -1; }
    if (sfmt(tmp, sizeof tmp, "%s/.%s.tmpXXXXXX", dir, basename(namebuf)) < 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            goto werr;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fchmod(fd, (mode_t)mode) < 0) goto werr;
    if (fsync(fd) < 0) goto werr;
    if (close(fd) < 0) { fd = -1; goto werr; }
    fd = -1;
    if (rename(tmp, path) < 0) goto werr;
    if (fsync_dir(dir) < 0) return -1;
    return 0;
werr:;
    int saved = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    errno = saved;
    return -1;
}

char *file_read_all(const char *path, size_t max, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    buf b;
    buf_init(&b, max);
    char chunk[65536];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0) {
            if (errno == EINTR) continue;
            int saved = errno;
            close(fd);
            buf_release(&b);
            errno = saved;
            return NULL;
        }
        if (r == 0) break;
        if (buf_append(&b, chunk, (size_t)r) < 0) {
            close(fd);
            buf_release(&b);
            errno = EFBIG;
            return NULL;
        }
    }
    close(fd);
    return buf_detach(&b, len);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT) log_warn("cannot remove %s: %s", path, strerror(errno));
    return 0;
}

void rm_tree(const char *dir) {
    if (dir[0]) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

int mkdir_p(const char *path, int mode) {
    char tmp[PATH_MAX];
    if (sfmt(tmp, sizeof tmp, "%s", path) < 0) { errno = ENAMETOOLONG; return -1; }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, (mode_t)mode) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, (mode_t)mode) < 0 && errno != EEXIST) return -1;
    return 0;
}

/* ---------------------------------------------------------------- crypto */

static void hex_encode(const unsigned char *d, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * n] = '\0';
}

void sha256_hex(const void *data, size_t len, char out[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) {
        fprintf(stderr, "trainyard: sha256 failed\n");
        abort();
    }
    hex_encode(md, 32, out);
}

/* RFC 2104 over the SHA-256 digest the rest of this file uses (EVP_sha256,
 * no fetched EVP_MAC: OpenSSL 3's fetch leaves per-thread state that the
 * fuzzers' leak check counts). */
static int digest_parts(const unsigned char pad[64], int n, const void *const *part, const size_t *len,
                        unsigned char out[32]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int got = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, pad, 64);
    for (int i = 0; ok && i < n; i++) ok = EVP_DigestUpdate(ctx, part[i], len[i]);
    ok = ok && EVP_DigestFinal_ex(ctx, out, &got) && got == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -1;
}

int hmac_sha256(const void *key, size_t klen, int n, const void *const *part, const size_t *len, unsigned char out[32]) {
    unsigned char k[64] = {0}, ipad[64], opad[64], inner[32];
    if (klen > sizeof k) { /* a key longer than the block is its digest */
        unsigned int got = 0;
        if (!EVP_Digest(key, klen, k, &got, EVP_sha256(), NULL) || got != 32) return -1;
    } else {
        memcpy(k, key, klen);
    }
    for (int i = 0; i < 64; i++) {
        ipad[i] = (unsigned char)(k[i] ^ 0x36);
        opad[i] = (unsigned char)(k[i] ^ 0x5c);
    }
    const void *ip[1] = {inner};
    size_t il[1] = {sizeof inner};
    int rc = digest_parts(ipad, n, part, len, inner) == 0 && digest_parts(opad, 1, ip, il, out) == 0 ? 0 : -1;
    explicit_bzero(k, sizeof k);
    explicit_bzero(ipad, sizeof ipad);
    explicit_bzero(opad, sizeof opad);
    explicit_bzero(inner, sizeof inner);
    return rc;
}

int mem_equal_ct(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void md5_raw(const void *data, size_t len, unsigned char out[16]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(data, len, md, &mdlen, EVP_md5(), NULL) || mdlen != 16) {
        fprintf(stderr, "trainyard: md5 failed\n");
        abort();
    }
    memcpy(out, md, 16);
}

int base64_encode(const unsigned char *in, size_t n, char *out, size_t cap) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (n > (SIZE_MAX - 1) / 4 * 3 - 3) return -1;
    size_t need = (n + 2) / 3 * 4 + 1;
    if (!out || cap < need) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < n) v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = tab[(v >> 18) & 63];
        out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = '\0';
    return (int)o;
}

int sha256_stream_init(sha256_stream *s) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) return -1;
    if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(ctx);
        return -1;
    }
    s->ctx = ctx;
    return 0;
}

int sha256_stream_update(sha256_stream *s, const void *data, size_t len) {
    return EVP_DigestUpdate((EVP_MD_CTX *)s->ctx, data, len) ? 0 : -1;
}

int sha256_stream_final(sha256_stream *s, char out[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_DigestFinal_ex((EVP_MD_CTX *)s->ctx, md, &mdlen);
    EVP_MD_CTX_free((EVP_MD_CTX *)s->ctx);
    s->ctx = NULL;
    if (!ok || mdlen != 32) return -1;
    hex_encode(md, 32, out);
    return 0;
}

int random_token(char *out, size_t outlen) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char rnd[43];
    if (outlen < 3 + sizeof rnd + 1) return -1;
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t r = getrandom(rnd + got, sizeof rnd - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    memcpy(out, "ty_", 3);
    for (size_t i = 0; i < sizeof rnd; i++) out[3 + i] = al[rnd[i] & 63];
    out[3 + sizeof rnd] = '\0';
    return 0;
}

/* ---------------------------------------------------------------- strings */

int parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int duration_parse_ms(const char *s, double bare_ms, double max_ms, int64_t *ms) {
    if (!s) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return -1;
    double unit = bare_ms;
    if (*end && !end[1]) {
        switch (*end) {
        case 's': unit = 1e3; break;
        case 'm': unit = 60e3; break;
        case 'h': unit = 3600e3; break;
        case 'd': unit = 86400e3; break;
        default: return -1;
        }
    } else if (*end) {
        return -1;
    }
    double total = v * unit;
    if (!(total <= max_ms)) return -1;
    *ms = (int64_t)total;
    if (v > 0 && *ms == 0) *ms = 1; /* a positive setting never means "none" */
    return 0;
}

int sfmt(char *dst, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

int url_redact(const char *url, char *out, size_t cap) {
    if (!out || cap == 0) return -1;
    out[0] = '\0';
    if (!url) return 0;
    size_t o = 0;
    int cut = 0;
#define URL_PUT(ch) do { if (o + 1 < cap) out[o++] = (ch); else cut = 1; } while (0)
    const char *p = url;
    const char *sep = strstr(url, "://");
    /* the scheme: letters, digits, + - . before "://" and nothing else */
    if (sep && sep > url && strcspn(url, "/?#") == (size_t)(sep - url) + 1) {
        for (; p < sep + 3; p++) URL_PUT(*p);
        /* the authority, less any userinfo */
        size_t alen = strcspn(p, "/?#");
        const char *at = NULL;
        for (const char *q = p; q < p + alen; q++)
            if (*q == '@') at = q;
        for (const char *q = at ? at + 1 : p; q < p + alen; q++) URL_PUT(*q);
        p += alen;
    }
    for (; *p && *p != '?' && *p != '#'; p++) URL_PUT(*p);
#undef URL_PUT
    out[o] = '\0';
    return cut ? -1 : 0;
}
