/* checkpoint_dir.c: DIR/latest of a job's checkpoint directory
 * (checkpoint_dir.h). */
#include "runner/worker/checkpoint_dir.h"
#include "base/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int checkpoint_dir_latest(const char *dir, int *step, char *run_id, size_t n, pp_err *err) {
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/latest", dir);
    /* "STEP RUN_ID\n" is at most 8 + 1 + 255 + 1 bytes */
    if (file_input_read(path, "checkpoint", 300, &text, &len, err) != 0) return -1;
    /* exactly what checkpoint_dir_mark_latest writes: "STEP RUN_ID\n";
     * a step past what --steps allows would overflow step + 1 */
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    const char *id = end + (*end == ' ');
    size_t idlen = strcspn(id, " \t\r\n");
    int ok = end != text && text[0] >= '0' && text[0] <= '9' && !errno && v <= (1L << 24) && *end == ' ' && idlen > 0 &&
             idlen < 256 && strlen(text) == len && strcmp(id + idlen, "\n") == 0;
    if (ok) {
        *step = (int)v;
        snprintf(run_id, n, "%.*s", (int)idlen, id);
    }
    free(text);
    if (!ok) return pp_fail(err, "%s is not 'STEP RUN_ID' with a step from 0 to %ld (a damaged file?)", path, 1L << 24);
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
    char path[1024];
    snprintf(path, sizeof path, "%s/latest", dir);
    file_output out;
    if (file_output_begin(&out, path, "checkpoint", 0, err) != 0) return -1;
    fprintf(out.f, "%d %s\n", step, run_id);
    return file_output_commit(&out, err);
}
