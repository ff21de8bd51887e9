/* check_gpu_train.c - the worker's GPU engine (executor/strategy/engine.c
 * under train_loop.c): which engine a task gets, and what it trains.
 *
 * Everywhere (a CPU build included):
 *   - a task given GPUs on a build without CUDA (or with no visible device)
 *     fails with the clear reason, through train_run_data and through the
 *     real worker binary ($TRAINYARD_BIN worker with a crafted
 *     TRAINYARD_CONFIG whose "devices" are ["gpu:0"]); it never trains on
 *     the CPU in their place;
 *   - a task given no GPU passes the check (the CPU engine).
 * With a CUDA device (else "SKIP: no CUDA device (...)" and pass):
 *   - default on 1 GPU against default on the CPU engine: 30 SGD-momentum
 *     steps of an MLP with dropout and L2, weights within REL_TOL (max
 *     |gpu - cpu| / max |cpu|), training/validation/test loss within
 *     LOSS_TOL relative;
 *   - stop at step 17 + resume from the GPU's checkpoint = the uninterrupted
 *     GPU run within RESUME_TOL, and the GPU's checkpoint loads into a CPU
 *     model;
 *   - a CNN (conv2d, batch normalization, max pooling, dense, dropout) on 1
 *     GPU against the CPU engine (weights and batch normalization's moving
 *     statistics within REL_TOL), and its stop at 17 + resume = the
 *     uninterrupted GPU run within RESUME_TOL, moving statistics included,
 *     through the checkpoint (not yet run on a GPU: docs/gpu.md);
 *   - errors: more GPUs than visible, devices_per_worker not the GPU count,
 *     parameter_server;
 * With 2 CUDA devices: mirrored on 2 GPUs (NCCL in one process) and
 * multi_worker_mirrored with 2 worker processes of 1 GPU each (NCCL id made
 * by rank 0 and handed over the CPU communicator, as the worker does through
 * the rendezvous) against the CPU default, within REL_TOL.
 *
 * REL_TOL 1e-3 is chosen, not calibrated on a GPU (docs/gpu.md): the GEMMs
 * sum in another order, and over 30 steps a pre-activation within rounding
 * of zero may take the other relu decision; an engine that drops a term
 * (masks, regularization, the reduction) is off by 1e-2 or more. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../spec/jobspec.h"
#include "../common/util.h"
#include "../executor/comm/comm.h"
#include "../executor/cuda/gpu_device.h"
#include "../executor/cuda/nccl_comm.h"
#include "../executor/data/dataset.h"
#include "../executor/nn/checkpoint.h"
#include "../executor/strategy/engine.h"
#include "../executor/train_loop.h"

#define STEPS 30
#define BATCH 64
#define REL_TOL 1e-3
#define LOSS_TOL 1e-3
#define RESUME_TOL 1e-6

static const char *SPEC_FMT =
    "{\"name\": \"gpu-train\","
    " \"model\": {\"layers\": ["
    "  {\"type\": \"dense\", \"units\": 128, \"activation\": \"relu\", \"input_shape\": [64],"
    "   \"kernel_regularizer\": {\"l2\": 0.0005}},"
    "  {\"type\": \"dropout\", \"rate\": 0.3},"
    "  {\"type\": \"dense\", \"units\": 64, \"activation\": \"relu\"},"
    "  {\"type\": \"dropout\", \"rate\": 0.2},"
    "  {\"type\": \"dense\", \"units\": 2, \"activation\": \"softmax\"}]},"
    " \"compile\": {\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.05, \"momentum\": 0.9},"
    "  \"loss\": \"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]},"
    " \"data\": {\"source\": \"synthetic\", \"examples\": 2400, \"features\": 64,"
    "  \"validation_split\": 0.2, \"seed\": 5},"
    " \"fit\": {\"epochs\": %d, \"batch_size\": %d, \"steps_per_epoch\": %d},"
    " \"strategy\": {\"type\": \"%s\"},"
    " \"resources\": {\"workers\": %d, \"devices_per_worker\": %d, \"device\": \"gpu\"%s}}";

static void make_spec(jobspec *s, char *json, size_t cap, int epochs, const char *strat, int workers, int k)
{
    snprintf(json, cap, SPEC_FMT, epochs, BATCH, STEPS / epochs, strat, workers, k,
             strcmp(strat, "parameter_server") == 0 ? ", \"ps\": 1" : "");
    spec_error se;
    memset(s, 0, sizeof *s);
    ck_assert_msg(jobspec_parse(json, strlen(json), s, &se) == 0, "spec: %s: %s", se.field, se.message);
}

static const char *CNN_SPEC_FMT =
    "{\"name\": \"gpu-train-cnn\","
    " \"model\": {\"layers\": ["
    "  {\"type\": \"conv2d\", \"filters\": 4, \"kernel_size\": 3, \"padding\": \"same\","
    "   \"activation\": \"relu\", \"input_shape\": [8, 8, 1]},"
    "  {\"type\": \"batch_normalization\"},"
    "  {\"type\": \"max_pooling2d\", \"pool_size\": 2},"
    "  {\"type\": \"flatten\"},"
    "  {\"type\": \"dense\", \"units\": 16, \"activation\": \"relu\"},"
    "  {\"type\": \"dropout\", \"rate\": 0.2},"
    "  {\"type\": \"dense\", \"units\": 2, \"activation\": \"softmax\"}]},"
    " \"compile\": {\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.05, \"momentum\": 0.9},"
    "  \"loss\": \"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]},"
    " \"data\": {\"source\": \"synthetic\", \"examples\": 2400, \"features\": 64,"
    "  \"validation_split\": 0.2, \"seed\": 5},"
    " \"fit\": {\"epochs\": 2, \"batch_size\": %d, \"steps_per_epoch\": %d},"
    " \"strategy\": {\"type\": \"default\"},"
    " \"resources\": {\"workers\": 1, \"devices_per_worker\": 1, \"device\": \"gpu\"}}";

static void make_cnn_spec(jobspec *s, char *json, size_t cap)
{
    snprintf(json, cap, CNN_SPEC_FMT, BATCH, STEPS / 2);
    spec_error se;
    memset(s, 0, sizeof *s);
    ck_assert_msg(jobspec_parse(json, strlen(json), s, &se) == 0, "cnn spec: %s: %s", se.field, se.message);
}

static void load(const jobspec *s, dataset_splits *d)
{
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s->data, d, err) == 0, "%s", err);
}

/* The CUDA devices this process sees (0 in a CPU build); why in `why`. */
static int gpu_count(char why[ERR_MAX])
{
    int n = 0;
    why[0] = 0;
    if (gpu_device_count(&n, why) != 0)
        n = 0;
    return n;
}

