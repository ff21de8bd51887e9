/* core.c - one scheduling pass over an in-memory snapshot: queue order
 * (guarantee, aged priority, weighted fair share of teams, then of the
 * users within a team, age), all-or-nothing gang
 * placement (fewest nodes, best fit), EASY backfill behind one reservation,
 * and preemption of whole gangs. Pure: no I/O, no clock. See core.h.
 *
 * Speed comes from per-kind free-block histograms: nodes sit in buckets by
 * their free device count, so "does it fit now" is a sum over at most
 * max-devices-per-node buckets and a best-fit node is the first non-empty
 * bucket at or above the need. */
#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define PORT_WORDS 16            /* 1024 ports per node at most */
#define GUARANTEE_ATTEMPTS 4

/* ================================================================ config */

void sched_config_default(sched_config *c)
{
    memset(c, 0, sizeof *c);
    c->backfill = 1;
    c->preemption = 1;
    c->aging_s = 600.0;            /* +1 priority per 10 minutes waited */
    c->aging_max = 100;
    c->usage_window_s = 3600.0;
    c->usage_blend = 0.5;
    c->heartbeat_timeout_ms = 30000;
    c->preempt_grace_ms = 30000;
    c->port_base = 7001;
    c->port_count = 1000;
    c->tick_ms = 1000;
    c->resize_interval_ms = 30000;
}

double sched_usage_decay(double usage, double in_use, double dt_s, double tau_s)
{
    if (dt_s <= 0) return usage;
    if (tau_s <= 0) return in_use * dt_s;
    double e = exp(-dt_s / tau_s);
    return usage * e + in_use * tau_s * (1.0 - e);
}

int sched_job_devices(const sched_job *j)
{
    return j->workers * j->devices_per_worker;
}

int64_t sched_task_mem(const sched_node *n, const sched_job *j, int type)
{
    if (j->mem_mb > 0) return j->mem_mb;
    int k = type ? SCHED_CPU : j->kind, d = type ? 1 : j->devices_per_worker;
    if (n->mem_mb <= 0 || n->n_dev[k] <= 0) return 0;
    return n->mem_mb * d / n->n_dev[k];
}

/* ================================================================ result */

void sched_result_init(sched_result *r)
{
    memset(r, 0, sizeof *r);
}

void sched_result_release(sched_result *r)
{
    free(r->place);
    free(r->tasks);
    free(r->dev_ids);
    free(r->stops);
    free(r->grows);
    free(r->out);
    free(r->order);
    free(r->user_use);
    memset(r, 0, sizeof *r);
}

#define GROW(arr, n, cap)                                                   \
    do {                                                                    \
        if ((n) >= (cap)) {                                                 \
            (cap) = (cap) ? (cap) * 2 : 64;                                 \
            (arr) = xrealloc((arr), (size_t)(cap) * sizeof *(arr));         \
        }                                                                   \
    } while (0)

static const char *kind_name(int k)
{
    return k == SCHED_GPU ? "gpu" : "cpu";
}

void sched_reason_format(const sched_outcome *o, char *out, size_t cap)
{
    const char *k = kind_name(o->kind);
    int rc = 0;
    switch (o->why) {
    case SW_NONE:
        rc = sfmt(out, cap, "%s", o->place >= 0 ? "placed" : "");
        break;
    case SW_NO_NODES:
        rc = sfmt(out, cap, "no nodes have joined");
        break;
    case SW_RUNTIME:
        rc = sfmt(out, cap,
                  "infeasible: its image (environment.image) needs a node whose agent runs podman; "
                  "none of the %lld ready node%s does (GET /cluster: runtimes)",
                  (long long)o->b, o->b == 1 ? "" : "s");
        break;
    case SW_WIDE:
        rc = sfmt(out, cap, "infeasible: a worker needs %lld %s on one node; the largest node has %lld",
                  (long long)o->a, k, (long long)o->b);
        break;
    case SW_LARGE:
        rc = sfmt(out, cap, "infeasible: needs %lld workers x %lld %s; the cluster can hold %lld such workers",
                  (long long)o->a, (long long)o->c, k, (long long)o->b);
        break;
    case SW_PS_INFEASIBLE:
        rc = sfmt(out, cap, "infeasible: needs %lld cpu slots for parameter servers; the cluster has %lld",
                  (long long)o->a, (long long)o->b);
        break;
    case SW_QUOTA:
        if (o->a >= o->b)
            rc = sfmt(out, cap, "team quota %lld/%lld", (long long)o->a, (long long)o->b);
        else
            rc = sfmt(out, cap, "team quota %lld/%lld; needs %lld", (long long)o->a,
                      (long long)o->b, (long long)o->c);
        break;
    case SW_BLOCK:
        rc = sfmt(out, cap, "needs %lld %s on one node; largest free block is %lld",
                  (long long)o->a, k, (long long)o->b);
        break;
    case SW_GANG:
        rc = sfmt(out, cap, "needs %lld workers x %lld %s; only %lld fit now",
                  (long long)o->c, (long long)o->a, k, (long long)o->b);
        break;
    case SW_PS:
        rc = sfmt(out, cap, "needs %lld cpu slots for parameter servers; %lld free",
                  (long long)o->a, (long long)o->b);
        break;
    case SW_RESERVED:
        rc = sfmt(out, cap, "reserved for job %lld", (long long)o->a);
        break;
    case SW_PREEMPTING:
        rc = sfmt(out, cap, "waiting for %lld preempted job%s to stop", (long long)o->a,
                  o->a == 1 ? "" : "s");
        break;
    case SW_MEM:
        rc = sfmt(out, cap, "needs %lld MiB on one node for a %s; the most free on a ready node is %lld MiB",
                  (long long)o->a, o->c ? "parameter server" : "worker", (long long)o->b);
        break;
    case SW_MEM_GANG:
        rc = sfmt(out, cap, "needs %lld workers with %lld MiB each; only %lld fit in the free memory now",
                  (long long)o->c, (long long)o->a, (long long)o->b);
        break;
    case SW_MEM_WIDE:
        rc = sfmt(out, cap, "infeasible: asks %lld MiB per task; the largest node offers %lld MiB",
                  (long long)o->a, (long long)o->b);
        break;
    case SW_INTERACTIVE:
        rc = sfmt(out, cap, "the team's %lld interactive job%s %s running (max_interactive %lld)",
                  (long long)o->a, o->a == 1 ? "" : "s", o->a == 1 ? "is" : "are", (long long)o->b);
        break;
    case SW_KEPT_INTERACTIVE:
        if (o->a == 1)
            rc = sfmt(out, cap,
                      "needs the devices of interactive job %lld, which is not preempted while its team is "
                      "within its guarantee", (long long)o->b);
        else
            rc = sfmt(out, cap,
                      "needs the devices of %lld interactive jobs (job %lld, ...), which are not preempted "
                      "while their teams are within their guarantees", (long long)o->a, (long long)o->b);
        break;
    default:
        rc = sfmt(out, cap, "waiting");
        break;
    }
    (void)rc; /* truncation is acceptable for a human-readable reason */
}

/* ================================================================ state */

typedef struct hold {            /* a running job's devices on one node */
    int node, kind, count;
} hold;

typedef struct memhold {         /* a running job's memory on one node */
    int node;
    int64_t mb;
} memhold;

typedef struct undo {            /* one device taken by a tentative placement */
    int node, kind, pos, port;
    int64_t mem;                 /* memory taken with it (the task's first entry) */
} undo;

typedef struct resv {            /* the head job's reservation at time T */
    int active;
    int ji;                      /* queued index */
    int kind, w, workers, ps;
    int64_t T;                   /* 0: unknown */
    int *fT[SCHED_KINDS];        /* (n_nodes) free devices at T */
    int64_t S;                   /* sum over usable nodes of fT[kind]/w */
    int64_t cpuT;                /* free cpu slots at T on usable nodes */
    uint8_t *avoid;              /* (n_nodes) nodes the head may not use */
    int64_t *memT;               /* (n_nodes) free memory at T (nodes that report it) */
    const sched_job *job;        /* the head */
} resv;

typedef struct core {
    const sched_snapshot *s;
    const sched_config *cfg;
    sched_result *r;
    int nn;
    int maxcap[SCHED_KINDS];
    int *free_[SCHED_KINDS];     /* (nn) free devices per node */
    uint8_t *held[SCHED_KINDS];  /* per node, per device: 1 held (a node's once held_ok) */
    int *held_off[SCHED_KINDS];  /* (nn) offset of node's devices in held */
    uint8_t *held_ok[SCHED_KINDS]; /* (nn) 1: the node's held flags are filled (held_of) */
    int64_t largest_cap[SCHED_KINDS]; /* the largest ready node's devices of a kind */
    int64_t cpu_cap;             /* cpu slots of all ready nodes */
    int64_t *wcap[SCHED_KINDS];  /* (maxcap+1) workers of width w all ready nodes hold */
    int *bprev[SCHED_KINDS], *bnext[SCHED_KINDS]; /* (nn) bucket lists */
    int *bhead[SCHED_KINDS];     /* (maxcap+1) first ready node with that free count */
    int64_t *cnt[SCHED_KINDS];   /* (maxcap+1) ready nodes with that free count */
    int64_t *capcnt[SCHED_KINDS];/* (maxcap+1) ready nodes with that capacity */
    int64_t total_free[SCHED_KINDS];
    int64_t total_cap_all;       /* all devices of ready nodes (fair share scale) */
    uint64_t gen[SCHED_KINDS];
    uint64_t *capgen[SCHED_KINDS];
    int64_t *capval[SCHED_KINDS];
    uint64_t *ports;             /* (nn * PORT_WORDS) */
    uint8_t *avoid;              /* (nn) marks for the job being considered */
    int64_t *node_ids_sorted;    /* (nn) */
    int *node_idx_sorted;        /* (nn) */
    /* memory: free MiB per node (nodes with mem_mb > 0), and whether any
     * ready node reports memory (when none does, memory is never checked) */
    int64_t *mem_free;           /* (nn) */
    int mem_on;
    /* running jobs */
    int *hold_off;               /* (n_running + 1) */
    hold *holds;
    int *memh_off;               /* (n_running + 1) */
    memhold *memh;
    uint8_t *stopping;           /* (n_running) including victims of this pass */
    int64_t *run_end;            /* (n_running) expected release time */
    /* teams */
    double *inuse;               /* (n_teams) devices held */
    int *n_inter;                /* (n_teams) interactive jobs running (not stopping) or
                                  * placed by this pass */
    double *wnorm;               /* (n_teams) weight / sum of weights */
    double sum_usage;
    /* users: one slot per (team, user) the snapshot names, found through
     * an open-addressing table (uh: slot + 1, 0 empty) */
    int n_us, cap_us;
    int *us_team;                /* (cap_us) */
    int64_t *us_user;
    double *us_inuse;            /* devices held, updated by the pass's placements */
    double *us_usage;            /* decayed usage (sched_user) */
    double *us_key;              /* the fair-share key (user_key), kept current */
    int *uh; size_t uh_cap;      /* power of two */
    int last_slot;               /* the slot found last (jobs come in runs of one user) */
    double *tu_usage;            /* (n_teams) the usage of the team's users, summed */
    uint8_t *tmulti;             /* (n_teams) 1: its queued jobs belong to more than one user */
    int any_multi;               /* some team's do */
    int *jslot;                  /* (n_queued) a queued job's user slot, for the jobs of
                                  * tmulti teams only (NULL when none) */
    /* tentative placement */
    undo *ulog; int n_ulog, cap_ulog;
    uint8_t starving[SCHED_KINDS]; /* a queued job waits for devices of this kind */
    int *mark; int mark_gen;     /* (nn) distinct-node counting */
    resv hv;
} core;

