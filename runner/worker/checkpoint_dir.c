/* checkpoint_dir.c: DIR/latest of a job's checkpoint directory
 * (checkpoint_dir.h). */
#include "runner/worker/checkpoint_dir.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int checkpoint_dir_latest(const char *dir, int *step, char *run_id, size_t n, pp_err *err) {
    char path[1024], text[300];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return pp_fail(err, "no 'latest' file (%s: %s)", path, strerror(errno));
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    /* exactly what checkpoint_dir_mark_latest writes: "STEP RUN_ID\n";
     * a step past what --steps allows would overflow step + 1 */
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    const char *id = end + (*end == ' ');
    size_t idlen = strcspn(id, " \t\r\n");
    int ok = end != text && text[0] >= '0' && text[0] <= '9' && !errno && v <= (1L << 24) && *end == ' ' && idlen > 0 &&
             idlen < 256 && strlen(text) == len && strcmp(id + idlen, "\n") == 0;
    if (!ok) return pp_fail(err, "%s is not 'STEP RUN_ID' with a step from 0 to %ld (a damaged file?)", path, 1L << 24);
    *step = (int)v;
    snprintf(run_id, n, "%.*s", (int)idlen, id);
    return 0;
}

int checkpoint_dir_to_load(const run_config *cfg, const char *run_id, int *step, pp_err *err) {
    char writer[256];
    pp_err *why = cfg->resume ? err : NULL; /* without --resume, no latest just means a fresh start */
    if (!cfg->checkpoint_dir[0] || checkpoint_dir_latest(cfg->checkpoint_dir, step, writer, sizeof writer, why) != 0) {
        if (cfg->resume) return pp_wrap(err, "--resume: no complete checkpoint in %s", cfg->checkpoint_dir);
        return 1;
    }
    return cfg->resume || strcmp(writer, run_id) == 0 ? 0 : 1;
}

int checkpoint_dir_mark_latest(const char *dir, int step, const char *run_id, pp_err *err) {
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/latest", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return pp_fail(err, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "%d %s\n", step, run_id);
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) return pp_fail(err, "checkpoint: cannot write %s: %s", path, strerror(errno));
    return 0;
}
