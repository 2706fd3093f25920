/* bench/web.c: requests per second and p50/p99 latency of timeline windows
 * over a 10-million-event trace database, with a load generator (a pool of
 * client threads over real sockets) beside the in-process server.
 *
 *   bench_web [EVENTS] [SECONDS_PER_ROW] [CLIENT_THREADS] [RANKS]
 *
 * The database is generated once into /tmp/pprun-bench-web-EVENTS[-RANKS].db
 * (real schema, 4 ranks unless RANKS, 32 microbatches, 1F1B-like timing)
 * and reused. The window route asks each rank's rows apart (web/routes_timeline.c),
 * so at 1,024 ranks a window costs some 3,000 index seeks before a row. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "db/db.h"
#include "web/http.h"

static int nranks = 4; /* the job's ranks: fixed once main has read its arguments */
#define MB 32
#define U 100000ll /* 100 us per op */

static long events_per_step(void) { return nranks * (3 * MB + 1) + 2 * (nranks - 1) * 2 * MB; }

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    s[n] = 0;
    fclose(f);
    return s;
}

static int generate(const char *path, long target, long *steps_out) {
    long steps = (target + events_per_step() - 1) / events_per_step();
    *steps_out = steps;
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK) return -1;
    sqlite3_stmt *chk;
    long have = 0;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM events", -1, &chk, NULL) == SQLITE_OK && sqlite3_step(chk) == SQLITE_ROW)
        have = sqlite3_column_int64(chk, 0);
    sqlite3_finalize(chk);
    if (have >= target) {
        sqlite3_close(db);
        fprintf(stderr, "bench_web: reusing %s (%ld events)\n", path, have);
        return 0;
    }
    sqlite3_close(db);
    unlink(path);
    if (sqlite3_open(path, &db) != SQLITE_OK) return -1;
    char *schema = read_all(PPRUN_SOURCE_DIR "/db/schema.sql");
    if (!schema) return -1;
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;", NULL, NULL, NULL);
    if (sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK) return -1;
    free(schema);
    /* a pprun database: readers check the version (db_check_version) */
    char version[64];
    snprintf(version, sizeof version, "PRAGMA user_version = %d", DB_SCHEMA_VERSION);
    sqlite3_exec(db, version, NULL, NULL, NULL);
    char job[512];
    snprintf(job, sizeof job,
             "INSERT INTO jobs(id,name,created_at,status,nnodes,world_size,schedule,microbatches,virtual_stages,"
             "stages,steps,model,device,config_json,t0_ns) VALUES(1,'bench','2026-01-01T00:00:00Z','succeeded',1,%d,"
             "'1f1b',32,1,%d,0,'timed','cpu','{}',0)",
             nranks, nranks);
    sqlite3_exec(db, job, NULL, NULL, NULL);
    sqlite3_stmt *ev, *ss;
    sqlite3_prepare_v2(db, "INSERT INTO events(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,peer,bytes,source) VALUES(1,0,?,?,?,?,?,?,?,?,?,'cpu')", -1, &ev, NULL);
    sqlite3_prepare_v2(db, "INSERT INTO step_stats(job_id,step,rank,start_ns,end_ns,busy_ns,bubble_ns,bubble_ratio) VALUES(1,?,?,?,?,?,?,?)", -1, &ss, NULL);
    fprintf(stderr, "bench_web: generating %ld steps (%ld events) into %s ...\n", steps, steps * events_per_step(), path);
    const long step_len = (3 * MB + nranks + 2) * U;
    sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    static const char *ph[] = {"F", "B", "W"};
    for (long s = 0; s < steps; s++) {
        long long base = s * step_len;
        for (int r = 0; r < nranks; r++) {
            for (int k = 0; k < 3 * MB; k++) {
                long long t = base + (r + k) * U;
                int mb = k / 3, p = k % 3;
                sqlite3_reset(ev);
                sqlite3_bind_int(ev, 1, r); sqlite3_bind_int64(ev, 2, s); sqlite3_bind_int(ev, 3, mb);
                sqlite3_bind_int(ev, 4, r); sqlite3_bind_text(ev, 5, ph[p], 1, SQLITE_STATIC);
                sqlite3_bind_int64(ev, 6, t); sqlite3_bind_int64(ev, 7, t + U * 9 / 10);
                sqlite3_bind_null(ev, 8); sqlite3_bind_null(ev, 9);
                sqlite3_step(ev);
                /* sends and receives around F (downstream) and B (upstream) */
                if ((p == 0 && r < nranks - 1) || (p == 1 && r > 0)) {
                    const char *names[2][2] = {{"SEND_F", "RECV_F"}, {"SEND_B", "RECV_B"}};
                    for (int d = 0; d < 2; d++) {
                        int rank = d == 0 ? r : (p == 0 ? r + 1 : r - 1);
                        sqlite3_reset(ev);
                        sqlite3_bind_int(ev, 1, rank); sqlite3_bind_int64(ev, 2, s); sqlite3_bind_int(ev, 3, mb);
                        sqlite3_bind_int(ev, 4, rank); sqlite3_bind_text(ev, 5, names[p][d], -1, SQLITE_STATIC);
                        sqlite3_bind_int64(ev, 6, t + U * 9 / 10); sqlite3_bind_int64(ev, 7, t + U);
                        sqlite3_bind_int(ev, 8, d == 0 ? (p == 0 ? r + 1 : r - 1) : r); sqlite3_bind_int64(ev, 9, 65536);
                        sqlite3_step(ev);
                    }
                }
            }
            long long ot = base + (3 * MB + nranks) * U;
            sqlite3_reset(ev);
            sqlite3_bind_int(ev, 1, r); sqlite3_bind_int64(ev, 2, s); sqlite3_bind_null(ev, 3); sqlite3_bind_null(ev, 4);
            sqlite3_bind_text(ev, 5, "OPT", 3, SQLITE_STATIC); sqlite3_bind_int64(ev, 6, ot); sqlite3_bind_int64(ev, 7, ot + U);
            sqlite3_bind_null(ev, 8); sqlite3_bind_null(ev, 9);
            sqlite3_step(ev);
            sqlite3_reset(ss);
            long long span = (3 * MB + nranks + 1) * U, busy = 3 * MB * U * 9 / 10 + U;
            sqlite3_bind_int64(ss, 1, s); sqlite3_bind_int(ss, 2, r); sqlite3_bind_int64(ss, 3, base);
            sqlite3_bind_int64(ss, 4, base + span); sqlite3_bind_int64(ss, 5, busy); sqlite3_bind_int64(ss, 6, span - busy);
            sqlite3_bind_double(ss, 7, (double)(span - busy) / span);
            sqlite3_step(ss);
        }
        if (s % 2000 == 1999) {
            sqlite3_exec(db, "COMMIT; BEGIN", NULL, NULL, NULL);
            fprintf(stderr, "  %ld/%ld steps\n", s + 1, steps);
        }
    }
    /* The rows went in by SQL, not through db_insert_events and the
     * analyses: their runs (schema.sql's event_runs) and the steps' totals
     * from them, as the migrations make them. */
    sqlite3_exec(db,
                 "COMMIT; BEGIN; DELETE FROM event_runs;" DB_EVENT_RUNS_OF_ROWS ";" DB_STEP_TOTALS_OF_ROWS "; COMMIT",
                 NULL, NULL, NULL);
    sqlite3_finalize(ev);
    sqlite3_finalize(ss);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    sqlite3_close(db);
    return 0;
}

