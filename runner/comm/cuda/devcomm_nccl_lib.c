/* devcomm_nccl_lib.c: NCCL, loaded on first use with dlopen (as cuBLAS in
 * gpu_blas.c): a CPU job, or a GPU job whose ranks all share one GPU, never
 * loads it.  PPRUN_NCCL_LIB names the library to load (another NCCL build,
 * or the CPU check's stand-in); otherwise the soname, then the toolkit's
 * copy.  The table is filled once (pthread_once) and read-only afterwards. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "runner/comm/cuda/devcomm_nccl_int.h"

#define STR_(x) #x
#define STR(x) STR_(x)

nccl_api dc_nc;
static char nc_error[512];
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void *nc_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !nc_error[0]) snprintf(nc_error, sizeof nc_error, "NCCL library has no symbol %s", name);
    return p;
}

static void nc_load(void) {
    const char *env = getenv("PPRUN_NCCL_LIB");
    const char *paths[] = {
        "libnccl.so." STR(NCCL_MAJOR),
#ifdef PPRUN_CUDA_LIBDIR
        PPRUN_CUDA_LIBDIR "/libnccl.so." STR(NCCL_MAJOR),
#endif
    };
    void *lib = NULL;
    if (env && env[0]) {
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_error, sizeof nc_error, "cannot load PPRUN_NCCL_LIB=%.200s: %.250s", env, dlerror());
    } else {
        for (size_t i = 0; i < sizeof paths / sizeof *paths && !lib; i++)
            lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_error, sizeof nc_error, "cannot load %s: %.300s", paths[0], dlerror());
    }
    if (!lib) return;
    nccl_api t;
    /* POSIX: converting dlsym's void * to a function pointer is allowed */
    *(void **)&t.get_unique_id = nc_sym(lib, "ncclGetUniqueId");
    *(void **)&t.init_rank_config = nc_sym(lib, "ncclCommInitRankConfig");
    *(void **)&t.get_async_error = nc_sym(lib, "ncclCommGetAsyncError");
    *(void **)&t.send = nc_sym(lib, "ncclSend");
    *(void **)&t.recv = nc_sym(lib, "ncclRecv");
    *(void **)&t.abort = nc_sym(lib, "ncclCommAbort");
    *(void **)&t.finalize = nc_sym(lib, "ncclCommFinalize");
    *(void **)&t.destroy = nc_sym(lib, "ncclCommDestroy");
    *(void **)&t.error_string = nc_sym(lib, "ncclGetErrorString");
    *(void **)&t.last_error = nc_sym(lib, "ncclGetLastError");
    if (nc_error[0]) return; /* the library stays loaded: nothing else to unload it for */
    dc_nc = t;
}

int dc_nccl_library(pp_err *err) {
    pthread_once(&nc_once, nc_load);
    if (nc_error[0]) return pp_fail(err, "devcomm (nccl): %s", nc_error);
    return 0;
}
