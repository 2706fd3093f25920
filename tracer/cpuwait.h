/* cpuwait.h: how long the calling thread waited for a core (docs/design.md
 * §6, "Waiting for a core").
 *
 * A rank that shares its cores with other ranks (or other work) is
 * sometimes runnable and not running: its op, or the send it was in, took
 * longer for want of a core. Wall time alone names that communication or
 * bubble. The kernel counts it per thread (the second number of
 * /proc/thread-self/schedstat, run_delay: ns spent on a runqueue); each
 * trace record carries the part of it since the thread's previous record,
 * so a rank's records add up to all its waiting, and the analyses name a
 * gap `wait_cpu` when most of it was that (docs/schema.md, "gaps"). */
#ifndef PP_TRACE_CPUWAIT_H
#define PP_TRACE_CPUWAIT_H
#include <stdint.h>

/* The ns the calling thread spent runnable but not running since its
 * previous call (since its first call: 0), saturated at UINT32_MAX; 0 where
 * the kernel does not count it (no schedstat). One read of a /proc file
 * the thread keeps open until it ends (a few microseconds, tens right
 * after a rank's work), or none where the thread has kept its core since
 * the last read (cpuwait.c: its rseq area says so). */
uint32_t trace_cpu_wait_since_last(void);

/* How many reads the calling thread's calls made, and whether they skip
 * reads where they can (cpuwait.c; once the thread has called): for
 * tests and benches. */
uint64_t trace_cpu_wait_reads(void);
int trace_cpu_wait_skips(void);

#endif
