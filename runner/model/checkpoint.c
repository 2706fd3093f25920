/* checkpoint.c: a model's weights and optimizer state on disk, by layer
 * (docs/checkpoint.md). A stage saves its units; a set of stage files of
 * any layout, or one merged file, is read back into a stage of any other
 * layout; a set is written out again as one file (pprun checkpoint merge).
 *
 * A unit is what no partition splits: "embeddings", "block.L" (layer L)
 * and "head" for gpt, "block.L" (its one weight) for timed. A stage's
 * weights are its units' in model order, so a unit is a slice of the
 * stage's params, adam_m and adam_v at the same offset.
 *
 * Version 2 (written): a 512-byte header (magic, version, byte order, steps
 * done, which stage of how many wrote it, the unit count, the canonical
 * model spec, the run), a table of units (name, weight count, FNV-1a 64 of
 * the unit's bytes), FNV-1a 64 of header and table, then each unit's
 * weights, AdamW m and AdamW v. Version 1 (read only): a header naming the
 * layer range and role, params, adam_m, adam_v of the whole stage, FNV-1a
 * 64 of the three; its units are derived from the layer range.
 *
 * Native byte order (the header's byte-order word refuses a file of the
 * other one). The caller makes a write atomic (file_output: temporary file,
 * fsync, rename). */
#include "runner/model/model_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"

#define CK1_MAGIC "PPRUNCK1"
#define CK2_MAGIC "PPRUNCK2"
#define CK_BYTE_ORDER 0x01020304u
#define CK_STEPS_MAX (1 << 24)
#define CK_STAGES_MAX (1 << 20)
#define VOCAB 256

typedef struct ck1_header {
    char magic[8];
    uint32_t version;
    int32_t first_layer, last_layer, is_first, is_last, steps_done;
    uint64_t nparams;
    char spec[200];
} ck1_header;

typedef struct ck2_header {
    char magic[8];
    uint32_t version;    /* 2 */
    uint32_t byte_order; /* CK_BYTE_ORDER as the writer stored it */
    int32_t steps_done;  /* optimizer steps applied: the step a job continues from */
    int32_t stage, stages; /* the stage of the writer's layout, of how many (a merged file: 0 of 1) */
    uint32_t nunits;
    char spec[256];   /* model_spec_format */
    char run_id[224]; /* the run that wrote it; "" outside pprun run */
} ck2_header;
_Static_assert(sizeof(ck2_header) == 512, "the version 2 header is 512 bytes (docs/checkpoint.md)");

typedef struct ck2_unit {
    char name[32];
    uint64_t count; /* weights; the unit's bytes are 3 * 4 * count (weights, m, v) */
    uint64_t sum;   /* FNV-1a 64 of those bytes */
} ck2_unit;
_Static_assert(sizeof(ck2_unit) == 48, "a unit's table entry is 48 bytes (docs/checkpoint.md)");

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

/* ---- the units of a model ------------------------------------------------- */

static int units_of_model(const model_spec *sp) { return sp->kind == MODEL_GPT ? sp->layers + 2 : sp->layers; }

static void unit_name(const model_spec *sp, int u, char *buf, size_t n) {
    if (sp->kind == MODEL_GPT && u == 0)
        snprintf(buf, n, "embeddings");
    else if (sp->kind == MODEL_GPT && u == sp->layers + 1)
        snprintf(buf, n, "head");
    else
        snprintf(buf, n, "block.%d", sp->kind == MODEL_GPT ? u - 1 : u);
}

/* The unit's index in model order, or -1 when the model has no such unit. */
static int unit_index(const model_spec *sp, const char *name) {
    for (int u = 0; u < units_of_model(sp); u++) {
        char nm[32];
        unit_name(sp, u, nm, sizeof nm);
        if (strcmp(nm, name) == 0) return u;
    }
    return -1;
}

static uint64_t unit_count(const model_spec *sp, int u) {
    if (sp->kind != MODEL_GPT) return 1;
    uint64_t C = (uint64_t)sp->dim;
    if (u == 0) return VOCAB * C + (uint64_t)sp->seq * C;
    if (u == sp->layers + 1) return 2 * C + VOCAB * C;
    return gpt_param_count(sp, 0, 1, 0, 0);
}

