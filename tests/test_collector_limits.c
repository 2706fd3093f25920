/* test_collector_limits.c: the master collector's ingest listener under the
 * load a big job or a hostile network puts on it, over real sockets: idle
 * strangers lose their slot at the hello deadline, hundreds of forwarding
 * nodes all get in and one past the limit is told why, a sender that stops
 * mid-frame is closed with its earlier frames kept, frames in progress are
 * capped together (a frame past the cap waits for room instead of growing
 * the launcher), a master out of file descriptors answers instead of
 * leaving forwarders waiting, and a node brings its own ranks' records
 * only. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/db.h"
#include "helpers/capture.h"
#include "helpers/trace_fixture.h"
#include "runner/job/collector.h"
#include "tracer/event.h"
#include "tracer/ring.h"

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* 1 once the master closed fd (EOF or reset), 0 if it still holds it
 * after 5 s. */
static int closed_by_master(int fd) {
    char b[64];
    ssize_t n;
    while ((n = recv(fd, b, sizeof b, 0)) > 0) {
    }
    return n == 0 || errno == ECONNRESET;
}

/* A forwarding node with one ring holding one F record of rank, step 0. */
static collector *node_with_one_record(int64_t job, int world, int port, int rank, pp_err *err) {
    collector *node;
    collector_config nc = {
        .job_id = job, .world_size = world, .forward_host = "127.0.0.1", .forward_port = port, .interval_ns = 20000000};
    if (collector_start(&nc, &node, err) != 0) return NULL;
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, err), 0, "%s", err->msg);
    cr_assert_eq(collector_add_ring(node, rank, r, err), 0, "%s", err->msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, err), 0, "%s", err->msg);
    trace_event e = tfix_one_f(rank, 0, 0);
    trace_ring_write(w, &e);
    trace_ring_close(w);
    return node;
}

typedef struct wire_hdr {
    uint32_t magic;
    uint16_t version, nranks;
    int64_t job_id;
    uint32_t nrecords, pad;
} wire_hdr;

/* Connections that never finish a hello hold a slot only until the hello
 * deadline: then the master closes them, one line each (at most 10 per 10 s,
 * the rest counted), and a forwarding node gets the slot. */
Test(collector_limits, idle_strangers_lose_their_slot_at_the_hello_deadline, .timeout = 60) {
    enum { IDLE = 14, SLOTS = IDLE - 1 };
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("idle.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master;
    collector_config mc = {.db = d,
                           .job_id = job,
                           .world_size = 2,
                           .listen_host = "127.0.0.1",
                           .token = "right-token-0123",
                           .hello_timeout_ns = 300000000,
                           .max_forwarders = SLOTS};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    /* One that sends half a hello, closed before the others come, so its
     * line is the first of the ten shown (connections that expire together
     * are closed in no order the test could rely on); then every slot
     * taken by silent sockets. */
    int idle[IDLE];
    idle[0] = dial(port);
    cr_assert_eq(write(idle[0], "PPHI", 4), 4);
    cr_assert(closed_by_master(idle[0]), "the half hello still held");
    for (int i = 1; i < IDLE; i++)
        idle[i] = dial(port);
    for (int i = 1; i < IDLE; i++)
        cr_assert(closed_by_master(idle[i]), "idle connection %d still held", i);
    for (int i = 0; i < IDLE; i++)
        close(idle[i]);

    collector *node;
    collector_config nc = {
        .job_id = job, .world_size = 2, .forward_host = "127.0.0.1", .forward_port = port, .token = "right-token-0123"};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "a forwarder after the strangers: %s", err.msg);
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node, 1, r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    trace_event e = tfix_one_f(1, 1, 0);
    trace_ring_write(w, &e);
    trace_ring_close(w);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1, "the forwarder's record is in");
    cr_assert_eq(capture_count(text, "pprun collector: closed a connection from 127.0.0.1:"), 10,
                 "ten lines naming the peer, then a count:\n%s", text);
    cr_assert_eq(capture_count(text, "no hello within 0.3 s"), 10, "%s", text);
    cr_assert(strstr(text, "(4 bytes of one)"), "the half hello is reported: %s", text);
    cr_assert(strstr(text, "pprun collector: 4 more lines about forwarding connections were left out"), "%s", text);
    db_close(d);
}

