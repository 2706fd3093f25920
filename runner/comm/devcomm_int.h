/* devcomm_int.h: what devcomm.c (per-peer dispatch, device identities) shares
 * with its two transports, cuda/devcomm_ipc.c and cuda/devcomm_nccl.c.  Not
 * a contract: only the devcomm files include it.  No CUDA types here, so
 * devcomm.c builds without the toolkit.
 *
 * Each transport serves every peer of its kind; its calls come from the
 * devcomm caller's threads (devcomm.h: several at once) and, for nccl,
 * from its proxy threads (see devcomm_nccl.c). */
#ifndef PP_DEVCOMM_INT_H
#define PP_DEVCOMM_INT_H
#include <stddef.h>
#include <stdint.h>

#include "runner/comm/comm_int.h" /* transports read rank, world, job key, timeout from cfg->host */
#include "runner/comm/devcomm.h"

/* Control tags on the host comm (comm.h's convention, direction field
 * COMM_DIR_DEVACK / COMM_DIR_DEVANN; bits 63..4 a per-directed-pair
 * sequence number, so every control message has a tag of its own). */
static inline uint64_t dc_ctl_tag(uint64_t seq, unsigned dir) {
    return seq << 4 | (dir & 0xFu);
}

/* Store keys, all under "devcomm/<job_key>/". */
#define DC_KEY_DEV "devcomm/%s/dev/%d"      /* rank -> "uuid=<32 hex> bus=<PCI bus id>" */
#define DC_KEY_NCCL "devcomm/%s/nccl/%d-%d" /* sender-receiver -> ncclUniqueId */

/* Pools of device buffers (cuda-ipc send buffers, nccl buffers of a pair)
 * are arrays of structs that start with a dc_slot; a buffer is reused for
 * any message that fits, so sizes near each other share buffers. */
typedef struct dc_slot {
    void *dev;
    size_t cap;
    int busy;
} dc_slot;
/* The index of the smallest free slot of at least len bytes among n slots
 * `stride` bytes apart from `first`, or -1 if none. */
long dc_pool_pick(const dc_slot *first, size_t n, size_t stride, size_t len);
/* The size of a new buffer for len bytes: the first power of two from
 * min_cap (a power of two) that holds it; 0 if len is too large. */
size_t dc_pool_cap(size_t len, size_t min_cap);

/* The exchange under the host comm's exchange lock: comm's own threads use
 * the same exchange (a store client is not thread-safe). */
int dc_ex_put(const devcomm_config *cfg, const char *key, const void *v, size_t len, pp_err *err);
int dc_ex_get(const devcomm_config *cfg, const char *key, void *v, size_t cap, size_t *len, int timeout_ms,
              pp_err *err);
/* 1 if the host comm knows `peer` is gone (process exited, connection
 * closed), with the reason in why ("is gone (process 123 exited)"). */
int dc_peer_gone(const devcomm_config *cfg, int peer, char *why, size_t cap);

#ifdef PPRUN_HAVE_CUDA
/* A device as the pairing sees it. The UUID tells GPUs apart, MIG
 * instances of one GPU too (they share its PCI bus id); the bus id is what
 * messages name, as nvidia-smi shows it. */
typedef struct dc_device_id {
    char uuid[33]; /* 32 lower-case hex digits */
    char bus[64];
} dc_device_id;

/* cuda/devcomm_ipc.c: the identity of CUDA device `device`. */
int dc_device_identify(int device, dc_device_id *out, pp_err *err);

/* The config pointer stays valid until close (it points into the devcomm). */
typedef struct dc_ipc dc_ipc;
int dc_ipc_open(const devcomm_config *cfg, dc_ipc **out, pp_err *err);
int dc_ipc_send(dc_ipc *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err);
int dc_ipc_recv(dc_ipc *t, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err);
int dc_ipc_flush(dc_ipc *t, uint64_t deadline_ns, int timeout_ms, pp_err *err);
void dc_ipc_close(dc_ipc *t);

/* Loads NCCL once (PPRUN_NCCL_LIB, else the toolkit's copy, else the
 * soname); 0 if every function devcomm calls is there.  Used at the first
 * nccl exchange, and by the tests against the real library. */
int dc_nccl_library(pp_err *err);
/* "NCCL 2.28.9 (/path/libnccl.so.2)" once loaded, for error messages;
 * static storage, read-only after dc_nccl_library. */
const char *dc_nccl_version(void);

typedef struct dc_nccl dc_nccl;
int dc_nccl_open(const devcomm_config *cfg, dc_nccl **out, pp_err *err);
int dc_nccl_send(dc_nccl *t, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err);
int dc_nccl_recv(dc_nccl *t, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err);
int dc_nccl_flush(dc_nccl *t, uint64_t deadline_ns, int timeout_ms, pp_err *err);
void dc_nccl_close(dc_nccl *t);
#endif

#endif
