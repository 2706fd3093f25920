/* test_dp_coll.c: the data-parallel collective (runner/comm/comm_coll.h)
 * between real processes over shared memory and TCP: the reduce-scatter in
 * the gradient tree's order followed by the all-gather gives every member
 * the one-replica tree sum bit for bit, for groups of 2 to 4 with one or
 * several parts each, shards of uneven and zero length; it runs in a thread
 * beside point-to-point traffic with the same peers; and a member that dies
 * in the middle fails the others promptly, naming it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers/comm_world.h"
#include "runner/comm/comm_coll.h"
#include "runner/model/model_tree.h"

/* Leaf (microbatch) i's vector: floats of mixed magnitude, so that the
 * order of additions shows in the bits. */
static void leaf(float *v, size_t n, int i) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (size_t k = 0; k < n; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[k] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * ((k + (size_t)i) % 3 ? 1.0f : 1e-6f);
    }
}

/* Runs a tree program over vectors: leaves pushed from get(ctx, i). */
static float *run_tree(const int *steps, int nsteps, size_t n, float *(*get)(void *, int), void *ctx) {
    float *stack[64];
    int depth = 0, next = 0;
    for (int i = 0; i < nsteps; i++) {
        if (steps[i] != MODEL_TREE_ADD) {
            stack[depth++] = get(ctx, next++);
            continue;
        }
        float *r = stack[--depth], *l = stack[depth - 1];
        for (size_t k = 0; k < n; k++) l[k] += r[k];
        free(r);
    }
    return stack[0];
}

typedef struct leaves_ctx {
    size_t n;
    int base;
} leaves_ctx;
static float *get_leaf(void *p, int i) {
    leaves_ctx *c = p;
    float *v = malloc(sizeof(float) * (c->n ? c->n : 1));
    leaf(v, c->n, c->base + i);
    return v;
}

typedef struct case_arg {
    int m;       /* microbatches per member */
    size_t len;  /* floats per vector */
    int die;     /* a member that exits after its sends (-1: none) */
    int threads; /* run the collective in a thread beside point-to-point traffic */
} case_arg;

/* The replica's parts: its m leaves along its replica program (several
 * stay on the stack when m is not a power of two). */
static int replica_parts(int D, int m, int r, size_t n, float **parts) {
    int steps[256];
    int ns = model_tree_replica_program(D * m, r * m, r * m + m, steps, 256);
    float *stack[64];
    int depth = 0, next = 0;
    for (int i = 0; i < ns; i++) {
        if (steps[i] != MODEL_TREE_ADD) {
            stack[depth] = malloc(sizeof(float) * (n ? n : 1));
            leaf(stack[depth++], n, r * m + next++);
            continue;
        }
        float *rt = stack[--depth], *l = stack[depth - 1];
        for (size_t k = 0; k < n; k++) l[k] += rt[k];
        free(rt);
    }
    for (int i = 0; i < depth; i++) parts[i] = stack[i];
    return depth;
}

typedef struct coll_job {
    coll_group g;
    coll_order order;
    float **parts;
    int nparts;
    float *out;
    size_t len;
    int die;
    int rc;
    pp_err err;
} coll_job;

static void *coll_main(void *p) {
    coll_job *j = p;
    uint64_t tag = comm_tag(7, 3, 0, COMM_DIR_COLL);
    j->rc = coll_reduce_scatter_send(&j->g, j->parts, j->nparts, j->len, tag, &j->err);
    if (j->rc == 0 && j->die == j->g.me) { /* dies with its parts delivered, its shard never reduced */
        comm_flush(j->g.c, 10000, &j->err);
        _exit(3);
    }
    if (j->rc == 0) j->rc = coll_reduce_scatter_reduce(&j->g, &j->order, j->parts, j->len, j->out, tag, &j->err);
    if (j->rc == 0) j->rc = coll_all_gather(&j->g, j->out, j->len, comm_tag(7, 3, 1 << 7, COMM_DIR_COLL), &j->err);
    return NULL;
}

/* Point-to-point messages with every peer while the collective runs. */
static int chatter(comm *c, int rank, int world, pp_err *rep) {
    for (int round = 0; round < 50; round++) {
        for (int p = 0; p < world; p++) {
            if (p == rank) continue;
            int v = rank * 1000 + round;
            if (comm_send(c, p, comm_tag((uint64_t)round, 0, 0, COMM_DIR_ACT), &v, sizeof v, rep) != 0) return -1;
        }
        for (int p = 0; p < world; p++) {
            if (p == rank) continue;
            int v;
            if (comm_recv(c, p, comm_tag((uint64_t)round, 0, 0, COMM_DIR_ACT), &v, sizeof v, 20000, rep) != 0)
                return -1;
            if (v != p * 1000 + round) return pp_fail(rep, "chatter from rank %d: %d", p, v);
        }
    }
    return 0;
}

typedef struct world_arg {
    case_arg c;
    int D;
} world_arg;

