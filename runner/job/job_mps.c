/* job_mps.c: the job's own MPS control daemon (job_mps.h). What pprun uses
 * of its interface (docs/gpu.md, "Ranks sharing a GPU: MPS"): `-d` starts
 * it in the background and returns; it writes its pid into
 * nvidia-cuda-mps-control.pid in CUDA_MPS_PIPE_DIRECTORY; `quit` on the
 * standard input of a plain invocation, with the same environment, stops it
 * and its servers. */
#include "runner/job/job_mps.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "runner/job/job_signals.h"

#define MPS_CONTROL "nvidia-cuda-mps-control"
#define MPS_PID_FILE "nvidia-cuda-mps-control.pid"
#define MPS_DEFAULT_PIPE "/tmp/nvidia-mps" /* a daemon's pipe directory without CUDA_MPS_PIPE_DIRECTORY */
#define MPS_START_NS 10000000000ull /* for `-d` to return and the pid file to appear */
#define MPS_KILLED_NS 2000000000ull /* for a killed daemon to be gone */

/* ---- stop signals, held while the supervisor's handlers are not there --------- */

/* A signal that came while they were held is raised again (it is noted
 * again when another hold is still on: job_signals.h). */
static void release_signals(job_mps *m) {
    if (!m->catching) return;
    job_signals_release();
    m->catching = 0;
    int sig = job_signals_take();
    if (sig) raise(sig);
}

/* ---- deciding ---------------------------------------------------------------- */

/* The control program's path from PATH into out (launch_find_program's
 * first candidate: an executable file, never a folder of that name); -1
 * when none is there. */
static int find_control(char *out, size_t cap) {
    char **paths;
    pp_err ignored;
    if (launch_find_program(MPS_CONTROL, &paths, &ignored) != 0) return -1;
    int fits = snprintf(out, cap, "%s", paths[0]) < (int)cap;
    launch_paths_free(paths);
    return fits ? 0 : -1;
}

static int is_daemon(pid_t pid);
static pid_t read_pid_file(const char *pipe);

int job_mps_decide(job_mps *m, const run_config *cfg, int program, int nproc_per_node, int devices, pp_err *err) {
    memset(m, 0, sizeof *m);
    m->ranks = nproc_per_node, m->devices = devices;
    if (cfg->device != RUN_DEVICE_CUDA || program) return 0; /* nothing recorded */
    if (cfg->mps == RUN_MPS_OFF) {
        snprintf(m->state, sizeof m->state, "off");
        return 0;
    }
    if (cfg->mps == RUN_MPS_AUTO && nproc_per_node <= devices) {
        snprintf(m->state, sizeof m->state, "not needed: every rank has a GPU of its own");
        return 0;
    }
    if (find_control(m->control, sizeof m->control) != 0) {
        if (cfg->mps == RUN_MPS_ON)
            return pp_fail(err, "--mps on: %s is not on PATH (NVIDIA's MPS control daemon, installed with the "
                                "driver's utilities)", MPS_CONTROL);
        snprintf(m->why_not, sizeof m->why_not, "%s is not on PATH", MPS_CONTROL);
    } else if (cfg->mps == RUN_MPS_AUTO && getenv("CUDA_MPS_PIPE_DIRECTORY")) {
        snprintf(m->why_not, sizeof m->why_not,
                 "CUDA_MPS_PIPE_DIRECTORY is set: the workers use the MPS daemon it names, if one runs there");
    } else if (cfg->mps == RUN_MPS_AUTO && is_daemon(read_pid_file(MPS_DEFAULT_PIPE))) {
        /* a system-wide daemon (the workers, without the variable, use it):
         * a second one would compete with it for the GPUs */
        snprintf(m->why_not, sizeof m->why_not, "an MPS control daemon already runs (%s)", MPS_DEFAULT_PIPE);
    }
    if (m->why_not[0]) {
        snprintf(m->state, sizeof m->state, "unavailable: %s", m->why_not);
        return 0;
    }
    m->start = 1;
    m->required = cfg->mps == RUN_MPS_ON;
    return 0;
}

/* ---- the control program ---------------------------------------------------- */

