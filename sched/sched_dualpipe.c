/* sched_dualpipe.c: DualPipeV, the one-direction ("V") variant of DeepSeek's
 * DualPipe (DeepSeek-V3 report, section 3.2; github.com/deepseek-ai/DualPipe)
 * in the order PyTorch's ScheduleDualPipeV gives each rank. Two chunks per
 * rank in V placement, as ZB-V; in the steady state every step of a rank is
 * an overlapped pair: the F of one chunk and the full backward (BW) of the
 * other, run at the same time (sched_plan.overlap). docs/schedules.md,
 * "DualPipeV", shows its grid and timeline and says how the lists were
 * checked against PyTorch's. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <stdlib.h>

/* One rank's list as it is built, and what PyTorch's builder counts: the
 * next microbatch of each chunk's F and backward (a B or a BW: they share
 * one count), and the pending W of the B run so far, oldest first. */
typedef struct dpv {
    sched_action *a;
    unsigned char *ov; /* [n]: the first half of a pair */
    int n;
    int stage[2];     /* the rank's chunk 0 and chunk 1 */
    int nf[2], nb[2]; /* per chunk: the next F's and the next backward's microbatch */
    int *wq, wh, wt;  /* FIFO of pending W, as chunk * m + mb */
    int m;
} dpv;

static void put(dpv *d, int chunk, int op, int mb, int overlap) {
    d->ov[d->n] = (unsigned char)overlap;
    d->a[d->n++] = (sched_action){d->stage[chunk], op, mb};
}

static void f(dpv *d, int chunk) { put(d, chunk, SCHED_F, d->nf[chunk]++, 0); }

/* A backward of the chunk's next microbatch: a BW, or a B whose W waits
 * in the queue (split: PyTorch's BACKWARD_INPUT). */
static void backward(dpv *d, int chunk, int split) {
    int mb = d->nb[chunk]++;
    put(d, chunk, split ? SCHED_B : SCHED_BW, mb, 0);
    if (split) d->wq[d->wt++] = chunk * d->m + mb;
}

/* The oldest pending W, if any. */
static void w(dpv *d) {
    if (d->wh == d->wt) return;
    int k = d->wq[d->wh++];
    put(d, k / d->m, SCHED_W, k % d->m, 0);
}

/* F of chunk fc and BW of chunk bc at the same time. */
static void pair(dpv *d, int fc, int bc) {
    put(d, fc, SCHED_F, d->nf[fc]++, 1);
    put(d, bc, SCHED_BW, d->nb[bc]++, 0);
}

/* Rank r's list: eight phases, each a count of the same few actions. The
 * first chunk's F fill the pipeline, the chunks then alternate, the second
 * chunk's split backwards (their W deferred) bring its first gradients
 * back, then the main phase runs pairs F(0)+BW(1), F(1)+BW(0) (the last
 * rank's very first pair runs one after the other: its BW needs that F's
 * activation, a hand-off on the rank), and the drain splits the backwards
 * again so that deferred W fill what would be the cool-down's bubbles. */
static void gen_rank(dpv *d, int r, int p, int m) {
    for (int i = 0; i < 2 * (p - r - 1); i++) f(d, 0);
    for (int i = 0; i < r + 1; i++) f(d, 0), f(d, 1);
    for (int i = 0; i < p - r - 1; i++) backward(d, 1, 1), w(d), f(d, 1);
    for (int i = 0; i < m - 2 * p + r + 1; i++) {
        if (i == 0 && r == p - 1) f(d, 0), backward(d, 1, 0);
        else pair(d, 0, 1);
        pair(d, 1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) backward(d, 1, 0), pair(d, 1, 0);
    /* the second half of these backwards split (for odd ranks from chunk 1
     * on, for even ones from chunk 0 on), and all the later ones */
    int split = 0, half = (r + 1) / 2;
    for (int i = 0; i < r + 1; i++) {
        if (i == half && r % 2 == 1) split = 1;
        backward(d, 1, split);
        if (i == half && r % 2 == 0) split = 1;
        backward(d, 0, split);
    }
    for (int i = 0; i < p - r - 1; i++) w(d), backward(d, 0, split);
    for (int i = 0; i < r + 1; i++) w(d);
}

int sched_build_dualpipev(int p, int m, int v, sched_plan **out, pp_err *err) {
    *out = NULL;
    if (v != 2)
        return pp_fail(err, "dualpipev needs exactly two chunks per rank (--virtual-stages 2, V placement), got %d", v);
    if (m < 2 * p)
        return pp_fail(err, "dualpipev needs at least as many microbatches as stages (2 per rank, as PyTorch's "
                            "ScheduleDualPipeV): m=%d, %d stages on p=%d ranks", m, 2 * p, p);
    int S = 2 * p;
    if ((long)S * m * 3 > PP_SHAPE_MAX_ACTIONS)
        return pp_fail(err, "schedule too large: %d stages x %d microbatches x 3 ops is over " PP_SHAPE_MAX_ACTIONS_TEXT
                            " actions", S, m);
    int *stage_rank = malloc(sizeof(int) * (size_t)S), *lens = calloc((size_t)p, sizeof(int));
    sched_action **lists = calloc((size_t)p, sizeof *lists);
    unsigned char **ov = calloc((size_t)p, sizeof *ov);
    int *wq = malloc(sizeof(int) * (size_t)(2 * m));
    int rc = -1;
    if (!stage_rank || !lens || !lists || !ov || !wq) goto oom;
    for (int s = 0; s < S; s++) stage_rank[s] = sched_place(SCHED_PLACE_V, s, p);
    for (int r = 0; r < p; r++) {
        /* 2m F, and 2m backwards each with at most one W */
        lists[r] = malloc(sizeof(sched_action) * (size_t)(6 * m));
        ov[r] = malloc((size_t)(6 * m));
        if (!lists[r] || !ov[r]) goto oom;
        dpv d = {.a = lists[r], .ov = ov[r], .stage = {r, 2 * p - 1 - r}, .wq = wq, .m = m};
        gen_rank(&d, r, p, m);
        lens[r] = d.n;
    }
    rc = sched_plan_from_lists_ov("dualpipev", p, S, 2, m, stage_rank, lists, lens,
                                  (const unsigned char *const *)ov, out, err);
    goto done;
oom:
    pp_fail(err, "schedule dualpipev: out of memory");
done:
    for (int r = 0; r < p; r++) {
        if (lists) free(lists[r]);
        if (ov) free(ov[r]);
    }
    free(lists), free(ov), free(lens), free(stage_rank), free(wq);
    return rc;
}
