/* test_store.c: the rendezvous store over real TCP: every operation, binary
 * values, timeouts, and 64 clients at once doing what workers do (publish
 * an address, count in, wait for everyone, read the others' values), and the
 * job token: clients without it or with a wrong one are refused and logged. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers/capture.h"
#include "runner/store/store.h"

static store_server *server;
static int port;

static void start(void) {
    pp_err err;
    cr_assert_eq(store_server_start("127.0.0.1", 0, &server, &err), 0, "%s", err.msg);
    port = store_server_port(server);
    cr_assert(port > 0);
}

static void stop(void) { store_server_stop(server); }

static store_client *client(void) {
    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
    return c;
}

TestSuite(store, .init = start, .fini = stop);

Test(store, set_get_delete_with_binary_values) {
    store_client *c = client();
    pp_err err;
    const unsigned char blob[] = {0, 1, 2, 0, 255, 'x'};
    cr_assert_eq(store_set(c, "nccl/id", blob, sizeof blob, &err), 0, "%s", err.msg);
    void *v;
    size_t len;
    cr_assert_eq(store_get(c, "nccl/id", &v, &len, &err), 0);
    cr_assert_eq(len, sizeof blob);
    cr_assert_eq(memcmp(v, blob, len), 0);
    free(v);
    cr_assert_eq(store_set(c, "nccl/id", "", 0, &err), 0, "overwrite with an empty value");
    cr_assert_eq(store_get(c, "nccl/id", &v, &len, &err), 0);
    cr_assert_eq(len, 0);
    free(v);
    cr_assert_eq(store_delete(c, "nccl/id", &err), 0);
    cr_assert_eq(store_delete(c, "nccl/id", &err), 1, "already gone");
    cr_assert_eq(store_get(c, "nccl/id", &v, &len, &err), 1, "missing key");
    cr_assert_null(v);
    store_close(c);
}

Test(store, large_values_round_trip) {
    store_client *c = client();
    pp_err err;
    size_t n = 4u << 20;
    unsigned char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 131u);
    cr_assert_eq(store_set(c, "big", big, n, &err), 0, "%s", err.msg);
    void *v;
    size_t len;
    cr_assert_eq(store_get(c, "big", &v, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(len, n);
    cr_assert_eq(memcmp(v, big, n), 0);
    free(v);
    free(big);
    store_close(c);
}

Test(store, add_is_a_counter_and_refuses_non_integers) {
    store_client *c = client();
    pp_err err;
    int64_t v;
    cr_assert_eq(store_add(c, "n", 5, &v, &err), 0);
    cr_assert_eq(v, 5);
    cr_assert_eq(store_add(c, "n", -7, &v, &err), 0);
    cr_assert_eq(v, -2);
    void *text;
    size_t len;
    cr_assert_eq(store_get(c, "n", &text, &len, &err), 0);
    cr_assert_str_eq(text, "-2");
    free(text);
    store_set(c, "s", "hello", 5, &err);
    cr_assert_eq(store_add(c, "s", 1, &v, &err), -1);
    cr_assert(strstr(err.msg, "not an integer"), "%s", err.msg);
    /* The connection still works after a refused request. */
    cr_assert_eq(store_add(c, "n", 2, &v, &err), 0);
    cr_assert_eq(v, 0);
    /* A counter that would pass 64 bits is refused and stays as it was. */
    cr_assert_eq(store_add(c, "big", INT64_MAX, &v, &err), 0);
    cr_assert_eq(store_add(c, "big", 10, &v, &err), -1);
    cr_assert(strstr(err.msg, "overflow"), "%s", err.msg);
    cr_assert_eq(store_add(c, "big", 0, &v, &err), 0);
    cr_assert_eq(v, INT64_MAX);
    store_close(c);
}

/* A timeout too long to add to the clock is forever, not an instant timeout. */
Test(store, a_huge_wait_timeout_waits) {
    store_client *a = client(), *b = client();
    pp_err err;
    const char *keys[] = {"late"};
    cr_assert_eq(store_wait_send(a, keys, 1, INT64_MAX / 2, &err), 0);
    usleep(200000);
    cr_assert_eq(store_set(b, "late", "1", 1, &err), 0);
    cr_assert_eq(store_wait_recv(a, &err), 0, "the wait ended before the key was set: %s", err.msg);
    store_close(a);
    store_close(b);
}

