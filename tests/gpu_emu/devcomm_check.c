/* devcomm_check.c: devcomm (runner/comm/devcomm.c and cuda/devcomm_*.c, as
 * written) run on the CPU: real rank processes, a real host comm over
 * shared memory (or TCP between "nodes"), the CUDA runtime played by
 * cudart_standin.c and NCCL by the stand-in library nccl_standin.c
 * (loaded through PPRUN_NCCL_LIB).  It proves devcomm's protocol (matching
 * by tag in any order, unbounded buffered sends, pool reuse, the order NCCL
 * needs, failure naming the peer without hanging), nothing about CUDA IPC
 * or NCCL on a GPU.
 *
 *   ./build/devcomm_check SCENARIO   (exit 0 if devcomm behaved as expected)
 *   ./build/devcomm_check list
 *
 * Built by tests/gpu_emu/CMakeLists.txt on the emulated comm layer; run by
 * tests/test_devcomm.c. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/gpu_emu/cudart_standin.h"
#include "helpers/comm_file_exchange.h"
#include "helpers/comm_world.h"
#include "runner/comm/devcomm.h"
#include "runner/comm/devcomm_int.h"

#define MAXW 4
#define RECV_MS 20000


typedef struct world {
    int n;
    const char *bus[MAXW]; /* PCI bus id device 0 of each rank reports (cudart_standin.c) */
    const char *uuid[MAXW]; /* NULL: the UUID follows the bus id; else a MIG instance's */
    const char *raw_device[MAXW]; /* set: the rank only publishes this as its device (another pprun version) */
    int device;            /* every rank's device; needs PPRUN_STUB_DEVICES > device */
    int node[MAXW];
    const char *transport; /* devcomm's */
    const char *comm_transport;
} world;

typedef struct rank_ctx {
    int rank, n;
    int no_flush; /* the function flushed (or must not): skip the harness's flush */
    comm *host;
    devcomm *d;
    devcomm_config cfg;
} rank_ctx;

/* Runs in each rank after both comms are open; returns 0 or fills rep. */
typedef int (*rank_fn)(rank_ctx *r, pp_err *rep);

typedef struct result {
    int code[MAXW]; /* exit code, or 128 + signal */
    char rep[MAXW][1100];
} result;

/* ---- data: every byte depends on the tag, so a misdelivery shows --------- */

static unsigned char pat(uint64_t tag, size_t i) {
    return (unsigned char)(tag * 0x9E3779B1u + i * 131u + (i >> 9));
}

static size_t size_of(int i) {
    static const size_t sizes[] = {4096, 0, 1, 70000, 300001, 12, 65536, 65537, 200000, 999};
    return sizes[i % 10];
}

/* The rank's device (devcomm_config.device): the check's own buffers are
 * made there, whatever device the calling thread has current. */
static int rank_device;

static void *dev_alloc(size_t n) {
    void *p = NULL;
    int cur = 0;
    cudaGetDevice(&cur);
    cudaSetDevice(rank_device);
    cudaError_t e = cudaMalloc(&p, n ? n : 1);
    cudaSetDevice(cur);
    return e == cudaSuccess ? p : NULL;
}

static int dev_fill(void *dev, uint64_t tag, size_t n) {
    unsigned char *h = malloc(n ? n : 1);
    if (!h) return -1;
    for (size_t i = 0; i < n; i++)
        h[i] = pat(tag, i);
    int rc = cudaMemcpy(dev, h, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
    free(h);
    return rc;
}

static int dev_check(const void *dev, uint64_t tag, size_t n, pp_err *rep) {
    unsigned char *h = malloc(n ? n : 1);
    if (!h || cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return pp_fail(rep, "cannot read back a received buffer");
    }
    for (size_t i = 0; i < n; i++)
        if (h[i] != pat(tag, i)) {
            char ts[128];
            free(h);
            return pp_fail(rep, "%s: byte %zu of %zu is wrong (another message's data?)",
                           comm_tag_str(tag, ts, sizeof ts), i, n);
        }
    free(h);
    return 0;
}

static uint64_t tag_of(int from, int to, int i) {
    return comm_tag((uint64_t)i, (uint64_t)to, (uint64_t)from, COMM_DIR_ACT);
}

/* Sends n messages to peer (sizes vary, some empty), fire and forget. */
static int send_many(rank_ctx *r, int peer, int n, pp_err *rep) {
    size_t max = 0;
    for (int i = 0; i < n; i++)
        max = size_of(i) > max ? size_of(i) : max;
    void *buf = dev_alloc(max);
    if (!buf) return pp_fail(rep, "cudaMalloc (stand-in) failed");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        uint64_t tag = tag_of(r->rank, peer, i);
        if (dev_fill(buf, tag, size_of(i)) < 0)
            rc = pp_fail(rep, "fill failed");
        else
            rc = devcomm_send(r->d, peer, tag, buf, size_of(i), rep);
        /* devcomm took its own copy: scribbling now must not reach the receiver */
        if (rc == 0 && size_of(i)) dev_fill(buf, ~tag, size_of(i));
    }
    cudaFree(buf);
    return rc;
}

/* Receives the n messages of send_many from peer in an order far from the
 * send order (a stride permutation). */
static int recv_many(rank_ctx *r, int peer, int n, pp_err *rep) {
    void *buf = dev_alloc(300001);
    if (!buf) return pp_fail(rep, "cudaMalloc (stand-in) failed");
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        int i = (int)(((long)k * 37 + 11) % n); /* n is never a multiple of 37 here */
        uint64_t tag = tag_of(peer, r->rank, i);
        rc = devcomm_recv(r->d, peer, tag, buf, size_of(i), RECV_MS, rep);
        if (rc == 0) rc = dev_check(buf, tag, size_of(i), rep);
    }
    cudaFree(buf);
    return rc;
}

