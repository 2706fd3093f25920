/* test_devcomm.c: devcomm (runner/comm/devcomm.h), GPU point-to-point.
 *
 * Without the toolkit devcomm is not built: devcomm_open says so.  With it,
 * the transports' protocol runs on the CPU in devcomm_check (bench/gpu_cpucheck/:
 * CUDA runtime and NCCL played by stand-ins, real processes, a real host
 * comm), one scenario per test.  What needs a GPU (two processes on one
 * GPU over cuda-ipc; nccl between two GPUs) skips saying why. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers/comm_file_exchange.h"
#include "runner/comm/devcomm.h"

#ifndef PPRUN_HAVE_CUDA
Test(devcomm, open_says_it_is_not_built) {
    devcomm *d = (devcomm *)1;
    pp_err err = {{0}};
    int nodes[2] = {0, 0};
    int not_a_comm; /* never used: open fails before touching it */
    devcomm_config cfg = {.rank = 0, .world = 2, .rank_node = nodes, .host = (comm *)&not_a_comm,
                          .exchange = fx_exchange("/tmp"), .job_key = "k"};
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert_null(d);
    cr_assert(strstr(err.msg, "built without the GPU backend"), "%s", err.msg);
    cfg.transport = "udp"; /* bad input is still named first */
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert(strstr(err.msg, "unknown transport 'udp'"), "%s", err.msg);
}
#else
/* Runs devcomm_check SCENARIO (built next to pprun); its output comes back in out. */
static int run_check(const char *scenario, char *out, size_t cap) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "%s", PPRUN_BIN);
    char *slash = strrchr(cmd, '/');
    cr_assert_not_null(slash);
    snprintf(slash, sizeof cmd - (size_t)(slash - cmd), "/devcomm_check %s 2>&1", scenario);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void check(const char *scenario) {
    static char out[1 << 16];
    int rc = run_check(scenario, out, sizeof out);
    cr_assert_eq(rc, 0, "devcomm_check %s exited %d:\n%s", scenario, rc, out);
    cr_assert(strstr(out, "ok  "), "devcomm_check %s checked nothing:\n%s", scenario, out);
    cr_assert_null(strstr(out, "FAIL"), "%s", out);
}

Test(devcomm, cuda_ipc_matches_by_tag_with_growing_then_reused_pools, .timeout = 120) { check("ipc"); }
Test(devcomm, nccl_matches_by_tag_over_announcement_order, .timeout = 120) { check("nccl"); }
Test(devcomm, mixed_world_picks_ipc_within_a_gpu_and_nccl_across, .timeout = 120) { check("mixed"); }
Test(devcomm, wrong_size_recv_fails_and_leaves_the_message, .timeout = 120) { check("wrong-len"); }
Test(devcomm, dead_peer_fails_the_call_naming_it, .timeout = 200) { check("dead"); }
Test(devcomm, forced_transport_a_pair_cannot_use_fails_at_open, .timeout = 120) { check("forced"); }
Test(devcomm, stand_in_catches_receives_posted_in_tag_order, .timeout = 120) { check("mutant"); }

Test(devcomm, two_processes_on_one_gpu_over_cuda_ipc) {
    cr_skip_test("needs a GPU: no CUDA device on this machine (cuda-ipc has never run on a GPU)");
}

Test(devcomm, two_gpus_over_nccl) {
    cr_skip_test("needs two GPUs: nccl has never run on a GPU");
}
#endif
