/* bench/loadgen.c: how many trace records a second the collector takes
 * from 64 to 4,096 ranks, played by bench/loadgen.h through the real
 * collector into the real database (one file per trial, in /tmp).
 *
 *   bench_loadgen [SECONDS]                the tables (trials of SECONDS, default 3)
 *   bench_loadgen steps                    only the last table (a step written and analysed)
 *   bench_loadgen RANKS RATE SECONDS [NODES] [DB]   one trial, its figures
 *
 * Per world size, first the rings of every rank drained by the master's
 * collector (one node), then the same ranks as nodes of 16 whose
 * collectors forward over TCP to the master's. A trial offers RATE records
 * a second; it holds when no record was dropped and the collector was at
 * most a quarter second (and a batch) behind when the producers stopped.
 * The rate doubles from 25,000 until a trial does not hold, then three
 * halvings of the interval find the highest that holds. Columns:
 *  - held: the highest rate that held;
 *  - took: the most records a second the collector took in any trial (at
 *    a rate it could not hold, that is all it can take);
 *  - drops from: the lowest rate whose rings overflowed within the trial
 *    (rings of 4,096 records; pprun run's have 65,536, which at a rate
 *    above `took` overflow later, never not);
 *  - insert / analyse: the collector thread's time in db_insert_events and
 *    in the step analyses, as shares of the trial at the held rate.
 * Then a whole step of each world size written without the collector
 * (db_insert_events, batches of 65,536 in ring order, after a first step)
 * and analysed (db_analyze_step), timed: what a step costs to write
 * against what it costs to analyse. */
#define LOADGEN_IMPLEMENTATION
#include "bench/loadgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/analyze.h"

static const char *trial_db(char *buf, size_t n, const char *dir, int k) {
    snprintf(buf, n, "%s/trial%d.db", dir, k);
    return buf;
}

static void remove_db(const char *path) {
    char p[512];
    remove(path);
    snprintf(p, sizeof p, "%s-wal", path);
    remove(p);
    snprintf(p, sizeof p, "%s-shm", path);
    remove(p);
}

static int trial(const char *dir, int ranks, int nodes, double rate, double seconds, loadgen_result *r) {
    static int k;
    char path[256];
    trial_db(path, sizeof path, dir, k++);
    loadgen_config cfg = {.ranks = ranks, .nodes = nodes, .rate = rate, .seconds = seconds, .db_path = path};
    pp_err err;
    int rc = loadgen_run(&cfg, r, &err);
    remove_db(path);
    if (rc != 0) {
        fprintf(stderr, "bench_loadgen: %s\n", err.msg);
        exit(1);
    }
    return loadgen_held(&cfg, r);
}

static void table_row(const char *dir, int ranks, int nodes, double seconds) {
    double lo = 0, hi = 0, took = 0, drops = 0, rate = 25000;
    double ins = 0, ana = 0;
    int tries = 0;
    for (;;) {
        loadgen_result r;
        int held = trial(dir, ranks, nodes, rate, seconds, &r);
        double t = (double)r.ingested_at_end / seconds;
        if (t > took) took = t;
        if (r.dropped && (drops == 0 || rate < drops)) drops = rate;
        if (held && rate > lo) {
            lo = rate;
            ins = (double)r.insert_ns / 1e9 / seconds;
            ana = (double)r.analyze_ns / 1e9 / seconds;
        }
        loadgen_result_free(&r);
        if (!held && (hi == 0 || rate < hi)) hi = rate;
        if (hi == 0) {
            rate *= 2;
            if (rate > 8e6) break;
            continue;
        }
        if (++tries > 3) break;
        rate = lo > 0 ? (lo + hi) / 2 : hi / 2;
    }
    char dtext[32];
    if (drops > 0)
        snprintf(dtext, sizeof dtext, "%.0f", drops);
    else
        snprintf(dtext, sizeof dtext, "none to %.0f", hi > 0 ? hi : lo);
    printf("| %d | %s | %.0f | %.0f | %s | %.2f | %.2f |\n", ranks, nodes ? "TCP, 16 a node" : "rings", lo, took,
           dtext, ins, ana);
    fflush(stdout);
}

