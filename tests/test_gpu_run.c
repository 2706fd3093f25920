/* test_gpu_run.c: whole `pprun run --device cuda` jobs: 4 ranks, every
 * schedule, give the one-rank GPU run's losses and final weights bit for
 * bit (the numerics contract on the device), with boundary tensors in GPU
 * memory over the transport auto picks (CUDA IPC on one GPU, NCCL across
 * GPUs) and, for 1F1B, staged through the host over shm; the ranks table
 * names each rank's device.
 *
 * The same for bf16 GEMM operands. Built twice (CMakeLists.txt). test_gpu_run runs pprun on the GPUs of the
 * machine and skips without one. test_gpu_run_emu (GPU_EMULATED) runs
 * pprun_emu: the same pprun with its kernels on the CUDA emulator
 * (bench/gpu_cpucheck/cuda_emu.h) and the CUDA runtime, cuBLAS and NCCL
 * played by the CPU stand-ins of bench/gpu_cpucheck/, which share "device"
 * memory between the rank processes as CUDA IPC does; it runs the layout
 * twice, on one stand-in GPU (cuda-ipc) and on two (nccl), with a smaller
 * model. What it proves is the whole GPU path's logic (worker, engine,
 * GPU stage, devcomm, the CUPTI-unavailable path); the GPU run adds the
 * hardware. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifdef GPU_EMULATED
#define SUITE gpu_run_emulated
#define BIN PPRUN_EMU_BIN
#define JOB "--microbatches 4 --steps 2 --model gpt:layers=8,dim=32,heads=4,seq=16,batch=2"
#else
#define SUITE gpu_run
#define BIN PPRUN_BIN
#define JOB "--microbatches 8 --steps 3 --model gpt:layers=8,dim=64,heads=4,seq=32,batch=2"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif
#endif

static char *slurp_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "missing %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    if (len) *len = got;
    return buf;
}

/* Every "losses":[...] of a metrics file, and the concatenated weights. */
static void job_result(const char *dir, const char *name, int stages, char **losses, char **w, size_t *wlen) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *text = slurp_all(path, NULL);
    *losses = calloc(1, strlen(text) + 1);
    for (char *p = strstr(text, "\"losses\":"); p; p = strstr(p + 1, "\"losses\":")) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(*losses, p, (size_t)(end - p + 1));
    }
    free(text);
    *w = NULL, *wlen = 0;
    for (int s = 0; s < stages; s++) {
        snprintf(path, sizeof path, "%s/%s.w/stage_%d.f32", dir, name, s);
        size_t n;
        char *part = slurp_all(path, &n);
        *w = realloc(*w, *wlen + n);
        memcpy(*w + *wlen, part, n);
        *wlen += n;
        free(part);
    }
}

/* Every schedule on `count` GPUs with GEMM operands in dtype; env is put in
 * front of each command. */
