/* check_elastic.c - elastic gangs: a job whose resources.workers is a range
 * {"min", "max"}.
 *
 * core: the pure pass (scheduler/core.c) starts such a job with the most
 *   workers that fit, grows it into devices nobody waits for, shrinks it
 *   towards min (instead of preempting it whole) for a job of higher
 *   priority, and places a resized job at its target.
 * e2e: `trainyard up` with two CPU slots; an elastic multi_worker_mirrored
 *   job resized 1 -> 2 -> 1 workers by a blocker leaving and an urgent job
 *   arriving ends with the weights of a fixed 2-worker run of the same spec
 *   (to 1e-5 relative, with dropout and L2), using no restart budget; an
 *   elastic command job sees its size and accumulation in its environment.
 * See docs/scheduler.md ("Elastic jobs") and docs/strategies.md. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../client/client.h"
#include "../common/util.h"
#include "../scheduler/core.h"
#include "testlib.h"

/* ================================================================ core */

#define NN 4
#define ND 8

typedef struct eworld {
    sched_snapshot s;
    sched_node nodes[NN];
    sched_device dev[NN][SCHED_KINDS][ND];
    int ports[NN][8];
    sched_team team;
    sched_running run[8];
    sched_job q[8];
    sched_config cfg;
} eworld;

static eworld *eworld_new(int nodes, int cpus)
{
    eworld *w = xcalloc(1, sizeof *w);
    sched_config_default(&w->cfg);
    w->s.now_ms = 1000000000;
    w->team = (sched_team){1, 1.0, 0, -1, 0, 0, 0};
    w->s.teams = &w->team; w->s.n_teams = 1;
    w->s.nodes = w->nodes; w->s.running = w->run; w->s.queued = w->q;
    for (int i = 0; i < nodes; i++) {
        sched_node *n = &w->nodes[i];
        n->id = 10 + i; n->ready = 1;
        n->n_dev[SCHED_CPU] = cpus;
        n->dev[SCHED_CPU] = w->dev[i][SCHED_CPU];
        n->dev[SCHED_GPU] = w->dev[i][SCHED_GPU];
        n->ports = w->ports[i];
        for (int d = 0; d < cpus; d++) w->dev[i][SCHED_CPU][d] = (sched_device){i * 100 + d + 1, 0};
    }
    w->s.n_nodes = w->s.n_nodes_registered = nodes;
    return w;
}

/* A running job holding `workers` CPU slots on node 0 (the first free);
 * elastic when lo < hi. */
static int run_job(eworld *w, int64_t id, int prio, int workers, int lo, int hi, int may_grow)
{
    int r = w->s.n_running++;
    sched_running *v = &w->run[r];
    memset(v, 0, sizeof *v);
    v->id = id; v->team = 0; v->priority = prio; v->preemptible = 1;
    v->devices = workers; v->started_at_ms = w->s.now_ms - 60000; v->end_ms = w->s.now_ms + 3600000;
    if (lo < hi) {
        v->workers_now = workers; v->workers_min = lo; v->workers_max = hi;
        v->devices_per_worker = 1; v->kind = SCHED_CPU; v->may_grow = may_grow;
    }
    for (int d = 0, got = 0; d < w->nodes[0].n_dev[SCHED_CPU] && got < workers; d++)
        if (w->dev[0][SCHED_CPU][d].job_id == 0) { w->dev[0][SCHED_CPU][d].job_id = id; got++; }
    return r;
}

static int queue_job(eworld *w, int64_t id, int prio, int lo, int hi, int resize_to)
{
    int q = w->s.n_queued++;
    sched_job *j = &w->q[q];
    memset(j, 0, sizeof *j);
    j->id = id; j->team = 0; j->priority = prio; j->workers = hi; j->devices_per_worker = 1;
    j->kind = SCHED_CPU; j->queued_at_ms = w->s.now_ms - 1000; j->max_runtime_s = 3600;
    j->workers_min = lo < hi ? lo : 0;
    j->resize_to = resize_to;
    return q;
}

