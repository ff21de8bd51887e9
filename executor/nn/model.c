/* model.c - building a sequential model from a spec and running its training
 * step (see model.h). The layer list becomes a list of ops; a relu dense
 * followed by dropout is fused into one pass, and a final softmax/sigmoid is
 * handed to the loss (fused cross-entropy on the logits). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"
#include "../../spec/shapes.h"
#include "conv.h"
#include "layers.h"
#include "loss.h"
#include "nn_rng.h"
#include "optimizer.h"

#define ALIGN_FLOATS 16  /* 64 bytes */
#define SIG_MAX 4096
#define COL_CAP_FLOATS (1L << 23) /* conv im2col scratch: 32 MiB, or one example's */

typedef struct nn_op {
    layer_type type;
    act_type act;            /* activation to run (LINEAR when the loss took it) */
    int in, out;             /* widths */
    int use_bias;
    int own_output;          /* 0: output aliases the input (flatten, fused dropout, eval dropout) */
    int fused_next;          /* dense: the next op (dropout) is fused into this one */
    int fused_into_prev;     /* dropout: done by the previous dense */
    dropout_cfg drop;        /* dropout op's rate; for a dense, its fused dropout */
    dropout_key key;         /* dropout op's mask key (seed, layer); for a fused dense, its dropout's */
    int has_seed;            /* dropout: the spec gave its seed (else the model's dropout seed) */
    float l1, l2;            /* dense, conv2d: kernel regularizer */
    int kernel_tensor;       /* dense, conv2d: tensor index of the kernel (bias = +1) */
    int t0, nt;              /* the op's trainable tensors: [t0, t0 + nt) */
    float *w, *b, *dw, *db;  /* dense: (in, out), (out); conv2d: (kh, kw, c, oc), (oc) */
    float *y;                /* (max_batch, out) own output buffer, or NULL */
    float *mask;             /* dropout: (max_batch, out) */
    conv_geom geom;          /* conv2d, pooling: the window over one example */
    int32_t *argmax;         /* max_pooling2d: (max_batch, out) */
    int hw, ch;              /* global pooling, batch norm: positions and channels per example */
    float bn_eps, bn_momentum;
    int bn_scale, bn_center;  /* batch norm: it has gamma, beta */
    float *gamma, *beta, *dgamma, *dbeta; /* batch norm: (ch) each, NULL when not scale/center */
    float *mmean, *mvar;     /* batch norm: moving statistics, in the state buffer */
    float *bmean, *binvstd;  /* batch norm: the last training batch's statistics (ch) */
    int state_tensor;        /* batch norm: state tensor index of the moving mean (var = +1) */
} nn_op;

struct model {
    int n_ops;
    nn_op ops[JOBSPEC_MAX_LAYERS];
    int first_param_op;      /* backward stops here */
    int in_size, out_size, max_width, max_batch;
    loss_type loss;
    int fused;               /* final activation handed to the loss */
    act_type final_act;      /* the activation the loss took (for predict) */
    optimizer_spec opt;
    int n_slots;
    int n_tensors;
    model_tensor tensors[MODEL_MAX_TENSORS];
    size_t n_params;
    float *params, *grads, *slots;
    int n_state_tensors;
    model_tensor state_tensors[MODEL_MAX_TENSORS];
    size_t n_state;
    float *state;            /* non-trainable: moving statistics (per replica) */
    float *bn_scratch;       /* every batch norm's bmean and binvstd */
    float *col;              /* conv2d im2col scratch (col_floats) */
    int32_t *argmax;         /* every max pooling's argmax, one allocation */
    size_t col_floats;
    int shared_params;       /* params/slots belong to another model (model_share_params) */
    int shared_grads;        /* grads belong to the caller (model_set_grads) */
    long row0;               /* global row of the next batch's first example (dropout keys) */
    float reg_scale;         /* the share of the regularization this replica adds (1 / replicas) */
    size_t act_bytes;        /* activation, mask and backward scratch: scales with max_batch */
    float *acts;             /* every op's own output, one allocation */
    float *masks;
    float *g[2];             /* (max_batch, backward width) ping-pong gradients */
    const float **inputs;    /* (n_ops) input pointer of each op in the last pass */
    const float *output;     /* last forward's output */
    uint32_t *scratch;       /* (max_width) */
    nn_rng rng;              /* kept for the checkpoint format; masks are counter-based */
    long iterations;
    char signature[SIG_MAX];
};

/* Names for signatures and checkpoints (the engine does not need the spec
 * parser's helpers). */
static const char *act_str(act_type a)
{
    static const char *n[] = {"linear", "relu", "sigmoid", "tanh", "softmax"};
    return (unsigned)a < 5 ? n[a] : "?";
}

static const char *loss_str(loss_type l)
{
    static const char *n[] = {"binary_crossentropy", "categorical_crossentropy",
                              "sparse_categorical_crossentropy", "mse"};
    return (unsigned)l < 4 ? n[l] : "?";
}

const char *model_optimizer_name(const model *m)
{
    static const char *n[] = {"sgd", "rmsprop", "adam", "adagrad"};
    return (unsigned)m->opt.type < 4 ? n[m->opt.type] : "?";
}

