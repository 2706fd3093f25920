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

#include "base/dl.h"
#include "runner/comm/cuda/devcomm_nccl_int.h"

#define STR_(x) #x
#define STR(x) STR_(x)

nccl_api dc_nc;
static char nc_error[512];
static char nc_version[300] = "NCCL not loaded";
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

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
    void *lib;
    if (env && env[0]) {
        char why[500];
        lib = pp_dlopen_first(&env, 1, why, sizeof why);
        if (!lib) snprintf(nc_error, sizeof nc_error, "PPRUN_NCCL_LIB: %.480s", why);
    } else {
        lib = pp_dlopen_first(paths, sizeof paths / sizeof *paths, nc_error, sizeof nc_error);
    }
    if (!lib) return;
    nccl_api t;
    const pp_dlsym_entry syms[] = {
        {(void **)&t.get_version, "ncclGetVersion"},
        {(void **)&t.get_unique_id, "ncclGetUniqueId"},
        {(void **)&t.init_rank_config, "ncclCommInitRankConfig"},
        {(void **)&t.get_async_error, "ncclCommGetAsyncError"},
        {(void **)&t.send, "ncclSend"},
        {(void **)&t.recv, "ncclRecv"},
        {(void **)&t.abort, "ncclCommAbort"},
        {(void **)&t.error_string, "ncclGetErrorString"},
        {(void **)&t.last_error, "ncclGetLastError"},
    };
    /* On failure the library stays loaded: nothing else to unload it for. */
    if (pp_dlsym_all(lib, syms, sizeof syms / sizeof *syms, "NCCL library", nc_error, sizeof nc_error) < 0) return;
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
