/* check_backup.c - backups and restore on real processes (a `trainyard
 * server` and a `trainyard agent` on loopback, python3 command jobs that
 * report metrics and upload checkpoints):
 *  - data_removed_under_a_running_cluster: a team, a user, jobs (succeeded
 *    with its newest checkpoint kept, running with two checkpoints, queued),
 *    metrics, events;
 *    `trainyard backup DEST`; every answer recorded; DATA removed under the
 *    running server, the server killed; `trainyard restore DEST --data
 *    DATA2`; the server started on DATA2 answers the same (volatile fields
 *    excluded by name) and every checkpoint's bytes have the same sha256;
 *    a second backup to /dev/shm (another file system) copies and checks
 *    the checkpoints instead of linking them, and restores;
 *  - periodic_backups_keep_two: --backup-every 1s --backup-keep 2 leave
 *    exactly 2 complete folders (an old unfinished one removed), and
 *    /metrics has the last success;
 *  - restore_refusals: the route's 403 and 422s (each with its audit row),
 *    a backup without manifest, a data directory holding
 *    a database (without --force), a schema newer than the binary, a
 *    damaged database, a running server's directory (offline backup and
 *    restore);
 *  - objects_in_another_store: checkpoint rows naming a file:// store's
 *    objects are listed, not copied; restore HEADs each, refuses a missing
 *    one by name, and with --allow-missing marks its row deleted; a local
 *    file gone from DATA is listed missing (exit 3) and its row marked
 *    deleted by the restore;
 *  - s3_destination (radosgw by scripts/s3-dev.sh; SKIP without it unless
 *    S3_TEST_REQUIRED=1): the backup PUT under backups/ of a bucket through
 *    the server's --backup-credentials, restored from there, the same job
 *    and checkpoint; periodic backups to s3 keep 2;
 *  - checkpoints_in_s3 (the same store): with --blob-store s3://..., a
 *    folder backup lists the checkpoint objects, restore HEADs them, the
 *    restored server serves the same bytes; an object deleted from the
 *    bucket is named, --allow-missing marks its row deleted;
 *  - writers_not_blocked: 8 clients submit jobs without and during a
 *    backup of a padded database: the longest submission is printed (the
 *    figure of docs/reliability.md) and no writer waited for the snapshot;
 *    a second backup asked meanwhile is 409. */
#include "testlib.h"
#include "state_fixture.h"
#include "s3_fixture.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>

static ty_proc srv;
static char admin_tok[128], team_tok[128];
static char base[256], data2[320], dest[320], agentdir[320], tmpdir[256], script[400], flag[400];
static pid_t agent_pid;
static int port;

/* Prints a line, reports epoch metrics and uploads a checkpoint after each
 * (argv[1]: the val_loss values), then waits for the file argv[2] ("-":
 * does not wait). */
static const char PY[] =
    "import hashlib, json, os, sys, time, urllib.request\n"
    "cfg = json.loads(os.environ['TRAINYARD_CONFIG'])\n"
    "vals = [float(v) for v in sys.argv[1].split(',')]\n"
    "base = f\"{cfg['api']}/api/v1/jobs/{cfg['job']}\"\n"
    "print('job output line', flush=True)\n"
    "for i, v in enumerate(vals):\n"
    "    step, epoch = 10 * (i + 1), i + 1\n"
    "    print('trainyard-metric ' + json.dumps({'kind': 'epoch', 'epoch': epoch, 'step': step, 'val_loss': v}),"
    " flush=True)\n"
    "    body = (f'checkpoint {cfg[\"job\"]} {i} ' * 3000).encode()\n"
    "    req = urllib.request.Request(f'{base}/checkpoints?step={step}&epoch={epoch}', data=body, method='PUT',\n"
    "        headers={'Authorization': 'Bearer ' + cfg['token'], 'Content-Type': 'application/octet-stream',\n"
    "                 'X-Checksum-Sha256': hashlib.sha256(body).hexdigest()})\n"
    "    urllib.request.urlopen(req).read()\n"
    "    print('uploaded checkpoint', i, flush=True)\n"
    "if sys.argv[2] != '-':\n"
    "    for _ in range(3000):\n"
    "        if os.path.exists(sys.argv[2]):\n"
    "            break\n"
    "        time.sleep(0.1)\n"
    "print('script done', flush=True)\n";

/* ---------------------------------------------------------------- processes */

/* Runs the binary with args; its stdout and stderr into out; the exit status. */
static int run_ty(char *out, size_t cap, const char *const *args) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        const char *argv[32];
        int n = 0;
        argv[n++] = ty_bin();
        for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fds[0], out + len, cap - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == cap - 1) break;
    }
    out[len] = '\0';
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The server on data directory dir, on the test's port. */
static void server_on(const char *dir, const char *const *more) {
    snprintf(srv.dir, sizeof srv.dir, "%s", dir);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    const char *extra[16] = {"--listen", listen};
    int n = 2;
    for (int i = 0; more && more[i] && n < 15; i++) extra[n++] = more[i];
    extra[n] = NULL;
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

/* An agent whose own files lie outside the data directory (it is removed
 * under the server). */
static void agent_start(void) {
    char tokfile[400], logf[400], statef[400];
    snprintf(statef, sizeof statef, "%s/agent.state", agentdir);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", agentdir);
    snprintf(logf, sizeof logf, "%s/agent.log", agentdir);
    char src[400];
    snprintf(src, sizeof src, "%s/node.token", srv.dir);
    size_t n = 0;
    char *t = file_read_all(src, 1024, &n);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(file_write_atomic(tokfile, t, n, 0600), 0);
    free(t);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token-file", tokfile, "--hostname", "bk-node",
              "--cpu-slots", "2", "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    agent_pid = pid;
}

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    agent_pid = 0;
    ty_mkdtemp(base, sizeof base, "bk");
    snprintf(data2, sizeof data2, "%s/data2", base);
    snprintf(dest, sizeof dest, "%s/dest", base);
    snprintf(agentdir, sizeof agentdir, "%s/agent", base);
    ck_assert_int_eq(mkdir(agentdir, 0700), 0);
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "bktmp"); /* the programs run as other uids */
    snprintf(script, sizeof script, "%s/job.py", tmpdir);
    snprintf(flag, sizeof flag, "%s/finish", tmpdir);
    ck_assert_int_eq(file_write_atomic(script, PY, sizeof PY - 1, 0644), 0);
    port = ty_free_port();
}

