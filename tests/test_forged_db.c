/* test_forged_db.c: a trace database with one value forged past its bound
 * (docs/schema.md, "Bounds on what is read"; db/bounds.h), read by every
 * reader a user points at a file: `pprun stats`, `pprun export` and
 * `pprun serve`'s routes, all real pprun processes.
 *
 * Each row of `forged` is one UPDATE (or INSERT) on a copy of a real trace
 * (a tiny job run once by `pprun run`), what stats and export must do with
 * it, and routes that must answer. A reader that uses the value must refuse
 * it, naming table.column and the value as the file holds it; one that does
 * not use it must succeed without printing it. The server must answer the
 * route with the status and message, then still answer /api/jobs, and stop
 * cleanly: in the sanitized build an overflow the value caused aborts the
 * process (UBSan), so the route gets no answer and the server is gone. */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/db.h"
#include "helpers/web_client.h"

/* A job that takes a fraction of a second; steps 1 and 2 are what stats reads. */
#define TIMED "--model timed:f=1ms,b=1ms,w=1ms --steps 3 --nproc-per-node 2 --progress off"
#define I64MAX "9223372036854775807"
#define I64MIN "-9223372036854775808"
/* one op of step 1 */
#define ONE_OP "WHERE id=(SELECT min(id) FROM events WHERE step=1 AND phase='F')"
/* 2^62, the largest time (db/bounds.h): two of them sum past it */
#define T62 "4611686018427387904"
/* the job run as 2 replicas of a 1-stage pipeline (what --dp 2 writes in
 * config_json, and each rank's plan of stage 0): stats reads its wait for
 * the all-reduce and the all-reduce */
#define AS_DP2 "UPDATE jobs SET config_json=json_set(config_json,'$.dp',2,'$.pp',1); UPDATE plan SET stage=0;"
/* three ops of rank 0's step 1 made spans named N from t0 to 2^62: each
 * time within its bound, their sum past it */
#define THREE_SPANS(n)                                                                                                 \
    "UPDATE events SET phase='SPAN', name='" n "', start_ns=(SELECT t0_ns FROM jobs WHERE id=1), end_ns=" T62          \
    " WHERE id IN (SELECT id FROM events WHERE job_id=1 AND step=1 AND rank=0 AND phase='F' LIMIT 3)"
#define SUMMED_PAST(column) "job 1: " column " summed over its rows passes 0..4611686018427387904 (a time in ns)"
/* the steps' totals made again from the forged rows, as the analyses
 * would have written them */
#define RETOTAL ";" DB_STEP_TOTALS_OF_ROWS

typedef struct route_want {
    const char *path; /* under /api/jobs/1 */
    int status;
    const char *text; /* in the body; NULL: anything */
} route_want;

typedef struct forged_row {
    const char *name;
    const char *sql;
    int stats_rc;           /* 0 or 2 */
    const char *stats_text; /* in stats' stderr when stats_rc is 2 */
    int export_rc;
    const char *export_text;
    route_want routes[3]; /* path NULL ends */
} forged_row;

