/* launch_attempt.c: one attempt of the local group: start every local rank,
 * pump their output, notice the first failure, a signal or the end of the
 * attempt on another node, and tear everything down: SIGTERM (or the
 * forwarded signal) to every rank's process group and every other
 * descendant, SIGKILL after --shutdown-timeout, until nothing is left. */
#include "base/file.h"
#include "runner/launch/launch_int.h"
#include "runner/store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long a rank killed by a stop signal that pprun had not sent waits
 * for the launcher's own stop signal (reap_ranks): scancel signals every
 * process of a step at about the same moment, and the launcher may hear of
 * its rank's death first. Counted from the rank's reaping; the teardown
 * that its death begins usually takes longer anyway. */
#define LAUNCH_OUTSIDE_GRACE_NS 1000000000ull

typedef struct slot {
    pid_t pid;
    int alive;         /* not reaped yet */
    int status;        /* waitpid status once reaped */
    uint64_t ended_ns; /* pp_now_ns() when reaped, 0 before */
    launch_env env;
    launch_stream out, err;
    launch_tail tail;
} slot;

static int mkdir_p(char *path, pp_err *err) {
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        int rc = mkdir(path, 0755);
        int eno = errno;
        *p = saved;
        if (rc != 0 && eno != EEXIST) return pp_fail(err, "--log-dir: cannot create '%s': %s", path, strerror(eno));
        if (!saved) return 0;
    }
}

static int open_log(const char *dir, const char *name, pp_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return pp_fail(err, "--log-dir: path too long: '%s/%s'", dir, name);
    /* A regular file or nothing there: a link or a device planted in the
     * folder is refused, never written through (file_output_stream). */
    return file_output_stream(path, "--log-dir", 1, err);
}

static int set_num(launch_env *env, const char *name, long v, pp_err *err) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return launch_env_set(env, name, buf, err);
}

/* The torchrun environment plus pprun's own; the caller's hook last. */
static int build_env(launch_ctx *c, int lr, launch_env *env, pp_err *err) {
    const launch_options *o = c->o;
    const launch_info *in = &c->info;
    int gr = in->node_rank * in->nproc_per_node + lr;
    if (launch_env_from_environ(env, err) != 0) return -1;
    int user_omp = launch_env_has(env, "OMP_NUM_THREADS"), user_blas = launch_env_has(env, "OPENBLAS_NUM_THREADS");
    if (set_num(env, "RANK", gr, err) || set_num(env, "LOCAL_RANK", lr, err) ||
        set_num(env, "WORLD_SIZE", in->world_size, err) ||
        set_num(env, "LOCAL_WORLD_SIZE", in->nproc_per_node, err) ||
        set_num(env, "GROUP_RANK", in->node_rank, err) || set_num(env, "GROUP_WORLD_SIZE", in->nnodes, err) ||
        set_num(env, "ROLE_RANK", gr, err) || set_num(env, "ROLE_WORLD_SIZE", in->world_size, err) ||
        launch_env_set(env, "ROLE_NAME", "default", err) ||
        launch_env_set(env, "MASTER_ADDR", o->master_addr, err) || set_num(env, "MASTER_PORT", in->master_port, err) ||
        launch_env_set(env, "TORCHELASTIC_RUN_ID", in->run_id, err) ||
        set_num(env, "TORCHELASTIC_RESTART_COUNT", in->attempt, err) ||
        set_num(env, "TORCHELASTIC_MAX_RESTARTS", o->max_restarts, err) ||
        launch_env_set(env, "PPRUN_RUN_ID", in->run_id, err) ||
        set_num(env, "PPRUN_RESTART_COUNT", in->attempt, err) ||
        set_num(env, "PPRUN_MAX_RESTARTS", o->max_restarts, err) ||
        launch_env_set(env, "PPRUN_STORE", in->store_addr, err) || set_num(env, "PPRUN_NNODES", in->nnodes, err) ||
        set_num(env, "PPRUN_NODE_RANK", in->node_rank, err))
        return -1;
    /* The token goes by the environment: a command line shows in ps. */
    if (o->rdzv_token[0] && launch_env_set(env, PP_TOKEN_ENV, o->rdzv_token, err)) return -1;
    /* One BLAS thread per rank unless the user asked otherwise (docs/design.md §5). */
    if (!user_omp && launch_env_set(env, "OMP_NUM_THREADS", "1", err)) return -1;
    if (!user_blas && launch_env_set(env, "OPENBLAS_NUM_THREADS", "1", err)) return -1;
    /* PyTorch's env:// rendezvous (what MASTER_ADDR/MASTER_PORT above ask
     * for: pprun runs no store of torch's, so rank 0 starts the TCPStore)
     * wants libuv unless USE_LIBUV=0, and a torch built without it
     * (Debian's) refuses to start. The store every build has serves a
     * static rendezvous; a user's USE_LIBUV=1 is kept (docs/torch.md). */
    if (!launch_env_has(env, "USE_LIBUV") && launch_env_set(env, "USE_LIBUV", "0", err)) return -1;
    if (launch_env_python(env, err) != 0) return -1; /* pprun's Python package (docs/torch.md) */
    if (c->hooks && c->hooks->rank_env && c->hooks->rank_env(c->hooks->ctx, in, lr, gr, env, err) != 0) return -1;
    return 0;
}

