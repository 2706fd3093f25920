/* test_trace_ring.c: the shared-memory trace ring between real processes:
 * nothing lost or duplicated, wrap-around, drops counted, no torn record
 * after a producer is killed mid-write, version check on attach; a
 * worker that scribbles over the header or shrinks the memfd harms only
 * its own trace. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "tracer/ring.h"

/* A record whose every field derives from i, with a checksum over them in
 * `reserved`: a torn record (half old, half new) fails the check. */
static void make(trace_event *e, uint64_t i, int run) {
    memset(e, 0, sizeof *e);
    e->version = TRACE_EVENT_VERSION;
    e->phase = (uint8_t)(i % 8);
    e->attempt = run;
    e->rank = (int32_t)(i * 7 % 1000);
    e->step = (int32_t)(i >> 20);
    e->microbatch = (int32_t)(i & 0xfffff);
    e->stage = (int32_t)(i % 13);
    e->peer = -1;
    e->start_ns = i;
    e->end_ns = i * 3 + 1;
    e->bytes = i ^ 0x5a5a5a5a5aull;
    e->value = (double)i;
    e->reserved = (int32_t)((i * 2654435761u) ^ (uint64_t)run);
}

static int intact(const trace_event *e, int *run, uint64_t *i) {
    trace_event want;
    make(&want, e->start_ns, e->attempt);
    *run = e->attempt;
    *i = e->start_ns;
    return memcmp(&want, e, sizeof want) == 0;
}

/* Producer that never drops: waits while the ring is full. */
static void produce(int fd, uint64_t n, int run) {
    trace_ring *r;
    pp_err err;
    if (trace_ring_attach(fd, &r, &err) != 0) _exit(3);
    size_t cap = trace_ring_capacity(r);
    trace_event e;
    for (uint64_t i = 0; i < n; i++) {
        while (trace_ring_pending(r) >= cap) sched_yield();
        make(&e, i, run);
        trace_ring_write(r, &e);
    }
    trace_ring_close(r);
    _exit(0);
}

Test(trace_ring, ten_million_records_between_processes_none_lost_or_duplicated, .timeout = 120) {
    const uint64_t n = 10000000;
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(4096, &r, &err), 0, "%s", err.msg);
    pid_t pid = fork();
    if (pid == 0) produce(trace_ring_fd(r), n, 0);
    trace_event *buf = malloc(1024 * sizeof *buf);
    uint64_t next = 0;
    int bad = 0;
    while (next < n) {
        size_t got = trace_ring_read(r, buf, 1024);
        if (got == 0) {
            sched_yield();
            continue;
        }
        for (size_t k = 0; k < got; k++) {
            int run;
            uint64_t i;
            if (!intact(&buf[k], &run, &i) || i != next) bad++;
            next = i + 1;
        }
        if (bad) break;
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert_eq(bad, 0, "records out of sequence or damaged near %llu", (unsigned long long)next);
    cr_assert_eq(next, n);
    cr_assert_eq(trace_ring_read(r, buf, 1024), 0, "no record after the last one");
    cr_assert_eq(trace_ring_dropped(r), 0);
    free(buf);
    trace_ring_close(r);
}

