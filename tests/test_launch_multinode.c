/* test_launch_multinode.c: two `pprun launch` processes on 127.0.0.1 acting
 * as two nodes (static rendezvous through node 0's store), Slurm, and the
 * job token that a non-loopback master address needs. */
#include "launch_testutil.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>

#include "base/pp.h"
#include "runner/store/store.h"
#include "helpers/trace_fixture.h"

static const char *env_line =
    "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE G=$GROUP_RANK ID=$PPRUN_RUN_ID ST=$PPRUN_STORE MA=$MASTER_ADDR MP=$MASTER_PORT\"";

/* Checks the ranks one node printed: global ranks node-major. */
static void check_node(const char *out, int node, int nproc, int world, const char *run_id) {
    cr_assert_eq(lt_count(out, "\n"), (size_t)nproc, "%s", out);
    for (int l = 0; l < nproc; l++) {
        int r = node * nproc + l;
        char want[256];
        snprintf(want, sizeof want, "[%d]: R=%d L=%d W=%d G=%d ID=%s ", r, r, l, world, node, run_id);
        cr_assert(strstr(out, want), "want '%s' in:\n%s", want, out);
    }
}

/* The same job with or without a job token (on loopback it is optional; with
 * one, the workers get it in their environment, not on a command line). */
static void eight_rank_job(const char *const *env0, const char *const *env1) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    /* Node 1 first: it must wait for node 0's store to come up. */
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                        "--master-port", port, "--nproc-per-node", "4", "--rdzv-timeout", "20",
                        "--run-id", "ignored-on-node-1", "--", "sh", "-c", env_line, NULL};
    const char *a0[] = {"launch", "--nnodes=2", "--node_rank=0", "--master_port", port, "--nproc_per_node", "4",
                        "--run-id", "job8", "--", "sh", "-c", env_line, NULL};
    lt_proc n1, n0;
    lt_start(&n1, a1, env1);
    usleep(100000);
    lt_start(&n0, a0, env0);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 0, "node 0: %s", n0.err);
    cr_assert_eq(n1.status, 0, "node 1: %s", n1.err);
    check_node(n0.out, 0, 4, 8, "job8");
    check_node(n1.out, 1, 4, 8, "job8");
    char store[64];
    snprintf(store, sizeof store, "ST=127.0.0.1:%s ", port);
    cr_assert_eq(lt_count(n0.out, store) + lt_count(n1.out, store), 8, "%s%s", n0.out, n1.out);
    /* Every rank of both nodes sees node 0's MASTER_PORT. */
    const char *mp = strstr(n0.out, "MP=");
    cr_assert_not_null(mp);
    char want[32];
    snprintf(want, sizeof want, "MP=%d\n", atoi(mp + 3));
    cr_assert_eq(lt_count(n0.out, want) + lt_count(n1.out, want), 8, "%s%s", n0.out, n1.out);
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, two_launchers_make_one_eight_rank_job) { eight_rank_job(NULL, NULL); }

Test(launch_multinode, two_launchers_make_one_eight_rank_job_with_a_token) {
    const char *env[] = {"PPRUN_RDZV_TOKEN=2c26b46b68ffc68ff99b453c1d304134", NULL};
    eight_rank_job(env, env);
}

Test(launch_multinode, failure_on_node_1_tears_down_node_0) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--nproc-per-node", "2",
                        "--", "sh", "-c", "exec sleep 120", NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--nproc-per-node", "2",
                        "--", "sh", "-c",
                        "if [ $LOCAL_RANK = 1 ]; then sleep 0.2; echo 'node one gives up' >&2; exit 7; fi; exec sleep 120",
                        NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    lt_wait(&n1);
    lt_wait(&n0);
    cr_assert_eq(n1.status, 1, "node 1: %s", n1.err);
    cr_assert_eq(n0.status, 1, "node 0: %s", n0.err);
    /* Both name the same root cause: global rank 3 on node 1. */
    for (int i = 0; i < 2; i++) {
        const char *err = i ? n1.err : n0.err;
        cr_assert(strstr(err, "rank      : 3 (local_rank: 1)"), "node %d:\n%s", i, err);
        cr_assert(strstr(err, "exitcode  : 7"), "node %d:\n%s", i, err);
        cr_assert(strstr(err, "node rank 1"), "node %d:\n%s", i, err);
        cr_assert(strstr(err, "node one gives up"), "node %d:\n%s", i, err);
    }
    cr_assert(strstr(n0.err, "on another node"), "%s", n0.err);
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, node_that_never_comes_is_named_after_the_timeout) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"launch", "--nnodes", "3", "--node-rank", "0", "--master-port", port, "--rdzv-timeout", "1",
                        "--", "true", NULL};
    const char *a1[] = {"launch", "--nnodes", "3", "--node-rank", "1", "--master-port", port, "--rdzv-timeout", "1",
                        "--", "true", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    usleep(300000); /* node 0's deadline comes first: node 1 hears of it from node 0, whose store then goes */
    lt_start(&n1, a1, NULL);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    /* "node rank 2" (or "node ranks 1, 2" on a slow machine). */
    cr_assert(strstr(n0.err, "2 never joined"), "%s", n0.err);
    cr_assert(strstr(n0.err, "--rdzv-timeout"), "%s", n0.err);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    if (!strstr(n0.err, "node ranks 1, 2")) /* node 1 came in time: it says what node 0 said */
        lt_assert_has(n1.err, "node rank 0: rendezvous timed out after 1s (--rdzv-timeout): node rank 2 never joined");
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, node_0_that_never_comes_is_named_after_the_timeout) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--rdzv-timeout", "0.3",
                        "--", "true", NULL};
    lt_proc n1;
    lt_run(&n1, a1, NULL);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    cr_assert(strstr(n1.err, "node rank 0 never came up"), "%s", n1.err);
    lt_free(&n1);
}

/* Global ranks are node-major, so a node with another --nproc-per-node
 * (or --nnodes) than node 0's would overlap or leave out ranks: it refuses,
 * naming the difference, and node 0 says why at once, not after the
 * rendezvous timeout. */
static void node_1_differs(const char *flag, const char *node1_value, const char *want) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *nnodes1 = strcmp(flag, "--nnodes") == 0 ? node1_value : "2";
    const char *nproc1 = strcmp(flag, "--nproc-per-node") == 0 ? node1_value : "2";
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--nproc-per-node", "2",
                        "--rdzv-timeout", "60", "--", "true", NULL};
    const char *a1[] = {"launch", "--nnodes", nnodes1, "--node-rank", "1", "--master-port", port, "--nproc-per-node",
                        nproc1, "--rdzv-timeout", "60", "--", "true", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    cr_assert(lt_wait_within(&n1, 30), "node 1 never refused");
    cr_assert(lt_wait_within(&n0, 30), "node 0 waited for the node that refused");
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    lt_assert_has(n1.err, want);
    lt_assert_has(n1.err, "start every node with the same --nnodes and --nproc-per-node");
    cr_assert_eq(n1.out_len, 0, "no rank ran on node 1:\n%s", n1.out);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    lt_assert_has(n0.err, "node rank 1 refused to join the job");
    lt_assert_has(n0.err, want);
    cr_assert_eq(n0.out_len, 0, "no rank ran on node 0:\n%s", n0.out);
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, a_node_with_another_nproc_per_node_is_refused_and_named) {
    node_1_differs("--nproc-per-node", "3",
                   "this node has --nnodes 2 --nproc-per-node 3, node rank 0 has --nnodes 2 --nproc-per-node 2");
}

Test(launch_multinode, a_node_with_another_nnodes_is_refused_and_named) {
    node_1_differs("--nnodes", "3",
                   "this node has --nnodes 3 --nproc-per-node 2, node rank 0 has --nnodes 2 --nproc-per-node 2");
}

/* Every node restarts together, so a node with another --max-restarts
 * than node 0's would leave after a failure while node 0 restarts and
 * waits for it until --rdzv-timeout (60 s here), recording a rendezvous
 * timeout instead of the rank that failed: it refuses at once, naming the
 * option, and node 0 says why, before any rank runs. */