static size_t align_up(size_t n)
{
    return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
}

static int fail(char err[ERR_MAX], const char *msg, int layer)
{
    if (layer >= 0)
        snprintf(err, ERR_MAX, "model.layers[%d]: %s", layer, msg);
    else
        snprintf(err, ERR_MAX, "%s", msg);
    return -1;
}

static void sig_add(model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sig_add(model *m, const char *fmt, ...)
{
    size_t len = strlen(m->signature);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->signature + len, SIG_MAX - len, fmt, ap);
    va_end(ap);
}

/* Re-points every op's parameter/gradient pointers at the buffers. */
static void bind_tensors(model *m)
{
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->type == LAYER_DENSE || op->type == LAYER_CONV2D) {
            const model_tensor *kt = &m->tensors[op->kernel_tensor];
            op->w = m->params + kt->offset;
            op->dw = m->grads + kt->offset;
            if (op->use_bias) {
                op->b = m->params + kt[1].offset;
                op->db = m->grads + kt[1].offset;
            }
        } else if (op->type == LAYER_BATCH_NORMALIZATION) {
            /* gamma first when scale, then beta when center (model_build) */
            const model_tensor *tt = &m->tensors[op->t0];
            if (op->bn_scale) {
                op->gamma = m->params + tt->offset;
                op->dgamma = m->grads + tt->offset;
                tt++;
            }
            if (op->bn_center) {
                op->beta = m->params + tt->offset;
                op->dbeta = m->grads + tt->offset;
            }
        }
    }
}

/* Appends tensor "layer.what" of the given shape at *off (aligned after). */
static void add_tensor(model_tensor *list, int *n, size_t *off, const char *layer, const char *what,
                       int rank, int d0, int d1, int d2, int d3)
{
    model_tensor *t = &list[(*n)++];
    snprintf(t->name, sizeof t->name, "%s.%s", layer, what);
    t->offset = *off;
    t->rank = rank;
    int d[4] = {d0, d1, d2, d3};
    t->size = 1;
    for (int r = 0; r < 4; r++) {
        t->shape[r] = r < rank ? d[r] : 0;
        if (r < rank)
            t->size *= (size_t)d[r];
    }
    *off = align_up(*off + t->size);
}

/* ---------------------------------------------------------------- model_build, by phase
 *
 * model_build lays the layers out one by one (shapes, parameter and state
 * tensors, each layer's scratch needs and its part of the signature), then
 * plans the fusions, then allocates and points every buffer, then fills the
 * initial values: four phases over the same model, each a function below. */

/* What the layout adds up for the allocation phase. */
typedef struct build_sizes {
    size_t params;   /* floats of the parameter tensors (aligned) */
    size_t state;    /* floats of the state tensors (batch normalization's moving statistics) */
    size_t argmax;   /* max pooling's argmax entries */
    size_t bn;       /* batch normalization's per-batch mean and inverse deviation */
} build_sizes;

/* A layer's shapes, all layout functions take: its spec, its index and
 * name, the width and (for an image) the shape of its input. */
typedef struct layer_in {
    const layer_spec *ls;
    int i;
    const char *name;
    int width;
    int img;          /* the input is an image (height, width, channels) */
    const int *shape; /* the input's shape */
    int rank;         /* the input's rank */
} layer_in;

static void sig_regularizers(model *m, const nn_op *op)
{
    if (op->l1 > 0 || op->l2 > 0)
        sig_add(m, "(l1=%g,l2=%g)", (double)op->l1, (double)op->l2);
}

static int layout_dense(model *m, nn_op *op, const layer_in *in, build_sizes *sz, char err[ERR_MAX])
{
    const layer_spec *ls = in->ls;
    if (ls->units <= 0 || ls->units > JOBSPEC_MAX_UNITS)
        return fail(err, "dense units out of range", in->i);
    op->out = ls->units;
    op->act = ls->activation;
    op->use_bias = ls->use_bias;
    op->l1 = ls->l1;
    op->l2 = ls->l2;
    op->own_output = 1;
    op->kernel_tensor = m->n_tensors;
    add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "kernel", 2, op->in, op->out, 0, 0);
    if (op->use_bias)
        add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "bias", 1, op->out, 0, 0, 0);
    sig_add(m, "|dense(%d,%s,%s)", op->out, act_str(op->act), op->use_bias ? "bias" : "nobias");
    sig_regularizers(m, op);
    return 0;
}

