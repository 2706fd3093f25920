/* launch.c: the job loop: signals, the store, the static rendezvous between
 * nodes, attempts and restarts.
 *
 * Keys in the store (attempt K, node rank R):
 *   pprun/master_port        the workers' MASTER_PORT, picked by node 0
 *   pprun/run_id             node 0's run id, read by every other node
 *   pprun/shape, pprun/plan  node 0's --nnodes and --nproc-per-node, and its
 *                            caller's launch_hooks.agree ("" for none): a
 *                            node that differs refuses to join
 *   pprun/max_restarts       node 0's --max-restarts: the nodes restart
 *                            together, so one that differs refuses to join
 *   pprun/a/K/node/R         node R joined attempt K (value: its host; node 0
 *                            reads attempt 0's for launch_info.node_hosts)
 *   pprun/a/K/count          how many joined; the last one sets pprun/a/K/go
 *                            ("", or "stop R SIG": node R, stopped by SIG
 *                            after attempt K-1, calls attempt K off;
 *                            "refused R WHY": node R refused node 0's run
 *                            id, MASTER_PORT or shape (refuse_to_join);
 *                            "timeout N WHY": node 0 gave up, N had joined;
 *                            it first adds nnodes to count, so no node
 *                            coming later can complete it)
 *   pprun/a/K/left, left_all nodes that read node 0's timeout; the last sets left_all
 *   pprun/a/K/failcount      the first node to fail (count 1) writes
 *   pprun/a/K/fail           the root cause (launch_failure as text), then
 *   pprun/a/K/end            the attempt is over for everyone
 *   pprun/a/K/stopcount      the first node stopped (count 1: its launcher got a
 *   pprun/a/K/stop           stop signal, or a rank one from outside) writes who
 *                            got it here too, before its failcount
 *   pprun/a/K/crashcount     the same for the first rank that crashed (killed by
 *   pprun/a/K/crash          a signal that is no stop)
 *   pprun/a/K/done           nodes that finished well; the last sets end
 *   pprun/a/K/told           nodes that told how the attempt ended there; the
 *   pprun/a/K/all_told       last sets all_told, and then each node decides
 *   pprun/a/K/told/R         node R told (set before it adds to told): after
 *                            the wait for all_told ran out, who never did
 *   pprun/exit, pprun/exit_all  node 0 keeps the store up until all left
 * Every launcher keeps a WAIT on pprun/a/K/end while its ranks run: when it
 * fires, another node failed; when the connection breaks, node 0 is gone. */
#include "runner/launch/launch_int.h"
#include "runner/store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/net.h"
#include "base/term.h"

/* The self-pipe's write end: the only state a signal handler touches. */
static volatile int sig_pipe_w = -1;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe_w, &b, 1);
    (void)w; /* a full pipe already says "look" */
    errno = saved;
}

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
#define NCAUGHT (sizeof caught / sizeof caught[0])

/* How long node 0's store may take to answer once the user asked to stop.
 * Alive, it answers in microseconds; stopped, frozen or cut off, it must not
 * keep the launcher (and the user's Ctrl-C) waiting. Before a stop, an
 * answer may take --rdzv-timeout (store_answer_ns). */
#define LAUNCH_STOP_STORE_NS 5000000000ull
/* How often node 0, waiting for an attempt's end, looks for a node whose
 * launcher is gone (end_for_a_gone_node). */
#define LAUNCH_LIVE_CHECK_NS 1000000000ull

typedef struct job {
    launch_ctx c;
    int live_claimed; /* this node's pprun/live key is held (rendezvous) */
    char host[256];
    char store_addr[300];
    char run_id[128];
    int sig_w;
    int stops; /* stop signals seen by check_signals */
    store_server *server;
    store_client *ctl;
    struct sigaction old[NCAUGHT];
    int old_subreaper;
    int own_guard; /* c.guard is launch_job's own, stopped at its end */
    int store_ok; /* the store may still be used */
    int telling;  /* telling the others how the attempt ended (stop_requested) */
    int ran;      /* an attempt reached its outcome on every node */
    int outside_stop; /* the stop signal a rank here got from outside pprun (launch_failure.outside), or 0 */
    int called_off_by, called_off_sig; /* the node whose stop called an attempt off, and its signal (read_go) */
    int called_off;                    /* this node's stop called an attempt off (call_off) */
    /* Node 0: every node's host name (read_node_hosts), and c.info's
     * pointers to them; NULL until then. Owned. */
    char (*hosts)[LAUNCH_HOST_MAX + 1];
    const char **host_ptrs;
} job;

static int install_signals(job *j, pp_err *err) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return pp_fail(err, "pipe: %s", strerror(errno));
    j->c.sig_r = p[0];
    j->sig_w = p[1];
    sig_pipe_w = p[1];
    for (size_t i = 0; i < NCAUGHT; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sa.sa_handler = caught[i] == SIGPIPE ? SIG_IGN : on_signal;
        if (caught[i] == SIGCHLD) sa.sa_flags |= SA_NOCLDSTOP;
        sigaction(caught[i], &sa, &j->old[i]);
    }
    /* Orphaned grandchildren come to us, not to init: we can kill them. */
    prctl(PR_GET_CHILD_SUBREAPER, &j->old_subreaper);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    return 0;
}

static void restore_signals(job *j) {
    for (size_t i = 0; i < NCAUGHT; i++) sigaction(caught[i], &j->old[i], NULL);
    prctl(PR_SET_CHILD_SUBREAPER, j->old_subreaper);
    sig_pipe_w = -1;
    close(j->c.sig_r);
    close(j->sig_w);
}

/* Node 0's store holds two connections per rank, and the soft limit on
 * descriptors is often 1024: take the hard limit, as Go programs do, and
 * give the workers the limit we found (launch_spawn_worker). */
static void raise_open_file_limit(job *j) {
    if (getrlimit(RLIMIT_NOFILE, &j->c.nofile) != 0) return;
    struct rlimit more = j->c.nofile;
    more.rlim_cur = more.rlim_max;
    j->c.nofile_raised = setrlimit(RLIMIT_NOFILE, &more) == 0;
}

static void restore_open_file_limit(job *j) {
    if (j->c.nofile_raised) setrlimit(RLIMIT_NOFILE, &j->c.nofile);
}

/* How long node 0 may take to answer a request: --rdzv-timeout, but never
 * less than LAUNCH_STOP_STORE_NS (a tiny --rdzv-timeout must not fail a
 * healthy job), and LAUNCH_STOP_STORE_NS once a stop signal came. */
static uint64_t store_answer_ns(const job *j) {
    uint64_t rdzv = j->c.o->rdzv_timeout_ns;
    return j->c.stop_signal || rdzv < LAUNCH_STOP_STORE_NS ? LAUNCH_STOP_STORE_NS : rdzv;
}

/* Drains the self-pipe; remembers a stop signal. */
static void check_signals(job *j) {
    unsigned char sigs[64];
    ssize_t got;
    while ((got = read(j->c.sig_r, sigs, sizeof sigs)) > 0)
        for (ssize_t k = 0; k < got; k++) {
            if (sigs[k] == SIGCHLD) continue;
            j->stops++;
            if (!j->c.stop_signal) j->c.stop_signal = sigs[k];
        }
    if (j->ctl) store_set_timeout(j->ctl, store_answer_ns(j));
}

/* store_set_interrupt's callback: a new stop signal abandons a request,
 * except the first one while this node tells the others how the attempt
 * ended (j->telling): that request goes on with the 5 s node 0 gets once
 * a stop came (check_signals set it). Under scancel every launcher gets
 * its SIGTERM just then, and a node whose report it cut short left the
 * others without it (they waited for it, or took a failure for the
 * outcome). A second one gives up at once. */
static int stop_requested(void *arg) {
    job *j = arg;
    int had = j->c.stop_signal, before = j->stops;
    check_signals(j);
    return j->stops > before && (!j->telling || had);
}

/* store_wait on the control client: 0 ok, 1 timeout, -1 error, 2 when a
 * stop signal cut it short (the client is then out of step). */
static int wait_keys(job *j, const char *const *keys, size_t n, int64_t timeout_ms, pp_err *err) {
    int rc = store_wait(j->ctl, keys, n, timeout_ms, err);
    return rc < 0 && j->c.stop_signal ? 2 : rc;
}

static void key(char *buf, size_t cap, int attempt, const char *name) {
    snprintf(buf, cap, "pprun/a/%d/%s", attempt, name);
}

