/* pprun_trace.c: libpprun_trace, the tracer a user's own program calls
 * (pprun_trace.h). It writes the same records as the built-in worker's
 * engine into the ring the launcher passed (PPRUN_TRACE_FD), stamped with
 * the rank and attempt of the environment; the launcher's collector does the
 * rest. Span and schedule names travel once each, as TRACE_SPAN_NAME
 * records ahead of the first record that uses their id. Built as a shared
 * library with only the pprun_trace_* symbols visible (CMakeLists.txt). */
#include "tracer/pprun_trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pp.h"
#include "base/shape.h"
#include "base/term.h"
#include "tracer/cpuwait.h"
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
    pid_t pid;  /* the process that attached: the ring takes one writer */
    int forked; /* this is a child forked since (pt_forked_child): it must not write the ring */
    int rank, attempt;
    long microbatches, stages, world; /* bounds from the environment (or the program's schedule,
                                       * pprun_trace_schedule); 0 = not given. No step bound: below. */
    long replicas; /* pipelines in the job (PPRUN_DP_SIZE, or WORLD_SIZE over the schedule's ranks): a
                    * record's microbatch is global, below microbatches·replicas */
    int declared;  /* the program declared its schedule (pprun_trace_schedule): its shape bounds the records */
    char **names;   /* span and schedule names sent so far; id = index + 1 */
    size_t nnames, capnames;
    uint32_t *name_slots; /* a hash table of their ids (0: empty), nslots a power of 2 over 2·nnames */
    size_t nslots;
} pt = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local char pt_error[320];

/* After a fork, in the child: its copy of the tracer is its parent's, not
 * its own (one writer per ring). A flag rather than getpid() against pt.pid
 * on every record: getpid is a system call, about a microsecond in a busy
 * rank, and a record's whole budget is a few (docs/torch.md, "What tracing
 * costs"). The child has one thread, and mu as the fork caught it: held,
 * if another of the parent's threads was recording, by a thread the child
 * does not have; so it starts unlocked. */
static void pt_forked_child(void) {
    pthread_mutex_init(&pt.mu, NULL);
    pt.forked = 1;
}

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
    long fd = 0, rank = 0, attempt = 0;
    int bad_fd = fd_text && pp_parse_long(fd_text, 0, 1 << 20, "PPRUN_TRACE_FD", &fd, &err) != 0;
    /* not under pprun; or a process the rank started: it inherits the
     * variables, not the ring (its descriptor of that number is another
     * file, or none), and records nothing, as outside pprun */
    if (!fd_text || (!bad_fd && !trace_fd_is_ring((int)fd, getenv("PPRUN_TRACE_RING")))) {
        pt.state = 2;
        return;
    }
    if (bad_fd || pt_env_long("RANK", 0, 1 << 30, &rank, &err) != 0 ||
        pt_env_long("PPRUN_RESTART_COUNT", 0, 1 << 30, &attempt, &err) != 0 ||
        pt_env_long("PPRUN_MICROBATCHES", 1, 1L << 30, &pt.microbatches, &err) != 0 ||
        pt_env_long("PPRUN_NUM_STAGES", 1, 1L << 30, &pt.stages, &err) != 0 ||
        pt_env_long("WORLD_SIZE", 1, 1L << 30, &pt.world, &err) != 0 ||
        pt_env_long("PPRUN_DP_SIZE", 1, 1L << 30, &pt.replicas, &err) != 0 ||
        trace_ring_attach((int)fd, &pt.ring, &err) != 0) {
        snprintf(pt.init_error, sizeof pt.init_error, "pprun_trace_init: %.200s", err.msg);
        pt.state = 3;
        return;
    }
    int writer = trace_ring_claim(pt.ring, (int)getpid());
    if (writer != 0) {
        snprintf(pt.init_error, sizeof pt.init_error,
                 "pprun_trace_init: process %d: rank %ld's trace is written by process %d; one process per rank "
                 "records (this one was forked before it loaded libpprun_trace, or is a second program of the rank)",
                 (int)getpid(), rank, writer);
        trace_ring_close(pt.ring);
        pt.ring = NULL;
        pt.state = 3;
        return;
    }
    /* A program the rank starts must not write the same ring too. */
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    static int atfork_set;
    if (!atfork_set && pthread_atfork(NULL, NULL, pt_forked_child) == 0) atfork_set = 1;
    pt.pid = getpid();
    pt.forked = 0;
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
    pt.microbatches = pt.stages = pt.world = pt.replicas = 0;
    pt.declared = 0;
    for (size_t i = 0; i < pt.nnames; i++) free(pt.names[i]);
    free(pt.names);
    free(pt.name_slots);
    pt.names = NULL;
    pt.name_slots = NULL;
    pt.nnames = pt.capnames = pt.nslots = 0;
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

