/* test_comm.c: the point-to-point transport between real processes, over
 * shared memory and over TCP: order per tag, 64 MiB messages, many tags in
 * flight received out of order, size mismatches, timeouts, dead peers and
 * peers without the job token, a TCP reader thread that cannot start; and
 * over shared memory, where a receive may read the ring itself: a flush past
 * the ring's size that no receive helps, two threads receiving from one peer,
 * a receiver that waits long and does not spin, receives switching between
 * waiting short and long, and two threads sending big messages to one peer. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "base/net.h"
#include "helpers/capture.h"
#include "helpers/comm_file_exchange.h"
#include "helpers/comm_world.h"
#include "helpers/trace_fixture.h"
#include "runner/comm/comm_int.h"  /* comm_shm_name: which /dev/shm name to look for; comm_shm_ring_bytes */

/* Deterministic bytes for message i: the receiver can regenerate them. */
static void fill(unsigned char *b, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)x;
    }
}

static int check(const unsigned char *b, size_t n, uint64_t seed, const char *what, pp_err *rep) {
    unsigned char *want = malloc(n ? n : 1);
    fill(want, n, seed);
    size_t i = 0;
    while (i < n && b[i] == want[i]) i++;
    free(want);
    if (i < n) return pp_fail(rep, "%s: byte %zu of %zu differs", what, i, n);
    return 0;
}

static void expect_all_ok(const cw_result *r, int world) {
    for (int i = 0; i < world; i++)
        cr_assert(r->exited[i] && r->code[i] == 0, "rank %d: %s %d: %s", i, r->exited[i] ? "exit" : "signal",
                  r->code[i], r->report[i]);
}

/* ---- order per tag, with two tags interleaved -------------------------- */

static size_t order_size(int i) { return 1 + (size_t)(i * 7919) % 30000; }

static int order_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    enum { N = 300 };
    unsigned char *b = malloc(30001);
    int rc = 0;
    if (rank == 0) {
        for (int i = 0; i < N && rc == 0; i++) {
            uint64_t tag = i % 2 ? 9 : 5;
            fill(b, order_size(i), (uint64_t)i);
            rc = comm_send(c, 1, tag, b, order_size(i), rep);
        }
    } else {
        /* All of tag 9 first: tag 5's messages wait in the inbox meanwhile. */
        for (int pass = 0; pass < 2 && rc == 0; pass++)
            for (int i = pass ? 0 : 1; i < N && rc == 0; i += 2) {
                rc = comm_recv(c, 0, i % 2 ? 9 : 5, b, order_size(i), 10000, rep);
                if (rc == 0) rc = check(b, order_size(i), (uint64_t)i, "message out of order or corrupt", rep);
            }
        if (rc == 0) snprintf(rep->msg, sizeof rep->msg, "%s", comm_transport_name(c, 0));
    }
    free(b);
    return rc;
}

static void order_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, order_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
    cr_assert_str_eq(r.report[1], transport);
}
Test(comm_shm, messages_of_one_tag_arrive_in_order) { order_test("shm"); }
Test(comm_tcp, messages_of_one_tag_arrive_in_order) { order_test("tcp"); }

/* ---- 64 MiB messages ----------------------------------------------------- */

#define BIG (64u << 20)

static int big_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    unsigned char *b = malloc(BIG);
    int rc = 0;
    if (rank == 0) {
        for (int t = 1; t <= 2 && rc == 0; t++) {
            fill(b, BIG, 100 + (uint64_t)t);
            rc = comm_send(c, 1, (uint64_t)t, b, BIG, rep);
        }
        if (rc == 0) rc = comm_recv(c, 1, 3, b, BIG, 30000, rep);
        if (rc == 0) rc = check(b, BIG, 103, "64 MiB reply", rep);
    } else {
        /* Second first: the first one (64 MiB) is buffered meanwhile. */
        for (int t = 2; t >= 1 && rc == 0; t--) {
            rc = comm_recv(c, 0, (uint64_t)t, b, BIG, 30000, rep);
            if (rc == 0) rc = check(b, BIG, 100 + (uint64_t)t, "64 MiB message", rep);
        }
        if (rc == 0) {
            fill(b, BIG, 103);
            rc = comm_send(c, 0, 3, b, BIG, rep);
        }
    }
    free(b);
    return rc;
}

static void big_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, big_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}
Test(comm_shm, messages_of_64_mib_arrive_intact) { big_test("shm"); }
Test(comm_tcp, messages_of_64_mib_arrive_intact) { big_test("tcp"); }

/* ---- many tags in flight, received in a shuffled order ------------------ */

enum { MANY = 1000 };
static size_t many_size(int i) { return 8 + (size_t)(i % 37) * 211; }

static int many_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    unsigned char *b = malloc(many_size(36));
    int rc = 0;
    if (rank == 0) {
        for (int i = 0; i < MANY && rc == 0; i++) {
            fill(b, many_size(i), (uint64_t)i);
            rc = comm_send(c, 1, comm_tag(0, 1, (uint64_t)i, COMM_DIR_ACT), b, many_size(i), rep);
        }
        if (rc == 0) rc = comm_recv(c, 1, comm_tag(0, 0, 0, COMM_DIR_CTRL), NULL, 0, 30000, rep);
    } else {
        int order[MANY];
        for (int i = 0; i < MANY; i++) order[i] = i;
        uint64_t x = 12345;
        for (int i = MANY - 1; i > 0; i--) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int j = (int)((x >> 33) % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < MANY && rc == 0; k++) {
            int i = order[k];
            rc = comm_recv(c, 0, comm_tag(0, 1, (uint64_t)i, COMM_DIR_ACT), b, many_size(i), 10000, rep);
            if (rc == 0) rc = check(b, many_size(i), (uint64_t)i, "message matched to the wrong tag", rep);
        }
        if (rc == 0) rc = comm_send(c, 0, comm_tag(0, 0, 0, COMM_DIR_CTRL), NULL, 0, rep);
    }
    free(b);
    return rc;
}

