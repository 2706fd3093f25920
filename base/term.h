/* term.h: text for the terminal. Bytes from outside pprun (a CSV cell, a
 * file name, a name in the database, an argument) made safe to print: raw, an escape sequence among
 * them would drive the reader's terminal (clear it, retitle the window,
 * move the cursor to hide what follows). Control characters (C0, DEL, and
 * C1, U+0080..U+009F), the bidirectional controls that reorder what is
 * shown (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069) and bytes
 * that are not UTF-8 are written as escapes: \n, \t, \r, \xHH, \uHHHH
 * (a NUL too). With TERM_LINES, newline and tab stay as they are (text
 * laid out in lines); a carriage return is escaped even then: it would let
 * what follows overwrite what came before on the screen (a rank's tqdm
 * line quoted in a message). What comes out is printable, valid UTF-8:
 * escaping it again changes nothing.
 *
 * term_escape writes the escapes of s[0, n) into out[cap] (NUL-terminated
 * when cap > 0), stopping before a character whose escape would not fit;
 * returns the bytes written to out, and *used the bytes of s read. */
#ifndef PP_BASE_TERM_H
#define PP_BASE_TERM_H
#include <stddef.h>
#include <stdio.h>

#define TERM_LINES 1u
size_t term_escape(const char *s, size_t n, unsigned flags, char *out, size_t cap, size_t *used);
/* s[0, n) escaped onto f: 0, or -1 when a write fails. */
int term_write(FILE *f, const char *s, size_t n, unsigned flags);
/* s escaped into a new string (malloc'ed; NULL when out of memory). */
char *term_dup(const char *s, size_t n, unsigned flags);
/* The NUL-terminated s as one value within a line of text (a name from
 * the database, an argument): escaped without TERM_LINES, so that a
 * newline in it cannot start a line of its own, into buf[cap] (cap > 0),
 * cut before the first character that does not fit; returns buf. */
const char *term_value(const char *s, char *buf, size_t cap);

#endif