static void teardown(void) {
    int fd = open(flag, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    if (agent_pid > 0) {
        kill(agent_pid, SIGTERM);
        waitpid(agent_pid, NULL, 0);
    }
    ty_kill(&srv, SIGTERM);
    ty_rmrf(base);
    ty_rmrf(tmpdir);
}

/* ---------------------------------------------------------------- helpers */

static long get(const char *tok, const char *path, cJSON **out) { return ty_http(srv.url, tok, "GET", path, NULL, out); }

/* where check_backup's server is, for state_fixture.h */
static ty_state S = {&srv, admin_tok, team_tok, script, base, agentdir};

/* ---------------------------------------------------------------- the cluster, lost and restored */

START_TEST(data_removed_under_a_running_cluster) {
    char data[320];
    snprintf(data, sizeof data, "%s/data", base);
    server_on(data, NULL);
    agent_start();
    /* a team, its token, a user in it */
    ty_team_with_member(&S, team_tok, sizeof team_tok);
    /* jobs: one done with 3 checkpoints, one running with 2, one that cannot be placed */
    int64_t done = ty_submit_script(&S, "done", "0.5,0.4,0.3", "-");
    ty_wait_job_state(&S, done, "succeeded", 90);
    for (int i = 0; ty_ckpt_count(&S, done) != 1; i++) { /* a finished job keeps its newest (the retention's pass) */
        ck_assert_msg(i < 600, "the finished job kept %d checkpoints", ty_ckpt_count(&S, done));
        ty_sleep_ms(100);
    }
    int64_t run = ty_submit_script(&S, "running", "0.9,0.8", flag);
    ty_wait_job_state(&S, run, "running", 60);
    for (int i = 0; ty_ckpt_count(&S, run) < 2; i++) {
        ck_assert_msg(i < 600, "the running job did not upload its checkpoints");
        ty_sleep_ms(100);
    }
    int64_t queued = ty_submit(srv.url, team_tok,
                               "{\"name\":\"queued\",\"command\":{\"argv\":[\"/bin/true\"]},"
                               "\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":16,\"device\":\"cpu\"},\"queue_if_infeasible\":true}");
    ty_sleep_ms(1500); /* a scheduling pass or two: it stays queued */
    char st[32];
    ck_assert_str_eq(ty_job_state(&S, queued, st, sizeof st), "queued");

    /* the backup, through the running server */
    char out[8192];
    const char *bargs[] = {"backup", dest, "--url", srv.url, "--token", admin_tok, "--json", NULL};
    int rc = run_ty(out, sizeof out, bargs);
    ck_assert_msg(rc == 0, "trainyard backup: %d: %s", rc, out);
    cJSON *sum = cJSON_Parse(out);
    ck_assert_msg(sum != NULL, "not JSON: %s", out);
    ck_assert_int_eq((int)ty_num(sum, "blobs"), 3);
    ck_assert_int_eq((int)ty_num(sum, "blobs_linked"), 3); /* DEST is on DATA's file system */
    ck_assert_int_eq((int)ty_num(sum, "blobs_missing"), 0);
    ck_assert_int_eq((int)ty_num(sum, "writer_blocked_ms"), 0);
    ck_assert_int_ge((int)ty_num(sum, "files"), 6); /* 3 tokens, attempt.key, the jobs' logs */
    printf("backup: %s\n", out);
    char manifest[PATH_MAX];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", ty_str(sum, "path"));
    struct stat sb;
    ck_assert_int_eq(stat(manifest, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    cJSON_Delete(sum);
    char hold[400];
    snprintf(hold, sizeof hold, "%s/.backup-hold", data);
    ck_assert_int_ne(stat(hold, &sb), 0); /* step 1's links went with the backup */

    /* to another file system (/dev/shm, a tmpfs): copies, each checked against its row */
    char shm[64] = "/dev/shm/ty_bk_XXXXXX", shm_data[128];
    struct stat st_shm, st_base;
    if (mkdtemp(shm) && stat(shm, &st_shm) == 0 && stat(base, &st_base) == 0 && st_shm.st_dev != st_base.st_dev) {
        const char *sargs[] = {"backup", shm, "--url", srv.url, "--token", admin_tok, "--json", NULL};
        rc = run_ty(out, sizeof out, sargs);
        ck_assert_msg(rc == 0, "trainyard backup to %s: %d: %s", shm, rc, out);
        cJSON *s2 = cJSON_Parse(out);
        ck_assert_ptr_nonnull(s2);
        ck_assert_int_eq((int)ty_num(s2, "blobs"), 3);
        ck_assert_int_eq((int)ty_num(s2, "blobs_linked"), 0);
        ck_assert_int_eq((int)ty_num(s2, "blob_bytes_copied"), 3 * 45000); /* the script's checkpoints */
        cJSON_Delete(s2);
        snprintf(shm_data, sizeof shm_data, "%s/restored", shm);
        const char *r2[] = {"restore", shm, "--data", shm_data, NULL};
        rc = run_ty(out, sizeof out, r2);
        ck_assert_msg(rc == 0 && strstr(out, "3 jobs, 3 checkpoints (3 local"), "restore from %s: %d: %s", shm, rc, out);
        rm_tree(shm);
    } else {
        printf("no other file system at /dev/shm: the copies are not tried\n");
        rmdir(shm);
    }

    /* every answer */
    ty_recorded rec[TY_NREC];
    int nrec = 0;
    char path[160];
    int64_t ids[3] = {done, run, queued};
    ty_record_jobs(rec, &nrec, &S, ids, 3);
    /* and each checkpoint's bytes */
    ty_ckpt ck[16];
    int nck = ty_record_ckpts(&S, ids, 2, ck, 16);
    ck_assert_int_eq(nck, 3);

    /* the data directory lost under the running server, then the server
     * (the running job's log posts, a second apart, make the server create
     * DATA/logs/JOB again: a removal that met one is done again) */
    for (int k = 0; k < 20 && stat(data, &sb) == 0; k++) rm_tree(data);
    ck_assert_int_ne(stat(data, &sb), 0);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/health", NULL, NULL), 200);
    ty_kill(&srv, SIGKILL);

    /* restored elsewhere, the server started on it (same port: the agent comes back) */
    const char *rargs[] = {"restore", dest, "--data", data2, NULL};
    rc = run_ty(out, sizeof out, rargs);
    ck_assert_msg(rc == 0, "trainyard restore: %d: %s", rc, out);
    printf("restore: %s", out);
    ck_assert_msg(strncmp(out, "restored ", 9) == 0 && strchr(out, '\n') == out + strlen(out) - 1,
                  "not one summary line: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "3 jobs, 3 checkpoints (3 local"));
    char key_path[400];
    snprintf(key_path, sizeof key_path, "%s/attempt.key", data2);
    ck_assert_int_eq(stat(key_path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    char old_admin[128];
    snprintf(old_admin, sizeof old_admin, "%s", admin_tok);
    server_on(data2, NULL);
    ck_assert_str_eq(admin_tok, old_admin);

    /* every answer the same */
    for (int i = 0; i < nrec; i++) {
        cJSON *now = NULL;
        ck_assert_msg(get(rec[i].tok, rec[i].path, &now) == 200, "GET %s after the restore", rec[i].path);
        char diff[600] = "";
        /* the running job goes on after the snapshot: its own answer's state and tasks move */
        snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)run);
        int running_job = strcmp(rec[i].path, path) == 0;
        if (running_job) {
            const char *keep[] = {"id", "name", "team", "spec", "created_at", "submitted_at", "attempt", NULL};
            for (int k = 0; keep[k]; k++) {
                cJSON *a = cJSON_GetObjectItemCaseSensitive(rec[i].body, keep[k]);
                cJSON *b = cJSON_GetObjectItemCaseSensitive(now, keep[k]);
                if (a && (!b || !cJSON_Compare(a, b, 1))) snprintf(diff, sizeof diff, "%s differs", keep[k]);
            }
        } else {
            ty_json_diff(rec[i].body, now, rec[i].path, "after the restore", diff, sizeof diff);
        }
        ck_assert_msg(diff[0] == '\0', "after the restore, %s", diff);
        cJSON_Delete(now);
        cJSON_Delete(rec[i].body);
    }
    for (int i = 0; i < nck; i++) {
        char sha[65];
        ty_ckpt_sha(&S, ck[i].job, ck[i].id, sha);
        ck_assert_str_eq(sha, ck[i].sha);
    }
}
END_TEST

/* ---------------------------------------------------------------- periodic */

static int count_backups(const char *dir, int *incomplete) {
    DIR *d = opendir(dir);
    int complete = 0;
    *incomplete = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "trainyard-backup-", 17) != 0) continue;
        char m[600];
        struct stat sb;
        snprintf(m, sizeof m, "%s/%s/manifest.json", dir, e->d_name);
        if (stat(m, &sb) == 0) complete++;
        else (*incomplete)++;
    }
    closedir(d);
    return complete;
}

START_TEST(periodic_backups_keep_two) {
    char data[320], stale[400];
    snprintf(data, sizeof data, "%s/data", base);
    ck_assert_int_eq(mkdir(dest, 0700), 0);
    snprintf(stale, sizeof stale, "%s/trainyard-backup-20000101T000000Z", dest); /* an interrupted one */
    ck_assert_int_eq(mkdir(stale, 0700), 0);
    const char *more[] = {"--backup-to", dest, "--backup-every", "1s", "--backup-keep", "2", NULL};
    server_on(data, more);
    int incomplete = 0, complete = 0;
    for (int i = 0; i < 200; i++) { /* three rounds at least, so one was removed */
        char *l = NULL;
        size_t n = 0;
        l = file_read_all(srv.log, 1 << 20, &n);
        int rounds = 0;
        for (const char *p = l; p && (p = strstr(p, "older removed")); p++) rounds++;
        free(l);
        if (rounds >= 4) break;
        ty_sleep_ms(100);
    }
    cJSON *o = NULL;
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, admin_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", "/metrics", NULL, 0, NULL, &r), 0);
    client_release(&c);
    ck_assert_int_eq(r.status, 200);
    const char *m = strstr(r.body.data, "\ntrainyard_backup_last_success_seconds ");
    ck_assert_ptr_nonnull(m);
    long long last = atoll(m + strlen("\ntrainyard_backup_last_success_seconds "));
    ck_assert_int_gt(last, (long long)time(NULL) - 30);
    ck_assert_ptr_nonnull(strstr(r.body.data, "\ntrainyard_backup_failures_total 0\n"));
    client_reply_release(&r);
    (void)o;
    ty_kill(&srv, SIGTERM); /* waits for a backup under way */
    complete = count_backups(dest, &incomplete);
    ck_assert_int_eq(complete, 2);
    ck_assert_int_eq(incomplete, 0);
    struct stat sb;
    ck_assert_int_ne(stat(stale, &sb), 0);
}
END_TEST

/* ---------------------------------------------------------------- refusals */

START_TEST(restore_refusals) {
    char data[320], out[4096], bdir[PATH_MAX];
    snprintf(data, sizeof data, "%s/data", base);
    server_on(data, NULL);
    /* the offline form refuses a directory whose server runs */
    const char *off[] = {"backup", dest, "--data", data, NULL};
    int rc = run_ty(out, sizeof out, off);
    ck_assert_msg(rc == 1 && strstr(out, "server runs"), "%d: %s", rc, out);
    /* a team token may not back up; a destination inside DATA is the handler's 422 and makes nothing */
    cJSON *o = NULL;
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    char body[600];
    snprintf(body, sizeof body, "{\"dest\":\"%s\"}", dest);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/backups", body, &o), 403);
    cJSON_Delete(o);
    snprintf(body, sizeof body, "{\"dest\":\"%s/inside\"}", data);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/backups", body, &o), 422);
    ty_assert_error(o, "invalid_value", "dest");
    cJSON_Delete(o);
    snprintf(bdir, sizeof bdir, "%s/inside", data);
    struct stat sb;
    ck_assert_int_ne(stat(bdir, &sb), 0);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/backups", "{\"dest\":\"relative/dir\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "dest");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/backups", "{\"dest\":\"/tmp\",\"x\":1}", &o), 422);
    ty_assert_error(o, "unknown_field", "x");
    cJSON_Delete(o);
    /* each asked backup has its audit row: the team's 403, the admin's 422s
     * (written once answered: a moment after the answer) */
    int n403 = 0, n422 = 0;
    for (int tries = 0; tries < 50 && (n403 != 1 || n422 != 3); tries++) {
        if (tries) ty_sleep_ms(100);
        ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/audit?action=/api/v1/backups", NULL, &o), 200);
        cJSON *rows = cJSON_IsArray(o) ? o : NULL;
        for (cJSON *x = o->child; !rows && x; x = x->next)
            if (cJSON_IsArray(x)) rows = x;
        ck_assert_ptr_nonnull(rows);
        n403 = n422 = 0;
        cJSON *row;
        cJSON_ArrayForEach(row, rows) {
            n403 += (int)ty_num(row, "status") == 403;
            n422 += (int)ty_num(row, "status") == 422;
        }
        cJSON_Delete(o);
    }
    ck_assert_int_eq(n403, 1);
    ck_assert_int_eq(n422, 3);
    ty_kill(&srv, SIGTERM);
    /* the offline form on the stopped server's directory */
    rc = run_ty(out, sizeof out, off);
    ck_assert_msg(rc == 0 && strncmp(out, "backup ", 7) == 0, "%d: %s", rc, out);
    snprintf(bdir, sizeof bdir, "%.*s", (int)(strchr(out, ':') - out - 7), out + 7);
    /* into a directory a server runs on: refused, even with --force */
    char served[400];
    snprintf(served, sizeof served, "%s/served", base);
    server_on(served, NULL);
    const char *into_served[] = {"restore", bdir, "--data", served, "--force", NULL};
    rc = run_ty(out, sizeof out, into_served);
    ck_assert_msg(rc == 1 && strstr(out, "server runs on"), "%d: %s", rc, out);
    ty_kill(&srv, SIGTERM);
    /* a data directory holding a database: refused, then --force */
    const char *into_data[] = {"restore", bdir, "--data", data, NULL};
    rc = run_ty(out, sizeof out, into_data);
    ck_assert_msg(rc == 1 && strstr(out, "already holds a database"), "%d: %s", rc, out);
    const char *forced[] = {"restore", bdir, "--data", data, "--force", NULL};
    rc = run_ty(out, sizeof out, forced);
    ck_assert_msg(rc == 0 && strncmp(out, "restored ", 9) == 0, "%d: %s", rc, out);
    /* a schema newer than this binary's */
    char mpath[PATH_MAX + 32], mkeep[PATH_MAX + 32];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", bdir);
    snprintf(mkeep, sizeof mkeep, "%s/manifest.keep", bdir);
    size_t n = 0;
    char *text = file_read_all(mpath, 1 << 20, &n);
    ck_assert_ptr_nonnull(text);
    cJSON *m = cJSON_Parse(text);
    cJSON_ReplaceItemInObject(m, "schema_version", cJSON_CreateNumber(9999));
    char *newer = cJSON_Print(m);
    cJSON_Delete(m);
    ck_assert_int_eq(rename(mpath, mkeep), 0);
    ck_assert_int_eq(file_write_atomic(mpath, newer, strlen(newer), 0600), 0);
    free(newer);
    const char *fresh[] = {"restore", bdir, "--data", data2, NULL};
    rc = run_ty(out, sizeof out, fresh);
    ck_assert_msg(rc == 1 && strstr(out, "newer than this trainyard"), "%d: %s", rc, out);
    /* a damaged database: its sha256 */
    ck_assert_int_eq(rename(mkeep, mpath), 0);
    char dbp[PATH_MAX + 32];
    snprintf(dbp, sizeof dbp, "%s/trainyard.db", bdir);
    int fd = open(dbp, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "X", 1, 5000), 1);
    close(fd);
    rc = run_ty(out, sizeof out, fresh);
    ck_assert_msg(rc == 1 && strstr(out, "sha256"), "%d: %s", rc, out);
    snprintf(dbp, sizeof dbp, "%s/trainyard.db", data2);
    ck_assert_int_ne(stat(dbp, &sb), 0); /* nothing left behind */
    /* without a manifest: incomplete, refused (by name, and as the only one of a folder of backups) */
    ck_assert_int_eq(unlink(mpath), 0);
    rc = run_ty(out, sizeof out, fresh);
    ck_assert_msg(rc == 1 && strstr(out, "no manifest.json"), "%d: %s", rc, out);
    const char *folder[] = {"restore", dest, "--data", data2, NULL};
    rc = run_ty(out, sizeof out, folder);
    ck_assert_msg(rc == 1 && strstr(out, "no complete backup"), "%d: %s", rc, out);
    text[0] = text[0]; /* the original manifest text, unused below */
    free(text);
}
END_TEST

