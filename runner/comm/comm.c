/* comm.c: the transport-neutral half of comm.h: per-peer send queues and
 * sender threads, the inbox that matches received messages by tag, posted
 * receives (the reader writes straight into the caller's buffer) and lazy
 * connection set-up through the exchange.  The bytes themselves move in
 * comm_shm.c (shared-memory rings) and comm_tcp.c (sockets); comm_watch.c
 * turns a dead peer into a prompt error instead of a hang. */
#include "runner/comm/comm_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define COMM_MAX_WORLD 65536
#define TCP_ACCEPT_WAIT_MS 2000 /* comm_recv's look into the backlog for a dead peer's connection */

const char *comm_tag_str(uint64_t tag, char *buf, size_t cap) {
    static const char *dirs[] = {"activation", "gradient", "control", NULL, NULL, "collective", "evaluation activation"};
    unsigned dir = (unsigned)(tag & 0xF);
    if (dir == COMM_DIR_DEVACK || dir == COMM_DIR_DEVANN) {
        snprintf(buf, cap, "tag 0x%" PRIx64 " (devcomm %s %" PRIu64 ")", tag,
                 dir == COMM_DIR_DEVACK ? "acknowledgement" : "announcement", tag >> 4);
        return buf;
    }
    const char *ann = dir & COMM_DIR_DEVDATA ? "devcomm announcement of " : "";
    dir &= ~(unsigned)COMM_DIR_DEVDATA;
    char d[32];
    if (dir < sizeof dirs / sizeof *dirs && dirs[dir])
        snprintf(d, sizeof d, "%s", dirs[dir]);
    else
        snprintf(d, sizeof d, "dir %u", dir);
    snprintf(buf, cap, "tag 0x%" PRIx64 " (%sstep %" PRIu64 ", stage %" PRIu64 ", microbatch %" PRIu64 ", %s)", tag,
             ann, tag >> 40, (tag >> 24) & 0xFFFF, (tag >> 4) & 0xFFFFF, d);
    return buf;
}

void comm_job_key(const char *run_id, int attempt, char *buf, size_t cap) {
    snprintf(buf, cap, "%s-a%d", run_id, attempt);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Removes the names in /dev/shm of the job keys whose hashes are
 * hash[0..n) (sorted): one read of the folder. */
static void cleanup_hashes(const uint64_t *hash, size_t n) {
    DIR *d = opendir("/dev/shm"); /* where glibc's shm_open keeps its names */
    const size_t k = sizeof COMM_SHM_PREFIX - 1;
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *hex = e->d_name + k;
        if (strncmp(e->d_name, COMM_SHM_PREFIX, k) != 0 || strspn(hex, "0123456789abcdef") != 16 || hex[16] != '-')
            continue;
        uint64_t h = strtoull(hex, NULL, 16);
        if (!bsearch(&h, hash, n, sizeof h, cmp_u64)) continue;
        char name[sizeof e->d_name + 1];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
    }
    if (d) closedir(d);
}

void comm_cleanup(const char *job_key) {
    if (!job_key) return;
    uint64_t hash = pp_hash_str(job_key);
    cleanup_hashes(&hash, 1);
}

void comm_cleanup_run(const char *run_id, int attempts) {
    uint64_t *hash = run_id && attempts > 0 ? malloc(sizeof *hash * (size_t)attempts) : NULL;
    for (int a = 0; hash && a < attempts; a++) {
        char key[192];
        comm_job_key(run_id, a, key, sizeof key);
        hash[a] = pp_hash_str(key);
    }
    if (hash) qsort(hash, (size_t)attempts, sizeof *hash, cmp_u64), cleanup_hashes(hash, (size_t)attempts);
    free(hash);
}

/* ---- reader side --------------------------------------------------------- */

