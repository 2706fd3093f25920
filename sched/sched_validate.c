/* sched_validate.c: the validator: checks a plan against the rules of
 * docs/design.md §4 before anything runs it, and explains a rejection with the
 * grid, the offending cells marked. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slot (grid column) of actions[r][i]: the i-th non-idle cell of row r. */
static int slot_of(const sched_plan *plan, int r, int i) {
    int seen = 0;
    for (int c = 0; c < plan->nslots; c++) {
        if (plan->slots[r][c].stage < 0) continue;
        if (seen++ == i) return c;
    }
    return -1;
}

/* Fills err with "schedule NAME rejected: rule 'RULE': DETAIL" and the grid
 * around the marked cells, trimmed so it fits in the message. */
static int reject(const sched_plan *plan, pp_err *err, const int *marks, const char *rule, const char *detail) {
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

static const char *const op_name[] = {"F", "B", "W"};

int sched_validate(const sched_plan *plan, pp_err *err) {
    int p = plan->ranks, S = plan->stages, m = plan->microbatches;
    char a1[32], a2[32], detail[512];
    size_t nkeys = (size_t)S * (size_t)m * 3;
    int *marks = malloc(sizeof(int) * (size_t)p);
    int *where = malloc(sizeof(int) * (nkeys ? nkeys : 1)); /* rank of the action */
    int *at = malloc(sizeof(int) * (nkeys ? nkeys : 1));    /* its index in the rank's list */
    int *pos = calloc((size_t)p, sizeof(int));
    int rc = -1;
    if (!marks || !where || !at || !pos) {
        pp_fail(err, "validate %s: out of memory", plan->name);
        goto done;
    }
    for (int r = 0; r < p; r++) marks[r] = -1;
    for (size_t k = 0; k < nkeys; k++) where[k] = -1;
    if (p < 1 || S < 1 || m < 1) {
        pp_fail(err, "schedule %s rejected: it needs at least one rank, stage and microbatch (ranks=%d, stages=%d, "
                     "microbatches=%d)", plan->name, p, S, m);
        goto done;
    }

    /* Rules 1-3: every action names a real (stage, mb), its stage lives on
     * this rank, and nothing runs twice. */
    for (int r = 0; r < p; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (!sched_action_ok(plan, a)) {
                marks[r] = slot_of(plan, r, i);
                sched_action_str(a, a1);
                snprintf(detail, sizeof detail, "rank %d runs %s, outside %d stages x %d microbatches", r, a1, S, m);
                reject(plan, err, marks, "actions name a stage and microbatch of the schedule", detail);
                goto done;
            }
            if (plan->stage_rank[a->stage] != r) {
                marks[r] = slot_of(plan, r, i);
                int owner = plan->stage_rank[a->stage];
                sched_action_str(a, a1);
                snprintf(detail, sizeof detail, "rank %d runs %s but stage %d lives on rank %d", r, a1, a->stage,
                         owner);
                if (owner >= 0 && owner < p) {
                    for (int j = 0; j < plan->len[owner]; j++)
                        if (plan->actions[owner][j].stage == a->stage) {
                            marks[owner] = slot_of(plan, owner, j);
                            break;
                        }
                }
                reject(plan, err, marks, "each stage lives on one rank", detail);
                goto done;
            }
            size_t k = sched_key(plan, a->stage, a->mb, a->op);
            if (where[k] >= 0) {
                marks[r] = slot_of(plan, r, i);
                snprintf(detail, sizeof detail, "rank %d runs %s a second time", r, sched_action_str(a, a1));
                reject(plan, err, marks, "exactly one F, one B and one W per (stage, microbatch)", detail);
                goto done;
            }
            where[k] = r;
            at[k] = i;
        }
    for (int s = 0; s < S; s++)
        for (int mb = 0; mb < m; mb++)
            for (int op = 0; op < 3; op++) {
                if (where[sched_key(plan, s, mb, op)] >= 0) continue;
                sched_action miss = {s, op, mb};
                int owner = plan->stage_rank[s];
                if (owner >= 0 && owner < p)
                    snprintf(detail, sizeof detail, "rank %d never runs %s (stage %d, %s of microbatch %d)", owner,
                             sched_action_str(&miss, a1), s, op_name[op], mb);
                else
                    snprintf(detail, sizeof detail, "no rank runs %s: stage %d has no actions at all",
                             sched_action_str(&miss, a1), s);
                reject(plan, err, marks, "exactly one F, one B and one W per (stage, microbatch)", detail);
                goto done;
            }

    /* Rule 4: on its rank, F before B before W (a B needs the stored
     * activations, a W the B's output gradient). */
    for (int r = 0; r < p; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (a->op == SCHED_F) continue;
            sched_action before = {a->stage, a->op - 1, a->mb};
            if (at[sched_key(plan, a->stage, a->mb, a->op - 1)] > i) {
                marks[r] = slot_of(plan, r, i);
                snprintf(detail, sizeof detail, "rank %d runs %s before %s", r, sched_action_str(a, a1),
                         sched_action_str(&before, a2));
                reject(plan, err, marks, "on its rank, F before B before W", detail);
                goto done;
            }
        }

    /* Rule 5: no deadlock. Sends never block; a receive waits for its
     * producer. Play the lists out in order: F(s) needs F(s-1), B(s) needs
     * B(s+1) (the last stage's B its own F), W its B. */
    unsigned char *done_k = calloc(nkeys, 1);
    if (!done_k) {
        pp_fail(err, "validate %s: out of memory", plan->name);
        goto done;
    }
    int total = 0, ran = 0;
    for (int r = 0; r < p; r++) total += plan->len[r];
    for (;;) {
        int moved = 0;
        for (int r = 0; r < p; r++)
            while (pos[r] < plan->len[r]) {
                const sched_action *a = &plan->actions[r][pos[r]];
                int ds = -1, dop = 0;
                if (a->op == SCHED_F && a->stage > 0) ds = a->stage - 1, dop = SCHED_F;
                if (a->op == SCHED_B) {
                    if (a->stage < S - 1) ds = a->stage + 1, dop = SCHED_B;
                    else ds = a->stage, dop = SCHED_F;
                }
                if (a->op == SCHED_W) ds = a->stage, dop = SCHED_B;
                if (ds >= 0 && !done_k[sched_key(plan, ds, a->mb, dop)]) break;
                done_k[sched_key(plan, a->stage, a->mb, a->op)] = 1;
                pos[r]++;
                moved++;
            }
        ran += moved;
        if (ran == total) break;
        if (!moved) {
            size_t off = 0;
            off += (size_t)snprintf(detail, sizeof detail, "every waiting rank waits for another:");
            for (int r = 0; r < p; r++) {
                if (pos[r] >= plan->len[r]) continue;
                const sched_action *a = &plan->actions[r][pos[r]];
                sched_action need = {a->stage, SCHED_B, a->mb}; /* W waits for its B */
                if (a->op == SCHED_F) need = (sched_action){a->stage - 1, SCHED_F, a->mb};
                if (a->op == SCHED_B)
                    need = a->stage < S - 1 ? (sched_action){a->stage + 1, SCHED_B, a->mb}
                                            : (sched_action){a->stage, SCHED_F, a->mb};
                marks[r] = slot_of(plan, r, pos[r]);
                if (off < sizeof detail)
                    off += (size_t)snprintf(detail + off, sizeof detail - off, " rank %d at %s waits for %s (rank %d);",
                                            r, sched_action_str(a, a1), sched_action_str(&need, a2),
                                            plan->stage_rank[need.stage]);
            }
            if (off < sizeof detail && off > 0 && detail[off - 1] == ';') detail[off - 1] = '\0';
            reject(plan, err, marks, "no deadlock with asynchronous sends and blocking receives", detail);
            free(done_k);
            goto done;
        }
    }
    free(done_k);
    rc = 0;
done:
    free(marks);
    free(where);
    free(at);
    free(pos);
    return rc;
}
