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
 *          sweep_search_to_json, sweep_grid_size, sweep_n_trials, sweep_trial_params,
 *          sweep_apply, asha_rung_entry, asha_rung_epochs, asha_score, asha_next,
 *          asha_continues */
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

/* ---------------------------------------------------------------- the search */

#define SWEEP_PATH_MAX 96              /* a parameter's path, in characters: its error field
                                        * "search.parameters.PATH.log_uniform" fits
                                        * JOBSPEC_FIELD_MAX */
#define SWEEP_MAX_VALUES 1000          /* entries of one `values` list */
#define SWEEP_MAX_CONCURRENT 100
#define SWEEP_MAX_EPOCHS 10000         /* ASHA's max_epochs */

/* Parses and checks a sweep request's "search" object (docs/sweeps.md):
 * method, parameters (1..SWEEP_MAX_PARAMS, in the order given), metric,
 * mode, max_trials, max_concurrent, seed and, for asha only, max_epochs,
 * min_epochs and reduction_factor. Every default is filled in, so
 * out->max_trials is the number of trials the sweep will run.
 * Returns 0, or -1 with *err (may be NULL) naming the field at fault as the
 * job spec's errors do: 422 (unknown_field, missing_field, invalid_type,
 * invalid_value) with field "search.method", "search.parameters.fit.batch_size",
 * "search.parameters.x.uniform", ...; 400 bad_json for a duplicate key.
 * *out is overwritten (release one it held before); on failure it holds
 * nothing to release. */
int sweep_search_parse(const cJSON *search, sweep_search *out, spec_error *err);

/* Frees what a parsed search holds (the values lists). Safe on a zeroed or
 * already released search. */
void sweep_search_release(sweep_search *s);

/* The normalized search, every default filled in: parsing it again gives
 * the same struct. The caller cJSON_Delete()s it; NULL when out of memory. */
cJSON *sweep_search_to_json(const sweep_search *s);

/* The grid's size: the product of the values lists' lengths (1 for none);
 * SWEEP_MAX_TRIALS + 1 when it is larger than SWEEP_MAX_TRIALS; 0 when a
 * parameter is not a values list. */
int sweep_grid_size(const sweep_search *s);

/* The number of trials the sweep runs (its max_trials, defaults resolved):
 * trials are numbered 0 .. sweep_n_trials() - 1. */
int sweep_n_trials(const sweep_search *s);

/* Trial `trial`'s parameters as {path: value}, the paths in the search's
 * order. Grid: trial t is t written in mixed radix over the values lists,
 * the last parameter varying fastest (trial 0 takes every list's first
 * value, trial 1 the last list's second, ...). Random and asha: drawn from
 * splitmix64 seeded by (seed, trial) alone (docs/sweeps.md gives the exact
 * rule), so the same seed gives the same trials on any machine and trial t
 * does not depend on the others. The caller cJSON_Delete()s it; NULL when
 * trial is out of range or out of memory. */
cJSON *sweep_trial_params(const sweep_search *s, int trial);

/* Writes each of params' {path: value} into a copy of job_spec (the spec as
 * submitted) and checks the result with jobspec_parse. A path's objects are
 * created when absent (`command.env.LR` creates env); an index `[i]` must
 * exist (`model.layers[1].units`); a name where an object is needed stands
 * for {"type": name}, as the spec's shorthand does (`compile.optimizer.
 * learning_rate` on "optimizer": "adam"). Values written under `command`
 * (env, argv) become strings, as a command needs them: numbers in the
 * shortest form that reads back as the same double (0.001 -> "0.001"),
 * booleans "true"/"false".
 * On success returns 0 with *spec_out the normalized spec (jobspec_to_json;
 * the caller frees it). On failure returns -1, *spec_out NULL, *err (may be
 * NULL) the spec's error (422 with the spec field at fault, e.g.
 * "fit.batch_size", "model.layers[9]") and `field` (fieldlen bytes; may be
 * NULL with 0) the parameter's path that caused it: the one the error's
 * field equals or lies under, else one that lies under the error's field,
 * else the first parameter. Out of memory: -1 with a 500. */
