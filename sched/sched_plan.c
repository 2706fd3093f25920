/* sched_plan.c: the plan object (allocation, freeing, action text), the
 * layer partition and stage placement, and the grid as text. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char op_chars[] = "FBW";
/* An action's op as written: F, B, W, or BW (a full backward). */
static const char *const op_text[] = {"F", "B", "W", "BW"};

/* Decimal digits of v ending at end; returns the first character. */
static char *put_int(int v, char *end) {
    unsigned u = v < 0 ? 0U - (unsigned)v : (unsigned)v;
    do *--end = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--end = '-';
    return end;
}

uint64_t sched_digest(const sched_plan *plan) {
    const int shape[4] = {plan->ranks, plan->stages, plan->virtual_stages, plan->microbatches};
    uint64_t h = pp_hash(shape, sizeof shape) ^ pp_hash(plan->stage_rank, (size_t)plan->stages * sizeof(int)) * 31;
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            char text[32];
            sched_action_fmt(&plan->actions[r][i], text);
            /* the position counts: the same actions in another order differ */
            h = (h ^ pp_hash_str(text) ^ (uint64_t)sched_overlaps(plan, r, i)) * 0x100000001b3ULL + (uint64_t)r;
        }
    return h;
}

/* sched_action_str's text without printf: the grid and the validator format
 * every cell of a big grid. */
size_t sched_action_fmt(const sched_action *a, char *buf) {
    if (a->stage < 0) {
        strcpy(buf, ".");
        return 1;
    }
    char tmp[32], *end = tmp + sizeof tmp, *p = put_int(a->mb, end);
    const char *op = (a->op >= 0 && a->op <= SCHED_BW) ? op_text[a->op] : "?";
    size_t oplen = strlen(op);
    p -= oplen;
    memcpy(p, op, oplen);
    p = put_int(a->stage, p);
    size_t n = (size_t)(end - p);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return n;
}

const char *sched_action_str(const sched_action *a, char *buf) {
    char tmp[32];
    size_t n = sched_action_fmt(a, tmp);
    if (n > 15) n = 15; /* buf holds 16, as snprintf(buf, 16, ...) cut it */
    memcpy(buf, tmp, n);
    buf[n] = '\0';
    return buf;
}

int sched_action_parse(const char *s, sched_action *out, pp_err *err) {
    const char *p = s;
    long stage = 0, mb = 0;
    if (*p < '0' || *p > '9') goto bad;
    while (*p >= '0' && *p <= '9') {
        stage = stage * 10 + (*p++ - '0');
        if (stage > 1000000) goto bad;
    }
    const char *op = strchr(op_chars, *p);
    if (!*p || !op) goto bad;
    int fused = p[0] == 'B' && p[1] == 'W';
    p += fused ? 2 : 1;
    if (*p < '0' || *p > '9') goto bad;
    while (*p >= '0' && *p <= '9') {
        mb = mb * 10 + (*p++ - '0');
        if (mb > 1000000) goto bad;
    }
    if (*p) goto bad;
    out->stage = (int)stage;
    out->op = fused ? SCHED_BW : (int)(op - op_chars);
    out->mb = (int)mb;
    return 0;
bad:
    return pp_fail(err, "'%s' is not an action; expected {stage}{F|B|W|BW}{microbatch}, e.g. 0F3", s);
}

int sched_place(sched_placement how, int stage, int p) {
    if (how == SCHED_PLACE_V) {
        int s = stage % (2 * p);
        return s < p ? s : 2 * p - 1 - s;
    }
    return stage % p;
}

/* ---- partition ---------------------------------------------------------- */

