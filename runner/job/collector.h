/* collector.h: the launcher's trace collector (docs/design.md §1, §6).
 *
 * One thread per launcher. Every interval it drains every ring it was given
 * and hands the records on:
 *  - on the master (cfg.db set): into the database, one transaction per
 *    batch: the records of its rings and forwarders are staged until there
 *    are 64 per rank of the job (at most 65,536) or the oldest waited
 *    100 ms; the rings' drop counters into ranks/job_counters, and the
 *    analyses of each step once every rank has moved past it (after the
 *    batch that completes it);
 *  - on another node (cfg.forward_host set): framed over TCP to the master
 *    collector's ingest listener, with this node's clock offset, which the
 *    master applies so the events land on the job clock.
 * The master may also listen (cfg.listen_host) for forwarding nodes.
 *
 * Local rings are their ranks' (a user's program, which can write
 * anything there): a record that claims another rank than its ring's is
 * refused and counted (collector_rejected), and a ring whose header is
 * corrupt (trace_ring_fault) is disabled, said once on stderr naming its
 * rank, its loss counted as the rank's drops, and described in
 * cfg.ring_fault; the other rings go on. Live analyses visit the steps
 * that have records only: any step costs the same.
 *
 * Threading: collector_add_ring may be called from any thread while the
 * collector runs; the db handle belongs to the collector thread from
 * collector_start until collector_stop returns (don't use it meanwhile).
 *
 * The ingest listener is guarded by the job token (cfg.token, see
 * base/token.h) when it has one: a forwarder first sends a hello
 * with the token and waits for the answer; a connection without the right
 * token is closed before anything else is read from it, with one line on
 * stderr naming its address, and no record of it reaches the database.
 * Without a token the listener trusts the network it listens on (like
 * c10d's TCPStore); the launcher gives it one whenever that network
 * reaches other machines. Frames are still checked (magic, version, job,
 * sizes, ranks, steps), so a stray or forged sender cannot make the master
 * loop, allocate without bound or write outside the job.
 *
 * Forward protocol (host byte order; nodes of one job share an ABI): first
 * a hello {u32 magic "PPHI", u16 version 1, u16 token_len, token bytes},
 * answered by one byte (1 accepted, 0 refused, then closed); then one frame
 * per batch: header {u32 magic "PPFW", u16 version 1, u16 nranks, i64
 * job_id, u32 nrecords, u32 0}, then nranks x {i32 rank, i32 pid (0: not
 * known), i64 clock_offset_ns, u64 dropped}, then nrecords x trace_event. A master
 * without a token also takes frames without a hello (forwarders that
 * predate it). The answer 2 means the master cannot take another
 * forwarding connection (see Limits); the forwarder fails at
 * collector_start saying so.
 *
 * Limits (master; each refusal or close is a line on its stderr naming the
 * peer, at most 10 such lines per 10 s, then a count of those left out):
 *  - a connection must complete its hello (without a token: send the first
 *    4 bytes of a frame) within hello_timeout_ns (10 s) of being accepted,
 *    so idle strangers and port scanners cannot hold the slots;
 *  - a frame must arrive whole within frame_timeout_ns (60 s) of its first
 *    byte; a sender that stops mid-frame is closed, the frames before it
 *    are kept. Time the master spends not listening (a slow disk) counts
 *    at most ~1 s per round against these deadlines;
 *  - at most max_forwarders (4096) connections at once: the table grows
 *    from 16 as nodes connect; one more is answered 2 and closed, as is a
 *    connection accepted when the process is out of file descriptors (the
 *    launcher needs one per node: raise ulimit -n for big jobs);
 *  - a node sends its own ranks' records only: a frame that names (in its
 *    per-rank part or a record) one of the master's own ranks (node 0's,
 *    cfg.node_ranks, or a rank with a ring here) or, with node_ranks,
 *    ranks of two nodes, or of a node another connection already brings,
 *    drops its connection, naming the peer and the rank; nothing of that
 *    frame is recorded and its records count as refused
 *    (collector_rejected). A connection is bound to the node of the first
 *    rank it names. The token says a sender is one of the job's nodes,
 *    not which one: this keeps a node (or a stranger with the token) from
 *    writing over the master's ranks or a node that came first;
 *  - a frame's clock offsets are within +-TRACE_OFFSET_MAX (tracer/event.h):
 *    past it the connection is dropped, naming the peer, the rank and the
 *    value; a record the offset moves off the job clock is refused and
 *    counted (trace_record_why);
 *  - a frame holds at most 65536 records and as many ranks as the job has;
 *    a connection buffers at most one frame (about 5.6 MB) and 4 KiB, and
 *    frees a large buffer once it is empty;
 *  - the frames in progress of all connections together hold at most
 *    max_buffered (256 MiB; every connection's first 8 KiB are not
 *    counted): a frame that would pass it is not read until room frees,
 *    its sender held back as by a slow master (its frame deadline counts
 *    from then), so a flood of large unfinished frames cannot grow the
 *    launcher without bound and no forwarder's records are lost to it.
 * The listener and its connections are base/netserve.h's: sockets are
 * close-on-exec with keep-alive (a forwarder whose machine vanished frees
 * its slot after about 2 min). */
