/* launch_attempt.c: one attempt of the local group: start every local rank,
 * pump their output, notice the first failure, a signal or the end of the
 * attempt on another node, and tear everything down: SIGTERM (or the
 * forwarded signal) to every rank's process group and every other
 * descendant, SIGKILL after --shutdown-timeout, until nothing is left. */
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

typedef struct slot {
    pid_t pid;
    int alive;      /* not reaped yet */
    int status;     /* waitpid status once reaped */
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
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) pp_fail(err, "--log-dir: cannot open '%s': %s", path, strerror(errno));
    return fd;
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
        pp_fail(err, "pipe: %s", strerror(errno));
        goto fail;
    }
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    char prefix[32] = "";
    if (o->prefix) snprintf(prefix, sizeof prefix, "[%d]: ", gr);
    int show = o->console[lr];
    launch_stream_init(&s->out, po[0], show && !(o->redirects[lr] & LAUNCH_STD_OUT) ? 1 : -1, lo, prefix, NULL);
    launch_stream_init(&s->err, pe[0], show && !(o->redirects[lr] & LAUNCH_STD_ERR) ? 2 : -1, le, prefix, &s->tail);
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
    launch_guard_note(c->guard_fd, s->pid);
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

/* Signals every rank's group whose leader is not reaped (its pgid cannot
 * have been reused), then every other descendant. */
static void signal_all(slot *slots, int n, int sig) {
    pid_t groups[LAUNCH_MAX_NPROC];
    size_t ng = 0;
    for (int i = 0; i < n; i++) {
        if (!slots[i].alive) continue;
        kill(-slots[i].pid, sig);
        groups[ng++] = slots[i].pid;
    }
    launch_signal_descendants(sig, groups, ng);
}

static int failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

