/* cmd_schedule.c: `pprun schedule`: builds or reads a schedule, validates
 * it, simulates it from F/B/W/comm costs and prints the grid, the
 * timeline, the step time, the bubble ratio and the peak memory; builds
 * zb-h1 and zb-v under a memory bound (--max-mem) and holds them against
 * the unbounded order; imports and exports CSV. Nothing runs: it is the
 * planner's view of a job. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/term.h"
#include "config/run_config.h"
#include "runner/cmd/cli.h"
#include "sched/sched.h"

static const char usage_text[] =
    "usage: pprun schedule --schedule S --pp P [--microbatches M] [options]\n"
    "\n"
    "Prints a pipeline schedule's per-rank action grid, validates it, and simulates\n"
    "one step from F/B/W/comm costs (see docs/schedules.md).\n"
    "\n"
    "  --schedule S         gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-v | dualpipev | csv:FILE\n"
    "  --pp P               pipeline ranks, as pprun run --pp (--nproc-per-node P is the same here: one\n"
    "                       pipeline)\n"
    "  --virtual-stages V   stages (model chunks) per rank (default 2 for interleaved-1f1b, zb-v,\n"
    "                       dualpipev; else 1)\n"
    "  --stages S           the pipeline's stages, P x V, as the output counts them: another way to say P\n"
    "  --microbatches M     microbatches per step (default 8, as pprun run)\n"
    "  --costs LIST         f=1,b=1,w=1,comm=0: time units of one F, B, W of a stage and of a send\n"
    "                       (or durations: f=3.8ms,b=3.5ms,w=1.6ms,comm=66us); between=T adds a rank's\n"
    "                       own time between two ops, bw=T a BW's cost when not b + w, allreduce=T each\n"
    "                       stage's gradient all-reduce under data parallelism (after its last W)\n"
    "  --max-mem N          zb-h1, zb-v: built so that no rank holds more than N microbatch-stages\n"
    "                       (or bytes, 24MiB, with --act-bytes); any schedule: checked against it\n"
    "  --act-bytes LIST     what one microbatch holds on a stage, F[:B] (after F, after B), for\n"
    "                       every stage, or one per stage (*N: N stages alike): 2.6MiB:2.7MiB,2.6MiB*2,...\n"
    "  --csv-in FILE        read the schedule from a CSV (same as --schedule csv:FILE)\n"
    "  --csv-out FILE       write the schedule as CSV\n"
    "  --notation N         CSV notation for --csv-out: pprun (F/B/W) | pytorch (F/I/W)\n"
    "  --format F           text | json\n";

/* Whether the --costs list `text` has an item `key=...`. */
static int has_key(const char *text, const char *key) {
    size_t n = strlen(key);
    for (const char *p = text; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, key, n) == 0 && p[n] == '=') return 1;
    return 0;
}

typedef struct opts {
    const char *schedule, *csv_in, *csv_out, *notation, *format, *max_mem_text;
    long p, m, v;           /* p: the ranks, settled by resolve_shape from: */
    long pp, nproc, stages; /* --pp, --nproc-per-node, --stages as given (0: not given) */
    sched_costs costs;
    const char *unit; /* of the costs and times: " ns" when --costs gave durations, else " time units" */
    double allreduce; /* --costs allreduce=T: each stage's gradient all-reduce, 0 none */
    sched_mem mem;   /* --max-mem and --act-bytes; act owned (freed by cmd_schedule) */
    sched_act *act;
} opts;

/* The pipeline's shape in pprun run's words (docs/cli.md): --pp P ranks
 * (--nproc-per-node P: one pipeline, so the same), --virtual-stages V
 * stages per rank, and P x V stages, which the output counts and --stages
 * names. Any of --pp, --nproc-per-node, --stages says P; those given must
 * agree (parse_args holds --pp to --nproc-per-node), and a disagreement is
 * refused naming both. Sets o->p. */
