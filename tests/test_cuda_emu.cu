/* test_cuda_emu.cu: the CUDA emulator (tests/gpu_emu/cuda_emu.h) keeps
 * CUDA's semantics, so that a kernel passing test_gpu_kernels_emu means
 * something: every thread sees its own coordinates in 1-3 D grids, shared
 * memory is shared within a block after __syncthreads, a warp shuffle sums
 * exactly, and the mistakes a GPU punishes fail here too: a missing
 * barrier gives different bits under different thread orders, a barrier
 * some threads skip and a full-mask shuffle after lanes returned fail the
 * launch, as does an impossible launch configuration. With launches queued
 * (PPRUN_STUB_ASYNC_US), a launch returns before its kernel runs, with its
 * arguments' values as they were at the launch; another stream sees the
 * kernel's output only through an event; cudaFree waits for the kernels
 * that may use the memory; a failed kernel fails its stream's
 * synchronisations, cudaFree's among them.
 *
 * Compiled like gpu_kernels.cu for the emulator (tests/gpu_emu/CMakeLists.txt:
 * cuda_emu_translate.pl, then g++ with cuda_emu.h in front); never by nvcc. */
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <thread>

/* Each thread writes its global linear id where its coordinates say. */
__global__ void k_coordinates(unsigned *out) {
    unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
    out[bx * per_block + tx] = bx * per_block + tx + 1;
}

Test(cuda_emu, every_thread_sees_its_coordinates) {
    dim3 grid(3, 2, 2), block(8, 4, 2);
    size_t n = 3 * 2 * 2 * 8 * 4 * 2;
    unsigned *out = (unsigned *)calloc(n, sizeof *out);
    k_coordinates<<<grid, block>>>(out);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    for (size_t i = 0; i < n; i++) cr_assert_eq(out[i], i + 1, "thread %zu wrote %u", i, out[i]);
    free(out);
}

/* Reverses each block's slice through shared memory; with_barrier = 0 is
 * the classic missing __syncthreads. */
__global__ void k_reverse(int *data, int with_barrier) {
    __shared__ int tile[256];
    int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    tile[t] = data[base + t];
    if (with_barrier) __syncthreads();
    data[base + t] = tile[blockDim.x - 1 - t];
}

static int reverse_is_right(int with_barrier) {
    int data[4 * 256];
    for (int i = 0; i < 4 * 256; i++) data[i] = i;
    k_reverse<<<4, 256>>>(data, with_barrier);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 256; t++)
            if (data[b * 256 + t] != b * 256 + 255 - t) return 0;
    return 1;
}

Test(cuda_emu, shared_memory_after_a_barrier_and_a_missing_barrier_caught) {
    cr_log_info("EMU_SEED=%llu", emu_seed());
    cr_assert(reverse_is_right(1), "shared memory reversed wrongly with __syncthreads");
    /* Without the barrier, of threads t and 255 - t the one that runs first
     * reads the other's tile entry before it is written. */
    cr_assert(!reverse_is_right(0), "a missing __syncthreads went unnoticed");
}

