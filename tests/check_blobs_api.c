/* check_blobs_api.c - the server's blob-store routes against a real S3 store
 * (radosgw, tests/s3_fixture.h), driven as a task: `trainyard up` with
 * --blob-store s3://..., a command job that hands the test its config (its
 * task token) and sleeps. A checkpoint uploaded in three parts straight to
 * the store over the presigned URLs (curl), where a part with other bytes
 * is refused by the store, a complete with a part missing is a 409 and
 * then, with every part, a 201 (again 201: idempotent); the download is a
 * 307 to a presigned GET whose bytes match the sha256 it names, and
 * ?via=server relays the same bytes; an upload left open is aborted by the
 * housekeeping tick past --blob-upload-max-age (no multipart upload left
 * in the store); DELETE /jobs removes the job's objects; a server whose
 * store does not answer does not start (one line, exit 1). */
#include "testlib.h"
#include "s3_fixture.h"
#include "../client/client.h"

#include <limits.h>
#include <strings.h>

static s3_dev dev;
static int s3_ready;                  /* 1 started, 0 skipped, -1 failed */
static char s3_why[256];
static ty_proc srv;
static char bucket[64], spec[512], tmpdir[256], admin_tok[128], task_tok[256];
static int64_t job;

#define MAX_AGE "4"

/* the task's config written where the test reads it, then a long sleep */
static void start_job(void) {
    char argv_sh[1400];
    snprintf(argv_sh, sizeof argv_sh,
             "{\"name\":\"uploader\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
             "\"printf '%%s' \\\"$TRAINYARD_CONFIG\\\" > %s/cfg.tmp && mv %s/cfg.tmp %s/cfg.json; sleep 300\"]},"
             "\"max_restarts\":0,\"checkpoint\":{\"keep\":2}}",
             tmpdir, tmpdir, tmpdir);
    char team_tok[128];
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    job = ty_submit(srv.url, team_tok, argv_sh);
    char path[320];
    snprintf(path, sizeof path, "%s/cfg.json", tmpdir);
    int64_t end = mono_ms() + 60000;
    char *text = NULL;
    size_t len = 0;
    while (!(text = file_read_all(path, 1 << 16, &len))) {
        ck_assert_msg(mono_ms() < end, "job %lld did not start (see %s)", (long long)job, srv.log);
        ty_sleep_ms(100);
    }
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    ck_assert_ptr_nonnull(cfg);
    snprintf(task_tok, sizeof task_tok, "%s", ty_str(cfg, "token"));
    ck_assert_int_gt((int)strlen(task_tok), 10);
    cJSON_Delete(cfg);
}

static void setup(void) {
    if (s3_ready != 1) return;
    static int n;
    snprintf(bucket, sizeof bucket, "blobsapi-%d-%d", (int)getpid(), ++n);
    ck_assert_int_eq(s3_bucket(&dev, bucket), 0);
    s3_spec(&dev, bucket, spec, sizeof spec);
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "blobsapi");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "blobsapitmp");
    const char *extra[] = {"--cpu-slots", "1", "--blob-store", spec, "--blob-credentials", dev.creds,
                           "--blob-upload-max-age", MAX_AGE, NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    start_job();
}

static void teardown(void) {
    if (s3_ready != 1) return;
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
}

#define REQUIRE_S3()                                                                                 \
    do {                                                                                             \
        if (s3_ready == 0) {                                                                         \
            fprintf(stderr, "SKIP %s: %s\n", __func__, s3_why);                                      \
            return;                                                                                  \
        }                                                                                            \
        ck_assert_msg(s3_ready == 1, "no S3 store: %s", s3_why);                                     \
    } while (0)

/* ---------------------------------------------------------------- helpers */

/* Runs curl; the HTTP status it printed last, or -1. */
static long curl_run(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "curl -s -w '\\n%%{http_code}' %s", args);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    char line[512], last[512] = "";
    while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
    pclose(f);
    long code = -1;
    if (parse_long(strtok(last, "\r\n") ? last : "", 0, 999, &code) < 0) code = -1;
    return code;
}

/* PUT the file's bytes to a presigned URL with the Content-MD5 given. */
static long put_part(const char *url, const char *md5, const char *file) {
    char args[6000];
    snprintf(args, sizeof args, "-o /dev/null -X PUT -H 'Content-MD5: %s' -H 'Expect:' --data-binary @%s '%s'", md5,
             file, url);
    return curl_run(args);
}