static void many_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, many_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}
Test(comm_shm, a_thousand_tags_in_flight_received_in_any_order) { many_test("shm"); }
Test(comm_tcp, a_thousand_tags_in_flight_received_in_any_order) { many_test("tcp"); }

/* ---- a sender that flushes and exits before the receiver even looks ------ */

static int early_exit_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    enum { N = 20, SZ = 32 << 10 };  /* fits in the ring: rank 0 exits before rank 1 attaches */
    unsigned char *b = malloc(SZ);
    int rc = 0;
    if (rank == 0) {
        for (int i = 0; i < N && rc == 0; i++) {
            fill(b, SZ, 500 + (uint64_t)i);
            rc = comm_send(c, 1, (uint64_t)i, b, SZ, rep);
        }
        /* The harness flushes, closes and exits right after this. */
    } else {
        pp_sleep_ns(300000000);  /* rank 0 is gone by now, or about to be */
        for (int i = 0; i < N && rc == 0; i++) {
            rc = comm_recv(c, 0, (uint64_t)i, b, SZ, 10000, rep);
            if (rc == 0) rc = check(b, SZ, 500 + (uint64_t)i, "message from an exited sender", rep);
        }
    }
    free(b);
    return rc;
}

static void early_exit_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, early_exit_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}
Test(comm_shm, messages_flushed_before_the_sender_exits_are_delivered) { early_exit_test("shm"); }
Test(comm_tcp, messages_flushed_before_the_sender_exits_are_delivered) { early_exit_test("tcp"); }

/* ---- shm: a flush past the ring's size, with no receive to help ----------- */

/* Once the channel is set up (a first message received), rank 0 sends four
 * times the ring's 4 MiB and flushes while rank 1 does not call comm_recv:
 * the receiving side's reader thread must make room. Only after rank 0's flush
 * returned (a byte through a pipe) does rank 1 receive, in reverse order. */
enum { FLUSH_N = 16, FLUSH_SZ = 1 << 20 };
typedef struct flush_arg {
    int fd[2];
} flush_arg;

static int flush_fn(comm *c, int rank, void *arg, pp_err *rep) {
    flush_arg *a = arg;
    unsigned char *b = malloc(FLUSH_SZ);
    int rc = 0;
    if (rank == 0) {
        rc = comm_send(c, 1, FLUSH_N, NULL, 0, rep);
        for (int i = 0; i < FLUSH_N && rc == 0; i++) {
            fill(b, FLUSH_SZ, 900 + (uint64_t)i);
            rc = comm_send(c, 1, (uint64_t)i, b, FLUSH_SZ, rep);
        }
        if (rc == 0) rc = comm_flush(c, 20000, rep);
        if (rc == 0 && write(a->fd[1], "f", 1) != 1) rc = pp_fail(rep, "pipe write failed");
    } else {
        struct pollfd pfd = {.fd = a->fd[0], .events = POLLIN};
        char x;
        rc = comm_recv(c, 0, FLUSH_N, NULL, 0, 10000, rep); /* the channel is set up */
        if (rc == 0 && (poll(&pfd, 1, 60000) != 1 || read(a->fd[0], &x, 1) != 1))
            rc = pp_fail(rep, "rank 0 never said its flush returned");
        for (int i = FLUSH_N - 1; i >= 0 && rc == 0; i--) {
            rc = comm_recv(c, 0, (uint64_t)i, b, FLUSH_SZ, 10000, rep);
            if (rc == 0) rc = check(b, FLUSH_SZ, 900 + (uint64_t)i, "message drained before it was asked for", rep);
        }
    }
    free(b);
    return rc;
}

Test(comm_shm, a_flush_past_the_ring_returns_before_any_receive) {
    flush_arg a;
    cr_assert_eq(pipe(a.fd), 0);
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "shm", flush_fn, &a, &r), 0);
    close(a.fd[0]), close(a.fd[1]);
    expect_all_ok(&r, 2);
}

/* ---- shm: two threads receiving from one peer ------------------------------ */

/* Rank 1 receives odd tags in a second thread and even ones in its main
 * thread, both from rank 0, which sends them interleaved, 1 B to 300 KiB:
 * one thread reads the ring at a time, and hands the other its messages. */
enum { TWO_N = 400 };
static size_t two_size(int i) { return 1 + (size_t)(i * 104729) % (300u << 10); }

typedef struct two_recv {
    comm *c;
    int parity;
    pp_err err;
    int rc;
} two_recv;

static void *two_recv_main(void *arg) {
    two_recv *t = arg;
    unsigned char *b = malloc(300u << 10);
    for (int i = t->parity; i < TWO_N && t->rc == 0; i += 2) {
        t->rc = comm_recv(t->c, 0, (uint64_t)i, b, two_size(i), 20000, &t->err);
        if (t->rc == 0) t->rc = check(b, two_size(i), 700 + (uint64_t)i, "message of two receiving threads", &t->err);
    }
    free(b);
    return NULL;
}

static int two_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    if (rank == 0) {
        unsigned char *b = malloc(300u << 10);
        int rc = 0;
        for (int i = 0; i < TWO_N && rc == 0; i++) {
            fill(b, two_size(i), 700 + (uint64_t)i);
            rc = comm_send(c, 1, (uint64_t)i, b, two_size(i), rep);
        }
        free(b);
        return rc;
    }
    two_recv odd = {.c = c, .parity = 1}, even = {.c = c, .parity = 0};
    pthread_t t;
    if (pthread_create(&t, NULL, two_recv_main, &odd) != 0) return pp_fail(rep, "pthread_create failed");
    two_recv_main(&even);
    pthread_join(t, NULL);
    if (even.rc) *rep = even.err;
    if (odd.rc) *rep = odd.err;
    return even.rc || odd.rc ? -1 : 0;
}

Test(comm_shm, two_threads_receiving_from_one_peer_get_their_own_messages) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "shm", two_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}

/* ---- shm: a receiver that waits long does not spin ------------------------- */

