/* test_cpuwait.c: trace_cpu_wait_since_last (tracer/cpuwait.c) against the
 * kernel's own count. A thread that shares its core with a busy one waits
 * for it; its calls' values, read or skipped (the thread's rseq area says
 * it kept its core), add up to the run_delay the test reads itself around
 * each call; most calls skip the read; a thread without an rseq area reads
 * every time; a forked child starts over. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tracer/cpuwait.h"

/* The calling thread's run_delay, read by the test itself. */
static uint64_t own_run_delay(int fd) {
    char buf[96];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    cr_assert(n > 0, "reading /proc/thread-self/schedstat");
    buf[n] = '\0';
    unsigned long long on_cpu, delay;
    cr_assert_eq(sscanf(buf, "%llu %llu", &on_cpu, &delay), 2, "schedstat: %s", buf);
    return delay;
}

/* Whether glibc registered an rseq area for the calling thread. */
static int has_rseq(void) {
    if (__rseq_size < 16) return 0;
    struct rseq *r = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    return (int32_t)r->cpu_id >= 0;
}

static atomic_int stop;

static void *busy(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    }
    return NULL;
}

static void spin(unsigned *seed) {
    for (volatile int i = rand_r(seed) % 20000; i > 0; i--) {
    }
}

/* n calls on this thread, a busy thread on the same core: each call's
 * value checked against the test's own reads of run_delay (R) before the
 * first call (r_before), after it (r_first) and after each call
 * (r[i]). The calls' sum S up to call i took its last read no earlier
 * than the test's read after call i-1 (a skipped read means no wait
 * since), and no later than the test's read after call i: so
 *     r[i-1] - r_first <= S <= r[i] - r_before,
 * whatever was skipped; a skip that hid a wait breaks the left side. */
static void calls_add_up(int n, uint64_t *reads, uint64_t *waited) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setaffinity_np(&attr, sizeof one, &one);
    pthread_t other;
    atomic_store(&stop, 0);
    cr_assert_eq(pthread_create(&other, &attr, busy, NULL), 0);
    pthread_attr_destroy(&attr);

    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    cr_assert(fd >= 0);
    unsigned seed = 7;
    uint64_t r_before = own_run_delay(fd);
    uint64_t reads0 = trace_cpu_wait_reads();
    cr_assert_eq(trace_cpu_wait_since_last(), 0, "the first call is the baseline");
    uint64_t r_first = own_run_delay(fd), prev = r_first, sum = 0;
    for (int i = 0; i < n; i++) {
        spin(&seed);
        sum += trace_cpu_wait_since_last();
        uint64_t r = own_run_delay(fd);
        cr_assert(prev - r_first <= sum && sum <= r - r_before,
                  "call %d: the calls' waits add to %llu ns; the kernel's count went from %llu (before the first) "
                  "and %llu (after it) to %llu before this call and %llu after",
                  i, (unsigned long long)sum, (unsigned long long)r_before, (unsigned long long)r_first,
                  (unsigned long long)prev, (unsigned long long)r);
        prev = r;
    }
    *reads = trace_cpu_wait_reads() - reads0;
    *waited = sum;
    atomic_store(&stop, 1);
    pthread_join(other, NULL);
    close(fd);
}

Test(cpuwait, waits_add_up_to_the_kernels_count_and_most_reads_are_skipped) {
    uint64_t reads, waited;
    calls_add_up(3000, &reads, &waited);
    cr_assert_gt(waited, 0, "sharing its core with a busy thread, the thread waited for it");
    if (!trace_cpu_wait_skips()) {
        /* the values checked all the same; this kernel or glibc lets no read be skipped */
        cr_assert_eq(reads, 3001, "%llu reads for 3001 calls", (unsigned long long)reads);
        cr_skip_test("no read skipped here: %s",
                     has_rseq() ? "the kernel's rseq_cs does not say switches (Linux 6.19+, or rseq debugging)"
                                : "glibc registered no rseq area for this thread");
    }
    cr_assert_lt(reads, 3001 / 2, "%llu reads for 3001 calls: the thread mostly kept its core between calls",
                 (unsigned long long)reads);
    cr_assert_gt(reads, 1, "a switch between calls makes the next call read");
}

/* What a thread whose rseq area glibc did not register (valgrind, glibc's
 * tunable off) does: the kernel's own answer to its unregistration. */
static void *without_rseq(void *out) {
    struct rseq *r = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    long rc = syscall(SYS_rseq, r, 32, 1 /* RSEQ_FLAG_UNREGISTER */, RSEQ_SIG);
    if (rc != 0) rc = syscall(SYS_rseq, r, __rseq_size, 1, RSEQ_SIG);
    uint64_t *res = out;
    res[2] = rc == 0 && !has_rseq();
    calls_add_up(300, &res[0], &res[1]);
    res[2] = res[2] && !trace_cpu_wait_skips();
    return NULL;
}

Test(cpuwait, a_thread_without_an_rseq_area_reads_every_time) {
    if (!has_rseq()) cr_skip_test("glibc registered no rseq area for this thread (glibc < 2.35, or turned off)");
    trace_cpu_wait_since_last(); /* the process's first record: its probe, here, where the thread has its area */
    uint64_t res[3] = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, without_rseq, res), 0);
    pthread_join(t, NULL);
    cr_assert_eq(res[2], 1, "the thread's rseq area unregistered, and its calls do not skip");
    cr_assert_eq(res[0], 301, "%llu reads for 301 calls", (unsigned long long)res[0]);
}

Test(cpuwait, a_forked_child_starts_over) {
    trace_cpu_wait_since_last();
    trace_cpu_wait_since_last();
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t before = trace_cpu_wait_reads();
        uint32_t first = trace_cpu_wait_since_last();
        _exit(first == 0 && trace_cpu_wait_reads() == before + 1 ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child's first call reads its own thread's count and gives 0");
}
