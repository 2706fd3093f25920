/* comm_int.h: what comm.c (dispatch, queues, matching, peer death) shares
 * with the two transports, comm_shm.c and comm_tcp.c.  Not a contract: only
 * the comm module includes it.
 *
 * Threads per comm: one monitor (accepts TCP connections, watches peers'
 * pidfds and outgoing sockets), and per peer that talks: one sender thread
 * (drains the send queue into the ring/socket, started at the first send
 * that cannot go straight through) and one reader thread (TCP: moves
 * messages from the socket into the inbox or straight into a posted
 * receive; shm: receives read the ring themselves, and the reader thread
 * hands messages over only after long waits, or drains a ring whose writer
 * waits for room: comm_shm.c). */
#ifndef PP_COMM_INT_H
#define PP_COMM_INT_H
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "base/token.h"
#include "runner/comm/comm.h"

enum { COMM_SHM = 1, COMM_TCP = 2 };
enum { COMM_IN_NONE = 0, COMM_IN_OPEN = 1, COMM_IN_CLOSED = 2 };

/* Every message on the wire (ring or socket) starts with this header. */
typedef struct comm_hdr {
    uint64_t tag, len;
} comm_hdr;

typedef struct comm_out {      /* queued bytes (a message's unsent tail); owned by the queue */
    struct comm_out *next;
    size_t n, cap;
    unsigned char data[];
} comm_out;

typedef struct comm_msg {      /* a received message nobody asked for yet; owned by the inbox */
    struct comm_msg *next;
    uint64_t tag;
    size_t len;
    unsigned char *data;
} comm_msg;

typedef struct comm_ring comm_ring;  /* comm_shm.c */

typedef struct comm_peer {
    struct comm *c;
    int rank;
    int kind;                  /* COMM_SHM or COMM_TCP */
    int same_node;

    pthread_mutex_t setup_mu;  /* held while connecting; never taken under mu */
    _Atomic int setup;         /* 0 not yet, 1 done, -1 failed (setup_err says why) */
    char setup_err[1024];
    pid_t pid;                 /* from the exchange; 0 if unknown (other node) */
    int pidfd;                 /* -1 if none */

    pthread_mutex_t mu;        /* guards everything below */
    /* Three conditions so that a wake-up goes only to whom it concerns
     * (wake-ups are the main cost of small messages). */
    pthread_cond_t cv_in;      /* comm_recv: inbox, posted receive, reader end, death */
    pthread_cond_t cv_out;     /* sender thread: queue not empty, death, close */
    pthread_cond_t cv_flush;   /* comm_flush: queue drained, send failed */
    /* outgoing */
    comm_out *q_head, *q_tail;
    size_t q_bytes, q_msgs;
    int busy;                  /* sender thread is writing a popped item, or comm_send past a full ring */
    comm_out *spare;           /* written big items kept for reuse (fresh pages fault: slow) */
    size_t spare_bytes;
    int sender_started;
    pthread_t sender;
    int send_failed;           /* the sender thread gave up; send_err says why */
    char send_err[256];
    /* incoming */
    comm_msg *in_head, *in_tail;
    int posted, p_claimed, p_done, p_failed;
    uint64_t p_tag;
    void *p_buf;
    size_t p_len;
    int in_state;              /* COMM_IN_*: reader thread not started / running / ended */
    char in_why[256];          /* why the reader ended */
    int in_local;              /* it ended for this rank's own reason (no thread to read): no peer to blame */
    int reader_started;
    pthread_t reader;
    /* death */
    _Atomic int dead;
    char dead_why[256];

    /* shm */
    void *seg;
    size_t seg_size, ring_cap;   /* bytes per direction (the creator's choice) */
    comm_ring *out_ring, *in_ring;
    /* The ring's one reader at a time: a thread in comm_recv, or the
     * reader thread (comm_shm.c). rx_busy is under mu; the rest is the
     * reader's: the message being read (header bytes so far, then payload bytes into
     * rx_dst, an inbox message or the posted receive's buffer when rx_msg
     * is NULL); under mu, how long recent receives waited (whether to
     * spin). */
    int rx_busy;
    comm_hdr rx_hdr;
    size_t rx_hgot, rx_got;
    unsigned char *rx_dst;
    comm_msg *rx_msg;
    uint64_t rx_wait_ns;
    int rx_eager;              /* the reader thread moves what arrives at once (recent waits were long) */
    /* tcp */
    int out_fd, in_fd;
} comm_peer;

