/* sched_validate.c: the validator: checks a plan against the rules of
 * docs/design.md §4 before anything runs it, and explains a rejection with the
 * grid, the offending cells marked. A BW counts as its (stage, mb)'s B and
 * its W: once, after the F, waiting for the next stage's B (or BW) as a B.
 * An overlapped pair is an F and a B or BW of two stages of its rank; its
 * halves wait for their inputs each on its own, and the rank goes on once
 * both ran. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slot (grid column) of actions[r][i]: the i-th non-idle cell of row r. */
int sched_slot_of(const sched_plan *plan, int r, int i) {
    int seen = 0;
    for (int c = 0; c < plan->nslots; c++) {
        if (plan->slots[r][c].stage < 0) continue;
        if (seen++ == i) return c;
    }
    return -1;
}

/* Fills err with "schedule NAME rejected: rule 'RULE': DETAIL" and the grid
 * around the marked cells, trimmed so it fits in the message. */
int sched_reject(const sched_plan *plan, pp_err *err, const int *marks, const char *rule, const char *detail) {
    if (!err) return -1;
    int n = snprintf(err->msg, sizeof err->msg, "schedule %s rejected: rule '%s': %s\n", plan->name, rule, detail);
    if (n < 0 || (size_t)n >= sizeof err->msg) return -1;
    size_t room = sizeof err->msg - (size_t)n - 1;
    /* Shrink the window until the grid fits in what is left. */
    int width = 7; /* a cell: "15W31" plus brackets */
    for (int rows = plan->ranks < 8 ? plan->ranks : 8; rows >= 1; rows = rows > 4 ? rows - 2 : rows - 1) {
        int cols = (int)(room / (size_t)rows) / width - 3;
        if (cols < 3) continue;
        if (cols > 32) cols = 32;
        for (; cols >= 3; cols -= 2) {
            char *grid = sched_grid_text(plan, marks, cols, rows);
            if (!grid) return -1;
            size_t len = strlen(grid);
            if (len <= room) {
                memcpy(err->msg + n, grid, len + 1);
                while (len > 0 && err->msg[n + (int)len - 1] == '\n') err->msg[n + (int)--len] = '\0';
                free(grid);
                return -1;
            }
            free(grid);
        }
    }
    return -1;
}

static const char *const op_name[] = {"F", "B", "W", "BW"};

/* What the rules share: the plan, where each (stage, mb, op) runs, and the
 * cells a rejection marks (one per row). Owns the arrays. */
typedef struct checker {
    const sched_plan *plan;
    size_t nkeys; /* stages * microbatches * 3 */
    int *marks;   /* [ranks]: the slot marked on each row, -1 for none */
    int *where;   /* [nkeys]: the rank that runs the action, -1 for none */
    int *at;      /* [nkeys]: its index in that rank's list */
} checker;

/* Marks actions[r][i] (its grid slot) for the rejection. */
static void mark(checker *ck, int r, int i) { ck->marks[r] = sched_slot_of(ck->plan, r, i); }

/* Rules 1-3 for actions[r][i]: it names a real (stage, mb), its stage
 * lives on this rank, and it does not run twice. */
