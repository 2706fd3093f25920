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

#endif
