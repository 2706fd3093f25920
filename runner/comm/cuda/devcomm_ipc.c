/* devcomm_ipc.c: devcomm between two ranks that share one GPU, over CUDA IPC.
 *
 * The sender queues a device-to-device copy of the message into a buffer of
 * its own pool (cudaMalloc'd base pointers, each exported once with
 * cudaIpcGetMemHandle, each with one interprocess event), records the
 * buffer's event behind it and, without waiting for the copy, sends an
 * announcement {len, buffer id, handles} over the host comm under the
 * data's tag | COMM_DIR_DEVDATA, so that the receiver's comm_recv finds it
 * whatever the order.  Only then does it wait for its copy (the caller may reuse its
 * buffer once send returns).  The receiver opens the handles (once per peer
 * and buffer: cudaIpcOpenMemHandle is slow), waits for the event (the
 * copy may still be running; polled on the host, watching the sender, see
 * wait_sender_copy), copies into the caller's buffer
 * and acknowledges the buffer id over the host comm; the sender reuses a
 * buffer only after its acknowledgement, and allocates a new one when none
 * is free, so a send never waits for the receiver.
 *
 * Buffer sizes are multiples of 2 MiB: cudaMalloc may carve a small
 * allocation out of a larger block, and an IPC handle then stands for the
 * whole block, so the receiver's cudaIpcOpenMemHandle would return the
 * block's base, not the buffer (CUDA Programming Guide, IPC: share only
 * allocations of a 2 MiB aligned size).
 *
 * Threads: none of its own; calls come from the devcomm caller's threads,
 * several at once (devcomm.h): mu serialises each call but for a receive's
 * waits (for the announcement, then for the sender's copy), so no caller
 * waits for a message behind another; a stashed announcement is found by
 * tag, whichever thread failed to take it.  The current device is per thread and the caller's may differ
 * from ours (another library, another thread than open's): every entry
 * point that calls CUDA sets it (flush makes no CUDA call).  Acknowledgements carry per-pair sequence-numbered tags
 * (COMM_DIR_DEVACK) and are taken in order. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/comm/devcomm_int.h"

#define IPC_MAX_BUFS (1u << 20) /* sanity bound on a peer's buffer ids */
#define IPC_GRAIN ((size_t)2 << 20) /* exported sizes are multiples of this (see the top) */

typedef struct ipc_buf { /* one buffer of this rank's pool for one peer */
    dc_slot s;            /* first: the pool is picked by dc_pool_pick; busy: announced, not yet acknowledged */
    cudaEvent_t ev;
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
} ipc_buf;

typedef struct ipc_remote { /* a buffer of the peer's pool, opened here */
    void *dev;
    cudaEvent_t ev;
} ipc_remote;

typedef struct ipc_ann { /* the announcement, sent under the data's tag | COMM_DIR_DEVDATA */
    uint64_t len;
    uint32_t id; /* buffer id; unused when len is 0 */
    uint32_t pad;
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
} ipc_ann;

typedef struct ipc_stash { /* an announcement taken by a recv that failed */
    struct ipc_stash *next;
    uint64_t tag;
    ipc_ann a;
} ipc_stash;

typedef struct ipc_peer {
    ipc_buf *bufs; /* sending: pool, ids are indices */
    uint32_t n_bufs, busy;
    uint64_t ack_in;    /* sequence number of the next acknowledgement */
    ipc_remote *remote; /* receiving: [n_remote], dev NULL if not opened */
    uint32_t n_remote;
    uint64_t ack_out;
    ipc_stash *stash;
} ipc_peer;

struct dc_ipc {
    const devcomm_config *cfg;
    pthread_mutex_t mu;  /* peers, stream: see the top */
    cudaStream_t stream; /* copies in both directions; non-blocking */
    ipc_peer *peers;     /* [world] */
};

