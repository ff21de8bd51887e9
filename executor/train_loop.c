/* train_loop.c - the epoch loop (see train_loop.h). Steps read as
 * batcher_next -> engine_step (strategy/engine.h: CPU forward_backward ->
 * grad_reduce -> apply, CPU replicas, or the GPU engine); nothing allocates
 * inside the loop. */
#include "train_loop.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "comm/comm.h"
#include "strategy/engine.h"
#include "strategy/ps.h"
#include "strategy/replicas.h"

static int is_stopped(const train_hooks *h)
{
    return h && h->stop && *h->stop;
}

static int write_ckpt(const train_options *opt, const train_hooks *h, engine *e,
                      const ckpt_meta *meta, char err[ERR_MAX])
{
    if (!opt->checkpoint_path)
        return 0;
    char cerr[ERR_MAX];
    if (engine_pull(e, cerr)) { /* the GPU engine's state into its host model */
        snprintf(err, ERR_MAX, "checkpoint: %.200s", cerr);
        return -1;
    }
    if (checkpoint_save(opt->checkpoint_path, engine_host_model(e), meta, err))
        return -1;
    if (h && h->on_checkpoint)
        h->on_checkpoint(h->ctx, opt->checkpoint_path, meta);
    return 0;
}

/* Loss and accuracy over n rows. Workers joined by a communicator each
 * evaluate a contiguous share and the sums are gathered (in rank order, so
 * every worker gets the same bits): nobody idles in the next collective while
 * the chief evaluates alone, and a long evaluation never runs into the
 * collective's timeout. Every worker of such a run must call it. */
static int evaluate(const train_options *opt, engine *eng, const float *x, const float *y, long n, int features,
                    double *loss, double *acc, char err[ERR_MAX])
{
    comm *c = opt->comm;
    int size = c ? comm_size(c) : 1;
    if (size <= 1)
        return engine_evaluate(eng, x, y, n, loss, acc, err);
    int r = comm_rank(c);
    long b = n * r / size, e = n * (r + 1) / size;
    double mine[3] = {0.0, 0.0, (double)(e - b)};
    /* a failed local evaluation (GPU) still takes part in the gather, then fails */
    int bad = e > b && engine_evaluate(eng, x + (size_t)b * (size_t)features, y + b, e - b, &mine[0], &mine[1], err);
    mine[0] *= mine[2];
    mine[1] *= mine[2];
    double all[3 * COMM_MAX_RANKS];
    if (size > COMM_MAX_RANKS || comm_allgather(c, mine, all, sizeof mine)) {
        snprintf(err, ERR_MAX, "evaluation across workers failed: %s", comm_error(c));
        return -1;
    }
    if (bad)
        return -1;
    double ls = 0.0, cs = 0.0, ns = 0.0;
    for (int i = 0; i < size; i++) {
        ls += all[3 * i];
        cs += all[3 * i + 1];
        ns += all[3 * i + 2];
    }
    *loss = ns > 0 ? ls / ns : 0.0;
    *acc = ns > 0 ? cs / ns : 0.0;
    return 0;
}

static int train_run_scaled(const jobspec *spec, const dataset_splits *data, const train_options *opt,
                            const train_hooks *hooks, train_result *res, model **m_out,
                            char err[ERR_MAX]);

/* The epochs to train in all after `done` of `epochs` (hooks->extend): rank
 * 0 asks (unless stopping) and the answer is broadcast to the others of a
 * communicator, so every worker goes on or ends at the same epoch. 0, or
 * -1 with err when the broadcast fails. */
static int ask_extend(const train_options *opt, const train_hooks *hooks, int done, int epochs, int *out,
                      char err[ERR_MAX])
{
    comm *c = opt->comm;
    int many = c && comm_size(c) > 1;
    double more = epochs;
    if ((!many || comm_rank(c) == 0) && !is_stopped(hooks)) {
        int m = hooks->extend(hooks->ctx, done, epochs);
        if (m > epochs)
            more = m;
    }
    if (many && comm_broadcast(c, &more, sizeof more, 0)) {
        snprintf(err, ERR_MAX, "broadcast of the epochs to train failed: %.180s", comm_error(c));
        return -1;
    }
    *out = more > epochs && more <= 1e9 ? (int)more : epochs;
    return 0;
}