/* ---- the harness: fork ranks, open comm and devcomm, run, report ------------------ */

typedef struct world_arg {
    const world *w;
    rank_fn fn;
} world_arg;

/* A rank of cw_run (tests/helpers/comm_world.c), on the comm it opened:
 * opens devcomm, runs the scenario's function, flushes and closes devcomm
 * (cw_run flushes and closes the comm). */
static int rank_main(comm *host, int rank, void *argp, pp_err *rep) {
    const world_arg *a = argp;
    const world *w = a->w;
    cudart_standin_busid = w->bus[rank];
    cudart_standin_uuid = w->uuid[rank];
    rank_device = w->device;
    rank_ctx r = {.rank = rank, .n = w->n, .host = host};
    r.cfg = (devcomm_config){.host = host, .device = w->device, .transport = w->transport};
    if (w->raw_device[rank]) {
        char key[320];
        snprintf(key, sizeof key, DC_KEY_DEV, host->job_key, rank);
        return dc_ex_put(&r.cfg, key, w->raw_device[rank], strlen(w->raw_device[rank]), rep);
    }
    if (devcomm_open(&r.cfg, &r.d, rep) < 0) return -1;
    int rc = a->fn(&r, rep);
    pp_err e;
    if (rc == 0 && !r.no_flush && devcomm_flush(r.d, RECV_MS, &e) < 0) rc = pp_fail(rep, "%s", e.msg);
    devcomm_close(r.d);
    return rc;
}

/* Every rank's code (exit code, or 128 + signal) and report in res. */
static void run_world(const world *w, rank_fn fn, result *res) {
    static cw_result cw;
    world_arg a = {w, fn};
    memset(res, 0, sizeof *res);
    if (cw_run(w->n, w->node, w->comm_transport, rank_main, &a, &cw) < 0) {
        for (int r = 0; r < w->n; r++) {
            res->code[r] = 2;
            snprintf(res->rep[r], sizeof res->rep[r], "cannot start the ranks (temporary directory, fork)");
        }
        return;
    }
    for (int r = 0; r < w->n; r++) {
        res->code[r] = cw.exited[r] ? cw.code[r] : 128 + cw.code[r];
        snprintf(res->rep[r], sizeof res->rep[r], "%s", cw.report[r]);
    }
}

static int failures;

