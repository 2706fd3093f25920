/* event.h: the trace record every rank writes, one per traced op (docs/design.md §6).
 *
 * Fixed size (64 bytes, one cache line), versioned, plain old data: the
 * worker writes it into a shared-memory ring and the launcher's collector
 * reads it, even after the worker died. Timestamps are CLOCK_MONOTONIC ns of
 * the writing host; the collector maps them onto the job clock.
 *
 * CONTRACT: the engine writes these, tracer/ carries them, db/ stores them. */
#ifndef PP_TRACE_EVENT_H
#define PP_TRACE_EVENT_H
#include <stddef.h>
#include <stdint.h>

/* 2: the GPU record kinds (TRACE_KERNEL, TRACE_KERNEL_NAME, TRACE_GPU_DROPPED)
 * and the name union; the layout of version 1's fields is unchanged.
 * 3: TRACE_BW and TRACE_SPAN (spans, numbered before TRACE_LOSS as every
 * span phase is), TRACE_SPAN_NAME, TRACE_SCHEDULE and TRACE_PLAN (records
 * of a user's program, libpprun_trace); the kinds from TRACE_LOSS on moved
 * up by two. Records carry phase numbers, the database phase names.
 * 4: an evaluation step's spans (TRACE_EVAL_F, TRACE_EVAL_SEND_F,
 * TRACE_EVAL_RECV_F, numbered before TRACE_LOSS; the kinds from TRACE_LOSS
 * on moved up by three) and its losses (TRACE_EVAL_LOSS); OPT's value is
 * the optimizer state's bytes; pprun's own named spans (ALLREDUCE ...).
 * 5: a host record's wait_cpu_ns (tracer/cpuwait.h), where a gpu span has
 * its number. */
#define TRACE_EVENT_VERSION 5

typedef enum trace_phase {
    TRACE_F = 0,
    TRACE_B = 1,
    TRACE_W = 2,
    TRACE_SEND_F = 3,
    TRACE_RECV_F = 4,
    TRACE_SEND_B = 5,
    TRACE_RECV_B = 6,
    TRACE_OPT = 7,
    /* PyTorch's full backward (backward_one_chunk with full_backward, as
     * GPipe, 1F1B and interleaved 1F1B run it): B and W of one microbatch
     * and stage in one op, its input gradient ready only at its end. */
    TRACE_BW = 8,
    /* A span of the user's own (pprun.span("data")), named: `name` is the
     * id of its name (TRACE_SPAN_NAME); microbatch, stage, peer -1 when
     * not given. Stored as phase 'SPAN' with events.name. Neither compute
     * nor pipeline communication for the analyses. */
    TRACE_SPAN = 9,
    /* An evaluation step (docs/schedules.md, "Evaluation steps"): the F of
     * a forward-only microbatch on held-out data, and its activation's send
     * and receive, as TRACE_F, TRACE_SEND_F and TRACE_RECV_F have them;
     * step = the training step it follows, microbatch = its index in the
     * evaluation step over all replicas. Stored as 'EVAL_F', 'EVAL_SEND_F',
     * 'EVAL_RECV_F': the pipeline analyses (F, B, W, BW, OPT and the
     * training step's SEND/RECV) never count them. */
    TRACE_EVAL_F = 10,
    TRACE_EVAL_SEND_F = 11,
    TRACE_EVAL_RECV_F = 12,
    /* The phases below are records, never spans of `events`. */
    TRACE_LOSS = 13, /* one per microbatch on the last stage; value = loss; start == end */
    /* CUPTI (--cupti on, tracer/gputrace.h); never rows of `events`:
     * TRACE_KERNEL: one kernel or memcpy on the device: start_ns/end_ns,
     *   reserved = number of the gpu span it belongs to (0: none),
     *   peer = CUDA stream id, bytes = its name id (TRACE_KERNEL_NAME),
     *   microbatch/stage = its span's. Becomes a row of `kernels`.
     * TRACE_KERNEL_NAME: a chunk of a kernel name (kname below); a name is
     *   sent once per rank and attempt, before the first kernel using it.
     * TRACE_GPU_DROPPED: bytes = CUPTI activity records this rank lost so
     *   far (absolute), start == end. */
    TRACE_KERNEL = 14,
    TRACE_KERNEL_NAME = 15,
    TRACE_GPU_DROPPED = 16,
    /* A user's program (libpprun_trace):
     * TRACE_SPAN_NAME: a chunk of a span's or a schedule's name (kname
     *   below); a name is sent once per rank and attempt, before the first
     *   record using its id. Kernel names have ids of their own.
     * TRACE_SCHEDULE: the schedule the rank runs when it is the program's
     *   own (a PyTorch schedule), `sched` below: the job's schedule, stages
     *   and microbatches from then on, and this rank's plan is the
     *   TRACE_PLAN records that follow (replacing the launcher's).
     * TRACE_PLAN: one action of the rank's plan, `plan` below. */
    TRACE_SPAN_NAME = 17,
    TRACE_SCHEDULE = 18,
    TRACE_PLAN = 19,
    /* An evaluation step's loss, one per microbatch on the last stage, as
     * TRACE_LOSS: the eval_losses table (step = the training step the
     * evaluation follows, microbatch its global index). */
    TRACE_EVAL_LOSS = 20,
    TRACE_PHASE_COUNT
} trace_phase;