typedef struct upload {
    char token[65];
    char urls[8][2048];
    char md5[8][32];
    int parts;
} upload;

static void b64_md5(const void *data, size_t n, char out[32]) {
    unsigned char m[16];
    md5_raw(data, n, m);
    ck_assert_int_ge(base64_encode(m, 16, out, 32), 0);
}

static long api(const char *method, const char *path, const char *body, cJSON **out) {
    return ty_http(srv.url, task_tok, method, path, body, out);
}

/* POST .../uploads for data cut in parts of part_bytes: 201 and u filled. */
static long begin(const unsigned char *data, size_t len, size_t part_bytes, long step, upload *u, cJSON **out) {
    memset(u, 0, sizeof *u);
    u->parts = (int)((len + part_bytes - 1) / part_bytes);
    ck_assert_int_le(u->parts, 8);
    char sha[65];
    sha256_hex(data, len, sha);
    buf b;
    buf_init(&b, 1 << 16);
    buf_printf(&b, "{\"step\":%ld,\"epoch\":1,\"size\":%zu,\"sha256\":\"%s\",\"part_bytes\":%zu,\"md5\":[", step, len,
               sha, part_bytes);
    for (int i = 0; i < u->parts; i++) {
        size_t off = (size_t)i * part_bytes, n = len - off < part_bytes ? len - off : part_bytes;
        b64_md5(data + off, n, u->md5[i]);
        buf_printf(&b, "%s\"%s\"", i ? "," : "", u->md5[i]);
    }
    buf_appends(&b, "]}");
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)job);
    long st = api("POST", path, b.data, out);
    buf_release(&b);
    if (st != 201) return st;
    snprintf(u->token, sizeof u->token, "%s", ty_str(*out, "upload"));
    cJSON *parts = cJSON_GetObjectItem(*out, "parts");
    ck_assert_int_eq(cJSON_GetArraySize(parts), u->parts);
    int i = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, parts) {
        ck_assert_int_eq((int)ty_num(p, "n"), i + 1);
        snprintf(u->urls[i], sizeof u->urls[i], "%s", ty_str(p, "url"));
        cJSON *h = cJSON_GetObjectItem(p, "headers");
        ck_assert_str_eq(ty_str(h, "Content-MD5"), u->md5[i]);
        i++;
    }
    return st;
}

static void write_file(const char *path, const void *data, size_t n) {
    ck_assert_int_eq(file_write_atomic(path, data, n, 0644), 0);
}

static long complete(const upload *u, cJSON **out) {
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/complete", (long long)job, u->token);
    return api("POST", path, "{}", out);
}

static long blob_store_open_uploads(void) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/blob-store", NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "kind"), "s3");
    ck_assert_ptr_null(strstr(ty_str(o, "url"), dev.secret)); /* never the secret */
    long n = (long)ty_num(o, "uploads_open");
    cJSON_Delete(o);
    return n;
}

/* ---------------------------------------------------------------- cases */