static void expect(int ok, const char *scenario, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void expect(int ok, const char *scenario, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %s: ", ok ? "ok  " : "FAIL", scenario);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) failures++;
}

static void expect_all_ok(const char *scenario, const world *w, const result *res) {
    for (int r = 0; r < w->n; r++)
        expect(res->code[r] == 0, scenario, "rank %d exit %d %s", r, res->code[r], res->rep[r]);
}

/* ---- scenarios --------------------------------------------------------------------- */

#define MANY 150 /* more than any pool holds at first: pools must grow */

/* Everyone sends MANY messages to every peer before receiving anything,
 * then receives in a permuted order; then a ping-pong phase must reuse the
 * pools (no new device allocations). */
static int all_to_all(rank_ctx *r, pp_err *rep) {
    for (int p = 0; p < r->n; p++)
        if (p != r->rank && send_many(r, p, MANY, rep) < 0) return -1;
    long grown = cudart_standin_allocs();
    for (int p = 0; p < r->n; p++)
        if (p != r->rank && recv_many(r, p, MANY, rep) < 0) return -1;
    pp_err e;
    if (devcomm_flush(r->d, RECV_MS, &e) < 0) return pp_fail(rep, "flush after phase 1: %s", e.msg);
    /* ping-pong between 0 and 1: buffers come back, so nothing new is allocated */
    long before = cudart_standin_allocs();
    void *buf = dev_alloc(300001);
    for (int i = 0; i < 40 && r->rank < 2 && r->n >= 2; i++) {
        int peer = 1 - r->rank;
        uint64_t tag = comm_tag(1000 + (uint64_t)i, 0, 0, COMM_DIR_GRAD);
        size_t n = size_of(i);
        if (r->rank == i % 2) {
            if (dev_fill(buf, tag, n) < 0 || devcomm_send(r->d, peer, tag, buf, n, rep) < 0) return -1;
        } else if (devcomm_recv(r->d, peer, tag, buf, n, RECV_MS, rep) < 0 || dev_check(buf, tag, n, rep) < 0) {
            return -1;
        }
    }
    if (devcomm_flush(r->d, RECV_MS, &e) < 0) return pp_fail(rep, "flush after phase 2: %s", e.msg);
    cudaFree(buf);
    long extra = cudart_standin_allocs() - before - 1;
    if (extra > 0) return pp_fail(rep, "ping-pong allocated %ld new device buffers: pools are not reused", extra);
    pp_fail(rep, "%ld device buffers after phase 1, none more in the ping-pong", grown); /* shown on success */
    return 0;
}

static int names_ok(rank_ctx *r, const char *const *want, pp_err *rep) {
    for (int p = 0; p < r->n; p++) {
        if (p == r->rank) continue;
        const char *got = devcomm_transport_name(r->d, p);
        int a = r->rank < p ? r->rank : p, b = r->rank < p ? p : r->rank;
        const char *w = want[a * MAXW + b];
        if (strcmp(got, w)) return pp_fail(rep, "transport to rank %d is %s, expected %s", p, got, w);
    }
    return 0;
}

static const char *const names_ipc[MAXW * MAXW] = {[0 * MAXW + 1] = "cuda-ipc"};
static const char *const names_nccl3[MAXW * MAXW] = {
    [0 * MAXW + 1] = "nccl", [0 * MAXW + 2] = "nccl", [1 * MAXW + 2] = "nccl"};
static const char *const names_mixed[MAXW * MAXW] = {[0 * MAXW + 1] = "cuda-ipc", [2 * MAXW + 3] = "cuda-ipc",
                                                     [0 * MAXW + 2] = "nccl",     [0 * MAXW + 3] = "nccl",
                                                     [1 * MAXW + 2] = "nccl",     [1 * MAXW + 3] = "nccl"};
static const char *const *want_names;

static int names_then_all(rank_ctx *r, pp_err *rep) {
    if (names_ok(r, want_names, rep) < 0) return -1;
    return all_to_all(r, rep);
}

/* A recv with the wrong length fails naming both sizes and changes nothing. */
/* Also: a tag of devcomm's reserved directions is refused, and the host
 * comm carries a message under the data's own tag beside it. */
static int wrong_len_then_right(rank_ctx *r, pp_err *rep) {
    void *buf = dev_alloc(70000);
    uint64_t tag = tag_of(0, 1, 3);
    int rc = 0;
    char host_msg = 'h';
    if (r->rank == 0) {
        pp_err e;
        if (devcomm_send(r->d, 1, tag | COMM_DIR_DEVDATA, buf, 70000, &e) == 0)
            rc = pp_fail(rep, "a send under a reserved direction was taken");
        else if (!strstr(e.msg, "reserved"))
            rc = pp_fail(rep, "reserved-direction error does not say so: %s", e.msg);
        if (rc == 0) rc = dev_fill(buf, tag, 70000) < 0 ? -1 : devcomm_send(r->d, 1, tag, buf, 70000, rep);
        if (rc == 0) rc = comm_send(r->host, 1, tag, &host_msg, 1, rep);
    } else {
        pp_err e;
        if (devcomm_recv(r->d, 0, tag, buf, 1000, RECV_MS, &e) == 0)
            rc = pp_fail(rep, "a recv of 1000 bytes took a 70000-byte message");
        else if (!strstr(e.msg, "70000 bytes") || !strstr(e.msg, "expected 1000"))
            rc = pp_fail(rep, "size error does not name both sizes: %s", e.msg);
        else if (devcomm_recv(r->d, 0, tag, buf, 70000, RECV_MS, rep) < 0 || dev_check(buf, tag, 70000, rep) < 0)
            rc = pp_wrap(rep, "after the failed recv");
        else if (comm_recv(r->host, 0, tag, &host_msg, 1, RECV_MS, rep) < 0 || host_msg != 'h')
            rc = pp_wrap(rep, "the host message under the data's tag");
    }
    cudaFree(buf);
    return rc;
}

/* Receivers that die.  In each, the first failing call of rank 0 must name
 * rank 1 and come back (the harness kills a hung rank).
 * receiver_dies: rank 1 takes 3 messages, tells rank 0 over the host comm
 * and dies; rank 0 then sends more and flushes. */
static int receiver_dies(rank_ctx *r, pp_err *rep) {
    char one = 1;
    if (r->rank == 1) {
        if (recv_many(r, 0, 3, rep) < 0) return -1;
        comm_send(r->host, 0, comm_tag(0, 0, 0, COMM_DIR_CTRL), &one, 1, rep);
        comm_flush(r->host, RECV_MS, rep);
        raise(SIGKILL);
    }
    if (send_many(r, 1, 3, rep) < 0) return -1;
    if (comm_recv(r->host, 1, comm_tag(0, 0, 0, COMM_DIR_CTRL), &one, 1, RECV_MS, rep) < 0) return -1;
    if (send_many(r, 1, 5, rep) < 0 || devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
    return pp_fail(rep, "DELIVERED: sending to a dead rank and flushing succeeded");
}

/* receiver_dies_midstream: rank 0 streams 60 messages while rank 1 takes
 * 3 and dies, unannounced: transfers are in flight when it goes. */
static int receiver_dies_midstream(rank_ctx *r, pp_err *rep) {
    if (r->rank == 1) {
        if (recv_many(r, 0, 3, rep) < 0) return -1;
        raise(SIGKILL);
    }
    for (int round = 0; round < 20; round++)
        if (send_many(r, 1, 60, rep) < 0 || devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
    return pp_fail(rep, "DELIVERED: 20 rounds of 60 messages reached a rank that took 3");
}

/* receiver_dies_in_transfer (nccl, receives slowed down): rank 0 sends 8,
 * rank 1 takes 1 and dies while rank 0's next transfers wait for it. */
static int receiver_dies_in_transfer(rank_ctx *r, pp_err *rep) {
    if (r->rank == 1) {
        if (recv_many(r, 0, 1, rep) < 0) return -1;
        raise(SIGKILL);
    }
    if (send_many(r, 1, 8, rep) < 0 || devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
    return pp_fail(rep, "DELIVERED: flush to a rank that took 1 of 8 succeeded");
}

/* receiver_never_joins: rank 1 dies without ever calling devcomm, after
 * rank 0 sent (nccl: rank 0's communicator init waits for a peer that
 * will never come). */
static int receiver_never_joins(rank_ctx *r, pp_err *rep) {
    char one = 1;
    uint64_t tag = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    if (r->rank == 1) {
        if (comm_recv(r->host, 0, tag, &one, 1, RECV_MS, rep) < 0) return -1;
        raise(SIGKILL);
    }
    if (send_many(r, 1, 8, rep) < 0 || comm_send(r->host, 1, tag, &one, 1, rep) < 0) return -1;
    if (devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
    return pp_fail(rep, "DELIVERED: flush to a rank that never received succeeded");
}

/* Rank 0 sends 2 (flushed: they are in rank 1's hands) and dies; rank 1
 * gets both, then its recv of a third fails naming rank 0. */
static int sender_dies(rank_ctx *r, pp_err *rep) {
    if (r->rank == 0) {
        if (send_many(r, 1, 2, rep) < 0) return -1;
        if (devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
        raise(SIGKILL);
    }
    if (recv_many(r, 0, 2, rep) < 0) return -1;
    void *buf = dev_alloc(16);
    int rc = devcomm_recv(r->d, 0, tag_of(0, 1, 99), buf, 16, RECV_MS, rep);
    cudaFree(buf);
    return rc == 0 ? pp_fail(rep, "DELIVERED: received a message rank 0 never sent") : -1;
}

/* sender_dies_in_transfer (nccl, receives slowed down): rank 0 sends a
 * small message, then, once rank 1 has it, an 8 MiB one, and dies while
 * that transfer is in flight.  Rank 1 waits until its proxy has given up
 * on rank 0 (2 s of grace) and aborted the transfer, then receives it: the
 * aborted transfer's completion callback still runs, and what half landed
 * must not be handed out as the message. */
#define BIG_MSG ((size_t)8 << 20)
static int sender_dies_in_transfer(rank_ctx *r, pp_err *rep) {
    char one = 1;
    uint64_t ctl = comm_tag(0, 0, 0, COMM_DIR_CTRL), small = tag_of(0, 1, 0), big = tag_of(0, 1, 1);
    void *buf = dev_alloc(BIG_MSG);
    if (!buf) return pp_fail(rep, "cudaMalloc (stand-in) failed");
    if (r->rank == 0) {
        if (dev_fill(buf, small, 4096) < 0 || devcomm_send(r->d, 1, small, buf, 4096, rep) < 0) return -1;
        if (comm_recv(r->host, 1, ctl, &one, 1, RECV_MS, rep) < 0) return -1;
        if (dev_fill(buf, big, BIG_MSG) < 0 || devcomm_send(r->d, 1, big, buf, BIG_MSG, rep) < 0) return -1;
        if (comm_flush(r->host, RECV_MS, rep) < 0) return -1; /* the announcement is out */
        raise(SIGKILL);
    }
    if (devcomm_recv(r->d, 0, small, buf, 4096, RECV_MS, rep) < 0 || dev_check(buf, small, 4096, rep) < 0) return -1;
    if (comm_send(r->host, 0, ctl, &one, 1, rep) < 0) return -1;
    char why[300];
    for (int i = 0; i < RECV_MS / 10 && !dc_peer_gone(&r->cfg, 0, why, sizeof why); i++)
        pp_sleep_ns(10000000);
    pp_sleep_ns(3500000000ull); /* past the proxy's grace: the transfer is aborted */
    pp_err e;
    int rc = devcomm_recv(r->d, 0, big, buf, BIG_MSG, RECV_MS, &e);
    if (rc == 0) {
        pp_err bad;
        rc = dev_check(buf, big, BIG_MSG, &bad);
        cudaFree(buf);
        return pp_fail(rep, "DELIVERED: a transfer aborted in flight was received (%s)",
                       rc == 0 ? "intact" : bad.msg);
    }
    cudaFree(buf);
    return pp_fail(rep, "%s", e.msg);
}

/* sender_dies_in_copy (cuda-ipc, copies into exported memory landing 5 s
 * late): rank 0 announces a message and is killed while its copy into the
 * announced buffer is still queued, so the buffer's event never completes.
 * Rank 1's receive must fail naming rank 0, not wait on that event for
 * ever. */
static void *kill_soon(void *arg) {
    (void)arg;
    pp_sleep_ns(500000000ull);
    raise(SIGKILL);
    return NULL;
}

static int sender_dies_in_copy(rank_ctx *r, pp_err *rep) {
    uint64_t tag = tag_of(0, 1, 0);
    void *buf = dev_alloc(4096);
    if (!buf) return pp_fail(rep, "cudaMalloc (stand-in) failed");
    if (r->rank == 0) {
        pthread_t th;
        if (dev_fill(buf, tag, 4096) < 0 || pthread_create(&th, NULL, kill_soon, NULL) != 0)
            return pp_fail(rep, "set-up failed");
        devcomm_send(r->d, 1, tag, buf, 4096, rep); /* waits for its copy: killed meanwhile */
        pp_sleep_ns(10000000000ull);
        return pp_fail(rep, "rank 0 was not killed");
    }
    pp_err e;
    int rc = devcomm_recv(r->d, 0, tag, buf, 4096, RECV_MS, &e);
    cudaFree(buf);
    return rc == 0 ? pp_fail(rep, "DELIVERED: received a message whose copy never ran") : pp_fail(rep, "%s", e.msg);
}

static int nothing(rank_ctx *r, pp_err *rep) {
    (void)r;
    (void)rep;
    return 0;
}

/* The mutant receiver: rank 1 reads the announcements devcomm's sender
 * makes, but posts its ncclRecv in TAG order instead of announcement
 * order (with the stand-in NCCL directly).  Rank 0 sends in descending tag
 * order.  The stand-in must expose it: a size mismatch or wrong bytes. */
static int mutant_tag_order(rank_ctx *r, pp_err *rep) {
    enum { N = 6 };
    if (r->rank == 0) {
        void *buf = dev_alloc(300001);
        for (int i = N - 1; i >= 0; i--) {
            uint64_t tag = tag_of(0, 1, i);
            size_t n = size_of(i) ? size_of(i) : 5;
            if (dev_fill(buf, tag, n) < 0 || devcomm_send(r->d, 1, tag, buf, n, rep) < 0) return -1;
        }
        cudaFree(buf);
        pp_err e;
        devcomm_flush(r->d, 3000, &e); /* the mutant aborts: this may fail, and that is fine */
        r->no_flush = 1;
        return 0;
    }
    void *lib = dlopen(PPRUN_NCCL_STANDIN, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return pp_fail(rep, "cannot load %s", PPRUN_NCCL_STANDIN);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*aerr)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*abrt)(ncclComm_t);
    *(void **)&init = dlsym(lib, "ncclCommInitRankConfig");
    *(void **)&aerr = dlsym(lib, "ncclCommGetAsyncError");
    *(void **)&recv = dlsym(lib, "ncclRecv");
    *(void **)&abrt = dlsym(lib, "ncclCommAbort");
    struct {
        uint64_t tag, len;
    } ann[N];
    for (int s = 0; s < N; s++)
        if (comm_recv(r->host, 0, dc_ctl_tag((uint64_t)s, COMM_DIR_DEVANN), &ann[s], sizeof ann[s], RECV_MS, rep) < 0)
            return -1;
    /* tag order */
    for (int a = 0; a < N; a++)
        for (int b = a + 1; b < N; b++)
            if (ann[b].tag < ann[a].tag) {
                __typeof__(ann[0]) t = ann[a];
                ann[a] = ann[b];
                ann[b] = t;
            }
    ncclUniqueId id;
    size_t len;
    char key[300];
    snprintf(key, sizeof key, DC_KEY_NCCL, r->host->job_key, 0, 1);
    if (fx_get(r->host->ex.ctx, key, &id, sizeof id, &len, RECV_MS, rep) < 0) return -1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c;
    ncclResult_t st = ncclInProgress;
    init(&c, 2, id, 1, &cfg);
    while (aerr(c, &st) == ncclSuccess && st == ncclInProgress)
        pp_sleep_ns(1000000);
    if (st != ncclSuccess) return pp_fail(rep, "mutant: init failed (%d)", st);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = dev_alloc(ann[i].len);
        recv(bufs[i], ann[i].len, ncclInt8, 0, c, s);
        aerr(c, &st);
    }
    /* wait for all, or an async error */
    uint64_t deadline = pp_now_ns() + 5000000000ull;
    int detected = 0;
    while (pp_now_ns() < deadline) {
        aerr(c, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            detected = 1;
            break;
        }
        pp_sleep_ns(2000000);
        /* all landed? the stream drains only if every transfer matched */
        cudaEvent_t ev;
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        cudaEventRecord(ev, s);
        pp_sleep_ns(20000000);
        int done = cudaEventQuery(ev) == cudaSuccess;
        cudaEventDestroy(ev);
        if (done) break;
    }
    if (!detected)
        for (int i = 0; i < N; i++) {
            pp_err e;
            if (dev_check(bufs[i], ann[i].tag, ann[i].len, &e) < 0) detected = 1;
        }
    abrt(c);
    cudaStreamDestroy(s);
    for (int i = 0; i < N; i++)
        cudaFree(bufs[i]);
    if (!detected) return pp_fail(rep, "posting in tag order went unnoticed: the check cannot fail");
    return 0;
}

/* NCCL failing under a receive: rank 1's second NCCL receive (message 2:
 * message 1 is empty and needs none) meets an injected NCCL error; the
 * failing call must say NCCL's error, the peer and the tag. */
static int nccl_error_in_recv(rank_ctx *r, pp_err *rep) {
    char one = 1;
    uint64_t ctl = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    if (r->rank == 0) {
        r->no_flush = 1; /* rank 1 fails: not everything will be taken */
        if (send_many(r, 1, 4, rep) < 0) return -1;
        return comm_recv(r->host, 1, ctl, &one, 1, RECV_MS, rep); /* alive until rank 1 is done */
    }
    void *buf = dev_alloc(300001);
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = devcomm_recv(r->d, 0, tag_of(0, 1, i), buf, size_of(i), RECV_MS, rep);
    cudaFree(buf);
    comm_send(r->host, 0, ctl, &one, 1, NULL);
    comm_flush(r->host, RECV_MS, NULL);
    return rc == 0 ? pp_fail(rep, "DELIVERED: all 4 received despite the injected error") : -1;
}

/* Receive timeouts: a tag never announced, then one announced whose
 * transfer is stuck (receives slowed to 3 s): the communicator is aborted. */
static int recv_timeouts(rank_ctx *r, pp_err *rep) {
    char one = 1;
    uint64_t ctl = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    if (r->rank == 0) {
        r->no_flush = 1;
        if (send_many(r, 1, 1, rep) < 0) return -1;
        return comm_recv(r->host, 1, ctl, &one, 1, RECV_MS, rep); /* rank 1 is done */
    }
    void *buf = dev_alloc(4096);
    pp_err e1, e2;
    int a = devcomm_recv(r->d, 0, tag_of(0, 1, 7), buf, 4096, 300, &e1);
    int b = devcomm_recv(r->d, 0, tag_of(0, 1, 0), buf, 4096, 300, &e2);
    cudaFree(buf);
    comm_send(r->host, 0, ctl, &one, 1, rep);
    if (a == 0 || b == 0) return pp_fail(rep, "a receive that should time out succeeded");
    if (!strstr(e1.msg, "timed out after 300 ms") || !strstr(e1.msg, "not announced yet") || !strstr(e1.msg, "step 7"))
        return pp_fail(rep, "first timeout: %s", e1.msg);
    if (!strstr(e2.msg, "timed out after 300 ms") || !strstr(e2.msg, "communicator aborted"))
        return pp_fail(rep, "second timeout: %s", e2.msg);
    pp_fail(rep, "%s | %s", e1.msg, e2.msg); /* shown on success */
    return 0;
}

/* Every devcomm call made with another device current than the rank's
 * (device 1): as when the engine's thread, or a library it called, moved
 * to device 0.  devcomm must set its device itself; the CUDA stand-in
 * refuses memory, events and stream work on the wrong device. */
static int on_another_device(rank_ctx *r, pp_err *rep) {
    if (cudaSetDevice(0) != cudaSuccess) return pp_fail(rep, "cudaSetDevice(0) (stand-in) failed");
    return names_then_all(r, rep);
}

/* Close does not wait for the peer: rank 1 closes devcomm while rank 0
 * waits for word of it before closing its own.  A close that waited for
 * the peer (ncclCommFinalize's barrier) would leave rank 0 waiting. */
static int close_first(rank_ctx *r, pp_err *rep) {
    char one = 1;
    uint64_t ctl = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    int peer = 1 - r->rank;
    if (send_many(r, peer, 12, rep) < 0 || recv_many(r, peer, 12, rep) < 0) return -1;
    if (devcomm_flush(r->d, RECV_MS, rep) < 0) return -1;
    r->no_flush = 1;
    if (r->rank == 1) {
        devcomm_close(r->d);
        r->d = NULL;
        return comm_send(r->host, 0, ctl, &one, 1, rep);
    }
    /* Far longer than a close takes, shorter than a finalize waiting for us would. */
    if (comm_recv(r->host, 1, ctl, &one, 1, 4000, rep) < 0)
        return pp_wrap(rep, "rank 1's devcomm_close did not return while rank 0 had not closed");
    return 0;
}

/* ---- main ------------------------------------------------------------------------------ */

typedef struct scenario {
    const char *name, *what;
    void (*run)(const char *name);
} scenario;

static void sc_ipc(const char *name) {
    world w = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}};
    result res;
    want_names = names_ipc;
    run_world(&w, names_then_all, &res);
    expect_all_ok(name, &w, &res);
}

static void sc_nccl(const char *name) {
    world w = {.n = 3, .bus = {"0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0"}};
    result res;
    want_names = names_nccl3;
    run_world(&w, names_then_all, &res);
    expect_all_ok(name, &w, &res);
}

static void sc_mixed(const char *name) {
    world w = {.n = 4, .bus = {"0000:3b:00.0", "0000:3b:00.0", "0000:5e:00.0", "0000:5e:00.0"}};
    result res;
    want_names = names_mixed;
    run_world(&w, names_then_all, &res);
    expect_all_ok(name, &w, &res);
}

static void sc_wrong_len(const char *name) {
    world ipc = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}};
    world nccl = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    result res;
    run_world(&ipc, wrong_len_then_right, &res);
    expect_all_ok(name, &ipc, &res);
    run_world(&nccl, wrong_len_then_right, &res);
    expect_all_ok(name, &nccl, &res);
}

