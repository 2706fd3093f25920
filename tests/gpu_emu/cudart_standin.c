/* cudart_standin.c: the CUDA runtime, played on the CPU (no GPU, no driver,
 * no cudart) for every program of tests/gpu_emu/: the emulated layers'
 * CUDA calls (gpu_device.c, gpu_stage.c, devcomm's transports, cupti.c),
 * the CUDA emulator's kernels (cuda_emu.h: they read and write this
 * memory directly) and the NCCL, cuBLAS and CUPTI stand-ins, which call
 * back into the program that loaded them (hence ENABLE_EXPORTS there).
 *
 *   device memory   a memfd mapped shared; an IPC memory handle names the
 *                   owner's pid and fd, and cudaIpcOpenMemHandle maps
 *                   /proc/PID/fd/FD, so a second process (another rank)
 *                   sees the same bytes.  Past each allocation's end the
 *                   mapping has a few bytes more, poisoned for
 *                   AddressSanitizer, so that the sanitizer build reports a
 *                   kernel's out-of-bounds access
 *   events          two counters (recorded, completed); interprocess events
 *                   keep them in a shared memfd page, handles as above
 *   streams         a worker thread each, running its ops in order: copies,
 *                   memsets, frees (cudaFreeAsync), event records and
 *                   waits, host functions (the NCCL stand-in's transfers
 *                   are host functions that block the stream until
 *                   matched, as NCCL kernels do).  A kernel launch waits
 *                   for its stream, then runs to completion on the
 *                   launching thread (cuda_emu.cpp), or, with
 *                   PPRUN_STUB_ASYNC_US set, is a host function queued on
 *                   it that runs late.  A copy into memory
 *                   exported with cudaIpcGetMemHandle reads its source
 *                   when its stream gets to it and lands STUB_LATE_MS (or
 *                   PPRUN_STUB_LATE_MS) after it was queued, as a GPU
 *                   may be busy: a receiver that reads an announced buffer
 *                   without waiting on its event then reads the old bytes
 *   errors          each call returns its own; cudaGetLastError returns
 *                   (once) the emulator's failed launch, and a stream
 *                   whose launch failed fails every synchronisation
 *                   with it from then on (a GPU's fault is sticky),
 *                   cudaDeviceSynchronize's and cudaFree's included
 *
 * Strict where the callers could go wrong: a copy's or memset's device side
 * must lie inside a device allocation (own or opened) and its host side
 * outside, a handle is exported from a base pointer only and of an
 * allocation whose size is a multiple of 2 MiB (CUDA may sub-allocate
 * smaller ones from a larger block, which the handle would then stand for),
 * a process cannot open its own handle (as in CUDA), the device must exist.
 * Stricter than CUDA: memory, events and streams belong to the device
 * current when they were made (cudaMallocAsync: the stream's), and a copy,
 * event record or wait on a stream must be made with the stream's device
 * current, on memory and events of that device; the legacy stream (0)
 * takes no work.  What is refused is also said on stderr.
 *
 * Devices: PPRUN_STUB_DEVICES of them (default 1).  The bus id of device 0
 * is cudart_standin_busid if set, else PPRUN_STUB_BUSID (the checks set one
 * per rank to put ranks on one GPU or on several); device d > 0 has that id
 * with "+d" appended.  The UUID (cudaGetDeviceProperties) follows the bus
 * id, or cudart_standin_uuid / PPRUN_STUB_UUID when set (two "MIG
 * instances" on one bus). */
#include "tests/gpu_emu/cudart_standin.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sanitizer/asan_interface.h> /* ASAN_(UN)POISON_MEMORY_REGION: nothing without ASan */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define STUB_MAGIC 0x70707275u /* "pprun" */

static _Atomic long allocs_made;
const char *cudart_standin_busid;
const char *cudart_standin_uuid;

long cudart_standin_allocs(void) { return allocs_made; }

typedef struct alloc {
    struct alloc *next;
    char *base;
    size_t size;   /* as asked (at least 1) */
    size_t mapped; /* the mapping's length: size and a poisoned tail */
    int fd;        /* -1 for an opened (foreign) mapping */
    int dev;       /* the device it is on (opened: the opener's) */
    int exported;  /* cudaIpcGetMemHandle'd: copies into it land late */
} alloc;

static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;

