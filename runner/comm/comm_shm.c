/* comm_shm.c: the shared-memory transport between two ranks of one node.
 *
 * One POSIX shm object per pair of ranks (a < b) holds two byte rings, a->b
 * and b->a.  Whoever of the two needs it first creates it (O_EXCL), the
 * other opens it; the one that attaches second unlinks the name, so a
 * finished pair leaves nothing in /dev/shm (comm_cleanup sweeps the names of
 * a rank that died before its peer attached).  Messages are a byte stream of
 * header + payload, so a 64 MiB message flows through a ring of a few MiB in
 * pieces while the reader copies them out.
 *
 * Waiting never spins: a writer with no room sleeps on the ring's space_seq
 * futex, a reader with no data on data_seq (FUTEX_WAIT on shared memory,
 * woken by the other process).  The *_waiting flags let the other side skip
 * the FUTEX_WAKE syscall when nobody sleeps.  Sleeps are cut in slices of
 * 500 ms only as a safety net; peer death wakes them at once (comm.c). */
#include "runner/comm/comm_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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
#define SHM_SLICE_MS 500

struct comm_ring {                  /* lives in shared memory */
    alignas(64) _Atomic uint64_t head;  /* bytes ever written (writer only) */
    _Atomic uint32_t data_seq;          /* futex: bumped after head moves */
    _Atomic uint32_t reader_waiting;
    alignas(64) _Atomic uint64_t tail;  /* bytes ever read (reader only) */
    _Atomic uint32_t space_seq;         /* futex: bumped after tail moves */
    _Atomic uint32_t writer_waiting;
    alignas(64) _Atomic uint32_t closed; /* writer called comm_close */
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
    snprintf(buf, cap, "/pprun-%016" PRIx64 "-%d-%d", job_hash, a, b);
}

static void fwait(_Atomic uint32_t *w, uint32_t v, int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
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
        for (size_t i = 0; i < sizeof ring_sizes / sizeof *ring_sizes; i++) {
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

size_t comm_shm_try_write(comm_peer *p, const void *a, size_t na, const void *b, size_t nb) {
    struct comm_ring *r = p->out_ring;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t room = (size_t)(p->ring_cap - (head - atomic_load(&r->tail)));
    size_t wa = na < room ? na : room;
    size_t wb = nb < room - wa ? nb : room - wa;
    if (wa) head += ring_put(p, head, a, wa);
    if (wb) head += ring_put(p, head, b, wb);
    if (wa + wb) publish_head(r, head);
    return wa + wb;
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

int comm_shm_write_all(comm_peer *p, const void *buf, size_t n, char *why, size_t cap) {
    struct comm_ring *r = p->out_ring;
    const char *s = buf;
    while (n) {
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        size_t room = (size_t)(p->ring_cap - (head - atomic_load(&r->tail)));
        if (room) {
            size_t k = n < room ? n : room;
            publish_head(r, head + ring_put(p, head, s, k));
            s += k;
            n -= k;
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
            fwait(&r->space_seq, seq, SHM_SLICE_MS);
        }
        atomic_store(&r->writer_waiting, 0);
    }
    return 0;
}

static int shm_read(comm_peer *p, void *dst, size_t n, char *why, size_t cap) {
    struct comm_ring *r = p->in_ring;
    unsigned char *d = dst;
    while (n) {
        if (atomic_load(&p->c->stopping)) return stop_reason(p, why, cap), -1;
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        /* Flags first, head second: a writer's last bytes are visible
         * before its closed flag or its death is. */
        int ending = atomic_load(&r->closed) || atomic_load(&p->dead) || atomic_load(&p->c->stopping);
        uint64_t avail = atomic_load(&r->head) - tail;
        if (avail) {
            size_t k = n < avail ? n : (size_t)avail;
            size_t cap = p->ring_cap, off = (size_t)(tail % cap), first = k < cap - off ? k : cap - off;
            memcpy(d, ring_data(p, r) + off, first);
            if (k > first) memcpy(d + first, ring_data(p, r), k - first);
            d += k;
            n -= k;
            atomic_store(&r->tail, tail + k);
            atomic_fetch_add(&r->space_seq, 1);
            if (atomic_load(&r->writer_waiting)) fwake(&r->space_seq);
            continue;
        }
        if (ending) {
            if (!stop_reason(p, why, cap)) snprintf(why, cap, "closed its channel (called comm_close)");
            return -1;
        }
        atomic_store(&r->reader_waiting, 1);
        uint32_t seq = atomic_load(&r->data_seq);
        if (atomic_load(&r->head) == tail && !atomic_load(&r->closed) && !atomic_load(&p->dead) &&
            !atomic_load(&p->c->stopping))
            fwait(&r->data_seq, seq, SHM_SLICE_MS);
        atomic_store(&r->reader_waiting, 0);
    }
    return 0;
}

static void *shm_reader_main(void *arg) {
    comm_reader_loop(arg, shm_read);
    return NULL;
}

int comm_shm_start_reader(comm_peer *p) {
    return comm_start_reader(p, shm_reader_main);
}

void comm_shm_wake(comm_peer *p) {
    bump_wake(&p->in_ring->data_seq);
    bump_wake(&p->out_ring->space_seq);
}

void comm_shm_close_out(comm_peer *p) {
    atomic_store(&p->out_ring->closed, 1);
    bump_wake(&p->out_ring->data_seq);  /* the peer's reader */
    bump_wake(&p->in_ring->space_seq);  /* the peer's writer, if it waits on us */
}

void comm_shm_detach(comm_peer *p) {
    munmap(p->seg, p->seg_size);
    p->seg = NULL;
    p->out_ring = p->in_ring = NULL;
}