int sched_partition(int layers, int stages, const int *cuts, int ncuts, int *first, pp_err *err) {
    if (stages < 1) return pp_fail(err, "pipeline needs at least one stage, got %d", stages);
    if (layers < stages)
        return pp_fail(err, "more stages (%d) than layers (%d): every stage needs at least one layer", stages,
                       layers);
    if (!cuts) {
        /* Even split; the first stage (embeddings) and the last (head, loss)
         * do extra work, so the remainder goes to the later stages as in NxD. */
        int base = layers / stages, rem = layers % stages;
        first[0] = 0;
        for (int s = 0; s < stages; s++) first[s + 1] = first[s] + base + (s >= stages - rem ? 1 : 0);
        return 0;
    }
    if (ncuts != stages - 1)
        return pp_fail(err, "--pipeline-cuts: %d stages need %d cut%s (the first layer of stages 1..%d), got %d",
                       stages, stages - 1, stages == 2 ? "" : "s", stages - 1, ncuts);
    first[0] = 0;
    for (int i = 0; i < ncuts; i++) {
        if (cuts[i] < 1 || cuts[i] > layers - 1)
            return pp_fail(err, "--pipeline-cuts: cut %d is out of range; accepted: 1 to %d (%d layers)", cuts[i],
                           layers - 1, layers);
        if (i > 0 && cuts[i] <= cuts[i - 1])
            return pp_fail(err, "--pipeline-cuts: cuts must be strictly increasing, got %d after %d", cuts[i],
                           cuts[i - 1]);
        first[i + 1] = cuts[i];
    }
    first[stages] = layers;
    return 0;
}

int sched_parse_cuts(const char *text, int **cuts, int *ncuts, pp_err *err) {
    *cuts = NULL;
    *ncuts = 0;
    if (!text || !*text) return pp_fail(err, "--pipeline-cuts: expected layer indices like 3,6,9, got nothing");
    if (strcmp(text, "even") == 0) return 0; /* no cuts: the even split */
    int n = 1;
    for (const char *c = text; *c; c++) n += *c == ',';
    int *out = malloc(sizeof *out * (size_t)n);
    if (!out) return pp_fail(err, "--pipeline-cuts: out of memory");
    const char *p = text;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10); /* digits only: strtol would take a blank or '+' first */
        if (!isdigit((unsigned char)*p) || errno || (*end != ',' && *end != '\0')) {
            free(out);
            return pp_fail(err, "--pipeline-cuts: expected layer indices like 3,6,9, got '%s'", text);
        }
        if (v < 1 || v > 1000000) {
            free(out);
            return pp_fail(err, "--pipeline-cuts: %ld is out of range; accepted: 1 to 1000000", v);
        }
        out[i] = (int)v;
        p = end + 1;
    }
    *cuts = out;
    *ncuts = n;
    return 0;
}

const char *sched_cuts_text(const int *cuts, int ncuts, char *buf, size_t size) {
    size_t n = 0;
    if (ncuts == 0) snprintf(buf, size, "even");
    else buf[0] = '\0';
    for (int k = 0; k < ncuts && n < size; k++) n += (size_t)snprintf(buf + n, size - n, k ? ",%d" : "%d", cuts[k]);
    return buf;
}

/* ---- plan object ---------------------------------------------------------- */

void sched_free(sched_plan *plan) {
    if (!plan) return;
    for (int r = 0; r < plan->ranks; r++) {
        if (plan->actions) free(plan->actions[r]);
        if (plan->slots) free(plan->slots[r]);
        if (plan->overlap) free(plan->overlap[r]);
    }
    free(plan->overlap);
    free(plan->actions);
    free(plan->slots);
    free(plan->stage_rank);
    free(plan->len);
    free(plan);
}

/* Allocates the plan's arrays; rows stay NULL. */
static sched_plan *plan_new(const char *name, int p, int stages, int v, int m) {
    sched_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return NULL;
    snprintf(plan->name, sizeof plan->name, "%s", name);
    plan->ranks = p;
    plan->stages = stages;
    plan->virtual_stages = v;
    plan->microbatches = m;
    plan->stage_rank = malloc(sizeof(int) * (size_t)(stages > 0 ? stages : 1));
    plan->len = calloc((size_t)p, sizeof(int));
    plan->actions = calloc((size_t)p, sizeof(sched_action *));
    plan->slots = calloc((size_t)p, sizeof(sched_action *));
    if (!plan->stage_rank || !plan->len || !plan->actions || !plan->slots) {
        sched_free(plan);
        return NULL;
    }
    for (int s = 0; s < stages; s++) plan->stage_rank[s] = -1;
    return plan;
}

int sched_has_overlap(const sched_plan *plan) { return plan->overlap != NULL; }

/* Fills the grid from start times of a unit-cost simulation: slot = start.
 * A BW costs b + w, so in a plan with BW a B and a W cost half a unit and a
 * BW one cell as every other op; -1 (rows packed left instead) when that
 * puts two actions of a plan that also splits B and W in one cell, and for
 * a plan with overlapped pairs (both halves start at once: PyTorch's own
 * grids of such plans are its lists, packed left, too). */