/* Pipes and log files for one rank, then fork + exec. */
static int start_rank(launch_ctx *c, int lr, slot *s, pp_err *err) {
    const launch_options *o = c->o;
    int gr = c->info.node_rank * c->info.nproc_per_node + lr;
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, lo = -1, le = -1;
    if (build_env(c, lr, &s->env, err) != 0) return -1;
    if (o->log_dir) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s/attempt_%d/%d", o->log_dir, c->info.run_id, c->info.attempt, gr);
        if (mkdir_p(dir, err) != 0) return -1;
        if ((lo = open_log(dir, "stdout.log", err)) < 0) return -1;
        if ((le = open_log(dir, "stderr.log", err)) < 0) {
            close(lo);
            return -1;
        }
    }
    if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0) {
        char why[160];
        pp_fail(err, "pipe: %s", pp_strerror(errno, why, sizeof why));
        goto fail;
    }
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    char prefix[32] = "";
    if (o->prefix) snprintf(prefix, sizeof prefix, "[%d]: ", gr);
    int show = o->console[lr];
    launch_stream_init(&s->out, po[0], show && !(o->redirects[lr] & LAUNCH_STD_OUT) ? 1 : -1, &c->con[0],
                       &c->con[1], lo, 1, gr, prefix, NULL);
    launch_stream_init(&s->err, pe[0], show && !(o->redirects[lr] & LAUNCH_STD_ERR) ? 2 : -1, &c->con[1],
                       &c->con[1], le, 2, gr, prefix, &s->tail);
    lo = le = -1; /* the streams own them now */
    /* Ranks run in their own process groups, i.e. in the background: one
     * reading a terminal would be stopped (SIGTTIN), so they read nothing. */
    int null_in = isatty(0) ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    launch_spawn sp = {o->prog_argv, s->env.v, c->paths, c->notfound_msg, po[1], pe[1], null_in,
                       s->env.pass_fd, s->env.npass, c->nofile_raised ? &c->nofile : NULL};
    s->pid = launch_spawn_worker(&sp, err);
    close(po[1]);
    close(pe[1]);
    if (null_in >= 0) close(null_in);
    if (s->pid < 0) return -1;
    launch_guard_note(c->guard, s->pid);
    s->alive = 1;
    return 0;
fail:
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0) close(po[i]);
        if (pe[i] >= 0) close(pe[i]);
    }
    if (lo >= 0) close(lo);
    if (le >= 0) close(le);
    return -1;
}

/* launch_signal_descendants, sparing the caller's keep_groups. */
static int descendants(const launch_ctx *c, int sig, const pid_t *skip_groups, size_t nskip) {
    const launch_hooks *h = c->hooks;
    return launch_signal_descendants(sig, skip_groups, nskip, h ? h->keep_groups : NULL, h ? h->nkeep : 0);
}

/* Signals every rank's group whose leader is not reaped (its pgid cannot
 * have been reused), then every other descendant. */
