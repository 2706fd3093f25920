/* job_attempts.c: the workers' attempts of a `pprun run` job
 * (job_attempts.h), with the job's guard (job_salvage.h) around them and
 * the rank a failure comes from named by job_blame.h. */
#include "runner/job/job_attempts.h"

#include <signal.h>
#include <stdio.h>

#include "runner/comm/comm.h"
#include "runner/job/job_blame.h"
#include "runner/job/job_nodes.h"
#include "runner/job/job_program_env.h"
#include "runner/job/job_rows.h"
#include "runner/job/job_salvage.h"
#include "runner/job/job_signals.h"
#include "runner/job/job_tracing.h"
#include "runner/store/store.h"
#include "runner/worker/checkpoint_dir.h"

/* Before each attempt: its progress display; before the first, with
 * several nodes or a trace, the agreement with node 0 and the trace, over
 * one connection to the job's store. */
static int before_attempt(void *ctx, const launch_info *info, pp_err *err) {
    run_job *job = ctx;
    /* which process claimed each ring before this attempt: one of this
     * attempt's claims it anew (job_rows' "no records" message) */
    for (int l = 0; job->rings && l < job->nrings; l++)
        job->ring_writers[l] = job->rings[l] ? trace_ring_writer(job->rings[l]) : 0;
    if (info->attempt > 0) {
        /* A restarted attempt runs again from its checkpoint, or from step
         * 0 without one: the display shows those steps again. */
        int latest;
        pp_err ignored;
        job->progress_next =
            checkpoint_dir_to_load(&job->cfg, info->run_id, &latest, &ignored) == 0 ? latest + 1 : 0;
    }
    /* The display lives for one attempt: it reads the store, which is up
     * only while launch_job runs. */
    if (info->node_rank == 0 &&
        run_progress_start(info->store_addr, info->rdzv_token, job->cfg.steps, job->progress_next, job->cfg.progress,
                           &job->progress, err) != 0)
        return -1;
    if (info->attempt > 0 || (info->nnodes == 1 && !job->cfg.trace)) return 0;
    job_rows_hosts(job, info); /* before the collector: the database is this thread's until it starts */
    store_client *store = NULL;
    char host[256];
    int port;
    if (store_parse_addr(info->store_addr, host, sizeof host, &port, err) != 0 ||
        store_connect_token(host, port, info->rdzv_token, 30ull * 1000000000ull, &store, err) != 0)
        return -1;
    int rc = 0;
    if (info->nnodes > 1) rc = job_nodes_agree(job, info, store, err);
    if (rc == 0 && job->cfg.trace) rc = job_tracing_start(job, info, store, err);
    store_close(store);
    if (rc == 0) job_salvage_update(job, NULL); /* a killed launcher's rings go to the database too */
    return rc;
}

/* Each rank's environment: this node's address for TCP, its place in the
 * mesh, the job's MPS daemon, a user's program's schedule (or the digest
 * of a csv:FILE plan, for a worker that reads the file again), and the fd
 * of the rank's trace ring. */
static int rank_env(void *ctx, const launch_info *info, int local_rank, int global_rank, launch_env *env, pp_err *err) {
    run_job *job = ctx;
    (void)info;
    if (launch_env_set(env, "PPRUN_NODE_ADDR", job->node_addr, err) != 0) return -1;
    if (job_mesh_env_set(&job->cfg, global_rank, env, err) != 0) return -1;
    if (job_mps_env(&job->mps, env, err) != 0) return -1;
    if (job->program && job_program_env_set(job->plan, &job->cfg, global_rank, env, err) != 0) return -1;
    if (!job->program && job->cfg.schedule_csv[0]) { /* the worker reads the file again: it must be this plan */
        char digest[24];
        snprintf(digest, sizeof digest, "%016llx", (unsigned long long)sched_digest(job->plan));
        if (launch_env_set(env, "PPRUN_SCHEDULE_DIGEST", digest, err) != 0) return -1;
    }
    if (job->rings && job->rings[local_rank]) {
        int fd = trace_ring_fd(job->rings[local_rank]);
        char text[16];
        snprintf(text, sizeof text, "%d", fd);
        char identity[48];
        trace_fd_identity(fd, identity, sizeof identity);
        if (launch_env_pass_fd(env, fd, err) != 0 || launch_env_set(env, "PPRUN_TRACE_RING", identity, err) != 0)
            return -1;
        return launch_env_set(env, "PPRUN_TRACE_FD", text, err);
    }
    return 0;
}

/* Each rank's pid, for ranks.pid (the latest attempt's) and for telling
 * a stopped rank (job_blame). */
static void started(void *ctx, const launch_info *info, const pid_t *pids) {
    run_job *job = ctx;
    for (int l = 0; l < info->nproc_per_node; l++) {
        job->rank_pids[l] = pids[l];
        if (job->coll) collector_set_pid(job->coll, info->node_rank * info->nproc_per_node + l, (int)pids[l]);
    }
}

static int blame(void *ctx, const launch_info *info, int failed_rank, char *why, size_t cap) {
    return job_blame(ctx, info, failed_rank, why, cap);
}

/* The attempt's progress display stops (the next picks up where it
 * left off). Shared-memory rings a rank created before a peer attached (the
 * peer died first) are removed once the attempt's workers are gone, and so
 * are the temporary files of checkpoints a rank was writing when it died
 * or was torn down (a SIGKILL runs no cleanup): after every attempt, the
 * last one of a failed job too, and before the next starts. */