/* Rank 0 sends a message every 5 ms; rank 1's CPU time over those waits
 * must stay a small part of the wall time. A receive spins only while
 * recent waits were short (under 50 us): spinning through these waits
 * would take about all of it. Load on the machine only lowers the CPU time
 * rank 1 gets. */
enum { SLOW_N = 60 };

static double process_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int slow_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    char b[64] = {0};
    int rc = 0;
    if (rank == 0) {
        for (int i = 0; i < SLOW_N && rc == 0; i++) {
            pp_sleep_ns(5000000);
            rc = comm_send(c, 1, (uint64_t)i, b, sizeof b, rep);
        }
        return rc;
    }
    rc = comm_recv(c, 0, 0, b, sizeof b, 10000, rep); /* set-up and the first message outside the measure */
    double cpu0 = process_cpu_ns();
    uint64_t t0 = pp_now_ns();
    for (int i = 1; i < SLOW_N && rc == 0; i++) rc = comm_recv(c, 0, (uint64_t)i, b, sizeof b, 10000, rep);
    double cpu = process_cpu_ns() - cpu0, wall = (double)(pp_now_ns() - t0);
    if (rc == 0 && cpu > wall / 4)
        rc = pp_fail(rep, "rank 1 used %.1f ms of CPU in %.1f ms of waiting", cpu / 1e6, wall / 1e6);
    return rc;
}

Test(comm_shm, a_receiver_waiting_long_does_not_spin) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "shm", slow_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}

/* ---- shm: receives that switch between waiting short and long ------------- */

/* A receive sleeps on the ring's futex itself while its recent waits were
 * short, and hands the wait to the reader thread once they were long
 * (docs/comm.md, "Waiting"). Rank 0 alternates phases: a ping-pong (short
 * waits), messages 3 ms apart (long waits), a burst of 1 MiB messages past
 * the ring, then again; rank 1 checks every byte and the order, so a
 * message lost, doubled or cut at a switch of who reads the ring fails it. */
enum { SW_PHASES = 6, SW_PINGS = 150, SW_SLOW = 12, SW_BURST = 12, SW_BIG = 1 << 20 };

static size_t sw_size(int phase, int i) { return phase % 3 == 2 ? SW_BIG - (size_t)i : 1 + (size_t)(i * 37) % 500; }
static int sw_count(int phase) { return phase % 3 == 0 ? SW_PINGS : phase % 3 == 1 ? SW_SLOW : SW_BURST; }

static int switch_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    unsigned char *b = malloc(SW_BIG), ack = 0;
    int rc = 0;
    for (int ph = 0; ph < SW_PHASES && rc == 0; ph++)
        for (int i = 0; i < sw_count(ph) && rc == 0; i++) {
            uint64_t tag = comm_tag((uint64_t)ph, 1, (uint64_t)i, COMM_DIR_ACT), seed = (uint64_t)(ph * 1000 + i);
            size_t n = sw_size(ph, i);
            if (rank == 0) {
                if (ph % 3 == 1) pp_sleep_ns(3000000);
                fill(b, n, seed);
                rc = comm_send(c, 1, tag, b, n, rep);
                if (rc == 0 && ph % 3 == 0) rc = comm_recv(c, 1, tag, &ack, 1, 10000, rep);
            } else {
                rc = comm_recv(c, 0, tag, b, n, 10000, rep);
                if (rc == 0) rc = check(b, n, seed, "message across a switch of waiting", rep);
                if (rc == 0 && ph % 3 == 0) rc = comm_send(c, 0, tag, &ack, 1, rep);
            }
        }
    if (rc == 0) rc = comm_flush(c, 10000, rep);
    free(b);
    return rc;
}

Test(comm_shm, receives_switching_between_short_and_long_waits_lose_nothing) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "shm", switch_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}

/* ---- shm: two threads sending big messages to one peer ------------------- */

/* A comm_send past a full ring writes on while the peer reads, and another
 * thread's send meanwhile is queued behind it (comm.c). Rank 0 sends
 * 1 to 3 MiB messages to rank 1 from two threads at once (tags 1 and 2);
 * rank 1 receives all of tag 1, then all of tag 2 (filed in the inbox
 * meanwhile), pausing now and then so that sends stop half-way and queue
 * their rest while the other thread's wait, and checks every byte and the
 * order of each tag. */
enum { TS_N = 16 };
static size_t ts_size(int t, int i) { return (1u << 20) + (size_t)((i * 7 + t * 3) % 8) * (256u << 10) + (size_t)i; }

typedef struct ts_send {
    comm *c;
    int t, rc;
    pp_err err;
} ts_send;

static void *ts_send_main(void *arg) {
    ts_send *s = arg;
    unsigned char *b = malloc(3u << 20);
    for (int i = 0; i < TS_N && s->rc == 0; i++) {
        fill(b, ts_size(s->t, i), (uint64_t)(s->t * 100 + i));
        s->rc = comm_send(s->c, 1, (uint64_t)s->t, b, ts_size(s->t, i), &s->err);
    }
    free(b);
    return NULL;
}

static int ts_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    if (rank == 0) {
        ts_send one = {.c = c, .t = 1}, two = {.c = c, .t = 2};
        pthread_t th;
        if (pthread_create(&th, NULL, ts_send_main, &two) != 0) return pp_fail(rep, "pthread_create failed");
        ts_send_main(&one);
        pthread_join(th, NULL);
        if (one.rc || two.rc) {
            *rep = one.rc ? one.err : two.err;
            return -1;
        }
        return comm_flush(c, 20000, rep);
    }
    unsigned char *b = malloc(3u << 20);
    int rc = 0;
    for (int t = 1; t <= 2; t++)
        for (int i = 0; i < TS_N && rc == 0; i++) {
            if (i % 2) pp_sleep_ns(2000000); /* not reading: a send past the ring queues the rest */
            rc = comm_recv(c, 0, (uint64_t)t, b, ts_size(t, i), 20000, rep);
            if (rc == 0) rc = check(b, ts_size(t, i), (uint64_t)(t * 100 + i), "big message of two sending threads", rep);
        }
    free(b);
    return rc;
}

