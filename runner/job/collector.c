/* collector.c: the thread that empties the trace rings into the database
 * (master) or over TCP to the master (other nodes), and the master's ingest
 * side of that TCP forwarding. See collector.h for the frame format. */
#include "runner/job/collector.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "db/analyze.h"
#include "base/token.h"

#define FRAME_MAGIC 0x57465050u /* "PPFW" */
#define FRAME_VERSION 1
#define HELLO_MAGIC 0x49485050u /* "PPHI" */
#define HELLO_VERSION 1
#define HELLO_WAIT_S 10         /* a forwarder waits this long for the master's answer */
#define HELLO_ACCEPTED 1        /* the master's answers to a hello */
#define HELLO_REFUSED 0
#define HELLO_FULL 2            /* no room for another forwarding connection */
#define BATCH_MAX 65536         /* records per transaction / frame */
#define MAX_FRAME_RANKS 65535
#define MAX_CONNS_DEFAULT 4096  /* forwarding connections the master serves at once */
#define HELLO_DEADLINE_NS 10000000000ull /* accept to complete hello (or first frame magic) */
#define FRAME_DEADLINE_NS 60000000000ull /* first byte of a frame to its last */
#define CONN_BUF_MIN (128u << 10)        /* a connection's buffer starts here, freed when empty */
#define READS_PER_ROUND 16      /* recv calls per connection per round: one sender cannot starve the rest */
#define LOG_WINDOW_NS 10000000000ull     /* per-connection lines: at most LOG_BURST per window */
#define LOG_BURST 10

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

typedef struct ring_slot {
    int rank;
    trace_ring *ring;
} ring_slot;

typedef struct conn {
    int fd;
    int authed;     /* said hello with the token (or the master has none) */
    uint64_t since; /* ingest clock: accepted (before the hello), else the partial frame's first byte */
    unsigned char *buf;
    size_t len, cap;
} conn;

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
    int fwd_fd, listen_fd, port;
    conn *conns;          /* master: forwarding connections, grown up to max_conns */
    struct pollfd *pfds;  /* conncap + 1 entries */
    size_t nconns, conncap, max_conns;
    int spare_fd;         /* /dev/null, given up to answer a forwarder when out of fds */
    /* The ingest clock counts the time the master spends listening: a round
     * that took long (a slow disk under SQLite) counts at most ~1 s, so the
     * deadlines below never cut senders the master was not reading. */
    uint64_t net_clock, net_last, hello_ns, frame_ns;
    uint64_t accept_after; /* net_clock: accept failed for want of resources, the listener rests till then */
    pp_ratelimit log;      /* conn_note's lines */
    trace_event *buf;
    /* Per rank of the job (master): highest step seen, drops reported. */
    int *max_step;
    uint64_t *dropped;
    char *offset_recorded; /* the rank's forwarded clock offset is in `ranks` */
    int *pid;              /* under mu: the pid of the rank's latest attempt on this node (collector_set_pid) */
    int *pid_recorded;     /* the pid in `ranks` (master), or the last forwarded (other nodes) */
    int analyzed;          /* steps below this were analysed */
    atomic_int last_step_cut; /* collector_last_step_cut: the steps no rank moved past are not analysed at the end */
    size_t next_ring; /* where the next drain starts: no ring starves the others */
    atomic_uint_fast64_t count, rejected;
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

static void analyze_ready_steps(collector *c) {
    int lo = INT32_MAX;
    for (int r = 0; r < c->cfg.world_size; r++)
        if (c->max_step[r] < lo) lo = c->max_step[r];
    /* Every rank moved past step s: its events are all in. */
    for (; c->analyzed < lo && !has_failed(c); c->analyzed++) {
        pp_err e;
        if (db_analyze_step(c->cfg.db, c->cfg.job_id, c->analyzed, &e) != 0) set_error(c, &e);
        else if (c->cfg.step_analyzed) c->cfg.step_analyzed(c->cfg.step_analyzed_ctx, c->cfg.db, c->analyzed);
    }
}

