/* comm_shm.c: the shared-memory transport between two ranks of one node.
 *
 * One POSIX shm object per pair of ranks (a < b) holds two byte rings, a->b
 * and b->a.  Whoever of the two needs it first creates it (O_EXCL), the
 * other opens it; the one that attaches second unlinks the name, so a
 * finished pair leaves nothing in /dev/shm (comm_cleanup sweeps the names of
 * a rank that died before its peer attached).  Messages are a byte stream of
 * header + payload, so a 64 MiB message flows through a ring of a few MiB in
 * pieces.
 *
 * Who reads a ring: one thread at a time, the holder of the peer's rx_busy.
 * A thread in comm_recv reads the ring itself, in order, straight into its
 * buffer when the next message is the one it asked for (others go to the
 * inbox, or to the posted receive of another thread). The peer's reader
 * thread hands messages over while receives on the peer wait long, and
 * otherwise only drains the ring into the inbox when the writer has waited
 * for room and no receive is posted (drain_seq), so that a sender's
 * comm_flush never waits for a comm_recv. A message can be left half read by
 * one and finished by the other.
 *
 * Waiting: a writer with no room sleeps on the ring's space_seq futex; the
 * *_waiting flags let the other side skip the FUTEX_WAKE syscall when
 * nobody sleeps. A receive that finds the ring empty, while its recent
 * waits on this peer were short (their moving average under DIRECT_MAX_NS),
 * sleeps on the ring's data_seq futex itself, woken by the writing process:
 * one wake-up per message, as a pipe; before that it spins, polling with
 * sched_yield, when the average is under SPIN_MAX_NS and the machine has a
 * core free (/proc/loadavg). After long waits (a pipeline stage waiting for
 * its neighbour's compute) it sleeps on its condition variable and the
 * reader thread, made eager, hands the message over: a busy 4-rank pipeline
 * on 2 cores ran up to twice as slow with those receives on the futex
 * (docs/comm.md, "Waiting"). Sleeps are cut in slices of 500 ms only as a
 * safety net; peer death wakes them at once (comm.c). */
#include "runner/comm/comm_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdalign.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x70707368u       /* "pprs" */
/* Per direction: big enough to stream, small for /dev/shm.  Where /dev/shm
 * is small (a container's default 64 MiB) the creator falls back to
 * smaller rings rather than fail. */
static const size_t ring_sizes[] = {4u << 20, 1u << 20, 256u << 10};
/* The share of a node's memory its rings may take in all, were every pair
 * of its ranks to talk (comm_shm_ring_bytes). */
#define SHM_MEMORY_SHARE 8
#define SHM_SLICE_NS 500000000ull
#define PIECE (256u << 10)           /* copied in (out) before head (tail) moves: the other side works meanwhile */
#define SPIN_MAX_NS 50000ull         /* a receive spins only while recent waits averaged less, and cores are free */
#define SPIN_MIN_NS 5000ull
#define DIRECT_MAX_NS 100000ull      /* a receive sleeps on the ring's futex only while recent waits averaged less */
#define DRAIN_AFTER_NS 100000ull     /* a full ring this long: the peer's reader thread drains it */
#define DRAIN_MAX_NS 50000000ull
#define STALL_NS 500000ull           /* comm_send writes on past a full ring while the reader makes room this fast */

struct comm_ring {                  /* lives in shared memory */
    alignas(64) _Atomic uint64_t head;  /* bytes ever written (writer only) */
    _Atomic uint32_t data_seq;          /* futex: bumped after head moves */
    _Atomic uint32_t reader_waiting;    /* threads sleeping on data_seq (a receive, the reader thread) */
    alignas(64) _Atomic uint64_t tail;  /* bytes ever read (reader only) */
    _Atomic uint32_t space_seq;         /* futex: bumped after tail moves */
    _Atomic uint32_t writer_waiting;
    alignas(64) _Atomic uint32_t closed; /* writer called comm_close */
    _Atomic uint32_t drain_seq;         /* futex: the writer asks the reader thread to drain */
    _Atomic uint32_t reading;           /* a thread of the reader holds the ring (rx_busy) */
    uint64_t data_off;                  /* from the segment start */
};

