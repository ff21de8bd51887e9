/* simagents.c - N simulated node agents and a job submitter against a real
 * trainyard server, over real HTTP on loopback (bench/cluster/run.sh,
 * tests/cluster_sim.sh).
 *
 * Each agent speaks the protocol of executor/agent.c (docs/api-executors.md):
 *   POST /api/v1/nodes with the join token -> its node id and node token;
 *   POST /api/v1/nodes/{id}/heartbeat "{}" every --heartbeat-s seconds;
 *   GET  /api/v1/nodes/{id}/assignments?wait=S, again at once after an empty
 *        answer and 500 ms after one with tasks (as the agent's poller does);
 *   POST /api/v1/tasks/{id}/status {"state":"running"} for each task handed
 *        out, then {"state":"exited","exit_code":0,...} after the job's
 *        seeded run time; a stop entry is answered with the exit report of a
 *        worker stopped by SIGTERM (143), as the agent's would be.
 * No process is started: a task is a timer. The submitter posts command jobs
 * (gpu x workers from a seeded mix) at --rate per second with the team token.
 *
 * One process, one thread: libcurl's multi interface driven by epoll
 * (curl_multi_socket_action; one multi handle per 32 agents), so thousands
 * of agents cost a few connections' worth of memory each. The agents share libcurl's connection
 * cache: a parked long-poll holds one connection, a heartbeat or report
 * takes any idle one, so the server sees about N + the requests in flight
 * connections (a real agent keeps two each, one mostly idle).
 *
 * At the end: every job the submitter saw acknowledged (201) is looked up
 * in GET /api/v1/jobs (admin token), every agent in GET /api/v1/cluster, and
 * one JSON object is printed on stdout. Exit status 0 when nothing was
 * lost, no request failed, every agent registered and is ready, and every
 * queued job states a reason; 1 otherwise. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ utilities */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("simagents: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static void *xcalloc(size_t n, size_t m) {
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (!p) die("out of memory");
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A file's first line (a token, a URL), without its newline. */
static void read_line(const char *dir, const char *name, char *out, size_t cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    if (!fgets(out, (int)cap, f)) die("%s is empty", path);
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
}

typedef struct { char *p; size_t n, cap; } buf;

static void buf_add(buf *b, const void *d, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Sorted sample -> quantile (nearest rank). */
static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double quant_ms(int64_t *v, size_t n, double q) {
    if (!n) return -1;
    size_t k = (size_t)(q * (double)n);
    if (k >= n) k = n - 1;
    return (double)v[k] / 1000.0;
}

typedef struct { int64_t *v; size_t n, cap; } sample;

static void sample_add(sample *s, int64_t x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

/* ------------------------------------------------------------ options */

static struct {
    char url[512], join[128], team[128], admin[128];
    int agents, gpus, hb_s, poll_wait_s, reg_rate;
    double rate, dur_s, warmup_s, drain_s;
    int run_min_ms, run_max_ms;
    uint64_t seed;
    long server_pid;
    int verbose;
    const char *trace;               /* --trace FILE: a line per task handed out */
    int rest_stops_only; /* --agent-rest stops: rest only after an answer with stops */
    int rest_ms;         /* --rest-ms: the rest after an answer with entries (the agent's: 20) */
} opt = {.rest_ms = 20, .agents = 200, .gpus = 8, .hb_s = 5, .poll_wait_s = 20, .reg_rate = 1000, .rate = 100,
         .dur_s = 30, .warmup_s = 10, .drain_s = 30, .run_min_ms = 2000, .run_max_ms = 10000, .seed = 1};

/* ------------------------------------------------------------ state */

#define MAX_TASKS 32 /* tasks an agent holds at once (8 GPUs: at most 8 running, the rest exiting) */

enum { T_FREE, T_RUNNING, T_EXITING };

typedef struct {
    int64_t id, job;
    int state, code; /* code: the exit status reported (0, or 143 after a stop) */
} sim_task;

/* A task report waiting its turn: the agent delivers them in order, one at
 * a time (its outbox), so a task's exit never overtakes its start. */
typedef struct { int64_t task, job; int exited, code; } report;
#define OUTBOX_MAX 64

typedef struct {
    int64_t node;
    char token[96];
    int registered, reg_failures;
    int64_t registered_us;
    int tasks_n;
    sim_task tasks[MAX_TASKS];
    report out[OUTBOX_MAX];
    int out_head, out_len, out_busy;
} agent;

typedef struct {
    int64_t sent_us, acked_us, first_us, last_us, all_us;
    unsigned char workers, gpus, received, acked, in_window;
} job_rec;

enum { R_REGISTER, R_HEARTBEAT, R_POLL, R_RUNNING, R_EXITED, R_SUBMIT };
static const char *const KIND_NAME[] = {"register", "heartbeat", "assignments", "running", "exited", "submit"};
#define NKIND 6

typedef struct sreq {
    CURL *easy;
    int kind, agent, mh;
    int64_t task, job, t0_us;
    char *body;
    struct curl_slist *hdr;
    buf resp;
} sreq;

static agent *g_agents;
static job_rec *g_jobs;
static int64_t g_jobs_cap;
/* The agents are spread over several multi handles: libcurl looks for a
 * connection to reuse among all of a multi's connections to the host, so
 * one multi for thousands of agents spends its time in that search. */
#define AGENTS_PER_MULTI 32  /* a connection is looked for among its multi's: fewer, cheaper (libcurl walks them) */
typedef struct { CURLM *m; int64_t due_us; } multi;
static multi *g_mh;
static int g_nmh;
static int g_ep;
static int g_inflight;
static uint64_t g_rng;

static struct {
    uint64_t ok[NKIND], fail[NKIND], conflict;
    uint64_t hb_window, submitted, acked, starts, stops, exits_ok;
    uint64_t status_hist[6]; /* 1xx..5xx, 0 = transport */
    char first_error[512];
} st;

static sample g_assign_lat, g_first_lat, g_hb_lat, g_submit_lat;
static int g_in_window;

/* ------------------------------------------------------------ events */

enum { EV_REGISTER, EV_HEARTBEAT, EV_POLL, EV_EXIT, EV_RESEND, EV_SUBMIT };

typedef struct { int64_t at_us; int kind, agent; int64_t task; } event;
static event *g_heap;
static size_t g_heap_n, g_heap_cap;

static void ev_push(int64_t at, int kind, int a, int64_t task) {
    if (g_heap_n == g_heap_cap) {
        g_heap_cap = g_heap_cap ? g_heap_cap * 2 : 4096;
        g_heap = xrealloc(g_heap, g_heap_cap * sizeof *g_heap);
    }
    size_t i = g_heap_n++;
    event e = {at, kind, a, task};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (g_heap[p].at_us <= at) break;
        g_heap[i] = g_heap[p];
        i = p;
    }
    g_heap[i] = e;
}

static event ev_pop(void) {
    event top = g_heap[0], last = g_heap[--g_heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= g_heap_n) break;
        if (c + 1 < g_heap_n && g_heap[c + 1].at_us < g_heap[c].at_us) c++;
        if (g_heap[c].at_us >= last.at_us) break;
        g_heap[i] = g_heap[c];
        i = c;
    }
    if (g_heap_n) g_heap[i] = last;
    return top;
}

/* ------------------------------------------------------------ requests */

static size_t on_data(char *p, size_t sz, size_t n, void *u) {
    sreq *r = u;
    if (r->resp.n + sz * n > (64u << 20)) return 0; /* bound: 64 MiB */
    buf_add(&r->resp, p, sz * n);
    return sz * n;
}

static void request(int kind, int a, const char *method, const char *path, const char *token, char *body,
                    int64_t task, int64_t job) {
    sreq *r = xcalloc(1, sizeof *r);
    r->kind = kind;
    r->agent = a;
    r->task = task;
    r->job = job;
    r->body = body;
    r->t0_us = now_us();
    CURL *e = curl_easy_init();
    if (!e) die("curl_easy_init failed");
    r->easy = e;
    char url[1024], auth[160];
    snprintf(url, sizeof url, "%s%s", opt.url, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    r->hdr = curl_slist_append(NULL, auth);
    if (!r->hdr) die("out of memory");
    if (body) {
        struct curl_slist *h = curl_slist_append(r->hdr, "Content-Type: application/json");
        if (!h) die("out of memory");
        r->hdr = h;
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdr);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    /* as the agent's clients: a long-poll waits poll-wait + 15 s, the rest 30 s */
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, kind == R_POLL ? (long)(opt.poll_wait_s + 15) * 1000 : 30000L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    r->mh = a >= 0 ? a % g_nmh : 0;
    if (curl_multi_add_handle(g_mh[r->mh].m, e) != CURLM_OK) die("curl_multi_add_handle failed");
    g_inflight++;
}

static char *sdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

/* ------------------------------------------------------------ the agents */

static void do_register(int a) {
    char host[64], body[2048];
    snprintf(host, sizeof host, "sim-%05d", a);
    size_t n = (size_t)snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"127.0.0.1\",\"cpu_slots\":8,\"devices\":[",
                                host);
    for (int g = 0; g < opt.gpus; g++)
        n += (size_t)snprintf(body + n, sizeof body - n,
                              "%s{\"kind\":\"gpu\",\"index\":%d,\"model\":\"simulated H100\",\"memory_mb\":81920}",
                              g ? "," : "", g);
    snprintf(body + n, sizeof body - n,
             "],\"memory_mb\":1048576,\"isolation\":{\"mode\":\"none\",\"cgroup\":\"none\",\"enforced\":[],"
             "\"reason\":\"a simulated agent (bench/cluster/simagents.c)\"}}");
    request(R_REGISTER, a, "POST", "/api/v1/nodes", opt.join, sdup(body), 0, 0);
}

static void do_heartbeat(int a) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%" PRId64 "/heartbeat", g_agents[a].node);
    request(R_HEARTBEAT, a, "POST", path, g_agents[a].token, sdup("{}"), 0, 0);
}

