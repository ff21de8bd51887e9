/* shapes.c - the shape flow through a model's layers and the layers' names
 * (see shapes.h). */
#include "shapes.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *const jobspec_layer_type_names[] = {"dense",
                                                "dropout",
                                                "flatten",
                                                "activation",
                                                "conv2d",
                                                "max_pooling2d",
                                                "average_pooling2d",
                                                "global_average_pooling2d",
                                                "batch_normalization",
                                                "reshape",
                                                NULL};
const char *const jobspec_padding_names[] = {"valid", "same", NULL};

const char *layer_type_name(layer_type t)
{
    int n = (int)(sizeof jobspec_layer_type_names / sizeof jobspec_layer_type_names[0]) - 1;
    return (int)t >= 0 && (int)t < n ? jobspec_layer_type_names[t] : "?";
}

const char *padding_name(padding_type p)
{
    return p == PAD_SAME ? "same" : p == PAD_VALID ? "valid" : "?";
}

void jobspec_layer_name(const jobspec *s, int i, char *out, size_t cap)
{
    int k = 0;
    for (int j = 0; j < i && j < s->n_layers; j++)
        if (s->layers[j].type == s->layers[i].type)
            k++;
    snprintf(out, cap, "%s_%d", layer_type_name(s->layers[i].type), k);
}

void jobspec_shape_text(const int *shape, int rank, char *out, size_t cap)
{
    size_t used = 0;
    if (cap == 0)
        return;
    out[0] = '\0';
    for (int i = 0; i < rank && used < cap; i++) {
        int w = snprintf(out + used, cap - used, "%s%d", i ? ", " : "[", shape[i]);
        if (w < 0)
            return;
        used += (size_t)w;
    }
    if (used < cap)
        snprintf(out + used, cap - used, "]");
}

