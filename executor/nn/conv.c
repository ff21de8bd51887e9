/* conv.c - convolutional kernels: conv2d, pooling, global average pooling
 * and batch normalization, forward and backward (see conv.h).
 *
 * conv2d lowers each chunk of examples to an im2col matrix (one row per
 * output position, K = kh * kw * c columns in the kernel's (kh, kw, c)
 * order) and runs one cblas_sgemm against the kernel viewed as (K, oc); the
 * bias and activation follow in one pass over the chunk's output while it
 * is still in cache. A chunk is as many whole examples as the scratch holds,
 * capped so that its im2col matrix and output stay near the size of an L2
 * cache (CONV_CHUNK_BYTES): larger chunks make the GEMMs no faster and send
 * every pass over them to memory. The backward rebuilds each chunk's im2col
 * matrix (nothing is kept from the forward), uses it for dw, then reuses the
 * same scratch for the gradient of the im2col matrix (dy w^T), which col2im
 * scatters into dx. A 1x1 conv with stride 1 and no padding needs no
 * im2col: x is its own matrix, and dx comes straight out of the GEMM.
 *
 * A 3x3 conv with stride 1 and at least WINO_MIN_C input and output
 * channels (the common case past a network's first layer) runs instead as
 * Winograd's F(2x2, 3x3), forward and backward, with 16 GEMMs per chunk
 * that do 4/9 of im2col's multiplications (see "Winograd" below); it falls
 * back to im2col when the scratch is too small for it. */
#include "conv.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

/* Bytes of im2col matrix plus output a chunk aims at (see the header). */
#define CONV_CHUNK_BYTES (512L * 1024)

/* Channel blocks of the per-channel reductions (stack accumulators). */
#define CH_BLOCK 64

/* ------------------------------------------------------------ geometry */

static void axis_geom(int in, int k, int s, padding_type pad, int *out, int *before)
{
    *out = 0;
    *before = 0;
    if (in <= 0 || k <= 0 || s <= 0)
        return;
    if (pad == PAD_SAME) {
        int o = (in + s - 1) / s;
        long total = (long)(o - 1) * s + k - in;
        *out = o;
        *before = total > 0 ? (int)(total / 2) : 0;
    } else {
        *out = k > in ? 0 : (in - k) / s + 1;
    }
}

void conv_geom_init(conv_geom *g, int h, int w, int c, int kh, int kw, int sh, int sw,
                    padding_type pad, int oc)
{
    g->h = h;
    g->w = w;
    g->c = c;
    g->kh = kh;
    g->kw = kw;
    g->sh = sh;
    g->sw = sw;
    axis_geom(h, kh, sh, pad, &g->oh, &g->pad_top);
    axis_geom(w, kw, sw, pad, &g->ow, &g->pad_left);
    g->oc = oc;
}

/* x is already the im2col matrix: a 1x1 window, stride 1, no padding. */
static int conv_direct(const conv_geom *g)
{
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pad_top == 0 &&
           g->pad_left == 0;
}

static long conv_k(const conv_geom *g)
{
    return (long)g->kh * g->kw * g->c;
}

/* Floats of im2col matrix one example needs. */
static size_t col_floats_per_example(const conv_geom *g)
{
    return (size_t)g->oh * (size_t)g->ow * (size_t)conv_k(g);
}

/* The chunk the kernels prefer: whole examples whose im2col matrix and
 * output (and input) come to about CONV_CHUNK_BYTES; at least one. */
static int preferred_chunk(const conv_geom *g)
{
    long per = ((long)g->oh * g->ow * (conv_k(g) + g->oc) + (long)g->h * g->w * g->c) *
               (long)sizeof(float);
    long nc = per > 0 ? CONV_CHUNK_BYTES / per : 1;
    return nc < 1 ? 1 : nc > 4096 ? 4096 : (int)nc;
}

/* Examples per chunk for n examples with this scratch. The contract says at
 * least one example's worth; less is a caller's bug that would write past
 * the scratch, so it stops the process rather than corrupt memory. */
static int chunk_examples(const conv_geom *g, int n, size_t scratch_floats)
{
    int nc = preferred_chunk(g);
    if (nc > n)
        nc = n;
    if (!conv_direct(g)) {
        size_t per = col_floats_per_example(g);
        size_t fit = per ? scratch_floats / per : (size_t)nc;
        if (fit < 1) {
            fprintf(stderr, "conv2d: scratch of %zu floats is less than one example's %zu\n",
                    scratch_floats, per);
            abort();
        }
        if ((size_t)nc > fit)
            nc = (int)fit;
    }
    return nc < 1 ? 1 : nc;
}

/* ------------------------------------------------------------ im2col */

static inline void zero_run(float *d, int n)
{
    if (n > 0)
        memset(d, 0, sizeof(float) * (size_t)n);
}

static inline void add_run(float *restrict d, const float *restrict s, int n)
{
    for (int i = 0; i < n; i++)
        d[i] += s[i];
}

/* cnt runs of `run` floats, the i-th from s + i * sstep to d + i * dstep.
 * The small runs (a few channels times a few kernel columns: 3 for a 3x3
 * kernel on one channel) get copies of a constant size, which compile to a
 * few moves instead of a call each. */
static void copy_runs(float *restrict d, long dstep, const float *restrict s, long sstep, int cnt,
                      int run)
{
#define COPY_RUNS(R)                                                                               \
    for (int i = 0; i < cnt; i++)                                                                  \
        memcpy(d + i * dstep, s + i * sstep, (R) * sizeof(float));                                 \
    return
    switch (run) {
    case 1: COPY_RUNS(1);
    case 2: COPY_RUNS(2);
    case 3: COPY_RUNS(3);
    case 4: COPY_RUNS(4);
    case 5: COPY_RUNS(5);
    case 6: COPY_RUNS(6);
    case 8: COPY_RUNS(8);
    case 9: COPY_RUNS(9);
    case 12: COPY_RUNS(12);
    case 15: COPY_RUNS(15);
    case 16: COPY_RUNS(16);
    default: COPY_RUNS(run);
    }
#undef COPY_RUNS
}

/* The output columns [lo, hi) whose window lies wholly inside the input's
 * width (0 <= lo <= hi <= ow); the others meet the padding. */
