/* test_gputrace.c: CUPTI tracing (tracer/gputrace.h).
 *
 * Without a GPU: the record-to-span logic (tracer/cuda/cupti_records.c) fed
 * with real CUPTI 13.0 structs (CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
 * CUpti_ActivityExternalCorrelation) as the buffer callback hands them over;
 * libcupti loading with every function the tracer calls; opening the tracer
 * with no driver fails with a reason instead of crashing.
 * A real `pprun run --device cuda` job with CUPTI on (gpu spans inside
 * their host spans, kernels rows with names): test_gpu_run.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tracer/gputrace.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu_internal.h"
#include "tracer/cuda/cupti_records.h"
#endif

#ifdef PPRUN_HAVE_CUDA

/* ---- the record logic, with real CUPTI structs ------------------------- */

typedef struct sink {
    trace_event ev[256];
    size_t n;
    int full; /* drops every record, as a full ring does */
} sink;

static int collect(void *ctx, const trace_event *ev) {
    sink *s = ctx;
    if (s->full) return 0;
    cr_assert_lt(s->n, 256);
    s->ev[s->n++] = *ev;
    return 1;
}

static void add_kernel(gpu_recs *r, uint32_t corr, const char *name, uint32_t stream, uint64_t start, uint64_t end) {
    CUpti_ActivityKernel10 k;
    memset(&k, 0, sizeof k);
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.correlationId = corr;
    k.name = name;
    k.streamId = stream;
    k.start = start;
    k.end = end;
    gpu_recs_add(r, (const CUpti_Activity *)&k);
}

static void add_memcpy(gpu_recs *r, uint32_t corr, uint8_t kind, uint64_t start, uint64_t end) {
    CUpti_ActivityMemcpy6 m;
    memset(&m, 0, sizeof m);
    m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    m.copyKind = kind;
    m.correlationId = corr;
    m.streamId = 7;
    m.bytes = 4096;
    m.start = start;
    m.end = end;
    gpu_recs_add(r, (const CUpti_Activity *)&m);
}

static void add_ext(gpu_recs *r, uint32_t corr, uint64_t ext, CUpti_ExternalCorrelationKind kind) {
    CUpti_ActivityExternalCorrelation x;
    memset(&x, 0, sizeof x);
    x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    x.externalKind = kind;
    x.externalId = ext;
    x.correlationId = corr;
    gpu_recs_add(r, (const CUpti_Activity *)&x);
}

static void add_api(gpu_recs *r, uint32_t corr) { /* ignored: only its external correlation matters */
    CUpti_ActivityAPI a;
    memset(&a, 0, sizeof a);
    a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    a.correlationId = corr;
    a.start = 1;
    a.end = 2;
    gpu_recs_add(r, (const CUpti_Activity *)&a);
}

static gpu_seg seg(uint64_t ext, int phase, int mb, int stage, int peer, int closed) {
    gpu_seg s = {.ext_id = ext, .closed = closed};
    s.host = (trace_event){.version = TRACE_EVENT_VERSION, .phase = (uint8_t)phase, .source = TRACE_SRC_CPU,
                           .attempt = 1, .rank = 3, .step = 5, .microbatch = mb, .stage = stage, .peer = peer,
                           .start_ns = 1, .end_ns = 2, .bytes = peer >= 0 ? 4096 : 0};
    return s;
}

static const trace_event *find_span(const sink *s, int phase) {
    for (size_t i = 0; i < s->n; i++)
        if (s->ev[i].phase == phase && s->ev[i].source == TRACE_SRC_GPU) return &s->ev[i];
    return NULL;
}