/* The stage's units in model order (its params' order); returns the count. */
static int stage_units(const model_stage *s, int *u) {
    int n = 0, gpt = s->spec.kind == MODEL_GPT;
    if (gpt && s->is_first) u[n++] = 0;
    for (int l = s->first_layer; l < s->last_layer; l++) u[n++] = gpt ? l + 1 : l;
    if (gpt && s->is_last) u[n++] = s->spec.layers + 1;
    return n;
}

/* ---- saving ------------------------------------------------------------------- */

static int idle(const model_stage *s, const char *what, pp_err *err) {
    for (int i = 0; i < s->microbatches; i++)
        if (s->mb_state[i] != MB_EMPTY || s->pending[i])
            return pp_fail(err, "checkpoint %s: microbatch %d is in flight; checkpoints are taken between steps", what,
                           i);
    return 0;
}

static int write_all(FILE *f, const void *p, size_t size, size_t n, pp_err *err) {
    if (n && fwrite(p, size, n, f) != n) return pp_fail(err, "checkpoint save: write failed: %s", strerror(errno));
    return 0;
}

/* Header, table and its checksum of a version 2 file. */
static int write_head(FILE *f, const ck2_header *h, const ck2_unit *units, pp_err *err) {
    uint64_t sum = fnv(fnv(FNV_START, h, sizeof *h), units, sizeof *units * h->nunits);
    if (write_all(f, h, sizeof *h, 1, err) || write_all(f, units, sizeof *units, h->nunits, err) ||
        write_all(f, &sum, sizeof sum, 1, err))
        return -1;
    return 0;
}

static void header_for(ck2_header *h, const model_spec *spec, int steps_done, int stage, int stages,
                       const char *run_id, int nunits) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, CK2_MAGIC, 8);
    h->version = 2;
    h->byte_order = CK_BYTE_ORDER;
    h->steps_done = steps_done;
    h->stage = stage, h->stages = stages;
    h->nunits = (uint32_t)nunits;
    model_spec_format(spec, h->spec, sizeof h->spec);
    snprintf(h->run_id, sizeof h->run_id, "%s", run_id ? run_id : "");
}

int model_stage_save_as(const model_stage *s, const model_ckpt_tag *tag, FILE *f, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && gpu_stage_fetch_state(s, err) != 0) return pp_wrap(err, "checkpoint save");
#endif
    if (idle(s, "save", err) != 0) return -1;
    int u[1024 + 2], n = stage_units(s, u);
    ck2_unit table[1024 + 2];
    memset(table, 0, sizeof table);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        uint64_t c = unit_count(&s->spec, u[i]);
        unit_name(&s->spec, u[i], table[i].name, sizeof table[i].name);
        table[i].count = c;
        uint64_t sum = fnv(FNV_START, s->params + at, sizeof(float) * c);
        sum = fnv(sum, s->adam_m + at, sizeof(float) * c);
        table[i].sum = fnv(sum, s->adam_v + at, sizeof(float) * c);
        at += c;
    }
    if (at != s->nparams) return pp_fail(err, "checkpoint save: the units hold %llu weights, the stage %zu",
                                         (unsigned long long)at, s->nparams);
    ck2_header h;
    header_for(&h, &s->spec, s->steps_done, tag ? tag->stage : 0, tag ? tag->stages : 1, tag ? tag->run_id : NULL, n);
    if (write_head(f, &h, table, err) != 0) return -1;
    at = 0;
    for (int i = 0; i < n; i++) {
        size_t c = (size_t)table[i].count;
        if (write_all(f, s->params + at, sizeof(float), c, err) ||
            write_all(f, s->adam_m + at, sizeof(float), c, err) || write_all(f, s->adam_v + at, sizeof(float), c, err))
            return -1;
        at += c;
    }
    if (fflush(f) != 0) return pp_fail(err, "checkpoint save: write failed: %s", strerror(errno));
    return 0;
}