/* conv2d and the two pooling layers: a window slid over an image */
static int layout_window(model *m, nn_op *op, const layer_in *in, int max_batch, build_sizes *sz,
                         char err[ERR_MAX])
{
    const layer_spec *ls = in->ls;
    const int *ish = in->shape;
    if (!in->img || ls->out_rank != 3 || (long)ish[0] * ish[1] * ish[2] != in->width)
        return fail(err, "takes an image (height, width, channels)", in->i);
    int conv = ls->type == LAYER_CONV2D;
    const int *k = conv ? ls->kernel_size : ls->pool_size;
    conv_geom_init(&op->geom, ish[0], ish[1], ish[2], k[0], k[1], ls->strides[0], ls->strides[1], ls->padding,
                   conv ? ls->filters : ish[2]);
    if (op->geom.oh < 1 || op->geom.ow < 1 || op->geom.oh != ls->out_shape[0] || op->geom.ow != ls->out_shape[1])
        return fail(err, "window does not fit its input", in->i);
    op->out = op->geom.oh * op->geom.ow * op->geom.oc;
    op->own_output = 1;
    if (!conv) {
        if (ls->type == LAYER_MAX_POOLING2D)
            sz->argmax += align_up((size_t)max_batch * op->out);
        sig_add(m, "|%s(%dx%d,%dx%d,%s)", ls->type == LAYER_MAX_POOLING2D ? "maxpool" : "avgpool", k[0], k[1],
                ls->strides[0], ls->strides[1], padding_name(ls->padding));
        return 0;
    }
    op->act = ls->activation;
    op->use_bias = ls->use_bias;
    op->l1 = ls->l1;
    op->l2 = ls->l2;
    op->kernel_tensor = m->n_tensors;
    add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "kernel", 4, k[0], k[1], ish[2], ls->filters);
    if (op->use_bias)
        add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "bias", 1, ls->filters, 0, 0, 0);
    /* the im2col scratch: the whole batch, or chunks of COL_CAP_FLOATS (at least one example) */
    size_t need = conv2d_scratch_floats(&op->geom, max_batch);
    size_t one = conv2d_scratch_floats(&op->geom, 1);
    if (need > (size_t)COL_CAP_FLOATS)
        need = one > (size_t)COL_CAP_FLOATS ? one : (size_t)COL_CAP_FLOATS;
    if (need > m->col_floats)
        m->col_floats = need;
    sig_add(m, "|conv2d(%d,%dx%d,%dx%d,%s,%s,%s)", ls->filters, k[0], k[1], ls->strides[0], ls->strides[1],
            padding_name(ls->padding), act_str(op->act), op->use_bias ? "bias" : "nobias");
    sig_regularizers(m, op);
    return 0;
}

static int layout_batch_norm(model *m, nn_op *op, const layer_in *in, build_sizes *sz, char err[ERR_MAX])
{
    const layer_spec *ls = in->ls;
    op->ch = in->rank > 0 ? in->shape[in->rank - 1] : in->width;
    if (op->ch <= 0 || in->width % op->ch != 0)
        return fail(err, "batch normalization: input shape unknown", in->i);
    op->hw = in->width / op->ch;
    op->out = in->width;
    op->own_output = 1;
    op->bn_eps = ls->epsilon;
    op->bn_momentum = ls->momentum;
    op->bn_scale = ls->scale;
    op->bn_center = ls->center;
    /* gamma first when scale, then beta when center (bind_tensors reads them so) */
    if (ls->scale)
        add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "gamma", 1, op->ch, 0, 0, 0);
    if (ls->center)
        add_tensor(m->tensors, &m->n_tensors, &sz->params, in->name, "beta", 1, op->ch, 0, 0, 0);
    op->state_tensor = m->n_state_tensors;
    add_tensor(m->state_tensors, &m->n_state_tensors, &sz->state, in->name, "moving_mean", 1, op->ch, 0, 0, 0);
    add_tensor(m->state_tensors, &m->n_state_tensors, &sz->state, in->name, "moving_variance", 1, op->ch, 0, 0,
               0);
    sz->bn += 2 * align_up((size_t)op->ch);
    sig_add(m, "|bn(%d,%g,%g,%s%s)", op->ch, (double)ls->momentum, (double)ls->epsilon, ls->scale ? "scale" : "",
            ls->center ? "center" : "");
    return 0;
}

/* One layer: its op's shapes, tensors and signature; a layer without
 * parameters of its own is handled inline. */
