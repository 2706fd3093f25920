/* gpu_device.c: CUDA devices, the per-rank context (stream, cuBLAS handle,
 * scratch) and device memory. Plain C over the CUDA runtime API; the runtime
 * is linked statically and loads the driver on the first call, so a machine
 * without a driver gets an error from gpu_device_count, not a failed start. */
#include "runner/model/cuda/gpu_internal.h"

#include <stdlib.h>

int gpu_cuda_fail(pp_err *err, cudaError_t e, const char *what) {
    return pp_fail(err, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int gpu_device_count(int *count, pp_err *err) {
    int n = 0;
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it so the next check starts clean */
        return pp_fail(err, "no CUDA device found: cudaGetDeviceCount returned %s (%s)", cudaGetErrorName(e),
                       cudaGetErrorString(e));
    }
    if (n < 1) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return pp_fail(err, "no CUDA device found: cudaGetDeviceCount returned 0 devices%s%s%s",
                       vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
    }
    *count = n;
    return 0;
}

int gpu_device_for_rank(int local_rank, int count) {
    if (count < 1) return -1;
    if (local_rank < 0) local_rank = 0;
    return local_rank % count;
}

int gpu_ctx_create(int device, gpu_dtype dtype, gpu_ctx **out, pp_err *err) {
    *out = NULL;
    gpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return pp_fail(err, "gpu: out of memory");
    c->device = device, c->dtype = dtype;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        free(c);
        return gpu_cuda_fail(err, e, "gpu: cudaSetDevice");
    }
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        return gpu_cuda_fail(err, e, "gpu: cudaStreamCreate");
    }
    if (!(c->api = gpu_blas(err))) {
        gpu_ctx_free(c);
        return -1;
    }
    cublasStatus_t bs = c->api->create(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        const char *why = c->api->status_string(bs); /* c->api is gone after the free */
        c->blas = NULL;
        gpu_ctx_free(c);
        return pp_fail(err, "gpu: cublasCreate: %s", why);
    }
    /* fp32 stays fp32: no TF32 tensor-op rounding behind the caller's back */
    if ((bs = c->api->set_stream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = c->api->set_math_mode(c->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        const char *why = c->api->status_string(bs);
        gpu_ctx_free(c);
        return pp_fail(err, "gpu: cuBLAS setup: %s", why);
    }
    *out = c;
    return 0;
}

/* A process that created an interprocess event (cuda-ipc) leaves the
 * driver's /dev/shm/cuda.shm.0.<pid>.1 (80 KB) behind at exit unless it
 * resets its device first: seen on an H100, driver 580.159, one file per
 * rank per job, never removed. */
void gpu_device_release(int device) {
    if (cudaSetDevice(device) == cudaSuccess) cudaDeviceReset();
}

void gpu_ctx_free(gpu_ctx *c) {
    if (!c) return;
    for (int i = 0; i < GPU_NSCRATCH; i++)
        if (c->scratch[i]) cudaFreeAsync(c->scratch[i], c->stream); /* stream-ordered, as allocated */
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) c->api->destroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

gpu_dtype gpu_ctx_dtype(const gpu_ctx *c) { return c->dtype; }

int gpu_sync(gpu_ctx *c, pp_err *err) {
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu: a kernel failed");
}

void *gpu_alloc(gpu_ctx *c, size_t bytes, pp_err *err) {
    (void)c;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        pp_fail(err, "gpu: cudaMalloc of %zu bytes: %s (%s)", bytes, cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void gpu_free(gpu_ctx *c, void *p) {
    (void)c;
    if (p) cudaFree(p);
}

/* Stream-ordered (cudaFreeAsync / cudaMallocAsync on the context's stream,
 * the only one that uses scratch): the old buffer goes after the work still
 * reading it, without a device-wide synchronisation.  cudaFree would wait
 * for every stream of the device, NCCL's too (devcomm's transfers, which
 * wait for a peer), and it grows mid-step the first time a larger bf16
 * GEMM comes. */
void *gpu_scratch(gpu_ctx *c, int slot, size_t bytes, pp_err *err) {
    if (c->scratch_bytes[slot] >= bytes) return c->scratch[slot];
    cudaError_t e = c->scratch[slot] ? cudaFreeAsync(c->scratch[slot], c->stream) : cudaSuccess;
    c->scratch[slot] = NULL, c->scratch_bytes[slot] = 0;
    if (e == cudaSuccess) e = cudaMallocAsync(&c->scratch[slot], bytes ? bytes : 1, c->stream);
    if (e != cudaSuccess) {
        c->scratch[slot] = NULL;
        pp_fail(err, "gpu: scratch of %zu bytes: %s (%s)", bytes, cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    c->scratch_bytes[slot] = bytes;
    return c->scratch[slot];
}

int gpu_upload(gpu_ctx *c, void *dst, const void *src, size_t bytes, pp_err *err) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu: upload");
}

int gpu_download(gpu_ctx *c, void *dst, const void *src, size_t bytes, pp_err *err) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu: download");
}

int gpu_memset(gpu_ctx *c, void *p, int byte, size_t bytes, pp_err *err) {
    cudaError_t e = cudaMemsetAsync(p, byte, bytes, c->stream);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu: memset");
}
