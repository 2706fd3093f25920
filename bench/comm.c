/* bench/comm.c: the transports beside what they compete with, in one run
 * (docs/comm.md, "Benchmark").
 *
 * Two processes on this machine. Every figure is a ratio of two things
 * measured side by side, in turns (A B A B ...), so that both see the same
 * load on a shared machine; each is the median over the rounds.
 *  1. Bandwidth, 4 KiB to 64 MiB, over shm (and tcp): a stream of sends of
 *     one size (one ack at the end), and one message at a time (the
 *     receiver waits for each, as a pipeline stage waits for its input),
 *     against memcpy of the same bytes in one process, timed by rank 0
 *     between the rounds; and, for the machine's ceiling, a bare ring in
 *     shared memory between the same two processes (spinning, no
 *     protocol) with two copies (in and out, as any ring behind comm's API)
 *     and with one (the reader touches every cache line in place, as a
 *     hand-over of ring slots at best would).
 *  2. Latency: 8-byte ping-pong (half the round trip) over shm (and tcp)
 *     against a pipe between the same two processes, rounds in turn.
 *  3. CPU time while waiting: the two processes' CPU time over the wall
 *     time (1.00 = one core busy) during those ping-pongs, and the
 *     receiver's during a wait of 1 ms for every message (a stage waiting
 *     for its neighbour's compute): a receive that spins shows up here.
 *
 *   ./build/bench_comm [--total-mib N] [--rounds R] [--transports shm|tcp|shm,tcp]
 *   (MiB streamed per size and round, default 64; rounds, default 5) */
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/shx.h"
#include "runner/comm/comm.h"

enum { NSIZES = 7, PINGS = 2000, WAITS = 100, MAX_ROUNDS = 15 };
static const size_t sizes[NSIZES] = {4u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};

/* ---- what the two processes share: the exchange, the results ------------ */
typedef struct shared {
    shx x;
    int rounds;
    size_t total;
    struct bare_ring *ring;
    /* per size and round, GB/s (rank 0): the stream, one message at a
     * time, the bare ring with two copies and with one, memcpy */
    double stream[NSIZES][MAX_ROUNDS], lone[NSIZES][MAX_ROUNDS], bare2[NSIZES][MAX_ROUNDS],
        bare1[NSIZES][MAX_ROUNDS], copy[NSIZES][MAX_ROUNDS];
    /* per round: us per half round trip, and CPU ns of each rank */
    double lat_pipe[MAX_ROUNDS], lat_comm[MAX_ROUNDS];
    double wall_pipe[MAX_ROUNDS], wall_comm[MAX_ROUNDS];
    double cpu_pipe[2][MAX_ROUNDS], cpu_comm[2][MAX_ROUNDS];
    /* the slow sender: receiver's CPU ns and wall ns, pipe then comm */
    double wait_cpu[2], wait_wall[2];
} shared;

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double s[MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static size_t iters(size_t size, size_t total) {
    size_t n = total / size;
    return n < 4 ? 4 : n;
}

/* memcpy of n x size bytes between two buffers of this process: GB/s. */
static double memcpy_gbps(unsigned char *a, unsigned char *b, size_t size, size_t n) {
    uint64_t t0 = pp_now_ns();
    for (size_t i = 0; i < n; i++) {
        a[i % size] = (unsigned char)i; /* keep the copies from being merged */
        memcpy(b, a, size);
        __asm__ volatile("" ::"r"(b) : "memory");
    }
    return (double)(n * size) / (double)(pp_now_ns() - t0);
}

/* ---- 1. bandwidth -------------------------------------------------------- */

/* The machine's ceiling, in the same run: a bare ring in shared memory
 * (RING_BYTES, set up before fork), spinning, no protocol, rank 0 writing
 * and rank 1 reading `bytes`; with two copies (in, out: what any transport
 * through a ring does with comm's API) or one (rank 1 reads every cache
 * line in place: what handing ring slots over would at best do). GB/s. */
enum { RING_BYTES = 4 << 20, RING_PIECE = 256 << 10 };
typedef struct bare_ring {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) unsigned char data[RING_BYTES];
} bare_ring;

