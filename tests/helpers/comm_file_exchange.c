/* comm_file_exchange.c: file-backed key/value exchange for comm tests. */
#include "helpers/comm_file_exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Keys hold '/', file names cannot: map every unsafe byte to '_'. */
static void key_path(const char *dir, const char *key, char *out, size_t cap) {
    char k[256];
    size_t i = 0;
    for (; key[i] && i < sizeof k - 1; i++) {
        char ch = key[i];
        k[i] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ? ch : '_';
    }
    k[i] = '\0';
    snprintf(out, cap, "%s/%s", dir, k);
}

int fx_put(void *dir, const char *key, const void *value, size_t len, pp_err *err) {
    char path[512], tmp[600];
    key_path(dir, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return pp_fail(err, "fx: cannot create %s: %s", tmp, strerror(errno));
    ssize_t n = write(fd, value, len);
    close(fd);
    if (n != (ssize_t)len || rename(tmp, path) < 0) {
        unlink(tmp);
        return pp_fail(err, "fx: cannot write %s", path);
    }
    return 0;
}

int fx_get(void *dir, const char *key, void *value, size_t cap, size_t *len, int timeout_ms, pp_err *err) {
    char path[512];
    key_path(dir, key, path, sizeof path);
    uint64_t deadline = pp_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = read(fd, value, cap);
            close(fd);
            if (n < 0) return pp_fail(err, "fx: cannot read %s: %s", path, strerror(errno));
            *len = (size_t)n;
            return 0;
        }
        if (pp_now_ns() >= deadline) return pp_fail(err, "fx: key %s not published within %d ms", key, timeout_ms);
        pp_sleep_ns(2000000);  /* 2 ms: rendezvous happens once per peer */
    }
}

comm_exchange fx_exchange(const char *dir) {
    return (comm_exchange){.ctx = (void *)dir, .put = fx_put, .get = fx_get};
}