Test(comm_shm, two_threads_sending_big_messages_to_one_peer_keep_their_order) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "shm", ts_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
}

/* ---- size mismatch -------------------------------------------------------- */

static int mismatch_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    unsigned char b[200];
    if (rank == 0) {
        fill(b, 100, 7);
        return comm_send(c, 1, 7, b, 100, rep);
    }
    pp_err e;
    if (comm_recv(c, 0, 7, b, 200, 10000, &e) == 0) return pp_fail(rep, "a 100-byte message filled a 200-byte recv");
    /* The failed recv changed nothing: the right size still gets it. */
    if (comm_recv(c, 0, 7, b, 100, 10000, rep) < 0) return -1;
    if (check(b, 100, 7, "message after a mismatch", rep) < 0) return -1;
    *rep = e;
    return 0;
}

static void mismatch_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, mismatch_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
    const char *m = r.report[1];
    cr_assert(strstr(m, "rank 0") && strstr(m, "tag 0x7") && strstr(m, "100 bytes") && strstr(m, "expected 200"),
              "%s", m);
}
Test(comm_shm, a_size_mismatch_is_a_clear_error_and_loses_nothing) { mismatch_test("shm"); }
Test(comm_tcp, a_size_mismatch_is_a_clear_error_and_loses_nothing) { mismatch_test("tcp"); }

/* ---- timeout ----------------------------------------------------------------- */

static int timeout_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    uint64_t done = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    if (rank == 0) return comm_recv(c, 1, done, NULL, 0, 30000, rep);  /* alive, silent */
    float x[4];
    pp_err e;
    if (comm_recv(c, 0, comm_tag(3, 2, 5, COMM_DIR_GRAD), x, sizeof x, 300, &e) == 0)
        return pp_fail(rep, "recv of a message never sent succeeded");
    *rep = e;
    pp_err e2;
    return comm_send(c, 0, done, NULL, 0, &e2);
}

static void timeout_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, timeout_fn, NULL, &r), 0);
    expect_all_ok(&r, 2);
    const char *m = r.report[1];
    cr_assert(strstr(m, "timed out after 300 ms") && strstr(m, "from rank 0") && strstr(m, "step 3") &&
                  strstr(m, "stage 2") && strstr(m, "microbatch 5") && strstr(m, "gradient"),
              "%s", m);
}
Test(comm_shm, a_timeout_names_the_peer_and_the_tag) { timeout_test("shm"); }
Test(comm_tcp, a_timeout_names_the_peer_and_the_tag) { timeout_test("tcp"); }

/* ---- a peer killed while we wait on it -------------------------------------- */

static int dead_recv_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    unsigned char b[64] = {0};
    if (rank == 0) {
        /* One message, so the channel exists, then die without warning. */
        if (comm_send(c, 1, 1, b, sizeof b, rep) < 0 || comm_flush(c, 10000, rep) < 0) return -1;
        pp_sleep_ns(200000000);
        raise(SIGKILL);
    }
    if (comm_recv(c, 0, 1, b, sizeof b, 10000, rep) < 0) return -1;
    /* A 30 s timeout: the test fails (by message) if death were noticed
     * only when it ran out. */
    uint64_t t0 = pp_now_ns();
    int rc = comm_recv(c, 0, comm_tag(1, 1, 4, COMM_DIR_ACT), b, sizeof b, 30000, rep);
    snprintf(rep->msg + strlen(rep->msg), sizeof rep->msg - strlen(rep->msg), " [after %d ms]",
             (int)((pp_now_ns() - t0) / 1000000));
    if (rc == 0) return pp_fail(rep, "recv from a killed peer succeeded");
    /* Its wait note names rank 0 as the one whose end failed it, written at
     * the failure, well before a wait's note is due (1 s): the launcher
     * follows it to rank 0. */
    char key[320], note[32] = "";
    size_t len = 0;
    pp_err e;
    snprintf(key, sizeof key, COMM_WAIT_KEY_FMT, c->job_key, c->rank);
    if (c->ex.get(c->ex.ctx, key, note, sizeof note - 1, &len, 0, &e) != 0 || len != 6 || memcmp(note, "0 gone", 6))
        snprintf(rep->msg + strlen(rep->msg), sizeof rep->msg - strlen(rep->msg), " [wait note '%.*s', not '0 gone']",
                 (int)len, note);
    return 2;
}

static void dead_recv_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, dead_recv_fn, NULL, &r), 0);
    cr_assert(!r.exited[0] && r.code[0] == SIGKILL, "rank 0 should have been killed");
    const char *m = r.report[1];
    cr_assert(r.exited[1] && r.code[1] == 1, "%s", m);
    cr_assert(strstr(m, "rank 0") && (strstr(m, "died") || strstr(m, "closed its connection")) &&
                  strstr(m, "microbatch 4") && !strstr(m, "timed out") && !strstr(m, "wait note"),
              "%s", m);
}
Test(comm_shm, a_receiver_fails_fast_when_its_peer_is_killed) { dead_recv_test("shm"); }
Test(comm_tcp, a_receiver_fails_fast_when_its_peer_is_killed) { dead_recv_test("tcp"); }

/* ---- a sender blocked pushing into a peer that is killed ---------------------- */

static int dead_send_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    int pid = (int)getpid();
    if (rank == 1) {
        /* Say who we are, then freeze: nothing drains the channel any more. */
        if (comm_send(c, 0, 1, &pid, sizeof pid, rep) < 0 || comm_flush(c, 10000, rep) < 0) return -1;
        raise(SIGSTOP);
        return pp_fail(rep, "rank 1 resumed");
    }
    if (comm_recv(c, 1, 1, &pid, sizeof pid, 10000, rep) < 0) return -1;
    char path[64], st[256] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int i = 0; i < 1000 && !strstr(st, ") T"); i++) {  /* until it is stopped */
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(st, sizeof st, f)) st[0] = '\0';
            fclose(f);
        }
        pp_sleep_ns(10000000);
    }
    unsigned char *big = calloc(1, BIG);
    /* 128 MiB cannot fit in a ring or socket buffers: the sender thread blocks. */
    int rc = comm_send(c, 1, 2, big, BIG, rep);
    if (rc == 0) rc = comm_send(c, 1, 3, big, BIG, rep);
    free(big);
    if (rc < 0) return -1;
    pp_sleep_ns(100000000);
    kill(pid, SIGKILL);
    if (comm_flush(c, 30000, rep) == 0) return pp_fail(rep, "flush to a killed peer succeeded");
    return 2;
}

