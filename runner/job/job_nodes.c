/* job_nodes.c: this node among the job's nodes (job_nodes.h). */
#include "runner/job/job_nodes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/net.h"

/* The address this node uses to reach the master: what other nodes' ranks
 * connect to for TCP transport. */
void job_nodes_address(run_job *job) {
    const char *master = job->lo.nnodes > 1 ? job->lo.master_addr : "127.0.0.1";
    if (net_route_source(master, job->node_addr, sizeof job->node_addr) != 0)
        snprintf(job->node_addr, sizeof job->node_addr, "127.0.0.1");
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
