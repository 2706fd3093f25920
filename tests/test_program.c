/* test_program.c: a user's own program traced by pprun (docs/trace-api.md).
 *
 * libpprun_trace on its own (records in the ring with the environment's
 * rank and attempt; every bad argument refused, naming it; a no-op outside
 * pprun), then `pprun run -- PROGRAM` end to end with examples/pipeline_demo:
 * the program follows each schedule's actions as the plan has them, its
 * losses do not depend on the schedule, a crashed rank's ops are kept, and
 * options of the built-in worker are refused. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "launch_testutil.h"
#include "tracer/pprun_trace.h"
#include "tracer/ring.h"

/* ---- the library, in this process ------------------------------------------ */

/* A ring as the launcher makes one, and the environment it gives a rank. */
static trace_ring *ring_in_env(size_t capacity) {
    trace_ring *ring;
    pp_err err;
    cr_assert_eq(trace_ring_create(capacity, &ring, &err), 0, "%s", err.msg);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", trace_ring_fd(ring));
    setenv("PPRUN_TRACE_FD", fd, 1);
    char identity[48];
    trace_fd_identity(trace_ring_fd(ring), identity, sizeof identity);
    setenv("PPRUN_TRACE_RING", identity, 1);
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("PPRUN_RESTART_COUNT", "1", 1);
    setenv("PPRUN_STEPS", "3", 1);
    setenv("PPRUN_MICROBATCHES", "4", 1);
    setenv("PPRUN_NUM_STAGES", "4", 1);
    return ring;
}

/* A process the rank started inherits its variables but not its ring:
 * PPRUN_TRACE_FD is then another file (or none), not the one
 * PPRUN_TRACE_RING names, and the library records nothing, as outside
 * pprun, and says nothing. */
Test(program_lib, a_descriptor_that_is_not_the_named_ring_records_nothing) {
    trace_ring *ring = ring_in_env(64);
    int other = open("/dev/null", O_RDONLY);
    cr_assert_geq(other, 0);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", other);
    setenv("PPRUN_TRACE_FD", fd, 1); /* the number, another file */
    cr_assert_eq(pprun_trace_init(), 0, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 0);
    pprun_trace_close();
    snprintf(fd, sizeof fd, "%d", trace_ring_fd(ring));
    setenv("PPRUN_TRACE_FD", fd, 1);
    setenv("PPRUN_TRACE_RING", "1:1", 1); /* the ring, but not the file named */
    cr_assert_eq(pprun_trace_init(), 0);
    pprun_trace_close();
    unsetenv("PPRUN_TRACE_RING"); /* a launcher that names none: the descriptor is taken as the ring */
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 1);
    cr_assert_eq(trace_ring_pending(ring), 1);
    pprun_trace_close();
    trace_ring_close(ring);
    close(other);
}

Test(program_lib, outside_pprun_every_call_is_a_no_op) {
    unsetenv("PPRUN_TRACE_FD");
    cr_assert_eq(pprun_trace_init(), 0);
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 0);
    cr_assert_eq(pprun_trace_loss(0, 0, 0, 1.5), 0);
    cr_assert_eq(pprun_trace_span("data", 0, -1, -1, -1, 0, 1, 2), 0);
    cr_assert_eq(pprun_trace_schedule("ScheduleGPipe", 2, 2, 4, "0F0 0BW0"), 0);
    /* a misspelt phase is still an error: the program has a bug either way */
    cr_assert_eq(pprun_trace_op("FWD", 0, 0, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "phase 'FWD': expected F, B, W");
}

