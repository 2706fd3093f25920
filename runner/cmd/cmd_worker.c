/* cmd_worker.c: `pprun worker FLAGS`: one rank of a `pprun run` job
 * (runner/worker/worker.h). `pprun run` starts it with the job's options as
 * flags (run_config_to_args); it is not meant to be run by hand. */
#include <stdio.h>

#include "config/run_config.h"
#include "runner/cmd/cli.h"
#include "runner/worker/worker.h"

static int parse_flags(run_config *cfg, int argc, char **argv, pp_err *err) {
    run_config_default(cfg);
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = NULL;
        if (run_config_takes_value(opt)) {
            if (i + 1 >= argc) return pp_fail(err, "%s: expected a value", opt);
            val = argv[++i];
        }
        int rc = run_config_option(cfg, opt, val, err);
        if (rc < 0) return -1;
        if (rc == 0) return pp_fail(err, "unknown option '%s'", opt);
    }
    return run_config_finish(cfg, err);
}

int cmd_worker(int argc, char **argv) {
    static run_config cfg; /* large: keep it off the stack */
    pp_err err;
    if (parse_flags(&cfg, argc, argv, &err) != 0) {
        fprintf(stderr, "pprun worker: %s\n", err.msg);
        return 2;
    }
    int rank = 0;
    if (worker_run(&cfg, &rank, &err) != 0) {
        fprintf(stderr, "pprun worker (rank %d): %s\n", rank, err.msg);
        return 1;
    }
    return 0;
}