static void interior_cols(const conv_geom *g, int *lo, int *hi)
{
    int l = (g->pad_left + g->sw - 1) / g->sw;
    int room = g->w + g->pad_left - g->kw;
    int h = room >= 0 ? room / g->sw + 1 : 0;
    l = l < g->ow ? l : g->ow;
    h = h < g->ow ? h : g->ow;
    *lo = l;
    *hi = h > l ? h : l;
}

/* The kernel columns [lo, hi) of output column ox that fall inside the
 * input (lo = hi when none does); ix0: the input column of kx = 0. */
static inline void kx_range(const conv_geom *g, int ox, int *ix0, int *lo, int *hi)
{
    int x0 = ox * g->sw - g->pad_left;
    int l = x0 < 0 ? -x0 : 0;
    int h = g->w - x0 < g->kw ? g->w - x0 : g->kw;
    *ix0 = x0;
    *lo = l;
    *hi = h > l ? h : l;
}

/* One kernel row's run of output column ox whose window meets the padding:
 * what lies inside the input row xr, zeros elsewhere. */
static void im2col_border(float *d, const float *xr, const conv_geom *g, int ox)
{
    const int c = g->c;
    int ix0, lo, hi;
    kx_range(g, ox, &ix0, &lo, &hi);
    zero_run(d, lo * c);
    if (hi > lo)
        memcpy(d + lo * c, xr + ((long)ix0 + lo) * c, sizeof(float) * (size_t)((hi - lo) * c));
    zero_run(d + hi * c, g->kw * c - hi * c);
}

/* col (oh * ow, K) of one example x (h, w, c). A kernel row of an output
 * position is one contiguous run of kw * c floats in x (its columns and
 * their channels) and in col: for each output row and kernel row, the runs
 * of the output columns whose window is inside the width are copied in one
 * loop; the border columns copy what is inside and zero the rest. */
static void im2col(float *restrict col, const float *restrict x, const conv_geom *g)
{
    const int c = g->c, run = g->kw * c;
    const long K = conv_k(g);
    int in_lo, in_hi;
    interior_cols(g, &in_lo, &in_hi);
    for (int oy = 0; oy < g->oh; oy++) {
        float *row = col + (long)oy * g->ow * K;
        for (int ky = 0; ky < g->kh; ky++) {
            const int iy = oy * g->sh + ky - g->pad_top;
            float *d = row + (long)ky * run;
            if (iy < 0 || iy >= g->h) {
                for (int ox = 0; ox < g->ow; ox++)
                    zero_run(d + ox * K, run);
                continue;
            }
            const float *xr = x + (long)iy * g->w * c;
            for (int ox = 0; ox < in_lo; ox++)
                im2col_border(d + ox * K, xr, g, ox);
            if (in_hi > in_lo) /* the interior: whole runs, one loop */
                copy_runs(d + in_lo * K, K, xr + ((long)in_lo * g->sw - g->pad_left) * c,
                          (long)g->sw * c, in_hi - in_lo, run);
            for (int ox = in_hi; ox < g->ow; ox++)
                im2col_border(d + ox * K, xr, g, ox);
        }
    }
}

/* The adjoint of im2col: adds each entry of dcol (oh * ow, K) to the dx
 * (h, w, c) position it was copied from (dx is not zeroed here). */
static void col2im(float *restrict dx, const float *restrict dcol, const conv_geom *g)
{
    const int c = g->c, run = g->kw * c;
    const long K = conv_k(g);
    for (int oy = 0; oy < g->oh; oy++) {
        const float *row = dcol + (long)oy * g->ow * K;
        for (int ky = 0; ky < g->kh; ky++) {
            const int iy = oy * g->sh + ky - g->pad_top;
            if (iy < 0 || iy >= g->h)
                continue;
            float *xr = dx + (long)iy * g->w * c;
            const float *s = row + (long)ky * run;
            for (int ox = 0; ox < g->ow; ox++) {
                int ix0, lo, hi;
                kx_range(g, ox, &ix0, &lo, &hi);
                if (hi > lo)
                    add_run(xr + ((long)ix0 + lo) * c, s + ox * K + lo * c, (hi - lo) * c);
            }
        }
    }
}

/* ------------------------------------------------------------ bias, activation */

/* y (rows, oc) += b, then the activation, in place. */
static void bias_act(float *restrict y, const float *restrict b, long rows, int oc, act_type act)
{
    if (act == ACT_RELU) {
        if (b) {
            for (long r = 0; r < rows; r++) {
                float *restrict yr = y + r * oc;
                for (int j = 0; j < oc; j++) {
                    float v = yr[j] + b[j];
                    yr[j] = v > 0.0f ? v : 0.0f;
                }
            }
        } else {
            long total = rows * oc;
            for (long i = 0; i < total; i++)
                y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        }
        return;
    }
    if (b) {
        for (long r = 0; r < rows; r++) {
            float *restrict yr = y + r * oc;
            for (int j = 0; j < oc; j++)
                yr[j] += b[j];
        }
    }
    if (act != ACT_LINEAR)
        act_forward(y, (int)rows, oc, act);
}

/* dy (rows, oc) *= act'(y) in place; then db += its column sums when db. */
static void act_grad_bias(float *restrict dy, const float *restrict y, float *restrict db, long rows,
                          int oc, act_type act)
{
    /* layers.c's act_backward over (n, k) rows, in slices whose row count
     * fits its int */
    const long slice = (long)(INT_MAX / 2) / (oc > 0 ? oc : 1) + 1;
    for (long r0 = 0; r0 < rows; r0 += slice) {
        long nr = rows - r0 < slice ? rows - r0 : slice;
        act_backward(dy + r0 * oc, y + r0 * oc, (int)nr, oc, act);
    }
    if (!db)
        return;
    for (int j0 = 0; j0 < oc; j0 += CH_BLOCK) {
        const int nb = oc - j0 < CH_BLOCK ? oc - j0 : CH_BLOCK;
        double acc[CH_BLOCK] = {0};
        for (long r = 0; r < rows; r++) {
            const float *restrict d = dy + r * oc + j0;
            for (int j = 0; j < nb; j++)
                acc[j] += d[j];
        }
        for (int j = 0; j < nb; j++)
            db[j0 + j] += (float)acc[j];
    }
}

/* ------------------------------------------------------------ Winograd */