/* The name of id, from the TRACE_KERNEL_NAME records emitted so far. */
static const char *name_of(const sink *s, uint64_t id, char *buf, size_t cap) {
    buf[0] = 0;
    for (size_t i = 0; i < s->n; i++) {
        const trace_event *e = &s->ev[i];
        if (e->phase != TRACE_KERNEL_NAME || e->kname.id != id) continue;
        size_t k = (size_t)(e->kname.len - e->kname.off);
        if (k > TRACE_NAME_CHUNK) k = TRACE_NAME_CHUNK;
        cr_assert_lt((size_t)e->kname.off + k, cap);
        memcpy(buf + e->kname.off, e->kname.text, k);
        buf[e->kname.off + k] = 0;
    }
    return buf;
}

/* An action F of microbatch 2 on stage 1: RECV_F (no device work), F (two
 * kernels and an upload, launched through the runtime and the driver),
 * SEND_F (a download); then a W action; launches after the action's last
 * host op, and a kernel whose launch had no external id. Records arrive
 * interleaved, as CUPTI's buffers mix kinds and ops. */
Test(gputrace_records, spans_cover_each_ops_kernels_and_nothing_else) {
    gpu_recs r;
    gpu_recs_init(&r, 1000);
    gpu_seg segs[] = {
        seg(1, TRACE_RECV_F, 2, 1, 0, 1), seg(2, TRACE_F, 2, 1, -1, 1), seg(3, TRACE_SEND_F, 2, 1, 2, 1),
        seg(4, 0, 0, 0, -1, 0), /* after SEND_F until the action ended: no op */
        seg(5, TRACE_W, 0, 1, -1, 1),
    };
    const char *gemm = "ampere_sgemm_128x64_nn_with_a_name_longer_than_one_forty_byte_chunk_of_the_ring";
    add_ext(&r, 10, 2, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_api(&r, 10);
    add_kernel(&r, 31, "gelu_forward", 3, 5000, 5600); /* W's, first in the buffer */
    add_kernel(&r, 11, gemm, 3, 1200, 1900);
    add_ext(&r, 11, 2, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_memcpy(&r, 10, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, 1000, 1100);
    add_kernel(&r, 12, "gelu_forward", 3, 2000, 2500);
    add_ext(&r, 12, 2, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_ext(&r, 20, 3, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_memcpy(&r, 20, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, 2600, 2700);
    add_ext(&r, 25, 4, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_kernel(&r, 25, "late_kernel", 3, 2800, 2900);
    add_ext(&r, 31, 5, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_ext(&r, 40, 2, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1); /* another tool's kind: not ours */
    add_kernel(&r, 40, "adamw_step", 3, 6000, 6100);             /* so this one is uncorrelated */
    add_kernel(&r, 41, "bad_clock", 3, 7000, 6000);              /* end before start: lost */
    cr_assert_eq(r.lost, 1, "a record without usable times is counted as lost");

    sink s = {.n = 0};
    trace_event base = {.attempt = 1, .rank = 3, .step = 5};
    int32_t next = 0;
    gpu_recs_build(&r, segs, 5, &base, &next, collect, &s);

    cr_assert_null(find_span(&s, TRACE_RECV_F), "an op without device work gets no gpu span");
    const trace_event *f = find_span(&s, TRACE_F), *send = find_span(&s, TRACE_SEND_F), *w = find_span(&s, TRACE_W);
    cr_assert(f && send && w);
    cr_assert_eq(f->start_ns, 1000, "F starts with its first activity (the upload)");
    cr_assert_eq(f->end_ns, 2500, "F ends with its last kernel");
    cr_assert_eq(f->microbatch, 2);
    cr_assert_eq(f->stage, 1);
    cr_assert_eq(f->step, 5);
    cr_assert_eq(send->start_ns, 2600);
    cr_assert_eq(send->end_ns, 2700);
    cr_assert_eq(send->peer, 2, "the span keeps its host op's peer");
    cr_assert_eq(send->bytes, 4096);
    cr_assert_eq(w->start_ns, 5000);
    cr_assert_eq(w->end_ns, 5600);
    cr_assert(f->reserved > 0 && send->reserved > 0 && w->reserved > 0);
    cr_assert(f->reserved != send->reserved && send->reserved != w->reserved && f->reserved != w->reserved);
    cr_assert_eq(next, 3, "three spans numbered");

    /* Every kernel record follows its own span, and names precede use. */
    int kernels = 0, span = -1, in_f = 0, none = 0;
    char seen_name[256] = {0};
    for (size_t i = 0; i < s.n; i++) {
        const trace_event *e = &s.ev[i];
        if (e->phase == TRACE_KERNEL_NAME) {
            cr_assert_lt(e->kname.id, 256);
            seen_name[e->kname.id] = 1;
            continue;
        }
        if (e->source == TRACE_SRC_GPU && e->phase <= TRACE_OPT) {
            span = e->reserved;
            continue;
        }
        cr_assert_eq(e->phase, TRACE_KERNEL);
        kernels++;
        cr_assert(e->bytes < 256 && seen_name[e->bytes], "kernel %zu's name was sent before it", i);
        cr_assert_eq(e->reserved, e->reserved ? span : 0, "a kernel follows its span");
        cr_assert(e->start_ns >= 1000);
        if (e->reserved == f->reserved) {
            in_f++;
            cr_assert(e->start_ns >= f->start_ns && e->end_ns <= f->end_ns, "F's kernels lie inside its span");
            cr_assert_eq(e->microbatch, 2);
        }
        if (e->reserved == 0) {
            none++;
            cr_assert_eq(e->microbatch, -1, "no op, no microbatch");
        }
    }
    cr_assert_eq(kernels, 7, "every activity with times is a kernel record (4 kernels + 2 memcpys + 1 late)");
    cr_assert_eq(in_f, 3);
    cr_assert_eq(none, 2, "the kernel after the action's last op and the uncorrelated one belong to no op");

    char buf[512];
    int found_gemm = 0, found_htod = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.ev[i].phase != TRACE_KERNEL) continue;
        const char *nm = name_of(&s, s.ev[i].bytes, buf, sizeof buf);
        if (s.ev[i].start_ns == 1200) found_gemm = strcmp(nm, gemm) == 0;
        if (s.ev[i].start_ns == 1000) found_htod = strcmp(nm, "[memcpy HtoD]") == 0;
    }
    cr_assert(found_gemm, "a name longer than one chunk comes back whole");
    cr_assert(found_htod, "memcpys are named by direction");

    /* Next step: the same kernel name is not sent again; spans go on
     * numbering. */
    size_t names_before = 0;
    for (size_t i = 0; i < s.n; i++) names_before += s.ev[i].phase == TRACE_KERNEL_NAME;
    sink s2 = {.n = 0};
    gpu_seg segs2[] = {seg(6, TRACE_B, 1, 1, -1, 1)};
    add_ext(&r, 50, 6, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_kernel(&r, 50, "gelu_forward", 3, 9000, 9100);
    gpu_recs_build(&r, segs2, 1, &base, &next, collect, &s2);
    cr_assert_eq(s2.n, 2, "a span and its kernel, no name record (sent already)");
    cr_assert_eq(s2.ev[0].phase, TRACE_B);
    cr_assert_eq(s2.ev[0].reserved, 4);
    cr_assert_eq(s2.ev[1].reserved, 4);
    cr_assert(names_before >= 6);

    /* An empty step emits nothing. */
    sink s3 = {.n = 0};
    gpu_recs_build(&r, NULL, 0, &base, &next, collect, &s3);
    cr_assert_eq(s3.n, 0);
    gpu_recs_free(&r);
}

/* An overlapped pair (engine.c): thread A runs F of microbatch 4 on stage
 * 0 while thread B runs BW of microbatch 1 on stage 7, each on its stage's
 * stream. External ids come from one counter as the threads open their
 * segments (cupti.c), so the segments of the two actions interleave: A's
 * F (1), B's RECV_B (2) and BW (3), A's SEND_F (4), B's SEND_B (5), then
 * one open segment each after their last host op. The kernels of the two
 * streams run at the same time and arrive mixed; each span gets its own
 * thread's kernels, and the two spans overlap. */
Test(gputrace_records, two_actions_at_once_on_two_threads_get_a_span_each) {
    gpu_recs r;
    gpu_recs_init(&r, 1000);
    gpu_seg segs[] = {
        seg(1, TRACE_F, 4, 0, -1, 1),     seg(2, TRACE_RECV_B, 1, 7, 1, 1), seg(3, TRACE_BW, 1, 7, -1, 1),
        seg(4, TRACE_SEND_F, 4, 0, 1, 1), seg(5, TRACE_SEND_B, 1, 7, 1, 1), seg(6, 0, 0, 0, -1, 0),
        seg(7, 0, 0, 0, -1, 0),
    };
    static const struct { uint32_t corr; uint64_t ext; uint32_t stream; uint64_t start, end; } k[] = {
        {20, 1, 11, 1000, 1100}, {21, 3, 12, 1050, 1250}, {22, 1, 11, 1300, 1400}, {23, 3, 12, 1450, 1550},
        {24, 1, 11, 1600, 1700}, {25, 3, 12, 1650, 1900}, {26, 4, 13, 1800, 1850},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) { /* kernels before their correlations, mixed */
        add_kernel(&r, k[i].corr, k[i].stream == 11 ? "attention_forward" : "gelu_backward", k[i].stream,
                   k[i].start, k[i].end);
        if (i % 2 == 0) continue;
        add_ext(&r, k[i].corr, k[i].ext, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
        add_ext(&r, k[i - 1].corr, k[i - 1].ext, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    }
    add_ext(&r, 26, 4, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    sink s = {.n = 0};
    trace_event base = {.attempt = 1, .rank = 3, .step = 5};
    int32_t next = 0;
    gpu_recs_build(&r, segs, sizeof segs / sizeof *segs, &base, &next, collect, &s);
    const trace_event *f = find_span(&s, TRACE_F), *bw = find_span(&s, TRACE_BW), *sf = find_span(&s, TRACE_SEND_F);
    cr_assert(f && bw && sf, "spans of F, BW and SEND_F");
    cr_assert_null(find_span(&s, TRACE_RECV_B), "RECV_B launched nothing");
    cr_assert_null(find_span(&s, TRACE_SEND_B));
    cr_assert_eq(f->start_ns, 1000);
    cr_assert_eq(f->end_ns, 1700);
    cr_assert_eq(f->stage, 0);
    cr_assert_eq(f->microbatch, 4);
    cr_assert_eq(bw->start_ns, 1050);
    cr_assert_eq(bw->end_ns, 1900);
    cr_assert_eq(bw->stage, 7);
    cr_assert_eq(bw->microbatch, 1);
    cr_assert(f->start_ns < bw->end_ns && bw->start_ns < f->end_ns, "the pair's gpu spans overlap");
    cr_assert_eq(sf->start_ns, 1800);
    int kernels = 0;
    for (size_t i = 0; i < s.n; i++) {
        const trace_event *e = &s.ev[i];
        if (e->phase != TRACE_KERNEL) continue;
        kernels++;
        const trace_event *span = e->reserved == f->reserved ? f : e->reserved == bw->reserved ? bw : sf;
        cr_assert_eq(e->reserved, span->reserved, "kernel %llu-%llu belongs to a span", (unsigned long long)e->start_ns,
                     (unsigned long long)e->end_ns);
        cr_assert_eq(e->peer, span == f ? 11 : span == bw ? 12 : 13, "the stream of its own thread's stage");
        cr_assert(e->start_ns >= span->start_ns && e->end_ns <= span->end_ns);
        cr_assert_eq(e->stage, span->stage);
    }
    cr_assert_eq(kernels, 7);
    gpu_recs_free(&r);
}

/* A name whose records a full ring dropped is sent again with the name's
 * next kernel; otherwise that kernel name stays unknown for the attempt. */
Test(gputrace_records, a_dropped_name_is_sent_again) {
    gpu_recs r;
    gpu_recs_init(&r, 64);
    trace_event base = {.attempt = 1, .rank = 3, .step = 5};
    int32_t next = 1;
    gpu_seg segs[] = {seg(1, TRACE_F, 0, 0, -1, 1)};
    add_ext(&r, 10, 1, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_kernel(&r, 10, "layernorm_forward", 1, 1000, 1100);
    sink full = {.full = 1};
    gpu_recs_build(&r, segs, 1, &base, &next, collect, &full);

    sink s = {.n = 0};
    gpu_seg segs2[] = {seg(2, TRACE_F, 1, 0, -1, 1)};
    add_ext(&r, 11, 2, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
    add_kernel(&r, 11, "layernorm_forward", 1, 2000, 2100);
    gpu_recs_build(&r, segs2, 1, &base, &next, collect, &s);
    char buf[64];
    cr_assert_eq(s.n, 3, "span, name, kernel");
    cr_assert_str_eq(name_of(&s, s.ev[2].bytes, buf, sizeof buf), "layernorm_forward");
    gpu_recs_free(&r);
}

Test(gputrace_records, over_the_record_limit_is_counted_not_kept) {
    gpu_recs r;
    gpu_recs_init(&r, 3);
    for (uint32_t i = 0; i < 5; i++) add_kernel(&r, i, "k", 1, 100 + i, 200 + i);
    cr_assert_eq(r.nacts, 3);
    cr_assert_eq(r.lost, 2);
    gpu_recs_free(&r);
}

/* ---- libcupti on this machine -------------------------------------------- */

Test(gputrace, libcupti_loads_with_every_function_the_tracer_calls) {
    pp_err err = {{0}};
    cr_assert_eq(gputrace_available(&err), 0, "%s", err.msg);
}

/* Without a driver CUPTI cannot trace: open must fail with a reason (the
 * worker prints it and goes on with host spans), never crash or hang. */
Test(gputrace, open_without_a_device_fails_with_a_reason, .timeout = 60) {
    int count = 0;
    pp_err err = {{0}};
    if (gpu_device_count(&count, &err) == 0) cr_skip_test("a CUDA device is present (%d): CUPTI would open", count);
    trace_ring *ring;
    cr_assert_eq(trace_ring_create(64, &ring, &err), 0, "%s", err.msg);
    gputrace *g = (gputrace *)1;
    int rc = gputrace_open(ring, 0, 0, &g, &err);
    cr_log_info("gputrace_open without a device: %s", rc == 0 ? "opened" : err.msg);
    if (rc == 0) {
        /* CUPTI may accept the set-up before any device is touched; then the
         * step end (which synchronises the device) must turn it off cleanly:
         * training goes on, and nothing GPU-side reaches the trace. */
        cr_assert_not_null(g);
        cr_assert_eq(gputrace_step_end(g, 0, &err), 0);
        cr_assert_eq(trace_ring_pending(ring), 0, "no gpu records without a device");
        gputrace_close(g);
        cr_assert_eq(trace_ring_pending(ring), 0, "nothing left to flush either");
    } else {
        cr_assert_null(g);
        cr_assert(strncmp(err.msg, "CUPTI: ", 7) == 0, "the reason names CUPTI: %s", err.msg);
    }
    trace_ring_close(ring);
}

#else

Test(gputrace_records, needs_the_toolkit) { cr_skip_test("this pprun was built without the GPU backend"); }

Test(gputrace, open_says_the_backend_is_missing) {
    pp_err err = {{0}};
    gputrace *g = NULL;
    cr_assert_eq(gputrace_open(NULL, 0, 0, &g, &err), -1);
    cr_assert(strstr(err.msg, "built without the GPU backend") != NULL, "%s", err.msg);
}

#endif
