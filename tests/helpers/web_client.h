/* web_client.h: a minimal HTTP/1.1 client over real sockets for the web
 * tests (one request per connection, Connection: close). */
#ifndef PP_TEST_WEB_CLIENT_H
#define PP_TEST_WEB_CLIENT_H
#include <stddef.h>

typedef struct webclient_resp {
    int status;    /* 0 when the connection failed or closed without a reply */
    char *head;    /* status line and headers (malloc) */
    char *body;    /* body (malloc, NUL-terminated); chunked bodies decoded */
    size_t len;
} webclient_resp;

/* Sends `raw` as-is to 127.0.0.1:port and reads until the server closes. */
int webclient_raw(int port, const char *raw, size_t rawlen, webclient_resp *out);
/* method path, extra headers ("Name: v\r\n"...), optional body. */
int webclient_request(int port, const char *method, const char *path, const char *headers, const char *body,
                   webclient_resp *out);
/* A header's value in head (static buffer), or NULL. */
const char *webclient_header(const webclient_resp *r, const char *name);
void webclient_free(webclient_resp *r);
/* GET path, which must answer want_status with a JSON body (Content-Type
 * application/json); the test fails naming what it got otherwise. The
 * caller frees the result with cJSON_Delete. */
struct cJSON *webclient_get_json(int port, const char *path, int want_status);
/* Starts `pprun serve` on a free port; returns its pid and fills *port. */
int webclient_start_serve(const char *db, const char *extra_args, int *port);

#endif