static int resolve_shape(opts *o, pp_err *err) {
    o->p = o->pp ? o->pp : o->nproc;
    const char *ranks_flag = o->pp ? "--pp" : "--nproc-per-node";
    long v = o->v ? o->v : sched_default_virtual(o->schedule);
    if (o->stages && o->p && o->stages != o->p * v)
        return pp_fail(err, "--stages %ld disagrees with %s %ld: %ld ranks of %ld stages each (--virtual-stages %ld) "
                            "are %ld stages; give --stages %ld, or leave it out",
                       o->stages, ranks_flag, o->p, o->p, v, v, o->p * v, o->p * v);
    if (o->stages && !o->p) {
        if (o->stages % v != 0)
            return pp_fail(err, "--stages %ld: %s runs %ld stages per rank (--virtual-stages %ld), so its stages are "
                                "a multiple of %ld; give the ranks with --pp P (P x %ld stages)",
                           o->stages, o->schedule, v, v, v, v);
        o->p = o->stages / v;
        if (o->p > PP_SHAPE_MAX_RANKS)
            return pp_fail(err, "--stages %ld is %ld ranks of %ld stage%s each; accepted: at most %d ranks",
                           o->stages, o->p, v, v == 1 ? "" : "s", PP_SHAPE_MAX_RANKS);
    }
    if (!o->p)
        return pp_fail(err, "--pp is required (the pipeline's ranks, as pprun run --pp; or --stages, the ranks x "
                            "--virtual-stages)");
    return 0;
}

