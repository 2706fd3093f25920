/* test_sched_csv.c: schedules as CSV files: round trips in both notations,
 * PyTorch's older and newer files, and malformed input. Real files in the
 * test process's temporary folder (tfix_path). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "sched/sched.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static sched_plan *load(const char *path) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_load_csv(path, &plan, &err), 0, "%s", err.msg);
    return plan;
}

static sched_plan *parse(const char *csv) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(csv, strlen(csv), "test.csv", &plan, &err), 0, "%s", err.msg);
    return plan;
}

/* Each rank's actions as text: "0F0 0F1 0B0 ..." */
static void actions_text(const sched_plan *plan, int r, char *out, size_t cap) {
    char buf[32];
    out[0] = '\0';
    for (int i = 0; i < plan->len[r]; i++) {
        if (i) strncat(out, " ", cap - strlen(out) - 1);
        strncat(out, sched_action_str(&plan->actions[r][i], buf), cap - strlen(out) - 1);
    }
}

static void assert_same_plan(const sched_plan *a, const sched_plan *b, int same_grid) {
    cr_assert_eq(a->ranks, b->ranks);
    cr_assert_eq(a->stages, b->stages);
    cr_assert_eq(a->microbatches, b->microbatches);
    for (int s = 0; s < a->stages; s++) cr_assert_eq(a->stage_rank[s], b->stage_rank[s], "stage %d", s);
    for (int r = 0; r < a->ranks; r++) {
        cr_assert_eq(a->len[r], b->len[r], "%s rank %d", a->name, r);
        for (int i = 0; i < a->len[r]; i++)
            cr_assert(memcmp(&a->actions[r][i], &b->actions[r][i], sizeof(sched_action)) == 0, "%s rank %d action %d",
                      a->name, r, i);
        if (!same_grid) continue;
        int n = a->nslots > b->nslots ? a->nslots : b->nslots;
        for (int c = 0; c < n; c++) {
            int sa = c < a->nslots ? a->slots[r][c].stage : -1, sb = c < b->nslots ? b->slots[r][c].stage : -1;
            cr_assert_eq(sa, sb, "%s rank %d slot %d", a->name, r, c);
            if (sa >= 0) cr_assert(memcmp(&a->slots[r][c], &b->slots[r][c], sizeof(sched_action)) == 0);
        }
    }
}

Test(sched_csv, every_schedule_round_trips_in_both_notations) {
    const struct { const char *kind; int v; } kinds[] = {
        {"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zb-v", 2}, {"dualpipev", 2}};
    const char *notations[] = {"pprun", "pytorch"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int n = 0; n < 2; n++) {
            sched_plan *plan = NULL, *back;
            pp_err err = {{0}};
            cr_assert_eq(sched_build(kinds[k].kind, 4, 8, kinds[k].v, NULL, &plan, &err), 0, "%s", err.msg);
            const char *path = tfix_path("plan.csv");
            cr_assert_eq(sched_write_csv(plan, path, notations[n], &err), 0, "%s", err.msg);
            back = load(path);
            assert_same_plan(plan, back, 1);
            for (int r = 0; r < plan->ranks; r++)
                for (int i = 0; i < plan->len[r]; i++)
                    cr_assert_eq(sched_overlaps(back, r, i), sched_overlaps(plan, r, i), "%s rank %d action %d",
                                 kinds[k].kind, r, i);
            cr_assert_eq(sched_validate(back, &err), 0, "%s", err.msg);
            sched_free(back);
            sched_free(plan);
        }
}