typedef struct seg_hdr {
    _Atomic uint32_t magic;  /* set last by the creator: the rest is ready */
    _Atomic uint32_t attached;
    uint64_t cap, job_hash;
    alignas(64) struct comm_ring ring[2]; /* [0]: low rank -> high rank */
} seg_hdr;

static size_t hdr_bytes(void) {
    return (sizeof(seg_hdr) + 4095) & ~(size_t)4095;
}

void comm_shm_name(uint64_t job_hash, int a, int b, char *buf, size_t cap) {
    snprintf(buf, cap, "/" COMM_SHM_PREFIX "%016" PRIx64 "-%d-%d", job_hash, a, b);
}

static void fwait(_Atomic uint32_t *w, uint32_t v, uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}

static void fwake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void bump_wake(_Atomic uint32_t *seq) {
    atomic_fetch_add(seq, 1);
    fwake(seq);
}

static unsigned char *ring_data(comm_peer *p, struct comm_ring *r) {
    return (unsigned char *)p->seg + r->data_off;
}

static void nap_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* comm_shm_ring_bytes as an index into ring_sizes. */
static size_t ring_index(int node_ranks, uint64_t memory) {
    size_t n = sizeof ring_sizes / sizeof *ring_sizes, i = 0;
    double pairs = (double)node_ranks * (double)(node_ranks - 1) / 2, budget = (double)memory / SHM_MEMORY_SHARE;
    while (i + 1 < n && pairs * 2 * (double)ring_sizes[i] > budget) i++;
    return i;
}

size_t comm_shm_ring_bytes(int node_ranks, uint64_t memory) { return ring_sizes[ring_index(node_ranks, memory)]; }

size_t comm_shm_first_ring(int node_ranks) {
    return ring_index(node_ranks, pp_memory_bytes());
}

int comm_shm_attach(comm_peer *p, pp_err *err) {
    comm *c = p->c;
    int lo = c->rank < p->rank ? c->rank : p->rank, hi = c->rank ^ p->rank ^ lo;
    char name[128];
    comm_shm_name(c->job_hash, lo, hi, name, sizeof name);
    int creator = 1;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        creator = 0;
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0) return pp_fail(err, "comm: shm_open %s (ranks %d and %d): %s", name, lo, hi, strerror(errno));
    uint64_t deadline = pp_deadline_ns(c->connect_timeout_ms);
    size_t size = 0, cap = 0;
    if (creator) {
        /* Reserve the pages now: a full /dev/shm is an error here (or a
         * smaller ring), not a SIGBUS later. */
        int e = 0;
        for (size_t i = c->shm_ring; i < sizeof ring_sizes / sizeof *ring_sizes; i++) {
            cap = ring_sizes[i];
            size = hdr_bytes() + 2 * cap;
            if (!(e = posix_fallocate(fd, 0, (off_t)size))) break;
        }
        if (e) {
            close(fd);
            shm_unlink(name);
            return pp_fail(err, "comm: cannot reserve %zu bytes in /dev/shm for %s (ranks %d and %d): %s", size, name,
                           lo, hi, strerror(e));
        }
    } else {
        /* The creator's fallocate sets the size in one step; its set-up
         * takes microseconds: short naps, bounded. */
        struct stat st;
        while (fstat(fd, &st) == 0 && st.st_size == 0 && pp_now_ns() < deadline) nap_ms(1);
        if (fstat(fd, &st) < 0 || (size_t)st.st_size <= hdr_bytes()) {
            close(fd);
            return pp_fail(err, "comm: shm segment %s of ranks %d and %d was never sized (its creator died?)", name, lo,
                           hi);
        }
        size = (size_t)st.st_size;
        cap = (size - hdr_bytes()) / 2;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        if (creator) shm_unlink(name);
        return pp_fail(err, "comm: mmap of %s (%zu bytes): %s", name, size, strerror(errno));
    }
    seg_hdr *h = m;
    if (creator) {
        h->cap = cap;
        h->job_hash = c->job_hash;
        for (int i = 0; i < 2; i++) h->ring[i].data_off = hdr_bytes() + (size_t)i * cap;
        atomic_store(&h->magic, SHM_MAGIC);
    } else {
        while (atomic_load(&h->magic) != SHM_MAGIC && pp_now_ns() < deadline) nap_ms(1);
        if (atomic_load(&h->magic) != SHM_MAGIC || h->cap != cap || h->job_hash != c->job_hash) {
            munmap(m, size);
            return pp_fail(err, "comm: shm segment %s of ranks %d and %d was never initialised or belongs to another job",
                           name, lo, hi);
        }
    }
    if (atomic_fetch_add(&h->attached, 1) + 1 == 2) shm_unlink(name);
    p->seg = m;
    p->seg_size = size;
    p->ring_cap = cap;
    p->out_ring = &h->ring[c->rank == lo ? 0 : 1];
    p->in_ring = &h->ring[c->rank == lo ? 1 : 0];
    return 0;
}

