/* web_client.c: see web_client.h. */
#include "helpers/web_client.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int connect_local(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void dechunk(webclient_resp *r) {
    char *in = r->body, *out = r->body, *end = r->body + r->len;
    while (in < end) {
        char *nl = strstr(in, "\r\n");
        if (!nl) break;
        long n = strtol(in, NULL, 16);
        in = nl + 2;
        if (n <= 0 || in + n > end) break;
        memmove(out, in, (size_t)n);
        out += n;
        in += n + 2;
    }
    *out = 0;
    r->len = (size_t)(out - r->body);
}

int webclient_raw(int port, const char *raw, size_t rawlen, webclient_resp *out) {
    memset(out, 0, sizeof *out);
    int fd = connect_local(port);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < rawlen) {
        ssize_t n = send(fd, raw + off, rawlen - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1) {
        out->head = buf;
        out->body = strdup("");
        return 0;
    }
    size_t hl = (size_t)(sep - buf);
    out->head = strndup(buf, hl);
    out->len = len - hl - 4;
    out->body = malloc(out->len + 1);
    memcpy(out->body, sep + 4, out->len);
    out->body[out->len] = 0;
    free(buf);
    const char *te = webclient_header(out, "Transfer-Encoding");
    if (te && strstr(te, "chunked")) dechunk(out);
    return 0;
}

int webclient_request(int port, const char *method, const char *path, const char *headers, const char *body,
                   webclient_resp *out) {
    size_t blen = body ? strlen(body) : 0;
    size_t cap = strlen(path) + (headers ? strlen(headers) : 0) + blen + 256;
    char *req = malloc(cap);
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                     headers ? headers : "");
    if (body) n += snprintf(req + n, cap - (size_t)n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += snprintf(req + n, cap - (size_t)n, "\r\n");
    if (body) memcpy(req + n, body, blen);
    int rc = webclient_raw(port, req, (size_t)n + blen, out);
    free(req);
    return rc;
}

const char *webclient_header(const webclient_resp *r, const char *name) {
    static __thread char val[512];
    size_t nl = strlen(name);
    for (const char *p = r->head; p && (p = strstr(p, "\r\n")); ) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ') v++;
            size_t k = strcspn(v, "\r\n");
            if (k >= sizeof val) k = sizeof val - 1;
            memcpy(val, v, k);
            val[k] = 0;
            return val;
        }
    }
    return NULL;
}

void webclient_free(webclient_resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int webclient_start_serve(const char *db, const char *extra_args, int *port) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "exec '%s' serve --db '%s' --listen 127.0.0.1:0 %s", PPRUN_BIN, db,
                 extra_args ? extra_args : "");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[512];
    size_t len = 0;
    while (len < sizeof line - 1) {
        ssize_t n = read(pfd[0], line + len, 1);
        if (n <= 0 || line[len] == '\n') break;
        len++;
    }
    line[len] = 0;
    close(pfd[0]);
    const char *p = strstr(line, "http://127.0.0.1:");
    if (!p || sscanf(p, "http://127.0.0.1:%d/", port) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

cJSON *webclient_get_json(int port, const char *path, int want_status) {
    webclient_resp r;
    cr_assert_eq(webclient_request(port, "GET", path, NULL, NULL, &r), 0);
    cr_assert_eq(r.status, want_status, "GET %s: %d %s", path, r.status, r.body);
    const char *ct = webclient_header(&r, "Content-Type");
    cr_assert(ct && strstr(ct, "application/json"), "GET %s: %s", path, ct ? ct : "no content type");
    cJSON *j = cJSON_Parse(r.body);
    cr_assert(j, "GET %s: not JSON: %.200s", path, r.body);
    webclient_free(&r);
    return j;
}
