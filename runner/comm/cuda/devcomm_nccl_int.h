/* devcomm_nccl_int.h: what the nccl transport's files share (not a
 * contract): the library table (devcomm_nccl_lib.c), the per-pair state,
 * and the proxies (devcomm_nccl_proxy.c) that devcomm_nccl.c starts.
 * Locking: mu guards a pair's queue, inbox, pool list, counters and failure;
 * the transport's nccl_mu is held around every NCCL call, whatever the
 * pair (NCCL 2.27+, "Thread Safety": issuing NCCL operations in parallel
 * to independent communicators of one device from several threads is not
 * safe, and every communicator here is on this rank's device); nccl_mu is
 * never taken with a pair's mu held; no CUDA call is made under mu;
 * call_mu (the callers') is taken before either, never under them. */
#ifndef PP_DEVCOMM_NCCL_INT_H
#define PP_DEVCOMM_NCCL_INT_H
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>

#include "runner/comm/devcomm_int.h"

#define NC_MIN_CAP ((size_t)64 << 10)
#define NC_SLICE_MS 100           /* proxies re-check abort, errors and the peer this often */
#define NC_GRACE_NS 2000000000ull /* a dead peer's transfers in flight may still land */

/* The NCCL functions devcomm calls, filled once by dc_nccl_library(). */
typedef struct nccl_api {
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t); /* frees the communicator: never ncclCommDestroy after it */
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
} nccl_api;
extern nccl_api dc_nc; /* read-only once dc_nccl_library() succeeded */

enum { NE_POSTED = 1, NE_READY = 2, NE_BAD = 3 }; /* BAD: NCCL failed under it, or aborted it in flight */

typedef dc_slot nbuf; /* a pool buffer of one pair */

typedef struct nitem { /* sender: announced, waiting for its ncclSend */
    struct nitem *next;
    int buf;
    void *dev; /* bufs[buf].dev: bufs may move while the proxy reads */
    size_t len;
} nitem;

typedef struct nentry { /* receiver: announced message, posted or landed */
    struct nentry *next;
    uint64_t seq, tag;
    size_t len;
    int buf;   /* -1 for an empty message */
    void *dev; /* bufs[buf].dev */
    int state; /* NE_*; under mu */
} nentry;

typedef struct npair { /* one direction between this rank and peer */
    struct dc_nccl *t;
    int peer, out; /* out: this rank sends (NCCL rank 0) */
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* proxy work, completions, failure, stop */
    pthread_t proxy;
    int started, stop, abort_req;
    int failed; /* unusable from now on; why says why */
    int ended;  /* receiver: the peer is gone, nothing more will be announced */
    char why[900];
    nbuf *bufs;
    int n_bufs;
    uint64_t seq;           /* next announcement (sent or expected) */
    uint64_t acks;          /* acknowledgements taken (sender) or sent (receiver); caller's thread */
    int in_flight;          /* transfers handed to NCCL and not completed */
    ncclComm_t comm;        /* set and cleared by the proxy, under t->nccl_mu */
    cudaStream_t stream;    /* the proxy's: NCCL work of this pair */
    ncclUniqueId id;        /* sender: made at the first send */
    nitem *q_head, *q_tail; /* sender */
    nentry *inbox;          /* receiver, in announcement order */
} npair;

struct dc_nccl {
    const devcomm_config *cfg;
    pthread_mutex_t nccl_mu; /* held around every NCCL call, all pairs: one thread in NCCL at a time */
    pthread_mutex_t call_mu; /* the callers' threads: pairs made, seq, acks, stream (devcomm_nccl.c) */
    cudaStream_t stream; /* the caller's copies in and out */
    npair **outs, **ins; /* [world], NULL until the pair talks */
};

typedef struct nc_done { /* argument of a host-function completion */
    npair *p;
    int buf;
    uint64_t seq;
} nc_done;

typedef struct nc_ann { /* an nccl announcement on the host comm */
    uint64_t tag, len;
} nc_ann;

/* devcomm_nccl_proxy.c */
void *dcn_out_main(void *pair);
void *dcn_in_main(void *pair);
/* Waits on the pair's cv until deadline (pp_now_ns clock; UINT64_MAX: no
 * deadline); mu held. */
void dcn_wait_until(npair *p, uint64_t deadline);
/* Marks the pair failed (first reason wins) and wakes everyone; mu held. */
void dcn_fail_locked(npair *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Every message not yet taken is suspect once NCCL failed; mu held. */
void dcn_spoil_locked(npair *p);
/* *st = the communicator's state; ncclSuccess when it is gone (aborted:
 * the pair's failure says why).  Takes t->nccl_mu. */
ncclResult_t dcn_async(npair *p, ncclResult_t *st);
/* NCCL's error text for r, with ncclGetLastError's detail and whether the
 * host comm knows the peer is gone. */
void dcn_errstr(npair *p, ncclResult_t r, char *buf, size_t cap);
/* A free pool buffer of at least len bytes, or a new one (see there). */
int dcn_get_buf(npair *p, cudaStream_t s, size_t len, int *out, void **dev, char *why, size_t cap);

#endif
