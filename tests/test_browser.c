/* test_browser.c: the dashboard in headless Chromium (Debian's package,
 * driven by playwright-core from tests/browser/): for a finished job the
 * canvas draws every F, B and W block of the step per rank, hovering shows
 * the tooltip, the loss chart has a point per step, the SQL tab shows rows;
 * for a running job, steps appended by another writer appear without a
 * reload; a job with gpu spans gets a GPU lane per rank, a CPU job none; the
 * Jobs tab holds both side by side, and ticking both compares them (the
 * Compare panel, GET /compare); a job of 30,000 steps opens with thinned
 * charts; a loss chart whose first loss is 1000 scales to the rest, marks
 * that point on its edge and has a log scale (none for losses <= 0); the
 * what-if panel's stage balance says what `pprun stats` says;
 * the critical path is outlined over the step shown, and its totals table
 * says what `pprun stats` says; real PyTorch jobs (torch_job.h) show their
 * blocks (BW, PyTorch's full backward, and B and W where it splits them)
 * on the ranks that ran them and the program's own spans on a lane under
 * their rank; DualPipeV's pairs, an F and a BW of a rank at once, on two
 * lanes of its row; a job's --max-mem is a dashed line at its value on the
 * activations chart, whether the peaks reach it or not; a job of 1,024 ranks (bench/loadgen.h's stream, one rank
 * made slow) opens grouped by node, its groups fold and unfold, the
 * heatmap's hottest cell is the slow rank and a click on it shows that
 * rank's row; the time of a pan and a zoom with 1,024 rows and 100,000
 * events in view is printed (reported, not asserted).
 * Screenshots are kept in the build directory. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOADGEN_IMPLEMENTATION
#include "bench/loadgen.h"
#include "db/analyze.h"
#include "helpers/torch_job.h"
#include "helpers/trace_fixture.h"
#include "helpers/web_client.h"
#include "helpers/web_fixture.h"

static void build_dir(char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[k > 0 ? k : 0] = 0;
    snprintf(out, n, "%s", dirname(exe));
}

static void require_playwright(void) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/browser/node_modules/playwright-core/package.json", PPRUN_TEST_DIR);
    cr_assert_eq(access(p, R_OK), 0,
                 "playwright-core is not installed: run scripts/install-deps.sh (npm ci --prefix tests/browser)");
    cr_assert_eq(access("/usr/bin/chromium", X_OK), 0, "chromium is not installed: run scripts/install-deps.sh");
}

/* Runs the node script; returns its JSON output (parsed). On failure the
 * server (serve_pid) is stopped first, so that no test leaves one behind. */
static cJSON *run_node(const char *mode, int port, const char *shot, const char *ready, pid_t serve_pid) {
    char cmd[2048], outp[256];
    snprintf(outp, sizeof outp, "/tmp/pprun-browser-%d-%s.json", (int)getpid(), mode);
    snprintf(cmd, sizeof cmd, "cd '%s/browser' && node dashboard.mjs %s http://127.0.0.1:%d/ '%s' '%s' >'%s' 2>&1",
             PPRUN_TEST_DIR, mode, port, shot, ready ? ready : "", outp);
    int st = system(cmd);
    char *out = fixture_read_file(outp);
    unlink(outp);
    cJSON *j = NULL;
    /* the JSON is the last line */
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (*p == '{') {
            cJSON_Delete(j);
            j = cJSON_Parse(p);
        }
    if (!j || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        kill(serve_pid, SIGTERM);
        waitpid(serve_pid, NULL, 0);
    }
    cr_assert(out, "no output from the browser script");
    cr_assert(j && WIFEXITED(st) && WEXITSTATUS(st) == 0, "browser script failed (exit %d): %s", WEXITSTATUS(st), out);
    free(out);
    return j;
}

/* The number under key; fails the test when there is none. */
static double jnum(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    cr_assert(cJSON_IsNumber(v), "the browser script reported no number '%s'", key);
    return v->valuedouble;
}

/* The string in cell k of a row of the script's table. */
static const char *cell(const cJSON *row, int k) {
    const cJSON *v = cJSON_GetArrayItem(row, k);
    cr_assert(cJSON_IsString(v), "no cell %d", k);
    return v->valuestring;
}

/* Serves db (`pprun serve`), runs the browser script's mode against it with
 * the screenshot browser-<mode>.png in the build directory, stops the
 * server and removes db; returns the script's JSON. */
static cJSON *browse(const char *db, const char *mode, const char *ready) {
    char dir[PATH_MAX], shot[PATH_MAX + 64];
    int port;
    int pid = webclient_start_serve(db, NULL, &port);
    cr_assert_gt(pid, 0);
    build_dir(dir, sizeof dir);
    snprintf(shot, sizeof shot, "%s/browser-%s.png", dir, mode);
    cJSON *j = run_node(mode, port, shot, ready, pid);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    fixture_remove(db);
    cr_assert_eq(access(shot, R_OK), 0, "screenshot kept at %s", shot);
    return j;
}

/* `pprun stats --db db --format FORMAT` (malloc'd, the caller frees). */
static char *stats_as(const char *db, const char *format) {
    char cmd[1024], path[256];
    snprintf(path, sizeof path, "/tmp/pprun-browser-stats-%d.txt", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' stats --db '%s' --format %s >'%s' 2>&1", PPRUN_BIN, db, format, path);
    int st = system(cmd);
    char *text = fixture_read_file(path);
    unlink(path);
    cr_assert(text && WIFEXITED(st) && WEXITSTATUS(st) == 0, "pprun stats failed: %s", text ? text : "");
    return text;
}

/* `pprun stats --db db` as a terminal shows it (malloc'd, the caller frees). */
static char *stats_text(const char *db) { return stats_as(db, "text"); }

/* Into out: the text of s after the first `from`, up to `to`; fails the
 * test when either is missing. */
static const char *between(const char *s, const char *from, const char *to, char *out, size_t n) {
    const char *a = strstr(s, from), *b = a ? strstr(a + strlen(from), to) : NULL;
    cr_assert(a && b, "no '%s' ... '%s' in: %s", from, to, s);
    a += strlen(from);
    snprintf(out, n, "%.*s", (int)(b - a), a);
    return out;
}

/* The dashboard's stage balance block (the script's `balance`) says what
 * `pprun stats` says for the same job: a row per stage, the same stages
 * marked slowest, the same multiple of the mean, the same verdict on cuts;
 * with same_window (the page read a finished job), the same simulated
 * unevenness too. */
static void check_balance(const cJSON *bal, const char *stats, int stages, int same_window) {
    char *shown = cJSON_PrintUnformatted(bal), want[256];
    cr_assert(bal && cJSON_IsFalse(cJSON_GetObjectItem(bal, "hidden")), "the stage balance block is shown: %s", shown);
    static const char *const head[] = {"stage", "rank", "layers", "F", "B", "W", "F+B+W", "vs mean", ""};
    for (int k = 0; k < 9; k++)
        cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(bal, "head"), k)->valuestring, head[k]);
    const cJSON *rows = cJSON_GetObjectItem(bal, "rows");
    cr_assert_eq(cJSON_GetArraySize(rows), stages, "a row per stage: %s", shown);
    const char *line = strstr(stats, "F+B+W vs mean\n");
    cr_assert(line, "pprun stats printed no stage balance: %s", stats);
    int slowest = 0;
    for (int k = 0; k < stages; k++) {
        line = strchr(line, '\n') + 1;
        const cJSON *row = cJSON_GetArrayItem(rows, k);
        int stage = -1, rank = -1;
        double times = -1;
        int len = (int)strcspn(line, "\n");
        cr_assert_eq(sscanf(line, "%d %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %lfx", &stage, &rank, &times), 3, "%.*s",
                     len, line);
        cr_assert_eq(cJSON_GetArraySize(row), 10, "class and 9 cells");
        cr_assert_eq(atoi(cJSON_GetArrayItem(row, 1)->valuestring), stage);
        cr_assert_eq(atoi(cJSON_GetArrayItem(row, 2)->valuestring), rank);
        const char *mark = cJSON_GetArrayItem(row, 0)->valuestring;
        cr_assert_str_eq(cJSON_GetArrayItem(row, 9)->valuestring, mark, "stage %d: the row's class is its mark", k);
        slowest += strcmp(mark, "slowest") == 0;
        /* a live page read earlier steps than stats did: only a finished job's marks must agree */
        if (same_window) {
            int marked = strstr(line, "slowest") && strstr(line, "slowest") < line + len;
            cr_assert_str_eq(mark, marked ? "slowest" : "", "stage %d: %.*s", k, len, line);
            snprintf(want, sizeof want, "%.2f×", times);
            cr_assert_str_eq(cJSON_GetArrayItem(row, 8)->valuestring, want, "stage %d: %.*s", k, len, line);
        }
    }
    cr_assert_geq(slowest, 1, "the slowest stage is marked");
    /* "1f1b simulated: X a step at these stage costs, Y with every stage at
     * their mean (the unevenness costs Z%)" */
    const char *sim = cJSON_GetObjectItem(bal, "sim")->valuestring;
    char verdict[128];
    cr_assert(strstr(sim, "simulated: ") && strstr(sim, "a step at these stage costs, ") &&
                  strstr(sim, "with every stage at their mean ("),
              "%s", sim);
    if (same_window) {
        snprintf(want, sizeof want, "(%s)",
                 between(stats, "with every stage at their mean (", ")\n", verdict, sizeof verdict));
        cr_assert(strstr(sim, want), "the dashboard: %s\npprun stats: %s", sim, want);
    }
    const char *cuts = cJSON_GetObjectItem(bal, "cuts")->valuestring;
    if (strstr(stats, "cuts       --pipeline-cuts ")) {
        char list[64], ratio[16];
        between(stats, "cuts       --pipeline-cuts ", ":", list, sizeof list);
        snprintf(want, sizeof want, "suggested --pipeline-cuts %s: slowest stage ", list);
        cr_assert(!strncmp(cuts, want, strlen(want)), "the dashboard: %s\npprun stats: %s", cuts, list);
        if (same_window) {
            snprintf(want, sizeof want, "a step (%s×)",
                     between(strstr(stats, "cuts       --pipeline-cuts "), "a step (", "x)\n", ratio, sizeof ratio));
            cr_assert(strstr(cuts, want), "the dashboard: %s\npprun stats: (%sx)", cuts, ratio);
        }
    } else {
        snprintf(want, sizeof want, "no cuts suggested: %s",
                 between(stats, "cuts       none suggested: ", "\n", verdict, sizeof verdict));
        cr_assert_str_eq(cuts, want, "as pprun stats says");
    }
    free(shown);
}

static int ints_all(const cJSON *arr, int want) {
    const cJSON *v;
    int n = 0;
    cJSON_ArrayForEach(v, arr) {
        if (v->valueint != want) return 0;
        n++;
    }
    return n;
}

