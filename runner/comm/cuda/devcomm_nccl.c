/* devcomm_nccl.c: devcomm between ranks on different GPUs, over NCCL: the
 * transport's calls and its pairs (the proxy threads are in
 * devcomm_nccl_proxy.c, the library loading in devcomm_nccl_lib.c).
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
 * ncclRecv, ncclCommGetAsyncError, abort).  The devcomm caller's threads
 * (several at once, devcomm.h) hold call_mu for all but a receive's wait
 * for its message; such a thread makes unique ids, copies in
 * and out on its own stream, waits on the pair's condition variable, and asks
 * ncclCommGetAsyncError before it trusts a landed message (a transfer NCCL
 * failed also "completes" on the stream); every NCCL call, whatever the pair,
 * holds the transport's nccl_mu, so NCCL sees one thread at a time (its rule
 * for communicators of one device; calls are short: the communicators are
 * non-blocking).  CUDA's callback thread only marks completions under the
 * pair's mutex.  The current device is per thread: the proxies set it once,
 * the caller's entry points at every call (the caller's thread may have moved
 * to another device since open).
 *
 * Failure: a proxy polls ncclCommGetAsyncError while work is in flight and
 * watches the peer through the host comm; on an NCCL error, a dead peer, a
 * receive or flush that timed out (the waiter asks, the proxy aborts), the
 * proxy calls ncclCommAbort and the pair fails with a message naming the
 * peer and the NCCL error.  Close aborts every communicator too (no
 * ncclCommFinalize: it waits for the peer, see devcomm_nccl_proxy.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/comm/cuda/devcomm_nccl_int.h"

/* ---- pairs ------------------------------------------------------------------------ */

static npair *pair_new(dc_nccl *t, int peer, int out) {
    npair *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->t = t;
    p->peer = peer;
    p->out = out;
    pthread_mutex_init(&p->mu, NULL);
    pp_cond_init_monotonic(&p->cv);
    return p;
}

static int pair_start(npair *p, pp_err *err) {
    int e = pthread_create(&p->proxy, NULL, p->out ? dcn_out_main : dcn_in_main, p);
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
        pthread_mutex_lock(&t->nccl_mu);
        ncclResult_t r = dc_nc.get_unique_id(&p->id);
        pthread_mutex_unlock(&t->nccl_mu);
        if (r != ncclSuccess) {
            free(p);
            return pp_fail(err, "devcomm (nccl): rank %d cannot make an NCCL unique id for rank %d: %s [%s]",
                           cfg->host->rank, peer, dc_nc.error_string(r), dc_nccl_version());
        }
        snprintf(key, sizeof key, DC_KEY_NCCL, cfg->host->job_key, cfg->host->rank, peer);
        if (dc_ex_put(cfg, key, &p->id, sizeof p->id, err) < 0) {
            free(p);
            return pp_wrap(err, "devcomm (nccl): rank %d cannot publish its NCCL unique id for rank %d (key %s)",
                           cfg->host->rank, peer, key);
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
        t->outs = calloc((size_t)cfg->host->world, sizeof *t->outs);
        t->ins = calloc((size_t)cfg->host->world, sizeof *t->ins);
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
        return pp_fail(err, "devcomm (nccl): rank %d cannot set up CUDA device %d: %s", cfg->host->rank, cfg->device,
                       cudaGetErrorString(e));
    }
    pthread_mutex_init(&t->nccl_mu, NULL);
    pthread_mutex_init(&t->call_mu, NULL);
    *out = t;
    return 0;
}

/* Takes the receiver's acknowledgements: with timeout_ms 0 those already
 * here; otherwise waits up to timeout_ms for the next one.  -1 (filling
 * err) when none came; *early tells whether that was not the timeout (the
 * peer gone: comm_recv_timed says which). */
