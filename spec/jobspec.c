/* jobspec.c - parse and validate a job spec (JSON, Keras-shaped) into a
 * jobspec with every default filled in, and print it back normalized.
 * The API validates every submission with it; workers and `trainyard train`
 * rebuild the model from the stored JSON with it. Field reference and the
 * error format: docs/jobspec.md. */
#include "jobspec.h"
#include "shapes.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/size.h"
#include "../common/util.h"

/* Command jobs run (executor/command.c); 0 would parse and check them, then
 * refuse them with 422 unsupported. */
#define JOBSPEC_COMMAND_JOBS 1

#define MNIST_FEATURES 784
#define MNIST_CLASSES 10
#define MNIST_TRAIN 60000L
#define MAX_SEED 9007199254740991LL /* 2^53 - 1: exact in a JSON number */
#define MAX_EXAMPLES 100000000L
#define MAX_SYNTH_FLOATS (1L << 28) /* examples * features of a synthetic set */
#define MAX_DIM (1 << 20)

typedef char fpath[JOBSPEC_FIELD_MAX];

/* ================================================================ names */

static const char *const ACT_NAMES[] = {"linear", "relu", "sigmoid", "tanh", "softmax", NULL};
#define LAYER_NAMES jobspec_layer_type_names /* spec/shapes.c */
#define PADDING_NAMES jobspec_padding_names
static const char *const INIT_NAMES[] = {"glorot_uniform", "he_normal", "zeros", NULL};
static const char *const OPT_NAMES[] = {"sgd", "rmsprop", "adam", "adagrad", NULL};
static const char *const LOSS_NAMES[] = {"binary_crossentropy", "categorical_crossentropy",
                                         "sparse_categorical_crossentropy", "mse", NULL};
static const char *const SOURCE_NAMES[] = {"fashion-mnist", "mnist", "csv", "synthetic", NULL};
static const char *const STRAT_NAMES[] = {"default", "one_device", "mirrored", "central_storage",
                                          "multi_worker_mirrored", "parameter_server", NULL};
static const char *const COMM_NAMES[] = {"auto", "ring", "nccl", NULL};
static const char *const CDO_NAMES[] = {"auto", "nccl", "hierarchical_copy",
                                        "reduction_to_one_device", NULL};
static const char *const DEVICE_NAMES[] = {"cpu", "gpu", NULL};
static const char *const INTERACTIVE_NAMES[] = {"notebook", "shell", NULL}; /* INTERACTIVE_* - 1 */

static const char *name_of(const char *const *names, int n, int i) {
    return (i >= 0 && i < n) ? names[i] : "?";
}
#define NAME_OF(tab, i) name_of(tab, (int)(sizeof tab / sizeof tab[0]) - 1, (int)(i))

const char *act_name(act_type a) { return NAME_OF(ACT_NAMES, a); }
const char *loss_name(loss_type l) { return NAME_OF(LOSS_NAMES, l); }
const char *opt_name(opt_type o) { return NAME_OF(OPT_NAMES, o); }
const char *strategy_name(strategy_type s) { return NAME_OF(STRAT_NAMES, s); }
const char *device_kind_name(device_kind d) { return NAME_OF(DEVICE_NAMES, d); }
const char *data_source_name(data_source s) { return NAME_OF(SOURCE_NAMES, s); }
const char *init_name(init_type i) { return NAME_OF(INIT_NAMES, i); }
const char *comm_name(comm_type c) { return NAME_OF(COMM_NAMES, c); }
const char *cdo_name(cdo_type c) { return NAME_OF(CDO_NAMES, c); }
const char *interactive_name(interactive_type t) {
    return t == INTERACTIVE_NONE ? "" : NAME_OF(INTERACTIVE_NAMES, (int)t - 1);
}

int jobspec_replicas(const jobspec *spec) {
    return spec->resources.workers * spec->resources.devices_per_worker;
}

int jobspec_elastic(const jobspec *spec) {
    return spec->resources.workers_min > 0 && spec->resources.workers_min < spec->resources.workers;
}

int jobspec_devices(const jobspec *spec) {
    return jobspec_replicas(spec); /* ps take CPU slots, not devices */
}

/* workers < 1 counts as 1, more than resources.workers as resources.workers;
 * a command job (steps 0) counts 1 step. */
int jobspec_micro_batches(const jobspec *s, int workers) {
    int steps = s->fit.gradient_accumulation_steps > 0 ? s->fit.gradient_accumulation_steps : 1;
    int full = s->resources.workers > 0 ? s->resources.workers : 1;
    if (workers < 1) workers = 1;
    if (workers > full) workers = full;
    long m = (long)steps * ((full + workers - 1) / workers);
    return m > INT_MAX ? INT_MAX : (int)m;
}

void jobspec_release(jobspec *spec) {
    if (!spec) return;
    command_spec *c = &spec->command;
    for (int i = 0; c->argv && c->argv[i]; i++) free(c->argv[i]);
    for (int i = 0; c->env && c->env[i]; i++) free(c->env[i]);
    free(c->argv);
    free(c->env);
    memset(c, 0, sizeof *c);
}

/* ================================================================ errors */

/* Short names for the helpers this file shares (jobspec.h). */
#define fail jobspec_fail
#define safe jobspec_quote
#define got jobspec_got
#define list_text jobspec_names_text
#define find_name jobspec_find_name

/* Fills *e and returns -1, so that checks read `return fail(...)`. */
int jobspec_fail(spec_error *e, int status, const char *code, const char *field,
                 const char *fmt, ...) {
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code);
    snprintf(e->field, sizeof e->field, "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* A user string made safe to quote in a message or a field path: printable
 * ASCII only (others become '?'), at most 40 characters, then "...". */
const char *jobspec_quote(const char *s, char out[48]) {
    size_t i = 0;
    for (; s[i] && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? (char)c : '?';
    }
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

static const char *join(char *dst, const char *parent, const char *key) {
    char k[48];
    if (*parent) (void)sfmt(dst, JOBSPEC_FIELD_MAX, "%s.%s", parent, safe(key, k));
    else (void)sfmt(dst, JOBSPEC_FIELD_MAX, "%s", safe(key, k));
    return dst;
}

static const char *join_index(char *dst, const char *parent, int i) {
    (void)sfmt(dst, JOBSPEC_FIELD_MAX, "%s[%d]", parent, i);
    return dst;
}

/* What a value is, for "got ..." in messages: a number prints itself, a
 * string is quoted, anything else names its JSON type. */
const char *jobspec_got(const cJSON *v, char out[64]) {
    char s[48];
    if (cJSON_IsNumber(v)) snprintf(out, 64, "%.15g", v->valuedouble);
    else if (cJSON_IsString(v)) snprintf(out, 64, "\"%s\"", safe(v->valuestring, s));
    else if (cJSON_IsTrue(v)) snprintf(out, 64, "true");
    else if (cJSON_IsFalse(v)) snprintf(out, 64, "false");
    else if (cJSON_IsNull(v)) snprintf(out, 64, "null");
    else if (cJSON_IsArray(v)) snprintf(out, 64, "an array");
    else snprintf(out, 64, "an object");
    return out;
}

/* "\"a\", \"b\" or \"c\"" */
const char *jobspec_names_text(const char *const *names, char *out, size_t cap) {
    size_t n = 0, used = 0;
    while (names[n]) n++;
    out[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++) {
        const char *sep = i == 0 ? "" : (i + 1 == n ? " or " : ", ");
        int w = snprintf(out + used, cap - used, "%s\"%s\"", sep, names[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return out;
}

/* ================================================================ lookups */

int jobspec_find_name(const char *const *names, const char *s) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

/* Edit distance, capped (keys are short), for "did you mean". */
static int distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 99;
    int row[41];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int best = prev + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            prev = cur;
        }
    }
    return row[lb];
}

/* Every key of obj must be one of allowed. owner (may be NULL) names what
 * the object is when the allowed set depends on a type, e.g. "a dropout
 * layer". 422 unknown_field with the key's path otherwise. */
static int check_keys(spec_error *e, const cJSON *obj, const char *parent,
                      const char *const *allowed, const char *owner) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (find_name(allowed, it->string) >= 0) continue;
        fpath f;
        char k[48], list[200];
        join(f, parent, it->string);
        safe(it->string, k);
        const char *best = NULL;
        int bestd = 3;
        for (int i = 0; allowed[i]; i++) {
            int d = distance(it->string, allowed[i]);
            if (d < bestd) { bestd = d; best = allowed[i]; }
        }
        list_text(allowed, list, sizeof list);
        if (owner && best)
            return fail(e, 422, "unknown_field", f,
                        "%s has no field \"%s\" (did you mean \"%s\"?)", owner, k, best);
        if (owner)
            return fail(e, 422, "unknown_field", f, "%s has no field \"%s\"; it takes %s",
                        owner, k, list);
        if (best)
            return fail(e, 422, "unknown_field", f, "unknown field \"%s\" (did you mean \"%s\"?)",
                        k, best);
        return fail(e, 422, "unknown_field", f, "unknown field \"%s\"; expected %s", k, list);
    }
    return 0;
}

static const cJSON *item(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* ================================================================ typed getters
 * Each returns 0 when the key is absent (out left as it was: the default),
 * 1 when it set *out, -1 with *e filled when the value is wrong. */

static int get_object(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                      const cJSON **out) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    if (!cJSON_IsObject(v)) {
        fpath f;
        char g[64];
        return fail(e, 422, "invalid_type", join(f, parent, key), "must be an object, got %s",
                    got(v, g));
    }
    *out = v;
    return 1;
}

static void int_range_text(char *out, size_t cap, long long lo, long long hi, int allow_null) {
    if (hi >= MAX_SEED) snprintf(out, cap, "an integer >= %lld", lo);
    else snprintf(out, cap, "an integer between %lld and %lld", lo, hi);
    if (allow_null) snprintf(out + strlen(out), cap - strlen(out), " (or null)");
}

static int get_ll(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                  long long lo, long long hi, int allow_null, long long *out) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    if (allow_null && cJSON_IsNull(v)) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0;
    const char *code = NULL;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d)) code = "invalid_type";
    else if (d < (double)lo || d > (double)hi) code = "invalid_value";
    if (code) {
        fpath f;
        char want[96], g[64];
        int_range_text(want, sizeof want, lo, hi, allow_null);
        return fail(e, 422, code, join(f, parent, key), "must be %s, got %s", want, got(v, g));
    }
    *out = (long long)d;
    return 1;
}

static int get_int(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                   long lo, long hi, int *out) {
    long long v = 0;
    int rc = get_ll(e, obj, parent, key, lo, hi, 0, &v);
    if (rc == 1) *out = (int)v;
    return rc;
}

static int get_long(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                    long lo, long hi, int allow_null, long *out) {
    long long v = 0;
    int rc = get_ll(e, obj, parent, key, lo, hi, allow_null, &v);
    if (rc == 1) *out = (long)v;
    return rc;
}

static int get_seed(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                    uint64_t *out) {
    long long v = 0;
    int rc = get_ll(e, obj, parent, key, 0, MAX_SEED, 0, &v);
    if (rc == 1) *out = (uint64_t)v;
    return rc;
}

/* A float in a range: lo (inclusive or not) to hi (INFINITY = unbounded;
 * inclusive or not). Checked after rounding to float, so the stored value is
 * the one checked and a printed spec parses again. */
static int get_float(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                     double lo, int lo_incl, double hi, int hi_incl, float *out) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    float x = cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
    double xd = x;
    const char *code = NULL;
    if (!cJSON_IsNumber(v)) code = "invalid_type";
    else if (!isfinite(x) || (lo_incl ? xd < lo : xd <= lo) || (hi_incl ? xd > hi : xd >= hi))
        code = "invalid_value";
    if (code) {
        fpath f;
        char want[96], g[64];
        if (isinf(hi)) snprintf(want, sizeof want, "a number %s %g", lo_incl ? ">=" : ">", lo);
        else snprintf(want, sizeof want, "a number in %c%g, %g%c", lo_incl ? '[' : '(', lo, hi,
                      hi_incl ? ']' : ')');
        return fail(e, 422, code, join(f, parent, key), "must be %s, got %s", want, got(v, g));
    }
    *out = x;
    return 1;
}

static int get_bool(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                    int *out) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) {
        fpath f;
        char g[64];
        return fail(e, 422, "invalid_type", join(f, parent, key), "must be true or false, got %s",
                    got(v, g));
    }
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 1;
}

/* A string that must be one of names (NULL-terminated); *out is its index. */
static int get_enum(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                    const char *const *names, int *out) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    int i = cJSON_IsString(v) ? find_name(names, v->valuestring) : -1;
    if (i < 0) {
        fpath f;
        char list[256], g[64];
        join(f, parent, key);
        list_text(names, list, sizeof list);
        if (!cJSON_IsString(v))
            return fail(e, 422, "invalid_type", f, "must be a string: %s; got %s", list, got(v, g));
        return fail(e, 422, "invalid_value", f, "must be %s, got %s", list, got(v, g));
    }
    *out = i;
    return 1;
}

static int get_string(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                      char *out, size_t cap) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    fpath f;
    char g[64];
    join(f, parent, key);
    if (!cJSON_IsString(v))
        return fail(e, 422, "invalid_type", f, "must be a string, got %s", got(v, g));
    size_t n = strlen(v->valuestring);
    if (n == 0 || n >= cap)
        return fail(e, 422, "invalid_value", f, "must be a string of 1 to %zu bytes, got %zu",
                    cap - 1, n);
    memcpy(out, v->valuestring, n + 1);
    return 1;
}

/* ================================================================ top level */

static const char *const TOP_KEYS[] = {"name", "priority", "model", "compile", "data", "fit",
                                       "strategy", "resources", "checkpoint", "max_runtime_s",
                                       "preemptible", "queue_if_infeasible", "max_restarts",
                                       "command", "environment", "logs", "ports", "interactive",
                                       "idle_timeout", NULL};

