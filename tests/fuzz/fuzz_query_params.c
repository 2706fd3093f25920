/* fuzz_query_params.c: libFuzzer target for the query-parameter checks
 * (web/query.c) on what libmicrohttpd makes of a request's query string.
 *
 * Each input is the query string of "GET /api/jobs?INPUT HTTP/1.1", every
 * byte that could not stand in a request line percent-encoded (so %00, a
 * raw byte >= 0x80 and every other byte reach the parser as a client can
 * send them). The request goes to a real libmicrohttpd daemon over a
 * socket pair, run by hand on this thread (no listening socket, no
 * threads); every request must be answered, or closed by libmicrohttpd
 * when its parameters outgrow the connection's memory, never left
 * waiting. The access handler, where it is reached, runs query_check,
 * then query_copy, query_str and query_long as the routes do, and aborts
 * when one breaks its contract: the copy holds every parameter with its
 * value, query_str never gives an empty value, query_long gives -1 (with
 * a 400), 0 or 1 with the value in its range, a query query_check
 * passed has no name twice, and with a route's list of names it passes
 * exactly the queries whose every name is on it. Built with the fuzz build (tests/fuzz/CMakeLists.txt;
 * `scripts/test.sh fuzz` runs it):
 *
 *   ./build-fuzz/fuzz_query_params -max_total_time=60 CORPUS_DIR */
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "web/query.h"
#include "web/reply.h"

static struct MHD_Daemon *daemon_;

static void check_long(const query_args *a, const char *name, long min, long max) {
    long v = min - 1;
    reply r = {0};
    int got = query_long(a, name, min, max, &v, &r);
    if (got == 1 && (v < min || v > max)) abort();
    if (got == 0 && v != min - 1) abort(); /* absent: left as it was */
    if (got == -1 && r.status != 400) abort();
    if (got < -1 || got > 1) abort();
    reply_clear(&r);
}

/* The parameters as libmicrohttpd walks them, in order. */
typedef struct seen {
    const char *name[QUERY_MAX], *value[QUERY_MAX];
    size_t n;
} seen;

static enum MHD_Result count_name(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                  const char *value, size_t value_size) {
    (void)kind;
    (void)value_size;
    if (key_size == 0 && !value) return MHD_YES; /* "?&limit=5": no parameter between the two */
    seen *s = cls;
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->name[i], key) == 0) abort(); /* query_check let a name through twice */
    if (s->n == QUERY_MAX) abort();                /* query_check let more than QUERY_MAX through */
    s->name[s->n] = key;
    s->value[s->n++] = value;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls, (void)url, (void)method, (void)version, (void)upload, (void)upload_size, (void)con_cls;
    reply r = {0};
    if (query_check(c, NULL, &r) == 0) {
        seen in = {.n = 0};
        MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, count_name, &in);
        /* with a route's list (events'): passed exactly when every name is
         * one of its words */
        static const char *const listed[] = {"from", "to", "step", "ranks", "limit", "buckets", "gpu"};
        int all_listed = 1;
        for (size_t i = 0; i < in.n; i++) {
            int found = 0;
            for (size_t k = 0; k < sizeof listed / sizeof listed[0]; k++)
                found |= strcmp(in.name[i], listed[k]) == 0;
            all_listed &= found;
        }
        reply lr = {0};
        int passed = query_check(c, "from to step ranks limit buckets gpu", &lr) == 0;
        if (passed != all_listed || (!passed && lr.status != 400)) abort();
        reply_clear(&lr);
        query_args a;
        if (query_copy(c, &a, &r) != 0) abort();
        if (a.n != in.n) abort(); /* the copy holds every parameter checked, with its value */
        for (size_t i = 0; i < in.n; i++) {
            if (strcmp(a.name[i], in.name[i]) != 0 || (a.value[i] == NULL) != (in.value[i] == NULL) ||
                (a.value[i] && strcmp(a.value[i], in.value[i]) != 0))
                abort();
            const char *v = query_str(&a, in.name[i]);
            if ((v == NULL) != (!in.value[i] || !in.value[i][0])) abort(); /* empty or no value: absent */
        }
        static const char *const probe[] = {"from", "to", "limit", "step", "ranks", "vs", "since", ""};
        for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
            const char *v = query_str(&a, probe[i]);
            if (v && !*v) abort(); /* empty means absent */
        }
        check_long(&a, "limit", 1, 25000);
        check_long(&a, "from", -9000000000000000000l, 9000000000000000000l);
        check_long(&a, "step", 0, 1000000);
        query_free(&a);
    } else if (r.status != 400) {
        abort();
    }
    reply_clear(&r);
    struct MHD_Response *resp = MHD_create_response_from_buffer(2, "ok", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    daemon_ = MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL, on_request, NULL,
                               MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32 * 1024), MHD_OPTION_END);
    if (!daemon_) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8000) return 0; /* past the header memory the server allows: libmicrohttpd's 414 */
    static char req[8000 * 3 + 128];
    size_t n = (size_t)snprintf(req, sizeof req, "GET /api/jobs?");
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < size; i++) {
        unsigned char ch = data[i];
        if (ch <= 0x20 || ch >= 0x7f || ch == '#') {
            req[n++] = '%';
            req[n++] = hex[ch >> 4];
            req[n++] = hex[ch & 15];
        } else {
            req[n++] = (char)ch;
        }
    }
    n += (size_t)snprintf(req + n, sizeof req - n, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    if (write(sv[0], req, n) != (ssize_t)n) abort();
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (MHD_add_connection(daemon_, sv[1], (struct sockaddr *)&peer, sizeof peer) != MHD_YES) abort();
    char buf[4096];
    int answered = 0, closed = 0;
    for (int turn = 0; turn < 64 && !answered && !closed; turn++) {
        MHD_run(daemon_);
        ssize_t k = recv(sv[0], buf, sizeof buf, MSG_DONTWAIT);
        answered = k > 0;
        closed = k == 0;
    }
    close(sv[0]);
    for (int turn = 0; turn < 4; turn++) MHD_run(daemon_); /* it sees the close and frees the connection */
    /* Answered, by the handler or by libmicrohttpd (a 414 or 431 past its
     * memory), or closed by libmicrohttpd, when the parameters' records
     * outgrow the connection's memory (some hundreds of them); never left
     * waiting. */
    if (!answered && !closed) abort();
    return 0;
}
