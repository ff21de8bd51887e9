/* check_usage.c - GET /api/v1/usage and `trainyard usage` against what the
 * jobs' own timelines say: two teams run short command jobs on `trainyard up
 * --cpu-slots 2`, one of them preempted by a job of higher priority and
 * cancelled after it started again; the device seconds of every job, team
 * and day equal its active intervals (placed -> requeued or ended) times its
 * devices, within a small tolerance; jobs run, ended and preempted, waits,
 * storage; CSV carries the JSON's numbers; a team token sees its own team
 * only; bad from/to/by are 422 naming the field. A server killed while a job
 * runs and started again on its data directory: the job's usage goes on
 * without a gap and without counting twice. The split of intervals at UTC
 * midnights, on hand-made intervals. */
#include "testlib.h"

#include <math.h>

#include "../storage/usage_store.h"

#include "stack_fixture.h"

static char vision_tok[128];
static void start_up2(void) { stack_up("usage"); }
static void start_server_agent(void) { stack_server_agent("usage"); }
static void stop_all(void) { stack_stop(); }

/* ---------------------------------------------------------------- helpers */

/* "2026-11-27T08:08:45.554Z" in ms. */
static int64_t iso_ms(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int ms = 0;
    ck_assert_msg(sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                         &tm.tm_sec, &ms) == 7,
                  "not a time: %s", s);
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

static const char *job_state(const char *tok, int64_t id, int *attempt) {
    static char st[32];
    cJSON *o = ty_job_get(srv.url, tok, id);
    snprintf(st, sizeof st, "%s", ty_str(o, "state"));
    if (attempt) *attempt = (int)ty_num(o, "attempt");
    cJSON_Delete(o);
    return st;
}

/* Waits for the job to be in state want (at attempt >= min_attempt). */
static void wait_for(const char *tok, int64_t id, const char *want, int min_attempt, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    const char *st = "";
    int attempt = 0;
    while (mono_ms() < end) {
        st = job_state(tok, id, &attempt);
        if (strcmp(st, want) == 0 && attempt >= min_attempt) return;
        ty_sleep_ms(100);
    }
    ck_abort_msg("job %lld is %s (attempt %d), not %s (attempt >= %d) after %d s; see %s", (long long)id, st, attempt,
                 want, min_attempt, timeout_s, srv.log);
}

static int is_active(const char *s) { return strcmp(s, "starting") == 0 || strcmp(s, "running") == 0; }

/* What the job's timeline says it held: the seconds of its active
 * intervals (placed, to requeued or ended; still active: to now) times
 * devices; its preemptions into *preempts. */
static double timeline_seconds(const char *tok, int64_t id, int devices, int *preempts) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events?limit=1000", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &o), 200);
    int64_t start = -1, held = 0;
    *preempts = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(o, "events")) {
        if (strcmp(ty_str(e, "kind"), "preempt") == 0) (*preempts)++;
        if (strcmp(ty_str(e, "kind"), "state") != 0) continue;
        const char *to = ty_str(e, "to");
        int64_t t = iso_ms(ty_str(e, "time"));
        if (strcmp(to, "starting") == 0) start = t;
        else if (!is_active(to) && start >= 0) {
            held += t - start;
            start = -1;
        }
    }
    if (start >= 0) held += now_ms() - start;
    cJSON_Delete(o);
    return (double)held * devices / 1000.0;
}

/* GET path with Accept (NULL: JSON): the status, the body into *text. */
static long get_accept(const char *tok, const char *path, const char *accept, char **text) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, tok), 0);
    if (accept) snprintf(c.accept, sizeof c.accept, "%s", accept);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    client_release(&c);
    long st = r.status;
    *text = buf_detach(&r.body, NULL);
    if (!*text) *text = xstrdup("");
    client_reply_release(&r);
    return st;
}

static cJSON *usage(const char *tok, const char *query) {
    char path[512];
    snprintf(path, sizeof path, "/api/v1/usage%s", query);
    cJSON *o = NULL;
    long st = ty_http(srv.url, tok, "GET", path, NULL, &o);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 200, "GET %s answered %ld: %s", path, st, txt);
    free(txt);
    return o;
}

/* The row of rows whose field k is v (a string), or NULL. */
static cJSON *row_where(cJSON *u, const char *k, const char *v) {
    cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(u, "rows")) if (strcmp(ty_str(r, k), v) == 0) return r;
    return NULL;
}

static cJSON *row_of_job(cJSON *u, int64_t id) {
    cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(u, "rows")) if ((int64_t)ty_num(r, "job") == id) return r;
    return NULL;
}