/* What is wrong with ev's fields, into why (empty when nothing is); name:
 * a span's. */
static void pt_why(const trace_event *ev, const char *name, char *why, size_t n) {
    /* OPT is per step, not per microbatch or stage; a span may be either */
    int per_op = ev->phase != TRACE_OPT && ev->phase != TRACE_SPAN;
    int eval = ev->phase == TRACE_EVAL_F || ev->phase == TRACE_EVAL_SEND_F || ev->phase == TRACE_EVAL_RECV_F ||
               ev->phase == TRACE_EVAL_LOSS;
    int comm = (ev->phase >= TRACE_SEND_F && ev->phase <= TRACE_RECV_B) || ev->phase == TRACE_EVAL_SEND_F ||
               ev->phase == TRACE_EVAL_RECV_F;
    int span = ev->phase == TRACE_SPAN;
    long replicas = pt.replicas > 1 ? pt.replicas : 1;
    /* an op, span and loss is numbered in the step's microbatches of every
     * replica (replica·n + m, docs/schema.md), as pprun's worker numbers
     * them; never past what every reader takes for a microbatch (db/bounds.h),
     * or the readers would refuse the job as damaged */
    long microbatches = pt.microbatches * replicas;
    if (microbatches > PP_SHAPE_MAX_MICROBATCHES) microbatches = PP_SHAPE_MAX_MICROBATCHES;
    const char *mb_name = microbatches == PP_SHAPE_MAX_MICROBATCHES ? "most microbatches, over every replica"
                          : microbatches == pt.microbatches ? "PPRUN_MICROBATCHES"
                                                            : "microbatches x replicas";
    long stages = pt.stages;
    const char *stage_name = "PPRUN_NUM_STAGES";
    if (span && trace_is_dp_span(name)) {
        /* a collective's bucket: as many as the program's step makes (a
         * collective a parameter: hundreds), within what readers take */
        microbatches = PP_SHAPE_MAX_MICROBATCHES;
        mb_name = "most buckets of a stage's step";
    }
    if (eval) {
        /* An evaluation is a forward-only step of its own microbatches (a
         * program may evaluate on more than it trains on), numbered over
         * every replica as pprun's own worker numbers them: bounded by
         * pprun's most microbatches over them all (what every reader takes
         * for a microbatch, db/bounds.h), not by the training step's. Its stages
         * are the declared schedule's; before the first training step
         * declares it, the launcher's PPRUN_NUM_STAGES is no bound of the
         * program's pipeline (docs/torch.md, "Evaluation steps"). */
        microbatches = PP_SHAPE_MAX_MICROBATCHES;
        mb_name = "most microbatches of an evaluation, over every replica";
        if (!pt.declared) stages = PP_SHAPE_MAX_STAGES, stage_name = "most stages, no schedule declared yet";
    }
    why[0] = '\0';
    /* any step from 0: a program runs as many as it likes (PPRUN_STEPS is
     * what `pprun run --steps` asked for, no bound of its job) */
    if (pt_range("step", ev->step, 0, 0, "", why, n) ||
        pt_range("microbatch", ev->microbatch, per_op ? 0 : -1, microbatches, mb_name, why, n) ||
        pt_range("stage", ev->stage, per_op ? 0 : -1, stages, stage_name, why, n) ||
        ((comm || span) && pt_range("peer", ev->peer, comm ? 0 : -1, pt.world, "WORLD_SIZE", why, n)))
        return;
    if (!comm && !span && ev->peer != -1)
        snprintf(why, n, "peer %d: only SEND and RECV have a peer (give -1)", ev->peer);
    else
        trace_record_why(ev, 0, why, n); /* the collector's check too */
}

