/* test_gpu_run.c: whole `pprun run --device cuda` jobs: 4 ranks, every
 * schedule, give the one-rank GPU run's losses and final weights bit for
 * bit (the numerics contract on the device), with boundary tensors in GPU
 * memory over the transport auto picks (CUDA IPC on one GPU, NCCL across
 * GPUs) and, for 1F1B, staged through the host over shm; the ranks table
 * names each rank's device. With CUPTI on, every F/B/W has a gpu span
 * inside its host span and the kernels table names each kernel.
 *
 * The same for bf16 GEMM operands. Built twice. test_gpu_run runs pprun on
 * the GPUs of the machine and skips without one. test_gpu_run_emu
 * (tests/gpu_emu/CMakeLists.txt, GPU_EMULATED) runs
 * pprun_emu: the same pprun with its kernels on the CUDA emulator
 * (tests/gpu_emu/cuda_emu.h) and the CUDA runtime, cuBLAS and NCCL
 * played by the CPU stand-ins of tests/gpu_emu/, which share "device"
 * memory between the rank processes as CUDA IPC does; it runs the layout
 * twice, on one stand-in GPU (cuda-ipc) and on two (nccl), with a smaller
 * model, and CUPTI played by its stand-in (cupti_standin.c: records from
 * the emulator's launches). What it proves is the whole GPU path's logic
 * (worker, engine, GPU stage, devcomm, CUPTI tracing into the database);
 * the GPU run adds the hardware.
 *
 * Data parallel (--pp 2 --dp 2, --pp 1 --dp 2 and --dp 4) on the same GPUs,
 * the all-reduce in GPU memory over devcomm (cuda-ipc on one GPU, nccl
 * with a GPU per rank; every rank says which) and, with boundary tensors
 * staged through the host, on host memory; with ZeRO-1 (under DualPipeV)
 * and its checkpoints too, and bf16: losses, final weights and evaluation
 * losses of the one-rank run of the same global batch, bit for bit, and
 * the ALLREDUCE spans. A rank killed inside the all-reduce fails the job
 * naming it, soon. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers/trace_fixture.h"
#include "sched/sched.h"

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

#ifdef PPRUN_HAVE_CUDA /* the jobs: without the GPU backend every test skips */
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

/* The CUDA driver's per-process files in /dev/shm (cuda.shm.*): a worker
 * that used an interprocess event leaves one behind unless it resets its
 * device before exiting (gpu_device_release). */
static int cuda_shm_files(void) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, "cuda.shm.", 9) == 0;
    if (d) closedir(d);
    return n;
}

/* Under ASan, three times slower, the GPU runs keep the jobs whose host
 * code differs (the code the sanitizers check): a transport, a traced
 * job, fused and split backwards, virtual stages; the release build runs
 * them all. */
#ifdef __SANITIZE_ADDRESS__
#define EVERY_JOB_UNDER_ASAN 0
#else
#define EVERY_JOB_UNDER_ASAN 1
#endif

/* Every schedule on `count` GPUs with GEMM operands in dtype; env is put in
 * front of each command. Under ASan: the reference, GPipe (traced), ZB-V
 * (split backward, two stages a rank) and 1F1B over shm. */
