/* csv.c - the CSV loader: numeric columns, one example a line, an optional
 * header, the label in one column chosen by index or by header name. Every
 * value is checked (strtof, whole field, finite) and every error names the
 * file, line and column: "data.csv:17: column 3: not a number: 'abc'".
 * Lines and columns in messages count from 1; label_column counts from 0. */
#include "dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

#define CSV_MAX_CLASSES 65536

static const char *path_show(const char *p) {
    size_t n = strlen(p);
    return n > 100 ? p + n - 100 : p;
}

/* A printable excerpt of a bad value for messages. */
static void excerpt(const char *s, char *out, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 4 < cap && i < 40; i++)
        out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (s[i] && i + 4 < cap) {
        out[i++] = '.';
        out[i++] = '.';
        out[i++] = '.';
    }
    out[i] = '\0';
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

typedef struct csv_ctx {
    const char *path;
    long line;           /* 1-based line number of the current line */
    char **fields;       /* (CSV_MAX_COLUMNS) starts of the current line's fields */
    char *err;
} csv_ctx;

/* Splits the line [p, e) in place into NUL-terminated fields (quotes "" as in
 * RFC 4180, without newlines inside). *e must be writable. Returns the field
 * count, or -1 with err filled. */
static int csv_split(csv_ctx *c, char *p, char *e) {
    int nf = 0;
    for (;;) {
        if (nf >= CSV_MAX_COLUMNS) {
            snprintf(c->err, ERR_MAX, "%s:%ld: too many columns (max %d)",
                     path_show(c->path), c->line, CSV_MAX_COLUMNS);
            return -1;
        }
        char *s = p;
        while (p < e && is_blank(*p)) p++;
        if (p < e && *p == '"') {
            char *w = s;
            p++;
            for (;;) {
                if (p >= e) {
                    snprintf(c->err, ERR_MAX, "%s:%ld: column %d: unterminated quote",
                             path_show(c->path), c->line, nf + 1);
                    return -1;
                }
                if (*p == '"') {
                    if (p + 1 < e && p[1] == '"') {
                        *w++ = '"';
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                *w++ = *p++;
            }
            while (p < e && is_blank(*p)) p++;
            if (p < e && *p != ',') {
                snprintf(c->err, ERR_MAX, "%s:%ld: column %d: text after closing quote",
                         path_show(c->path), c->line, nf + 1);
                return -1;
            }
            *w = '\0';
        } else {
            while (p < e && *p != ',') p++;
        }
        c->fields[nf++] = s;
        if (p >= e) {
            *p = '\0';
            return nf;
        }
        *p++ = '\0'; /* the comma */
    }
}

/* Parses one whole field as a finite float. */
static int csv_number(csv_ctx *c, const char *s, int col, float *v) {
    char ex[48];
    const char *b = s;
    while (is_blank(*b)) b++;
    const char *end = b + strlen(b);
    while (end > b && is_blank(end[-1])) end--;
    if (end == b) {
        snprintf(c->err, ERR_MAX, "%s:%ld: column %d: empty value", path_show(c->path),
                 c->line, col + 1);
        return -1;
    }
    char *stop;
    errno = 0;
    float f = strtof(b, &stop);
    if (stop != end) {
        excerpt(s, ex, sizeof ex);
        snprintf(c->err, ERR_MAX, "%s:%ld: column %d: not a number: '%s'",
                 path_show(c->path), c->line, col + 1, ex);
        return -1;
    }
    if (!isfinite(f)) {
        excerpt(s, ex, sizeof ex);
        snprintf(c->err, ERR_MAX, "%s:%ld: column %d: not a finite number: '%s'",
                 path_show(c->path), c->line, col + 1, ex);
        return -1;
    }
    *v = f;
    return 0;
}

static int csv_label_index(csv_ctx *c, int ncols, int label_column, const char *name, int header) {
    if (name && name[0]) {
        if (!header) {
            snprintf(c->err, ERR_MAX,
                     "%s: data.label_column_name '%.64s' needs data.header", path_show(c->path), name);
            return -1;
        }
        for (int i = 0; i < ncols; i++) {
            const char *h = c->fields[i];
            while (is_blank(*h)) h++;
            size_t n = strlen(h);
            while (n > 0 && is_blank(h[n - 1])) n--;
            if (n == strlen(name) && memcmp(h, name, n) == 0) return i;
        }
        snprintf(c->err, ERR_MAX, "%s: no column named '%.64s' in the header",
                 path_show(c->path), name);
        return -1;
    }
    int idx = label_column < 0 ? ncols + label_column : label_column;
    if (idx < 0 || idx >= ncols) {
        snprintf(c->err, ERR_MAX, "%s: data.label_column %d out of range: the file has %d columns",
                 path_show(c->path), label_column, ncols);
        return -1;
    }
    return idx;
}

int csv_load(const char *path, int header, int label_column, const char *label_column_name,
             dataset *out, char err[ERR_MAX]) {
    int rc = -1;
    size_t len = 0;
    float *x = NULL, *y = NULL;
    csv_ctx c = {path, 0, NULL, err};
    memset(out, 0, sizeof *out);
    err[0] = '\0';

    char *data = file_read_all(path, (size_t)CSV_MAX_BYTES, &len);
    if (!data) {
        if (errno == EFBIG)
            snprintf(err, ERR_MAX, "%s: file larger than %ld MiB", path_show(path),
                     CSV_MAX_BYTES >> 20);
        else
            snprintf(err, ERR_MAX, "%s: cannot open: %s", path_show(path), strerror(errno));
        return -1;
    }
    c.fields = xmalloc(CSV_MAX_COLUMNS * sizeof(char *));

    long max_rows = 1;
    for (const char *q = data; (q = memchr(q, '\n', (size_t)(data + len - q))) != NULL; q++)
        max_rows++;

    int ncols = -1, lab = -1, nfeat = 0;
    long n = 0, cap_rows = 0;
    int integral = 1;
    float ymax = 0.0f;
    int need_header = header != 0;
    char *p = data, *end = data + len;
    while (p < end) {
        c.line++;
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e - p > CSV_MAX_LINE) {
            snprintf(err, ERR_MAX, "%s:%ld: line longer than %ld bytes", path_show(path),
                     c.line, CSV_MAX_LINE);
            goto out;
        }
        char *next = nl ? nl + 1 : end;
        if (e > p && e[-1] == '\r') e--;
        char *t = p;
        while (t < e && is_blank(*t)) t++;
        if (t == e) { /* blank line: skipped, as pandas does */
            p = next;
            continue;
        }
        int nf = csv_split(&c, p, e);
        if (nf < 0) goto out;
        p = next;
        if (ncols < 0) {
            ncols = nf;
            if (ncols < 2) {
                snprintf(err, ERR_MAX,
                         "%s:%ld: %d column: need at least 2 (features and a label)",
                         path_show(path), c.line, ncols);
                goto out;
            }
            lab = csv_label_index(&c, ncols, label_column, label_column_name, header);
            if (lab < 0) goto out;
            nfeat = ncols - 1;
            if ((uint64_t)max_rows * (uint64_t)nfeat > (uint64_t)DATASET_MAX_FLOATS) {
                snprintf(err, ERR_MAX, "%s: too large (over %ld values)", path_show(path),
                         DATASET_MAX_FLOATS);
                goto out;
            }
            if (need_header) {
                need_header = 0;
                continue;
            }
        } else if (nf != ncols) {
            snprintf(err, ERR_MAX, "%s:%ld: expected %d columns, got %d", path_show(path),
                     c.line, ncols, nf);
            goto out;
        }
        if (n == cap_rows) {
            /* grown with the rows that really come: blank lines count in
             * max_rows, so a 150 KB file could otherwise reserve 4 GiB */
            cap_rows = cap_rows ? cap_rows * 2 : 1024;
            if (cap_rows > max_rows) cap_rows = max_rows;
            x = xrealloc(x, (size_t)cap_rows * (size_t)nfeat * sizeof(float));
            y = xrealloc(y, (size_t)cap_rows * sizeof(float));
        }
        float *row = x + (size_t)n * (size_t)nfeat;
        for (int j = 0, k = 0; j < ncols; j++) {
            float v;
            if (csv_number(&c, c.fields[j], j, &v) < 0) goto out;
            if (j == lab) {
                y[n] = v;
                if (v < 0.0f || v != floorf(v) || v >= (float)CSV_MAX_CLASSES) integral = 0;
                else if (v > ymax) ymax = v;
            } else {
                row[k++] = v;
            }
        }
        n++;
    }
    if (n == 0) {
        snprintf(err, ERR_MAX, "%s: no data rows%s", path_show(path),
                 len == 0 ? " (empty file)" : "");
        goto out;
    }
    out->n = n;
    out->features = nfeat;
    out->classes = integral ? (int)ymax + 1 : 0;
    out->x = xrealloc(x, (size_t)n * (size_t)nfeat * sizeof(float));
    out->y = xrealloc(y, (size_t)n * sizeof(float));
    x = NULL;
    y = NULL;
    rc = 0;
out:
    free(c.fields);
    free(data);
    free(x);
    free(y);
    return rc;
}