static size_t ring_put(comm_peer *p, uint64_t head, const void *src, size_t n) {
    struct comm_ring *r = p->out_ring;
    uint64_t cap = p->ring_cap;
    size_t off = (size_t)(head % cap), first = n < cap - off ? n : (size_t)(cap - off);
    memcpy(ring_data(p, r) + off, src, first);
    if (n > first) memcpy(ring_data(p, r), (const char *)src + first, n - first);
    return n;
}

static void publish_head(struct comm_ring *r, uint64_t head) {
    atomic_store(&r->head, head);
    atomic_fetch_add(&r->data_seq, 1);
    if (atomic_load(&r->reader_waiting)) fwake(&r->data_seq);
}

/* Copies n bytes in at head and publishes them a PIECE at a time, so that
 * the reader copies one piece out while we copy the next in. New head. */
static uint64_t put_published(comm_peer *p, uint64_t head, const void *src, size_t n) {
    for (size_t done = 0; done < n;) {
        size_t k = n - done < PIECE ? n - done : PIECE;
        head += ring_put(p, head, (const char *)src + done, k);
        done += k;
        publish_head(p->out_ring, head);
    }
    return head;
}

size_t comm_shm_try_write(comm_peer *p, const void *a, size_t na, const void *b, size_t nb) {
    struct comm_ring *r = p->out_ring;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t room = (size_t)(p->ring_cap - (head - atomic_load(&r->tail)));
    size_t wa = na < room ? na : room;
    size_t wb = nb < room - wa ? nb : room - wa;
    if (wa) head += ring_put(p, head, a, wa); /* the header goes out with the first piece */
    if (wb) put_published(p, head, b, wb);
    else if (wa) publish_head(r, head);
    return wa + wb;
}

/* comm_send's write of what did not fit at once, p->busy held (no other
 * writer): writes on as the peer reads, while a thread of its holds the
 * ring (`reading`) and makes room within STALL_NS of each wait; the bytes
 * written, the rest to be queued. Without it, what does not fit is copied
 * into the queue and once more into the ring by the sender thread: a third
 * copy that a stream of big messages spends most of its time on
 * (docs/comm.md, "Costs and known limits"). A peer that is not reading,
 * or is gone, costs no wait. */