/* The survivor's call failed, saying the victim is gone (not a timeout). */
static void dies(const char *name, const world *w, rank_fn fn, int victim) {
    result res;
    run_world(w, fn, &res);
    int survivor = 1 - victim;
    char who[32];
    snprintf(who, sizeof who, "rank %d", victim);
    const char *m = res.rep[survivor];
    expect(res.code[victim] == 128 + SIGKILL, name, "rank %d died by SIGKILL (code %d)", victim, res.code[victim]);
    expect(res.code[survivor] == 1 && strstr(m, who) &&
               (strstr(m, "died") || strstr(m, "gone") || strstr(m, "NCCL error")) && !strstr(m, "timed out") &&
               !strstr(m, "DELIVERED") && !strstr(m, "HUNG"),
           name, "%s (%s) failed naming %s: %s", w->n && strcmp(w->bus[0], w->bus[1]) ? "nccl" : "cuda-ipc",
           survivor ? "rank 1" : "rank 0", who, m);
}

static void sc_dead(const char *name) {
    world ipc = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}};
    world nccl = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    dies(name, &ipc, receiver_dies, 1);
    dies(name, &nccl, receiver_dies, 1);
    dies(name, &ipc, receiver_dies_midstream, 1);
    dies(name, &nccl, receiver_dies_midstream, 1); /* NCCL hangs on the lost peer: the host comm tells */
    setenv("PPRUN_NCCLSTUB_DEAD", "error", 1);     /* NCCL reports the lost peer itself */
    dies(name, &nccl, receiver_dies_midstream, 1);
    unsetenv("PPRUN_NCCLSTUB_DEAD");
    setenv("PPRUN_NCCLSTUB_RECV_DELAY_MS", "200", 1);
    dies(name, &nccl, receiver_dies_in_transfer, 1);
    unsetenv("PPRUN_NCCLSTUB_RECV_DELAY_MS");
    dies(name, &ipc, receiver_never_joins, 1);
    dies(name, &nccl, receiver_never_joins, 1);
    dies(name, &ipc, sender_dies, 0);
    dies(name, &nccl, sender_dies, 0);
    setenv("PPRUN_NCCLSTUB_RECV_DELAY_MS", "1000", 1);
    dies(name, &nccl, sender_dies_in_transfer, 0);
    unsetenv("PPRUN_NCCLSTUB_RECV_DELAY_MS");
    setenv("PPRUN_STUB_LATE_MS", "5000", 1);
    dies(name, &ipc, sender_dies_in_copy, 0);
    unsetenv("PPRUN_STUB_LATE_MS");
}