static void every_schedule(int count, const char *env, const char *dtype) {
    char dir[] = "/tmp/pprun-test-gpu-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    /* says: what rank 1's first line must say about rank 0 (NULL: the
     * transport auto picks, which depends on the device count) */
    static const struct { const char *name, *schedule, *extra; int ranks, stages; const char *says; } jobs[] = {
        {"ref", "1f1b", "", 1, 1, NULL},
        {"gpipe", "gpipe", "", 4, 4, NULL},
        {"1f1b", "1f1b", "", 4, 4, NULL},
        {"interleaved", "interleaved-1f1b", "--virtual-stages 2", 4, 8, NULL},
        {"zbh1", "zb-h1", "", 4, 4, NULL},
        {"zbv", "zb-v", "--virtual-stages 2", 4, 8, NULL},
        {"1f1b-shm", "1f1b", "--transport shm", 4, 4, "staged through host memory (--transport shm); rank 0: shm"},
    };
    char *ref_losses = NULL, *ref_w = NULL;
    size_t ref_len = 0;
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
        char cmd[2048];
        const char *n = jobs[j].name;
        snprintf(cmd, sizeof cmd,
                 "%s %s run --device cuda --dtype %s --nproc-per-node %d --schedule %s %s " JOB " --trace %s "
                 "--progress off --metrics %s/%s.jsonl --save-weights %s/%s.w --db %s/%s.db >%s/%s.log 2>&1",
                 env, BIN, dtype, jobs[j].ranks, jobs[j].schedule, jobs[j].extra, j == 1 ? "on" : "off", dir, n,
                 dir, n, dir, n, dir, n);
        int status = system(cmd);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s failed; see %s/%s.log", jobs[j].name, dir,
                  jobs[j].name);
        char *losses, *w;
        size_t len;
        job_result(dir, n, jobs[j].stages, &losses, &w, &len);
        if (jobs[j].ranks > 1) { /* the transport that carried the boundary tensors */
            char path[512];
            snprintf(path, sizeof path, "%s/%s.log", dir, n);
            char *log = slurp_all(path, NULL);
            const char *want = jobs[j].says ? jobs[j].says
                               : count == 1 ? "boundary tensors in GPU memory (cuda:0); rank 0: cuda-ipc"
                                            : "boundary tensors in GPU memory (cuda:1); rank 0: nccl";
            cr_expect(strstr(log, want) != NULL, "%s: rank 1 should say '%s'; log:\n%s", n, want, log);
            free(log);
        }
        if (j == 1 && count == 1) { /* the ranks table (a traced job's) names each rank's device */
            snprintf(cmd, sizeof cmd, "%s query --db %s/%s.db --format csv \"SELECT group_concat(device, ' ') FROM ranks\"",
                     BIN, dir, n);
            FILE *q = popen(cmd, "r");
            char line[256] = "", devs[256] = "";
            cr_assert_not_null(q);
            while (fgets(line, sizeof line, q)) snprintf(devs, sizeof devs, "%s", line);
            pclose(q);
            devs[strcspn(devs, "\r\n")] = '\0'; /* CSV rows end in CRLF (RFC 4180) */
            cr_expect_str_eq(devs, "cuda:0 cuda:0 cuda:0 cuda:0", "ranks.device: %s", devs);
        }
        if (j == 0) {
            ref_losses = losses, ref_w = w, ref_len = len;
            cr_assert(strlen(ref_losses) > 0, "the one-rank run reported no losses");
            continue;
        }
        cr_expect_str_eq(losses, ref_losses, "%s on %d GPU(s), %s: losses differ from the one-rank run",
                         jobs[j].name, count, dtype);
        cr_expect(len == ref_len && memcmp(w, ref_w, len) == 0, "%s: final weights differ from the one-rank run",
                  jobs[j].name);
        free(losses), free(w);
    }
    free(ref_losses), free(ref_w);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    cr_assert_eq(system(rm), 0);
}

#ifdef GPU_EMULATED
Test(SUITE, every_schedule_on_one_gpu_over_cuda_ipc_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(1, "PPRUN_STUB_DEVICES=1", "fp32");
}
Test(SUITE, every_schedule_on_two_gpus_over_nccl_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(2, "PPRUN_STUB_DEVICES=2 PPRUN_NCCL_LIB=" PPRUN_NCCL_STUB, "fp32");
}
Test(SUITE, bf16_every_schedule_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(1, "PPRUN_STUB_DEVICES=1", "bf16");
}
#else
Test(SUITE, device_cuda_every_schedule_matches_one_rank_bit_for_bit, .timeout = 600) {
#ifdef PPRUN_HAVE_CUDA
    int count = 0;
    pp_err err;
    if (gpu_device_count(&count, &err) != 0) cr_skip_test("%s", err.msg);
    every_schedule(count, "", "fp32");
    every_schedule(count, "", "bf16");
#else
    cr_skip_test("pprun was built without the CUDA toolkit (PPRUN_HAVE_CUDA unset)");
#endif
}
#endif
