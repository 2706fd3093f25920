/* cublas_standin.c: a libcublas.so.<major> for the CUDA emulator's programs
 * (cuda_emu.h): the calls gpu_blas.c loads, with cuBLAS's meaning
 * (column-major, host alpha/beta, op(A) is m x k) computed by OpenBLAS in
 * its column-major mode on host memory, and cuBLAS's argument checks, so
 * that a wrong leading dimension fails as it would on the GPU
 * (CUBLAS_STATUS_INVALID_VALUE) instead of reading the wrong elements.
 * bf16 operands (cublasGemmEx, CUDA_R_16BF) are widened to float exactly,
 * which is what the tensor cores multiply; only the order of the fp32 sums
 * differs from the GPU. A call is queued work on the handle's stream, so it
 * first waits for that stream (the program's CUDA runtime stand-in, found
 * at load time: the programs export it). Built into <build>/emu/, where the
 * emulated gpu_blas.c looks first (tests/gpu_emu/CMakeLists.txt). */
#include <cblas.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA emulator's profiler hook (cuda_emu.h), where the program has
 * one: the GEMMs then show up as kernels in the CUPTI stand-in's records. */
extern void emu_observe(const char *what, cudaStream_t stream, int begin) __attribute__((weak));

struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math;
};

static void observe(cublasHandle_t h, const char *what, int begin) {
    if (emu_observe) emu_observe(what, h->stream, begin);
}

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

/* cuBLAS's checks for op(A) m x k, op(B) k x n, C m x n; then the wait for
 * the work queued before this call on the handle's stream. */
static cublasStatus_t check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            int lda, int ldb, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->stream && cudaStreamSynchronize(h->stream) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE; /* the stand-in does real matrices only */
    int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

static enum CBLAS_TRANSPOSE trans(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch) {
    cublasStatus_t s = check(h, ta, tb, m, n, k, lda, ldb, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    observe(h, "cublasSgemm (stand-in)", 1);
    for (int b = 0; b < batch; b++)
        cblas_sgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, *alpha, A + b * sa, lda, B + b * sb, ldb, *beta,
                    C + b * sc, ldc);
    observe(h, "cublasSgemm (stand-in)", 0);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

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
    float *a = widen_bf16(A, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda);
    float *b = widen_bf16(B, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb);
    if (a && b) {
        observe(h, "cublasGemmEx_bf16 (stand-in)", 1);
        cblas_sgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, *(const float *)alpha, a, lda, b, ldb,
                    *(const float *)beta, C, ldc);
        observe(h, "cublasGemmEx_bf16 (stand-in)", 0);
    }
    free(a);
    free(b);
    return a && b ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
