/* collector.c: the thread that empties the trace rings into the database
 * (master) or over TCP to the master (other nodes), and the master's ingest
 * side of that TCP forwarding: its protocol (hello, frames) on
 * base/netserve.h's connections. See collector.h for the frame format. */
#include "runner/job/collector.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"
#include "base/netserve.h"
#include "base/token.h"
#include "db/analyze.h"
#include "db/bounds.h"

#define FRAME_MAGIC 0x57465050u /* "PPFW" */
#define FRAME_VERSION 1
#define HELLO_MAGIC 0x49485050u /* "PPHI" */
#define HELLO_VERSION 1
#define HELLO_WAIT_S 10         /* a forwarder waits this long for the master to accept, then to answer */
#define HELLO_ACCEPTED 1        /* the master's answers to a hello */
#define HELLO_REFUSED 0
#define HELLO_FULL 2            /* no room for another forwarding connection */
#define BATCH_MAX 65536         /* records per transaction / frame */
/* The master writes its staged records when it holds FLUSH_PER_RANK per
 * rank of the job (at most BATCH_MAX) or the oldest waited FLUSH_DELAY_NS.
 * A transaction rewrites every page it touches into the WAL, and each
 * rank's rows were a page of an index of their own (events_by_time, until
 * schema version 10; now a row of event_runs per rank): written every
 * 5 ms, a 1,024-rank job's few records per rank cost 1,024 pages each time
 * (bench/loadgen.c). The delay keeps the dashboard's live view fresh. */
#define FLUSH_PER_RANK 64
#define FLUSH_DELAY_NS 100000000ull
#define MAX_FRAME_RANKS 65535
#define MAX_CONNS_DEFAULT 4096  /* forwarding connections the master serves at once */
#define HELLO_DEADLINE_NS 10000000000ull /* accept to complete hello (or first frame magic) */
#define FRAME_DEADLINE_NS 60000000000ull /* first byte of a frame to its last */
#define MAX_BUFFERED_DEFAULT (256ull << 20) /* frames in progress, all forwarders together */
#define ACCEPT_PAUSE_NS 100000000ull     /* the listener rests this long when accept fails */
#define LOG_BURST 10            /* lines about forwarding connections per 10 s */

typedef struct frame_hdr {
    uint32_t magic;
    uint16_t version, nranks;
    int64_t job_id;
    uint32_t nrecords, pad;
} frame_hdr;

typedef struct hello_hdr {
    uint32_t magic;
    uint16_t version, token_len;
} hello_hdr;

typedef struct frame_rank {
    int32_t rank, pid; /* pid: of the rank's latest attempt, 0 not known (a forwarder that predates it) */
    int64_t clock_offset_ns;
    uint64_t dropped;
} frame_rank;

/* A forwarding connection: one node's, whose ranks only it may bring
 * (cfg.node_ranks). */
typedef struct ingest_conn {
    netserve_conn base;
    int node; /* the node whose ranks its frames brought, plus 1; 0: none yet */
} ingest_conn;

typedef struct ring_slot {
    int rank;
    trace_ring *ring;
    uint64_t stored; /* master: the ring's position in ring_marks (or where it was added) */
    int fault_said;  /* its fault (trace_ring_fault) was said on stderr */
} ring_slot;

struct collector {
    collector_config cfg;
    char *forward_host, *listen_host;
    char token[PP_TOKEN_MAX + 1]; /* "" = none */
    pthread_t thread;
    pthread_mutex_t mu;     /* rings */
    pthread_mutex_t err_mu; /* failed, err */
    ring_slot *rings;
    frame_rank *frame_ranks; /* forwarder: each frame's per-rank part, ringcap entries */
    size_t nrings, ringcap;
    atomic_int stop;
    int fwd_fd, port;
    /* Master: the ingest listener and its forwarding connections (NULL:
     * not listening). Its deadlines run on a clock that counts at most
     * ~1 s of a round the master spent on its own work (a slow disk under
     * SQLite), so they never cut senders the master was not reading. */
    netserve *net;
    /* Lines about forwarding connections (a stranger, a refusal, a
     * deadline): at most LOG_BURST per 10 s, so a port scanner or a flood
     * of bad hellos cannot fill the launcher's log; those left out are
     * counted in the next line, and at the end. */
    pp_ratelimit log;
    trace_event *buf;       /* master: nbuf records staged for the next transaction; others: the next frame */
    size_t nbuf, flush_at;  /* master: staged, and how many are written at once (FLUSH_PER_RANK) */
    uint64_t staged_ns;     /* master: when the oldest staged record was read */
    /* Per rank of the job (master): highest step seen, drops reported. */
    int *max_step;
    uint64_t *dropped;
    char *offset_recorded; /* the rank's forwarded clock offset is in `ranks` */
    int64_t *offset;       /* master: the forwarded offset its staged records get, per rank */
    int *local;            /* under mu: the ranks with a ring here, each once, in the order they came */
    size_t nlocal;
    char *has_ring;        /* under mu: per rank of the job, whether it is in local */
    uint64_t *ring_dropped; /* per rank: the sum of its rings' drop counters, as sum_dropped last read them */
    int *pid;              /* under mu: the pid of the rank's latest attempt on this node (collector_set_pid) */
    int *pid_recorded;     /* the pid in `ranks` (master), or the last forwarded (other nodes) */
    int analyzed;          /* steps below this were analysed */
    /* The steps at or past `analyzed` that stored events have, as they
     * came (sorted, each once, by analyze_ready_steps): the live analyses
     * visit those only, so a record at step 1e9 costs one analysis, not a
     * walk over a billion empty steps (a user's program has no step bound). */
    int *todo;
    size_t ntodo, todocap;
    /* Ascending: the steps analysed live that got no event since (a late
     * one clears its fresh_ok), which collector_stop's final pass leaves
     * alone (analysing every step twice was a sixth of the launcher's CPU
     * for tracing, docs/design.md §6 "What tracing costs"). */
    int *fresh;
    unsigned char *fresh_ok;
    size_t nfresh, freshcap;
    analyzer *an;          /* master: the live analyses' statements, opened at the first step */
    atomic_int last_step_cut; /* collector_last_step_cut: the steps no rank moved past are not analysed at the end */
    size_t next_ring; /* where the next drain starts: no ring starves the others */
    atomic_uint_fast64_t count, rejected;
    atomic_uint_fast64_t insert_ns, analyze_ns; /* master: the thread's time in db_insert_events, in analyses */
    int failed;
    pp_err err;
};