int model_stage_save(const model_stage *s, FILE *f, pp_err *err) { return model_stage_save_as(s, NULL, f, err); }

/* ---- reading: a set of files ------------------------------------------------ */

typedef struct ck_unit {
    int file;        /* -1: the set does not hold the unit */
    uint64_t count, sum;
    int64_t offset;  /* version 2: the byte where the unit starts; version 1: its first weight's index */
} ck_unit;

typedef struct ck_file {
    FILE *f;
    int own;        /* the set closes f */
    char name[512]; /* for messages */
    float *v1;      /* version 1: params, adam_m, adam_v of the whole file, checked */
    uint64_t v1_n;
} ck_file;

struct model_ckpt {
    model_spec spec;
    char spec_text[256], run_id[224];
    int version, steps_done, stages;
    int nfiles, cap;
    ck_file *files;
    int next;        /* the unit the next file must start with */
    ck_unit *units;  /* [units_of_model(spec)] */
};

int model_ckpt_create(model_ckpt **out, pp_err *err) {
    if (!(*out = calloc(1, sizeof **out))) return pp_fail(err, "checkpoint: out of memory");
    return 0;
}

void model_ckpt_free(model_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->nfiles; i++) {
        if (c->files[i].own) fclose(c->files[i].f);
        free(c->files[i].v1);
    }
    free(c->files);
    free(c->units);
    free(c);
}

int model_ckpt_complete(const model_ckpt *c) { return c->units && c->next == units_of_model(&c->spec); }
int model_ckpt_stages(const model_ckpt *c) { return c->stages; }
int model_ckpt_steps_done(const model_ckpt *c) { return c->steps_done; }
const char *model_ckpt_spec(const model_ckpt *c) { return c->spec_text; }
const char *model_ckpt_run_id(const model_ckpt *c) { return c->run_id; }
size_t model_ckpt_weight_count(const model_ckpt *c) {
    size_t n = 0;
    for (int u = 0; c->units && u < units_of_model(&c->spec); u++)
        if (c->units[u].file >= 0) n += (size_t)c->units[u].count;
    return n;
}

/* What one file says about itself before it joins the set. */
typedef struct ck_head {
    int version, steps_done, stage, stages;
    char spec[256], run_id[224];
    model_spec sp;
    int first_unit, nunits;  /* consecutive units from first_unit */
    uint64_t count[1024 + 2], sum[1024 + 2];
    int64_t offset[1024 + 2];
    float *v1;
    uint64_t v1_n;
} ck_head;

static int file_size(FILE *f, const char *name, uint64_t *size, pp_err *err) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return pp_fail(err, "%s: %s", name, strerror(errno));
    *size = (uint64_t)st.st_size;
    return 0;
}

static int spec_of(const char *text, const char *name, model_spec *sp, pp_err *err) {
    pp_err why;
    if (model_parse_spec(text, sp, &why) != 0)
        return pp_fail(err, "%s: its model '%s' is no model this pprun knows (%s)", name, text, why.msg);
    return 0;
}