static int cu_fail(const dc_ipc *t, pp_err *err, cudaError_t e, const char *what, int peer) {
    return pp_fail(err, "devcomm (cuda-ipc): rank %d, talking to rank %d: %s failed: %s (%s)", t->cfg->host->rank, peer, what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

int dc_device_identify(int device, dc_device_id *out, pp_err *err) {
    memset(out, 0, sizeof *out);
    cudaError_t e = cudaDeviceGetPCIBusId(out->bus, (int)sizeof out->bus - 1, device);
    if (e != cudaSuccess)
        return pp_fail(err, "devcomm: cannot read the PCI bus id of CUDA device %d: %s (%s)", device,
                       cudaGetErrorString(e), cudaGetErrorName(e));
    if (!out->bus[0]) return pp_fail(err, "devcomm: CUDA device %d has no usable PCI bus id", device);
    /* In MIG mode the runtime reports the instance's UUID (CUDA 13:
     * cuDeviceGetUuid is the MIG-aware _v2). */
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return pp_fail(err, "devcomm: cannot read the UUID of CUDA device %d: %s (%s)", device, cudaGetErrorString(e),
                       cudaGetErrorName(e));
    for (int i = 0; i < 16; i++) snprintf(out->uuid + 2 * i, 3, "%02x", (unsigned char)prop.uuid.bytes[i]);
    return 0;
}

/* The caller's thread may be on another device (see the top). */
static int set_device(const dc_ipc *t, int peer, pp_err *err) {
    cudaError_t e = cudaSetDevice(t->cfg->device);
    return e == cudaSuccess ? 0 : cu_fail(t, err, e, "cudaSetDevice", peer);
}

int dc_ipc_open(const devcomm_config *cfg, dc_ipc **out, pp_err *err) {
    *out = NULL;
    dc_ipc *t = calloc(1, sizeof *t);
    if (!t || !(t->peers = calloc((size_t)cfg->host->world, sizeof *t->peers))) {
        free(t);
        return pp_fail(err, "devcomm (cuda-ipc): out of memory");
    }
    t->cfg = cfg;
    cudaError_t e = cudaSetDevice(cfg->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        pp_fail(err, "devcomm (cuda-ipc): rank %d cannot set up CUDA device %d: %s (%s)", cfg->host->rank, cfg->device,
                cudaGetErrorString(e), cudaGetErrorName(e));
        free(t->peers);
        free(t);
        return -1;
    }
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return 0;
}

/* Takes acknowledgements from `peer`: with timeout_ms 0 those already
 * here (never fails), otherwise until none is outstanding or the time is
 * up (fails naming the peer). */
static int take_acks(dc_ipc *t, int peer, int timeout_ms, pp_err *err) {
    ipc_peer *p = &t->peers[peer];
    while (p->busy) {
        uint32_t id;
        pp_err e;
        if (comm_recv(t->cfg->host, peer, dc_ctl_tag(p->ack_in, COMM_DIR_DEVACK), &id, sizeof id, timeout_ms, &e) < 0)
            return timeout_ms == 0
                       ? 0
                       : pp_fail(err, "devcomm (cuda-ipc): %u messages from rank %d to rank %d not taken: %s", p->busy,
                                 t->cfg->host->rank, peer, e.msg);
        p->ack_in++;
        if (id >= p->n_bufs || !p->bufs[id].s.busy)
            return pp_fail(err, "devcomm (cuda-ipc): rank %d acknowledged buffer %u, which rank %d never lent it", peer,
                           id, t->cfg->host->rank);
        p->bufs[id].s.busy = 0;
        p->busy--;
    }
    return 0;
}

/* A free buffer of at least len bytes (the smallest), or a new one. */
static int get_buf(dc_ipc *t, int peer, size_t len, uint32_t *id, pp_err *err) {
    ipc_peer *p = &t->peers[peer];
    long best = p->n_bufs ? dc_pool_pick(&p->bufs[0].s, p->n_bufs, sizeof *p->bufs, len) : -1;
    if (best >= 0) {
        *id = (uint32_t)best;
        return 0;
    }
    if (p->n_bufs >= IPC_MAX_BUFS)
        return pp_fail(err, "devcomm (cuda-ipc): %u messages to rank %d outstanding: buffer pool full", p->n_bufs,
                       peer);
    ipc_buf *nb = realloc(p->bufs, (p->n_bufs + 1) * sizeof *nb);
    if (!nb) return pp_fail(err, "devcomm (cuda-ipc): out of memory");
    p->bufs = nb;
    ipc_buf *b = &p->bufs[p->n_bufs];
    memset(b, 0, sizeof *b);
    size_t cap = dc_pool_cap(len, IPC_GRAIN);
    if (!cap) return pp_fail(err, "devcomm (cuda-ipc): message of %zu bytes too large", len);
    cudaError_t e = cudaMalloc(&b->s.dev, cap);
    if (e != cudaSuccess) return cu_fail(t, err, e, "cudaMalloc of a send buffer", peer);
    const char *what = "cudaEventCreateWithFlags";
    e = cudaEventCreateWithFlags(&b->ev, cudaEventInterprocess | cudaEventDisableTiming);
    if (e == cudaSuccess) {
        what = "cudaIpcGetMemHandle";
        e = cudaIpcGetMemHandle(&b->mh, b->s.dev);
        if (e != cudaSuccess) cudaEventDestroy(b->ev);
    }
    if (e == cudaSuccess) {
        what = "cudaIpcGetEventHandle";
        e = cudaIpcGetEventHandle(&b->eh, b->ev);
        if (e != cudaSuccess) cudaEventDestroy(b->ev);
    }
    if (e != cudaSuccess) {
        cudaFree(b->s.dev);
        return cu_fail(t, err, e, what, peer);
    }
    b->s.cap = cap;
    *id = p->n_bufs++;
    return 0;
}

static int send_locked(dc_ipc *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    ipc_peer *p = &t->peers[peer];
    char ts[128];
    if (set_device(t, peer, err) < 0) return -1;
    take_acks(t, peer, 0, NULL);
    ipc_ann a;
    memset(&a, 0, sizeof a);
    a.len = len;
    uint32_t id = 0;
    if (len) {
        if (get_buf(t, peer, len, &id, err) < 0) return -1;
        ipc_buf *b = &p->bufs[id];
        /* The event marks the copy's end: the receiver waits for it (polling),
         * so the announcement need not wait for the copy. */
        cudaError_t e = cudaMemcpyAsync(b->s.dev, dev, len, cudaMemcpyDeviceToDevice, t->stream);
        if (e == cudaSuccess) e = cudaEventRecord(b->ev, t->stream);
        if (e != cudaSuccess) return cu_fail(t, err, e, "copy into a send buffer", peer);
        a.id = id;
        a.mh = b->mh;
        a.eh = b->eh;
    }
    pp_err e;
    int rc = comm_send(t->cfg->host, peer, tag | COMM_DIR_DEVDATA, &a, sizeof a, &e);
    if (rc < 0)
        pp_fail(err, "devcomm (cuda-ipc): cannot announce %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts), peer,
                e.msg);
    else if (len) {
        p->bufs[id].s.busy = 1; /* until acknowledged: the receiver may be reading it */
        p->busy++;
    }
    /* The caller may overwrite dev once we return (devcomm.h), and its
     * writes are not ordered after our stream: wait for the copy out of
     * dev, while the receiver already waits on the event. */
    if (len) {
        cudaError_t ce = cudaStreamSynchronize(t->stream);
        if (ce != cudaSuccess && rc == 0) rc = cu_fail(t, err, ce, "copy into a send buffer", peer);
    }
    return rc;
}

/* Never waits for the receiver: held under mu whole. */
int dc_ipc_send(dc_ipc *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    pthread_mutex_lock(&t->mu);
    int rc = send_locked(t, peer, tag, dev, len, err);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int open_remote(dc_ipc *t, int peer, const ipc_ann *a, ipc_remote **out, pp_err *err) {
    ipc_peer *p = &t->peers[peer];
    if (a->id >= IPC_MAX_BUFS)
        return pp_fail(err, "devcomm (cuda-ipc): rank %d announced buffer id %u (bound %u)", peer, a->id, IPC_MAX_BUFS);
    if (a->id >= p->n_remote) {
        uint32_t n = a->id + 1 > 2 * p->n_remote ? a->id + 1 : 2 * p->n_remote;
        ipc_remote *nr = realloc(p->remote, n * sizeof *nr);
        if (!nr) return pp_fail(err, "devcomm (cuda-ipc): out of memory");
        memset(nr + p->n_remote, 0, (n - p->n_remote) * sizeof *nr);
        p->remote = nr;
        p->n_remote = n;
    }
    ipc_remote *r = &p->remote[a->id];
    if (!r->dev) {
        void *dev = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&dev, a->mh, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) return cu_fail(t, err, e, "cudaIpcOpenMemHandle of the sender's buffer", peer);
        e = cudaIpcOpenEventHandle(&r->ev, a->eh);
        if (e != cudaSuccess) {
            cudaIpcCloseMemHandle(dev);
            return cu_fail(t, err, e, "cudaIpcOpenEventHandle of the sender's buffer", peer);
        }
        r->dev = dev;
    }
    *out = r;
    return 0;
}

/* Waits on the host until the sender's copy into its buffer has completed
 * (the buffer's event).  Not cudaStreamWaitEvent on our stream: an event
 * whose exporter died before its record completed may never complete, and
 * a stream waiting on it would then hang the synchronisation after it, and
 * every later use of our stream, past any timeout; polled here, the wait
 * ends when the sender is gone or the time is up, and our stream stays
 * clean.  The sender synchronises its copy right after announcing it, so
 * the first query usually finds it done. */
static int wait_sender_copy(dc_ipc *t, int peer, uint64_t tag, cudaEvent_t ev, uint64_t deadline, int timeout_ms,
                            pp_err *err) {
    char ts[128], why[300];
    uint64_t nap = 2000; /* 2 us, doubling to 100 us */
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cu_fail(t, err, e, "cudaEventQuery of the sender's buffer", peer);
        (void)cudaGetLastError(); /* NotReady is kept as the thread's last error: a later launch check would see it */
        if (dc_peer_gone(t->cfg, peer, why, sizeof why))
            return pp_fail(err, "devcomm (cuda-ipc): rank %d cannot receive %s from rank %d: rank %d %s before its copy "
                                "into the announced buffer completed",
                           t->cfg->host->rank, comm_tag_str(tag, ts, sizeof ts), peer, peer, why);
        if (pp_now_ns() >= deadline)
            return pp_fail(err, "devcomm (cuda-ipc): rank %d timed out after %d ms waiting for rank %d's copy of %s",
                           t->cfg->host->rank, timeout_ms, peer, comm_tag_str(tag, ts, sizeof ts));
        pp_sleep_ns(nap);
        if (nap < 100000) nap *= 2;
    }
}

int dc_ipc_recv(dc_ipc *t, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err) {
    ipc_peer *p = &t->peers[peer];
    char ts[128];
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    if (set_device(t, peer, err) < 0) return -1;
    pthread_mutex_lock(&t->mu);
    ipc_stash *s = NULL, **sp = &p->stash;
    while (*sp && (*sp)->tag != tag)
        sp = &(*sp)->next;
    if (*sp) {
        s = *sp;
        *sp = s->next;
    }
    pthread_mutex_unlock(&t->mu);
    if (!s) { /* the wait for the announcement, without mu (the host comm takes several threads) */
        if (!(s = calloc(1, sizeof *s))) return pp_fail(err, "devcomm (cuda-ipc): out of memory");
        s->tag = tag;
        pp_err e;
        if (comm_recv(t->cfg->host, peer, tag | COMM_DIR_DEVDATA, &s->a, sizeof s->a, timeout_ms, &e) < 0) {
            free(s);
            return pp_fail(err, "devcomm (cuda-ipc): %s", e.msg);
        }
    }
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    ipc_remote *r = NULL;
    cudaEvent_t ev = NULL;
    const void *src = NULL;
    if (s->a.len != len) {
        rc = pp_fail(err, "devcomm (cuda-ipc): message %s from rank %d has %llu bytes, but rank %d expected %zu",
                     comm_tag_str(tag, ts, sizeof ts), peer, (unsigned long long)s->a.len, t->cfg->host->rank, len);
    } else if (len && open_remote(t, peer, &s->a, &r, err) < 0) {
        rc = -1;
    } else if (len) {
        ev = r->ev, src = r->dev; /* not r: another caller's open_remote may move the array */
    }
    pthread_mutex_unlock(&t->mu);
    /* The wait for the sender's copy, without mu as the announcement's: the
     * sender reuses its buffer only after our ack, below. */
    if (rc == 0 && len && wait_sender_copy(t, peer, tag, ev, deadline, timeout_ms, err) < 0) rc = -1;
    pthread_mutex_lock(&t->mu);
    if (rc == 0 && len) {
        cudaError_t e = cudaMemcpyAsync(dev, src, len, cudaMemcpyDeviceToDevice, t->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(t->stream);
        if (e != cudaSuccess) rc = cu_fail(t, err, e, "copy out of the sender's buffer", peer);
    }
    if (rc < 0) { /* the message stays receivable: a failed recv changes nothing */
        s->next = p->stash;
        p->stash = s;
        pthread_mutex_unlock(&t->mu);
        return -1;
    }
    if (len) {
        /* A sender that cannot hear this is gone: its next flush or send says so. */
        comm_send(t->cfg->host, peer, dc_ctl_tag(p->ack_out++, COMM_DIR_DEVACK), &s->a.id, sizeof s->a.id, NULL);
    }
    pthread_mutex_unlock(&t->mu);
    free(s);
    return 0;
}

int dc_ipc_flush(dc_ipc *t, uint64_t deadline_ns, int timeout_ms, pp_err *err) {
    for (int r = 0; r < t->cfg->host->world; r++) {
        if (!t->peers[r].busy) continue;
        int left = pp_ms_left(deadline_ns);
        if (left == 0) left = 1; /* passed: still take what is here */
        if (take_acks(t, r, left, err) < 0) return pp_wrap(err, "devcomm: flush (timeout %d ms)", timeout_ms);
    }
    return 0;
}

void dc_ipc_close(dc_ipc *t) {
    if (!t) return;
    cudaSetDevice(t->cfg->device); /* a failure shows in the calls below, which have nobody to tell */
    for (int r = 0; r < t->cfg->host->world; r++) {
        ipc_peer *p = &t->peers[r];
        for (uint32_t i = 0; i < p->n_remote; i++)
            if (p->remote[i].dev) {
                cudaEventDestroy(p->remote[i].ev);
                cudaIpcCloseMemHandle(p->remote[i].dev);
            }
        for (uint32_t i = 0; i < p->n_bufs; i++) {
            cudaEventDestroy(p->bufs[i].ev);
            cudaFree(p->bufs[i].s.dev);
        }
        while (p->stash) {
            ipc_stash *s = p->stash;
            p->stash = s->next;
            free(s);
        }
        free(p->remote);
        free(p->bufs);
    }
    if (t->stream) cudaStreamDestroy(t->stream);
    pthread_mutex_destroy(&t->mu);
    free(t->peers);
    free(t);
}