int train_run_data(const jobspec *spec, const dataset_splits *data, const train_options *opt_in,
                   const train_hooks *hooks, train_result *res, model **m_out,
                   char err[ERR_MAX])
{
    train_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in)
        opt = *opt_in;
    memset(res, 0, sizeof *res);
    /* Horovod's rule, when asked: the learning rate times the replicas in
     * sync (a read-only copy; the command fields are not used here) */
    jobspec *scaled = NULL;
    if (spec->strategy.scale_learning_rate) {
        /* an elastic job keeps its global batch, and so the rate, of its most workers */
        int w = jobspec_elastic(spec) ? spec->resources.workers : opt.workers > 0 ? opt.workers : 1;
        int in_sync = w * (opt.replicas > 0 ? opt.replicas : 1);
        scaled = xmalloc(sizeof *scaled);
        *scaled = *spec;
        scaled->optimizer.learning_rate *= (float)in_sync;
        spec = scaled;
    }
    int ret = train_run_scaled(spec, data, &opt, hooks, res, m_out, err);
    free(scaled);
    return ret;
}

/* ---------------------------------------------------------------- train_run_scaled, by phase
 *
 * The sizes checked, the set-up (the step engine, the batches), the resume
 * (the chief's checkpoint, broadcast to the other workers), the epochs (the
 * steps of each, then its close: metrics, validation, checkpoint), the test,
 * and the end (the model handed over, everything freed). One loop_run holds
 * what the phases share. */

typedef struct loop_run {
    const jobspec *spec;
    const dataset_splits *data;
    const train_options *opt;
    const train_hooks *hooks;
    train_result *res;
    int workers, worker;
    int k;          /* replicas in this worker */
    int micro, epochs, global_batch, every;
    int replicated; /* K threads and/or several workers meeting in a communicator */
    int worker_rows, replica_rows; /* the most rows this worker and each of its replicas get in one step */
    engine *eng;
    batcher b;
    int have_batcher;
    float *xb, *yb;
    ckpt_meta meta;
    long start_epoch, step, start_pos;
    double lsum; /* the epoch's running sums */
    long correct, seen;
    double train_time;
    long train_examples;
} loop_run;

/* The sizes, and what the options and the data must agree on. */
static int loop_check(loop_run *r, char err[ERR_MAX])
{
    const jobspec *spec = r->spec;
    const train_options *opt = r->opt;
    int workers = r->workers = opt->workers > 0 ? opt->workers : 1;
    int worker = r->worker = opt->worker;
    int k = r->k = opt->replicas > 0 ? opt->replicas : 1;
    r->micro = opt->micro_batches > 0
                   ? opt->micro_batches
                   : (spec->fit.gradient_accumulation_steps > 0 ? spec->fit.gradient_accumulation_steps : 1);
    r->epochs = opt->epochs > 0 ? opt->epochs : spec->fit.epochs;
    int global_batch = r->global_batch = spec->fit.batch_size;
    r->every = opt->checkpoint_every ? opt->checkpoint_every : spec->checkpoint.every_epochs;
    r->replicated = k > 1 || workers > 1 || opt->comm;
    if (worker < 0 || worker >= workers) {
        snprintf(err, ERR_MAX, "worker %d of %d out of range", worker, workers);
        return -1;
    }
    if (workers > 1 && !opt->comm) {
        snprintf(err, ERR_MAX, "%d workers need a communicator", workers);
        return -1;
    }
    if (opt->comm && (comm_size(opt->comm) != workers || comm_rank(opt->comm) != worker)) {
        snprintf(err, ERR_MAX, "the communicator is rank %d of %d, the worker %d of %d",
                 comm_rank(opt->comm), comm_size(opt->comm), worker, workers);
        return -1;
    }
    if (global_batch <= 0 || global_batch < workers * k) {
        snprintf(err, ERR_MAX, "fit.batch_size %d is smaller than the %d replicas in sync",
                 global_batch, workers * k);
        return -1;
    }
    r->worker_rows = (global_batch + workers - 1) / workers;
    r->replica_rows = (r->worker_rows + k - 1) / k;
    const dataset *tr = &r->data->train;
    if (tr->n <= 0) {
        snprintf(err, ERR_MAX, "the training split is empty");
        return -1;
    }
    if (tr->features != spec->input_size) {
        snprintf(err, ERR_MAX, "data has %d features per example, the model's input is %d",
                 tr->features, spec->input_size);
        return -1;
    }
    int outs = spec->output_size;
    if ((spec->loss == LOSS_CATEGORICAL_CROSSENTROPY ||
         spec->loss == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) && outs > 0 && tr->classes > outs) {
        snprintf(err, ERR_MAX, "labels have %d classes but the model outputs %d",
                 tr->classes, outs);
        return -1;
    }
    return 0;
}