static void signal_all(const launch_ctx *c, slot *slots, int n, int sig) {
    pid_t groups[LAUNCH_MAX_NPROC];
    size_t ng = 0;
    for (int i = 0; i < n; i++) {
        if (!slots[i].alive) continue;
        kill(-slots[i].pid, sig);
        groups[ng++] = slots[i].pid;
    }
    descendants(c, sig, groups, ng);
}

static int failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

/* One attempt as it runs: the local ranks, what the last poll watched,
 * and how far the teardown has gone. */
typedef struct attempt {
    launch_ctx *c;
    int n;                   /* local ranks */
    slot *slots;             /* [n], owned */
    struct pollfd *pfds;     /* [2n + 4], owned: the self-pipe, the watch, the consoles, the ranks' streams */
    slot **owner;            /* [2n + 4], owned: the slot of each stream in pfds */
    size_t np, first_stream; /* pfds in use; the first stream's */
    int watch_idx;           /* the watch's index in pfds, or -1 */
    int con_idx[2];          /* each console's index in pfds (waiting for room), or -1 */
    int outcome;             /* LAUNCH_ATTEMPT_* so far */
    int tearing, killed;     /* the teardown began; SIGKILL was sent */
    uint64_t kill_at;        /* when the teardown escalates to SIGKILL */
    /* The failure is a rank killed by a stop signal that pprun had not
     * sent: the job was stopped from outside if the launcher gets a stop
     * signal too, by the end of the teardown and not before decide_at
     * (settle_outside_stop); else it is the rank's own failure. */
    int maybe_outside;
    uint64_t decide_at;
    launch_failure *failure; /* the caller's: the root cause, once a rank failed */
    int64_t oom_kills;       /* launch_oom_kills at the start, */
    int oom_in_cgroup;       /* of the launcher's memory cgroup or the node's */
} attempt;

static int attempt_alloc(attempt *a) {
    a->slots = calloc((size_t)a->n, sizeof *a->slots);
    a->pfds = calloc((size_t)(2 * a->n + 4), sizeof *a->pfds);
    a->owner = calloc((size_t)(2 * a->n + 4), sizeof *a->owner);
    if (!a->slots || !a->pfds || !a->owner) return -1;
    for (int i = 0; i < a->n; i++) {
        slot *s = &a->slots[i];
        s->out.fd = s->err.fd = s->out.log_fd = s->err.log_fd = -1;
    }
    return 0;
}

static void attempt_free(attempt *a) {
    for (int i = 0; a->slots && i < a->n; i++) launch_env_free(&a->slots[i].env);
    free(a->slots);
    free(a->pfds);
    free(a->owner);
}

/* The signal to every rank, then SIGKILL once --shutdown-timeout is up. */
static void begin_teardown(attempt *a, int sig) {
    a->tearing = 1;
    signal_all(a->c, a->slots, a->n, sig);
    /* A stopped rank (SIGSTOP, a debugger's stop) keeps a SIGTERM pending
     * until it runs again: continue it, so that it ends now and not at
     * --shutdown-timeout. */
    if (sig != SIGKILL) signal_all(a->c, a->slots, a->n, SIGCONT);
    a->kill_at = pp_now_ns() + a->c->o->shutdown_timeout_ns;
}

/* Starts every local rank; when one cannot start, those that did are
 * killed (err says why). The started hook sees them all running. */
static void start_ranks(attempt *a, pp_err *err) {
    launch_ctx *c = a->c;
    for (int i = 0; i < a->n; i++)
        if (start_rank(c, i, &a->slots[i], err) != 0) {
            a->outcome = LAUNCH_ATTEMPT_ERROR;
            a->tearing = 1;
            signal_all(a->c, a->slots, a->n, SIGKILL);
            a->killed = 1;
            /* how far it got: 512 of 1024 ranks is a limit, not a typo */
            int gr = c->info.node_rank * c->info.nproc_per_node + i;
            char which[64] = "";
            if (c->info.nnodes > 1) snprintf(which, sizeof which, " (local rank %d)", i);
            if (i == 0)
                pp_wrap(err, "rank %d%s could not start (none had started)", gr, which);
            else
                pp_wrap(err, "rank %d%s could not start: %d of the %d ranks %s had started, and were stopped", gr,
                        which, i, a->n, c->info.nnodes > 1 ? "on this node" : "of the job");
            return;
        }
    if (c->hooks && c->hooks->started) {
        pid_t pids[LAUNCH_MAX_NPROC];
        for (int i = 0; i < a->n; i++) pids[i] = a->slots[i].pid;
        c->hooks->started(c->hooks->ctx, &c->info, pids);
    }
}

