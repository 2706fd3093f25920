/* test_gpu_cli.c: what `pprun run --device cuda` says on a machine without
 * a GPU (CI, and this project's development machines): exit 2 before any
 * worker starts, naming the missing device; without the toolkit at build
 * time, naming the missing backend. On a machine with a GPU the no-device
 * path cannot be exercised and the test skips saying so. */
#include <criterion/criterion.h>
#include <string.h>

#include "launch_testutil.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
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

#ifdef PPRUN_HAVE_CUDA
/* An empty CUDA_VISIBLE_DEVICES hides every GPU: the same refusal, on any machine. */
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

Test(gpu_cli, ranks_share_devices_round_robin) {
    /* 4 ranks on one GPU all use it; 3 ranks on 2 GPUs: 0 1 0 */
    for (int r = 0; r < 4; r++) cr_assert_eq(gpu_device_for_rank(r, 1), 0);
    cr_assert_eq(gpu_device_for_rank(0, 2), 0);
    cr_assert_eq(gpu_device_for_rank(1, 2), 1);
    cr_assert_eq(gpu_device_for_rank(2, 2), 0);
    cr_assert_eq(gpu_device_for_rank(9, 8), 1);
    cr_assert_eq(gpu_device_for_rank(0, 0), -1);
}
#endif