START_TEST(upload_verify_download_delete) {
    REQUIRE_S3();
    const size_t part = 5u << 20, len = 2 * part + 12345;
    unsigned char *data = xmalloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (unsigned char)((i * 2654435761u) >> 13);
    char sha[65];
    sha256_hex(data, len, sha);
    char f[3][320], other[320];
    for (int i = 0; i < 3; i++) {
        snprintf(f[i], sizeof f[i], "%s/part%d", tmpdir, i + 1);
        size_t off = (size_t)i * part;
        write_file(f[i], data + off, len - off < part ? len - off : part);
    }
    snprintf(other, sizeof other, "%s/other", tmpdir);
    write_file(other, data, part); /* part 1's bytes */

    /* bad requests change nothing and name the field */
    cJSON *o = NULL;
    char path[200];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)job);
    ck_assert_int_eq(api("POST", path, "{\"step\":1,\"epoch\":1,\"size\":100,\"part_bytes\":100,\"md5\":[]}", &o), 422);
    ty_assert_error(o, "missing_field", "sha256");
    cJSON_Delete(o);
    upload u;
    ck_assert_int_eq(begin(data, len, 2u << 20, 1, &u, &o), 422); /* 2 MiB parts: too small */
    ty_assert_error(o, "invalid_value", "part_bytes");
    cJSON_Delete(o);
    ck_assert_int_eq(blob_store_open_uploads(), 0);

    ck_assert_int_eq(begin(data, len, part, 100, &u, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    ck_assert_int_eq(blob_store_open_uploads(), 1);
    /* part 2's URL with part 1's bytes: the store refuses them */
    long st = put_part(u.urls[1], u.md5[1], other);
    ck_assert_msg(st == 400, "a part with other bytes: %ld", st);
    ck_assert_int_eq(put_part(u.urls[0], u.md5[0], f[0]), 200);
    ck_assert_int_eq(put_part(u.urls[2], u.md5[2], f[2]), 200);
    ck_assert_int_eq(complete(&u, &o), 409); /* part 2 missing */
    ty_assert_error(o, "upload_incomplete", NULL);
    cJSON_Delete(o);
    /* a fresh URL for part 2, then the right bytes */
    char body[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/parts", (long long)job, u.token);
    snprintf(body, sizeof body, "{\"parts\":[2]}");
    ck_assert_int_eq(api("POST", path, body, &o), 200);
    cJSON *p2 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "parts"), 0);
    ck_assert_int_eq((int)ty_num(p2, "n"), 2);
    ck_assert_int_eq(put_part(ty_str(p2, "url"), u.md5[1], f[1]), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(complete(&u, &o), 201);
    int64_t cid = (int64_t)ty_num(o, "id");
    ck_assert_int_gt(cid, 0);
    ck_assert_str_eq(ty_str(o, "sha256"), sha);
    ck_assert_int_eq((int64_t)ty_num(o, "size"), (int64_t)len);
    ck_assert_int_eq((int64_t)ty_num(o, "step"), 100);
    cJSON_Delete(o);
    ck_assert_int_eq(complete(&u, &o), 201); /* a retry: the same answer */
    ck_assert_int_eq((int64_t)ty_num(o, "id"), cid);
    cJSON_Delete(o);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 0);
    ck_assert_int_eq(blob_store_open_uploads(), 0);
    ck_assert_int_eq(api("POST", path, body, &o), 409); /* done: no more URLs */
    ty_assert_error(o, "upload_closed", NULL);
    cJSON_Delete(o);

    /* the download: a 307 to the store, whose bytes are the sha256 named */
    char out[320], hdr[320], args[4096];
    snprintf(out, sizeof out, "%s/got", tmpdir);
    snprintf(hdr, sizeof hdr, "%s/hdr", tmpdir);
    snprintf(args, sizeof args, "-D %s -o /dev/null -H 'Authorization: Bearer %s' '%s/api/v1/jobs/%lld/checkpoints/latest'",
             hdr, task_tok, srv.url, (long long)job);
    ck_assert_int_eq(curl_run(args), 307);
    size_t hl = 0;
    char *h = file_read_all(hdr, 1 << 16, &hl);
    ck_assert_ptr_nonnull(h);
    char loc[2048] = "", sum[80] = "";
    for (char *line = strtok(h, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        if (strncasecmp(line, "Location: ", 10) == 0) snprintf(loc, sizeof loc, "%s", line + 10);
        if (strncasecmp(line, "X-Checksum-Sha256: ", 19) == 0) snprintf(sum, sizeof sum, "%s", line + 19);
    }
    free(h);
    ck_assert_str_eq(sum, sha);
    ck_assert_msg(strncmp(loc, dev.endpoint, strlen(dev.endpoint)) == 0, "Location %.80s is not the store", loc);
    snprintf(args, sizeof args, "-o %s '%s'", out, loc); /* no Authorization: the URL is the capability */
    ck_assert_int_eq(curl_run(args), 200);
    size_t gl = 0;
    char *got = file_read_all(out, len + 1, &gl);
    ck_assert_ptr_nonnull(got);
    char gsha[65];
    sha256_hex(got, gl, gsha);
    free(got);
    ck_assert_str_eq(gsha, sha);
    /* relayed by the server */
    unlink(out);
    snprintf(args, sizeof args, "-o %s -H 'Authorization: Bearer %s' '%s/api/v1/jobs/%lld/checkpoints/%lld?via=server'",
             out, task_tok, srv.url, (long long)job, (long long)cid);
    ck_assert_int_eq(curl_run(args), 200);
    got = file_read_all(out, len + 1, &gl);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(gl, len);
    sha256_hex(got, gl, gsha);
    free(got);
    ck_assert_str_eq(gsha, sha);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest?via=store", (long long)job);
    ck_assert_int_eq(api("GET", path, NULL, &o), 422);
    ty_assert_error(o, "invalid_value", "via");
    cJSON_Delete(o);

    /* a one-part checkpoint the old way (PUT through the server) lands in
     * the store too, and prunes nothing yet (keep 2) */
    char keys[8][256];
    char prefix[64];
    snprintf(prefix, sizeof prefix, "checkpoints/%lld/", (long long)job);
    ck_assert_int_eq(s3_keys(&dev, bucket, prefix, keys, 8), 1);
    ck_assert_int_eq(begin(data, 1000, 1000, 200, &u, &o), 201);
    cJSON_Delete(o);
    write_file(f[0], data, 1000);
    ck_assert_int_eq(put_part(u.urls[0], u.md5[0], f[0]), 200);
    ck_assert_int_eq(complete(&u, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(begin(data, 2000, 2000, 300, &u, &o), 201);
    cJSON_Delete(o);
    write_file(f[0], data, 2000);
    ck_assert_int_eq(put_part(u.urls[0], u.md5[0], f[0]), 200);
    ck_assert_int_eq(complete(&u, &o), 201); /* the third: the first pruned, its object removed */
    cJSON_Delete(o);
    ck_assert_int_eq(s3_keys(&dev, bucket, prefix, keys, 8), 2);

    /* DELETE /jobs: the job's objects go */
    char team_tok[128];
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    /* the job ended: the collection keeps its newest checkpoint only, and
     * removes the other's object */
    int64_t end = mono_ms() + 60000;
    while (s3_keys(&dev, bucket, prefix, keys, 8) != 1) {
        ck_assert_msg(mono_ms() < end, "the ended job's older checkpoint is still in the store (see %s)", srv.log);
        ty_sleep_ms(250);
    }
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 1);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)job);
    for (;;) {
        long ds = ty_http(srv.url, team_tok, "DELETE", path, NULL, &o);
        cJSON_Delete(o);
        if (ds == 200 || ds == 204) break;
        ck_assert_msg(ds == 409 && mono_ms() < end, "DELETE /jobs/%lld: %ld", (long long)job, ds);
        ty_sleep_ms(200);
    }
    ck_assert_int_eq(s3_keys(&dev, bucket, prefix, keys, 8), 0);
    free(data);
}
END_TEST