static const forged_row forged[] = {
    {"jobs.t0_ns INT64_MAX",
     "UPDATE jobs SET t0_ns=" I64MAX,
     0,
     NULL,
     2,
     "job 1: jobs.t0_ns holds " I64MAX,
     {{"", 500, "jobs.t0_ns holds " I64MAX},
      {"/events", 500, "jobs.t0_ns holds " I64MAX},
      {"/trace.json", 500, "jobs.t0_ns holds " I64MAX}}},
    {"jobs.t0_ns INT64_MIN",
     "UPDATE jobs SET t0_ns=-9223372036854775807-1",
     0,
     NULL,
     2,
     "job 1: jobs.t0_ns holds " I64MIN,
     {{"", 500, "jobs.t0_ns holds " I64MIN},
      {"/kernels", 500, "jobs.t0_ns holds " I64MIN},
      {"/summary", 500, "jobs.t0_ns holds " I64MIN}}},
    /* export would find no step complete, so no critical path: refused,
     * not left out in silence */
    {"jobs.world_size INT64_MAX",
     "UPDATE jobs SET world_size=" I64MAX,
     2,
     "job 1: jobs.world_size holds " I64MAX ", not 1..65536 (ranks in the job)",
     2,
     "job 1: jobs.world_size holds " I64MAX,
     {{"", 500, "jobs.world_size holds " I64MAX},
      {"/summary", 500, "jobs.world_size holds " I64MAX},
      {"/events", 500, "jobs.world_size holds " I64MAX}}},
    /* the trace records a rank lost: summed over ranks by stats and /summary */
    {"ranks.dropped_events INT64_MAX",
     "UPDATE ranks SET dropped_events=" I64MAX " WHERE rank=0",
     2,
     "job 1: ranks.dropped_events holds " I64MAX ", not 0..70368744177664 (a count of records)",
     0,
     NULL,
     {{"/summary", 500, "ranks.dropped_events holds " I64MAX}, {"/events", 200, NULL}}},
    {"events.rank INT32_MAX",
     "UPDATE events SET rank=2147483647 " ONE_OP,
     2,
     "job 1: events.rank holds 2147483647",
     2,
     "job 1: events.rank holds 2147483647",
     {{"/critpath", 500, "events.rank holds 2147483647"},
      {"/trace.json", 500, "events.rank holds 2147483647"},
      {"/events", 200, NULL}}},
    /* a step past a C int, read as one, would be exported wrapped */
    {"events.step 9999999999",
     "UPDATE events SET step=9999999999 " ONE_OP,
     0,
     NULL,
     2,
     "job 1: events.step holds 9999999999, not 0..2147483647 (a step)",
     {{"/trace.json", 500, "events.step holds 9999999999"}, {"/events", 500, "events.step holds 9999999999"}}},
    {"events.stage INT32_MAX",
     "UPDATE events SET stage=2147483647 " ONE_OP,
     2,
     "job 1: events.stage holds 2147483647",
     2,
     "job 1: events.stage holds 2147483647",
     {{"/critpath", 500, "events.stage holds 2147483647"},
      {"/trace.json", 500, "events.stage holds 2147483647"},
      {"/events", 500, "events.stage holds 2147483647"}}},
    {"events.start_ns INT64_MAX",
     "UPDATE events SET start_ns=" I64MAX " " ONE_OP,
     2,
     "job 1: events.start_ns holds " I64MAX,
     2,
     "job 1: events.start_ns holds " I64MAX,
     {{"/critpath", 500, "events.start_ns holds " I64MAX}, {"/trace.json", 500, "events.start_ns holds " I64MAX}}},
    {"events.start_ns INT64_MIN",
     "UPDATE events SET start_ns=-9223372036854775807-1 " ONE_OP,
     2,
     "job 1: events.start_ns holds " I64MIN,
     2,
     "job 1: events.start_ns holds " I64MIN,
     {{"/critpath", 500, "events.start_ns holds " I64MIN}, {"/trace.json", 500, "events.start_ns holds " I64MIN}}},
    {"events.end_ns INT64_MAX",
     "UPDATE events SET end_ns=" I64MAX " " ONE_OP,
     2,
     "job 1: events.end_ns holds " I64MAX,
     2,
     "job 1: events.end_ns holds " I64MAX,
     {{"/events", 500, "events.end_ns holds " I64MAX}, {"/critpath", 500, "events.end_ns holds " I64MAX}}},
    {"events.bytes INT64_MAX",
     "UPDATE events SET bytes=" I64MAX " " ONE_OP,
     2,
     "job 1: events.bytes holds " I64MAX,
     2,
     "job 1: events.bytes holds " I64MAX,
     {{"/critpath", 500, "events.bytes holds " I64MAX},
      {"/trace.json", 500, "events.bytes holds " I64MAX},
      {"/events", 500, "events.bytes holds " I64MAX}}},
    {"plan.sim_start_ns INT64_MAX",
     "UPDATE plan SET sim_start_ns=" I64MAX ", sim_end_ns=-9223372036854775807-1",
     2,
     "job 1: plan.sim_start_ns holds " I64MAX,
     0,
     NULL,
     {{"/plan", 500, "plan.sim_start_ns holds " I64MAX},
      {"/whatif", 500, "plan.sim_start_ns holds " I64MAX},
      {"/summary", 500, "plan.sim_start_ns holds " I64MAX}}},
    {"event_runs.first_id -1",
     "UPDATE event_runs SET first_id=-1 WHERE rank=0",
     0,
     NULL,
     0,
     NULL,
     {{"/events", 500, "event_runs.first_id holds -1"}, {"/trace.json", 200, NULL}}},
    {"kernels.start_ns INT64_MIN",
     "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream) "
     "VALUES(1,0,NULL,'k',-9223372036854775807-1," I64MAX ",7)",
     0,
     NULL,
     2,
     "job 1: kernels.start_ns holds " I64MIN,
     {{"/trace.json", 500, "kernels.start_ns holds " I64MIN}, {"/kernels", 500, "kernels.start_ns holds " I64MIN}}},
    /* a kernel that starts in the job and never ends: the window's reader
     * must refuse it, not answer a list without it */
    {"kernels.end_ns INT64_MAX",
     "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream) "
     "VALUES(1,1,NULL,'k',(SELECT t0_ns FROM jobs WHERE id=1)+1000," I64MAX ",7)",
     0,
     NULL,
     2,
     "job 1: kernels.end_ns holds " I64MAX,
     {{"/kernels", 500, "kernels.end_ns holds " I64MAX},
      {"/kernels?from=0&to=2000&ranks=1", 500, "kernels.end_ns holds " I64MAX},
      {"/trace.json", 500, "kernels.end_ns holds " I64MAX}}},
    /* SQLite's sum() of two stopped stats, /summary and /whatif with
     * "database error: integer overflow", naming nothing; a replica's
     * wait is summed from its ranks' rows (the job's by cause from the
     * totals, not forged here) */
    {"step_idle.idle_ns 2^62 twice, waiting for the all-reduce",
     AS_DP2 "UPDATE step_idle SET cause='wait_dp', idle_ns=" T62
            " WHERE rank=0 AND step IN (1,2) AND cause='wait_gradient'",
     2,
     SUMMED_PAST("step_idle.idle_ns"),
     0,
     NULL,
     {{"/summary", 500, SUMMED_PAST("step_idle.idle_ns")},
      {"/whatif", 500, SUMMED_PAST("step_idle.idle_ns")},
      {"/gaps", 200, NULL}}},
    {"step_idle_totals.idle_ns 2^62 twice",
     "UPDATE step_idle_totals SET idle_ns=" T62 " WHERE step IN (1,2) AND cause='wait_gradient'",
     2,
     SUMMED_PAST("step_idle_totals.idle_ns"),
     0,
     NULL,
     {{"/summary", 500, SUMMED_PAST("step_idle_totals.idle_ns")},
      {"/gaps", 500, SUMMED_PAST("step_idle_totals.idle_ns")},
      {"/whatif", 200, NULL}}},
    {"three ALLREDUCE spans of 2^62",
     AS_DP2 THREE_SPANS("ALLREDUCE"),
     2,
     SUMMED_PAST("events.end_ns - start_ns"),
     0,
     NULL,
     {{"/summary", 500, SUMMED_PAST("events.end_ns - start_ns")},
      {"/whatif", 500, SUMMED_PAST("events.end_ns - start_ns")},
      {"/events", 200, NULL}}},
    /* the spans' total by name overflowed in C (UBSan); stats and a
     * compare read it (a_forged_job_is_named_by_a_compare...), /summary
     * does not */
    {"three spans of one name of 2^62",
     THREE_SPANS("data"),
     2,
     SUMMED_PAST("events.end_ns - start_ns"),
     0,
     NULL,
     {{"/summary", 200, NULL}, {"/events", 200, NULL}}},
    /* a negative longest run found no run: /events answered empty */
    {"event_run_span.span_ns -1",
     "UPDATE event_run_span SET span_ns=-1",
     0,
     NULL,
     0,
     NULL,
     {{"/events", 500, "event_run_span.span_ns holds -1"},
      {"/events?limit=1", 500, "event_run_span.span_ns holds -1"},
      {"/trace.json", 200, NULL}}},
    /* a step of 292 years in stats and /summary, wrapped in /steps */
    {"step_stats.end_ns INT64_MAX",
     "UPDATE step_stats SET end_ns=" I64MAX " WHERE step=2 AND rank=1" RETOTAL,
     2,
     "job 1: step_totals.end_ns holds " I64MAX,
     0,
     NULL,
     {{"/steps", 500, "step_stats.end_ns holds " I64MAX},
      {"/summary", 500, "step_totals.end_ns holds " I64MAX},
      {"/steps?per_rank=0", 500, "step_totals.end_ns holds " I64MAX}}},
    {"step_stats.start_ns INT64_MIN",
     "UPDATE step_stats SET start_ns=-9223372036854775807-1 WHERE step=2 AND rank=1" RETOTAL,
     2,
     "job 1: step_totals.start_ns holds " I64MIN,
     2,
     "job 1: step_stats.start_ns holds " I64MIN,
     {{"/steps", 500, "step_stats.start_ns holds " I64MIN},
      {"/trace.json", 500, "step_stats.start_ns holds " I64MIN},
      {"/whatif", 500, "step_totals.start_ns holds " I64MIN}}},
    /* summed in C (UBSan); stats left its idle section out */
    {"step_idle_totals.idle_ns INT64_MAX",
     "UPDATE step_idle SET idle_ns=" I64MAX " WHERE step=1; UPDATE step_idle_totals SET idle_ns=" I64MAX
     " WHERE step=1",
     2,
     "job 1: step_idle_totals.idle_ns holds " I64MAX,
     0,
     NULL,
     {{"/gaps", 500, "step_idle_totals.idle_ns holds " I64MAX},
      {"/gaps?step=1", 500, "step_idle_totals.idle_ns holds " I64MAX},
      {"/summary", 500, "step_idle_totals.idle_ns holds " I64MAX}}},
    /* /steps passed it on as the file has it */
    {"step_stats.act_peak_bytes INT64_MAX",
     "UPDATE step_stats SET act_peak_bytes=" I64MAX " WHERE step=2 AND rank=1" RETOTAL,
     2,
     "job 1: step_stats.act_peak_bytes holds " I64MAX,
     0,
     NULL,
     {{"/steps", 500, "step_stats.act_peak_bytes holds " I64MAX},
      {"/summary", 500, "step_stats.act_peak_bytes holds " I64MAX},
      {"/steps?per_rank=0", 500, "step_totals.act_peak_bytes_max holds " I64MAX}}},
    {"step_totals.ranks INT64_MAX",
     "UPDATE step_totals SET ranks=" I64MAX " WHERE step=2",
     0,
     NULL,
     0,
     NULL,
     {{"/steps?per_rank=0", 500, "step_totals.ranks holds " I64MAX}, {"/summary", 200, NULL}}},
    /* /gaps passed it on, less t0 */
    {"gaps.end_ns INT64_MAX",
     "UPDATE gaps SET end_ns=" I64MAX " WHERE step=1 AND rank=0 AND start_ns=(SELECT min(start_ns) FROM gaps WHERE "
     "step=1 AND rank=0)",
     0,
     NULL,
     0,
     NULL,
     {{"/gaps", 500, "gaps.end_ns holds " I64MAX},
      {"/gaps?step=1", 500, "gaps.end_ns holds " I64MAX},
      {"/events?step=1", 500, "gaps.end_ns holds " I64MAX}}},
    /* an int read each of these: the what-if wrapped the step to -1 and
     * showed "not measured", 2^32 + 1 merged into step 1 in /steps */
    {"step_stats.step INT64_MAX",
     "UPDATE step_stats SET step=" I64MAX " WHERE step=2" RETOTAL,
     2,
     "job 1: step_stats.step holds " I64MAX,
     0,
     NULL,
     {{"/steps", 500, "step_stats.step holds " I64MAX},
      {"/whatif", 500, "step_stats.step holds " I64MAX},
      {"/critpath", 500, "step_totals.step holds " I64MAX}}},
    {"step_stats.step 2^32 + 1",
     "UPDATE step_stats SET step=4294967297 WHERE step=2" RETOTAL,
     2,
     "job 1: step_stats.step holds 4294967297",
     0,
     NULL,
     {{"/steps", 500, "step_stats.step holds 4294967297"},
      {"/critpath", 500, "step_totals.step holds 4294967297"},
      {"/heatmap", 200, NULL}}},
    /* stats printed "mean of step 9223372036854775807" */
    {"losses.step INT64_MAX",
     "UPDATE losses SET step=" I64MAX " WHERE step=2",
     2,
     "job 1: losses.step holds " I64MAX,
     0,
     NULL,
     {{"/steps", 500, "losses.step holds " I64MAX}, {"/summary", 500, "losses.step holds " I64MAX}}},
    /* wrapped to -1 (no shape): the what-if showed "not measured" */
    {"jobs.stages INT64_MAX",
     "UPDATE jobs SET stages=" I64MAX ", virtual_stages=" I64MAX,
     2,
     "job 1's row declares a shape pprun never runs (" I64MAX " stages",
     0,
     NULL,
     {{"/whatif", 500, "declares a shape pprun never runs (" I64MAX " stages"}}},
    /* taken as no shape: the what-if showed "not measured" */
    {"jobs.microbatches -4",
     "UPDATE jobs SET microbatches=-4",
     2,
     "job 1's row declares a shape pprun never runs (2 stages, 1 chunks per rank, -4 microbatches: below 0)",
     0,
     NULL,
     {{"/whatif", 500, "declares a shape pprun never runs (2 stages, 1 chunks per rank, -4 microbatches"}}},
    /* text where a number goes: SQLite reads it as 0 (an op 51,860 s long) */
    {"events.start_ns text",
     "UPDATE events SET start_ns='abc' " ONE_OP,
     2,
     "job 1: events.start_ns holds abc, not 0..4611686018427387904",
     2,
     "job 1: events.start_ns holds abc",
     {{"/critpath", 500, "events.start_ns holds abc"}, {"/trace.json", 500, "events.start_ns holds abc"}}},
    /* export wrote a span of negative duration */
    {"events.end_ns before its start",
     "UPDATE events SET end_ns=start_ns-1000 " ONE_OP,
     2,
     "job 1: an events row ends (end_ns",
     2,
     "before it starts (start_ns",
     {{"/trace.json", 500, "before it starts (start_ns"}}},
    /* stats printed "loss 0.0000 (mean of step 2)" */
    {"losses.loss text",
     "UPDATE losses SET loss='abc' WHERE step=2 AND microbatch=0",
     2,
     "job 1: losses.loss of step 2 holds abc, not a number",
     0,
     NULL,
     {{"/steps", 200, NULL}}},
    /* stats printed "eval loss  not finite after step 2" */
    {"eval_losses.loss text",
     "INSERT INTO eval_losses(job_id, step, microbatch, loss, rank, at_ns) VALUES (1, 2, 0, 'abc', 1, 1)",
     2,
     "job 1: eval_losses.loss of step 2 holds abc, not a number",
     0,
     NULL,
     {{"/steps", 200, NULL}}},
    /* export's counter time was the value less t0: a signed overflow */
    {"losses.at_ns INT64_MIN",
     "UPDATE losses SET at_ns=-9223372036854775807-1 WHERE step=1",
     0,
     NULL,
     2,
     "job 1: losses.at_ns holds " I64MIN,
     {{"/trace.json", 500, "losses.at_ns holds " I64MIN}}},
    /* export drew the rank's process as pid -1 */
    {"ranks.node INT64_MAX",
     "UPDATE ranks SET node=" I64MAX,
     0,
     NULL,
     2,
     "job 1: ranks.node holds " I64MAX,
     {{"/trace.json", 500, "ranks.node holds " I64MAX}}},
    /* /plan passed them on */
    {"plan.stage INT64_MAX",
     "UPDATE plan SET stage=" I64MAX ", microbatch=" I64MAX " WHERE rank=0 AND slot=0",
     0,
     NULL,
     0,
     NULL,
     {{"/plan", 500, "plan.stage holds " I64MAX}, {"/summary", 200, NULL}}},
    /* the timeline's end skipped it: /events' default window ended before
     * the run and hid its events */
    {"event_runs.end_ns INT64_MAX",
     "UPDATE event_runs SET end_ns=" I64MAX " WHERE rank=0 AND first_id=(SELECT min(first_id) FROM event_runs WHERE "
     "rank=0)",
     0,
     NULL,
     0,
     NULL,
     {{"", 500, "event_runs.end_ns holds " I64MAX},
      {"/events", 500, "event_runs.end_ns holds " I64MAX},
      {"/trace.json", 200, NULL}}},
};

