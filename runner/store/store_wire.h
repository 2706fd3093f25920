/* store_wire.h: the store's wire format, shared by server and client.
 *
 * Every message is a frame: u32 payload length (big endian), then payload.
 * Request payload: u8 op, then the op's fields. Strings and blobs are
 * u32 length + bytes; integers are big endian.
 *   SET  key blob          -> status
 *   GET  key               -> status [value bytes: the rest of the payload]
 *   ADD  key i64           -> status [i64 new value]
 *   DEL  key               -> status (OK or MISSING)
 *   WAIT i64 timeout_ms u32 n, n keys -> status (OK or TIMEOUT)
 *   TIME                   -> status u64 server CLOCK_MONOTONIC ns
 *   AUTH blob token        -> status (OK, or BAD and the server closes)
 *   CLAIM key              -> status: key set (empty) while this connection
 *                             lasts; the server deletes it when the
 *                             connection closes (a launcher's liveness);
 *                             BAD where the key exists already
 * A server with a job token takes AUTH with that token as a connection's
 * first request and nothing else: any other first frame (or one longer than
 * STORE_MAX_AUTH_FRAME) is answered BAD and the connection closed. Servers
 * without a token answer AUTH with OK. (AUTH and CLAIM are the additions
 * since the first version of this format; an older server answers them BAD
 * "unknown operation".)
 * Reply payload: u8 status, then the op's result. A BAD reply carries a
 * message as the rest of the payload. Requests are answered in order; a
 * pending WAIT holds back the connection's later requests. */
#ifndef PP_STORE_WIRE_H
#define PP_STORE_WIRE_H
#include <stdint.h>

#include "base/token.h"
#include "runner/store/store.h"

enum { STORE_OP_SET = 1, STORE_OP_GET, STORE_OP_ADD, STORE_OP_DEL, STORE_OP_WAIT, STORE_OP_TIME, STORE_OP_AUTH,
       STORE_OP_CLAIM };
#define STORE_MAX_CLAIMS 4 /* keys one connection holds */
enum { STORE_OK = 0, STORE_MISSING = 1, STORE_TIMEOUT = 2, STORE_BAD = 3 };

/* A frame larger than this is a protocol error (value + key + headers). */
#define STORE_MAX_FRAME (STORE_MAX_VALUE + 2 * STORE_MAX_KEY + 64u)
#define STORE_MAX_WAIT_KEYS 1024u
/* A WAIT this long (ms) has no deadline, on the server and the client. */
#define STORE_WAIT_FOREVER_MS (365ll * 24 * 3600 * 1000)
/* The largest first frame a token-guarded server reads: op, blob length,
 * the longest token. */
#define STORE_MAX_AUTH_FRAME (1u + 4u + PP_TOKEN_MAX)

static inline void store_put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline uint32_t store_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static inline void store_put_u64(uint8_t *p, uint64_t v) {
    store_put_u32(p, (uint32_t)(v >> 32));
    store_put_u32(p + 4, (uint32_t)v);
}
static inline uint64_t store_get_u64(const uint8_t *p) {
    return (uint64_t)store_get_u32(p) << 32 | store_get_u32(p + 4);
}

#endif
