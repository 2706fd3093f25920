/* cudart_standin.h: what cudart_standin.c, the CPU's CUDA runtime for the
 * programs of tests/gpu_emu/, offers beyond the runtime's own API: the
 * emulator's way to report a failed launch, and the knobs and counts the
 * checks use. */
#ifndef PP_CUDART_STANDIN_H
#define PP_CUDART_STANDIN_H

#ifdef __cplusplus
extern "C" {
#endif

/* A launch on stream (NULL: the legacy stream) failed (cuda_emu.cpp, which
 * has said why on stderr): the next cudaGetLastError returns
 * cudaErrorLaunchFailure, and so does every synchronisation with the stream
 * from then on, as a GPU's fault is sticky. */
struct CUstream_st;
void cudart_standin_launch_failed(struct CUstream_st *stream);

/* Device allocations made by this process so far (cudaMalloc and
 * cudaMallocAsync; opened IPC handles are not counted). */
long cudart_standin_allocs(void);

/* The PCI bus id of device 0 and the UUID seed, for a rank that must not
 * call setenv (its threads run): each wins over PPRUN_STUB_BUSID /
 * PPRUN_STUB_UUID when set (cudart_standin.c says what they mean). */
extern const char *cudart_standin_busid;
extern const char *cudart_standin_uuid;

#ifdef __cplusplus
}
#endif
#endif