static void open_fails(const char *name, const world *w, const char *const *needles) {
    result res;
    run_world(w, nothing, &res);
    for (int r = 0; r < w->n; r++) {
        int ok = res.code[r] == 1;
        for (int i = 0; needles[i]; i++)
            ok = ok && strstr(res.rep[r], needles[i]);
        expect(ok, name, "rank %d: %s", r, res.rep[r]);
    }
}

static int expect_nccl_names(rank_ctx *r, pp_err *rep) {
    return strcmp(devcomm_transport_name(r->d, 1 - r->rank), "nccl")
               ? pp_fail(rep, "chose %s, not nccl", devcomm_transport_name(r->d, 1 - r->rank))
               : 0;
}

static void sc_forced(const char *name) {
    world across = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}, .node = {0, 1}, .transport = "cuda-ipc"};
    open_fails(name, &across, (const char *const[]){"cuda-ipc", "ranks 0 and 1", "different nodes", NULL});
    world shared = {.n = 3, .bus = {"0000:3b:00.0", "0000:5e:00.0", "0000:5e:00.0"}, .transport = "nccl"};
    open_fails(name, &shared,
               (const char *const[]){"nccl", "ranks 1 and 2", "share one GPU", "Duplicate GPU detected", NULL});
    world two_gpus = {.n = 3, .bus = {"0000:3b:00.0", "0000:3b:00.0", "0000:5e:00.0"}, .transport = "cuda-ipc"};
    open_fails(name, &two_gpus,
               (const char *const[]){"cuda-ipc is for ranks that share a GPU", "rank 0 is on 0000:3b:00.0",
                                     "rank 2 on 0000:5e:00.0", NULL});
    world bad = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}, .transport = "udp"};
    open_fails(name, &bad, (const char *const[]){"unknown transport 'udp'", "auto, cuda-ipc, nccl", NULL});
    /* the same bus id on two nodes is two GPUs: auto picks nccl */
    world two_nodes = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}, .node = {0, 1}};
    result res;
    run_world(&two_nodes, expect_nccl_names, &res);
    expect_all_ok(name, &two_nodes, &res);
    /* two MIG instances of one GPU: one bus id, two UUIDs; not cuda-ipc */
    world mig = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}, .uuid = {"mig-1g.10gb-a", "mig-1g.10gb-b"}};
    run_world(&mig, expect_nccl_names, &res);
    expect_all_ok(name, &mig, &res);
    mig.transport = "cuda-ipc";
    open_fails(name, &mig, (const char *const[]){"cuda-ipc is for ranks that share a GPU", "two MIG instances of one GPU", NULL});
    /* a device published by another pprun version (bus id only), or garbled */
    static const char *const garbled[] = {"bus=0000:3b:00.0", "uuid=0123 bus=0000:3b:00.0",
                                          "uuid=0123456789abcdef0123456789ABCDEF bus=x"};
    for (int i = 0; i < 3; i++) {
        world old = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}, .raw_device = {NULL, garbled[i]}};
        run_world(&old, nothing, &res);
        expect(res.code[0] == 1 && strstr(res.rep[0], "malformed device of rank 1") && strstr(res.rep[0], garbled[i]),
               name, "rank 0: %s", res.rep[0]);
    }
}

