/* test_launch_api.c: launch_job called in-process with hooks, as `pprun run`
 * will: per-rank environment from the parent, attempt callbacks, results,
 * the job's store reachable from the hooks, inherited fds; a helper started
 * and its descendants found as `pprun run` does with its MPS daemon. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_testutil.h"
#include "runner/launch/launch.h"
#include "runner/store/store.h"

typedef struct {
    int before, started, after;
    int statuses[8];
    int fd;              /* inheritable fd given to the workers */
    char store[300];
    int store_ok;
    pid_t node0; /* a node 0 launcher to kill once the workers started */
} hook_log;

static int before(void *ctx, const launch_info *info, pp_err *err) {
    hook_log *h = ctx;
    cr_assert_eq(info->attempt, h->before);
    h->before++;
    /* The store is up before any worker starts. */
    store_client *c;
    char host[256];
    int port;
    if (store_parse_addr(info->store_addr, host, sizeof host, &port, err) != 0 ||
        store_connect(host, port, 2000000000ull, &c, err) != 0)
        return -1;
    int64_t v;
    h->store_ok = store_add(c, "test/attempts", 1, &v, err) == 0 && v == info->attempt + 1;
    store_close(c);
    snprintf(h->store, sizeof h->store, "%s", info->store_addr);
    return 0;
}

static int rank_env(void *ctx, const launch_info *info, int lr, int gr, launch_env *env, pp_err *err) {
    hook_log *h = ctx;
    char v[64];
    snprintf(v, sizeof v, "%d-%d-%d", lr, gr, info->attempt);
    if (launch_env_set(env, "PPRUN_TEST_EXTRA", v, err) != 0) return -1;
    snprintf(v, sizeof v, "%d", h->fd);
    return launch_env_set(env, "PPRUN_TEST_FD", v, err);
}

static void started(void *ctx, const launch_info *info, const pid_t *pids) {
    hook_log *h = ctx;
    for (int i = 0; i < info->nproc_per_node; i++) cr_assert(pids[i] > 0);
    h->started++;
}

static void after(void *ctx, const launch_info *info, const launch_result *res) {
    hook_log *h = ctx;
    h->statuses[info->attempt] = res->status;
    h->after++;
}

