/* checkutil.h: chores the CPU-check programs of tests/gpu_emu/ share
 * (devcomm_check, gpu_enginecheck): finding the NCCL stand-in library and
 * removing a check's temporary directory. */
#ifndef PP_GPU_CHECKUTIL_H
#define PP_GPU_CHECKUTIL_H
#include <stddef.h>

/* The path of libdevcomm_ncclstub.so, built next to this program, into
 * buf[cap]; -1 if the program's own path is unknown. */
int check_stub_lib(char *buf, size_t cap);
/* Removes dir and everything under it (links are removed, not followed);
 * -1 if something stayed. */
int check_rm_tree(const char *dir);

#endif
