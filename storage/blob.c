/* blob.c - the blob store (blob.h): its spec ("DATA", "file:///abs",
 * "s3://BUCKET[/PREFIX]?endpoint=URL&region=R") and credentials file read
 * at open, the rules of keys, and the two local backends (the data
 * directory and a shared folder: ROOT/<key>, written to a temporary name,
 * fsynced, renamed, the folder fsynced). The s3 backend is blob_s3.c. */
#include "blob_int.h"
#include "../common/util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define CREDS_MAX (64 * 1024)
#define TOKEN_MAX 4096
#define NO_CREDS_IN_URL "credentials go in --blob-credentials, never in a URL"

int blob_fail(blob_err *err, int rc, int http, const char *code, const char *fmt, ...) {
    if (!err) return rc;
    err->http = http;
    snprintf(err->code, sizeof err->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return rc;
}

static void err_clear(blob_err *err) {
    if (!err) return;
    err->http = 0;
    err->code[0] = '\0';
    err->msg[0] = '\0';
}

int blob_errno(blob_err *err, int e, const char *what, const char *path) {
    int rc = BLOB_ERROR;
    if (e == ENOENT || e == ENOTDIR) rc = BLOB_NOT_FOUND;
    else if (e == EACCES || e == EPERM || e == EROFS) rc = BLOB_DENIED;
    else if (e == ENOSPC || e == EDQUOT || e == EFBIG) rc = BLOB_FULL;
    const char *name = strerrorname_np(e);
    return blob_fail(err, rc, 0, name ? name : "errno", "%s %s: %s", what, path ? path : "", strerror(e));
}

const char *blob_strerror(int rc) {
    switch (rc) {
    case BLOB_OK: return "ok";
    case BLOB_NOT_FOUND: return "not found";
    case BLOB_DENIED: return "denied";
    case BLOB_UNAVAILABLE: return "unavailable";
    case BLOB_BAD: return "bad request";
    case BLOB_FULL: return "full";
    case BLOB_ERROR: return "error";
    default: return "unknown";
    }
}

/* ---------------------------------------------------------------- keys */

static int key_char(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-' || c == '/';
}

/* segments: non-empty (trailing '/' allowed when allow_trailing), none starting with '.' */
static int key_check(const char *key, int allow_empty, int allow_trailing) {
    if (!key) return 0;
    size_t n = strlen(key);
    if (n == 0) return allow_empty;
    if (n > 255 || key[0] == '/' || strstr(key, "..")) return 0;
    for (size_t i = 0; i < n; i++) {
        if (!key_char((unsigned char)key[i])) return 0;
        if (i == 0 || key[i - 1] == '/') {
            if (key[i] == '/' || key[i] == '.') return 0;
        }
    }
    if (key[n - 1] == '/' && !allow_trailing) return 0;
    return 1;
}

int blob_key_valid(const char *key) { return key_check(key, 0, 0); }

static int bad_key(blob_err *err, const char *key) {
    (void)key;
    return blob_fail(err, BLOB_BAD, 0, "InvalidKey",
                     "bad key: [A-Za-z0-9._/-], 1..255 bytes, no empty segment, no '..', no segment starting with '.'");
}

/* ---------------------------------------------------------------- spec */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* %XX decoding of n bytes of in into out; -1 on a bad escape, NUL or overflow */
static int pct_decode(const char *in, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)in[i];
        if (c == '%') {
            if (i + 2 >= n) return -1;
            int h = hexval((unsigned char)in[i + 1]), l = hexval((unsigned char)in[i + 2]);
            if (h < 0 || l < 0) return -1;
            c = h * 16 + l;
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (c == 0 || o + 1 >= cap) return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* A name that could be a credential ("s3://b?aws_secret_access_key=..." or a bare key). */
static int secret_looking(const char *name, size_t n) {
    static const char *const words[] = {"key", "secret", "token", "password", "passwd", "credential",
                                        "signature", "x-amz-", "auth", NULL};
    char low[64];
    if (n >= sizeof low) return 1;
    for (size_t i = 0; i < n; i++) low[i] = (char)tolower((unsigned char)name[i]);
    low[n] = '\0';
    for (int i = 0; words[i]; i++)
        if (strstr(low, words[i])) return 1;
    return 0;
}

/* "http://host[:port][/]" -> s->endpoint (lower case, default port left out), s->host, s->https */
static int parse_endpoint(blob_store *s, const char *v, blob_err *err) {
    const char *rest;
    if (strncasecmp(v, "http://", 7) == 0) {
        s->https = 0;
        rest = v + 7;
    } else if (strncasecmp(v, "https://", 8) == 0) {
        s->https = 1;
        rest = v + 8;
    } else {
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: must be http://HOST[:PORT] or https://HOST[:PORT]");
    }
    size_t alen = strcspn(rest, "/?#");
    if (memchr(rest, '@', alen)) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: " NO_CREDS_IN_URL);
    const char *tail = rest + alen;
    if (*tail && strcmp(tail, "/") != 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: no path or query after HOST[:PORT]");
    char auth[256];
    if (alen == 0 || alen >= sizeof auth) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad host");
    memcpy(auth, rest, alen);
    auth[alen] = '\0';
    char hostpart[256];
    long port = s->https ? 443 : 80;
    char *colon = NULL;
    if (auth[0] == '[') {
        char *close = strchr(auth, ']');
        if (!close) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad IPv6 host");
        if (close[1] == ':') colon = close + 1;
        else if (close[1]) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad host");
        for (char *p = auth + 1; p < close; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.')
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad IPv6 host");
    } else {
        colon = strchr(auth, ':');
        for (char *p = auth; *p && p != colon; p++)
            if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-')
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad host");
    }
    if (colon) {
        if (parse_long(colon + 1, 1, 65535, &port) < 0)
            return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad port (1..65535)");
        *colon = '\0';
    }
    if (!auth[0] || strcmp(auth, "[]") == 0) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad host");
    for (char *p = auth; *p; p++) *p = (char)tolower((unsigned char)*p);
    int dflt = port == (s->https ? 443 : 80);
    if (dflt) snprintf(hostpart, sizeof hostpart, "%s", auth);
    else if (sfmt(hostpart, sizeof hostpart, "%s:%ld", auth, port) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "endpoint: bad host");
    snprintf(s->host, sizeof s->host, "%s", hostpart);
    snprintf(s->endpoint, sizeof s->endpoint, "%s://%s", s->https ? "https" : "http", hostpart);
    return BLOB_OK;
}

static int bucket_valid(const char *b) {
    size_t n = strlen(b);
    if (n < 3 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_')) return 0;
    }
    return isalnum((unsigned char)b[0]) && isalnum((unsigned char)b[n - 1]);
}

static int parse_s3(blob_store *s, const char *spec, blob_err *err) {
    const char *p = spec + 5; /* "s3://" */
    size_t alen = strcspn(p, "/?#");
    if (memchr(p, '@', alen) || memchr(p, ':', alen))
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", NO_CREDS_IN_URL);
    if (strchr(spec, '#')) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: no '#' fragment");
    if (alen >= sizeof s->bucket) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: bad bucket name (3..63 of [a-z0-9.-_])");
    memcpy(s->bucket, p, alen);
    s->bucket[alen] = '\0';
    if (!bucket_valid(s->bucket))
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: bad bucket name (3..63 of [a-z0-9.-_])");
    p += alen;
    s->prefix[0] = '\0';
    if (*p == '/') {
        p++;
        size_t plen = strcspn(p, "?");
        char pre[256];
        if (plen >= sizeof pre - 1) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: prefix too long");
        memcpy(pre, p, plen);
        pre[plen] = '\0';
        while (plen && pre[plen - 1] == '/') pre[--plen] = '\0';
        if (plen) {
            if (!key_check(pre, 0, 0) || plen > 128)
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec",
                                 "s3 store: bad prefix ([A-Za-z0-9._/-], at most 128 bytes, no '..', no segment starting with '.')");
            if (sfmt(s->prefix, sizeof s->prefix, "%s/", pre) < 0) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: prefix too long");
        }
        p += strcspn(p, "?");
    }
    char endpoint[512] = "", region[64] = "";
    if (*p == '?') {
        p++;
        while (*p) {
            size_t len = strcspn(p, "&");
            const char *eq = memchr(p, '=', len);
            size_t nlen = eq ? (size_t)(eq - p) : len;
            char name[33];
            int printable = nlen > 0 && nlen < sizeof name;
            for (size_t i = 0; printable && i < nlen; i++)
                if (!isalnum((unsigned char)p[i]) && p[i] != '_' && p[i] != '-') printable = 0;
            if (secret_looking(p, nlen) || !eq) {
                if (!eq && !secret_looking(p, nlen) && printable) {
                    memcpy(name, p, nlen);
                    name[nlen] = '\0';
                    return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: parameter %s has no value", name);
                }
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", NO_CREDS_IN_URL);
            }
            char *dst = NULL;
            size_t cap = 0;
            if (nlen == 8 && memcmp(p, "endpoint", 8) == 0) dst = endpoint, cap = sizeof endpoint;
            else if (nlen == 6 && memcmp(p, "region", 6) == 0) dst = region, cap = sizeof region;
            if (!dst) {
                if (!printable) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: unknown parameter (endpoint, region)");
                memcpy(name, p, nlen);
                name[nlen] = '\0';
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: unknown parameter %s (endpoint, region)", name);
            }
            if (*dst) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: %s given twice", dst == endpoint ? "endpoint" : "region");
            if (pct_decode(eq + 1, len - nlen - 1, dst, cap) < 0 || !*dst)
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: bad %s value", dst == endpoint ? "endpoint" : "region");
            p += len;
            if (*p == '&') p++;
        }
    }
    if (region[0]) {
        if (strlen(region) >= sizeof s->region)
            return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: bad region ([a-z0-9-], at most 31)");
        for (char *q = region; *q; q++)
            if (!islower((unsigned char)*q) && !isdigit((unsigned char)*q) && *q != '-')
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: bad region ([a-z0-9-], at most 31)");
        memcpy(s->region, region, strlen(region) + 1);
    } else {
        snprintf(s->region, sizeof s->region, "us-east-1");
    }
    if (endpoint[0]) {
        int rc = parse_endpoint(s, endpoint, err);
        if (rc) return rc;
        s->path_style = 1;
    } else {
        if (strchr(s->bucket, '.') || strchr(s->bucket, '_'))
            return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: a bucket with '.' or '_' needs endpoint= (path-style)");
        s->https = 1;
        s->path_style = 0;
        snprintf(s->endpoint, sizeof s->endpoint, "https://s3.%s.amazonaws.com", s->region);
        snprintf(s->host, sizeof s->host, "%s.s3.%s.amazonaws.com", s->bucket, s->region);
    }
    if (sfmt(s->base, sizeof s->base, "%s://%s", s->https ? "https" : "http", s->host) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: host too long");
    char pre[256];
    snprintf(pre, sizeof pre, "%s", s->prefix);
    size_t pl = strlen(pre);
    if (pl) pre[pl - 1] = '\0';
    if (sfmt(s->url, sizeof s->url, "s3://%s%s%s?endpoint=%s&region=%s", s->bucket, pl ? "/" : "", pre, s->endpoint,
             s->region) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "s3 store: spec too long");
    return BLOB_OK;
}

static int parse_file(blob_store *s, const char *spec, blob_err *err) {
    const char *p = spec + 7; /* "file://" */
    if (*p != '/')
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: file:///ABSOLUTE/DIR (no host)");
    char out[PATH_MAX];
    size_t o = 0;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        size_t n = strcspn(p, "/");
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: no '.' or '..' in the path");
        for (size_t i = 0; i < n; i++)
            if (p[i] == '?' || p[i] == '#' || p[i] == '%' || (unsigned char)p[i] < 0x20)
                return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: no '?', '#', '%%' or control characters in the path");
        if (o + 1 + n + 1 >= sizeof out - 300) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: path too long");
        out[o++] = '/';
        memcpy(out + o, p, n);
        o += n;
        p += n;
    }
    out[o] = '\0';
    if (o == 0) return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: not the root folder");
    snprintf(s->root, sizeof s->root, "%s", out);
    if (sfmt(s->url, sizeof s->url, "file://%s", out) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "file store: path too long");
    return BLOB_OK;
}

/* ---------------------------------------------------------------- credentials */

static char *trim(char *a, char *b) { /* [a, b) trimmed in place, NUL-terminated */
    while (a < b && (*a == ' ' || *a == '\t')) a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r')) b--;
    *b = '\0';
    return a;
}

static int value_ok(const char *v) {
    for (; *v; v++)
        if ((unsigned char)*v < 0x21 || (unsigned char)*v > 0x7e) return 0;
    return 1;
}

static int read_credentials(blob_store *s, const char *path, blob_err *err) {
    snprintf(s->cred_path, sizeof s->cred_path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return blob_fail(err, BLOB_BAD, 0, strerrorname_np(e) ? strerrorname_np(e) : "errno",
                         "--blob-credentials %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s: not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return blob_fail(err, BLOB_BAD, 0, "InvalidCredentials",
                         "--blob-credentials %s: mode %04o; it must be readable by its owner only (chmod 600)", path,
                         (unsigned)(st.st_mode & 07777));
    }
    if (st.st_size > CREDS_MAX) {
        close(fd);
        return blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s: larger than 64 KiB", path);
    }
    char *text = xmalloc(CREDS_MAX + 1);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, text + len, CREDS_MAX - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            explicit_bzero(text, CREDS_MAX + 1);
            free(text);
            return blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s: %s", path, strerror(e));
        }
        if (r == 0 || len + (size_t)r >= CREDS_MAX) {
            len += (size_t)r;
            break;
        }
        len += (size_t)r;
    }
    close(fd);
    text[len] = '\0';
    int rc = BLOB_OK, in_default = 0, line = 0, have_ak = 0, have_sk = 0;
    char *p = text;
    if (memchr(text, '\0', len)) {
        rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s: not a text file", path);
        goto out;
    }
    while (*p && rc == BLOB_OK) {
        line++;
        char *nl = strchr(p, '\n');
        char *end = nl ? nl : p + strlen(p);
        char *l = trim(p, end);
        p = nl ? nl + 1 : end;
        if (!*l || *l == '#' || *l == ';') continue;
        if (*l == '[') {
            char *close = strchr(l, ']');
            if (!close || close[1]) {
                rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s line %d: bad [section]", path, line);
                break;
            }
            char *name = trim(l + 1, close);
            in_default = strcmp(name, "default") == 0 || strcmp(name, "profile default") == 0;
            continue;
        }
        char *eq = strchr(l, '=');
        if (!eq) {
            rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s line %d: not 'key = value'", path, line);
            break;
        }
        if (!in_default) continue;
        char *k = trim(l, eq);
        char *v = trim(eq + 1, eq + 1 + strlen(eq + 1));
        if (strcmp(k, "aws_access_key_id") == 0) {
            if (!*v || strlen(v) >= sizeof s->akid || !value_ok(v)) {
                rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s line %d: bad aws_access_key_id", path, line);
                break;
            }
            snprintf(s->akid, sizeof s->akid, "%s", v);
            have_ak = 1;
        } else if (strcmp(k, "aws_secret_access_key") == 0) {
            if (!*v || strlen(v) >= sizeof s->secret || !value_ok(v)) {
                rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s line %d: bad aws_secret_access_key", path, line);
                break;
            }
            snprintf(s->secret, sizeof s->secret, "%s", v);
            have_sk = 1;
        } else if (strcmp(k, "aws_session_token") == 0) {
            if (!*v || strlen(v) > TOKEN_MAX || !value_ok(v)) {
                rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s line %d: bad aws_session_token", path, line);
                break;
            }
            if (s->token) {
                explicit_bzero(s->token, strlen(s->token));
                free(s->token);
            }
            s->token = xstrdup(v);
        }
    }
    if (rc == BLOB_OK && (!have_ak || !have_sk))
        rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "--blob-credentials %s: [default] has no %s", path,
                       have_ak ? "aws_secret_access_key" : "aws_access_key_id");
out:
    explicit_bzero(text, CREDS_MAX + 1);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- open/close */

int blob_store_open(const char *spec, const char *credentials, const char *data_dir, blob_store **out,
                    blob_err *err) {
    err_clear(err);
    if (!out) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no place for the store");
    *out = NULL;
    if (!spec || !*spec) spec = "DATA";
    blob_store *s = xcalloc(1, sizeof *s);
    s->timeout_ms = 30000;
    s->list_page = 1000;
    s->put_single_max = 5LL << 30;
    s->put_part_bytes = 1LL << 30;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return blob_fail(err, BLOB_ERROR, 0, "EAGAIN", "cannot make a mutex");
    }
    int rc = BLOB_OK;
    int have_creds = credentials && *credentials;
    if (strcmp(spec, "DATA") == 0) {
        s->kind = BLOB_KIND_DATA;
        /* the server's data directory as it was given ("./.trainyard" by default) */
        if (!data_dir || !*data_dir || strlen(data_dir) > PATH_MAX - 300 || sfmt(s->root, sizeof s->root, "%s", data_dir) < 0)
            rc = blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "DATA store: no data directory");
        else {
            size_t n = strlen(s->root);
            while (n > 1 && s->root[n - 1] == '/') s->root[--n] = '\0';
        }
    } else if (strncmp(spec, "file://", 7) == 0) {
        s->kind = BLOB_KIND_FILE;
        rc = parse_file(s, spec, err);
    } else if (strncmp(spec, "s3://", 5) == 0) {
        s->kind = BLOB_KIND_S3;
        rc = parse_s3(s, spec, err);
        if (rc == BLOB_OK && !have_creds)
            rc = blob_fail(err, BLOB_BAD, 0, "InvalidCredentials", "an s3 store needs --blob-credentials FILE");
        if (rc == BLOB_OK) rc = read_credentials(s, credentials, err);
    } else {
        rc = blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "blob store: DATA, file:///ABS/DIR or s3://BUCKET[/PREFIX]?endpoint=URL&region=R");
    }
    if (rc == BLOB_OK && have_creds && s->kind != BLOB_KIND_S3)
        rc = blob_fail(err, BLOB_BAD, 0, "InvalidSpec", "--blob-credentials is for s3 stores only");
    if (rc != BLOB_OK) {
        blob_store_close(s);
        return rc;
    }
    *out = s;
    return BLOB_OK;
}

