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
#include "layers.h"
#include "loss.h"
#include "nn_rng.h"
#include "optimizer.h"

#define ALIGN_FLOATS 16  /* 64 bytes */
#define SIG_MAX 4096

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
    float l1, l2;            /* dense: kernel regularizer */
    int kernel_tensor;       /* dense: tensor index of the kernel (bias = +1) */
    float *w, *b, *dw, *db;  /* dense: (in, out), (out) */
    float *y;                /* (max_batch, out) own output buffer, or NULL */
    float *mask;             /* dropout: (max_batch, out) */
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

static int fail(char err[MODEL_ERR_MAX], const char *msg, int layer)
{
    if (layer >= 0)
        snprintf(err, MODEL_ERR_MAX, "model.layers[%d]: %s", layer, msg);
    else
        snprintf(err, MODEL_ERR_MAX, "%s", msg);
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

int model_build(model **out, const jobspec *spec, int max_batch, uint64_t seed,
                char err[MODEL_ERR_MAX])
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

    /* shapes and tensors */
    int width = m->in_size, dense_i = 0;
    size_t off = 0, act_floats = 0, mask_floats = 0;
    m->first_param_op = -1;
    m->max_width = width;
    for (int i = 0; i < m->n_ops; i++) {
        const layer_spec *ls = &spec->layers[i];
        nn_op *op = &m->ops[i];
        op->type = ls->type;
        op->in = width;
        op->act = ACT_LINEAR;
        switch (ls->type) {
        case LAYER_DENSE:
            if (ls->units <= 0 || ls->units > JOBSPEC_MAX_UNITS) {
                model_free(m);
                return fail(err, "dense units out of range", i);
            }
            op->out = ls->units;
            op->act = ls->activation;
            op->use_bias = ls->use_bias;
            op->l1 = ls->l1;
            op->l2 = ls->l2;
            op->own_output = 1;
            if (m->first_param_op < 0)
                m->first_param_op = i;
            op->kernel_tensor = m->n_tensors;
            {
                model_tensor *t = &m->tensors[m->n_tensors++];
                snprintf(t->name, sizeof t->name, "dense_%d.kernel", dense_i);
                t->offset = off;
                t->size = (size_t)op->in * op->out;
                t->rank = 2;
                t->shape[0] = op->in;
                t->shape[1] = op->out;
                off = align_up(off + t->size);
                if (op->use_bias) {
                    t = &m->tensors[m->n_tensors++];
                    snprintf(t->name, sizeof t->name, "dense_%d.bias", dense_i);
                    t->offset = off;
                    t->size = (size_t)op->out;
                    t->rank = 1;
                    t->shape[0] = op->out;
                    off = align_up(off + t->size);
                }
            }
            dense_i++;
            sig_add(m, "|dense(%d,%s,%s)", op->out, act_str(op->act), op->use_bias ? "bias" : "nobias");
            if (op->l1 > 0 || op->l2 > 0)
                sig_add(m, "(l1=%g,l2=%g)", (double)op->l1, (double)op->l2);
            break;
        case LAYER_DROPOUT:
            if (!(ls->rate >= 0.0f && ls->rate < 1.0f)) {
                model_free(m);
                return fail(err, "dropout rate not in [0, 1)", i);
            }
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
        case LAYER_ACTIVATION:
            op->out = width;
            op->act = ls->activation;
            op->own_output = 1;
            sig_add(m, "|activation(%s)", act_str(op->act));
            break;
        default:
            model_free(m);
            return fail(err, "unknown layer type", i);
        }
        width = op->out;
        if (width > m->max_width)
            m->max_width = width;
    }
    if (m->first_param_op < 0) {
        model_free(m);
        return fail(err, "model has no dense layer (nothing to train)", -1);
    }
    m->out_size = width;
    if (spec->output_size > 0 && spec->output_size != width) {
        model_free(m);
        return fail(err, "output size does not match the last dense layer", -1);
    }
    sig_add(m, "|loss=%s|opt=%s", loss_str(m->loss), model_optimizer_name(m));
    if (m->opt.type == OPT_RMSPROP || m->opt.type == OPT_SGD)
        sig_add(m, "(momentum=%d,centered=%d)", m->opt.momentum != 0.0f, m->opt.centered);
    if (m->opt.type == OPT_ADAM)
        sig_add(m, "(amsgrad=%d)", m->opt.amsgrad);

    /* fusions: relu dense + dropout; final softmax/sigmoid into the loss */
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
    if (fa != ACT_LINEAR && (last->type == LAYER_DENSE || last->type == LAYER_ACTIVATION) &&
        last->act == fa) {
        m->fused = 1;
        m->final_act = fa;
        last->act = ACT_LINEAR;
        if (last->type == LAYER_ACTIVATION)
            last->own_output = 0;
    }

    /* buffers */
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->own_output)
            act_floats += align_up((size_t)max_batch * op->out);
        if (op->type == LAYER_DROPOUT && !op->fused_into_prev)
            mask_floats += align_up((size_t)max_batch * op->out);
    }
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
    m->act_bytes = sizeof(float) * (act_floats + mask_floats + 2 * gsize) +
                   sizeof(uint32_t) * (size_t)m->max_width;
    size_t aoff = 0, moff = 0;
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
        if (op->type == LAYER_DENSE) {
            model_tensor *kt = &m->tensors[op->kernel_tensor];
            op->w = m->params + kt->offset;
            op->dw = m->grads + kt->offset;
            if (op->use_bias) {
                model_tensor *bt = &m->tensors[op->kernel_tensor + 1];
                op->b = m->params + bt->offset;
                op->db = m->grads + bt->offset;
            }
        }
    }

    /* initial values: one init stream per tensor, dropout its own stream */
    int di = 0;
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->type != LAYER_DENSE)
            continue;
        const layer_spec *ls = &spec->layers[i];
        nn_rng r;
        nn_rng_seed(&r, seed, 1000 + 2 * (uint64_t)di);
        init_fill(op->w, (long)op->in * op->out, op->in, op->out, ls->kernel_initializer, &r);
        if (op->b) {
            nn_rng_seed(&r, seed, 1001 + 2 * (uint64_t)di);
            init_fill(op->b, op->out, op->out, op->out, ls->bias_initializer, &r);
        }
        di++;
    }
    optimizer_init_slots(&m->opt, m->slots, m->n_params);
    nn_rng_seed(&m->rng, seed, 1);
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
        case LAYER_FLATTEN:
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
    long count = (long)op->in * op->out;
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
        if (m->ops[i].type == LAYER_DENSE)
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
        switch (op->type) {
        case LAYER_DENSE: {
            float *dx = i > m->first_param_op ? gother : NULL;
            dense_backward(dx, op->dw, op->db, gcur, op->y, m->inputs[i], op->w, n, op->in,
                           op->out, op->act, op->fused_next ? &op->drop : NULL, 0, accumulate);
            reg += regularize(m, op, accumulate ? NULL : op->dw);
            if (update) {
                const model_tensor *kt = &m->tensors[op->kernel_tensor];
                const model_tensor *lt = op->use_bias ? kt + 1 : kt;
                size_t o0 = kt->offset, len = align_up(lt->offset + lt->size) - o0;
                optimizer_step(&m->opt, m->params + o0, m->grads + o0, m->slots + o0, len,
                               m->n_params, m->iterations);
            }
            float *t = gcur;
            gcur = gother;
            gother = t;
            break;
        }
        case LAYER_DROPOUT:
            if (!op->fused_into_prev && op->drop.rate > 0.0f)
                dropout_backward(gcur, op->mask, n, op->out);
            break;
        case LAYER_ACTIVATION:
            if (op->own_output)
                act_backward(gcur, op->y, n, op->out, op->act);
            break;
        case LAYER_FLATTEN:
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

/* Re-points every dense op's parameter/gradient pointers at the buffers. */
static void bind_tensors(model *m)
{
    for (int i = 0; i < m->n_ops; i++) {
        nn_op *op = &m->ops[i];
        if (op->type != LAYER_DENSE)
            continue;
        const model_tensor *kt = &m->tensors[op->kernel_tensor];
        op->w = m->params + kt->offset;
        op->dw = m->grads + kt->offset;
        if (op->use_bias) {
            op->b = m->params + kt[1].offset;
            op->db = m->grads + kt[1].offset;
        }
    }
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