/* Stamps ev with this process's rank and attempt and writes it (under mu,
 * recording); ev->source is the caller's (0: cpu). Returns as
 * trace_ring_write. */
static int pt_put_locked(trace_event *ev) {
    ev->version = TRACE_EVENT_VERSION;
    ev->rank = pt.rank;
    ev->attempt = pt.attempt;
    /* a cpu op or span (a row of events) says how long its thread waited
     * for a core; a gpu span's field is its kernels' link, none here */
    if (ev->phase < TRACE_LOSS && ev->source == TRACE_SRC_CPU) ev->wait_cpu_ns = trace_cpu_wait_since_last();
    return trace_ring_write(pt.ring, ev);
}

/* Under mu: 1 when this process records, 0 when it does not (not under
 * pprun), -1 with the reason in why (a broken environment, a forked child). */
static int pt_ready_locked(const char *what, char *why, size_t n) {
    if (pt.state == 0) pt_init_locked();
    if (pt.state == 3) {
        snprintf(why, n, "%s", pt.init_error);
        return -1;
    }
    if (pt.state == 1 && pt.forked) {
        snprintf(why, n, "pprun_trace %s: process %d records for a rank that process %d traces; one process "
                 "per rank records (a forked child must not)", what, (int)getpid(), (int)pt.pid);
        return -1;
    }
    return pt.state == 1;
}

/* FNV-1a of a name: its place in pt.name_slots. */
static size_t pt_name_hash(const char *name) {
    uint64_t h = 14695981039346656037u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211u;
    return (size_t)h;
}

/* The slot of name in pt.name_slots: the one holding its id, or the empty
 * one where it would go. */
static size_t pt_name_slot(const char *name) {
    size_t mask = pt.nslots - 1, i = pt_name_hash(name) & mask;
    while (pt.name_slots[i] && strcmp(pt.names[pt.name_slots[i] - 1], name) != 0) i = (i + 1) & mask;
    return i;
}

/* pt.name_slots with room for one more name (at most half full): 0, or -1
 * out of memory. */
static int pt_name_slots_grow(void) {
    if (2 * (pt.nnames + 1) <= pt.nslots) return 0;
    size_t n = pt.nslots ? 2 * pt.nslots : 64;
    uint32_t *slots = calloc(n, sizeof *slots), *old = pt.name_slots;
    if (!slots) return -1;
    pt.name_slots = slots, pt.nslots = n;
    for (size_t i = 0; i < pt.nnames; i++) pt.name_slots[pt_name_slot(pt.names[i])] = (uint32_t)i + 1;
    free(old);
    return 0;
}

/* The id of a span or schedule name (under mu, recording), sending its
 * TRACE_SPAN_NAME records the first time; 0 with why (n bytes) when out of
 * memory or past TRACE_SPAN_NAMES_MAX names. A name whose records the full
 * ring dropped stays lost: its spans are stored with "(name lost)". A
 * hash table finds a name sent before: a program that names every span
 * anew (f"batch {i}") scanned every name at every span. */
