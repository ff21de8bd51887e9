/* check_blob.c - tests for storage/blob: the local stores (DATA and
 * file://: put/get/head/list/delete, modes, missing keys, bad keys, the
 * probe), the parsing of store specs and credentials files, the
 * common/util helpers they bring (md5_raw, base64_encode, url_redact), and
 * the s3 store against a real radosgw (tests/s3_fixture.h): objects,
 * paged lists, multipart uploads completed and aborted, presigned URLs
 * used with libcurl (Content-MD5 enforced, bound to their key, expiry,
 * GET with a file name), the start check's answers (wrong secret, unknown
 * key, no bucket, closed port), many threads on one store. The s3 cases
 * say SKIP and why when radosgw cannot run here, unless S3_TEST_REQUIRED=1. */
#include <check.h>
#include <curl/curl.h>
#include <pthread.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "../storage/blob.h"
#include "../storage/blob_int.h" /* list_page: small pages for the paging case */
#include "s3_fixture.h"

static void mkscratch(char *out, size_t n) {
    snprintf(out, n, "/tmp/ty_blob_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(out));
}

static void rmrf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!getenv("TY_KEEP")) ck_assert_int_eq(system(cmd), 0);
}

static void write_file(const char *path, const char *text, int mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    ck_assert_int_eq(fchmod(fd, mode), 0);
    close(fd);
}

typedef struct seen {
    int n, stop_after;
    char keys[16][256];
    int64_t sizes[16];
} seen;

static int collect(void *ctx, const char *key, int64_t size) {
    seen *s = ctx;
    ck_assert_int_lt(s->n, 16);
    snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
    s->sizes[s->n++] = size;
    return s->stop_after && s->n >= s->stop_after;
}

static int has_key(const seen *s, const char *key) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->keys[i], key) == 0) return 1;
    return 0;
}

/* no temporary left behind anywhere under dir */
static int count_dot_files(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "find '%s' -name '.*' | wc -l", dir);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int n = -1;
    ck_assert_int_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