/* 1 when at least `need` devices are there; else prints the skip line. */
static int have_gpus(int need, const char *test)
{
    char why[ERR_MAX];
    int n = gpu_count(why);
    if (n < need) {
        printf("SKIP: %s (%d CUDA device(s), %d needed%s%s)\n", test, n, need, why[0] ? ": " : "", why);
        return 0;
    }
    return 1;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0.0, mw = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md)
            md = d;
        if (fabs((double)a[i]) > mw)
            mw = fabs((double)a[i]);
    }
    return mw > 0 ? md / mw : md;
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12); }

/* ------------------------------------------------------------ everywhere */

/* The reason a GPU task must fail with here, or NULL when this machine can
 * train it (a CUDA build with a device). */
static const char *expected_refusal(void)
{
    char why[ERR_MAX];
    if (!gpu_built_with_cuda())
        return "this worker was built without CUDA";
    if (gpu_count(why) == 0)
        return "no CUDA device is visible";
    return NULL;
}

START_TEST(gpu_task_refused_without_cuda)
{
    const char *want = expected_refusal();
    if (!want) {
        printf("SKIP: gpu_task_refused_without_cuda (this build has CUDA and sees a device)\n");
        return;
    }
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 1, "default", 1, 1);
    dataset_splits d;
    load(&s, &d);
    train_options o;
    memset(&o, 0, sizeof o);
    o.gpus = 1;
    train_result res;
    char err[ERR_MAX] = "";
    ck_assert_int_eq(train_run_data(&s, &d, &o, NULL, &res, NULL, err), -1);
    ck_assert_msg(strstr(err, want) != NULL, "error '%s' lacks '%s'", err, want);
    ck_assert_int_eq(res.steps, 0); /* nothing trained on the CPU */
    printf("a GPU task here: %s\n", err);
    /* the same spec with no GPU given trains on the CPU engine */
    char eerr[ERR_MAX];
    ck_assert_int_eq(engine_gpu_check(&s, 0, 1, eerr), 0);
    o.gpus = 0;
    ck_assert_msg(train_run_data(&s, &d, &o, NULL, &res, NULL, err) == 0, "%s", err);
    ck_assert_int_eq(res.steps, STEPS);
    dataset_splits_free(&d);
    jobspec_release(&s);
}
END_TEST

