/* check_data.c - tests for executor/data: the IDX, CSV and synthetic
 * loaders (values, scaling, every malformed-file error), dataset_load's
 * limit and validation_split, the shuffle batcher, shards, replica slices.
 * The tests write their own small files into a mkdtemp directory. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "../common/util.h"
#include "../executor/data/dataset.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tmpdir[256];

static void tmp_setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/check_data.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void tmp_teardown(void) {
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmpdir);
}

static void tpath(char *out, size_t cap, const char *name) {
    ck_assert_int_eq(sfmt(out, cap, "%s/%s", tmpdir, name), 0);
}

/* Writes a file into tmpdir, gzip-compressed when gz. */
static void put_file(const char *name, const void *data, size_t len, int gz) {
    char p[512];
    tpath(p, sizeof p, name);
    if (gz) {
        gzFile g = gzopen(p, "wb");
        ck_assert_ptr_nonnull(g);
        if (len > 0) ck_assert_int_eq(gzwrite(g, data, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(g), Z_OK);
    } else {
        FILE *f = fopen(p, "wb");
        ck_assert_ptr_nonnull(f);
        if (len > 0) ck_assert_uint_eq(fwrite(data, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
    }
}

static void put_text(const char *name, const char *text) {
    put_file(name, text, strlen(text), 0);
}

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static unsigned char pix(long i, long j) { return (unsigned char)((i * 31 + j * 7) % 256); }
static unsigned char lab(long i) { return (unsigned char)((i * 3 + 1) % 10); }

/* An IDX image file: count images of rows x cols; *len bytes (caller frees). */
static unsigned char *idx_images(uint32_t magic, uint32_t count, uint32_t rows, uint32_t cols,
                                 size_t *len) {
    size_t n = 16 + (size_t)count * rows * cols;
    unsigned char *b = xmalloc(n);
    be32(b, magic);
    be32(b + 4, count);
    be32(b + 8, rows);
    be32(b + 12, cols);
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < (size_t)rows * cols; j++)
            b[16 + i * rows * cols + j] = pix((long)i, (long)j);
    *len = n;
    return b;
}

static unsigned char *idx_labels(uint32_t magic, uint32_t count, size_t *len) {
    unsigned char *b = xmalloc(8 + count);
    be32(b, magic);
    be32(b + 4, count);
    for (uint32_t i = 0; i < count; i++) b[8 + i] = lab(i);
    *len = 8 + count;
    return b;
}

#define NTRAIN 6
#define NTEST 3

/* A valid MNIST-shaped set (6 train, 3 test, 28x28) in tmpdir. */
static void put_mnist(int gz) {
    const char *sfx = gz ? ".gz" : "";
    char name[64];
    size_t len;
    unsigned char *b;
    b = idx_images(0x803, NTRAIN, 28, 28, &len);
    snprintf(name, sizeof name, "train-images-idx3-ubyte%s", sfx);
    put_file(name, b, len, gz);
    free(b);
    b = idx_labels(0x801, NTRAIN, &len);
    snprintf(name, sizeof name, "train-labels-idx1-ubyte%s", sfx);
    put_file(name, b, len, gz);
    free(b);
    b = idx_images(0x803, NTEST, 28, 28, &len);
    snprintf(name, sizeof name, "t10k-images-idx3-ubyte%s", sfx);
    put_file(name, b, len, gz);
    free(b);
    b = idx_labels(0x801, NTEST, &len);
    snprintf(name, sizeof name, "t10k-labels-idx1-ubyte%s", sfx);
    put_file(name, b, len, gz);
    free(b);
}

static data_spec spec_for(data_source src) {
    data_spec s;
    memset(&s, 0, sizeof s);
    s.source = src;
    s.label_column = -1;
    s.header = 1;
    s.shuffle_buffer = -1;
    s.examples = 1000;
    s.features = 10;
    return s;
}

static data_spec mnist_spec(void) {
    data_spec s = spec_for(DATA_MNIST);
    ck_assert_int_eq(sfmt(s.path, sizeof s.path, "%s", tmpdir), 0);
    return s;
}

/* dataset_load must fail, say what is wrong, and hold nothing. */
static void load_fails(const data_spec *s, const char *want1, const char *want2) {
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_int_eq(dataset_load(s, &sp, err), -1);
    ck_assert_msg(strstr(err, want1) != NULL, "error '%s' lacks '%s'", err, want1);
    if (want2) ck_assert_msg(strstr(err, want2) != NULL, "error '%s' lacks '%s'", err, want2);
    ck_assert_ptr_null(sp.train.x);
    ck_assert_ptr_null(sp.train.y);
    ck_assert_ptr_null(sp.test.x);
    ck_assert_ptr_null(sp.val.x);
    ck_assert_int_eq(sp.train.n, 0);
}

static void check_mnist_values(const dataset *d, long n) {
    ck_assert_int_eq(d->n, n);
    ck_assert_int_eq(d->features, 784);
    ck_assert_int_eq(d->classes, 10);
    for (long i = 0; i < n; i++) {
        ck_assert_float_eq(d->y[i], (float)lab(i));
        for (long j = 0; j < 784; j++)
            ck_assert_float_eq_tol(d->x[i * 784 + j], pix(i, j) / 255.0f, 1e-7);
    }
}

/* ---------------------------------------------------------------- IDX */

START_TEST(test_idx_gz_values) {
    put_mnist(1);
    data_spec s = mnist_spec();
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    check_mnist_values(&sp.train, NTRAIN);
    check_mnist_values(&sp.test, NTEST);
    ck_assert_int_eq(sp.val.n, 0);
    /* pixel 0 of image 0 is 0, a 255 appears: the scale reaches both ends */
    float lo = 1, hi = 0;
    for (long k = 0; k < NTRAIN * 784; k++) {
        if (sp.train.x[k] < lo) lo = sp.train.x[k];
        if (sp.train.x[k] > hi) hi = sp.train.x[k];
    }
    ck_assert_float_eq(lo, 0.0f);
    ck_assert_float_eq(hi, 1.0f);
    dataset_splits_free(&sp);
    ck_assert_ptr_null(sp.train.x);
}
END_TEST

START_TEST(test_idx_raw_values) {
    put_mnist(0);
    data_spec s = mnist_spec();
    s.source = DATA_FASHION_MNIST; /* data.path overrides the default directory */
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    check_mnist_values(&sp.train, NTRAIN);
    check_mnist_values(&sp.test, NTEST);
    dataset_splits_free(&sp);
}
END_TEST

START_TEST(test_idx_small_images_direct) {
    size_t li, ll;
    unsigned char *im = idx_images(0x803, 4, 2, 3, &li);
    unsigned char *lb = idx_labels(0x801, 4, &ll);
    put_file("i.gz", im, li, 1);
    put_file("l", lb, ll, 0);
    free(im);
    free(lb);
    char pi[512], pl[512], err[ERR_MAX];
    tpath(pi, sizeof pi, "i.gz");
    tpath(pl, sizeof pl, "l");
    dataset d;
    ck_assert_msg(idx_load(pi, pl, 0, 0, 10, &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 4);
    ck_assert_int_eq(d.features, 6);
    ck_assert_float_eq_tol(d.x[1 * 6 + 5], pix(1, 5) / 255.0f, 1e-7);
    dataset_free(&d);
    /* the same file with 28x28 required */
    ck_assert_int_eq(idx_load(pi, pl, 28, 28, 10, &d, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "wrong dimensions: 2x3 images, expected 28x28"));
    ck_assert_ptr_null(d.x);
}
END_TEST

/* Replaces train-images (gz) by the first keep bytes of a valid file. */
static void put_cut_images(size_t keep, int gz) {
    size_t len;
    unsigned char *b = idx_images(0x803, NTRAIN, 28, 28, &len);
    ck_assert_uint_le(keep, len);
    put_file(gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte", b, keep, gz);
    free(b);
}

START_TEST(test_idx_header_only) {
    put_mnist(1);
    put_cut_images(16, 1);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: truncated", "expected 4704 bytes of pixels, got 0");
}
END_TEST

START_TEST(test_idx_half_pixels) {
    put_mnist(1);
    put_cut_images(16 + NTRAIN * 784 / 2, 1);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: truncated", "got 2352");
}
END_TEST

START_TEST(test_idx_half_pixels_raw) {
    put_mnist(0);
    put_cut_images(16 + 1000, 0);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte: truncated", "got 1000");
}
END_TEST

START_TEST(test_idx_short_header) {
    put_mnist(1);
    put_cut_images(9, 1);
    data_spec s = mnist_spec();
    load_fails(&s, "truncated", "bytes of header, got 9");
}
END_TEST

START_TEST(test_idx_cut_gzip_stream) {
    /* a gzip file cut in the middle of its compressed stream */
    put_mnist(1);
    char p[512];
    tpath(p, sizeof p, "train-images-idx3-ubyte.gz");
    size_t len;
    char *gz = file_read_all(p, 1 << 20, &len);
    ck_assert_ptr_nonnull(gz);
    put_file("train-images-idx3-ubyte.gz", gz, len / 2, 0);
    free(gz);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: ", NULL);
}
END_TEST

START_TEST(test_idx_corrupt_gzip) {
    put_mnist(1);
    char p[512];
    tpath(p, sizeof p, "train-labels-idx1-ubyte.gz");
    size_t len;
    char *gz = file_read_all(p, 1 << 20, &len);
    ck_assert_ptr_nonnull(gz);
    for (size_t i = 12; i < len - 8; i++) gz[i] = (char)0xff; /* deflate data destroyed */
    put_file("train-labels-idx1-ubyte.gz", gz, len, 0);
    free(gz);
    data_spec s = mnist_spec();
    load_fails(&s, "train-labels-idx1-ubyte.gz: ", NULL);
}
END_TEST

START_TEST(test_idx_labels_count_mismatch) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_labels(0x801, NTRAIN - 1, &len);
    put_file("train-labels-idx1-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-labels-idx1-ubyte.gz: 5 labels for 6 images", NULL);
}
END_TEST

START_TEST(test_idx_labels_truncated) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_labels(0x801, NTRAIN, &len);
    put_file("train-labels-idx1-ubyte.gz", b, len - 3, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-labels-idx1-ubyte.gz: truncated", "expected 6 bytes of labels, got 3");
}
END_TEST

/* The largest single allocation while a test runs, where the sanitizer
 * runtime offers allocation hooks (the ASan build of `make test`); 0 when
 * it does not (then only the error is checked). */
extern int __sanitizer_install_malloc_and_free_hooks(void (*m)(const volatile void *, size_t),
                                                     void (*f)(const volatile void *)) __attribute__((weak));
static size_t g_max_alloc;
static void on_alloc(const volatile void *p, size_t n) {
    (void)p;
    if (n > g_max_alloc) g_max_alloc = n;
}
static void on_release(const volatile void *p) { (void)p; }

/* tests/fuzz/fuzz_idx: a 16-byte image header and an 8-byte label header
 * claiming 2^29 examples of 1x2 pixels made idx_load reserve 2 GiB of labels
 * and 4 GiB of pixels before reading any (an abort where memory is capped);
 * buffers now grow with the data that arrives. */
START_TEST(test_idx_huge_count_no_data) {
    unsigned char img[16] = {0, 0, 8, 3, 0x20, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2};
    unsigned char lab[9] = {0, 0, 8, 1, 0x20, 0, 0, 0, 7};
    put_file("img", img, sizeof img, 0);
    put_file("lab", lab, sizeof lab, 0);
    char pi[512], pl[512], err[ERR_MAX];
    tpath(pi, sizeof pi, "img");
    tpath(pl, sizeof pl, "lab");
    int hooked = __sanitizer_install_malloc_and_free_hooks &&
                 __sanitizer_install_malloc_and_free_hooks(on_alloc, on_release) != 0;
    g_max_alloc = 0;
    dataset d;
    ck_assert_int_eq(idx_load(pi, pl, 0, 0, 10, &d, err), -1);
    ck_assert_msg(strstr(err, "truncated: expected 536870912 bytes of labels, got 1") != NULL, "%s", err);
    if (hooked) ck_assert_msg(g_max_alloc < (64u << 20), "largest allocation %zu bytes", g_max_alloc);
    ck_assert_ptr_null(d.x);
}
END_TEST

/* The same for CSV (found reading csv.c beside fuzz_idx's finding): a
 * header of 20000 columns and 50000 blank lines (90 KB) reserved 50001 rows
 * of 19999 floats (4 GB) before finding that no row has data. */
START_TEST(test_csv_blank_lines_no_reservation) {
    size_t cols = 20000, blanks = 50000;
    buf b;
    buf_init(&b, 1u << 20);
    for (size_t i = 0; i < cols; i++) ck_assert_int_eq(buf_appends(&b, i ? ",c" : "c"), 0);
    for (size_t i = 0; i < blanks; i++) ck_assert_int_eq(buf_appends(&b, "\n"), 0);
    put_file("wide.csv", b.data, b.len, 0);
    buf_release(&b);
    char p[512], err[ERR_MAX];
    tpath(p, sizeof p, "wide.csv");
    int hooked = __sanitizer_install_malloc_and_free_hooks &&
                 __sanitizer_install_malloc_and_free_hooks(on_alloc, on_release) != 0;
    g_max_alloc = 0;
    dataset d;
    ck_assert_int_eq(csv_load(p, 1, -1, "", &d, err), -1);
    ck_assert_msg(strstr(err, "no data rows") != NULL, "%s", err);
    if (hooked) ck_assert_msg(g_max_alloc < (64u << 20), "largest allocation %zu bytes", g_max_alloc);
}
END_TEST

START_TEST(test_idx_bad_magic) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_images(0x801, NTRAIN, 28, 28, &len); /* a label magic */
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: bad magic 0x00000801", "expected 0x00000803");
}
END_TEST

START_TEST(test_idx_text_file) {
    put_mnist(1);
    put_text("t10k-labels-idx1-ubyte.gz", "<html>not found</html>\n");
    data_spec s = mnist_spec();
    load_fails(&s, "t10k-labels-idx1-ubyte.gz: bad magic", NULL);
}
END_TEST

START_TEST(test_idx_wrong_dims) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_images(0x803, NTRAIN, 27, 28, &len);
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: wrong dimensions: 27x28 images, expected 28x28", NULL);
}
END_TEST

START_TEST(test_idx_zero_rows) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_images(0x803, NTRAIN, 0, 28, &len);
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "wrong dimensions: 0x28", NULL);
}
END_TEST

