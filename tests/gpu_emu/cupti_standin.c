/* cupti_standin.c: a libcupti.so.<major> for pprun_emu (docs/gpu.md, "The
 * CUDA emulator"): the activity API that tracer/cuda/cupti.c calls, fed by
 * the emulator's launches (emu_observe in cuda_emu.h) instead of a driver,
 * so that CUPTI tracing runs end to end on the CPU: the timestamp callback,
 * buffers asked for and handed back through the client's callbacks (on a
 * thread of this library, as CUPTI does), external correlation ids pushed
 * per thread, forced flushes, record iteration, dropped records.
 *
 * Per observed launch, as CUPTI reports a kernel launched by a runtime
 * call: when it is launched, a RUNTIME record with a fresh correlation id
 * and an EXTERNAL_CORRELATION record tying that id to the launching
 * thread's innermost pushed id of each kind; when it has run (later, on
 * the stream's thread, when launches are queued: PPRUN_STUB_ASYNC_US), a
 * CONCURRENT_KERNEL record (CUpti_ActivityKernel10) timed by the client's
 * timestamp callback around the work; each only when its kind is enabled. Records are laid out as
 * cupti_activity.h declares them, 8-byte aligned; so a reader that gets the
 * layout wrong fails here as on a GPU only if it disagrees with the header
 * (what this cannot catch: CUPTI's own conventions beyond the header).
 *
 * Built into <build>/emu/ next to the cuBLAS stand-in, where the emulated
 * cupti.c looks first (tests/gpu_emu/CMakeLists.txt). */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*observer_fn)(const char *what, void *stream, int phase, unsigned *corr);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static pthread_cond_t delivered = PTHREAD_COND_INITIALIZER;
static CUpti_TimestampCallbackFunc timestamp;
static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static uint64_t enabled; /* bit per CUpti_ActivityKind */
static uint8_t *buffer;  /* the buffer being filled */
static size_t buffer_size, buffer_used;
static size_t dropped; /* records with no buffer to go to, since last asked */
static uint32_t next_correlation;
static unsigned deliveries_queued, deliveries_done;

/* Interned kernel names: CUPTI's stay valid for the process's life. */
static char **names;
static size_t nnames;

/* The calling thread's pushed external ids, per kind (a small stack). */
#define EXT_KINDS 8
#define EXT_DEPTH 16
static __thread uint64_t ext_stack[EXT_KINDS][EXT_DEPTH];
static __thread int ext_depth[EXT_KINDS];
/* The start of the work this thread is running: the emulator's launches
 * do not overlap (cuda_emu.cpp), but the cuBLAS stand-in's GEMMs of two
 * threads (an overlapped pair's two streams) do. */
static __thread uint64_t kernel_start;

static uint64_t now(void) {
    if (timestamp) return timestamp();
    struct timespec ts; /* CUPTI's own clock without a callback */
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int is_enabled(CUpti_ActivityKind k) { return (unsigned)k < 64 && (enabled >> k & 1); }

static size_t record_size(CUpti_ActivityKind k) {
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_RUNTIME: return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
    default: return 0;
    }
}
static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* A full or flushed buffer goes back to the client on a thread of ours,
 * as CUPTI's worker hands buffers back. */
typedef struct delivery {
    uint8_t *buf;
    size_t size, valid;
} delivery;

