/* ref_cblas.c - a plain C cblas_sgemm (the reference BLAS loop order, float
 * accumulation) for the GPU bundle (make gpu-build): the CPU engine that
 * tests/check_gpu compares against calls only cblas_sgemm, and a static
 * OpenBLAS (every CPU kernel: 30 MB a binary) would not fit the folder that
 * is carried to the GPU machine, which has no OpenBLAS of its own. Slow but
 * exact enough for the test's small models; never used by the server build.
 *
 * defines: cblas_sgemm */
#include <cblas.h>

/* C = alpha op(A) op(B) + beta C, any order and transposes. */
void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint m,
                 OPENBLAS_CONST blasint n, OPENBLAS_CONST blasint k, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float *a, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *b,
                 OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float *c,
                 OPENBLAS_CONST blasint ldc)
{
    int row_major = order == CblasRowMajor;
    int at = ta != CblasNoTrans, bt = tb != CblasNoTrans;
    for (blasint i = 0; i < m; i++) {
        for (blasint j = 0; j < n; j++) {
            float s = 0.0f;
            for (blasint p = 0; p < k; p++) {
                float av, bv;
                if (row_major) {
                    av = at ? a[(long)p * lda + i] : a[(long)i * lda + p];
                    bv = bt ? b[(long)j * ldb + p] : b[(long)p * ldb + j];
                } else {
                    av = at ? a[(long)i * lda + p] : a[(long)p * lda + i];
                    bv = bt ? b[(long)p * ldb + j] : b[(long)j * ldb + p];
                }
                s += av * bv;
            }
            float *cij = row_major ? &c[(long)i * ldc + j] : &c[(long)j * ldc + i];
            *cij = beta == 0.0f ? alpha * s : alpha * s + beta * *cij;
        }
    }
}