Test(program_lib, records_carry_the_environments_rank_and_attempt) {
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    uint64_t t0 = pprun_trace_now_ns();
    cr_assert_eq(pprun_trace_op("F", 1, 3, 2, -1, 4096, t0, t0 + 100), 1);
    cr_assert_eq(pprun_trace_op("SEND_F", 1, 3, 2, 3, 1024, t0 + 100, t0 + 150), 1);
    cr_assert_eq(pprun_trace_loss(2, 0, 3, 2.25), 1);
    cr_assert_eq(pprun_trace_op("OPT", 2, -1, -1, -1, 77, t0 + 200, t0 + 300), 1);
    trace_event ev[8];
    cr_assert_eq(trace_ring_read(ring, ev, 8), 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ev[i].rank, 2);
        cr_assert_eq(ev[i].attempt, 1);
        cr_assert_eq(ev[i].source, TRACE_SRC_CPU);
    }
    cr_assert(ev[0].phase == TRACE_F && ev[0].step == 1 && ev[0].microbatch == 3 && ev[0].stage == 2);
    cr_assert(ev[0].start_ns == t0 && ev[0].end_ns == t0 + 100 && ev[0].bytes == 4096 && ev[0].peer == -1);
    cr_assert(ev[1].phase == TRACE_SEND_F && ev[1].peer == 3 && ev[1].bytes == 1024);
    cr_assert(ev[2].phase == TRACE_LOSS && ev[2].value == 2.25 && ev[2].stage == 3 && ev[2].start_ns == ev[2].end_ns);
    cr_assert(ev[3].phase == TRACE_OPT && ev[3].microbatch == -1 && ev[3].stage == -1 && ev[3].bytes == 77);
    pprun_trace_close();
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 1, "after close, the next call initialises again");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* The GPU side of an op (a PyTorch rank's CUDA events): a gpu record,
 * checked as the op's host record is, and refused under its own name. */
Test(program_lib, a_gpu_op_is_a_gpu_record_of_the_same_op) {
    trace_ring *ring = ring_in_env(64);
    uint64_t t0 = pprun_trace_now_ns();
    cr_assert_eq(pprun_trace_op("BW", 1, 3, 2, -1, 0, t0, t0 + 100), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_gpu_op("BW", 1, 3, 2, -1, 0, t0 + 20, t0 + 400), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_gpu_op("OPT", 1, -1, -1, -1, 77, t0 + 500, t0 + 600), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_gpu_op("F", 1, 4, 2, -1, 0, t0, t0 + 1), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 4: out of range 0..3");
    cr_assert_eq(pprun_trace_gpu_op("KERNEL", 1, 0, 0, -1, 0, t0, t0 + 1), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace_gpu_op: phase 'KERNEL': expected F, B, W");
    trace_event ev[8];
    cr_assert_eq(trace_ring_read(ring, ev, 8), 3, "the refused ones record nothing");
    cr_assert_eq(ev[0].source, TRACE_SRC_CPU);
    cr_assert(ev[1].source == TRACE_SRC_GPU && ev[1].phase == TRACE_BW && ev[1].step == 1 && ev[1].microbatch == 3 &&
              ev[1].stage == 2 && ev[1].start_ns == t0 + 20 && ev[1].end_ns == t0 + 400 && ev[1].rank == 2);
    cr_assert_eq(ev[1].reserved, 0, "no kernels name it");
    cr_assert(ev[2].source == TRACE_SRC_GPU && ev[2].phase == TRACE_OPT && ev[2].bytes == 77);
    pprun_trace_close();
    trace_ring_close(ring);
}

/* An op packed in one struct (pprun_trace_op_packed: how the Python
 * package records, one argument through ctypes): the same record as
 * pprun_trace_op's or pprun_trace_gpu_op's, checked as they are; a
 * record that is not one (NULL, a phase without its NUL, gpu not 0 or 1,
 * reserved set) refused naming what, recording nothing, counted as
 * dropped. */
Test(program_lib, a_packed_op_is_the_same_op) {
    trace_ring *ring = ring_in_env(64);
    uint64_t t0 = pprun_trace_now_ns();
    pprun_trace_op_record send = {.phase = "SEND_F", .step = 1, .microbatch = 3, .stage = 2, .peer = 3,
                                  .bytes = 1024, .start_ns = t0, .end_ns = t0 + 50};
    pprun_trace_op_record gpu = {.phase = "BW", .gpu = 1, .step = 1, .microbatch = 3, .stage = 2, .peer = -1,
                                 .start_ns = t0 + 20, .end_ns = t0 + 400};
    cr_assert_eq(pprun_trace_op_packed(&send), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op_packed(&gpu), 1, "%s", pprun_trace_error());
    struct {
        pprun_trace_op_record rec;
        const char *message;
    } bad[] = {
        {{.peer = -1}, "pprun_trace_op_packed: phase: no NUL within its 16 bytes"},
        {{.phase = "F", .gpu = 2, .peer = -1}, "pprun_trace_op_packed: gpu: must be 0 (a host span) or 1"},
        {{.phase = "F", .reserved = 7, .peer = -1}, "pprun_trace_op_packed: reserved: must be 0"},
        {{.phase = "F", .microbatch = 4, .peer = -1, .start_ns = 1, .end_ns = 2},
         "pprun_trace F: microbatch 4: out of range 0..3"},
        {{.phase = "KERNEL", .gpu = 1, .peer = -1}, "pprun_trace_gpu_op: phase 'KERNEL': expected F, B, W"},
    };
    memset(bad[0].rec.phase, 'F', sizeof bad[0].rec.phase); /* all 16 bytes: no NUL */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pprun_trace_op_packed(&bad[i].rec), -1, "%s", bad[i].message);
        lt_assert_has(pprun_trace_error(), bad[i].message);
    }
    cr_assert_eq(pprun_trace_op_packed(NULL), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace_op_packed: no record (NULL)");
    trace_event ev[8];
    cr_assert_eq(trace_ring_read(ring, ev, 8), 2, "the refused ones record nothing");
    cr_assert(ev[0].source == TRACE_SRC_CPU && ev[0].phase == TRACE_SEND_F && ev[0].step == 1 &&
              ev[0].microbatch == 3 && ev[0].stage == 2 && ev[0].peer == 3 && ev[0].bytes == 1024 &&
              ev[0].start_ns == t0 && ev[0].end_ns == t0 + 50 && ev[0].rank == 2 && ev[0].attempt == 1);
    cr_assert(ev[1].source == TRACE_SRC_GPU && ev[1].phase == TRACE_BW && ev[1].start_ns == t0 + 20 &&
              ev[1].end_ns == t0 + 400);
    cr_assert_eq(trace_ring_dropped(ring), 6, "each refused record counts once");
    pprun_trace_close();
    trace_ring_close(ring);
}

Test(program_lib, bad_arguments_are_refused_naming_them_and_record_nothing) {
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    const struct {
        const char *phase;
        int step, mb, stage, peer;
        uint64_t start, end;
        const char *message;
        uint64_t bytes;
    } bad[] = {
        {"F", -1, 0, 0, -1, 1, 2, "pprun_trace F: step -1: must be 0 or more", 0},
        {"B", 0, 4, 0, -1, 1, 2, "microbatch 4: out of range 0..3 (PPRUN_MICROBATCHES=4)", 0},
        {"W", 0, 0, 4, -1, 1, 2, "stage 4: out of range 0..3 (PPRUN_NUM_STAGES=4)", 0},
        {"F", 0, -1, 0, -1, 1, 2, "microbatch -1: must be 0 or more", 0},
        {"RECV_F", 0, 0, 1, 4, 1, 2, "peer 4: out of range 0..3 (WORLD_SIZE=4)", 0},
        {"SEND_B", 0, 0, 1, -1, 1, 2, "peer -1: must be 0 or more", 0},
        {"F", 0, 0, 0, 1, 1, 2, "peer 1: only SEND and RECV have a peer", 0},
        {"F", 0, 0, 0, -1, 5, 4, "ends (4 ns) before it starts (5 ns)", 0},
        {"F", 0, 0, 0, -1, 1, UINT64_MAX,
         "pprun_trace F: end_ns 18446744073709551615 ns: past the largest time a record may carry", 0},
        {"F", 0, 0, 0, -1, 1ull << 63, (1ull << 63) + 5, "start_ns 9223372036854775808 ns: past the largest time", 0},
        {"B", 0, 0, 0, -1, (uint64_t)TRACE_TIME_MAX + 1, (uint64_t)TRACE_TIME_MAX + 2, "start_ns 4611686018427387904",
         0},
        {"SEND_F", 0, 0, 0, 1, 1, 2, "pprun_trace SEND_F: bytes 1125899906842625: more than 2^50 (1 PiB)",
         TRACE_BYTES_MAX + 1},
        {"OPT", 0, -1, -1, -1, 1, 2, "bytes 18446744073709551615: more than 2^50", UINT64_MAX},
        {"LOSS", 0, 0, 0, -1, 1, 2, "phase 'LOSS': expected", 0},
        {NULL, 0, 0, 0, -1, 1, 2, "phase '(null)'", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pprun_trace_op(bad[i].phase, bad[i].step, bad[i].mb, bad[i].stage, bad[i].peer, bad[i].bytes,
                                    bad[i].start, bad[i].end),
                     -1, "%s", bad[i].message);
        lt_assert_has(pprun_trace_error(), bad[i].message);
    }
    /* a span's bytes too (pprun.span(..., bytes=N) from a program: a job
     * with one stored would be refused as damaged by every reader) */
    cr_assert_eq(pprun_trace_span("allreduce", 0, -1, -1, -1, TRACE_BYTES_MAX + 1, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "span 'allreduce': bytes 1125899906842625: more than 2^50");
    cr_assert_eq(pprun_trace_loss(0, 9, 3, 1.0), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace LOSS: microbatch 9");
    cr_assert_eq(trace_ring_pending(ring), 0, "a refused op records nothing");
    /* a step past PPRUN_STEPS (3) is no bad argument: a program's job has no step bound */
    cr_assert_eq(pprun_trace_op("F", 3, 0, 0, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    pprun_trace_close();
    trace_ring_close(ring);
}

Test(program_lib, a_full_ring_counts_drops_and_never_blocks) {
    trace_ring *ring = ring_in_env(4);
    int recorded = 0, dropped = 0;
    for (int i = 0; i < 10; i++) {
        int rc = pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2);
        cr_assert(rc == 0 || rc == 1);
        recorded += rc, dropped += !rc;
    }
    cr_assert_eq(recorded, (int)trace_ring_capacity(ring));
    cr_assert_eq(trace_ring_dropped(ring), (uint64_t)dropped);
    pprun_trace_close();
    trace_ring_close(ring);
}

Test(program_lib, a_forked_child_may_not_write_its_parents_ring) {
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) { /* exit status: 0 when refused with the reason */
        int rc = pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2);
        _exit(rc == -1 && strstr(pprun_trace_error(), "one process per rank records") ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's record was not refused");
    cr_assert_eq(trace_ring_pending(ring), 0);
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 1, "the parent still records");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* One writer per ring: a process of the rank that was not the library's
 * when another forked it (forked before the library loaded, a second
 * program of the rank) is refused while the first writer lives, naming
 * it; once that one is gone (a program of the rank that ended, a
 * restarted attempt) the next takes the ring over. */
Test(program_lib, a_second_process_may_not_write_the_ring_while_the_first_lives) {
    trace_ring *ring = ring_in_env(64);
    int go[2], done[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(done), 0);
    pid_t first = fork(); /* before the library loaded here: no at-fork handler knows */
    cr_assert(first >= 0);
    if (first == 0) { /* records one op, then lives until told */
        char c;
        int rc = pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2);
        if (write(done[1], "x", 1) != 1 || read(go[0], &c, 1) != 1) _exit(2);
        _exit(rc == 1 ? 0 : 1);
    }
    char c;
    cr_assert_eq(read(done[0], &c, 1), 1);
    pid_t second = fork(); /* refused while the first lives */
    cr_assert(second >= 0);
    if (second == 0) {
        char want[96];
        snprintf(want, sizeof want, "is written by process %d", (int)first);
        int rc = pprun_trace_op("F", 0, 1, 0, -1, 0, 1, 2);
        _exit(rc == -1 && strstr(pprun_trace_error(), want) ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(second, &st, 0), second);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second writer was not refused naming the first");
    cr_assert_eq(write(go[1], "x", 1), 1);
    cr_assert_eq(waitpid(first, &st, 0), first);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the first writer did not record");
    cr_assert_eq(pprun_trace_op("F", 0, 2, 0, -1, 0, 1, 2), 1, "the first is gone: %s", pprun_trace_error());
    cr_assert_eq(trace_ring_pending(ring), 2, "the first's record and this one's, none of the second's");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* A thread of a program that loaded the library with dlopen, recorded,
 * and dlclosed it: the thread's schedstat descriptor is closed by a
 * thread-specific key's destructor at the thread's exit, which glibc runs
 * after the dlclose; the library stays mapped (linked -z nodelete), or the
 * destructor would be a jump into unmapped memory. */
struct dlclose_thread {
    int (*op_packed)(const pprun_trace_op_record *);
    pthread_barrier_t recorded, closed;
    int rc;
};

static void *dlclose_thread_main(void *arg) {
    struct dlclose_thread *t = arg;
    pprun_trace_op_record rec = {.phase = "F", .step = 0, .microbatch = 1, .stage = 2, .peer = -1, .end_ns = 5};
    t->rc = t->op_packed(&rec);
    pthread_barrier_wait(&t->recorded);
    pthread_barrier_wait(&t->closed);
    return NULL; /* the key's destructor runs now */
}

Test(program_lib, a_thread_that_recorded_outlives_a_dlclose_of_the_library) {
    trace_ring *ring = ring_in_env(64);
    /* a copy: this executable links the library, and a dlopen of the same
     * file would only count a reference */
    char copy[] = "/tmp/pprun-test-lib-XXXXXX";
    int out = mkstemp(copy);
    cr_assert(out >= 0);
    FILE *in = fopen(PPRUN_TRACE_LIB, "rb");
    cr_assert_not_null(in);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(write(out, buf, n), (ssize_t)n);
    fclose(in);
    close(out);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) { /* exit status 0: the record made, the thread ended */
        void *lib = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
        if (!lib) _exit(2);
        struct dlclose_thread t = {0};
        t.op_packed = (int (*)(const pprun_trace_op_record *))dlsym(lib, "pprun_trace_op_packed");
        if (!t.op_packed) _exit(3);
        pthread_barrier_init(&t.recorded, NULL, 2);
        pthread_barrier_init(&t.closed, NULL, 2);
        pthread_t th;
        if (pthread_create(&th, NULL, dlclose_thread_main, &t) != 0) _exit(4);
        pthread_barrier_wait(&t.recorded);
        dlclose(lib);
        pthread_barrier_wait(&t.closed);
        pthread_join(th, NULL);
        _exit(t.rc == 1 ? 0 : 5);
    }
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    unlink(copy);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the program %s %d",
              WIFEXITED(st) ? "exited with" : "died of signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    cr_assert_eq(trace_ring_pending(ring), 1, "the thread's record is in the ring");
    trace_ring_close(ring);
}

/* A refused record is lost to the job as a full ring's is: counted as
 * dropped (ranks.dropped_events, which pprun stats and the dashboard
 * show), so a program that stops tracing at a refusal (pprun.torch) does
 * not leave a job that looks whole. */
Test(program_lib, a_refused_record_is_counted_as_dropped) {
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_op("F", 0, 4, 0, -1, 0, 1, 2), -1);
    cr_assert_eq(pprun_trace_span("data", 0, 9, -1, -1, 0, 1, 2), -1);
    cr_assert_eq(pprun_trace_span("", 0, -1, -1, -1, 0, 1, 2), -1);
    cr_assert_eq(pprun_trace_op("FWD", 0, 0, 0, -1, 0, 1, 2), -1);
    cr_assert_eq(pprun_trace_loss(0, 0, 0, 1.0), 1, "%s", pprun_trace_error());
    cr_assert_eq(trace_ring_pending(ring), 1);
    cr_assert_eq(trace_ring_dropped(ring), 4, "each refused record counts once");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* Records a program did not make (it stopped tracing after a refusal)
 * are counted as dropped in the ring's counter, n at a time, writing
 * nothing; n outside 0 .. PPRUN_TRACE_COUNT_DROPPED_MAX is refused,
 * naming it, and counts nothing; a forked child counts nothing; outside
 * pprun the call does nothing. */
Test(program_lib, records_not_made_are_counted_as_dropped) {
    unsetenv("PPRUN_TRACE_FD");
    cr_assert_eq(pprun_trace_count_dropped(5), 0, "outside pprun: nothing to count into");
    pprun_trace_close();
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_count_dropped(0), 1, "%s", pprun_trace_error());
    cr_assert_eq(trace_ring_dropped(ring), 0);
    cr_assert_eq(pprun_trace_count_dropped(14), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_count_dropped(PPRUN_TRACE_COUNT_DROPPED_MAX), 1, "%s", pprun_trace_error());
    cr_assert_eq(trace_ring_dropped(ring), 14 + (uint64_t)PPRUN_TRACE_COUNT_DROPPED_MAX);
    cr_assert_eq(pprun_trace_count_dropped(-1), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace_count_dropped: -1 records: out of range 0..1073741824");
    cr_assert_eq(pprun_trace_count_dropped(PPRUN_TRACE_COUNT_DROPPED_MAX + 1), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace_count_dropped: 1073741825 records: out of range 0..1073741824");
    cr_assert_eq(pprun_trace_count_dropped(INT64_MIN), -1);
    cr_assert_eq(pprun_trace_count_dropped(INT64_MAX), -1);
    cr_assert_eq(trace_ring_dropped(ring), 14 + (uint64_t)PPRUN_TRACE_COUNT_DROPPED_MAX, "a refused count adds nothing");
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) { /* exit status: 0 when refused with the reason */
        int rc = pprun_trace_count_dropped(3);
        _exit(rc == -1 && strstr(pprun_trace_error(), "one process per rank records") ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's count was not refused");
    cr_assert_eq(trace_ring_dropped(ring), 14 + (uint64_t)PPRUN_TRACE_COUNT_DROPPED_MAX, "the child counted nothing");
    cr_assert_eq(trace_ring_pending(ring), 0, "counting writes no record");
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(trace_ring_pending(ring), 1, "recording goes on after a count");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* The ring's drop counter, which pprun_trace_count_dropped adds to,
 * saturates at INT64_MAX (what the store's integer holds), however many
 * are counted. */
Test(program_lib, the_drop_counter_saturates) {
    trace_ring *r2;
    pp_err err;
    cr_assert_eq(trace_ring_create(8, &r2, &err), 0, "%s", err.msg);
    trace_ring_count_dropped(r2, (uint64_t)INT64_MAX - 1);
    trace_ring_count_dropped(r2, 5);
    cr_assert_eq(trace_ring_dropped(r2), (uint64_t)INT64_MAX);
    trace_ring_count_dropped(r2, UINT64_MAX);
    cr_assert_eq(trace_ring_dropped(r2), (uint64_t)INT64_MAX);
    trace_ring_close(r2);
}

/* An evaluation (a forward-only step) has microbatches of its own, not
 * the training step's (4 here): EVAL_F, EVAL_SEND_F, EVAL_RECV_F and its
 * losses are taken past them, up to pprun's most microbatches; before a
 * schedule is declared its stage is not held to the launcher's
 * PPRUN_NUM_STAGES (a program's pipeline may have more), after, to the
 * schedule's. Training records keep their bounds. */
Test(program_lib, an_evaluation_has_microbatches_of_its_own) {
    trace_ring *ring = ring_in_env(64); /* 4 stages, 4 microbatches, 4 ranks */
    cr_assert_eq(pprun_trace_op("EVAL_F", 0, 7, 5, -1, 64, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("EVAL_SEND_F", 0, 7, 5, 3, 64, 2, 3), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("EVAL_RECV_F", 0, 99999, 0, 1, 64, 3, 4), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_eval_loss(0, 7, 5, 2.5), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("EVAL_F", 0, 100000, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 100000: out of range 0..99999 (most microbatches of an "
                                       "evaluation, over every replica=100000)");
    cr_assert_eq(pprun_trace_op("EVAL_SEND_F", 0, 0, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "peer -1: must be 0 or more");
    cr_assert_eq(pprun_trace_op("F", 0, 7, 0, -1, 0, 1, 2), -1, "a training F keeps the training bound");
    cr_assert_eq(pprun_trace_schedule("ScheduleGPipe", 2, 2, 4, ""), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("EVAL_F", 1, 15, 1, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("EVAL_F", 1, 100000, 1, -1, 0, 1, 2), -1,
                 "two replicas: still 0..99999 in all, what every reader takes for a microbatch");
    lt_assert_has(pprun_trace_error(), "microbatch 100000: out of range 0..99999");
    cr_assert_eq(pprun_trace_op("EVAL_F", 1, 0, 2, -1, 0, 1, 2), -1, "the declared schedule's stages bound it now");
    lt_assert_has(pprun_trace_error(), "stage 2: out of range 0..1");
    trace_event ev[16];
    size_t n = trace_ring_read(ring, ev, 16);
    cr_assert_eq(n, 4 + 1 + 1 + 1, "4 evaluation records, the schedule's name, head and the last EVAL_F");
    cr_assert(ev[0].phase == TRACE_EVAL_F && ev[0].microbatch == 7 && ev[0].stage == 5 && ev[0].bytes == 64);
    cr_assert(ev[1].phase == TRACE_EVAL_SEND_F && ev[1].peer == 3);
    cr_assert(ev[2].phase == TRACE_EVAL_RECV_F && ev[2].microbatch == 99999 && ev[2].peer == 1);
    cr_assert(ev[3].phase == TRACE_EVAL_LOSS && ev[3].value == 2.5 && ev[3].microbatch == 7 && ev[3].stage == 5);
    cr_assert(ev[6].phase == TRACE_EVAL_F && ev[6].step == 1 && ev[6].microbatch == 15);
    pprun_trace_close();
    trace_ring_close(ring);
}

/* A data-parallel collective's span (ALLREDUCE, REDUCE_SCATTER,
 * ALL_GATHER: pprun's own names) numbers its bucket in the microbatch
 * field: a step has as many as the program's collectives (one a
 * parameter: hundreds), not the step's microbatches (4 here); up to what
 * every reader takes for one. A span of another name keeps the bound. */
Test(program_lib, a_collectives_bucket_is_not_a_microbatch) {
    trace_ring *ring = ring_in_env(64); /* 4 stages, 4 microbatches, 4 ranks */
    cr_assert_eq(pprun_trace_span("ALLREDUCE", 0, 4, 1, 1, 64, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_span("REDUCE_SCATTER", 0, 500, 1, 1, 64, 2, 3), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_span("ALL_GATHER", 0, 99999, 1, 1, 64, 3, 4), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_span("ALLREDUCE", 0, 100000, 1, 1, 64, 4, 5), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 100000: out of range 0..99999 (most buckets of a stage's step");
    cr_assert_eq(pprun_trace_span("allreduce", 0, 4, 1, 1, 64, 5, 6), -1, "a program's own name: a microbatch");
    lt_assert_has(pprun_trace_error(), "microbatch 4: out of range 0..3");
    trace_event ev[16];
    size_t n = trace_ring_read(ring, ev, 16);
    cr_assert_eq(n, 3 + 3, "3 names, 3 spans");
    pprun_trace_close();
    trace_ring_close(ring);
}

Test(program_lib, a_broken_environment_says_what_is_wrong) {
    setenv("PPRUN_TRACE_FD", "abc", 1);
    cr_assert_eq(pprun_trace_init(), -1);
    lt_assert_has(pprun_trace_error(), "PPRUN_TRACE_FD");
    cr_assert_eq(pprun_trace_init(), -1, "the same answer again");
    cr_assert_eq(pprun_trace_op("F", 0, 0, 0, -1, 0, 1, 2), -1, "every record fails the same way");
    lt_assert_has(pprun_trace_error(), "pprun_trace_init: ");
    lt_assert_has(pprun_trace_error(), "PPRUN_TRACE_FD");
    pprun_trace_close();
    setenv("PPRUN_TRACE_FD", "1000", 1);
    cr_assert_eq(pprun_trace_init(), -1);
    lt_assert_has(pprun_trace_error(), "fd 1000 is not open");
    pprun_trace_close();
}

/* PPRUN_DP_SIZE (the replicas a record's global microbatch counts over)
 * is a number from 1, or the environment is broken, naming it; 2 lets a
 * loss and an op number the second replica's microbatches before any
 * schedule is declared. */
Test(program_lib, the_replica_count_of_the_environment_is_checked) {
    trace_ring *ring = ring_in_env(64); /* 4 microbatches */
    static const char *const bad[] = {"0", "-2", "two", "2x", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("PPRUN_DP_SIZE", bad[i], 1);
        cr_assert_eq(pprun_trace_init(), -1, "PPRUN_DP_SIZE='%s'", bad[i]);
        lt_assert_has(pprun_trace_error(), "PPRUN_DP_SIZE");
        pprun_trace_close();
    }
    setenv("PPRUN_DP_SIZE", "2", 1);
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_loss(0, 7, 3, 1.5), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_loss(0, 8, 3, 1.5), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 8: out of range 0..7 (microbatches x replicas=8)");
    cr_assert_eq(pprun_trace_op("F", 0, 7, 0, -1, 0, 1, 2), 1, "an op's microbatch is global too: %s",
                 pprun_trace_error());
    cr_assert_eq(pprun_trace_op("F", 0, 8, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 8: out of range 0..7 (microbatches x replicas=8)");
    pprun_trace_close();
    /* never past what every reader takes for a microbatch (db/bounds.h):
     * 4096 microbatches x 64 replicas is past 100000 */
    setenv("PPRUN_MICROBATCHES", "4096", 1);
    setenv("PPRUN_DP_SIZE", "64", 1);
    cr_assert_eq(pprun_trace_op("F", 0, 99999, 0, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("F", 0, 100000, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 100000: out of range 0..99999 (most microbatches, over every "
                                       "replica=100000)");
    pprun_trace_close();
    setenv("PPRUN_MICROBATCHES", "4", 1);
    unsetenv("PPRUN_DP_SIZE");
    trace_ring_close(ring);
}

/* A program that names each span anew (f"batch {i}"): each name found
 * by its hash, not by scanning every name sent (65,536 names scanned at
 * every span took seconds); past TRACE_SPAN_NAMES_MAX distinct names one
 * more is refused, saying why, and a name sent before still records. */
Test(program_lib, distinct_span_names_are_bounded_and_found_by_hash) {
    trace_ring *ring = ring_in_env(64);
    cr_assert_eq(pprun_trace_init(), 1, "%s", pprun_trace_error());
    char name[32];
    for (int i = 0; i < TRACE_SPAN_NAMES_MAX; i++) {
        snprintf(name, sizeof name, "batch %d", i);
        cr_assert_geq(pprun_trace_span(name, 0, -1, -1, -1, 0, 1, 2), 0, "%s: %s", name, pprun_trace_error());
    }
    cr_assert_eq(pprun_trace_span("one more", 0, -1, -1, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "pprun_trace span 'one more': past 65536 distinct span and schedule names in "
                                       "this process");
    trace_ring_read(ring, (trace_event[64]){0}, 64); /* room for the next */
    cr_assert_eq(pprun_trace_span("batch 65535", 0, -1, -1, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    trace_event ev;
    cr_assert_eq(trace_ring_read(ring, &ev, 1), 1);
    cr_assert(ev.phase == TRACE_SPAN && ev.name == TRACE_SPAN_NAMES_MAX, "its id, no name record sent again");
    pprun_trace_close();
    trace_ring_close(ring);
}

/* The name a rank's TRACE_SPAN_NAME records among ev[0..n) give id. */
static const char *span_name(const trace_event *ev, size_t n, uint32_t id, char *buf) {
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == TRACE_SPAN_NAME && ev[i].kname.id == id) {
            size_t k = ev[i].kname.len - ev[i].kname.off;
            memcpy(buf + ev[i].kname.off, ev[i].kname.text, k < TRACE_NAME_CHUNK ? k : TRACE_NAME_CHUNK);
            buf[ev[i].kname.len] = '\0';
        }
    return buf;
}

Test(program_lib, a_span_carries_its_name_sent_once) {
    trace_ring *ring = ring_in_env(64);
    uint64_t t0 = pprun_trace_now_ns();
    const char *long_name = "a data loader's prefetch of the next batch, longer than one record";
    cr_assert_eq(pprun_trace_span("data", 1, -1, -1, -1, 0, t0, t0 + 5), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_span("data", 2, 3, 1, -1, 0, t0 + 5, t0 + 9), 1);
    cr_assert_eq(pprun_trace_span("allreduce", 2, -1, -1, 3, 1 << 20, t0 + 9, t0 + 20), 1);
    cr_assert_eq(pprun_trace_span(long_name, 0, -1, -1, -1, 0, t0, t0), 1);
    trace_event ev[16];
    size_t n = trace_ring_read(ring, ev, 16);
    cr_assert_eq(n, 1 + 2 + 1 + 1 + 2 + 1, "a name's records once, before its first span");
    cr_assert(ev[0].phase == TRACE_SPAN_NAME && ev[1].phase == TRACE_SPAN && ev[2].phase == TRACE_SPAN);
    cr_assert(ev[3].phase == TRACE_SPAN_NAME && ev[4].phase == TRACE_SPAN);
    char buf[TRACE_SPAN_NAME_MAX + 1];
    cr_assert_str_eq(span_name(ev, n, (uint32_t)ev[1].name, buf), "data");
    cr_assert_eq(ev[2].name, ev[1].name);
    cr_assert(ev[1].step == 1 && ev[1].microbatch == -1 && ev[1].stage == -1 && ev[1].peer == -1);
    cr_assert(ev[2].microbatch == 3 && ev[2].stage == 1 && ev[2].end_ns == t0 + 9);
    cr_assert_str_eq(span_name(ev, n, (uint32_t)ev[4].name, buf), "allreduce");
    cr_assert(ev[4].peer == 3 && ev[4].bytes == 1 << 20 && ev[4].rank == 2 && ev[4].attempt == 1);
    cr_assert(ev[5].phase == TRACE_SPAN_NAME && ev[6].phase == TRACE_SPAN_NAME && ev[7].phase == TRACE_SPAN);
    cr_assert_str_eq(span_name(ev, n, (uint32_t)ev[7].name, buf), long_name);

    char huge[TRACE_SPAN_NAME_MAX + 2];
    memset(huge, 'x', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    const struct {
        const char *name;
        int mb, stage, peer;
        const char *message;
    } bad[] = {
        {"", -1, -1, -1, "pprun_trace_span: the name is empty"},
        {NULL, -1, -1, -1, "pprun_trace_span: the name is empty"},
        {huge, -1, -1, -1, "is 256 bytes, more than 255"},
        {"da\tta", -1, -1, -1, "pprun_trace_span: name has control byte 0x09 at byte 2"},
        {"\x1b[2J", -1, -1, -1, "name has control byte 0x1b at byte 0"},
        {"\x1f", -1, -1, -1, "name has control byte 0x1f at byte 0"},
        {"del\x7f", -1, -1, -1, "name has control byte 0x7f at byte 3"},
        {"data", -2, -1, -1, "span 'data': microbatch -2: must be -1 or more"},
        {"data", -1, 4, -1, "stage 4: out of range 0..3 (PPRUN_NUM_STAGES=4)"},
        {"data", -1, -1, 4, "peer 4: out of range 0..3 (WORLD_SIZE=4)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pprun_trace_span(bad[i].name, 0, bad[i].mb, bad[i].stage, bad[i].peer, 0, 1, 2), -1, "%s",
                     bad[i].message);
        lt_assert_has(pprun_trace_error(), bad[i].message);
    }
    cr_assert_eq(trace_ring_pending(ring), 0, "a refused span records nothing, not even its name");
    pprun_trace_close();
    trace_ring_close(ring);
}

Test(program_lib, a_declared_schedule_bounds_the_records_and_carries_the_plan) {
    trace_ring *ring = ring_in_env(64); /* 4 stages, 4 microbatches in the environment */
    cr_assert_eq(pprun_trace_op("BW", 0, 5, 0, -1, 0, 1, 2), -1, "the environment's bounds first");
    lt_assert_has(pprun_trace_error(), "microbatch 5: out of range 0..3");
    const struct {
        const char *name;
        int ranks, stages, mb;
        const char *actions, *message;
    } bad[] = {
        {"X", 0, 4, 4, "", "pprun_trace_schedule: 0 ranks: out of range; accepted: 1 to 1024"},
        {"X", 4, 2, 4, "", "2 stages on 4 ranks: out of range; accepted: 4 (one a rank) to 65536"},
        /* pprun's own bounds (base/shape.h), as `pprun schedule` keeps them */
        {"X", 1025, 1025, 1, "", "1025 ranks: out of range; accepted: 1 to 1024"},
        {"X", 2, 2147483647, 2, "", "2147483647 stages on 2 ranks: out of range; accepted: 2 (one a rank) to 65536"},
        {"X", 2, 65537, 2, "", "65537 stages on 2 ranks: out of range"},
        {"X", 2, 4, 100001, "", "100001 microbatches: out of range; accepted: 1 to 100000"},
        {"X", 2, 4, 2147483647, "", "2147483647 microbatches: out of range"},
        {"X", 2, 65536, 51, "", "65536 stages x 51 microbatches x 3 ops is over 10 million actions"},
        {"Sch\x1b[2Jedule", 2, 4, 4, "", "pprun_trace_schedule: name has control byte 0x1b at byte 3"},
        {"a\nb", 2, 4, 4, "", "name has control byte 0x0a at byte 1"},
        {"", 2, 4, 4, "", "pprun_trace_schedule: the name is empty"},
        {"X", 2, 4, 4, "0F0 0X1", "action '0X1': expected {stage}{F|B|W|BW}{microbatch}"},
        {"X", 2, 4, 4, "0F0 -1F0", "action '-1F0'"},
        {"X", 2, 4, 4, "0F", "action '0F'"},
        {"X", 2, 4, 4, "4F0", "action '4F0': stage must be below 4, microbatch below 4"},
        {"X", 2, 4, 4, "0BW4", "action '0BW4': stage must be below 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pprun_trace_schedule(bad[i].name, bad[i].ranks, bad[i].stages, bad[i].mb, bad[i].actions), -1,
                     "%s", bad[i].message);
        lt_assert_has(pprun_trace_error(), bad[i].message);
    }
    cr_assert_eq(trace_ring_pending(ring), 0, "a refused schedule records nothing");

    cr_assert_eq(pprun_trace_schedule("ScheduleGPipe", 2, 8, 6, "0F0 . 0BW0  7W5 ."), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("BW", 0, 5, 7, -1, 0, 1, 2), 1, "the program's bounds now: %s", pprun_trace_error());
    trace_event ev[16];
    size_t n = trace_ring_read(ring, ev, 16);
    cr_assert_eq(n, 1 + 1 + 3 + 1);
    char buf[TRACE_SPAN_NAME_MAX + 1];
    cr_assert(ev[0].phase == TRACE_SPAN_NAME && ev[1].phase == TRACE_SCHEDULE);
    cr_assert_str_eq(span_name(ev, n, ev[1].sched.name, buf), "ScheduleGPipe");
    cr_assert(ev[1].sched.ranks == 2 && ev[1].sched.stages == 8 && ev[1].sched.microbatches == 6);
    cr_assert_eq(ev[1].sched.slots, 5, "idle slots count in the grid's width");
    const int slot[] = {0, 2, 3}, stage[] = {0, 0, 7}, op[] = {TRACE_F, TRACE_BW, TRACE_W}, mb[] = {0, 0, 5};
    for (int i = 0; i < 3; i++) {
        const trace_event *e = &ev[2 + i];
        cr_assert_eq(e->phase, TRACE_PLAN);
        cr_assert(e->plan.slot == slot[i] && e->plan.stage == stage[i] && e->plan.op == op[i] &&
                      e->plan.microbatch == mb[i] && e->rank == 2 && e->attempt == 1,
                  "action %d: slot %d stage %d op %d mb %d", i, e->plan.slot, e->plan.stage, e->plan.op,
                  e->plan.microbatch);
    }
    cr_assert(ev[5].phase == TRACE_BW && ev[5].stage == 7);
    /* 2 of the 4 ranks a pipeline: 2 replicas, whose losses and ops are
     * numbered across both (replica·6 + mb, docs/schema.md) */
    cr_assert_eq(pprun_trace_loss(0, 11, 7, 1.5), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_loss(0, 12, 7, 1.5), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 12: out of range 0..11 (microbatches x replicas=12)");
    cr_assert_eq(pprun_trace_op("F", 0, 11, 0, -1, 0, 1, 2), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_op("F", 0, 12, 0, -1, 0, 1, 2), -1);
    lt_assert_has(pprun_trace_error(), "microbatch 12: out of range 0..11 (microbatches x replicas=12)");
    /* the largest shape pprun accepts is taken: the bounds are inclusive */
    cr_assert_eq(pprun_trace_schedule("Edge", 1024, 65536, 50, ""), 1, "%s", pprun_trace_error());
    cr_assert_eq(pprun_trace_schedule("Edge", 1, 1, 100000, "0F100000"), -1);
    lt_assert_has(pprun_trace_error(), "action '0F100000': stage must be below 1, microbatch below 100000");
    cr_assert_eq(pprun_trace_schedule("Edge", 1, 1, 100000, "0F99999"), 1, "%s", pprun_trace_error());
    pprun_trace_close();
    trace_ring_close(ring);
}

/* ---- pprun run -- PROGRAM ---------------------------------------------------- */

/* Runs `pprun run --db DB --steps 3 --microbatches 4 EXTRA -- pipeline_demo
 * --op-ms 1 DEMO_EXTRA`; returns the finished process. */
static void run_demo(lt_proc *p, const char *db, const char *extra, const char *demo_extra) {
    const char *args[32] = {"run", "--db", db, "--steps", "3", "--microbatches", "4"};
    int n = 7;
    char words[512];
    snprintf(words, sizeof words, "%s", extra ? extra : "");
    for (char *w = strtok(words, " "); w; w = strtok(NULL, " ")) args[n++] = w;
    args[n++] = "--";
    args[n++] = PPRUN_DEMO_BIN;
    args[n++] = "--op-ms";
    args[n++] = "1";
    char more[128];
    snprintf(more, sizeof more, "%s", demo_extra ? demo_extra : "");
    for (char *w = strtok(more, " "); w; w = strtok(NULL, " ")) args[n++] = w;
    args[n] = NULL;
    lt_run(p, args, NULL);
}

static sqlite3 *open_db(const char *path) {
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "%s", path);
    return s;
}

/* One text value of a query (the test fails when there is no row). */
static char *q_text(sqlite3 *s, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "no row: %s", sql);
    const unsigned char *t = sqlite3_column_text(st, 0);
    char *out = strdup(t ? (const char *)t : "");
    sqlite3_finalize(st);
    return out;
}

Test(program_run, every_schedule_runs_the_program_as_planned, .timeout = 240) {
    const char *db = tfix_path("program.db");
    const char *schedules[] = {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"};
    for (int k = 0; k < 5; k++) {
        char extra[64];
        snprintf(extra, sizeof extra, "--schedule %s", schedules[k]);
        lt_proc p;
        run_demo(&p, db, extra, NULL);
        cr_assert_eq(p.status, 0, "%s: exit %d\n%s", schedules[k], p.status, p.err);
        lt_free(&p);
    }
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE status='succeeded' AND model LIKE "
                               "'program:%pipeline_demo --op-ms 1'"), 5);
    for (int job = 1; job <= 5; job++) {
        int v = job >= 4 ? 2 : 1;
        /* every F, B and W of every step, on the rank the plan gives its stage */
        for (int r = 0; r < 4; r++)
            cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM events WHERE job_id=%d AND rank=%d AND phase='F'",
                                     job, r), 3 * 4 * v, "job %d rank %d", job, r);
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM events e JOIN plan p ON p.job_id=e.job_id AND "
                                    "p.stage=e.stage AND p.phase=e.phase AND p.microbatch=e.microbatch "
                                    "WHERE e.job_id=%d AND e.rank<>p.rank", job), 0, "job %d", job);
        /* each rank ran its actions in the plan's order */
        for (int r = 0; r < 4; r++) {
            char sql[1024];
            snprintf(sql, sizeof sql, "SELECT group_concat(a, ' ') FROM (SELECT action a FROM plan WHERE job_id=%d "
                     "AND rank=%d ORDER BY slot)", job, r);
            char *planned = q_text(s, sql);
            snprintf(sql, sizeof sql, "SELECT group_concat(a, ' ') FROM (SELECT stage || phase || microbatch a "
                     "FROM events WHERE job_id=%d AND rank=%d AND step=1 AND phase IN ('F','B','W') ORDER BY "
                     "start_ns)", job, r);
            char *ran = q_text(s, sql);
            cr_assert_str_eq(ran, planned, "job %d rank %d", job, r);
            free(planned), free(ran);
        }
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM step_stats WHERE job_id=%d", job), 3 * 4);
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM losses WHERE job_id=%d", job), 3 * 4);
    }
    /* the losses are the model's, not the schedule's: bitwise equal for the
     * same stages, and falling */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses a JOIN losses b ON a.step=b.step AND "
                               "a.microbatch=b.microbatch AND ((a.job_id=1 AND b.job_id IN (2,3)) OR "
                               "(a.job_id=4 AND b.job_id=5)) WHERE a.loss IS NOT b.loss"), 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses a JOIN losses b ON a.job_id=b.job_id AND "
                               "a.microbatch=b.microbatch AND b.step=a.step+1 WHERE b.loss >= a.loss"), 0);
    sqlite3_close(s);

    /* pprun stats reads it like any job */
    const char *args[] = {"stats", "--db", db, "--job", "2", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "1f1b  4 ranks  4 microbatches  model program:");
    lt_assert_has(p.out, "bubble ");
    lt_assert_has(p.out, "loss ");
    lt_free(&p);
}

/* A program sends pprun no progress reports, yet its plan is re-simulated
 * at its measured op costs while it runs, once the collector has analysed
 * a step (the dashboard's planned row at the program's own costs), not
 * only when the job ends. The query reads the job's status and its plan in
 * one snapshot. */
Test(program_run, the_plan_gets_the_programs_costs_while_it_runs, .timeout = 120) {
    const char *db = tfix_path("live-plan.db");
    lt_proc p;
    lt_start(&p,
             (const char *[]){"run", "--db", db, "--steps", "1000", "--microbatches", "4", "--", PPRUN_DEMO_BIN,
                              "--op-ms", "1", NULL},
             NULL);
    int seen = 0, ended = 0;
    for (int i = 0; i < 6000 && !seen && !ended; i++) {
        sqlite3 *s;
        if (access(db, F_OK) == 0 && sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
            sqlite3_busy_timeout(s, 1000);
            sqlite3_stmt *st;
            if (sqlite3_prepare_v2(s, "SELECT (SELECT status FROM jobs WHERE id=1)='running' AND "
                                      "(SELECT max(sim_end_ns) FROM plan WHERE job_id=1) > 1000000", -1, &st,
                                   NULL) == SQLITE_OK &&
                sqlite3_step(st) == SQLITE_ROW)
                seen = sqlite3_column_int(st, 0);
            sqlite3_finalize(st);
            sqlite3_close(s);
        }
        int status;
        if (waitpid(p.pid, &status, WNOHANG) == p.pid) lt_collect(&p, status), ended = 1;
        if (!seen) usleep(10000);
    }
    cr_assert(!ended, "the job ended (exit %d) before its plan had measured costs\n%s", p.status, p.err);
    kill(p.pid, SIGINT);
    cr_assert(lt_wait_within(&p, 60), "pprun run did not stop on SIGINT");
    cr_assert(seen, "no simulated plan at the program's costs (over 1 ms) while the job ran\n%s", p.err);
    lt_free(&p);
}

Test(program_run, a_crashed_program_keeps_its_trace_and_is_named, .timeout = 120) {
    const char *db = tfix_path("crash.db");
    lt_proc p;
    run_demo(&p, db, NULL, "--fail-at 2");
    cr_assert_eq(p.status, 1, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "pipeline_demo: rank 3 fails at step 2");
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *failure = q_text(s, "SELECT status || ' ' || failed_rank || ': ' || failure FROM jobs WHERE id=1");
    lt_assert_has(failure, "failed 3: rank 3 (local rank 3 on ");
    lt_assert_has(failure, ") exited with code 3: pipeline_demo: rank 3 fails at step 2"); /* its last stderr line */
    free(failure);
    /* rank 3 started step 2, so every rank had finished step 0 and rank 3
     * step 1: all of it is kept */
    for (int r = 0; r < 4; r++)
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM events WHERE job_id=1 AND rank=%d AND step=0 AND "
                                    "phase IN ('F','B','W')", r), 3 * 4, "rank %d", r);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE job_id=1 AND rank=3 AND step=1 AND "
                               "phase IN ('F','B','W')"), 3 * 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE job_id=1 AND step=0"), 4);
    sqlite3_close(s);
}

Test(program_run, a_restarted_program_records_its_new_attempt, .timeout = 120) {
    const char *db = tfix_path("restart.db");
    lt_proc p;
    run_demo(&p, db, "--max-restarts 1", "--fail-at 2");
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE status='succeeded'"), 1);
    /* attempt 1 ran the whole job again on every rank; attempt 0 stopped in step 2 */
    for (int r = 0; r < 4; r++)
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM events WHERE attempt=1 AND rank=%d AND phase='F'", r), 3 * 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE attempt=0 AND step=2 AND rank=3"), 0);
    cr_assert(tfix_q_int(s, "SELECT count(*) FROM events WHERE attempt=0") > 0, "the failed attempt's ops are kept");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 3 * 4);
    sqlite3_close(s);
}

Test(program_run, options_of_the_built_in_worker_are_refused) {
    const char *db = tfix_path("refused.db");
    const char *flags[] = {"--model gpt", "--fail-at step=1,rank=0", "--data /etc/hostname", "--lr 0.1",
                           "--checkpoint-dir /tmp", "--transport tcp", "--resume", "--progress on"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        lt_proc p;
        run_demo(&p, db, flags[i], NULL);
        cr_assert_eq(p.status, 2, "%s: exit %d", flags[i], p.status);
        char want[128];
        snprintf(want, sizeof want, "pprun run: %.*s configures pprun's built-in worker; with -- PROGRAM your program "
                 "is the model", (int)strcspn(flags[i], " "), flags[i]);
        lt_assert_has(p.err, want);
        lt_free(&p);
        cr_assert_neq(access(db, F_OK), 0, "%s: no database written", flags[i]);
    }
}

/* --recv-timeout, accepted with -- PROGRAM (its ranks get it as
 * PPRUN_RECV_TIMEOUT_MS, docs/torch.md "A rank that waits"): a value out
 * of range or not a duration exits 2 naming the option, before anything
 * starts. */
Test(program_run, a_recv_timeout_that_is_not_one_is_refused) {
    const char *db = tfix_path("timeout.db");
    const char *flags[] = {"--recv-timeout 0s", "--recv-timeout 25h", "--recv-timeout 500us",
                           "--recv-timeout 99999999999999999999s", "--recv-timeout soon", "--recv-timeout -1s"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        lt_proc p;
        run_demo(&p, db, flags[i], NULL);
        cr_assert_eq(p.status, 2, "%s: exit %d\n%s", flags[i], p.status, p.err);
        lt_assert_has(p.err, "--recv-timeout");
        lt_free(&p);
        cr_assert_neq(access(db, F_OK), 0, "%s: no database written", flags[i]);
    }
}

/* A program's ranks that shared a core (2 ranks held to one CPU, as a
 * PyTorch job of more ranks than cores): the what-if says so, takes its
 * ops' waits for a core out of their times, and plays each schedule with
 * a core per rank, as for pprun's own gpt (test_balance). */
Test(program_run, a_programs_ranks_sharing_a_core_are_said_to, .timeout = 120) {
    const char *db = tfix_path("shared.db");
    cpu_set_t all;
    tfix_hold_to_one_cpu(&all);
    lt_proc p;
    run_demo(&p, db, "--nproc-per-node 2", NULL);
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    lt_run(&p, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "\n  (2 ranks shared 1 core: ");
    lt_assert_has(p.out, " of these ops' time was waiting for a core, taken out of the times above, and each schedule "
                         "is simulated with a core per rank)\n");
    lt_free(&p);
}

/* Scripts pass --progress off to every job: with a program it asks for
 * what the job has anyway (no progress line: its numbers come from pprun's
 * worker), so it runs; --progress on stays refused (above). */
Test(program_run, progress_off_is_accepted_with_a_program, .timeout = 120) {
    const char *db = tfix_path("progress.db");
    lt_proc p;
    run_demo(&p, db, "--progress off --nproc-per-node 2", NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    run_demo(&p, db, "--progress=off --nproc-per-node 2", NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE status='succeeded'"), 2);
    sqlite3_close(s);
    run_demo(&p, db, "--progress auto", NULL);
    cr_assert_eq(p.status, 2, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "pprun run: --progress configures pprun's built-in worker");
    lt_free(&p);
}

/* A program that succeeded but recorded nothing (it never called the
 * library, or a Python that skipped pprun's hook) is told so at the end,
 * with the likely reasons; a program that recorded, and a job traced off,
 * are not. */
Test(program_run, a_program_that_recorded_nothing_is_told_why, .timeout = 120) {
    const char *db = tfix_path("nothing.db");
    const char *none[] = {"run", "--db", db, "--nproc-per-node", "2", "--", "sh", "-c", "echo ran", NULL};
    lt_proc p;
    lt_run(&p, none, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    cr_assert_eq(lt_count(p.out, "ran"), 2, "%s", p.out);
    cr_assert_str_eq(p.err, "pprun run: job 1: no records came from the program: it never called libpprun_trace "
                            "(docs/trace-api.md), or, in Python, never imported torch.distributed.pipelining or "
                            "pprun.torch; a python3 started with -I, -E or -S skips the site hook pprun traces "
                            "PyTorch through (docs/torch.md)\n");
    lt_free(&p);
    /* pprun's tracer loaded (as pprun.torch loads it when the program
     * imports torch.distributed.pipelining) and no op made: the hook is
     * not the question */
    const char *loaded[] = {"run", "--db", db, "--nproc-per-node", "2", "--", "python3", "-c",
                            "import pprun._trace\nassert pprun._trace.tracer()", NULL};
    lt_run(&p, loaded, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    cr_assert_str_eq(p.err, "pprun run: job 2: no records came from the program, though 2 of the ranks on this node "
                            "loaded pprun's tracer (pprun.torch loads it when a program imports "
                            "torch.distributed.pipelining): no schedule's step() ran, and nothing was recorded "
                            "through libpprun_trace (docs/torch.md)\n");
    lt_free(&p);
    /* only a failed attempt loaded it: the attempt that ended the job did not */
    const char *earlier[] = {"run", "--db", db, "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c",
                             "[ $PPRUN_RESTART_COUNT = 0 ] && exec python3 -c 'import pprun._trace, sys; "
                             "pprun._trace.tracer(); sys.exit(1)'; exit 0",
                             NULL};
    lt_run(&p, earlier, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "pprun run: job 3: no records came from the program: it never called libpprun_trace ");
    lt_free(&p);
    const char *off[] = {"run", "--db", db, "--trace", "off", "--", "sh", "-c", "echo ran", NULL};
    lt_run(&p, off, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    cr_assert_null(strstr(p.err, "no records"), "--trace off records nothing by design: %s", p.err);
    lt_free(&p);
    run_demo(&p, db, NULL, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    cr_assert_null(strstr(p.err, "no records"), "the demo records: %s", p.err);
    lt_free(&p);
    /* Its only record refused: it called the library, which said why. */
    const char *refused[] = {"run", "--db", db, "--nproc-per-node", "1", "--", "python3", "-c",
                             "import pprun\nwith pprun.span('x', bytes=-1): pass", NULL};
    lt_run(&p, refused, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "span 'x' not recorded");
    cr_assert_null(strstr(p.err, "no records"), "the program called the library: %s", p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(dropped_events) FROM ranks WHERE job_id=(SELECT max(id) FROM jobs)"), 1);
    sqlite3_close(s);
}

Test(program_run, every_node_must_run_the_same_program, .timeout = 120) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *db0 = tfix_path("node0.db"), *db1 = tfix_path("node1.db");
    const char *node0[] = {"run", "--db", db0, "--nnodes", "2", "--node-rank", "0", "--master-port", port,
                           "--nproc-per-node", "2", "--steps", "2", "--rdzv-timeout", "30", "--", PPRUN_DEMO_BIN,
                           "--op-ms", "1", NULL};
    const char *node1[] = {"run", "--db", db1, "--nnodes", "2", "--node-rank", "1", "--master-port", port,
                           "--nproc-per-node", "2", "--steps", "2", "--rdzv-timeout", "30", "--", PPRUN_DEMO_BIN,
                           "--op-ms", "2", NULL};
    lt_proc p0, p1;
    lt_start(&p0, node0, NULL);
    lt_run(&p1, node1, NULL);
    lt_wait(&p0);
    cr_assert_eq(p1.status, 1, "exit %d\n%s", p1.status, p1.err);
    lt_assert_has(p1.err, "this node has -- " PPRUN_DEMO_BIN " --op-ms 2, node rank 0 has -- " PPRUN_DEMO_BIN
                          " --op-ms 1");
    cr_assert_eq(p0.status, 1, "node 0 fails too: exit %d\n%s", p0.status, p0.err);
    lt_free(&p0), lt_free(&p1);
}

Test(program_run, a_schedule_too_long_for_the_environment_is_refused) {
    const char *db = tfix_path("long.db");
    lt_proc p;
    run_demo(&p, db, "--nproc-per-node 2 --schedule interleaved-1f1b --microbatches 4096", NULL);
    cr_assert_eq(p.status, 2, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "rank 0's PPRUN_ACTIONS would be ");
    lt_assert_has(p.err, "bytes, more than the 131071 an environment variable may hold");
    lt_free(&p);
    cr_assert_neq(access(db, F_OK), 0, "no database written");
}

Test(program_run, with_trace_off_the_program_runs_untraced) {
    const char *db = tfix_path("untraced.db");
    lt_proc p;
    run_demo(&p, db, "--trace off", NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    cr_assert_neq(access(db, F_OK), 0, "no database written");
    /* it did run its steps: told to fail at step 2, it gets there, and the
     * failure is reported as with tracing on */
    run_demo(&p, db, "--trace off", "--fail-at 2");
    cr_assert_eq(p.status, 1, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "fails at step 2 (--fail-at)");
    lt_assert_has(p.err, "Root Cause (first observed failure)");
    lt_free(&p);
    cr_assert_neq(access(db, F_OK), 0, "still no database written");
}

Test(program_run, the_program_is_told_it_is_not_under_pprun) {
    /* pipeline_demo straight from a shell: it says how to run it */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "env -u RANK -u PPRUN_TRACE_FD %s 2>&1", PPRUN_DEMO_BIN);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char out[512] = "";
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    cr_assert_eq(WEXITSTATUS(pclose(f)), 2);
    lt_assert_has(out, "RANK is not set: run me as `pprun run [options] -- pipeline_demo`");
}

Test(program_run, a_python_program_traces_through_ctypes, .timeout = 120) {
    cr_assert_eq(system("command -v python3 >/dev/null"), 0, "python3 is missing: scripts/install-deps.sh installs it");
    const char *db = tfix_path("python.db");
    const char *args[] = {"run", "--db", db, "--steps", "3", "--microbatches", "4", "--schedule", "zb-v", "--",
                          "python3", PPRUN_EXAMPLES_DIR "/pipeline_demo.py", "--op-ms", "1", "--lib", PPRUN_TRACE_LIB,
                          NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM events WHERE rank=%d AND phase='F'", r), 3 * 4 * 2);
        char sql[512];
        snprintf(sql, sizeof sql, "SELECT group_concat(a, ' ') FROM (SELECT action a FROM plan WHERE rank=%d ORDER "
                 "BY slot)", r);
        char *planned = q_text(s, sql);
        snprintf(sql, sizeof sql, "SELECT group_concat(a, ' ') FROM (SELECT stage || phase || microbatch a FROM events "
                 "WHERE rank=%d AND step=2 AND phase IN ('F','B','W') ORDER BY start_ns)", r);
        char *ran = q_text(s, sql);
        cr_assert_str_eq(ran, planned, "rank %d", r);
        free(planned), free(ran);
    }
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 3 * 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses a JOIN losses b ON a.microbatch=b.microbatch AND "
                               "b.step=a.step+1 WHERE b.loss >= a.loss"), 0, "the loss falls");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 3 * 4);
    sqlite3_close(s);
}

/* A program's text written as DIR/file, DIR a new directory of the test's
 * (tfix_mkdir(dir_name), returned); its path into path. */
static const char *write_program(const char *dir_name, const char *file, const char *text, char *path, size_t n) {
    const char *dir = tfix_mkdir(dir_name);
    snprintf(path, n, "%s/%s", dir, file);
    tfix_write(path, text);
    return dir;
}

/* `pprun run -m MODULE` runs python3 -m MODULE as torchrun does, and a
 * program's job has no step bound: a module that records spans of steps
 * 0-4 under --steps 2 keeps all five, and jobs.steps becomes 5. */
Test(program_run, a_module_runs_as_many_steps_as_it_likes, .timeout = 120) {
    char path[512], pythonpath[600];
    const char *dir = write_program("module", "five_steps.py",
                                    "import pprun\nfor k in range(5):\n    with pprun.span('s', step=k):\n        pass\n",
                                    path, sizeof path);
    snprintf(pythonpath, sizeof pythonpath, "PYTHONPATH=%s", dir);
    const char *db = tfix_path("module.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "2", "--steps", "2", "-m", "five_steps", NULL};
    const char *env[] = {pythonpath, NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *model = q_text(s, "SELECT model FROM jobs");
    cr_assert_str_eq(model, "program:python3 -m five_steps");
    free(model);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(tfix_q_intf(s, "SELECT count(DISTINCT step) FROM events WHERE rank=%d AND phase='SPAN'", r), 5,
                     "rank %d: steps 0-4, past --steps", r);
    cr_assert_eq(tfix_q_int(s, "SELECT steps FROM jobs"), 5, "the steps it traced");
    sqlite3_close(s);
}

static void run_python_program(lt_proc *p, const char *db, const char *path);

/* A span may name a step no op of the program has (a batch prefetched
 * for the next step, pprun.span("data", step=step + 1)): the job's steps
 * are those its ops traced, 3 here, not the span's 4. */
Test(program_run, a_span_of_the_next_step_is_no_step_traced, .timeout = 120) {
    char path[512];
    write_program("prefetch", "prefetch.py",
                  "import time, pprun, pprun._trace as trace\n"
                  "t = trace.tracer()\n"
                  "for k in range(3):\n"
                  "    with pprun.span('data', step=k + 1):\n"
                  "        pass\n"
                  "    a = time.monotonic_ns()\n"
                  "    assert t.op(b'F', 0, k, 0, 0, -1, 0, a, a + 1000) == 1\n",
                  path, sizeof path);
    const char *db = tfix_path("prefetch.db");
    lt_proc p;
    run_python_program(&p, db, path);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT max(step) FROM events WHERE phase='SPAN'"), 3);
    cr_assert_eq(tfix_q_int(s, "SELECT steps FROM jobs"), 3, "the steps its ops traced");
    sqlite3_close(s);
}

/* Bad arguments from a real program (python3, ctypes): an end past
 * INT64_MAX (its record once failed the collector's analysis of the step
 * and stopped the job's trace), a start of 2^63, a span name that is not
 * UTF-8, a phase with an ESC. Each call gets -1 and names the field and
 * value (the phase escaped, no raw ESC on the terminal); the program's
 * good records are all stored and the job succeeds. */
Test(program_run, bad_times_names_and_phases_are_refused_and_the_rest_is_stored, .timeout = 120) {
    char path[512];
    write_program("badargs", "badargs.py",
                  "import ctypes, os, sys\n"
                  "L = ctypes.CDLL(os.environ['PPRUN_TRACE_LIB'])\n"
                  "u64, i = ctypes.c_uint64, ctypes.c_int\n"
                  "L.pprun_trace_now_ns.restype = u64\n"
                  "L.pprun_trace_error.restype = ctypes.c_char_p\n"
                  "L.pprun_trace_op.argtypes = [ctypes.c_char_p, i, i, i, i, u64, u64, u64]\n"
                  "L.pprun_trace_span.argtypes = [ctypes.c_char_p, i, i, i, i, u64, u64, u64]\n"
                  "t = L.pprun_trace_now_ns()\n"
                  "def bad(what, rc):\n"
                  "    sys.stderr.buffer.write(b'%s: %d %s\\n' % (what, rc, L.pprun_trace_error()))\n"
                  "bad(b'end', L.pprun_trace_op(b'F', 0, 1, 0, -1, 0, t, 2**64 - 1))\n"
                  "bad(b'start', L.pprun_trace_op(b'F', 0, 1, 0, -1, 0, 2**63, 2**63 + 5))\n"
                  "bad(b'name', L.pprun_trace_span(b'\\xff\\xfe\"\\\\x', 0, -1, -1, -1, 0, t, t + 10))\n"
                  "bad(b'c1', L.pprun_trace_span(b'\\xc2\\x9b2J', 0, -1, -1, -1, 0, t, t + 10))\n"
                  "bad(b'phase', L.pprun_trace_op(b'F\\x1b[2J', 0, 0, 0, -1, 0, t, t + 10))\n"
                  "for step in range(3):\n"
                  "    assert L.pprun_trace_op(b'F', step, 0, 0, -1, 0, t + step * 100, t + step * 100 + 10) == 1\n"
                  "    assert L.pprun_trace_span('é data'.encode(), step, -1, -1, -1, 0, t, t + 5) == 1\n",
                  path, sizeof path);
    const char *db = tfix_path("badargs.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "2", "--steps", "3", "--", "python3", path, NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "end: -1 pprun_trace F: end_ns 18446744073709551615 ns: past the largest time a record may "
                         "carry (4611686018427387903 ns)");
    lt_assert_has(p.err, "start: -1 pprun_trace F: start_ns 9223372036854775808 ns: past the largest time");
    lt_assert_has(p.err, "name: -1 pprun_trace_span: name is not printable UTF-8 at byte 0 (0xff)");
    lt_assert_has(p.err, "c1: -1 pprun_trace_span: name is not printable UTF-8 at byte 0 (0xc2)");
    lt_assert_has(p.err, "phase: -1 pprun_trace_op: phase 'F\\x1b[2J': expected F, B");
    cr_assert_null(strchr(p.err, '\x1b'), "no raw ESC reaches the terminal: %s", p.err);
    cr_assert_null(strstr(p.err, "refusing trace records"), "the library refused them first: %s", p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *status = q_text(s, "SELECT status FROM jobs");
    cr_assert_str_eq(status, "succeeded");
    free(status);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'F'"), 2 * 3, "every good op");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'SPAN' AND name = 'é data'"), 2 * 3);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE start_ns < 0 OR end_ns < start_ns"), 0);
    sqlite3_close(s);
}

/* pprun._op (python/pprun/_op.c), the Python package's per-op call without
 * ctypes: under `pprun run` the package's tracer records through it (the
 * module built with pprun loads in the host's python3), the op and the
 * losses it stores are what the package's ctypes path stores (a number
 * past its C int refused the same way), and each bad argument is
 * refused naming it: before bind(), a NULL address, a wrong count, a phase
 * that is not bytes, a number past its field (OverflowError, which the
 * package counts as a refused record), and a phase without its NUL (the
 * library's refusal, -1); of its wrappers (wrap()), one before bind() and
 * hooks(), a phase none of them records (escaped: the ESC is not printed),
 * a fast path switched on before hooks(), a hook that is not callable, a
 * step past any record's (the fast path stays off, nothing raised), a
 * step that is not an int, an empty wrapper made from Python (refused), a
 * batched P2POp whose tag or peer is not what pprun's wrappers put there;
 * a wrapper reads as the function it wraps (its __name__). */
Test(program_run, the_packages_extension_records_what_ctypes_records_and_refuses_bad_arguments, .timeout = 120) {
    char path[512];
    write_program("opext", "opext.py",
                  "import sys\n"
                  "from pprun import _op, _trace\n"
                  "def said(what, call):\n"
                  "    try:\n"
                  "        print('%s: returned %r' % (what, call()))\n"
                  "    except Exception as e:\n"
                  "        print('%s: %s: %s' % (what, type(e).__name__, e))\n"
                  "said('unbound', lambda: _op.put(b'F', 0, 0, 0, 0, -1, 0, 1, 2))\n"
                  "said('wrap unbound', lambda: _op.wrap(len, len, b'F'))\n"
                  "t = _trace.tracer()\n"
                  "said('wrap phase', lambda: _op.wrap(len, len, b'X\\x1b'))\n"
                  "said('context unhooked', lambda: _op.context(0, True, 0))\n"
                  "said('hooks', lambda: _op.hooks(len, 1))\n"
                  "said('context step', lambda: _op.context(2**70, False, 0))\n"
                  "said('context not int', lambda: _op.context('1', False, 0))\n"
                  "said('context first', lambda: _op.context(0, False, 2**70))\n"
                  "said('context first below 0', lambda: _op.context(0, False, -1))\n"
                  "said('context first not int', lambda: _op.context(0, False, 1.5))\n"
                  "_op.hooks(len, len)\n"
                  "said('new wrapper', lambda: type(_op.wrap(len, len, b'F'))())\n"
                  "print('wrapper of', _op.wrap(len, len, b'RECV_B').__name__)\n"
                  "class Op: pass\n"
                  "bad_tag, bad_peer = Op(), Op()\n"
                  "bad_tag._pprun = 'junk'\n"
                  "bad_peer._pprun, bad_peer.peer, bad_peer.tensor = (b'SEND_F', 0, 0), 'x', memoryview(b'1234')\n"
                  "batch = _op.wrap(lambda ops: object(), len, b'')\n"
                  "_op.context(0, True, 0)\n"
                  "said('bad tag', lambda: batch([bad_tag]))\n"
                  "said('bad peer', lambda: batch([bad_peer]))\n"
                  "_op.context(0, False, 0)\n"
                  "print('through the extension:', t.op is _op.put)\n"
                  "now = t.now()\n"
                  "print('ext', t.op(b'SEND_F', 0, 0, 1, 0, 0, 4096, now, now + 50))\n"
                  "print('ctypes', t._op_ctypes(b'SEND_F', 0, 0, 1, 0, 0, 4096, now + 100, now + 150))\n"
                  "print('losses through the extension:', t.loss is _op.loss, t.eval_loss is _op.eval_loss)\n"
                  "print('ext loss', t.loss(0, 0, 0, 1.5), t.eval_loss(0, 0, 0, 0.25))\n"
                  "print('ctypes loss', _trace._ints_checked(t.lib.pprun_trace_loss)(0, 1, 0, 2.5))\n"
                  "said('loss count', lambda: _op.loss(0, 0, 0))\n"
                  "said('loss step', lambda: _op.loss(2**31, 0, 0, 1.0))\n"
                  "said('eval loss value', lambda: _op.eval_loss(0, 0, 0, 'x'))\n"
                  "said('ctypes loss stage', lambda: _trace._ints_checked(t.lib.pprun_trace_loss)(0, 0, 2**31, 1.0))\n"
                  "said('null', lambda: _op.bind(1, 0, 1))\n"
                  "said('bind count', lambda: _op.bind(1))\n"
                  "said('count', lambda: _op.put(b'F', 0, 0))\n"
                  "said('phase', lambda: _op.put('F', 0, 0, 0, 0, -1, 0, 1, 2))\n"
                  "said('step', lambda: _op.put(b'F', 0, 2**31, 0, 0, -1, 0, 1, 2))\n"
                  "said('microbatch', lambda: _op.put(b'F', 0, 0, -2**31 - 1, 0, -1, 0, 1, 2))\n"
                  "said('bytes', lambda: _op.put(b'F', 0, 0, 0, 0, -1, -1, 1, 2))\n"
                  "said('start', lambda: _op.put(b'F', 0, 0, 0, 0, -1, 0, 2**64, 2))\n"
                  "said('ctypes step', lambda: t._op_ctypes(b'F', 0, 2**31, 0, 0, -1, 0, 1, 2))\n"
                  "said('nul', lambda: _op.put(b'F' * 16, 0, 0, 0, 0, -1, 0, 1, 2))\n"
                  "print('nul error:', t.error())\n",
                  path, sizeof path);
    const char *db = tfix_path("opext.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "1", "--steps", "1", "--", "python3", path, NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    lt_assert_has(p.out, "unbound: RuntimeError: put(): no library bound (bind() first)");
    lt_assert_has(p.out, "wrap unbound: RuntimeError: wrap(): no library bound or no hooks (bind() and hooks() "
                         "first)");
    lt_assert_has(p.out, "wrap phase: ValueError: wrap(): phase b'X\\x1b' is none of pprun's wrappers'");
    lt_assert_has(p.out, "context unhooked: RuntimeError: context(): no library bound or no hooks");
    lt_assert_has(p.out, "hooks: TypeError: hooks(): argument 2 is not callable");
    lt_assert_has(p.out, "context step: returned None\n"); /* past a record's step: no fast path, no error */
    lt_assert_has(p.out, "context not int: TypeError: context() argument 1 must be int, not str");
    /* a first microbatch past a record's field: no fast path, no error (the Python wrappers refuse its ops) */
    lt_assert_has(p.out, "context first: returned None\n");
    lt_assert_has(p.out, "context first below 0: returned None\n");
    lt_assert_has(p.out, "context first not int: TypeError: context() argument 3 must be int, not float");
    lt_assert_has(p.out, "new wrapper: TypeError: cannot create 'pprun._op.wrapper' instances");
    lt_assert_has(p.out, "wrapper of len\n");
    lt_assert_has(p.out, "bad tag: TypeError: a P2POp's _pprun is not (phase, stage, microbatch)");
    lt_assert_has(p.out, "bad peer: TypeError: a P2POp's peer is not a rank");
    lt_assert_has(p.out, "through the extension: True");
    lt_assert_has(p.out, "ext 1\n");
    lt_assert_has(p.out, "ctypes 1\n");
    lt_assert_has(p.out, "losses through the extension: True True\n");
    lt_assert_has(p.out, "ext loss 1 1\n");
    lt_assert_has(p.out, "ctypes loss 1\n");
    lt_assert_has(p.out, "loss count: TypeError: loss() takes 4 arguments (step, microbatch, stage, value), 3 given");
    lt_assert_has(p.out, "loss step: OverflowError: step 2147483648 does not fit the record's 32-bit field");
    lt_assert_has(p.out, "eval loss value: TypeError: must be real number, not str");
    lt_assert_has(p.out, "ctypes loss stage: OverflowError: stage 2147483648 does not fit the record's 32-bit field");
    lt_assert_has(p.out, "null: ValueError: bind(): address 2 is NULL");
    lt_assert_has(p.out, "bind count: TypeError: bind() takes exactly 3 arguments (1 given)");
    lt_assert_has(p.out, "count: TypeError: put() takes 9 arguments (phase, gpu, step, microbatch, stage, peer, "
                         "bytes, start_ns, end_ns), 3 given");
    lt_assert_has(p.out, "phase: TypeError: ");
    lt_assert_has(p.out, "step: OverflowError: step 2147483648 does not fit the record's 32-bit field");
    lt_assert_has(p.out, "microbatch: OverflowError: microbatch -2147483649 does not fit");
    lt_assert_has(p.out, "bytes: OverflowError: ");
    lt_assert_has(p.out, "start: OverflowError: ");
    lt_assert_has(p.out, "ctypes step: OverflowError: 'i' format requires");
    lt_assert_has(p.out, "nul: returned -1");
    lt_assert_has(p.out, "nul error: pprun_trace_op_packed: phase: no NUL within its 16 bytes");
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *ops = q_text(s, "SELECT group_concat(x, ' | ') FROM (SELECT phase||' '||step||' '||microbatch||' '||stage||' '||"
                          "peer||' '||bytes||' '||source||' '||(end_ns - start_ns) AS x FROM events ORDER BY start_ns)");
    cr_assert_str_eq(ops, "SEND_F 0 1 0 0 4096 cpu 50 | SEND_F 0 1 0 0 4096 cpu 50", "the same op both ways: %s", ops);
    free(ops);
    cr_assert_eq(tfix_q_int(s, "SELECT max(start_ns) - min(start_ns) FROM events"), 100);
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks"), 1, "the phase without its NUL, refused");
    char *losses = q_text(s, "SELECT (SELECT group_concat(microbatch||' '||loss, ' | ') FROM losses) || ' / ' || "
                             "(SELECT group_concat(microbatch||' '||loss) FROM eval_losses)");
    cr_assert_str_eq(losses, "0 1.5 | 1 2.5 / 0 0.25", "the losses both ways: %s", losses);
    free(losses);
    sqlite3_close(s);
}

/* The failure a one-rank job of a Python program of this text (written
 * under folder dir) records (malloc'ed); the job must exit 1. */
static char *failure_of(const char *dir, const char *text) {
    char path[512];
    write_program(dir, "failing.py", text, path, sizeof path);
    const char *db = tfix_path("failing.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "1", "--", "python3", path, NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1, "exit %d\n%s", p.status, p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *failure = q_text(s, "SELECT failure FROM jobs ORDER BY id DESC LIMIT 1");
    sqlite3_close(s);
    return failure;
}

/* A Python rank that died of an exception raised while handling another
 * (implicit chaining) or from another (`raise ... from e`) is named by
 * the first exception, then the last, as Python prints them; one raised
 * `from None` (the chain suppressed, not printed) by its own. */
Test(program_run, a_chained_exception_is_named_from_where_it_started, .timeout = 120) {
    static const struct {
        const char *raise, *said;
    } cases[] = {
        {"except KeyError:\n    raise RuntimeError('the loader gave up')\n",
         "exited with code 1: KeyError: 'batch' (then: RuntimeError: the loader gave up)"},
        {"except KeyError as e:\n    raise RuntimeError('the loader gave up') from e\n",
         "exited with code 1: KeyError: 'batch' (then: RuntimeError: the loader gave up)"},
        {"except KeyError:\n    raise RuntimeError('the loader gave up') from None\n",
         "exited with code 1: RuntimeError: the loader gave up"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[32], text[256];
        snprintf(dir, sizeof dir, "chained%zu", i);
        snprintf(text, sizeof text, "try:\n    {}['batch']\n%s", cases[i].raise);
        char *failure = failure_of(dir, text);
        lt_assert_has(failure, cases[i].said);
        free(failure);
    }
}

/* A Python rank's failure is the exception its last traceback ends with,
 * whatever follows it (an atexit handler's line) and however many lines
 * its message has (the first has its type); an exception group by its
 * own line; a message line ending in ':' with the line under it
 * (torch.compile's "BackendCompilerFailed: backend='bad' raised:" then
 * the backend's error); a chain of three by the first and the last. */
Test(program_run, a_pythons_failure_is_the_exception_its_traceback_ends_with, .timeout = 120) {
    static const struct {
        const char *text, *said;
    } cases[] = {
        {"raise ValueError('line1\\nline2')\n", "exited with code 1: ValueError: line1"},
        {"import atexit, sys\n"
         "atexit.register(lambda: print('wandb: Synced 5 W&B file(s)', file=sys.stderr))\n"
         "raise ValueError('boom')\n",
         "exited with code 1: ValueError: boom"},
        {"raise ExceptionGroup('boom', [ValueError('x')])\n",
         "exited with code 1: ExceptionGroup: boom (1 sub-exception)"},
        {"raise RuntimeError(\"backend='bad' raised:\\nValueError: my backend broke\\n\\nYou can suppress this "
         "exception by setting:\\n    import torch._dynamo\\n\")\n",
         "exited with code 1: RuntimeError: backend='bad' raised: ValueError: my backend broke"},
        {"try:\n    {}['batch']\nexcept KeyError:\n    try:\n        raise OSError('disk')\n"
         "    except OSError:\n        raise RuntimeError('the loader gave up')\n",
         "exited with code 1: KeyError: 'batch' (then: RuntimeError: the loader gave up)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[32];
        snprintf(dir, sizeof dir, "traceback%zu", i);
        char *failure = failure_of(dir, cases[i].text);
        const char *at = strstr(failure, ") exited with code");
        cr_assert(at && strcmp(at + 2, cases[i].said) == 0, "case %zu: %s", i, failure);
        free(failure);
    }
}

/* Log records a rank wrote after its cause (logging at INFO while it shut
 * down, a warning of gloo's or Python's) are not what it died saying:
 * the line before them is, and a rank that said nothing else is named by
 * its exit code alone. */
Test(program_run, a_failure_is_named_by_the_line_before_the_log_records_after_it, .timeout = 120) {
    static const struct {
        const char *body, *said;
    } cases[] = {
        {"print('ERROR: checkpoint shard missing for rank 0', file=sys.stderr)\n"
         "logging.basicConfig(); logging.getLogger('train').setLevel('INFO')\n"
         "logging.getLogger('train').info('shutting down workers')\n"
         "sys.exit(2)\n",
         "exited with code 2: ERROR: checkpoint shard missing for rank 0"},
        {"print('[W1130 12:00:00.000000000 ProcessGroupGloo.cpp:727] Warning: Unable to resolve hostname', "
         "file=sys.stderr)\nwarnings.warn('old API')\nsys.exit(3)\n",
         "exited with code 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[32], text[512];
        snprintf(dir, sizeof dir, "noise%zu", i);
        snprintf(text, sizeof text, "import logging, sys, warnings\n%s", cases[i].body);
        char *failure = failure_of(dir, text);
        const char *at = strstr(failure, ") exited with code");
        cr_assert(at && strcmp(at + 2, cases[i].said) == 0, "case %zu: %s", i, failure);
        free(failure);
    }
}

/* A PYTHONPATH that already holds pprun's python/ (a checkout) besides the
 * copy `pprun run` adds: one finder, no error (each copy ran the other,
 * RecursionError, a finder a level), and the sitecustomize both shadow
 * runs once, and is the module `import sitecustomize` gives. */
Test(program_run, two_copies_of_pprun_sitecustomize_install_one_finder, .timeout = 120) {
    const char *dir = tfix_mkdir("distsite");
    char site[512], pythonpath[1200];
    snprintf(site, sizeof site, "%s/sitecustomize.py", dir);
    FILE *f = fopen(site, "w");
    cr_assert_not_null(f);
    fputs("print('the distribution sitecustomize ran', flush=True)\nFLAG = 42\n", f);
    fclose(f);
    snprintf(pythonpath, sizeof pythonpath, "PYTHONPATH=%s/../python:%s", PPRUN_EXAMPLES_DIR, dir);
    const char *env[] = {pythonpath, NULL};
    const char *args[] = {"run", "--db", tfix_path("twosites.db"), "--nproc-per-node", "2", "--steps", "1", "--",
                          "python3", "-c",
                          "import sys, sitecustomize; print('finders', sum(type(f).__name__ == '_PprunFinder' "
                          "for f in sys.meta_path), 'flag', getattr(sitecustomize, 'FLAG', None))",
                          NULL};
    lt_proc p;
    lt_run(&p, args, env);
    /* `import sitecustomize` is the program's own, as without pprun */
    lt_assert_has(p.out, "[0]: finders 1 flag 42");
    lt_assert_has(p.out, "[1]: finders 1 flag 42");
    cr_assert_null(strstr(p.err, "Error in sitecustomize"), "%s", p.err);
    cr_assert_null(strstr(p.err, "RecursionError"), "%s", p.err);
    const char *ran = strstr(p.out, "the distribution sitecustomize ran");
    cr_assert_not_null(ran, "%s", p.out);
    int times = 0;
    for (const char *q = p.out; (q = strstr(q, "the distribution sitecustomize ran")); q++) times++;
    cr_assert_eq(times, 2, "once a rank: %s", p.out);
    lt_free(&p);
}

/* The Python program at path in the host's python3 under `pprun run`, one
 * rank, to its end (exit 0). */
static void run_python_program(lt_proc *p, const char *db, const char *path) {
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "1", "--", "python3", path, NULL};
    lt_run(p, args, NULL);
    cr_assert_eq(p->status, 0, "exit %d\n%s\n%s", p->status, p->out, p->err);
}

/* pprun.span, used well and badly (tests/span_program.py): misuse raises
 * the same under pprun and outside it; a span refused (a name with a
 * control character or a NUL, a number past its field, bytes past 2^50)
 * is dropped and counted, never raised, the first said once with its
 * name escaped; a span ended in another thread than it began in, and an
 * async function's, are recorded whole; a decorated function's own
 * exception passes through as it is. */
Test(program_run, pprun_span_misuse_raises_the_same_everywhere_and_a_refused_span_never_raises, .timeout = 120) {
    static const char *const raised[] = {
        "raised ValueError: a name that is not text\n", "raised TypeError: a float step\n",
        "raised TypeError: bytes None\n", "raised TypeError: a generator function decorated\n",
        "KeyError passed through: 'its own'\n", "done\n"};
    const char *db = tfix_path("spans.db");
    lt_proc p;
    run_python_program(&p, db, PPRUN_TEST_DIR "/span_program.py");
    for (size_t i = 0; i < sizeof raised / sizeof raised[0]; i++) lt_assert_has(p.out, raised[i]);
    cr_assert_null(strstr(p.out, "no exception"), "%s", p.out);
    cr_assert_eq(lt_count(p.err, "not recorded"), 1, "the first refusal alone is said:\n%s", p.err);
    lt_assert_has(p.err, "span '\\x1b]0;owned\\x07' not recorded: pprun_trace_span: name has control byte 0x1b");
    cr_assert_null(strchr(p.err, '\x1b'), "no raw ESC reaches the terminal: %s", p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'SPAN'"), 5, "ok, gen, async twice, work");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'SPAN' AND name = 'gen' AND "
                               "end_ns - start_ns >= 20000000"),
                 1, "timed whole (20 ms asleep)");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'SPAN' AND name = 'async' AND "
                               "end_ns - start_ns >= 20000000"),
                 2, "each call timed from its own start (the first, 20 ms, took the second's, 10 ms later)");
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks"), 7, "each refused span counted");
    sqlite3_close(s);
    /* outside pprun: the same misuse raises the same, and nothing else is said */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s/../python python3 %s/span_program.py 2>&1", PPRUN_TEST_DIR,
             PPRUN_TEST_DIR);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    for (size_t i = 0; i < sizeof raised / sizeof raised[0]; i++) lt_assert_has(out, raised[i]);
    cr_assert_null(strstr(out, "pprun:"), "outside pprun the package says nothing: %s", out);
}

/* What programs do to pprun's package (tests/hostile_program.py), none
 * of which may break the program: a child forked before pprun loaded
 * records nothing (its spans went into the rank's ring beside the
 * parent's, two writers overwriting each other's slots, with no drop
 * counted), said once; a closed stderr, a RANK that is text and a
 * PPRUN_TRACE_FD past a C int raised from pprun's calls; a refused
 * span's long name reached the terminal raw after its escaped start. */
Test(program_run, a_program_that_forks_or_breaks_its_environment_runs_and_its_trace_holds, .timeout = 120) {
    static const char *const modes[] = {"fork", "stderr", "rank", "fd", "longname"};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        char db[64];
        snprintf(db, sizeof db, "hostile-%s.db", modes[i]);
        const char *path = tfix_path(db);
        const char *args[] = {"run", "--db", path, "--nproc-per-node", "1", "--", "python3",
                              PPRUN_TEST_DIR "/hostile_program.py", modes[i], NULL};
        lt_proc p;
        lt_run(&p, args, NULL);
        cr_assert_eq(p.status, 0, "%s: exit %d\n%s\n%s", modes[i], p.status, p.out, p.err);
        lt_assert_has(p.out, "done\n");
        cr_assert_null(strchr(p.err, '\x1b'), "%s: a raw ESC reached the terminal: %s", modes[i], p.err);
        sqlite3 *s = open_db(path);
        if (i == 0) {
            lt_assert_has(p.out, "parent tracing True");
            lt_assert_has(p.out, "child tracing False");
            cr_assert_eq(lt_count(p.err, "is written by process"), 1, "the child is told once:\n%s", p.err);
            cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name = 'parent'"), 200);
            cr_assert_eq(tfix_q_int(s, "SELECT count(DISTINCT step) FROM events WHERE name = 'parent'"), 200);
            cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name = 'child'"), 0);
            cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks"), 0);
        } else if (i == 2 || i == 3) {
            lt_assert_has(p.out, "tracing False");
        } else if (i == 4) {
            lt_assert_has(p.err, "name '\\x1b]0;OWNED\\x07\\x1b[2J\\x1b[31mRED");
            cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks"), 1, "the refused span counted");
        }
        sqlite3_close(s);
        lt_free(&p);
    }
}

/* A rank that starts programs before pprun's library loads
 * (tests/child_program.py: subprocesses, one holding another file at the
 * ring's descriptor number): they inherit the
 * variables, not the ring, and record nothing and say nothing (the one
 * holding another file said "not tracing: ... no ring header": the
 * library now checks that PPRUN_TRACE_FD is the file PPRUN_TRACE_RING
 * names); the rank's own spans are all stored. */
Test(program_run, a_program_the_rank_starts_does_not_write_its_ring, .timeout = 120) {
    const char *db = tfix_path("children.db");
    lt_proc p;
    run_python_program(&p, db, PPRUN_TEST_DIR "/child_program.py");
    lt_assert_has(p.out, "helper tracing=False\n");
    lt_assert_has(p.out, "other holds True: tracing=False\n");
    lt_assert_has(p.out, "rank tracing=True\n");
    cr_assert_null(strstr(p.err, "not tracing"), "a child says nothing of the rank's ring:\n%s", p.err);
    lt_free(&p);
    sqlite3 *s = open_db(db);
    char *names = q_text(s, "SELECT group_concat(name || ':' || n) FROM (SELECT name, count(*) AS n FROM events "
                            "WHERE phase = 'SPAN' GROUP BY name)");
    cr_assert_str_eq(names, "rank:3");
    free(names);
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks"), 0);
    sqlite3_close(s);
}

/* A wrapper that execs the real program (poetry run, pipenv run, a script
 * that re-execs itself) keeps the rank's ring: the exec keeps the process
 * and its descriptors, and pprun's site hook leaves the ring inheritable
 * until the library loads (making it close-on-exec at the start lost such
 * a job's whole trace, silently). */
Test(program_run, a_wrapper_that_execs_the_program_keeps_the_ring, .timeout = 120) {
    char path[512];
    write_program("execwrap", "wrapper.py",
                  "import os, sys\n"
                  "os.execv(sys.executable, [sys.executable, '-c', 'import pprun\\n"
                  "for i in range(3):\\n    with pprun.span(\"exec\", step=i):\\n        pass\\n"
                  "print(\"exec tracing=%s\" % pprun.tracing())'])\n",
                  path, sizeof path);
    const char *db = tfix_path("execwrap.db");
    lt_proc p;
    run_python_program(&p, db, path);
    lt_assert_has(p.out, "exec tracing=True");
    lt_free(&p);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase = 'SPAN' AND name = 'exec'"), 3);
    sqlite3_close(s);
}
