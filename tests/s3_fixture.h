/* s3_fixture.h - a real S3 store for the blob tests: Ceph's radosgw on a
 * one-node memstore cluster started by scripts/s3-dev.sh. One store per test
 * binary (started once, in main or a suite's first setup; stopped at exit),
 * a bucket per case. The fixture's own requests (lists, checks) are signed
 * by the script's python3 SigV4, independent of the code under test.
 * Include after check.h and common/util.h; the tests run from the checkout's
 * root (scripts/s3-dev.sh by a relative path, as tests/run_all.sh does).
 *
 *   s3_have(why, n)               1, or 0 with why: not root, or radosgw & co missing
 *   s3_required()                 S3_TEST_REQUIRED=1 (tests/run_all.sh): a
 *                                 missing store fails the suite instead of SKIP
 *   s3_start(s, tag, mem_mb)      s3-dev.sh start in /tmp/ty_TAG_XXXXXX; 0, or
 *                                 -1 having said why on stderr (no ck_assert:
 *                                 callable from main)
 *   s3_bucket(s, name)            a fresh bucket (3-63 of [a-z0-9-]); 0 or -1
 *   s3_spec(s, bucket, out, n)    "s3://BUCKET?endpoint=URL&region=R" for --blob-store
 *   s3_req(s, method, path, bodyfile, resp)  any signed request; the HTTP
 *                                 status (0: no answer), the body into resp
 *   s3_keys(s, bucket, prefix, keys, max)    ListObjectsV2: how many keys
 *                                 under prefix (-1 on error), the first max in keys
 *   s3_open_uploads(s, bucket, prefix)       ListMultipartUploads: how many
 *   s3_pause(s) / s3_resume(s)    SIGSTOP/SIGCONT radosgw (the store failing mid-run)
 *   s3_stop(s)                    s3-dev.sh stop; the directory removed unless
 *                                 TY_KEEP or s->keep (then its log/ stays); -1
 *                                 when a daemon of the store outlived it */
#ifndef TRAINYARD_TESTS_S3_FIXTURE_H
#define TRAINYARD_TESTS_S3_FIXTURE_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define S3_DEV_SCRIPT "scripts/s3-dev.sh"

typedef struct s3_dev {
    char dir[256], endpoint[64], bucket[64], region[32], creds[320], akid[64], secret[128];
    pid_t rgw;
    int keep; /* set on a failure to keep DIR/log */
} s3_dev;

static inline int s3_have(char *why, size_t n) {
    if (geteuid() != 0) return snprintf(why, n, "not root (the Ceph daemons of scripts/s3-dev.sh run as root)"), 0;
    static const char *const bins[] = {"radosgw", "radosgw-admin", "ceph-mon", "ceph-osd", "ceph",
                                       "monmaptool", "uuidgen", "python3", NULL};
    for (int i = 0; bins[i]; i++) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", bins[i]);
        if (system(cmd) != 0)
            return snprintf(why, n, "%s is not on the PATH (ceph-mon ceph-osd radosgw ceph-common: scripts/deps.sh)",
                            bins[i]), 0;
    }
    if (access(S3_DEV_SCRIPT, X_OK) != 0) return snprintf(why, n, "%s is not here (run from the checkout)", S3_DEV_SCRIPT), 0;
    return 1;
}

static inline int s3_required(void) {
    const char *r = getenv("S3_TEST_REQUIRED");
    return r && !strcmp(r, "1");
}

/* A value of an INI-ish "k = v" / "K=V" text: 0, or -1 when absent. */
static inline int s3__value(const char *text, const char *key, char sep, char *out, size_t n) {
    size_t kl = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, kl) != 0) continue;
        const char *p = l + kl;
        while (*p == ' ') p++;
        if (*p != sep) continue;
        p++;
        while (*p == ' ') p++;
        size_t len = strcspn(p, "\r\n");
        if (len == 0 || len >= n) return -1;
        memcpy(out, p, len);
        out[len] = '\0';
        return 0;
    }
    return -1;
}

/* Runs a shell command, its stdout into out (NUL-terminated, bounded by
 * max); the exit status (-1: could not run). */
static inline int s3__run(const char *cmd, buf *out) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char chunk[65536];
    size_t r;
    int full = 0;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (out && !full && buf_append(out, chunk, r) < 0) full = 1;
    int st = pclose(f);
    if (full) return -1;
    return st == -1 ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* s with single quotes for sh; -1 when it holds one. */
