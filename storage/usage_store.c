/* usage_store.c - usage accounting over tasks, jobs, job_events and the
 * storage tables. See usage_store.h. */
#include "usage_store.h"
#include "cluster.h"
#include "store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

/* ================================================================ days */

static int64_t day_floor(int64_t t) {
    int64_t d = t / USAGE_DAY_MS;
    if (t % USAGE_DAY_MS < 0) d--; /* before 1970: still the midnight at or before t */
    return d * USAGE_DAY_MS;
}

int usage_split_days(int64_t a, int64_t b, int64_t *day, int64_t *ms, int cap) {
    int n = 0;
    for (int64_t t = a; t < b;) {
        int64_t d = day_floor(t), next = d + USAGE_DAY_MS;
        int64_t end = next < b ? next : b;
        if (n >= cap) return -1;
        day[n] = d;
        ms[n] = end - t;
        n++;
        t = end;
    }
    return n;
}

/* ================================================================ SQL */

static const char SQL_TEAMS[] = "SELECT id, name FROM teams WHERE ?1 = 0 OR id = ?1 ORDER BY id";
/* The tasks that overlap [from, to): a task that exited without a finish
 * time (none should) ends where it began; a live one ends now. */
static const char SQL_TASKS[] =
    "SELECT t.job_id, j.team_id, j.name, j.created_at, t.created_at,"
    " coalesce(t.finished_at, CASE WHEN t.state = 'exited' THEN t.created_at ELSE ?3 END), t.gpus, t.cpus,"
    " coalesce(j.user_id, 0), u.name"
    " FROM tasks t JOIN jobs j ON j.id = t.job_id LEFT JOIN users u ON u.id = j.user_id"
    " WHERE t.created_at < ?2"
    " AND coalesce(t.finished_at, CASE WHEN t.state = 'exited' THEN t.created_at ELSE ?3 END) >= ?1"
    " AND (?4 = 0 OR j.team_id = ?4)";
static const char SQL_FIRST_PLACED[] = "SELECT min(created_at) FROM tasks WHERE job_id = ?1";
static const char SQL_PREEMPTS[] =
    "SELECT ts FROM job_events WHERE job_id = ?1 AND kind = 'preempt' AND ts >= ?2 AND ts < ?3";
static const char SQL_ENDED[] =
    "SELECT j.id, j.team_id, j.name, j.state, j.finished_at, coalesce(j.user_id, 0), u.name"
    " FROM jobs j LEFT JOIN users u ON u.id = j.user_id"
    " WHERE j.finished_at >= ?1 AND j.finished_at < ?2 AND j.state IN ('succeeded', 'failed', 'cancelled')"
    " AND (?3 = 0 OR j.team_id = ?3)";
static const char SQL_LOG_BYTES[] =
    "SELECT team_id, sum(log_bytes) FROM jobs WHERE ?1 = 0 OR team_id = ?1 GROUP BY team_id";
static const char SQL_CKPT_BYTES[] =
    "SELECT j.team_id, sum(c.size) FROM checkpoints c JOIN jobs j ON j.id = c.job_id"
    " WHERE c.deleted_at IS NULL AND (?1 = 0 OR j.team_id = ?1) GROUP BY j.team_id";
static const char SQL_CTX_BYTES[] =
    "SELECT team_id, sum(bytes) FROM contexts WHERE ?1 = 0 OR team_id = ?1 GROUP BY team_id";

/* ================================================================ rows */

typedef struct team_name {
    int64_t id;
    char name[64];
} team_name;

typedef struct dvec {
    double *v;
    int n, cap;
} dvec;

typedef struct run_pair {
    int row;
    int64_t job;
} run_pair;

typedef struct job_seen {
    int64_t id, team_id, created_at, user_id;
    char name[256];
    char user[64];
} job_seen;

/* Who a row is of: the job, its submitter (by user; 0 = a team's service
 * token or the admin), and the submitter's name. */
typedef struct row_who {
    int64_t job;
    const char *job_name;
    int64_t user;
    const char *user_name;
} row_who;

