/* bench/comm.c: transport bandwidth and latency (issue 3).
 *
 * Two processes on this machine, over shm and over tcp: bandwidth for 4 KiB
 * to 64 MiB messages (a stream of sends, one ack at the end), printed beside
 * memcpy of the same size in one process, and small-message latency
 * (ping-pong, half the round trip) beside a raw pipe ping-pong.  Ratios,
 * not absolute numbers, are the point: they travel between machines.
 *
 *   ./build/bench_comm [--total-mib N]   (MiB streamed per size and round, default 128) */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner/comm/comm.h"

/* The machines this runs on are shared: each figure is the best of REPEAT. */
enum { NSIZES = 8, PINGS = 5000, REPEAT = 3 };
static const size_t sizes[NSIZES] = {4u << 10, 16u << 10, 64u << 10, 256u << 10,
                                     1u << 20, 4u << 20, 16u << 20, 64u << 20};

/* ---- an exchange in shared memory, set up before fork ------------------- */
typedef struct shx {
    _Atomic int n;
    struct {
        char key[256], val[512];
        size_t len;
        _Atomic int ready;
    } e[8];
} shx;

static int shx_put(void *ctx, const char *key, const void *v, size_t len, pp_err *err) {
    shx *x = ctx;
    int i = atomic_fetch_add(&x->n, 1);
    if (i >= 8 || len > sizeof x->e[0].val) return pp_fail(err, "bench exchange full");
    snprintf(x->e[i].key, sizeof x->e[i].key, "%s", key);
    memcpy(x->e[i].val, v, len);
    x->e[i].len = len;
    atomic_store(&x->e[i].ready, 1);
    return 0;
}

static int shx_get(void *ctx, const char *key, void *v, size_t cap, size_t *len, int timeout_ms, pp_err *err) {
    shx *x = ctx;
    uint64_t end = pp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        for (int i = 0; i < 8; i++)
            if (atomic_load(&x->e[i].ready) && !strcmp(x->e[i].key, key)) {
                *len = x->e[i].len < cap ? x->e[i].len : cap;
                memcpy(v, x->e[i].val, *len);
                return 0;
            }
        if (pp_now_ns() > end) return pp_fail(err, "bench exchange: no key %s", key);
        pp_sleep_ns(1000000);
    }
}

/* ---- one transport ---------------------------------------------------------- */
typedef struct result {
    double gbps[NSIZES];
    double lat_us;
} result;

static size_t iters(size_t size, size_t total) {
    size_t n = total / size;
    return n < 4 ? 4 : n;
}

static int run_rank(comm *c, int rank, size_t total, result *res, pp_err *err) {
    unsigned char *buf = malloc(sizes[NSIZES - 1]);
    memset(buf, 1, sizes[NSIZES - 1]);
    int peer = 1 - rank;
    uint64_t ack = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    for (int s = 0; s < NSIZES; s++) {
        size_t n = iters(sizes[s], total);
        for (int round = 0; round <= REPEAT; round++) {  /* round 0 warms up; best of the rest */
            size_t k = round ? n : 2;
            uint64_t t0 = pp_now_ns();
            for (size_t i = 0; i < k; i++) {
                uint64_t tag = comm_tag(round, (uint64_t)s, i, COMM_DIR_ACT);
                if ((rank == 0 ? comm_send(c, peer, tag, buf, sizes[s], err)
                               : comm_recv(c, peer, tag, buf, sizes[s], 60000, err)) < 0)
                    goto fail;
            }
            if ((rank == 0 ? comm_recv(c, peer, ack, NULL, 0, 60000, err) : comm_send(c, peer, ack, NULL, 0, err)) < 0)
                goto fail;
            double g = (double)(n * sizes[s]) / (double)(pp_now_ns() - t0);
            if (rank == 0 && round && g > res->gbps[s]) res->gbps[s] = g;
        }
    }
    uint64_t ping = comm_tag(1, 0, 0, COMM_DIR_CTRL);
    for (int round = 0; round < REPEAT; round++) {
        uint64_t t0 = 0;
        for (int i = 0; i < PINGS + 100; i++) {
            if (i == 100) t0 = pp_now_ns();
            if (rank == 0) {
                if (comm_send(c, peer, ping, buf, 8, err) < 0 || comm_recv(c, peer, ping, buf, 8, 60000, err) < 0)
                    goto fail;
            } else {
                if (comm_recv(c, peer, ping, buf, 8, 60000, err) < 0 || comm_send(c, peer, ping, buf, 8, err) < 0)
                    goto fail;
            }
        }
        double us = (double)(pp_now_ns() - t0) / PINGS / 2 / 1000.0;
        if (round == 0 || us < res->lat_us) res->lat_us = us;
    }
    free(buf);
    return comm_flush(c, 60000, err);
fail:
    free(buf);
    return -1;
}