/* Runs `bin worker` with TRAINYARD_CONFIG = cfg; its exit status and output
 * (stdout + stderr, cap bytes). Kills it after limit_s. */
static int run_worker(const char *bin, const char *cfg, char *out, size_t cap, int limit_s)
{
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        setenv("TRAINYARD_CONFIG", cfg, 1);
        execl(bin, bin, "worker", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    size_t len = 0;
    double end = mono_s() + limit_s;
    int killed = 0;
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int left = (int)((end - mono_s()) * 1000);
        if (left <= 0) {
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t r = read(pfd[0], out + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len >= cap - 1)
            break;
    }
    out[len] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (killed)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(worker_binary_refuses_gpu_task)
{
    const char *bin = getenv("TRAINYARD_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("SKIP: worker_binary_refuses_gpu_task (TRAINYARD_BIN not set or not executable: tests/run_all.sh sets it)\n");
        return;
    }
    const char *want = expected_refusal();
    if (!want) {
        printf("SKIP: worker_binary_refuses_gpu_task (this build has CUDA and sees a device)\n");
        return;
    }
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 1, "default", 1, 1);
    jobspec_release(&s);
    /* an API nobody answers: the worker must fail before it talks to it */
    char cfg[8192];
    snprintf(cfg, sizeof cfg,
             "{\"job\":7,\"attempt\":1,\"api\":\"http://127.0.0.1:9\",\"token\":\"ty_x\",\"spec\":%s,"
             "\"task\":{\"type\":\"worker\",\"index\":0},\"devices\":[\"gpu:0\"],"
             "\"cluster\":{\"worker\":[\"127.0.0.1:40001\"]}}",
             json);
    char out[8192];
    double t0 = mono_s();
    int rc = run_worker(bin, cfg, out, sizeof out, 30);
    printf("worker with devices [gpu:0] on this build: exit %d in %.2f s: %s", rc, mono_s() - t0, out);
    ck_assert_msg(rc == 1, "exit %d (want 1): %s", rc, out);
    ck_assert_msg(strstr(out, want) != NULL, "output lacks '%s': %s", want, out);
    ck_assert_msg(strstr(out, "first training step") == NULL, "it trained: %s", out);
}
END_TEST

/* ------------------------------------------------------------ on a GPU */

typedef struct stopper {
    long stop_at;
    volatile sig_atomic_t flag;
} stopper;

static void on_step_stop(void *ctx, const train_step_info *si)
{
    stopper *st = ctx;
    if (st->stop_at && si->step == st->stop_at)
        st->flag = 1;
}

/* Trains spec with o; returns the model (caller frees) and the result. */
static model *train(const jobspec *s, const dataset_splits *d, train_options *o, const train_hooks *h,
                    train_result *res)
{
    model *m = NULL;
    char err[ERR_MAX];
    ck_assert_msg(train_run_data(s, d, o, h, res, &m, err) == 0, "train (gpus %d): %s", o->gpus, err);
    ck_assert_ptr_nonnull(m);
    return m;
}

START_TEST(gpu_default_vs_cpu)
{
    if (!have_gpus(1, "gpu_default_vs_cpu"))
        return;
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 2, "default", 1, 1);
    dataset_splits d;
    load(&s, &d);
    train_options o;
    memset(&o, 0, sizeof o);
    train_result rc, rg;
    model *mc = train(&s, &d, &o, NULL, &rc);
    o.gpus = 1;
    model *mg = train(&s, &d, &o, NULL, &rg);
    ck_assert_int_eq(rg.steps, STEPS);
    ck_assert_int_eq(model_iterations(mg), STEPS);
    double dw = rel_diff(model_params(mc), model_params(mg), model_param_count(mc));
    printf("gpu default vs cpu default, %d steps: max |w_gpu - w_cpu| / max |w_cpu| = %.3g (tol %g); loss %.6f / %.6f, "
           "val_loss %.6f / %.6f, test none\n",
           STEPS, dw, REL_TOL, rg.loss, rc.loss, rg.val_loss, rc.val_loss);
    ck_assert_msg(dw <= REL_TOL, "weights differ by %.3g", dw);
    ck_assert(rg.has_val && rc.has_val);
    ck_assert_msg(rel(rg.loss, rc.loss) <= LOSS_TOL, "loss %.6f vs %.6f", rg.loss, rc.loss);
    ck_assert_msg(rel(rg.val_loss, rc.val_loss) <= LOSS_TOL, "val_loss %.6f vs %.6f", rg.val_loss, rc.val_loss);
    ck_assert_msg(fabs(rg.val_accuracy - rc.val_accuracy) <= 2.0 / (double)d.val.n + 1e-9, "val_accuracy %.4f vs %.4f",
                  rg.val_accuracy, rc.val_accuracy);
    model_free(mc);
    model_free(mg);
    dataset_splits_free(&d);
    jobspec_release(&s);
}
END_TEST

