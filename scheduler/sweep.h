/* sweep.h - hyperparameter search: the pure part (no storage, no HTTP).
 *
 * A sweep is a job spec and a search: which spec paths to vary and how
 * (values, uniform, log-uniform, integers), by which method (grid, random,
 * ASHA), towards which metric. This module parses and checks a search,
 * lists the trials' parameters (the grid in its order; random draws from a
 * seeded generator, so the same seed gives the same trials on any machine),
 * writes a trial's values into the job spec at the paths the spec's own
 * errors name (`compile.optimizer.learning_rate`, `model.layers[1].units`,
 * `command.env.LR`) and checks the result with jobspec_parse, and decides
 * ASHA's rungs and promotions from what the trials scored.
 *
 * The controller that turns trials into jobs lives with the API; it keeps
 * every decision's inputs in the database, so a restarted server decides
 * as the one before it.
 *
 * defines: sweep_search, sweep_param, sweep_search_parse, sweep_search_release,
 *          sweep_n_trials, sweep_trial_params, sweep_apply,
 *          asha_rung_epochs, asha_score, asha_next */
#ifndef TRAINYARD_SWEEP_H
#define TRAINYARD_SWEEP_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "../spec/jobspec.h"

#define SWEEP_MAX_PARAMS 16
#define SWEEP_MAX_TRIALS 1000
#define SWEEP_MAX_RUNGS 16

typedef enum { SWEEP_GRID = 0, SWEEP_RANDOM = 1, SWEEP_ASHA = 2 } sweep_method;
typedef enum { SP_VALUES = 0, SP_UNIFORM = 1, SP_LOG_UNIFORM = 2, SP_INT = 3 } sweep_dist;

typedef struct sweep_param {
    char path[128];                /* a spec path as its errors write it */
    sweep_dist dist;
    cJSON *values;                 /* SP_VALUES: the array (owned) */
    double lo, hi;                 /* the other kinds: [lo, hi] */
} sweep_param;

typedef struct sweep_search {
    sweep_method method;
    int n_params;
    sweep_param params[SWEEP_MAX_PARAMS];
    char metric[64];               /* "val_accuracy", "val_loss" or any metric the job reports */
    int mode_max;                  /* 1: larger is better */
    int max_trials;                /* grid: default (and at most) the grid's size */
    int max_concurrent;            /* trials running at once (default 2) */
    uint64_t seed;                 /* random and ASHA draws (default 0) */
    int max_epochs;                /* ASHA: a trial's most epochs (required for asha) */
    int min_epochs;                /* ASHA: the first rung (default 1) */
    int reduction_factor;          /* ASHA: eta (default 3) */
} sweep_search;

#endif