static char dir[256];
static char out[1 << 16]; /* the last command's stderr, then its stdout */
static long out_stdout;   /* the bytes the last command wrote to stdout */

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/pprun-forged-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

TestSuite(forged_db, .init = setup, .fini = teardown, .timeout = 600);

/* `pprun ARGS` in dir, at most 60 s; its stderr then its stdout into out.
 * Returns the exit status (128 + signal when killed). */
static int pprun(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout -k 5 60 '%s' %s >o.txt 2>e.txt </dev/null", dir, PPRUN_BIN, args);
    int st = system(cmd);
    snprintf(cmd, sizeof cmd, "cat '%s/e.txt' '%s/o.txt'", dir, dir);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = '\0';
    if (p) pclose(p);
    snprintf(cmd, sizeof cmd, "%s/o.txt", dir);
    FILE *o = fopen(cmd, "r");
    out_stdout = o && fseek(o, 0, SEEK_END) == 0 ? ftell(o) : -1;
    if (o) fclose(o);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void exec_sql(const char *path, const char *sql) {
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql, msg ? msg : sqlite3_errstr(rc));
    sqlite3_close(db);
}

/* What a command that succeeded printed must not hold a forged extreme. */
static int shows_forged(const char *text) {
    return strstr(text, "922337203685477580") != NULL;
}