typedef struct stub_handle {
    uint32_t magic;
    int32_t pid, fd;
    uint64_t size, mapped;
} stub_handle;

static _Thread_local int cur_device; /* as CUDA: device 0 until a thread sets another */

#define IPC_GRAIN ((size_t)2 << 20)
#define STUB_LATE_MS 10
#define TAIL 64 /* poisoned bytes at least, past every allocation's end */

static cudaError_t refuse(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t refuse(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudart_standin (pid %d): ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return e;
}

static int device_count(void) {
    const char *s = getenv("PPRUN_STUB_DEVICES");
    int n = s ? atoi(s) : 1;
    return n > 0 ? n : 1;
}

/* ---- errors ------------------------------------------------------------------- */

/* The errors this runtime and the emulator return, as CUDA names them. */
static const struct {
    cudaError_t e;
    const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "the emulated launch failed (the reason is on stderr)"},
};

const char *cudaGetErrorName(cudaError_t e) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].e == e) return errors[i].name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].e == e) return errors[i].text;
    return "unknown error (stand-in)";
}

static _Atomic int launch_error = cudaSuccess;

static void stream_failed(cudaStream_t s);
void cudart_standin_launch_failed(struct CUstream_st *stream) {
    launch_error = cudaErrorLaunchFailure;
    if (stream) stream_failed(stream);
}

/* As CUDA's: returned once, then cleared. */
cudaError_t cudaGetLastError(void) { return (cudaError_t)atomic_exchange(&launch_error, cudaSuccess); }

/* ---- devices ------------------------------------------------------------------ */

/* A process's first context: with CUDA_MPS_PIPE_DIRECTORY set, CUDA's
 * driver connects to the MPS control daemon there, and runs without MPS
 * when none answers. Here: one line into the FIFO "control" of the
 * stand-in daemon (mps_control_standin.sh), which logs it. */
static void mps_connect(void) {
    static atomic_int done;
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (!pipe_dir || atomic_exchange(&done, 1)) return;
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/control", pipe_dir);
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES"), *log = getenv("CUDA_MPS_LOG_DIRECTORY");
    int n = snprintf(line, sizeof line, "client %d pipe=%s log=%s CUDA_VISIBLE_DEVICES=%s\n", (int)getpid(), pipe_dir,
                     log ? log : "(unset)", cvd ? cvd : "(unset)");
    if (n > 0 && n < (int)sizeof line && write(fd, line, (size_t)n) != n) refuse(cudaSuccess, "MPS: %s", strerror(errno));
    close(fd);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
    mps_connect();
    cur_device = device;
    return cudaSuccess;
}

/* The emulated device keeps nothing per process. */
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device) {
    if (device < 0 || device >= device_count() || len < 16) return cudaErrorInvalidDevice;
    const char *s = cudart_standin_busid ? cudart_standin_busid : getenv("PPRUN_STUB_BUSID");
    if (s && device == 0)
        snprintf(bus, (size_t)len, "%s", s);
    else if (s)
        snprintf(bus, (size_t)len, "%s+%d", s, device);
    else
        snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}

/* Only the UUID is filled: a hash of cudart_standin_uuid (else
 * PPRUN_STUB_UUID) and the device index when set, else of the bus id, so
 * that by default one bus id is one GPU and a check can put two "MIG
 * instances" on one bus. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    char bus[64], name[128];
    cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device);
    if (e != cudaSuccess) return e;
    const char *u = cudart_standin_uuid ? cudart_standin_uuid : getenv("PPRUN_STUB_UUID");
    if (u)
        snprintf(name, sizeof name, "%s/%d", u, device);
    else
        snprintf(name, sizeof name, "%s", bus);
    memset(prop, 0, sizeof *prop);
    for (int half = 0; half < 2; half++) {
        uint64_t h = 1469598103934665603ull ^ (uint64_t)half; /* FNV-1a */
        for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        memcpy(prop->uuid.bytes + 8 * half, &h, 8);
    }
    return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------- */

/* Maps a fresh memfd of len bytes, shared; its fd in *fd_out. */
static cudaError_t map_new(void **out, size_t len, int *fd_out) {
    int fd = memfd_create("pprun-stub-devmem", MFD_CLOEXEC);
    if (fd < 0) return cudaErrorMemoryAllocation;
    if (ftruncate(fd, (off_t)len) < 0) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    *out = p;
    *fd_out = fd;
    return cudaSuccess;
}