/* A job with more nodes than the 256 slots the listener once had: every
 * forwarding node gets in and its record lands. */
Test(collector_limits, three_hundred_forwarding_nodes_all_land, .timeout = 120) {
    enum { NODES = 300 };
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 4 * NODES) {
        rl.rlim_cur = rl.rlim_max < 4 * NODES ? rl.rlim_max : 4 * NODES;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 3 * NODES + 64)
        cr_skip_test("needs %d open files (ulimit -n is %llu)", 3 * NODES + 64, (unsigned long long)rl.rlim_cur);
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("many.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master;
    collector_config mc = {.db = d, .job_id = job, .world_size = NODES, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    collector *nodes[NODES];
    for (int i = 0; i < NODES; i++) {
        nodes[i] = node_with_one_record(job, NODES, collector_listen_port(master), i, &err);
        cr_assert_not_null(nodes[i], "node %d of %d was refused: %s", i, NODES, err.msg);
    }
    for (int i = 0; i < NODES; i++)
        cr_assert_eq(collector_stop(nodes[i], &err), 0, "node %d: %s", i, err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(DISTINCT rank) FROM events"), NODES);
    db_close(d);
}

/* One node past the limit is not dropped in silence: its collector_start
 * fails saying why, and the master's stderr names it. */
Test(collector_limits, a_node_past_the_limit_is_told_why, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("full.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master, *a, *b, *extra;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1", .max_forwarders = 2};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    cr_assert_not_null(a = node_with_one_record(job, 2, port, 0, &err), "%s", err.msg);
    cr_assert_not_null(b = node_with_one_record(job, 2, port, 1, &err), "%s", err.msg);
    extra = node_with_one_record(job, 2, port, 1, &err);
    cr_assert_null(extra, "a third node was taken past the limit of 2");
    char want[128];
    snprintf(want, sizeof want, "the trace collector at 127.0.0.1:%d cannot take another forwarding node", port);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    cr_assert_eq(collector_stop(a, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(b, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "pprun collector: refused a forwarding connection from 127.0.0.1:"), "%s", text);
    cr_assert(strstr(text, "already serving 2 forwarding connections, the most it takes"), "%s", text);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 2, "both nodes in the limit wrote");
    db_close(d);
}

/* A sender that stops mid-frame is closed at the frame deadline; the frame
 * it completed before is in the database, the half one is not. */
Test(collector_limits, a_frame_left_half_sent_is_closed_and_earlier_frames_kept, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("half.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master;
    collector_config mc = {
        .db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1", .frame_timeout_ns = 300000000};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int fd = dial(collector_listen_port(master));
    wire_hdr h = {0x57465050u, 1, 0, job, 1, 0};
    trace_event ev = tfix_one_f(1, 1, 0);
    cr_assert_eq(write(fd, &h, sizeof h), (ssize_t)sizeof h);
    cr_assert_eq(write(fd, &ev, sizeof ev), (ssize_t)sizeof ev);
    h.nrecords = 3; /* the second frame: its header and one record of three */
    ev.step = 1;
    cr_assert_eq(write(fd, &h, sizeof h), (ssize_t)sizeof h);
    cr_assert_eq(write(fd, &ev, sizeof ev), (ssize_t)sizeof ev);
    cr_assert(closed_by_master(fd), "the master still holds a connection stuck mid-frame");
    close(fd);
    cr_assert_eq(collector_count(master), 1);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "pprun collector: closed a connection from 127.0.0.1:"), "%s", text);
    cr_assert(strstr(text, "still incomplete (88 bytes dropped; the frames before it are kept)"), "%s", text);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT step FROM events"), 0);
    db_close(d);
}

/* Under AddressSanitizer freed memory waits in a quarantine and every byte
 * has shadow bytes: resident memory says nothing about what the master
 * holds, so it is checked only without. */
#ifdef __SANITIZE_ADDRESS__
#define RSS_SAYS_WHAT_IS_HELD 0
#else
#define RSS_SAYS_WHAT_IS_HELD 1
#endif

/* The peak of this process's resident memory (VmHWM): it runs the master,
 * which may read what it was sent some time after the send returned. */
static uint64_t peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) != 1) {
    }
    fclose(f);
    cr_assert_gt(kb, 0, "no VmHWM in /proc/self/status");
    return kb << 10;
}

