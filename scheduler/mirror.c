/* mirror.c - the pass's rows kept in memory and in step with SQLite through
 * the change log. See mirror.h for the contract, docs/scheduler.md (The
 * mirror) for what is kept where and why. */
#include "mirror.h"

#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

/* ================================================================ id map */

#define MAP_TOMB (-1)

static size_t map_slot(int64_t k, size_t cap)
{
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void map_release(mirror_map *mp)
{
    free(mp->key); free(mp->val);
    memset(mp, 0, sizeof *mp);
}

static void map_put(mirror_map *mp, int64_t k, int64_t v);

static void map_grow(mirror_map *mp)
{
    mirror_map old = *mp;
    size_t live = 0;
    for (size_t i = 0; i < old.cap; i++) live += old.key[i] > 0;
    size_t cap = 1024;
    while (cap < live * 4) cap *= 2;
    mp->key = xcalloc(cap, sizeof *mp->key);
    mp->val = xcalloc(cap, sizeof *mp->val);
    mp->cap = cap;
    mp->used = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.key[i] > 0) map_put(mp, old.key[i], old.val[i]);
    free(old.key); free(old.val);
}

static void map_put(mirror_map *mp, int64_t k, int64_t v)
{
    if ((mp->used + 1) * 2 > mp->cap) map_grow(mp);
    size_t i = map_slot(k, mp->cap), tomb = (size_t)-1;
    while (mp->key[i] != 0) {
        if (mp->key[i] == k) { mp->val[i] = v; return; }
        if (mp->key[i] == MAP_TOMB && tomb == (size_t)-1) tomb = i;
        i = (i + 1) & (mp->cap - 1);
    }
    if (tomb != (size_t)-1) i = tomb;
    else mp->used++;
    mp->key[i] = k;
    mp->val[i] = v;
}

/* 1 with *v, or 0 */
static int map_get(const mirror_map *mp, int64_t k, int64_t *v)
{
    if (!mp->cap) return 0;
    size_t i = map_slot(k, mp->cap);
    while (mp->key[i] != 0) {
        if (mp->key[i] == k) { *v = mp->val[i]; return 1; }
        i = (i + 1) & (mp->cap - 1);
    }
    return 0;
}

static void map_del(mirror_map *mp, int64_t k)
{
    if (!mp->cap) return;
    size_t i = map_slot(k, mp->cap);
    while (mp->key[i] != 0) {
        if (mp->key[i] == k) { mp->key[i] = MAP_TOMB; return; }
        i = (i + 1) & (mp->cap - 1);
    }
}

/* ================================================================ basics */

mirror *mirror_new(void)
{
    mirror *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->idle, NULL);
    return m;
}

static void node_release(mirror_node *n)
{
    free(n->row.isolation);
    free(n->dev); free(n->sdev); free(n->holds); free(n->ports); free(n->mem);
    memset(n, 0, sizeof *n);
}

static void clear(mirror *m)
{
    for (int i = 0; i < m->n_nodes; i++) node_release(&m->nodes[i]);
    free(m->nodes);
    for (int s = 0; s < m->n_slots; s++) free(m->slots[s].avoid);
    free(m->slots); free(m->info); free(m->said); free(m->sj); free(m->left); free(m->free_slots); free(m->order); free(m->teams);
    free(m->uusage);
    map_release(&m->dev_node);
    map_release(&m->job_slot);
    m->nodes = NULL; m->n_nodes = m->cap_nodes = 0;
    m->slots = NULL; m->n_slots = m->cap_slots = 0;
    m->info = NULL; m->said = NULL; m->sj = NULL; m->left = NULL; m->n_left = m->cap_left = 0;
    m->free_slots = NULL; m->n_free = m->cap_free = 0;
    m->order = NULL; m->n_live = m->n_hold = m->cap_order = 0;
    m->teams = NULL; m->n_teams = 0;
    m->uusage = NULL; m->n_uusage = 0;
    m->loaded = 0;
    m->version++;
}

