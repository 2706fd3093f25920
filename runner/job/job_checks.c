/* job_checks.c: the checks of a `pprun run` job before anything starts
 * (job_checks.h). */
#include "runner/job/job_checks.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "base/file.h"
#include "db/db.h" /* db_files */
#include "db/whatif.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif
#include "runner/job/job_program_env.h"
#include "runner/model/model.h"
#include "runner/worker/checkpoint_dir.h"

/* A folder `flag` writes files into: a directory when it is there (1),
 * else the folder that will hold it must take it (0); -1 with err. */
static int check_folder(const char *flag, const char *path, pp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        /* "new/" is the folder "new", made there */
        char folder[4096];
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        if (n >= sizeof folder) return pp_fail(err, "%s %.64s...: the path is too long", flag, path);
        memcpy(folder, path, n);
        folder[n] = '\0';
        return file_output_check(folder, flag, err);
    }
    if (!S_ISDIR(st.st_mode))
        return pp_fail(err, "%s %s: is %s, not a directory", flag, path, file_kind(st.st_mode));
    if (access(path, W_OK) != 0) return pp_fail(err, "%s %s: not writable: %s", flag, path, strerror(errno));
    return 1;
}

/* DIR/NAME, which `flag` will write: absent or a regular file. */
static int check_in_folder(const char *flag, const char *dir, const char *name, pp_err *err) {
    char path[2048];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return pp_fail(err, "%s %s: the path is too long", flag, dir);
    return file_output_check(path, flag, err);
}

/* A --save-weights file (DIR/name), written at the end over whatever is
 * there, is neither --db (nor a file SQLite keeps beside it) nor --metrics. */
static int weights_not_outputs(const run_job *job, const char *name, pp_err *err) {
    const run_config *cfg = &job->cfg;
    char weights[sizeof cfg->save_weights + 32];
    snprintf(weights, sizeof weights, "%s/%s", cfg->save_weights, name);
    for (size_t b = 0; cfg->trace && job->lo.node_rank == 0 && b < DB_FILES; b++) {
        char file[PATH_MAX + 16]; /* db_file_path resolves links */
        db_file_path(cfg->db, b, file, sizeof file);
        if (file_output_not_input(file, "--db", weights, "--save-weights'", FILE_INPUT_WRITTEN, err) != 0) return -1;
    }
    return file_output_not_input(cfg->metrics, "--metrics", weights, "--save-weights'", FILE_INPUT_WRITTEN, err);
}

/* --save-weights DIR (DIR/stage_S.f32 for every stage) and --checkpoint-dir
 * DIR (DIR/latest, and the step folders there already): refused before
 * the job starts rather than when its last step is done. */
static int check_output_folders(const run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    int there = cfg->save_weights[0] ? check_folder("--save-weights", cfg->save_weights, err) : 0;
    for (int s = 0; there > 0 && s < job->plan->stages; s++) {
        char name[32];
        snprintf(name, sizeof name, "stage_%d.f32", s);
        if (check_in_folder("--save-weights", cfg->save_weights, name, err) != 0 ||
            weights_not_outputs(job, name, err) != 0)
            return -1;
    }
    if (there < 0) return -1;
    there = cfg->checkpoint_dir[0] ? check_folder("--checkpoint-dir", cfg->checkpoint_dir, err) : 0;
    if (there > 0 && (check_in_folder("--checkpoint-dir", cfg->checkpoint_dir, "latest", err) != 0 ||
                      checkpoint_dir_check_steps(cfg->checkpoint_dir, job->progress_next, cfg->steps,
                                                 cfg->checkpoint_every, job->plan->stages, err) != 0))
        return -1;
    return there < 0 ? -1 : 0;
}

/* --db, which SQLite opens for writing with the files it keeps beside it:
 * each must be nothing yet or a regular file. SQLite follows a link there,
 * and a failed open removed a planted -journal. */
static int check_db(const char *path, pp_err *err) {
    for (size_t i = 0; i < DB_FILES; i++) {
        char file[PATH_MAX + 16]; /* db_file_path resolves links */
        db_file_path(path, i, file, sizeof file);
        if (file_output_check(file, "--db", err) != 0) return -1;
    }
    return 0;
}