Test(browser, finished_job_timeline_tooltip_loss_and_sql, .timeout = 180) {
    require_playwright();
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "browser", 3, "succeeded");
    cr_assert_eq(fixture_add_activations(db, 64 << 10, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_add_state(db, 512 << 10, &err), 0, "%s", err.msg);
    /* a name as long as a real run's, for the header at 700 px */
    cr_assert_eq(fixture_exec(db, "UPDATE jobs SET name = 'gpt-layers-8-zb-h1-microbatches-8-seed-1234'", &err), 0,
                 "%s", err.msg);
    /* evaluations after steps 0 and 2 (--eval-every 2) */
    cr_assert_eq(fixture_exec(db,
                              "INSERT INTO eval_losses(job_id, step, microbatch, loss, rank, at_ns) VALUES"
                              " (1, 0, 0, 2.5, 3, 1), (1, 2, 0, 2.25, 3, 2)",
                              &err),
                 0, "%s", err.msg);
    char *stats = stats_text(db);
    cJSON *j = browse(db, "finished", NULL);

    /* A finished job opens at its last step, not at step 0's warm-up. */
    cJSON *opened = cJSON_GetObjectItem(j, "openedAt");
    cr_assert_str_eq(cJSON_GetArrayItem(opened, 0)->valuestring, "step 2 / 2");
    cr_assert_str_eq(cJSON_GetArrayItem(opened, 1)->valuestring, "step 2");

    cJSON *drawn = cJSON_GetObjectItem(j, "drawn");
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "F"), 8), 4, "8 F blocks on each of the 4 ranks");
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "B"), 8), 4);
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "W"), 8), 4);
    cr_assert_eq(cJSON_GetObjectItem(drawn, "comm")->valueint, 96, "every send and receive as a mark");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(drawn, "gpuLane")), "a CPU job has no GPU lane");
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "gpu"), 0), 4);
    cr_assert_eq(cJSON_GetObjectItem(drawn, "gaps")->valueint, 15, "every idle gap of the step shaded (4 + 5 + 4 + 2)");
    cr_assert_eq(cJSON_GetObjectItem(j, "planDrawn")->valueint, 96, "the planned timeline beside it");
    cr_assert_eq(cJSON_GetObjectItem(j, "lossPoints")->valueint, 3, "a loss point per step");
    cr_assert_eq(cJSON_GetObjectItem(j, "evalLossPoints")->valueint, 2, "an evaluation loss per evaluation");
    cr_assert(strstr(cJSON_GetObjectItem(j, "lossNote")->valuestring, "blue: evaluation loss"), "%s",
              cJSON_GetObjectItem(j, "lossNote")->valuestring);
    /* From a window zoomed in on step 1, ▶ ◀ "all steps" ▶: ◀ ▶ step from the
     * step at the view's centre (they jumped to step 0 from any view that was
     * not a step); the bars show the step shown, then the latest. */
    static const char *const stepping[4][2] = {
        {"step 2 / 2", "step 2"}, {"step 1 / 2", "step 1"}, {"custom window", "step 2"}, {"step 2 / 2", "step 2"}};
    cJSON *st = cJSON_GetObjectItem(j, "stepping");
    cr_assert_eq(cJSON_GetArraySize(st), 4);
    for (int i = 0; i < 4; i++) {
        cJSON *pair = cJSON_GetArrayItem(st, i);
        cr_assert_str_eq(cJSON_GetArrayItem(pair, 0)->valuestring, stepping[i][0]);
        cr_assert_str_eq(cJSON_GetArrayItem(pair, 1)->valuestring, stepping[i][1], "the bars of %s", stepping[i][0]);
    }
    const char *tip = cJSON_GetObjectItem(j, "tooltip")->valuestring;
    cr_assert(strstr(tip, "rank 1 · F · microbatch 3") && strstr(tip, "step 0") && strstr(tip, "duration 1.000 ms"),
              "%s", tip);
    /* 1F1B on rank 1: F0 F1 F2 B0 W0 F3, so three microbatches of 64 KiB. */
    cr_assert(strstr(tip, "activations held after it: 192 KiB"), "%s", tip);
    tip = cJSON_GetObjectItem(j, "optTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 2 · OPT · step 0") && strstr(tip, "weights, gradients, optimizer state: 1.5 MiB"), "%s",
              tip);
    const char *gap = cJSON_GetObjectItem(j, "gapTooltip")->valuestring;
    cr_assert(strstr(gap, "rank 3 idle 3.000 ms") && strstr(gap, "warmup"), "%s", gap);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "traceFile")->valuestring, "pprun-job-1-steps-0-0.trace.json");
    cJSON *trace_steps = cJSON_GetObjectItem(j, "traceSteps");
    cr_assert(cJSON_GetArraySize(trace_steps) == 1 && cJSON_GetArrayItem(trace_steps, 0)->valueint == 0,
              "the Chrome trace of step 0 holds step 0's ops only");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "tooltipAfterWheel")->valuestring, "hidden");
    cr_assert_gt(cJSON_GetObjectItem(j, "zoomedSpanRatio")->valuedouble, 2.0, "wheel zoom widened the window");
    cJSON *cells = cJSON_GetObjectItem(j, "sqlCells");
    cr_assert_eq(cJSON_GetArraySize(cells), 8);
    cr_assert_str_eq(cJSON_GetArrayItem(cells, 1)->valuestring, "24", "3 steps x 8 W on rank 0");
    cr_assert(strstr(cJSON_GetObjectItem(j, "sqlError")->valuestring, "DELETE"));
    cr_assert_eq(jnum(j, "sqlRowsAfterError"), 0, "a refused query leaves no earlier rows under its error");
    /* A reload of 50 ms or more, asked for again at once, waits 4 times as
     * long (the live heatmap of a large job: a fifth of the time at most,
     * there a tenth); Date.now() is whole milliseconds. */
    const cJSON *th = cJSON_GetObjectItem(j, "throttle");
    cr_assert(jnum(th, "took") >= 50 && jnum(th, "gap") >= 4 * jnum(th, "took") - 2, "took %g ms, then %g ms",
              jnum(th, "took"), jnum(th, "gap"));
    /* A tooltip near the right edge is kept inside the window. */
    const cJSON *et = cJSON_GetObjectItem(j, "edgeTip");
    cr_assert(jnum(et, "left") >= 0 && jnum(et, "right") <= jnum(et, "width") &&
                  jnum(et, "bottom") <= jnum(et, "height"),
              "the tooltip of the block at x %.0f spans %.0f..%.0f of %.0f px", jnum(et, "x"), jnum(et, "left"),
              jnum(et, "right"), jnum(et, "width"));
    /* The legend has every idle cause, each its own colour but warm-up and
     * cool-down's (comm, often the biggest, and other had none). */
    static const char *const causes[] = {"warmup", "wait_activation", "wait_gradient", "wait_dp", "wait_cpu", "comm",
                                         "other"};
    const cJSON *legend = cJSON_GetObjectItem(j, "legendCauses");
    cr_assert_eq(cJSON_GetArraySize(legend), 7, "a legend entry per cause colour");
    for (int k = 0; k < 7; k++) {
        cr_assert_str_eq(cell(cJSON_GetArrayItem(legend, k), 0), causes[k]);
        for (int m = 0; m < k; m++)
            cr_assert_str_neq(cell(cJSON_GetArrayItem(legend, k), 2), cell(cJSON_GetArrayItem(legend, m), 2),
                              "%s and %s share a colour", causes[k], causes[m]);
    }
    /* Zoomed in, the label counts the events in view (it counted every one kept from earlier windows). */
    const cJSON *zi = cJSON_GetObjectItem(j, "zoomedIn");
    char count[32];
    snprintf(count, sizeof count, " · %d events", (int)jnum(zi, "inView"));
    cr_assert(strstr(cJSON_GetObjectItem(zi, "label")->valuestring, count) && jnum(zi, "inView") < jnum(zi, "kept"),
              "%s: %d in view of %d kept", cJSON_GetObjectItem(zi, "label")->valuestring, (int)jnum(zi, "inView"),
              (int)jnum(zi, "kept"));
    /* 700 px wide: the header wraps; the tabs and the Chrome trace link stay on the page. */
    const cJSON *nw = cJSON_GetObjectItem(j, "narrow");
    cr_assert(jnum(nw, "pageWidth") <= 700 && jnum(nw, "traceRight") <= 700 && jnum(nw, "sqlTabRight") <= 700,
              "at 700 px: page %.0f px wide, the trace link ends at %.0f", jnum(nw, "pageWidth"),
              jnum(nw, "traceRight"));
    cr_assert(strstr(cJSON_GetObjectItem(j, "sqlExample")->valuestring, "WHERE job_id = 1 "),
              "the example query is job 1's");
    /* 60 notches out: the view stops at the whole job and a margin, and the
     * window asked for is that (it grew without bound to a refused 7e24 ns) */
    const cJSON *zo = cJSON_GetObjectItem(j, "zoomedOut"), *zw = cJSON_GetObjectItem(zo, "window");
    double job_end = jnum(zo, "jobEnd");
    cr_assert(jnum(zo, "from") >= 0 && jnum(zo, "to") <= job_end * 1.1 + 1 && jnum(zo, "to") >= job_end,
              "zoomed out to %.0f..%.0f ns, the job ends at %.0f", jnum(zo, "from"), jnum(zo, "to"), job_end);
    cr_assert(jnum(zw, "to") <= job_end * 1.1 + 1, "the window asked for ends at %.0f ns", jnum(zw, "to"));
    cr_assert_gt(cJSON_GetObjectItem(j, "syntheticDrawn")->valueint, 1000, "100,000 synthetic events drawn");
    /* What if: the fixture's costs (every op 1 ms, a send 0: each op starts
     * as its input's producer ends, whatever its SEND spans say), each
     * schedule's peak in flight times 64 KiB; this job's row marked. */
    const char *info = cJSON_GetObjectItem(j, "whatifInfo")->valuestring;
    cr_assert(strstr(info, "F 1.000 ms · B 1.000 ms · W 1.000 ms · hand-off 0.000 ms · between ops 0.000 ms") &&
                  strstr(info, "host spans (hand-off and between ops: means) over steps 1–2"),
              "%s", info);
    static const char *const whatif[7][4] = {{"", "gpipe", "512 KiB", "8"},
                                             {"own", "1f1b (this job)", "256 KiB", "4"},
                                             {"", "interleaved-1f1b", "704 KiB", "11"},
                                             {"", "zb-h1", "256 KiB", "4"},
                                             {"", "dualpipev", "576 KiB", "9"},
                                             {"", "zb-v", "512 KiB", "8"},
                                             {"", "zb-v (ordered for these costs)", "512 KiB", "8"}};
    cJSON *rows = cJSON_GetObjectItem(j, "whatifRows");
    cr_assert_eq(cJSON_GetArraySize(rows), 7);
    /* every op 1 ms: the tuned order is zb-v's own, no faster, so no flag to run it with */
    cr_assert_str_eq(cJSON_GetObjectItem(j, "whatifTuned")->valuestring,
                     "zb-v ordered for these costs: no faster than zb-v's own order, nothing to gain from "
                     "--schedule-costs");
    for (int k = 0; k < 7; k++) {
        cJSON *row = cJSON_GetArrayItem(rows, k);
        cr_assert_eq(cJSON_GetArraySize(row), 8, "class and 7 cells");
        cr_assert_str_eq(cJSON_GetArrayItem(row, 0)->valuestring, whatif[k][0]);
        cr_assert_str_eq(cJSON_GetArrayItem(row, 1)->valuestring, whatif[k][1]);
        cr_assert_str_eq(cJSON_GetArrayItem(row, 6)->valuestring, whatif[k][2], "%s", whatif[k][1]);
        cr_assert_str_eq(cJSON_GetArrayItem(row, 7)->valuestring, whatif[k][3], "%s", whatif[k][1]);
    }
    cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(rows, 1), 5)->valuestring, "1.00×");
    /* Stage balance: the fixture's four stages cost the same (3 ms a
     * microbatch), so each is as slow as the slowest, the simulated step is
     * the even one, and a timed model's costs do not follow its layers. */
    cJSON *bal = cJSON_GetObjectItem(j, "balance");
    check_balance(bal, stats, 4, 1);
    free(stats);
    cJSON *brow;
    cJSON_ArrayForEach(brow, cJSON_GetObjectItem(bal, "rows")) {
        cr_assert_str_eq(cJSON_GetArrayItem(brow, 3)->valuestring, "–", "the timed model says no layers per stage");
        cr_assert_str_eq(cJSON_GetArrayItem(brow, 7)->valuestring, "3.000 ms");
        cr_assert_str_eq(cJSON_GetArrayItem(brow, 8)->valuestring, "1.00×");
        cr_assert_str_eq(cJSON_GetArrayItem(brow, 9)->valuestring, "slowest", "four stages as slow as the slowest");
    }
    cr_assert_str_eq(
        cJSON_GetObjectItem(bal, "sim")->valuestring,
        "1f1b simulated: 30.00 ms a step at these stage costs, 30.00 ms with every stage at their mean (even)");
    cr_assert_str_eq(cJSON_GetObjectItem(bal, "layer")->valuestring, "");
    cr_assert_str_eq(cJSON_GetObjectItem(bal, "cuts")->valuestring,
                     "no cuts suggested: the model's op costs do not depend on a stage's layers");
    /* No script errors; the only failed loads allowed are the refused SQL
     * (403) and the Chrome trace probe (404) until that route exists. */
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "errors"))
        cr_assert(strstr(e->valuestring, "Failed to load resource") &&
                      (strstr(e->valuestring, "403") || strstr(e->valuestring, "404")),
                  "page error: %s", e->valuestring);
    cJSON_Delete(j);
}

/* A job with CUPTI gpu spans (fixture job 2): a GPU lane under each rank
 * with every gpu span of the step and, zoomed to one step, its kernels;
 * hovering gives GPU time beside host time, and a kernel's name. Switching
 * to the CPU job takes the lanes away. */