/* Version 1: the whole stage's arrays, read and checked now. */
static int read_v1(FILE *f, const char *name, ck_head *h, pp_err *err) {
    ck1_header v;
    memcpy(v.magic, CK1_MAGIC, 8);
    if (fread((char *)&v + 8, sizeof v - 8, 1, f) != 1)
        return pp_fail(err, "%s: not a pprun stage checkpoint (bad or missing header)", name);
    if (v.version != 1)
        return pp_fail(err, "%s: format version %u, this pprun reads versions 1 and 2", name, v.version);
    v.spec[sizeof v.spec - 1] = '\0';
    if (v.steps_done < 0 || v.steps_done > CK_STEPS_MAX)
        return pp_fail(err, "%s: its step count %d is out of range; accepted: 0 to %d (the header is corrupted)", name,
                       v.steps_done, CK_STEPS_MAX);
    if (spec_of(v.spec, name, &h->sp, err) != 0) return -1;
    int gpt = h->sp.kind == MODEL_GPT;
    if (v.first_layer < 0 || v.last_layer > h->sp.layers || v.first_layer > v.last_layer)
        return pp_fail(err, "%s: its layers [%d, %d) are not layers of its model '%s' (the header is corrupted)", name,
                       v.first_layer, v.last_layer, v.spec);
    h->version = 1, h->steps_done = v.steps_done, h->stage = -1, h->stages = 0;
    snprintf(h->spec, sizeof h->spec, "%s", v.spec);
    h->run_id[0] = '\0';
    h->first_unit = gpt ? (v.is_first ? 0 : v.first_layer + 1) : v.first_layer;
    h->nunits = v.last_layer - v.first_layer + (gpt && v.is_first) + (gpt && v.is_last);
    if (gpt && v.is_first && v.first_layer != 0)
        return pp_fail(err, "%s: holds the embeddings and layers [%d, %d): not one run of units", name, v.first_layer,
                       v.last_layer);
    uint64_t n = 0;
    for (int i = 0; i < h->nunits; i++) {
        h->count[i] = unit_count(&h->sp, h->first_unit + i);
        h->offset[i] = (int64_t)n;
        n += h->count[i];
    }
    if (v.nparams != n)
        return pp_fail(err, "%s: holds %llu weights, its layers have %llu (the header is corrupted)", name,
                       (unsigned long long)v.nparams, (unsigned long long)n);
    float *buf = malloc(sizeof(float) * 3 * (n ? n : 1));
    if (!buf) return pp_fail(err, "%s: out of memory", name);
    uint64_t stored;
    if (fread(buf, sizeof(float), 3 * n, f) != 3 * n || fread(&stored, sizeof stored, 1, f) != 1) {
        free(buf);
        return pp_fail(err, "%s: file is truncated", name);
    }
    if (fgetc(f) != EOF) {
        free(buf);
        return pp_fail(err, "%s: bytes after the checksum (the file is longer than one checkpoint)", name);
    }
    if (fnv(FNV_START, buf, sizeof(float) * 3 * n) != stored) {
        free(buf);
        return pp_fail(err, "%s: checksum mismatch (the file is corrupted)", name);
    }
    h->v1 = buf, h->v1_n = n;
    return 0;
}

