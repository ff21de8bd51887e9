/* sweep.c - hyperparameter search: parsing a search, listing its trials,
 * writing a trial's values into the job spec, and ASHA's rungs and
 * promotions. Pure: no storage, no clock, no HTTP (sweep.h; docs/sweeps.md,
 * "The search"). */
#include "sweep.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#define MAX_EXACT 9007199254740991.0   /* 2^53 - 1: the largest integer a JSON number keeps */
#define MAX_STRING 1024                /* a string in a values list, in bytes */
#define MAX_TOKENS 64                  /* a path's names and indexes */

typedef char fpath[JOBSPEC_FIELD_MAX];

/* ================================================================ errors */

/* The job spec's own error helpers (spec/jobspec.h), so a search's errors
 * read as the spec's do. */
#define fail jobspec_fail
#define safe jobspec_quote
#define got jobspec_got
#define list_text jobspec_names_text
#define find_name jobspec_find_name

/* Every key of obj is one of allowed (422 unknown_field) and none repeats
 * (400 bad_json, as the job spec answers a duplicate key). With few allowed
 * names a repeat shows within the first few keys, so this stays short on
 * any input. */
static int check_keys(spec_error *e, const cJSON *obj, const char *parent,
                      const char *const *allowed) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        fpath f;
        char k[48], list[200];
        (void)sfmt(f, sizeof f, "%s.%s", parent, safe(it->string, k));
        if (allowed && find_name(allowed, it->string) < 0)
            return fail(e, 422, "unknown_field", f, "unknown field \"%s\"; expected %s", k,
                        list_text(allowed, list, sizeof list));
        for (const cJSON *p = obj->child; p != it; p = p->next)
            if (strcmp(p->string, it->string) == 0)
                return fail(e, 400, "bad_json", f, "duplicate key \"%s\"", k);
    }
    return 0;
}

/* An integer field of the search: 0 when absent, 1 when *out was set, -1
 * with *e naming "search.KEY". */
static int get_int(spec_error *e, const cJSON *search, const char *key, long long lo,
                   long long hi, long long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(search, key);
    if (!v) return 0;
    fpath f;
    char g[64];
    (void)sfmt(f, sizeof f, "search.%s", key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0;
    const char *code = NULL;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d)) code = "invalid_type";
    else if (d < (double)lo || d > (double)hi) code = "invalid_value";
    if (code) return fail(e, 422, code, f, "must be an integer between %lld and %lld, got %s", lo, hi, got(v, g));
    *out = (long long)d;
    return 1;
}

/* ================================================================ paths */

/* One step of a parameter's path: a name (`fit`) or an index (`[1]`). */
typedef struct ptok {
    int is_index;
    int index;
    char key[SWEEP_PATH_MAX + 1];
} ptok;

/* Splits a path as the spec's errors write it: names `[A-Za-z_][A-Za-z0-9_]*`
 * joined by '.', each followed by any number of indexes `[N]` (N 0..99999,
 * no leading zeros). Returns the number of steps, or -1 when p is not such a
 * path or is longer than SWEEP_PATH_MAX. */