Test(browser, gpu_job_has_a_gpu_lane_per_rank_and_a_cpu_job_none, .timeout = 180) {
    require_playwright();
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "browser-gpu", 2, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(db, &err), 0, "%s", err.msg);
    cJSON *j = browse(db, "gpu", NULL);
    char shot[PATH_MAX + 64];
    build_dir(shot, PATH_MAX);
    strcat(shot, "/browser-gpu-compare.png");
    cr_assert_eq(access(shot, R_OK), 0, "the Compare panel's screenshot kept at %s", shot);

    cJSON *drawn = cJSON_GetObjectItem(j, "drawn");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(drawn, "gpuLane")));
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "F"), 8), 4, "the host blocks as before");
    /* per rank: 24 F/B/W spans and one per send/receive (16 on the end ranks, 32 between) */
    cJSON *gpu = cJSON_GetObjectItem(drawn, "gpu");
    cr_assert_eq(cJSON_GetArraySize(gpu), 4);
    int want[4] = {40, 56, 56, 40}, total = 0;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(cJSON_GetArrayItem(gpu, r)->valueint, want[r], "rank %d: %d gpu spans drawn", r,
                     cJSON_GetArrayItem(gpu, r)->valueint);
        total += want[r];
    }
    cr_assert_eq(total, FIXTURE_GPU_SPANS_PER_STEP);
    cr_assert_eq(cJSON_GetObjectItem(drawn, "kernels")->valueint, FIXTURE_KERNELS_PER_STEP,
                 "zoomed to a step: every kernel drawn");
    cJSON *lk = cJSON_GetObjectItem(j, "lastKernels");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(lk, "truncated")));
    const char *tip = cJSON_GetObjectItem(j, "spanTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 1 · GPU · F · microbatch 3") && strstr(tip, "step 0") && strstr(tip, "GPU 0.900 ms") &&
                  strstr(tip, "host 1.000 ms") && strstr(tip, "GPU starts 0.050 ms after the host op"),
              "%s", tip);
    tip = cJSON_GetObjectItem(j, "kernelTooltip")->valuestring;
    cr_assert(strstr(tip, "kernel gemm_fwd_kernel") && strstr(tip, "duration 0.400 ms") && strstr(tip, "stream 7") &&
                  strstr(tip, "in F · microbatch 3"),
              "%s", tip);
    tip = cJSON_GetObjectItem(j, "hostTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 1 · F · microbatch 3") && strstr(tip, "duration 1.000 ms"), "%s", tip);

    drawn = cJSON_GetObjectItem(j, "cpuDrawn");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(drawn, "gpuLane")), "the CPU job has no GPU lane");
    cr_assert_eq(ints_all(cJSON_GetObjectItem(drawn, "gpu"), 0), 4);
    cr_assert_eq(cJSON_GetObjectItem(drawn, "kernels")->valueint, 0);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "cpuLane")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "cpuKernels")), "and asks for no kernels");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no page errors");
    cr_assert(strstr(cJSON_GetObjectItem(j, "sqlExample")->valuestring, "WHERE job_id = 2 "),
              "opened at job 2, the SQL tab's example query is about job 2 (it said job 1 whatever job was open): %s",
              cJSON_GetObjectItem(j, "sqlExample")->valuestring);
    cJSON *head = cJSON_GetObjectItem(j, "jobsHead"), *rows = cJSON_GetObjectItem(j, "jobsRows");
    cr_assert_eq(cJSON_GetArraySize(rows), 2, "a row per job");
    static const char *const names[] = {"job", "steps", "step time", "bubble", "planned", "idle mostly", "loss", NULL};
    int col[7], ncol = cJSON_GetArraySize(head);
    for (int k = 0; names[k]; k++) {
        col[k] = -1;
        for (int c = 0; c < ncol; c++)
            if (!strcmp(cJSON_GetArrayItem(head, c)->valuestring, names[k])) col[k] = c;
        cr_assert_geq(col[k], 0, "a column %s", names[k]);
    }
    cJSON *r1 = cJSON_GetArrayItem(rows, 1);
#define CELL(row, k) cJSON_GetArrayItem(row, col[k])->valuestring
    cr_assert_str_eq(CELL(cJSON_GetArrayItem(rows, 0), 0), "2", "newest first");
    cr_assert_str_eq(CELL(r1, 0), "1");
    cr_assert_str_eq(CELL(r1, 1), "1", "one step after step 0");
    cr_assert_str_eq(CELL(r1, 2), "30.50 ms");
    cr_assert_str_eq(CELL(r1, 3), "19.7%", "6 / 30.5 ms idle");
    cr_assert_str_eq(CELL(r1, 4), "20.0%", "the plan: 6 / 30 ms");
    cr_assert_str_eq(CELL(r1, 5), "wait_gradient 50%", "12 of the 24 idle ms");
    double loss = 0;
    for (int m = 0; m < FIXTURE_MB; m++)
        loss += fixture_loss(1, m) / FIXTURE_MB;
    cr_assert_float_eq(atof(CELL(r1, 6)), loss, 5e-5);
#undef CELL
    cr_assert_eq(jnum(j, "openedFromJobs"), 2, "a click on a row opens the job");
    /* Both ticked: job 2 against job 1, as `pprun stats --vs 1` has it */
    cJSON *cmp = cJSON_GetObjectItem(j, "compare"), *dom = cJSON_GetObjectItem(j, "compareDom");
    cr_assert_eq(jnum(cmp, "job"), 2);
    cr_assert_eq(jnum(cmp, "other"), 1);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(dom, "stillOnJobs")), "ticking a job does not open it");
    static const char *const differs[] = {
        "model: timed:f=1ms,b=1ms,w=1ms,act=64KiB in job 1, mlp:layers=8,hidden=1024 in job 2",
        "device: cpu in job 1, cuda in job 2"};
    for (int k = 0; k < 2; k++) {
        cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(cmp, "differs"), k)->valuestring, differs[k]);
        cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(dom, "differs"), k)->valuestring, differs[k]);
    }
    static const char *const table[][4] = {{"step time (median)", "30.50 ms", "30.50 ms", "1.00×"},
                                           {"bubble measured", "19.7%", "19.7%", "+0.0 pp"},
                                           {"  wait_gradient", "12.00 ms", "12.00 ms", "1.00×"},
                                           {"critical path per step", "30.50 ms", "30.50 ms", "1.00×"},
                                           {"  rank 3's ops", "23.00 ms", "23.00 ms", "1.00×"},
                                           {"  hand-offs", "0.000 ms", "0.000 ms", "–"}};
    cJSON *rows_shown = cJSON_GetObjectItem(dom, "rows"), *row;
    cr_assert(cJSON_Compare(rows_shown, cJSON_GetObjectItem(cmp, "rows"), 1),
              "the table shows what __pprun.compare says");
    for (int k = 0; k < 6; k++) {
        int found = 0;
        cJSON_ArrayForEach(row, rows_shown) if (!strcmp(cJSON_GetArrayItem(row, 0)->valuestring, table[k][0])) {
            found = 1;
            for (int c = 1; c < 4; c++)
                cr_assert_str_eq(cJSON_GetArrayItem(row, c)->valuestring, table[k][c], "%s", table[k][0]);
        }
        cr_assert(found, "a row %s", table[k][0]);
    }
    const char *text = cJSON_GetObjectItem(dom, "prediction")->valuestring;
    cr_assert_str_eq(text, "what if: no prediction: job 1's what-if plays its own shape only; job 2 has another model");
    char verdict[96];
    snprintf(verdict, sizeof verdict, "loss at step 1: %.6f in both: bitwise equal", loss);
    cr_assert_str_eq(cJSON_GetObjectItem(dom, "loss")->valuestring, verdict);
    cr_assert_str_eq(cJSON_GetObjectItem(cmp, "loss")->valuestring, verdict);
    cJSON_Delete(j);
}

/* A layered job (gpt, 8 layers, 2 a stage) whose first stage takes twice
 * as long as the others: the stage balance block marks it, says what the
 * unevenness costs and which --pipeline-cuts even it out, as `pprun stats`
 * does for the same database. */
Test(browser, stage_balance_suggests_the_cuts_pprun_stats_does, .timeout = 180) {
    require_playwright();
    char db[256];
    fixture_fresh(db, sizeof db, "browser-balance", 3, "succeeded");
    pp_err err;
    /* and a config whose dp cannot be (a billion pipelines of 4 ranks): one
     * pipeline, as pprun stats takes it */
    cr_assert_eq(fixture_exec(db,
                              "UPDATE jobs SET model = 'gpt:layers=8', config_json = json_set(coalesce(config_json, "
                              "'{}'), '$.dp', 1000000000) WHERE id = 1;"
                              "UPDATE events SET end_ns = end_ns + (end_ns - start_ns)"
                              " WHERE job_id = 1 AND rank = 0 AND phase IN ('F', 'B', 'W')",
                              &err),
                 0, "%s", err.msg);
    char *stats = stats_text(db);
    cr_assert(strstr(stats, "cuts       --pipeline-cuts "), "pprun stats suggests cuts: %s", stats);
    cJSON *j = browse(db, "balance", NULL);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no page errors");
    cJSON *bal = cJSON_GetObjectItem(j, "balance");
    check_balance(bal, stats, 4, 1);
    free(stats);
    static const char *const rows[4][10] = {
        {"slowest", "0", "0", "0–1", "2.000 ms", "2.000 ms", "2.000 ms", "6.000 ms", "1.60×", "slowest"},
        {"", "1", "1", "2–3", "1.000 ms", "1.000 ms", "1.000 ms", "3.000 ms", "0.80×", ""},
        {"", "2", "2", "4–5", "1.000 ms", "1.000 ms", "1.000 ms", "3.000 ms", "0.80×", ""},
        {"", "3", "3", "6–7", "1.000 ms", "1.000 ms", "1.000 ms", "3.000 ms", "0.80×", ""}};
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 10; c++)
            cr_assert_str_eq(
                cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(bal, "rows"), k), c)->valuestring, rows[k][c],
                "stage %d, column %d", k, c);
    const char *sim = cJSON_GetObjectItem(bal, "sim")->valuestring;
    cr_assert(strstr(sim, "(the unevenness costs ") && strstr(sim, "1f1b simulated: "), "%s", sim);
    cr_assert(strstr(cJSON_GetObjectItem(bal, "layer")->valuestring, "one layer: F 0.500 ms, B 0.500 ms, W 0.500 ms; "),
              "%s", cJSON_GetObjectItem(bal, "layer")->valuestring);
    cr_assert(strstr(cJSON_GetObjectItem(bal, "cuts")->valuestring, "instead of 6.000 ms; 1f1b simulated "), "%s",
              cJSON_GetObjectItem(bal, "cuts")->valuestring);
    const cJSON *dp = cJSON_GetObjectItem(j, "dp");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(dp, "hidden")), "one pipeline: no DP table");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(dp, "filterHidden")), "one pipeline: no replica filter");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(dp, "filterOptions")), 0);
    cJSON_Delete(j);
}

/* ns as the dashboard writes it (util.js fmtMs) into out. */
static const char *fmt_ms(double ns, char *out, size_t n) {
    snprintf(out, n, "%.*f ms", ns < 1e7 ? 3 : ns < 1e9 ? 2 : 0, ns / 1e6);
    return out;
}

/* A fresh fixture (one pipeline of 4 ranks) whose config says --dp 2, a
 * layout its plan does not follow; `more` is SQL run after. */
static void fixture_unlaid(char *db, size_t n, const char *tag, int steps, const char *status, const char *more) {
    fixture_fresh(db, n, tag, steps, status);
    char sql[512];
    snprintf(sql, sizeof sql, "UPDATE jobs SET config_json = json_set(config_json, '$.dp', 2) WHERE id = 1;%s", more);
    pp_err err;
    cr_assert_eq(fixture_exec(db, sql, &err), 0, "%s", err.msg);
}

/* The page shows one pipeline (no replica filter) and its header says why. */
static void assert_one_pipeline_said(const cJSON *j, int filter_hidden, const char *meta) {
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no page errors: %s", text);
    cr_assert(filter_hidden, "no replica filter: %s", text);
    cr_assert(strstr(meta, ", --dp 2 is not the program's layout: one pipeline"), "%s", text);
    free(text);
}

/* A --dp the program's plan does not follow: one pipeline, no replica
 * filter, and the header says why, as pprun stats does. */
Test(browser, a_dp_the_plan_does_not_follow_is_one_pipeline_said_so, .timeout = 180) {
    require_playwright();
    char db[256];
    fixture_unlaid(db, sizeof db, "browser-unlaid", 3, "succeeded", "");
    cJSON *j = browse(db, "balance", NULL);
    assert_one_pipeline_said(j, cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "dp"), "filterHidden")),
                             cJSON_GetObjectItem(j, "meta")->valuestring);
    cJSON_Delete(j);
    fixture_remove(db);
}

/* A real job of two pipelines (--pp 2 --dp 2): the what-if panel's data
 * parallel table holds the rows `pprun stats --format json` has, this job's
 * first, and says what each stage's all-reduce cost. */
