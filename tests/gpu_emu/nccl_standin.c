/* nccl_standin.c: a stand-in libnccl.so.2 for the programs of
 * tests/gpu_emu/ (devcomm_check, gpu_enginecheck_devcomm, pprun_emu),
 * loaded by devcomm_nccl_lib.c through PPRUN_NCCL_LIB.  Only what devcomm
 * uses, with NCCL's point-to-point semantics between the two ranks of a
 * communicator:
 *
 *   ncclGetUniqueId        a listening unix socket (abstract name in the id)
 *                          in the calling process, like NCCL's bootstrap root
 *   ncclCommInitRankConfig non-blocking (ncclInProgress until the two ranks
 *                          met); the caller's current device is the rank's
 *                          (as in NCCL); two ranks with one PCI bus id fail
 *                          as NCCL 2.28 does ("Duplicate GPU detected")
 *   ncclSend / ncclRecv    transfers run as host functions on the caller's
 *                          stream (cudart_standin.c), so they block that
 *                          stream until matched, as NCCL kernels do; they
 *                          match in issue order, whatever the data (a FIFO
 *                          per communicator); a send completes only when
 *                          the receiver took it; a size mismatch is an
 *                          async error naming both sizes (a call on a
 *                          failed communicator returns its error, as
 *                          NCCL's ncclCommEnsureReady does)
 *   ncclCommAbort          ends the transfers in flight; local; frees the
 *                          communicator (no ncclCommDestroy after it)
 *   ncclGetVersion         the version of the nccl.h it was built with
 *
 * A peer that vanishes mid-transfer makes the transfer hang until abort (as
 * NCCL's P2P and SHM transports do), or, with PPRUN_NCCLSTUB_DEAD=error,
 * raises ncclRemoteError.  PPRUN_NCCLSTUB_RECV_DELAY_MS slows every receive
 * (so that a sender's transfers are in flight when its receiver dies);
 * PPRUN_NCCLSTUB_FAIL_RECV=N makes this process's N-th receive (from 1) an
 * ncclInternalError.  Two threads inside one communicator at once, or
 * inside any two of one process (NCCL's thread-safety rule for
 * communicators of one device), is recorded as an error too. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct ncclComm {
    int rank, fd;
    _Atomic int state; /* an ncclResult_t */
    _Atomic int aborted;
    _Atomic int refs;    /* the handle + transfers in flight */
    _Atomic int in_call; /* threads inside an API call on this comm */
    char name[NCCL_UNIQUE_ID_BYTES];
    char bus[64];
    char last[300];
    pthread_t init_th;
    int init_started;
};

typedef struct listener {
    struct listener *next;
    char name[100];
    int fd;
} listener;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static listener *listeners;
static unsigned long id_counter;
static _Thread_local char last_global[300];
static _Atomic int recvs_posted;

static void nap_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void set_error(struct ncclComm *c, ncclResult_t r, const char *msg) {
    int expect = ncclSuccess;
    snprintf(c->last, sizeof c->last, "%s", msg);
    if (!atomic_compare_exchange_strong(&c->state, &expect, r)) {
        expect = ncclInProgress;
        atomic_compare_exchange_strong(&c->state, &expect, r);
    }
}

static void unref(struct ncclComm *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        if (c->fd >= 0) close(c->fd);
        free(c);
    }
}

/* Threads inside a call of this library, all communicators: NCCL (2.27+,
 * "Thread Safety") does not allow calls to communicators of one device from
 * several threads at once, and every communicator of a devcomm_check rank
 * is on its one device.  Each call lingers 50 us inside, so that two
 * unserialised callers meet. */
static _Atomic int in_library;

static void enter(struct ncclComm *c) {
    if (atomic_fetch_add(&c->in_call, 1) != 0)
        set_error(c, ncclInvalidUsage, "stand-in: two threads called into one communicator at once");
    if (atomic_fetch_add(&in_library, 1) != 0)
        set_error(c, ncclInvalidUsage,
                  "stand-in: two threads called NCCL at once (communicators of one device: not thread-safe)");
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}
static void leave(struct ncclComm *c) {
    atomic_fetch_sub(&in_library, 1);
    atomic_fetch_sub(&c->in_call, 1);
}