static void dead_send_test(const char *transport) {
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, dead_send_fn, NULL, &r), 0);
    cr_assert(!r.exited[1] && r.code[1] == SIGKILL, "rank 1 should have been killed");
    const char *m = r.report[0];
    cr_assert(r.exited[0] && r.code[0] == 1, "%s", m);
    cr_assert(strstr(m, "flush") && strstr(m, "rank 1") && !strstr(m, "timed out"), "%s", m);
}
Test(comm_shm, a_blocked_sender_fails_when_its_peer_is_killed) { dead_send_test("shm"); }
Test(comm_tcp, a_blocked_sender_fails_when_its_peer_is_killed) { dead_send_test("tcp"); }

/* ---- a ring through the job's store (interleaved-1f1b with 4 ranks) -------- */

/* Every rank sends activations to the next and gradients to the previous
 * and receives both at once, so each rank sets up two peers at the same
 * moment: one in its sender thread, one in the receiving thread, both asking
 * the store (one client per rank, not thread-safe) for an endpoint. */
enum { RING_WORLD = 4, RING_MSGS = 8, RING_BYTES = 4096 };

static int ring_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    int next = (rank + 1) % RING_WORLD, prev = (rank + RING_WORLD - 1) % RING_WORLD, rc = 0;
    unsigned char *b = malloc(RING_BYTES);
    for (int i = 0; i < RING_MSGS && rc == 0; i++) {
        fill(b, RING_BYTES, (uint64_t)(rank * 1000 + i));
        rc = comm_send(c, next, comm_tag(0, (uint64_t)next, (uint64_t)i, COMM_DIR_ACT), b, RING_BYTES, rep);
        if (rc == 0)
            rc = comm_send(c, prev, comm_tag(0, (uint64_t)prev, (uint64_t)i, COMM_DIR_GRAD), b, RING_BYTES, rep);
        uint64_t act = comm_tag(0, (uint64_t)rank, (uint64_t)i, COMM_DIR_ACT);
        if (rc == 0) rc = comm_recv(c, prev, act, b, RING_BYTES, 5000, rep);
        if (rc == 0) rc = check(b, RING_BYTES, (uint64_t)(prev * 1000 + i), "activation from the previous rank", rep);
        uint64_t grad = comm_tag(0, (uint64_t)rank, (uint64_t)i, COMM_DIR_GRAD);
        if (rc == 0) rc = comm_recv(c, next, grad, b, RING_BYTES, 5000, rep);
        if (rc == 0) rc = check(b, RING_BYTES, (uint64_t)(next * 1000 + i), "gradient from the next rank", rep);
    }
    free(b);
    return rc;
}

Test(comm_shm, a_ring_of_ranks_sharing_the_store_delivers_every_message) {
    /* The set-up race is decided afresh by every comm_open: try several. */
    for (int run = 0; run < 12; run++) {
        cw_result r;
        cr_assert_eq(cw_run_store(RING_WORLD, "shm", ring_fn, NULL, &r), 0, "%s", r.report[0]);
        for (int i = 0; i < RING_WORLD; i++)
            cr_assert(r.exited[i] && r.code[i] == 0, "run %d, rank %d: %s %d: %s", run, i,
                      r.exited[i] ? "exit" : "signal", r.code[i], r.report[i]);
    }
}

/* ---- transport choice: shm on one node, tcp across nodes --------------------- */

static int mixed_fn(comm *c, int rank, void *arg, pp_err *rep) {
    (void)arg;
    int v = rank * 10, rc = 0;
    for (int p = 0; p < 3 && rc == 0; p++)
        if (p != rank) rc = comm_send(c, p, 42, &v, sizeof v, rep);
    char out[64] = "";
    for (int p = 0; p < 3 && rc == 0; p++) {
        if (p == rank) continue;
        int got = -1;
        rc = comm_recv(c, p, 42, &got, sizeof got, 10000, rep);
        if (rc == 0 && got != p * 10) rc = pp_fail(rep, "rank %d sent %d, got %d", p, p * 10, got);
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%d:%s", out[0] ? " " : "", p,
                 comm_transport_name(c, p));
    }
    if (rc == 0) snprintf(rep->msg, sizeof rep->msg, "%s", out);
    return rc;
}

Test(comm, ranks_on_one_node_use_shm_and_across_nodes_tcp) {
    int nodes[3] = {0, 0, 1};
    cw_result r;
    cr_assert_eq(cw_run(3, nodes, NULL, mixed_fn, NULL, &r), 0);
    expect_all_ok(&r, 3);
    cr_assert_str_eq(r.report[0], "1:shm 2:tcp");
    cr_assert_str_eq(r.report[1], "0:shm 2:tcp");
    cr_assert_str_eq(r.report[2], "0:tcp 1:tcp");
}

Test(comm, transport_tcp_can_be_forced_on_one_node) {
    cw_result r;
    cr_assert_eq(cw_run(3, NULL, "tcp", mixed_fn, NULL, &r), 0);
    expect_all_ok(&r, 3);
    cr_assert_str_eq(r.report[0], "1:tcp 2:tcp");
}

/* ---- close releases everything --------------------------------------------- */

static int count_tasks(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

/* Descriptors comm may own: sockets, pidfds, eventfds, shm objects. */
static int count_comm_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], target[300];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = '\0';
        if (strstr(target, "socket:") || strstr(target, "pidfd") || strstr(target, "eventfd") ||
            strstr(target, "/dev/shm"))
            n++;
    }
    if (d) closedir(d);
    return n;
}