static double bare_stream(bare_ring *r, int rank, unsigned char *buf, size_t size, size_t bytes, int copies) {
    uint64_t t0 = pp_now_ns(), done = 0;
    _Atomic uint64_t *mine = rank == 0 ? &r->head : &r->tail, *theirs = rank == 0 ? &r->tail : &r->head;
    unsigned sum = 0;
    while (done < bytes) {
        uint64_t other = atomic_load(theirs), room = rank == 0 ? RING_BYTES - (done - other) : other - done;
        size_t off = done % RING_BYTES, k = RING_PIECE;
        if (k > bytes - done) k = (size_t)(bytes - done);
        if (k > RING_BYTES - off) k = RING_BYTES - off;
        if (k > room) {
            sched_yield();
            continue;
        }
        size_t at = done % size; /* where in the message: a piece never spans two */
        if (k > size - at) k = size - at;
        if (rank == 0)
            memcpy(r->data + off, buf + at, k);
        else if (copies == 2)
            memcpy(buf + at, r->data + off, k);
        else
            for (size_t i = 0; i < k; i += 64) sum += r->data[off + i];
        done += k;
        atomic_store(mine, done);
    }
    while (rank == 0 && atomic_load(&r->tail) < bytes) sched_yield(); /* until all is read */
    buf[0] = (unsigned char)sum;
    return (double)bytes / (double)(pp_now_ns() - t0);
}

/* Both ranks here before either goes on. */
static int barrier(comm *c, int rank, pp_err *err) {
    uint64_t tag = comm_tag(0, 1, 0, COMM_DIR_CTRL);
    return rank == 0 ? (comm_send(c, 1, tag, NULL, 0, err) || comm_recv(c, 1, tag, NULL, 0, 60000, err) ? -1 : 0)
                     : (comm_recv(c, 0, tag, NULL, 0, 60000, err) || comm_send(c, 0, tag, NULL, 0, err) ? -1 : 0);
}

static int bandwidth(comm *c, int rank, shared *sh, pp_err *err) {
    size_t big = sizes[NSIZES - 1];
    unsigned char *buf = malloc(big), *a = malloc(big), *b = malloc(big);
    int rc = -1;
    if (!buf || !a || !b) {
        pp_fail(err, "out of memory");
        goto out;
    }
    memset(buf, 1, big), memset(a, 1, big), memset(b, 2, big);
    int peer = 1 - rank;
    uint64_t ack = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    for (int s = 0; s < NSIZES; s++) {
        size_t n = iters(sizes[s], sh->total);
        for (int round = 0; round <= sh->rounds; round++) { /* round 0 warms up */
            size_t k = round ? n : 2;
            /* A stream: sends back to back, one ack at the end. */
            uint64_t t0 = pp_now_ns();
            for (size_t i = 0; i < k; i++) {
                uint64_t tag = comm_tag((uint64_t)round, (uint64_t)s, i, COMM_DIR_ACT);
                if ((rank == 0 ? comm_send(c, peer, tag, buf, sizes[s], err)
                               : comm_recv(c, peer, tag, buf, sizes[s], 60000, err)) < 0)
                    goto out;
            }
            if ((rank == 0 ? comm_recv(c, peer, ack, NULL, 0, 60000, err) : comm_send(c, peer, ack, NULL, 0, err)) < 0)
                goto out;
            double stream = (double)(k * sizes[s]) / (double)(pp_now_ns() - t0);
            /* One at a time: the receiver waits for each message, as a
             * pipeline stage waits for its input (an 8-byte ack back). */
            size_t k1 = k < 64 ? k : 64;
            t0 = pp_now_ns();
            for (size_t i = 0; i < k1; i++) {
                uint64_t tag = comm_tag((uint64_t)round, (uint64_t)s, i, COMM_DIR_GRAD);
                if ((rank == 0 ? comm_send(c, peer, tag, buf, sizes[s], err) || comm_recv(c, peer, ack, a, 8, 60000, err)
                               : comm_recv(c, peer, tag, buf, sizes[s], 60000, err) || comm_send(c, peer, ack, a, 8, err)))
                    goto out;
            }
            double lone = (double)(k1 * sizes[s]) / (double)(pp_now_ns() - t0);
            double bare[2];
            for (int copies = 2; copies >= 1; copies--) {
                if (rank == 0) atomic_store(&sh->ring->head, 0), atomic_store(&sh->ring->tail, 0);
                if (barrier(c, rank, err) < 0) goto out;
                bare[copies - 1] = bare_stream(sh->ring, rank, buf, sizes[s], k * sizes[s], copies);
                if (barrier(c, rank, err) < 0) goto out;
            }
            double two = bare[1], one = bare[0];
            if (rank == 0 && round) { /* the peer waits for the next round meanwhile */
                int r = round - 1;
                sh->stream[s][r] = stream;
                sh->lone[s][r] = lone;
                sh->bare2[s][r] = two;
                sh->bare1[s][r] = one;
                sh->copy[s][r] = memcpy_gbps(a, b, sizes[s], k);
            }
        }
    }
    rc = 0;
out:
    free(buf), free(a), free(b);
    return rc;
}

/* ---- 2 and 3. latency, and CPU while waiting ------------------------------ */
typedef struct pipes {
    int ab[2], ba[2]; /* rank 0 -> 1, 1 -> 0 */
} pipes;

