/* blobput.c - the uploader of bench/blobs (`make bench-blobs`): plays the
 * node and COUNT tasks of a trainyard server (registers a node, submits
 * COUNT one-worker jobs, takes their starts from the node's assignments, as
 * tests/check_faults.c does) and uploads one checkpoint of BYTES for each
 * task at once, in a thread each:
 *   --mode server   PUT /jobs/{id}/checkpoints with the worker's own
 *                   report_put_ckpt (the bytes through the server)
 *   --mode store    blobxfer_ckpt_upload, the worker's presigned multipart
 *                   path (the bytes straight to the S3 store)
 * Around the uploads only (not the registration or the submissions) it
 * samples utime+stime of the server (--server-pid), of radosgw (--rgw-pid)
 * and of itself from /proc, and prints one JSON line: the phase, bytes,
 * seconds, MB/s, each one's CPU seconds and cores (CPU seconds / wall), and
 * the server's peak resident memory. Exit 1 when an upload fails. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../../client/blobxfer.h"
#include "../../client/client.h"
#include "../../common/util.h"
#include "../../executor/report.h"

#define MAX_COUNT 64

typedef struct task {
    int64_t job, id;
    char token[160];
    long status;
    char err[600];
} task;

static const char *g_api, *g_mode;
static int g_fd = -1;
static uint64_t g_bytes;
static char g_sha[65];
static task g_tasks[MAX_COUNT];

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "blobput: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void read_token(const char *dir, const char *name, char *out, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = 0;
    char *s = file_read_all(path, 1024, &len);
    if (!s) die("cannot read %s: %s", path, strerror(errno));
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) s[--len] = '\0';
    snprintf(out, n, "%s", s);
    free(s);
}

/* One API request: the status; *out the JSON answer (NULL if none). */
static long api(const char *token, const char *method, const char *path, const char *body, cJSON **out) {
    client c;
    if (client_init(&c, g_api, token) != 0) die("client_init %s", g_api);
    client_reply r;
    int rc = client_request(&c, method, path, body, body ? strlen(body) : 0, NULL, &r);
    client_release(&c);
    if (rc != 0) die("%s %s: %s", method, path, r.error);
    long st = r.status;
    if (out) *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    client_reply_release(&r);
    return st;
}