START_TEST(gpu_stop_resume)
{
    if (!have_gpus(1, "gpu_stop_resume"))
        return;
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 2, "default", 1, 1);
    dataset_splits d;
    load(&s, &d);
    char dir[] = "/tmp/check_gpu_train-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char full[128], part[128];
    snprintf(full, sizeof full, "%s/full.safetensors", dir);
    snprintf(part, sizeof part, "%s/part.safetensors", dir);

    train_options o;
    memset(&o, 0, sizeof o);
    o.gpus = 1;
    o.checkpoint_path = full;
    train_result r1, r2, r3;
    model *m1 = train(&s, &d, &o, NULL, &r1);

    stopper st = {.stop_at = 17};
    train_hooks h;
    memset(&h, 0, sizeof h);
    h.ctx = &st;
    h.on_step = on_step_stop;
    h.stop = &st.flag;
    o.checkpoint_path = part;
    model *m2 = train(&s, &d, &o, &h, &r2);
    ck_assert(r2.stopped);
    ck_assert_int_eq(r2.steps, 17);
    model_free(m2);

    memset(&o, 0, sizeof o);
    o.gpus = 1;
    o.resume_path = part;
    model *m3 = train(&s, &d, &o, NULL, &r3);
    ck_assert_int_eq(r3.steps, STEPS);
    double dr = rel_diff(model_params(m1), model_params(m3), model_param_count(m1));
    printf("gpu stop at 17 + resume vs uninterrupted: %.3g (tol %g); loss %.9g / %.9g\n", dr, RESUME_TOL, r3.loss,
           r1.loss);
    ck_assert_msg(dr <= RESUME_TOL, "resumed weights differ by %.3g", dr);

    /* the GPU's checkpoint is a CPU checkpoint */
    model *c = NULL;
    char err[ERR_MAX];
    ck_assert_int_eq(model_build(&c, &s, BATCH, 1, err), 0);
    ckpt_meta meta;
    ck_assert_msg(checkpoint_load(full, c, &meta, err) == 0, "%s", err);
    ck_assert_int_eq(meta.step, STEPS);
    ck_assert_int_eq(model_iterations(c), STEPS);
    ck_assert(!memcmp(model_params(c), model_params(m1), model_param_count(c) * sizeof(float)));
    model_free(c);
    model_free(m1);
    model_free(m3);
    unlink(full);
    unlink(part);
    rmdir(dir);
    dataset_splits_free(&d);
    jobspec_release(&s);
}
END_TEST

/* The CNN on 1 GPU against the CPU engine, then stopped at 17 and resumed
 * from its checkpoint (the moving statistics travel in it). */
