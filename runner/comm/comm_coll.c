/* comm_coll.c: the reduce-scatter in a fixed order and the all-gather
 * (comm_coll.h), each member talking to every other directly: both move
 * (n-1)/n of the vector into and out of every member, as a ring does, in one
 * round rather than n-1. One code for host and device memory: the few
 * helpers below (send, receive, shard buffers, add, copy) are the only
 * places that look at g->dev. */
#include "runner/comm/comm_coll.h"

#include <stdlib.h>
#include <string.h>

static uint64_t part_tag(uint64_t tag, int k) { return tag + ((uint64_t)k << 4); }

static int check_group(const coll_group *g, const char *op, pp_err *err) {
    if ((g->dev ? !g->dev->dc : !g->c) || g->n < 1 || g->me < 0 || g->me >= g->n)
        return pp_fail(err, "coll: %s: member %d of a group of %d", op, g->me, g->n);
    return 0;
}

/* ---- the group's memory: host over comm, or device over devcomm ------------ */

static int send_to(const coll_group *g, int j, uint64_t tag, const float *p, size_t n, pp_err *err) {
    size_t bytes = sizeof(float) * n;
    return g->dev ? devcomm_send(g->dev->dc, g->ranks[j], tag, p, bytes, err)
                  : comm_send(g->c, g->ranks[j], tag, p, bytes, err);
}

static int recv_from(const coll_group *g, int j, uint64_t tag, float *p, size_t n, pp_err *err) {
    size_t bytes = sizeof(float) * n;
    return g->dev ? devcomm_recv(g->dev->dc, g->ranks[j], tag, p, bytes, g->timeout_ms, err)
                  : comm_recv(g->c, g->ranks[j], tag, p, bytes, g->timeout_ms, err);
}

static float *shard_alloc(const coll_group *g, size_t floats, pp_err *err) {
    size_t bytes = sizeof(float) * (floats ? floats : 1);
    if (g->dev) return g->dev->alloc(g->dev->ctx, bytes, err);
    float *p = malloc(bytes);
    if (!p) pp_fail(err, "coll: out of memory for a shard of %zu floats", floats);
    return p;
}

static void shard_release(const coll_group *g, float *p) {
    if (g->dev)
        g->dev->release(g->dev->ctx, p);
    else
        free(p);
}

static int shard_add(const coll_group *g, float *left, const float *right, size_t n, pp_err *err) {
    if (g->dev) return g->dev->add(g->dev->ctx, left, right, n, err);
    for (size_t x = 0; x < n; x++) left[x] += right[x];
    return 0;
}

static int shard_copy(const coll_group *g, float *dst, const float *src, size_t n, pp_err *err) {
    if (g->dev) return g->dev->copy(g->dev->ctx, dst, src, n, err);
    memcpy(dst, src, sizeof(float) * n);
    return 0;
}

/* ---- the collectives -------------------------------------------------------- */

int coll_reduce_scatter_send(const coll_group *g, float *const *parts, int nparts, size_t len, uint64_t tag,
                             pp_err *err) {
    if (check_group(g, "reduce-scatter", err) != 0) return -1;
    if (nparts < 1 || nparts > COLL_MAX_PARTS)
        return pp_fail(err, "coll: reduce-scatter of %d parts (1 .. %d)", nparts, COLL_MAX_PARTS);
    for (int j = 0; j < g->n; j++) {
        if (j == g->me) continue;
        size_t lo = coll_shard_lo(len, g->n, j), hi = coll_shard_lo(len, g->n, j + 1);
        for (int k = 0; k < nparts; k++)
            if (send_to(g, j, part_tag(tag, k), parts[k] + lo, hi - lo, err) != 0)
                return pp_wrap(err, "reduce-scatter: sending part %d of shard %d to rank %d", k, j, g->ranks[j]);
    }
    return 0;
}

/* Shard-sized buffers for the parts received: at most the program's stack
 * depth are live at once, and a free one is reused. Owned by the call. */
typedef struct shard_bufs {
    const coll_group *g;
    float **free;
    int nfree, cap;
    size_t floats;
} shard_bufs;

static float *buf_get(shard_bufs *b, pp_err *err) {
    if (b->nfree > 0) return b->free[--b->nfree];
    return shard_alloc(b->g, b->floats, err);
}

static void buf_put(shard_bufs *b, float *p) {
    if (b->nfree == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        float **f = realloc(b->free, sizeof *f * (size_t)cap);
        if (!f) {
            shard_release(b->g, p);
            return;
        }
        b->free = f, b->cap = cap;
    }
    b->free[b->nfree++] = p;
}

