/* test_gpu_cli.c: what `pprun run --device cuda` says on a machine without
 * a GPU (CI, and this project's development machines): exit 2 before any
 * worker starts, naming the missing device; without the toolkit at build
 * time, naming the missing backend. On a machine with a GPU the no-device
 * path cannot be exercised and the test skips saying so. Also the
 * --transport values of GPU jobs (cuda-ipc, nccl) and --cupti, and their
 * conflicts. Whole GPU jobs, schedule by schedule: test_gpu_run.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers/trace_fixture.h"
#include "launch_testutil.h"
#include "config/run_config.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu_internal.h"
#endif

Test(gpu_cli, device_cuda_without_gpu_exits_2_naming_the_device) {
#ifdef PPRUN_HAVE_CUDA
    int count = 0;
    pp_err err;
    if (gpu_device_count(&count, &err) == 0)
        cr_skip_test("a CUDA device is present (%d): the no-device path cannot be checked here", count);
#endif
    char dir[] = "/tmp/pprun-test-gpu-XXXXXX", db[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/job.db", dir);
    lt_proc p;
    const char *args[] = {"run", "--device", "cuda", "--steps", "1", "--db", db, NULL};
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 2, "exit %d, stderr: %s", p.status, p.err);
    struct stat st;
    cr_assert(stat(db, &st) != 0, "a refused job created its database %s", db); /* nothing started */
    rmdir(dir);
#ifdef PPRUN_HAVE_CUDA
    cr_assert(strstr(p.err, "--device cuda: no CUDA device found") != NULL, "stderr: %s", p.err);
    cr_assert(strstr(p.err, "cudaGetDeviceCount") != NULL, "stderr: %s", p.err);
#else
    cr_assert(strstr(p.err, "built without the GPU backend") != NULL, "stderr: %s", p.err);
#endif
    lt_free(&p);
}