static void do_poll(int a) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/nodes/%" PRId64 "/assignments?wait=%d", g_agents[a].node, opt.poll_wait_s);
    request(R_POLL, a, "GET", path, g_agents[a].token, NULL, 0, 0);
}

static void send_status(int a, int64_t task, int64_t job, int exited, int code) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%" PRId64 "/status", task);
    char body[256];
    if (!exited) snprintf(body, sizeof body, "{\"state\":\"running\"}");
    else if (code == 0)
        snprintf(body, sizeof body,
                 "{\"state\":\"exited\",\"exit_code\":0,\"signal\":0,\"reason\":\"exited with code 0\",\"log_tail\":\"done\\n\"}");
    else
        snprintf(body, sizeof body,
                 "{\"state\":\"exited\",\"exit_code\":%d,\"signal\":0,\"reason\":\"exited with code %d after stop\","
                 "\"log_tail\":\"stopped\\n\"}", code, code);
    request(exited ? R_EXITED : R_RUNNING, a, "POST", path, g_agents[a].token, sdup(body), task, job);
}

/* Sends the outbox's first report unless one is on its way. */
static void outbox_kick(int a) {
    agent *ag = &g_agents[a];
    if (ag->out_busy || !ag->out_len) return;
    const report *r = &ag->out[ag->out_head];
    ag->out_busy = 1;
    send_status(a, r->task, r->job, r->exited, r->code);
}

static void do_status(int a, int64_t task, int64_t job, int exited, int code) {
    agent *ag = &g_agents[a];
    if (ag->out_len == OUTBOX_MAX) {
        snprintf(st.first_error, sizeof st.first_error, "agent %d: outbox full", a);
        st.fail[exited ? R_EXITED : R_RUNNING]++;
        return;
    }
    ag->out[(ag->out_head + ag->out_len++) % OUTBOX_MAX] = (report){task, job, exited, code};
    outbox_kick(a);
}

static sim_task *task_find(agent *ag, int64_t id) {
    for (int i = 0; i < ag->tasks_n; i++)
        if (ag->tasks[i].id == id) return &ag->tasks[i];
    return NULL;
}

static void task_remove(agent *ag, int64_t id) {
    for (int i = 0; i < ag->tasks_n; i++)
        if (ag->tasks[i].id == id) {
            ag->tasks[i] = ag->tasks[--ag->tasks_n];
            return;
        }
}

