/* fuzz_sched_csv.c: libFuzzer target for the schedule CSV reader
 * (sched_parse_csv): any bytes, as a file named with csv:FILE would hold.
 *
 * Besides what the sanitizers catch, it checks what the reader promises:
 * a plan it returns passes the validator or is refused with a message,
 * simulates when valid, and draws as a grid; every message names the
 * source, and term_escape makes it safe for a terminal (no control
 * character, the same when escaped again).
 *
 * Built with the fuzz build (tests/fuzz/CMakeLists.txt; `scripts/test.sh
 * fuzz` runs it):
 *
 *   ./build-fuzz/fuzz_sched_csv -max_total_time=60 -max_len=4096 CORPUS_DIR */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/pp.h"
#include "base/term.h"
#include "sched/sched.h"

/* Fails the run (libFuzzer reports the input) when the check does not hold. */
#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) __builtin_trap();                                                                                 \
    } while (0)

/* An escaped message: printable, valid UTF-8 (the escaper's own output),
 * with no control character but the newlines a grid has; escaping it again
 * changes nothing. */
static void check_escaped(const char *msg) {
    size_t n = strlen(msg);
    char *once = term_dup(msg, n, TERM_LINES);
    CHECK(once);
    for (const unsigned char *p = (const unsigned char *)once; *p; p++) {
        CHECK(*p >= 0x20 || *p == '\n' || *p == '\t' || *p == '\r');
        CHECK(*p != 0x7f);
        CHECK(!(p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0)); /* C1 as UTF-8 */
    }
    char *twice = term_dup(once, strlen(once), TERM_LINES);
    CHECK(twice && strcmp(once, twice) == 0);
    free(twice);
    free(once);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    if (sched_parse_csv((const char *)data, size, "fuzz.csv", &plan, &err) != 0) {
        CHECK(!plan);
        CHECK(strstr(err.msg, "fuzz.csv"));
        check_escaped(err.msg);
        return 0;
    }
    CHECK(plan && plan->ranks > 0 && plan->stages > 0 && plan->microbatches > 0);
    char *grid = sched_grid_text(plan, NULL, 16, 8);
    CHECK(grid);
    free(grid);
    if (sched_validate(plan, &err) != 0) {
        check_escaped(err.msg);
    } else if ((long)plan->stages * plan->microbatches <= 100000) {
        sched_costs costs = {1, 1, 1, 0.5, 0, 0};
        sched_sim *sim = NULL;
        if (sched_simulate(plan, &costs, &sim, &err) == 0) {
            CHECK(sim->step_time > 0 && sim->bubble_ratio >= 0 && sim->bubble_ratio < 1);
            sched_sim_free(sim);
        }
    }
    sched_free(plan);
    return 0;
}