static int parse_name(spec_error *e, const cJSON *root, jobspec *s) {
    int rc = get_string(e, root, "", "name", s->name, sizeof s->name);
    if (rc <= 0) return rc;
    for (const char *p = s->name; *p; p++) {
        char c = *p;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '_' || c == '-')
            continue;
        char g[48];
        return fail(e, 422, "invalid_value", "name",
                    "must be 1 to 127 characters of A-Z a-z 0-9 . _ -, got \"%s\"",
                    safe(s->name, g));
    }
    return 1;
}

/* ================================================================ model */

static const char *const LAYER_KEYS[] = {"type", "units", "activation", "use_bias",
                                         "kernel_initializer", "bias_initializer",
                                         "kernel_regularizer", "input_shape", "rate", "seed",
                                         "filters", "kernel_size", "strides", "padding",
                                         "pool_size", "momentum", "epsilon", "center", "scale",
                                         "target_shape", NULL};
static const char *const DENSE_KEYS[] = {"type", "units", "activation", "use_bias",
                                         "kernel_initializer", "bias_initializer",
                                         "kernel_regularizer", "input_shape", NULL};
static const char *const REG_KEYS[] = {"l1", "l2", NULL};

/* kernel_regularizer: {"l1": x, "l2": y}, each in [0, 1] (Keras' L1L2). */
static int parse_regularizer(spec_error *e, const cJSON *layer, const char *lp, layer_spec *l) {
    const cJSON *r = NULL;
    int rc = get_object(e, layer, lp, "kernel_regularizer", &r);
    if (rc <= 0) return rc;
    fpath f;
    join(f, lp, "kernel_regularizer");
    if (check_keys(e, r, f, REG_KEYS, NULL)) return -1;
    if (get_float(e, r, f, "l1", 0, 1, 1, 1, &l->l1) < 0 || get_float(e, r, f, "l2", 0, 1, 1, 1, &l->l2) < 0)
        return -1;
    return 1;
}
static const char *const DROPOUT_KEYS[] = {"type", "rate", "seed", "input_shape", NULL};
static const char *const FLATTEN_KEYS[] = {"type", "input_shape", NULL};
static const char *const ACTIVATION_KEYS[] = {"type", "activation", "input_shape", NULL};
static const char *const CONV_KEYS[] = {"type", "filters", "kernel_size", "strides", "padding",
                                        "activation", "use_bias", "kernel_initializer",
                                        "bias_initializer", "kernel_regularizer", "input_shape",
                                        NULL};
static const char *const POOL_KEYS[] = {"type", "pool_size", "strides", "padding", "input_shape",
                                        NULL};
static const char *const GAP_KEYS[] = {"type", "input_shape", NULL};
static const char *const BN_KEYS[] = {"type", "momentum", "epsilon", "center", "scale",
                                      "input_shape", NULL};
static const char *const RESHAPE_KEYS[] = {"type", "target_shape", "input_shape", NULL};
#define MAX_WINDOW 1024 /* kernel_size, pool_size and strides: 1 .. this */

/* kernel_size, strides, pool_size: an integer k (meaning (k, k)) or a pair
 * [kh, kw], each 1..MAX_WINDOW. */
static int get_pair(spec_error *e, const cJSON *obj, const char *parent, const char *key,
                    int out[2]) {
    const cJSON *v = item(obj, key);
    if (!v) return 0;
    fpath f;
    char g[64];
    join(f, parent, key);
    const cJSON *a = v, *b = v;
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) != 2)
            return fail(e, 422, "invalid_value", f,
                        "must be an integer or a pair of integers [height, width] between 1 "
                        "and %d, got %d entries", MAX_WINDOW, cJSON_GetArraySize(v));
        a = v->child;
        b = v->child->next;
    }
    const cJSON *ab[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        double d = cJSON_IsNumber(ab[i]) ? ab[i]->valuedouble : 0;
        if (!cJSON_IsNumber(ab[i]) || !isfinite(d) || d != floor(d))
            return fail(e, 422, "invalid_type", f,
                        "must be an integer or a pair of integers [height, width] between 1 "
                        "and %d, got %s", MAX_WINDOW, got(v, g));
        if (d < 1 || d > MAX_WINDOW)
            return fail(e, 422, "invalid_value", f,
                        "must be an integer or a pair of integers [height, width] between 1 "
                        "and %d, got %s", MAX_WINDOW, got(v, g));
        out[i] = (int)d;
    }
    return 1;
}

/* reshape's target_shape: 1 to JOBSPEC_MAX_RANK positive integers, at most
 * one of them -1 (inferred from the input's size, as Keras). */
static int parse_target_shape(spec_error *e, const cJSON *layer, const char *lp, layer_spec *l) {
    const cJSON *v = item(layer, "target_shape");
    fpath f;
    char g[64];
    join(f, lp, "target_shape");
    if (!v)
        return fail(e, 422, "missing_field", f,
                    "a reshape layer needs a target_shape, e.g. [28, 28, 1]");
    if (!cJSON_IsArray(v))
        return fail(e, 422, "invalid_type", f, "must be an array of 1 to %d positive integers "
                    "(one may be -1), got %s", JOBSPEC_MAX_RANK, got(v, g));
    int n = cJSON_GetArraySize(v);
    if (n < 1 || n > JOBSPEC_MAX_RANK)
        return fail(e, 422, "invalid_value", f, "must hold 1 to %d dimensions, got %d",
                    JOBSPEC_MAX_RANK, n);
    int i = 0, unknown = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        fpath fi;
        join_index(fi, f, i);
        double x = cJSON_IsNumber(d) ? d->valuedouble : 0;
        if (!cJSON_IsNumber(d) || !isfinite(x) || x != floor(x))
            return fail(e, 422, "invalid_type", fi, "must be an integer between 1 and %d (or "
                        "-1), got %s", MAX_DIM, got(d, g));
        if (x == -1 && !unknown) {
            unknown = 1;
        } else if (x < 1 || x > MAX_DIM) {
            return fail(e, 422, "invalid_value", fi, "must be an integer between 1 and %d (or "
                        "-1 once), got %s", MAX_DIM, got(d, g));
        }
        l->target_shape[i] = (int)x;
    }
    l->target_rank = n;
    return 1;
}

/* conv2d's and dense's shared fields: activation, use_bias, initializers,
 * kernel_regularizer. */
static int parse_kernel_fields(spec_error *e, const cJSON *v, const char *lp, layer_spec *l);

static int parse_input_shape(spec_error *e, const cJSON *layer, const char *lp, int index,
                             layer_spec *l) {
    const cJSON *v = item(layer, "input_shape");
    if (!v) return 0;
    fpath f;
    char g[64];
    join(f, lp, "input_shape");
    if (index > 0)
        return fail(e, 422, "invalid_value", f,
                    "only the first layer takes input_shape (the others get their input from "
                    "the layer before)");
    if (!cJSON_IsArray(v))
        return fail(e, 422, "invalid_type", f, "must be an array of 1 to %d positive integers, "
                    "got %s", JOBSPEC_MAX_RANK, got(v, g));
    int n = cJSON_GetArraySize(v);
    if (n < 1 || n > JOBSPEC_MAX_RANK)
        return fail(e, 422, "invalid_value", f, "must hold 1 to %d dimensions, got %d",
                    JOBSPEC_MAX_RANK, n);
    long size = 1;
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        fpath fi;
        join_index(fi, f, i);
        double x = cJSON_IsNumber(d) ? d->valuedouble : 0;
        if (!cJSON_IsNumber(d) || !isfinite(x) || x != floor(x))
            return fail(e, 422, "invalid_type", fi, "must be an integer between 1 and %d, got %s",
                        MAX_DIM, got(d, g));
        if (x < 1 || x > MAX_DIM)
            return fail(e, 422, "invalid_value", fi, "must be an integer between 1 and %d, got %s",
                        MAX_DIM, got(d, g));
        l->input_shape[i] = (int)x;
        size *= (long)x;
        if (size > MAX_DIM)
            return fail(e, 422, "invalid_value", f, "describes more than %d features", MAX_DIM);
    }
    l->input_rank = n;
    return 1;
}

static int parse_layer(spec_error *e, const cJSON *v, const char *lp, int index, layer_spec *l) {
    char g[64];
    fpath f;
    if (!cJSON_IsObject(v))
        return fail(e, 422, "invalid_type", lp, "must be an object such as {\"type\": \"dense\", "
                    "\"units\": 10}, got %s", got(v, g));
    if (check_keys(e, v, lp, LAYER_KEYS, NULL)) return -1;
    int t = 0;
    int rc = get_enum(e, v, lp, "type", LAYER_NAMES, &t);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", join(f, lp, "type"),
                    "every layer needs a type: \"dense\", \"conv2d\", \"max_pooling2d\", "
                    "\"average_pooling2d\", \"global_average_pooling2d\", "
                    "\"batch_normalization\", \"dropout\", \"flatten\", \"reshape\" or "
                    "\"activation\"");
    l->type = (layer_type)t;
    l->activation = ACT_LINEAR;
    l->use_bias = 1;
    l->kernel_initializer = INIT_GLOROT_UNIFORM;
    l->bias_initializer = INIT_ZEROS;
    int a = 0;
    switch (l->type) {
    case LAYER_DENSE:
        if (check_keys(e, v, lp, DENSE_KEYS, "a dense layer")) return -1;
        rc = get_int(e, v, lp, "units", 1, JOBSPEC_MAX_UNITS, &l->units);
        if (rc < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", join(f, lp, "units"),
                        "a dense layer needs units (an integer between 1 and %d)",
                        JOBSPEC_MAX_UNITS);
        if (parse_kernel_fields(e, v, lp, l) < 0) return -1;
        break;
    case LAYER_CONV2D:
        if (check_keys(e, v, lp, CONV_KEYS, "a conv2d layer")) return -1;
        rc = get_int(e, v, lp, "filters", 1, JOBSPEC_MAX_UNITS, &l->filters);
        if (rc < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", join(f, lp, "filters"),
                        "a conv2d layer needs filters (an integer between 1 and %d)",
                        JOBSPEC_MAX_UNITS);
        rc = get_pair(e, v, lp, "kernel_size", l->kernel_size);
        if (rc < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", join(f, lp, "kernel_size"),
                        "a conv2d layer needs a kernel_size: an integer such as 3 or a pair "
                        "such as [3, 3]");
        l->strides[0] = l->strides[1] = 1;
        if (get_pair(e, v, lp, "strides", l->strides) < 0) return -1;
        if ((rc = get_enum(e, v, lp, "padding", PADDING_NAMES, &a)) < 0) return -1;
        if (rc) l->padding = (padding_type)a;
        if (parse_kernel_fields(e, v, lp, l) < 0) return -1;
        break;
    case LAYER_MAX_POOLING2D:
    case LAYER_AVERAGE_POOLING2D:
        if (check_keys(e, v, lp, POOL_KEYS, l->type == LAYER_MAX_POOLING2D
                                                ? "a max_pooling2d layer"
                                                : "an average_pooling2d layer"))
            return -1;
        l->pool_size[0] = l->pool_size[1] = 2;
        if (get_pair(e, v, lp, "pool_size", l->pool_size) < 0) return -1;
        l->strides[0] = l->pool_size[0]; /* Keras: strides=None means pool_size */
        l->strides[1] = l->pool_size[1];
        {
            const cJSON *sv = item(v, "strides");
            if (!(sv && cJSON_IsNull(sv)) && get_pair(e, v, lp, "strides", l->strides) < 0)
                return -1;
        }
        if ((rc = get_enum(e, v, lp, "padding", PADDING_NAMES, &a)) < 0) return -1;
        if (rc) l->padding = (padding_type)a;
        break;
    case LAYER_GLOBAL_AVERAGE_POOLING2D:
        if (check_keys(e, v, lp, GAP_KEYS, "a global_average_pooling2d layer")) return -1;
        break;
    case LAYER_BATCH_NORMALIZATION:
        if (check_keys(e, v, lp, BN_KEYS, "a batch_normalization layer")) return -1;
        l->momentum = 0.99f;
        l->epsilon = 1e-3f;
        l->center = l->scale = 1;
        if (get_float(e, v, lp, "momentum", 0, 1, 1, 1, &l->momentum) < 0) return -1;
        if (get_float(e, v, lp, "epsilon", 0, 0, 1, 1, &l->epsilon) < 0) return -1;
        if (get_bool(e, v, lp, "center", &l->center) < 0) return -1;
        if (get_bool(e, v, lp, "scale", &l->scale) < 0) return -1;
        break;
    case LAYER_RESHAPE:
        if (check_keys(e, v, lp, RESHAPE_KEYS, "a reshape layer")) return -1;
        if (parse_target_shape(e, v, lp, l) < 0) return -1;
        break;
    case LAYER_DROPOUT:
        if (check_keys(e, v, lp, DROPOUT_KEYS, "a dropout layer")) return -1;
        rc = get_float(e, v, lp, "rate", 0, 1, 1, 0, &l->rate);
        if (rc < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", join(f, lp, "rate"),
                        "a dropout layer needs a rate (a number in [0, 1))");
        if ((rc = get_seed(e, v, lp, "seed", &l->seed)) < 0) return -1;
        l->has_seed = rc;
        break;
    case LAYER_FLATTEN:
        if (check_keys(e, v, lp, FLATTEN_KEYS, "a flatten layer")) return -1;
        break;
    case LAYER_ACTIVATION:
        if (check_keys(e, v, lp, ACTIVATION_KEYS, "an activation layer")) return -1;
        rc = get_enum(e, v, lp, "activation", ACT_NAMES, &a);
        if (rc < 0) return -1;
        if (rc == 0)
            return fail(e, 422, "missing_field", join(f, lp, "activation"),
                        "an activation layer needs an activation: \"linear\", \"relu\", "
                        "\"sigmoid\", \"tanh\" or \"softmax\"");
        l->activation = (act_type)a;
        break;
    }
    if (parse_input_shape(e, v, lp, index, l) < 0) return -1;
    return 0;
}