static int check_action(checker *ck, int r, int i, pp_err *err) {
    const sched_plan *plan = ck->plan;
    const sched_action *a = &plan->actions[r][i];
    char a1[32], a2[32], detail[512];
    if (!sched_action_ok(plan, a)) {
        mark(ck, r, i);
        sched_action_str(a, a1);
        snprintf(detail, sizeof detail, "rank %d runs %s, outside %d stages x %d microbatches", r, a1, plan->stages,
                 plan->microbatches);
        return sched_reject(plan, err, ck->marks, "actions name a stage and microbatch of the schedule", detail);
    }
    int owner = plan->stage_rank[a->stage];
    if (owner != r) {
        mark(ck, r, i);
        sched_action_str(a, a1);
        snprintf(detail, sizeof detail, "rank %d runs %s but stage %d lives on rank %d", r, a1, a->stage, owner);
        if (owner >= 0 && owner < plan->ranks) /* mark the owner's first action of the stage too */
            for (int j = 0; j < plan->len[owner]; j++)
                if (plan->actions[owner][j].stage == a->stage) {
                    mark(ck, owner, j);
                    break;
                }
        return sched_reject(plan, err, ck->marks, "each stage lives on one rank", detail);
    }
    if (plan->forward_only && a->op != SCHED_F) {
        mark(ck, r, i);
        snprintf(detail, sizeof detail, "rank %d runs %s in a forward-only schedule", r, sched_action_str(a, a1));
        return sched_reject(plan, err, ck->marks, "a forward-only schedule runs F only", detail);
    }
    /* a BW takes the keys of its B and its W */
    int ops[2] = {sched_key_op(a->op), SCHED_W}, nops = a->op == SCHED_BW ? 2 : 1;
    for (int j = 0; j < nops; j++) {
        size_t k = sched_key(plan, a->stage, a->mb, ops[j]);
        if (ck->where[k] >= 0) {
            mark(ck, r, i);
            const sched_action *ran = &plan->actions[ck->where[k]][ck->at[k]];
            if (a->op == SCHED_BW || ran->op == SCHED_BW) {
                snprintf(detail, sizeof detail, "rank %d runs %s, and %s ran already (a BW is a B and a W)", r,
                         sched_action_str(a, a1), sched_action_str(ran, a2));
            } else {
                snprintf(detail, sizeof detail, "rank %d runs %s a second time", r, sched_action_str(a, a1));
            }
            return sched_reject(plan, err, ck->marks, "exactly one F, one B and one W per (stage, microbatch)", detail);
        }
        ck->where[k] = r;
        ck->at[k] = i;
    }
    return 0;
}

/* Rule 3's other half: every (stage, mb, op) runs somewhere. */
static int check_complete(checker *ck, pp_err *err) {
    const sched_plan *plan = ck->plan;
    char a1[32], detail[512];
    int ops = plan->forward_only ? 1 : 3; /* F only, or F, B and W */
    for (int s = 0; s < plan->stages; s++)
        for (int mb = 0; mb < plan->microbatches; mb++)
            for (int op = 0; op < ops; op++) {
                if (ck->where[sched_key(plan, s, mb, op)] >= 0) continue;
                sched_action miss = {s, op, mb};
                int owner = plan->stage_rank[s];
                if (owner >= 0 && owner < plan->ranks)
                    snprintf(detail, sizeof detail, "rank %d never runs %s (stage %d, %s of microbatch %d)", owner,
                             sched_action_str(&miss, a1), s, op_name[op], mb);
                else
                    snprintf(detail, sizeof detail, "no rank runs %s: stage %d has no actions at all",
                             sched_action_str(&miss, a1), s);
                return sched_reject(plan, err, ck->marks,
                              plan->forward_only ? "exactly one F per (stage, microbatch)"
                                                 : "exactly one F, one B and one W per (stage, microbatch)",
                              detail);
            }
    return 0;
}

/* Rule 4: on its rank, F before B before W (a B needs the stored
 * activations, a W the B's output gradient); a BW after its F. */
static int check_order(checker *ck, pp_err *err) {
    const sched_plan *plan = ck->plan;
    char a1[32], a2[32], detail[512];
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (a->op == SCHED_F) continue;
            sched_action before = {a->stage, a->op == SCHED_W ? SCHED_B : SCHED_F, a->mb};
            if (ck->at[sched_key(plan, a->stage, a->mb, before.op)] > i) {
                mark(ck, r, i);
                snprintf(detail, sizeof detail, "rank %d runs %s before %s", r, sched_action_str(a, a1),
                         sched_action_str(&before, a2));
                return sched_reject(plan, err, ck->marks, "on its rank, F before B before W", detail);
            }
        }
    return 0;
}

/* The action a waits for: F(s) needs F(s-1), B(s) and BW(s) need B(s+1)
 * (a BW there sets it; the last stage's B its own F), W its B. 0 when it
 * needs nothing (stage 0's F). */