static void every_schedule(int count, const char *env, const char *dtype) {
    char dir[256], name[64]; /* removed when the test process exits (tfix_path) */
    snprintf(name, sizeof name, "schedules-%d-%s", count, dtype); /* a test may run several */
    snprintf(dir, sizeof dir, "%s", tfix_mkdir(name));
    /* says: what rank 1's first line must say about rank 0 (NULL: the
     * transport auto picks, which depends on the device count) */
    static const struct {
        const char *name, *schedule, *extra;
        int ranks, stages;
        const char *says;
        int under_asan;
    } jobs[] = {
        {"ref", "1f1b", "", 1, 1, NULL, 1},
        {"gpipe", "gpipe", "", 4, 4, NULL, 1},
        {"1f1b", "1f1b", "", 4, 4, NULL, 0},
        {"interleaved", "interleaved-1f1b", "--virtual-stages 2", 4, 8, NULL, 0},
        {"zbh1", "zb-h1", "", 4, 4, NULL, 0},
        {"zbv", "zb-v", "--virtual-stages 2", 4, 8, NULL, 1},
        {"1f1b-shm", "1f1b", "--transport shm", 4, 4, "staged through host memory (--transport shm); rank 0: shm", 1},
    };
    char *ref_losses = NULL, *ref_w = NULL;
    size_t ref_len = 0;
    int shm_before = cuda_shm_files();
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
        if (!EVERY_JOB_UNDER_ASAN && !jobs[j].under_asan) continue;
        char cmd[2048];
        const char *n = jobs[j].name;
        snprintf(cmd, sizeof cmd,
                 "%s %s run --device cuda --dtype %s --nproc-per-node %d --schedule %s %s " JOB " --trace %s "
                 "--progress off --metrics %s/%s.jsonl --save-weights %s/%s.w --db %s/%s.db >%s/%s.log 2>&1",
                 env, BIN, dtype, jobs[j].ranks, jobs[j].schedule, jobs[j].extra, j == 1 ? "on" : "off", dir, n,
                 dir, n, dir, n, dir, n);
        int status = system(cmd);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { /* the log's end in the message: the dir goes at exit */
            char path[512];
            snprintf(path, sizeof path, "%s/%s.log", dir, n);
            char *log = slurp_all(path, NULL);
            size_t len = strlen(log);
            cr_assert_fail("%s failed (status %d); the end of %s:\n%s", n, status, path,
                           log + (len > 4000 ? len - 4000 : 0));
        }
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
        if (j == 1) { /* the traced job's last lines say why its bubble is above the plan */
            char path[512], want[64];
            snprintf(path, sizeof path, "%s/%s.log", dir, n);
            snprintf(want, sizeof want, " planned (%d ranks shared one GPU)", 4 / count);
            char *log = slurp_all(path, NULL);
            cr_expect(strstr(log, want) != NULL, "%s: want '%s' in:\n%s", n, want, log);
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
    cr_expect_eq(cuda_shm_files(), shm_before, "the jobs left files of the CUDA driver in /dev/shm (cuda.shm.*)");
}

/* Runs cmd (its output into dir/name.log), failing with the log's end. */
static void run_job(const char *dir, const char *name, const char *cmd) {
    int status = system(cmd);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    char *log = slurp_all(path, NULL);
    size_t len = strlen(log);
    cr_assert_fail("%s failed (status %d); the end of %s:\n%s", name, status, path, log + (len > 4000 ? len - 4000 : 0));
}

/* DualPipeV on `ranks` ranks (on the emulator: sharing one stand-in GPU
 * over cuda-ipc, and two ranks on two over nccl), traced with CUPTI:
 * the one-rank run's losses and final weights bit for bit; every F, B, W
 * and BW has a gpu span inside its host span, every kernel lies in the gpu
 * span it points at; the two halves of a pair run at once on the rank's
 * two threads and streams, so their host spans overlap. How many do
 * depends on the machine (a half waiting for its input starts late, and
 * the emulator runs one kernel at a time), so the bound is half of the
 * pairs, as test_run_trace's on the CPU: run in turn, none would. */
static void dualpipev_job(const char *env, int ranks, const char *label) {
    int m = 2 * ranks, steps = 2; /* DualPipeV: at least as many microbatches as its 2p stages */
    char dir[256], name[64], cmd[2048], path[512];
    snprintf(name, sizeof name, "dualpipev-%d-%s", ranks, label);
    snprintf(dir, sizeof dir, "%s", tfix_mkdir(name));
#define DPV_MODEL "--model gpt:layers=8,dim=32,heads=4,seq=16,batch=2"
    snprintf(cmd, sizeof cmd,
             "%s %s run --device cuda --nproc-per-node 1 --microbatches %d --steps %d " DPV_MODEL " --trace off "
             "--progress off --metrics %s/ref.jsonl --save-weights %s/ref.w >%s/ref.log 2>&1",
             env, BIN, m, steps, dir, dir, dir);
    run_job(dir, "ref", cmd);
    snprintf(cmd, sizeof cmd,
             "%s %s run --device cuda --nproc-per-node %d --schedule dualpipev --microbatches %d --steps %d " DPV_MODEL
             " --progress off --metrics %s/dpv.jsonl --save-weights %s/dpv.w --db %s/dpv.db >%s/dpv.log 2>&1",
             env, BIN, ranks, m, steps, dir, dir, dir, dir);
    run_job(dir, "dpv", cmd);
    char *ref_losses, *ref_w, *losses, *w;
    size_t ref_len, len;
    job_result(dir, "ref", 1, &ref_losses, &ref_w, &ref_len);
    job_result(dir, "dpv", 2 * ranks, &losses, &w, &len);
    cr_assert(strlen(ref_losses) > 0, "the one-rank run reported no losses");
    cr_expect_str_eq(losses, ref_losses, "dualpipev on %d ranks: losses differ from the one-rank run", ranks);
    cr_expect(len == ref_len && memcmp(w, ref_w, len) == 0, "dualpipev on %d ranks: final weights differ", ranks);
    free(ref_losses), free(ref_w), free(losses), free(w);
    snprintf(path, sizeof path, "%s/dpv.log", dir);
    char *log = slurp_all(path, NULL);
    cr_expect(strstr(log, "boundary tensors in GPU memory (cuda:") != NULL, "%s", log);
    cr_expect(strstr(log, "no GPU spans") == NULL && strstr(log, "CUPTI tracing off") == NULL, "%s", log);
    free(log);

    sqlite3 *s;
    snprintf(path, sizeof path, "%s/dpv.db", dir);
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    int64_t ops = tfix_q_int(s, "SELECT count(*) FROM events WHERE source='cpu' AND phase IN ('F','B','W','BW')");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='cpu' AND phase = 'F'"),
                 (int64_t)steps * m * 2 * ranks, "every F once");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events g JOIN events h ON h.job_id=g.job_id AND h.rank=g.rank"
                               " AND h.step=g.step AND h.phase=g.phase AND h.stage=g.stage"
                               " AND h.microbatch=g.microbatch AND h.attempt=g.attempt AND h.source='cpu'"
                               " WHERE g.source='gpu' AND g.phase IN ('F','B','W','BW')"
                               " AND g.start_ns >= h.start_ns - 50000 AND g.end_ns <= h.end_ns + 50000"),
                 ops, "every F/B/W/BW has a gpu span inside its host span");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels k LEFT JOIN events e ON e.id=k.event_id"
                               " WHERE k.event_id IS NOT NULL AND (e.source IS NOT 'gpu' OR k.start_ns < e.start_ns"
                               " OR k.end_ns > e.end_ns)"),
                 0, "a kernel outside the gpu span it points at");
    pp_err err;
    sched_plan *plan = NULL;
    cr_assert_eq(sched_from_flag("dualpipev", ranks, m, 0, NULL, &plan, &err), 0, "%s", err.msg);
    int pairs = 0, overlapped = 0;
    for (int r = 0; r < ranks; r++)
        for (int i = 0; i + 1 < plan->len[r]; i++) {
            if (!sched_overlaps(plan, r, i)) continue;
            const sched_action *f = &plan->actions[r][i], *b = &plan->actions[r][i + 1];
            pairs += steps;
            overlapped += (int)tfix_q_intf(s,
                                          "SELECT count(*) FROM events f JOIN events b ON f.step = b.step "
                                          "WHERE f.source = 'cpu' AND b.source = 'cpu' AND f.rank = %d "
                                          "AND f.phase = 'F' AND f.stage = %d AND f.microbatch = %d "
                                          "AND b.rank = %d AND b.phase IN ('B','BW') AND b.stage = %d "
                                          "AND b.microbatch = %d AND f.start_ns < b.end_ns AND b.start_ns < f.end_ns",
                                          r, f->stage, f->mb, r, b->stage, b->mb);
        }
    sched_free(plan);
    cr_log_info("dualpipev on %d ranks (%s): %d of %d pairs overlapped", ranks, label, overlapped, pairs);
    cr_assert_gt(pairs, 0);
    cr_assert_geq(overlapped * 2, pairs, "%d of %d pairs overlapped in the trace", overlapped, pairs);
    sqlite3_close(s);
}