/* A command's exit status and message for one row. */
static void expect_command(const forged_row *r, const char *command, int want_rc, const char *want_text) {
    char args[512];
    snprintf(args, sizeof args, "%s --db f.db", command);
    int rc = pprun(args);
    cr_expect_eq(rc, want_rc, "%s: `pprun %s` exited %d, not %d:\n%.2000s", r->name, command, rc, want_rc, out);
    if (want_rc != 0) {
        cr_expect(strstr(out, want_text) != NULL, "%s: `pprun %s` does not say \"%s\":\n%.2000s", r->name, command,
                  want_text, out);
        cr_expect(strstr(out, "damaged or was not written by pprun") || strstr(out, "not 1..65536"),
                  "%s: `pprun %s` does not say why:\n%.2000s", r->name, command, out);
        /* a refusal prints nothing of what it refused: no half a JSON
         * object or report on stdout, where a user's `> trace.json` or
         * `> report.txt` keeps it */
        cr_expect_eq(out_stdout, 0, "%s: `pprun %s` failed and wrote %ld bytes to stdout:\n%.2000s",
                         r->name, command, out_stdout, out);
    } else {
        cr_expect(strlen(out) > 100, "%s: `pprun %s` printed nothing", r->name, command);
        cr_expect(!shows_forged(out), "%s: `pprun %s` printed the forged value:\n%.2000s", r->name, command, out);
    }
}