void launch_failure_clear(launch_failure *f) {
    memset(f, 0, sizeof *f);
    f->ended_first = -1;
}

/* --- failure as text, for the other nodes ------------------------------------ */

/* The numbers on the first line; then one line each for the host and the
 * hung rank's why (neither holds a newline), then the stderr tail. The
 * last numbers: whether a rank was stopped from outside
 * (launch_failure.outside, v4), the out-of-memory kills on its node
 * (oom_kills, v4), whether they are its memory cgroup's (v5), and the
 * rank of its node that had exited 0 before it failed, and how long
 * before (ended_first, v6). */
static int failure_encode(const launch_failure *f, int stop, char *buf, size_t cap) {
    return snprintf(buf, cap,
                    "v6 %d %d %d %d %d %d %" PRIu64 " %d %d %d %d %d %" PRId64 " %d %d %" PRIu64 "\n%s\n%s\n%s",
                    f->node_rank, f->global_rank, f->local_rank, f->exit_code, f->signal, (int)f->pid, f->wall_ns, stop,
                    f->hung, (int)(unsigned char)f->state, f->witness, f->outside, f->oom_kills, f->oom_in_cgroup,
                    f->ended_first, f->ended_first_ago_ns, f->host, f->why, f->stderr_tail);
}

/* The line at *p into out (cap bytes, cut to fit); *p moves past it.
 * -1 when there is no line left. */
static int next_line(const char **p, char *out, size_t cap) {
    if (!*p) return -1;
    const char *nl = strchr(*p, '\n');
    size_t n = nl ? (size_t)(nl - *p) : strlen(*p);
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), *p);
    *p = nl ? nl + 1 : NULL;
    return 0;
}

/* -1 for text that is no failure of this job: anyone who reaches the
 * store may have written it, so its node and ranks must be the job's (a
 * rank is -1 for a launcher's own failure). */
static int failure_decode(const char *text, const launch_options *o, launch_failure *f, int *stop) {
    launch_failure_clear(f);
    int pid, state;
    if (sscanf(text, "v6 %d %d %d %d %d %d %" SCNu64 " %d %d %d %d %d %" SCNd64 " %d %d %" SCNu64, &f->node_rank,
               &f->global_rank, &f->local_rank, &f->exit_code, &f->signal, &pid, &f->wall_ns, stop, &f->hung, &state,
               &f->witness, &f->outside, &f->oom_kills, &f->oom_in_cgroup, &f->ended_first,
               &f->ended_first_ago_ns) != 16 ||
        f->oom_kills < 0 || (f->oom_in_cgroup != 0 && f->oom_in_cgroup != 1))
        return -1;
    int world = o->nnodes * o->nproc_per_node;
    if (f->node_rank < 0 || f->node_rank >= o->nnodes || f->global_rank < -1 || f->global_rank >= world ||
        f->local_rank < -1 || f->local_rank >= o->nproc_per_node || f->witness < -1 || f->witness >= world ||
        f->ended_first < -1 || f->ended_first >= world || (f->ended_first < 0) != (f->ended_first_ago_ns == 0) ||
        (f->outside && f->global_rank < 0))
        return -1;
    f->pid = pid;
    f->state = (char)state;
    const char *p = strchr(text, '\n');
    if (!p) return -1;
    p++;
    if (next_line(&p, f->host, sizeof f->host) != 0 || next_line(&p, f->why, sizeof f->why) != 0) return -1;
    if (p) snprintf(f->stderr_tail, sizeof f->stderr_tail, "%s", p);
    return 0;
}

/* A stop, not a failure: a launcher that got a stop signal, or a rank
 * killed by one pprun had not sent. */
static int is_stop(const launch_failure *f) { return f->outside || (f->global_rank < 0 && f->signal); }

/* A rank that crashed: killed by a signal that is no stop (SIGSEGV, the
 * OOM killer's SIGKILL, --fail-at's). */
static int is_crash(const launch_failure *f) { return f->global_rank >= 0 && !f->hung && f->signal && !f->outside; }

/* Records f as attempt K's root cause if it is the first failure (and, a
 * stop or a crash, as the first of its kind), then ends the attempt
 * everywhere. 0, or -1 when the store did not take it. */
static int report_failure(job *j, int attempt, const launch_failure *f, int stop, pp_err *serr) {
    char k[128], text[sizeof f->stderr_tail + sizeof f->why + sizeof f->host + 128];
    int64_t first;
    const char *kind = is_stop(f) ? "stop" : is_crash(f) ? "crash" : NULL;
    if (kind) {
        snprintf(k, sizeof k, "pprun/a/%d/%scount", attempt, kind);
        if (store_add(j->ctl, k, 1, &first, serr) != 0) return -1;
        if (first == 1) {
            int len = failure_encode(f, stop, text, sizeof text);
            if (len >= (int)sizeof text) len = (int)sizeof text - 1;
            key(k, sizeof k, attempt, kind);
            if (store_set(j->ctl, k, text, (size_t)len, serr) != 0) return -1;
        }
    }
    key(k, sizeof k, attempt, "failcount");
    if (store_add(j->ctl, k, 1, &first, serr) != 0) return -1;
    key(k, sizeof k, attempt, "fail");
    if (first == 1) {
        int len = failure_encode(f, stop, text, sizeof text);
        if (len >= (int)sizeof text) len = (int)sizeof text - 1;
        if (store_set(j->ctl, k, text, (size_t)len, serr) != 0) return -1;
    } else {
        /* Another node's failure came first. Its launcher publishes it at
         * once, but may die (or lose node 0) before it ends the attempt:
         * give it a moment, then end the attempt ourselves. */
        const char *keys[1] = {k};
        if (store_wait(j->ctl, keys, 1, (int64_t)(LAUNCH_STOP_STORE_NS / 1000000), serr) < 0) return -1;
    }
    key(k, sizeof k, attempt, "end");
    return store_set(j->ctl, k, "", 0, serr);
}

/* This node told how attempt K ended here (or could not run it): one more
 * in told; the last sets all_told. */
static int tell_told(job *j, int attempt, pp_err *serr) {
    char k[128], mine[32];
    int64_t told;
    snprintf(mine, sizeof mine, "told/%d", j->c.o->node_rank);
    key(k, sizeof k, attempt, mine);
    if (store_set(j->ctl, k, "", 0, serr) != 0) return -1;
    key(k, sizeof k, attempt, "told");
    if (store_add(j->ctl, k, 1, &told, serr) != 0) return -1;
    if (told != j->c.o->nnodes) return 0;
    key(k, sizeof k, attempt, "all_told");
    return store_set(j->ctl, k, "", 0, serr);
}

/* This launcher, as the failure: stopped by a signal, or broken (why). */
static void launcher_failure(job *j, const char *why, launch_failure *f) {
    launch_failure_clear(f);
    f->node_rank = j->c.o->node_rank;
    f->global_rank = f->local_rank = -1;
    f->signal = why ? 0 : j->c.stop_signal;
    f->wall_ns = pp_wall_ns();
    snprintf(f->host, sizeof f->host, "%s", j->host);
    if (why) snprintf(f->stderr_tail, sizeof f->stderr_tail, "%s\n", why);
}

/* How await_watch ended, when not with the answer. */
enum { WATCH_LATE = 1, WATCH_STOPPED_AGAIN = 2 };

/* Waits for the answer to the WAIT this node sent on its watch connection
 * and reads it, taking signals meanwhile, until give_up (UINT64_MAX: no
 * bound; the server answers by the WAIT's own deadline, a node 0 gone or
 * frozen does not). The first stop signal of the wait (none had come)
 * calls first_stop, when given, which returns the new give_up; a stop
 * signal after one gives up at once. 0: the answer came (it may say the
 * WAIT ran out: what the store holds decides); -1 (serr): poll failed or
 * node 0's store is gone; WATCH_LATE: no answer by give_up;
 * WATCH_STOPPED_AGAIN: the caller says which wait it gave up. */