static int close_fn(comm *c, int rank, void *arg, pp_err *rep) {
    const cw_result *r = arg;
    int peer = 1 - rank, v = rank;
    if (comm_send(c, peer, 1, &v, sizeof v, rep) < 0 || comm_recv(c, peer, 1, &v, sizeof v, 10000, rep) < 0 ||
        comm_flush(c, 10000, rep) < 0)
        return -1;
    /* Both have received, so both have attached: the name is gone already. */
    char name[128], path[200];
    comm_shm_name(pp_hash_str(r->job_key), 0, 1, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    int shm_left = access(path, F_OK) == 0;
    int threads_open = count_tasks();
    comm_close(c);
    /* pthread_join returns once the kernel clears the thread's tid, a
     * moment before its /proc/self/task entry goes (CI saw 2 once): a
     * joined thread leaves within the second, a leaked one never does. */
    int threads = count_tasks();
    for (int i = 0; i < 100 && threads > 1; i++) usleep(10000), threads = count_tasks();
    snprintf(rep->msg, sizeof rep->msg, "shm_left=%d threads_open=%d threads=%d fds=%d", shm_left,
             threads_open > 1, threads, count_comm_fds());
    return CW_CLOSED;
}

static void close_test(const char *transport) {
    char want[100];
    /* The ranks inherit this process's descriptors (Criterion's own). */
    snprintf(want, sizeof want, "shm_left=0 threads_open=1 threads=1 fds=%d", count_comm_fds());
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, transport, close_fn, &r, &r), 0);
    expect_all_ok(&r, 2);
    cr_assert_str_eq(r.report[0], want);
    cr_assert_str_eq(r.report[1], want);
}
Test(comm_shm, close_joins_threads_and_leaves_no_shared_memory) {
    close_test("shm");
}
Test(comm_tcp, close_joins_threads_and_closes_sockets) {
    close_test("tcp");
}

/* ---- bad input ---------------------------------------------------------------- */

Test(comm, bad_configuration_and_bad_peers_are_clear_errors) {
    const char *dir = tfix_mkdir("bad-config"); /* removed when the test process exits */
    int nodes[2] = {0, 1};
    comm_config cfg = {.rank = 0, .world = 2, .job_key = "bad", .exchange = fx_exchange(dir), .transport = "udp"};
    comm *c = NULL;
    pp_err e;
    cr_assert_eq(comm_open(&cfg, &c, &e), -1);
    cr_assert(strstr(e.msg, "'udp'") && strstr(e.msg, "auto, shm, tcp"), "%s", e.msg);
    cfg.transport = "shm";
    cfg.rank_node = nodes;
    cr_assert_eq(comm_open(&cfg, &c, &e), -1);
    cr_assert(strstr(e.msg, "shm") && strstr(e.msg, "rank 1 is on node 1"), "%s", e.msg);
    cfg.transport = NULL;
    cfg.rank = 2;
    cr_assert_eq(comm_open(&cfg, &c, &e), -1);
    cr_assert(strstr(e.msg, "rank 2 out of range"), "%s", e.msg);
    cfg.rank = 0;
    cfg.rank_node = NULL;
    cr_assert_eq(comm_open(&cfg, &c, &e), 0, "%s", e.msg);
    int v = 0;
    cr_assert_eq(comm_send(c, 5, 1, &v, sizeof v, &e), -1);
    cr_assert(strstr(e.msg, "peer rank 5 out of range"), "%s", e.msg);
    cr_assert_eq(comm_recv(c, 0, 1, &v, sizeof v, 10, &e), -1);
    cr_assert(strstr(e.msg, "this rank itself"), "%s", e.msg);
    comm_close(c);
}

/* ---- the job token ----------------------------------------------------------- */

/* Rank 0 (right token) and rank 2 (a wrong one, or none) both send to rank
 * 1. arg: a file rank 2 creates once its flush has its answer. */
static int token_fn(comm *c, int rank, void *arg, pp_err *rep) {
    const char *rank2_done = arg;
    int v = rank == 0 ? 42 : 99;
    if (rank != 1) {
        int rc = comm_send(c, 1, 7, &v, sizeof v, rep) < 0 || comm_flush(c, 10000, rep) < 0 ? -1 : 0;
        if (rank == 2) close(open(rank2_done, O_WRONLY | O_CREAT, 0600));
        return rc;
    }
    if (comm_recv(c, 0, 7, &v, sizeof v, 10000, rep) < 0) return -1;
    if (v != 42) return pp_fail(rep, "rank 0 sent 42, got %d", v);
    /* Stay until rank 2 has its answer. Waiting on comm for rank 2 to go is
     * not enough: this rank's own connection to rank 2 is refused too (the
     * tokens differ both ways), which ends that wait at once, and a slow
     * rank 2 then connects after rank 1 left and sees "gone", not
     * "refused". */
    for (int i = 0; i < 3000 && access(rank2_done, F_OK) != 0; i++) usleep(10000);
    pp_err e;
    if (comm_recv(c, 2, 7, &v, sizeof v, 100, &e) == 0) return pp_fail(rep, "rank 2's message got through: %d", v);
    return 0;
}

/* Runs token_fn with stderr in a file; returns what the ranks wrote there
 * (capture_end's buffer). */
static const char *run_with_tokens(const char *const *tokens, cw_result *r) {
    char done[256]; /* removed when the test process exits (tfix_path) */
    snprintf(done, sizeof done, "%s", tfix_path("rank2-done"));
    capture log;
    capture_start(&log);
    int rc = cw_run_tokens(3, tokens, token_fn, done, r);
    const char *text = capture_end(&log);
    cr_assert_eq(rc, 0);
    return text;
}