/* Two ranks on one GPU, CUPTI on by default: every F/B/W has a gpu span
 * lying inside its host span (CUPTI's timestamps are the host clock; the
 * GPU stage synchronises at the end of each op), kernels rows carry names
 * and point at gpu spans, and the analyses see the host spans only. */
static void cupti_job(const char *env) {
    char dir[256], cmd[1024], path[512]; /* dir: removed when the test process exits (tfix_path) */
    snprintf(dir, sizeof dir, "%s", tfix_mkdir("cupti"));
    snprintf(cmd, sizeof cmd,
             "%s %s run --device cuda --nproc-per-node 2 --steps 2 --microbatches 4 "
             "--model gpt:layers=2,dim=64,heads=2,seq=32,batch=2 --db %s/job.db --progress off >%s/job.log 2>&1",
             env, BIN, dir, dir);
    int status = system(cmd);
    snprintf(path, sizeof path, "%s/job.log", dir);
    char *log = slurp_all(path, NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit %d: %s", status, log);
    cr_assert(strstr(log, "no GPU spans") == NULL, "CUPTI was unavailable: %s", log);
    free(log);
    sqlite3 *s;
    snprintf(path, sizeof path, "%s/job.db", dir);
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_gt(tfix_q_int(s, "SELECT count(*) FROM kernels"), 0, "kernels were recorded");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels WHERE name = '' OR name = '(name lost)'"), 0);
    int64_t fbw = tfix_q_int(s, "SELECT count(*) FROM events WHERE source='cpu' AND phase IN ('F','B','W')");
    int64_t gpu = tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu' AND phase IN ('F','B','W')");
    cr_assert_eq(gpu, fbw, "every F/B/W has a gpu span (%lld of %lld)", (long long)gpu,
                 (long long)fbw);
    /* 50 us of slack: the host span's clock reads bracket the op, the GPU
     * clock is mapped onto the host's by CUPTI's interpolation. */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events g JOIN events h ON h.job_id=g.job_id AND h.rank=g.rank"
                          " AND h.step=g.step AND h.phase=g.phase AND h.stage=g.stage AND h.microbatch=g.microbatch"
                          " AND h.attempt=g.attempt AND h.source='cpu'"
                          " WHERE g.source='gpu' AND g.phase IN ('F','B','W')"
                          " AND (g.start_ns < h.start_ns - 50000 OR g.end_ns > h.end_ns + 50000)"),
                 0, "a gpu span outside its host span");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels k LEFT JOIN events e ON e.id=k.event_id"
                          " WHERE k.event_id IS NOT NULL AND (e.source IS NOT 'gpu' OR k.start_ns < e.start_ns"
                          " OR k.end_ns > e.end_ns)"),
                 0, "a kernel points at a gpu span that holds it");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 4, "2 steps x 2 ranks analysed");
    cr_assert_eq(tfix_q_int(s, "SELECT sum(cupti_dropped) FROM ranks"), 0, "CUPTI records lost");
    /* what CUPTI's step end costs the training thread: a span per rank and
     * step, after the step's OPT */
    cr_assert_eq(tfix_q_int(s, "SELECT count(DISTINCT rank || ' ' || step) FROM events WHERE phase='SPAN'"
                               " AND name='GPU_TRACE' AND source='cpu'"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events t JOIN events o ON o.rank=t.rank AND o.step=t.step"
                               " AND o.phase='OPT' WHERE t.name='GPU_TRACE' AND t.start_ns < o.end_ns"), 0);
    sqlite3_close(s);
}

