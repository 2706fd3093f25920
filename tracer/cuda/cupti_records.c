/* cupti_records.c: CUPTI activity records -> spans and kernel records (see
 * cupti_records.h). */
#include "tracer/cuda/cupti_records.h"

#include "base/pp.h"

#include <stdlib.h>
#include <string.h>

void gpu_recs_init(gpu_recs *r, size_t max_records) {
    memset(r, 0, sizeof *r);
    r->max_records = max_records;
}

void gpu_recs_free(gpu_recs *r) {
    for (size_t i = 0; i < r->nnames; i++) free(r->names[i]);
    free(r->names);
    free(r->sent);
    free(r->slots);
    free(r->acts);
    free(r->corrs);
    memset(r, 0, sizeof *r);
}

/* Id of name, interned on first sight; UINT32_MAX when out of memory. */
static uint32_t intern(gpu_recs *r, const char *name) {
    if (2 * (r->nnames + 1) > r->nslots) {
        size_t n = r->nslots ? 2 * r->nslots : 256;
        uint32_t *slots = calloc(n, sizeof *slots);
        if (!slots) return UINT32_MAX;
        for (size_t i = 0; i < r->nnames; i++) {
            size_t k = (size_t)pp_hash_str(r->names[i]) & (n - 1);
            while (slots[k]) k = (k + 1) & (n - 1);
            slots[k] = (uint32_t)i + 1;
        }
        free(r->slots);
        r->slots = slots;
        r->nslots = n;
    }
    size_t k = (size_t)pp_hash_str(name) & (r->nslots - 1);
    for (; r->slots[k]; k = (k + 1) & (r->nslots - 1))
        if (strcmp(r->names[r->slots[k] - 1], name) == 0) return r->slots[k] - 1;
    if (r->nnames == r->cap_names) {
        size_t n = r->cap_names ? 2 * r->cap_names : 64;
        char **names = realloc(r->names, n * sizeof *names);
        if (!names) return UINT32_MAX;
        r->names = names;
        unsigned char *sent = realloc(r->sent, n);
        if (!sent) return UINT32_MAX;
        r->sent = sent;
        r->cap_names = n;
    }
    char *copy = strdup(name);
    if (!copy) return UINT32_MAX;
    r->names[r->nnames] = copy;
    r->sent[r->nnames] = 0;
    r->slots[k] = (uint32_t)++r->nnames;
    return (uint32_t)r->nnames - 1;
}

static int room(void **arr, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return 0;
    size_t c = *cap ? 2 * *cap : 1024;
    void *p = realloc(*arr, c * size);
    if (!p) return -1;
    *arr = p;
    *cap = c;
    return 0;
}

static const char *memcpy_name(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[memcpy HtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy]";
    }
}

static void add_act(gpu_recs *r, uint32_t corr, const char *name, uint32_t stream, uint64_t start, uint64_t end) {
    if (start == 0 || end < start || r->nacts + r->ncorrs >= r->max_records ||
        room((void **)&r->acts, &r->cap_acts, r->nacts, sizeof *r->acts) != 0) {
        r->lost++;
        return;
    }
    uint32_t id = intern(r, name ? name : "(unnamed kernel)");
    if (id == UINT32_MAX) {
        r->lost++;
        return;
    }
    r->acts[r->nacts++] = (gpu_act){corr, id, stream, start, end};
}

void gpu_recs_add(gpu_recs *r, const CUpti_Activity *rec) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        add_act(r, k->correlationId, k->name, k->streamId, k->start, k->end);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
        add_act(r, m->correlationId, memcpy_name(m->copyKind), m->streamId, m->start, m->end);
        break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const CUpti_ActivityExternalCorrelation *x = (const CUpti_ActivityExternalCorrelation *)rec;
        if (x->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) break;
        if (r->nacts + r->ncorrs >= r->max_records ||
            room((void **)&r->corrs, &r->cap_corrs, r->ncorrs, sizeof *r->corrs) != 0) {
            r->lost++;
            break;
        }
        r->corrs[r->ncorrs++] = (gpu_corr){x->correlationId, x->externalId};
        break;
    }
    default:
        break; /* API records: only their external correlations matter */
    }
}