Test(sched_csv, the_two_notations_on_disk) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_build("1f1b", 2, 2, 1, NULL, &plan, &err), 0, "%s", err.msg);
    const char *path = tfix_path("ours.csv");
    cr_assert_eq(sched_write_csv(plan, path, "pprun", &err), 0);
    cr_assert_str_eq(read_file(path), "0F0,0F1,,0B0,0W0,,0B1,0W1\n,1F0,1B0,1W0,1F1,1B1,1W1\n");
    cr_assert_eq(sched_write_csv(plan, path, "pytorch", &err), 0);
    cr_assert_str_eq(read_file(path), "0F0,0F1,,0I0,0W0,,0I1,0W1\n,1F0,1I0,1W0,1F1,1I1,1W1\n");
    cr_assert_eq(sched_write_csv(plan, path, "megatron", &err), -1);
    cr_assert(strstr(err.msg, "--notation") && strstr(err.msg, "pprun, pytorch"), "%s", err.msg);
    /* the failed write left the file as it was */
    cr_assert_str_eq(read_file(path), "0F0,0F1,,0I0,0W0,,0I1,0W1\n,1F0,1I0,1W0,1F1,1I1,1W1\n");
    sched_free(plan);
}

Test(sched_csv, an_old_pytorch_file_has_b_and_w_without_i_and_bw_for_full) {
    /* older PyTorch: B = input gradient, W = weight gradient, BW = both */
    sched_plan *plan = parse("0F0,0F1,,0B0,0W0,0BW1\n"
                             ",1F0,1BW0,1F1,1B1,1W1\n");
    char text[256];
    actions_text(plan, 0, text, sizeof text);
    cr_assert_str_eq(text, "0F0 0F1 0B0 0W0 0BW1");
    actions_text(plan, 1, text, sizeof text);
    cr_assert_str_eq(text, "1F0 1BW0 1F1 1B1 1W1");
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

Test(sched_csv, a_new_pytorch_file_has_i_for_input_and_b_for_full) {
    /* newer PyTorch: I = input gradient, W = weight gradient, B = both;
     * communication actions are implied by our engine (idle cells here) */
    const char *path = tfix_path("torch.csv");
    tfix_write(path, "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0B1\r\n"
                     ",1RECV_F0,1F0,1I0,1W0,1F1,1B1\r\n");
    sched_plan *plan = load(path);
    char text[256];
    actions_text(plan, 0, text, sizeof text);
    cr_assert_str_eq(text, "0F0 0F1 0B0 0W0 0BW1");
    actions_text(plan, 1, text, sizeof text);
    cr_assert_str_eq(text, "1F0 1B0 1W0 1F1 1BW1");
    cr_assert_eq(plan->stages, 2);
    cr_assert_eq(plan->microbatches, 2);
    cr_assert_eq(plan->stage_rank[1], 1);
    cr_assert(strstr(plan->name, "torch.csv"), "%s", plan->name);
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

Test(sched_csv, a_file_with_only_f_and_b_has_full_backwards) {
    sched_plan *plan = parse("0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n");
    char text[256];
    actions_text(plan, 1, text, sizeof text);
    cr_assert_str_eq(text, "1F0 1BW0 1F1 1BW1");
    /* a full backward is one op in one cell, where the file put it */
    cr_assert_eq(plan->slots[1][2].op, SCHED_BW);
    cr_assert_eq(plan->slots[1][3].op, SCHED_F);
    cr_assert_eq(plan->slots[0][3].op, SCHED_BW);
    cr_assert_eq(plan->nslots, 5);
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

Test(sched_csv, full_backwards_round_trip_in_both_notations) {
    /* written BW in ours and B in PyTorch's newer notation (with I where a
     * backward is split), both read back as the same plan */
    const char *csv = "0F0,0F1,,0BW0,0B1,0W1\n,1F0,1BW0,1F1,1B1,1W1\n";
    sched_plan *plan = parse(csv);
    const char *ours = tfix_path("fused-ours.csv"), *theirs = tfix_path("fused-torch.csv");
    pp_err err = {{0}};
    cr_assert_eq(sched_write_csv(plan, ours, "pprun", &err), 0, "%s", err.msg);
    cr_assert_str_eq(read_file(ours), csv);
    cr_assert_eq(sched_write_csv(plan, theirs, "pytorch", &err), 0, "%s", err.msg);
    cr_assert_str_eq(read_file(theirs), "0F0,0F1,,0B0,0I1,0W1\n,1F0,1B0,1F1,1I1,1W1\n");
    sched_plan *a = load(ours), *b = load(theirs);
    assert_same_plan(plan, a, 1);
    assert_same_plan(plan, b, 1);
    sched_free(a);
    sched_free(b);
    /* a file of F and BW only, in PyTorch's notation: B without I or W */
    sched_free(plan);
    plan = parse("0F0,0F1,,0BW0,0BW1\n,1F0,1BW0,1F1,1BW1\n");
    cr_assert_eq(sched_write_csv(plan, theirs, "pytorch", &err), 0, "%s", err.msg);
    cr_assert_str_eq(read_file(theirs), "0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n");
    a = load(theirs);
    assert_same_plan(plan, a, 1);
    sched_free(a);
    sched_free(plan);
}

/* DualPipeV in PyTorch's notation: a pair is one cell, "(0F3;3B1)OVERLAP_F_B",
 * as PyTorch writes its OVERLAP_F_B actions (F first, then the full
 * backward, ';' between). Read back in either order of its halves. */
Test(sched_csv, dualpipev_pairs_are_pytorchs_overlap_f_b_cells) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_build("dualpipev", 2, 4, 2, NULL, &plan, &err), 0, "%s", err.msg);
    const char *path = tfix_path("dpv.csv");
    cr_assert_eq(sched_write_csv(plan, path, "pytorch", &err), 0, "%s", err.msg);
    cr_assert_str_eq(read_file(path),
                     "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,"
                     "(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3\n"
                     "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,"
                     "2B2,1B2,2I3,1I3,2W3,1W3\n");
    cr_assert_eq(sched_write_csv(plan, path, "pprun", &err), 0, "%s", err.msg);
    cr_assert(strstr(read_file(path), ",(0F3;3BW1)OVERLAP_F_B,"), "%s", read_file(path));
    sched_free(plan);
    /* the backward written first: still the F first, the pair kept */
    plan = parse("0F0,0F1,1F0,(1BW0;0F2)OVERLAP_F_B,1F1,0BW0,1BW1,0BW1,1F2,1BW2,0BW2\n");
    char text[256];
    actions_text(plan, 0, text, sizeof text);
    cr_assert_str_eq(text, "0F0 0F1 1F0 0F2 1BW0 1F1 0BW0 1BW1 0BW1 1F2 1BW2 0BW2");
    cr_assert(sched_overlaps(plan, 0, 3) && !sched_overlaps(plan, 0, 4));
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

Test(sched_csv, overlap_f_b_cells_are_split_into_f_then_b) {
    /* PyTorch's compound cell, unquoted with ';' and quoted with ','; its
     * two ops of one stage run one after the other */
    const char *files[] = {"0F0,0F1,0F2,,0I0,0W0,0I1,0W1,0I2,0W2\n"
                           ",1F0,1F1,(1F2;1I0)OVERLAP_F_B,1W0,1I1,1W1,1I2,1W2\n",
                           "0F0,0F1,0F2,,0I0,0W0,0I1,0W1,0I2,0W2\n"
                           ",1F0,1F1,\"(1F2,1I0)OVERLAP_F_B\",1W0,1I1,1W1,1I2,1W2\n"};
    for (int i = 0; i < 2; i++) {
        sched_plan *plan = parse(files[i]);
        char text[256];
        actions_text(plan, 1, text, sizeof text);
        cr_assert_str_eq(text, "1F0 1F1 1F2 1B0 1W0 1B1 1W1 1B2 1W2");
        pp_err err = {{0}};
        cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
        sched_free(plan);
    }
}

static void assert_bad(const char *csv, const char *want1, const char *want2) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(csv, strlen(csv), "bad.csv", &plan, &err), -1, "accepted: %s", csv);
    cr_assert_null(plan);
    cr_assert(strstr(err.msg, "bad.csv"), "%s", err.msg);
    cr_assert(strstr(err.msg, want1) && strstr(err.msg, want2), "%s", err.msg);
}

