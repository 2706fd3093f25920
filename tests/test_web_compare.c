/* test_web_compare.c: GET /api/jobs/{id}/compare?vs=M over real sockets.
 * On real `pprun run` jobs (a small gpt): each side's numbers are the
 * job's /summary, the changes the ratios `pprun stats --vs` prints, the
 * prediction is the other job's what-if row for the job's schedule, 1f1b
 * and zb-h1 lose bitwise the same and another seed does not, and a shape
 * no what-if plays gets `pprun stats`'s reason. On the synthetic fixture:
 * exact numbers, GPU op medians only where both jobs have them, and a job
 * without steps gives nulls. Every bad `vs` gets its status and message.
 * `pprun stats --format json` prints the same bodies the server gives. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/web_client.h"
#include "helpers/web_fixture.h"
#include "launch_testutil.h"
#include "web/http.h"

#define GPT "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"

static char dbpath[256];
static http_server *srv;
static int port;

static void serve(void) {
    pp_err err;
    http_options o = {.db_path = dbpath, .listen = "127.0.0.1:0", .conn_timeout_s = 2};
    cr_assert_eq(http_start(&o, &srv, &err), 0, "%s", err.msg);
    port = http_port(srv);
}

static void stop(void) {
    http_stop(srv);
    srv = NULL;
    fixture_remove(dbpath);
}

/* GET path, which must answer want_status with JSON; the caller frees. */
static cJSON *get_json(int want_status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cJSON *get_json(int want_status, const char *fmt, ...) {
    char path[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof path, fmt, ap);
    va_end(ap);
    return webclient_get_json(port, path, want_status);
}

static const cJSON *at(const cJSON *o, const char *path) { /* "a.b.c" */
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) {
        o = cJSON_GetObjectItemCaseSensitive(o, k);
        cr_assert(o, "no member %s", path);
    }
    return o;
}

static double num(const cJSON *o, const char *path) {
    const cJSON *v = at(o, path);
    cr_assert(cJSON_IsNumber(v), "%s is not a number", path);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *path) {
    const cJSON *v = at(o, path);
    cr_assert(cJSON_IsString(v), "%s is not a string", path);
    return v->valuestring;
}

static void is_null(const cJSON *o, const char *path) { cr_assert(cJSON_IsNull(at(o, path)), "%s is null", path); }

/* A side's numbers are what /summary says of that job. */
static void side_is_summary(const cJSON *side, long job) {
    cJSON *s = get_json(200, "/api/jobs/%ld/summary", job);
    cr_assert_eq(num(side, "id"), job);
    static const char *const same[] = {"from_step", "steps", "step_time_ns", "bubble_ratio", "sim_bubble_ratio",
                                       "act_peak_bytes", "mem_peak_bytes", "loss_step", "loss"};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++)
        cr_assert(cJSON_Compare(at(side, same[k]), at(s, same[k]), 1), "job %ld: %s as in /summary", job, same[k]);
    const cJSON *c;
    double steps = num(s, "steps"), total = 0;
    cJSON_ArrayForEach(c, at(s, "idle_ns_by_cause")) {
        char key[64];
        snprintf(key, sizeof key, "idle_ns_per_step_by_cause.%s", c->string);
        cr_assert_eq(num(side, key), c->valuedouble / steps, "job %ld: %s", job, key);
        total += c->valuedouble;
    }
    cr_assert_eq(num(side, "idle_ns_per_step"), total / steps);
    cJSON_Delete(s);
}

/* The line of `pprun stats --job job --vs vs` that starts with `label`. */
static void stats_line(const char *out, const char *label, char *line, size_t size) {
    const char *p = strstr(out, label);
    cr_assert_not_null(p, "no line %s in:\n%s", label, out);
    snprintf(line, size, "%.*s", (int)strcspn(p, "\n"), p);
}

static lt_proc stats(const char *job, const char *vs) {
    lt_proc p;
    lt_run(&p, (const char *[]){"stats", "--db", dbpath, "--job", job, "--vs", vs, NULL}, NULL);
    cr_assert_eq(p.status, 0, "pprun stats failed:\n%s", p.err);
    return p;
}

static void run_job(const char *mb, const char *schedule, const char *seed) {
    lt_proc p;
    lt_run(&p, (const char *[]){"run", "--nproc-per-node", "2", "--microbatches", mb, "--steps", "3", "--model", GPT,
                                "--db", dbpath, "--progress", "off", "--schedule", schedule, "--seed", seed, NULL},
           NULL);
    cr_assert_eq(p.status, 0, "pprun run failed:\n%s", p.err);
    lt_free(&p);
}

