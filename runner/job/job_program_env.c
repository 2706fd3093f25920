/* job_program_env.c: a user's program's environment (job_program_env.h). */
#include "runner/job/job_program_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Linux refuses to start a program with one environment string over 128
 * KiB (MAX_ARG_STRLEN): a long PPRUN_ACTIONS is refused here, naming it,
 * rather than every rank failing to start. */
#define RUN_ENV_STRING_MAX (128 * 1024 - 1)
int job_program_env_check(const sched_plan *plan, pp_err *err) {
    for (int r = 0; r < plan->ranks; r++) {
        size_t bytes = strlen("PPRUN_ACTIONS=");
        char action[16];
        for (int i = 0; i < plan->len[r]; i++) bytes += strlen(sched_action_str(&plan->actions[r][i], action)) + 1;
        if (bytes > RUN_ENV_STRING_MAX)
            return pp_fail(err, "rank %d's PPRUN_ACTIONS would be %zu bytes, more than the %d an environment variable "
                                "may hold; use fewer --microbatches or --virtual-stages", r, bytes, RUN_ENV_STRING_MAX);
    }
    return 0;
}

int job_mesh_env_set(const run_config *cfg, int rank, launch_env *env, pp_err *err) {
    int pp = cfg->pp > 0 ? cfg->pp : 1, dp = cfg->dp > 0 ? cfg->dp : 1;
    const struct {
        const char *name;
        int value;
    } nums[] = {{"PPRUN_PP_SIZE", pp}, {"PPRUN_PP_RANK", rank % pp}, {"PPRUN_DP_SIZE", dp}, {"PPRUN_DP_RANK", rank / pp}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        char num[32];
        snprintf(num, sizeof num, "%d", nums[i].value);
        if (launch_env_set(env, nums[i].name, num, err) != 0) return -1;
    }
    return 0;
}

int job_program_env_set(const sched_plan *plan, const run_config *cfg, int rank, launch_env *env, pp_err *err) {
    char num[32];
    /* the plan is one pipeline's: this rank's place in it, and the global
     * ranks of its replica */
    int base = rank / plan->ranks * plan->ranks;
    rank %= plan->ranks;
    const struct {
        const char *name;
        int value;
    } nums[] = {{"PPRUN_MICROBATCHES", plan->microbatches}, {"PPRUN_VIRTUAL_STAGES", plan->virtual_stages},
                {"PPRUN_NUM_STAGES", plan->stages}, {"PPRUN_STEPS", cfg->steps},
                {"PPRUN_RECV_TIMEOUT_MS", cfg->recv_timeout_ms}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        snprintf(num, sizeof num, "%d", nums[i].value);
        if (launch_env_set(env, nums[i].name, num, err) != 0) return -1;
    }
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    if (launch_env_set(env, "PPRUN_SCHEDULE", run_schedule_text(cfg, schedule, sizeof schedule), err) != 0) return -1;
    /* 24 bytes hold any "S," (at most 12) and any "{stage}{op}{mb} " (at most 16) */
    size_t size = (size_t)(plan->stages > plan->len[rank] ? plan->stages : plan->len[rank]) * 24 + 1;
    char *text = malloc(size);
    if (!text) return pp_fail(err, "out of memory");
    size_t n = 0;
    for (int s = 0; s < plan->stages; s++)
        n += (size_t)snprintf(text + n, size - n, s ? ",%d" : "%d", base + plan->stage_rank[s]);
    int rc = launch_env_set(env, "PPRUN_STAGE_RANKS", text, err);
    n = 0;
    text[0] = '\0';
    for (int i = 0; i < plan->len[rank]; i++) {
        char action[16];
        n += (size_t)snprintf(text + n, size - n, i ? " %s" : "%s", sched_action_str(&plan->actions[rank][i], action));
    }
    if (rc == 0) rc = launch_env_set(env, "PPRUN_ACTIONS", text, err);
    free(text);
    return rc;
}
