/* test_trace_clock.c: NTP-style clock offset against a remote clock with a
 * known skew and a jittery, asymmetric network; and pp_now_ns, the TSC read
 * as CLOCK_MONOTONIC (base/pp.c), against clock_gettime itself: within
 * PP_CLOCK_BOUND_NS through re-anchors, in several threads, on every core, in
 * a forked child, and CLOCK_MONOTONIC itself when forced; PPRUN_CLOCK's
 * values, and `pprun run` / `pprun launch` refusing one the clock does not
 * know before anything starts. Each Test runs in a process of its own, so
 * each calibrates from the start. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "launch_testutil.h"
#include "tracer/clock.h"

typedef struct fake_master {
    int64_t skew_ns;  /* master clock - this host's clock */
    unsigned seed;
    int calls, fail_at;
} fake_master;

/* Delays of up to 400 µs each way, drawn independently (asymmetric). */
static int remote_now(void *ctx, uint64_t *remote, pp_err *err) {
    fake_master *m = ctx;
    if (++m->calls == m->fail_at) return pp_fail(err, "store 127.0.0.1:29500: connection reset");
    pp_sleep_ns((uint64_t)(rand_r(&m->seed) % 400000));
    *remote = pp_now_ns() + (uint64_t)m->skew_ns;
    pp_sleep_ns((uint64_t)(rand_r(&m->seed) % 400000));
    return 0;
}

Test(trace_clock, finds_a_known_skew_within_half_the_best_round_trip) {
    int64_t skews[] = {0, 5000000000ll, -123456789ll};
    for (int k = 0; k < 3; k++) {
        fake_master m = {.skew_ns = skews[k], .seed = 42u + (unsigned)k};
        int64_t off;
        uint64_t rtt;
        pp_err err;
        cr_assert_eq(trace_clock_offset(remote_now, &m, 16, &off, &rtt, &err), 0, "%s", err.msg);
        cr_assert_eq(m.calls, 16);
        int64_t error = off - skews[k];
        cr_assert_leq(llabs(error), (long long)rtt / 2 + 20000, "offset %lld for skew %lld (rtt %llu)",
                      (long long)off, (long long)skews[k], (unsigned long long)rtt);
        cr_assert_gt(rtt, 0);
    }
}

Test(trace_clock, local_test_skew_is_measured) {
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "3000000000", 1);
    fake_master m = {.skew_ns = 0, .seed = 7};
    int64_t off;
    uint64_t rtt;
    pp_err err;
    int rc = trace_clock_offset(remote_now, &m, 8, &off, &rtt, &err);
    uint64_t local = trace_clock_now_ns(), real = pp_now_ns();
    unsetenv("PPRUN_TEST_CLOCK_SKEW_NS");
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_leq(llabs(off + 3000000000ll), (long long)rtt / 2 + 20000, "offset %lld", (long long)off);
    cr_assert_geq(local - real, 2900000000ull, "the trace clock carries the skew");
}

Test(trace_clock, errors_name_the_round_and_the_bad_variable) {
    fake_master m = {.seed = 1, .fail_at = 3};
    int64_t off;
    uint64_t rtt;
    pp_err err;
    cr_assert_eq(trace_clock_offset(remote_now, &m, 5, &off, &rtt, &err), -1);
    cr_assert(strstr(err.msg, "round 3 of 5") && strstr(err.msg, "connection reset"), "%s", err.msg);
    cr_assert_eq(trace_clock_offset(remote_now, &m, 0, &off, &rtt, &err), -1);
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "12ms", 1);
    m.calls = 0;
    int rc = trace_clock_offset(remote_now, &m, 2, &off, &rtt, &err);
    unsetenv("PPRUN_TEST_CLOCK_SKEW_NS");
    cr_assert_eq(rc, -1);
    cr_assert(strstr(err.msg, "PPRUN_TEST_CLOCK_SKEW_NS"), "%s", err.msg);
}

/* A master whose clock answer is garbage (UINT64_MAX, past any time a
 * record may carry) gives no offset: the node's launcher fails naming the
 * value, rather than forwarding records shifted by it. */
static int broken_now(void *ctx, uint64_t *remote, pp_err *err) {
    (void)ctx, (void)err;
    *remote = UINT64_MAX;
    return 0;
}

