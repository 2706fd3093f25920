/* launch_proc.c: starting workers, finding every process they left, and
 * the guard that kills their process groups if the launcher is SIGKILLed.
 *
 * Between fork and exec the child makes only async-signal-safe calls (the
 * launcher may run other threads): everything it needs, the PATH lookup
 * included, is prepared before fork. */
#include "runner/launch/launch_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

void launch_paths_free(char **paths) {
    if (!paths) return;
    for (char **p = paths; *p; p++) free(*p);
    free(paths);
}

int launch_find_program(const char *prog, char ***out, pp_err *err) {
    *out = NULL;
    if (!prog || !*prog) return pp_fail(err, "missing PROGRAM");
    if (strchr(prog, '/')) {
        if (!executable_file(prog))
            return pp_fail(err, "PROGRAM '%s': %s", prog,
                           access(prog, F_OK) == 0 ? "not an executable file" : "no such file");
        char **paths = calloc(2, sizeof *paths);
        if (!paths || !(paths[0] = strdup(prog))) {
            free(paths);
            return pp_fail(err, "out of memory");
        }
        *out = paths;
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    size_t cap = 8, n = 0;
    char **paths = calloc(cap, sizeof *paths);
    if (!paths) return pp_fail(err, "out of memory");
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        char cand[4096];
        if (dl == 0) snprintf(cand, sizeof cand, "./%s", prog);
        else snprintf(cand, sizeof cand, "%.*s/%s", (int)dl, p, prog);
        if (executable_file(cand)) {
            if (n + 2 > cap) {
                char **np = realloc(paths, (cap *= 2) * sizeof *np);
                if (!np) break;
                paths = np;
            }
            paths[n] = strdup(cand);
            if (paths[n]) paths[++n] = NULL;
        }
        if (!colon) break;
        p = colon + 1;
    }
    if (n == 0) {
        free(paths);
        return pp_fail(err, "PROGRAM '%s' not found in PATH", prog);
    }
    *out = paths;
    return 0;
}

int launch_check_program(const launch_options *o, pp_err *err) {
    char **paths;
    if (launch_find_program(o->prog_argc > 0 ? o->prog_argv[0] : NULL, &paths, err) != 0) return -1;
    launch_paths_free(paths);
    return 0;
}

pid_t launch_spawn_worker(const launch_spawn *sp, pp_err *err) {
    /* Prepared here: the child must not allocate. */
    pid_t parent = getpid();
    sigset_t none;
    sigemptyset(&none);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    size_t msg_len = strlen(sp->notfound_msg);
    /* No signal may run the launcher's handlers in the child (they write to
     * the launcher's self-pipe) before they are reset: block all until then. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);

    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return pp_fail(err, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        setpgid(0, 0);
        /* Workers must not outlive a launcher killed with SIGKILL. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(128 + SIGKILL);
        if (sp->in_fd >= 0) dup2(sp->in_fd, 0);
        if (sp->out_w == 1) fcntl(1, F_SETFD, 0);
        else dup2(sp->out_w, 1);
        if (sp->err_w == 2) fcntl(2, F_SETFD, 0);
        else dup2(sp->err_w, 2);
        for (int i = 0; i < sp->npass; i++) fcntl(sp->pass_fd[i], F_SETFD, 0);
        if (sp->nofile) setrlimit(RLIMIT_NOFILE, sp->nofile);
        /* The launcher ignores SIGPIPE and catches the rest; give the worker
         * the defaults before anything is unblocked. */
        static const int launcher_signals[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD};
        for (size_t i = 0; i < sizeof launcher_signals / sizeof launcher_signals[0]; i++)
            sigaction(launcher_signals[i], &dfl, NULL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (char **p = sp->paths; *p; p++) execve(*p, sp->argv, sp->envp);
        ssize_t w = write(2, sp->notfound_msg, msg_len);
        (void)w;
        _exit(127);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* Also from the parent, so the group exists before anyone signals it. */
    setpgid(pid, pid);
    return pid;
}

typedef struct {
    pid_t pid, ppid, pgrp;
    char state;
    int mark;
} proc_row;

static int by_pid(const void *a, const void *b) {
    pid_t x = ((const proc_row *)a)->pid, y = ((const proc_row *)b)->pid;
    return x < y ? -1 : x > y;
}

/* Reads pid, state and ppid of every process. Caller frees *rows. */
static size_t read_procs(proc_row **rows) {
    size_t n = 0, cap = 512;
    proc_row *r = malloc(cap * sizeof *r);
    DIR *d = opendir("/proc");
    if (!r || !d) {
        if (d) closedir(d);
        free(r);
        *rows = NULL;
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        buf[len] = '\0';
        /* "pid (comm) S ppid ...": comm may hold spaces and ')'. */
        char *rp = strrchr(buf, ')');
        int ppid, pgrp;
        char st;
        if (!rp || sscanf(rp + 1, " %c %d %d", &st, &ppid, &pgrp) != 3) continue;
        if (n == cap) {
            proc_row *nr = realloc(r, (cap *= 2) * sizeof *nr);
            if (!nr) break;
            r = nr;
        }
        r[n++] = (proc_row){(pid_t)atoi(e->d_name), (pid_t)ppid, (pid_t)pgrp, st, 0};
    }
    closedir(d);
    *rows = r;
    return n;
}

int launch_signal_descendants(int sig, const pid_t *skip_groups, size_t nskip) {
    proc_row *rows;
    size_t n = read_procs(&rows);
    pid_t self = getpid();
    /* Sorted by pid, each row's parent is a binary search away; walk up
     * from every row until self (a descendant), or a row already decided,
     * or no parent (not one). mark: 0 unknown, 1 descendant, 2 not. */
    qsort(rows, n, sizeof *rows, by_pid);
    for (size_t i = 0; i < n; i++) {
        size_t chain[64], depth = 0, k = i;
        int verdict = 2;
        for (;;) {
            if (rows[k].mark) {
                verdict = rows[k].mark;
                break;
            }
            if (depth == sizeof chain / sizeof chain[0]) break; /* absurdly deep: not ours */
            chain[depth++] = k;
            if (rows[k].ppid == self) {
                verdict = 1;
                break;
            }
            proc_row key = {.pid = rows[k].ppid};
            proc_row *parent = rows[k].ppid > 1 ? bsearch(&key, rows, n, sizeof *rows, by_pid) : NULL;
            if (!parent) break;
            k = (size_t)(parent - rows);
        }
        while (depth) rows[chain[--depth]].mark = verdict;
    }
    int live = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].mark != 1 || rows[i].state == 'Z' || rows[i].state == 'X') continue;
        live++;
        int skip = 0;
        for (size_t k = 0; k < nskip && !skip; k++) skip = rows[i].pgrp == skip_groups[k];
        if (sig && !skip) kill(rows[i].pid, sig);
    }
    free(rows);
    return live;
}

