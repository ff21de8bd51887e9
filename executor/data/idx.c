/* idx.c - the IDX loader (MNIST, Fashion-MNIST): an image file and a label
 * file, gzip or raw (zlib reads both), validated whole before anything is
 * handed back: magic, dimensions, counts, label range, exact lengths. Pixels
 * are scaled to [0,1] through a 256-entry table while inflating. Asked for
 * the first `keep` examples only (data.limit), it inflates and scales only
 * their pixels: the images after them are checked by length alone, from the
 * file's size (raw) or the gzip trailer's (the inflated size mod 2^32),
 * and read through as before when that does not match. */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../../common/util.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
#define IDX_CHUNK (256 * 1024)
#define IDX_MAX_SIDE 4096

/* A path short enough to leave room for the message: its last 120 chars. */
static const char *path_show(const char *p) {
    size_t n = strlen(p);
    return n > 120 ? p + n - 120 : p;
}

typedef struct idx_file {
    const char *path;
    gzFile gz;
    int fd;                      /* the gz's (gzclose closes it) */
    off_t size;                  /* the file's bytes */
} idx_file;

static int idx_open(idx_file *f, const char *path, char *err) {
    f->path = path;
    f->gz = NULL;
    f->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, ERR_MAX, "%s: cannot open: %s", path_show(path), strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, ERR_MAX, "%s: not a regular file", path_show(path));
        close(fd);
        return -1;
    }
    if (st.st_size == 0) {
        snprintf(err, ERR_MAX, "%s: empty file", path_show(path));
        close(fd);
        return -1;
    }
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        snprintf(err, ERR_MAX, "%s: cannot open: out of memory", path_show(path));
        close(fd);
        return -1;
    }
    f->fd = fd;
    f->size = st.st_size;
    gzbuffer(f->gz, IDX_CHUNK);
    return 0;
}

/* 1 when the file, read `done` bytes into its content, holds exactly
 * `total` bytes of content, known without reading them: a raw file by its
 * size, a gzip file by its trailer's ISIZE (the content's size mod 2^32,
 * RFC 1952). 0 when that cannot be told so (then the rest is read through). */
static int idx_length_is(idx_file *f, uint64_t done, uint64_t total) {
    if (gzdirect(f->gz)) return (uint64_t)f->size == total && done <= total;
    unsigned char t[4];
    if (f->size < 18 || pread(f->fd, t, sizeof t, f->size - 4) != (ssize_t)sizeof t) return 0;
    uint32_t isize = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    return isize == (uint32_t)total;
}

static void idx_close(idx_file *f) {
    if (f->gz) gzclose(f->gz);
    f->gz = NULL;
}

/* Reads up to n bytes; returns the count read (short at end of file), or -1
 * with err filled when the gzip stream is corrupt. */