size_t comm_shm_write_on(comm_peer *p, const void *src, size_t n) {
    struct comm_ring *r = p->out_ring;
    size_t done = 0;
    while (done < n) {
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed), tail = atomic_load(&r->tail);
        size_t room = (size_t)(p->ring_cap - (head - tail));
        if (room) {
            size_t k = n - done < room ? n - done : room;
            put_published(p, head, (const char *)src + done, k);
            done += k;
            continue;
        }
        if (!atomic_load(&r->reading) || atomic_load(&p->dead) || atomic_load(&p->c->stopping) ||
            atomic_load(&p->in_ring->closed))
            break;
        atomic_store(&r->writer_waiting, 1);
        uint32_t seq = atomic_load(&r->space_seq);
        if (atomic_load(&r->tail) == tail) fwait(&r->space_seq, seq, STALL_NS);
        atomic_store(&r->writer_waiting, 0);
        if (atomic_load(&r->tail) == tail) break; /* no room came: queue the rest */
    }
    return done;
}

static int stop_reason(comm_peer *p, char *why, size_t cap) {
    if (atomic_load(&p->c->stopping)) {
        snprintf(why, cap, "comm was closed");
        return 1;
    }
    if (atomic_load(&p->dead)) {
        pthread_mutex_lock(&p->mu);
        snprintf(why, cap, "%s", p->dead_why);
        pthread_mutex_unlock(&p->mu);
        return 1;
    }
    return 0;
}

/* The sender thread's write: waits for room as long as it takes. A ring
 * that stays full for DRAIN_AFTER_NS asks the peer's reader thread to drain
 * it into its inbox (drain_seq), and again after each wait without
 * progress, the waits doubling up to DRAIN_MAX_NS: the peer's receive
 * reads the ring itself when it is in comm_recv, and only a peer busy
 * elsewhere needs its reader thread woken. */
int comm_shm_write_all(comm_peer *p, const void *buf, size_t n, char *why, size_t cap) {
    struct comm_ring *r = p->out_ring;
    const char *s = buf;
    uint64_t slice = DRAIN_AFTER_NS;
    while (n) {
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed), tail = atomic_load(&r->tail);
        size_t room = (size_t)(p->ring_cap - (head - tail));
        if (room) {
            size_t k = n < room ? n : room;
            put_published(p, head, s, k);
            s += k;
            n -= k;
            slice = DRAIN_AFTER_NS;
            continue;
        }
        atomic_store(&r->writer_waiting, 1);
        uint32_t seq = atomic_load(&r->space_seq);
        if (head - atomic_load(&r->tail) == p->ring_cap) {
            if (stop_reason(p, why, cap)) {
                atomic_store(&r->writer_waiting, 0);
                return -1;
            }
            if (atomic_load(&p->in_ring->closed)) {
                atomic_store(&r->writer_waiting, 0);
                snprintf(why, cap, "closed its channel (called comm_close) with our messages unread");
                return -1;
            }
            fwait(&r->space_seq, seq, slice);
            if (atomic_load(&r->tail) == tail) { /* no progress: the peer is not reading */
                bump_wake(&r->drain_seq);
                slice = slice * 2 > DRAIN_MAX_NS ? DRAIN_MAX_NS : slice * 2;
            }
        }
        atomic_store(&r->writer_waiting, 0);
    }
    return 0;
}

/* ---- reading a ring: one reader at a time, the holder of rx_busy ---------- */

/* Whether a reader has something to do: bytes in the ring, or the stream's
 * end (the peer closed or died, or this comm is closing). */
static int rx_ready(comm_peer *p, struct comm_ring *r) {
    return atomic_load(&r->closed) || atomic_load(&p->dead) || atomic_load(&p->c->stopping) ||
           atomic_load(&r->head) != atomic_load_explicit(&r->tail, memory_order_relaxed);
}

static void ring_get(comm_peer *p, struct comm_ring *r, uint64_t tail, void *dst, size_t k) {
    size_t cap = p->ring_cap, off = (size_t)(tail % cap), first = k < cap - off ? k : cap - off;
    memcpy(dst, ring_data(p, r) + off, first);
    if (k > first) memcpy((unsigned char *)dst + first, ring_data(p, r), k - first);
}