START_TEST(expired_upload_aborted) {
    REQUIRE_S3();
    const size_t part = 5u << 20, len = part + 10;
    unsigned char *data = xcalloc(1, len);
    upload u;
    cJSON *o = NULL;
    ck_assert_int_eq(begin(data, len, part, 5, &u, &o), 201);
    cJSON_Delete(o);
    char f[320];
    snprintf(f, sizeof f, "%s/p1", tmpdir);
    write_file(f, data, part);
    ck_assert_int_eq(put_part(u.urls[0], u.md5[0], f), 200);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    /* --blob-upload-max-age 4: the tick aborts it, parts and all */
    int64_t end = mono_ms() + 20000;
    while (s3_open_uploads(&dev, bucket, "checkpoints/") != 0 || blob_store_open_uploads() != 0) {
        ck_assert_msg(mono_ms() < end, "the expired upload is still open (see %s)", srv.log);
        ty_sleep_ms(250);
    }
    ck_assert_int_eq(complete(&u, &o), 409);
    ty_assert_error(o, "upload_closed", NULL);
    cJSON_Delete(o);
    char keys[4][256];
    ck_assert_int_eq(s3_keys(&dev, bucket, "checkpoints/", keys, 4), 0);
    /* and /metrics counts it, with none open now */
    client c;
    client_reply r;
    ck_assert_int_eq(client_init(&c, srv.url, admin_tok), 0);
    ck_assert_int_eq(client_request(&c, "GET", "/metrics", NULL, 0, NULL, &r), 0);
    client_release(&c);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body.data, "\ntrainyard_blob_uploads_open 0\n"));
    const char *m = strstr(r.body.data, "\ntrainyard_blob_uploads_expired_total ");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_ge(atoll(m + strlen("\ntrainyard_blob_uploads_expired_total ")), 1);
    ck_assert_ptr_nonnull(strstr(r.body.data, "\ntrainyard_blob_store_errors_total{class=\"unavailable\"} "));
    client_reply_release(&r);
    free(data);
}
END_TEST

/* The team's storage quota counts its open uploads: two 10 MiB
 * reservations under a 15 MiB quota do not both pass; the first one
 * aborted (DELETE: its multipart upload gone from the store), the
 * second passes. */