void blob_store_close(blob_store *s) {
    if (!s) return;
    if (s->kind == BLOB_KIND_S3) s3_close(s);
    explicit_bzero(s->secret, sizeof s->secret);
    explicit_bzero(s->akid, sizeof s->akid);
    if (s->token) {
        explicit_bzero(s->token, strlen(s->token));
        free(s->token);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *blob_store_url(const blob_store *s) { return s ? s->url : ""; }
int blob_store_is_s3(const blob_store *s) { return s && s->kind == BLOB_KIND_S3; }
const char *blob_store_root(const blob_store *s) { return s && s->kind != BLOB_KIND_S3 ? s->root : NULL; }

/* ---------------------------------------------------------------- local files */

int blob_tmp_open(const char *dest, char tmp[PATH_MAX], blob_err *err) {
    const char *slash = strrchr(dest, '/');
    int n = slash ? (int)(slash - dest) : 0;
    const char *base = slash ? slash + 1 : dest;
    if (sfmt(tmp, PATH_MAX, "%.*s%s.%s.tmpXXXXXX", n, dest, slash ? "/" : "", base) < 0)
        return blob_errno(err, ENAMETOOLONG, "create", dest);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) { /* a folder missing here is the caller's, not a missing key */
        int rc = blob_errno(err, errno, "create", tmp);
        return rc == BLOB_NOT_FOUND ? BLOB_ERROR : rc;
    }
    if (fchmod(fd, 0600) < 0) {
        int e = errno;
        blob_tmp_abort(fd, tmp);
        return blob_errno(err, e, "chmod", tmp);
    }
    return fd;
}

void blob_tmp_abort(int fd, const char *tmp) {
    if (fd >= 0) close(fd);
    unlink(tmp);
}

int blob_tmp_commit(int fd, const char *tmp, const char *dest, blob_err *err) {
    if (fsync(fd) < 0) {
        int e = errno;
        blob_tmp_abort(fd, tmp);
        return blob_errno(err, e, "fsync", tmp);
    }
    if (close(fd) < 0) {
        int e = errno;
        unlink(tmp);
        return blob_errno(err, e, "close", tmp);
    }
    if (rename(tmp, dest) < 0) {
        int e = errno;
        unlink(tmp);
        return blob_errno(err, e, "rename to", dest);
    }
    char dir[PATH_MAX];
    const char *slash = strrchr(dest, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == dest ? 1 : (int)(slash - dest)) : 1, slash ? dest : ".");
    if (fsync_dir(dir) < 0) return blob_errno(err, errno, "fsync", dir);
    return BLOB_OK;
}

