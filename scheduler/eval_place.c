/* eval_place.c - the evaluator's node. See eval_place.h. */
#include "eval_place.h"
#include "core.h"

#include <stddef.h>

/* sched_task_mem's rule for a one-slot CPU task. */
int64_t sched_eval_need(const sched_eval_node *e, const sched_eval_want *w) {
    sched_node n = {0};
    n.id = e->id;
    n.mem_mb = e->mem_mb;
    n.n_dev[SCHED_CPU] = e->cpu_slots;
    sched_job j = {0};
    j.mem_mb = w->mem_mb;
    j.kind = SCHED_CPU;
    j.devices_per_worker = 1;
    return sched_task_mem(&n, &j, 1);
}

/* The evaluator's memory on node e, and whether it fits there now. */
static int fits(const sched_eval_node *e, const sched_eval_want *w, int64_t *need) {
    *need = sched_eval_need(e, w);
    if (!e->ready) return 0;
    for (int a = 0; a < w->n_avoid; a++)
        if (w->avoid[a] == e->id) return 0;
    return e->mem_mb <= 0 || e->used_mb + *need <= e->mem_mb;
}

int sched_place_evaluator(sched_eval_node *nodes, int n, const sched_eval_want *w, int64_t *mem_out) {
    int best = -1;
    int64_t best_free = 0, best_need = 0, need = 0;
    for (int i = 0; i < n; i++) {
        if (!fits(&nodes[i], w, &need)) continue;
        if (w->prefer_node && nodes[i].id == w->prefer_node) {
            best = i;
            best_need = need;
            break;
        }
        int64_t free_mb = nodes[i].mem_mb <= 0 ? INT64_MAX : nodes[i].mem_mb - nodes[i].used_mb - need;
        if (best < 0 || free_mb > best_free || (free_mb == best_free && nodes[i].id < nodes[best].id)) {
            best = i;
            best_free = free_mb;
            best_need = need;
        }
    }
    if (best < 0) return -1;
    nodes[best].used_mb += best_need;
    *mem_out = best_need;
    return best;
}