int coll_reduce_scatter_reduce(const coll_group *g, const coll_order *order, float *const *parts, size_t len,
                               float *out, uint64_t tag, pp_err *err) {
    if (check_group(g, "reduce-scatter", err) != 0) return -1;
    size_t lo = coll_shard_lo(len, g->n, g->me), n = coll_shard_lo(len, g->n, g->me + 1) - lo;
    /* A stack entry is a shard: this member's own (in its part, written in
     * place) or one received into a buffer of ours (owned, mine[] = 1). */
    float **stack = malloc(sizeof *stack * (size_t)(order->nsteps > 0 ? order->nsteps : 1));
    char *mine = malloc((size_t)(order->nsteps > 0 ? order->nsteps : 1));
    shard_bufs bufs = {.g = g, .floats = n};
    int depth = 0, leaf = 0, rc = stack && mine ? 0 : pp_fail(err, "coll: out of memory");
    for (int i = 0; rc == 0 && i < order->nsteps; i++) {
        if (order->steps[i] != COLL_ADD) {
            int o = order->owner[leaf], k = order->part[leaf];
            leaf++;
            if (o < 0 || o >= g->n || k < 0 || k >= COLL_MAX_PARTS) {
                rc = pp_fail(err, "coll: the order's leaf %d names member %d, part %d", leaf - 1, o, k);
                break;
            }
            if (o == g->me) {
                stack[depth] = parts[k] + lo, mine[depth++] = 0;
                continue;
            }
            float *b = buf_get(&bufs, err);
            if (!b) {
                rc = -1;
                break;
            }
            if (recv_from(g, o, part_tag(tag, k), b, n, err) != 0) {
                shard_release(g, b);
                rc = pp_wrap(err, "reduce-scatter: receiving part %d of shard %d from rank %d", k, g->me,
                             g->ranks[o]);
                break;
            }
            stack[depth] = b, mine[depth++] = 1;
            continue;
        }
        if (depth < 2) {
            rc = pp_fail(err, "coll: the order adds with %d on the stack", depth);
            break;
        }
        float *right = stack[--depth], *left = stack[depth - 1];
        rc = shard_add(g, left, right, n, err);
        if (mine[depth]) buf_put(&bufs, right);
    }
    if (rc == 0 && depth != 1) rc = pp_fail(err, "coll: the order leaves %d sums, not one", depth);
    if (rc == 0) rc = shard_copy(g, out + lo, stack[0], n, err);
    for (int i = 0; stack && mine && i < depth; i++)
        if (mine[i]) shard_release(g, stack[i]);
    for (int i = 0; i < bufs.nfree; i++) shard_release(g, bufs.free[i]);
    free(bufs.free), free(stack), free(mine);
    return rc;
}

int coll_reduce_scatter_buffers(const coll_order *order, int me) {
    char *theirs = malloc((size_t)(order->nsteps > 0 ? order->nsteps : 1)); /* the stack: 1 = a received part */
    if (!theirs) return -1;
    int depth = 0, leaf = 0, live = 0, most = 0;
    for (int i = 0; i < order->nsteps; i++) {
        if (order->steps[i] != COLL_ADD) {
            theirs[depth] = order->owner[leaf++] != me;
            live += theirs[depth++];
            most = live > most ? live : most;
        } else if (depth >= 2) {
            live -= theirs[--depth]; /* the right one's buffer is free again; the sum stays in the left */
        }
    }
    free(theirs);
    return most;
}

int coll_all_gather(const coll_group *g, float *buf, size_t len, uint64_t tag, pp_err *err) {
    if (check_group(g, "all-gather", err) != 0) return -1;
    size_t lo = coll_shard_lo(len, g->n, g->me), hi = coll_shard_lo(len, g->n, g->me + 1);
    for (int j = 0; j < g->n; j++)
        if (j != g->me && send_to(g, j, tag, buf + lo, hi - lo, err) != 0)
            return pp_wrap(err, "all-gather: sending shard %d to rank %d", g->me, g->ranks[j]);
    for (int j = 0; j < g->n; j++) {
        if (j == g->me) continue;
        size_t jlo = coll_shard_lo(len, g->n, j), jhi = coll_shard_lo(len, g->n, j + 1);
        if (recv_from(g, j, tag, buf + jlo, jhi - jlo, err) != 0)
            return pp_wrap(err, "all-gather: receiving shard %d from rank %d", j, g->ranks[j]);
    }
    return 0;
}