Test(gpu_cli, dtype_is_checked_before_anything_starts) {
    struct { const char *args[8]; const char *want; } cases[] = {
        {{"run", "--dtype", "bf16", "--steps", "1", NULL}, "--dtype bf16 needs --device cuda"},
        {{"run", "--dtype", "fp16", "--device", "cuda", NULL}, "--dtype: 'fp16' is not accepted; accepted: fp32|bf16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lt_proc p;
        lt_run(&p, cases[i].args, NULL);
        cr_expect_eq(p.status, 2, "exit %d, stderr: %s", p.status, p.err);
        cr_expect(strstr(p.err, cases[i].want) != NULL, "stderr: %s", p.err);
        lt_free(&p);
    }
}

/* GPU transports without --device cuda, and unknown transports: exit 2
 * naming the conflict, before anything is created. */
Test(gpu_cli, transport_conflicts_exit_2_creating_nothing) {
    char dir[] = "/tmp/pprun-test-gpu-XXXXXX", db[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/job.db", dir);
    struct { const char *args[12]; const char *want; } cases[] = {
        {{"run", "--transport", "nccl", "--steps", "1", "--db", db, NULL},
         "--transport nccl moves tensors in GPU memory: it needs --device cuda (with --device cpu use --transport "
         "auto, shm or tcp)"},
        {{"run", "--device", "cpu", "--transport", "cuda-ipc", "--steps", "1", "--db", db, NULL},
         "--transport cuda-ipc moves tensors in GPU memory: it needs --device cuda"},
        {{"run", "--transport", "ib", "--steps", "1", "--db", db, NULL},
         "--transport: 'ib' is not accepted; accepted: auto|shm|tcp|cuda-ipc|nccl"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lt_proc p;
        lt_run(&p, cases[i].args, NULL);
        cr_expect_eq(p.status, 2, "case %zu: exit %d, stderr: %s", i, p.status, p.err);
        cr_expect(strstr(p.err, cases[i].want) != NULL, "case %zu: stderr: %s", i, p.err);
        struct stat st;
        cr_expect(stat(db, &st) != 0, "case %zu: a refused job created its database %s", i, db);
        lt_free(&p);
    }
    rmdir(dir);
}

/* Which jobs keep boundary tensors in GPU memory, and the forced GPU
 * transports checked against where the ranks' GPUs are (the launcher runs
 * this once it knows the device count). */
Test(gpu_cli, gpu_transport_choice_and_pairs) {
    run_config cfg;
    pp_err err = {{0}};
    struct { const char *device, *transport; int device_boundaries; } modes[] = {
        {"cuda", "auto", 1}, {"cuda", "cuda-ipc", 1}, {"cuda", "nccl", 1}, {"cuda", "shm", 0},
        {"cuda", "tcp", 0},  {"cpu", "auto", 0},      {"cpu", "shm", 0},
    };
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        run_config_default(&cfg);
        cr_assert_eq(run_config_option(&cfg, "--device", modes[i].device, &err), 1, "%s", err.msg);
        cr_assert_eq(run_config_option(&cfg, "--transport", modes[i].transport, &err), 1, "%s", err.msg);
        cr_expect_eq(run_config_device_boundaries(&cfg), modes[i].device_boundaries, "--device %s --transport %s",
                     modes[i].device, modes[i].transport);
    }
    struct { const char *transport; int ranks, nproc, devices; const char *want; } cases[] = {
        {"cuda-ipc", 4, 4, 1, NULL},
        {"cuda-ipc", 4, 4, 4, NULL}, /* IPC also between GPUs of one node */
        {"cuda-ipc", 4, 2, 2, "--transport cuda-ipc works within one node: ranks 1 and 2 are on nodes 0 and 1"},
        {"nccl", 4, 4, 4, NULL},
        {"nccl", 4, 2, 2, NULL}, /* two nodes, a GPU per rank */
        {"nccl", 4, 4, 1, "--transport nccl: ranks 0 and 1 share cuda:0 (4 ranks per node on 1 GPU)"},
        {"nccl", 4, 4, 2, "--transport nccl: ranks 0 and 2 share cuda:0 (4 ranks per node on 2 GPUs)"},
        {"auto", 4, 4, 1, NULL},
        {"auto", 4, 4, 2, NULL},
        {"shm", 4, 4, 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_config_default(&cfg);
        sched_plan *plan = NULL;
        cr_assert_eq(run_config_option(&cfg, "--device", "cuda", &err), 1);
        cr_assert_eq(run_config_option(&cfg, "--transport", cases[i].transport, &err), 1);
        cr_assert_eq(run_config_finish(&cfg, &err), 0, "%s", err.msg);
        cr_assert_eq(run_config_plan(&cfg, cases[i].ranks, NULL, &plan, &err), 0, "%s", err.msg);
        err.msg[0] = '\0';
        int rc = run_config_check_gpu_transport(&cfg, plan, cases[i].nproc, cases[i].devices, &err);
        if (cases[i].want) {
            cr_expect_eq(rc, -1, "case %zu accepted", i);
            cr_expect(strstr(err.msg, cases[i].want) != NULL, "case %zu: %s", i, err.msg);
        } else {
            cr_expect_eq(rc, 0, "case %zu: %s", i, err.msg);
        }
        sched_free(plan);
    }
}

#ifdef PPRUN_HAVE_CUDA
/* CUDA_VISIBLE_DEVICES=-1 hides every GPU: the same refusal, on any machine. */
Test(gpu_cli, hidden_devices_exit_2) {
    lt_proc p;
    const char *args[] = {"run", "--device", "cuda", "--steps", "1", "--db", "/dev/null/never.db", NULL};
    const char *env[] = {"CUDA_VISIBLE_DEVICES=-1", NULL};
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 2, "exit %d, stderr: %s", p.status, p.err);
    cr_assert(strstr(p.err, "no CUDA device found") != NULL, "stderr: %s", p.err);
    lt_free(&p);
}

Test(gpu_cli, device_count_without_gpu_names_the_cause) {
    int count = 7;
    pp_err err = {{0}};
    if (gpu_device_count(&count, &err) == 0) cr_skip_test("a CUDA device is present (%d)", count);
    cr_assert_eq(count, 0);
    const char *want = "no CUDA device found: cudaGetDeviceCount returned ";
    cr_assert(strncmp(err.msg, want, strlen(want)) == 0, "%s", err.msg);
}

/* cuBLAS is loaded on first use, not at start: the toolkit's library must
 * load and have every call the backend makes (no GPU needed for that). */
Test(gpu_cli, cublas_loads_on_demand) {
    pp_err err = {{0}};
    const gpu_blas_api *api = gpu_blas(&err);
    cr_assert_not_null(api, "%s", err.msg);
    cr_assert(api->create && api->destroy && api->set_stream && api->set_math_mode && api->sgemm &&
              api->sgemm_strided_batched && api->gemm_ex && api->status_string);
    cr_assert_str_eq(api->status_string(CUBLAS_STATUS_NOT_INITIALIZED), "the library was not initialized");
    cr_assert_eq(gpu_blas(&err), api); /* loaded once */
}

/* Runs a program built next to pprun; returns its exit status. */
static int run_sibling(const char *name) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s", PPRUN_BIN);
    char *slash = strrchr(cmd, '/');
    cr_assert_not_null(slash);
    snprintf(slash, sizeof cmd - (size_t)(slash - cmd), "/%s >/dev/null 2>&1", name);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The GPU code's logic, checked on the CPU (tests/gpu_emu/):
 * gpu_stage.c's wiring with the CPU kernels standing in for gpu.h, bit for
 * bit against the CPU stage over partitions, orders, a checkpoint and
 * device-resident boundary tensors; the engine's device-boundary path.
 * (The kernels and the cuBLAS mapping run on the CUDA emulator in
 * test_gpu_kernels_emu and test_gpu_stage_emu.) */

Test(gpu_cli, gpu_stage_wiring_matches_the_cpu_stage) {
    int rc = run_sibling("gpu_stagecheck");
    cr_assert_eq(rc, 0, "gpu_stagecheck exited %d: run it to see which case", rc);
}

/* The engine's GPU path on forked ranks (tests/gpu_emu/enginecheck.c):
 * device boundaries through a devcomm stand-in, local handoffs, host
 * staging with --transport shm, all equal to one rank bit for bit. */
Test(gpu_cli, engine_device_boundaries_match_one_rank) {
    int rc = run_sibling("gpu_enginecheck");
    cr_assert_eq(rc, 0, "gpu_enginecheck exited %d: run it to see which job", rc);
}

/* The same over the real devcomm (cuda-ipc for ranks on one stand-in GPU,
 * nccl across), on devcomm's CUDA runtime and NCCL stand-ins. */
Test(gpu_cli, engine_over_devcomm_matches_one_rank) {
    int rc = run_sibling("gpu_enginecheck_devcomm");
    cr_assert_eq(rc, 0, "gpu_enginecheck_devcomm exited %d: run it to see which job", rc);
}

Test(gpu_cli, ranks_share_devices_round_robin) {
    /* 4 ranks on one GPU all use it; 3 ranks on 2 GPUs: 0 1 0 */
    for (int r = 0; r < 4; r++) cr_assert_eq(gpu_device_for_rank(r, 1), 0);
    cr_assert_eq(gpu_device_for_rank(0, 2), 0);
    cr_assert_eq(gpu_device_for_rank(1, 2), 1);
    cr_assert_eq(gpu_device_for_rank(2, 2), 0);
    cr_assert_eq(gpu_device_for_rank(9, 8), 1);
    cr_assert_eq(gpu_device_for_rank(0, 0), -1);
}

/* On a GPU: forced transports that the ranks' GPUs do not allow are refused
 * before anything starts. */
Test(gpu_cli, forced_gpu_transport_the_gpus_cannot_carry_exits_2) {
    int count = 0;
    pp_err err;
    if (gpu_device_count(&count, &err) != 0) cr_skip_test("%s", err.msg);
    char dir[] = "/tmp/pprun-test-gpu-XXXXXX", db[64], nproc[16];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/job.db", dir);
    snprintf(nproc, sizeof nproc, "%d", count + 1); /* two ranks share cuda:0 */
    lt_proc p;
    const char *args[] = {"run", "--device", "cuda", "--transport", "nccl", "--nproc-per-node", nproc,
                          "--model", "gpt:layers=16,dim=64,heads=4,seq=32,batch=2", "--microbatches", "32",
                          "--steps", "1", "--db", db, NULL};
    lt_run(&p, args, NULL);
    cr_expect_eq(p.status, 2, "exit %d, stderr: %s", p.status, p.err);
    cr_expect(strstr(p.err, "NCCL refuses two ranks on one GPU") != NULL, "stderr: %s", p.err);
    struct stat st;
    cr_expect(stat(db, &st) != 0, "a refused job created its database %s", db);
    lt_free(&p);
    rmdir(dir);
}
#endif

/* --cupti values and conflicts: exit 2 naming them, before anything is
 * created; off is accepted on the CPU and recorded. */
Test(gpu_cli, cupti_flag_is_checked_before_anything_starts) {
    char dir[] = "/tmp/pprun-test-cupti-XXXXXX", db[96];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/job.db", dir);
    struct {
        const char *args[12];
        const char *want;
    } cases[] = {
        {{"run", "--cupti", "on", "--steps", "1", "--db", db, NULL},
         "--cupti on needs --device cuda (CUPTI traces GPU kernels; this job runs on --device cpu)"},
        {{"run", "--cupti", "on", "--device", "cuda", "--trace", "off", "--steps", "1", "--db", db, NULL},
         "--cupti on needs --trace on"},
        {{"run", "--cupti", "yes", "--device", "cuda", "--db", db, NULL}, "--cupti: 'yes' is not accepted; accepted: on|off"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lt_proc p;
        lt_run(&p, cases[i].args, NULL);
        cr_expect_eq(p.status, 2, "case %zu: exit %d, stderr: %s", i, p.status, p.err);
        cr_expect(strstr(p.err, cases[i].want) != NULL, "case %zu: stderr: %s", i, p.err);
        struct stat st;
        cr_expect(stat(db, &st) != 0, "case %zu: a refused job created its database", i);
        lt_free(&p);
    }
    /* off is fine on the CPU, and recorded with the job's options */
    lt_proc p;
    const char *ok[] = {"run",     "--cupti", "off", "--nproc-per-node", "1", "--steps", "1", "--model",
                        "timed:f=1ms,b=1ms,w=1ms,act=1KiB", "--db", db, "--progress", "off", NULL};
    lt_run(&p, ok, NULL);
    cr_assert_eq(p.status, 0, "exit %d, stderr: %s", p.status, p.err);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE json_extract(config_json,'$.cupti')='off'"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu'"), 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels"), 0);
    sqlite3_close(s);
    lt_free(&p);
    unlink(db);
    char side[128];
    snprintf(side, sizeof side, "%s-wal", db);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", db);
    unlink(side);
    rmdir(dir);
}
