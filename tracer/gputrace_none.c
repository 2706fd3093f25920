/* gputrace_none.c: gputrace.h in a build without the CUDA toolkit: there is
 * nothing to trace, so opening says why and the rest are no-ops. The real
 * one is tracer/cuda/cupti.c. */
#ifndef PPRUN_HAVE_CUDA
#include "tracer/gputrace.h"

int gputrace_open(trace_ring *ring, int rank, int attempt, gputrace **out, pp_err *err) {
    (void)ring, (void)rank, (void)attempt;
    *out = NULL;
    return pp_fail(err, "CUPTI: this pprun was built without the GPU backend");
}

int gputrace_available(pp_err *err) { return pp_fail(err, "CUPTI: this pprun was built without the GPU backend"); }

void gputrace_op_begin(gputrace *g) { (void)g; }
void gputrace_host_span(gputrace *g, const trace_event *host) { (void)g, (void)host; }
void gputrace_op_end(gputrace *g) { (void)g; }
int gputrace_step_end(gputrace *g, int step, pp_err *err) {
    (void)g, (void)step, (void)err;
    return 0;
}
void gputrace_close(gputrace *g) { (void)g; }
#else
typedef int gputrace_none_unused; /* ISO C wants a translation unit to declare something */
#endif
