/* job_signals.c: stop signals held, nesting (job_signals.h). */
#include "runner/job/job_signals.h"

#include <signal.h>
#include <string.h>

static const int stop_sigs[3] = {SIGINT, SIGTERM, SIGHUP};
static volatile sig_atomic_t noted;
static struct sigaction before[3]; /* the handlers the first hold replaced */
static int depth;

static void note(int sig) {
    if (!noted) noted = sig;
}

void job_signals_hold(void) {
    if (depth++ > 0) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = note;
    noted = 0;
    for (int i = 0; i < 3; i++) sigaction(stop_sigs[i], &sa, &before[i]);
}

void job_signals_release(void) {
    if (depth == 0 || --depth > 0) return;
    for (int i = 0; i < 3; i++) sigaction(stop_sigs[i], &before[i], NULL);
}

int job_signals_take(void) {
    int sig = noted;
    noted = 0;
    return sig;
}
