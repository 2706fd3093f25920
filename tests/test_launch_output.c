/* test_launch_output.c: how `pprun launch` passes a worker's output on:
 * each line prefixed, a line without a newline cut every LAUNCH_LINE_MAX
 * bytes, however much one read of the pipe returns. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner/launch/launch_int.h"

/* Pumps `n` bytes of `data` through a stream whose pipe holds them all at
 * once (one read returns them together), into a file; returns its text. */
static char *pass_through(const char *data, size_t n, size_t *out_len) {
    int in[2];
    cr_assert_eq(pipe2(in, O_NONBLOCK), 0);
    cr_assert_geq(fcntl(in[1], F_SETPIPE_SZ, 1 << 20), (int)n, "a pipe of 1 MiB (the unprivileged maximum)");
    cr_assert_eq(write(in[1], data, n), (ssize_t)n);
    close(in[1]);
    FILE *console = tmpfile();
    cr_assert_not_null(console);
    launch_console con;
    launch_console_init(&con, fileno(console), NULL);
    launch_stream s;
    launch_stream_init(&s, in[0], fileno(console), &con, &con, -1, 1, 0, "[0]: ", NULL);
    while (!launch_stream_pump(&s)) {
    }
    launch_stream_finish(&s);
    launch_console_free(&con);
    long len = ftell(console);
    char *text = calloc((size_t)len + 1, 1);
    rewind(console);
    cr_assert_eq(fread(text, 1, (size_t)len, console), (size_t)len);
    fclose(console);
    *out_len = (size_t)len;
    return text;
}

Test(launch_output, a_long_line_without_newline_is_cut_into_prefixed_pieces) {
    size_t n = 4 * LAUNCH_LINE_MAX + 100; /* four full pieces and a short one, in one read */
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (char)('a' + i % 26);
    size_t len;
    char *text = pass_through(data, n, &len);
    cr_assert_eq(len, n + 5 * strlen("[0]: \n"), "five prefixed pieces, %zu bytes", len);
    size_t at = 0, piece = 0;
    for (size_t done = 0; done < n; piece++) {
        size_t ll = n - done < LAUNCH_LINE_MAX ? n - done : LAUNCH_LINE_MAX;
        cr_assert_eq(memcmp(text + at, "[0]: ", 5), 0, "piece %zu has the prefix", piece);
        cr_assert_eq(memcmp(text + at + 5, data + done, ll), 0, "piece %zu holds the bytes in order", piece);
        cr_assert_eq(text[at + 5 + ll], '\n');
        at += 5 + ll + 1;
        done += ll;
    }
    free(text);
    free(data);
}

/* A long line of 3-byte characters (a tqdm bar's █) is cut between
 * characters: each piece is UTF-8, and the pieces make the line again. */
Test(launch_output, a_long_line_is_cut_between_characters) {
    size_t n = 3 * 45000; /* two pieces' worth and more, 65536 not a multiple of 3 */
    char *data = malloc(n);
    for (size_t i = 0; i < n; i += 3) memcpy(data + i, "\xe2\x96\x88", 3);
    size_t len, done = 0;
    char *text = pass_through(data, n, &len);
    for (char *line = text; line < text + len;) {
        cr_assert_eq(memcmp(line, "[0]: ", 5), 0);
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        cr_assert_not_null(end);
        size_t piece = (size_t)(end - line - 5);
        cr_assert_eq(piece % 3, 0, "a piece of %zu bytes ends inside a character", piece);
        cr_assert_eq(memcmp(line + 5, data + done, piece), 0);
        done += piece;
        line = end + 1;
    }
    cr_assert_eq(done, n);
    free(text);
    free(data);
}

Test(launch_output, lines_keep_their_order_and_each_gets_the_prefix) {
    const char data[] = "one\ntwo\n\nlast without newline";
    size_t len;
    char *text = pass_through(data, sizeof data - 1, &len);
    cr_assert_str_eq(text, "[0]: one\n[0]: two\n[0]: \n[0]: last without newline\n");
    free(text);
}

/* The descendant walk spares the caller's keep_groups (pprun run's MPS
 * daemon, our child when the launcher is PID 1): a child in such a group is
 * neither counted nor signalled; outside them it is both. */
Test(launch_output, the_descendant_walk_spares_the_keep_groups) {
    pid_t child = fork();
    if (child == 0) {
        setpgid(0, 0);
        for (;;) pause();
    }
    cr_assert_gt(child, 0);
    setpgid(child, child); /* whichever of the two runs first */
    while (getpgid(child) != child) usleep(1000);
    cr_assert_eq(launch_signal_descendants(SIGKILL, NULL, 0, &child, 1), 0, "a kept group was counted");
    usleep(50000);
    char state = launch_proc_state(child);
    cr_assert(state && state != 'Z', "a kept group was signalled (state %c)", state ? state : '-');
    cr_assert_eq(launch_signal_descendants(0, NULL, 0, NULL, 0), 1);
    kill(child, SIGKILL);
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
}