int launch_attempt(launch_ctx *c, launch_failure *failure, pp_err *err) {
    const launch_options *o = c->o;
    int n = c->info.nproc_per_node;
    slot *slots = calloc((size_t)n, sizeof *slots);
    struct pollfd *pfds = calloc((size_t)(2 * n + 2), sizeof *pfds);
    slot **owner = calloc((size_t)(2 * n + 2), sizeof *owner);
    if (!slots || !pfds || !owner) {
        free(slots);
        free(pfds);
        free(owner);
        return pp_fail(err, "out of memory for %d ranks", n), LAUNCH_ATTEMPT_ERROR;
    }
    for (int i = 0; i < n; i++) slots[i].out.fd = slots[i].err.fd = slots[i].out.log_fd = slots[i].err.log_fd = -1;

    int outcome = LAUNCH_ATTEMPT_OK, tearing = 0, killed = 0;
    uint64_t kill_at = 0;
    int started = 0;
    for (; started < n; started++) {
        if (start_rank(c, started, &slots[started], err) != 0) {
            outcome = LAUNCH_ATTEMPT_ERROR;
            break;
        }
    }
    if (outcome == LAUNCH_ATTEMPT_ERROR) {
        tearing = 1;
        signal_all(slots, n, SIGKILL);
        killed = 1;
    } else if (c->hooks && c->hooks->started) {
        pid_t pids[LAUNCH_MAX_NPROC];
        for (int i = 0; i < n; i++) pids[i] = slots[i].pid;
        c->hooks->started(c->hooks->ctx, &c->info, pids);
    }

#define BEGIN_TEARDOWN(sig)                                                  \
    do {                                                                     \
        tearing = 1;                                                         \
        signal_all(slots, n, (sig));                                         \
        kill_at = pp_now_ns() + o->shutdown_timeout_ns;                      \
    } while (0)

    for (;;) {
        /* --- wait for something to happen -------------------------------- */
        size_t np = 0;
        pfds[np++] = (struct pollfd){.fd = c->sig_r, .events = POLLIN};
        int watch_idx = -1;
        if (c->watch && c->watch_pending && !tearing) {
            watch_idx = (int)np;
            pfds[np++] = (struct pollfd){.fd = store_fd(c->watch), .events = POLLIN};
        }
        size_t first_stream = np;
        for (int i = 0; i < n; i++) {
            if (slots[i].out.fd >= 0) {
                owner[np] = &slots[i];
                pfds[np++] = (struct pollfd){.fd = slots[i].out.fd, .events = POLLIN};
            }
            if (slots[i].err.fd >= 0) {
                owner[np] = &slots[i];
                pfds[np++] = (struct pollfd){.fd = slots[i].err.fd, .events = POLLIN};
            }
        }
        uint64_t now = pp_now_ns();
        int timeout = (int)(o->monitor_interval_ns / 1000000ull);
        if (tearing) {
            /* Sweep for new descendants and escalate on time. */
            int until_kill = killed ? 20 : (int)((kill_at > now ? kill_at - now : 0) / 1000000ull + 1);
            timeout = until_kill < 20 ? until_kill : 20;
        }
        if (timeout < 1) timeout = 1;
        int pr = poll(pfds, np, timeout);
        if (pr < 0 && errno != EINTR) {
            pp_fail(err, "poll: %s", strerror(errno));
            if (!tearing) BEGIN_TEARDOWN(SIGKILL);
            killed = 1;
        }

        /* --- signals ------------------------------------------------------- */
        if (pr > 0 && pfds[0].revents) {
            unsigned char sigs[64];
            ssize_t got = read(c->sig_r, sigs, sizeof sigs);
            for (ssize_t k = 0; k < got; k++) {
                int sig = sigs[k];
                if (sig == SIGCHLD) continue; /* reaped below */
                if (!c->stop_signal) {
                    c->stop_signal = sig;
                    if (outcome == LAUNCH_ATTEMPT_OK) outcome = LAUNCH_ATTEMPT_SIGNAL;
                    /* Forward the very signal, then the usual grace; a
                     * teardown under way (a failure) keeps its deadline. */
                    if (!tearing) BEGIN_TEARDOWN(sig);
                    else signal_all(slots, n, sig);
                } else if (!killed) {
                    /* A second signal: the user is impatient. */
                    signal_all(slots, n, SIGKILL);
                    killed = 1;
                }
            }
        }

        /* --- the end of the attempt on another node ----------------------- */
        if (pr > 0 && watch_idx >= 0 && pfds[watch_idx].revents) {
            pp_err werr;
            int r = store_wait_recv(c->watch, &werr);
            c->watch_pending = 0;
            if (r < 0) {
                /* Node 0's store is gone: nothing can go on. */
                if (outcome == LAUNCH_ATTEMPT_OK) outcome = LAUNCH_ATTEMPT_STORE_LOST;
                snprintf(err->msg, sizeof err->msg, "%s", werr.msg);
            } else if (outcome == LAUNCH_ATTEMPT_OK) {
                outcome = LAUNCH_ATTEMPT_REMOTE;
            }
            if (!tearing) BEGIN_TEARDOWN(SIGTERM);
        }

        /* --- output -------------------------------------------------------- */
        for (size_t k = first_stream; pr > 0 && k < np; k++) {
            if (!pfds[k].revents) continue;
            slot *s = owner[k];
            launch_stream_pump(pfds[k].fd == s->out.fd ? &s->out : &s->err);
        }

        /* --- exits --------------------------------------------------------- */
        /* The root cause among the failures reaped in one round: a rank
         * killed by a signal before one that exited with an error, since a
         * rank often exits with an error because a peer died (its transport
         * noticed within a millisecond), never the other way round. */
        int st, chosen = -1;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < n; i++) {
                if (slots[i].pid != pid || !slots[i].alive) continue;
                slots[i].alive = 0;
                slots[i].status = st;
                launch_guard_note(c->guard_fd, -pid);
                if (!tearing && failed(st) &&
                    (chosen < 0 || (!WIFSIGNALED(slots[chosen].status) && WIFSIGNALED(st))))
                    chosen = i;
            }
        }
        if (chosen >= 0) {
            int cst = slots[chosen].status;
            outcome = LAUNCH_ATTEMPT_FAILED;
            memset(failure, 0, sizeof *failure);
            failure->node_rank = c->info.node_rank;
            failure->local_rank = chosen;
            failure->global_rank = c->info.node_rank * n + chosen;
            snprintf(failure->host, sizeof failure->host, "%s", c->info.host);
            failure->exit_code = WIFEXITED(cst) ? WEXITSTATUS(cst) : -1;
            failure->signal = WIFSIGNALED(cst) ? WTERMSIG(cst) : 0;
            failure->pid = slots[chosen].pid;
            failure->wall_ns = pp_wall_ns();
            BEGIN_TEARDOWN(SIGTERM);
        }

        int all_exited = 1;
        for (int i = 0; i < n; i++) all_exited &= !slots[i].alive;
        if (all_exited && !tearing) {
            /* Every rank is done; anything they left behind goes too. */
            if (launch_signal_descendants(0, NULL, 0) == 0) break;
            BEGIN_TEARDOWN(SIGTERM);
        }
        if (tearing) {
            if (!killed && pp_now_ns() >= kill_at) {
                killed = 1;
                signal_all(slots, n, SIGKILL);
            } else if (killed) {
                signal_all(slots, n, SIGKILL); /* anything forked since */
            }
            if (all_exited && launch_signal_descendants(0, NULL, 0) == 0) break;
        }
    }
#undef BEGIN_TEARDOWN

    /* Killed descendants may still be zombies (or on their way): reap them
     * here, or they would outlive us as entries in the process table. */
    for (int tries = 0; tries < 2000; tries++) {
        pid_t r = waitpid(-1, NULL, WNOHANG);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break; /* ECHILD: no child left */
        usleep(1000);     /* a child is still exiting */
    }

    /* Every writer is gone: drain the pipes and flush partial lines. */
    for (int i = 0; i < n; i++) {
        launch_stream_finish(&slots[i].out);
        launch_stream_finish(&slots[i].err);
    }
    if (outcome == LAUNCH_ATTEMPT_FAILED)
        launch_tail_text(&slots[failure->local_rank].tail, failure->stderr_tail, sizeof failure->stderr_tail);
    for (int i = 0; i < n; i++) launch_env_free(&slots[i].env);
    free(slots);
    free(pfds);
    free(owner);
    return outcome;
}
