/* loss.h - losses and the accuracy metric, with softmax + cross-entropy and
 * sigmoid + binary cross-entropy fused on the logits (numerically stable, as
 * Keras does when the output layer's activation is known).
 *
 * Labels are one float per example: a class index (one-hot is implied where
 * the loss needs it) or, for a single output, the 0/1 or regression target.
 * Gradients are the per-example losses' gradients divided by the GLOBAL batch
 * size, so replicas' gradients sum to the single-device gradient.
 *
 * defines: loss_forward_backward, loss_eval, loss_fused_act */
#ifndef TRAINYARD_NN_LOSS_H
#define TRAINYARD_NN_LOSS_H

#include "../../spec/jobspec.h"

#define NN_EPSILON 1e-7f   /* Keras backend.epsilon() */

/* The activation a loss absorbs when the model's last activation is it:
 * softmax for (sparse_)categorical_crossentropy, sigmoid for
 * binary_crossentropy, ACT_LINEAR (no fusion) otherwise. */
act_type loss_fused_act(loss_type l);

/* out (n, k): the model's output (logits when fused). y (n) labels.
 * Returns the SUM of per-example losses; adds correct predictions to
 * *correct (binary accuracy when k == 1, argmax accuracy otherwise). When
 * dout != NULL writes d(sum loss / global_batch) / d(out) into dout (n, k)
 * (dout must not alias out). */
double loss_forward_backward(loss_type l, int fused, const float *out, const float *y,
                             int n, int k, int global_batch, float *dout, long *correct);

#endif
