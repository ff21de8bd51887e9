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

static int train_run_scaled(const jobspec *spec, const dataset_splits *data, const train_options *opt_in,
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

static int train_run_scaled(const jobspec *spec, const dataset_splits *data, const train_options *opt_in,
                            const train_hooks *hooks, train_result *res, model **m_out,
                            char err[ERR_MAX])
{
    train_options opt = *opt_in;
    if (m_out)
        *m_out = NULL;
    err[0] = 0;
    if (opt.gpus > 0) { /* a GPU task trains on GPUs or not at all (never silently on the CPU) */
        if (engine_gpu_check(spec, opt.gpus, opt.workers > 0 ? opt.workers : 1, err))
            return -1;
    }
    if (spec->strategy.type == STRAT_PARAMETER_SERVER && opt.n_ps > 0)
        return ps_train(spec, data, &opt, hooks, res, err) ? -1 : 0;
    int workers = opt.workers > 0 ? opt.workers : 1;
    int worker = opt.worker;
    int k = opt.replicas > 0 ? opt.replicas : 1;
    int micro = opt.micro_batches > 0 ? opt.micro_batches
                                      : (spec->fit.gradient_accumulation_steps > 0 ? spec->fit.gradient_accumulation_steps : 1);
    int epochs = opt.epochs > 0 ? opt.epochs : spec->fit.epochs;
    int global_batch = spec->fit.batch_size;
    int every = opt.checkpoint_every ? opt.checkpoint_every : spec->checkpoint.every_epochs;
    /* replicated: K threads and/or several workers meeting in a communicator */
    int replicated = k > 1 || workers > 1 || opt.comm;
    if (worker < 0 || worker >= workers) {
        snprintf(err, ERR_MAX, "worker %d of %d out of range", worker, workers);
        return -1;
    }
    if (workers > 1 && !opt.comm) {
        snprintf(err, ERR_MAX, "%d workers need a communicator", workers);
        return -1;
    }
    if (opt.comm && (comm_size(opt.comm) != workers || comm_rank(opt.comm) != worker)) {
        snprintf(err, ERR_MAX, "the communicator is rank %d of %d, the worker %d of %d",
                 comm_rank(opt.comm), comm_size(opt.comm), worker, workers);
        return -1;
    }
    if (global_batch <= 0 || global_batch < workers * k) {
        snprintf(err, ERR_MAX, "fit.batch_size %d is smaller than the %d replicas in sync",
                 global_batch, workers * k);
        return -1;
    }
    /* the most rows this worker and each of its replicas get in one step */
    int worker_rows = (global_batch + workers - 1) / workers;
    int replica_rows = (worker_rows + k - 1) / k;
    const dataset *tr = &data->train;
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
    openblas_set_num_threads(opt.threads > 0 && !replicated ? opt.threads : 1);

    /* the step engine: CPU (one model, or replicas.c) or GPU (engine.h) */
    engine *eng = NULL;
    char merr[ERR_MAX];
    uint64_t seed = opt.has_seed ? opt.seed : spec->data.seed;
    engine_config ec = {.gpus = opt.gpus,
                        .replicas = k,
                        .replicated = replicated,
                        .vars = opt.replica_vars == REPLICA_VARS_CENTRAL ? REPLICA_VARS_CENTRAL : REPLICA_VARS_MIRRORED,
                        .reduce = opt.replica_reduce == REPLICA_REDUCE_ONE ? REPLICA_REDUCE_ONE : REPLICA_REDUCE_ALL,
                        .comm = opt.comm,
                        .worker = worker,
                        .workers = workers,
                        .max_rows = replica_rows,
                        .micro_batches = micro,
                        .global_batch = global_batch,
                        .seed = seed,
                        .nccl_id = opt.nccl_id,
                        .grad_reduce = hooks ? hooks->grad_reduce : NULL,
                        .grad_ctx = hooks ? hooks->ctx : NULL};
    if (engine_create(&eng, spec, &ec, err))
        return -1;
    batcher b;
    dataset_view view = dataset_shard(tr, 0, 1);
    if (batcher_init(&b, view, global_batch, spec->data.shuffle_buffer, spec->data.seed)) {
        snprintf(err, ERR_MAX, "cannot make batches of the training data");
        engine_free(eng);
        return -1;
    }
    float *xb = xmalloc(sizeof(float) * (size_t)worker_rows * (size_t)tr->features);
    float *yb = xmalloc(sizeof(float) * (size_t)worker_rows);
    int ret = -1;

    ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.spec_hash, sizeof meta.spec_hash, "%s", opt.spec_hash);
    long start_epoch = 0, step = 0;
    double lsum = 0.0;
    long correct = 0, seen = 0, start_pos = 0;
    if (opt.resume_path) {
        ckpt_meta rm;
        if (checkpoint_load(opt.resume_path, engine_host_model(eng), &rm, err))
            goto out;
        if (engine_push(eng, merr)) { /* the GPU engine takes the loaded state */
            snprintf(err, ERR_MAX, "resume: %.200s", merr);
            goto out;
        }
        start_epoch = rm.epoch;
        step = rm.step;
        start_pos = rm.batch_pos;
        lsum = rm.epoch_loss_sum;
        correct = rm.epoch_correct;
        seen = rm.epoch_seen;
    }
    if (opt.comm && comm_size(opt.comm) > 1) {
        /* the chief resumed (or not): every worker continues where it does */
        double pos[6] = {(double)start_epoch, (double)step, (double)start_pos, lsum, (double)correct,
                         (double)seen};
        if (comm_broadcast(opt.comm, pos, sizeof pos, 0)) {
            snprintf(err, ERR_MAX, "broadcast of the start position failed: %.180s",
                     comm_error(opt.comm));
            goto out;
        }
        start_epoch = (long)pos[0];
        step = (long)pos[1];
        start_pos = (long)pos[2];
        lsum = pos[3];
        correct = (long)pos[4];
        seen = (long)pos[5];
    }
    if ((replicated || engine_is_gpu(eng)) && engine_sync_initial(eng, err))
        goto out;
    res->epochs_done = (int)start_epoch;
    res->steps = step;

    double train_time = 0.0;
    long train_examples = 0;
    for (long ep = start_epoch; ep < epochs; ep++) {
        if (ep == start_epoch && start_pos > 0) {
            batcher_seek(&b, ep, start_pos);
        } else {
            batcher_reset(&b, ep);
            lsum = 0.0;
            correct = 0;
            seen = 0;
        }
        long steps_in_epoch = spec->fit.steps_per_epoch > 0 ? spec->fit.steps_per_epoch : -1;
        long done_steps = b.pos / global_batch;
        double t0 = mono_s(), ep_examples = 0;
        int n, stop_now = 0;
        for (;;) {
            if (steps_in_epoch >= 0 && done_steps >= steps_in_epoch)
                break;
            int rows = 0;
            long row0 = 0;
            if (replicated)
                n = batcher_next_part(&b, worker, workers, xb, yb, &row0, &rows);
            else
                n = rows = batcher_next(&b, xb, yb);
            if (n <= 0)
                break;
            engine_step_result sr;
            if (engine_step(eng, xb, yb, rows, row0, global_batch, replicated && is_stopped(hooks), &sr, merr)) {
                snprintf(err, ERR_MAX, "step %ld: %.200s", step + 1, merr);
                goto out;
            }
            step_stats st = sr.st;
            float loss = sr.loss;
            if (replicated)
                stop_now = sr.stop;
            step++;
            done_steps++;
            lsum += st.loss_sum;
            correct += st.correct;
            seen += st.n;
            ep_examples += rows;
            if (hooks && hooks->on_step) {
                train_step_info si = {.step = step, .epoch = (int)ep, .loss = loss, .n = n};
                hooks->on_step(hooks->ctx, &si);
            }
            if (!replicated)
                stop_now = is_stopped(hooks);
            if (stop_now) {
                train_time += mono_s() - t0;
                train_examples += (long)ep_examples;
                meta.epoch = ep;
                meta.step = step;
                meta.batch_pos = b.pos;
                meta.data_rng = b.rng;
                meta.epoch_loss_sum = lsum;
                meta.epoch_correct = correct;
                meta.epoch_seen = seen;
                if (write_ckpt(&opt, hooks, eng, &meta, err))
                    goto out;
                res->stopped = 1;
                res->steps = step;
                ret = 0;
                goto finish;
            }
        }
        double secs = mono_s() - t0;
        train_time += secs;
        train_examples += (long)ep_examples;

        train_epoch_metrics em;
        memset(&em, 0, sizeof em);
        em.epoch = (int)ep + 1;
        em.epochs = epochs;
        em.step = step;
        em.loss = seen ? lsum / (double)seen : 0.0;
        em.accuracy = seen ? (double)correct / (double)seen : 0.0;
        em.seconds = secs;
        em.samples_per_sec = secs > 0 ? ep_examples / secs : 0.0;
        if (data->val.n > 0 && !opt.no_eval) {
            em.has_val = 1;
            if (evaluate(&opt, eng, data->val.x, data->val.y, data->val.n, tr->features, &em.val_loss,
                         &em.val_accuracy, err))
                goto out;
        }
        res->epochs_done = (int)ep + 1;
        res->steps = step;
        res->loss = em.loss;
        res->accuracy = em.accuracy;
        res->has_val = em.has_val;
        res->val_loss = em.val_loss;
        res->val_accuracy = em.val_accuracy;
        if (hooks && hooks->on_epoch)
            hooks->on_epoch(hooks->ctx, &em);

        int last = ep + 1 == epochs;
        if (last && hooks && hooks->extend) {
            int more = 0;
            if (ask_extend(&opt, hooks, (int)ep + 1, epochs, &more, err))
                goto out;
            if (more > epochs) {
                epochs = more;
                last = 0;
            }
        }
        if (last || (every > 0 && (ep + 1) % every == 0)) {
            meta.epoch = ep + 1;
            meta.step = step;
            meta.batch_pos = 0;
            meta.data_rng = 0;
            meta.epoch_loss_sum = 0.0;
            meta.epoch_correct = 0;
            meta.epoch_seen = 0;
            if (write_ckpt(&opt, hooks, eng, &meta, err))
                goto out;
        }
        /* replicated runs stop together at a step (the flag rides the
         * all-reduce); a flag raised between epochs waits for that step */
        if (!replicated && is_stopped(hooks) && !last) {
            res->stopped = 1;
            ret = 0;
            goto finish;
        }
    }
    if (data->test.n > 0 && !opt.no_eval) {
        res->has_test = 1;
        if (evaluate(&opt, eng, data->test.x, data->test.y, data->test.n, tr->features, &res->test_loss,
                     &res->test_accuracy, err))
            goto out;
    }
    ret = 0;
finish:
    res->train_seconds = train_time;
    res->samples_per_sec = train_time > 0 ? (double)train_examples / train_time : 0.0;
out:
    free(xb);
    free(yb);
    batcher_release(&b);
    if (ret == 0 && m_out) {
        /* hand over a CPU model of its own */
        *m_out = engine_take_model(eng, spec, err);
        if (!*m_out)
            ret = -1;
    }
    engine_free(eng);
    return ret;
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
