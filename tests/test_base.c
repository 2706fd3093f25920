/* test_base.c: the shared parsers: what a user types on the command line. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/pp.h"
#include "base/embed.h"

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
    cr_assert_eq(pp_parse_kv_list(text, collect, out, &err), 0);
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
    cr_assert_eq(pp_parse_kv_list(text, collect, out, &err), -1);
    cr_assert(strstr(err.msg, "layers") && strstr(err.msg, "twice"), "%s", err.msg);
}

/* A window of 0.5 s: the five calls of the first one must fall inside it,
 * and a loaded machine can stall a process for tens of milliseconds. */
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
