/* test_launch_opts.c: every bad flag of `pprun launch` exits 2 naming the
 * option and what it accepts; the parser API that `pprun run` reuses. */
#include "launch_testutil.h"
#include "helpers/trace_fixture.h"

#include "runner/launch/launch.h"

static const struct {
    const char *args[8];
    const char *must[2]; /* substrings the message must have */
} bad[] = {
    {{"--nproc-per-node", "0"}, {"--nproc-per-node", "1 to 1024"}},
    {{"--nproc-per-node", "four"}, {"--nproc-per-node", "'four'"}},
    {{"--nproc_per_node=x"}, {"--nproc-per-node", "'x'"}},
    {{"--nnodes", "0"}, {"--nnodes", "1 to 4096"}},
    {{"--nnodes", "1:4"}, {"--nnodes", "N:N"}},
    {{"--node-rank", "-1"}, {"--node-rank", "0 to"}},
    {{"--nnodes", "2", "--node-rank", "2"}, {"--node-rank", "0 to 1"}},
    {{"--master-addr="}, {"--master-addr", "host"}},
    {{"--master-port", "70000"}, {"--master-port", "0 to 65535"}},
    {{"--nnodes", "2", "--master-port", "0"}, {"--master-port", "1 to 65535"}},
    {{"--max-restarts", "-2"}, {"--max-restarts", "0 to"}},
    {{"--monitor-interval", "soon"}, {"--monitor-interval", "seconds"}},
    {{"--monitor-interval", "0"}, {"--monitor-interval", "0.001 to 60"}},
    {{"--shutdown-timeout", "-1"}, {"--shutdown-timeout", "seconds"}},
    {{"--rdzv-timeout", "1 day"}, {"--rdzv-timeout", "seconds"}},
    {{"--log-dir="}, {"--log-dir", "directory"}},
    {{"--redirects", "4"}, {"--redirects", "0 (none)"}},
    {{"--tee", "0:9", "--log-dir", "/tmp"}, {"--tee", "3 (both)"}},
    {{"--redirects", "3"}, {"--redirects", "--log-dir"}},
    {{"--log-dir", "/tmp", "--redirects", "5:1"}, {"--redirects", "local rank 5"}},
    {{"--local-ranks-filter", "a"}, {"--local-ranks-filter", "local ranks"}},
    {{"--local-ranks-filter", "3"}, {"--local-ranks-filter", "0 to 0"}},
    {{"--run-id", "a/b"}, {"--run-id", "accepted characters"}},
    {{"--no-prefix=yes"}, {"--no-prefix", "takes no value"}},
    {{"--frobnicate"}, {"--frobnicate", "--help"}},
    {{"--nproc-per-node"}, {"--nproc-per-node", "needs a value"}},
    {{"--rdzv-token", ""}, {"--rdzv-token", "empty"}},
    {{"--rdzv_token=two words"}, {"--rdzv-token", "space"}},
    {{"--rdzv-token-file", "/nonexistent/pprun-token"}, {"--rdzv-token-file", "cannot open"}},
    {{"--rdzv-token-file="}, {"--rdzv-token-file", "file holding the token"}},
    {{"--rdzv-endpoint", "node0:99999"}, {"--rdzv-endpoint", "0 to 65535"}},
    {{"--nnodes", "2", "--rdzv-endpoint", "localhost:0"}, {"--rdzv-endpoint localhost:0: port 0", "1 to 65535"}},
    {{"--rdzv_endpoint=::1:29400"}, {"--rdzv-endpoint", "IPv6 address in []"}},
    {{"--rdzv-endpoint", "[::1"}, {"--rdzv-endpoint", "HOST:PORT"}},
    {{"--rdzv-backend", "etcd"}, {"--rdzv-backend", "static, c10d"}},
    {{"--nproc-per-node", "gpus"}, {"--nproc-per-node", "'cpu'/'auto'/'gpu'"}},
    {{"--no-python", "-m"}, {"-m and --no-python", "python3"}},
    /* --rdzv-endpoint against --master-addr / --master-port, in either
     * order: which one wins is not the order's to say */
    {{"--rdzv-endpoint", "127.0.0.1:0", "--master-port", "5"},
     {"--rdzv-endpoint 127.0.0.1:0 and --master-port 5 name different ports", "give one of them"}},
    {{"--master-port", "5", "--rdzv-endpoint", "127.0.0.1:0"},
     {"--rdzv-endpoint 127.0.0.1:0 and --master-port 5 name different ports", "give one of them"}},
    {{"--rdzv-endpoint", "127.0.0.1:0", "--master-addr", "127.0.0.2"},
     {"--rdzv-endpoint 127.0.0.1:0 and --master-addr 127.0.0.2 name different hosts", "give one of them"}},
    {{"--master_addr=127.0.0.2", "--rdzv-endpoint", "127.0.0.1"},
     {"--rdzv-endpoint 127.0.0.1 and --master-addr 127.0.0.2 name different hosts", "give one of them"}},
    {{"--rdzv-backend", "c10d", "--rdzv_backend=static"},
     {"--rdzv-backend c10d and --rdzv-backend static", "give one"}},
    /* node 0's address on one node too: the workers get it as MASTER_ADDR */
    {{"--master-addr", "a b"}, {"--master-addr 'a b' is not a host name or address", "letters, digits"}},
    {{"--rdzv-endpoint", "a b:1"}, {"--rdzv-endpoint 'a b:1': its host 'a b' is not a host name", "letters, digits"}},
    {{"--master-addr", "$(id)"}, {"--master-addr '$(id)' is not a host name or address", "letters, digits"}},
    {{"--master-addr", "x\033]0;t\007"}, {"--master-addr 'x\\x1b]0;t\\x07' is not a host name", "letters, digits"}},
    /* plain decimal numbers only (docs/cli.md): strtol took " 2" and "+2" */
    {{"--nproc-per-node", "+2"}, {"--nproc-per-node", "got '+2'"}},
    {{"--nproc-per-node", " 2"}, {"--nproc-per-node", "got ' 2'"}},
    {{"--master-port", "0x7000"}, {"--master-port", "'0x7000'"}},
    {{"--monitor-interval", "0x1"}, {"--monitor-interval", "got '0x1'"}},
    {{"--monitor-interval", "inf"}, {"--monitor-interval", "got 'inf'"}},
    {{"--rdzv-timeout", "0x10s"}, {"--rdzv-timeout", "'0x10s' is not a decimal number"}},
};