/* The consoles with bytes waiting, for room in them, into pfds from np
 * on (con_idx); returns the new np. */
static size_t gather_consoles(launch_ctx *c, struct pollfd *pfds, size_t np, int con_idx[2]) {
    for (int k = 0; k < 2; k++) {
        con_idx[k] = -1;
        if (!launch_console_pending(&c->con[k])) continue;
        con_idx[k] = (int)np;
        pfds[np++] = (struct pollfd){.fd = c->con[k].fd, .events = POLLOUT};
    }
    return np;
}

/* Writes what the consoles whose fds had events take now. */
static void flush_consoles(launch_ctx *c, const struct pollfd *pfds, const int con_idx[2]) {
    for (int k = 0; k < 2; k++)
        if (con_idx[k] >= 0 && pfds[con_idx[k]].revents) launch_console_flush(&c->con[k]);
}

/* What the next poll watches: the self-pipe, the end of the attempt on
 * another node (until the teardown), room in a console with bytes
 * waiting, every open stream whose console is not full (a full one
 * holds its ranks: launch_stream_held). */
static void gather_fds(attempt *a) {
    launch_ctx *c = a->c;
    a->np = 0;
    a->pfds[a->np++] = (struct pollfd){.fd = c->sig_r, .events = POLLIN};
    a->watch_idx = -1;
    if (c->watch && c->watch_pending && !a->tearing) {
        a->watch_idx = (int)a->np;
        a->pfds[a->np++] = (struct pollfd){.fd = store_fd(c->watch), .events = POLLIN};
    }
    a->np = gather_consoles(c, a->pfds, a->np, a->con_idx);
    a->first_stream = a->np;
    for (int i = 0; i < a->n; i++) {
        slot *s = &a->slots[i];
        if (s->out.fd >= 0 && !launch_stream_held(&s->out)) {
            a->owner[a->np] = s;
            a->pfds[a->np++] = (struct pollfd){.fd = s->out.fd, .events = POLLIN};
        }
        if (s->err.fd >= 0 && !launch_stream_held(&s->err)) {
            a->owner[a->np] = s;
            a->pfds[a->np++] = (struct pollfd){.fd = s->err.fd, .events = POLLIN};
        }
    }
}

/* How long the next poll may wait: --monitor-interval; while tearing
 * down, 20 ms at most (to sweep for new descendants) and not past the
 * SIGKILL deadline. */
static int poll_timeout(const attempt *a) {
    uint64_t now = pp_now_ns();
    int timeout = (int)(a->c->o->monitor_interval_ns / 1000000ull);
    if (a->tearing) {
        int until_kill = a->killed ? 20 : (int)((a->kill_at > now ? a->kill_at - now : 0) / 1000000ull + 1);
        timeout = until_kill < 20 ? until_kill : 20;
    }
    return timeout < 1 ? 1 : timeout;
}

/* Waits for something to happen; returns what poll did (> 0: pfds have
 * events). A failed poll kills the ranks: nothing can be watched. */
static int wait_for_events(attempt *a, pp_err *err) {
    gather_fds(a);
    int pr = poll(a->pfds, a->np, poll_timeout(a));
    if (pr < 0 && errno != EINTR) {
        pp_fail(err, "poll: %s", strerror(errno));
        if (!a->tearing) begin_teardown(a, SIGKILL);
        a->killed = 1;
    }
    return pr;
}

/* The signals on the self-pipe: the first stop signal is the outcome
 * (unless a rank failed first) and goes on to the ranks; a second one
 * kills them. */