Test(launch_multinode, a_node_with_another_max_restarts_is_refused_and_named) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "1",
                        "--rdzv-timeout", "60", "--", "sh", "-c", "exit 1", NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "0",
                        "--rdzv-timeout", "60", "--", "sh", "-c", "exit 1", NULL};
    const char *want = "this node has --max-restarts 0, node rank 0 has --max-restarts 1: start every node with the "
                       "same --max-restarts";
    lt_proc n0, n1;
    uint64_t t0 = pp_now_ns();
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    int ended1 = lt_wait_within(&n1, 30), ended0 = lt_wait_within(&n0, 30);
    if (!ended1) kill(n1.pid, SIGKILL), lt_wait(&n1);
    if (!ended0) kill(n0.pid, SIGKILL), lt_wait(&n0);
    cr_assert(ended1 && ended0, "a node waited: node 0: %s\nnode 1: %s", n0.err, n1.err);
    cr_assert_lt((double)(pp_now_ns() - t0) / 1e9, 30.0);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    lt_assert_has(n1.err, want);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    lt_assert_has(n0.err, "node rank 1 refused to join the job");
    lt_assert_has(n0.err, want);
    cr_assert(!strstr(n0.err, "restarting"), "node 0 restarted: %s", n0.err);
    cr_assert_eq(n0.out_len + n1.out_len, 0, "a rank ran:\n%s%s", n0.out, n1.out);
    lt_free(&n0);
    lt_free(&n1);
}

/* A second launcher with a node rank already taken is refused; the job
 * runs with the first. Its ranks wait for a file, so the second one comes
 * while the attempt runs; node 1's rank ends 2.5 s after node 0's, while
 * node 0 waits for it and looks for a node gone every second: the refused
 * launcher must not take node 1's liveness with it as it leaves (it did:
 * node 0 then ended the job, node 1's rank killed). */
Test(launch_multinode, a_second_launcher_with_a_taken_node_rank_is_refused) {
    char port[16], script[256];
    const char *dir = tfix_mkdir("dup"); /* removed when the test process exits */
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(script, sizeof script,
             "touch %s/ran-$RANK; while [ ! -e %s/go ]; do sleep 0.05; done; if [ $RANK = 1 ]; then sleep 2.5; "
             "fi; echo \"R=$RANK\"", dir, dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--", "sh", "-c",
                        script, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--", "sh", "-c",
                        script, NULL};
    lt_proc n0, n1, dup;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    char ran[300];
    snprintf(ran, sizeof ran, "%s/ran-1", dir);
    cr_assert(lt_wait_file(ran), "node 1's rank never started");
    lt_start(&dup, a1, NULL);
    cr_assert(lt_wait_within(&dup, 30), "the second node rank 1 was not refused");
    cr_assert_eq(dup.status, 1, "%s", dup.err);
    lt_assert_has(dup.err, "node rank 1 has joined already");
    lt_assert_has(dup.err, "give every node its own --node-rank");
    cr_assert_eq(dup.out_len, 0, "%s", dup.out);
    char go[300];
    snprintf(go, sizeof go, "touch %s/go", dir);
    cr_assert_eq(system(go), 0);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 0, "%s", n0.err);
    cr_assert_eq(n1.status, 0, "%s", n1.err);
    lt_assert_has(n1.out, "R=1");
    lt_free(&n0);
    lt_free(&n1);
    lt_free(&dup);
}

/* Under srun, one launcher per node: nnodes, node rank and master address
 * come from SLURM_* when the flags are absent. */
Test(launch_multinode, slurm_environment_gives_nodes_ranks_and_master) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a[] = {"launch", "--master-port", port, "--", "sh", "-c", env_line, NULL};
    const char *e0[] = {"SLURM_NNODES=2", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=localhost,node[07-09]",
                        "SLURM_NTASKS_PER_NODE=2", "SLURM_STEP_NUM_TASKS=", "SLURM_STEP_NUM_NODES=", NULL};
    const char *e1[] = {"SLURM_NNODES=2", "SLURM_NODEID=1", "SLURM_JOB_NODELIST=localhost,node[07-09]",
                        "SLURM_NTASKS_PER_NODE=2", "SLURM_STEP_NUM_TASKS=", "SLURM_STEP_NUM_NODES=", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a, e0);
    lt_start(&n1, a, e1);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 0, "%s", n0.err);
    cr_assert_eq(n1.status, 0, "%s", n1.err);
    cr_assert_eq(lt_count(n0.out, "MA=localhost MP="), 2, "%s", n0.out);
    cr_assert(strstr(n1.out, "[3]: R=3 L=1 W=4 G=1 "), "%s", n1.out);
    lt_free(&n0);
    lt_free(&n1);
}

/* A failure on one node restarts the whole job on every node. */
Test(launch_multinode, restarts_happen_on_every_node_together) {
    char port[16], s0[256], s1[512];
    const char *dir = tfix_mkdir("restarts"); /* removed when the test process exits */
    snprintf(port, sizeof port, "%d", lt_free_port());
    /* Node 1 fails attempt 0 once node 0's rank has spoken (no race). */
    snprintf(s0, sizeof s0, "echo a=$PPRUN_RESTART_COUNT; touch %s/n0-$PPRUN_RESTART_COUNT; sleep 0.2", dir);
    snprintf(s1, sizeof s1,
             "echo a=$PPRUN_RESTART_COUNT; if [ $PPRUN_RESTART_COUNT = 0 ]; then "
             "while [ ! -e %s/n0-0 ]; do sleep 0.01; done; exit 1; fi",
             dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "2",
                        "--", "sh", "-c", s0, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "2",
                        "--", "sh", "-c", s1, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 0, "%s", n0.err);
    cr_assert_eq(n1.status, 0, "%s", n1.err);
    cr_assert_str_eq(n0.out, "[0]: a=0\n[0]: a=1\n");
    cr_assert_str_eq(n1.out, "[1]: a=0\n[1]: a=1\n");
    lt_free(&n0);
    lt_free(&n1);
}

/* Ctrl-C on node 1 while it tears down a failed rank: node 1's failure is
 * the outcome, and node 0 does not restart either (it would wait for node 1
 * at the next rendezvous until --rdzv-timeout). */
Test(launch_multinode, ctrl_c_during_a_failures_teardown_stops_restarts_on_every_node) {
    char port[16], s1[512], path[300];
    const char *dir = tfix_mkdir("ctrl-c-teardown"); /* removed when the test process exits */
    snprintf(port, sizeof port, "%d", lt_free_port());
    /* Local rank 0 of node 1 outlives SIGTERM (noting it in `tearing`), so the
     * teardown of local rank 1's failure lasts --shutdown-timeout. */
    snprintf(s1, sizeof s1,
             "if [ $LOCAL_RANK = 1 ]; then while [ ! -e %s/r0 ]; do sleep 0.01; done; touch %s/failed; exit 3; fi; "
             "trap 'touch %s/tearing' TERM; touch %s/r0; while :; do sleep 0.05; done",
             dir, dir, dir, dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", port,
                        "--max-restarts", "2", "--", "sleep", "30", NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port,
                        "--max-restarts", "2", "--shutdown-timeout", "3", "--", "sh", "-c", s1, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    snprintf(path, sizeof path, "%s/tearing", dir);
    cr_assert(lt_wait_file(path), "node 1 never tore rank 2 down after rank 3 failed");
    kill(n1.pid, SIGINT);
    int ended0 = lt_wait_within(&n0, 30);
    if (!ended0) kill(n0.pid, SIGINT);
    lt_wait(&n1);
    if (!ended0) lt_wait(&n0);
    cr_assert(ended0, "node 0 went on after node 1 was stopped: %s", n0.err);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    cr_assert(!strstr(n0.err, "restarting") && !strstr(n1.err, "restarting"), "%s\n%s", n0.err, n1.err);
    cr_assert(strstr(n0.err, "rank      : 3 (local_rank: 1)"), "node 0 names the root cause: %s", n0.err);
    lt_free(&n0);
    lt_free(&n1);
}

/* The same when node 1 is not the first to fail: node 0's rank failed, node
 * 0 decided to restart, then node 1 was stopped while tearing down. Node 1
 * calls the next attempt off, so node 0 does not wait for it at the next
 * rendezvous until --rdzv-timeout. */
Test(launch_multinode, a_node_stopped_after_another_nodes_failure_calls_the_restart_off) {
    char port[16], s0[512], s1[512], path[300];
    const char *dir = tfix_mkdir("stopped-after-failure"); /* removed when the test process exits */
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(s0, sizeof s0,
             "if [ $PPRUN_RESTART_COUNT = 0 ]; then while [ ! -e %s/r1 ]; do sleep 0.01; done; touch %s/failed; "
             "exit 3; fi; exec sleep 30",
             dir, dir);
    snprintf(s1, sizeof s1, "trap 'touch %s/tearing' TERM; touch %s/r1; while :; do sleep 0.05; done", dir, dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "2",
                        "--", "sh", "-c", s0, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "2",
                        "--shutdown-timeout", "3", "--", "sh", "-c", s1, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    snprintf(path, sizeof path, "%s/tearing", dir);
    cr_assert(lt_wait_file(path), "node 1 never tore its rank down after rank 0 failed"); /* it outlives SIGTERM */
    kill(n1.pid, SIGINT);
    int ended0 = lt_wait_within(&n0, 30);
    if (!ended0) kill(n0.pid, SIGINT);
    lt_wait(&n1);
    if (!ended0) lt_wait(&n0);
    cr_assert(ended0, "node 0 waited for node 1 at the next rendezvous: %s", n0.err);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    cr_assert(strstr(n0.err, "not restarting: node rank 1 was stopped by SIGINT"), "%s", n0.err);
    cr_assert(strstr(n0.err, "exitcode  : 3"), "the failure that ended attempt 0 is the outcome: %s", n0.err);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    lt_free(&n0);
    lt_free(&n1);
}

/* A node 0 that accepts connections but never answers (frozen), with a job
 * token: Ctrl-C on node 1 acts while it waits for the token's answer. */
Test(launch_multinode, ctrl_c_acts_while_a_frozen_node_0_holds_the_tokens_answer) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    cr_assert(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&a, &l), 0);
    char port[16];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--rdzv-token",
                        "a-job-token-0123456789", "--", "true", NULL};
    lt_proc n1;
    lt_start(&n1, a1, NULL);
    /* Connected and AUTH sent (its first bytes are here); no answer comes. */
    struct pollfd pl = {.fd = lfd, .events = POLLIN};
    int conn = poll(&pl, 1, 30000) == 1 ? accept(lfd, NULL, NULL) : -1;
    struct pollfd pc = {.fd = conn, .events = POLLIN};
    char auth[64];
    int sent = conn >= 0 && poll(&pc, 1, 30000) == 1 && recv(conn, auth, sizeof auth, MSG_PEEK) > 0;
    if (sent) kill(n1.pid, SIGINT);
    int ended = sent && lt_wait_within(&n1, 8); /* the answer's own deadline is 10 s */
    if (!ended) {
        kill(n1.pid, SIGKILL);
        lt_wait(&n1);
    }
    if (conn >= 0) close(conn);
    close(lfd);
    cr_assert(sent, "node 1 never connected and sent its token within 30 s: %s", n1.err);
    cr_assert(ended, "Ctrl-C waited for the token's answer: %s", n1.err);
    cr_assert_eq(n1.status, 128 + SIGINT, "%s", n1.err);
    cr_assert(strstr(n1.err, "no rank had started"), "%s", n1.err);
    lt_free(&n1);
}