/* Sends what the master takes of n bytes within 200 ms of it taking
 * nothing (a frame waiting for room is not read); returns the bytes sent. */
static size_t send_what_is_taken(int fd, const void *buf, size_t n) {
    const char *p = buf;
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, p + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            sent += (size_t)w;
            continue;
        }
        cr_assert(w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EPIPE || errno == ECONNRESET),
                  "send: %s", strerror(errno));
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) break;
        if (poll(&pfd, 1, 200) == 0) break;
    }
    return sent;
}

/* Twenty connections each start a frame of the most records a frame holds
 * (4 MiB) and send 3 MiB of it: without a cap the master held all 60 MiB.
 * With frames in progress capped at 16 MiB (max_buffered) the ones past
 * the cap are not read, so the master's peak grows by less than half of
 * that;
 * the stalled frames are closed at their deadline (counted from when room
 * was found for them), and a real forwarder's frame that had to wait for
 * room lands whole: no record is lost to the cap. */
Test(collector_limits, frames_in_progress_are_capped_and_wait_for_room, .timeout = 60) {
    enum { HOGS = 20, SENT = 3 << 20, NREC = 1000 };
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("room.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master;
    collector_config mc = {.db = d,
                           .job_id = job,
                           .world_size = 2,
                           .listen_host = "127.0.0.1",
                           .frame_timeout_ns = 500000000,
                           .max_buffered = 16u << 20};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    char *junk = calloc(1, SENT);
    cr_assert_not_null(junk);
    memset(junk, 0x5a, SENT); /* resident before the baseline */
    uint64_t before = peak_rss_bytes();
    int hogs[HOGS];
    wire_hdr h = {0x57465050u, 1, 0, job, 65536, 0};
    for (int i = 0; i < HOGS; i++) {
        hogs[i] = dial(port);
        cr_assert_eq(send_what_is_taken(hogs[i], &h, sizeof h), sizeof h);
        send_what_is_taken(hogs[i], junk, SENT);
    }

    /* A forwarder whose one frame (1000 records, 64 KB) needs room the hogs
     * hold: it waits, then lands whole. The records are in the ring before
     * the collector sees it, so they go as one frame. */
    collector *node;
    collector_config nc = {.job_id = job, .world_size = 2, .forward_host = "127.0.0.1", .forward_port = port};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(2 * NREC, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    for (int i = 0; i < NREC; i++) {
        trace_event e = tfix_one_f(1, 1, i % 4);
        trace_ring_write(w, &e);
    }
    trace_ring_close(w);
    cr_assert_eq(collector_add_ring(node, 1, r, &err), 0, "%s", err.msg);
    for (int tries = 0; tries < 2000 && collector_count(master) < NREC; tries++) usleep(10000);
    cr_assert_eq(collector_count(master), NREC, "the forwarder's frame never got room");
    for (int i = 0; i < HOGS; i++) {
        cr_assert(closed_by_master(hogs[i]), "hog %d still held", i);
        close(hogs[i]);
    }
    /* Every hog was read as far as it will be (and closed): the peak holds
     * whatever the master ever buffered. */
    uint64_t grew = peak_rss_bytes() - before;
    if (RSS_SAYS_WHAT_IS_HELD)
        cr_assert_lt(grew, (uint64_t)HOGS * SENT / 2, "%d unfinished frames of 3 MiB grew the master by %" PRIu64
                     " MiB", HOGS, grew >> 20);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "pprun collector: closed a connection from 127.0.0.1:"), "%s", text);
    cr_assert(strstr(text, "is still incomplete"), "%s", text);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), NREC);
    free(junk);
    db_close(d);
}

/* A frame listing more ranks than the job has (a forwarder lists each of
 * its ranks once) is a forged one: its connection is dropped. */