/* No file the job writes is one it reads, or another it writes: --db
 * (and the files SQLite keeps beside it) and --metrics against --data,
 * --eval-data, --init-from, csv:FILE, --schedule-costs DB (which --db may
 * be: it is read before the job's row is added) and the checkpoint's
 * latest pointer (the --save-weights files: check_output_folders, once the
 * stages are known). Before anything is opened: the job then changes nothing. */
static int check_outputs_not_inputs(const run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    const struct {
        const char *path, *what;
    } in[] = {{cfg->data, "--data"},
              {cfg->eval_data, "--eval-data"},
              {cfg->init_from, "--init-from"},
              {cfg->schedule_csv, "--schedule csv:"},
              {cfg->schedule_costs_db, "--schedule-costs"}};
    char latest[sizeof cfg->checkpoint_dir + 8] = "";
    if (cfg->checkpoint_dir[0]) snprintf(latest, sizeof latest, "%s/latest", cfg->checkpoint_dir);
    int db = cfg->trace && job->lo.node_rank == 0;
    for (size_t b = 0; db && b < DB_FILES; b++) {
        char file[PATH_MAX + 16]; /* db_file_path resolves links */
        db_file_path(cfg->db, b, file, sizeof file);
        for (size_t i = 0; i < sizeof in / sizeof in[0] - 1; i++) /* all but --schedule-costs, the last */
            if (file_output_not_input(file, "--db", in[i].path, in[i].what, 0, err) != 0) return -1;
        if (file_output_not_input(file, "--db", latest, "--checkpoint-dir's", FILE_INPUT_WRITTEN, err) != 0)
            return -1;
        if (file_output_not_input(cfg->metrics, "--metrics", file, "--db", FILE_INPUT_WRITTEN, err) != 0)
            /* named as the user gave it: --db pprun.db, whose WAL file pprun.db-wal is */
            return b == 0 ? -1
                          : pp_fail(err, "--metrics %s: is the %s of --db %s, which this command also writes: one "
                                         "would overwrite the other; name another file (nothing was changed)",
                                    cfg->metrics, db_file_roles[b], cfg->db);
    }
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (file_output_not_input(cfg->metrics, "--metrics", in[i].path, in[i].what, 0, err) != 0) return -1;
    return file_output_not_input(cfg->metrics, "--metrics", latest, "--checkpoint-dir's", FILE_INPUT_WRITTEN, err);
}

/* --fail-at at a step before the one the job starts at (--resume,
 * --init-from) would never fire, and the job would succeed for the wrong
 * reason: refused. `from` names where the start comes from. */
static int fail_at_not_before(const run_job *job, int start, const char *from, pp_err *err) {
    const run_fail_at *f = &job->cfg.fail_at;
    if (!f->enabled || f->step >= start) return 0;
    return pp_fail(err, "--fail-at step=%d: the job starts at step %d (%s), so it runs steps %d..%d", f->step, start,
                   from, start, job->cfg.steps - 1);
}

/* --resume: the checkpoint must be there, whole (the stage files of its
 * step, of whatever layout, as the workers will read them), every unit
 * passing its checksum (a damaged one failed every rank that loads it,
 * once the job had started, and again at each restart), of this job's
 * model, and leave steps to run. */
static int check_resume(run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    int step;
    char writer[256];
    if (checkpoint_dir_latest(cfg->checkpoint_dir, &step, writer, sizeof writer, err) != 0)
        return pp_wrap(err, "--resume: no complete checkpoint in %s", cfg->checkpoint_dir);
    model_ckpt *ckpt;
    if (checkpoint_dir_open(cfg->checkpoint_dir, step, writer, &ckpt, err) != 0) return pp_wrap(err, "--resume");
    int rc = model_ckpt_check(ckpt, &cfg->model, err);
    if (rc == 0) rc = model_ckpt_verify(ckpt, err);
    model_ckpt_free(ckpt);
    if (rc != 0) return pp_wrap(err, "--resume: %s/step_%d", cfg->checkpoint_dir, step);
    if (step + 1 >= cfg->steps)
        return pp_fail(err,
                       "--resume: the checkpoint in %s (step_%d) has %d steps done; --steps %d leaves nothing "
                       "to run",
                       cfg->checkpoint_dir, step, step + 1, cfg->steps);
    job->progress_next = step + 1;
    return fail_at_not_before(job, step + 1, "--resume", err);
}

