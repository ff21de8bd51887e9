/* train_loop.c - the epoch loop (see train_loop.h). Steps read as
 * batcher_next -> model_forward_backward -> grad_reduce -> apply; nothing
 * allocates inside the loop. */
#include "train_loop.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

static int is_stopped(const train_hooks *h)
{
    return h && h->stop && *h->stop;
}

static int write_ckpt(const train_options *opt, const train_hooks *h, const model *m,
                      const ckpt_meta *meta, char err[TRAIN_ERR_MAX])
{
    if (!opt->checkpoint_path)
        return 0;
    char cerr[CKPT_ERR_MAX];
    if (checkpoint_save(opt->checkpoint_path, m, meta, cerr)) {
        snprintf(err, TRAIN_ERR_MAX, "%s", cerr);
        return -1;
    }
    if (h && h->on_checkpoint)
        h->on_checkpoint(h->ctx, opt->checkpoint_path, meta);
    return 0;
}

int train_run_data(const jobspec *spec, const dataset_splits *data, const train_options *opt_in,
                   const train_hooks *hooks, train_result *res, model **m_out,
                   char err[TRAIN_ERR_MAX])
{
    train_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in)
        opt = *opt_in;
    memset(res, 0, sizeof *res);
    if (m_out)
        *m_out = NULL;
    err[0] = 0;
    int workers = opt.workers > 0 ? opt.workers : 1;
    int worker = opt.worker;
    int epochs = opt.epochs > 0 ? opt.epochs : spec->fit.epochs;
    int global_batch = spec->fit.batch_size;
    int every = opt.checkpoint_every ? opt.checkpoint_every : spec->checkpoint.every_epochs;
    if (worker < 0 || worker >= workers) {
        snprintf(err, TRAIN_ERR_MAX, "worker %d of %d out of range", worker, workers);
        return -1;
    }
    if (global_batch <= 0 || global_batch % workers) {
        snprintf(err, TRAIN_ERR_MAX, "fit.batch_size %d does not divide among %d workers",
                 global_batch, workers);
        return -1;
    }
    int local_batch = global_batch / workers;
    const dataset *tr = &data->train;
    if (tr->n <= 0) {
        snprintf(err, TRAIN_ERR_MAX, "the training split is empty");
        return -1;
    }
    if (tr->features != spec->input_size) {
        snprintf(err, TRAIN_ERR_MAX, "data has %d features per example, the model's input is %d",
                 tr->features, spec->input_size);
        return -1;
    }
    int outs = spec->output_size;
    if ((spec->loss == LOSS_CATEGORICAL_CROSSENTROPY ||
         spec->loss == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) && outs > 0 && tr->classes > outs) {
        snprintf(err, TRAIN_ERR_MAX, "labels have %d classes but the model outputs %d",
                 tr->classes, outs);
        return -1;
    }
    openblas_set_num_threads(opt.threads > 0 ? opt.threads : 1);

    model *m = NULL;
    char merr[MODEL_ERR_MAX];
    uint64_t seed = opt.has_seed ? opt.seed : spec->data.seed;
    if (model_build(&m, spec, local_batch, seed, merr)) {
        snprintf(err, TRAIN_ERR_MAX, "%s", merr);
        return -1;
    }
    batcher b;
    dataset_view view = dataset_shard(tr, worker, workers);
    if (batcher_init(&b, view, local_batch, spec->data.shuffle_buffer, spec->data.seed)) {
        snprintf(err, TRAIN_ERR_MAX, "cannot make batches of the training data");
        model_free(m);
        return -1;
    }
    float *xb = xmalloc(sizeof(float) * (size_t)local_batch * (size_t)tr->features);
    float *yb = xmalloc(sizeof(float) * (size_t)local_batch);
    int ret = -1;

    ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.spec_hash, sizeof meta.spec_hash, "%s", opt.spec_hash);
    long start_epoch = 0, step = 0;
    double lsum = 0.0;
    long correct = 0, seen = 0, start_pos = 0;
    if (opt.resume_path) {
        char cerr[CKPT_ERR_MAX];
        ckpt_meta rm;
        if (checkpoint_load(opt.resume_path, m, &rm, cerr)) {
            snprintf(err, TRAIN_ERR_MAX, "%s", cerr);
            goto out;
        }
        start_epoch = rm.epoch;
        step = rm.step;
        start_pos = rm.batch_pos;
        lsum = rm.epoch_loss_sum;
        correct = rm.epoch_correct;
        seen = rm.epoch_seen;
    }
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
        long done_steps = b.pos / local_batch;
        double t0 = mono_s(), ep_examples = 0;
        int n;
        while ((steps_in_epoch < 0 || done_steps < steps_in_epoch) && (n = batcher_next(&b, xb, yb)) > 0) {
            step_stats st;
            float loss;
            if (hooks && hooks->grad_reduce) {
                loss = model_forward_backward(m, xb, yb, n, global_batch, &st);
                if (hooks->grad_reduce(hooks->ctx, m, model_grads(m), model_param_count(m), &st)) {
                    snprintf(err, TRAIN_ERR_MAX, "gradient reduction failed at step %ld", step + 1);
                    goto out;
                }
                model_apply_gradients(m);
            } else {
                loss = model_train_step(m, xb, yb, n, global_batch, &st);
            }
            step++;
            done_steps++;
            lsum += st.loss_sum;
            correct += st.correct;
            seen += st.n;
            ep_examples += n;
            if (hooks && hooks->on_step) {
                train_step_info si = {.step = step, .epoch = (int)ep, .loss = loss, .n = n};
                hooks->on_step(hooks->ctx, &si);
            }
            if (is_stopped(hooks)) {
                train_time += mono_s() - t0;
                train_examples += (long)ep_examples;
                meta.epoch = ep;
                meta.step = step;
                meta.batch_pos = b.pos;
                meta.data_rng = b.rng;
                meta.epoch_loss_sum = lsum;
                meta.epoch_correct = correct;
                meta.epoch_seen = seen;
                if (write_ckpt(&opt, hooks, m, &meta, err))
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
        if (data->val.n > 0) {
            em.has_val = 1;
            model_evaluate(m, data->val.x, data->val.y, data->val.n, &em.val_loss, &em.val_accuracy);
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
        if (last || (every > 0 && (ep + 1) % every == 0)) {
            meta.epoch = ep + 1;
            meta.step = step;
            meta.batch_pos = 0;
            meta.data_rng = 0;
            meta.epoch_loss_sum = 0.0;
            meta.epoch_correct = 0;
            meta.epoch_seen = 0;
            if (write_ckpt(&opt, hooks, m, &meta, err))
                goto out;
        }
        if (is_stopped(hooks) && !last) {
            res->stopped = 1;
            ret = 0;
            goto finish;
        }
    }
    if (data->test.n > 0) {
        res->has_test = 1;
        model_evaluate(m, data->test.x, data->test.y, data->test.n, &res->test_loss,
                       &res->test_accuracy);
    }
    ret = 0;
finish:
    res->train_seconds = train_time;
    res->samples_per_sec = train_time > 0 ? (double)train_examples / train_time : 0.0;
out:
    free(xb);
    free(yb);
    batcher_release(&b);
    if (ret == 0 && m_out)
        *m_out = m;
    else
        model_free(m);
    return ret;
}

int train_run(const jobspec *spec, const train_options *opt, const train_hooks *hooks,
              train_result *res, char err[TRAIN_ERR_MAX])
{
    data_spec ds = spec->data;
    if (opt && opt->data_path)
        snprintf(ds.path, sizeof ds.path, "%s", opt->data_path);
    if (opt && opt->limit > 0)
        ds.limit = opt->limit;
    dataset_splits splits;
    char derr[DATASET_ERR_MAX];
    memset(res, 0, sizeof *res);
    if (dataset_load(&ds, &splits, derr)) {
        snprintf(err, TRAIN_ERR_MAX, "%s", derr);
        return -1;
    }
    int rc = train_run_data(spec, &splits, opt, hooks, res, NULL, err);
    dataset_splits_free(&splits);
    return rc;
}
