/* apart.c: a helper process outside the caller's process tree (apart.h). */
#include "base/apart.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* In the helper: its descriptors and signals as apart.h says. */
static void apart_settle(int sock) {
    if (sock != 3 && dup2(sock, 3) != 3) _exit(1);
    fcntl(3, F_SETFD, 0);
    int null_fd = open("/dev/null", O_RDWR);
    for (int std = 0; std < 3 && null_fd >= 0; std++) dup2(null_fd, std);
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0) {
        struct rlimit rl;
        rlim_t top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? rl.rlim_cur : 65536;
        for (rlim_t f = 4; f < top; f++) close((int)f);
    }
    /* A handler of the caller's (a launcher holding its stop signals)
     * would run here, in a copy of its memory: every one back to its
     * default. */
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) sigaction(sig, &act, NULL); /* SIGKILL, SIGSTOP: refused, as they are */
    act.sa_handler = SIG_IGN;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGHUP, &act, NULL);
    sigaction(SIGPIPE, &act, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

#define APART_MAX 8 /* helpers noted at once: a launcher's guard and its dashboard's spawner */

static pthread_mutex_t apart_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t apart_sessions[APART_MAX]; /* 0: a free place */

static void apart_note(pid_t sid) {
    pthread_mutex_lock(&apart_mu);
    for (int i = 0; i < APART_MAX; i++)
        if (apart_sessions[i] == 0) {
            apart_sessions[i] = sid;
            break;
        }
    pthread_mutex_unlock(&apart_mu);
}

void apart_forget(pid_t sid) {
    pthread_mutex_lock(&apart_mu);
    for (int i = 0; i < APART_MAX; i++)
        if (apart_sessions[i] == sid) apart_sessions[i] = 0;
    pthread_mutex_unlock(&apart_mu);
}

int apart_is_helper(pid_t sid) {
    int found = 0;
    pthread_mutex_lock(&apart_mu);
    for (int i = 0; i < APART_MAX && !found && sid > 0; i++) found = apart_sessions[i] == sid;
    pthread_mutex_unlock(&apart_mu);
    return found;
}

pid_t apart_fork(const char *what, int sock, pp_err *err) {
    /* No signal between the forks: a handler of the caller's must not run
     * in the middle child or the helper. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pid_t mid = fork();
    if (mid == 0) {
        setsid();
        pid_t helper = fork();
        if (helper != 0) _exit(helper < 0);
        apart_settle(sock);
        return 0;
    }
    int e = errno;
    /* the middle child leads the helper's session (setsid): its id is the
     * session's, noted before anyone walking this process's descendants
     * could see the helper */
    if (mid > 0) apart_note(mid);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (mid < 0) return pp_fail(err, "%s: fork: %s", what, strerror(e));
    int st = 0;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        apart_forget(mid);
        return pp_fail(err, "%s: fork: the second fork failed", what);
    }
    return mid;
}