START_TEST(quota_counts_open_uploads) {
    REQUIRE_S3();
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"storage_quota\":\"15MiB\"}", &o),
                     200);
    cJSON_Delete(o);
    const size_t part = 5u << 20, len = 2 * part;
    unsigned char *data = xcalloc(1, len);
    upload a, b;
    ck_assert_int_eq(begin(data, len, part, 1, &a, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(begin(data, len, part, 2, &b, &o), 507);
    ty_assert_error(o, "storage_quota", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    char path[200];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s", (long long)job, a.token);
    ck_assert_int_eq(ty_http(srv.url, task_tok, "DELETE", path, NULL, NULL), 204);
    ck_assert_int_eq(ty_http(srv.url, task_tok, "DELETE", path, NULL, NULL), 204); /* again: aborted already */
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 0);
    ck_assert_int_eq(complete(&a, &o), 409);
    ty_assert_error(o, "upload_closed", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(begin(data, len, part, 2, &b, &o), 201);
    cJSON_Delete(o);
    ck_assert_int_eq(blob_store_open_uploads(), 1);
    /* the PUT through the server counts the open upload too */
    char f[320], sha[65], args[2048];
    snprintf(f, sizeof f, "%s/six", tmpdir);
    write_file(f, data, 6u << 20);
    sha256_hex(data, 6u << 20, sha);
    snprintf(args, sizeof args,
             "-o /dev/null -X PUT -H 'Authorization: Bearer %s' -H 'Content-Type: application/octet-stream' "
             "-H 'X-Checksum-Sha256: %s' --data-binary @%s '%s/api/v1/jobs/%lld/checkpoints?step=3&epoch=1'",
             task_tok, sha, f, srv.url, (long long)job);
    ck_assert_int_eq(curl_run(args), 507);
    free(data);
}
END_TEST

/* A context goes through the server (it checks the tar), then to
 * contexts/<hex> in the store; its download is a 307 to the store (or
 * relayed), and its deletion removes the object. */
START_TEST(context_in_the_store) {
    REQUIRE_S3();
    char src[320], tgz[320], cmd[2048], args[4096], hdr[320], out[320];
    snprintf(src, sizeof src, "%s/ctx", tmpdir);
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && echo 'print(1)' > %s/train.py && tar -C %s -czf %s train.py", src, src,
             src, tgz);
    ck_assert_int_eq(system(cmd), 0);
    size_t n = 0;
    char *bytes = file_read_all(tgz, 1 << 20, &n);
    ck_assert_ptr_nonnull(bytes);
    char digest[65];
    sha256_hex(bytes, n, digest);
    free(bytes);
    char team_tok[128];
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    snprintf(args, sizeof args,
             "-o /dev/null -X POST -H 'Authorization: Bearer %s' -H 'Content-Type: application/gzip' "
             "--data-binary @%s '%s/api/v1/contexts'",
             team_tok, tgz, srv.url);
    ck_assert_int_eq(curl_run(args), 201);
    char keys[4][256], key[96];
    snprintf(key, sizeof key, "contexts/%s", digest);
    ck_assert_int_eq(s3_keys(&dev, bucket, "contexts/", keys, 4), 1);
    ck_assert_str_eq(keys[0], key);
    /* the download: a 307 to the store */
    snprintf(hdr, sizeof hdr, "%s/chdr", tmpdir);
    snprintf(out, sizeof out, "%s/cgot", tmpdir);
    snprintf(args, sizeof args, "-D %s -o /dev/null -H 'Authorization: Bearer %s' '%s/api/v1/contexts/sha256:%s'", hdr,
             team_tok, srv.url, digest);
    ck_assert_int_eq(curl_run(args), 307);
    size_t hl = 0;
    char *h = file_read_all(hdr, 1 << 16, &hl);
    ck_assert_ptr_nonnull(h);
    char loc[2048] = "", sum[80] = "";
    for (char *line = strtok(h, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        if (strncasecmp(line, "Location: ", 10) == 0) snprintf(loc, sizeof loc, "%s", line + 10);
        if (strncasecmp(line, "X-Checksum-Sha256: ", 19) == 0) snprintf(sum, sizeof sum, "%s", line + 19);
    }
    free(h);
    ck_assert_str_eq(sum, digest);
    snprintf(args, sizeof args, "-o %s '%s'", out, loc);
    ck_assert_int_eq(curl_run(args), 200);
    char *got = file_read_all(out, 1 << 20, &n);
    ck_assert_ptr_nonnull(got);
    char gsha[65];
    sha256_hex(got, n, gsha);
    free(got);
    ck_assert_str_eq(gsha, digest);
    unlink(out);
    snprintf(args, sizeof args, "-o %s -H 'Authorization: Bearer %s' '%s/api/v1/contexts/sha256:%s?via=server'", out,
             team_tok, srv.url, digest);
    ck_assert_int_eq(curl_run(args), 200);
    got = file_read_all(out, 1 << 20, &n);
    ck_assert_ptr_nonnull(got);
    sha256_hex(got, n, gsha);
    free(got);
    ck_assert_str_eq(gsha, digest);
    /* deleted: the last row of the digest, so the object goes */
    snprintf(args, sizeof args, "-o /dev/null -X DELETE -H 'Authorization: Bearer %s' '%s/api/v1/contexts/sha256:%s'",
             team_tok, srv.url, digest);
    ck_assert_int_eq(curl_run(args), 204);
    ck_assert_int_eq(s3_keys(&dev, bucket, "contexts/", keys, 4), 0);
}
END_TEST

/* A store that does not answer: one line naming it, exit 1, nothing listened. */
START_TEST(unreachable_store_refused) {
    REQUIRE_S3();
    char dir[256], cmd[1400], log[320];
    ty_mkdtemp(dir, sizeof dir, "blobsdown");
    int port = ty_free_port();
    snprintf(log, sizeof log, "%s/err", dir);
    snprintf(cmd, sizeof cmd,
             "%s server --listen 127.0.0.1:0 --data %s/d --blob-store 's3://%s?endpoint=http://127.0.0.1:%d' "
             "--blob-credentials %s 2>%s",
             ty_bin(), dir, bucket, port, dev.creds, log);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    size_t n = 0;
    char *text = file_read_all(log, 1 << 16, &n);
    ck_assert_ptr_nonnull(text);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    ck_assert_msg(lines == 1, "%d lines: %s", lines, text);
    char want[128];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    ck_assert_msg(strstr(text, "blob store") && strstr(text, want), "the line names the store: %s", text);
    ck_assert_ptr_null(strstr(text, dev.secret));
    ck_assert_ptr_null(strstr(text, "listening"));
    free(text);
    ty_rmrf(dir);
}
END_TEST

/* ---------------------------------------------------------------- file:// */

static char froot[256];

static void setup_file(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "blobsfile");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "blobsfiletmp");
    ty_mkdtemp(froot, sizeof froot, "blobsroot");
    snprintf(spec, sizeof spec, "file://%s", froot);
    const char *extra[] = {"--cpu-slots", "1", "--blob-store", spec, NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    start_job();
}

static void teardown_file(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
    ty_rmrf(froot);
}

/* A shared folder: the PUT writes the checkpoint under it (not under
 * DATA), GET serves it from there, the upload routes send the task to the
 * PUT, DELETE /jobs removes the files. */
START_TEST(file_store_keeps_the_layout) {
    char body[320], args[2048];
    snprintf(body, sizeof body, "%s/ck", tmpdir);
    const char *bytes = "weights of a shared folder";
    write_file(body, bytes, strlen(bytes));
    char sha[65];
    sha256_hex(bytes, strlen(bytes), sha);
    snprintf(args, sizeof args,
             "-o /dev/null -X PUT -H 'Authorization: Bearer %s' -H 'Content-Type: application/octet-stream' "
             "-H 'X-Checksum-Sha256: %s' --data-binary @%s '%s/api/v1/jobs/%lld/checkpoints?step=1&epoch=1'",
             task_tok, sha, body, srv.url, (long long)job);
    ck_assert_int_eq(curl_run(args), 201);
    cJSON *o = NULL;
    char path[200];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(api("GET", path, NULL, &o), 200);
    int64_t cid = (int64_t)ty_num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "checkpoints"), 0), "id");
    cJSON_Delete(o);
    char file[600];
    snprintf(file, sizeof file, "%s/checkpoints/%lld/%lld.safetensors", froot, (long long)job, (long long)cid);
    size_t n = 0;
    char *got = file_read_all(file, 1 << 20, &n);
    ck_assert_msg(got != NULL, "%s is not there", file);
    ck_assert_int_eq(n, strlen(bytes));
    free(got);
    snprintf(file, sizeof file, "%s/checkpoints/%lld/%lld.safetensors", srv.dir, (long long)job, (long long)cid);
    ck_assert_int_ne(access(file, F_OK), 0); /* not under DATA */
    char out[320];
    snprintf(out, sizeof out, "%s/got", tmpdir);
    snprintf(args, sizeof args, "-o %s -H 'Authorization: Bearer %s' '%s/api/v1/jobs/%lld/checkpoints/latest'", out,
             task_tok, srv.url, (long long)job);
    ck_assert_int_eq(curl_run(args), 200);
    got = file_read_all(out, 1 << 20, &n);
    ck_assert_ptr_nonnull(got);
    char gsha[65];
    sha256_hex(got, n, gsha);
    free(got);
    ck_assert_str_eq(gsha, sha);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)job);
    ck_assert_int_eq(api("POST", path, "{}", &o), 409);
    ty_assert_error(o, "upload_via_server", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/blob-store", NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "kind"), "file");
    ck_assert_str_eq(ty_str(o, "url"), spec);
    cJSON_Delete(o);
    /* DELETE /jobs: its files in the folder go */
    char team_tok[128];
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)job);
    int64_t end = mono_ms() + 60000;
    for (;;) {
        long ds = ty_http(srv.url, team_tok, "DELETE", path, NULL, &o);
        cJSON_Delete(o);
        if (ds == 200 || ds == 204) break;
        ck_assert_msg(ds == 409 && mono_ms() < end, "DELETE /jobs/%lld: %ld", (long long)job, ds);
        ty_sleep_ms(200);
    }
    snprintf(file, sizeof file, "%s/checkpoints/%lld/%lld.safetensors", froot, (long long)job, (long long)cid);
    ck_assert_int_ne(access(file, F_OK), 0);
}
END_TEST