START_TEST(test_idx_label_out_of_range) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_labels(0x801, NTRAIN, &len);
    b[8 + 4] = 10;
    put_file("train-labels-idx1-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-labels-idx1-ubyte.gz: label 10 at index 4 out of range 0..9", NULL);
}
END_TEST

START_TEST(test_idx_empty_file) {
    put_mnist(1);
    put_file("t10k-images-idx3-ubyte.gz", "", 0, 0);
    data_spec s = mnist_spec();
    load_fails(&s, "t10k-images-idx3-ubyte.gz: empty file", NULL);
}
END_TEST

START_TEST(test_idx_empty_gzip) {
    put_mnist(1);
    put_file("train-images-idx3-ubyte.gz", "", 0, 1); /* a valid gzip of nothing */
    data_spec s = mnist_spec();
    load_fails(&s, "train-images-idx3-ubyte.gz: truncated", "got 0");
}
END_TEST

START_TEST(test_idx_missing_file) {
    put_mnist(1);
    char p[512];
    tpath(p, sizeof p, "t10k-labels-idx1-ubyte.gz");
    ck_assert_int_eq(unlink(p), 0);
    data_spec s = mnist_spec();
    load_fails(&s, "t10k-labels-idx1-ubyte.gz: cannot open: No such file or directory", NULL);
}
END_TEST

