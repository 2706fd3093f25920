/* dl.h: optional shared libraries loaded on first use with dlopen (cuBLAS,
 * NCCL, CUPTI), so that a process that never needs one never loads it.
 * Callers keep one order for their path lists: the toolkit's copy
 * (PPRUN_CUDA_LIBDIR, the library the build was compiled against) first,
 * then the soname (whatever the dynamic loader finds). */
#ifndef PP_DL_H
#define PP_DL_H
#include <stddef.h>

/* Opens the first of paths[0..n) that loads (RTLD_NOW | RTLD_LOCAL).  NULL
 * if none does, with "cannot load A nor B: <dlerror>" in err[cap]. */
void *pp_dlopen_first(const char *const *paths, size_t n, char *err, size_t cap);

/* One symbol to look up: *slot receives its address (POSIX allows
 * converting it to a function pointer: pass (void **)&table.fn). */
typedef struct pp_dlsym_entry {
    void **slot;
    const char *name;
} pp_dlsym_entry;
/* Looks up every entry in lib; 0, or -1 with "<what> has no symbol NAME"
 * (the first missing one) in err[cap]. */
int pp_dlsym_all(void *lib, const pp_dlsym_entry *syms, size_t n, const char *what, char *err, size_t cap);

#endif