static int cmp_corr(const void *a, const void *b) {
    uint32_t x = ((const gpu_corr *)a)->corr, y = ((const gpu_corr *)b)->corr;
    return (x > y) - (x < y);
}

typedef struct keyed {
    size_t seg; /* index into segs, nsegs = no op */
    gpu_act a;
} keyed;

static int cmp_keyed(const void *pa, const void *pb) {
    const keyed *a = pa, *b = pb;
    if (a->seg != b->seg) return (a->seg > b->seg) - (a->seg < b->seg);
    if (a->a.start_ns != b->a.start_ns) return (a->a.start_ns > b->a.start_ns) - (a->a.start_ns < b->a.start_ns);
    return (a->a.end_ns > b->a.end_ns) - (a->a.end_ns < b->a.end_ns);
}

/* Index of the closed segment with ext_id, or nsegs. */
static size_t find_seg(const gpu_seg *segs, size_t nsegs, uint64_t ext) {
    size_t lo = 0, hi = nsegs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].ext_id < ext)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nsegs && segs[lo].ext_id == ext && segs[lo].closed ? lo : nsegs;
}

static void emit_name(gpu_recs *r, uint32_t id, const trace_event *base, gpu_emit_fn emit, void *ctx) {
    if (r->sent[id]) return;
    trace_event out[TRACE_NAME_RECORDS_MAX];
    size_t n = trace_name_records(base, id, r->names[id], out);
    int all = 1;
    for (size_t i = 0; i < n; i++) all &= emit(ctx, &out[i]);
    r->sent[id] = all; /* a dropped piece: send the whole name again with its next kernel */
}

void gpu_recs_build(gpu_recs *r, const gpu_seg *segs, size_t nsegs, const trace_event *base, int32_t *next_span,
                    gpu_emit_fn emit, void *ctx) {
    keyed *k = r->nacts ? malloc(r->nacts * sizeof *k) : NULL;
    if (r->nacts && !k) {
        r->lost += r->nacts;
        r->nacts = r->ncorrs = 0;
        return;
    }
    if (r->ncorrs > 1) qsort(r->corrs, r->ncorrs, sizeof *r->corrs, cmp_corr); /* never NULL to qsort */
    for (size_t i = 0; i < r->nacts; i++) {
        gpu_corr key = {r->acts[i].corr, 0};
        const gpu_corr *c = r->ncorrs ? bsearch(&key, r->corrs, r->ncorrs, sizeof key, cmp_corr) : NULL;
        k[i] = (keyed){c ? find_seg(segs, nsegs, c->ext_id) : nsegs, r->acts[i]};
    }
    if (r->nacts > 1) qsort(k, r->nacts, sizeof *k, cmp_keyed);
    for (size_t i = 0; i < r->nacts;) {
        size_t j = i;
        uint64_t start = k[i].a.start_ns, end = 0;
        for (; j < r->nacts && k[j].seg == k[i].seg; j++) {
            if (k[j].a.end_ns > end) end = k[j].a.end_ns;
            emit_name(r, k[j].a.name_id, base, emit, ctx);
        }
        trace_event kev = {
            .version = TRACE_EVENT_VERSION,
            .phase = TRACE_KERNEL,
            .source = TRACE_SRC_GPU,
            .attempt = base->attempt,
            .rank = base->rank,
            .step = base->step,
            .microbatch = -1,
            .stage = -1,
            .peer = -1,
        };
        if (k[i].seg < nsegs) {
            trace_event span = segs[k[i].seg].host;
            span.source = TRACE_SRC_GPU;
            span.start_ns = start;
            span.end_ns = end;
            span.reserved = ++*next_span;
            emit(ctx, &span);
            kev.step = span.step;
            kev.microbatch = span.microbatch;
            kev.stage = span.stage;
            kev.reserved = span.reserved;
        }
        for (; i < j; i++) {
            kev.start_ns = k[i].a.start_ns;
            kev.end_ns = k[i].a.end_ns;
            kev.peer = (int32_t)k[i].a.stream;
            kev.bytes = k[i].a.name_id;
            emit(ctx, &kev);
        }
    }
    free(k);
    r->nacts = r->ncorrs = 0;
}
