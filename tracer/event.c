/* event.c: names of trace phases, as stored in the database, kernel and
 * span names cut into ring records, and the check of a record's times and bytes. */
#include "tracer/event.h"

#include <stdio.h>
#include <string.h>

int trace_offset_why(int64_t offset_ns, char *why, size_t n) {
    why[0] = '\0';
    if (offset_ns < -TRACE_OFFSET_MAX || offset_ns > TRACE_OFFSET_MAX)
        snprintf(why, n, "clock offset %lld ns: past +-%lld ns, more than any two clocks differ by",
                 (long long)offset_ns, (long long)TRACE_OFFSET_MAX);
    return why[0] != '\0';
}

int trace_record_why(const trace_event *e, int64_t offset_ns, char *why, size_t n) {
    int timeless = e->phase == TRACE_KERNEL_NAME || e->phase == TRACE_SPAN_NAME || e->phase == TRACE_SCHEDULE ||
                   e->phase == TRACE_PLAN;
    why[0] = '\0';
    if (timeless) return 0;
    if (e->start_ns > TRACE_TIME_MAX || e->end_ns > TRACE_TIME_MAX)
        snprintf(why, n, "%s %llu ns: past the largest time a record may carry (%lld ns)",
                 e->start_ns > TRACE_TIME_MAX ? "start_ns" : "end_ns",
                 (unsigned long long)(e->start_ns > TRACE_TIME_MAX ? e->start_ns : e->end_ns),
                 (long long)TRACE_TIME_MAX);
    else if (e->end_ns < e->start_ns)
        snprintf(why, n, "ends (%llu ns) before it starts (%llu ns)", (unsigned long long)e->end_ns,
                 (unsigned long long)e->start_ns);
    else if (e->phase < TRACE_LOSS && e->bytes > TRACE_BYTES_MAX)
        snprintf(why, n, "bytes %llu: more than 2^50 (1 PiB)", (unsigned long long)e->bytes);
    else if (!trace_offset_why(offset_ns, why, n)) {
        /* each side within its bound: the sums fit an int64 */
        int64_t s = (int64_t)e->start_ns + offset_ns, t = (int64_t)e->end_ns + offset_ns;
        if (s < 0 || t > TRACE_TIME_MAX)
            snprintf(why, n, "%s %lld ns on the job clock (its node's clock offset %lld ns added): outside 0..%lld ns",
                     s < 0 ? "start_ns" : "end_ns", (long long)(s < 0 ? s : t), (long long)offset_ns,
                     (long long)TRACE_TIME_MAX);
    }
    return why[0] != '\0';
}

const char *trace_phase_name(int phase) {
    static const char *names[TRACE_PHASE_COUNT] = {
        "F",      "B",           "W",           "SEND_F",      "RECV_F",    "SEND_B",   "RECV_B",
        "OPT",    "BW",          "SPAN",        "EVAL_F",      "EVAL_SEND_F", "EVAL_RECV_F", "LOSS",
        "KERNEL", "KERNEL_NAME", "GPU_DROPPED", "SPAN_NAME", "SCHEDULE", "PLAN", "EVAL_LOSS"};
    return phase >= 0 && phase < TRACE_PHASE_COUNT ? names[phase] : "?";
}

int trace_is_dp_span(const char *name) {
    static const char *const names[] = {"ALLREDUCE", "REDUCE_SCATTER", "ALL_GATHER"};
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) return 1;
    return 0;
}

size_t trace_name_records(const trace_event *base, uint32_t id, const char *name, trace_event *out) {
    trace_event gpu = *base;
    gpu.source = TRACE_SRC_GPU;
    return trace_name_records_of(TRACE_KERNEL_NAME, &gpu, id, name, out);
}

size_t trace_name_records_of(int phase, const trace_event *base, uint32_t id, const char *name, trace_event *out) {
    size_t len = strlen(name);
    if (len > TRACE_NAME_MAX) len = TRACE_NAME_MAX;
    size_t n = 0, off = 0;
    do { /* an empty name still gets one record, so the id is known */
        trace_event *e = &out[n++];
        memset(e, 0, sizeof *e);
        e->version = TRACE_EVENT_VERSION;
        e->phase = (uint8_t)phase;
        e->source = base->source;
        e->attempt = base->attempt;
        e->rank = base->rank;
        e->step = base->step;
        e->kname.id = id;
        e->kname.off = (uint16_t)off;
        e->kname.len = (uint16_t)len;
        size_t k = len - off < TRACE_NAME_CHUNK ? len - off : TRACE_NAME_CHUNK;
        memcpy(e->kname.text, name + off, k);
        off += k;
    } while (off < len);
    return n;
}
