/* checkpoint_dir.h: a job's checkpoint directory (--checkpoint-dir DIR),
 * which the workers write and the launcher reads (docs/checkpoint.md).
 *
 *   DIR/step_N/stage_S.ckpt   stage S of K after step N (model_stage_save_as,
 *                             tagged with S, K and the run), saved by the
 *                             rank that holds the stage
 *   DIR/latest                "N RUN_ID\n": the last step every rank saved,
 *                             and the run that saved it
 *
 * Each rank saves its stages (engine.c), then counts itself in through the
 * job's store; the rank that completes the count writes DIR/latest
 * (worker.c). Every rank starts from DIR/latest when the job resumes or an
 * attempt restarts (checkpoint_dir_to_load), and the launcher reads it to
 * check --resume and to show a restarted attempt's steps. The stage files
 * of a step are read as one set (model_ckpt), so a job of any layout
 * resumes from them. */
#ifndef PP_CHECKPOINT_DIR_H
#define PP_CHECKPOINT_DIR_H
#include <stddef.h>
#include <stdio.h>

#include "base/pp.h"
#include "config/run_config.h"
#include "runner/model/model.h"

/* DIR/latest: 0 with step and run_id filled, or -1 with err saying why (no
 * latest, or not "N RUN_ID" with N a step --steps allows). */
int checkpoint_dir_latest(const char *dir, int *step, char *run_id, size_t n, pp_err *err);
/* The checkpoint a rank of run `run_id` starts from: DIR/latest when the
 * user asked to --resume, or when this run wrote it (a restarted attempt);
 * never one another run left. 0 with *step set; 1: none, a fresh start;
 * -1 with err: --resume without a complete checkpoint. */
int checkpoint_dir_to_load(const run_config *cfg, const char *run_id, int *step, pp_err *err);
/* The stage files of DIR/step_N as one set: stage_0.ckpt, then as many as
 * its writer had (version 2 files say), or until the set holds the whole
 * model (version 1 files do not say); every file of the step, of run
 * `run_id` (NULL: of any one run), at step + 1 steps done. -1 naming the
 * file and what is wrong. The caller frees *out (model_ckpt_free). */
int checkpoint_dir_open(const char *dir, int step, const char *run_id, model_ckpt **out, pp_err *err);
/* Where a rank of run `run_id` starts: DIR/latest's step when the user
 * asked to --resume or this run wrote it (checkpoint_dir_to_load), else
 * --init-from FILE, else nowhere. *out: the set, checked against the job's
 * model (the caller frees it), or NULL for a fresh start; *start_step: the
 * first step to run. */
int checkpoint_dir_start(const run_config *cfg, const char *run_id, model_ckpt **out, int *start_step, pp_err *err);
/* Writes DIR/latest atomically (file_output: write, fsync, rename). */
int checkpoint_dir_mark_latest(const char *dir, int step, const char *run_id, pp_err *err);

/* Before a job starts: the folders of DIR the job will save steps into
 * (steps first .. steps-1, the job's start on: every `every`-th and the
 * last) that are there already must be folders (a link to one, as mkdir
 * takes it), and each
 * stage file of its `stages` in them absent or a regular file, as the
 * ranks will write them (file_output_begin). A step folder not there yet
 * is made by the ranks. Read through DIR's entries, not step by step. 0,
 * or -1 with err naming the path and what it is. */
int checkpoint_dir_check_steps(const char *dir, int first, int steps, int every, int stages, pp_err *err);

/* The temporary files of checkpoints whose writers died before they
 * renamed them into place (file_output_sweep: a rank SIGKILLed, or torn
 * down by the launcher while it saved): DIR/latest.<hex>.tmp and
 * DIR/step_N/stage_S.ckpt.<hex>.tmp, nothing else. For the launcher once
 * an attempt's workers are gone (job_attempts.c): DIR/latest and the
 * finished stage files stay as they were. The number removed, or -1 with
 * err. */
int checkpoint_dir_sweep(const char *dir, pp_err *err);

/* DIR/step_N and DIR/step_N/stage_S.ckpt */
static inline void checkpoint_dir_step_path(const char *dir, int step, char *buf, size_t n) {
    snprintf(buf, n, "%s/step_%d", dir, step);
}
static inline void checkpoint_dir_stage_path(const char *dir, int step, int stage, char *buf, size_t n) {
    snprintf(buf, n, "%s/step_%d/stage_%d.ckpt", dir, step, stage);
}

#endif