Test(sched_csv, malformed_files_name_the_line_column_and_cell) {
    assert_bad("0F0,0F1\n1F0,1X0\n", "line 2, column 2", "'1X0'");
    assert_bad("0F0,F1\n", "line 1, column 2", "'F1'");
    assert_bad("0F0,0F\n", "line 1, column 2", "'0F'");
    assert_bad("0F0,0F1x\n", "line 1, column 2", "'0F1x'");
    assert_bad("0F0,\"0F1\n", "line 1, column 2", "unterminated");
    assert_bad("0F0,(0F1;0B9x)OVERLAP_F_B\n", "line 1, column 2", "'0B9x'");
    assert_bad("", "no rows", "0F3");
    assert_bad(",,\n,\n", "no actions", "2 rows");
    assert_bad("0F0,99999F99999\n", "100000 microbatches", "over 10 million");
    /* base/shape.h's stage bound, as a program's schedule has it */
    assert_bad("0F0,65536F0\n", "65537 stages: more than 65536", "1024 ranks x 64 chunks");
}

Test(sched_csv, a_missing_file_is_named) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_load_csv(tfix_path("nope.csv"), &plan, &err), -1);
    cr_assert(strstr(err.msg, "nope.csv") && strstr(err.msg, "cannot open"), "%s", err.msg);
}