/* A 3x3 conv with stride 1 and enough channels runs as Winograd's
 * F(2x2, 3x3) (Lavin and Gray, 2016): each 2x2 block of outputs from a 4x4
 * tile of the input with 16 multiplications per channel pair instead of 36.
 * Per chunk of examples: the input tiles transformed (V = B^T d B, 16
 * matrices of tiles x c), 16 GEMMs against the transformed kernel (U = G g
 * G^T, 16 matrices c x oc), the products transformed back (A^T m A). The
 * backward uses the same scheme twice: dx is the 3x3 correlation of dy
 * with the kernel rotated by 180 degrees (padding 2 - pad), and dw sums,
 * over the tiles, F(3x3, 2x2) of the input tiles with dy's 2x2 blocks: 16
 * GEMMs V^T D (transformed x tiles against transformed dy blocks, summed
 * over the chunk's tiles by the GEMM), transformed back once at the end.
 * The arithmetic is the convolution's up to rounding (the transforms' only
 * constants are 0, +-1 and 1/2). Fewer channels than WINO_MIN_C leave the
 * GEMMs too thin to gain. */
#define WINO_MIN_C 8

/* Bytes of a chunk's transformed tiles the Winograd path aims at. */
#define WINO_CHUNK_BYTES (1024L * 1024)

/* GCC's ivdep: the channel loops' pointers do not alias. clang (the fuzz
 * build) gets nothing: its forced-vectorization pragma is an error under
 * -Werror wherever a sanitized build cannot vectorize the loop. */
#if defined(__clang__)
#define LOOP_NO_ALIAS
#elif defined(__GNUC__)
#define LOOP_NO_ALIAS _Pragma("GCC ivdep")
#else
#define LOOP_NO_ALIAS
#endif

/* One 3x3 stride-1 correlation as the transforms see it. */
typedef struct wino_geom {
    int h, w, c;   /* input */
    int pt, pl;    /* zero rows/columns before it */
    int oh, ow, oc; /* output */
    int th, tw;    /* 2x2 output tiles: ceil(oh / 2), ceil(ow / 2) */
} wino_geom;

static void wino_geom_set(wino_geom *p, int h, int w, int c, int pt, int pl, int oh, int ow, int oc)
{
    p->h = h;
    p->w = w;
    p->c = c;
    p->pt = pt;
    p->pl = pl;
    p->oh = oh;
    p->ow = ow;
    p->oc = oc;
    p->th = (oh + 1) / 2;
    p->tw = (ow + 1) / 2;
}

static int wino_ok(const conv_geom *g)
{
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->c >= WINO_MIN_C &&
           g->oc >= WINO_MIN_C && g->oh > 0 && g->ow > 0 && g->pad_top <= 2 && g->pad_left <= 2;
}

/* The forward's correlation and the backward's for dx. */
static void wino_fwd_geom(wino_geom *p, const conv_geom *g)
{
    wino_geom_set(p, g->h, g->w, g->c, g->pad_top, g->pad_left, g->oh, g->ow, g->oc);
}

static void wino_bwd_geom(wino_geom *p, const conv_geom *g)
{
    wino_geom_set(p, g->oh, g->ow, g->oc, 2 - g->pad_top, 2 - g->pad_left, g->h, g->w, g->c);
}

static size_t round16(size_t v)
{
    return (v + 15) & ~(size_t)15;
}

/* Scratch: a fixed part (two sets of 16 transformed kernels: the forward's
 * or the backward's for dx, and the backward's sums for dw; max(c, oc)
 * zeros that stand for the padding) and, per example of a chunk, the larger of the
 * forward's and the backward's transformed tiles and products. */
static size_t wino_fixed_floats(const conv_geom *g)
{
    size_t cq = (size_t)g->c * (size_t)g->oc;
    size_t z = (size_t)(g->c > g->oc ? g->c : g->oc);
    return 2 * round16(16 * cq) + round16(z);
}

static size_t wino_example_floats(const conv_geom *g)
{
    wino_geom f, b;
    wino_fwd_geom(&f, g);
    wino_bwd_geom(&b, g);
    size_t tf = (size_t)f.th * f.tw, tb = (size_t)b.th * b.tw;
    return 16 * (tf > tb ? tf : tb) * (size_t)(g->c + g->oc);
}

static int wino_preferred_chunk(const conv_geom *g)
{
    long per = (long)(wino_example_floats(g) * sizeof(float));
    long nc = per > 0 ? WINO_CHUNK_BYTES / per : 1;
    return nc < 1 ? 1 : nc > 4096 ? 4096 : (int)nc;
}

/* Examples per Winograd chunk with this scratch; 0: it does not fit (the
 * im2col path then runs). */
static int wino_chunk(const conv_geom *g, int n, size_t scratch_floats)
{
    size_t fixed = wino_fixed_floats(g), per = wino_example_floats(g);
    if (scratch_floats < fixed + per)
        return 0;
    size_t fit = (scratch_floats - fixed) / per;
    int nc = wino_preferred_chunk(g);
    if (nc > n)
        nc = n;
    if ((size_t)nc > fit)
        nc = (int)fit;
    return nc < 1 ? 1 : nc;
}

/* U[k] (k = 0..15, each cq = c * oc floats) = G g G^T for the 3x3 taps g
 * of each (channel, filter) pair of w (3, 3, c, oc), in w's (c, oc) order;
 * flip: the taps rotated by 180 degrees and U[k] in (oc, c) order, the
 * kernel of the backward's correlation for dx. */