static uint32_t pt_name_id_locked(const char *name, char *why, size_t n) {
    if (pt.nslots) {
        uint32_t id = pt.name_slots[pt_name_slot(name)];
        if (id) return id;
    }
    if (pt.nnames >= TRACE_SPAN_NAMES_MAX) {
        snprintf(why, n, "past %d distinct span and schedule names in this process: a name is a kind of span; put "
                 "what changes in step, microbatch or stage", TRACE_SPAN_NAMES_MAX);
        return 0;
    }
    if (pt_name_slots_grow() != 0) {
        snprintf(why, n, "out of memory");
        return 0;
    }
    if (pt.nnames == pt.capnames) {
        size_t cap = pt.capnames ? 2 * pt.capnames : 16;
        char **grown = realloc(pt.names, cap * sizeof *grown);
        if (!grown) {
            snprintf(why, n, "out of memory");
            return 0;
        }
        pt.names = grown;
        pt.capnames = cap;
    }
    char *copy = strdup(name);
    if (!copy) {
        snprintf(why, n, "out of memory");
        return 0;
    }
    pt.names[pt.nnames++] = copy;
    uint32_t id = (uint32_t)pt.nnames;
    pt.name_slots[pt_name_slot(name)] = id;
    trace_event base = {.source = TRACE_SRC_CPU, .rank = pt.rank, .attempt = pt.attempt};
    trace_event recs[TRACE_SPAN_NAME_MAX / TRACE_NAME_CHUNK + 1];
    size_t nrecs = trace_name_records_of(TRACE_SPAN_NAME, &base, id, name, recs);
    for (size_t i = 0; i < nrecs; i++) pt_put_locked(&recs[i]);
    return id;
}

/* Checks and writes one record (initialising first, so a program may skip
 * pprun_trace_init); `ev` has phase, value and the op's fields; a span's
 * name (name non-NULL) gets its id. Returns as pprun_trace_op. */
static int pt_write_named(trace_event *ev, const char *phase_name, const char *name) {
    char why[320]; /* set where rc becomes -1; one byte cleared, not 320, for every record */
    why[0] = '\0';
    pthread_mutex_lock(&pt.mu);
    int rc = pt_ready_locked(phase_name, why, sizeof why);
    if (rc == 1) {
        char bad[200];
        pt_why(ev, name, bad, sizeof bad);
        if (bad[0]) {
            snprintf(why, sizeof why, "pprun_trace %s: %s", phase_name, bad);
            rc = -1;
        } else if (name && !(ev->name = pt_name_id_locked(name, bad, sizeof bad))) {
            snprintf(why, sizeof why, "pprun_trace %s: %s", phase_name, bad);
            rc = -1;
        } else {
            rc = pt_put_locked(ev);
        }
        /* a refused record is lost to the job as a full ring's is: counted
         * as dropped, which the dashboard and pprun stats show */
        if (rc < 0) trace_ring_count_dropped(pt.ring, 1);
    }
    pthread_mutex_unlock(&pt.mu);
    return rc < 0 ? pt_fail("%s", why) : rc;
}

static int pt_write(trace_event *ev, const char *phase_name) { return pt_write_named(ev, phase_name, NULL); }

/* n records added to the ring's drop counter when this process records
 * (pt_ready_locked's answer; why says why not). */
static int pt_count_dropped(uint64_t n, const char *api, char *why, size_t wn) {
    pthread_mutex_lock(&pt.mu);
    int rc = pt_ready_locked(api, why, wn);
    if (rc == 1) trace_ring_count_dropped(pt.ring, n);
    pthread_mutex_unlock(&pt.mu);
    return rc;
}

/* A record refused before its fields were checked (a bad phase or
 * name): counted as dropped when this process records, as pt_write_named
 * counts one with bad fields. Returns -1 (pt_error is the caller's). */
static int pt_refused(void) {
    char why[320];
    pt_count_dropped(1, "", why, sizeof why);
    return -1;
}