/* "exited 1", "was killed by signal 9" */
static void say_status(int status, char *buf, size_t cap) {
    if (WIFEXITED(status)) snprintf(buf, cap, "exited %d", WEXITSTATUS(status));
    else snprintf(buf, cap, "was killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* The daemon's two folders, in the control program's environment and in
 * each worker's. */
static int set_folders(const job_mps *m, launch_env *env, pp_err *err) {
    if (launch_env_set(env, "CUDA_MPS_PIPE_DIRECTORY", strchr(m->pipe_env, '=') + 1, err) != 0 ||
        launch_env_set(env, "CUDA_MPS_LOG_DIRECTORY", strchr(m->log_env, '=') + 1, err) != 0)
        return -1;
    return 0;
}

/* The control program's environment: the launcher's, with the daemon's
 * folders. 0 with *env (launch_env_destroy), or -1 with err. */
static int control_env(const job_mps *m, launch_env **env, pp_err *err) {
    if (launch_env_new(env, err) != 0) return -1;
    if (set_folders(m, *env, err) == 0) return 0;
    launch_env_destroy(*env);
    *env = NULL;
    return -1;
}

/* Starts the control program (with arg, or none) as the launcher starts a
 * worker (launch_spawn_helper: a process group of its own, so a
 * terminal's Ctrl-C is the launcher's to handle), in control_env: input
 * on its standard input (or /dev/null), its output on /dev/null, its
 * errors on errors_fd (-1: ours). 0 with *pid, or -1 with err. */
static int spawn_control(const job_mps *m, const char *arg, const char *input, int errors_fd, pid_t *pid,
                         pp_err *err) {
    int in[2] = {-1, -1}, null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || (input && pipe2(in, O_CLOEXEC) != 0)) {
        int e = errno;
        if (null >= 0) close(null);
        return pp_fail(err, "%s: %s", m->control, strerror(e));
    }
    char *argv[3] = {(char *)m->control, (char *)arg, NULL};
    int fds[3] = {input ? in[0] : null, null, errors_fd};
    launch_env *env;
    int rc = control_env(m, &env, err) == 0 ? launch_spawn_helper(argv, env, fds, pid, err) : -1;
    launch_env_destroy(env);
    close(null);
    if (input) {
        /* a few bytes into an empty pipe whose read end is still open here: never blocks, never SIGPIPE */
        ssize_t w = rc == 0 ? write(in[1], input, strlen(input)) : 0;
        (void)w;
        close(in[0]), close(in[1]);
    }
    return rc;
}

/* Waits up to limit_ns for the control program (pid) to end, then kills
 * it. 0 with *status, or -1 with err. */
static int wait_control(const job_mps *m, pid_t pid, const char *arg, uint64_t limit_ns, int *status, pp_err *err) {
    uint64_t deadline = pp_now_ns() + limit_ns;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return 0;
        if (r < 0 && errno != EINTR) return pp_fail(err, "%s: waitpid: %s", m->control, strerror(errno));
        if (pp_now_ns() >= deadline) {
            kill(-pid, SIGKILL); /* its own group (launch_spawn_helper): what it forked and did not move out */
            kill(pid, SIGKILL);
            while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
            }
            return pp_fail(err, "`%s%s%s` did not finish within %.1fs", m->control, arg ? " " : "", arg ? arg : "",
                           (double)limit_ns / 1e9);
        }
        pp_sleep_ns(2000000);
    }
}

/* Runs the control program (spawn_control) and waits up to limit_ns for
 * it (wait_control). 0 with *status, or -1 with err. */
static int run_control(const job_mps *m, const char *arg, const char *input, int errors_fd, uint64_t limit_ns,
                       int *status, pp_err *err) {
    pid_t pid;
    if (spawn_control(m, arg, input, errors_fd, &pid, err) != 0) return -1;
    return wait_control(m, pid, arg, limit_ns, status, err);
}

/* ---- the daemon's process ------------------------------------------------------- */

/* Whether pid is (still) a control daemon: alive, not a zombie, running
 * the control program (a pid the system gave to another process since is
 * not). */
static int is_daemon(pid_t pid) {
    if (pid <= 1) return 0;
    char state = launch_proc_state(pid);
    if (!state || state == 'Z') return 0;
    char cmd[4096];
    ssize_t len = launch_proc_file(pid, "cmdline", cmd, sizeof cmd);
    for (ssize_t i = 0; i < len; i++)
        if (cmd[i] == '\0') cmd[i] = ' ';
    return len > 0 && strstr(cmd, MPS_CONTROL) != NULL;
}