Test(collector_limits, a_frame_with_more_ranks_than_the_job_is_dropped, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("ranks.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int fd = dial(collector_listen_port(master));
    wire_hdr h = {0x57465050u, 1, 3, job, 1, 0};
    struct {
        int32_t rank, pad;
        int64_t off;
        uint64_t dropped;
    } ranks[3] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}};
    trace_event ev = tfix_one_f(1, 1, 0);
    /* One send: the master may close as soon as it has read the rank list,
     * and a later write would then raise SIGPIPE in the test. */
    char frame[sizeof h + sizeof ranks + sizeof ev];
    memcpy(frame, &h, sizeof h);
    memcpy(frame + sizeof h, ranks, sizeof ranks);
    memcpy(frame + sizeof h + sizeof ranks, &ev, sizeof ev);
    cr_assert_eq(send(fd, frame, sizeof frame, MSG_NOSIGNAL), (ssize_t)sizeof frame);
    cr_assert(closed_by_master(fd));
    close(fd);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "bad frame (magic 57465050, version 1, job"), "%s", text);
    cr_assert(strstr(text, "3 ranks, 1 records)"), "%s", text);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 0);
    db_close(d);
}

/* One hand-made frame from a forwarder of rank 1 with clock offset off
 * and one F record (tfix_one_f, at 2 ms); fd stays open. */
static void send_offset_frame(int fd, int64_t job, int64_t off) {
    wire_hdr h = {0x57465050u, 1, 1, job, 1, 0};
    struct {
        int32_t rank, pid;
        int64_t off;
        uint64_t dropped;
    } rank = {1, 0, off, 0};
    trace_event ev = tfix_one_f(1, 1, 0);
    char frame[sizeof h + sizeof rank + sizeof ev];
    memcpy(frame, &h, sizeof h);
    memcpy(frame + sizeof h, &rank, sizeof rank);
    memcpy(frame + sizeof h + sizeof rank, &ev, sizeof ev);
    cr_assert_eq(send(fd, frame, sizeof frame, MSG_NOSIGNAL), (ssize_t)sizeof frame);
}

/* A forwarder's clock offset has a bound of its own (TRACE_OFFSET_MAX,
 * tracer/event.h): past it the frame is dropped with its connection, the
 * node's address and the value named, nothing stored (added to a record's
 * time, INT64_MAX overflowed into a negative time). Within it, a record the
 * offset shifts past TRACE_TIME_MAX is refused and counted as a record
 * with bad times; a sane offset still lands. */
Test(collector_limits, a_clock_offset_past_its_bound_is_refused_naming_the_node, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("offset.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    capture cap;
    capture_start(&cap);
    collector *master;
    collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1"};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    int fd = dial(port);
    send_offset_frame(fd, job, INT64_MAX);
    cr_assert(closed_by_master(fd), "a frame with offset INT64_MAX still held");
    close(fd);
    fd = dial(port);
    send_offset_frame(fd, job, TRACE_TIME_MAX - 1000);
    send_offset_frame(fd, job, 5000);
    close(fd);
    for (int i = 0; i < 500 && collector_rejected(master) == 0; i++) pp_sleep_ns(10000000);
    uint64_t rejected = collector_rejected(master);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "dropping a forwarding connection from 127.0.0.1:"), "%s", text);
    cr_assert(strstr(text, "rank 1's clock offset 9223372036854775807 ns"), "%s", text);
    cr_assert(strstr(text, "4611686018427387903"), "the bound is named: %s", text);
    cr_assert(strstr(text, "refusing trace records of rank 1 step 0 whose times or bytes are bad"), "%s", text);
    cr_assert_eq(rejected, 1);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1, "only the sane frame's record");
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT min(start_ns) FROM events"), 2000000 + 5000);
    db_close(d);
}

/* A master out of file descriptors answers a forwarder at once ("out of
 * file descriptors") instead of leaving it waiting 10 s for an answer that
 * never comes. The master runs in a child with a low ulimit -n. */