static int ping_comm(comm *c, int rank, int n, pp_err *err) {
    char b[8] = {0};
    uint64_t ping = comm_tag(1, 0, 0, COMM_DIR_CTRL);
    for (int i = 0; i < n; i++) {
        int rc = rank == 0 ? (comm_send(c, 1, ping, b, 8, err) || comm_recv(c, 1, ping, b, 8, 60000, err))
                           : (comm_recv(c, 0, ping, b, 8, 60000, err) || comm_send(c, 0, ping, b, 8, err));
        if (rc) return -1;
    }
    return 0;
}

static int ping_pipe(const pipes *pp, int rank, int n, pp_err *err) {
    char b[8] = {0};
    for (int i = 0; i < n; i++) {
        int ok = rank == 0 ? write(pp->ab[1], b, 8) == 8 && read(pp->ba[0], b, 8) == 8
                           : read(pp->ab[0], b, 8) == 8 && write(pp->ba[1], b, 8) == 8;
        if (!ok) return pp_fail(err, "pipe ping-pong failed");
    }
    return 0;
}

static int latency(comm *c, int rank, const pipes *pp, shared *sh, pp_err *err) {
    for (int round = 0; round <= sh->rounds; round++) { /* round 0 warms up */
        int n = round ? PINGS : 200;
        for (int kind = 0; kind < 2; kind++) { /* pipe, then comm */
            double cpu0 = cpu_ns();
            uint64_t t0 = pp_now_ns();
            if ((kind == 0 ? ping_pipe(pp, rank, n, err) : ping_comm(c, rank, n, err)) < 0) return -1;
            double wall = (double)(pp_now_ns() - t0), cpu = cpu_ns() - cpu0;
            if (!round) continue;
            (kind == 0 ? sh->cpu_pipe : sh->cpu_comm)[rank][round - 1] = cpu;
            if (rank != 0) continue;
            (kind == 0 ? sh->wall_pipe : sh->wall_comm)[round - 1] = wall;
            (kind == 0 ? sh->lat_pipe : sh->lat_comm)[round - 1] = wall / n / 2 / 1000.0;
        }
    }
    /* The slow sender: a message every ms; the receiver's CPU meanwhile. */
    uint64_t tag = comm_tag(2, 0, 0, COMM_DIR_CTRL);
    char b[8] = {0};
    for (int kind = 0; kind < 2; kind++) {
        double cpu0 = cpu_ns();
        uint64_t t0 = pp_now_ns();
        for (int i = 0; i < WAITS; i++) {
            int ok;
            if (rank == 0) {
                pp_sleep_ns(1000000);
                ok = kind == 0 ? write(pp->ab[1], b, 8) == 8 : comm_send(c, 1, tag, b, 8, err) == 0;
            } else {
                ok = kind == 0 ? read(pp->ab[0], b, 8) == 8 : comm_recv(c, 0, tag, b, 8, 60000, err) == 0;
            }
            if (!ok) return kind == 0 ? pp_fail(err, "pipe failed") : -1;
        }
        if (rank == 1) {
            sh->wait_cpu[kind] = cpu_ns() - cpu0;
            sh->wait_wall[kind] = (double)(pp_now_ns() - t0);
        }
    }
    return 0;
}

