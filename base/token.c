/* token.c: checking, reading and comparing the job token; loopback tests
 * (see token.h). */
#include "base/token.h"
#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pp_token_check(const char *tok, const char *what, pp_err *err) {
    size_t n = tok ? strlen(tok) : 0;
    if (n == 0) return pp_fail(err, "%s: the token is empty; accepted: 1 to %d printable characters without spaces", what, PP_TOKEN_MAX);
    if (n > PP_TOKEN_MAX)
        return pp_fail(err, "%s: the token is %zu bytes long; accepted: 1 to %d printable characters without spaces", what,
                       n, PP_TOKEN_MAX);
    for (size_t i = 0; i < n; i++)
        if (tok[i] <= ' ' || tok[i] > '~')
            return pp_fail(err, "%s: the token has a space, control or non-ASCII character at byte %zu; accepted: "
                                "printable ASCII without spaces (e.g. the output of `openssl rand -hex 32`)", what, i + 1);
    return 0;
}

int pp_token_read_file(const char *path, const char *what, char *out, pp_err *err) {
    char *buf;
    size_t len;
    /* A little room for the line end and for a clear "too long". */
    if (file_input_read(path, what, PP_TOKEN_MAX + 64, &buf, &len, err) != 0) return -1;
    char *nl = memchr(buf, '\n', len);
    size_t line = nl ? (size_t)(nl - buf) : len;
    if (line > 0 && buf[line - 1] == '\r') line--;
    char where[1200];
    snprintf(where, sizeof where, "%s %s", what, path);
    int rc = memchr(buf, '\0', line) ? pp_fail(err, "%s: the file holds a NUL byte", where)
                                     : (buf[line] = '\0', pp_token_check(buf, where, err));
    if (rc == 0) snprintf(out, PP_TOKEN_MAX + 1, "%s", buf);
    memset(buf, 0, len);
    free(buf);
    return rc;
}

int pp_token_equal(const char *want, const void *got, size_t got_len) {
    size_t wl = want ? strlen(want) : 0;
    if (wl == 0 || wl > PP_TOKEN_MAX) return 0;
    const unsigned char *g = got;
    /* Every byte position up to the longest token is looked at, whatever
     * the lengths, so the time says nothing about the first difference. */
    unsigned diff = (unsigned)(wl != got_len);
    for (size_t i = 0; i < PP_TOKEN_MAX; i++) {
        unsigned a = i < wl ? (unsigned char)want[i] : 0u, b = i < got_len ? g[i] : 0u;
        diff |= a ^ b;
    }
    return diff == 0;
}