START_TEST(gpu_cnn_vs_cpu_and_resume)
{
    if (!have_gpus(1, "gpu_cnn_vs_cpu_and_resume"))
        return;
    jobspec s;
    char json[4096];
    make_cnn_spec(&s, json, sizeof json);
    dataset_splits d;
    load(&s, &d);
    char dir[] = "/tmp/check_gpu_train-cnn-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char full[128], part[128];
    snprintf(full, sizeof full, "%s/full.safetensors", dir);
    snprintf(part, sizeof part, "%s/part.safetensors", dir);
    train_options o;
    memset(&o, 0, sizeof o);
    train_result rc, rg, r2, r3;
    model *mc = train(&s, &d, &o, NULL, &rc);
    o.gpus = 1;
    o.checkpoint_path = full;
    model *mg = train(&s, &d, &o, NULL, &rg);
    ck_assert_int_eq(rg.steps, STEPS);
    size_t nst = model_state_count(mc);
    ck_assert_uint_gt(nst, 0);
    double dw = rel_diff(model_params(mc), model_params(mg), model_param_count(mc));
    double ds = rel_diff(model_state(mc), model_state(mg), nst);
    printf("gpu cnn vs cpu, %d steps: weights %.3g, moving statistics %.3g (tol %g); loss %.6f / %.6f, "
           "val_loss %.6f / %.6f\n",
           STEPS, dw, ds, REL_TOL, rg.loss, rc.loss, rg.val_loss, rc.val_loss);
    ck_assert_msg(dw <= REL_TOL, "weights differ by %.3g", dw);
    ck_assert_msg(ds <= REL_TOL, "moving statistics differ by %.3g", ds);
    ck_assert_msg(rel(rg.loss, rc.loss) <= LOSS_TOL, "loss %.6f vs %.6f", rg.loss, rc.loss);
    ck_assert_msg(rel(rg.val_loss, rc.val_loss) <= LOSS_TOL, "val_loss %.6f vs %.6f", rg.val_loss, rc.val_loss);

    stopper st = {.stop_at = 17};
    train_hooks h;
    memset(&h, 0, sizeof h);
    h.ctx = &st;
    h.on_step = on_step_stop;
    h.stop = &st.flag;
    o.checkpoint_path = part;
    model *m2 = train(&s, &d, &o, &h, &r2);
    ck_assert(r2.stopped);
    model_free(m2);
    memset(&o, 0, sizeof o);
    o.gpus = 1;
    o.resume_path = part;
    model *m3 = train(&s, &d, &o, NULL, &r3);
    ck_assert_int_eq(r3.steps, STEPS);
    double dr = rel_diff(model_params(mg), model_params(m3), model_param_count(mg));
    double drs = rel_diff(model_state(mg), model_state(m3), nst);
    printf("gpu cnn stop at 17 + resume vs uninterrupted: weights %.3g, moving statistics %.3g (tol %g)\n", dr, drs,
           RESUME_TOL);
    ck_assert_msg(dr <= RESUME_TOL, "resumed weights differ by %.3g", dr);
    ck_assert_msg(drs <= RESUME_TOL, "resumed moving statistics differ by %.3g", drs);

    /* the GPU's checkpoint, moving statistics included, is a CPU checkpoint */
    model *c = NULL;
    char err[ERR_MAX];
    ckpt_meta meta;
    ck_assert_int_eq(model_build(&c, &s, BATCH, 1, err), 0);
    ck_assert_msg(checkpoint_load(full, c, &meta, err) == 0, "%s", err);
    ck_assert(!memcmp(model_params(c), model_params(mg), model_param_count(c) * sizeof(float)));
    ck_assert(!memcmp(model_state(c), model_state(mg), nst * sizeof(float)));
    model_free(c);
    model_free(mc);
    model_free(mg);
    model_free(m3);
    unlink(full);
    unlink(part);
    rmdir(dir);
    dataset_splits_free(&d);
    jobspec_release(&s);
}
END_TEST

START_TEST(gpu_errors)
{
    if (!have_gpus(1, "gpu_errors"))
        return;
    char why[ERR_MAX], err[ERR_MAX];
    int n = gpu_count(why);
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 1, "default", 1, 1);
    ck_assert_int_eq(engine_gpu_check(&s, n + 1, 1, err), -1);
    ck_assert_msg(strstr(err, "visible") != NULL, "%s", err);
    ck_assert_int_eq(engine_gpu_check(&s, 1, 1, err), 0);
    jobspec_release(&s);
    make_spec(&s, json, sizeof json, 1, "mirrored", 1, 2);
    ck_assert_int_eq(engine_gpu_check(&s, 1, 1, err), -1);
    ck_assert_msg(strstr(err, "devices per worker") != NULL, "%s", err);
    jobspec_release(&s);
    make_spec(&s, json, sizeof json, 1, "parameter_server", 2, 1);
    ck_assert_int_eq(engine_gpu_check(&s, 1, 2, err), -1);
    ck_assert_msg(strstr(err, "parameter_server") != NULL, "%s", err);
    jobspec_release(&s);
}
END_TEST