static int input_of(const sched_plan *plan, const sched_action *a, sched_action *need) {
    int backward = a->op == SCHED_B || a->op == SCHED_BW;
    if (a->op == SCHED_F) *need = (sched_action){a->stage - 1, SCHED_F, a->mb};
    else if (backward && a->stage < plan->stages - 1) *need = (sched_action){a->stage + 1, SCHED_B, a->mb};
    else if (backward) *need = (sched_action){a->stage, SCHED_F, a->mb};
    else *need = (sched_action){a->stage, SCHED_B, a->mb};
    return need->stage >= 0;
}

/* Rule 5's rejection: what each rank still waiting waits for (at a pair,
 * the half that has not run). */
static int reject_deadlock(checker *ck, const int *pos, const unsigned char *half, pp_err *err) {
    const sched_plan *plan = ck->plan;
    char a1[32], a2[32], detail[512];
    size_t off = 0;
    off += (size_t)snprintf(detail, sizeof detail, "every waiting rank waits for another:");
    for (int r = 0; r < plan->ranks; r++) {
        if (pos[r] >= plan->len[r]) continue;
        int at = pos[r] + (half[r] & 1); /* a pair's first half ran: its second waits */
        const sched_action *a = &plan->actions[r][at];
        sched_action need;
        input_of(plan, a, &need);
        size_t k = sched_key(plan, need.stage, need.mb, need.op);
        if (ck->where[k] >= 0) need = plan->actions[ck->where[k]][ck->at[k]]; /* the BW that is that B */
        mark(ck, r, at);
        if (off < sizeof detail)
            off += (size_t)snprintf(detail + off, sizeof detail - off, " rank %d at %s waits for %s (rank %d);", r,
                                    sched_action_str(a, a1), sched_action_str(&need, a2),
                                    plan->stage_rank[need.stage]);
    }
    if (off < sizeof detail && off > 0 && detail[off - 1] == ';') detail[off - 1] = '\0';
    return sched_reject(plan, err, ck->marks, "no deadlock with asynchronous sends and blocking receives", detail);
}

/* Runs actions[r][i] if its input is done (1), else 0. */
static int run_one(const sched_plan *plan, int r, int i, unsigned char *done) {
    const sched_action *a = &plan->actions[r][i];
    sched_action need;
    if (input_of(plan, a, &need) && !done[sched_key(plan, need.stage, need.mb, need.op)]) return 0;
    done[sched_key(plan, a->stage, a->mb, sched_key_op(a->op))] = 1;
    if (a->op == SCHED_BW) done[sched_key(plan, a->stage, a->mb, SCHED_W)] = 1;
    return 1;
}

/* Runs rank r's list from pos[r] while each action's input is done;
 * returns how many ran. The halves of an overlapped pair (half[r]: bit k
 * for half k) run as an engine without a second thread runs them (a GPU
 * stage, engine.c): the F when its input is done, then the backward when
 * its own is, so a plan that is free of deadlock here is in either engine;
 * the list goes on past the pair once both did. */
static int run_rank(const sched_plan *plan, int r, int *pos, unsigned char *half, unsigned char *done) {
    int moved = 0;
    while (pos[r] < plan->len[r]) {
        int i = pos[r];
        if (!sched_overlaps(plan, r, i) || i + 1 >= plan->len[r]) {
            if (!run_one(plan, r, i, done)) break;
            pos[r]++, moved++;
            continue;
        }
        for (int k = 0; k < 2; k++)
            if (!(half[r] >> k & 1) && (k == 0 || (half[r] & 1)) && run_one(plan, r, i + k, done))
                half[r] |= (unsigned char)(1 << k), moved++;
        if (half[r] != 3) break;
        half[r] = 0;
        pos[r] += 2;
    }
    return moved;
}

/* Rule 5: no deadlock. Sends never block; a receive waits for its
 * producer. Play the lists out in order until all ran or none can move. */
