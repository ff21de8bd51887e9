/* scaling.c - the engine side of bench/scaling: the seed MLP (784-256 relu
 * dropout 0.4 - 128 relu dropout 0.3 - 10 softmax, RMSprop 0.001) on
 * Fashion-MNIST, global batch 128, as 2 worker processes x 1 thread:
 *   sync:   multi_worker_mirrored, joined by executor/comm (shared memory),
 *           each worker computing 64 rows of every global batch, gradients
 *           all-reduced every step (what a 2-worker job runs);
 *   unsync: the same 2 processes each training alone on batches of 64 (no
 *           communication: the upper bound 2 cores can give).
 * Throughput = the two workers' training examples / their training time
 * (data loading and evaluation excluded), summed.
 *
 * usage: scaling sync|unsync EPOCHS [DATA_DIR]; prints one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/util.h"
#include "../../executor/comm/comm.h"
#include "../../executor/train_loop.h"

static const char *SPEC =
    "{\"name\": \"scaling\", \"model\": {\"layers\": ["
    " {\"type\": \"dense\", \"units\": 256, \"activation\": \"relu\", \"input_shape\": [784]},"
    " {\"type\": \"dropout\", \"rate\": 0.4},"
    " {\"type\": \"dense\", \"units\": 128, \"activation\": \"relu\"},"
    " {\"type\": \"dropout\", \"rate\": 0.3},"
    " {\"type\": \"dense\", \"units\": 10, \"activation\": \"softmax\"}]},"
    " \"compile\": {\"optimizer\": {\"type\": \"rmsprop\", \"learning_rate\": 0.001},"
    "  \"loss\": \"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]},"
    " \"data\": {\"source\": \"fashion-mnist\", \"path\": \"%s\", \"validation_split\": 0.0,"
    "  \"shuffle_buffer\": 60000, \"seed\": 7},"
    " \"fit\": {\"epochs\": %d, \"batch_size\": %d},"
    " \"strategy\": {\"type\": \"%s\"},"
    " \"resources\": {\"workers\": %d, \"devices_per_worker\": 1, \"device\": \"cpu\"}}";

/* One worker: trains and writes "samples_per_sec seconds" to fd. */
static int worker(int sync, int rank, int epochs, const char *dir, const comm_peer *peers, int fd_listen,
                  int out)
{
    char json[4096];
    snprintf(json, sizeof json, SPEC, dir, epochs, sync ? 128 : 64,
             sync ? "multi_worker_mirrored" : "default", sync ? 2 : 1);
    jobspec s;
    spec_error se;
    if (jobspec_parse(json, strlen(json), &s, &se)) {
        fprintf(stderr, "spec: %s: %s\n", se.field, se.message);
        return 1;
    }
    dataset_splits data;
    char err[ERR_MAX];
    if (dataset_load(&s.data, &data, err)) {
        fprintf(stderr, "data: %s\n", err);
        return 1;
    }
    comm *c = NULL;
    if (sync) {
        char cerr[ERR_MAX];
        comm_options co = {.timeout_ms = 30000, .transport = COMM_TRANSPORT_AUTO, .session = "bench-scaling"};
        if (comm_init(&c, rank, 2, peers, fd_listen, &co, cerr)) {
            fprintf(stderr, "comm: %s\n", cerr);
            return 1;
        }
    } else if (fd_listen >= 0) {
        close(fd_listen);
    }
    train_options o;
    memset(&o, 0, sizeof o);
    o.worker = sync ? rank : 0;
    o.workers = sync ? 2 : 1;
    o.comm = c;
    o.no_eval = 1;
    o.has_seed = 1;
    o.seed = 1;
    train_result res;
    if (train_run_data(&s, &data, &o, NULL, &res, NULL, err)) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    char line[128];
    snprintf(line, sizeof line, "%.3f %.6f\n", res.samples_per_sec, res.train_seconds);
    int ok = write(out, line, strlen(line)) == (ssize_t)strlen(line);
    comm_free(c);
    dataset_splits_free(&data);
    jobspec_release(&s);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "sync") && strcmp(argv[1], "unsync"))) {
        fprintf(stderr, "usage: scaling sync|unsync EPOCHS [DATA_DIR]\n");
        return 2;
    }
    int sync = strcmp(argv[1], "sync") == 0;
    int epochs = atoi(argv[2]);
    const char *dir = argc > 3 ? argv[3] : "/usr/share/datasets/fashion-mnist";
    comm_peer peers[2];
    int fds[2];
    char hid[COMM_HOST_ID_MAX], err[ERR_MAX];
    if (comm_host_id(hid)) {
        fprintf(stderr, "no host id\n");
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        int port = 0;
        fds[i] = comm_listen("127.0.0.1", 0, &port, err);
        if (fds[i] < 0) {
            fprintf(stderr, "listen: %s\n", err);
            return 1;
        }
        memset(&peers[i], 0, sizeof peers[i]);
        snprintf(peers[i].addr, sizeof peers[i].addr, "127.0.0.1");
        peers[i].port = port;
        snprintf(peers[i].host_id, sizeof peers[i].host_id, "%s", hid);
    }
    int pipes[2][2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        if (pipe(pipes[i])) return 1;
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] < 0) return 1;
        if (pids[i] == 0) {
            close(pipes[i][0]);
            close(fds[1 - i]);
            _exit(worker(sync, i, epochs, dir, peers, fds[i], pipes[i][1]));
        }
        close(pipes[i][1]);
    }
    close(fds[0]);
    close(fds[1]);
    double sps[2] = {0, 0}, secs[2] = {0, 0};
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        FILE *f = fdopen(pipes[i][0], "r");
        if (!f || fscanf(f, "%lf %lf", &sps[i], &secs[i]) != 2)
            ok = 0;
        if (f)
            fclose(f);
        int st;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            ok = 0;
    }
    if (!ok) {
        fprintf(stderr, "a worker failed\n");
        return 1;
    }
    printf("{\"mode\": \"%s\", \"workers\": 2, \"batch_per_worker\": %d, \"samples_per_sec\": %.0f, "
           "\"worker_seconds\": [%.3f, %.3f]}\n",
           argv[1], 64, sps[0] + sps[1], secs[0], secs[1]);
    return 0;
}
