/* cupti.c: CUPTI activity tracing of a --device cuda worker (gputrace.h):
 * loading libcupti, its callbacks, the engine's hooks. The record logic is
 * cupti_records.c.
 *
 * Never run on a GPU yet (docs/gpu.md). */
#include <cuda_runtime.h>
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dl.h"
#include "tracer/cuda/cupti_records.h"
#include "tracer/gputrace.h"

#define BUFFER_BYTES (4u << 20)     /* CUPTI's advice: 1 to 10 MB */
#define MAX_RECORDS (4u << 20)      /* kept per step; more are counted as lost */
#define MAX_SEGS_PER_STEP (1u << 20) /* host ops per step; more are not correlated */

/* The toolkit we compiled against first, then the soname (its headers
 * have no major-version macro for CUPTI): a newer 13.x found first on the
 * search path would hand out newer record versions (Kernel11, ...), whose
 * fields we read are the same but no longer promised. */
_Static_assert(CUDA_VERSION / 1000 == 13, "libcupti's soname below is CUDA 13's: update it with the toolkit");
static const char *const cupti_paths[] = {
#ifdef PPRUN_CUDA_LIBDIR
    PPRUN_CUDA_LIBDIR "/libcupti.so.13",
#endif
    "libcupti.so.13",
};

typedef struct cupti_api {
    CUptiResult (*get_result_string)(CUptiResult, const char **);
    CUptiResult (*register_timestamp)(CUpti_TimestampCallbackFunc);
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
    CUptiResult (*push_ext)(CUpti_ExternalCorrelationKind, uint64_t);
    CUptiResult (*pop_ext)(CUpti_ExternalCorrelationKind, uint64_t *);
} cupti_api;

static cupti_api api;
static char load_error[512];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void cupti_load(void) {
    void *lib = pp_dlopen_first(cupti_paths, sizeof cupti_paths / sizeof *cupti_paths, load_error, sizeof load_error);
    if (!lib) return;
    cupti_api t;
    const pp_dlsym_entry syms[] = {
        {(void **)&t.get_result_string, "cuptiGetResultString"},
        {(void **)&t.register_timestamp, "cuptiActivityRegisterTimestampCallback"},
        {(void **)&t.register_callbacks, "cuptiActivityRegisterCallbacks"},
        {(void **)&t.enable, "cuptiActivityEnable"},
        {(void **)&t.disable, "cuptiActivityDisable"},
        {(void **)&t.flush_all, "cuptiActivityFlushAll"},
        {(void **)&t.next_record, "cuptiActivityGetNextRecord"},
        {(void **)&t.dropped, "cuptiActivityGetNumDroppedRecords"},
        {(void **)&t.push_ext, "cuptiActivityPushExternalCorrelationId"},
        {(void **)&t.pop_ext, "cuptiActivityPopExternalCorrelationId"},
    };
    /* On failure the library stays loaded: nothing else to unload it for. */
    if (pp_dlsym_all(lib, syms, sizeof syms / sizeof *syms, "libcupti", load_error, sizeof load_error) == 0) api = t;
}

int gputrace_available(pp_err *err) {
    pthread_once(&load_once, cupti_load);
    return load_error[0] ? pp_fail(err, "CUPTI: %s", load_error) : 0;
}

static const char *result_name(CUptiResult rc) {
    const char *s = NULL;
    if (api.get_result_string && api.get_result_string(rc, &s) == CUPTI_SUCCESS && s) return s;
    return "unknown CUPTI error";
}

static int cupti_fail(pp_err *err, CUptiResult rc, const char *what) {
    if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        return pp_fail(err, "CUPTI: %s: another profiler (Nsight Systems, nvprof, a CUPTI tool) is attached (%s)",
                       what, result_name(rc));
    if (rc == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
        return pp_fail(err, "CUPTI: %s: insufficient privileges (%s)", what, result_name(rc));
    return pp_fail(err, "CUPTI: %s failed: %s (%d)", what, result_name(rc), (int)rc);
}

struct gputrace {
    trace_ring *ring;
    int rank, attempt;
    pthread_mutex_t mu;   /* recs: CUPTI's buffer-completed callback runs on its threads */
    gpu_recs recs;
    uint64_t cupti_dropped; /* guarded by mu */
    uint64_t reported;      /* TRACE_GPU_DROPPED last written */
    /* seg_mu: the engine's threads (an overlapped pair runs two actions at
     * once, engine.c); ids are made and appended under it, so segs stay
     * sorted by ext_id */
    pthread_mutex_t seg_mu;
    gpu_seg *segs;
    size_t nsegs, cap_segs;
    uint64_t next_ext;
    int ran;          /* an op ran, so this process has a CUDA context to synchronise */
    /* engine thread only */
    int32_t next_span;
    int step;         /* the last step written: close labels what is left with it */
    _Atomic int off;  /* a CUPTI failure turned tracing off (on either thread) */
};

/* The calling thread's open segment. CUPTI pushes external ids per thread,
 * so each half of an overlapped pair tags its own launches, and which
 * segment a host record closes is the thread's own (one tracer per
 * process: these are its). */
static _Thread_local size_t my_seg; /* index into segs */
static _Thread_local int my_pushed; /* an external id is pushed on this thread */

/* CUPTI's callbacks take no user pointer: the one tracer of this process.
 * deliver_mu is held by buffer_completed while it uses the tracer, and by
 * close while it clears it: a CUPTI thread still inside the callback
 * (flush does not promise to wait for one that began before it) then
 * finishes before the tracer is freed. */
static _Atomic(gputrace *) the_tracer;
static pthread_mutex_t deliver_mu = PTHREAD_MUTEX_INITIALIZER;

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    /* External correlation records are made for API records: both API
     * kinds, since a kernel's correlationId is that of the runtime or the
     * driver call that launched it (cuBLAS and NCCL go through the driver). */
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};
#define NKINDS (sizeof kinds / sizeof *kinds)

