/* job_nodes.h: this node among the nodes of a `pprun run` job: the address
 * its ranks give the others for TCP, and, with several nodes, agreeing with
 * node 0 on the job before any rank starts. */
#ifndef PP_JOB_NODES_H
#define PP_JOB_NODES_H
#include "base/pp.h"
#include "runner/job/job.h"
#include "runner/launch/launch.h"
#include "runner/store/store.h"

/* job->node_addr: the address this node reaches the master with (what
 * other nodes' ranks connect to, PPRUN_NODE_ADDR); with one node, the
 * ranks' TCP ports stay on loopback. */
void job_nodes_address(run_job *job);
/* Several nodes: every node must run the job node 0 runs. Node 0
 * publishes its options (run_config_node_text) in the store; each other
 * node compares its own with them and refuses to start on a difference,
 * naming it, rather than run ranks that disagree: a hang, or, worse, a job
 * that succeeds with another schedule on some ranks than the one the
 * database records. */
int job_nodes_agree(const run_job *job, const launch_info *info, store_client *store, pp_err *err);

#endif