Test(store, wait_times_out_then_succeeds_when_another_client_sets) {
    store_client *a = client(), *b = client();
    pp_err err;
    const char *keys[] = {"x", "y"};
    cr_assert_eq(store_wait(a, keys, 2, 50, &err), 1, "nothing set yet: timeout");
    cr_assert_eq(store_set(b, "x", "1", 1, &err), 0);
    cr_assert_eq(store_wait(a, keys, 2, 50, &err), 1, "only one of two keys");
    /* Send the wait, then complete it from the other client. */
    cr_assert_eq(store_wait_send(a, keys, 2, 10000, &err), 0);
    cr_assert_eq(store_set(b, "y", "2", 1, &err), 0);
    cr_assert_eq(store_wait_recv(a, &err), 0, "%s", err.msg);
    cr_assert_eq(store_wait(a, keys, 2, 0, &err), 0, "present keys need no waiting");
    store_close(a);
    store_close(b);
}

/* A claimed key lasts as long as its connection: it wakes a WAIT on it
 * like a SET, and goes when the connection closes, however the client
 * ended (a launcher SIGKILLed: here a client that is simply closed). */
Test(store, a_claimed_key_goes_with_its_connection) {
    store_client *a = client(), *b = client();
    pp_err err;
    const char *keys[] = {"pprun/live/1"};
    cr_assert_eq(store_wait_send(b, keys, 1, 10000, &err), 0);
    cr_assert_eq(store_claim(a, "pprun/live/1", &err), 0, "%s", err.msg);
    cr_assert_eq(store_wait_recv(b, &err), 0, "%s", err.msg);
    void *v;
    size_t len;
    cr_assert_eq(store_get(b, "pprun/live/1", &v, &len, &err), 0);
    cr_assert_eq(len, 0);
    free(v);
    for (int i = 0; i < 4; i++) {
        char k[32];
        snprintf(k, sizeof k, "more/%d", i);
        cr_assert_eq(store_claim(a, k, &err), i < 3 ? 0 : -1, "claim %d", i);
    }
    cr_assert(strstr(err.msg, "CLAIM: a connection holds at most 4 keys"), "%s", err.msg);
    /* another connection's key is refused, and not taken with it */
    cr_assert_eq(store_claim(b, "pprun/live/1", &err), -1);
    cr_assert(strstr(err.msg, "CLAIM: the key exists already"), "%s", err.msg);
    /* a claimed key deleted and set again is no longer the claimer's */
    cr_assert_eq(store_delete(b, "more/1", &err), 0);
    cr_assert_eq(store_set(b, "more/1", "x", 1, &err), 0);
    store_close(a);
    int gone = 0;
    for (int i = 0; i < 200 && !gone; i++) {
        gone = store_get(b, "pprun/live/1", &v, &len, &err) == 1;
        if (!gone) {
            free(v);
            usleep(5000);
        }
    }
    cr_assert(gone, "the claimed key outlived its connection");
    cr_assert_eq(store_get(b, "more/0", &v, &len, &err), 1, "every claimed key goes");
    cr_assert_eq(store_get(b, "more/1", &v, &len, &err), 0, "a key set since stays");
    free(v);
    store_close(b);
}

Test(store, time_is_the_servers_monotonic_clock) {
    store_client *c = client();
    pp_err err;
    uint64_t t0 = pp_now_ns(), s, t1;
    cr_assert_eq(store_time(c, &s, &err), 0);
    t1 = pp_now_ns();
    /* Same machine, same clock: the server's reading lies in the round trip. */
    cr_assert(s >= t0 && s <= t1, "%llu not in [%llu, %llu]", (unsigned long long)s, (unsigned long long)t0,
              (unsigned long long)t1);
    store_close(c);
}

Test(store, closed_server_is_an_error_naming_it) {
    store_client *c = client();
    pp_err err;
    store_server_stop(server);
    server = NULL;
    int64_t v;
    cr_assert_eq(store_add(c, "k", 1, &v, &err), -1);
    cr_assert(strstr(err.msg, "127.0.0.1"), "%s", err.msg);
    store_close(c);
    start(); /* for .fini */
}

Test(store, connect_gives_up_after_the_timeout) {
    store_client *c;
    pp_err err;
    /* The suite's server is on `port`; nothing listens on port 1. */
    cr_assert_eq(store_connect("127.0.0.1", 1, 100000000ull, &c, &err), -1);
    cr_assert(strstr(err.msg, "127.0.0.1:1"), "%s", err.msg);
}

/* A listening socket that accepts (the kernel does) but never answers:
 * what a launcher meets when node rank 0 is stopped or frozen. */
static int silent_listener(int *lport) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *lport = ntohs(a.sin_port);
    return fd;
}

Test(store, a_server_that_never_answers_is_an_error_after_the_client_timeout) {
    int lport, lfd = silent_listener(&lport);
    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", lport, 1000000000ull, &c, &err), 0, "%s", err.msg);
    store_set_timeout(c, 200000000ull);
    void *v;
    size_t len;
    cr_assert_eq(store_get(c, "k", &v, &len, &err), -1);
    cr_assert(strstr(err.msg, "127.0.0.1:") && strstr(err.msg, "no answer within 0.2s"), "%s", err.msg);
    /* The late answer could still come: the client refuses to go on. */
    cr_assert_eq(store_set(c, "k", "v", 1, &err), -1);
    cr_assert(strstr(err.msg, "out of step"), "%s", err.msg);
    store_close(c);
    close(lfd);
}

