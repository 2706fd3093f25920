/* cuda_emu.cpp: the CPU side of cuda_emu.h. A block's CUDA threads are
 * fibers that one OS thread schedules between barriers. The CUDA runtime
 * around the kernels is cudart_standin.c (streams as threads, memory shared
 * between processes). A launch first waits for its stream, so it sees every
 * copy queued before it, or (PPRUN_STUB_ASYNC_US) is queued on it and run
 * by the stream's thread; a failed one is reported to the runtime, whose
 * cudaGetLastError returns it, and its reason goes to stderr.
 *
 * Scheduling: every runnable fiber of the block runs (in this round's
 * order) until it returns or waits at a barrier. Then every warp whose
 * lanes all wait at a warp barrier is released; failing any, a block whose
 * threads all wait at __syncthreads; failing both, the block is stuck and
 * the launch fails. The order is a fresh random permutation of the
 * runnable fibers per round, seeded by EMU_SEED or the clock and reported
 * by emu_seed() so that a failing order can be replayed. (Releasing one
 * warp a round made a 1024-thread block's warp shuffles 32 rounds each,
 * every round a permutation of the whole block: most of an emulated
 * job's time.) */
#include "tests/gpu_emu/cuda_emu.h"

#include "tests/gpu_emu/cudart_standin.h"

#include <atomic>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if !defined(__x86_64__)
#error "cuda_emu.cpp switches fibers with x86-64 code; tests/gpu_emu/CMakeLists.txt builds it on x86-64 only"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

enum { EMU_RUNNABLE, EMU_AT_BLOCK_BARRIER, EMU_AT_WARP_BARRIER, EMU_DONE };
#define EMU_STACK (128 * 1024)
#define EMU_MAX_THREADS 1024

typedef struct emu_thread {
    void *sp; /* saved stack pointer while switched out */
    uint3 idx;
    int state;
    double shuffle_value[2]; /* what this lane offers to the warp's shuffles, even and odd */
    unsigned shuffles;       /* how many this lane has made in the block */
#ifdef EMU_ASAN
    void *fake_stack; /* ASan's, while the fiber is switched out */
#endif
} emu_thread;

uint3 emu_block_idx;
dim3 emu_block_dim, emu_grid_dim;

static emu_thread emu_threads[EMU_MAX_THREADS];
static char *emu_stacks; /* EMU_MAX_THREADS stacks, allocated on first launch, kept */
static int emu_nthreads, emu_current;
static void *emu_scheduler_sp;
static emu_body_fn emu_fn;
static void *emu_body;
static const char *emu_where;
static char emu_error[512]; /* why the launch under way failed (the first reason) */
static uint64_t emu_rng;
static int emu_seeded;
/* One launch at a time in a process: the state above is the launch's. */
static pthread_mutex_t emu_launch_mu = PTHREAD_MUTEX_INITIALIZER;
static std::atomic<emu_observer_fn> emu_observer; /* the CUPTI stand-in's, once it is enabled */

#ifdef EMU_ASAN
static const void *emu_scheduler_stack; /* the scheduler's stack, for ASan */
static size_t emu_scheduler_stack_size;
#endif

/* The fiber switch: pushes the callee-saved registers of the SysV ABI,
 * stores the stack pointer in *save, loads `load` and pops the other
 * fiber's registers; its `ret` resumes that fiber. ucontext's swapcontext
 * does the same plus a sigprocmask system call per switch, where the
 * emulated stage tests spent most of their time. Neither side changes the
 * floating-point control words, so they are not saved. */
extern "C" void emu_switch(void **save, void *load);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n");

/* Switches from the scheduler to thread t and back, telling ASan which
 * stack is in use so it does not report the switch as an overflow. */
static void emu_switch_to(int t) {
    emu_current = t;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, emu_stacks + (size_t)t * EMU_STACK, EMU_STACK);