/* --init-from FILE: a whole checkpoint of this job's model, every unit
 * passing its checksum, that leaves steps to run. */
static int check_init_from(run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    model_ckpt *ckpt;
    if (model_ckpt_create(&ckpt, err) != 0) return -1;
    int rc = model_ckpt_add_file(ckpt, cfg->init_from, err);
    if (rc == 0) rc = model_ckpt_check(ckpt, &cfg->model, err);
    if (rc == 0) rc = model_ckpt_verify(ckpt, err);
    int done = rc == 0 ? model_ckpt_steps_done(ckpt) : 0;
    model_ckpt_free(ckpt);
    if (rc != 0) return pp_wrap(err, "--init-from %s", cfg->init_from);
    if (done >= cfg->steps)
        return pp_fail(err, "--init-from %s has %d steps done; --steps %d leaves nothing to run", cfg->init_from, done,
                       cfg->steps);
    job->progress_next = done;
    return fail_at_not_before(job, done, "--init-from", err);
}

/* Whether the rank's action list in the plan holds an op --fail-at's
 * phase and mb name (run_fail_at_names: a fused BW is a B and a W). */
static int fail_at_in_plan(const run_fail_at *f, const sched_plan *plan) {
    int prank = f->rank % plan->ranks; /* its place in its replica's pipeline: every replica runs the plan */
    for (int i = 0; i < plan->len[prank]; i++)
        if (run_fail_at_names(f, plan->actions[prank][i].op, plan->actions[prank][i].mb)) return 1;
    return 0;
}

/* --fail-at must name a point the job reaches, or the test it serves would
 * pass for the wrong reason. The step against --resume and --init-from:
 * fail_at_not_before. */
static int check_fail_at(const run_job *job, int world, pp_err *err) {
    const run_fail_at *f = &job->cfg.fail_at;
    if (!f->enabled) return 0;
    if (f->rank >= world) return pp_fail(err, "--fail-at rank=%d: the job has ranks 0..%d", f->rank, world - 1);
    if (f->step >= job->cfg.steps) return pp_fail(err, "--fail-at step=%d: the job runs steps 0..%d", f->step, job->cfg.steps - 1);
    if (f->mb >= job->cfg.microbatches)
        return pp_fail(err, "--fail-at mb=%d: the job has microbatches 0..%d", f->mb, job->cfg.microbatches - 1);
    if (f->phase == RUN_FAIL_AT_ALLREDUCE && job->cfg.dp < 2)
        return pp_fail(err, "--fail-at phase=allreduce: the job has one pipeline, so no gradient all-reduce (give --dp "
                            "2 or more)");
    if (f->phase != RUN_FAIL_AT_ALLREDUCE && (f->phase >= 0 || f->mb >= 0) && !fail_at_in_plan(f, job->plan))
        return pp_fail(err, "--fail-at %s: rank %d runs no such op in the plan of --schedule %s", f->text, f->rank,
                       job->plan->name);
    return 0;
}

/* --device cuda is checked here, before any worker starts: no toolkit at build
 * time, or no device now (the workers would all fail the same way). */
static int check_cuda(run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    if (cfg->model.kind != MODEL_GPT)
        return pp_fail(err, "--device cuda runs the gpt model only; --model %s runs on --device cpu", cfg->model_text);
#ifdef PPRUN_HAVE_CUDA
    if (gpu_device_count(&job->cuda_devices, err) != 0) return pp_wrap(err, "--device cuda");
    return 0;
#else
    return pp_fail(err, "--device cuda: this pprun was built without the GPU backend; use --device cpu");
#endif
}

