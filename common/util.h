/* util.h - small pieces every module uses: checked allocation, a bounded
 * growable buffer, logging, time, durable file writes, sha256 and tokens.
 *
 * defines: xmalloc, xcalloc, xrealloc, xstrdup, buf_*, log_*, now_ms,
 *          file_write_atomic, file_read_all, sha256_hex, random_token,
 *          parse_long, duration_parse_ms, sfmt, md5_raw, base64_encode,
 *          url_redact */
#ifndef TRAINYARD_UTIL_H
#define TRAINYARD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

/* ---------------------------------------------------------------- memory */
/* Allocation that never returns NULL: out of memory aborts with a message
 * (as Redis' zmalloc). Sizes are checked for overflow before multiplying. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* ---------------------------------------------------------------- buffer */
/* A growable byte buffer with a hard maximum (curl's dynbuf): appending past
 * max fails with -1 and leaves the buffer as it was. Always NUL-terminated. */
typedef struct buf {
    char *data;
    size_t len;
    size_t cap;
    size_t max;
} buf;

void buf_init(buf *b, size_t max);
int buf_append(buf *b, const void *p, size_t n);
int buf_appends(buf *b, const char *s);
/* A new string formatted as printf would (heap; aborts when out of memory). */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* s as one CSV field (RFC 4180): quoted when it holds a comma, a quote or
 * a line break, its quotes doubled; NULL is an empty field. 0, or -1 when
 * b is full. */
int buf_csv_field(buf *b, const char *s);
int buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_reset(buf *b);
void buf_release(buf *b);
/* Hands the data to the caller (who frees it) and resets the buffer. */
char *buf_detach(buf *b, size_t *len);

/* ---------------------------------------------------------------- logging */
typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;
void log_set_level(log_level lvl);
void log_set_prefix(const char *prefix); /* e.g. "server", "agent" */
/* text: "TIME COMPONENT LEVEL: message"; json: one object a line with
 * time, level, component and message. */
typedef enum { LOG_TEXT = 0, LOG_JSON } log_format;
void log_set_format(log_format f);
/* "debug", "info", "warn", "error" -> *out: 0, or -1. */
int log_level_parse(const char *s, log_level *out);
/* "text", "json" -> *out: 0, or -1. */
int log_format_parse(const char *s, log_format *out);
void log_msg(log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* ---------------------------------------------------------------- time */
int64_t now_ms(void);        /* wall clock, ms since the epoch */
int64_t mono_ms(void);       /* monotonic clock, ms */
double mono_s(void);         /* monotonic clock, seconds */
double thread_cpu_s(void);   /* CPU time of the calling thread, seconds */

/* ---------------------------------------------------------------- files */
/* Durable write: DIR/.name.tmpXXXX -> write -> fsync -> rename -> fsync(dir).
 * mode is the file's permission bits (e.g. 0600). Returns 0, or -1 with
 * errno set and no file left behind. */
int file_write_atomic(const char *path, const void *data, size_t len, int mode);

/* Reads a whole file up to max bytes into a NUL-terminated heap buffer.
 * Returns NULL (errno set; EFBIG past max) on failure. */
char *file_read_all(const char *path, size_t max, size_t *len);

/* mkdir -p with mode; 0 or -1 (errno). */
int mkdir_p(const char *path, int mode);

/* rm -r of dir that follows no symlink and crosses no mount point; what
 * cannot be removed is logged and left. Nothing for "". */
void rm_tree(const char *dir);

/* fsync a directory by path; 0 or -1. */
int fsync_dir(const char *dir);

/* ---------------------------------------------------------------- crypto */
/* Hex sha256 of data into out (65 bytes with the NUL). */
void sha256_hex(const void *data, size_t len, char out[65]);
/* HMAC-SHA256 of the concatenation of n parts (part[i], len[i] bytes)
 * under key (klen bytes) into out. 0, or -1 (OpenSSL failed). */
int hmac_sha256(const void *key, size_t klen, int n, const void *const *part, const size_t *len, unsigned char out[32]);
/* 1 when a and b (n bytes) are equal, in time that does not depend on where they differ. */
int mem_equal_ct(const void *a, const void *b, size_t n);
/* MD5 of data into out (S3's Content-MD5 and part ETags; not for security). */
void md5_raw(const void *data, size_t len, unsigned char out[16]);
/* Standard base64 (RFC 4648, '=' padding) of in into out, NUL-terminated:
 * the length written, or -1 when out (cap bytes) is too small. */
int base64_encode(const unsigned char *in, size_t n, char *out, size_t cap);

/* Incremental sha256 for streams (checkpoints). */
typedef struct sha256_stream { void *ctx; } sha256_stream;
int sha256_stream_init(sha256_stream *s);
int sha256_stream_update(sha256_stream *s, const void *data, size_t len);
int sha256_stream_final(sha256_stream *s, char out[65]); /* also frees */

/* A random token "ty_" + 43 url-safe chars (256 bits from getrandom) into
 * out (at least 48 bytes). Returns 0 or -1. */
int random_token(char *out, size_t outlen);

/* ---------------------------------------------------------------- strings */
/* Strict decimal parse of a whole string into a long in [lo, hi]: 0 or -1. */
int parse_long(const char *s, long lo, long hi, long *out);

/* A duration: a number (a fraction allowed) then nothing or one unit, s, m,
 * h or d ("90s", "30m", "1.5h", "7d"); a number alone counts bare_ms
 * milliseconds a unit. Into *ms, at most max_ms; a positive duration is
 * never 0 ms. 0, or -1 for anything else (a negative, another unit, a
 * space after the number). The server's --log-retention-days and the job
 * spec's idle_timeout read durations so. */
int duration_parse_ms(const char *s, double bare_ms, double max_ms, int64_t *ms);

/* snprintf that reports truncation: 0 when it fit, -1 otherwise. */
int sfmt(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A URL as it may be logged: scheme://host[:port]/path, without userinfo,
 * query or fragment (a presigned URL's signature and a token stay out of
 * logs). "" for NULL; 0, or -1 when cut short by cap (out still holds a
 * NUL-terminated prefix). */
int url_redact(const char *url, char *out, size_t cap);

#endif