/* The first failure stops the trace, never the training (a full disk
 * under the database must not kill a job that can finish). */
static void set_error(collector *c, const pp_err *e) {
    pthread_mutex_lock(&c->err_mu);
    if (!c->failed) {
        c->failed = 1;
        c->err = *e;
        fprintf(stderr, "pprun collector: %s; no more trace records are written, the training goes on\n", e->msg);
    }
    pthread_mutex_unlock(&c->err_mu);
}

static int has_failed(collector *c) {
    pthread_mutex_lock(&c->err_mu);
    int f = c->failed;
    pthread_mutex_unlock(&c->err_mu);
    return f;
}

/* ---- master side: into the database ---------------------------------- */

/* Step s (above every step marked before) was just analysed. Without
 * memory for the mark the final pass analyses it again, as it would any
 * step. */
static void mark_fresh(collector *c, int s) {
    if (c->nfresh == c->freshcap) {
        size_t n = c->freshcap ? 2 * c->freshcap : 64;
        int *f = realloc(c->fresh, n * sizeof *f);
        if (f) c->fresh = f;
        unsigned char *ok = f ? realloc(c->fresh_ok, n) : NULL;
        if (ok) c->fresh_ok = ok;
        if (!f || !ok) return;
        c->freshcap = n;
    }
    c->fresh[c->nfresh] = s;
    c->fresh_ok[c->nfresh++] = 1;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* c->todo sorted, each step once. */
static void sort_todo(collector *c) {
    if (c->ntodo < 2) return;
    qsort(c->todo, c->ntodo, sizeof *c->todo, cmp_int);
    size_t k = 1;
    for (size_t i = 1; i < c->ntodo; i++)
        if (c->todo[i] != c->todo[k - 1]) c->todo[k++] = c->todo[i];
    c->ntodo = k;
}

/* An event of step s was stored: s is analysed again at the end if it
 * was analysed live (a restart ran it twice), or waits for its turn. */
static void note_step(collector *c, int s) {
    if (s < c->analyzed) {
        int *f = c->nfresh ? bsearch(&s, c->fresh, c->nfresh, sizeof *c->fresh, cmp_int) : NULL;
        if (f) c->fresh_ok[f - c->fresh] = 0;
        return;
    }
    if (c->ntodo && c->todo[c->ntodo - 1] == s) return; /* a step's events come in runs */
    if (c->ntodo == c->todocap) sort_todo(c); /* runs of steps interleaved: each step once before growing */
    if (c->ntodo == c->todocap) {
        size_t n = c->todocap ? 2 * c->todocap : 64;
        int *t = realloc(c->todo, n * sizeof *t);
        if (!t) return; /* the final pass analyses it */
        c->todo = t, c->todocap = n;
    }
    c->todo[c->ntodo++] = s;
}

static void analyze_ready_steps(collector *c) {
    int lo = INT32_MAX;
    for (int r = 0; r < c->cfg.world_size; r++)
        if (c->max_step[r] < lo) lo = c->max_step[r];
    if (lo <= c->analyzed) return;
    /* Every rank moved past step s: its events are all in. Steps without
     * events have nothing to analyse. */
    sort_todo(c);
    size_t i = 0;
    for (; i < c->ntodo && c->todo[i] < lo && !has_failed(c); i++) {
        int step = c->todo[i];
        pp_err e;
        uint64_t t0 = pp_now_ns();
        if (!c->an && analyzer_open(c->cfg.db, &c->an, &e) != 0) {
            set_error(c, &e);
        } else if (analyzer_step(c->an, c->cfg.job_id, step, &e) != 0) {
            /* One step's analysis failing (rolled back) costs that step's
             * live results, not the job's trace: the records are stored
             * and go on being stored, and the final pass analyses the
             * step again (it is not fresh), failing the collector then if
             * it fails again. */
            fprintf(stderr, "pprun collector: %s; its records are kept, the step is analysed again at the job's end\n",
                    e.msg);
        } else {
            mark_fresh(c, step);
            if (c->cfg.step_analyzed) c->cfg.step_analyzed(c->cfg.step_analyzed_ctx, c->cfg.db, step);
        }
        atomic_fetch_add(&c->analyze_ns, pp_now_ns() - t0);
    }
    memmove(c->todo, c->todo + i, (c->ntodo - i) * sizeof *c->todo);
    c->ntodo -= i;
    c->analyzed = lo;
}

/* The steps analysed live that got no event since, ascending, for the
 * final pass (in place of c->fresh; c->fresh_ok is spent). */
static size_t fresh_steps(collector *c) {
    size_t k = 0;
    for (size_t i = 0; i < c->nfresh; i++)
        if (c->fresh_ok[i]) c->fresh[k++] = c->fresh[i];
    return k;
}

/* Is e a record to keep? Otherwise why not, into why (n bytes). */
typedef int (*record_check)(const collector *c, int ring_rank, const trace_event *e, char *why, size_t n);

/* Keeps the records of ev that pass ok, compacted at its front, and
 * returns their count; the others are refused and counted, the first of
 * the job said on stderr with its reason. */
static size_t keep_if(collector *c, trace_event *ev, size_t n, record_check ok, int ring_rank) {
    size_t k = 0;
    char why[256];
    for (size_t i = 0; i < n; i++) {
        if (ok(c, ring_rank, &ev[i], why, sizeof why)) {
            if (k != i) ev[k] = ev[i];
            k++;
        } else if (atomic_fetch_add(&c->rejected, 1) == 0) {
            fprintf(stderr, "pprun collector: refusing trace records %s; counting the rest\n", why);
        }
    }
    return k;
}

/* No rank of this job can have written a record of a rank outside the
 * world or a step outside the job: it would land in the database under a
 * rank or step nobody ran; nor one of a microbatch, stage or peer past
 * what readers take. Nor one whose times or bytes libpprun_trace would have
 * refused (trace_record_why): a program can write its ring directly, and
 * one such record failed its step's analysis, which stopped the job's
 * whole trace; nor one that its node's clock offset (c->offset, what the
 * database adds to its times) moves off the job clock's range. */
static int in_job(const collector *c, int ring_rank, const trace_event *e, char *why, size_t n) {
    (void)ring_rank;
    int in_world = e->rank >= 0 && e->rank < c->cfg.world_size;
    if (!in_world || e->step < 0 || (c->cfg.steps > 0 && e->step >= c->cfg.steps)) {
        snprintf(why, n, "of rank %d step %d (the job has ranks 0..%d, %d steps)", e->rank, e->step,
                 c->cfg.world_size - 1, c->cfg.steps);
        return 0;
    }
    /* a microbatch, stage or peer no reader takes (db/bounds.h): stored, it
     * failed the step's analysis and stopped the whole job's trace. Names'
     * chunks, schedules and plan actions lay these bytes out otherwise;
     * a kernel's peer is its CUDA stream. */
    int op_layout = e->phase != TRACE_KERNEL_NAME && e->phase != TRACE_SPAN_NAME && e->phase != TRACE_SCHEDULE &&
                    e->phase != TRACE_PLAN;
    if (op_layout && (!bounds_ok(&bounds_microbatch, e->microbatch) || !bounds_ok(&bounds_stage, e->stage) ||
                      (e->phase < TRACE_LOSS && (e->peer < -1 || e->peer >= c->cfg.world_size)))) {
        snprintf(why, n, "of rank %d step %d whose microbatch %d, stage %d or peer %d is out of range", e->rank,
                 e->step, e->microbatch, e->stage, e->peer);
        return 0;
    }
    char bad[200];
    if (!trace_record_why(e, c->offset[e->rank], bad, sizeof bad)) return 1;
    snprintf(why, n, "of rank %d step %d whose times or bytes are bad: %s", e->rank, e->step, bad);
    return 0;
}

/* A ring is its worker's alone (libpprun_trace and pprun's worker stamp
 * the rank the launcher gave it), so a record in it that claims another
 * rank is forged or garbage: stored under the rank it claims, it would let
 * one rank write another's trace. */
static int own_rank(const collector *c, int ring_rank, const trace_event *e, char *why, size_t n) {
    (void)c;
    if (e->rank == ring_rank) return 1;
    snprintf(why, n, "that claim rank %d in rank %d's trace ring (a ring holds its own rank's records only)", e->rank,
             ring_rank);
    return 0;
}

/* Gives the local rings back every slot read so far (the master reads
 * with trace_ring_peek): what was read is stored, or will never be. */
static void release_rings(collector *c) {
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->nrings; i++) {
        c->rings[i].stored = trace_ring_position(c->rings[i].ring);
        trace_ring_release(c->rings[i].ring);
    }
    pthread_mutex_unlock(&c->mu);
}