/* Records a mapping as device memory: [base, base+size) to use, the rest
 * of the mapping poisoned. */
static void add_alloc(char *base, size_t size, size_t mapped, int fd, int dev) {
    alloc *a = malloc(sizeof *a);
    if (!a) abort();
    *a = (alloc){NULL, base, size, mapped, fd, dev, 0};
    ASAN_POISON_MEMORY_REGION(base + size, mapped - size);
    pthread_mutex_lock(&allocs_mu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&allocs_mu);
}

/* Takes the record of the allocation starting at base out of the list:
 * one made here (own = 1) or an opened IPC handle (own = 0); NULL if there
 * is none. */
static alloc *take_alloc(const void *base, int own) {
    pthread_mutex_lock(&allocs_mu);
    alloc **ap = &allocs;
    while (*ap && ((*ap)->base != base || ((*ap)->fd >= 0) != own))
        ap = &(*ap)->next;
    alloc *a = *ap;
    if (a) *ap = a->next;
    pthread_mutex_unlock(&allocs_mu);
    return a;
}

/* Unmaps an allocation whose record was taken. */
static void drop_alloc(alloc *a) {
    ASAN_UNPOISON_MEMORY_REGION(a->base, a->mapped); /* the addresses may be mapped again */
    munmap(a->base, a->mapped);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

/* The device of the allocation holding [p, p+n), or -1 if none does. */
static int device_of(const void *p, size_t n) {
    const char *c = p;
    int dev = -1;
    pthread_mutex_lock(&allocs_mu);
    for (alloc *a = allocs; a && dev < 0; a = a->next)
        if (c >= a->base && c + n <= a->base + a->size) dev = a->dev;
    pthread_mutex_unlock(&allocs_mu);
    return dev;
}

static int in_device_memory(const void *p, size_t n) {
    return device_of(p, n) >= 0;
}

/* 1 if [p, p+n) lies in an allocation of this process that was exported. */
static int in_exported_memory(const void *p, size_t n) {
    const char *c = p;
    int yes = 0;
    pthread_mutex_lock(&allocs_mu);
    for (alloc *a = allocs; a && !yes; a = a->next)
        yes = c >= a->base && c + n <= a->base + a->size && a->exported;
    pthread_mutex_unlock(&allocs_mu);
    return yes;
}

static cudaError_t alloc_on(void **p, size_t size, int dev) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), mapped = (size + TAIL + page - 1) / page * page;
    int fd;
    cudaError_t e = map_new(p, mapped, &fd);
    if (e != cudaSuccess) return e;
    add_alloc(*p, size ? size : 1, mapped, fd, dev);
    allocs_made++;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
    return alloc_on(p, size, cur_device);
}

static cudaError_t sync_streams_of(int dev);

/* As CUDA's, it first waits for the device's work: a launch queued before
 * it (PPRUN_STUB_ASYNC_US) may still use the memory. Like any CUDA call,
 * not from a stream's own work (a host function). A stream of the device
 * whose launch failed makes it return that sticky error, as CUDA's does;
 * the memory goes all the same (on a GPU the faulted context can use it
 * no more), so a teardown that goes on frees the rest. */
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    alloc *a = take_alloc(p, 1);
    if (!a) return refuse(cudaErrorInvalidValue, "cudaFree of %p: not the base of a cudaMalloc", p);
    cudaError_t e = sync_streams_of(a->dev);
    drop_alloc(a);
    return e;
}