/* ---------------------------------------------------------------- objects of another store */

/* Checkpoint rows that name objects of a file:// blob store (as a server
 * with --blob-store file:///DIR writes them): the backup lists them in its
 * manifest without copying them; restore HEADs each, fails naming the one
 * that is gone, and with --allow-missing restores with its row marked
 * deleted. (The rows are written into the stopped server's database.) */
START_TEST(objects_in_another_store) {
    char data[320], store[320], url[400], obj[600], dbp[400], out[4096];
    snprintf(data, sizeof data, "%s/data", base);
    snprintf(store, sizeof store, "%s/store", base);
    snprintf(url, sizeof url, "file://%s", store);
    server_on(data, NULL);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t job = ty_submit(srv.url, team_tok, "{\"name\":\"s\",\"command\":{\"argv\":[\"/bin/true\"]}}");
    ty_kill(&srv, SIGTERM);
    /* two objects named, one there */
    snprintf(obj, sizeof obj, "%s/checkpoints/%lld", store, (long long)job);
    ck_assert_int_eq(mkdir_p(obj, 0700), 0);
    snprintf(obj, sizeof obj, "%s/checkpoints/%lld/1-a.safetensors", store, (long long)job);
    ck_assert_int_eq(file_write_atomic(obj, "hello", 5, 0600), 0);
    char sha[65];
    sha256_hex("hello", 5, sha);
    snprintf(dbp, sizeof dbp, "%s/trainyard.db", data);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbp, &db), SQLITE_OK);
    char sql[1600];
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof sql,
                 "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at, store) "
                 "VALUES(%lld, 1, %d, %d, 5, '%s', '%lld/1-%c.safetensors', 1, '%s')",
                 (long long)job, i + 1, i + 1, sha, (long long)job, i ? 'b' : 'a', url);
        ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    }
    /* and a local one whose file is gone from DATA (a prune that raced a copy) */
    snprintf(sql, sizeof sql,
             "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at) "
             "VALUES(%lld, 1, 3, 3, 5, '%s', '%lld/gone.safetensors', 1)",
             (long long)job, sha, (long long)job);
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    const char *bargs[] = {"backup", dest, "--data", data, "--json", NULL};
    int rc = run_ty(out, sizeof out, bargs);
    ck_assert_msg(rc == 3, "backup: %d (3: complete, something missing): %s", rc, out);
    cJSON *sum = cJSON_Parse(strchr(out, '{'));
    ck_assert_ptr_nonnull(sum);
    ck_assert_int_eq((int)ty_num(sum, "manifest_objects"), 2);
    ck_assert_int_eq((int)ty_num(sum, "blobs"), 0);
    ck_assert_int_eq((int)ty_num(sum, "blobs_missing"), 1);
    cJSON_Delete(sum);
    /* the one gone: named, and nothing restored */
    const char *rargs[] = {"restore", dest, "--data", data2, NULL};
    rc = run_ty(out, sizeof out, rargs);
    char want[200];
    snprintf(want, sizeof want, "checkpoints/%lld/1-b.safetensors", (long long)job);
    ck_assert_msg(rc == 1 && strstr(out, "1 object the backup names is missing") && strstr(out, want), "%d: %s", rc,
                  out);
    struct stat sb;
    snprintf(dbp, sizeof dbp, "%s/trainyard.db", data2);
    ck_assert_int_ne(stat(dbp, &sb), 0);
    /* allowed: restored, its row marked deleted, the other's kept */
    const char *allow[] = {"restore", dest, "--data", data2, "--allow-missing", NULL};
    rc = run_ty(out, sizeof out, allow);
    ck_assert_msg(rc == 0 && strstr(out, "2 in another store, 1 of them missing and marked deleted") &&
                      strstr(out, "missing when the backup was taken: marked deleted"),
                  "%d: %s", rc, out);
    ck_assert_int_eq(sqlite3_open(dbp, &db), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT path FROM checkpoints WHERE deleted_at IS NULL", -1, &st, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    snprintf(want, sizeof want, "%lld/1-a.safetensors", (long long)job);
    ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), want);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
}
END_TEST