static int take_acks(dc_nccl *t, npair *p, int timeout_ms, int *early, pp_err *err) {
    int got = 0;
    while (p->acks < p->seq) {
        int timed_out = 0;
        if (comm_recv_timed(t->cfg->host, p->peer, dc_ctl_tag(p->acks, COMM_DIR_DEVACK), NULL, 0, got ? 0 : timeout_ms,
                            &timed_out, err) < 0) {
            if (got) return 0;
            if (early) *early = !timed_out;
            return -1;
        }
        p->acks++;
        got = 1;
    }
    return 0;
}

/* The caller's thread may be on another device than at open. */
static int set_device(const dc_nccl *t, pp_err *err) {
    cudaError_t e = cudaSetDevice(t->cfg->device);
    return e == cudaSuccess ? 0
                            : pp_fail(err, "devcomm (nccl): rank %d cannot use CUDA device %d: %s", t->cfg->host->rank,
                                      t->cfg->device, cudaGetErrorString(e));
}

static int send_locked(dc_nccl *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    char ts[128], why[300];
    npair *p = NULL, *in = NULL;
    if (set_device(t, err) < 0) return -1;
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
    pthread_mutex_unlock(&p->mu);
    int rc = len ? dcn_get_buf(p, t->stream, len, &buf, &pdev, why, sizeof why) : 0;
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
        return pp_fail(err, "devcomm (nccl): cannot announce %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts), peer,
                       e.msg);
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

/* Never waits for the receiver: under call_mu whole. */
int dc_nccl_send(dc_nccl *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    pthread_mutex_lock(&t->call_mu);
    int rc = send_locked(t, peer, tag, dev, len, err);
    pthread_mutex_unlock(&t->call_mu);
    return rc;
}

int dc_nccl_recv(dc_nccl *t, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err) {
    char ts[128];
    npair *p = NULL;
    if (set_device(t, err) < 0) return -1;
    pthread_mutex_lock(&t->call_mu);
    int made = in_pair(t, peer, &p, err);
    pthread_mutex_unlock(&t->call_mu);
    if (made < 0) return -1;
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    int rc = 0;
    nentry *n = NULL;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        nentry **np = &p->inbox;
        while (*np && (*np)->tag != tag)
            np = &(*np)->next;
        n = *np;
        if (n && n->len != len) {
            rc = pp_fail(err, "devcomm (nccl): message %s from rank %d has %zu bytes, but rank %d expected %zu",
                         comm_tag_str(tag, ts, sizeof ts), peer, n->len, t->cfg->host->rank, len);
            n = NULL; /* stays in the inbox: a failed recv changes nothing */
            break;
        }
        if (n && n->state == NE_READY) break; /* verified below, then taken */
        if (p->failed) {
            rc = pp_fail(err, "devcomm (nccl): rank %d cannot receive %s from rank %d: %s", t->cfg->host->rank,
                         comm_tag_str(tag, ts, sizeof ts), peer, p->why);
            break;
        }
        if (!n && p->ended) {
            rc = pp_fail(err, "devcomm (nccl): rank %d was waiting for %s from rank %d: %s", t->cfg->host->rank,
                         comm_tag_str(tag, ts, sizeof ts), peer, p->why);
            break;
        }
        if (pp_now_ns() >= deadline) {
            rc = pp_fail(err, "devcomm (nccl): rank %d timed out after %d ms waiting for %s from rank %d (%s)",
                         t->cfg->host->rank, timeout_ms, comm_tag_str(tag, ts, sizeof ts), peer,
                         n ? "announced, NCCL transfer not complete: communicator aborted" : "not announced yet");
            if (n) p->abort_req = 1; /* stuck inside NCCL: the proxy aborts */
            pthread_cond_broadcast(&p->cv);
            break;
        }
        dcn_wait_until(p, deadline);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc < 0 || !n) return rc;
    /* A transfer NCCL failed also "lands" on the stream: ask first. */
    ncclResult_t st = ncclSuccess, r = n->len ? dcn_async(p, &st) : ncclSuccess;
    int nccl_bad = r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress);
    char es[600] = "";
    if (nccl_bad) dcn_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
    pthread_mutex_lock(&p->mu);
    if (nccl_bad) {
        dcn_spoil_locked(p);
        dcn_fail_locked(p, "devcomm (nccl): rank %d, messages from rank %d: NCCL error: %s", t->cfg->host->rank, peer, es);
        p->abort_req = 1;
    }
    if (n->state == NE_BAD)
        rc = pp_fail(err, "devcomm (nccl): rank %d cannot receive %s from rank %d: %s", t->cfg->host->rank,
                     comm_tag_str(tag, ts, sizeof ts), peer, p->why);
    else
        for (nentry **np = &p->inbox; *np; np = &(*np)->next)
            if (*np == n) {
                *np = n->next;
                break;
            }
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) return rc;
    pthread_mutex_lock(&t->call_mu); /* the stream and p->acks */
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
    pthread_mutex_unlock(&t->call_mu);
    return rc;
}

