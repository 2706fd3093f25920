/* capture.c: see capture.h. */
#include "capture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void capture_start(capture *c) {
    snprintf(c->path, sizeof c->path, "/tmp/pprun-capture-XXXXXX");
    c->fd = mkstemp(c->path);
    cr_assert(c->fd >= 0);
    fflush(stderr);
    c->saved = dup(2);
    dup2(c->fd, 2);
}

const char *capture_end(capture *c) {
    static char text[65536];
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    ssize_t n = pread(c->fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(c->fd);
    unlink(c->path);
    return text;
}

int capture_count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}
