/* devcomm_nccl.c: devcomm between ranks on different GPUs, over NCCL.
 *
 * NCCL matches the sends and receives of two ranks in issue order, not by
 * tag, while devcomm_recv takes messages in any tag order.  So each
 * DIRECTED pair that talks gets a 2-rank communicator of its own (sender
 * NCCL rank 0, receiver rank 1; unique id made by the sender and published
 * through the exchange), and the order is carried by the host comm:
 *
 *   sender   devcomm_send copies the data into a pool buffer, sends the
 *            announcement {tag, len} under the pair's next sequence number
 *            (COMM_DIR_DEVANN) and queues the buffer; the pair's out-proxy
 *            thread posts ncclSend in sequence order on the pair's stream.
 *   receiver the pair's in-proxy thread takes announcements in sequence
 *            order and posts ncclRecv into pool buffers in that same order,
 *            filing (tag, buffer) in the pair's inbox; devcomm_recv waits
 *            there for its tag, copies into the caller's buffer and
 *            acknowledges (COMM_DIR_DEVACK, in order) over the host comm.
 *
 * devcomm_flush waits for the acknowledgements, not for ncclSend to
 * complete: a completed send may still sit in NCCL's buffers (the network
 * proxy's, or the sender's own with P2P read), which a sender that exits
 * right after would take with it.
 *
 * A pending send never blocks a receive (separate communicators and streams
 * per direction), and no send waits for its receiver (pools grow).
 * Completions come back through cudaLaunchHostFunc on the pair's stream.
 *
 * Threads: each communicator is driven by its proxy (init, ncclSend /
 * ncclRecv, ncclCommGetAsyncError, abort, finalize).  The devcomm caller's
 * thread makes unique ids, copies in and out on its own stream, waits on
 * the pair's condition variable, and asks ncclCommGetAsyncError before it
 * trusts a landed message (a transfer NCCL failed also "completes" on the
 * stream); every call into a communicator holds the pair's nccl_mu, so
 * NCCL sees one thread at a time.  CUDA's callback thread only marks
 * completions under the pair's mutex.
 *
 * Failure: a proxy polls ncclCommGetAsyncError while work is in flight and
 * watches the peer through the host comm; on an NCCL error, a dead peer, a
 * receive or flush that timed out (the waiter asks, the proxy aborts) or
 * close with work in flight, the proxy calls ncclCommAbort and the pair
 * fails with a message naming the peer and the NCCL error. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runner/comm/devcomm_int.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define NC_MIN_CAP ((size_t)64 << 10)
#define NC_SLICE_MS 100       /* proxies re-check abort, errors and the peer this often */
#define NC_GRACE_NS 2000000000ull  /* a dead peer's transfers in flight may still land */

/* ---- the library, loaded on first use -------------------------------------- */

typedef struct nccl_api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
} nccl_api;

static nccl_api nc;
static char nc_error[512];
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void *nc_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !nc_error[0]) snprintf(nc_error, sizeof nc_error, "NCCL library has no symbol %s", name);
    return p;
}

/* PPRUN_NCCL_LIB names the library to load (another NCCL build, or the CPU
 * check's stand-in); otherwise the soname, then the toolkit's copy. */
static void nc_load(void) {
    const char *env = getenv("PPRUN_NCCL_LIB");
    const char *paths[] = {"libnccl.so." STR(NCCL_MAJOR),
#ifdef PPRUN_CUDA_LIBDIR
                           PPRUN_CUDA_LIBDIR "/libnccl.so." STR(NCCL_MAJOR),
#endif
    };
    void *lib = NULL;
    if (env && env[0]) {
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_error, sizeof nc_error, "cannot load PPRUN_NCCL_LIB=%.200s: %.250s", env, dlerror());
    } else {
        for (size_t i = 0; i < sizeof paths / sizeof *paths && !lib; i++) lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_error, sizeof nc_error, "cannot load %s: %.300s", paths[0], dlerror());
    }
    if (!lib) return;
    nccl_api t;
    /* POSIX: converting dlsym's void * to a function pointer is allowed */
    *(void **)&t.get_unique_id = nc_sym(lib, "ncclGetUniqueId");
    *(void **)&t.init_rank_config = nc_sym(lib, "ncclCommInitRankConfig");
    *(void **)&t.get_async_error = nc_sym(lib, "ncclCommGetAsyncError");
    *(void **)&t.send = nc_sym(lib, "ncclSend");
    *(void **)&t.recv = nc_sym(lib, "ncclRecv");
    *(void **)&t.abort = nc_sym(lib, "ncclCommAbort");
    *(void **)&t.finalize = nc_sym(lib, "ncclCommFinalize");
    *(void **)&t.destroy = nc_sym(lib, "ncclCommDestroy");
    *(void **)&t.error_string = nc_sym(lib, "ncclGetErrorString");
    *(void **)&t.last_error = nc_sym(lib, "ncclGetLastError");
    if (nc_error[0]) return;  /* the library stays loaded: nothing else to unload it for */
    nc = t;
}