static void wino_kernel(float *restrict U, const float *restrict w, int c, int oc, int flip)
{
    const long cq = (long)c * oc;
    for (long q = 0; q < cq; q++) {
        float g[9], r[12];
        for (int t = 0; t < 9; t++)
            g[t] = w[(long)(flip ? 8 - t : t) * cq + q];
        for (int j = 0; j < 3; j++) { /* G g: 4 x 3 */
            r[j] = g[j];
            r[3 + j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
            r[6 + j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
            r[9 + j] = g[6 + j];
        }
        const long at = flip ? (q % oc) * c + q / oc : q;
        for (int i = 0; i < 4; i++) { /* (G g) G^T: 4 x 4 */
            const float *ri = r + 3 * i;
            U[(4 * i + 0) * cq + at] = ri[0];
            U[(4 * i + 1) * cq + at] = 0.5f * (ri[0] + ri[1] + ri[2]);
            U[(4 * i + 2) * cq + at] = 0.5f * (ri[0] - ri[1] + ri[2]);
            U[(4 * i + 3) * cq + at] = ri[2];
        }
    }
}

/* V[k][t0 + t] (16 matrices of T rows of c floats) = B^T d B for the 4x4
 * input tile d of each output tile t of one example x (p->h, p->w, p->c);
 * positions outside x read `zero` (c zeros). */
static void wino_input(float *V, long T, long t0, const float *x, const wino_geom *p,
                       const float *zero)
{
    const int c = p->c;
    const long ks = T * c;
    for (int ty = 0; ty < p->th; ty++) {
        for (int tx = 0; tx < p->tw; tx++) {
            const float *s[16];
            const int iy0 = 2 * ty - p->pt, ix0 = 2 * tx - p->pl;
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    const int iy = iy0 + i, ix = ix0 + j;
                    s[4 * i + j] = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w
                                       ? x + ((long)iy * p->w + ix) * c
                                       : zero;
                }
            float *v = V + (t0 + (long)ty * p->tw + tx) * c;
            LOOP_NO_ALIAS
            for (int ch = 0; ch < c; ch++) {
                float r[16];
                for (int j = 0; j < 4; j++) { /* B^T d */
                    const float d0 = s[j][ch], d1 = s[4 + j][ch], d2 = s[8 + j][ch],
                                d3 = s[12 + j][ch];
                    r[j] = d0 - d2;
                    r[4 + j] = d1 + d2;
                    r[8 + j] = d2 - d1;
                    r[12 + j] = d1 - d3;
                }
                for (int i = 0; i < 4; i++) { /* (B^T d) B */
                    const float *ri = r + 4 * i;
                    v[(4 * i + 0) * ks + ch] = ri[0] - ri[2];
                    v[(4 * i + 1) * ks + ch] = ri[1] + ri[2];
                    v[(4 * i + 2) * ks + ch] = ri[2] - ri[1];
                    v[(4 * i + 3) * ks + ch] = ri[1] - ri[3];
                }
            }
        }
    }
}

/* The outputs of one example: y (p->oh, p->ow, p->oc) = A^T m A (+ b) for
 * each tile's 16 products M[k][t0 + t] (T rows of oc floats each). */
static void wino_output(float *y, const float *M, long T, long t0, const wino_geom *p,
                        const float *b)
{
    const int oc = p->oc;
    const long ks = T * oc;
    for (int ty = 0; ty < p->th; ty++) {
        for (int tx = 0; tx < p->tw; tx++) {
            const float *m = M + (t0 + (long)ty * p->tw + tx) * oc;
            const int oy = 2 * ty, ox = 2 * tx;
            const int full = oy + 1 < p->oh && ox + 1 < p->ow;
            float *y00 = y + ((long)oy * p->ow + ox) * oc;
            LOOP_NO_ALIAS
            for (int o = 0; o < oc; o++) {
                float a[8];
                for (int j = 0; j < 4; j++) { /* A^T m: 2 x 4 */
                    const float m0 = m[j * ks + o], m1 = m[(4 + j) * ks + o],
                                m2 = m[(8 + j) * ks + o], m3 = m[(12 + j) * ks + o];
                    a[j] = m0 + m1 + m2;
                    a[4 + j] = m1 - m2 - m3;
                }
                const float bo = b ? b[o] : 0.0f;
                const float v00 = a[0] + a[1] + a[2] + bo, v01 = a[1] - a[2] - a[3] + bo;
                const float v10 = a[4] + a[5] + a[6] + bo, v11 = a[5] - a[6] - a[7] + bo;
                if (full) {
                    y00[o] = v00;
                    y00[oc + o] = v01;
                    y00[(long)p->ow * oc + o] = v10;
                    y00[(long)p->ow * oc + oc + o] = v11;
                } else {
                    y00[o] = v00;
                    if (ox + 1 < p->ow)
                        y00[oc + o] = v01;
                    if (oy + 1 < p->oh) {
                        y00[(long)p->ow * oc + o] = v10;
                        if (ox + 1 < p->ow)
                            y00[(long)p->ow * oc + oc + o] = v11;
                    }
                }
            }
        }
    }
}

/* D[k][t0 + t] (T rows of oc floats) = G' e G'^T for the 2x2 block e of dy
 * (p->oh, p->ow, p->oc) at each output tile t of one example (zero past
 * the edge), G' the F(3x3, 2x2) filter transform with its last row negated
 * (its input transform is then the forward's B^T, V is shared):
 * G' = [1 0; 1/2 1/2; 1/2 -1/2; 0 -1]. */
static void wino_dy(float *D, long T, long t0, const float *dy, const wino_geom *p,
                    const float *zero)
{
    const int oc = p->oc;
    const long ks = T * oc;
    for (int ty = 0; ty < p->th; ty++) {
        for (int tx = 0; tx < p->tw; tx++) {
            const float *s[4];
            for (int a = 0; a < 2; a++)
                for (int bb = 0; bb < 2; bb++) {
                    const int oy = 2 * ty + a, ox = 2 * tx + bb;
                    s[2 * a + bb] =
                        oy < p->oh && ox < p->ow ? dy + ((long)oy * p->ow + ox) * oc : zero;
                }
            float *d = D + (t0 + (long)ty * p->tw + tx) * oc;
            LOOP_NO_ALIAS
            for (int o = 0; o < oc; o++) {
                float r[8];
                for (int j = 0; j < 2; j++) { /* G' e: 4 x 2 */
                    const float e0 = s[j][o], e1 = s[2 + j][o];
                    r[j] = e0;
                    r[2 + j] = 0.5f * (e0 + e1);
                    r[4 + j] = 0.5f * (e0 - e1);
                    r[6 + j] = -e1;
                }
                for (int i = 0; i < 4; i++) { /* (G' e) G'^T: 4 x 4 */
                    const float r0 = r[2 * i], r1 = r[2 * i + 1];
                    d[(4 * i + 0) * ks + o] = r0;
                    d[(4 * i + 1) * ks + o] = 0.5f * (r0 + r1);
                    d[(4 * i + 2) * ks + o] = 0.5f * (r0 - r1);
                    d[(4 * i + 3) * ks + o] = -r1;
                }
            }
        }
    }
}

/* dw (3, 3, c, oc) (+)= A'^T S A' for the 16 summed products S[k] (cq
 * floats each), A'^T = [1 1 1 0; 0 1 -1 0; 0 1 1 1] (F(3x3, 2x2)). */
static void wino_kernel_grad(float *restrict dw, const float *restrict S, long cq, int accumulate)
{
    for (long q = 0; q < cq; q++) {
        float a[12], o[9];
        for (int j = 0; j < 4; j++) {
            const float s0 = S[j * cq + q], s1 = S[(4 + j) * cq + q], s2 = S[(8 + j) * cq + q],
                        s3 = S[(12 + j) * cq + q];
            a[j] = s0 + s1 + s2;
            a[4 + j] = s1 - s2;
            a[8 + j] = s1 + s2 + s3;
        }
        for (int i = 0; i < 3; i++) {
            const float *ai = a + 4 * i;
            o[3 * i] = ai[0] + ai[1] + ai[2];
            o[3 * i + 1] = ai[1] - ai[2];
            o[3 * i + 2] = ai[1] + ai[2] + ai[3];
        }
        for (int t = 0; t < 9; t++)
            dw[t * cq + q] = accumulate ? dw[t * cq + q] + o[t] : o[t];
    }
}

static void wino_forward(float *y, const float *x, const float *w, const float *b, int n,
                         const conv_geom *g, act_type act, float *scratch, int nc_max)
{
    wino_geom f;
    wino_fwd_geom(&f, g);
    const int c = g->c, oc = g->oc;
    const long cq = (long)c * oc, tiles = (long)f.th * f.tw;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * oc;
    float *U = scratch, *zero = scratch + 2 * round16((size_t)(16 * cq));
    float *work = scratch + wino_fixed_floats(g);
    memset(zero, 0, sizeof(float) * (size_t)(c > oc ? c : oc));
    wino_kernel(U, w, c, oc, 0);
    for (int e0 = 0; e0 < n; e0 += nc_max) {
        const int nc = n - e0 < nc_max ? n - e0 : nc_max;
        const long T = nc * tiles;
        float *V = work, *M = work + 16 * T * c;
        for (int e = 0; e < nc; e++)
            wino_input(V, T, e * tiles, x + (e0 + e) * in_ex, &f, zero);
        for (int k = 0; k < 16; k++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, oc, c, 1.0f,
                        V + k * T * c, c, U + k * cq, oc, 0.0f, M + k * T * oc, oc);
        float *yc = y + e0 * out_ex;
        for (int e = 0; e < nc; e++)
            wino_output(yc + e * out_ex, M, T, e * tiles, &f, b);
        if (act != ACT_LINEAR)
            bias_act(yc, NULL, (long)nc * g->oh * g->ow, oc, act);
    }
}

/* Each chunk of dy gets the activation's derivative (and adds to db)
 * first, then serves dw and dx while in cache. */
static void wino_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                          const float *x, const float *w, int n, const conv_geom *g, act_type act,
                          int accumulate, float *scratch, int nc_max)
{
    wino_geom f, bg;
    wino_fwd_geom(&f, g);
    wino_bwd_geom(&bg, g);
    const int c = g->c, oc = g->oc;
    const long cq = (long)c * oc, tf = (long)f.th * f.tw, tb = (long)bg.th * bg.tw;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * oc;
    float *Ur = scratch, *S = scratch + round16((size_t)(16 * cq));
    float *zero = scratch + 2 * round16((size_t)(16 * cq));
    float *work = scratch + wino_fixed_floats(g);
    memset(zero, 0, sizeof(float) * (size_t)(c > oc ? c : oc));
    if (dx)
        wino_kernel(Ur, w, c, oc, 1);
    for (int e0 = 0; e0 < n; e0 += nc_max) {
        const int nc = n - e0 < nc_max ? n - e0 : nc_max;
        float *dyc = dy + e0 * out_ex;
        act_grad_bias(dyc, y + e0 * out_ex, db, (long)nc * g->oh * g->ow, oc, act);
        if (dw) {
            /* S[k] (c, oc) (+)= V[k]^T (c, T) . D[k] (T, oc) */
            const long T = nc * tf;
            float *V = work, *D = work + 16 * T * c;
            for (int e = 0; e < nc; e++) {
                wino_input(V, T, e * tf, x + (e0 + e) * in_ex, &f, zero);
                wino_dy(D, T, e * tf, dyc + e * out_ex, &f, zero);
            }
            for (int k = 0; k < 16; k++)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, oc, (int)T, 1.0f,
                            V + k * T * c, c, D + k * T * oc, oc, e0 > 0 ? 1.0f : 0.0f,
                            S + k * cq, oc);
        }
        if (dx) {
            /* dx: dy's tiles (oc channels) against the rotated kernel,
             * M[k] (T, c) = V[k] (T, oc) . Ur[k] (oc, c) */
            const long T = nc * tb;
            float *V = work, *M = work + 16 * T * oc;
            for (int e = 0; e < nc; e++)
                wino_input(V, T, e * tb, dyc + e * out_ex, &bg, zero);
            for (int k = 0; k < 16; k++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, c, oc, 1.0f,
                            V + k * T * oc, oc, Ur + k * cq, c, 0.0f, M + k * T * c, c);
            for (int e = 0; e < nc; e++)
                wino_output(dx + (e0 + e) * in_ex, M, T, e * tb, &bg, NULL);
        }
    }
    if (dw)
        wino_kernel_grad(dw, S, cq, accumulate);
}

