/* test_trace_collector.c: the launcher's collector with real processes,
 * files and sockets: a SIGKILLed worker loses no record, steps are analysed
 * as they complete, drops are counted, and a second node's batches arrive
 * over TCP on the job clock, and only with the job token when there is one. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/db.h"
#include "helpers/capture.h"
#include "helpers/trace_fixture.h"
#include "tracer/clock.h"
#include "runner/job/collector.h"

/* A worker: attaches to its ring, writes rank's part of steps 0..steps-1 of
 * the fixture plus `extra` F records of step `steps`, then kills itself. */
static void worker(int fd, int rank, int steps, int extra) {
    trace_ring *r;
    pp_err err;
    if (trace_ring_attach(fd, &r, &err) != 0) _exit(3);
    trace_event ev[32];
    for (int s = 0; s < steps; s++) {
        size_t n = tfix_events(s, 1000000 + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++)
            if (ev[i].rank == rank) trace_ring_write(r, &ev[i]);
    }
    for (int i = 0; i < extra; i++) {
        trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .step = steps,
                         .microbatch = i, .stage = rank, .peer = -1};
        e.start_ns = 100000000ull + (uint64_t)i * 10;
        e.end_ns = e.start_ns + 5;
        trace_ring_write(r, &e);
    }
    raise(SIGKILL);
    _exit(4);
}

Test(trace_collector, sigkilled_workers_lose_nothing_and_steps_are_analysed, .timeout = 60) {
    const char *path = tfix_path("col.db");
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *c;
    collector_config cfg = {.db = d, .job_id = job, .world_size = 2, .interval_ns = 2000000};
    cr_assert_eq(collector_start(&cfg, &c, &err), 0, "%s", err.msg);
    pid_t pids[2];
    const int extra = 20000;
    for (int rank = 0; rank < 2; rank++) {
        trace_ring *r;
        cr_assert_eq(trace_ring_create(32768, &r, &err), 0, "%s", err.msg);
        cr_assert_eq(collector_add_ring(c, rank, r, &err), 0, "%s", err.msg);
        pids[rank] = fork();
        if (pids[rank] == 0) worker(trace_ring_fd(r), rank, 3, rank == 1 ? extra : 0);
    }
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    }
    /* While running: steps 0..2 are complete for both ranks (rank 0 never
     * reaches step 3, so step 2 waits for the end). A reader sees step 0. */
    sqlite3 *rd;
    cr_assert_eq(db_open_readonly("--db", path, &rd, &err), 0, "%s", err.msg);
    int64_t seen = 0;
    for (int i = 0; i < 1000 && seen == 0; i++) {
        usleep(10000);
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(rd, "SELECT count(*) FROM step_stats WHERE step=1", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            seen = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    cr_assert_eq(seen, 2, "steps are analysed while the job runs");
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE step < 3"), 3 * 14);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE step = 3 AND rank = 1"), extra);
    cr_assert_eq(tfix_q_int(s, "SELECT count(DISTINCT microbatch) FROM events WHERE step = 3"), extra);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 6);
    cr_assert_eq(tfix_q_int(s, "SELECT events_ingested FROM job_counters"), 3 * 16 + extra);
    cr_assert_eq(tfix_q_int(s, "SELECT events_dropped FROM job_counters"), 0);
    /* Final analyses cover every step, including the one cut short. */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE step < 3"), 6);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats WHERE step = 2"), 71000);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE step = 3"), 1);
    sqlite3_close(rd);
    db_close(d);
}

Test(trace_collector, drops_of_a_full_ring_are_counted) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("drop.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_W, .rank = 1, .stage = 1, .peer = -1};
    for (int i = 0; i < 100; i++) {
        e.microbatch = i;
        trace_ring_write(w, &e); /* before the collector runs: 84 dropped */
    }
    collector *c;
    collector_config cfg = {.db = d, .job_id = job, .world_size = 2};
    cr_assert_eq(collector_start(&cfg, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(c, 1, r, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(c, 2, r, &err), -1, "rank out of range");
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    trace_ring_close(w);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 16);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT dropped_events FROM ranks WHERE rank = 1"), 84);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT events_dropped FROM job_counters"), 84);
    db_close(d);
}