PPRUN_TRACE_API int pprun_trace_count_dropped(int64_t n) {
    if (n < 0 || n > PPRUN_TRACE_COUNT_DROPPED_MAX)
        return pt_fail("pprun_trace_count_dropped: %lld records: out of range 0..%lld", (long long)n,
                       (long long)PPRUN_TRACE_COUNT_DROPPED_MAX);
    char why[320] = "";
    int rc = pt_count_dropped((uint64_t)n, "count_dropped", why, sizeof why);
    return rc < 0 ? pt_fail("%s", why) : rc;
}

/* pprun_trace_op and pprun_trace_gpu_op: one op of `source`. */
static int pt_op(const char *api, int source, const char *phase, int step, int microbatch, int stage, int peer,
                 uint64_t bytes, uint64_t start_ns, uint64_t end_ns) {
    static const int recordable[] = {TRACE_F,      TRACE_B,      TRACE_W,         TRACE_BW,         TRACE_SEND_F,
                                     TRACE_RECV_F, TRACE_SEND_B, TRACE_RECV_B,    TRACE_OPT,        TRACE_EVAL_F,
                                     TRACE_EVAL_SEND_F,          TRACE_EVAL_RECV_F};
    int kind = -1;
    for (size_t i = 0; phase && kind < 0 && i < sizeof recordable / sizeof recordable[0]; i++)
        if (strcmp(phase, trace_phase_name(recordable[i])) == 0) kind = recordable[i];
    if (kind < 0) {
        /* the phase is the caller's bytes: escaped as names are (base/term.h),
         * or an ESC among them would drive the terminal of whoever prints the
         * error */
        char shown[200];
        size_t used;
        term_escape(phase ? phase : "(null)", phase ? strnlen(phase, 40) : 6, 0, shown, sizeof shown, &used);
        pt_fail("%s: phase '%s': expected F, B, W, BW, SEND_F, RECV_F, SEND_B, RECV_B, OPT, EVAL_F, EVAL_SEND_F or "
                "EVAL_RECV_F", api, shown);
        return pt_refused();
    }
    trace_event ev = {.phase = (uint8_t)kind, .source = (uint8_t)source, .step = step, .microbatch = microbatch,
                      .stage = stage, .peer = peer, .start_ns = start_ns, .end_ns = end_ns, .bytes = bytes};
    return pt_write(&ev, phase);
}

PPRUN_TRACE_API int pprun_trace_op(const char *phase, int step, int microbatch, int stage, int peer, uint64_t bytes,
                                   uint64_t start_ns, uint64_t end_ns) {
    return pt_op("pprun_trace_op", TRACE_SRC_CPU, phase, step, microbatch, stage, peer, bytes, start_ns, end_ns);
}

PPRUN_TRACE_API int pprun_trace_gpu_op(const char *phase, int step, int microbatch, int stage, int peer,
                                       uint64_t bytes, uint64_t start_ns, uint64_t end_ns) {
    return pt_op("pprun_trace_gpu_op", TRACE_SRC_GPU, phase, step, microbatch, stage, peer, bytes, start_ns, end_ns);
}

_Static_assert(sizeof(pprun_trace_op_record) == 64 && offsetof(pprun_trace_op_record, gpu) == 16 &&
                   offsetof(pprun_trace_op_record, bytes) == 40,
               "pprun_trace_op_record is the Python package's struct \"=16s6i3Q\" (python/pprun/_trace.py)");

PPRUN_TRACE_API int pprun_trace_op_packed(const pprun_trace_op_record *rec) {
    const char *bad = !rec                                            ? "no record (NULL)"
                      : !memchr(rec->phase, '\0', sizeof rec->phase)  ? "phase: no NUL within its 16 bytes"
                      : rec->gpu != 0 && rec->gpu != 1                ? "gpu: must be 0 (a host span) or 1 (a gpu span)"
                      : rec->reserved != 0                            ? "reserved: must be 0"
                                                                      : NULL;
    if (bad) {
        pt_fail("pprun_trace_op_packed: %s", bad);
        return pt_refused();
    }
    return pt_op(rec->gpu ? "pprun_trace_gpu_op" : "pprun_trace_op", rec->gpu ? TRACE_SRC_GPU : TRACE_SRC_CPU,
                 rec->phase, rec->step, rec->microbatch, rec->stage, rec->peer, rec->bytes, rec->start_ns,
                 rec->end_ns);
}