static int group_fn(comm *c, int rank, void *arg, pp_err *rep) {
    const world_arg *w = arg;
    int D = w->D, m = w->c.m;
    size_t n = w->c.len;
    int ranks[8];
    for (int i = 0; i < D; i++) ranks[i] = i;
    int steps[1024], owner[1024], part[1024];
    int ns = model_tree_combine_program(D, m, steps, owner, part, 1024);
    if (ns < 0) return pp_fail(rep, "no combine program");
    coll_job j = {
        .g = {.c = c, .n = D, .ranks = ranks, .me = rank, .timeout_ms = 20000},
        .order = {ns, steps, owner, part},
        .len = n,
        .die = w->c.die,
    };
    float *parts[64];
    j.nparts = replica_parts(D, m, rank, n, parts);
    j.parts = parts;
    j.out = calloc(n ? n : 1, sizeof(float));
    int rc = 0;
    if (w->c.threads) {
        pthread_t t;
        pthread_create(&t, NULL, coll_main, &j);
        rc = chatter(c, rank, D, rep);
        pthread_join(t, NULL);
    } else {
        coll_main(&j);
    }
    if (rc == 0 && j.rc != 0) {
        *rep = j.err;
        rc = -1;
    }
    if (rc == 0) {
        int one[2048];
        int ns1 = model_tree_replica_program(D * m, 0, D * m, one, 2048);
        leaves_ctx lc = {n, 0};
        float *want = run_tree(one, ns1, n, get_leaf, &lc);
        size_t k = 0;
        while (k < n && memcmp(&j.out[k], &want[k], sizeof(float)) == 0) k++;
        if (k < n) rc = pp_fail(rep, "float %zu of %zu is %.9g, the one-replica tree gives %.9g", k, n, j.out[k], want[k]);
        free(want);
    }
    for (int i = 0; i < j.nparts; i++) free(parts[i]);
    free(j.out);
    return rc;
}

static void expect_ok(const cw_result *r, int world) {
    for (int i = 0; i < world; i++)
        cr_assert(r->exited[i] && r->code[i] == 0, "rank %d: %s %d: %s", i, r->exited[i] ? "exit" : "signal",
                  r->code[i], r->report[i]);
}

static void sums_equal_the_tree(const char *transport) {
    struct { int D, m; size_t len; } cases[] = {
        {2, 1, 1001}, {2, 3, 1001}, {3, 2, 4097}, {4, 1, 333}, {4, 3, 1000}, {3, 5, 2}, /* 2 floats, 3 shards */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        world_arg w = {{cases[i].m, cases[i].len, -1, 0}, cases[i].D};
        cw_result r;
        cr_assert_eq(cw_run(w.D, NULL, transport, group_fn, &w, &r), 0);
        expect_ok(&r, w.D);
    }
}
Test(dp_coll_shm, reduce_scatter_and_all_gather_give_the_tree_sum_bit_for_bit) { sums_equal_the_tree("shm"); }
Test(dp_coll_tcp, reduce_scatter_and_all_gather_give_the_tree_sum_bit_for_bit) { sums_equal_the_tree("tcp"); }

Test(dp_coll_shm, a_collective_in_a_thread_beside_point_to_point_traffic) {
    world_arg w = {{2, 70000, -1, 1}, 3};
    cw_result r;
    cr_assert_eq(cw_run(3, NULL, "shm", group_fn, &w, &r), 0);
    expect_ok(&r, 3);
}

Test(dp_coll_shm, a_member_that_dies_fails_the_others_naming_it) {
    world_arg w = {{1, 4096, 2, 0}, 3};
    cw_result r;
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(cw_run(3, NULL, "shm", group_fn, &w, &r), 0);
    cr_assert(pp_now_ns() - t0 < 15000000000ull, "the survivors waited for their timeout");
    cr_assert(r.exited[2] && r.code[2] == 3);
    /* Both fail; the first to notice names rank 2 (the other may name the
     * first, which closed its channel on failing). */
    int named = 0;
    for (int i = 0; i < 2; i++) {
        cr_assert(r.exited[i] && r.code[i] != 0, "rank %d survived a dead member", i);
        cr_assert(strstr(r.report[i], "all-gather: ") || strstr(r.report[i], "reduce-scatter: "),
                  "rank %d: %s", i, r.report[i]);
        named += strstr(r.report[i], "rank 2") && (strstr(r.report[i], "died") || strstr(r.report[i], "gone"));
    }
    cr_assert(named >= 1, "no survivor names rank 2: %s | %s", r.report[0], r.report[1]);
}

Test(dp_coll, shards_cover_the_vector) {
    for (size_t len = 0; len < 40; len++)
        for (int n = 1; n <= 7; n++) {
            cr_assert_eq(coll_shard_lo(len, n, 0), 0);
            cr_assert_eq(coll_shard_lo(len, n, n), len);
            for (int j = 0; j < n; j++) {
                size_t sz = coll_shard_lo(len, n, j + 1) - coll_shard_lo(len, n, j);
                cr_assert(sz == len / (size_t)n || sz == len / (size_t)n + 1, "len %zu n %d shard %d: %zu", len, n, j,
                          sz);
            }
        }
}

/* The shard buffers a member's reduce-scatter holds at once (what the engine
 * makes on the device before the first step): the most received parts on
 * the order's stack at a time. The counts are those a device job really
 * allocated with these layouts (--pp 2 --dp 2 and --dp 4, 3 microbatches a
 * replica), none after the engine's prefill. */
Test(dp_coll, reduce_scatter_buffers_count_the_received_parts_held_at_once) {
    int steps[64], owner[64], part[64];
    static const struct { int D, m, want[4]; } cases[] = {
        {2, 1, {1, 1}}, /* the two leaves, then their sum: one received part on either member */
        {2, 3, {1, 2}},
        {4, 3, {2, 3, 3, 3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = model_tree_combine_program(cases[c].D, cases[c].m, steps, owner, part, 64);
        cr_assert_gt(n, 0);
        coll_order o = {n, steps, owner, part};
        for (int me = 0; me < cases[c].D; me++)
            cr_expect_eq(coll_reduce_scatter_buffers(&o, me), cases[c].want[me], "D %d, m %d, member %d: %d",
                         cases[c].D, cases[c].m, me, coll_reduce_scatter_buffers(&o, me));
    }
    coll_order none = {0, steps, owner, part};
    cr_expect_eq(coll_reduce_scatter_buffers(&none, 0), 0);
}