#ifndef PP_TRACE_COLLECTOR_H
#define PP_TRACE_COLLECTOR_H
#include <stdint.h>

#include "db/db.h"
#include "base/pp.h"
#include "tracer/ring.h"

typedef struct collector collector;

typedef struct collector_config {
    db *db;                   /* master: the writer (not owned); NULL when forwarding */
    int64_t job_id;
    int world_size;           /* all ranks of the job, every node */
    int node_ranks;           /* master: ranks per node (node n has n * node_ranks onwards, the master's
                               * own are node 0's): a forwarding connection brings one other node's
                               * ranks only (see Limits); 0: only the ranks with a ring here are
                               * refused from forwarders */
    int steps;                /* the job's steps: records must have step < steps (0: no bound) */
    uint64_t interval_ns;     /* 0: 5 ms */
    int64_t clock_offset_ns;  /* this node: master clock - local clock (0 on the master) */
    const char *forward_host; /* non-master: the master's ingest listener */
    int forward_port;
    const char *listen_host;  /* master: accept forwarding nodes here (NULL: don't) */
    int listen_port;          /* 0: any free port, see collector_listen_port */
    uint64_t stop_grace_ns;   /* collector_stop waits this long for forwarders to close, and a
                               * forwarder this long for a master that stopped reading (0: 5 s) */
    const char *token;        /* the job token (NULL or "": none): required of forwarders by the
                               * master, presented to it by the others; copied */
    /* Master's ingest limits (0: the defaults, see "Limits" above). */
    uint64_t hello_timeout_ns; /* accept to complete hello: 10 s */
    uint64_t frame_timeout_ns; /* a frame's first byte to its last: 60 s */
    int max_forwarders;        /* forwarding connections served at once: 4096 */
    uint64_t max_buffered;     /* bytes of frames in progress, all connections: 256 MiB */
    /* Master: called on the collector's thread after each step it analyses
     * while the job runs, with the writer (db), which only that thread uses
     * until collector_stop; NULL: nothing. Not called for the final pass of
     * collector_stop. */
    void (*step_analyzed)(void *ctx, db *d, int step);
    void *step_analyzed_ctx;
    /* Where the first ring found corrupt (trace_ring_fault) is described,
     * naming its rank, by the collector's thread: read it after
     * collector_stop; "" when none was (the caller clears it first). NULL:
     * not wanted. A corrupt ring is disabled, said once on stderr and its
     * rank's drops counted; the other rings go on. */
    pp_err *ring_fault;
} collector_config;

/* Starts the thread (and connects or listens). Free with collector_stop.
 * A forwarding collector fails here, saying "the trace collector at
 * HOST:PORT refused the rendezvous token", when the master refuses it. A
 * listen_host this machine cannot bind (NAT) falls back to every
 * interface. */
int collector_start(const collector_config *cfg, collector **out, pp_err *err);
/* The collector takes ownership of ring and closes it in collector_stop;
 * until then its fd (trace_ring_fd) stays valid for spawning workers. Rings
 * of a dead or restarted worker stay and are drained to the last record. */
int collector_add_ring(collector *c, int rank, trace_ring *ring, pp_err *err);
int collector_listen_port(const collector *c);
/* Records ingested (master) or forwarded (other nodes) so far. */
uint64_t collector_count(const collector *c);
/* Records refused: a rank outside [0, world_size) or a step outside
 * [0, steps) (master), from a buggy worker or a forged forwarding frame;
 * a record in a local ring that claims a rank other than the ring's; the
 * records of a forwarded frame that claims ranks not its node's (Limits). */
uint64_t collector_rejected(const collector *c);
/* Master: the collector thread's time so far writing records
 * (db_insert_events) and analysing steps (with step_analyzed), in ns: what
 * bench/loadgen.c weighs against each other. The final analyses of
 * collector_stop are not counted; its last writes are. */
void collector_times(const collector *c, uint64_t *insert_ns, uint64_t *analyze_ns);
/* 0 while all is well; -1 with the first error (disk full, master gone). */
int collector_error(collector *c, pp_err *err);
/* The pid of rank's latest attempt (the launcher's `started` hook): the
 * master records it in ranks.pid, another node forwards it. */
void collector_set_pid(collector *c, int rank, int pid);
/* The job did not run to its end (failed, stopped): the steps no rank
 * moved past were cut short, and collector_stop does not analyse them
 * (their statistics would describe part of a step as a whole one); their
 * events stay. */
void collector_last_step_cut(collector *c);
/* Drains every ring to the end, waits for forwarders to close (master; up
 * to stop_grace_ns, and not for connections that never sent a byte),
 * runs the final analyses of every step but those analysed while the job
 * ran that got no event since (and those collector_last_step_cut leaves
 * out), joins and frees. Returns -1 with the first error met during
 * the whole run, if any. */
int collector_stop(collector *c, pp_err *err);

#endif
