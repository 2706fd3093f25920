/* capture.h: a test's stderr into a file while a server under test logs,
 * to check its lines (the store's and the collector's limits). */
#ifndef PP_TEST_CAPTURE_H
#define PP_TEST_CAPTURE_H

typedef struct capture {
    char path[64];
    int fd, saved;
} capture;

void capture_start(capture *c);
/* Restores stderr; returns what was written (a static buffer, until the
 * next call). */
const char *capture_end(capture *c);
/* How many times `what` occurs in text. */
int capture_count(const char *text, const char *what);

#endif
