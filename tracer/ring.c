/* ring.c: the per-rank trace ring: a memfd shared between the launcher (the
 * consumer, which created it) and one worker (the producer).
 *
 * Layout of the shared memory: one 4 KiB header page, then `capacity` slots
 * of one trace_event each. head (next slot the producer writes) and tail
 * (next slot the consumer reads) are free-running 64-bit counters on their
 * own cache lines; slot = counter & mask.
 *
 * Visibility: the producer copies the record into its slot and only then
 * publishes head with a release store. The consumer loads head with acquire
 * and copies slots below it. A producer killed in the middle of a record
 * never advanced head, so the half-written slot is not visible, and the next
 * producer (a restarted worker) overwrites it. The consumer publishes tail
 * only after copying, so the producer never overwrites a slot being read.
 * A full ring (head - tail == capacity) bumps `dropped` and returns.
 *
 * Reading and releasing are two steps for a consumer that stores what it
 * reads (docs/design.md §6, "Nothing is lost"): trace_ring_peek copies
 * from the consumer's own cursor, which may run ahead of tail, and
 * trace_ring_release publishes tail = cursor once the records are stored.
 * Until then the slots stay the ring's, so a consumer killed in between
 * leaves them to the next one (`pprun salvage`), which starts at tail or,
 * where the store says it already holds them, at the position it stored
 * with them (trace_ring_skip_to). The ring's `id` names it in the store.
 *
 * The producer is a user's program, buggy or hostile, and can write
 * anything into the shared memory: the consumer trusts none of it but the
 * records' bytes. It reads the header's tail once, at attach, then keeps
 * its own (`released`); a head that no producer could have written (more
 * than a ring's worth past that tail, or behind what was read) disables
 * the ring for good (trace_ring_fault): reading "a ring's worth" of a
 * corrupt head again and again never ends. Nor can the producer change
 * the memory's size: the memfd is sealed before any worker gets it, so a
 * shrink that would SIGBUS the launcher fails in the worker. */
#include "tracer/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define RING_MAGIC 0x31474e4952505050ull /* "PPPRING1" little-endian */
#define RING_VERSION 2
#define RING_HEADER_BYTES 4096
#define RING_MAX_CAPACITY (1ull << 26) /* 4 GiB of records: plenty */

typedef struct ring_header {
    uint64_t magic;
    uint32_t version;       /* RING_VERSION: layout of this header */
    uint32_t event_version; /* TRACE_EVENT_VERSION of the records */
    uint32_t event_size;    /* sizeof(trace_event) */
    uint32_t pad0;
    uint64_t capacity;      /* records, a power of two */
    uint64_t id;            /* random, set at creation: names the ring in the store (trace_ring_id) */
    _Atomic int32_t writer; /* the producer's pid (trace_ring_claim), 0 before one; the consumer reads it
                             * only to tell whether one came (trace_ring_writer) */
    char pad1[64 - 44];
    _Alignas(64) _Atomic uint64_t head;    /* written by the producer */
    _Atomic uint64_t dropped;              /* written by the producer */
    _Alignas(64) _Atomic uint64_t tail;    /* written by the consumer */
} ring_header;

_Static_assert(sizeof(ring_header) <= RING_HEADER_BYTES, "ring header must fit its page");

struct trace_ring {
    ring_header *hdr;
    trace_event *slots;
    uint64_t mask;
    size_t map_bytes;
    int fd;
    int owns_fd;
    /* Producer-local copies, so the hot path touches the consumer's cache
     * line only when the ring looks full. */
    uint64_t cached_tail;
    /* Consumer-local: the next record trace_ring_peek copies; tail <= cursor <= head. */
    uint64_t cursor;
    /* Consumer-local: the tail it last published (the shared one is the
     * producer's to scribble over too). */
    uint64_t released;
    /* Consumer-local, once the header proved corrupt: why (fault[0] != 0),
     * and the drop count it stays at (trace_ring_dropped). */
    char fault[160];
    uint64_t dropped_at_fault;
    int64_t skew_ns; /* PPRUN_TEST_CLOCK_SKEW_NS, read once at attach */
    uint64_t id;     /* the header's, read once: a producer that rewrites it cannot move the marks */
};