PPRUN_TRACE_API int pprun_trace_loss(int step, int microbatch, int stage, double loss) {
    uint64_t now = pp_now_ns();
    trace_event ev = {.phase = TRACE_LOSS, .step = step, .microbatch = microbatch, .stage = stage, .peer = -1,
                      .start_ns = now, .end_ns = now, .value = loss};
    return pt_write(&ev, "LOSS");
}

PPRUN_TRACE_API int pprun_trace_eval_loss(int step, int microbatch, int stage, double loss) {
    uint64_t now = pp_now_ns();
    trace_event ev = {.phase = TRACE_EVAL_LOSS, .step = step, .microbatch = microbatch, .stage = stage, .peer = -1,
                      .start_ns = now, .end_ns = now, .value = loss};
    return pt_write(&ev, "EVAL_LOSS");
}

/* A span or schedule name: 1 .. TRACE_SPAN_NAME_MAX bytes of printable
 * UTF-8 text: no ASCII control byte (below 0x20: a newline, an escape
 * sequence; 0x7f, DEL), no byte that is not UTF-8, no C1 control
 * (U+0080..U+009F, CSI among them). The name is stored as given and shown
 * by pprun stats, the dashboard and Perfetto, where such a byte would only
 * break the line, the terminal or the JSON. Printable is what base/term.h
 * leaves as it is. 0, or -1 with the reason. */
static int pt_check_name(const char *what, const char *name) {
    if (!name || !*name) return pt_fail("%s: the name is empty", what);
    size_t len = strlen(name);
    if (len > TRACE_SPAN_NAME_MAX) { /* its start shown escaped (base/term.h): it may hold anything */
        char shown[200];
        size_t used;
        term_escape(name, 40, 0, shown, sizeof shown, &used);
        return pt_fail("%s: name '%s...' is %zu bytes, more than %d", what, shown, len, TRACE_SPAN_NAME_MAX);
    }
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return pt_fail("%s: name has control byte 0x%02x at byte %zu; names are printable text (no byte below "
                           "0x20, nor 0x7f)",
                           what, (unsigned char)name[i], i);
    for (size_t i = 0, used; i < len; i += used) { /* a character at a time */
        char out[8];
        size_t o = term_escape(name + i, len - i, 0, out, sizeof out, &used);
        if (used == 0 || o != used || memcmp(out, name + i, used) != 0)
            return pt_fail("%s: name is not printable UTF-8 at byte %zu (0x%02x): names are UTF-8 text without "
                           "control characters",
                           what, i, (unsigned char)name[i]);
    }
    return 0;
}

PPRUN_TRACE_API int pprun_trace_span(const char *name, int step, int microbatch, int stage, int peer, uint64_t bytes,
                                     uint64_t start_ns, uint64_t end_ns) {
    if (pt_check_name("pprun_trace_span", name) != 0) return pt_refused();
    trace_event ev = {.phase = TRACE_SPAN, .step = step, .microbatch = microbatch, .stage = stage, .peer = peer,
                      .start_ns = start_ns, .end_ns = end_ns, .bytes = bytes};
    char what[80];
    snprintf(what, sizeof what, "span '%.40s'", name);
    return pt_write_named(&ev, what, name);
}

/* One action of `actions` ("0F3", "1BW0"; "." an idle slot) into *a;
 * *end past it. 1 an action, 0 an idle slot, -1 not one. */