Test(collector_limits, a_master_out_of_descriptors_answers_forwarders, .timeout = 60) {
    capture cap;
    capture_start(&cap);
    int up[2], down[2];
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    const char *path = tfix_path("nofd.db");
    pid_t pid = fork();
    if (pid == 0) {
        /* Only the parent's ends open: its death wakes this child. */
        close(up[0]);
        close(down[1]);
        db *d;
        pp_err err;
        collector *master;
        if (db_open(path, &d, &err) != 0) _exit(3);
        int64_t job = tfix_job(d);
        collector_config mc = {.db = d, .job_id = job, .world_size = 2, .listen_host = "127.0.0.1"};
        if (collector_start(&mc, &master, &err) != 0) _exit(4);
        /* Room for one more descriptor: the first forwarder's. */
        int lowest = dup(0);
        close(lowest);
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = (rlim_t)lowest + 1;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(5);
        int msg[2] = {collector_listen_port(master), (int)job};
        if (write(up[1], msg, sizeof msg) != sizeof msg) _exit(6);
        char go;
        if (read(down[0], &go, 1) != 1) _exit(7);
        _exit(collector_stop(master, &err) == 0 ? 0 : 8);
    }
    close(up[1]);
    close(down[0]);
    int msg[2];
    cr_assert_eq(read(up[0], msg, sizeof msg), (ssize_t)sizeof msg, "the master did not start");
    pp_err err;
    collector *a = node_with_one_record(msg[1], 2, msg[0], 0, &err);
    cr_assert_not_null(a, "the first forwarder: %s", err.msg);
    uint64_t t0 = pp_now_ns();
    collector *b = node_with_one_record(msg[1], 2, msg[0], 1, &err);
    uint64_t waited = pp_now_ns() - t0;
    cr_assert_null(b, "a forwarder past the descriptors was taken");
    cr_assert(strstr(err.msg, "cannot take another forwarding node"), "%s", err.msg);
    cr_assert_lt(waited, 5000000000ull, "the forwarder waited %.1f s for its answer", waited / 1e9);
    cr_assert_eq(collector_stop(a, &err), 0, "%s", err.msg);
    cr_assert_eq(write(down[1], "x", 1), 1);
    int st;
    waitpid(pid, &st, 0);
    const char *text = capture_end(&cap);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the master's process failed (%d):\n%s", st, text);
    cr_assert(strstr(text, "this process is out of file descriptors (raise ulimit -n)"), "%s", text);
    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1, "the first forwarder's record");
    db_close(d);
}

/* A connection that never sent a byte does not hold the master's stop for
 * its grace: pprun run ends when the forwarders are done, not 30 s later. */
Test(collector_limits, an_idle_stranger_does_not_hold_the_stop, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("stop.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *master, *node;
    collector_config mc = {.db = d,
                           .job_id = job,
                           .world_size = 2,
                           .listen_host = "127.0.0.1",
                           .stop_grace_ns = 30000000000ull,
                           .hello_timeout_ns = 30000000000ull};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int idle = dial(collector_listen_port(master));
    cr_assert_not_null(node = node_with_one_record(job, 2, collector_listen_port(master), 1, &err), "%s", err.msg);
    cr_assert_eq(collector_stop(node, &err), 0, "%s", err.msg);
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    uint64_t took = pp_now_ns() - t0;
    cr_assert_lt(took, 15000000000ull, "the stop waited %.1f s for a connection that sent nothing", took / 1e9);
    cr_assert(closed_by_master(idle));
    close(idle);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 1, "the forwarder's record is in");
    db_close(d);
}

/* A master that answers the hello, then never reads again: stopped, frozen
 * or cut off, with the connection still open. */
typedef struct deaf_master {
    int lfd, port;
    int conn; /* the forwarder's connection, once accepted */
    pthread_t thread;
} deaf_master;

static void *deaf_master_run(void *arg) {
    deaf_master *m = arg;
    m->conn = accept(m->lfd, NULL, NULL);
    char hello[512];
    ssize_t n = recv(m->conn, hello, sizeof hello, 0); /* one small hello: one recv */
    unsigned char ok = 1;
    if (n > 0) (void)!send(m->conn, &ok, 1, MSG_NOSIGNAL);
    return NULL;
}

/* ...must not keep a forwarding node's collector_stop (and so its
 * launcher's exit) waiting longer than stop_grace_ns. */