/* NCCL_COMM_ID would give every pair communicator one bootstrap root:
 * refused when a pair uses nccl, harmless (NCCL never loaded) otherwise. */
static void sc_comm_id(const char *name) {
    setenv("NCCL_COMM_ID", "127.0.0.1:29500", 1);
    world nccl = {.n = 3, .bus = {"0000:3b:00.0", "0000:3b:00.0", "0000:5e:00.0"}};
    open_fails(name, &nccl, (const char *const[]){"NCCL_COMM_ID is set (127.0.0.1:29500)", "unset NCCL_COMM_ID", NULL});
    world ipc = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}};
    result res;
    run_world(&ipc, nothing, &res);
    expect_all_ok(name, &ipc, &res);
    unsetenv("NCCL_COMM_ID");
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
    open_fails(name, &nccl,
               (const char *const[]){"NCCL_LAUNCH_ORDER_IMPLICIT is set (1)", "deadlocks", "unset it", NULL});
    run_world(&ipc, nothing, &res);
    expect_all_ok(name, &ipc, &res);
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "0", 1);
    world pair = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    run_world(&pair, nothing, &res);
    expect_all_ok(name, &pair, &res);
    unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
}

static void sc_device(const char *name) {
    setenv("PPRUN_STUB_DEVICES", "2", 1);
    world ipc = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}, .device = 1};
    world mixed = {.n = 3, .bus = {"0000:3b:00.0", "0000:3b:00.0", "0000:5e:00.0"}, .device = 1};
    static const char *const names[MAXW * MAXW] = {
        [0 * MAXW + 1] = "cuda-ipc", [0 * MAXW + 2] = "nccl", [1 * MAXW + 2] = "nccl"};
    result res;
    want_names = names_ipc;
    run_world(&ipc, on_another_device, &res);
    expect_all_ok(name, &ipc, &res);
    want_names = names;
    run_world(&mixed, on_another_device, &res);
    expect_all_ok(name, &mixed, &res);
    unsetenv("PPRUN_STUB_DEVICES");
}