typedef struct acc {
    usage_by by;
    team_name *teams;
    int n_teams;
    usage_row *rows;
    dvec *waits;                 /* per row */
    int n, cap;
    int *slots;                  /* open addressing: row index + 1, 0 empty */
    size_t n_slots;
    run_pair *runs;
    int n_runs, cap_runs;
    job_seen *jobs;
    int n_jobs, cap_jobs;
    dvec all_waits;
} acc;

static void dvec_add(dvec *d, double x) {
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 8;
        d->v = xrealloc(d->v, (size_t)d->cap * sizeof *d->v);
    }
    d->v[d->n++] = x;
}

static const char *team_of(const acc *a, int64_t id) {
    int lo = 0, hi = a->n_teams - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (a->teams[mid].id == id) return a->teams[mid].name;
        if (a->teams[mid].id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return "?";
}

static uint64_t key_hash(int64_t t, int64_t j, int64_t d) {
    uint64_t h = (uint64_t)t * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)j + 0x632BE59BD9B4E019ULL + (h << 6) + (h >> 2);
    h ^= (uint64_t)d + 0x94D049BB133111EBULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return h * 0xBF58476D1CE4E5B9ULL;
}

/* The row's second key: its job (by job) or its user (by user). */
static int64_t row_key2(const usage_row *r, usage_by by) { return by == USAGE_BY_USER ? r->user_id : r->job_id; }

static int row_equal(const usage_row *r, usage_by by, int64_t t, int64_t j, int64_t d) {
    return r->team_id == t && row_key2(r, by) == j && r->day == d;
}

static void slots_grow(acc *a) {
    size_t ns = a->n_slots ? a->n_slots * 2 : 64;
    int *s = xcalloc(ns, sizeof *s);
    for (int i = 0; i < a->n; i++) {
        const usage_row *r = &a->rows[i];
        size_t k = key_hash(r->team_id, row_key2(r, a->by), r->day) & (ns - 1);
        while (s[k]) k = (k + 1) & (ns - 1);
        s[k] = i + 1;
    }
    free(a->slots);
    a->slots = s;
    a->n_slots = ns;
}

/* The row of (team, job or user, day) by the report's grouping, made on first use. */
static int row_of(acc *a, int64_t team, const row_who *w, int64_t t) {
    int64_t job = w ? w->job : 0;
    const char *job_name = w ? w->job_name : NULL;
    int64_t j = a->by == USAGE_BY_JOB ? job : a->by == USAGE_BY_USER && w ? w->user : 0;
    int64_t d = a->by == USAGE_BY_DAY ? day_floor(t) : 0;
    if ((size_t)(a->n + 1) * 2 > a->n_slots) slots_grow(a);
    size_t k = key_hash(team, j, d) & (a->n_slots - 1);
    while (a->slots[k]) {
        int i = a->slots[k] - 1;
        if (row_equal(&a->rows[i], a->by, team, j, d)) return i;
        k = (k + 1) & (a->n_slots - 1);
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 16;
        a->rows = xrealloc(a->rows, (size_t)a->cap * sizeof *a->rows);
        a->waits = xrealloc(a->waits, (size_t)a->cap * sizeof *a->waits);
    }
    usage_row *r = &a->rows[a->n];
    memset(r, 0, sizeof *r);
    memset(&a->waits[a->n], 0, sizeof a->waits[a->n]);
    r->team_id = team;
    r->day = d;
    snprintf(r->team, sizeof r->team, "%s", team_of(a, team));
    if (a->by == USAGE_BY_USER) {
        r->user_id = j;
        snprintf(r->user, sizeof r->user, "%s", w && w->user_name ? w->user_name : "");
    } else {
        r->job_id = j;
        if (j && job_name) snprintf(r->job_name, sizeof r->job_name, "%s", job_name);
    }
    a->slots[k] = a->n + 1;
    return a->n++;
}