Test(browser, data_parallel_table_is_what_pprun_stats_says, .timeout = 240) {
    require_playwright();
    char db[256], cmd[1024];
    fixture_tmp_path(db, sizeof db, "browser-dp");
    snprintf(cmd, sizeof cmd, "'%s' run --db '%s' --pp 2 --dp 2 --steps 4 --progress off >/dev/null 2>&1", PPRUN_BIN,
             db);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the job failed (exit %d)", WEXITSTATUS(st));
    char *stats = stats_as(db, "json");
    cJSON *sj = cJSON_Parse(stats);
    cr_assert_not_null(sj, "%s", stats);
    const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(sj, "whatif"), "data_parallel");
    cr_assert(cJSON_IsObject(want), "%s", stats);
    cJSON *j = browse(db, "balance", NULL);
    char *text = cJSON_PrintUnformatted(j);
    const cJSON *dp = cJSON_GetObjectItem(j, "dp"), *rows = cJSON_GetObjectItem(dp, "rows"),
                *wrows = cJSON_GetObjectItem(want, "rows");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(dp, "hidden")), "%s", text);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(dp, "filterHidden")), "%s", text);
    const cJSON *opts = cJSON_GetObjectItem(dp, "filterOptions");
    cr_assert(cJSON_GetArraySize(opts) == 3 && !strcmp(cJSON_GetArrayItem(opts, 0)->valuestring, "all") &&
                  !strcmp(cJSON_GetArrayItem(opts, 2)->valuestring, "1"),
              "all, 0, 1: %s", text);
    cr_assert_eq(cJSON_GetArraySize(rows), cJSON_GetArraySize(wrows), "%s", text);
    for (int k = 0; k < cJSON_GetArraySize(wrows); k++) {
        const cJSON *w = cJSON_GetArrayItem(wrows, k), *row = cJSON_GetArrayItem(rows, k);
        char d[16], m[16], step[32], thr[48];
        snprintf(d, sizeof d, "%d", (int)jnum(w, "dp"));
        snprintf(m, sizeof m, "%d", (int)jnum(w, "microbatches"));
        fmt_ms(jnum(w, "step_time_ns"), step, sizeof step);
        snprintf(thr, sizeof thr, "%.2f×%s", jnum(w, "throughput"), k == 0 ? " (this job)" : "");
        cr_assert_str_eq(cell(row, 0), k == 0 ? "own" : "", "row %d: %s", k, text);
        cr_assert_str_eq(cell(row, 1), d, "row %d: %s", k, text);
        cr_assert_str_eq(cell(row, 2), m, "row %d: %s", k, text);
        cr_assert_str_eq(cell(row, 3), step, "row %d: %s", k, text);
        cr_assert_str_eq(cell(row, 4), thr, "row %d: %s", k, text);
    }
    char stage0[64], ms[32];
    snprintf(stage0, sizeof stage0, "last W (%s, ",
             fmt_ms(cJSON_GetArrayItem(cJSON_GetObjectItem(want, "allreduce_ns_by_stage"), 0)->valuedouble, ms,
                    sizeof ms));
    cr_assert(strstr(cJSON_GetObjectItem(dp, "info")->valuestring, stage0), "%s in %s", stage0, text);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "%s", text);
    free(text);
    free(stats);
    cJSON_Delete(sj);
    cJSON_Delete(j);
}

/* ns from "8.00 ms", "500.00 us", "0 ns" (pprun stats) or "8.000 ms" (the
 * dashboard). */
static double to_ns(double v, const char *unit) {
    return v * (!strcmp(unit, "s") ? 1e9 : !strcmp(unit, "ms") ? 1e6 : !strcmp(unit, "us") ? 1e3 : 1);
}

/* The fixture's critical path (tests/helpers/web_fixture.h): step 1's 31
 * ops (0F0 1F0 2F0 3F0 down, 22 more of rank 3, microbatch 7's B up ranks
 * 2, 1, 0, then rank 0's W and OPT) outlined over the timeline with the 6
 * hand-offs between ranks drawn, as GET /critpath?step=1 has them; hover
 * says which ops are on it and what a hand-off waited; unticking the box
 * takes it away; the totals table says what `pprun stats` says. */
Test(browser, critical_path_outlined_and_its_totals_as_pprun_stats_prints, .timeout = 180) {
    require_playwright();
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "browser-critpath", 3, "succeeded");
    /* more events than one window holds (20,000), so that "all steps" aggregates */
    cr_assert_eq(fixture_append_steps(db, 3, 110, &err), 0, "%s", err.msg);
    char *stats = stats_text(db);
    cJSON *j = browse(db, "critpath", NULL);
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no page errors: %s", text);

    const cJSON *api = cJSON_GetObjectItem(j, "api"), *cp = cJSON_GetObjectItem(j, "critpath");
    cr_assert_eq(jnum(api, "ops"), 31, "the API's path of step 1: %s", text);
    cr_assert_eq(jnum(api, "data"), 6, "3 hand-offs down (F), 3 up (B): %s", text);
    cr_assert_eq(jnum(cp, "step"), 1);
    cr_assert_eq(jnum(cp, "ops"), 31);
    cr_assert_eq(jnum(cp, "outlined"), 31, "every op of the path outlined: %s", text);
    cr_assert_eq(jnum(cp, "edges"), 6, "every hand-off drawn: %s", text);

    const cJSON *tips = cJSON_GetObjectItem(j, "tooltips");
    const char *tip = cJSON_GetObjectItem(tips, "data")->valuestring;
    cr_assert(strstr(tip, "\non the critical path: waited 0.000 ms for rank 2's F"), "%s", tip);
    tip = cJSON_GetObjectItem(tips, "rank")->valuestring;
    cr_assert(strstr(tip, "\non the critical path: after the rank's previous op"), "%s", tip);
    tip = cJSON_GetObjectItem(tips, "off")->valuestring;
    cr_assert(strstr(tip, "rank 1 · W · microbatch 0") && !strstr(tip, "critical path"), "off the path: %s", tip);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "edgeTooltip")->valuestring,
                     "critical path · step 1: rank 0's B of microbatch 7\nwaited 0.000 ms for rank 1's B");

    const cJSON *off = cJSON_GetObjectItem(j, "off");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(off, "on")));
    cr_assert_eq(jnum(off, "outlined") + jnum(off, "edges"), 0, "unticked, nothing drawn: %s", text);
    tip = cJSON_GetObjectItem(j, "offTooltip")->valuestring;
    cr_assert(!strstr(tip, "critical path"), "unticked, the tooltip says nothing of it: %s", tip);
    const cJSON *again = cJSON_GetObjectItem(j, "again");
    cr_assert_eq(jnum(again, "outlined"), 31, "ticked again: %s", text);
    cr_assert_eq(jnum(j, "refetched"), 0, "drawn again from the step's kept answer");
    const cJSON *agg = cJSON_GetObjectItem(j, "aggregated"), *aggcp = cJSON_GetObjectItem(agg, "critpath");
    cr_assert_str_neq(cJSON_GetObjectItem(agg, "mode")->valuestring, "events");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(aggcp, "step")) && jnum(aggcp, "outlined") == 0, "aggregated: %s", text);

    /* The table: a row per rank as `pprun stats` prints it (the mean per
     * step; rank 3 holds most of the path), then the waits (none here). */
    const cJSON *tbl = cJSON_GetObjectItem(j, "table");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(tbl, "hidden")));
    cr_assert_str_eq(cJSON_GetObjectItem(tbl, "info")->valuestring, "— steps 93–112, 30.50 ms a step (mean)",
                     "the latest 20 complete steps");
    cr_assert(strstr(stats, "critical path  the ops each step waited on, steps 93-112 (30.50 ms a step, mean)"), "%s",
              stats);
    static const char *const head[] = {"rank", "F", "B", "W", "OPT", "all", "share"};
    for (int k = 0; k < 7; k++)
        cr_assert_str_eq(cell(cJSON_GetObjectItem(tbl, "head"), k), head[k]);
    const cJSON *rows = cJSON_GetObjectItem(tbl, "rows");
    cr_assert_eq(cJSON_GetArraySize(rows), 4 + 3, "4 ranks and 3 waits: %s", text);
    char *exposed = cJSON_PrintUnformatted(cJSON_GetObjectItem(tbl, "exposed")), *dom = cJSON_PrintUnformatted(rows);
    cr_assert_str_eq(exposed, dom, "window.__pprun.critTable holds the rows shown");
    free(exposed);
    free(dom);
    const char *line = strstr(stats, "  rank          F          B          W        OPT        all  share\n");
    cr_assert(line, "%s", stats);
    for (int r = 0; r < 4; r++) {
        line = strchr(line, '\n');
        cr_assert(line, "pprun stats printed a row per rank: %s", stats);
        line++;
        const cJSON *row = cJSON_GetArrayItem(rows, r);
        int rank = -1;
        double v[5];
        char u[5][8], share[16];
        cr_assert_eq(sscanf(line, "%d %lf %7s %lf %7s %lf %7s %lf %7s %lf %7s %15s", &rank, &v[0], u[0], &v[1], u[1],
                            &v[2], u[2], &v[3], u[3], &v[4], u[4], share),
                     12, "%s", line);
        cr_assert_eq(atoi(cell(row, 1)), rank);
        for (int k = 0; k < 5; k++) {
            double got, want = to_ns(v[k], u[k]);
            char unit[8];
            cr_assert_eq(sscanf(cell(row, 2 + k), "%lf %7s", &got, unit), 2, "%s", cell(row, 2 + k));
            cr_assert_float_eq(to_ns(got, unit), want, 0.005e6, "rank %d, %s: %s on the page, %.2f %s from pprun stats",
                               rank, head[1 + k], cell(row, 2 + k), v[k], u[k]);
        }
        cr_assert_str_eq(cell(row, 7), share, "rank %d's share", rank);
        cr_assert_str_eq(cell(row, 0), rank == 3 ? "most" : "", "rank %d", rank);
    }
    const cJSON *r3 = cJSON_GetArrayItem(rows, 3);
    static const char *const rank3[] = {"3", "8.000 ms", "8.000 ms", "7.000 ms", "0.000 ms", "23.00 ms", "75.4%"};
    for (int k = 0; k < 7; k++)
        cr_assert_str_eq(cell(r3, 1 + k), rank3[k], "rank 3, column %d", k);
    static const char *const waits[] = {"hand-offs: an output crossing to another rank",
                                        "on a rank between its ops, sending or receiving",
                                        "on a rank between its ops, the rest"};
    for (int k = 0; k < 3; k++) {
        const cJSON *row = cJSON_GetArrayItem(rows, 4 + k);
        cr_assert_str_eq(cell(row, 0), "wait");
        cr_assert_str_eq(cell(row, 1), waits[k]);
        cr_assert_str_eq(cell(row, 2), "0.000 ms");
        cr_assert_str_eq(cell(row, 3), "0.0%");
    }
    free(text);
    free(stats);
    cJSON_Delete(j);
}

typedef struct writer_arg {
    const char *db, *ready;
    int ok;
} writer_arg;

#define LIVE_BURST 24 /* steps 3-26 at once; dashboard.mjs waits for them */

/* Waits up to 30 s for dashboard.mjs to create `path` (its page is ready). */
static void wait_for_file(const char *path) {
    for (int i = 0; i < 600 && access(path, F_OK) != 0; i++)
        usleep(50000);
}

/* browse() with `write` changing the database beside it, once the page is
 * ready (dashboard.mjs creates the file writer_arg.ready names); *ok: the
 * writer's changes were made. */
static cJSON *browse_beside(const char *db, const char *mode, void *(*write)(void *), int *ok) {
    char ready[300];
    snprintf(ready, sizeof ready, "/tmp/pprun-browser-%s-%d", mode, (int)getpid());
    unlink(ready);
    writer_arg a = {db, ready, 0};
    pthread_t t;
    pthread_create(&t, NULL, write, &a);
    cJSON *j = browse(db, mode, ready);
    pthread_join(t, NULL);
    unlink(ready);
    *ok = a.ok;
    return j;
}

static void *writer(void *p) {
    writer_arg *a = p;
    wait_for_file(a->ready);
    pp_err err;
    /* the plan gets its simulated times as the job's steps are measured */
    a->ok = fixture_set_plan_simulated(a->db, 1, &err) == 0 && fixture_append_steps(a->db, 2, 1, &err) == 0;
    usleep(400000);
    /* a burst, as a fast job completes steps: the page must not ask for its
     * window (or redraw its charts) once per step */
    a->ok = a->ok && fixture_append_steps(a->db, 3, LIVE_BURST, &err) == 0;
    /* The page has counted the steps through 2 + LIVE_BURST when it writes ready.2. */
    char ready2[320];
    snprintf(ready2, sizeof ready2, "%s.2", a->ready);
    wait_for_file(ready2);
    unlink(ready2);
    a->ok = a->ok && fixture_append_running_step(a->db, 3 + LIVE_BURST, &err) == 0;
    /* Then the job ends. */
    char ready3[320];
    snprintf(ready3, sizeof ready3, "%s.3", a->ready);
    wait_for_file(ready3);
    unlink(ready3);
    a->ok = a->ok && fixture_set_status(a->db, "succeeded", &err) == 0;
    return NULL;
}