static void sc_close(const char *name) {
    world ipc = {.n = 2, .bus = {"0000:3b:00.0", "0000:3b:00.0"}};
    world nccl = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    result res;
    run_world(&ipc, close_first, &res);
    expect_all_ok(name, &ipc, &res);
    run_world(&nccl, close_first, &res);
    expect_all_ok(name, &nccl, &res);
}

/* The CUDA stand-in is as strict as the scenarios need (they could fail):
 * an IPC export of a size CUDA may sub-allocate, and stream work with
 * another device current, are refused. */
static void sc_strict(const char *name) {
    setenv("PPRUN_STUB_DEVICES", "2", 1);
    cudaIpcMemHandle_t h;
    void *small = NULL, *grain = NULL, *other = NULL;
    cudaSetDevice(0);
    cudaMalloc(&small, (size_t)1 << 20);
    cudaMalloc(&grain, (size_t)4 << 20);
    expect(cudaIpcGetMemHandle(&h, small) != cudaSuccess, name, "exporting a 1 MiB allocation is refused");
    expect(cudaIpcGetMemHandle(&h, grain) == cudaSuccess, name, "exporting a 4 MiB allocation is allowed");
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    expect(cudaMemcpyAsync(grain, small, 64, cudaMemcpyDeviceToDevice, s) == cudaSuccess, name,
           "a copy on device 0's stream with device 0 current is allowed");
    cudaSetDevice(1);
    cudaMalloc(&other, 64);
    expect(cudaMemcpyAsync(grain, small, 64, cudaMemcpyDeviceToDevice, s) != cudaSuccess, name,
           "a copy on device 0's stream with device 1 current is refused");
    cudaSetDevice(0);
    expect(cudaMemcpyAsync(grain, other, 64, cudaMemcpyDeviceToDevice, s) != cudaSuccess, name,
           "a copy from device 1 memory on device 0's stream is refused");
    cudaStreamDestroy(s);
    cudaFree(small);
    cudaFree(grain);
    cudaFree(other);
    unsetenv("PPRUN_STUB_DEVICES");
}