static int layout_layer(model *m, const jobspec *spec, int i, int width, int max_batch, build_sizes *sz,
                        char err[ERR_MAX])
{
    const layer_spec *ls = &spec->layers[i];
    nn_op *op = &m->ops[i];
    char lname[MODEL_NAME_MAX - 24];
    jobspec_layer_name(spec, i, lname, sizeof lname);
    op->type = ls->type;
    op->in = width;
    op->act = ACT_LINEAR;
    op->t0 = m->n_tensors;
    /* layers past the first get their shapes from the parser */
    layer_in in = {.ls = ls, .i = i, .name = lname, .width = width,
                   .img = ls->in_rank == 3 || (i == 0 && spec->input_rank == 3),
                   .shape = i == 0 ? spec->input_shape : ls->in_shape,
                   .rank = i == 0 ? spec->input_rank : ls->in_rank};
    int rc = 0;
    switch (ls->type) {
    case LAYER_DENSE:
        rc = layout_dense(m, op, &in, sz, err);
        break;
    case LAYER_CONV2D:
    case LAYER_MAX_POOLING2D:
    case LAYER_AVERAGE_POOLING2D:
        rc = layout_window(m, op, &in, max_batch, sz, err);
        break;
    case LAYER_GLOBAL_AVERAGE_POOLING2D:
        if (!in.img || (long)in.shape[0] * in.shape[1] * in.shape[2] != width)
            return fail(err, "takes an image (height, width, channels)", i);
        op->hw = in.shape[0] * in.shape[1];
        op->ch = in.shape[2];
        op->out = op->ch;
        op->own_output = 1;
        sig_add(m, "|gap");
        break;
    case LAYER_BATCH_NORMALIZATION:
        rc = layout_batch_norm(m, op, &in, sz, err);
        break;
    case LAYER_DROPOUT:
        if (!(ls->rate >= 0.0f && ls->rate < 1.0f))
            return fail(err, "dropout rate not in [0, 1)", i);
        op->out = width;
        dropout_cfg_init(&op->drop, ls->rate);
        op->has_seed = ls->has_seed;
        op->key.seed = ls->has_seed ? ls->seed : 0; /* else the model's, at each pass */
        op->key.layer = i;
        op->own_output = 1;
        sig_add(m, "|dropout(%g)", (double)ls->rate);
        break;
    case LAYER_FLATTEN:
        op->out = width;
        sig_add(m, "|flatten");
        break;
    case LAYER_RESHAPE:
        op->out = width;
        sig_add(m, "|reshape(%d,%d,%d,%d)", ls->out_shape[0], ls->out_rank > 1 ? ls->out_shape[1] : 0,
                ls->out_rank > 2 ? ls->out_shape[2] : 0, ls->out_rank > 3 ? ls->out_shape[3] : 0);
        break;
    case LAYER_ACTIVATION:
        op->out = width;
        op->act = ls->activation;
        op->own_output = 1;
        sig_add(m, "|activation(%s)", act_str(op->act));
        break;
    default:
        return fail(err, "unknown layer type", i);
    }
    if (rc)
        return -1;
    long out_size = 1;
    for (int d = 0; d < ls->out_rank; d++)
        out_size *= ls->out_shape[d];
    if (ls->out_rank > 0 && out_size != op->out)
        return fail(err, "output size does not match the spec's shapes", i);
    op->nt = m->n_tensors - op->t0;
    return 0;
}

/* Phase 1: every layer laid out in order; the model's widths, its first
 * trainable op and the whole signature. */
static int layout_layers(model *m, const jobspec *spec, int max_batch, build_sizes *sz, char err[ERR_MAX])
{
    int width = m->in_size;
    m->first_param_op = -1;
    m->max_width = width;
    for (int i = 0; i < m->n_ops; i++) {
        if (layout_layer(m, spec, i, width, max_batch, sz, err))
            return -1;
        if (m->ops[i].nt > 0 && m->first_param_op < 0)
            m->first_param_op = i;
        width = m->ops[i].out;
        if (width > m->max_width)
            m->max_width = width;
    }
    if (m->first_param_op < 0)
        return fail(err, "model has no trainable layer (nothing to train)", -1);
    m->out_size = width;
    if (spec->output_size > 0 && spec->output_size != width)
        return fail(err, "output size does not match the last dense layer", -1);
    sig_add(m, "|loss=%s|opt=%s", loss_str(m->loss), model_optimizer_name(m));
    if (m->opt.type == OPT_RMSPROP || m->opt.type == OPT_SGD)
        sig_add(m, "(momentum=%d,centered=%d)", m->opt.momentum != 0.0f, m->opt.centered);
    if (m->opt.type == OPT_ADAM)
        sig_add(m, "(amsgrad=%d)", m->opt.amsgrad);
    return 0;
}

/* Phase 2: fusions: relu dense + dropout; a final softmax/sigmoid into the loss. */
static void plan_fusions(model *m)
{
    for (int i = 0; i + 1 < m->n_ops; i++) {
        nn_op *op = &m->ops[i], *nx = &m->ops[i + 1];
        if (op->type == LAYER_DENSE && op->act == ACT_RELU && nx->type == LAYER_DROPOUT) {
            op->fused_next = 1;
            op->drop = nx->drop;
            op->key = nx->key;
            op->has_seed = nx->has_seed;
            nx->fused_into_prev = 1;
            nx->own_output = 0;
        }
    }
    nn_op *last = &m->ops[m->n_ops - 1];
    act_type fa = loss_fused_act(m->loss);
    if (fa != ACT_LINEAR && (last->type == LAYER_DENSE || last->type == LAYER_ACTIVATION) && last->act == fa) {
        m->fused = 1;
        m->final_act = fa;
        last->act = ACT_LINEAR;
        if (last->type == LAYER_ACTIVATION)
            last->own_output = 0;
    }
}

