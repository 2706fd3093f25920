/* checkpoint_dir.c: DIR/latest of a job's checkpoint directory, and its
 * steps' stage files read as one set (checkpoint_dir.h). */
#include "runner/worker/checkpoint_dir.h"
#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

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

int checkpoint_dir_open(const char *dir, int step, const char *run_id, model_ckpt **out, pp_err *err) {
    model_ckpt *c;
    if (model_ckpt_create(&c, err) != 0) return -1;
    char path[1024];
    int rc = 0;
    for (int s = 0; rc == 0; s++) {
        int stages = model_ckpt_stages(c);
        if (s > 0 && (stages ? s >= stages : model_ckpt_complete(c))) break;
        checkpoint_dir_stage_path(dir, step, s, path, sizeof path);
        rc = model_ckpt_add_file(c, path, err);
        if (rc == 0 && s == 0 && run_id && model_ckpt_stages(c) && strcmp(model_ckpt_run_id(c), run_id) != 0)
            rc = pp_fail(err, "%s was written by run '%s'; %s/latest names run '%s'", path, model_ckpt_run_id(c), dir,
                         run_id);
    }
    if (rc == 0 && model_ckpt_steps_done(c) != step + 1)
        rc = pp_fail(err, "%s/step_%d holds %d steps done, not %d (a damaged checkpoint?)", dir, step,
                     model_ckpt_steps_done(c), step + 1);
    if (rc == 0 && !model_ckpt_complete(c))
        rc = pp_fail(err, "%s/step_%d: its stage files end before the end of the model", dir, step);
    if (rc != 0) {
        model_ckpt_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

int checkpoint_dir_start(const run_config *cfg, const char *run_id, model_ckpt **out, int *start_step, pp_err *err) {
    int latest;
    char writer[256];
    *out = NULL;
    *start_step = 0;
    int from = checkpoint_dir_to_load(cfg, run_id, &latest, err);
    if (from < 0) return -1;
    if (from == 0) {
        if (checkpoint_dir_latest(cfg->checkpoint_dir, &latest, writer, sizeof writer, err) != 0 ||
            checkpoint_dir_open(cfg->checkpoint_dir, latest, writer, out, err) != 0)
            return -1;
        *start_step = latest + 1;
    } else if (cfg->init_from[0]) {
        if (model_ckpt_create(out, err) != 0) return -1;
        if (model_ckpt_add_file(*out, cfg->init_from, err) != 0) {
            model_ckpt_free(*out);
            *out = NULL;
            return pp_wrap(err, "--init-from");
        }
        *start_step = model_ckpt_steps_done(*out);
    } else {
        return 0;
    }
    if (model_ckpt_check(*out, &cfg->model, err) != 0) {
        model_ckpt_free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

int checkpoint_dir_mark_latest(const char *dir, int step, const char *run_id, pp_err *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/latest", dir);
    file_output out;
    if (file_output_begin(&out, path, "checkpoint", 0, err) != 0) return -1;
    fprintf(out.f, "%d %s\n", step, run_id);
    return file_output_commit(&out, err);
}

/* PREFIX<digits>SUFFIX */
static int numbered(const char *name, const char *prefix, const char *suffix) {
    size_t np = strlen(prefix), ns = strlen(suffix), n = strlen(name);
    if (n <= np + ns || strncmp(name, prefix, np) != 0 || strcmp(name + n - ns, suffix) != 0) return 0;
    for (size_t i = np; i < n - ns; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return 1;
}
static int is_latest(const char *name) { return strcmp(name, "latest") == 0; }
static int is_stage_file(const char *name) { return numbered(name, "stage_", ".ckpt"); }

int checkpoint_dir_check_steps(const char *dir, int first, int steps, int every, int stages, pp_err *err) {
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0
                               : pp_fail(err, "--checkpoint-dir %s: cannot read the folder: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (!numbered(e->d_name, "step_", "") || strlen(e->d_name) > 13) continue; /* step_ and an int */
        long step = strtol(e->d_name + 5, NULL, 10);
        char path[1024];
        checkpoint_dir_step_path(dir, (int)step, path, sizeof path);
        if (step < first || step >= steps || !((every && (step + 1) % every == 0) || step == steps - 1) ||
            strcmp(strrchr(path, '/') + 1, e->d_name) != 0) /* step_01 is no step's */
            continue;
        struct stat st;
        if (stat(path, &st) != 0 && lstat(path, &st) != 0) continue; /* gone since */
        if (!S_ISDIR(st.st_mode)) {
            rc = pp_fail(err, "--checkpoint-dir: %s, where step %ld's checkpoint goes, is %s, not a directory", path,
                         step, file_kind(st.st_mode));
            break;
        }
        for (int s = 0; rc == 0 && s < stages; s++) {
            checkpoint_dir_stage_path(dir, (int)step, s, path, sizeof path);
            rc = file_output_check(path, "--checkpoint-dir", err);
        }
    }
    closedir(d);
    return rc;
}

int checkpoint_dir_sweep(const char *dir, pp_err *err) {
    int removed = file_output_sweep(dir, is_latest, err);
    if (removed < 0) return -1;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? removed : pp_fail(err, "%s: cannot read the folder: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st; /* a step's folder, as the workers make it: not a link to one */
        if (!numbered(e->d_name, "step_", "") || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        char step[1024];
        snprintf(step, sizeof step, "%s/%s", dir, e->d_name);
        int n = file_output_sweep(step, is_stage_file, err);
        if (n < 0) rc = -1;
        else removed += n;
    }
    closedir(d);
    return rc != 0 ? -1 : removed;
}
