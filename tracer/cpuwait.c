/* cpuwait.c: per-thread time waiting for a core, from the kernel's
 * schedstat (cpuwait.h).
 *
 * A read of schedstat is a system call and /proc's formatting: right after
 * a rank's work, with the kernel's code cold, it is most of what a record
 * costs (docs/design.md §6, "Waiting for a core"). But run_delay only grows
 * when the thread gets a core back after waiting for one, that is after
 * it was switched out; and after every switch (and every migration or
 * signal) the kernel clears the thread's restartable-sequence pointer
 * (rseq_cs of the rseq area glibc registers for each thread) before the
 * thread runs its own code again, unless it was inside that sequence. So
 * each read first points rseq_cs at a descriptor of this file's whose
 * sequence covers no instruction; while it still points there, the thread
 * has not been switched out since that read, and its wait since then is
 * exactly 0: no read. Linux 6.19 and later clear it only after a switch
 * that interrupted the thread's own code, not after one inside a system
 * call (a thread woken from a blocking receive keeps the pointer): so
 * each process first tries whether a sleep clears it, and where it does
 * not, or where glibc registered no rseq area (GLIBC_TUNABLES=
 * glibc.pthread.rseq=0, valgrind, a kernel before 4.18), every call
 * reads, as does a build without <sys/rseq.h> (glibc before 2.35). A
 * thread that unregisters its rseq area after its first record would
 * keep the marker for good: glibc's own area is for the thread's life. */
#include "tracer/cpuwait.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include) && defined(__has_builtin)
#if __has_include(<sys/rseq.h>) && __has_builtin(__builtin_thread_pointer)
#include <sys/rseq.h>
#define CPUWAIT_RSEQ 1
#endif
#endif

/* Per thread: its schedstat file (-1 not opened yet, -2 not available),
 * the run_delay at its previous read, its reads (for tests) and its rseq
 * area (NULL: none, read every time). The file is closed when the thread
 * ends (the key's destructor: glibc runs it after any dlclose, so the
 * library is linked -z nodelete and never unmapped), and a forked child
 * drops its copy: it names the parent's thread. */
static __thread int cpuwait_fd = -1;
static __thread uint64_t cpuwait_last, cpuwait_reads;
static pthread_key_t cpuwait_key;
static pthread_once_t cpuwait_once = PTHREAD_ONCE_INIT;

#ifdef CPUWAIT_RSEQ
/* The descriptor rseq_cs points at after a read. The kernel checks it as
 * any sequence's before clearing the pointer: a sequence of no bytes
 * (post_commit_offset 0) whose abort address follows the signature glibc
 * registered the area with (RSEQ_SIG), or it kills the process. In a page
 * of its own, mapped once and never unmapped: a thread's rseq_cs may point
 * at it for as long as the thread lives, after a dlclose of this library
 * too; and mmap's address carries no tag (a tagged heap pointer, arm64's
 * memory tagging, is past the kernel's bound for a user address). */
typedef struct {
    struct rseq_cs cs;
    uint32_t signature;
} cpuwait_marker;
static cpuwait_marker *cpuwait_mark;
static __thread struct rseq *cpuwait_rseq;

/* The calling thread's rseq area, where glibc registered one (its cpu_id
 * is a CPU's number then, negative otherwise), else NULL. */
static struct rseq *thread_rseq(void) {
    if (__rseq_size < offsetof(struct rseq, rseq_cs) + sizeof(uint64_t)) return NULL;
    struct rseq *r = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    return (int32_t)__atomic_load_n(&r->cpu_id, __ATOMIC_RELAXED) >= 0 ? r : NULL;
}

static void point_at(struct rseq *r, const cpuwait_marker *m) {
    __atomic_store_n(&r->rseq_cs, m ? (uint64_t)(uintptr_t)&m->cs : 0, __ATOMIC_RELAXED);
}

static int points_at(const struct rseq *r, const cpuwait_marker *m) {
    return __atomic_load_n(&r->rseq_cs, __ATOMIC_RELAXED) == (uint64_t)(uintptr_t)&m->cs;
}