static double jobs_n(const cJSON *r, const char *k) { return ty_num(cJSON_GetObjectItem(r, "jobs"), k); }

static void expect_near(double got, double want, double tol, const char *what) {
    if (getenv("USAGE_DEBUG")) fprintf(stderr, "%s: usage %.3f timeline %.3f\n", what, got, want);
    ck_assert_msg(got >= want - tol && got <= want + tol, "%s: usage says %.3f s, the timeline %.3f s (tolerance %.2f)",
                  what, got, want, tol);
}

static void expect_error(const char *tok, const char *query, long status, const char *code, const char *field) {
    char path[512];
    snprintf(path, sizeof path, "/api/v1/usage%s", query);
    cJSON *o = NULL;
    long st = ty_http(srv.url, tok, "GET", path, NULL, &o);
    ck_assert_msg(st == status, "GET %s answered %ld, not %ld", path, st, status);
    ty_assert_error(o, code, field);
    cJSON_Delete(o);
}

/* The CSV's rows (after its header) against the JSON's: each numeric
 * column equals the JSON number it names, to the millisecond. */
static void csv_matches_json(const char *tok, const char *query) {
    char path[512], *csv = NULL;
    snprintf(path, sizeof path, "/api/v1/usage%s", query);
    ck_assert_int_eq(get_accept(tok, path, "text/csv", &csv), 200);
    cJSON *u = usage(tok, query);
    const char *by = ty_str(u, "by");
    int nkey = strcmp(by, "team") == 0 ? 1 : strcmp(by, "job") == 0 ? 3 : 2;
    char *save = NULL, *line = strtok_r(csv, "\r\n", &save);
    ck_assert_ptr_nonnull(line);
    char header[512];
    snprintf(header, sizeof header, "%s", line);
    ck_assert_msg(strstr(header, "gpu_seconds,cpu_slot_seconds,jobs_run,jobs_succeeded,jobs_failed,jobs_cancelled,"
                                 "jobs_preempted,wait_median_s,wait_p95_s,wait_jobs") != NULL,
                  "CSV header: %s", header);
    int i = 0;
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(u, "rows"), i++);
        ck_assert_msg(r != NULL, "the CSV has more rows than the JSON: %s", line);
        double v[16];
        int nv = 0;
        const char *p = line;
        for (int k = 0; k < nkey; k++) p = strchr(p, ',') + 1; /* names here have no commas */
        while (nv < 16) {
            v[nv++] = *p == ',' || !*p ? -1 : strtod(p, NULL);
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
        const cJSON *j = cJSON_GetObjectItem(r, "jobs"), *w = cJSON_GetObjectItem(r, "wait_s");
        double want[] = {ty_num(r, "gpu_seconds"), ty_num(r, "cpu_slot_seconds"), ty_num(j, "run"),
                         ty_num(j, "succeeded"), ty_num(j, "failed"), ty_num(j, "cancelled"), ty_num(j, "preempted"),
                         ty_num(w, "median"), ty_num(w, "p95"), ty_num(w, "jobs")};
        for (int k = 0; k < 10; k++)
            ck_assert_msg(fabs(v[k] - want[k]) < 0.0015, "CSV row %d column %d: %.3f, JSON %.3f (%s)", i, k, v[k],
                          want[k], line);
        if (strcmp(by, "team") == 0) {
            const cJSON *s = cJSON_GetObjectItem(r, "storage_bytes");
            ck_assert_int_eq(nv, 13);
            ck_assert(v[10] == ty_num(s, "logs") && v[11] == ty_num(s, "checkpoints") && v[12] == ty_num(s, "contexts"));
        } else {
            ck_assert_int_eq(nv, 10);
        }
    }
    ck_assert_int_eq(i, cJSON_GetArraySize(cJSON_GetObjectItem(u, "rows")));
    cJSON_Delete(u);
    free(csv);
}

static int64_t submit_cmd(const char *tok, const char *name, const char *extra, const char *secs) {
    char spec[512];
    snprintf(spec, sizeof spec, "{\"name\":\"%s\",%s\"command\":{\"argv\":[\"sleep\",\"%s\"]},\"max_restarts\":0}",
             name, extra, secs);
    return ty_submit(srv.url, tok, spec);
}

/* ---------------------------------------------------------------- tests */

