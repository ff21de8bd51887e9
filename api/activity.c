/* activity.c - the jobs' activity table and the pass that cancels idle jobs
 * (see activity.h). */
#include "activity.h"
#include "scheduling.h"
#include "../common/util.h"
#include "../server/proxy.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One job's entry. Entries are allocated one by one: a relay's hook holds
 * a pointer to its job's entry (proxy_target.activity_cls), so an entry is
 * freed only when no relay is left and no handler is between
 * activity_proxy_begin and activity_proxy_end. */
typedef struct act {
    struct server *srv;
    int64_t job;
    int64_t last_ms;  /* unix ms of the last activity (atomic: the hook writes it unlocked) */
    int attached;     /* shells attached now (under g_mu) */
} act;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static act **g_tab;                /* (g_n) in no order */
static int g_n, g_cap;
static int g_pending;              /* handlers between _begin and _end (under g_mu) */
static struct server *g_srv;       /* the server the pass last ran for */
static int64_t g_srv_start_ms;     /* when it did first: a restart counts as activity */
static int64_t g_next_pass_ms;

#define ACTIVITY_PASS_MS 1000      /* the pass runs at most this often */

/* The entry of (srv, job), made when absent. Under g_mu. */
static act *entry(struct server *srv, int64_t job) {
    for (int i = 0; i < g_n; i++)
        if (g_tab[i]->job == job && g_tab[i]->srv == srv) return g_tab[i];
    if (g_n == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 32;
        g_tab = xrealloc(g_tab, (size_t)g_cap * sizeof *g_tab);
    }
    act *a = xcalloc(1, sizeof *a);
    a->srv = srv;
    a->job = job;
    g_tab[g_n++] = a;
    return a;
}

static void stamp(act *a) { __atomic_store_n(&a->last_ms, now_ms(), __ATOMIC_RELAXED); }

void activity_touch(struct server *srv, int64_t job) {
    if (job <= 0) return;
    pthread_mutex_lock(&g_mu);
    stamp(entry(srv, job));
    pthread_mutex_unlock(&g_mu);
}

void activity_attach(struct server *srv, int64_t job, int delta) {
    if (job <= 0) return;
    pthread_mutex_lock(&g_mu);
    act *a = entry(srv, job);
    a->attached += delta;
    if (a->attached < 0) a->attached = 0;
    stamp(a);
    pthread_mutex_unlock(&g_mu);
}

/* The proxy's hook (proxy_target.activity): from a relay thread, at most
 * once a second per relay. */
static void relay_activity(void *cls) { stamp(cls); }

void activity_proxy_begin(struct server *srv, int64_t job, proxy_target *t) {
    pthread_mutex_lock(&g_mu);
    act *a = entry(srv, job);
    stamp(a);
    g_pending++;
    pthread_mutex_unlock(&g_mu);
    t->activity = relay_activity;
    t->activity_cls = a;
}

void activity_proxy_end(void) {
    pthread_mutex_lock(&g_mu);
    g_pending--;
    pthread_mutex_unlock(&g_mu);
}

/* The job's activity now: *last (0 none) and *attached. */
static void activity_of(struct server *srv, int64_t job, int64_t *last, int *attached) {
    *last = 0;
    *attached = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_n; i++)
        if (g_tab[i]->job == job && g_tab[i]->srv == srv) {
            *last = __atomic_load_n(&g_tab[i]->last_ms, __ATOMIC_RELAXED);
            *attached = g_tab[i]->attached;
            break;
        }
    pthread_mutex_unlock(&g_mu);
}

/* Cancels an idle job as a cancel does: the transition (its reason and
 * timeline event) and its tasks asked to stop, in one transaction. */
static void cull(struct server *srv, const store_idle_job *j, int64_t idle_ms) {
    static const char *const FROM[] = {"running", NULL};
    char dur[32], why[64];
    jobspec_idle_text((long)j->idle_timeout_s, dur);
    snprintf(why, sizeof why, "idle for %s", dur);
    if (db_begin(srv->db) < 0) return; /* the next pass tries again */
    int rc = store_job_transition(srv->db, j->id, FROM, "cancelled", "server", why);
    if (rc == STORE_OK && api_job_stop_tasks(srv, j->id, "cancelled") < 0) rc = STORE_ERROR;
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        if (rc != STORE_CONFLICT) log_warn("job %lld: cannot cancel it while idle: database error", (long long)j->id);
        return;
    }
    log_info("job %lld cancelled: %s (idle_timeout %lld s; %.1f s without a request through the proxy or a shell)",
             (long long)j->id, why, (long long)j->idle_timeout_s, (double)idle_ms / 1000.0);
    api_kick_scheduler(srv);
}

/* Forgets the entries of srv's jobs that are not in `keep` (running with a
 * timeout), have no shell attached and were not touched in the last
 * minute, when no relay can point at them. */
static void prune(struct server *srv, const store_idle_job *keep, int nk) {
    int64_t now = now_ms();
    pthread_mutex_lock(&g_mu);
    /* read under g_mu: a handler that left activity_proxy_end before has
     * its relay counted already, one that has not is in g_pending; read
     * twice, as a relay moving between its two counts may show in neither
     * for one read */
    proxy_stats ps, ps2;
    proxy_stats_get(&ps);
    proxy_stats_get(&ps2);
    if (g_pending == 0 && ps.http + ps.websocket + ps2.http + ps2.websocket == 0) {
        for (int i = 0; i < g_n;) {
            act *a = g_tab[i];
            int kept = a->srv != srv || a->attached > 0 ||
                       now - __atomic_load_n(&a->last_ms, __ATOMIC_RELAXED) < 60000;
            for (int k = 0; !kept && k < nk; k++) kept = keep[k].id == a->job;
            if (kept) {
                i++;
                continue;
            }
            free(a);
            g_tab[i] = g_tab[--g_n];
        }
    }
    pthread_mutex_unlock(&g_mu);
}

void api_activity_tick(struct server *srv) {
    int64_t now = now_ms();
    if (srv != g_srv) {
        g_srv = srv;
        g_srv_start_ms = now;
        g_next_pass_ms = 0;
    }
    if (now < g_next_pass_ms) return;
    g_next_pass_ms = now + ACTIVITY_PASS_MS;
    store_idle_job *jobs = NULL;
    int n = 0;
    if (store_jobs_idle_watched(srv->db, &jobs, &n) != STORE_OK) return;
    for (int i = 0; i < n; i++) {
        int64_t last = 0;
        int attached = 0;
        activity_of(srv, jobs[i].id, &last, &attached);
        if (attached > 0) continue;
        if (last < jobs[i].started_ms) last = jobs[i].started_ms;
        if (last < g_srv_start_ms) last = g_srv_start_ms;
        if (now - last >= jobs[i].idle_timeout_s * 1000) cull(srv, &jobs[i], now - last);
    }
    prune(srv, jobs, n);
    free(jobs);
}
