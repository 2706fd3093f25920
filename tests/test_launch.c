/* test_launch.c: `pprun launch` on one node, through the real binary: the
 * environment each rank sees, prefixed output, log files. */
#include "launch_testutil.h"
#include "helpers/trace_fixture.h"

#include <sys/resource.h>

/* Runs N ranks that print their environment and checks every field. */
static void check_env(int n) {
    char nproc[16];
    snprintf(nproc, sizeof nproc, "%d", n);
    const char *args[] = {"launch", "--nproc-per-node", nproc, "--max-restarts", "3", "--run-id", "envtest", "--",
                          "sh", "-c",
                          "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK RR=$ROLE_RANK "
                          "MA=$MASTER_ADDR MP=$MASTER_PORT ID=$PPRUN_RUN_ID RC=$PPRUN_RESTART_COUNT "
                          "MR=$PPRUN_MAX_RESTARTS ST=$PPRUN_STORE NN=$PPRUN_NNODES NR=$PPRUN_NODE_RANK "
                          "OMP=$OMP_NUM_THREADS BLAS=$OPENBLAS_NUM_THREADS\"",
                          NULL};
    const char *env[] = {"OMP_NUM_THREADS=", "OPENBLAS_NUM_THREADS=", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d, stderr: %s", p.status, p.err);
    cr_assert_eq(lt_count(p.out, "\n"), (size_t)n, "%s", p.out);
    int port = -1;
    for (int r = 0; r < n; r++) {
        char line[512], prefix[32];
        snprintf(prefix, sizeof prefix, "[%d]: ", r);
        const char *at = strstr(p.out, prefix);
        cr_assert_not_null(at, "no line from rank %d in:\n%s", r, p.out);
        const char *nl = strchr(at, '\n');
        snprintf(line, sizeof line, "%.*s", (int)(nl - at), at);
        int R, L, W, LW, G, RR, MP, RC, MR, NN, NR, OMP, BLAS;
        char ma[64], id[64], st[64];
        int got = sscanf(line + strlen(prefix),
                         "R=%d L=%d W=%d LW=%d G=%d RR=%d MA=%63s MP=%d ID=%63s RC=%d MR=%d ST=%63s NN=%d NR=%d "
                         "OMP=%d BLAS=%d",
                         &R, &L, &W, &LW, &G, &RR, ma, &MP, id, &RC, &MR, st, &NN, &NR, &OMP, &BLAS);
        cr_assert_eq(got, 16, "rank %d line: %s", r, line);
        cr_assert_eq(R, r);
        cr_assert_eq(L, r);
        cr_assert_eq(W, n);
        cr_assert_eq(LW, n);
        cr_assert_eq(G, 0);
        cr_assert_eq(RR, r);
        cr_assert_str_eq(ma, "127.0.0.1");
        cr_assert(MP > 0 && MP < 65536, "MASTER_PORT %d", MP);
        /* outside the ports the kernel hands out by itself (bind(0), an
         * outgoing connection): nothing on the machine takes it before
         * rank 0 binds it (bench/port_race.sh) */
        int lo = 32768, hi = 60999;
        FILE *range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
        if (range) {
            cr_assert_eq(fscanf(range, "%d %d", &lo, &hi), 2);
            fclose(range);
        }
        cr_assert(MP < lo || MP > hi, "MASTER_PORT %d is in the ephemeral range %d-%d", MP, lo, hi);
        if (port < 0) port = MP;
        cr_assert_eq(MP, port, "every rank sees the same MASTER_PORT");
        cr_assert_str_eq(id, "envtest");
        cr_assert_eq(RC, 0);
        cr_assert_eq(MR, 3);
        /* The store has its own port: PyTorch's rank 0 listens on MASTER_PORT. */
        int sp = 0;
        cr_assert_eq(sscanf(st, "127.0.0.1:%d", &sp), 1, "PPRUN_STORE=%s", st);
        cr_assert(sp > 0 && sp != MP, "store port %d, MASTER_PORT %d", sp, MP);
        cr_assert_eq(NN, 1);
        cr_assert_eq(NR, 0);
        cr_assert_eq(OMP, 1);
        cr_assert_eq(BLAS, 1);
    }
    lt_free(&p);
}

Test(launch_env, one_rank) { check_env(1); }
Test(launch_env, four_ranks) { check_env(4); }
Test(launch_env, sixteen_ranks) { check_env(16); }

Test(launch_env, user_thread_settings_are_kept) {
    const char *args[] = {"launch", "--", "sh", "-c", "echo $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS", NULL};
    const char *env[] = {"OMP_NUM_THREADS=7", "OPENBLAS_NUM_THREADS=3", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0);
    cr_assert_str_eq(p.out, "[0]: 7 3\n");
    lt_free(&p);
}

/* PyTorch's env:// rendezvous asks for libuv unless USE_LIBUV=0, which a
 * torch built without it refuses: pprun sets 0, and keeps a user's value. */
Test(launch_env, use_libuv_is_0_unless_the_user_set_it) {
    const char *args[] = {"launch", "--", "sh", "-c", "echo USE_LIBUV=${USE_LIBUV-unset}", NULL};
    const char *unset[] = {"USE_LIBUV=", NULL}, *user[] = {"USE_LIBUV=1", NULL};
    lt_proc p;
    lt_run(&p, args, unset);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "[0]: USE_LIBUV=0\n");
    lt_free(&p);
    lt_run(&p, args, user);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "[0]: USE_LIBUV=1\n");
    lt_free(&p);
}