/* Two launchers on loopback, one rank each, both ranks started (sleeping);
 * port gets node 0's port. dir: a folder of the test's. */
static void two_sleeping_nodes(const char *dir, char port[16], lt_proc *n0, lt_proc *n1) {
    char script[256], ready[300];
    snprintf(port, 16, "%d", lt_free_port());
    snprintf(script, sizeof script, "touch %s/ready-$RANK; exec sleep 120", dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--", "sh", "-c", script, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--", "sh", "-c", script, NULL};
    lt_start(n0, a0, NULL);
    lt_start(n1, a1, NULL);
    for (int r = 0; r < 2; r++) {
        snprintf(ready, sizeof ready, "%s/ready-%d", dir, r);
        cr_assert(lt_wait_file(ready), "rank %d never started", r);
    }
}

/* Node 0 dies without a word (SIGKILL): the others lose its store, stop
 * their ranks and fail. */
Test(launch_multinode, losing_node_0_tears_down_the_others) {
    char port[16];
    lt_proc n0, n1;
    two_sleeping_nodes(tfix_mkdir("lost-node-0"), port, &n0, &n1); /* the folder goes when the test process exits */
    kill(n0.pid, SIGKILL);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    cr_assert(strstr(n1.err, "lost the store of node rank 0"), "%s", n1.err);
    lt_free(&n0);
    lt_free(&n1);
}

/* 1 once `key` of the store on 127.0.0.1:port begins with `want`; 0 after 30 s. */
static int store_key_becomes(const char *port, const char *key, const char *want) {
    store_client *c;
    pp_err err;
    if (store_connect("127.0.0.1", atoi(port), 30000000000ull, &c, &err) != 0) return 0;
    int found = 0;
    for (int i = 0; i < 3000 && !found; i++) {
        void *v;
        size_t len;
        int g = store_get(c, key, &v, &len, &err);
        if (g < 0) break;
        if (g == 0) {
            found = strncmp(v, want, strlen(want)) == 0;
            free(v);
        }
        if (!found) usleep(10000);
    }
    store_close(c);
    return found;
}

/* `pprun launch` as node `node` of `nnodes` whose ranks echo "started",
 * node 0's store at `port`, waiting `timeout` s at the rendezvous. */
static void echo_node(const char *a[13], const char *nnodes, const char *node, const char *port, const char *timeout) {
    const char *args[] = {"launch", "--nnodes", nnodes, "--node-rank", node,    "--master-port", port,
                          "--rdzv-timeout", timeout, "--", "echo",  "started", NULL};
    memcpy(a, args, sizeof args);
}

/* A node that arrives while node 0 tells the others of its rendezvous
 * timeout must hear of it too, not complete the count and start its ranks
 * alone. Node 1 is frozen once it has joined, so node 0 waits for it to read
 * the timeout (5 s at most); node 2 comes in that time. */
Test(launch_multinode, a_node_arriving_after_node_0_gave_up_hears_why_and_starts_nothing) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[13], *a1[13], *a2[13];
    echo_node(a0, "3", "0", port, "3");
    echo_node(a1, "3", "1", port, "60");
    echo_node(a2, "3", "2", port, "60");
    lt_proc n0, n1, n2;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    int joined = store_key_becomes(port, "pprun/a/0/count", "2");
    kill(n1.pid, SIGSTOP);
    int st;
    cr_assert_eq(waitpid(n1.pid, &st, WUNTRACED), n1.pid);
    int gave_up = joined && store_key_becomes(port, "pprun/a/0/go", "timeout 2 ");
    if (gave_up) lt_start(&n2, a2, NULL);
    if (gave_up) lt_wait(&n2);
    kill(n1.pid, SIGCONT);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert(joined, "node 1 never joined: %s", n1.err);
    cr_assert(gave_up, "node 0 never wrote its timeout for the others: %s", n0.err);
    cr_assert_str_eq(n2.out, "", "node 2 started its ranks alone: %s", n2.err);
    cr_assert_eq(n2.status, 1, "%s", n2.err);
    lt_assert_has(n2.err, "node rank 0: rendezvous timed out after 3s (--rdzv-timeout): node rank 2 never joined");
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    cr_assert_str_eq(n0.out, "");
    lt_free(&n0);
    lt_free(&n1);
    lt_free(&n2);
}

/* A node stopped while it waits at the first rendezvous (it joined; the
 * others have not all come) calls the attempt off for every node: the
 * other stops at once, naming it and its host, instead of waiting for it
 * until --rdzv-timeout (60 s here), or starting without it once a third
 * node completed the count (then failing when its ranks never came). Node
 * 0, stopped, keeps its store up until the others have read why. */
static void stopped_at_the_first_rendezvous(int stopped) {
    char port[16], want[96];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[13], *a1[13];
    echo_node(a0, "3", "0", port, "60");
    echo_node(a1, "3", "1", port, "60");
    lt_proc n[2];
    lt_start(&n[0], a0, NULL);
    lt_start(&n[1], a1, NULL);
    int joined = store_key_becomes(port, "pprun/a/0/count", "2");
    kill(n[stopped].pid, SIGTERM);
    lt_proc *other = &n[!stopped];
    int ended = lt_wait_within(other, 30);
    lt_wait(&n[stopped]);
    if (!ended) {
        kill(other->pid, SIGKILL);
        lt_wait(other);
    }
    cr_assert(joined, "node 1 never joined: %s", n[1].err);
    cr_assert(ended, "node %d waited for the stopped node: %s", !stopped, other->err);
    cr_assert_eq(n[stopped].status, 128 + SIGTERM, "%s", n[stopped].err);
    cr_assert_eq(other->status, 128 + SIGTERM, "stopped, as the job is when a node is stopped later: %s", other->err);
    snprintf(want, sizeof want, "node rank %d was stopped by SIGTERM: attempt 0 is not started", stopped);
    lt_assert_has(other->err, want);
    snprintf(want, sizeof want, "the launcher of node rank %d (on ", stopped);
    lt_assert_has(other->err, want);
    cr_assert_null(strstr(other->err, "(on )"), "its host was not read: %s", other->err);
    cr_assert_str_eq(other->out, "", "node %d started ranks: %s", !stopped, other->err);
    lt_free(&n[0]);
    lt_free(&n[1]);
}

Test(launch_multinode, a_node_stopped_at_the_first_rendezvous_calls_the_job_off) { stopped_at_the_first_rendezvous(1); }

Test(launch_multinode, node_0_stopped_at_the_first_rendezvous_calls_the_job_off) { stopped_at_the_first_rendezvous(0); }

