/* utf8.h: UTF-8 read one character at a time, the one definition every
 * writer of text from outside uses: the terminal's escapes (term.c), the
 * JSON writer (json.c), Prometheus labels (web/metrics.c), and whoever
 * cuts a name to fit a field (a cut inside a character leaves bytes that
 * are no UTF-8: a JSON reader shows U+FFFD, Prometheus refuses the whole
 * scrape). Header only: libpprun_trace compiles base/term.c too. */
#ifndef PP_BASE_UTF8_H
#define PP_BASE_UTF8_H
#include <stddef.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (of n bytes), 0 when it is not
 * one (a stray continuation byte, overlong, a surrogate, past U+10FFFF,
 * cut short); *cp gets its code point. ASCII is a sequence of 1. */
static inline size_t utf8_seq(const unsigned char *s, size_t n, unsigned *cp) {
    if (n == 0) return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (s[0] > 0xf4 || len == 0 || len > n) return 0;
    unsigned v = s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

/* The longest start of s (len bytes) of at most max bytes that does not
 * end inside a character: max, less the bytes of a character it would
 * split. */
static inline size_t utf8_cut(const char *s, size_t len, size_t max) {
    if (len <= max) return len;
    size_t n = max;
    /* back over continuation bytes to the start of the character at max */
    while (n > 0 && max - n < 3 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
    return ((unsigned char)s[n] & 0xc0) == 0x80 ? max : n; /* not UTF-8 there: cut where asked */
}

/* n, less a character cut short at the end of s[0, n): its first bytes
 * are here, the rest may come (a pipe read of exactly a piece's size). */
static inline size_t utf8_whole(const char *s, size_t n) {
    size_t k = n; /* back over continuation bytes to the last character's first byte, s[k - 1] */
    while (k > 0 && n - k < 3 && ((unsigned char)s[k - 1] & 0xc0) == 0x80) k--;
    if (k == 0) return n;
    unsigned char lead = (unsigned char)s[k - 1];
    size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    return n - (k - 1) < want ? k - 1 : n;
}

/* src copied into dst[cap] (cap > 0), NUL-terminated, cut at a whole
 * character to fit (utf8_cut); NULL (a column SQLite gave none for) as
 * "". */
static inline void utf8_copy(char *dst, size_t cap, const char *src) {
    if (!src) src = "";
    size_t n = utf8_cut(src, strlen(src), cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

#endif
