/* up.h - `trainyard up`: a server and one local agent as child processes.
 *
 * defines: cmd_up */
#ifndef TRAINYARD_UP_H
#define TRAINYARD_UP_H

/* `trainyard up [--listen ADDR:PORT] [--data DIR] [--cpu-slots N] ...`:
 * runs until SIGINT/SIGTERM; returns the exit status. */
int cmd_up(int argc, char **argv);

#endif