static int await_watch(job *j, uint64_t give_up, uint64_t (*first_stop)(job *j, void *ctx), void *ctx,
                       pp_err *serr) {
    int seen = j->stops; /* a stop signal past these means "give up now" */
    for (;;) {
        int ms = pp_ms_left(give_up);
        struct pollfd p[2] = {{.fd = store_fd(j->c.watch), .events = POLLIN}, {.fd = j->c.sig_r, .events = POLLIN}};
        int n = poll(p, 2, ms);
        if (n < 0 && errno != EINTR) return pp_fail(serr, "poll: %s", strerror(errno));
        if (n > 0 && p[0].revents) {
            j->c.watch_pending = 0;
            return store_wait_recv(j->c.watch, serr) < 0 ? -1 : 0;
        }
        if (n > 0 && p[1].revents) {
            int had = j->c.stop_signal;
            check_signals(j);
            if (!had && j->c.stop_signal) {
                seen = j->stops;
                if (first_stop) give_up = first_stop(j, ctx);
                /* its own store requests may have taken a second one */
                if (j->stops > seen) return WATCH_STOPPED_AGAIN;
                continue;
            }
        }
        /* first_stop's own store requests may have taken a second one */
        if (j->c.stop_signal && j->stops > seen) return WATCH_STOPPED_AGAIN;
        if (n == 0 && ms == 0) return WATCH_LATE;
    }
}

/* await_attempt_end's: what a first stop signal does while this node
 * waits for attempt K's end. */
typedef struct attempt_end_wait {
    int attempt, *out, *stop;
    launch_failure *fail;
    uint64_t give_up; /* once stopped: when the wait gives up */
} attempt_end_wait;

static uint64_t stopped_awaiting_end(job *j, void *ctx) {
    attempt_end_wait *w = ctx;
    if (*w->out == LAUNCH_ATTEMPT_OK) {
        /* Stopped while waiting for the others: tell them. */
        *w->out = LAUNCH_ATTEMPT_SIGNAL;
        *w->stop = 1;
        launcher_failure(j, NULL, w->fail);
        pp_err ignored; /* the WAIT's answer says whether node 0 is there */
        report_failure(j, w->attempt, w->fail, 1, &ignored);
    }
    return w->give_up = pp_now_ns() + LAUNCH_STOP_STORE_NS;
}

/* Node 0, waiting for attempt K's end: a node whose launcher is gone (its
 * key, claimed on its store connection by setup_store, went with the
 * connection: killed, its machine lost) never tells how the attempt ended
 * there, and the others would wait for it forever once their ranks are
 * done. Node 0 ends the attempt for it, a failure of that node's launcher.
 * 0, or -1 (serr) when the store did not answer. */
static int end_for_a_gone_node(job *j, int attempt, pp_err *serr) {
    for (int r = 1; r < j->c.o->nnodes; r++) {
        char k[64];
        void *v;
        size_t len;
        snprintf(k, sizeof k, "pprun/live/%d", r);
        int g = store_get(j->ctl, k, &v, &len, serr);
        if (g < 0) return -1;
        if (g == 0) {
            free(v);
            continue;
        }
        launch_failure f;
        launch_failure_clear(&f);
        f.node_rank = r;
        f.global_rank = f.local_rank = -1;
        f.wall_ns = pp_wall_ns();
        snprintf(f.host, sizeof f.host, "%s", j->hosts ? j->hosts[r] : "");
        snprintf(f.stderr_tail, sizeof f.stderr_tail,
                 "its connection to the store closed before it told how attempt %d ended: it was killed, or its "
                 "machine is lost\n", attempt);
        return report_failure(j, attempt, &f, 0, serr);
    }
    return 0;
}

/* Waits for the answer to this node's WAIT on attempt K's end key. 0: the
 * attempt is over everywhere; -1: node 0's store is gone, or gave no
 * answer in time after a stop (serr says which). A stop signal while this
 * node had finished well is reported to the others first. Once stopped,
 * node 0 gets LAUNCH_STOP_STORE_NS, and another signal gives up at once.
 * Node 0 looks for a node gone every LAUNCH_LIVE_CHECK_NS meanwhile. */
static int await_attempt_end(job *j, int attempt, int *out, int *stop, launch_failure *fail, pp_err *serr) {
    attempt_end_wait w = {attempt, out, stop, fail, j->c.stop_signal ? pp_now_ns() + LAUNCH_STOP_STORE_NS : 0};
    int checks = j->c.o->node_rank == 0 && j->c.o->nnodes > 1;
    for (;;) {
        uint64_t until = j->c.stop_signal ? w.give_up : checks ? pp_now_ns() + LAUNCH_LIVE_CHECK_NS : UINT64_MAX;
        int rc = await_watch(j, until, stopped_awaiting_end, &w, serr);
        if (rc == WATCH_LATE && !j->c.stop_signal) {
            if (end_for_a_gone_node(j, attempt, serr) != 0) return -1;
            /* a stop its store requests took: told as await_watch tells one */
            if (j->c.stop_signal) stopped_awaiting_end(j, &w);
            continue;
        }
        if (rc == WATCH_STOPPED_AGAIN)
            return pp_fail(serr, "stopped again while waiting for the store of node rank 0 at %s", j->store_addr);
        if (rc == WATCH_LATE)
            return pp_fail(serr, "store %s: no answer within %.0fs of the stop signal (node rank 0 stopped or "
                                 "unreachable?)", j->store_addr, (double)LAUNCH_STOP_STORE_NS / 1e9);
        return rc;
    }
}

/* --- set-up: store, run id ---------------------------------------------------- */

/* 0, or 2 on a stop signal, or -1 (timed out), or -3 (the store refused
 * the token: err says so, waiting cannot help). */
static int connect_store(job *j, const char *host, int port, uint64_t timeout_ns, store_client **out, pp_err *err) {
    uint64_t deadline = pp_now_ns() + timeout_ns;
    for (;;) {
        int rc = store_connect_token(host, port, NULL, 0, out, err);
        if (rc == 0) {
            /* The token's answer, like every later one, waits for a stop
             * signal too: a frozen node 0 still accepts connections. */
            store_set_timeout(*out, store_answer_ns(j));
            store_set_interrupt(*out, j->c.sig_r, stop_requested, j);
            rc = store_authenticate(*out, j->c.o->rdzv_token, err);
            if (rc == 0) return 0;
            store_close(*out);
            *out = NULL;
            if (rc == -2) return -3;
        }
        check_signals(j);
        if (j->c.stop_signal) return 2;
        if (pp_now_ns() >= deadline) return -1;
        pp_sleep_ns(50000000);
    }
}

/* A node other than 0 that cannot take what node 0 published (its run id,
 * MASTER_PORT, the job's shape) refuses to join, err saying why: it calls
 * attempt 0 off with "refused R WHY" so that the others say why at once,
 * naming this node, instead of waiting for it until --rdzv-timeout.
 * Returns -1, err as it was. */
static int refuse_to_join(job *j, pp_err *err) {
    char go[128], text[sizeof err->msg + 32];
    key(go, sizeof go, 0, "go");
    snprintf(text, sizeof text, "refused %d %s", j->c.o->node_rank, err->msg);
    pp_err serr;
    store_set(j->ctl, go, text, strlen(text), &serr); /* best effort: the refusal stands either way */
    return -1;
}

/* Global ranks are node_rank * nproc_per_node + local rank, so every node
 * must have node 0's --nnodes and --nproc-per-node ('auto' may count
 * differently per machine). A node that differs refuses to join, naming
 * the difference. */
static int agree_on_shape(job *j, const char *mine, pp_err *err) {
    void *node0;
    size_t len;
    int g = store_get(j->ctl, "pprun/shape", &node0, &len, err);
    if (g < 0) return -1;
    if (g == 1) {
        pp_fail(err, "rendezvous: node rank 0 published no --nnodes and --nproc-per-node (pprun/shape)");
        return refuse_to_join(j, err);
    }
    int same = strcmp(mine, node0) == 0;
    if (!same)
        pp_fail(err,
                "this node has %s, node rank 0 has %s: start every node with the same --nnodes and "
                "--nproc-per-node",
                mine, (char *)node0);
    free(node0);
    return same ? 0 : refuse_to_join(j, err);
}

/* What the caller needs every node to agree on (launch_hooks.agree, ""
 * for none) must be node 0's: a node that differs would run another job
 * than its peers (pprun run: another schedule, the ranks deadlocking
 * until --recv-timeout). It refuses to join, naming both. */