/* Drops the records no rank of this job can have written (a rank outside
 * the world, a step outside the job): they would land in the database and,
 * with a huge step, make analyze_ready_steps loop for ages. Returns the
 * count kept, compacted at the front of ev. */
static size_t keep_valid(collector *c, trace_event *ev, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const trace_event *e = &ev[i];
        if (e->rank >= 0 && e->rank < c->cfg.world_size && e->step >= 0 &&
            (c->cfg.steps <= 0 || e->step < c->cfg.steps)) {
            if (k != i) ev[k] = *e;
            k++;
            continue;
        }
        if (atomic_fetch_add(&c->rejected, 1) == 0)
            fprintf(stderr,
                    "pprun collector: refusing trace records of rank %d step %d (the job has ranks 0..%d, %d steps); "
                    "counting the rest\n",
                    e->rank, e->step, c->cfg.world_size - 1, c->cfg.steps);
    }
    return k;
}

static void store_events(collector *c, trace_event *ev, size_t n) {
    if (n == 0 || has_failed(c)) return;
    n = keep_valid(c, ev, n);
    if (n == 0) return;
    pp_err e;
    if (db_insert_events(c->cfg.db, c->cfg.job_id, ev, n, &e) != 0) {
        set_error(c, &e);
        return;
    }
    atomic_fetch_add(&c->count, n);
    for (size_t i = 0; i < n; i++)
        if (ev[i].step > c->max_step[ev[i].rank]) c->max_step[ev[i].rank] = ev[i].step;
    analyze_ready_steps(c);
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

/* Sum of the drop counters of rank's rings (a restarted rank has several). */
static uint64_t rank_dropped(collector *c, int rank) {
    uint64_t d = 0;
    for (size_t i = 0; i < c->nrings; i++)
        if (c->rings[i].rank == rank) d += trace_ring_dropped(c->rings[i].ring);
    return d;
}

static void drain_rings(collector *c) {
    pthread_mutex_lock(&c->mu);
    size_t n;
    do {
        /* Each batch starts one ring further on, so a ring that alone fills
         * batches cannot keep the others waiting. */
        n = 0;
        size_t first = c->nrings ? c->next_ring++ % c->nrings : 0;
        for (size_t k = 0; k < c->nrings && n < BATCH_MAX; k++)
            n += trace_ring_read(c->rings[(first + k) % c->nrings].ring, c->buf + n, BATCH_MAX - n);
        if (c->cfg.db) {
            store_events(c, c->buf, n);
            for (size_t i = 0; i < c->nrings; i++) {
                int r = c->rings[i].rank;
                store_dropped(c, r, rank_dropped(c, r));
                store_pid(c, r, c->pid[r], 0); /* the master's clock is the job's */
            }
        } else {
            /* Every frame carries the clock offset and drop counter of each
             * local rank. */
            frame_rank *fr = c->frame_ranks;
            size_t nfr = 0;
            int changed = 0;
            for (size_t i = 0; i < c->nrings; i++) {
                int r = c->rings[i].rank, dup = 0;
                for (size_t k = 0; k < nfr; k++) dup |= fr[k].rank == r;
                if (dup) continue;
                uint64_t d = rank_dropped(c, r);
                changed |= d != c->dropped[r];
                c->dropped[r] = d;
                changed |= c->pid[r] != c->pid_recorded[r]; /* forwarded once a frame carried it */
                c->pid_recorded[r] = c->pid[r];
                fr[nfr++] = (frame_rank){r, c->pid[r], c->cfg.clock_offset_ns, d};
            }
            if (n > 0 || changed) forward(c, c->buf, n, fr, nfr);
        }
    } while (n == BATCH_MAX);
    pthread_mutex_unlock(&c->mu);
}

/* ---- master: ingest listener ------------------------------------------ */

/* One line on stderr about one connection (a stranger, a refusal, a
 * deadline), at most LOG_BURST per LOG_WINDOW_NS: a port scanner or a flood
 * of bad hellos cannot fill the launcher's log. The lines left out are
 * counted in the next window's first line. */
__attribute__((format(printf, 2, 3))) static void conn_note(collector *c, const char *fmt, ...) {
    unsigned long held;
    if (!pp_ratelimit_allow(&c->log, LOG_BURST, LOG_WINDOW_NS, &held)) return;
    if (held) fprintf(stderr, "pprun collector: %lu more lines about forwarding connections were left out\n", held);
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "pprun collector: %s\n", line);
}