/* Node 1 takes node 0's run id, MASTER_PORT and shape from the store, where
 * whoever reaches it could have written them. One it refuses ends node 1,
 * and node 0 says why at once, naming node 1, instead of waiting for it
 * until its --rdzv-timeout (120 s here). The test overwrites `key` with
 * `forged` (NULL: deletes it) once a real node 0 has published it, then
 * starts node 1. want: the reason both nodes must give. */
static void node_0_value_is_refused(const char *key, const char *forged, const char *want) {
    static int calls;
    char port[16], logs[300], dir[32];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(dir, sizeof dir, "refused-value-%d", calls++);
    snprintf(logs, sizeof logs, "%s/logs", tfix_mkdir(dir)); /* removed when the test process exits */
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--rdzv-timeout", "120",
                        "--", "echo", "started", NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--rdzv-timeout", "120",
                        "--log-dir", logs, "--", "echo", "started", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    /* The run id is the last of the values node 0 publishes. */
    if (!store_key_becomes(port, "pprun/run_id", "")) {
        kill(n0.pid, SIGINT);
        lt_wait(&n0);
        cr_assert_fail("node 0 never published its run id within 30 s: %s", n0.err);
    }
    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", atoi(port), 5000000000ull, &c, &err), 0, "%s", err.msg);
    int rc = forged ? store_set(c, key, forged, strlen(forged), &err) : store_delete(c, key, &err);
    store_close(c);
    cr_assert_eq(rc, 0, "%s", err.msg);
    uint64_t t0 = pp_now_ns();
    lt_start(&n1, a1, NULL);
    int ended1 = lt_wait_within(&n1, 30), ended0 = lt_wait_within(&n0, 30);
    double took = (double)(pp_now_ns() - t0) / 1e9;
    if (!ended1) kill(n1.pid, SIGKILL);
    if (!ended0) kill(n0.pid, SIGKILL);
    if (!ended1) lt_wait(&n1);
    if (!ended0) lt_wait(&n0);
    cr_assert(ended1, "node 1 took %s = '%s' and went on: %s", key, forged ? forged : "(none)", n1.err);
    cr_assert(ended0, "node 0 waited for the node that refused its %s: %s", key, n0.err);
    cr_assert_lt(took, 30.0, "node 0 took %.1f s to fail", took);
    cr_assert_eq(n1.status, 1, "node 1: %s", n1.err);
    lt_assert_has(n1.err, want);
    cr_assert_eq(n0.status, 1, "node 0: %s", n0.err);
    lt_assert_has(n0.err, "node rank 1 refused to join the job");
    lt_assert_has(n0.err, want);
    cr_assert_str_eq(n0.out, "", "a rank ran on node 0");
    cr_assert_str_eq(n1.out, "", "a rank ran on node 1");
    struct stat st;
    cr_assert_neq(stat(logs, &st), 0, "node 1 made its --log-dir");
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, a_run_id_that_leaves_the_log_dir_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/run_id", "../../evil",
                            "the run id node rank 0 published (pprun/run_id): run id '../../evil' has a byte outside");
}

Test(launch_multinode, a_run_id_of_dot_dot_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/run_id", "..", "(pprun/run_id): run id '..' would name a folder outside --log-dir");
}

Test(launch_multinode, a_master_port_that_is_no_port_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/master_port", "70000",
                            "the MASTER_PORT node rank 0 published (pprun/master_port): 70000 is out of range");
    node_0_value_is_refused("pprun/master_port", "29500x",
                            "(pprun/master_port): expected an integer in [1, 65535], got '29500x'");
}

Test(launch_multinode, a_missing_master_port_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/master_port", NULL, "node rank 0 published no MASTER_PORT (pprun/master_port)");
}

Test(launch_multinode, a_missing_shape_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/shape", NULL,
                            "node rank 0 published no --nnodes and --nproc-per-node (pprun/shape)");
}

Test(launch_multinode, a_missing_or_forged_max_restarts_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/max_restarts", NULL,
                            "node rank 0 published no --max-restarts (pprun/max_restarts)");
    node_0_value_is_refused("pprun/max_restarts", "-1",
                            "the --max-restarts node rank 0 published (pprun/max_restarts): -1 is out of range");
}

Test(launch_multinode, a_missing_plan_digest_is_refused_by_node_1_and_node_0_names_it) {
    node_0_value_is_refused("pprun/plan", NULL, "node rank 0 published no plan digest (pprun/plan)");
}

/* Text from the store that is no digest is not shown (it could drive a
 * terminal); a digest where this node has none differs too. */
Test(launch_multinode, a_forged_plan_digest_is_refused_by_node_1_and_not_shown) {
    node_0_value_is_refused("pprun/plan", "\033]0;x\007", "the job's plan (pprun/plan) differs between the nodes: "
                            "digest (none) on node rank 1, (not a digest) on node rank 0");
}

Test(launch_multinode, a_plan_digest_where_node_1_has_none_is_refused) {
    node_0_value_is_refused("pprun/plan", "00802568482cdf8f", "the job's plan (pprun/plan) differs between the nodes: "
                            "digest (none) on node rank 1, 00802568482cdf8f on node rank 0");
}

/* Node 0's launcher stops answering without closing its store (stopped,
 * frozen, cut off): Ctrl-C on node 1 still ends node 1, within the time
 * node 0 gets to answer once stopped (5 s), saying the others were not
 * told. node1_done: node 1's ranks have finished and it waits for node 0's;
 * else they run. */
static void ctrl_c_with_node_0_frozen(int node1_done) {
    char port[16], run[300], done[300], pidfile[300];
    const char *dir = tfix_mkdir("frozen-node-0"); /* removed when the test process exits */
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(run, sizeof run, "echo $$ > %s/pid-$RANK; touch %s/ready-$RANK; exec sleep 120", dir, dir);
    snprintf(done, sizeof done, "touch %s/ready-$RANK", dir);
    /* Node 0 waits --shutdown-timeout for node 1 to say goodbye at the end. */
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--shutdown-timeout", "1",
                        "--", "sh", "-c", run, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--", "sh", "-c",
                        node1_done ? done : run, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    for (int r = 0; r < 2; r++) {
        snprintf(pidfile, sizeof pidfile, "%s/ready-%d", dir, r);
        cr_assert(lt_wait_file(pidfile), "rank %d never started", r);
    }
    /* Node 1 has reported its ranks done (the store counts it) and waits. */
    if (node1_done && !store_key_becomes(port, "pprun/a/0/done", "1")) {
        kill(n1.pid, SIGINT);
        kill(n0.pid, SIGINT);
        lt_wait(&n1);
        lt_wait(&n0);
        cr_assert_fail("node 1 never reported its ranks done within 30 s: %s", n1.err);
    }
    /* Frozen before the Ctrl-C: a stop signal reaches the store's thread
     * only once the thread that took it has run, which a loaded machine
     * can delay past node 1's report; the parent hears of the stop when
     * every thread has stopped. */
    kill(n0.pid, SIGSTOP);
    int st;
    cr_assert_eq(waitpid(n0.pid, &st, WUNTRACED), n0.pid);
    cr_assert(WIFSTOPPED(st), "node 0's launcher did not stop (status %d)", st);
    kill(n1.pid, SIGINT);
    int ended = lt_wait_within(&n1, 30);
    if (!ended) kill(n1.pid, SIGKILL);
    if (!ended) lt_wait(&n1);
    /* Node 0 comes back to node 1's half-told failure; Ctrl-C ends it too. */
    kill(n0.pid, SIGCONT);
    kill(n0.pid, SIGINT);
    int ended0 = lt_wait_within(&n0, 30);
    if (!ended0) {
        kill(n0.pid, SIGKILL);
        lt_wait(&n0);
        snprintf(pidfile, sizeof pidfile, "%s/pid-0", dir);
        size_t len;
        char *pid = lt_slurp(pidfile, &len);
        if (atoi(pid) > 0) kill(atoi(pid), SIGKILL);
        free(pid);
    }
    cr_assert(ended, "node 1's launcher ignored Ctrl-C while node 0 was frozen: %s", n1.err);
    cr_assert_eq(n1.status, 128 + SIGINT, "%s", n1.err);
    cr_assert(ended0, "node 0's launcher ignored Ctrl-C after it came back: %s", n0.err);
    cr_assert_eq(n0.status, 128 + SIGINT, "%s", n0.err);
    cr_assert(strstr(n1.err, "could not tell the other nodes") && strstr(n1.err, "no answer within 5"), "%s",
              n1.err);
    if (!node1_done) {
        snprintf(pidfile, sizeof pidfile, "%s/pid-1", dir);
        size_t len;
        char *pid = lt_slurp(pidfile, &len);
        cr_assert(atoi(pid) > 0 && !lt_pid_alive(atoi(pid)), "rank 1 (pid %s) outlived its launcher", pid);
        free(pid);
    }
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, ctrl_c_ends_a_node_whose_ranks_run_while_node_0_is_frozen) { ctrl_c_with_node_0_frozen(0); }

