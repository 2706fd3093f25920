/* cupti_records.h: CUPTI activity records -> ring records, the part of
 * CUPTI tracing that needs no GPU (tracer/gputrace.h tells the story).
 *
 * gpu_recs keeps what it needs of the CUPTI records delivered so far
 * (kernels, memcpys, external correlations) and the kernel names, interned
 * (an id per distinct name, sent once). gpu_recs_build turns them, with the
 * step's segments (external correlation id -> the host op it belongs to),
 * into spans and kernel records. Pure: no CUPTI call, no lock (the caller
 * locks), so tests feed it real CUPTI structs on the CPU.
 *
 * Memory: gpu_recs owns everything it holds; gpu_recs_free frees it. */
#ifndef PP_CUPTI_RECORDS_H
#define PP_CUPTI_RECORDS_H
#include <cupti_activity.h>
#include <stddef.h>
#include <stdint.h>

#include "tracer/event.h"

/* One host op of an action: the launches made while ext_id was pushed
 * belong to it. closed = 0: the action ended before another host op did
 * (its launches belong to no op). */
typedef struct gpu_seg {
    uint64_t ext_id;
    trace_event host; /* the host record (phase, step, microbatch, stage, peer, bytes) */
    int closed;
} gpu_seg;

typedef struct gpu_act { /* a kernel or memcpy */
    uint32_t corr, name_id, stream;
    uint64_t start_ns, end_ns;
} gpu_act;

typedef struct gpu_corr {
    uint32_t corr;
    uint64_t ext_id;
} gpu_corr;

typedef struct gpu_recs {
    gpu_act *acts;
    size_t nacts, cap_acts;
    gpu_corr *corrs;
    size_t ncorrs, cap_corrs;
    char **names;         /* [nnames] by id */
    unsigned char *sent;  /* [nnames] 1 once its TRACE_KERNEL_NAME records were emitted */
    size_t nnames, cap_names;
    uint32_t *slots;      /* open-addressing hash of name ids + 1 (0 = empty) */
    size_t nslots;
    size_t max_records;   /* activities + correlations kept between builds; more are lost */
    uint64_t lost;        /* records lost: over max_records, out of memory, no timestamps */
} gpu_recs;

void gpu_recs_init(gpu_recs *r, size_t max_records);
void gpu_recs_free(gpu_recs *r);
/* Copies what it needs of one record; other kinds are ignored. External
 * correlations count only for CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0. */
void gpu_recs_add(gpu_recs *r, const CUpti_Activity *rec);

typedef void (*gpu_emit_fn)(void *ctx, const trace_event *ev);
/* Emits, for each segment with device work (segments sorted by ext_id),
 * the names not sent yet, the span (the host record with source gpu,
 * first start to last end, reserved = ++*next_span), then its kernels by
 * start; then the activities of no op (reserved 0, microbatch and stage
 * -1). base gives attempt, rank and step. Forgets the activities and
 * correlations afterwards; names stay. */
void gpu_recs_build(gpu_recs *r, const gpu_seg *segs, size_t nsegs, const trace_event *base, int32_t *next_span,
                    gpu_emit_fn emit, void *ctx);

#endif