static int write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int local_path(const blob_store *s, const char *key, char out[PATH_MAX], blob_err *err) {
    if (sfmt(out, PATH_MAX, "%s/%s", s->root, key) < 0) return blob_errno(err, ENAMETOOLONG, "open", key);
    return BLOB_OK;
}

/* the folders above path, 0700 */
static int local_mkparent(const char *path, blob_err *err) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return BLOB_OK;
    *slash = '\0';
    if (mkdir_p(dir, 0700) < 0) return blob_errno(err, errno, "mkdir", dir);
    return BLOB_OK;
}

/* streams src into a temporary beside dest, then commits */
static int copy_to(int src, const char *dest, blob_err *err) {
    char tmp[PATH_MAX];
    int fd = blob_tmp_open(dest, tmp, err);
    if (fd < 0) return fd;
    char *chunk = xmalloc(1 << 20);
    int rc = BLOB_OK;
    for (;;) {
        ssize_t r = read(src, chunk, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = blob_errno(err, errno, "read", "source");
            if (rc == BLOB_NOT_FOUND) rc = BLOB_ERROR;
            break;
        }
        if (r == 0) break;
        if (write_all(fd, chunk, (size_t)r) < 0) {
            rc = blob_errno(err, errno, "write", tmp);
            if (rc == BLOB_NOT_FOUND) rc = BLOB_ERROR;
            break;
        }
    }
    free(chunk);
    if (rc != BLOB_OK) {
        blob_tmp_abort(fd, tmp);
        return rc;
    }
    return blob_tmp_commit(fd, tmp, dest, err);
}