static void close_conn(collector *c, size_t i) {
    close(c->conns[i].fd);
    free(c->conns[i].buf);
    c->conns[i] = c->conns[--c->nconns];
}

/* Room for one more connection: the table doubles up to max_conns. */
static int conn_room(collector *c) {
    if (c->nconns < c->conncap) return 1;
    if (c->conncap >= c->max_conns) return 0;
    size_t cap = c->conncap ? 2 * c->conncap : 16;
    if (cap > c->max_conns) cap = c->max_conns;
    conn *k = realloc(c->conns, cap * sizeof *k);
    if (!k) return 0;
    c->conns = k;
    struct pollfd *p = realloc(c->pfds, (cap + 1) * sizeof *p);
    if (!p) return 0;
    c->pfds = p;
    c->conncap = cap;
    return 1;
}

/* A forwarder that cannot be served is told so (HELLO_FULL) before its
 * hello is read; the hello already here is read away first, so that the
 * close does not reset the connection ahead of the answer. */
static void refuse_full(collector *c, int fd, const char *why) {
    char peer[80], junk[512];
    pp_peer_name(fd, peer, sizeof peer);
    unsigned char full = HELLO_FULL;
    (void)!send(fd, &full, 1, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
    }
    close(fd);
    conn_note(c, "refused a forwarding connection from %s: %s", peer, why);
}

static void accept_conns(collector *c) {
    for (;;) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR) continue;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && c->spare_fd >= 0) {
            /* Out of descriptors: the pending connection would keep the
             * listener readable (poll would spin) and its forwarder waiting
             * for an answer. Give up the spare to answer and close it. */
            int e = errno;
            close(c->spare_fd);
            fd = accept4(c->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0)
                refuse_full(c, fd, e == EMFILE ? "this process is out of file descriptors (raise ulimit -n)"
                                               : "the system is out of file descriptors");
            c->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (fd >= 0) continue;
        }
        if (fd < 0) {
            int e = errno;
            if (e == ECONNABORTED) continue;
            if (e != EAGAIN && e != EWOULDBLOCK) {
                /* The pending connection keeps the listener readable: look
                 * again in a while rather than spin. */
                conn_note(c, "cannot accept forwarding connections: %s", strerror(e));
                c->accept_after = c->net_clock + 100000000ull;
            }
            return;
        }
        if (!conn_room(c)) {
            char why[96];
            if (c->nconns < c->max_conns)
                snprintf(why, sizeof why, "out of memory for its connection table");
            else
                snprintf(why, sizeof why, "already serving %zu forwarding connections, the most it takes",
                         c->nconns);
            refuse_full(c, fd, why);
            continue;
        }
        c->conns[c->nconns++] = (conn){fd, 0, c->net_clock, NULL, 0, 0};
    }
}

/* A connection's first bytes: the hello with the token. Returns 1 once
 * accepted, 0 while incomplete, -1 when refused (nothing after it is
 * read). */
