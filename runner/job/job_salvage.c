/* job_salvage.c: the will of a `pprun run` job's guard, and `pprun
 * salvage`, which carries it out (job_salvage.h). */
#include "runner/job/job_salvage.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "base/net.h"
#include "runner/comm/comm.h"
#include "runner/job/job_rows.h"
#include "runner/job/job_tracing.h"

/* The will's rings come as descriptors 3, 4, ... (launch_guard_will). */
#define SALVAGE_FIRST_FD 3
/* What `pprun run` would have exited with, had it been able to: killed. */
#define SALVAGE_EXIT_CODE (128 + SIGKILL)
/* The salvage's collector drains often: nothing else runs. */
#define SALVAGE_INTERVAL_NS 5000000ull

/* --- the launcher's side: the will --------------------------------------------- */

/* argv's strings, each owned by the will being built. */
typedef struct will {
    char *argv[32];
    char text[32][128];
    int n;
} will;

static void will_add(will *w, const char *arg) { w->argv[w->n++] = (char *)arg; }

static void will_addf(will *w, const char *fmt, long v) {
    snprintf(w->text[w->n], sizeof w->text[w->n], fmt, v);
    will_add(w, w->text[w->n]);
}

/* Tells the guard the will as it stands: the job, its rings, and once end
 * is known how its ranks ended. Says on stderr when the guard cannot take
 * it: the job goes on, as a launcher without a guard would. */
static void tell_will(run_job *job, const job_outcome *end) {
    char exe[PATH_MAX], db_path[PATH_MAX], host[256] = "localhost", failure[sizeof end->launch_err.msg + 64];
    will w = {.n = 0};
    pp_err err;
    /* This very binary: a will that runs it needs no PATH. */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "pprun run: cannot find the pprun executable (/proc/self/exe) for the guard's will\n");
        return;
    }
    exe[n] = '\0';
    will_add(&w, exe);
    will_add(&w, "salvage");
    will_add(&w, "--run-id"); /* its row's name (a file replaced since holds another job 1), its rings' key */
    will_add(&w, job->lo.run_id);
    will_add(&w, "--attempts"); /* whose shared-memory rings may be left */
    will_addf(&w, "%ld", (long)job->lo.max_restarts + 1);
    if (!job->db) { /* another node's launcher, or --trace off: the rings alone */
        w.argv[w.n] = NULL;
        if (launch_guard_will(job->guard, w.argv, NULL, 0, &err) != 0)
            fprintf(stderr, "pprun run: %s; if this launcher is killed, its shared-memory rings stay in /dev/shm\n",
                    err.msg);
        return;
    }
    if (!realpath(job->cfg.db, db_path)) snprintf(db_path, sizeof db_path, "%s", job->cfg.db);
    net_host_name(host, sizeof host);
    will_add(&w, "--db");
    will_add(&w, db_path);
    will_add(&w, "--job");
    will_addf(&w, "%ld", (long)job->job_id);
    will_add(&w, "--launcher");
    will_addf(&w, "%ld", (long)getpid());
    will_add(&w, "--host");
    will_add(&w, host);
    will_add(&w, "--world-size");
    will_addf(&w, "%ld", (long)job->plan->ranks * (job->cfg.dp > 0 ? job->cfg.dp : 1)); /* every replica's ranks */
    will_add(&w, "--steps"); /* the collector's bound: 0, none, for a program's job */
    will_addf(&w, "%ld", (long)job_step_bound(job));
    int fds[LAUNCH_MAX_NPROC], nfds = 0;
    for (int l = 0; job->rings && l < job->lo.nproc_per_node && job->rings[l]; l++)
        fds[nfds++] = trace_ring_fd(job->rings[l]);
    if (nfds) {
        will_add(&w, "--rings");
        will_addf(&w, "%ld", nfds);
        will_add(&w, "--first-rank");
        will_addf(&w, "%ld", (long)job->lo.node_rank * job->lo.nproc_per_node);
    }
    if (end) {
        will_add(&w, "--ranks-ended");
        will_add(&w, job_rows_status(end));
        will_add(&w, "--failed-rank");
        will_addf(&w, "%ld", (long)job_rows_failed_rank(end));
        job_rows_failure(end, failure, sizeof failure);
        will_add(&w, "--failure");
        will_add(&w, failure);
    }
    w.argv[w.n] = NULL;
    if (launch_guard_will(job->guard, w.argv, fds, nfds, &err) != 0)
        fprintf(stderr, "pprun run: %s; if this launcher is killed, readers will show job %lld as lost\n", err.msg,
                (long long)job->job_id);
}