static uint64_t CUPTIAPI timestamp_cb(void) { return pp_now_ns(); }

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES); /* CUPTI wants 8-byte alignment */
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size;
    pthread_mutex_lock(&deliver_mu);
    gputrace *g = atomic_load(&the_tracer);
    if (g && buffer) {
        pthread_mutex_lock(&g->mu);
        CUpti_Activity *rec = NULL;
        CUptiResult rc;
        while ((rc = api.next_record(buffer, valid, &rec)) == CUPTI_SUCCESS) gpu_recs_add(&g->recs, rec);
        /* anything but the normal end (CUPTI_ERROR_MAX_LIMIT_REACHED) means
         * the rest of the buffer is unreadable: count it as one loss */
        if (rc != CUPTI_ERROR_MAX_LIMIT_REACHED) g->recs.lost++;
        size_t dropped = 0;
        if (api.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) g->cupti_dropped += dropped;
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&deliver_mu);
    free(buffer);
}

static void disable_all(size_t n) {
    for (size_t i = 0; i < n; i++) api.disable(kinds[i]);
}

int gputrace_open(trace_ring *ring, int rank, int attempt, gputrace **out, pp_err *err) {
    *out = NULL;
    if (gputrace_available(err) != 0) return -1;
    gputrace *g = calloc(1, sizeof *g);
    if (!g) return pp_fail(err, "CUPTI: out of memory");
    gputrace *none = NULL;
    if (!atomic_compare_exchange_strong(&the_tracer, &none, g)) {
        free(g);
        return pp_fail(err, "CUPTI: a tracer is already open in this process");
    }
    g->ring = ring;
    g->rank = rank;
    g->attempt = attempt;
    pthread_mutex_init(&g->mu, NULL);
    pthread_mutex_init(&g->seg_mu, NULL);
    gpu_recs_init(&g->recs, MAX_RECORDS);
    /* The timestamp callback first: records of kinds enabled before it would
     * be on CUPTI's own clock (CLOCK_REALTIME), not the host spans'. */
    CUptiResult rc = api.register_timestamp(timestamp_cb);
    const char *what = "registering the timestamp callback";
    size_t enabled = 0;
    if (rc == CUPTI_SUCCESS) {
        rc = api.register_callbacks(buffer_requested, buffer_completed);
        what = "registering the buffer callbacks";
    }
    for (; rc == CUPTI_SUCCESS && enabled < NKINDS; enabled++) {
        rc = api.enable(kinds[enabled]);
        what = "enabling activity records";
        if (rc != CUPTI_SUCCESS) break;
    }
    if (rc != CUPTI_SUCCESS) {
        cupti_fail(err, rc, what);
        disable_all(enabled);
        pthread_mutex_lock(&deliver_mu);
        atomic_store(&the_tracer, NULL);
        pthread_mutex_unlock(&deliver_mu);
        gpu_recs_free(&g->recs);
        pthread_mutex_destroy(&g->seg_mu);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return -1;
    }
    *out = g;
    return 0;
}