int dc_nccl_library(pp_err *err) {
    pthread_once(&nc_once, nc_load);
    if (nc_error[0]) return pp_fail(err, "devcomm (nccl): %s", nc_error);
    return 0;
}

/* ---- state ---------------------------------------------------------------------- */

enum { NE_POSTED = 1, NE_READY = 2, NE_BAD = 3 };  /* BAD: landed or not, NCCL failed under it */

typedef struct nbuf {        /* a pool buffer of one pair */
    void *dev;
    size_t cap;
    int busy;
} nbuf;

typedef struct nitem {       /* sender: announced, waiting for its ncclSend */
    struct nitem *next;
    int buf;
    void *dev;               /* bufs[buf].dev: bufs may move while the proxy reads */
    size_t len;
} nitem;

typedef struct nentry {      /* receiver: announced message, posted or landed */
    struct nentry *next;
    uint64_t seq, tag;
    size_t len;
    int buf;                 /* -1 for an empty message */
    void *dev;               /* bufs[buf].dev */
    int state;               /* NE_*; under mu */
} nentry;

typedef struct npair {       /* one direction between this rank and peer */
    struct dc_nccl *t;
    int peer, out;           /* out: this rank sends (NCCL rank 0) */
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* proxy work, completions, failure, stop */
    pthread_mutex_t nccl_mu; /* held around every call into comm (pc_*): one thread at a time */
    pthread_t proxy;
    int started, stop, abort_req;
    int failed;              /* unusable from now on; why says why */
    int ended;               /* receiver: the peer is gone, nothing more will be announced */
    char why[640];
    nbuf *bufs;
    int n_bufs;
    uint64_t seq;            /* next announcement (sent or expected) */
    uint64_t acks;           /* acknowledgements taken (sender) or sent (receiver); caller's thread */
    int in_flight;           /* transfers handed to NCCL and not completed */
    ncclComm_t comm;         /* set and cleared by the proxy, under nccl_mu */
    cudaStream_t stream;     /* the proxy's: NCCL work of this pair */
    ncclUniqueId id;         /* sender: made at the first send */
    nitem *q_head, *q_tail;  /* sender */
    nentry *inbox;           /* receiver, in announcement order */
} npair;

struct dc_nccl {
    const devcomm_config *cfg;
    cudaStream_t stream;     /* the caller's copies in and out */
    npair **outs, **ins;     /* [world], NULL until the pair talks */
};

typedef struct nc_done {     /* argument of a host-function completion */
    npair *p;
    int buf;
    uint64_t seq;
} nc_done;