/* A failed `pprun export --out FILE` leaves FILE as it was and nothing
 * beside it (its temporary file removed). */
static void expect_export_out_kept(const forged_row *r) {
    if (system("rm -rf kept && mkdir kept && printf old > kept/t.json") != 0) cr_assert_fail("could not make kept/");
    int rc = pprun("export --db f.db --out kept/t.json");
    cr_expect_eq(rc, r->export_rc, "%s: `pprun export --out` exited %d, not %d:\n%.2000s", r->name, rc, r->export_rc,
                 out);
    FILE *p = popen("ls -A kept; cat kept/t.json", "r");
    char left[512] = "";
    size_t n = p ? fread(left, 1, sizeof left - 1, p) : 0;
    left[n] = '\0';
    if (p) pclose(p);
    cr_expect_str_eq(left, "t.json\nold", "%s: a failed `pprun export --out` left kept/ as:\n%s", r->name, left);
}

static void expect_routes(const forged_row *r) {
    int port;
    int pid = webclient_start_serve("f.db", NULL, &port);
    cr_assert_gt(pid, 0, "%s: pprun serve did not start", r->name);
    for (const route_want *w = r->routes; w < r->routes + 3 && w->path; w++) {
        char path[256];
        snprintf(path, sizeof path, "/api/jobs/1%s", w->path);
        webclient_resp a;
        memset(&a, 0, sizeof a);
        webclient_request(port, "GET", path, NULL, NULL, &a);
        const char *body = a.body ? a.body : "";
        cr_expect_eq(a.status, w->status, "%s: GET %s answered %d, not %d: %.1000s", r->name, path, a.status, w->status,
                     body);
        if (w->text)
            cr_expect(strstr(body, w->text) != NULL, "%s: GET %s does not say \"%s\": %.1000s", r->name, path, w->text,
                      body);
        else if (a.status == 200)
            cr_expect(!shows_forged(body), "%s: GET %s shows the forged value: %.1000s", r->name, path, body);
        webclient_free(&a);
        /* the server lives */
        webclient_resp j;
        memset(&j, 0, sizeof j);
        webclient_request(port, "GET", "/api/jobs", NULL, NULL, &j);
        cr_expect_eq(j.status, 200, "%s: after GET %s, GET /api/jobs answered %d: the server died", r->name, path,
                     j.status);
        webclient_free(&j);
    }
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: pprun serve did not stop cleanly: status %d", r->name, st);
}