/* ---------------------------------------------------------------- buckets */

static void bucket_remove(core *c, int k, int i)
{
    int f = c->free_[k][i];
    if (c->bprev[k][i] >= 0) c->bnext[k][c->bprev[k][i]] = c->bnext[k][i];
    else c->bhead[k][f] = c->bnext[k][i];
    if (c->bnext[k][i] >= 0) c->bprev[k][c->bnext[k][i]] = c->bprev[k][i];
    c->cnt[k][f]--;
}

static void bucket_insert(core *c, int k, int i)
{
    int f = c->free_[k][i];
    c->bprev[k][i] = -1;
    c->bnext[k][i] = c->bhead[k][f];
    if (c->bhead[k][f] >= 0) c->bprev[k][c->bhead[k][f]] = i;
    c->bhead[k][f] = i;
    c->cnt[k][f]++;
}

/* Changes node i's free count of kind k by delta, keeping buckets right. */
static void node_move(core *c, int k, int i, int delta)
{
    if (c->s->nodes[i].ready) bucket_remove(c, k, i);
    c->free_[k][i] += delta;
    if (c->s->nodes[i].ready) {
        bucket_insert(c, k, i);
        c->total_free[k] += delta;
        c->gen[k]++;
    }
}

/* Workers of width w that fit now on all ready nodes (histogram sum). */
static int64_t cap_w(core *c, int k, int w)
{
    if (w <= 0 || w > c->maxcap[k]) return 0;
    if (c->capgen[k][w] == c->gen[k] + 1) return c->capval[k][w];
    int64_t sum = 0;
    for (int f = w; f <= c->maxcap[k]; f++) sum += c->cnt[k][f] * (f / w);
    c->capgen[k][w] = c->gen[k] + 1;
    c->capval[k][w] = sum;
    return sum;
}

static int largest_free(core *c, int k)
{
    for (int f = c->maxcap[k]; f > 0; f--)
        if (c->cnt[k][f] > 0) return f;
    return 0;
}