/* The data-parallel jobs' model: four layers, a layer a stage in the
 * deepest of them (ZB-V and DualPipeV, two ranks of two stages). */
#define DP_MODEL "--model gpt:layers=4,dim=32,heads=4,seq=16,batch=2"

/* One job in dir: pprun run with args, its metrics, weights, database and
 * log named `name`; fails the test with the log's end when it fails. */
static void dp_job(const char *dir, const char *env, const char *name, const char *args) {
    char cmd[2048], path[512];
    snprintf(cmd, sizeof cmd,
             "%s %s run --device cuda %s " DP_MODEL " --steps 2 "
             "--progress off --metrics %s/%s.jsonl --save-weights %s/%s.w --db %s/%s.db >%s/%s.log 2>&1",
             env, BIN, args, dir, name, dir, name, dir, name, dir, name);
    int status = system(cmd);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    char *log = slurp_all(path, NULL);
    size_t len = strlen(log);
    cr_assert_fail("%s failed (status %d); the end of its log:\n%s", name, status, log + (len > 4000 ? len - 4000 : 0));
}

/* Every `key`[...] of a metrics file, concatenated (job_result's losses for another key). */
static char *metrics_arrays(const char *dir, const char *name, const char *key) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *text = slurp_all(path, NULL), *out = calloc(1, strlen(text) + 1);
    for (char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(out, p, (size_t)(end - p + 1));
    }
    free(text);
    return out;
}