START_TEST(split_days_at_utc_midnight) {
    int64_t day[8], ms[8];
    const int64_t D = USAGE_DAY_MS, m = 1764201600000LL; /* 2025-11-27T00:00:00Z */
    /* within a day: one piece */
    ck_assert_int_eq(usage_split_days(m + 1000, m + 61000, day, ms, 8), 1);
    ck_assert(day[0] == m && ms[0] == 60000);
    /* 23:00 to 01:30 the next day: an hour before midnight, 90 minutes after */
    ck_assert_int_eq(usage_split_days(m - 3600000, m + 5400000, day, ms, 8), 2);
    ck_assert(day[0] == m - D && ms[0] == 3600000 && day[1] == m && ms[1] == 5400000);
    /* ending exactly at midnight: nothing in the next day */
    ck_assert_int_eq(usage_split_days(m - 1000, m, day, ms, 8), 1);
    ck_assert(day[0] == m - D && ms[0] == 1000);
    /* starting exactly at midnight */
    ck_assert_int_eq(usage_split_days(m, m + 1, day, ms, 8), 1);
    ck_assert(day[0] == m && ms[0] == 1);
    /* three days and a bit: the full day in the middle is 86,400 s */
    ck_assert_int_eq(usage_split_days(m - 10, m + 2 * D + 20, day, ms, 8), 4);
    ck_assert(ms[0] == 10 && ms[1] == D && ms[2] == D && ms[3] == 20 && day[3] == m + 2 * D);
    /* empty and backwards intervals have no piece; too many pieces for cap: -1 */
    ck_assert_int_eq(usage_split_days(m, m, day, ms, 8), 0);
    ck_assert_int_eq(usage_split_days(m + 5, m, day, ms, 8), 0);
    ck_assert_int_eq(usage_split_days(m, m + 9 * D, day, ms, 8), -1);
}
END_TEST