Test(trace_collector, second_node_forwards_over_tcp_onto_the_job_clock, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("fwd.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master, *node;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    cr_assert_gt(port, 0);

    /* A stranger sends garbage: its connection is dropped, nothing else. */
    int junk = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(junk, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(write(junk, "GET / HTTP/1.0\r\n\r\n", 18), 18);

    /* Node 1's clock is 7 s behind the master's: offset = +7 s. */
    const int64_t off = 7000000000ll;
    collector_config nc = {.job_id = job, .world_size = 2, .clock_offset_ns = off, .forward_host = "127.0.0.1",
                           .forward_port = port};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    trace_ring *r0, *r1, *w0, *w1;
    cr_assert_eq(trace_ring_create(1024, &r0, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_create(1024, &r1, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(master, 0, r0, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node, 1, r1, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r0), &w0, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r1), &w1, &err), 0, "%s", err.msg);
    for (int s = 0; s < 2; s++) {
        trace_event ev[32];
        size_t n = tfix_events(s, 8000000000ll + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++) {
            if (ev[i].rank == 1) {
                ev[i].start_ns -= (uint64_t)off;
                ev[i].end_ns -= (uint64_t)off;
            }
            trace_ring_write(ev[i].rank == 0 ? w0 : w1, &ev[i]);
        }
    }
    trace_ring_close(w0);
    trace_ring_close(w1);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    close(junk);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 28);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT min(start_ns) FROM events WHERE rank = 1"), 8000000000ll, "aligned");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats WHERE rank = 1"), 2 * 35000,
                 "the same bubbles as on one clock");
    db_close(d);
}

/* A node with more local ranks than the 64 a frame once carried (79):
 * every one of them reaches the master on the job clock. */
Test(trace_collector, every_local_rank_of_a_big_node_is_on_the_job_clock, .timeout = 60) {
    enum { RANKS = 80 };
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("big.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master, *node;
    collector_config mc = {.db = d, .job_id = job, .world_size = RANKS, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    const int64_t off = 7000000000ll, at = 9000000000ll;
    collector_config nc = {.job_id = job, .world_size = RANKS, .clock_offset_ns = off, .forward_host = "127.0.0.1",
                           .forward_port = collector_listen_port(master)};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    for (int rank = 1; rank < RANKS; rank++) {
        trace_ring *r, *w;
        cr_assert_eq(trace_ring_create(64, &r, &err), 0, "%s", err.msg);
        cr_assert_eq(collector_add_ring(node, rank, r, &err), 0, "%s", err.msg);
        cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
        trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .step = 0,
                         .microbatch = 0, .stage = 0, .peer = -1};
        e.start_ns = (uint64_t)(at - off);
        e.end_ns = e.start_ns + 1000;
        trace_ring_write(w, &e);
        trace_ring_close(w);
    }
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), RANKS - 1);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE start_ns = 9000000000"), RANKS - 1,
                 "every rank's offset applied");
    db_close(d);
}

Test(trace_collector, unreachable_master_and_bad_config_are_errors) {
    collector *c;
    pp_err err;
    collector_config nc = {.job_id = 1, .world_size = 2, .forward_host = "127.0.0.1", .forward_port = 1};
    cr_assert_eq(collector_start(&nc, &c, &err), -1);
    cr_assert(strstr(err.msg, "127.0.0.1:1"), "%s", err.msg);
    collector_config none = {.job_id = 1, .world_size = 2};
    cr_assert_eq(collector_start(&none, &c, &err), -1);
}

/* The master's clock, as the store's TIME op would answer (same host here). */
static int master_now(void *ctx, uint64_t *remote, pp_err *err) {
    (void)ctx, (void)err;
    *remote = pp_now_ns();
    return 0;
}

