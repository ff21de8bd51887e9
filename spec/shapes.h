/* shapes.h - the shape of one example through a model's layers, and the
 * layers' names: what the spec parser resolves once it has read a spec,
 * kept apart from the parser (no cJSON) so that code building a jobspec by
 * hand (the GPU test and benchmark binaries) resolves it the same way.
 *
 * defines: jobspec_resolve_shapes, jobspec_shape_text, jobspec_layer_name,
 *          layer_type_name, padding_name, jobspec_layer_type_names,
 *          jobspec_padding_names */
#ifndef TRAINYARD_SPEC_SHAPES_H
#define TRAINYARD_SPEC_SHAPES_H

#include <stddef.h>
#include "jobspec_types.h"

#define MAX_LAYER_OUT (1L << 24)    /* a layer's output values per example */
#define MAX_CONV_COLUMNS (1L << 26) /* a conv2d's im2col values per example (256 MiB) */

/* The names of layer_type and padding_type in enum order, NULL-ended. */
extern const char *const jobspec_layer_type_names[];
extern const char *const jobspec_padding_names[];

/* From s->input_rank / s->input_shape (as the first layer gives it) and the
 * layers (each with its fields set as the parser sets them: strides,
 * pool_size, target_shape ...): s->input_size; the input made [h, w, 1]
 * when it is [h, w] and the first layer is conv2d or pooling; every layer's
 * in_rank/in_shape, out_rank/out_shape, params and non_trainable; and
 * s->output_size (the last dense layer's units). Returns 0, or -1 with *e
 * a 422 whose field names the layer that cannot take its input and whose
 * message gives the shapes. */
int jobspec_resolve_shapes(jobspec *s, spec_error *e);

/* "[28, 28, 1]" into out (cap bytes). */
void jobspec_shape_text(const int *shape, int rank, char *out, size_t cap);

/* A layer's name: its type and its index among the layers of that type
 * ("conv2d_0", "dense_1"), as the engine names its tensors. */
void jobspec_layer_name(const jobspec *spec, int i, char *out, size_t cap);

const char *layer_type_name(layer_type t);
const char *padding_name(padding_type p);

#endif
