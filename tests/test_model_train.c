/* test_model_train.c: the default model learns the default corpus: its loss
 * falls clearly within 30 steps (what a user of `pprun run` sees). */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "model_harness.h"

Test(model_train, default_model_loss_falls_on_default_corpus, .timeout = 600) {
    openblas_set_num_threads(1);
    pp_err err;
    model_spec sp;
    cr_assert_eq(model_parse_spec("gpt", &sp, &err), 0, "%s", err.msg);
    data_source *data;
    cr_assert_eq(data_open(NULL, (size_t)sp.seq + 1, &data, &err), 0, "%s", err.msg);
    enum { STEPS = 30, M = 2 };
    int cuts[] = {0, sp.layers / 2, sp.layers};
    h_pipe p;
    cr_assert_eq(h_pipe_create(&p, "gpt", cuts, 2, 42, M, &err), 0, "%s", err.msg);
    model_optim opt;
    model_optim_default(&opt);
    double loss[STEPS];
    for (int step = 0; step < STEPS; step++) {
        float l[M];
        cr_assert_eq(h_pipe_step(&p, data, 42, step, H_1F1B, &opt, l, &err), 0, "%s", err.msg);
        loss[step] = (l[0] + l[1]) / 2;
        cr_assert(isfinite(loss[step]));
    }
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++) first += loss[i] / 5, last += loss[STEPS - 5 + i] / 5;
    /* starts near ln(256) = 5.55 (uniform over bytes) */
    cr_assert(fabs(first - log(256.0)) < 0.5, "first losses %.3f, expected about 5.55", first);
    cr_assert(last < first - 0.8, "loss fell only from %.3f to %.3f in %d steps", first, last, STEPS);
    cr_log_info("loss: first 5 steps %.3f, last 5 steps %.3f", first, last);
    h_pipe_free(&p);
    data_close(data);
}