static int parse_args(int argc, char **argv, opts *o, pp_err *err) {
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *val = NULL;
        if (strncmp(arg, "--", 2) != 0) return pp_fail(err, "unexpected argument '%s' (see pprun schedule --help)", arg);
        char name[64];
        char *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof name) return pp_fail(err, "unknown option '%s'; see pprun schedule --help", arg);
        memcpy(name, arg, n);
        name[n] = '\0';
        /* torchrun's spelling, as pprun run and launch take it (docs/cli.md) */
        if (strcmp(name, "--nproc_per_node") == 0) snprintf(name, sizeof name, "--nproc-per-node");
        static const char *const flags[] = {"--schedule", "--pp", "--nproc-per-node", "--stages", "--microbatches",
                                            "--virtual-stages", "--costs", "--csv-in", "--csv-out", "--notation",
                                            "--format", "--max-mem", "--act-bytes"};
        int known = 0;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) known |= strcmp(name, flags[k]) == 0;
        if (!known) return pp_fail(err, "unknown option '%s'; see pprun schedule --help", name);
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return pp_fail(err, "%s needs a value (see pprun schedule --help)", name);
        if (strcmp(name, "--schedule") == 0) o->schedule = val;
        else if (strcmp(name, "--pp") == 0) {
            if (pp_parse_long(val, 1, PP_SHAPE_MAX_RANKS, "--pp", &o->pp, err) != 0) return -1;
        } else if (strcmp(name, "--nproc-per-node") == 0) {
            if (pp_parse_long(val, 1, PP_SHAPE_MAX_RANKS, "--nproc-per-node", &o->nproc, err) != 0) return -1;
        } else if (strcmp(name, "--stages") == 0) {
            if (pp_parse_long(val, 1, PP_SHAPE_MAX_STAGES, "--stages", &o->stages, err) != 0) return -1;
        } else if (strcmp(name, "--microbatches") == 0) {
            if (pp_parse_long(val, 1, PP_SHAPE_MAX_MICROBATCHES, "--microbatches", &o->m, err) != 0) return -1;
        } else if (strcmp(name, "--virtual-stages") == 0) {
            if (pp_parse_long(val, 1, PP_SHAPE_MAX_VIRTUAL, "--virtual-stages", &o->v, err) != 0) return -1;
        } else if (strcmp(name, "--costs") == 0) {
            int in_ns;
            if (sched_parse_costs_dp(val, "--costs", &o->costs, &o->allreduce, &in_ns, err) != 0) return -1;
            o->unit = in_ns ? " ns" : " time units";
            if (in_ns && !(has_key(val, "f") && has_key(val, "b") && has_key(val, "w")))
                return pp_fail(err,
                               "--costs %s: durations for some costs leave the others at 1 time unit, which "
                               "is no duration: give f, b and w as durations too",
                               val);
        } else if (strcmp(name, "--max-mem") == 0) {
            if (sched_parse_max_mem(val, "--max-mem", &o->mem.max, &o->mem.bytes, err) != 0) return -1;
            o->max_mem_text = val;
        } else if (strcmp(name, "--act-bytes") == 0) {
            free(o->act);
            if (sched_parse_act(val, "--act-bytes", &o->act, &o->mem.nact, err) != 0) return -1;
            o->mem.act = o->act;
        } else if (strcmp(name, "--csv-in") == 0) o->csv_in = val;
        else if (strcmp(name, "--csv-out") == 0) o->csv_out = val;
        else if (strcmp(name, "--notation") == 0) {
            if (strcmp(val, "pprun") && strcmp(val, "pytorch"))
                return pp_fail(err, "--notation: unknown notation '%s'; accepted: pprun, pytorch", val);
            o->notation = val;
        } else if (strcmp(name, "--format") == 0) {
            if (strcmp(val, "text") && strcmp(val, "json"))
                return pp_fail(err, "--format '%s': expected one of text, json", val);
            o->format = val;
        }
    }
    if (o->schedule && o->csv_in && strncmp(o->schedule, "csv:", 4) != 0)
        return pp_fail(err, "--csv-in %s and --schedule %s both name the schedule; give one", o->csv_in, o->schedule);
    if (o->schedule && strncmp(o->schedule, "csv:", 4) == 0) {
        if (o->csv_in) return pp_fail(err, "--schedule csv:FILE and --csv-in name the file twice; give one");
        o->csv_in = o->schedule + 4;
        if (!*o->csv_in) return pp_fail(err, "--schedule csv:FILE: the file name is missing");
    }
    /* the bound and the table must count the same thing */
    if (o->max_mem_text && o->act && !o->mem.bytes)
        return pp_fail(err, "--max-mem %s counts microbatch-stages; with --act-bytes give it in bytes (e.g. 24MiB)",
                       o->max_mem_text);
    if (o->max_mem_text && o->mem.bytes && !o->act)
        return pp_fail(err, "--max-mem %s is bytes: say what one microbatch holds on a stage with --act-bytes F[:B]",
                       o->max_mem_text);
    if (o->act) o->mem.bytes = 1;
    if (o->pp && o->nproc && o->pp != o->nproc)
        return pp_fail(err, "--pp %ld and --nproc-per-node %ld disagree: both count the pipeline's ranks here; give "
                            "one", o->pp, o->nproc);
    if (!o->csv_in) {
        if (!o->schedule)
            return pp_fail(err, "--schedule is required; accepted: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, "
                                "dualpipev, csv:FILE");
        /* a name it does not know first: "--pp is required" would mislead (CSV:FILE) */
        if (sched_kind_check(o->schedule, err) != 0 || resolve_shape(o, err) != 0) return -1;
        if (!o->m) o->m = RUN_DEFAULT_MICROBATCHES; /* pprun run's: the plan a run would take */
    }
    /* the CSV written over the one read would replace the user's own file */
    if (o->csv_out && o->csv_in &&
        file_output_not_input(o->csv_out, "--csv-out", o->csv_in, o->schedule ? "--schedule csv:" : "--csv-in", 0,
                              err) != 0)
        return -1;
    return 0;
}

/* A csv:FILE sets the ranks, the stages and the microbatches (its rows,
 * its highest stage and microbatch: docs/schedules.md, "CSV files"), as
 * for pprun run: one given that the file contradicts is refused by name. */
static int check_csv_shape(const opts *o, const sched_plan *plan, pp_err *err) {
    const char *file = o->csv_in;
    const struct {
        const char *flag, *what;
        long given, has;
    } shape[] = {
        {"--pp", "ranks (rows)", o->pp, plan->ranks},
        {"--nproc-per-node", "ranks (rows)", o->nproc, plan->ranks},
        {"--stages", "stages", o->stages, plan->stages},
        {"--virtual-stages", "stages per rank", o->v, plan->virtual_stages},
        {"--microbatches", "microbatches", o->m, plan->microbatches},
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].given && shape[i].given != shape[i].has)
            return pp_fail(err, "%s %ld: %s has %ld %s; the file sets them: give %s %ld, or leave it out",
                           shape[i].flag, shape[i].given, file, shape[i].has, shape[i].what, shape[i].flag,
                           shape[i].has);
    return 0;
}