static int check_hello(collector *c, conn *k) {
    uint32_t magic;
    if (k->len < sizeof magic) return 0;
    memcpy(&magic, k->buf, sizeof magic);
    char peer[80];
    if (magic == FRAME_MAGIC && !c->token[0]) return 1; /* a forwarder from before the hello */
    if (magic != HELLO_MAGIC) {
        pp_peer_name(k->fd, peer, sizeof peer);
        if (magic == FRAME_MAGIC)
            conn_note(c, "refused a forwarding connection from %s: no rendezvous token", peer);
        else
            conn_note(c, "dropping a connection from %s that is not a pprun forwarder", peer);
        return -1;
    }
    hello_hdr h;
    if (k->len < sizeof h) return 0;
    memcpy(&h, k->buf, sizeof h);
    if (h.version != HELLO_VERSION || h.token_len > PP_TOKEN_MAX) {
        pp_peer_name(k->fd, peer, sizeof peer);
        conn_note(c, "dropping a forwarding connection from %s: bad hello (version %u, token of %u bytes)", peer,
                  h.version, h.token_len);
        return -1;
    }
    if (k->len < sizeof h + h.token_len) return 0;
    unsigned char ok = !c->token[0] || pp_token_equal(c->token, k->buf + sizeof h, h.token_len) ? HELLO_ACCEPTED
                                                                                                : HELLO_REFUSED;
    /* One byte into an empty socket buffer: it goes at once. */
    ssize_t w = send(k->fd, &ok, 1, MSG_NOSIGNAL);
    if (ok != HELLO_ACCEPTED) {
        pp_peer_name(k->fd, peer, sizeof peer);
        conn_note(c, "refused a forwarding connection from %s: %s rendezvous token", peer,
                  h.token_len ? "wrong" : "no");
        return -1;
    }
    if (w != 1) return -1;
    memmove(k->buf, k->buf + sizeof h + h.token_len, k->len - sizeof h - h.token_len);
    k->len -= sizeof h + h.token_len;
    return 1;
}

/* Handles every complete frame in k's buffer. Returns the count of frames
 * handled, or -1 for a bad one (the connection is then closed: the peer is
 * not a pprun of ours). */
static int ingest_frames(collector *c, conn *k) {
    size_t off = 0;
    int frames = 0;
    uint32_t magic;
    char peer[80];
    if (!k->authed) {
        int h = check_hello(c, k);
        if (h <= 0) return h;
        k->authed = 1;
    }
    /* A stranger is told apart by its first bytes, before a whole header. */
    if (k->len >= sizeof magic && (memcpy(&magic, k->buf, sizeof magic), magic != FRAME_MAGIC)) {
        pp_peer_name(k->fd, peer, sizeof peer);
        conn_note(c, "dropping a connection from %s that is not a pprun forwarder", peer);
        return -1;
    }
    while (k->len - off >= sizeof(frame_hdr)) {
        frame_hdr h;
        memcpy(&h, k->buf + off, sizeof h);
        /* A forwarder sends each of its ranks once per frame: never more
         * than the job has. */
        if (h.magic != FRAME_MAGIC || h.version != FRAME_VERSION || h.job_id != c->cfg.job_id ||
            h.nrecords > BATCH_MAX || h.nranks > c->cfg.world_size) {
            pp_peer_name(k->fd, peer, sizeof peer);
            conn_note(c, "dropping a forwarding connection from %s: bad frame (magic %08x, version %u, job %lld, "
                      "%u ranks, %u records)", peer, h.magic, h.version, (long long)h.job_id, h.nranks, h.nrecords);
            return -1;
        }
        size_t need = sizeof h + (size_t)h.nranks * sizeof(frame_rank) + (size_t)h.nrecords * sizeof(trace_event);
        if (k->len - off < need) break;
        const unsigned char *p = k->buf + off + sizeof h;
        for (unsigned i = 0; i < h.nranks; i++, p += sizeof(frame_rank)) {
            frame_rank fr;
            memcpy(&fr, p, sizeof fr);
            pp_err e;
            /* The first frame of a rank also records its offset where users
             * look for it (ranks.clock_offset_ns). */
            if (fr.rank < 0 || fr.rank >= c->cfg.world_size) {
                pp_peer_name(k->fd, peer, sizeof peer);
                conn_note(c, "dropping a forwarding connection from %s: frame for rank %d of %d", peer, fr.rank,
                          c->cfg.world_size);
                return -1;
            }
            /* Once a write failed nothing more is written (what room the
             * rolled-back transaction left goes to the job's end). */
            int rc = 0;
            if (!c->offset_recorded[fr.rank] && !has_failed(c))
                rc = db_update_rank(c->cfg.db, c->cfg.job_id, fr.rank, 0, fr.clock_offset_ns, &e);
            else if (c->offset_recorded[fr.rank])
                rc = db_set_clock_offset(c->cfg.db, c->cfg.job_id, fr.rank, fr.clock_offset_ns, &e);
            if (rc != 0) {
                set_error(c, &e);
                return -1;
            }
            c->offset_recorded[fr.rank] = 1;
            store_dropped(c, fr.rank, fr.dropped);
            store_pid(c, fr.rank, fr.pid, fr.clock_offset_ns);
        }
        /* Records are copied out (the buffer has no alignment promise); a
         * frame holds at most BATCH_MAX, which c->buf holds. */
        memcpy(c->buf, p, (size_t)h.nrecords * sizeof(trace_event));
        store_events(c, c->buf, h.nrecords);
        off += need;
        frames++;
    }
    memmove(k->buf, k->buf + off, k->len - off);
    k->len -= off;
    return frames;
}