/* The local rings whose read position moved since it was stored, as marks
 * for ring_marks, into *out (the caller frees it); their count, or -1 when
 * out of memory. Only this thread reads the rings, so the positions hold
 * until release_rings. */
static long ring_marks_due(collector *c, db_ring_mark **out) {
    pthread_mutex_lock(&c->mu);
    db_ring_mark *m = c->nrings ? malloc(c->nrings * sizeof *m) : NULL;
    long n = c->nrings && !m ? -1 : 0;
    for (size_t i = 0; m && i < c->nrings; i++) {
        const ring_slot *r = &c->rings[i];
        uint64_t pos = trace_ring_position(r->ring);
        if (pos != r->stored) m[n++] = (db_ring_mark){trace_ring_id(r->ring), r->rank, pos};
    }
    pthread_mutex_unlock(&c->mu);
    *out = m;
    return n;
}

/* Writes the staged records and how far each local ring was read (one
 * transaction), then gives the rings their slots back, and analyses the
 * steps that completes. A launcher killed before the commit leaves the
 * records in the rings, one killed after it the marks that say they are
 * stored: `pprun salvage` stores each once (docs/design.md §6). */
static void flush(collector *c) {
    size_t n = c->nbuf;
    c->nbuf = 0;
    db_ring_mark *marks = NULL;
    pp_err e;
    long nmarks = has_failed(c) ? 0 : ring_marks_due(c, &marks);
    if (nmarks < 0) {
        pp_fail(&e, "collector: out of memory");
        set_error(c, &e);
    }
    if (has_failed(c) || (n == 0 && nmarks == 0)) {
        free(marks);
        release_rings(c);
        return;
    }
    uint64_t t0 = pp_now_ns();
    int rc = db_insert_events_marked(c->cfg.db, c->cfg.job_id, c->buf, n, marks, (size_t)nmarks, &e);
    atomic_fetch_add(&c->insert_ns, pp_now_ns() - t0);
    free(marks);
    release_rings(c);
    if (rc != 0) {
        set_error(c, &e);
        return;
    }
    atomic_fetch_add(&c->count, n);
    for (size_t i = 0; i < n; i++) {
        const trace_event *ev = &c->buf[i];
        if (ev->step > c->max_step[ev->rank]) c->max_step[ev->rank] = ev->step;
        note_step(c, ev->step);
    }
    analyze_ready_steps(c);
}

/* The n records just read into c->buf + c->nbuf join the staged ones
 * (those of this job). */
static void stage(collector *c, size_t n) {
    n = keep_if(c, c->buf + c->nbuf, n, in_job, -1);
    if (n && !c->nbuf) c->staged_ns = pp_now_ns();
    c->nbuf += n;
    if (c->nbuf == BATCH_MAX) flush(c);
}

/* A round's end: the staged records go in when there are enough of them
 * or the oldest has waited long enough. */
static void flush_if_due(collector *c) {
    if (c->nbuf >= c->flush_at || (c->nbuf && pp_now_ns() - c->staged_ns >= FLUSH_DELAY_NS)) flush(c);
}

/* Records rank's pid (its latest attempt) where users look for it. */
static void store_pid(collector *c, int rank, int pid, int64_t clock_offset_ns) {
    if (pid <= 0 || c->pid_recorded[rank] == pid || has_failed(c)) return;
    pp_err e;
    if (db_update_rank(c->cfg.db, c->cfg.job_id, rank, pid, clock_offset_ns, &e) != 0)
        set_error(c, &e);
    else
        c->pid_recorded[rank] = pid;
}

static void store_dropped(collector *c, int rank, uint64_t dropped) {
    if (rank < 0 || rank >= c->cfg.world_size || c->dropped[rank] == dropped || has_failed(c)) return;
    pp_err e;
    if (db_set_dropped(c->cfg.db, c->cfg.job_id, rank, dropped, &e) != 0)
        set_error(c, &e);
    else
        c->dropped[rank] = dropped;
}

/* ---- other nodes: over TCP to the master ------------------------------ */

/* Sends all n bytes on the forwarding socket. A master slow to read holds
 * the sender back (backpressure) for as long as the job runs; once
 * collector_stop was called it gets stop_grace_ns more, then errno is
 * ETIMEDOUT: a master that stopped reading (stopped, frozen, cut off) must
 * not keep this node's launcher from exiting. */