/* "loop", "V" or "custom": how the plan's stages sit on its ranks. */
static const char *placement_name(const sched_plan *plan) {
    int loop = 1, vee = 1;
    for (int s = 0; s < plan->stages; s++) {
        loop &= plan->stage_rank[s] == sched_place(SCHED_PLACE_LOOP, s, plan->ranks);
        vee &= plan->stage_rank[s] == sched_place(SCHED_PLACE_V, s, plan->ranks);
    }
    return loop ? "loop" : vee ? "V" : "custom";
}

/* Whether the plan has a full backward (BW: a CSV of PyTorch's). */
static int has_bw(const sched_plan *plan) {
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++)
            if (plan->actions[r][i].op == SCHED_BW) return 1;
    return 0;
}

/* The memory side, with --max-mem or --act-bytes: what each rank holds at
 * most in the bound's unit, and for zb-h1 and zb-v under a bound the least
 * bound they run in and the unbounded order beside them. */
typedef struct mem_view {
    int shown;
    const sched_mem *mem;
    double *peak;       /* [ranks] */
    double least;       /* < 0: not a schedule the bound shapes */
    int least_rank;
    int has_free;       /* the unbounded order: */
    double free_step, free_bubble, free_peak;
} mem_view;

static void mem_view_free(mem_view *mv) { free(mv->peak); }

/* Fills mv for plan (from spec at p, m, v under o's bound); -1 with err. */
static int mem_view_fill(mem_view *mv, const opts *o, const char *spec, const sched_plan *plan, pp_err *err) {
    memset(mv, 0, sizeof *mv);
    mv->least = -1;
    mv->mem = &o->mem;
    mv->shown = o->max_mem_text || o->act;
    if (!mv->shown) return 0;
    if (!(mv->peak = malloc(sizeof(double) * (size_t)plan->ranks))) return pp_fail(err, "out of memory");
    if (sched_mem_peaks(plan, &o->mem, mv->peak, NULL, err) != 0) return -1;
    int shaped = strcmp(spec, "zb-h1") == 0 || strcmp(spec, "zb-v") == 0;
    if (!shaped || !o->max_mem_text) return 0;
    if (sched_mem_least(spec, plan->ranks, &o->mem, &mv->least, &mv->least_rank, err) != 0) return -1;
    sched_plan *free_plan = NULL;
    sched_sim *sim = NULL;
    double *peak = malloc(sizeof(double) * (size_t)plan->ranks);
    int rc = !peak ? pp_fail(err, "out of memory") : sched_from_flag(spec, (int)o->p, (int)o->m, (int)o->v, &o->costs,
                                                                      &free_plan, err);
    if (rc == 0) rc = sched_simulate(free_plan, &o->costs, &sim, err);
    if (rc == 0) rc = sched_mem_peaks(free_plan, &o->mem, peak, NULL, err);
    if (rc == 0) {
        mv->has_free = 1;
        mv->free_step = sim->step_time, mv->free_bubble = sim->bubble_ratio;
        for (int r = 0; r < plan->ranks; r++)
            if (peak[r] > mv->free_peak) mv->free_peak = peak[r];
    }
    free(peak);
    sched_sim_free(sim);
    sched_free(free_plan);
    return rc;
}