/* What rank 0 of a data-parallel job says about its all-reduce: where it
 * runs, and the transport to its first peer (rank `peer`). */
static void expect_allreduce_line(const char *dir, const char *name, int device, int peer, const char *transport) {
    char path[512], want[256];
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    snprintf(want, sizeof want, "pprun worker (rank 0): gradient all-reduce %s; rank %d: %s",
             device ? "in GPU memory" : "staged through host memory", peer, transport);
    char *log = slurp_all(path, NULL);
    cr_expect(strstr(log, want) != NULL, "%s: want '%s' in:\n%s", name, want, log);
    free(log);
}

/* devcomm's transport between ranks a and b on `count` GPUs (rank r on
 * r % count: gpu_device_for_rank). */
static const char *transport_between(int a, int b, int count) {
    return a % count == b % count ? "cuda-ipc" : "nccl";
}

/* --pp 2 --dp 2 (and --pp 1) on `count` GPUs (docs/gpu.md, "Data
 * parallel"): each stage's gradient all-reduced bucket by bucket, in GPU
 * memory over devcomm (cuda-ipc or nccl, as every rank says) or, with
 * boundary tensors staged through the host, on host memory, gives the
 * losses and final weights of one rank running the same global batch, bit
 * for bit; the ALLREDUCE spans carry each stage's gradient; evaluation
 * steps on the GPU give the one-rank GPU evaluation's losses. */