static int agree_on_plan(job *j, pp_err *err) {
    const launch_hooks *h = j->c.hooks;
    const char *mine = h && h->agree ? h->agree : "";
    const char *what = h && h->agree_what ? h->agree_what : "the job's plan (pprun/plan)";
    void *node0;
    size_t len;
    int g = store_get(j->ctl, "pprun/plan", &node0, &len, err);
    if (g < 0) return -1;
    if (g == 1) {
        pp_fail(err, "rendezvous: node rank 0 published no plan digest (pprun/plan)");
        return refuse_to_join(j, err);
    }
    char theirs[80];
    /* text from the store: shown only as printable characters */
    int ok = len < sizeof theirs && strspn(node0, "0123456789abcdefABCDEF") == len;
    snprintf(theirs, sizeof theirs, "%.*s", ok ? (int)len : 0, ok ? (char *)node0 : "");
    int same = ok && strcmp(mine, theirs) == 0;
    free(node0);
    if (same) return 0;
    pp_fail(err, "%s differs between the nodes: digest %s on node rank %d, %s on node rank 0: every node must run "
                 "the same plan (the same file, unchanged while the job starts)",
            what, mine[0] ? mine : "(none)", j->c.o->node_rank, !ok ? "(not a digest)" : theirs[0] ? theirs : "(none)");
    return refuse_to_join(j, err);
}

/* A number node 0 published under key, lo..hi, into *out: 0; a refusal to
 * join where it is missing or no such number (whoever reaches the store
 * could have set it); -1 when the store fails. what: its name in messages. */
static int take_published(job *j, const char *key, const char *what, long lo, long hi, long *out, pp_err *err) {
    void *v;
    size_t len;
    int g = store_get(j->ctl, key, &v, &len, err);
    if (g < 0) return -1;
    if (g == 1) {
        pp_fail(err, "rendezvous: node rank 0 published no %s (%s)", what, key);
        return refuse_to_join(j, err);
    }
    char name[160];
    snprintf(name, sizeof name, "rendezvous: the %s node rank 0 published (%s)", what, key);
    int rc = pp_parse_long(v, lo, hi, name, out, err);
    free(v);
    return rc != 0 ? refuse_to_join(j, err) : 0;
}

/* Every node restarts together (the same fail key decides it), so every
 * node must have node 0's --max-restarts: a node with fewer would leave
 * after the first failure while the others wait for it at the next
 * rendezvous until --rdzv-timeout, the root cause lost. A node that
 * differs refuses to join, naming the option. */
static int agree_on_restarts(job *j, pp_err *err) {
    long theirs;
    if (take_published(j, "pprun/max_restarts", "--max-restarts", 0, LAUNCH_MAX_RESTARTS, &theirs, err) != 0) return -1;
    if (theirs == j->c.o->max_restarts) return 0;
    pp_fail(err, "this node has --max-restarts %d, node rank 0 has --max-restarts %ld: start every node with the same "
                 "--max-restarts (the nodes restart together)",
            j->c.o->max_restarts, theirs);
    return refuse_to_join(j, err);
}

/* The workers' MASTER_PORT as node 0 published it: a port, 1-65535, or a
 * refusal to join. */
static int take_master_port(job *j, pp_err *err) {
    long port;
    if (take_published(j, "pprun/master_port", "MASTER_PORT", 1, 65535, &port, err) != 0) return -1;
    j->c.info.master_port = (int)port;
    return 0;
}

static int setup_store(job *j, pp_err *err) {
    const launch_options *o = j->c.o;
    int port = o->master_port;
    /* One node: nobody else needs the store, so it stays on loopback. */
    const char *host = o->nnodes > 1 ? o->master_addr : "127.0.0.1";
    if (o->node_rank == 0) {
        if (store_server_start_token(host, port, o->rdzv_token, &j->server, err) != 0)
            return pp_wrap(err, "--master-addr %s --master-port %d", host, port);
        port = store_server_port(j->server);
    }
    snprintf(j->store_addr, sizeof j->store_addr, "%s:%d", host, port);
    int rc = connect_store(j, host, port, o->rdzv_timeout_ns, &j->ctl, err);
    if (rc == 2) return 2;
    if (rc == -3) return -1;
    if (rc != 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return pp_fail(err, "rendezvous timed out after %.0fs (--rdzv-timeout): node rank 0 never came up (%s)",
                       (double)o->rdzv_timeout_ns / 1e9, why);
    }
    if (o->nnodes > 1) {
        rc = connect_store(j, host, port, o->rdzv_timeout_ns, &j->c.watch, err);
        if (rc == 2) return 2;
        if (rc != 0) return pp_wrap(err, "rendezvous");
        /* launch_attempt reads the self-pipe itself while it watches. */
        store_set_interrupt(j->c.watch, -1, NULL, NULL);
    }
    /* The run id: node 0's, whatever the others were told. So are the
     * workers' MASTER_PORT, the job's shape and its --max-restarts,
     * published before it. */
    char shape[64];
    snprintf(shape, sizeof shape, "--nnodes %d --nproc-per-node %d", o->nnodes, o->nproc_per_node);
    if (o->node_rank == 0) {
        if (o->run_id[0]) snprintf(j->run_id, sizeof j->run_id, "%s", o->run_id);
        else snprintf(j->run_id, sizeof j->run_id, "%" PRIx64 "-%d", (uint64_t)(pp_wall_ns() / 1000000u), (int)getpid());
        /* The workers' MASTER_PORT (not the store's: PyTorch's env:// makes
         * rank 0 listen on it seconds later, after Python's start-up): from
         * outside the ephemeral range, where no outgoing connection or
         * bind(0) on the machine takes it meanwhile (net_pick_port). */
        if ((j->c.info.master_port = net_pick_port(err)) < 0) return -1;
        char mp[16];
        snprintf(mp, sizeof mp, "%d", j->c.info.master_port);
        if (store_set(j->ctl, "pprun/master_port", mp, strlen(mp), err) != 0) return -1;
        if (store_set(j->ctl, "pprun/shape", shape, strlen(shape), err) != 0) return -1;
        char mr[16];
        snprintf(mr, sizeof mr, "%d", o->max_restarts);
        if (store_set(j->ctl, "pprun/max_restarts", mr, strlen(mr), err) != 0) return -1;
        const char *plan = j->c.hooks && j->c.hooks->agree ? j->c.hooks->agree : "";
        if (store_set(j->ctl, "pprun/plan", plan, strlen(plan), err) != 0) return -1;
        if (store_set(j->ctl, "pprun/run_id", j->run_id, strlen(j->run_id), err) != 0) return -1;
    } else {
        const char *k = "pprun/run_id";
        rc = wait_keys(j, &k, 1, (int64_t)(o->rdzv_timeout_ns / 1000000ull), err);
        if (rc == 2) return 2;
        if (rc != 0) return rc < 0 ? -1 : pp_fail(err, "rendezvous: node rank 0 published no run id within %.0fs",
                                                   (double)o->rdzv_timeout_ns / 1e9);
        void *v;
        size_t len;
        if (store_get(j->ctl, "pprun/run_id", &v, &len, err) != 0) return -1;
        /* Checked as node 0 checked its --run-id: whoever reaches the store
         * could have set it, and it names this node's log folder. */
        if (launch_check_run_id(v, len, "rendezvous: the run id node rank 0 published (pprun/run_id)", err) != 0) {
            free(v);
            return refuse_to_join(j, err);
        }
        snprintf(j->run_id, sizeof j->run_id, "%.*s", (int)len, (char *)v);
        free(v);
        if (take_master_port(j, err) != 0) return -1;
        if (agree_on_shape(j, shape, err) != 0) return -1;
        if (agree_on_plan(j, err) != 0) return -1;
        if (agree_on_restarts(j, err) != 0) return -1;
    }
    return 0;
}

/* Node 0's rendezvous timeout ends it on the nodes that came too, with
 * node 0's reason: it serves the store, and they would otherwise see only
 * the store go away. It keeps the store up until they have read it (each
 * adds to pprun/a/K/left, the last sets left_all), 5 s at most. */
static void tell_the_timeout(job *j, int attempt, int joined, const char *why) {
    pp_err serr;
    char k[128], text[sizeof serr.msg + 24];
    key(k, sizeof k, attempt, "go");
    snprintf(text, sizeof text, "timeout %d %s", joined, why);
    if (store_set(j->ctl, k, text, strlen(text), &serr) != 0 || joined < 2) return;
    key(k, sizeof k, attempt, "left_all");
    const char *keys[1] = {k};
    wait_keys(j, keys, 1, 5000, &serr); /* best effort: a node that never reads it is not waited for longer */
}

static void read_the_timeout(job *j, int attempt, int joined) {
    char k[128];
    int64_t left;
    pp_err serr;
    key(k, sizeof k, attempt, "left");
    if (store_add(j->ctl, k, 1, &left, &serr) != 0 || left != joined - 1) return;
    key(k, sizeof k, attempt, "left_all");
    store_set(j->ctl, k, "", 0, &serr);
}