static int write_all(collector *c, const void *p, size_t n) {
    const char *s = p;
    uint64_t give_up = 0;
    while (n > 0) {
        ssize_t w = send(c->fwd_fd, s, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            s += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return -1;
        if (atomic_load(&c->stop)) {
            uint64_t now = pp_now_ns();
            if (!give_up) give_up = now + c->cfg.stop_grace_ns;
            if (now >= give_up) {
                errno = ETIMEDOUT;
                return -1;
            }
        }
        struct pollfd pw = {.fd = c->fwd_fd, .events = POLLOUT};
        poll(&pw, 1, 100); /* and look at c->stop again */
    }
    return 0;
}

/* One frame: the drop counters of every local rank, then the records. */
static void forward(collector *c, const trace_event *ev, size_t n, const frame_rank *ranks, size_t nranks) {
    if (has_failed(c)) return;
    frame_hdr h = {FRAME_MAGIC, FRAME_VERSION, (uint16_t)nranks, c->cfg.job_id, (uint32_t)n, 0};
    if (write_all(c, &h, sizeof h) != 0 || write_all(c, ranks, nranks * sizeof *ranks) != 0 ||
        write_all(c, ev, n * sizeof *ev) != 0) {
        pp_err e;
        if (errno == ETIMEDOUT)
            pp_fail(&e, "the trace collector at %s:%d took nothing for %.1fs after the job ended: this node's last "
                        "records are not in the database", c->forward_host, c->cfg.forward_port,
                    (double)c->cfg.stop_grace_ns / 1e9);
        else
            pp_fail(&e, "forwarding trace records to the master at %s:%d failed: %s", c->forward_host,
                    c->cfg.forward_port, strerror(errno));
        set_error(c, &e);
        return;
    }
    atomic_fetch_add(&c->count, n);
}

/* ---- draining the local rings ----------------------------------------- */

/* c->ring_dropped[r] = the sum of the drop counters of local rank r's
 * rings (a restarted rank has several), in one pass over the rings: once a
 * batch, with 1,024 rings on a node, a pass per rank was a million reads. */
static void sum_dropped(collector *c) {
    for (size_t i = 0; i < c->nlocal; i++) c->ring_dropped[c->local[i]] = 0;
    for (size_t i = 0; i < c->nrings; i++) c->ring_dropped[c->rings[i].rank] += trace_ring_dropped(c->rings[i].ring);
}

/* Says once that slot's ring was disabled (trace_ring_fault), naming its
 * rank; the first such fault is the job's to report (cfg.ring_fault). Its
 * lost records count as the rank's drops (sum_dropped). */
static void note_fault(collector *c, ring_slot *slot) {
    const char *why = trace_ring_fault(slot->ring);
    if (!why || slot->fault_said) return;
    slot->fault_said = 1;
    pp_err e;
    pp_fail(&e, "rank %d's trace ring is corrupt (%s); its records from there on are lost, counted as dropped",
            slot->rank, why);
    fprintf(stderr, "pprun collector: %s; the other ranks' records are kept\n", e.msg);
    if (c->cfg.ring_fault && !c->cfg.ring_fault->msg[0]) *c->cfg.ring_fault = e;
}

/* Up to max records of slot's ring into to, its own rank's only: the
 * master peeks (flush releases what it stored), a forwarder reads and
 * releases at once. */
static size_t drain_one(collector *c, ring_slot *slot, trace_event *to, size_t max) {
    size_t n = c->cfg.db ? trace_ring_peek(slot->ring, to, max) : trace_ring_read(slot->ring, to, max);
    note_fault(c, slot);
    return keep_if(c, to, n, own_rank, slot->rank);
}

/* Every local ring into c->buf, a batch at a time, each ring's own
 * rank's records only (drain_one). */
static void drain_rings(collector *c) {
    size_t n, room, got;
    do {
        pthread_mutex_lock(&c->mu);
        /* Each batch starts one ring further on, so a ring that alone fills
         * batches cannot keep the others waiting. */
        n = 0;
        room = BATCH_MAX - (c->cfg.db ? c->nbuf : 0);
        trace_event *to = c->buf + (c->cfg.db ? c->nbuf : 0);
        size_t first = c->nrings ? c->next_ring++ % c->nrings : 0;
        got = 0; /* read, refused ones too: a full batch means more may wait */
        for (size_t k = 0; k < c->nrings && got < room; k++) {
            ring_slot *slot = &c->rings[(first + k) % c->nrings];
            size_t before = trace_ring_position(slot->ring);
            n += drain_one(c, slot, to + n, room - got);
            got += (size_t)(trace_ring_position(slot->ring) - before);
        }
        if (c->cfg.db) {
            sum_dropped(c);
            for (size_t i = 0; i < c->nlocal; i++) {
                int r = c->local[i];
                store_dropped(c, r, c->ring_dropped[r]);
                store_pid(c, r, c->pid[r], 0); /* the master's clock is the job's */
            }
            pthread_mutex_unlock(&c->mu);
            if (has_failed(c)) { /* nothing more is written */
                c->nbuf = 0;
                release_rings(c);
            } else {
                stage(c, n);
            }
        } else {
            /* Every frame carries the clock offset and drop counter of each
             * local rank. */
            frame_rank *fr = c->frame_ranks;
            size_t nfr = 0;
            int changed = 0;
            sum_dropped(c);
            for (size_t i = 0; i < c->nlocal; i++) {
                int r = c->local[i];
                uint64_t d = c->ring_dropped[r];
                changed |= d != c->dropped[r];
                c->dropped[r] = d;
                changed |= c->pid[r] != c->pid_recorded[r]; /* forwarded once a frame carried it */
                c->pid_recorded[r] = c->pid[r];
                fr[nfr++] = (frame_rank){r, c->pid[r], c->cfg.clock_offset_ns, d};
            }
            if (n > 0 || changed) forward(c, c->buf, n, fr, nfr);
            pthread_mutex_unlock(&c->mu);
        }
    } while (got == room);
}

/* ---- master: ingest listener ------------------------------------------ */

/* A line about a forwarding connection, through c->log (see there). */
__attribute__((format(printf, 2, 3))) static void conn_note(collector *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    netserve_vlog(c->net, &c->log, LOG_BURST, fmt, ap);
    va_end(ap);
}

static size_t unread(const netserve_conn *k) { return k->in_len - k->in_off; }

/* Is h a frame of this job that the master can take? A forwarder sends
 * each of its ranks once per frame: never more than the job has. */
static int frame_ok(const collector *c, const frame_hdr *h) {
    return h->magic == FRAME_MAGIC && h->version == FRAME_VERSION && h->job_id == c->cfg.job_id &&
           h->nrecords <= BATCH_MAX && h->nranks <= c->cfg.world_size;
}

static size_t frame_size(const frame_hdr *h) {
    return sizeof *h + (size_t)h->nranks * sizeof(frame_rank) + (size_t)h->nrecords * sizeof(trace_event);
}

/* The length of what starts at p: the hello (before it was accepted),
 * else a frame. What is not one of ours is refused as soon as its first
 * bytes tell, and a master without a token takes a frame without a hello
 * (forwarders that predate it): ingest decides at once. */
static size_t ingest_frame_len(void *ctx, const netserve_conn *k, const uint8_t *p, size_t n) {
    const collector *c = ctx;
    uint32_t magic;
    if (n < sizeof magic) return 0;
    memcpy(&magic, p, sizeof magic);
    if (!k->authed) {
        if (magic != HELLO_MAGIC) return NETSERVE_HANDLE_NOW;
        hello_hdr h;
        if (n < sizeof h) return 0;
        memcpy(&h, p, sizeof h);
        if (h.version != HELLO_VERSION || h.token_len > PP_TOKEN_MAX) return NETSERVE_HANDLE_NOW;
        return sizeof h + h.token_len;
    }
    if (magic != FRAME_MAGIC) return NETSERVE_HANDLE_NOW;
    frame_hdr h;
    if (n < sizeof h) return 0;
    memcpy(&h, p, sizeof h);
    return frame_ok(c, &h) ? frame_size(&h) : NETSERVE_HANDLE_NOW;
}

/* A forwarder that cannot be served is told so (HELLO_FULL) before its
 * hello is read; the hello already here is read away first, so that the
 * close does not reset the connection ahead of the answer. */
static void refuse_forwarder(void *ctx, int fd, const char *peer, netserve_refusal why) {
    collector *c = ctx;
    char junk[512], text[96];
    if (why == NETSERVE_FULL)
        snprintf(text, sizeof text, "already serving %zu forwarding connections, the most it takes", c->net->nconns);
    else
        snprintf(text, sizeof text, "%s", netserve_refusal_why(why));
    unsigned char full = HELLO_FULL;
    (void)!send(fd, &full, 1, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
    }
    conn_note(c, "refused a forwarding connection from %s: %s", peer, text);
}

/* A connection's first bytes: the hello with the token, answered. Returns
 * 1 once accepted, 0 while incomplete, -1 when refused or dropped (the
 * connection then closes, nothing after it read). */
static int check_hello(collector *c, netserve_conn *k) {
    const unsigned char *p = k->in + k->in_off;
    uint32_t magic;
    if (unread(k) < sizeof magic) return 0;
    memcpy(&magic, p, sizeof magic);
    if (magic == FRAME_MAGIC && !c->token[0]) return 1; /* a forwarder from before the hello */
    if (magic != HELLO_MAGIC) {
        if (magic == FRAME_MAGIC)
            conn_note(c, "refused a forwarding connection from %s: no rendezvous token", k->peer);
        else
            conn_note(c, "dropping a connection from %s that is not a pprun forwarder", k->peer);
        k->dead = 1;
        return -1;
    }
    hello_hdr h;
    if (unread(k) < sizeof h) return 0;
    memcpy(&h, p, sizeof h);
    if (h.version != HELLO_VERSION || h.token_len > PP_TOKEN_MAX) {
        conn_note(c, "dropping a forwarding connection from %s: bad hello (version %u, token of %u bytes)", k->peer,
                  h.version, h.token_len);
        k->dead = 1;
        return -1;
    }
    if (unread(k) < sizeof h + h.token_len) return 0;
    unsigned char ok = !c->token[0] || pp_token_equal(c->token, p + sizeof h, h.token_len) ? HELLO_ACCEPTED
                                                                                           : HELLO_REFUSED;
    netserve_send(k, &ok, 1, NULL, 0);
    if (ok != HELLO_ACCEPTED) {
        conn_note(c, "refused a forwarding connection from %s: %s rendezvous token", k->peer,
                  h.token_len ? "wrong" : "no");
        netserve_hang_up(k); /* the answer goes, then the close */
        return -1;
    }
    netserve_consume(c->net, k, sizeof h + h.token_len);
    return 1;
}

/* The ranks of a frame (its per-rank part, at p, and its records) are
 * the sender's to bring: every one in the job with a clock offset in its
 * bound, none the master's own (cfg.node_ranks: node 0's; or a rank with
 * a ring here), and, with cfg.node_ranks, all of one other node: the node
 * this connection brought before, which no other connection brings (a
 * connection is bound to its node by its first frame that names a rank).
 * Checked whole before anything of the frame is recorded: 1, or 0 with a
 * line naming the peer and the rank (the caller drops the connection); a
 * frame that claims another's rank has its records counted as refused
 * (collector_rejected). A record of a rank outside the job is left to
 * in_job, which refuses it alone. */
static int frame_claims_ok(collector *c, ingest_conn *k, const frame_hdr *h, const unsigned char *p) {
    const char *peer = k->base.peer;
    const int per = c->cfg.node_ranks;
    int node = k->node - 1; /* -1: none yet */
    int bad = 0;            /* refused, why says why */
    int claim = 0;          /* refused for a rank that is not the sender's: its records are counted */
    char why[400];
    const unsigned char *recs = p + (size_t)h->nranks * sizeof(frame_rank);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; !bad && i < (size_t)h->nranks + h->nrecords; i++) {
        int r;
        if (i < h->nranks) {
            frame_rank fr;
            memcpy(&fr, p + i * sizeof fr, sizeof fr);
            r = fr.rank;
            if (r < 0 || r >= c->cfg.world_size) {
                snprintf(why, sizeof why, "frame for rank %d of %d", r, c->cfg.world_size);
                bad = 1;
                break;
            }
            /* An offset past its bound would shift the node's records off
             * the job clock (or overflow adding it): not one of ours. */
            char off[160];
            if (trace_offset_why(fr.clock_offset_ns, off, sizeof off)) {
                snprintf(why, sizeof why, "rank %d's %s", r, off);
                bad = 1;
                break;
            }
        } else {
            trace_event e;
            memcpy(&e, recs + (i - h->nranks) * sizeof e, sizeof e);
            r = e.rank;
            if (r < 0 || r >= c->cfg.world_size) continue; /* refused alone, and counted (in_job) */
        }
        if ((per > 0 && r < per) || c->has_ring[r]) {
            snprintf(why, sizeof why, "its frame claims rank %d, one of the master's own ranks (a node sends its own "
                     "ranks' records only); nothing of the frame is recorded", r);
            bad = 1;
        } else if (per > 0 && node >= 0 && r / per != node) {
            snprintf(why, sizeof why, "its frame claims rank %d of node %d, but it brings node %d's ranks (%d..%d; a "
                     "node sends its own ranks' records only); nothing of the frame is recorded", r, r / per, node,
                     node * per, node * per + per - 1);
            bad = 1;
        } else if (per > 0 && node < 0) {
            node = r / per;
            for (size_t j = 0; j < c->net->nconns; j++) {
                const ingest_conn *o = (const ingest_conn *)c->net->conns[j];
                if (o != k && o->node == node + 1 && !o->base.dead) {
                    snprintf(why, sizeof why, "its frame claims rank %d of node %d, whose ranks come from %s (a node "
                             "sends its own ranks' records only); nothing of the frame is recorded", r, node,
                             o->base.peer);
                    bad = 1;
                    break;
                }
            }
        }
        claim = bad;
    }
    pthread_mutex_unlock(&c->mu);
    if (!bad) {
        if (node >= 0) k->node = node + 1;
        return 1;
    }
    if (claim) atomic_fetch_add(&c->rejected, h->nrecords);
    conn_note(c, "dropping a forwarding connection from %s: %s", peer, why);
    return 0;
}

