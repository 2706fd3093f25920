/* model_tree.c: the gradient tree's programs (model_tree.h). */
#include "runner/model/model_tree.h"

#include <stdlib.h>

/* The split point of T(lo, hi), hi - lo >= 2: lo plus the largest power of
 * two strictly below the size. */
static int tree_mid(int lo, int hi) {
    int half = 1;
    while (2 * half < hi - lo) half *= 2;
    return lo + half;
}

/* Walks T(lo, hi) and reports the maximal nodes inside [a, b). */
static void parts_of(int lo, int hi, int a, int b, int *lo_of, int *hi_of, int cap, int *n) {
    if (hi <= a || lo >= b) return;
    if (a <= lo && hi <= b) {
        if (*n < cap) lo_of[*n] = lo, hi_of[*n] = hi;
        (*n)++;
        return;
    }
    int mid = tree_mid(lo, hi); /* a partial overlap has at least 2 leaves */
    parts_of(lo, mid, a, b, lo_of, hi_of, cap, n);
    parts_of(mid, hi, a, b, lo_of, hi_of, cap, n);
}

int model_tree_parts(int total, int lo, int hi, int *lo_of, int *hi_of, int cap) {
    if (total < 1 || lo < 0 || hi > total || lo >= hi) return -1;
    int n = 0;
    parts_of(0, total, lo, hi, lo_of, hi_of, cap, &n);
    return n;
}

/* A program that appends its steps while they fit. */
typedef struct prog {
    int *steps, n, cap, leaves;
} prog;

static void emit(prog *p, int step) {
    if (p->n < p->cap) p->steps[p->n] = step;
    p->n++;
}

/* T(lo, hi) over consecutive leaves (the subtree's shape depends on its
 * size only, so the leaves need not be numbered lo ..). */
static void subtree(prog *p, int lo, int hi) {
    if (hi - lo == 1) {
        emit(p, p->leaves++);
        return;
    }
    int mid = tree_mid(lo, hi);
    subtree(p, lo, mid);
    subtree(p, mid, hi);
    emit(p, MODEL_TREE_ADD);
}

int model_tree_replica_program(int total, int lo, int hi, int *steps, int cap) {
    enum { MAX_PARTS = 64 }; /* a block of 2^31 leaves has at most 2·31 + 2 parts */
    int plo[MAX_PARTS], phi[MAX_PARTS];
    int nparts = model_tree_parts(total, lo, hi, plo, phi, MAX_PARTS);
    if (nparts < 0 || nparts > MAX_PARTS) return -1;
    prog p = {steps, 0, cap, 0};
    for (int i = 0; i < nparts; i++) subtree(&p, plo[i], phi[i]);
    return p.n <= cap ? p.n : -1;
}

/* T(lo, hi) where a node inside one replica's block is a leaf (that
 * replica's next part); parts[] counts each replica's parts so far. */
static void combine(prog *p, int lo, int hi, int m, int *owner, int *part, int *parts) {
    if (lo / m == (hi - 1) / m) {
        int r = lo / m;
        if (p->leaves < p->cap) owner[p->leaves] = r, part[p->leaves] = parts[r];
        parts[r]++;
        emit(p, p->leaves++);
        return;
    }
    int mid = tree_mid(lo, hi);
    combine(p, lo, mid, m, owner, part, parts);
    combine(p, mid, hi, m, owner, part, parts);
    emit(p, MODEL_TREE_ADD);
}

int model_tree_combine_program(int replicas, int m, int *steps, int *owner, int *part, int cap) {
    if (replicas < 1 || m < 1) return -1;
    int *parts = calloc((size_t)replicas, sizeof *parts);
    if (!parts) return -1;
    prog p = {steps, 0, cap, 0};
    combine(&p, 0, replicas * m, m, owner, part, parts);
    free(parts);
    return p.n <= cap ? p.n : -1;
}