void job_salvage_arm(run_job *job) {
    pp_err err;
    if (launch_guard_start(&job->guard, &err) != 0) {
        fprintf(stderr, "pprun run: %s; the job runs without a guard\n", err.msg);
        return;
    }
    tell_will(job, NULL);
}

void job_salvage_update(run_job *job, const job_outcome *end) {
    if (job->guard && job->db) tell_will(job, end); /* without a database the will stays the rings alone */
}

void job_salvage_disarm(run_job *job) {
    launch_guard_stop(job->guard);
    job->guard = NULL;
}

/* --- `pprun salvage`: carrying it out ------------------------------------------- */

typedef struct salvage {
    const char *db, *run_id, *host, *ranks_ended, *failure;
    long job, launcher, world_size, steps, rings, first_rank, failed_rank, attempts;
} salvage;

static int parse(int argc, char **argv, salvage *s, pp_err *err) {
    *s = (salvage){.failed_rank = -1, .job = -1, .launcher = -1, .world_size = -1, .steps = -1};
    for (int i = 1; i < argc; i += 2) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) return pp_fail(err, "%s: expected a value", opt);
        long *num = !strcmp(opt, "--job")           ? &s->job
                    : !strcmp(opt, "--launcher")    ? &s->launcher
                    : !strcmp(opt, "--world-size")  ? &s->world_size
                    : !strcmp(opt, "--steps")       ? &s->steps
                    : !strcmp(opt, "--rings")       ? &s->rings
                    : !strcmp(opt, "--first-rank")  ? &s->first_rank
                    : !strcmp(opt, "--failed-rank") ? &s->failed_rank
                    : !strcmp(opt, "--attempts")    ? &s->attempts
                                                    : NULL;
        if (num && pp_parse_long(val, -1, 1L << 62, opt, num, err) != 0) return -1;
        if (!strcmp(opt, "--db")) s->db = val;
        else if (!strcmp(opt, "--run-id")) s->run_id = val;
        else if (!strcmp(opt, "--host")) s->host = val;
        else if (!strcmp(opt, "--ranks-ended")) s->ranks_ended = val;
        else if (!strcmp(opt, "--failure")) s->failure = val;
        else if (!num) return pp_fail(err, "unknown option '%s'", opt);
    }
    if (!s->run_id || (!s->db && s->attempts < 1))
        return pp_fail(err, "needs --run-id, and --db or --attempts (what to salvage)");
    if (s->attempts > LAUNCH_MAX_RESTARTS + 1)
        return pp_fail(err, "--attempts %ld: a job makes at most %d", s->attempts, LAUNCH_MAX_RESTARTS + 1);
    if (s->db && (!s->host || s->job < 1 || s->launcher < 1 || s->world_size < 1 || s->steps < 0 || s->rings < 0 ||
                  s->rings > LAUNCH_MAX_NPROC || s->first_rank < 0 || s->first_rank + s->rings > s->world_size))
        return pp_fail(err, "--db needs --host, --job, --launcher, --world-size and --steps; --rings and "
                            "--first-rank within the world");
    return 0;
}

/* 1 while the job's row still says running, or lost: a launcher killed
 * just after it recorded the job's end leaves the row as it is; a `pprun
 * run` on the same file that started after the launcher died marked it
 * lost (db_mark_lost: its launcher is gone), maybe before this guard ran,
 * and what the rings hold is still the job's to keep (docs/launch.md).
 * The row is this job's by its name too: a file deleted and made again
 * by another job since holds another job of that id. */