/* Device memory: the device it is on; anything else is unregistered host
 * memory (as CUDA 11 and later say). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
    int dev = device_of(p, 1);
    memset(attr, 0, sizeof *attr);
    attr->type = dev >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    attr->device = dev >= 0 ? dev : 0;
    attr->devicePointer = dev >= 0 ? (void *)p : NULL;
    return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    alloc *a = NULL;
    pthread_mutex_lock(&allocs_mu);
    for (alloc *x = allocs; x; x = x->next)
        if (x->base == p && x->fd >= 0) a = x;
    pthread_mutex_unlock(&allocs_mu);
    if (!a) return refuse(cudaErrorInvalidValue, "cudaIpcGetMemHandle of %p: not the base of a cudaMalloc", p);
    if (a->size % IPC_GRAIN)
        return refuse(cudaErrorInvalidValue,
                      "cudaIpcGetMemHandle of a %zu-byte allocation: not a multiple of 2 MiB (CUDA may have "
                      "sub-allocated it from a larger block, which the handle would stand for)",
                      a->size);
    stub_handle sh = {STUB_MAGIC, (int32_t)getpid(), a->fd, a->size, a->mapped};
    memset(h, 0, sizeof *h);
    memcpy(h, &sh, sizeof sh);
    pthread_mutex_lock(&allocs_mu);
    a->exported = 1;
    pthread_mutex_unlock(&allocs_mu);
    return cudaSuccess;
}

static int open_foreign(const stub_handle *sh) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", sh->pid, sh->fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags) {
    (void)flags;
    stub_handle sh;
    memcpy(&sh, &h, sizeof sh);
    if (sh.magic != STUB_MAGIC) return cudaErrorInvalidResourceHandle;
    if (sh.pid == getpid()) return cudaErrorInvalidResourceHandle; /* as CUDA: not in the exporting process */
    int fd = open_foreign(&sh);
    if (fd < 0) return cudaErrorMapBufferObjectFailed;
    void *m = mmap(NULL, sh.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
    add_alloc(m, sh.size, sh.mapped, -1, cur_device);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p) {
    alloc *a = take_alloc(p, 0);
    if (!a) return cudaErrorInvalidValue;
    drop_alloc(a);
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------- */

typedef struct ev_state {
    _Atomic uint64_t recorded, completed;
} ev_state;

struct CUevent_st {
    ev_state *st;
    int fd;     /* interprocess events created here: the memfd; else -1 */
    int mapped; /* st is a shared mapping */
    int dev;    /* made (or opened) with this device current */
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return cudaErrorMemoryAllocation;
    e->fd = -1;
    e->dev = cur_device;
    if (flags & cudaEventInterprocess) {
        if (!(flags & cudaEventDisableTiming)) {
            free(e);
            return cudaErrorInvalidValue; /* as CUDA: interprocess events must not time */
        }
        void *p;
        cudaError_t r = map_new(&p, sizeof(ev_state), &e->fd);
        if (r != cudaSuccess) {
            free(e);
            return r;
        }
        e->st = p;
        e->mapped = 1;
    } else if (!(e->st = calloc(1, sizeof *e->st))) {
        free(e);
        return cudaErrorMemoryAllocation;
    }
    *ev = e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    if (e->mapped)
        munmap(e->st, sizeof(ev_state));
    else
        free(e->st);
    if (e->fd >= 0) close(e->fd);
    free(e);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e) {
    if (!e || e->fd < 0) return cudaErrorInvalidResourceHandle;
    stub_handle sh = {STUB_MAGIC, (int32_t)getpid(), e->fd, sizeof(ev_state), sizeof(ev_state)};
    memset(h, 0, sizeof *h);
    memcpy(h, &sh, sizeof sh);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *ev, cudaIpcEventHandle_t h) {
    stub_handle sh;
    memcpy(&sh, &h, sizeof sh);
    if (sh.magic != STUB_MAGIC || sh.pid == getpid()) return cudaErrorInvalidResourceHandle;
    int fd = open_foreign(&sh);
    if (fd < 0) return cudaErrorMapBufferObjectFailed;
    void *m = mmap(NULL, sizeof(ev_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return cudaErrorMemoryAllocation;
    e->st = m;
    e->fd = -1;
    e->mapped = 1;
    e->dev = cur_device;
    *ev = e;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    return atomic_load(&e->st->completed) >= atomic_load(&e->st->recorded) ? cudaSuccess : cudaErrorNotReady;
}

/* ---- streams ------------------------------------------------------------------ */

enum { OP_COPY, OP_SET, OP_FREE, OP_RECORD, OP_WAIT, OP_HOST };

typedef struct op {
    struct op *next;
    int kind;
    void *dst;
    const void *src;
    size_t n;
    ev_state *ev;
    uint64_t target;
    cudaHostFn_t fn;
    void *arg;
    alloc *freed; /* OP_FREE: its record, already out of the list */
    struct timespec not_before; /* OP_COPY into exported memory: lands then (CLOCK_MONOTONIC) */
} op;

struct CUstream_st {
    struct CUstream_st *next; /* in streams, for cudaDeviceSynchronize */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work queued, work done, stop */
    op *head, *tail;
    int running, stop;
    cudaError_t failed; /* a launch on it failed: what every synchronisation returns from then on */
    int dev; /* made with this device current */
    pthread_t th;
};

/* streams_mu guards the list; syncers counts the threads that synchronise
 * with a snapshot of it (sync_streams_of: the lock is not held while they
 * wait), and a stream is not freed while any does (synced_cv). */
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t synced_cv = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *streams;
static int syncers;

static void stream_failed(cudaStream_t s) {
    pthread_mutex_lock(&s->mu);
    s->failed = cudaErrorLaunchFailure;
    pthread_mutex_unlock(&s->mu);
}

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        s->running = 1;
        pthread_mutex_unlock(&s->mu);
        switch (o->kind) {
        case OP_COPY: {
            /* a late copy reads its source now, in stream order, and lands
             * later: the wait must not let the source's later writes in */
            void *read = o->not_before.tv_sec ? malloc(o->n ? o->n : 1) : NULL;
            if (read) {
                memcpy(read, o->src, o->n);
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &o->not_before, NULL) == EINTR) {
                }
            }
            memcpy(o->dst, read ? read : o->src, o->n);
            free(read);
            break;
        }
        case OP_SET:
            memset(o->dst, (int)o->target, o->n);
            break;
        case OP_FREE:
            drop_alloc(o->freed);
            break;
        case OP_RECORD: {
            uint64_t c = atomic_load(&o->ev->completed);
            while (c < o->target && !atomic_compare_exchange_weak(&o->ev->completed, &c, o->target)) {
            }
            break;
        }
        case OP_WAIT:
            while (atomic_load(&o->ev->completed) < o->target) {
                struct timespec ts = {0, 20000};
                nanosleep(&ts, NULL);
            }
            break;
        case OP_HOST:
            o->fn(o->arg);
            break;
        }
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->running = 0;
        free(o);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    (void)flags;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    s->dev = cur_device;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&streams_mu);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&streams_mu);
    *out = s;
    return cudaSuccess;
}