/* Handles every whole frame in k's input; a bad one drops the connection
 * (the peer is not a pprun of ours). */
static void ingest_frames(collector *c, netserve_conn *k) {
    if (k->dead || k->closing) return;
    if (!k->authed) {
        if (check_hello(c, k) <= 0) return;
        k->authed = 1;
    }
    uint32_t magic;
    while (unread(k) >= sizeof magic) {
        const unsigned char *p = k->in + k->in_off;
        /* A stranger is told apart by its first bytes, before a whole header. */
        memcpy(&magic, p, sizeof magic);
        if (magic != FRAME_MAGIC) {
            conn_note(c, "dropping a connection from %s that is not a pprun forwarder", k->peer);
            k->dead = 1;
            return;
        }
        frame_hdr h;
        if (unread(k) < sizeof h) break;
        memcpy(&h, p, sizeof h);
        if (!frame_ok(c, &h)) {
            conn_note(c, "dropping a forwarding connection from %s: bad frame (magic %08x, version %u, job %lld, "
                      "%u ranks, %u records)", k->peer, h.magic, h.version, (long long)h.job_id, h.nranks, h.nrecords);
            k->dead = 1;
            return;
        }
        size_t need = frame_size(&h);
        if (unread(k) < need) break;
        p += sizeof h;
        if (!frame_claims_ok(c, (ingest_conn *)k, &h, p)) {
            k->dead = 1;
            return;
        }
        for (unsigned i = 0; i < h.nranks; i++, p += sizeof(frame_rank)) {
            frame_rank fr;
            memcpy(&fr, p, sizeof fr);
            pp_err e;
            /* The first frame of a rank also records its offset where users
             * look for it (ranks.clock_offset_ns). */
            /* Once a write failed nothing more is written (what room the
             * rolled-back transaction left goes to the job's end). */
            int rc = 0;
            /* Staged records keep the offset they came with. */
            if (c->offset_recorded[fr.rank] && fr.clock_offset_ns != c->offset[fr.rank]) flush(c);
            if (!c->offset_recorded[fr.rank] && !has_failed(c))
                rc = db_update_rank(c->cfg.db, c->cfg.job_id, fr.rank, 0, fr.clock_offset_ns, &e);
            else if (c->offset_recorded[fr.rank])
                rc = db_set_clock_offset(c->cfg.db, c->cfg.job_id, fr.rank, fr.clock_offset_ns, &e);
            c->offset[fr.rank] = fr.clock_offset_ns;
            if (rc != 0) {
                set_error(c, &e);
                k->dead = 1;
                return;
            }
            c->offset_recorded[fr.rank] = 1;
            store_dropped(c, fr.rank, fr.dropped);
            store_pid(c, fr.rank, fr.pid, fr.clock_offset_ns);
        }
        /* Records are copied out (the buffer has no alignment promise) and
         * staged with the others; a frame holds at most BATCH_MAX, which
         * c->buf holds. */
        if (c->nbuf + h.nrecords > BATCH_MAX) flush(c);
        if (has_failed(c)) {
            c->nbuf = 0;
        } else {
            memcpy(c->buf + c->nbuf, p, (size_t)h.nrecords * sizeof(trace_event));
            stage(c, h.nrecords);
        }
        netserve_consume(c->net, k, need);
    }
    /* Whole frames were handled as they came: what is left after the
     * peer's EOF is one incomplete hello or frame. */
    if (k->eof && unread(k) > 0) {
        conn_note(c, "%s closed its connection mid-%s (%zu bytes lost)", k->peer, k->authed ? "frame" : "hello",
                  unread(k));
        k->dead = 1;
    }
}

