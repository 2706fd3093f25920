/* devcomm_nccl_proxy.c: the proxy threads of the nccl transport (see
 * devcomm_nccl.c for the protocol).  An out-proxy drives the sender's end
 * of one directed pair's communicator: init (rank 0), then ncclSend of the
 * queued buffers in announcement order.  An in-proxy drives the
 * receiver's end: takes the announcements in order from the host comm,
 * joins the communicator (rank 1) at the first, posts ncclRecv for each
 * into a pool buffer and files it in the inbox.  Both poll NCCL's async
 * error and the peer, and abort on failure and at close; completions
 * arrive through cudaLaunchHostFunc callbacks. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runner/comm/cuda/devcomm_nccl_int.h"

void dcn_wait_until(npair *p, uint64_t deadline) { pp_cond_wait_until(&p->cv, &p->mu, deadline); }

void dcn_fail_locked(npair *p, const char *fmt, ...) {
    if (!p->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->why, sizeof p->why, fmt, ap);
        va_end(ap);
        p->failed = 1;
    }
    pthread_cond_broadcast(&p->cv);
}

static const char *dir_str(const npair *p) {
    return p->out ? "to" : "from";
}

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

/* ---- calls into NCCL, under the transport's nccl_mu ----------------------------- */

/* *st = the communicator's state; ncclSuccess when it is gone (aborted:
 * the pair's failure says why). */
ncclResult_t dcn_async(npair *p, ncclResult_t *st) {
    pthread_mutex_lock(&p->t->nccl_mu);
    ncclResult_t r = ncclSuccess;
    *st = ncclSuccess;
    if (p->comm) r = dc_nc.get_async_error(p->comm, st);
    pthread_mutex_unlock(&p->t->nccl_mu);
    return r;
}

static void pc_abort(npair *p) {
    pthread_mutex_lock(&p->t->nccl_mu);
    if (p->comm) dc_nc.abort(p->comm);
    p->comm = NULL;
    pthread_mutex_unlock(&p->t->nccl_mu);
}

static ncclResult_t pc_xfer(npair *p, void *dev, size_t len) {
    pthread_mutex_lock(&p->t->nccl_mu);
    ncclResult_t r = !p->comm ? ncclInvalidUsage
                     : p->out ? dc_nc.send(dev, len, ncclInt8, 1, p->comm, p->stream)
                              : dc_nc.recv(dev, len, ncclInt8, 0, p->comm, p->stream);
    pthread_mutex_unlock(&p->t->nccl_mu);
    return r;
}

/* NCCL's error text: the code's string, the library's last message if any,
 * and whether the host comm knows the peer is gone (often the cause). */
void dcn_errstr(npair *p, ncclResult_t r, char *buf, size_t cap) {
    char last[240] = "";
    pthread_mutex_lock(&p->t->nccl_mu);
    const char *l = dc_nc.last_error(p->comm); /* every entry is loaded (dc_nccl_library) */
    if (l) snprintf(last, sizeof last, "%s", l);
    pthread_mutex_unlock(&p->t->nccl_mu);
    char why[300] = "";
    int gone = dc_peer_gone(p->t->cfg, p->peer, why, sizeof why);
    int n = snprintf(buf, cap, "%s%s%s", dc_nc.error_string(r), last[0] ? ": " : "", last);
    if (gone && n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "; rank %d %.150s", p->peer, why);
    if (n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " [%s]", dc_nccl_version());
}

/* Every message not yet taken is suspect once NCCL failed; mu held. */
void dcn_spoil_locked(npair *p) {
    for (nentry *e = p->inbox; e; e = e->next)
        e->state = NE_BAD;
}

/* The proxy's failure path: abort the communicator (it may be stuck in a
 * transfer or an init), then fail the pair.  nccl_error: NCCL itself
 * failed, so what landed is suspect too; otherwise (peer gone, timeout,
 * close) messages that landed stay receivable, but not those still in
 * flight: the abort ends their kernels early, and the completion callback
 * queued behind each still runs and would file whatever half landed as a
 * message. */