Test(trace_clock, a_clock_answer_past_the_time_bound_gives_no_offset) {
    int64_t off = 7;
    uint64_t rtt;
    pp_err err;
    cr_assert_eq(trace_clock_offset(broken_now, NULL, 3, &off, &rtt, &err), -1, "offset %lld", (long long)off);
    cr_assert(strstr(err.msg, "18446744073709551615 ns") && strstr(err.msg, "4611686018427387903"), "%s", err.msg);
}

/* ---- pp_now_ns against clock_gettime ------------------------------------ */

/* Skips the test where this machine's TSC is not used (and says why). */
static void need_tsc(void) {
    pp_clock c;
    pp_now_ns();
    pp_clock_get(&c);
    if (strcmp(c.source, "monotonic") == 0) cr_skip_test("pp_now_ns reads CLOCK_MONOTONIC here: %s", c.why);
    uint64_t until = pp_mono_ns() + 1000000000ull;
    while (strcmp(c.source, "calibrating") == 0 && pp_mono_ns() < until) {
        pp_now_ns();
        pp_clock_get(&c);
    }
    cr_assert_str_eq(c.source, "tsc", "still %s after a second", c.source);
}

typedef struct bracket_run {
    uint64_t for_ns;
    long reads, outside, backwards;
    int64_t worst_early, worst_late; /* how far before `before` / after `after` a reading was */
} bracket_run;

/* Reads pp_now_ns between two clock_gettime calls for for_ns, and on
 * until it has read more than 1,000 times (a thread pinned to a busy core
 * got 299 reads in 5 ms under the sanitizers): every reading must lie in
 * [before - bound, after + bound] and never go back. Preemption between
 * the three reads only widens the bracket, so this cannot fail on a busy
 * machine unless the line is off. */
static void *bracket(void *arg) {
    bracket_run *r = arg;
    uint64_t last = 0, end = pp_mono_ns() + r->for_ns;
    for (;;) {
        uint64_t before = pp_mono_ns(), v = pp_now_ns(), after = pp_mono_ns();
        r->reads++;
        if (v < last) r->backwards++;
        last = v;
        int64_t early = (int64_t)(before - v), late = (int64_t)(v - after);
        if (early > r->worst_early) r->worst_early = early;
        if (late > r->worst_late) r->worst_late = late;
        if (early > PP_CLOCK_BOUND_NS || late > PP_CLOCK_BOUND_NS) r->outside++;
        if (after >= end && r->reads > 1000) return NULL;
    }
}

static void expect_in_bounds(const bracket_run *r, const char *what) {
    cr_assert_gt(r->reads, 1000, "%s: %ld reads", what, r->reads);
    cr_assert_eq(r->outside, 0, "%s: %ld of %ld readings more than %d ns outside clock_gettime's (worst %lld ns "
                 "before, %lld ns after)", what, r->outside, r->reads, PP_CLOCK_BOUND_NS, (long long)r->worst_early,
                 (long long)r->worst_late);
    cr_assert_eq(r->backwards, 0, "%s: the clock went back %ld times", what, r->backwards);
}

Test(pp_clock, the_first_readings_are_clock_monotonic_itself) {
    /* The first 10 ms of a process calibrate: pp_now_ns is clock_gettime. */
    uint64_t before = pp_mono_ns(), v = pp_now_ns(), after = pp_mono_ns();
    pp_clock c;
    pp_clock_get(&c);
    if (strcmp(c.source, "calibrating") != 0) cr_skip_test("pp_now_ns reads CLOCK_MONOTONIC here: %s", c.why);
    cr_assert(before <= v && v <= after, "%llu not in [%llu, %llu]", (unsigned long long)v,
              (unsigned long long)before, (unsigned long long)after);
}