Test(sched_csv, stage_count_and_placement_come_from_the_file) {
    /* a V: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 */
    sched_plan *plan = parse("0F0,,,,3F0,3B0,3W0,,,,0B0,0W0\n"
                             ",1F0,2F0,,,,2B0,1B0,1W0,2W0\n");
    cr_assert_eq(plan->ranks, 2);
    cr_assert_eq(plan->stages, 4);
    cr_assert_eq(plan->virtual_stages, 2);
    const int want[] = {0, 1, 1, 0};
    for (int s = 0; s < 4; s++) cr_assert_eq(plan->stage_rank[s], want[s]);
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

Test(sched_csv, the_schedule_flag_takes_a_name_or_a_validated_csv) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_from_flag("zb-v", 4, 8, 0, NULL, &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(plan->virtual_stages, 2);
    const char *path = tfix_path("zbv.csv");
    cr_assert_eq(sched_write_csv(plan, path, "pytorch", &err), 0, "%s", err.msg);
    sched_free(plan);
    char spec[300];
    snprintf(spec, sizeof spec, "csv:%s", path);
    cr_assert_eq(sched_from_flag(spec, 4, 8, 0, NULL, &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(plan->stages, 8);
    cr_assert_eq(plan->stage_rank[7], 0);
    sched_free(plan);
    cr_assert_eq(sched_from_flag(spec, 2, 8, 0, NULL, &plan, &err), -1);
    cr_assert(strstr(err.msg, "4 ranks (rows)") && strstr(err.msg, "but 2 ranks"), "%s", err.msg);
    /* pprun run asks for its defaults unless told: the message says what the file needs */
    cr_assert(strstr(err.msg, "run it on 4 ranks with --microbatches 8"), "%s", err.msg);
    /* a CSV the validator refuses never reaches the caller */
    tfix_write(path, "0F0,0B0,0W0,0F1,0B1,0W1\n1F1,1B1,1W1,1F0,1B0,1W0\n");
    cr_assert_eq(sched_from_flag(spec, 0, 0, 0, NULL, &plan, &err), -1);
    cr_assert_null(plan);
    cr_assert(strstr(err.msg, "no deadlock"), "%s", err.msg);
    cr_assert_eq(sched_from_flag("csv:", 4, 8, 0, NULL, &plan, &err), -1);
    cr_assert(strstr(err.msg, "file name is missing"), "%s", err.msg);
}

Test(sched_csv, hostile_files_are_refused_with_what_is_wrong) {
    /* a NUL byte would end the cell there and drop what follows */
    const char nul[] = "0F0,0B0\0junk,0W0\n";
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(nul, sizeof nul - 1, "bad.csv", &plan, &err), -1, "a NUL byte was accepted");
    cr_assert_null(plan);
    cr_assert(strstr(err.msg, "bad.csv: line 1: a NUL byte"), "%s", err.msg);
    /* a blank line inside the file is not a rank that runs nothing */
    assert_bad("0F0,0B0,0W0\n\n1F0,1B0,1W0\n", "line 2", "no actions");
    assert_bad("0F0,0B0,0W0\n,,\n1F0,1B0,1W0\n", "line 2", "no actions");
    /* an action whose numbers are too large is named as such, not as "not an action" */
    assert_bad("0F0,0F99999999999\n", "line 1, column 2", "a stage or microbatch over 99999");
    assert_bad("100001F0\n", "'100001F0'", "over 99999");
    /* microbatch 100000 is the 100,001st: more than pprun run takes */
    assert_bad("0F0,0F100000\n", "'0F100000'", "a stage or microbatch over 99999");
    assert_bad("0F99999999999x\n", "'0F99999999999x'", "is not an action");
}

Test(sched_csv, more_rows_than_ranks_are_refused_at_the_row) {
    /* as many ranks as --stages accepts; one more row is refused where it is,
     * before anything is sized by rows x cells */
    size_t n = 0, n1024 = 0, cap = 1025 * 24;
    char *csv = malloc(cap);
    cr_assert_not_null(csv);
    for (int r = 0; r < 1025; r++) {
        if (r == 1024) n1024 = n;
        n += (size_t)snprintf(csv + n, cap - n, "%dF0,%dB0,%dW0\n", r, r, r);
    }
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(csv, n, "big.csv", &plan, &err), -1, "1025 rows accepted");
    cr_assert(strstr(err.msg, "big.csv: line 1025: more than 1024 rows"), "%s", err.msg);
    /* 1024 rows are a schedule */
    cr_assert_eq(sched_parse_csv(csv, n1024, "big.csv", &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(plan->ranks, 1024);
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
    free(csv);
}

/* Every row is as wide as the widest: 1,024 rows, the first 300,003
 * cells wide (its commas), asked for 307 million cells (6 GB, 25 s)
 * from a 300 KB file; refused before the grid is made, naming the line.
 * The same rows, the first at its own width, are a schedule. */
Test(sched_csv, a_grid_too_wide_for_its_rows_is_refused_at_its_widest_line) {
    size_t cap = 300000 + 1024 * 24, n = 0;
    char *csv = malloc(cap);
    cr_assert_not_null(csv);
    memset(csv, ',', 300000);
    n = 300000;
    for (int r = 0; r < 1024; r++) n += (size_t)snprintf(csv + n, cap - n, "%dF0,%dB0,%dW0\n", r, r, r);
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(csv, n, "wide.csv", &plan, &err), -1, "accepted");
    cr_assert(strstr(err.msg, "wide.csv: line 1 is 300003 cells wide, and every one of the 1024 rows is as wide as "
                              "the widest: 307203072 cells, more than 40 million"), "%s", err.msg);
    cr_assert_eq(sched_parse_csv(csv + 300000, n - 300000, "wide.csv", &plan, &err), 0, "%s", err.msg);
    sched_free(plan);
    free(csv);
}

Test(sched_csv, a_byte_order_mark_and_trailing_blanks_are_not_cells) {
    sched_plan *plan = parse("\xef\xbb\xbf" "0F0,0F1,,0B0,0W0,,0B1,0W1\r\n,1F0,1B0,1W0,1F1,1B1,1W1\r\n\t\r\n \n");
    cr_assert_eq(plan->ranks, 2);
    cr_assert_eq(plan->stages, 2);
    char text[256];
    actions_text(plan, 0, text, sizeof text);
    cr_assert_str_eq(text, "0F0 0F1 0B0 0W0 0B1 0W1");
    sched_free(plan);
}