static inline int s3__quote(char *out, size_t n, const char *s) {
    if (strchr(s, '\'')) return -1;
    int w = snprintf(out, n, "'%s'", s);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

static inline int s3_start(s3_dev *s, const char *tag, int mem_mb) {
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/ty_%s_XXXXXX", tag);
    if (!mkdtemp(s->dir)) return fprintf(stderr, "s3_start: mkdtemp: %s\n", strerror(errno)), -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "S3_DEV_MB=%d %s start '%s' </dev/null", mem_mb > 0 ? mem_mb : 2048, S3_DEV_SCRIPT,
             s->dir);
    buf out;
    buf_init(&out, 1 << 16);
    int64_t t0 = mono_ms();
    int rc = s3__run(cmd, &out);
    const char *text = out.data ? out.data : "";
    if (rc != 0 || s3__value(text, "S3_ENDPOINT", '=', s->endpoint, sizeof s->endpoint) < 0 ||
        s3__value(text, "S3_BUCKET", '=', s->bucket, sizeof s->bucket) < 0 ||
        s3__value(text, "S3_REGION", '=', s->region, sizeof s->region) < 0) {
        fprintf(stderr, "s3_start: %s start %s failed (exit %d): %s (its logs: %s/log)\n", S3_DEV_SCRIPT, s->dir, rc,
                text, s->dir);
        buf_release(&out);
        s->keep = 1;
        return -1;
    }
    buf_release(&out);
    snprintf(s->creds, sizeof s->creds, "%s/credentials", s->dir);
    size_t len = 0;
    char *c = file_read_all(s->creds, 4096, &len);
    if (!c || s3__value(c, "aws_access_key_id", '=', s->akid, sizeof s->akid) < 0 ||
        s3__value(c, "aws_secret_access_key", '=', s->secret, sizeof s->secret) < 0) {
        fprintf(stderr, "s3_start: cannot read the keys of %s\n", s->creds);
        free(c);
        return -1;
    }
    free(c);
    char pidsf[320];
    snprintf(pidsf, sizeof pidsf, "%s/pids", s->dir);
    char *pids = file_read_all(pidsf, 4096, &len);
    const char *line = pids ? strstr(pids, "radosgw ") : NULL;
    if (line) s->rgw = (pid_t)atol(line + 8);
    free(pids);
    fprintf(stderr, "s3_start: %s bucket %s in %.1f s (%s)\n", s->endpoint, s->bucket, (double)(mono_ms() - t0) / 1000,
            s->dir);
    return 0;
}

/* A signed request: the HTTP status (0: no answer, -1: could not run),
 * the body into resp when given (caller's buf_init decides its maximum). */
static inline long s3_req(s3_dev *s, const char *method, const char *path, const char *bodyfile, buf *resp) {
    char qdir[300], qpath[1200], qbody[600] = "", cmd[2400];
    if (s3__quote(qdir, sizeof qdir, s->dir) < 0 || s3__quote(qpath, sizeof qpath, path) < 0 ||
        (bodyfile && s3__quote(qbody, sizeof qbody, bodyfile) < 0))
        return -1;
    int w = snprintf(cmd, sizeof cmd, "%s req %s %s %s %s </dev/null", S3_DEV_SCRIPT, qdir, method, qpath, qbody);
    if (w < 0 || (size_t)w >= sizeof cmd) return -1;
    buf out;
    buf_init(&out, resp && resp->max > 64 ? resp->max + 64 : 1 << 20);
    int rc = s3__run(cmd, &out);
    long status = -1;
    if (rc == 0 && out.data) {
        char *nl = strchr(out.data, '\n');
        status = strtol(out.data, NULL, 10);
        if (resp && nl && buf_append(resp, nl + 1, out.len - (size_t)(nl + 1 - out.data)) < 0) status = -1;
    }
    buf_release(&out);
    return status;
}

static inline int s3_bucket(s3_dev *s, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/%s", name);
    buf r;
    buf_init(&r, 1 << 16);
    long st = s3_req(s, "PUT", path, NULL, &r);
    if (st != 200) fprintf(stderr, "s3_bucket %s: %ld %s\n", name, st, r.data ? r.data : "");
    buf_release(&r);
    return st == 200 ? 0 : -1;
}

static inline void s3_spec(const s3_dev *s, const char *bucket, char *out, size_t n) {
    snprintf(out, n, "s3://%s?endpoint=%s&region=%s", bucket, s->endpoint, s->region);
}

/* The text between <tag> and </tag> after *pos; advances *pos. */
static inline int s3__xml(const char **pos, const char *tag, char *out, size_t n) {
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(*pos, open);
    if (!a) return -1;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b) return -1;
    size_t len = (size_t)(b - a);
    if (len >= n) len = n - 1;
    memcpy(out, a, len);
    out[len] = '\0';
    *pos = b + strlen(close);
    return 0;
}

/* ListObjectsV2 (all pages): how many keys under prefix, -1 on error; the
 * first max into keys (keys may be NULL). */