Test(browser, running_job_shows_new_steps_without_reload, .timeout = 180) {
    require_playwright();
    char db[256];
    fixture_fresh(db, sizeof db, "browser-live", 2, "running");
    pp_err err;
    cr_assert_eq(fixture_set_plan_simulated(db, 0, &err), 0, "%s", err.msg);
    int ok;
    cJSON *j = browse_beside(db, "live", writer, &ok);
    cr_assert(ok, "the writer appended its steps");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "follow")), "a running job opens in follow-live mode");
    cr_assert_eq(cJSON_GetObjectItem(j, "stepsBefore")->valueint, 2);
    cr_assert_eq(cJSON_GetObjectItem(j, "stepsAfter")->valueint, 3 + LIVE_BURST);
    cr_assert_eq(cJSON_GetObjectItem(j, "liveEvents")->valueint, (1 + LIVE_BURST) * FIXTURE_EVENTS_PER_STEP,
                 "every new event streamed");
    cr_assert_eq(cJSON_GetObjectItem(j, "lossPoints")->valueint, 3 + LIVE_BURST);
    cJSON *steps = cJSON_GetObjectItem(j, "drawnSteps");
    int has_newest = 0;
    cJSON *v;
    cJSON_ArrayForEach(v, steps) has_newest |= v->valueint == 2 + LIVE_BURST;
    cr_assert(has_newest, "the newest step is on the canvas");
    /* at most one window request per 250 ms of it, plus the first and the last */
    double fetches = jnum(j, "burstFetches"), ms = jnum(j, "burstMs");
    cr_assert(fetches >= 1 && fetches <= 2 + ms / 250, "%.0f window requests for %d steps in %.0f ms", fetches,
              1 + LIVE_BURST, ms);
    /* the critical path of the step in view: asked for as seldom */
    double crit = jnum(j, "burstCritFetches");
    cr_assert(crit <= 2 + ms / 250, "%.0f critical path requests for %d steps in %.0f ms", crit, 1 + LIVE_BURST, ms);
    cJSON *plan = cJSON_GetObjectItem(j, "plan");
    cr_assert_eq(jnum(plan, "anchor"), 3 + LIVE_BURST, "the plan is aligned to the running step in view");
    cr_assert_eq(jnum(plan, "drawn"), 96, "all of its 96 actions are drawn");
    char *loads = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "planLoads"));
    cr_assert_str_eq(loads, "[false,true]", "the plan opened without simulated times and got them without a reload");
    free(loads);
    /* The job ends: the what-if, the stage balance and the critical path
     * totals are read again, over the last complete step (they kept the
     * steps of their last throttled read), and following stops at its last
     * step with events. */
    const cJSON *ended = cJSON_GetObjectItem(j, "ended");
    char *text = cJSON_PrintUnformatted(ended);
    cr_assert_eq(jnum(ended, "whatifLast"), 2 + LIVE_BURST, "the what-if read again: %s", text);
    cr_assert_eq(jnum(ended, "critLast"), 2 + LIVE_BURST, "the critical path totals read again: %s", text);
    cr_assert(strstr(cJSON_GetObjectItem(ended, "balance")->valuestring, "–26"), "%s", text);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(ended, "follow")), "following stops: %s", text);
    cr_assert(!strncmp(cJSON_GetObjectItem(ended, "stepLabel")->valuestring, "step 27 / ", 10) ||
                  !strncmp(cJSON_GetObjectItem(ended, "stepLabel")->valuestring, "step 26 / ", 10),
              "at the last step with events: %s", text);
    free(text);
    cJSON_Delete(j);
}

/* Once the page is ready: the ranks' plans (one pipeline of 4), then steps
 * 1 and 2, as a program without a plan of its own declares the order it
 * ran in its first step. */
static void *relayout_writer(void *p) {
    writer_arg *a = p;
    wait_for_file(a->ready);
    pp_err err;
    a->ok = fixture_set_plan_simulated(a->db, 1, &err) == 0 && fixture_append_steps(a->db, 1, 2, &err) == 0;
    return NULL;
}

/* A page opened while a --dp 2 job runs and before its ranks declared
 * their plans shows --dp's two pipelines; once plans of one pipeline are
 * in and a step completes, it shows one, saying why, as a page opened then
 * would (it kept --dp's filter until reloaded). */
Test(browser, a_page_opened_before_the_plans_takes_the_layout_they_declare, .timeout = 180) {
    require_playwright();
    char db[256];
    fixture_unlaid(db, sizeof db, "browser-relayout", 1, "running", "DELETE FROM plan WHERE job_id = 1");
    int ok;
    cJSON *j = browse_beside(db, "relayout", relayout_writer, &ok);
    cr_assert(ok, "the writer added the plans and steps");
    const cJSON *before = cJSON_GetObjectItem(j, "before"), *after = cJSON_GetObjectItem(j, "after");
    const char *meta = cJSON_GetObjectItem(before, "meta")->valuestring;
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(before, "hidden")), "--dp 2's filter before the plans: %s", meta);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(before, "options")), 3, "all, 0 and 1");
    cr_assert_null(strstr(meta, "not the program's layout"), "%s", meta);
    assert_one_pipeline_said(j, cJSON_IsTrue(cJSON_GetObjectItem(after, "hidden")),
                             cJSON_GetObjectItem(after, "meta")->valuestring);
    cJSON_Delete(j);
}

/* The first point off the scale and its mark (the script's `clipped` and
 * the canvas pixel beside it): step 0's loss of 1000, above the chart, in
 * the loss line's red (#e15759). */
static void check_clipped_mark(const cJSON *chart, const cJSON *pixel, const char *text) {
    const cJSON *clipped = cJSON_GetObjectItem(chart, "clipped"), *first = cJSON_GetArrayItem(clipped, 0);
    cr_assert_eq(cJSON_GetArraySize(clipped), 1, "one point off the scale: %s", text);
    cr_assert(jnum(first, "x") == 0 && jnum(first, "y") == 1000 && cJSON_IsTrue(cJSON_GetObjectItem(first, "above")),
              "step 0's loss of 1000, above: %s", text);
    cr_assert(cJSON_GetArraySize(pixel) == 4, "%s", text);
    int r = cJSON_GetArrayItem(pixel, 0)->valueint, g = cJSON_GetArrayItem(pixel, 1)->valueint;
    cr_assert(r > 150 && g < 150 && cJSON_GetArrayItem(pixel, 3)->valueint > 100,
              "its mark is drawn on the chart's top edge (rgba %d,%d,...): %s", r, g, text);
}

/* Step 0 of a real run often has a loss far above the rest. A job of 200
 * steps whose first loss is 1000 and the others 0.5 .. 2: the loss chart's
 * y range ignores the outlier (as TensorBoard does by default), so the later
 * losses span most of its height, and the point is marked on the edge with
 * its true value in the note; on a log scale too; with outliers not ignored,
 * nothing is off the scale. Job 2 (a copy with a loss of -0.25) has no log
 * scale and says why; job 1 again: the log scale chosen before. */
Test(browser, loss_chart_ignores_an_outlier_marks_it_and_has_a_log_scale, .timeout = 180) {
    require_playwright();
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "browser-outliers", 2, "succeeded");
    cr_assert_eq(fixture_add_history(db, 2, 198, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_exec(db,
                              "UPDATE losses SET loss = CASE WHEN step = 0 THEN 1000"
                              " ELSE 0.5 + 1.5 * ((step * 37) % 101) / 100.0 END",
                              &err),
                 0, "%s", err.msg);
    cr_assert_eq(fixture_add_gpu_job(db, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_exec(db, "UPDATE losses SET loss = -0.25 WHERE job_id = 2 AND step = 5", &err), 0, "%s",
                 err.msg);
    cJSON *j = browse(db, "outliers", NULL);
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no script errors: %s", text);

    const cJSON *lin = cJSON_GetObjectItem(j, "linear"), *scale = cJSON_GetObjectItem(lin, "scale");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(lin, "outliersBox")) &&
                  cJSON_IsFalse(cJSON_GetObjectItem(lin, "logBox")),
              "outliers ignored, linear, by default: %s", text);
    cr_assert(jnum(lin, "spread") > 0.6, "the losses after step 0 span most of the chart's height: %s", text);
    cr_assert(jnum(scale, "lo") <= 0.5 && jnum(scale, "hi") >= 2 && jnum(scale, "hi") < 3, "%s", text);
    check_clipped_mark(lin, cJSON_GetObjectItem(j, "linearMark"), text);
    const char *note = cJSON_GetObjectItem(lin, "note")->valuestring;
    cr_assert(strstr(note, "off the scale") && strstr(note, "1000") && strstr(note, "step 0"), "the note: %s", note);

    const cJSON *lg = cJSON_GetObjectItem(j, "log");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(lg, "scale"), "log")), "log scale: %s", text);
    cr_assert(jnum(lg, "spread") > 0.6, "on a log scale too: %s", text);
    check_clipped_mark(lg, cJSON_GetObjectItem(j, "logMark"), text);

    const cJSON *all = cJSON_GetObjectItem(j, "logAll");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(all, "clipped")), 0, "outliers not ignored: %s", text);
    cr_assert_eq(jnum(cJSON_GetObjectItem(all, "scale"), "hi"), 1000, "%s", text);
    cr_assert_str_eq(cJSON_GetObjectItem(all, "note")->valuestring, "", "%s", text);

    const cJSON *j2 = cJSON_GetObjectItem(j, "job2");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j2, "logDisabled")) &&
                  cJSON_IsFalse(cJSON_GetObjectItem(j2, "logBox")) &&
                  cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(j2, "scale"), "log")),
              "no log scale with a loss below 0: %s", text);
    note = cJSON_GetObjectItem(j2, "note")->valuestring;
    cr_assert(strstr(note, "no log scale") && strstr(note, "-0.25") && strstr(note, "step 5"), "says why: %s", note);
    cr_assert(strstr(cJSON_GetObjectItem(j2, "logTitle")->valuestring, "above 0"), "%s", text);

    const cJSON *back = cJSON_GetObjectItem(j, "back");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(back, "logBox")) &&
                  cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(back, "scale"), "log")),
              "the log scale is kept while the page is open: %s", text);
    free(text);
    cJSON_Delete(j);
}

/* A long job: 30,000 steps of history open without error, every step is
 * loaded, the charts draw at most two points per pixel column and keep the
 * spike, with the trend over them, the per-rank bars show the step in view:
 * the last with events (steps 2.. are statistics only); a redraw reads only
 * the steps that are new or changed. */
Test(browser, long_job_of_30000_steps_opens_with_thinned_charts, .timeout = 240) {
    require_playwright();
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "browser-long", 2, "succeeded");
    cr_assert_eq(fixture_add_history(db, 2, 29998, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_exec(db, "UPDATE losses SET loss = 50 WHERE step = 12345", &err), 0, "%s", err.msg);
    cJSON *j = browse(db, "long", NULL);
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no script errors: %s", text);
    cr_assert_eq(jnum(j, "steps"), 30000, "every step loaded: %s", text);
    int points = (int)jnum(j, "lossPoints"), width = (int)jnum(j, "lossCanvasWidth");
    cr_assert(points > width / 2 && points <= 2 * width, "%d loss points drawn on a %d px chart", points, width);
    const cJSON *drawn = cJSON_GetObjectItem(j, "drawnLoss"), *all = cJSON_GetObjectItem(j, "allLoss");
    cr_assert_eq(jnum(drawn, "hi"), 50.0, "the spike is drawn: %s", text);
    cr_assert_eq(jnum(drawn, "hiStep"), 12345, "at its step: %s", text);
    cr_assert_eq(jnum(drawn, "lo"), jnum(all, "lo"), "the lowest loss is drawn: %s", text);
    /* over that faded band, the trend: the mean of each pixel column, so the
     * one spike moves its column's point by a fraction of its height, and the
     * trend's points average to the mean loss (columns hold equal counts of
     * steps, to one step in 45) */
    const cJSON *trend = cJSON_GetObjectItem(j, "lossTrend");
    cr_assert(jnum(trend, "n") > width / 2 && jnum(trend, "n") <= width, "a trend point per column: %s", text);
    cr_assert(jnum(trend, "hi") < 25 && jnum(trend, "hi") > jnum(all, "lo"), "the spike is averaged: %s", text);
    cr_assert(fabs(jnum(trend, "mean") / jnum(trend, "all") - 1) < 0.03, "the trend is a mean: %s", text);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "barsLabel")->valuestring, "step 1", "%s", text);
    cr_assert(strstr(cJSON_GetObjectItem(j, "meta")->valuestring, "30000/30000 steps"), "%s", text);
    /* Redrawing does not read all 30,000 steps again: with nothing new the
     * charts are not drawn at all; a new step is read alone (and drawn); a
     * step changed in the middle, from there on. */
    const cJSON *re = cJSON_GetObjectItem(j, "redraws");
    const cJSON *same = cJSON_GetObjectItem(re, "unchanged"), *fresh = cJSON_GetObjectItem(re, "newStep");
    const cJSON *mid = cJSON_GetObjectItem(re, "middle");
    cr_assert(jnum(same, "read") == 0 && jnum(same, "draws") == 0, "nothing new, nothing redrawn: %s", text);
    cr_assert(jnum(fresh, "read") == 1 && jnum(fresh, "draws") == 1, "a new step is read alone: %s", text);
    const cJSON *newest = cJSON_GetObjectItem(re, "newStepDrawn");
    cr_assert(cJSON_GetArrayItem(newest, 0)->valuedouble == 30000 && cJSON_GetArrayItem(newest, 1)->valuedouble == 0.25,
              "and drawn: %s", text);
    cr_assert(jnum(mid, "read") == 30001 - 12345 && jnum(mid, "draws") == 1, "a changed step, from there on: %s", text);
    cr_assert(jnum(cJSON_GetObjectItem(re, "middleLoss"), "hi") == 60, "its new loss drawn: %s", text);
    free(text);
    cJSON_Delete(j);
}