/* Phase 3: every buffer allocated, and each op pointed at its part. */
static void alloc_buffers(model *m, int max_batch, const build_sizes *sz)
{
    size_t act_floats = 0, mask_floats = 0;
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->own_output)
            act_floats += align_up((size_t)max_batch * op->out);
        if (op->type == LAYER_DROPOUT && !op->fused_into_prev)
            mask_floats += align_up((size_t)max_batch * op->out);
    }
    size_t off = sz->params;
    m->n_params = off;
    m->params = xcalloc(off ? off : 1, sizeof(float));
    m->grads = xcalloc(off ? off : 1, sizeof(float));
    m->slots = xcalloc(off * (size_t)m->n_slots + 1, sizeof(float));
    m->acts = xcalloc(act_floats + 1, sizeof(float));
    m->masks = xcalloc(mask_floats + 1, sizeof(float));
    /* the backward gradients are as wide as the widest output from the first
     * dense layer on, or input of a layer after it (the first dense layer's
     * input gradient is never computed): not the model's input width */
    int bwd_width = 1;
    for (int i = m->first_param_op; i < m->n_ops; i++) {
        if (m->ops[i].out > bwd_width)
            bwd_width = m->ops[i].out;
        if (i > m->first_param_op && m->ops[i].in > bwd_width)
            bwd_width = m->ops[i].in;
    }
    size_t gsize = align_up((size_t)max_batch * bwd_width);
    m->g[0] = xcalloc(gsize, sizeof(float));
    m->g[1] = xcalloc(gsize, sizeof(float));
    m->inputs = xcalloc((size_t)m->n_ops, sizeof(*m->inputs));
    m->scratch = xcalloc((size_t)m->max_width + 1, sizeof(uint32_t));
    m->n_state = sz->state;
    m->state = xcalloc(sz->state + 1, sizeof(float));
    m->bn_scratch = xcalloc(sz->bn + 1, sizeof(float));
    m->col = xcalloc(m->col_floats + 1, sizeof(float));
    int32_t *argmax_buf = sz->argmax ? xcalloc(sz->argmax, sizeof(int32_t)) : NULL;
    m->argmax = argmax_buf;
    m->act_bytes = sizeof(float) * (act_floats + mask_floats + 2 * gsize + m->col_floats) +
                   sizeof(uint32_t) * (size_t)m->max_width + sizeof(int32_t) * sz->argmax;
    size_t aoff = 0, moff = 0, xoff = 0, boff = 0;
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->own_output) {
            op->y = m->acts + aoff;
            aoff += align_up((size_t)max_batch * op->out);
        }
        if (op->type == LAYER_DROPOUT && !op->fused_into_prev) {
            op->mask = m->masks + moff;
            moff += align_up((size_t)max_batch * op->out);
        }
        if (op->type == LAYER_MAX_POOLING2D) {
            op->argmax = argmax_buf + xoff;
            xoff += align_up((size_t)max_batch * op->out);
        }
        if (op->type == LAYER_BATCH_NORMALIZATION) {
            op->bmean = m->bn_scratch + boff;
            op->binvstd = op->bmean + align_up((size_t)op->ch);
            boff += 2 * align_up((size_t)op->ch);
            op->mmean = m->state + m->state_tensors[op->state_tensor].offset;
            op->mvar = m->state + m->state_tensors[op->state_tensor + 1].offset;
            for (int c = 0; c < op->ch; c++)
                op->mvar[c] = 1.0f; /* Keras: moving_variance_initializer "ones" */
        }
    }
    bind_tensors(m);
}

/* Phase 4: initial values: one init stream per kernel and bias (dense and
 * conv2d layers counted together, in order); gamma 1, beta 0; the
 * optimizer's slots; the model's own stream. */
static void init_params(model *m, const jobspec *spec, uint64_t seed)
{
    int di = 0;
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        const layer_spec *ls = &spec->layers[i];
        if (op->type == LAYER_BATCH_NORMALIZATION && op->gamma) {
            for (int c = 0; c < op->ch; c++)
                op->gamma[c] = 1.0f;
        }
        if (op->type != LAYER_DENSE && op->type != LAYER_CONV2D)
            continue;
        const model_tensor *kt = &m->tensors[op->kernel_tensor];
        int fan_in = op->in, fan_out = op->out, nb = op->out;
        if (op->type == LAYER_CONV2D) {
            int rf = op->geom.kh * op->geom.kw;
            fan_in = rf * op->geom.c;
            fan_out = rf * op->geom.oc;
            nb = op->geom.oc;
        }
        nn_rng r;
        nn_rng_seed(&r, seed, 1000 + 2 * (uint64_t)di);
        init_fill(op->w, (long)kt->size, fan_in, fan_out, ls->kernel_initializer, &r);
        if (op->b) {
            nn_rng_seed(&r, seed, 1001 + 2 * (uint64_t)di);
            init_fill(op->b, nb, nb, nb, ls->bias_initializer, &r);
        }
        di++;
    }
    optimizer_init_slots(&m->opt, m->slots, m->n_params);
    nn_rng_seed(&m->rng, seed, 1);
}

int model_build(model **out, const jobspec *spec, int max_batch, uint64_t seed, char err[ERR_MAX])
{
    *out = NULL;
    err[0] = 0;
    if (max_batch <= 0)
        return fail(err, "max_batch must be positive", -1);
    if (spec->n_layers <= 0 || spec->n_layers > JOBSPEC_MAX_LAYERS)
        return fail(err, "model has no layers", -1);
    if (spec->input_size <= 0)
        return fail(err, "model input size unknown (input_shape)", -1);

    model *m = xcalloc(1, sizeof *m);
    m->max_batch = max_batch;
    m->reg_scale = 1.0f;
    m->in_size = spec->input_size;
    m->loss = spec->loss;
    m->opt = spec->optimizer;
    m->n_slots = optimizer_slot_count(&m->opt);
    m->n_ops = spec->n_layers;
    sig_add(m, "in=%d", m->in_size);
    build_sizes sz = {0, 0, 0, 0};
    if (layout_layers(m, spec, max_batch, &sz, err)) {
        model_free(m);
        return -1;
    }
    plan_fusions(m);
    alloc_buffers(m, max_batch, &sz);
    init_params(m, spec, seed);
    *out = m;
    return 0;
}