/* The numbers read from a job's trace as the workers will take them (they
 * get the costs as text, parsed by the rule a user's text is): a forged or
 * damaged database's span of 2e13 ns was taken here and refused by every
 * worker, the job failed over numbers the user never typed. Named with the
 * job they came from. */
static int measured_costs_check(const run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    char text[256];
    sched_costs back = {0};
    sched_costs_text(&cfg->schedule_costs, text, sizeof text);
    if (sched_parse_costs(text, "measured", &back, err) != 0) return pp_wrap(err, "%s", job->costs_about);
    if (!(back.f > 0 && back.b > 0))
        return pp_fail(err, "%s: its F and B took no time (F %g ns, B %g ns): the database is damaged or was not "
                            "written by pprun", job->costs_about, back.f, back.b);
    for (int i = 0; i < cfg->nact && job->act_about[0]; i++)
        if (!sched_act_valid(cfg->act[i]))
            return pp_fail(err, "%s: stage %d's bytes are negative or not a number (F %g, B %g): the database is "
                                "damaged or was not written by pprun", job->act_about, i, cfg->act[i].f, cfg->act[i].b);
    return 0;
}

/* --schedule-costs DB[:JOB]: a job's measured op costs, read once here, so
 * that every worker builds the same order from the same numbers (they get
 * them as --schedule-costs f=..,b=..,w=..,comm=..). */
static int read_schedule_costs(run_job *job, int world, pp_err *err) {
    run_config *cfg = &job->cfg;
    const char *path = cfg->schedule_costs_db;
    if (access(path, R_OK) != 0) return pp_fail(err, "--schedule-costs %s: cannot read it: %s", path, strerror(errno));
    sqlite3 *sql;
    if (db_open_readonly("--schedule-costs", path, &sql, err) != 0) return -1;
    int64_t id = cfg->schedule_costs_job ? cfg->schedule_costs_job : db_newest_job(sql, err);
    int rc = -1, v = cfg->schedule == RUN_SCHEDULE_ZB_V ? 2 : 1; /* zb-v, or zb-h1 under --max-mem */
    if (id == 0) pp_fail(err, "no job in it yet");
    else if (id > 0)
        rc = whatif_costs_for(sql, id, job->model, world, v, &cfg->schedule_costs, job->costs_about,
                              sizeof job->costs_about, err);
    /* --max-mem in bytes: that job's measured bytes per stage, handed to the workers as --act-bytes */
    if (rc == 0 && cfg->max_mem_bytes && !cfg->nact) { /* world * v <= 2048 = RUN_MAX_ACT */
        /* as config_json records this job's (job_rows.c): that job's must match */
        whatif_layout layout = {.recompute_stages = ""};
        sched_cuts_text(cfg->cuts, cfg->ncuts, layout.cuts, sizeof layout.cuts);
        snprintf(layout.recompute, sizeof layout.recompute, "%s", run_recompute_name(cfg->recompute));
        if (cfg->recompute != RUN_RECOMPUTE_NONE && cfg->nrecompute_stages > 0)
            sched_cuts_text(cfg->recompute_stages, cfg->nrecompute_stages, layout.recompute_stages,
                            sizeof layout.recompute_stages);
        rc = whatif_act_for(sql, id, job->model, world * v, &layout, cfg->act, job->act_about,
                            sizeof job->act_about, err);
        if (rc == 0) cfg->nact = world * v;
    }
    db_reader_close(sql);
    if (rc == 0) rc = measured_costs_check(job, err);
    if (rc != 0) return pp_wrap(err, "--schedule-costs %s", path);
    cfg->has_schedule_costs = 1;
    return 0;
}

/* `-- PROGRAM`: the job is the schedule; the program is the model, and
 * jobs.model names it ("program:python3 train.py --lr 3e-4"). --device
 * only labels the job: the program picks its own device. */
static void name_program(run_job *job) {
    int n = snprintf(job->model, sizeof job->model, "program:");
    for (int i = 0; i < job->lo.prog_argc && n < (int)sizeof job->model; i++)
        n += snprintf(job->model + n, sizeof job->model - (size_t)n, i ? " %s" : "%s", job->lo.prog_argv[i]);
}