#endif
    emu_switch(&emu_scheduler_sp, emu_threads[t].sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

/* From a fiber back to the scheduler (the fiber resumes here later). */
static void emu_yield(int state) {
    emu_thread *self = &emu_threads[emu_current];
    self->state = state;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&self->fake_stack, emu_scheduler_stack, emu_scheduler_stack_size);
#endif
    emu_switch(&self->sp, emu_scheduler_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(self->fake_stack, NULL, NULL);
#endif
}

/* A fiber's first and only frame: never returns (there is nothing to
 * return to); its last switch hands the stack back for good. */
static void emu_thread_main(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &emu_scheduler_stack, &emu_scheduler_stack_size);
#endif
    emu_fn(emu_body);
    emu_thread *self = &emu_threads[emu_current];
    self->state = EMU_DONE;
#ifdef EMU_ASAN
    /* NULL: this fiber's fake stack can go, it never resumes */
    __sanitizer_start_switch_fiber(NULL, emu_scheduler_stack, emu_scheduler_stack_size);
#endif
    emu_switch(&self->sp, emu_scheduler_sp);
    __builtin_unreachable();
}

/* A fresh stack for fiber t whose first switch "returns" into
 * emu_thread_main: six zero registers for emu_switch to pop, then the
 * return address, placed so that emu_thread_main starts with the stack
 * aligned as after a call. Its top is t % 256 cache lines below the
 * stack's end: the stacks are EMU_STACK apart, a multiple of every cache's
 * set stride, so tops at one offset all fall in one cache set and evict
 * each other at every switch. */
static void *emu_fresh_stack(char *stack, int t) {
    uintptr_t top = ((uintptr_t)(stack + EMU_STACK - (size_t)(t % 256) * 64) & ~(uintptr_t)15) - 16;
    void **sp = (void **)top;
    *sp = (void *)emu_thread_main; /* at a 16-byte boundary: rsp % 16 == 8 on entry */
    for (int i = 0; i < 6; i++) *--sp = NULL;
    return sp;
}

const uint3 &emu_thread_idx(void) { return emu_threads[emu_current].idx; }

static void emu_fail(const char *what) {
    if (emu_error[0]) return; /* the first error is the one that counts */
    snprintf(emu_error, sizeof emu_error, "%s: block (%u,%u,%u): %s", emu_where, emu_block_idx.x, emu_block_idx.y,
             emu_block_idx.z, what);
}

/* --- barriers and shuffles (called on a fiber) -------------------------------- */

void __syncthreads(void) { emu_yield(EMU_AT_BLOCK_BARRIER); }

void __syncwarp(unsigned mask) {
    if (mask != 0xffffffffu) emu_fail("__syncwarp with a partial mask (not emulated)");
    emu_yield(EMU_AT_WARP_BARRIER);
}

double emu_shfl_xor(unsigned mask, double v, int xor_mask) {
    int me = emu_current, lane = me % 32, warp0 = me - lane;
    int src = warp0 + (lane ^ (xor_mask & 31));
    if (mask != 0xffffffffu) emu_fail("__shfl_xor_sync with a partial mask (not emulated)");
    /* Even and odd shuffles offer in slots of their own: a lane that read
     * this shuffle's value and went on offers the next one's in the other
     * slot while slower lanes still read this one, and cannot offer again
     * in this one before every lane has reached the next shuffle (by then
     * each has read). One barrier a shuffle, not two. */
    unsigned slot = emu_threads[me].shuffles++ & 1;
    emu_threads[me].shuffle_value[slot] = v;
    emu_yield(EMU_AT_WARP_BARRIER); /* every lane of the warp has offered its value */
    if (src < emu_nthreads) return emu_threads[src].shuffle_value[slot];
    emu_fail("__shfl_xor_sync reads a lane past the end of the block");
    return v;
}

/* --- the scheduler ------------------------------------------------------------ */