Test(forged_db, every_forged_extreme_is_refused_by_name_or_ignored) {
    cr_assert_eq(chdir(dir), 0);
    int rc = pprun("run " TIMED " --db base.db");
    cr_assert_eq(rc, 0, "%s", out);
    exec_sql("base.db", "PRAGMA wal_checkpoint(TRUNCATE)");
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        const forged_row *r = &forged[i];
        if (system("rm -f f.db f.db-wal f.db-shm") != 0) cr_assert_fail("could not remove f.db");
        exec_sql("base.db", "VACUUM INTO 'f.db'");
        exec_sql("f.db", r->sql);
        expect_command(r, "stats", r->stats_rc, r->stats_text);
        expect_command(r, "export", r->export_rc, r->export_text);
        if (r->export_rc != 0) expect_export_out_kept(r);
        expect_routes(r);
        cr_log_info("%s: checked", r->name);
    }
}

/* `pprun run --schedule-costs DB:JOB` reads the job's world size and op
 * costs: a forged one is refused as the file holds it, before any rank
 * starts. */
Test(forged_db, schedule_costs_from_a_forged_job_are_refused_by_value) {
    cr_assert_eq(chdir(dir), 0);
    int rc = pprun("run " TIMED " --db base.db");
    cr_assert_eq(rc, 0, "%s", out);
    static const struct {
        const char *sql, *text;
    } rows[] = {
        {"UPDATE jobs SET world_size=" I64MAX, "job 1: jobs.world_size holds " I64MAX ", not 1..65536 (ranks in the job)"},
        {"UPDATE plan SET sim_start_ns=" I64MAX, "plan.sim_start_ns holds " I64MAX},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (system("rm -f f.db f.db-wal f.db-shm") != 0) cr_assert_fail("could not remove f.db");
        exec_sql("base.db", "VACUUM INTO 'f.db'");
        exec_sql("f.db", rows[i].sql);
        rc = pprun("run " TIMED " --schedule zb-v --schedule-costs f.db:1");
        cr_expect_eq(rc, 2, "%s: exited %d, not 2:\n%.2000s", rows[i].sql, rc, out);
        cr_expect(strstr(out, "--schedule-costs f.db") && strstr(out, rows[i].text),
                  "%s: does not name the flag, file and \"%s\":\n%.2000s", rows[i].sql, rows[i].text, out);
    }
}