/* ---- one transport: two processes ---------------------------------------- */
static int run_pair(const char *transport, shared *sh, int phase) {
    pipes pp;
    if (pipe(pp.ab) || pipe(pp.ba)) return -1;
    memset(&sh->x, 0, sizeof sh->x);
    char key[64];
    snprintf(key, sizeof key, "bench-%d-%s-%d", (int)getpid(), transport, phase);
    fflush(NULL);
    pid_t child = fork();
    int rank = child == 0 ? 1 : 0;
    comm_config cfg = {.rank = rank, .world = 2, .job_key = key,
                       .exchange = {.ctx = &sh->x, .put = shx_put, .get = shx_get},
                       .connect_timeout_ms = 10000, .transport = transport};
    comm *c;
    pp_err err;
    int rc = comm_open(&cfg, &c, &err);
    if (rc == 0) {
        rc = phase == 0 ? bandwidth(c, rank, sh, &err) : latency(c, rank, &pp, sh, &err);
        if (rc == 0) rc = comm_flush(c, 60000, &err);
        comm_close(c);
    }
    if (rc < 0) fprintf(stderr, "bench_comm: %s rank %d: %s\n", transport, rank, err.msg);
    if (child == 0) _exit(rc ? 1 : 0);
    int st;
    waitpid(child, &st, 0);
    comm_cleanup(key);
    close(pp.ab[0]), close(pp.ab[1]), close(pp.ba[0]), close(pp.ba[1]);
    return rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void print_bandwidth(const char *transport, const shared *sh) {
    int n = sh->rounds;
    printf("\n## bandwidth, %s: %zu MiB per size, in turn: a stream, one message at a time, a bare ring (two "
           "copies, one), memcpy (median of %d)\n\n", transport, sh->total >> 20, n);
    printf("| size | memcpy GB/s | stream GB/s | stream / memcpy | one at a time / memcpy | bare ring, 2 copies / "
           "memcpy | bare ring, 1 copy / memcpy | stream / bare ring, 2 copies |\n|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < NSIZES; s++) {
        double r_stream[MAX_ROUNDS], r_lone[MAX_ROUNDS], r_two[MAX_ROUNDS], r_one[MAX_ROUNDS], r_bare[MAX_ROUNDS];
        for (int r = 0; r < n; r++) {
            r_stream[r] = sh->stream[s][r] / sh->copy[s][r];
            r_lone[r] = sh->lone[s][r] / sh->copy[s][r];
            r_two[r] = sh->bare2[s][r] / sh->copy[s][r];
            r_one[r] = sh->bare1[s][r] / sh->copy[s][r];
            r_bare[r] = sh->stream[s][r] / sh->bare2[s][r];
        }
        char sz[32];
        if (sizes[s] >= (1u << 20))
            snprintf(sz, sizeof sz, "%zu MiB", sizes[s] >> 20);
        else
            snprintf(sz, sizeof sz, "%zu KiB", sizes[s] >> 10);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", sz, median(sh->copy[s], n),
               median(sh->stream[s], n), median(r_stream, n), median(r_lone, n), median(r_two, n), median(r_one, n),
               median(r_bare, n));
    }
    printf("(goal for the stream from 256 KiB on: 0.50 of memcpy)\n");
}

static void print_latency(const char *transport, const shared *sh) {
    int n = sh->rounds;
    double ratio[MAX_ROUNDS], cpu_p[MAX_ROUNDS], cpu_c[MAX_ROUNDS];
    for (int r = 0; r < n; r++) {
        ratio[r] = sh->lat_comm[r] / sh->lat_pipe[r];
        cpu_p[r] = (sh->cpu_pipe[0][r] + sh->cpu_pipe[1][r]) / sh->wall_pipe[r];
        cpu_c[r] = (sh->cpu_comm[0][r] + sh->cpu_comm[1][r]) / sh->wall_comm[r];
    }
    printf("\n## latency, %s: 8-byte ping-pong, half the round trip, %d in turn with a pipe (median of %d)\n\n",
           transport, PINGS, n);
    printf("| pipe us | %s us | %s / pipe (goal <= 1) | CPU of both, pipe | CPU of both, %s |\n", transport,
           transport, transport);
    printf("|---|---|---|---|---|\n| %.2f | %.2f | %.2f | %.2f | %.2f |\n", median(sh->lat_pipe, n),
           median(sh->lat_comm, n), median(ratio, n), median(cpu_p, n), median(cpu_c, n));
    printf("(CPU: CPU seconds of the two processes per second of wall time; 1.00 is one core busy)\n");
    printf("\nreceiver waiting 1 ms for each of %d messages: CPU ms per s of wall, pipe %.2f, %s %.2f\n", WAITS,
           sh->wait_cpu[0] / sh->wait_wall[0] * 1000, transport, sh->wait_cpu[1] / sh->wait_wall[1] * 1000);
}

int main(int argc, char **argv) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    sh->ring = mmap(NULL, sizeof *sh->ring, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh->ring == MAP_FAILED) return 1;
    sh->total = 64u << 20;
    sh->rounds = 5;
    const char *transports = "shm,tcp";
    for (int i = 1; i < argc; i++) {
        long v;
        pp_err err;
        if (!strcmp(argv[i], "--total-mib") && i + 1 < argc) {
            if (pp_parse_long(argv[++i], 1, 1 << 16, "--total-mib", &v, &err) < 0) goto bad;
            sh->total = (size_t)v << 20;
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            if (pp_parse_long(argv[++i], 1, MAX_ROUNDS, "--rounds", &v, &err) < 0) goto bad;
            sh->rounds = (int)v;
        } else if (!strcmp(argv[i], "--transports") && i + 1 < argc) {
            transports = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_comm [--total-mib N] [--rounds R] [--transports shm|tcp|shm,tcp]\n");
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "bench_comm: %s\n", err.msg);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    printf("# bench_comm: two processes, %ld cores\n", sysconf(_SC_NPROCESSORS_ONLN));
    const char *names[2] = {"shm", "tcp"};
    for (int t = 0; t < 2; t++) {
        if (!strstr(transports, names[t])) continue;
        if (run_pair(names[t], sh, 0) < 0) return 1;
        print_bandwidth(names[t], sh);
        if (run_pair(names[t], sh, 1) < 0) return 1;
        print_latency(names[t], sh);
    }
    return 0;
}
