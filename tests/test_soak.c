/* test_soak.c: `pprun serve` under load for a bounded time (~8 s) while a
 * writer appends steps, as during a job: 50 API clients in a loop over every
 * route and 10 live streams. No request may fail, the server must not
 * crash, every stream must see every new step, and the server's RSS must
 * stay flat (after warm-up) within a margin.
 *
 * Nothing here waits a fixed time for something to happen: the first step
 * is appended once every stream has its hello (its cursor is set, so a new
 * step must reach it), and the load runs for at least SECONDS and until
 * every stream has its steps, with a hang guard (HANG_GUARD_S) past which
 * the assertions below report what is missing. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/web_client.h"
#include "helpers/web_fixture.h"
#include "base/pp.h"

#define CLIENTS 50
#define STREAMS 10
#define SECONDS 8
#define STEPS_BEFORE 4
#define STEPS_ADDED 8
#define HANG_GUARD_S 60

static int port;
static atomic_int stop;
static atomic_long ok_count, fail_count;
static char fail_msg[256];
static char db[256];

static long rss_kb(int pid) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", pid);
    FILE *f = fopen(p, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void *client(void *arg) {
    long id = (long)arg;
    const char *paths[] = {"/api/jobs", "/api/jobs/1", "/api/jobs/1/events?step=1", "/api/jobs/1/events",
                           "/api/jobs/1/steps", "/api/jobs/1/gaps?step=2", "/api/jobs/1/plan", "/metrics", "/", "/app.js"};
    for (long i = id; !atomic_load(&stop); i++) {
        webclient_resp r;
        int sql = i % 11 == 10;
        int rc = sql ? webclient_request(port, "POST", "/api/sql", NULL, "{\"sql\":\"SELECT rank, count(*) FROM events GROUP BY rank\"}", &r)
                     : webclient_request(port, "GET", paths[i % 10], NULL, NULL, &r);
        if (rc == 0 && r.status == 200) atomic_fetch_add(&ok_count, 1);
        else {
            if (atomic_fetch_add(&fail_count, 1) == 0)
                snprintf(fail_msg, sizeof fail_msg, "%s -> %d %.100s", sql ? "/api/sql" : paths[i % 10], r.status, r.body ? r.body : "");
        }
        webclient_free(&r);
    }
    return NULL;
}

typedef struct stream_result {
    atomic_int hello;      /* the server's hello came: this stream is subscribed */
    atomic_int steps_seen;
    long bytes;
} stream_result;

static double now_s(void) { return (double)pp_now_ns() / 1e9; }

/* Every stream has counted at least `want` hellos (hello != 0) or steps. */
static int streams_all(stream_result *sr, int hello, int want) {
    for (int i = 0; i < STREAMS; i++)
        if (atomic_load(hello ? &sr[i].hello : &sr[i].steps_seen) < want) return 0;
    return 1;
}

static void *stream(void *arg) {
    stream_result *res = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return NULL;
    const char *req = "GET /api/jobs/1/live HTTP/1.1\r\nHost: localhost\r\n\r\n";
    send(fd, req, strlen(req), 0);
    char buf[65536], carry[32] = "", head[4096] = "";
    while (!atomic_load(&stop)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1) continue;
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n <= 0) break;
        buf[n] = 0;
        res->bytes += n;
        /* count "event: step\n" even when split across reads */
        char joined[sizeof carry + sizeof buf];
        snprintf(joined, sizeof joined, "%s%s", carry, buf);
        for (const char *q = joined; (q = strstr(q, "event: step\n")); q++) atomic_fetch_add(&res->steps_seen, 1);
        /* the hello is one message; a carry one byte shorter than the
         * step marker cannot hold it whole, so it is looked for in all
         * that came before it (the headers and the hello are small) */
        if (!atomic_load(&res->hello)) {
            size_t h = strlen(head), add = (size_t)n < sizeof head - 1 - h ? (size_t)n : sizeof head - 1 - h;
            memcpy(head + h, buf, add);
            head[h + add] = 0;
            if (strstr(head, "event: hello\n")) atomic_store(&res->hello, 1);
        }
        size_t k = strlen(joined);
        snprintf(carry, sizeof carry, "%s", joined + (k > 11 ? k - 11 : 0));
    }
    close(fd);
    return NULL;
}