typedef enum trace_source { TRACE_SRC_CPU = 0, TRACE_SRC_GPU = 1 } trace_source;

#define TRACE_NAME_CHUNK 40 /* name bytes per TRACE_KERNEL_NAME or TRACE_SPAN_NAME record */
#define TRACE_NAME_MAX 4095 /* longer kernel names are cut there */
#define TRACE_SPAN_NAME_MAX 255 /* span and schedule names: longer ones are refused */
/* Distinct span and schedule names a process may send: each costs its
 * records and is kept by the library and the collector for the job; a
 * name past them is refused (a program naming each span anew). */
#define TRACE_SPAN_NAMES_MAX 65536

typedef struct trace_event {
    uint16_t version;   /* TRACE_EVENT_VERSION */
    uint8_t phase;      /* trace_phase */
    uint8_t source;     /* trace_source */
    int32_t attempt;    /* restart count of the job */
    int32_t rank;
    int32_t step;
    union {
        struct {
            int32_t microbatch; /* -1 when not per microbatch (OPT) */
            int32_t stage;      /* -1 when not per stage */
            int32_t peer;       /* the other rank of SEND/RECV, else -1 */
            union {
                int32_t reserved;     /* source gpu: the span's number (> 0), which its TRACE_KERNELs carry */
                uint32_t wait_cpu_ns; /* source cpu, ops and spans: ns the writing thread waited for a core
                                       * since its previous record (tracer/cpuwait.h); saturates */
            };
            uint64_t start_ns, end_ns;
            uint64_t bytes;     /* SEND/RECV payload; F/B/W/BW: activation bytes the rank holds after the op;
                                * OPT: the rank's weights, gradients and optimizer state; SPAN: the user's */
            union {
                double value;   /* LOSS, EVAL_LOSS: the loss; OPT: of `bytes`, the optimizer state's (0: not
                                 * measured) */
                uint64_t name;  /* SPAN: its name's id (TRACE_SPAN_NAME) */
            };
        };
        struct {                /* TRACE_KERNEL_NAME and TRACE_SPAN_NAME */
            uint32_t id;        /* the name's id (TRACE_KERNEL's bytes, TRACE_SPAN's name) */
            uint16_t off, len;  /* this chunk is bytes [off, off + n) of a name of len bytes */
            char text[TRACE_NAME_CHUNK]; /* n = min(40, len - off) bytes, not NUL-terminated */
        } kname;
        struct {                /* TRACE_SCHEDULE */
            uint32_t name;      /* its name's id (TRACE_SPAN_NAME): "ScheduleGPipe" */
            int32_t ranks;      /* ranks of the pipeline */
            int32_t stages;     /* stages in all (ranks x stages per rank) */
            int32_t microbatches;
            int32_t slots;      /* the TRACE_PLAN records of this rank that follow (its grid's width) */
        } sched;
        struct {                /* TRACE_PLAN */
            int32_t slot;       /* column of the rank's grid, 0 .. slots-1 (idle columns have no record) */
            int32_t stage;
            int32_t op;         /* TRACE_F, TRACE_B, TRACE_W or TRACE_BW */
            int32_t microbatch;
        } plan;
    };
} trace_event;

