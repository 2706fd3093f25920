/* test_devcomm.c: devcomm (runner/comm/devcomm.h), GPU point-to-point.
 *
 * Without the toolkit devcomm is not built: devcomm_open says so.  With it,
 * the transports' protocol runs on the CPU in devcomm_check (tests/gpu_emu/:
 * CUDA runtime and NCCL played by stand-ins, real processes, a real host
 * comm), one scenario per test.  What needs a GPU (two processes on one
 * GPU over cuda-ipc; nccl between two GPUs: the real runtime and NCCL)
 * runs where the devices are and skips saying why elsewhere. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef PPRUN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "helpers/comm_file_exchange.h"
#include "helpers/comm_world.h"
#include "helpers/trace_fixture.h"
#include "runner/comm/devcomm.h"
#include "runner/comm/devcomm_int.h"

/* A rank-0 host comm of a two-rank world over a file exchange in dir. */
static comm *open_host(const char *dir, const int *nodes) {
    comm_config cc = {.rank = 0, .world = 2, .rank_node = nodes, .job_key = "devcomm-open",
                      .exchange = fx_exchange(dir)};
    comm *c = NULL;
    pp_err e;
    cr_assert_eq(comm_open(&cc, &c, &e), 0, "%s", e.msg);
    return c;
}

/* Without every rank's node, ranks on two homogeneous servers (same PCI
 * bus ids) would look like one GPU: open refuses, naming what is missing
 * (the host comm carries the nodes), before touching CUDA. */
Test(devcomm, open_requires_the_node_of_every_rank) {
    const char *dir = tfix_mkdir("open-nodes"); /* removed when the test process exits */
    devcomm *d = (devcomm *)1;
    pp_err err = {{0}};
    comm *c = open_host(dir, NULL);
    devcomm_config cfg = {.host = c};
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert_null(d);
    cr_assert(strstr(err.msg, "no rank_node"), "%s", err.msg);
    comm_close(c);
    int nodes[2] = {0, -1};
    c = open_host(dir, nodes);
    cfg.host = c;
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert(strstr(err.msg, "rank_node[1] is -1"), "%s", err.msg);
    comm_close(c);
}