static int local_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err) {
    char path[PATH_MAX], tmp[PATH_MAX];
    int rc = local_path(s, key, path, err);
    if (rc == BLOB_OK) rc = local_mkparent(path, err);
    if (rc != BLOB_OK) return rc;
    int fd = blob_tmp_open(path, tmp, err);
    if (fd < 0) return fd;
    if (write_all(fd, data, len) < 0) {
        int e = errno;
        blob_tmp_abort(fd, tmp);
        return blob_errno(err, e, "write", tmp);
    }
    return blob_tmp_commit(fd, tmp, path, err);
}

static int open_source(const char *path, int *fd, blob_err *err) {
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (*fd < 0) {
        int rc = blob_errno(err, errno, "open", path);
        return rc == BLOB_NOT_FOUND ? BLOB_BAD : rc; /* the caller's file, not a key */
    }
    struct stat st;
    if (fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return blob_fail(err, BLOB_BAD, 0, "EINVAL", "open %s: not a regular file", path);
    }
    return BLOB_OK;
}

static int local_put_file(blob_store *s, const char *key, const char *src, blob_err *err) {
    char path[PATH_MAX];
    int fd = -1;
    int rc = open_source(src, &fd, err);
    if (rc == BLOB_OK) rc = local_path(s, key, path, err);
    if (rc == BLOB_OK) rc = local_mkparent(path, err);
    if (rc == BLOB_OK) rc = copy_to(fd, path, err);
    if (fd >= 0) close(fd);
    return rc;
}

