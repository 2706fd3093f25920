/* model_spec.c: the --model text ("gpt:layers=8,dim=64" or "timed:f=2ms"),
 * its defaults, its canonical form and the sizes that follow from it. */
#include "config/model_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Defaults: one step of the default job (4 ranks on 2 cores, 8 microbatches)
 * costs about 0.5 s; see docs/model.md. */
static const model_spec gpt_defaults = {MODEL_GPT, 8, 64, 4, 64, 4, 0, 0, 0, 0, 0};
static const model_spec timed_defaults = {MODEL_TIMED, 32, 0, 0, 0, 0, 2000000, 2000000, 2000000, 65536, 0};

static int gpt_key(void *ctx, const char *key, const char *value, pp_err *err) {
    model_spec *sp = ctx;
    static const struct { const char *name; long min, max; size_t off; } keys[] = {
        {"layers", 1, 1024, offsetof(model_spec, layers)}, {"dim", 4, 8192, offsetof(model_spec, dim)},
        {"heads", 1, 256, offsetof(model_spec, heads)},    {"seq", 1, 8192, offsetof(model_spec, seq)},
        {"batch", 1, 4096, offsetof(model_spec, batch)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strcmp(key, keys[i].name) != 0) continue;
        char what[64];
        snprintf(what, sizeof what, "--model gpt: %s", key);
        long v;
        if (pp_parse_long(value, keys[i].min, keys[i].max, what, &v, err) != 0) return -1;
        *(int *)((char *)sp + keys[i].off) = (int)v;
        return 0;
    }
    return pp_fail(err, "--model gpt: unknown key '%s'; accepted: layers, dim, heads, seq, batch", key);
}

static int timed_key(void *ctx, const char *key, const char *value, pp_err *err) {
    model_spec *sp = ctx;
    char what[64];
    snprintf(what, sizeof what, "--model timed: %s", key);
    uint64_t *dur = !strcmp(key, "f") ? &sp->f_ns : !strcmp(key, "b") ? &sp->b_ns : !strcmp(key, "w") ? &sp->w_ns : NULL;
    if (dur) return pp_parse_duration_ns(value, what, dur, err);
    if (!strcmp(key, "act")) {
        if (pp_parse_size(value, what, &sp->act_bytes, err) != 0) return -1;
        if (sp->act_bytes < 1 || sp->act_bytes > (1ull << 30))
            return pp_fail(err, "%s: %s is out of range; accepted: 1 byte to 1GiB", what, value);
        return 0;
    }
    if (!strcmp(key, "layers")) {
        long v;
        if (pp_parse_long(value, 1, 1024, what, &v, err) != 0) return -1;
        sp->layers = (int)v;
        return 0;
    }
    if (!strcmp(key, "per")) {
        if (strcmp(value, "stage") != 0 && strcmp(value, "layer") != 0)
            return pp_fail(err, "%s: '%s' is not a unit; accepted: stage (f, b, w are a stage's), layer (one "
                                "layer's: a stage's ops cost them times its layers)", what, value);
        sp->per_layer = value[0] == 'l';
        return 0;
    }
    return pp_fail(err, "--model timed: unknown key '%s'; accepted: f, b, w, act, layers, per", key);
}

int model_parse_spec(const char *text, model_spec *out, pp_err *err) {
    if (!text) text = "gpt";
    const char *colon = strchr(text, ':');
    size_t kind_len = colon ? (size_t)(colon - text) : strlen(text);
    model_spec sp;
    int (*fn)(void *, const char *, const char *, pp_err *);
    if (kind_len == 3 && !strncmp(text, "gpt", 3)) {
        sp = gpt_defaults, fn = gpt_key;
    } else if (kind_len == 5 && !strncmp(text, "timed", 5)) {
        sp = timed_defaults, fn = timed_key;
    } else {
        return pp_fail(err, "--model: unknown model '%.*s'; accepted: gpt[:layers=L,dim=D,heads=H,seq=T,batch=N], "
                            "timed[:f=2ms,b=2ms,w=2ms,act=64KiB,layers=K,per=stage|layer]",
                       (int)kind_len, text);
    }
    if (colon) {
        char *copy = strdup(colon + 1);
        if (!copy) return pp_fail(err, "--model: out of memory");
        int rc = pp_parse_kv_list(copy, "--model", fn, &sp, err);
        free(copy);
        if (rc != 0) return -1;
    }
    if (sp.kind == MODEL_GPT && sp.dim % sp.heads != 0)
        return pp_fail(err, "--model gpt: dim (%d) must be a multiple of heads (%d)", sp.dim, sp.heads);
    *out = sp;
    return 0;
}

void model_spec_format(const model_spec *sp, char *buf, size_t n) {
    if (sp->kind == MODEL_GPT)
        snprintf(buf, n, "gpt:layers=%d,dim=%d,heads=%d,seq=%d,batch=%d", sp->layers, sp->dim, sp->heads, sp->seq,
                 sp->batch);
    else
        /* per=stage, the default, is left out: the text of jobs recorded
         * before per= existed stays the canonical text of the same model */
        snprintf(buf, n, "timed:f=%lluns,b=%lluns,w=%lluns,act=%llu,layers=%d%s", (unsigned long long)sp->f_ns,
                 (unsigned long long)sp->b_ns, (unsigned long long)sp->w_ns, (unsigned long long)sp->act_bytes,
                 sp->layers, sp->per_layer ? ",per=layer" : "");
}

double model_timed_op_ns(const model_spec *sp, int op, double layers) {
    double ns = (double)(op == 0 ? sp->f_ns : op == 1 ? sp->b_ns : sp->w_ns);
    return sp->per_layer ? ns * layers : ns;
}

size_t model_boundary_bytes(const model_spec *sp) {
    if (sp->kind == MODEL_TIMED) return (size_t)sp->act_bytes;
    return sizeof(float) * (size_t)sp->batch * sp->seq * sp->dim;
}

size_t model_tokens_per_microbatch(const model_spec *sp) {
    return sp->kind == MODEL_GPT ? (size_t)sp->batch * sp->seq : 0;
}

void model_optim_default(model_optim *opt) {
    opt->kind = MODEL_ADAMW;
    opt->lr = 1e-3f;
    opt->beta1 = 0.9f;
    opt->beta2 = 0.95f;
    opt->eps = 1e-8f;
    opt->weight_decay = 0.0f;
}