/* The launcher takes the hard limit on open files (node 0's store holds two
 * connections per rank); its workers get the limit the user had. */
Test(launch_env, the_launcher_raises_its_open_file_limit_and_the_workers_keep_the_users) {
    struct rlimit lim;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &lim), 0);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max <= 256) cr_skip_test("the hard limit is only %lu", (unsigned long)lim.rlim_max);
    lim.rlim_cur = 256;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
    const char *args[] = {"launch", "--no-prefix", "--", "sh", "-c",
                          "ulimit -n; grep 'Max open files' /proc/$PPID/limits | tr -s ' ' | cut -d' ' -f4", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    char want[64];
    if (lim.rlim_max == RLIM_INFINITY) snprintf(want, sizeof want, "256\nunlimited\n");
    else snprintf(want, sizeof want, "256\n%lu\n", (unsigned long)lim.rlim_max);
    cr_assert_str_eq(p.out, want);
    lt_free(&p);
}

Test(launch_env, issue_example_prints_four_prefixed_lines) {
    const char *args[] = {"launch", "--nproc-per-node", "4", "--", "sh", "-c", "echo $RANK", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0);
    for (int r = 0; r < 4; r++) {
        char want[32];
        snprintf(want, sizeof want, "[%d]: %d\n", r, r);
        cr_assert_eq(lt_count(p.out, want), 1, "want '%s' once in:\n%s", want, p.out);
    }
    cr_assert_eq(lt_count(p.out, "\n"), 4);
    lt_free(&p);
}

/* 16 ranks write 10,000 lines each at once; awk writes in 4 KiB blocks, so
 * the launcher sees lines cut anywhere and must put them back together. */