/* The BLAS threads, the step engine (CPU: one model, or replicas.c; or
 * GPU: engine.h), the batches and a step's buffers. */
static int loop_setup(loop_run *r, char err[ERR_MAX])
{
    const train_options *opt = r->opt;
    openblas_set_num_threads(opt->threads > 0 && !r->replicated ? opt->threads : 1);
    uint64_t seed = opt->has_seed ? opt->seed : r->spec->data.seed;
    engine_config ec = {.gpus = opt->gpus,
                        .replicas = r->k,
                        .replicated = r->replicated,
                        .vars = opt->replica_vars == REPLICA_VARS_CENTRAL ? REPLICA_VARS_CENTRAL : REPLICA_VARS_MIRRORED,
                        .reduce = opt->replica_reduce == REPLICA_REDUCE_ONE ? REPLICA_REDUCE_ONE : REPLICA_REDUCE_ALL,
                        .comm = opt->comm,
                        .worker = r->worker,
                        .workers = r->workers,
                        .max_rows = r->replica_rows,
                        .micro_batches = r->micro,
                        .global_batch = r->global_batch,
                        .seed = seed,
                        .nccl_id = opt->nccl_id,
                        .grad_reduce = r->hooks ? r->hooks->grad_reduce : NULL,
                        .grad_ctx = r->hooks ? r->hooks->ctx : NULL};
    if (engine_create(&r->eng, r->spec, &ec, err))
        return -1;
    const dataset *tr = &r->data->train;
    dataset_view view = dataset_shard(tr, 0, 1);
    if (batcher_init(&r->b, view, r->global_batch, r->spec->data.shuffle_buffer, r->spec->data.seed)) {
        snprintf(err, ERR_MAX, "cannot make batches of the training data");
        return -1;
    }
    r->have_batcher = 1;
    r->xb = xmalloc(sizeof(float) * (size_t)r->worker_rows * (size_t)tr->features);
    r->yb = xmalloc(sizeof(float) * (size_t)r->worker_rows);
    snprintf(r->meta.spec_hash, sizeof r->meta.spec_hash, "%s", opt->spec_hash);
    return 0;
}

/* Where the run starts: the chief's checkpoint (resume_path), the position
 * broadcast to the other workers of a communicator, then the replicas' (or
 * the GPU's) first variables. */
static int loop_resume(loop_run *r, char err[ERR_MAX])
{
    const train_options *opt = r->opt;
    if (opt->resume_path) {
        ckpt_meta rm;
        char merr[ERR_MAX];
        if (checkpoint_load(opt->resume_path, engine_host_model(r->eng), &rm, err))
            return -1;
        if (engine_push(r->eng, merr)) { /* the GPU engine takes the loaded state */
            snprintf(err, ERR_MAX, "resume: %.200s", merr);
            return -1;
        }
        r->start_epoch = rm.epoch;
        r->step = rm.step;
        r->start_pos = rm.batch_pos;
        r->lsum = rm.epoch_loss_sum;
        r->correct = rm.epoch_correct;
        r->seen = rm.epoch_seen;
    }
    if (opt->comm && comm_size(opt->comm) > 1) {
        /* the chief resumed (or not): every worker continues where it does */
        double pos[6] = {(double)r->start_epoch, (double)r->step, (double)r->start_pos, r->lsum,
                         (double)r->correct, (double)r->seen};
        if (comm_broadcast(opt->comm, pos, sizeof pos, 0)) {
            snprintf(err, ERR_MAX, "broadcast of the start position failed: %.180s",
                     comm_error(opt->comm));
            return -1;
        }
        r->start_epoch = (long)pos[0];
        r->step = (long)pos[1];
        r->start_pos = (long)pos[2];
        r->lsum = pos[3];
        r->correct = (long)pos[4];
        r->seen = (long)pos[5];
    }
    if ((r->replicated || engine_is_gpu(r->eng)) && engine_sync_initial(r->eng, err))
        return -1;
    r->res->epochs_done = (int)r->start_epoch;
    r->res->steps = r->step;
    return 0;
}

/* The steps of epoch ep (started at t0), the batcher placed: 0 when the
 * epoch's batches (or fit.steps_per_epoch of them) are done; 1 when the
 * stop flag was seen (the position checkpointed, res->stopped); -1 on
 * failure. *ep_examples: the rows this worker trained. */
