/* pprun_trace.c: libpprun_trace, the tracer a user's own program calls
 * (pprun_trace.h). It writes the same records as the built-in worker's
 * engine into the ring the launcher passed (PPRUN_TRACE_FD), stamped with
 * the rank and attempt of the environment; the launcher's collector does the
 * rest. Built as a shared library with only the pprun_trace_* symbols
 * visible (CMakeLists.txt). */
#include "tracer/pprun_trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pp.h"
#include "tracer/event.h"
#include "tracer/ring.h"

#define PPRUN_TRACE_API __attribute__((visibility("default")))

/* The process's one tracer, every field under mu. `state` 0: not
 * initialised yet, 1: recording, 2: not under pprun, 3: a broken
 * environment. */
static struct {
    pthread_mutex_t mu;
    int state;
    char init_error[256];
    trace_ring *ring;
    pid_t pid; /* the process that attached: the ring takes one writer */
    int rank, attempt;
    long steps, microbatches, stages, world; /* bounds from the environment; 0 = not given */
} pt = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local char pt_error[320];

static int pt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int pt_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pt_error, sizeof pt_error, fmt, ap);
    va_end(ap);
    return -1;
}

/* An integer variable of the environment into *out: 0 when absent (*out
 * stays 0), -1 when present and not a number in [min, max]. */
static int pt_env_long(const char *name, long min, long max, long *out, pp_err *err) {
    const char *text = getenv(name);
    if (!text) return 0;
    return pp_parse_long(text, min, max, name, out, err);
}

static void pt_init_locked(void) {
    pp_err err;
    const char *fd_text = getenv("PPRUN_TRACE_FD");
    if (!fd_text) {
        pt.state = 2;
        return;
    }
    long fd = 0, rank = 0, attempt = 0;
    if (pp_parse_long(fd_text, 0, 1 << 20, "PPRUN_TRACE_FD", &fd, &err) != 0 ||
        pt_env_long("RANK", 0, 1 << 30, &rank, &err) != 0 ||
        pt_env_long("PPRUN_RESTART_COUNT", 0, 1 << 30, &attempt, &err) != 0 ||
        pt_env_long("PPRUN_STEPS", 1, 1L << 30, &pt.steps, &err) != 0 ||
        pt_env_long("PPRUN_MICROBATCHES", 1, 1L << 30, &pt.microbatches, &err) != 0 ||
        pt_env_long("PPRUN_NUM_STAGES", 1, 1L << 30, &pt.stages, &err) != 0 ||
        pt_env_long("WORLD_SIZE", 1, 1L << 30, &pt.world, &err) != 0 ||
        trace_ring_attach((int)fd, &pt.ring, &err) != 0) {
        snprintf(pt.init_error, sizeof pt.init_error, "pprun_trace_init: %.200s", err.msg);
        pt.state = 3;
        return;
    }
    /* A program the rank starts must not write the same ring too. */
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    pt.pid = getpid();
    pt.rank = (int)rank;
    pt.attempt = (int)attempt;
    pt.state = 1;
}

PPRUN_TRACE_API int pprun_trace_init(void) {
    pthread_mutex_lock(&pt.mu);
    if (pt.state == 0) pt_init_locked();
    int state = pt.state;
    if (state == 3) snprintf(pt_error, sizeof pt_error, "%s", pt.init_error);
    pthread_mutex_unlock(&pt.mu);
    return state == 1 ? 1 : state == 2 ? 0 : -1;
}

PPRUN_TRACE_API uint64_t pprun_trace_now_ns(void) { return pp_now_ns(); }

PPRUN_TRACE_API const char *pprun_trace_error(void) { return pt_error; }

PPRUN_TRACE_API void pprun_trace_close(void) {
    pthread_mutex_lock(&pt.mu);
    trace_ring_close(pt.ring);
    pt.ring = NULL;
    pt.state = 0;
    pthread_mutex_unlock(&pt.mu);
}

/* A bound from the environment: value must be in [lowest, bound) when the
 * bound is known (> 0), and >= lowest always. 1 with the reason in why when
 * it is not. */
static int pt_range(const char *what, long value, long lowest, long bound, const char *bound_name, char *why,
                    size_t n) {
    if (value < lowest) snprintf(why, n, "%s %ld: must be %ld or more", what, value, lowest);
    else if (bound > 0 && value >= bound)
        snprintf(why, n, "%s %ld: out of range 0..%ld (%s=%ld)", what, value, bound - 1, bound_name, bound);
    else return 0;
    return 1;
}