/* The job's run time: seeded by job id, so every task of a gang ends together. */
static int64_t run_time_us(int64_t job) {
    uint64_t s = opt.seed * 1000003ULL + (uint64_t)job;
    int span = opt.run_max_ms - opt.run_min_ms;
    return ((int64_t)opt.run_min_ms + (span > 0 ? (int64_t)(splitmix(&s) % (uint64_t)span) : 0)) * 1000;
}

static job_rec *job_at(int64_t id) {
    if (id <= 0 || id > (int64_t)1 << 40) return NULL;
    if (id >= g_jobs_cap) {
        int64_t c = g_jobs_cap ? g_jobs_cap : 4096;
        while (c <= id) c *= 2;
        g_jobs = xrealloc(g_jobs, (size_t)c * sizeof *g_jobs);
        memset(g_jobs + g_jobs_cap, 0, (size_t)(c - g_jobs_cap) * sizeof *g_jobs);
        g_jobs_cap = c;
    }
    return &g_jobs[id];
}

static void gang_check(job_rec *j) {
    if (j->acked && j->received >= j->workers && !j->all_us) {
        j->all_us = j->last_us;
        if (j->in_window) sample_add(&g_assign_lat, j->all_us - j->sent_us);
    }
}

/* --trace: for each task received, "received_ms poll_sent_ms job task agent"
 * (wall-clock ms, comparable with the server's job_events.ts): tells a
 * placement's delivery from its scheduling. */
static FILE *g_trace;

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_assignments(int a, const char *text, int64_t poll_sent_ms) {
    agent *ag = &g_agents[a];
    cJSON *o = cJSON_Parse(text);
    if (!o) {
        st.fail[R_POLL]++;
        return;
    }
    int nonempty = 0, had_stop = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "stop")) {
        nonempty = had_stop = 1;
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "task");
        const cJSON *jid = cJSON_GetObjectItemCaseSensitive(e, "job");
        if (!cJSON_IsNumber(tid)) continue;
        int64_t id = (int64_t)tid->valuedouble;
        sim_task *t = task_find(ag, id);
        if (t && t->state == T_EXITING) continue; /* its report is on its way */
        st.stops++;
        /* SIGTERM, the worker exits 143; a stop for a task it does not run
         * is answered with an exit report too (executor/agent.c) */
        if (t) {
            t->state = T_EXITING;
            t->code = 143;
        }
        do_status(a, id, cJSON_IsNumber(jid) ? (int64_t)jid->valuedouble : 0, 1, 143);
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "start")) {
        nonempty = 1;
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "task");
        const cJSON *jid = cJSON_GetObjectItemCaseSensitive(e, "job");
        if (!cJSON_IsNumber(tid) || !cJSON_IsNumber(jid)) continue;
        int64_t id = (int64_t)tid->valuedouble, job = (int64_t)jid->valuedouble;
        if (task_find(ag, id)) continue;
        if (ag->tasks_n == MAX_TASKS) {
            snprintf(st.first_error, sizeof st.first_error, "agent %d holds more than %d tasks", a, MAX_TASKS);
            st.fail[R_POLL]++;
            continue;
        }
        ag->tasks[ag->tasks_n++] = (sim_task){id, job, T_RUNNING, 0};
        st.starts++;
        job_rec *j = job_at(job);
        if (j) {
            if (!j->first_us) {
                j->first_us = now_us();
                if (j->acked && j->in_window) sample_add(&g_first_lat, j->first_us - j->sent_us);
            }
            j->last_us = now_us();
            j->received++;
            gang_check(j);
        }
        if (g_trace)
            fprintf(g_trace, "%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %d\n", wall_ms(), poll_sent_ms, job, id, a);
        do_status(a, id, job, 0, 0);
        ev_push(now_us() + run_time_us(job), EV_EXIT, a, id);
    }
    cJSON_Delete(o);
    /* the agent's poller: a non-empty answer is followed by a short rest
     * (executor/agent.c AGENT_POLL_REST_MS, 20 ms; --agent-rest stops: only
     * one with stops; --rest-ms sets it, 500 for the agent before) */
    if (opt.rest_stops_only ? had_stop : nonempty) ev_push(now_us() + (int64_t)opt.rest_ms * 1000, EV_POLL, a, 0);
    else do_poll(a);
}

static void on_register(int a, long code, const char *text) {
    agent *ag = &g_agents[a];
    cJSON *o = cJSON_Parse(text);
    const cJSON *id = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
    const cJSON *tok = o ? cJSON_GetObjectItemCaseSensitive(o, "token") : NULL;
    if ((code == 200 || code == 201) && cJSON_IsNumber(id) && cJSON_IsString(tok) &&
        strlen(tok->valuestring) < sizeof ag->token) {
        ag->node = (int64_t)id->valuedouble;
        snprintf(ag->token, sizeof ag->token, "%s", tok->valuestring);
        int first = !ag->registered;
        ag->registered = 1;
        ag->reg_failures = 0;
        ag->registered_us = now_us();
        if (first) {
            uint64_t s = opt.seed ^ (uint64_t)a * 7919;
            ev_push(now_us() + (int64_t)(splitmix(&s) % ((uint64_t)opt.hb_s * 1000000)), EV_HEARTBEAT, a, 0);
            do_poll(a);
        }
    } else {
        int64_t d = 250000LL << (ag->reg_failures < 5 ? ag->reg_failures : 5);
        if (d > 5000000) d = 5000000;
        ag->reg_failures++;
        ev_push(now_us() + d, EV_REGISTER, a, 0);
    }
    cJSON_Delete(o);
}

/* ------------------------------------------------------------ the submitter */

static void do_submit(void) {
    static const int G[] = {1, 2, 4, 8};
    int g = G[splitmix(&g_rng) % 4], w = 1 + (int)(splitmix(&g_rng) % 4);
    char body[512];
    snprintf(body, sizeof body,
             "{\"name\":\"sim-%dx%d\",\"command\":{\"argv\":[\"/bin/true\"]},\"strategy\":{\"type\":"
             "\"multi_worker_mirrored\"},\"resources\":{\"workers\":%d,\"devices_per_worker\":%d,\"device\":\"gpu\"}}",
             w, g, w, g);
    request(R_SUBMIT, -1, "POST", "/api/v1/jobs", opt.team, sdup(body), 0, 0);
    st.submitted++;
}

