/* model_tree.h: the order in which a step's microbatch gradients are added
 * (docs/model.md, "Numerics contract"), as programs a stage and the
 * data-parallel collective both run.
 *
 * The step's gradient is the sum of the N = replicas·m microbatch gradients
 * g_0 .. g_{N-1} (global microbatch index) along one fixed binary tree:
 *
 *     T(lo, hi) = g_lo                                 when hi - lo = 1
 *               = T(lo, mid) + T(mid, hi)              mid = lo + the largest power of two below hi - lo
 *
 * Its left subtrees are aligned power-of-two blocks. It depends on N only:
 * not on the schedule, the partition, nor on how the N microbatches are
 * split into replicas. Replica d runs global microbatches [d·m, d·m + m);
 * it adds them into the sums of the maximal tree nodes inside that block
 * (its "parts": one node when m is a power of two), and the collective adds
 * every replica's parts along the tree above them, so the result is T(0, N)
 * bit for bit, whatever the replicas (float addition is commutative, so only
 * the tree's shape matters, never which operand is on the left).
 *
 * A program is an array of steps run on a stack of vectors: a step >= 0
 * pushes the next leaf (leaves are pushed in order 0, 1, 2, ...; the step's
 * value is that leaf's index), MODEL_TREE_ADD pops the top two and pushes
 * their sum. Both programs below push every leaf once, in order, so they
 * can run while the leaves arrive. */
#ifndef PP_MODEL_TREE_H
#define PP_MODEL_TREE_H

#define MODEL_TREE_ADD (-1)

/* Steps of a program over n leaves: n pushes and at most n - 1 adds. */
static inline int model_tree_max_steps(int nleaves) { return 2 * nleaves; }

/* The parts of global microbatches [lo, hi) of a step of `total`: the
 * maximal nodes of T(0, total) inside it, in order. Writes at most `cap`
 * nodes as lo_of[i], hi_of[i]; returns how many there are (more than cap:
 * only cap written), -1 for a range outside 0..total. */
int model_tree_parts(int total, int lo, int hi, int *lo_of, int *hi_of, int cap);

/* A replica's program: its microbatches lo .. hi-1 as leaves 0 .. hi-lo-1,
 * added along T(0, total) into its parts, which stay on the stack in order.
 * Returns the number of steps (at most model_tree_max_steps(hi - lo)) or -1
 * when they do not fit in cap or the range is bad. */
int model_tree_replica_program(int total, int lo, int hi, int *steps, int cap);

/* The collective's program: every replica's parts (replicas of m microbatches
 * each; replica 0's parts first, in order, then replica 1's ...) as leaves,
 * added along T(0, replicas·m) into one sum. owner[leaf] gets the replica of
 * each leaf and part[leaf] its index among that replica's parts (both at
 * least `cap` long). Returns the number of steps or -1 (cap too small). */
int model_tree_combine_program(int replicas, int m, int *steps, int *owner, int *part, int cap);

#endif