static void on_signals(attempt *a) {
    launch_ctx *c = a->c;
    unsigned char sigs[64];
    ssize_t got = read(c->sig_r, sigs, sizeof sigs);
    for (ssize_t k = 0; k < got; k++) {
        int sig = sigs[k];
        if (sig == SIGCHLD) continue; /* reaped below */
        if (!c->stop_signal) {
            c->stop_signal = sig;
            /* The ranks must be able to end now: output the consoles do
             * not take is dropped from here on, not waited for. */
            c->con[0].dropping = c->con[1].dropping = 1;
            if (a->outcome == LAUNCH_ATTEMPT_OK) a->outcome = LAUNCH_ATTEMPT_SIGNAL;
            /* Forward the very signal, then the usual grace; a
             * teardown under way (a failure) keeps its deadline. */
            if (!a->tearing) begin_teardown(a, sig);
            else signal_all(a->c, a->slots, a->n, sig);
        } else if (!a->killed) {
            /* A second signal: the user is impatient. */
            signal_all(a->c, a->slots, a->n, SIGKILL);
            a->killed = 1;
        }
    }
}

/* The answer to the WAIT on the attempt's end key: another node ended the
 * attempt, or node 0's store is gone (err says how) and nothing can go on. */
static void on_attempt_end(attempt *a, pp_err *err) {
    pp_err werr;
    int r = store_wait_recv(a->c->watch, &werr);
    a->c->watch_pending = 0;
    if (r < 0) {
        if (a->outcome == LAUNCH_ATTEMPT_OK) a->outcome = LAUNCH_ATTEMPT_STORE_LOST;
        snprintf(err->msg, sizeof err->msg, "%s", werr.msg);
    } else if (a->outcome == LAUNCH_ATTEMPT_OK) {
        a->outcome = LAUNCH_ATTEMPT_REMOTE;
    }
    if (!a->tearing) begin_teardown(a, SIGTERM);
}

static void pump_output(attempt *a) {
    flush_consoles(a->c, a->pfds, a->con_idx);
    for (size_t k = a->first_stream; k < a->np; k++) {
        if (!a->pfds[k].revents) continue;
        slot *s = a->owner[k];
        launch_stream_pump(a->pfds[k].fd == s->out.fd ? &s->out : &s->err);
    }
}

/* Local rank i as the attempt's failure. */
static void note_failure(attempt *a, int i) {
    const launch_info *in = &a->c->info;
    int st = a->slots[i].status;
    launch_failure *f = a->failure;
    launch_failure_clear(f);
    f->node_rank = in->node_rank;
    f->local_rank = i;
    f->global_rank = in->node_rank * a->n + i;
    snprintf(f->host, sizeof f->host, "%s", in->host);
    f->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    f->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    f->pid = a->slots[i].pid;
    f->wall_ns = pp_wall_ns();
    int in_cgroup = 0;
    int64_t oom = f->signal == SIGKILL && a->oom_kills >= 0 ? launch_oom_kills(&in_cgroup) : -1;
    if (oom > a->oom_kills && in_cgroup == a->oom_in_cgroup) f->oom_kills = oom - a->oom_kills;
    f->oom_in_cgroup = in_cgroup;
    /* A rank of this node that had ended well before this one exited with
     * an error, its peers still running: a program that stops one rank's
     * loop early (uneven data) closes its peers' connections, and their
     * failure ("Connection closed by peer") is the first a launcher sees. */
    uint64_t first = 0, failed_at = a->slots[i].ended_ns;
    for (int k = 0; k < a->n && WIFEXITED(st); k++) {
        const slot *o = &a->slots[k];
        if (k == i || o->alive || !o->ended_ns || o->ended_ns + LAUNCH_ENDED_FIRST_NS > failed_at ||
            !WIFEXITED(o->status) || WEXITSTATUS(o->status) != 0 || (first && o->ended_ns >= first))
            continue;
        first = o->ended_ns;
        f->ended_first = in->node_rank * a->n + k;
        f->ended_first_ago_ns = failed_at - o->ended_ns;
    }
}

/* Global rank r, which hung (hooks.blame), as the attempt's failure: the
 * rank that failed first (the failure so far) is its witness, why says
 * how we know. On this node its process state says whether it is stopped
 * (SIGSTOP, a debugger), running or asleep. */
