/* test_trace_clock.c: NTP-style clock offset against a remote clock with a
 * known skew and a jittery, asymmetric network. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tracer/clock.h"

typedef struct fake_master {
    int64_t skew_ns;  /* master clock - this host's clock */
    unsigned seed;
    int calls, fail_at;
} fake_master;

/* Delays of up to 400 µs each way, drawn independently (asymmetric). */
static int remote_now(void *ctx, uint64_t *remote, pp_err *err) {
    fake_master *m = ctx;
    if (++m->calls == m->fail_at) return pp_fail(err, "store 127.0.0.1:29500: connection reset");
    pp_sleep_ns((uint64_t)(rand_r(&m->seed) % 400000));
    *remote = pp_now_ns() + (uint64_t)m->skew_ns;
    pp_sleep_ns((uint64_t)(rand_r(&m->seed) % 400000));
    return 0;
}

Test(trace_clock, finds_a_known_skew_within_half_the_best_round_trip) {
    int64_t skews[] = {0, 5000000000ll, -123456789ll};
    for (int k = 0; k < 3; k++) {
        fake_master m = {.skew_ns = skews[k], .seed = 42u + (unsigned)k};
        int64_t off;
        uint64_t rtt;
        pp_err err;
        cr_assert_eq(trace_clock_offset(remote_now, &m, 16, &off, &rtt, &err), 0, "%s", err.msg);
        cr_assert_eq(m.calls, 16);
        int64_t error = off - skews[k];
        cr_assert_leq(llabs(error), (long long)rtt / 2 + 20000, "offset %lld for skew %lld (rtt %llu)",
                      (long long)off, (long long)skews[k], (unsigned long long)rtt);
        cr_assert_gt(rtt, 0);
    }
}

Test(trace_clock, local_test_skew_is_measured) {
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "3000000000", 1);
    fake_master m = {.skew_ns = 0, .seed = 7};
    int64_t off;
    uint64_t rtt;
    pp_err err;
    int rc = trace_clock_offset(remote_now, &m, 8, &off, &rtt, &err);
    uint64_t local = trace_clock_now_ns(), real = pp_now_ns();
    unsetenv("PPRUN_TEST_CLOCK_SKEW_NS");
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_leq(llabs(off + 3000000000ll), (long long)rtt / 2 + 20000, "offset %lld", (long long)off);
    cr_assert_geq(local - real, 2900000000ull, "the trace clock carries the skew");
}

Test(trace_clock, errors_name_the_round_and_the_bad_variable) {
    fake_master m = {.seed = 1, .fail_at = 3};
    int64_t off;
    uint64_t rtt;
    pp_err err;
    cr_assert_eq(trace_clock_offset(remote_now, &m, 5, &off, &rtt, &err), -1);
    cr_assert(strstr(err.msg, "round 3 of 5") && strstr(err.msg, "connection reset"), "%s", err.msg);
    cr_assert_eq(trace_clock_offset(remote_now, &m, 0, &off, &rtt, &err), -1);
    setenv("PPRUN_TEST_CLOCK_SKEW_NS", "12ms", 1);
    m.calls = 0;
    int rc = trace_clock_offset(remote_now, &m, 2, &off, &rtt, &err);
    unsetenv("PPRUN_TEST_CLOCK_SKEW_NS");
    cr_assert_eq(rc, -1);
    cr_assert(strstr(err.msg, "PPRUN_TEST_CLOCK_SKEW_NS"), "%s", err.msg);
}