static int pt_parse_action(const char *text, const char **end, trace_event *a) {
    const char *p = text;
    if (*p == '.') {
        *end = p + 1;
        return 0;
    }
    char *after;
    if (*p < '0' || *p > '9') return -1;
    long stage = strtol(p, &after, 10);
    p = after;
    int op = p[0] == 'B' && p[1] == 'W' ? TRACE_BW : p[0] == 'F' ? TRACE_F : p[0] == 'B' ? TRACE_B
           : p[0] == 'W' ? TRACE_W : -1;
    if (op < 0) return -1;
    p += op == TRACE_BW ? 2 : 1;
    if (*p < '0' || *p > '9') return -1;
    long mb = strtol(p, &after, 10);
    if (*after && *after != ' ') return -1;
    if (stage > 1L << 30 || mb > 1L << 30) return -1;
    a->plan.stage = (int32_t)stage;
    a->plan.op = op;
    a->plan.microbatch = (int32_t)mb;
    *end = after;
    return 1;
}

PPRUN_TRACE_API int pprun_trace_schedule(const char *name, int ranks, int stages, int microbatches,
                                         const char *actions) {
    if (pt_check_name("pprun_trace_schedule", name) != 0) return -1;
    /* pprun's own bounds of a schedule (base/shape.h): the collector
     * stores the shape and pprun stats, the dashboard's what-if and the
     * plan's simulation allocate by it, so a program gets no more than
     * pprun schedule would build. */
    pp_err bad;
    if (pp_shape_check(ranks, stages, microbatches, &bad) != 0)
        return pt_fail("pprun_trace_schedule: %s", bad.msg);
    if (!actions) actions = "";
    /* Parsed whole first: a bad action records nothing. */
    size_t cap = strlen(actions) / 3 + 1, n = 0;
    int slots = 0;
    trace_event *plan = calloc(cap, sizeof *plan);
    if (!plan) return pt_fail("pprun_trace_schedule: out of memory");
    for (const char *p = actions; *p;) {
        if (*p == ' ') {
            p++;
            continue;
        }
        const char *end;
        trace_event a = {.phase = TRACE_PLAN};
        int kind = pt_parse_action(p, &end, &a);
        if (kind < 0 || (kind == 1 && (a.plan.stage >= stages || a.plan.microbatch >= microbatches))) {
            int len = (int)strcspn(p, " ");
            free(plan);
            if (kind < 0)
                return pt_fail("pprun_trace_schedule: action '%.*s': expected {stage}{F|B|W|BW}{microbatch} "
                               "(0F3, 1BW0) or . (idle)", len > 40 ? 40 : len, p);
            return pt_fail("pprun_trace_schedule: action '%.*s': stage must be below %d, microbatch below %d",
                           len > 40 ? 40 : len, p, stages, microbatches);
        }
        if (kind == 1) {
            a.plan.slot = slots;
            plan[n++] = a;
        }
        slots++;
        p = end;
    }
    char why[320] = "";
    pthread_mutex_lock(&pt.mu);
    int rc = pt_ready_locked("schedule", why, sizeof why);
    if (rc == 1) {
        char bad[240];
        uint32_t id = pt_name_id_locked(name, bad, sizeof bad);
        if (!id) {
            snprintf(why, sizeof why, "pprun_trace_schedule: %s", bad);
            rc = -1;
        } else {
            /* From now on the program's shape bounds its records. */
            pt.stages = stages;
            pt.microbatches = microbatches;
            pt.declared = 1;
            if (pt.world > 0 && pt.world % ranks == 0) pt.replicas = pt.world / ranks;
            trace_event head = {.phase = TRACE_SCHEDULE,
                                .sched = {.name = id, .ranks = ranks, .stages = stages,
                                          .microbatches = microbatches, .slots = slots}};
            rc = pt_put_locked(&head);
            for (size_t i = 0; i < n && rc == 1; i++) rc = pt_put_locked(&plan[i]);
        }
    }
    pthread_mutex_unlock(&pt.mu);
    free(plan);
    return rc < 0 ? pt_fail("%s", why) : rc;
}