_Static_assert(sizeof(trace_event) == 64, "trace_event must stay one cache line");

/* The largest start_ns or end_ns a record may carry. The database stores
 * times as signed 64-bit ns after adding the node's clock offset (each
 * side a CLOCK_MONOTONIC reading, so below 2^62 for 146 years of uptime):
 * a time past this would wrap to a negative one or overflow in that sum,
 * and the analyses of its step then fail (a record at end_ns 2^64-1 once
 * stopped a job's whole trace). */
#define TRACE_TIME_MAX (INT64_MAX / 2)

/* The largest clock offset a node may have to the master, either way
 * (master clock - the node's, collector.h). Both are CLOCK_MONOTONIC
 * readings of at most TRACE_TIME_MAX, so no two real clocks differ by
 * more, and a record's time plus such an offset fits an int64. A
 * forwarder's frame carries its offset: a broken or hostile one could
 * otherwise shift its records anywhere, or overflow the sum. */
#define TRACE_OFFSET_MAX TRACE_TIME_MAX

/* What is wrong with a node's clock offset, into why (n bytes, "" when
 * nothing is): past +-TRACE_OFFSET_MAX. 1 when bad. */
int trace_offset_why(int64_t offset_ns, char *why, size_t n);

/* The most bytes an op, span or OPT may carry (1 PiB): what the
 * database's readers take (db/bounds.h, bounds_bytes), so that a sum over
 * a million rows fits an int64. A program's span of more (a bytes= it
 * got wrong) would otherwise be stored, and every reader of its job
 * refuse the job as damaged. */
#define TRACE_BYTES_MAX ((uint64_t)1 << 50)

/* What is wrong with a record's times and bytes, into why (n bytes, ""
 * when nothing is): a time past TRACE_TIME_MAX, or an end before the
 * start; and, with its node's clock offset (0 on the master and in
 * libpprun_trace), a time that the offset moves outside 0..TRACE_TIME_MAX
 * on the job clock (or an offset past its own bound); an op's, span's or
 * OPT's bytes past TRACE_BYTES_MAX. Records of phases without times
 * (names, schedules, plans) pass. The one check of both boundaries:
 * libpprun_trace refuses such a call, the collector such a record in a
 * ring (a program can write its ring directly) or from a forwarder. 1
 * when bad. */
int trace_record_why(const trace_event *e, int64_t offset_ns, char *why, size_t n);

/* "F", "SEND_F", ... as stored in the database. */
const char *trace_phase_name(int phase);

/* Whether a span's name is one of pprun's data-parallel collectives
 * (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER: docs/schema.md, "Data
 * parallelism"), whose microbatch is the bucket's number in its stage's
 * step, not a microbatch: a rank's worker records them, and pprun's
 * PyTorch package for a program's collectives (docs/torch.md). */
int trace_is_dp_span(const char *name);

/* Fills out[] with the TRACE_KERNEL_NAME records that carry name (cut at
 * TRACE_NAME_MAX bytes) under id; attempt/rank/step from base. Returns the
 * count (at most TRACE_NAME_MAX / TRACE_NAME_CHUNK + 1; out must hold that). */
#define TRACE_NAME_RECORDS_MAX (TRACE_NAME_MAX / TRACE_NAME_CHUNK + 1)
size_t trace_name_records(const trace_event *base, uint32_t id, const char *name, trace_event *out);
/* The same for a name of phase TRACE_KERNEL_NAME or TRACE_SPAN_NAME, with
 * base's source. */
size_t trace_name_records_of(int phase, const trace_event *base, uint32_t id, const char *name, trace_event *out);

#endif
