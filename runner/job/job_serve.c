/* job_serve.c: the dashboard of `pprun run --serve` (job_serve.h). */
#include "runner/job/job_serve.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>

int job_serve_start(run_job *job) {
    if (!job->cfg.serve || job->lo.node_rank != 0) return 0;
    http_options ho = {
        .listen = job->cfg.serve_addr, .listen_flag = "--serve", .token = job->cfg.token, .db_path = job->cfg.db};
    pp_err err;
    if (http_start(&ho, &job->web, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg); /* it names --serve */
        return -1;
    }
    fprintf(stderr, "pprun run: dashboard at %s\n", http_url(job->web));
    return 0;
}

static void wait_for_interrupt(const char *url) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    fprintf(stderr, "pprun run: the job is over; the dashboard stays at %s until Ctrl-C\n", url);
    int sig;
    sigwait(&set, &sig);
}

void job_serve_until_interrupt(run_job *job, const job_outcome *end) {
    if (!job->web) return;
    if (end->res.status != LAUNCH_SIGNALED) wait_for_interrupt(http_url(job->web));
    http_stop(job->web);
    job->web = NULL;
}