/* ------------------------------------------------------------ completions */

static void on_done(sreq *r, CURLcode cc) {
    long code = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
    int64_t t = now_us();
    const char *text = r->resp.p ? r->resp.p : "";
    st.status_hist[cc == CURLE_OK && code >= 100 && code < 600 ? code / 100 : 0]++;
    int ok = cc == CURLE_OK && code >= 200 && code < 300;
    if (ok) st.ok[r->kind]++;
    else if (r->kind == R_EXITED && code == 409) st.conflict++; /* an exit already reported: not lost, not an error */
    else {
        st.fail[r->kind]++;
        if (!st.first_error[0])
            snprintf(st.first_error, sizeof st.first_error, "%s: %s %ld %.300s", KIND_NAME[r->kind],
                     cc == CURLE_OK ? "HTTP" : curl_easy_strerror(cc), code, text);
        if (opt.verbose)
            fprintf(stderr, "simagents: %s failed: %s %ld %.300s\n", KIND_NAME[r->kind],
                    cc == CURLE_OK ? "HTTP" : curl_easy_strerror(cc), code, text);
    }
    agent *ag = r->agent >= 0 ? &g_agents[r->agent] : NULL;
    switch (r->kind) {
    case R_REGISTER: on_register(r->agent, code, text); break;
    case R_HEARTBEAT:
        if (ok && g_in_window) {
            st.hb_window++;
            sample_add(&g_hb_lat, t - r->t0_us);
        }
        if (code == 401 || code == 404) { ag->registered = 0; ev_push(t, EV_REGISTER, r->agent, 0); }
        break;
    case R_POLL:
        if (ok) on_assignments(r->agent, text, wall_ms() - (t - r->t0_us) / 1000);
        else if (code == 401 || code == 404) ev_push(t + 250000, EV_REGISTER, r->agent, 0);
        else ev_push(t + 250000, EV_POLL, r->agent, 0);
        break;
    case R_RUNNING:
    case R_EXITED:
        ag->out_busy = 0;
        if (ok || code == 409 || (code >= 400 && code < 500)) { /* delivered, or refused for good: next */
            if (r->kind == R_EXITED) {
                if (ok) st.exits_ok++;
                task_remove(ag, r->task);
            }
            ag->out_head = (ag->out_head + 1) % OUTBOX_MAX;
            ag->out_len--;
            outbox_kick(r->agent);
        } else {
            ev_push(t + 250000, EV_RESEND, r->agent, 0); /* the server is away: the same report again */
        }
        break;
    case R_SUBMIT: {
        if (g_in_window) sample_add(&g_submit_lat, t - r->t0_us);
        if (!ok) break;
        cJSON *o = cJSON_Parse(text);
        const cJSON *id = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
        const cJSON *res = o ? cJSON_GetObjectItemCaseSensitive(o, "resources") : NULL;
        const cJSON *w = res ? cJSON_GetObjectItemCaseSensitive(res, "workers") : NULL;
        job_rec *j = cJSON_IsNumber(id) ? job_at((int64_t)id->valuedouble) : NULL;
        if (j && cJSON_IsNumber(w)) {
            j->sent_us = r->t0_us;
            j->acked_us = t;
            j->workers = (unsigned char)w->valueint;
            j->acked = 1;
            j->in_window = (unsigned char)g_in_window;
            if (j->first_us && j->in_window) sample_add(&g_first_lat, j->first_us - j->sent_us);
            st.acked++;
            gang_check(j);
        } else {
            st.fail[R_SUBMIT]++;
            if (!st.first_error[0]) snprintf(st.first_error, sizeof st.first_error, "submit: 2xx without an id: %.200s", text);
        }
        cJSON_Delete(o);
        break;
    }
    }
    curl_multi_remove_handle(g_mh[r->mh].m, r->easy);
    curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdr);
    free(r->body);
    free(r->resp.p);
    free(r);
    g_inflight--;
}

static void drain_done(CURLM *multi_h) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi_h, &left)))
        if (m->msg == CURLMSG_DONE) {
            sreq *r = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            on_done(r, m->data.result);
        }
}

/* ------------------------------------------------------------ curl <-> epoll */

static int on_socket(CURL *e, curl_socket_t s, int what, void *u, void *sp) {
    (void)e;
    multi *mh = u;
    struct epoll_event ev = {0};
    ev.data.u64 = (uint64_t)(mh - g_mh) << 32 | (uint32_t)s;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(g_ep, EPOLL_CTL_DEL, s, NULL); /* may be closed already */
        curl_multi_assign(mh->m, s, NULL);
        return 0;
    }
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    if (!sp) {
        if (epoll_ctl(g_ep, EPOLL_CTL_ADD, s, &ev) < 0 && errno == EEXIST) epoll_ctl(g_ep, EPOLL_CTL_MOD, s, &ev);
        curl_multi_assign(mh->m, s, (void *)1);
    } else if (epoll_ctl(g_ep, EPOLL_CTL_MOD, s, &ev) < 0 && errno == ENOENT) {
        epoll_ctl(g_ep, EPOLL_CTL_ADD, s, &ev);
    }
    return 0;
}

static int on_timer(CURLM *m, long ms, void *u) {
    (void)m;
    multi *mh = u;
    mh->due_us = ms < 0 ? -1 : now_us() + ms * 1000;
    return 0;
}

/* Runs the loop until `until_us` (or, with until_us 0, until no request is
 * in flight and no event is due). */
