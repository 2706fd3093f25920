/* devcomm.c: the device-memory messages of devcomm.h, dispatched per peer.
 *
 * At open every rank publishes the PCI bus id of its device; a pair on one
 * node with one bus id shares a GPU and talks over CUDA IPC
 * (cuda/devcomm_ipc.c), any other pair over NCCL (cuda/devcomm_nccl.c).  A
 * forced transport changes no choice: open fails, on every rank, if any pair
 * cannot use it (cuda-ipc between two GPUs, nccl on one).  This file is
 * always compiled; without the GPU backend devcomm_open says so. */
#include "runner/comm/devcomm_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/comm/comm_int.h"

enum { DC_SELF = 0, DC_IPC = 1, DC_NCCL = 2 };

struct devcomm {
    devcomm_config cfg;  /* cfg.transport is NULL: the caller's string is read during open only */
    unsigned char *kind; /* [world] DC_* */
#ifdef PPRUN_HAVE_CUDA
    dc_ipc *ipc; /* NULL if no peer uses it */
    dc_nccl *nccl;
#endif
};

/* ---- helpers the transports share ----------------------------------------- */

int dc_ex_put(const devcomm_config *cfg, const char *key, const void *v, size_t len, pp_err *err) {
    pthread_mutex_lock(&cfg->host->ex_mu);
    int rc = cfg->host->ex.put(cfg->host->ex.ctx, key, v, len, err);
    pthread_mutex_unlock(&cfg->host->ex_mu);
    return rc;
}

int dc_ex_get(const devcomm_config *cfg, const char *key, void *v, size_t cap, size_t *len, int timeout_ms,
              pp_err *err) {
    pthread_mutex_lock(&cfg->host->ex_mu);
    int rc = cfg->host->ex.get(cfg->host->ex.ctx, key, v, cap, len, timeout_ms, err);
    pthread_mutex_unlock(&cfg->host->ex_mu);
    return rc;
}

int dc_peer_gone(const devcomm_config *cfg, int peer, char *why, size_t cap) {
    comm_peer *p = &cfg->host->peers[peer];
    pthread_mutex_lock(&p->mu);
    int gone = atomic_load(&p->dead) || p->in_state == COMM_IN_CLOSED || atomic_load(&p->setup) < 0;
    if (gone)
        snprintf(why, cap, "%s",
                 atomic_load(&p->dead)           ? p->dead_why
                 : p->in_state == COMM_IN_CLOSED ? p->in_why
                                                 : p->setup_err);
    pthread_mutex_unlock(&p->mu);
    return gone;
}

long dc_pool_pick(const dc_slot *first, size_t n, size_t stride, size_t len) {
    long best = -1;
    size_t best_cap = 0;
    for (size_t i = 0; i < n; i++) {
        const dc_slot *b = (const dc_slot *)((const char *)first + i * stride);
        if (!b->busy && b->cap >= len && (best < 0 || b->cap < best_cap)) {
            best = (long)i;
            best_cap = b->cap;
        }
    }
    return best;
}

size_t dc_pool_cap(size_t len, size_t min_cap) {
    size_t cap = min_cap;
    while (cap < len) {
        if (cap > SIZE_MAX / 2) return 0;
        cap *= 2;
    }
    return cap;
}

/* ---- open / close ----------------------------------------------------------- */

/* Rank, world, job key and exchange were checked by comm_open. */
static int check_config(const devcomm_config *cfg, pp_err *err) {
    if (!cfg) return pp_fail(err, "devcomm: no configuration");
    const comm *c = cfg->host;
    if (!c) return pp_fail(err, "devcomm: no host comm given (control messages travel over it)");
    if (cfg->device < 0) return pp_fail(err, "devcomm: device %d is not a CUDA device index", cfg->device);
    /* CUDA IPC works only within a node: the pairing needs every rank's. */
    if (!c->node_given)
        return pp_fail(err, "devcomm: the host comm was opened with no rank_node (the node index of every rank: "
                            "CUDA IPC works only within a node)");
    for (int r = 0; r < c->world; r++)
        if (c->node[r] < 0) return pp_fail(err, "devcomm: rank_node[%d] is %d, not a node index", r, c->node[r]);
    const char *t = cfg->transport ? cfg->transport : "auto";
    if (strcmp(t, "auto") && strcmp(t, "cuda-ipc") && strcmp(t, "nccl"))
        return pp_fail(err, "devcomm: unknown transport '%s' (accepted: auto, cuda-ipc, nccl)", t);
    return 0;
}

#ifdef PPRUN_HAVE_CUDA
/* "uuid=<32 hex> bus=<bus id>" -> *id; 0, or -1 when malformed. */
static int parse_device(const char *val, dc_device_id *id) {
    char uuid[40], bus[sizeof id->bus];
    if (sscanf(val, "uuid=%39s bus=%63s", uuid, bus) != 2 || strlen(uuid) != 32 || strspn(uuid, "0123456789abcdef") != 32)
        return -1;
    memcpy(id->uuid, uuid, sizeof id->uuid);
    snprintf(id->bus, sizeof id->bus, "%s", bus);
    return 0;
}