Test(launch_api, hooks_see_every_attempt_and_shape_the_environment) {
    static launch_options o;
    pp_err err;
    char out[] = "/tmp/pprun-api-XXXXXX";
    int ofd = mkstemp(out);
    cr_assert(ofd >= 0);
    /* Rank 1 fails on attempt 0; attempt 1 succeeds. Each rank writes its
     * extra variable through the inherited fd. */
    char *argv[] = {"launch", "--nproc-per-node", "2", "--max-restarts", "3", "--no-prefix", "--", "sh", "-c",
                    "echo \"$PPRUN_TEST_EXTRA\" >&$PPRUN_TEST_FD; "
                    "if [ $RANK = 1 ] && [ $PPRUN_RESTART_COUNT = 0 ]; then exit 6; fi",
                    NULL};
    cr_assert_eq(launch_parse(10, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    hook_log h = {.fd = ofd};
    launch_hooks hooks = {
        .ctx = &h, .before_attempt = before, .rank_env = rank_env, .started = started, .after_attempt = after};
    launch_result res;
    cr_assert_eq(launch_job(&o, &hooks, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, LAUNCH_OK);
    cr_assert_eq(res.exit_code, 0);
    cr_assert_eq(res.attempts, 2);
    cr_assert_eq(res.world_size, 2);
    cr_assert_eq(h.before, 2);
    cr_assert_eq(h.started, 2);
    cr_assert_eq(h.after, 2);
    cr_assert_eq(h.statuses[0], LAUNCH_FAILED);
    cr_assert_eq(h.statuses[1], LAUNCH_OK);
    cr_assert(h.store_ok, "the hooks reach the job's store");
    cr_assert(strncmp(h.store, "127.0.0.1:", 10) == 0, "%s", h.store);
    close(ofd);
    FILE *f = fopen(out, "r");
    char text[256] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(out);
    /* Rank 0 of attempt 0 may be stopped before it writes: rank 1 fails
     * at once. Every other line must be there. */
    const char *wants[] = {"1-1-0\n", "0-0-1\n", "1-1-1\n"};
    for (int i = 0; i < 3; i++) cr_assert(strstr(text, wants[i]), "want %s in:\n%s", wants[i], text);
}

Test(launch_api, failure_result_names_the_root_cause) {
    static launch_options o;
    pp_err err;
    char *argv[] = {"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                    "if [ $RANK = 2 ]; then echo last words >&2; kill -SEGV $$; fi; exec sleep 30", NULL};
    cr_assert_eq(launch_parse(6, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    launch_result res;
    cr_assert_eq(launch_job(&o, NULL, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, LAUNCH_FAILED);
    cr_assert_eq(res.exit_code, 1);
    cr_assert_eq(res.failure.global_rank, 2);
    cr_assert_eq(res.failure.local_rank, 2);
    cr_assert_eq(res.failure.signal, 11);
    cr_assert_eq(res.failure.exit_code, -1);
    cr_assert(res.failure.pid > 0);
    cr_assert_str_eq(res.failure.stderr_tail, "last words\n");
    char buf[16];
    cr_assert_str_eq(launch_signal_name(res.failure.signal, buf), "SIGSEGV");
    /* launch_job put the signal handlers back. */
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    cr_assert(sa.sa_handler == SIG_DFL);
}

/* The hooks clean up after an attempt (cmd_run unlinks the ranks' shared
 * memory in after_attempt): they must hear of one that could not start
 * its workers... */
Test(launch_api, after_attempt_runs_when_the_workers_cannot_start) {
    static launch_options o;
    pp_err err;
    char *argv[] = {"launch", "--nproc-per-node", "2", "--log-dir", "/proc/pprun-cannot-be-here", "--", "true", NULL};
    cr_assert_eq(launch_parse(7, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    hook_log h = {.fd = 1};
    launch_hooks hooks = {
        .ctx = &h, .before_attempt = before, .rank_env = rank_env, .started = started, .after_attempt = after};
    launch_result res;
    cr_assert_eq(launch_job(&o, &hooks, &res, &err), -1);
    cr_assert(strstr(err.msg, "--log-dir"), "%s", err.msg);
    cr_assert_eq(h.before, 1);
    cr_assert_eq(h.after, 1);
    cr_assert_eq(h.statuses[0], LAUNCH_ERROR);
}

/* ...and of one whose node 0 vanished while its workers ran. */
static void kill_node_0(void *ctx, const launch_info *info, const pid_t *pids) {
    started(ctx, info, pids);
    kill(((hook_log *)ctx)->node0, SIGKILL);
}

Test(launch_api, after_attempt_runs_when_node_0_is_lost) {
    static launch_options o;
    pp_err err;
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--", "sleep", "60", NULL};
    lt_proc n0;
    lt_start(&n0, a0, NULL);
    char *argv[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--", "sleep", "60", NULL};
    cr_assert_eq(launch_parse(10, argv, &o, NULL, NULL, &err), 0, "%s", err.msg);
    hook_log h = {.fd = 1, .node0 = n0.pid};
    launch_hooks hooks = {.ctx = &h, .started = kill_node_0, .after_attempt = after};
    launch_result res;
    cr_assert_eq(launch_job(&o, &hooks, &res, &err), -1);
    lt_wait(&n0);
    cr_assert(strstr(err.msg, "lost the store of node rank 0"), "%s", err.msg);
    cr_assert_eq(h.started, 1);
    cr_assert_eq(h.after, 1);
    cr_assert_eq(h.statuses[0], LAUNCH_ERROR);
    lt_free(&n0);
}

/* A helper starts as a worker does: argv[0] with the environment given
 * (launch_env_new, then changed), fds[0] and fds[1] as its standard input
 * and output, in a process group of its own; one that cannot be executed
 * exits 127. */
Test(launch_api, a_helper_gets_its_environment_fds_and_group) {
    pp_err err;
    launch_env *env;
    setenv("PPRUN_TEST_GONE", "1", 1);
    cr_assert_eq(launch_env_new(&env, &err), 0, "%s", err.msg);
    cr_assert_eq(launch_env_set(env, "PPRUN_TEST_SET", "set", &err), 0, "%s", err.msg);
    launch_env_unset(env, "PPRUN_TEST_GONE");
    int in[2], out[2];
    cr_assert_eq(pipe2(in, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    char *argv[] = {"/bin/sh", "-c", "read line; echo \"$line $PPRUN_TEST_SET ${PPRUN_TEST_GONE:-unset}\"", NULL};
    int fds[3] = {in[0], out[1], -1};
    pid_t pid;
    cr_assert_eq(launch_spawn_helper(argv, env, fds, &pid, &err), 0, "%s", err.msg);
    cr_assert_eq(getpgid(pid), pid, "not a group of its own");
    close(in[0]), close(out[1]);
    cr_assert_eq(write(in[1], "input\n", 6), 6);
    close(in[1]);
    char got[64] = "";
    ssize_t n = read(out[0], got, sizeof got - 1);
    got[n > 0 ? n : 0] = '\0';
    close(out[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    cr_assert_str_eq(got, "input set unset\n");
    char *missing[] = {"/nonexistent/pprun-helper", NULL};
    cr_assert_eq(launch_spawn_helper(missing, env, (int[3]){-1, -1, -1}, &pid, &err), 0, "%s", err.msg);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 127, "status %d", status);
    launch_env_destroy(env);
}

/* launch_signal_tree reaches a helper's children and theirs (pprun run's
 * MPS daemon's servers), not the helper itself. */
Test(launch_api, the_tree_walk_reaches_a_helpers_descendants) {
    pp_err err;
    launch_env *env;
    cr_assert_eq(launch_env_new(&env, &err), 0, "%s", err.msg);
    char *argv[] = {"/bin/sh", "-c", "sh -c 'sleep 100 & wait' & sleep 100 & wait", NULL};
    pid_t pid;
    cr_assert_eq(launch_spawn_helper(argv, env, (int[3]){-1, -1, -1}, &pid, &err), 0, "%s", err.msg);
    launch_env_destroy(env);
    int live = 0;
    for (int tries = 0; tries < 500 && (live = launch_signal_tree(pid, 0)) < 3; tries++) usleep(10000);
    cr_assert_eq(live, 3, "the helper's child, grandchild and its other child");
    cr_assert_eq(launch_signal_tree(pid, SIGKILL), 3);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the helper itself was signalled: status %d", status);
    cr_assert_eq(launch_signal_tree(pid, 0), 0);
}