static void pop_segment(void) {
    if (!my_pushed) return;
    uint64_t last;
    api.pop_ext(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
    my_pushed = 0;
}

static void turn_off(gputrace *g, const char *why) {
    fprintf(stderr, "pprun worker (rank %d): CUPTI tracing off from now on: %s; host spans are still recorded\n",
            g->rank, why);
    pop_segment(); /* this thread's; the other's, if any, stays pushed on a tracer that records nothing */
    disable_all(NKINDS);
    g->off = 1;
}

/* Starts a new segment on this thread: its own external id pushed, no host
 * op yet. */
static void push_segment(gputrace *g) {
    pthread_mutex_lock(&g->seg_mu);
    g->ran = 1;
    if (g->nsegs == g->cap_segs) {
        size_t n = g->cap_segs ? 2 * g->cap_segs : 256;
        gpu_seg *s = n <= MAX_SEGS_PER_STEP ? realloc(g->segs, n * sizeof *s) : NULL;
        if (!s) { /* launches from here on belong to no op */
            pthread_mutex_unlock(&g->seg_mu);
            return;
        }
        g->segs = s;
        g->cap_segs = n;
    }
    uint64_t id = ++g->next_ext;
    CUptiResult rc = api.push_ext(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
    if (rc == CUPTI_SUCCESS) {
        my_seg = g->nsegs;
        g->segs[g->nsegs++] = (gpu_seg){.ext_id = id};
        my_pushed = 1;
    }
    pthread_mutex_unlock(&g->seg_mu);
    if (rc != CUPTI_SUCCESS) {
        pp_err e;
        cupti_fail(&e, rc, "pushing an external correlation id");
        turn_off(g, e.msg);
    }
}

void gputrace_op_begin(gputrace *g) {
    if (!g || g->off) return;
    pop_segment();
    push_segment(g);
}

void gputrace_host_span(gputrace *g, const trace_event *host) {
    if (!g || g->off || !my_pushed || host->phase >= TRACE_LOSS) return; /* records, not spans */
    pthread_mutex_lock(&g->seg_mu);
    g->segs[my_seg].host = *host;
    g->segs[my_seg].closed = 1;
    pthread_mutex_unlock(&g->seg_mu);
    pop_segment();
    push_segment(g); /* the next host op of the action */
}

void gputrace_op_end(gputrace *g) {
    if (!g || g->off) return;
    pop_segment();
}

static int emit_ring(void *ctx, const trace_event *ev) { return trace_ring_write(ctx, ev); }

/* Everything delivered so far into the ring; segs are forgotten. */
static void write_records(gputrace *g, int step) {
    trace_event base = {.attempt = g->attempt, .rank = g->rank, .step = step};
    pthread_mutex_lock(&g->seg_mu);
    pthread_mutex_lock(&g->mu);
    gpu_recs_build(&g->recs, g->segs, g->nsegs, &base, &g->next_span, emit_ring, g->ring);
    uint64_t lost = g->recs.lost + g->cupti_dropped;
    pthread_mutex_unlock(&g->mu);
    g->nsegs = 0;
    pthread_mutex_unlock(&g->seg_mu);
    if (lost != g->reported) {
        uint64_t now = pp_now_ns();
        trace_event d = {.version = TRACE_EVENT_VERSION, .phase = TRACE_GPU_DROPPED, .source = TRACE_SRC_GPU,
                         .attempt = g->attempt, .rank = g->rank, .step = step, .microbatch = -1, .stage = -1,
                         .peer = -1, .start_ns = now, .end_ns = now, .bytes = lost};
        trace_ring_write(g->ring, &d);
        g->reported = lost;
    }
}

int gputrace_step_end(gputrace *g, int step, pp_err *err) {
    (void)err;
    if (!g || g->off) return 0;
    pop_segment();
    /* FlushAll does not wait for the device: synchronise first, so every
     * kernel of the step has its end time. */
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "cudaDeviceSynchronize: %s", cudaGetErrorString(ce));
        turn_off(g, why);
        return 0;
    }
    /* Forced: after the synchronisation every record is complete; a buffer
     * CUPTI still counts as open would otherwise wait for the next step,
     * whose segments no longer hold this step's ops. */
    CUptiResult rc = api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (rc != CUPTI_SUCCESS) {
        pp_err e;
        cupti_fail(&e, rc, "flushing activity records");
        turn_off(g, e.msg);
        return 0;
    }
    write_records(g, step);
    g->step = step;
    return 0;
}

/* Whatever ran after the last step end (the last checkpoint,
 * --save-weights, a step that failed half-way) is written too: its host
 * spans carry their own step, kernels outside any op the last step's. */
void gputrace_close(gputrace *g) {
    if (!g) return;
    pop_segment();
    /* Never the first CUDA call of a process that made none: that would
     * create a context just to exit. */
    if (!g->off && g->ran) cudaDeviceSynchronize();
    /* Flushed and disabled even when tracing was turned off, so that no
     * CUPTI thread is inside buffer_completed once the_tracer is cleared. */
    api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    disable_all(NKINDS);
    api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (!g->off) write_records(g, g->step);
    pthread_mutex_lock(&deliver_mu);
    atomic_store(&the_tracer, NULL);
    pthread_mutex_unlock(&deliver_mu);
    gpu_recs_free(&g->recs);
    pthread_mutex_destroy(&g->seg_mu);
    pthread_mutex_destroy(&g->mu);
    free(g->segs);
    free(g);
}