/* What is wrong with ev's fields, into why (empty when nothing is). */
static void pt_why(const trace_event *ev, char *why, size_t n) {
    int per_op = ev->phase != TRACE_OPT; /* OPT is per step, not per microbatch or stage */
    int comm = ev->phase >= TRACE_SEND_F && ev->phase <= TRACE_RECV_B;
    why[0] = '\0';
    if (pt_range("step", ev->step, 0, pt.steps, "PPRUN_STEPS", why, n) ||
        pt_range("microbatch", ev->microbatch, per_op ? 0 : -1, pt.microbatches, "PPRUN_MICROBATCHES", why, n) ||
        pt_range("stage", ev->stage, per_op ? 0 : -1, pt.stages, "PPRUN_NUM_STAGES", why, n) ||
        (comm && pt_range("peer", ev->peer, 0, pt.world, "WORLD_SIZE", why, n)))
        return;
    if (!comm && ev->peer != -1)
        snprintf(why, n, "peer %d: only SEND and RECV have a peer (give -1)", ev->peer);
    else if (ev->end_ns < ev->start_ns)
        snprintf(why, n, "ends (%llu ns) before it starts (%llu ns)", (unsigned long long)ev->end_ns,
                 (unsigned long long)ev->start_ns);
}

/* Checks and writes one record (initialising first, so a program may skip
 * pprun_trace_init); `ev` has phase, value and the op's fields. Returns as
 * pprun_trace_op. */
static int pt_write(trace_event *ev, const char *phase_name) {
    char why[320] = "";
    pthread_mutex_lock(&pt.mu);
    if (pt.state == 0) pt_init_locked();
    int rc = 0;
    if (pt.state == 3) {
        snprintf(why, sizeof why, "%s", pt.init_error);
        rc = -1;
    } else if (pt.state == 1 && getpid() != pt.pid) {
        snprintf(why, sizeof why, "pprun_trace %s: process %d records for a rank that process %d traces; one process "
                 "per rank records (a forked child must not)", phase_name, (int)getpid(), (int)pt.pid);
        rc = -1;
    } else if (pt.state == 1) {
        char bad[200];
        pt_why(ev, bad, sizeof bad);
        if (bad[0]) {
            snprintf(why, sizeof why, "pprun_trace %s: %s", phase_name, bad);
            rc = -1;
        } else {
            ev->version = TRACE_EVENT_VERSION;
            ev->source = TRACE_SRC_CPU;
            ev->rank = pt.rank;
            ev->attempt = pt.attempt;
            rc = trace_ring_write(pt.ring, ev);
        }
    }
    pthread_mutex_unlock(&pt.mu);
    return rc < 0 ? pt_fail("%s", why) : rc;
}

PPRUN_TRACE_API int pprun_trace_op(const char *phase, int step, int microbatch, int stage, int peer, uint64_t bytes,
                                   uint64_t start_ns, uint64_t end_ns) {
    static const int recordable[] = {TRACE_F,      TRACE_B,      TRACE_W,      TRACE_SEND_F,
                                     TRACE_RECV_F, TRACE_SEND_B, TRACE_RECV_B, TRACE_OPT};
    int kind = -1;
    for (size_t i = 0; phase && i < sizeof recordable / sizeof recordable[0]; i++)
        if (strcmp(phase, trace_phase_name(recordable[i])) == 0) kind = recordable[i];
    if (kind < 0)
        return pt_fail("pprun_trace_op: phase '%.40s': expected F, B, W, SEND_F, RECV_F, SEND_B, RECV_B or OPT",
                       phase ? phase : "(null)");
    trace_event ev = {.phase = (uint8_t)kind, .step = step, .microbatch = microbatch, .stage = stage, .peer = peer,
                      .start_ns = start_ns, .end_ns = end_ns, .bytes = bytes};
    return pt_write(&ev, phase);
}

PPRUN_TRACE_API int pprun_trace_loss(int step, int microbatch, int stage, double loss) {
    uint64_t now = pp_now_ns();
    trace_event ev = {.phase = TRACE_LOSS, .step = step, .microbatch = microbatch, .stage = stage, .peer = -1,
                      .start_ns = now, .end_ns = now, .value = loss};
    return pt_write(&ev, "LOSS");
}