#ifndef PPRUN_HAVE_CUDA
Test(devcomm, open_says_it_is_not_built) {
    const char *dir = tfix_mkdir("open-not-built"); /* removed when the test process exits */
    devcomm *d = (devcomm *)1;
    pp_err err = {{0}};
    int nodes[2] = {0, 0};
    comm *c = open_host(dir, nodes);
    devcomm_config cfg = {.host = c};
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert_null(d);
    cr_assert(strstr(err.msg, "built without the GPU backend"), "%s", err.msg);
    cfg.transport = "udp"; /* bad input is still named first */
    cr_assert_eq(devcomm_open(&cfg, &d, &err), -1);
    cr_assert(strstr(err.msg, "unknown transport 'udp'"), "%s", err.msg);
    comm_close(c);
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

Test(devcomm, cuda_ipc_matches_by_tag_with_growing_then_reused_pools, .timeout = 120) {
    check("ipc");
}
Test(devcomm, nccl_matches_by_tag_over_announcement_order, .timeout = 120) {
    check("nccl");
}
Test(devcomm, mixed_world_picks_ipc_within_a_gpu_and_nccl_across, .timeout = 120) {
    check("mixed");
}
Test(devcomm, wrong_size_recv_fails_and_leaves_the_message, .timeout = 120) {
    check("wrong-len");
}
Test(devcomm, dead_peer_fails_the_call_naming_it, .timeout = 200) {
    check("dead");
}
Test(devcomm, nccl_error_or_recv_timeout_fails_naming_peer_tag_and_cause, .timeout = 120) {
    check("nccl-errors");
}
Test(devcomm, forced_transport_a_pair_cannot_use_fails_at_open, .timeout = 120) {
    check("forced");
}
Test(devcomm, stand_in_catches_receives_posted_in_tag_order, .timeout = 120) {
    check("mutant");
}
Test(devcomm, nccl_comm_id_in_the_environment_is_refused_at_open, .timeout = 120) {
    check("comm-id");
}
Test(devcomm, calls_made_with_another_device_current_use_the_ranks_device, .timeout = 120) {
    check("device");
}
Test(devcomm, close_does_not_wait_for_the_peer_to_close, .timeout = 120) {
    check("close");
}
Test(devcomm, stand_in_refuses_small_ipc_exports_and_work_on_the_wrong_device, .timeout = 60) {
    check("strict");
}

/* The names devcomm looks up exist in the toolkit's real libnccl.so.2
 * (loaded before any system copy). */
Test(devcomm, real_nccl_has_every_function_devcomm_calls) {
    unsetenv("PPRUN_NCCL_LIB");
    pp_err err = {{0}};
    cr_assert_eq(dc_nccl_library(&err), 0, "%s", err.msg);
    /* The version and file loaded, as NCCL error messages will show them. */
    const char *v = dc_nccl_version();
    cr_assert(!strncmp(v, "NCCL 2.", 7) && strstr(v, "/libnccl.so.2)"), "%s", v);
}

/* ---- on a GPU: the real runtime and NCCL ------------------------------------ */

typedef struct gpu_arg {
    const char *transport; /* "cuda-ipc" or "nccl" */
    int two_gpus;
    char dir[64];
    cw_result *res; /* its job_key is set before the ranks fork */
} gpu_arg;

/* 40 messages each way (sizes vary), received in reverse order. */
static int gpu_rank(comm *c, int rank, void *argp, pp_err *rep) {
    gpu_arg *a = argp;
    int n = 40, rc = 0;
    devcomm_config cfg = {.host = c, .device = a->two_gpus ? rank : 0, .transport = a->transport};
    devcomm *d = NULL;
    if (devcomm_open(&cfg, &d, rep) < 0) return -1;
    if (strcmp(devcomm_transport_name(d, 1 - rank), a->transport)) {
        devcomm_close(d);
        return pp_fail(rep, "transport %s, expected %s", devcomm_transport_name(d, 1 - rank), a->transport);
    }
    size_t cap = 1 << 20;
    unsigned char *h = malloc(cap);
    void *dev = NULL;
    if (!h || cudaMalloc(&dev, cap) != cudaSuccess) rc = pp_fail(rep, "cannot allocate buffers");
    for (int i = 0; i < n && rc == 0; i++) {
        size_t len = (size_t)(i * 26251) % cap;
        uint64_t tag = comm_tag((uint64_t)i, (uint64_t)(1 - rank), 0, COMM_DIR_ACT);
        for (size_t k = 0; k < len; k++)
            h[k] = (unsigned char)(tag * 7 + k);
        /* devcomm takes only data whose producing work has completed
         * (devcomm.h): a cudaMemcpy from pageable memory may return before
         * its DMA lands, and devcomm's copy runs on a stream of its own.
         * Without the synchronisation, 11 of 40 runs on an H100 sent the
         * previous message's bytes past its length. */
        if (cudaMemcpy(dev, h, len, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
            rc = pp_fail(rep, "upload failed");
        else
            rc = devcomm_send(d, 1 - rank, tag, dev, len, rep);
    }
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        size_t len = (size_t)(i * 26251) % cap;
        uint64_t tag = comm_tag((uint64_t)i, (uint64_t)rank, 0, COMM_DIR_ACT);
        if ((rc = devcomm_recv(d, 1 - rank, tag, dev, len, 30000, rep)) < 0) break;
        if (cudaMemcpy(h, dev, len, cudaMemcpyDeviceToHost) != cudaSuccess) rc = pp_fail(rep, "download failed");
        for (size_t k = 0; k < len && rc == 0; k++)
            if (h[k] != (unsigned char)(tag * 7 + k)) rc = pp_fail(rep, "message %d: byte %zu is wrong", i, k);
    }
    if (rc == 0) rc = devcomm_flush(d, 30000, rep);
    devcomm_close(d);
    cudaFree(dev);
    free(h);
    return rc;
}

/* The parent must not touch CUDA before forking: look for device nodes. */
static void gpu_world(const char *transport, int two_gpus) {
    if (access("/dev/nvidiactl", F_OK) != 0 || access(two_gpus ? "/dev/nvidia1" : "/dev/nvidia0", F_OK) != 0)
        cr_skip_test("needs %s: none on this machine (%s has never run on a GPU)", two_gpus ? "two GPUs" : "a GPU",
                     transport);
    cw_result res;
    gpu_arg a = {.transport = transport, .two_gpus = two_gpus, .res = &res};
    snprintf(a.dir, sizeof a.dir, "%s", tfix_mkdir("devgpu")); /* removed when the test process exits */
    cr_assert_eq(cw_run(2, (const int[]){0, 0}, NULL, gpu_rank, &a, &res), 0);
    for (int r = 0; r < 2; r++)
        cr_assert(res.exited[r] && res.code[r] == 0, "rank %d: %s", r, res.report[r]);
}

Test(devcomm, two_processes_on_one_gpu_over_cuda_ipc, .timeout = 120) {
    gpu_world("cuda-ipc", 0);
}
Test(devcomm, two_gpus_over_nccl, .timeout = 120) {
    gpu_world("nccl", 1);
}
#endif
