/* pprun_trace.h: trace your own training program's pipeline ops into
 * pprun's database, the same way pprun's built-in worker does.
 *
 * Run your program under `pprun run [job options] -- PROGRAM [ARGS]`: pprun
 * starts it once per rank (torchrun's environment, plus the job's schedule,
 * see docs/trace-api.md), and every op it records through this library lands
 * in the job's trace: the dashboard, `pprun stats`, `pprun query` and the
 * Chrome export see it like a built-in job's. Link with -lpprun_trace, or
 * load libpprun_trace.so from any language (Python: ctypes).
 *
 * Outside `pprun run` (no trace ring in the environment, or --trace off)
 * pprun_trace_init returns 0 and every other call does nothing (only a
 * phase name that does not exist is still an error), so a program keeps
 * its tracing calls whether or not pprun runs it.
 *
 * Timestamps are pprun_trace_now_ns() (the host's CLOCK_MONOTONIC); pprun
 * maps them onto the job clock. Records go into a shared-memory ring that
 * the launcher holds, so what a rank recorded before it crashed is kept. A
 * full ring never blocks: the record is counted as dropped and shown, as is
 * a record refused for its arguments (the call returns -1). Every
 * call is thread-safe; one process per rank records (the ring takes one
 * writer): a forked child's records are refused, and the ring's fd is not
 * passed on to programs the rank starts. */
#ifndef PPRUN_TRACE_H
#define PPRUN_TRACE_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1: recording (under `pprun run -- PROGRAM` with --trace on); 0: not
 * under pprun, every other call is a no-op; -1: the environment pprun set is
 * broken (pprun_trace_error says how; every record then fails the same way).
 * Calling it again returns the same. The first record initialises too. */
int pprun_trace_init(void);

/* The clock of every timestamp below, in nanoseconds. */
uint64_t pprun_trace_now_ns(void);

/* Records one op that ran from start_ns to end_ns.
 *   phase       "F", "B", "W" (forward, input gradient, weight gradient),
 *               "BW" (a backward that computes both gradients in one op:
 *               PyTorch's full backward), "SEND_F", "RECV_F", "SEND_B",
 *               "RECV_B" (activations and gradients between stages),
 *               "OPT" (the optimizer step), or "EVAL_F", "EVAL_SEND_F",
 *               "EVAL_RECV_F": an evaluation step's forward and its
 *               activation's send and receive (a forward-only step: the
 *               analyses of the training steps leave them out)
 *   step        0 or more (a program runs as many steps as it likes;
 *               PPRUN_STEPS is what `pprun run --steps` asked for)
 *   microbatch  0 .. PPRUN_MICROBATCHES-1, or -1 for OPT; an evaluation's
 *               is its own (0 .. 99999, times the replicas: over every
 *               replica, replica·n + mb), not bound by the training step's
 *   stage       0 .. PPRUN_NUM_STAGES-1, or -1 for OPT (an evaluation before
 *               the schedule is declared: any up to pprun's most stages)
 *   peer        the other rank of a SEND or RECV, else -1
 *   bytes       SEND/RECV: the payload; F/B/W: the activation bytes this
 *               rank holds after the op; OPT: its weights, gradients and
 *               optimizer state; 0 when you don't know
 * Returns 1 recorded, 0 not recording (or the ring was full: counted as
 * dropped), -1 bad arguments (nothing recorded; pprun_trace_error names
 * the argument and the accepted range), a broken environment, or a call
 * from another process than the one that initialised. */
int pprun_trace_op(const char *phase, int step, int microbatch, int stage, int peer, uint64_t bytes,
                   uint64_t start_ns, uint64_t end_ns);

/* The same op as it ran on the GPU: its kernels' span, timed on the
 * device (CUDA events) and put on the host clock by the caller; stored as
 * a gpu span (events.source 'gpu') beside the host span of the same op,
 * as CUPTI's are for pprun's own worker. Arguments and returns as
 * pprun_trace_op. */
int pprun_trace_gpu_op(const char *phase, int step, int microbatch, int stage, int peer, uint64_t bytes,
                       uint64_t start_ns, uint64_t end_ns);

/* pprun_trace_op's or pprun_trace_gpu_op's arguments in one record, for a
 * caller whose foreign-function interface converts each argument at a
 * cost: Python's ctypes passes one bytes object of this layout (struct
 * format "=16s6i3Q") for a third of what eight numbers cost (pprun's
 * Python package; docs/torch.md, "What tracing costs"). 64 bytes, no
 * padding, in the host's byte order ("="). */