static int parse_kernel_fields(spec_error *e, const cJSON *v, const char *lp, layer_spec *l) {
    int a = 0, k = 0, b = 0, rc;
    const cJSON *av = item(v, "activation");
    if (av && cJSON_IsNull(av)) {
        l->activation = ACT_LINEAR; /* Keras: activation=None */
    } else {
        if ((rc = get_enum(e, v, lp, "activation", ACT_NAMES, &a)) < 0) return -1;
        if (rc) l->activation = (act_type)a;
    }
    if (get_bool(e, v, lp, "use_bias", &l->use_bias) < 0) return -1;
    if ((rc = get_enum(e, v, lp, "kernel_initializer", INIT_NAMES, &k)) < 0) return -1;
    if (rc) l->kernel_initializer = (init_type)k;
    if ((rc = get_enum(e, v, lp, "bias_initializer", INIT_NAMES, &b)) < 0) return -1;
    if (rc) l->bias_initializer = (init_type)b;
    if (parse_regularizer(e, v, lp, l) < 0) return -1;
    return 0;
}

static int parse_model(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *m = NULL;
    int rc = get_object(e, root, "", "model", &m);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "model",
                    "a job needs a model: {\"layers\": [...]} (or, later, a command)");
    static const char *const MODEL_KEYS[] = {"layers", NULL};
    if (check_keys(e, m, "model", MODEL_KEYS, NULL)) return -1;
    const cJSON *layers = item(m, "layers");
    char g[64];
    if (!layers)
        return fail(e, 422, "missing_field", "model.layers",
                    "the model needs a list of layers, e.g. [{\"type\": \"dense\", \"units\": 10}]");
    if (!cJSON_IsArray(layers))
        return fail(e, 422, "invalid_type", "model.layers", "must be an array of layers, got %s",
                    got(layers, g));
    int n = cJSON_GetArraySize(layers);
    if (n < 1 || n > JOBSPEC_MAX_LAYERS)
        return fail(e, 422, "invalid_value", "model.layers", "must hold 1 to %d layers, got %d",
                    JOBSPEC_MAX_LAYERS, n);
    int i = 0;
    for (const cJSON *l = layers->child; l; l = l->next, i++) {
        fpath lp;
        join_index(lp, "model.layers", i);
        if (parse_layer(e, l, lp, i, &s->layers[i]) < 0) return -1;
    }
    s->n_layers = n;
    return 0;
}

/* ================================================================ compile */

static const char *const OPT_KEYS[] = {"type", "learning_rate", "momentum", "nesterov", "rho",
                                       "epsilon", "beta_1", "beta_2", "amsgrad", "centered",
                                       "initial_accumulator_value", NULL};
static const char *const SGD_KEYS[] = {"type", "learning_rate", "momentum", "nesterov", NULL};
static const char *const RMSPROP_KEYS[] = {"type", "learning_rate", "rho", "momentum",
                                           "epsilon", "centered", NULL};
static const char *const ADAM_KEYS[] = {"type", "learning_rate", "beta_1", "beta_2", "epsilon",
                                        "amsgrad", NULL};
static const char *const ADAGRAD_KEYS[] = {"type", "learning_rate",
                                           "initial_accumulator_value", "epsilon", NULL};

static void optimizer_defaults(optimizer_spec *o, opt_type t) {
    memset(o, 0, sizeof *o);
    o->type = t;
    switch (t) {
    case OPT_SGD:
        o->learning_rate = 0.01f;
        break;
    case OPT_RMSPROP:
        o->learning_rate = 0.001f;
        o->rho = 0.9f;
        o->epsilon = 1e-7f;
        break;
    case OPT_ADAM:
        o->learning_rate = 0.001f;
        o->beta_1 = 0.9f;
        o->beta_2 = 0.999f;
        o->epsilon = 1e-7f;
        break;
    case OPT_ADAGRAD:
        o->learning_rate = 0.001f;
        o->initial_accumulator_value = 0.1f;
        o->epsilon = 1e-7f;
        break;
    }
}

static int parse_optimizer(spec_error *e, const cJSON *c, optimizer_spec *o) {
    const char *p = "compile.optimizer";
    const cJSON *v = item(c, "optimizer");
    char list[128], g[64];
    if (!cJSON_IsObject(v) && !(cJSON_IsString(v) && find_name(OPT_NAMES, v->valuestring) >= 0))
        list_text(OPT_NAMES, list, sizeof list);
    else list[0] = '\0';
    if (!v)
        return fail(e, 422, "missing_field", p,
                    "compile needs an optimizer: %s, or an object such as {\"type\": \"sgd\", "
                    "\"learning_rate\": 0.01}", list);
    if (cJSON_IsString(v)) {
        int t = find_name(OPT_NAMES, v->valuestring);
        if (t < 0) return fail(e, 422, "invalid_value", p, "must be %s, got %s", list, got(v, g));
        optimizer_defaults(o, (opt_type)t);
        return 0;
    }
    if (!cJSON_IsObject(v))
        return fail(e, 422, "invalid_type", p, "must be a string (%s) or an object with a type, "
                    "got %s", list, got(v, g));
    if (check_keys(e, v, p, OPT_KEYS, NULL)) return -1;
    int t = 0;
    int rc = get_enum(e, v, p, "type", OPT_NAMES, &t);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "compile.optimizer.type",
                    "the optimizer needs a type: %s", list_text(OPT_NAMES, list, sizeof list));
    optimizer_defaults(o, (opt_type)t);
    static const char *const *const KEYS[] = {SGD_KEYS, RMSPROP_KEYS, ADAM_KEYS, ADAGRAD_KEYS};
    static const char *const OWNER[] = {"the sgd optimizer", "the rmsprop optimizer",
                                        "the adam optimizer", "the adagrad optimizer"};
    if (check_keys(e, v, p, KEYS[t], OWNER[t])) return -1;
    /* Every getter leaves absent fields at their default; a key the type
     * does not have was refused just above, so reading it is harmless. */
    if (get_float(e, v, p, "learning_rate", 0, 0, INFINITY, 0, &o->learning_rate) < 0 ||
        get_float(e, v, p, "momentum", 0, 1, 1, 0, &o->momentum) < 0 ||
        get_bool(e, v, p, "nesterov", &o->nesterov) < 0 ||
        get_float(e, v, p, "rho", 0, 1, 1, 0, &o->rho) < 0 ||
        get_bool(e, v, p, "centered", &o->centered) < 0 ||
        get_float(e, v, p, "beta_1", 0, 1, 1, 0, &o->beta_1) < 0 ||
        get_float(e, v, p, "beta_2", 0, 1, 1, 0, &o->beta_2) < 0 ||
        get_bool(e, v, p, "amsgrad", &o->amsgrad) < 0 ||
        get_float(e, v, p, "initial_accumulator_value", 0, 1, INFINITY, 0,
                  &o->initial_accumulator_value) < 0 ||
        get_float(e, v, p, "epsilon", 0, 0, INFINITY, 0, &o->epsilon) < 0)
        return -1;
    return 0;
}

static int parse_compile(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *c = NULL;
    int rc = get_object(e, root, "", "compile", &c);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "compile",
                    "a job needs compile: {\"optimizer\": ..., \"loss\": ...}");
    static const char *const COMPILE_KEYS[] = {"optimizer", "loss", "metrics", NULL};
    if (check_keys(e, c, "compile", COMPILE_KEYS, NULL)) return -1;
    if (parse_optimizer(e, c, &s->optimizer) < 0) return -1;
    int l = 0;
    const cJSON *lv = item(c, "loss");
    if (lv && cJSON_IsString(lv) && strcmp(lv->valuestring, "mean_squared_error") == 0) {
        l = LOSS_MSE; /* the Keras alias */
    } else {
        rc = get_enum(e, c, "compile", "loss", LOSS_NAMES, &l);
        if (rc < 0) return -1;
        if (rc == 0) {
            char list[160];
            return fail(e, 422, "missing_field", "compile.loss", "compile needs a loss: %s",
                        list_text(LOSS_NAMES, list, sizeof list));
        }
    }
    s->loss = (loss_type)l;
    const cJSON *m = item(c, "metrics");
    if (!m) return 0;
    char g[64];
    if (!cJSON_IsArray(m))
        return fail(e, 422, "invalid_type", "compile.metrics",
                    "must be an array of metric names such as [\"accuracy\"], got %s", got(m, g));
    int i = 0;
    for (const cJSON *x = m->child; x; x = x->next, i++) {
        fpath f;
        join_index(f, "compile.metrics", i);
        if (!cJSON_IsString(x))
            return fail(e, 422, "invalid_type", f, "must be a string (\"accuracy\"), got %s",
                        got(x, g));
        if (strcmp(x->valuestring, "accuracy") != 0 && strcmp(x->valuestring, "acc") != 0)
            return fail(e, 422, "invalid_value", f, "must be \"accuracy\" (or \"acc\"), got %s",
                        got(x, g));
        s->metric_accuracy = 1;
    }
    return 0;
}

/* ================================================================ data */

static const char *const DATA_KEYS[] = {"source", "path", "label_column", "header",
                                        "validation_split", "shuffle_buffer", "seed", "limit",
                                        "examples", "features", NULL};
static const char *const DATA_MNIST_KEYS[] = {"source", "path", "validation_split",
                                              "shuffle_buffer", "seed", "limit", NULL};
static const char *const DATA_CSV_KEYS[] = {"source", "path", "label_column", "header",
                                            "validation_split", "shuffle_buffer", "seed",
                                            "limit", NULL};
static const char *const DATA_SYNTH_KEYS[] = {"source", "examples", "features",
                                              "validation_split", "shuffle_buffer", "seed",
                                              "limit", NULL};

static int parse_data(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *d = NULL;
    data_spec *ds = &s->data;
    const char *p = "data";
    int rc = get_object(e, root, "", "data", &d);
    char list[128], g[64];
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "data", "a job needs data: {\"source\": %s}",
                    list_text(SOURCE_NAMES, list, sizeof list));
    if (check_keys(e, d, p, DATA_KEYS, NULL)) return -1;
    int src = 0;
    rc = get_enum(e, d, p, "source", SOURCE_NAMES, &src);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "data.source", "data needs a source: %s",
                    list_text(SOURCE_NAMES, list, sizeof list));
    ds->source = (data_source)src;
    static const char *const *const KEYS[] = {DATA_MNIST_KEYS, DATA_MNIST_KEYS, DATA_CSV_KEYS,
                                              DATA_SYNTH_KEYS};
    static const char *const OWNER[] = {"source fashion-mnist", "source mnist", "source csv",
                                        "source synthetic"};
    if (check_keys(e, d, p, KEYS[src], OWNER[src])) return -1;

    rc = get_string(e, d, p, "path", ds->path, sizeof ds->path);
    if (rc < 0) return -1;
    for (const char *c = ds->path; rc > 0 && *c;) { /* the agent confines it too (executor/data/dataroot.h) */
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return fail(e, 422, "invalid_value", "data.path",
                        "must stay under the agent's data roots: no \"..\" component");
        c += len;
        while (*c == '/') c++;
    }
    if (rc == 0 && ds->source == DATA_CSV)
        return fail(e, 422, "missing_field", "data.path",
                    "source csv needs the path of the CSV file");
    if (rc == 0 && ds->source == DATA_MNIST)
        return fail(e, 422, "missing_field", "data.path",
                    "source mnist needs the directory of its IDX files (no package ships MNIST; "
                    "fashion-mnist has a default)");
    const cJSON *lc = item(d, "label_column");
    if (lc && cJSON_IsString(lc)) {
        if (get_string(e, d, p, "label_column", ds->label_column_name,
                       sizeof ds->label_column_name) < 0)
            return -1;
    } else if (lc) {
        if (!cJSON_IsNumber(lc))
            return fail(e, 422, "invalid_type", "data.label_column",
                        "must be a column index (an integer, -1 = last) or a header name, got %s",
                        got(lc, g));
        if (get_int(e, d, p, "label_column", -65536, 65535, &ds->label_column) < 0) return -1;
    }
    if (get_bool(e, d, p, "header", &ds->header) < 0) return -1;
    if (ds->label_column_name[0] && !ds->header)
        return fail(e, 422, "invalid_value", "data.label_column",
                    "a column name needs a header line (header is false): give a column index");
    if (get_float(e, d, p, "validation_split", 0, 1, 1, 0, &ds->validation_split) < 0) return -1;
    {
        const cJSON *sb = item(d, "shuffle_buffer");
        if (sb && cJSON_IsNumber(sb) && sb->valuedouble < -1)
            return fail(e, 422, "invalid_value", "data.shuffle_buffer",
                        "must be an integer >= 0 (or -1 for the whole data set), got %s",
                        got(sb, g));
        if (get_int(e, d, p, "shuffle_buffer", -1, 2147483647L, &ds->shuffle_buffer) < 0)
            return -1;
    }
    if (get_seed(e, d, p, "seed", &ds->seed) < 0) return -1;
    if (get_long(e, d, p, "limit", 1, MAX_EXAMPLES, 1, &ds->limit) < 0) return -1;
    if (get_long(e, d, p, "examples", 1, MAX_EXAMPLES, 0, &ds->examples) < 0) return -1;
    if (get_int(e, d, p, "features", 1, MAX_DIM, &ds->features) < 0) return -1;
    if (ds->source == DATA_SYNTHETIC && (double)ds->examples * ds->features > MAX_SYNTH_FLOATS)
        return fail(e, 422, "invalid_value", "data.examples",
                    "examples x features must be at most %ld floats, got %ld x %d",
                    MAX_SYNTH_FLOATS, ds->examples, ds->features);
    return 0;
}

/* ================================================================ fit */

