/* optimizer.h - Keras' optimizers over the flat parameter buffer: sgd
 * (momentum, nesterov), rmsprop (rho, momentum, centered), adam (amsgrad),
 * adagrad, with the update rules of Keras 3 / tf.keras >= 2.11.
 *
 * The slots are one flat allocation: slot s of parameter i lives at
 * slots[s * n + i], so each slot is a copy of the parameter layout.
 *
 * defines: optimizer_slot_count, optimizer_slot_name, optimizer_init_slots,
 *          optimizer_step */
#ifndef TRAINYARD_NN_OPTIMIZER_H
#define TRAINYARD_NN_OPTIMIZER_H

#include <stddef.h>
#include "../../spec/jobspec.h"

#define OPT_MAX_SLOTS 3

/* Slots per parameter for this configuration (0..3). */
int optimizer_slot_count(const optimizer_spec *o);

/* Keras' name of slot s ("momentum", "velocity", "average_gradient",
 * "velocity_hat", "accumulator"). */
const char *optimizer_slot_name(const optimizer_spec *o, int s);

/* Initial slot values (zeros; adagrad's initial_accumulator_value). */
void optimizer_init_slots(const optimizer_spec *o, float *slots, size_t n);

/* One update of params (n) with grads (n); slot s of params[i] is
 * slots[s * slot_stride + i] (slot_stride = n for a whole buffer; the full
 * buffer's size when updating a sub-range). iteration is the number of
 * updates done before this one (Adam's bias correction uses iteration + 1). */
void optimizer_step(const optimizer_spec *o, float *params, const float *grads,
                    float *slots, size_t n, size_t slot_stride, long iteration);

#endif