/* ------------------------------------------------------------ conv2d */

size_t conv2d_scratch_floats(const conv_geom *g, int max_batch)
{
    if (max_batch < 1)
        max_batch = 1;
    if (wino_ok(g)) {
        int nc = wino_preferred_chunk(g);
        if (max_batch < nc)
            nc = max_batch;
        return wino_fixed_floats(g) + wino_example_floats(g) * (size_t)nc;
    }
    if (conv_direct(g))
        return 0;
    int nc = preferred_chunk(g);
    if (max_batch < nc)
        nc = max_batch;
    return col_floats_per_example(g) * (size_t)nc;
}


/* The im2col matrix of examples [e0, e0 + nc) of x: x itself when the conv
 * is direct, else written into scratch. */
static const float *lower_chunk(float *scratch, const float *x, int e0, int nc, const conv_geom *g,
                                int direct)
{
    const long in_ex = (long)g->h * g->w * g->c;
    if (direct)
        return x + e0 * in_ex;
    const size_t col_ex = col_floats_per_example(g);
    for (int e = 0; e < nc; e++)
        im2col(scratch + (size_t)e * col_ex, x + (e0 + e) * in_ex, g);
    return scratch;
}

void conv2d_forward(float *y, const float *x, const float *w, const float *b, int n,
                    const conv_geom *g, act_type act, float *scratch, size_t scratch_floats)
{
    const long out_pos = (long)g->oh * g->ow;
    const int K = (int)conv_k(g), oc = g->oc;
    if (n <= 0 || out_pos == 0 || oc <= 0)
        return;
    if (K == 0) { /* no input channels: the output is act(b) */
        memset(y, 0, sizeof(float) * (size_t)(n * out_pos * oc));
        bias_act(y, b, n * out_pos, oc, act);
        return;
    }
    if (wino_ok(g)) {
        const int nw = wino_chunk(g, n, scratch_floats);
        if (nw > 0) {
            wino_forward(y, x, w, b, n, g, act, scratch, nw);
            return;
        }
    }
    const int direct = conv_direct(g);
    const int nc_max = chunk_examples(g, n, scratch_floats);
    for (int e0 = 0; e0 < n; e0 += nc_max) {
        const int nc = n - e0 < nc_max ? n - e0 : nc_max;
        const long rows = nc * out_pos;
        const float *col = lower_chunk(scratch, x, e0, nc, g, direct);
        float *yc = y + e0 * out_pos * oc;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, oc, K, 1.0f, col, K,
                    w, oc, 0.0f, yc, oc);
        bias_act(yc, b, rows, oc, act);
    }
}

