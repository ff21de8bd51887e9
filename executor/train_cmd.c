/* train_cmd.c - `trainyard train` (see train_cmd.h): argument parsing, the
 * spec, SIGTERM/SIGINT -> checkpoint and stop, progress lines and the final
 * JSON line. The training itself is train_loop.c. */
#include "train_cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../spec/jobspec.h"
#include "../common/util.h"
#include "train_loop.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: trainyard train SPEC.json [--epochs N] [--threads T] [--checkpoint PATH]\n"
            "                       [--resume PATH] [--data-path DIR] [--limit N]\n\n"
            "Trains the job spec's model on this machine, without a server.\n"
            "  --epochs N        override fit.epochs\n"
            "  --threads T       BLAS threads (default 1)\n"
            "  --checkpoint PATH write a safetensors checkpoint there (every\n"
            "                    checkpoint.every_epochs, at the end, and on SIGTERM/SIGINT)\n"
            "  --resume PATH     continue from a checkpoint\n"
            "  --data-path DIR   override data.path\n"
            "  --limit N         use at most N examples (data.limit)\n"
            "Prints one line per epoch, then one JSON line with the final metrics.\n");
}

static void print_epoch(void *ctx, const train_epoch_metrics *e)
{
    (void)ctx;
    printf("epoch %d/%d - %.2fs - loss: %.4f - accuracy: %.4f", e->epoch, e->epochs, e->seconds,
           e->loss, e->accuracy);
    if (e->has_val)
        printf(" - val_loss: %.4f - val_accuracy: %.4f", e->val_loss, e->val_accuracy);
    printf(" - %.0f samples/s\n", e->samples_per_sec);
    fflush(stdout);
}

static void print_ckpt(void *ctx, const char *path, const ckpt_meta *meta)
{
    (void)ctx;
    fprintf(stderr, "checkpoint: %s (epoch %ld, step %ld)\n", path, meta->epoch, meta->step);
}

static int num_opt(const char *name, const char *s, long lo, long hi, long *out)
{
    if (parse_long(s, lo, hi, out)) {
        fprintf(stderr, "trainyard train: %s wants a number in [%ld, %ld], got '%s'\n", name, lo, hi, s);
        return -1;
    }
    return 0;
}

static void add_num_or_null(cJSON *o, const char *k, int has, double v)
{
    if (has)
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

int cmd_train(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"epochs", required_argument, NULL, 'e'},  {"threads", required_argument, NULL, 't'},
        {"checkpoint", required_argument, NULL, 'c'}, {"resume", required_argument, NULL, 'r'},
        {"data-path", required_argument, NULL, 'd'}, {"limit", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    train_options opt;
    memset(&opt, 0, sizeof opt);
    long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'e':
            if (num_opt("--epochs", optarg, 1, 1000000, &v))
                return 2;
            opt.epochs = (int)v;
            break;
        case 't':
            if (num_opt("--threads", optarg, 1, 1024, &v))
                return 2;
            opt.threads = (int)v;
            break;
        case 'c':
            opt.checkpoint_path = optarg;
            break;
        case 'r':
            opt.resume_path = optarg;
            break;
        case 'd':
            opt.data_path = optarg;
            break;
        case 'l':
            if (num_opt("--limit", optarg, 1, (long)(~0UL >> 1), &v))
                return 2;
            opt.limit = v;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "trainyard train: %s\n", optind >= argc ? "no SPEC.json given" : "more than one spec given");
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    size_t len;
    char *text = file_read_all(path, (size_t)JOBSPEC_MAX_BYTES + 1, &len);
    if (!text) {
        fprintf(stderr, "trainyard train: cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    jobspec spec;
    spec_error se;
    if (jobspec_parse(text, len, &spec, &se)) {
        fprintf(stderr, "trainyard train: %s: %s%s%s\n", path, se.field[0] ? se.field : "",
                se.field[0] ? ": " : "", se.message);
        free(text);
        return 1;
    }
    sha256_hex(text, len, opt.spec_hash);
    free(text);
    if (spec.kind != JOB_KIND_TRAIN) {
        fprintf(stderr, "trainyard train: %s is a command job; only model/compile/data/fit specs train here\n", path);
        jobspec_release(&spec);
        return 1;
    }

    struct sigaction sa, old_term, old_int;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    stop_flag = 0;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);

    train_hooks hooks = {.on_epoch = print_epoch, .on_checkpoint = print_ckpt, .stop = &stop_flag};
    train_result r;
    char err[ERR_MAX];
    int rc = train_run(&spec, &opt, &hooks, &r, err);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    jobspec_release(&spec);
    if (rc) {
        fprintf(stderr, "trainyard train: %s\n", err);
        return 1;
    }
    if (r.stopped)
        fprintf(stderr, "trainyard train: stopped by a signal after step %ld%s\n", r.steps,
                opt.checkpoint_path ? " (checkpoint written)" : "");
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        fprintf(stderr, "trainyard train: out of memory\n");
        return 1;
    }
    cJSON_AddNumberToObject(o, "epochs", r.epochs_done);
    cJSON_AddNumberToObject(o, "steps", (double)r.steps);
    add_num_or_null(o, "loss", r.epochs_done > 0, r.loss);
    add_num_or_null(o, "accuracy", r.epochs_done > 0, r.accuracy);
    add_num_or_null(o, "val_loss", r.has_val, r.val_loss);
    add_num_or_null(o, "val_accuracy", r.has_val, r.val_accuracy);
    add_num_or_null(o, "test_loss", r.has_test, r.test_loss);
    add_num_or_null(o, "test_accuracy", r.has_test, r.test_accuracy);
    cJSON_AddNumberToObject(o, "samples_per_sec", r.samples_per_sec);
    cJSON_AddBoolToObject(o, "stopped", r.stopped);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!line) {
        fprintf(stderr, "trainyard train: out of memory\n");
        return 1;
    }
    printf("%s\n", line);
    fflush(stdout);
    free(line);
    return r.stopped ? 1 : 0;
}