/* One whole step of `ranks` written and analysed without the collector. */
static void step_row(const char *dir, int ranks) {
    char path[256];
    snprintf(path, sizeof path, "%s/step.db", dir);
    remove_db(path);
    loadgen_config cfg = {.ranks = ranks, .rate = 1e6, .seconds = 1, .db_path = path};
    trace_event *ev = NULL;
    size_t n = 0;
    pp_err err;
    db *d;
    int64_t job;
    db_job_info j = {.name = "step", .nnodes = 1, .world_size = ranks, .schedule = "interleaved-1f1b",
                     .microbatches = 32, .virtual_stages = 2, .stages = 32, .steps = 2, .model = "loadgen",
                     .device = "cpu"};
    if (db_open(path, &d, &err) != 0 || db_create_job(d, &j, &job, &err) != 0) {
        fprintf(stderr, "bench_loadgen: %s\n", err.msg);
        exit(1);
    }
    /* Step 1 is timed, after step 0: its rows then go after the earlier
     * ones of the file, as in a job that runs. */
    uint64_t t0 = 0;
    for (int step = 0; step < 2; step++) {
        if (loadgen_step_records(&cfg, step, 1000000000, &ev, &n, &err) != 0) {
            fprintf(stderr, "bench_loadgen: %s\n", err.msg);
            exit(1);
        }
        t0 = pp_now_ns();
        for (size_t i = 0; i < n; i += 65536)
            if (db_insert_events(d, job, ev + i, n - i < 65536 ? n - i : 65536, &err) != 0) {
                fprintf(stderr, "bench_loadgen: %s\n", err.msg);
                exit(1);
            }
        if (step == 0) free(ev);
    }
    double ins = (double)(pp_now_ns() - t0) / 1e9;
    t0 = pp_now_ns();
    if (db_analyze_step(d, job, 1, &err) != 0) {
        fprintf(stderr, "bench_loadgen: %s\n", err.msg);
        exit(1);
    }
    double ana = (double)(pp_now_ns() - t0) / 1e9;
    printf("| %d | %zu | %.3f | %.0f | %.3f | %.2f |\n", ranks, n, ins, (double)n / ins, ana, ana / ins);
    fflush(stdout);
    db_close(d);
    free(ev);
    remove_db(path);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/pprun-loadgen-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    if (argc >= 4) {
        loadgen_config cfg = {.ranks = atoi(argv[1]), .rate = atof(argv[2]), .seconds = atof(argv[3]),
                              .nodes = argc > 4 ? atoi(argv[4]) : 0};
        char path[256];
        cfg.db_path = argc > 5 ? argv[5] : trial_db(path, sizeof path, dir, 0);
        loadgen_result r;
        pp_err err;
        if (loadgen_run(&cfg, &r, &err) != 0) {
            fprintf(stderr, "bench_loadgen: %s\n", err.msg);
            return 1;
        }
        printf("ranks %d, nodes %d, offered %.0f/s for %.1f s: written %llu, dropped %llu, in the database at the "
               "end %llu (%.0f/s), after the stop %llu; %d steps of %.3f s; stop %.2f s; collector thread: insert "
               "%.2f s, analyse %.2f s; %s\n",
               cfg.ranks, cfg.nodes, cfg.rate, cfg.seconds, (unsigned long long)r.written,
               (unsigned long long)r.dropped, (unsigned long long)r.ingested_at_end,
               (double)r.ingested_at_end / cfg.seconds, (unsigned long long)r.ingested, r.steps,
               cfg.seconds / r.steps, r.stop_s, (double)r.insert_ns / 1e9, (double)r.analyze_ns / 1e9,
               loadgen_held(&cfg, &r) ? "held" : "not held");
        loadgen_result_free(&r);
        if (argc <= 5) remove_db(path);
        rmdir(dir);
        return 0;
    }
    int steps_only = argc > 1 && strcmp(argv[1], "steps") == 0;
    double seconds = argc > 1 && !steps_only ? atof(argv[1]) : 3;
    static const int sizes[] = {64, 256, 1024, 4096};
    printf("# bench_loadgen: trace records a second into the database (%ld cores, trials of %.1f s)\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), seconds);
    printf("| ranks | to the master | held /s | took /s | drops from /s | insert | analyse |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int mode = 0; !steps_only && mode < 2; mode++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) table_row(dir, sizes[i], mode ? sizes[i] / 16 : 0, seconds);
    printf("\n## one step of every rank, without the collector\n\n");
    printf("| ranks | records | insert s | records/s | analyse s | analyse / insert |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) step_row(dir, sizes[i]);
    rmdir(dir);
    return 0;
}
