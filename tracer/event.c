/* event.c: names of trace phases, as stored in the database, and kernel
 * and span names cut into ring records. */
#include "tracer/event.h"

#include <string.h>

const char *trace_phase_name(int phase) {
    static const char *names[TRACE_PHASE_COUNT] = {
        "F",      "B",           "W",           "SEND_F",      "RECV_F",    "SEND_B",   "RECV_B",
        "OPT",    "BW",          "SPAN",        "EVAL_F",      "EVAL_SEND_F", "EVAL_RECV_F", "LOSS",
        "KERNEL", "KERNEL_NAME", "GPU_DROPPED", "SPAN_NAME", "SCHEDULE", "PLAN", "EVAL_LOSS"};
    return phase >= 0 && phase < TRACE_PHASE_COUNT ? names[phase] : "?";
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