Test(trace_ring, wraps_around_many_times_in_order) {
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(5, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(trace_ring_capacity(r), 8, "capacity rounds up to a power of two");
    trace_event e, out[8];
    uint64_t next = 0, written = 0;
    for (int round = 0; round < 1000; round++) {
        int k = 1 + round % 8; /* batches that straddle the end of the ring */
        for (int j = 0; j < k; j++) {
            make(&e, written++, 0);
            trace_ring_write(r, &e);
        }
        size_t got = trace_ring_read(r, out, 8);
        cr_assert_eq(got, (size_t)k);
        for (size_t j = 0; j < got; j++) {
            int run;
            uint64_t i;
            cr_assert(intact(&out[j], &run, &i));
            cr_assert_eq(i, next++);
        }
    }
    cr_assert_eq(trace_ring_dropped(r), 0);
    trace_ring_close(r);
}

Test(trace_ring, full_ring_counts_drops_and_keeps_the_oldest) {
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    trace_event e, out[32];
    for (uint64_t i = 0; i < 40; i++) {
        make(&e, i, 0);
        cr_assert_eq(trace_ring_write(r, &e), i < 16, "record %llu: written only while there is room",
                     (unsigned long long)i);
    }
    cr_assert_eq(trace_ring_dropped(r), 24);
    cr_assert_eq(trace_ring_read(r, out, 32), 16);
    for (int j = 0; j < 16; j++) cr_assert_eq(out[j].start_ns, (uint64_t)j);
    /* Room again: writing resumes. */
    make(&e, 99, 0);
    cr_assert_eq(trace_ring_write(r, &e), 1);
    cr_assert_eq(trace_ring_read(r, out, 32), 1);
    cr_assert_eq(out[0].start_ns, 99);
    cr_assert_eq(trace_ring_dropped(r), 24);
    trace_ring_close(r);
}

Test(trace_ring, producer_killed_mid_write_leaves_no_torn_record, .timeout = 120) {
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(256, &r, &err), 0, "%s", err.msg);
    trace_event buf[256];
    uint64_t seen = 0;
    for (int run = 1; run <= 60; run++) {
        pid_t pid = fork();
        if (pid == 0) produce(trace_ring_fd(r), UINT64_MAX, run); /* until killed */
        /* Read while it writes, then kill it at some point of its loop. */
        uint64_t expect = 0, target = 1000 + (uint64_t)(run * 7919) % 50000;
        while (expect < target) {
            size_t got = trace_ring_read(r, buf, 256);
            for (size_t k = 0; k < got; k++) {
                int rr;
                uint64_t i;
                cr_assert(intact(&buf[k], &rr, &i), "torn record in run %d", run);
                cr_assert_eq(rr, run);
                cr_assert_eq(i, expect++);
            }
        }
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        size_t got;
        while ((got = trace_ring_read(r, buf, 256)) > 0)
            for (size_t k = 0; k < got; k++) {
                int rr;
                uint64_t i;
                cr_assert(intact(&buf[k], &rr, &i), "torn record after kill in run %d", run);
                cr_assert_eq(i, expect++, "run %d: records lost or repeated", run);
            }
        seen += expect;
    }
    cr_assert_gt(seen, 0);
    cr_assert_eq(trace_ring_dropped(r), 0);
    trace_ring_close(r);
}

Test(trace_ring, attach_refuses_what_is_not_a_ring) {
    pp_err err;
    trace_ring *r;
    int fd = memfd_create("not-a-ring", 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 4096 + 64 * 16), 0);
    cr_assert_eq(trace_ring_attach(fd, &r, &err), -1);
    cr_assert(strstr(err.msg, "no ring header"), "%s", err.msg);
    close(fd);
    cr_assert_eq(trace_ring_attach(987, &r, &err), -1);
    cr_assert(strstr(err.msg, "not open"), "%s", err.msg);
    cr_assert_eq(trace_ring_create(0, &r, &err), -1);
    cr_assert(strstr(err.msg, "capacity"), "%s", err.msg);
}

Test(trace_ring, attach_refuses_another_event_version) {
    pp_err err;
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    /* The header's event version (bytes 12..15) as another build would write it. */
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, trace_ring_fd(r), 0);
    cr_assert_neq(m, MAP_FAILED);
    uint32_t v = TRACE_EVENT_VERSION + 1;
    memcpy((char *)m + 12, &v, 4);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), -1);
    cr_assert(strstr(err.msg, "event version"), "%s", err.msg);
    munmap(m, 4096);
    trace_ring_close(r);
}