static uint64_t ms_deadline(int timeout_ms) {
    return timeout_ms < 0 ? UINT64_MAX : pp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static void cv_wait_until(npair *p, uint64_t deadline) {
    if (deadline == UINT64_MAX) {
        pthread_cond_wait(&p->cv, &p->mu);
        return;
    }
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

/* Marks the pair failed (first reason wins) and wakes everyone; mu held. */
static void fail_locked(npair *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_locked(npair *p, const char *fmt, ...) {
    if (!p->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->why, sizeof p->why, fmt, ap);
        va_end(ap);
        p->failed = 1;
    }
    pthread_cond_broadcast(&p->cv);
}

static const char *dir_str(const npair *p) { return p->out ? "to" : "from"; }

/* ---- proxies --------------------------------------------------------------------- */

static void CUDART_CB send_done(void *arg) {
    nc_done *d = arg;
    npair *p = d->p;
    pthread_mutex_lock(&p->mu);
    p->bufs[d->buf].busy = 0;
    p->in_flight--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    free(d);
}

static void CUDART_CB recv_done(void *arg) {
    nc_done *d = arg;
    npair *p = d->p;
    pthread_mutex_lock(&p->mu);
    for (nentry *e = p->inbox; e; e = e->next)
        if (e->seq == d->seq && e->state == NE_POSTED) e->state = NE_READY;
    p->in_flight--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    free(d);
}

/* ---- calls into a pair's communicator, under nccl_mu ---------------------------- */

/* *st = the communicator's state; ncclSuccess when it is gone (aborted:
 * the pair's failure says why). */
static ncclResult_t pc_async(npair *p, ncclResult_t *st) {
    pthread_mutex_lock(&p->nccl_mu);
    ncclResult_t r = ncclSuccess;
    *st = ncclSuccess;
    if (p->comm) r = nc.get_async_error(p->comm, st);
    pthread_mutex_unlock(&p->nccl_mu);
    return r;
}

static void pc_abort(npair *p) {
    pthread_mutex_lock(&p->nccl_mu);
    if (p->comm) nc.abort(p->comm);
    p->comm = NULL;
    pthread_mutex_unlock(&p->nccl_mu);
}

static ncclResult_t pc_xfer(npair *p, void *dev, size_t len) {
    pthread_mutex_lock(&p->nccl_mu);
    ncclResult_t r = !p->comm ? ncclInvalidUsage
                     : p->out ? nc.send(dev, len, ncclInt8, 1, p->comm, p->stream)
                              : nc.recv(dev, len, ncclInt8, 0, p->comm, p->stream);
    pthread_mutex_unlock(&p->nccl_mu);
    return r;
}

/* NCCL's error text: the code's string, the library's last message if any,
 * and whether the host comm knows the peer is gone (often the cause). */
static void nc_errstr(npair *p, ncclResult_t r, char *buf, size_t cap) {
    char last[240] = "";
    pthread_mutex_lock(&p->nccl_mu);
    const char *l = nc.last_error ? nc.last_error(p->comm) : NULL;
    if (l) snprintf(last, sizeof last, "%s", l);
    pthread_mutex_unlock(&p->nccl_mu);
    char why[300] = "";
    int gone = dc_peer_gone(p->t->cfg, p->peer, why, sizeof why);
    int n = snprintf(buf, cap, "%s%s%s", nc.error_string(r), last[0] ? ": " : "", last);
    if (gone && n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "; rank %d %.150s", p->peer, why);
}

/* Every message not yet taken is suspect once NCCL failed; mu held. */
static void spoil_locked(npair *p) {
    for (nentry *e = p->inbox; e; e = e->next) e->state = NE_BAD;
}

/* The proxy's failure path: abort the communicator (it may be stuck in a
 * transfer or an init), then fail the pair.  nccl_error: NCCL itself
 * failed, so what landed is suspect too; otherwise (peer gone, timeout,
 * close) messages that landed stay receivable. */
static void proxy_fail(npair *p, int nccl_error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void proxy_fail(npair *p, int nccl_error, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pc_abort(p);
    pthread_mutex_lock(&p->mu);
    if (nccl_error) spoil_locked(p);
    fail_locked(p, "devcomm (nccl): rank %d, messages %s rank %d: %s", p->t->cfg->rank, dir_str(p), p->peer, msg);
    pthread_mutex_unlock(&p->mu);
}

/* Polls the communicator until it leaves ncclInProgress (after a
 * non-blocking call).  Gives up, aborting, on an NCCL error, stop or an
 * abort request, the peer gone, or the deadline.  Proxy thread only. */
static int wait_nccl(npair *p, const char *what, uint64_t deadline, uint64_t max_nap_ns) {
    uint64_t next_check = pp_now_ns() + NC_SLICE_MS * 1000000ull;
    uint64_t nap = 10000;  /* 10 us, doubling to max_nap_ns */
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = pc_async(p, &st);
        if (r == ncclSuccess && st == ncclSuccess) return 0;
        if (r != ncclSuccess || st != ncclInProgress) {
            char es[400];
            nc_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
            proxy_fail(p, 1, "%s failed: NCCL error: %s", what, es);
            return -1;
        }
        uint64_t now = pp_now_ns();
        pthread_mutex_lock(&p->mu);
        int stop = p->stop, ab = p->abort_req;
        pthread_mutex_unlock(&p->mu);
        if (stop || ab) {
            proxy_fail(p, 0, "%s aborted (%s)", what, stop ? "devcomm closed" : "a waiter gave up");
            return -1;
        }
        if (now >= deadline) {
            proxy_fail(p, 0, "%s did not complete within %d ms", what, p->t->cfg->connect_timeout_ms);
            return -1;
        }
        if (now >= next_check) {
            char why[300];
            if (dc_peer_gone(p->t->cfg, p->peer, why, sizeof why)) {
                proxy_fail(p, 0, "%s abandoned: rank %d %s", what, p->peer, why);
                return -1;
            }
            next_check = now + NC_SLICE_MS * 1000000ull;
        }
        pp_sleep_ns(nap);
        if (nap < max_nap_ns) nap *= 2;
    }
}

/* Creates this side's end of the pair's communicator. */
static int proxy_init(npair *p, uint64_t deadline) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  /* so that ncclCommAbort can always interrupt it */
    pthread_mutex_lock(&p->nccl_mu);
    ncclResult_t r = nc.init_rank_config(&p->comm, 2, p->id, p->out ? 0 : 1, &cfg);
    char last[240] = "";
    if (r != ncclSuccess && r != ncclInProgress && nc.last_error && nc.last_error(NULL))
        snprintf(last, sizeof last, "%s", nc.last_error(NULL));
    pthread_mutex_unlock(&p->nccl_mu);
    if (r != ncclSuccess && r != ncclInProgress) {
        proxy_fail(p, 1, "ncclCommInitRankConfig failed: NCCL error: %s%s%s", nc.error_string(r), last[0] ? ": " : "",
                   last);
        return -1;
    }
    /* A peer may join late (at its first devcomm call with us): poll gently. */
    return wait_nccl(p, "ncclCommInitRankConfig", deadline, 20000000);
}

/* Between transfers: NCCL errors, abort requests and a dead peer.  With
 * transfers in flight a dead peer fails the pair after a grace period (its
 * last transfers may still land); idle, a dead peer is no failure. */
static int proxy_check(npair *p, uint64_t *gone_since) {
    pthread_mutex_lock(&p->mu);
    int ab = p->abort_req, busy = p->in_flight > 0;
    pthread_mutex_unlock(&p->mu);
    if (ab) {
        proxy_fail(p, 0, "aborted: a waiter gave up (timeout)");
        return -1;
    }
    if (!p->comm || !busy) return 0;
    ncclResult_t st = ncclSuccess, r = pc_async(p, &st);
    if (r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        char es[400];
        nc_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
        proxy_fail(p, 1, "NCCL error: %s", es);
        return -1;
    }
    char why[300];
    if (dc_peer_gone(p->t->cfg, p->peer, why, sizeof why)) {
        uint64_t now = pp_now_ns();
        if (!*gone_since) *gone_since = now;
        if (now - *gone_since >= NC_GRACE_NS) {
            proxy_fail(p, 0, "rank %d %s with transfers in flight", p->peer, why);
            return -1;
        }
    }
    return 0;
}

/* Close: finalize a healthy idle communicator, abort any other. */
static void proxy_finish(npair *p) {
    if (!p->comm) return;
    pthread_mutex_lock(&p->mu);
    int idle = p->in_flight == 0 && !p->failed;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&p->nccl_mu);
    ncclResult_t r = idle ? nc.finalize(p->comm) : ncclInvalidUsage;
    pthread_mutex_unlock(&p->nccl_mu);
    if (r == ncclSuccess || r == ncclInProgress) {
        /* Bounded: should it wait for something that never comes, abort after all. */
        uint64_t deadline = pp_now_ns() + 5000000000ull;
        ncclResult_t st = ncclInProgress;
        while (pc_async(p, &st) == ncclSuccess && st == ncclInProgress && pp_now_ns() < deadline)
            pp_sleep_ns(1000000);
        if (st == ncclSuccess) {
            pthread_mutex_lock(&p->nccl_mu);
            nc.destroy(p->comm);
            p->comm = NULL;
            pthread_mutex_unlock(&p->nccl_mu);
            return;
        }
    }
    pc_abort(p);
}

