/* comm_coll.h: collectives over point-to-point messages: the
 * data-parallel gradient reduction in a fixed order, and the all-gather
 * (docs/comm.md, "Collectives"), on host memory over comm or on device
 * memory over devcomm.
 *
 * A group is a few ranks of a comm (a data-parallel group: the ranks that
 * hold the same stages). A vector of `len` floats is cut into one shard per
 * member, member j owning floats [coll_shard_lo(len, n, j),
 * coll_shard_lo(len, n, j + 1)).
 *
 * The reduction's order is not the transport's: every member contributes
 * one or more vectors (its "parts"), every part's shard j travels to member
 * j, and member j adds them along a program given by the caller (the
 * gradient tree, runner/model/model_tree.h), so the sum has the same bits
 * whoever sends first and whatever the group's size. A ring's running sum
 * would fix another order for every shard (its first addend is the
 * shard's neighbour), which no one-rank run shares. Sends never wait (comm
 * buffers them); each member receives in the program's order, while comm's
 * reader threads take everything in as it comes.
 *
 * Memory: a group's vectors are host memory moved by comm, or, with
 * coll_group.dev set, device memory of this rank's GPU moved by devcomm
 * (GPU to GPU, no trip through the host). The same code runs both, so the
 * order above is one contract: only where a shard lives, how it travels,
 * and who adds two shards differ. The comm layer computes on no GPU, so the
 * caller lends the device ops (coll_device: the GPU model's kernels; their
 * float add is the host's, so the sums have the same bits).
 *
 * Thread-safety: comm's and devcomm's calls may run in several threads of
 * one rank (comm's locks are per peer; devcomm.h says how many of its), so
 * a collective may run in a thread of its own while the engine sends and
 * receives activations; the tags keep them apart. */
#ifndef PP_COMM_COLL_H
#define PP_COMM_COLL_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"
#include "runner/comm/comm.h"
#include "runner/comm/devcomm.h"

/* Device memory (coll_group.dev): the transport and the ops on shards that
 * the reduce-scatter needs, on this rank's GPU. Each op returns with its
 * work complete: a buffer an add has read may be received into next (by
 * devcomm, on a stream of its own). Called from the collective's thread. */
typedef struct coll_device {
    devcomm *dc;
    void *ctx; /* the ops' first argument */
    /* A device buffer of at least `bytes` (>= 1), owned by the collective
     * until it hands it back with release; NULL with err filled. */
    void *(*alloc)(void *ctx, size_t bytes, pp_err *err);
    void (*release)(void *ctx, void *buf);
    int (*add)(void *ctx, float *left, const float *right, size_t n, pp_err *err); /* left[i] += right[i] */
    int (*copy)(void *ctx, float *dst, const float *src, size_t n, pp_err *err); /* dst[i] = src[i] */
} coll_device;

typedef struct coll_group {
    comm *c;                /* host memory; unused with dev */
    int n;                  /* members */
    const int *ranks;       /* [n]: their ranks in c (or in dev->dc: the same ranks) */
    int me;                 /* this rank's index in ranks */
    int timeout_ms;         /* for each receive (a negative one waits forever) */
    const coll_device *dev; /* NULL: host memory over c; else every vector is device memory, over dev->dc */
} coll_group;

/* floor(len·j / n), without overflow: shards differ by at most one float. */
static inline size_t coll_shard_lo(size_t len, int n, int j) {
    return len / (size_t)n * (size_t)j + len % (size_t)n * (size_t)j / (size_t)n;
}

/* The order of a reduction: a program over leaves (steps >= 0 push the
 * next leaf, COLL_ADD adds the top two, as model_tree.h's), and for leaf l
 * the member that owns it (owner[l]) and its index among that member's
 * parts (part[l]). */
#define COLL_ADD (-1)
typedef struct coll_order {
    int nsteps;
    const int *steps;
    const int *owner, *part;
} coll_order;

/* Tags. The caller names each collective by a tag whose bits 4..10 (the
 * low 7 bits of comm_tag's microbatch field) are 0; the reduce-scatter
 * numbers its messages there (part k travels as tag + (k << 4), at most
 * COLL_MAX_PARTS parts per member). Tags of the collectives that may be in
 * flight between two members at once must differ in their other bits. */
#define COLL_MAX_PARTS 128

/* Every vector below (parts, out, buf) is in the group's memory: host, or
 * device with g->dev. */

/* Reduce-scatter, first half: sends shard j of each of this member's
 * parts (nparts vectors of len floats) to member j. Returns at once. */
int coll_reduce_scatter_send(const coll_group *g, float *const *parts, int nparts, size_t len, uint64_t tag,
                             pp_err *err);
/* Second half: receives every other member's parts of this member's shard
 * and adds them, with its own, along `order`; the sum goes to out's shard
 * (out: len floats, only this member's shard written; it may not be one of
 * the parts). Overwrites this member's shard of its own parts. Errors name
 * the member waited for (comm's: the rank died, timed out). */
int coll_reduce_scatter_reduce(const coll_group *g, const coll_order *order, float *const *parts, size_t len,
                               float *out, uint64_t tag, pp_err *err);
/* The most shard buffers coll_reduce_scatter_reduce holds at once as
 * member `me` (other members' parts on the order's stack; a freed one is
 * reused): how many a caller that lends device buffers can make before the
 * first collective. 0 for an order that is no program (the reduce says
 * what is wrong with it); -1 out of memory. */
int coll_reduce_scatter_buffers(const coll_order *order, int me);
/* All-gather: this member's shard of buf goes to every member, and every
 * other member's shard arrives in buf: on return buf is the same
 * everywhere. */
int coll_all_gather(const coll_group *g, float *buf, size_t len, uint64_t tag, pp_err *err);

#endif
