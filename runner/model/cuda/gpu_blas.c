/* gpu_blas.c: cuBLAS, loaded on first use with dlopen. Linking it would make
 * every pprun process (launcher, workers, CPU jobs) load libcublas and its
 * 540 MB libcublasLt at start: 90 ms per process, measured here. The table
 * is filled once (pthread_once) and read-only afterwards. */
#include "runner/model/cuda/gpu_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define STR_(x) #x
#define STR(x) STR_(x)
/* The soname of the toolkit we compiled against, then its directory (the
 * dynamic loader may not know it). */
static const char *const blas_paths[] = {
    "libcublas.so." STR(CUBLAS_VER_MAJOR),
#ifdef PPRUN_CUDA_LIBDIR
    PPRUN_CUDA_LIBDIR "/libcublas.so." STR(CUBLAS_VER_MAJOR),
#endif
};

static gpu_blas_api blas_table;
static char blas_error[512];
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !blas_error[0]) snprintf(blas_error, sizeof blas_error, "cuBLAS has no symbol %s", name);
    return p;
}

static void blas_load(void) {
    void *lib = NULL;
    for (size_t i = 0; i < sizeof blas_paths / sizeof *blas_paths && !lib; i++)
        lib = dlopen(blas_paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(blas_error, sizeof blas_error, "cannot load %s: %s", blas_paths[0], dlerror());
        return;
    }
    gpu_blas_api t;
    /* POSIX: converting dlsym's void * to a function pointer is allowed */
    *(void **)&t.create = sym(lib, "cublasCreate_v2");
    *(void **)&t.destroy = sym(lib, "cublasDestroy_v2");
    *(void **)&t.set_stream = sym(lib, "cublasSetStream_v2");
    *(void **)&t.set_math_mode = sym(lib, "cublasSetMathMode");
    *(void **)&t.sgemm = sym(lib, "cublasSgemm_v2");
    *(void **)&t.sgemm_strided_batched = sym(lib, "cublasSgemmStridedBatched");
    *(void **)&t.gemm_ex = sym(lib, "cublasGemmEx");
    *(void **)&t.status_string = sym(lib, "cublasGetStatusString");
    if (blas_error[0]) return; /* the library stays loaded: nothing else to unload it for */
    blas_table = t;
}

const gpu_blas_api *gpu_blas(pp_err *err) {
    pthread_once(&blas_once, blas_load);
    if (blas_error[0]) {
        pp_fail(err, "gpu: %s", blas_error);
        return NULL;
    }
    return &blas_table;
}