Test(launch_opts, every_bad_flag_exits_2_naming_the_option) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *args[16] = {"launch"};
        size_t n = 1;
        for (size_t k = 0; k < 8 && bad[i].args[k]; k++) args[n++] = bad[i].args[k];
        /* A value-less flag at the end must not eat "--". */
        if (strcmp(bad[i].args[0], "--nproc-per-node") != 0 || bad[i].args[1]) {
            args[n++] = "--";
            args[n++] = "true";
        }
        lt_proc p;
        lt_run(&p, args, NULL);
        cr_assert_eq(p.status, 2, "case %zu (%s): exit %d, %s", i, bad[i].args[0], p.status, p.err);
        for (int m = 0; m < 2; m++)
            cr_assert(strstr(p.err, bad[i].must[m]), "case %zu: '%s' not in: %s", i, bad[i].must[m], p.err);
        cr_assert_str_eq(p.out, "", "case %zu ran something", i);
        lt_free(&p);
    }
}

Test(launch_opts, missing_program_is_bad_usage) {
    const char *args[] = {"launch", "--nproc-per-node", "2", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 2);
    cr_assert(strstr(p.err, "PROGRAM"), "%s", p.err);
    lt_free(&p);
}

/* torchrun runs `train.py` with python; pprun runs PROGRAM itself. A .py
 * file that is there but not executable is refused with how to run it. */