static int path_tokens(const char *p, ptok *t, int cap) {
    size_t len = strlen(p);
    if (len == 0 || len > SWEEP_PATH_MAX) return -1;
    int n = 0;
    const char *c = p;
    for (;;) {
        if (!(*c == '_' || (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z'))) return -1;
        const char *s = c;
        while (*c == '_' || (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
               (*c >= '0' && *c <= '9'))
            c++;
        if (n >= cap) return -1;
        t[n].is_index = 0;
        t[n].index = 0;
        memcpy(t[n].key, s, (size_t)(c - s));
        t[n].key[c - s] = '\0';
        n++;
        while (*c == '[') {
            c++;
            const char *d = c;
            int v = 0;
            while (*c >= '0' && *c <= '9' && c - d < 5) v = v * 10 + (*c++ - '0');
            if (c == d || *c != ']' || (c - d > 1 && *d == '0')) return -1;
            c++;
            if (n >= cap) return -1;
            t[n].is_index = 1;
            t[n].index = v;
            t[n].key[0] = '\0';
            n++;
        }
        if (*c == '\0') return n;
        if (*c != '.') return -1;
        c++;
    }
}

/* 1 when `inner` is `outer` or lies inside it (`fit` holds `fit.epochs`,
 * `model.layers` holds `model.layers[1].units`). */
static int path_within(const char *inner, const char *outer) {
    size_t n = strlen(outer);
    return strncmp(inner, outer, n) == 0 && (inner[n] == '\0' || inner[n] == '.' || inner[n] == '[');
}

/* ================================================================ parse */

static const char *const SEARCH_KEYS[] = {"method", "parameters", "metric", "mode",
                                          "max_trials", "max_concurrent", "seed", "max_epochs",
                                          "min_epochs", "reduction_factor", NULL};
static const char *const ASHA_KEYS[] = {"max_epochs", "min_epochs", "reduction_factor", NULL};
static const char *const METHOD_NAMES[] = {"grid", "random", "asha", NULL};
static const char *const DIST_NAMES[] = {"values", "uniform", "log_uniform", "int", NULL};
static const char *const MODE_NAMES[] = {"max", "min", NULL};

static int parse_values(spec_error *e, const cJSON *d, const char *base, sweep_param *p) {
    fpath f;
    char g[64];
    (void)sfmt(f, sizeof f, "%s.values", base);
    if (!cJSON_IsArray(d))
        return fail(e, 422, "invalid_type", f, "must be an array of numbers, strings or booleans, got %s",
                    got(d, g));
    int n = cJSON_GetArraySize(d);
    if (n < 1 || n > SWEEP_MAX_VALUES)
        return fail(e, 422, "invalid_value", f, "must hold 1 to %d values, got %d", SWEEP_MAX_VALUES, n);
    int i = 0;
    for (const cJSON *v = d->child; v; v = v->next, i++) {
        fpath fi;
        (void)sfmt(fi, sizeof fi, "%s[%d]", f, i);
        if (!(cJSON_IsNumber(v) || cJSON_IsString(v) || cJSON_IsBool(v)))
            return fail(e, 422, "invalid_type", fi, "must be a number, a string or a boolean, got %s",
                        got(v, g));
        if (cJSON_IsNumber(v) && !isfinite(v->valuedouble))
            return fail(e, 422, "invalid_type", fi, "must be a finite number");
        if (cJSON_IsString(v) && strlen(v->valuestring) > MAX_STRING)
            return fail(e, 422, "invalid_value", fi, "must be at most %d bytes", MAX_STRING);
    }
    p->dist = SP_VALUES;
    p->values = cJSON_Duplicate(d, 1);
    if (!p->values) return fail(e, 500, "internal", f, "out of memory");
    return 0;
}

static int parse_range(spec_error *e, const cJSON *d, const char *base, int kind, sweep_param *p) {
    fpath f;
    char g[64];
    (void)sfmt(f, sizeof f, "%s.%s", base, DIST_NAMES[kind]);
    const cJSON *a = cJSON_IsArray(d) && cJSON_GetArraySize(d) == 2 ? d->child : NULL;
    const cJSON *b = a ? a->next : NULL;
    int integral = kind == SP_INT;
    if (!a || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || !isfinite(a->valuedouble) ||
        !isfinite(b->valuedouble) ||
        (integral && (a->valuedouble != floor(a->valuedouble) || b->valuedouble != floor(b->valuedouble))))
        return fail(e, 422, "invalid_type", f, "must be [lo, hi], two %s with lo < hi, got %s",
                    integral ? "integers" : "numbers", got(d, g));
    double lo = a->valuedouble, hi = b->valuedouble;
    if (!(lo < hi))
        return fail(e, 422, "invalid_value", f, "must be [lo, hi] with lo < hi, got [%.15g, %.15g]", lo, hi);
    /* a uniform draw is lo + u * (hi - lo): the width must be a number too */
    if (!isfinite(hi - lo))
        return fail(e, 422, "invalid_value", f, "the range [%.15g, %.15g] is too wide to draw from", lo, hi);
    if (kind == SP_LOG_UNIFORM && lo <= 0)
        return fail(e, 422, "invalid_value", f,
                    "log_uniform draws uniformly between log(lo) and log(hi): lo must be > 0, got %.15g", lo);
    if (integral && (lo < -MAX_EXACT || hi > MAX_EXACT))
        return fail(e, 422, "invalid_value", f, "must lie within +-%.0f, got [%.15g, %.15g]", MAX_EXACT, lo, hi);
    p->dist = (sweep_dist)kind;
    p->lo = lo;
    p->hi = hi;
    return 0;
}

static int parse_param(spec_error *e, const cJSON *it, int grid, sweep_param *p) {
    fpath base;
    char k[48], g[64], list[128];
    ptok toks[MAX_TOKENS];
    if (path_tokens(it->string, toks, MAX_TOKENS) < 0) {
        (void)sfmt(base, sizeof base, "search.parameters.%s", safe(it->string, k));
        return fail(e, 422, "invalid_value", base,
                    "a parameter is a job spec path as its errors write it, such as "
                    "\"fit.batch_size\", \"model.layers[1].units\" or \"command.env.LR\" "
                    "(at most %d characters)", SWEEP_PATH_MAX);
    }
    snprintf(p->path, sizeof p->path, "%s", it->string);
    (void)sfmt(base, sizeof base, "search.parameters.%s", p->path);
    list_text(DIST_NAMES, list, sizeof list);
    if (!cJSON_IsObject(it))
        return fail(e, 422, "invalid_type", base, "must be an object with one of %s, got %s", list, got(it, g));
    if (check_keys(e, it, base, DIST_NAMES) < 0) return -1;
    const cJSON *d = it->child;
    if (!d)
        return fail(e, 422, "missing_field", base,
                    "needs a distribution: {\"values\": [...]}, {\"uniform\": [lo, hi]}, "
                    "{\"log_uniform\": [lo, hi]} or {\"int\": [lo, hi]}");
    if (d->next) {
        fpath f;
        (void)sfmt(f, sizeof f, "%s.%s", base, d->next->string);
        return fail(e, 422, "invalid_value", f, "a parameter takes one distribution, got both \"%s\" and \"%s\"",
                    d->string, d->next->string);
    }
    int kind = find_name(DIST_NAMES, d->string);
    if (grid && kind != SP_VALUES) {
        fpath f;
        (void)sfmt(f, sizeof f, "%s.%s", base, d->string);
        return fail(e, 422, "invalid_value", f,
                    "a grid runs every combination of values lists; %s draws need method "
                    "\"random\" or \"asha\"", d->string);
    }
    if (kind == SP_VALUES) return parse_values(e, d, base, p);
    return parse_range(e, d, base, kind, p);
}

/* The product of the values lists, capped at SWEEP_MAX_TRIALS + 1 (the
 * lists hold up to 1000 entries each: the exact product may not fit). */
int sweep_grid_size(const sweep_search *s) {
    long long n = 1;
    for (int i = 0; i < s->n_params; i++) {
        if (s->params[i].dist != SP_VALUES || !s->params[i].values) return 0;
        n *= cJSON_GetArraySize(s->params[i].values);
        if (n > SWEEP_MAX_TRIALS) return SWEEP_MAX_TRIALS + 1;
    }
    return (int)n;
}

static int parse_search(spec_error *e, const cJSON *search, sweep_search *out) {
    char g[64], list[128], k[48];
    if (!cJSON_IsObject(search))
        return fail(e, 422, "invalid_type", "search", "must be an object, got %s", got(search, g));
    if (check_keys(e, search, "search", SEARCH_KEYS) < 0) return -1;

    const cJSON *m = cJSON_GetObjectItemCaseSensitive(search, "method");
    list_text(METHOD_NAMES, list, sizeof list);
    if (!m) return fail(e, 422, "missing_field", "search.method", "a search needs a method: %s", list);
    int method = cJSON_IsString(m) ? find_name(METHOD_NAMES, m->valuestring) : -1;
    if (method < 0)
        return fail(e, 422, cJSON_IsString(m) ? "invalid_value" : "invalid_type", "search.method",
                    "must be %s, got %s", list, got(m, g));
    out->method = (sweep_method)method;
    if (method != SWEEP_ASHA)
        for (int i = 0; ASHA_KEYS[i]; i++)
            if (cJSON_GetObjectItemCaseSensitive(search, ASHA_KEYS[i])) {
                fpath f;
                (void)sfmt(f, sizeof f, "search.%s", ASHA_KEYS[i]);
                return fail(e, 422, "unknown_field", f,
                            "a %s search has no field \"%s\" (asha's rungs have it; %s trials train "
                            "the job's own fit.epochs)", METHOD_NAMES[method], ASHA_KEYS[i],
                            METHOD_NAMES[method]);
            }

    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(search, "parameters");
    if (!ps)
        return fail(e, 422, "missing_field", "search.parameters",
                    "a search needs parameters: {\"fit.batch_size\": {\"values\": [32, 64]}, ...}");
    if (!cJSON_IsObject(ps))
        return fail(e, 422, "invalid_type", "search.parameters",
                    "must be an object of job spec paths to distributions, got %s", got(ps, g));
    int np = cJSON_GetArraySize(ps);
    if (np < 1 || np > SWEEP_MAX_PARAMS)
        return fail(e, 422, "invalid_value", "search.parameters", "must hold 1 to %d parameters, got %d",
                    SWEEP_MAX_PARAMS, np);
    for (const cJSON *it = ps->child; it; it = it->next) {
        if (parse_param(e, it, method == SWEEP_GRID, &out->params[out->n_params]) < 0) {
            /* a half-parsed parameter may own its list: count it for the release */
            out->n_params++;
            return -1;
        }
        out->n_params++;
    }
    for (int j = 0; j < out->n_params; j++) {
        fpath f;
        const char *pj = out->params[j].path;
        (void)sfmt(f, sizeof f, "search.parameters.%s", pj);
        for (int i = 0; i < j; i++) {
            const char *pi = out->params[i].path;
            if (strcmp(pi, pj) == 0) return fail(e, 400, "bad_json", f, "duplicate key \"%s\"", pj);
            if (path_within(pi, pj) || path_within(pj, pi))
                return fail(e, 422, "invalid_value", f,
                            "overlaps the parameter \"%s\": a value cannot be written both at a path "
                            "and inside it", pi);
        }
        if (method == SWEEP_ASHA && path_within(pj, "fit.epochs"))
            return fail(e, 422, "invalid_value", f,
                        "asha sets fit.epochs itself: each rung trains to its own epochs "
                        "(min_epochs up to max_epochs)");
    }

    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(search, "metric");
    if (!mt)
        return fail(e, 422, "missing_field", "search.metric",
                    "a search needs the metric it optimizes, e.g. \"val_accuracy\" or \"val_loss\"");
    if (!cJSON_IsString(mt))
        return fail(e, 422, "invalid_type", "search.metric", "must be a string, got %s", got(mt, g));
    size_t ml = strlen(mt->valuestring);
    int ok = ml >= 1 && ml < sizeof out->metric;
    for (const char *c = mt->valuestring; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
             *c == '_' || *c == '.' || *c == '-';
    if (!ok)
        return fail(e, 422, "invalid_value", "search.metric",
                    "a metric name is 1 to %zu letters, digits, '_', '.' or '-', got \"%s\"",
                    sizeof out->metric - 1, safe(mt->valuestring, k));
    snprintf(out->metric, sizeof out->metric, "%s", mt->valuestring);

    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(search, "mode");
    list_text(MODE_NAMES, list, sizeof list);
    if (!mo)
        return fail(e, 422, "missing_field", "search.mode",
                    "a search needs a mode: \"max\" (larger %s is better) or \"min\"", out->metric);
    int mode = cJSON_IsString(mo) ? find_name(MODE_NAMES, mo->valuestring) : -1;
    if (mode < 0)
        return fail(e, 422, cJSON_IsString(mo) ? "invalid_value" : "invalid_type", "search.mode",
                    "must be %s, got %s", list, got(mo, g));
    out->mode_max = mode == 0;

    long long v = 0;
    int rc;
    if ((rc = get_int(e, search, "max_concurrent", 1, SWEEP_MAX_CONCURRENT, &v)) < 0) return -1;
    out->max_concurrent = rc ? (int)v : 2;
    if ((rc = get_int(e, search, "seed", 0, (long long)MAX_EXACT, &v)) < 0) return -1;
    out->seed = rc ? (uint64_t)v : 0;
    if (method == SWEEP_ASHA) {
        if ((rc = get_int(e, search, "max_epochs", 1, SWEEP_MAX_EPOCHS, &v)) < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", "search.max_epochs",
                        "asha needs max_epochs (1 to %d): the epochs of its last rung", SWEEP_MAX_EPOCHS);
        out->max_epochs = (int)v;
        if ((rc = get_int(e, search, "min_epochs", 1, out->max_epochs, &v)) < 0) return -1;
        out->min_epochs = rc ? (int)v : 1;
        if ((rc = get_int(e, search, "reduction_factor", 2, 10, &v)) < 0) return -1;
        out->reduction_factor = rc ? (int)v : 3;
    }

    int grid = sweep_grid_size(out);
    if (method == SWEEP_GRID && grid > SWEEP_MAX_TRIALS) {
        double full = 1;
        for (int i = 0; i < out->n_params; i++) full *= cJSON_GetArraySize(out->params[i].values);
        return fail(e, 422, "invalid_value", "search.parameters",
                    "a grid runs every combination, at most %d; these values lists make %.0f",
                    SWEEP_MAX_TRIALS, full);
    }
    if ((rc = get_int(e, search, "max_trials", 1, SWEEP_MAX_TRIALS, &v)) < 0) return -1;
    if (rc == 1) {
        if (method == SWEEP_GRID && v > grid)
            return fail(e, 422, "invalid_value", "search.max_trials",
                        "a grid has as many trials as combinations: must be 1 to %d, got %lld", grid, v);
        out->max_trials = (int)v;
    } else if (grid >= 1 && grid <= SWEEP_MAX_TRIALS) {
        out->max_trials = grid;
    } else if (grid > SWEEP_MAX_TRIALS) {
        return fail(e, 422, "missing_field", "search.max_trials",
                    "the values lists make more than %d combinations: say how many trials to draw "
                    "(1 to %d)", SWEEP_MAX_TRIALS, SWEEP_MAX_TRIALS);
    } else {
        return fail(e, 422, "missing_field", "search.max_trials",
                    "a %s search with %s draws needs max_trials (1 to %d): how many trials to draw",
                    METHOD_NAMES[method], "uniform, log_uniform or int", SWEEP_MAX_TRIALS);
    }
    return 0;
}

int sweep_search_parse(const cJSON *search, sweep_search *out, spec_error *err) {
    spec_error scratch;
    spec_error *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    memset(out, 0, sizeof *out);
    if (parse_search(e, search, out) == 0) return 0;
    sweep_search_release(out);
    return -1;
}

void sweep_search_release(sweep_search *s) {
    if (!s) return;
    for (int i = 0; i < s->n_params && i < SWEEP_MAX_PARAMS; i++) {
        cJSON_Delete(s->params[i].values);
        s->params[i].values = NULL;
    }
}

cJSON *sweep_search_to_json(const sweep_search *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = cJSON_AddStringToObject(o, "method", METHOD_NAMES[s->method]) != NULL;
    cJSON *ps = cJSON_AddObjectToObject(o, "parameters");
    ok = ok && ps;
    for (int i = 0; ok && i < s->n_params; i++) {
        const sweep_param *p = &s->params[i];
        cJSON *d = cJSON_AddObjectToObject(ps, p->path);
        cJSON *v = NULL;
        if (p->dist == SP_VALUES) {
            v = cJSON_Duplicate(p->values, 1);
        } else {
            double r[2] = {p->lo, p->hi};
            v = cJSON_CreateDoubleArray(r, 2);
        }
        if (!d || !v || !cJSON_AddItemToObject(d, DIST_NAMES[p->dist], v)) {
            cJSON_Delete(v);
            ok = 0;
        }
    }
    ok = ok && cJSON_AddStringToObject(o, "metric", s->metric) &&
         cJSON_AddStringToObject(o, "mode", s->mode_max ? "max" : "min") &&
         cJSON_AddNumberToObject(o, "max_trials", s->max_trials) &&
         cJSON_AddNumberToObject(o, "max_concurrent", s->max_concurrent) &&
         cJSON_AddNumberToObject(o, "seed", (double)s->seed);
    if (ok && s->method == SWEEP_ASHA)
        ok = cJSON_AddNumberToObject(o, "max_epochs", s->max_epochs) &&
             cJSON_AddNumberToObject(o, "min_epochs", s->min_epochs) &&
             cJSON_AddNumberToObject(o, "reduction_factor", s->reduction_factor);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ================================================================ trials */

int sweep_n_trials(const sweep_search *s) {
    return s->max_trials;
}

/* splitmix64 (Steele, Lea and Flood 2014; Vigna's reference code): a 64-bit
 * state advanced by the golden-ratio gamma, each output the state mixed.
 * Written out here, not taken from the C library, so that a seed gives the
 * same trials on every machine and every version. */
#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ULL

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t next64(uint64_t *state) {
    *state += SPLITMIX_GAMMA;
    return mix64(*state);
}

/* [0, 1) from the top 53 bits. */
static double unit(uint64_t *state) {
    return (double)(next64(state) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n), n >= 1: draws below 2^64 mod n are drawn again (so
 * every residue is equally likely), then r mod n. */
static uint64_t below(uint64_t *state, uint64_t n) {
    uint64_t t = (0 - n) % n;
    for (;;) {
        uint64_t r = next64(state);
        if (r >= t) return r % n;
    }
}

static cJSON *draw(const sweep_param *p, uint64_t *state) {
    switch (p->dist) {
    case SP_VALUES: {
        uint64_t i = below(state, (uint64_t)cJSON_GetArraySize(p->values));
        return cJSON_Duplicate(cJSON_GetArrayItem(p->values, (int)i), 1);
    }
    case SP_UNIFORM: {
        double x = p->lo + unit(state) * (p->hi - p->lo);
        return cJSON_CreateNumber(x > p->hi ? p->hi : x);
    }
    case SP_LOG_UNIFORM: {
        double a = log(p->lo), b = log(p->hi);
        double x = exp(a + unit(state) * (b - a));
        /* exp(log(x)) may land an ulp outside the bounds */
        return cJSON_CreateNumber(x < p->lo ? p->lo : x > p->hi ? p->hi : x);
    }
    case SP_INT: {
        int64_t lo = (int64_t)p->lo, hi = (int64_t)p->hi;
        uint64_t span = (uint64_t)(hi - lo) + 1;
        return cJSON_CreateNumber((double)(lo + (int64_t)below(state, span)));
    }
    }
    return NULL;
}

/* Random and ASHA over values only, with no more trials than combinations:
 * the combinations without replacement, in an order shuffled by the seed
 * (Fisher-Yates over the grid's indices with a generator seeded by the
 * seed alone), so no budget goes to a combination twice and max_trials
 * equal to the grid's size tries every one. The grid index of the trial. */
static int shuffled_index(const sweep_search *s, int grid, int trial) {
    int *perm = xmalloc((size_t)grid * sizeof *perm);
    for (int i = 0; i < grid; i++) perm[i] = i;
    uint64_t state = mix64(s->seed ^ 0x5EEDC0DEULL);
    for (int i = grid - 1; i > 0; i--) {
        int j = (int)below(&state, (uint64_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int ix = perm[trial];
    free(perm);
    return ix;
}

cJSON *sweep_trial_params(const sweep_search *s, int trial) {
    if (trial < 0 || trial >= s->max_trials) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int pick[SWEEP_MAX_PARAMS] = {0};
    int grid = s->method == SWEEP_GRID ? 0 : sweep_grid_size(s);
    int by_grid = s->method == SWEEP_GRID || (grid > 0 && grid <= SWEEP_MAX_TRIALS && s->max_trials <= grid);
    if (by_grid) {
        int t = s->method == SWEEP_GRID ? trial : shuffled_index(s, grid, trial);
        for (int i = s->n_params - 1; i >= 0; i--) {
            int k = cJSON_GetArraySize(s->params[i].values);
            pick[i] = t % k;
            t /= k;
        }
    }
    uint64_t state = mix64(mix64(s->seed) + (uint64_t)trial);
    for (int i = 0; i < s->n_params; i++) {
        const sweep_param *p = &s->params[i];
        cJSON *v = by_grid ? cJSON_Duplicate(cJSON_GetArrayItem(p->values, pick[i]), 1) : draw(p, &state);
        if (!v || !cJSON_AddItemToObject(o, p->path, v)) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* ================================================================ apply */

/* A value as a command reads it: integers as integers ("64", not "6.4e+01"),
 * other numbers in the fewest digits that read back as the same double. */
static void value_text(const cJSON *v, char *out, size_t cap) {
    if (cJSON_IsString(v)) {
        snprintf(out, cap, "%s", v->valuestring);
    } else if (cJSON_IsBool(v)) {
        snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) <= MAX_EXACT) {
            snprintf(out, cap, "%.0f", d);
            return;
        }
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, cap, "%.*g", prec, d);
            if (strtod(out, NULL) == d) return;
        }
    }
}

static const char *json_type(const cJSON *v) {
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    return "an object";
}

/* Writes value (owned: consumed on success and failure) at path in root. */
static int put_path(spec_error *e, cJSON *root, const char *path, cJSON *value) {
    ptok t[MAX_TOKENS];
    int n = path_tokens(path, t, MAX_TOKENS);
    if (n < 0 || t[0].is_index) {
        char k[48];
        cJSON_Delete(value);
        return fail(e, 422, "invalid_value", "", "\"%s\" is not a job spec path", safe(path, k));
    }
    fpath at = "";
    cJSON *cur = root;
    for (int i = 0; i < n; i++) {
        fpath here;
        if (t[i].is_index) (void)sfmt(here, sizeof here, "%s[%d]", at, t[i].index);
        else if (i == 0) (void)sfmt(here, sizeof here, "%s", t[i].key);
        else (void)sfmt(here, sizeof here, "%s.%s", at, t[i].key);
        cJSON *child;
        if (t[i].is_index) {
            child = cJSON_GetArrayItem(cur, t[i].index);
            if (!child) {
                int size = cJSON_GetArraySize(cur);
                cJSON_Delete(value);
                return fail(e, 422, "invalid_value", here, "%s has %d entr%s: there is no [%d]", at, size,
                            size == 1 ? "y" : "ies", t[i].index);
            }
            if (i == n - 1) {
                if (!cJSON_ReplaceItemInArray(cur, t[i].index, value)) goto oom;
                return 0;
            }
        } else {
            child = cJSON_GetObjectItemCaseSensitive(cur, t[i].key);
            if (i == n - 1) {
                int done = child ? cJSON_ReplaceItemInObjectCaseSensitive(cur, t[i].key, value)
                                 : cJSON_AddItemToObject(cur, t[i].key, value);
                if (!done) goto oom;
                return 0;
            }
            if (!child) {
                if (t[i + 1].is_index) {
                    cJSON_Delete(value);
                    return fail(e, 422, "invalid_value", here, "%s is not in the job spec: an index "
                                "[%d] needs an array that is there", here, t[i + 1].index);
                }
                child = cJSON_AddObjectToObject(cur, t[i].key);
                if (!child) goto oom;
            }
        }
        if (t[i + 1].is_index) {
            if (!cJSON_IsArray(child)) {
                cJSON_Delete(value);
                return fail(e, 422, "invalid_type", here, "is %s, not an array: there is no [%d] in it",
                            json_type(child), t[i + 1].index);
            }
        } else if (cJSON_IsString(child)) {
            /* the spec's shorthand: "optimizer": "adam" is {"type": "adam"} */
            cJSON *obj = cJSON_CreateObject();
            if (!obj) goto oom;
            if (!cJSON_AddStringToObject(obj, "type", child->valuestring)) {
                cJSON_Delete(obj);
                goto oom;
            }
            int done = t[i].is_index ? cJSON_ReplaceItemInArray(cur, t[i].index, obj)
                                     : cJSON_ReplaceItemInObjectCaseSensitive(cur, t[i].key, obj);
            if (!done) {
                cJSON_Delete(obj);
                goto oom;
            }
            child = obj;
        } else if (!cJSON_IsObject(child)) {
            cJSON_Delete(value);
            return fail(e, 422, "invalid_type", here, "is %s, not an object: it has no field \"%s\"",
                        json_type(child), t[i + 1].key);
        }
        cur = child;
        memcpy(at, here, sizeof at);
    }
    cJSON_Delete(value);
    return fail(e, 422, "invalid_value", "", "empty path");
oom:
    cJSON_Delete(value);
    return fail(e, 500, "internal", "", "out of memory");
}

/* The parameter an error belongs to: the one the error's field equals or
 * lies under; else one under the error's field (an error about
 * `command.env` as a whole); else the first. */
static const cJSON *blame(const cJSON *params, const char *field) {
    for (const cJSON *p = params->child; p; p = p->next)
        if (*field && path_within(field, p->string)) return p;
    for (const cJSON *p = params->child; p; p = p->next)
        if (*field && path_within(p->string, field)) return p;
    return params->child;
}

int sweep_apply(const cJSON *job_spec, const cJSON *params, char **spec_out, char *field,
                size_t fieldlen, spec_error *err) {
    spec_error scratch;
    spec_error *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    *spec_out = NULL;
    if (field && fieldlen) field[0] = '\0';
    if (!cJSON_IsObject(job_spec) || !cJSON_IsObject(params))
        return fail(e, 500, "internal", "", "the job spec and the parameters must be objects");
    cJSON *doc = cJSON_Duplicate(job_spec, 1);
    if (!doc) return fail(e, 500, "internal", "", "out of memory");
    int rc = -1;
    const cJSON *culprit = NULL;
    for (const cJSON *p = params->child; p; p = p->next) {
        cJSON *v;
        if (strncmp(p->string, "command.", 8) == 0 && !cJSON_IsString(p)) {
            /* env and argv hold strings; a number reads back from its text */
            char text[64];
            value_text(p, text, sizeof text);
            v = cJSON_CreateString(text);
        } else {
            v = cJSON_Duplicate(p, 1);
        }
        if (!v) {
            fail(e, 500, "internal", "", "out of memory");
            culprit = p;
            goto out;
        }
        if (put_path(e, doc, p->string, v) < 0) {
            culprit = p;
            goto out;
        }
    }
    char *text = cJSON_PrintUnformatted(doc);
    if (!text) {
        fail(e, 500, "internal", "", "out of memory");
        goto out;
    }
    jobspec js;
    int prc = jobspec_parse(text, strlen(text), &js, e);
    free(text);
    if (prc < 0) {
        culprit = blame(params, e->field);
        goto out;
    }
    if (jobspec_to_json(&js, spec_out) < 0) {
        jobspec_release(&js);
        fail(e, 500, "internal", "", "out of memory");
        goto out;
    }
    jobspec_release(&js);
    rc = 0;
out:
    cJSON_Delete(doc);
    if (rc < 0 && field && fieldlen) {
        if (!culprit) culprit = params->child;
        snprintf(field, fieldlen, "%s", culprit ? culprit->string : "");
    }
    return rc;
}

/* ================================================================ ASHA */

int asha_rung_epochs(const sweep_search *s, int *epochs, int cap) {
    if (s->method != SWEEP_ASHA) return 0;
    int n = 0;
    long long eta = s->reduction_factor, r = s->min_epochs;
    /* a search that was not parsed may hold a factor below 2: it gets the last rung only */
    while (eta >= 2 && r >= 1 && r < s->max_epochs && n < SWEEP_MAX_RUNGS - 1) {
        if (n < cap) epochs[n] = (int)r;
        n++;
        r *= eta;
    }
    if (n < cap) epochs[n] = s->max_epochs;
    return n + 1;
}

double asha_score(const sweep_search *s, double metric) {
    if (isnan(metric)) return -INFINITY;
    return s->mode_max ? metric : -metric;
}

typedef struct ranked {
    double score;
    int trial;
    int promoted;
} ranked;

static int by_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->trial > y->trial) - (x->trial < y->trial);
}

int asha_next(const sweep_search *s, const asha_rung_entry *entries, int n, int started,
              int running, int *out_trial, int *out_rung) {
    int epochs[SWEEP_MAX_RUNGS];
    int k_rungs = asha_rung_epochs(s, epochs, SWEEP_MAX_RUNGS);
    *out_trial = -1;
    *out_rung = -1;
    if (n < 0 || started < 0 || running < 0) return -1;
    if (s->method == SWEEP_ASHA) {
        for (int i = 0; i < n; i++)
            if (entries[i].rung < 0 || entries[i].rung >= k_rungs || entries[i].trial < 0 ||
                entries[i].trial >= s->max_trials)
                return -1;
    }
    if (running >= s->max_concurrent) return ASHA_WAIT;
    if (s->method == SWEEP_ASHA && n > 0) {
        ranked *r = xcalloc((size_t)n, sizeof *r);
        for (int k = k_rungs - 2; k >= 0; k--) {
            int m = 0;
            for (int i = 0; i < n; i++)
                if (entries[i].rung == k)
                    r[m++] = (ranked){asha_score(s, entries[i].metric), entries[i].trial, entries[i].promoted};
            int top = m / s->reduction_factor;
            if (top == 0) continue;
            qsort(r, (size_t)m, sizeof *r, by_rank);
            for (int j = 0; j < top; j++)
                if (!r[j].promoted) {
                    *out_trial = r[j].trial;
                    *out_rung = k + 1;
                    free(r);
                    return ASHA_PROMOTE;
                }
        }
        free(r);
    }
    if (started < s->max_trials) {
        *out_trial = started;
        *out_rung = 0;
        return ASHA_START;
    }
    return running == 0 ? ASHA_DONE : ASHA_WAIT;
}

int asha_continues(const sweep_search *s, const asha_rung_entry *entries, int n, int trial, int rung,
                   double metric) {
    int epochs[SWEEP_MAX_RUNGS];
    int k_rungs = asha_rung_epochs(s, epochs, SWEEP_MAX_RUNGS);
    if (s->method != SWEEP_ASHA || n < 0 || rung < 0 || rung >= k_rungs || trial < 0 || trial >= s->max_trials)
        return -1;
    ranked me = {asha_score(s, metric), trial, 0};
    int m = 1, ahead = 0;
    for (int i = 0; i < n; i++) {
        const asha_rung_entry *e = &entries[i];
        if (e->rung < 0 || e->rung >= k_rungs || e->trial < 0 || e->trial >= s->max_trials) return -1;
        if (e->rung != rung) continue;
        if (e->trial == trial) return -1;
        ranked other = {asha_score(s, e->metric), e->trial, e->promoted};
        m++;
        ahead += by_rank(&other, &me) < 0;
    }
    if (rung + 1 >= k_rungs) return 0;
    return ahead < m / s->reduction_factor;
}