START_TEST(gpu_mirrored_2_vs_cpu)
{
    if (!have_gpus(2, "gpu_mirrored_2_vs_cpu"))
        return;
    jobspec s, s1;
    char json[4096];
    make_spec(&s1, json, sizeof json, 2, "default", 1, 1);
    make_spec(&s, json, sizeof json, 2, "mirrored", 1, 2);
    dataset_splits d;
    load(&s, &d);
    train_options o;
    memset(&o, 0, sizeof o);
    train_result rc, rg;
    model *mc = train(&s1, &d, &o, NULL, &rc);
    o.gpus = 2;
    o.replicas = 2;
    model *mg = train(&s, &d, &o, NULL, &rg);
    double dw = rel_diff(model_params(mc), model_params(mg), model_param_count(mc));
    printf("gpu mirrored x2 (NCCL) vs cpu default: %.3g (tol %g); loss %.6f / %.6f\n", dw, REL_TOL, rg.loss, rc.loss);
    ck_assert_msg(dw <= REL_TOL, "weights differ by %.3g", dw);
    ck_assert_msg(rel(rg.loss, rc.loss) <= LOSS_TOL, "loss %.6f vs %.6f", rg.loss, rc.loss);
    model_free(mc);
    model_free(mg);
    dataset_splits_free(&d);
    jobspec_release(&s);
    jobspec_release(&s1);
}
END_TEST

/* One worker process of the 2-GPU multi-worker case: its own device (CUDA
 * is first touched here, after the fork), the CPU communicator, rank 0's
 * NCCL id broadcast over it; "ok" + rank 0's parameters on fd. */
static void mw_child(int rank, const comm_peer *peers, int listen_fd, int fd)
{
    char dev[16], line[512];
    snprintf(dev, sizeof dev, "%d", rank);
    setenv("CUDA_VISIBLE_DEVICES", dev, 1);
    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 2, "multi_worker_mirrored", 2, 1);
    dataset_splits d;
    load(&s, &d);
    comm *c = NULL;
    char cerr[ERR_MAX], gerr[ERR_MAX], id[GPU_NCCL_ID_HEX] = "";
    comm_options co = {.timeout_ms = 60000, .transport = COMM_TRANSPORT_AUTO, .session = "check-gpu-train"};
    if (comm_init(&c, rank, 2, peers, listen_fd, &co, cerr)) {
        snprintf(line, sizeof line, "err comm: %s\n", cerr);
        goto out;
    }
    if (rank == 0 && gpu_nccl_unique_id(id, gerr)) {
        snprintf(line, sizeof line, "err nccl id: %s\n", gerr);
        goto out;
    }
    if (comm_broadcast(c, id, sizeof id, 0)) {
        snprintf(line, sizeof line, "err id broadcast: %s\n", comm_error(c));
        goto out;
    }
    train_options o;
    memset(&o, 0, sizeof o);
    o.worker = rank;
    o.workers = 2;
    o.replicas = 1;
    o.comm = c;
    o.gpus = 1;
    o.nccl_id = id;
    train_result res;
    model *m = NULL;
    char err[ERR_MAX];
    if (train_run_data(&s, &d, &o, NULL, &res, &m, err)) {
        snprintf(line, sizeof line, "err %s\n", err);
        goto out;
    }
    snprintf(line, sizeof line, "ok %ld %.9g\n", res.steps, res.loss);
    if (write(fd, line, strlen(line)) < 0)
        _exit(3);
    if (rank == 0 && write(fd, model_params(m), model_param_count(m) * sizeof(float)) < 0)
        _exit(3);
    model_free(m);
    comm_free(c);
    _exit(0);
out:
    if (write(fd, line, strlen(line)) < 0)
        _exit(3);
    comm_free(c);
    _exit(1);
}