void model_free(model *m)
{
    if (!m)
        return;
    if (!m->shared_params) {
        free(m->params);
        free(m->slots);
    }
    if (!m->shared_grads)
        free(m->grads);
    free(m->acts);
    free(m->masks);
    free(m->g[0]);
    free(m->g[1]);
    free(m->inputs);
    free(m->scratch);
    free(m->state);
    free(m->bn_scratch);
    free(m->col);
    free(m->argmax);
    free(m);
}

/* The dropout seed of ops without their own: from the model's RNG state,
 * which is seeded at build and restored from checkpoints (never advanced:
 * masks are counter-based), so a resumed model draws the same masks. */
static uint64_t drop_seed(const model *m)
{
    return nn_mix64(m->rng.s[0] ^ nn_mix64(m->rng.s[2]));
}

static void set_key(const model *m, nn_op *op)
{
    if (!op->has_seed)
        op->key.seed = drop_seed(m);
    op->key.step = m->iterations;
    op->key.row0 = m->row0;
}

/* Forward of n examples; returns the output (n, out_size). */
static const float *forward(model *m, const float *x, int n, int training)
{
    const float *cur = x;
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        m->inputs[i] = cur;
        switch (op->type) {
        case LAYER_DENSE:
            set_key(m, op);
            dense_forward(op->y, cur, op->w, op->b, n, op->in, op->out, op->act,
                          (training && op->fused_next) ? &op->drop : NULL, &op->key, m->scratch);
            cur = op->y;
            break;
        case LAYER_DROPOUT:
            if (op->fused_into_prev || !training || op->drop.rate <= 0.0f)
                break;
            memcpy(op->y, cur, sizeof(float) * (size_t)n * op->out);
            set_key(m, op);
            dropout_forward(op->y, op->mask, n, op->out, &op->drop, &op->key);
            cur = op->y;
            break;
        case LAYER_ACTIVATION:
            if (!op->own_output)
                break;
            memcpy(op->y, cur, sizeof(float) * (size_t)n * op->out);
            act_forward(op->y, n, op->out, op->act);
            cur = op->y;
            break;
        case LAYER_CONV2D:
            conv2d_forward(op->y, cur, op->w, op->b, n, &op->geom, op->act, m->col, m->col_floats);
            cur = op->y;
            break;
        case LAYER_MAX_POOLING2D:
            maxpool_forward(op->y, op->argmax, cur, n, &op->geom);
            cur = op->y;
            break;
        case LAYER_AVERAGE_POOLING2D:
            avgpool_forward(op->y, cur, n, &op->geom);
            cur = op->y;
            break;
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            gap_forward(op->y, cur, n, op->hw, op->ch);
            cur = op->y;
            break;
        case LAYER_BATCH_NORMALIZATION:
            if (training)
                bn_forward_train(op->y, op->bmean, op->binvstd, cur, (long)n * op->hw, op->ch, op->gamma,
                                 op->beta, op->bn_eps, op->bn_momentum, op->mmean, op->mvar);
            else
                bn_forward_eval(op->y, cur, (long)n * op->hw, op->ch, op->gamma, op->beta, op->bn_eps,
                                op->mmean, op->mvar);
            cur = op->y;
            break;
        case LAYER_FLATTEN:
        case LAYER_RESHAPE:
            break;
        }
    }
    m->output = cur;
    return cur;
}

/* A dense op's kernel regularizer: adds reg_scale * d(l1 |w| + l2 w^2)/dw
 * to its kernel gradient when dw is not NULL; returns l1 sum|w| + l2 sum w^2
 * (unscaled). */
static double regularize(const model *m, const nn_op *op, float *dw)
{
    if (!(op->l1 > 0.0f || op->l2 > 0.0f))
        return 0.0;
    const float *restrict w = op->w;
    long count = (long)m->tensors[op->kernel_tensor].size;
    const float l1 = op->l1, l2 = op->l2, sc = m->reg_scale;
    double a1 = 0.0, a2 = 0.0;
    for (long i = 0; i < count; i++) {
        float v = w[i];
        a1 += fabsf(v);
        a2 += v * v;
        if (dw)
            dw[i] += sc * (l1 * (float)((v > 0.0f) - (v < 0.0f)) + 2.0f * l2 * v);
    }
    return l1 * a1 + l2 * a2;
}

/* The model's regularization value (unscaled); adds its gradient when grad. */
static double regularize_all(model *m, int grad)
{
    double r = 0.0;
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i].type == LAYER_DENSE || m->ops[i].type == LAYER_CONV2D)
            r += regularize(m, &m->ops[i], grad ? m->ops[i].dw : NULL);
    return r;
}