static int loop_steps(loop_run *r, long ep, double t0, double *ep_examples, char err[ERR_MAX])
{
    const jobspec *spec = r->spec;
    const train_hooks *hooks = r->hooks;
    long steps_in_epoch = spec->fit.steps_per_epoch > 0 ? spec->fit.steps_per_epoch : -1;
    long done_steps = r->b.pos / r->global_batch;
    char merr[ERR_MAX];
    int n, stop_now = 0;
    for (;;) {
        if (steps_in_epoch >= 0 && done_steps >= steps_in_epoch)
            return 0;
        int rows = 0;
        long row0 = 0;
        if (r->replicated)
            n = batcher_next_part(&r->b, r->worker, r->workers, r->xb, r->yb, &row0, &rows);
        else
            n = rows = batcher_next(&r->b, r->xb, r->yb);
        if (n <= 0)
            return 0;
        engine_step_result sr;
        if (engine_step(r->eng, r->xb, r->yb, rows, row0, r->global_batch, r->replicated && is_stopped(hooks), &sr,
                        merr)) {
            snprintf(err, ERR_MAX, "step %ld: %.200s", r->step + 1, merr);
            return -1;
        }
        step_stats st = sr.st;
        float loss = sr.loss;
        if (r->replicated)
            stop_now = sr.stop;
        r->step++;
        done_steps++;
        r->lsum += st.loss_sum;
        r->correct += st.correct;
        r->seen += st.n;
        *ep_examples += rows;
        if (hooks && hooks->on_step) {
            train_step_info si = {.step = r->step, .epoch = (int)ep, .loss = loss, .n = n};
            hooks->on_step(hooks->ctx, &si);
        }
        if (!r->replicated)
            stop_now = is_stopped(hooks);
        if (stop_now) {
            r->train_time += mono_s() - t0;
            r->train_examples += (long)*ep_examples;
            r->meta.epoch = ep;
            r->meta.step = r->step;
            r->meta.batch_pos = r->b.pos;
            r->meta.data_rng = r->b.rng;
            r->meta.epoch_loss_sum = r->lsum;
            r->meta.epoch_correct = r->correct;
            r->meta.epoch_seen = r->seen;
            if (write_ckpt(r->opt, hooks, r->eng, &r->meta, err))
                return -1;
            r->res->stopped = 1;
            r->res->steps = r->step;
            return 1;
        }
    }
}

/* The close of epoch ep (started at t0): its metrics and validation,
 * on_epoch, at the last one the question of more epochs (hooks->extend),
 * the checkpoint. 0: go on; 1: the stop flag was seen between epochs (a
 * run of one replica); -1: failure. */
static int loop_close_epoch(loop_run *r, long ep, double t0, double ep_examples, char err[ERR_MAX])
{
    const train_hooks *hooks = r->hooks;
    const dataset_splits *data = r->data;
    train_result *res = r->res;
    double secs = mono_s() - t0;
    r->train_time += secs;
    r->train_examples += (long)ep_examples;

    train_epoch_metrics em;
    memset(&em, 0, sizeof em);
    em.epoch = (int)ep + 1;
    em.epochs = r->epochs;
    em.step = r->step;
    em.loss = r->seen ? r->lsum / (double)r->seen : 0.0;
    em.accuracy = r->seen ? (double)r->correct / (double)r->seen : 0.0;
    em.seconds = secs;
    em.samples_per_sec = secs > 0 ? ep_examples / secs : 0.0;
    if (data->val.n > 0 && !r->opt->no_eval) {
        em.has_val = 1;
        if (evaluate(r->opt, r->eng, data->val.x, data->val.y, data->val.n, data->train.features, &em.val_loss,
                     &em.val_accuracy, err))
            return -1;
    }
    train_result_epoch(r->res, &em);
    if (hooks && hooks->on_epoch)
        hooks->on_epoch(hooks->ctx, &em);

    int last = ep + 1 == r->epochs;
    if (last && hooks && hooks->extend) {
        int more = 0;
        if (ask_extend(r->opt, hooks, (int)ep + 1, r->epochs, &more, err))
            return -1;
        if (more > r->epochs) {
            r->epochs = more;
            last = 0;
        }
    }
    if (last || (r->every > 0 && (ep + 1) % r->every == 0)) {
        r->meta.epoch = ep + 1;
        r->meta.step = r->step;
        r->meta.batch_pos = 0;
        r->meta.data_rng = 0;
        r->meta.epoch_loss_sum = 0.0;
        r->meta.epoch_correct = 0;
        r->meta.epoch_seen = 0;
        if (write_ckpt(r->opt, hooks, r->eng, &r->meta, err))
            return -1;
    }
    /* replicated runs stop together at a step (the flag rides the
     * all-reduce); a flag raised between epochs waits for that step */
    if (!r->replicated && is_stopped(hooks) && !last) {
        res->stopped = 1;
        return 1;
    }
    return 0;
}