static void run_add(acc *a, int row, int64_t job) {
    if (a->n_runs == a->cap_runs) {
        a->cap_runs = a->cap_runs ? a->cap_runs * 2 : 64;
        a->runs = xrealloc(a->runs, (size_t)a->cap_runs * sizeof *a->runs);
    }
    a->runs[a->n_runs++] = (run_pair){row, job};
}

static void job_add(acc *a, int64_t id, int64_t team, int64_t created_at, const char *name, int64_t user,
                    const char *user_name) {
    if (a->n_jobs == a->cap_jobs) {
        a->cap_jobs = a->cap_jobs ? a->cap_jobs * 2 : 64;
        a->jobs = xrealloc(a->jobs, (size_t)a->cap_jobs * sizeof *a->jobs);
    }
    job_seen *j = &a->jobs[a->n_jobs++];
    j->id = id;
    j->team_id = team;
    j->created_at = created_at;
    j->user_id = user;
    snprintf(j->name, sizeof j->name, "%s", name ? name : "");
    snprintf(j->user, sizeof j->user, "%s", user_name ? user_name : "");
}

static int cmp_run(const void *x, const void *y) {
    const run_pair *a = x, *b = y;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return a->job < b->job ? -1 : a->job > b->job;
}

static int cmp_job(const void *x, const void *y) {
    const job_seen *a = x, *b = y;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static usage_by g_sort_by; /* for cmp_row: qsort has no context argument */

static int cmp_row(const void *x, const void *y) {
    const usage_row *a = x, *b = y;
    if (g_sort_by == USAGE_BY_JOB) return a->job_id < b->job_id ? -1 : a->job_id > b->job_id;
    if (g_sort_by == USAGE_BY_DAY && a->day != b->day) return a->day < b->day ? -1 : 1;
    int c = strcmp(a->team, b->team);
    if (c) return c;
    if (g_sort_by == USAGE_BY_USER && (c = strcmp(a->user, b->user)) != 0) return c;
    return a->team_id < b->team_id ? -1 : a->team_id > b->team_id;
}

/* The median (the mean of the middle two of an even count) and the 95th
 * percentile (nearest rank: the smallest value with 95% at or below it). */
static void waits_summary(dvec *w, usage_row *r) {
    r->n_waits = w->n;
    if (w->n == 0) return;
    qsort(w->v, (size_t)w->n, sizeof *w->v, cmp_double);
    int n = w->n;
    r->wait_median_s = n % 2 ? w->v[n / 2] : (w->v[n / 2 - 1] + w->v[n / 2]) / 2;
    int k = (int)ceil(0.95 * n) - 1;
    r->wait_p95_s = w->v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static void acc_free(acc *a) {
    for (int i = 0; i < a->n; i++) free(a->waits[i].v);
    free(a->waits);
    free(a->slots);
    free(a->runs);
    free(a->jobs);
    free(a->teams);
    free(a->all_waits.v);
    free(a->rows);
}

/* ================================================================ passes */

static int load_teams(db *d, acc *a, int64_t team_id) {
    db_stmt *st = db_prepare(d, SQL_TEAMS);
    if (!st) return -1;
    db_bind_int64(st, 1, team_id);
    int cap = 0, rc;
    while ((rc = db_step(st)) == DB_ROW) {
        if (a->n_teams == cap) {
            cap = cap ? cap * 2 : 16;
            a->teams = xrealloc(a->teams, (size_t)cap * sizeof *a->teams);
        }
        team_name *t = &a->teams[a->n_teams++];
        t->id = db_col_int64(st, 0);
        const char *nm = db_col_text(st, 1);
        snprintf(t->name, sizeof t->name, "%s", nm ? nm : "");
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

#define SPLIT_MAX 512 /* days of one clipped task: the API allows 400 */

static int scan_tasks(db *d, acc *a, int64_t from, int64_t to, int64_t now, int64_t team_id) {
    db_stmt *st = db_prepare(d, SQL_TASKS);
    if (!st) return -1;
    db_bind_int64(st, 1, from);
    db_bind_int64(st, 2, to);
    db_bind_int64(st, 3, now);
    db_bind_int64(st, 4, team_id);
    int rc;
    int64_t day[SPLIT_MAX], ms[SPLIT_MAX];
    while ((rc = db_step(st)) == DB_ROW) {
        int64_t job = db_col_int64(st, 0), team = db_col_int64(st, 1);
        const char *name = db_col_text(st, 2);
        int64_t submitted = db_col_int64(st, 3);
        int64_t s = db_col_int64(st, 4), e = db_col_int64(st, 5);
        int64_t gpus = db_col_int64(st, 6), cpus = db_col_int64(st, 7);
        const row_who who = {job, name, db_col_int64(st, 8), db_col_text(st, 9)};
        if (e > now) e = now;            /* a clock stepped back: nothing past now */
        if (s < from) s = from;
        if (e > to) e = to;
        job_add(a, job, team, submitted, name, who.user, who.user_name);
        int n = e > s ? usage_split_days(s, e, day, ms, a->by == USAGE_BY_DAY ? SPLIT_MAX : 1) : 0;
        if (n < 0) { /* one piece for the whole interval when days do not matter */
            day[0] = s;
            ms[0] = e - s;
            n = 1;
        }
        if (n == 0) {                    /* an instant inside the window: the job still ran in it */
            run_add(a, row_of(a, team, &who, s), job);
            continue;
        }
        for (int i = 0; i < n; i++) {
            int r = row_of(a, team, &who, day[i]);
            a->rows[r].gpu_s += (double)(gpus * ms[i]) / 1000.0;
            a->rows[r].cpu_s += (double)(cpus * ms[i]) / 1000.0;
            run_add(a, r, job);
        }
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

/* Per job seen: its wait (when first placed in the window) and its preemptions. */
static int scan_jobs(db *d, acc *a, int64_t from, int64_t to) {
    if (a->n_jobs > 1) qsort(a->jobs, (size_t)a->n_jobs, sizeof *a->jobs, cmp_job);
    int u = 0;
    for (int i = 0; i < a->n_jobs; i++)
        if (u == 0 || a->jobs[u - 1].id != a->jobs[i].id) a->jobs[u++] = a->jobs[i];
    a->n_jobs = u;
    for (int i = 0; i < a->n_jobs; i++) {
        const job_seen *j = &a->jobs[i];
        const row_who who = {j->id, j->name, j->user_id, j->user};
        db_stmt *st = db_prepare(d, SQL_FIRST_PLACED);
        if (!st) return -1;
        db_bind_int64(st, 1, j->id);
        int rc = db_step(st);
        int64_t first = rc == DB_ROW ? db_col_int64(st, 0) : 0;
        db_done(st);
        if (rc != DB_ROW) return -1;
        if (first >= from && first < to) {
            double w = (double)(first - j->created_at) / 1000.0;
            if (w < 0) w = 0;
            int r = row_of(a, j->team_id, &who, first); /* before a->waits is read: it may move */
            dvec_add(&a->waits[r], w);
            dvec_add(&a->all_waits, w);
        }
        if (!(st = db_prepare(d, SQL_PREEMPTS))) return -1;
        db_bind_int64(st, 1, j->id);
        db_bind_int64(st, 2, from);
        db_bind_int64(st, 3, to);
        while ((rc = db_step(st)) == DB_ROW) {
            int r = row_of(a, j->team_id, &who, db_col_int64(st, 0));
            a->rows[r].jobs.preempted++;
        }
        db_done(st);
        if (rc != DB_DONE) return -1;
    }
    return 0;
}

static int scan_ended(db *d, acc *a, int64_t from, int64_t to, int64_t team_id) {
    db_stmt *st = db_prepare(d, SQL_ENDED);
    if (!st) return -1;
    db_bind_int64(st, 1, from);
    db_bind_int64(st, 2, to);
    db_bind_int64(st, 3, team_id);
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        const char *name = db_col_text(st, 2), *state = db_col_text(st, 3);
        const row_who who = {db_col_int64(st, 0), name, db_col_int64(st, 5),
                             db_col_text(st, 6)};
        int ri = row_of(a, db_col_int64(st, 1), &who, db_col_int64(st, 4));
        usage_row *r = &a->rows[ri];
        if (!state) continue;
        if (strcmp(state, "succeeded") == 0) r->jobs.succeeded++;
        else if (strcmp(state, "failed") == 0) r->jobs.failed++;
        else r->jobs.cancelled++;
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

/* One of the storage sums per team into the team rows (by team only). */
static int scan_storage(db *d, acc *a, const char *sql, int64_t team_id, int which) {
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    db_bind_int64(st, 1, team_id);
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        int ri = row_of(a, db_col_int64(st, 0), NULL, 0);
        usage_row *r = &a->rows[ri];
        int64_t v = db_col_int64(st, 1);
        if (which == 0) r->logs_bytes = v;
        else if (which == 1) r->checkpoints_bytes = v;
        else r->contexts_bytes = v;
    }
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

int usage_query(db *d, int64_t from, int64_t to, int64_t now, usage_by by, int64_t team_id, usage_report *out) {
    memset(out, 0, sizeof *out);
    acc a;
    memset(&a, 0, sizeof a);
    a.by = by;
    /* one read transaction: every sum sees the same committed state */
    if (cluster_read_begin(d) < 0) return STORE_ERROR;
    int ok = load_teams(d, &a, team_id) == 0;
    if (ok && by == USAGE_BY_TEAM)
        for (int i = 0; i < a.n_teams; i++) row_of(&a, a.teams[i].id, NULL, 0);
    ok = ok && scan_tasks(d, &a, from, to, now, team_id) == 0;
    ok = ok && scan_jobs(d, &a, from, to) == 0;
    ok = ok && scan_ended(d, &a, from, to, team_id) == 0;
    if (ok && by == USAGE_BY_TEAM)
        ok = scan_storage(d, &a, SQL_LOG_BYTES, team_id, 0) == 0 && scan_storage(d, &a, SQL_CKPT_BYTES, team_id, 1) == 0 &&
             scan_storage(d, &a, SQL_CTX_BYTES, team_id, 2) == 0;
    if (cluster_read_end(d) < 0) ok = 0;
    if (!ok) {
        acc_free(&a);
        return STORE_ERROR;
    }
    /* jobs run: distinct jobs per row, and in all (a job belongs to one team) */
    if (a.n_runs > 1) qsort(a.runs, (size_t)a.n_runs, sizeof *a.runs, cmp_run);
    for (int i = 0; i < a.n_runs; i++)
        if (i == 0 || a.runs[i].row != a.runs[i - 1].row || a.runs[i].job != a.runs[i - 1].job)
            a.rows[a.runs[i].row].jobs.run++;
    usage_row *t = &out->total;
    memset(t, 0, sizeof *t);
    t->jobs.run = a.n_jobs;
    for (int i = 0; i < a.n; i++) {
        usage_row *r = &a.rows[i];
        waits_summary(&a.waits[i], r);
        t->gpu_s += r->gpu_s;
        t->cpu_s += r->cpu_s;
        t->jobs.succeeded += r->jobs.succeeded;
        t->jobs.failed += r->jobs.failed;
        t->jobs.cancelled += r->jobs.cancelled;
        t->jobs.preempted += r->jobs.preempted;
        t->logs_bytes += r->logs_bytes;
        t->checkpoints_bytes += r->checkpoints_bytes;
        t->contexts_bytes += r->contexts_bytes;
    }
    waits_summary(&a.all_waits, t);
    g_sort_by = by;
    if (a.n > 1) qsort(a.rows, (size_t)a.n, sizeof *a.rows, cmp_row);
    out->rows = a.rows;
    out->n_rows = a.n;
    a.rows = NULL;
    acc_free(&a);
    return STORE_OK;
}

void usage_report_release(usage_report *r) {
    free(r->rows);
    memset(r, 0, sizeof *r);
}
