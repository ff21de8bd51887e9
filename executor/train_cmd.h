/* train_cmd.h - `trainyard train SPEC.json [options]`: trains a job spec
 * locally (no server) through train_loop, one progress line per epoch, then
 * one JSON line of final metrics on stdout.
 *
 * defines: cmd_train */
#ifndef TRAINYARD_TRAIN_CMD_H
#define TRAINYARD_TRAIN_CMD_H

/* argv[0] is "train". Returns the exit status: 0 done, 1 failure, 2 usage. */
int cmd_train(int argc, char **argv);

#endif