Test(trace_collector, skewed_node_measured_and_aligned_on_the_job_clock, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("skew.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master, *node;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);

    /* Node 1 runs with a skewed clock (+3 s): its launcher measures the
     * offset at rendezvous, its worker stamps skewed times. */
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "3000000000", 1);
    int64_t off;
    uint64_t rtt;
    cr_assert_eq(trace_clock_offset(master_now, NULL, 8, &off, &rtt, &err), 0, "%s", err.msg);
    collector_config nc = {.job_id = job, .world_size = 2, .clock_offset_ns = off, .forward_host = "127.0.0.1",
                           .forward_port = collector_listen_port(master)};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    trace_ring *r0, *r1;
    cr_assert_eq(trace_ring_create(64, &r0, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_create(64, &r1, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(master, 0, r0, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node, 1, r1, &err), 0, "%s", err.msg);
    /* Both workers record "the same instant" T on their own clocks. */
    uint64_t T = pp_now_ns();
    pid_t pids[2];
    for (int rank = 1; rank >= 0; rank--) {
        if (rank == 0) unsetenv("PPRUN_TEST_CLOCK_SKEW_NS"); /* the master node has none */
        pids[rank] = fork();
        if (pids[rank] == 0) {
            trace_ring *w;
            if (trace_ring_attach(trace_ring_fd(rank == 0 ? r0 : r1), &w, &err) != 0) _exit(3);
            trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .stage = rank,
                             .microbatch = 0, .peer = -1, .start_ns = T, .end_ns = T + 1000};
            trace_ring_write(w, &e);
            _exit(0);
        }
    }
    for (int i = 0; i < 2; i++) waitpid(pids[i], NULL, 0);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    int64_t a = tfix_q_int(s, "SELECT start_ns FROM events WHERE rank = 0"),
            b = tfix_q_int(s, "SELECT start_ns FROM events WHERE rank = 1");
    cr_assert_eq(a, (int64_t)T);
    cr_assert_leq(llabs(b - a), (long long)rtt / 2 + 50000, "aligned within the round trip: %lld ns apart (rtt %llu)",
                  (long long)(b - a), (unsigned long long)rtt);
    db_close(d);
}

/* A new database at tfix_path(name) with one job of 2 ranks, its
 * collector (draining every 1 ms) over one ring of rank 0, and the ring's
 * writer into *w. */
/* A collector of a 2-rank job with a ring per rank, and the writers'
 * ends of the rings in w: a record goes to its own rank's ring
 * (w[ev.rank]), the only one the collector takes it from. The first
 * corrupt ring is described in *fault (NULL: not wanted). */
static collector *two_ring_collector_faults(const char *name, db **d, trace_ring *w[2], pp_err *fault) {
    pp_err err;
    cr_assert_eq(db_open(tfix_path(name), d, &err), 0, "%s", err.msg);
    collector *c;
    if (fault) fault->msg[0] = '\0';
    collector_config cfg = {
        .db = *d, .job_id = tfix_job(*d), .world_size = 2, .interval_ns = 1000000, .ring_fault = fault};
    cr_assert_eq(collector_start(&cfg, &c, &err), 0, "%s", err.msg);
    for (int rank = 0; rank < 2; rank++) {
        trace_ring *r;
        cr_assert_eq(trace_ring_create(1024, &r, &err), 0, "%s", err.msg);
        cr_assert_eq(collector_add_ring(c, rank, r, &err), 0, "%s", err.msg);
        cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w[rank], &err), 0, "%s", err.msg);
    }
    return c;
}

static collector *two_ring_collector(const char *name, db **d, trace_ring *w[2]) {
    return two_ring_collector_faults(name, d, w, NULL);
}

/* Training that diverges writes NaN and Inf losses; SQLite stores NaN as
 * NULL. Tracing must go on: later batches land, the collector stays healthy. */
Test(trace_collector, nan_and_inf_losses_do_not_stop_tracing, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("nan.db", &d, w);
    const double bad[3] = {NAN, INFINITY, -INFINITY};
    uint64_t want = 0;
    for (int s = 0; s < 4; s++) {
        trace_event ev[32];
        size_t n = tfix_events(s, 1000000 + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++) {
            if (ev[i].phase == TRACE_LOSS && s < 3) ev[i].value = bad[s];
            trace_ring_write(w[ev[i].rank], &ev[i]);
        }
        want += n;
        /* One batch per step: wait until this one is in. */
        for (int k = 0; k < 5000 && collector_count(c) < want; k++) usleep(1000);
        cr_assert_eq(collector_count(c), want, "step %d's batch was ingested", s);
        cr_assert_eq(collector_error(c, &err), 0, "the collector is still healthy: %s", err.msg);
    }
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 4 * 14);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses WHERE loss IS NULL"), 6, "not finite: NULL");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses WHERE step = 3 AND loss IS NOT NULL"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 8, "every step analysed");
    db_close(d);
}

/* A step analysed while the job ran and stored into after (a restarted
 * attempt ran it again) is analysed again at the end, on its latest
 * attempt; the final pass skips only the steps nothing came to since. */
