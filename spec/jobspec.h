/* jobspec.h - the job spec: parsed, validated, with every default filled in.
 *
 * One parser for everyone: the API validates a submitted spec with it before
 * anything is stored, and the worker and `trainyard train` rebuild the same
 * struct from the stored JSON. Field names and defaults follow tf.keras.
 * See docs/jobspec.md.
 *
 * defines: jobspec_parse, jobspec_release, jobspec_to_json, jobspec_to_cjson,
 *          jobspec_replicas, jobspec_devices, jobspec_env_reserved,
 *          jobspec_size_kind, jobspec_size_value, jobspec_size_text,
 *          jobspec_port_name_ok, jobspec_port_env, jobspec_notebook_secret,
 *          jobspec_idle_text, interactive_name, and the
 *          enum -> name helpers; the spec's types are jobspec_types.h, the
 *          shapes and the layers' names shapes.h (both included here). */
#ifndef TRAINYARD_JOBSPEC_H
#define TRAINYARD_JOBSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "jobspec_types.h"
#include "shapes.h"

struct cJSON;

/* The error helpers of the spec's checks, for checks of documents that
 * hold a spec (a sweep's search): jobspec_fail fills *e and
 * returns -1; jobspec_quote makes a user string safe to quote (printable
 * ASCII, at most 40 characters then "..."); jobspec_got says what a value
 * is for "got ..." ; jobspec_names_text writes "\"a\", \"b\" or \"c\"";
 * jobspec_find_name is a name's index in a NULL-ended list, or -1. */
int jobspec_fail(spec_error *e, int status, const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
const char *jobspec_quote(const char *s, char out[48]);
const char *jobspec_got(const struct cJSON *v, char out[64]);
const char *jobspec_names_text(const char *const *names, char *out, size_t cap);
int jobspec_find_name(const char *const *names, const char *s);

/* Parse and validate a job spec of len bytes (need not be NUL-terminated).
 * On success fills *out (every default resolved) and returns 0. On failure
 * returns -1, fills *err (may be NULL), and *out is unspecified (but needs no
 * release). *out is overwritten: release a spec it held before. Reentrant. */
int jobspec_parse(const char *json, size_t len, jobspec *out, spec_error *err);

/* A kind of size field (docs/jobspec.md, "Sizes"): the field its errors
 * name, its bounds in bytes (inclusive, on the exact value), and the unit it
 * is kept in (rounded up): 1 MiB for memory and log caps, 1 byte for a
 * storage quota. */
typedef struct jobspec_size_kind {
    const char *field;
    int64_t min, max;
    int64_t unit;
} jobspec_size_kind;

extern const jobspec_size_kind JOBSPEC_SIZE_MEMORY;        /* resources.memory, the agent's --memory */
extern const jobspec_size_kind JOBSPEC_SIZE_LOG_MAX;       /* logs.max_size */
extern const jobspec_size_kind JOBSPEC_SIZE_STORAGE_QUOTA; /* a team's storage_quota */

/* A size field's value: a JSON integer of bytes or a string ("4GiB",
 * "512MiB", "1.5G", "800 M", "16777216"; common/size.h), both held to the
 * same bounds. 0 with *out in the kind's unit; -1 with *e (422 naming
 * k->field): invalid_type for another JSON type or a fraction of a byte,
 * invalid_value for a string that is no size, out of bounds either way.
 * jobspec_size_text is the same for a string alone (a flag, a stored spec). */
int jobspec_size_value(const struct cJSON *v, const jobspec_size_kind *k, int64_t *out, spec_error *e);
int jobspec_size_text(const char *text, const jobspec_size_kind *k, int64_t *out, spec_error *e);

/* 1 when NAME (of a command's env) is one trainyard sets for every task
 * (TF_CONFIG, RANK, CUDA_VISIBLE_DEVICES, TRAINYARD_*, ...): refused in specs. */
int jobspec_env_reserved(const char *name);

/* 1 when n is a port's name: 1-32 of a-z 0-9 - _, a letter first. */
int jobspec_port_name_ok(const char *n);

/* The environment variable that gives a task the port named NAME (a valid
 * port name): "TRAINYARD_PORT_" and NAME upper-cased, '-' as '_'
 * ("tensorboard" -> TRAINYARD_PORT_TENSORBOARD, "my-ui" -> TRAINYARD_PORT_MY_UI).
 * out holds 64 bytes. */
void jobspec_port_env(const char *name, char out[64]);

/* A notebook job's Jupyter token, which the worker gives Jupyter and the
 * server's proxy sends it (the user never sees it): the hex SHA-256 of
 * "trainyard-notebook:" and task_token_hash, the hex SHA-256 of the task's
 * token (tasks.token_hash). out: 64 hex digits and a NUL. */
void jobspec_notebook_secret(const char *task_token_hash, char out[65]);

/* An idle timeout in seconds as a duration, in the largest unit that
 * holds it whole: 1800 -> "30m", 3 -> "3s", 7200 -> "2h", 86400 -> "1d",
 * 90 -> "90s". out holds 32 bytes. */
void jobspec_idle_text(long seconds, char out[32]);

/* Frees what a parsed spec holds (a command job's argv/env; nothing for a
 * training job). Safe on a zeroed or already released spec. */
void jobspec_release(jobspec *spec);

/* The normalized spec as JSON, every default filled in: parsing it again
 * gives the same struct (parse(to_json(parse(x))) == parse(x)). On success
 * *out is a NUL-terminated string the caller frees with free(); returns 0,
 * or -1 (out of memory) with *out NULL. */
int jobspec_to_json(const jobspec *spec, char **out);

/* The same document as a cJSON tree (the caller cJSON_Delete()s it), for
 * embedding in a larger answer; NULL when out of memory. */
struct cJSON *jobspec_to_cjson(const jobspec *spec);

/* The model as Keras' model.summary() shows it: {"input_shape", "layers":
 * [{"name", "type", "output_shape" (one example's), "params" (all of the
 * layer's: trainable and, for batch_normalization, its moving statistics),
 * "trainable_params"}], "total_params", "trainable_params",
 * "non_trainable_params"}. NULL for a command job or out of memory. */
struct cJSON *jobspec_model_summary(const jobspec *spec);

/* Number of synchronous replicas: workers * devices_per_worker. */
int jobspec_replicas(const jobspec *spec);

/* Whether resources.workers was given as a range {"min", "max"} with min < max. */
int jobspec_elastic(const jobspec *spec);

/* Devices a job holds in all: workers * devices_per_worker (ps take CPU slots). */
int jobspec_devices(const jobspec *spec);

/* Micro-batches each replica splits its share of a global batch into when the job runs
 * with `workers` workers: fit.gradient_accumulation_steps x ceil(resources.workers /
 * workers), so that a job running on fewer workers than resources.workers keeps the
 * micro-batch size (and the memory) of its full size and the same global batch. */
int jobspec_micro_batches(const jobspec *s, int workers);

const char *act_name(act_type a);
const char *loss_name(loss_type l);
const char *opt_name(opt_type o);
const char *strategy_name(strategy_type s);
const char *device_kind_name(device_kind d);
const char *data_source_name(data_source s);
const char *init_name(init_type i);
const char *comm_name(comm_type c);
const char *cdo_name(cdo_type c);
const char *interactive_name(interactive_type t); /* "notebook", "shell"; "" for none */

#endif