/* Reads what conn i has (a bounded number of times), handling frames as
 * they complete so that its buffer holds at most one frame and a read.
 * Returns -1 when it closed the connection. */
static int read_conn(collector *c, size_t i) {
    conn *k = &c->conns[i];
    char peer[80];
    for (int reads = 0; reads < READS_PER_ROUND; reads++) {
        if (k->cap - k->len < 65536) {
            size_t cap = k->cap ? 2 * k->cap : CONN_BUF_MIN;
            unsigned char *b = realloc(k->buf, cap);
            if (!b) {
                pp_peer_name(k->fd, peer, sizeof peer);
                conn_note(c, "out of memory for the frame of %s: dropping its connection", peer);
                close_conn(c, i);
                return -1;
            }
            k->buf = b;
            k->cap = cap;
        }
        int fresh = !k->authed || k->len == 0; /* the next byte starts a frame */
        ssize_t r = recv(k->fd, k->buf + k->len, k->cap - k->len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) {
            /* Complete frames were handled as they came: what is left is
             * one incomplete hello or frame. */
            if (k->len > 0) {
                pp_peer_name(k->fd, peer, sizeof peer);
                conn_note(c, "%s closed its connection mid-%s (%zu bytes lost)", peer, k->authed ? "frame" : "hello",
                          k->len);
            }
            close_conn(c, i);
            return -1;
        }
        k->len += (size_t)r;
        int was_authed = k->authed;
        int frames = ingest_frames(c, k);
        if (frames < 0) {
            close_conn(c, i);
            return -1;
        }
        /* Before the hello the deadline runs from the accept; after it from
         * the first byte of the frame now incomplete. */
        if (k->authed && (fresh || frames > 0 || !was_authed)) k->since = c->net_clock;
    }
    /* An idle connection keeps no buffer: thousands of them cost little. */
    if (k->len == 0 && k->cap > CONN_BUF_MIN) {
        free(k->buf);
        k->buf = NULL;
        k->cap = 0;
    }
    return 0;
}

/* Closes the connections past their deadline: no hello (an idle stranger
 * holding a slot) or a frame begun and not finished (a sender that stopped
 * mid-frame). Frames already complete were stored when they arrived. */
static void expire_conns(collector *c) {
    char peer[80];
    for (size_t i = c->nconns; i-- > 0;) {
        conn *k = &c->conns[i];
        uint64_t age = c->net_clock - k->since;
        if (!k->authed && age > c->hello_ns) {
            pp_peer_name(k->fd, peer, sizeof peer);
            conn_note(c, "closed a connection from %s: no hello within %.3g s (%zu bytes of one)", peer,
                      (double)c->hello_ns / 1e9, k->len);
            close_conn(c, i);
        } else if (k->authed && k->len > 0 && age > c->frame_ns) {
            pp_peer_name(k->fd, peer, sizeof peer);
            conn_note(c, "closed a connection from %s: a frame begun %.3g s ago is still incomplete (%zu bytes "
                      "dropped; the frames before it are kept)", peer, (double)age / 1e9, k->len);
            close_conn(c, i);
        }
    }
}