START_TEST(test_idx_missing_dir) {
    data_spec s = spec_for(DATA_FASHION_MNIST);
    snprintf(s.path, sizeof s.path, "%s/nope", tmpdir);
    load_fails(&s, "nope/train-images-idx3-ubyte.gz: cannot open", NULL);
}
END_TEST

START_TEST(test_idx_trailing_data) {
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_images(0x803, NTRAIN, 28, 28, &len);
    be32(b + 4, NTRAIN - 1); /* header says one image fewer than the file holds */
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    free(b);
    data_spec s = mnist_spec();
    load_fails(&s, "train-labels-idx1-ubyte.gz: 6 labels for 5 images", NULL);
    b = idx_labels(0x801, NTRAIN - 1, &len);
    put_file("train-labels-idx1-ubyte.gz", b, len, 1);
    free(b);
    load_fails(&s, "train-images-idx3-ubyte.gz: trailing data after 5 images", NULL);
}
END_TEST

START_TEST(test_mnist_needs_path) {
    data_spec s = spec_for(DATA_MNIST);
    load_fails(&s, "data.path is required for mnist", NULL);
}
END_TEST

START_TEST(test_fashion_mnist_real) {
    if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("test_fashion_mnist_real: skipped: %s not installed (package dataset-fashion-mnist)\n",
               FMNIST_DIR);
        return;
    }
    data_spec s = spec_for(DATA_FASHION_MNIST); /* path "" = the default directory */
    dataset_splits sp;
    char err[ERR_MAX];
    double t0 = mono_s();
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    double dt = mono_s() - t0;
    printf("fashion-mnist: loaded 60000+10000 examples in %.3f s\n", dt);
    ck_assert_int_eq(sp.train.n, 60000);
    ck_assert_int_eq(sp.test.n, 10000);
    ck_assert_int_eq(sp.train.features, 784);
    ck_assert_int_eq(sp.train.classes, 10);
    ck_assert_float_eq(sp.train.y[0], 9.0f); /* ankle boot */
    ck_assert_float_eq(sp.test.y[0], 9.0f);
    long count[10] = {0};
    for (long i = 0; i < sp.train.n; i++) count[(int)sp.train.y[i]]++;
    for (int c = 0; c < 10; c++) ck_assert_int_eq(count[c], 6000);
    dataset_splits_free(&sp);

    s.validation_split = 0.1f;
    s.limit = 0;
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    ck_assert_int_eq(sp.train.n, 54000);
    ck_assert_int_eq(sp.val.n, 6000);
    dataset_splits_free(&sp);
}
END_TEST

