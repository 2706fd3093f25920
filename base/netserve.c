/* netserve.c: accepting, buffering, deadlines and closing for a framed TCP
 * server (see netserve.h). */
#include "base/netserve.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"
#include "base/token.h"

/* Buffers bigger than these are freed once empty: one large frame or reply
 * must not pin its size for the rest of the connection's life. */
#define NETSERVE_IN_KEEP (64u << 10)
#define NETSERVE_OUT_KEEP (1u << 20)
/* Accepts per round, so that a flood of connections cannot starve the ones
 * being served. */
#define NETSERVE_ACCEPTS_PER_ROUND 64
#define NETSERVE_LOG_WINDOW_NS 10000000000ull
/* The most the time between two polls adds to the server clock. */
#define NETSERVE_MAX_STEP_NS 1000000000ull

void netserve_log(const netserve *ns, pp_ratelimit *rl, unsigned burst, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    netserve_vlog(ns, rl, burst, fmt, ap);
    va_end(ap);
}

void netserve_vlog(const netserve *ns, pp_ratelimit *rl, unsigned burst, const char *fmt, va_list ap) {
    unsigned long held;
    if (!pp_ratelimit_allow(rl, burst, NETSERVE_LOG_WINDOW_NS, &held)) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (held) fprintf(stderr, "%s: %s (%lu more like it held back)\n", ns->cfg.name, msg, held);
    else fprintf(stderr, "%s: %s\n", ns->cfg.name, msg);
}

const char *netserve_refusal_why(netserve_refusal why) {
    switch (why) {
    case NETSERVE_FULL: return "every connection slot is taken";
    case NETSERVE_NO_MEMORY: return "out of memory for its connection table";
    case NETSERVE_NO_FDS: return "this process is out of file descriptors (raise ulimit -n)";
    case NETSERVE_NO_SYSTEM_FDS: return "the system is out of file descriptors";
    }
    return "?";
}

static size_t unread(const netserve_conn *c) { return c->in_len - c->in_off; }
static size_t out_pending(const netserve_conn *c) { return c->out_len - c->out_off; }
/* What a buffer of cap bytes counts against max_buffered. */
static uint64_t counted(size_t cap) { return cap > NETSERVE_IN_MIN ? cap - NETSERVE_IN_MIN : 0; }

/* The length of the frame at the head of c's input; 0 while unknown. */
static size_t head_frame_len(const netserve *ns, const netserve_conn *c) {
    return unread(c) ? ns->cfg.frame_len(ns->cfg.ctx, c, c->in + c->in_off, unread(c)) : 0;
}

int netserve_frame_ready(const netserve *ns, const netserve_conn *c) {
    size_t need = head_frame_len(ns, c);
    return need == NETSERVE_HANDLE_NOW || (need && unread(c) >= need);
}

int netserve_may_answer(const netserve *ns, const netserve_conn *c) {
    return !ns->cfg.out_high || out_pending(c) <= ns->cfg.out_high;
}

/* --- input -------------------------------------------------------------------- */

/* Makes room in c's buffer for the next read. 1: there is room; 0: not now
 * (a whole frame waits with little room left, or the frame waits for room
 * under max_buffered); -1: c is dead (its frame would pass max_buffered,
 * or no memory). */
