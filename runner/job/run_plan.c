/* run_plan.c: the planned timeline `pprun run` keeps in the plan table
 * (run_plan.h). */
#include "runner/job/run_plan.h"

#include <stdlib.h>

#include "db/analyze.h" /* db_op_medians, analyze_plan_costs */

int run_plan_write(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg,
                   const sched_costs *stage_costs, pp_err *err) {
    sched_costs *timed = NULL;
    if (!stage_costs) {
        if (!(timed = malloc(sizeof *timed * (size_t)plan->stages))) return pp_fail(err, "out of memory");
        int known = run_config_stage_costs(cfg, plan->stages, timed, err);
        if (known < 0) {
            free(timed);
            return -1;
        }
        if (known) stage_costs = timed;
    }
    sched_sim *sim = NULL;
    int simulated = stage_costs ? sched_simulate_stages(plan, stage_costs, &sim, err) : 0;
    free(timed);
    if (simulated != 0) return -1;
    /* Every replica runs the pipeline's plan on its own microbatches: rows
     * for global rank replica·P + r, microbatch replica·m + mb. */
    int replicas = cfg->dp > 1 ? cfg->dp : 1, P = plan->ranks, m = plan->microbatches;
    size_t total = 0;
    for (int r = 0; r < plan->ranks; r++)
        total += (size_t)plan->len[r];
    total *= (size_t)replicas;
    db_plan_row *rows = calloc(total ? total : 1, sizeof *rows);
    char(*names)[16] = calloc(total ? total : 1, sizeof *names);
    if (!rows || !names) {
        free(rows), free(names), sched_sim_free(sim);
        return pp_fail(err, "out of memory");
    }
    static const char *phase[] = {"F", "B", "W", "BW"}; /* by sched_op */
    size_t n = 0;
    for (int g = 0; g < replicas * P; g++) {
        int d = g / P, r = g % P;
        int k = 0; /* index into actions[r] (and the simulator's spans) */
        for (int slot = 0; slot < plan->nslots; slot++) {
            const sched_action *a = &plan->slots[r][slot];
            if (a->stage < 0) continue;
            sched_action global = {a->stage, a->op, d * m + a->mb};
            sched_action_str(&global, names[n]);
            rows[n] = (db_plan_row){
                .rank = g,
                .slot = slot,
                .action = names[n],
                .stage = a->stage,
                .phase = phase[a->op],
                .microbatch = global.mb,
                .sim_start_ns = -1,
                .sim_end_ns = -1,
            };
            if (sim && k < sim->nspans[r]) {
                rows[n].sim_start_ns = (int64_t)sim->spans[r][k].start;
                rows[n].sim_end_ns = (int64_t)sim->spans[r][k].end;
            }
            k++, n++;
        }
    }
    int rc = db_insert_plan(d, job_id, rows, n, err);
    free(rows), free(names), sched_sim_free(sim);
    return rc;
}

int run_plan_resimulate(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg, int first_step,
                        int last_step, pp_err *err) {
    if (db_program_plan(d, job_id)) return 1; /* the program's own plan (PyTorch's): not the launcher's to redo */
    int stages = plan->stages;
    int64_t *med = calloc((size_t)stages * 4, sizeof *med);
    unsigned *ops = calloc((size_t)stages, sizeof *ops);
    sched_costs *each = malloc(sizeof *each * (size_t)stages);
    int rc = !med || !ops || !each ? pp_fail(err, "out of memory")
                                   : db_op_medians(d, job_id, first_step, last_step, stages, med, err);
    if (rc == 0) {
        analyze_plan_ops(plan, ops);
        if (analyze_plan_costs(med, ops, stages, each)) rc = run_plan_write(d, job_id, plan, cfg, each, err) == 0 ? 1 : -1;
    }
    free(med), free(ops), free(each);
    return rc;
}