static void sc_nccl_errors(const char *name) {
    world w = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    result res;
    setenv("PPRUN_NCCLSTUB_FAIL_RECV", "2", 1);
    run_world(&w, nccl_error_in_recv, &res);
    unsetenv("PPRUN_NCCLSTUB_FAIL_RECV");
    const char *m = res.rep[1];
    /* Which receive fails depends on timing: once NCCL failed, no message not yet taken is trusted. */
    expect(res.code[1] == 1 && strstr(m, "NCCL error") && strstr(m, "injected failure") && strstr(m, "from rank 0") &&
               strstr(m, "cannot receive tag 0x") && strstr(m, "[NCCL 2.") && strstr(m, "libnccl_standin.so"),
           name, "rank 1's receive under an NCCL error names it, the peer, the tag and the NCCL loaded: %s", m);
    setenv("PPRUN_NCCLSTUB_RECV_DELAY_MS", "3000", 1);
    run_world(&w, recv_timeouts, &res);
    unsetenv("PPRUN_NCCLSTUB_RECV_DELAY_MS");
    expect(res.code[1] == 0, name, "receive timeouts (not announced; stuck in NCCL, aborted): %s", res.rep[1]);
}

static void sc_mutant(const char *name) {
    world w = {.n = 2, .bus = {"0000:3b:00.0", "0000:5e:00.0"}};
    result res;
    run_world(&w, mutant_tag_order, &res);
    expect(res.code[1] == 0, name, "a receiver posting in tag order is caught by the stand-in: %s",
           res.code[1] == 0 ? "yes" : res.rep[1]);
}

static const scenario scenarios[] = {
    {"ipc", "2 ranks on one GPU: 150 messages each way, received permuted; pools grow, then are reused", sc_ipc},
    {"nccl", "3 ranks on 3 GPUs: all to all, 150 messages per pair, permuted; pools reused", sc_nccl},
    {"mixed", "4 ranks on 2 GPUs: cuda-ipc within a GPU, nccl across, all to all", sc_mixed},
    {"wrong-len", "a recv of the wrong size fails naming both sizes and leaves the message; reserved tags refused; "
                  "host messages under data tags", sc_wrong_len},
    {"dead", "a receiver or sender that dies: the peer's call fails naming it, no hang", sc_dead},
    {"nccl-errors", "an NCCL error under a receive, and receive timeouts, fail naming peer, tag and cause",
     sc_nccl_errors},
    {"forced", "forced transports a pair cannot use fail at open naming the pair; MIG instances pair over nccl", sc_forced},
    {"mutant", "the stand-in catches a receiver posting NCCL receives in tag order", sc_mutant},
    {"comm-id", "NCCL_COMM_ID or NCCL_LAUNCH_ORDER_IMPLICIT set: open refuses when a pair uses nccl, names it", sc_comm_id},
    {"device", "every call made with another device current: devcomm uses its own (ipc, nccl)", sc_device},
    {"close", "close does not wait for the peer to close (ipc, nccl)", sc_close},
    {"strict", "the CUDA stand-in refuses sub-2 MiB IPC exports and work on the wrong device", sc_strict},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("PPRUN_NCCL_LIB", PPRUN_NCCL_STANDIN, 1); /* before any rank forks: setenv is unsafe once threads run */
    int ran = 0;
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++) {
        if (argc > 1 && !strcmp(argv[1], "list")) {
            printf("%-10s %s\n", scenarios[i].name, scenarios[i].what);
            continue;
        }
        if (argc > 1 && strcmp(argv[1], scenarios[i].name)) continue;
        scenarios[i].run(scenarios[i].name);
        ran++;
    }
    if (argc > 1 && strcmp(argv[1], "list") && !ran) {
        fprintf(stderr, "devcomm_check: unknown scenario '%s' (try 'list')\n", argv[1]);
        return 2;
    }
    return failures ? 1 : 0;
}