static void note_hung(attempt *a, int r, const char *why) {
    const launch_info *in = &a->c->info;
    launch_failure *f = a->failure;
    int witness = f->global_rank, lr = r % a->n;
    launch_failure_clear(f);
    f->node_rank = r / a->n;
    f->local_rank = lr;
    f->global_rank = r;
    f->exit_code = -1;
    f->hung = 1;
    f->witness = witness;
    f->wall_ns = pp_wall_ns();
    if (f->node_rank == in->node_rank) {
        snprintf(f->host, sizeof f->host, "%s", in->host);
        f->pid = a->slots[lr].pid;
        f->state = launch_proc_state(f->pid);
    } else if (in->node_hosts) { /* node 0 knows every node's host */
        snprintf(f->host, sizeof f->host, "%s", in->node_hosts[f->node_rank]);
    }
    snprintf(f->why, sizeof f->why, "%s", why);
    for (char *p = f->why; *p; p++) /* one line: it travels as one to the other nodes */
        if (*p == '\n') *p = ' ';
}

/* Slot s's process was reaped with waitpid status st. */
static void reaped(attempt *a, slot *s, int st) {
    s->alive = 0;
    s->ended_ns = pp_now_ns();
    s->status = st;
    launch_guard_note(a->c->guard, -s->pid);
}

/* Local rank i, if it exited meanwhile: reaped now. */
static void reap_rank(attempt *a, int i) {
    slot *s = &a->slots[i];
    int st;
    if (!s->alive || waitpid(s->pid, &st, WNOHANG) != s->pid) return;
    reaped(a, s, st);
}

/* The failed rank exited with an error: maybe only because it waited in
 * vain for another. The blame hook names the rank the failure comes from;
 * still running (or on another node, where we cannot look) it hung; dead
 * or failed, it is the root cause as if it had been seen first; exited 0,
 * it is not, and the failure stands. */
static void blame_failure(attempt *a) {
    const launch_hooks *h = a->c->hooks;
    const launch_info *in = &a->c->info;
    char why[sizeof a->failure->why] = "";
    if (!h || !h->blame) return;
    int r = h->blame(h->ctx, in, a->failure->global_rank, why, sizeof why);
    if (r < 0 || r >= in->world_size || r == a->failure->global_rank) return;
    if (r / a->n != in->node_rank) {
        note_hung(a, r, why);
        return;
    }
    slot *s = &a->slots[r % a->n];
    reap_rank(a, r % a->n); /* the hook took a moment: it may have ended since */
    if (s->alive) note_hung(a, r, why);
    else if (failed(s->status)) note_failure(a, r % a->n);
}

/* The stop signal (SIGINT, SIGTERM, SIGHUP: those the launcher itself
 * takes as "stop") that killed a rank, or 0. */
static int stop_signal_of(int status) {
    return WIFSIGNALED(status) && launch_is_stop_signal(WTERMSIG(status)) ? WTERMSIG(status) : 0;
}

/* How surely a rank's end is the attempt's cause, among the ends reaped in
 * one round: 3 killed by a signal that is no stop (a crash, the OOM
 * killer), 2 killed by a stop signal, 1 exited with an error, since a rank
 * often exits with an error because a peer died (its transport noticed
 * within a millisecond), never the other way round; 0 exited well. */
static int cause_weight(int status) {
    if (!failed(status)) return 0;
    if (!WIFSIGNALED(status)) return 1;
    return stop_signal_of(status) ? 2 : 3;
}

/* Reaps every child that exited. Before the teardown, a failed rank is
 * the attempt's failure and tears the others down; the one among those
 * reaped in a round that cause_weight puts first, and a rank that exited
 * with an error may name, through the blame hook, the rank it waited for
 * in vain. A rank killed by a stop signal before the teardown got it from
 * someone else than pprun, which sends none until then: either someone
 * stopped the job from outside (scancel signals every process of the step
 * at about the same moment, the launcher too, which often hears of its
 * rank's death first), or the rank did it to itself (a shell's `trap 'kill
 * 0' EXIT`, Python re-raising SIGINT for a KeyboardInterrupt).
 * settle_outside_stop tells which by whether the launcher gets a stop
 * signal of its own (docs/launch.md, "Stopped from outside"). */