/* Whether the marker says what this file takes it to say on this kernel:
 * three sleeps (each one a switch inside a system call) each clear it,
 * signals blocked (a handled signal clears it too, switch or not), and a
 * system call that does not switch (getppid, one of three tries: a try
 * may be preempted) leaves it (a kernel debugging rseq clears it at every
 * system call's return, and no read would ever be skipped). */
static int marker_works(struct rseq *r, const cpuwait_marker *m) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int cleared = 0, kept = 0;
    for (int i = 0; i < 3; i++) {
        point_at(r, m);
        cleared += nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL) == 0 && !points_at(r, m);
        point_at(r, m);
        getppid();
        kept += points_at(r, m);
    }
    point_at(r, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return cleared == 3 && kept > 0;
}

/* Once a process, in the first thread that records: the marker, where
 * that thread has an rseq area and the kernel clears it (above). */
static void marker_init(void) {
    struct rseq *r = thread_rseq();
    if (!r) return; /* no marker: every call reads */
    cpuwait_marker *m = mmap(NULL, sizeof *m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    m->signature = RSEQ_SIG; /* the rest is 0: version, flags, and a sequence of no bytes */
    uint64_t after = (uint64_t)(uintptr_t)(&m->signature + 1);
    m->cs.start_ip = after, m->cs.abort_ip = after;
    if (marker_works(r, m))
        cpuwait_mark = m;
    else
        munmap(m, sizeof *m); /* no thread points at it: the probe cleared its own */
}

/* Whether the thread has run without a switch since its last read. */
static int not_switched_out(void) { return cpuwait_rseq && points_at(cpuwait_rseq, cpuwait_mark); }

/* Before a read, so that a switch during it (after its value was taken)
 * makes the next call read again. */
static void mark_read(void) {
    if (cpuwait_rseq) point_at(cpuwait_rseq, cpuwait_mark);
}

/* A thread's first read: whether its calls skip reads (its rseq area). */
static void thread_attach(void) { cpuwait_rseq = cpuwait_mark ? thread_rseq() : NULL; }
static int thread_skips(void) { return cpuwait_rseq != NULL; }
#else
static void marker_init(void) {}
static int not_switched_out(void) { return 0; }
static void mark_read(void) {}
static void thread_attach(void) {}
static int thread_skips(void) { return 0; }
#endif

static void close_at_exit(void *fd_plus_one) { close((int)(intptr_t)fd_plus_one - 1); }

static void drop_after_fork(void) {
    if (cpuwait_fd >= 0) close(cpuwait_fd);
    cpuwait_fd = -1;
    pthread_setspecific(cpuwait_key, NULL);
}

static void cpuwait_init(void) {
    pthread_key_create(&cpuwait_key, close_at_exit);
    pthread_atfork(NULL, NULL, drop_after_fork);
    marker_init();
}

/* The thread's run_delay (ns), or -1. */
static int64_t run_delay(void) {
    if (cpuwait_fd == -1) {
        pthread_once(&cpuwait_once, cpuwait_init);
        cpuwait_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (cpuwait_fd < 0) {
            cpuwait_fd = -2;
        } else {
            pthread_setspecific(cpuwait_key, (void *)(intptr_t)(cpuwait_fd + 1));
            thread_attach();
        }
    }
    if (cpuwait_fd < 0) return -1;
    mark_read();
    cpuwait_reads++;
    /* "on-cpu-ns run-delay-ns timeslices\n" */
    char buf[96];
    ssize_t n = pread(cpuwait_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *end;
    strtoull(buf, &end, 10);
    if (end == buf || *end != ' ') return -1;
    const char *second = end + 1;
    uint64_t delay = strtoull(second, &end, 10);
    return end == second ? -1 : (int64_t)delay;
}

uint32_t trace_cpu_wait_since_last(void) {
    if (cpuwait_fd >= 0 && not_switched_out()) return 0; /* no wait since the last read (above) */
    int first = cpuwait_fd == -1;
    int64_t now = run_delay();
    if (now < 0) return 0;
    uint64_t since = first || (uint64_t)now < cpuwait_last ? 0 : (uint64_t)now - cpuwait_last;
    cpuwait_last = (uint64_t)now;
    return since > UINT32_MAX ? UINT32_MAX : (uint32_t)since;
}

uint64_t trace_cpu_wait_reads(void) { return cpuwait_reads; }

int trace_cpu_wait_skips(void) { return thread_skips(); }