Test(trace_ring, worker_side_test_clock_skew_shifts_timestamps) {
    pp_err err;
    trace_ring *r, *w;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "-250", 1);
    cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
    unsetenv("PPRUN_TEST_CLOCK_SKEW_NS");
    trace_event e = {.version = TRACE_EVENT_VERSION, .start_ns = 1000, .end_ns = 2000};
    trace_ring_write(w, &e);
    trace_event out;
    cr_assert_eq(trace_ring_read(r, &out, 1), 1);
    cr_assert_eq(out.start_ns, 750);
    cr_assert_eq(out.end_ns, 1750);
    trace_ring_close(w);
    trace_ring_close(r);
}

/* A head no producer could have written disables the ring for good: a
 * peek reads nothing (not "a ring's worth" again and again), the fault
 * says why, and the drops count the lost records (at most a ring's worth). */
Test(trace_ring, a_corrupt_head_disables_the_ring_instead_of_reading_forever) {
    static const struct {
        uint64_t head;
        const char *why;
        uint64_t dropped;
    } cases[] = {
        {2, "head moved back", 16},           /* behind the 3 records read */
        {3 + 17, "more records pending", 16}, /* tail 3: 17 pending in 16 slots */
        {UINT64_MAX, "head moved back", 16},  /* 0 - 1, the attack's */
        {1ull << 62, "more records pending", 16},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        trace_ring *r, *w;
        pp_err err;
        cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
        cr_assert_eq(trace_ring_attach(trace_ring_fd(r), &w, &err), 0, "%s", err.msg);
        trace_event e, out[64];
        for (uint64_t i = 0; i < 3; i++) {
            make(&e, i, 0);
            trace_ring_write(w, &e);
        }
        cr_assert_eq(trace_ring_read(r, out, 64), 3);
        cr_assert_null(trace_ring_fault(r));
        tfix_scribble_head(trace_ring_fd(r), cases[k].head);
        for (int round = 0; round < 5; round++) cr_assert_eq(trace_ring_read(r, out, 64), 0, "case %zu", k);
        const char *why = trace_ring_fault(r);
        cr_assert_not_null(why, "case %zu: no fault", k);
        cr_assert(strstr(why, cases[k].why), "case %zu: %s", k, why);
        cr_assert_eq(trace_ring_dropped(r), cases[k].dropped, "case %zu", k);
        cr_assert_eq(trace_ring_pending(r), 0);
        trace_ring_close(w);
        trace_ring_close(r);
    }
}

/* A consistent head is read as before: exactly the records between. */
Test(trace_ring, a_scribbled_but_possible_head_reads_at_most_a_ring) {
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    tfix_scribble_head(trace_ring_fd(r), 16);
    trace_event out[64];
    cr_assert_eq(trace_ring_read(r, out, 64), 16);
    cr_assert_eq(trace_ring_read(r, out, 64), 0, "the second read finds nothing new");
    cr_assert_null(trace_ring_fault(r));
    trace_ring_close(r);
}

/* The memfd's size is sealed before any worker gets it: a worker's
 * ftruncate fails (no SIGBUS for the launcher), and a worker still maps
 * and writes the ring. */
Test(trace_ring, a_worker_cannot_shrink_or_grow_the_ring) {
    trace_ring *r;
    pp_err err;
    cr_assert_eq(trace_ring_create(16, &r, &err), 0, "%s", err.msg);
    int fd = trace_ring_fd(r);
    int seals = fcntl(fd, F_GET_SEALS);
    cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
                 "seals %#x", seals);
    pid_t pid = fork();
    if (pid == 0) {
        trace_ring *w;
        pp_err e2;
        if (trace_ring_attach(fd, &w, &e2) != 0) _exit(3);
        if (ftruncate(fd, 4096) == 0 || errno != EPERM) _exit(4);
        if (ftruncate(fd, 1 << 30) == 0 || errno != EPERM) _exit(5);
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) _exit(6);
        trace_event e;
        make(&e, 7, 0);
        _exit(trace_ring_write(w, &e) == 1 ? 0 : 7);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the worker's check %d failed", WEXITSTATUS(st));
    trace_event out[4];
    cr_assert_eq(trace_ring_read(r, out, 4), 1);
    cr_assert_eq(out[0].start_ns, 7);
    trace_ring_close(r);
}