static size_t ring_bytes(uint64_t capacity) { return RING_HEADER_BYTES + capacity * sizeof(trace_event); }

/* A ring's id: random bits (the kernel's), so that rings of jobs that
 * share a database file do not share ids; never 0. */
static uint64_t ring_new_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = pp_now_ns() ^ ((uint64_t)getpid() << 40);
    return id ? id : 1;
}

static int ring_map(int fd, size_t bytes, trace_ring **out, pp_err *err) {
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return pp_fail(err, "trace ring: mmap of %zu bytes failed: %s", bytes, strerror(errno));
    trace_ring *r = calloc(1, sizeof *r);
    if (!r) {
        munmap(base, bytes);
        return pp_fail(err, "trace ring: out of memory");
    }
    r->hdr = base;
    r->slots = (trace_event *)((char *)base + RING_HEADER_BYTES);
    r->map_bytes = bytes;
    r->fd = fd;
    *out = r;
    return 0;
}

/* The ring's size is fixed for good before any worker gets the fd: a
 * worker that shrank it would make the launcher's next read of the lost
 * pages (and the dashboard's, and the guard's) die of SIGBUS. F_SEAL_SEAL:
 * nor can it add F_SEAL_FUTURE_WRITE, which would keep a restarted worker
 * and `pprun salvage` from mapping the ring writable. */
static int ring_seal(int fd, pp_err *err) {
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return pp_fail(err, "trace ring: cannot seal the memfd's size: %s", strerror(errno));
    return 0;
}

int trace_ring_create(size_t capacity, trace_ring **out, pp_err *err) {
    if (capacity == 0 || capacity > RING_MAX_CAPACITY)
        return pp_fail(err, "trace ring: capacity %zu out of range; accepted: 1 to %llu records", capacity,
                       (unsigned long long)RING_MAX_CAPACITY);
    uint64_t cap = 1;
    while (cap < capacity) cap <<= 1;
    /* Close-on-exec: the launcher passes each ring to its own worker only
     * (launch_env_pass_fd). */
    int fd = memfd_create("pprun-trace-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    char why[160];
    if (fd < 0) return pp_fail(err, "trace ring: memfd_create failed: %s", pp_strerror(errno, why, sizeof why));
    size_t bytes = ring_bytes(cap);
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return pp_fail(err, "trace ring: cannot size the memfd to %zu bytes: %s", bytes, strerror(e));
    }
    if (ring_seal(fd, err) != 0) {
        close(fd);
        return -1;
    }
    trace_ring *r;
    if (ring_map(fd, bytes, &r, err) != 0) {
        close(fd);
        return -1;
    }
    r->owns_fd = 1;
    r->mask = cap - 1;
    ring_header *h = r->hdr;
    h->version = RING_VERSION;
    h->event_version = TRACE_EVENT_VERSION;
    h->event_size = sizeof(trace_event);
    h->capacity = cap;
    h->id = r->id = ring_new_id();
    atomic_store_explicit(&h->head, 0, memory_order_relaxed);
    atomic_store_explicit(&h->tail, 0, memory_order_relaxed);
    atomic_store_explicit(&h->dropped, 0, memory_order_relaxed);
    /* Magic last: an attacher that sees it sees a complete header. */
    atomic_thread_fence(memory_order_release);
    h->magic = RING_MAGIC;
    *out = r;
    return 0;
}

int trace_ring_fd(const trace_ring *ring) { return ring->fd; }

