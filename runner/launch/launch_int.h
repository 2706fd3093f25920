/* launch_int.h: what the supervisor's files share (not for other modules). */
#ifndef PP_LAUNCH_INT_H
#define PP_LAUNCH_INT_H
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "runner/launch/launch.h"

/* --- output (launch_output.c) ------------------------------------------------ */

/* The last stderr lines of one rank, for the failure summary. */
typedef struct launch_tail {
    char line[LAUNCH_TAIL_LINES][200];
    int next, count;
} launch_tail;

/* Where the ranks' lines of one of the launcher's own streams go (fd 1 or
 * 2). A regular file (or /dev/null) is written at once, as before; a pipe,
 * a FIFO, a terminal or a socket, whose reader may stop reading (a paused
 * `| less`), is written only as far as it takes bytes without blocking:
 * the rest waits in a queue, and the launcher's loop polls the fd for room
 * next to its signal self-pipe, so a signal is acted on whatever the
 * reader does. A queue of LAUNCH_CONSOLE_MAX bytes or more holds the
 * ranks' pipes unread (they wait, as they would for a slow console);
 * once a stop signal came (dropping), what does not fit is dropped and
 * counted instead, so that the ranks can end. */
typedef struct launch_console {
    int fd;              /* where it writes */
    int own_fd;          /* a pipe's own non-blocking description (fd, opened anew), or -1 */
    int queued;          /* 1: a pipe, FIFO, terminal or socket (queue, no blocking write); 0: written at once */
    int sock;            /* a socket: send(MSG_DONTWAIT) */
    struct launch_console *same; /* fd 2 on fd 1's pipe: its lines join fd 1's queue (one order); or NULL */
    char *buf;           /* queued bytes buf[off..len) (owned) */
    size_t off, len, cap;
    int gone;            /* a write failed (EPIPE, a full disk): nothing more is written */
    int dropping;        /* a stop signal came: bytes past LAUNCH_CONSOLE_MAX are dropped */
    uint64_t dropped;    /* bytes dropped */
} launch_console;

#define LAUNCH_CONSOLE_MAX (1u << 20)

/* A console for fd; other (may be NULL): a console already set up, whose
 * queue this one shares when both are the same pipe or terminal. */
void launch_console_init(launch_console *con, int fd, launch_console *other);
/* Queues (or writes) n bytes; writes what the fd takes now. */
void launch_console_put(launch_console *con, const char *p, size_t n);
/* Writes what the fd takes now without blocking. 1 when nothing is left
 * queued (or the console is gone), else 0. */
int launch_console_flush(launch_console *con);
/* 1 when bytes wait in con's own queue (not a shared one's). */
int launch_console_pending(const launch_console *con);
/* 1 when the ranks' pipes that go to con are to be left unread: its
 * queue is full and no stop signal came. */
int launch_console_full(const launch_console *con);
/* Drops what is queued (counted in dropped). */
void launch_console_drop(launch_console *con);
void launch_console_free(launch_console *con);

/* One worker stream (stdout or stderr): the read end of its pipe, where its
 * lines go, and the partial line not yet written. */
typedef struct launch_stream {
    int fd;              /* pipe read end, -1 once at EOF */
    int console_fd;      /* 1 or 2, or -1: not shown */
    launch_console *con; /* the console of std_fd, where shown lines go */
    launch_console *notes; /* standard error's, where pprun's own notes about the stream go */
    int log_fd;          /* log file, or -1 */
    int std_fd;          /* 1 or 2: the console it goes to once its log file fails */
    int rank;            /* global rank, for that message */
    char prefix[32];
    size_t prefix_len;
    char *buf;           /* partial line (owned) */
    size_t len, cap;
    launch_tail *tail;   /* stderr only: not owned */
} launch_stream;

/* Lines longer than this are cut into several prefixed lines. */
#define LAUNCH_LINE_MAX 65536

void launch_stream_init(launch_stream *s, int fd, int console_fd, launch_console *con, launch_console *notes,
                        int log_fd, int std_fd, int rank, const char *prefix, launch_tail *tail);
/* 1 while the stream is not to be read: its lines are shown and its
 * console's queue is full (launch_console_full). */
int launch_stream_held(const launch_stream *s);
/* Reads what the pipe has (non-blocking fd), writes every complete line;
 * reads nothing while the stream is held. Returns 1 at EOF (fd closed and
 * set to -1), else 0. */