static int still_running(db *d, long job, const char *run_id) {
    sqlite3_stmt *st;
    int running = 0;
    if (sqlite3_prepare_v2(db_sqlite(d),
                           "SELECT status IN ('running', 'lost') FROM jobs WHERE id = ?1 AND name = ?2", -1, &st,
                           NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_text(st, 2, run_id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) running = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return running;
}

/* Everything the rings still hold, into the database through a collector
 * as the launcher's would have drained it; the steps no rank finished are
 * cut short unless every rank succeeded. */
static int drain(const salvage *s, db *d, pp_err *ring_fault, pp_err *err) {
    /* The launcher's reader: a ring whose header a rank corrupted is
     * disabled here too, never read "a ring's worth" at a time forever. */
    ring_fault->msg[0] = '\0';
    collector_config cc = {
        .db = d, .job_id = s->job, .world_size = (int)s->world_size, .steps = (int)s->steps,
        .interval_ns = SALVAGE_INTERVAL_NS, .ring_fault = ring_fault};
    /* Every ring attached and moved past what the launcher stored before it
     * released it (ring_marks: nothing twice) before the collector starts:
     * its thread writes through d, which is one thread's at a time. */
    trace_ring *rings[LAUNCH_MAX_NPROC] = {NULL};
    for (long i = 0; i < s->rings; i++) {
        pp_err rerr; /* a ring that cannot be read loses its records, not the others' */
        if (trace_ring_attach(SALVAGE_FIRST_FD + (int)i, &rings[i], &rerr) != 0) continue;
        uint64_t stored;
        if (db_ring_mark_of(d, s->job, trace_ring_id(rings[i]), &stored, &rerr) == 0 && stored)
            trace_ring_skip_to(rings[i], stored);
    }
    collector *c;
    if (collector_start(&cc, &c, err) != 0) {
        for (long i = 0; i < s->rings; i++) trace_ring_close(rings[i]);
        return -1;
    }
    for (long i = 0; i < s->rings; i++) {
        pp_err rerr;
        if (rings[i] && collector_add_ring(c, (int)(s->first_rank + i), rings[i], &rerr) != 0)
            trace_ring_close(rings[i]);
    }
    if (!s->ranks_ended || strcmp(s->ranks_ended, "succeeded") != 0) collector_last_step_cut(c);
    return collector_stop(c, err);
}

/* jobs.failure: the killed launcher, how its ranks ended if it knew, a
 * rank's corrupt ring if one was found (ring_fault, "" none), and why the
 * rings' records could not be stored (stored, "" they were: a full disk). */
static void failure_line(const salvage *s, const pp_err *ring_fault, const pp_err *stored, char *buf, size_t n) {
    int len = snprintf(buf, n, "its launcher (pid %ld on %s) was killed", s->launcher, s->host);
    if (s->ranks_ended && len < (int)n)
        len += snprintf(buf + len, n - (size_t)len, " after its ranks ended (%s%s%s)", s->ranks_ended,
                        s->failure && s->failure[0] ? ": " : "", s->failure ? s->failure : "");
    if (len < (int)n) len += snprintf(buf + len, n - (size_t)len, "; its guard recorded what the trace rings held");
    if (ring_fault->msg[0] && len < (int)n) len += snprintf(buf + len, n - (size_t)len, " but %s", ring_fault->msg);
    if (stored->msg[0] && len < (int)n)
        snprintf(buf + len, n - (size_t)len, "%s the trace stopped early: %s", ring_fault->msg[0] ? ";" : " but",
                 stored->msg);
}

int job_salvage_main(int argc, char **argv) {
    salvage s;
    pp_err err;
    db *d = NULL;
    /* Nobody reads this process's output (the guard's is /dev/null): the
     * job's row is all it leaves, and a reader shows `lost` without it. */
    if (parse(argc, argv, &s, &err) != 0) return 2;
    /* a file that is gone (deleted while the job ran) is not made again */
    struct stat st;
    int rc = s.db && (stat(s.db, &st) != 0 || !S_ISREG(st.st_mode) || db_open(s.db, &d, &err) != 0) ? 2 : 0;
    if (d && still_running(d, s.job, s.run_id)) {
        pp_err derr, ring_fault = {.msg = ""}, stored = {.msg = ""};
        char failure[2048];
        /* what it could not store is lost, said in the failure; the end still goes in */
        if (s.rings > 0 && drain(&s, d, &ring_fault, &stored) == 0) stored.msg[0] = '\0';
        if (s.steps == 0) db_job_steps_traced(d, s.job, &derr); /* a program's job: the steps it traced */
        failure_line(&s, &ring_fault, &stored, failure, sizeof failure);
        rc = db_finish_job(d, s.job, "failed", SALVAGE_EXIT_CODE, (int)s.failed_rank, failure, &err) == 0 ? 0 : 1;
    }
    db_close(d);
    for (long i = 0; i < s.rings; i++) close(SALVAGE_FIRST_FD + (int)i);
    /* its ranks are gone (the guard killed them before it ran this): the
     * rings of pairs whose peer never attached, which nobody else removes */
    comm_cleanup_run(s.run_id, (int)s.attempts);
    return rc;
}