/* --schedule csv:FILE sets the pipeline's ranks (its rows) and the
 * microbatches (docs/cli.md): what the command line left out comes from the
 * file, so `pprun schedule --csv-out` then `pprun run --schedule csv:` runs
 * as written; a value given that the file contradicts is refused by name.
 * The file is read here only: job->csv_plan goes on to run_config_plan. */
static int csv_shape(run_job *job, pp_err *err) {
    run_config *cfg = &job->cfg;
    launch_options *lo = &job->lo;
    if (cfg->schedule != RUN_SCHEDULE_CSV) return 0;
    if (sched_load_csv(cfg->schedule_csv, &job->csv_plan, err) != 0)
        return pp_wrap(err, "--schedule csv:%s", cfg->schedule_csv);
    int ranks = job->csv_plan->ranks, m = job->csv_plan->microbatches;
    const char *file = cfg->schedule_csv;
    if (job->microbatches_given && cfg->microbatches != m)
        return pp_fail(err, "--microbatches %d: --schedule csv:%s has %d microbatches (the file sets them): give "
                            "--microbatches %d, or leave it out", cfg->microbatches, file, m, m);
    cfg->microbatches = m;
    if (cfg->pp && cfg->pp != ranks)
        return pp_fail(err, "--pp %d: --schedule csv:%s has %d ranks (rows) per pipeline (the file sets them): give "
                            "--pp %d, or leave it out", cfg->pp, file, ranks, ranks);
    /* one pipeline of the file's ranks, or --dp of them */
    long want = (long)ranks * (cfg->dp ? cfg->dp : 1);
    char dp[32] = "", nodes[32] = "";
    if (cfg->dp) snprintf(dp, sizeof dp, " x --dp %d", cfg->dp);
    if (lo->nnodes > 1) snprintf(nodes, sizeof nodes, " on each of --nnodes %d", lo->nnodes);
    if (want % lo->nnodes != 0)
        return pp_fail(err, "--schedule csv:%s has %d ranks (rows)%s: %ld ranks do not split evenly over --nnodes %d",
                       file, ranks, dp, want, lo->nnodes);
    if (want / lo->nnodes > LAUNCH_MAX_NPROC)
        return pp_fail(err, "--schedule csv:%s has %d ranks (rows)%s: %ld ranks per node are over the limit of %d",
                       file, ranks, dp, want / lo->nnodes, LAUNCH_MAX_NPROC);
    if (!(lo->given & LAUNCH_GIVEN_NPROC)) {
        lo->nproc_per_node = (int)(want / lo->nnodes);
        return 0;
    }
    if (lo->nproc_per_node == want / lo->nnodes) return 0;
    return pp_fail(err, "--nproc-per-node %d: --schedule csv:%s has %d ranks (rows)%s, so the job runs "
                        "--nproc-per-node %ld%s: give that, or leave it out (the file sets it)",
                   lo->nproc_per_node, file, ranks, dp, want / lo->nnodes, nodes);
}

/* The options against each other and this machine; jobs.model. */
static int check_options(run_job *job, pp_err *err) {
    run_config *cfg = &job->cfg;
    if (job->program && job->worker_flag[0])
        return pp_fail(err, "%s configures pprun's built-in worker; with -- PROGRAM your program is the model "
                            "(give it its own options after PROGRAM)", job->worker_flag);
    if (run_config_finish(cfg, err) != 0) return -1;
    if (job->program) {
        /* bytes per stage are the model's (config/model_act.h): a program's are its own */
        if (cfg->max_mem_bytes && !cfg->nact && !cfg->schedule_costs_db[0])
            return pp_fail(err, "--max-mem in bytes bounds by each stage's activation bytes, which pprun knows for "
                                "its own models only: give them with --act-bytes F[:B], or the bound in "
                                "microbatch-stages (--max-mem N)");
        name_program(job);
        cfg->cupti = 0;
        cfg->progress = RUN_PROGRESS_OFF; /* its numbers come from pprun's worker */
    } else {
        model_spec_format(&cfg->model, job->model, sizeof job->model);
    }
    if (!job->program && cfg->device == RUN_DEVICE_CUDA && check_cuda(job, err) != 0) return -1;
    return job_mps_decide(&job->mps, cfg, job->program, job->lo.nproc_per_node, job->cuda_devices, err);
}