static void after_attempt(void *ctx, const launch_info *info, const launch_result *res) {
    run_job *job = ctx;
    (void)res;
    job->progress_next = run_progress_stop(job->progress);
    job->progress = NULL;
    char job_key[192];
    comm_job_key(info->run_id, info->attempt, job_key, sizeof job_key);
    comm_cleanup(job_key);
    pp_err err;
    if (!job->program && job->cfg.checkpoint_dir[0] && checkpoint_dir_sweep(job->cfg.checkpoint_dir, &err) < 0)
        fprintf(stderr, "pprun run: --checkpoint-dir: a temporary file of a checkpoint stays: %s\n", err.msg);
}

/* A stop signal held (while MPS started, or since job_attempts_hold)
 * before launch_job's own handlers were in place: theirs now. */
static int held_signal(void *ctx) {
    (void)ctx;
    return job_signals_take();
}

/* --fail-at SIGKILLs its rank in the first attempt (engine_maybe_fail):
 * a failure that is that one says so, or a user reads a crash into it. */
static void note_injected(const run_job *job, launch_result *res) {
    const run_fail_at *f = &job->cfg.fail_at;
    launch_failure *lf = &res->failure;
    if (job->program || !f->enabled || res->status != LAUNCH_FAILED || res->attempts != 1 || lf->hung ||
        lf->global_rank != f->rank || lf->signal != SIGKILL)
        return;
    snprintf(lf->injected, sizeof lf->injected, "--fail-at %s", f->text); /* as given: its phase and mb too */
}

void job_attempts_hold(run_job *job) {
    job_signals_hold();
    job->late_holding = 1;
}

void job_attempts_release(run_job *job, job_outcome *end) {
    if (!job->late_holding) return;
    job_signals_release();
    job->late_holding = 0;
    end->late_signal = job_signals_take();
}

void job_attempts_run(run_job *job, job_outcome *end) {
    /* The guard outlives launch_job: it keeps its will until the job's end
     * is recorded (job_rows_finish). */
    job_salvage_arm(job);
    job_mps_guard(&job->mps, job->guard); /* a killed launcher's daemon dies with its ranks */
    launch_hooks hooks = {
        .ctx = job, .before_attempt = before_attempt, .rank_env = rank_env, .started = started,
        .after_attempt = after_attempt, .blame = blame, .guard = job->guard, .held_signal = held_signal,
        /* the daemon, our child when pprun is PID 1, outlives every attempt: job_mps_stop stops it */
        .keep_groups = &job->mps.group, .nkeep = job->mps.group ? 1 : 0};
    /* A stop signal once the workers are gone: the job is over, its end
     * not yet recorded. Under scancel a launcher often gets its SIGTERM
     * only then (another node's stop ended the job here first), and acted
     * on at once it killed the launcher before the job's end reached the
     * database (its guard recorded a killed launcher instead). Held since
     * job_attempts_hold (launch_job's own handlers take over while it runs)
     * until job_attempts_release. */
    /* Each node read its own --schedule csv:FILE: one whose file differs
     * (a node-local path, a file edited while the job starts) would run
     * another schedule than its peers. The nodes agree on its digest before
     * any rank starts (launch_hooks.agree). */
    char digest[24], what[sizeof job->cfg.schedule_csv + 32];
    if (!job->program && job->cfg.schedule_csv[0]) {
        snprintf(digest, sizeof digest, "%016llx", (unsigned long long)sched_digest(job->plan));
        snprintf(what, sizeof what, "the plan of --schedule csv:%s", job->cfg.schedule_csv);
        hooks.agree = digest;
        hooks.agree_what = what;
    }
    end->launch_rc = launch_job(&job->lo, &hooks, &end->res, &end->launch_err);
    end->exit_code = end->res.exit_code;
    if (end->launch_rc == 0) note_injected(job, &end->res);
    job_salvage_update(job, end);
    if (end->launch_rc != 0)
        fprintf(stderr, "pprun run: %s\n", end->launch_err.msg);
    else if (end->res.status == LAUNCH_FAILED) {
        /* Titled by the job, as torchrun's by its entrypoint: the built-in
         * worker's program is this binary, whose path says nothing. */
        char name[sizeof job->cfg.db + 300], id[sizeof job->cfg.db + 64] = "";
        if (job->db) snprintf(id, sizeof id, " (job %lld in %s)", (long long)job->job_id, job->cfg.db);
        if (job->program) snprintf(name, sizeof name, "%.200s under pprun run%s", job->lo.prog_argv[0], id);
        else snprintf(name, sizeof name, "pprun run%s", id);
        launch_print_summary(stderr, &job->lo, &end->res, name);
    }
    else if (end->res.status == LAUNCH_SIGNALED) {
        char sigbuf[16], who[600];
        if (end->res.failure.outside || end->res.failure_remote) { /* who got the signal, when not this launcher */
            launch_stop_text(&end->res, who, sizeof who);
            fprintf(stderr, "pprun run: stopped: %s", who);
        } else {
            fprintf(stderr, "pprun run: stopped by %s", launch_signal_name(end->res.signal, sigbuf));
        }
        if (job->db) fprintf(stderr, "; what ran is in %s (job %lld)", job->cfg.db, (long long)job->job_id);
        fputc('\n', stderr);
    }
}