Test(trace_collector, a_step_stored_into_after_its_analysis_is_analysed_again, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("again.db", &d, w);
    trace_event ev[32];
    uint64_t want = 0;
    for (int s = 0; s < 3; s++) {
        size_t n = tfix_events(s, 1000000 + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++) trace_ring_write(w[ev[i].rank], &ev[i]);
        want += n;
    }
    /* Steps 0 and 1 are analysed in the round that stores them, before the
     * collector reads the ring again. */
    for (int k = 0; k < 5000 && collector_count(c) < want; k++) usleep(1000);
    cr_assert_eq(collector_count(c), want);
    /* Step 0 again, attempt 1, every span and gap twice as long. */
    size_t n = tfix_events(0, 10000000, ev);
    for (size_t i = 0; i < n; i++) {
        ev[i].attempt = 1;
        ev[i].start_ns = 10000000 + 2 * (ev[i].start_ns - 10000000);
        ev[i].end_ns = 10000000 + 2 * (ev[i].end_ns - 10000000);
        trace_ring_write(w[ev[i].rank], &ev[i]);
    }
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats WHERE step = 0"), 2 * 71000,
                 "step 0's statistics are its second attempt's");
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats WHERE step = 1"), 71000);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats WHERE step = 2"), 71000);
    db_close(d);
}

/* The ingest port trusts the network, but a forged frame cannot make the
 * master loop over 2^31 steps or write records for ranks the job lacks:
 * such records are refused and counted, the rest of the frame is kept. */
Test(trace_collector, forged_ranks_and_steps_are_refused_and_counted, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("forged.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .steps = 4, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)collector_listen_port(master))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct {
        uint32_t magic;
        uint16_t version, nranks;
        int64_t job_id;
        uint32_t nrecords, pad;
    } h = {0x57465050u, 1, 0, job, 5, 0};
    trace_event ev[5];
    for (int i = 0; i < 5; i++)
        ev[i] = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = i % 2, .step = INT32_MAX,
                              .microbatch = 0, .stage = i % 2, .peer = -1, .start_ns = 2000000, .end_ns = 2001000};
    ev[2].step = 1;  /* the one good record */
    ev[3].rank = 7;  /* no such rank */
    ev[3].step = 1;
    ev[4].step = -3; /* no such step */
    cr_assert_eq(write(fd, &h, sizeof h), (ssize_t)sizeof h);
    cr_assert_eq(write(fd, ev, sizeof ev), (ssize_t)sizeof ev);
    close(fd);
    for (int k = 0; k < 5000 && collector_count(master) + collector_rejected(master) < 5; k++) usleep(1000);
    cr_assert_eq(collector_rejected(master), 4);
    cr_assert_eq(collector_count(master), 1);
    cr_assert_eq(collector_stop(master, &err), 0, "still healthy: %s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT step FROM events"), 1);
    db_close(d);
}

/* With the job token, a forwarder without it or with a wrong one is refused
 * at collector_start, a raw connection that sends a wrong hello and then a
 * frame gets nothing into the database, and a forwarder with the token is
 * still served. */