/* ---------------------------------------------------------------- an s3 destination */

static s3_dev dev;
static int s3_up;

static void setup_s3(void) {
    setup();
    char why[256];
    s3_up = 0;
    if (!s3_have(why, sizeof why)) {
        if (s3_required()) ck_abort_msg("S3_TEST_REQUIRED=1: %s", why);
        fprintf(stderr, "check_backup: the s3 case: SKIP: %s\n", why);
        return;
    }
    ck_assert_msg(s3_start(&dev, "bks3", 1024) == 0, "scripts/s3-dev.sh start failed (above)");
    s3_up = 1;
}

static void teardown_s3(void) {
    teardown();
    if (s3_up) s3_stop(&dev);
    s3_up = 0;
}

/* The cluster's data to s3 through the running server (--backup-credentials),
 * restored from s3 into another directory: the same job and checkpoint
 * bytes; periodic backups to s3 keep 2. */
START_TEST(s3_destination) {
    if (!s3_up) return;
    char data[320], spec[512], out[8192];
    snprintf(data, sizeof data, "%s/data", base);
    ck_assert_int_eq(s3_bucket(&dev, "backups"), 0);
    s3_spec(&dev, "backups", spec, sizeof spec);
    const char *more[] = {"--backup-credentials", dev.creds, NULL};
    server_on(data, more);
    agent_start();
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t done = ty_submit_script(&S, "done", "0.5,0.4", "-");
    ty_wait_job_state(&S, done, "succeeded", 90);
    for (int i = 0; ty_ckpt_count(&S, done) != 1; i++) {
        ck_assert_msg(i < 600, "the finished job kept %d checkpoints", ty_ckpt_count(&S, done));
        ty_sleep_ms(100);
    }
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)done);
    cJSON *o = NULL;
    ck_assert_int_eq(get(team_tok, path, &o), 200);
    cJSON *arr = cJSON_IsArray(o) ? o : cJSON_GetObjectItem(o, "checkpoints");
    int64_t cid = (int64_t)ty_num(cJSON_GetArrayItem(arr, 0), "id");
    char sha[65], sha2[65];
    ty_ckpt_sha(&S, done, cid, sha);
    cJSON_Delete(o);
    cJSON *job1 = ty_job_get(srv.url, team_tok, done);

    const char *bargs[] = {"backup", spec, "--url", srv.url, "--token", admin_tok, "--json", NULL};
    int rc = run_ty(out, sizeof out, bargs);
    ck_assert_msg(rc == 0, "trainyard backup %s: %d: %s", spec, rc, out);
    cJSON *sum = cJSON_Parse(out);
    ck_assert_ptr_nonnull(sum);
    ck_assert_int_eq((int)ty_num(sum, "blobs"), 1);
    ck_assert_int_gt((int)ty_num(sum, "uploaded_bytes"), 45000);
    ck_assert_ptr_nonnull(strstr(ty_str(sum, "path"), "backups/trainyard-backup-"));
    char mkey[300];
    snprintf(mkey, sizeof mkey, "%s/manifest.json", ty_str(sum, "path"));
    cJSON_Delete(sum);
    char keys[64][256];
    int n = s3_keys(&dev, "backups", "backups/", keys, 64);
    int has_manifest = 0;
    for (int i = 0; i < n && i < 64; i++) has_manifest |= strcmp(keys[i], mkey) == 0;
    ck_assert_msg(has_manifest, "%s is not in the bucket (%d keys)", mkey, n);
    struct stat sb;
    char stage[400];
    snprintf(stage, sizeof stage, "%s/.backup-staging", data);
    ck_assert_int_ne(stat(stage, &sb), 0); /* the staging folder went */

    rm_tree(data);
    ty_kill(&srv, SIGKILL);
    const char *rargs[] = {"restore", spec, "--data", data2, "--blob-credentials", dev.creds, NULL};
    rc = run_ty(out, sizeof out, rargs);
    ck_assert_msg(rc == 0 && strncmp(out, "restored ", 9) == 0, "trainyard restore %s: %d: %s", spec, rc, out);
    printf("restore from s3: %s", out);
    server_on(data2, more);
    cJSON *job2 = ty_job_get(srv.url, team_tok, done);
    char diff[600] = "";
    ty_json_diff(job1, job2, "job", "after the restore", diff, sizeof diff);
    ck_assert_msg(diff[0] == '\0', "after the restore from s3, %s", diff);
    cJSON_Delete(job1);
    cJSON_Delete(job2);
    ty_ckpt_sha(&S, done, cid, sha2);
    ck_assert_str_eq(sha, sha2);
    ty_kill(&srv, SIGTERM);

    /* periodic, to s3: the newest 2 complete ones kept */
    const char *per[] = {"--backup-credentials", dev.creds, "--backup-to", spec, "--backup-every", "1s",
                         "--backup-keep", "2", NULL};
    server_on(data2, per);
    for (int i = 0; i < 300; i++) {
        size_t len = 0;
        char *l = file_read_all(srv.log, 1 << 20, &len);
        int rounds = 0;
        for (const char *p = l; p && (p = strstr(p, "older removed")); p++) rounds++;
        free(l);
        if (rounds >= 4) break;
        ty_sleep_ms(100);
    }
    ty_kill(&srv, SIGTERM);
    n = s3_keys(&dev, "backups", "backups/", keys, 64);
    int manifests = 0;
    for (int i = 0; i < n && i < 64; i++) manifests += strstr(keys[i], "/manifest.json") != NULL;
    ck_assert_int_eq(manifests, 2);
}
END_TEST