START_TEST(two_teams_and_a_preemption_match_their_timelines) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 201);
    snprintf(vision_tok, sizeof vision_tok, "%s", ty_str(o, "token"));
    cJSON_Delete(o);

    int64_t j1 = submit_cmd(team_tok, "d-short", "", "2");
    int64_t j2 = submit_cmd(vision_tok, "v-short", "", "2");
    wait_for(team_tok, j1, "succeeded", 1, 60);
    wait_for(vision_tok, j2, "succeeded", 1, 60);
    /* a preemptible job on both slots, preempted by a job of higher priority */
    int64_t j3 = submit_cmd(vision_tok, "v-low", "\"priority\":10,\"preemptible\":true,\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":2},",
                            "120");
    wait_for(vision_tok, j3, "running", 1, 60);
    ty_sleep_ms(1500);
    int64_t j4 = submit_cmd(team_tok, "d-high", "\"priority\":90,\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":2},", "2");
    wait_for(team_tok, j4, "succeeded", 1, 90);
    /* j3 placed again once j4 freed the slots; cancelled a moment later */
    wait_for(vision_tok, j3, "running", 2, 60);
    ty_sleep_ms(1500);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)j3);
    ck_assert_int_eq(ty_http(srv.url, vision_tok, "POST", path, NULL, NULL), 200);
    wait_for(vision_tok, j3, "cancelled", 2, 30);
    ty_sleep_ms(1500); /* its tasks report their exit */

    int p1, p2, p3, p4;
    double t1 = timeline_seconds(team_tok, j1, 1, &p1), t2 = timeline_seconds(vision_tok, j2, 1, &p2);
    double t3 = timeline_seconds(vision_tok, j3, 2, &p3), t4 = timeline_seconds(team_tok, j4, 2, &p4);
    ck_assert_int_eq(p3, 1);
    ck_assert_int_eq(p1 + p2 + p4, 0);

    /* by job: every job's device seconds are its timeline's */
    cJSON *u = usage(admin_tok, "?by=job");
    const int64_t ids[] = {j1, j2, j3, j4};
    const double want[] = {t1, t2, t3, t4};
    const char *teams[] = {"default", "vision", "vision", "default"};
    for (int i = 0; i < 4; i++) {
        cJSON *r = row_of_job(u, ids[i]);
        ck_assert_msg(r != NULL, "no row of job %lld", (long long)ids[i]);
        ck_assert_str_eq(ty_str(r, "team"), teams[i]);
        char what[64];
        snprintf(what, sizeof what, "job %lld", (long long)ids[i]);
        /* a task's exit and the job's state change are told by the same report, or the
         * next pass; a cancel's tasks exit after it (0.3 s a boundary a slot) */
        const double devs = i >= 2 ? 2 : 1, bounds = i == 2 ? 2 : 1;
        expect_near(ty_num(r, "cpu_slot_seconds"), want[i], 0.3 * devs * bounds, what);
        ck_assert(ty_num(r, "gpu_seconds") == 0);
        ck_assert(jobs_n(r, "run") == 1);
    }
    ck_assert(jobs_n(row_of_job(u, j3), "preempted") == 1 && jobs_n(row_of_job(u, j3), "cancelled") == 1);
    ck_assert_str_eq(ty_str(row_of_job(u, j3), "name"), "v-low");
    cJSON_Delete(u);

    /* by team: the sums of its jobs; jobs, waits and storage */
    u = usage(admin_tok, "");
    ck_assert_str_eq(ty_str(u, "by"), "team");
    cJSON *d = row_where(u, "team", "default"), *v = row_where(u, "team", "vision");
    ck_assert(d && v);
    expect_near(ty_num(d, "cpu_slot_seconds"), t1 + t4, 0.9, "team default");
    expect_near(ty_num(v, "cpu_slot_seconds"), t2 + t3, 1.5, "team vision");
    ck_assert(jobs_n(d, "run") == 2 && jobs_n(d, "succeeded") == 2 && jobs_n(d, "preempted") == 0);
    ck_assert(jobs_n(v, "run") == 2 && jobs_n(v, "succeeded") == 1 && jobs_n(v, "cancelled") == 1 &&
              jobs_n(v, "preempted") == 1 && jobs_n(v, "failed") == 0);
    cJSON *w = cJSON_GetObjectItem(d, "wait_s");
    ck_assert(ty_num(w, "jobs") == 2 && ty_num(w, "median") >= 0 && ty_num(w, "p95") >= ty_num(w, "median"));
    ck_assert(ty_num(w, "p95") < 30);
    ck_assert(ty_num(cJSON_GetObjectItem(d, "storage_bytes"), "logs") >= 0);
    cJSON *tot = cJSON_GetObjectItem(u, "totals");
    expect_near(ty_num(tot, "cpu_slot_seconds"), ty_num(d, "cpu_slot_seconds") + ty_num(v, "cpu_slot_seconds"), 0.002,
                "totals");
    ck_assert(jobs_n(tot, "run") == 4 && jobs_n(tot, "preempted") == 1);
    double team_total = ty_num(tot, "cpu_slot_seconds");
    cJSON_Delete(u);

    /* by day: the same seconds, split by UTC day (these ran today, perhaps across midnight) */
    u = usage(admin_tok, "?by=day");
    double sum = 0;
    cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(u, "rows")) {
        ck_assert_int_eq((int)strlen(ty_str(r, "day")), 10);
        sum += ty_num(r, "cpu_slot_seconds");
    }
    ck_assert_msg(sum >= team_total - 0.01 && sum <= team_total + 0.01, "days %.3f, teams %.3f", sum, team_total);
    cJSON_Delete(u);

    /* CSV: the JSON's numbers, in every grouping */
    char q[160];
    const char *bys[] = {"team", "job", "day"};
    for (int i = 0; i < 3; i++) {
        snprintf(q, sizeof q, "?by=%s&from=%lld&to=%lld", bys[i], (long long)(now_ms() - 2 * USAGE_DAY_MS),
                 (long long)now_ms());
        csv_matches_json(admin_tok, q);
    }

    /* a team token sees its own team; another's is 403; the admin chooses */
    u = usage(vision_tok, "?by=job");
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(u, "rows")) ck_assert_str_eq(ty_str(r, "team"), "vision");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(u, "rows")), 2);
    cJSON_Delete(u);
    u = usage(vision_tok, "?team=vision");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(u, "rows")), 1);
    cJSON_Delete(u);
    expect_error(vision_tok, "?team=default", 403, "forbidden", "team");
    u = usage(admin_tok, "?team=vision");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(u, "rows")), 1);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(cJSON_GetObjectItem(u, "rows"), 0), "team"), "vision");
    cJSON_Delete(u);
    expect_error(admin_tok, "?team=nobody", 422, "invalid_value", "team");

    /* a window after it all: nothing run in it, storage still held */
    snprintf(q, sizeof q, "?from=%lld", (long long)(now_ms() + 1000));
    expect_error(team_tok, q, 422, "invalid_value", "to");
    snprintf(q, sizeof q, "?from=%lld&to=%lld", (long long)(now_ms() + 1000), (long long)(now_ms() + 60000));
    u = usage(team_tok, q);
    d = row_where(u, "team", "default");
    ck_assert(d && ty_num(d, "cpu_slot_seconds") == 0 && jobs_n(d, "run") == 0);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(d, "wait_s"), "median")));
    cJSON_Delete(u);

    /* bad arguments: 422 naming the field */
    expect_error(team_tok, "?from=yesterday", 422, "invalid_value", "from");
    expect_error(team_tok, "?to=2026-13-01", 422, "invalid_value", "to");
    expect_error(team_tok, "?from=2026-02-30", 422, "invalid_value", "from");
    expect_error(team_tok, "?from=2026-01-02&to=2026-01-01", 422, "invalid_value", "to");
    expect_error(team_tok, "?from=2024-01-01&to=2026-01-01", 422, "invalid_value", "from");
    expect_error(team_tok, "?by=week", 422, "invalid_value", "by");
    /* ISO forms with offsets and fractions are the same instants */
    u = usage(team_tok, "?from=2026-01-01T02:00:00.000%2B02:00&to=2026-01-02");
    ck_assert_str_eq(ty_str(u, "from"), "2026-01-01T00:00:00.000Z");
    ck_assert_str_eq(ty_str(u, "to"), "2026-01-02T00:00:00.000Z");
    cJSON_Delete(u);
    u = usage(team_tok, "?from=1767225600000&to=2026-01-01T00:00:01.5Z");
    ck_assert_str_eq(ty_str(u, "to"), "2026-01-01T00:00:01.500Z");
    cJSON_Delete(u);

    /* the CLI's table and its CSV */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL=%s TRAINYARD_TOKEN=%s %s usage --by team > %s/cli.txt 2>&1", srv.url,
             admin_tok, ty_bin(), srv.dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/cli.txt", srv.dir);
    size_t len = 0;
    char *txt = file_read_all(cmd, 1 << 20, &len);
    ck_assert_ptr_nonnull(txt);
    ck_assert_msg(strstr(txt, "GPU-HOURS") && strstr(txt, "vision") && strstr(txt, "TOTAL"), "%s", txt);
    free(txt);
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL=%s TRAINYARD_TOKEN=%s %s usage --by day --csv > %s/cli.csv",
             srv.url, admin_tok, ty_bin(), srv.dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/cli.csv", srv.dir);
    txt = file_read_all(cmd, 1 << 20, &len);
    ck_assert_ptr_nonnull(txt);
    ck_assert_msg(strncmp(txt, "day,team,gpu_seconds,", 21) == 0, "%s", txt);
    free(txt);
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL=%s TRAINYARD_TOKEN=%s %s usage --by month 2>/dev/null >/dev/null", srv.url,
             admin_tok, ty_bin());
    ck_assert_int_eq(WEXITSTATUS(system(cmd)), 1); /* the server's 422 */
}
END_TEST