START_TEST(gpu_multi_worker_2_vs_cpu)
{
    /* count the devices in a child: CUDA must not be touched before the fork */
    fflush(NULL);
    pid_t probe = fork();
    ck_assert_int_ge(probe, 0);
    if (probe == 0) {
        char why[ERR_MAX];
        int n = gpu_count(why);
        if (n < 2)
            printf("SKIP: gpu_multi_worker_2_vs_cpu (%d CUDA device(s), 2 needed%s%s)\n", n, why[0] ? ": " : "", why);
        fflush(NULL);
        _exit(n >= 2 ? 0 : 1);
    }
    int pst = 0;
    waitpid(probe, &pst, 0);
    if (!WIFEXITED(pst) || WEXITSTATUS(pst) != 0)
        return;

    comm_peer peers[2];
    int fds[2];
    char hid[COMM_HOST_ID_MAX];
    ck_assert_int_eq(comm_host_id(hid), 0);
    for (int i = 0; i < 2; i++) {
        char err[ERR_MAX];
        int port = 0;
        fds[i] = comm_listen("127.0.0.1", 0, &port, err);
        ck_assert_msg(fds[i] >= 0, "%s", err);
        memset(&peers[i], 0, sizeof peers[i]);
        snprintf(peers[i].addr, sizeof peers[i].addr, "127.0.0.1");
        peers[i].port = port;
        snprintf(peers[i].host_id, sizeof peers[i].host_id, "%s", hid);
    }
    FILE *outs[2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        int pfd[2];
        ck_assert_int_eq(pipe(pfd), 0);
        fflush(NULL);
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            close(pfd[0]);
            close(fds[1 - i]);
            mw_child(i, peers, fds[i], pfd[1]);
        }
        close(pfd[1]);
        outs[i] = fdopen(pfd[0], "r");
        ck_assert_ptr_nonnull(outs[i]);
    }
    close(fds[0]);
    close(fds[1]);
    char line[2][512];
    float *pg = NULL;
    size_t np = 0;
    for (int i = 0; i < 2; i++) {
        if (!fgets(line[i], sizeof line[i], outs[i]))
            snprintf(line[i], sizeof line[i], "(no result: the process died)");
        line[i][strcspn(line[i], "\n")] = 0;
        if (i == 0 && strncmp(line[0], "ok", 2) == 0) {
            /* the CPU reference, for its size and weights (this process has not touched CUDA) */
            jobspec s;
            char json[4096];
            make_spec(&s, json, sizeof json, 2, "default", 1, 1);
            model *m = NULL;
            char err[ERR_MAX];
            ck_assert_int_eq(model_build(&m, &s, BATCH, 1, err), 0);
            np = model_param_count(m);
            model_free(m);
            jobspec_release(&s);
            pg = xmalloc(np * sizeof(float));
            if (fread(pg, sizeof(float), np, outs[0]) != np) {
                free(pg);
                pg = NULL;
            }
        }
        fclose(outs[i]);
    }
    for (int i = 0; i < 2; i++)
        waitpid(pids[i], NULL, 0);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(strncmp(line[i], "ok 30 ", 6) == 0, "worker %d: %s", i, line[i]);
    ck_assert_ptr_nonnull(pg);

    jobspec s;
    char json[4096];
    make_spec(&s, json, sizeof json, 2, "default", 1, 1);
    dataset_splits d;
    load(&s, &d);
    train_options o;
    memset(&o, 0, sizeof o);
    train_result rc;
    model *mc = train(&s, &d, &o, NULL, &rc);
    double dw = rel_diff(model_params(mc), pg, np);
    printf("gpu multi_worker_mirrored 2 workers x 1 GPU (NCCL) vs cpu default: %.3g (tol %g)\n", dw, REL_TOL);
    ck_assert_msg(dw <= REL_TOL, "weights differ by %.3g", dw);
    free(pg);
    model_free(mc);
    dataset_splits_free(&d);
    jobspec_release(&s);
}
END_TEST

int main(void)
{
    log_set_level((log_level)(LOG_ERROR + 1));
    Suite *su = suite_create("gpu_train");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gpu_task_refused_without_cuda);
    tcase_add_test(tc, worker_binary_refuses_gpu_task);
    tcase_add_test(tc, gpu_default_vs_cpu);
    tcase_add_test(tc, gpu_stop_resume);
    tcase_add_test(tc, gpu_cnn_vs_cpu_and_resume);
    tcase_add_test(tc, gpu_errors);
    tcase_add_test(tc, gpu_mirrored_2_vs_cpu);
    tcase_add_test(tc, gpu_multi_worker_2_vs_cpu);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
