/* test_job_signals.c: the stop signals held by nesting holds
 * (runner/job/job_signals.h), in the order `pprun run` takes and ends
 * them with an MPS daemon: the daemon's hold from before the workers to
 * after them, the job's end's hold from the workers' start to the
 * recorded end, the daemon's ending first. */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>

#include "runner/job/job_signals.h"

static volatile sig_atomic_t mine;
static void my_handler(int sig) { mine = sig; }

static void install_mine(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = my_handler;
    for (int s = 0; s < 3; s++) sigaction((int[]){SIGINT, SIGTERM, SIGHUP}[s], &sa, NULL);
    mine = 0;
}

Test(job_signals, a_signal_is_held_until_the_last_hold_ends_whatever_order_they_end_in) {
    install_mine();
    job_signals_hold();        /* the MPS daemon's */
    job_signals_hold();        /* the job's end's */
    job_signals_release();     /* the daemon stops first */
    cr_assert_eq(raise(SIGTERM), 0);
    cr_assert_eq(mine, 0, "a SIGTERM reached the launcher's handler while the job's end was held");
    cr_assert_eq(job_signals_take(), SIGTERM, "the held SIGTERM was not noted");
    cr_assert_eq(job_signals_take(), 0, "taken twice");
    job_signals_release();     /* the job's end is recorded */
    cr_assert_eq(raise(SIGINT), 0);
    cr_assert_eq(mine, SIGINT, "the handlers from before the first hold are not back");
    job_signals_release(); /* one release too many changes nothing */
    cr_assert_eq(raise(SIGHUP), 0);
    cr_assert_eq(mine, SIGHUP);
}

Test(job_signals, only_the_first_signal_is_noted) {
    install_mine();
    job_signals_hold();
    raise(SIGHUP);
    raise(SIGTERM);
    job_signals_release();
    cr_assert_eq(job_signals_take(), SIGHUP);
    cr_assert_eq(mine, 0);
}
