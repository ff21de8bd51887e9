/* ps.h - ParameterServerStrategy: ps tasks own the variables, workers
 * pull, compute and push asynchronously, the chief coordinates.
 *
 * Variables are sharded over the ps tasks by tensor, largest first onto the
 * least loaded (every side computes the same table from the model). A ps
 * applies each pushed gradient to its shard at once, under a lock, with the
 * job's optimizer (async SGD: no worker waits for another). ps 0 also hands
 * out the batches: the global batch is split into `workers` parts, each a
 * unit of work, handed out in the epoch's (seeded) order; a batch whose
 * worker disconnected before pushing is handed out again. The chief
 * (worker 0) trains like the others and, between epochs, pulls the whole
 * state, evaluates, reports the epoch's metrics (summed by ps 0 over every
 * worker's batches), writes the checkpoint and starts the next epoch.
 *
 * A worker that dies stops nothing: its batch goes to another, and when
 * the agent restarts it, it connects again and takes batches. The chief or a
 * ps that dies fails the gang, which resumes from the last checkpoint.
 *
 * Wire: a 32-byte header {magic, op, a, b, len} and len bytes, host byte
 * order (a cluster is one architecture; HELLO checks the magic). With the
 * attempt's secret, a connection starts with a proof both ways before any
 * message: the ps sends a 16-byte challenge, the worker answers
 * HMAC-SHA256(secret, "ps-worker" | challenge | its nonce) and its 16-byte
 * nonce, the ps (which drops a wrong answer unread) answers
 * HMAC-SHA256(secret, "ps-server" | nonce); without a secret (tests), none.
 *
 * defines: ps_addr, ps_serve, ps_train, ps_shard_of */
#ifndef TRAINYARD_STRATEGY_PS_H
#define TRAINYARD_STRATEGY_PS_H

#include <signal.h>

#include "../../spec/jobspec.h"
#include "../nn/model.h"
#include "../../common/errbuf.h"

#define PS_MAX 64

typedef struct ps_addr {
    char host[256];
    int port;
} ps_addr;

/* The ps task that owns tensor t of m, of n_ps (the same on every side). */
int ps_shard_of(const model *m, int t, int n_ps);

/* Serves shard `index` of `n_ps` on listen_fd (taken and closed) until the
 * chief ends the job (returns 0) or *stop is raised (returns 1). Returns -1
 * with a message in err on a failure of its own. */
int ps_serve(const jobspec *spec, int index, int n_ps, int listen_fd, const unsigned char *secret,
             volatile sig_atomic_t *stop, char err[ERR_MAX]);

/* A worker of a parameter_server job (the chief when opt->worker is 0):
 * trains batches handed out by ps 0 against opt->ps (opt->n_ps addresses)
 * until the job ends. The chief resumes from opt->resume_path, writes
 * checkpoints to opt->checkpoint_path and evaluates (unless opt->no_eval).
 * Returns 0 (also when stopped by hooks->stop), or -1 with a message in err. */
struct train_options;
struct train_hooks;
struct train_result;
struct dataset_splits;
int ps_train(const jobspec *spec, const struct dataset_splits *data, const struct train_options *opt,
             const struct train_hooks *hooks, struct train_result *res, char err[ERR_MAX]);

#endif