static int make_room(netserve *ns, netserve_conn *c) {
    if (c->in_off) {
        memmove(c->in, c->in + c->in_off, unread(c));
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    size_t have = c->in_len, need = head_frame_len(ns, c);
    if (need == NETSERVE_HANDLE_NOW) return 0;
    /* A whole frame: read ahead only into the room already there, so a
     * pipelining peer is buffered one frame and a few KiB ahead. */
    if (need && have >= need) return c->in_cap - have >= NETSERVE_SLACK;
    size_t want = (need > have ? need : have) + NETSERVE_SLACK;
    if (want < NETSERVE_IN_MIN) want = NETSERVE_IN_MIN;
    if (c->in_cap >= want) return 1;
    uint64_t more = counted(want) - counted(c->in_cap);
    if (ns->buffered + more > ns->cfg.max_buffered) {
        if (ns->cfg.overflow == NETSERVE_WAIT) {
            c->waiting = 1;
            return 0;
        }
        netserve_log(ns, &ns->log_room, 10,
                     "closed the connection from %s: a frame of %zu bytes would take the input held for frames in "
                     "progress past %" PRIu64 " bytes, the limit (%" PRIu64 " held now)",
                     c->peer, need, ns->cfg.max_buffered, ns->buffered);
        c->dead = 1;
        return -1;
    }
    uint8_t *p = realloc(c->in, want);
    if (!p) {
        netserve_log(ns, &ns->log_room, 10, "closed the connection from %s: out of memory for a frame of %zu bytes",
                     c->peer, need);
        c->dead = 1;
        return -1;
    }
    c->in = p;
    c->in_cap = want;
    ns->buffered += more;
    if (c->waiting) {
        /* Its deadline counts from now: the wait was the server's. */
        c->waiting = 0;
        c->frame_ns = ns->clock;
    }
    return 1;
}

static int may_read(const netserve *ns, const netserve_conn *c) {
    return !c->dead && !c->closing && !c->eof && netserve_may_answer(ns, c);
}

/* Should poll watch c for input? A connection that holds nothing has no
 * buffer yet (an idle one costs no memory): read_input makes one. One
 * that holds part of a frame gets room for the rest here, if it can. */
static int wants_input(netserve *ns, netserve_conn *c) {
    if (!may_read(ns, c)) return 0;
    return !c->in_cap || make_room(ns, c) == 1;
}

static void read_input(netserve *ns, netserve_conn *c) {
    while (may_read(ns, c) && make_room(ns, c) == 1) {
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            if (c->in_len == 0) c->frame_ns = ns->clock;
            c->in_len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        /* EOF: what came before it is still handled (a request then a
         * close must land); an error: the peer is gone. */
        if (n == 0) c->eof = 1;
        else c->dead = 1;
        return;
    }
}

void netserve_consume(netserve *ns, netserve_conn *c, size_t n) {
    c->in_off += n;
    if (c->in_off < c->in_len) {
        c->frame_ns = ns->clock; /* the next frame began by now */
        return;
    }
    /* Consuming moves in_off only; make_room compacts once per read, so
     * many small pipelined frames cost one memmove, not one each. */
    c->in_off = c->in_len = 0;
    if (c->in_cap > NETSERVE_IN_KEEP) {
        ns->buffered -= counted(c->in_cap);
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

/* --- output ------------------------------------------------------------------- */

int netserve_send(netserve_conn *c, const void *a, size_t na, const void *b, size_t nb) {
    if (c->dead) return -1;
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    size_t n = na + nb;
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n) cap *= 2;
        uint8_t *p = realloc(c->out, cap);
        if (!p) {
            c->dead = 1;
            return -1;
        }
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, a, na);
    if (nb) memcpy(c->out + c->out_len + na, b, nb);
    c->out_len += n;
    return 0;
}

static void flush_output(netserve_conn *c) {
    while (out_pending(c)) {
        ssize_t n = send(c->fd, c->out + c->out_off, out_pending(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->dead = 1;
        return;
    }
}

void netserve_hang_up(netserve_conn *c) {
    c->closing = 1;
    c->in_off = c->in_len = 0;
}

/* --- deadlines ------------------------------------------------------------------ */

/* When c's current deadline passes (0: none), and since when it runs. */
static uint64_t deadline_of(const netserve *ns, const netserve_conn *c, netserve_lateness *kind, uint64_t *since) {
    if (c->dead || c->closing) return 0;
    if (!c->authed && ns->cfg.auth_ns) {
        *kind = NETSERVE_AUTH_LATE;
        *since = c->born_ns;
        return c->born_ns + ns->cfg.auth_ns;
    }
    if (c->authed && ns->cfg.frame_ns && unread(c) > 0 && !c->waiting) {
        *kind = NETSERVE_FRAME_LATE;
        *since = c->frame_ns;
        return c->frame_ns + ns->cfg.frame_ns;
    }
    return 0;
}

netserve_lateness netserve_late(const netserve *ns, const netserve_conn *c, uint64_t *age_ns) {
    netserve_lateness kind = NETSERVE_ON_TIME;
    uint64_t since = 0, d = deadline_of(ns, c, &kind, &since);
    if (!d || ns->clock < d) return NETSERVE_ON_TIME;
    *age_ns = ns->clock - since;
    return kind;
}

/* --- connections ---------------------------------------------------------------- */

static void conn_free(netserve *ns, netserve_conn *c) {
    if (ns->cfg.on_close) ns->cfg.on_close(ns->cfg.ctx, c);
    close(c->fd);
    ns->buffered -= counted(c->in_cap);
    free(c->in);
    free(c->out);
    free(c);
}

static void refuse_fd(netserve *ns, int fd, netserve_refusal why) {
    char peer[80];
    net_peer_name(fd, peer, sizeof peer);
    ns->cfg.refuse(ns->cfg.ctx, fd, peer, why);
    close(fd);
}

/* One connection's trouble (it was reset, or its network went away while
 * it waited in the backlog): the next one may be fine. */
static int accept_error_is_transient(int e) {
    return e == ECONNABORTED || e == EPROTO || e == ENETDOWN || e == ENOPROTOOPT || e == EHOSTDOWN || e == ENONET ||
           e == EHOSTUNREACH || e == EOPNOTSUPP || e == ENETUNREACH;
}

static int add_conn(netserve *ns, int fd) {
    if (ns->nconns == ns->capconns) {
        size_t cap = ns->capconns ? ns->capconns * 2 : 16;
        netserve_conn **p = realloc(ns->conns, cap * sizeof *p);
        if (!p) return -1;
        ns->conns = p;
        ns->capconns = cap;
    }
    netserve_conn *c = calloc(1, ns->cfg.conn_size);
    if (!c) return -1;
    c->fd = fd;
    c->authed = !ns->cfg.auth_ns;
    c->born_ns = c->frame_ns = ns->clock;
    net_peer_name(fd, c->peer, sizeof c->peer);
    (void)net_set_keepalive(fd, NETSERVE_KEEPALIVE_S); /* best effort: the connection works without */
    ns->conns[ns->nconns++] = c;
    return 0;
}

void netserve_accept(netserve *ns) {
    for (int k = 0; k < NETSERVE_ACCEPTS_PER_ROUND; k++) {
        int fd = net_accept(ns->lfd, NET_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if (accept_error_is_transient(e)) continue;
            if ((e == EMFILE || e == ENFILE) && ns->spare_fd >= 0) {
                /* The connection waiting would keep the listener readable
                 * and its peer waiting for an answer: give up the spare
                 * descriptor to tell it no, then take the spare back. */
                close(ns->spare_fd);
                fd = net_accept(ns->lfd, NET_NONBLOCK);
                if (fd >= 0) refuse_fd(ns, fd, e == EMFILE ? NETSERVE_NO_FDS : NETSERVE_NO_SYSTEM_FDS);
                ns->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd >= 0) continue;
            }
            /* Out of descriptors or memory (or worse): the listener stays
             * readable, so polling it again at once would spin. */
            ns->accept_paused_until = ns->clock + ns->cfg.accept_pause_ns;
            if (!ns->accept_failing)
                netserve_log(ns, &ns->log_accept, 1,
                             "cannot accept connections: %s%s; trying again every %" PRIu64 " ms until one closes",
                             strerror(e), e == EMFILE ? " (the process's descriptor limit, ulimit -n)" : "",
                             ns->cfg.accept_pause_ns / 1000000);
            ns->accept_failing = 1;
            return;
        }
        ns->accept_failing = 0;
        if (ns->nconns >= ns->cfg.max_conns) refuse_fd(ns, fd, NETSERVE_FULL);
        else if (add_conn(ns, fd) != 0) refuse_fd(ns, fd, NETSERVE_NO_MEMORY);
    }
}

int netserve_poll(netserve *ns, int wake_fd, int timeout_ms) {
    uint64_t t0 = pp_now_ns(), between = t0 - ns->last_ns;
    ns->clock += between < NETSERVE_MAX_STEP_NS ? between : NETSERVE_MAX_STEP_NS;
    if (ns->pcap < ns->nconns + 2) {
        size_t cap = (ns->nconns + 2) * 2;
        struct pollfd *p = realloc(ns->pfds, cap * sizeof *p);
        if (!p) { /* try again next round, as if poll had timed out */
            pp_sleep_ns(10000000);
            ns->last_ns = pp_now_ns();
            return 0;
        }
        ns->pfds = p;
        ns->pcap = cap;
    }
    struct pollfd *pf = ns->pfds;
    nfds_t n = 0;
    if (wake_fd >= 0) pf[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    if (ns->accept_paused_until && ns->clock >= ns->accept_paused_until) ns->accept_paused_until = 0;
    int listening = !ns->accept_paused_until;
    if (listening) pf[n++] = (struct pollfd){.fd = ns->lfd, .events = POLLIN};
    uint64_t next = ns->accept_paused_until ? ns->accept_paused_until : UINT64_MAX;
    nfds_t first = n;
    for (size_t i = 0; i < ns->nconns; i++) {
        netserve_conn *c = ns->conns[i];
        pf[n] = (struct pollfd){.fd = c->fd, .events = wants_input(ns, c) ? POLLIN : 0};
        if (out_pending(c)) pf[n].events |= POLLOUT;
        n++;
        netserve_lateness kind;
        uint64_t since, d = deadline_of(ns, c, &kind, &since);
        if (d && d < next) next = d;
    }
    if (next != UINT64_MAX) {
        uint64_t ms = next <= ns->clock ? 0 : (next - ns->clock) / 1000000ull + 1;
        if (timeout_ms < 0 || ms < (uint64_t)timeout_ms) timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
    }
    uint64_t t1 = pp_now_ns();
    int ready = poll(pf, n, timeout_ms);
    uint64_t t2 = pp_now_ns();
    /* Time in poll counts whole: it is the peers' time. */
    ns->clock += t2 - t1;
    ns->last_ns = t2;
    if (ready < 0) return errno == EINTR ? 0 : -1;
    if (ready == 0) return 0;
    if (wake_fd >= 0 && pf[0].revents) return 1;
    for (size_t i = 0; i < ns->nconns; i++) {
        netserve_conn *c = ns->conns[i];
        short re = pf[first + i].revents, asked = pf[first + i].events;
        /* A peer gone (reset) while we do not read from it must be dropped
         * here: read_input would not look, and poll would report it again
         * at once, forever. */
        if ((re & (POLLERR | POLLNVAL)) || ((re & POLLHUP) && !(asked & POLLIN))) c->dead = 1;
        else if (re & (POLLIN | POLLHUP)) read_input(ns, c);
        if ((re & POLLOUT) && !c->dead) flush_output(c);
    }
    if (listening && pf[wake_fd >= 0].revents) netserve_accept(ns);
    return 0;
}

void netserve_sweep(netserve *ns) {
    for (size_t i = 0; i < ns->nconns;) {
        netserve_conn *c = ns->conns[i];
        if (!c->dead) flush_output(c);
        int written = out_pending(c) == 0;
        if (written && c->out_cap > NETSERVE_OUT_KEEP) {
            free(c->out);
            c->out = NULL;
            c->out_cap = c->out_len = c->out_off = 0;
        }
        if (written && (c->closing || (c->eof && !netserve_frame_ready(ns, c)))) c->dead = 1;
        if (c->dead) {
            conn_free(ns, c);
            ns->conns[i] = ns->conns[--ns->nconns];
        } else {
            i++;
        }
    }
}

/* --- start / stop --------------------------------------------------------------- */

int netserve_start(const char *host, int port, int flags, const netserve_config *cfg, netserve **out, pp_err *err) {
    *out = NULL;
    int fd = net_listen(host, port, SOMAXCONN, NET_NONBLOCK | flags, err);
    if (fd < 0) return -1;
    netserve *ns = calloc(1, sizeof *ns);
    if (!ns) {
        close(fd);
        return pp_fail(err, "out of memory");
    }
    ns->cfg = *cfg;
    ns->lfd = fd;
    ns->port = net_local_port(fd);
    ns->spare_fd = cfg->answer_when_out_of_fds ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    ns->last_ns = pp_now_ns();
    *out = ns;
    return 0;
}

void netserve_stop(netserve *ns) {
    if (!ns) return;
    for (size_t i = 0; i < ns->nconns; i++) conn_free(ns, ns->conns[i]);
    free(ns->conns);
    free(ns->pfds);
    close(ns->lfd);
    if (ns->spare_fd >= 0) close(ns->spare_fd);
    free(ns);
}