static void data_parallel(const char *label, const char *env, int count, int every_job) {
    char dir[256], name[64];
    snprintf(name, sizeof name, "dp-%s", label);
    snprintf(dir, sizeof dir, "%s", tfix_mkdir(name));
/* each replica's share of the reference's 8 microbatches and 4 evaluation ones */
#define PP2DP2 "--nproc-per-node 4 --pp 2 --dp 2 --microbatches 4 --eval-microbatches 2 "
#define PP1DP4 "--nproc-per-node 4 --pp 1 --dp 4 --microbatches 2 --eval-microbatches 1 "
    /* pp: ranks per pipeline (rank 0's first peer is rank pp); host: boundary
     * tensors staged through the host, and so the all-reduce */
    /* core: the jobs whose device memory traffic differs by transport
     * (buckets traced, ZeRO-1's gather and checkpoint, the host path); the
     * others vary the schedule and the dtype, which one transport covers */
    static const struct { const char *name, *args; int stages, bf16, pp, host, core; } jobs[] = {
        /* traced, with buckets of 16 KiB: several a stage */
        {"1f1b", PP2DP2 "--schedule 1f1b --dp-bucket 16KiB", 2, 0, 2, 0, 1},
        {"zbv", PP2DP2 "--schedule zb-v --virtual-stages 2 --trace off", 4, 0, 2, 0, 0},
        {"zbh1", PP2DP2 "--schedule zb-h1 --trace off", 2, 0, 2, 0, 0},
        /* ZeRO-1 under DualPipeV's overlapped pairs, traced, a checkpoint
         * after each step (the optimizer state gathered whole for it, then
         * sharded again) */
        {"zero1", PP2DP2 "--schedule dualpipev --zero1 --dp-bucket 16KiB --checkpoint-every 1", 4, 0, 2, 0, 1},
        /* bf16: the gathered weights' bf16 copy rewritten (params_written) */
        {"zero1-bf16", PP2DP2 "--schedule 1f1b --zero1 --dp-bucket 16KiB --trace off --dtype bf16", 2, 1, 2, 0, 0},
        /* two ranks, one stage each; four ranks in one group */
        {"dp2", "--nproc-per-node 2 --pp 1 --dp 2 --microbatches 4 --eval-microbatches 2 --dp-bucket 16KiB --trace off",
         1, 0, 1, 0, 0},
        {"dp4-zero1", PP1DP4 "--zero1 --dp-bucket 16KiB --trace off", 1, 0, 1, 0, 0},
        {"dp4-bf16", PP1DP4 "--trace off --dtype bf16", 1, 1, 1, 0, 0},
        /* the host path: boundary tensors (and so the all-reduce) through host memory */
        {"host", PP2DP2 "--schedule 1f1b --transport shm --trace off", 2, 0, 2, 1, 1},
        {"host-zero1-bf16", PP2DP2 "--schedule 1f1b --transport shm --zero1 --trace off --dtype bf16", 2, 1, 2, 1, 0},
    };
    /* the one-rank runs, fp32 and bf16 */
    static const char *const ref_name[2] = {"ref", "ref16"};
    char *ref_losses[2], *ref_w[2], *ref_eval[2];
    size_t ref_len[2];
    int need[2] = {0, 0};
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) need[jobs[j].bf16] |= every_job || jobs[j].core;
    for (int k = 0; k < 2; k++) {
        ref_losses[k] = ref_w[k] = ref_eval[k] = NULL;
        if (!need[k]) continue;
        char args[256];
        snprintf(args, sizeof args, "--nproc-per-node 1 --microbatches 8 --trace off --eval-every 1 "
                 "--eval-microbatches 4 --dtype %s", k ? "bf16" : "fp32");
        dp_job(dir, env, ref_name[k], args);
        ref_eval[k] = metrics_arrays(dir, ref_name[k], "\"eval_losses\":");
        job_result(dir, ref_name[k], 1, &ref_losses[k], &ref_w[k], &ref_len[k]);
        cr_assert(strlen(ref_losses[k]) > 0 && strlen(ref_eval[k]) > 0, "the one-rank run reported no losses");
    }
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
        if (!every_job && !jobs[j].core) continue;
        char args[1024]; /* the evaluations (which hold out the data's last tenth) as the reference's */
        snprintf(args, sizeof args, "--eval-every 1 --checkpoint-dir %s/%s.ckpt %s", dir, jobs[j].name, jobs[j].args);
        dp_job(dir, env, jobs[j].name, args);
        expect_allreduce_line(dir, jobs[j].name, !jobs[j].host, jobs[j].pp,
                              jobs[j].host ? "shm" : transport_between(0, jobs[j].pp, count));
        char *losses, *w;
        size_t len;
        int k = jobs[j].bf16;
        job_result(dir, jobs[j].name, jobs[j].stages, &losses, &w, &len);
        cr_expect_str_eq(losses, ref_losses[k], "%s (%s): losses differ from the one-rank run", jobs[j].name, label);
        cr_expect(len == ref_len[k] && memcmp(w, ref_w[k], len) == 0, "%s (%s): final weights differ from the "
                  "one-rank run", jobs[j].name, label);
        char *ev = metrics_arrays(dir, jobs[j].name, "\"eval_losses\":");
        cr_expect_str_eq(ev, ref_eval[k], "%s (%s): evaluation losses differ from the one-rank GPU evaluation",
                         jobs[j].name, label);
        free(losses), free(w), free(ev);
    }
    /* The traced job: on every rank, step and stage, the buckets' ALLREDUCE
     * spans add up to the stage's gradient (its OPT's state bytes are four
     * floats a weight), each bucket once, after the stage's last W. */
    sqlite3 *s;
    char path[512];
    snprintf(path, sizeof path, "%s/1f1b.db", dir);
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_expect_eq(tfix_q_int(s, "SELECT count(DISTINCT rank || ' ' || step || ' ' || stage) FROM events"
                               " WHERE name='ALLREDUCE'"), 4 * 2, "an ALLREDUCE on every rank and step");
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM (SELECT o.rank, o.step FROM events o JOIN events a ON"
                               " a.rank=o.rank AND a.step=o.step AND a.name='ALLREDUCE' WHERE o.phase='OPT'"
                               " GROUP BY o.rank, o.step HAVING sum(a.bytes) * 4 != max(o.bytes))"),
                 0, "ALLREDUCE bytes that are not the stage's gradient bytes");
    cr_expect_gt(tfix_q_int(s, "SELECT max(microbatch) FROM events WHERE name='ALLREDUCE'"), 0, "one bucket only");
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM (SELECT 1 FROM events WHERE name='ALLREDUCE'"
                               " GROUP BY rank, step, stage, microbatch HAVING count(*) > 1)"), 0);
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name='ALLREDUCE' AND peer != rank % 2"), 0,
                 "an ALLREDUCE that names another group than its rank's (the group's first rank)");
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM events a WHERE a.name='ALLREDUCE' AND a.start_ns <"
                               " (SELECT max(end_ns) FROM events w WHERE w.phase='W' AND w.rank=a.rank AND"
                               " w.step=a.step AND w.stage=a.stage)"), 0, "an ALLREDUCE before its stage's last W");
    /* ZeRO-1: the two replicas' shards of the optimizer state make the whole */
    int64_t whole = tfix_q_int(s, "SELECT sum(optim_bytes) FROM events WHERE phase='OPT' AND step=0");
    sqlite3_close(s);
    snprintf(path, sizeof path, "%s/zero1.db", dir);
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name='ALLREDUCE'"), 0);
    cr_expect_gt(tfix_q_int(s, "SELECT count(*) FROM events WHERE name='ALL_GATHER'"), 0);
    cr_expect_eq(tfix_q_int(s, "SELECT sum(optim_bytes) FROM events WHERE phase='OPT' AND step=0"), whole / 2,
                 "each replica's ranks hold half of the optimizer state");
    sqlite3_close(s);
    for (int k = 0; k < 2; k++) free(ref_losses[k]), free(ref_eval[k]), free(ref_w[k]);
}