/* Learns every rank's device and picks the transport of every pair.  All
 * pairs are checked, not only this rank's, so that every rank of a job
 * with an impossible forced transport fails with the same message. */
static int pick_transports(devcomm *d, const char *transport, pp_err *err) {
    const comm *c = d->cfg.host;
    const int *node = c->node;
    int world = c->world;
    dc_device_id *dev = calloc((size_t)world, sizeof *dev);
    if (!dev) return pp_fail(err, "devcomm: out of memory");
    char key[320], val[128]; /* "uuid=" 32 " bus=" up to 63 */
    int rc = -1;
    if (dc_device_identify(d->cfg.device, &dev[c->rank], err) < 0) goto out;
    snprintf(key, sizeof key, DC_KEY_DEV, c->job_key, c->rank);
    int n = snprintf(val, sizeof val, "uuid=%s bus=%s", dev[c->rank].uuid, dev[c->rank].bus);
    if (dc_ex_put(&d->cfg, key, val, (size_t)n, err) < 0) {
        pp_wrap(err, "devcomm: rank %d cannot publish its device (key %s)", c->rank, key);
        goto out;
    }
    for (int r = 0; r < world; r++) {
        if (r == c->rank) continue;
        size_t len = 0;
        pp_err e;
        snprintf(key, sizeof key, DC_KEY_DEV, c->job_key, r);
        if (dc_ex_get(&d->cfg, key, val, sizeof val - 1, &len, c->connect_timeout_ms, &e) < 0) {
            pp_fail(err, "devcomm: no device of rank %d in the store (key %s): %s", r, key, e.msg);
            goto out;
        }
        val[len < sizeof val - 1 ? len : sizeof val - 1] = '\0';
        if (parse_device(val, &dev[r]) < 0) {
            pp_fail(err,
                    "devcomm: malformed device of rank %d (key %s): '%.80s' (expected uuid=<32 hex digits> "
                    "bus=<PCI bus id>: does every node run the same pprun?)",
                    r, key, val);
            goto out;
        }
    }
    const char *t = transport ? transport : "auto";
    int any_nccl = 0;
    for (int a = 0; a < world; a++)
        for (int b = a + 1; b < world; b++) {
            int same_node = node[a] == node[b];
            int same_gpu = same_node && !strcmp(dev[a].uuid, dev[b].uuid);
            if (!strcmp(t, "cuda-ipc") && !same_node) {
                pp_fail(err,
                        "devcomm: transport cuda-ipc requested, but ranks %d and %d are on different nodes (%d "
                        "and %d): CUDA IPC works only within a node",
                        a, b, node[a], node[b]);
                goto out;
            }
            /* Two GPUs of one node would need peer access, never tried. */
            if (!strcmp(t, "cuda-ipc") && !same_gpu) {
                pp_fail(err,
                        "devcomm: transport cuda-ipc requested, but cuda-ipc is for ranks that share a GPU: rank "
                        "%d is on %s (UUID %.8s), rank %d on %s (UUID %.8s) (node %d)%s; use nccl or auto",
                        a, dev[a].bus, dev[a].uuid, b, dev[b].bus, dev[b].uuid, node[a],
                        strcmp(dev[a].bus, dev[b].bus) ? "" : ": two MIG instances of one GPU");
                goto out;
            }
            if (!strcmp(t, "nccl") && same_gpu) {
                pp_fail(err,
                        "devcomm: transport nccl requested, but ranks %d and %d share one GPU (node %d, PCI "
                        "bus %s): NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"); use cuda-ipc "
                        "or auto",
                        a, b, node[a], dev[a].bus);
                goto out;
            }
            any_nccl |= !same_gpu;
        }
    /* NCCL_COMM_ID makes every ncclGetUniqueId name that one address, so
     * all pair communicators would share one bootstrap root.  Unsetting it
     * here is no fix: setenv is unsafe once threads run, and NCCL may have
     * read it already.  Checked for the whole job, so every rank says it. */
    const char *cid = getenv("NCCL_COMM_ID");
    if (any_nccl && cid && cid[0]) {
        pp_fail(err,
                "devcomm: NCCL_COMM_ID is set (%.100s): it makes every NCCL unique id name that one bootstrap "
                "root, but devcomm gives every pair of ranks a communicator of its own; unset NCCL_COMM_ID",
                cid);
        goto out;
    }
    /* NCCL_LAUNCH_ORDER_IMPLICIT=1 chains the kernels of all communicators
     * of a device in host launch order (NCCL user guide, "Using multiple
     * NCCL communicators concurrently"). devcomm's proxy threads post each
     * pair's send and receive in an order that differs between the two
     * ranks, so the chains would wait on each other. */
    const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    if (any_nccl && order && order[0] && strcmp(order, "0") != 0) {
        pp_fail(err,
                "devcomm: NCCL_LAUNCH_ORDER_IMPLICIT is set (%.20s): it orders the kernels of all communicators "
                "of a GPU by host launch, which deadlocks devcomm's per-pair communicators; unset it",
                order);
        goto out;
    }
    /* Past the checks above a forced transport is the one auto picks. */
    for (int r = 0; r < world; r++) {
        int same_gpu = node[r] == node[c->rank] && !strcmp(dev[r].uuid, dev[c->rank].uuid);
        d->kind[r] = r == c->rank ? DC_SELF : same_gpu ? DC_IPC : DC_NCCL;
    }
    rc = 0;
