/* comm.h: point-to-point messages between ranks (docs/design.md §1).
 *
 * One interface, two transports picked per peer: shared memory between
 * processes on one node (a ring per directed pair, futex wake-ups, no busy
 * spinning) and TCP between nodes. Sends are asynchronous and buffered (the
 * call copies the data and returns); receives block until the message with
 * the wanted tag arrives from that peer, or the timeout passes, or the peer
 * is gone. Messages from one peer may be received in any tag order.
 *
 * Endpoints are exchanged through a key/value service the caller provides
 * (the launcher's store in production, anything in tests).
 *
 * CONTRACT: the engine (runner/worker/engine.c) relies on everything below. */
#ifndef PP_COMM_H
#define PP_COMM_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

typedef struct comm_exchange {
    void *ctx;
    int (*put)(void *ctx, const char *key, const void *value, size_t len, pp_err *err);
    /* Waits up to timeout_ms for the key; copies at most cap bytes; *len = its size.
     * comm calls put and get from one thread at a time (never concurrently),
     * so they need not be thread-safe. */
    int (*get)(void *ctx, const char *key, void *value, size_t cap, size_t *len, int timeout_ms, pp_err *err);
} comm_exchange;

typedef struct comm_config {
    int rank, world;
    const int *rank_node;  /* [world]: node index of every rank; same node -> shm */
    const char *job_key;   /* unique per job attempt, names shm objects and store keys */
    comm_exchange exchange;
    int connect_timeout_ms;
    const char *transport; /* "auto" (default if NULL), "shm" or "tcp" (tcp also on one node) */
    const char *tcp_host;  /* address other nodes reach this rank at; NULL = 127.0.0.1 */
    /* Addition: the job token (base/token.h; NULL or "" = none),
     * copied. Presented on every TCP connection this rank opens; when set,
     * required of every TCP connection it accepts (one without it is
     * closed before anything else is read, and a line naming its address
     * goes to stderr). The worker takes it from $PPRUN_RDZV_TOKEN. */
    const char *token;
} comm_config;

typedef struct comm comm;

/* Connects lazily or eagerly as the implementation likes; peers that never
 * talk cost nothing. */
int comm_open(const comm_config *cfg, comm **out, pp_err *err);
/* Copies buf; never blocks on the receiver (unbounded buffering). */
int comm_send(comm *c, int peer, uint64_t tag, const void *buf, size_t len, pp_err *err);
/* Blocks until the message (peer, tag) arrives; its length must equal len.
 * Errors name the peer and the tag: timeout, peer gone, size mismatch. */
int comm_recv(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, pp_err *err);
/* Waits until every message sent so far is in the receiver's hands (or its
 * buffer): call before exit so nothing in flight is lost. */
int comm_flush(comm *c, int timeout_ms, pp_err *err);
void comm_close(comm *c);
/* "shm" or "tcp": the transport used for that peer. */
const char *comm_transport_name(const comm *c, int peer);

/* ---- additions (comm module) -------------------------------------------- */

/* Tag convention for the engine (docs/comm.md): one 64-bit tag names one
 * tensor of one step.  Bits: step 63..40 (24), stage 39..24 (16),
 * microbatch 23..4 (20), direction 3..0 (4).  `stage` is the stage that
 * RECEIVES the tensor: the activation of stage s travels as
 * comm_tag(step, s + 1, mb, COMM_DIR_ACT); the gradient stage s sends
 * upstream travels as comm_tag(step, s - 1, mb, COMM_DIR_GRAD).  Fields are
 * masked to their width, so steps wrap every 2^24 (harmless: a tag only has
 * to be unique among the messages in flight between two ranks). */
enum { COMM_DIR_ACT = 0, COMM_DIR_GRAD = 1, COMM_DIR_CTRL = 2 };
/* devcomm's own control messages (devcomm.h): a cuda-ipc receiver's
 * acknowledgement and an nccl sender's announcement.  Bits 63..4 of these
 * tags hold a per-directed-pair sequence number instead of the fields above. */
enum { COMM_DIR_DEVACK = 3, COMM_DIR_DEVANN = 4 };
/* A cuda-ipc sender's announcement of the data message with tag T travels
 * as T | COMM_DIR_DEVDATA: directions 8..15 are devcomm's, so the data tags
 * given to devcomm (directions 0..7) stay free for host messages. */
enum { COMM_DIR_DEVDATA = 8 };
/* The data-parallel collectives' messages (comm_coll.h: the microbatch
 * field holds the bucket, the operation and the message's index, docs/comm.md
 * "Collectives") and an evaluation step's activations (their step is the
 * training step they follow). */
enum { COMM_DIR_COLL = 5, COMM_DIR_EVAL = 6 };
static inline uint64_t comm_tag(uint64_t step, uint64_t stage, uint64_t mb, uint64_t dir) {
    return (step & 0xFFFFFFull) << 40 | (stage & 0xFFFFull) << 24 | (mb & 0xFFFFFull) << 4 | (dir & 0xFull);
}
/* "tag 0x... (step 3, stage 2, microbatch 5, activation)" into buf; returns buf.
 * Every comm error message names the tag this way. */
const char *comm_tag_str(uint64_t tag, char *buf, size_t cap);

/* The job key of attempt `attempt` of run `run_id` ("RUN-aN"): what the
 * comm of its ranks is opened with, and names its store keys and
 * shared-memory objects by. */
void comm_job_key(const char *run_id, int attempt, char *buf, size_t cap);

/* Removes the shared-memory objects the attempt of `job_key` may have
 * left on this machine: a rank died before its peer attached, or the
 * launcher was killed (its guard's salvage calls it). One read of
 * /dev/shm, whatever the world's size (every pair's name tried was half a
 * million unlink calls at 1,024 ranks, each launcher, each attempt). Safe
 * once nobody of the attempt still needs to attach. */
void comm_cleanup(const char *job_key);
/* comm_cleanup for attempts 0 .. attempts-1 of run `run_id`, in one read
 * of /dev/shm: a killed launcher's guard does not know which it reached. */
void comm_cleanup_run(const char *run_id, int attempts);

/* Store key under which rank publishes its endpoint ("pid=.. node=.. host=..
 * port=..") at comm_open: "comm/<job_key>/ep/<rank>". */
#define COMM_KEY_FMT "comm/%s/ep/%d"

/* Who waits for whom. A receive that has waited comm_wait_note_ms(timeout)
 * for its message says so through the exchange: "comm/<job_key>/wait/<rank>"
 * holds the rank it waits for, in decimal, until the message comes (then
 * ""). A receive that fails (timed out, the peer gone) leaves it, and a
 * receive, send or flush that fails because the peer died or closed,
 * however soon, writes "<rank> gone", so after a rank failed its key names
 * the rank it was waiting for, or whose end failed it. The launcher
 * follows these keys to the rank everyone waited for: the root cause of a
 * hang, where the ranks that timed out are only its first witnesses
 * (runner/job/job_blame.c). */
#define COMM_WAIT_KEY_FMT "comm/%s/wait/%d"
#define COMM_WAIT_GONE "gone"
/* A quarter of the receive's timeout, at most 1 s: short enough that every
 * rank waiting behind a hung one has said so well before its own timeout,
 * long enough that the receives of a healthy pipeline (its bubbles) almost
 * never do. A negative timeout (none) waits 1 s. */
static inline int comm_wait_note_ms(int timeout_ms) {
    return timeout_ms >= 0 && timeout_ms / 4 < 1000 ? timeout_ms / 4 : 1000;
}

#endif