static int read_v2(FILE *f, const char *name, ck_head *h, pp_err *err) {
    ck2_header v;
    memcpy(v.magic, CK2_MAGIC, 8);
    if (fread((char *)&v + 8, sizeof v - 8, 1, f) != 1)
        return pp_fail(err, "%s: not a pprun checkpoint (bad or missing header)", name);
    if (v.version != 2)
        return pp_fail(err, "%s: format version %u, this pprun reads versions 1 and 2", name, v.version);
    if (v.byte_order != CK_BYTE_ORDER)
        return pp_fail(err, "%s: written on a machine of the other byte order", name);
    /* The text fields end within their bytes, as every writer leaves them:
     * checked, not cut short in place, as the header's checksum is over
     * the bytes the file holds (a run field cut short was called a
     * checksum mismatch). */
    const struct {
        const char *what, *text;
        size_t at, size;
    } texts[] = {{"model spec", v.spec, offsetof(ck2_header, spec), sizeof v.spec},
                 {"run", v.run_id, offsetof(ck2_header, run_id), sizeof v.run_id}};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (!memchr(texts[i].text, '\0', texts[i].size))
            return pp_fail(err, "%s: its %s field (bytes %zu to %zu) holds no NUL: a text of at most %zu bytes ends "
                                "within it (the header is corrupted)", name, texts[i].what, texts[i].at,
                           texts[i].at + texts[i].size - 1, texts[i].size - 1);
    if (v.steps_done < 0 || v.steps_done > CK_STEPS_MAX)
        return pp_fail(err, "%s: its step count %d is out of range; accepted: 0 to %d (the header is corrupted)", name,
                       v.steps_done, CK_STEPS_MAX);
    if (v.stages < 1 || v.stages > CK_STAGES_MAX || v.stage < 0 || v.stage >= v.stages)
        return pp_fail(err, "%s: stage %d of %d is out of range (the header is corrupted)", name, v.stage, v.stages);
    if (spec_of(v.spec, name, &h->sp, err) != 0) return -1;
    if (v.nunits > (uint32_t)units_of_model(&h->sp))
        return pp_fail(err, "%s: %u units, its model '%s' has %d (the header is corrupted)", name, v.nunits, v.spec,
                       units_of_model(&h->sp));
    ck2_unit table[1024 + 2];
    uint64_t stored;
    if (fread(table, sizeof *table, v.nunits, f) != v.nunits || fread(&stored, sizeof stored, 1, f) != 1)
        return pp_fail(err, "%s: file is truncated", name);
    h->version = 2, h->steps_done = v.steps_done, h->stage = v.stage, h->stages = v.stages;
    snprintf(h->spec, sizeof h->spec, "%s", v.spec);
    snprintf(h->run_id, sizeof h->run_id, "%s", v.run_id);
    h->nunits = (int)v.nunits;
    int64_t at = (int64_t)(sizeof v + sizeof *table * v.nunits + sizeof stored);
    for (int i = 0; i < h->nunits; i++) {
        table[i].name[sizeof table[i].name - 1] = '\0';
        int u = unit_index(&h->sp, table[i].name);
        if (u < 0) return pp_fail(err, "%s: unit '%s' is not a unit of its model '%s'", name, table[i].name, v.spec);
        if (i == 0) h->first_unit = u;
        if (u != h->first_unit + i)
            return pp_fail(err, "%s: unit '%s' does not follow the unit before it in model order", name, table[i].name);
        if (table[i].count != unit_count(&h->sp, u))
            return pp_fail(err, "%s: unit '%s' holds %llu weights, its model's has %llu", name, table[i].name,
                           (unsigned long long)table[i].count, (unsigned long long)unit_count(&h->sp, u));
        h->count[i] = table[i].count, h->sum[i] = table[i].sum, h->offset[i] = at;
        at += (int64_t)(3 * sizeof(float) * table[i].count);
    }
    if (fnv(fnv(FNV_START, &v, sizeof v), table, sizeof *table * v.nunits) != stored)
        return pp_fail(err, "%s: checksum mismatch (its header is corrupted)", name);
    uint64_t size = 0;
    if (file_size(f, name, &size, err) != 0) return -1;
    if (size < (uint64_t)at)
        return pp_fail(err, "%s: file is truncated (%llu bytes, its units end at %lld)", name,
                       (unsigned long long)size, (long long)at);
    if (size > (uint64_t)at)
        return pp_fail(err, "%s: bytes after its last unit (the file is longer than one checkpoint)", name);
    return 0;
}

static int read_head(FILE *f, const char *name, ck_head *h, pp_err *err) {
    char magic[8];
    memset(h, 0, sizeof *h);
    if (fread(magic, 8, 1, f) != 1)
        return pp_fail(err, "%s: not a pprun stage checkpoint (bad or missing header)", name);
    if (memcmp(magic, CK1_MAGIC, 8) == 0) return read_v1(f, name, h, err);
    if (memcmp(magic, CK2_MAGIC, 8) == 0) return read_v2(f, name, h, err);
    return pp_fail(err, "%s: not a pprun stage checkpoint (bad or missing header)", name);
}

/* f joins the set as its next file (own: the set closes it); alone: a set
 * of this one file, which may start at any unit (model_stage_load). */