/* A row whose bytes are in another store than the server's: 410 naming
 * that store (the server restarted on the same data directory with the
 * default store). */
START_TEST(another_store_is_gone) {
    char body[320], args[2048];
    snprintf(body, sizeof body, "%s/ck", tmpdir);
    write_file(body, "w", 1);
    char sha[65];
    sha256_hex("w", 1, sha);
    snprintf(args, sizeof args,
             "-o /dev/null -X PUT -H 'Authorization: Bearer %s' -H 'Content-Type: application/octet-stream' "
             "-H 'X-Checksum-Sha256: %s' --data-binary @%s '%s/api/v1/jobs/%lld/checkpoints?step=1&epoch=1'",
             task_tok, sha, body, srv.url, (long long)job);
    ck_assert_int_eq(curl_run(args), 201);
    ty_kill(&srv, SIGTERM);
    ty_server_start_args(&srv, "server", NULL);
    cJSON *o = NULL;
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", path, NULL, &o), 410);
    ty_assert_error(o, "gone", NULL);
    const char *msg = ty_str(cJSON_GetObjectItem(o, "error"), "message");
    ck_assert_msg(strstr(msg, spec) != NULL, "the 410 names the store %s: %s", spec, msg);
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    if (!s3_have(s3_why, sizeof s3_why)) {
        s3_ready = s3_required() ? -1 : 0;
        fprintf(stderr, "check_blobs_api: %s%s\n", s3_required() ? "FAIL (S3_TEST_REQUIRED=1): " : "SKIP: ", s3_why);
    } else if (s3_start(&dev, "blobsapi", 1024) == 0) {
        s3_ready = 1;
    } else {
        s3_ready = -1;
        snprintf(s3_why, sizeof s3_why, "scripts/s3-dev.sh start failed (above)");
    }
    Suite *s = suite_create("blobs_api");
    TCase *tc = ty_tcase(s, "s3", setup, teardown, 240);
    tcase_add_test(tc, upload_verify_download_delete);
    tcase_add_test(tc, expired_upload_aborted);
    tcase_add_test(tc, context_in_the_store);
    tcase_add_test(tc, quota_counts_open_uploads);
    tcase_add_test(tc, unreachable_store_refused);
    TCase *tf = ty_tcase(s, "file", setup_file, teardown_file, 120);
    tcase_add_test(tf, file_store_keeps_the_layout);
    tcase_add_test(tf, another_store_is_gone);
    int failed = ty_run_suite(s);
    if (s3_ready == 1) {
        if (failed) dev.keep = 1;
        s3_stop(&dev);
    }
    return failed;
}