static long idx_read(idx_file *f, void *p, size_t n, char *err) {
    size_t got = 0;
    while (got < n) {
        size_t want = n - got;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(f->gz, (char *)p + got, (unsigned)want);
        if (r < 0) {
            int zerr = 0;
            const char *m = gzerror(f->gz, &zerr);
            snprintf(err, ERR_MAX, "%s: corrupt gzip data: %s", path_show(f->path),
                     m ? m : "read error");
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (long)got;
}

/* Says "truncated" with what was expected, noting a cut gzip stream. */
static void idx_truncated(idx_file *f, const char *what, size_t want, long got, char *err) {
    int zerr = 0;
    gzerror(f->gz, &zerr);
    snprintf(err, ERR_MAX, "%s: truncated%s: expected %zu bytes of %s, got %ld",
             path_show(f->path), zerr == Z_BUF_ERROR ? " gzip stream" : "", want, what, got);
}

/* Reads magic and dims; dims[0..ndim). */
static int idx_header(idx_file *f, uint32_t magic, int ndim, uint32_t *dims, char *err) {
    unsigned char h[16];
    size_t want = 4 + 4 * (size_t)ndim;
    long got = idx_read(f, h, 4, err);
    if (got < 0) return -1;
    if (got < 4) {
        idx_truncated(f, "header", want, got, err);
        return -1;
    }
    uint32_t m = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    if (m != magic) {
        snprintf(err, ERR_MAX,
                 "%s: bad magic 0x%08x: expected 0x%08x (IDX, unsigned bytes, %d dimension%s)",
                 path_show(f->path), m, magic, ndim, ndim == 1 ? "" : "s");
        return -1;
    }
    long more = idx_read(f, h + 4, want - 4, err);
    if (more < 0) return -1;
    if ((size_t)more < want - 4) {
        idx_truncated(f, "header", want, 4 + more, err);
        return -1;
    }
    for (int i = 0; i < ndim; i++) {
        const unsigned char *q = h + 4 + 4 * i;
        dims[i] = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
    }
    return 0;
}

/* p (cap elements of size elem) grown to hold need elements: doubling from
 * one chunk, never past max. Buffers grow with the data that really arrives,
 * so a header's count alone (a 40-byte file may claim 2^30 labels) never
 * reserves gigabytes (tests/fuzz/fuzz_idx). */
static void *idx_grow(void *p, size_t *cap, size_t need, size_t max, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : IDX_CHUNK;
    while (c < need) c *= 2;
    if (c > max) c = max;
    *cap = c;
    return xrealloc(p, c * elem);
}

/* After the expected bytes the file must end. */
static int idx_expect_eof(idx_file *f, const char *what, uint32_t count, char *err) {
    unsigned char c;
    long got = idx_read(f, &c, 1, err);
    if (got < 0) return -1;
    if (got > 0) {
        snprintf(err, ERR_MAX, "%s: trailing data after %u %s (header count too small?)",
                 path_show(f->path), count, what);
        return -1;
    }
    return 0;
}

int idx_load(const char *images_path, const char *labels_path, int want_rows, int want_cols,
             int classes, dataset *out, char err[ERR_MAX]) {
    return idx_load_head(images_path, labels_path, want_rows, want_cols, classes, 0, out, err);
}

int idx_load_head(const char *images_path, const char *labels_path, int want_rows, int want_cols,
                  int classes, long keep, dataset *out, char err[ERR_MAX]) {
    int rc = -1;
    idx_file fi = {0}, fl = {0};
    unsigned char *chunk = NULL;
    float *x = NULL, *y = NULL;
    uint32_t idims[3], ldims[1];
    memset(out, 0, sizeof *out);
    err[0] = '\0';

    if (idx_open(&fi, images_path, err) < 0) goto out;
    if (idx_header(&fi, IDX_MAGIC_IMAGES, 3, idims, err) < 0) goto out;
    uint32_t count = idims[0], rows = idims[1], cols = idims[2];
    if (rows == 0 || cols == 0 || rows > IDX_MAX_SIDE || cols > IDX_MAX_SIDE ||
        (want_rows > 0 && rows != (uint32_t)want_rows) ||
        (want_cols > 0 && cols != (uint32_t)want_cols)) {
        if (want_rows > 0 && want_cols > 0)
            snprintf(err, ERR_MAX, "%s: wrong dimensions: %ux%u images, expected %dx%d",
                     path_show(images_path), rows, cols, want_rows, want_cols);
        else
            snprintf(err, ERR_MAX, "%s: wrong dimensions: %ux%u images",
                     path_show(images_path), rows, cols);
        goto out;
    }
    if (count == 0) {
        snprintf(err, ERR_MAX, "%s: no images (count 0)", path_show(images_path));
        goto out;
    }
    size_t feat = (size_t)rows * cols;
    if ((uint64_t)count * feat > (uint64_t)DATASET_MAX_FLOATS) {
        snprintf(err, ERR_MAX, "%s: too large: %u images of %zu pixels",
                 path_show(images_path), count, feat);
        goto out;
    }

    if (idx_open(&fl, labels_path, err) < 0) goto out;
    if (idx_header(&fl, IDX_MAGIC_LABELS, 1, ldims, err) < 0) goto out;
    if (ldims[0] != count) {
        snprintf(err, ERR_MAX, "%s: %u labels for %u images in %s",
                 path_show(labels_path), ldims[0], count, path_show(images_path));
        goto out;
    }

    chunk = xmalloc(IDX_CHUNK);

    /* Labels. */
    size_t done = 0, ycap = 0, xcap = 0;
    while (done < count) {
        size_t n = count - done < IDX_CHUNK ? count - done : IDX_CHUNK;
        long got = idx_read(&fl, chunk, n, err);
        if (got < 0) goto out;
        y = idx_grow(y, &ycap, done + (size_t)got, count, sizeof(float));
        for (long i = 0; i < got; i++) {
            if (classes > 0 && chunk[i] >= classes) {
                snprintf(err, ERR_MAX, "%s: label %u at index %zu out of range 0..%d",
                         path_show(labels_path), chunk[i], done + (size_t)i, classes - 1);
                goto out;
            }
            y[done + (size_t)i] = (float)chunk[i];
        }
        done += (size_t)got;
        if ((size_t)got < n) {
            idx_truncated(&fl, "labels", count, (long)done, err);
            goto out;
        }
    }
    if (idx_expect_eof(&fl, "labels", count, err) < 0) goto out;

    /* Pixels of the examples kept, scaled while they stream in. */
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = (float)i / 255.0f;
    uint32_t kept = keep > 0 && (uint64_t)keep < count ? (uint32_t)keep : count;
    size_t total = (size_t)count * feat, wanted = (size_t)kept * feat;
    done = 0;
    while (done < wanted) {
        size_t n = wanted - done < IDX_CHUNK ? wanted - done : IDX_CHUNK;
        long got = idx_read(&fi, chunk, n, err);
        if (got < 0) goto out;
        x = idx_grow(x, &xcap, done + (size_t)got, wanted, sizeof(float));
        for (long i = 0; i < got; i++) x[done + (size_t)i] = lut[chunk[i]];
        done += (size_t)got;
        if ((size_t)got < n) {
            idx_truncated(&fi, "pixels", total, (long)done, err);
            goto out;
        }
    }
    /* The images after them: their length, from the file when it tells,
     * else read through (a cut or a longer file says so as before). */
    if (kept == count || !idx_length_is(&fi, 16 + (uint64_t)done, 16 + (uint64_t)total)) {
        while (done < total) {
            size_t n = total - done < IDX_CHUNK ? total - done : IDX_CHUNK;
            long got = idx_read(&fi, chunk, n, err);
            if (got < 0) goto out;
            done += (size_t)got;
            if ((size_t)got < n) {
                idx_truncated(&fi, "pixels", total, (long)done, err);
                goto out;
            }
        }
        if (idx_expect_eof(&fi, "images", count, err) < 0) goto out;
    }
    if (kept < count) y = xrealloc(y, (size_t)kept * sizeof(float));

    out->n = kept;
    out->features = (int)feat;
    out->classes = classes;
    out->x = x;
    out->y = y;
    x = NULL;
    y = NULL;
    rc = 0;
out:
    idx_close(&fi);
    idx_close(&fl);
    free(chunk);
    free(x);
    free(y);
    return rc;
}
