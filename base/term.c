/* term.c: untrusted bytes made safe to print on a terminal (term.h). */
#include "base/term.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

/* The characters that reorder the text around them on the screen
 * (Unicode's explicit directional marks, embeddings, overrides and
 * isolates): printed raw, a name could show its end first ("Trojan
 * Source", CVE-2021-42574). */
static int is_bidi_control(unsigned cp) {
    return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

size_t term_escape(const char *s, size_t n, unsigned flags, char *out, size_t cap, size_t *used) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char b = (unsigned char)s[i];
        unsigned cp = b;
        size_t in = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        char esc[12];
        const char *piece = s + i;
        size_t len = in;
        if ((b == '\n' || b == '\t') && (flags & TERM_LINES)) {
            /* as it is */
        } else if (b == '\n' || b == '\t' || b == '\r') {
            esc[0] = '\\', esc[1] = b == '\n' ? 'n' : b == '\t' ? 't' : 'r';
            piece = esc, len = 2;
        } else if (b < 0x20 || b == 0x7f || in == 0) {
            snprintf(esc, sizeof esc, "\\x%02x", b);
            piece = esc, len = 4, in = 1;
        } else if ((cp >= 0x80 && cp < 0xa0) || is_bidi_control(cp)) {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            piece = esc, len = 6;
        }
        if (o + len >= cap) break; /* and keep a byte for the NUL */
        memcpy(out + o, piece, len);
        o += len, i += in;
    }
    if (cap) out[o] = '\0';
    *used = i;
    return o;
}

int term_write(FILE *f, const char *s, size_t n, unsigned flags) {
    char buf[4096];
    while (n) {
        size_t used, len = term_escape(s, n, flags, buf, sizeof buf, &used);
        if (fwrite(buf, 1, len, f) != len) return -1;
        s += used, n -= used;
    }
    return 0;
}

char *term_dup(const char *s, size_t n, unsigned flags) {
    size_t cap = 4 * n + 1, used; /* the longest escape, \xHH, is 4 bytes for 1 */
    char *out = malloc(cap);
    if (out) term_escape(s, n, flags, out, cap, &used);
    return out;
}

const char *term_value(const char *s, char *buf, size_t cap) {
    size_t used;
    term_escape(s, strlen(s), 0, buf, cap, &used);
    return buf;
}