Test(launch_multinode, ctrl_c_ends_a_node_waiting_for_a_frozen_node_0) { ctrl_c_with_node_0_frozen(1); }

/* A launcher that cannot start its ranks (here: its log directory cannot be
 * made) ends the job on every node, saying why. */
Test(launch_multinode, launcher_error_on_node_1_stops_node_0) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--", "sleep", "120", NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--log-dir",
                        "/proc/pprun-cannot-be-here", "--", "sleep", "120", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    lt_wait(&n1);
    lt_wait(&n0);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    cr_assert(strstr(n1.err, "--log-dir"), "%s", n1.err);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    cr_assert(strstr(n0.err, "its launcher failed") && strstr(n0.err, "--log-dir"), "%s", n0.err);
    lt_free(&n0);
    lt_free(&n1);
}

/* --- the job token on a non-loopback address ---------------------------------- */

/* An IPv4 address of this machine that is not loopback, or 0 (then the
 * tests below skip: they need the store on an address other machines could
 * reach). */
static int local_address(char *out, size_t cap) {
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs) != 0) return 0;
    int found = 0;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
            continue;
        found = inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)cap) != NULL;
    }
    freeifaddrs(ifs);
    return found;
}

Test(launch_multinode, a_non_loopback_master_address_without_a_token_exits_2_before_starting) {
    char addr[64], port[16];
    if (!local_address(addr, sizeof addr)) cr_skip_test("this machine has no non-loopback IPv4 address");
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *env[] = {"PPRUN_RDZV_TOKEN=", NULL};
    for (int node = 0; node < 2; node++) {
        const char *a[] = {"launch", "--nnodes", "2", "--node-rank", node ? "1" : "0", "--master-addr", addr,
                           "--master-port", port, "--", "echo", "started", NULL};
        lt_proc p;
        lt_run(&p, a, env);
        cr_assert_eq(p.status, 2, "node %d: exit %d: %s", node, p.status, p.err);
        cr_assert(strstr(p.err, "is not a loopback address") && strstr(p.err, "--rdzv-token-file") &&
                      strstr(p.err, "PPRUN_RDZV_TOKEN") && strstr(p.err, addr),
                  "%s", p.err);
        cr_assert_str_eq(p.out, "", "node %d started something", node);
        lt_free(&p);
    }
    /* a token too short to guard them: 15 bytes, refused naming its length */
    const char *short_token[] = {"PPRUN_RDZV_TOKEN=0123456789abcde", NULL};
    const char *a[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-addr", addr, "--master-port", port,
                       "--", "echo", "started", NULL};
    lt_proc p;
    lt_run(&p, a, short_token);
    cr_assert_eq(p.status, 2, "exit %d: %s", p.status, p.err);
    lt_assert_has(p.err, "the job token is 15 bytes: with --nnodes 2 and --master-addr ");
    lt_assert_has(p.err, "give at least 16 (e.g. `openssl rand -hex 32`)");
    cr_assert_null(strstr(p.err, "0123456789abcde"), "the token was shown: %s", p.err);
    cr_assert_str_eq(p.out, "");
    lt_free(&p);
}

/* Two nodes on this machine's non-loopback address: with the token (one
 * node from the environment, the other from a file) they meet; a node with
 * a different token is refused by the store, saying so, and fails. */
Test(launch_multinode, nodes_with_the_token_meet_on_a_non_loopback_address_and_others_are_refused) {
    char addr[64], port[16];
    if (!local_address(addr, sizeof addr)) cr_skip_test("this machine has no non-loopback IPv4 address");
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *file = tfix_path("token"); /* removed when the test process exits */
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert(fd >= 0, "%s", file);
    cr_assert_eq(write(fd, "4e07408562bedb8b60ce05c1decfe3ad\n", 33), 33);
    close(fd);
    const char *line = "echo \"R=$RANK ST=$PPRUN_STORE T=$PPRUN_RDZV_TOKEN\"";
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-addr", addr, "--master-port", port,
                        "--nproc-per-node", "2", "--rdzv-timeout", "20", "--", "sh", "-c", line, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", addr, "--master-port", port,
                        "--nproc-per-node", "2", "--rdzv-token-file", file, "--rdzv-timeout", "20",
                        "--", "sh", "-c", line, NULL};
    const char *e0[] = {"PPRUN_RDZV_TOKEN=4e07408562bedb8b60ce05c1decfe3ad", NULL};
    const char *e1[] = {"PPRUN_RDZV_TOKEN=", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, e0);
    lt_start(&n1, a1, e1);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 0, "node 0: %s", n0.err);
    cr_assert_eq(n1.status, 0, "node 1: %s", n1.err);
    char want[160];
    snprintf(want, sizeof want, "ST=%s:%s T=4e07408562bedb8b60ce05c1decfe3ad\n", addr, port);
    cr_assert_eq(lt_count(n0.out, want) + lt_count(n1.out, want), 4, "%s%s", n0.out, n1.out);
    lt_free(&n0);
    lt_free(&n1);

    /* Node 1 with another token: refused at once, naming the store; node 0
     * waits for it until --rdzv-timeout (4 s: node 1 is started once node
     * 0's store listens, and must be refused before that runs out). */
    const char *a0b[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-addr", addr, "--master-port", port,
                         "--rdzv-timeout", "4", "--", "echo", "started", NULL};
    const char *a1b[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", addr, "--master-port", port,
                         "--rdzv-timeout", "20", "--", "echo", "started", NULL};
    const char *e1b[] = {"PPRUN_RDZV_TOKEN=not-the-same-token", NULL};
    lt_start(&n0, a0b, e0);
    if (!lt_wait_listening(atoi(port))) {
        kill(n0.pid, SIGINT);
        lt_wait(&n0);
        cr_assert_fail("node 0's store never listened on port %s: %s", port, n0.err);
    }
    uint64_t t0 = pp_now_ns();
    lt_start(&n1, a1b, e1b);
    lt_wait(&n1);
    cr_assert(pp_now_ns() - t0 < 10000000000ull, "the refused node waited for its --rdzv-timeout");
    lt_wait(&n0);
    cr_assert_eq(n1.status, 1, "node 1: %s", n1.err);
    snprintf(want, sizeof want, "store at %s:%s refused the rendezvous token", addr, port);
    cr_assert(strstr(n1.err, want), "%s", n1.err);
    cr_assert_eq(n0.status, 1, "node 0: %s", n0.err);
    cr_assert(strstr(n0.err, "refused a connection from") && strstr(n0.err, "wrong rendezvous token"), "%s", n0.err);
    lt_assert_has(n0.err, "node rank 1 never joined (store at ");
    lt_assert_has(n0.err, "; meanwhile the store refused 1 connection for the rendezvous token (a node with another "
                          "--rdzv-token, or none?)");
    cr_assert_null(strstr(n0.err, "not-the-same"), "node 0 logged the token: %s", n0.err);
    cr_assert_str_eq(n0.out, "");
    cr_assert_str_eq(n1.out, "");
    lt_free(&n0);
    lt_free(&n1);
}

/* Node 0 on loopback without a token, node 1 with one: the store refuses
 * node 1 at once, saying the tokens differ (before, it let it in, and the
 * job failed later as one rank refusing another's connection), and node
 * 0's timeout names the refusal. */
Test(launch_multinode, a_node_with_a_token_its_node_0_lacks_is_refused_at_the_store) {
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[13], *a1[13];
    echo_node(a0, "2", "0", port, "3");
    echo_node(a1, "2", "1", port, "20");
    const char *e0[] = {"PPRUN_RDZV_TOKEN=", NULL};
    const char *e1[] = {"PPRUN_RDZV_TOKEN=4e07408562bedb8b60ce05c1decfe3ad", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, e0);
    cr_assert(lt_wait_listening(atoi(port)), "node 0's store never listened");
    lt_start(&n1, a1, e1);
    lt_wait(&n1);
    lt_wait(&n0);
    cr_assert_eq(n1.status, 1, "node 1: %s", n1.err);
    lt_assert_has(n1.err, "refused the rendezvous token: this store has no rendezvous token and the connection gave "
                          "one: every node needs the same --rdzv-token / PPRUN_RDZV_TOKEN, or none");
    cr_assert_eq(n0.status, 1, "node 0: %s", n0.err);
    lt_assert_has(n0.err, "a rendezvous token, which this store does not have");
    lt_assert_has(n0.err, "; meanwhile the store refused 1 connection for the rendezvous token");
    cr_assert_null(strstr(n0.err, "4e07408562"), "node 0 logged the token: %s", n0.err);
    cr_assert_str_eq(n0.out, "");
    cr_assert_str_eq(n1.out, "");
    lt_free(&n0);
    lt_free(&n1);
}