/* Jobs 1 (1f1b), 2 (zb-h1), 3 (1f1b, another seed), 4 (1f1b, 2 microbatches). */
Test(web_compare, real_jobs_give_the_numbers_pprun_stats_prints, .timeout = 120) {
    fixture_tmp_path(dbpath, sizeof dbpath, "web-compare");
    run_job("4", "1f1b", "1234");
    run_job("4", "zb-h1", "1234");
    run_job("4", "1f1b", "7");
    run_job("2", "1f1b", "1234");
    serve();
    char line[256], want[64];

    /* zb-h1 against 1f1b: nothing differs, job 1's zb-h1 row predicted it */
    cJSON *c = get_json(200, "/api/jobs/2/compare?vs=1");
    cr_assert_eq(num(c, "job"), 2);
    cr_assert_eq(num(c, "other"), 1);
    cr_assert_eq(cJSON_GetArraySize(at(c, "differs")), 0);
    cr_assert(cJSON_IsFalse(at(c, "op_sizes_differ")));
    side_is_summary(at(c, "numbers.job"), 2);
    side_is_summary(at(c, "numbers.other"), 1);
    cr_assert_str_eq(str(c, "numbers.job.schedule"), "zb-h1");
    double t2 = num(c, "numbers.job.step_time_ns"), t1 = num(c, "numbers.other.step_time_ns");
    cr_assert_eq(num(c, "numbers.change.step_time"), t2 / t1);
    lt_proc p = stats("2", "1");
    stats_line(p.out, "  step time (median)", line, sizeof line);
    snprintf(want, sizeof want, " %.2fx", t2 / t1);
    lt_assert_has(line, want);
    stats_line(p.out, "  bubble measured", line, sizeof line);
    snprintf(want, sizeof want, " %+.1f pp", num(c, "numbers.change.bubble_ratio_pp"));
    lt_assert_has(line, want);
    cr_assert_float_eq(num(c, "numbers.change.bubble_ratio_pp"),
                       100 * (num(c, "numbers.job.bubble_ratio") - num(c, "numbers.other.bubble_ratio")), 1e-12);
    stats_line(p.out, "    F  ", line, sizeof line);
    snprintf(want, sizeof want, " %.2fx", num(c, "numbers.change.op_median_ns.host.F"));
    lt_assert_has(line, want);
    cr_assert_eq(num(c, "numbers.change.op_median_ns.host.F"),
                 num(c, "numbers.job.op_median_ns.host.F") / num(c, "numbers.other.op_median_ns.host.F"));
    cr_assert_null(cJSON_GetObjectItem(at(c, "numbers.job.op_median_ns"), "gpu"), "a CPU job has no GPU spans");
    /* one model, one layout: the same weights, so the memory with them
     * changes as the activations do, and the terminal says so too */
    cr_assert_gt(num(c, "numbers.job.mem_peak_bytes"), num(c, "numbers.job.act_peak_bytes"));
    cr_assert_eq(num(c, "numbers.change.mem_peak_bytes"),
                 num(c, "numbers.job.mem_peak_bytes") / num(c, "numbers.other.mem_peak_bytes"));
    stats_line(p.out, "    with weights and optimizer", line, sizeof line);
    snprintf(want, sizeof want, " %.2fx", num(c, "numbers.change.mem_peak_bytes"));
    lt_assert_has(line, want);
    /* each job's critical path per step is /critpath's totals over its
     * steps, and the terminal's row says the same change */
    cJSON *cp = get_json(200, "/api/jobs/2/critpath");
    double steps = num(cp, "steps");
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.steps"), steps);
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.span_ns"), num(cp, "span_ns") / steps);
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.handoff_ns"), num(cp, "handoff_ns") / steps);
    for (int k = 0; k < 2; k++) {
        const cJSON *r = cJSON_GetArrayItem(at(cp, "ranks"), k);
        double ops = num(r, "F") + num(r, "B") + num(r, "W") + num(r, "OPT");
        cr_assert_eq(cJSON_GetArrayItem(at(c, "numbers.job.critical_path_per_step.rank_ops_ns"), k)->valuedouble,
                     ops / steps, "rank %d", k);
    }
    cJSON_Delete(cp);
    /* job / other; null where the other job's rank 1 had no time on its
     * path (real jobs: a rank may never hold the path up) */
    const cJSON *r1 = cJSON_GetArrayItem(at(c, "numbers.change.critical_path_per_step.rank_ops_ns"), 1);
    double mine = cJSON_GetArrayItem(at(c, "numbers.job.critical_path_per_step.rank_ops_ns"), 1)->valuedouble,
           theirs = cJSON_GetArrayItem(at(c, "numbers.other.critical_path_per_step.rank_ops_ns"), 1)->valuedouble;
    if (theirs > 0) {
        cr_assert_eq(r1->valuedouble, mine / theirs);
        stats_line(p.out, "    rank 1's ops", line, sizeof line);
        snprintf(want, sizeof want, " %.2fx", r1->valuedouble);
        lt_assert_has(line, want);
    } else {
        cr_assert(cJSON_IsNull(r1), "rank 1 off the other job's path: no ratio");
    }

    cJSON *w = get_json(200, "/api/jobs/1/whatif"), *row;
    double zbh1 = -1;
    cJSON_ArrayForEach(row, at(w, "schedules")) if (!strcmp(str(row, "schedule"), "zb-h1")) zbh1 = num(row, "step_time_ns");
    cJSON_Delete(w);
    cr_assert_gt(zbh1, 0, "job 1's what-if has a zb-h1 row");
    cr_assert_eq(num(c, "prediction.by"), 1);
    cr_assert_str_eq(str(c, "prediction.schedule"), "zb-h1");
    cr_assert(cJSON_IsFalse(at(c, "prediction.tuned")));
    cr_assert_eq(num(c, "prediction.predicted_step_time_ns"), zbh1);
    cr_assert_str_eq(str(c, "prediction.own_schedule"), "1f1b");
    cr_assert_eq(num(c, "prediction.measured_step_time_ns"), t2);
    cr_assert_eq(num(c, "prediction.measured_over_predicted"), t2 / zbh1);
    cr_assert_eq(num(c, "prediction.measured_over_other"), t2 / t1);
    stats_line(p.out, "what if    job 1 predicted zb-h1 at ", line, sizeof line);
    snprintf(want, sizeof want, ", %.2fx of its own 1f1b", num(c, "prediction.predicted_over_own"));
    lt_assert_has(line, want);
    lt_free(&p);
    /* same seed, same device: every microbatch's loss bit for bit */
    cr_assert_eq(num(c, "loss_check.step"), 2);
    cr_assert(cJSON_IsTrue(at(c, "loss_check.bitwise")));
    cr_assert_eq(num(c, "loss_check.differing"), 0);
    cr_assert_eq(num(c, "loss_check.job"), num(c, "loss_check.other"));
    cr_assert_eq(num(c, "numbers.change.loss"), 0);
    cJSON_Delete(c);

    /* another seed: named, and its losses differ */
    c = get_json(200, "/api/jobs/3/compare?vs=1");
    cr_assert_eq(cJSON_GetArraySize(at(c, "differs")), 1);
    const cJSON *d = cJSON_GetArrayItem(at(c, "differs"), 0);
    cr_assert_str_eq(str(d, "what"), "seed");
    cr_assert_str_eq(str(d, "job"), "7");
    cr_assert_str_eq(str(d, "other"), "1234");
    cr_assert_str_eq(str(c, "prediction.schedule"), "1f1b", "job 1's own row played job 3's schedule");
    sqlite3 *sql;
    cr_assert_eq(sqlite3_open_v2(dbpath, &sql, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(sql,
                                    "SELECT count(*) FROM losses a JOIN losses b ON a.step=b.step AND "
                                    "a.microbatch=b.microbatch WHERE a.job_id=1 AND b.job_id=3 AND a.step=2 AND "
                                    "a.loss=b.loss",
                                    -1, &st, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    int equal = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(sql);
    cr_assert(cJSON_IsFalse(at(c, "loss_check.bitwise")));
    cr_assert_eq(num(c, "loss_check.differing"), 4 - equal);
    cr_assert_gt(num(c, "loss_check.differing"), 0);
    p = stats("3", "1");
    snprintf(want, sizeof want, "           %d of 4 microbatches differ\n", 4 - equal);
    lt_assert_has(p.out, want);
    lt_free(&p);
    cJSON_Delete(c);

    /* another shape: no prediction, for `pprun stats`'s reason */
    c = get_json(200, "/api/jobs/4/compare?vs=1");
    cr_assert_null(cJSON_GetObjectItem(at(c, "prediction"), "schedule"));
    p = stats("4", "1");
    stats_line(p.out, "what if    no prediction: ", line, sizeof line);
    cr_assert_str_eq(line + strlen("what if    no prediction: "), str(c, "prediction.why_not"));
    lt_free(&p);
    cr_assert_eq(num(c, "loss_check.microbatches_job"), 2);
    cr_assert_eq(num(c, "loss_check.microbatches_other"), 4);
    cr_assert(cJSON_IsFalse(at(c, "loss_check.bitwise")));
    cJSON_Delete(c);
    stop();
}

/* The fixture: job 2 is job 1's trace with GPU spans, said to be another
 * model on cuda; job 3 a copy of job 1's row without any step. */
Test(web_compare, fixture_numbers_exactly_and_nulls_without_steps, .timeout = 60) {
    pp_err err;
    fixture_fresh(dbpath, sizeof dbpath, "web-compare-fixture", 3, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(dbpath, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_add_starting_copy(dbpath, &err), 0, "%s", err.msg);
    serve();

    cJSON *c = get_json(200, "/api/jobs/2/compare?vs=1");
    const cJSON *d = at(c, "differs");
    cr_assert_eq(cJSON_GetArraySize(d), 2);
    cr_assert_str_eq(str(cJSON_GetArrayItem(d, 0), "what"), "model");
    cr_assert_str_eq(str(cJSON_GetArrayItem(d, 0), "other"), "timed:f=1ms,b=1ms,w=1ms,act=64KiB");
    cr_assert_str_eq(str(cJSON_GetArrayItem(d, 1), "what"), "device");
    cr_assert_str_eq(str(cJSON_GetArrayItem(d, 1), "job"), "cuda");
    cr_assert_eq(num(c, "numbers.job.step_time_ns"), FIXTURE_STEP_SPAN_NS);
    cr_assert_eq(num(c, "numbers.change.step_time"), 1);
    cr_assert_eq(num(c, "numbers.change.bubble_ratio_pp"), 0);
    /* 24 ms of idle over 2 steps on 4 ranks waiting for gradients: 12 ms a step */
    cr_assert_eq(num(c, "numbers.other.idle_ns_per_step"), 24 * FIXTURE_MS);
    cr_assert_eq(num(c, "numbers.other.idle_ns_per_step_by_cause.wait_gradient"), 12 * FIXTURE_MS);
    cr_assert_eq(num(c, "numbers.change.idle_ns_per_step_by_cause.wait_gradient"), 1);
    cr_assert_null(cJSON_GetObjectItem(at(c, "numbers.change.idle_ns_per_step_by_cause"), "comm"), "a cause neither job has");
    cr_assert_eq(num(c, "numbers.other.op_median_ns.host.F"), FIXTURE_MS);
    cr_assert_eq(num(c, "numbers.job.op_median_ns.gpu.F"), 900000, "F's gpu span: 1 ms less 2 x 50 us");
    cr_assert_null(cJSON_GetObjectItem(at(c, "numbers.change.op_median_ns"), "gpu"), "job 1 has no GPU spans");
    cr_assert_eq(num(c, "numbers.job.act_peak_bytes"), 0, "the fixture records no held bytes (0, as in /summary)");
    is_null(c, "numbers.change.act_peak_bytes");
    is_null(c, "numbers.job.mem_peak_bytes"); /* nor weights and optimizer state */
    is_null(c, "numbers.change.mem_peak_bytes");
    cr_assert_str_eq(str(c, "prediction.why_not"), "job 1's what-if plays its own shape only; job 2 has another model");
    /* the path of steps 1 and 2 (the same host spans in both jobs): rank
     * 3's 8 F, 8 B and 7 W; the outputs cross over at once */
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.first_step"), 1);
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.steps"), 2);
    cr_assert_eq(num(c, "numbers.job.critical_path_per_step.span_ns"), FIXTURE_STEP_SPAN_NS);
    cr_assert_eq(cJSON_GetArrayItem(at(c, "numbers.other.critical_path_per_step.rank_ops_ns"), 3)->valuedouble,
                 23 * FIXTURE_MS);
    cr_assert_eq(num(c, "numbers.other.critical_path_per_step.handoff_ns"), 0);
    cr_assert_eq(num(c, "numbers.change.critical_path_per_step.span_ns"), 1);
    cr_assert_eq(cJSON_GetArraySize(at(c, "numbers.change.critical_path_per_step.rank_ops_ns")), FIXTURE_RANKS);
    cr_assert_eq(cJSON_GetArrayItem(at(c, "numbers.change.critical_path_per_step.rank_ops_ns"), 3)->valuedouble, 1);
    /* the path runs through all four ranks (the fill and the drain), few
     * enough for a row each */
    const cJSON *on = at(c, "numbers.change.critical_path_per_step.ranks_on_path");
    const cJSON *listed = at(c, "numbers.change.critical_path_per_step.listed_ranks");
    cr_assert(cJSON_GetArraySize(on) == FIXTURE_RANKS && cJSON_GetArraySize(listed) == FIXTURE_RANKS);
    for (int k = 0; k < FIXTURE_RANKS; k++)
        cr_assert(cJSON_GetArrayItem(on, k)->valueint == k && cJSON_GetArrayItem(listed, k)->valueint == k, "%d", k);
    is_null(c, "numbers.change.critical_path_per_step.handoff_ns"); /* 0 against 0: no ratio */
    double loss = 0;
    for (int m = 0; m < FIXTURE_MB; m++) loss += fixture_loss(2, m);
    cr_assert_float_eq(num(c, "loss_check.job"), loss / FIXTURE_MB, 1e-12);
    cr_assert(cJSON_IsTrue(at(c, "loss_check.bitwise")));
    cJSON_Delete(c);

    /* job 3 has no step: nulls, never NaN; job 1's own row predicts it */
    c = get_json(200, "/api/jobs/3/compare?vs=1");
    cr_assert_eq(num(c, "numbers.job.steps"), 0);
    static const char *const nulls[] = {"numbers.job.step_time_ns", "numbers.job.bubble_ratio",
                                        "numbers.job.idle_ns_per_step", "numbers.job.loss_step", "numbers.job.loss",
                                        "numbers.change.step_time", "numbers.change.bubble_ratio_pp", "numbers.change.idle_ns_per_step",
                                        "numbers.change.loss", "numbers.job.critical_path_per_step",
                                        "numbers.change.critical_path_per_step.span_ns",
                                        "prediction.measured_step_time_ns",
                                        "prediction.measured_over_predicted", "loss_check"};
    for (size_t k = 0; k < sizeof nulls / sizeof *nulls; k++) is_null(c, nulls[k]);
    cr_assert_str_eq(str(c, "prediction.schedule"), "1f1b");
    cJSON_Delete(c);
    c = get_json(200, "/api/jobs/1/compare?vs=3");
    cr_assert_str_eq(str(c, "prediction.why_not"),
                     "job 3 has no complete step with F, B and W spans to simulate from");
    cJSON_Delete(c);
    stop();
}

/* Each refusal of `pprun stats --vs`, as a status and a message. */
Test(web_compare, a_bad_vs_gets_its_status_and_says_why, .timeout = 60) {
    fixture_fresh(dbpath, sizeof dbpath, "web-compare-bad", 2, "succeeded");
    serve();
    static const struct {
        const char *path;
        int status;
        const char *message;
    } bad[] = {
        {"/api/jobs/1/compare", 400, "missing query parameter vs: the job to compare job 1 with (compare?vs=ID)"},
        {"/api/jobs/1/compare?vs=", 400, "missing query parameter vs"},
        {"/api/jobs/1/compare?vs=abc", 400, "bad query parameter: vs: expected an integer in [1, 2147483647], got 'abc'"},
        {"/api/jobs/1/compare?vs=2x", 400, "bad query parameter: vs: expected an integer in [1, 2147483647], got '2x'"},
        {"/api/jobs/1/compare?vs=0", 400, "bad query parameter: vs: 0 is out of range; accepted: 1 to 2147483647"},
        {"/api/jobs/1/compare?vs=-1", 400, "bad query parameter: vs: -1 is out of range"},
        {"/api/jobs/1/compare?vs=9", 404, "vs=9: no job 9 in this database"},
        {"/api/jobs/1/compare?vs=1", 400, "vs=1 is job 1 itself: nothing to compare"},
        {"/api/jobs/9/compare?vs=1", 404, "no job 9 in this database"},
        {"/api/jobs/1/compare/x?vs=1", 404, "no such API route: /api/jobs/1/compare/x"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        cJSON *j = get_json(bad[k].status, "%s", bad[k].path);
        cr_assert(strstr(str(j, "error"), bad[k].message), "%s: %s", bad[k].path, str(j, "error"));
        cJSON_Delete(j);
    }
    webclient_resp r;
    cr_assert_eq(webclient_request(port, "POST", "/api/jobs/1/compare?vs=1", NULL, "", &r), 0);
    cr_assert_eq(r.status, 405, "%s", r.body);
    webclient_free(&r);
    stop();
}

/* `pprun stats ... --format json` (args end with NULL), which must exit
 * with want; its stdout parsed when it is 0 (the caller frees). */
static cJSON *stats_json(lt_proc *p, int want, const char *const *args) {
    const char *argv[16] = {"stats", "--db", dbpath, "--format", "json"};
    size_t n = 5;
    for (; *args && n < 15; args++) argv[n++] = *args;
    argv[n] = NULL;
    lt_run(p, argv, NULL);
    cr_assert_eq(p->status, want, "pprun stats exited %d:\n%s", p->status, p->err);
    if (want != 0) return NULL;
    cJSON *j = cJSON_Parse(p->out);
    cr_assert_not_null(j, "not JSON:\n%s", p->out);
    return j;
}

/* The member `key` of j is what GET path answers, member for member. */
static void same_as_api(const cJSON *j, const char *key, const char *path) {
    cJSON *api = get_json(200, "%s", path);
    const cJSON *got = key ? at(j, key) : j;
    char *text = cJSON_PrintUnformatted(got);
    cr_assert(cJSON_Compare(got, api, 1), "%s differs from GET %s:\n%.2000s", key ? key : "the output", path, text);
    free(text);
    cJSON_Delete(api);
}

/* For scripts: the job's /summary, /whatif and /critpath in one object,
 * or /compare's body with --vs, exactly as the server gives them; the
 * newest job by default; bad input exits 2, names it and prints nothing. */
Test(web_compare, stats_format_json_prints_the_apis_bodies, .timeout = 60) {
    pp_err err;
    fixture_fresh(dbpath, sizeof dbpath, "web-compare-json", 3, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(dbpath, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_add_starting_copy(dbpath, &err), 0, "%s", err.msg);
    serve();
    lt_proc p;
    cJSON *j = stats_json(&p, 0, (const char *[]){"--job", "2", NULL});
    lt_free(&p);
    cr_assert_eq(num(j, "job"), 2);
    /* its summary's spans (docs/api.md) are a reading of every event that
     * /summary does not make: the rest is the API's */
    cr_assert(cJSON_IsArray(at(j, "summary.spans")), "stats' summary has spans");
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "summary"), "spans");
    same_as_api(j, "summary", "/api/jobs/2/summary");
    same_as_api(j, "whatif", "/api/jobs/2/whatif");
    same_as_api(j, "critpath", "/api/jobs/2/critpath");
    cr_assert_eq(num(j, "critpath.steps"), 2, "the fixture's two complete steps");
    cJSON_Delete(j);

    j = stats_json(&p, 0, (const char *[]){"--job", "2", "--vs", "1", NULL});
    lt_free(&p);
    same_as_api(j, NULL, "/api/jobs/2/compare?vs=1");
    cJSON_Delete(j);

    j = stats_json(&p, 0, (const char *[]){NULL}); /* the newest: job 3, not started */
    lt_free(&p);
    cr_assert_eq(num(j, "job"), 3);
    cr_assert_eq(num(j, "critpath.steps"), 0);
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "summary"), "spans");
    same_as_api(j, "summary", "/api/jobs/3/summary");
    cJSON_Delete(j);

    static const struct {
        const char *args[5];
        const char *message;
    } bad[] = {
        {{"--job", "9", NULL}, "no job 9 in this database"},
        {{"--job", "1", "--vs", "9", NULL}, "no job 9 in this database"},
        {{"--job", "1", "--vs", "1", NULL}, "--vs 1 is --job 1 itself: nothing to compare"},
        {{"--format", "xml", NULL}, "--format 'xml': expected one of text, json"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        stats_json(&p, 2, bad[k].args);
        cr_assert(strstr(p.err, bad[k].message), "case %zu: %s", k, p.err);
        cr_assert_str_eq(p.out, "", "case %zu prints nothing on stdout", k);
        lt_free(&p);
    }
    stop();
}