Test(trace_collector, forwarders_without_the_token_are_refused_and_write_nothing, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("token.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture log;
    capture_start(&log);

    collector *master, *node = NULL;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1",
                           .token = "right-token-0123"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    char where[64];
    snprintf(where, sizeof where, "the trace collector at 127.0.0.1:%d refused the rendezvous token", port);

    collector_config nc = {.job_id = job, .world_size = 2, .forward_host = "127.0.0.1", .forward_port = port,
                           .token = "wrong-token-0123"};
    cr_assert_eq(collector_start(&nc, &node, &err), -1, "a wrong token was accepted");
    cr_assert(strstr(err.msg, where) && strstr(err.msg, "PPRUN_RDZV_TOKEN"), "%s", err.msg);
    nc.token = NULL;
    cr_assert_eq(collector_start(&nc, &node, &err), -1, "no token was accepted");
    cr_assert(strstr(err.msg, where) && strstr(err.msg, "none was given"), "%s", err.msg);

    /* By hand: a wrong hello, then a well-formed frame with one record. */
    struct {
        uint32_t magic;
        uint16_t version, nranks;
        int64_t job_id;
        uint32_t nrecords, pad;
    } h = {0x57465050u, 1, 0, job, 1, 0};
    trace_event ev = tfix_one_f(1, 1, 0);
    for (int legacy = 0; legacy < 2; legacy++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        if (!legacy) {
            /* hello: "PPHI", version 1, token length, token */
            unsigned char hello[8 + 16];
            uint32_t magic = 0x49485050u;
            uint16_t ver = 1, len = 16;
            memcpy(hello, &magic, 4);
            memcpy(hello + 4, &ver, 2);
            memcpy(hello + 6, &len, 2);
            memcpy(hello + 8, "right-token-0124", 16);
            cr_assert_eq(write(fd, hello, sizeof hello), (ssize_t)sizeof hello);
        }
        /* legacy: a bare frame, as forwarders before the hello sent. The
         * master may have closed already: no SIGPIPE, and the result does
         * not matter. */
        (void)!send(fd, &h, sizeof h, MSG_NOSIGNAL);
        (void)!send(fd, &ev, sizeof ev, MSG_NOSIGNAL);
        /* Until the master closes: at most the refusal byte comes back
         * (which a reset for the unread frame may overtake). */
        unsigned char answer[8];
        ssize_t n, total = 0;
        while ((n = recv(fd, answer, sizeof answer, 0)) > 0) {
            total += n;
            cr_assert(answer[0] == 0 && !legacy, "the master answered %d to a connection it must refuse", answer[0]);
        }
        cr_assert_leq(total, 1);
        close(fd);
    }

    /* The right token still gets in. */
    nc.token = "right-token-0123";
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    trace_ring *r1, *w1;
    cr_assert_eq(trace_ring_create(1024, &r1, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node, 1, r1, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r1), &w1, &err), 0, "%s", err.msg);
    ev.step = 5;
    trace_ring_write(w1, &ev);
    trace_ring_close(w1);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    uint64_t rejected = collector_rejected(master);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);

    const char *text = capture_end(&log);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 1, "only the forwarder with the token wrote");
    cr_assert_eq(tfix_q_int(s, "SELECT step FROM events"), 5);
    cr_assert_eq(rejected, 0, "records of refused connections were even looked at");
    cr_assert_eq(capture_count(text, "pprun collector: refused a forwarding connection from 127.0.0.1:"), 4,
                 "one line per refused connection:\n%s", text);
    cr_assert_null(strstr(text, "token-012"), "the log shows a token: %s", text);
    db_close(d);
}

/* ---- a launcher killed while its collector holds records -------------- */

#define KILL_RECORDS 30000 /* per round: 150 steps of 200 microbatches, one F each */
#define KILL_STEPS 150

/* The producer of the kill rounds: KILL_RECORDS F records, numbered by
 * (step, microbatch), at about 60,000 a second. */
static void kill_producer(int fd) {
    trace_ring *r;
    pp_err err;
    if (trace_ring_attach(fd, &r, &err) != 0) _exit(3);
    for (int i = 0; i < KILL_RECORDS; i++) {
        trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = 0, .stage = 0, .peer = -1,
                         .step = i / 200, .microbatch = i % 200};
        e.start_ns = 1000000ull + (uint64_t)i * 1000;
        e.end_ns = e.start_ns + 500;
        trace_ring_write(r, &e);
        if (i % 600 == 599) usleep(10000);
    }
    _exit(0);
}

/* The launcher of the kill rounds: its collector drains the ring into the
 * database until it is SIGKILLed. */
static void kill_launcher(const char *path, int64_t job, trace_ring *ring) {
    db *d;
    pp_err err;
    collector *c;
    if (db_open(path, &d, &err) != 0) _exit(3);
    /* As a 64-rank job's: it stages 4,096 records (or 100 ms) before it
     * stores them, so a kill finds some read and not stored. */
    collector_config cfg = {.db = d, .job_id = job, .world_size = 64, .steps = KILL_STEPS, .interval_ns = 1000000};
    if (collector_start(&cfg, &c, &err) != 0 || collector_add_ring(c, 0, ring, &err) != 0) _exit(4);
    for (;;) pause();
}

/* `pprun salvage` as a launcher's guard runs it, the ring as descriptor 3;
 * its exit status. */
