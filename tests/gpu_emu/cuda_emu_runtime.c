/* cuda_emu_runtime.c: the CUDA runtime calls of the GPU backend's C files
 * (gpu_device.c), for the emulated tests: on host memory, synchronously.
 * cudaMalloc is malloc (so the sanitizer build sees a kernel's
 * out-of-bounds access), a copy or memset happens when called, a stream is
 * a token. cudaGetLastError reports the emulator's failed launches. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

cudaError_t emu_take_launch_error(void); /* cuda_emu.cpp */

cudaError_t cudaGetLastError(void) {
    return emu_take_launch_error();
}

/* The errors this runtime and the emulator return. */
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorLaunchFailure: return "the emulated launch failed (the reason is on stderr)";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error";
    }
}
cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
    (void)flags;
    static char token;
    *stream = (cudaStream_t)&token;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    (void)stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    (void)stream;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream) {
    (void)stream;
    return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
    (void)stream;
    return cudaFree(p);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)kind, (void)stream;
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
    (void)stream;
    memset(p, value, bytes);
    return cudaSuccess;
}

