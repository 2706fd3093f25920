/* launch_proc.c: starting workers (and a caller's helpers the same way),
 * finding every process they left, and the guard that kills their process
 * groups, then runs the launcher's will, if the launcher is SIGKILLed
 * (launch.h).
 *
 * Between fork and exec the child makes only async-signal-safe calls (the
 * launcher may run other threads): everything it needs, the PATH lookup
 * included, is prepared before fork. The guard never execs anything but
 * the will, so it lives by the same rule: static buffers, no malloc, no
 * stdio. */
#include "runner/launch/launch_int.h"

#include "base/apart.h"
#include "base/net.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
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

/* torchrun runs PROGRAM with python (unless --no-python); pprun runs it
 * as it is. A Python file that is there but not executable (`train.py`)
 * is most likely a torchrun habit: say how to run it here. */
static int program_fail(pp_err *err, const char *prog, const char *why) {
    size_t n = strlen(prog);
    if (n > 3 && strcmp(prog + n - 3, ".py") == 0 && access(prog, F_OK) == 0)
        return pp_fail(err, "PROGRAM '%s'%s%s; pprun runs PROGRAM itself, not with python: run it as `-- python3 %s`, "
                            "or as a module with `-m MODULE`", prog, why[0] == ' ' ? "" : ": ", why, prog);
    return pp_fail(err, "PROGRAM '%s'%s%s", prog, why[0] == ' ' ? "" : ": ", why);
}

int launch_find_program(const char *prog, char ***out, pp_err *err) {
    *out = NULL;
    if (!prog || !*prog) return pp_fail(err, "missing PROGRAM");
    if (strchr(prog, '/')) {
        if (!executable_file(prog))
            return program_fail(err, prog, access(prog, F_OK) == 0 ? "not an executable file" : "no such file");
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
        return program_fail(err, prog, " not found in PATH");
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
        if (e != EAGAIN) return pp_fail(err, "fork: %s", strerror(e));
        /* EAGAIN is a limit on processes, not a passing shortage: say
         * which ones there are, this user's first (root is exempt from it) */
        char limits[320];
        pp_task_limits(limits, sizeof limits);
        return pp_fail(err, "fork: %s: the limit on processes was hit: %s", strerror(e), limits);
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

int launch_spawn_helper(char *const *argv, const launch_env *env, const int fds[3], pid_t *pid, pp_err *err) {
    char *paths[2] = {argv[0], NULL};
    /* No message when exec fails: the caller judges the helper by its exit status. */
    launch_spawn sp = {.argv = (char **)argv,
                       .envp = env->v,
                       .paths = paths,
                       .notfound_msg = "",
                       .in_fd = fds[0],
                       .out_w = fds[1] >= 0 ? fds[1] : 1,
                       .err_w = fds[2] >= 0 ? fds[2] : 2,
                       .pass_fd = env->pass_fd,
                       .npass = env->npass};
    *pid = launch_spawn_worker(&sp, err);
    return *pid > 0 ? 0 : -1;
}

typedef struct {
    pid_t pid, ppid, pgrp, session;
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
        int ppid, pgrp, session;
        char st;
        if (!rp || sscanf(rp + 1, " %c %d %d %d", &st, &ppid, &pgrp, &session) != 4) continue;
        if (n == cap) {
            proc_row *nr = realloc(r, (cap *= 2) * sizeof *nr);
            if (!nr) break;
            r = nr;
        }
        r[n++] = (proc_row){(pid_t)atoi(e->d_name), (pid_t)ppid, (pid_t)pgrp, (pid_t)session, st, 0};
    }
    closedir(d);
    *rows = r;
    return n;
}

static int in_groups(pid_t pgrp, const pid_t *groups, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (pgrp == groups[k]) return 1;
    return 0;
}

/* Marks (1) the rows that descend from root, the others 2. Sorted by pid,
 * each row's parent is a binary search away; walks up from every row
 * until root (a descendant), or a row already decided, or no parent (not
 * one). */
static void mark_descendants(proc_row *rows, size_t n, pid_t root) {
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
            if (rows[k].ppid == root) {
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
}

/* launch_signal_descendants for the descendants of root. */
static int signal_tree(pid_t root, int sig, const pid_t *skip_groups, size_t nskip, const pid_t *keep_groups,
                       size_t nkeep) {
    proc_row *rows;
    size_t n = read_procs(&rows);
    mark_descendants(rows, n, root);
    int live = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].mark != 1 || rows[i].state == 'Z' || rows[i].state == 'X') continue;
        /* the launcher's own helpers (its guard, its dashboard's spawner)
         * are its children only where it is init (base/apart.h) */
        if (in_groups(rows[i].pgrp, keep_groups, nkeep) || apart_is_helper(rows[i].session)) continue;
        live++;
        if (sig && !in_groups(rows[i].pgrp, skip_groups, nskip)) kill(rows[i].pid, sig);
    }
    free(rows);
    return live;
}