Test(launch_opts, a_python_file_that_is_not_executable_gets_how_to_run_it) {
    const char *dir = tfix_mkdir("py");
    char path[512];
    snprintf(path, sizeof path, "%s/train.py", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("print('trained')\n", f);
    fclose(f);
    cr_assert_eq(chdir(dir), 0);
    const char *bare[] = {"launch", "--nproc-per-node", "2", "train.py", NULL};
    const char *rel[] = {"launch", "./train.py", NULL};
    lt_proc p;
    lt_run(&p, bare, NULL);
    cr_assert_eq(p.status, 2, "%s", p.err);
    cr_assert_str_eq(p.err, "pprun launch: PROGRAM 'train.py' not found in PATH; pprun runs PROGRAM itself, not with "
                            "python: run it as `-- python3 train.py`, or as a module with `-m MODULE`\n");
    cr_assert_str_eq(p.out, "");
    lt_free(&p);
    lt_run(&p, rel, NULL);
    cr_assert_eq(p.status, 2, "%s", p.err);
    lt_assert_has(p.err, "PROGRAM './train.py': not an executable file; pprun runs PROGRAM itself, not with python: "
                         "run it as `-- python3 ./train.py`");
    lt_free(&p);
    /* as the hint says */
    const char *py[] = {"launch", "--", "python3", "train.py", NULL};
    lt_run(&p, py, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "[0]: trained\n");
    lt_free(&p);
    /* a file that is not there gets no hint: running it with python would not help */
    const char *absent[] = {"launch", "nothere.py", NULL};
    lt_run(&p, absent, NULL);
    cr_assert_eq(p.status, 2, "%s", p.err);
    cr_assert_str_eq(p.err, "pprun launch: PROGRAM 'nothere.py' not found in PATH\n");
    lt_free(&p);
}

/* --rdzv-endpoint HOST:0 picks a free port, as --master-port 0 does. */
Test(launch_opts, rdzv_endpoint_port_0_picks_a_free_port) {
    const char *args[] = {"launch", "--rdzv_endpoint=localhost:0", "--", "sh", "-c", "echo $MASTER_ADDR $MASTER_PORT",
                          NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    int port = 0;
    cr_assert_eq(sscanf(p.out, "[0]: localhost %d", &port), 1, "%s", p.out);
    cr_assert(port > 0 && port <= 65535, "%s", p.out);
    lt_free(&p);
}

/* --rdzv-endpoint beside --master-addr / --master-port that say the same
 * (as torchrun templates write them) is one place: taken, and the workers
 * hear of it; a plain repeated option keeps argparse's habit, the last
 * wins; an IPv6 address, with its zone, is an address. */
Test(launch_opts, rendezvous_options_that_agree_are_taken) {
    static launch_options o;
    pp_err err;
    char *same[] = {"launch",      "--master-addr",  "127.0.0.1", "--master-port",       "0",  "--rdzv-endpoint",
                    "127.0.0.1:0", "--rdzv-backend", "c10d",      "--rdzv_backend=c10d", "--", "true",
                    NULL};
    cr_assert_eq(launch_parse(12, same, &o, NULL, NULL, &err), 0, "%s", err.msg);
    char *v6[] = {"launch", "--rdzv-endpoint", "[::1]:1234", "--master-addr", "[::1]", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, v6, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.master_addr, "[::1]");
    cr_assert_eq(o.master_port, 1234);
    char *host_only[] = {"launch", "--rdzv-endpoint", "localhost", "--master-port", "1234", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, host_only, &o, NULL, NULL, &err), 0, "a host alone says no port: %s", err.msg);
    cr_assert(strcmp(o.master_addr, "localhost") == 0 && o.master_port == 1234, "%s:%d", o.master_addr, o.master_port);
    /* under c10d torchrun takes the endpoint and ignores the other two, in any order */
    char *c10d[] = {
        "launch",        "--master-addr", "10.0.0.9", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400",
        "--master-port", "29500",         "--",       "true",           NULL};
    cr_assert_eq(launch_parse(11, c10d, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert(strcmp(o.master_addr, "localhost") == 0 && o.master_port == 29400, "%s:%d", o.master_addr, o.master_port);
    char *again[] = {"launch",
                     "--master-addr",
                     "10.0.0.1",
                     "--master-addr",
                     "fe80::1%eth0",
                     "--master-port",
                     "5",
                     "--master-port",
                     "6",
                     "--",
                     "true",
                     NULL};
    cr_assert_eq(launch_parse(11, again, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert(strcmp(o.master_addr, "fe80::1%eth0") == 0 && o.master_port == 6, "%s:%d", o.master_addr, o.master_port);

    const char *args[] = {"launch", "--rdzv-endpoint",   "127.0.0.1:0", "--master-addr", "127.0.0.1", "--", "sh",
                          "-c",     "echo $MASTER_ADDR", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "[0]: 127.0.0.1\n");
    lt_free(&p);
}

/* Slurm's address for node 0 is checked as --master-addr is, and named as
 * Slurm's (the user gave none). */
Test(launch_opts, a_master_address_from_slurm_that_is_no_host_is_refused) {
    static launch_options o;
    pp_err err;
    setenv("SLURM_NNODES", "1", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_JOB_NODELIST", "", 1);
    setenv("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1;reboot", 1);
    char *argv[] = {"launch", "--", "true", NULL};
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "from Slurm's environment, '10.0.0.1;reboot', is not a host name or address") &&
                  strstr(err.msg, "give --master-addr"),
              "%s", err.msg);
    char *given[] = {"launch", "--master-addr", "n1", "--", "true", NULL};
    cr_assert_eq(launch_parse(5, given, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.master_addr, "n1");
}

/* `pprun run` parses its own flags through the same parser. */
typedef struct {
    const char *db;
    int serve;
} run_flags;

static int run_extra(void *ctx, const char *opt, const char *val, pp_err *err) {
    run_flags *f = ctx;
    if (strcmp(opt, "--db") == 0) {
        if (!val || !*val) return pp_fail(err, "--db: expected a file name");
        f->db = val;
        return 2;
    }
    if (strcmp(opt, "--serve") == 0) {
        f->serve = 1;
        return 1;
    }
    return 0;
}

Test(launch_opts, parser_takes_both_spellings_and_callers_flags) {
    static launch_options o;
    run_flags f = {0};
    pp_err err;
    char *argv[] = {"run", "--nproc_per_node=3", "--max-restarts", "2", "--db", "x.db", "--serve",
                    "--monitor-interval", "250ms", "--shutdown_timeout=1.5", "--", "prog", "a", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    cr_assert_eq(launch_parse(argc, argv, &o, run_extra, &f, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, 3);
    cr_assert_eq(o.max_restarts, 2);
    cr_assert_eq(o.monitor_interval_ns, 250000000ull);
    cr_assert_eq(o.shutdown_timeout_ns, 1500000000ull);
    cr_assert_str_eq(f.db, "x.db");
    cr_assert_eq(f.serve, 1);
    cr_assert_eq(o.prog_argc, 2);
    cr_assert_str_eq(o.prog_argv[0], "prog");
    cr_assert_eq(o.master_port, 0, "one node and no --master-port: a free port");

    char *bad_argv[] = {"run", "--serve=1", "--", "prog", NULL};
    cr_assert_eq(launch_parse(4, bad_argv, &o, run_extra, &f, &err), -1);
    cr_assert(strstr(err.msg, "--serve") && strstr(err.msg, "no value"), "%s", err.msg);
}

/* pprun run's numbers are plain decimal too: each of these was taken
 * (--dp-bucket 0x1000 as 4096 bytes, timed:act=0x10 as 16, f=0x1p-1ms as
 * 500 us, --lr 0x1p-10 as 2^-10); an empty item of a list is a typo. */
Test(launch_opts, pprun_run_refuses_numbers_that_are_not_plain_decimal) {
    static const struct {
        const char *opt, *value, *want;
    } bad[] = {
        {"--dp-bucket", "0x1000", "--dp-bucket: '0x1000' is not a decimal number"},
        {"--model", "timed:f=0x1p-1ms", "--model timed: f: '0x1p-1ms' is not a decimal number"},
        {"--model", "timed:act=0x10", "--model timed: act: '0x10' is not a decimal number"},
        {"--model", "timed:f=nanms", "--model timed: f: 'nanms' is not a decimal number"},
        {"--model", "gpt:layers=+4", "--model gpt: layers: expected an integer in [1, 1024], got '+4'"},
        {"--model", "timed:f=1ms,,b=1ms", "--model: empty item in 'f=1ms,,b=1ms'"},
        {"--recv-timeout", "0x10s", "--recv-timeout: '0x10s' is not a decimal number"},
        {"--recv-timeout", "86401", "--recv-timeout: accepted: 1ms to 86400s (a day), got '86401'"},
        {"--recv-timeout", "86401s", "--recv-timeout: accepted: 1ms to 86400s (a day), got '86401s'"},
        {"--schedule-costs", "f=0x10,b=1,w=1",
         "--schedule-costs f: expected a decimal number in [0, 1e+13], got '0x10'"},
        {"--schedule-costs", "f=1,,b=1,w=1", "--schedule-costs: empty item in 'f=1,,b=1,w=1'"},
        /* a job id out of range is said so, not looked for as the file 'j.db:-1' */
        {"--schedule-costs", "j.db:-1", "--schedule-costs DB:JOB: -1 is out of range; accepted: 1 to 2147483647"},
        {"--schedule-costs", "j.db:0", "--schedule-costs DB:JOB: 0 is out of range; accepted: 1 to 2147483647"},
        {"--lr", "0x1p-10", "--lr: expected a decimal number in [0, 10], got '0x1p-10'"},
        {"--lr", "nan", "--lr: expected a decimal number in [0, 10], got 'nan'"},
        {"--weight-decay", "infinity", "--weight-decay: expected a decimal number in [0, 1], got 'infinity'"},
        {"--pp", " 2", "--pp: expected an integer in [1, 65536], got ' 2'"},
        {"--pp", "+2", "--pp: expected an integer in [1, 65536], got '+2'"},
        {"--steps", "-0", "--steps: -0 is out of range"},
        {"--fail-at", "step=1,,rank=0", "--fail-at: empty item in 'step=1,,rank=0'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        lt_expect_refusal((const char *[]){"run", bad[i].opt, bad[i].value, "--steps", "1", NULL}, bad[i].want);
}

/* torchrun's habits: --rdzv-endpoint HOST:PORT, --rdzv-backend,
 * --nproc-per-node gpu, -m MODULE (python3 -m), --no-python, snake_case. */
Test(launch_opts, torchruns_habits_are_taken) {
    static launch_options o;
    pp_err err;
    setenv("CUDA_VISIBLE_DEVICES", "0,2,5", 1);
    char *argv[] = {"launch", "--rdzv_endpoint=node0:29400", "--rdzv-backend", "c10d", "--nproc-per-node", "gpu",
                    "-m", "trainer.main", "--lr", "3", NULL};
    cr_assert_eq(launch_parse(10, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, 3, "one worker per visible GPU");
    cr_assert_str_eq(o.master_addr, "node0");
    cr_assert_eq(o.master_port, 29400);
    cr_assert_eq(o.prog_argc, 5);
    const char *want[] = {"python3", "-m", "trainer.main", "--lr", "3"};
    for (int i = 0; i < 5; i++) cr_assert_str_eq(o.prog_argv[i], want[i]);

    setenv("CUDA_VISIBLE_DEVICES", "1,-1,3", 1); /* CUDA stops at the first entry that is not a device */
    char *v6[] = {"launch", "--rdzv-endpoint", "[::1]:1234", "--rdzv-backend=static", "--nproc_per_node=gpu",
                  "--no-python", "./train", NULL};
    cr_assert_eq(launch_parse(7, v6, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, 1);
    cr_assert_str_eq(o.master_addr, "::1");
    cr_assert_eq(o.master_port, 1234);
    cr_assert(o.prog_argc == 1 && strcmp(o.prog_argv[0], "./train") == 0);

    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    char *none[] = {"launch", "--nproc-per-node", "gpu", "--", "true", NULL};
    cr_assert_eq(launch_parse(5, none, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "no GPU"), "%s", err.msg);
    char *bare[] = {"launch", "-m", NULL};
    cr_assert_eq(launch_parse(2, bare, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "-m needs a module"), "%s", err.msg);
    unsetenv("CUDA_VISIBLE_DEVICES");
    /* -m is a flag, as torchrun's: options after it, the module the first
     * argument that is not one (or after --); any option in snake_case */
    char *flag_first[] = {"launch", "-m", "--nproc-per-node", "2", "--rdzv_id", "job1", "pk.hello", "--x", NULL};
    cr_assert_eq(launch_parse(8, flag_first, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, 2);
    cr_assert_str_eq(o.run_id, "job1");
    const char *want_module[] = {"python3", "-m", "pk.hello", "--x"};
    cr_assert_eq(o.prog_argc, 4);
    for (int i = 0; i < 4; i++) cr_assert_str_eq(o.prog_argv[i], want_module[i]);
    char *theirs[] = {"launch", "--rdzv_conf", "join_timeout=5", "--", "true", NULL};
    cr_assert_eq(launch_parse(5, theirs, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "--rdzv_conf is torchrun's, not pprun's: settings of torchrun's rendezvous backends"),
              "torchrun's options pprun does not take are refused naming why: %s", err.msg);
    char *dashes[] = {"launch", "-m", "--", "pk.hello", NULL};
    cr_assert_eq(launch_parse(4, dashes, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert(o.prog_argc == 3 && strcmp(o.prog_argv[2], "pk.hello") == 0, "%d %s", o.prog_argc, o.prog_argv[0]);

    lt_proc p;
    const char *args[] = {"launch", "--nproc-per-node", "2", "-m", "platform", NULL};
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_eq(lt_count(p.out, "Linux"), 2, "python3 -m platform on each rank: %s", p.out);
    lt_free(&p);
}

/* torchrun's --standalone is one node on a free port in either order of
 * the flags: --nnodes 2 after it was refused naming a --master-port 0 the
 * user never gave, and before it was silently one node. */
Test(launch_opts, standalone_is_one_node_whatever_the_order_of_the_flags) {
    static launch_options o;
    pp_err err;
    char *alone[] = {"launch", "--master-port", "0", "--nnodes", "1", "--standalone", "--", "true", NULL};
    cr_assert_eq(launch_parse(8, alone, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert(o.nnodes == 1 && o.node_rank == 0 && o.master_port == 0);
    static const struct {
        const char *a, *b, *want;
    } bad[] = {
        {"--nnodes", "2", "--standalone runs one node, and --nnodes says 2: give one of them"},
        {"--node-rank", "1", "--standalone runs node 0 alone, and --node-rank says 1"},
        {"--master-port", "29400", "--standalone picks a free port, and --master-port says 29400"},
        {"--rdzv-endpoint", "localhost:29400", "--standalone picks a free port, and --rdzv-endpoint says 29400"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int after = 0; after < 2; after++) {
            char *argv[] = {"launch",
                            after ? (char *)bad[i].a : "--standalone",
                            after ? (char *)bad[i].b : (char *)bad[i].a,
                            after ? "--standalone" : (char *)bad[i].b,
                            "--",
                            "true",
                            NULL};
            cr_assert_eq(launch_parse(6, argv, &o, NULL, NULL, &err), -1, "%s %s %s", argv[1], argv[2], argv[3]);
            cr_assert(strstr(err.msg, bad[i].want), "%s %s %s: %s", argv[1], argv[2], argv[3], err.msg);
        }
}

Test(launch_opts, slurm_fills_what_flags_do_not_say) {
    static launch_options o;
    pp_err err;
    setenv("SLURM_NNODES", "4", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[003-006,9],cpu1", 1);
    setenv("SLURM_NTASKS_PER_NODE", "8(x4)", 1);
    unsetenv("SLURM_STEP_NUM_TASKS");
    char *argv[] = {"launch", "--", "prog", NULL};
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nnodes, 4);
    cr_assert_eq(o.node_rank, 2);
    cr_assert_str_eq(o.master_addr, "gpu003");
    cr_assert_eq(o.nproc_per_node, 8);
    cr_assert_eq(o.master_port, 29500);
    /* Flags win over Slurm. */
    char *argv2[] = {"launch", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2", "--master-addr", "h",
                     "--", "prog", NULL};
    cr_assert_eq(launch_parse(11, argv2, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nnodes, 1);
    cr_assert_str_eq(o.master_addr, "h");
    cr_assert_eq(o.nproc_per_node, 2);
    /* Several launchers per node would all claim the same node rank. */
    setenv("SLURM_STEP_NUM_TASKS", "16", 1);
    setenv("SLURM_STEP_NUM_NODES", "4", 1);
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "--ntasks-per-node=1"), "%s", err.msg);
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_STEP_NUM_NODES");
    setenv("SLURM_JOB_NODELIST", "", 1);
    setenv("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3", 1);
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.master_addr, "10.1.2.3");
    unsetenv("SLURM_NNODES");
    unsetenv("SLURM_NODEID");
    unsetenv("SLURM_JOB_NODELIST");
    unsetenv("SLURM_NTASKS_PER_NODE");
    unsetenv("SLURM_LAUNCH_NODE_IPADDR");
}

/* The master address is the first host of the node list as Slurm
 * compresses it; a list pprun cannot read falls back to
 * SLURM_LAUNCH_NODE_IPADDR rather than to a wrong name. */
Test(launch_opts, slurm_master_is_the_first_host_of_the_node_list) {
    static char too_long[400];
    memset(too_long, 'n', sizeof too_long - 1);
    static const struct {
        const char *list, *want;
    } cases[] = {
        {"gpu[003-006,9],cpu1", "gpu003"},
        {"rack[1-2]-n[07-09]", "rack1-n07"},
        {"cpu1,gpu[1-2]", "cpu1"},
        {"n[7]", "n7"},
        {"vm", "vm"},
        {"", "10.9.8.7"},
        {"n[a-b]", "10.9.8.7"},
        {"n[1-2", "10.9.8.7"},
        {"n]1", "10.9.8.7"},
        {",n1", "10.9.8.7"},
        {too_long, "10.9.8.7"},
    };
    static launch_options o;
    pp_err err;
    setenv("SLURM_NNODES", "1", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_LAUNCH_NODE_IPADDR", "10.9.8.7", 1);
    char *argv[] = {"launch", "--", "prog", NULL};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("SLURM_JOB_NODELIST", cases[i].list, 1);
        cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), 0, "%s: %s", cases[i].list, err.msg);
        cr_assert_str_eq(o.master_addr, cases[i].want, "list '%.40s'", cases[i].list);
    }
}

/* Inside a step of srun the step's values hold, not the job's: `srun -N2
 * -w n[03-04]` in a four-node job is a two-node job whose node 0 is n03. */
Test(launch_opts, slurm_step_values_win_over_the_jobs) {
    static launch_options o;
    pp_err err;
    setenv("SLURM_JOB_ID", "42", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_NNODES", "4", 1);
    setenv("SLURM_JOB_NODELIST", "n[01-04]", 1);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    setenv("SLURM_STEP_NODELIST", "n[03-04]", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_NTASKS_PER_NODE", "1", 1);
    char *argv[] = {"launch", "--nproc-per-node", "3", "--", "prog", NULL};
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nnodes, 2);
    cr_assert_eq(o.node_rank, 1);
    cr_assert_str_eq(o.master_addr, "n03");
    cr_assert_eq(o.nproc_per_node, 3, "the flag wins over SLURM_NTASKS_PER_NODE");
    /* A step list pprun cannot read: the job's list is next. */
    setenv("SLURM_STEP_NODELIST", "n[", 1);
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.master_addr, "n01");
}

/* What Slurm would run wrongly is refused with the command that works:
 * several launchers per node in a step, and a multi-node job's batch
 * script (it runs on the first node only). */
Test(launch_opts, slurm_refuses_what_would_claim_one_node_rank_twice) {
    static launch_options o;
    pp_err err;
    char *argv[] = {"launch", "--", "prog", NULL};
    setenv("SLURM_JOB_ID", "42", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_STEP_NUM_TASKS", "8", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "runs 8 tasks on 2 nodes (4(x2) per node)"), "%s", err.msg);
    cr_assert(strstr(err.msg, "srun --ntasks-per-node=1 --ntasks=2"), "%s", err.msg);
    /* --node-rank says which launcher this is: the user took charge. */
    char *ranked[] = {"launch", "--node-rank", "1", "--", "prog", NULL};
    cr_assert_eq(launch_parse(5, ranked, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.node_rank, 1);

    /* The batch script: a job, no step. */
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "batch script"), "%s", err.msg);
    cr_assert(strstr(err.msg, "srun --ntasks-per-node=1"), "%s", err.msg);
    char *alone[] = {"launch", "--nnodes", "1", "--", "prog", NULL};
    cr_assert_eq(launch_parse(5, alone, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nnodes, 1);
    /* A one-node job's script is the whole job. */
    setenv("SLURM_NNODES", "1", 1);
    cr_assert_eq(launch_parse(3, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nnodes, 1);
}

/* `--nproc-per-node cpu` counts the CPUs Slurm gave the job on this node
 * when they are fewer than the affinity mask's (no CPU binding). */
Test(launch_opts, slurm_cpus_on_node_bound_nproc_cpu) {
    static launch_options o;
    pp_err err;
    char *argv[] = {"launch", "--nproc-per-node", "cpu", "--", "prog", NULL};
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    int mask = o.nproc_per_node;
    setenv("SLURM_CPUS_ON_NODE", "1", 1);
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, 1);
    setenv("SLURM_CPUS_ON_NODE", "100000", 1);
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, mask, "never more than the CPUs it may run on");
    setenv("SLURM_CPUS_ON_NODE", "lots", 1);
    cr_assert_eq(launch_parse(5, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(o.nproc_per_node, mask, "an unreadable value is ignored");
}

/* The job token: from a file (first line), the flag or PPRUN_RDZV_TOKEN,
 * each checked; too long, empty, both flags are exit 2 naming the source;
 * nothing shows the token. */
Test(launch_opts, the_rdzv_token_is_checked_wherever_it_comes_from) {
    char file[256], empty[256], longf[256]; /* removed when the test process exits (tfix_path) */
    snprintf(file, sizeof file, "%s", tfix_path("token"));
    snprintf(empty, sizeof empty, "%s", tfix_path("empty"));
    snprintf(longf, sizeof longf, "%s", tfix_path("long"));
    FILE *f = fopen(file, "w");
    fputs("s3cret-from-file\r\nsecond line ignored\n", f);
    fclose(f);
    f = fopen(empty, "w");
    fputs("\n", f);
    fclose(f);
    char big[400];
    memset(big, 'k', 300);
    big[300] = '\0';
    f = fopen(longf, "w");
    fputs(big, f);
    fclose(f);

    launch_options o;
    pp_err err;
    char *a1[] = {"launch", "--rdzv-token-file", file, "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a1, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.rdzv_token, "s3cret-from-file");
    setenv("PPRUN_RDZV_TOKEN", "from-env", 1);
    char *a2[] = {"launch", "--", "true", NULL};
    cr_assert_eq(launch_parse(3, a2, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.rdzv_token, "from-env");
    char *a3[] = {"launch", "--rdzv_token", "from-flag", "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a3, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.rdzv_token, "from-flag", "the flag wins over the environment");
    setenv("PPRUN_RDZV_TOKEN", "", 1);
    cr_assert_eq(launch_parse(3, a2, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "PPRUN_RDZV_TOKEN") && strstr(err.msg, "empty"), "%s", err.msg);
    unsetenv("PPRUN_RDZV_TOKEN");
    cr_assert_eq(launch_parse(3, a2, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(o.rdzv_token, "", "no token unless given");

    char *a4[] = {"launch", "--rdzv-token", big, "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a4, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "--rdzv-token") && strstr(err.msg, "300 bytes") && strstr(err.msg, "1 to 256"), "%s", err.msg);
    cr_assert_null(strstr(err.msg, "kkkk"), "the message shows the token: %s", err.msg);
    char *a5[] = {"launch", "--rdzv-token-file", longf, "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a5, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "--rdzv-token-file") && strstr(err.msg, "1 to 256"), "%s", err.msg);
    char *a6[] = {"launch", "--rdzv-token-file", empty, "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a6, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, empty) && strstr(err.msg, "empty"), "%s", err.msg);
    char *a7[] = {"launch", "--rdzv-token", "x", "--rdzv-token-file", file, "--", "true", NULL};
    cr_assert_eq(launch_parse(7, a7, &o, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "not both"), "%s", err.msg);

    /* The rule: several nodes on a non-loopback master address need one. */
    char *a8[] = {"launch", "--nnodes", "2", "--master-addr", "192.0.2.77", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, a8, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_check_token(&o, &err), -1);
    cr_assert(strstr(err.msg, "--master-addr 192.0.2.77 is not a loopback address") &&
                  strstr(err.msg, "--rdzv-token-file") && strstr(err.msg, "PPRUN_RDZV_TOKEN"),
              "%s", err.msg);
    snprintf(o.rdzv_token, sizeof o.rdzv_token, "0123456789abcde"); /* 15 bytes guard nothing there */
    cr_assert_eq(launch_check_token(&o, &err), -1);
    cr_assert(strstr(err.msg, "the job token is 15 bytes: with --nnodes 2 and --master-addr 192.0.2.77, not a "
                              "loopback address, it guards ports other machines can reach; give at least 16"),
              "%s", err.msg);
    snprintf(o.rdzv_token, sizeof o.rdzv_token, "0123456789abcdef");
    cr_assert_eq(launch_check_token(&o, &err), 0, "%s", err.msg);
    char *a9[] = {"launch", "--nnodes", "2", "--master-addr", "localhost", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, a9, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_check_token(&o, &err), 0, "loopback needs nothing: %s", err.msg);
    /* named as the user gave it: --rdzv-endpoint, unless --master-addr (saying the same) came after it */
    char *a8e[] = {"launch", "--nnodes", "2", "--rdzv-endpoint", "192.0.2.77:29500", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, a8e, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_check_token(&o, &err), -1);
    cr_assert(strstr(err.msg, "--rdzv-endpoint 192.0.2.77:29500: its host 192.0.2.77 is not a loopback address") &&
                  !strstr(err.msg, "--master-addr"),
              "%s", err.msg);
    char *a8m[] = {"launch", "--nnodes", "2", "--rdzv-endpoint", "192.0.2.77:29500", "--master-addr", "192.0.2.77",
                   "--",     "true",     NULL};
    cr_assert_eq(launch_parse(9, a8m, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_check_token(&o, &err), -1);
    cr_assert(strstr(err.msg, "--master-addr 192.0.2.77 is not a loopback address"), "%s", err.msg);
    char *a10[] = {"launch", "--master-addr", "192.0.2.77", "--", "true", NULL};
    cr_assert_eq(launch_parse(5, a10, &o, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_check_token(&o, &err), 0, "one node keeps its store on loopback: %s", err.msg);
}