/* The pid in the pid file of a daemon whose pipe directory is pipe; 0 when
 * there is none (yet). */
static pid_t read_pid_file(const char *pipe) {
    char path[400], *text = NULL;
    size_t len;
    pp_err ignored;
    snprintf(path, sizeof path, "%s/%s", pipe, MPS_PID_FILE);
    if (file_input_read(path, "MPS's pid file", 64, &text, &len, &ignored) != 0) return 0;
    long pid = 0;
    char *end = text;
    if (isdigit((unsigned char)text[0])) pid = strtol(text, &end, 10);
    while (*end && isspace((unsigned char)*end)) end++;
    int whole = *end == '\0';
    free(text);
    return whole && pid > 1 ? (pid_t)pid : 0;
}

/* SIGKILL to the daemon, its process group (its own or the `-d`
 * invocation's: never the launcher's) and its descendants (the MPS
 * servers it started), these first, while they are still its. */
static void kill_daemon(pid_t pid) {
    launch_signal_tree(pid, SIGKILL);
    pid_t group = getpgid(pid);
    if (group > 1 && group != getpgrp()) kill(-group, SIGKILL);
    kill(pid, SIGKILL);
}

/* Waits until pid is no daemon, or the deadline. 1 when it is gone. */
static int wait_gone(pid_t pid, uint64_t deadline) {
    while (is_daemon(pid)) {
        if (pp_now_ns() >= deadline) return 0;
        pp_sleep_ns(5000000);
    }
    return 1;
}

/* ---- start and stop ---------------------------------------------------------------- */

/* The folder, its pipe/ and log/, the daemon started and its pid read. */
static int start_daemon(job_mps *m, pp_err *err) {
    if (file_private_dir_create("pprun-mps-", m->dir, sizeof m->dir, err) != 0) return -1;
    char pipe[216], log[216];
    snprintf(pipe, sizeof pipe, "%s/pipe", m->dir);
    snprintf(log, sizeof log, "%s/log", m->dir);
    /* the daemon's sockets are in pipe/, the longest "control_privileged" */
    if (strlen(pipe) + sizeof "/control_privileged" > sizeof ((struct sockaddr_un *)0)->sun_path)
        return pp_fail(err, "%s is too long a folder for MPS's sockets (give a shorter TMPDIR)", pipe);
    if (mkdir(pipe, 0700) != 0 || mkdir(log, 0700) != 0)
        return pp_fail(err, "cannot make %s/{pipe,log}: %s", m->dir, strerror(errno));
    snprintf(m->pipe_env, sizeof m->pipe_env, "CUDA_MPS_PIPE_DIRECTORY=%s", pipe);
    snprintf(m->log_env, sizeof m->log_env, "CUDA_MPS_LOG_DIRECTORY=%s", log);
    /* Its errors into a file of the folder, not onto the launcher's stderr,
     * which the daemon it leaves behind would otherwise hold open. */
    char errors[240];
    snprintf(errors, sizeof errors, "%s/start-errors", log);
    int efd = open(errors, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), status;
    if (efd < 0) return pp_fail(err, "%s: %s", errors, strerror(errno));
    m->launched = 1; /* from here a daemon may run, even one whose pid is never read */
    int rc = run_control(m, "-d", NULL, efd, MPS_START_NS, &status, err);
    close(efd);
    if (rc != 0) return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        m->launched = 0; /* it said it could not start one */
        char how[64], *said = NULL;
        size_t len = 0;
        pp_err ignored;
        say_status(status, how, sizeof how);
        if (file_input_read(errors, "its errors", 4096, &said, &len, &ignored) == 0)
            while (len > 0 && (said[len - 1] == '\n' || said[len - 1] == '\r')) said[--len] = '\0';
        pp_fail(err, "`%s -d` %s%s%.300s", m->control, how, len ? ": " : "", len ? said : "");
        free(said);
        return -1;
    }
    uint64_t deadline = pp_now_ns() + MPS_START_NS;
    for (;;) {
        pid_t pid = read_pid_file(pipe);
        if (is_daemon(pid)) {
            m->daemon = pid;
            return 0;
        }
        if (pp_now_ns() >= deadline)
            return pp_fail(err, "`%s -d` returned, but no daemon wrote %s/%s within %.0fs", m->control, pipe,
                           MPS_PID_FILE, (double)MPS_START_NS / 1e9);
        pp_sleep_ns(5000000);
    }
}