__device__ static float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__global__ void k_warp_sums(float *out, const float *in) {
    float s = warp_sum(in[blockIdx.x * blockDim.x + threadIdx.x]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

Test(cuda_emu, warp_shuffle_sums_every_lane) {
    float in[2 * 64], out[2 * 64];
    for (int i = 0; i < 128; i++) in[i] = (float)i;
    k_warp_sums<<<2, 64>>>(out, in);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    for (int w = 0; w < 4; w++) { /* each warp's lanes: 32 w .. 32 w + 31 */
        float want = (float)(32 * 32 * w + 31 * 32 / 2);
        for (int l = 0; l < 32; l++) cr_assert_eq(out[32 * w + l], want, "warp %d lane %d: %g", w, l, out[32 * w + l]);
    }
}

/* Shuffles in a row, each offering another value: lanes that read one
 * shuffle's value go on to offer the next one's while others still read
 * (the fibers run in a fresh random order every round). */
#define SHUFFLES 8
__global__ void k_shuffles_in_a_row(int *out) {
    int lane = threadIdx.x % 32;
    for (int k = 0; k < SHUFFLES; k++)
        out[threadIdx.x * SHUFFLES + k] = (int)__shfl_xor_sync(0xffffffffu, (float)(1000 * k + lane), 1 << (k % 5));
}

Test(cuda_emu, each_shuffle_in_a_row_reads_its_own_values) {
    int out[64 * SHUFFLES];
    for (int run = 0; run < 20; run++) {
        memset(out, 0xff, sizeof out);
        k_shuffles_in_a_row<<<1, 64>>>(out);
        cr_assert_eq(cudaGetLastError(), cudaSuccess);
        for (int t = 0; t < 64; t++)
            for (int k = 0; k < SHUFFLES; k++)
                cr_assert_eq(out[t * SHUFFLES + k], 1000 * k + ((t % 32) ^ (1 << (k % 5))), "thread %d shuffle %d: %d",
                             t, k, out[t * SHUFFLES + k]);
    }
}

/* A barrier inside a branch only some threads take. */
__global__ void k_divergent_barrier(int *out) {
    if (threadIdx.x < 16) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
/* A full-mask shuffle after lane 31 returned. */
__global__ void k_shuffle_after_return(float *out) {
    if (threadIdx.x % 32 == 31) return;
    out[threadIdx.x] = warp_sum(1.0f);
}

static void expect_failed_launch(const char *kernel) {
    cr_assert_neq(cudaGetLastError(), cudaSuccess, "%s: the launch should have failed", kernel);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "the error is cleared once read, as CUDA's is");
}

Test(cuda_emu, barriers_that_cannot_open_fail_the_launch) {
    int out[64] = {0};
    float fout[64] = {0};
    k_divergent_barrier<<<1, 64>>>(out);
    expect_failed_launch("k_divergent_barrier");
    k_shuffle_after_return<<<1, 64>>>(fout);
    expect_failed_launch("k_shuffle_after_return");
    k_coordinates<<<1, 2048>>>((unsigned *)out); /* over 1024 threads per block */
    expect_failed_launch("2048 threads per block");
}

/* --- launches that run late (PPRUN_STUB_ASYNC_US) ------------------------------- */

__global__ void k_fill(int *out, int v) { out[threadIdx.x] = v; }

/* A host function that holds its stream until the test opens the gate: what
 * is queued behind it has certainly not run before then. */
static std::atomic<int> gate;
static void wait_for_gate(void *) {
    while (!gate.load()) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

#define OLD 0x01010101 /* src before the kernel: every byte 1 */

/* Launches queued from here on in this process (Criterion runs each test
 * in a process of its own; the emulator reads the variable once). */
static void queue_launches(void) {
    setenv("PPRUN_STUB_ASYNC_US", "0", 1);
    cr_assert_geq(emu_async_us(), 0, "a launch made before this test's first one read the variable");
}

/* Stream a, held shut, with a k_fill of 7 into src queued behind the gate. */
static void queue_fill_behind_gate(cudaStream_t *a, int **src) {
    queue_launches();
    gate = 0;
    cr_assert_eq(cudaStreamCreateWithFlags(a, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)src, 64 * sizeof(int)), cudaSuccess);
    cr_assert_eq(cudaMemsetAsync(*src, 1, 64 * sizeof(int), *a), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(*a), cudaSuccess); /* OLD in place before another stream reads it */
    cr_assert_eq(cudaLaunchHostFunc(*a, wait_for_gate, NULL), cudaSuccess);
    k_fill<<<1, 64, 0, *a>>>(*src, 7);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
}

Test(cuda_emu, a_launch_returns_before_its_kernel_runs_as_on_a_gpu, .timeout = 30) {
    cudaStream_t a, b;
    int *src, *dst, host[64];
    queue_fill_behind_gate(&a, &src);
    cr_assert_eq(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&dst, sizeof host), cudaSuccess);
    /* another stream that reads src without waiting for a reads it as it was */
    cr_assert_eq(cudaMemcpyAsync(dst, src, sizeof host, cudaMemcpyDeviceToDevice, b), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(b), cudaSuccess);
    cr_assert_eq(cudaMemcpy(host, dst, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(host[i], OLD, "element %d: %#x, the kernel ran before its stream let it", i, host[i]);
    /* with an event recorded after the kernel and waited for by b, b reads its output */
    cudaEvent_t ev;
    cr_assert_eq(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    cr_assert_eq(cudaEventRecord(ev, a), cudaSuccess);
    cr_assert_eq(cudaStreamWaitEvent(b, ev, 0), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(dst, src, sizeof host, cudaMemcpyDeviceToDevice, b), cudaSuccess);
    gate = 1;
    cr_assert_eq(cudaStreamSynchronize(b), cudaSuccess);
    cr_assert_eq(cudaMemcpy(host, dst, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++) cr_assert_eq(host[i], 7, "element %d after the event: %d", i, host[i]);
    cudaEventDestroy(ev);
    cudaFree(dst), cudaFree(src);
    cudaStreamDestroy(b), cudaStreamDestroy(a);
}

Test(cuda_emu, cudafree_waits_for_a_queued_kernel_that_uses_the_memory, .timeout = 30) {
    cudaStream_t a;
    int *src;
    queue_fill_behind_gate(&a, &src);
    std::thread opener([] {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        gate = 1;
    });
    cr_assert_eq(cudaFree(src), cudaSuccess); /* returns once the kernel ran, as CUDA's implicit synchronisation */
    cr_assert_eq(gate.load(), 1, "cudaFree returned while a kernel queued before it could still write the memory");
    opener.join();
    cudaStreamDestroy(a);
}

/* A launch takes its arguments' values when it is made, as CUDA copies
 * them: a pointer read through a structure the caller changes (or frees)
 * right after the launch is the one the kernel uses. */
Test(cuda_emu, a_queued_launch_keeps_the_argument_values_it_was_given, .timeout = 30) {
    cudaStream_t a;
    int *src, *other, host[64];
    queue_fill_behind_gate(&a, &src);
    cr_assert_eq(cudaMalloc((void **)&other, sizeof host), cudaSuccess);
    struct { int *out; int value; } h = {other, 5}, *hp = &h;
    k_fill<<<1, 64, 0, a>>>(hp->out, hp->value);
    hp->out = src, hp->value = 6; /* after the launch: not the kernel's */
    gate = 1;
    cr_assert_eq(cudaStreamSynchronize(a), cudaSuccess);
    cr_assert_eq(cudaMemcpy(host, other, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++) cr_assert_eq(host[i], 5, "element %d of the buffer given: %d", i, host[i]);
    cr_assert_eq(cudaMemcpy(host, src, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++) cr_assert_eq(host[i], 7, "element %d of the other buffer: %d", i, host[i]);
    cudaFree(other), cudaFree(src);
    cudaStreamDestroy(a);
}

/* A queued launch that fails fails the synchronisation with its stream,
 * and every later one (a GPU's fault is sticky), the next
 * cudaGetLastError, and cudaFree, whose implicit synchronisation returns
 * the sticky error as CUDA's does (a teardown that took its success for
 * a clean device would hide the fault). */
Test(cuda_emu, a_queued_launch_that_fails_fails_its_streams_synchronisation, .timeout = 30) {
    queue_launches();
    cudaStream_t a;
    int *out;
    cr_assert_eq(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&out, 64 * sizeof(int)), cudaSuccess);
    k_divergent_barrier<<<1, 64, 0, a>>>(out);
    cr_assert_eq(cudaStreamSynchronize(a), cudaErrorLaunchFailure);
    cr_assert_eq(cudaStreamSynchronize(a), cudaErrorLaunchFailure, "the failure is sticky");
    cr_assert_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    expect_failed_launch("k_divergent_barrier, queued");
    cr_assert_eq(cudaFree(out), cudaErrorLaunchFailure, "cudaFree on a device with a sticky fault succeeded");
    cudaStreamDestroy(a);
}