static int grid_from_sim(sched_plan *plan) {
    if (sched_has_overlap(plan)) return -1;
    int fused = 0;
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++) fused |= plan->actions[r][i].op == SCHED_BW;
    sched_costs unit = {1, fused ? 0.5 : 1, fused ? 0.5 : 1, 0, 0, 0};
    sched_sim *sim = NULL;
    if (sched_simulate(plan, &unit, &sim, NULL) != 0) return -1;
    int nslots = (int)(sim->step_time + 0.5), rc = 0;
    /* a sparse plan (a tight memory bound runs ranks nearly one after
     * another) would make a grid of ranks x ranks x microbatches cells:
     * past what a CSV may hold (base/shape.h), its rows are packed left */
    if ((double)plan->ranks * nslots > (double)PP_SHAPE_MAX_GRID_CELLS) rc = -1;
    for (int r = 0; r < plan->ranks && rc == 0; r++) {
        sched_action *row = malloc(sizeof *row * (size_t)(nslots > 0 ? nslots : 1));
        if (!row) {
            rc = -1;
            break;
        }
        for (int i = 0; i < nslots; i++) row[i] = (sched_action){-1, 0, 0};
        for (int i = 0; i < sim->nspans[r] && rc == 0; i++) {
            double start = sim->spans[r][i].start;
            int slot = (int)(start + 0.5);
            if (start != (double)slot || slot >= nslots || row[slot].stage >= 0) rc = -1;
            else row[slot] = sim->spans[r][i].action;
        }
        free(plan->slots[r]);
        plan->slots[r] = row;
    }
    if (rc == 0) plan->nslots = nslots;
    sched_sim_free(sim);
    return rc;
}

/* Copies the overlap table (overlap[r][i] for i < lens[r]), if it holds
 * a pair; the plan's stays NULL otherwise. -1 out of memory. */
static int copy_overlaps(sched_plan *plan, const unsigned char *const *overlap) {
    int any = 0;
    for (int r = 0; overlap && r < plan->ranks && !any; r++)
        for (int i = 0; i < plan->len[r] && !any; i++) any = overlap[r][i] != 0;
    if (!any) return 0;
    if (!(plan->overlap = calloc((size_t)plan->ranks, sizeof *plan->overlap))) return -1;
    for (int r = 0; r < plan->ranks; r++) {
        if (!(plan->overlap[r] = malloc((size_t)(plan->len[r] > 0 ? plan->len[r] : 1)))) return -1;
        for (int i = 0; i < plan->len[r]; i++) plan->overlap[r][i] = overlap[r][i] != 0;
    }
    return 0;
}

int sched_plan_from_lists(const char *name, int p, int stages, int v, int m, const int *stage_rank,
                          sched_action *const *lists, const int *lens, sched_plan **out, pp_err *err) {
    return sched_plan_from_lists_ov(name, p, stages, v, m, stage_rank, lists, lens, NULL, out, err);
}

int sched_plan_from_lists_ov(const char *name, int p, int stages, int v, int m, const int *stage_rank,
                             sched_action *const *lists, const int *lens, const unsigned char *const *overlap,
                             sched_plan **out, pp_err *err) {
    *out = NULL;
    sched_plan *plan = plan_new(name, p, stages, v, m);
    if (!plan) return pp_fail(err, "schedule %s: out of memory", name);
    memcpy(plan->stage_rank, stage_rank, sizeof(int) * (size_t)stages);
    int maxlen = 0;
    for (int r = 0; r < p; r++) {
        plan->len[r] = lens[r];
        if (lens[r] > maxlen) maxlen = lens[r];
        plan->actions[r] = malloc(sizeof(sched_action) * (size_t)(lens[r] > 0 ? lens[r] : 1));
        if (!plan->actions[r]) goto oom;
        if (lens[r]) memcpy(plan->actions[r], lists[r], sizeof(sched_action) * (size_t)lens[r]);
    }
    if (copy_overlaps(plan, overlap) != 0) goto oom;
    if (grid_from_sim(plan) != 0) {
        /* Not simulable (the validator will say why): pack rows left. */
        for (int r = 0; r < p; r++) {
            free(plan->slots[r]);
            plan->slots[r] = malloc(sizeof(sched_action) * (size_t)(maxlen > 0 ? maxlen : 1));
            if (!plan->slots[r]) goto oom;
            for (int i = 0; i < maxlen; i++)
                plan->slots[r][i] = i < lens[r] ? lists[r][i] : (sched_action){-1, 0, 0};
        }
        plan->nslots = maxlen;
    }
    *out = plan;
    return 0;
oom:
    sched_free(plan);
    return pp_fail(err, "schedule %s: out of memory", name);
}

