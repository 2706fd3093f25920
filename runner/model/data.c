/* data.c: training bytes (a text file, or the default corpus compiled into
 * the binary) and deterministic batches drawn from them. */
#include "runner/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/embed.h"
#include "base/file.h"

/* The file is held in memory whole, by the launcher to check it and by the
 * ranks of the first and the last stage: a corpus past 1 GiB (or /dev/zero
 * named by mistake) would take the machine's memory. */
#define DATA_MAX_BYTES ((size_t)1 << 30)

struct data_source {
    uint8_t *bytes; /* owned */
    size_t size;
};

int data_open(const char *path, size_t min_bytes, data_source **out, pp_err *err) {
    return data_open_as(path, "--data", min_bytes, out, err);
}

int data_open_as(const char *path, const char *flag, size_t min_bytes, data_source **out, pp_err *err) {
    *out = NULL;
    if (min_bytes < 2) min_bytes = 2; /* one token and its target */
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (path) {
        if (file_input_read(path, flag, DATA_MAX_BYTES, (char **)&bytes, &size, err) != 0) return -1;
    } else {
        for (const pp_embedded_file *f = pp_corpus_files; f->name; f++) size += f->size;
        if (!(bytes = malloc(size ? size : 1))) return pp_fail(err, "data: out of memory for the default corpus");
        size_t at = 0;
        for (const pp_embedded_file *f = pp_corpus_files; f->name; f++) {
            memcpy(bytes + at, f->data, f->size);
            at += f->size;
        }
    }
    if (size < min_bytes) {
        free(bytes);
        return pp_fail(err, "%s %s: %zu bytes is too small; a microbatch needs at least %zu (batch x seq + 1)", flag,
                       path ? path : "(default corpus)", size, min_bytes);
    }
    data_source *d = malloc(sizeof *d);
    if (!d) {
        free(bytes);
        return pp_fail(err, "data: out of memory");
    }
    d->bytes = bytes, d->size = size;
    *out = d;
    return 0;
}

void data_close(data_source *d) {
    if (!d) return;
    free(d->bytes);
    free(d);
}

size_t data_size(const data_source *d) { return d->size; }

int data_hold_out(data_source *d, size_t min_bytes, data_source **held, pp_err *err) {
    *held = NULL;
    size_t tail = d->size / 10, keep = d->size - tail;
    if (min_bytes < 2) min_bytes = 2;
    if (tail < min_bytes || keep < min_bytes)
        return pp_fail(err, "--eval-every: the training data's last tenth (%zu of %zu bytes) is held out for "
                       "evaluation, and a microbatch needs %zu; give more data or --eval-data FILE", tail, d->size,
                       min_bytes);
    data_source *h = malloc(sizeof *h);
    uint8_t *bytes = malloc(tail);
    if (!h || !bytes) {
        free(h), free(bytes);
        return pp_fail(err, "data: out of memory");
    }
    memcpy(bytes, d->bytes + keep, tail);
    h->bytes = bytes, h->size = tail;
    d->size = keep; /* the buffer keeps its tail, never read again */
    *held = h;
    return 0;
}

void data_batch(const data_source *d, uint64_t seed, int step, int mb, int batch, int seq, uint8_t *tokens,
                uint8_t *targets) {
    /* Windows of seq + 1 bytes at offsets drawn from (seed, step, mb, row);
     * indexing wraps so that a too-small source can never read out of bounds. */
    size_t span = d->size > (size_t)seq + 1 ? d->size - (size_t)seq - 1 : 1;
    for (int b = 0; b < batch; b++) {
        uint64_t st = seed ^ ((uint64_t)(uint32_t)step << 32 | (uint64_t)(uint32_t)mb) * 0xd1342543de82ef95ull;
        st += (uint64_t)b * 0x632be59bd9b4e019ull;
        model_splitmix64(&st);
        size_t off = (size_t)(model_splitmix64(&st) % span);
        for (int t = 0; t < seq; t++) {
            tokens[(size_t)b * seq + t] = d->bytes[(off + t) % d->size];
            targets[(size_t)b * seq + t] = d->bytes[(off + t + 1) % d->size];
        }
    }
}