Test(pp_clock, tsc_readings_stay_within_the_bound_through_re_anchors_in_every_thread, .timeout = 30) {
    need_tsc();
    /* 1.5 s: the re-anchors at 10, 20, 40, 80, 160 ms of baseline, then
     * every 200 ms, done by whichever thread comes first. */
    enum { THREADS = 3 };
    bracket_run runs[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        runs[i] = (bracket_run){.for_ns = 1500000000ull};
        cr_assert_eq(pthread_create(&t[i], NULL, bracket, &runs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) expect_in_bounds(&runs[i], "thread");
    pp_clock c;
    pp_clock_get(&c);
    cr_assert_str_eq(c.source, "tsc");
    cr_assert_geq(c.anchors, 6, "%llu re-anchors in 1.5 s", (unsigned long long)c.anchors);
    cr_assert_leq(c.max_err_ns, PP_CLOCK_BOUND_NS, "%llu ns off at a re-anchor", (unsigned long long)c.max_err_ns);
    cr_assert(c.tsc_ghz > 0.1 && c.tsc_ghz < 20, "a TSC of %.3f GHz", c.tsc_ghz);
}

Test(pp_clock, a_thread_moved_between_cores_reads_the_same_line, .timeout = 30) {
    need_tsc();
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    int cores = 0;
    uint64_t last = 0;
    for (int round = 0; round < 20; round++)
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (!CPU_ISSET(cpu, &mine)) continue;
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
            cores += round == 0;
            bracket_run r = {.for_ns = 5000000};
            bracket(&r);
            char what[32];
            snprintf(what, sizeof what, "cpu %d", cpu);
            expect_in_bounds(&r, what);
            uint64_t now = pp_now_ns();
            cr_assert_geq(now, last, "back by %llu ns after moving to cpu %d", (unsigned long long)(last - now), cpu);
            last = now;
        }
    sched_setaffinity(0, sizeof mine, &mine);
    if (cores < 2) cr_skip_test("one core only: nothing to move between");
}

Test(pp_clock, a_forked_child_keeps_the_line_and_re_anchors_it, .timeout = 30) {
    need_tsc();
    pid_t child = fork();
    if (child == 0) { /* past two re-anchors of its own */
        bracket_run r = {.for_ns = 500000000ull};
        bracket(&r);
        pp_clock c;
        pp_clock_get(&c);
        _exit(r.outside || r.backwards || r.reads < 1000 || strcmp(c.source, "tsc") != 0 ? 1 : 0);
    }
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's readings strayed (status %d)", st);
}

Test(pp_clock, PPRUN_CLOCK_monotonic_forces_clock_gettime) {
    setenv("PPRUN_CLOCK", "monotonic", 1); /* before this process's first reading */
    for (int i = 0; i < 100000; i++) {
        uint64_t before = pp_mono_ns(), v = pp_now_ns(), after = pp_mono_ns();
        cr_assert(before <= v && v <= after, "%llu not in [%llu, %llu]", (unsigned long long)v,
                  (unsigned long long)before, (unsigned long long)after);
    }
    pp_clock c;
    pp_clock_get(&c);
    cr_assert_str_eq(c.source, "monotonic");
    cr_assert_str_eq(c.why, "PPRUN_CLOCK=monotonic");
    cr_assert_eq(c.anchors, 0);
}

/* --- PPRUN_CLOCK as pprun checks it -------------------------------------------- */

Test(pp_clock, PPRUN_CLOCK_accepts_unset_empty_and_monotonic_only) {
    pp_err err;
    cr_assert_eq(pp_clock_env_check(NULL, &err), 0);
    cr_assert_eq(pp_clock_env_check("", &err), 0);
    cr_assert_eq(pp_clock_env_check("monotonic", &err), 0);
    const char *bad[] = {"bogus", "Monotonic", "monotonic ", "tsc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pp_clock_env_check(bad[i], &err), -1, "'%s' accepted", bad[i]);
        lt_assert_has(err.msg, "PPRUN_CLOCK='");
        lt_assert_has(err.msg, bad[i]);
        lt_assert_has(err.msg, "accepted: monotonic");
    }
    /* A long value is cut, so the message stays one short line. */
    char longv[300];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    cr_assert_eq(pp_clock_env_check(longv, &err), -1);
    lt_assert_has(err.msg, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' is not a clock");
}

/* `pprun run` and `pprun launch` with PPRUN_CLOCK=value: exit 2 (bad usage),
 * one line on standard error (returned, the caller frees it), nothing on
 * standard output, no database and no rank started. */
static char *refused_clock(const char *value) {
    const char *dir = tfix_mkdir("clock-env"); /* removed when the test process exits */
    char db[300], ran[300], env[512], script[400];
    snprintf(db, sizeof db, "%s/pprun.db", dir);
    snprintf(ran, sizeof ran, "%s/ran", dir);
    snprintf(env, sizeof env, "PPRUN_CLOCK=%s", value);
    snprintf(script, sizeof script, "touch %s", ran);
    const char *envs[] = {env, NULL};
    char *said = NULL;
    const char *run[] = {"run", "--nproc-per-node", "1", "--db", db, "--", "sh", "-c", script, NULL};
    const char *launch[] = {"launch", "--nproc-per-node", "1", "--", "sh", "-c", script, NULL};
    for (int k = 0; k < 2; k++) {
        lt_proc p;
        lt_run(&p, k ? launch : run, envs);
        const char *cmd = k ? "pprun launch: " : "pprun run: ";
        cr_assert_eq(p.status, 2, "%s with PPRUN_CLOCK=%s: exit %d\n%s", cmd, value, p.status, p.err);
        cr_assert_eq(strncmp(p.err, cmd, strlen(cmd)), 0, "%s", p.err);
        lt_assert_has(p.err, "PPRUN_CLOCK='");
        lt_assert_has(p.err, "is not a clock; accepted: monotonic");
        lt_assert_has(p.err, "or unset");
        cr_assert_eq(lt_count(p.err, "\n"), 1, "one line:\n%s", p.err);
        cr_assert_eq(p.out_len, 0, "%s", p.out);
        struct stat st;
        cr_assert_neq(stat(db, &st), 0, "%s made %s", cmd, db);
        cr_assert_neq(stat(ran, &st), 0, "%s started a rank", cmd);
        if (!said)
            said = strdup(p.err + strlen(cmd));
        else
            cr_assert_str_eq(p.err + strlen(cmd), said, "run and launch say it differently");
        lt_free(&p);
    }
    return said;
}

Test(pp_clock, pprun_refuses_an_unknown_PPRUN_CLOCK_before_anything_starts, .timeout = 60) {
    char *said = refused_clock("bogus");
    lt_assert_has(said, "PPRUN_CLOCK='bogus' is not a clock");
    free(said);
}

/* The value is the environment's, not pprun's: bytes that would drive the
 * terminal come out escaped. */
Test(pp_clock, an_unknown_PPRUN_CLOCK_is_quoted_with_its_terminal_bytes_escaped, .timeout = 60) {
    char *said = refused_clock("bo\x1b]0;owned\x07\x1b[2Jgus");
    lt_assert_has(said, "PPRUN_CLOCK='bo\\x1b]0;owned\\x07\\x1b[2Jgus'");
    cr_assert_null(strchr(said, 0x1b), "a raw ESC reached the terminal: %s", said);
    cr_assert_null(strchr(said, 0x07), "a raw BEL reached the terminal: %s", said);
    free(said);
}

/* PPRUN_CLOCK=monotonic is accepted: the job runs and is traced, and the
 * ranks get the variable. */
Test(pp_clock, pprun_runs_a_job_with_PPRUN_CLOCK_monotonic, .timeout = 120) {
    const char *dir = tfix_mkdir("clock-mono"); /* removed when the test process exits */
    char db[300];
    snprintf(db, sizeof db, "%s/pprun.db", dir);
    const char *envs[] = {"PPRUN_CLOCK=monotonic", NULL};
    lt_proc p;
    lt_run(&p,
           (const char *[]){"run", "--nproc-per-node", "2", "--steps", "2", "--progress", "off", "--model",
                            "timed:f=1ms,b=1ms,w=1ms,act=4KiB", "--db", db, NULL},
           envs);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    lt_run(&p,
           (const char *[]){"query", "--db", db, "SELECT status, (SELECT count(*) > 0 FROM events) FROM jobs", NULL},
           NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "succeeded");
    lt_free(&p);
    lt_run(&p, (const char *[]){"launch", "--nproc-per-node", "1", "--", "sh", "-c", "echo \"C=$PPRUN_CLOCK\"", NULL},
           envs);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "C=monotonic");
    lt_free(&p);
}
