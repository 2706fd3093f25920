/* job_nodes.c: this node among the job's nodes (job_nodes.h). */
#include "runner/job/job_nodes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* The address this node uses to reach the master: what other nodes' ranks
 * connect to for TCP transport. */
static void node_address(const char *master, char *out, size_t n) {
    snprintf(out, n, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(master, "9", &hints, &ai) != 0) return;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &len) == 0)
        inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)n);
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
}

void job_nodes_address(run_job *job) {
    node_address(job->lo.nnodes > 1 ? job->lo.master_addr : "127.0.0.1", job->node_addr, sizeof job->node_addr);
}

int job_nodes_agree(const run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    char mine[8192];
    if (run_config_node_text(&job->cfg, info->nproc_per_node, mine, sizeof mine) != 0)
        return pp_fail(err, "the job's options do not fit in %zu bytes", sizeof mine);
    /* and the same program (a node without one would run pprun's worker) */
    size_t used = strlen(mine);
    if (job->program && snprintf(mine + used, sizeof mine - used, "-- %s\n", job->model + strlen("program:")) >=
                            (int)(sizeof mine - used))
        return pp_fail(err, "the job's options do not fit in %zu bytes", sizeof mine);
    if (info->node_rank == 0) return store_set(store, "run/options", mine, strlen(mine), err);
    const char *keys[] = {"run/options"};
    int rc = store_wait(store, keys, 1, 60000, err);
    if (rc == 1) return pp_fail(err, "node rank 0 never published its job options");
    void *node0;
    size_t len;
    if (rc != 0 || store_get(store, keys[0], &node0, &len, err) != 0) return -1;
    rc = run_config_node_diff(mine, node0, err);
    free(node0);
    if (rc != 0)
        return pp_wrap(err, "this node's job options differ from node rank 0's (start every node with the same "
                            "`pprun run` options; only --node-rank may differ)");
    return 0;
}