/* ---------------------------------------------------------------- limit, validation */

START_TEST(test_limit_caps_train_and_test) {
    put_mnist(1);
    data_spec s = mnist_spec();
    s.limit = 4;
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    check_mnist_values(&sp.train, 4);
    check_mnist_values(&sp.test, 3);
    dataset_splits_free(&sp);
    s.limit = 2;
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    check_mnist_values(&sp.train, 2);
    check_mnist_values(&sp.test, 2);
    dataset_splits_free(&sp);
}
END_TEST

/* data.limit: only the kept images are inflated. A training file of 2000
 * images of noise (deflate cannot shrink it, so it spans many blocks)
 * whose compressed data past its first half (past what zlib inflates
 * ahead of a read: its buffers, 512 KiB) is destroyed, its gzip
 * trailer intact: with a limit of 2 it loads (the first two images, as
 * they are), without one it is refused as corrupt, as before. */
START_TEST(test_limit_inflates_only_the_kept) {
    enum { NBIG = 2000 };
    put_mnist(1);
    size_t len = 16 + (size_t)NBIG * 784;
    unsigned char *b = xmalloc(len);
    be32(b, 0x803);
    be32(b + 4, NBIG);
    be32(b + 8, 28);
    be32(b + 12, 28);
    uint64_t st = 12345;
    for (size_t i = 16; i < len; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull; /* an LCG's high bits: noise */
        b[i] = (unsigned char)(st >> 56);
    }
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    size_t ll;
    unsigned char *lb = idx_labels(0x801, NBIG, &ll);
    put_file("train-labels-idx1-ubyte.gz", lb, ll, 1);
    free(lb);
    char p[512];
    tpath(p, sizeof p, "train-images-idx3-ubyte.gz");
    size_t glen;
    char *gz = file_read_all(p, 8 << 20, &glen);
    ck_assert_ptr_nonnull(gz);
    ck_assert_uint_gt(glen, len / 2); /* noise: the deflate data is about as long as the images */
    for (size_t i = glen / 2; i < glen - 8; i++) gz[i] = (char)0xff;
    put_file("train-images-idx3-ubyte.gz", gz, glen, 0);
    free(gz);
    data_spec s = mnist_spec();
    s.limit = 2;
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    ck_assert_int_eq(sp.train.n, 2);
    for (size_t j = 0; j < 2 * 784; j++) ck_assert_float_eq_tol(sp.train.x[j], b[16 + j] / 255.0f, 1e-7);
    ck_assert_float_eq(sp.train.y[1], (float)lab(1));
    check_mnist_values(&sp.test, 2);
    dataset_splits_free(&sp);
    free(b);
    s.limit = 0;
    load_fails(&s, "train-images-idx3-ubyte.gz: ", NULL);
}
END_TEST

/* Removes the .gz files put_mnist(1) wrote (the loader reads them first). */
static void drop_gz(void) {
    static const char *const names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[512];
        tpath(p, sizeof p, names[i]);
        ck_assert_int_eq(unlink(p), 0);
    }
}

/* With a limit, a file whose length is wrong is refused as without one:
 * cut short (gzip or raw) or longer than its header says. */
START_TEST(test_limit_still_checks_length) {
    put_mnist(1);
    put_cut_images(16 + NTRAIN * 784 / 2, 1);
    data_spec s = mnist_spec();
    s.limit = 2;
    load_fails(&s, "train-images-idx3-ubyte.gz: truncated", "expected 4704 bytes of pixels, got 2352");
    drop_gz();
    put_mnist(0);
    put_cut_images(16 + 3 * 784 + 5, 0);
    s.limit = 2;
    load_fails(&s, "train-images-idx3-ubyte: truncated", "expected 4704 bytes of pixels, got 2357");
    put_mnist(1);
    size_t len;
    unsigned char *b = idx_images(0x803, NTRAIN, 28, 28, &len);
    be32(b + 4, NTRAIN - 1);
    put_file("train-images-idx3-ubyte.gz", b, len, 1);
    free(b);
    b = idx_labels(0x801, NTRAIN - 1, &len);
    put_file("train-labels-idx1-ubyte.gz", b, len, 1);
    free(b);
    load_fails(&s, "train-images-idx3-ubyte.gz: trailing data after 5 images", NULL);
    /* raw and exact: loads, the first two only */
    drop_gz();
    put_mnist(0);
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    check_mnist_values(&sp.train, 2);
    check_mnist_values(&sp.test, 2);
    dataset_splits_free(&sp);
}
END_TEST