static int local_open_key(blob_store *s, const char *key, int *fd, struct stat *st, blob_err *err) {
    char path[PATH_MAX];
    int rc = local_path(s, key, path, err);
    if (rc != BLOB_OK) return rc;
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
    if (*fd < 0) {
        if (errno == ELOOP || errno == EISDIR) return blob_fail(err, BLOB_NOT_FOUND, 0, "ENOENT", "open %s: not a blob", path);
        return blob_errno(err, errno, "open", path);
    }
    if (fstat(*fd, st) < 0 || !S_ISREG(st->st_mode)) {
        close(*fd);
        *fd = -1;
        return blob_fail(err, BLOB_NOT_FOUND, 0, "ENOENT", "open %s: not a blob", path);
    }
    return BLOB_OK;
}

static int local_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err) {
    int fd = -1;
    struct stat st;
    int rc = local_open_key(s, key, &fd, &st, err);
    if (rc != BLOB_OK) return rc;
    close(fd);
    if (size) *size = (int64_t)st.st_size;
    if (etag) {
        unsigned long long ns = (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL + (unsigned long long)st.st_mtim.tv_nsec;
        snprintf(etag, 80, "\"%llx-%llx\"", (unsigned long long)st.st_size, ns);
    }
    return BLOB_OK;
}

static int local_get_file(blob_store *s, const char *key, const char *dest, blob_err *err) {
    int fd = -1;
    struct stat st;
    int rc = local_open_key(s, key, &fd, &st, err);
    if (rc != BLOB_OK) return rc;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    rc = copy_to(fd, dest, err);
    close(fd);
    return rc;
}

static int local_delete(blob_store *s, const char *key, blob_err *err) {
    char path[PATH_MAX];
    int rc = local_path(s, key, path, err);
    if (rc != BLOB_OK) return rc;
    if (unlink(path) < 0) {
        if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) return BLOB_OK;
        return blob_errno(err, errno, "unlink", path);
    }
    char *slash = strrchr(path, '/');
    *slash = '\0';
    if (fsync_dir(path) < 0) return blob_errno(err, errno, "fsync", path);
    return BLOB_OK;
}