static int bench_transport(const char *transport, size_t total, result *res) {
    shx *x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char key[64];
    snprintf(key, sizeof key, "bench-%d-%s", (int)getpid(), transport);
    fflush(NULL);
    pid_t child = fork();
    int rank = child == 0 ? 1 : 0;
    comm_config cfg = {.rank = rank, .world = 2, .job_key = key,
                       .exchange = {.ctx = x, .put = shx_put, .get = shx_get},
                       .connect_timeout_ms = 10000, .transport = transport};
    comm *c;
    pp_err err;
    int rc = comm_open(&cfg, &c, &err);
    if (rc == 0) {
        rc = run_rank(c, rank, total, res, &err);
        comm_close(c);
    }
    if (rc < 0) fprintf(stderr, "bench_comm: %s rank %d: %s\n", transport, rank, err.msg);
    if (child == 0) _exit(rc ? 1 : 0);
    int st;
    waitpid(child, &st, 0);
    comm_cleanup(key, 2);
    munmap(x, sizeof *x);
    return rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static double memcpy_gbps(size_t size, size_t total) {
    unsigned char *a = malloc(size), *b = malloc(size);
    memset(a, 1, size);
    memset(b, 2, size);
    size_t n = iters(size, total);
    double g = 0;
    for (int round = 0; round < REPEAT; round++) {
        uint64_t t0 = pp_now_ns();
        for (size_t i = 0; i < n; i++) {
            a[i % size] = (unsigned char)i;  /* keep the copies from being merged */
            memcpy(b, a, size);
            __asm__ volatile("" ::"r"(b) : "memory");
        }
        double r = (double)(n * size) / (double)(pp_now_ns() - t0);
        if (r > g) g = r;
    }
    free(a);
    free(b);
    return g;
}

static double pipe_latency_us(void) {
    int ab[2], ba[2];
    if (pipe(ab) || pipe(ba)) return 0;
    char b[8] = {0};
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < REPEAT * (PINGS + 100); i++)
            if (read(ab[0], b, 8) != 8 || write(ba[1], b, 8) != 8) _exit(1);
        _exit(0);
    }
    double us = 0;
    for (int round = 0; round < REPEAT; round++) {
        uint64_t t0 = 0;
        for (int i = 0; i < PINGS + 100; i++) {
            if (i == 100) t0 = pp_now_ns();
            if (write(ab[1], b, 8) != 8 || read(ba[0], b, 8) != 8) break;
        }
        double r = (double)(pp_now_ns() - t0) / PINGS / 2 / 1000.0;
        if (round == 0 || r < us) us = r;
    }
    waitpid(child, NULL, 0);
    close(ab[0]), close(ab[1]), close(ba[0]), close(ba[1]);
    return us;
}

int main(int argc, char **argv) {
    size_t total = 128u << 20;
    for (int i = 1; i < argc; i++) {
        long v;
        pp_err err;
        if (!strcmp(argv[i], "--total-mib") && i + 1 < argc) {
            if (pp_parse_long(argv[++i], 1, 1 << 16, "--total-mib", &v, &err) < 0) {
                fprintf(stderr, "bench_comm: %s\n", err.msg);
                return 2;
            }
            total = (size_t)v << 20;
        } else {
            fprintf(stderr, "usage: bench_comm [--total-mib N]\n");
            return 2;
        }
    }
    result shm = {{0}, 0}, tcp = {{0}, 0};
    if (bench_transport("shm", total, &shm) < 0 || bench_transport("tcp", total, &tcp) < 0) return 1;
    printf("comm bandwidth: two processes, %zu MiB streamed per size, best of %d (GB/s = 1e9 bytes/s)\n",
           total >> 20, REPEAT);
    printf("%10s %12s %10s %10s %10s %10s\n", "size", "memcpy GB/s", "shm GB/s", "shm/memcpy", "tcp GB/s",
           "tcp/memcpy");
    for (int s = 0; s < NSIZES; s++) {
        double m = memcpy_gbps(sizes[s], total);
        char sz[32];
        if (sizes[s] >= (1u << 20))
            snprintf(sz, sizeof sz, "%zu MiB", sizes[s] >> 20);
        else
            snprintf(sz, sizeof sz, "%zu KiB", sizes[s] >> 10);
        printf("%10s %12.2f %10.2f %10.2f %10.2f %10.2f\n", sz, m, shm.gbps[s], shm.gbps[s] / m, tcp.gbps[s],
               tcp.gbps[s] / m);
    }
    double p = pipe_latency_us();
    printf("\nlatency, 8-byte ping-pong (half round trip), best of %d x %d:\n", REPEAT, PINGS);
    printf("%10s %10s %10s %10s %10s\n", "pipe us", "shm us", "shm/pipe", "tcp us", "tcp/pipe");
    printf("%10.2f %10.2f %10.2f %10.2f %10.2f\n", p, shm.lat_us, shm.lat_us / p, tcp.lat_us, tcp.lat_us / p);
    return 0;
}