static cudaError_t enqueue(cudaStream_t s, op o) {
    if (!s) return cudaErrorInvalidResourceHandle; /* the legacy stream takes no work here */
    op *n = malloc(sizeof *n);
    if (!n) return cudaErrorMemoryAllocation;
    *n = o;
    n->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = n;
    else
        s->head = n;
    s->tail = n;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&s->mu);
    while (s->head)
        pthread_cond_wait(&s->cv, &s->mu);
    cudaError_t e = s->failed;
    pthread_mutex_unlock(&s->mu);
    return e;
}

/* Waits for every stream of device dev made so far, without holding
 * streams_mu while it waits (another thread may make or destroy a stream
 * meanwhile, as with CUDA); the first stream's error, or cudaSuccess. */
static cudaError_t sync_streams_of(int dev) {
    cudaError_t first = cudaSuccess;
    pthread_mutex_lock(&streams_mu);
    size_t n = 0;
    for (struct CUstream_st *s = streams; s; s = s->next) n += s->dev == dev;
    struct CUstream_st **snap = n ? malloc(n * sizeof *snap) : NULL;
    if (n && !snap) {
        pthread_mutex_unlock(&streams_mu);
        return cudaErrorMemoryAllocation;
    }
    n = 0;
    for (struct CUstream_st *s = streams; s; s = s->next)
        if (s->dev == dev) snap[n++] = s;
    syncers++;
    pthread_mutex_unlock(&streams_mu);
    for (size_t i = 0; i < n; i++) {
        cudaError_t e = cudaStreamSynchronize(snap[i]);
        if (first == cudaSuccess) first = e;
    }
    free(snap);
    pthread_mutex_lock(&streams_mu);
    syncers--;
    pthread_cond_broadcast(&synced_cv);
    pthread_mutex_unlock(&streams_mu);
    return first;
}