static struct sockaddr_un addr_of(const char *name, socklen_t *len) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a.sun_path + 1, name, n); /* abstract: nothing left behind on a crash */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    return a;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    listener *l = calloc(1, sizeof *l);
    if (!l) return ncclSystemError;
    pthread_mutex_lock(&mu);
    snprintf(l->name, sizeof l->name, "pprun-ncclstub-%d-%lu-%ld", (int)getpid(), id_counter++, (long)time(NULL));
    pthread_mutex_unlock(&mu);
    socklen_t len;
    struct sockaddr_un a = addr_of(l->name, &len);
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&a, len) < 0 || listen(l->fd, 4) < 0) {
        if (l->fd >= 0) close(l->fd);
        free(l);
        return ncclSystemError;
    }
    pthread_mutex_lock(&mu);
    l->next = listeners;
    listeners = l;
    pthread_mutex_unlock(&mu);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s", l->name);
    return ncclSuccess;
}

static int full_io(struct ncclComm *c, void *buf, size_t n, int writing) {
    char *p = buf;
    while (n) {
        ssize_t k = writing ? send(c->fd, p, n, MSG_NOSIGNAL) : recv(c->fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *init_main(void *arg) {
    struct ncclComm *c = arg;
    if (c->rank == 0) {
        listener *l = NULL, **lp;
        pthread_mutex_lock(&mu);
        for (lp = &listeners; *lp && strcmp((*lp)->name, c->name); lp = &(*lp)->next) {
        }
        if ((l = *lp)) *lp = l->next;
        pthread_mutex_unlock(&mu);
        if (!l) {
            set_error(c, ncclInvalidUsage, "stand-in: rank 0 must be in the process that made the unique id");
            return NULL;
        }
        while (!atomic_load(&c->aborted) && c->fd < 0) {
            struct pollfd pf = {l->fd, POLLIN, 0};
            if (poll(&pf, 1, 50) > 0) c->fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        }
        close(l->fd);
        free(l);
    } else {
        socklen_t len;
        struct sockaddr_un a = addr_of(c->name, &len);
        while (!atomic_load(&c->aborted)) {
            int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&a, len) == 0) {
                c->fd = fd;
                break;
            }
            if (fd >= 0) close(fd);
            nap_ms(10);
        }
    }
    if (c->fd < 0) return NULL; /* aborted */
    char theirs[64];
    if (full_io(c, c->bus, sizeof c->bus, 1) < 0 || full_io(c, theirs, sizeof theirs, 0) < 0) {
        set_error(c, ncclSystemError, "stand-in: the peer left during init");
        return NULL;
    }
    if (!strcmp(theirs, c->bus)) {
        char m[200];
        snprintf(m, sizeof m, "Duplicate GPU detected : rank %d and rank %d both on CUDA device with bus id %s",
                 1 - c->rank, c->rank, c->bus);
        set_error(c, ncclInvalidUsage, m);
        return NULL;
    }
    int expect = ncclInProgress;
    atomic_compare_exchange_strong(&c->state, &expect, ncclSuccess);
    return NULL;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    if (nranks != 2 || rank < 0 || rank > 1 || !cfg || cfg->magic != 0xcafebeef) {
        snprintf(last_global, sizeof last_global, "stand-in: only 2-rank communicators with a config");
        return ncclInvalidArgument;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->fd = -1;
    atomic_store(&c->state, ncclInProgress);
    atomic_store(&c->refs, 1);
    snprintf(c->name, sizeof c->name, "%s", id.internal);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetPCIBusId(c->bus, sizeof c->bus, dev) != cudaSuccess)
        snprintf(c->bus, sizeof c->bus, "?");
    if (pthread_create(&c->init_th, NULL, init_main, c) != 0) {
        free(c);
        return ncclSystemError;
    }
    c->init_started = 1;
    enter(c);
    leave(c);
    *out = c;
    if (cfg->blocking != 0) { /* devcomm asks for non-blocking: anything else is a bug */
        set_error(c, ncclInvalidUsage, "stand-in: devcomm must create non-blocking communicators");
        return ncclInvalidUsage;
    }
    return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
    if (!c) return ncclInvalidArgument;
    enter(c);
    *st = (ncclResult_t)atomic_load(&c->state);
    leave(c);
    return ncclSuccess;
}

typedef struct xfer {
    struct ncclComm *c;
    void *buf;
    size_t n;
    int send;
} xfer;

/* The peer vanished mid-transfer. */
static void peer_lost(struct ncclComm *c) {
    if (atomic_load(&c->aborted)) return;
    const char *mode = getenv("PPRUN_NCCLSTUB_DEAD");
    if (mode && !strcmp(mode, "error")) {
        set_error(c, ncclRemoteError, "stand-in: the peer closed its connection mid-transfer");
        return;
    }
    while (!atomic_load(&c->aborted))
        nap_ms(5); /* as NCCL's P2P transport: hang until aborted */
}

static void CUDART_CB xfer_main(void *arg) {
    xfer *x = arg;
    struct ncclComm *c = x->c;
    uint64_t hdr = x->n;
    char ack = 1;
    if (atomic_load(&c->aborted) || atomic_load(&c->state) != ncclSuccess) goto out;
    if (x->send) {
        if (full_io(c, &hdr, sizeof hdr, 1) < 0 || full_io(c, x->buf, x->n, 1) < 0 || full_io(c, &ack, 1, 0) < 0)
            peer_lost(c);
    } else {
        const char *delay = getenv("PPRUN_NCCLSTUB_RECV_DELAY_MS");
        const char *fail = getenv("PPRUN_NCCLSTUB_FAIL_RECV");
        int nth = atomic_fetch_add(&recvs_posted, 1) + 1;
        if (fail && atoi(fail) == nth) {
            char m[100];
            snprintf(m, sizeof m, "stand-in: injected failure in receive %d", nth);
            set_error(c, ncclInternalError, m);
            goto out;
        }
        if (delay) {
            for (int i = 0; i < atoi(delay) / 10 && !atomic_load(&c->aborted); i++)
                nap_ms(10);
            if (atomic_load(&c->aborted)) goto out;
        }
        if (full_io(c, &hdr, sizeof hdr, 0) < 0) {
            peer_lost(c);
            goto out;
        }
        if (hdr != x->n) {
            char m[200];
            snprintf(m, sizeof m, "stand-in: ncclRecv of %zu bytes matched an ncclSend of %llu bytes", x->n,
                     (unsigned long long)hdr);
            set_error(c, ncclInvalidUsage, m);
            goto out;
        }
        if (full_io(c, x->buf, x->n, 0) < 0 || full_io(c, &ack, 1, 1) < 0) peer_lost(c);
    }
out:
    unref(c);
    free(x);
}

static _Atomic unsigned calls;

static ncclResult_t post(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s,
                         int send) {
    if (!c) return ncclInvalidArgument;
    enter(c);
    ncclResult_t r = ncclSuccess;
    if (type != ncclInt8 || peer != 1 - c->rank) {
        snprintf(c->last, sizeof c->last, "stand-in: bad datatype or peer");
        r = ncclInvalidArgument;
    } else if (atomic_load(&c->state) == ncclInProgress) {
        snprintf(c->last, sizeof c->last, "stand-in: communicator used before it was ready");
        r = ncclInvalidArgument;
    } else if (atomic_load(&c->state) != ncclSuccess) {
        r = (ncclResult_t)atomic_load(&c->state); /* its error, its message kept */
    } else {
        xfer *x = malloc(sizeof *x);
        if (!x) {
            r = ncclSystemError;
        } else {
            *x = (xfer){c, (void *)buf, count, send};
            atomic_fetch_add(&c->refs, 1);
            if (cudaLaunchHostFunc(s, xfer_main, x) != cudaSuccess) {
                atomic_fetch_sub(&c->refs, 1);
                free(x);
                r = ncclUnhandledCudaError;
            } else if (atomic_fetch_add(&calls, 1) % 2) {
                r = ncclInProgress; /* a non-blocking communicator may say so: devcomm must poll */
            }
        }
    }
    leave(c);
    return r;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
    return post(buf, count, type, peer, c, s, 1);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
    return post(buf, count, type, peer, c, s, 0);
}

static void end_comm(struct ncclComm *c) {
    atomic_store(&c->aborted, 1);
    if (c->init_started) pthread_join(c->init_th, NULL);
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
    unref(c);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    enter(c);
    leave(c);
    end_comm(c);
    return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c) {
    return c ? c->last : last_global;
}