/* The real thing: `pprun run --serve` on a free port, a job slow enough to
 * watch (timed model, ~0.3 s a step, 60 of them: still running once a
 * slow machine has started Chromium; a loaded 2-core machine took 9 steps
 * to show a cold one's first page, and the page needs two more steps after
 * that); the page shows new steps as they finish, without a reload; after
 * the job pprun keeps serving until SIGINT. */
/* A rank killed in the middle of step 2: the step it was cut in has events
 * but no statistics, and the page opens at the last whole step (1) and what
 * ran after it to the end, where the job failed (it opened at a complete
 * looking step, the failure nowhere in view). */
Test(browser, a_failed_job_opens_where_it_failed, .timeout = 180) {
    require_playwright();
    char db[256], cmd[1024];
    fixture_tmp_path(db, sizeof db, "browser-failed");
    snprintf(cmd, sizeof cmd,
             "'%s' run --db '%s' --steps 4 --microbatches 4 --model timed:f=2ms,b=2ms,w=2ms,act=4KiB "
             "--progress off --fail-at step=2,rank=1,phase=B,mb=2 >/dev/null 2>&1",
             PPRUN_BIN, db);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the job was to fail (exit %d)", WEXITSTATUS(st));
    cJSON *j = browse(db, "failed", NULL);
    cJSON *o = cJSON_GetObjectItem(j, "opened"), *view = cJSON_GetObjectItem(o, "view");
    char *text = cJSON_PrintUnformatted(o);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "status")->valuestring, "failed", "%s", text);
    cr_assert_eq(jnum(o, "lastWhole"), 1, "step 2 was cut: no statistics: %s", text);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "step")), "a window, not one step: %s", text);
    cr_assert_leq(jnum(view, "from"), jnum(o, "lastStart"), "%s", text);
    cr_assert_geq(jnum(view, "to"), jnum(o, "timelineEnd"), "the end of the job is in view: %s", text);
    cr_assert_gt(jnum(o, "cutEvents"), 0, "the cut step's events are in view: %s", text);
    /* the cut step's loss is some microbatches' (it was plotted as step 2's) */
    const cJSON *ls = cJSON_GetObjectItem(o, "lossSteps");
    cr_assert_eq(cJSON_GetArraySize(ls), 2, "losses of steps 0 and 1 only: %s", text);
    cr_assert_eq(cJSON_GetArrayItem(ls, 1)->valueint, 1, "%s", text);
    free(text);
    cJSON_Delete(j);
}

/* A DualPipeV job: a pair's F and BW ran at once on one rank, and the row
 * shows them on its two lanes, the F above (its tooltip there), the BW
 * below; the plan's rows too. */
Test(browser, dualpipev_pairs_on_two_lanes_of_their_row, .timeout = 180) {
    require_playwright();
    char db[256], cmd[1024];
    fixture_tmp_path(db, sizeof db, "browser-lanes");
    snprintf(cmd, sizeof cmd,
             "'%s' run --db '%s' --nproc-per-node 2 --schedule dualpipev --steps 3 --microbatches 4 "
             "--model timed:f=4ms,b=4ms,w=4ms,act=4KiB --progress off >/dev/null 2>&1",
             PPRUN_BIN, db);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the job failed (exit %d)", WEXITSTATUS(st));
    cJSON *j = browse(db, "lanes", NULL);
    char *text = cJSON_PrintUnformatted(j);
    const cJSON *drawn = cJSON_GetObjectItem(j, "drawn"), *pair = cJSON_GetObjectItem(j, "pair");
    cr_assert_gt(jnum(drawn, "lane2"), 0, "ops on the second lane: %s", text);
    cr_assert_gt(jnum(j, "planLane2"), 0, "the plan's pairs on the second lane: %s", text);
    cr_assert(cJSON_IsObject(pair), "an F and a BW of one rank overlapping in step 1: %s", text);
    const cJSON *fc = cJSON_GetObjectItem(pair, "fc"), *bwc = cJSON_GetObjectItem(pair, "bwc");
    cr_assert(cJSON_IsObject(fc) && cJSON_IsObject(bwc), "%s", text);
    cr_assert_gt(jnum(bwc, "y") - jnum(fc, "y"), 5, "the BW under the F: %s", text);
    char want[64];
    int rank = (int)jnum(pair, "rank");
    snprintf(want, sizeof want, "rank %d · F · microbatch %d · stage %d", rank,
             cJSON_GetArrayItem(cJSON_GetObjectItem(pair, "f"), 1)->valueint,
             cJSON_GetArrayItem(cJSON_GetObjectItem(pair, "f"), 0)->valueint);
    cr_assert(strstr(cJSON_GetObjectItem(j, "fTip")->valuestring, want), "%s: %s", want, text);
    snprintf(want, sizeof want, "rank %d · BW · microbatch %d · stage %d", rank,
             cJSON_GetArrayItem(cJSON_GetObjectItem(pair, "bw"), 1)->valueint,
             cJSON_GetArrayItem(cJSON_GetObjectItem(pair, "bw"), 0)->valueint);
    cr_assert(strstr(cJSON_GetObjectItem(j, "bwTip")->valuestring, want), "%s: %s", want, text);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "%s", text);
    free(text);
    cJSON_Delete(j);
}

/* Job k's activations chart (the "maxmem" mode's jobs[k - 1]) has its
 * --max-mem line at `bytes` labelled `label`, the note beside the title
 * saying `note` (a prefix): where the y axis puts that value (170 px high,
 * 8 px above the plot and 20 below, linechart.js), and in the note's colour
 * on the canvas, dash after dash across the chart. */
static void assert_bound_drawn(const cJSON *jobs, int k, double bytes, const char *label, const char *note,
                               const char *text) {
    const cJSON *o = cJSON_GetArrayItem(jobs, k - 1), *line = cJSON_GetObjectItem(o, "bound"),
                *scale = cJSON_GetObjectItem(o, "scale");
    cr_assert(cJSON_IsObject(line) && cJSON_IsObject(scale), "job %d: no --max-mem line drawn: %s", k, text);
    cr_assert_eq(jnum(line, "y"), bytes, "job %d: %s", k, text);
    cr_assert_str_eq(cJSON_GetObjectItem(line, "label")->valuestring, label, "job %d: %s", k, text);
    const char *said = cJSON_GetObjectItem(o, "note")->valuestring;
    cr_assert(said && strncmp(said, note, strlen(note)) == 0, "job %d: note '%s', not '%s'", k, said ? said : "", note);
    double lo = jnum(scale, "lo"), hi = jnum(scale, "hi"), h = jnum(o, "height");
    cr_assert(hi > bytes, "job %d: the y axis reaches the bound, with room for its label: %s", k, text);
    double want = h - 20 - (bytes - lo) / (hi - lo) * (h - 8 - 20);
    cr_assert(fabs(jnum(line, "py") - want) <= 0.5, "job %d: the line at %g px, the axis puts %g B at %g px: %s", k,
              jnum(line, "py"), bytes, want, text);
    cr_assert_geq(jnum(o, "dashes"), 40, "job %d: %s", k, text);
    cr_assert_eq(jnum(o, "dashesInColour"), jnum(o, "dashes"), "job %d: every dash on the canvas: %s", k, text);
}

/* A job's --max-mem on its activations chart (docs/dashboard.md): a dashed
 * line at the bound with its value, whether the peaks reach it or stay far
 * under it, and a note saying what it is; none without a bound. A timed
 * model of 64 KiB a microbatch-stage on 4 ranks: 1F1B holds 256 KiB on rank
 * 0. zb-h1 under 192 KiB (below that peak, where no line was drawn) and
 * under 3 microbatch-stages (the same bytes: 3 x 64 KiB) hold 192 KiB on
 * every rank; 1F1B under 1 MiB stays at its 256 KiB, and the y axis still
 * reaches 1 MiB. */
Test(browser, max_mem_bound_is_drawn_on_the_activations_chart, .timeout = 240) {
    require_playwright();
    static const char *const jobs[] = {"--schedule zb-h1 --max-mem 192KiB", "--schedule zb-h1 --max-mem 3",
                                       "--schedule 1f1b --max-mem 1MiB", "--schedule 1f1b"};
    char db[256], cmd[1024];
    fixture_tmp_path(db, sizeof db, "browser-maxmem");
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
        snprintf(cmd, sizeof cmd,
                 "'%s' run --db '%s' %s --steps 2 --model timed:f=2ms,b=2ms,w=1ms,act=64KiB --progress off "
                 ">/dev/null 2>&1",
                 PPRUN_BIN, db, jobs[i]);
        int st = system(cmd);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit %d", jobs[i], WEXITSTATUS(st));
    }
    cJSON *j = browse(db, "maxmem", "4");
    char *text = cJSON_PrintUnformatted(j);
    const cJSON *shown = cJSON_GetObjectItem(j, "jobs");
    cr_assert_eq(cJSON_GetArraySize(shown), 4, "%s", text);
    assert_bound_drawn(shown, 1, 196608, "--max-mem 192 KiB", "dashed: --max-mem 192 KiB per rank", text);
    assert_bound_drawn(shown, 2, 196608, "--max-mem 3 = 192 KiB",
                       "dashed: --max-mem 3 microbatch-stages per rank, 192 KiB: 3 × the 64 KiB a microbatch-stage "
                       "held on rank 0",
                       text);
    assert_bound_drawn(shown, 3, 1048576, "--max-mem 1 MiB", "dashed: --max-mem 1 MiB per rank", text);
    const cJSON *none = cJSON_GetArrayItem(shown, 3);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(none, "bound")), "no bound, no line: %s", text);
    cr_assert_str_eq(cJSON_GetObjectItem(none, "note")->valuestring, "", "%s", text);
    cr_assert_lt(jnum(cJSON_GetObjectItem(none, "scale"), "hi"), 1048576, "an axis of the peaks alone: %s", text);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "%s", text);
    free(text);
    cJSON_Delete(j);
}

/* A real `pprun run --serve` job, followed live. Its 180 steps last about
 * 45 s (sleeps, not compute): the page must open and see steps arrive
 * while it runs, and under a heavy load (three test executables at once
 * beside two other jobs) it once opened after the 60 steps it had. */
