/* check_blob.c - tests for storage/blob: the local stores (DATA and
 * file://: put/get/head/list/delete, modes, missing keys, bad keys, the
 * probe), the parsing of store specs and credentials files, and the
 * common/util helpers they bring (md5_raw, base64_encode, url_redact). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "../storage/blob.h"

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
    ck_assert_int_eq(blob_store_open("DATA", NULL, "relative/dir", &s, &e), BLOB_BAD);
    ck_assert_ptr_null(s);
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
    blob_store *s = NULL;
    blob_err e;
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
    /* a session token is read */
    creds(dir, cred, sizeof cred,
          "[default]\naws_access_key_id=AKIDEXAMPLE\naws_secret_access_key=" SECRET "\naws_session_token = tok/en+=\n", 0600);
    ck_assert_int_eq(blob_store_open(spec, cred, NULL, &s, &e), BLOB_OK);
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
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(blob_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