Test(comm_tcp, a_peer_with_a_wrong_token_is_refused_and_the_others_still_talk) {
    const char *tokens[] = {"job-secret-1", "job-secret-1", "job-secret-2"};
    cw_result r;
    const char *log = run_with_tokens(tokens, &r);
    cr_assert(r.exited[0] && r.code[0] == 0, "rank 0: %s", r.report[0]);
    cr_assert(r.exited[1] && r.code[1] == 0, "rank 1: %s", r.report[1]);
    cr_assert(r.exited[2] && r.code[2] == 1, "rank 2 should have failed: %s", r.report[2]);
    cr_assert(strstr(r.report[2], "rank 1 at 127.0.0.1:") && strstr(r.report[2], "refused this rank's job token"), "%s",
              r.report[2]);
    cr_assert(strstr(log, "pprun comm (rank 1): refused a connection from 127.0.0.1:") &&
                  strstr(log, "(saying it is rank 2): wrong job token"),
              "%s", log);
    cr_assert_null(strstr(log, "job-secret"), "the log shows a token: %s", log);
}

Test(comm_tcp, a_peer_without_a_token_is_refused) {
    const char *tokens[] = {"job-secret-1", "job-secret-1", NULL};
    cw_result r;
    const char *log = run_with_tokens(tokens, &r);
    cr_assert(r.exited[1] && r.code[1] == 0, "rank 1 received rank 2's message: %s", r.report[1]);
    cr_assert(strstr(log, "(saying it is rank 2): no job token"), "%s", log);
}

Test(comm, a_bad_token_is_a_clear_error) {
    const char *dir = tfix_mkdir("bad-token"); /* removed when the test process exits */
    comm_config cfg = {.rank = 0, .world = 2, .job_key = "tok", .exchange = fx_exchange(dir), .token = "has space"};
    comm *c = NULL;
    pp_err e;
    cr_assert_eq(comm_open(&cfg, &c, &e), -1);
    cr_assert(strstr(e.msg, "comm") && strstr(e.msg, "space"), "%s", e.msg);
    cr_assert_null(c);
}

Test(comm, tags_follow_the_documented_layout) {
    uint64_t t = comm_tag(3, 2, 5, COMM_DIR_GRAD);
    cr_assert_eq(t, (3ull << 40) | (2ull << 24) | (5ull << 4) | 1);
    char b[128];
    cr_assert_str_eq(comm_tag_str(t, b, sizeof b), "tag 0x30002000051 (step 3, stage 2, microbatch 5, gradient)");
    /* devcomm's cuda-ipc announcement of that message: a tag of its own */
    cr_assert_str_eq(comm_tag_str(t | COMM_DIR_DEVDATA, b, sizeof b),
                     "tag 0x30002000059 (devcomm announcement of step 3, stage 2, microbatch 5, gradient)");
}

/* A node's shm rings shrink with the pairs of its ranks (each pair could
 * hold one): 4 MiB rings for a few ranks, 256 KiB for the 256 ranks whose
 * 4 MiB rings (a data-parallel group of 64 talking all to all) ran a
 * 23 GB machine out of memory; never smaller, however many. */
Test(comm_shm, rings_shrink_with_the_ranks_of_a_node) {
    const uint64_t gb = 1ull << 30;
    cr_assert_eq(comm_shm_ring_bytes(2, 16 * gb), 4u << 20);
    cr_assert_eq(comm_shm_ring_bytes(8, 16 * gb), 4u << 20);
    cr_assert_eq(comm_shm_ring_bytes(23, 16 * gb), 4u << 20);
    cr_assert_eq(comm_shm_ring_bytes(24, 16 * gb), 1u << 20);
    cr_assert_eq(comm_shm_ring_bytes(45, 16 * gb), 1u << 20);
    cr_assert_eq(comm_shm_ring_bytes(46, 16 * gb), 256u << 10);
    cr_assert_eq(comm_shm_ring_bytes(256, 23 * gb), 256u << 10);
    cr_assert_eq(comm_shm_ring_bytes(4096, 1 * gb), 256u << 10);
    cr_assert_eq(comm_shm_ring_bytes(256, 2048 * gb), 4u << 20, "a machine of 2 TB keeps them");
}

/* ---- a TCP reader thread that cannot start ---------------------------------- */

/* The ring of pair (a, b) of attempt `attempt` of run `run`, made in
 * /dev/shm as a rank that died before its peer attached leaves it; and
 * whether it is there. */
