/* jobspec_types.h - the job spec's types: the struct the parser fills in
 * (jobspec.h) and everything downstream reads, its limits and enums, and
 * the error a check of it answers. Below both the parser and the shape
 * resolution (shapes.h) that it calls, which need them alike.
 *
 * defines: jobspec, layer_spec, optimizer_spec, data_spec, fit_spec,
 *          strategy_spec, resources_spec, checkpoint_spec, logs_spec,
 *          command_spec, environment_spec, port_spec, spec_error, their enums
 *          and the JOBSPEC_* limits */
#ifndef TRAINYARD_JOBSPEC_TYPES_H
#define TRAINYARD_JOBSPEC_TYPES_H

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
#define JOBSPEC_MAX_PORTS 8            /* ports entries */
#define JOBSPEC_PORT_NAME_MAX 33       /* a port's name: 1-32 bytes and the NUL */
#define JOBSPEC_IDLE_MAX_S 31536000L   /* idle_timeout: at most a year */
#define JOBSPEC_IDLE_DEFAULT_S 1800L   /* an interactive job's idle_timeout when not given */
#define JOBSPEC_NOTEBOOK_PORT 8888     /* the port a notebook job declares for itself ("notebook") */

/* JOB_KIND_INTERACTIVE: a notebook or a shell (interactive.type), no model
 * and no command; parsed and normalized, not run yet (the API refuses it). */
typedef enum { JOB_KIND_TRAIN = 0, JOB_KIND_COMMAND = 1, JOB_KIND_INTERACTIVE = 2 } job_kind;

typedef enum { INTERACTIVE_NONE = 0, INTERACTIVE_NOTEBOOK, INTERACTIVE_SHELL } interactive_type;

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

/* A web port the job serves (ports[i]): its name, a path segment of the
 * server's proxy (/proxy/jobs/ID/NAME/) and of TRAINYARD_PORT_<NAME> in the
 * task's environment, and the port the program would use by default
 * (informative: the agent gives each task a free port of its node). */
typedef struct port_spec {
    char name[JOBSPEC_PORT_NAME_MAX];  /* 1-32 of a-z 0-9 - _, a letter first */
    int port;                          /* 1-65535 */
} port_spec;

/* The registry host an image reference names ("docker.io" when none does):
 * what registry credentials are looked up by. out holds 256 bytes. */
void jobspec_image_registry(const char *image, char *out, size_t outlen);

typedef struct jobspec {
    job_kind kind;
    command_spec command;              /* JOB_KIND_COMMAND only */
    environment_spec environment;      /* JOB_KIND_COMMAND and JOB_KIND_INTERACTIVE only */
    interactive_type interactive;      /* JOB_KIND_INTERACTIVE only, else INTERACTIVE_NONE */
    long idle_timeout_s;               /* seconds without a connection before the job is
                                        * stopped (0 = never): an interactive job's (default
                                        * 1800), or a job's with ports (default 0) */
    int n_ports;
    port_spec ports[JOBSPEC_MAX_PORTS]; /* unique names (and TRAINYARD_PORT_ names); a
                                        * notebook job's list holds "notebook" */
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

#endif
