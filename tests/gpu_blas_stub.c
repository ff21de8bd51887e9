/* gpu_blas_stub.c - for `make gpu-build` only (build/gpu/bin/check_gpu_train):
 * there the CPU engine's GEMMs go to bench/gpu/ref_cblas.c instead of
 * OpenBLAS (docs/gpu.md, "The cJSON problem"), and train_loop.c's one other
 * OpenBLAS call, the thread count, has nothing to set. Not a test of its own
 * (tests/check_*.c are). */
void openblas_set_num_threads(int n);
void openblas_set_num_threads(int n) { (void)n; }