static int node_index(const core *c, int64_t id)
{
    int lo = 0, hi = c->nn - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c->node_ids_sorted[mid] == id) return c->node_idx_sorted[mid];
        if (c->node_ids_sorted[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Node i cannot run job j's tasks: it lacks the runtime j needs. */
static int lacks_runtime(const core *c, const sched_job *j, int i)
{
    int have = c->s->nodes[i].runtimes ? c->s->nodes[i].runtimes : SCHED_RT_HOST;
    return j->runtime && !(have & j->runtime);
}

static int in_avoid(const sched_job *j, int64_t id)
{
    for (int a = 0; a < j->n_avoid; a++)
        if (j->avoid[a] == id) return 1;
    return 0;
}

/* Marks the nodes j may not use: those it failed on twice, and (a job with
 * an image) those without its runtime. */
static void avoid_set(core *c, const sched_job *j, uint8_t *marks, uint8_t v)
{
    for (int a = 0; a < j->n_avoid; a++) {
        int i = node_index(c, j->avoid[a]);
        if (i >= 0) marks[i] = v;
    }
    if (j->runtime)
        for (int i = 0; i < c->nn; i++)
            if (lacks_runtime(c, j, i)) marks[i] = v;
}

/* ---------------------------------------------------------------- init */

typedef struct idpair { int64_t id; int idx; } idpair;

static int idpair_cmp(const void *a, const void *b)
{
    const idpair *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* By id; the snapshot's nodes and running jobs mostly come in id order
 * already (the mirror's), so a pass over them often does. */
static void idpair_sort(idpair *v, int n)
{
    for (int i = 1; i < n; i++)
        if (v[i].id < v[i - 1].id) {
            qsort(v, (size_t)n, sizeof *v, idpair_cmp);
            return;
        }
}

static int run_index(const idpair *map, int n, int64_t id)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (map[mid].id == id) return map[mid].idx;
        if (map[mid].id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static void core_release(core *c)
{
    for (int k = 0; k < SCHED_KINDS; k++) {
        free(c->free_[k]); free(c->held[k]); free(c->held_off[k]); free(c->held_ok[k]); free(c->wcap[k]);
        free(c->bprev[k]); free(c->bnext[k]); free(c->bhead[k]);
        free(c->cnt[k]); free(c->capcnt[k]); free(c->capgen[k]); free(c->capval[k]);
        free(c->hv.fT[k]);
    }
    free(c->hv.avoid); free(c->hv.memT);
    free(c->mem_free); free(c->memh_off); free(c->memh);
    free(c->ports); free(c->avoid); free(c->node_ids_sorted); free(c->node_idx_sorted);
    free(c->hold_off); free(c->holds); free(c->stopping); free(c->run_end);
    free(c->inuse); free(c->n_inter); free(c->wnorm); free(c->ulog); free(c->mark);
    free(c->us_team); free(c->us_user); free(c->us_inuse); free(c->us_usage); free(c->us_key);
    free(c->uh); free(c->tu_usage); free(c->tmulti); free(c->jslot);
}

/* ---------------------------------------------------------------- users */

static size_t user_hash(int team, int64_t user)
{
    uint64_t h = (uint64_t)user * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)team * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

/* user_slot's search in the table. */
static int user_slot_find(core *c, int team, int64_t user)
{
    if ((size_t)(c->n_us + 1) * 2 > c->uh_cap) {   /* grow the table, and the slots */
        size_t cap = c->uh_cap ? c->uh_cap * 2 : 64;
        int *uh = xcalloc(cap, sizeof(int));
        for (int x = 0; x < c->n_us; x++) {
            size_t h = user_hash(c->us_team[x], c->us_user[x]) & (cap - 1);
            while (uh[h]) h = (h + 1) & (cap - 1);
            uh[h] = x + 1;
        }
        free(c->uh);
        c->uh = uh; c->uh_cap = cap;
        c->cap_us = (int)(cap / 2);
        c->us_team = xrealloc(c->us_team, (size_t)c->cap_us * sizeof *c->us_team);
        c->us_user = xrealloc(c->us_user, (size_t)c->cap_us * sizeof *c->us_user);
        c->us_inuse = xrealloc(c->us_inuse, (size_t)c->cap_us * sizeof *c->us_inuse);
        c->us_usage = xrealloc(c->us_usage, (size_t)c->cap_us * sizeof *c->us_usage);
        c->us_key = xrealloc(c->us_key, (size_t)c->cap_us * sizeof *c->us_key);
    }
    size_t h = user_hash(team, user) & (c->uh_cap - 1);
    for (; c->uh[h]; h = (h + 1) & (c->uh_cap - 1)) {
        int x = c->uh[h] - 1;
        if (c->us_team[x] == team && c->us_user[x] == user) return c->last_slot = x;
    }
    int x = c->n_us++;
    c->uh[h] = x + 1;
    c->us_team[x] = team; c->us_user[x] = user;
    c->us_inuse[x] = 0; c->us_usage[x] = 0; c->us_key[x] = 0;
    return c->last_slot = x;
}

/* The slot of (team, user), made (in use 0, usage 0) when new. Runs of one
 * user (the common case) cost one comparison. */
static inline int user_slot(core *c, int team, int64_t user)
{
    int ls = c->last_slot;
    if (ls >= 0 && c->us_team[ls] == team && c->us_user[ls] == user) return ls;
    return user_slot_find(c, team, user);
}

double sched_user_key(double in_use, double usage, double team_users_usage, double cap_all, double blend)
{
    double inuse = cap_all > 0 ? in_use / cap_all : 0;
    double use = team_users_usage > 0 ? usage / team_users_usage : 0;
    return blend * inuse + (1.0 - blend) * use;
}

static double user_key(const core *c, int x)
{
    return sched_user_key(c->us_inuse[x], c->us_usage[x], c->tu_usage[c->us_team[x]], (double)c->total_cap_all,
                          c->cfg->usage_blend);
}

/* The users' slots: usage from the snapshot's users, devices in use from
 * its running jobs (reported in r->user_use); the teams whose queued jobs
 * belong to more than one user, and their jobs' slots (only there does the
 * user level choose anything). 0, or -1 when a user names a team out of
 * range. */
static int users_init(core *c)
{
    const sched_snapshot *s = c->s;
    int nt = s->n_teams;
    c->last_slot = -1;
    c->tu_usage = xcalloc((size_t)(nt > 0 ? nt : 1), sizeof(double));
    c->tmulti = xcalloc((size_t)(nt > 0 ? nt : 1), 1);
    for (int u = 0; u < s->n_users; u++) {
        const sched_user *su = &s->users[u];
        if (su->team < 0 || su->team >= nt) return -1;
        double v = su->usage > 0 ? su->usage : 0;
        int x = user_slot(c, su->team, su->user);   /* may move the arrays: first */
        c->us_usage[x] += v;
        c->tu_usage[su->team] += v;
    }
    for (int i = 0; i < s->n_running; i++) {
        int x = user_slot(c, s->running[i].team, s->running[i].user);
        c->us_inuse[x] += s->running[i].devices;
    }
    int held = 0;
    for (int x = 0; x < c->n_us; x++) held += c->us_inuse[x] > 0;
    sched_result *r = c->r;
    r->user_use = xcalloc((size_t)(held > 0 ? held : 1), sizeof *r->user_use);
    for (int x = 0; x < c->n_us; x++)
        if (c->us_inuse[x] > 0)
            r->user_use[r->n_user_use++] = (sched_user_use){c->us_team[x], c->us_user[x], (int)c->us_inuse[x]};
    /* which teams have queued jobs of more than one user */
    int64_t *first = xmalloc((size_t)(nt > 0 ? nt : 1) * sizeof *first);
    uint8_t *seen = xcalloc((size_t)(nt > 0 ? nt : 1), 1);
    for (int q = 0; q < s->n_queued; q++) {
        int t = s->queued[q].team;
        if (!seen[t]) { seen[t] = 1; first[t] = s->queued[q].user; }
        else if (s->queued[q].user != first[t]) c->tmulti[t] = 1;
    }
    free(first); free(seen);
    for (int t = 0; t < nt; t++) c->any_multi |= c->tmulti[t];
    if (c->any_multi) {
        c->jslot = xmalloc((size_t)s->n_queued * sizeof(int));
        for (int q = 0; q < s->n_queued; q++)
            c->jslot[q] = c->tmulti[s->queued[q].team] ? user_slot(c, s->queued[q].team, s->queued[q].user) : -1;
    }
    for (int x = 0; x < c->n_us; x++) c->us_key[x] = user_key(c, x);
    return 0;
}

static int core_init(core *c, const sched_snapshot *s, const sched_config *cfg, sched_result *r)
{
    memset(c, 0, sizeof *c);
    c->s = s; c->cfg = cfg; c->r = r;
    int nn = c->nn = s->n_nodes;
    size_t nz = nn > 0 ? (size_t)nn : 1;
    for (int k = 0; k < SCHED_KINDS; k++) {
        int mc = 0;
        size_t tot = 0;
        for (int i = 0; i < nn; i++) {
            if (s->nodes[i].n_dev[k] > mc) mc = s->nodes[i].n_dev[k];
            tot += (size_t)s->nodes[i].n_dev[k];
        }
        c->maxcap[k] = mc;
        c->free_[k] = xcalloc(nz, sizeof(int));
        c->held_off[k] = xcalloc(nz, sizeof(int));
        c->held[k] = xcalloc(tot ? tot : 1, 1);
        c->held_ok[k] = xcalloc(nz, 1);
        c->wcap[k] = xcalloc((size_t)mc + 1, sizeof(int64_t));
        c->bprev[k] = xcalloc(nz, sizeof(int));
        c->bnext[k] = xcalloc(nz, sizeof(int));
        c->bhead[k] = xmalloc((size_t)(mc + 1) * sizeof(int));
        for (int f = 0; f <= mc; f++) c->bhead[k][f] = -1;
        c->cnt[k] = xcalloc((size_t)mc + 1, sizeof(int64_t));
        c->capcnt[k] = xcalloc((size_t)mc + 1, sizeof(int64_t));
        c->capgen[k] = xcalloc((size_t)mc + 1, sizeof(uint64_t));
        c->capval[k] = xcalloc((size_t)mc + 1, sizeof(int64_t));
        c->hv.fT[k] = xcalloc(nz, sizeof(int));
    }
    c->hv.avoid = xcalloc(nz, 1);
    c->hv.memT = xcalloc(nz, sizeof(int64_t));
    c->mem_free = xcalloc(nz, sizeof(int64_t));
    c->ports = xcalloc(nz * PORT_WORDS, sizeof(uint64_t));
    c->avoid = xcalloc(nz, 1);
    c->mark = xcalloc(nz, sizeof(int));
    c->node_ids_sorted = xmalloc(nz * sizeof(int64_t));
    c->node_idx_sorted = xmalloc(nz * sizeof(int));

    idpair *np = xmalloc(nz * sizeof *np);
    for (int i = 0; i < nn; i++) { np[i].id = s->nodes[i].id; np[i].idx = i; }
    idpair_sort(np, nn);
    for (int i = 0; i < nn; i++) { c->node_ids_sorted[i] = np[i].id; c->node_idx_sorted[i] = np[i].idx; }
    free(np);

    /* running jobs: id -> index */
    int nr = s->n_running;
    size_t nrz = nr > 0 ? (size_t)nr : 1;
    idpair *rm = xmalloc(nrz * sizeof *rm);
    for (int i = 0; i < nr; i++) {
        rm[i].id = s->running[i].id; rm[i].idx = i;
        if (s->running[i].team < 0 || s->running[i].team >= s->n_teams) { free(rm); return -1; }
    }
    idpair_sort(rm, nr);
    c->stopping = xcalloc(nrz, 1);
    c->run_end = xcalloc(nrz, sizeof(int64_t));
    c->hold_off = xcalloc(nrz + 1, sizeof(int));
    for (int i = 0; i < nr; i++) c->stopping[i] = (uint8_t)(s->running[i].stopping != 0);

    /* devices: free counts and per-job holdings, one entry per (job, node,
     * kind) in the order of kind, node, first device; from the node's
     * summary when it has one (sched_node.sum), else from its devices. The
     * held flags are filled per node when a task is placed there (held_of). */
    int *last_node = xmalloc(nrz * sizeof(int));
    int *last_kind = xmalloc(nrz * sizeof(int));
    int *last_pos = xmalloc(nrz * sizeof(int));
    for (int i = 0; i < nr; i++) last_node[i] = -1;
    hold *tr = NULL;
    int *tr_run = NULL, ntr = 0, cap_tr = 0, cap_run = 0;
    for (int k = 0; k < SCHED_KINDS; k++) {
        int off = 0;
        for (int i = 0; i < nn; i++) {
            const sched_node *nd = &s->nodes[i];
            c->held_off[k][i] = off;
            off += nd->n_dev[k];
            if (nd->sum) {
                c->free_[k][i] = nd->n_free[k];
                for (int x = 0; x < nd->n_holds; x++) {
                    const sched_hold *hd = &nd->holds[x];
                    if (hd->kind != k) continue;
                    int ri = run_index(rm, nr, hd->job_id);
                    if (ri < 0) continue;  /* unknown holder: held, never released */
                    GROW(tr, ntr, cap_tr);
                    if (cap_run < cap_tr) { cap_run = cap_tr; tr_run = xrealloc(tr_run, (size_t)cap_run * sizeof(int)); }
                    tr[ntr] = (hold){i, k, hd->count};
                    tr_run[ntr++] = ri;
                }
                continue;
            }
            int fr = 0;
            for (int d = 0; d < nd->n_dev[k]; d++) {
                int64_t jid = nd->dev[k][d].job_id;
                if (jid == 0) { fr++; continue; }
                int ri = run_index(rm, nr, jid);
                if (ri < 0) continue;      /* unknown holder: held, never released */
                if (last_node[ri] != i || last_kind[ri] != k) {
                    GROW(tr, ntr, cap_tr);
                    if (cap_run < cap_tr) { cap_run = cap_tr; tr_run = xrealloc(tr_run, (size_t)cap_run * sizeof(int)); }
                    tr[ntr] = (hold){i, k, 0};
                    tr_run[ntr] = ri;
                    last_node[ri] = i; last_kind[ri] = k; last_pos[ri] = ntr++;
                }
                tr[last_pos[ri]].count++;
            }
            c->free_[k][i] = fr;
        }
    }
    for (int x = 0; x < ntr; x++) c->hold_off[tr_run[x] + 1]++;
    for (int i = 0; i < nr; i++) c->hold_off[i + 1] += c->hold_off[i];
    c->holds = xcalloc((size_t)c->hold_off[nr] + 1, sizeof(hold));
    int *fill = xcalloc(nrz, sizeof(int));
    for (int x = 0; x < ntr; x++) c->holds[c->hold_off[tr_run[x]] + fill[tr_run[x]]++] = tr[x];
    free(fill); free(last_node); free(last_kind); free(last_pos); free(tr); free(tr_run);

    /* memory: free per node, and each running job's memory per node */
    c->memh_off = xcalloc(nrz + 1, sizeof(int));
    int nmh = 0;
    for (int i = 0; i < nn; i++) {
        const sched_node *nd = &s->nodes[i];
        int64_t used = 0;
        for (int m = 0; m < nd->n_mem; m++) {
            used += nd->mem[m].mb;
            int ri = run_index(rm, nr, nd->mem[m].job_id);
            if (ri >= 0) { c->memh_off[ri + 1]++; nmh++; }
        }
        c->mem_free[i] = nd->mem_mb > 0 ? nd->mem_mb - used : 0;
        if (nd->mem_mb > 0 && nd->ready) c->mem_on = 1;
    }
    for (int i = 0; i < nr; i++) c->memh_off[i + 1] += c->memh_off[i];
    c->memh = xcalloc((size_t)nmh + 1, sizeof(memhold));
    int *mfill = xcalloc(nrz, sizeof(int));
    for (int i = 0; i < nn; i++) {
        const sched_node *nd = &s->nodes[i];
        for (int m = 0; m < nd->n_mem; m++) {
            int ri = run_index(rm, nr, nd->mem[m].job_id);
            if (ri >= 0) c->memh[c->memh_off[ri] + mfill[ri]++] = (memhold){i, nd->mem[m].mb};
        }
    }
    free(mfill); free(rm);

    /* buckets and capacity histograms over ready nodes */
    for (int i = 0; i < nn; i++) {
        const sched_node *nd = &s->nodes[i];
        for (int k = 0; k < SCHED_KINDS; k++) {
            c->bprev[k][i] = c->bnext[k][i] = -1;
            if (!nd->ready) continue;
            bucket_insert(c, k, i);
            c->total_free[k] += c->free_[k][i];
            c->capcnt[k][nd->n_dev[k]]++;
            c->total_cap_all += nd->n_dev[k];
        }
        int base = cfg->port_base;
        for (int p = 0; p < nd->n_ports; p++) {
            int b = nd->ports[p] - base;
            if (b >= 0 && b < PORT_WORDS * 64) c->ports[(size_t)i * PORT_WORDS + b / 64] |= 1ull << (b % 64);
        }
    }

    /* what the ready nodes hold when empty: fixed for the pass
     * (feasible_ready reads it for every job) */
    for (int k = 0; k < SCHED_KINDS; k++) {
        for (int f = c->maxcap[k]; f > 0; f--)
            if (c->capcnt[k][f] > 0) { c->largest_cap[k] = f; break; }
        for (int w = 1; w <= c->maxcap[k]; w++)
            for (int f = w; f <= c->maxcap[k]; f++) c->wcap[k][w] += c->capcnt[k][f] * (f / w);
    }
    for (int f = 1; f <= c->maxcap[SCHED_CPU]; f++) c->cpu_cap += c->capcnt[SCHED_CPU][f] * f;

    /* teams */
    int nt = s->n_teams;
    size_t ntz = nt > 0 ? (size_t)nt : 1;
    c->inuse = xcalloc(ntz, sizeof(double));
    c->n_inter = xcalloc(ntz, sizeof(int));
    c->wnorm = xcalloc(ntz, sizeof(double));
    double sw = 0;
    for (int t = 0; t < nt; t++) {
        sw += s->teams[t].weight > 0 ? s->teams[t].weight : 0;
        c->sum_usage += s->teams[t].usage > 0 ? s->teams[t].usage : 0;
    }
    for (int t = 0; t < nt; t++) {
        double w = s->teams[t].weight > 0 ? s->teams[t].weight : 1e-9;
        c->wnorm[t] = sw > 0 ? w / sw : 1.0;
    }
    int64_t grace = cfg->preempt_grace_ms;
    for (int i = 0; i < nr; i++) {
        const sched_running *rj = &s->running[i];
        c->inuse[rj->team] += rj->devices;
        if (rj->interactive && !rj->stopping) c->n_inter[rj->team]++;
        int64_t e = rj->end_ms;
        if (rj->stopping || e < s->now_ms + grace) e = s->now_ms + grace;
        c->run_end[i] = e;
    }
    return users_init(c);
}

/* ---------------------------------------------------------------- placement */

static int port_take(core *c, int i)
{
    uint64_t *w = &c->ports[(size_t)i * PORT_WORDS];
    int n = c->cfg->port_count;
    if (n > PORT_WORDS * 64) n = PORT_WORDS * 64;
    for (int b = 0; b < n; b++) {
        if (!(w[b / 64] & (1ull << (b % 64)))) {
            w[b / 64] |= 1ull << (b % 64);
            return b;
        }
    }
    return -1;
}

static void port_give(core *c, int i, int b)
{
    c->ports[(size_t)i * PORT_WORDS + b / 64] &= ~(1ull << (b % 64));
}

/* Memory a task of j needs on node i that the node must have free: 0 when
 * the node does not report memory (nothing to check there). */
static int64_t mem_need(const core *c, int i, const sched_job *j, int type)
{
    const sched_node *nd = &c->s->nodes[i];
    if (nd->mem_mb <= 0) return 0;
    return sched_task_mem(nd, j, type);
}

/* Workers of j that fit on node i now, by its devices and its memory. */
static int64_t node_cap(const core *c, int i, const sched_job *j)
{
    int64_t f = c->free_[j->kind][i] / j->devices_per_worker;
    int64_t need = mem_need(c, i, j, 0);
    if (need > 0) {
        int64_t m = c->mem_free[i] > 0 ? c->mem_free[i] / need : 0;
        if (m < f) f = m;
    }
    return f;
}

/* Does a task of j fit node i now by memory (a ps, type 1), or `want`
 * workers by devices and memory (type 0)? */
static int fits_task(const core *c, int i, const sched_job *j, int type, int want)
{
    if (type) {
        int64_t need = mem_need(c, i, j, 1);
        return need <= 0 || c->mem_free[i] >= need;
    }
    return node_cap(c, i, j) >= want;
}

/* Node i's held flags of kind k (1: held by a job or taken in this pass),
 * filled from its devices the first time a task is placed there. */
static uint8_t *held_of(core *c, int k, int i)
{
    uint8_t *h = &c->held[k][c->held_off[k][i]];
    if (!c->held_ok[k][i]) {
        const sched_node *nd = &c->s->nodes[i];
        for (int d = 0; d < nd->n_dev[k]; d++) h[d] = nd->dev[k][d].job_id != 0;
        c->held_ok[k][i] = 1;
    }
    return h;
}

/* Adds one task of j on node i taking n devices of kind k, and its memory.
 * -1 when no port or not enough memory. */
static int task_add(core *c, const sched_job *j, int type, int index, int i, int k, int n)
{
    sched_result *r = c->r;
    int64_t need = mem_need(c, i, j, type);
    if (need > 0 && c->mem_free[i] < need) return -1;
    int pb = port_take(c, i);
    if (pb < 0) return -1;
    GROW(r->tasks, r->n_tasks, r->cap_tasks);
    sched_task *t = &r->tasks[r->n_tasks++];
    t->type = type; t->index = index; t->node = i; t->node_id = c->s->nodes[i].id;
    t->port = c->cfg->port_base + pb; t->kind = k; t->n_dev = n; t->dev_off = r->n_dev;
    t->mem_mb = sched_task_mem(&c->s->nodes[i], j, type);
    c->mem_free[i] -= need;
    const sched_node *nd = &c->s->nodes[i];
    uint8_t *h = held_of(c, k, i);
    int got = 0, first = 1;
    for (int d = 0; d < nd->n_dev[k] && got < n; d++) {
        if (h[d]) continue;
        h[d] = 1;
        GROW(r->dev_ids, r->n_dev, r->cap_dev);
        r->dev_ids[r->n_dev++] = nd->dev[k][d].id;
        GROW(c->ulog, c->n_ulog, c->cap_ulog);
        c->ulog[c->n_ulog++] = (undo){i, k, d, first ? pb : -1, first ? need : 0};
        first = 0;
        got++;
    }
    if (first) {                  /* no device taken: the task still owns its port and memory */
        GROW(c->ulog, c->n_ulog, c->cap_ulog);
        c->ulog[c->n_ulog++] = (undo){i, k, -1, pb, need};
    }
    node_move(c, k, i, -got);
    return got == n ? 0 : -1;
}

/* Reverts every device and port taken since the log was at mark. */
static void undo_to(core *c, int mark, int n_tasks, int n_dev)
{
    while (c->n_ulog > mark) {
        undo u = c->ulog[--c->n_ulog];
        if (u.pos >= 0) {
            c->held[u.kind][c->held_off[u.kind][u.node] + u.pos] = 0;
            node_move(c, u.kind, u.node, +1);
        }
        if (u.port >= 0) port_give(c, u.node, u.port);
        c->mem_free[u.node] += u.mem;
    }
    c->r->n_tasks = n_tasks;
    c->r->n_dev = n_dev;
}

/* First ready, non-avoided node in bucket f of kind k where the task of j
 * fits (fits_task: `want` workers, or a ps), or -1. */
static int bucket_pick(core *c, int k, int f, const sched_job *j, int type, int want)
{
    for (int i = c->bhead[k][f]; i >= 0; i = c->bnext[k][i])
        if (!c->avoid[i] && (!c->mem_on || fits_task(c, i, j, type, want))) return i;
    return -1;
}

/* Why a parameter server of j found no node when CPU slots are free:
 * memory. Fills o (SW_MEM) and returns 1, or 0 when no memory is short. */
static int ps_mem_reason(core *c, const sched_job *j, sched_outcome *o)
{
    int64_t most = INT64_MIN, need_at = 0;
    for (int i = 0; i < c->nn; i++) {
        if (!c->s->nodes[i].ready || c->avoid[i] || c->free_[SCHED_CPU][i] <= 0) continue;
        int64_t need = mem_need(c, i, j, 1);
        if (need <= 0) return 0;
        if (c->mem_free[i] > most) { most = c->mem_free[i]; need_at = need; }
    }
    if (most == INT64_MIN) return 0;
    o->why = SW_MEM; o->a = need_at; o->b = most < 0 ? 0 : most; o->c = 1; o->kind = SCHED_CPU;
    return 1;
}

/* Places job j now: workers packed on as few nodes as possible (the last
 * group best-fit), ps on CPU slots preferring the gang's nodes; each task
 * where its memory fits too. On failure leaves no trace and returns -1;
 * when memory kept a parameter server out, o (may be NULL) says so. */
static int place_job(core *c, int ji, const sched_job *j, sched_outcome *o)
{
    sched_result *r = c->r;
    int mark = c->n_ulog, t0 = r->n_tasks, d0 = r->n_dev;
    int k = j->kind, w = j->devices_per_worker;
    int remaining = j->workers, index = 0;
    while (remaining > 0) {
        int need = remaining * w, node = -1;
        int64_t take = 0;
        for (int f = need; f <= c->maxcap[k] && node < 0; f++) node = bucket_pick(c, k, f, j, 0, remaining);
        if (node >= 0) take = remaining;
        else {
            /* the node that holds the most workers (by memory too) */
            for (int f = c->maxcap[k]; f >= w && f > 0 && f / w > take; f--)
                for (int i = c->bhead[k][f]; i >= 0; i = c->bnext[k][i]) {
                    if (c->avoid[i]) continue;
                    int64_t cap = c->mem_on ? node_cap(c, i, j) : f / w;
                    if (cap > take) { take = cap; node = i; }
                    if (!c->mem_on || take >= f / w) break;
                }
            if (take > remaining) take = remaining;
        }
        if (node < 0 || take <= 0) goto fail;
        for (int t = 0; t < take; t++)
            if (task_add(c, j, 0, index++, node, k, w) < 0) goto fail;
        remaining -= (int)take;
    }
    for (int p = 0; p < j->ps; p++) {
        int node = -1;
        for (int t = t0; t < r->n_tasks && node < 0; t++) {
            int i = r->tasks[t].node;
            if (c->free_[SCHED_CPU][i] > 0 && !c->avoid[i] && (!c->mem_on || fits_task(c, i, j, 1, 1))) node = i;
        }
        for (int f = 1; f <= c->maxcap[SCHED_CPU] && node < 0; f++) node = bucket_pick(c, SCHED_CPU, f, j, 1, 1);
        if (node < 0) {
            if (o && c->mem_on) ps_mem_reason(c, j, o);
            goto fail;
        }
        if (task_add(c, j, 1, p, node, SCHED_CPU, 1) < 0) goto fail;
    }
    GROW(r->place, r->n_place, r->cap_place);
    sched_place *pl = &r->place[r->n_place++];
    pl->job = ji; pl->job_id = j->id; pl->task_off = t0; pl->n_tasks = r->n_tasks - t0; pl->backfill = 0;
    pl->workers = j->workers;
    c->mark_gen++;
    pl->n_nodes = 0;
    for (int t = t0; t < r->n_tasks; t++) {
        int i = r->tasks[t].node;
        if (c->mark[i] != c->mark_gen) { c->mark[i] = c->mark_gen; pl->n_nodes++; }
    }
    return 0;
fail:
    undo_to(c, mark, t0, d0);
    return -1;
}

/* Do the workers of j fit now in devices and memory together (the device
 * histogram said they fit by devices)? A node's share is the lesser of its
 * free devices / w and its free memory / the worker's memory there. 1, or 0
 * with the reason in o. Avoid marks set. */
static int fits_mem(core *c, const sched_job *j, sched_outcome *o)
{
    int64_t cap = 0, best1 = 0, most = INT64_MIN, need_at = 0;
    for (int i = 0; i < c->nn; i++) {
        if (!c->s->nodes[i].ready || c->avoid[i]) continue;
        int64_t ci = node_cap(c, i, j);
        cap += ci;
        if (cap >= j->workers) return 1;
        if (ci > best1) best1 = ci;
        int64_t need = mem_need(c, i, j, 0);
        if (need > 0 && c->free_[j->kind][i] >= j->devices_per_worker && c->mem_free[i] > most) {
            most = c->mem_free[i];
            need_at = need;
        }
    }
    o->kind = j->kind;
    if (best1 > 0) {
        o->why = SW_MEM_GANG; o->a = j->mem_mb > 0 ? j->mem_mb : need_at; o->b = cap; o->c = j->workers;
    } else {
        o->why = SW_MEM; o->a = need_at; o->b = most < 0 ? 0 : most; o->c = 0;
    }
    return 0;
}

/* Does job j fit now? 1 yes; 0 with the reason in o. Avoid marks set. */
static int fits_now(core *c, const sched_job *j, sched_outcome *o)
{
    int k = j->kind, w = j->devices_per_worker;
    int64_t capw = cap_w(c, k, w);
    int64_t cpu = c->total_free[SCHED_CPU];
    for (int a = 0; a < j->n_avoid; a++) {
        int i = node_index(c, j->avoid[a]);
        if (i < 0 || !c->s->nodes[i].ready) continue;
        if (w > 0) capw -= c->free_[k][i] / w;
        cpu -= c->free_[SCHED_CPU][i];
    }
    if (j->runtime)
        for (int i = 0; i < c->nn; i++) {
            if (!c->s->nodes[i].ready || !lacks_runtime(c, j, i) || in_avoid(j, c->s->nodes[i].id)) continue;
            if (w > 0) capw -= c->free_[k][i] / w;
            cpu -= c->free_[SCHED_CPU][i];
        }
    o->kind = k;
    if (capw < j->workers) {
        int lf = largest_free(c, k);
        if (lf < w) { o->why = SW_BLOCK; o->a = w; o->b = lf; }
        else { o->why = SW_GANG; o->a = w; o->b = capw; o->c = j->workers; }
        return 0;
    }
    if (c->mem_on && !fits_mem(c, j, o)) return 0;
    int64_t left = k == SCHED_CPU ? cpu - (int64_t)j->workers * w : cpu;
    if (left < j->ps) { o->why = SW_PS; o->a = j->ps; o->b = left < 0 ? 0 : left; o->kind = SCHED_CPU; return 0; }
    return 1;
}

/* Could j ever run on the ready nodes (avoided excluded)? 1, or 0 with why. */
static int feasible_ready(core *c, const sched_job *j, sched_outcome *o)
{
    int k = j->kind, w = j->devices_per_worker;
    int64_t largest = c->largest_cap[k];
    o->kind = k;
    if (w > largest) { o->why = SW_WIDE; o->a = w; o->b = largest; return 0; }
    int64_t sum = c->wcap[k][w], cpu = c->cpu_cap;
    for (int a = 0; a < j->n_avoid; a++) {
        int i = node_index(c, j->avoid[a]);
        if (i < 0 || !c->s->nodes[i].ready) continue;
        sum -= c->s->nodes[i].n_dev[k] / w;
        cpu -= c->s->nodes[i].n_dev[SCHED_CPU];
    }
    if (j->runtime) {
        int have = 0, ready = 0;
        for (int i = 0; i < c->nn; i++) {
            if (!c->s->nodes[i].ready) continue;
            ready++;
            if (!lacks_runtime(c, j, i)) { have++; continue; }
            if (in_avoid(j, c->s->nodes[i].id)) continue;
            sum -= c->s->nodes[i].n_dev[k] / w;
            cpu -= c->s->nodes[i].n_dev[SCHED_CPU];
        }
        if (!have) { o->why = SW_RUNTIME; o->a = 0; o->b = ready; return 0; }
    }
    if (sum < j->workers) { o->why = SW_LARGE; o->a = j->workers; o->b = sum; o->c = w; return 0; }
    int64_t left = k == SCHED_CPU ? cpu - (int64_t)j->workers * w : cpu;
    if (left < j->ps) { o->why = SW_PS_INFEASIBLE; o->a = j->ps; o->b = left < 0 ? 0 : left; o->kind = SCHED_CPU; return 0; }
    if (c->mem_on && j->mem_mb > 0) {
        /* the whole memory of the ready nodes: a worker where its devices and memory fit */
        int64_t cap = 0, best1 = 0, mem_largest = 0;
        for (int i = 0; i < c->nn && cap < j->workers; i++) {
            const sched_node *nd = &c->s->nodes[i];
            if (!nd->ready || c->avoid[i]) continue;
            int64_t ci = nd->n_dev[k] / w;
            if (nd->mem_mb > 0) {
                if (nd->mem_mb > mem_largest) mem_largest = nd->mem_mb;
                if (nd->mem_mb / j->mem_mb < ci) ci = nd->mem_mb / j->mem_mb;
            }
            cap += ci;
            if (ci > best1) best1 = ci;
        }
        if (cap >= j->workers) return 1;
        if (best1 == 0) { o->why = SW_MEM_WIDE; o->a = j->mem_mb; o->b = mem_largest; return 0; }
        o->why = SW_LARGE; o->a = j->workers; o->b = cap; o->c = w;
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- reservation */

static int resv_fits(const resv *h)
{
    if (h->S < h->workers) return 0;
    int64_t left = h->kind == SCHED_CPU ? h->cpuT - (int64_t)h->workers * h->w : h->cpuT;
    return left >= h->ps;
}

/* The head's workers that fit node i at T: its free devices there / w,
 * and with memory the free memory at T / the worker's memory there. */
static int64_t resv_cap(const core *c, int i)
{
    const resv *h = &c->hv;
    int64_t f = h->fT[h->kind][i] / h->w;
    if (c->mem_on) {
        int64_t need = mem_need(c, i, h->job, 0);
        if (need > 0) {
            int64_t m = h->memT[i] > 0 ? h->memT[i] / need : 0;
            if (m < f) f = m;
        }
    }
    return f;
}

static void resv_add(core *c, int k, int i, int delta)
{
    resv *h = &c->hv;
    int old = h->fT[k][i];
    if (!c->mem_on) {              /* devices alone: the histogram-era arithmetic */
        h->fT[k][i] = old + delta;
        if (!c->s->nodes[i].ready || h->avoid[i]) return;
        if (k == h->kind) h->S += (old + delta) / h->w - old / h->w;
        if (k == SCHED_CPU) h->cpuT += delta;
        return;
    }
    int usable = c->s->nodes[i].ready && !h->avoid[i];
    int64_t cap0 = usable && k == h->kind ? resv_cap(c, i) : 0;
    h->fT[k][i] = old + delta;
    if (!usable) return;
    if (k == h->kind) h->S += resv_cap(c, i) - cap0;
    if (k == SCHED_CPU) h->cpuT += delta;
}

/* Memory at T on node i changes by delta (nodes that report memory). */
static void resv_add_mem(core *c, int i, int64_t delta)
{
    if (!delta || c->s->nodes[i].mem_mb <= 0) return;
    resv *h = &c->hv;
    int usable = c->s->nodes[i].ready && !h->avoid[i];
    int64_t old = usable ? resv_cap(c, i) : 0;
    h->memT[i] += delta;
    if (usable) h->S += resv_cap(c, i) - old;
}

/* A task placed in this pass frees (sign +1) or takes (-1) its devices and
 * memory at T. */
static void resv_task(core *c, const sched_task *t, int sign)
{
    resv_add(c, t->kind, t->node, sign * t->n_dev);
    if (c->mem_on) resv_add_mem(c, t->node, sign * t->mem_mb);
}

/* A running job frees (sign +1) or holds (-1) its devices and memory at T. */
static void resv_hold(core *c, int ri, int sign)
{
    for (int x = c->hold_off[ri]; x < c->hold_off[ri + 1]; x++)
        resv_add(c, c->holds[x].kind, c->holds[x].node, sign * c->holds[x].count);
    if (c->mem_on)
        for (int x = c->memh_off[ri]; x < c->memh_off[ri + 1]; x++)
            resv_add_mem(c, c->memh[x].node, sign * c->memh[x].mb);
}

/* Resets the reservation's free-at-T arrays to free now (+ devices and
 * memory of stopping jobs when with_stopping). */
static void resv_reset(core *c, int with_stopping)
{
    resv *h = &c->hv;
    h->S = 0; h->cpuT = 0;
    for (int i = 0; i < c->nn; i++) h->memT[i] = c->mem_free[i];
    for (int k = 0; k < SCHED_KINDS; k++)
        for (int i = 0; i < c->nn; i++) {
            h->fT[k][i] = 0;
            resv_add(c, k, i, c->free_[k][i]);
        }
    if (with_stopping)
        for (int ri = 0; ri < c->s->n_running; ri++)
            if (c->stopping[ri]) resv_hold(c, ri, +1);
}

typedef struct rel { int64_t t; int run; int place; } rel;

static int rel_cmp(const void *a, const void *b)
{
    const rel *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

/* Earliest time the head fits, releasing running jobs (and jobs placed in
 * this pass) at their expected ends. 0 when it never does. */
static int64_t resv_compute(core *c)
{
    resv *h = &c->hv;
    const sched_snapshot *s = c->s;
    resv_reset(c, 0);
    if (resv_fits(h)) return s->now_ms;
    int n = s->n_running + c->r->n_place;
    rel *ev = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *ev);
    int m = 0;
    for (int ri = 0; ri < s->n_running; ri++) {
        int64_t e = c->stopping[ri] ? s->now_ms + c->cfg->preempt_grace_ms : c->run_end[ri];
        ev[m++] = (rel){e, ri, -1};
    }
    for (int p = 0; p < c->r->n_place; p++) {
        const sched_job *j = &s->queued[c->r->place[p].job];
        ev[m++] = (rel){s->now_ms + j->max_runtime_s * 1000, -1, p};
    }
    qsort(ev, (size_t)m, sizeof *ev, rel_cmp);
    int64_t T = 0;
    for (int e = 0; e < m && !T; e++) {
        if (ev[e].run >= 0) {
            resv_hold(c, ev[e].run, +1);
        } else {
            const sched_place *pl = &c->r->place[ev[e].place];
            for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) resv_task(c, &c->r->tasks[t], +1);
        }
        /* release everything ending at the same instant before checking */
        if (e + 1 < m && ev[e + 1].t == ev[e].t) continue;
        if (resv_fits(h)) T = ev[e].t;
    }
    free(ev);
    return T;
}

/* ---------------------------------------------------------------- preemption */

typedef struct cand { int ri; int64_t lost; int prio; int shrinks; int lend; } cand;

/* An elastic job that may only lend back what it grew into (no priority or
 * guarantee makes it a victim): it keeps its min, so the reservation sees it
 * release all but min workers' devices (sign +1) or hold them again (-1).
 * Counted in devices of the head's width; where they come back is not known
 * (a rejoin goes wherever it fits), so the node-wise arithmetic of resv_hold
 * is corrected by the total. */
static void lend_hold(core *c, int ri, int sign)
{
    const sched_running *v = &c->s->running[ri];
    resv_hold(c, ri, sign);
    int64_t keep = ((int64_t)v->workers_min * v->devices_per_worker + c->hv.w - 1) / c->hv.w;
    c->hv.S -= sign * keep;
}

/* Elastic jobs that can shrink first (they go on running), then least work
 * lost since the last checkpoint, lowest priority, index. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->shrinks != y->shrinks) return y->shrinks - x->shrinks;
    if (x->lost != y->lost) return (x->lost > y->lost) - (x->lost < y->lost);
    if (x->prio != y->prio) return (x->prio > y->prio) - (x->prio < y->prio);
    return (x->ri > y->ri) - (x->ri < y->ri);
}

/* Tries to make room for the head by stopping whole gangs. Returns the
 * number of jobs the head now waits on (new victims + relevant stopping
 * jobs), 0 when preemption cannot help. Interactive jobs whose team is
 * within its guarantee are never victims: when stopping some of them too
 * would have made room, *kept is how many (in the candidates' order) and
 * *kept_id the first's id (else both 0). */
static int preempt_for(core *c, int ji, int guaranteed, int *kept, int64_t *kept_id)
{
    *kept = 0;
    *kept_id = 0;
    const sched_snapshot *s = c->s;
    const sched_job *j = &s->queued[ji];
    resv *h = &c->hv;
    resv_reset(c, 1);
    int stopping = 0;
    for (int ri = 0; ri < s->n_running; ri++) stopping += c->stopping[ri];
    if (resv_fits(h)) return stopping > 0 ? stopping : 0;

    cand *cd = xmalloc((size_t)(s->n_running > 0 ? s->n_running : 1) * sizeof *cd);
    cand *kd = xmalloc((size_t)(s->n_running > 0 ? s->n_running : 1) * sizeof *kd);
    int n = 0, nk = 0;
    for (int ri = 0; ri < s->n_running; ri++) {
        const sched_running *v = &s->running[ri];
        if (c->stopping[ri]) continue;
        int by_prio = v->preemptible && v->priority < j->priority;
        int by_guar = guaranteed && v->team != j->team &&
                      c->inuse[v->team] > s->teams[v->team].guarantee;
        int shrinks = v->workers_min > 0 && v->workers_now > v->workers_min && v->kind == j->kind;
        /* an elastic job above its min lends back to a job of its priority
         * or above what it grew into: it shrinks, never stops whole */
        int lend = !by_prio && !by_guar && shrinks && v->priority <= j->priority;
        if (!by_prio && !by_guar && !lend) continue;
        int64_t since = v->last_checkpoint_ms > 0 ? v->last_checkpoint_ms : v->started_at_ms;
        int64_t lost = s->now_ms - since;
        /* Run:AI's rule: a notebook or a shell within its team's guarantee stays */
        if (v->interactive && c->inuse[v->team] <= s->teams[v->team].guarantee) {
            kd[nk++] = (cand){ri, lost < 0 ? 0 : lost, v->priority, 0, 0};
            continue;
        }
        cd[n++] = (cand){ri, lost < 0 ? 0 : lost, v->priority, shrinks, lend};
    }
    qsort(cd, (size_t)n, sizeof *cd, cand_cmp);
    /* greedy by least work lost, then prune the ones not needed */
    uint8_t *pick = xcalloc((size_t)(n > 0 ? n : 1), 1);
    double *tuse = xmalloc((size_t)(s->n_teams > 0 ? s->n_teams : 1) * sizeof(double));
    memcpy(tuse, c->inuse, (size_t)s->n_teams * sizeof(double));
    int fits = 0, last = -1;
    for (int x = 0; x < n && !fits; x++) {
        const sched_running *v = &s->running[cd[x].ri];
        int by_prio = v->preemptible && v->priority < j->priority;
        if (!by_prio && !cd[x].lend && tuse[v->team] - v->devices < s->teams[v->team].guarantee) continue;
        pick[x] = 1;
        tuse[v->team] -= v->devices;
        if (cd[x].lend) lend_hold(c, cd[x].ri, +1);
        else resv_hold(c, cd[x].ri, +1);
        fits = resv_fits(h);
        last = x;
    }
    if (!fits && nk > 0) {
        /* would the kept ones have made room? (the holds are undone by the
         * caller's resv_compute) */
        qsort(kd, (size_t)nk, sizeof *kd, cand_cmp);
        for (int x = 0; x < nk && !*kept; x++) {
            resv_hold(c, kd[x].ri, +1);
            if (resv_fits(h)) {
                *kept = x + 1;
                *kept_id = s->running[kd[0].ri].id;
            }
        }
    }
    int victims = 0;
    if (fits) {
        for (int x = last; x >= 0; x--) {
            if (!pick[x]) continue;
            if (cd[x].lend) lend_hold(c, cd[x].ri, -1);
            else resv_hold(c, cd[x].ri, -1);
            if (resv_fits(h)) { pick[x] = 0; continue; }
            if (cd[x].lend) lend_hold(c, cd[x].ri, +1);
            else resv_hold(c, cd[x].ri, +1);
        }
        sched_result *r = c->r;
        /* what the head leaves of the victims' devices at T, in devices of
         * its kind: an elastic victim comes back with as many workers as
         * that holds (at least its min, fewer than it has), else waits whole */
        int64_t spare = (h->S - h->workers) * (int64_t)h->w;
        for (int x = 0; x <= last; x++) {
            if (!pick[x]) continue;
            const sched_running *v = &s->running[cd[x].ri];
            c->stopping[cd[x].ri] = 1;
            GROW(r->stops, r->n_stops, r->cap_stops);
            sched_victim *st = &r->stops[r->n_stops++];
            st->running = cd[x].ri; st->job_id = v->id; st->for_job = j->id;
            st->guarantee = !(v->preemptible && v->priority < j->priority) && !cd[x].lend;
            st->lend = cd[x].lend;
            st->shrink_to = 0;
            if (cd[x].lend) {
                /* its min is already kept out of the head's count */
                int64_t more = v->devices_per_worker > 0 ? spare / v->devices_per_worker : 0;
                int64_t keep = v->workers_min + more;
                if (keep >= v->workers_now) keep = v->workers_now - 1;
                if (keep < v->workers_min) keep = v->workers_min;
                st->shrink_to = (int)keep;
                spare -= (keep - v->workers_min) * v->devices_per_worker;
            } else if (cd[x].shrinks && v->devices_per_worker > 0) {
                int64_t keep = spare / v->devices_per_worker;
                if (keep >= v->workers_now) keep = v->workers_now - 1;
                if (keep >= v->workers_min) {
                    st->shrink_to = (int)keep;
                    spare -= keep * v->devices_per_worker;
                }
            }
            victims++;
        }
    }
    free(pick); free(tuse); free(cd); free(kd);
    return victims ? victims + stopping : 0;
}

/* ================================================================ the pass */

typedef struct qkey { int ji; int guar; int eff; int64_t qat; int64_t id; } qkey;

static int qkey_cmp(const void *a, const void *b)
{
    const qkey *x = a, *y = b;
    if (x->guar != y->guar) return y->guar - x->guar;
    if (x->eff != y->eff) return y->eff - x->eff;
    if (x->qat != y->qat) return (x->qat > y->qat) - (x->qat < y->qat);
    return (x->id > y->id) - (x->id < y->id);
}

/* qkey_cmp, for the sort below to inline */
static inline int qkey_less(const qkey *x, const qkey *y)
{
    if (x->guar != y->guar) return x->guar > y->guar;
    if (x->eff != y->eff) return x->eff > y->eff;
    if (x->qat != y->qat) return x->qat < y->qat;
    return x->id < y->id;
}

/* Sorts n keys (distinct ids) by qkey_cmp: the same order qsort gives, in
 * about linear time for a queue whose queued_at mostly grows with its ids
 * (the mirror gives its queue in id order). First a stable counting sort
 * into the (guarantee, aged priority) bands, then within each band, whose
 * keys come in input order: the keys already in (queued_at, id) order stay
 * in place (a greedy ascending run that drops whichever of two neighbours
 * breaks it: a requeued job's later queued_at, a batch submitted
 * meanwhile), the others are sorted apart and merged in. Aged priorities
 * spread wider than the queue is long fall back to qsort. */
static void sort_keys(qkey *keys, int n)
{
    if (n < 2) return;
    int emin = keys[0].eff, emax = keys[0].eff;
    for (int x = 1; x < n; x++) {
        if (keys[x].eff < emin) emin = keys[x].eff;
        if (keys[x].eff > emax) emax = keys[x].eff;
    }
    int64_t span = (int64_t)emax - emin + 1;
    if (span > 4 * (int64_t)n + 1024) {
        qsort(keys, (size_t)n, sizeof *keys, qkey_cmp);
        return;
    }
    /* band b: guarantee first, then higher aged priority first */
    int nb = (int)(2 * span);
    int *bstart = xcalloc((size_t)nb + 1, sizeof(int));
    for (int x = 0; x < n; x++) bstart[(keys[x].guar ? 0 : span) + (emax - keys[x].eff) + 1]++;
    for (int b = 0; b < nb; b++) bstart[b + 1] += bstart[b];
    qkey *tmp = xmalloc((size_t)n * sizeof *tmp);
    int *at = xmalloc(((size_t)nb + 1) * sizeof(int));
    memcpy(at, bstart, ((size_t)nb + 1) * sizeof(int));
    for (int x = 0; x < n; x++) tmp[at[(keys[x].guar ? 0 : span) + (emax - keys[x].eff)]++] = keys[x];
    free(at);
    qkey *rest = xmalloc((size_t)n * sizeof *rest);
    for (int b = 0; b < nb; b++) {
        int lo = bstart[b], hi = bstart[b + 1];
        if (hi - lo < 2) {
            if (hi > lo) keys[lo] = tmp[lo];
            continue;
        }
        /* the run kept in tmp[lo .. lo+nm), the others in rest */
        int nm = 0, nr = 0;
        for (int x = lo; x < hi; x++) {
            const qkey *e = &tmp[x];
            if (nm == 0 || qkey_less(&tmp[lo + nm - 1], e)) { tmp[lo + nm++] = *e; continue; }
            if (nm >= 2 && qkey_less(&tmp[lo + nm - 2], e)) {
                rest[nr++] = tmp[lo + nm - 1];  /* the top broke it: it goes */
                tmp[lo + nm - 1] = *e;
            } else {
                rest[nr++] = *e;
            }
        }
        if (nr > 1) qsort(rest, (size_t)nr, sizeof *rest, qkey_cmp);
        int a = lo, a_end = lo + nm, r = 0, o = lo;
        while (a < a_end && r < nr) keys[o++] = qkey_less(&rest[r], &tmp[a]) ? rest[r++] : tmp[a++];
        while (a < a_end) keys[o++] = tmp[a++];
        while (r < nr) keys[o++] = rest[r++];
    }
    free(rest); free(tmp); free(bstart);
}

static double team_key(const core *c, int t)
{
    const sched_team *tm = &c->s->teams[t];
    double blend = c->cfg->usage_blend;
    double inuse = c->total_cap_all > 0 ? c->inuse[t] / (double)c->total_cap_all : 0;
    double use = c->sum_usage > 0 ? tm->usage / c->sum_usage : 0;
    double k = (blend * inuse + (1.0 - blend) * use) / c->wnorm[t];
    if (c->inuse[t] < tm->guarantee) k -= 1e6;   /* below its guarantee: first */
    return k;
}

/* A team's key kept with the devices in use it was computed from (the key
 * is a function of them; the rest is fixed for the pass). */
typedef struct tkey { double inuse, key; int ok; } tkey;

static double team_key_kept(const core *c, tkey *tk, int t)
{
    if (!tk[t].ok || tk[t].inuse != c->inuse[t]) {
        tk[t].key = team_key(c, t);
        tk[t].inuse = c->inuse[t];
        tk[t].ok = 1;
    }
    return tk[t].key;
}

/* The users of one team within a band: the team's jobs (byteam, in band
 * order) regrouped by user, each user's run [cur, end) still in band order,
 * and a binary heap of the users with jobs left, by (key, then their next
 * job's queued_at and id: the band order). A pick takes the root's next
 * job; placing it can only raise the root's key (its devices in use grow),
 * so the root is sifted down, or removed when its run is done. */
typedef struct userq {
    core *c;
    int *heap;                   /* (n_queued) a team's heap at its tstart */
    int *cnt;                    /* (user slots) zero between builds */
    int *cur, *end;              /* (user slots) */
    int *byteam;
} userq;

static int userq_less(const userq *u, int x, int y)
{
    const core *c = u->c;
    if (c->us_key[x] != c->us_key[y]) return c->us_key[x] < c->us_key[y];
    const sched_job *a = &c->s->queued[u->byteam[u->cur[x]]], *b = &c->s->queued[u->byteam[u->cur[y]]];
    if (a->queued_at_ms != b->queued_at_ms) return a->queued_at_ms < b->queued_at_ms;
    return a->id < b->id;
}

static void userq_down(userq *u, int *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && userq_less(u, h[l], h[m])) m = l;
        if (l + 1 < n && userq_less(u, h[l + 1], h[m])) m = l + 1;
        if (m == i) return;
        int t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

/* Regroups byteam[lo, hi) (one team's jobs of a band) by user and builds
 * its heap at heap[lo]: the number of distinct users, or 0 when there is
 * one (nothing moved, no heap: the caller takes the jobs in order). tmp:
 * scratch of the queue's size. */
static int userq_build(userq *u, int lo, int hi, int *tmp)
{
    const int *js = u->c->jslot;
    int *h = &u->heap[lo], n = 0;
    int first = js[u->byteam[lo]], x = lo + 1;
    while (x < hi && js[u->byteam[x]] == first) x++;
    if (x == hi) return 0;     /* one user: the common case, no regrouping */
    for (x = lo; x < hi; x++) {
        int sl = js[u->byteam[x]];
        if (u->cnt[sl]++ == 0) h[n++] = sl;
    }
    int at = lo;
    for (int k = 0; k < n; k++) {
        int sl = h[k];
        u->cur[sl] = u->end[sl] = at;
        at += u->cnt[sl];
        u->cnt[sl] = 0;
    }
    for (x = lo; x < hi; x++) tmp[u->end[js[u->byteam[x]]]++] = u->byteam[x];
    memcpy(&u->byteam[lo], &tmp[lo], (size_t)(hi - lo) * sizeof(int));
    for (int k = n / 2 - 1; k >= 0; k--) userq_down(u, h, n, k);
    return n;
}

/* Considers one job in order: place it, make it the head, backfill it, or
 * record why it waits. */
/* The most workers of an elastic job (between its min and its max, or its
 * resize target) that fit now and within its team's quota: its view with
 * that many workers in *v. 1, or 0 when not even min fits (o says why, for
 * min). A fixed gang is its own view. */
static int elastic_fit(core *c, const sched_job *j, sched_job *v, sched_outcome *o)
{
    *v = *j;
    int lo = j->workers_min > 0 && j->workers_min < j->workers ? j->workers_min : j->workers;
    int hi = j->resize_to >= lo && j->resize_to < j->workers ? j->resize_to : j->workers;
    const sched_team *tm = &c->s->teams[j->team];
    if (tm->quota >= 0) {
        int64_t room = (tm->quota - (int64_t)c->inuse[j->team]) / j->devices_per_worker;
        if (room < hi) hi = room < lo ? lo : (int)room;
    }
    sched_outcome scratch;
    for (int n = hi; n > lo; n--) {
        v->workers = n;
        memset(&scratch, 0, sizeof scratch);
        if (fits_now(c, v, &scratch)) return 1;
    }
    v->workers = lo;
    return fits_now(c, v, o);
}

/* Queued job ji was placed with `size` devices: its user holds them (what
 * the user level reads: only in teams of several users). */
static void user_took(core *c, int ji, int size)
{
    if (!c->tmulti[c->s->queued[ji].team]) return;
    int x = c->jslot[ji];
    c->us_inuse[x] += size;
    c->us_key[x] = user_key(c, x);
}

static void consider(core *c, int ji, int *preempt_tries)
{
    const sched_snapshot *s = c->s;
    const sched_job *j0 = &s->queued[ji];
    sched_outcome *o = &c->r->out[ji];
    sched_result *r = c->r;
    const sched_team *tm = &s->teams[j0->team];
    /* an elastic job is considered at its min (feasibility, quota, the
     * reservation) and placed with the most workers that fit */
    sched_job view = *j0;
    if (j0->workers_min > 0 && j0->workers_min < j0->workers) view.workers = j0->workers_min;
    const sched_job *j = &view;
    int size = sched_job_devices(j);

    if (s->n_nodes_registered == 0) { o->why = SW_NO_NODES; return; }
    avoid_set(c, j, c->avoid, 1);
    if (!feasible_ready(c, j, o)) goto out;
    if (tm->quota >= 0 && c->inuse[j->team] + size > tm->quota) {
        o->why = SW_QUOTA; o->a = (int64_t)c->inuse[j->team]; o->b = tm->quota; o->c = size;
        goto out;
    }
    if (j0->interactive && tm->limit_interactive && c->n_inter[j->team] >= tm->max_interactive) {
        o->why = SW_INTERACTIVE; o->a = c->n_inter[j->team]; o->b = tm->max_interactive;
        goto out;
    }
    int64_t now = s->now_ms;
    if (!c->hv.active) {
        if (elastic_fit(c, j0, &view, o) && place_job(c, ji, &view, o) == 0) {
            size = sched_job_devices(&view);
            o->why = SW_NONE; o->place = r->n_place - 1;
            c->inuse[j->team] += size;
            if (j0->interactive) c->n_inter[j->team]++;
            user_took(c, ji, size);
            goto out;
        }
        /* the head: reserve, and preempt if that is the only way soon */
        resv *h = &c->hv;
        h->active = 1; h->ji = ji; h->kind = j->kind; h->w = j->devices_per_worker;
        h->workers = j->workers; h->ps = j->ps; h->job = j0;
        memset(h->avoid, 0, (size_t)(c->nn > 0 ? c->nn : 1));
        avoid_set(c, j, h->avoid, 1);
        r->head_job = j->id;
        h->T = resv_compute(c);
        int guaranteed = c->inuse[j->team] + size <= tm->guarantee;
        if (c->cfg->preemption && (h->T == 0 || h->T > now + 2 * c->cfg->preempt_grace_ms) &&
            (*preempt_tries)++ < GUARANTEE_ATTEMPTS) {
            int kept = 0;
            int64_t kept_id = 0;
            int waits = preempt_for(c, ji, guaranteed, &kept, &kept_id);
            if (waits > 0) { o->why = SW_PREEMPTING; o->a = waits; }
            else if (kept > 0) { o->why = SW_KEPT_INTERACTIVE; o->a = kept; o->b = kept_id; }
            h->T = resv_compute(c);
        }
        o->est_start_ms = h->T;
        r->head_start_ms = h->T;
        goto out;
    }
    if (!elastic_fit(c, j0, &view, o)) goto out;
    size = sched_job_devices(&view);
    if (!c->cfg->backfill) { o->why = SW_RESERVED; o->a = r->head_job; goto out; }
    int mark = c->n_ulog, t0 = r->n_tasks, d0 = r->n_dev;
    if (place_job(c, ji, &view, o) != 0) {
        if (o->why != SW_MEM) { o->why = SW_RESERVED; o->a = r->head_job; }
        goto out;
    }
    sched_place *pl = &r->place[r->n_place - 1];
    int64_t end = now + j->max_runtime_s * 1000;
    if (c->hv.T > 0 && end > c->hv.T) {
        for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) resv_task(c, &r->tasks[t], -1);
        if (!resv_fits(&c->hv)) {
            for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) resv_task(c, &r->tasks[t], +1);
            r->n_place--;
            undo_to(c, mark, t0, d0);
            o->why = SW_RESERVED; o->a = r->head_job;
            goto out;
        }
    }
    pl->backfill = 1;
    r->n_backfilled++;
    o->why = SW_NONE; o->place = r->n_place - 1;
    c->inuse[j->team] += size;
    if (j0->interactive) c->n_inter[j->team]++;
    user_took(c, ji, size);
out:
    avoid_set(c, j, c->avoid, 0);
    if (o->place < 0 && o->why != SW_NO_NODES && o->why != SW_WIDE && o->why != SW_LARGE &&
        o->why != SW_PS_INFEASIBLE && o->why != SW_QUOTA && o->why != SW_MEM_WIDE && o->why != SW_RUNTIME &&
        o->why != SW_INTERACTIVE)
        c->starving[o->kind >= 0 && o->kind < SCHED_KINDS ? o->kind : 0] = 1;
}

/* Elastic jobs below their max grow into devices nobody waits for: at most
 * one job per kind and pass, none while a job of that kind is resizing, each
 * at most once per resize interval (may_grow). The job is stopped at a step
 * boundary and placed again with more workers by a later pass. */
static void grow_elastic(core *c)
{
    const sched_snapshot *s = c->s;
    uint8_t busy[SCHED_KINDS] = {0};
    for (int ri = 0; ri < s->n_running; ri++) {
        const sched_running *v = &s->running[ri];
        if (v->workers_min > 0 && c->stopping[ri] && v->kind >= 0 && v->kind < SCHED_KINDS) busy[v->kind] = 1;
    }
    for (int q = 0; q < s->n_queued; q++) {
        const sched_job *j = &s->queued[q];
        if (j->resize_to > 0 && c->r->out[q].place < 0) busy[j->kind] = 1;
    }
    for (int ri = 0; ri < s->n_running; ri++) {
        const sched_running *v = &s->running[ri];
        int k = v->kind, w = v->devices_per_worker;
        if (!v->may_grow || c->stopping[ri] || v->workers_now >= v->workers_max || w < 1) continue;
        if (k < 0 || k >= SCHED_KINDS || c->starving[k] || busy[k]) continue;
        /* workers of its width the free devices hold (the histogram, no
         * walk over the nodes); with memory, the nodes' memory may hold fewer */
        int64_t extra = cap_w(c, k, w);
        if (extra > 0 && c->mem_on) {
            sched_job probe;
            memset(&probe, 0, sizeof probe);
            probe.kind = k; probe.devices_per_worker = w; probe.workers = 1; probe.mem_mb = v->mem_mb;
            extra = 0;
            for (int i = 0; i < c->nn && extra < v->workers_max - v->workers_now; i++)
                if (s->nodes[i].ready) extra += node_cap(c, i, &probe);
        }
        const sched_team *tm = &s->teams[v->team];
        if (tm->quota >= 0) {
            int64_t room = (tm->quota - (int64_t)c->inuse[v->team]) / w;
            if (room < extra) extra = room;
        }
        if (extra <= 0) continue;
        int to = v->workers_now + (int)extra;
        if (to > v->workers_max) to = v->workers_max;
        sched_result *r = c->r;
        GROW(r->grows, r->n_grows, r->cap_grows);
        r->grows[r->n_grows++] = (sched_grow){ri, v->id, v->workers_now, to, (int)c->total_free[k]};
        c->stopping[ri] = 1;
        busy[k] = 1;
    }
}

int sched_pass_core(const sched_snapshot *s, const sched_config *cfg, sched_result *r)
{
    sched_result_release(r);
    int nq = s->n_queued;
    size_t nqz = nq > 0 ? (size_t)nq : 1;
    r->out = xcalloc(nqz, sizeof *r->out);
    r->order = xcalloc(nqz, sizeof(int));
    r->n_out = nq;
    for (int q = 0; q < nq; q++) {
        if (s->queued[q].team < 0 || s->queued[q].team >= s->n_teams ||
            s->queued[q].workers < 1 || s->queued[q].devices_per_worker < 1 ||
            s->queued[q].workers_min < 0 || s->queued[q].workers_min > s->queued[q].workers ||
            s->queued[q].kind < 0 || s->queued[q].kind >= SCHED_KINDS)
            return -1;
    }
    core c;
    if (core_init(&c, s, cfg, r) != 0) { core_release(&c); return -1; }

    qkey *keys = xmalloc(nqz * sizeof *keys);
    for (int q = 0; q < nq; q++) {
        const sched_job *j = &s->queued[q];
        int64_t waited_ms = s->now_ms - j->queued_at_ms;
        int age = 0;
        if (cfg->aging_s > 0 && waited_ms > 0) {
            double pts = (double)waited_ms / 1000.0 / cfg->aging_s;
            age = pts > cfg->aging_max ? cfg->aging_max : (int)pts;
        }
        int guar = c.inuse[j->team] + sched_job_devices(j) <= s->teams[j->team].guarantee;
        keys[q] = (qkey){q, guar, j->priority + age, j->queued_at_ms, j->id};
        r->out[q].eff_priority = j->priority + age;
        r->out[q].place = -1;
    }
    sort_keys(keys, nq);

    /* bands of equal (guarantee, priority): merge teams by fair share, and
     * within a team its users by theirs */
    int nt = s->n_teams;
    size_t ntz = (size_t)(nt > 0 ? nt : 1);
    int *tcount = xcalloc(ntz, sizeof(int));
    int *tstart = xcalloc(ntz + 1, sizeof(int));
    int *tcur = xcalloc(ntz, sizeof(int));
    int *tleft = xcalloc(ntz, sizeof(int));
    int *tusers = xcalloc(ntz, sizeof(int));   /* a team's users' heap size, 0: one user */
    int *active = xcalloc(ntz, sizeof(int));
    int *byteam = xmalloc(nqz * sizeof(int));
    /* the users' level, for teams of several users only */
    int *tmp = NULL;
    userq uq = {&c, NULL, NULL, NULL, NULL, byteam};
    if (c.any_multi) {
        tmp = xmalloc(nqz * sizeof(int));
        uq.heap = xmalloc(nqz * sizeof(int));
        uq.cnt = xcalloc((size_t)c.n_us + 1, sizeof(int));
        uq.cur = xmalloc(((size_t)c.n_us + 1) * sizeof(int));
        uq.end = xmalloc(((size_t)c.n_us + 1) * sizeof(int));
    }
    tkey *tk = xcalloc(ntz, sizeof *tk);
    int rank = 0, preempt_tries = 0;
    for (int b = 0; b < nq;) {
        int e = b;
        while (e < nq && keys[e].guar == keys[b].guar && keys[e].eff == keys[b].eff) e++;
        if (e - b == 1) {
            r->order[rank] = keys[b].ji; r->out[keys[b].ji].rank = rank++;
            consider(&c, keys[b].ji, &preempt_tries);
            b = e;
            continue;
        }
        memset(tcount, 0, (size_t)nt * sizeof(int));
        for (int x = b; x < e; x++) tcount[s->queued[keys[x].ji].team]++;
        tstart[0] = 0;
        for (int t = 0; t < nt; t++) tstart[t + 1] = tstart[t] + tcount[t];
        for (int t = 0; t < nt; t++) tcur[t] = tstart[t];
        for (int x = b; x < e; x++) byteam[tcur[s->queued[keys[x].ji].team]++] = keys[x].ji;
        int na = 0;
        for (int t = 0; t < nt; t++) {
            tcur[t] = tstart[t];
            tleft[t] = tcount[t];
            tusers[t] = tcount[t] > 1 && c.tmulti[t] ? userq_build(&uq, tstart[t], tstart[t + 1], tmp) : 0;
            if (tcount[t]) active[na++] = t;
        }
        while (na > 0) {
            /* one team left in the band: no key to compare; else each
             * team's key, computed again only when its devices in use moved */
            int best = 0;
            if (na > 1) {
                double bk = team_key_kept(&c, tk, active[0]);
                for (int a = 1; a < na; a++) {
                    double k = team_key_kept(&c, tk, active[a]);
                    if (k < bk) { bk = k; best = a; }
                }
            }
            int t = active[best];
            int ji;
            if (tusers[t] == 0) {  /* one user: the band's order */
                ji = byteam[tcur[t]++];
            } else {
                /* the team's user furthest below its share: the heap's root */
                int *h = &uq.heap[tstart[t]];
                int x = h[0];
                ji = byteam[uq.cur[x]++];
                r->order[rank] = ji; r->out[ji].rank = rank++;
                consider(&c, ji, &preempt_tries);  /* may raise x's key, never another's */
                if (uq.cur[x] == uq.end[x]) h[0] = h[--tusers[t]];
                userq_down(&uq, h, tusers[t], 0);
                if (--tleft[t] == 0) active[best] = active[--na];
                continue;
            }
            r->order[rank] = ji; r->out[ji].rank = rank++;
            consider(&c, ji, &preempt_tries);
            if (--tleft[t] == 0) active[best] = active[--na];
        }
        b = e;
    }
    free(tcount); free(tstart); free(tcur); free(tleft); free(tusers); free(active); free(byteam); free(tmp);
    free(keys); free(tk);
    free(uq.heap); free(uq.cnt); free(uq.cur); free(uq.end);
    memcpy(r->starving, c.starving, sizeof r->starving);
    grow_elastic(&c);
    core_release(&c);
    return 0;
}

/* ================================================================ admission */

int sched_admit(const sched_snapshot *s, const sched_job *j, sched_outcome *o)
{
    memset(o, 0, sizeof *o);
    o->place = -1;
    o->kind = j->kind;
    if (s->n_nodes_registered == 0 || s->n_nodes == 0) { o->why = SW_NO_NODES; return -1; }
    int k = j->kind, w = j->devices_per_worker;
    int largest = 0, with_rt = 0;
    int64_t sum = 0, cpu = 0;
    for (int i = 0; i < s->n_nodes; i++) {
        int have = s->nodes[i].runtimes ? s->nodes[i].runtimes : SCHED_RT_HOST;
        if (j->runtime && !(have & j->runtime)) continue; /* it could never go there */
        with_rt++;
        int n = s->nodes[i].n_dev[k];
        if (n > largest) largest = n;
        if (w > 0) sum += n / w;
        cpu += s->nodes[i].n_dev[SCHED_CPU];
    }
    if (j->runtime && with_rt == 0) { o->why = SW_RUNTIME; o->a = 0; o->b = s->n_nodes; return -1; }
    if (w > largest) { o->why = SW_WIDE; o->a = w; o->b = largest; return -1; }
    if (w > 0 && sum < j->workers) { o->why = SW_LARGE; o->a = j->workers; o->b = sum; o->c = w; return -1; }
    int64_t left = k == SCHED_CPU ? cpu - (int64_t)j->workers * w : cpu;
    if (left < j->ps) {
        o->why = SW_PS_INFEASIBLE; o->a = j->ps; o->b = left < 0 ? 0 : left; o->kind = SCHED_CPU;
        return -1;
    }
    if (j->mem_mb > 0 && w > 0) {
        /* memory: a worker fits a node when its devices do and the node's
         * memory holds it (or the node reports none) */
        int64_t cap = 0, best1 = 0, mem_largest = 0;
        int reported = 0;
        for (int i = 0; i < s->n_nodes; i++) {
            const sched_node *nd = &s->nodes[i];
            if (j->runtime && !((nd->runtimes ? nd->runtimes : SCHED_RT_HOST) & j->runtime)) continue;
            int64_t ci = nd->n_dev[k] / w;
            if (nd->mem_mb > 0) {
                reported = 1;
                if (nd->mem_mb > mem_largest) mem_largest = nd->mem_mb;
                if (nd->mem_mb / j->mem_mb < ci) ci = nd->mem_mb / j->mem_mb;
            }
            cap += ci;
            if (ci > best1) best1 = ci;
        }
        if (reported && best1 == 0) { o->why = SW_MEM_WIDE; o->a = j->mem_mb; o->b = mem_largest; return -1; }
        if (reported && cap < j->workers) { o->why = SW_LARGE; o->a = j->workers; o->b = cap; o->c = w; return -1; }
    }
    return 0;
}