static void roundtrip(blob_store *s, const char *root) {
    blob_err e;
    const char *text = "weights of step 3";
    ck_assert_int_eq(blob_put(s, "checkpoints/12/3.safetensors", text, strlen(text), &e), BLOB_OK);
    ck_assert_int_eq(blob_put(s, "checkpoints/1/1.safetensors", "a", 1, &e), BLOB_OK);
    ck_assert_int_eq(blob_put(s, "contexts/abcd", "", 0, &e), BLOB_OK);

    /* layout ROOT/<key>, files 0600, folders 0700 */
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/checkpoints/12/3.safetensors", root);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    ck_assert_int_eq(st.st_size, (off_t)strlen(text));
    snprintf(path, sizeof path, "%s/checkpoints/12", root);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0700);

    int64_t size = -1;
    char etag[80] = "";
    ck_assert_int_eq(blob_head(s, "checkpoints/12/3.safetensors", &size, etag, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)strlen(text));
    ck_assert_int_eq(etag[0], '"');
    ck_assert_int_eq(blob_head(s, "contexts/abcd", &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, 0);

    /* a rewrite replaces the bytes */
    ck_assert_int_eq(blob_put(s, "checkpoints/1/1.safetensors", "bb", 2, &e), BLOB_OK);
    ck_assert_int_eq(blob_head(s, "checkpoints/1/1.safetensors", &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, 2);

    char out[600];
    snprintf(out, sizeof out, "%s-out", root);
    ck_assert_int_eq(blob_get_file(s, "checkpoints/12/3.safetensors", out, &e), BLOB_OK);
    size_t len = 0;
    char *got = file_read_all(out, 1024, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, text);
    free(got);
    ck_assert_int_eq(stat(out, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    unlink(out);

    /* list: a prefix is a string prefix, as S3's */
    seen sn = {0};
    ck_assert_int_eq(blob_list(s, "checkpoints/1", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 2);
    ck_assert(has_key(&sn, "checkpoints/12/3.safetensors"));
    ck_assert(has_key(&sn, "checkpoints/1/1.safetensors"));
    memset(&sn, 0, sizeof sn);
    ck_assert_int_eq(blob_list(s, "checkpoints/1/", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 1);
    ck_assert_str_eq(sn.keys[0], "checkpoints/1/1.safetensors");
    ck_assert_int_eq(sn.sizes[0], 2);
    memset(&sn, 0, sizeof sn);
    ck_assert_int_eq(blob_list(s, "", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 3);
    memset(&sn, 0, sizeof sn);
    sn.stop_after = 1;
    ck_assert_int_eq(blob_list(s, "", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 1);
    memset(&sn, 0, sizeof sn);
    ck_assert_int_eq(blob_list(s, "nothing/here/", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 0);

    /* missing keys */
    ck_assert_int_eq(blob_head(s, "checkpoints/12/9.safetensors", &size, NULL, &e), BLOB_NOT_FOUND);
    ck_assert_int_eq(blob_head(s, "checkpoints/12", &size, NULL, &e), BLOB_NOT_FOUND); /* a folder is no blob */
    ck_assert_int_eq(blob_get_file(s, "checkpoints/12/9.safetensors", out, &e), BLOB_NOT_FOUND);
    ck_assert_int_eq(access(out, F_OK), -1);
    char nodir[700];
    snprintf(nodir, sizeof nodir, "%s-nodir/x", root);
    ck_assert_int_eq(blob_get_file(s, "checkpoints/1/1.safetensors", nodir, &e), BLOB_ERROR); /* the key is there */
    ck_assert_str_eq(e.code, "ENOENT");
    ck_assert_int_eq(blob_delete(s, "checkpoints/12/9.safetensors", &e), BLOB_OK);
    ck_assert_int_eq(blob_delete(s, "nowhere/at/all", &e), BLOB_OK);

    ck_assert_int_eq(blob_delete(s, "checkpoints/12/3.safetensors", &e), BLOB_OK);
    ck_assert_int_eq(blob_head(s, "checkpoints/12/3.safetensors", &size, NULL, &e), BLOB_NOT_FOUND);
    ck_assert_int_eq(blob_delete(s, "checkpoints/12/3.safetensors", &e), BLOB_OK);
    ck_assert_int_eq(count_dot_files(root), 0);

    /* s3-only calls refuse on a local store */
    char id[256], url[512];
    ck_assert_int_eq(blob_mpu_create(s, "checkpoints/1/x", id, &e), BLOB_BAD);
    ck_assert_int_eq(blob_mpu_abort(s, "checkpoints/1/x", "u", &e), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", "checkpoints/1/1.safetensors", NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_store_is_s3(s), 0);
}

START_TEST(data_store_roundtrip) {
    char dir[64];
    mkscratch(dir, sizeof dir);
    blob_store *s = NULL;
    blob_err e;
    ck_assert_int_eq(blob_store_open("DATA", NULL, dir, &s, &e), BLOB_OK);
    ck_assert_str_eq(blob_store_url(s), "");
    ck_assert_str_eq(blob_store_root(s), dir);
    ck_assert_int_eq(blob_store_check(s, &e), BLOB_OK);
    ck_assert_int_eq(count_dot_files(dir), 0);
    roundtrip(s, dir);
    blob_store_close(s);
    /* NULL and "" mean DATA */
    ck_assert_int_eq(blob_store_open(NULL, NULL, dir, &s, &e), BLOB_OK);
    ck_assert_str_eq(blob_store_root(s), dir);
    blob_store_close(s);
    ck_assert_int_eq(blob_store_open("DATA", NULL, "./.trainyard/", &s, &e), BLOB_OK); /* as the server was given it */
    ck_assert_str_eq(blob_store_root(s), "./.trainyard");
    blob_store_close(s);
    ck_assert_int_eq(blob_store_open("DATA", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(blob_store_open("DATA", NULL, "", &s, &e), BLOB_BAD);
    rmrf(dir);
}
END_TEST

START_TEST(file_store_roundtrip) {
    char dir[64], spec[200], root[128], want[200];
    mkscratch(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/shared/store", dir);
    snprintf(spec, sizeof spec, "file://%s//shared/store/", dir); /* normalized */
    snprintf(want, sizeof want, "file://%s", root);
    blob_store *s = NULL;
    blob_err e;
    ck_assert_int_eq(blob_store_open(spec, NULL, "/unused", &s, &e), BLOB_OK);
    ck_assert_str_eq(blob_store_url(s), want);
    ck_assert_str_eq(blob_store_root(s), root);
    ck_assert_int_eq(access(root, F_OK), -1); /* open does no I/O */
    ck_assert_int_eq(blob_store_check(s, &e), BLOB_OK);
    struct stat st;
    ck_assert_int_eq(stat(root, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0700);
    roundtrip(s, root);
    blob_store_close(s);

    /* a root that cannot be made: the check says where and why */
    snprintf(spec, sizeof spec, "file://%s/afile/store", dir);
    char afile[128];
    snprintf(afile, sizeof afile, "%s/afile", dir);
    write_file(afile, "x", 0600);
    ck_assert_int_eq(blob_store_open(spec, NULL, NULL, &s, &e), BLOB_OK);
    ck_assert_int_eq(blob_store_check(s, &e), BLOB_ERROR);
    ck_assert_str_eq(e.code, "ENOTDIR");
    ck_assert_ptr_nonnull(strstr(e.msg, "afile"));
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

START_TEST(put_file_streams_and_get_file_replaces) {
    char dir[64], src[128], dst[128];
    mkscratch(dir, sizeof dir);
    snprintf(src, sizeof src, "%s/src.bin", dir);
    snprintf(dst, sizeof dst, "%s/dst.bin", dir);
    size_t n = 3 * 1024 * 1024 + 17;
    unsigned char *data = xmalloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)(i * 131 + (i >> 12));
    ck_assert_int_eq(file_write_atomic(src, data, n, 0644), 0);
    write_file(dst, "old bytes", 0644);
    blob_store *s = NULL;
    blob_err e;
    char root[128];
    snprintf(root, sizeof root, "%s/data", dir);
    ck_assert_int_eq(blob_store_open("DATA", NULL, root, &s, &e), BLOB_OK);
    ck_assert_int_eq(blob_put_file(s, "backups/big.bin", src, &e), BLOB_OK);
    int64_t size = 0;
    ck_assert_int_eq(blob_head(s, "backups/big.bin", &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)n);
    ck_assert_int_eq(blob_get_file(s, "backups/big.bin", dst, &e), BLOB_OK);
    size_t len = 0;
    char *got = file_read_all(dst, n + 1, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(len, n);
    ck_assert(memcmp(got, data, n) == 0);
    free(got);
    /* a missing source is the caller's mistake, not a missing key */
    char nosrc[160];
    snprintf(nosrc, sizeof nosrc, "%s/none", dir);
    ck_assert_int_eq(blob_put_file(s, "backups/x", nosrc, &e), BLOB_BAD);
    ck_assert_str_eq(e.code, "ENOENT");
    ck_assert_int_eq(blob_put_file(s, "backups/x", dir, &e), BLOB_BAD); /* a folder */
    blob_store_close(s);
    free(data);
    rmrf(dir);
}
END_TEST

START_TEST(bad_keys_refused) {
    static const char *const bad[] = {"", "/abs", "trailing/", "a//b", "../x", "a/../b", "a/..", ".hidden",
                                      "a/.tmp", "a b", "a\\b", "a?b", "a%2fb", "\xc3\xa9", NULL};
    static const char *const good[] = {"checkpoints/12/3-ab_C.safetensors", "contexts/0123abcdef", "a",
                                       "backups/2026-11-28/db.sqlite", "a.b/c.d", NULL};
    char dir[64];
    mkscratch(dir, sizeof dir);
    blob_store *s = NULL;
    blob_err e;
    ck_assert_int_eq(blob_store_open("DATA", NULL, dir, &s, &e), BLOB_OK);
    for (int i = 0; bad[i]; i++) {
        ck_assert_msg(!blob_key_valid(bad[i]), "%s", bad[i]);
        ck_assert_int_eq(blob_put(s, bad[i], "x", 1, &e), BLOB_BAD);
        ck_assert_str_eq(e.code, "InvalidKey");
        ck_assert_int_eq(blob_head(s, bad[i], NULL, NULL, &e), BLOB_BAD);
        ck_assert_int_eq(blob_delete(s, bad[i], &e), BLOB_BAD);
        ck_assert_int_eq(blob_get_file(s, bad[i], "/tmp/x", &e), BLOB_BAD);
    }
    char longkey[300];
    memset(longkey, 'a', sizeof longkey);
    longkey[256] = '\0';
    ck_assert(!blob_key_valid(longkey));
    longkey[255] = '\0';
    ck_assert(blob_key_valid(longkey));
    for (int i = 0; good[i]; i++) ck_assert_msg(blob_key_valid(good[i]), "%s", good[i]);
    seen sn = {0};
    ck_assert_int_eq(blob_list(s, "../", collect, &sn, &e), BLOB_BAD);
    ck_assert_int_eq(blob_list(s, "/", collect, &sn, &e), BLOB_BAD);
    ck_assert_int_eq(blob_list(s, NULL, collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(count_dot_files(dir), 0);
    /* nothing was written anywhere */
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    int entries = 0;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) entries++;
    closedir(d);
    ck_assert_int_eq(entries, 0);
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

static void creds(const char *dir, char *path, size_t n, const char *text, int mode) {
    snprintf(path, n, "%s/cred-%d", dir, rand());
    write_file(path, text, mode);
}

#define SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

START_TEST(s3_specs_parsed) {
    char dir[64], cred[128];
    mkscratch(dir, sizeof dir);
    creds(dir, cred, sizeof cred,
          "# dev store\r\n[other]\r\naws_access_key_id = NOTME\r\n[default]\r\n"
          "aws_access_key_id = AKIDEXAMPLE\r\n  aws_secret_access_key=" SECRET "  \r\n; done\r\n",
          0600);
    static const struct { const char *spec, *url; } ok[] = {
        {"s3://ckpt?endpoint=http://127.0.0.1:7480", "s3://ckpt?endpoint=http://127.0.0.1:7480&region=us-east-1"},
        {"s3://ckpt/ty/a/?region=eu-west-1&endpoint=HTTP://LocalHost:80/",
         "s3://ckpt/ty/a?endpoint=http://localhost&region=eu-west-1"},
        {"s3://ckpt/?endpoint=https%3A%2F%2Fs3.example.com%3A443", "s3://ckpt?endpoint=https://s3.example.com&region=us-east-1"},
        {"s3://my-bucket", "s3://my-bucket?endpoint=https://s3.us-east-1.amazonaws.com&region=us-east-1"},
        {"s3://ckpt?endpoint=http://[::1]:7480", "s3://ckpt?endpoint=http://[::1]:7480&region=us-east-1"},
        {NULL, NULL}};
    for (int i = 0; ok[i].spec; i++) {
        blob_store *s = NULL;
        blob_err e = {0};
        ck_assert_msg(blob_store_open(ok[i].spec, cred, NULL, &s, &e) == BLOB_OK, "%s: %s", ok[i].spec, e.msg);
        ck_assert_str_eq(blob_store_url(s), ok[i].url);
        ck_assert_int_eq(blob_store_is_s3(s), 1);
        ck_assert_ptr_null(blob_store_root(s));
        ck_assert_ptr_null(strstr(blob_store_url(s), "AKID"));
        blob_store_close(s);
    }
    static const struct { const char *spec, *msg; } bad[] = {
        {"s3://AKID:" SECRET "@ckpt?endpoint=http://127.0.0.1:7480", "never in a URL"},
        {"s3://AKID@ckpt", "never in a URL"},
        {"s3://ckpt?endpoint=http://AKID:S@127.0.0.1:7480", "never in a URL"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480&aws_secret_access_key=" SECRET, "never in a URL"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480&access_key=AKID", "never in a URL"},
        {"s3://ckpt?X-Amz-Credential=AKID", "never in a URL"},
        {"s3://ckpt?session_token=abc", "never in a URL"},
        {"s3://ckpt?" SECRET, "never in a URL"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480&style=virtual", "unknown parameter style"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480&endpoint=http://x", "given twice"},
        {"s3://ckpt?endpoint=ftp://127.0.0.1", "endpoint"},
        {"s3://ckpt?endpoint=http://127.0.0.1:99999", "port"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480/path", "no path"},
        {"s3://ckpt?endpoint=http://127.0.0.1:7480%3Fx%3D1", "no path"},
        {"s3://ckpt?endpoint=http://bad_host", "bad host"},
        {"s3://ckpt?region=US_EAST", "bad region"},
        {"s3://ckpt?endpoint=", "bad endpoint"},
        {"s3://Bad_Bucket", "bucket"},
        {"s3://ab", "bucket"},
        {"s3://", "bucket"},
        {"s3://ckpt/../x?endpoint=http://127.0.0.1", "prefix"},
        {"s3://ckpt/.hidden?endpoint=http://127.0.0.1", "prefix"},
        {"s3://ckpt?endpoint=http://127.0.0.1#frag", "fragment"},
        {"s4://ckpt", "DATA, file:///"},
        {"data", "DATA, file:///"},
        {NULL, NULL}};
    for (int i = 0; bad[i].spec; i++) {
        blob_store *s = (blob_store *)1;
        blob_err e = {0};
        ck_assert_msg(blob_store_open(bad[i].spec, cred, NULL, &s, &e) == BLOB_BAD, "%s", bad[i].spec);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(e.msg, bad[i].msg) != NULL, "%s: %s", bad[i].spec, e.msg);
        ck_assert_msg(strstr(e.msg, SECRET) == NULL && strstr(e.msg, "AKID") == NULL, "%s", e.msg);
    }
    /* the addressing of presigned URLs (no I/O): path-style with an endpoint, virtual-hosted on AWS */
    blob_store *s = NULL;
    blob_err e;
    char url[2048];
    ck_assert_int_eq(blob_store_open("s3://ckpt/ty/?endpoint=http://127.0.0.1:7480", cred, NULL, &s, &e), BLOB_OK);
    ck_assert_int_eq(blob_presign(s, "GET", "checkpoints/1/x", NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_OK);
    ck_assert_msg(strncmp(url, "http://127.0.0.1:7480/ckpt/ty/checkpoints/1/x?X-Amz-Algorithm=AWS4-HMAC-SHA256&", 79) == 0, "%s", url);
    ck_assert_ptr_nonnull(strstr(url, "X-Amz-Credential=AKIDEXAMPLE%2F"));
    ck_assert_ptr_null(strstr(url, "X-Amz-Security-Token"));
    ck_assert_int_eq(blob_presign(s, "PUT", "checkpoints/1/x", "2~id/+", 7, "1B2M2Y8AsgTpgAmY7PhCfg==", 60, NULL, url, sizeof url), BLOB_OK);
    ck_assert_ptr_nonnull(strstr(url, "&partNumber=7&uploadId=2~id%2F%2B&X-Amz-Signature="));
    blob_store_close(s);
    ck_assert_int_eq(blob_store_open("s3://my-bucket/p?region=eu-west-1", cred, NULL, &s, &e), BLOB_OK);
    ck_assert_int_eq(blob_presign(s, "GET", "contexts/ab", NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_OK);
    ck_assert_msg(strncmp(url, "https://my-bucket.s3.eu-west-1.amazonaws.com/p/contexts/ab?", 59) == 0, "%s", url);
    ck_assert_ptr_nonnull(strstr(url, "%2Feu-west-1%2Fs3%2Faws4_request"));
    ck_assert_ptr_null(strstr(url, SECRET));
    blob_store_close(s);
    ck_assert_int_eq(blob_store_open("s3://ckpt?endpoint=http://127.0.0.1:7480", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "--blob-credentials"));
    /* file:// forms */
    ck_assert_int_eq(blob_store_open("file://relative/dir", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_int_eq(blob_store_open("file://host/dir", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_int_eq(blob_store_open("file:///a/../b", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_int_eq(blob_store_open("file:///", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_int_eq(blob_store_open("file:///a?b", NULL, NULL, &s, &e), BLOB_BAD);
    ck_assert_int_eq(blob_store_open("file:///srv/blobs", cred, NULL, &s, &e), BLOB_BAD); /* credentials: s3 only */
    ck_assert_ptr_nonnull(strstr(e.msg, "s3 stores only"));
    ck_assert_int_eq(blob_store_open("DATA", cred, "/srv", &s, &e), BLOB_BAD);
    ck_assert_ptr_null(s);
    rmrf(dir);
}
END_TEST

START_TEST(credentials_file_rules) {
    char dir[64], cred[128];
    mkscratch(dir, sizeof dir);
    const char *spec = "s3://ckpt?endpoint=http://127.0.0.1:7480";
    const char *good = "[default]\naws_access_key_id=AKIDEXAMPLE\naws_secret_access_key=" SECRET "\n";
    blob_store *s = NULL;
    blob_err e;

    /* readable by others or the group: refused, with the mode and the cure */
    int modes[] = {0644, 0640, 0604, 0660, 0601};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        creds(dir, cred, sizeof cred, good, modes[i]);
        ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
        ck_assert_msg(strstr(e.msg, "chmod 600") != NULL, "%s", e.msg);
        char m[16];
        snprintf(m, sizeof m, "mode %04o", modes[i]);
        ck_assert_msg(strstr(e.msg, m) != NULL, "%s", e.msg);
        ck_assert_ptr_null(strstr(e.msg, SECRET));
    }
    /* 0400 and 0600 are fine; a link to such a file too */
    creds(dir, cred, sizeof cred, good, 0400);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_OK);
    blob_store_close(s);
    char link[160];
    snprintf(link, sizeof link, "%s/link", dir);
    ck_assert_int_eq(symlink(cred, link), 0);
    ck_assert_int_eq(blob_store_open(spec, link, NULL, &s, &e), BLOB_OK);
    blob_store_close(s);
    /* not a regular file */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/adir", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(blob_store_open(spec, sub, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a regular file"));
    ck_assert_int_eq(blob_store_open(spec, "/dev/null", NULL, &s, &e), BLOB_BAD);
    /* missing */
    snprintf(sub, sizeof sub, "%s/none", dir);
    ck_assert_int_eq(blob_store_open(spec, sub, NULL, &s, &e), BLOB_BAD);
    ck_assert_str_eq(e.code, "ENOENT");
    /* missing keys, named; only [default] counts */
    creds(dir, cred, sizeof cred, "[default]\naws_access_key_id=AKIDEXAMPLE\n[p]\naws_secret_access_key=" SECRET "\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "no aws_secret_access_key"));
    ck_assert_ptr_nonnull(strstr(e.msg, cred));
    creds(dir, cred, sizeof cred, "aws_secret_access_key=" SECRET "\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "no aws_access_key_id"));
    /* a line that is not key = value: its number, never its text */
    creds(dir, cred, sizeof cred, "[default]\naws_access_key_id=AKIDEXAMPLE\n" SECRET "\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "line 3"));
    ck_assert_ptr_null(strstr(e.msg, SECRET));
    creds(dir, cred, sizeof cred, "[default]\naws_access_key_id=AK ID\naws_secret_access_key=x\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
    ck_assert_ptr_nonnull(strstr(e.msg, "bad aws_access_key_id"));
    creds(dir, cred, sizeof cred, "[default\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_BAD);
    /* a session token is read, and signed into every URL */
    creds(dir, cred, sizeof cred,
          "[default]\naws_access_key_id=AKIDEXAMPLE\naws_secret_access_key=" SECRET "\naws_session_token = tok/en+=\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_OK);
    char url[2048];
    ck_assert_int_eq(blob_presign(s, "GET", "a", NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_OK);
    ck_assert_ptr_nonnull(strstr(url, "&X-Amz-Security-Token=tok%2Fen%2B%3D&"));
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

START_TEST(util_md5_base64_redact) {
    unsigned char md[16];
    md5_raw("", 0, md);
    char b64[32];
    ck_assert_int_eq(base64_encode(md, 16, b64, sizeof b64), 24);
    ck_assert_str_eq(b64, "1B2M2Y8AsgTpgAmY7PhCfg==");
    md5_raw("The quick brown fox jumps over the lazy dog", 43, md);
    ck_assert_int_eq(md[0], 0x9e);
    ck_assert_int_eq(md[15], 0xd6);
    ck_assert_int_eq(base64_encode((const unsigned char *)"f", 1, b64, sizeof b64), 4);
    ck_assert_str_eq(b64, "Zg==");
    ck_assert_int_eq(base64_encode((const unsigned char *)"fo", 2, b64, sizeof b64), 4);
    ck_assert_str_eq(b64, "Zm8=");
    ck_assert_int_eq(base64_encode((const unsigned char *)"foobar", 6, b64, sizeof b64), 8);
    ck_assert_str_eq(b64, "Zm9vYmFy");
    ck_assert_int_eq(base64_encode((const unsigned char *)"", 0, b64, sizeof b64), 0);
    ck_assert_str_eq(b64, "");
    ck_assert_int_eq(base64_encode((const unsigned char *)"foobar", 6, b64, 8), -1); /* no room for the NUL */
    ck_assert_int_eq(base64_encode((const unsigned char *)"foobar", 6, b64, 9), 8);

    char out[128];
    ck_assert_int_eq(url_redact("http://127.0.0.1:7480/ckpt/a/b?X-Amz-Signature=abc&X-Amz-Credential=AK", out, sizeof out), 0);
    ck_assert_str_eq(out, "http://127.0.0.1:7480/ckpt/a/b");
    ck_assert_int_eq(url_redact("https://user:pw@h.example/p#frag", out, sizeof out), 0);
    ck_assert_str_eq(out, "https://h.example/p");
    ck_assert_int_eq(url_redact("https://h.example?x=1", out, sizeof out), 0);
    ck_assert_str_eq(out, "https://h.example");
    ck_assert_int_eq(url_redact("/api/v1/x?token=1", out, sizeof out), 0);
    ck_assert_str_eq(out, "/api/v1/x");
    ck_assert_int_eq(url_redact(NULL, out, sizeof out), 0);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(url_redact("http://h/abcdefgh?q", out, 10), -1);
    ck_assert_str_eq(out, "http://h/");
}
END_TEST


/* ---------------------------------------------------------------- s3 (radosgw) */

static s3_dev dev;
static int bucket_seq;

/* a fresh bucket and a store on it (prefix: "" or "ty/a") */
static blob_store *s3_store(const char *prefix, char *bucket, size_t n) {
    snprintf(bucket, n, "b%d-%d", (int)getpid(), bucket_seq++);
    ck_assert_int_eq(s3_bucket(&dev, bucket), 0);
    char spec[512];
    snprintf(spec, sizeof spec, "s3://%s%s%s?endpoint=%s&region=%s", bucket, prefix[0] ? "/" : "", prefix, dev.endpoint,
             dev.region);
    blob_store *s = NULL;
    blob_err e = {0};
    ck_assert_msg(blob_store_open(spec, dev.creds, NULL, &s, &e) == BLOB_OK, "%s", e.msg);
    return s;
}

typedef struct http_ans {
    long status;
    buf body;
    char disposition[256];
    char etag[80];
} http_ans;

static size_t ans_body(char *p, size_t size, size_t n, void *ud) {
    http_ans *a = ud;
    return buf_append(&a->body, p, size * n) < 0 ? 0 : size * n;
}

static size_t ans_header(char *p, size_t size, size_t n, void *ud) {
    http_ans *a = ud;
    size_t len = size * n;
    if (len > 20 && strncasecmp(p, "Content-Disposition:", 20) == 0)
        snprintf(a->disposition, sizeof a->disposition, "%.*s", (int)strcspn(p + 21, "\r\n"), p + 21);
    if (len > 5 && strncasecmp(p, "ETag:", 5) == 0)
        snprintf(a->etag, sizeof a->etag, "%.*s", (int)strcspn(p + 6, "\r\n"), p + 6);
    return len;
}

/* one request to a presigned URL, as a worker makes it (no Authorization) */
static long http_do(const char *method, const char *url, const void *data, size_t len, const char *md5_b64, http_ans *a) {
    memset(a, 0, sizeof *a);
    buf_init(&a->body, 1 << 20);
    CURL *h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
    char hdr[64];
    if (md5_b64) {
        snprintf(hdr, sizeof hdr, "Content-MD5: %s", md5_b64);
        hl = curl_slist_append(hl, hdr);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ans_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ans_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    if (strcmp(method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, data);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode cc = curl_easy_perform(h);
    ck_assert_msg(cc == CURLE_OK, "%s", curl_easy_strerror(cc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return a->status;
}

static const char *ans_code(http_ans *a, char *out, size_t n) {
    size_t p = 0;
    if (!a->body.data || s3_xml_text(a->body.data, a->body.len, "Code", &p, out, n) != 0) snprintf(out, n, "-");
    return out;
}

static void b64md5(const void *data, size_t len, unsigned char md[16], char b64[25]) {
    md5_raw(data, len, md);
    ck_assert_int_eq(base64_encode(md, 16, b64, 25), 24);
}

static int count_keys(void *ctx, const char *key, int64_t size) {
    (void)key;
    (void)size;
    (*(int *)ctx)++;
    return 0;
}

START_TEST(s3_objects) {
    char bucket[64];
    blob_store *s = s3_store("ty/a", bucket, sizeof bucket);
    blob_err e = {0};
    ck_assert_msg(blob_store_check(s, &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(s3_keys(&dev, bucket, "", NULL, 0), 0); /* the probe is gone */
    ck_assert_ptr_null(blob_store_root(s));
    const char *text = "weights of step 3";
    ck_assert_msg(blob_put(s, "checkpoints/12/3.safetensors", text, strlen(text), &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(blob_put(s, "checkpoints/1/1.safetensors", "a", 1, &e), BLOB_OK);
    ck_assert_int_eq(blob_put(s, "contexts/abcd", "", 0, &e), BLOB_OK);
    /* under the prefix in the bucket */
    char keys[4][256];
    ck_assert_int_eq(s3_keys(&dev, bucket, "ty/a/", keys, 4), 3);
    ck_assert_int_eq(s3_keys(&dev, bucket, "", NULL, 0), 3);

    int64_t size = -1;
    char etag[80];
    ck_assert_int_eq(blob_head(s, "checkpoints/12/3.safetensors", &size, etag, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)strlen(text));
    unsigned char md[16];
    md5_raw(text, strlen(text), md);
    char want[80];
    snprintf(want, sizeof want, "\"");
    for (int i = 0; i < 16; i++) snprintf(want + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(want, "\"");
    ck_assert_str_eq(etag, want);
    ck_assert_int_eq(blob_head(s, "contexts/abcd", &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, 0);

    char dir[64], out[128];
    mkscratch(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out", dir);
    ck_assert_int_eq(blob_get_file(s, "checkpoints/12/3.safetensors", out, &e), BLOB_OK);
    size_t len = 0;
    char *got = file_read_all(out, 1024, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, text);
    free(got);
    struct stat st;
    ck_assert_int_eq(stat(out, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);

    seen sn = {0};
    ck_assert_int_eq(blob_list(s, "checkpoints/1", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 2);
    ck_assert(has_key(&sn, "checkpoints/12/3.safetensors"));
    ck_assert(has_key(&sn, "checkpoints/1/1.safetensors"));
    memset(&sn, 0, sizeof sn);
    ck_assert_int_eq(blob_list(s, "checkpoints/1/", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 1);
    ck_assert_int_eq(sn.sizes[0], 1);
    memset(&sn, 0, sizeof sn);
    sn.stop_after = 1;
    ck_assert_int_eq(blob_list(s, "", collect, &sn, &e), BLOB_OK);
    ck_assert_int_eq(sn.n, 1);

    /* paged: 7 keys, 2 a page */
    for (int i = 0; i < 4; i++) {
        char k[64];
        snprintf(k, sizeof k, "backups/p/%d", i);
        ck_assert_int_eq(blob_put(s, k, "x", 1, &e), BLOB_OK);
    }
    s->list_page = 2;
    int n = 0;
    ck_assert_msg(blob_list(s, "", count_keys, &n, &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(n, 7);
    n = 0;
    ck_assert_int_eq(blob_list(s, "backups/", count_keys, &n, &e), BLOB_OK);
    ck_assert_int_eq(n, 4);
    s->list_page = 1000;

    /* missing keys */
    ck_assert_int_eq(blob_head(s, "checkpoints/12/9.safetensors", &size, NULL, &e), BLOB_NOT_FOUND);
    ck_assert_int_eq(e.http, 404);
    snprintf(out, sizeof out, "%s/none", dir);
    ck_assert_int_eq(blob_get_file(s, "checkpoints/12/9.safetensors", out, &e), BLOB_NOT_FOUND);
    ck_assert_str_eq(e.code, "NoSuchKey");
    ck_assert_int_eq(access(out, F_OK), -1);
    ck_assert_int_eq(count_dot_files(dir), 0);
    ck_assert_int_eq(blob_delete(s, "checkpoints/12/9.safetensors", &e), BLOB_OK);
    ck_assert_int_eq(blob_delete(s, "checkpoints/12/3.safetensors", &e), BLOB_OK);
    ck_assert_int_eq(blob_head(s, "checkpoints/12/3.safetensors", &size, NULL, &e), BLOB_NOT_FOUND);
    ck_assert_int_eq(blob_put(s, "../x", "x", 1, &e), BLOB_BAD);
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

static long max_rss_kb(void) {
    struct rusage ru;
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

/* a file of n pseudo-random bytes written 1 MiB at a time; its sha256 */
static void make_file(const char *path, size_t n, unsigned seed, char sha[65]) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    sha256_stream h;
    ck_assert_int_eq(sha256_stream_init(&h), 0);
    unsigned char chunk[1 << 16];
    uint32_t x = seed;
    for (size_t done = 0; done < n;) {
        size_t len = n - done < sizeof chunk ? n - done : sizeof chunk;
        for (size_t i = 0; i < len; i++) {
            x = x * 1664525u + 1013904223u;
            chunk[i] = (unsigned char)(x >> 24);
        }
        ck_assert_int_eq(write(fd, chunk, len), (ssize_t)len);
        ck_assert_int_eq(sha256_stream_update(&h, chunk, len), 0);
        done += len;
    }
    close(fd);
    ck_assert_int_eq(sha256_stream_final(&h, sha), 0);
}

static void file_sha(const char *path, char sha[65], int64_t *size) {
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    sha256_stream h;
    ck_assert_int_eq(sha256_stream_init(&h), 0);
    unsigned char chunk[1 << 16];
    ssize_t r;
    *size = 0;
    while ((r = read(fd, chunk, sizeof chunk)) > 0) {
        ck_assert_int_eq(sha256_stream_update(&h, chunk, (size_t)r), 0);
        *size += r;
    }
    close(fd);
    ck_assert_int_eq(sha256_stream_final(&h, sha), 0);
}

/* 96 MiB up and down: the bytes, and no more than 24 MiB of memory more */
START_TEST(s3_files_stream) {
    char bucket[64], dir[64], src[128], dst[128], want[65], got[65];
    blob_store *s = s3_store("", bucket, sizeof bucket);
    mkscratch(dir, sizeof dir);
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(dst, sizeof dst, "%s/dst", dir);
    size_t n = 96u * 1024 * 1024 + 3;
    make_file(src, n, 7, want);
    blob_err e = {0};
    long rss0 = max_rss_kb();
    int64_t t0 = mono_ms();
    ck_assert_msg(blob_put_file(s, "backups/big", src, &e) == BLOB_OK, "%s", e.msg);
    int64_t t1 = mono_ms();
    int64_t size = 0;
    ck_assert_int_eq(blob_head(s, "backups/big", &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)n);
    ck_assert_msg(blob_get_file(s, "backups/big", dst, &e) == BLOB_OK, "%s", e.msg);
    int64_t t2 = mono_ms();
    long rss1 = max_rss_kb();
    file_sha(dst, got, &size);
    ck_assert_int_eq(size, (int64_t)n);
    ck_assert_str_eq(got, want);
    fprintf(stderr, "s3: put_file %zu MiB in %lld ms, get_file in %lld ms; peak RSS %ld -> %ld KiB\n", n >> 20,
            (long long)(t1 - t0), (long long)(t2 - t1), rss0, rss1);
    ck_assert_int_lt(rss1 - rss0, 24 * 1024);

    /* past the one-PUT limit: a multipart upload (limits made small here) */
    s->put_single_max = 8 << 20;
    s->put_part_bytes = 5 << 20;
    make_file(src, 12u * 1024 * 1024 + 5, 9, want);
    ck_assert_msg(blob_put_file(s, "backups/parts", src, &e) == BLOB_OK, "%s", e.msg);
    char etag[80];
    ck_assert_int_eq(blob_head(s, "backups/parts", &size, etag, &e), BLOB_OK);
    ck_assert_int_eq(size, 12 * 1024 * 1024 + 5);
    ck_assert_msg(strstr(etag, "-3\"") != NULL, "%s", etag);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, ""), 0);
    ck_assert_int_eq(blob_get_file(s, "backups/parts", dst, &e), BLOB_OK);
    file_sha(dst, got, &size);
    ck_assert_str_eq(got, want);
    /* a source that is not there */
    char nosrc[160];
    snprintf(nosrc, sizeof nosrc, "%s/none", dir);
    ck_assert_int_eq(blob_put_file(s, "backups/x", nosrc, &e), BLOB_BAD);
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

#define PART (5 * 1024 * 1024)

START_TEST(s3_multipart_complete_and_abort) {
    char bucket[64];
    blob_store *s = s3_store("", bucket, sizeof bucket);
    blob_err e = {0};
    const char *key = "checkpoints/7/1-abc.safetensors";
    char id[256];
    ck_assert_msg(blob_mpu_create(s, key, id, &e) == BLOB_OK, "%s", e.msg);
    ck_assert(strlen(id) > 0);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    size_t total = 3 * PART - 1000; /* the last part shorter */
    unsigned char *data = xmalloc(total);
    for (size_t i = 0; i < total; i++) data[i] = (unsigned char)(i * 7 + (i >> 20));
    unsigned char md5s[3][16];
    for (int p = 0; p < 3; p++) {
        size_t off = (size_t)p * PART, len = p < 2 ? PART : total - 2 * PART;
        char b64[25], url[4096];
        b64md5(data + off, len, md5s[p], b64);
        ck_assert_int_eq(blob_presign(s, "PUT", key, id, p + 1, b64, 600, NULL, url, sizeof url), BLOB_OK);
        ck_assert_ptr_nonnull(strstr(url, "partNumber="));
        http_ans a;
        ck_assert_int_eq(http_do("PUT", url, data + off, len, b64, &a), 200);
        buf_release(&a.body);
    }
    ck_assert_msg(blob_mpu_complete(s, key, id, 3, (const unsigned char (*)[16])md5s, &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 0);
    /* size, and the multipart ETag: md5 of the parts' md5s, "-3" */
    int64_t size = 0;
    char etag[80], want[80] = "\"";
    ck_assert_int_eq(blob_head(s, key, &size, etag, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)total);
    unsigned char md[16];
    md5_raw(md5s, sizeof md5s, md);
    for (int i = 0; i < 16; i++) snprintf(want + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(want, "-3\"");
    ck_assert_str_eq(etag, want);
    char dir[64], out[128];
    mkscratch(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out", dir);
    ck_assert_int_eq(blob_get_file(s, key, out, &e), BLOB_OK);
    size_t len = 0;
    char *got = file_read_all(out, total + 1, &len);
    ck_assert_uint_eq(len, total);
    ck_assert(memcmp(got, data, total) == 0);
    free(got);
    /* completing again with the same parts: ok (a retry after a lost answer);
     * with others: the upload is no more (radosgw: 500, read as NoSuchUpload) */
    ck_assert_msg(blob_mpu_complete(s, key, id, 3, (const unsigned char (*)[16])md5s, &e) == BLOB_OK, "%s", e.msg);
    unsigned char wrong[3][16];
    memcpy(wrong, md5s, sizeof wrong);
    wrong[1][0] ^= 1;
    ck_assert_int_eq(blob_mpu_complete(s, key, id, 3, (const unsigned char (*)[16])wrong, &e), BLOB_NOT_FOUND);
    fprintf(stderr, "s3: CompleteMultipartUpload again, other parts: http %d %s: %s\n", e.http, e.code, e.msg);
    ck_assert_str_eq(e.code, "NoSuchUpload");
    ck_assert_int_eq(blob_head(s, key, &size, NULL, &e), BLOB_OK); /* the object stays */

    /* parts too small before the last: refused at completion */
    const char *key3 = "checkpoints/7/3-small.safetensors";
    ck_assert_int_eq(blob_mpu_create(s, key3, id, &e), BLOB_OK);
    unsigned char small[2][16];
    for (int p = 0; p < 2; p++) {
        char b64s[25], urls[4096];
        b64md5(data + p * 1024, 1024, small[p], b64s);
        ck_assert_int_eq(blob_presign(s, "PUT", key3, id, p + 1, b64s, 600, NULL, urls, sizeof urls), BLOB_OK);
        http_ans as;
        ck_assert_int_eq(http_do("PUT", urls, data + p * 1024, 1024, b64s, &as), 200);
        buf_release(&as.body);
    }
    int src = blob_mpu_complete(s, key3, id, 2, (const unsigned char (*)[16])small, &e);
    fprintf(stderr, "s3: CompleteMultipartUpload with a 1 KiB first part: %s http %d %s: %s\n", blob_strerror(src), e.http, e.code, e.msg);
    ck_assert_int_eq(src, BLOB_BAD);
    ck_assert_str_eq(e.code, "EntityTooSmall");
    ck_assert_int_eq(blob_mpu_abort(s, key3, id, &e), BLOB_OK);

    /* abort: the parts are gone, aborting twice is fine, a part URL after it is refused */
    const char *key2 = "checkpoints/7/2-def.safetensors";
    ck_assert_int_eq(blob_mpu_create(s, key2, id, &e), BLOB_OK);
    char b64[25], url[4096];
    unsigned char m[16];
    b64md5(data, PART, m, b64);
    ck_assert_int_eq(blob_presign(s, "PUT", key2, id, 1, b64, 600, NULL, url, sizeof url), BLOB_OK);
    http_ans a;
    ck_assert_int_eq(http_do("PUT", url, data, PART, b64, &a), 200);
    buf_release(&a.body);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    /* a part missing: the store refuses the completion, the upload stays open */
    unsigned char two[2][16];
    memcpy(two[0], m, 16);
    md5_raw("nothing", 7, two[1]);
    int crc = blob_mpu_complete(s, key2, id, 2, (const unsigned char (*)[16])two, &e);
    fprintf(stderr, "s3: CompleteMultipartUpload with a part never sent: %s http %d %s: %s\n", blob_strerror(crc), e.http, e.code, e.msg);
    ck_assert_int_eq(crc, BLOB_BAD);
    ck_assert_str_eq(e.code, "InvalidPart");
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    ck_assert_msg(blob_mpu_abort(s, key2, id, &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 0);
    ck_assert_msg(blob_mpu_abort(s, key2, id, &e) == BLOB_OK, "%s", e.msg);
    char code[64];
    long st = http_do("PUT", url, data, PART, b64, &a);
    fprintf(stderr, "s3: a part URL after abort: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 404);
    ck_assert_str_eq(code, "NoSuchUpload");
    buf_release(&a.body);
    ck_assert_int_eq(blob_head(s, key2, NULL, NULL, &e), BLOB_NOT_FOUND);
    crc = blob_mpu_complete(s, key2, id, 1, (const unsigned char (*)[16])&m, &e);
    fprintf(stderr, "s3: CompleteMultipartUpload after abort: %s http %d %s: %s\n", blob_strerror(crc), e.http, e.code, e.msg);
    ck_assert_int_eq(crc, BLOB_NOT_FOUND);
    ck_assert_str_eq(e.code, "NoSuchUpload");

    /* uploads whose ids were never kept (two of one key, one of a key that
     * begins with it): abort_key finds the key's by listing, and only those */
    const char *key4 = "checkpoints/7/4-lost.safetensors", *key5 = "checkpoints/7/4-lost.safetensors.x";
    char id4a[256], id4b[256], id5[256];
    ck_assert_int_eq(blob_mpu_create(s, key4, id4a, &e), BLOB_OK);
    ck_assert_int_eq(blob_mpu_create(s, key4, id4b, &e), BLOB_OK);
    ck_assert_int_eq(blob_mpu_create(s, key5, id5, &e), BLOB_OK);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 3);
    int gone = -1;
    ck_assert_msg(blob_mpu_abort_key(s, key4, &gone, &e) == BLOB_OK, "%s", e.msg);
    ck_assert_int_eq(gone, 2);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 1);
    ck_assert_int_eq(blob_mpu_abort_key(s, key4, &gone, &e), BLOB_OK);
    ck_assert_int_eq(gone, 0);
    ck_assert_int_eq(blob_mpu_abort(s, key5, id5, &e), BLOB_OK);
    ck_assert_int_eq(s3_open_uploads(&dev, bucket, "checkpoints/"), 0);
    free(data);
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

START_TEST(s3_presigned_urls) {
    char bucket[64];
    blob_store *s = s3_store("ty", bucket, sizeof bucket);
    blob_err e = {0};
    const char *key = "checkpoints/3/1-x.safetensors", *body = "the right bytes", *other = "the wrong bytes";
    unsigned char md[16], md_other[16];
    char b64[25], b64_other[25], url[4096], code[64];
    b64md5(body, strlen(body), md, b64);
    b64md5(other, strlen(other), md_other, b64_other);
    ck_assert_int_eq(blob_presign(s, "PUT", key, NULL, 0, b64, 600, NULL, url, sizeof url), BLOB_OK);
    char red[512];
    ck_assert_int_eq(url_redact(url, red, sizeof red), 0);
    ck_assert_ptr_null(strchr(red, '?'));
    ck_assert_ptr_nonnull(strstr(url, "X-Amz-SignedHeaders=content-md5%3Bhost"));
    http_ans a;
    /* other bytes under the signed MD5: the store checks the MD5 */
    long st = http_do("PUT", url, other, strlen(other), b64, &a);
    fprintf(stderr, "s3: presigned PUT, other bytes, the signed Content-MD5: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 400);
    ck_assert_str_eq(code, "BadDigest");
    buf_release(&a.body);
    /* other bytes with their own MD5: not what was signed */
    st = http_do("PUT", url, other, strlen(other), b64_other, &a);
    fprintf(stderr, "s3: presigned PUT, another Content-MD5: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 403);
    buf_release(&a.body);
    /* no Content-MD5 at all */
    st = http_do("PUT", url, other, strlen(other), NULL, &a);
    fprintf(stderr, "s3: presigned PUT, no Content-MD5: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 403);
    buf_release(&a.body);
    ck_assert_int_eq(blob_head(s, key, NULL, NULL, &e), BLOB_NOT_FOUND);
    /* the URL rewritten to another key */
    char *moved = xstrdup(url);
    char *k = strstr(moved, "1-x.safetensors");
    ck_assert_ptr_nonnull(k);
    k[0] = '2';
    st = http_do("PUT", moved, body, strlen(body), b64, &a);
    fprintf(stderr, "s3: presigned PUT for another key: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 403);
    ck_assert_str_eq(code, "SignatureDoesNotMatch");
    buf_release(&a.body);
    free(moved);
    /* as signed: stored */
    ck_assert_int_eq(http_do("PUT", url, body, strlen(body), b64, &a), 200);
    buf_release(&a.body);
    int64_t size = 0;
    ck_assert_int_eq(blob_head(s, key, &size, NULL, &e), BLOB_OK);
    ck_assert_int_eq(size, (int64_t)strlen(body));
    ck_assert_int_eq(s3_keys(&dev, bucket, "ty/checkpoints/3/", NULL, 0), 1);

    /* GET with a file name */
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 600, "job-3-checkpoint-1.safetensors", url, sizeof url), BLOB_OK);
    ck_assert_int_eq(http_do("GET", url, NULL, 0, NULL, &a), 200);
    ck_assert_uint_eq(a.body.len, strlen(body));
    ck_assert(memcmp(a.body.data, body, a.body.len) == 0);
    ck_assert_str_eq(a.disposition, "attachment; filename=\"job-3-checkpoint-1.safetensors\"");
    buf_release(&a.body);
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 600, NULL, url, sizeof url), BLOB_OK);
    ck_assert_int_eq(http_do("GET", url, NULL, 0, NULL, &a), 200);
    ck_assert_str_eq(a.disposition, "");
    buf_release(&a.body);
    /* a GET URL is no PUT URL */
    st = http_do("PUT", url, body, strlen(body), NULL, &a);
    ck_assert_int_eq(st, 403);
    buf_release(&a.body);

    /* expired */
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 1, NULL, url, sizeof url), BLOB_OK);
    sleep(3);
    st = http_do("GET", url, NULL, 0, NULL, &a);
    fprintf(stderr, "s3: an expired GET URL: %ld %s\n", st, ans_code(&a, code, sizeof code));
    ck_assert_int_eq(st, 403);
    buf_release(&a.body);

    /* refusals before anything is signed */
    ck_assert_int_eq(blob_presign(s, "DELETE", key, NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 0, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 604801, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "PUT", key, NULL, 0, "notbase64", 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 60, "a\"b", url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "PUT", key, "id", 0, b64, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "PUT", key, "id", 10001, b64, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "PUT", key, NULL, 3, b64, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", "../k", NULL, 0, NULL, 60, NULL, url, sizeof url), BLOB_BAD);
    ck_assert_int_eq(blob_presign(s, "GET", key, NULL, 0, NULL, 60, NULL, url, 64), BLOB_BAD);
    ck_assert_str_eq(url, "");
    blob_store_close(s);
}
END_TEST

static void check_answer(const char *spec, const char *cred, int want_rc, const char *want_code, const char *what) {
    blob_store *s = NULL;
    blob_err e = {0};
    ck_assert_msg(blob_store_open(spec, cred, NULL, &s, &e) == BLOB_OK, "%s", e.msg);
    int64_t t0 = mono_ms();
    int rc = blob_store_check(s, &e);
    fprintf(stderr, "s3: check, %s: %s, http %d %s: %s (%lld ms)\n", what, blob_strerror(rc), e.http, e.code, e.msg,
            (long long)(mono_ms() - t0));
    ck_assert_int_eq(rc, want_rc);
    ck_assert_str_eq(e.code, want_code);
    ck_assert_ptr_null(strstr(e.msg, dev.secret));
    ck_assert_ptr_null(strstr(e.msg, "X-Amz"));
    blob_store_close(s);
}

START_TEST(s3_check_answers) {
    char bucket[64], dir[64], cred[128], spec[512];
    blob_store *s = s3_store("", bucket, sizeof bucket);
    blob_store_close(s);
    mkscratch(dir, sizeof dir);
    s3_spec(&dev, bucket, spec, sizeof spec);
    check_answer(spec, dev.creds, BLOB_OK, "", "as it should be");
    /* wrong secret */
    char text[512];
    snprintf(text, sizeof text, "[default]\naws_access_key_id = %s\naws_secret_access_key = %sX\n", dev.akid, dev.secret);
    snprintf(cred, sizeof cred, "%s/wrong-secret", dir);
    write_file(cred, text, 0600);
    check_answer(spec, cred, BLOB_DENIED, "SignatureDoesNotMatch", "wrong secret");
    /* unknown key id */
    snprintf(text, sizeof text, "[default]\naws_access_key_id = NOSUCHKEY\naws_secret_access_key = %s\n", dev.secret);
    snprintf(cred, sizeof cred, "%s/wrong-akid", dir);
    write_file(cred, text, 0600);
    check_answer(spec, cred, BLOB_DENIED, "InvalidAccessKeyId", "unknown access key");
    /* no such bucket */
    s3_spec(&dev, "nosuchbucket", spec, sizeof spec);
    check_answer(spec, dev.creds, BLOB_NOT_FOUND, "NoSuchBucket", "no such bucket");
    /* nothing listening */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    snprintf(spec, sizeof spec, "s3://%s?endpoint=http://127.0.0.1:%d", bucket, ntohs(sa.sin_port));
    check_answer(spec, dev.creds, BLOB_UNAVAILABLE, "ConnectionRefused", "closed port");

    /* a store that stops answering: unavailable after the store's timeout */
    s3_spec(&dev, bucket, spec, sizeof spec);
    ck_assert_int_eq(blob_store_open(spec, dev.creds, NULL, &s, NULL), BLOB_OK);
    s->timeout_ms = 1500;
    s3_pause(&dev);
    blob_err te = {0};
    int64_t t0 = mono_ms();
    int trc = blob_head(s, "a", NULL, NULL, &te);
    int64_t took = mono_ms() - t0;
    s3_resume(&dev);
    fprintf(stderr, "s3: HEAD to a stopped radosgw: %s %s: %s (%lld ms)\n", blob_strerror(trc), te.code, te.msg, (long long)took);
    ck_assert_int_eq(trc, BLOB_UNAVAILABLE);
    ck_assert_str_eq(te.code, "Timeout");
    ck_assert_int_lt(took, 5000);
    blob_store_close(s);

    /* a wrong secret on a call with a body: the store's own code */
    s3_spec(&dev, bucket, spec, sizeof spec);
    snprintf(cred, sizeof cred, "%s/wrong-secret", dir);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, NULL), BLOB_OK);
    blob_err e = {0};
    ck_assert_int_eq(blob_put(s, "a", "x", 1, &e), BLOB_DENIED);
    fprintf(stderr, "s3: PUT with a wrong secret: http %d %s: %s\n", e.http, e.code, e.msg);
    ck_assert_str_eq(e.code, "SignatureDoesNotMatch");
    ck_assert_ptr_null(strstr(e.msg, dev.secret));
    blob_store_close(s);
    snprintf(cred, sizeof cred, "%s/wrong-akid", dir);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, NULL), BLOB_OK);
    ck_assert_int_eq(blob_put(s, "a", "x", 1, &e), BLOB_DENIED);
    fprintf(stderr, "s3: PUT with an unknown key id: http %d %s: %s\n", e.http, e.code, e.msg);
    ck_assert_str_eq(e.code, "InvalidAccessKeyId");
    blob_store_close(s);
    rmrf(dir);
}
END_TEST

typedef struct worker_arg {
    blob_store *s;
    int id, fails;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    for (int i = 0; i < 15; i++) {
        char key[64], val[64];
        snprintf(key, sizeof key, "t/%d/%d", w->id, i);
        snprintf(val, sizeof val, "value %d %d", w->id, i);
        blob_err e;
        int64_t size = 0;
        if (blob_put(w->s, key, val, strlen(val), &e) != BLOB_OK) w->fails++;
        if (blob_head(w->s, key, &size, NULL, &e) != BLOB_OK || size != (int64_t)strlen(val)) w->fails++;
        if (i % 3 == 0 && blob_delete(w->s, key, &e) != BLOB_OK) w->fails++;
    }
    return NULL;
}

START_TEST(s3_threads_share_a_store) {
    char bucket[64];
    blob_store *s = s3_store("", bucket, sizeof bucket);
    pthread_t t[6];
    worker_arg w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (worker_arg){s, i, 0};
        ck_assert_int_eq(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(w[i].fails, 0);
    }
    int n = 0;
    blob_err e;
    ck_assert_int_eq(blob_list(s, "t/", count_keys, &n, &e), BLOB_OK);
    ck_assert_int_eq(n, 6 * 10);
    blob_store_close(s);
}
END_TEST

static int s3_ready; /* 1: the store runs; -1: it should and does not */
static char s3_why[256];

START_TEST(s3_store_is_here) {
    ck_assert_msg(s3_ready == 1, "S3_TEST_REQUIRED=1 and no store: %s", s3_why);
}
END_TEST

static Suite *blob_suite(void) {
    Suite *s = suite_create("blob");
    TCase *tc = tcase_create("local");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, data_store_roundtrip);
    tcase_add_test(tc, file_store_roundtrip);
    tcase_add_test(tc, put_file_streams_and_get_file_replaces);
    tcase_add_test(tc, bad_keys_refused);
    tcase_add_test(tc, s3_specs_parsed);
    tcase_add_test(tc, credentials_file_rules);
    tcase_add_test(tc, util_md5_base64_redact);
    suite_add_tcase(s, tc);
    tc = tcase_create("s3");
    tcase_set_timeout(tc, 120);
    if (s3_ready == 1) {
        tcase_add_test(tc, s3_objects);
        tcase_add_test(tc, s3_files_stream);
        tcase_add_test(tc, s3_multipart_complete_and_abort);
        tcase_add_test(tc, s3_presigned_urls);
        tcase_add_test(tc, s3_check_answers);
        tcase_add_test(tc, s3_threads_share_a_store);
    } else if (s3_ready < 0) {
        tcase_add_test(tc, s3_store_is_here);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!s3_have(s3_why, sizeof s3_why)) {
        s3_ready = s3_required() ? -1 : 0;
        fprintf(stderr, "check_blob: s3 cases: %s%s\n", s3_required() ? "FAIL (S3_TEST_REQUIRED=1): " : "SKIP: ", s3_why);
    } else if (s3_start(&dev, "blob", 1024) == 0) {
        s3_ready = 1;
    } else {
        s3_ready = -1;
        snprintf(s3_why, sizeof s3_why, "scripts/s3-dev.sh start failed (above)");
    }
    SRunner *sr = srunner_create(blob_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (s3_ready == 1) {
        if (failed) dev.keep = 1;
        s3_stop(&dev);
    }
    curl_global_cleanup();
    return failed ? 1 : 0;
}