/* Forward + backward; with update != 0 each dense layer's parameters are
 * updated right after its gradients (and its input gradient) are computed,
 * while they are still in cache: the same arithmetic as a separate
 * model_apply_gradients, in a different order of layers. accumulate != 0
 * (never with update): the data gradients are ADDED to the buffer and the
 * regularization's gradient is not (its value still counts in st). */
static float step(model *m, const float *x, const float *y, int n, int global_batch,
                  step_stats *st, int update, int accumulate)
{
    if (st)
        memset(st, 0, sizeof *st);
    if (accumulate && (n <= 0 || n > m->max_batch || global_batch <= 0))
        return 0.0f; /* nothing to add */
    if (n <= 0 || n > m->max_batch || global_batch <= 0) {
        memset(m->grads, 0, sizeof(float) * m->n_params);
        return global_batch > 0 ? (float)(regularize_all(m, 1) * m->reg_scale) : 0.0f;
    }
    double reg = 0.0;
    const float *outp = forward(m, x, n, 1);
    float *gcur = m->g[0], *gother = m->g[1];
    long correct = 0;
    double lsum = loss_forward_backward(m->loss, m->fused, outp, y, n, m->out_size,
                                        global_batch, gcur, &correct);
    for (int i = m->n_ops - 1; i >= m->first_param_op; i--) {
        nn_op *op = &m->ops[i];
        float *dx = i > m->first_param_op ? gother : NULL;
        int swap = 1;
        switch (op->type) {
        case LAYER_DENSE:
            dense_backward(dx, op->dw, op->db, gcur, op->y, m->inputs[i], op->w, n, op->in,
                           op->out, op->act, op->fused_next ? &op->drop : NULL, 0, accumulate);
            reg += regularize(m, op, accumulate ? NULL : op->dw);
            break;
        case LAYER_CONV2D:
            conv2d_backward(dx, op->dw, op->db, gcur, op->y, m->inputs[i], op->w, n, &op->geom, op->act,
                            accumulate, m->col, m->col_floats);
            reg += regularize(m, op, accumulate ? NULL : op->dw);
            break;
        case LAYER_BATCH_NORMALIZATION:
            bn_backward(dx, op->dgamma, op->dbeta, gcur, m->inputs[i], op->bmean, op->binvstd, op->gamma,
                        (long)n * op->hw, op->ch, accumulate);
            break;
        case LAYER_MAX_POOLING2D:
            maxpool_backward(gother, gcur, op->argmax, n, &op->geom);
            break;
        case LAYER_AVERAGE_POOLING2D:
            avgpool_backward(gother, gcur, n, &op->geom);
            break;
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            gap_backward(gother, gcur, n, op->hw, op->ch);
            break;
        default:
            swap = 0;
            break;
        }
        if (update && op->nt > 0) {
            const model_tensor *kt = &m->tensors[op->t0], *lt = &m->tensors[op->t0 + op->nt - 1];
            size_t o0 = kt->offset, len = align_up(lt->offset + lt->size) - o0;
            optimizer_step(&m->opt, m->params + o0, m->grads + o0, m->slots + o0, len, m->n_params,
                           m->iterations);
        }
        if (swap) {
            float *t = gcur;
            gcur = gother;
            gother = t;
        }
        switch (op->type) {
        case LAYER_DROPOUT:
            if (!op->fused_into_prev && op->drop.rate > 0.0f)
                dropout_backward(gcur, op->mask, n, op->out);
            break;
        case LAYER_ACTIVATION:
            if (op->own_output)
                act_backward(gcur, op->y, n, op->out, op->act);
            break;
        default:
            break;
        }
    }
    if (st) {
        /* Keras reports the loss with the regularization term in it */
        st->loss_sum = lsum + reg * n;
        st->correct = correct;
        st->n = n;
    }
    if (update)
        m->iterations++;
    return (float)(lsum / global_batch + (accumulate ? 0.0 : reg * m->reg_scale));
}

float model_forward_backward(model *m, const float *x, const float *y, int n,
                             int global_batch, step_stats *st)
{
    return step(m, x, y, n, global_batch, st, 0, 0);
}

float model_forward_backward_add(model *m, const float *x, const float *y, int n,
                                 int global_batch, step_stats *st)
{
    return step(m, x, y, n, global_batch, st, 0, 1);
}

void model_micro_slice(int rows, int micro, int j, int *off, int *len)
{
    if (micro < 1)
        micro = 1;
    int base = rows / micro, rem = rows % micro;
    *off = j * base + (j < rem ? j : rem);
    *len = base + (j < rem ? 1 : 0);
}

float model_forward_backward_micro(model *m, const float *x, const float *y, int n, long row0,
                                   int micro, int global_batch, step_stats *st)
{
    step_stats sum, one;
    memset(&sum, 0, sizeof sum);
    float loss = 0.0f;
    if (micro < 1)
        micro = 1;
    for (int j = 0; j < micro; j++) {
        int off = 0, len = 0;
        model_micro_slice(n, micro, j, &off, &len);
        if (j > 0 && len <= 0)
            continue; /* more micro-batches than rows: nothing to add */
        model_set_row_offset(m, row0 + off);
        /* the first overwrites the buffer and adds the regularization's
         * share, once per step; the others add their data gradients */
        loss += j == 0 ? model_forward_backward(m, x, y, len, global_batch, &one)
                       : model_forward_backward_add(m, x + (size_t)off * (size_t)m->in_size, y + off, len,
                                                    global_batch, &one);
        sum.loss_sum += one.loss_sum;
        sum.correct += one.correct;
        sum.n += one.n;
    }
    model_set_row_offset(m, row0);
    if (st)
        *st = sum;
    return loss;
}