START_TEST(starts_with_the_most_that_fit)
{
    eworld *w = eworld_new(1, 4);
    run_job(w, 1, 50, 1, 1, 1, 0);                /* a fixed job holds 1 of 4 slots */
    int q = queue_job(w, 2, 50, 1, 8, 0);         /* elastic 1-8: 3 fit */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.out[q].place, 0);
    ck_assert_int_eq(r.place[0].workers, 3);
    ck_assert_int_eq(r.place[0].n_tasks, 3);
    /* none fits: it waits with the reason of its min, and reserves for min */
    sched_result_release(&r);
    run_job(w, 3, 50, 3, 3, 3, 0);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    char why[SCHED_REASON_MAX];
    sched_reason_format(&r.out[q], why, sizeof why);
    ck_assert_msg(strstr(why, "needs 1 cpu on one node") != NULL, "reason: %s", why);
    ck_assert_int_eq(r.head_job, 2);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(resize_target_caps_the_placement)
{
    eworld *w = eworld_new(1, 4);
    int q = queue_job(w, 2, 50, 1, 4, 2);         /* shrunk to 2: takes 2 though 4 are free */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.out[q].place, 0);
    ck_assert_int_eq(r.place[0].workers, 2);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(grows_into_devices_nobody_waits_for)
{
    eworld *w = eworld_new(1, 4);
    int e = run_job(w, 1, 50, 1, 1, 3, 1);        /* elastic 1-3 running 1; 3 slots free */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_grows, 1);
    ck_assert_int_eq(r.grows[0].running, e);
    ck_assert_int_eq(r.grows[0].from, 1);
    ck_assert_int_eq(r.grows[0].to, 3);           /* its max, not the 4 free */
    sched_result_release(&r);

    /* not within the resize interval */
    w->run[e].may_grow = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_grows, 0);
    sched_result_release(&r);

    /* a queued job that waits for CPU slots keeps them from growing jobs */
    w->run[e].may_grow = 1;
    run_job(w, 2, 50, 2, 2, 2, 0);                /* 1 slot left */
    int q = queue_job(w, 3, 50, 2, 2, 0);         /* needs 2: waits */
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_lt(r.out[q].place, 0);
    ck_assert_int_eq(r.n_grows, 0);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(shrinks_instead_of_preempting)
{
    eworld *w = eworld_new(1, 2);
    run_job(w, 1, 10, 2, 1, 2, 1);                /* elastic 1-2 holds both slots */
    int q = queue_job(w, 2, 90, 1, 1, 0);         /* priority 90 needs one */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 1);
    ck_assert_int_eq(r.stops[0].shrink_to, 1);    /* comes back with 1, not whole */
    ck_assert_int_eq(r.n_grows, 0);
    char why[SCHED_REASON_MAX];
    sched_reason_format(&r.out[q], why, sizeof why);
    ck_assert_msg(strstr(why, "waiting for 1 preempted job") != NULL, "reason: %s", why);
    sched_result_release(&r);

    free(w);

    /* at its min it cannot shrink: stopped whole (shrink_to 0) */
    w = eworld_new(1, 2);
    run_job(w, 1, 10, 1, 1, 2, 1);                /* elastic 1-2 running its min, 1 slot */
    run_job(w, 2, 20, 1, 1, 1, 0);                /* a fixed job on the other */
    queue_job(w, 3, 90, 2, 2, 0);                 /* priority 90 needs both */
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 2);
    for (int x = 0; x < 2; x++) ck_assert_int_eq(r.stops[x].shrink_to, 0);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(lends_its_growth_to_an_equal_priority)
{
    /* an elastic job that grew to all 4 slots gives back what a queued job of
     * the same priority needs: it shrinks (never stops whole), and without
     * preemption rights on it (preemptible false) */
    eworld *w = eworld_new(1, 4);
    run_job(w, 1, 50, 4, 1, 4, 1);
    w->run[0].preemptible = 0;
    int q = queue_job(w, 2, 50, 2, 2, 0);         /* needs 2 */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].lend, 1);
    ck_assert_int_eq(r.stops[0].shrink_to, 2);    /* 4 slots: 2 for the head, 2 kept */
    ck_assert_int_lt(r.out[q].place, 0);
    sched_result_release(&r);
    /* a job of lower priority gets nothing lent */
    w->q[q].priority = 40;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 0);
    sched_result_release(&r); free(w);
}
END_TEST