/* GET path on port: its status, and its body into body (size bytes). */
static int get(int port, const char *path, char *body, size_t size) {
    webclient_resp a;
    memset(&a, 0, sizeof a);
    webclient_request(port, "GET", path, NULL, NULL, &a);
    snprintf(body, size, "%s", a.body ? a.body : "");
    int status = a.status;
    webclient_free(&a);
    return status;
}

/* Counts of records past their bound on every rank and in the collector's
 * counters (two ranks at INT64_MAX summed would overflow SQLite's sum(),
 * which stopped the whole query: /api/jobs and /metrics lost every job).
 * The job lists still answer, with the counts null (unknown) and no
 * forged number shown; /metrics leaves the unknown counts out. */
Test(forged_db, forged_counts_leave_the_job_lists_answering) {
    cr_assert_eq(chdir(dir), 0);
    int rc = pprun("run " TIMED " --db base.db");
    cr_assert_eq(rc, 0, "%s", out);
    exec_sql("base.db", "PRAGMA wal_checkpoint(TRUNCATE)");
    if (system("rm -f f.db f.db-wal f.db-shm") != 0) cr_assert_fail("could not remove f.db");
    exec_sql("base.db", "VACUUM INTO 'f.db'");
    exec_sql("f.db", "UPDATE ranks SET dropped_events=" I64MAX ", cupti_dropped=" I64MAX ";"
                     "UPDATE job_counters SET events_ingested=" I64MAX ", events_dropped=-1");
    int port, pid = webclient_start_serve("f.db", NULL, &port);
    cr_assert_gt(pid, 0, "pprun serve did not start");
    static char body[1 << 16];
    cr_expect_eq(get(port, "/api/jobs", body, sizeof body), 200, "%.1000s", body);
    cr_expect(strstr(body, "\"events_ingested\":null,\"events_dropped\":null,\"cupti_dropped\":null"), "%.1000s",
              body);
    cr_expect(!shows_forged(body), "%.1000s", body);
    cr_expect_eq(get(port, "/api/jobs/1", body, sizeof body), 200, "%.1000s", body);
    cr_expect(strstr(body, "\"dropped_events\":null,\"cupti_dropped\":null}"), "each rank's: %.2000s", body);
    cr_expect(!shows_forged(body), "%.2000s", body);
    cr_expect_eq(get(port, "/metrics", body, sizeof body), 200, "%.1000s", body);
    cr_expect(strstr(body, "pprun_job_info{job=\"1\"") && strstr(body, "pprun_steps_completed{job=\"1\"} 3"),
              "job 1 listed: %.3000s", body);
    cr_expect(!strstr(body, "pprun_events_dropped_total{job=") && !strstr(body, "pprun_events_ingested_total{job="),
              "unknown counts left out: %.3000s", body);
    cr_expect(!shows_forged(body), "%.3000s", body);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pprun serve did not stop cleanly: status %d", st);
}