/* The epochs from the start position on (their number may grow at the
 * last, hooks->extend): 0 when all are trained, 1 when stopped by the
 * flag, -1 on failure. */
static int loop_epochs(loop_run *r, char err[ERR_MAX])
{
    for (long ep = r->start_epoch; ep < r->epochs; ep++) {
        if (ep == r->start_epoch && r->start_pos > 0) {
            batcher_seek(&r->b, ep, r->start_pos);
        } else {
            batcher_reset(&r->b, ep);
            r->lsum = 0.0;
            r->correct = 0;
            r->seen = 0;
        }
        double t0 = mono_s(), ep_examples = 0;
        int rc = loop_steps(r, ep, t0, &ep_examples, err);
        if (!rc)
            rc = loop_close_epoch(r, ep, t0, ep_examples, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* The test split's loss and accuracy, after the last epoch. */
static int loop_test(loop_run *r, char err[ERR_MAX])
{
    const dataset_splits *data = r->data;
    train_result *res = r->res;
    if (data->test.n > 0 && !r->opt->no_eval) {
        res->has_test = 1;
        if (evaluate(r->opt, r->eng, data->test.x, data->test.y, data->test.n, data->train.features,
                     &res->test_loss, &res->test_accuracy, err))
            return -1;
    }
    return 0;
}

/* Frees what the run holds; a run that succeeded (ret 0) first hands over
 * a CPU model of its own (m_out). Returns ret, or -1 when that fails. */
static int loop_end(loop_run *r, int ret, model **m_out, char err[ERR_MAX])
{
    free(r->xb);
    free(r->yb);
    if (r->have_batcher)
        batcher_release(&r->b);
    if (ret == 0 && m_out) {
        *m_out = engine_take_model(r->eng, r->spec, err);
        if (!*m_out)
            ret = -1;
    }
    engine_free(r->eng);
    return ret;
}

static int train_run_scaled(const jobspec *spec, const dataset_splits *data, const train_options *opt,
                            const train_hooks *hooks, train_result *res, model **m_out,
                            char err[ERR_MAX])
{
    if (m_out)
        *m_out = NULL;
    err[0] = 0;
    if (opt->gpus > 0) { /* a GPU task trains on GPUs or not at all (never silently on the CPU) */
        if (engine_gpu_check(spec, opt->gpus, opt->workers > 0 ? opt->workers : 1, err))
            return -1;
    }
    if (spec->strategy.type == STRAT_PARAMETER_SERVER && opt->n_ps > 0)
        return ps_train(spec, data, opt, hooks, res, err) ? -1 : 0;
    loop_run r;
    memset(&r, 0, sizeof r);
    r.spec = spec;
    r.data = data;
    r.opt = opt;
    r.hooks = hooks;
    r.res = res;
    if (loop_check(&r, err))
        return -1;
    int ret = -1;
    if (!loop_setup(&r, err) && !loop_resume(&r, err)) {
        int rc = loop_epochs(&r, err); /* 1: stopped, no test */
        if (!rc)
            rc = loop_test(&r, err);
        if (rc >= 0) {
            res->train_seconds = r.train_time;
            res->samples_per_sec = r.train_time > 0 ? (double)r.train_examples / r.train_time : 0.0;
            ret = 0;
        }
    }
    return loop_end(&r, ret, m_out, err);
}

int train_run(const jobspec *spec, const train_options *opt, const train_hooks *hooks,
              train_result *res, char err[ERR_MAX])
{
    data_spec ds = spec->data;
    if (opt && opt->data_path)
        snprintf(ds.path, sizeof ds.path, "%s", opt->data_path);
    if (opt && opt->limit > 0)
        ds.limit = opt->limit;
    dataset_splits splits;
    memset(res, 0, sizeof *res);
    if (dataset_load(&ds, &splits, err))
        return -1;
    int rc = train_run_data(spec, &splits, opt, hooks, res, NULL, err);
    dataset_splits_free(&splits);
    return rc;
}
