/* bench/dp.c: the data-parallel gradient all-reduce, measured side by side in
 * one run (docs/comm.md "Collectives", docs/cli.md "Data parallel").
 *
 *  1. The collective (comm_coll: reduce-scatter in the gradient tree's order,
 *     then all-gather) among D processes of this machine over shm and tcp,
 *     one part per member, vectors of 256 KiB to 64 MiB: its bandwidth
 *     (vector bytes / time, and the "bus" bandwidth 2(D-1)/D of that, NCCL's
 *     convention: what each member moves in and out) beside memcpy of the
 *     same bytes in one process and beside the transport's own point-to-point
 *     bandwidth (a stream of the same bytes from one process to another).
 *  2. A 2x2 job with --dp-overlap on and off, alternating: the median step
 *     time (the job's step span from the trace, steps 1 on) as a ratio, and
 *     the median wait between a rank's last W and its OPT (the all-reduce
 *     it still waits for), on 1f1b and zb-v. The default model is heavy in
 *     weights and light in tokens (25 MB of gradient a replica, 16 tokens a
 *     microbatch), so that the all-reduce is a visible part of the step.
 *
 *   bench_dp [--rounds N] [--steps N] [--model SPEC] [--skip-jobs] [--skip-collectives]
 *
 * Prints tables; never part of the test pass/fail. The machine is shared:
 * each collective figure is the best of REPEAT, each job figure a median. */
#include <math.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/shx.h"
#include "runner/comm/comm.h"
#include "runner/comm/comm_coll.h"
#include "runner/model/model_tree.h"