typedef struct walk {
    const char *root, *prefix;
    blob_list_cb cb;
    void *ctx;
    int stopped;
    blob_err *err;
} walk;

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* rel: the key of the folder ("" or ending in '/') */
static int walk_dir(walk *w, const char *rel, int depth) {
    char dir[PATH_MAX];
    if (sfmt(dir, sizeof dir, "%s/%s", w->root, rel) < 0) return blob_errno(w->err, ENAMETOOLONG, "list", rel);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT || errno == ENOTDIR) return BLOB_OK;
        return blob_errno(w->err, errno, "list", dir);
    }
    size_t n = 0, cap = 16;
    char **names = xmalloc(cap * sizeof *names);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ".", "..", temporaries */
        if (n == cap) {
            cap *= 2;
            names = xrealloc(names, cap * sizeof *names);
        }
        names[n++] = xstrdup(e->d_name);
    }
    qsort(names, n, sizeof *names, name_cmp);
    int rc = BLOB_OK;
    size_t plen = strlen(w->prefix);
    for (size_t i = 0; i < n && rc == BLOB_OK && !w->stopped; i++) {
        char key[PATH_MAX];
        if (sfmt(key, sizeof key, "%s%s", rel, names[i]) < 0 || strlen(key) > 255 || !blob_key_valid(key)) continue;
        struct stat st;
        if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) continue; /* gone meanwhile */
        size_t klen = strlen(key);
        if (S_ISDIR(st.st_mode)) {
            if (depth >= 64) continue;
            char sub[PATH_MAX];
            if (sfmt(sub, sizeof sub, "%s/", key) < 0) continue;
            size_t slen = klen + 1;
            /* only folders on the way to the prefix or under it */
            if (strncmp(sub, w->prefix, slen < plen ? slen : plen) != 0) continue;
            rc = walk_dir(w, sub, depth + 1);
        } else if (S_ISREG(st.st_mode)) {
            if (klen < plen || strncmp(key, w->prefix, plen) != 0) continue;
            if (w->cb(w->ctx, key, (int64_t)st.st_size) != 0) w->stopped = 1;
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

static int local_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err) {
    walk w = {s->root, prefix, cb, ctx, 0, err};
    char rel[256];
    const char *slash = strrchr(prefix, '/');
    snprintf(rel, sizeof rel, "%.*s", slash ? (int)(slash - prefix + 1) : 0, prefix);
    return walk_dir(&w, rel, 0);
}

