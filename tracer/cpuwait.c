/* cpuwait.c: per-thread time waiting for a core, from the kernel's
 * schedstat (cpuwait.h). */
#include "tracer/cpuwait.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* Per thread: its schedstat file (-1 not opened yet, -2 not available) and
 * the run_delay at its previous call. The file is closed when the thread
 * ends (the key's destructor), and a forked child drops its copy: it names
 * the parent's thread. */
static __thread int cpuwait_fd = -1;
static __thread uint64_t cpuwait_last;
static pthread_key_t cpuwait_key;
static pthread_once_t cpuwait_once = PTHREAD_ONCE_INIT;

static void close_at_exit(void *fd_plus_one) { close((int)(intptr_t)fd_plus_one - 1); }

static void drop_after_fork(void) {
    if (cpuwait_fd >= 0) close(cpuwait_fd);
    cpuwait_fd = -1;
    pthread_setspecific(cpuwait_key, NULL);
}

static void cpuwait_init(void) {
    pthread_key_create(&cpuwait_key, close_at_exit);
    pthread_atfork(NULL, NULL, drop_after_fork);
}

/* The thread's run_delay (ns), or -1. */
static int64_t run_delay(void) {
    if (cpuwait_fd == -1) {
        pthread_once(&cpuwait_once, cpuwait_init);
        cpuwait_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (cpuwait_fd < 0) cpuwait_fd = -2;
        else pthread_setspecific(cpuwait_key, (void *)(intptr_t)(cpuwait_fd + 1));
    }
    if (cpuwait_fd < 0) return -1;
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
    int first = cpuwait_fd == -1;
    int64_t now = run_delay();
    if (now < 0) return 0;
    uint64_t since = first || (uint64_t)now < cpuwait_last ? 0 : (uint64_t)now - cpuwait_last;
    cpuwait_last = (uint64_t)now;
    return since > UINT32_MAX ? UINT32_MAX : (uint32_t)since;
}