Test(browser, pprun_run_serve_shows_the_job_live, .timeout = 300) {
    require_playwright();
    char dir[PATH_MAX], shot[PATH_MAX + 64], db[256], log[256];
    snprintf(db, sizeof db, "/tmp/pprun-browser-run-%d.db", (int)getpid());
    snprintf(log, sizeof log, "/tmp/pprun-browser-run-%d.log", (int)getpid());
    unlink(db);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execl(PPRUN_BIN, PPRUN_BIN, "run", "--serve", "127.0.0.1:0", "--db", db, "--steps", "180", "--microbatches", "4",
              "--model", "timed:f=15ms,b=15ms,w=15ms,act=16KiB", "--progress", "off", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int i = 0; i < 200 && !port; i++) {
        usleep(50000);
        char *text = fixture_read_file(log);
        const char *at = text ? strstr(text, "dashboard at http://127.0.0.1:") : NULL;
        if (at) port = atoi(at + strlen("dashboard at http://127.0.0.1:"));
        free(text);
    }
    cr_assert_gt(port, 0, "pprun run --serve never printed its URL");
    build_dir(dir, sizeof dir);
    snprintf(shot, sizeof shot, "%s/browser-run.png", dir);
    cJSON *j = run_node("job", port, shot, NULL, pid);

    /* The job ends by itself; the dashboard stays until SIGINT. */
    char *text = NULL;
    for (int i = 0; i < 2400; i++) { /* a hang guard: 2 minutes */
        free(text);
        text = fixture_read_file(log);
        if (text && strstr(text, "until Ctrl-C")) break;
        usleep(50000);
    }
    cr_assert(text && strstr(text, "until Ctrl-C"), "the job did not finish: %s", text ? text : "");
    free(text);
    kill(pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    unlink(log);
    char *stats = stats_text(db);
    fixture_remove(db);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pprun run exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);

    int before = cJSON_GetObjectItem(j, "stepsBefore")->valueint,
        after = cJSON_GetObjectItem(j, "stepsAfter")->valueint;
    cr_assert_geq(after, before + 2, "steps before %d, after %d", before, after);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "follow")), "a running job opens in follow-live mode");
    cr_assert_geq(cJSON_GetObjectItem(j, "lossPoints")->valueint, after);
    const cJSON *sample;
    cJSON_ArrayForEach(sample, cJSON_GetObjectItem(j, "planSamples")) {
        char *text = cJSON_PrintUnformatted(sample);
        cr_assert_gt(jnum(sample, "drawn"), 0,
                     "following live, the planned timeline is aligned to a step in view, never empty: %s", text);
        free(text);
    }
    cJSON *drawn = cJSON_GetObjectItem(j, "drawn");
    cJSON *f = cJSON_GetObjectItem(drawn, "F");
    cr_assert_eq(cJSON_GetArraySize(f), 4, "a row per rank");
    const cJSON *v;
    cJSON_ArrayForEach(v, f) cr_assert_gt(v->valueint, 0, "F blocks drawn on every rank");

    /* Activations: the timed model holds F's copy of its 16 KiB input until
     * W, and 1F1B keeps min(m, p - r) microbatches in flight on rank r. */
    cr_assert_geq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "actPoints")), 2, "the activations chart fills live");
    const cJSON *step_bytes;
    cJSON_ArrayForEach(step_bytes, cJSON_GetObjectItem(j, "stepActBytes")) {
        char *got = cJSON_PrintUnformatted(step_bytes);
        cr_assert(cJSON_IsArray(step_bytes) && cJSON_GetArraySize(step_bytes) == 4, "%s", got);
        for (int r = 0; r < 4; r++)
            cr_assert_eq(cJSON_GetArrayItem(step_bytes, r)->valuedouble, (4 - r) * 16384.0, "rank %d: %s", r, got);
        free(got);
    }
    const cJSON *head = cJSON_GetObjectItem(j, "jobsHead"),
                *row = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "jobsRows"), 0);
    int act_col = -1, mem_col = -1, inflight_col = -1;
    for (int c = 0; c < cJSON_GetArraySize(head); c++) {
        if (strcmp(cJSON_GetArrayItem(head, c)->valuestring, "activations") == 0) act_col = c;
        if (strcmp(cJSON_GetArrayItem(head, c)->valuestring, "with weights") == 0) mem_col = c;
        if (strcmp(cJSON_GetArrayItem(head, c)->valuestring, "in flight") == 0) inflight_col = c;
    }
    cr_assert(act_col >= 0 && mem_col >= 0 && inflight_col >= 0 && row,
              "the Jobs tab has activations, with-weights and in-flight columns");
    cr_assert_str_eq(cJSON_GetArrayItem(row, act_col)->valuestring, "64 KiB");
    /* the timed model's 8 layers per stage hold a weight each: 4 floats of
     * state per weight, 128 B beside rank 0's 64 KiB */
    cr_assert_str_eq(cJSON_GetArrayItem(row, mem_col)->valuestring, "64.1 KiB (rank 0)");
    cr_assert_str_eq(cJSON_GetArrayItem(row, inflight_col)->valuestring, "4");

    /* The what-if table filled in while the job ran: its own row (1f1b)
     * marked, with the bytes it measured (4 microbatches of 16 KiB). */
    cJSON *rows = cJSON_GetObjectItem(j, "whatifRows"), *own = cJSON_GetArrayItem(rows, 1);
    cr_assert_eq(cJSON_GetArraySize(rows), 7);
    cr_assert_str_eq(cJSON_GetArrayItem(own, 1)->valuestring, "1f1b (this job)");
    cr_assert_str_eq(cJSON_GetArrayItem(own, 6)->valuestring, "64 KiB");
    cr_assert(strstr(cJSON_GetObjectItem(j, "whatifInfo")->valuestring, "timed model"), "%s",
              cJSON_GetObjectItem(j, "whatifInfo")->valuestring);
    /* Stage balance, read while the job ran: a row per rank's stage, the
     * same verdict on cuts as `pprun stats` gives once it has finished. */
    check_balance(cJSON_GetObjectItem(j, "balance"), stats, 4, 0);
    free(stats);
    cJSON_Delete(j);
}

/* ---- a real PyTorch job --------------------------------------------------- */

static int by_text(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lines "rank phase stage mb" (phase as the API numbers it: 0 F, 1 B, 2 W,
 * 8 BW), sorted, joined by ';' into out: the blocks of a step. */
static void sorted_lines(char **lines, int n, char *out, size_t size) {
    qsort(lines, (size_t)n, sizeof *lines, by_text);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strncat(out, lines[i], size - strlen(out) - 2);
        strcat(out, ";");
        free(lines[i]);
    }
}

/* Step 1's compute ops of job in db (source cpu), as sorted_lines writes them. */
static void sql_blocks(const char *db, int job, char *out, size_t size) {
    sqlite3 *s;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(
        sqlite3_prepare_v2(s,
                           "SELECT rank, CASE phase WHEN 'F' THEN 0 WHEN 'B' THEN 1 WHEN 'W' THEN 2 ELSE 8 END,"
                           " stage, microbatch FROM events WHERE job_id=?1 AND step=1 AND source='cpu' AND"
                           " phase IN ('F','B','W','BW')",
                           -1, &st, NULL),
        SQLITE_OK);
    sqlite3_bind_int(st, 1, job);
    char *lines[1024];
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW && n < 1024) {
        char buf[64];
        snprintf(buf, sizeof buf, "%d %d %d %d", sqlite3_column_int(st, 0), sqlite3_column_int(st, 1),
                 sqlite3_column_int(st, 2), sqlite3_column_int(st, 3));
        lines[n++] = strdup(buf);
    }
    sqlite3_finalize(st);
    sqlite3_close(s);
    sorted_lines(lines, n, out, size);
}

/* The script's blocks ([rank, phase, stage, mb]) as sql_blocks writes them. */
static void page_blocks(const cJSON *blocks, char *out, size_t size) {
    char *lines[1024];
    int n = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, blocks) {
        char buf[64];
        snprintf(buf, sizeof buf, "%d %d %d %d", cJSON_GetArrayItem(b, 0)->valueint, cJSON_GetArrayItem(b, 1)->valueint,
                 cJSON_GetArrayItem(b, 2)->valueint, cJSON_GetArrayItem(b, 3)->valueint);
        if (n < 1024) lines[n++] = strdup(buf);
    }
    sorted_lines(lines, n, out, size);
}

/* The spans of job in db that overlap [from, to) (ns since the job's t0),
 * as lines "rank name step", sorted and joined by ';' into out. */
static void sql_spans(const char *db, int job, double from, double to, char *out, size_t size) {
    sqlite3 *s;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(s,
                                    "SELECT e.rank, e.name, e.step FROM events e JOIN jobs j ON j.id=e.job_id WHERE"
                                    " e.job_id=?1 AND e.phase='SPAN' AND e.source='cpu' AND e.end_ns - j.t0_ns >= ?2"
                                    " AND e.start_ns - j.t0_ns <= ?3",
                                    -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_int(st, 1, job);
    sqlite3_bind_double(st, 2, from);
    sqlite3_bind_double(st, 3, to);
    char *lines[256];
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW && n < 256) {
        char buf[300];
        snprintf(buf, sizeof buf, "%d %s %d", sqlite3_column_int(st, 0), (const char *)sqlite3_column_text(st, 1),
                 sqlite3_column_int(st, 2));
        lines[n++] = strdup(buf);
    }
    sqlite3_finalize(st);
    sqlite3_close(s);
    sorted_lines(lines, n, out, size);
}

/* The window (ns since the job's t0) that holds all of job's step 1 in
 * db, its spans included, and 1% of it more on each side, as "FROM,TO"
 * appended to out. */
static void step_one_window(const char *db, int job, char *out, size_t size) {
    sqlite3 *s;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(
        sqlite3_prepare_v2(s,
                           "SELECT min(e.start_ns) - j.t0_ns, max(e.end_ns) - j.t0_ns FROM events e JOIN jobs j"
                           " ON j.id=e.job_id WHERE e.job_id=?1 AND e.step=1 AND e.source='cpu'",
                           -1, &st, NULL),
        SQLITE_OK);
    sqlite3_bind_int(st, 1, job);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    int64_t from = sqlite3_column_int64(st, 0), to = sqlite3_column_int64(st, 1), pad = (to - from) / 100 + 1;
    sqlite3_finalize(st);
    sqlite3_close(s);
    snprintf(out + strlen(out), size - strlen(out), "%s%lld,%lld", out[0] ? "," : "",
             (long long)(from - pad > 0 ? from - pad : 0), (long long)(to + pad));
}

/* What the page drew of a job's step 1 (the script's `gpipe` or `zbv`),
 * in a window that holds all of it: the blocks it holds are the
 * database's, all in view; one block drawn per op in view (of step 1 and
 * the ends of its neighbours) on the row of the rank that ran it, as F, B,
 * W or BW; the program's spans in view are the database's, drawn on their
 * rank's lane, step 1's data and log spans of each rank among them. */
static void check_torch_step(const cJSON *got, const char *db, int job, const char *db_blocks, const char *plan_phase) {
    char blocks[16384];
    page_blocks(cJSON_GetObjectItem(got, "blocks"), blocks, sizeof blocks);
    cr_assert_str_eq(blocks, db_blocks, "the page holds step 1's ops as the database has them");
    cr_assert_eq(jnum(got, "outside"), 0, "step 1's ops are all in view");
    const cJSON *drawn = cJSON_GetObjectItem(got, "drawn"), *in_view = cJSON_GetObjectItem(got, "inView");
    static const char *const keys[4] = {"F", "B", "W", "BW"};
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < 2; r++) {
            int n = cJSON_GetArrayItem(cJSON_GetObjectItem(drawn, keys[k]), r)->valueint;
            int want = cJSON_GetArrayItem(cJSON_GetObjectItem(in_view, keys[k]), r)->valueint;
            cr_assert_eq(n, want, "rank %d: %d %s blocks drawn, %d in view", r, n, keys[k], want);
        }
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(drawn, "spanLane")), "a lane for the program's spans");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(got, "legendSpans")), "and its legend");
    const cJSON *view = cJSON_GetObjectItem(got, "view");
    char want[4096], seen[4096], *lines[256];
    sql_spans(db, job, jnum(view, "from"), jnum(view, "to"), want, sizeof want);
    int n = 0, per_rank[2] = {0, 0}, log1[2] = {0, 0}, data1[2] = {0, 0};
    const cJSON *sp;
    cJSON_ArrayForEach(sp, cJSON_GetObjectItem(got, "spans")) {
        int r = cJSON_GetArrayItem(sp, 0)->valueint, step = cJSON_GetArrayItem(sp, 2)->valueint;
        const char *name = cJSON_GetArrayItem(sp, 1)->valuestring;
        char buf[300];
        snprintf(buf, sizeof buf, "%d %s %d", r, name, step);
        if (n < 256) lines[n++] = strdup(buf);
        cr_assert(r >= 0 && r < 2);
        per_rank[r]++;
        log1[r] += step == 1 && !strcmp(name, "log");
        data1[r] += step == 1 && !strcmp(name, "data");
    }
    sorted_lines(lines, n, seen, sizeof seen);
    cr_assert_str_eq(seen, want, "the spans in view are the database's");
    for (int r = 0; r < 2; r++) {
        cr_assert(log1[r] == 1 && data1[r] == 1, "rank %d: its data and log spans of step 1", r);
        cr_assert_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(drawn, "spans"), r)->valueint, per_rank[r],
                     "rank %d: its spans in view drawn on its lane", r);
    }
    cr_assert_gt(jnum(cJSON_GetObjectItem(got, "planPhases"), plan_phase), 0, "the plan's %s cells", plan_phase);
    cr_assert_gt(jnum(got, "planDrawn"), 0);
}

/* Counts per phase (F, B, W, BW) and rank of step 1's ops in db_blocks. */
static void count_blocks(const char *db_blocks, int want[4][2]) {
    memset(want, 0, sizeof(int) * 8);
    for (const char *p = db_blocks; *p; p = strchr(p, ';') + 1) {
        int rank, phase;
        cr_assert_eq(sscanf(p, "%d %d", &rank, &phase), 2);
        cr_assert(rank >= 0 && rank < 2);
        want[phase == 8 ? 3 : phase][rank]++;
    }
}