typedef struct scenario {
    const char *name;
    int kind; /* 0 one step, 1 three steps, 2 1% of the job, 3 whole job, 4 0.4% */
} scenario;

static int port;
static long nsteps;
static long long step_len;

typedef struct worker {
    char mode[16];
    int kind;
    unsigned seed;
    double *lat;
    long n, cap;
    long bytes, fails;
    double seconds;
} worker;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static __thread char last_mode[16];

static long get(const char *path, long *bytes) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
    if (send(fd, req, (size_t)n, 0) != n) {
        close(fd);
        return -1;
    }
    static __thread char buf[1 << 16];
    long total = 0;
    int status = 0;
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) {
        if (total == 0) {
            sscanf(buf, "HTTP/1.1 %d", &status);
            const char *m = memmem(buf, (size_t)k, "\"mode\":\"", 8);
            if (m) sscanf(m + 8, "%15[a-z]", last_mode);
        }
        total += k;
    }
    close(fd);
    *bytes += total;
    return status == 200 ? 0 : -1;
}

static void *run_worker(void *arg) {
    worker *w = arg;
    char path[256];
    double end = now_s() + w->seconds;
    while (now_s() < end) {
        long s = rand_r(&w->seed) % nsteps;
        long long from = s * step_len;
        switch (w->kind) {
        case 0: snprintf(path, sizeof path, "/api/jobs/1/events?step=%ld", s); break;
        case 1: snprintf(path, sizeof path, "/api/jobs/1/events?from=%lld&to=%lld", from, from + 3 * step_len); break;
        case 2:
        case 4: {
            long long span = nsteps * step_len / (w->kind == 2 ? 100 : 250);
            long long f = (long long)((double)rand_r(&w->seed) / RAND_MAX * (nsteps * step_len - span));
            snprintf(path, sizeof path, "/api/jobs/1/events?from=%lld&to=%lld&buckets=1500", f, f + span);
            break;
        }
        default: snprintf(path, sizeof path, "/api/jobs/1/events?buckets=1500"); break;
        }
        double t = now_s();
        if (get(path, &w->bytes) != 0) w->fails++;
        if (w->n == w->cap) w->lat = realloc(w->lat, (size_t)(w->cap = w->cap ? w->cap * 2 : 4096) * sizeof *w->lat);
        w->lat[w->n++] = now_s() - t;
    }
    memcpy(w->mode, last_mode, sizeof w->mode);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    long target = argc > 1 ? atol(argv[1]) : 10000000;
    double secs = argc > 2 ? atof(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 4;
    if (argc > 4) nranks = atoi(argv[4]);
    if (nranks < 2 || nranks > 65536) {
        fprintf(stderr, "bench_web: RANKS must be 2..65536\n");
        return 1;
    }
    char path[256];
    if (nranks == 4) snprintf(path, sizeof path, "/tmp/pprun-bench-web-%ld.db", target);
    else snprintf(path, sizeof path, "/tmp/pprun-bench-web-%ld-%d.db", target, nranks);
    if (generate(path, target, &nsteps) != 0) {
        fprintf(stderr, "bench_web: cannot generate %s\n", path);
        return 1;
    }
    step_len = (3 * MB + nranks + 2) * U;
    http_server *srv;
    pp_err err;
    http_options o = {.listen = "127.0.0.1:0", .db_path = path};
    if (http_start(&o, &srv, &err) != 0) {
        fprintf(stderr, "bench_web: %s\n", err.msg);
        return 1;
    }
    port = http_port(srv);
    printf("timeline windows over %ld events (%ld steps, %d ranks), %d client threads, %.0f s each, "
           "server: 4 threads\n",
           nsteps * events_per_step(), nsteps, nranks, threads, secs);
    printf("%-22s %-8s %10s %10s %10s %12s %6s\n", "window", "mode", "req/s", "p50 ms", "p99 ms", "bytes/resp", "fails");
    scenario sc[] = {{"one step", 0}, {"three steps", 1}, {"0.4% of the job", 4}, {"1% of the job", 2},
                     {"whole job", 3}};
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        worker *w = calloc((size_t)threads, sizeof *w);
        pthread_t *t = calloc((size_t)threads, sizeof *t);
        double t0 = now_s();
        for (int k = 0; k < threads; k++) {
            w[k] = (worker){.kind = sc[i].kind, .seed = (unsigned)(k + 1) * 7919u, .seconds = secs};
            pthread_create(&t[k], NULL, run_worker, &w[k]);
        }
        long n = 0, bytes = 0, fails = 0;
        for (int k = 0; k < threads; k++) {
            pthread_join(t[k], NULL);
            n += w[k].n;
            bytes += w[k].bytes;
            fails += w[k].fails;
        }
        double el = now_s() - t0;
        double *all = malloc((size_t)(n ? n : 1) * sizeof *all);
        long m = 0;
        for (int k = 0; k < threads; k++) {
            memcpy(all + m, w[k].lat, (size_t)w[k].n * sizeof *all);
            m += w[k].n;
            free(w[k].lat);
        }
        qsort(all, (size_t)n, sizeof *all, cmp);
        printf("%-22s %-8s %10.1f %10.2f %10.2f %12ld %6ld\n", sc[i].name, w[0].mode, n / el, n ? all[n / 2] * 1e3 : 0,
               n ? all[(long)(n * 0.99)] * 1e3 : 0, n ? bytes / n : 0, fails);
        fflush(stdout);
        free(all);
        free(w);
        free(t);
    }
    http_stop(srv);
    return 0;
}