int launch_signal_descendants(int sig, const pid_t *skip_groups, size_t nskip, const pid_t *keep_groups,
                              size_t nkeep) {
    return signal_tree(getpid(), sig, skip_groups, nskip, keep_groups, nkeep);
}

int launch_signal_tree(pid_t root, int sig) { return signal_tree(root, sig, NULL, 0, NULL, 0); }

ssize_t launch_proc_file(pid_t pid, const char *name, char *buf, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t len = read(fd, buf, cap - 1);
    close(fd);
    if (len < 0) return -1;
    buf[len] = '\0';
    return len;
}

char launch_proc_state(pid_t pid) {
    char buf[512];
    if (launch_proc_file(pid, "stat", buf, sizeof buf) <= 0) return 0;
    const char *rp = strrchr(buf, ')'); /* the name, in parentheses, may hold anything */
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

/* The "oom_kill N" line of a file of counters, -1 where it has none. */
static int64_t oom_kill_line(const char *path) {
    char line[128];
    long long n = -1;
    FILE *f = fopen(path, "re");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %lld", &n) == 1) break; /* not oom_kill_disable: no number follows it */
    if (f) fclose(f);
    return n;
}

int64_t launch_oom_kills(int *in_cgroup) {
    char dir[600], file[700];
    const char *limit;
    *in_cgroup = 0;
    /* v1's root has a count of its own processes alone; v2's has no
     * memory.events, and "/" in a container's cgroup namespace is the
     * container's cgroup, whose count it is */
    if (pp_memory_cgroup(dir, sizeof dir, &limit) == 0 && strcmp(dir, "/sys/fs/cgroup/memory") != 0) {
        int v2 = strcmp(limit, "memory.max") == 0;
        snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.events" : "memory.oom_control");
        int64_t n = oom_kill_line(file);
        if (n >= 0) {
            *in_cgroup = 1;
            return n;
        }
    }
    return oom_kill_line("/proc/vmstat");
}

/* ---- the guard ------------------------------------------------------------ */

/* What the launcher tells the guard: one message each on a SOCK_SEQPACKET
 * socket, which keeps their boundaries and passes descriptors
 * (SCM_RIGHTS). A header, then for GUARD_WILL_ARGV the arguments. */
enum {
    GUARD_BYE = 0,        /* the launcher ends normally: kill nothing, run nothing */
    GUARD_GROUP = 1,      /* value: a rank's process group began (> 0), or its leader was reaped (< 0) */
    GUARD_WILL_BEGIN = 2, /* a new will follows (the one in force stays until it is whole) */
    GUARD_WILL_FDS = 3,   /* descriptors of the new will, appended in order */
    GUARD_WILL_ARGV = 4,  /* its arguments, each with its NUL (none: no will): it replaces the old one */
};
typedef struct guard_msg {
    int32_t kind, value;
} guard_msg;

#define GUARD_WILL_BYTES (60 * 1024)
#define GUARD_WILL_ARGS 256
#define GUARD_WILL_FDS LAUNCH_MAX_NPROC
#define GUARD_BYE_NS 2000000000ull /* for the guard to exit once told goodbye */

struct launch_guard {
    int fd;      /* the launcher's end of the socket */
    pid_t group; /* the guard's session (base/apart.h) */
};

extern char **environ;

/* In the guard (static: it must not allocate): every group the launcher
 * announced and did not retire; the will in force, and the descriptors of
 * the one on its way. A launcher killed while it tells a new will leaves
 * the old one in force. */
#define GUARD_GROUPS (LAUNCH_MAX_NPROC + 1) /* every rank's, and a helper's (pprun run's MPS daemon) */
static pid_t guard_groups[GUARD_GROUPS];
static unsigned char guard_retired[GUARD_GROUPS]; /* its leader was reaped; members may live on */
static size_t guard_ngroups;
static char guard_in[sizeof(guard_msg) + GUARD_WILL_BYTES];
static char guard_text[GUARD_WILL_BYTES];
static char *guard_argv[GUARD_WILL_ARGS + 1];
static int guard_fds[GUARD_WILL_FDS], guard_next_fds[GUARD_WILL_FDS];
static int guard_nfds, guard_next_nfds;

static void guard_close_next(void) {
    for (int i = 0; i < guard_next_nfds; i++) close(guard_next_fds[i]);
    guard_next_nfds = 0;
}

/* The descriptors a message carried: the next will's when it is a
 * GUARD_WILL_FDS, else (or past the limit) closed at once. */
static void guard_take_fds(struct msghdr *mh, int keep) {
    guard_next_nfds += net_fds_take(mh, guard_next_fds + guard_next_nfds, keep ? GUARD_WILL_FDS - guard_next_nfds : 0);
}

/* The new will replaces the one in force: its descriptors, and the
 * arguments, NUL-separated, as argv (none: no will). */
static void guard_set_will(const char *text, size_t len) {
    for (int i = 0; i < guard_nfds; i++) close(guard_fds[i]);
    memcpy(guard_fds, guard_next_fds, (size_t)guard_next_nfds * sizeof guard_fds[0]);
    guard_nfds = guard_next_nfds;
    guard_next_nfds = 0;
    memcpy(guard_text, text, len);
    size_t argc = 0;
    for (size_t at = 0; at < len && argc < GUARD_WILL_ARGS;) {
        guard_argv[argc++] = guard_text + at;
        while (at < len && guard_text[at]) at++;
        at++;
    }
    guard_argv[argc] = NULL;
}

/* Whether process group g has no process left (its id may then be
 * another group's one day: the guard must not kill it any more). */
static int guard_group_empty(pid_t g) { return kill(-g, 0) != 0 && errno == ESRCH; }

static void guard_forget(size_t k) {
    guard_ngroups--;
    guard_groups[k] = guard_groups[guard_ngroups];
    guard_retired[k] = guard_retired[guard_ngroups];
}

/* The groups whose leader was reaped and that have emptied since: forgotten. */
static void guard_sweep(void) {
    for (size_t k = guard_ngroups; k-- > 0;)
        if (guard_retired[k] && guard_group_empty(guard_groups[k])) guard_forget(k);
}

/* A rank's group began (v > 0), or its leader was reaped (v < 0): the
 * group is kept until it is empty, since what the rank started (a
 * background process of a shell rank) stays in it after the leader. */
static void guard_group(pid_t v) {
    pid_t g = v > 0 ? v : -v;
    size_t k = 0;
    while (k < guard_ngroups && guard_groups[k] != g) k++;
    if (v > 0) { /* a retired group's id, emptied and taken again: that one entry, live */
        if (k == guard_ngroups && guard_ngroups == GUARD_GROUPS) guard_sweep(), k = guard_ngroups;
        if (k == guard_ngroups && guard_ngroups < GUARD_GROUPS) guard_groups[guard_ngroups++] = g;
        if (k < guard_ngroups) guard_retired[k] = 0;
        return;
    }
    if (k == guard_ngroups) return;
    if (guard_group_empty(g)) guard_forget(k);
    else guard_retired[k] = 1;
}

/* Reads the launcher's messages until its end. 1 when it said goodbye. */
static int guard_listen(int sock) {
    for (;;) {
        net_fds_buf ctl;
        struct iovec iov = {guard_in, sizeof guard_in};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        struct pollfd p = {.fd = sock, .events = POLLIN};
        if (poll(&p, 1, 1000) == 0) { /* a second without a message: the retired groups looked at */
            guard_sweep();
            continue;
        }
        ssize_t got = recvmsg(sock, &mh, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0; /* EOF: the launcher is gone */
        guard_msg m = {-1, 0};
        if ((size_t)got >= sizeof m) memcpy(&m, guard_in, sizeof m);
        guard_take_fds(&mh, m.kind == GUARD_WILL_FDS);
        if (m.kind == GUARD_BYE) return 1;
        if (m.kind == GUARD_GROUP) guard_group(m.value);
        if (m.kind == GUARD_WILL_BEGIN) guard_close_next();
        if (m.kind == GUARD_WILL_ARGV && !(mh.msg_flags & MSG_TRUNC))
            guard_set_will(guard_in + sizeof m, (size_t)got - sizeof m);
    }
}

/* The will's descriptors become 3, 4, ... (first out of the way, above
 * them all, then down), then it runs in place of the guard. */
static void guard_run_will(int sock) {
    close(sock);
    guard_close_next(); /* a will the launcher did not finish telling */
    int n = guard_nfds, high[GUARD_WILL_FDS];
    for (int i = 0; i < n; i++) {
        high[i] = fcntl(guard_fds[i], F_DUPFD, 3 + n);
        close(guard_fds[i]);
    }
    for (int i = 0; i < n; i++) {
        dup2(high[i], 3 + i); /* without close-on-exec */
        close(high[i]);
    }
    execve(guard_argv[0], guard_argv, environ);
}

static void guard_main(int sock) {
    if (guard_listen(sock)) return;
    for (size_t k = 0; k < guard_ngroups; k++) kill(-guard_groups[k], SIGKILL);
    if (guard_argv[0]) guard_run_will(sock);
}

int launch_guard_start(launch_guard **out, pp_err *err) {
    *out = NULL;
    launch_guard *g = calloc(1, sizeof *g);
    if (!g) return pp_fail(err, "the guard: out of memory");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        free(g);
        return pp_fail(err, "the guard: socketpair: %s", strerror(errno));
    }
    /* Outside the launcher's tree (base/apart.h): its descendant walks and
     * waitpid(-1) never see the guard. */
    pid_t rc = apart_fork("the guard", sv[1], err);
    if (rc == 0) {
        guard_main(3);
        _exit(0);
    }
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        free(g);
        return -1;
    }
    g->fd = sv[0];
    g->group = rc;
    *out = g;
    return 0;
}