/* Closes the connections past their deadline: no hello (an idle stranger
 * holding a slot) or a frame begun and not finished (a sender that stopped
 * mid-frame). Frames already whole were stored when they arrived. */
static void expire_conns(collector *c) {
    for (size_t i = 0; i < c->net->nconns; i++) {
        netserve_conn *k = c->net->conns[i];
        uint64_t age;
        switch (netserve_late(c->net, k, &age)) {
        case NETSERVE_AUTH_LATE:
            conn_note(c, "closed a connection from %s: no hello within %.3g s (%zu bytes of one)", k->peer,
                      (double)c->net->cfg.auth_ns / 1e9, unread(k));
            k->dead = 1;
            break;
        case NETSERVE_FRAME_LATE:
            conn_note(c, "closed a connection from %s: a frame begun %.3g s ago is still incomplete (%zu bytes "
                      "dropped; the frames before it are kept)", k->peer, (double)age / 1e9, unread(k));
            k->dead = 1;
            break;
        case NETSERVE_ON_TIME: break;
        }
    }
}

/* One round of the ingest listener, or a sleep for a collector without
 * one. */
static void poll_net(collector *c, int timeout_ms) {
    if (!c->net) {
        poll(NULL, 0, timeout_ms);
        return;
    }
    netserve_poll(c->net, -1, timeout_ms);
    for (size_t i = 0; i < c->net->nconns; i++) ingest_frames(c, c->net->conns[i]);
    expire_conns(c);
    netserve_sweep(c->net);
}