static int local_check(blob_store *s, blob_err *err) {
    if (mkdir_p(s->root, 0700) < 0) {
        int rc = blob_errno(err, errno, "mkdir", s->root);
        return rc == BLOB_NOT_FOUND ? BLOB_ERROR : rc;
    }
    unsigned char probe[16];
    char tok[64], key[96];
    if (random_token(tok, sizeof tok) < 0) return blob_fail(err, BLOB_ERROR, 0, "EIO", "no random bytes");
    memcpy(probe, tok + 3, sizeof probe);
    snprintf(key, sizeof key, "trainyard-probe-%.16s", tok + 3);
    for (char *q = key; *q; q++)
        if (!key_char((unsigned char)*q)) *q = 'x';
    int rc = local_put(s, key, probe, sizeof probe, err);
    if (rc != BLOB_OK) return rc;
    int fd = -1;
    struct stat st;
    rc = local_open_key(s, key, &fd, &st, err);
    if (rc == BLOB_OK) {
        unsigned char back[sizeof probe + 1];
        ssize_t r = pread(fd, back, sizeof back, 0);
        close(fd);
        if (r != (ssize_t)sizeof probe || memcmp(back, probe, sizeof probe) != 0)
            rc = blob_fail(err, BLOB_ERROR, 0, "EIO", "probe %s/%s: read back other bytes", s->root, key);
    } else if (rc == BLOB_NOT_FOUND) {
        rc = BLOB_ERROR;
    }
    int drc = local_delete(s, key, rc == BLOB_OK ? err : NULL);
    return rc != BLOB_OK ? rc : drc;
}

/* ---------------------------------------------------------------- dispatch */