static void loop_until(int64_t until_us, int64_t submit_end_us) {
    struct epoll_event evs[512];
    int running;
    for (;;) {
        int64_t t = now_us();
        if (until_us && t >= until_us) return;
        /* due events */
        while (g_heap_n && g_heap[0].at_us <= t) {
            event e = ev_pop();
            agent *ag = e.agent >= 0 ? &g_agents[e.agent] : NULL;
            switch (e.kind) {
            case EV_REGISTER: do_register(e.agent); break;
            case EV_HEARTBEAT:
                if (ag->registered) do_heartbeat(e.agent);
                ev_push(e.at_us + (int64_t)opt.hb_s * 1000000, EV_HEARTBEAT, e.agent, 0);
                break;
            case EV_POLL: if (ag->registered) do_poll(e.agent); break;
            case EV_EXIT: { /* the task's run time is up: it exits 0, unless a stop ended it first */
                sim_task *tk = task_find(ag, e.task);
                if (tk && tk->state == T_RUNNING) {
                    tk->state = T_EXITING;
                    tk->code = 0;
                    do_status(e.agent, tk->id, tk->job, 1, 0);
                }
                break;
            }
            case EV_RESEND: outbox_kick(e.agent); break; /* a report that failed: sent again */
            case EV_SUBMIT:
                if (t < submit_end_us) {
                    do_submit();
                    ev_push(e.at_us + (int64_t)(1e6 / opt.rate), EV_SUBMIT, -1, 0);
                }
                break;
            }
        }
        t = now_us();
        int64_t due = g_heap_n ? g_heap[0].at_us : t + 1000000;
        for (int k = 0; k < g_nmh; k++)
            if (g_mh[k].due_us >= 0 && g_mh[k].due_us < due) due = g_mh[k].due_us;
        if (until_us && until_us < due) due = until_us;
        int wait = due <= t ? 0 : (int)((due - t + 999) / 1000);
        int n = epoll_wait(g_ep, evs, 512, wait);
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            int f = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) | (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                    (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            multi *mh = &g_mh[evs[i].data.u64 >> 32];
            curl_multi_socket_action(mh->m, (curl_socket_t)(uint32_t)evs[i].data.u64, f, &running);
        }
        t = now_us();
        for (int k = 0; k < g_nmh; k++)
            if (g_mh[k].due_us >= 0 && t >= g_mh[k].due_us) {
                g_mh[k].due_us = -1;
                curl_multi_socket_action(g_mh[k].m, CURL_SOCKET_TIMEOUT, 0, &running);
            }
        for (int k = 0; k < g_nmh; k++) drain_done(g_mh[k].m);
    }
}

/* ------------------------------------------------------------ blocking GETs (metrics, the check) */

static long get_blocking(const char *path, const char *token, buf *out) {
    CURL *e = curl_easy_init();
    if (!e) die("curl_easy_init failed");
    char url[1024], auth[160];
    snprintf(url, sizeof url, "%s%s", opt.url, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    struct curl_slist *h = curl_slist_append(NULL, auth);
    sreq tmp = {0};
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &tmp);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 60000L);
    CURLcode cc = curl_easy_perform(e);
    long code = 0;
    if (cc == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    *out = tmp.resp;
    return code;
}

/* Prometheus text: the histogram `name` (with a label filter) as cumulative
 * bucket counts; returns the number of buckets (at most cap). */
typedef struct { double le[32]; double cnt[32]; int n; double count; } histo;

static void histo_read(const char *text, const char *name, const char *filter, histo *h) {
    memset(h, 0, sizeof *h);
    char bname[160], cname[160];
    snprintf(bname, sizeof bname, "%s_bucket{", name);
    snprintf(cname, sizeof cname, "%s_count", name);
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len < sizeof line) {
            memcpy(line, p, len);
            line[len] = '\0';
            if ((!filter || strstr(line, filter))) {
                if (strncmp(line, bname, strlen(bname)) == 0 && h->n < 32) {
                    char *le = strstr(line, "le=\"");
                    char *sp = strrchr(line, ' ');
                    if (le && sp) {
                        h->le[h->n] = strncmp(le + 4, "+Inf", 4) == 0 ? 1e30 : strtod(le + 4, NULL);
                        h->cnt[h->n] = strtod(sp + 1, NULL);
                        h->n++;
                    }
                } else if (strncmp(line, cname, strlen(cname)) == 0) {
                    char *sp = strrchr(line, ' ');
                    if (sp) h->count = strtod(sp + 1, NULL);
                }
            }
        }
        p = eol ? eol + 1 : NULL;
    }
}

/* The q-quantile of the observations between two reads, in ms, by linear
 * interpolation inside the bucket (Prometheus' histogram_quantile). */
static double histo_quant(const histo *a, const histo *b, double q, double *total) {
    int n = b->n < a->n || a->n == 0 ? b->n : a->n;
    double d[32] = {0};
    for (int i = 0; i < n; i++) d[i] = b->cnt[i] - (a->n ? a->cnt[i] : 0);
    *total = n ? d[n - 1] : 0;
    if (*total <= 0) return -1;
    double rank = q * *total;
    for (int i = 0; i < n; i++)
        if (d[i] >= rank) {
            double lo = i ? b->le[i - 1] : 0, hi = b->le[i] >= 1e30 ? lo : b->le[i];
            double below = i ? d[i - 1] : 0, inb = d[i] - below;
            return 1000.0 * (inb > 0 ? lo + (hi - lo) * (rank - below) / inb : hi);
        }
    return -1;
}

/* /proc/PID/stat utime + stime in seconds; RSS and its peak in MiB. */
static double proc_cpu_s(long pid) {
    if (pid <= 0) return -1;
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    char *p = strrchr(line, ')');
    if (!p) return -1;
    unsigned long ut = 0, stt = 0;
    /* after ") ": state(3) ... utime is field 14, stime 15 */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) != 2) return -1;
    return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static double proc_status_mb(long pid, const char *key) {
    if (pid <= 0) return -1;
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) v = strtod(line + strlen(key) + 1, NULL) / 1024.0;
    fclose(f);
    return v;
}

static double self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ------------------------------------------------------------ main */

static void usage(void) {
    fprintf(stderr,
            "usage: simagents --data DIR [--agents N] [--gpus G] [--rate JOBS_PER_S] [--duration S]\n"
            "                 [--warmup S] [--drain S] [--heartbeat-s S] [--poll-wait S] [--register-rate R]\n"
            "                 [--run-ms MIN-MAX] [--seed N] [--server-pid PID] [--agent-rest any|stops] [--rest-ms MS] [--verbose]\n"
            "                 [--trace FILE]\n"
            "DIR is the server's data directory (server.url, node.token, token, admin.token).\n");
    exit(2);
}