Test(collector_limits, a_master_that_stops_reading_does_not_hold_a_forwarders_stop, .timeout = 60) {
    deaf_master m = {.conn = -1};
    m.lfd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096; /* the accepted socket inherits it: little fits in flight */
    setsockopt(m.lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    cr_assert(bind(m.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(m.lfd, 4) == 0);
    cr_assert_eq(getsockname(m.lfd, (struct sockaddr *)&sa, &sl), 0);
    m.port = ntohs(sa.sin_port);
    cr_assert_eq(pthread_create(&m.thread, NULL, deaf_master_run, &m), 0);

    pp_err err;
    collector *node;
    collector_config nc = {.job_id = 1, .world_size = 2, .forward_host = "127.0.0.1", .forward_port = m.port,
                           .interval_ns = 5000000, .stop_grace_ns = 300000000};
    cr_assert_eq(collector_start(&nc, &node, &err), 0, "%s", err.msg);
    pthread_join(m.thread, NULL);
    /* 8 MB of records: more than the sender's socket buffer (at most 4 MB
     * here) and the master's 4 KB together. */
    enum { NREC = 1 << 17 };
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(NREC, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node, 1, r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    for (int i = 0; i < NREC - 1; i++) {
        trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = 1, .step = i, .stage = 0,
                         .peer = -1, .start_ns = 2000000 + (uint64_t)i, .end_ns = 2001000 + (uint64_t)i};
        trace_ring_write(w, &e);
    }
    trace_ring_close(w);
    usleep(200000); /* the collector fills the socket and blocks */
    cr_assert_eq(collector_stop(node, &err), -1, "the records cannot all have reached a master that reads nothing");
    cr_assert(strstr(err.msg, "127.0.0.1") && strstr(err.msg, "took nothing"), "%s", err.msg);
    close(m.conn);
    close(m.lfd);
}

/* A job of 3 nodes with 2 ranks each; returns its id. */
static int64_t three_node_job(db *d) {
    db_job_info j = {.name = "nodes", .nnodes = 3, .world_size = 6, .schedule = "1f1b", .microbatches = 2,
                     .virtual_stages = 1, .stages = 6, .steps = 2, .model = "timed", .device = "cpu",
                     .t0_ns = 1000000};
    int64_t id = -1;
    pp_err err;
    cr_assert_eq(db_create_job(d, &j, &id, &err), 0, "%s", err.msg);
    db_rank_info r[6];
    const char *stages[6] = {"0", "1", "2", "3", "4", "5"};
    for (int k = 0; k < 6; k++) r[k] = (db_rank_info){k, k / 2, "host", 0, "cpu", stages[k], 0};
    cr_assert_eq(db_insert_ranks(d, id, r, 6, &err), 0, "%s", err.msg);
    return id;
}

/* A raw connection that presents the token and is accepted. */
static int dial_with_token(int port, const char *token) {
    int fd = dial(port);
    unsigned char hello[8 + 64];
    uint32_t magic = 0x49485050u; /* "PPHI" */
    uint16_t ver = 1, len = (uint16_t)strlen(token);
    memcpy(hello, &magic, 4);
    memcpy(hello + 4, &ver, 2);
    memcpy(hello + 6, &len, 2);
    memcpy(hello + 8, token, len);
    cr_assert_eq(send(fd, hello, 8u + len, MSG_NOSIGNAL), (ssize_t)(8 + len));
    unsigned char ok = 0;
    cr_assert_eq(recv(fd, &ok, 1, 0), 1);
    cr_assert_eq(ok, 1, "the hello with the token was refused");
    return fd;
}

/* One frame as a forwarder sends it: rank's clock offset and pid, and one
 * F record of that rank at 7 ms (the master's own records are at 2 ms). */
static void send_rank_frame(int fd, int64_t job, int rank) {
    wire_hdr h = {0x57465050u, 1, 1, job, 1, 0};
    struct {
        int32_t rank, pid;
        int64_t off;
        uint64_t dropped;
    } fr = {rank, 4242, 5000, 77};
    trace_event ev = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .step = 0, .stage = rank,
                      .peer = -1, .start_ns = 7000000, .end_ns = 7001000};
    char frame[sizeof h + sizeof fr + sizeof ev];
    memcpy(frame, &h, sizeof h);
    memcpy(frame + sizeof h, &fr, sizeof fr);
    memcpy(frame + sizeof h + sizeof fr, &ev, sizeof ev);
    cr_assert_eq(send(fd, frame, sizeof frame, MSG_NOSIGNAL), (ssize_t)sizeof frame);
}

/* The token says a sender is one of the job's nodes, not which one. A
 * node may bring its own ranks' records only (the rendezvous gives node n
 * ranks 2n and 2n+1 here): a frame that claims one of the master's ranks,
 * one of a second node's after its first, or a node's that another
 * connection brings drops its connection, naming the peer and the rank;
 * nothing of it is recorded (records, clock offset, pid, drops), its
 * records are counted, and the ranks' own records stay as they were. */
Test(collector_limits, a_node_that_claims_ranks_not_its_own_is_dropped, .timeout = 60) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("claims.db"), &d, &err), 0, "%s", err.msg);
    int64_t job = three_node_job(d);
    capture cap;
    capture_start(&cap);
    const char *token = "right-token-0123";
    collector *master, *node1;
    collector_config mc = {.db = d, .job_id = job, .world_size = 6, .node_ranks = 2, .listen_host = "127.0.0.1",
                           .token = token, .interval_ns = 5000000};
    cr_assert_eq(collector_start(&mc, &master, &err), 0, "%s", err.msg);
    int port = collector_listen_port(master);
    for (int rank = 0; rank < 2; rank++) { /* the master's own ranks, one record each */
        trace_ring *r, *w;
        cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
        cr_assert_eq(collector_add_ring(master, rank, r, &err), 0, "%s", err.msg);
        cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
        trace_event e = tfix_one_f(rank, rank, 0);
        trace_ring_write(w, &e);
        trace_ring_close(w);
    }
    /* Node 1, as a launcher forwards: rank 2. */
    collector_config nc = {.job_id = job, .world_size = 6, .forward_host = "127.0.0.1", .forward_port = port,
                           .token = token, .interval_ns = 5000000};
    cr_assert_eq(collector_start(&nc, &node1, &err), 0, "%s", err.msg);
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_add_ring(node1, 2, r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    trace_event e = tfix_one_f(2, 2, 0);
    trace_ring_write(w, &e);
    trace_ring_close(w);
    for (int i = 0; i < 3000 && collector_count(master) < 3; i++) pp_sleep_ns(10000000);
    cr_assert_eq(collector_count(master), 3, "the master's two records and node 1's");

    /* One of the master's own ranks. */
    int fd = dial_with_token(port, token);
    send_rank_frame(fd, job, 1);
    cr_assert(closed_by_master(fd), "a frame claiming the master's rank 1 was taken");
    close(fd);
    /* Node 2's rank 4, then node 1's rank 3 on the same connection. */
    fd = dial_with_token(port, token);
    send_rank_frame(fd, job, 4);
    send_rank_frame(fd, job, 3);
    cr_assert(closed_by_master(fd), "a connection brought two nodes' ranks");
    close(fd);
    /* Node 1's rank 3, from another connection than node 1's. */
    fd = dial_with_token(port, token);
    send_rank_frame(fd, job, 3);
    cr_assert(closed_by_master(fd), "a second connection brought node 1's ranks");
    close(fd);
    uint64_t rejected = collector_rejected(master);
    cr_assert_eq(collector_stop(node1, &err), 0, "%s", err.msg);
    cr_assert_eq(collector_stop(master, &err), 0, "%s", err.msg);
    const char *text = capture_end(&cap);
    cr_assert(strstr(text, "dropping a forwarding connection from 127.0.0.1:"), "%s", text);
    cr_assert(strstr(text, ": its frame claims rank 1, one of the master's own ranks"), "%s", text);
    cr_assert(strstr(text, ": its frame claims rank 3 of node 1, but it brings node 2's ranks (4..5;"), "%s", text);
    cr_assert(strstr(text, ": its frame claims rank 3 of node 1, whose ranks come from 127.0.0.1:"), "%s", text);
    cr_assert_eq(rejected, 3, "one record in each refused frame");
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank = 1"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT start_ns FROM events WHERE rank = 1"), 2000000, "the master's own record");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank = 3"), 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank IN (0, 2, 4)"), 3,
                 "the ranks' own records, and node 2's first frame");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM ranks WHERE rank IN (1, 3) AND (clock_offset_ns != 0 OR "
                               "pid IS NOT NULL OR dropped_events != 0)"),
                 0, "nothing of a refused frame is recorded");
    db_close(d);
}
