/* launch_env.c: a worker's environment, built in the launcher before fork:
 * the launcher's own environment plus the torchrun variables, and where a
 * Python program finds pprun's package and libpprun_trace; and a helper's
 * (launch_env_new), the launcher's own for the caller to change. */
#include "runner/launch/launch_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static int env_push(launch_env *env, char *entry, pp_err *err) {
    if (!entry) return pp_fail(err, "out of memory building the environment");
    if (env->n + 2 > env->cap) {
        size_t cap = env->cap ? env->cap * 2 : 64;
        char **v = realloc(env->v, cap * sizeof *v);
        if (!v) {
            free(entry);
            return pp_fail(err, "out of memory building the environment");
        }
        env->v = v;
        env->cap = cap;
    }
    env->v[env->n++] = entry;
    env->v[env->n] = NULL;
    return 0;
}

int launch_env_from_environ(launch_env *env, pp_err *err) {
    memset(env, 0, sizeof *env);
    for (char **e = environ; e && *e; e++)
        if (env_push(env, strdup(*e), err) != 0) return -1;
    if (!env->v) return env_push(env, strdup("PPRUN_EMPTY_ENV=1"), err);
    return 0;
}

int launch_env_new(launch_env **out, pp_err *err) {
    *out = malloc(sizeof **out);
    if (!*out) return pp_fail(err, "out of memory building the environment");
    if (launch_env_from_environ(*out, err) == 0) return 0;
    launch_env_destroy(*out);
    *out = NULL;
    return -1;
}

void launch_env_destroy(launch_env *env) {
    if (!env) return;
    launch_env_free(env);
    free(env);
}

static ssize_t env_find(const launch_env *env, const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i < env->n; i++)
        if (strncmp(env->v[i], name, nl) == 0 && env->v[i][nl] == '=') return (ssize_t)i;
    return -1;
}

int launch_env_has(const launch_env *env, const char *name) { return env_find(env, name) >= 0; }

int launch_env_set(launch_env *env, const char *name, const char *value, pp_err *err) {
    if (!*name || strchr(name, '='))
        return pp_fail(err, "environment variable name '%s' is not valid", name);
    size_t len = strlen(name) + strlen(value) + 2;
    char *entry = malloc(len);
    if (!entry) return pp_fail(err, "out of memory building the environment");
    snprintf(entry, len, "%s=%s", name, value);
    ssize_t i = env_find(env, name);
    if (i >= 0) {
        free(env->v[i]);
        env->v[i] = entry;
        return 0;
    }
    return env_push(env, entry, err);
}

void launch_env_unset(launch_env *env, const char *name) {
    ssize_t i = env_find(env, name);
    if (i < 0) return;
    free(env->v[i]);
    memmove(&env->v[i], &env->v[i + 1], (env->n - (size_t)i) * sizeof *env->v); /* with the NULL */
    env->n--;
}

int launch_env_pass_fd(launch_env *env, int fd, pp_err *err) {
    if (fd < 0) return pp_fail(err, "cannot pass fd %d to a worker", fd);
    if (env->npass == LAUNCH_MAX_PASS_FDS) return pp_fail(err, "at most %d fds per worker", LAUNCH_MAX_PASS_FDS);
    env->pass_fd[env->npass++] = fd;
    return 0;
}

void launch_env_free(launch_env *env) {
    for (size_t i = 0; i < env->n; i++) free(env->v[i]);
    free(env->v);
    memset(env, 0, sizeof *env);
}

/* Beside the pprun executable: the build puts python/ (pprun's package and
 * the sitecustomize.py that instruments torch.distributed.pipelining) and
 * libpprun_trace.so next to it. Found from /proc/self/exe at each call (a
 * few syscalls per rank), so a moved build tree still works. */
int launch_env_python(launch_env *env, pp_err *err) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0; /* no /proc: the program runs without the package */
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return 0;
    *slash = '\0';
    char pkg[4200], lib[4200], init[4300];
    snprintf(pkg, sizeof pkg, "%s/python", exe);
    snprintf(lib, sizeof lib, "%s/libpprun_trace.so", exe);
    snprintf(init, sizeof init, "%s/pprun/__init__.py", pkg);
    if (access(init, R_OK) != 0 || access(lib, R_OK) != 0) return 0; /* a pprun built without them */
    /* First on the path: Python imports the first sitecustomize.py it
     * finds, and pprun's runs the one it shadows. */
    ssize_t i = env_find(env, "PYTHONPATH");
    const char *user = i >= 0 ? env->v[i] + strlen("PYTHONPATH=") : "";
    size_t len = strlen(pkg) + strlen(user) + 2;
    char *path = malloc(len);
    if (!path) return pp_fail(err, "out of memory building the environment");
    snprintf(path, len, "%s%s%s", pkg, *user ? ":" : "", user);
    int rc = launch_env_set(env, "PYTHONPATH", path, err);
    free(path);
    if (rc == 0 && !launch_env_has(env, "PPRUN_TRACE_LIB")) rc = launch_env_set(env, "PPRUN_TRACE_LIB", lib, err);
    return rc;
}