enum { NSIZES = 5, REPEAT = 3, MAXD = 4 };
static const size_t sizes[NSIZES] = {256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
static const size_t total = 256u << 20; /* bytes moved per size and round */

/* ---- one group -------------------------------------------------------------- */

/* Best GB/s per size: all-reduce (vector bytes / time) in one piece and in
 * 1 MiB buckets one after the other (as the engine runs it, --dp-bucket's
 * default), and point-to-point. */
#define BUCKET (1u << 20)
typedef struct result {
    double allreduce[NSIZES], bucketed[NSIZES], p2p[NSIZES];
} result;

static size_t iters(size_t size) { return total / size < 2 ? 2 : total / size; }

/* Every member: rounds of all-reduces of each size (rank 0 keeps the
 * times); then ranks 0 and 1 stream the same bytes point to point. */
static int member(comm *c, int rank, int D, result *res, pp_err *err) {
    size_t most = sizes[NSIZES - 1] / sizeof(float);
    float *v = malloc(sizeof(float) * most), *out = malloc(sizeof(float) * most);
    if (!v || !out) return pp_fail(err, "out of memory");
    for (size_t i = 0; i < most; i++) v[i] = (float)((i + (size_t)rank) % 1000) * 1e-3f;
    int ranks[MAXD], steps[64], owner[64], part[64];
    for (int d = 0; d < D; d++) ranks[d] = d;
    int ns = model_tree_combine_program(D, 1, steps, owner, part, 64);
    coll_group g = {.c = c, .n = D, .ranks = ranks, .me = rank, .timeout_ms = 60000};
    coll_order order = {ns, steps, owner, part};
    float *parts[1] = {v};
    int rc = 0;
    for (int s = 0; rc == 0 && s < NSIZES; s++)
        for (int bucketed = 0; rc == 0 && bucketed < 2; bucketed++) {
            size_t n = sizes[s] / sizeof(float), k = iters(sizes[s]);
            size_t piece = bucketed && sizes[s] > BUCKET ? BUCKET / sizeof(float) : n;
            for (int round = 0; rc == 0 && round <= REPEAT; round++) { /* round 0 warms up */
                size_t reps = round ? k : 1;
                uint64_t t0 = pp_now_ns();
                for (size_t i = 0; rc == 0 && i < reps; i++)
                    for (size_t lo = 0, b = 0; rc == 0 && lo < n; lo += piece, b++) {
                        uint64_t tag = comm_tag((uint64_t)(round * 2 + bucketed), (uint64_t)s,
                                                (uint64_t)((i * 64 + b) % 1024) << 10, COMM_DIR_COLL);
                        float *pp[1] = {parts[0] + lo};
                        size_t len = n - lo < piece ? n - lo : piece;
                        rc = coll_reduce_scatter_send(&g, pp, 1, len, tag, err);
                        if (rc == 0) rc = coll_reduce_scatter_reduce(&g, &order, pp, len, out + lo, tag, err);
                        if (rc == 0) rc = coll_all_gather(&g, out + lo, len, tag | 1u << 7 << 4, err);
                    }
                double gbps = (double)(reps * sizes[s]) / (double)(pp_now_ns() - t0);
                double *best = bucketed ? &res->bucketed[s] : &res->allreduce[s];
                if (rank == 0 && round && gbps > *best) *best = gbps;
            }
        }
    /* point to point: 0 -> 1, a stream of the same sizes, one ack at the end */
    uint64_t ack = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    for (int s = 0; rc == 0 && rank < 2 && s < NSIZES; s++) {
        size_t k = iters(sizes[s]);
        for (int round = 0; rc == 0 && round <= REPEAT; round++) {
            size_t reps = round ? k : 1;
            uint64_t t0 = pp_now_ns();
            for (size_t i = 0; rc == 0 && i < reps; i++) {
                uint64_t tag = comm_tag((uint64_t)round + 100, (uint64_t)s, i, COMM_DIR_ACT);
                rc = rank == 0 ? comm_send(c, 1, tag, v, sizes[s], err) : comm_recv(c, 0, tag, v, sizes[s], 60000, err);
            }
            if (rc == 0) rc = rank == 0 ? comm_recv(c, 1, ack, NULL, 0, 60000, err) : comm_send(c, 0, ack, NULL, 0, err);
            double gbps = (double)(reps * sizes[s]) / (double)(pp_now_ns() - t0);
            if (rank == 0 && round && gbps > res->p2p[s]) res->p2p[s] = gbps;
        }
    }
    free(v), free(out);
    return rc == 0 ? comm_flush(c, 60000, err) : -1;
}

static int bench_group(const char *transport, int D, result *res) {
    shx *x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    result *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(shared, 0, sizeof *shared);
    char key[64];
    snprintf(key, sizeof key, "bench-dp-%d-%s-%d", (int)getpid(), transport, D);
    fflush(NULL);
    pid_t kids[MAXD] = {0};
    int rank = 0;
    for (int r = 1; r < D; r++)
        if ((kids[r] = fork()) == 0) {
            rank = r;
            break;
        }
    comm_config cfg = {.rank = rank, .world = D, .job_key = key, .exchange = {.ctx = x, .put = shx_put, .get = shx_get},
                       .connect_timeout_ms = 10000, .transport = transport};
    comm *c;
    pp_err err;
    int rc = comm_open(&cfg, &c, &err);
    if (rc == 0) {
        rc = member(c, rank, D, shared, &err);
        comm_close(c);
    }
    if (rc < 0) fprintf(stderr, "bench_dp: %s, %d members, rank %d: %s\n", transport, D, rank, err.msg);
    if (rank != 0) _exit(rc ? 1 : 0);
    int ok = rc == 0;
    for (int r = 1; r < D; r++) {
        int st;
        waitpid(kids[r], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    comm_cleanup(key);
    *res = *shared;
    munmap(x, sizeof *x), munmap(shared, sizeof *shared);
    return ok ? 0 : -1;
}

static double memcpy_gbps(size_t size) {
    unsigned char *a = malloc(size), *b = malloc(size);
    memset(a, 1, size), memset(b, 2, size);
    size_t n = iters(size);
    double g = 0;
    for (int round = 0; round < REPEAT; round++) {
        uint64_t t0 = pp_now_ns();
        for (size_t i = 0; i < n; i++) {
            a[i % size] = (unsigned char)i; /* keep the copies from being merged */
            memcpy(b, a, size);
            __asm__ volatile("" ::"r"(b) : "memory");
        }
        double r = (double)(n * size) / (double)(pp_now_ns() - t0);
        if (r > g) g = r;
    }
    free(a), free(b);
    return g;
}

static void size_text(size_t s, char *buf, size_t n) {
    if (s >= (1u << 20)) snprintf(buf, n, "%zu MiB", s >> 20);
    else snprintf(buf, n, "%zu KiB", s >> 10);
}

static int collectives(void) {
    double mem[NSIZES];
    for (int s = 0; s < NSIZES; s++) mem[s] = memcpy_gbps(sizes[s]);
    static const char *transports[] = {"shm", "tcp"};
    for (int t = 0; t < 2; t++)
        for (int D = 2; D <= MAXD; D += 2) {
            result r;
            if (bench_group(transports[t], D, &r) != 0) return -1;
            double bus = 2.0 * (D - 1) / D;
            printf("\nall-reduce among %d processes over %s (GB/s = 1e9 bytes/s; best of %d, %zu MiB per size)\n", D,
                   transports[t], REPEAT, total >> 20);
            printf("%8s %8s %8s %10s %8s %10s %12s %10s\n", "size", "memcpy", "p2p", "allreduce", "bus",
                   "1MiB-bkts", "ar/memcpy", "bus/p2p");
            for (int s = 0; s < NSIZES; s++) {
                char sz[32];
                size_text(sizes[s], sz, sizeof sz);
                printf("%8s %8.2f %8.2f %10.2f %8.2f %10.2f %12.3f %10.3f\n", sz, mem[s], r.p2p[s], r.allreduce[s],
                       r.allreduce[s] * bus, r.bucketed[s], r.allreduce[s] / mem[s], r.allreduce[s] * bus / r.p2p[s]);
            }
        }
    return 0;
}

/* ---- 2x2 jobs: overlapped vs not --------------------------------------------- */

static char dir[256];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median over steps >= 1 of the job's step span (first op to last OPT
 * over all ranks: the trace's step_stats), in ms; and of the wait between a
 * rank's last W and its OPT (the all-reduce it waited for), in ms. */
static int job_times(const char *db_path, double *step_ms, double *wait_ms) {
    sqlite3 *db;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return -1;
    const char *q[2] = {"SELECT max(end_ns) - min(start_ns) FROM step_stats WHERE step >= 1 GROUP BY step",
                        "SELECT o.start_ns - (SELECT max(end_ns) FROM events w WHERE w.rank=o.rank AND w.step=o.step"
                        " AND w.phase='W') FROM events o WHERE o.phase='OPT' AND o.step >= 1"};
    double *out[2] = {step_ms, wait_ms};
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        sqlite3_stmt *st;
        double v[4096];
        int n = 0;
        if (sqlite3_prepare_v2(db, q[k], -1, &st, NULL) != SQLITE_OK) {
            rc = -1;
            break;
        }
        while (sqlite3_step(st) == SQLITE_ROW && n < 4096) v[n++] = (double)sqlite3_column_int64(st, 0) / 1e6;
        sqlite3_finalize(st);
        if (n == 0) rc = -1;
        else {
            qsort(v, (size_t)n, sizeof *v, cmp_double);
            *out[k] = v[n / 2];
        }
    }
    sqlite3_close(db);
    return rc;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int jobs(int rounds, int steps, const char *model) {
    static const char *schedules[] = {"1f1b", "zb-v"};
    printf("\n2x2 job, --model %s, 8 microbatches a replica, %d steps, %d alternating rounds:\n"
           "median step (ms), median wait between a rank's last W and its OPT (ms)\n", model, steps, rounds);
    printf("%10s %12s %12s %10s %12s %12s\n", "schedule", "overlap on", "overlap off", "on/off", "wait on", "wait off");
    for (int k = 0; k < 2; k++) {
        double on[64], off[64], won[64], woff[64];
        for (int r = 0; r < rounds; r++)
            for (int o = 0; o < 2; o++) {
                char db[512];
                snprintf(db, sizeof db, "%s/job.db", dir);
                sh("rm -f %s %s-wal %s-shm", db, db, db);
                if (sh("%s run --pp 2 --dp 2 --microbatches 8 --steps %d --schedule %s --dp-overlap %s --progress off "
                       "--model %s --db %s >/dev/null 2>&1", PPRUN_BIN, steps, schedules[k], o ? "off" : "on", model,
                       db) != 0 ||
                    job_times(db, o ? &off[r] : &on[r], o ? &woff[r] : &won[r]) != 0) {
                    fprintf(stderr, "bench_dp: the %s job failed\n", schedules[k]);
                    return -1;
                }
            }
        double a = median(on, rounds), b = median(off, rounds);
        printf("%10s %12.2f %12.2f %10.3f %12.2f %12.2f\n", schedules[k], a, b, a / b, median(won, rounds),
               median(woff, rounds));
    }
    return 0;
}

int main(int argc, char **argv) {
    int rounds = 3, steps = 8, skip_jobs = 0, skip_coll = 0;
    const char *model = "gpt:layers=8,dim=256,heads=4,seq=16,batch=1";
    for (int i = 1; i < argc; i++) {
        long v;
        pp_err err;
        if ((!strcmp(argv[i], "--rounds") || !strcmp(argv[i], "--steps")) && i + 1 < argc) {
            if (pp_parse_long(argv[i + 1], 1, 64, argv[i], &v, &err) < 0) {
                fprintf(stderr, "bench_dp: %s\n", err.msg);
                return 2;
            }
            *(strcmp(argv[i], "--rounds") ? &steps : &rounds) = (int)v;
            i++;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--skip-jobs")) {
            skip_jobs = 1;
        } else if (!strcmp(argv[i], "--skip-collectives")) {
            skip_coll = 1;
        } else {
            fprintf(stderr, "usage: bench_dp [--rounds N] [--steps N] [--model SPEC] [--skip-jobs] "
                            "[--skip-collectives]\n");
            return 2;
        }
    }
    double load[3] = {0};
    if (getloadavg(load, 3) > 0) printf("load average %.2f %.2f %.2f, %d cores\n", load[0], load[1], load[2],
                                        pp_cpu_count());
    if (!skip_coll && collectives() != 0) return 1;
    if (skip_jobs) return 0;
    snprintf(dir, sizeof dir, "/tmp/bench_dp_%d", (int)getpid());
    if (sh("mkdir -p %s", dir) != 0) return 1;
    int rc = jobs(rounds, steps, model);
    sh("rm -rf %s", dir);
    if (getloadavg(load, 3) > 0) printf("load average after: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
    return rc == 0 ? 0 : 1;
}