/* pprun's own worker: the model over the plan's stages, the GPU transport,
 * the data, and what the worker will read and write. */
static int check_worker_job(run_job *job, int world, pp_err *err) {
    run_config *cfg = &job->cfg;
    int *first = calloc((size_t)job->plan->stages + 1, sizeof *first);
    if (!first) return pp_fail(err, "out of memory");
    int rc =
        sched_partition(cfg->model.layers, job->plan->stages, cfg->ncuts ? cfg->cuts : NULL, cfg->ncuts, first, err);
    free(first);
    if (rc != 0) return pp_wrap(err, "--model %s with %d stages", cfg->model_text, job->plan->stages);
    if (cfg->device == RUN_DEVICE_CUDA &&
        run_config_check_gpu_transport(cfg, job->plan, job->lo.nproc_per_node, job->cuda_devices, err) != 0)
        return -1;
    if (cfg->model.kind == MODEL_GPT) {
        data_source *data = NULL, *held = NULL;
        size_t min_bytes = model_tokens_per_microbatch(&cfg->model) + 1;
        if (data_open(cfg->data[0] ? cfg->data : NULL, min_bytes, &data, err) != 0)
            return -1; /* its messages name --data */
        /* --eval-every: the file, or the held-out tenth, must hold a microbatch */
        int rc = !cfg->eval_every      ? 0
                 : cfg->eval_data[0] ? data_open_as(cfg->eval_data, "--eval-data", min_bytes, &held, err)
                                     : data_hold_out(data, min_bytes, &held, err);
        data_close(data), data_close(held);
        if (rc != 0) return -1;
    } else if (cfg->data[0] || cfg->eval_data[0]) {
        return pp_fail(err, "%s %s: a timed model trains on no data (only gpt reads it)",
                       cfg->data[0] ? "--data" : "--eval-data", cfg->data[0] ? cfg->data : cfg->eval_data);
    }
    for (int i = 0; i < cfg->nrecompute_stages; i++)
        if (cfg->recompute_stages[i] >= job->plan->stages)
            return pp_fail(err, "--recompute-stages %d: the job has stages 0..%d", cfg->recompute_stages[i],
                           job->plan->stages - 1);
    if (check_fail_at(job, world, err) != 0) return -1;
    if (cfg->metrics[0] && file_output_check(cfg->metrics, "--metrics", err) != 0) return -1;
    /* the start first: the step folders checked are those from it on */
    if (cfg->init_from[0] ? check_init_from(job, err) != 0 : cfg->resume && check_resume(job, err) != 0) return -1;
    return check_output_folders(job, err);
}

/* --pp P --dp D without --nproc-per-node set the ranks themselves, P x D
 * over the nodes (job_options): when the nodes cannot take them, that is
 * what is wrong, not --nproc-per-node's default of 4, which job_options
 * falls back to then and which the user never asked for. */
static int check_mesh_over_nodes(const run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    long mesh = (long)cfg->pp * cfg->dp, nodes = job->lo.nnodes;
    if ((job->lo.given & LAUNCH_GIVEN_NPROC) || mesh <= 0) return 0;
    if (mesh % nodes != 0)
        return pp_fail(err,
                       "--pp %d x --dp %d make %ld ranks, which --nnodes %ld cannot split evenly (every node "
                       "starts as many): give --pp x --dp a multiple of %ld, or --nproc-per-node",
                       cfg->pp, cfg->dp, mesh, nodes, nodes);
    char each[64] = "";
    if (nodes > 1) snprintf(each, sizeof each, ", %ld on each of --nnodes %ld", mesh / nodes, nodes);
    if (mesh / nodes > LAUNCH_MAX_NPROC)
        return pp_fail(err,
                       "--pp %d x --dp %d make %ld ranks%s: over the limit of %d ranks a node; spread them over "
                       "more nodes (--nnodes)",
                       cfg->pp, cfg->dp, mesh, each, LAUNCH_MAX_NPROC);
    return 0;
}