/* ================================================================ e2e */

static ty_proc srv;
static char tok[128];

static void up_start(void)
{
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "elastic");
    const char *extra[] = {"--cpu-slots", "2", "--resize-interval", "1", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", tok, sizeof tok);
}

static void up_stop(void)
{
    ty_kill(&srv, SIGTERM);
    if (getenv("E2E_KEEP")) fprintf(stderr, "elastic: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

static const char *job_state(int64_t id, char *out, size_t cap)
{
    cJSON *o = ty_job_get(srv.url, tok, id);
    snprintf(out, cap, "%s", ty_str(o, "state"));
    cJSON_Delete(o);
    return out;
}

static int terminal(const char *s)
{
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

static void wait_done(int64_t id, int timeout_s, const char *want)
{
    char st[32] = "";
    for (int i = 0; i < timeout_s * 10 && !terminal(job_state(id, st, sizeof st)); i++) ty_sleep_ms(100);
    ck_assert_msg(strcmp(st, want) == 0, "job %lld is %s, wanted %s (see %s)", (long long)id, st, want, srv.log);
}

/* Whether the job's timeline has an event whose message holds `text`. */
static int has_event(int64_t id, const char *text)
{
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events?limit=1000", (long long)id);
    char *t = ty_http_text(srv.url, tok, path);
    int yes = t && strstr(t, text) != NULL;
    free(t);
    return yes;
}

static void wait_event(int64_t id, const char *text, int timeout_s)
{
    for (int i = 0; i < timeout_s * 10; i++) {
        if (has_event(id, text)) return;
        ty_sleep_ms(100);
    }
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events?limit=1000", (long long)id);
    char *t = ty_http_text(srv.url, tok, path);
    ck_abort_msg("job %lld: no event '%s' in %d s; timeline: %.3000s", (long long)id, text, timeout_s, t);
}

/* A checkpoint's tensors as the safetensors file gives them, by name. */
typedef struct tensors {
    int n;
    char name[16][64];
    float *data[16];
    size_t count[16];
} tensors;

static void tensors_free(tensors *t)
{
    for (int i = 0; i < t->n; i++) free(t->data[i]);
    t->n = 0;
}

/* The job's newest checkpoint, downloaded and read. */
static void final_weights(int64_t id, tensors *out)
{
    memset(out, 0, sizeof *out);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &o), 200);
    cJSON *ck = NULL, *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "checkpoints"))
        if (!ck || ty_num(it, "step") > ty_num(ck, "step")) ck = it;
    ck_assert_ptr_nonnull(ck);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)id, (long long)ty_num(ck, "id"));
    cJSON_Delete(o);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_gt(r.body.len, 8);
    uint64_t hn = 0;
    memcpy(&hn, r.body.data, 8);
    ck_assert_uint_le(hn, r.body.len - 8);
    cJSON *hdr = cJSON_ParseWithLength(r.body.data + 8, (size_t)hn);
    ck_assert_ptr_nonnull(hdr);
    const char *body = r.body.data + 8 + hn;
    size_t body_len = r.body.len - 8 - (size_t)hn;
    cJSON_ArrayForEach(it, hdr) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        ck_assert_int_lt(out->n, 16);
        cJSON *offs = cJSON_GetObjectItem(it, "data_offsets");
        size_t b = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble, e = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        ck_assert_msg(b <= e && e <= body_len && (e - b) % 4 == 0, "%s: offsets %zu,%zu", it->string, b, e);
        int k = out->n++;
        snprintf(out->name[k], sizeof out->name[k], "%s", it->string);
        out->count[k] = (e - b) / 4;
        out->data[k] = xmalloc(e - b + 4);
        memcpy(out->data[k], body + b, e - b);
    }
    cJSON_Delete(hdr);
    client_reply_release(&r);
    client_release(&c);
}