int sweep_apply(const cJSON *job_spec, const cJSON *params, char **spec_out,
                char *field, size_t fieldlen, spec_error *err);

/* ---------------------------------------------------------------- ASHA */

/* One row of sweep_rungs: `trial` reached rung `rung` (trained to
 * asha_rung_epochs()[rung] epochs) and scored `metric` there (the search's
 * metric, at the end of that rung); promoted: 1 once it was sent on to
 * rung + 1. */
typedef struct asha_rung_entry {
    int trial;
    int rung;
    double metric;
    int promoted;
} asha_rung_entry;

/* What asha_next decides when a slot may be free. */
enum {
    ASHA_WAIT = 0,                     /* nothing to start now: wait for a running trial */
    ASHA_START = 1,                    /* start trial *out_trial (== started) at rung 0 */
    ASHA_PROMOTE = 2,                  /* resume *out_trial to train rung *out_rung (its row
                                        * at *out_rung - 1 becomes promoted) */
    ASHA_DONE = 3                      /* nothing runs and nothing is left: the sweep is over;
                                        * a trial short of the last rung and never promoted
                                        * ends as stopped early */
};

/* ASHA's rungs: rung k trains to min_epochs * eta^k epochs (eta =
 * reduction_factor) while that is below max_epochs, and the last rung to
 * max_epochs: (1, 3, 9) gives 1, 3, 9; (1, 3, 10) gives 1, 3, 9, 10. Fills
 * the first min(n, cap) entries of epochs and returns n, the number of rungs
 * (at most SWEEP_MAX_RUNGS for any search sweep_search_parse accepts); 0 for
 * grid and random (their trials train the job's own fit.epochs). */
int asha_rung_epochs(const sweep_search *s, int *epochs, int cap);

/* A metric as a score where larger is better: the metric in mode max, its
 * negation in mode min; NaN scores -INFINITY (worst). Trials are ranked by
 * score, ties by trial index (the lower, which started first, ranks first). */
double asha_score(const sweep_search *s, double metric);

/* The next thing to do, from the sweep's rows alone (so a restarted server
 * decides as the one before it): entries, n of them, are every sweep_rungs
 * row (any order); started: trials started so far (0 .. started-1; failed
 * ones included); running: trials running now (promoted ones included).
 *  - running >= max_concurrent: ASHA_WAIT.
 *  - asha, from the highest rung below the last down to rung 0: of the
 *    trials that reached rung k (m of them), the best floor(m / eta) by
 *    asha_score are its promotable set; the best of them not yet promoted
 *    is promoted: ASHA_PROMOTE with *out_rung = k + 1.
 *  - else, when started < max_trials: ASHA_START, *out_trial = started,
 *    *out_rung = 0.
 *  - else ASHA_DONE when running == 0, ASHA_WAIT otherwise.
 * Grid and random take the same path with no promotions (entries are
 * ignored). Returns -1 when an entry names a rung or trial out of range. */
int asha_next(const sweep_search *s, const asha_rung_entry *entries, int n, int started,
              int running, int *out_trial, int *out_rung);

/* ASHA's decision for a trial at the end of a rung while its worker still
 * runs (it asks before it exits, docs/sweeps.md): `trial` has trained rung
 * `rung` and scored `metric` there; entries, n of them, are every
 * sweep_rungs row, none of them its own at that rung. Returns 1 when it
 * goes on to rung + 1 at once, in its process: rung + 1 exists and, its
 * result added to the m - 1 others at that rung, it ranks (asha_score,
 * ties to the lower trial) within the best floor(m / eta), the set
 * asha_next promotes from; so a trial is promoted as soon as it is in the
 * top 1/eta of the results at its rung, with no wait for the rest of the
 * rung. 0 when it stops there (its slot goes to asha_next's next decision;
 * it may still be promoted later, from its checkpoint, when enough worse
 * results come in). -1 when rung or an entry is out of range, or entries
 * hold the trial's own row at that rung already. */
int asha_continues(const sweep_search *s, const asha_rung_entry *entries, int n, int trial, int rung,
                   double metric);

#endif