static void poll_net(collector *c, int timeout_ms) {
    struct pollfd *pf = c->pfds;
    nfds_t n = 0;
    int lis = c->listen_fd >= 0 && c->net_clock >= c->accept_after;
    if (lis) pf[n++] = (struct pollfd){c->listen_fd, POLLIN, 0};
    for (size_t i = 0; i < c->nconns; i++) pf[n++] = (struct pollfd){c->conns[i].fd, POLLIN, 0};
    int ready = poll(pf, n, timeout_ms);
    uint64_t now = pp_now_ns(), step = now - c->net_last, most = 1000000000ull + c->cfg.interval_ns;
    c->net_clock += step < most ? step : most;
    c->net_last = now;
    if (ready > 0) {
        size_t nc = c->nconns;
        /* Walk connections backwards: close_conn moves the last into the hole. */
        for (size_t i = nc; i-- > 0;)
            if (pf[lis + i].revents) read_conn(c, i);
        if (lis && pf[0].revents) accept_conns(c);
    }
    expire_conns(c);
}

/* At the end: is a connection left that may still bring records? One
 * that never sent a byte (a port scanner, an idle stranger) does not hold
 * the launcher's exit for the grace. */
static int forwarders_left(const collector *c) {
    for (size_t i = 0; i < c->nconns; i++)
        if (c->conns[i].authed || c->conns[i].len > 0) return 1;
    return 0;
}

static void *collector_main(void *arg) {
    collector *c = arg;
    int ms = (int)(c->cfg.interval_ns / 1000000u);
    if (ms < 1) ms = 1;
    while (!atomic_load(&c->stop)) {
        poll_net(c, ms);
        drain_rings(c);
    }
    drain_rings(c);
    if (c->cfg.db) {
        /* Forwarders stop first: their connections are established, maybe
         * still in the listen backlog, and closed once their data is sent. */
        if (c->listen_fd >= 0) accept_conns(c);
        uint64_t until = pp_now_ns() + c->cfg.stop_grace_ns;
        while (forwarders_left(c) && pp_now_ns() < until) poll_net(c, 10);
        while (c->nconns > 0) close_conn(c, c->nconns - 1);
        pp_err e;
        /* Again with every record in (a restart ran some steps twice);
         * a cut job's last steps keep their events only, but for those
         * every rank finished (a rank died between steps). */
        int below = INT32_MAX;
        if (atomic_load(&c->last_step_cut))
            for (below = c->analyzed; db_step_finished(c->cfg.db, c->cfg.job_id, below, c->cfg.world_size) == 1;)
                below++;
        if (!has_failed(c) && db_analyze_steps_below(c->cfg.db, c->cfg.job_id, below, &e) != 0) set_error(c, &e);
    }
    if (c->log.held)
        fprintf(stderr, "pprun collector: %lu more lines about forwarding connections were left out\n", c->log.held);
    uint64_t rejected = atomic_load(&c->rejected);
    if (rejected) fprintf(stderr, "pprun collector: %llu trace records refused in all\n", (unsigned long long)rejected);
    return NULL;
}

/* ---- setup ------------------------------------------------------------ */

/* On failure errno says why (EADDRNOTAVAIL: not an address of this host). */
static int tcp_socket(const char *host, int port, int listening, pp_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = listening ? AI_PASSIVE : 0};
    struct addrinfo *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        errno = 0;
        return pp_fail(err, "collector: cannot resolve '%s': %s", host ? host : "*", gai_strerror(rc));
    }
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        int one = 1;
        if (listening) {
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            /* Every node of a big job connects at once at start. */
            if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
        } else {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        }
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        pp_fail(err, "collector: cannot %s %s:%d: %s", listening ? "listen on" : "connect to the master at",
                host ? host : "*", port,
                strerror(e));
        errno = e;
    }
    return fd;
}

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
    struct timeval tv = {HELLO_WAIT_S, 0}, none = {0, 0};
    setsockopt(c->fwd_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned char ok = 0;
    ssize_t r;
    while ((r = recv(c->fwd_fd, &ok, 1, 0)) < 0 && errno == EINTR) {
    }
    int e = errno;
    setsockopt(c->fwd_fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
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
                       e == EAGAIN || e == EWOULDBLOCK ? "timed out after 10s" : strerror(e));
    return pp_fail(err, "the trace collector at %s:%d refused the rendezvous token (%s): every node needs the same "
                        "--rdzv-token / PPRUN_RDZV_TOKEN",
                   c->forward_host, c->cfg.forward_port, n ? "a different one" : "none was given");
}