/* Anyone who reaches node 0's store (a rank program: PPRUN_STORE) may write
 * the attempt's failure report. One that names a rank the job does not have
 * is no root cause: both launchers end the attempt saying its cause is
 * unknown, and blame no rank (before: "rank 5 (local_rank 99)" of a 2-rank
 * job, whose ranks were well). */
Test(launch_multinode, a_forged_failure_report_blames_no_rank) {
    /* a rank the job does not have; rank 1, with an out-of-memory scope
     * that is neither the node's (0) nor the cgroup's (1); rank 1, after
     * a rank 7 that "exited 0" before it */
    static const char *const forged[] = {"v6 1 5 99 3 0 1234 0 0 0 0 0 0 0 0 -1 0\nforged-host\nwhy\ntail",
                                         "v6 1 1 0 -1 9 1234 0 0 0 0 0 0 1 2 -1 0\nforged-host\nwhy\ntail",
                                         "v6 1 1 0 3 0 1234 0 0 0 0 0 0 0 0 7 5\nforged-host\nwhy\ntail"};
    for (size_t f = 0; f < sizeof forged / sizeof *forged; f++) {
        char port[16], dir[64];
        lt_proc n0, n1;
        snprintf(dir, sizeof dir, "forged-failure-%zu", f);
        two_sleeping_nodes(tfix_mkdir(dir), port, &n0, &n1);
        store_client *c;
        pp_err err;
        cr_assert_eq(store_connect("127.0.0.1", atoi(port), 5000000000ull, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(store_set(c, "pprun/a/0/fail", forged[f], strlen(forged[f]), &err), 0, "%s", err.msg);
        cr_assert_eq(store_set(c, "pprun/a/0/end", "", 0, &err), 0, "%s", err.msg);
        store_close(c);
        lt_wait(&n0);
        lt_wait(&n1);
        const lt_proc *nodes[2] = {&n0, &n1};
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(nodes[k]->status, 1, "report %zu, node %d: %s", f, k, nodes[k]->err);
            cr_assert(strstr(nodes[k]->err, "names no node or rank of this job"), "report %zu, node %d: %s", f, k,
                      nodes[k]->err);
            cr_assert_null(strstr(nodes[k]->err, "forged-host"), "report %zu, node %d: %s", f, k, nodes[k]->err);
            cr_assert_null(strstr(nodes[k]->err, "rank      : "), "report %zu, node %d: %s", f, k, nodes[k]->err);
        }
        lt_free(&n0);
        lt_free(&n1);
    }
}

/* A two-node `pprun run` into dir/hosts.db whose node 1 runs in a UTS
 * namespace of its own under the host name node1_host (set through
 * /proc/sys/kernel/hostname, which takes any bytes; a word of shell:
 * it may be a "$(printf ...)"), as on another machine; node 0's stderr into *n0. */
static void two_nodes_with_node_1_named(const char *dir, const char *node1_host, char **n0) {
    if (geteuid() != 0 || system("unshare --uts true 2>/dev/null") != 0)
        cr_skip_test("node 1 needs a host name of its own: unshare --uts (root) is not available here");
    char common[1024], cmd[4096], path[300];
    snprintf(common, sizeof common,
             "--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port %d --model "
             "timed:f=1ms,b=1ms,w=1ms,layers=4 --microbatches 4 --steps 2 --progress off --rdzv-timeout 30 "
             "--db %s/hosts.db",
             lt_free_port(), dir);
    snprintf(cmd, sizeof cmd,
             "%s run --node-rank 0 %s >%s/n0.txt 2>&1 & "
             "H=%s unshare --uts sh -c 'printf %%s \"$H\" >/proc/sys/kernel/hostname && exec \"$0\" \"$@\"' %s run --node-rank 1 %s "
             ">%s/n1.txt 2>&1; s1=$?; wait %%1; s0=$?; exit $((s0 | s1))",
             PPRUN_BIN, common, dir, node1_host, PPRUN_BIN, common, dir);
    int rc = system(cmd);
    size_t len;
    snprintf(path, sizeof path, "%s/n0.txt", dir);
    *n0 = lt_slurp(path, &len);
    snprintf(path, sizeof path, "%s/n1.txt", dir);
    char *n1 = lt_slurp(path, &len);
    cr_assert_eq(rc, 0, "node 0:\n%s\nnode 1:\n%s", *n0, n1);
    free(n1);
}

/* Where each rank ran (ranks.host, and the Chrome export's process names):
 * node 0 records its own host name and, for node 1's ranks, the one node
 * 1's launcher joined with (before: node 0 made up "node1"). */
Test(launch_multinode, the_ranks_of_node_1_are_recorded_on_the_host_node_1_named) {
    const char *dir = tfix_mkdir("hosts"); /* removed when the test process exits */
    char host[256] = "", path[300], cmd[1024], *n0;
    gethostname(host, sizeof host - 1);
    cr_assert_str_neq(host, "pprun-node-one");
    two_nodes_with_node_1_named(dir, "pprun-node-one", &n0);
    free(n0);
    snprintf(path, sizeof path, "%s/hosts.db", dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_intf(db, "SELECT count(*) FROM ranks WHERE node = 0 AND host = '%s'", host), 2);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM ranks WHERE node = 1 AND host = 'pprun-node-one'"), 2,
                 "node 1's ranks ran on pprun-node-one");
    sqlite3_close(db);
    snprintf(cmd, sizeof cmd, "%s export --db %s/hosts.db --format chrome --out %s/trace.json", PPRUN_BIN, dir, dir);
    cr_assert_eq(system(cmd), 0);
    size_t len;
    snprintf(path, sizeof path, "%s/trace.json", dir);
    char *trace = lt_slurp(path, &len);
    lt_assert_has(trace, "\"node 1 (pprun-node-one)\"");
    free(trace);
}

/* A host name with control characters (sethostname takes any bytes) is
 * recorded as every launcher records its own (net_host_name): escaped,
 * printable, so that it cannot drive a terminal where it is shown; node
 * 0 says nothing raw either. (A name in the store that is not printable,
 * which only someone who forged the store can put there, is left out:
 * read_node_hosts.) */