/* Checkpoints kept in an s3 blob store (--blob-store): a folder backup
 * lists the objects the snapshot's rows name; restore HEADs each ("all
 * present"), the server on the restored directory serves the same bytes;
 * an object removed from the bucket is named and the restore refused,
 * --allow-missing restores with its row marked deleted. */
START_TEST(checkpoints_in_s3) {
    if (!s3_up) return;
    char data[320], data3[320], spec[512], out[8192];
    snprintf(data, sizeof data, "%s/data", base);
    snprintf(data3, sizeof data3, "%s/data3", base);
    ck_assert_int_eq(s3_bucket(&dev, "ckpts"), 0);
    s3_spec(&dev, "ckpts", spec, sizeof spec);
    const char *more[] = {"--blob-store", spec, "--blob-credentials", dev.creds, NULL};
    server_on(data, more);
    agent_start();
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t done = ty_submit_script(&S, "done", "0.5,0.4", "-");
    ty_wait_job_state(&S, done, "succeeded", 90);
    for (int i = 0; ty_ckpt_count(&S, done) != 1; i++) {
        ck_assert_msg(i < 600, "the finished job kept %d checkpoints", ty_ckpt_count(&S, done));
        ty_sleep_ms(100);
    }
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)done);
    cJSON *o = NULL;
    ck_assert_int_eq(get(team_tok, path, &o), 200);
    cJSON *arr = cJSON_IsArray(o) ? o : cJSON_GetObjectItem(o, "checkpoints");
    int64_t cid = (int64_t)ty_num(cJSON_GetArrayItem(arr, 0), "id");
    cJSON_Delete(o);
    char sha[65], sha2[65];
    ty_ckpt_sha(&S, done, cid, sha);
    const char *bargs[] = {"backup", dest, "--url", srv.url, "--token", admin_tok, "--json", NULL};
    int rc = run_ty(out, sizeof out, bargs);
    ck_assert_msg(rc == 0, "trainyard backup: %d: %s", rc, out);
    cJSON *sum = cJSON_Parse(out);
    ck_assert_ptr_nonnull(sum);
    ck_assert_int_eq((int)ty_num(sum, "manifest_objects"), 1);
    ck_assert_int_eq((int)ty_num(sum, "blobs"), 0);
    cJSON_Delete(sum);
    rm_tree(data);
    ty_kill(&srv, SIGKILL);
    const char *rargs[] = {"restore", dest, "--data", data2, "--blob-credentials", dev.creds, NULL};
    rc = run_ty(out, sizeof out, rargs);
    ck_assert_msg(rc == 0 && strstr(out, "1 checkpoints (0 local, 1 in another store, all present)"), "%d: %s", rc, out);
    printf("restore, checkpoints in s3: %s", out);
    server_on(data2, more);
    ty_ckpt_sha(&S, done, cid, sha2);
    ck_assert_str_eq(sha, sha2);
    ty_kill(&srv, SIGTERM);
    /* the object gone from the bucket */
    char keys[16][256];
    int n = s3_keys(&dev, "ckpts", "checkpoints/", keys, 16);
    ck_assert_int_eq(n, 1);
    char del[300];
    snprintf(del, sizeof del, "/ckpts/%s", keys[0]);
    ck_assert_int_eq(s3_req(&dev, "DELETE", del, NULL, NULL), 204);
    const char *r3[] = {"restore", dest, "--data", data3, "--blob-credentials", dev.creds, NULL};
    rc = run_ty(out, sizeof out, r3);
    ck_assert_msg(rc == 1 && strstr(out, keys[0]), "%d: %s", rc, out);
    const char *r4[] = {"restore", dest, "--data", data3, "--blob-credentials", dev.creds, "--allow-missing", NULL};
    rc = run_ty(out, sizeof out, r4);
    ck_assert_msg(rc == 0 && strstr(out, "1 of them missing and marked deleted"), "%d: %s", rc, out);
}
END_TEST

