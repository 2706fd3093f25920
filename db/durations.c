/* durations.c: a list of op durations and its median and mean
 * (durations.h). */
#include "db/durations.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

int durations_push(durations *d, int64_t x) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 256;
        int64_t *v = realloc(d->v, cap * sizeof *v);
        if (!v) return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

/* Moves the k-th smallest of v[0..n) to v[k], the smaller ones before it
 * and the larger after (Hoare's selection): a median in linear time, where
 * sorting a long job's millions of op durations took most of a summary. */
static void select_kth(int64_t *v, size_t n, size_t k) {
    ptrdiff_t lo = 0, hi = (ptrdiff_t)n - 1, kk = (ptrdiff_t)k;
    while (lo < hi) {
        int64_t pivot = v[kk];
        ptrdiff_t i = lo, j = hi;
        do {
            while (v[i] < pivot) i++;
            while (pivot < v[j]) j--;
            if (i <= j) {
                int64_t t = v[i];
                v[i++] = v[j], v[j--] = t;
            }
        } while (i <= j);
        if (j < kk) lo = i; /* v[lo..j] <= pivot <= v[i..hi], equal between */
        if (kk < i) hi = j;
    }
}

int64_t durations_median(durations *d) {
    if (!d->n) return -1;
    size_t mid = d->n / 2;
    select_kth(d->v, d->n, mid);
    if (d->n % 2) return d->v[mid];
    int64_t below = d->v[0]; /* the largest of the smaller half */
    for (size_t i = 1; i < mid; i++)
        if (d->v[i] > below) below = d->v[i];
    return below / 2 + d->v[mid] / 2 + (below % 2 + d->v[mid] % 2) / 2; /* two times of 2^62 would overflow */
}

int64_t durations_mean(const durations *d) {
    if (!d->n) return -1;
    long double sum = 0; /* int64 values summed exactly enough, without overflow */
    for (size_t i = 0; i < d->n; i++) sum += d->v[i];
    return llroundl(sum / (long double)d->n);
}
