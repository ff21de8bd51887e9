/* eval_place.h - where an evaluator side-car goes: pure logic over the
 * nodes' memory, run after the gangs of a pass are placed (never part of a
 * gang's all-or-nothing placement). An evaluator takes no device (no GPU,
 * no CPU slot: it runs under SCHED_IDLE and gets only the CPU time the
 * node's tasks leave), but its memory is counted on its node like any
 * task's: the job's resources.memory, else the node's default share of one
 * CPU slot (sched_task_mem's rule for a parameter server). See
 * docs/scheduler.md, "The evaluator".
 *
 * defines: sched_eval_node, sched_eval_want, sched_place_evaluator, sched_eval_need */
#ifndef TRAINYARD_SCHED_EVAL_PLACE_H
#define TRAINYARD_SCHED_EVAL_PLACE_H

#include <stdint.h>

typedef struct sched_eval_node {
    int64_t id;
    int ready;                     /* 1: may take new tasks */
    int cpu_slots;                 /* the node's CPU slots (for the default share) */
    int64_t mem_mb;                /* offered to tasks (MiB); 0: not reported, does not constrain */
    int64_t used_mb;               /* held by live tasks; sched_place_evaluator adds what it places */
} sched_eval_node;

typedef struct sched_eval_want {
    int64_t job_id;
    int64_t mem_mb;                /* resources.memory per task (MiB), 0: the node's default share */
    int64_t prefer_node;           /* node id tried first (the chief's), 0: none */
    int n_avoid;
    const int64_t *avoid;          /* (n_avoid) node ids the job must not use */
} sched_eval_want;

/* Picks a node for w's evaluator: the preferred node when its memory holds
 * it, else the ready node with the most free memory that holds it (a node
 * reporting no memory holds any; ties: the lower id). Returns the node's
 * index and its memory (MiB, the task's limit) in *mem_out, with the node's
 * used_mb increased by it; -1 when no ready node has room (nothing changed). */
int sched_place_evaluator(sched_eval_node *nodes, int n, const sched_eval_want *w, int64_t *mem_out);

/* The memory (MiB) w's evaluator needs on node e (0: none asked or known). */
int64_t sched_eval_need(const sched_eval_node *e, const sched_eval_want *w);

#endif
