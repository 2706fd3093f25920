/* event.c: names of trace phases, as stored in the database. */
#include "tracer/event.h"

const char *trace_phase_name(int phase) {
    static const char *names[TRACE_PHASE_COUNT] = {"F",      "B",      "W",   "SEND_F", "RECV_F",
                                                   "SEND_B", "RECV_B", "OPT", "LOSS"};
    return phase >= 0 && phase < TRACE_PHASE_COUNT ? names[phase] : "?";
}