static int parse_fit(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *f = NULL;
    int rc = get_object(e, root, "", "fit", &f);
    if (rc <= 0) return rc;
    static const char *const FIT_KEYS[] = {"epochs", "batch_size", "steps_per_epoch",
                                           "gradient_accumulation_steps", NULL};
    if (check_keys(e, f, "fit", FIT_KEYS, NULL)) return -1;
    if (get_int(e, f, "fit", "epochs", 1, 100000, &s->fit.epochs) < 0 ||
        get_int(e, f, "fit", "batch_size", 1, 65536, &s->fit.batch_size) < 0 ||
        get_long(e, f, "fit", "steps_per_epoch", 1, 1000000000L, 1, &s->fit.steps_per_epoch) < 0 ||
        get_int(e, f, "fit", "gradient_accumulation_steps", 1, 65536,
                &s->fit.gradient_accumulation_steps) < 0)
        return -1;
    return 0;
}

/* ================================================================ command */

static char *env_entry(const char *name, const char *value) {
    size_t n = strlen(name) + 1 + strlen(value) + 1;
    char *out = xmalloc(n);
    snprintf(out, n, "%s=%s", name, value);
    return out;
}

/* The variables the worker sets for every task of a command job
 * (docs/command-jobs.md); TRAINYARD_* are all reserved too. */
static const char *const RESERVED_ENV[] = {
    "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", NULL};

int jobspec_env_reserved(const char *name) {
    if (strncmp(name, "TRAINYARD_", 10) == 0) return 1;
    for (int i = 0; RESERVED_ENV[i]; i++)
        if (strcmp(name, RESERVED_ENV[i]) == 0) return 1;
    return 0;
}

/* command.working_dir: relative, no ".." component, 1-1023 bytes. */
static int parse_working_dir(spec_error *e, const cJSON *c, command_spec *cs) {
    const cJSON *wd = item(c, "working_dir");
    char g[64];
    if (!wd) return 0;
    if (!cJSON_IsString(wd))
        return fail(e, 422, "invalid_type", "command.working_dir",
                    "must be a string (a directory relative to the agent's data root), got %s",
                    got(wd, g));
    const char *d = wd->valuestring;
    size_t n = strlen(d);
    if (n < 1 || n >= JOBSPEC_PATH_MAX)
        return fail(e, 422, "invalid_value", "command.working_dir",
                    "must be 1 to %d bytes, got %zu", JOBSPEC_PATH_MAX - 1, n);
    if (d[0] == '/')
        return fail(e, 422, "invalid_value", "command.working_dir",
                    "must be relative (to the agent's data root), not an absolute path");
    for (const char *p = d; *p;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return fail(e, 422, "invalid_value", "command.working_dir",
                        "must stay under the agent's data root: no \"..\" component");
        p += len;
        while (*p == '/') p++;
    }
    memcpy(cs->working_dir, d, n + 1);
    return 0;
}

/* command.context (or interactive.context: field names which):
 * "sha256:" and 64 lowercase hex digits (POST /contexts answers it);
 * whether the team has it is the server's question. */
static int parse_context(spec_error *e, const cJSON *c, command_spec *cs, const char *field) {
    const cJSON *v = item(c, "context");
    char g[64];
    if (!v) return 0;
    if (!cJSON_IsString(v))
        return fail(e, 422, "invalid_type", field, "must be a string (the id POST /contexts answered), got %s",
                    got(v, g));
    const char *d = v->valuestring;
    int ok = strlen(d) == 71 && strncmp(d, "sha256:", 7) == 0;
    for (int i = 7; ok && i < 71; i++) ok = (d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f');
    if (!ok)
        return fail(e, 422, "invalid_value", field,
                    "must be \"sha256:\" and 64 lowercase hex digits, as POST /contexts answers it");
    memcpy(cs->context, d, 72);
    return 0;
}

/* A path component of an image name: [a-z0-9]+ joined by '.', '_', '__' or '-'+. */
static int image_component_ok(const char *p, size_t n) {
    if (n == 0 || !((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= '0' && p[0] <= '9'))) return 0;
    if (!((p[n - 1] >= 'a' && p[n - 1] <= 'z') || (p[n - 1] >= '0' && p[n - 1] <= '9'))) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) continue;
        if (ch != '.' && ch != '_' && ch != '-') return 0;
        if (ch == '.' && (p[i + 1] == '.' || p[i + 1] == '_' || p[i + 1] == '-')) return 0;
        if (ch == '_' && p[i + 1] == '_' && p[i + 2] == '_') return 0;
    }
    return 1;
}

/* The first component is a registry host when it has a '.' or a ':' or is
 * "localhost" (the rule docker and podman resolve names by). */
static int image_first_is_host(const char *p, size_t n) {
    if (n == 9 && strncmp(p, "localhost", 9) == 0) return 1;
    return memchr(p, '.', n) || memchr(p, ':', n);
}

void jobspec_image_registry(const char *image, char *out, size_t outlen) {
    const char *slash = strchr(image, '/');
    if (slash && image_first_is_host(image, (size_t)(slash - image)))
        snprintf(out, outlen, "%.*s", (int)(slash - image), image);
    else
        snprintf(out, outlen, "docker.io");
}

/* An OCI image reference: [host[:port]/]path[:tag][@sha256:hex]. The
 * reference goes to the container runtime as one argument: never one that
 * starts with '-', holds a space or anything outside the grammar. */
static const char *image_ref_check(const char *r) {
    size_t n = strlen(r);
    if (n == 0) return "must not be empty";
    if (n >= JOBSPEC_IMAGE_MAX) return "must be at most 255 bytes";
    const char *at = strchr(r, '@');
    size_t name_end = at ? (size_t)(at - r) : n;
    if (at) {
        const char *d = at + 1;
        int ok = strlen(d) == 71 && strncmp(d, "sha256:", 7) == 0;
        for (int i = 7; ok && i < 71; i++) ok = (d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f');
        if (!ok) return "a digest is '@sha256:' and 64 lowercase hex digits";
    }
    /* the tag: after the last ':' that follows the last '/' */
    const char *last_slash = NULL;
    for (size_t i = 0; i < name_end; i++)
        if (r[i] == '/') last_slash = r + i;
    const char *colon = NULL;
    for (const char *q = last_slash ? last_slash : r; q < r + name_end; q++)
        if (*q == ':') colon = q;
    size_t path_end = name_end;
    if (colon) { /* "host:5000" alone (no '/') is a name and a tag */
        size_t tn = (size_t)(r + name_end - colon - 1);
        const char *t = colon + 1;
        if (tn < 1 || tn > 128) return "a tag is 1 to 128 characters";
        if (!((t[0] >= 'A' && t[0] <= 'Z') || (t[0] >= 'a' && t[0] <= 'z') || (t[0] >= '0' && t[0] <= '9') || t[0] == '_'))
            return "a tag starts with a letter, a digit or '_'";
        for (size_t i = 0; i < tn; i++) {
            char ch = t[i];
            if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                  ch == '.' || ch == '-'))
                return "a tag holds only letters, digits, '_', '.' and '-'";
        }
        path_end = (size_t)(colon - r);
    }
    /* components */
    size_t start = 0;
    int first = 1;
    while (start <= path_end) {
        const char *s = r + start;
        const char *sl = memchr(s, '/', path_end - start);
        size_t len = sl ? (size_t)(sl - s) : path_end - start;
        if (first && sl && image_first_is_host(s, len)) {
            /* host[:port]: letters, digits, '-', '.'; a port of digits */
            const char *pc = memchr(s, ':', len);
            size_t hn = pc ? (size_t)(pc - s) : len;
            if (hn == 0) return "the registry host is empty";
            for (size_t i = 0; i < hn; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                      s[i] == '-' || s[i] == '.'))
                    return "the registry host holds only letters, digits, '-' and '.'";
            if (s[0] == '-' || s[0] == '.') return "the registry host starts with a letter or a digit";
            if (pc) {
                size_t pn = len - hn - 1;
                if (pn < 1 || pn > 5) return "the registry port is 1 to 5 digits";
                for (size_t i = 0; i < pn; i++)
                    if (pc[1 + i] < '0' || pc[1 + i] > '9') return "the registry port is 1 to 5 digits";
            }
        } else if (!image_component_ok(s, len)) {
            return "a name component is lowercase letters and digits, joined by '.', '_', '__' or '-' "
                   "(\"registry.example.com:5000/team/trainer:1.0\")";
        }
        first = 0;
        if (!sl) break;
        start += len + 1;
    }
    return NULL;
}

static int parse_environment(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *env = item(root, "environment");
    char g[64];
    if (!env) return 0;
    if (s->kind == JOB_KIND_TRAIN)
        return fail(e, 422, "invalid_value", "environment",
                    "environment is for command jobs: a training job runs trainyard's own engine");
    if (!cJSON_IsObject(env))
        return fail(e, 422, "invalid_type", "environment", "must be an object, got %s", got(env, g));
    static const char *const KEYS[] = {"image", "pull", NULL};
    if (check_keys(e, env, "environment", KEYS, NULL)) return -1;
    const cJSON *img = item(env, "image");
    if (!img)
        return fail(e, 422, "missing_field", "environment.image",
                    "environment needs image, an OCI image reference (\"docker.io/library/python:3.11\")");
    if (!cJSON_IsString(img))
        return fail(e, 422, "invalid_type", "environment.image", "must be a string, got %s", got(img, g));
    const char *why = image_ref_check(img->valuestring);
    if (why) return fail(e, 422, "invalid_value", "environment.image", "%s", why);
    snprintf(s->environment.image, sizeof s->environment.image, "%s", img->valuestring);
    const cJSON *pull = item(env, "pull");
    if (pull) {
        if (!cJSON_IsString(pull))
            return fail(e, 422, "invalid_type", "environment.pull", "must be a string, got %s", got(pull, g));
        if (strcmp(pull->valuestring, "if_not_present") == 0) s->environment.pull = PULL_IF_NOT_PRESENT;
        else if (strcmp(pull->valuestring, "always") == 0) s->environment.pull = PULL_ALWAYS;
        else
            return fail(e, 422, "invalid_value", "environment.pull",
                        "must be \"if_not_present\" (the default) or \"always\"");
    }
    return 0;
}