int job_mps_start(job_mps *m, uint64_t quit_ns, pp_err *err) {
    if (!m->start) {
        if (m->why_not[0])
            fprintf(stderr, "pprun run: MPS not started (%d ranks share %d GPU%s): %s\n", m->ranks, m->devices,
                    m->devices == 1 ? "" : "s", m->why_not);
        return 0;
    }
    m->quit_ns = quit_ns;
    job_signals_hold();
    m->catching = 1;
    if (start_daemon(m, err) == 0) {
        snprintf(m->state, sizeof m->state, "on");
        fprintf(stderr, "pprun run: MPS control daemon started for %d ranks on %d GPU%s (pid %d, %s)\n", m->ranks,
                m->devices, m->devices == 1 ? "" : "s", (int)m->daemon, m->pipe_env);
        return 0;
    }
    job_mps_stop(m);
    if (m->required) return pp_wrap(err, "--mps on");
    fprintf(stderr, "pprun run: MPS not started: %s; the ranks take turns on the GPU\n", err->msg);
    snprintf(m->state, sizeof m->state, "unavailable: %.200s", err->msg);
    return 0;
}

void job_mps_guard(job_mps *m, launch_guard *guard) {
    pid_t group = m->daemon ? getpgid(m->daemon) : -1;
    if (group <= 1 || group == getpgrp()) return;
    m->group = group, m->guard = guard;
    launch_guard_note(guard, group);
}

int job_mps_env(const job_mps *m, launch_env *env, pp_err *err) {
    if (!m->daemon) return 0;
    if (set_folders(m, env, err) != 0) return -1;
    launch_env_unset(env, "CUDA_VISIBLE_DEVICES");
    return 0;
}

void job_mps_stop(job_mps *m) {
    if (m->dir[0]) {
        pp_err err;
        int status = -1;
        uint64_t deadline = pp_now_ns() + m->quit_ns;
        int quit = m->launched ? run_control(m, NULL, "quit\n", -1, m->quit_ns, &status, &err) : -1;
        if (quit != 0 && m->launched && m->daemon) fprintf(stderr, "pprun run: MPS: %s\n", err.msg);
        int quit_taken = quit == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        /* A daemon whose pid file came late (after the start gave up) or not
         * yet missed the quit: the one its pid file names is killed below.
         * Read once at least (the quit may have used the whole wait), and
         * until the deadline while no daemon took the quit. */
        char pipe[216];
        snprintf(pipe, sizeof pipe, "%s/pipe", m->dir);
        for (int reads = 0; m->launched && !m->daemon && (reads == 0 || (!quit_taken && pp_now_ns() < deadline));
             reads++) {
            pid_t pid = read_pid_file(pipe);
            if (is_daemon(pid)) m->daemon = pid;
            else pp_sleep_ns(10000000);
        }
        if (m->daemon && !wait_gone(m->daemon, deadline)) {
            fprintf(stderr, "pprun run: the MPS control daemon (pid %d) did not quit within %.1fs: killing it\n",
                    (int)m->daemon, (double)m->quit_ns / 1e9);
            kill_daemon(m->daemon);
            if (!wait_gone(m->daemon, pp_now_ns() + MPS_KILLED_NS))
                fprintf(stderr, "pprun run: the MPS control daemon (pid %d) is still there\n", (int)m->daemon);
        }
        /* Our child when pprun is PID 1 (a container without --init): its
         * zombie reaped; not ours: nothing (ECHILD). */
        if (m->daemon) waitpid(m->daemon, NULL, WNOHANG);
        if (m->group) launch_guard_note(m->guard, -m->group);
        m->group = 0, m->guard = NULL;
        if (file_private_dir_remove(m->dir, &err) != 0) fprintf(stderr, "pprun run: MPS: %s\n", err.msg);
        m->dir[0] = '\0';
        m->daemon = 0, m->launched = 0;
    }
    release_signals(m);
}