/* max |a - b| / max |a| over every tensor (both hold the same set). */
static double weights_rel_diff(const tensors *a, const tensors *b)
{
    double num = 0, den = 0;
    ck_assert_int_eq(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        int j = 0;
        while (j < b->n && strcmp(a->name[i], b->name[j]) != 0) j++;
        ck_assert_msg(j < b->n, "tensor %s missing", a->name[i]);
        ck_assert_uint_eq(a->count[i], b->count[j]);
        for (size_t x = 0; x < a->count[i]; x++) {
            double d = fabs((double)a->data[i][x] - (double)b->data[j][x]);
            if (d > num) num = d;
            if (fabs(a->data[i][x]) > den) den = fabs(a->data[i][x]);
        }
    }
    return den > 0 ? num / den : num;
}

/* The seed MLP with dropout and L2, multi_worker_mirrored, `workers` given
 * as JSON (2, or {"min": 1, "max": 2}); long enough to be resized twice. */
static void mlp_spec(char *out, size_t cap, const char *name, const char *strategy, const char *workers)
{
    snprintf(out, cap,
             "{\"name\": \"%s\", \"model\": {\"layers\": ["
             "{\"type\": \"dense\", \"units\": 256, \"activation\": \"tanh\", \"input_shape\": [784],"
             " \"kernel_regularizer\": {\"l2\": 0.001}},"
             "{\"type\": \"dropout\", \"rate\": 0.3},"
             "{\"type\": \"dense\", \"units\": 10, \"activation\": \"softmax\"}]},"
             "\"compile\": {\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.01},"
             " \"loss\": \"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]},"
             "\"data\": {\"source\": \"fashion-mnist\", \"limit\": 8192, \"seed\": 5},"
             "\"fit\": {\"epochs\": 60, \"batch_size\": 64},"
             "\"strategy\": {\"type\": \"%s\"},"
             "\"resources\": {\"workers\": %s},"
             "\"checkpoint\": {\"every_epochs\": 0, \"keep\": 2},"
             "\"priority\": 40, \"preemptible\": true, \"max_restarts\": 0, \"max_runtime_s\": 600}",
             name, strategy, workers);
}

static const char *SLEEPER = "{\"name\": \"%s\", \"command\": {\"argv\": [\"/bin/sleep\", \"%d\"]},"
                             " \"resources\": {\"workers\": 1}, \"priority\": %d, \"max_runtime_s\": 300}";

START_TEST(resized_job_keeps_the_model)
{
    char spec[4096], sl[512];
    /* the reference: a fixed gang of 2 */
    mlp_spec(spec, sizeof spec, "fixed", "multi_worker_mirrored", "2");
    int64_t fixed = ty_submit(srv.url, tok, spec);
    wait_done(fixed, 300, "succeeded");
    tensors ref, got;
    final_weights(fixed, &ref);

    /* a blocker holds one slot: the elastic job starts with 1 worker */
    snprintf(sl, sizeof sl, SLEEPER, "blocker", 2, 50);
    int64_t blocker = ty_submit(srv.url, tok, sl);
    char st[32];
    for (int i = 0; i < 100 && strcmp(job_state(blocker, st, sizeof st), "running"); i++) ty_sleep_ms(100);
    mlp_spec(spec, sizeof spec, "elastic", "multi_worker_mirrored", "{\"min\": 1, \"max\": 2}");
    int64_t el = ty_submit(srv.url, tok, spec);
    wait_event(el, "placed on", 30);
    ck_assert(has_event(el, "with 1 worker (elastic 1-2)"));
    /* the blocker leaves: it grows to 2 */
    wait_event(el, "grown to 2 workers (from 1)", 60);
    ck_assert(has_event(el, "resize: growing from 1 to 2 workers"));
    /* an urgent job arrives: it shrinks to 1 rather than stopping */
    snprintf(sl, sizeof sl, SLEEPER, "urgent", 2, 90);
    int64_t urgent = ty_submit(srv.url, tok, sl);
    wait_event(el, "shrunk to 1 worker (from 2)", 60);
    ck_assert(has_event(el, "resize: shrinking to 1 worker for job"));
    wait_done(urgent, 60, "succeeded");
    wait_done(el, 300, "succeeded");

    /* the same model as the fixed run; no restart budget used (max_restarts 0) */
    final_weights(el, &got);
    ck_assert_int_ge(got.n, 4);
    double d = weights_rel_diff(&ref, &got);
    ck_assert_msg(d <= 1e-5, "elastic weights differ from the fixed run's by %g relative", d);
    cJSON *o = ty_job_get(srv.url, tok, el);
    cJSON *res = cJSON_GetObjectItem(o, "resources");
    ck_assert_int_eq((int)ty_num(res, "workers_min"), 1);
    ck_assert_int_eq((int)ty_num(res, "workers"), 2);
    ck_assert_int_ge((int)ty_num(o, "attempt"), 3);
    cJSON_Delete(o);
    tensors_free(&ref);
    tensors_free(&got);
}
END_TEST

