/* comm_watch.c: the monitor thread of a comm.  It polls, with one eventfd
 * to wake it: a pidfd of every peer on this node (readable the moment that
 * process exits, zombie or not: kill(pid, 0) cannot tell), every outgoing
 * TCP socket for POLLRDHUP (nothing is ever sent back on it, so readable
 * means closed or reset), the TCP listener (new peers) and the connections
 * it accepted whose hello is still coming (comm_tcp_accept reads them as
 * their bytes arrive: a stranger who connects and says nothing stalls
 * nothing).  A dead peer is
 * marked and every waiter on it woken, so receivers and blocked senders
 * fail at once with the peer's name. */
#include "runner/comm/comm_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void comm_monitor_kick(comm *c) {
    uint64_t one = 1;
    if (write(c->wake_fd, &one, sizeof one) < 0) { /* counter full: a wake-up is pending anyway */ }
}

void comm_peer_dead(comm_peer *p, const char *why) {
    pthread_mutex_lock(&p->mu);
    if (atomic_load(&p->dead)) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    snprintf(p->dead_why, sizeof p->dead_why, "%s", why);
    atomic_store(&p->dead, 1);
    pthread_cond_broadcast(&p->cv_in);
    pthread_cond_broadcast(&p->cv_out);
    pthread_cond_broadcast(&p->cv_flush);
    pthread_mutex_unlock(&p->mu);
    /* Threads of ours sleeping on the ring futexes re-check `dead` on wake. */
    if (p->kind == COMM_SHM && p->seg) comm_shm_wake(p);
}

/* A process that exited is gone even if nobody reaped it yet: kill(pid, 0)
 * succeeds on zombies, so read the state letter instead.  Used only where
 * pidfd_open is unavailable (kernel < 5.3). */
static int proc_gone(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

void *comm_monitor_main(void *arg) {
    comm *c = arg;
    int cap = 2 + 2 * c->world + COMM_TCP_PENDING_MAX;
    struct pollfd *fds = calloc((size_t)cap, sizeof *fds);
    int *who = calloc((size_t)cap, sizeof *who);
    if (!fds || !who) {  /* cannot watch: peers' deaths fall back to timeouts */
        free(fds);
        free(who);
        return NULL;
    }
    while (!atomic_load(&c->stopping)) {
        int n = 0, need_proc = 0;
        fds[n] = (struct pollfd){.fd = c->wake_fd, .events = POLLIN};
        who[n++] = -1;
        if (c->listen_fd >= 0) {
            fds[n] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
            who[n++] = -2;
            /* hellos still coming: their bytes wake it (who -2 too: comm_tcp_accept reads them) */
            pthread_mutex_lock(&c->accept_mu);
            int k = comm_tcp_pending_fds(c, fds + n, COMM_TCP_PENDING_MAX);
            pthread_mutex_unlock(&c->accept_mu);
            for (int i = 0; i < k; i++) who[n++] = -2;
        }
        for (int r = 0; r < c->world; r++) {
            comm_peer *p = &c->peers[r];
            if (r == c->rank || atomic_load(&p->setup) != 1 || atomic_load(&p->dead)) continue;
            if (p->pidfd >= 0) {
                fds[n] = (struct pollfd){.fd = p->pidfd, .events = POLLIN};
                who[n++] = r;
            } else if (p->pid > 0) {
                need_proc = 1;
            }
            if (p->out_fd >= 0) {
                /* Nothing is ever sent to us on this socket: readable means EOF or reset. */
                fds[n] = (struct pollfd){.fd = p->out_fd, .events = POLLRDHUP};
                who[n++] = r;
            }
        }
        int rc = poll(fds, (nfds_t)n, need_proc ? 200 : 1000);
        if (rc < 0 && errno != EINTR) break;
        /* Accept first: a peer that connected, sent and died must have its
         * connection (and the data in it) taken before its death is seen. */
        if (c->listen_fd >= 0) comm_tcp_accept(c, 0);
        for (int i = 0; rc > 0 && i < n; i++) {
            if (!fds[i].revents) continue;
            if (who[i] == -1) {
                uint64_t v;
                if (read(c->wake_fd, &v, sizeof v) < 0) { /* EAGAIN: already drained */ }
            } else if (who[i] >= 0) {
                comm_peer *p = &c->peers[who[i]];
                char why[128];
                if (fds[i].fd == p->pidfd)
                    snprintf(why, sizeof why, "died (process %d exited)", (int)p->pid);
                else
                    snprintf(why, sizeof why, "closed its connection (process exited or called comm_close)");
                comm_peer_dead(p, why);
            }
        }
        if (need_proc)
            for (int r = 0; r < c->world; r++) {
                comm_peer *p = &c->peers[r];
                if (r != c->rank && atomic_load(&p->setup) == 1 && !atomic_load(&p->dead) && p->pidfd < 0 &&
                    p->pid > 0 && proc_gone(p->pid)) {
                    char why[128];
                    snprintf(why, sizeof why, "died (process %d exited)", (int)p->pid);
                    comm_peer_dead(p, why);
                }
            }
    }
    free(fds);
    free(who);
    return NULL;
}
