/* test_base.c: the shared parsers (what a user types on the command line),
 * text for the terminal and the files a user names. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/embed.h"
#include "base/file.h"
#include "base/pp.h"
#include "base/term.h"
#include "base/utf8.h"

Test(base, sizes_parse_with_binary_and_decimal_units) {
    uint64_t v;
    pp_err err;
    cr_assert_eq(pp_parse_size("64KiB", "--x", &v, &err), 0);
    cr_assert_eq(v, 65536);
    cr_assert_eq(pp_parse_size("1MiB", "--x", &v, &err), 0);
    cr_assert_eq(v, 1048576);
    cr_assert_eq(pp_parse_size("10KB", "--x", &v, &err), 0);
    cr_assert_eq(v, 10000);
    cr_assert_eq(pp_parse_size("12", "--x", &v, &err), 0);
    cr_assert_eq(v, 12);
}

/* What a user would type back: the largest binary unit that is exact,
 * and pp_parse_size reads it as the same bytes. */
Test(base, sizes_format_as_a_user_would_type_them_and_parse_back) {
    static const struct { uint64_t n; const char *want; } cases[] = {
        {8388608, "8MiB"}, {409600, "400KiB"}, {1572864, "1536KiB"}, {1000, "1000B"}, {0, "0B"},
        {3ull << 40, "3TiB"}, {5ull << 50, "5120TiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[24];
        uint64_t back;
        pp_err err;
        pp_format_size(cases[i].n, buf, sizeof buf);
        cr_assert_str_eq(buf, cases[i].want);
        if (cases[i].n >= (1ull << 40)) continue; /* past the parser's cap of 1e15 bytes */
        cr_assert_eq(pp_parse_size(buf, "--x", &back, &err), 0, "%s: %s", buf, err.msg);
        cr_assert_eq(back, cases[i].n, "%s", buf);
    }
}

Test(base, bad_sizes_name_the_flag_and_the_units) {
    uint64_t v;
    pp_err err;
    cr_assert_eq(pp_parse_size("12 parsecs", "act", &v, &err), -1);
    cr_assert(strstr(err.msg, "act") && strstr(err.msg, "KiB"), "%s", err.msg);
    cr_assert_eq(pp_parse_size("-3", "act", &v, &err), -1);
}

Test(base, durations) {
    uint64_t ns;
    pp_err err;
    cr_assert_eq(pp_parse_duration_ns("2ms", "f", &ns, &err), 0);
    cr_assert_eq(ns, 2000000);
    cr_assert_eq(pp_parse_duration_ns("500us", "f", &ns, &err), 0);
    cr_assert_eq(ns, 500000);
    cr_assert_eq(pp_parse_duration_ns("1.5s", "f", &ns, &err), 0);
    cr_assert_eq(ns, 1500000000);
    cr_assert_eq(pp_parse_duration_ns("3", "f", &ns, &err), 0);
    cr_assert_eq(ns, 3000000);
    cr_assert_eq(pp_parse_duration_ns("3 weeks", "f", &ns, &err), -1);
    cr_assert(strstr(err.msg, "ms"), "%s", err.msg);
}

Test(base, integers_are_strict) {
    long v;
    pp_err err;
    cr_assert_eq(pp_parse_long("16", 1, 64, "--nproc-per-node", &v, &err), 0);
    cr_assert_eq(v, 16);
    cr_assert_eq(pp_parse_long("16x", 1, 64, "--nproc-per-node", &v, &err), -1);
    cr_assert(strstr(err.msg, "--nproc-per-node"), "%s", err.msg);
    cr_assert_eq(pp_parse_long("0", 1, 64, "--nproc-per-node", &v, &err), -1);
    cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
}

/* One rule for every number a user types: plain decimal. strtol and strtod
 * alone also took " 2" and "+2", and strtod 0x400 (1024), 0x1p-1 (0.5),
 * inf and nan: --model timed:act=0x10 was recorded as 16 bytes. */
Test(base, numbers_are_plain_decimal_whatever_strtod_reads) {
    long l;
    pp_err err;
    static const char *const not_integers[] = {" 2", "+2", "2 ", "0x10", "2.", "1e2", "--2", "-", "2\n"};
    for (size_t i = 0; i < sizeof not_integers / sizeof *not_integers; i++) {
        cr_assert_eq(pp_parse_long(not_integers[i], -10, 1024, "--pp", &l, &err), -1, "'%s' accepted", not_integers[i]);
        char want[64];
        snprintf(want, sizeof want, "--pp: expected an integer in [-10, 1024], got '%s'", not_integers[i]);
        cr_assert_str_eq(err.msg, want);
    }
    cr_assert_eq(pp_parse_long("-3", -10, 10, "--x", &l, &err), 0, "%s", err.msg);
    cr_assert_eq(l, -3, "a '-' where the range has negative values");
    cr_assert_eq(pp_parse_long("-0", 0, 10, "--steps", &l, &err), -1, "no '-' where nothing is negative");
    cr_assert_str_eq(err.msg, "--steps: -0 is out of range; accepted: 0 to 10");

    double d;
    static const char *const not_doubles[] = {"0x1p-10", "0x10", "inf", "-inf", "nan", "infinity", "NAN",
                                              " 1",      "+1",   "1e",  "1e+",  ".",   "1..2",     "1e3.5"};
    for (size_t i = 0; i < sizeof not_doubles / sizeof *not_doubles; i++) {
        cr_assert_eq(pp_parse_double(not_doubles[i], -1, 10, "--lr", &d, &err), -1, "'%s' accepted", not_doubles[i]);
        char want[64];
        snprintf(want, sizeof want, "--lr: expected a decimal number in [-1, 10], got '%s'", not_doubles[i]);
        cr_assert_str_eq(err.msg, want);
    }
    static const struct {
        const char *text;
        double v;
    } doubles[] = {{"1e-3", 1e-3}, {"2.5E+0", 2.5}, {".5", 0.5}, {"5.", 5}, {"-0.25", -0.25}, {"007", 7}};
    for (size_t i = 0; i < sizeof doubles / sizeof *doubles; i++) {
        cr_assert_eq(pp_parse_double(doubles[i].text, -1, 10, "--lr", &d, &err), 0, "%s", err.msg);
        cr_assert_eq(d, doubles[i].v, "%s", doubles[i].text);
    }
    cr_assert_eq(pp_parse_double("-0", 0, 10, "--lr", &d, &err), -1);
    cr_assert_str_eq(err.msg, "--lr: -0 is out of range; accepted: 0 to 10");
    /* within the range, but no double holds it: not "out of range" */
    cr_assert_eq(pp_parse_double("1e-320", 0, 10, "--lr", &d, &err), -1);
    cr_assert_str_eq(err.msg, "--lr: 1e-320 is too small to tell from 0; give 0 or a number of at least 1e-300");

    uint64_t v;
    static const char *const not_sizes[] = {"0x1000", "0x1p12", "infKiB", "nan", " 4096", "+4096", "0X400B"};
    for (size_t i = 0; i < sizeof not_sizes / sizeof *not_sizes; i++) {
        cr_assert_eq(pp_parse_size(not_sizes[i], "--dp-bucket", &v, &err), -1, "'%s' accepted", not_sizes[i]);
        char want[128];
        snprintf(want, sizeof want,
                 "--dp-bucket: '%s' is not a decimal number; expected a size like 4096, 64KiB or 1MiB", not_sizes[i]);
        cr_assert_str_eq(err.msg, want);
    }
    cr_assert_eq(pp_parse_size("1e3", "--x", &v, &err), 0, "%s", err.msg);
    cr_assert_eq(v, 1000);
    cr_assert_eq(pp_parse_size("1.5KiB", "--x", &v, &err), 0, "%s", err.msg);
    cr_assert_eq(v, 1536);
    cr_assert_eq(pp_parse_size("-0", "act", &v, &err), -1);
    cr_assert_str_eq(err.msg, "act: expected a size like 4096, 64KiB or 1MiB, got '-0'");

    static const char *const not_durations[] = {"0x1p-1ms", "0x10s", "0x10", "nanms", "infs", "+2ms", " 2ms"};
    for (size_t i = 0; i < sizeof not_durations / sizeof *not_durations; i++) {
        cr_assert_eq(pp_parse_duration_ns(not_durations[i], "--recv-timeout", &v, &err), -1, "'%s' accepted",
                     not_durations[i]);
        char want[128];
        snprintf(want, sizeof want,
                 "--recv-timeout: '%s' is not a decimal number; expected a duration like 2ms, 500us or 1s",
                 not_durations[i]);
        cr_assert_str_eq(err.msg, want);
    }
    cr_assert_eq(pp_parse_duration_ns("1e3us", "f", &v, &err), 0, "%s", err.msg);
    cr_assert_eq(v, 1000000);
    cr_assert_eq(pp_parse_duration_ns("-1ms", "f", &v, &err), -1);
    cr_assert_str_eq(err.msg, "f: expected a duration like 2ms, 500us or 1s, got '-1ms'");
}

/* Every option that waits (--recv-timeout, --rdzv-timeout, query's
 * --timeout) reads a bare number as seconds, as torchrun does: "5" was 5 ms
 * for --recv-timeout alone, and its ranks timed out at once. */
Test(base, timeouts_are_seconds_or_a_duration) {
    static const struct { const char *text; uint64_t ns; } ok[] = {
        {"5", 5000000000ull}, {"0.5", 500000000ull}, {"100ms", 100000000ull}, {"2s", 2000000000ull}, {"0", 0},
        {"1.001", 1001000000ull},
        /* with a unit as far as without one: 86400s was too long where 86400 was not */
        {"86400s", 86400000000000ull}, {"20000000ms", 20000000000000ull}, {"1000000s", 1000000000000000ull}};
    pp_err err;
    uint64_t v;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        cr_assert_eq(pp_parse_seconds_ns(ok[i].text, "--recv-timeout", &v, &err), 0, "%s: %s", ok[i].text, err.msg);
        cr_assert_eq(v, ok[i].ns, "%s: %llu ns", ok[i].text, (unsigned long long)v);
    }
    static const struct { const char *text, *says; } bad[] = {
        {"soon", "--recv-timeout: expected seconds (e.g. 5, 0.5) or a duration with a unit (100ms, 2s), got 'soon'"},
        {"-1", "--recv-timeout: expected seconds (e.g. 5, 0.5) or a duration with a unit (100ms, 2s), got '-1'"},
        {"1 day", "--recv-timeout: unknown duration unit in '1 day'; accepted: ns, us, ms, s; or seconds (e.g. 5, 0.5)"},
        {"0x10s", "--recv-timeout: '0x10s' is not a decimal number; expected a duration like 2ms, 500us or 1s; or "
                  "seconds (e.g. 5, 0.5)"},
        {"", "--recv-timeout: expected seconds (e.g. 5, 0.5) or a duration with a unit (100ms, 2s), got ''"},
        {"1000001s", "--recv-timeout: duration '1000001s' is too long (at most 1000000s); or seconds (e.g. 5, 0.5)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(pp_parse_seconds_ns(bad[i].text, "--recv-timeout", &v, &err), -1, "'%s' accepted", bad[i].text);
        cr_assert_str_eq(err.msg, bad[i].says);
    }
}

static int collect(void *ctx, const char *k, const char *v, pp_err *err) {
    (void)err;
    char *out = ctx;
    strcat(out, k);
    strcat(out, ":");
    strcat(out, v);
    strcat(out, ";");
    return 0;
}

Test(base, key_value_lists) {
    char text[] = "f=2ms,b=3ms,flag";
    char out[128] = "";
    pp_err err;
    cr_assert_eq(pp_parse_kv_list(text, "--x", collect, out, &err), 0);
    cr_assert_str_eq(out, "f:2ms;b:3ms;flag:;");
}

Test(base, the_default_corpus_is_embedded) {
    size_t total = 0;
    for (const pp_embedded_file *f = pp_corpus_files; f->name; f++) total += f->size;
    cr_assert_gt(total, 10000, "corpus has only %zu bytes", total);
    cr_assert_not_null(pp_embed_find(pp_corpus_files, "base/pp.c"));
}

Test(base, a_key_given_twice_is_an_error) {
    char text[] = "layers=4,dim=8,layers=2";
    char out[128] = "";
    pp_err err;
    cr_assert_eq(pp_parse_kv_list(text, "--x", collect, out, &err), -1);
    cr_assert_str_eq(err.msg, "--x: 'layers' is given twice");
}

/* strtok skipped an empty item: f=1,,b=1 is a typo, refused quoting the
 * whole list, and fn sees none of it; "" is a list of no items. */
Test(base, an_empty_item_is_an_error) {
    static const char *const bad[] = {"f=1,,b=1", ",f=1", "f=1,", ",", "f=1,,,b=1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[32], out[128] = "";
        snprintf(text, sizeof text, "%s", bad[i]);
        pp_err err;
        cr_assert_eq(pp_parse_kv_list(text, "--x", collect, out, &err), -1, "'%s' accepted", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "--x: empty item in '%s'", bad[i]);
        cr_assert_str_eq(err.msg, want);
        cr_assert_str_eq(out, "", "'%s': an item was taken before the refusal", bad[i]);
    }
    char empty[] = "", out[16] = "";
    pp_err err;
    cr_assert_eq(pp_parse_kv_list(empty, "--x", collect, out, &err), 0, "%s", err.msg);
    cr_assert_str_eq(out, "");
}

/* A window of 0.5 s: the five calls of the first one must fall inside it,
 * and a loaded machine can stall a process for tens of milliseconds. */
/* Rank lists: N and FIRST-LAST separated by commas, into a mask; every
 * other form refused naming the option, a rank past the last naming it. */
Test(base, rank_lists) {
    unsigned char mask[8];
    pp_err err;
    cr_assert_eq(pp_parse_ranks("0-2,5,7", 8, "--ranks", mask, &err), 0, "%s", err.msg);
    static const unsigned char want[8] = {1, 1, 1, 0, 0, 1, 0, 1};
    cr_assert_arr_eq(mask, want, 8);
    cr_assert_eq(pp_parse_ranks("3-3", 8, "--ranks", NULL, &err), 0, "%s", err.msg);
    /* world 0: the form alone, before the job's ranks are known; the job
     * names its own last rank */
    cr_assert_eq(pp_parse_ranks("2147483647,9999999999", 0, "--ranks", NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(pp_parse_ranks("3-1", 0, "--ranks", NULL, &err), -1);
    static const struct {
        const char *text, *says;
    } bad[] = {{"", "--ranks '' is not a list of ranks"},
               {"1,", "not a list"},
               {",1", "not a list"},
               {"1,,2", "not a list"},
               {" 1", "not a list"},
               {"+1", "not a list"},
               {"-1", "not a list"},
               {"1-", "not a list"},
               {"1-2-3", "not a list"},
               {"0x1", "not a list"},
               {"12345678901", "not a list"},
               {"3-1", "in 3-1 the last rank comes before the first"},
               {"0-8", "--ranks '0-8': rank 8 is past the last, 7"},
               {"9", "rank 9 is past the last, 7"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pp_parse_ranks(bad[i].text, 8, "--ranks", mask, &err), -1, "'%s'", bad[i].text);
        cr_assert(strstr(err.msg, bad[i].says), "'%s': %s", bad[i].text, err.msg);
    }
}

/* The threads left: the kernel's limits less the threads running (root:
 * no RLIMIT_NPROC), named; at least this one thread's own less. */
Test(base, the_threads_left_name_their_limit) {
    char which[128] = "";
    long left = pp_threads_left(which, sizeof which);
    if (left < 0) cr_skip_test("no /proc/loadavg or /proc/sys/kernel here");
    cr_assert_gt(left, 0);
    cr_assert(strstr(which, "running") || strstr(which, "RLIMIT_NPROC"), "%s", which);
    if (geteuid() == 0) cr_assert(strncmp(which, "kernel.", 7) == 0, "root is exempt from RLIMIT_NPROC: %s", which);
}

Test(base, the_rate_limit_writes_a_burst_then_counts_what_it_held_back) {
    pp_ratelimit rl = {0};
    unsigned long held = 99;
    cr_assert_eq(pp_ratelimit_allow(&rl, 2, 500000000, &held), 1);
    cr_assert_eq(held, 0);
    cr_assert_eq(pp_ratelimit_allow(&rl, 2, 500000000, &held), 1);
    for (int i = 0; i < 3; i++) cr_assert_eq(pp_ratelimit_allow(&rl, 2, 500000000, &held), 0);
    pp_sleep_ns(600000000); /* a new window */
    cr_assert_eq(pp_ratelimit_allow(&rl, 2, 500000000, &held), 1);
    cr_assert_eq(held, 3, "the first line of the new window reports the 3 held back");
    cr_assert_eq(pp_ratelimit_allow(&rl, 2, 500000000, &held), 1);
    cr_assert_eq(held, 0, "and only once");
}

/* ---- text for the terminal, files the user names ---------------------------- */

/* Each kind of byte that drives a terminal becomes an escape; UTF-8 text
 * stays; with TERM_LINES newline and tab stay too, not a carriage return
 * that would overwrite what came before;
 * the result escaped again is the same. */
Test(base, terminal_escapes) {
    static const struct {
        const char *in, *out, *lines;
    } cases[] = {
        {"plain", "plain", "plain"},
        {"\033[2J", "\\x1b[2J", "\\x1b[2J"},
        {"\033]0;title\007", "\\x1b]0;title\\x07", "\\x1b]0;title\\x07"},
        {"\302\2332J", "\\u009b2J", "\\u009b2J"},       /* C1 CSI as UTF-8 */
        {"\2332J", "\\x9b2J", "\\x9b2J"},               /* a raw C1 byte: not UTF-8 */
        {"a\nb\tc\rd", "a\\nb\\tc\\rd", "a\nb\tc\\rd"},
        {"del\177", "del\\x7f", "del\\x7f"},
        {"caf\303\251 \342\202\254", "caf\303\251 \342\202\254", "caf\303\251 \342\202\254"},
        {"\300\257 \355\240\200", "\\xc0\\xaf \\xed\\xa0\\x80", "\\xc0\\xaf \\xed\\xa0\\x80"}, /* overlong, surrogate */
        /* bidirectional controls: a name that shows its end first */
        {"evil\342\200\256gpj.exe", "evil\\u202egpj.exe", "evil\\u202egpj.exe"},
        {"\342\201\246x\342\201\251 \342\200\217 \330\234", "\\u2066x\\u2069 \\u200f \\u061c",
         "\\u2066x\\u2069 \\u200f \\u061c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (unsigned flags = 0; flags <= TERM_LINES; flags++) {
            const char *want = flags ? cases[i].lines : cases[i].out;
            char *got = term_dup(cases[i].in, strlen(cases[i].in), flags);
            cr_assert_str_eq(got, want, "case %zu, flags %u", i, flags);
            char *again = term_dup(got, strlen(got), flags);
            cr_assert_str_eq(again, got, "case %zu escaped twice", i);
            free(again);
            free(got);
        }
    }
    /* A NUL in the middle is shown, not an end. */
    char *got = term_dup("a\0b", 3, 0);
    cr_assert_str_eq(got, "a\\x00b");
    free(got);
}

/* A stored value within a line: its newline and carriage return escaped,
 * cut at a whole character. A field filled by utf8_copy is cut at a whole
 * character too, and a NULL (a forged NULL column) is "". */
Test(base, a_value_within_a_line_is_one_line_cut_at_a_character) {
    char buf[8];
    cr_assert_str_eq(term_value("a\nb\rc", buf, sizeof buf), "a\\nb\\rc");
    cr_assert_str_eq(term_value("aaaaaa\303\251", buf, sizeof buf), "aaaaaa", "the 2-byte character does not fit");
    utf8_copy(buf, sizeof buf, "aaaaa\342\202\254"); /* the euro sign: 3 bytes, 2 fit */
    cr_assert_str_eq(buf, "aaaaa");
    utf8_copy(buf, sizeof buf, "aaaa\342\202\254");
    cr_assert_str_eq(buf, "aaaa\342\202\254", "7 bytes fit whole");
    utf8_copy(buf, sizeof buf, NULL);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(utf8_cut("ab\360\237\230\200c", 7, 5), 2, "inside a 4-byte character: before it");
    cr_assert_eq(utf8_cut("ab\360\237\230\200c", 7, 6), 6, "after it");
    cr_assert_eq(utf8_whole("ab\360\237\230", 5), 2, "its last byte still to come");
    cr_assert_eq(utf8_whole("ab\360\237\230\200", 6), 6, "whole");
    cr_assert_eq(utf8_whole("abc", 3), 3);
}

/* Cut to fit, an escape or a UTF-8 character is never split; *used says
 * where to go on. */
Test(base, terminal_escapes_stop_at_a_whole_character) {
    char out[8];
    size_t used;
    size_t n = term_escape("ab\033c", 4, 0, out, 4, &used); /* "ab" fits, "\x1b" would not */
    cr_assert_eq(n, 2);
    cr_assert_eq(used, 2);
    cr_assert_str_eq(out, "ab");
    n = term_escape("a\342\202\254", 4, 0, out, 4, &used); /* 'a' and the euro sign need 5 with the NUL */
    cr_assert_eq(used, 1);
    cr_assert_str_eq(out, "a");
}

static char scratch[64];

static void make_scratch(void) {
    snprintf(scratch, sizeof scratch, "/tmp/pprun-base-XXXXXX");
    cr_assert_not_null(mkdtemp(scratch));
}

static void remove_scratch(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    cr_assert_eq(system(cmd), 0);
}

/* An input at its cap is read; one byte over, it is refused with its size
 * and the cap. */
Test(base, an_input_over_its_cap_is_refused, .init = make_scratch, .fini = remove_scratch) {
    char path[128], *buf;
    size_t len;
    pp_err err;
    snprintf(path, sizeof path, "%s/in", scratch);
    FILE *f = fopen(path, "w");
    fputs("0123456789", f);
    fclose(f);
    cr_assert_eq(file_input_read(path, "--x", 10, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(len, 10);
    cr_assert_str_eq(buf, "0123456789");
    free(buf);
    cr_assert_eq(file_input_read(path, "--x", 9, &buf, &len, &err), -1);
    cr_assert(strstr(err.msg, "--x ") && strstr(err.msg, "is 10 bytes, over the cap of 9 bytes"), "%s", err.msg);
    /* a size near the cap, which its rounding would show as the cap, says its bytes too */
    FILE *wide = fopen(path, "w");
    cr_assert_not_null(wide);
    for (int i = 0; i < 1025; i++) fputc('x', wide);
    fclose(wide);
    cr_assert_eq(file_input_read(path, "--x", 1024, &buf, &len, &err), -1);
    cr_assert(strstr(err.msg, "is 1.0 KiB (1025 bytes), over the cap of 1 KiB (1024 bytes)"), "%s", err.msg);
}

/* A private folder: new under TMPDIR, 0700; removed with all in it, a
 * symbolic link inside removed itself, never what it points to (a file and
 * a folder outside stay whole); a link in place of the folder is refused. */
Test(base, a_private_folder_is_new_and_removed_without_following_links, .init = make_scratch,
     .fini = remove_scratch) {
    char dir[256], path[400], outside[128];
    pp_err err;
    setenv("TMPDIR", scratch, 1);
    cr_assert_eq(file_private_dir_create("pprun-x-", dir, sizeof dir, &err), 0, "%s", err.msg);
    cr_assert_eq(strncmp(dir, scratch, strlen(scratch)), 0, "%s is not under TMPDIR", dir);
    struct stat st;
    cr_assert_eq(lstat(dir, &st), 0);
    cr_assert(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700, "mode %o", st.st_mode);
    snprintf(outside, sizeof outside, "%s/keep", scratch);
    cr_assert_eq(mkdir(outside, 0700), 0);
    snprintf(path, sizeof path, "%s/file", outside);
    FILE *f = fopen(path, "w");
    fputs("kept", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/sub", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/sub/to-folder", dir);
    cr_assert_eq(symlink(outside, path), 0);
    snprintf(path, sizeof path, "%s/to-file", dir);
    char target[200];
    snprintf(target, sizeof target, "%s/file", outside);
    cr_assert_eq(symlink(target, path), 0);
    cr_assert_eq(file_private_dir_remove(dir, &err), 0, "%s", err.msg);
    cr_assert_eq(lstat(dir, &st), -1, "the folder is still there");
    cr_assert_eq(stat(target, &st), 0, "a file a link pointed to was removed");
    cr_assert_eq(st.st_size, 4);
    snprintf(path, sizeof path, "%s/link", scratch);
    cr_assert_eq(symlink(outside, path), 0);
    cr_assert_eq(file_private_dir_remove(path, &err), -1, "a link in place of the folder was followed");
    cr_assert_eq(stat(target, &st), 0, "a file a link pointed to was removed");
}

/* Folders nested past the limit: refused naming the deepest folder's own
 * path, with no stale errno text. */
Test(base, a_private_folder_nested_too_deep_names_the_right_path, .init = make_scratch, .fini = remove_scratch) {
    char dir[256], path[1024];
    pp_err err;
    setenv("TMPDIR", scratch, 1);
    cr_assert_eq(file_private_dir_create("pprun-x-", dir, sizeof dir, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s", dir);
    for (int i = 0; i < 9; i++) {
        size_t len = strlen(path);
        snprintf(path + len, sizeof path - len, "/d%d", i);
        cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
    }
    cr_assert_eq(file_private_dir_remove(dir, &err), -1);
    char want[1100];
    snprintf(want, sizeof want, "%s: folders nest more than 8 deep", path);
    cr_assert_str_eq(err.msg, want);
}

/* A whole output: the target appears only at the commit; an abort leaves
 * the folder as it was; an existing regular file is replaced (a new
 * inode), never written in place, and keeps its permissions. */
Test(base, an_output_appears_whole_at_the_commit, .init = make_scratch, .fini = remove_scratch) {
    char path[128];
    pp_err err;
    snprintf(path, sizeof path, "%s/o", scratch);
    file_output o;
    cr_assert_eq(file_output_begin(&o, path, "--x", 0, &err), 0, "%s", err.msg);
    fputs("half", o.f);
    file_output_abort(&o);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", scratch);
    cr_assert_eq(system(cmd), 0, "an abort left something behind");
    cr_assert_eq(file_output_begin(&o, path, "--x", 0, &err), 0, "%s", err.msg);
    fputs("whole\n", o.f);
    cr_assert_eq(access(path, F_OK), -1, "the target appeared before the commit");
    cr_assert_eq(file_output_commit(&o, &err), 0, "%s", err.msg);
    struct stat st0, st1;
    cr_assert_eq(stat(path, &st0), 0);
    cr_assert_eq(file_output_begin(&o, path, "--x", 0, &err), 0, "%s", err.msg);
    fputs("again\n", o.f);
    cr_assert_eq(file_output_commit(&o, &err), 0, "%s", err.msg);
    cr_assert_eq(stat(path, &st1), 0);
    cr_assert_neq(st0.st_ino, st1.st_ino);
    snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s')\" = o && grep -qx again '%s'", scratch, path);
    cr_assert_eq(system(cmd), 0);
    /* the file replaced keeps its permissions, from the start of the write */
    cr_assert_eq(chmod(path, 0640), 0);
    cr_assert_eq(file_output_begin(&o, path, "--x", 0, &err), 0, "%s", err.msg);
    struct stat tmp;
    cr_assert_eq(fstat(fileno(o.f), &tmp), 0);
    cr_assert_eq(tmp.st_mode & 0777, 0640, "the new file is %o while it is written", tmp.st_mode & 0777);
    cr_assert_eq(file_output_commit(&o, &err), 0, "%s", err.msg);
    cr_assert_eq(stat(path, &st1), 0);
    cr_assert_eq(st1.st_mode & 0777, 0640, "the replaced file is %o", st1.st_mode & 0777);
}

/* A descriptor limit met is said with the limit and how to raise it. */
Test(base, too_many_open_files_names_the_limit) {
    char buf[160], want[160];
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    snprintf(want, sizeof want, "Too many open files (this process may hold %llu at once: ulimit -n)",
             (unsigned long long)rl.rlim_cur);
    cr_assert_str_eq(pp_strerror(EMFILE, buf, sizeof buf), want);
    cr_assert_str_eq(pp_strerror(ENOENT, buf, sizeof buf), strerror(ENOENT));
}