Test(launch_output, sixteen_ranks_ten_thousand_lines_each_stay_whole) {
    const char *args[] = {"launch", "--nproc-per-node", "16", "--", "awk",
                          "BEGIN { r = ENVIRON[\"RANK\"]; for (i = 0; i < 10000; i++) "
                          "printf \"rank %d line %d of the stream abcdefghijklmnopqrstuvwxyz\\n\", r, i }",
                          NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "stderr: %s", p.err);
    int next[16] = {0};
    size_t lines = 0;
    for (char *save = NULL, *line = strtok_r(p.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int pr, r, i, n = 0;
        cr_assert_eq(sscanf(line, "[%d]: rank %d line %d of the stream abcdefghijklmnopqrstuvwxyz%n", &pr, &r, &i, &n), 3,
                     "mangled line: '%s'", line);
        cr_assert_eq((size_t)n, strlen(line), "trailing garbage: '%s'", line);
        cr_assert_eq(pr, r, "line of rank %d prefixed [%d]", r, pr);
        cr_assert(r >= 0 && r < 16);
        cr_assert_eq(i, next[r], "rank %d: line %d after %d", r, i, next[r] - 1);
        next[r]++;
        lines++;
    }
    cr_assert_eq(lines, 160000);
    lt_free(&p);
}

Test(launch_output, partial_last_line_is_flushed_and_stderr_is_prefixed_too) {
    const char *args[] = {"launch", "--", "sh", "-c", "printf 'to err\\nno newline' >&2; printf 'out partial'", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0);
    cr_assert_str_eq(p.out, "[0]: out partial\n");
    cr_assert_str_eq(p.err, "[0]: to err\n[0]: no newline\n");
    lt_free(&p);
}

Test(launch_output, no_prefix) {
    const char *args[] = {"launch", "--no-prefix", "--nproc-per-node", "2", "--", "sh", "-c", "echo plain", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0);
    cr_assert_str_eq(p.out, "plain\nplain\n");
    lt_free(&p);
}

Test(launch_output, log_dir_redirects_and_filter) {
    const char *dir = tfix_mkdir("logs-filter"); /* removed when the test process exits */
    /* stdout of every rank only into files; stderr on the console, but
     * only local rank 1's. */
    const char *args[] = {"launch", "--nproc-per-node", "2", "--log-dir", dir, "--redirects", "1",
                          "--local_ranks_filter=1", "--run-id", "logs1", "--",
                          "sh", "-c", "echo out-$RANK; echo err-$RANK >&2", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "");
    cr_assert_str_eq(p.err, "[1]: err-1\n");
    for (int r = 0; r < 2; r++) {
        char path[256], want[32];
        size_t len;
        snprintf(path, sizeof path, "%s/logs1/attempt_0/%d/stdout.log", dir, r);
        char *text = lt_slurp(path, &len);
        snprintf(want, sizeof want, "out-%d\n", r);
        cr_assert_str_eq(text, want, "%s", path);
        free(text);
        snprintf(path, sizeof path, "%s/logs1/attempt_0/%d/stderr.log", dir, r);
        text = lt_slurp(path, &len);
        snprintf(want, sizeof want, "err-%d\n", r);
        cr_assert_str_eq(text, want, "%s", path);
        free(text);
    }
    lt_free(&p);
}

Test(launch_output, per_rank_redirects) {
    const char *dir = tfix_mkdir("logs-per-rank"); /* removed when the test process exits */
    /* torchrun's per-rank form: rank 0 keeps stdout off the console, rank 1
     * its stderr; --tee is accepted with the same forms. */
    const char *args[] = {"launch", "--nproc-per-node", "2", "--log-dir", dir, "--redirects", "0:1,1:2", "--tee", "3",
                          "--", "sh", "-c", "echo out-$RANK; echo err-$RANK >&2", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_str_eq(p.out, "[1]: out-1\n");
    cr_assert_str_eq(p.err, "[0]: err-0\n");
    lt_free(&p);
}

Test(launch_output, help_lists_every_option) {
    const char *args[] = {"launch", "--help", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0);
    const char *names[] = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--max-restarts", "--monitor-interval", "--shutdown-timeout", "--log-dir", "--redirects",
                           "--tee", "--local-ranks-filter", "--run-id", "--no-prefix", "--rdzv-timeout"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) cr_assert(strstr(p.out, names[i]), "%s", names[i]);
    /* the short spellings torchrun users type, beside the long ones */
    const char *both[] = {"-m, --module", "-r, --redirects", "-t, --tee", "-h, --help"};
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) cr_assert(strstr(p.out, both[i]), "%s", both[i]);
    lt_free(&p);
}