/* Moves tail past k bytes copied out; wakes a writer waiting for room. */
static void rx_consume(struct comm_ring *r, uint64_t tail, size_t k) {
    atomic_store(&r->tail, tail + k);
    atomic_fetch_add(&r->space_seq, 1);
    if (atomic_load(&r->writer_waiting)) fwake(&r->space_seq);
}

/* One step: copies what the ring holds of the message being read (its
 * header first, then at most PIECE of payload) into place, moves tail,
 * and hands the message over once complete. 1: a message was handed over;
 * 0: *moved bytes were read (0: the ring is empty); -1: the stream ended, or
 * a message did not fit in memory (why). */
static int rx_step(comm_peer *p, size_t *moved, char *why, size_t cap) {
    struct comm_ring *r = p->in_ring;
    *moved = 0;
    if (atomic_load(&p->c->stopping)) {
        snprintf(why, cap, "comm was closed");
        return -1;
    }
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    /* Flags first, head second: a writer's last bytes are visible before
     * its closed flag or its death is. */
    int ending = atomic_load(&r->closed) || atomic_load(&p->dead);
    uint64_t avail = atomic_load(&r->head) - tail;
    if (!avail) {
        if (!ending) return 0;
        if (!stop_reason(p, why, cap)) snprintf(why, cap, "closed its channel (called comm_close)");
        return -1;
    }
    size_t k = 0;
    if (p->rx_hgot < sizeof p->rx_hdr) {
        k = sizeof p->rx_hdr - p->rx_hgot;
        if (k > avail) k = (size_t)avail;
        ring_get(p, r, tail, (unsigned char *)&p->rx_hdr + p->rx_hgot, k);
        p->rx_hgot += k;
        void *dst;
        if (p->rx_hgot < sizeof p->rx_hdr || comm_rx_begin(p, &p->rx_hdr, &dst, &p->rx_msg, why, cap) < 0) {
            rx_consume(r, tail, k);
            *moved = k;
            return p->rx_hgot < sizeof p->rx_hdr ? 0 : -1;
        }
        p->rx_dst = dst;
        p->rx_got = 0;
        avail -= k;
    }
    /* The payload's next piece, consumed with the header when both are
     * there (a small message moves tail once). */
    size_t n = p->rx_hdr.len - p->rx_got;
    if (n > avail) n = (size_t)avail;
    if (n > PIECE) n = PIECE;
    if (n) ring_get(p, r, tail + k, p->rx_dst + p->rx_got, n);
    p->rx_got += n;
    rx_consume(r, tail, k + n);
    *moved = k + n;
    if (p->rx_got < p->rx_hdr.len) return 0;
    comm_rx_deliver(p, p->rx_msg);
    p->rx_msg = NULL;
    p->rx_hgot = 0;
    return 1;
}

/* Reads until one message is handed over, the ring is empty or the stream
 * ends: rx_step's 1, 0 or -1; *moved: whether any byte was read. */
static int rx_some(comm_peer *p, int *moved, char *why, size_t cap) {
    int rc;
    size_t k;
    *moved = 0;
    while ((rc = rx_step(p, &k, why, cap)) == 0 && k) *moved = 1;
    if (rc) *moved = 1;
    return rc;
}

/* The end of the stream: a message half read is dropped (a posted receive
 * being filled fails), and the receives waiting on this peer learn why. */
static void rx_finish(comm_peer *p, const char *why) {
    comm_rx_drop(p->rx_msg);
    p->rx_msg = NULL;
    comm_rx_end(p, why);
}

/* Whether a spinning receive would have a core to itself: fewer runnable
 * threads on the machine (/proc/loadavg's fourth field, this one included)
 * than CPUs this process may use. Read at most every 50 ms. When every core
 * is taken, a spin hands the core to another thread for a whole time slice
 * or keeps the writer off it: a sleep is cheaper (docs/comm.md). */