/* ---- the guard ------------------------------------------------------------ */

/* In the guard: every group the launcher announced and did not retire.
 * Only async-signal-safe calls here (the launcher may have threads). */
static pid_t guard_groups[LAUNCH_MAX_NPROC];

static void guard_loop(int fd) {
    size_t n = 0;
    int clean = 0;
    int32_t msg[256];
    for (;;) {
        ssize_t got = read(fd, msg, sizeof msg);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break; /* EOF: the launcher is gone */
        for (ssize_t i = 0; i < got / (ssize_t)sizeof msg[0]; i++) {
            pid_t v = msg[i];
            if (v == 0) {
                clean = 1;
            } else if (v > 0 && n < LAUNCH_MAX_NPROC) {
                guard_groups[n++] = v;
            } else {
                for (size_t k = 0; k < n; k++)
                    if (guard_groups[k] == -v) {
                        guard_groups[k] = guard_groups[--n];
                        break;
                    }
            }
        }
    }
    if (!clean)
        for (size_t k = 0; k < n; k++) kill(-guard_groups[k], SIGKILL);
}

int launch_guard_start(void) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pid_t mid = fork();
    if (mid == 0) {
        /* The middle child exits at once, so the guard is re-parented away
         * from the launcher: its descendant walks and waitpid(-1) never see
         * it. A new session: the terminal's Ctrl-C and hangup do not reach
         * it, its pipe's EOF does. */
        setsid();
        if (fork() != 0) _exit(0);
        if (dup2(p[0], 3) != 3) _exit(1);
        /* It never prints: holding the launcher's stdout or stderr open would
         * keep whoever reads them (a pipe, a terminal) waiting for it. */
        int null_fd = open("/dev/null", O_RDWR);
        for (int std = 0; std < 3 && null_fd >= 0; std++) dup2(null_fd, std);
        if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0) {
            struct rlimit rl;
            rlim_t top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? rl.rlim_cur : 65536;
            for (rlim_t f = 4; f < top; f++) close((int)f);
        }
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGHUP, &ign, NULL);
        sigaction(SIGPIPE, &ign, NULL);
        sigset_t none; /* SIGTERM still ends it, as it ends any process */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        guard_loop(3);
        _exit(0);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    if (mid < 0) {
        close(p[1]);
        return -1;
    }
    while (waitpid(mid, NULL, 0) < 0 && errno == EINTR) {
    }
    /* The guard drains it continuously; a note never blocks the launcher. */
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    return p[1];
}

void launch_guard_note(int fd, pid_t pgid) {
    if (fd < 0) return;
    int32_t v = (int32_t)pgid;
    ssize_t w = write(fd, &v, sizeof v); /* at most PIPE_BUF: whole or not at all */
    (void)w;
}

void launch_guard_stop(int fd) {
    if (fd < 0) return;
    launch_guard_note(fd, 0);
    close(fd);
}
