/* comm_coll.c: the reduce-scatter in a fixed order and the all-gather
 * (comm_coll.h), each member talking to every other directly: both move
 * (n-1)/n of the vector into and out of every member, as a ring does, in one
 * round rather than n-1. */
#include "runner/comm/comm_coll.h"

#include <stdlib.h>
#include <string.h>

static uint64_t part_tag(uint64_t tag, int k) { return tag + ((uint64_t)k << 4); }

static int check_group(const coll_group *g, const char *op, pp_err *err) {
    if (!g->c || g->n < 1 || g->me < 0 || g->me >= g->n)
        return pp_fail(err, "coll: %s: member %d of a group of %d", op, g->me, g->n);
    return 0;
}

int coll_reduce_scatter_send(const coll_group *g, float *const *parts, int nparts, size_t len, uint64_t tag,
                             pp_err *err) {
    if (check_group(g, "reduce-scatter", err) != 0) return -1;
    if (nparts < 1 || nparts > COLL_MAX_PARTS)
        return pp_fail(err, "coll: reduce-scatter of %d parts (1 .. %d)", nparts, COLL_MAX_PARTS);
    for (int j = 0; j < g->n; j++) {
        if (j == g->me) continue;
        size_t lo = coll_shard_lo(len, g->n, j), hi = coll_shard_lo(len, g->n, j + 1);
        for (int k = 0; k < nparts; k++)
            if (comm_send(g->c, g->ranks[j], part_tag(tag, k), parts[k] + lo, sizeof(float) * (hi - lo), err) != 0)
                return pp_wrap(err, "reduce-scatter: sending part %d of shard %d to rank %d", k, j, g->ranks[j]);
    }
    return 0;
}

/* Shard-sized buffers for the parts received: at most the program's stack
 * depth are live at once, and a free one is reused. Owned by the call. */
typedef struct shard_bufs {
    float **free;
    int nfree, cap;
    size_t floats;
} shard_bufs;

static float *buf_get(shard_bufs *b) {
    if (b->nfree > 0) return b->free[--b->nfree];
    return malloc(sizeof(float) * (b->floats ? b->floats : 1));
}

static void buf_put(shard_bufs *b, float *p) {
    if (b->nfree == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        float **f = realloc(b->free, sizeof *f * (size_t)cap);
        if (!f) {
            free(p);
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
    shard_bufs bufs = {.floats = n};
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
            float *b = buf_get(&bufs);
            if (!b) {
                rc = pp_fail(err, "coll: out of memory for a shard of %zu floats", n);
                break;
            }
            if (comm_recv(g->c, g->ranks[o], part_tag(tag, k), b, sizeof(float) * n, g->timeout_ms, err) != 0) {
                free(b);
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
        for (size_t x = 0; x < n; x++) left[x] += right[x];
        if (mine[depth]) buf_put(&bufs, right);
    }
    if (rc == 0 && depth != 1) rc = pp_fail(err, "coll: the order leaves %d sums, not one", depth);
    if (rc == 0) memcpy(out + lo, stack[0], sizeof(float) * n);
    for (int i = 0; stack && mine && i < depth; i++)
        if (mine[i]) free(stack[i]);
    for (int i = 0; i < bufs.nfree; i++) free(bufs.free[i]);
    free(bufs.free), free(stack), free(mine);
    return rc;
}

int coll_all_gather(const coll_group *g, float *buf, size_t len, uint64_t tag, pp_err *err) {
    if (check_group(g, "all-gather", err) != 0) return -1;
    size_t lo = coll_shard_lo(len, g->n, g->me), hi = coll_shard_lo(len, g->n, g->me + 1);
    for (int j = 0; j < g->n; j++)
        if (j != g->me && comm_send(g->c, g->ranks[j], tag, buf + lo, sizeof(float) * (hi - lo), err) != 0)
            return pp_wrap(err, "all-gather: sending shard %d to rank %d", g->me, g->ranks[j]);
    for (int j = 0; j < g->n; j++) {
        if (j == g->me) continue;
        size_t jlo = coll_shard_lo(len, g->n, j), jhi = coll_shard_lo(len, g->n, j + 1);
        if (comm_recv(g->c, g->ranks[j], tag, buf + jlo, sizeof(float) * (jhi - jlo), g->timeout_ms, err) != 0)
            return pp_wrap(err, "all-gather: receiving shard %d from rank %d", j, g->ranks[j]);
    }
    return 0;
}