int trace_ring_attach(int fd, trace_ring **out, pp_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return pp_fail(err, "trace ring: fd %d is not open: %s", fd, strerror(errno));
    if ((size_t)st.st_size < RING_HEADER_BYTES)
        return pp_fail(err, "trace ring: fd %d is %lld bytes, too small for a ring", fd, (long long)st.st_size);
    trace_ring *r;
    if (ring_map(fd, (size_t)st.st_size, &r, err) != 0) return -1;
    ring_header *h = r->hdr;
    const char *bad = NULL;
    if (h->magic != RING_MAGIC)
        bad = "no ring header (wrong fd?)";
    else if (h->version != RING_VERSION)
        bad = "ring layout version differs (launcher and worker from different builds)";
    else if (h->event_version != TRACE_EVENT_VERSION || h->event_size != sizeof(trace_event))
        bad = "trace event version differs (launcher and worker from different builds)";
    else if (h->capacity == 0 || (h->capacity & (h->capacity - 1)) || h->capacity > RING_MAX_CAPACITY ||
             ring_bytes(h->capacity) != (size_t)st.st_size)
        bad = "capacity does not match the size of the shared memory";
    if (bad) {
        int v = (int)h->version, ev = (int)h->event_version;
        munmap(r->hdr, r->map_bytes);
        free(r);
        return pp_fail(err, "trace ring: fd %d: %s (ring version %d, event version %d; this build: %d, %d)", fd, bad,
                       v, ev, RING_VERSION, TRACE_EVENT_VERSION);
    }
    r->mask = h->capacity - 1;
    r->cached_tail = atomic_load_explicit(&h->tail, memory_order_acquire);
    r->cursor = r->released = r->cached_tail;
    r->id = h->id;
    const char *skew = getenv("PPRUN_TEST_CLOCK_SKEW_NS");
    if (skew && *skew) r->skew_ns = strtoll(skew, NULL, 10);
    *out = r;
    return 0;
}

int trace_ring_writer(const trace_ring *ring) {
    return atomic_load_explicit(&ring->hdr->writer, memory_order_acquire);
}

int trace_ring_claim(trace_ring *ring, int pid) {
    _Atomic int32_t *writer = &ring->hdr->writer;
    int32_t cur = atomic_load_explicit(writer, memory_order_acquire);
    for (;;) {
        if (cur == pid) return 0;
        /* EPERM: there, another user's */
        if (cur > 0 && (kill(cur, 0) == 0 || errno != ESRCH)) return cur;
        if (atomic_compare_exchange_weak_explicit(writer, &cur, pid, memory_order_acq_rel, memory_order_acquire))
            return 0;
    }
}

