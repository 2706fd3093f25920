/* standins.h: what the CPU checks of tests/gpu_emu/ learn from the
 * stand-ins (standins.c) that replace CUDA: which pointers are "device"
 * memory, and the first copy that crossed sides wrongly. */
#ifndef PP_GPU_STANDINS_H
#define PP_GPU_STANDINS_H

/* Number of wrong-side uses since the last reset (set to 0 to reset), and the
 * first one, in words. */
extern int side_errors;
extern char side_error[256];

/* 1 if p lies inside a live gpu_alloc allocation. */
int is_device(const void *p);
/* Counts (and describes, if first) a use of p on the wrong side. */
void want_side(const void *p, int device, const char *what);

#endif