float model_train_step(model *m, const float *x, const float *y, int n, int global_batch,
                       step_stats *st)
{
    if (n <= 0 || n > m->max_batch || global_batch <= 0) {
        float l = step(m, x, y, n, global_batch, st, 0, 0);
        model_apply_gradients(m);
        return l;
    }
    return step(m, x, y, n, global_batch, st, 1, 0);
}

void model_apply_gradients(model *m)
{
    optimizer_step(&m->opt, m->params, m->grads, m->slots, m->n_params, m->n_params,
                   m->iterations);
    m->iterations++;
}

void model_apply_range(model *m, const float *grads, size_t begin, size_t end)
{
    if (end > m->n_params)
        end = m->n_params;
    if (begin >= end)
        return;
    optimizer_step(&m->opt, m->params + begin, grads + begin, m->slots + begin, end - begin,
                   m->n_params, m->iterations);
}

int model_share_params(model *m, model *owner)
{
    if (m == owner || m->n_params != owner->n_params || m->n_slots != owner->n_slots ||
        strcmp(m->signature, owner->signature) != 0)
        return -1;
    if (!m->shared_params) {
        free(m->params);
        free(m->slots);
    }
    m->params = owner->params;
    m->slots = owner->slots;
    m->shared_params = 1;
    bind_tensors(m);
    return 0;
}

void model_set_grads(model *m, float *grads)
{
    if (!m->shared_grads)
        free(m->grads);
    m->grads = grads;
    m->shared_grads = 1;
    bind_tensors(m);
}

void model_set_row_offset(model *m, long row0) { m->row0 = row0 < 0 ? 0 : row0; }

void model_set_replicas(model *m, int replicas) { m->reg_scale = replicas > 1 ? 1.0f / (float)replicas : 1.0f; }

void model_evaluate(model *m, const float *x, const float *y, long n, double *loss, double *acc)
{
    double lsum = 0.0;
    long correct = 0;
    for (long i = 0; i < n; i += m->max_batch) {
        int b = (int)(n - i < m->max_batch ? n - i : m->max_batch);
        const float *o = forward(m, x + i * m->in_size, b, 0);
        lsum += loss_forward_backward(m->loss, m->fused, o, y + i, b, m->out_size, 1, NULL, &correct);
    }
    if (loss)
        *loss = n > 0 ? lsum / (double)n + regularize_all(m, 0) : 0.0;
    if (acc)
        *acc = n > 0 ? (double)correct / (double)n : 0.0;
}

void model_predict(model *m, const float *x, long n, float *out)
{
    for (long i = 0; i < n; i += m->max_batch) {
        int b = (int)(n - i < m->max_batch ? n - i : m->max_batch);
        const float *o = forward(m, x + i * m->in_size, b, 0);
        float *dst = out + i * m->out_size;
        memcpy(dst, o, sizeof(float) * (size_t)b * m->out_size);
        if (m->fused)
            act_forward(dst, b, m->out_size, m->final_act);
    }
}

float *model_params(model *m) { return m->params; }
float *model_grads(model *m) { return m->grads; }
float *model_slots(model *m) { return m->slots; }
float *model_state(model *m) { return m->state; }
size_t model_state_count(const model *m) { return m->n_state; }
int model_state_tensor_count(const model *m) { return m->n_state_tensors; }
const model_tensor *model_state_tensor_at(const model *m, int i)
{
    return (i >= 0 && i < m->n_state_tensors) ? &m->state_tensors[i] : NULL;
}
size_t model_param_count(const model *m) { return m->n_params; }
int model_slot_count(const model *m) { return m->n_slots; }
const char *model_slot_name(const model *m, int s) { return optimizer_slot_name(&m->opt, s); }
int model_tensor_count(const model *m) { return m->n_tensors; }
const model_tensor *model_tensor_at(const model *m, int i)
{
    return (i >= 0 && i < m->n_tensors) ? &m->tensors[i] : NULL;
}
int model_input_size(const model *m) { return m->in_size; }
int model_output_size(const model *m) { return m->out_size; }
int model_max_batch(const model *m) { return m->max_batch; }
size_t model_activation_bytes(const model *m) { return m->act_bytes; }
const optimizer_spec *model_optimizer(const model *m) { return &m->opt; }
const char *model_signature(const model *m) { return m->signature; }
long model_iterations(const model *m) { return m->iterations; }
void model_set_iterations(model *m, long it) { m->iterations = it; }
void model_rng_get(const model *m, uint64_t s[4]) { memcpy(s, m->rng.s, sizeof m->rng.s); }
void model_rng_set(model *m, const uint64_t s[4]) { memcpy(m->rng.s, s, sizeof m->rng.s); }