static uint64_t emu_next_random(void) { /* splitmix64 */
    uint64_t z = (emu_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" unsigned long long emu_seed(void) {
    static uint64_t seed;
    if (!emu_seeded) {
        const char *s = getenv("EMU_SEED");
        emu_seeded = 1;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = s ? strtoull(s, NULL, 0) : (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
        emu_rng = seed;
    }
    return seed;
}

/* Releases what can be passed: every warp barrier at which each lane of
 * its warp waits, else __syncthreads when every thread of the block waits
 * at it. A thread that returned never arrives: CUDA leaves a barrier that
 * not all threads reach undefined, so here it never opens. Returns 0 when
 * nothing can be released (the block is stuck). */
static int emu_release(void) {
    int released = 0;
    for (int w = 0; w < emu_nthreads; w += 32) {
        int lanes = emu_nthreads - w < 32 ? emu_nthreads - w : 32, waiting = 0;
        for (int t = w; t < w + lanes; t++) waiting += emu_threads[t].state == EMU_AT_WARP_BARRIER;
        if (waiting == lanes) {
            for (int t = w; t < w + lanes; t++) emu_threads[t].state = EMU_RUNNABLE;
            released = 1;
        }
    }
    if (released) return 1;
    for (int t = 0; t < emu_nthreads; t++)
        if (emu_threads[t].state != EMU_AT_BLOCK_BARRIER) return 0;
    for (int t = 0; t < emu_nthreads; t++) emu_threads[t].state = EMU_RUNNABLE;
    return 1;
}

/* Why the block is stuck, for the launch's error. */
static const char *emu_stuck_reason(void) {
    for (int t = 0; t < emu_nthreads; t++)
        if (emu_threads[t].state == EMU_DONE)
            return "stuck: threads wait at a barrier (__syncthreads, or a full-mask __shfl_xor_sync/__syncwarp) "
                   "that other threads of the block or warp returned without reaching (undefined on a GPU)";
    return "stuck: its threads wait at different barriers";
}

static void emu_run_block(void) {
    int order[EMU_MAX_THREADS];
    for (int t = 0; t < emu_nthreads; t++) {
        emu_thread *th = &emu_threads[t];
        th->idx.x = (unsigned)t % emu_block_dim.x;
        th->idx.y = (unsigned)t / emu_block_dim.x % emu_block_dim.y;
        th->idx.z = (unsigned)t / (emu_block_dim.x * emu_block_dim.y);
        th->state = EMU_RUNNABLE;
        th->shuffles = 0;
        th->sp = emu_fresh_stack(emu_stacks + (size_t)t * EMU_STACK, t);
    }
    for (;;) {
        int runnable = 0;
        for (int t = 0; t < emu_nthreads; t++)
            if (emu_threads[t].state == EMU_RUNNABLE) order[runnable++] = t;
        for (int i = runnable - 1; i > 0; i--) { /* Fisher-Yates */
            int j = (int)(emu_next_random() % (uint64_t)(i + 1)), k = order[i];
            order[i] = order[j], order[j] = k;
        }
        for (int i = 0; i < runnable; i++) emu_switch_to(order[i]);
        int done = 1;
        for (int t = 0; t < emu_nthreads && done; t++) done = emu_threads[t].state == EMU_DONE;
        if (done) return;
        if (!emu_release()) {
            /* Abandoned fibers hold no resources: kernels allocate nothing. */
            emu_fail(emu_stuck_reason());
            return;
        }
    }
}

/* Why a launch of this shape cannot run (CUDA says so at the launch, not
 * later), or NULL. */
static const char *emu_config_error(dim3 grid, dim3 block) {
    size_t threads = (size_t)block.x * block.y * block.z;
    if (threads == 0 || threads > EMU_MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0)
        return "invalid launch configuration (cudaErrorInvalidConfiguration)";
    return NULL;
}

static void emu_run_locked(emu_body_fn fn, void *body, dim3 grid, dim3 block) {
    const char *bad = emu_config_error(grid, block);
    if (bad) {
        emu_fail(bad);
        return;
    }
    if (!emu_stacks && !(emu_stacks = (char *)malloc((size_t)EMU_MAX_THREADS * EMU_STACK))) {
        emu_fail("out of memory for the emulator's fiber stacks");
        return;
    }
    emu_seed();
    emu_fn = fn, emu_body = body;
    emu_block_dim = block, emu_grid_dim = grid, emu_nthreads = (int)(block.x * block.y * block.z);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block_idx = make_uint3(x, y, z);
                emu_run_block();
                if (emu_error[0]) return;
            }
}

extern "C" void emu_set_observer(emu_observer_fn fn) { emu_observer = fn; }

extern "C" void emu_observe(const char *what, cudaStream_t stream, int phase, unsigned *corr) {
    emu_observer_fn fn = emu_observer;
    if (fn) fn(what, stream, phase, corr);
}

extern "C" long emu_async_us(void) {
    static std::atomic<long> us{-2}; /* -2: not read yet */
    long v = us;
    if (v == -2) {
        const char *s = getenv("PPRUN_STUB_ASYNC_US");
        char *end;
        v = s && *s ? strtol(s, &end, 10) : -1;
        if (s && *s && (*end || v < 0)) {
            fprintf(stderr, "cuda_emu: PPRUN_STUB_ASYNC_US=%s is not a count of microseconds; launches stay "
                            "synchronous\n", s);
            v = -1;
        }
        us = v;
    }
    return v;
}

/* Runs one launch to its end on the calling thread (the launching one,
 * or the stream's for a queued launch). A failed launch's reason goes to
 * stderr (cudaGetErrorString cannot say which launch) and its error to
 * the runtime's cudaGetLastError. */
static void emu_execute(emu_body_fn fn, void *body, dim3 grid, dim3 block, cudaStream_t stream, const char *where,
                        unsigned corr) {
    pthread_mutex_lock(&emu_launch_mu);
    emu_where = where;
    emu_block_idx = make_uint3(0, 0, 0);
    emu_observe(where, stream, EMU_BEGIN, &corr);
    emu_run_locked(fn, body, grid, block);
    emu_observe(where, stream, EMU_END, &corr);
    if (emu_error[0]) {
        fprintf(stderr, "cuda_emu: %s\n", emu_error);
        emu_error[0] = '\0';
        cudart_standin_launch_failed(stream);
    }
    pthread_mutex_unlock(&emu_launch_mu);
}

void emu_run(emu_body_fn fn, void *body, dim3 grid, dim3 block, cudaStream_t stream, const char *where) {
    unsigned corr = 0;
    emu_observe(where, stream, EMU_LAUNCH, &corr);
    if (stream && cudaStreamSynchronize(stream) != cudaSuccess) {
        fprintf(stderr, "cuda_emu: %s: its stream failed before the launch (cudaStreamSynchronize)\n", where);
        cudart_standin_launch_failed(stream);
        return;
    }
    emu_execute(fn, body, grid, block, stream, where, corr);
}

/* A queued launch: what emu_queue hands the stream's thread. */
typedef struct emu_job {
    emu_body_fn fn, drop;
    void *body;
    dim3 grid, block;
    cudaStream_t stream;
    const char *where;
    unsigned corr;
} emu_job;

static void emu_job_main(void *arg) {
    emu_job *j = (emu_job *)arg;
    emu_execute(j->fn, j->body, j->grid, j->block, j->stream, j->where, j->corr);
    j->drop(j->body);
    free(j);
}

/* What emu_queue_late hands the stream's thread. */
typedef struct emu_late {
    void (*fn)(void *);
    void *arg;
} emu_late;

static void emu_late_main(void *arg) {
    emu_late l = *(emu_late *)arg;
    free(arg);
    long us = emu_async_us();
    struct timespec ts = {us / 1000000, us % 1000000 * 1000};
    while (us > 0 && nanosleep(&ts, &ts) != 0) {
    }
    l.fn(l.arg);
}

extern "C" int emu_queue_late(cudaStream_t stream, void (*fn)(void *), void *arg) {
    emu_late *l = (emu_late *)malloc(sizeof *l);
    if (!l) return -1;
    *l = emu_late{fn, arg};
    if (cudaLaunchHostFunc(stream, emu_late_main, l) == cudaSuccess) return 0;
    free(l);
    return -1;
}

void emu_queue(emu_body_fn fn, void *body, emu_body_fn drop, dim3 grid, dim3 block, cudaStream_t stream,
               const char *where) {
    const char *bad = emu_config_error(grid, block);
    emu_job *j = bad ? NULL : (emu_job *)malloc(sizeof *j);
    if (j) {
        *j = emu_job{fn, drop, body, grid, block, stream, where, 0};
        emu_observe(where, stream, EMU_LAUNCH, &j->corr);
        if (emu_queue_late(stream, emu_job_main, j) == 0) return;
        free(j);
        bad = "its stream refused the work (cudaLaunchHostFunc), or out of memory";
    }
    fprintf(stderr, "cuda_emu: %s: %s\n", where, bad ? bad : "out of memory to queue the launch");
    cudart_standin_launch_failed(stream);
    drop(body);
}