/* Two launchers with one --node-rank would start one set of ranks twice:
 * the first to claim it is that node, a later one is refused, 4 (the job
 * goes on without it, or names the node rank nobody gave). The node's key
 * holds its host. */
static int claim_node_rank(job *j, int attempt, pp_err *err) {
    const launch_options *o = j->c.o;
    char k[128];
    int64_t claims;
    snprintf(k, sizeof k, "pprun/a/%d/claim/%d", attempt, o->node_rank);
    if (store_add(j->ctl, k, 1, &claims, err) != 0) return -1;
    snprintf(k, sizeof k, "pprun/a/%d/node/%d", attempt, o->node_rank);
    if (claims > 1) {
        void *v = NULL;
        size_t len;
        int g = store_get(j->ctl, k, &v, &len, err);
        if (g < 0) return -1;
        pp_fail(err, "node rank %d has joined already (from %s): give every node its own --node-rank", o->node_rank,
                g == 0 ? (char *)v : "another launcher");
        free(v);
        return 4;
    }
    return store_set(j->ctl, k, j->host, strlen(j->host), err) != 0 ? -1 : 0;
}

/* Node 0, once every node joined the first attempt: each node's host name
 * as it joined (its node key, claim_node_rank), for the hooks
 * (launch_info.node_hosts: pprun run records where each rank ran). Anyone
 * who reaches the store may have rewritten a key, so a value is taken
 * only when it is 1 to LAUNCH_HOST_MAX characters that term_escape leaves
 * as they are (printable, valid UTF-8): another one is said on stderr,
 * escaped, and left out (""). -1 when the store fails. */
static int read_node_hosts(job *j, pp_err *err) {
    int n = j->c.o->nnodes;
    j->hosts = calloc((size_t)n, sizeof *j->hosts);
    j->host_ptrs = calloc((size_t)n, sizeof *j->host_ptrs);
    if (!j->hosts || !j->host_ptrs) return pp_fail(err, "out of memory for %d host names", n);
    snprintf(j->hosts[0], sizeof j->hosts[0], "%s", j->host);
    for (int r = 0; r < n; r++) j->host_ptrs[r] = j->hosts[r];
    j->c.info.node_hosts = j->host_ptrs;
    for (int r = 1; r < n; r++) {
        char k[128];
        void *v;
        size_t len;
        snprintf(k, sizeof k, "pprun/a/0/node/%d", r);
        int g = store_get(j->ctl, k, &v, &len, err);
        if (g < 0) return -1;
        if (g == 1) continue; /* a node joins by setting it: not reached */
        char seen[4 * LAUNCH_HOST_MAX + 8];
        size_t used;
        size_t w = term_escape(v, len, 0, seen, sizeof seen, &used);
        if (len >= 1 && len <= LAUNCH_HOST_MAX && used == len && w == len && memcmp(seen, v, len) == 0)
            memcpy(j->hosts[r], v, len);
        else
            fprintf(stderr,
                    "pprun launch: node rank %d's host name in the store (%s) is not 1 to %d printable characters: "
                    "\"%s%s\" (%zu bytes); its ranks' host is left unknown\n",
                    r, k, LAUNCH_HOST_MAX, seen, used < len ? "..." : "", len);
        free(v);
    }
    return 0;
}

/* Attempt K's go key is set: "" opens the attempt; "refused" and
 * "timeout" end the job (-1), "stop" calls the attempt off (3); err says
 * why. count: this node's place in the count (past nnodes: it came after
 * node 0 closed it, and is not waited for). */
static int read_go(job *j, int attempt, const char *go, int64_t count, pp_err *err) {
    void *v;
    size_t len;
    int g = store_get(j->ctl, go, &v, &len, err);
    if (g < 0) return -1;
    int node = -1, sig = 0, at = 0, joined = 0;
    int called_off = g == 0 && sscanf(v, "stop %d %d", &node, &sig) == 2;
    int refused = g == 0 && sscanf(v, "refused %d %n", &node, &at) == 1 && at > 0;
    int timed_out = g == 0 && sscanf(v, "timeout %d %n", &joined, &at) == 1 && at > 0;
    /* the other node's words (a csv path among them): escaped for the terminal */
    char *why = refused || timed_out ? term_dup((char *)v + at, len - (size_t)at, 0) : NULL;
    if (refused) pp_fail(err, "node rank %d refused to join the job: %s", node, why ? why : "(out of memory)");
    if (timed_out) pp_fail(err, "node rank 0: %s", why ? why : "(out of memory)");
    free(why);
    if (g == 0) free(v);
    if (timed_out && count <= j->c.o->nnodes) read_the_timeout(j, attempt, joined);
    if (refused || timed_out) return -1;
    if (!called_off) return 0;
    j->called_off_by = node, j->called_off_sig = sig;
    char name[16];
    pp_fail(err, "node rank %d was stopped by %s: attempt %d is not started", node, launch_signal_name(sig, name),
            attempt);
    return 3;
}

/* The node ranks that never joined attempt K, as "1, 3" in missing (the
 * first 32), and how many. */
static int missing_nodes(job *j, int attempt, char *missing, size_t cap, size_t *nmiss, pp_err *err) {
    size_t m = 0;
    *nmiss = 0;
    missing[0] = '\0';
    for (int r = 0; r < j->c.o->nnodes; r++) {
        char k[128];
        void *v;
        size_t len;
        snprintf(k, sizeof k, "pprun/a/%d/node/%d", attempt, r);
        int g = store_get(j->ctl, k, &v, &len, err);
        if (g < 0) return -1;
        if (g == 0) {
            free(v);
            continue;
        }
        if ((*nmiss)++ < 32 && m + 16 < cap) m += (size_t)snprintf(missing + m, cap - m, "%s%d", m ? ", " : "", r);
    }
    return 0;
}

/* A stop signal while this node joined attempt K or waited at its
 * rendezvous: the attempt is called off for every node, as a stop
 * after an attempt calls the next one off (say_goodbye), or the others
 * would start without it, and a node that comes later would complete the
 * count for them. The count is closed first (as node 0 closes it at its
 * timeout), so that no node opens the attempt after; where it had just
 * been completed, the attempt is open and goes on without this node. On
 * the watch connection: the stop cut this one's request short (a store
 * client whose request was cut short takes no other). Best effort. */
static void call_off(job *j, int attempt) {
    const launch_options *o = j->c.o;
    if (!j->c.watch) return;
    pp_err serr;
    char k[128], text[64];
    int64_t total;
    key(k, sizeof k, attempt, "count");
    if (store_add(j->c.watch, k, o->nnodes, &total, &serr) != 0 || total - o->nnodes >= o->nnodes) return;
    key(k, sizeof k, attempt, "go");
    snprintf(text, sizeof text, "stop %d %d", o->node_rank, j->c.stop_signal);
    j->called_off = store_set(j->c.watch, k, text, strlen(text), &serr) == 0;
}

/* Every node joins attempt K; the last one opens it. On timeout, names the
 * node ranks that never came. 3 (err says who) when a node stopped by a
 * signal after attempt K-1 called the restart off. 4 when another launcher
 * holds this node rank: this one is no node of the job and leaves without
 * counting itself out. */
