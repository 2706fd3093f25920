/* shx.h: the benches' rendezvous exchange in shared memory (bench/comm.c,
 * bench/dp.c): put before fork into an anonymous MAP_SHARED mapping, it
 * stands in for the store as comm_config.exchange, so a bench measures its
 * transport without a store process. Header-only, static: each bench its
 * own copy. */
#ifndef PP_BENCH_SHX_H
#define PP_BENCH_SHX_H
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/pp.h"

#define SHX_KEYS 16

typedef struct shx {
    _Atomic int n;
    struct {
        char key[256], val[512];
        size_t len;
        _Atomic int ready;
    } e[SHX_KEYS];
} shx;

static inline int shx_put(void *ctx, const char *key, const void *v, size_t len, pp_err *err) {
    shx *x = ctx;
    int i = atomic_fetch_add(&x->n, 1);
    if (i >= SHX_KEYS || len > sizeof x->e[0].val) return pp_fail(err, "bench exchange full");
    snprintf(x->e[i].key, sizeof x->e[i].key, "%s", key);
    memcpy(x->e[i].val, v, len);
    x->e[i].len = len;
    atomic_store(&x->e[i].ready, 1);
    return 0;
}

static inline int shx_get(void *ctx, const char *key, void *v, size_t cap, size_t *len, int timeout_ms, pp_err *err) {
    shx *x = ctx;
    uint64_t end = pp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        for (int i = 0; i < SHX_KEYS; i++)
            if (atomic_load(&x->e[i].ready) && !strcmp(x->e[i].key, key)) {
                *len = x->e[i].len < cap ? x->e[i].len : cap;
                memcpy(v, x->e[i].val, *len);
                return 0;
            }
        if (pp_now_ns() > end) return pp_fail(err, "bench exchange: no key %s", key);
        pp_sleep_ns(1000000);
    }
}

#endif
