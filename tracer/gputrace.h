/* gputrace.h: CUPTI activity tracing of a --device cuda worker
 * (docs/design.md §6, docs/gpu.md "CUPTI tracing").
 *
 * The worker opens it before its first CUDA call (--cupti on). CUPTI then
 * records every kernel and memcpy with device start/end times on the host's
 * CLOCK_MONOTONIC (its timestamp callback returns pp_now_ns), so they share
 * the host spans' clock. The engine brackets each action (F, B or W with
 * its receive and send) with gputrace_op_begin/end and hands every host
 * record it writes to gputrace_host_span: each host op (RECV_F, F, SEND_F,
 * ...) closes a segment of the action and gets its own external
 * correlation id, so every kernel launched during that op is tied to it.
 * Once per step, after the optimizer, gputrace_step_end synchronises the
 * device, flushes CUPTI and writes into the rank's trace ring:
 *  - per op with device work, one span: the host op's record with source
 *    TRACE_SRC_GPU, start = first kernel/memcpy start, end = last end, and
 *    reserved = the span's number (1, 2, ... per rank and attempt);
 *  - then each of its kernels and memcpys (TRACE_KERNEL, tracer/event.h),
 *    their names (TRACE_KERNEL_NAME) before their first use;
 *  - TRACE_GPU_DROPPED with the records lost so far, when it changed.
 * Kernels launched outside any op (the optimizer, set-up) are kept with
 * span number 0 (no op).
 *
 * libcupti is dlopened on first use (soname libcupti.so.13, then the
 * toolkit's lib directory), so a CPU job never loads it. CUPTI calls its
 * buffer callbacks on its own threads: the records they copy are guarded by
 * a mutex. CUPTI's callbacks carry no user pointer, so one gputrace exists
 * per process (a second open fails).
 *
 * Every function but gputrace_open accepts NULL (tracing off): no-op. In a
 * build without the toolkit gputrace_open fails saying so. */
#ifndef PP_GPUTRACE_H
#define PP_GPUTRACE_H
#include <stdint.h>

#include "base/pp.h"
#include "tracer/event.h"
#include "tracer/ring.h"

typedef struct gputrace gputrace;

/* Loads libcupti, registers the timestamp callback, then the buffer
 * callbacks, then enables the activity kinds. ring is not owned. Fails
 * (-1, err naming the reason: no GPU backend, libcupti missing, another
 * profiler attached, a CUPTI error) leaving nothing enabled; the caller
 * goes on without GPU spans. Free with gputrace_close. */
int gputrace_open(trace_ring *ring, int rank, int attempt, gputrace **out, pp_err *err);
/* libcupti loads and has every function this file calls (no device
 * needed, none touched). 0, or -1 with the reason. */
int gputrace_available(pp_err *err);

/* The engine's threads: each call concerns the calling thread's action
 * (CUPTI's external ids are per thread), so the two halves of an
 * overlapped pair, run at once on two threads, get spans of their own. */
void gputrace_op_begin(gputrace *g);
void gputrace_host_span(gputrace *g, const trace_event *host);
void gputrace_op_end(gputrace *g);
/* Synchronises the device, flushes CUPTI and writes the step's records.
 * A CUPTI failure here turns GPU tracing off for the rest of the job with
 * one line on stderr; training goes on (always returns 0 then). */
int gputrace_step_end(gputrace *g, int step, pp_err *err);
/* Flushes what is left (forced), disables the kinds, frees. */
void gputrace_close(gputrace *g);

#endif
