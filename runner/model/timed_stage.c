/* timed_stage.c: the "timed" workload: every F, B and W sleeps exactly its
 * given time and real buffers of act bytes travel between stages, so that
 * schedules can be checked against their theory without compute noise.
 *
 * The bytes are checkable: the first stage's F starts from a pattern of
 * (mb, byte index) and every layer adds 1 (mod 256), so a stage knows what
 * its input must be and rejects a corrupted or misrouted activation; the
 * last stage's B starts a second pattern that every layer again adds 1 to on
 * the way down. The loss of a microbatch is the mean of the final bytes over
 * 256, divided by (1 + optimizer steps done), so it is the same for every
 * partition and falls step after step. Each layer has one weight whose
 * gradient from mb is (mb + 1) / 1000. With data parallelism mb is the
 * global microbatch index (model_global_mb), so every replica split of a
 * step moves the same bytes. */
#include "runner/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

struct timed_state {
    uint8_t **saved; /* [microbatches]: F's copy of its input, freed by W */
    size_t nsaved;   /* of them not NULL */
};

static uint8_t fwd_pattern(int mb, size_t i) { return (uint8_t)(mb * 131 + i * 7 + (i >> 8)); }
static uint8_t bwd_pattern(int mb, size_t i) { return (uint8_t)(mb * 17 + i * 3 + (i >> 9) + 101); }

int timed_stage_init(model_stage *s, pp_err *err) {
    timed_state *t = calloc(1, sizeof *t);
    if (t) t->saved = calloc((size_t)s->microbatches, sizeof *t->saved);
    if (!t || !t->saved) {
        free(t);
        return pp_fail(err, "timed: out of memory");
    }
    s->timed = t;
    for (size_t i = 0; i < s->nparams; i++) s->params[i] = 1.0f;
    return 0;
}

void timed_stage_free(model_stage *s) {
    timed_state *t = s->timed;
    if (!t) return;
    for (int i = 0; i < s->microbatches; i++) free(t->saved[i]);
    free(t->saved);
    free(t);
    s->timed = NULL;
}

size_t timed_stage_saved_bytes(const model_stage *s) {
    return s->timed ? s->timed->nsaved * (size_t)s->spec.act_bytes : 0;
}

/* Checks that buf holds pattern + shift at every byte. */
static int check_bytes(const uint8_t *buf, size_t n, uint8_t (*pattern)(int, size_t), int mb, int shift,
                       const char *what, pp_err *err) {
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (uint8_t)(pattern(mb, i) + shift))
            return pp_fail(err, "timed: %s of microbatch %d arrived corrupted at byte %zu of %zu (0x%02x, expected 0x%02x)",
                           what, mb, i, n, buf[i], (uint8_t)(pattern(mb, i) + shift));
    return 0;
}

int timed_stage_forward(model_stage *s, int mb, int gmb, const uint8_t *in, uint8_t *out, float *loss, pp_err *err) {
    timed_state *t = s->timed;
    size_t n = (size_t)s->spec.act_bytes;
    int layers = s->last_layer - s->first_layer;
    uint64_t t0 = pp_now_ns();
    if (!s->is_first && !in) return pp_fail(err, "timed: F of mb %d needs the previous stage's activation", mb);
    if (s->is_last ? !loss : !out) return pp_fail(err, "timed: F of mb %d needs %s", mb, s->is_last ? "a loss" : "an output buffer");
    uint8_t *x = malloc(n);
    if (!x) return pp_fail(err, "timed: out of memory for the activation of mb %d", mb);
    if (s->is_first) {
        for (size_t i = 0; i < n; i++) x[i] = fwd_pattern(gmb, i);
    } else {
        if (check_bytes(in, n, fwd_pattern, gmb, s->first_layer, "activation", err) != 0) {
            free(x);
            return -1;
        }
        memcpy(x, in, n);
    }
    if (s->is_last) {
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += (uint8_t)(x[i] + layers);
        *loss = (float)(sum / (double)n / 256.0 / (1.0 + s->steps_done));
    } else {
        for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(x[i] + layers);
    }
    t->saved[mb] = x;
    t->nsaved++;
    uint64_t spent = pp_now_ns() - t0;
    uint64_t want = (uint64_t)model_timed_op_ns(&s->spec, 0, layers);
    if (spent < want) pp_sleep_ns(want - spent);
    return 0;
}

int timed_stage_backward_input(model_stage *s, int mb, int gmb, const uint8_t *grad_out, uint8_t *grad_in,
                               pp_err *err) {
    size_t n = (size_t)s->spec.act_bytes;
    int layers = s->last_layer - s->first_layer;
    uint64_t t0 = pp_now_ns();
    if (!s->is_last && !grad_out) return pp_fail(err, "timed: B of mb %d needs the output gradient", mb);
    if (!s->is_first && !grad_in) return pp_fail(err, "timed: B of mb %d needs an input-gradient buffer", mb);
    if (!s->is_last &&
        check_bytes(grad_out, n, bwd_pattern, gmb, s->spec.layers - s->last_layer, "gradient", err) != 0)
        return -1;
    if (!s->is_first)
        for (size_t i = 0; i < n; i++)
            grad_in[i] = (uint8_t)((s->is_last ? bwd_pattern(gmb, i) : grad_out[i]) + layers);
    uint64_t spent = pp_now_ns() - t0;
    uint64_t want = (uint64_t)model_timed_op_ns(&s->spec, 1, layers);
    if (spent < want) pp_sleep_ns(want - spent);
    return 0;
}

int timed_stage_backward_weight(model_stage *s, int mb, int gmb, float *dst, pp_err *err) {
    (void)err;
    uint64_t t0 = pp_now_ns();
    for (size_t i = 0; i < s->nparams; i++) dst[i] = (float)(gmb + 1) / 1000.0f;
    if (s->timed->saved[mb]) s->timed->nsaved--;
    free(s->timed->saved[mb]);
    s->timed->saved[mb] = NULL;
    uint64_t spent = pp_now_ns() - t0;
    uint64_t want = (uint64_t)model_timed_op_ns(&s->spec, 2, s->last_layer - s->first_layer);
    if (spent < want) pp_sleep_ns(want - spent);
    return 0;
}

void timed_stage_discard(model_stage *s, int mb) {
    timed_state *t = s->timed;
    if (t->saved[mb]) t->nsaved--;
    free(t->saved[mb]);
    t->saved[mb] = NULL;
}