static int proxy_setup(npair *p) {
    cudaError_t e = cudaSetDevice(p->t->cfg->device);  /* the current device is per thread */
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        p->stream = NULL;
        proxy_fail(p, 0, "cannot set up CUDA device %d for the proxy: %s", p->t->cfg->device, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Parks a failed or stopping proxy until close. */
static void proxy_park(npair *p) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void *out_main(void *arg) {
    npair *p = arg;
    if (proxy_setup(p) < 0 || proxy_init(p, UINT64_MAX) < 0) goto park;
    uint64_t gone_since = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!p->q_head && !p->stop && !p->abort_req) {
            if (p->in_flight)
                cv_wait_until(p, pp_now_ns() + NC_SLICE_MS * 1000000ull);
            else
                pthread_cond_wait(&p->cv, &p->mu);
        }
        nitem *it = p->q_head;
        int stop = p->stop;
        if (it && !stop) {
            p->q_head = it->next;
            if (!p->q_head) p->q_tail = NULL;
            p->in_flight++;
        }
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        if (proxy_check(p, &gone_since) < 0) goto park;
        if (!it || stop) continue;
        nc_done *d = malloc(sizeof *d);
        ncclResult_t r = d ? pc_xfer(p, it->dev, it->len) : ncclSystemError;
        if (r == ncclInProgress && wait_nccl(p, "ncclSend", UINT64_MAX, 1000000) < 0) {
            free(d);
            free(it);
            goto park;
        }
        if (r != ncclSuccess && r != ncclInProgress) {
            char es[400];
            nc_errstr(p, r, es, sizeof es);
            proxy_fail(p, 1, "ncclSend of %zu bytes failed: NCCL error: %s", it->len, es);
            free(d);
            free(it);
            goto park;
        }
        d->p = p;
        d->buf = it->buf;
        d->seq = 0;
        cudaError_t e = cudaLaunchHostFunc(p->stream, send_done, d);
        free(it);
        if (e != cudaSuccess) {
            free(d);
            proxy_fail(p, 1, "cudaLaunchHostFunc after ncclSend failed: %s", cudaGetErrorString(e));
            goto park;
        }
    }
    proxy_finish(p);
    return NULL;
park:
    proxy_park(p);
    proxy_finish(p);
    return NULL;
}

typedef struct nc_ann {      /* an nccl announcement on the host comm */
    uint64_t tag, len;
} nc_ann;

/* A free pool buffer of at least len bytes (the smallest), or a new one;
 * mu held.  cudaMallocAsync on the stream that uses it: plain cudaMalloc
 * may synchronise the device, which would wait for NCCL kernels that wait
 * for a peer. */
