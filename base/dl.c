/* dl.c: dlopen over a list of paths and dlsym over a table (dl.h). */
#include "base/dl.h"

#include <dlfcn.h>
#include <stdio.h>

void *pp_dlopen_first(const char *const *paths, size_t n, char *err, size_t cap) {
    for (size_t i = 0; i < n; i++) {
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
    }
    /* dlerror names the last attempt; the list says what else was tried. */
    const char *why = dlerror();
    snprintf(err, cap, "cannot load %.150s%s%.150s: %.250s", n > 1 ? paths[0] : "", n > 1 ? " nor " : "",
             n ? paths[n - 1] : "(no path)", why ? why : "unknown error");
    return NULL;
}

int pp_dlsym_all(void *lib, const pp_dlsym_entry *syms, size_t n, const char *what, char *err, size_t cap) {
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(err, cap, "%s has no symbol %s", what, syms[i].name);
            return -1;
        }
    }
    return 0;
}
