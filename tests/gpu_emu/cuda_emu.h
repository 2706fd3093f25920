/* cuda_emu.h: runs CUDA kernels on the CPU, thread by thread, so that the
 * kernels of runner/model/cuda/gpu_kernels.cu can be held against their CPU
 * references on a machine without a GPU. Not a GPU model: it proves the
 * kernels' index arithmetic, bounds, barriers and shuffles, nothing about
 * the GPU's floating point (expf here is glibc's) or its speed.
 *
 * How: cuda_emu_translate.pl rewrites each launch `k<<<g, b, shm, s>>>(args);`
 * into `emu_launch([&] { k(args); }, "k (file:line)", g, b, shm, s);` and
 * this header, forced in front of the translated file (g++ -include), turns
 * the CUDA qualifiers into plain C++ and declares the built-in variables and
 * intrinsics. A launch runs block after block; inside a block every CUDA
 * thread is a fiber (cuda_emu.cpp) that runs until it reaches a barrier
 * (__syncthreads, or a warp's __shfl_xor_sync/__syncwarp) or returns, so
 * code between barriers runs in whatever order the scheduler picks: a fresh
 * random order every round, which makes a kernel that reads shared memory or
 * another lane's data without a barrier give different bits from run to run.
 * A barrier that can never be passed (threads of one block waiting at
 * different barriers, a full-mask shuffle after some lanes returned) fails
 * the launch: cudaGetLastError (cudart_standin.c, the CUDA runtime on the
 * CPU) then returns cudaErrorLaunchFailure, and stderr says which kernel
 * line was stuck.
 *
 * Shared memory is a function-static array (one block runs at a time).
 * A launch waits for its stream's earlier work, then runs to completion
 * inside emu_launch: the stream's later work comes after it, as on a GPU. */
#ifndef PP_CUDA_EMU_H
#define PP_CUDA_EMU_H
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>

/* The toolkit's host_defines.h turns these into attributes g++ rejects. */
#undef __global__
#undef __device__
#undef __shared__
#undef __host__
#define __global__
#define __device__
#define __host__
#define __shared__ static

/* The running CUDA thread's coordinates (cuda_emu.cpp sets them). */
extern uint3 emu_block_idx;
extern dim3 emu_block_dim, emu_grid_dim;
const uint3 &emu_thread_idx(void);
#define threadIdx (emu_thread_idx())
#define blockIdx (emu_block_idx)
#define blockDim (emu_block_dim)
#define gridDim (emu_grid_dim)

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* Lane `lane ^ xor_mask`'s value of v; every lane in mask must take part. */
double emu_shfl_xor(unsigned mask, double v, int xor_mask);
static inline float __shfl_xor_sync(unsigned mask, float v, int xor_mask) {
    return (float)emu_shfl_xor(mask, v, xor_mask);
}
static inline int __shfl_xor_sync(unsigned mask, int v, int xor_mask) { return (int)emu_shfl_xor(mask, v, xor_mask); }

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* Device work as a profiler sees it: what is "kernel (file:line)" for a
 * launch, a library's name for its call (the cuBLAS stand-in's GEMMs);
 * called with begin = 1 just before the work and 0 just after, on the
 * launching thread. The CUPTI stand-in sets the observer when kernel
 * records are enabled; emu_observe does nothing until then. */
typedef void (*emu_observer_fn)(const char *what, cudaStream_t stream, int begin);
extern "C" void emu_set_observer(emu_observer_fn fn);
extern "C" void emu_observe(const char *what, cudaStream_t stream, int begin);
/* The seed of the thread order (EMU_SEED, else the clock), to log it. */
extern "C" unsigned long long emu_seed(void);

/* One launch: body() is the kernel call, run once per CUDA thread. */
typedef void (*emu_body_fn)(void *body);
void emu_run(emu_body_fn fn, void *body, dim3 grid, dim3 block, cudaStream_t stream, const char *where);

template <class F>
static void emu_call(void *body) {
    (*(F *)body)();
}
/* What cuda_emu_translate.pl writes for `kernel<<<grid, block, shm, stream>>>`:
 * where is "kernel (file:line)" for error messages. */
template <class F>
static void emu_launch(F body, const char *where, dim3 grid, dim3 block, size_t shared_bytes = 0,
                       cudaStream_t stream = 0) {
    (void)shared_bytes; /* dynamic shared memory: none of our kernels uses it */
    emu_run(emu_call<F>, &body, grid, block, stream, where);
}

#endif
