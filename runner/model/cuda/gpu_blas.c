/* gpu_blas.c: cuBLAS, loaded on first use with dlopen. Linking it would make
 * every pprun process (launcher, workers, CPU jobs) load libcublas and its
 * 540 MB libcublasLt at start: 90 ms per process, measured here. The table
 * is filled once (pthread_once) and read-only afterwards. */
#include "runner/model/cuda/gpu_internal.h"

#include <pthread.h>
#include <stdio.h>

#include "base/dl.h"

#define STR_(x) #x
#define STR(x) STR_(x)
/* The toolkit we compiled against first (the dynamic loader may not know
 * its directory), then the soname (dl.h: the order of every loader). */
static const char *const blas_paths[] = {
#ifdef PPRUN_CUDA_LIBDIR
    PPRUN_CUDA_LIBDIR "/libcublas.so." STR(CUBLAS_VER_MAJOR),
#endif
    "libcublas.so." STR(CUBLAS_VER_MAJOR),
};

static gpu_blas_api blas_table;
static char blas_error[512];
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_load(void) {
    void *lib = pp_dlopen_first(blas_paths, sizeof blas_paths / sizeof *blas_paths, blas_error, sizeof blas_error);
    if (!lib) return;
    gpu_blas_api t;
    const pp_dlsym_entry syms[] = {
        {(void **)&t.create, "cublasCreate_v2"},
        {(void **)&t.destroy, "cublasDestroy_v2"},
        {(void **)&t.set_stream, "cublasSetStream_v2"},
        {(void **)&t.set_math_mode, "cublasSetMathMode"},
        {(void **)&t.sgemm, "cublasSgemm_v2"},
        {(void **)&t.sgemm_strided_batched, "cublasSgemmStridedBatched"},
        {(void **)&t.gemm_ex, "cublasGemmEx"},
        {(void **)&t.status_string, "cublasGetStatusString"},
    };
    /* On failure the library stays loaded: nothing else to unload it for. */
    if (pp_dlsym_all(lib, syms, sizeof syms / sizeof *syms, "cuBLAS", blas_error, sizeof blas_error) == 0)
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