START_TEST(elastic_command_sees_its_size)
{
    /* an elastic command job started with 1 of 1-2 workers (the other slot
     * busy) is told so: WORLD_SIZE 1, TRAINYARD_WORKERS_MAX 2, and 2
     * micro-batches per rank to keep the global batch of 2 workers */
    char sl[512];
    snprintf(sl, sizeof sl, SLEEPER, "blocker", 30, 50);
    int64_t blocker = ty_submit(srv.url, tok, sl);
    char st[32];
    for (int i = 0; i < 100 && strcmp(job_state(blocker, st, sizeof st), "running"); i++) ty_sleep_ms(100);
    const char *spec =
        "{\"name\": \"env\", \"command\": {\"argv\": [\"/bin/sh\", \"-c\","
        " \"echo size=$WORLD_SIZE max=$TRAINYARD_WORKERS_MAX accum=$TRAINYARD_ACCUMULATION; sleep 4\"]},"
        " \"strategy\": {\"type\": \"multi_worker_mirrored\"},"
        " \"resources\": {\"workers\": {\"min\": 1, \"max\": 2}}, \"max_runtime_s\": 60}";
    int64_t id = ty_submit(srv.url, tok, spec);
    /* while it runs below its max, its reason says why it does not grow */
    const char *want = "running 1 of 1-2 workers: no free cpu slots to grow into";
    int seen = 0;
    for (int i = 0; i < 100 && !seen; i++) {
        cJSON *o = ty_job_get(srv.url, tok, id);
        seen = strcmp(ty_str(o, "reason"), want) == 0;
        cJSON_Delete(o);
        if (!seen) ty_sleep_ms(100);
    }
    ck_assert_msg(seen, "the job's reason never said '%s'", want);
    wait_done(id, 60, "succeeded");
    char *logs = ty_task_log(srv.url, tok, id, "worker-0");
    ck_assert_msg(strstr(logs, "size=1 max=2 accum=2") != NULL, "logs: %.500s", logs);
    free(logs);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)blocker);
    ck_assert_int_eq(ty_http(srv.url, tok, "POST", path, NULL, NULL), 200);
}
END_TEST

