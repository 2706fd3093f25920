/* checkutil.c: see checkutil.h. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "tests/gpu_emu/checkutil.h"

#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int check_stub_lib(char *buf, size_t cap) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    *slash = '\0';
    int k = snprintf(buf, cap, "%s/libdevcomm_ncclstub.so", self);
    return k < 0 || (size_t)k >= cap ? -1 : 0;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : -1;
}

int check_rm_tree(const char *dir) {
    return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