static void print_mem_text(const mem_view *mv, const sched_plan *plan) {
    char a[64], b[64];
    if (!mv->shown) return;
    if (mv->mem->bytes) {
        printf("peak activation bytes held:");
        for (int r = 0; r < plan->ranks; r++)
            printf(" rank %d: %s%s", r, sched_mem_text(mv->mem, mv->peak[r], a, sizeof a),
                   r + 1 < plan->ranks ? "," : "");
        printf("\n");
    }
    if (mv->mem->max <= 0) return;
    double most = 0;
    for (int r = 0; r < plan->ranks; r++)
        if (mv->peak[r] > most) most = mv->peak[r];
    printf("memory bound (--max-mem): %s per rank; the most a rank holds: %s",
           sched_mem_text(mv->mem, mv->mem->max, a, sizeof a), sched_mem_text(mv->mem, most, b, sizeof b));
    if (mv->least >= 0)
        printf("; the least %s runs in: %s (rank %d)", plan->name, sched_mem_text(mv->mem, mv->least, a, sizeof a),
               mv->least_rank);
    printf("\n");
    if (mv->has_free)
        printf("without the bound: step time %g, bubble ratio %.4f, the most a rank holds: %s\n", mv->free_step,
               mv->free_bubble, sched_mem_text(mv->mem, mv->free_peak, a, sizeof a));
}

/* dp_step: the step with each stage's all-reduce (--costs allreduce=T), NAN without. */
static void print_text(const sched_plan *plan, const sched_sim *sim, const sched_costs *c, const char *unit,
                       double allreduce, double dp_step, const mem_view *mv) {
    int bw = has_bw(plan);
    /* The name of a CSV schedule holds its file's name: escaped for the
     * terminal, as every text from outside (the grid is digits and F/B/W). */
    fputs("schedule ", stdout);
    term_write(stdout, plan->name, strlen(plan->name), 0);
    printf(": %d ranks, %d stages (%d per rank, %s placement), %d microbatches\n", plan->ranks, plan->stages,
           plan->virtual_stages, placement_name(plan), plan->microbatches);
    printf("costs (%s): f=%g b=%g w=%g comm=%g", unit + 1, c->f, c->b, c->w, c->comm);
    if (c->between > 0) printf(" between=%g", c->between);
    if (bw && c->bw > 0) printf(" bw=%g", c->bw);
    else if (bw) printf(" (a BW costs b + w)");
    printf("\n\n");
    char *grid = sched_grid_text(plan, NULL, 0, 0);
    printf("action grid ({stage}{%s}{microbatch}, '.' idle):\n%s\n", bw ? "F|B|W|BW" : "F|B|W",
           grid ? grid : "(out of memory)\n");
    free(grid);
    double per_char = 0;
    char *tl = sched_timeline_text(sim, plan, 0, &per_char);
    printf("simulated timeline (one character = %g%s; F, B, W, %s'.' idle):\n%s\n", per_char,
           per_char == 1 && unit[1] == 't' ? " time unit" : unit, bw ? "X a BW, " : "", tl ? tl : "(out of memory)\n");
    free(tl);
    printf("step time: %g%s\n", sim->step_time, unit);
    if (!isnan(dp_step))
        printf("step time with data parallelism: %g%s (each stage's gradient all-reduce of %g%s after its last W, a "
               "rank's one at a time)\n",
               dp_step, unit, allreduce, unit);
    printf("bubble ratio: %.4f (%.1f%% of ranks x step time idle)\n", sim->bubble_ratio, 100 * sim->bubble_ratio);
    printf("peak activations held (microbatch-stage units):");
    for (int r = 0; r < sim->ranks; r++) printf(" rank %d: %d%s", r, sim->peak_inflight[r], r + 1 < sim->ranks ? "," : "");
    printf("\n");
    print_mem_text(mv, plan);
}

/* ---- JSON -------------------------------------------------------------------
 * Written as a stream: a tree of every span (cJSON) took 10x the plan's memory
 * and most of the time on a big grid. The bytes are what cJSON_Print wrote
 * (same layout, same numbers), so scripts that read the old output still do. */

typedef struct jout {
    FILE *f; /* a write that fails leaves its error there: main checks stdout */
    size_t len;
    char buf[1 << 16];
} jout;

static void j_flush(jout *o) {
    fwrite(o->buf, 1, o->len, o->f);
    o->len = 0;
}