static void reap_ranks(attempt *a) {
    int st, chosen = -1;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < a->n; i++) {
            slot *s = &a->slots[i];
            if (s->pid != pid || !s->alive) continue;
            reaped(a, s, st);
            if (!a->tearing && cause_weight(st) > (chosen < 0 ? 0 : cause_weight(a->slots[chosen].status)))
                chosen = i;
        }
    }
    if (chosen < 0) return;
    int status = a->slots[chosen].status;
    note_failure(a, chosen);
    a->outcome = LAUNCH_ATTEMPT_FAILED;
    if (stop_signal_of(status)) {
        a->maybe_outside = 1;
        a->decide_at = pp_now_ns() + LAUNCH_OUTSIDE_GRACE_NS;
    } else if (!WIFSIGNALED(status)) {
        blame_failure(a);
    }
    begin_teardown(a, SIGTERM);
}

/* 1 while a rank killed by a stop signal waits to be told apart
 * (reap_ranks): the launcher got no stop signal yet, and decide_at has
 * not come. */
static int undecided(const attempt *a) {
    return a->maybe_outside && !a->c->stop_signal && pp_now_ns() < a->decide_at;
}

/* At the end of the attempt: a rank killed by a stop signal pprun had not
 * sent, while the launcher got one too (before, or during the teardown
 * that the rank's death began), was stopped from outside: no failure, no
 * restart, the rank named as who got it (launch_failure.outside). The
 * launcher got none: the rank's own failure, and --max-restarts applies. */
static void settle_outside_stop(attempt *a) {
    if (!a->maybe_outside || !a->c->stop_signal || a->outcome != LAUNCH_ATTEMPT_FAILED) return;
    a->outcome = LAUNCH_ATTEMPT_SIGNAL;
    a->failure->outside = 1;
}

/* 1 when the attempt is over: every rank reaped and no descendant left.
 * Ranks done with descendants left begin the teardown; a teardown goes on
 * to SIGKILL on time, and again for anything forked since. */
static int attempt_over(attempt *a) {
    int all_exited = 1;
    for (int i = 0; i < a->n; i++) all_exited &= !a->slots[i].alive;
    if (all_exited && !a->tearing) {
        if (descendants(a->c, 0, NULL, 0) == 0) return 1;
        begin_teardown(a, SIGTERM);
    }
    if (!a->tearing) return 0;
    if (!a->killed && pp_now_ns() >= a->kill_at) {
        a->killed = 1;
        signal_all(a->c, a->slots, a->n, SIGKILL);
    } else if (a->killed) {
        signal_all(a->c, a->slots, a->n, SIGKILL); /* anything forked since */
    }
    return all_exited && descendants(a->c, 0, NULL, 0) == 0 && !undecided(a);
}

/* Killed descendants may still be zombies (or on their way): reap them
 * here, or they would outlive us as entries in the process table. */
static void reap_leftovers(const launch_ctx *c) {
    uint64_t give_up = pp_now_ns() + 2000000000ull;
    useconds_t pause = 1000;
    while (pp_now_ns() < give_up) {
        pid_t r = waitpid(-1, NULL, WNOHANG);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break; /* ECHILD: no child left */
        /* only children that live on, of the keep_groups, or this launcher's
         * own helpers (base/apart.h: its children where it is init, or a
         * dashboard's spawner started again once it was a subreaper): none
         * to wait for (a child that became a zombie since the waitpid is
         * reaped first) */
        if (descendants(c, 0, NULL, 0) == 0) {
            while (waitpid(-1, NULL, WNOHANG) > 0) continue;
            break;
        }
        usleep(pause); /* a child is still exiting: looked for again, less often (each look reads /proc) */
        if (pause < 32000) pause *= 2;
    }
}

/* Every writer is gone: drain the pipes and flush partial lines. The
 * failed rank's last stderr lines go with its failure; a hung rank's are
 * those of its witness, which say what it waited for. */