START_TEST(server_restart_keeps_a_running_jobs_usage) {
    int64_t id = submit_cmd(team_tok, "long", "", "9");
    wait_for(team_tok, id, "running", 1, 60);
    ty_sleep_ms(2000);
    cJSON *u = usage(team_tok, "?by=job");
    double before = ty_num(row_of_job(u, id), "cpu_slot_seconds");
    cJSON_Delete(u);
    int p = 0;
    double tl = timeline_seconds(team_tok, id, 1, &p);
    expect_near(before, tl, 0.5, "while it runs");
    ck_assert_int_eq(WTERMSIG(ty_kill(&srv, SIGKILL)), SIGKILL);
    ty_sleep_ms(2500); /* the job runs on with no server */
    stack_server_restart();
    u = usage(team_tok, "?by=job");
    double after = ty_num(row_of_job(u, id), "cpu_slot_seconds");
    cJSON_Delete(u);
    /* no gap: the seconds the server was away count too */
    ck_assert_msg(after >= before + 2.5, "before the restart %.3f s, after %.3f s", before, after);
    wait_for(team_tok, id, "succeeded", 1, 60);
    ty_sleep_ms(500);
    tl = timeline_seconds(team_tok, id, 1, &p);
    u = usage(team_tok, "?by=job");
    cJSON *r = row_of_job(u, id);
    /* neither lost nor counted twice: the timeline's one interval */
    expect_near(ty_num(r, "cpu_slot_seconds"), tl, 1.0, "after the restart");
    ck_assert(ty_num(r, "cpu_slot_seconds") >= 9.0);
    ck_assert(jobs_n(r, "run") == 1 && jobs_n(r, "succeeded") == 1);
    cJSON_Delete(u);
}
END_TEST

int main(void) {
    Suite *s = suite_create("usage");
    TCase *unit = tcase_create("unit");
    tcase_add_test(unit, split_days_at_utc_midnight);
    suite_add_tcase(s, unit);
    TCase *e2e = ty_tcase(s, "teams", start_up2, stop_all, 300);
    tcase_add_test(e2e, two_teams_and_a_preemption_match_their_timelines);
    TCase *rs = ty_tcase(s, "restart", start_server_agent, stop_all, 180);
    tcase_add_test(rs, server_restart_keeps_a_running_jobs_usage);
    return ty_run_suite(s);
}
