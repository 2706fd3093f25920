/* cmd_launch.c: `pprun launch [options] -- PROGRAM [ARGS...]`: a torchrun-
 * compatible launcher for any program (docs/cli.md). */
#include <stdio.h>
#include <stdlib.h>

#include "base/pp.h"
#include "runner/cmd/cli.h"
#include "runner/launch/launch.h"

int cmd_launch(int argc, char **argv) {
    static launch_options o; /* large (per-rank tables): keep it off the stack */
    pp_err err;
    int rc = launch_parse(argc, argv, &o, NULL, NULL, &err);
    if (rc == 1) return 0;
    if (rc != 0) {
        fprintf(stderr, "pprun launch: %s\n", err.msg);
        return 2;
    }
    /* PPRUN_CLOCK reaches every rank, whose clock takes a value it does not
     * know as unset: refused here, before anything starts, not ignored. */
    if (pp_clock_env_check(getenv(PP_CLOCK_ENV), &err) != 0 || launch_check_token(&o, &err) != 0 ||
        launch_check_start(&o, &err) != 0) {
        fprintf(stderr, "pprun launch: %s\n", err.msg);
        return 2;
    }
    launch_result res;
    if (launch_job(&o, NULL, &res, &err) != 0) {
        fprintf(stderr, "pprun launch: %s\n", err.msg);
        return res.exit_code;
    }
    if (res.status == LAUNCH_FAILED) launch_print_summary(stderr, &o, &res, NULL); /* titled by the program */
    if (res.status == LAUNCH_SIGNALED) {
        /* who got the signal, when it was not this launcher */
        char who[600], sbuf[16];
        if (res.failure.outside || res.failure_remote) launch_stop_text(&res, who, sizeof who);
        else snprintf(who, sizeof who, "by %s", launch_signal_name(res.signal, sbuf));
        fprintf(stderr, "pprun launch: stopped%s%s; %s\n", res.failure.outside || res.failure_remote ? ": " : " ",
                who, res.attempts ? "every rank was stopped" : "no rank had started");
    }
    return res.exit_code;
}