Test(browser, a_pytorch_jobs_ops_and_spans_on_their_ranks, .timeout = 600) {
    require_playwright();
    char db[256], gpipe[16384], zbv[16384];
    snprintf(db, sizeof db, "/tmp/pprun-browser-torch-%d.db", (int)getpid());
    unlink(db);
    lt_proc p;
    const char *spans[] = {"--spans", "--schedule", "GPipe", NULL};
    torch_run(&p, db, 2, 3, 4, NULL, spans);
    cr_assert_eq(p.status, 0, "GPipe: %s", p.err);
    lt_free(&p);
    spans[2] = "ZBVZeroBubble";
    torch_run(&p, db, 2, 3, 4, NULL, spans);
    cr_assert_eq(p.status, 0, "ZBVZeroBubble: %s", p.err);
    lt_free(&p);
    sql_blocks(db, 1, gpipe, sizeof gpipe);
    sql_blocks(db, 2, zbv, sizeof zbv);
    int want[4][2];
    lt_run(&p, (const char *[]){"stats", "--db", db, "--job", "1", NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    char *stats = strdup(p.out);
    lt_free(&p);

    /* the page reads a copy (browse removes it), the checks this file */
    char copy[300], sql[700];
    snprintf(copy, sizeof copy, "%s.served", db);
    unlink(copy);
    sqlite3 *s;
    snprintf(sql, sizeof sql, "VACUUM INTO '%s'", copy);
    cr_assert_eq(sqlite3_open(db, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(s));
    sqlite3_close(s);
    char windows[128] = "";
    step_one_window(db, 1, windows, sizeof windows);
    step_one_window(db, 2, windows, sizeof windows);
    cJSON *j = browse(copy, "torch", windows);
    const cJSON *g = cJSON_GetObjectItem(j, "gpipe"), *z = cJSON_GetObjectItem(j, "zbv");
    cr_assert_str_eq(cJSON_GetObjectItem(g, "schedule")->valuestring, "ScheduleGPipe");
    count_blocks(gpipe, want);
    cr_assert(want[0][0] == 4 && want[3][0] == 4 && want[0][1] == 4 && want[3][1] == 4 && !want[1][0] && !want[2][1],
              "GPipe: 4 F and 4 BW on each rank: %s", gpipe);
    check_torch_step(g, db, 1, gpipe, "BW");
    const char *tip = cJSON_GetObjectItem(j, "bwTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 1 · BW · microbatch 0 · stage 1 · step 1") && strstr(tip, "full backward"), "%s", tip);
    tip = cJSON_GetObjectItem(j, "spanTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 0 · span \"data\" · step 1") && strstr(tip, "duration"), "%s", tip);
    /* the totals table has the BW column pprun stats prints */
    const cJSON *head = cJSON_GetObjectItem(j, "critHead");
    cr_assert_str_eq(cJSON_GetArrayItem(head, 4)->valuestring, "BW");
    cr_assert(strstr(stats, "  rank          F          B          W         BW        OPT        all  share\n"), "%s",
              stats);
    /* the what-if's own row is PyTorch's schedule, and it says B and W are halves of the BW */
    cr_assert(strstr(cJSON_GetObjectItem(j, "whatifInfo")->valuestring, "B and W are halves of it"), "%s",
              cJSON_GetObjectItem(j, "whatifInfo")->valuestring);
    int own = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(j, "whatifRows")) own +=
        !strcmp(cell(row, 1), "ScheduleGPipe (this job)");
    cr_assert_eq(own, 1, "a row for the program's own schedule");
    free(stats);

    cr_assert_str_eq(cJSON_GetObjectItem(z, "schedule")->valuestring, "ScheduleZBVZeroBubble");
    count_blocks(zbv, want);
    cr_assert(want[1][0] == 8 && want[2][0] == 8 && want[1][1] == 8 && want[2][1] == 8 && !want[3][0] && !want[3][1],
              "ZBV: a B and a W of each of 2 stages x 4 microbatches on each rank, no BW: %s", zbv);
    check_torch_step(z, db, 2, zbv, "W");
    tip = cJSON_GetObjectItem(j, "wTooltip")->valuestring;
    cr_assert(strstr(tip, "rank 1 · W · microbatch 0") && strstr(tip, "step 1"), "%s", tip);
    cJSON_Delete(j);
    fixture_remove(db);
}

/* A job of 1,024 ranks in 64 nodes of 16 (ranks 16k..16k+15 on node k),
 * pipelines of 8 (rank r on stage r % 8), interleaved 1F1B (m = 8, v = 2)
 * as bench/loadgen.h writes it, SCALE_STEPS steps a little apart;
 * rank SCALE_SLOW runs every op 1.3 times as long (its times from the
 * step's start stretched), so that every other rank waits: its bubble is
 * the lowest of each step, the others' all the same. Analysed. */
#define SCALE_RANKS 1024
#define SCALE_STEPS 4
#define SCALE_SLOW 637
static void make_scale_job(const char *path) {
    db *d = tfix_open_fresh(path);
    loadgen_config cfg = {
        .ranks = SCALE_RANKS, .nodes = 64, .rate = 1e6, .pipeline = 8, .microbatches = 8, .chunks = 2};
    const int64_t t0 = 1000000000;
    lg_shape shape;
    int64_t job;
    pp_err err;
    cr_assert_eq(lg_shape_build(&cfg, &shape, &err), 0, "%s", err.msg);
    cr_assert_eq(lg_job(d, &cfg, &shape, SCALE_STEPS, t0, &job, &err), 0, "%s", err.msg);
    const int64_t pitch = shape.step_ns * 3 / 2; /* the slow step and a gap */
    lg_shape_free(&shape);
    for (int step = 0; step < SCALE_STEPS; step++) {
        trace_event *ev = NULL;
        size_t n = 0;
        cr_assert_eq(loadgen_step_records(&cfg, step, t0, &ev, &n, &err), 0, "%s", err.msg);
        int64_t at = INT64_MAX;
        for (size_t i = 0; i < n; i++)
            if ((int64_t)ev[i].start_ns < at) at = (int64_t)ev[i].start_ns;
        int64_t to = t0 + step * pitch;
        for (size_t i = 0; i < n; i++) {
            int64_t s = (int64_t)ev[i].start_ns - at, e = (int64_t)ev[i].end_ns - at;
            if (ev[i].rank == SCALE_SLOW) s = s * 13 / 10, e = e * 13 / 10;
            ev[i].start_ns = (uint64_t)(to + s);
            ev[i].end_ns = (uint64_t)(to + e);
        }
        for (size_t i = 0; i < n; i += 65536)
            cr_assert_eq(db_insert_events(d, job, ev + i, n - i < 65536 ? n - i : 65536, &err), 0, "%s", err.msg);
        free(ev);
    }
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    cr_assert_eq(db_finish_job(d, job, "succeeded", 0, -1, NULL, &err), 0, "%s", err.msg);
    /* as `pprun run --pp 8 --dp 128` records its mesh */
    cr_assert_eq(
        sqlite3_exec(db_sqlite(d),
                     "UPDATE jobs SET config_json = json_set(coalesce(config_json, '{}'), '$.pp', 8, '$.dp', 128)",
                     NULL, NULL, NULL),
        SQLITE_OK);
    db_close(d);
}

Test(browser, a_1024_rank_job_grouped_with_its_slow_rank_hottest, .timeout = 300) {
    require_playwright();
    char db[256];
    fixture_tmp_path(db, sizeof db, "browser-scale");
    make_scale_job(db);
    cJSON *j = browse(db, "scale", NULL);
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "errors")), 0, "no script errors: %s", text);
    /* opened by node, every group folded into its lane, each lane with its bubble */
    const cJSON *open = cJSON_GetObjectItem(j, "opened");
    cr_assert_str_eq(cJSON_GetObjectItem(open, "by")->valuestring, "node", "%s", text);
    cr_assert_eq(jnum(open, "rows"), 64, "a lane per node: %s", text);
    cr_assert_eq(jnum(open, "rankRows"), 0, "every group folded: %s", text);
    const cJSON *lane, *lanes = cJSON_GetObjectItem(open, "lanes");
    cr_assert_eq(cJSON_GetArraySize(lanes), 64, "%s", text);
    cJSON_ArrayForEach(lane, lanes) {
        cr_assert_eq(jnum(lane, "ranks"), 16, "%s", text);
        cr_assert(jnum(lane, "idle") > 0.05 && jnum(lane, "idle") < 0.95, "a lane shows its group's bubble: %s", text);
    }
    /* node 39's label unfolds it (its 16 ranks get rows), a second click folds it */
    cr_assert_eq(jnum(cJSON_GetObjectItem(j, "unfolded"), "rows"), 64 + 16, "%s", text);
    cr_assert_eq(jnum(cJSON_GetObjectItem(j, "unfolded"), "rankRows"), 16, "%s", text);
    cr_assert_eq(jnum(cJSON_GetObjectItem(j, "folded"), "rows"), 64, "%s", text);
    cr_assert_eq(jnum(cJSON_GetObjectItem(j, "byStage"), "rows"), 8, "a lane per stage: %s", text);
    /* --pp 8 --dp 128: a lane per pipeline of 8 ranks */
    const cJSON *byrep = cJSON_GetObjectItem(j, "byReplica");
    cr_assert_eq(jnum(byrep, "rows"), 128, "a lane per replica: %s", text);
    cr_assert_eq(jnum(cJSON_GetArrayItem(cJSON_GetObjectItem(byrep, "lanes"), 127), "ranks"), 8, "%s", text);
    /* the replica filter ("all" and one option a replica): replica 5 alone is
     * ranks 40 to 47, a row each; by node, its one node's lane (16 ranks a
     * node: ranks 32 to 47) holding those 8 only */
    cr_assert_eq(jnum(j, "replicaOptions"), 1 + 128, "%s", text);
    const cJSON *one = cJSON_GetObjectItem(j, "oneReplica"), *rk = cJSON_GetObjectItem(one, "ranks");
    cr_assert_eq(jnum(one, "replica"), 5, "%s", text);
    cr_assert_eq(cJSON_GetArraySize(rk), 8, "%s", text);
    for (int k = 0; k < 8; k++) cr_assert_eq(cJSON_GetArrayItem(rk, k)->valueint, 40 + k, "%s", text);
    /* its Chrome trace: replica 5's ranks alone */
    const cJSON *rt = cJSON_GetObjectItem(j, "replicaTrace"), *tr;
    cr_assert(strstr(cJSON_GetObjectItem(rt, "file")->valuestring, "-ranks-40-47.trace.json"), "%s", text);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(rt, "ranks")), 8, "%s", text);
    cJSON_ArrayForEach(tr, cJSON_GetObjectItem(rt, "ranks")) cr_assert(tr->valueint >= 40 && tr->valueint <= 47, "%s", text);
    const cJSON *one_node = cJSON_GetObjectItem(j, "oneReplicaByNode");
    cr_assert_eq(jnum(one_node, "groups"), 1, "%s", text);
    cr_assert_eq(jnum(one_node, "rows"), 1, "its lane, folded: %s", text);
    /* the heatmap: a row per rank, a column per step; the slow rank is the hottest cell */
    const cJSON *heat = cJSON_GetObjectItem(j, "heatmap");
    cr_assert_eq(jnum(heat, "rows"), SCALE_RANKS, "%s", text);
    cr_assert_eq(jnum(heat, "cols"), SCALE_STEPS, "%s", text);
    const cJSON *hot = cJSON_GetObjectItem(heat, "hottest");
    cr_assert_eq(jnum(hot, "rank"), SCALE_SLOW, "the hottest cell is the slow rank: %s", text);
    cr_assert(jnum(hot, "ratio") < jnum(hot, "median"), "it idles least: %s", text);
    /* clicking it shows its step with the rank's row unfolded and highlighted */
    const cJSON *picked = cJSON_GetObjectItem(j, "picked");
    cr_assert_eq(jnum(picked, "rank"), SCALE_SLOW, "%s", text);
    cr_assert_eq(jnum(picked, "step"), jnum(hot, "step"), "%s", text);
    cr_assert_eq(jnum(picked, "highlight"), SCALE_SLOW, "%s", text);
    cr_assert_eq(jnum(picked, "rows"), 64 + 16, "every replica again, its node unfolded: %s", text);
    cr_assert_eq(jnum(picked, "replica"), -1, "%s", text);
    cr_assert_str_eq(cJSON_GetObjectItem(picked, "replicaShown")->valuestring, "-1", "%s", text);
    cr_assert_eq(jnum(picked, "shownStep"), jnum(hot, "step"), "%s", text);
    cr_assert(jnum(picked, "slowDrawn") > 0, "the slow rank's ops are drawn on its row: %s", text);
    /* the steps kept without their per-rank arrays, each with the least and
     * most of its ranks; the bars of the step shown asked for alone */
    const cJSON *kept = cJSON_GetObjectItem(j, "stepsKept"), *bars = cJSON_GetObjectItem(j, "stepBars");
    cr_assert_eq(jnum(kept, "n"), SCALE_STEPS, "%s", text);
    cr_assert_eq(jnum(kept, "withRanks"), 0, "%s", text);
    cr_assert(jnum(kept, "min") < jnum(kept, "mean") && jnum(kept, "mean") < jnum(kept, "max"), "%s", text);
    cr_assert_eq(jnum(bars, "step"), jnum(hot, "step"), "%s", text);
    cr_assert_eq(jnum(bars, "ranks"), SCALE_RANKS, "%s", text);
    /* a pan and a zoom with a row per rank and 100,000 events */
    const cJSON *t = cJSON_GetObjectItem(j, "redraw");
    cr_assert_eq(jnum(t, "rows"), SCALE_RANKS, "%s", text);
    cr_assert(jnum(t, "panInView") >= 90000 && jnum(t, "zoomInView") >= 50000, "%s", text);
    printf("browser scale: 1,024 rows, %d events in view: pan redraw %.1f ms (median of %d), zoom redraw %.1f ms "
           "(%d in view); first draw %.1f ms\n",
           (int)jnum(t, "panInView"), jnum(t, "panMs"), (int)jnum(t, "panMoves"), jnum(t, "zoomMs"),
           (int)jnum(t, "zoomInView"), jnum(t, "firstMs"));
    fflush(stdout);
    free(text);
    cJSON_Delete(j);
}