static void proxy_fail(npair *p, int nccl_error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void proxy_fail(npair *p, int nccl_error, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Spoiled before the communicator goes: a receive that finds it gone
     * (and so cannot ask it) finds the spoil instead.  recv_done only
     * turns POSTED into READY, so BAD stays. */
    pthread_mutex_lock(&p->mu);
    if (nccl_error)
        dcn_spoil_locked(p);
    else
        for (nentry *e = p->inbox; e; e = e->next)
            if (e->state == NE_POSTED) e->state = NE_BAD;
    dcn_fail_locked(p, "devcomm (nccl): rank %d, messages %s rank %d: %s", p->t->cfg->host->rank, dir_str(p), p->peer, msg);
    pthread_mutex_unlock(&p->mu);
    pc_abort(p);
}

/* Polls the communicator until it leaves ncclInProgress (after a
 * non-blocking call).  Gives up, aborting, on an NCCL error, stop or an
 * abort request, the peer gone, or the deadline.  Proxy thread only. */
static int wait_nccl(npair *p, const char *what, uint64_t deadline, uint64_t max_nap_ns) {
    uint64_t next_check = pp_now_ns() + NC_SLICE_MS * 1000000ull;
    uint64_t nap = 10000; /* 10 us, doubling to max_nap_ns */
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = dcn_async(p, &st);
        if (r == ncclSuccess && st == ncclSuccess) return 0;
        if (r != ncclSuccess || st != ncclInProgress) {
            char es[600];
            dcn_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
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
            proxy_fail(p, 0, "%s did not complete within %d ms", what, p->t->cfg->host->connect_timeout_ms);
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
    cfg.blocking = 0; /* so that ncclCommAbort can always interrupt it */
    pthread_mutex_lock(&p->t->nccl_mu);
    ncclResult_t r = dc_nc.init_rank_config(&p->comm, 2, p->id, p->out ? 0 : 1, &cfg);
    char last[240] = "";
    const char *l = r != ncclSuccess && r != ncclInProgress ? dc_nc.last_error(NULL) : NULL;
    if (l) snprintf(last, sizeof last, "%s", l);
    pthread_mutex_unlock(&p->t->nccl_mu);
    if (r != ncclSuccess && r != ncclInProgress) {
        proxy_fail(p, 1, "ncclCommInitRankConfig failed: NCCL error: %s%s%s [%s]", dc_nc.error_string(r),
                   last[0] ? ": " : "", last, dc_nccl_version());
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
    ncclResult_t st = ncclSuccess, r = dcn_async(p, &st);
    if (r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        char es[600];
        dcn_errstr(p, r != ncclSuccess ? r : st, es, sizeof es);
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

/* Close: abort the communicator, whatever its state.  ncclCommFinalize
 * would wait for the peer (a bootstrap barrier), so two ranks closing far
 * apart would each wait; nothing is lost by aborting, since flush already
 * waited for the receiver's acknowledgements.  ncclCommAbort frees the
 * communicator: no ncclCommDestroy after it. */
static void proxy_finish(npair *p) {
    pc_abort(p);
}

static int proxy_setup(npair *p) {
    cudaError_t e = cudaSetDevice(p->t->cfg->device); /* the current device is per thread */
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
    while (!p->stop)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* A dequeued send that will have no completion callback: not in flight
 * any more (the pair has failed; close frees its buffer). */
static void drop_item(npair *p, nitem *it, nc_done *d) {
    pthread_mutex_lock(&p->mu);
    p->in_flight--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    free(it);
    free(d);
}

void *dcn_out_main(void *arg) {
    npair *p = arg;
    if (proxy_setup(p) < 0 || proxy_init(p, UINT64_MAX) < 0) goto park;
    uint64_t gone_since = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!p->q_head && !p->stop && !p->abort_req) {
            if (p->in_flight)
                dcn_wait_until(p, pp_now_ns() + NC_SLICE_MS * 1000000ull);
            else
                pthread_cond_wait(&p->cv, &p->mu);
        }
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        /* Checked before taking an item, so that a failure leaves it queued
         * (counted by flush, freed by close). */
        if (proxy_check(p, &gone_since) < 0) goto park;
        pthread_mutex_lock(&p->mu);
        nitem *it = p->q_head;
        if (it) {
            p->q_head = it->next;
            if (!p->q_head) p->q_tail = NULL;
            p->in_flight++;
        }
        pthread_mutex_unlock(&p->mu);
        if (!it) continue;
        nc_done *d = malloc(sizeof *d);
        ncclResult_t r = d ? pc_xfer(p, it->dev, it->len) : ncclSystemError;
        if (r == ncclInProgress && wait_nccl(p, "ncclSend", UINT64_MAX, 1000000) < 0) {
            drop_item(p, it, d);
            goto park;
        }
        if (r != ncclSuccess && r != ncclInProgress) {
            char es[600];
            dcn_errstr(p, r, es, sizeof es);
            proxy_fail(p, 1, "ncclSend of %zu bytes failed: NCCL error: %s", it->len, es);
            drop_item(p, it, d);
            goto park;
        }
        d->p = p;
        d->buf = it->buf;
        d->seq = 0;
        cudaError_t e = cudaLaunchHostFunc(p->stream, send_done, d);
        if (e != cudaSuccess) {
            proxy_fail(p, 1, "cudaLaunchHostFunc after ncclSend failed: %s", cudaGetErrorString(e));
            drop_item(p, it, d);
            goto park;
        }
        free(it);
    }
    proxy_finish(p);
    return NULL;
park:
    proxy_park(p);
    proxy_finish(p);
    return NULL;
}

/* Takes a free pool buffer of at least len bytes (the smallest), or makes
 * a new one; *dev is its address.  One thread allocates per pair (the
 * caller's for sending, the proxy for receiving); the list is shared with
 * the completion callbacks, so it changes under mu, but no CUDA call is
 * made under mu (a callback waiting for it would hold up the stream).
 * cudaMallocAsync, on the stream that uses the buffer: plain cudaMalloc may
 * synchronise the device, which would wait for NCCL kernels that wait for
 * a peer. */
int dcn_get_buf(npair *p, cudaStream_t s, size_t len, int *out, void **dev, char *why, size_t cap) {
    pthread_mutex_lock(&p->mu);
    int best = (int)dc_pool_pick(p->bufs, (size_t)p->n_bufs, sizeof *p->bufs, len);
    if (best >= 0) {
        p->bufs[best].busy = 1;
        *dev = p->bufs[best].dev;
    }
    pthread_mutex_unlock(&p->mu);
    if (best >= 0) {
        *out = best;
        return 0;
    }
    size_t c = dc_pool_cap(len, NC_MIN_CAP);
    if (!c) {
        snprintf(why, cap, "message of %zu bytes too large", len);
        return -1;
    }
    void *d = NULL;
    cudaError_t e = cudaMallocAsync(&d, c, s);
    if (e != cudaSuccess) {
        snprintf(why, cap, "cudaMallocAsync of %zu bytes: %s", c, cudaGetErrorString(e));
        return -1;
    }
    pthread_mutex_lock(&p->mu);
    nbuf *nb = realloc(p->bufs, (size_t)(p->n_bufs + 1) * sizeof *nb);
    if (nb) {
        p->bufs = nb;
        p->bufs[p->n_bufs] = (nbuf){d, c, 1};
        best = p->n_bufs++;
    }
    pthread_mutex_unlock(&p->mu);
    if (!nb) {
        cudaFreeAsync(d, s);
        snprintf(why, cap, "out of memory");
        return -1;
    }
    *out = best;
    *dev = d;
    return 0;
}

/* Receiver: the first announcement came, so the sender has published the
 * unique id; join the communicator. */
static int in_connect(npair *p) {
    const devcomm_config *cfg = p->t->cfg;
    char key[320];
    size_t len = 0;
    pp_err e;
    snprintf(key, sizeof key, DC_KEY_NCCL, cfg->host->job_key, p->peer, cfg->host->rank);
    if (dc_ex_get(cfg, key, &p->id, sizeof p->id, &len, cfg->host->connect_timeout_ms, &e) < 0 || len != sizeof p->id) {
        proxy_fail(p, 0, "no NCCL unique id from rank %d in the store (key %s): %s", p->peer, key,
                   len != sizeof p->id ? "wrong size" : e.msg);
        return -1;
    }
    return proxy_init(p, pp_deadline_ns(cfg->host->connect_timeout_ms));
}

void *dcn_in_main(void *arg) {
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
        int timed_out = 0;
        if (comm_recv_timed(cfg->host, p->peer, dc_ctl_tag(p->seq, COMM_DIR_DEVANN), &a, sizeof a, NC_SLICE_MS,
                            &timed_out, &e) < 0) {
            /* Anything but the slice's timeout: the peer is gone (or its
             * announcement malformed).  What it announced may still land. */
            if (!timed_out) {
                pthread_mutex_lock(&p->mu);
                if (!p->ended) {
                    p->ended = 1;
                    snprintf(p->why, sizeof p->why, "devcomm (nccl): %.600s", e.msg);
                    pthread_cond_broadcast(&p->cv);
                }
                int busy = p->in_flight > 0;
                if (!busy) {
                    while (!p->stop)
                        pthread_cond_wait(&p->cv, &p->mu);
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
        int rc = n && d ? 0 : -1;
        if (n) {
            n->seq = p->seq;
            n->tag = a.tag;
            n->len = (size_t)a.len;
            n->buf = -1;
            n->state = a.len ? NE_POSTED : NE_READY;
        }
        if (rc == 0 && a.len) rc = dcn_get_buf(p, p->stream, (size_t)a.len, &n->buf, &n->dev, why, sizeof why);
        pthread_mutex_lock(&p->mu);
        if (rc == 0) {
            nentry **tail = &p->inbox;
            while (*tail)
                tail = &(*tail)->next;
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
            char es[600];
            dcn_errstr(p, r, es, sizeof es);
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