START_TEST(ddp_script_resizes_and_resumes)
{
    /* a real PyTorch DDP script (examples/ddp_train.py, gloo) as an elastic
     * command job: started with 1 of 1-2 ranks (2 micro-batches a step),
     * grown to 2 when the blocker leaves (SIGTERM: a checkpoint at the step
     * boundary), resumed at world 2 from that step, to the end */
    ck_assert_msg(system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0,
                  "/usr/bin/python3 cannot import torch: install python3-torch (scripts/deps.sh does)");
    char sl[512];
    snprintf(sl, sizeof sl, SLEEPER, "blocker", 3, 50);
    int64_t blocker = ty_submit(srv.url, tok, sl);
    char st[32];
    for (int i = 0; i < 100 && strcmp(job_state(blocker, st, sizeof st), "running"); i++) ty_sleep_ms(100);
    const char *spec =
        "{\"name\": \"ddp-elastic\", \"command\": {\"argv\": [\"/usr/bin/python3\", \"examples/ddp_train.py\","
        " \"--steps\", \"3000\", \"--examples\", \"2048\"], \"env\": {\"OMP_NUM_THREADS\": \"1\"}},"
        " \"strategy\": {\"type\": \"multi_worker_mirrored\"},"
        " \"resources\": {\"workers\": {\"min\": 1, \"max\": 2}}, \"checkpoint\": {\"keep\": 2},"
        " \"max_restarts\": 0, \"max_runtime_s\": 300}";
    int64_t id = ty_submit(srv.url, tok, spec);
    wait_event(id, "with 1 worker (elastic 1-2)", 30);
    wait_event(id, "grown to 2 workers (from 1)", 90);
    wait_done(id, 240, "succeeded");
    char *l0 = ty_task_log(srv.url, tok, id, "worker-0");
    ck_assert_msg(strstr(l0, "2 micro-batch(es) per step") != NULL, "worker-0: %.2000s", l0);
    ck_assert_msg(strstr(l0, "stopped by SIGTERM at step") != NULL, "worker-0: %.2000s", l0);
    ck_assert_msg(strstr(l0, "rank 0 of 2 joined") != NULL, "worker-0: %.2000s", l0);
    ck_assert_msg(strstr(l0, "resumed from") != NULL, "worker-0: %.2000s", l0);
    ck_assert_msg(strstr(l0, "rank 0: done, 3000 steps") != NULL, "worker-0: %.2000s", l0);
    free(l0);
}
END_TEST

START_TEST(range_is_validated)
{
    const char *bad[][2] = {
        {"{\"workers\": {\"min\": 3, \"max\": 2}}", "resources.workers.max"},
        {"{\"workers\": {\"max\": 2}}", "resources.workers.min"},
        {"{\"workers\": {\"min\": 1, \"max\": 2, \"step\": 1}}", "resources.workers.step"},
        {"{\"workers\": \"2\"}", "resources.workers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"name\": \"bad\", \"command\": {\"argv\": [\"/bin/true\"]}, \"resources\": %s}", bad[i][0]);
        cJSON *o = NULL;
        long code = ty_http(srv.url, tok, "POST", "/api/v1/jobs", spec, &o);
        ck_assert_msg(code == 422 || code == 400, "%s: %ld", bad[i][0], code);
        cJSON *f = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "field");
        ck_assert_msg(cJSON_IsString(f) && strcmp(f->valuestring, bad[i][1]) == 0, "%s: field %s", bad[i][0],
                      cJSON_IsString(f) ? f->valuestring : "none");
        cJSON_Delete(o);
    }
    /* a train job may be elastic only with multi_worker_mirrored */
    char spec[4096];
    mlp_spec(spec, sizeof spec, "mirrored", "mirrored", "{\"min\": 1, \"max\": 2}");
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "POST", "/api/v1/jobs", spec, &o), 422);
    ty_assert_error(o, "invalid_value", "resources.workers");
    cJSON_Delete(o);
    /* nothing was stored */
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("elastic");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, starts_with_the_most_that_fit);
    tcase_add_test(tc, resize_target_caps_the_placement);
    tcase_add_test(tc, grows_into_devices_nobody_waits_for);
    tcase_add_test(tc, shrinks_instead_of_preempting);
    tcase_add_test(tc, lends_its_growth_to_an_equal_priority);
    suite_add_tcase(s, tc);
    TCase *te = ty_tcase(s, "e2e", up_start, up_stop, 600);
    tcase_add_test(te, range_is_validated);
    tcase_add_test(te, elastic_command_sees_its_size);
    tcase_add_test(te, resized_job_keeps_the_model);
    tcase_add_test(te, ddp_script_resizes_and_resumes);
    return ty_run_suite(s);
}
