/* event.h: the trace record every rank writes, one per traced op (DESIGN.md §6).
 *
 * Fixed size (64 bytes, one cache line), versioned, plain old data: the
 * worker writes it into a shared-memory ring and the launcher's collector
 * reads it, even after the worker died. Timestamps are CLOCK_MONOTONIC ns of
 * the writing host; the collector maps them onto the job clock.
 *
 * CONTRACT: the engine writes these, tracer/ carries them, db/ stores them. */
#ifndef PP_TRACE_EVENT_H
#define PP_TRACE_EVENT_H
#include <stdint.h>

#define TRACE_EVENT_VERSION 1

typedef enum trace_phase {
    TRACE_F = 0,
    TRACE_B = 1,
    TRACE_W = 2,
    TRACE_SEND_F = 3,
    TRACE_RECV_F = 4,
    TRACE_SEND_B = 5,
    TRACE_RECV_B = 6,
    TRACE_OPT = 7,
    TRACE_LOSS = 8, /* one per microbatch on the last stage; value = loss; start == end */
    TRACE_PHASE_COUNT
} trace_phase;

typedef enum trace_source { TRACE_SRC_CPU = 0, TRACE_SRC_GPU = 1 } trace_source;

typedef struct trace_event {
    uint16_t version;   /* TRACE_EVENT_VERSION */
    uint8_t phase;      /* trace_phase */
    uint8_t source;     /* trace_source */
    int32_t attempt;    /* restart count of the job */
    int32_t rank;
    int32_t step;
    int32_t microbatch; /* -1 when not per microbatch (OPT) */
    int32_t stage;      /* -1 when not per stage */
    int32_t peer;       /* the other rank of SEND/RECV, else -1 */
    int32_t reserved;
    uint64_t start_ns, end_ns;
    uint64_t bytes;     /* SEND/RECV payload */
    double value;       /* LOSS: the loss */
} trace_event;

_Static_assert(sizeof(trace_event) == 64, "trace_event must stay one cache line");

/* "F", "SEND_F", ... as stored in the database. */
const char *trace_phase_name(int phase);

#endif