int launch_stream_pump(launch_stream *s);
/* Writes a partial last line (with a newline) and frees the buffer; closes
 * the pipe and log file. */
void launch_stream_finish(launch_stream *s);
/* The tail as text, oldest line first. */
void launch_tail_text(const launch_tail *t, char *out, size_t cap);

/* --- processes (launch_proc.c) ----------------------------------------------- */

/* A prepared worker: everything exec needs, built before fork. */
typedef struct launch_spawn {
    char **argv;         /* not owned (options) */
    char **envp;         /* owned: launch_env */
    char **paths;        /* exec candidates (owned, shared by all ranks) */
    const char *notfound_msg;
    int out_w, err_w;    /* pipe write ends, to become 1 and 2 */
    int in_fd;           /* becomes 0, or -1: inherit the launcher's stdin */
    const int *pass_fd;  /* cleared of close-on-exec in the child */
    int npass;
    const struct rlimit *nofile; /* the worker's RLIMIT_NOFILE, or NULL: the launcher's */
} launch_spawn;

/* Fork + exec; the child joins a new process group. -1 with err on failure. */
pid_t launch_spawn_worker(const launch_spawn *sp, pp_err *err);
/* Sends sig (0: none) to every live descendant of this process (walking
 * /proc) except members of the skip_groups process groups (signalled as
 * groups by the caller), and returns how many live descendants there were
 * (zombies do not count). Members of the keep_groups (launch_hooks) are
 * neither signalled nor counted. */
int launch_signal_descendants(int sig, const pid_t *skip_groups, size_t nskip, const pid_t *keep_groups,
                              size_t nkeep);

/* --- environment (launch_env.c) -------------------------------------------- */

#define LAUNCH_MAX_PASS_FDS 8
struct launch_env {
    char **v;            /* NULL-terminated, every string owned */
    size_t n, cap;
    int pass_fd[LAUNCH_MAX_PASS_FDS]; /* close-on-exec fds this rank alone inherits */
    int npass;
};
int launch_env_from_environ(launch_env *env, pp_err *err);
int launch_env_has(const launch_env *env, const char *name);
/* PYTHONPATH starts with pprun's Python package (DIR/python) and
 * PPRUN_TRACE_LIB is DIR/libpprun_trace.so, DIR the pprun executable's
 * folder, when both are there (else nothing is set). docs/torch.md. */
int launch_env_python(launch_env *env, pp_err *err);
void launch_env_free(launch_env *env);

/* --- one attempt (launch_attempt.c) ----------------------------------------- */

struct store_client;

/* The job as the attempt loop sees it (owned by launch_job). */
typedef struct launch_ctx {
    const launch_options *o;
    const launch_hooks *hooks;
    launch_info info;
    int sig_r;                   /* self-pipe: one byte per signal */
    struct store_client *watch;  /* waits for the attempt's end key, or NULL */
    int watch_pending;           /* a WAIT is outstanding on watch */
    char **paths;                /* exec candidates for the program */
    char notfound_msg[512];
    int stop_signal;             /* SIGINT/SIGTERM/SIGHUP received, or 0 */
    struct rlimit nofile;        /* RLIMIT_NOFILE as pprun found it: the workers get it back */
    int nofile_raised;           /* nofile holds it, and ours was raised */
    launch_guard *guard;         /* the caller's or launch_job's own, or NULL: none could start */
    launch_console con[2];       /* fd 1 and fd 2, during an attempt */
} launch_ctx;

enum {
    LAUNCH_ATTEMPT_OK,          /* every local rank exited 0 */
    LAUNCH_ATTEMPT_FAILED,      /* a local rank failed: *failure filled */
    LAUNCH_ATTEMPT_REMOTE,      /* another node ended the attempt */
    LAUNCH_ATTEMPT_STORE_LOST,  /* the store connection broke */
    LAUNCH_ATTEMPT_SIGNAL,      /* ctx->stop_signal */
    LAUNCH_ATTEMPT_ERROR,       /* could not start the workers: err */
};

/* f as no failure yet: zeroed, and ended_first -1 (none; 0 is rank 0).
 * Every launch_failure the launcher fills starts here. */
void launch_failure_clear(launch_failure *f);
/* Runs the local ranks of one attempt until they are all gone and every
 * descendant is dead. Returns LAUNCH_ATTEMPT_*. */
int launch_attempt(launch_ctx *c, launch_failure *failure, pp_err *err);

#endif