static int rendezvous(job *j, int attempt, pp_err *err) {
    const launch_options *o = j->c.o;
    char k[128], go[128];
    int64_t count;
    int rc = claim_node_rank(j, attempt, err);
    if (rc != 0) return rc;
    if (!j->live_claimed && o->nnodes > 1) {
        /* this node's launcher alive, for node 0 (end_for_a_gone_node):
         * once it holds its node rank (a second launcher of one, refused,
         * must not take the key with it as it leaves) */
        char live[64];
        snprintf(live, sizeof live, "pprun/live/%d", o->node_rank);
        if (store_claim(j->ctl, live, err) != 0) return pp_wrap(err, "rendezvous: the store of node rank 0");
        j->live_claimed = 1;
    }
    key(k, sizeof k, attempt, "count");
    if (store_add(j->ctl, k, 1, &count, err) != 0) return -1;
    key(go, sizeof go, attempt, "go");
    if (count == o->nnodes && store_set(j->ctl, go, "", 0, err) != 0) return -1;
    const char *keys[1] = {go};
    rc = wait_keys(j, keys, 1, (int64_t)(o->rdzv_timeout_ns / 1000000ull), err);
    int64_t joined_in_time = 0;
    if (rc == 1 && o->node_rank == 0) {
        /* Closing the count before calling the rendezvous off: a node that
         * arrives while node 0 tells the others cannot complete it, open go
         * and start its ranks alone. One that completed it just before was
         * in time: its go is on the way. */
        int64_t total;
        if (store_add(j->ctl, k, o->nnodes, &total, err) != 0) return -1;
        joined_in_time = total - o->nnodes;
        if (joined_in_time == o->nnodes) rc = wait_keys(j, keys, 1, 5000, err);
    }
    if (rc == 0) return read_go(j, attempt, go, count, err);
    if (rc != 1) return rc;
    char missing[512];
    size_t nmiss;
    if (missing_nodes(j, attempt, missing, sizeof missing, &nmiss, err) != 0) return -1;
    /* a node with another token (or none) was refused at the store: it
     * failed at once, saying so; here it only never joined */
    uint64_t refused = j->server ? store_server_refused(j->server) : 0;
    char also[200] = "";
    if (refused)
        snprintf(also, sizeof also, "; meanwhile the store refused %llu connection%s for the rendezvous token (a node "
                 "with another --rdzv-token, or none?)", (unsigned long long)refused, refused > 1 ? "s" : "");
    pp_fail(err,
            "rendezvous timed out after %.0fs (--rdzv-timeout): node rank%s %s%s never joined (store at %s, %d of %d "
            "nodes joined)%s",
            (double)o->rdzv_timeout_ns / 1e9, nmiss > 1 ? "s" : "", missing, nmiss > 32 ? ", ..." : "", j->store_addr,
            o->nnodes - (int)nmiss, o->nnodes, also);
    if (o->node_rank == 0) tell_the_timeout(j, attempt, (int)joined_in_time, err->msg);
    return -1;
}

/* --- the job ---------------------------------------------------------------------- */

static void finish_result(launch_result *res, int status, int code) {
    res->status = status;
    res->exit_code = code;
}

/* The job before its store: this host, the program found, the guard, the
 * signal handlers, the descriptor limit. A bad token or a program not
 * found is a usage error (exit code 2). */
static int job_start(const launch_options *o, const launch_hooks *hooks, launch_result *res, job **out, pp_err *err) {
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    if (!j) return pp_fail(err, "out of memory");
    j->c.o = o;
    j->c.hooks = hooks;
    net_host_name(j->host, sizeof j->host);
    res->world_size = o->nnodes * o->nproc_per_node;
    if (launch_check_token(o, err) != 0 || launch_find_program(o->prog_argv[0], &j->c.paths, err) != 0) {
        res->exit_code = 2;
        free(j);
        return -1;
    }
    snprintf(j->c.notfound_msg, sizeof j->c.notfound_msg, "pprun launch: cannot execute '%s'\n", o->prog_argv[0]);
    /* Before the subreaper is set: the guard must not stay our descendant.
     * One that cannot start leaves the job without one. */
    j->own_guard = !hooks || !hooks->guard;
    pp_err gerr;
    if (!j->own_guard) j->c.guard = hooks->guard;
    else if (launch_guard_start(&j->c.guard, &gerr) != 0) j->c.guard = NULL;
    if (install_signals(j, err) != 0) {
        if (j->own_guard) launch_guard_stop(j->c.guard);
        launch_paths_free(j->c.paths);
        free(j);
        return -1;
    }
    int held = hooks && hooks->held_signal ? hooks->held_signal(hooks->ctx) : 0;
    if (held) raise(held); /* to our own handler: the self-pipe, as a caught one */
    raise_open_file_limit(j);
    *out = j;
    return 0;
}

/* What the workers and the hooks are told of the job, once the store is up. */
static void describe_job(job *j, launch_result *res) {
    const launch_options *o = j->c.o;
    launch_info *in = &j->c.info;
    in->run_id = j->run_id;
    in->host = j->host;
    in->store_addr = j->store_addr;
    in->rdzv_token = o->rdzv_token[0] ? o->rdzv_token : NULL;
    in->nnodes = o->nnodes;
    in->node_rank = o->node_rank;
    in->nproc_per_node = o->nproc_per_node;
    in->world_size = res->world_size;
    snprintf(res->run_id, sizeof res->run_id, "%s", j->run_id);
}

/* This node's WAIT on attempt K's end key, answered when any node ends it. */
static int watch_attempt_end(job *j, int attempt, pp_err *err) {
    char k_end[128];
    key(k_end, sizeof k_end, attempt, "end");
    const char *keys[1] = {k_end};
    if (store_wait_send(j->c.watch, keys, 1, -1, err) != 0) return -1;
    j->c.watch_pending = 1;
    return 0;
}

/* The attempt could not run here (err says why), or lost node 0's store:
 * an error, no restart. The other nodes must not wait for this launcher;
 * the hooks still clean up after the attempt (its workers are gone). */
static void attempt_broke(job *j, int attempt, int out, launch_failure *fail, launch_result *res, pp_err *err) {
    const launch_hooks *hooks = j->c.hooks;
    if (out == LAUNCH_ATTEMPT_STORE_LOST) {
        j->store_ok = 0;
        pp_wrap(err, "lost the store of node rank 0 at %s (node 0 gone?)", j->store_addr);
    } else if (j->c.o->nnodes > 1) {
        pp_err ignored;
        launcher_failure(j, err->msg, fail);
        if (report_failure(j, attempt, fail, 1, &ignored) == 0) tell_told(j, attempt, &ignored);
    }
    finish_result(res, LAUNCH_ERROR, 1);
    if (hooks && hooks->after_attempt) hooks->after_attempt(hooks->ctx, &j->c.info, res);
}

/* Tells the other nodes how attempt K ended here: a failure (the first
 * one is the root cause), or one more node done (the last ends it). */
static int tell_outcome(job *j, int attempt, int out, const launch_failure *fail, int stop, pp_err *serr) {
    if (out == LAUNCH_ATTEMPT_FAILED || out == LAUNCH_ATTEMPT_SIGNAL)
        return report_failure(j, attempt, fail, stop, serr);
    if (out != LAUNCH_ATTEMPT_OK) return 0;
    char k[128];
    int64_t done;
    key(k, sizeof k, attempt, "done");
    int sr = store_add(j->ctl, k, 1, &done, serr);
    if (sr != 0 || done != j->c.o->nnodes) return sr;
    key(k, sizeof k, attempt, "end");
    return store_set(j->ctl, k, "", 0, serr);
}

/* Waits until every node told how attempt K ended there (all_told), so
 * that each decides on all their reports, not on whichever came first: a
 * crash, then a stop, outranks the failure of a rank that only exited
 * with an error (a rank whose peer on another node died or was stopped a
 * moment earlier gives up at once, and its node's report may be the
 * first; under scancel it often does so before its own SIGTERM lands). A node that never tells (gone, frozen) is
 * waited for --shutdown-timeout + 5 s, its teardown's bound; then what was
 * told decides. A stop signal meanwhile is noted (no restart); a second
 * one gives up. 0, or -1 (serr) when the store is gone or the wait was
 * given up. On the watch connection: free once the attempt's end came. */
static int await_all_told(job *j, int attempt, pp_err *serr) {
    char k[128];
    key(k, sizeof k, attempt, "all_told");
    const char *keys[1] = {k};
    uint64_t wait_ns = j->c.o->shutdown_timeout_ns + LAUNCH_STOP_STORE_NS;
    if (store_wait_send(j->c.watch, keys, 1, (int64_t)(wait_ns / 1000000ull), serr) != 0) return -1;
    j->c.watch_pending = 1;
    int rc = await_watch(j, pp_now_ns() + wait_ns + LAUNCH_STOP_STORE_NS, NULL, NULL, serr);
    if (rc == WATCH_STOPPED_AGAIN)
        return pp_fail(serr, "stopped again while waiting for the other nodes to tell how attempt %d ended", attempt);
    if (rc == WATCH_LATE)
        return pp_fail(serr, "store %s: no answer while waiting for the other nodes to tell how attempt %d ended "
                             "(node rank 0 stopped or unreachable?)", j->store_addr, attempt);
    return rc;
}

/* After await_all_told: when all_told is not set, the wait ran out, and
 * the first node that never told how attempt K ended (its launcher
 * killed, frozen or cut off) goes into res (silent_node), for the
 * summary: a rank here that failed may only have lost its peers there. A
 * store that does not answer leaves res as it was. */
