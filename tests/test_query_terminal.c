/* test_query_terminal.c: what `pprun query` writes to a terminal for text
 * a trace database holds: control characters are shown, never sent. A
 * database comes from whoever ran the job (its name, a rank's host, a
 * failure's text), and one read with `pprun query` must not be able to
 * drive the reader's terminal. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/web_fixture.h"

static char db[256];

static void setup(void) { fixture_fresh(db, sizeof db, "qterm", 1, "succeeded"); }
static void teardown(void) { fixture_remove(db); }

/* pprun query --db DB with args (shell-quoted by the caller): its exit
 * status, and stdout in *out (malloc'd, *len bytes: it may hold a NUL). */
static int query(const char *args, char **out, size_t *len) {
    char path[64], cmd[2048];
    snprintf(path, sizeof path, "/tmp/pprun-qterm-%d.out", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' query --db '%s' %s >%s", PPRUN_BIN, db, args, path);
    int st = system(cmd);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    *out = malloc(1 << 16);
    *len = fread(*out, 1, (1 << 16) - 1, f);
    (*out)[*len] = 0;
    fclose(f);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TestSuite(query_terminal, .init = setup, .fini = teardown, .timeout = 60);

/* An ESC sequence (here: red text) in a value went to the terminal as
 * is, a newline broke the table's rows, a NUL cut the text short, and C1
 * controls and bytes that are not UTF-8 passed too. The table writes them
 * as escapes now; UTF-8 text is left alone. */
Test(query_terminal, table_shows_control_characters_as_escapes) {
    char *out;
    size_t len;
    int rc = query("\"SELECT char(27) || '[31mred' AS esc, 'a' || char(10) || 'b' AS nl, "
                   "CAST(x'610062' AS TEXT) AS nul, char(155) || '2J' AS c1, CAST(x'ff41' AS TEXT) AS bad, "
                   "'caf' || char(233) AS ok\"",
                   &out, &len);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_eq(strlen(out), len, "no NUL in the output");
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)out[i];
        cr_assert(b >= 0x20 || b == '\n', "control byte 0x%02x at %zu: %s", b, i, out);
    }
    cr_assert_null(strstr(out, "\xc2\x9b"), "C1 control sent: %s", out);
    const char *row = strstr(out, "\n\\x1b[31mred");
    cr_assert_not_null(row, "%s", out);
    cr_assert(strstr(row, "  a\\nb  "), "%s", out);
    cr_assert(strstr(row, "  a\\x00b  "), "%s", out);
    cr_assert(strstr(row, "  \\u009b2J  "), "%s", out);
    cr_assert(strstr(row, "  \\xffA  "), "%s", out);
    cr_assert(strstr(row, "  caf\xc3\xa9\n"), "%s", out);
    cr_assert_eq(strchr(row + 1, '\n')[1], 0, "one line for the row: %s", out);
    free(out);

    /* A column name is a value of the query too. */
    rc = query("\"SELECT 1 AS \\\"x$(printf '\\033')]0;title$(printf '\\007')\\\"\"", &out, &len);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strncmp(out, "x\\x1b]0;title\\x07\n", 18) == 0, "%s", out);
    free(out);
}

/* csv and json carry the bytes exactly (their readers are programs): a
 * NUL in a text cut a csv field short. */
Test(query_terminal, csv_and_json_keep_the_bytes) {
    char *out;
    size_t len;
    int rc = query("--format csv \"SELECT CAST(x'610062' AS TEXT) AS t, char(27) AS e\"", &out, &len);
    cr_assert_eq(rc, 0);
    cr_assert_eq(len, 12, "%zu bytes", len);
    cr_assert_eq(memcmp(out, "t,e\r\na\0b,\x1b\r\n", 12), 0);
    free(out);
    rc = query("--format json \"SELECT CAST(x'610062' AS TEXT) AS t, char(27) AS e\"", &out, &len);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(out, "[{\"t\":\"a\\u0000b\",\"e\":\"\\u001b\"}]\n");
    free(out);
}