/* Waits for every stream of the current device. */
cudaError_t cudaDeviceSynchronize(void) { return sync_streams_of(cur_device); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    cudaStreamSynchronize(s);
    pthread_mutex_lock(&streams_mu);
    struct CUstream_st **sp = &streams;
    while (*sp && *sp != s)
        sp = &(*sp)->next;
    if (*sp) *sp = s->next;
    while (syncers) /* one may hold s in its snapshot */
        pthread_cond_wait(&synced_cv, &streams_mu);
    pthread_mutex_unlock(&streams_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return cudaSuccess;
}

/* The calling thread must have the stream's device current. */
static cudaError_t on_stream_device(cudaStream_t s, const char *what) {
    if (s && s->dev != cur_device)
        return refuse(cudaErrorInvalidDevice, "%s on a stream of device %d, called with device %d current", what,
                      s->dev, cur_device);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    return alloc_on(p, size, s->dev); /* ready at once, so ready for every later op of s */
}

/* Stream-ordered: the memory goes once the work queued before on s is
 * done; work queued after may not use it (it is no device memory then). */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    if (!p) return cudaSuccess;
    alloc *a = take_alloc(p, 1);
    if (!a) return refuse(cudaErrorInvalidValue, "cudaFreeAsync of %p: not the base of a cudaMalloc", p);
    return enqueue(s, (op){.kind = OP_FREE, .freed = a});
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    int ok = kind == cudaMemcpyHostToDevice   ? in_device_memory(dst, n) && !in_device_memory(src, n)
             : kind == cudaMemcpyDeviceToHost ? in_device_memory(src, n) && !in_device_memory(dst, n)
             : kind == cudaMemcpyDeviceToDevice && in_device_memory(dst, n) && in_device_memory(src, n);
    if (!ok) return refuse(cudaErrorInvalidValue, "cudaMemcpyAsync of %zu bytes: a side is not the memory kind %d says", n, (int)kind);
    cudaError_t e = on_stream_device(s, "cudaMemcpyAsync");
    if (e != cudaSuccess) return e;
    if (kind != cudaMemcpyDeviceToDevice) return enqueue(s, (op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
    int dd = device_of(dst, n), sd = device_of(src, n);
    if (s && (dd != s->dev || sd != s->dev))
        return refuse(cudaErrorInvalidDevice, "cudaMemcpyAsync from device %d memory to device %d memory on a stream of "
                      "device %d", sd, dd, s->dev);
    op o = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
    if (in_exported_memory(dst, n)) {
        const char *late = getenv("PPRUN_STUB_LATE_MS");
        long ms = late && atol(late) > 0 ? atol(late) : STUB_LATE_MS;
        clock_gettime(CLOCK_MONOTONIC, &o.not_before);
        o.not_before.tv_sec += ms / 1000;
        o.not_before.tv_nsec += ms % 1000 * 1000000L;
        o.not_before.tv_sec += o.not_before.tv_nsec / 1000000000L;
        o.not_before.tv_nsec %= 1000000000L;
    }
    return enqueue(s, o);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    if (!in_device_memory(p, n)) return refuse(cudaErrorInvalidValue, "cudaMemsetAsync of %zu bytes outside device memory", n);
    cudaError_t e = on_stream_device(s, "cudaMemsetAsync");
    if (e != cudaSuccess) return e;
    return enqueue(s, (op){.kind = OP_SET, .dst = p, .n = n, .target = (uint64_t)(unsigned char)value});
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    cudaError_t r = on_stream_device(s, "cudaEventRecord");
    if (r != cudaSuccess) return r;
    if (s && e->dev != s->dev)
        return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord of a device %d event on a stream of device %d",
                      e->dev, s->dev);
    uint64_t target = atomic_fetch_add(&e->st->recorded, 1) + 1;
    return enqueue(s, (op){.kind = OP_RECORD, .ev = e->st, .target = target});
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    cudaError_t r = on_stream_device(s, "cudaStreamWaitEvent");
    if (r != cudaSuccess) return r;
    return enqueue(s, (op){.kind = OP_WAIT, .ev = e->st, .target = atomic_load(&e->st->recorded)});
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
    return enqueue(s, (op){.kind = OP_HOST, .fn = fn, .arg = arg});
}

/* ---- for devcomm_check's own buffers ----------------------------------------------- */

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    int ok = kind == cudaMemcpyHostToDevice   ? in_device_memory(dst, n)
             : kind == cudaMemcpyDeviceToHost ? in_device_memory(src, n)
                                              : in_device_memory(dst, n) && in_device_memory(src, n);
    if (!ok) return cudaErrorInvalidValue;
    memcpy(dst, src, n);
    return cudaSuccess;
}