typedef struct pprun_trace_op_record {
    char phase[16];   /* as pprun_trace_op's, NUL-terminated within the 16 bytes */
    int32_t gpu;      /* 0: a host span (pprun_trace_op), 1: a gpu span (pprun_trace_gpu_op) */
    int32_t step, microbatch, stage, peer;
    int32_t reserved; /* 0 */
    uint64_t bytes, start_ns, end_ns;
} pprun_trace_op_record;

/* Records the op in *rec: checked and returned as pprun_trace_op (-1 too
 * for a NULL rec, a phase without its NUL, gpu not 0 or 1, or reserved not
 * 0, naming which). */
int pprun_trace_op_packed(const pprun_trace_op_record *rec);

/* Records the loss of one microbatch (on the last stage), as the dashboard's
 * loss curve shows it. In a job of several pipelines (data-parallel
 * replicas: PPRUN_DP_SIZE, or WORLD_SIZE over the ranks of the schedule
 * declared) `microbatch` is the global one, replica·microbatches + mb, so
 * that every replica's losses have rows of their own. Returns as
 * pprun_trace_op. */
int pprun_trace_loss(int step, int microbatch, int stage, double loss);

/* Records the loss of one microbatch of an evaluation step (on the last
 * stage; the eval_losses table): step is the training step it follows
 * (0 before the first), microbatch as an EVAL_F's. Returns as
 * pprun_trace_op. */
int pprun_trace_eval_loss(int step, int microbatch, int stage, double loss);

/* Records a span of your own, named: data loading, an all-reduce, a
 * checkpoint ("data", "allreduce"). It is stored with its name (events:
 * phase 'SPAN', name), shown under its rank, and summed by name; the
 * pipeline analyses (bubble, gaps, critical path) leave it out.
 *   name        1..255 bytes of text
 *   step        as pprun_trace_op
 *   microbatch, stage   -1 when the span is not of one
 *   peer        the other rank (an exchange with one), else -1
 *   bytes       what it moved or read, 0 when you don't know
 * Returns as pprun_trace_op. */
int pprun_trace_span(const char *name, int step, int microbatch, int stage, int peer, uint64_t bytes,
                     uint64_t start_ns, uint64_t end_ns);

/* Declares the schedule this rank runs when it is the program's own rather
 * than PPRUN_ACTIONS (a PyTorch schedule): the job's schedule name
 * (jobs.schedule, "ScheduleGPipe"), its shape, and this rank's plan, which
 * replaces the launcher's in the plan table. Call it once, before or after
 * the first step's records; every rank declares its own plan.
 *   ranks, stages, microbatches   the pipeline's; stage and microbatch of
 *               this process's later records are checked against these
 *               instead of PPRUN_NUM_STAGES and PPRUN_MICROBATCHES
 *   actions     this rank's actions for one step in order, space-separated,
 *               PPRUN_ACTIONS' notation plus BW: "0F0 0F1 0BW0 0BW1"; "."
 *               is an idle slot of the grid; "" for no plan
 * Returns as pprun_trace_op (-1: a bad name, shape or action, naming it;
 * nothing is recorded then). */
int pprun_trace_schedule(const char *name, int ranks, int stages, int microbatches, const char *actions);

/* Counts n records as dropped without writing them: records the program
 * would have made and did not (it stopped tracing after a refusal, as
 * pprun.torch does), so that the job shows them lost with those a full
 * ring or a refusal dropped (ranks.dropped_events, pprun stats, the
 * dashboard). n is 0 .. PPRUN_TRACE_COUNT_DROPPED_MAX per call (0 counts
 * nothing); the rank's count saturates at INT64_MAX. Returns 1 counted,
 * 0 not recording, -1 n out of range (nothing counted; pprun_trace_error
 * names it), a broken environment, or a call from another process than
 * the one that initialised (a forked child counts nothing). */
#define PPRUN_TRACE_COUNT_DROPPED_MAX (1LL << 30)
int pprun_trace_count_dropped(int64_t n);

/* The reason for the latest -1 on this thread ("" when none). */
const char *pprun_trace_error(void);

/* Unmaps the ring; the next call initialises again, from the environment.
 * Records already written stay with the launcher. */
void pprun_trace_close(void);

#ifdef __cplusplus
}
#endif
#endif