/* Two jobs, job 1 forged. A clean job compared with it is refused naming
 * job 1's problem (SQLite's sum() answered both compares "database error:
 * integer overflow"); /metrics lists job 1 without the step metrics its
 * forged step times would make (a step of 292 years). */
Test(forged_db, a_forged_job_is_named_by_a_compare_and_left_out_of_metrics) {
    cr_assert_eq(chdir(dir), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(pprun("run " TIMED " --db base.db"), 0, "%s", out);
    exec_sql("base.db", "PRAGMA wal_checkpoint(TRUNCATE)");
    static const struct {
        const char *sql, *path, *text;
    } rows[] = {
        {"UPDATE jobs SET config_json=json_set(config_json,'$.dp',2,'$.pp',1) WHERE id=1;"
         "UPDATE plan SET stage=0 WHERE job_id=1;"
         "UPDATE step_idle SET cause='wait_dp', idle_ns=" T62
         " WHERE job_id=1 AND rank=0 AND step IN (1,2) AND cause='wait_gradient'",
         "/api/jobs/2/compare?vs=1", SUMMED_PAST("step_idle.idle_ns")},
        {"UPDATE step_stats SET end_ns=" I64MAX " WHERE job_id=1 AND step=2 AND rank=1" RETOTAL,
         "/api/jobs/2/compare?vs=1", "job 1: step_totals.end_ns holds " I64MAX},
        {THREE_SPANS("data"), "/api/jobs/2/compare?vs=1", SUMMED_PAST("events.end_ns - start_ns")},
    };
    static char body[1 << 16];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (system("rm -f f.db f.db-wal f.db-shm") != 0) cr_assert_fail("could not remove f.db");
        exec_sql("base.db", "VACUUM INTO 'f.db'");
        exec_sql("f.db", rows[i].sql);
        int port, pid = webclient_start_serve("f.db", NULL, &port);
        cr_assert_gt(pid, 0, "pprun serve did not start");
        cr_expect_eq(get(port, rows[i].path, body, sizeof body), 500, "%s: %.1000s", rows[i].sql, body);
        cr_expect(strstr(body, rows[i].text), "%s: GET %s does not say \"%s\": %.1000s", rows[i].sql, rows[i].path,
                  rows[i].text, body);
        cr_expect_eq(get(port, "/metrics", body, sizeof body), 200, "%.1000s", body);
        cr_expect(strstr(body, "pprun_job_info{job=\"1\"") && strstr(body, "pprun_step_time_seconds{job=\"2\"}"),
                  "%s: both jobs listed: %.3000s", rows[i].sql, body);
        cr_expect(!shows_forged(body) && !strstr(body, "e+09"), "%s: %.3000s", rows[i].sql, body);
        kill(pid, SIGTERM);
        int st;
        waitpid(pid, &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pprun serve did not stop cleanly: status %d", st);
    }
}