static void *deliver_main(void *arg) {
    delivery *d = arg;
    completed(NULL, 0, d->buf, d->size, d->valid);
    free(d);
    pthread_mutex_lock(&mu);
    deliveries_done++;
    pthread_cond_broadcast(&delivered);
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Hands the current buffer back (mu held). */
static void hand_back(void) {
    if (!buffer) return;
    delivery *d = malloc(sizeof *d);
    pthread_t th;
    if (!d) return; /* the buffer stays ours and keeps filling */
    *d = (delivery){buffer, buffer_size, buffer_used};
    if (pthread_create(&th, NULL, deliver_main, d) != 0) {
        free(d);
        return;
    }
    pthread_detach(th);
    deliveries_queued++;
    buffer = NULL, buffer_size = buffer_used = 0;
}

/* Room for one record of kind k (mu held), or NULL: counted as dropped. */
static void *room_for(CUpti_ActivityKind k) {
    size_t need = align8(record_size(k));
    if (buffer && buffer_used + need > buffer_size) hand_back();
    if (!buffer && requested) {
        size_t max_records = 0;
        requested(&buffer, &buffer_size, &max_records);
        buffer_used = 0;
        if (buffer && ((uintptr_t)buffer & 7)) buffer = NULL; /* CUPTI refuses unaligned buffers */
    }
    if (!buffer || buffer_used + need > buffer_size) {
        dropped++;
        return NULL;
    }
    void *r = buffer + buffer_used;
    memset(r, 0, need);
    buffer_used += need;
    return r;
}

static const char *intern(const char *what) {
    size_t len = strcspn(what, " "); /* "k_add (file:line)" -> "k_add" */
    for (size_t i = 0; i < nnames; i++)
        if (strlen(names[i]) == len && strncmp(names[i], what, len) == 0) return names[i];
    char **n = realloc(names, (nnames + 1) * sizeof *n);
    if (!n) return "(stand-in: out of memory)";
    names = n;
    names[nnames] = strndup(what, len);
    return names[nnames] ? names[nnames++] : "(stand-in: out of memory)";
}

static uint32_t stream_id(void *stream) { /* small and stable per stream */
    return (uint32_t)((uintptr_t)stream >> 4 & 0xffff) + 1;
}

/* The emulator's phases of one launch (cuda_emu.h: EMU_LAUNCH, EMU_BEGIN,
 * EMU_END; that header is C++). */
enum { LAUNCH, BEGIN, END };

static void observe(const char *what, void *stream, int phase, unsigned *corr) {
    pthread_mutex_lock(&mu);
    if (phase == LAUNCH) { /* on the launching thread: the runtime call and its pushed ids */
        *corr = ++next_correlation;
        CUpti_ActivityAPI *api =
            is_enabled(CUPTI_ACTIVITY_KIND_RUNTIME) ? room_for(CUPTI_ACTIVITY_KIND_RUNTIME) : NULL;
        if (api) {
            api->kind = CUPTI_ACTIVITY_KIND_RUNTIME;
            api->start = api->end = now();
            api->correlationId = *corr;
        }
        for (int k = 0; k < EXT_KINDS && is_enabled(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION); k++) {
            if (ext_depth[k] == 0) continue;
            CUpti_ActivityExternalCorrelation *x = room_for(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
            if (!x) continue;
            x->kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
            x->externalKind = (CUpti_ExternalCorrelationKind)k;
            x->externalId = ext_stack[k][ext_depth[k] - 1];
            x->correlationId = *corr;
        }
    } else if (phase == BEGIN) { /* on the thread that runs the work, as END */
        kernel_start = now();
    } else {
        uint64_t end = now();
        CUpti_ActivityKernel10 *kr =
            is_enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? room_for(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) : NULL;
        if (kr) {
            kr->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
            kr->start = kernel_start, kr->end = end, kr->completed = end;
            kr->correlationId = *corr;
            kr->streamId = stream_id(stream);
            kr->name = intern(what);
        }
    }
    pthread_mutex_unlock(&mu);
}

/* --- the API ------------------------------------------------------------------ */

CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_QUEUE_EMPTY: *str = "CUPTI_ERROR_QUEUE_EMPTY"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN (stand-in)"; break;
    }
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc fn) {
    pthread_mutex_lock(&mu);
    timestamp = fn;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                           CUpti_BuffersCallbackCompleteFunc comp) {
    if (!req || !comp) return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    requested = req, completed = comp;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
    if (kind != CUPTI_ACTIVITY_KIND_DRIVER && kind != CUPTI_ACTIVITY_KIND_MEMCPY && !record_size(kind))
        return CUPTI_ERROR_INVALID_KIND; /* DRIVER and MEMCPY: accepted, never produced here */
    /* The emulator, in the program that loaded us (pprun_emu exports it). */
    void (*set)(observer_fn) = (void (*)(observer_fn))dlsym(RTLD_DEFAULT, "emu_set_observer");
    if (!set) return CUPTI_ERROR_NOT_INITIALIZED; /* no emulator: nothing to observe */
    pthread_mutex_lock(&mu);
    enabled |= 1ull << kind;
    pthread_mutex_unlock(&mu);
    set(observe);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
    if ((unsigned)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
    pthread_mutex_lock(&mu);
    enabled &= ~(1ull << kind);
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

/* Hands back the buffer being filled (forced or not: records here are
 * complete when written) and returns once every buffer handed back so far
 * has been through the client's callback. */
CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    pthread_mutex_lock(&mu);
    if (buffer_used) hand_back();
    while (deliveries_done != deliveries_queued) pthread_cond_wait(&delivered, &mu);
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **record) {
    if (!buf || !record) return CUPTI_ERROR_INVALID_PARAMETER;
    size_t at = 0;
    if (*record) {
        size_t size = record_size((*record)->kind);
        if (!size) return CUPTI_ERROR_INVALID_KIND;
        at = (size_t)((uint8_t *)*record - buf) + align8(size);
    }
    if (at >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)(buf + at);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *n) {
    (void)ctx, (void)stream;
    pthread_mutex_lock(&mu);
    *n = dropped;
    dropped = 0;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
    if ((unsigned)kind >= EXT_KINDS) return CUPTI_ERROR_INVALID_PARAMETER;
    if (ext_depth[kind] == EXT_DEPTH) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    ext_stack[kind][ext_depth[kind]++] = id;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *last) {
    if ((unsigned)kind >= EXT_KINDS) return CUPTI_ERROR_INVALID_PARAMETER;
    if (ext_depth[kind] == 0) return CUPTI_ERROR_QUEUE_EMPTY;
    uint64_t id = ext_stack[kind][--ext_depth[kind]];
    if (last) *last = id;
    return CUPTI_SUCCESS;
}
