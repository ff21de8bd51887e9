/* check_job_auth.c - the workers of a job admit only their own job: a
 * process on the node that knows the job id, its attempt, its workers'
 * address and port (GET /jobs/ID) and the collective's wire format connects
 * to worker 0 first and says worker 1's hello, again and again while the job
 * starts. Each of its connections is dropped unread, the job neither lets it
 * join nor stalls, and it trains to the very metrics of the same job run
 * without it. Against the real `trainyard up` on loopback. */
#include "testlib.h"

#include <netinet/tcp.h>
#include <poll.h>

#include "../executor/comm/comm.h"
#include "comm_forge.h"

static ty_proc srv;
static char tok[128];

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "jobauth");
    /* the workers in this network namespace: the forger's peer table is then exact */
    const char *extra[] = {"--cpu-slots", "2", "--isolation", "none", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", tok, sizeof tok);
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

static const char SPEC[] =
    "{\"name\": \"auth\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 32, \"activation\": \"relu\"},"
    " {\"type\": \"dense\", \"units\": 10, \"activation\": \"softmax\"}]},"
    " \"compile\": {\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.05}, \"loss\": "
    "\"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]},"
    " \"data\": {\"source\": \"fashion-mnist\", \"limit\": 3000, \"validation_split\": 0.1, \"seed\": 7},"
    " \"fit\": {\"epochs\": 2, \"batch_size\": 64},"
    " \"strategy\": {\"type\": \"multi_worker_mirrored\", \"communication\": \"ring\"},"
    " \"resources\": {\"workers\": 2, \"devices_per_worker\": 1, \"device\": \"cpu\"}, \"max_restarts\": 0}";

static cJSON *wait_end(int64_t id, int timeout_s) {
    cJSON *j = NULL;
    for (int i = 0; i < timeout_s * 5; i++) {
        cJSON_Delete(j);
        j = ty_job_get(srv.url, tok, id);
        const char *st = ty_str(j, "state");
        if (!strcmp(st, "succeeded") || !strcmp(st, "failed") || !strcmp(st, "cancelled")) return j;
        ty_sleep_ms(200);
    }
    ck_abort_msg("job %lld did not end in %d s", (long long)id, timeout_s);
    return j;
}

/* The last epoch metric's loss, val_loss and accuracy, as text to compare exactly. */
static void last_epoch(int64_t id, char *out, size_t n) {
    cJSON *all = ty_metrics_all(srv.url, tok, id);
    const cJSON *m, *last = NULL;
    cJSON_ArrayForEach(m, all) {
        const cJSON *k = cJSON_GetObjectItem(m, "kind");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, "epoch")) last = m;
    }
    ck_assert_ptr_nonnull(last);
    snprintf(out, n, "epoch %.0f loss %.9g val_loss %.9g accuracy %.9g", ty_num(last, "epoch"), ty_num(last, "loss"),
             ty_num(last, "val_loss"), ty_num(last, "accuracy"));
    cJSON_Delete(all);
}

START_TEST(a_stranger_neither_joins_nor_stalls) {
    /* the job alone */
    int64_t a = ty_submit(srv.url, tok, SPEC);
    cJSON *ja = wait_end(a, 240);
    ck_assert_msg(!strcmp(ty_str(ja, "state"), "succeeded"), "job alone: %s (%s)", ty_str(ja, "state"),
                  ty_str(ja, "reason"));
    cJSON_Delete(ja);
    char alone[256];
    last_epoch(a, alone, sizeof alone);

    /* the same job, with a forger on worker 0's port from the moment it listens */
    int64_t b = ty_submit(srv.url, tok, SPEC);
    char hid[COMM_HOST_ID_MAX];
    ck_assert_int_eq(comm_host_id(hid), 0);
    char addr[2][128] = {"", ""};
    int port[2] = {0, 0};
    for (int i = 0; i < 600 && !port[1]; i++) {
        cJSON *j = ty_job_get(srv.url, tok, b);
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tasks")) {
            int ix = (int)ty_num(t, "index");
            if (ix < 0 || ix > 1 || ty_num(t, "port") <= 0) continue;
            snprintf(addr[ix], sizeof addr[ix], "%s", ty_str(t, "address"));
            port[ix] = (int)ty_num(t, "port");
        }
        cJSON_Delete(j);
        if (!port[1]) ty_sleep_ms(20);
    }
    ck_assert_msg(port[0] > 0 && port[1] > 0, "job %lld's workers were never placed", (long long)b);
    char session[64];
    snprintf(session, sizeof session, "j%lld-a1", (long long)b);
    const char *addrs[2] = {addr[0], addr[1]}, *hids[2] = {hid, hid};
    forged_hello h = forge_hello(1, 1, 2, (int)COMM_TRANSPORT_AUTO, session, addrs, port, hids);
    int fds[64], nfd = 0;
    int64_t until = mono_ms() + 8000;
    while (nfd < 64 && mono_ms() < until) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port[0])};
        inet_pton(AF_INET, addr[0], &sa.sin_addr);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) { /* not listening yet */
            close(fd);
            ty_sleep_ms(2);
            continue;
        }
        ck_assert_int_eq(write(fd, &h, sizeof h), (ssize_t)sizeof h);
        fds[nfd++] = fd;
        ty_sleep_ms(50);
    }
    ck_assert_msg(nfd > 0, "the forger never reached worker 0 (%s:%d)", addr[0], port[0]);
    /* every forged connection was dropped without a word: no table for it */
    for (int i = 0; i < nfd; i++) {
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        ck_assert_msg(poll(&p, 1, 5000) == 1, "forged connection %d was kept open", i);
        char byte;
        ssize_t r = read(fds[i], &byte, 1);
        ck_assert_msg(r <= 0, "forged connection %d was answered", i);
        close(fds[i]);
    }
    cJSON *jb = wait_end(b, 240);
    ck_assert_msg(!strcmp(ty_str(jb, "state"), "succeeded"), "job with a forger: %s (%s)", ty_str(jb, "state"),
                  ty_str(jb, "reason"));
    ck_assert_int_eq((int)ty_num(jb, "attempt"), 1);
    cJSON_Delete(jb);
    char with[256];
    last_epoch(b, with, sizeof with);
    ck_assert_str_eq(with, alone);
}
END_TEST

int main(void) {
    Suite *s = suite_create("job_auth");
    TCase *tc = ty_tcase(s, "job_auth", setup, teardown, 600);
    tcase_add_test(tc, a_stranger_neither_joins_nor_stalls);
    return ty_run_suite(s);
}