static int run_salvage(const char *path, int64_t job, pid_t launcher, int ring_fd) {
    char jobs[32], pids[32];
    snprintf(jobs, sizeof jobs, "%lld", (long long)job);
    snprintf(pids, sizeof pids, "%d", (int)launcher);
    pid_t p = fork();
    if (p == 0) {
        if (dup2(ring_fd, 3) != 3) _exit(5);
        execl(PPRUN_BIN, PPRUN_BIN, "salvage", "--db", path, "--job", jobs, "--run-id", "fixture", "--launcher", pids,
              "--host", "test", "--world-size", "2", "--steps", "150", "--rings", "1", "--first-rank", "0",
              (char *)NULL);
        _exit(6);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `pprun salvage` with what a will never holds is refused (exit 2) and
 * touches nothing: without --db a run id and attempts are needed, and
 * attempts past what --max-restarts allows (a count it would have read
 * /dev/shm for, or hashed, billions of times) are refused. A will of the
 * rings alone (another node's, or --trace off) runs. */
Test(trace_collector, salvage_refuses_a_will_it_cannot_carry_out) {
    static const char *const bad[][5] = {
        {"--run-id", "r", NULL},
        {"--attempts", "1", NULL},
        {"--run-id", "r", "--attempts", "1000002"},
        {"--run-id", "r", "--attempts", "99999999999999999999"},
        {"--run-id", "r", "--attempts", "x"},
        {"--run-id", "r", "--attempts", NULL},
    };
    for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
        int good = i == sizeof bad / sizeof bad[0];
        pid_t p = fork();
        if (p == 0) {
            if (good) execl(PPRUN_BIN, PPRUN_BIN, "salvage", "--run-id", "r", "--attempts", "3", (char *)NULL);
            else execl(PPRUN_BIN, PPRUN_BIN, "salvage", bad[i][0], bad[i][1], bad[i][2], bad[i][3], (char *)NULL);
            _exit(6);
        }
        int st;
        waitpid(p, &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == (good ? 0 : 2), "case %zu: status %d", i, st);
    }
}

/* A launcher SIGKILLed at any moment, its collector holding records it
 * read from a ring but had not stored, or had stored but not given back to
 * the ring: `pprun salvage` (what the launcher's guard runs) stores every
 * record the ring got exactly once (docs/design.md §6). Eight rounds, each
 * killed at another moment of a producer writing 30,000 records. */
Test(trace_collector, a_launcher_killed_at_any_moment_stores_each_record_once, .timeout = 240) {
    for (int round = 0; round < 8; round++) {
        char name[32];
        snprintf(name, sizeof name, "kill%d.db", round);
        const char *p = tfix_path(name);
        char path[512];
        snprintf(path, sizeof path, "%s", p);
        db *d;
        pp_err err;
        cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
        int64_t job = tfix_job(d);
        db_close(d);
        trace_ring *ring;
        cr_assert_eq(trace_ring_create(65536, &ring, &err), 0, "%s", err.msg);
        pid_t producer = fork();
        if (producer == 0) kill_producer(trace_ring_fd(ring));
        pid_t launcher = fork();
        if (launcher == 0) kill_launcher(path, job, ring);
        usleep(50000 + 40000 * (useconds_t)round); /* from 50 ms to 330 ms into the 500 ms of writing */
        kill(launcher, SIGKILL);
        int st;
        waitpid(launcher, &st, 0);
        waitpid(producer, &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the producer failed");
        cr_assert_eq(run_salvage(path, job, launcher, trace_ring_fd(ring)), 0, "pprun salvage failed");
        cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
        sqlite3 *s = db_sqlite(d);
        int64_t rows = tfix_q_int(s, "SELECT count(*) FROM events"),
                distinct = tfix_q_int(s, "SELECT count(*) FROM (SELECT DISTINCT step, microbatch FROM events)");
        cr_assert_eq(distinct, KILL_RECORDS, "round %d: %lld of %d records stored", round, (long long)distinct,
                     KILL_RECORDS);
        cr_assert_eq(rows, KILL_RECORDS, "round %d: %lld rows for %d records: some stored twice", round,
                     (long long)rows, KILL_RECORDS);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'failed'"), 1);
        db_close(d);
        trace_ring_close(ring);
    }
}

/* The moment between the commit and the ring's release, which a kill
 * rarely hits, made on purpose: a consumer stores 600 of 1,000 records
 * with the ring's mark and dies before it releases them. `pprun salvage`
 * stores the other 400, none twice. */
Test(trace_collector, records_stored_and_not_released_are_not_stored_again) {
    const char *path = tfix_path("mark.db");
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    trace_ring *ring, *consumer;
    cr_assert_eq(trace_ring_create(4096, &ring, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(ring), &consumer, &err), 0, "%s", err.msg);
    trace_event ev[1000];
    for (int i = 0; i < 1000; i++) {
        ev[i] = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = 0, .stage = 0, .peer = -1,
                              .step = i / 10, .microbatch = i % 10, .start_ns = 1000 + (uint64_t)i * 10,
                              .end_ns = 1005 + (uint64_t)i * 10};
        cr_assert_eq(trace_ring_write(ring, &ev[i]), 1);
    }
    cr_assert_eq(trace_ring_peek(consumer, ev, 600), 600);
    db_ring_mark mark = {trace_ring_id(consumer), 0, trace_ring_position(consumer)};
    cr_assert_eq(db_insert_events_marked(d, job, ev, 600, &mark, 1, &err), 0, "%s", err.msg);
    trace_ring_close(consumer); /* killed: never released */
    cr_assert_eq(trace_ring_pending(ring), 1000, "the ring still holds all it got");
    db_close(d);
    cr_assert_eq(run_salvage(path, job, getpid(), trace_ring_fd(ring)), 0, "pprun salvage failed");
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1000);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM (SELECT DISTINCT step, microbatch FROM events)"), 1000);
    db_close(d);
    trace_ring_close(ring);
}

/* Waits (up to 5 s) until c ingested `want` records. */
static void wait_count(collector *c, uint64_t want) {
    for (int k = 0; k < 5000 && collector_count(c) < want; k++) usleep(1000);
    cr_assert_eq(collector_count(c), want);
}

/* A ring is its rank's: the records in rank 1's ring that claim rank 0
 * are refused and counted, not stored as rank 0's; its own are kept. */
Test(trace_collector, records_in_a_ring_that_claim_another_rank_are_refused, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("forgery.db", &d, w);
    for (int i = 0; i < 10; i++) {
        trace_event e = tfix_one_f(i % 2 ? 1 : 0, 1, 0); /* half of them claim rank 0 */
        e.microbatch = i;
        trace_ring_write(w[1], &e);
    }
    wait_count(c, 5);
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events WHERE rank = 0"), 0, "nothing forged");
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events WHERE rank = 1"), 5);
    db_close(d);
}

/* Records with times (or bytes) libpprun_trace refuses, written into the ring
 * directly (an end past INT64_MAX once failed its step's analysis, which
 * stopped the job's whole trace; a start of 2^63 was stored as INT64_MIN;
 * bytes past 2^50 made every reader refuse the job as damaged):
 * refused and counted like forged ranks, the other records of that step
 * and of every later one stored and analysed. */
/* Records a program could write into its own ring (or a node forward)
 * that no reader takes: refused and counted, and the rest stored and
 * analysed. A stage or microbatch past its bound used to be stored, then
 * failed its step's analysis and stopped the whole job's trace. */
/* A ring's drop count is its producer's to write, any value: two ranks
 * each claiming 2^62 summed past an int64 in SQL, and the collector
 * stopped the whole job's trace. Each is stored as the largest count
 * readers take (2^46), and tracing goes on. */
Test(trace_collector, a_forged_drop_count_is_stored_as_the_largest_and_tracing_goes_on, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("dropped.db", &d, w);
    for (int rank = 0; rank < 2; rank++) trace_ring_count_dropped(w[rank], 1ull << 62);
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++) trace_ring_write(w[ev[i].rank], &ev[i]);
    for (int k = 0; k < 5000 && collector_count(c) < n; k++) usleep(1000);
    cr_assert_eq(collector_count(c), n, "the step's records were stored");
    cr_assert_eq(collector_error(c, &err), 0, "the collector is still healthy: %s", err.msg);
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM ranks WHERE dropped_events = 70368744177664"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT events_dropped FROM job_counters"), 2 * 70368744177664ll);
    db_close(d);
}