/* At the end: is a connection left that may still bring records? One
 * that never sent a byte (a port scanner, an idle stranger) does not hold
 * the launcher's exit for the grace. */
static int forwarders_left(const collector *c) {
    for (size_t i = 0; c->net && i < c->net->nconns; i++)
        if (c->net->conns[i]->authed || unread(c->net->conns[i]) > 0) return 1;
    return 0;
}

static void *collector_main(void *arg) {
    collector *c = arg;
    int ms = (int)(c->cfg.interval_ns / 1000000u);
    if (ms < 1) ms = 1;
    while (!atomic_load(&c->stop)) {
        poll_net(c, ms);
        drain_rings(c);
        if (c->cfg.db) flush_if_due(c);
    }
    drain_rings(c);
    if (c->cfg.db) {
        /* Forwarders stop first: their connections are established, maybe
         * still in the listen backlog, and closed once their data is sent. */
        if (c->net) netserve_accept(c->net);
        uint64_t until = pp_now_ns() + c->cfg.stop_grace_ns;
        while (forwarders_left(c) && pp_now_ns() < until) {
            poll_net(c, 10);
            flush_if_due(c);
        }
        netserve_stop(c->net);
        c->net = NULL;
        flush(c);
        analyzer_close(c->an); /* its statements go before collector_stop gives the db back */
        c->an = NULL;
        pp_err e;
        /* With every record in: the steps not analysed yet, and those
         * stored into since their analysis (a restart ran them twice);
         * a cut job's last steps keep their events only, but for those
         * every rank finished (a rank died between steps). */
        int below = INT32_MAX;
        if (atomic_load(&c->last_step_cut))
            for (below = c->analyzed; db_step_finished(c->cfg.db, c->cfg.job_id, below, c->cfg.world_size) == 1;)
                below++;
        if (!has_failed(c) &&
            db_analyze_steps_except(c->cfg.db, c->cfg.job_id, below, c->fresh, fresh_steps(c), &e) != 0)
            set_error(c, &e);
    }
    if (c->log.held)
        fprintf(stderr, "pprun collector: %lu more lines about forwarding connections were left out\n", c->log.held);
    uint64_t rejected = atomic_load(&c->rejected);
    if (rejected) fprintf(stderr, "pprun collector: %llu trace records refused in all\n", (unsigned long long)rejected);
    return NULL;
}

/* ---- setup ------------------------------------------------------------ */

/* Forwarder: the hello with the token, and the master's answer. */
static int say_hello(collector *c, pp_err *err) {
    size_t n = strlen(c->token);
    unsigned char msg[sizeof(hello_hdr) + PP_TOKEN_MAX];
    hello_hdr h = {HELLO_MAGIC, HELLO_VERSION, (uint16_t)n};
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, c->token, n);
    int wrc = write_all(c, msg, sizeof h + n);
    memset(msg, 0, sizeof msg);
    if (wrc != 0)
        return pp_fail(err, "collector: sending the hello to the master at %s:%d failed: %s", c->forward_host,
                       c->cfg.forward_port, strerror(errno));
    unsigned char ok = 0;
    ssize_t r = net_read_all(c->fwd_fd, &ok, 1, pp_deadline_ns(HELLO_WAIT_S * 1000));
    int e = errno;
    if (r == 1 && ok == HELLO_ACCEPTED) return 0;
    if (r == 1 && ok == HELLO_FULL)
        return pp_fail(err, "collector: the trace collector at %s:%d cannot take another forwarding node: it "
                            "serves as many as it takes at once (%d unless set lower) or is out of file "
                            "descriptors (its stderr says which)",
                       c->forward_host, c->cfg.forward_port, MAX_CONNS_DEFAULT);
    if (r == 0)
        return pp_fail(err, "collector: the trace collector at %s:%d closed the connection without answering "
                            "(it stopped, or another program has that port)",
                       c->forward_host, c->cfg.forward_port);
    if (r < 0)
        return pp_fail(err, "collector: no answer from the trace collector at %s:%d: %s", c->forward_host,
                       c->cfg.forward_port,
                       e == ETIMEDOUT ? "timed out after 10s" : strerror(e));
    return pp_fail(err, "the trace collector at %s:%d refused the rendezvous token (%s): every node needs the same "
                        "--rdzv-token / PPRUN_RDZV_TOKEN",
                   c->forward_host, c->cfg.forward_port, n ? "a different one" : "none was given");
}

/* Everything but the forwarding socket (closed politely by collector_stop). */
static void collector_free(collector *c) {
    netserve_stop(c->net);
    for (size_t i = 0; i < c->nrings; i++) trace_ring_close(c->rings[i].ring);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->err_mu);
    free(c->rings);
    free(c->frame_ranks);
    free(c->forward_host);
    free(c->listen_host);
    free(c->buf);
    free(c->max_step);
    free(c->offset_recorded);
    free(c->offset);
    free(c->dropped);
    free(c->pid);
    free(c->pid_recorded);
    free(c->local);
    free(c->has_ring);
    free(c->ring_dropped);
    free(c->fresh);
    free(c->fresh_ok);
    free(c->todo);
    free(c);
}