/* ---- grid text ------------------------------------------------------------ */

void sched_sb_add(sched_sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 256) + (size_t)n;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void sched_sb_mem(sched_sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (!b->s || b->len + n >= b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 256) + n;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* Grid cell slots[r][c] as text into buf (room for 33): its action, with
 * "&" before the second half of an overlapped pair. *k counts the row's
 * actions before the cell (the non-idle cells: actions[r] in order). */
static size_t cell_fmt(const sched_plan *plan, int r, int c, int *k, char *buf) {
    const sched_action *a = &plan->slots[r][c];
    if (a->stage < 0) return sched_action_fmt(a, buf);
    size_t n = *k > 0 && sched_overlaps(plan, r, *k - 1) ? 1 : 0;
    buf[0] = '&';
    (*k)++;
    return n + sched_action_fmt(a, buf + n);
}

char *sched_grid_text(const sched_plan *plan, const int *marks, int max_cols, int max_rows) {
    int width = 1;
    char buf[40];
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0, k = 0; i < plan->nslots; i++) {
            int n = (int)cell_fmt(plan, r, i, &k, buf);
            if (n > width) width = n;
        }
    int c0 = 0, c1 = plan->nslots, r0 = 0, r1 = plan->ranks;
    int focus_r = -1, focus_c = -1;
    for (int r = 0; marks && r < plan->ranks; r++)
        if (marks[r] >= 0) {
            focus_r = r;
            focus_c = marks[r];
            break;
        }
    if (max_cols > 0 && c1 > max_cols) {
        c0 = focus_c >= 0 ? focus_c - max_cols / 2 : 0;
        if (c0 < 0) c0 = 0;
        if (c0 + max_cols > plan->nslots) c0 = plan->nslots - max_cols;
        c1 = c0 + max_cols;
    }
    if (max_rows > 0 && r1 > max_rows) {
        r0 = focus_r >= 0 ? focus_r - max_rows / 2 : 0;
        if (r0 < 0) r0 = 0;
        if (r0 + max_rows > plan->ranks) r0 = plan->ranks - max_rows;
        r1 = r0 + max_rows;
    }
    int label = plan->ranks > 10 ? 2 : 1;
    sched_sbuf b = {0};
    if (r0 > 0) sched_sb_add(&b, "  (%d ranks above not shown)\n", r0);
    for (int r = r0; r < r1; r++) {
        sched_sb_add(&b, "rank %*d |%s", label, r, c0 > 0 ? " ..." : "");
        char cell[64];
        int k = 0; /* the row's actions left of the window */
        for (int i = 0; i < c0; i++) k += plan->slots[r][i].stage >= 0;
        for (int i = c0; i < c1; i++) {
            /* " 0F3 " padded to width + 2; a mark "[0F3]" padded likewise */
            int mark = marks && marks[r] == i;
            size_t n = cell_fmt(plan, r, i, &k, cell + 1);
            cell[0] = mark ? '[' : ' ';
            cell[n + 1] = mark ? ']' : ' ';
            for (n += 2; n < (size_t)width + 2; n++) cell[n] = ' ';
            sched_sb_mem(&b, cell, n);
        }
        if (c1 < plan->nslots) sched_sb_add(&b, " ...");
        /* No trailing blanks: output is meant to be diffed and pasted. */
        while (b.s && b.len > 0 && b.s[b.len - 1] == ' ') b.s[--b.len] = '\0';
        sched_sb_add(&b, "\n");
    }
    if (r1 < plan->ranks) sched_sb_add(&b, "  (%d ranks below not shown)\n", plan->ranks - r1);
    if (!b.s) sched_sb_add(&b, "%s", "");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