int job_check(run_job *job, pp_err *err) {
    run_config *cfg = &job->cfg;
    if (check_outputs_not_inputs(job, err) != 0) return -1;
    if (csv_shape(job, err) != 0) return -1;
    if (check_mesh_over_nodes(job, err) != 0) return -1; /* before job_mps_decide counts the wrong ranks */
    if (check_options(job, err) != 0) return -1;
    int world = job->lo.nproc_per_node * job->lo.nnodes;
    /* a --nproc-per-node the user never gave is said to be the default: past
     * check_mesh_over_nodes, it is what starts the ranks (--pp or --dp alone) */
    char from[96];
    snprintf(from, sizeof from, "--nproc-per-node %d%s x --nnodes %d", job->lo.nproc_per_node,
             job->lo.given & LAUNCH_GIVEN_NPROC ? "" : " (the default)", job->lo.nnodes);
    if (run_config_mesh(cfg, world, from, err) != 0) return -1;
    /* one pipeline's plan: every replica runs it (docs/cli.md, "Data parallel") */
    if (cfg->schedule_costs_db[0] && read_schedule_costs(job, cfg->pp, err) != 0) return -1;
    sched_plan *csv = job->csv_plan; /* taken over */
    job->csv_plan = NULL;
    if (run_config_plan(cfg, cfg->pp, csv, &job->plan, err) != 0) return -1;
    if (cfg->serve && !cfg->trace) return pp_fail(err, "--serve shows the trace: it needs --trace on");
    if (cfg->allow_hosts[0] && !cfg->serve)
        return pp_fail(err, "--allow-host names a host the dashboard answers to: it needs --serve");
    if (cfg->trace && job->lo.node_rank == 0 && check_db(cfg->db, err) != 0) return -1;
    if (!job->program) return check_worker_job(job, world, err);
    if (job_program_env_check(job->plan, err) != 0) return -1;
    return launch_check_program(&job->lo, err);
}

void job_checks_say_threads(const run_job *job) {
    if (job->program) return; /* a program's own collectives */
    long ranks = job->lo.nproc_per_node, dp = job->cfg.dp, pp = job->cfg.pp;
    /* its data-parallel group and its pipeline neighbours; then its own
     * three (the main, comm's monitor, the all-reduce's): 35 a rank
     * measured at --pp 4 --dp 16 */
    long neighbours = pp > 2 ? 2 : pp - 1, need = ranks * (2 * (dp - 1 + neighbours) + 3);
    char which[128] = "";
    long left = pp_threads_left(which, sizeof which);
    if (left < 0 || need <= left) return;
    fprintf(stderr,
            "pprun run: warning: the %ld ranks of this node may start up to %ld threads (a reader and a sender for "
            "each rank a rank talks to: %ld of its data-parallel group, %ld pipeline neighbour%s; docs/comm.md, "
            "\"Threads\"), more than the %ld the machine has left (%s): a rank that cannot start one fails the job; "
            "raise the limit or run fewer ranks a node\n",
            ranks, need, dp - 1, neighbours, neighbours == 1 ? "" : "s", left, which);
}

void job_checks_say_costs(const run_job *job) {
    if (job->act_about[0])
        fprintf(stderr, "pprun run: --max-mem bounds each stage by the bytes %s measured (%s)\n",
                job->cfg.schedule_costs_db, job->act_about);
    if (!job->costs_about[0]) return;
    const sched_costs *c = &job->cfg.schedule_costs;
    char schedule[RUN_SCHEDULE_TEXT_MAX]; /* zb-v, or zb-h1 under --max-mem */
    fprintf(stderr,
            "pprun run: %s ordered for F %.3f ms, B %.3f ms, W %.3f ms, hand-off %.3f ms, between ops %.3f ms (%s, "
            "%s)\n",
            run_schedule_text(&job->cfg, schedule, sizeof schedule), c->f / 1e6, c->b / 1e6, c->w / 1e6,
            c->comm / 1e6, c->between / 1e6, job->cfg.schedule_costs_db, job->costs_about);
}
