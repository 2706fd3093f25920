/* fuzz_store.c: the rendezvous store's frame parser under libFuzzer.
 *
 * The store (runner/store/store.c) reads frames from anyone who reaches its
 * port before a job token is checked, so every byte sequence must end in a
 * reply, a refusal or a closed connection: never a crash, a leak, an
 * unbounded buffer or a server that stops answering. Two servers run for
 * the whole session, one without a token and one with; each input goes to
 * one of them (its first byte chooses), as one connection that sends the
 * rest of the input and then closes its writing side. After it, a fresh
 * client must still get its TIME answered: a server that hangs or died is
 * a finding, reported by abort().
 *
 *   ./build-fuzz/fuzz_store -max_total_time=60 tests/fuzz/corpus/fuzz_store */
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"
#include "runner/store/store.h"

static store_server *servers[2];
static const char token[] = "fuzz-token-0123456789abcdef";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    pp_err err;
    if (store_server_start("127.0.0.1", 0, &servers[0], &err) != 0 ||
        store_server_start_token("127.0.0.1", 0, token, &servers[1], &err) != 0) {
        fprintf(stderr, "fuzz_store: %s\n", err.msg);
        abort();
    }
    return 0;
}

/* Reads what the server answers until it closes or 200 ms pass. */
static void drain(int fd) {
    char buf[4096];
    uint64_t deadline = pp_now_ns() + 200000000ull;
    for (;;) {
        uint64_t now = pp_now_ns();
        if (now >= deadline) return;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1) <= 0) return;
        if (read(fd, buf, sizeof buf) <= 0) return;
    }
}

/* The server still serves: a TIME over a new connection within 5 s. */
static void check_alive(int which) {
    store_client *c;
    pp_err err;
    uint64_t ns;
    int port = store_server_port(servers[which]);
    int ok = (which ? store_connect_token("127.0.0.1", port, token, 5000000000ull, &c, &err)
                    : store_connect("127.0.0.1", port, 5000000000ull, &c, &err)) == 0;
    if (ok) {
        ok = store_time(c, &ns, &err) == 0;
        store_close(c);
    }
    if (!ok) {
        fprintf(stderr, "fuzz_store: the %s server stopped answering: %s\n", which ? "token" : "open", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int which = data[0] & 1;
    pp_err err;
    int fd = net_connect("127.0.0.1", store_server_port(servers[which]), 5000, 0, &err);
    if (fd < 0) {
        fprintf(stderr, "fuzz_store: %s\n", err.msg);
        abort();
    }
    /* The server may close mid-input (a refused frame): what is not sent
     * then is fine, and a failed write is not a finding. */
    (void)net_write_all(fd, data + 1, size - 1, pp_now_ns() + 1000000000ull);
    shutdown(fd, SHUT_WR);
    drain(fd);
    close(fd);
    check_alive(which);
    return 0;
}
