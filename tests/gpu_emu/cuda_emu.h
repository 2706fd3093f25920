/* cuda_emu.h: runs CUDA kernels on the CPU, thread by thread, so that the
 * kernels of runner/model/cuda/gpu_kernels.cu can be held against their CPU
 * references on a machine without a GPU. Not a GPU model: it proves the
 * kernels' index arithmetic, bounds, barriers and shuffles, nothing about
 * the GPU's floating point (expf here is glibc's) or its speed.
 *
 * How: cuda_emu_translate.pl rewrites each launch `k<<<g, b, shm, s>>>(args);`
 * into `emu_launch(emu_bind(k, args), "k (file:line)", g, b, shm, s);` and
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
 * inside emu_launch: the stream's later work comes after it, as on a GPU.
 *
 * Unless PPRUN_STUB_ASYNC_US is set (to N >= 0): then a launch on a
 * stream is queued there like a copy (the body, arguments captured by
 * value, goes with it) and returns at once; the stream's thread runs it
 * after waiting N microseconds, as a busy GPU starts a kernel late. The
 * host runs ahead of its kernels as it does on a GPU, so a buffer read
 * from another stream or process without an event or synchronisation
 * after the kernels that write it is read before they ran: the stream
 * order races that the synchronous launch hides (docs/gpu.md, "The CUDA
 * emulator"). A launch on the legacy stream (0) stays synchronous. */
#ifndef PP_CUDA_EMU_H
#define PP_CUDA_EMU_H
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>

#include <tuple>
#include <type_traits>
#include <utility>

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
 * launch, a library's name for its call (the cuBLAS stand-in's GEMMs).
 * Called three times per launch, as CUPTI sees one: EMU_LAUNCH on the
 * launching thread when the work is queued (the observer sets *corr, the
 * launch's correlation id, from that thread's state), then EMU_BEGIN just
 * before the work and EMU_END just after, on the thread that runs it, with
 * the same *corr. The CUPTI stand-in sets the observer when kernel records
 * are enabled; emu_observe does nothing (and *corr stays 0) until then. */
enum { EMU_LAUNCH, EMU_BEGIN, EMU_END };
typedef void (*emu_observer_fn)(const char *what, cudaStream_t stream, int phase, unsigned *corr);
extern "C" void emu_set_observer(emu_observer_fn fn);
extern "C" void emu_observe(const char *what, cudaStream_t stream, int phase, unsigned *corr);
/* The seed of the thread order (EMU_SEED, else the clock), to log it. */
extern "C" unsigned long long emu_seed(void);
/* PPRUN_STUB_ASYNC_US: -1 when unset (launches synchronous), else the
 * microseconds a queued launch waits before it runs. */
extern "C" long emu_async_us(void);
/* Queues fn(arg) on the stream (not the legacy one), to run after that
 * wait: a queued launch, or a library's (the cuBLAS stand-in's GEMMs).
 * 0, or -1 when it could not be queued (fn not called). */
extern "C" int emu_queue_late(cudaStream_t stream, void (*fn)(void *), void *arg);

/* One launch: body() is the kernel call, run once per CUDA thread.
 * emu_run runs it now; emu_queue (PPRUN_STUB_ASYNC_US set, a stream
 * given) queues it on the stream and frees it with drop() once run. */
typedef void (*emu_body_fn)(void *body);
void emu_run(emu_body_fn fn, void *body, dim3 grid, dim3 block, cudaStream_t stream, const char *where);
void emu_queue(emu_body_fn fn, void *body, emu_body_fn drop, dim3 grid, dim3 block, cudaStream_t stream,
               const char *where);

template <class F>
static void emu_call(void *body) {
    (*(F *)body)();
}
/* A kernel and its arguments' values, taken at the launch (arrays decay
 * to pointers, as they do in a call): what a launch hands the GPU. */
template <class K, class... A>
struct emu_bound {
    K kernel;
    std::tuple<A...> args;
    void operator()() { std::apply(kernel, args); }
};
template <class K, class... A>
static emu_bound<K, std::decay_t<A>...> emu_bind(K kernel, A &&...args) {
    return {kernel, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
}
template <class F>
static void emu_drop(void *body) {
    delete (F *)body;
}
/* What cuda_emu_translate.pl writes for `kernel<<<grid, block, shm, stream>>>`:
 * body is emu_bind's (the arguments' values, so that a queued launch
 * outlives its caller's frame), where "kernel (file:line)" for error
 * messages. */
template <class F>
static void emu_launch(F body, const char *where, dim3 grid, dim3 block, size_t shared_bytes = 0,
                       cudaStream_t stream = 0) {
    (void)shared_bytes; /* dynamic shared memory: none of our kernels uses it */
    if (stream && emu_async_us() >= 0)
        emu_queue(emu_call<F>, new F(body), emu_drop<F>, grid, block, stream, where);
    else
        emu_run(emu_call<F>, &body, grid, block, stream, where);
}

#endif