static int check_no_deadlock(checker *ck, pp_err *err) {
    const sched_plan *plan = ck->plan;
    unsigned char *done = calloc(ck->nkeys, 1), *half = calloc((size_t)plan->ranks, 1);
    int *pos = calloc((size_t)plan->ranks, sizeof(int));
    int total = 0, ran = 0, rc = 0;
    if (!done || !pos || !half) rc = pp_fail(err, "validate %s: out of memory", plan->name);
    for (int r = 0; r < plan->ranks; r++) total += plan->len[r];
    while (rc == 0 && ran < total) {
        int moved = 0;
        for (int r = 0; r < plan->ranks; r++) moved += run_rank(plan, r, pos, half, done);
        ran += moved;
        if (!moved && ran < total) rc = reject_deadlock(ck, pos, half, err);
    }
    free(done);
    free(half);
    free(pos);
    return rc;
}

/* Rule 4's second half: an overlapped pair (sched_overlaps) is an F
 * and then a B or BW of another stage of the rank: its two halves run on
 * two threads, each on its own stage (a stage runs one op at a time), and
 * neither waits for the other (an F never needs a backward, and a
 * backward's own F is of its stage). */
static int check_overlaps(checker *ck, pp_err *err) {
    const sched_plan *plan = ck->plan;
    static const char rule[] = "an overlapped pair is an F and a B or BW of two stages of its rank";
    char a1[32], a2[32], detail[512];
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (!sched_overlaps(plan, r, i)) continue;
            if (i + 1 >= plan->len[r]) {
                snprintf(detail, sizeof detail, "rank %d's last action %s overlaps nothing after it", r,
                         sched_action_str(a, a1));
                mark(ck, r, i);
                return sched_reject(plan, err, ck->marks, rule, detail);
            }
            const sched_action *b = &plan->actions[r][i + 1];
            sched_action_str(a, a1), sched_action_str(b, a2);
            int chained = sched_overlaps(plan, r, i + 1);
            if (a->op != SCHED_F || (b->op != SCHED_B && b->op != SCHED_BW) || chained)
                snprintf(detail, sizeof detail, "rank %d overlaps %s with %s%s", r, a1, a2,
                         chained ? ", which overlaps the next one too" : "");
            else if (a->stage == b->stage)
                snprintf(detail, sizeof detail,
                         "rank %d overlaps %s with %s, two ops of stage %d (a stage runs one op at a time: write "
                         "them as two cells to run one after the other)",
                         r, a1, a2, a->stage);
            else {
                i++; /* the pair's B */
                continue;
            }
            mark(ck, r, i); /* only here: finding a cell's slot walks its row, once a pair is quadratic */
            return sched_reject(plan, err, ck->marks, rule, detail);
        }
    return 0;
}

/* Every rule in order; the first broken one rejects the plan. */
static int check_rules(checker *ck, pp_err *err) {
    const sched_plan *plan = ck->plan;
    int p = plan->ranks, S = plan->stages, m = plan->microbatches;
    if (p < 1 || S < 1 || m < 1)
        return pp_fail(err, "schedule %s rejected: it needs at least one rank, stage and microbatch (ranks=%d, "
                            "stages=%d, microbatches=%d)", plan->name, p, S, m);
    for (int r = 0; r < p; r++)
        for (int i = 0; i < plan->len[r]; i++)
            if (check_action(ck, r, i, err) != 0) return -1;
    if (check_complete(ck, err) != 0 || check_order(ck, err) != 0 || check_overlaps(ck, err) != 0) return -1;
    return check_no_deadlock(ck, err);
}

int sched_validate(const sched_plan *plan, pp_err *err) {
    checker ck = {.plan = plan, .nkeys = (size_t)plan->stages * (size_t)plan->microbatches * 3};
    ck.marks = malloc(sizeof(int) * (size_t)plan->ranks);
    ck.where = malloc(sizeof(int) * (ck.nkeys ? ck.nkeys : 1));
    ck.at = malloc(sizeof(int) * (ck.nkeys ? ck.nkeys : 1));
    int rc = -1;
    if (!ck.marks || !ck.where || !ck.at) {
        pp_fail(err, "validate %s: out of memory", plan->name);
    } else {
        for (int r = 0; r < plan->ranks; r++) ck.marks[r] = -1;
        for (size_t k = 0; k < ck.nkeys; k++) ck.where[k] = -1;
        rc = check_rules(&ck, err);
    }
    free(ck.marks);
    free(ck.where);
    free(ck.at);
    return rc;
}