/* ---------------------------------------------------------------- writers during a backup */

static int64_t now_us_test(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct submitter {
    const char *url, *tok;
    volatile int *stop;
    int64_t max_us;
    int n;
} submitter;

static void *submit_loop(void *arg) {
    submitter *s = arg;
    client c;
    if (client_init(&c, s->url, s->tok) < 0) return NULL;
    const char *spec = "{\"name\":\"w\",\"command\":{\"argv\":[\"/bin/true\"]}}";
    while (!*s->stop) {
        client_reply r;
        int64_t t0 = now_us_test();
        int rc = client_request(&c, "POST", "/api/v1/jobs", spec, strlen(spec), NULL, &r);
        int64_t us = now_us_test() - t0;
        if (rc == 0 && r.status == 201) {
            s->n++;
            if (us > s->max_us) s->max_us = us;
        }
        client_reply_release(&r);
    }
    client_release(&c);
    return NULL;
}

/* A second backup asked while one runs: its status. */
typedef struct second_ask {
    const char *body;
    long status;
} second_ask;

static void *ask_again(void *arg) {
    second_ask *a = arg;
    ty_sleep_ms(100);
    client c;
    if (client_init(&c, srv.url, admin_tok) < 0) return NULL;
    client_reply r;
    if (client_request(&c, "POST", "/api/v1/backups", a->body, strlen(a->body), NULL, &r) == 0) a->status = r.status;
    client_reply_release(&r);
    client_release(&c);
    return NULL;
}

/* n clients submitting for ms milliseconds, or until *stop; the longest
 * submission (us) and the count. */
static void submitters_start(submitter *s, pthread_t *th, int n, volatile int *stop) {
    for (int i = 0; i < n; i++) {
        s[i] = (submitter){srv.url, team_tok, stop, 0, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, submit_loop, &s[i]), 0);
    }
}