Test(launch_multinode, a_host_name_with_control_characters_is_recorded_escaped) {
    const char *dir = tfix_mkdir("bad-host"); /* removed when the test process exits */
    char path[300], *n0;
    two_nodes_with_node_1_named(dir, "\"$(printf 'evil\\033]0;x\\007')\"", &n0);
    cr_assert_null(strchr(n0, '\033'), "%s", n0);
    free(n0);
    snprintf(path, sizeof path, "%s/hosts.db", dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM ranks WHERE node = 1 AND host = 'evil\\x1b]0;x\\x07'"), 2);
    sqlite3_close(db);
}

/* Waits for both nodes' launchers to end (node 1 up to 60 s, then node 0
 * up to 30 s more); one that goes on is killed and the test fails, with
 * what both said. */
static void wait_both_nodes(lt_proc *n0, lt_proc *n1) {
    int ended1 = lt_wait_within(n1, 60), ended0 = lt_wait_within(n0, 30);
    lt_proc *nodes[2] = {n0, n1};
    for (int k = 0; k < 2; k++)
        if (!(k ? ended1 : ended0)) {
            kill(nodes[k]->pid, SIGKILL);
            lt_wait(nodes[k]);
        }
    cr_assert(ended0 && ended1, "the nodes went on:\n%s\n%s", n0->err, n1->err);
}

/* A rank of node 1 killed by SIGTERM that pprun did not send, and node
 * 1's launcher too once it reaped the rank (scancel's order when the
 * launcher hears of its rank first) while node 1's other rank is still
 * ending (it ends once the test has signalled the launcher: no race with
 * the launcher's grace): the job was stopped, on both nodes, naming that
 * rank, and both exit 143, node 0 too, which nobody signalled (before:
 * both named the rank as the job's failure and exited 1). */
Test(launch_multinode, a_rank_stopped_from_outside_stops_every_node) {
    const char *dir = tfix_mkdir("outside"); /* removed when the test process exits */
    char port[16], script[600], path[300];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(script, sizeof script,
             "if [ $RANK = 3 ]; then trap 'while [ ! -e %s/go ]; do sleep 0.02; done; exit 0' TERM; "
             "touch %s/ready-3; while :; do sleep 0.02; done; fi; "
             "echo $$ > %s/pid-$RANK.tmp; mv %s/pid-$RANK.tmp %s/pid-$RANK; exec sleep 120",
             dir, dir, dir, dir, dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", port,
                        "--max-restarts", "2", "--", "sh", "-c", script, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port,
                        "--max-restarts", "2", "--shutdown-timeout", "20", "--", "sh", "-c", script, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    snprintf(path, sizeof path, "%s/ready-3", dir);
    cr_assert(lt_wait_file(path), "rank 3 never started");
    snprintf(path, sizeof path, "%s/pid-2", dir);
    cr_assert(lt_wait_file(path), "rank 2 never started");
    size_t len;
    char *text = lt_slurp(path, &len);
    pid_t rank2 = (pid_t)atoi(text);
    free(text);
    cr_assert_gt(rank2, 1);
    kill(rank2, SIGTERM);
    for (int i = 0; i < 3000 && lt_pid_alive(rank2); i++) usleep(10000); /* a zombie until node 1 reaps it */
    cr_assert_not(lt_pid_alive(rank2), "node 1 never reaped rank 2");
    kill(n1.pid, SIGTERM);
    snprintf(path, sizeof path, "%s/go", dir);
    lt_touch(path);
    /* Before the fix both restarted, their ranks sleeping on: not waited for long. */
    wait_both_nodes(&n0, &n1);
    cr_assert_eq(n1.status, 143, "%s", n1.err);
    cr_assert_eq(n0.status, 143, "%s", n0.err);
    const char *want = "stopped: rank 2 (local rank 0 on ";
    for (int k = 0; k < 2; k++) {
        const char *err = k ? n1.err : n0.err;
        lt_assert_has(err, want);
        lt_assert_has(err, "was killed by SIGTERM, which pprun had not sent");
        cr_assert_null(strstr(err, "Root Cause"), "node %d: %s", k, err);
        cr_assert_null(strstr(err, "restarting"), "node %d: %s", k, err);
    }
    lt_free(&n0);
    lt_free(&n1);
}

/* A rank of node 1 killed by SIGTERM while no launcher got a stop signal
 * (the rank's own doing, or a kill of it alone): its failure, and both
 * nodes restart (--max-restarts 1), then fail on the second one, naming
 * it (before: both `stopped`, exit 143, no restart). */
Test(launch_multinode, a_rank_killed_by_sigterm_alone_fails_and_every_node_restarts) {
    const char *dir = tfix_mkdir("self-term"); /* removed when the test process exits */
    char port[16], script[512], path[300];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(script, sizeof script,
             "f=%s/pid-$RANK-$PPRUN_RESTART_COUNT; echo $$ > $f.tmp; mv $f.tmp $f; exec sleep 120", dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "1",
                        "--", "sh", "-c", script, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "1",
                        "--", "sh", "-c", script, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    for (int attempt = 0; attempt < 2; attempt++) {
        snprintf(path, sizeof path, "%s/pid-1-%d", dir, attempt);
        cr_assert(lt_wait_file(path), "rank 1 never started attempt %d", attempt);
        size_t len;
        char *text = lt_slurp(path, &len);
        pid_t rank1 = (pid_t)atoi(text);
        free(text);
        cr_assert_gt(rank1, 1);
        kill(rank1, SIGTERM);
    }
    wait_both_nodes(&n0, &n1);
    for (int k = 0; k < 2; k++) {
        const lt_proc *n = k ? &n1 : &n0;
        cr_assert_eq(n->status, 1, "node %d: %s", k, n->err);
        lt_assert_has(n->err, "attempt 1 of 2 failed (rank 1); restarting (1 of 1 restarts)");
        lt_assert_has(n->err, "Root Cause");
        lt_assert_has(n->err, "rank      : 1 (local_rank: 0)");
        lt_assert_has(n->err, "signal    : SIGTERM (15)");
        cr_assert_null(strstr(n->err, "stopped"), "node %d: %s", k, n->err);
    }
    lt_free(&n0);
    lt_free(&n1);
}

/* Node 1's rank 2 is killed by sig; node 0's rank 0, which only lost its
 * peer (it watches rank 2's pid), exits with an error at once and its node
 * reports that failure first, while node 1 is still tearing down (its
 * rank 3 ends once node 0's rank gave up, and with SIGTERM once the test
 * signalled node 1's launcher too): the order whenever node 1's
 * trouble comes first, scancel's when its SIGTERM lands there first. The
 * nodes decide once both told how the attempt ended, and a crash, or a
 * stop, outranks a rank that exited with an error (before: both named
 * rank 0's exit as the root cause). */
static void node_1_rank_killed_while_node_0s_rank_gives_up(int sig, lt_proc *n0, lt_proc *n1) {
    const char *dir = tfix_mkdir("outranks"); /* removed when the test process exits */
    char port[16], s0[512], s1[512], path[300];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(s0, sizeof s0,
             "if [ $LOCAL_RANK = 1 ]; then exec sleep 120; fi; while [ ! -e %s/pid-2 ]; do sleep 0.01; done; "
             "p=$(cat %s/pid-2); while kill -0 $p 2>/dev/null; do sleep 0.01; done; echo 'lost my peer' >&2; "
             "touch %s/gave-up; exit 1",
             dir, dir, dir);
    snprintf(s1, sizeof s1,
             "if [ $LOCAL_RANK = 1 ]; then trap 'while [ ! -e %s/go ]; do sleep 0.02; done; exit 0' TERM; "
             "touch %s/ready-3; while :; do sleep 0.05; done; fi; echo $$ > %s/pid.tmp; mv %s/pid.tmp %s/pid-2; "
             "exec sleep 120",
             dir, dir, dir, dir, dir);
    const char *a0[] = {"launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", port,
                        "--", "sh", "-c", s0, NULL};
    const char *a1[] = {"launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port,
                        "--shutdown-timeout", "20", "--", "sh", "-c", s1, NULL};
    lt_start(n0, a0, NULL);
    lt_start(n1, a1, NULL);
    snprintf(path, sizeof path, "%s/ready-3", dir);
    cr_assert(lt_wait_file(path), "rank 3 never started");
    snprintf(path, sizeof path, "%s/pid-2", dir);
    cr_assert(lt_wait_file(path), "rank 2 never started");
    size_t len;
    char *text = lt_slurp(path, &len);
    pid_t rank2 = (pid_t)atoi(text);
    free(text);
    cr_assert_gt(rank2, 1);
    kill(rank2, sig);
    if (sig == SIGTERM) {
        /* scancel's: node 1's launcher gets its SIGTERM too, here once it
         * reaped rank 2 and while rank 3 is still ending */
        for (int i = 0; i < 3000 && lt_pid_alive(rank2); i++) usleep(10000);
        cr_assert_not(lt_pid_alive(rank2), "node 1 never reaped rank 2");
        kill(n1->pid, SIGTERM);
    }
    snprintf(path, sizeof path, "%s/gave-up", dir);
    cr_assert(lt_wait_file(path), "node 0's rank never gave up");
    snprintf(path, sizeof path, "%s/go", dir);
    lt_touch(path);
    lt_wait(n0);
    lt_wait(n1);
    lt_assert_has(n0->err, "[0]: lost my peer");
}

Test(launch_multinode, a_stop_outranks_an_earlier_failure_of_a_rank_that_lost_its_peer) {
    lt_proc n0, n1;
    node_1_rank_killed_while_node_0s_rank_gives_up(SIGTERM, &n0, &n1);
    for (int k = 0; k < 2; k++) {
        const lt_proc *n = k ? &n1 : &n0;
        cr_assert_eq(n->status, 143, "node %d: %s", k, n->err);
        lt_assert_has(n->err, "stopped: rank 2 (local rank 0 on ");
        cr_assert_null(strstr(n->err, "Root Cause"), "node %d: %s", k, n->err);
    }
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, a_crash_outranks_an_earlier_failure_of_a_rank_that_lost_its_peer) {
    lt_proc n0, n1;
    node_1_rank_killed_while_node_0s_rank_gives_up(SIGKILL, &n0, &n1);
    for (int k = 0; k < 2; k++) {
        const lt_proc *n = k ? &n1 : &n0;
        cr_assert_eq(n->status, 1, "node %d: %s", k, n->err);
        lt_assert_has(n->err, "rank      : 2 (local_rank: 0)");
        lt_assert_has(n->err, "signal    : SIGKILL (9)");
    }
    lt_free(&n0);
    lt_free(&n1);
}

/* What a failure of a two-node `pprun run` says: the summary is titled by
 * the job (`pprun run` and its job id, as torchrun's by its entrypoint;
 * before: the launcher's own path, "/.../pprun FAILED"), the injected
 * kill names --fail-at as given, phase and all (before: "step=1,rank=2"),
 * and node 1, given a --db of its own, says it writes none: the database
 * is node 0's (before: not a word, and no file). */
Test(launch_multinode, a_two_node_run_names_the_job_the_whole_fail_at_and_node_1s_unused_db) {
    const char *dir = tfix_mkdir("fail-at"); /* removed when the test process exits */
    char port[16], db0[300], db1[300], want[600];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(db0, sizeof db0, "%s/mn0.db", dir);
    snprintf(db1, sizeof db1, "%s/mn1.db", dir);
    const char *a0[] = {"run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, "--model", "timed:f=1ms,b=1ms,w=1ms,layers=4",
                        "--microbatches", "4", "--steps", "3", "--progress", "off", "--fail-at",
                        "step=1,rank=2,phase=B", "--db", db0, NULL};
    const char *a1[] = {"run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, "--model", "timed:f=1ms,b=1ms,w=1ms,layers=4",
                        "--microbatches", "4", "--steps", "3", "--progress", "off", "--fail-at",
                        "step=1,rank=2,phase=B", "--db", db1, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    lt_wait(&n0);
    lt_wait(&n1);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    snprintf(want, sizeof want, "\npprun run (job 1 in %s) FAILED\n", db0);
    lt_assert_has(n0.err, want);
    lt_assert_has(n1.err, "\npprun run FAILED\n"); /* no database here */
    for (int k = 0; k < 2; k++)
        lt_assert_has(k ? n1.err : n0.err,
                      "\n  cause     : injected by --fail-at step=1,rank=2,phase=B (fault injection: not a bug)\n");
    snprintf(want, sizeof want,
             "pprun run: --db %s is not written on node rank 1: a job's trace database is node rank 0's (its --db), "
             "where this node's trace goes\n",
             db1);
    lt_assert_has(n1.err, want);
    cr_assert_null(strstr(n0.err, "is not written on node rank"), "%s", n0.err);
    cr_assert_neq(access(db1, F_OK), 0, "node 1 wrote %s", db1);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(db0, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM jobs WHERE status = 'failed' AND failed_rank = 2 AND failure "
                                "LIKE 'rank 2 (local rank 0 on %) was killed by SIGKILL (injected by --fail-at "
                                "step=1,rank=2,phase=B)'"),
                 1);
    sqlite3_close(db);
    lt_free(&n0);
    lt_free(&n1);
}

/* Each node reads its own --schedule csv:FILE. Node 1's (a node-local
 * path, or a file edited while the job starts) holds another schedule of
 * the same shape: it refuses to join, naming its file and both digests,
 * and node 0 says which node refused, recording the job failed with that
 * (before: the ranks deadlocked until --recv-timeout, and the database
 * recorded node 0's plan as the job's). */
Test(launch_multinode, a_node_whose_csv_schedule_differs_refuses_and_node_0_names_it) {
    const char *dir = tfix_mkdir("csv-differs"); /* removed when the test process exits */
    char port[16], csv0[300], csv1[300], sched0[320], sched1[320], db0[300], want[700];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(csv0, sizeof csv0, "%s/1f1b.csv", dir);
    snprintf(csv1, sizeof csv1, "%s/gpipe.csv", dir);
    snprintf(db0, sizeof db0, "%s/csv0.db", dir);
    for (int k = 0; k < 2; k++) {
        const char *made[] = {"schedule", "--schedule", k ? "gpipe" : "1f1b", "--pp", "4", "--microbatches", "4",
                              "--csv-out", k ? csv1 : csv0, NULL};
        lt_proc p;
        lt_run(&p, made, NULL);
        cr_assert_eq(p.status, 0, "%s", p.err);
        lt_free(&p);
    }
    snprintf(sched0, sizeof sched0, "csv:%s", csv0);
    snprintf(sched1, sizeof sched1, "csv:%s", csv1);
    const char *a0[] = {"run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, "--model", "timed:f=1ms,b=1ms,w=1ms,layers=4",
                        "--schedule", sched0, "--steps", "2", "--progress", "off", "--recv-timeout", "60s", "--db",
                        db0, NULL};
    const char *a1[] = {"run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, "--model", "timed:f=1ms,b=1ms,w=1ms,layers=4",
                        "--schedule", sched1, "--steps", "2", "--progress", "off", "--recv-timeout", "60s", NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    wait_both_nodes(&n0, &n1);
    cr_assert_eq(n1.status, 1, "%s", n1.err);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    /* the digests as the nodes' own `pprun schedule` would not print them:
     * checked by shape, and different */
    const char *at = strstr(n1.err, "differs between the nodes: digest ");
    cr_assert_not_null(at, "%s", n1.err);
    char d1[17] = "", d0[17] = "";
    cr_assert_eq(sscanf(at, "differs between the nodes: digest %16[0-9a-f] on node rank 1, %16[0-9a-f] on node rank 0",
                        d1, d0),
                 2, "%s", n1.err);
    cr_assert_eq(strlen(d1), 16);
    cr_assert_eq(strlen(d0), 16);
    cr_assert_str_neq(d1, d0);
    snprintf(want, sizeof want,
             "the plan of --schedule %s differs between the nodes: digest %s on node rank 1, %s on node rank 0: every "
             "node must run the same plan",
             sched1, d1, d0);
    lt_assert_has(n1.err, want);
    char want0[800];
    snprintf(want0, sizeof want0, "node rank 1 refused to join the job: %s", want);
    lt_assert_has(n0.err, want0);
    cr_assert_null(strstr(n0.err, "timed out"), "%s", n0.err);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(db0, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM jobs WHERE status = 'failed' AND failure LIKE 'node rank 1 "
                                "refused to join the job: the plan of --schedule csv:%'"),
                 1);
    sqlite3_close(db);
    lt_free(&n0);
    lt_free(&n1);
}

/* Node 1's launcher is killed (SIGKILL: no teardown, no report); its ranks
 * die with it, and node 0's rank, which lost its peer, exits with an error.
 * Node 0 waits for node 1 to tell how the attempt ended there
 * (--shutdown-timeout + 5 s), then its summary says that node 1 never did
 * (before: only its own rank, as if that were the whole story); under
 * `pprun run` (cmd "run", db: node 0's --db) so does the job's row. */
static void killed_launcher(const char *cmd, const char *db) {
    const char *dir = tfix_mkdir("silent"); /* removed when the test process exits */
    char port[16], script[600], path[300];
    snprintf(port, sizeof port, "%d", lt_free_port());
    snprintf(script, sizeof script,
             "if [ $RANK = 1 ]; then echo $$ > %s/pid.tmp; mv %s/pid.tmp %s/pid-1; exec sleep 120; fi; "
             "while [ ! -e %s/pid-1 ]; do sleep 0.01; done; p=$(cat %s/pid-1); "
             "while kill -0 $p 2>/dev/null; do sleep 0.01; done; echo 'lost my peer' >&2; exit 1",
             dir, dir, dir, dir, dir);
    const char *a0[20], *a1[20];
    for (int node = 0; node < 2; node++) {
        const char **a = node ? a1 : a0;
        int k = 0;
        a[k++] = cmd, a[k++] = "--nnodes", a[k++] = "2", a[k++] = "--node-rank", a[k++] = node ? "1" : "0";
        a[k++] = "--nproc-per-node", a[k++] = "1"; /* run's default is 4 */
        a[k++] = "--master-port", a[k++] = port, a[k++] = "--shutdown-timeout", a[k++] = "1";
        if (db && node == 0) a[k++] = "--db", a[k++] = db;
        a[k++] = "--", a[k++] = "sh", a[k++] = "-c", a[k++] = script, a[k] = NULL;
    }
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    lt_start(&n1, a1, NULL);
    snprintf(path, sizeof path, "%s/pid-1", dir);
    cr_assert(lt_wait_file(path), "rank 1 never started");
    kill(n1.pid, SIGKILL);
    lt_wait(&n1);
    int ended = lt_wait_within(&n0, 60);
    if (!ended) {
        kill(n0.pid, SIGKILL);
        lt_wait(&n0);
    }
    cr_assert(ended, "node 0 went on: %s", n0.err);
    cr_assert_eq(n0.status, 1, "%s", n0.err);
    if (!db) {
        lt_assert_has(n0.err, "rank      : 0 (local_rank: 0)");
        lt_assert_has(n0.err, "  silent    : node rank 1 (on ");
        lt_assert_has(n0.err, ") never told how the attempt ended there within 6s (its launcher killed, frozen or "
                              "cut off?): the failure above may only be the loss of its ranks\n");
    } else {
        sqlite3 *s;
        cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM jobs WHERE status = 'failed' AND failure LIKE 'rank 0 %' AND "
                                   "failure LIKE '%; node rank 1 (on %) never told how the attempt ended there within "
                                   "6s (its launcher killed, frozen or cut off?)'"),
                     1, "%s", n0.err);
        sqlite3_close(s);
    }
    lt_free(&n0);
    lt_free(&n1);
}

Test(launch_multinode, a_killed_launcher_is_named_as_the_node_that_never_told) { killed_launcher("launch", NULL); }

Test(launch_multinode, a_killed_launchers_node_is_named_in_the_jobs_failure) {
    killed_launcher("run", tfix_path("silent.db"));
}
