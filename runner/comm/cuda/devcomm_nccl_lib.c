/* devcomm_nccl_lib.c: NCCL, loaded on first use with dlopen (as cuBLAS in
 * gpu_blas.c): a CPU job, or a GPU job whose ranks all share one GPU, never
 * loads it.  PPRUN_NCCL_LIB names the library to load (another NCCL build,
 * or the CPU check's stand-in); otherwise the toolkit's copy (the NCCL the
 * build was compiled against), then the soname (a system NCCL, maybe of
 * another version).  Nothing is logged: the version and the file loaded go
 * into the error messages that report NCCL errors (dc_nccl_version).  The
 * table is filled once (pthread_once) and read-only afterwards. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "runner/comm/cuda/devcomm_nccl_int.h"

#define STR_(x) #x
#define STR(x) STR_(x)

nccl_api dc_nc;
static char nc_error[512];
static char nc_version[300] = "NCCL not loaded";
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void *nc_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !nc_error[0]) snprintf(nc_error, sizeof nc_error, "NCCL library has no symbol %s", name);
    return p;
}

/* "NCCL 2.28.9 (/path/libnccl.so.2)": ncclGetVersion's code is
 * major*10000 + minor*100 + patch since 2.9, major*1000 + ... before. */
static void nc_describe(void) {
    int v = 0;
    Dl_info di;
    const char *file = dladdr(*(void **)&dc_nc.get_version, &di) && di.dli_fname ? di.dli_fname : "?";
    if (dc_nc.get_version(&v) != ncclSuccess || v <= 0)
        snprintf(nc_version, sizeof nc_version, "NCCL of unknown version (%.250s)", file);
    else if (v >= 10000)
        snprintf(nc_version, sizeof nc_version, "NCCL %d.%d.%d (%.250s)", v / 10000, v / 100 % 100, v % 100, file);
    else
        snprintf(nc_version, sizeof nc_version, "NCCL %d.%d.%d (%.250s)", v / 1000, v / 100 % 10, v % 100, file);
}

static void nc_load(void) {
    const char *env = getenv("PPRUN_NCCL_LIB");
    const char *paths[] = {
#ifdef PPRUN_CUDA_LIBDIR
        PPRUN_CUDA_LIBDIR "/libnccl.so." STR(NCCL_MAJOR),
#endif
        "libnccl.so." STR(NCCL_MAJOR),
    };
    void *lib = NULL;
    if (env && env[0]) {
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(nc_error, sizeof nc_error, "cannot load PPRUN_NCCL_LIB=%.200s: %.250s", env, dlerror());
    } else {
        size_t n = sizeof paths / sizeof *paths;
        for (size_t i = 0; i < n && !lib; i++)
            lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            snprintf(nc_error, sizeof nc_error, "cannot load %s%s%.150s: %.250s", n > 1 ? paths[0] : "",
                     n > 1 ? " nor " : "", paths[n - 1], dlerror());
    }
    if (!lib) return;
    nccl_api t;
    /* POSIX: converting dlsym's void * to a function pointer is allowed */
    *(void **)&t.get_version = nc_sym(lib, "ncclGetVersion");
    *(void **)&t.get_unique_id = nc_sym(lib, "ncclGetUniqueId");
    *(void **)&t.init_rank_config = nc_sym(lib, "ncclCommInitRankConfig");
    *(void **)&t.get_async_error = nc_sym(lib, "ncclCommGetAsyncError");
    *(void **)&t.send = nc_sym(lib, "ncclSend");
    *(void **)&t.recv = nc_sym(lib, "ncclRecv");
    *(void **)&t.abort = nc_sym(lib, "ncclCommAbort");
    *(void **)&t.error_string = nc_sym(lib, "ncclGetErrorString");
    *(void **)&t.last_error = nc_sym(lib, "ncclGetLastError");
    if (nc_error[0]) return; /* the library stays loaded: nothing else to unload it for */
    dc_nc = t;
    nc_describe();
}

int dc_nccl_library(pp_err *err) {
    pthread_once(&nc_once, nc_load);
    if (nc_error[0]) return pp_fail(err, "devcomm (nccl): %s", nc_error);
    return 0;
}

const char *dc_nccl_version(void) {
    return nc_version;
}
