/* conn.h: a connection's socket, for the threads that watch connections
 * libmicrohttpd is not reading: live streams (live.c) and requests
 * waiting for a worker (sqlpool.c) sit suspended, and the reaper
 * (reaper.c) times requests as they arrive. */
#ifndef PP_WEB_CONN_H
#define PP_WEB_CONN_H
#include <microhttpd.h>

/* The socket of connection c, -1 when libmicrohttpd does not say. */
int conn_fd(struct MHD_Connection *c);
/* Whether the client on fd (a suspended connection's socket: libmicrohttpd
 * reads nothing from it meanwhile, and sees no disconnect) has closed its
 * end or reset it: end of file, or an error other than "nothing to read
 * yet". Bytes it sent are left where they are. 0 for fd -1. */
int conn_client_gone(int fd);
/* Whether the client on fd sent its request and left: conn_client_gone,
 * and nothing came from it for at least idle_ms (TCP_INFO). A client that
 * only shut down its sending side once it sent (`nc -N`, some probes)
 * reads the same as one that closed; it is told apart by time: it is
 * answered at once, while a request left waiting behind others (a burst
 * queued in the listening socket) has been idle. */
int conn_client_left(int fd, unsigned idle_ms);

#endif