static int get_buf_locked(npair *p, cudaStream_t s, size_t len, int *out, char *why, size_t cap) {
    int best = -1;
    for (int i = 0; i < p->n_bufs; i++)
        if (!p->bufs[i].busy && p->bufs[i].cap >= len && (best < 0 || p->bufs[i].cap < p->bufs[best].cap)) best = i;
    if (best < 0) {
        nbuf *nb = realloc(p->bufs, (size_t)(p->n_bufs + 1) * sizeof *nb);
        if (!nb) {
            snprintf(why, cap, "out of memory");
            return -1;
        }
        p->bufs = nb;
        size_t c = NC_MIN_CAP;
        while (c < len) c *= 2;
        void *dev = NULL;
        cudaError_t e = cudaMallocAsync(&dev, c, s);
        if (e != cudaSuccess) {
            snprintf(why, cap, "cudaMallocAsync of %zu bytes: %s", c, cudaGetErrorString(e));
            return -1;
        }
        p->bufs[p->n_bufs] = (nbuf){dev, c, 0};
        best = p->n_bufs++;
    }
    p->bufs[best].busy = 1;
    *out = best;
    return 0;
}

/* Receiver: the first announcement came, so the sender has published the
 * unique id; join the communicator. */
static int in_connect(npair *p) {
    const devcomm_config *cfg = p->t->cfg;
    char key[320];
    size_t len = 0;
    pp_err e;
    snprintf(key, sizeof key, DC_KEY_NCCL, cfg->job_key, p->peer, cfg->rank);
    if (dc_ex_get(cfg, key, &p->id, sizeof p->id, &len, cfg->connect_timeout_ms, &e) < 0 || len != sizeof p->id) {
        proxy_fail(p, 0, "no NCCL unique id from rank %d in the store (key %s): %s", p->peer, key,
                   len != sizeof p->id ? "wrong size" : e.msg);
        return -1;
    }
    return proxy_init(p, pp_now_ns() + (uint64_t)cfg->connect_timeout_ms * 1000000ull);
}

static void *in_main(void *arg) {
    npair *p = arg;
    const devcomm_config *cfg = p->t->cfg;
    uint64_t gone_since = 0;
    if (proxy_setup(p) < 0) goto park;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        if (proxy_check(p, &gone_since) < 0) goto park;
        nc_ann a;
        pp_err e;
        uint64_t t0 = pp_now_ns();
        if (comm_recv(cfg->host, p->peer, dc_ctl_tag(p->seq, COMM_DIR_DEVANN), &a, sizeof a, NC_SLICE_MS, &e) < 0) {
            /* Before the slice ran out it is no timeout: the peer is gone
             * (or the host comm closing).  What it announced may still land. */
            if (pp_now_ns() - t0 < NC_SLICE_MS * 1000000ull) {
                pthread_mutex_lock(&p->mu);
                if (!p->ended) {
                    p->ended = 1;
                    snprintf(p->why, sizeof p->why, "devcomm (nccl): %.600s", e.msg);
                    pthread_cond_broadcast(&p->cv);
                }
                int busy = p->in_flight > 0;
                if (!busy) {
                    while (!p->stop) pthread_cond_wait(&p->cv, &p->mu);
                    pthread_mutex_unlock(&p->mu);
                    break;
                }
                pthread_mutex_unlock(&p->mu);
                pp_sleep_ns(NC_SLICE_MS * 1000000ull);
            }
            continue;
        }
        if (!p->comm && in_connect(p) < 0) goto park;
        nentry *n = calloc(1, sizeof *n);
        nc_done *d = malloc(sizeof *d);
        char why[300] = "out of memory";
        pthread_mutex_lock(&p->mu);
        int rc = n && d ? 0 : -1;
        if (n) {
            n->seq = p->seq;
            n->tag = a.tag;
            n->len = (size_t)a.len;
            n->buf = -1;
            n->state = a.len ? NE_POSTED : NE_READY;
        }
        if (rc == 0 && a.len) rc = get_buf_locked(p, p->stream, (size_t)a.len, &n->buf, why, sizeof why);
        if (rc == 0) {
            n->dev = a.len ? p->bufs[n->buf].dev : NULL;
            nentry **tail = &p->inbox;
            while (*tail) tail = &(*tail)->next;
            *tail = n;
            if (a.len) p->in_flight++;
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
        if (rc < 0) {
            free(n);
            free(d);
            proxy_fail(p, 0, "cannot take message %" PRIu64 " (%" PRIu64 " bytes): %s", p->seq, a.len, why);
            goto park;
        }
        uint64_t seq = p->seq++;
        if (!a.len) {
            free(d);
            continue;
        }
        ncclResult_t r = pc_xfer(p, n->dev, (size_t)a.len);
        if (r == ncclInProgress && wait_nccl(p, "ncclRecv", UINT64_MAX, 1000000) < 0) {
            free(d);
            goto park;
        }
        if (r != ncclSuccess && r != ncclInProgress) {
            char es[400];
            nc_errstr(p, r, es, sizeof es);
            proxy_fail(p, 1, "ncclRecv of %" PRIu64 " bytes failed: NCCL error: %s", a.len, es);
            free(d);
            goto park;
        }
        *d = (nc_done){p, n->buf, seq};
        cudaError_t ce = cudaLaunchHostFunc(p->stream, recv_done, d);
        if (ce != cudaSuccess) {
            free(d);
            proxy_fail(p, 1, "cudaLaunchHostFunc after ncclRecv failed: %s", cudaGetErrorString(ce));
            goto park;
        }
    }
    proxy_finish(p);
    return NULL;
park:
    proxy_park(p);
    proxy_finish(p);
    return NULL;
}