/* Rank 3 killed inside step 1's all-reduce, once its part of the first
 * bucket is out (in GPU memory, on `count` GPUs): the job fails naming it,
 * well before the receive timeout, and its peers never finish the
 * all-reduce it left. */
static void data_parallel_killed(const char *label, const char *env, int count) {
    char dir[256], name[64], cmd[2048], path[512];
    snprintf(name, sizeof name, "dp-killed-%s", label);
    snprintf(dir, sizeof dir, "%s", tfix_mkdir(name));
    snprintf(cmd, sizeof cmd,
             "%s %s run --device cuda --nproc-per-node 4 --pp 2 --dp 2 --microbatches 4 --steps 3 " DP_MODEL
             " --fail-at step=1,rank=3,phase=allreduce --recv-timeout 120s --progress off --db %s/job.db"
             " >%s/job.log 2>&1",
             env, BIN, dir, dir);
    uint64_t t0 = pp_now_ns();
    int status = system(cmd);
    double secs = (double)(pp_now_ns() - t0) / 1e9;
    snprintf(path, sizeof path, "%s/job.log", dir);
    char *log = slurp_all(path, NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit %d:\n%s", status, log);
    cr_assert(secs < 60, "the job took %.1f s: somebody waited for its timeout\n%s", secs, log);
    cr_assert(strstr(log, "rank      : 3") != NULL, "the failure should name rank 3:\n%s", log);
    char want[128];
    snprintf(want, sizeof want, "pprun worker (rank 3): gradient all-reduce in GPU memory; rank 1: %s",
             transport_between(3, 1, count));
    cr_assert(strstr(log, want) != NULL, "want '%s' in:\n%s", want, log);
    free(log);
    sqlite3 *s;
    snprintf(path, sizeof path, "%s/job.db", dir);
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_expect_eq(tfix_q_int(s, "SELECT failed_rank FROM jobs"), 3);
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE status='failed'"), 1);
    cr_expect_gt(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank=3 AND step=0 AND name='ALLREDUCE'"), 0);
    cr_expect_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank IN (1, 3) AND step=1 AND name='ALLREDUCE'"), 0,
                 "its group finished an all-reduce it never finished");
    sqlite3_close(s);
}
#endif

#ifdef GPU_EMULATED
Test(SUITE, every_schedule_on_one_gpu_over_cuda_ipc_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(1, "PPRUN_STUB_DEVICES=1", "fp32");
}
Test(SUITE, every_schedule_on_two_gpus_over_nccl_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(2, "PPRUN_STUB_DEVICES=2 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, "fp32");
}
Test(SUITE, bf16_every_schedule_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(1, "PPRUN_STUB_DEVICES=1", "bf16");
}
Test(SUITE, cuda_job_records_gpu_spans_inside_host_spans, .timeout = 300) { cupti_job("PPRUN_STUB_DEVICES=1"); }
/* Over NCCL, the jobs whose traffic differs by transport; the others
 * vary the schedule and the dtype, which cuda-ipc covers here and NCCL
 * with kernels that run late (below). Under ASan, three times slower,
 * cuda-ipc keeps those jobs too (the host code that the sanitizers
 * check). */
Test(SUITE, data_parallel_on_one_gpu_over_cuda_ipc_matches_one_rank_bit_for_bit, .timeout = 600) {
    data_parallel("ipc", "PPRUN_STUB_DEVICES=1", 1, EVERY_JOB_UNDER_ASAN);
}
Test(SUITE, data_parallel_on_a_gpu_per_rank_over_nccl_matches_one_rank_bit_for_bit, .timeout = 600) {
    data_parallel("nccl", "PPRUN_STUB_DEVICES=4 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, 4, 0);
}
Test(SUITE, a_rank_killed_in_a_cuda_ipc_allreduce_fails_the_job_naming_it, .timeout = 300) {
    data_parallel_killed("ipc", "PPRUN_STUB_DEVICES=1", 1);
}
Test(SUITE, a_rank_killed_in_an_nccl_allreduce_fails_the_job_naming_it, .timeout = 300) {
    data_parallel_killed("nccl", "PPRUN_STUB_DEVICES=4 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, 4);
}
Test(SUITE, dualpipev_pairs_overlap_on_two_streams_and_match_one_rank_bit_for_bit, .timeout = 600) {
    dualpipev_job("PPRUN_STUB_DEVICES=1", 2, "ipc");
    dualpipev_job("PPRUN_STUB_DEVICES=1", 4, "ipc");
    dualpipev_job("PPRUN_STUB_DEVICES=2 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, 2, "nccl"); /* a GPU per rank */
}
/* The same jobs with every kernel and GEMM queued on its stream and run
 * 50 us late (PPRUN_STUB_ASYNC_US, cuda_emu.h), as on a GPU: the host
 * runs ahead of its kernels, so a buffer handed to another stream or rank
 * before the kernels that write it have run gives other bits. */
#define LATE "PPRUN_STUB_ASYNC_US=50 "
Test(SUITE, every_schedule_with_kernels_that_run_late_matches_one_rank_bit_for_bit, .timeout = 600) {
    every_schedule(1, LATE "PPRUN_STUB_DEVICES=1", "fp32");
}
Test(SUITE, dualpipev_with_kernels_that_run_late_matches_one_rank_bit_for_bit, .timeout = 600) {
    dualpipev_job(LATE "PPRUN_STUB_DEVICES=1", 4, "ipc-late");
}
#ifndef __SANITIZE_ADDRESS__ /* 12 jobs, 100 s there; the two above run the late launches under ASan */
Test(SUITE, data_parallel_with_kernels_that_run_late_matches_one_rank_bit_for_bit, .timeout = 600) {
    data_parallel("nccl-late", LATE "PPRUN_STUB_DEVICES=4 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, 4, 1);
}
#endif
#else
/* On the machine's GPUs, `count` of them; the test skips without one, or
 * in a build without the GPU backend (body never compiled there). */
#ifdef PPRUN_HAVE_CUDA
static int machine_gpus(void) {
    int count = 0;
    pp_err err;
    if (gpu_device_count(&count, &err) != 0) cr_skip_test("%s", err.msg);
    return count;
}
#define ON_GPUS(...)                  \
    do {                              \
        int count = machine_gpus();   \
        (void)count;                  \
        __VA_ARGS__;                  \
    } while (0)
#else
#define ON_GPUS(...) cr_skip_test("pprun was built without the CUDA toolkit (PPRUN_HAVE_CUDA unset)")
#endif
Test(SUITE, device_cuda_every_schedule_matches_one_rank_bit_for_bit, .timeout = 600) {
    ON_GPUS(every_schedule(count, "", "fp32"); every_schedule(count, "", "bf16"));
}
Test(SUITE, cuda_job_records_gpu_spans_inside_host_spans, .timeout = 300) { ON_GPUS(cupti_job("")); }
Test(SUITE, data_parallel_matches_one_rank_bit_for_bit, .timeout = 600) { ON_GPUS(data_parallel("gpu", "", count, 1)); }
Test(SUITE, a_rank_killed_in_the_allreduce_fails_the_job_naming_it, .timeout = 300) {
    ON_GPUS(data_parallel_killed("gpu", "", count));
}
Test(SUITE, dualpipev_pairs_overlap_on_two_streams_and_match_one_rank_bit_for_bit, .timeout = 600) {
    ON_GPUS(dualpipev_job("", 2, "gpu"); dualpipev_job("", 4, "gpu"));
}
#endif