typedef struct comm {
    int rank, world;
    int *node;                 /* [world] */
    int node_given;            /* comm_config.rank_node was given (else every node is 0) */
    char job_key[256];
    uint64_t job_hash;
    comm_exchange ex;
    /* Sender threads and receiving threads set up peers concurrently, but
     * an exchange need not be thread-safe (the launcher's store client is
     * one socket: two threads on it steal each other's replies).  Every
     * ex.put / ex.get runs under this lock. */
    pthread_mutex_t ex_mu;
    int connect_timeout_ms;
    int force;                 /* 0 auto, COMM_SHM, COMM_TCP */
    char host[256];
    char token[PP_TOKEN_MAX + 1]; /* "" = none */
    int listen_fd, port;
    pthread_mutex_t accept_mu; /* monitor and comm_recv may both accept; holds the three below */
    struct comm_tcp_pending *pending; /* [COMM_TCP_PENDING_MAX] accepted, hello not all read (comm_tcp.c) */
    int npending;
    int refusals;              /* connections refused for their token, said up to a bound */
    int wake_fd;               /* eventfd: monitor rebuilds its poll set */
    pthread_t monitor;
    int monitor_started;
    _Atomic int stopping;
    _Atomic int peer_threads;  /* reader and sender threads started, for messages */
    size_t shm_ring;           /* the first ring size a shm pair tries (comm_shm_first_ring), once */
    comm_peer *peers;          /* [world] */
} comm;

/* comm_watch.c */
void *comm_monitor_main(void *c);
void comm_peer_dead(comm_peer *p, const char *why);
void comm_monitor_kick(comm *c);

/* comm.c */
/* Where a received message goes, once its header is read: straight into
 * the posted receive when it asked for this tag and length (claimed; *msg
 * NULL), else a new inbox message (*msg); -1 with why when out of memory.
 * comm_rx_deliver hands it over once its payload is in (*msg, or NULL for
 * the posted receive); comm_rx_drop frees one abandoned half-way. */
int comm_rx_begin(comm_peer *p, const comm_hdr *h, void **dst, comm_msg **msg, char *why, size_t cap);
void comm_rx_deliver(comm_peer *p, comm_msg *msg);
void comm_rx_drop(comm_msg *msg);
/* The peer's stream ended (closed, died, comm closed): why, for the
 * receives that wait for it; a posted receive being filled fails. */
void comm_rx_end(comm_peer *p, const char *why);
/* TCP's reader thread body: rd() reads exactly n bytes, or returns -1 and
 * fills why (closed, died, stopping). */
typedef int (*comm_read_fn)(comm_peer *p, void *dst, size_t n, char *why, size_t cap);
void comm_reader_loop(comm_peer *p, comm_read_fn rd);
/* Starts p's reader thread (once): 0, or pthread_create's error. */
int comm_start_reader(comm_peer *p, void *(*fn)(void *));
/* Why the `kind` ("reader", "sender") thread for rank `peer` could not
 * start, pthread_create's error rc, into buf (with the limits on threads). */
void comm_thread_failed(comm *c, const char *kind, int peer, int rc, char *buf, size_t cap);
/* 0 if peer names another rank of c, else -1 with "<who>: <op>: peer rank
 * .. out of range" / ".. is this rank itself" (devcomm shares it). */
int comm_check_peer(const comm *c, int peer, const char *who, const char *op, pp_err *err);
/* comm_recv, telling a timeout (*timed_out = 1: nothing is wrong yet) from
 * every other failure (peer gone, size mismatch, bad arguments): devcomm
 * polls its control messages in slices. */