static int cores_free(void) {
    static _Atomic uint64_t checked_at;
    static _Atomic int is_free;
    uint64_t now = pp_now_ns(), at = atomic_load(&checked_at);
    if (at && now - at < 50000000ull) return atomic_load(&is_free);
    atomic_store(&checked_at, now);
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC), running = INT_MAX;
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) {
        buf[n] = '\0';
        if (sscanf(buf, "%*s %*s %*s %d/", &running) != 1) running = INT_MAX;
    }
    int f = running <= pp_cpu_count();
    atomic_store(&is_free, f);
    return f;
}

/* How long receives on this peer wait: a moving average, each wait capped
 * at 1 ms (one long wait must not stop a ping-pong from spinning for long).
 * Under mu. */
static void rx_note_wait(comm_peer *p, uint64_t ns) {
    if (ns > 1000000) ns = 1000000;
    p->rx_wait_ns = p->rx_wait_ns - p->rx_wait_ns / 4 + ns / 4;
}

void comm_wait_in(comm_peer *p, uint64_t until) {
    struct comm_ring *r = p->in_ring;
    if (p->kind != COMM_SHM || p->in_state != COMM_IN_OPEN || p->rx_busy) {
        pp_cond_wait_until(&p->cv_in, &p->mu, until);
        return;
    }
    /* This receive reads the ring itself, straight into its buffer when the
     * next message is its own: no other thread on the way. */
    p->rx_busy = 1;
    atomic_store(&r->reading, 1);
    uint64_t avg = p->rx_wait_ns;
    int direct = avg < DIRECT_MAX_NS;
    if (direct) p->rx_eager = 0; /* the reader thread goes back to draining only */
    pthread_mutex_unlock(&p->mu);
    char why[256] = "";
    int moved, rc = rx_some(p, &moved, why, sizeof why), waited = 0;
    uint64_t t0 = pp_now_ns();
    if (rc == 0 && !moved && direct) {
        /* Nothing there, and recent waits were short: spin for it when a
         * core is free, else sleep on the ring's futex, woken by the writer
         * (one wake-up per message, as a pipe). */
        waited = 1;
        if (avg < SPIN_MAX_NS && cores_free()) {
            uint64_t budget = 2 * avg < SPIN_MIN_NS ? SPIN_MIN_NS : 2 * avg > SPIN_MAX_NS ? SPIN_MAX_NS : 2 * avg;
            for (uint64_t now = t0; !rx_ready(p, r) && now - t0 < budget && now < until; now = pp_now_ns())
                sched_yield();
        }
        if (!rx_ready(p, r)) {
            /* Count and seq before the check: a writer after it wakes us. */
            atomic_fetch_add(&r->reader_waiting, 1);
            uint32_t seq = atomic_load(&r->data_seq);
            uint64_t now = pp_now_ns();
            if (!rx_ready(p, r) && now < until)
                fwait(&r->data_seq, seq, until - now < SHM_SLICE_NS ? until - now : SHM_SLICE_NS);
            atomic_fetch_sub(&r->reader_waiting, 1);
        }
        rc = rx_some(p, &moved, why, sizeof why);
    }
    if (rc < 0) rx_finish(p, why);
    pthread_mutex_lock(&p->mu);
    /* A wait that found nothing counts as a long one. */
    if (waited) rx_note_wait(p, moved ? pp_now_ns() - t0 : 1000000);
    atomic_store(&r->reading, 0);
    p->rx_busy = 0;
    pthread_cond_broadcast(&p->cv_in);
    if (rc == 0 && !moved && !direct) {
        /* Nothing there, and recent waits were long (a stage waiting for
         * its neighbour's compute): wait for the reader thread to hand the
         * message over, as in a busy pipeline that runs faster than with
         * the receive on the ring's futex (docs/comm.md, "Waiting"). */
        if (!p->rx_eager) {
            p->rx_eager = 1;
            bump_wake(&r->drain_seq);
        }
        pp_cond_wait_until(&p->cv_in, &p->mu, until);
        rx_note_wait(p, pp_now_ns() - t0);
    }
    /* Bytes left behind for an eager reader thread: it may have seen the
     * ring held and gone back to sleep. */
    if (rc >= 0 && p->rx_eager && atomic_load(&r->head) != atomic_load(&r->tail)) bump_wake(&r->data_seq);
}

