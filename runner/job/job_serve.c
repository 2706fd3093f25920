/* job_serve.c: the dashboard of `pprun run --serve` (job_serve.h). */
#include "runner/job/job_serve.h"

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int job_serve_start(run_job *job) {
    if (!job->cfg.serve || job->lo.node_rank != 0) return 0;
    http_options ho = {
        .listen = job->cfg.serve_addr, .listen_flag = "--serve", .token = job->cfg.token,
        .allow_hosts = job->cfg.allow_hosts, .db_path = job->cfg.db};
    pp_err err;
    if (http_start(&ho, &job->web, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg); /* it names --serve */
        return -1;
    }
    fprintf(stderr, "pprun run: dashboard at %s\n", http_url(job->web));
    return 0;
}

/* Posted by the handler of the signals that end the dashboard. */
static sem_t interrupted;
static void on_interrupt(int sig) {
    (void)sig;
    sem_post(&interrupted); /* async-signal-safe */
}

/* Until Ctrl-C (or SIGTERM, SIGHUP). A handler rather than sigwait: the
 * signal may be delivered to any thread, and the server's threads, started
 * before, do not block it, so a blocked-and-waited signal would still end
 * the process there without closing the database (its WAL left beside it). */
static void wait_for_interrupt(const char *url) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa, old[3];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sem_init(&interrupted, 0, 0);
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);
    fprintf(stderr, "pprun run: the job is over; the dashboard stays at %s until Ctrl-C\n", url);
    while (sem_wait(&interrupted) != 0 && errno == EINTR) continue;
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    sem_destroy(&interrupted);
}

void job_serve_until_interrupt(run_job *job, const job_outcome *end) {
    if (!job->web) return;
    /* a stop signal held while the job's end was recorded asked for the end too */
    if (end->res.status != LAUNCH_SIGNALED && !end->late_signal) wait_for_interrupt(http_url(job->web));
    http_stop(job->web);
    job->web = NULL;
}