int trace_ring_write(trace_ring *ring, const trace_event *ev) {
    ring_header *h = ring->hdr;
    /* Only this process writes head, so a relaxed load sees its own value. */
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    if (head - ring->cached_tail > ring->mask) {
        ring->cached_tail = atomic_load_explicit(&h->tail, memory_order_acquire);
        if (head - ring->cached_tail > ring->mask) {
            atomic_store_explicit(&h->dropped, atomic_load_explicit(&h->dropped, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            return 0;
        }
    }
    trace_event *slot = &ring->slots[head & ring->mask];
    memcpy(slot, ev, sizeof *slot);
    if (ring->skew_ns && slot->phase != TRACE_KERNEL_NAME) { /* a name record's bytes there are text */
        slot->start_ns += (uint64_t)ring->skew_ns;
        slot->end_ns += (uint64_t)ring->skew_ns;
    }
    atomic_store_explicit(&h->head, head + 1, memory_order_release);
    return 1;
}

void trace_ring_count_dropped(trace_ring *ring, uint64_t n) {
    ring_header *h = ring->hdr; /* only this process writes `dropped`, as in trace_ring_write */
    uint64_t d = atomic_load_explicit(&h->dropped, memory_order_relaxed);
    d = d > (uint64_t)INT64_MAX || n > (uint64_t)INT64_MAX - d ? (uint64_t)INT64_MAX : d + n;
    atomic_store_explicit(&h->dropped, d, memory_order_relaxed);
}

/* Disables the ring: from now on it reads nothing and its drop count
 * stays where it is, plus the records the header claims were unread (at
 * least one, at most a ring's worth: how many is what was corrupted). */
static void ring_disable(trace_ring *ring, uint64_t head, const char *why) {
    uint64_t claimed = head - ring->cursor, cap = ring->mask + 1;
    uint64_t lost = claimed == 0 ? 1 : claimed > cap ? cap : claimed;
    uint64_t said = atomic_load_explicit(&ring->hdr->dropped, memory_order_relaxed); /* the producer's: any value */
    ring->dropped_at_fault = said > UINT64_MAX - lost ? UINT64_MAX : said + lost;
    snprintf(ring->fault, sizeof ring->fault, "its header says head %llu with tail %llu and %llu slots: %s",
             (unsigned long long)head, (unsigned long long)ring->released, (unsigned long long)cap, why);
}

/* The producer's head, or -1 (the ring disabled) when no producer could
 * have written it: it only moves forward, from what was read, and never
 * more than a ring's worth past the tail this consumer published. */
static int ring_head(trace_ring *ring, uint64_t *head_out) {
    if (ring->fault[0]) return -1;
    uint64_t head = atomic_load_explicit(&ring->hdr->head, memory_order_acquire);
    if ((int64_t)(ring->cursor - head) > 0) /* tail - 1 is behind, not 2^64 - 1 records ahead */
        ring_disable(ring, head, "head moved back past records already read");
    else if (head - ring->released > ring->mask + 1)
        ring_disable(ring, head, "more records pending than the ring holds");
    if (ring->fault[0]) return -1;
    *head_out = head;
    return 0;
}

size_t trace_ring_peek(trace_ring *ring, trace_event *dst, size_t max) {
    uint64_t head;
    if (ring_head(ring, &head) != 0) return 0;
    uint64_t from = ring->cursor;
    size_t n = head - from < max ? (size_t)(head - from) : max;
    for (size_t i = 0; i < n;) {
        uint64_t idx = (from + i) & ring->mask;
        size_t run = (size_t)(ring->mask + 1 - idx); /* contiguous until the wrap */
        if (run > n - i) run = n - i;
        memcpy(dst + i, &ring->slots[idx], run * sizeof *dst);
        i += run;
    }
    ring->cursor = from + n;
    return n;
}

void trace_ring_release(trace_ring *ring) {
    ring->released = ring->cursor;
    atomic_store_explicit(&ring->hdr->tail, ring->cursor, memory_order_release);
}

size_t trace_ring_read(trace_ring *ring, trace_event *dst, size_t max) {
    size_t n = trace_ring_peek(ring, dst, max);
    trace_ring_release(ring);
    return n;
}

const char *trace_ring_fault(const trace_ring *ring) { return ring->fault[0] ? ring->fault : NULL; }

uint64_t trace_ring_id(const trace_ring *ring) { return ring->id; }

void trace_fd_identity(int fd, char *out, size_t n) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        if (n) out[0] = '\0';
        return;
    }
    snprintf(out, n, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
}

int trace_fd_is_ring(int fd, const char *identity) {
    if (!identity) return 1;
    char mine[48];
    trace_fd_identity(fd, mine, sizeof mine);
    return mine[0] && strcmp(mine, identity) == 0;
}
uint64_t trace_ring_position(const trace_ring *ring) { return ring->cursor; }

void trace_ring_skip_to(trace_ring *ring, uint64_t pos) {
    uint64_t head;
    if (ring_head(ring, &head) != 0) return;
    /* only forward, and never past what was written */
    if (pos - ring->cursor <= head - ring->cursor) ring->cursor = pos;
    trace_ring_release(ring);
}

size_t trace_ring_pending(const trace_ring *ring) {
    if (ring->fault[0]) return 0;
    uint64_t tail = atomic_load_explicit(&ring->hdr->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->hdr->head, memory_order_acquire);
    /* the producer's side: its cursor stays where it attached */
    uint64_t from = ring->cursor - tail <= head - tail ? ring->cursor : tail;
    uint64_t pending = head - from;
    return pending <= ring->mask + 1 ? (size_t)pending : 0; /* a corrupt head: the consumer's next peek says so */
}

size_t trace_ring_capacity(const trace_ring *ring) { return (size_t)(ring->mask + 1); }

uint64_t trace_ring_dropped(const trace_ring *ring) {
    if (ring->fault[0]) return ring->dropped_at_fault;
    return atomic_load_explicit(&ring->hdr->dropped, memory_order_relaxed);
}

void trace_ring_close(trace_ring *ring) {
    if (!ring) return;
    munmap(ring->hdr, ring->map_bytes);
    if (ring->owns_fd) close(ring->fd);
    free(ring);
}