int comm_start_reader(comm_peer *p, void *(*fn)(void *)) {
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    if (!p->reader_started) {
        p->in_state = COMM_IN_OPEN;
        rc = pthread_create(&p->reader, NULL, fn, p);
        if (rc == 0) {
            p->reader_started = 1;
            atomic_fetch_add(&p->c->peer_threads, 1);
        } else {
            p->in_state = COMM_IN_NONE;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int comm_rx_begin(comm_peer *p, const comm_hdr *h, void **dst, comm_msg **msg, char *why, size_t cap) {
    *msg = NULL;
    pthread_mutex_lock(&p->mu);
    int direct = p->posted && !p->p_claimed && p->p_tag == h->tag && p->p_len == h->len;
    if (direct) {
        p->p_claimed = 1;
        *dst = p->p_buf;
    }
    pthread_mutex_unlock(&p->mu);
    if (direct) return 0;
    comm_msg *m = calloc(1, sizeof *m);
    if (m) m->data = malloc(h->len ? h->len : 1);
    if (!m || !m->data) {
        snprintf(why, cap, "sent a message of %" PRIu64 " bytes that did not fit in memory", h->len);
        free(m);
        return -1;
    }
    m->tag = h->tag;
    m->len = h->len;
    *dst = m->data;
    *msg = m;
    return 0;
}

void comm_rx_deliver(comm_peer *p, comm_msg *m) {
    pthread_mutex_lock(&p->mu);
    if (!m) {
        p->p_done = 1;
    } else {
        if (p->in_tail)
            p->in_tail->next = m;
        else
            p->in_head = m;
        p->in_tail = m;
    }
    pthread_cond_broadcast(&p->cv_in);
    pthread_mutex_unlock(&p->mu);
}

void comm_rx_drop(comm_msg *m) {
    if (!m) return;
    free(m->data);
    free(m);
}

void comm_rx_end(comm_peer *p, const char *why) {
    pthread_mutex_lock(&p->mu);
    p->in_state = COMM_IN_CLOSED;
    snprintf(p->in_why, sizeof p->in_why, "%s", why[0] ? why : "closed its channel");
    if (p->posted && p->p_claimed && !p->p_done) p->p_failed = p->p_done = 1;
    pthread_cond_broadcast(&p->cv_in);
    pthread_mutex_unlock(&p->mu);
}

void comm_reader_loop(comm_peer *p, comm_read_fn rd) {
    char why[256] = "";
    for (;;) {
        comm_hdr h;
        void *dst;
        comm_msg *m;
        if (rd(p, &h, sizeof h, why, sizeof why) < 0 || comm_rx_begin(p, &h, &dst, &m, why, sizeof why) < 0) break;
        if (h.len && rd(p, dst, h.len, why, sizeof why) < 0) {
            comm_rx_drop(m);
            break;  /* a posted receive we were filling fails below */
        }
        comm_rx_deliver(p, m);
    }
    comm_rx_end(p, why);
}

/* ---- set-up: endpoint from the exchange, then the transport -------------- */

/* Why the `kind` thread for rank `peer` could not start (pthread_create's
 * error rc), into buf: a rank runs a reader thread for every rank it talks
 * to and a sender for every rank it sends to, so a data-parallel group of
 * many ranks on one node can use up the machine's threads (docs/comm.md,
 * "Threads"). */
void comm_thread_failed(comm *c, const char *kind, int peer, int rc, char *buf, size_t cap) {
    char limits[320] = "";
    if (rc == EAGAIN) pp_task_limits(limits, sizeof limits);
    snprintf(buf, cap,
             "comm: cannot start the %s thread for rank %d: %s%s%s (this rank has started %d for the ranks it talks "
             "to: a reader each, a sender for each it sends to)",
             kind, peer, strerror(rc), rc == EAGAIN ? ": the limit on threads was hit: " : "", limits,
             atomic_load(&c->peer_threads));
}

static int peer_setup(comm_peer *p, pp_err *err) {
    int s = atomic_load(&p->setup);
    if (s == 1) return 0;
    if (s < 0) return pp_fail(err, "%s", p->setup_err);
    comm *c = p->c;
    pthread_mutex_lock(&p->setup_mu);
    if (atomic_load(&p->setup) != 0) {
        pthread_mutex_unlock(&p->setup_mu);
        return peer_setup(p, err);
    }
    pp_err e;
    char key[320], val[512];
    size_t len = 0;
    snprintf(key, sizeof key, COMM_KEY_FMT, c->job_key, p->rank);
    int pid = 0, node = 0, port = 0, pidfd_gone = 0;
    char host[256] = "";
    pthread_mutex_lock(&c->ex_mu);
    int got = c->ex.get(c->ex.ctx, key, val, sizeof val - 1, &len, c->connect_timeout_ms, &e);
    pthread_mutex_unlock(&c->ex_mu);
    if (got < 0) {
        snprintf(p->setup_err, sizeof p->setup_err, "comm: no endpoint of rank %d in the store (key %.250s): %.600s", p->rank,
                 key, e.msg);
        goto fail;
    }
    val[len < sizeof val - 1 ? len : sizeof val - 1] = '\0';
    if (sscanf(val, "pid=%d node=%d host=%255s port=%d", &pid, &node, host, &port) != 4) {
        snprintf(p->setup_err, sizeof p->setup_err, "comm: malformed endpoint of rank %d (key %.250s): '%.200s'",
                 p->rank, key, val);
        goto fail;
    }
    if (p->same_node && pid > 0) {
        p->pid = pid;
        p->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (p->pidfd < 0 && errno == ESRCH) pidfd_gone = 1;
    }
    if (p->kind == COMM_SHM) {
        if (comm_shm_attach(p, &e) < 0) {
            snprintf(p->setup_err, sizeof p->setup_err, "%.1000s", e.msg);
            goto fail;
        }
        int rc = comm_shm_start_reader(p);
        if (rc != 0) {
            comm_thread_failed(c, "reader", p->rank, rc, p->setup_err, sizeof p->setup_err);
            goto fail;
        }
    } else {
        int rc = comm_tcp_connect(p, host, port, &e);
        if (rc == -1) {
            snprintf(p->setup_err, sizeof p->setup_err, "%.1000s", e.msg);
            goto fail;
        }
        /* Refused: the peer published its endpoint, then exited.  Not a
         * set-up failure: what it sent us before may still be unread. */
        if (rc == -2) pidfd_gone = 1;
    }
    atomic_store(&p->setup, 1);
    pthread_mutex_unlock(&p->setup_mu);
    comm_monitor_kick(c);
    if (pidfd_gone) {
        char why[128];
        snprintf(why, sizeof why, "is gone (process %d exited)", pid);
        comm_peer_dead(p, why);
    }
    return 0;
fail:
    atomic_store(&p->setup, -1);
    pthread_mutex_unlock(&p->setup_mu);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_flush);  /* flush waiters */
    pthread_mutex_unlock(&p->mu);
    return pp_fail(err, "%s", p->setup_err);
}

/* ---- sender side --------------------------------------------------------- */

static void drop_queue_locked(comm_peer *p) {
    while (p->q_head) {
        comm_out *o = p->q_head;
        p->q_head = o->next;
        free(o);
    }
    p->q_tail = NULL;
    p->q_bytes = p->q_msgs = 0;
}

/* Big queue items are recycled: a fresh malloc of a big block is a fresh
 * mmap whose page faults cost more than the copy itself. A sender far
 * ahead of its receiver queues many at once (bench_comm's stream of 1 MiB
 * messages: 60 MiB), so spares are kept up to COMM_SPARE_BYTES per peer
 * (the bigger ones first), each used only for a message of at least half
 * its size: recycled, that stream ran at 1.4 to 2 times the rate. */
#define COMM_SPARE_BYTES (64u << 20)
#define COMM_SPARE_MIN (256u << 10)

static comm_out *take_spare(comm_peer *p, size_t need) {
    for (comm_out **pp = &p->spare; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= need && (*pp)->cap / 2 <= need) {
            comm_out *o = *pp;
            *pp = o->next;
            p->spare_bytes -= o->cap;
            return o;
        }
    return NULL;
}

static void put_spare_locked(comm_peer *p, comm_out *o) {
    if (o->cap < COMM_SPARE_MIN || o->cap > COMM_SPARE_BYTES) {
        free(o);
        return;
    }
    while (p->spare_bytes + o->cap > COMM_SPARE_BYTES) { /* keep the bigger ones */
        comm_out **small = &p->spare;
        for (comm_out **pp = &p->spare; *pp; pp = &(*pp)->next)
            if ((*pp)->cap < (*small)->cap) small = pp;
        if ((*small)->cap >= o->cap) {
            free(o);
            return;
        }
        comm_out *d = *small;
        *small = d->next;
        p->spare_bytes -= d->cap;
        free(d);
    }
    o->next = p->spare;
    p->spare = o;
    p->spare_bytes += o->cap;
}

static void sender_fail(comm_peer *p, const char *why) {
    pthread_mutex_lock(&p->mu);
    if (!p->send_failed) {
        p->send_failed = 1;
        snprintf(p->send_err, sizeof p->send_err, "%.250s", why);
    }
    drop_queue_locked(p);
    pthread_cond_broadcast(&p->cv_flush);
    pthread_mutex_unlock(&p->mu);
}

static void *sender_main(void *arg) {
    comm_peer *p = arg;
    comm *c = p->c;
    pp_err e;
    if (peer_setup(p, &e) < 0) {
        sender_fail(p, e.msg);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        /* busy here: a comm_send writing past a full ring (comm_send) */
        while ((!p->q_head || p->busy) && !atomic_load(&c->stopping) && !atomic_load(&p->dead))
            pthread_cond_wait(&p->cv_out, &p->mu);
        if (atomic_load(&c->stopping) || atomic_load(&p->dead)) {
            char why[300];
            snprintf(why, sizeof why, "rank %d %s", p->rank, p->dead_why);
            int pending = p->q_head != NULL && !atomic_load(&c->stopping);
            pthread_mutex_unlock(&p->mu);
            if (pending) sender_fail(p, why);
            return NULL;
        }
        comm_out *o = p->q_head;
        p->q_head = o->next;
        if (!p->q_head) p->q_tail = NULL;
        p->busy = 1;
        pthread_mutex_unlock(&p->mu);

        char why[256] = "";
        int rc = p->kind == COMM_SHM ? comm_shm_write_all(p, o->data, o->n, why, sizeof why)
                                     : comm_tcp_write_all(p, o->data, o->n, why, sizeof why);
        pthread_mutex_lock(&p->mu);
        p->busy = 0;
        p->q_bytes -= o->n;
        p->q_msgs--;
        put_spare_locked(p, o);
        pthread_cond_broadcast(&p->cv_flush);
        pthread_mutex_unlock(&p->mu);
        if (rc < 0) {
            if (atomic_load(&c->stopping)) return NULL;
            sender_fail(p, why);
            return NULL;
        }
    }
}

int comm_check_peer(const comm *c, int peer, const char *who, const char *op, pp_err *err) {
    if (peer < 0 || peer >= c->world)
        return pp_fail(err, "%s: %s: peer rank %d out of range (world size %d)", who, op, peer, c->world);
    if (peer == c->rank) return pp_fail(err, "%s: %s: peer rank %d is this rank itself", who, op, peer);
    return 0;
}

/* This rank's wait note (COMM_WAIT_KEY_FMT): the peer it waits for, or
 * with `gone` the peer whose death or close failed it, or -1 for none.
 * Best effort: a note that cannot be written changes nothing about the
 * receive or send. Called without p->mu (the exchange may block). */
static void note_wait(comm *c, int peer, int gone) {
    char key[320], val[32];
    int n = peer >= 0 ? snprintf(val, sizeof val, gone ? "%d " COMM_WAIT_GONE : "%d", peer) : 0;
    snprintf(key, sizeof key, COMM_WAIT_KEY_FMT, c->job_key, c->rank);
    pp_err ignored;
    pthread_mutex_lock(&c->ex_mu);
    c->ex.put(c->ex.ctx, key, val, (size_t)n, &ignored);
    pthread_mutex_unlock(&c->ex_mu);
}

static int check_peer(const comm *c, int peer, const char *op, pp_err *err) {
    return comm_check_peer(c, peer, "comm", op, err);
}

int comm_send(comm *c, int peer, uint64_t tag, const void *buf, size_t len, pp_err *err) {
    char ts[128];
    if (check_peer(c, peer, "send", err) < 0) return -1;
    if (!buf && len) return pp_fail(err, "comm: send of %zu bytes to rank %d: NULL buffer", len, peer);
    comm_peer *p = &c->peers[peer];
    comm_hdr h = {tag, len};
    size_t total = sizeof h + len, done = 0;
    pthread_mutex_lock(&p->mu);
    if (p->send_failed || atomic_load(&p->dead) || atomic_load(&p->setup) < 0) {
        int dead = atomic_load(&p->dead);
        int r = pp_fail(err, "comm: cannot send %s to rank %d: %s", comm_tag_str(tag, ts, sizeof ts), peer,
                        p->send_failed ? p->send_err
                        : dead         ? p->dead_why
                                       : p->setup_err);
        pthread_mutex_unlock(&p->mu);
        if (dead) note_wait(c, peer, 1); /* this rank's failure comes from the peer's end */
        return r;
    }
    /* Fast path: nothing queued ahead, so writing now keeps the order. */
    int ahead = 0;  /* sends queued by other threads while this one wrote on: they go after */
    if (atomic_load(&p->setup) == 1 && !p->q_head && !p->busy) {
        done = p->kind == COMM_SHM ? comm_shm_try_write(p, &h, sizeof h, buf, len)
                                   : comm_tcp_try_write(p, &h, sizeof h, buf, len);
        if (done < total && done >= sizeof h && p->kind == COMM_SHM) {
            /* Past a full ring: write on while the peer reads, without mu
             * (the peer may be a receive of this process); busy keeps the
             * sender thread and other sends behind this one. */
            p->busy = ahead = 1;
            pthread_mutex_unlock(&p->mu);
            done += comm_shm_write_on(p, (const char *)buf + (done - sizeof h), total - done);
            pthread_mutex_lock(&p->mu);
            p->busy = 0;
            pthread_cond_broadcast(&p->cv_out);
            pthread_cond_broadcast(&p->cv_flush);
        }
        if (done == total) {
            pthread_mutex_unlock(&p->mu);
            return 0;
        }
    }
    comm_out *o = take_spare(p, total - done);
    if (!o && (o = malloc(sizeof *o + (total - done)))) o->cap = total - done;
    if (!o) {
        pthread_mutex_unlock(&p->mu);
        /* Part of the message may be in the channel already: the stream is broken. */
        if (done) sender_fail(p, "out of memory while queueing a message");
        return pp_fail(err, "comm: out of memory queueing %zu bytes for rank %d", total - done, peer);
    }
    o->next = NULL;
    o->n = total - done;
    unsigned char *d = o->data;
    if (done < sizeof h) {
        memcpy(d, (const char *)&h + done, sizeof h - done);
        d += sizeof h - done;
        if (len) memcpy(d, buf, len);
    } else if (len) {
        memcpy(d, (const char *)buf + (done - sizeof h), total - done);
    }
    if (ahead) { /* the rest of a message already started: before anything queued meanwhile */
        o->next = p->q_head;
        p->q_head = o;
        if (!p->q_tail) p->q_tail = o;
    } else {
        if (p->q_tail)
            p->q_tail->next = o;
        else
            p->q_head = o;
        p->q_tail = o;
    }
    p->q_bytes += o->n;
    p->q_msgs++;
    if (!p->sender_started) {
        int e = pthread_create(&p->sender, NULL, sender_main, p);
        if (e != 0) {
            drop_queue_locked(p);
            pthread_mutex_unlock(&p->mu);
            char why[sizeof err->msg];
            comm_thread_failed(c, "sender", peer, e, why, sizeof why);
            return pp_fail(err, "%s", why);
        }
        p->sender_started = 1;
        atomic_fetch_add(&c->peer_threads, 1);
    }
    pthread_cond_broadcast(&p->cv_out);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* ---- receive ------------------------------------------------------------- */

/* A receive; with `note`, one that waits long says for whom (note_wait).
 * Slices of a longer wait (devcomm's polls) do not. */
static int recv_msg(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, int note, int *timed_out,
                    pp_err *err) {
    char ts[128];
    *timed_out = 0;
    if (check_peer(c, peer, "recv", err) < 0) return -1;
    if (!buf && len) return pp_fail(err, "comm: recv of %zu bytes from rank %d: NULL buffer", len, peer);
    comm_peer *p = &c->peers[peer];
    pp_err e;
    if (peer_setup(p, &e) < 0)
        return pp_fail(err, "comm: rank %d cannot receive %s from rank %d: %s", c->rank,
                       comm_tag_str(tag, ts, sizeof ts), peer, e.msg);
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    uint64_t note_at = pp_now_ns() + (uint64_t)comm_wait_note_ms(timeout_ms) * 1000000ull;
    int mine = 0, rc = 0, accepted = 0, noted = !note, peer_failed = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (mine && p->p_done) {
            if (p->p_failed) {
                peer_failed = 1;
                rc = pp_fail(err, "comm: rank %d %s while rank %d received %s from it", peer,
                             atomic_load(&p->dead) ? p->dead_why : p->in_why, c->rank,
                             comm_tag_str(tag, ts, sizeof ts));
            }
            break;
        }
        comm_msg *prev = NULL, *m = p->in_head;
        while (m && m->tag != tag) {
            prev = m;
            m = m->next;
        }
        if (m) {
            if (m->len != len) {
                rc = pp_fail(err, "comm: message %s from rank %d has %zu bytes, but rank %d expected %zu",
                             comm_tag_str(tag, ts, sizeof ts), peer, m->len, c->rank, len);
                break;  /* the message stays in the inbox: a failed recv changes nothing */
            }
            if (prev)
                prev->next = m->next;
            else
                p->in_head = m->next;
            if (p->in_tail == m) p->in_tail = prev;
            if (len) memcpy(buf, m->data, len);
            free(m->data);
            free(m);
            break;
        }
        if (!p->posted) {
            p->posted = mine = 1;
            p->p_tag = tag;
            p->p_buf = buf;
            p->p_len = len;
            p->p_claimed = p->p_done = p->p_failed = 0;
        }
        int claimed = mine && p->p_claimed;
        if (!claimed && atomic_load(&p->dead) && p->in_state == COMM_IN_NONE && c->listen_fd >= 0 && !accepted) {
            /* Its connection to us (and what it sent) may wait in the backlog. */
            accepted = 1;
            pthread_mutex_unlock(&p->mu);
            comm_tcp_accept(c, TCP_ACCEPT_WAIT_MS);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        if (!claimed && (p->in_state == COMM_IN_CLOSED || (atomic_load(&p->dead) && p->in_state == COMM_IN_NONE))) {
            peer_failed = !p->in_local;
            rc = pp_fail(err, "comm: rank %d %s; rank %d was waiting for %s from it", peer,
                         atomic_load(&p->dead) ? p->dead_why : p->in_why, c->rank, comm_tag_str(tag, ts, sizeof ts));
            break;
        }
        if (atomic_load(&c->stopping)) {
            rc = pp_fail(err, "comm: closed while waiting for %s from rank %d", comm_tag_str(tag, ts, sizeof ts), peer);
            break;
        }
        if (!claimed && pp_now_ns() >= deadline) {
            *timed_out = 1;
            rc = pp_fail(err, "comm: rank %d timed out after %d ms waiting for %s from rank %d", c->rank, timeout_ms,
                         comm_tag_str(tag, ts, sizeof ts), peer);
            break;
        }
        if (!claimed && !noted && pp_now_ns() >= note_at) {
            /* Waiting long: say for whom (the launcher follows these). */
            noted = 1;
            pthread_mutex_unlock(&p->mu);
            note_wait(c, peer, 0);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        /* On cv_in (CLOCK_MONOTONIC, see comm_open), or reading the shm ring (comm_shm.c). */
        uint64_t until = claimed ? UINT64_MAX : !noted && note_at < deadline ? note_at : deadline;
        comm_wait_in(p, until);
    }
    if (mine) p->posted = 0;
    pthread_mutex_unlock(&p->mu);
    if (note && noted && rc == 0) note_wait(c, -1, 0); /* a failure leaves it: whom this rank was waiting for */
    /* Failed because the peer died or closed, however soon: the launcher's
     * blame follows this rank to the peer (the two exits are often reaped
     * in one round). */
    if (note && peer_failed && !atomic_load(&c->stopping)) note_wait(c, peer, 1); /* not this rank's own close */
    return rc;
}

int comm_recv(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, pp_err *err) {
    int timed_out;
    return recv_msg(c, peer, tag, buf, len, timeout_ms, 1, &timed_out, err);
}

int comm_recv_timed(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, int *timed_out,
                    pp_err *err) {
    return recv_msg(c, peer, tag, buf, len, timeout_ms, 0, timed_out, err);
}

int comm_flush(comm *c, int timeout_ms, pp_err *err) {
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        comm_peer *p = &c->peers[r];
        int rc = 0, dead = 0;
        pthread_mutex_lock(&p->mu);
        for (;;) {
            if (p->send_failed) {
                rc = pp_fail(err, "comm: flush: messages to rank %d were not delivered: %s", r, p->send_err);
                dead = atomic_load(&p->dead);
                break;
            }
            if (!p->q_head && !p->busy) break;
            if (atomic_load(&p->setup) < 0) {
                rc = pp_fail(err, "comm: flush: %zu messages to rank %d were not delivered: %s", p->q_msgs, r,
                             p->setup_err);
                break;
            }
            /* A dead peer needs no case here: the sender thread notices it
             * and fails (send_failed) or finishes the write it was in. */
            if (pp_now_ns() >= deadline) {
                rc = pp_fail(err, "comm: flush timed out after %d ms: %zu messages (%zu bytes) to rank %d still queued",
                             timeout_ms, p->q_msgs, p->q_bytes, r);
                break;
            }
            pp_cond_wait_until(&p->cv_flush, &p->mu, deadline);
        }
        pthread_mutex_unlock(&p->mu);
        if (dead) note_wait(c, r, 1);
        if (rc < 0) return rc;
    }
    return 0;
}

/* ---- open / close -------------------------------------------------------- */

int comm_open(const comm_config *cfg, comm **out, pp_err *err) {
    *out = NULL;
    if (!cfg) return pp_fail(err, "comm: no configuration");
    if (cfg->world < 1 || cfg->world > COMM_MAX_WORLD)
        return pp_fail(err, "comm: world size %d out of range (1..%d)", cfg->world, COMM_MAX_WORLD);
    if (cfg->rank < 0 || cfg->rank >= cfg->world)
        return pp_fail(err, "comm: rank %d out of range (world size %d)", cfg->rank, cfg->world);
    if (!cfg->job_key || !cfg->job_key[0] || strlen(cfg->job_key) > 200 || strpbrk(cfg->job_key, " \t\n"))
        return pp_fail(err, "comm: job_key must be 1..200 characters without spaces");
    if (!cfg->exchange.put || !cfg->exchange.get) return pp_fail(err, "comm: no exchange (put/get) given");
    int force = 0;
    const char *t = cfg->transport ? cfg->transport : "auto";
    if (!strcmp(t, "shm"))
        force = COMM_SHM;
    else if (!strcmp(t, "tcp"))
        force = COMM_TCP;
    else if (strcmp(t, "auto"))
        return pp_fail(err, "comm: unknown transport '%s' (accepted: auto, shm, tcp)", t);
    const char *host = cfg->tcp_host ? cfg->tcp_host : "127.0.0.1";
    if (!host[0] || strlen(host) > 200 || strpbrk(host, " \t\n"))
        return pp_fail(err, "comm: bad tcp host '%.100s'", host);
    if (cfg->token && cfg->token[0] && pp_token_check(cfg->token, "comm", err) < 0) return -1;

    comm *c = calloc(1, sizeof *c);
    if (!c) return pp_fail(err, "comm: out of memory");
    c->rank = cfg->rank;
    c->world = cfg->world;
    c->ex = cfg->exchange;
    c->force = force;
    c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 30000;
    snprintf(c->job_key, sizeof c->job_key, "%s", cfg->job_key);
    snprintf(c->host, sizeof c->host, "%s", host);
    if (cfg->token) snprintf(c->token, sizeof c->token, "%s", cfg->token);
    c->job_hash = pp_hash_str(c->job_key);
    c->listen_fd = c->wake_fd = -1;
    pthread_mutex_init(&c->accept_mu, NULL);
    pthread_mutex_init(&c->ex_mu, NULL);
    c->node = calloc((size_t)c->world, sizeof *c->node);
    c->peers = calloc((size_t)c->world, sizeof *c->peers);
    if (!c->node || !c->peers) {
        free(c->node);
        free(c->peers);
        free(c);
        return pp_fail(err, "comm: out of memory");
    }
    for (int r = 0; r < c->world; r++) c->node[r] = cfg->rank_node ? cfg->rank_node[r] : 0;
    c->node_given = cfg->rank_node != NULL;

    for (int r = 0; r < c->world; r++) c->peers[r].pidfd = c->peers[r].out_fd = c->peers[r].in_fd = -1;
    int need_tcp = 0, node_ranks = 0;
    for (int r = 0; r < c->world; r++) {
        comm_peer *p = &c->peers[r];
        p->c = c;
        p->rank = r;
        p->same_node = c->node[r] == c->node[c->rank];
        node_ranks += p->same_node;
        p->kind = force ? force : p->same_node ? COMM_SHM : COMM_TCP;
        pthread_mutex_init(&p->mu, NULL);
        pthread_mutex_init(&p->setup_mu, NULL);
        pp_cond_init_monotonic(&p->cv_in);
        pp_cond_init_monotonic(&p->cv_out);
        pp_cond_init_monotonic(&p->cv_flush);
        if (r == c->rank) continue;
        if (force == COMM_SHM && !p->same_node) {
            pp_fail(err, "comm: transport shm requested, but rank %d is on node %d and rank %d on node %d", r,
                    c->node[r], c->rank, c->node[c->rank]);
            comm_close(c);
            return -1;
        }
        if (p->kind == COMM_TCP) need_tcp = 1;
    }
    c->shm_ring = comm_shm_first_ring(node_ranks);

    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0) {
        comm_close(c);
        return pp_fail(err, "comm: eventfd: %s", strerror(errno));
    }
    if (need_tcp && comm_tcp_listen(c, err) < 0) {
        comm_close(c);
        return -1;
    }
    char key[320], val[400];
    snprintf(key, sizeof key, COMM_KEY_FMT, c->job_key, c->rank);
    int n = snprintf(val, sizeof val, "pid=%d node=%d host=%s port=%d", (int)getpid(), c->node[c->rank], c->host,
                     c->port);
    pthread_mutex_lock(&c->ex_mu);  /* no other thread yet; locked for the rule's sake */
    int put = c->ex.put(c->ex.ctx, key, val, (size_t)n, err);
    pthread_mutex_unlock(&c->ex_mu);
    if (put < 0) {
        pp_wrap(err, "comm: rank %d cannot publish its endpoint (key %s)", c->rank, key);
        comm_close(c);
        return -1;
    }
    if (pthread_create(&c->monitor, NULL, comm_monitor_main, c) != 0) {
        comm_close(c);
        return pp_fail(err, "comm: cannot start the monitor thread");
    }
    c->monitor_started = 1;
    *out = c;
    return 0;
}

void comm_close(comm *c) {
    if (!c) return;
    atomic_store(&c->stopping, 1);
    if (c->monitor_started) {
        comm_monitor_kick(c);
        pthread_join(c->monitor, NULL);
    }
    for (int r = 0; r < c->world; r++) {
        comm_peer *p = &c->peers[r];
        if (r == c->rank) continue;
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_in);
        pthread_cond_broadcast(&p->cv_out);
        pthread_cond_broadcast(&p->cv_flush);
        pthread_mutex_unlock(&p->mu);
        /* Wait out a set-up in progress (bounded by connect_timeout_ms). */
        pthread_mutex_lock(&p->setup_mu);
        pthread_mutex_unlock(&p->setup_mu);
        if (p->seg) {
            comm_shm_close_out(p);
            comm_shm_wake(p);
        }
        if (p->out_fd >= 0) shutdown(p->out_fd, SHUT_RDWR);
        if (p->in_fd >= 0) shutdown(p->in_fd, SHUT_RDWR);
        if (p->sender_started) pthread_join(p->sender, NULL);
        if (p->reader_started) pthread_join(p->reader, NULL);
        pthread_mutex_lock(&p->mu);
        drop_queue_locked(p);
        while (p->spare) {
            comm_out *o = p->spare;
            p->spare = o->next;
            free(o);
        }
        while (p->in_head) {
            comm_msg *m = p->in_head;
            p->in_head = m->next;
            free(m->data);
            free(m);
        }
        pthread_mutex_unlock(&p->mu);
        if (p->seg) comm_shm_detach(p);
        if (p->out_fd >= 0) close(p->out_fd);
        if (p->in_fd >= 0) close(p->in_fd);
        if (p->pidfd >= 0) close(p->pidfd);
    }
    for (int r = 0; r < c->world; r++) {
        pthread_mutex_destroy(&c->peers[r].mu);
        pthread_mutex_destroy(&c->peers[r].setup_mu);
        pthread_cond_destroy(&c->peers[r].cv_in);
        pthread_cond_destroy(&c->peers[r].cv_out);
        pthread_cond_destroy(&c->peers[r].cv_flush);
    }
    if (c->listen_fd >= 0) close(c->listen_fd);
    comm_tcp_pending_free(c);
    if (c->wake_fd >= 0) close(c->wake_fd);
    pthread_mutex_destroy(&c->accept_mu);
    pthread_mutex_destroy(&c->ex_mu);
    free(c->peers);
    free(c->node);
    free(c);
}

const char *comm_transport_name(const comm *c, int peer) {
    if (!c || peer < 0 || peer >= c->world) return "none";
    if (peer == c->rank) return "self";
    return c->peers[peer].kind == COMM_SHM ? "shm" : "tcp";
}