static void find_silent_node(job *j, int attempt, launch_result *res) {
    char k[128], name[32];
    void *v;
    size_t len;
    pp_err serr;
    key(k, sizeof k, attempt, "all_told");
    int g = store_get(j->ctl, k, &v, &len, &serr);
    if (g == 0) free(v);
    if (g != 1) return;
    for (int r = 0; r < j->c.o->nnodes; r++) {
        snprintf(name, sizeof name, "told/%d", r);
        key(k, sizeof k, attempt, name);
        g = store_get(j->ctl, k, &v, &len, &serr);
        if (g == 0) free(v);
        if (g != 1) continue;
        res->silent = 1;
        res->silent_node = r;
        res->silent_wait_ns = j->c.o->shutdown_timeout_ns + LAUNCH_STOP_STORE_NS;
        snprintf(res->silent_host, sizeof res->silent_host, "%s", j->hosts ? j->hosts[r] : "");
        return;
    }
}

/* Attempt K's report named `name` (fail, stop) into f, with its stop
 * flag: 1 when it is not there, 0 (*valid: it is one of this job's
 * failures), or -1 (serr). */
static int read_report(job *j, int attempt, const char *name, launch_failure *f, int *fstop, int *valid,
                       pp_err *serr) {
    char k[128];
    void *v;
    size_t len;
    key(k, sizeof k, attempt, name);
    int g = store_get(j->ctl, k, &v, &len, serr);
    *valid = 0;
    if (g != 0) return g;
    *valid = failure_decode(v, j->c.o, f, fstop) == 0;
    free(v);
    return 0;
}

/* The root cause as every node agreed on it (attempt K's fail key, when a
 * node failed or was stopped) becomes the result; an attempt that went
 * well here was ended by another node. -1 (serr) when the store did not
 * answer. */
static int read_root_cause(job *j, int attempt, int *out, int *stop, launch_result *res, pp_err *serr) {
    launch_failure f, s, c;
    int fstop = 0, sstop = 0, cstop = 0, fok, sok, cok;
    int g = read_report(j, attempt, "fail", &f, &fstop, &fok, serr);
    if (g < 0 || read_report(j, attempt, "stop", &s, &sstop, &sok, serr) < 0 ||
        read_report(j, attempt, "crash", &c, &cstop, &cok, serr) < 0)
        return -1;
    /* The cause: the first crash, else the first stop, else the first
     * report: a rank that exited with an error, or timed out waiting for
     * one, may only have lost a peer that the crash or the stop took. A
     * stop anywhere means nobody restarts. */
    sok = sok && is_stop(&s);
    cok = cok && is_crash(&c);
    if (sok) *stop = 1;
    if (cok && (g != 0 || !fok || !is_crash(&f))) {
        f = c;
        fstop = cstop;
        fok = 1;
        g = 0;
    } else if (sok && (g != 0 || !fok || (!is_stop(&f) && !is_crash(&f)))) {
        f = s;
        fok = 1;
        g = 0;
    }
    if (g == 1) {
        /* Every node done (this one too), or ended by a node that never
         * said why (it died waiting for the first report, or a stranger
         * set the end key). */
        if (*out != LAUNCH_ATTEMPT_REMOTE) return 0;
        launcher_failure(j, "the attempt was ended by another node that said no why (pprun/a/K/fail is not set)",
                         &f);
        res->failure = f;
        finish_result(res, LAUNCH_FAILED, 1);
        return 0;
    }
    if (fok) {
        *stop |= fstop;
        /* A node whose launcher got a stop signal, or one of whose ranks was
         * killed by one pprun had not sent: the job was stopped, on every
         * node (this one's own stop, if it had one, names who got it). */
        int stopped = is_stop(&f);
        if (stopped && *out != LAUNCH_ATTEMPT_SIGNAL) {
            res->failure = f;
            res->failure_remote = f.node_rank != j->c.o->node_rank;
            res->signal = f.signal;
            /* the stop's exit status on every node: whether this launcher's own
             * signal (scancel sends each one) comes before or after is chance */
            finish_result(res, LAUNCH_SIGNALED, 128 + f.signal);
        } else if (!stopped && f.global_rank >= 0) {
            res->failure = f;
            res->failure_remote = f.node_rank != j->c.o->node_rank;
            finish_result(res, LAUNCH_FAILED, 1);
        } else if (!stopped && *out != LAUNCH_ATTEMPT_SIGNAL) {
            /* Another node's launcher failed (f's stderr tail says why). */
            res->failure = f;
            res->failure_remote = 1;
            finish_result(res, LAUNCH_FAILED, 1);
        }
    } else {
        /* Not one of this job's failures: ended, cause unknown, said as this launcher's. */
        launcher_failure(j, "the attempt was ended by a failure report in the store that names no node or rank "
                            "of this job (pprun/a/K/fail); its cause is unknown", &f);
        res->failure = f;
        finish_result(res, LAUNCH_FAILED, 1);
    }
    if (*out == LAUNCH_ATTEMPT_OK) *out = LAUNCH_ATTEMPT_REMOTE;
    return 0;
}

/* With other nodes: tells them this node's outcome, waits for the
 * attempt's end everywhere (our own WAIT answers) and takes the root cause
 * they agreed on. Without node 0's store this node's outcome stands when
 * it is one (a failure, a signal); -1 (err) when it finished well, or was
 * ended from elsewhere, and cannot know how the attempt went. */
static int agree_on_outcome(job *j, int attempt, int *out, int *stop, launch_failure *fail, launch_result *res,
                            pp_err *err) {
    pp_err serr;
    j->telling = 1;
    int sr = tell_outcome(j, attempt, *out, fail, *stop, &serr);
    if (sr == 0 && j->c.watch_pending) sr = await_attempt_end(j, attempt, out, stop, fail, &serr);
    if (sr == 0) sr = tell_told(j, attempt, &serr);
    int told = sr == 0; /* the others know how it ended here */
    if (sr == 0) sr = await_all_told(j, attempt, &serr);
    if (sr == 0) find_silent_node(j, attempt, res);
    if (sr == 0) sr = read_root_cause(j, attempt, out, stop, res, &serr);
    j->telling = 0;
    if (sr == 0) return 0;
    j->store_ok = 0;
    /* A stop signal cut the report, or the reading of how the others
     * ended, short (a second one while telling, stop_requested): this
     * node was stopped. Under scancel it often comes just after another
     * node's stop ended the attempt here (before: a failure of nobody, its
     * summary empty). */
    if (j->c.stop_signal && (*out == LAUNCH_ATTEMPT_OK || *out == LAUNCH_ATTEMPT_REMOTE))
        *out = LAUNCH_ATTEMPT_SIGNAL;
    if (*out == LAUNCH_ATTEMPT_OK || *out == LAUNCH_ATTEMPT_REMOTE)
        return pp_fail(err, "lost the store of node rank 0 at %s: %s", j->store_addr, serr.msg);
    /* This node's outcome stands; the others may not know it. */
    if (!told) fprintf(stderr, "pprun launch: could not tell the other nodes: %s\n", serr.msg);
    return 0;
}

/* The result of an attempt that reached its outcome (a failure, or a stop
 * on another node, is already in res). Stopped here: who got the signal
 * is fail (this launcher, or a rank killed from outside). */
static void settle_result(job *j, int out, launch_failure *fail, launch_result *res) {
    if (out == LAUNCH_ATTEMPT_SIGNAL) {
        if (!fail->signal) launcher_failure(j, NULL, fail); /* a stop that cut the report to the others short */
        res->failure = *fail;
        res->failure_remote = 0;
        res->signal = fail->signal;
        finish_result(res, LAUNCH_SIGNALED, 128 + fail->signal);
    } else if (out == LAUNCH_ATTEMPT_OK) {
        finish_result(res, LAUNCH_OK, 0);
    } else if (res->status != LAUNCH_FAILED && res->status != LAUNCH_SIGNALED) {
        finish_result(res, LAUNCH_FAILED, 1);
    }
}

/* The local ranks of the attempt, unless the before_attempt hook refuses
 * it (err): LAUNCH_ATTEMPT_*. */
static int run_local_ranks(job *j, launch_failure *fail, pp_err *err) {
    const launch_hooks *hooks = j->c.hooks;
    int out = LAUNCH_ATTEMPT_ERROR;
    if (!hooks || !hooks->before_attempt || hooks->before_attempt(hooks->ctx, &j->c.info, err) == 0)
        out = launch_attempt(&j->c, fail, err);
    store_set_timeout(j->ctl, store_answer_ns(j)); /* the attempt may have seen a stop signal */
    return out;
}