static int add_stream(model_ckpt *c, FILE *f, const char *name, int own, int alone, pp_err *err) {
    ck_head *h = malloc(sizeof *h);
    if (!h) return pp_fail(err, "%s: out of memory", name);
    int rc = read_head(f, name, h, err), next = c->next;
    if (rc == 0 && c->nfiles == 0) {
        c->spec = h->sp;
        snprintf(c->spec_text, sizeof c->spec_text, "%s", h->spec);
        snprintf(c->run_id, sizeof c->run_id, "%s", h->run_id);
        c->version = h->version, c->steps_done = h->steps_done, c->stages = h->stages;
        int n = units_of_model(&c->spec);
        if (!(c->units = malloc(sizeof *c->units * (size_t)n))) rc = pp_fail(err, "%s: out of memory", name);
        for (int u = 0; rc == 0 && u < n; u++) c->units[u].file = -1;
    } else if (rc == 0) {
        const char *first = c->files[0].name;
        if (strcmp(h->spec, c->spec_text) != 0)
            rc = pp_fail(err, "%s is for model '%s', %s for '%s'", name, h->spec, first, c->spec_text);
        else if (h->steps_done != c->steps_done)
            rc = pp_fail(err, "%s is at step %d, %s at step %d: not one checkpoint", name, h->steps_done, first,
                         c->steps_done);
        else if (h->version != c->version)
            rc = pp_fail(err, "%s is of format version %d, %s of version %d: not one checkpoint", name, h->version,
                         first, c->version);
        else if (h->version == 2 && strcmp(h->run_id, c->run_id) != 0)
            rc = pp_fail(err, "%s was written by run '%s', %s by run '%s': not one checkpoint", name, h->run_id, first,
                         c->run_id);
        else if (h->version == 2 && (h->stage != c->nfiles || h->stages != c->stages))
            rc = pp_fail(err, "%s says stage %d of %d, expected stage %d of %d", name, h->stage, h->stages, c->nfiles,
                         c->stages);
    }
    if (rc == 0 && alone) c->next = h->first_unit;
    if (rc == 0 && h->nunits > 0 && h->first_unit != c->next) {
        char want[32], got[32];
        unit_name(&c->spec, c->next, want, sizeof want);
        unit_name(&c->spec, h->first_unit, got, sizeof got);
        rc = pp_fail(err, "%s starts at unit %s where %s was expected (the files before it end there)", name, got,
                     want);
    }
    if (rc == 0 && c->nfiles == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        ck_file *files = realloc(c->files, sizeof *files * (size_t)cap);
        if (!files) rc = pp_fail(err, "%s: out of memory", name);
        else c->files = files, c->cap = cap;
    }
    if (rc != 0) { /* the set as it was */
        if (c->nfiles == 0) {
            free(c->units);
            c->units = NULL;
        }
        c->next = next;
        free(h->v1);
        free(h);
        return -1;
    }
    ck_file *cf = &c->files[c->nfiles];
    cf->f = f, cf->own = own, cf->v1 = h->v1, cf->v1_n = h->v1_n;
    snprintf(cf->name, sizeof cf->name, "%s", name);
    for (int i = 0; i < h->nunits; i++)
        c->units[h->first_unit + i] = (ck_unit){c->nfiles, h->count[i], h->sum[i], h->offset[i]};
    c->next += h->nunits;
    c->nfiles++;
    free(h);
    return 0;
}

int model_ckpt_add_file(model_ckpt *c, const char *path, pp_err *err) {
    FILE *f;
    if (file_input_open(path, "checkpoint", UINT64_MAX, &f, NULL, err) != 0) return -1;
    if (add_stream(c, f, path, 1, 0, err) != 0) {
        fclose(f);
        return -1;
    }
    return 0;
}

int model_ckpt_check(const model_ckpt *c, const model_spec *spec, pp_err *err) {
    char want[256];
    model_spec_format(spec, want, sizeof want);
    if (!c->units) return pp_fail(err, "the checkpoint holds no file");
    if (strcmp(want, c->spec_text) != 0)
        return pp_fail(err, "the checkpoint is for model '%s', this job runs '%s'", c->spec_text, want);
    if (!model_ckpt_complete(c)) {
        char miss[32];
        unit_name(&c->spec, c->next, miss, sizeof miss);
        return pp_fail(err, "the checkpoint's files end before unit %s: it holds part of the model", miss);
    }
    return 0;
}

