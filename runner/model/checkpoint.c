/* checkpoint.c: a stage's weights, optimizer state and step count in one
 * file, with a header naming the model spec and layer range so that a load
 * into the wrong stage fails and says what differs. The caller makes the
 * write atomic (temporary file, fsync, rename).
 *
 * Layout (native byte order): header, params, adam_m, adam_v (nparams floats
 * each), FNV-1a 64 of the three arrays. */
#include "runner/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

#define CKPT_MAGIC "PPRUNCK1"
#define CKPT_VERSION 1u

typedef struct ckpt_header {
    char magic[8];
    uint32_t version;
    int32_t first_layer, last_layer, is_first, is_last, steps_done;
    uint64_t nparams;
    char spec[200];
} ckpt_header;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int idle(const model_stage *s, const char *what, pp_err *err) {
    for (int i = 0; i < s->microbatches; i++)
        if (s->mb_state[i] != MB_EMPTY || s->pending[i])
            return pp_fail(err, "checkpoint %s: microbatch %d is in flight; checkpoints are taken between steps", what,
                           i);
    return 0;
}

int model_stage_save(const model_stage *s, FILE *f, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && gpu_stage_fetch_state(s, err) != 0) return pp_wrap(err, "checkpoint save");
#endif
    if (idle(s, "save", err) != 0) return -1;
    ckpt_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.first_layer = s->first_layer, h.last_layer = s->last_layer;
    h.is_first = s->is_first, h.is_last = s->is_last, h.steps_done = s->steps_done;
    h.nparams = s->nparams;
    model_spec_format(&s->spec, h.spec, sizeof h.spec);
    size_t n = s->nparams;
    uint64_t sum = 0xcbf29ce484222325ull;
    const float *arrays[3] = {s->params, s->adam_m, s->adam_v};
    if (fwrite(&h, sizeof h, 1, f) != 1) return pp_fail(err, "checkpoint save: write failed (disk full?)");
    for (int i = 0; i < 3; i++) {
        if (fwrite(arrays[i], sizeof(float), n, f) != n) return pp_fail(err, "checkpoint save: write failed (disk full?)");
        sum = fnv(sum, arrays[i], sizeof(float) * n);
    }
    if (fwrite(&sum, sizeof sum, 1, f) != 1 || fflush(f) != 0)
        return pp_fail(err, "checkpoint save: write failed (disk full?)");
    return 0;
}

int model_stage_load(model_stage *s, FILE *f, pp_err *err) {
    if (idle(s, "load", err) != 0) return -1;
    ckpt_header h;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        return pp_fail(err, "checkpoint load: not a pprun stage checkpoint (bad or missing header)");
    if (h.version != CKPT_VERSION)
        return pp_fail(err, "checkpoint load: format version %u, this pprun reads version %u", h.version, CKPT_VERSION);
    h.spec[sizeof h.spec - 1] = '\0';
    char spec[200];
    model_spec_format(&s->spec, spec, sizeof spec);
    if (strcmp(spec, h.spec) != 0)
        return pp_fail(err, "checkpoint load: written for model '%s', this job runs '%s'", h.spec, spec);
    if (h.first_layer != s->first_layer || h.last_layer != s->last_layer)
        return pp_fail(err, "checkpoint load: holds layers [%d, %d), this stage holds layers [%d, %d)", h.first_layer,
                       h.last_layer, s->first_layer, s->last_layer);
    if (h.is_first != s->is_first || h.is_last != s->is_last)
        return pp_fail(err, "checkpoint load: written for a stage %s the embeddings and %s the head, this stage %s and %s",
                       h.is_first ? "with" : "without", h.is_last ? "with" : "without",
                       s->is_first ? "has them" : "has no embeddings", s->is_last ? "has the head" : "has no head");
    if (h.nparams != s->nparams)
        return pp_fail(err, "checkpoint load: holds %llu weights, this stage has %zu", (unsigned long long)h.nparams,
                       s->nparams);
    if (h.steps_done < 0 || h.steps_done > (1 << 24))
        return pp_fail(err, "checkpoint load: its step count %d is out of range; accepted: 0 to %d (the header is "
                            "corrupted)", h.steps_done, 1 << 24);
    size_t n = s->nparams;
    float *buf = malloc(sizeof(float) * 3 * (n ? n : 1));
    if (!buf) return pp_fail(err, "checkpoint load: out of memory");
    uint64_t sum = 0xcbf29ce484222325ull, stored;
    if (fread(buf, sizeof(float), 3 * n, f) != 3 * n || fread(&stored, sizeof stored, 1, f) != 1) {
        free(buf);
        return pp_fail(err, "checkpoint load: file is truncated");
    }
    if (fgetc(f) != EOF) {
        free(buf);
        return pp_fail(err, "checkpoint load: bytes after the checksum (the file is longer than one checkpoint)");
    }
    sum = fnv(sum, buf, sizeof(float) * 3 * n);
    if (sum != stored) {
        free(buf);
        return pp_fail(err, "checkpoint load: checksum mismatch (the file is corrupted)");
    }
    /* only now change the stage: a failed load leaves it as it was */
    memcpy(s->params, buf, sizeof(float) * n);
    memcpy(s->adam_m, buf + n, sizeof(float) * n);
    memcpy(s->adam_v, buf + 2 * n, sizeof(float) * n);
    memset(s->grad, 0, sizeof(float) * n);
    s->next_acc = 0;
    s->steps_done = h.steps_done;
    free(buf);
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_upload(s, err); /* the device computes with what was loaded */
#endif
    return 0;
}
