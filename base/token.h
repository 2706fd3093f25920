/* token.h: the job secret that guards pprun's multi-node ports: the
 * rendezvous store, the trace collector's ingest listener and the workers'
 * TCP data plane (docs/launch.md, "The job token").
 *
 * The rule is the dashboard's: loopback needs nothing, an address other
 * machines can reach needs a token. Every client presents the token first;
 * a server that has one compares it in constant time and closes a
 * connection that does not present it before reading anything else. The
 * token travels in clear: it keeps out whoever can merely reach the ports,
 * not someone who can read the cluster's traffic. */
#ifndef PP_TOKEN_H
#define PP_TOKEN_H
#include <stddef.h>

#include "base/pp.h"

/* Longest token, in bytes (a 64-hex-digit secret fits four times over). */
#define PP_TOKEN_MAX 256
/* Where workers (and launchers without a flag) find it. */
#define PP_TOKEN_ENV "PPRUN_RDZV_TOKEN"

/* 0 if tok is 1..PP_TOKEN_MAX printable ASCII characters without spaces
 * (so it survives environments, files and shells unchanged); else -1 with
 * a message naming `what` (the flag, variable or file), never the token. */
int pp_token_check(const char *tok, const char *what, pp_err *err);
/* Reads a token from the first line of path (a trailing "\n" or "\r\n" is
 * dropped) into out[PP_TOKEN_MAX + 1] and checks it. */
int pp_token_read_file(const char *path, const char *what, char *out, pp_err *err);
/* 1 if got[0, got_len) is the token want, else 0. The time taken does not
 * depend on where the two differ. want NULL or "" matches nothing. */
int pp_token_equal(const char *want, const void *got, size_t got_len);


#endif