static inline int s3_keys(s3_dev *s, const char *bucket, const char *prefix, char (*keys)[256], int max) {
    int count = 0;
    char token[1024] = "";
    for (int page = 0; page < 1000; page++) {
        char path[2048];
        if (token[0])
            snprintf(path, sizeof path, "/%s?list-type=2&prefix=%s&continuation-token=%s", bucket, prefix, token);
        else
            snprintf(path, sizeof path, "/%s?list-type=2&prefix=%s", bucket, prefix);
        buf r;
        buf_init(&r, 16 << 20);
        long st = s3_req(s, "GET", path, NULL, &r);
        if (st != 200 || !r.data) {
            fprintf(stderr, "s3_keys %s: %ld %s\n", path, st, r.data ? r.data : "");
            buf_release(&r);
            return -1;
        }
        const char *p = r.data;
        char key[256];
        while (s3__xml(&p, "Key", key, sizeof key) == 0) {
            if (keys && count < max) snprintf(keys[count], 256, "%s", key);
            count++;
        }
        p = r.data;
        char trunc[16] = "";
        s3__xml(&p, "IsTruncated", trunc, sizeof trunc);
        p = r.data;
        char next[1024] = "";
        int more = !strcmp(trunc, "true") && s3__xml(&p, "NextContinuationToken", next, sizeof next) == 0;
        buf_release(&r);
        if (!more) return count;
        /* percent-encode the token for the query */
        size_t o = 0;
        for (const unsigned char *c = (const unsigned char *)next; *c && o + 4 < sizeof token; c++) {
            if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || strchr("-_.~", *c))
                token[o++] = (char)*c;
            else
                o += (size_t)snprintf(token + o, sizeof token - o, "%%%02X", *c);
        }
        token[o] = '\0';
    }
    return -1;
}

/* ListMultipartUploads: how many open uploads under prefix, -1 on error. */
static inline int s3_open_uploads(s3_dev *s, const char *bucket, const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "/%s?uploads&prefix=%s", bucket, prefix);
    buf r;
    buf_init(&r, 16 << 20);
    long st = s3_req(s, "GET", path, NULL, &r);
    if (st != 200 || !r.data) {
        fprintf(stderr, "s3_open_uploads %s: %ld %s\n", path, st, r.data ? r.data : "");
        buf_release(&r);
        return -1;
    }
    int n = 0;
    for (const char *p = r.data; (p = strstr(p, "<Upload>")); p += 8) n++;
    buf_release(&r);
    return n;
}

/* 1 when every thread of pid is stopped (state T): a SIGSTOP takes each
 * thread as it next runs, so kill() returns before a busy (or niced) daemon
 * has stopped answering. */
static inline int s3__stopped(long pid) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "for f in /proc/%ld/task/*/stat; do sed 's/^.*) //' \"$f\" | cut -c1; done 2>/dev/null"
             " | grep -qv T", pid);
    return system(cmd) != 0; /* no thread in another state */
}

static inline void s3_pause(s3_dev *s) {
    if (s->rgw <= 0) return;
    kill(s->rgw, SIGSTOP);
    for (int i = 0; i < 200 && !s3__stopped(s->rgw); i++) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static inline void s3_resume(s3_dev *s) {
    if (s->rgw > 0) kill(s->rgw, SIGCONT);
}

/* 1 while pid runs (a zombie, state Z, has exited: PID 1 may reap late). */
static inline int s3__alive(long pid) {
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *rp = strrchr(text, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* 0, or -1 (said on stderr) when the script failed or one of the store's
 * daemons still runs after it. */
static inline int s3_stop(s3_dev *s) {
    if (!s->dir[0]) return 0;
    s3_resume(s);
    char cmd[512], pidsf[320];
    long pids[8];
    int np = 0, rc = 0;
    snprintf(pidsf, sizeof pidsf, "%s/pids", s->dir);
    FILE *pf = fopen(pidsf, "r");
    char name[32];
    long pid;
    while (pf && np < 8 && fscanf(pf, "%31s %ld", name, &pid) == 2) pids[np++] = pid;
    if (pf) fclose(pf);
    snprintf(cmd, sizeof cmd, "%s stop '%s' </dev/null", S3_DEV_SCRIPT, s->dir);
    if (s3__run(cmd, NULL) != 0) {
        fprintf(stderr, "s3_stop: %s failed\n", cmd);
        rc = -1;
    }
    for (int i = 0; i < np; i++)
        if (s3__alive(pids[i])) {
            fprintf(stderr, "s3_stop: pid %ld of the store still runs after %s stop\n", pids[i], S3_DEV_SCRIPT);
            rc = -1;
        }
    if (s->keep || rc || getenv("TY_KEEP"))
        fprintf(stderr, "s3_stop: kept %s/log\n", s->dir);
    else {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", s->dir);
    }
    memset(s->secret, 0, sizeof s->secret);
    s->dir[0] = '\0';
    return rc;
}

#endif
