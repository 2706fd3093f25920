/* test_run_progress.c: what `pprun run` shows of each finished step, read
 * from the job's store as the last stage's rank publishes it (a real store
 * server over TCP), and that a shown step leaves nothing in the store. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/capture.h"
#include "runner/job/run_progress.h"
#include "runner/store/store.h"

Test(run_progress, shows_every_published_step_in_order_and_deletes_its_key, .timeout = 60) {
    pp_err err;
    store_server *server;
    cr_assert_eq(store_server_start("127.0.0.1", 0, &server, &err), 0, "%s", err.msg);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(server));
    store_client *worker;
    cr_assert_eq(store_connect("127.0.0.1", store_server_port(server), 5000000000ull, &worker, &err), 0, "%s",
                 err.msg);

    capture log;
    capture_start(&log); /* not a terminal: plain lines */
    run_progress *p;
    int rc = run_progress_start(addr, NULL, 3, 0, RUN_PROGRESS_AUTO, &p, &err);
    /* Published out of order: shown in order all the same. */
    static const char *const text[3] = {"2.500000 10.000 100.0", "2.250000 11.000 110.0", "2.000000 12.000 120.0"};
    int order[3] = {1, 0, 2};
    for (int i = 0; rc == 0 && i < 3; i++) {
        char key[32];
        snprintf(key, sizeof key, "run/progress/%d", order[i]);
        cr_assert_eq(store_set(worker, key, text[order[i]], strlen(text[order[i]]), &err), 0, "%s", err.msg);
    }
    int next = rc == 0 ? run_progress_stop(p) : -1;
    const char *out = capture_end(&log);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(next, 3, "the next step to show after steps 0..2");

    const char *s1 = strstr(out, "step 1/3 loss 2.5000 step_ms 10.0 tokens_per_s 100");
    const char *s2 = strstr(out, "step 2/3 loss 2.2500 step_ms 11.0 tokens_per_s 110");
    const char *s3 = strstr(out, "step 3/3 loss 2.0000 step_ms 12.0 tokens_per_s 120");
    cr_assert(s1 && s2 && s3 && s1 < s2 && s2 < s3, "%s", out);
    for (int step = 0; step < 3; step++) {
        char key[32];
        void *val = NULL;
        size_t len;
        snprintf(key, sizeof key, "run/progress/%d", step);
        cr_assert_eq(store_get(worker, key, &val, &len, &err), 1, "%s is still in the store", key);
    }
    store_close(worker);
    store_server_stop(server);
}
