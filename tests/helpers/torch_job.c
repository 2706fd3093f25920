/* torch_job.c: the PyTorch job of torch_job.h. */
#include "helpers/torch_job.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void torch_need_root(void) {
    char cmd[1600], path[512] = "";
    FILE *f = popen(TORCH_ROOT_SH " path", "r");
    cr_assert_not_null(f, "cannot run " TORCH_ROOT_SH);
    if (!fgets(path, sizeof path, f)) path[0] = '\0';
    pclose(f);
    path[strcspn(path, "\n")] = '\0';
    snprintf(cmd, sizeof cmd, "test -x '%s/usr/bin/python3' && test -f "
             "'%s/usr/lib/python3/dist-packages/torch/distributed/pipelining/schedules.py'", path, path);
    if (system(cmd) == 0) return;
    char log[] = "/tmp/pprun-torch-root-XXXXXX";
    int fd = mkstemp(log);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(cmd, sizeof cmd, TORCH_ROOT_SH " ensure >/dev/null 2>%s", log);
    int st = system(cmd);
    size_t len;
    char *why = lt_slurp(log, &len);
    unlink(log);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        cr_assert_fail("no PyTorch root at %s, and it cannot be made (scripts/torch-root.sh ensure):\n%s", path, why);
    free(why);
}

void torch_run(lt_proc *p, const char *db, int nproc, int steps, int microbatches, const char *const *pprun_args,
               const char *const *program_args) {
    torch_need_root();
    char n[16], s[16], mb[16];
    snprintf(n, sizeof n, "%d", nproc);
    snprintf(s, sizeof s, "%d", steps);
    snprintf(mb, sizeof mb, "%d", microbatches);
    const char *args[64];
    int k = 0;
    const char *head[] = {"run", "--db", db, "--nproc-per-node", n, "--steps", s, "--microbatches", mb};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) args[k++] = head[i];
    for (int i = 0; pprun_args && pprun_args[i] && k < 40; i++) args[k++] = pprun_args[i];
    const char *prog[] = {"--", TORCH_ROOT_SH, "run", "python3", TORCH_EXAMPLE, "--steps", s, "--microbatches", mb};
    for (size_t i = 0; i < sizeof prog / sizeof prog[0]; i++) args[k++] = prog[i];
    for (int i = 0; program_args && program_args[i] && k < 63; i++) args[k++] = program_args[i];
    args[k] = NULL;
    /* unset: pprun gives the ranks USE_LIBUV=0 itself (Debian's torch has no libuv) */
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_run(p, args, env);
}