void conv2d_backward(float *dx, float *dw, float *db, float *dy, const float *y, const float *x,
                     const float *w, int n, const conv_geom *g, act_type act, int accumulate,
                     float *scratch, size_t scratch_floats)
{
    const long in_ex = (long)g->h * g->w * g->c, out_pos = (long)g->oh * g->ow;
    const int K = (int)conv_k(g), oc = g->oc;
    if (!accumulate) {
        if (db)
            memset(db, 0, sizeof(float) * (size_t)(oc > 0 ? oc : 0));
        if (dw)
            memset(dw, 0, sizeof(float) * (size_t)((long)K * (oc > 0 ? oc : 0)));
    }
    if (n <= 0)
        return;
    if (out_pos == 0 || oc <= 0 || K == 0) {
        /* no output (or no input channel) reaches x: dx is 0; dy's bias
         * gradient is all that remains */
        if (dx)
            memset(dx, 0, sizeof(float) * (size_t)(n * in_ex));
        if (out_pos > 0 && oc > 0)
            act_grad_bias(dy, y, db, n * out_pos, oc, act);
        return;
    }
    if (wino_ok(g)) {
        const int nw = wino_chunk(g, n, scratch_floats);
        if (nw > 0) {
            wino_backward(dx, dw, db, dy, y, x, w, n, g, act, accumulate, scratch, nw);
            return;
        }
    }
    const int direct = conv_direct(g);
    const int nc_max = chunk_examples(g, n, scratch_floats);
    const size_t col_ex = col_floats_per_example(g);
    for (int e0 = 0; e0 < n; e0 += nc_max) {
        const int nc = n - e0 < nc_max ? n - e0 : nc_max;
        const long rows = nc * out_pos;
        float *dyc = dy + e0 * out_pos * oc;
        act_grad_bias(dyc, y + e0 * out_pos * oc, db, rows, oc, act);
        if (dw) {
            const float *col = lower_chunk(scratch, x, e0, nc, g, direct);
            /* dw (K, oc) (+)= col^T (K, rows) . dy (rows, oc) */
            const float beta = accumulate || e0 > 0 ? 1.0f : 0.0f;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, oc, (int)rows, 1.0f, col, K,
                        dyc, oc, beta, dw, oc);
        }
        if (!dx)
            continue;
        /* dcol (rows, K) = dy (rows, oc) . w^T (oc, K): straight into dx
         * when x is its own im2col matrix, else into the scratch (the im2col
         * matrix is no longer needed) and scattered */
        float *dxc = dx + e0 * in_ex;
        if (direct) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, oc, 1.0f, dyc, oc,
                        w, oc, 0.0f, dxc, K);
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, oc, 1.0f, dyc, oc, w,
                    oc, 0.0f, scratch, K);
        memset(dxc, 0, sizeof(float) * (size_t)(nc * in_ex));
        for (int e = 0; e < nc; e++)
            col2im(dxc + e * in_ex, scratch + (size_t)e * col_ex, g);
    }
}

/* ------------------------------------------------------------ pooling */

/* The window of output (oy, ox) clipped to the input: rows [y0, y1),
 * columns [x0, x1). */
static inline void window(const conv_geom *g, int oy, int ox, int *y0, int *y1, int *x0, int *x1)
{
    int a = oy * g->sh - g->pad_top, b = ox * g->sw - g->pad_left;
    *y0 = a < 0 ? 0 : a;
    *y1 = a + g->kh < g->h ? a + g->kh : g->h;
    *x0 = b < 0 ? 0 : b;
    *x1 = b + g->kw < g->w ? b + g->kw : g->w;
}

