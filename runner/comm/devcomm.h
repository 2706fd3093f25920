/* devcomm.h: point-to-point messages between ranks in GPU memory (docs/design.md §1).
 *
 * The device-memory twin of comm.h, with the same semantics so the engine
 * treats both alike: sends are asynchronous and buffered (the call takes its
 * own copy of the data and returns; never waits for the receiver, however
 * many sends are outstanding), receives block until the message with the
 * wanted tag from that peer has landed in the caller's buffer, the timeout
 * passes, or the peer is gone. Messages from one peer may be received in any
 * tag order.
 *
 * Two transports, picked per peer at open (a forced one must suit every pair):
 *   cuda-ipc  the two ranks share one GPU (same node, same PCI bus id): the
 *             receiver copies out of the sender's buffer through
 *             cudaIpcOpenMemHandle, ordered by an interprocess event;
 *   nccl      any other pair (one GPU per rank, any node): ncclSend/ncclRecv
 *             on non-blocking communicators, async errors polled, aborted on
 *             failure (NCCL 2.28 refuses two ranks on one GPU).
 * Both use the host comm (comm.h) given at open for their small control
 * messages (announcements, acknowledgements), so a dead peer shows up there
 * as it does for host transfers.
 *
 * Buffers: every `dev` pointer is device memory of this rank's device whose
 * producing work has completed (the GPU stage synchronises every op);
 * devcomm_recv returns with the copy complete.
 *
 * Only in builds with the GPU backend (PPRUN_HAVE_CUDA); without it
 * devcomm_open fails saying so.
 *
 * Threads: send and recv may be called from any number of threads at once
 * (a rank has up to three: the engine's, during an overlapped pair its
 * second one (engine.c), and the data-parallel all-reduce's (engine_dp.c));
 * each transport serialises its shared state under a mutex that a receive
 * does not hold while it waits for its message, so none waits behind
 * another's message, and no state is kept per calling thread.  open,
 * flush and close: one thread, while no other call runs.  cuda-ipc adds no
 * thread.  nccl adds two proxy threads per pair that talks (one per
 * direction), started at this rank's first call with that peer; each NCCL
 * communicator is driven by its proxy, the caller's thread only asks its
 * async error, and every NCCL call holds one lock per devcomm (NCCL: one
 * thread at a time in the communicators of one device).  CUDA's callback
 * thread marks completions.  Exchange calls (the host
 * comm's exchange) are made under the host comm's exchange lock.
 *
 * Tags: any comm_tag of directions 0..7 (8..15 are refused: devcomm's
 * control messages on the host comm use them, see COMM_DIR_DEVDATA, besides
 * COMM_DIR_DEVACK / COMM_DIR_DEVANN sequence tags); the host comm may carry
 * messages under the same tags.
 *
 * Environment: PPRUN_NCCL_LIB names the libnccl.so.2 to load (default: the
 * toolkit's copy, then the soname).  NCCL_COMM_ID must not be set when a
 * pair uses nccl (open fails: it would give every pair one bootstrap
 * root).  docs/comm.md says more. */
#ifndef PP_DEVCOMM_H
#define PP_DEVCOMM_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"
#include "runner/comm/comm.h"

typedef struct devcomm_config {
    /* Control messages; not owned, must outlive the devcomm.  Rank, world
     * size, the node of every rank, job key, exchange and connect timeout
     * are the host comm's (its comm_config): opened with its rank_node
     * given, since bus ids repeat across nodes. */
    comm *host;
    int device;            /* this rank's CUDA device (index this process sees) */
    const char *transport; /* "auto" (NULL too), "cuda-ipc" or "nccl"; read during open only */
} devcomm_config;

typedef struct devcomm devcomm;

/* Learns every peer's device through the exchange and picks a transport
 * per peer; connects lazily. Errors name the rank and the reason (forced
 * transport impossible for a pair, no GPU backend, CUDA/NCCL failures). */
int devcomm_open(const devcomm_config *cfg, devcomm **out, pp_err *err);
int devcomm_send(devcomm *d, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err);
int devcomm_recv(devcomm *d, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err);
/* Waits until every message sent so far has been taken by its receiver. */
int devcomm_flush(devcomm *d, int timeout_ms, pp_err *err);
void devcomm_close(devcomm *d);
/* "cuda-ipc" or "nccl": the transport used for that peer. */
const char *devcomm_transport_name(const devcomm *d, int peer);

#endif