static int parse_command(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *c = NULL;
    char g[64];
    if (get_object(e, root, "", "command", &c) < 0) return -1;
    static const char *const FORBIDDEN[] = {"model", "compile", "data", "fit"};
    for (int i = 0; i < 4; i++)
        if (item(root, FORBIDDEN[i]))
            return fail(e, 422, "invalid_value", FORBIDDEN[i],
                        "a command job has no %s: command takes the place of model, compile, "
                        "data and fit", FORBIDDEN[i]);
    static const char *const CMD_KEYS[] = {"argv", "env", "working_dir", "context", NULL};
    if (check_keys(e, c, "command", CMD_KEYS, NULL)) return -1;
    command_spec *cs = &s->command;
    const cJSON *argv = item(c, "argv");
    if (!argv)
        return fail(e, 422, "missing_field", "command.argv",
                    "a command needs argv, e.g. [\"python3\", \"train.py\"]");
    if (!cJSON_IsArray(argv))
        return fail(e, 422, "invalid_type", "command.argv", "must be an array of strings, got %s",
                    got(argv, g));
    int n = cJSON_GetArraySize(argv);
    if (n < 1 || n > JOBSPEC_MAX_ARGS)
        return fail(e, 422, "invalid_value", "command.argv", "must hold 1 to %d strings, got %d",
                    JOBSPEC_MAX_ARGS, n);
    cs->argv = xcalloc((size_t)n + 1, sizeof *cs->argv);
    int i = 0;
    for (const cJSON *a = argv->child; a; a = a->next, i++) {
        fpath f;
        join_index(f, "command.argv", i);
        if (!cJSON_IsString(a))
            return fail(e, 422, "invalid_type", f, "must be a string, got %s", got(a, g));
        if (i == 0 && !a->valuestring[0])
            return fail(e, 422, "invalid_value", f, "the program to run must not be empty");
        cs->argv[i] = xstrdup(a->valuestring);
        cs->argc = i + 1;
    }
    if (parse_working_dir(e, c, cs) < 0) return -1;
    if (parse_context(e, c, cs, "command.context") < 0) return -1;
    const cJSON *env = item(c, "env");
    if (!env) return 0;
    if (!cJSON_IsObject(env))
        return fail(e, 422, "invalid_type", "command.env",
                    "must be an object of NAME: \"value\" strings, got %s", got(env, g));
    n = cJSON_GetArraySize(env);
    if (n > JOBSPEC_MAX_ENV)
        return fail(e, 422, "invalid_value", "command.env", "must hold at most %d variables, got %d",
                    JOBSPEC_MAX_ENV, n);
    cs->env = xcalloc((size_t)n + 1, sizeof *cs->env);
    i = 0;
    for (const cJSON *v = env->child; v; v = v->next, i++) {
        fpath f;
        join(f, "command.env", v->string);
        const char *k = v->string;
        int ok = (k[0] == '_' || (k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z'));
        for (const char *q = k; ok && *q; q++)
            ok = (*q == '_' || (*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') ||
                  (*q >= '0' && *q <= '9'));
        if (!ok || strlen(k) > 128)
            return fail(e, 422, "invalid_value", f,
                        "an environment variable name is a letter or _ then letters, digits "
                        "or _ (at most 128)");
        if (jobspec_env_reserved(k))
            return fail(e, 422, "invalid_value", f,
                        "%s is set by trainyard for every task and cannot be overridden", k);
        if (!cJSON_IsString(v))
            return fail(e, 422, "invalid_type", f, "must be a string, got %s", got(v, g));
        cs->env[i] = env_entry(k, v->valuestring);
        cs->n_env = i + 1;
    }
    return 0;
}

/* ================================================================ interactive, ports */

/* interactive {"type": "notebook" | "shell", "context": "sha256:..."}: a
 * job that opens a notebook or a shell in place of a program, so it has
 * neither command nor model (nor compile, data, fit); its context (the
 * team's folder, as a command job's) goes in command.context, where the
 * server and the agent look for one. */
static int parse_interactive(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *v = NULL;
    if (get_object(e, root, "", "interactive", &v) < 0) return -1;
    static const char *const FORBIDDEN[] = {"command", "model", "compile", "data", "fit", NULL};
    for (int i = 0; FORBIDDEN[i]; i++)
        if (item(root, FORBIDDEN[i]))
            return fail(e, 422, "invalid_value", FORBIDDEN[i],
                        "an interactive job has no %s: the notebook or shell it opens takes the place of "
                        "command (and of model, compile, data and fit); give interactive or %s, not both",
                        FORBIDDEN[i], FORBIDDEN[i]);
    static const char *const KEYS[] = {"type", "context", NULL};
    if (check_keys(e, v, "interactive", KEYS, NULL)) return -1;
    if (parse_context(e, v, &s->command, "interactive.context") < 0) return -1;
    int t = 0;
    int rc = get_enum(e, v, "interactive", "type", INTERACTIVE_NAMES, &t);
    if (rc < 0) return -1;
    if (rc == 0)
        return fail(e, 422, "missing_field", "interactive.type",
                    "an interactive job needs a type: \"notebook\" or \"shell\"");
    s->kind = JOB_KIND_INTERACTIVE;
    s->interactive = (interactive_type)(t + 1);
    s->idle_timeout_s = JOBSPEC_IDLE_DEFAULT_S;
    memset(&s->fit, 0, sizeof s->fit); /* no epochs or batches */
    return 0;
}

/* idle_timeout: seconds (an integer) or a duration ("30m", "15s", "2h";
 * common/util.h), 0 = never; an interactive job's, or any job's with
 * ports (read after them). */
static int parse_idle_timeout(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *v = item(root, "idle_timeout");
    char g[64];
    if (!v) return 0;
    if (s->kind != JOB_KIND_INTERACTIVE && s->n_ports == 0)
        return fail(e, 422, "invalid_value", "idle_timeout",
                    "only an interactive job or a job with ports has an idle timeout (the time without a "
                    "connection after which it is stopped)");
    if (cJSON_IsString(v)) {
        /* digits, a point and digits, one unit: what the parser reads
         * beside (an exponent, hex, a sign, spaces) is refused first */
        const char *t = v->valuestring;
        size_t k = strspn(t, "0123456789");
        int ok = k > 0;
        if (ok && t[k] == '.') {
            size_t fr = strspn(t + k + 1, "0123456789");
            ok = fr > 0;
            k += 1 + fr;
        }
        if (ok && t[k] && strchr("smhd", t[k])) k++;
        ok = ok && t[k] == '\0';
        int64_t ms = 0;
        if (!ok || duration_parse_ms(t, 1e3, (double)JOBSPEC_IDLE_MAX_S * 1e3, &ms) < 0)
            return fail(e, 422, "invalid_value", "idle_timeout",
                        "must be a number of seconds or a duration such as \"30m\", \"15s\" or \"2h\" "
                        "(0 = never, at most 365 days), got %s", got(v, g));
        s->idle_timeout_s = (long)((ms + 999) / 1000);
        return 1;
    }
    if (!cJSON_IsNumber(v))
        return fail(e, 422, "invalid_type", "idle_timeout",
                    "must be a number of seconds or a duration string such as \"30m\", got %s", got(v, g));
    return get_long(e, root, "", "idle_timeout", 0, JOBSPEC_IDLE_MAX_S, 0, &s->idle_timeout_s);
}

void jobspec_notebook_secret(const char *task_token_hash, char out[65]) {
    char in[128];
    int n = snprintf(in, sizeof in, "trainyard-notebook:%s", task_token_hash);
    sha256_hex(in, n < 0 ? 0 : (size_t)n < sizeof in ? (size_t)n : sizeof in - 1, out);
}

void jobspec_idle_text(long seconds, char out[32]) {
    static const struct { long s; char u; } units[] = {{86400, 'd'}, {3600, 'h'}, {60, 'm'}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (seconds > 0 && seconds % units[i].s == 0) {
            snprintf(out, 32, "%ld%c", seconds / units[i].s, units[i].u);
            return;
        }
    snprintf(out, 32, "%lds", seconds);
}

void jobspec_port_env(const char *name, char out[64]) {
    size_t k = (size_t)snprintf(out, 64, "TRAINYARD_PORT_");
    for (const char *p = name; *p && k < 63; p++)
        out[k++] = *p == '-' ? '_' : (*p >= 'a' && *p <= 'z') ? (char)(*p - 'a' + 'A') : *p;
    out[k] = '\0';
}

/* A port's name: a path segment of the proxy and part of an environment
 * variable's name: 1-32 of a-z 0-9 - _, a letter first. */
int jobspec_port_name_ok(const char *n) {
    size_t len = strlen(n);
    if (len < 1 || len >= JOBSPEC_PORT_NAME_MAX || !(n[0] >= 'a' && n[0] <= 'z')) return 0;
    for (size_t i = 0; i < len; i++)
        if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '-' || n[i] == '_'))
            return 0;
    return 1;
}

/* ports: [{"name": "tensorboard", "port": 6006}], at most JOBSPEC_MAX_PORTS,
 * names unique (and so their TRAINYARD_PORT_ variables: "a-b" and "a_b"
 * clash). A notebook job's list gets "notebook" (port 8888) unless it
 * declares it. */
static int parse_ports(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *v = item(root, "ports");
    char g[64];
    int notebook = s->interactive == INTERACTIVE_NOTEBOOK;
    if (v) {
        if (!cJSON_IsArray(v))
            return fail(e, 422, "invalid_type", "ports",
                        "must be an array of {\"name\": \"tensorboard\", \"port\": 6006}, got %s", got(v, g));
        int n = cJSON_GetArraySize(v);
        if (n > JOBSPEC_MAX_PORTS)
            return fail(e, 422, "invalid_value", "ports", "must hold at most %d ports, got %d", JOBSPEC_MAX_PORTS, n);
        static const char *const KEYS[] = {"name", "port", NULL};
        int i = 0;
        for (const cJSON *p = v->child; p; p = p->next, i++) {
            fpath f, fn;
            join_index(f, "ports", i);
            join(fn, f, "name");
            if (!cJSON_IsObject(p))
                return fail(e, 422, "invalid_type", f,
                            "must be an object {\"name\": \"tensorboard\", \"port\": 6006}, got %s", got(p, g));
            if (check_keys(e, p, f, KEYS, NULL)) return -1;
            const cJSON *name = item(p, "name");
            if (!name)
                return fail(e, 422, "missing_field", fn,
                            "a port needs a name: the path segment of its address (/proxy/jobs/ID/NAME/)");
            if (!cJSON_IsString(name))
                return fail(e, 422, "invalid_type", fn, "must be a string, got %s", got(name, g));
            if (!jobspec_port_name_ok(name->valuestring))
                return fail(e, 422, "invalid_value", fn,
                            "must be 1 to 32 of a-z, 0-9, '-' and '_', starting with a letter, got %s", got(name, g));
            port_spec *ps = &s->ports[i];
            memcpy(ps->name, name->valuestring, strlen(name->valuestring) + 1);
            char env_i[64];
            jobspec_port_env(ps->name, env_i);
            for (int j = 0; j < i; j++) {
                char env_j[64];
                jobspec_port_env(s->ports[j].name, env_j);
                if (strcmp(env_i, env_j) != 0) continue;
                if (strcmp(ps->name, s->ports[j].name) == 0)
                    return fail(e, 422, "invalid_value", fn, "ports[%d] is named \"%s\" already", j, ps->name);
                return fail(e, 422, "invalid_value", fn,
                            "\"%s\" and \"%s\" (ports[%d]) would both be %s in the task's environment",
                            ps->name, s->ports[j].name, j, env_i);
            }
            int rc = get_int(e, p, f, "port", 1, 65535, &ps->port);
            if (rc < 0) return -1;
            if (rc == 0)
                return fail(e, 422, "missing_field", join(fn, f, "port"),
                            "a port needs port: the one the program would use by default (1 to 65535; the "
                            "agent gives the task a free one in %s)", env_i);
            s->n_ports = i + 1;
        }
    }
    if (!notebook) return 0;
    for (int i = 0; i < s->n_ports; i++)
        if (strcmp(s->ports[i].name, "notebook") == 0) return 0;
    if (s->n_ports == JOBSPEC_MAX_PORTS)
        return fail(e, 422, "invalid_value", "ports",
                    "a notebook job declares at most %d ports of its own: its port \"notebook\" makes %d",
                    JOBSPEC_MAX_PORTS - 1, JOBSPEC_MAX_PORTS);
    port_spec *nb = &s->ports[s->n_ports++];
    snprintf(nb->name, sizeof nb->name, "notebook");
    nb->port = JOBSPEC_NOTEBOOK_PORT;
    return 0;
}

/* ================================================================ strategy & resources */

static const char *const STRAT_KEYS[] = {"type", "communication", "cross_device_ops",
                                         "scale_learning_rate", NULL};
static const char *const STRAT_PLAIN_KEYS[] = {"type", "scale_learning_rate", NULL};
static const char *const STRAT_MIRRORED_KEYS[] = {"type", "cross_device_ops", "scale_learning_rate",
                                                  NULL};
static const char *const STRAT_MULTI_KEYS[] = {"type", "communication", "scale_learning_rate", NULL};

static int parse_strategy(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *st = NULL;
    int rc = get_object(e, root, "", "strategy", &st);
    if (rc <= 0) return rc;
    if (check_keys(e, st, "strategy", STRAT_KEYS, NULL)) return -1;
    const cJSON *tv = item(st, "type");
    if (tv && cJSON_IsString(tv) && strcmp(tv->valuestring, "tpu") == 0)
        return fail(e, 422, "unsupported", "strategy.type",
                    "TPUStrategy is not available: this cluster has no TPU hardware; use "
                    "mirrored or multi_worker_mirrored on gpu devices");
    int t = 0;
    if ((rc = get_enum(e, st, "strategy", "type", STRAT_NAMES, &t)) < 0) return -1;
    s->strategy.type = (strategy_type)t;
    char owner[64];
    snprintf(owner, sizeof owner, "strategy %s", STRAT_NAMES[t]);
    const char *const *keys = STRAT_PLAIN_KEYS;
    if (t == STRAT_MIRRORED) keys = STRAT_MIRRORED_KEYS;
    if (t == STRAT_MULTI_WORKER_MIRRORED || t == STRAT_PARAMETER_SERVER) keys = STRAT_MULTI_KEYS;
    if (check_keys(e, st, "strategy", keys, owner)) return -1;
    int c = 0;
    if ((rc = get_enum(e, st, "strategy", "communication", COMM_NAMES, &c)) < 0) return -1;
    if (rc) s->strategy.communication = (comm_type)c;
    if ((rc = get_enum(e, st, "strategy", "cross_device_ops", CDO_NAMES, &c)) < 0) return -1;
    if (rc) s->strategy.cross_device_ops = (cdo_type)c;
    if (get_bool(e, st, "strategy", "scale_learning_rate", &s->strategy.scale_learning_rate) < 0) return -1;
    return 0;
}

/* ---------------------------------------------------------------- sizes
 * Every size field reads a JSON integer of bytes and a string (common/size.h)
 * with one rule per kind: the same bounds on the exact value either way, then
 * kept as a whole number of the kind's unit, rounded up. The table of kinds
 * and bounds is docs/jobspec.md's "Sizes". */

const jobspec_size_kind JOBSPEC_SIZE_MEMORY = {"resources.memory", 16LL << 20, 64LL << 40, 1LL << 20};
const jobspec_size_kind JOBSPEC_SIZE_LOG_MAX = {"logs.max_size", 16LL << 20, 64LL << 40, 1LL << 20};
const jobspec_size_kind JOBSPEC_SIZE_STORAGE_QUOTA = {"storage_quota", 0, 64LL << 40, 1};

#define SIZE_FORMS "a size such as \"4GiB\", \"512MiB\", \"1.5GiB\" or \"2G\", or an integer number of bytes"

static int size_range_fail(spec_error *e, const jobspec_size_kind *k, const char *given) {
    char lo[32], hi[32];
    return fail(e, 422, "invalid_value", k->field, "must be between %s and %s, got %s", size_text(k->min, lo, sizeof lo),
                size_text(k->max, hi, sizeof hi), given);
}

static int size_kept(const jobspec_size_kind *k, int64_t bytes, int64_t *out) {
    *out = bytes / k->unit + (bytes % k->unit != 0);
    return 0;
}

int jobspec_size_text(const char *text, const jobspec_size_kind *k, int64_t *out, spec_error *e) {
    char g[64], q[48], us[48];
    snprintf(g, sizeof g, "\"%s\"", safe(text, q));
    const char *unit = NULL;
    int64_t bytes = 0;
    switch (size_parse(text, k->min, k->max, &bytes, &unit)) {
    case SIZE_OK: return size_kept(k, bytes, out);
    case SIZE_BELOW:
    case SIZE_ABOVE: return size_range_fail(e, k, g);
    case SIZE_DECIMALS: return fail(e, 422, "invalid_value", k->field, "at most 9 digits after the point, got %s", g);
    case SIZE_UNIT:
        return fail(e, 422, "invalid_value", k->field,
                    "unknown unit \"%s\" in %s: use B, KiB, MiB, GiB, TiB or PiB (powers of 1024), or K, M, G, T, P "
                    "or KB, MB, GB, TB, PB (powers of 1000)",
                    safe(unit ? unit : "", us), g);
    case SIZE_SYNTAX: break;
    }
    return fail(e, 422, "invalid_value", k->field, "must be %s; got %s", SIZE_FORMS, g);
}

int jobspec_size_value(const cJSON *v, const jobspec_size_kind *k, int64_t *out, spec_error *e) {
    char g[64];
    if (cJSON_IsString(v)) return jobspec_size_text(v->valuestring, k, out, e);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return fail(e, 422, "invalid_type", k->field, "must be %s; got %s", SIZE_FORMS, got(v, g));
    double d = v->valuedouble;
    if (d < (double)k->min || d > (double)k->max) {
        char given[80];
        snprintf(given, sizeof given, "%s bytes", got(v, g));
        return size_range_fail(e, k, given);
    }
    return size_kept(k, (int64_t)d, out);
}

static int parse_memory(spec_error *e, const cJSON *r, jobspec *s) {
    const cJSON *v = item(r, "memory");
    if (!v) return 0;
    return jobspec_size_value(v, &JOBSPEC_SIZE_MEMORY, &s->resources.memory_mb, e) < 0 ? -1 : 1;
}

static int parse_resources(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *r = NULL;
    int rc = get_object(e, root, "", "resources", &r);
    if (rc <= 0) return rc;
    static const char *const RES_KEYS[] = {"workers", "devices_per_worker", "device", "ps", "memory",
                                            "evaluator", NULL};
    if (check_keys(e, r, "resources", RES_KEYS, NULL)) return -1;
    int dev = 0;
    const cJSON *wk = item(r, "workers");
    if (cJSON_IsObject(wk)) {
        /* elastic: {"min": a, "max": b}, 1 <= a <= b <= 1024 */
        static const char *const RANGE_KEYS[] = {"min", "max", NULL};
        if (check_keys(e, wk, "resources.workers", RANGE_KEYS, NULL)) return -1;
        int lo = 0, hi = 0;
        if ((rc = get_int(e, wk, "resources.workers", "min", 1, 1024, &lo)) < 0) return -1;
        if (rc == 0) return fail(e, 422, "missing_field", "resources.workers.min",
                                 "an elastic job needs min: its fewest workers (1 to 1024)");
        if ((rc = get_int(e, wk, "resources.workers", "max", 1, 1024, &hi)) < 0) return -1;
        if (rc == 0) return fail(e, 422, "missing_field", "resources.workers.max",
                                 "an elastic job needs max: its most workers (1 to 1024)");
        if (hi < lo)
            return fail(e, 422, "invalid_value", "resources.workers.max",
                        "must be at least min (%d), got %d", lo, hi);
        s->resources.workers = hi;
        s->resources.workers_min = lo;
    } else {
        if (wk && !cJSON_IsNumber(wk))
            return fail(e, 422, "invalid_type", "resources.workers",
                        "must be an integer 1 to 1024 or a range {\"min\": 1, \"max\": 4}");
        if (get_int(e, r, "resources", "workers", 1, 1024, &s->resources.workers) < 0) return -1;
        s->resources.workers_min = s->resources.workers;
    }
    if (get_int(e, r, "resources", "devices_per_worker", 1, 64,
                &s->resources.devices_per_worker) < 0 ||
        (rc = get_enum(e, r, "resources", "device", DEVICE_NAMES, &dev)) < 0 ||
        get_int(e, r, "resources", "ps", 1, 64, &s->resources.ps) < 0 || parse_memory(e, r, s) < 0 ||
        get_bool(e, r, "resources", "evaluator", &s->resources.evaluator) < 0)
        return -1;
    if (rc) s->resources.device = (device_kind)dev;
    return 0;
}

static int parse_checkpoint(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *c = NULL;
    int rc = get_object(e, root, "", "checkpoint", &c);
    if (rc <= 0) return rc;
    static const char *const CKPT_KEYS[] = {"every_epochs", "keep", "best", NULL};
    if (check_keys(e, c, "checkpoint", CKPT_KEYS, NULL)) return -1;
    if (get_int(e, c, "checkpoint", "every_epochs", 0, 100000, &s->checkpoint.every_epochs) < 0 ||
        get_int(e, c, "checkpoint", "keep", 1, 100, &s->checkpoint.keep) < 0)
        return -1;
    const cJSON *b = item(c, "best");
    if (!b) return 0;
    char g[64];
    if (!cJSON_IsObject(b))
        return fail(e, 422, "invalid_type", "checkpoint.best",
                    "must be an object {\"metric\": \"loss\", \"mode\": \"min\"}, got %s", got(b, g));
    static const char *const BEST_KEYS[] = {"metric", "mode", NULL};
    if (check_keys(e, b, "checkpoint.best", BEST_KEYS, NULL)) return -1;
    const cJSON *m = item(b, "metric");
    if (!m) return fail(e, 422, "missing_field", "checkpoint.best.metric", "the metric to rank checkpoints by, e.g. \"loss\"");
    if (!cJSON_IsString(m)) return fail(e, 422, "invalid_type", "checkpoint.best.metric", "must be a string, got %s", got(m, g));
    size_t n = strlen(m->valuestring);
    int ok = n >= 1 && n < sizeof s->checkpoint.best_metric;
    for (size_t i = 0; ok && i < n; i++) {
        char ch = m->valuestring[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
    }
    if (!ok)
        return fail(e, 422, "invalid_value", "checkpoint.best.metric",
                    "a metric name: 1 to %zu letters, digits, '_', '.' or '-'", sizeof s->checkpoint.best_metric - 1);
    memcpy(s->checkpoint.best_metric, m->valuestring, n + 1);
    const cJSON *mode = item(b, "mode");
    if (mode) {
        if (!cJSON_IsString(mode) || (strcmp(mode->valuestring, "min") != 0 && strcmp(mode->valuestring, "max") != 0))
            return fail(e, 422, "invalid_value", "checkpoint.best.mode", "must be \"min\" (the default) or \"max\"");
        s->checkpoint.best_max = strcmp(mode->valuestring, "max") == 0;
    }
    return 0;
}

static int parse_logs(spec_error *e, const cJSON *root, jobspec *s) {
    const cJSON *l = NULL;
    int rc = get_object(e, root, "", "logs", &l);
    if (rc <= 0) return rc;
    static const char *const LOG_KEYS[] = {"max_size", NULL};
    if (check_keys(e, l, "logs", LOG_KEYS, NULL)) return -1;
    const cJSON *v = item(l, "max_size");
    if (!v) return 0;
    return jobspec_size_value(v, &JOBSPEC_SIZE_LOG_MAX, &s->logs.max_mb, e) < 0 ? -1 : 0;
}

/* ================================================================ cross-field checks */

static void shape_text(const int *shape, int rank, char *out, size_t cap) {
    jobspec_shape_text(shape, rank, out, cap);
}

static int shape_size(const int *shape, int rank) {
    int n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

/* The model's input against the data's features, then the shape through
 * every layer: dense needs a flat input, flatten makes one. */
static int check_shapes(spec_error *e, jobspec *s) {
    layer_spec *first = &s->layers[0];
    const char *src = data_source_name(s->data.source);
    fpath f;
    char have[64];
    join(f, "model.layers[0]", "input_shape");
    int features = 0;
    if (s->data.source == DATA_FASHION_MNIST || s->data.source == DATA_MNIST)
        features = MNIST_FEATURES;
    else if (s->data.source == DATA_SYNTHETIC)
        features = s->data.features;
    if (first->input_rank) {
        shape_text(first->input_shape, first->input_rank, have, sizeof have);
        if (s->data.source == DATA_FASHION_MNIST || s->data.source == DATA_MNIST) {
            int flat = first->input_rank == 1 && first->input_shape[0] == MNIST_FEATURES;
            int image = (first->input_rank == 2 || (first->input_rank == 3 && first->input_shape[2] == 1)) &&
                        first->input_shape[0] == 28 && first->input_shape[1] == 28;
            if (!flat && !image)
                return fail(e, 422, "invalid_value", f,
                            "must match the 784 features of %s: [784], [28, 28] or [28, 28, 1], "
                            "got %s", src, have);
        } else if (features) {
            if (shape_size(first->input_shape, first->input_rank) != features)
                return fail(e, 422, "invalid_value", f,
                            "must hold data.features values: [%d] (or a shape of that size), "
                            "got %s", features, have);
        }
    } else if (s->data.source == DATA_CSV) {
        return fail(e, 422, "missing_field", f,
                    "csv data has no feature count known before it is read: give the first "
                    "layer an input_shape such as [%d]", 8);
    } else {
        first->input_rank = 1;
        first->input_shape[0] = features;
    }
    s->input_rank = first->input_rank;
    memcpy(s->input_shape, first->input_shape, sizeof s->input_shape);
    return jobspec_resolve_shapes(s, e);
}

/* The model must end in dense (or dense + activation) with an output the
 * loss can take: one unit per class, the right activation. */
static int check_output(spec_error *e, const jobspec *s) {
    int last = s->n_layers - 1;
    const layer_spec *ll = &s->layers[last];
    fpath f, lp;
    join_index(lp, "model.layers", last);
    int dense = -1;
    if (ll->type == LAYER_DENSE) dense = last;
    else if (ll->type == LAYER_ACTIVATION && last >= 1 && s->layers[last - 1].type == LAYER_DENSE)
        dense = last - 1;
    if (dense < 0)
        return fail(e, 422, "invalid_value", join(f, lp, "type"),
                    "the model must end in a dense layer (optionally followed by an activation "
                    "layer), got %s", layer_type_name(ll->type));
    for (int i = 0; i < last; i++) {
        const layer_spec *l = &s->layers[i];
        if ((l->type == LAYER_DENSE || l->type == LAYER_ACTIVATION || l->type == LAYER_CONV2D) &&
            l->activation == ACT_SOFTMAX) {
            fpath ip;
            join_index(ip, "model.layers", i);
            return fail(e, 422, "invalid_value", join(f, ip, "activation"),
                        "softmax is only allowed on the output layer (model.layers[%d])", last);
        }
    }
    act_type act = ll->activation;
    int units = s->layers[dense].units;
    fpath up, ap;
    char dp[JOBSPEC_FIELD_MAX];
    join_index(dp, "model.layers", dense);
    join(up, dp, "units");
    join(ap, lp, "activation");
    int classes = 0;
    const char *src = data_source_name(s->data.source);
    if (s->data.source == DATA_FASHION_MNIST || s->data.source == DATA_MNIST) classes = MNIST_CLASSES;
    else if (s->data.source == DATA_SYNTHETIC) classes = 2;
    const char *loss = loss_name(s->loss);
    switch (s->loss) {
    case LOSS_BINARY_CROSSENTROPY:
        if (classes > 2)
            return fail(e, 422, "invalid_value", "compile.loss",
                        "binary_crossentropy needs 0/1 labels but %s has %d classes: use "
                        "sparse_categorical_crossentropy", src, classes);
        if (units != 1)
            return fail(e, 422, "invalid_value", up,
                        "must be 1 for binary_crossentropy (one probability), got %d", units);
        if (act != ACT_SIGMOID)
            return fail(e, 422, "invalid_value", ap,
                        "must be sigmoid for binary_crossentropy, which reads the output as a "
                        "probability (as Keras without from_logits), got %s", act_name(act));
        break;
    case LOSS_CATEGORICAL_CROSSENTROPY:
    case LOSS_SPARSE_CATEGORICAL_CROSSENTROPY:
        if (units < 2)
            return fail(e, 422, "invalid_value", up,
                        "must be at least 2 for %s (one unit per class), got %d", loss, units);
        if (classes && units != classes)
            return fail(e, 422, "invalid_value", up,
                        "must be %d for %s on %s (one unit per class), got %d", classes, loss, src,
                        units);
        if (act != ACT_SOFTMAX)
            return fail(e, 422, "invalid_value", ap,
                        "must be softmax for %s, which reads the outputs as probabilities (as "
                        "Keras without from_logits), got %s", loss, act_name(act));
        break;
    case LOSS_MSE:
        if (classes && units != 1 && units != classes)
            return fail(e, 422, "invalid_value", up,
                        "must be 1 (the label) or %d (one per class) for mse on %s, got %d",
                        classes, src, units);
        break;
    }
    return 0;
}

static int check_resources(spec_error *e, const jobspec *s) {
    const resources_spec *r = &s->resources;
    strategy_type t = s->strategy.type;
    const char *st = strategy_name(t);
    if ((t == STRAT_DEFAULT || t == STRAT_ONE_DEVICE) && r->workers != 1)
        return fail(e, 422, "invalid_value", "resources.workers",
                    "must be 1 for strategy %s (use multi_worker_mirrored or parameter_server for "
                    "several workers), got %d", st, r->workers);
    if ((t == STRAT_DEFAULT || t == STRAT_ONE_DEVICE) && r->devices_per_worker != 1)
        return fail(e, 422, "invalid_value", "resources.devices_per_worker",
                    "must be 1 for strategy %s (use mirrored for several devices), got %d", st,
                    r->devices_per_worker);
    if ((t == STRAT_MIRRORED || t == STRAT_CENTRAL_STORAGE) && r->workers != 1)
        return fail(e, 422, "invalid_value", "resources.workers",
                    "must be 1 for strategy %s, which runs on the devices of one worker (use "
                    "multi_worker_mirrored for several), got %d", st, r->workers);
    if (r->workers_min < r->workers && s->kind == JOB_KIND_TRAIN && t != STRAT_MULTI_WORKER_MIRRORED)
        return fail(e, 422, "invalid_value", "resources.workers",
                    "a range of workers (elastic) needs strategy multi_worker_mirrored or a command "
                    "job, whose workers can be resized at a step boundary (strategy is %s)", st);
    if (t == STRAT_PARAMETER_SERVER && r->ps == 0)
        return fail(e, 422, "missing_field", "resources.ps",
                    "strategy parameter_server needs ps: the number of parameter servers "
                    "(1 to 64 CPU slots)");
    if (t != STRAT_PARAMETER_SERVER && r->ps != 0)
        return fail(e, 422, "invalid_value", "resources.ps",
                    "only strategy parameter_server takes ps (strategy is %s)", st);
    if (s->strategy.communication == COMM_NCCL && r->device != DEVICE_GPU)
        return fail(e, 422, "invalid_value", "strategy.communication",
                    "nccl needs gpu devices but resources.device is cpu: use ring or auto");
    if (s->strategy.cross_device_ops == CDO_NCCL && r->device != DEVICE_GPU)
        return fail(e, 422, "invalid_value", "strategy.cross_device_ops",
                    "nccl needs gpu devices but resources.device is cpu: use "
                    "reduction_to_one_device, hierarchical_copy or auto");
    return 0;
}

/* Batch against replicas; validation split and steps against the number of
 * training examples where it is known before reading (an upper bound for
 * (fashion-)mnist, whose path may hold a smaller set). */
static int check_fit(spec_error *e, const jobspec *s) {
    int replicas = jobspec_replicas(s);
    if (s->fit.batch_size % replicas != 0)
        return fail(e, 422, "invalid_value", "fit.batch_size",
                    "must be divisible by the %d replicas (%d workers x %d devices_per_worker) "
                    "that share each global batch, got %d", replicas, s->resources.workers,
                    s->resources.devices_per_worker, s->fit.batch_size);
    int per_replica = s->fit.batch_size / replicas;
    if (s->fit.gradient_accumulation_steps > per_replica)
        return fail(e, 422, "invalid_value", "fit.gradient_accumulation_steps",
                    "must be at most the %d rows each replica gets of a global batch "
                    "(batch_size %d over %d replicas): %d micro-batches would leave some empty",
                    per_replica, s->fit.batch_size, replicas, s->fit.gradient_accumulation_steps);
    long n = 0;
    if (s->data.source == DATA_FASHION_MNIST || s->data.source == DATA_MNIST) n = MNIST_TRAIN;
    else if (s->data.source == DATA_SYNTHETIC) n = s->data.examples;
    if (n == 0) return 0;
    if (s->data.limit > 0 && s->data.limit < n) n = s->data.limit;
    /* As the loader (docs/data.md): split rounded to 7 digits, Keras' floor. */
    double v = round((double)s->data.validation_split * 1e7) / 1e7;
    long train = (long)floor((double)n * (1.0 - v));
    if (train < 1)
        return fail(e, 422, "invalid_value", "data.validation_split",
                    "leaves no training examples out of %ld, got %g", n,
                    (double)s->data.validation_split);
    if (train < s->resources.workers)
        return fail(e, 422, "invalid_value", "resources.workers",
                    "each worker reads its own shard: %d workers need at least %d training "
                    "examples, the data gives %ld", s->resources.workers, s->resources.workers,
                    train);
    long batches = (train + s->fit.batch_size - 1) / s->fit.batch_size;
    if (s->fit.steps_per_epoch > batches)
        return fail(e, 422, "invalid_value", "fit.steps_per_epoch",
                    "must be at most %ld (%ld training examples in batches of %d), got %ld",
                    batches, train, s->fit.batch_size, s->fit.steps_per_epoch);
    return 0;
}

/* ================================================================ parse */

static void set_defaults(jobspec *s) {
    memset(s, 0, sizeof *s);
    s->kind = JOB_KIND_TRAIN;
    snprintf(s->name, sizeof s->name, "job");
    s->priority = 50;
    s->max_runtime_s = 86400;
    s->max_restarts = 3;
    s->data.label_column = -1;
    s->data.header = 1;
    s->data.shuffle_buffer = -1;
    s->data.examples = 1000;
    s->data.features = 10;
    s->fit.epochs = 1;
    s->fit.batch_size = 32;
    s->fit.gradient_accumulation_steps = 1;
    s->strategy.type = STRAT_DEFAULT;
    s->resources.workers = 1;
    s->resources.workers_min = 1;
    s->resources.devices_per_worker = 1;
    s->resources.device = DEVICE_CPU;
    s->checkpoint.every_epochs = 1;
    s->checkpoint.keep = 3;
}

static int parse_root(spec_error *e, const cJSON *root, jobspec *s) {
    if (check_keys(e, root, "", TOP_KEYS, NULL)) return -1;
    if (parse_name(e, root, s) < 0 ||
        get_int(e, root, "", "priority", 0, 1000, &s->priority) < 0 ||
        get_long(e, root, "", "max_runtime_s", 1, 31536000L, 0, &s->max_runtime_s) < 0 ||
        get_bool(e, root, "", "preemptible", &s->preemptible) < 0 ||
        get_bool(e, root, "", "queue_if_infeasible", &s->queue_if_infeasible) < 0 ||
        get_int(e, root, "", "max_restarts", 0, 100, &s->max_restarts) < 0)
        return -1;
    if (!item(root, "command") && !item(root, "interactive") && item(root, "environment"))
        return fail(e, 422, "invalid_value", "environment",
                    "environment is for command jobs: a training job runs trainyard's own engine");
    if (item(root, "interactive")) {
        if (parse_interactive(e, root, s) < 0) return -1;
    } else if (item(root, "command")) {
        s->kind = JOB_KIND_COMMAND;
        memset(&s->fit, 0, sizeof s->fit); /* no epochs or batches: the program decides */
        if (parse_command(e, root, s) < 0) return -1;
    } else {
        if (parse_model(e, root, s) < 0 || parse_compile(e, root, s) < 0 ||
            parse_data(e, root, s) < 0 || parse_fit(e, root, s) < 0)
            return -1;
    }
    if (parse_environment(e, root, s) < 0) return -1;
    if (parse_strategy(e, root, s) < 0 || parse_resources(e, root, s) < 0 ||
        parse_checkpoint(e, root, s) < 0 || parse_logs(e, root, s) < 0 ||
        parse_ports(e, root, s) < 0 || parse_idle_timeout(e, root, s) < 0)
        return -1;
    if (s->kind == JOB_KIND_INTERACTIVE && s->resources.workers != 1)
        return fail(e, 422, "invalid_value", "resources.workers",
                    "an interactive job runs one task: workers must be 1, got %d", s->resources.workers);
    if (s->kind == JOB_KIND_INTERACTIVE && s->resources.evaluator)
        return fail(e, 422, "invalid_value", "resources.evaluator",
                    "an interactive job has no evaluator: it trains no model of trainyard's engine");
    if (s->kind == JOB_KIND_TRAIN &&
        (check_shapes(e, s) < 0 || check_output(e, s) < 0))
        return -1;
    if (check_resources(e, s) < 0) return -1;
    if (s->kind == JOB_KIND_TRAIN && check_fit(e, s) < 0) return -1;
    if (s->kind == JOB_KIND_COMMAND && !JOBSPEC_COMMAND_JOBS)
        return fail(e, 422, "unsupported", "command",
                    "command jobs are not available yet: submit a training job (model, compile, "
                    "data, fit)");
    return 0;
}

/* Length of a valid UTF-8 sequence starting at p (at most n bytes), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n) {
    unsigned char c = p[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (len > n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

/* What cJSON lets through and we do not: nesting deeper than
 * JOBSPEC_MAX_DEPTH (checked before cJSON recurses), NUL bytes, raw control
 * characters and \u0000 in strings, invalid UTF-8. */
static int prescan(spec_error *e, const char *json, size_t len) {
    const unsigned char *s = (const unsigned char *)json;
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c == 0) return fail(e, 400, "bad_json", "", "invalid JSON: NUL byte at byte %zu", i);
        if (in_str) {
            if (c == '"') {
                in_str = 0;
            } else if (c == '\\') {
                if (i + 5 < len && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                    return fail(e, 400, "bad_json", "",
                                "invalid JSON: \\u0000 in a string at byte %zu", i);
                i++;
            } else if (c < 0x20) {
                return fail(e, 400, "bad_json", "",
                            "invalid JSON: control character 0x%02x in a string at byte %zu", c, i);
            } else if (c >= 0x80) {
                size_t n = utf8_len(s + i, len - i);
                if (n == 0)
                    return fail(e, 400, "bad_json", "", "invalid JSON: bad UTF-8 at byte %zu", i);
                i += n - 1;
            }
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > JOBSPEC_MAX_DEPTH)
                return fail(e, 400, "bad_json", "",
                            "invalid JSON: nested deeper than %d levels at byte %zu",
                            JOBSPEC_MAX_DEPTH, i);
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicate keys anywhere (cJSON keeps both; we refuse): 400 bad_json with
 * the key's path as the field. Sorting keeps a wide object O(n log n). */
static int check_duplicates(spec_error *e, const cJSON *v, const char *p) {
    if (cJSON_IsObject(v)) {
        int n = cJSON_GetArraySize(v);
        if (n > 1) {
            const char **keys = xcalloc((size_t)n, sizeof *keys);
            int i = 0;
            for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c->string;
            qsort(keys, (size_t)n, sizeof *keys, cmp_str);
            for (i = 1; i < n; i++) {
                if (strcmp(keys[i - 1], keys[i]) != 0) continue;
                fpath f;
                char k[48];
                join(f, p, keys[i]);
                safe(keys[i], k);
                free(keys);
                return fail(e, 400, "bad_json", f, "duplicate key \"%s\"", k);
            }
            free(keys);
        }
        for (const cJSON *c = v->child; c; c = c->next) {
            fpath f;
            if (check_duplicates(e, c, join(f, p, c->string)) < 0) return -1;
        }
    } else if (cJSON_IsArray(v)) {
        int i = 0;
        for (const cJSON *c = v->child; c; c = c->next, i++) {
            fpath f;
            if (check_duplicates(e, c, join_index(f, p, i)) < 0) return -1;
        }
    }
    return 0;
}

/* Whether v holds a duplicate key anywhere, building no paths: the common
 * case (none) costs a few comparisons per object; check_duplicates then
 * names the first one. Small objects compare pairwise, wide ones sort. */
static int has_duplicates(const cJSON *v) {
    if (cJSON_IsObject(v)) {
        int n = 0;
        for (const cJSON *c = v->child; c; c = c->next) n++;
        if (n > 1 && n <= 16) {
            for (const cJSON *a = v->child; a; a = a->next)
                for (const cJSON *b = a->next; b; b = b->next)
                    if (strcmp(a->string, b->string) == 0) return 1;
        } else if (n > 16) {
            const char **keys = xcalloc((size_t)n, sizeof *keys);
            int i = 0;
            for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c->string;
            qsort(keys, (size_t)n, sizeof *keys, cmp_str);
            int dup = 0;
            for (i = 1; i < n && !dup; i++) dup = strcmp(keys[i - 1], keys[i]) == 0;
            free(keys);
            if (dup) return 1;
        }
    }
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        for (const cJSON *c = v->child; c; c = c->next)
            if (has_duplicates(c)) return 1;
    return 0;
}

int jobspec_parse(const char *json, size_t len, jobspec *out, spec_error *err) {
    spec_error scratch;
    spec_error *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    set_defaults(out);
    if (!json || len == 0) return fail(e, 400, "bad_json", "", "invalid JSON: the body is empty");
    if (len > JOBSPEC_MAX_BYTES)
        return fail(e, 400, "bad_json", "", "a job spec must be at most %d bytes, got %zu",
                    JOBSPEC_MAX_BYTES, len);
    if (prescan(e, json, len) < 0) return -1;

    /* cJSON reads a NUL-terminated copy: the caller's buffer may not be. */
    char *copy = xmalloc(len + 1);
    memcpy(copy, json, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 0);
    int rc = -1;
    if (!root) {
        size_t at = end && end >= copy ? (size_t)(end - copy) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < at && i < len; i++) {
            if (copy[i] == '\n') { line++; col = 1; }
            else col++;
        }
        fail(e, 400, "bad_json", "", "invalid JSON at byte %zu (line %d, column %d)", at, line, col);
        goto out;
    }
    while (end && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && (size_t)(end - copy) < len) {
        fail(e, 400, "bad_json", "", "invalid JSON: unexpected data after the document at byte %zu",
             (size_t)(end - copy));
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        char g[64];
        fail(e, 400, "bad_json", "", "a job spec must be a JSON object, got %s", got(root, g));
        goto out;
    }
    if (has_duplicates(root) && check_duplicates(e, root, "") < 0) goto out;
    if (parse_root(e, root, out) < 0) goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    free(copy);
    if (rc < 0) jobspec_release(out);
    return rc;
}

/* ================================================================ to JSON */

/* The shortest decimal that reads back as the same float, as a double, so
 * that 0.001f prints "0.001" and not "0.0010000000474974513". */
static double clean(float f) {
    char b[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        if (strtof(b, NULL) == f) return strtod(b, NULL);
    }
    return (double)f;
}

typedef struct out_ctx {
    int ok;
} out_ctx;

static cJSON *chk(out_ctx *o, cJSON *v) {
    if (!v) o->ok = 0;
    return v;
}

static void add_float(out_ctx *o, cJSON *obj, const char *k, float v) {
    chk(o, cJSON_AddNumberToObject(obj, k, clean(v)));
}
/* Integers print exactly (cJSON prints doubles with 15 digits, which
 * would turn a 2^53 - 1 seed into 9.00719925474099e+15). */
static void add_int(out_ctx *o, cJSON *obj, const char *k, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    chk(o, cJSON_AddRawToObject(obj, k, b));
}
static void add_str(out_ctx *o, cJSON *obj, const char *k, const char *v) {
    chk(o, cJSON_AddStringToObject(obj, k, v));
}
static void add_bool(out_ctx *o, cJSON *obj, const char *k, int v) {
    chk(o, cJSON_AddBoolToObject(obj, k, v));
}
static void add_null(out_ctx *o, cJSON *obj, const char *k) {
    chk(o, cJSON_AddNullToObject(obj, k));
}

static void add_shape_named(out_ctx *o, cJSON *obj, const char *key, const int *shape, int rank) {
    cJSON *a = chk(o, cJSON_AddArrayToObject(obj, key));
    for (int i = 0; a && i < rank; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", shape[i]);
        cJSON *n = chk(o, cJSON_CreateRaw(b));
        if (n && !cJSON_AddItemToArray(a, n)) { cJSON_Delete(n); o->ok = 0; }
    }
}

static void add_shape(out_ctx *o, cJSON *obj, const int *shape, int rank) {
    add_shape_named(o, obj, "input_shape", shape, rank);
}

static void add_kernel_fields(out_ctx *o, cJSON *j, const layer_spec *l) {
    add_str(o, j, "activation", act_name(l->activation));
    add_bool(o, j, "use_bias", l->use_bias);
    add_str(o, j, "kernel_initializer", init_name(l->kernel_initializer));
    add_str(o, j, "bias_initializer", init_name(l->bias_initializer));
    if (l->l1 > 0 || l->l2 > 0) {
        cJSON *r = chk(o, cJSON_AddObjectToObject(j, "kernel_regularizer"));
        add_float(o, r, "l1", l->l1);
        add_float(o, r, "l2", l->l2);
    }
}

static void layers_to_json(out_ctx *o, cJSON *model, const jobspec *s) {
    cJSON *layers = chk(o, cJSON_AddArrayToObject(model, "layers"));
    for (int i = 0; layers && i < s->n_layers; i++) {
        const layer_spec *l = &s->layers[i];
        cJSON *j = chk(o, cJSON_CreateObject());
        if (!j) return;
        if (!cJSON_AddItemToArray(layers, j)) { cJSON_Delete(j); o->ok = 0; return; }
        add_str(o, j, "type", layer_type_name(l->type));
        switch (l->type) {
        case LAYER_DENSE:
            add_int(o, j, "units", l->units);
            add_kernel_fields(o, j, l);
            break;
        case LAYER_CONV2D:
            add_int(o, j, "filters", l->filters);
            add_shape_named(o, j, "kernel_size", l->kernel_size, 2);
            add_shape_named(o, j, "strides", l->strides, 2);
            add_str(o, j, "padding", padding_name(l->padding));
            add_kernel_fields(o, j, l);
            break;
        case LAYER_MAX_POOLING2D:
        case LAYER_AVERAGE_POOLING2D:
            add_shape_named(o, j, "pool_size", l->pool_size, 2);
            add_shape_named(o, j, "strides", l->strides, 2);
            add_str(o, j, "padding", padding_name(l->padding));
            break;
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            break;
        case LAYER_BATCH_NORMALIZATION:
            add_float(o, j, "momentum", l->momentum);
            add_float(o, j, "epsilon", l->epsilon);
            add_bool(o, j, "center", l->center);
            add_bool(o, j, "scale", l->scale);
            break;
        case LAYER_RESHAPE:
            add_shape_named(o, j, "target_shape", l->target_shape, l->target_rank);
            break;
        case LAYER_DROPOUT:
            add_float(o, j, "rate", l->rate);
            if (l->has_seed) add_int(o, j, "seed", (long long)l->seed);
            break;
        case LAYER_FLATTEN:
            break;
        case LAYER_ACTIVATION:
            add_str(o, j, "activation", act_name(l->activation));
            break;
        }
        if (l->input_rank) add_shape(o, j, l->input_shape, l->input_rank);
    }
}

static void optimizer_to_json(out_ctx *o, cJSON *compile, const optimizer_spec *op) {
    cJSON *j = chk(o, cJSON_AddObjectToObject(compile, "optimizer"));
    add_str(o, j, "type", opt_name(op->type));
    add_float(o, j, "learning_rate", op->learning_rate);
    switch (op->type) {
    case OPT_SGD:
        add_float(o, j, "momentum", op->momentum);
        add_bool(o, j, "nesterov", op->nesterov);
        break;
    case OPT_RMSPROP:
        add_float(o, j, "rho", op->rho);
        add_float(o, j, "momentum", op->momentum);
        add_float(o, j, "epsilon", op->epsilon);
        add_bool(o, j, "centered", op->centered);
        break;
    case OPT_ADAM:
        add_float(o, j, "beta_1", op->beta_1);
        add_float(o, j, "beta_2", op->beta_2);
        add_float(o, j, "epsilon", op->epsilon);
        add_bool(o, j, "amsgrad", op->amsgrad);
        break;
    case OPT_ADAGRAD:
        add_float(o, j, "initial_accumulator_value", op->initial_accumulator_value);
        add_float(o, j, "epsilon", op->epsilon);
        break;
    }
}

static void data_to_json(out_ctx *o, cJSON *root, const data_spec *d) {
    cJSON *j = chk(o, cJSON_AddObjectToObject(root, "data"));
    add_str(o, j, "source", data_source_name(d->source));
    if (d->path[0]) add_str(o, j, "path", d->path);
    if (d->source == DATA_CSV) {
        if (d->label_column_name[0]) add_str(o, j, "label_column", d->label_column_name);
        else add_int(o, j, "label_column", d->label_column);
        add_bool(o, j, "header", d->header);
    }
    if (d->source == DATA_SYNTHETIC) {
        add_int(o, j, "examples", (long long)d->examples);
        add_int(o, j, "features", d->features);
    }
    add_float(o, j, "validation_split", d->validation_split);
    add_int(o, j, "shuffle_buffer", d->shuffle_buffer);
    add_int(o, j, "seed", (long long)d->seed);
    if (d->limit > 0) add_int(o, j, "limit", (long long)d->limit);
    else add_null(o, j, "limit");
}

static void command_to_json(out_ctx *o, cJSON *root, const command_spec *c) {
    cJSON *j = chk(o, cJSON_AddObjectToObject(root, "command"));
    cJSON *argv = chk(o, cJSON_AddArrayToObject(j, "argv"));
    for (int i = 0; argv && i < c->argc; i++) {
        cJSON *a = chk(o, cJSON_CreateString(c->argv[i]));
        if (a && !cJSON_AddItemToArray(argv, a)) { cJSON_Delete(a); o->ok = 0; }
    }
    cJSON *env = chk(o, cJSON_AddObjectToObject(j, "env"));
    for (int i = 0; env && i < c->n_env; i++) {
        const char *eq = strchr(c->env[i], '=');
        if (!eq) continue;
        char *k = xstrndup(c->env[i], (size_t)(eq - c->env[i]));
        add_str(o, env, k, eq + 1);
        free(k);
    }
    if (c->working_dir[0]) add_str(o, j, "working_dir", c->working_dir);
    if (c->context[0]) add_str(o, j, "context", c->context);
}

cJSON *jobspec_model_summary(const jobspec *s) {
    if (s->kind != JOB_KIND_TRAIN || s->n_layers <= 0) return NULL;
    out_ctx o = {1};
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_shape_named(&o, root, "input_shape", s->input_shape, s->input_rank);
    cJSON *layers = chk(&o, cJSON_AddArrayToObject(root, "layers"));
    long trainable = 0, fixed = 0;
    for (int i = 0; layers && i < s->n_layers; i++) {
        const layer_spec *l = &s->layers[i];
        cJSON *j = chk(&o, cJSON_CreateObject());
        if (!j) break;
        if (!cJSON_AddItemToArray(layers, j)) { cJSON_Delete(j); o.ok = 0; break; }
        char name[64];
        jobspec_layer_name(s, i, name, sizeof name);
        add_str(&o, j, "name", name);
        add_str(&o, j, "type", layer_type_name(l->type));
        add_shape_named(&o, j, "output_shape", l->out_shape, l->out_rank);
        add_int(&o, j, "params", l->params + l->non_trainable);
        add_int(&o, j, "trainable_params", l->params);
        trainable += l->params;
        fixed += l->non_trainable;
    }
    add_int(&o, root, "total_params", trainable + fixed);
    add_int(&o, root, "trainable_params", trainable);
    add_int(&o, root, "non_trainable_params", fixed);
    if (!o.ok) { cJSON_Delete(root); return NULL; }
    return root;
}

cJSON *jobspec_to_cjson(const jobspec *s) {
    out_ctx o = {1};
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_str(&o, root, "name", s->name);
    add_int(&o, root, "priority", s->priority);
    if (s->kind == JOB_KIND_COMMAND || s->kind == JOB_KIND_INTERACTIVE) {
        if (s->kind == JOB_KIND_COMMAND) command_to_json(&o, root, &s->command);
        else {
            cJSON *in = chk(&o, cJSON_AddObjectToObject(root, "interactive"));
            if (in) add_str(&o, in, "type", interactive_name(s->interactive));
            if (in && s->command.context[0]) add_str(&o, in, "context", s->command.context);
            add_int(&o, root, "idle_timeout", (long long)s->idle_timeout_s);
        }
        if (s->environment.image[0]) {
            cJSON *env = chk(&o, cJSON_AddObjectToObject(root, "environment"));
            if (env) {
                add_str(&o, env, "image", s->environment.image);
                add_str(&o, env, "pull", s->environment.pull == PULL_ALWAYS ? "always" : "if_not_present");
            }
        }
    } else {
        cJSON *model = chk(&o, cJSON_AddObjectToObject(root, "model"));
        layers_to_json(&o, model, s);
        cJSON *compile = chk(&o, cJSON_AddObjectToObject(root, "compile"));
        optimizer_to_json(&o, compile, &s->optimizer);
        add_str(&o, compile, "loss", loss_name(s->loss));
        cJSON *metrics = chk(&o, cJSON_AddArrayToObject(compile, "metrics"));
        if (metrics && s->metric_accuracy) {
            cJSON *m = chk(&o, cJSON_CreateString("accuracy"));
            if (m && !cJSON_AddItemToArray(metrics, m)) { cJSON_Delete(m); o.ok = 0; }
        }
        data_to_json(&o, root, &s->data);
        cJSON *fit = chk(&o, cJSON_AddObjectToObject(root, "fit"));
        add_int(&o, fit, "epochs", s->fit.epochs);
        add_int(&o, fit, "batch_size", s->fit.batch_size);
        if (s->fit.steps_per_epoch > 0)
            add_int(&o, fit, "steps_per_epoch", (long long)s->fit.steps_per_epoch);
        else add_null(&o, fit, "steps_per_epoch");
        add_int(&o, fit, "gradient_accumulation_steps", s->fit.gradient_accumulation_steps);
    }
    cJSON *st = chk(&o, cJSON_AddObjectToObject(root, "strategy"));
    add_str(&o, st, "type", strategy_name(s->strategy.type));
    if (s->strategy.type == STRAT_MIRRORED)
        add_str(&o, st, "cross_device_ops", cdo_name(s->strategy.cross_device_ops));
    if (s->strategy.type == STRAT_MULTI_WORKER_MIRRORED || s->strategy.type == STRAT_PARAMETER_SERVER)
        add_str(&o, st, "communication", comm_name(s->strategy.communication));
    if (s->strategy.scale_learning_rate) add_bool(&o, st, "scale_learning_rate", 1);
    cJSON *r = chk(&o, cJSON_AddObjectToObject(root, "resources"));
    if (jobspec_elastic(s)) {
        cJSON *wr = chk(&o, cJSON_AddObjectToObject(r, "workers"));
        add_int(&o, wr, "min", s->resources.workers_min);
        add_int(&o, wr, "max", s->resources.workers);
    } else {
        add_int(&o, r, "workers", s->resources.workers);
    }
    add_int(&o, r, "devices_per_worker", s->resources.devices_per_worker);
    add_str(&o, r, "device", device_kind_name(s->resources.device));
    if (s->strategy.type == STRAT_PARAMETER_SERVER) add_int(&o, r, "ps", s->resources.ps);
    if (s->resources.memory_mb > 0) {
        char mem[32];
        snprintf(mem, sizeof mem, "%lldMiB", (long long)s->resources.memory_mb);
        add_str(&o, r, "memory", mem);
    }
    add_bool(&o, r, "evaluator", s->resources.evaluator);
    cJSON *ck = chk(&o, cJSON_AddObjectToObject(root, "checkpoint"));
    add_int(&o, ck, "every_epochs", s->checkpoint.every_epochs);
    add_int(&o, ck, "keep", s->checkpoint.keep);
    if (s->checkpoint.best_metric[0]) {
        cJSON *best = chk(&o, cJSON_AddObjectToObject(ck, "best"));
        if (best) {
            add_str(&o, best, "metric", s->checkpoint.best_metric);
            add_str(&o, best, "mode", s->checkpoint.best_max ? "max" : "min");
        }
    }
    if (s->logs.max_mb > 0) {
        cJSON *lg = chk(&o, cJSON_AddObjectToObject(root, "logs"));
        char sz[32];
        snprintf(sz, sizeof sz, "%lldMiB", (long long)s->logs.max_mb);
        if (lg) add_str(&o, lg, "max_size", sz);
    }
    add_int(&o, root, "max_runtime_s", (long long)s->max_runtime_s);
    add_bool(&o, root, "preemptible", s->preemptible);
    add_bool(&o, root, "queue_if_infeasible", s->queue_if_infeasible);
    add_int(&o, root, "max_restarts", s->max_restarts);
    if (s->n_ports > 0) {
        cJSON *ports = chk(&o, cJSON_AddArrayToObject(root, "ports"));
        for (int i = 0; ports && i < s->n_ports; i++) {
            cJSON *p = chk(&o, cJSON_CreateObject());
            if (!p) break;
            if (!cJSON_AddItemToArray(ports, p)) { cJSON_Delete(p); o.ok = 0; break; }
            add_str(&o, p, "name", s->ports[i].name);
            add_int(&o, p, "port", s->ports[i].port);
        }
        /* an interactive job's is printed with its type, always */
        if (s->kind != JOB_KIND_INTERACTIVE && s->idle_timeout_s > 0)
            add_int(&o, root, "idle_timeout", (long long)s->idle_timeout_s);
    }
    if (!o.ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

int jobspec_to_json(const jobspec *spec, char **out) {
    *out = NULL;
    cJSON *root = jobspec_to_cjson(spec);
    if (!root) return -1;
    *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return *out ? 0 : -1;
}
