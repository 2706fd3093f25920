/* ring.h: the per-rank trace ring in shared memory (docs/design.md §1, §6).
 *
 * The launcher creates one ring per local rank (an anonymous memfd, so nothing
 * is left in /dev/shm when it dies, sealed against shrinking and growing
 * so that no worker can pull pages from under the launcher's mapping) and
 * keeps it mapped; the worker maps the
 * same memory from the fd the launcher passes it (env PPRUN_TRACE_FD). Single producer
 * (the worker), single consumer (the collector). A record becomes visible
 * only when complete; a full ring counts a drop and never blocks. Because
 * the launcher holds the mapping, what a worker wrote before it died
 * (SIGKILL included) is still drained.
 *
 * CONTRACT: the engine writes, the collector reads. */
#ifndef PP_TRACE_RING_H
#define PP_TRACE_RING_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"
#include "tracer/event.h"

typedef struct trace_ring trace_ring;

/* Launcher side: capacity in records (rounded up to a power of two). The fd
 * is close-on-exec: pass it to its worker explicitly (launch_env_pass_fd). */
int trace_ring_create(size_t capacity, trace_ring **out, pp_err *err);
int trace_ring_fd(const trace_ring *ring);
/* Worker side: maps the ring behind fd and checks its header/version. The
 * fd stays the caller's (it may close it after attach: the mapping stays).
 * Test-only clock skew: when env PPRUN_TEST_CLOCK_SKEW_NS is set (signed
 * ns), every record written through this ring has it added to start_ns and
 * end_ns, as if this host's clock were off by that much; the launcher's
 * offset estimate (trace_clock_offset, which reads the same variable) then
 * measures it and the collector takes it out again. */
int trace_ring_attach(int fd, trace_ring **out, pp_err *err);
/* Producer side, once before a process's first record: makes process pid
 * the ring's one writer, taking over from a writer that is gone (a
 * restarted attempt, a program of the rank that ended). 0, or the pid of
 * the live process that writes it: a process forked before it loaded the
 * library (its at-fork handler cannot know), a second program of the
 * rank; two writers would overwrite each other's slots. */
int trace_ring_claim(trace_ring *ring, int pid);
/* Consumer side: the pid that last claimed the ring, 0 when no process
 * ever did (its rank never loaded the library: pprun's "no records"
 * message tells the two apart). */
int trace_ring_writer(const trace_ring *ring);
/* Hot path: a few stores, no lock, no syscall, no allocation. Returns 1,
 * or 0 when the ring was full and the record was counted as dropped. */
int trace_ring_write(trace_ring *ring, const trace_event *ev);
/* Producer side: counts n records as dropped without writing them (a
 * record the producer's own checks refused, or records a producer that
 * stopped tracing did not make: the job shows them lost, as a full ring's).
 * The counter saturates at INT64_MAX (what the store's integer holds). */
void trace_ring_count_dropped(trace_ring *ring, uint64_t n);
/* Records written and not read (peeked) yet; capacity in records. */
size_t trace_ring_pending(const trace_ring *ring);
size_t trace_ring_capacity(const trace_ring *ring);
/* Collector side. trace_ring_peek copies up to max complete records,
 * oldest first, from the consumer's cursor and moves it past them; the
 * slots stay taken until trace_ring_release gives back everything before
 * the cursor. A consumer that stores what it reads releases only once it
 * is stored, with trace_ring_position (the cursor) beside the records, so
 * that a consumer killed in between loses nothing and the next one
 * (trace_ring_attach, then trace_ring_skip_to that position) stores
 * nothing twice. trace_ring_read is peek then release. */
size_t trace_ring_peek(trace_ring *ring, trace_event *dst, size_t max);
void trace_ring_release(trace_ring *ring);
size_t trace_ring_read(trace_ring *ring, trace_event *dst, size_t max);
uint64_t trace_ring_position(const trace_ring *ring);
/* NULL while the ring is healthy; once a peek (or skip) found a header no
 * producer could have written (a head more than a ring's worth past the
 * tail, or behind what was read: a worker scribbling over its own
 * mapping), why, and the ring is disabled for good: peek reads nothing
 * more, and trace_ring_dropped stays at what the producer had counted
 * plus the records the header claimed unread (at least 1, at most the
 * capacity). The consumer never trusts the shared tail after attach. */
const char *trace_ring_fault(const trace_ring *ring);
/* Moves the cursor forward to pos (never back, never past what was
 * written; otherwise it stays) and releases. */
void trace_ring_skip_to(trace_ring *ring, uint64_t pos);
/* Random, fixed at creation, never 0: names the ring in the store. */
uint64_t trace_ring_id(const trace_ring *ring);
/* What names the ring's open file itself, "DEV:INODE" of its fd, into
 * out (n bytes; "" when fd is not open): the launcher gives a rank it as
 * PPRUN_TRACE_RING beside PPRUN_TRACE_FD, so that a process the rank
 * started, which inherits the variables but whose descriptor of that
 * number is another file or none, can tell (trace_fd_is_ring) without
 * reading it. */
void trace_fd_identity(int fd, char *out, size_t n);
/* Whether fd is the file `identity` (trace_fd_identity) names; 1 too
 * when identity is NULL (a launcher that gave none). */
int trace_fd_is_ring(int fd, const char *identity);
uint64_t trace_ring_dropped(const trace_ring *ring);
/* Unmaps and frees; closes the fd only on the creating side. */
void trace_ring_close(trace_ring *ring);

#endif