out:
    free(dev);
    return rc;
}
#endif

int devcomm_open(const devcomm_config *cfg, devcomm **out, pp_err *err) {
    *out = NULL;
    if (check_config(cfg, err) < 0) return -1;
#ifndef PPRUN_HAVE_CUDA
    return pp_fail(err, "devcomm: this pprun was built without the GPU backend (no CUDA toolkit at build time): "
                        "device-memory transports (cuda-ipc, nccl) are not available");
#else
    devcomm *d = calloc(1, sizeof *d);
    if (!d) return pp_fail(err, "devcomm: out of memory");
    d->cfg = *cfg;
    d->cfg.transport = NULL;
    int world = cfg->host->world;
    if (!(d->kind = calloc((size_t)world, 1))) {
        devcomm_close(d);
        return pp_fail(err, "devcomm: out of memory");
    }
    if (pick_transports(d, cfg->transport, err) < 0) {
        devcomm_close(d);
        return -1;
    }
    int need_ipc = 0, need_nccl = 0;
    for (int r = 0; r < world; r++) {
        need_ipc |= d->kind[r] == DC_IPC;
        need_nccl |= d->kind[r] == DC_NCCL;
    }
    if ((need_ipc && dc_ipc_open(&d->cfg, &d->ipc, err) < 0) ||
        (need_nccl && dc_nccl_open(&d->cfg, &d->nccl, err) < 0)) {
        devcomm_close(d);
        return -1;
    }
    *out = d;
    return 0;
#endif
}

void devcomm_close(devcomm *d) {
    if (!d) return;
#ifdef PPRUN_HAVE_CUDA
    dc_nccl_close(d->nccl);
    dc_ipc_close(d->ipc);
#endif
    free(d->kind);
    free(d);
}

/* ---- messages ------------------------------------------------------------- */

static int check_peer(const devcomm *d, int peer, const char *op, pp_err *err) {
    if (!d) return pp_fail(err, "devcomm: %s on a devcomm that is not open", op);
    return comm_check_peer(d->cfg.host, peer, "devcomm", op, err);
}

/* Directions 8..15 are devcomm's own on the host comm (COMM_DIR_DEVDATA). */
static int check_tag(uint64_t tag, const char *op, pp_err *err) {
    char ts[128];
    if (tag & COMM_DIR_DEVDATA)
        return pp_fail(err, "devcomm: %s of %s: directions 8..15 are reserved for devcomm's control messages", op,
                       comm_tag_str(tag & ~(uint64_t)COMM_DIR_DEVDATA, ts, sizeof ts));
    return 0;
}

int devcomm_send(devcomm *d, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    if (check_peer(d, peer, "send", err) < 0 || check_tag(tag, "send", err) < 0) return -1;
    if (!dev && len) return pp_fail(err, "devcomm: send of %zu bytes to rank %d: NULL buffer", len, peer);
#ifdef PPRUN_HAVE_CUDA
    return d->kind[peer] == DC_IPC ? dc_ipc_send(d->ipc, peer, tag, dev, len, err)
                                   : dc_nccl_send(d->nccl, peer, tag, dev, len, err);
#else
    (void)tag;
    return pp_fail(err, "devcomm: this pprun was built without the GPU backend");
#endif
}

int devcomm_recv(devcomm *d, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err) {
    if (check_peer(d, peer, "recv", err) < 0 || check_tag(tag, "recv", err) < 0) return -1;
    if (!dev && len) return pp_fail(err, "devcomm: recv of %zu bytes from rank %d: NULL buffer", len, peer);
#ifdef PPRUN_HAVE_CUDA
    return d->kind[peer] == DC_IPC ? dc_ipc_recv(d->ipc, peer, tag, dev, len, timeout_ms, err)
                                   : dc_nccl_recv(d->nccl, peer, tag, dev, len, timeout_ms, err);
#else
    (void)tag;
    (void)timeout_ms;
    return pp_fail(err, "devcomm: this pprun was built without the GPU backend");
#endif
}

int devcomm_flush(devcomm *d, int timeout_ms, pp_err *err) {
    if (!d) return pp_fail(err, "devcomm: flush on a devcomm that is not open");
#ifdef PPRUN_HAVE_CUDA
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    if (d->ipc && dc_ipc_flush(d->ipc, deadline, timeout_ms, err) < 0) return -1;
    if (d->nccl && dc_nccl_flush(d->nccl, deadline, timeout_ms, err) < 0) return -1;
    return 0;
#else
    (void)timeout_ms;
    return pp_fail(err, "devcomm: this pprun was built without the GPU backend");
#endif
}

const char *devcomm_transport_name(const devcomm *d, int peer) {
    if (!d || peer < 0 || peer >= d->cfg.host->world) return "none";
    return d->kind[peer] == DC_IPC ? "cuda-ipc" : d->kind[peer] == DC_NCCL ? "nccl" : "self";
}
