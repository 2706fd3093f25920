/* cmd_checkpoint.c: `pprun checkpoint merge DIR [--step S] --out FILE`: the
 * stage files of one step of a job's checkpoint directory, whatever its
 * layout, as one file holding every layer's weights and AdamW moments by
 * name, the steps done and the model spec (docs/checkpoint.md). `pprun run
 * --init-from FILE` starts a job of any layout from it. The output appears
 * only when complete, and only where nothing but a regular file was
 * (file_output). */
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "runner/cmd/cli.h"
#include "runner/model/model.h"
#include "runner/worker/checkpoint_dir.h"

static void checkpoint_usage(FILE *out) {
    fprintf(out, "usage: pprun checkpoint merge DIR [--step S] --out FILE\n"
                 "  DIR         a --checkpoint-dir of `pprun run`\n"
                 "  --step S    the step whose stage files to merge (default: the one DIR/latest names)\n"
                 "  --out FILE  the merged checkpoint (a regular file or not there yet); `pprun run\n"
                 "              --init-from FILE` starts a job of any number of stages from it\n");
}

static int merge(const char *dir, const char *step_s, const char *outpath) {
    pp_err err;
    int step;
    /* DIR is pprun run's: its latest pointer and step folders are what this
     * reads, and a later --resume too; the merged file goes elsewhere. */
    if (file_output_not_input(outpath, "--out", dir, "DIR", FILE_INPUT_DIR, &err) != 0) {
        fprintf(stderr, "pprun checkpoint merge: %s\n", err.msg);
        return 2;
    }
    char writer[256];
    const char *run_id = NULL; /* --step S: the files agree among themselves */
    if (step_s) {
        long v;
        if (pp_parse_long(step_s, 0, 1 << 24, "--step", &v, &err) != 0) {
            fprintf(stderr, "pprun checkpoint merge: %s\n", err.msg);
            return 2;
        }
        step = (int)v;
    } else if (checkpoint_dir_latest(dir, &step, writer, sizeof writer, &err) != 0) {
        fprintf(stderr, "pprun checkpoint merge: no complete checkpoint in %s: %s\n", dir, err.msg);
        return 2;
    } else {
        run_id = writer;
    }
    model_ckpt *ckpt;
    if (checkpoint_dir_open(dir, step, run_id, &ckpt, &err) != 0) {
        fprintf(stderr, "pprun checkpoint merge: %s\n", err.msg);
        return 2;
    }
    file_output out;
    int rc = 2;
    if (file_output_begin(&out, outpath, "--out", 0, &err) == 0) {
        /* a unit that fails its checksum is the input's fault (2), as any
         * other damage to DIR's files; a failed write is 1 */
        int wrc = model_ckpt_write(ckpt, out.f, &err);
        rc = wrc == MODEL_CKPT_EINPUT ? 2 : 1;
        if (wrc != 0) file_output_abort(&out);
        else if (file_output_commit(&out, &err) == 0) rc = 0;
    }
    if (rc == 0)
        printf("merged %s/step_%d (%d stage file%s) into %s: model %s, %d steps done, %zu weights with their AdamW "
               "moments\n",
               dir, step, model_ckpt_stages(ckpt) ? model_ckpt_stages(ckpt) : 1,
               model_ckpt_stages(ckpt) == 1 ? "" : "s", outpath, model_ckpt_spec(ckpt), model_ckpt_steps_done(ckpt),
               model_ckpt_weight_count(ckpt));
    else
        fprintf(stderr, "pprun checkpoint merge: %s\n", err.msg);
    model_ckpt_free(ckpt);
    return rc;
}

int cmd_checkpoint(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        checkpoint_usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "merge") != 0) {
        fprintf(stderr, "pprun checkpoint: %s; the one subcommand is merge\n",
                argc < 2 ? "missing subcommand" : "unknown subcommand");
        checkpoint_usage(stderr);
        return 2;
    }
    const char *dir = NULL, *step = NULL, *outpath = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            checkpoint_usage(stdout);
            return 0;
        }
        const char **slot = strcmp(a, "--step") == 0 ? &step : strcmp(a, "--out") == 0 ? &outpath : NULL;
        if (!slot && a[0] == '-') {
            fprintf(stderr, "pprun checkpoint merge: unknown option '%s'; see pprun checkpoint --help\n", a);
            return 2;
        }
        if (!slot) {
            if (dir) {
                fprintf(stderr, "pprun checkpoint merge: one DIR, got '%s' and '%s'\n", dir, a);
                return 2;
            }
            dir = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "pprun checkpoint merge: %s needs a value\n", a);
            return 2;
        }
        *slot = argv[++i];
    }
    if (!dir || !outpath) {
        fprintf(stderr, "pprun checkpoint merge: %s is required\n", !dir ? "DIR" : "--out FILE");
        checkpoint_usage(stderr);
        return 2;
    }
    return merge(dir, step, outpath);
}