Test(store, a_waits_own_timeout_comes_on_top_of_the_client_timeout) {
    store_client *c = client();
    pp_err err;
    store_set_timeout(c, 1000000000ull);
    const char *keys[] = {"never-set"};
    /* The server answers "timed out" after 2 s, past the client's 1 s; the
     * answer has up to 1 s past the wait's own timeout to come, which a
     * busy machine's stalls need. */
    cr_assert_eq(store_wait(c, keys, 1, 2000, &err), 1, "%s", err.msg);
    int64_t n;
    cr_assert_eq(store_add(c, "still-usable", 1, &n, &err), 0, "%s", err.msg);
    store_close(c);
}

#define NCLIENTS 64

static void *worker(void *arg) {
    int rank = (int)(intptr_t)arg;
    store_client *c;
    pp_err err;
    if (store_connect("127.0.0.1", port, 10000000000ull, &c, &err) != 0) return strdup(err.msg);
    char key[64], val[64];
    char *fail = NULL;
    for (int round = 0; round < 3 && !fail; round++) {
        snprintf(key, sizeof key, "addr/%d/%d", round, rank);
        snprintf(val, sizeof val, "host-%d:%d", rank, 1000 + round);
        int64_t arrived;
        char cnt[32], all[32];
        snprintf(cnt, sizeof cnt, "count/%d", round);
        snprintf(all, sizeof all, "all/%d", round);
        const char *keys[] = {all};
        if (store_set(c, key, val, strlen(val), &err) != 0 || store_add(c, cnt, 1, &arrived, &err) != 0 ||
            (arrived == NCLIENTS && store_set(c, all, "", 0, &err) != 0) || store_wait(c, keys, 1, 20000, &err) != 0) {
            fail = strdup(err.msg);
            break;
        }
        /* Everyone is here: every other client's value must be readable. */
        for (int r = 0; r < NCLIENTS && !fail; r++) {
            void *v;
            size_t len;
            char want[64];
            snprintf(key, sizeof key, "addr/%d/%d", round, r);
            snprintf(want, sizeof want, "host-%d:%d", r, 1000 + round);
            if (store_get(c, key, &v, &len, &err) != 0 || strcmp(v, want) != 0) {
                char msg[256];
                snprintf(msg, sizeof msg, "client %d round %d: %s wrong", rank, round, key);
                fail = strdup(msg);
            }
            free(v);
        }
    }
    store_close(c);
    return fail;
}

Test(store, sixty_four_clients_exchange_values_and_meet_at_barriers) {
    pthread_t th[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) cr_assert_eq(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NCLIENTS; i++) {
        void *res;
        pthread_join(th[i], &res);
        cr_assert_null(res, "client %d: %s", i, (char *)res);
    }
    store_client *c = client();
    pp_err err;
    int64_t v;
    cr_assert_eq(store_add(c, "count/2", 0, &v, &err), 0);
    cr_assert_eq(v, NCLIENTS);
    store_close(c);
}

/* --- the job token ---------------------------------------------------------- */

#define TOKEN "9f86d081884c7d659a2feaa0c55ad015"

static store_server *tserver;
static int tport;

static void tstart(void) {
    pp_err err;
    cr_assert_eq(store_server_start_token("127.0.0.1", 0, TOKEN, &tserver, &err), 0, "%s", err.msg);
    tport = store_server_port(tserver);
}

static void tstop(void) { store_server_stop(tserver); }

TestSuite(store_token, .init = tstart, .fini = tstop);

