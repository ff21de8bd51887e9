/* jobspec.h - the job spec: parsed, validated, with every default filled in.
 *
 * One parser for everyone: the API validates a submitted spec with it before
 * anything is stored, and the worker and `trainyard train` rebuild the same
 * struct from the stored JSON. Field names and defaults follow tf.keras.
 * See docs/jobspec.md.
 *
 * defines: jobspec_parse, jobspec_release, jobspec_to_json, jobspec_to_cjson,
 *          jobspec_replicas, jobspec_devices, jobspec_env_reserved,
 *          jobspec_size_kind, jobspec_size_value, jobspec_size_text, and the
 *          enum -> name helpers. */
#ifndef TRAINYARD_JOBSPEC_H
#define TRAINYARD_JOBSPEC_H

#include <stddef.h>
#include <stdint.h>

#define JOBSPEC_MAX_LAYERS 64
#define JOBSPEC_MAX_RANK 4
#define JOBSPEC_MAX_UNITS 65536
#define JOBSPEC_NAME_MAX 128
#define JOBSPEC_PATH_MAX 1024
#define JOBSPEC_FIELD_MAX 128
#define JOBSPEC_MSG_MAX 256
#define JOBSPEC_MAX_COLUMN 256
#define JOBSPEC_MAX_DEPTH 32           /* JSON nesting deeper than this: 400 bad_json */
#define JOBSPEC_MAX_BYTES (1 << 20)    /* larger documents: 400 bad_json */
#define JOBSPEC_MAX_PARAMS (1L << 28)  /* weights + biases a model may have */
#define JOBSPEC_MAX_ARGS 256           /* command.argv entries */
#define JOBSPEC_MAX_ENV 256            /* command.env entries */

struct cJSON;

typedef enum { JOB_KIND_TRAIN = 0, JOB_KIND_COMMAND = 1 } job_kind;

typedef enum {
    LAYER_DENSE = 0,
    LAYER_DROPOUT,
    LAYER_FLATTEN,
    LAYER_ACTIVATION,
    LAYER_CONV2D,
    LAYER_MAX_POOLING2D,
    LAYER_AVERAGE_POOLING2D,
    LAYER_GLOBAL_AVERAGE_POOLING2D,
    LAYER_BATCH_NORMALIZATION,
    LAYER_RESHAPE
} layer_type;

/* conv2d and pooling padding, as TensorFlow computes it: "valid" (no
 * padding, out = floor((in - k) / s) + 1) or "same" (out = ceil(in / s),
 * the padding split with the extra row/column at the bottom/right). */
typedef enum { PAD_VALID = 0, PAD_SAME } padding_type;

typedef enum { ACT_LINEAR = 0, ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_SOFTMAX } act_type;

typedef enum { INIT_GLOROT_UNIFORM = 0, INIT_HE_NORMAL, INIT_ZEROS } init_type;

typedef struct layer_spec {
    layer_type type;
    int units;                         /* dense: > 0 */
    act_type activation;               /* dense (default linear), activation layer */
    int use_bias;                      /* dense: default 1 */
    init_type kernel_initializer;      /* dense: default glorot_uniform */
    init_type bias_initializer;        /* dense: default zeros */
    float l1, l2;                      /* dense: kernel_regularizer {"l1", "l2"} (Keras L1L2:
                                        * loss += l1 * sum|w| + l2 * sum w^2); 0 = none */
    float rate;                        /* dropout: [0, 1) */
    int has_seed;                      /* dropout: 1 when seed was given */
    uint64_t seed;                     /* dropout: the mask seed when has_seed (else the
                                        * engine derives one, e.g. from data.seed) */
    int input_rank;                    /* 0 when the layer has no input_shape; the parser
                                        * fills layers[0] with the resolved model input */
    int input_shape[JOBSPEC_MAX_RANK];

    /* Convolutional layers (channels last: an example is (h, w, c)). */
    int filters;                       /* conv2d: output channels */
    int kernel_size[2];                /* conv2d: (kh, kw); an integer k means (k, k) */
    int strides[2];                    /* conv2d: default (1, 1); pooling: default pool_size */
    int pool_size[2];                  /* max/average_pooling2d: default (2, 2) */
    padding_type padding;              /* conv2d, pooling: default valid */
    float momentum;                    /* batch_normalization: default 0.99 */
    float epsilon;                     /* batch_normalization: default 1e-3 */
    int center, scale;                 /* batch_normalization: beta, gamma; default 1, 1 */
    int target_rank;                   /* reshape: target_shape as given (one entry may be
                                        * -1: inferred; resolved into out_shape) */
    int target_shape[JOBSPEC_MAX_RANK];

    /* Resolved by the parser (not part of the spec's JSON): the shape of
     * one example at the layer's input and output, and its parameters. */
    int in_rank, in_shape[JOBSPEC_MAX_RANK];
    int out_rank, out_shape[JOBSPEC_MAX_RANK];
    long params;                       /* trainable floats (kernel, bias, gamma, beta) */
    long non_trainable;                /* batch_normalization: moving mean and variance */
} layer_spec;