int comm_recv_timed(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, int *timed_out,
                    pp_err *err);

/* comm_shm.c */
/* Name of the segment holding both rings between ranks a < b. */
#define COMM_SHM_PREFIX "pprun-" /* then the job key's hash, 16 hex digits, and "-A-B" */
void comm_shm_name(uint64_t job_hash, int a, int b, char *buf, size_t cap);
int comm_shm_attach(comm_peer *p, pp_err *err);
/* The rings a pair of ranks tries first (bytes each way; smaller ones where
 * /dev/shm is short): every pair of a node's ranks could hold one (a
 * data-parallel group talks all to all: 64 ranks are 2,016 pairs, 16 GB in
 * 4 MiB rings, which ran a 23 GB machine out of memory at 256 ranks on it),
 * so they shrink until node_ranks' pairs fit in an eighth of `memory` (the
 * process's: pp_memory_bytes), to 256 KiB at the least. On 16 GB: 4 MiB up to 23 ranks a node,
 * 1 MiB up to 45 (docs/comm.md, "Shared memory"). */
size_t comm_shm_ring_bytes(int node_ranks, uint64_t memory);
/* The same for this process's memory (pp_memory_bytes: a container's
 * limit counts /dev/shm's pages too), as the index of the first ring size
 * to try: comm.shm_ring. */
size_t comm_shm_first_ring(int node_ranks);
int comm_shm_start_reader(comm_peer *p);
/* comm_recv's wait, p->mu held: on a shm peer whose ring nobody reads, it
 * reads the ring itself until a message is handed over; if it is empty, it
 * sleeps on the ring's futex (after a short spin when that is worth it)
 * while recent waits were short, else on cv_in for the reader thread's
 * hand-over, until `until` (comm_shm.c); otherwise (and for TCP) it waits
 * on cv_in. */
void comm_wait_in(comm_peer *p, uint64_t until);
size_t comm_shm_try_write(comm_peer *p, const void *a, size_t na, const void *b, size_t nb);
/* comm_send's write past a full ring, p->busy held: on while the peer's
 * receive reads and makes room promptly; the bytes written. */
size_t comm_shm_write_on(comm_peer *p, const void *src, size_t n);
int comm_shm_write_all(comm_peer *p, const void *buf, size_t n, char *why, size_t cap);
void comm_shm_wake(comm_peer *p);     /* wakes both of this peer's ring waiters */
void comm_shm_close_out(comm_peer *p); /* tells the peer's reader no more data comes */
void comm_shm_detach(comm_peer *p);

/* comm_tcp.c */
int comm_tcp_listen(comm *c, pp_err *err);
/* -1: error (the peer refused this rank's token, or never answered the
 * hello); -2: refused or reset, i.e. the peer that published this
 * endpoint has exited. */
int comm_tcp_connect(comm_peer *p, const char *host, int port, pp_err *err);
/* Connections accepted whose hello is still coming, at most: a stranger
 * that connects and says nothing holds one until its deadline, and the
 * oldest goes when all are taken. */
#define COMM_TCP_PENDING_MAX 64
/* Takes every connection waiting in the listener's backlog, reads what
 * has come of each pending hello without waiting, and starts a reader
 * for each peer whose hello is whole and right; wait_ms > 0 goes on
 * until no hello is pending or that long has passed (comm_recv, for a
 * dead peer's connection and data in the backlog). Never blocks on one
 * connection: the monitor calls it with 0. */
void comm_tcp_accept(comm *c, int wait_ms);
/* The pending connections' fds into fds (at most max), for the monitor's
 * poll: their count. */
int comm_tcp_pending_fds(comm *c, struct pollfd *fds, int max);
void comm_tcp_pending_free(comm *c); /* closes and frees them (comm_close) */
size_t comm_tcp_try_write(comm_peer *p, const void *a, size_t na, const void *b, size_t nb);
int comm_tcp_write_all(comm_peer *p, const void *buf, size_t n, char *why, size_t cap);

#endif
