/* launch_summary.c: the failure report printed when a job fails, laid out
 * like torchrun's so people who know it find things where they expect. */
#include "runner/launch/launch.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *launch_signal_name(int sig, char *buf) {
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    snprintf(buf, 16, "SIG%d", sig);
    return buf;
}

const char *launch_state_name(char state) {
    switch (state) {
    case 'T': return "stopped: SIGSTOP or SIGTSTP";
    case 't': return "stopped by a debugger";
    case 'R': return "running";
    case 'S': return "asleep";
    case 'D': return "waiting in the kernel";
    default: return NULL;
    }
}

/* The root cause's rank, and how it ended: an exit code, a signal, or for
 * a rank that hung, that it stopped answering and how we know. */
static void print_rank(FILE *out, const launch_failure *f, const char *when) {
    char sbuf[16];
    fprintf(out, "[%d]:\n  time      : %s\n  host      : %s%s(node rank %d)\n  rank      : %d (local_rank: %d)\n", 0,
            when, f->host, f->host[0] ? " " : "", f->node_rank, f->global_rank, f->local_rank);
    if (f->hung) {
        const char *state = launch_state_name(f->state);
        fprintf(out, "  exitcode  : none: it stopped answering");
        if (f->pid) fprintf(out, " (pid: %d%s%s)", (int)f->pid, state ? ", " : "", state ? state : "");
        fprintf(out, "\n  why       : %s\n", f->why);
    } else if (f->signal) {
        fprintf(out, "  exitcode  : -%d (pid: %d)\n  signal    : %s (%d) received by PID %d\n", f->signal, (int)f->pid,
                launch_signal_name(f->signal, sbuf), f->signal, (int)f->pid);
    } else {
        fprintf(out, "  exitcode  : %d (pid: %d)\n", f->exit_code, (int)f->pid);
        if (f->ended_first >= 0)
            fprintf(out,
                    "  before it : rank %d exited 0, %.3f s earlier, while this rank still ran: a rank that ends "
                    "early closes its peers' connections (a loop that stopped sooner on it?)\n",
                    f->ended_first, (double)f->ended_first_ago_ns / 1e9);
    }
    if (f->injected[0]) fprintf(out, "  cause     : injected by %s (fault injection: not a bug)\n", f->injected);
    else if (f->oom_kills > 0)
        fprintf(out,
                "  cause     : the kernel's out-of-memory killer, most likely: it killed %lld process%s %s "
                "during the attempt (oom_kill in %s; `dmesg` names them)\n",
                (long long)f->oom_kills, f->oom_kills == 1 ? "" : "es",
                f->oom_in_cgroup ? "in the job's memory cgroup on this node" : "on this node",
                f->oom_in_cgroup ? "the cgroup's memory.events or memory.oom_control" : "/proc/vmstat");
    else if (!f->hung && launch_is_stop_signal(f->signal))
        fprintf(out, "  cause     : %s, which pprun had not sent, while its launcher (node rank %d) got no stop "
                     "signal in its teardown: the rank's own (a trap's kill, an uncaught KeyboardInterrupt) or a kill "
                     "of it alone, not a stop of the job from outside\n",
                launch_signal_name(f->signal, sbuf), f->node_rank);
}

int launch_is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

void launch_print_summary(FILE *out, const launch_options *o, const launch_result *res, const char *name) {
    const char *bar = "============================================================";
    const launch_failure *f = &res->failure;
    char when[64] = "?";
    time_t t = (time_t)(f->wall_ns / 1000000000ull);
    struct tm tm;
    if (f->wall_ns && localtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d_%H:%M:%S", &tm);
    fprintf(out, "%s\n%s FAILED\n", bar, name ? name : o->prog_argv[0]);
    fprintf(out, "------------------------------------------------------------\n");
    fprintf(out, "Root Cause (first observed failure)%s:\n", res->failure_remote ? ", on another node" : "");
    if (f->global_rank < 0) {
        fprintf(out, "  time      : %s\n  host      : %s (node rank %d)\n  cause     : its launcher failed (below)\n",
                when, f->host, f->node_rank);
    } else {
        print_rank(out, f, when);
    }
    fprintf(out, "  run id    : %s, attempt %d of %d\n", res->run_id, res->attempts, o->max_restarts + 1);
    if (f->stderr_tail[0]) {
        if (f->hung) fprintf(out, "  stderr of rank %d, which waited for it (last lines):\n", f->witness);
        else fprintf(out, "  stderr (last lines):\n");
        for (const char *p = f->stderr_tail; *p;) {
            const char *nl = strchr(p, '\n');
            int n = nl ? (int)(nl - p) : (int)strlen(p);
            fprintf(out, "    %.*s\n", n, p);
            p += n + (nl ? 1 : 0);
        }
    } else {
        fprintf(out, "  stderr    : <empty>\n");
    }
    if (res->silent)
        fprintf(out, "  silent    : node rank %d%s%s%s never told how the attempt ended there within %.0fs (its "
                     "launcher killed, frozen or cut off?): the failure above may only be the loss of its ranks\n",
                res->silent_node, res->silent_host[0] ? " (on " : "", res->silent_host, res->silent_host[0] ? ")" : "",
                (double)res->silent_wait_ns / 1e9);
    fprintf(out, "%s\n", bar);
}

void launch_stop_text(const launch_result *res, char *buf, size_t cap) {
    const launch_failure *f = &res->failure;
    char sbuf[16];
    const char *sig = launch_signal_name(res->signal, sbuf);
    if (f->outside)
        snprintf(buf, cap, "rank %d (local rank %d on %s) was killed by %s, which pprun had not sent: the job was "
                 "stopped from outside (scancel, kill)", f->global_rank, f->local_rank, f->host, sig);
    else if (res->failure_remote)
        snprintf(buf, cap, "the launcher of node rank %d (on %s) was stopped by %s", f->node_rank, f->host, sig);
    else
        snprintf(buf, cap, "pprun was stopped by %s", sig);
}