static void plant_ring(const char *run, int attempt, int a, int b) {
    char key[192], name[128];
    comm_job_key(run, attempt, key, sizeof key);
    comm_shm_name(pp_hash_str(key), a, b, name, sizeof name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    cr_assert(fd >= 0, "%s: %s", name, strerror(errno));
    close(fd);
}
static int ring_there(const char *run, int attempt, int a, int b) {
    char key[192], name[128], path[200];
    comm_job_key(run, attempt, key, sizeof key);
    comm_shm_name(pp_hash_str(key), a, b, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* The cleanup after an attempt removes its rings, whichever pairs of
 * however large a world, and nothing of another attempt or run. */
Test(comm_shm, the_cleanup_removes_the_attempts_rings_and_nothing_else) {
    char run[64], other[64], key[192];
    snprintf(run, sizeof run, "cleanup-%d", getpid());
    snprintf(other, sizeof other, "other-%d", getpid());
    plant_ring(run, 1, 0, 1);
    plant_ring(run, 1, 900, 1023);
    plant_ring(run, 2, 0, 1);
    plant_ring(other, 1, 0, 1);
    comm_job_key(run, 1, key, sizeof key);
    comm_cleanup(key);
    cr_assert(!ring_there(run, 1, 0, 1) && !ring_there(run, 1, 900, 1023));
    cr_assert(ring_there(run, 2, 0, 1), "another attempt's");
    cr_assert(ring_there(other, 1, 0, 1), "another run's");
    comm_job_key(run, 2, key, sizeof key);
    comm_cleanup(key);
    comm_job_key(other, 1, key, sizeof key);
    comm_cleanup(key);
    cr_assert(!ring_there(run, 2, 0, 1) && !ring_there(other, 1, 0, 1));
}

/* Rank 1 runs as a user with no thread left to start (RLIMIT_NPROC at the
 * threads it runs; the real uid is what the limit counts, and the saved uid
 * 0 takes it back after), then rank 0 connects and sends. The connection is
 * accepted but cannot be read: rank 1's receive fails at once naming why,
 * not at its timeout; standard error has the limits. */
#define NO_THREADS_UID 61998

static int no_reader_fn(comm *c, int rank, void *arg, pp_err *rep) {
    const cw_result *r = arg;
    char ready[160];
    snprintf(ready, sizeof ready, "/tmp/pprun-test-%s.limited", r->job_key);
    unsigned char b[64] = {0};
    if (rank == 0) { /* connects to rank 1 once it is limited: at its first call on rank 1 */
        for (int i = 0; i < 10000 && access(ready, F_OK) != 0; i++)
            pp_sleep_ns(1000000);
        unlink(ready);
        if (comm_recv(c, 1, 2, b, sizeof b, 10000, rep) < 0) return -1;
        comm_send(c, 1, 1, b, sizeof b, rep); /* goes into the socket, or fails once rank 1 closed it */
        pp_sleep_ns(1000000000);              /* alive while rank 1 waits: not "exited" */
        comm_close(c);
        return CW_CLOSED;
    }
    /* Rank 0's endpoint read from the exchange (a folder only root reads)
     * and tag 2 sent, then no thread left to start. */
    if (comm_send(c, 0, 2, b, sizeof b, rep) < 0 || comm_flush(c, 10000, rep) < 0) return -1;
    struct rlimit none_left = {(rlim_t)count_tasks(), (rlim_t)count_tasks()};
    if (setrlimit(RLIMIT_NPROC, &none_left) != 0 || setresuid(NO_THREADS_UID, NO_THREADS_UID, 0) != 0)
        return pp_fail(rep, "cannot limit this rank's threads: %s", strerror(errno));
    int f = open(ready, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (f < 0) return pp_fail(rep, "cannot make %s: %s", ready, strerror(errno));
    close(f);
    uint64_t t0 = pp_now_ns();
    int rc = comm_recv(c, 0, 1, b, sizeof b, 10000, rep);
    snprintf(rep->msg + strlen(rep->msg), sizeof rep->msg - strlen(rep->msg), " [after %d ms]",
             (int)((pp_now_ns() - t0) / 1000000));
    if (setresuid(0, 0, 0) != 0) return pp_fail(rep, "cannot be root again: %s", strerror(errno));
    return rc == 0 ? pp_fail(rep, "received from rank 0 without a reader thread") : 2;
}

Test(comm_tcp, a_reader_thread_that_cannot_start_fails_the_receive_naming_why, .timeout = 60) {
    if (geteuid() != 0) cr_skip_test("needs root: to run a rank as a user with a limit on threads");
    cw_result r;
    capture cap;
    capture_start(&cap);
    int rc = cw_run(2, NULL, "tcp", no_reader_fn, &r, &r);
    const char *err = capture_end(&cap);
    char ready[160];
    snprintf(ready, sizeof ready, "/tmp/pprun-test-%s.limited", r.job_key);
    unlink(ready); /* rank 0 removes it, unless it gave up waiting */
    cr_assert_eq(rc, 0);
    const char *m = r.report[1];
    cr_assert(r.exited[1] && r.code[1] == 1, "%s", m);
    cr_assert(strstr(m, "comm: rank 0 cannot be read: rank 1 could not start a thread to read it (Resource "
                        "temporarily unavailable); rank 1 was waiting for tag 0x1") &&
                  !strstr(m, "timed out"),
              "%s", m);
    int ms = -1;
    const char *after = strstr(m, "[after ");
    cr_assert(after && sscanf(after, "[after %d ms]", &ms) == 1 && ms < 5000, "%s", m);
    cr_assert(strstr(err, "pprun comm (rank 1): comm: cannot start the reader thread for rank 0: Resource temporarily "
                          "unavailable: the limit on threads was hit: this user's (RLIMIT_NPROC, `ulimit -u`: "),
              "%s", err);
}

/* ---- strangers at a rank's port ---------------------------------------------- */

enum { STRANGERS = 100 }; /* more than COMM_TCP_PENDING_MAX: the oldest are let go */

/* Rank 1 lets STRANGERS connections to its port in (a port scan, someone
 * without the job: each connects and says nothing), then tells rank 0,
 * which sends. Each stranger used to hold rank 1's monitor for the 2 s
 * its hello was waited for, one after another: rank 0's hello went
 * unanswered past its connect timeout (10 s), and the job failed. arg: the
 * file that tells rank 0. */
static int strangers_fn(comm *c, int rank, void *arg, pp_err *rep) {
    const char *in = arg;
    int v = 42;
    if (rank == 0) {
        for (int i = 0; i < 3000 && access(in, F_OK) != 0; i++) usleep(10000);
        return comm_send(c, 1, 3, &v, sizeof v, rep) < 0 || comm_flush(c, 10000, rep) < 0 ? -1 : 0;
    }
    int fds[STRANGERS], n = 0;
    for (; n < STRANGERS; n++) {
        pp_err e;
        if ((fds[n] = net_connect("127.0.0.1", c->port, 1000, 0, &e)) < 0) {
            pp_fail(rep, "stranger %d cannot connect: %s", n, e.msg);
            break;
        }
    }
    int rc = n == STRANGERS ? 0 : -1;
    close(open(in, O_WRONLY | O_CREAT, 0600));
    if (rc == 0) rc = comm_recv(c, 0, 3, &v, sizeof v, 20000, rep);
    if (rc == 0 && v != 42) rc = pp_fail(rep, "rank 0 sent 42, got %d", v);
    while (n > 0) close(fds[--n]);
    return rc;
}

Test(comm_tcp, strangers_that_connect_and_say_nothing_do_not_hold_up_the_job, .timeout = 60) {
    char in[256];
    snprintf(in, sizeof in, "%s", tfix_path("strangers-in")); /* removed when the test process exits */
    cw_result r;
    cr_assert_eq(cw_run(2, NULL, "tcp", strangers_fn, in, &r), 0);
    expect_all_ok(&r, 2);
}