static int bad(spec_error *e, const char *fld, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(spec_error *e, const char *fld, const char *fmt, ...)
{
    if (!e)
        return -1;
    e->status = 422;
    snprintf(e->code, sizeof e->code, "invalid_value");
    snprintf(e->field, sizeof e->field, "%s", fld);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* "model.layers[3].kernel_size" (a layer's path is at most 31 bytes). */
static const char *field(char out[JOBSPEC_FIELD_MAX], const char layer[32], const char *key)
{
    if (snprintf(out, JOBSPEC_FIELD_MAX, "%.31s.%.64s", layer, key) < 0)
        out[0] = '\0';
    return out;
}

int jobspec_resolve_shapes(jobspec *s, spec_error *e)
{
    if (s->n_layers < 1 || s->input_rank < 1 || s->input_rank > JOBSPEC_MAX_RANK)
        return bad(e, "model.layers", "the model needs layers and an input of rank 1 to %d",
                   JOBSPEC_MAX_RANK);
    long in_size = 1;
    for (int d = 0; d < s->input_rank; d++) {
        if (s->input_shape[d] < 1)
            return bad(e, "model.layers[0].input_shape", "dimensions must be positive");
        in_size *= s->input_shape[d];
    }
    if (in_size > MAX_LAYER_OUT)
        return bad(e, "model.layers[0].input_shape", "describes more than %ld values", MAX_LAYER_OUT);
    s->input_size = (int)in_size;
    char have[64], f[JOBSPEC_FIELD_MAX];
    /* a [h, w] image whose first layer is convolutional has one channel */
    layer_type t0 = s->layers[0].type;
    if (s->input_rank == 2 && (t0 == LAYER_CONV2D || t0 == LAYER_MAX_POOLING2D ||
                               t0 == LAYER_AVERAGE_POOLING2D || t0 == LAYER_GLOBAL_AVERAGE_POOLING2D)) {
        s->input_rank = 3;
        s->input_shape[2] = 1;
    }

    int rank = s->input_rank, size = s->input_size;
    long params = 0;
    int shape[JOBSPEC_MAX_RANK];
    memcpy(shape, s->input_shape, sizeof shape);
    for (int i = 0; i < s->n_layers; i++) {
        layer_spec *l = &s->layers[i];
        char lp[32];
        snprintf(lp, sizeof lp, "model.layers[%d]", i);
        l->in_rank = rank;
        memcpy(l->in_shape, shape, sizeof shape);
        jobspec_shape_text(shape, rank, have, sizeof have);
        const char *tn = layer_type_name(l->type);
        int image = l->type == LAYER_CONV2D || l->type == LAYER_MAX_POOLING2D ||
                    l->type == LAYER_AVERAGE_POOLING2D || l->type == LAYER_GLOBAL_AVERAGE_POOLING2D;
        if (image && rank != 3)
            return bad(e, lp,
                        "a %s layer takes an image (height, width, channels) but gets %s%s", tn,
                        have, rank == 1 ? ": give the model an input_shape such as [28, 28, 1] "
                                          "or put a reshape layer before it"
                                        : "");
        long lparams = 0;
        switch (l->type) {
        case LAYER_FLATTEN:
            rank = 1;
            shape[0] = size;
            break;
        case LAYER_DENSE:
            if (rank != 1) {
                if (i == 0)
                    return bad(e, "model.layers[0].input_shape",
                                "a dense layer takes a flat input such as [%d]; for %s put a "
                                "flatten layer first", size, have);
                return bad(e, field(f, lp, "type"),
                            "a dense layer takes a flat input but gets %s: put a flatten layer "
                            "before it", have);
            }
            lparams = (long)size * l->units + (l->use_bias ? l->units : 0);
            shape[0] = l->units;
            s->output_size = l->units;
            break;
        case LAYER_CONV2D:
        case LAYER_MAX_POOLING2D:
        case LAYER_AVERAGE_POOLING2D: {
            int conv = l->type == LAYER_CONV2D;
            const int *k = conv ? l->kernel_size : l->pool_size;
            if (k[0] < 1 || k[1] < 1 || l->strides[0] < 1 || l->strides[1] < 1)
                return bad(e, lp, "window and strides must be positive");
            int out[2];
            for (int d = 0; d < 2; d++) {
                if (l->padding == PAD_SAME)
                    out[d] = (shape[d] + l->strides[d] - 1) / l->strides[d];
                else
                    out[d] = shape[d] >= k[d] ? (shape[d] - k[d]) / l->strides[d] + 1 : 0;
            }
            if (out[0] < 1 || out[1] < 1)
                return bad(e, lp,
                            "a %s window of %dx%d with \"valid\" padding does not fit its input "
                            "%s: use a smaller %s or \"padding\": \"same\"",
                            tn, k[0], k[1], have, conv ? "kernel_size" : "pool_size");
            int ch = conv ? l->filters : shape[2];
            /* the engine lowers a conv to a matrix of one row per output
             * position and kh * kw * channels columns, at least one example's */
            long col = (long)out[0] * out[1] * k[0] * k[1] * shape[2];
            if (conv && col > MAX_CONV_COLUMNS)
                return bad(e, lp,
                            "a %dx%d kernel over %s makes %ld values per example to multiply "
                            "(more than %ld): use a smaller kernel_size or larger strides",
                            k[0], k[1], have, col, MAX_CONV_COLUMNS);
            if (conv)
                lparams = (long)k[0] * k[1] * shape[2] * l->filters + (l->use_bias ? l->filters : 0);
            shape[0] = out[0];
            shape[1] = out[1];
            shape[2] = ch;
            break;
        }
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            rank = 1;
            shape[0] = shape[2];
            break;
        case LAYER_BATCH_NORMALIZATION: {
            int c = shape[rank - 1];
            lparams = (long)c * (l->center + l->scale);
            l->non_trainable = 2L * c;
            break;
        }
        case LAYER_RESHAPE: {
            long known = 1;
            int unknown = -1;
            for (int d = 0; d < l->target_rank; d++) {
                if (l->target_shape[d] < 0) unknown = d;
                else known *= l->target_shape[d];
            }
            char want[64];
            jobspec_shape_text(l->target_shape, l->target_rank, want, sizeof want);
            if ((unknown < 0 && known != size) || (unknown >= 0 && size % known != 0))
                return bad(e, field(f, lp, "target_shape"),
                            "%s holds %ld values but the layer's input %s holds %d", want,
                            unknown < 0 ? known : -1L, have, size);
            rank = l->target_rank;
            for (int d = 0; d < rank; d++)
                shape[d] = d == unknown ? (int)(size / known) : l->target_shape[d];
            break;
        }
        case LAYER_DROPOUT:
        case LAYER_ACTIVATION:
            break;
        }
        long out_size = 1;
        for (int d = 0; d < rank; d++) out_size *= shape[d];
        if (out_size > MAX_LAYER_OUT)
            return bad(e, lp,
                        "the layer's output would hold %ld values per example (more than %ld): "
                        "use fewer filters or a larger stride", out_size, MAX_LAYER_OUT);
        size = (int)out_size;
        l->params = lparams;
        params += lparams;
        if (params > JOBSPEC_MAX_PARAMS)
            return bad(e,
                       l->type == LAYER_DENSE    ? field(f, lp, "units")
                       : l->type == LAYER_CONV2D ? field(f, lp, "filters")
                                                 : lp,
                        "the model would have more than %ld parameters (weights and biases)",
                        JOBSPEC_MAX_PARAMS);
        l->out_rank = rank;
        memset(l->out_shape, 0, sizeof l->out_shape);
        memcpy(l->out_shape, shape, sizeof(int) * (size_t)rank);
    }
    return 0;
}

