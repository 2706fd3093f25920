/* durations.h: a growable list of durations (ns) and its median and mean,
 * as every analysis takes them: the median of an even count is the mean of
 * the middle two (docs/schema.md), whether for the ops table, the what-if's
 * costs or the plan re-simulated at the measured costs. */
#ifndef PP_DB_DURATIONS_H
#define PP_DB_DURATIONS_H
#include <stddef.h>
#include <stdint.h>

/* A growable list of durations (ns), to take a median of; the owner frees v. */
typedef struct durations {
    int64_t *v;
    size_t n, cap;
} durations;
int durations_push(durations *d, int64_t x); /* 0, or -1 when out of memory */
/* d's median (the mean of the middle two), -1 if empty; reorders d->v. */
int64_t durations_median(durations *d);
/* d's mean, rounded to the ns; -1 if empty. */
int64_t durations_mean(const durations *d);

#endif