/* The reader thread. Eager (p->rx_eager, while receives on this peer wait
 * long): it moves what arrives into the posted receive's buffer or the
 * inbox as soon as it arrives, sleeping on data_seq. Otherwise it only
 * drains the ring into the inbox when the writer waits for room and no
 * receive is posted, so that a sender's comm_flush never waits for a
 * comm_recv: the writer asks through drain_seq (comm_shm_write_all), and the
 * drain stops once a receive is posted (it reads on from there). */
static void *shm_reader_main(void *arg) {
    comm_peer *p = arg;
    struct comm_ring *r = p->in_ring;
    char why[256] = "";
    uint32_t seen = atomic_load(&r->drain_seq);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int end = p->in_state == COMM_IN_CLOSED || atomic_load(&p->c->stopping), eager = p->rx_eager, mine = 0;
        pthread_mutex_unlock(&p->mu);
        if (end) break;
        if (eager) {
            /* Count and seq before the checks: a writer (or a receive
             * leaving bytes behind) after them wakes us. */
            atomic_fetch_add(&r->reader_waiting, 1);
            uint32_t seq = atomic_load(&r->data_seq);
            pthread_mutex_lock(&p->mu);
            mine = p->in_state == COMM_IN_OPEN && !p->rx_busy && rx_ready(p, r);
            if (mine) p->rx_busy = 1;
            eager = p->rx_eager;
            pthread_mutex_unlock(&p->mu);
            if (!mine && eager) fwait(&r->data_seq, seq, SHM_SLICE_NS);
            atomic_fetch_sub(&r->reader_waiting, 1);
        } else {
            fwait(&r->drain_seq, seen, SHM_SLICE_NS);
            uint32_t seq = atomic_load(&r->drain_seq);
            if (seq == seen) continue; /* the slice ran out: nobody asked */
            seen = seq;
            pthread_mutex_lock(&p->mu);
            /* A receive posted reads, or will: the writer asks again if not. */
            mine = p->in_state == COMM_IN_OPEN && !p->rx_busy && !p->posted &&
                   atomic_load(&r->head) != atomic_load(&r->tail);
            if (mine) p->rx_busy = 1;
            pthread_mutex_unlock(&p->mu);
        }
        if (!mine) continue;
        atomic_store(&r->reading, 1);
        int rc, more;
        size_t moved;
        do { /* a piece at a time, until the ring is empty (or, draining, a receive is posted) */
            rc = rx_step(p, &moved, why, sizeof why);
            pthread_mutex_lock(&p->mu);
            more = rc >= 0 && (rc > 0 || moved) && (eager || !p->posted);
            pthread_mutex_unlock(&p->mu);
        } while (more);
        if (rc < 0) rx_finish(p, why);
        pthread_mutex_lock(&p->mu);
        atomic_store(&r->reading, 0);
        p->rx_busy = 0;
        pthread_cond_broadcast(&p->cv_in);
        pthread_mutex_unlock(&p->mu);
        if (rc < 0) break;
    }
    return NULL;
}

int comm_shm_start_reader(comm_peer *p) {
    return comm_start_reader(p, shm_reader_main);
}

void comm_shm_wake(comm_peer *p) {
    bump_wake(&p->in_ring->data_seq);
    bump_wake(&p->in_ring->drain_seq);
    bump_wake(&p->out_ring->space_seq);
}

void comm_shm_close_out(comm_peer *p) {
    atomic_store(&p->out_ring->closed, 1);
    bump_wake(&p->out_ring->data_seq);  /* the peer's receive */
    bump_wake(&p->in_ring->space_seq);  /* the peer's writer, if it waits on us */
}

void comm_shm_detach(comm_peer *p) {
    munmap(p->seg, p->seg_size);
    p->seg = NULL;
    p->out_ring = p->in_ring = NULL;
}
