/* cublas_standin.c: a libcublas.so.<major> for the CUDA emulator's programs
 * (cuda_emu.h): the calls gpu_blas.c loads, with cuBLAS's meaning
 * (column-major, host alpha/beta, op(A) is m x k) computed by OpenBLAS in
 * its column-major mode on host memory, and cuBLAS's argument checks, so
 * that a wrong leading dimension fails as it would on the GPU
 * (CUBLAS_STATUS_INVALID_VALUE) instead of reading the wrong elements.
 * bf16 operands (cublasGemmEx, CUDA_R_16BF) are widened to float exactly,
 * which is what the tensor cores multiply; only the order of the fp32 sums
 * differs from the GPU. A call is work on the handle's stream, so it first
 * waits for that stream (the program's CUDA runtime stand-in, found at
 * load time: the programs export it), or, when launches are queued
 * (PPRUN_STUB_ASYNC_US), is queued there with its arguments' values and
 * runs on the stream's thread. Built into <build>/emu/, where the
 * emulated gpu_blas.c looks first (tests/gpu_emu/CMakeLists.txt). */
#include <cblas.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA emulator's hooks (cuda_emu.h), where the program has them: the
 * profiler's, so that the GEMMs show up as kernels in the CUPTI stand-in's
 * records (phases 0, 1, 2: launched, begun, ended), and the queue of
 * launches that run late (PPRUN_STUB_ASYNC_US), which the GEMMs join. */
extern void emu_observe(const char *what, cudaStream_t stream, int phase, unsigned *corr) __attribute__((weak));
extern long emu_async_us(void) __attribute__((weak));
extern int emu_queue_late(cudaStream_t stream, void (*fn)(void *), void *arg) __attribute__((weak));
extern void cudart_standin_launch_failed(cudaStream_t stream) __attribute__((weak));

struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = calloc(1, sizeof **handle);
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN (stand-in)";
    }
}

static int queued(cublasHandle_t h) { return h->stream && emu_async_us && emu_async_us() >= 0; }

/* cuBLAS's checks for op(A) m x k, op(B) k x n, C m x n; then, unless the
 * GEMM is to be queued, the wait for the work queued before this call on
 * the handle's stream. */
static cublasStatus_t check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            int lda, int ldb, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->stream && !queued(h) && cudaStreamSynchronize(h->stream) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE; /* the stand-in does real matrices only */
    int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

static enum CBLAS_TRANSPOSE trans(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

/* The cols x ld column-major bf16 matrix as floats (NULL: out of memory). */
static float *widen_bf16(const void *src, int rows, int cols, int ld) {
    size_t n = cols == 0 ? 0 : (size_t)(cols - 1) * ld + (size_t)rows;
    float *dst = malloc(sizeof(float) * (n ? n : 1));
    if (!dst) return NULL;
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
    return dst;
}

/* One GEMM call, its arguments as values: run at once, or queued. */
typedef struct gemm {
    cudaStream_t stream;
    int bf16; /* A and B bf16 (cublasGemmEx), else fp32 */
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc; /* strides between the batch's matrices */
    float alpha, beta;
    const void *A, *B;
    float *C;
    unsigned corr; /* the profiler's id for the call (0: none) */
} gemm;

static const char *gemm_name(const gemm *g) {
    return g->bf16 ? "cublasGemmEx_bf16 (stand-in)" : "cublasSgemm (stand-in)";
}

/* Runs g (on the caller's thread or its stream's); 0, or -1 when out of memory. */
static int gemm_run(gemm *g) {
    if (emu_observe) emu_observe(gemm_name(g), g->stream, 1, &g->corr);
    int rc = 0;
    for (int b = 0; b < g->batch && rc == 0; b++) {
        const float *a = (const float *)g->A + b * g->sa, *bm = (const float *)g->B + b * g->sb;
        float *wa = NULL, *wb = NULL;
        if (g->bf16) { /* the batch is 1 (cublasGemmEx) */
            a = wa = widen_bf16(g->A, g->ta == CUBLAS_OP_N ? g->m : g->k, g->ta == CUBLAS_OP_N ? g->k : g->m, g->lda);
            bm = wb = widen_bf16(g->B, g->tb == CUBLAS_OP_N ? g->k : g->n, g->tb == CUBLAS_OP_N ? g->n : g->k, g->ldb);
        }
        if (a && bm)
            cblas_sgemm(CblasColMajor, trans(g->ta), trans(g->tb), g->m, g->n, g->k, g->alpha, a, g->lda, bm, g->ldb,
                        g->beta, g->C + b * g->sc, g->ldc);
        else
            rc = -1;
        free(wa), free(wb);
    }
    if (emu_observe) emu_observe(gemm_name(g), g->stream, 2, &g->corr);
    return rc;
}

static void gemm_main(void *arg) {
    gemm *g = arg;
    if (gemm_run(g) != 0 && cudart_standin_launch_failed) cudart_standin_launch_failed(g->stream);
    free(g);
}

/* Runs g now, or (PPRUN_STUB_ASYNC_US) queues a copy on its stream. */
static cublasStatus_t gemm_start(cublasHandle_t h, gemm g) {
    g.stream = h->stream;
    if (emu_observe) emu_observe(gemm_name(&g), g.stream, 0, &g.corr);
    if (!queued(h)) return gemm_run(&g) == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
    gemm *copy = malloc(sizeof *copy);
    if (!copy) return CUBLAS_STATUS_ALLOC_FAILED;
    *copy = g;
    if (emu_queue_late(g.stream, gemm_main, copy) == 0) return CUBLAS_STATUS_SUCCESS;
    free(copy);
    return CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch) {
    cublasStatus_t s = check(h, ta, tb, m, n, k, lda, ldb, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    return gemm_start(h, (gemm){.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                                .batch = batch, .sa = sa, .sb = sb, .sc = sc, .alpha = *alpha, .beta = *beta,
                                .A = A, .B = B, .C = C});
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

/* The one mix pprun uses: bf16 A and B, fp32 C, fp32 compute. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    cublasStatus_t s = check(h, ta, tb, m, n, k, lda, ldb, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    return gemm_start(h, (gemm){.bf16 = 1, .ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb,
                                .ldc = ldc, .batch = 1, .alpha = *(const float *)alpha,
                                .beta = *(const float *)beta, .A = A, .B = B, .C = C});
}