void maxpool_forward(float *y, int32_t *argmax, const float *x, int n, const conv_geom *g)
{
    const int c = g->c;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * c;
    for (int e = 0; e < n; e++) {
        const float *xe = x + e * in_ex;
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                float *restrict yr = y + e * out_ex + ((long)oy * g->ow + ox) * c;
                int32_t *restrict ar = argmax + e * out_ex + ((long)oy * g->ow + ox) * c;
                int y0, y1, x0, x1;
                window(g, oy, ox, &y0, &y1, &x0, &x1);
                if (y0 >= y1 || x0 >= x1) { /* only padding (cannot happen with
                                             * TF's geometry) */
                    for (int ch = 0; ch < c; ch++) {
                        yr[ch] = 0.0f;
                        ar[ch] = -1;
                    }
                    continue;
                }
                /* the window's first position, then a strictly greater
                 * value replaces it: the first maximum wins */
                int32_t base = (int32_t)(((long)y0 * g->w + x0) * c);
                memcpy(yr, xe + base, sizeof(float) * (size_t)c);
                for (int ch = 0; ch < c; ch++)
                    ar[ch] = base + ch;
                for (int iy = y0; iy < y1; iy++) {
                    for (int ix = iy == y0 ? x0 + 1 : x0; ix < x1; ix++) {
                        const int32_t at = (int32_t)(((long)iy * g->w + ix) * c);
                        const float *restrict xp = xe + at;
                        for (int ch = 0; ch < c; ch++) {
                            if (xp[ch] > yr[ch]) {
                                yr[ch] = xp[ch];
                                ar[ch] = at + ch;
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Windows that never overlap (strides at least the pool size, the usual
 * case): each dx entry belongs to one window at most, so it is written once,
 * the window's gradient where it was the argmax and 0 elsewhere, with no
 * zeroing pass before. */
static void maxpool_backward_disjoint(float *dx, const float *dy, const int32_t *argmax, int n,
                                      const conv_geom *g)
{
    const int c = g->c;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * c;
    for (int e = 0; e < n; e++) {
        float *dxe = dx + e * in_ex;
        for (int iy = 0; iy < g->h; iy++) {
            const int py = iy + g->pad_top, oy = py / g->sh;
            float *dxr = dxe + (long)iy * g->w * c;
            if (oy >= g->oh || py - oy * g->sh >= g->kh) { /* in no window */
                memset(dxr, 0, sizeof(float) * (size_t)g->w * (size_t)c);
                continue;
            }
            for (int ix = 0; ix < g->w; ix++) {
                const int px = ix + g->pad_left, ox = px / g->sw;
                float *restrict d = dxr + (long)ix * c;
                if (ox >= g->ow || px - ox * g->sw >= g->kw) {
                    memset(d, 0, sizeof(float) * (size_t)c);
                    continue;
                }
                const long o = e * out_ex + ((long)oy * g->ow + ox) * c;
                const float *restrict gy = dy + o;
                const int32_t *restrict a = argmax + o;
                const int32_t at = (int32_t)(((long)iy * g->w + ix) * c);
                for (int ch = 0; ch < c; ch++)
                    d[ch] = a[ch] == at + ch ? gy[ch] : 0.0f;
            }
        }
    }
}

void maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int n, const conv_geom *g)
{
    if (g->sh >= g->kh && g->sw >= g->kw) {
        maxpool_backward_disjoint(dx, dy, argmax, n, g);
        return;
    }
    const long in_ex = (long)g->h * g->w * g->c, out_ex = (long)g->oh * g->ow * g->c;
    memset(dx, 0, sizeof(float) * (size_t)(n * in_ex));
    for (int e = 0; e < n; e++) {
        float *restrict dxe = dx + e * in_ex;
        const float *restrict d = dy + e * out_ex;
        const int32_t *restrict a = argmax + e * out_ex;
        for (long i = 0; i < out_ex; i++) {
            if (a[i] >= 0 && a[i] < in_ex) /* always, from maxpool_forward */
                dxe[a[i]] += d[i];
        }
    }
}

void avgpool_forward(float *y, const float *x, int n, const conv_geom *g)
{
    const int c = g->c;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * c;
    for (int e = 0; e < n; e++) {
        const float *xe = x + e * in_ex;
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                float *restrict yr = y + e * out_ex + ((long)oy * g->ow + ox) * c;
                int y0, y1, x0, x1;
                window(g, oy, ox, &y0, &y1, &x0, &x1);
                memset(yr, 0, sizeof(float) * (size_t)c);
                for (int iy = y0; iy < y1; iy++) {
                    for (int ix = x0; ix < x1; ix++) {
                        const float *restrict xp = xe + ((long)iy * g->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            yr[ch] += xp[ch];
                    }
                }
                const int count = (y1 - y0) * (x1 - x0);
                const float inv = count > 0 ? 1.0f / (float)count : 0.0f;
                for (int ch = 0; ch < c; ch++)
                    yr[ch] *= inv;
            }
        }
    }
}

void avgpool_backward(float *dx, const float *dy, int n, const conv_geom *g)
{
    const int c = g->c;
    const long in_ex = (long)g->h * g->w * c, out_ex = (long)g->oh * g->ow * c;
    memset(dx, 0, sizeof(float) * (size_t)(n * in_ex));
    for (int e = 0; e < n; e++) {
        float *dxe = dx + e * in_ex;
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                const float *restrict d = dy + e * out_ex + ((long)oy * g->ow + ox) * c;
                int y0, y1, x0, x1;
                window(g, oy, ox, &y0, &y1, &x0, &x1);
                const int count = (y1 - y0) * (x1 - x0);
                if (count <= 0)
                    continue;
                const float inv = 1.0f / (float)count;
                for (int iy = y0; iy < y1; iy++) {
                    for (int ix = x0; ix < x1; ix++) {
                        float *restrict dp = dxe + ((long)iy * g->w + ix) * c;
                        for (int ch = 0; ch < c; ch++)
                            dp[ch] += d[ch] * inv;
                    }
                }
            }
        }
    }
}

void gap_forward(float *y, const float *x, int n, int hw, int c)
{
    const float inv = hw > 0 ? 1.0f / (float)hw : 0.0f;
    for (int e = 0; e < n; e++) {
        float *restrict yr = y + (long)e * c;
        const float *restrict xe = x + (long)e * hw * c;
        memset(yr, 0, sizeof(float) * (size_t)c);
        for (int p = 0; p < hw; p++) {
            const float *restrict xp = xe + (long)p * c;
            for (int ch = 0; ch < c; ch++)
                yr[ch] += xp[ch];
        }
        for (int ch = 0; ch < c; ch++)
            yr[ch] *= inv;
    }
}

void gap_backward(float *dx, const float *dy, int n, int hw, int c)
{
    const float inv = hw > 0 ? 1.0f / (float)hw : 0.0f;
    for (int e = 0; e < n; e++) {
        const float *restrict d = dy + (long)e * c;
        float *restrict dxe = dx + (long)e * hw * c;
        for (int p = 0; p < hw; p++) {
            float *restrict dp = dxe + (long)p * c;
            for (int ch = 0; ch < c; ch++)
                dp[ch] = d[ch] * inv;
        }
    }
}

/* ------------------------------------------------------------ batch norm */

/* Channels [j0, j0 + nb) of y = (x - m) * a + b over the rows, a = gamma *
 * invstd and b = beta (m, a, b indexed from j0): subtracting first keeps the
 * precision when the mean is large against the spread. y may be x. */
static void bn_apply(float *y, const float *x, long rows, int c, int j0, int nb, const float *m,
                     const float *a, const float *b)
{
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * c + j0;
        float *yr = y + r * c + j0;
        for (int j = 0; j < nb; j++)
            yr[j] = (xr[j] - m[j]) * a[j] + b[j];
    }
}

/* The block's scale and shift for bn_apply. */
static void bn_block_coef(float *a, float *b, int j0, int nb, const float *invstd,
                          const float *gamma, const float *beta)
{
    for (int j = 0; j < nb; j++) {
        a[j] = invstd[j] * (gamma ? gamma[j0 + j] : 1.0f);
        b[j] = beta ? beta[j0 + j] : 0.0f;
    }
}

void bn_forward_train(float *y, float *mean, float *invstd, const float *x, long rows, int c,
                      const float *gamma, const float *beta, float eps, float momentum,
                      float *moving_mean, float *moving_var)
{
    if (rows <= 0) { /* no batch: nothing to normalise, the moving statistics stay */
        for (int j = 0; j < c; j++) {
            mean[j] = 0.0f;
            invstd[j] = (float)(1.0 / sqrt((double)eps));
        }
        return;
    }
    /* one pass, in double, shifted by each channel's first value (the
     * shifted-data variance: no cancellation when the mean is large) */
    for (int j0 = 0; j0 < c; j0 += CH_BLOCK) {
        const int nb = c - j0 < CH_BLOCK ? c - j0 : CH_BLOCK;
        double s1[CH_BLOCK] = {0}, s2[CH_BLOCK] = {0}, k[CH_BLOCK];
        for (int j = 0; j < nb; j++)
            k[j] = x[j0 + j];
        for (long r = 0; r < rows; r++) {
            const float *restrict xr = x + r * c + j0;
            for (int j = 0; j < nb; j++) {
                double v = (double)xr[j] - k[j];
                s1[j] += v;
                s2[j] += v * v;
            }
        }
        const double inv_rows = 1.0 / (double)rows;
        const double unbias = rows > 1 ? (double)rows / (double)(rows - 1) : 1.0;
        for (int j = 0; j < nb; j++) {
            double d = s1[j] * inv_rows;
            double var = s2[j] * inv_rows - d * d;
            if (var < 0.0)
                var = 0.0;
            double mu = k[j] + d;
            mean[j0 + j] = (float)mu;
            invstd[j0 + j] = (float)(1.0 / sqrt(var + (double)eps));
            if (moving_mean)
                moving_mean[j0 + j] = (float)((double)momentum * moving_mean[j0 + j] +
                                              (1.0 - (double)momentum) * mu);
            if (moving_var)
                moving_var[j0 + j] = (float)((double)momentum * moving_var[j0 + j] +
                                             (1.0 - (double)momentum) * var * unbias);
        }
        float ab[CH_BLOCK], bb[CH_BLOCK];
        bn_block_coef(ab, bb, j0, nb, invstd + j0, gamma, beta);
        bn_apply(y, x, rows, c, j0, nb, mean + j0, ab, bb);
    }
}

void bn_forward_eval(float *y, const float *x, long rows, int c, const float *gamma,
                     const float *beta, float eps, const float *moving_mean,
                     const float *moving_var)
{
    for (int j0 = 0; j0 < c; j0 += CH_BLOCK) {
        const int nb = c - j0 < CH_BLOCK ? c - j0 : CH_BLOCK;
        float inv[CH_BLOCK], ab[CH_BLOCK], bb[CH_BLOCK];
        for (int j = 0; j < nb; j++)
            inv[j] = (float)(1.0 / sqrt((double)moving_var[j0 + j] + (double)eps));
        bn_block_coef(ab, bb, j0, nb, inv, gamma, beta);
        bn_apply(y, x, rows, c, j0, nb, moving_mean + j0, ab, bb);
    }
}

void bn_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                 const float *mean, const float *invstd, const float *gamma, long rows, int c,
                 int accumulate)
{
    for (int j0 = 0; j0 < c; j0 += CH_BLOCK) {
        const int nb = c - j0 < CH_BLOCK ? c - j0 : CH_BLOCK;
        /* sum dy and sum dy * xhat, in double */
        double sd[CH_BLOCK] = {0}, sdx[CH_BLOCK] = {0};
        float mb[CH_BLOCK], ib[CH_BLOCK];
        for (int j = 0; j < nb; j++) {
            mb[j] = mean[j0 + j];
            ib[j] = invstd[j0 + j];
        }
        for (long r = 0; r < rows; r++) {
            const float *restrict xr = x + r * c + j0;
            const float *restrict dr = dy + r * c + j0;
            for (int j = 0; j < nb; j++) {
                float xh = (xr[j] - mb[j]) * ib[j];
                sd[j] += dr[j];
                sdx[j] += (double)dr[j] * xh;
            }
        }
        for (int j = 0; j < nb; j++) {
            if (dbeta)
                dbeta[j0 + j] = (float)(accumulate ? dbeta[j0 + j] + sd[j] : sd[j]);
            if (dgamma)
                dgamma[j0 + j] = (float)(accumulate ? dgamma[j0 + j] + sdx[j] : sdx[j]);
        }
        if (!dx || rows <= 0)
            continue;
        /* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
        float ab[CH_BLOCK], md[CH_BLOCK], mdx[CH_BLOCK];
        for (int j = 0; j < nb; j++) {
            ab[j] = ib[j] * (gamma ? gamma[j0 + j] : 1.0f);
            md[j] = (float)(sd[j] / (double)rows);
            mdx[j] = (float)(sdx[j] / (double)rows);
        }
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * c + j0;
            const float *dr = dy + r * c + j0; /* dx may be dy */
            float *o = dx + r * c + j0;
            for (int j = 0; j < nb; j++) {
                float xh = (xr[j] - mb[j]) * ib[j];
                o[j] = ab[j] * (dr[j] - md[j] - xh * mdx[j]);
            }
        }
    }
}