/* ---- pairs ------------------------------------------------------------------------ */

static npair *pair_new(dc_nccl *t, int peer, int out) {
    npair *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->t = t;
    p->peer = peer;
    p->out = out;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  /* pp_now_ns's clock */
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->nccl_mu, NULL);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    return p;
}

static int pair_start(npair *p, pp_err *err) {
    int e = pthread_create(&p->proxy, NULL, p->out ? out_main : in_main, p);
    if (e != 0)
        return pp_fail(err, "devcomm (nccl): cannot start the proxy thread for rank %d: %s", p->peer, strerror(e));
    p->started = 1;
    return 0;
}

/* The in-proxy of a peer starts at this rank's first exchange with it in
 * either direction, so both ends join their communicators promptly. */
static int in_pair(dc_nccl *t, int peer, npair **out, pp_err *err) {
    if (!t->ins[peer]) {
        if (dc_nccl_library(err) < 0) return -1;
        npair *p = pair_new(t, peer, 0);
        if (!p) return pp_fail(err, "devcomm (nccl): out of memory");
        if (pair_start(p, err) < 0) {
            free(p);
            return -1;
        }
        t->ins[peer] = p;
    }
    *out = t->ins[peer];
    return 0;
}

static int out_pair(dc_nccl *t, int peer, npair **out, pp_err *err) {
    if (!t->outs[peer]) {
        const devcomm_config *cfg = t->cfg;
        if (dc_nccl_library(err) < 0) return -1;
        npair *p = pair_new(t, peer, 1);
        if (!p) return pp_fail(err, "devcomm (nccl): out of memory");
        char key[320];
        ncclResult_t r = nc.get_unique_id(&p->id);
        if (r != ncclSuccess) {
            free(p);
            return pp_fail(err, "devcomm (nccl): rank %d cannot make an NCCL unique id for rank %d: %s", cfg->rank,
                           peer, nc.error_string(r));
        }
        snprintf(key, sizeof key, DC_KEY_NCCL, cfg->job_key, cfg->rank, peer);
        if (dc_ex_put(cfg, key, &p->id, sizeof p->id, err) < 0) {
            free(p);
            return pp_wrap(err, "devcomm (nccl): rank %d cannot publish its NCCL unique id for rank %d (key %s)",
                           cfg->rank, peer, key);
        }
        if (pair_start(p, err) < 0) {
            free(p);
            return -1;
        }
        t->outs[peer] = p;
    }
    *out = t->outs[peer];
    return 0;
}

/* ---- the transport ---------------------------------------------------------------- */

int dc_nccl_open(const devcomm_config *cfg, dc_nccl **out, pp_err *err) {
    *out = NULL;
    dc_nccl *t = calloc(1, sizeof *t);
    if (t) {
        t->outs = calloc((size_t)cfg->world, sizeof *t->outs);
        t->ins = calloc((size_t)cfg->world, sizeof *t->ins);
    }
    if (!t || !t->outs || !t->ins) {
        if (t) {
            free(t->outs);
            free(t->ins);
        }
        free(t);
        return pp_fail(err, "devcomm (nccl): out of memory");
    }
    t->cfg = cfg;
    cudaError_t e = cudaSetDevice(cfg->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(t->outs);
        free(t->ins);
        free(t);
        return pp_fail(err, "devcomm (nccl): rank %d cannot set up CUDA device %d: %s", cfg->rank, cfg->device,
                       cudaGetErrorString(e));
    }
    *out = t;
    return 0;
}

/* Takes the receiver's acknowledgements: with timeout_ms 0 those already
 * here; otherwise waits up to timeout_ms for the next one.  -1 (filling
 * err) when none came; *early tells whether that was before the timeout
 * (the peer gone), not the timeout itself. */
static int take_acks(dc_nccl *t, npair *p, int timeout_ms, int *early, pp_err *err) {
    int got = 0;
    while (p->acks < p->seq) {
        uint64_t t0 = pp_now_ns();
        if (comm_recv(t->cfg->host, p->peer, dc_ctl_tag(p->acks, COMM_DIR_DEVACK), NULL, 0, got ? 0 : timeout_ms,
                      err) < 0) {
            if (got) return 0;
            if (early) *early = pp_now_ns() - t0 < (uint64_t)timeout_ms * 1000000ull;
            return -1;
        }
        p->acks++;
        got = 1;
    }
    return 0;
}