/* Everything but the forwarding socket (closed politely by collector_stop). */
static void collector_free(collector *c) {
    if (c->listen_fd >= 0) close(c->listen_fd);
    if (c->spare_fd >= 0) close(c->spare_fd);
    free(c->conns);
    free(c->pfds);
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
    free(c->dropped);
    free(c->pid);
    free(c->pid_recorded);
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
    c->fwd_fd = c->listen_fd = c->spare_fd = -1;
    c->hello_ns = cfg->hello_timeout_ns ? cfg->hello_timeout_ns : HELLO_DEADLINE_NS;
    c->frame_ns = cfg->frame_timeout_ns ? cfg->frame_timeout_ns : FRAME_DEADLINE_NS;
    c->max_conns = cfg->max_forwarders > 0 ? (size_t)cfg->max_forwarders : MAX_CONNS_DEFAULT;
    c->net_last = pp_now_ns();
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->err_mu, NULL);
    c->buf = malloc(BATCH_MAX * sizeof *c->buf);
    c->max_step = malloc((size_t)cfg->world_size * sizeof *c->max_step);
    c->offset_recorded = calloc((size_t)cfg->world_size, 1);
    c->dropped = calloc((size_t)cfg->world_size, sizeof *c->dropped);
    c->pid = calloc((size_t)cfg->world_size, sizeof *c->pid);
    c->pid_recorded = calloc((size_t)cfg->world_size, sizeof *c->pid_recorded);
    if (!c->buf || !c->max_step || !c->dropped || !c->offset_recorded || !c->pid || !c->pid_recorded) {
        pp_fail(err, "collector: out of memory");
        goto fail;
    }
    for (int r = 0; r < cfg->world_size; r++) c->max_step[r] = -1;
    if (cfg->forward_host) {
        c->forward_host = strdup(cfg->forward_host);
        if ((c->fwd_fd = tcp_socket(cfg->forward_host, cfg->forward_port, 0, err)) < 0) goto fail;
        if (say_hello(c, err) != 0) goto fail;
    }
    if (cfg->listen_host) {
        c->listen_host = strdup(cfg->listen_host);
        c->listen_fd = tcp_socket(cfg->listen_host, cfg->listen_port, 1, err);
        /* The master address may name this machine by an address it
         * cannot bind (NAT): listen everywhere then, like the store, and
         * only with a token (without one the address was loopback). */
        if (c->listen_fd < 0 && errno == EADDRNOTAVAIL && c->token[0])
            c->listen_fd = tcp_socket(NULL, cfg->listen_port, 1, err);
        if (c->listen_fd < 0) goto fail;
        fcntl(c->listen_fd, F_SETFL, fcntl(c->listen_fd, F_GETFL) | O_NONBLOCK);
        c->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (!(c->pfds = malloc(sizeof *c->pfds))) {
            pp_fail(err, "collector: out of memory");
            goto fail;
        }
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        getsockname(c->listen_fd, (struct sockaddr *)&sa, &sl);
        c->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
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
    c->rings[c->nrings++] = (ring_slot){rank, ring};
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int collector_listen_port(const collector *c) { return c->port; }
uint64_t collector_count(const collector *c) { return atomic_load(&((collector *)c)->count); }
uint64_t collector_rejected(const collector *c) { return atomic_load(&((collector *)c)->rejected); }

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
