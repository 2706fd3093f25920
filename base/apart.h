/* apart.h: a helper process of the caller's that stands outside its
 * process tree.
 *
 * Some helpers must not be the caller's children: the launcher's guard,
 * which kills the job's processes once the launcher is SIGKILLed, and the
 * dashboard's spawner of query processes (web/sqlproc.h), whose children
 * a launcher would otherwise reap and end with a job's attempts (it
 * waits for any child and walks its descendants: runner/launch/launch.h).
 * apart_fork forks twice and the middle child exits at once, so the
 * helper is re-parented away: to init, or to the nearest subreaper above
 * the caller, never to one the caller becomes later. It runs in a
 * session of its own: the terminal's Ctrl-C and hangup do not reach it;
 * the end of its socket to the caller tells it that the caller is gone.
 *
 * Where the caller is init itself (PID 1 of its PID namespace: `pprun
 * run` as a container's first process), the helper comes back to it as
 * its child. So every helper's session is noted here until the caller
 * forgets it, and whoever walks the caller's descendants to end them
 * (runner/launch/) leaves the processes of those sessions alone.
 *
 * The helper is a fork, not a new program: the caller may run other
 * threads, which may hold locks at the fork, so until it execs or exits
 * the helper makes only async-signal-safe calls (no malloc, no stdio). */
#ifndef PP_BASE_APART_H
#define PP_BASE_APART_H
#include <sys/types.h>

#include "base/pp.h"

/* Forks the helper. In the helper: returns 0, with `sock` (the caller's
 * socket to it) as descriptor 3, descriptors 0-2 on /dev/null (it never
 * prints: holding the caller's stdout or stderr open would keep whoever
 * reads them waiting for it), every other descriptor closed, every signal
 * at its default action but SIGINT, SIGHUP and SIGPIPE (ignored), none
 * blocked. In the caller: returns the helper's session id (> 0, noted
 * until apart_forget) once the middle child is gone (sock is still the
 * caller's to close), or -1 with err ("WHAT: fork: ..."). */
pid_t apart_fork(const char *what, int sock, pp_err *err);
/* The helper of session sid is gone (the caller saw its socket end). */
void apart_forget(pid_t sid);
/* Whether sid is the session of a helper this process started and has
 * not forgotten. */
int apart_is_helper(pid_t sid);

#endif