typedef enum { OPT_SGD = 0, OPT_RMSPROP, OPT_ADAM, OPT_ADAGRAD } opt_type;

/* Keras defaults: sgd lr 0.01 momentum 0 nesterov 0; rmsprop lr 0.001 rho 0.9
 * momentum 0 epsilon 1e-7 centered 0; adam lr 0.001 beta_1 0.9 beta_2 0.999
 * epsilon 1e-7 amsgrad 0; adagrad lr 0.001 initial_accumulator_value 0.1
 * epsilon 1e-7. */
typedef struct optimizer_spec {
    opt_type type;
    float learning_rate;
    float momentum;                    /* sgd, rmsprop */
    int nesterov;                      /* sgd */
    float rho;                         /* rmsprop */
    int centered;                      /* rmsprop */
    float beta_1, beta_2;              /* adam */
    int amsgrad;                       /* adam */
    float initial_accumulator_value;   /* adagrad */
    float epsilon;                     /* rmsprop, adam, adagrad */
} optimizer_spec;

typedef enum {
    LOSS_BINARY_CROSSENTROPY = 0,
    LOSS_CATEGORICAL_CROSSENTROPY,
    LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
    LOSS_MSE
} loss_type;

typedef enum { DATA_FASHION_MNIST = 0, DATA_MNIST, DATA_CSV, DATA_SYNTHETIC } data_source;

typedef struct data_spec {
    data_source source;
    char path[JOBSPEC_PATH_MAX];       /* "" = the source's default
                                        * (/usr/share/datasets/fashion-mnist for fashion-mnist);
                                        * never "" for mnist and csv (required) */
    int label_column;                  /* csv: column index; negative counts from the end
                                        * (-1 = last column, the default) */
    char label_column_name[JOBSPEC_MAX_COLUMN]; /* csv: a header name instead ("" = use index) */
    int header;                        /* csv: first line is a header (default 1) */
    float validation_split;            /* [0, 1), default 0 */
    int shuffle_buffer;                /* 0 = no shuffling; default: whole data set (-1) */
    uint64_t seed;                     /* default 0 */
    long limit;                        /* 0 = no cap */
    long examples;                     /* synthetic: default 1000 */
    int features;                      /* synthetic: default 10 */
} data_spec;

typedef struct fit_spec {
    int epochs;                        /* default 1 */
    int batch_size;                    /* global batch, default 32 */
    long steps_per_epoch;              /* 0 = null (whole epoch) */
    int gradient_accumulation_steps;   /* micro-batches each replica splits its share of a
                                        * global batch into, their gradients summed before
                                        * one update; 1..65536, at most the rows of a
                                        * replica; default 1 (0 for command jobs) */
} fit_spec;

typedef enum {
    STRAT_DEFAULT = 0,
    STRAT_ONE_DEVICE,
    STRAT_MIRRORED,
    STRAT_CENTRAL_STORAGE,
    STRAT_MULTI_WORKER_MIRRORED,
    STRAT_PARAMETER_SERVER
} strategy_type;

typedef enum { COMM_AUTO = 0, COMM_RING, COMM_NCCL } comm_type;

typedef enum { CDO_AUTO = 0, CDO_NCCL, CDO_HIERARCHICAL_COPY, CDO_REDUCTION_TO_ONE_DEVICE } cdo_type;

typedef enum { DEVICE_CPU = 0, DEVICE_GPU } device_kind;

typedef struct strategy_spec {
    strategy_type type;
    comm_type communication;
    cdo_type cross_device_ops;
    int scale_learning_rate;           /* 1: learning rate x replicas in sync (Horovod's rule) */
} strategy_spec;

typedef struct resources_spec {
    int workers;                       /* default 1; an elastic job's most workers (its
                                        * "max"): the size its batches are laid out for */
    int workers_min;                   /* an elastic job's fewest workers ("min"); equal to
                                        * workers for a fixed gang (the integer form) */
    int devices_per_worker;            /* default 1 */
    device_kind device;                /* default cpu */
    int ps;                            /* parameter_server: >= 1; else 0 */
    int64_t memory_mb;                 /* memory per task (each worker and each ps), MiB,
                                        * rounded up from resources.memory; 0 = not given:
                                        * the node's default share */
    int evaluator;                     /* 1: an evaluator side-car task (type "evaluator",
                                        * CPU only) evaluates each new checkpoint; default 0 */
} resources_spec;