/* One message to the guard; 0, or -1 (errno) when it is gone or, with
 * MSG_DONTWAIT, busy. */
static int guard_send(launch_guard *g, int kind, int value, const void *data, size_t len, const int *fds, int nfds,
                      int flags) {
    guard_msg m = {kind, value};
    struct iovec iov[2] = {{&m, sizeof m}, {(void *)data, len}};
    net_fds_buf ctl;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
    net_fds_attach(&mh, &ctl, fds, nfds);
    ssize_t w;
    while ((w = sendmsg(g->fd, &mh, flags | MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return w < 0 ? -1 : 0;
}

void launch_guard_note(launch_guard *g, pid_t pgid) {
    /* The guard reads all the time; a note never blocks the launcher. */
    if (g) guard_send(g, GUARD_GROUP, (int)pgid, NULL, 0, NULL, 0, MSG_DONTWAIT);
}

int launch_guard_will(launch_guard *g, char *const *argv, const int *fds, int nfds, pp_err *err) {
    if (!g) return pp_fail(err, "no guard is running");
    if (nfds < 0 || nfds > GUARD_WILL_FDS)
        return pp_fail(err, "the guard's will passes %d descriptors; at most %d", nfds, GUARD_WILL_FDS);
    size_t len = 0, argc = 0;
    for (; argv && argv[argc]; argc++) len += strlen(argv[argc]) + 1;
    if (argc > GUARD_WILL_ARGS || len > GUARD_WILL_BYTES)
        return pp_fail(err, "the guard's will is too long: %zu arguments, %zu bytes (at most %d, %d)", argc, len,
                       GUARD_WILL_ARGS, GUARD_WILL_BYTES);
    char *text = malloc(len + 1);
    if (!text) return pp_fail(err, "the guard's will: out of memory");
    for (size_t i = 0, at = 0; i < argc; i++) {
        size_t n = strlen(argv[i]) + 1;
        memcpy(text + at, argv[i], n);
        at += n;
    }
    int rc = guard_send(g, GUARD_WILL_BEGIN, 0, NULL, 0, NULL, 0, 0);
    for (int at = 0; rc == 0 && at < nfds; at += NET_FDS_MAX) {
        int n = nfds - at < NET_FDS_MAX ? nfds - at : NET_FDS_MAX;
        rc = guard_send(g, GUARD_WILL_FDS, 0, NULL, 0, fds + at, n, 0);
    }
    if (rc == 0) rc = guard_send(g, GUARD_WILL_ARGV, 0, text, len, NULL, 0, 0);
    int e = errno;
    free(text);
    if (rc != 0) return pp_fail(err, "telling the guard its will: %s", strerror(e));
    return 0;
}

void launch_guard_stop(launch_guard *g) {
    if (!g) return;
    /* Then waits for the guard to be gone, so that none of the launcher's
     * processes runs on after it (whoever looks when it exits, a test or a
     * batch system, finds at most the guard's zombie, until init reaps
     * it). Its end of the socket closes as it exits, after its memory (and
     * so its environment) is gone; it never writes, so the socket turns
     * readable only then. Bounded: a guard stopped by a debugger does not
     * hold the launcher (docs/launch.md). */
    if (guard_send(g, GUARD_BYE, 0, NULL, 0, NULL, 0, 0) == 0) {
        uint64_t deadline = pp_now_ns() + GUARD_BYE_NS;
        struct pollfd p = {.fd = g->fd, .events = POLLIN};
        for (uint64_t now; (now = pp_now_ns()) < deadline;) {
            int n = poll(&p, 1, (int)((deadline - now) / 1000000 + 1));
            if (n > 0 || (n < 0 && errno != EINTR)) break;
        }
    }
    close(g->fd);
    apart_forget(g->group);
    free(g);
}