int dc_nccl_flush(dc_nccl *t, uint64_t deadline_ns, int timeout_ms, pp_err *err) {
    for (int r = 0; r < t->cfg->host->world; r++) {
        npair *p = t->outs[r];
        if (!p) continue;
        int rc = 0;
        /* First every message taken by the receiver (acknowledged)... */
        while (p->acks < p->seq) {
            pthread_mutex_lock(&p->mu);
            int failed = p->failed;
            pthread_mutex_unlock(&p->mu);
            if (failed) break; /* said below */
            int left_ms = pp_ms_left(deadline_ns);
            if (left_ms == 0) break;
            int early = 0;
            pp_err e;
            if (take_acks(t, p, left_ms >= 0 && left_ms < NC_SLICE_MS ? left_ms : NC_SLICE_MS, &early, &e) < 0 && early)
                return pp_fail(err, "devcomm (nccl): flush: %llu messages from rank %d to rank %d not taken: %s",
                               (unsigned long long)(p->seq - p->acks), t->cfg->host->rank, r, e.msg);
        }
        /* ...then every transfer ended on this side (buffers back). */
        pthread_mutex_lock(&p->mu);
        for (;;) {
            int left = p->in_flight + (int)(p->seq - p->acks);
            for (nitem *it = p->q_head; it; it = it->next)
                left++;
            if (!left) break;
            if (p->failed) {
                rc = pp_fail(err, "devcomm: flush: %d messages to rank %d not delivered: %s", left, r, p->why);
                break;
            }
            if (pp_now_ns() >= deadline_ns) {
                rc = pp_fail(err,
                             "devcomm (nccl): flush timed out after %d ms: %d messages from rank %d to rank %d not "
                             "received (communicator aborted)",
                             timeout_ms, left, t->cfg->host->rank, r);
                p->abort_req = 1;
                pthread_cond_broadcast(&p->cv);
                break;
            }
            dcn_wait_until(p, deadline_ns);
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
    /* The communicator is gone (aborted): its kernels have
     * ended, so the stream drains and no completion callback is left. */
    if (p->stream) {
        cudaStreamSynchronize(p->stream);
        cudaStreamDestroy(p->stream);
    }
    for (int i = 0; i < p->n_bufs; i++)
        cudaFreeAsync(p->bufs[i].dev, t->stream);
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
    pthread_cond_destroy(&p->cv);
    free(p);
}

void dc_nccl_close(dc_nccl *t) {
    if (!t) return;
    cudaSetDevice(t->cfg->device); /* a failure shows in the calls below, which have nobody to tell */
    /* All proxies abort at once, then are joined. */
    for (int r = 0; r < t->cfg->host->world; r++) {
        pair_stop(t->outs[r]);
        pair_stop(t->ins[r]);
    }
    for (int r = 0; r < t->cfg->host->world; r++) {
        pair_close(t, t->outs[r]);
        pair_close(t, t->ins[r]);
    }
    cudaStreamSynchronize(t->stream);
    cudaStreamDestroy(t->stream);
    pthread_mutex_destroy(&t->nccl_mu);
    pthread_mutex_destroy(&t->call_mu);
    free(t->outs);
    free(t->ins);
    free(t);
}