int collector_start(const collector_config *cfg, collector **out, pp_err *err) {
    if (!cfg->db == !cfg->forward_host)
        return pp_fail(err, "collector: exactly one of a database (master) or a forward address (other nodes) is needed");
    if (cfg->world_size < 1) return pp_fail(err, "collector: world size %d must be at least 1", cfg->world_size);
    if (cfg->steps < 0) return pp_fail(err, "collector: steps %d must be 0 (no bound) or more", cfg->steps);
    if (cfg->listen_host && !cfg->db) return pp_fail(err, "collector: only the master (with the database) listens");
    collector *c = calloc(1, sizeof *c);
    if (!c) return pp_fail(err, "collector: out of memory");
    c->cfg = *cfg;
    c->cfg.token = NULL; /* copied into c->token */
    if (cfg->token && *cfg->token) {
        if (pp_token_check(cfg->token, "collector", err) != 0) {
            free(c);
            return -1;
        }
        snprintf(c->token, sizeof c->token, "%s", cfg->token);
    }
    if (!c->cfg.interval_ns) c->cfg.interval_ns = 5000000;
    if (!c->cfg.stop_grace_ns) c->cfg.stop_grace_ns = 5000000000ull;
    c->fwd_fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->err_mu, NULL);
    c->buf = malloc(BATCH_MAX * sizeof *c->buf);
    c->max_step = malloc((size_t)cfg->world_size * sizeof *c->max_step);
    c->offset_recorded = calloc((size_t)cfg->world_size, 1);
    c->offset = calloc((size_t)cfg->world_size, sizeof *c->offset);
    c->dropped = calloc((size_t)cfg->world_size, sizeof *c->dropped);
    c->pid = calloc((size_t)cfg->world_size, sizeof *c->pid);
    c->pid_recorded = calloc((size_t)cfg->world_size, sizeof *c->pid_recorded);
    c->local = calloc((size_t)cfg->world_size, sizeof *c->local);
    c->has_ring = calloc((size_t)cfg->world_size, 1);
    c->ring_dropped = calloc((size_t)cfg->world_size, sizeof *c->ring_dropped);
    if (!c->buf || !c->max_step || !c->dropped || !c->offset_recorded || !c->pid || !c->pid_recorded || !c->local ||
        !c->has_ring || !c->ring_dropped || !c->offset) {
        pp_fail(err, "collector: out of memory");
        goto fail;
    }
    for (int r = 0; r < cfg->world_size; r++) c->max_step[r] = -1;
    c->flush_at = (size_t)cfg->world_size * FLUSH_PER_RANK;
    if (c->flush_at > BATCH_MAX) c->flush_at = BATCH_MAX;
    if (cfg->forward_host) {
        c->forward_host = strdup(cfg->forward_host);
        if ((c->fwd_fd = net_connect(cfg->forward_host, cfg->forward_port, HELLO_WAIT_S * 1000, 0, err)) < 0) {
            pp_wrap(err, "collector: forwarding to the master");
            goto fail;
        }
        if (say_hello(c, err) != 0) goto fail;
    }
    if (cfg->listen_host) {
        c->listen_host = strdup(cfg->listen_host);
        netserve_config nc = {
            .name = "pprun collector",
            .conn_size = sizeof(ingest_conn),
            .max_conns = cfg->max_forwarders > 0 ? (size_t)cfg->max_forwarders : MAX_CONNS_DEFAULT,
            .max_buffered = cfg->max_buffered ? cfg->max_buffered : MAX_BUFFERED_DEFAULT,
            /* A forwarder's frames are the job's trace: one that does not
             * fit waits (its sender blocks) rather than being lost. */
            .overflow = NETSERVE_WAIT,
            .auth_ns = cfg->hello_timeout_ns ? cfg->hello_timeout_ns : HELLO_DEADLINE_NS,
            .frame_ns = cfg->frame_timeout_ns ? cfg->frame_timeout_ns : FRAME_DEADLINE_NS,
            .accept_pause_ns = ACCEPT_PAUSE_NS,
            .answer_when_out_of_fds = 1,
            .frame_len = ingest_frame_len,
            .refuse = refuse_forwarder,
            .ctx = c,
        };
        /* The master address may name this machine by an address it
         * cannot bind (NAT): listen everywhere then, like the store, and
         * only with a token (without one the address was loopback). */
        if (netserve_start(cfg->listen_host, cfg->listen_port, c->token[0] ? NET_ANY_IF_NOT_LOCAL : 0, &nc, &c->net,
                           err) != 0) {
            pp_wrap(err, "collector");
            goto fail;
        }
        c->port = c->net->port;
    }
    c->cfg.forward_host = c->forward_host;
    c->cfg.listen_host = c->listen_host;
    int rc = pthread_create(&c->thread, NULL, collector_main, c);
    if (rc != 0) {
        pp_fail(err, "collector: cannot start its thread: %s", strerror(rc));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    if (c->fwd_fd >= 0) close(c->fwd_fd);
    collector_free(c);
    return -1;
}

int collector_add_ring(collector *c, int rank, trace_ring *ring, pp_err *err) {
    if (rank < 0 || rank >= c->cfg.world_size)
        return pp_fail(err, "collector: rank %d out of range (world size %d)", rank, c->cfg.world_size);
    pthread_mutex_lock(&c->mu);
    if (c->nrings >= MAX_FRAME_RANKS) {
        pthread_mutex_unlock(&c->mu);
        return pp_fail(err, "collector: more than %d ranks on one node", MAX_FRAME_RANKS);
    }
    if (c->nrings == c->ringcap) {
        size_t cap = c->ringcap ? 2 * c->ringcap : 16;
        ring_slot *r = realloc(c->rings, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&c->mu);
            return pp_fail(err, "collector: out of memory");
        }
        c->rings = r;
        frame_rank *f = realloc(c->frame_ranks, cap * sizeof *f);
        if (!f) {
            pthread_mutex_unlock(&c->mu);
            return pp_fail(err, "collector: out of memory");
        }
        c->frame_ranks = f;
        c->ringcap = cap;
    }
    c->rings[c->nrings++] = (ring_slot){rank, ring, trace_ring_position(ring), 0};
    if (!c->has_ring[rank]) {
        c->has_ring[rank] = 1;
        c->local[c->nlocal++] = rank;
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int collector_listen_port(const collector *c) { return c->port; }
uint64_t collector_count(const collector *c) { return atomic_load(&((collector *)c)->count); }
uint64_t collector_rejected(const collector *c) { return atomic_load(&((collector *)c)->rejected); }

void collector_times(const collector *c, uint64_t *insert_ns, uint64_t *analyze_ns) {
    *insert_ns = atomic_load(&((collector *)c)->insert_ns);
    *analyze_ns = atomic_load(&((collector *)c)->analyze_ns);
}

int collector_error(collector *c, pp_err *err) {
    pthread_mutex_lock(&c->err_mu);
    int f = c->failed;
    if (f && err) *err = c->err;
    pthread_mutex_unlock(&c->err_mu);
    return f ? -1 : 0;
}

void collector_set_pid(collector *c, int rank, int pid) {
    if (rank < 0 || rank >= c->cfg.world_size) return;
    pthread_mutex_lock(&c->mu);
    c->pid[rank] = pid;
    pthread_mutex_unlock(&c->mu);
}

void collector_last_step_cut(collector *c) { atomic_store(&c->last_step_cut, 1); }

int collector_stop(collector *c, pp_err *err) {
    atomic_store(&c->stop, 1);
    pthread_join(c->thread, NULL);
    int rc = collector_error(c, err);
    if (c->fwd_fd >= 0) {
        shutdown(c->fwd_fd, SHUT_WR);
        close(c->fwd_fd);
    }
    collector_free(c);
    return rc;
}
