/* clock.c: NTP-style offset of this host's clock to the master's. */
#include "tracer/clock.h"

#include <errno.h>
#include <stdlib.h>

#include "tracer/event.h"

int trace_clock_test_skew(int64_t *skew_ns, pp_err *err) {
    *skew_ns = 0;
    const char *s = getenv("PPRUN_TEST_CLOCK_SKEW_NS");
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return pp_fail(err, "PPRUN_TEST_CLOCK_SKEW_NS: expected a signed integer of nanoseconds, got '%s'", s);
    *skew_ns = v;
    return 0;
}

uint64_t trace_clock_now_ns(void) {
    int64_t skew;
    if (trace_clock_test_skew(&skew, NULL) != 0) skew = 0;
    return pp_now_ns() + (uint64_t)skew;
}

int trace_clock_offset(int (*remote_now)(void *ctx, uint64_t *remote_ns, pp_err *err), void *ctx, int rounds,
                       int64_t *offset_ns, uint64_t *rtt_ns, pp_err *err) {
    if (rounds < 1) return pp_fail(err, "clock offset: rounds must be at least 1, got %d", rounds);
    int64_t skew;
    if (trace_clock_test_skew(&skew, err) != 0) return -1;
    uint64_t best_rtt = UINT64_MAX;
    int64_t best_off = 0;
    for (int i = 0; i < rounds; i++) {
        uint64_t remote;
        uint64_t t0 = pp_now_ns() + (uint64_t)skew;
        if (remote_now(ctx, &remote, err) != 0) return pp_wrap(err, "clock offset (round %d of %d)", i + 1, rounds);
        uint64_t t1 = pp_now_ns() + (uint64_t)skew;
        uint64_t rtt = t1 - t0;
        /* Either clock past the largest time a record may carry is broken
         * (or the answer forged): its difference would be no offset of
         * two real clocks, and would shift this node's records anywhere.
         * Within it, the difference is within +-TRACE_OFFSET_MAX. */
        if (remote > TRACE_TIME_MAX || t1 > TRACE_TIME_MAX)
            return pp_fail(err, "clock offset (round %d of %d): %s clock reads %llu ns, past the largest time a record "
                                "may carry (%lld ns): it is broken", i + 1, rounds,
                           remote > TRACE_TIME_MAX ? "the master's" : "this host's",
                           (unsigned long long)(remote > TRACE_TIME_MAX ? remote : t1), (long long)TRACE_TIME_MAX);
        if (rtt < best_rtt) {
            best_rtt = rtt;
            /* (t0 + t1) / 2 without overflow */
            uint64_t mid = t0 + rtt / 2;
            best_off = (int64_t)remote - (int64_t)mid;
        }
    }
    *offset_ns = best_off;
    *rtt_ns = best_rtt;
    return 0;
}