typedef struct checkpoint_spec {
    int every_epochs;                  /* default 1; 0 = only on preemption and at the end */
    int keep;                          /* default 3: kept while the job runs */
    /* checkpoint.best {"metric", "mode"}: once the job has ended, its newest
     * checkpoint is kept and, with a metric, the best by it (the value the
     * job reported for the checkpoint's step or epoch); "" = newest only */
    char best_metric[64];
    int best_max;                      /* mode "max" (1) or "min" (0, default) */
} checkpoint_spec;

/* logs {"max_size"}: the most log bytes the job keeps (all its tasks and
 * attempts); past it, output is dropped with a note. 0 = the server's
 * default (--log-max-per-job-default); the server caps it (--log-max-per-job). */
typedef struct logs_spec {
    int64_t max_mb;
} logs_spec;

/* A team's own program (JOB_KIND_COMMAND), in place of model/compile/data/fit:
 * the worker starts it once per task (executor/command.c, docs/command-jobs.md).
 * Both arrays are NULL-terminated and owned (jobspec_release). */
typedef struct command_spec {
    int argc;
    char **argv;                       /* (argc + 1) */
    int n_env;
    char **env;                        /* (n_env + 1) "NAME=value" */
    char working_dir[JOBSPEC_PATH_MAX]; /* "" = none; else relative, no "..", under the
                                        * agent's data root (under the context, with one) */
    char context[72];                  /* "" = none; else "sha256:<64 hex>": the uploaded
                                        * folder each task starts in (POST /contexts) */
} command_spec;

/* Where a command runs: the node's own system (image "") or an OCI image,
 * through the node's container runtime (podman). */
#define JOBSPEC_IMAGE_MAX 256
enum { PULL_IF_NOT_PRESENT = 0, PULL_ALWAYS = 1 };
typedef struct environment_spec {
    char image[JOBSPEC_IMAGE_MAX];     /* "" = the host; else a reference, "registry/name:tag" */
    int pull;                          /* PULL_IF_NOT_PRESENT (default) or PULL_ALWAYS */
} environment_spec;

/* The registry host an image reference names ("docker.io" when none does):
 * what registry credentials are looked up by. out holds 256 bytes. */
void jobspec_image_registry(const char *image, char *out, size_t outlen);

typedef struct jobspec {
    job_kind kind;
    command_spec command;              /* JOB_KIND_COMMAND only */
    environment_spec environment;      /* JOB_KIND_COMMAND only */
    char name[JOBSPEC_NAME_MAX];       /* default "job" */
    int priority;                      /* 0..1000, default 50 */
    long max_runtime_s;                /* default 86400 */
    int preemptible;                   /* default 0 */
    int queue_if_infeasible;           /* default 0 */
    int max_restarts;                  /* default 3 */

    int n_layers;
    layer_spec layers[JOBSPEC_MAX_LAYERS];
    int input_rank;                    /* resolved model input shape: a [h, w] image whose
                                        * first layer is convolutional is [h, w, 1] */
    int input_shape[JOBSPEC_MAX_RANK];
    int input_size;                    /* product of input_shape */
    int output_size;                   /* units of the last dense layer */

    optimizer_spec optimizer;
    loss_type loss;
    int metric_accuracy;               /* "accuracy" in compile.metrics */

    data_spec data;
    fit_spec fit;
    strategy_spec strategy;
    resources_spec resources;
    checkpoint_spec checkpoint;
    logs_spec logs;
} jobspec;

/* A validation error: HTTP status (400 bad JSON, 422 otherwise), a short code
 * ("bad_json", "missing_field", "unknown_field", "invalid_type",
 * "invalid_value", "unsupported"), a message for people and the path of the
 * field at fault, e.g. "model.layers[2].units" ("" for the document). */
typedef struct spec_error {
    int status;
    char code[32];
    char message[JOBSPEC_MSG_MAX];
    char field[JOBSPEC_FIELD_MAX];
} spec_error;

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

/* A layer's name: its type and its index among the layers of that type
 * ("conv2d_0", "dense_1"), as the engine names its tensors. */
void jobspec_layer_name(const jobspec *spec, int i, char *out, size_t cap);

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
const char *layer_type_name(layer_type t);
const char *init_name(init_type i);
const char *padding_name(padding_type p);
const char *comm_name(comm_type c);
const char *cdo_name(cdo_type c);

#endif
