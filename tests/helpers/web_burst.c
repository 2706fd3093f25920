/* web_burst.c: a burst of connections and what became of each (web_burst.h). */
#include "web_burst.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { B_CONNECTING, B_SENDING, B_READING, B_DONE };

typedef struct burst_conn {
    int fd;
    int state;
    size_t sent;      /* bytes of the request sent */
    char head[16];    /* the first bytes of the answer: "HTTP/1.1 200 " */
    size_t got;       /* bytes of the answer read, all of them */
} burst_conn;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A non-blocking socket from 127.0.0.(1 + k) connecting to the port, -1
 * (errno set) when none can be made; *refused when connect() failed at once. */
static int open_from(unsigned k, int port, int *refused) {
    *refused = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK + k);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *refused = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS;
    return fd;
}

/* What the answer's first bytes say, once its status line is in. */
static void count_answer(const burst_conn *c, double t, webburst_counts *out) {
    int status = 0;
    if (sscanf(c->head, "HTTP/1.%*d %d", &status) != 1) status = -1;
    out->answered++;
    if (status == 200) out->ok++;
    else if (status == 503) out->busy++;
    else out->other++;
    if (t > out->max_ms) out->max_ms = t;
}

/* One step of c on the events poll gave it. */
static void step(burst_conn *c, short rev, const char *req, size_t reqlen, double t, webburst_counts *out) {
    if (c->state == B_CONNECTING) {
        int e = 0;
        socklen_t el = sizeof e;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
        if (e != 0) {
            out->refused++;
            c->state = B_DONE;
            return;
        }
        c->state = B_SENDING;
    }
    if (c->state == B_SENDING) {
        ssize_t n = send(c->fd, req + c->sent, reqlen - c->sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) {
            out->dropped++;
            c->state = B_DONE;
            return;
        }
        if (n > 0) c->sent += (size_t)n;
        if (c->sent == reqlen) c->state = B_READING;
        return;
    }
    if (c->state != B_READING || !(rev & (POLLIN | POLLHUP | POLLERR))) return;
    char buf[4096];
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EAGAIN) return;
    if (n > 0) {
        size_t before = c->got;
        for (size_t i = 0; before + i < sizeof c->head - 1 && i < (size_t)n; i++) c->head[before + i] = buf[i];
        c->got += (size_t)n;
        /* The status line's code is in once 12 bytes are ("HTTP/1.1 200"). */
        if (before < 12 && c->got >= 12) count_answer(c, t, out);
        return;
    }
    /* End of the stream (or a reset): the answer is whole, or there was none. */
    if (c->got == 0) out->dropped++;
    else if (c->got < 12) count_answer(c, t, out);
    c->state = B_DONE;
}

int webburst_run(const webburst_opts *o, webburst_counts *out) {
    memset(out, 0, sizeof *out);
    unsigned addrs = o->addrs ? o->addrs : 1;
    char req[512];
    int reqlen = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", o->path);
    burst_conn *c = calloc(o->conns, sizeof *c);
    struct pollfd *p = calloc(o->conns, sizeof *p);
    if (!c || !p) {
        free(c);
        free(p);
        errno = ENOMEM;
        return -1;
    }
    double t0 = now_ms();
    int ret = 0;
    for (unsigned i = 0; i < o->conns; i++) {
        int refused;
        int fd = open_from(i % addrs, o->port, &refused);
        if (fd < 0) { /* the client's own failure: stop here, close what is open */
            ret = -1;
            for (unsigned j = 0; j < i; j++)
                if (c[j].fd >= 0) close(c[j].fd);
            goto out;
        }
        c[i] = (burst_conn){.fd = fd, .state = refused ? B_DONE : B_CONNECTING};
        out->refused += (unsigned)refused;
    }
    for (;;) {
        unsigned n = 0;
        for (unsigned i = 0; i < o->conns; i++) {
            p[i].fd = c[i].state == B_DONE ? -1 : c[i].fd;
            p[i].events = c[i].state == B_READING ? POLLIN : POLLOUT;
            p[i].revents = 0;
            n += c[i].state != B_DONE;
        }
        double t = now_ms() - t0;
        if (n == 0 || t >= o->wait_ms) break;
        int k = poll(p, o->conns, (int)(o->wait_ms - t) + 1);
        if (k < 0 && errno != EINTR) {
            ret = -1;
            break;
        }
        t = now_ms() - t0;
        for (unsigned i = 0; i < o->conns; i++)
            if (p[i].revents) step(&c[i], p[i].revents, req, (size_t)reqlen, t, out);
    }
    for (unsigned i = 0; i < o->conns; i++) {
        if (c[i].state == B_DONE) {
            if (c[i].fd >= 0) close(c[i].fd);
            continue;
        }
        /* Past the wait: an answer begun was counted; a connection the
         * server's kernel never took (still connecting) was refused; the
         * rest were accepted and not answered. */
        if (c[i].state == B_CONNECTING) out->refused++;
        else if (c[i].got == 0) out->unanswered++;
        close(c[i].fd);
    }
out:
    free(c);
    free(p);
    return ret;
}