#define LOCAL_ONLY_S3(s, err)                                                                                  \
    do {                                                                                                       \
        if (!(s)) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store");                         \
        if ((s)->kind != BLOB_KIND_S3)                                                                         \
            return blob_fail(err, BLOB_BAD, 0, "NotImplemented", "multipart uploads and presigned URLs are for s3 stores"); \
    } while (0)

int blob_store_check(blob_store *s, blob_err *err) {
    err_clear(err);
    if (!s) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store");
    return s->kind == BLOB_KIND_S3 ? s3_check(s, err) : local_check(s, err);
}

int blob_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err) {
    err_clear(err);
    if (!s || (!data && len)) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store or no data");
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s->kind == BLOB_KIND_S3 ? s3_put(s, key, data, len, err) : local_put(s, key, data ? data : "", len, err);
}

int blob_put_file(blob_store *s, const char *key, const char *path, blob_err *err) {
    err_clear(err);
    if (!s || !path) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store or no file");
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s->kind == BLOB_KIND_S3 ? s3_put_file(s, key, path, err) : local_put_file(s, key, path, err);
}

int blob_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err) {
    err_clear(err);
    if (!s) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store");
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s->kind == BLOB_KIND_S3 ? s3_head(s, key, size, etag, err) : local_head(s, key, size, etag, err);
}

int blob_get_file(blob_store *s, const char *key, const char *path, blob_err *err) {
    err_clear(err);
    if (!s || !path || !*path) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store or no file");
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s->kind == BLOB_KIND_S3 ? s3_get_file(s, key, path, err) : local_get_file(s, key, path, err);
}

int blob_delete(blob_store *s, const char *key, blob_err *err) {
    err_clear(err);
    if (!s) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store");
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s->kind == BLOB_KIND_S3 ? s3_delete(s, key, err) : local_delete(s, key, err);
}

int blob_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err) {
    err_clear(err);
    if (!s || !cb) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no store or no callback");
    if (!prefix) prefix = "";
    if (!key_check(prefix, 1, 1)) return bad_key(err, prefix);
    return s->kind == BLOB_KIND_S3 ? s3_list(s, prefix, cb, ctx, err) : local_list(s, prefix, cb, ctx, err);
}

int blob_mpu_create(blob_store *s, const char *key, char upload_id[256], blob_err *err) {
    err_clear(err);
    LOCAL_ONLY_S3(s, err);
    if (!blob_key_valid(key)) return bad_key(err, key);
    if (!upload_id) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "no place for the upload id");
    return s3_mpu_create(s, key, upload_id, err);
}

int blob_mpu_complete(blob_store *s, const char *key, const char *upload_id, int parts,
                      const unsigned char (*md5)[16], blob_err *err) {
    err_clear(err);
    LOCAL_ONLY_S3(s, err);
    if (!blob_key_valid(key)) return bad_key(err, key);
    if (!upload_id || !*upload_id || parts < 1 || parts > 10000 || !md5)
        return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "complete: an upload id, 1..10000 parts and their MD5s");
    return s3_mpu_complete(s, key, upload_id, parts, md5, err);
}

int blob_mpu_abort(blob_store *s, const char *key, const char *upload_id, blob_err *err) {
    err_clear(err);
    LOCAL_ONLY_S3(s, err);
    if (!blob_key_valid(key)) return bad_key(err, key);
    if (!upload_id || !*upload_id) return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "abort: no upload id");
    return s3_mpu_abort(s, key, upload_id, err);
}

int blob_mpu_abort_key(blob_store *s, const char *key, int *aborted, blob_err *err) {
    err_clear(err);
    *aborted = 0;
    LOCAL_ONLY_S3(s, err);
    if (!blob_key_valid(key)) return bad_key(err, key);
    return s3_mpu_abort_key(s, key, aborted, err);
}

int blob_presign(blob_store *s, const char *method, const char *key, const char *upload_id, int part,
                 const char *content_md5_b64, int ttl_s, const char *filename, char *url, size_t cap) {
    if (url && cap) url[0] = '\0';
    if (!s || s->kind != BLOB_KIND_S3 || !method || !url || !blob_key_valid(key)) return BLOB_BAD;
    if (strcmp(method, "PUT") != 0 && strcmp(method, "GET") != 0) return BLOB_BAD;
    if (ttl_s < 1 || ttl_s > 604800) return BLOB_BAD;
    if ((upload_id && (!*upload_id || part < 1 || part > 10000)) || (!upload_id && part != 0)) return BLOB_BAD;
    if (upload_id && strcmp(method, "PUT") != 0) return BLOB_BAD;
    return s3_presign(s, method, key, upload_id, part, content_md5_b64, ttl_s, filename, url, cap);
}