static inline void j_mem(jout *o, const char *s, size_t n) {
    if (o->len + n <= sizeof o->buf) {
        memcpy(o->buf + o->len, s, n);
        o->len += n;
        return;
    }
    j_flush(o);
    if (n > sizeof o->buf) {
        fwrite(s, 1, n, o->f);
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void j_str(jout *o, const char *s) { j_mem(o, s, strlen(s)); }

static void j_tabs(jout *o, int depth) {
    static const char tabs[] = "\t\t\t\t\t\t\t\t";
    j_mem(o, tabs, (size_t)depth);
}

/* Decimal digits of v into the end of buf; returns the first digit. */
static char *j_itoa(long long v, char *end) {
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char *p = end;
    do *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--p = '-';
    return p;
}

static int j_same_double(double a, double b) {
    double max = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= max * DBL_EPSILON;
}

/* A number as cJSON prints it: null for NaN and infinities, an integer in int
 * range as one, else 15 significant digits when they read back as the value
 * (within an epsilon, cJSON's test), 17 otherwise. */
static void j_num(jout *o, double d) {
    char buf[64];
    if (isnan(d) || isinf(d)) {
        j_str(o, "null");
        return;
    }
    int vi = d >= (double)INT_MAX ? INT_MAX : d <= (double)INT_MIN ? INT_MIN : (int)d;
    if (d == (double)vi) {
        char *p = j_itoa(vi, buf + sizeof buf);
        j_mem(o, p, (size_t)(buf + sizeof buf - p));
        return;
    }
    snprintf(buf, sizeof buf, "%1.15g", d);
    if (!j_same_double(strtod(buf, NULL), d)) snprintf(buf, sizeof buf, "%1.17g", d);
    j_str(o, buf);
}

/* Length of the valid UTF-8 sequence at s (1..4), 0 when it is not one. */
static int j_utf8_len(const unsigned char *s) {
    if (s[0] < 0x80) return 1;
    int n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    /* overlong forms, surrogates, past U+10FFFF */
    if (n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
    if (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
    return n;
}

/* A JSON string: quotes, backslashes and control characters escaped as cJSON
 * does; a byte that is not UTF-8 (a file name's, or a name cut short in the
 * middle of a character) is U+FFFD, so the document stays valid JSON. */
static void j_qstr(jout *o, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    j_mem(o, "\"", 1);
    while (*p) {
        char esc[8];
        int n = j_utf8_len(p);
        if (n == 0) {
            j_str(o, "\\ufffd");
            p++;
        } else if (n > 1 || (*p >= 0x20 && *p != '"' && *p != '\\')) {
            j_mem(o, (const char *)p, (size_t)n);
            p += n;
        } else {
            const char *named = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\b' ? "\\b" : *p == '\f' ? "\\f"
                                : *p == '\n' ? "\\n" : *p == '\r' ? "\\r" : *p == '\t' ? "\\t" : NULL;
            if (!named) snprintf(esc, sizeof esc, "\\u%04x", *p);
            j_str(o, named ? named : esc);
            p++;
        }
    }
    j_mem(o, "\"", 1);
}

/* "0F3" with its quotes. */
static void j_action(jout *o, const sched_action *a) {
    char buf[34];
    size_t n = sched_action_fmt(a, buf + 1);
    buf[0] = buf[n + 1] = '"';
    j_mem(o, buf, n + 2);
}

/* `,\n` unless first, then `"key":\t` at depth tabs; keys are ours, plain
 * ASCII with nothing to escape. */
static void j_key(jout *o, int depth, const char *key, int first) {
    if (!first) j_mem(o, ",\n", 2);
    j_tabs(o, depth);
    j_mem(o, "\"", 1);
    j_str(o, key);
    j_mem(o, "\":\t", 3);
}

static void j_key_num(jout *o, int depth, const char *key, double v) {
    j_key(o, depth, key, 0);
    j_num(o, v);
}

/* Rank r's object in "ranks": its actions in order, its grid row (null
 * where it idles), its simulated spans, its busy and idle time and its
 * peak of microbatches in flight. */
static void j_rank(jout *o, const sched_plan *plan, const sched_sim *sim, int r) {
    j_str(o, r ? ", {\n" : "{\n");
    j_key(o, 3, "rank", 1);
    j_num(o, r);
    j_key(o, 3, "actions", 0);
    j_str(o, "[");
    for (int i = 0; i < plan->len[r]; i++) {
        if (i) j_mem(o, ", ", 2);
        j_action(o, &plan->actions[r][i]);
    }
    j_str(o, "]");
    j_key(o, 3, "slots", 0);
    j_str(o, "[");
    for (int i = 0; i < plan->nslots; i++) {
        if (i) j_mem(o, ", ", 2);
        if (plan->slots[r][i].stage < 0) j_str(o, "null");
        else j_action(o, &plan->slots[r][i]);
    }
    j_str(o, "]");
    j_key(o, 3, "spans", 0);
    j_str(o, sim->nspans[r] ? "[" : "[]");
    for (int i = 0; i < sim->nspans[r]; i++) {
        const sched_span *sp = &sim->spans[r][i];
        j_str(o, i ? ", {\n" : "{\n");
        j_key(o, 5, "action", 1);
        j_action(o, &sp->action);
        j_key_num(o, 5, "start", sp->start);
        j_key_num(o, 5, "end", sp->end);
        if (sched_overlaps(plan, r, i)) { /* the first half of an overlapped pair: it and the next span run at once */
            j_key(o, 5, "overlaps_next", 0);
            j_str(o, "true");
        }
        j_str(o, "\n\t\t\t\t}");
    }
    if (sim->nspans[r]) j_str(o, "]");
    j_key_num(o, 3, "busy", sim->busy[r]);
    j_key_num(o, 3, "idle", sim->step_time - sim->busy[r]);
    j_key_num(o, 3, "peak", sim->peak_inflight[r]);
    j_str(o, "\n\t\t}");
}

/* "memory", with --max-mem or --act-bytes: the unit, the bound (null
 * without), each rank's most held, and for zb-h1 and zb-v under a bound
 * the least bound and the unbounded order's step, bubble and most held. */
static void j_memory(jout *o, const mem_view *mv, int ranks) {
    j_key(o, 1, "memory", 0);
    j_str(o, "{\n");
    j_key(o, 2, "unit", 1);
    j_qstr(o, mv->mem->bytes ? "bytes" : "microbatch-stages");
    j_key(o, 2, "max_mem", 0);
    if (mv->mem->max > 0) j_num(o, mv->mem->max);
    else j_str(o, "null");
    j_key(o, 2, "peak", 0);
    j_str(o, "[");
    for (int r = 0; r < ranks; r++) {
        if (r) j_mem(o, ", ", 2);
        j_num(o, mv->peak[r]);
    }
    j_str(o, "]");
    if (mv->least >= 0) {
        j_key_num(o, 2, "least", mv->least);
        j_key_num(o, 2, "least_rank", mv->least_rank);
    }
    if (mv->has_free) {
        j_key(o, 2, "unbounded", 0);
        j_str(o, "{\n");
        j_key(o, 3, "step_time", 1);
        j_num(o, mv->free_step);
        j_key_num(o, 3, "bubble_ratio", mv->free_bubble);
        j_key_num(o, 3, "peak", mv->free_peak);
        j_str(o, "\n\t\t}");
    }
    j_str(o, "\n\t}");
}

/* Writes the plan, its simulation and the costs to f; memory stays one
 * buffer whatever the grid's size. Returns -1 when out of memory. */
static int print_json(const sched_plan *plan, const sched_sim *sim, const sched_costs *c, double allreduce,
                      double dp_step, const mem_view *mv, FILE *f) {
    jout *o = malloc(sizeof *o);
    if (!o) return -1;
    o->f = f;
    o->len = 0;
    j_str(o, "{\n");
    j_key(o, 1, "schedule", 1);
    j_qstr(o, plan->name);
    j_key_num(o, 1, "num_ranks", plan->ranks);
    j_key_num(o, 1, "stages", plan->stages);
    j_key_num(o, 1, "virtual_stages", plan->virtual_stages);
    j_key_num(o, 1, "microbatches", plan->microbatches);
    j_key(o, 1, "costs", 0);
    j_str(o, "{\n");
    j_key(o, 2, "f", 1);
    j_num(o, c->f);
    j_key_num(o, 2, "b", c->b);
    j_key_num(o, 2, "w", c->w);
    j_key_num(o, 2, "comm", c->comm);
    j_key_num(o, 2, "between", c->between);
    j_key_num(o, 2, "bw", c->bw);
    j_key_num(o, 2, "allreduce", allreduce);
    j_str(o, "\n\t}");
    j_key(o, 1, "placement", 0);
    j_qstr(o, placement_name(plan));
    j_key(o, 1, "stage_rank", 0);
    j_str(o, "[");
    for (int s = 0; s < plan->stages; s++) {
        if (s) j_mem(o, ", ", 2);
        j_num(o, plan->stage_rank[s]);
    }
    j_str(o, "]");
    j_key(o, 1, "valid", 0);
    j_str(o, "true");
    j_key_num(o, 1, "step_time", sim->step_time);
    j_key_num(o, 1, "bubble_ratio", sim->bubble_ratio);
    j_key(o, 1, "dp_step_time", 0); /* with allreduce: the step with the all-reduces, else null */
    if (isnan(dp_step)) j_str(o, "null");
    else j_num(o, dp_step);
    j_key(o, 1, "ranks", 0);
    j_str(o, plan->ranks ? "[" : "[]");
    for (int r = 0; r < plan->ranks; r++) j_rank(o, plan, sim, r);
    if (plan->ranks) j_str(o, "]");
    if (mv->shown) j_memory(o, mv, plan->ranks);
    j_str(o, "\n}\n");
    j_flush(o);
    free(o);
    return 0;
}

int cmd_schedule(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    opts o = {.costs = {1, 1, 1, 0, 0, 0}, .unit = " time units", .notation = "pprun", .format = "text"};
    pp_err err = {{0}};
    mem_view mv = {0};
    if (parse_args(argc, argv, &o, &err) != 0) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        free(o.act);
        return 2;
    }
    sched_plan *plan = NULL;
    char spec[4200];
    if (o.csv_in && snprintf(spec, sizeof spec, "csv:%s", o.csv_in) >= (int)sizeof spec) {
        fprintf(stderr, "pprun schedule: --csv-in: path too long\n");
        return 2;
    }
    const char *which = o.csv_in ? spec : o.schedule;
    /* a CSV's shape is the file's: what was given is checked against it after */
    int p = o.csv_in ? 0 : (int)o.p, m = o.csv_in ? 0 : (int)o.m;
    if (sched_from_flag_mem(which, p, m, (int)o.v, &o.costs, &o.mem, &plan, &err) != 0 ||
        (o.csv_in && check_csv_shape(&o, plan, &err) != 0)) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        sched_free(plan);
        free(o.act);
        return 2;
    }
    int rc = 2;
    sched_sim *sim = NULL;
    if (sched_simulate(plan, &o.costs, &sim, &err) != 0 || mem_view_fill(&mv, &o, which, plan, &err) != 0) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        goto done;
    }
    if (o.csv_out && sched_write_csv(plan, o.csv_out, o.notation, &err) != 0) {
        fprintf(stderr, "pprun schedule: --csv-out: %s\n", err.msg);
        goto done;
    }
    double dp_step = NAN;
    if (o.allreduce > 0) {
        double *each = malloc(sizeof *each * (size_t)plan->stages);
        for (int k = 0; each && k < plan->stages; k++) each[k] = o.allreduce;
        if (!each || (dp_step = sched_sim_dp_step(plan, sim, each)) < 0) {
            free(each);
            fprintf(stderr, "pprun schedule: out of memory\n");
            rc = 1;
            goto done;
        }
        free(each);
    }
    /* A write that fails is main's to report, as for every command. */
    if (strcmp(o.format, "json") != 0)
        print_text(plan, sim, &o.costs, o.unit, o.allreduce, dp_step, &mv);
    else if (print_json(plan, sim, &o.costs, o.allreduce, dp_step, &mv, stdout) != 0) {
        fprintf(stderr, "pprun schedule: writing JSON: out of memory\n");
        rc = 1;
        goto done;
    }
    rc = 0;
done:
    mem_view_free(&mv);
    free(o.act);
    sched_sim_free(sim);
    sched_free(plan);
    return rc;
}