Test(soak, fifty_clients_and_ten_streams_while_a_job_writes, .timeout = 120) {
    pp_err err;
    fixture_fresh(db, sizeof db, "soak", STEPS_BEFORE, "running");
#ifdef __SANITIZE_ADDRESS__
    /* ASan keeps freed memory in quarantine (256 MB): RSS would measure
     * that, not the server. A small quarantine keeps the check meaningful. */
    char opts[512];
    snprintf(opts, sizeof opts, "%s:quarantine_size_mb=1:thread_local_quarantine_size_kb=64",
             getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
    int pid = webclient_start_serve(db, NULL, &port);
    cr_assert_gt(pid, 0);
    pthread_t c[CLIENTS], s[STREAMS];
    stream_result sr[STREAMS];
    memset(sr, 0, sizeof sr);
    for (int i = 0; i < STREAMS; i++) pthread_create(&s[i], NULL, stream, &sr[i]);
    for (long i = 0; i < CLIENTS; i++) pthread_create(&c[i], NULL, client, (void *)i);
    double t0 = now_s();
    /* a step appended before a stream's hello would not be new to it */
    while (!streams_all(sr, 1, 1) && now_s() - t0 < HANG_GUARD_S) usleep(10000);
    int hellos = streams_all(sr, 1, 1);
    /* the job: a step every 0.75 s (pacing only; nothing depends on it) */
    long rss_warm = 0;
    for (int k = 0; hellos && k < STEPS_ADDED; k++) {
        usleep(750000);
        cr_assert_eq(fixture_append_steps(db, STEPS_BEFORE + k, 1, &err), 0, "%s", err.msg);
        if (k == 2) rss_warm = rss_kb(pid);
    }
    /* at least SECONDS of load, and until the streams and clients have what
     * the assertions check, or the hang guard */
    while (hellos && now_s() - t0 < HANG_GUARD_S &&
           (now_s() - t0 < SECONDS || !streams_all(sr, 0, STEPS_ADDED) || atomic_load(&ok_count) <= 1000))
        usleep(50000);
    long rss_end = rss_kb(pid);
    atomic_store(&stop, 1);
    for (int i = 0; i < CLIENTS; i++) pthread_join(c[i], NULL);
    for (int i = 0; i < STREAMS; i++) pthread_join(s[i], NULL);
    int alive = kill(pid, 0) == 0;
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    fixture_remove(db);
    cr_assert(hellos, "every stream got its hello within %d s", HANG_GUARD_S);
    cr_assert(alive, "the server survived");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "and stopped cleanly");
    cr_assert_eq(atomic_load(&fail_count), 0, "%ld failed requests, first: %s", atomic_load(&fail_count), fail_msg);
    cr_assert_gt(atomic_load(&ok_count), 1000, "the clients got answers (%ld)", atomic_load(&ok_count));
    for (int i = 0; i < STREAMS; i++)
        cr_assert_eq(atomic_load(&sr[i].steps_seen), STEPS_ADDED, "stream %d saw %d of %d new steps", i,
                     atomic_load(&sr[i].steps_seen), STEPS_ADDED);
    cr_assert(rss_warm > 0 && rss_end > 0);
    cr_assert_leq(rss_end, rss_warm + rss_warm / 4 + 8192, "RSS grew from %ld kB to %ld kB", rss_warm, rss_end);
    fprintf(stderr, "soak: %ld requests ok, RSS %ld kB -> %ld kB\n", atomic_load(&ok_count), rss_warm, rss_end);
}