static double num_arg(const char *s, double lo, double hi, const char *what) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < lo || v > hi) die("%s wants a number in [%g, %g], got '%s'", what, lo, hi, s);
    return v;
}

int main(int argc, char **argv) {
    const char *data = NULL;
    static const struct option lo[] = {
        {"data", 1, 0, 'd'},      {"agents", 1, 0, 'n'},   {"gpus", 1, 0, 'g'},        {"rate", 1, 0, 'r'},
        {"duration", 1, 0, 't'},  {"warmup", 1, 0, 'w'},   {"drain", 1, 0, 'D'},       {"heartbeat-s", 1, 0, 'h'},
        {"poll-wait", 1, 0, 'p'}, {"register-rate", 1, 0, 'R'}, {"run-ms", 1, 0, 'm'}, {"seed", 1, 0, 's'},
        {"server-pid", 1, 0, 'P'}, {"verbose", 0, 0, 'v'}, {"agent-rest", 1, 0, 'A'},
        {"rest-ms", 1, 0, 'Z'}, {"trace", 1, 0, 'T'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'n': opt.agents = (int)num_arg(optarg, 1, 100000, "--agents"); break;
        case 'g': opt.gpus = (int)num_arg(optarg, 1, 64, "--gpus"); break;
        case 'r': opt.rate = num_arg(optarg, 0, 100000, "--rate"); break;
        case 't': opt.dur_s = num_arg(optarg, 0, 86400, "--duration"); break;
        case 'w': opt.warmup_s = num_arg(optarg, 0, 3600, "--warmup"); break;
        case 'D': opt.drain_s = num_arg(optarg, 0, 3600, "--drain"); break;
        case 'h': opt.hb_s = (int)num_arg(optarg, 1, 3600, "--heartbeat-s"); break;
        case 'p': opt.poll_wait_s = (int)num_arg(optarg, 0, 60, "--poll-wait"); break;
        case 'R': opt.reg_rate = (int)num_arg(optarg, 1, 1000000, "--register-rate"); break;
        case 'm': {
            char *dash = strchr(optarg, '-');
            if (!dash) die("--run-ms wants MIN-MAX");
            *dash = '\0';
            opt.run_min_ms = (int)num_arg(optarg, 0, 86400000, "--run-ms");
            opt.run_max_ms = (int)num_arg(dash + 1, opt.run_min_ms, 86400000, "--run-ms");
            break;
        }
        case 's': opt.seed = (uint64_t)num_arg(optarg, 0, 1e15, "--seed"); break;
        case 'P': opt.server_pid = (long)num_arg(optarg, 1, 1e9, "--server-pid"); break;
        case 'v': opt.verbose = 1; break;
        case 'T': opt.trace = optarg; break;
        case 'Z': opt.rest_ms = (int)num_arg(optarg, 0, 60000, "--rest-ms"); break;
        case 'A':
            if (strcmp(optarg, "any") == 0) opt.rest_stops_only = 0;
            else if (strcmp(optarg, "stops") == 0) opt.rest_stops_only = 1;
            else die("--agent-rest wants any (executor/agent.c) or stops");
            break;
        default: usage();
        }
    }
    if (!data || optind != argc) usage();
    read_line(data, "server.url", opt.url, sizeof opt.url);
    read_line(data, "node.token", opt.join, sizeof opt.join);
    read_line(data, "token", opt.team, sizeof opt.team);
    read_line(data, "admin.token", opt.admin, sizeof opt.admin);
    signal(SIGPIPE, SIG_IGN);
    if (opt.trace && !(g_trace = fopen(opt.trace, "w"))) die("--trace %s: %s", opt.trace, strerror(errno));

    /* a descriptor per connection: N parked polls and the requests in flight */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t want = (rlim_t)opt.agents * 2 + 1024;
        if (rl.rlim_cur < want) {
            rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < (rlim_t)opt.agents + 256)
            die("RLIMIT_NOFILE is %llu: %d agents need about %d descriptors (ulimit -n)", (unsigned long long)rl.rlim_cur,
                opt.agents, opt.agents + 256);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) die("curl_global_init failed");
    g_ep = epoll_create1(EPOLL_CLOEXEC);
    if (g_ep < 0) die("epoll_create1: %s", strerror(errno));
    g_nmh = (opt.agents + AGENTS_PER_MULTI - 1) / AGENTS_PER_MULTI;
    g_mh = xcalloc((size_t)g_nmh, sizeof *g_mh);
    for (int k = 0; k < g_nmh; k++) {
        g_mh[k].m = curl_multi_init();
        g_mh[k].due_us = -1;
        if (!g_mh[k].m) die("curl_multi_init failed");
        curl_multi_setopt(g_mh[k].m, CURLMOPT_SOCKETFUNCTION, on_socket);
        curl_multi_setopt(g_mh[k].m, CURLMOPT_SOCKETDATA, &g_mh[k]);
        curl_multi_setopt(g_mh[k].m, CURLMOPT_TIMERFUNCTION, on_timer);
        curl_multi_setopt(g_mh[k].m, CURLMOPT_TIMERDATA, &g_mh[k]);
        curl_multi_setopt(g_mh[k].m, CURLMOPT_MAXCONNECTS, (long)AGENTS_PER_MULTI * 2 + 64);
    }
    g_agents = xcalloc((size_t)opt.agents, sizeof *g_agents);
    g_rng = opt.seed * 0x2545F4914F6CDD1DULL + 1;

    /* 1. registration, paced at --register-rate */
    int64_t t0 = now_us();
    for (int a = 0; a < opt.agents; a++) ev_push(t0 + (int64_t)a * 1000000 / opt.reg_rate, EV_REGISTER, a, 0);
    int64_t reg_deadline = t0 + (int64_t)((double)opt.agents / opt.reg_rate * 1e6) + 60000000;
    int registered = 0;
    while (now_us() < reg_deadline) {
        loop_until(now_us() + 200000, 0);
        registered = 0;
        for (int a = 0; a < opt.agents; a++) registered += g_agents[a].registered;
        if (registered == opt.agents) break;
    }
    double reg_s = (double)(now_us() - t0) / 1e6;
    fprintf(stderr, "simagents: %d/%d agents registered in %.1f s\n", registered, opt.agents, reg_s);

    /* 2. warm-up: heartbeats spread over their period, polls parked */
    loop_until(now_us() + (int64_t)(opt.warmup_s * 1e6), 0);

    /* 3. the measured window: submissions at --rate */
    buf m0 = {0}, m1 = {0};
    long mc = get_blocking("/metrics", opt.admin, &m0);
    if (mc != 200) die("GET /metrics answered %ld", mc);
    double cpu0 = proc_cpu_s(opt.server_pid), self0 = self_cpu_s();
    int64_t w0 = now_us();
    g_in_window = 1;
    fprintf(stderr, "simagents: the window begins (%.0f s)\n", opt.dur_s); /* bench/cluster/run.sh starts its user's GETs */
    int64_t submit_end = w0 + (int64_t)(opt.dur_s * 1e6);
    if (opt.rate > 0) ev_push(w0, EV_SUBMIT, -1, 0);
    loop_until(submit_end, submit_end);
    g_in_window = 0;
    int64_t w1 = now_us();
    double cpu1 = proc_cpu_s(opt.server_pid), self1 = self_cpu_s();
    double rss = proc_status_mb(opt.server_pid, "VmRSS:"), hwm = proc_status_mb(opt.server_pid, "VmHWM:");
    mc = get_blocking("/metrics", opt.admin, &m1);
    if (mc != 200) die("GET /metrics answered %ld", mc);
    double win_s = (double)(w1 - w0) / 1e6;
    fprintf(stderr, "simagents: window %.1f s: %" PRIu64 " submitted, %" PRIu64 " acknowledged, %" PRIu64 " heartbeats\n",
            win_s, st.submitted, st.acked, st.hb_window);

    /* 4. drain: until every acknowledged gang is in its agents' hands (or --drain s) */
    int64_t drain_end = now_us() + (int64_t)(opt.drain_s * 1e6);
    uint64_t waiting = 0;
    while (now_us() < drain_end) {
        loop_until(now_us() + 200000, 0);
        waiting = 0;
        for (int64_t i = 1; i < g_jobs_cap; i++)
            if (g_jobs[i].acked && !g_jobs[i].all_us) waiting++;
        if (!waiting) break;
    }

    /* 5. the check: every acknowledged job in GET /jobs, every agent in GET /cluster */
    uint64_t lost = 0, found = 0, queued_reason = 0, queued_noreason = 0, failed = 0, by_state[8] = {0};
    static const char *const STATES[] = {"queued", "starting", "running", "succeeded", "failed", "cancelled", "other"};
    unsigned char *seen = xcalloc((size_t)(g_jobs_cap > 0 ? g_jobs_cap : 1), 1);
    char first_bad[256] = "";
    long before = 0;
    for (;;) {
        char path[128];
        if (before) snprintf(path, sizeof path, "/api/v1/jobs?limit=1000&before=%ld", before);
        else snprintf(path, sizeof path, "/api/v1/jobs?limit=1000");
        buf b = {0};
        long code = get_blocking(path, opt.admin, &b);
        cJSON *o = code == 200 ? cJSON_Parse(b.p ? b.p : "") : NULL;
        free(b.p);
        if (!o) die("GET %s answered %ld", path, code);
        const cJSON *j;
        cJSON_ArrayForEach(j, cJSON_GetObjectItemCaseSensitive(o, "jobs")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(j, "state");
            const cJSON *reason = cJSON_GetObjectItemCaseSensitive(j, "reason");
            if (!cJSON_IsNumber(id) || !cJSON_IsString(state)) continue;
            int64_t x = (int64_t)id->valuedouble;
            if (x <= 0 || x >= g_jobs_cap || !g_jobs[x].acked) continue;
            seen[x] = 1;
            found++;
            int s = 0;
            while (s < 6 && strcmp(STATES[s], state->valuestring) != 0) s++;
            by_state[s]++;
            if (s == 0) {
                if (cJSON_IsString(reason) && reason->valuestring[0]) queued_reason++;
                else queued_noreason++;
            }
            if (s == 4 || s == 5 || s == 6) {
                failed++;
                if (!first_bad[0])
                    snprintf(first_bad, sizeof first_bad, "job %" PRId64 " %s: %.180s", x, state->valuestring,
                             cJSON_IsString(reason) ? reason->valuestring : "");
            }
        }
        const cJSON *nb = cJSON_GetObjectItemCaseSensitive(o, "next_before");
        before = cJSON_IsNumber(nb) ? (long)nb->valuedouble : 0;
        cJSON_Delete(o);
        if (!before) break;
    }
    for (int64_t i = 1; i < g_jobs_cap; i++)
        if (g_jobs[i].acked && !seen[i]) lost++;
    free(seen);
    int ready = 0, nodes = 0;
    {
        buf b = {0};
        long code = get_blocking("/api/v1/cluster", opt.admin, &b);
        cJSON *o = code == 200 ? cJSON_Parse(b.p ? b.p : "") : NULL;
        free(b.p);
        if (!o) die("GET /api/v1/cluster answered %ld", code);
        const cJSON *n;
        cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(o, "nodes")) {
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(n, "hostname");
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(n, "state");
            if (!cJSON_IsString(h) || strncmp(h->valuestring, "sim-", 4) != 0) continue;
            nodes++;
            ready += cJSON_IsString(s) && strcmp(s->valuestring, "ready") == 0;
        }
        cJSON_Delete(o);
    }

    /* 6. the figures */
    histo pa, pb, ha, hb2, qa, qb;
    histo_read(m0.p, "trainyard_scheduler_pass_duration_seconds", NULL, &pa);
    histo_read(m1.p, "trainyard_scheduler_pass_duration_seconds", NULL, &pb);
    histo_read(m0.p, "trainyard_http_request_duration_seconds", "route=\"/api/v1/nodes/{id}/heartbeat\"", &ha);
    histo_read(m1.p, "trainyard_http_request_duration_seconds", "route=\"/api/v1/nodes/{id}/heartbeat\"", &hb2);
    histo_read(m0.p, "trainyard_http_request_duration_seconds", "route=\"/api/v1/jobs\",", &qa);
    histo_read(m1.p, "trainyard_http_request_duration_seconds", "route=\"/api/v1/jobs\",", &qb);
    double passes, hbs, subs;
    double pass50 = histo_quant(&pa, &pb, 0.5, &passes), pass99 = histo_quant(&pa, &pb, 0.99, &passes);
    double shb50 = histo_quant(&ha, &hb2, 0.5, &hbs), shb99 = histo_quant(&ha, &hb2, 0.99, &hbs);
    double sub50 = histo_quant(&qa, &qb, 0.5, &subs), sub99 = histo_quant(&qa, &qb, 0.99, &subs);
    free(m0.p);
    free(m1.p);
    qsort(g_assign_lat.v, g_assign_lat.n, sizeof(int64_t), cmp_i64);
    qsort(g_first_lat.v, g_first_lat.n, sizeof(int64_t), cmp_i64);
    qsort(g_hb_lat.v, g_hb_lat.n, sizeof(int64_t), cmp_i64);
    qsort(g_submit_lat.v, g_submit_lat.n, sizeof(int64_t), cmp_i64);
    uint64_t errors = 0;
    for (int k = 0; k < NKIND; k++) errors += st.fail[k];
    printf("{\"agents\":%d,\"registered\":%d,\"register_s\":%.1f,\"nodes_in_cluster\":%d,\"ready_in_cluster\":%d,"
           "\"window_s\":%.1f,\"rate\":%g,\"submitted\":%" PRIu64 ",\"acknowledged\":%" PRIu64 ","
           "\"submit_to_assignment_ms\":{\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f,\"gangs\":%zu},"
           "\"submit_to_first_task_ms\":{\"p50\":%.1f,\"p99\":%.1f},\"agent_rest\":\"%s\","
           "\"submit_ms\":{\"p50\":%.2f,\"p99\":%.2f},"
           "\"sched_pass_ms\":{\"p50\":%.2f,\"p99\":%.2f,\"passes\":%.0f},"
           "\"heartbeats_per_s\":%.1f,\"heartbeat_ms\":{\"p50\":%.2f,\"p99\":%.2f},"
           "\"server_heartbeat_ms\":{\"p50\":%.2f,\"p99\":%.2f,\"per_s\":%.1f},"
           "\"server_submit_ms\":{\"p50\":%.2f,\"p99\":%.2f},"
           "\"server_cpu_cores\":%.3f,\"server_rss_mb\":%.1f,\"server_peak_rss_mb\":%.1f,\"sim_cpu_cores\":%.3f,"
           "\"tasks_started\":%" PRIu64 ",\"tasks_exited\":%" PRIu64 ",\"stops\":%" PRIu64 ","
           "\"errors\":%" PRIu64 ",\"errors_by_kind\":{",
           opt.agents, registered, reg_s, nodes, ready, win_s, opt.rate, st.submitted, st.acked,
           quant_ms(g_assign_lat.v, g_assign_lat.n, 0.5), quant_ms(g_assign_lat.v, g_assign_lat.n, 0.99),
           g_assign_lat.n ? (double)g_assign_lat.v[g_assign_lat.n - 1] / 1000.0 : -1.0, g_assign_lat.n,
           quant_ms(g_first_lat.v, g_first_lat.n, 0.5), quant_ms(g_first_lat.v, g_first_lat.n, 0.99),
           opt.rest_stops_only ? "stops" : "any",
           quant_ms(g_submit_lat.v, g_submit_lat.n, 0.5), quant_ms(g_submit_lat.v, g_submit_lat.n, 0.99), pass50, pass99,
           passes, (double)st.hb_window / win_s, quant_ms(g_hb_lat.v, g_hb_lat.n, 0.5),
           quant_ms(g_hb_lat.v, g_hb_lat.n, 0.99), shb50, shb99, hbs / win_s, sub50, sub99,
           cpu0 >= 0 && cpu1 >= 0 ? (cpu1 - cpu0) / win_s : -1.0, rss, hwm, (self1 - self0) / win_s, st.starts,
           st.exits_ok, st.stops, errors);
    for (int k = 0; k < NKIND; k++) printf("%s\"%s\":%" PRIu64, k ? "," : "", KIND_NAME[k], st.fail[k]);
    printf("},\"first_error\":");
    {
        cJSON *s = cJSON_CreateString(st.first_error);
        char *p = s ? cJSON_PrintUnformatted(s) : NULL;
        printf("%s", p ? p : "\"\"");
        cJSON_free(p);
        cJSON_Delete(s);
    }
    printf(",\"exit_conflicts\":%" PRIu64 ",\"jobs\":{\"acknowledged\":%" PRIu64 ",\"found\":%" PRIu64
           ",\"lost\":%" PRIu64 ",\"not_yet_assigned_after_drain\":%" PRIu64,
           st.conflict, st.acked, found, lost, waiting);
    for (int s = 0; s < 7; s++) printf(",\"%s\":%" PRIu64, STATES[s], by_state[s]);
    printf(",\"queued_with_reason\":%" PRIu64 ",\"queued_without_reason\":%" PRIu64 "},\"first_failed_job\":", queued_reason,
           queued_noreason);
    {
        cJSON *s = cJSON_CreateString(first_bad);
        char *p = s ? cJSON_PrintUnformatted(s) : NULL;
        printf("%s", p ? p : "\"\"");
        cJSON_free(p);
        cJSON_Delete(s);
    }
    printf("}\n");
    fflush(stdout);
    int ok = errors == 0 && lost == 0 && failed == 0 && queued_noreason == 0 && registered == opt.agents &&
             ready == opt.agents && nodes == opt.agents;
    for (int k = 0; k < g_nmh; k++) curl_multi_cleanup(g_mh[k].m);
    curl_global_cleanup();
    if (g_trace && fclose(g_trace) != 0) die("--trace %s: %s", opt.trace, strerror(errno));
    return ok ? 0 : 1;
}
