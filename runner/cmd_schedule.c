/* cmd_schedule.c: `pprun schedule`: builds or reads a schedule, validates
 * it, simulates it from F/B/W/comm costs and prints the grid, the
 * timeline, the step time, the bubble ratio and the peak memory; imports
 * and exports CSV. Nothing runs: it is the planner's view of a job. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/cli.h"
#include "runner/pipe/sched.h"

static const char usage_text[] =
    "usage: pprun schedule --schedule S --stages P --microbatches M [options]\n"
    "\n"
    "Prints a pipeline schedule's per-rank action grid, validates it, and simulates\n"
    "one step from F/B/W/comm costs (see docs/schedules.md).\n"
    "\n"
    "  --schedule S         gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-v | csv:FILE\n"
    "  --stages P           pipeline ranks p (S = p*v stages)\n"
    "  --microbatches M     microbatches per step\n"
    "  --virtual-stages V   chunks per rank (default 2 for interleaved-1f1b and zb-v, else 1)\n"
    "  --costs LIST         f=1,b=1,w=1,comm=0: time units of one F, B, W of a stage and of a send\n"
    "                       (or durations: f=3.8ms,b=3.5ms,w=1.6ms,comm=66us)\n"
    "  --csv-in FILE        read the schedule from a CSV (same as --schedule csv:FILE)\n"
    "  --csv-out FILE       write the schedule as CSV\n"
    "  --notation N         CSV notation for --csv-out: pprun (F/B/W) | pytorch (F/I/W)\n"
    "  --format F           text | json\n";

typedef struct opts {
    const char *schedule, *csv_in, *csv_out, *notation, *format;
    long p, m, v;
    sched_costs costs;
} opts;

static int parse_args(int argc, char **argv, opts *o, pp_err *err) {
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *val = NULL;
        if (strncmp(arg, "--", 2) != 0) return pp_fail(err, "unexpected argument '%s' (see pprun schedule --help)", arg);
        char name[64];
        char *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof name) return pp_fail(err, "unknown flag '%s' (see pprun schedule --help)", arg);
        memcpy(name, arg, n);
        name[n] = '\0';
        static const char *const flags[] = {"--schedule", "--stages", "--microbatches", "--virtual-stages", "--costs",
                                            "--csv-in", "--csv-out", "--notation", "--format"};
        int known = 0;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) known |= strcmp(name, flags[k]) == 0;
        if (!known) return pp_fail(err, "unknown flag '%s' (see pprun schedule --help)", name);
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return pp_fail(err, "%s needs a value (see pprun schedule --help)", name);
        if (strcmp(name, "--schedule") == 0) o->schedule = val;
        else if (strcmp(name, "--stages") == 0) {
            if (pp_parse_long(val, 1, 1024, "--stages", &o->p, err) != 0) return -1;
        } else if (strcmp(name, "--microbatches") == 0) {
            if (pp_parse_long(val, 1, 100000, "--microbatches", &o->m, err) != 0) return -1;
        } else if (strcmp(name, "--virtual-stages") == 0) {
            if (pp_parse_long(val, 1, 64, "--virtual-stages", &o->v, err) != 0) return -1;
        } else if (strcmp(name, "--costs") == 0) {
            if (sched_parse_costs(val, "--costs", &o->costs, err) != 0) return -1;
        } else if (strcmp(name, "--csv-in") == 0) o->csv_in = val;
        else if (strcmp(name, "--csv-out") == 0) o->csv_out = val;
        else if (strcmp(name, "--notation") == 0) {
            if (strcmp(val, "pprun") && strcmp(val, "pytorch"))
                return pp_fail(err, "--notation: unknown notation '%s'; accepted: pprun, pytorch", val);
            o->notation = val;
        } else if (strcmp(name, "--format") == 0) {
            if (strcmp(val, "text") && strcmp(val, "json"))
                return pp_fail(err, "--format: unknown format '%s'; accepted: text, json", val);
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
    if (!o->csv_in) {
        if (!o->schedule)
            return pp_fail(err, "--schedule is required; accepted: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, csv:FILE");
        if (!o->p) return pp_fail(err, "--stages is required (the number of pipeline ranks)");
        if (!o->m) return pp_fail(err, "--microbatches is required");
    }
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

static void print_text(const sched_plan *plan, const sched_sim *sim, const sched_costs *c) {
    printf("schedule %s: %d ranks, %d stages (%d per rank, %s placement), %d microbatches\n", plan->name, plan->ranks,
           plan->stages, plan->virtual_stages, placement_name(plan), plan->microbatches);
    printf("costs: f=%g b=%g w=%g comm=%g\n\n", c->f, c->b, c->w, c->comm);
    char *grid = sched_grid_text(plan, NULL, 0, 0);
    printf("action grid ({stage}{F|B|W}{microbatch}, '.' idle):\n%s\n", grid ? grid : "(out of memory)\n");
    free(grid);
    double unit = 0;
    char *tl = sched_timeline_text(sim, plan, 0, &unit);
    printf("simulated timeline (one character = %g time unit%s; F, B, W, '.' idle):\n%s\n", unit,
           unit == 1 ? "" : "s", tl ? tl : "(out of memory)\n");
    free(tl);
    printf("step time: %g\n", sim->step_time);
    printf("bubble ratio: %.4f (%.1f%% of ranks x step time idle)\n", sim->bubble_ratio, 100 * sim->bubble_ratio);
    printf("peak activations held (microbatch-stage units):");
    for (int r = 0; r < sim->ranks; r++) printf(" rank %d: %d%s", r, sim->peak_inflight[r], r + 1 < sim->ranks ? "," : "");
    printf("\n");
}

static int print_json(const sched_plan *plan, const sched_sim *sim, const sched_costs *c) {
    char buf[32];
    cJSON *root = cJSON_CreateObject();
    if (!root) return -1;
    cJSON_AddStringToObject(root, "schedule", plan->name);
    cJSON_AddNumberToObject(root, "num_ranks", plan->ranks);
    cJSON_AddNumberToObject(root, "stages", plan->stages);
    cJSON_AddNumberToObject(root, "virtual_stages", plan->virtual_stages);
    cJSON_AddNumberToObject(root, "microbatches", plan->microbatches);
    cJSON *costs = cJSON_AddObjectToObject(root, "costs");
    if (costs) {
        cJSON_AddNumberToObject(costs, "f", c->f);
        cJSON_AddNumberToObject(costs, "b", c->b);
        cJSON_AddNumberToObject(costs, "w", c->w);
        cJSON_AddNumberToObject(costs, "comm", c->comm);
    }
    cJSON_AddStringToObject(root, "placement", placement_name(plan));
    cJSON *sr = cJSON_AddArrayToObject(root, "stage_rank");
    for (int s = 0; sr && s < plan->stages; s++) cJSON_AddItemToArray(sr, cJSON_CreateNumber(plan->stage_rank[s]));
    cJSON_AddBoolToObject(root, "valid", 1);
    cJSON_AddNumberToObject(root, "step_time", sim->step_time);
    cJSON_AddNumberToObject(root, "bubble_ratio", sim->bubble_ratio);
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int r = 0; ranks && r < plan->ranks; r++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(ranks, o);
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON *acts = cJSON_AddArrayToObject(o, "actions");
        for (int i = 0; acts && i < plan->len[r]; i++)
            cJSON_AddItemToArray(acts, cJSON_CreateString(sched_action_str(&plan->actions[r][i], buf)));
        cJSON *slots = cJSON_AddArrayToObject(o, "slots");
        for (int i = 0; slots && i < plan->nslots; i++)
            cJSON_AddItemToArray(slots, plan->slots[r][i].stage < 0
                                            ? cJSON_CreateNull()
                                            : cJSON_CreateString(sched_action_str(&plan->slots[r][i], buf)));
        cJSON *spans = cJSON_AddArrayToObject(o, "spans");
        double busy = 0;
        for (int i = 0; spans && i < sim->nspans[r]; i++) {
            const sched_span *sp = &sim->spans[r][i];
            cJSON *s = cJSON_CreateObject();
            if (!s) break;
            cJSON_AddItemToArray(spans, s);
            cJSON_AddStringToObject(s, "action", sched_action_str(&sp->action, buf));
            cJSON_AddNumberToObject(s, "start", sp->start);
            cJSON_AddNumberToObject(s, "end", sp->end);
            busy += sp->end - sp->start;
        }
        cJSON_AddNumberToObject(o, "busy", busy);
        cJSON_AddNumberToObject(o, "idle", sim->step_time - busy);
        cJSON_AddNumberToObject(o, "peak", sim->peak_inflight[r]);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return -1;
    printf("%s\n", text);
    free(text);
    return 0;
}

int cmd_schedule(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    opts o = {.costs = {1, 1, 1, 0}, .notation = "pprun", .format = "text"};
    pp_err err = {{0}};
    if (parse_args(argc, argv, &o, &err) != 0) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        return 2;
    }
    sched_plan *plan = NULL;
    char spec[4200];
    if (o.csv_in && snprintf(spec, sizeof spec, "csv:%s", o.csv_in) >= (int)sizeof spec) {
        fprintf(stderr, "pprun schedule: --csv-in: path too long\n");
        return 2;
    }
    if (sched_from_flag(o.csv_in ? spec : o.schedule, (int)o.p, (int)o.m, (int)o.v, &o.costs, &plan, &err) != 0) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        return 2;
    }
    int rc = 2;
    sched_sim *sim = NULL;
    if (sched_simulate(plan, &o.costs, &sim, &err) != 0) {
        fprintf(stderr, "pprun schedule: %s\n", err.msg);
        goto done;
    }
    if (o.csv_out && sched_write_csv(plan, o.csv_out, o.notation, &err) != 0) {
        fprintf(stderr, "pprun schedule: --csv-out: %s\n", err.msg);
        goto done;
    }
    if (strcmp(o.format, "json") == 0) {
        if (print_json(plan, sim, &o.costs) != 0) {
            fprintf(stderr, "pprun schedule: out of memory writing JSON\n");
            rc = 1;
            goto done;
        }
    } else {
        print_text(plan, sim, &o.costs);
    }
    rc = 0;
done:
    sched_sim_free(sim);
    sched_free(plan);
    return rc;
}