/* Unit u's weights, m and v into dst (3 * count floats), checked. */
static int read_unit(model_ckpt *c, int u, float *dst, pp_err *err) {
    const ck_unit *k = &c->units[u];
    ck_file *cf = &c->files[k->file];
    size_t n = (size_t)k->count;
    char nm[32];
    unit_name(&c->spec, u, nm, sizeof nm);
    if (cf->v1) { /* checked at open */
        memcpy(dst, cf->v1 + k->offset, sizeof(float) * n);
        memcpy(dst + n, cf->v1 + cf->v1_n + k->offset, sizeof(float) * n);
        memcpy(dst + 2 * n, cf->v1 + 2 * cf->v1_n + k->offset, sizeof(float) * n);
        return 0;
    }
    if (fseeko(cf->f, (off_t)k->offset, SEEK_SET) != 0 || fread(dst, sizeof(float), 3 * n, cf->f) != 3 * n)
        return pp_fail(err, "%s: unit %s cannot be read (the file is truncated?)", cf->name, nm);
    if (fnv(FNV_START, dst, sizeof(float) * 3 * n) != k->sum)
        return pp_fail(err, "%s: unit %s fails its checksum (the file is corrupted)", cf->name, nm);
    return 0;
}

static uint64_t unit_sum(const float *p, size_t n) { return fnv(FNV_START, p, sizeof(float) * 3 * n); }

int model_ckpt_verify(model_ckpt *c, pp_err *err) {
    int n = c->units ? c->next : 0;
    uint64_t most = 1;
    for (int u = 0; u < n; u++)
        if (c->units[u].count > most) most = c->units[u].count;
    float *unit = malloc(sizeof(float) * 3 * (size_t)most);
    int rc = unit ? 0 : pp_fail(err, "checkpoint: out of memory");
    for (int u = 0; rc == 0 && u < n; u++) rc = read_unit(c, u, unit, err);
    free(unit);
    return rc;
}