START_TEST(test_validation_split_is_the_tail) {
    data_spec s = spec_for(DATA_SYNTHETIC);
    s.examples = 1000;
    s.features = 3;
    s.seed = 5;
    dataset_splits all, sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &all, err) == 0, "%s", err);
    s.validation_split = 0.1f;
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    ck_assert_int_eq(sp.train.n, 900);
    ck_assert_int_eq(sp.val.n, 100);
    ck_assert_int_eq(sp.val.features, 3);
    ck_assert_int_eq(sp.val.classes, 2);
    ck_assert_int_eq(sp.test.n, 0);
    ck_assert_int_eq(memcmp(sp.train.x, all.train.x, 900 * 3 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(sp.val.x, all.train.x + 900 * 3, 100 * 3 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(sp.val.y, all.train.y + 900, 100 * sizeof(float)), 0);
    dataset_splits_free(&sp);
    dataset_splits_free(&all);

    /* Keras' floor(n * (1 - v)) with v a float: 60000 * 0.9 is 54000 */
    s.examples = 60000;
    s.features = 1;
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    ck_assert_int_eq(sp.train.n, 54000);
    ck_assert_int_eq(sp.val.n, 6000);
    dataset_splits_free(&sp);

    s.examples = 1;
    s.validation_split = 0.5f;
    load_fails(&s, "no training examples left", NULL);
    s.validation_split = 1.0f;
    load_fails(&s, "validation_split must be in [0, 1)", NULL);
}
END_TEST

/* ---------------------------------------------------------------- CSV */

static int csv(const char *text, int header, int label_column, const char *name, dataset *d,
               char *err) {
    put_text("data.csv", text);
    char p[512];
    tpath(p, sizeof p, "data.csv");
    int rc = csv_load(p, header, label_column, name, d, err);
    if (rc < 0) {
        ck_assert_ptr_null(d->x);
        ck_assert_ptr_null(d->y);
        ck_assert_int_eq(d->n, 0);
    }
    return rc;
}

#define CSV_FAILS(text, header, col, name, want)                                               \
    do {                                                                                       \
        dataset d_;                                                                            \
        char e_[ERR_MAX];                                                              \
        ck_assert_int_eq(csv(text, header, col, name, &d_, e_), -1);                           \
        ck_assert_msg(strstr(e_, want) != NULL, "error '%s' lacks '%s'", e_, want);            \
    } while (0)

START_TEST(test_csv_header_label_by_name) {
    dataset d;
    char err[ERR_MAX];
    ck_assert_msg(csv("a,label,b\n1.5,2,3\n-4,0,5e-1\n", 1, -1, "label", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 2);
    ck_assert_int_eq(d.features, 2);
    ck_assert_int_eq(d.classes, 3);
    float wx[] = {1.5f, 3, -4, 0.5f}, wy[] = {2, 0};
    for (int i = 0; i < 4; i++) ck_assert_float_eq(d.x[i], wx[i]);
    for (int i = 0; i < 2; i++) ck_assert_float_eq(d.y[i], wy[i]);
    dataset_free(&d);
}
END_TEST

START_TEST(test_csv_no_header_label_by_index) {
    dataset d;
    char err[ERR_MAX];
    /* last column by default, CRLF line ends, blank lines, no final newline */
    ck_assert_msg(csv("1,2,1\r\n\r\n3,4,0\r\n  \n5,6,4", 0, -1, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 3);
    ck_assert_int_eq(d.features, 2);
    ck_assert_int_eq(d.classes, 5);
    ck_assert_float_eq(d.x[4], 5);
    ck_assert_float_eq(d.x[5], 6);
    ck_assert_float_eq(d.y[2], 4);
    dataset_free(&d);
    /* first column */
    ck_assert_msg(csv("7,0.25,0.5\n8,1,2\n", 0, 0, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.classes, 9);
    ck_assert_float_eq(d.y[0], 7);
    ck_assert_float_eq(d.x[0], 0.25f);
    ck_assert_float_eq(d.x[3], 2);
    dataset_free(&d);
    /* a header skipped, label by index */
    ck_assert_msg(csv("x,y,z\n1,2,3\n", 1, 1, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 1);
    ck_assert_float_eq(d.y[0], 2);
    dataset_free(&d);
}
END_TEST

START_TEST(test_csv_quotes_and_spaces) {
    dataset d;
    char err[ERR_MAX];
    ck_assert_msg(csv("\"f,1\", \"the \"\"label\"\"\" \n \"1.5\" , 2 \n", 1, 0, "the \"label\"", &d,
                      err) == 0,
                  "%s", err);
    ck_assert_int_eq(d.n, 1);
    ck_assert_float_eq(d.x[0], 1.5f);
    ck_assert_float_eq(d.y[0], 2);
    dataset_free(&d);
    CSV_FAILS("a,b\n\"1,2\n", 1, -1, "", ":2: column 1: unterminated quote");
    CSV_FAILS("a,b\n\"1\"x,2\n", 1, -1, "", ":2: column 1: text after closing quote");
}
END_TEST

START_TEST(test_csv_regression_labels) {
    dataset d;
    char err[ERR_MAX];
    ck_assert_msg(csv("1,0.5\n2,3\n", 0, -1, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.classes, 0);
    dataset_free(&d);
    ck_assert_msg(csv("1,-1\n2,3\n", 0, -1, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.classes, 0);
    dataset_free(&d);
    ck_assert_msg(csv("1,0\n2,0\n", 0, -1, "", &d, err) == 0, "%s", err);
    ck_assert_int_eq(d.classes, 1);
    dataset_free(&d);
}
END_TEST

START_TEST(test_csv_ragged) {
    CSV_FAILS("a,b,c\n1,2,3\n4,5\n", 1, -1, "", "data.csv:3: expected 3 columns, got 2");
    CSV_FAILS("1,2,3\n4,5,6,7\n", 0, -1, "", "data.csv:2: expected 3 columns, got 4");
    CSV_FAILS("a,b\n1,2,\n", 1, -1, "", "data.csv:2: expected 2 columns, got 3");
}
END_TEST

START_TEST(test_csv_not_a_number) {
    buf b;
    buf_init(&b, 1 << 16);
    ck_assert_int_eq(buf_appends(&b, "a,b,c,d\n"), 0);
    for (int i = 2; i < 17; i++) ck_assert_int_eq(buf_printf(&b, "%d,1,2,3\n", i), 0);
    ck_assert_int_eq(buf_appends(&b, "1,2,abc,4\n5,6,7,8\n"), 0); /* line 17 */
    CSV_FAILS(b.data, 1, -1, "", "data.csv:17: column 3: not a number: 'abc'");
    buf_release(&b);
    CSV_FAILS("1,2x\n", 0, -1, "", "data.csv:1: column 2: not a number: '2x'");
    CSV_FAILS("1,,2\n", 0, -1, "", "data.csv:1: column 2: empty value");
    CSV_FAILS("nan,1\n", 0, -1, "", "data.csv:1: column 1: not a finite number: 'nan'");
    CSV_FAILS("1e999,1\n", 0, -1, "", "column 1: not a finite number");
    CSV_FAILS("1,2\n3,\x01\n", 0, -1, "", "data.csv:2: column 2: not a number: '?'");
}
END_TEST

START_TEST(test_csv_empty) {
    CSV_FAILS("", 1, -1, "", "data.csv: no data rows (empty file)");
    CSV_FAILS("", 0, -1, "", "no data rows");
    CSV_FAILS("a,b,c\n", 1, -1, "", "data.csv: no data rows");
    CSV_FAILS("\n\n\n", 0, -1, "", "no data rows");
    CSV_FAILS("1\n2\n", 0, -1, "", "need at least 2");
}
END_TEST

START_TEST(test_csv_label_column_errors) {
    CSV_FAILS("a,b\n1,2\n", 1, -1, "c", "no column named 'c' in the header");
    CSV_FAILS("1,2\n", 0, -1, "b", "needs data.header");
    CSV_FAILS("1,2\n", 0, 2, "", "data.label_column 2 out of range: the file has 2 columns");
    CSV_FAILS("1,2\n", 0, -3, "", "out of range");
}
END_TEST

START_TEST(test_csv_missing_and_long_line) {
    dataset d;
    char err[ERR_MAX];
    ck_assert_int_eq(csv_load("/nonexistent/x.csv", 1, -1, "", &d, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.csv: cannot open: No such file"));
    ck_assert_ptr_null(d.x);
    size_t n = CSV_MAX_LINE + 10;
    char *big = xmalloc(n + 16);
    memcpy(big, "1,2\n", 4);
    memset(big + 4, '1', n);
    memcpy(big + 4 + n, ",2\n", 4);
    CSV_FAILS(big, 0, -1, "", "data.csv:2: line longer than");
    free(big);
}
END_TEST

START_TEST(test_csv_via_dataset_load) {
    put_text("data.csv", "f1,f2,y\n0,1,1\n1,0,1\n1,1,0\n0,0,0\n");
    data_spec s = spec_for(DATA_CSV);
    tpath(s.path, sizeof s.path, "data.csv");
    s.validation_split = 0.25f;
    dataset_splits sp;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &sp, err) == 0, "%s", err);
    ck_assert_int_eq(sp.train.n, 3);
    ck_assert_int_eq(sp.val.n, 1);
    ck_assert_int_eq(sp.test.n, 0);
    ck_assert_int_eq(sp.train.classes, 2);
    ck_assert_float_eq(sp.val.x[0], 0);
    ck_assert_float_eq(sp.val.y[0], 0);
    dataset_splits_free(&sp);
    s.path[0] = '\0';
    load_fails(&s, "data.path is required for csv", NULL);
}
END_TEST

/* ---------------------------------------------------------------- synthetic */

START_TEST(test_synthetic_deterministic) {
    data_spec s = spec_for(DATA_SYNTHETIC);
    s.examples = 500;
    s.features = 7;
    s.seed = 42;
    dataset_splits a, b, c, lim;
    char err[ERR_MAX];
    ck_assert_msg(dataset_load(&s, &a, err) == 0, "%s", err);
    ck_assert_msg(dataset_load(&s, &b, err) == 0, "%s", err);
    s.seed = 43;
    ck_assert_msg(dataset_load(&s, &c, err) == 0, "%s", err);
    s.seed = 42;
    s.limit = 100;
    ck_assert_msg(dataset_load(&s, &lim, err) == 0, "%s", err);
    ck_assert_int_eq(a.train.n, 500);
    ck_assert_int_eq(a.train.features, 7);
    ck_assert_int_eq(a.train.classes, 2);
    ck_assert_int_eq(a.test.n, 0);
    ck_assert_int_eq(memcmp(a.train.x, b.train.x, 500 * 7 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(a.train.y, b.train.y, 500 * sizeof(float)), 0);
    ck_assert_int_ne(memcmp(a.train.x, c.train.x, 500 * 7 * sizeof(float)), 0);
    ck_assert_int_eq(lim.train.n, 100);
    ck_assert_int_eq(memcmp(a.train.x, lim.train.x, 100 * 7 * sizeof(float)), 0);
    int ones = 0;
    double mean = 0;
    for (long i = 0; i < 500; i++) {
        ck_assert(a.train.y[i] == 0.0f || a.train.y[i] == 1.0f);
        ones += a.train.y[i] == 1.0f;
    }
    for (long k = 0; k < 500 * 7; k++) {
        ck_assert(a.train.x[k] >= 0.0f && a.train.x[k] < 1.0f);
        mean += a.train.x[k];
    }
    mean /= 3500;
    ck_assert_int_gt(ones, 200);
    ck_assert_int_lt(ones, 300);
    ck_assert(mean > 0.45 && mean < 0.55);
    dataset_splits_free(&a);
    dataset_splits_free(&b);
    dataset_splits_free(&c);
    dataset_splits_free(&lim);
    s.features = 0;
    load_fails(&s, "data.features must be > 0", NULL);
}
END_TEST

/* ---------------------------------------------------------------- batcher */

/* n examples of 2 features: x = (i, -i), y = i: an example names itself. */
static dataset make_index_set(long n) {
    dataset d = {n, 2, 0, xmalloc((size_t)n * 2 * sizeof(float)), xmalloc((size_t)n * sizeof(float))};
    for (long i = 0; i < n; i++) {
        d.x[2 * i] = (float)i;
        d.x[2 * i + 1] = (float)-i;
        d.y[i] = (float)i;
    }
    return d;
}

/* Runs one epoch; ids[k] = the example handed out k-th. Returns the count. */
static long run_epoch(batcher *b, long *ids, int *nbatches) {
    float x[64 * 2], y[64];
    long k = 0;
    int got, nb = 0;
    while ((got = batcher_next(b, x, y)) > 0) {
        ck_assert_int_le(got, b->batch_size);
        for (int i = 0; i < got; i++) {
            ck_assert_float_eq(x[2 * i], y[i]);
            ck_assert_float_eq(x[2 * i + 1], -y[i]);
            ids[k++] = (long)y[i];
        }
        nb++;
    }
    ck_assert_int_eq(batcher_next(b, x, y), 0);
    if (nbatches) *nbatches = nb;
    return k;
}

START_TEST(test_batcher_each_example_once) {
    const long n = 103;
    dataset d = make_index_set(n);
    int bufs[] = {0, 1, 2, 7, 50, 103, 1000, -1};
    long ids[103], first[103];
    char seen[103];
    for (size_t t = 0; t < sizeof bufs / sizeof bufs[0]; t++) {
        for (int bs = 1; bs <= 64; bs *= 4) {
            batcher b;
            ck_assert_int_eq(batcher_init(&b, dataset_shard(&d, 0, 1), bs, bufs[t], 9), 0);
            for (long ep = 0; ep < 3; ep++) {
                batcher_reset(&b, ep);
                ck_assert_int_eq(run_epoch(&b, ids, NULL), n);
                memset(seen, 0, sizeof seen);
                for (long k = 0; k < n; k++) {
                    ck_assert_int_eq(seen[ids[k]], 0);
                    seen[ids[k]] = 1;
                    /* tf.data: output k comes from the buffer, i.e. the input's first k + B */
                    if (bufs[t] > 0) ck_assert_int_lt(ids[k], k + bufs[t]);
                    if (bufs[t] == 0 || bufs[t] == 1) ck_assert_int_eq(ids[k], k);
                }
                if (ep == 0) memcpy(first, ids, sizeof ids);
                else if (bufs[t] > 1 || bufs[t] < 0)
                    ck_assert_msg(memcmp(first, ids, sizeof ids) != 0,
                                  "buffer %d: epoch %ld repeats epoch 0", bufs[t], ep);
            }
            batcher_release(&b);
        }
    }
    dataset_free(&d);
}
END_TEST

START_TEST(test_batcher_deterministic) {
    dataset d = make_index_set(200);
    batcher a, b, c;
    long ia[200], ib[200], ic[200];
    ck_assert_int_eq(batcher_init(&a, dataset_shard(&d, 0, 1), 32, -1, 7), 0);
    ck_assert_int_eq(batcher_init(&b, dataset_shard(&d, 0, 1), 32, -1, 7), 0);
    ck_assert_int_eq(batcher_init(&c, dataset_shard(&d, 0, 1), 32, -1, 8), 0);
    /* a walks epochs 0..3; b jumps to 3 directly: the same order */
    for (long ep = 0; ep < 4; ep++) {
        batcher_reset(&a, ep);
        run_epoch(&a, ia, NULL);
    }
    batcher_reset(&b, 3);
    run_epoch(&b, ib, NULL);
    ck_assert_int_eq(memcmp(ia, ib, sizeof ia), 0);
    batcher_reset(&c, 3);
    run_epoch(&c, ic, NULL);
    ck_assert_int_ne(memcmp(ia, ic, sizeof ia), 0);
    /* the order is not the identity */
    int moved = 0;
    for (int i = 0; i < 200; i++) moved += ia[i] != i;
    ck_assert_int_gt(moved, 150);
    /* mid-epoch resume: (epoch 3, pos 96) continues where a was */
    batcher_seek(&b, 3, 96);
    long rest[200];
    ck_assert_int_eq(run_epoch(&b, rest, NULL), 104);
    ck_assert_int_eq(memcmp(rest, ia + 96, 104 * sizeof(long)), 0);
    batcher_release(&a);
    batcher_release(&b);
    batcher_release(&c);
    dataset_free(&d);
}
END_TEST

START_TEST(test_batcher_full_shuffle_uniform) {
    /* buffer >= n is a uniform permutation: each position sees each example
     * about equally often over many epochs */
    dataset d = make_index_set(4);
    batcher b;
    ck_assert_int_eq(batcher_init(&b, dataset_shard(&d, 0, 1), 4, 4, 1), 0);
    int hits[4][4] = {{0}};
    long ids[4];
    for (long ep = 0; ep < 4000; ep++) {
        batcher_reset(&b, ep);
        run_epoch(&b, ids, NULL);
        for (int k = 0; k < 4; k++) hits[k][ids[k]]++;
    }
    for (int k = 0; k < 4; k++)
        for (int e = 0; e < 4; e++) ck_assert_msg(hits[k][e] > 850 && hits[k][e] < 1150,
                                                  "pos %d example %d: %d of 4000", k, e, hits[k][e]);
    batcher_release(&b);
    dataset_free(&d);
}
END_TEST

START_TEST(test_batcher_short_last_batch) {
    dataset d = make_index_set(10);
    batcher b;
    ck_assert_int_eq(batcher_init(&b, dataset_shard(&d, 0, 1), 4, 0, 0), 0);
    ck_assert_int_eq(batcher_batches(&b), 3);
    float x[8], y[4];
    ck_assert_int_eq(batcher_next(&b, x, y), 4);
    ck_assert_int_eq(batcher_next(&b, x, y), 4);
    ck_assert_int_eq(batcher_next(&b, x, y), 2);
    ck_assert_float_eq(y[0], 8);
    ck_assert_float_eq(y[1], 9);
    ck_assert_int_eq(batcher_next(&b, x, y), 0);
    batcher_reset(&b, 1);
    ck_assert_int_eq(batcher_next(&b, x, y), 4);
    ck_assert_float_eq(y[0], 0);
    batcher_release(&b);
    ck_assert_int_eq(batcher_init(&b, dataset_shard(&d, 0, 1), 0, 0, 0), -1);
    dataset_free(&d);
}
END_TEST

START_TEST(test_shards_cover_disjointly) {
    for (long n = 0; n < 40; n += 3) {
        dataset d = make_index_set(n > 0 ? n : 1);
        d.n = n;
        for (int k = 1; k <= 7; k++) {
            long next = 0, lo = n, hi = 0;
            for (int i = 0; i < k; i++) {
                dataset_view v = dataset_shard(&d, i, k);
                ck_assert_ptr_eq(v.ds, &d);
                ck_assert_int_eq(v.begin, next); /* contiguous, in order, no overlap */
                long sz = dataset_view_size(v);
                if (sz < lo) lo = sz;
                if (sz > hi) hi = sz;
                next = v.end;
            }
            ck_assert_int_eq(next, n);
            ck_assert_int_le(hi - lo, 1);
        }
        ck_assert_int_eq(dataset_view_size(dataset_shard(&d, 3, 3)), 0);
        ck_assert_int_eq(dataset_view_size(dataset_shard(&d, -1, 3)), 0);
        d.n = n > 0 ? n : 1;
        dataset_free(&d);
    }
    /* a batcher over a shard hands out exactly that shard */
    dataset d = make_index_set(10);
    dataset_view v = dataset_shard(&d, 1, 3); /* [4, 7) */
    ck_assert_int_eq(v.begin, 4);
    ck_assert_int_eq(v.end, 7);
    batcher b;
    ck_assert_int_eq(batcher_init(&b, v, 2, -1, 3), 0);
    long ids[10];
    ck_assert_int_eq(run_epoch(&b, ids, NULL), 3);
    long sum = ids[0] + ids[1] + ids[2];
    ck_assert_int_eq(sum, 4 + 5 + 6);
    for (int i = 0; i < 3; i++) ck_assert(ids[i] >= 4 && ids[i] < 7);
    batcher_release(&b);
    dataset_free(&d);
}
END_TEST

START_TEST(test_replica_slices) {
    int off, len;
    int want[3][2] = {{0, 4}, {4, 3}, {7, 3}};
    for (int r = 0; r < 3; r++) {
        batch_replica_slice(10, r, 3, &off, &len);
        ck_assert_int_eq(off, want[r][0]);
        ck_assert_int_eq(len, want[r][1]);
    }
    for (int count = 0; count < 50; count++)
        for (int R = 1; R <= 8; R++) {
            int next = 0;
            for (int r = 0; r < R; r++) {
                batch_replica_slice(count, r, R, &off, &len);
                ck_assert_int_eq(off, next);
                ck_assert(len == count / R || len == count / R + 1);
                next = off + len;
            }
            ck_assert_int_eq(next, count);
        }
    batch_replica_slice(2, 3, 4, &off, &len);
    ck_assert_int_eq(len, 0);
    batch_replica_slice(8, 4, 4, &off, &len);
    ck_assert_int_eq(len, 0);
}
END_TEST

static Suite *data_suite(void) {
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("idx");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_idx_gz_values);
    tcase_add_test(tc, test_idx_raw_values);
    tcase_add_test(tc, test_idx_small_images_direct);
    tcase_add_test(tc, test_idx_header_only);
    tcase_add_test(tc, test_idx_half_pixels);
    tcase_add_test(tc, test_idx_half_pixels_raw);
    tcase_add_test(tc, test_idx_short_header);
    tcase_add_test(tc, test_idx_cut_gzip_stream);
    tcase_add_test(tc, test_idx_corrupt_gzip);
    tcase_add_test(tc, test_idx_labels_count_mismatch);
    tcase_add_test(tc, test_idx_labels_truncated);
    tcase_add_test(tc, test_idx_huge_count_no_data);
    tcase_add_test(tc, test_idx_bad_magic);
    tcase_add_test(tc, test_idx_text_file);
    tcase_add_test(tc, test_idx_wrong_dims);
    tcase_add_test(tc, test_idx_zero_rows);
    tcase_add_test(tc, test_idx_label_out_of_range);
    tcase_add_test(tc, test_idx_empty_file);
    tcase_add_test(tc, test_idx_empty_gzip);
    tcase_add_test(tc, test_idx_missing_file);
    tcase_add_test(tc, test_idx_missing_dir);
    tcase_add_test(tc, test_idx_trailing_data);
    tcase_add_test(tc, test_mnist_needs_path);
    tcase_add_test(tc, test_fashion_mnist_real);
    tcase_add_test(tc, test_limit_caps_train_and_test);
    tcase_add_test(tc, test_limit_inflates_only_the_kept);
    tcase_add_test(tc, test_limit_still_checks_length);
    tcase_add_test(tc, test_validation_split_is_the_tail);
    suite_add_tcase(s, tc);

    tc = tcase_create("csv");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_csv_blank_lines_no_reservation);
    tcase_add_test(tc, test_csv_header_label_by_name);
    tcase_add_test(tc, test_csv_no_header_label_by_index);
    tcase_add_test(tc, test_csv_quotes_and_spaces);
    tcase_add_test(tc, test_csv_regression_labels);
    tcase_add_test(tc, test_csv_ragged);
    tcase_add_test(tc, test_csv_not_a_number);
    tcase_add_test(tc, test_csv_empty);
    tcase_add_test(tc, test_csv_label_column_errors);
    tcase_add_test(tc, test_csv_missing_and_long_line);
    tcase_add_test(tc, test_csv_via_dataset_load);
    suite_add_tcase(s, tc);

    tc = tcase_create("synthetic");
    tcase_add_test(tc, test_synthetic_deterministic);
    suite_add_tcase(s, tc);

    tc = tcase_create("batcher");
    tcase_add_test(tc, test_batcher_each_example_once);
    tcase_add_test(tc, test_batcher_deterministic);
    tcase_add_test(tc, test_batcher_full_shuffle_uniform);
    tcase_add_test(tc, test_batcher_short_last_batch);
    tcase_add_test(tc, test_shards_cover_disjointly);
    tcase_add_test(tc, test_replica_slices);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(data_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}