int dc_nccl_send(dc_nccl *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    char ts[128], why[300];
    npair *p = NULL, *in = NULL;
    if (in_pair(t, peer, &in, err) < 0 || out_pair(t, peer, &p, err) < 0) return -1;
    take_acks(t, p, 0, NULL, NULL);
    int buf = -1;
    void *pdev = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->failed) {
        pthread_mutex_unlock(&p->mu);
        return pp_fail(err, "devcomm (nccl): cannot send %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts), peer,
                       p->why);
    }
    int rc = len ? get_buf_locked(p, t->stream, len, &buf, why, sizeof why) : 0;
    if (rc == 0 && len) pdev = p->bufs[buf].dev;
    pthread_mutex_unlock(&p->mu);
    if (rc < 0)
        return pp_fail(err, "devcomm (nccl): cannot send %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts), peer,
                       why);
    if (len) {
        /* Synchronised: the caller may overwrite dev once we return. */
        cudaError_t e = cudaMemcpyAsync(pdev, dev, len, cudaMemcpyDeviceToDevice, t->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(t->stream);
        if (e != cudaSuccess) {
            pthread_mutex_lock(&p->mu);
            p->bufs[buf].busy = 0;
            pthread_mutex_unlock(&p->mu);
            return pp_fail(err, "devcomm (nccl): cannot copy %s for rank %d: %s", comm_tag_str(tag, ts, sizeof ts),
                           peer, cudaGetErrorString(e));
        }
    }
    nitem *it = len ? malloc(sizeof *it) : NULL;
    nc_ann a = {tag, len};
    pp_err e = {"out of memory"};
    if ((len && !it) || comm_send(t->cfg->host, peer, dc_ctl_tag(p->seq, COMM_DIR_DEVANN), &a, sizeof a, &e) < 0) {
        free(it);
        pthread_mutex_lock(&p->mu);
        if (len) p->bufs[buf].busy = 0;
        pthread_mutex_unlock(&p->mu);
        return pp_fail(err, "devcomm (nccl): cannot announce %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts),
                       peer, e.msg);
    }
    pthread_mutex_lock(&p->mu);
    p->seq++;
    if (it) {
        *it = (nitem){NULL, buf, pdev, len};
        if (p->q_tail)
            p->q_tail->next = it;
        else
            p->q_head = it;
        p->q_tail = it;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int dc_nccl_recv(dc_nccl *t, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err) {
    char ts[128];
    npair *p = NULL;
    if (in_pair(t, peer, &p, err) < 0) return -1;
    uint64_t deadline = ms_deadline(timeout_ms);
    int rc = 0;
    nentry *n = NULL;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        nentry **np = &p->inbox;
        while (*np && (*np)->tag != tag) np = &(*np)->next;
        n = *np;
        if (n && n->len != len) {
            rc = pp_fail(err, "devcomm (nccl): message %s from rank %d has %zu bytes, but rank %d expected %zu",
                         comm_tag_str(tag, ts, sizeof ts), peer, n->len, t->cfg->rank, len);
            n = NULL;  /* stays in the inbox: a failed recv changes nothing */
            break;
        }
        if (n && n->state == NE_READY) break;  /* verified below, then taken */
        if (p->failed && (!n || n->state != NE_READY)) {
            rc = pp_fail(err, "devcomm (nccl): rank %d cannot receive %s from rank %d: %s", t->cfg->rank,
                         comm_tag_str(tag, ts, sizeof ts), peer, p->why);
            break;
        }
        if (!n && p->ended) {
            rc = pp_fail(err, "devcomm (nccl): rank %d was waiting for %s from rank %d: %s", t->cfg->rank,
                         comm_tag_str(tag, ts, sizeof ts), peer, p->why);
            break;
        }
        if (pp_now_ns() >= deadline) {
            rc = pp_fail(err, "devcomm (nccl): rank %d timed out after %d ms waiting for %s from rank %d (%s)",
                         t->cfg->rank, timeout_ms, comm_tag_str(tag, ts, sizeof ts), peer,
                         n ? "announced, NCCL transfer not complete: communicator aborted" : "not announced yet");
            if (n) p->abort_req = 1;  /* stuck inside NCCL: the proxy aborts */
            pthread_cond_broadcast(&p->cv);
            break;
        }
        cv_wait_until(p, deadline);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc < 0 || !n) return rc;
    /* A transfer NCCL failed also "lands" on the stream: ask first. */
    ncclResult_t st = ncclSuccess, r = n->len ? pc_async(p, &st) : ncclSuccess;
    int nccl_bad = r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress);
    char es[400] = "";
    if (nccl_bad) nc_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
    pthread_mutex_lock(&p->mu);
    if (nccl_bad) {
        spoil_locked(p);
        fail_locked(p, "devcomm (nccl): rank %d, messages from rank %d: NCCL error: %s", t->cfg->rank, peer, es);
        p->abort_req = 1;
    }
    if (n->state == NE_BAD)
        rc = pp_fail(err, "devcomm (nccl): rank %d cannot receive %s from rank %d: %s", t->cfg->rank,
                     comm_tag_str(tag, ts, sizeof ts), peer, p->why);
    else
        for (nentry **np = &p->inbox; *np; np = &(*np)->next)
            if (*np == n) {
                *np = n->next;
                break;
            }
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) return rc;
    if (len) {
        cudaError_t e = cudaMemcpyAsync(dev, n->dev, len, cudaMemcpyDeviceToDevice, t->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(t->stream);
        if (e != cudaSuccess)
            rc = pp_fail(err, "devcomm (nccl): cannot copy %s from rank %d out: %s", comm_tag_str(tag, ts, sizeof ts),
                         peer, cudaGetErrorString(e));
        pthread_mutex_lock(&p->mu);
        p->bufs[n->buf].busy = 0;
        pthread_mutex_unlock(&p->mu);
    }
    free(n);
    /* A sender that cannot hear this is gone: its next flush says so. */
    if (rc == 0) comm_send(t->cfg->host, peer, dc_ctl_tag(p->acks++, COMM_DIR_DEVACK), NULL, 0, NULL);
    return rc;
}