Test(trace_collector, records_with_impossible_fields_are_refused_and_tracing_goes_on, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("times.db", &d, w);
    uint64_t want = 0;
    for (int s = 0; s < 3; s++) {
        trace_event ev[32];
        size_t n = tfix_events(s, 1000000 + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++) trace_ring_write(w[ev[i].rank], &ev[i]);
        want += n;
        if (s == 0) {
            trace_event bad[8];
            for (int k = 0; k < 8; k++) bad[k] = tfix_one_f(1, 1, 0);
            bad[0].end_ns = UINT64_MAX;                                /* past INT64_MAX */
            bad[1].start_ns = 1ull << 63, bad[1].end_ns = (1ull << 63) + 5; /* INT64_MIN once stored */
            bad[2].start_ns = 500, bad[2].end_ns = 400;                /* ends before it starts */
            bad[3].bytes = TRACE_BYTES_MAX + 1; /* every reader would refuse the job as damaged */
            bad[4].stage = INT32_MAX;           /* and these too */
            bad[5].microbatch = INT32_MAX;
            bad[6].peer = 2; /* a world of 2 */
            bad[7].phase = TRACE_LOSS, bad[7].microbatch = -7, bad[7].value = 1.5;
            for (int k = 0; k < 8; k++) trace_ring_write(w[1], &bad[k]);
        }
        for (int k = 0; k < 5000 && collector_count(c) < want; k++) usleep(1000);
        cr_assert_eq(collector_count(c), want, "step %d's records were stored", s);
        cr_assert_eq(collector_error(c, &err), 0, "the collector is still healthy: %s", err.msg);
    }
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 3 * 14, "every good record, none of the bad");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE start_ns < 0 OR end_ns < start_ns"), 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses WHERE microbatch < 0"), 0, "the forged loss was stored");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 6, "every step analysed");
    db_close(d);
}