static void finish_output(attempt *a) {
    for (int i = 0; i < a->n; i++) {
        launch_stream_finish(&a->slots[i].out);
        launch_stream_finish(&a->slots[i].err);
    }
    const launch_failure *f = a->failure;
    if (a->outcome == LAUNCH_ATTEMPT_FAILED) {
        int lr = f->hung ? f->witness - a->c->info.node_rank * a->n : f->local_rank;
        launch_tail_text(&a->slots[lr].tail, a->failure->stderr_tail, sizeof a->failure->stderr_tail);
    }
}

/* What the consoles dropped, said on standard error when it takes it now
 * (it may be the very pipe that took nothing). */
static void say_dropped(launch_ctx *c) {
    uint64_t dropped[2] = {c->con[0].dropped, c->con[1].dropped};
    launch_console *e = c->con[1].same ? c->con[1].same : &c->con[1];
    for (int k = 0; k < 2; k++) {
        if (!dropped[k]) continue;
        char line[256];
        int n = snprintf(line, sizeof line,
                         "pprun launch: standard %s took none of the ranks' last %llu bytes after the stop signal: "
                         "they were dropped (--log-dir keeps every rank's output)\n",
                         k && !c->con[1].same ? "error" : "output", (unsigned long long)dropped[k]);
        if (!e->queued) fputs(line, stderr);
        else if (!e->gone && !launch_console_pending(e)) launch_console_put(e, line, (size_t)n);
        launch_console_drop(e); /* not waited for either */
    }
}

/* The ranks are gone: what the consoles still queue is written as the
 * reader takes it, while signals are watched. A stop signal (before, or
 * now) drops it: nothing waits for a reader that does not read. */
static void drain_consoles(attempt *a) {
    launch_ctx *c = a->c;
    for (;;) {
        int pending = 0;
        for (int k = 0; k < 2; k++) pending |= !launch_console_flush(&c->con[k]);
        if (!pending) break;
        if (c->stop_signal) {
            launch_console_drop(&c->con[0]);
            launch_console_drop(&c->con[1]);
            break;
        }
        struct pollfd p[3] = {{.fd = c->sig_r, .events = POLLIN}};
        int idx[2];
        size_t np = gather_consoles(c, p, 1, idx);
        int pr = poll(p, np, -1);
        if (pr < 0 && errno != EINTR) {
            launch_console_drop(&c->con[0]); /* nothing can be watched: nothing is waited for */
            launch_console_drop(&c->con[1]);
            break;
        }
        if (pr > 0 && p[0].revents) on_signals(a);
        if (pr > 0) flush_consoles(c, p, idx);
    }
    say_dropped(c);
}

int launch_attempt(launch_ctx *c, launch_failure *failure, pp_err *err) {
    attempt a = {.c = c,
                 .n = c->info.nproc_per_node,
                 .outcome = LAUNCH_ATTEMPT_OK,
                 .failure = failure};
    a.oom_kills = launch_oom_kills(&a.oom_in_cgroup);
    launch_console_init(&c->con[0], STDOUT_FILENO, NULL);
    launch_console_init(&c->con[1], STDERR_FILENO, &c->con[0]);
    c->con[0].dropping = c->con[1].dropping = c->stop_signal != 0;
    if (attempt_alloc(&a) != 0) {
        attempt_free(&a);
        launch_console_free(&c->con[0]);
        launch_console_free(&c->con[1]);
        return pp_fail(err, "out of memory for %d ranks", a.n), LAUNCH_ATTEMPT_ERROR;
    }
    start_ranks(&a, err);
    for (;;) {
        int pr = wait_for_events(&a, err);
        if (pr > 0 && a.pfds[0].revents) on_signals(&a);
        if (pr > 0) pump_output(&a);
        /* A rank of this node that died before the other nodes' end came
         * in the same wake-up is this node's failure, not a rank lost in
         * the teardown: its crash may be the root cause that ended them */
        reap_ranks(&a);
        if (pr > 0 && a.watch_idx >= 0 && a.pfds[a.watch_idx].revents) on_attempt_end(&a, err);
        if (attempt_over(&a)) break;
    }
    reap_leftovers(c);
    settle_outside_stop(&a);
    finish_output(&a);
    drain_consoles(&a);
    int outcome = a.outcome;
    attempt_free(&a);
    launch_console_free(&c->con[0]);
    launch_console_free(&c->con[1]);
    return outcome;
}