int model_stage_load_from(model_stage *s, model_ckpt *c, pp_err *err) {
    if (idle(s, "load", err) != 0) return -1;
    char spec[256];
    model_spec_format(&s->spec, spec, sizeof spec);
    if (!c->units || strcmp(spec, c->spec_text) != 0)
        return pp_fail(err, "checkpoint load: written for model '%s', this job runs '%s'", c->units ? c->spec_text : "",
                       spec);
    int u[1024 + 2], n = stage_units(s, u);
    size_t np = s->nparams ? s->nparams : 1;
    float *buf = malloc(sizeof(float) * 3 * np), *unit = NULL;
    size_t at = 0, cap = 0;
    int rc = buf ? 0 : pp_fail(err, "checkpoint load: out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        const ck_unit *k = &c->units[u[i]];
        if (k->file < 0) {
            char nm[32];
            unit_name(&s->spec, u[i], nm, sizeof nm);
            rc = pp_fail(err, "checkpoint load: the checkpoint holds no unit %s", nm);
            break;
        }
        size_t cnt = (size_t)k->count;
        if (cnt > cap) {
            float *grown = realloc(unit, sizeof(float) * 3 * cnt);
            if (!grown) {
                rc = pp_fail(err, "checkpoint load: out of memory");
                break;
            }
            unit = grown, cap = cnt;
        }
        if ((rc = read_unit(c, u[i], unit, err)) != 0) break;
        memcpy(buf + at, unit, sizeof(float) * cnt);
        memcpy(buf + np + at, unit + cnt, sizeof(float) * cnt);
        memcpy(buf + 2 * np + at, unit + 2 * cnt, sizeof(float) * cnt);
        at += cnt;
    }
    if (rc == 0 && at != s->nparams)
        rc = pp_fail(err, "checkpoint load: its units hold %zu weights, this stage has %zu", at, s->nparams);
    if (rc == 0) { /* only now change the stage: a failed load leaves it as it was */
        memcpy(s->params, buf, sizeof(float) * s->nparams);
        memcpy(s->adam_m, buf + np, sizeof(float) * s->nparams);
        memcpy(s->adam_v, buf + 2 * np, sizeof(float) * s->nparams);
        memset(s->grad, 0, sizeof(float) * s->nparams);
        s->next_acc = 0;
        s->steps_done = c->steps_done;
    }
    free(unit);
    free(buf);
    if (rc != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_upload(s, err); /* the device computes with what was loaded */
#endif
    return 0;
}

/* One stage file into the stage it was written for: the layout must be the
 * same (a set of any layout loads with model_stage_load_from). */
int model_stage_load(model_stage *s, FILE *f, pp_err *err) {
    if (idle(s, "load", err) != 0) return -1;
    model_ckpt *c;
    if (model_ckpt_create(&c, err) != 0) return -1;
    int rc = add_stream(c, f, "checkpoint load", 0, 1, err);
    if (rc == 0) {
        char spec[256];
        model_spec_format(&s->spec, spec, sizeof spec);
        int u[1024 + 2], n = stage_units(s, u), gpt = s->spec.kind == MODEL_GPT;
        /* the file's layers and role, from its run of units [lo, hi) */
        int hi = c->next, lo = hi;
        while (lo > 0 && c->units[lo - 1].file >= 0) lo--;
        int L = c->spec.layers, emb = gpt && lo == 0 && hi > 0, head = gpt && hi == L + 2;
        int first = gpt ? (emb ? 0 : lo - 1) : lo, last = gpt ? (head ? L : hi - 1) : hi;
        if (lo == hi) first = last = s->first_layer; /* no unit: a timed stage without layers */
        if (strcmp(spec, c->spec_text) != 0)
            rc = pp_fail(err, "checkpoint load: written for model '%s', this job runs '%s'", c->spec_text, spec);
        else if (first != s->first_layer || last != s->last_layer)
            rc = pp_fail(err, "checkpoint load: holds layers [%d, %d), this stage holds layers [%d, %d)", first, last,
                         s->first_layer, s->last_layer);
        else if (gpt && (emb != s->is_first || head != s->is_last))
            rc = pp_fail(err,
                         "checkpoint load: written for a stage %s the embeddings and %s the head, this stage %s and %s",
                         emb ? "with" : "without", head ? "with" : "without",
                         s->is_first ? "has them" : "has no embeddings", s->is_last ? "has the head" : "has no head");
        else if (hi - lo != n)
            rc = pp_fail(err, "checkpoint load: holds %d units, this stage has %d", hi - lo, n);
        (void)u;
    }
    if (rc == 0) rc = model_stage_load_from(s, c, err);
    model_ckpt_free(c);
    return rc;
}

/* ---- merging -------------------------------------------------------------------- */

int model_ckpt_write(model_ckpt *c, FILE *f, pp_err *err) {
    if (!model_ckpt_complete(c)) return pp_fail(err, "checkpoint: the set holds part of the model only");
    int n = units_of_model(&c->spec);
    ck2_unit *table = calloc((size_t)n, sizeof *table);
    size_t cap = 0;
    float *unit = NULL;
    int rc = table ? 0 : pp_fail(err, "checkpoint: out of memory");
    /* Twice over the units: their checksums (each checked as it is read),
     * then their bytes after the header and table. */
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        if (pass == 1) {
            ck2_header h;
            header_for(&h, &c->spec, c->steps_done, 0, 1, c->run_id, n);
            if ((rc = write_head(f, &h, table, err)) != 0) break;
        }
        for (int u = 0; rc == 0 && u < n; u++) {
            size_t cnt = (size_t)c->units[u].count;
            if (cnt > cap) {
                float *grown = realloc(unit, sizeof(float) * 3 * cnt);
                if (!grown) {
                    rc = pp_fail(err, "checkpoint: out of memory");
                    break;
                }
                unit = grown, cap = cnt;
            }
            if (read_unit(c, u, unit, err) != 0) {
                rc = MODEL_CKPT_EINPUT;
                break;
            }
            if (pass == 0) {
                unit_name(&c->spec, u, table[u].name, sizeof table[u].name);
                table[u].count = cnt;
                table[u].sum = unit_sum(unit, cnt);
            } else if (unit_sum(unit, cnt) != table[u].sum) {
                pp_fail(err, "%s: unit %s changed while it was merged", c->files[c->units[u].file].name,
                        table[u].name);
                rc = MODEL_CKPT_EINPUT;
            } else {
                rc = write_all(f, unit, sizeof(float), 3 * cnt, err);
            }
        }
    }
    if (rc == 0 && fflush(f) != 0) rc = pp_fail(err, "checkpoint: write failed: %s", strerror(errno));
    free(unit);
    free(table);
    return rc;
}