/* Rank 1 sets its ring's head to tail - 1: its ring is disabled at once
 * (the collector reads no junk, loops on nothing), named in ring_fault,
 * its drops counted; rank 0's records before and after are all stored,
 * and the collector stops at once. */
Test(trace_collector, a_corrupt_ring_is_disabled_and_the_other_ranks_go_on, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err, fault;
    collector *c = two_ring_collector_faults("corrupt.db", &d, w, &fault);
    for (int rank = 0; rank < 2; rank++) {
        trace_event e = tfix_one_f(rank, rank, 0);
        trace_ring_write(w[rank], &e);
    }
    wait_count(c, 2);
    tfix_scribble_head(trace_ring_fd(w[1]), 0); /* 1 - 1 */
    for (int i = 1; i <= 100; i++) {
        trace_event e = tfix_one_f(0, 0, i);
        trace_ring_write(w[0], &e);
    }
    wait_count(c, 102);
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(collector_stop(c, &err), 0, "a corrupt ring is no collector error: %s", err.msg);
    cr_assert_lt(pp_now_ns() - t0, 3000000000ull, "the stop took %.1f s", (double)(pp_now_ns() - t0) / 1e9);
    cr_assert(strstr(fault.msg, "rank 1's trace ring is corrupt"), "%s", fault.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank = 0"), 101);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank = 1"), 1, "what it wrote before");
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks WHERE rank = 1"), 1024, "at most a ring's worth");
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks WHERE rank = 0"), 0);
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    db_close(d);
}

/* A job without a step bound (a user's program) whose ranks record steps
 * 0, 1, 1e9 and 1e9 + 1: step 1e9 is analysed while the job runs like
 * any other, without walking the billion empty steps before it. */
Test(trace_collector, a_record_at_a_huge_step_costs_one_analysis, .timeout = 60) {
    db *d;
    trace_ring *w[2];
    pp_err err;
    collector *c = two_ring_collector("huge.db", &d, w);
    const int steps[] = {0, 1, 1000000000, 1000000001};
    for (size_t k = 0; k < 4; k++) {
        trace_event ev[32];
        size_t n = tfix_events(steps[k] % 2, 1000000 + (int64_t)k * 1000000, ev);
        for (size_t i = 0; i < n; i++) {
            ev[i].step = steps[k];
            trace_ring_write(w[ev[i].rank], &ev[i]);
        }
    }
    sqlite3 *rd;
    cr_assert_eq(db_open_readonly("--db", tfix_path("huge.db"), &rd, &err), 0, "%s", err.msg);
    int64_t seen = 0;
    for (int i = 0; i < 500 && !seen; i++, usleep(10000))
        seen = tfix_q_int(rd, "SELECT count(*) FROM step_stats WHERE step = 1000000000");
    cr_assert_gt(seen, 0, "step 1e9 was not analysed within 5 s while the job ran");
    sqlite3_close(rd);
    trace_ring_close(w[0]);
    trace_ring_close(w[1]);
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    cr_assert_lt(pp_now_ns() - t0, 3000000000ull, "the stop took %.1f s", (double)(pp_now_ns() - t0) / 1e9);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(DISTINCT step) FROM step_stats"), 4);
    db_close(d);
}