void mirror_free(mirror *m)
{
    if (!m) return;
    clear(m);
    pthread_cond_destroy(&m->idle);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void mirror_invalidate(mirror *m) { m->loaded = 0; }

int mirror_find_node(const mirror *m, int64_t id)
{
    int lo = 0, hi = m->n_nodes - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (m->nodes[mid].row.id == id) return mid;
        if (m->nodes[mid].row.id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int mirror_find_team(const mirror *m, int64_t id)
{
    int lo = 0, hi = m->n_teams - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (m->teams[mid].id == id) return mid;
        if (m->teams[mid].id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int job_sect(const cl_job *j)
{
    return strcmp(j->state, "queued") == 0 || strcmp(j->state, "starting") == 0 ||
                   strcmp(j->state, "running") == 0
               ? 1
               : 2;
}

static int slot_new(mirror *m)
{
    if (m->n_free > 0) return m->free_slots[--m->n_free];
    if (m->n_slots == m->cap_slots) {
        m->cap_slots = m->cap_slots ? m->cap_slots * 2 : 1024;
        m->slots = xrealloc(m->slots, (size_t)m->cap_slots * sizeof *m->slots);
        m->info = xrealloc(m->info, (size_t)m->cap_slots * sizeof *m->info);
        m->said = xrealloc(m->said, (size_t)m->cap_slots * sizeof *m->said);
        m->sj = xrealloc(m->sj, (size_t)m->cap_slots * sizeof *m->sj);
    }
    memset(&m->slots[m->n_slots], 0, sizeof m->slots[0]);
    memset(&m->info[m->n_slots], 0, sizeof m->info[0]);
    memset(&m->said[m->n_slots], 0, sizeof m->said[0]);
    memset(&m->sj[m->n_slots], 0, sizeof m->sj[0]);
    return m->n_slots++;
}

void mirror_job_core(const cl_job *j, sched_job *out)
{
    *out = (sched_job){j->id, 0, j->priority, j->workers, j->devices_per_worker, j->kind, j->ps,
                       j->queued_at, j->max_runtime_s, 0, NULL, j->memory_mb, j->workers_min, j->resize_to,
                       j->runtime == CL_RUNTIME_PODMAN ? SCHED_RT_PODMAN : 0, j->user_id, j->interactive};
}

/* A job's row changed: its info follows. */
static void slot_set(mirror *m, int s, const cl_job *row)
{
    if (strcmp(m->slots[s].row.reason, row->reason) != 0) m->said[s].ok = 0;
    m->slots[s].row = *row;
    m->info[s].id = row->id;
    m->info[s].team_id = row->team_id;
    m->info[s].queued = strcmp(row->state, "queued") == 0;
    mirror_job_core(row, &m->sj[s]);
}

static void slot_free(mirror *m, int s)
{
    free(m->slots[s].avoid);
    memset(&m->slots[s], 0, sizeof m->slots[s]);
    memset(&m->info[s], 0, sizeof m->info[s]);
    memset(&m->said[s], 0, sizeof m->said[s]);
    memset(&m->sj[s], 0, sizeof m->sj[s]);
    if (m->n_free == m->cap_free) {
        m->cap_free = m->cap_free ? m->cap_free * 2 : 256;
        m->free_slots = xrealloc(m->free_slots, (size_t)m->cap_free * sizeof *m->free_slots);
    }
    m->free_slots[m->n_free++] = s;
}

/* The summary of a node's devices (n_free, holds), after a holder changed. */
static void node_sum(mirror_node *n)
{
    memset(n->n_free, 0, sizeof n->n_free);
    n->n_holds = 0;
    for (int x = 0; x < n->n_dev; x++) {
        int k = n->dev[x].kind;
        int64_t jid = n->sdev[x].job_id;
        if (!jid) { n->n_free[k]++; continue; }
        int y = 0;
        while (y < n->n_holds && (n->holds[y].job_id != jid || n->holds[y].kind != k)) y++;
        if (y == n->n_holds) n->holds[n->n_holds++] = (sched_hold){jid, k, 0};
        n->holds[y].count++;
    }
}

/* The core's form of a node's devices, after dev changed. */
static void node_sdev(mirror_node *n)
{
    free(n->sdev);
    free(n->holds);
    n->sdev = xmalloc(((size_t)n->n_dev + 1) * sizeof *n->sdev);
    n->holds = xmalloc(((size_t)n->n_dev + 1) * sizeof *n->holds);
    memset(n->n_kind, 0, sizeof n->n_kind);
    for (int x = 0; x < n->n_dev; x++) {
        n->sdev[x] = (sched_device){n->dev[x].id, n->dev[x].job_id};
        n->n_kind[n->dev[x].kind]++;
    }
    node_sum(n);
}

/* ================================================================ full load */

static int full_load(mirror *m, db *d)
{
    clear(m);
    /* changes published from here on are read by the next refresh: one
     * committed during the load is read again, never missed */
    m->seq = db_changes_head(d);
    cluster_state cs;
    if (cluster_load(d, &cs) < 0) return -1;
    m->nodes = xcalloc((size_t)cs.n_nodes + 1, sizeof *m->nodes);
    m->cap_nodes = cs.n_nodes + 1;
    m->n_nodes = cs.n_nodes;
    for (int i = 0; i < cs.n_nodes; i++) {
        m->nodes[i].row = cs.nodes[i];
        cs.nodes[i].isolation = NULL; /* now the mirror's */
    }
    /* devices, ports and memory come ordered by node */
    for (int x = 0; x < cs.n_devices;) {
        int y = x;
        while (y < cs.n_devices && cs.devices[y].node_id == cs.devices[x].node_id) y++;
        int i = mirror_find_node(m, cs.devices[x].node_id);
        if (i >= 0) {
            mirror_node *n = &m->nodes[i];
            n->dev = xmalloc((size_t)(y - x) * sizeof *n->dev);
            memcpy(n->dev, &cs.devices[x], (size_t)(y - x) * sizeof *n->dev);
            n->n_dev = y - x;
            node_sdev(n);
            for (int k = x; k < y; k++) map_put(&m->dev_node, cs.devices[k].id, cs.devices[k].node_id);
        }
        x = y;
    }
    for (int x = 0; x < cs.n_ports;) {
        int y = x;
        while (y < cs.n_ports && cs.ports[y].node_id == cs.ports[x].node_id) y++;
        int i = mirror_find_node(m, cs.ports[x].node_id);
        if (i >= 0) {
            mirror_node *n = &m->nodes[i];
            n->ports = xmalloc((size_t)(y - x) * sizeof *n->ports);
            memcpy(n->ports, &cs.ports[x], (size_t)(y - x) * sizeof *n->ports);
            n->n_ports = y - x;
        }
        x = y;
    }
    for (int x = 0; x < cs.n_mem;) {
        int y = x;
        while (y < cs.n_mem && cs.mem[y].node_id == cs.mem[x].node_id) y++;
        int i = mirror_find_node(m, cs.mem[x].node_id);
        if (i >= 0) {
            mirror_node *n = &m->nodes[i];
            n->mem = xmalloc((size_t)(y - x) * sizeof *n->mem);
            memcpy(n->mem, &cs.mem[x], (size_t)(y - x) * sizeof *n->mem);
            n->n_mem = y - x;
        }
        x = y;
    }
    m->teams = cs.teams; m->n_teams = cs.n_teams;
    cs.teams = NULL; cs.n_teams = 0;
    m->uusage = cs.uusage; m->n_uusage = cs.n_uusage;
    cs.uusage = NULL; cs.n_uusage = 0;
    m->cap_order = cs.n_jobs + 1;
    m->order = xmalloc((size_t)m->cap_order * sizeof *m->order);
    for (int x = 0; x < cs.n_jobs; x++) {
        int s = slot_new(m);
        slot_set(m, s, &cs.jobs[x]);
        m->info[s].sect = (signed char)job_sect(&cs.jobs[x]);
        map_put(&m->job_slot, cs.jobs[x].id, s);
        m->order[x] = s;
        if (m->info[s].sect == 1) m->n_live++;
        else m->n_hold++;
    }
    /* avoid rows come ordered by job, node */
    for (int x = 0; x < cs.n_avoid;) {
        int y = x;
        while (y < cs.n_avoid && cs.avoid[y].job_id == cs.avoid[x].job_id) y++;
        int64_t s;
        if (map_get(&m->job_slot, cs.avoid[x].job_id, &s)) {
            mirror_job *j = &m->slots[s];
            j->avoid = xmalloc((size_t)(y - x) * sizeof *j->avoid);
            memcpy(j->avoid, &cs.avoid[x], (size_t)(y - x) * sizeof *j->avoid);
            j->n_avoid = y - x;
            m->info[s].n_avoid = j->n_avoid;
        }
        x = y;
    }
    cluster_state_release(&cs);
    m->loaded = 1;
    m->version++;
    return 0;
}

/* ================================================================ refresh */

typedef struct idlist {
    int64_t *v;
    int n, cap;
} idlist;

static void id_add(idlist *l, int64_t id)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = id;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void id_uniq(idlist *l)
{
    if (l->n < 2) return;
    qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_i64);
    int k = 1;
    for (int i = 1; i < l->n; i++)
        if (l->v[i] != l->v[k - 1]) l->v[k++] = l->v[i];
    l->n = k;
}

static int id_has(const idlist *l, int64_t id) /* l sorted */
{
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (l->v[mid] == id) return 1;
        if (l->v[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* A node read again: its row replaced, inserted, or (gone) removed with
 * its devices. Returns its index or -1 when gone. */
static int node_put(mirror *m, int64_t id, cl_node *row, int found)
{
    int i = mirror_find_node(m, id);
    if (!found) {
        if (i < 0) return -1;
        for (int k = 0; k < m->nodes[i].n_dev; k++) map_del(&m->dev_node, m->nodes[i].dev[k].id);
        node_release(&m->nodes[i]);
        memmove(&m->nodes[i], &m->nodes[i + 1], (size_t)(m->n_nodes - i - 1) * sizeof *m->nodes);
        m->n_nodes--;
        return -1;
    }
    if (i >= 0) {
        free(m->nodes[i].row.isolation);
        m->nodes[i].row = *row;
        return i;
    }
    if (m->n_nodes == m->cap_nodes) {
        m->cap_nodes = m->cap_nodes ? m->cap_nodes * 2 : 64;
        m->nodes = xrealloc(m->nodes, (size_t)m->cap_nodes * sizeof *m->nodes);
    }
    int at = m->n_nodes;
    while (at > 0 && m->nodes[at - 1].row.id > id) at--;
    memmove(&m->nodes[at + 1], &m->nodes[at], (size_t)(m->n_nodes - at) * sizeof *m->nodes);
    memset(&m->nodes[at], 0, sizeof m->nodes[at]);
    m->nodes[at].row = *row;
    m->n_nodes++;
    return at;
}

/* slots by their job's id */
static int cmp_slot(const void *a, const void *b, void *ctx)
{
    const mirror *m = ctx;
    int64_t x = m->info[*(const int *)a].id, y = m->info[*(const int *)b].id;
    return (x > y) - (x < y);
}

/* The order again: the old one less the jobs that left or changed section,
 * merged with those that joined a section (fresh), by id. */
static void order_rebuild(mirror *m, const int *fresh, int n_fresh)
{
    int *sorted = xmalloc(((size_t)n_fresh + 1) * sizeof *sorted);
    memcpy(sorted, fresh, (size_t)n_fresh * sizeof *sorted);
    qsort_r(sorted, (size_t)n_fresh, sizeof *sorted, cmp_slot, m);
    int total = m->n_live + m->n_hold + n_fresh + 1;
    int *out = xmalloc((size_t)total * sizeof *out);
    int n_out = 0, n_live = 0;
    for (int sect = 1; sect <= 2; sect++) {
        int a = sect == 1 ? 0 : m->n_live, a_end = sect == 1 ? m->n_live : m->n_live + m->n_hold, b = 0;
        for (;;) {
            while (a < a_end) { /* old members still there, not re-added */
                const mirror_slot *j = &m->info[m->order[a]];
                if (j->sect == sect && !j->fresh) break;
                a++;
            }
            while (b < n_fresh && m->info[sorted[b]].sect != sect) b++;
            if (a >= a_end && b >= n_fresh) break;
            int take_old = b >= n_fresh ||
                           (a < a_end && m->info[m->order[a]].id < m->info[sorted[b]].id);
            out[n_out++] = take_old ? m->order[a++] : sorted[b++];
        }
        if (sect == 1) n_live = n_out;
    }
    for (int k = 0; k < n_fresh; k++) m->info[fresh[k]].fresh = 0;
    free(sorted);
    free(m->order);
    m->order = out;
    m->cap_order = total;
    m->n_live = n_live;
    m->n_hold = n_out - n_live;
}

/* ---------------------------------------------------------------- refresh, by phase
 *
 * refresh reads the change log since the mirror's sequence into sets of ids
 * (refresh_collect), then, inside one read transaction, reads again what
 * those ids name, in an order where each phase may add to the sets of the
 * ones after it: nodes (and lost ones), devices and allocations, tasks, the
 * ports and memory of the nodes they touched, jobs, teams. */

/* The ids a refresh reads again, grown as the phases go. */
typedef struct refresh_sets {
    idlist nodes, devs, tasks, jobs, avoid; /* from the change log */
    idlist lost;                            /* nodes the mirror holds as lost */
    idlist dirty_dev;                       /* nodes whose every device is read again */
    idlist dirty_pm;                        /* nodes whose ports and memory are read again */
    int teams;                              /* the teams table changed */
} refresh_sets;

static void refresh_sets_free(refresh_sets *r)
{
    idlist *all[] = {&r->nodes, &r->devs, &r->tasks, &r->jobs, &r->avoid, &r->lost, &r->dirty_dev, &r->dirty_pm};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        free(all[k]->v);
}

/* The change log's rows into sets; the lost nodes, read again every time (a
 * heartbeat brings a lost node back without a note). */
static void refresh_collect(const mirror *m, const db_change *ch, size_t n, refresh_sets *r)
{
    for (size_t k = 0; k < n; k++) {
        switch (ch[k].table) {
        case DB_CH_NODE: id_add(&r->nodes, ch[k].id); break;
        case DB_CH_DEVICE: case DB_CH_ALLOC: id_add(&r->devs, ch[k].id); break;
        case DB_CH_TASK: id_add(&r->tasks, ch[k].id); break;
        case DB_CH_JOB: id_add(&r->jobs, ch[k].id); break;
        case DB_CH_AVOID: id_add(&r->avoid, ch[k].id); id_add(&r->jobs, ch[k].id); break;
        case DB_CH_TEAM: r->teams = 1; break;
        default: break;
        }
    }
    for (int i = 0; i < m->n_nodes; i++)
        if (strcmp(m->nodes[i].row.state, "lost") == 0) id_add(&r->lost, m->nodes[i].row.id);
    id_uniq(&r->nodes); id_uniq(&r->devs); id_uniq(&r->tasks); id_uniq(&r->avoid);
}

/* Nodes: the lost ones and those the log names; a node gone takes its
 * devices' jobs to be read again. *changed when a lost node came back. */
static int refresh_nodes(mirror *m, db *d, refresh_sets *r, mirror_stats *st, int *changed)
{
    for (int k = 0; k < r->lost.n; k++) {
        if (id_has(&r->nodes, r->lost.v[k])) continue;
        cl_node row;
        int rc = cluster_read_node(d, r->lost.v[k], &row);
        if (rc < 0) return -1;
        if (rc == 0 && strcmp(row.state, "lost") != 0) *changed = 1;
        node_put(m, r->lost.v[k], &row, rc == 0);
        st->nodes++;
    }
    for (int k = 0; k < r->nodes.n; k++) {
        cl_node row;
        int rc = cluster_read_node(d, r->nodes.v[k], &row);
        if (rc < 0) return -1;
        st->nodes++;
        int i = mirror_find_node(m, r->nodes.v[k]);
        if (rc != 0 && i >= 0) /* gone: its devices' jobs are read again */
            for (int x = 0; x < m->nodes[i].n_dev; x++)
                if (m->nodes[i].dev[x].job_id) id_add(&r->jobs, m->nodes[i].dev[x].job_id);
        if (node_put(m, r->nodes.v[k], &row, rc == 0) >= 0) id_add(&r->dirty_dev, r->nodes.v[k]);
    }
    return 0;
}

/* Devices and allocations: the row again, or the node's devices when the
 * device is new or gone. */
static int refresh_devices(mirror *m, db *d, refresh_sets *r, mirror_stats *st)
{
    /* each phase's by-id reads in one statement on PostgreSQL (cluster.h) */
    if (cluster_prefetch_devices(d, r->devs.v, r->devs.n) < 0) return -1;
    for (int k = 0; k < r->devs.n; k++) {
        int64_t node_id = 0;
        cl_device row;
        int rc = cluster_read_device(d, r->devs.v[k], &row);
        if (rc < 0) return -1;
        st->devices++;
        int known = map_get(&m->dev_node, r->devs.v[k], &node_id);
        if (rc == 0 && known && row.node_id == node_id) {
            int i = mirror_find_node(m, node_id);
            if (i < 0) continue;
            mirror_node *nd = &m->nodes[i];
            for (int x = 0; x < nd->n_dev; x++) {
                if (nd->dev[x].id != row.id) continue;
                if (nd->dev[x].job_id) id_add(&r->jobs, nd->dev[x].job_id);
                if (row.job_id) id_add(&r->jobs, row.job_id);
                if (nd->dev[x].job_id != row.job_id || nd->dev[x].task_id != row.task_id) id_add(&r->dirty_pm, node_id);
                int holder = nd->dev[x].job_id != row.job_id || nd->dev[x].kind != row.kind;
                nd->dev[x] = row;
                nd->sdev[x] = (sched_device){row.id, row.job_id};
                if (holder) node_sum(nd);
                break;
            }
            continue;
        }
        if (known) id_add(&r->dirty_dev, node_id);
        if (rc == 0) id_add(&r->dirty_dev, row.node_id);
    }
    id_uniq(&r->dirty_dev);
    for (int k = 0; k < r->dirty_dev.n; k++) {
        int i = mirror_find_node(m, r->dirty_dev.v[k]);
        if (i < 0) continue;
        mirror_node *nd = &m->nodes[i];
        cl_device *dv;
        int nv;
        if (cluster_read_node_devices(d, nd->row.id, &dv, &nv) < 0) return -1;
        for (int x = 0; x < nd->n_dev; x++) {
            map_del(&m->dev_node, nd->dev[x].id);
            if (nd->dev[x].job_id) id_add(&r->jobs, nd->dev[x].job_id);
        }
        for (int x = 0; x < nv; x++) {
            map_put(&m->dev_node, dv[x].id, dv[x].node_id);
            if (dv[x].job_id) id_add(&r->jobs, dv[x].job_id);
        }
        free(nd->dev);
        nd->dev = dv;
        nd->n_dev = nv;
        node_sdev(nd);
        st->devices += nv;
        id_add(&r->dirty_pm, nd->row.id);
    }
    return 0;
}

/* Tasks: their job's attempt start and stopping flag, and their node's
 * ports and memory in use (derived from tasks rows), read again. */
static int refresh_tasks(mirror *m, db *d, refresh_sets *r)
{
    if (cluster_prefetch_tasks(d, r->tasks.v, r->tasks.n) < 0) return -1;
    for (int k = 0; k < r->tasks.n; k++) {
        int64_t job = 0, node_id = 0;
        int rc = cluster_read_task_job(d, r->tasks.v[k], &job, &node_id);
        if (rc < 0) return -1;
        if (rc == 0) {
            id_add(&r->jobs, job);
            id_add(&r->dirty_pm, node_id);
        }
    }
    id_uniq(&r->dirty_pm);
    if (cluster_prefetch_node_use(d, r->dirty_pm.v, r->dirty_pm.n) < 0) return -1;
    for (int k = 0; k < r->dirty_pm.n; k++) {
        int i = mirror_find_node(m, r->dirty_pm.v[k]);
        if (i < 0) continue;
        mirror_node *nd = &m->nodes[i];
        cl_port *pv;
        cl_mem *mv;
        int np, nm;
        if (cluster_read_node_ports(d, nd->row.id, &pv, &np) < 0) return -1;
        if (cluster_read_node_mem(d, nd->row.id, &mv, &nm) < 0) { free(pv); return -1; }
        free(nd->ports); free(nd->mem);
        nd->ports = pv; nd->n_ports = np;
        nd->mem = mv; nd->n_mem = nm;
    }
    return 0;
}

/* Jobs: each row again; a job that left the pass's view goes to m->left
 * (freed once the order no longer has it), one that changed section to
 * fresh[] (*n_fresh; fresh holds jobs.n). *left when one left. */
static int refresh_jobs(mirror *m, db *d, refresh_sets *r, mirror_stats *st, int *fresh, int *n_fresh, int *left)
{
    id_uniq(&r->jobs);
    if (cluster_prefetch_jobs(d, r->jobs.v, r->jobs.n) < 0) return -1;
    for (int k = 0; k < r->jobs.n; k++) {
        cl_job row;
        int rc = cluster_read_job(d, r->jobs.v[k], &row);
        if (rc < 0) return -1;
        st->jobs++;
        int64_t s = -1;
        int known = map_get(&m->job_slot, r->jobs.v[k], &s);
        if (rc != 0) {
            if (known) { /* left the pass's view: the rebuild drops it from the order */
                map_del(&m->job_slot, r->jobs.v[k]);
                m->info[s].sect = 0;
                if (m->n_left == m->cap_left) {
                    m->cap_left = m->cap_left ? m->cap_left * 2 : 256;
                    m->left = xrealloc(m->left, (size_t)m->cap_left * sizeof *m->left);
                }
                m->left[m->n_left++] = (int)s;
                *left = 1;
            }
            continue;
        }
        int sect = job_sect(&row);
        int reread_avoid = id_has(&r->avoid, row.id);
        if (!known) {
            s = slot_new(m);
            map_put(&m->job_slot, row.id, s);
            reread_avoid = 1;
        }
        mirror_job *j = &m->slots[s];
        if (m->info[s].sect != sect) {
            m->info[s].sect = (signed char)sect;
            m->info[s].fresh = 1;
            fresh[(*n_fresh)++] = (int)s;
        }
        slot_set(m, (int)s, &row);
        if (reread_avoid) {
            cl_avoid *av;
            int na;
            if (cluster_read_job_avoid(d, row.id, &av, &na) < 0) return -1;
            free(j->avoid);
            j->avoid = av;
            j->n_avoid = na;
            m->info[s].n_avoid = na;
        }
    }
    return 0;
}

/* The teams' shares changed (teams or user_usage: the log names both
 * DB_CH_TEAM): both are read again, a few rows each. */
static int refresh_teams(mirror *m, db *d)
{
    cl_team *tv;
    cl_user_usage *uv;
    int nt, nu;
    if (cluster_read_teams(d, &tv, &nt) < 0) return -1;
    if (cluster_read_user_usage(d, &uv, &nu) < 0) { free(tv); return -1; }
    free(m->teams);
    m->teams = tv;
    m->n_teams = nt;
    free(m->uusage);
    m->uusage = uv;
    m->n_uusage = nu;
    return 0;
}

/* The phases inside one read transaction; on failure the transaction is
 * ended and the mirror keeps what was read (the next refresh reads again). */
static int refresh_read(mirror *m, db *d, refresh_sets *r, mirror_stats *st, int *changed)
{
    if (cluster_read_begin(d) < 0) return -1;
    int *fresh = NULL;
    int n_fresh = 0, left = 0;
    if (refresh_nodes(m, d, r, st, changed) || refresh_devices(m, d, r, st) || refresh_tasks(m, d, r))
        goto fail;
    fresh = xmalloc(((size_t)r->jobs.n + 1) * sizeof *fresh);
    if (refresh_jobs(m, d, r, st, fresh, &n_fresh, &left) || (r->teams && refresh_teams(m, d)))
        goto fail;
    if (cluster_read_end(d) < 0) {
        free(fresh);
        return -1;
    }
    if (n_fresh || left) order_rebuild(m, fresh, n_fresh);
    free(fresh);
    /* slots that left are freed once the order no longer has them */
    for (int k = 0; k < m->n_left; k++) slot_free(m, m->left[k]);
    m->n_left = 0;
    return 0;
fail:
    free(fresh);
    cluster_read_end(d);
    return -1;
}

static int refresh(mirror *m, db *d, mirror_stats *st)
{
    db_change *ch = NULL;
    size_t n = 0;
    if (db_changes_read(d, &m->seq, &ch, &n)) {
        free(ch);
        st->full = 1;
        return full_load(m, d);
    }
    st->changes = (int)n;
    refresh_sets r;
    memset(&r, 0, sizeof r);
    refresh_collect(m, ch, n, &r);
    free(ch);
    int ret = 0, changed = n > 0;
    if (n > 0 || r.lost.n > 0)
        ret = refresh_read(m, d, &r, st, &changed);
    if (changed) m->version++;
    refresh_sets_free(&r);
    return ret;
}

int mirror_refresh(mirror *m, db *d, mirror_stats *st)
{
    mirror_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    double t0 = mono_s();
    int rc;
    if (!m->loaded) {
        st->full = 1;
        rc = full_load(m, d);
    } else {
        rc = refresh(m, d, st);
    }
    if (rc < 0) {
        clear(m);
        log_error("scheduler: the mirror could not follow the store; it reloads on the next pass");
    }
    st->ms = (mono_s() - t0) * 1000;
    return rc;
}

/* ================================================================ export */

/* memcpy of n bytes, src may be NULL when n is 0 */
static void copy_n(void *dst, const void *src, size_t n)
{
    if (n) memcpy(dst, src, n);
}

void mirror_export(const mirror *m, cluster_state *cs)
{
    memset(cs, 0, sizeof *cs);
    int nd = 0, np = 0, nm = 0, na = 0;
    for (int i = 0; i < m->n_nodes; i++) {
        nd += m->nodes[i].n_dev; np += m->nodes[i].n_ports; nm += m->nodes[i].n_mem;
    }
    int nj = m->n_live + m->n_hold;
    for (int k = 0; k < nj; k++) na += m->slots[m->order[k]].n_avoid;
    cs->nodes = xcalloc((size_t)m->n_nodes + 1, sizeof *cs->nodes);
    cs->devices = xcalloc((size_t)nd + 1, sizeof *cs->devices);
    cs->ports = xcalloc((size_t)np + 1, sizeof *cs->ports);
    cs->mem = xcalloc((size_t)nm + 1, sizeof *cs->mem);
    cs->teams = xcalloc((size_t)m->n_teams + 1, sizeof *cs->teams);
    cs->uusage = xcalloc((size_t)m->n_uusage + 1, sizeof *cs->uusage);
    cs->jobs = xcalloc((size_t)nj + 1, sizeof *cs->jobs);
    cs->avoid = xcalloc((size_t)na + 1, sizeof *cs->avoid);
    for (int i = 0; i < m->n_nodes; i++) {
        const mirror_node *n = &m->nodes[i];
        cs->nodes[cs->n_nodes] = n->row;
        cs->nodes[cs->n_nodes++].isolation = n->row.isolation ? xstrdup(n->row.isolation) : NULL;
        copy_n(&cs->devices[cs->n_devices], n->dev, (size_t)n->n_dev * sizeof *n->dev);
        cs->n_devices += n->n_dev;
        copy_n(&cs->ports[cs->n_ports], n->ports, (size_t)n->n_ports * sizeof *n->ports);
        cs->n_ports += n->n_ports;
        copy_n(&cs->mem[cs->n_mem], n->mem, (size_t)n->n_mem * sizeof *n->mem);
        cs->n_mem += n->n_mem;
    }
    copy_n(cs->teams, m->teams, (size_t)m->n_teams * sizeof *m->teams);
    cs->n_teams = m->n_teams;
    copy_n(cs->uusage, m->uusage, (size_t)m->n_uusage * sizeof *m->uusage);
    cs->n_uusage = m->n_uusage;
    /* avoid rows in cluster_load's order: by job, then node */
    int *by_id = xmalloc(((size_t)nj + 1) * sizeof *by_id);
    copy_n(by_id, m->order, (size_t)nj * sizeof *by_id);
    qsort_r(by_id, (size_t)nj, sizeof *by_id, cmp_slot, (void *)m);
    for (int k = 0; k < nj; k++) {
        cs->jobs[cs->n_jobs++] = m->slots[m->order[k]].row;
        const mirror_job *j = &m->slots[by_id[k]];
        copy_n(&cs->avoid[cs->n_avoid], j->avoid, (size_t)j->n_avoid * sizeof *j->avoid);
        cs->n_avoid += j->n_avoid;
    }
    free(by_id);
}