int dc_nccl_flush(dc_nccl *t, uint64_t deadline_ns, int timeout_ms, pp_err *err) {
    for (int r = 0; r < t->cfg->world; r++) {
        npair *p = t->outs[r];
        if (!p) continue;
        int rc = 0;
        /* First every message taken by the receiver (acknowledged)... */
        while (p->acks < p->seq) {
            pthread_mutex_lock(&p->mu);
            int failed = p->failed;
            pthread_mutex_unlock(&p->mu);
            if (failed) break;  /* said below */
            uint64_t now = pp_now_ns();
            if (now >= deadline_ns) break;
            uint64_t left_ms = deadline_ns == UINT64_MAX ? NC_SLICE_MS : (deadline_ns - now) / 1000000u + 1;
            int early = 0;
            pp_err e;
            if (take_acks(t, p, left_ms < NC_SLICE_MS ? (int)left_ms : NC_SLICE_MS, &early, &e) < 0 && early)
                return pp_fail(err, "devcomm (nccl): flush: %llu messages from rank %d to rank %d not taken: %s",
                               (unsigned long long)(p->seq - p->acks), t->cfg->rank, r, e.msg);
        }
        /* ...then every transfer ended on this side (buffers back). */
        pthread_mutex_lock(&p->mu);
        for (;;) {
            int left = p->in_flight + (int)(p->seq - p->acks);
            for (nitem *it = p->q_head; it; it = it->next) left++;
            if (!left) break;
            if (p->failed) {
                rc = pp_fail(err, "devcomm: flush: %d messages to rank %d not delivered: %s", left, r, p->why);
                break;
            }
            if (pp_now_ns() >= deadline_ns) {
                rc = pp_fail(err,
                             "devcomm (nccl): flush timed out after %d ms: %d messages from rank %d to rank %d not "
                             "received (communicator aborted)",
                             timeout_ms, left, t->cfg->rank, r);
                p->abort_req = 1;
                pthread_cond_broadcast(&p->cv);
                break;
            }
            cv_wait_until(p, deadline_ns);
        }
        pthread_mutex_unlock(&p->mu);
        if (rc < 0) return rc;
    }
    return 0;
}

static void pair_stop(npair *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void pair_close(dc_nccl *t, npair *p) {
    if (!p) return;
    if (p->started) pthread_join(p->proxy, NULL);
    /* The communicator is gone (aborted or destroyed): its kernels have
     * ended, so the stream drains and no completion callback is left. */
    if (p->stream) {
        cudaStreamSynchronize(p->stream);
        cudaStreamDestroy(p->stream);
    }
    for (int i = 0; i < p->n_bufs; i++) cudaFreeAsync(p->bufs[i].dev, t->stream);
    while (p->q_head) {
        nitem *it = p->q_head;
        p->q_head = it->next;
        free(it);
    }
    while (p->inbox) {
        nentry *n = p->inbox;
        p->inbox = n->next;
        free(n);
    }
    free(p->bufs);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->nccl_mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void dc_nccl_close(dc_nccl *t) {
    if (!t) return;
    /* All proxies wind down (finalize or abort) at once, then are joined. */
    for (int r = 0; r < t->cfg->world; r++) {
        pair_stop(t->outs[r]);
        pair_stop(t->ins[r]);
    }
    for (int r = 0; r < t->cfg->world; r++) {
        pair_close(t, t->outs[r]);
        pair_close(t, t->ins[r]);
    }
    cudaStreamSynchronize(t->stream);
    cudaStreamDestroy(t->stream);
    free(t->outs);
    free(t->ins);
    free(t);
}
