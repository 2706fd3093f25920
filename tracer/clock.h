/* clock.h: a node's clock offset to the master, measured NTP-style.
 *
 * Every host stamps trace records with its own CLOCK_MONOTONIC (pp_now_ns,
 * which reads it through the TSC where that is safe: base/pp.c). At
 * rendezvous each non-master launcher asks the master for its clock a few
 * times (the store's TIME op) and keeps the round trip with the smallest
 * duration: offset = remote - (t0 + t1) / 2, where t0/t1 are the local
 * clock before the request and after the answer. The error of that estimate
 * is at most rtt / 2. job clock = local timestamp + offset. */
#ifndef PP_TRACE_CLOCK_H
#define PP_TRACE_CLOCK_H
#include <stdint.h>

#include "base/pp.h"

/* This host's trace clock: pp_now_ns() plus the test-only skew of env
 * PPRUN_TEST_CLOCK_SKEW_NS (signed ns, 0 when unset). trace_ring_write adds
 * the same skew to what the worker records, so a launcher run with that
 * variable behaves like a node whose clock is off by that much. */
uint64_t trace_clock_now_ns(void);
/* The test-only skew; fails on a malformed PPRUN_TEST_CLOCK_SKEW_NS. */
int trace_clock_test_skew(int64_t *skew_ns, pp_err *err);

/* remote_now: one round trip asking the master for its clock; fills
 * *remote_ns, returns 0 or -1 with err filled. rounds >= 1. On success
 * *offset_ns = master clock - this host's trace clock, *rtt_ns = the
 * smallest round trip seen. Either clock reading past TRACE_TIME_MAX
 * fails naming it, so an offset given is within +-TRACE_OFFSET_MAX
 * (tracer/event.h), the bound the master checks a forwarder's against. */
int trace_clock_offset(int (*remote_now)(void *ctx, uint64_t *remote_ns, pp_err *err), void *ctx, int rounds,
                       int64_t *offset_ns, uint64_t *rtt_ns, pp_err *err);

#endif