Test(store_token, refuses_clients_without_or_with_a_wrong_token_and_keeps_serving) {
    capture log;
    capture_start(&log);

    pp_err err;
    store_client *c;
    /* No token: the connection opens, the first request is refused. */
    cr_assert_eq(store_connect("127.0.0.1", tport, 5000000000ull, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "pprun/run_id", "evil", 4, &err), -1, "a request without the token was served");
    cr_assert(strstr(err.msg, "needs the rendezvous token"), "%s", err.msg);
    cr_assert(strstr(err.msg, "PPRUN_RDZV_TOKEN"), "%s", err.msg);
    /* ... and the connection is closed: nothing else is read from it. */
    int64_t v;
    cr_assert_eq(store_add(c, "n", 1, &v, &err), -1);
    store_close(c);

    /* A wrong token: refused at connect, at once (no retrying), naming the store. */
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(store_connect_token("127.0.0.1", tport, "9f86d081884c7d659a2feaa0c55ad016", 30000000000ull, &c, &err),
                 -2);
    cr_assert_null(c);
    cr_assert(pp_now_ns() - t0 < 10000000000ull, "a refused token was retried");
    char want[64];
    snprintf(want, sizeof want, "store at 127.0.0.1:%d refused the rendezvous token", tport);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    /* A prefix of the right token is wrong too. */
    cr_assert_eq(store_connect_token("127.0.0.1", tport, "9f86d081", 5000000000ull, &c, &err), -2, "%s", err.msg);

    /* The server still serves a client with the token, and nothing the
     * refused ones sent reached the keys. */
    cr_assert_eq(store_connect_token("127.0.0.1", tport, TOKEN, 5000000000ull, &c, &err), 0, "%s", err.msg);
    void *val;
    size_t len;
    cr_assert_eq(store_get(c, "pprun/run_id", &val, &len, &err), 1, "a refused client's SET was stored");
    cr_assert_eq(store_set(c, "k", "v", 1, &err), 0, "%s", err.msg);
    cr_assert_eq(store_get(c, "k", &val, &len, &err), 0, "%s", err.msg);
    cr_assert_str_eq(val, "v");
    free(val);
    store_close(c);

    const char *text = capture_end(&log);
    /* One line per refused connection, naming its address, never the token. */
    cr_assert_eq(strstr(text, "pprun store: refused a connection from 127.0.0.1:") != NULL, 1, "%s", text);
    cr_assert_eq(capture_count(text, "refused a connection"), 3, "%s", text);
    cr_assert(strstr(text, "no rendezvous token") && strstr(text, "wrong rendezvous token"), "%s", text);
    cr_assert_null(strstr(text, "9f86d081"), "the log shows the token: %s", text);
}

/* A client with a token and a store without one are two nodes given
 * different tokens: refused at once, saying so (before, let in, the job
 * failed later, when one rank refused another's connection). */
Test(store_token, a_store_without_a_token_refuses_a_client_that_has_one) {
    store_server *s;
    store_client *c = NULL;
    pp_err err;
    cr_assert_eq(store_server_start("127.0.0.1", 0, &s, &err), 0, "%s", err.msg);
    capture cap;
    capture_start(&cap);
    int rc = store_connect_token("127.0.0.1", store_server_port(s), TOKEN, 5000000000ull, &c, &err);
    uint64_t refused = store_server_refused(s);
    store_server_stop(s);
    const char *text = capture_end(&cap);
    cr_assert_eq(rc, -2, "%s", err.msg);
    cr_assert_null(c);
    cr_assert(strstr(err.msg, "refused the rendezvous token: this store has no rendezvous token and the connection "
                              "gave one: every node needs the same --rdzv-token / PPRUN_RDZV_TOKEN, or none"),
              "%s", err.msg);
    cr_assert_eq(refused, 1);
    cr_assert(strstr(text, "a rendezvous token, which this store does not have"), "%s", text);
    cr_assert_null(strstr(text, "9f86d081"), "the log shows the token: %s", text);
}

Test(store_token, bad_tokens_are_clear_errors) {
    store_server *s = NULL;
    store_client *c = NULL;
    pp_err err;
    char longtok[300];
    memset(longtok, 'a', sizeof longtok - 1);
    longtok[sizeof longtok - 1] = '\0';
    cr_assert_eq(store_server_start_token("127.0.0.1", 0, longtok, &s, &err), -1);
    cr_assert(strstr(err.msg, "299 bytes long") && strstr(err.msg, "1 to 256"), "%s", err.msg);
    cr_assert_eq(store_server_start_token("127.0.0.1", 0, "two words", &s, &err), -1);
    cr_assert(strstr(err.msg, "space"), "%s", err.msg);
    cr_assert_null(s);
    cr_assert_eq(store_connect_token("127.0.0.1", tport, longtok, 1000000000ull, &c, &err), -1);
    cr_assert(strstr(err.msg, "1 to 256"), "%s", err.msg);
    cr_assert_null(c);
    /* The worker's way: a bad PPRUN_RDZV_TOKEN names the variable. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tport);
    setenv("PPRUN_STORE", addr, 1);
    setenv("PPRUN_RDZV_TOKEN", "", 1);
    cr_assert_eq(store_connect_env(1000000000ull, &c, &err), -1);
    cr_assert(strstr(err.msg, "PPRUN_RDZV_TOKEN") && strstr(err.msg, "empty"), "%s", err.msg);
    setenv("PPRUN_RDZV_TOKEN", TOKEN, 1);
    cr_assert_eq(store_connect_env(1000000000ull, &c, &err), 0, "%s", err.msg);
    store_close(c);
}
