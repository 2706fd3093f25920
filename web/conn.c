/* conn.c: a connection's socket (conn.h). */
#include "web/conn.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

int conn_client_gone(int fd) {
    if (fd < 0) return 0;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int conn_client_left(int fd, unsigned idle_ms) {
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    return conn_client_gone(fd) && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) == 0 &&
           ti.tcpi_last_data_recv >= idle_ms;
}