/* utime+stime of pid in seconds (-1 when pid is 0 or gone). */
static double cpu_s(pid_t pid) {
    if (pid <= 0) return -1;
    char path[64], text[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *p = strrchr(text, ')');
    if (!p) return -1;
    unsigned long ut = 0, st = 0;
    /* after "(comm)": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long hwm_kb(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    size_t len = 0;
    char *s = file_read_all(path, 1 << 16, &len);
    if (!s) return -1;
    const char *h = strstr(s, "VmHWM:");
    long kb = h ? strtol(h + 6, NULL, 10) : -1;
    free(s);
    return kb;
}

static ssize_t src_read_at(void *ctx, void *b, size_t n, uint64_t off) {
    (void)ctx;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(g_fd, (char *)b + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static void *upload(void *arg) {
    task *t = arg;
    if (strcmp(g_mode, "server") == 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", g_fd);
        int fd = open(path, O_RDONLY); /* an offset of its own */
        if (fd < 0) {
            snprintf(t->err, sizeof t->err, "open %s: %s", path, strerror(errno));
            return NULL;
        }
        t->status = report_put_ckpt(NULL, g_api, t->token, t->job, 1, 1, g_sha, NULL, 0, fd, g_bytes, t->err,
                                    sizeof t->err);
        close(fd);
    } else {
        blobxfer_src src = {src_read_at, NULL, g_bytes};
        blobxfer_opts o;
        memset(&o, 0, sizeof o);
        blobxfer_result r;
        blobxfer_ckpt_upload(g_api, t->token, t->job, 1, 1, &src, &o, &r);
        t->status = r.status;
        snprintf(t->err, sizeof t->err, "%s", r.err);
        if (r.answer) cJSON_Delete(r.answer);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *data = NULL, *phase = "upload";
    int count = 1;
    pid_t spid = 0, rpid = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--server")) g_api = v;
        else if (!strcmp(k, "--data")) data = v;
        else if (!strcmp(k, "--mode")) g_mode = v;
        else if (!strcmp(k, "--bytes")) g_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--count")) count = atoi(v);
        else if (!strcmp(k, "--server-pid")) spid = (pid_t)atoi(v);
        else if (!strcmp(k, "--rgw-pid")) rpid = (pid_t)atoi(v);
        else if (!strcmp(k, "--phase")) phase = v;
        else die("unknown flag %s", k);
    }
    if (!g_api || !data || !g_mode || !g_bytes || count < 1 || count > MAX_COUNT || spid <= 0 ||
        (strcmp(g_mode, "server") && strcmp(g_mode, "store")))
        die("usage: blobput --server URL --data DIR --mode server|store --bytes N --count K --server-pid P "
            "[--rgw-pid R] [--phase NAME]");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char team[160], node_tok[160];
    read_token(data, "token", team, sizeof team);
    read_token(data, "node.token", node_tok, sizeof node_tok);

    /* the source: BYTES of a pattern in memory (a memfd, read with pread) */
    g_fd = memfd_create("blobput", 0);
    if (g_fd < 0 || ftruncate(g_fd, (off_t)g_bytes) != 0) die("memfd of %llu bytes: %s", (unsigned long long)g_bytes, strerror(errno));
    unsigned char *m = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, 0);
    if (m == MAP_FAILED) die("mmap: %s", strerror(errno));
    uint64_t x = 88172645463325252ull;
    for (uint64_t i = 0; i + 8 <= g_bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(m + i, &x, 8);
    }
    sha256_hex(m, g_bytes, g_sha);
    munmap(m, g_bytes);

    /* the node and its tasks */
    char body[512];
    snprintf(body, sizeof body, "{\"hostname\":\"blobput-%d\",\"address\":\"127.0.0.1\",\"cpu_slots\":%d,\"devices\":[]}",
             (int)getpid(), count);
    cJSON *o = NULL;
    long st = api(node_tok, "POST", "/api/v1/nodes", body, &o);
    if (st != 200 && st != 201) die("POST /nodes answered %ld", st);
    int64_t node = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "id"));
    const char *nt = cJSON_GetStringValue(cJSON_GetObjectItem(o, "token"));
    if (nt && *nt) snprintf(node_tok, sizeof node_tok, "%s", nt);
    cJSON_Delete(o);
    for (int i = 0; i < count; i++) {
        snprintf(body, sizeof body,
                 "{\"name\":\"blobput-%d\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":"
                 "\"sigmoid\",\"input_shape\":[4]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":"
                 "0.1},\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"synthetic\",\"examples\":100,"
                 "\"features\":4},\"fit\":{\"epochs\":1,\"batch_size\":10}}",
                 i);
        st = api(team, "POST", "/api/v1/jobs", body, &o);
        if (st != 201) die("POST /jobs answered %ld", st);
        g_tasks[i].job = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "id"));
        cJSON_Delete(o);
    }
    int got = 0;
    for (int round = 0; round < 60 && got < count; round++) {
        char path[96];
        snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=1", (long long)node);
        if (api(node_tok, "GET", path, NULL, &o) != 200) die("GET %s failed", path);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            int64_t job = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(it, "job"));
            for (int i = 0; i < count; i++) {
                if (g_tasks[i].job != job || g_tasks[i].id) continue;
                g_tasks[i].id = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(it, "task"));
                snprintf(g_tasks[i].token, sizeof g_tasks[i].token, "%s",
                         cJSON_GetStringValue(cJSON_GetObjectItem(it, "token")));
                got++;
            }
        }
        cJSON_Delete(o);
    }
    if (got != count) die("%d of %d jobs handed out", got, count);
    for (int i = 0; i < count; i++) {
        char path[96];
        snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)g_tasks[i].id);
        if (api(node_tok, "POST", path, "{\"state\":\"running\"}", NULL) != 200) die("POST %s failed", path);
    }

    /* the uploads, all at once */
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    double s0 = cpu_s(spid), r0 = cpu_s(rpid), t0 = mono_s();
    pthread_t th[MAX_COUNT];
    for (int i = 0; i < count; i++)
        if (pthread_create(&th[i], NULL, upload, &g_tasks[i]) != 0) die("pthread_create");
    for (int i = 0; i < count; i++) pthread_join(th[i], NULL);
    double t1 = mono_s(), s1 = cpu_s(spid), r1 = cpu_s(rpid);
    getrusage(RUSAGE_SELF, &ru1);
    int failed = 0;
    for (int i = 0; i < count; i++)
        if (g_tasks[i].status != 201) {
            fprintf(stderr, "blobput: job %lld: %ld %s\n", (long long)g_tasks[i].job, g_tasks[i].status, g_tasks[i].err);
            failed++;
        }
    double wall = t1 - t0;
    double self = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                  (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    double total = (double)g_bytes * count;
    printf("{\"phase\":\"%s\",\"mode\":\"%s\",\"uploads\":%d,\"bytes\":%.0f,\"seconds\":%.3f,\"MB_s\":%.1f,"
           "\"server_cpu_s\":%.3f,\"server_cores\":%.4f,\"rgw_cpu_s\":%.3f,\"rgw_cores\":%.4f,"
           "\"uploader_cpu_s\":%.3f,\"server_rss_peak_mb\":%.1f,\"failed\":%d}\n",
           phase, g_mode, count, total, wall, total / 1048576.0 / wall, s1 - s0, (s1 - s0) / wall,
           rpid > 0 ? r1 - r0 : 0.0, rpid > 0 ? (r1 - r0) / wall : 0.0, self, (double)hwm_kb(spid) / 1024.0, failed);
    close(g_fd);
    curl_global_cleanup();
    return failed ? 1 : 0;
}