static void submitters_join(submitter *s, pthread_t *th, int n, int64_t *max_us, int *count) {
    *max_us = 0;
    *count = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (s[i].max_us > *max_us) *max_us = s[i].max_us;
        *count += s[i].n;
    }
}

#define WRITERS 8
#define PAD_MB 128

START_TEST(writers_not_blocked) {
    char data[320], dbp[400];
    snprintf(data, sizeof data, "%s/data", base);
    server_on(data, NULL);
    ty_kill(&srv, SIGTERM);
    /* a database of PAD_MB MiB more (its pages are what the snapshot copies) */
    snprintf(dbp, sizeof dbp, "%s/trainyard.db", data);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbp, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "CREATE TABLE backup_test_pad(b BLOB)", NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < PAD_MB; i++)
        ck_assert_int_eq(sqlite3_exec(db, "INSERT INTO backup_test_pad VALUES(randomblob(1048576))", NULL, NULL, NULL),
                         SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    server_on(data, NULL);
    ty_token(&srv, "token", team_tok, sizeof team_tok);

    submitter s[WRITERS];
    pthread_t th[WRITERS];
    char body[600];
    snprintf(body, sizeof body, "{\"dest\":\"%s\"}", dest);
    /* Up to 3 rounds: the suite may run beside others (tests/run_all.sh), whose
     * load can stall one submission at any time; a writer blocked by the
     * snapshot would be so in every round. */
    int ok = 0;
    double snap = 0, worst = 0;
    for (int round = 0; round < 3 && !ok; round++) {
        volatile int stop = 0;
        int64_t max_without = 0, max_during = 0;
        int n_without = 0, n_during = 0;
        /* without a backup */
        submitters_start(s, th, WRITERS, &stop);
        ty_sleep_ms(2000);
        stop = 1;
        submitters_join(s, th, WRITERS, &max_without, &n_without);
        /* during one */
        stop = 0;
        submitters_start(s, th, WRITERS, &stop);
        ty_sleep_ms(300);
        cJSON *o = NULL;
        second_ask again = {body, 0};
        pthread_t ath;
        ck_assert_int_eq(pthread_create(&ath, NULL, ask_again, &again), 0);
        int64_t t0 = mono_ms();
        ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/backups", body, &o), 201);
        int64_t took = mono_ms() - t0;
        pthread_join(ath, NULL);
        if (took > 400) ck_assert_int_eq(again.status, 409); /* one at a time: backup_running */
        ty_sleep_ms(300);
        stop = 1;
        submitters_join(s, th, WRITERS, &max_during, &n_during);
        snap = ty_num(o, "snapshot_ms");
        double mib = ty_num(o, "db_bytes") / 1048576.0;
        printf("writers: %d clients submitting; the longest submission %.1f ms without a backup (%d submitted in 2 s), "
               "%.1f ms during a backup (%d submitted) of a %.0f MiB database: snapshot %.0f ms, backup %lld ms\n",
               WRITERS, (double)max_without / 1000.0, n_without, (double)max_during / 1000.0, n_during, mib, snap,
               (long long)took);
        fflush(stdout);
        cJSON_Delete(o);
        ck_assert_int_ge((int)mib, PAD_MB);
        ck_assert_int_gt(n_during, 0);
        /* a writer blocked by the snapshot would wait for about all of its read
         * transaction (they submit without pause: one comes as it begins); the
         * backup's own disk writes and CPU on shared cores cost some, not that */
        worst = (double)max_during / 1000.0;
        ok = snap < 200 || worst < (double)max_without / 1000.0 + snap * 0.75;
    }
    ck_assert_msg(ok, "in 3 rounds, a submission took %.1f ms during a snapshot of %.0f ms (the last)", worst, snap);
}
END_TEST

int main(void) {
    Suite *s = suite_create("backup");
    tcase_add_test(ty_tcase(s, "restore", setup, teardown, 300), data_removed_under_a_running_cluster);
    tcase_add_test(ty_tcase(s, "periodic", setup, teardown, 120), periodic_backups_keep_two);
    tcase_add_test(ty_tcase(s, "refusals", setup, teardown, 120), restore_refusals);
    tcase_add_test(ty_tcase(s, "store", setup, teardown, 120), objects_in_another_store);
    TCase *s3 = ty_tcase(s, "s3", setup_s3, teardown_s3, 300);
    tcase_add_test(s3, s3_destination);
    tcase_add_test(s3, checkpoints_in_s3);
    tcase_add_test(ty_tcase(s, "writers", setup, teardown, 300), writers_not_blocked);
    return ty_run_suite(s);
}