/* 1 when the job goes on after attempt K: it failed, nobody asked to stop
 * (a stop signal while a failure was being torn down: the failure is the
 * result, and the user asked for no restart) and the store is still
 * there. Says so while restarts are left. */
static int restarts(const job *j, int attempt, int stop, const launch_result *res) {
    const launch_options *o = j->c.o;
    if (res->status != LAUNCH_FAILED || stop || j->c.stop_signal || !j->store_ok) return 0;
    if (attempt < o->max_restarts) /* counted from 1, as the summary's "attempt 2 of 3" */
        fprintf(stderr, "pprun launch: attempt %d of %d failed (rank %d); restarting (%d of %d restarts)\n",
                attempt + 1, o->max_restarts + 1, res->failure.global_rank, attempt + 1, o->max_restarts);
    return 1;
}

/* The first attempt called off by another node's stop (read_go): the job
 * was stopped before it ran, by that node's launcher. Its host is what it
 * joined with (claim_node_rank). */
static void called_off_first(job *j, launch_result *res) {
    launch_failure *f = &res->failure;
    launch_failure_clear(f);
    f->node_rank = j->called_off_by;
    f->global_rank = f->local_rank = -1;
    f->signal = j->called_off_sig;
    f->wall_ns = pp_wall_ns();
    char k[128];
    void *v;
    size_t len;
    pp_err serr;
    snprintf(k, sizeof k, "pprun/a/0/node/%d", j->called_off_by);
    if (store_get(j->ctl, k, &v, &len, &serr) == 0) {
        char *shown = term_dup(v, len, 0); /* anyone who reaches the store may have written it */
        snprintf(f->host, sizeof f->host, "%s", shown ? shown : "");
        free(shown);
        free(v);
    }
    res->failure_remote = 1;
    res->signal = j->called_off_sig;
    finish_result(res, LAUNCH_SIGNALED, 128 + j->called_off_sig);
}

/* Attempt K on this node, to its outcome everywhere. Returns 0 with
 * *again when the job restarts, else 0 (the result is in res), -1 (err), 2
 * (a stop signal before the ranks ran) or 3 (another node was stopped:
 * err says which). */
static int run_attempt(job *j, int attempt, launch_result *res, int *again, pp_err *err) {
    const launch_options *o = j->c.o;
    const launch_hooks *hooks = j->c.hooks;
    int multi = o->nnodes > 1, rc;
    *again = 0;
    j->c.info.attempt = attempt;
    if (multi && (rc = rendezvous(j, attempt, err)) != 0) {
        if (rc == 4) j->store_ok = 0, rc = -1;
        else if (rc != 3 && j->c.stop_signal) call_off(j, attempt);
        if (rc == 3 && attempt == 0) called_off_first(j, res);
        return rc < 0 && j->c.stop_signal ? 2 : rc;
    }
    if (o->node_rank == 0 && !j->hosts && read_node_hosts(j, err) != 0) return -1;
    if (attempt > 0) {
        /* A restart: the failure before it no longer stands. */
        launch_failure_clear(&res->failure);
        res->failure_remote = 0;
        res->silent = 0;
        res->status = LAUNCH_ERROR;
    }
    res->attempts = attempt + 1;
    if (multi && watch_attempt_end(j, attempt, err) != 0) return -1;
    launch_failure fail;
    launch_failure_clear(&fail);
    int out = run_local_ranks(j, &fail, err);
    if (out == LAUNCH_ATTEMPT_ERROR || out == LAUNCH_ATTEMPT_STORE_LOST) {
        attempt_broke(j, attempt, out, &fail, res, err);
        return -1;
    }
    /* Stopped by the user: no restart, here or elsewhere. A stop signal
     * while a failure was torn down: the failure is the outcome, and no
     * node restarts. A rank stopped from outside is who got the signal;
     * else this launcher is. */
    if (out == LAUNCH_ATTEMPT_SIGNAL && fail.outside) j->outside_stop = fail.signal;
    else if (out == LAUNCH_ATTEMPT_SIGNAL) launcher_failure(j, NULL, &fail);
    int stop = out == LAUNCH_ATTEMPT_SIGNAL || j->c.stop_signal;
    if (out == LAUNCH_ATTEMPT_FAILED) {
        finish_result(res, LAUNCH_FAILED, 1);
        res->failure = fail;
    }
    if (multi && agree_on_outcome(j, attempt, &out, &stop, &fail, res, err) != 0) return -1;
    settle_result(j, out, &fail, res);
    j->ran = 1;
    if (hooks && hooks->after_attempt) hooks->after_attempt(hooks->ctx, &j->c.info, res);
    *again = restarts(j, attempt, stop, res);
    return 0;
}

/* The result when the attempts stopped on rc (run_attempt's or the
 * store's set-up); returns rc as launch_job returns it. */
static int conclude(job *j, int rc, launch_result *res, pp_err *err) {
    if (rc == 3) {
        /* Another node was stopped: the last attempt's failure is the
         * outcome, or the stop itself before the first (called_off_first). */
        fprintf(stderr, "pprun launch: %s%s\n", res->attempts ? "not restarting: " : "", err->msg);
        return 0;
    }
    if (rc == 2) {
        /* A signal during set-up or rendezvous: nothing was running. */
        res->signal = j->c.stop_signal;
        finish_result(res, LAUNCH_SIGNALED, 128 + j->c.stop_signal);
        return 0;
    }
    if (rc != 0) finish_result(res, LAUNCH_ERROR, 1);
    return rc;
}

/* Node 0 serves the store until every node has read the outcome. */
static void say_goodbye(job *j, const launch_result *res) {
    const launch_options *o = j->c.o;
    if (o->nnodes <= 1 || !j->ctl || !j->store_ok) return;
    pp_err serr;
    int64_t left;
    int stopped_by = j->c.stop_signal ? j->c.stop_signal : j->outside_stop;
    if (stopped_by && j->ran) {
        /* The others may have decided to restart before they heard of
         * the stop: call the next attempt off, or they would wait for
         * this node at its rendezvous until --rdzv-timeout. */
        char go[128], text[64];
        key(go, sizeof go, res->attempts, "go");
        snprintf(text, sizeof text, "stop %d %d", o->node_rank, stopped_by);
        store_set(j->ctl, go, text, strlen(text), &serr);
    }
    /* a node that called an attempt off was stopped mid-request on ctl,
     * which takes no other (call_off) */
    store_client *sc = j->called_off ? j->c.watch : j->ctl;
    if (store_add(sc, "pprun/exit", 1, &left, &serr) != 0) return;
    if (left == o->nnodes) store_set(sc, "pprun/exit_all", "", 0, &serr);
    /* after an attempt, or a call-off at a rendezvous (the nodes that came
     * read its stop and the stopped node's host from this store: 5 s at
     * most, as a node that never joined never adds to exit) */
    if (o->node_rank == 0 && (j->ran || j->called_off) && !j->c.watch_pending) {
        const char *k = "pprun/exit_all";
        int64_t wait_ms = j->ran ? (int64_t)(o->shutdown_timeout_ns / 1000000ull) + 1000
                                 : (int64_t)(LAUNCH_STOP_STORE_NS / 1000000ull);
        store_set_interrupt(j->c.watch, j->c.sig_r, stop_requested, j);
        store_wait(j->c.watch, &k, 1, wait_ms, &serr);
    }
}

/* Undoes job_start and closes the store. */
static void job_end(job *j) {
    store_close(j->c.watch);
    store_close(j->ctl);
    store_server_stop(j->server);
    restore_open_file_limit(j);
    restore_signals(j);
    if (j->own_guard) launch_guard_stop(j->c.guard);
    launch_paths_free(j->c.paths);
    free(j->hosts);
    free(j->host_ptrs);
    free(j);
}

int launch_job(const launch_options *o, const launch_hooks *hooks, launch_result *res, pp_err *err) {
    memset(res, 0, sizeof *res);
    finish_result(res, LAUNCH_ERROR, 1);
    job *j;
    if (job_start(o, hooks, res, &j, err) != 0) return -1;
    int rc = setup_store(j, err);
    if (rc < 0 && j->c.stop_signal) rc = 2; /* a stop signal cut a store request short */
    if (rc == 0) describe_job(j, res);
    j->store_ok = rc == 0;
    for (int attempt = 0, again = 1; rc == 0 && again && attempt <= o->max_restarts; attempt++)
        rc = run_attempt(j, attempt, res, &again, err);
    rc = conclude(j, rc, res, err);
    say_goodbye(j, res);
    job_end(j);
    return rc == 0 ? 0 : -1;
}
