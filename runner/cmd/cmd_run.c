/* cmd_run.c: `pprun run`: a pipeline training job on this node (docs/design.md §1, §3).
 *
 * The launcher side of a job: parses and checks the job's options (bad input
 * exits 2 before anything starts), writes the job, its ranks and its plan
 * into the database, creates one trace ring per local rank and the collector
 * that drains them, optionally serves the dashboard, then runs the workers
 * (`pprun worker`) through the same supervisor as `pprun launch`, so every
 * failure, signal and restart rule holds. At the end the job's outcome is
 * written and, with --serve, the dashboard stays up until Ctrl-C.
 *
 * `pprun run [options] -- PROGRAM [ARGS]` runs the user's own program in
 * place of the built-in worker: the same job, rings and dashboard, with the
 * schedule in the program's environment (program_env) and its ops recorded
 * through libpprun_trace (tracer/pprun_trace.h, docs/trace-api.md). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>

#include "db/alive.h"
#include "db/db.h"
#include "db/whatif.h"
#include "runner/cmd/cli.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif
#include "runner/comm/comm.h"
#include "runner/model/model.h"
#include "runner/worker/checkpoint_dir.h"
#include "runner/launch/launch.h"
#include "config/run_config.h"
#include "runner/job/run_plan.h"
#include "runner/job/run_progress.h"
#include "report/text.h"
#include "runner/store/store.h"
#include "tracer/clock.h"
#include "runner/job/collector.h"
#include "tracer/ring.h"
#include "web/http.h"

#define RUN_RING_CAPACITY (1u << 16)
/* --cupti on: every kernel is a record, written in one burst at the end of
 * each step (tens of thousands for a large stage): 16 MB per rank. */
#define RUN_RING_CAPACITY_CUPTI (1u << 18)
#define RUN_CLOCK_ROUNDS 16
/* How often the collector drains the rings: a ring holds 65536 records, a
 * rank records a few hundred per step, so 50 ms is far from a drop, while
 * each drain costs a transaction (5 ms drains cost the launcher 1.5% of the
 * job's CPU, bench/pipeline). */
#define RUN_COLLECT_INTERVAL_NS (50ull * 1000000ull)

typedef struct run_job {
    run_config cfg;
    launch_options lo;
    sched_plan *plan;
    db *db; /* the job's writer; only the collector thread writes while it runs */
    int64_t job_id;
    collector *coll;
    trace_ring **rings; /* [nproc_per_node], owned by the collector once added */
    http_server *web;
    run_progress *progress;
    int progress_next; /* the next step the display shows, across attempts */
    int plan_refreshed; /* the plan has simulated times at measured costs (the collector's thread) */
    char node_addr[INET6_ADDRSTRLEN];
    char self_exe[4096];
    char *worker_argv[RUN_CONFIG_MAX_ARGS + 8];
    char *worker_args[RUN_CONFIG_MAX_ARGS + 1];
    int cuda_devices;       /* --device cuda: devices this node sees */
    char costs_about[256];  /* --schedule-costs DB: which job and steps its numbers are from */
    int program;            /* 1: `-- PROGRAM` runs instead of the built-in worker */
    char worker_flag[32];   /* the first option given that only the built-in worker takes */
    char model[256];        /* jobs.model: the canonical --model, or "program:COMMAND LINE" */
} run_job;

static void usage(FILE *out) {
    fprintf(out,
            "usage: pprun run [job options] [launcher options] [-- PROGRAM [ARGS...]]\n\n"
            "Runs a pipeline-parallel training job: one worker per rank, traced into --db.\n"
            "With -- PROGRAM, your own program runs on every rank instead of pprun's worker,\n"
            "gets the schedule in its environment and records its ops with libpprun_trace\n"
            "(docs/trace-api.md); the job options marked * configure pprun's worker only.\n\n"
            "job options:\n"
            "  --schedule S          gpipe|1f1b|interleaved-1f1b|zb-h1|zb-v|csv:FILE (default 1f1b)\n"
            "  --microbatches M      microbatches per step (default 8)\n"
            "  --virtual-stages V    model chunks per rank (interleaved-1f1b, zb-v: 2)\n"
            "* --pipeline-cuts L,..  first layer of stages 1..S-1, or even (the default)\n"
            "  --schedule-costs C    order zb-v for these op costs: f=3.8ms,b=3.5ms,w=1.6ms,comm=66us,\n"
            "                        or DB[:JOB] for a job's measured ones (default: the model's)\n"
            "  --steps N             training steps (default 20)\n"
            "* --model SPEC          gpt[:layers=L,dim=D,heads=H,seq=T,batch=N] or\n"
            "                        timed:f=2ms,b=2ms,w=2ms,act=64KiB[,layers=K,per=layer] (default gpt)\n"
            "* --data FILE           train on this text file (default: the built-in corpus)\n"
            "  --device cpu|cuda     (default cpu)\n"
            "* --dtype fp32|bf16     GEMM operands (default fp32; bf16 needs --device cuda)\n"
            "* --seed N  --lr X  --optimizer adamw|sgd  --weight-decay X\n"
            "  --db FILE             trace database (default ./pprun.db)\n"
            "  --trace on|off        (default on)\n"
            "* --cupti on|off        GPU spans and kernels from CUPTI (default on with --device cuda\n"
            "                        and --trace on; needs both)\n"
            "  --serve [HOST:PORT]   live dashboard (default 127.0.0.1:8080); stays up after\n"
            "                        the job until Ctrl-C\n"
            "  --token T             required for a non-loopback --serve (or PPRUN_TOKEN)\n"
            "* --checkpoint-dir D  --checkpoint-every K  --resume\n"
            "* --metrics FILE        JSON lines, one per step\n"
            "* --save-weights DIR    every stage's final weights (raw float32)\n"
            "* --fail-at step=S,rank=R[,phase=F|B|W,mb=M]   fault injection (first attempt)\n"
            "* --recv-timeout T      (default 120s)\n"
            "* --transport T         auto|shm|tcp|cuda-ipc|nccl (default auto: with --device cuda,\n"
            "                        boundary tensors stay in GPU memory, cuda-ipc between ranks\n"
            "                        on one GPU, nccl otherwise; shm|tcp stage them through the host)\n"
            "* --progress auto|on|off  the progress line (its numbers come from pprun's worker)\n\n"
            "launcher options (as `pprun launch`):\n");
    launch_usage(out, 4);
}

/* The launcher's parser hands us every option it does not know. */
static int job_option(void *ctx, const char *opt, const char *val, pp_err *err) {
    run_job *job = ctx;
    if (strcmp(opt, "--help") == 0) {
        usage(stdout);
        return 1;
    }
    if (run_config_worker_only(opt) && !job->worker_flag[0])
        snprintf(job->worker_flag, sizeof job->worker_flag, "%s", opt);
    if (strcmp(opt, "--serve") == 0) {
        /* An optional value: the next argument, unless it is another option
         * (pprun run takes no positional arguments). A bare port means
         * 127.0.0.1:PORT. */
        if (!val || val[0] == '-') return run_config_option(&job->cfg, opt, NULL, err) < 0 ? -1 : 1;
        char addr[128];
        if (val[0] && strspn(val, "0123456789") == strlen(val)) {
            snprintf(addr, sizeof addr, "127.0.0.1:%.16s", val);
            val = addr;
        } else if (!strchr(val, ':')) {
            return pp_fail(err, "--serve: expected HOST:PORT or a port, got '%s'", val);
        }
        return run_config_option(&job->cfg, opt, val, err) < 0 ? -1 : 2;
    }
    if (strcmp(opt, "--resume") == 0) return run_config_option(&job->cfg, opt, NULL, err) < 0 ? -1 : 1;
    if (!run_config_takes_value(opt)) return 0;
    if (!val) return pp_fail(err, "%s needs a value", opt);
    int rc = run_config_option(&job->cfg, opt, val, err);
    return rc < 0 ? -1 : rc == 1 ? 2 : 0;
}

/* The address this node uses to reach the master: what other nodes' ranks
 * connect to for TCP transport. */
static void node_address(const char *master, char *out, size_t n) {
    snprintf(out, n, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(master, "9", &hints, &ai) != 0) return;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &len) == 0)
        inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)n);
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
}

/* --- checks before anything starts --------------------------------------------- */

/* Where `flag` will write: `path` itself when it exists (a directory when
 * want_dir), else the folder that will hold it. */
static int check_writable(const char *flag, const char *path, int want_dir, pp_err *err) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (want_dir && !S_ISDIR(st.st_mode)) return pp_fail(err, "%s %s: not a directory", flag, path);
        if (!want_dir && S_ISDIR(st.st_mode)) return pp_fail(err, "%s %s: is a directory", flag, path);
        if (access(path, W_OK) != 0) return pp_fail(err, "%s %s: not writable: %s", flag, path, strerror(errno));
        return 0;
    }
    char parent[1024];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = '\0';
    else *slash = '\0';
    if (access(parent, W_OK) != 0)
        return pp_fail(err, "%s %s: cannot create it in %s: %s", flag, path, parent, strerror(errno));
    return 0;
}

/* --resume: the checkpoint must be there and leave steps to run. */
static int check_resume(run_job *job, pp_err *err) {
    const run_config *cfg = &job->cfg;
    int step;
    char writer[256];
    if (checkpoint_dir_latest(cfg->checkpoint_dir, &step, writer, sizeof writer, err) != 0)
        return pp_wrap(err, "--resume: no complete checkpoint in %s", cfg->checkpoint_dir);
    if (step + 1 >= cfg->steps)
        return pp_fail(err, "--resume: the checkpoint in %s is at step %d; --steps %d leaves nothing to run",
                       cfg->checkpoint_dir, step, cfg->steps);
    job->progress_next = step + 1;
    return 0;
}

/* --fail-at must name a point the job reaches, or the test it serves would
 * pass for the wrong reason. */
static int check_fail_at(const run_job *job, int world, pp_err *err) {
    const run_fail_at *f = &job->cfg.fail_at;
    if (!f->enabled) return 0;
    if (f->rank >= world) return pp_fail(err, "--fail-at rank=%d: the job has ranks 0..%d", f->rank, world - 1);
    if (f->step >= job->cfg.steps) return pp_fail(err, "--fail-at step=%d: the job runs steps 0..%d", f->step, job->cfg.steps - 1);
    if (f->mb >= job->cfg.microbatches)
        return pp_fail(err, "--fail-at mb=%d: the job has microbatches 0..%d", f->mb, job->cfg.microbatches - 1);
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

/* --schedule-costs DB[:JOB]: a job's measured op costs, read once here, so
 * that every worker builds the same order from the same numbers (they get
 * them as --schedule-costs f=..,b=..,w=..,comm=..). */
static int read_schedule_costs(run_job *job, int world, pp_err *err) {
    run_config *cfg = &job->cfg;
    const char *path = cfg->schedule_costs_db;
    if (access(path, R_OK) != 0) return pp_fail(err, "--schedule-costs %s: cannot read it: %s", path, strerror(errno));
    sqlite3 *sql;
    if (db_open_readonly(path, &sql, err) != 0) return pp_wrap(err, "--schedule-costs %s", path);
    int64_t id = cfg->schedule_costs_job ? cfg->schedule_costs_job : db_newest_job(sql, err);
    int rc = -1;
    if (id == 0) pp_fail(err, "no job in it yet");
    else if (id > 0)
        rc = whatif_costs_for(sql, id, job->model, world, 2, &cfg->schedule_costs, job->costs_about,
                              sizeof job->costs_about, err);
    sqlite3_close(sql);
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

/* Linux refuses to start a program with one environment string over 128
 * KiB (MAX_ARG_STRLEN): a long PPRUN_ACTIONS is refused here, naming it,
 * rather than every rank failing to start. */
#define RUN_ENV_STRING_MAX (128 * 1024 - 1)
static int check_program_env(const sched_plan *plan, pp_err *err) {
    for (int r = 0; r < plan->ranks; r++) {
        size_t bytes = strlen("PPRUN_ACTIONS=");
        char action[16];
        for (int i = 0; i < plan->len[r]; i++) bytes += strlen(sched_action_str(&plan->actions[r][i], action)) + 1;
        if (bytes > RUN_ENV_STRING_MAX)
            return pp_fail(err, "rank %d's PPRUN_ACTIONS would be %zu bytes, more than the %d an environment variable "
                                "may hold; use fewer --microbatches or --virtual-stages", r, bytes, RUN_ENV_STRING_MAX);
    }
    return 0;
}

static int check_job(run_job *job, pp_err *err) {
    run_config *cfg = &job->cfg;
    if (job->program && job->worker_flag[0])
        return pp_fail(err, "%s configures pprun's built-in worker; with -- PROGRAM your program is the model "
                            "(give it its own options after PROGRAM)", job->worker_flag);
    if (run_config_finish(cfg, err) != 0) return -1;
    if (job->program) {
        name_program(job);
        cfg->cupti = 0;
        cfg->progress = RUN_PROGRESS_OFF; /* its numbers come from pprun's worker */
    } else {
        model_spec_format(&cfg->model, job->model, sizeof job->model);
    }
    if (!job->program && cfg->device == RUN_DEVICE_CUDA && check_cuda(job, err) != 0) return -1;
    int world = job->lo.nproc_per_node * job->lo.nnodes;
    if (cfg->schedule_costs_db[0] && read_schedule_costs(job, world, err) != 0) return -1;
    if (run_config_plan(cfg, world, &job->plan, err) != 0) return -1;
    if (cfg->serve && !cfg->trace) return pp_fail(err, "--serve shows the trace: it needs --trace on");
    if (cfg->trace && job->lo.node_rank == 0 && check_writable("--db", cfg->db, 0, err) != 0) return -1;
    if (job->program) return check_program_env(job->plan, err);
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
        data_source *data = NULL;
        if (data_open(cfg->data[0] ? cfg->data : NULL, model_tokens_per_microbatch(&cfg->model) + 1, &data, err) != 0)
            return -1; /* its messages name --data */
        data_close(data);
    } else if (cfg->data[0]) {
        return pp_fail(err, "--data %s: a timed model trains on no data (only gpt reads it)", cfg->data);
    }
    if (check_fail_at(job, world, err) != 0) return -1;
    if (cfg->metrics[0] && check_writable("--metrics", cfg->metrics, 0, err) != 0) return -1;
    if (cfg->save_weights[0] && check_writable("--save-weights", cfg->save_weights, 1, err) != 0) return -1;
    if (cfg->checkpoint_dir[0] && check_writable("--checkpoint-dir", cfg->checkpoint_dir, 1, err) != 0) return -1;
    return cfg->resume ? check_resume(job, err) : 0;
}

/* --- the database: job, ranks, plan ---------------------------------------------- */

/* The options that shape the run, as JSON (jobs.config_json; not, say,
 * --recv-timeout or the checkpoint flags). Caller frees. */
static char *config_json(const run_job *job) {
    const run_config *c = &job->cfg;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    cJSON_AddStringToObject(o, "schedule", run_schedule_text(c, schedule, sizeof schedule));
    if (c->has_schedule_costs) { /* what zb-v's order was built for (db/whatif.c reads it back) */
        char text[1024];
        snprintf(text, sizeof text, "f=%.17g,b=%.17g,w=%.17g,comm=%.17g", c->schedule_costs.f, c->schedule_costs.b,
                 c->schedule_costs.w, c->schedule_costs.comm);
        cJSON_AddStringToObject(o, "schedule_costs", text);
        if (c->schedule_costs_db[0]) {
            snprintf(text, sizeof text, "%s, %s", c->schedule_costs_db, job->costs_about);
            cJSON_AddStringToObject(o, "schedule_costs_from", text);
        }
    }
    cJSON_AddNumberToObject(o, "microbatches", c->microbatches);
    cJSON_AddNumberToObject(o, "virtual_stages", job->plan->virtual_stages);
    cJSON_AddNumberToObject(o, "stages", job->plan->stages);
    cJSON_AddNumberToObject(o, "steps", c->steps);
    cJSON_AddStringToObject(o, "model", job->model);
    cJSON_AddNumberToObject(o, "nproc_per_node", job->lo.nproc_per_node);
    /* more ranks than cores: op times include waiting for one (db/whatif.c) */
    cJSON_AddNumberToObject(o, "cpu_cores", pp_cpu_count());
    cJSON_AddNumberToObject(o, "nnodes", job->lo.nnodes);
    cJSON_AddNumberToObject(o, "max_restarts", job->lo.max_restarts);
    alive_identity(o); /* who to ask whether the job still runs; without /proc, nobody */
    if (job->program) {
        cJSON *argv = cJSON_AddArrayToObject(o, "program");
        for (int i = 0; argv && i < job->lo.prog_argc; i++)
            cJSON_AddItemToArray(argv, cJSON_CreateString(job->lo.prog_argv[i]));
    } else {
        char cuts[RUN_MAX_CUTS * 8]; /* which layers each stage holds (db/whatif.c reads it back) */
        sched_cuts_text(c->cuts, c->ncuts, cuts, sizeof cuts);
        cJSON_AddStringToObject(o, "pipeline_cuts", cuts);
        cJSON_AddStringToObject(o, "data", c->data[0] ? c->data : "(built-in corpus)");
        cJSON_AddNumberToObject(o, "seed", (double)c->seed);
        cJSON_AddNumberToObject(o, "lr", c->optim.lr);
        cJSON_AddNumberToObject(o, "weight_decay", c->optim.weight_decay);
        cJSON_AddStringToObject(o, "optimizer", run_optimizer_name(c->optim.kind));
        /* where boundary tensors live; the per-peer transport is each worker's first line */
        cJSON_AddStringToObject(o, "boundaries", run_config_device_boundaries(c) ? "device" : "host");
        cJSON_AddStringToObject(o, "transport", run_transport_name(c->transport));
        cJSON_AddStringToObject(o, "cupti", c->cupti > 0 ? "on" : "off");
        cJSON_AddStringToObject(o, "dtype", run_dtype_name(c->dtype));
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

static int write_job(run_job *job, pp_err *err) {
    const sched_plan *plan = job->plan;
    char *json = config_json(job);
    if (!json) return pp_fail(err, "out of memory");
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    db_job_info info = {
        .name = job->lo.run_id,
        .nnodes = job->lo.nnodes,
        .world_size = plan->ranks,
        .schedule = run_schedule_text(&job->cfg, schedule, sizeof schedule),
        .microbatches = plan->microbatches,
        .virtual_stages = plan->virtual_stages,
        .stages = plan->stages,
        .steps = job->cfg.steps,
        .model = job->model,
        .device = run_device_name(job->cfg.device),
        .config_json = json,
        .t0_ns = (int64_t)pp_now_ns(),
    };
    int created = db_create_job(job->db, &info, &job->job_id, err);
    free(json);
    if (created != 0) return -1;

    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    db_rank_info *ranks = calloc((size_t)plan->ranks, sizeof *ranks);
    char (*stages)[256] = calloc((size_t)plan->ranks, sizeof *stages);
    char (*hosts)[272] = calloc((size_t)plan->ranks, sizeof *hosts);
    char (*devices)[32] = calloc((size_t)plan->ranks, sizeof *devices);
    if (!ranks || !stages || !hosts || !devices) {
        free(ranks), free(stages), free(hosts), free(devices);
        return pp_fail(err, "out of memory");
    }
    for (int r = 0; r < plan->ranks; r++) {
        int node = r / job->lo.nproc_per_node;
        for (int s = 0, n = 0; s < plan->stages; s++)
            if (plan->stage_rank[s] == r && n < 240) n += snprintf(stages[r] + n, sizeof stages[r] - n, n ? ",%d" : "%d", s);
        if (node == job->lo.node_rank) snprintf(hosts[r], sizeof hosts[r], "%s", host);
        else snprintf(hosts[r], sizeof hosts[r], "node%d", node);
        /* the worker's choice (LOCAL_RANK mod count), assuming every node sees as many devices as this one */
        if (job->cuda_devices > 0)
            snprintf(devices[r], sizeof devices[r], "cuda:%d", (r % job->lo.nproc_per_node) % job->cuda_devices);
        else
            snprintf(devices[r], sizeof devices[r], "%s", run_device_name(job->cfg.device));
        ranks[r] = (db_rank_info){.rank = r, .node = node, .host = hosts[r], .device = devices[r], .stages = stages[r]};
    }
    int rc = db_insert_ranks(job->db, job->job_id, ranks, (size_t)plan->ranks, err);
    free(ranks), free(stages), free(hosts), free(devices);
    if (rc != 0) return -1;
    return run_plan_write(job->db, job->job_id, plan, &job->cfg, NULL, err);
}

/* --- launcher hooks --------------------------------------------------------------- */

static int remote_now(void *ctx, uint64_t *remote_ns, pp_err *err) {
    return store_time(ctx, remote_ns, err);
}

/* On the collector's thread, after each step it analyses while the job
 * runs: the plan re-simulated at the first step that has every stage's F,
 * B and W medians, so the dashboard's planned timeline is at measured
 * costs from then on (a timed model's plan has its costs from the start). */
static void refresh_plan(void *ctx, db *d, int step) {
    run_job *job = ctx;
    if (job->plan_refreshed) return;
    pp_err err;
    int rc = run_plan_resimulate(d, job->job_id, job->plan, &job->cfg, step, &err);
    if (rc < 0) fprintf(stderr, "pprun run: planned timeline not updated: %s\n", err.msg);
    job->plan_refreshed = rc != 0;
}

/* Master: the collector writes into the database and, with several nodes,
 * listens for the other nodes' forwarded batches. */
static int start_master_collector(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    collector_config cc = {
        .db = job->db, .job_id = job->job_id, .world_size = info->world_size, .steps = job->cfg.steps,
        .interval_ns = RUN_COLLECT_INTERVAL_NS, .token = info->rdzv_token,
        .step_analyzed = job->cfg.model.kind == MODEL_TIMED ? NULL : refresh_plan, .step_analyzed_ctx = job};
    /* Forwarding nodes connect to the master address: listen there only
     * (collector_start falls back to every interface when this machine
     * cannot bind that address, as the store does). */
    if (info->nnodes > 1) cc.listen_host = job->lo.master_addr;
    if (collector_start(&cc, &job->coll, err) != 0) return -1;
    /* From here until collector_stop only the collector thread writes. */
    char text[32];
    int n = snprintf(text, sizeof text, "%d", collector_listen_port(job->coll));
    if (store_set(store, "run/collector_port", text, (size_t)n, err) != 0) return -1;
    n = snprintf(text, sizeof text, "%lld", (long long)job->job_id);
    return store_set(store, "run/job_id", text, (size_t)n, err);
}

static int store_get_long(store_client *store, const char *key, long max, long *out, pp_err *err) {
    void *val = NULL;
    size_t len;
    if (store_get(store, key, &val, &len, err) != 0) return -1;
    int rc = pp_parse_long(val, 1, max, key, out, err);
    free(val);
    return rc;
}

/* Other nodes: measure this node's clock offset to the master through the
 * store, then forward every batch to the master's collector. */
static int start_forwarding_collector(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    const char *keys[] = {"run/collector_port", "run/job_id"};
    int rc = store_wait(store, keys, 2, 60000, err);
    if (rc == 1) return pp_fail(err, "the master launcher never published its trace collector's address");
    long port, job_id;
    if (rc != 0 || store_get_long(store, keys[0], 65535, &port, err) != 0 ||
        store_get_long(store, keys[1], 1L << 62, &job_id, err) != 0)
        return -1;
    collector_config cc = {
        .job_id = job_id, .world_size = info->world_size, .steps = job->cfg.steps, .interval_ns = RUN_COLLECT_INTERVAL_NS,
        .token = info->rdzv_token};
    uint64_t rtt;
    if (trace_clock_offset(remote_now, store, RUN_CLOCK_ROUNDS, &cc.clock_offset_ns, &rtt, err) != 0) return -1;
    cc.forward_host = job->lo.master_addr;
    cc.forward_port = (int)port;
    return collector_start(&cc, &job->coll, err);
}

/* Several nodes: every node must run the job node 0 runs. Node 0
 * publishes its options (run_config_node_text); each other node compares
 * its own with them and refuses to start on a difference, naming it, rather
 * than run ranks that disagree: a hang, or, worse, a job that succeeds with
 * another schedule on some ranks than the one the database records. */
static int agree_with_node0(const run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    char mine[8192];
    if (run_config_node_text(&job->cfg, info->nproc_per_node, mine, sizeof mine) != 0)
        return pp_fail(err, "the job's options do not fit in %zu bytes", sizeof mine);
    /* and the same program (a node without one would run pprun's worker) */
    size_t used = strlen(mine);
    if (job->program && snprintf(mine + used, sizeof mine - used, "-- %s\n", job->model + strlen("program:")) >=
                            (int)(sizeof mine - used))
        return pp_fail(err, "the job's options do not fit in %zu bytes", sizeof mine);
    if (info->node_rank == 0) return store_set(store, "run/options", mine, strlen(mine), err);
    const char *keys[] = {"run/options"};
    int rc = store_wait(store, keys, 1, 60000, err);
    if (rc == 1) return pp_fail(err, "node rank 0 never published its job options");
    void *node0;
    size_t len;
    if (rc != 0 || store_get(store, keys[0], &node0, &len, err) != 0) return -1;
    rc = run_config_node_diff(mine, node0, err);
    free(node0);
    if (rc != 0)
        return pp_wrap(err, "this node's job options differ from node rank 0's (start every node with the same "
                            "`pprun run` options; only --node-rank may differ)");
    return 0;
}

/* The collector and one trace ring per local rank (the collector owns the
 * rings; the workers inherit their fds). */
static int start_tracing(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    int rc = info->node_rank == 0 ? start_master_collector(job, info, store, err)
                                  : start_forwarding_collector(job, info, store, err);
    if (rc != 0) return -1;
    job->rings = calloc((size_t)info->nproc_per_node, sizeof *job->rings);
    if (!job->rings) return pp_fail(err, "out of memory");
    for (int l = 0; l < info->nproc_per_node; l++) {
        int rank = info->node_rank * info->nproc_per_node + l;
        if (trace_ring_create(job->cfg.cupti > 0 ? RUN_RING_CAPACITY_CUPTI : RUN_RING_CAPACITY, &job->rings[l], err) != 0)
            return -1;
        if (collector_add_ring(job->coll, rank, job->rings[l], err) != 0) {
            trace_ring_close(job->rings[l]);
            job->rings[l] = NULL;
            return -1;
        }
    }
    return 0;
}

static int before_attempt(void *ctx, const launch_info *info, pp_err *err) {
    run_job *job = ctx;
    if (info->attempt > 0) {
        /* A restarted attempt runs again from its checkpoint, or from step
         * 0 without one: the display shows those steps again. */
        int latest;
        pp_err ignored;
        job->progress_next =
            checkpoint_dir_to_load(&job->cfg, info->run_id, &latest, &ignored) == 0 ? latest + 1 : 0;
    }
    /* The display lives for one attempt: it reads the store, which is up
     * only while launch_job runs. */
    if (info->node_rank == 0 &&
        run_progress_start(info->store_addr, info->rdzv_token, job->cfg.steps, job->progress_next, job->cfg.progress,
                           &job->progress, err) != 0)
        return -1;
    if (info->attempt > 0 || (info->nnodes == 1 && !job->cfg.trace)) return 0;
    store_client *store = NULL;
    char host[256];
    int port;
    if (store_parse_addr(info->store_addr, host, sizeof host, &port, err) != 0 ||
        store_connect_token(host, port, info->rdzv_token, 30ull * 1000000000ull, &store, err) != 0)
        return -1;
    int rc = 0;
    if (info->nnodes > 1) rc = agree_with_node0(job, info, store, err);
    if (rc == 0 && job->cfg.trace) rc = start_tracing(job, info, store, err);
    store_close(store);
    return rc;
}

/* What a user's program needs to run the job's schedule on its rank
 * (docs/trace-api.md): the job's shape, which rank holds each stage, and
 * this rank's actions in order ("0F0 0F1 0B0 0W0 ..."). */
static int program_env(const sched_plan *plan, const run_config *cfg, int rank, launch_env *env, pp_err *err) {
    char num[32];
    const struct {
        const char *name;
        int value;
    } nums[] = {{"PPRUN_MICROBATCHES", plan->microbatches}, {"PPRUN_VIRTUAL_STAGES", plan->virtual_stages},
                {"PPRUN_NUM_STAGES", plan->stages}, {"PPRUN_STEPS", cfg->steps}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        snprintf(num, sizeof num, "%d", nums[i].value);
        if (launch_env_set(env, nums[i].name, num, err) != 0) return -1;
    }
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    if (launch_env_set(env, "PPRUN_SCHEDULE", run_schedule_text(cfg, schedule, sizeof schedule), err) != 0) return -1;
    /* 24 bytes hold any "S," (at most 12) and any "{stage}{op}{mb} " (at most 16) */
    size_t size = (size_t)(plan->stages > plan->len[rank] ? plan->stages : plan->len[rank]) * 24 + 1;
    char *text = malloc(size);
    if (!text) return pp_fail(err, "out of memory");
    size_t n = 0;
    for (int s = 0; s < plan->stages; s++)
        n += (size_t)snprintf(text + n, size - n, s ? ",%d" : "%d", plan->stage_rank[s]);
    int rc = launch_env_set(env, "PPRUN_STAGE_RANKS", text, err);
    n = 0;
    text[0] = '\0';
    for (int i = 0; i < plan->len[rank]; i++) {
        char action[16];
        n += (size_t)snprintf(text + n, size - n, i ? " %s" : "%s", sched_action_str(&plan->actions[rank][i], action));
    }
    if (rc == 0) rc = launch_env_set(env, "PPRUN_ACTIONS", text, err);
    free(text);
    return rc;
}

static int rank_env(void *ctx, const launch_info *info, int local_rank, int global_rank, launch_env *env, pp_err *err) {
    run_job *job = ctx;
    (void)info;
    if (launch_env_set(env, "PPRUN_NODE_ADDR", job->node_addr, err) != 0) return -1;
    if (job->program && program_env(job->plan, &job->cfg, global_rank, env, err) != 0) return -1;
    if (job->rings && job->rings[local_rank]) {
        int fd = trace_ring_fd(job->rings[local_rank]);
        char text[16];
        snprintf(text, sizeof text, "%d", fd);
        if (launch_env_pass_fd(env, fd, err) != 0) return -1;
        return launch_env_set(env, "PPRUN_TRACE_FD", text, err);
    }
    return 0;
}

/* db's messages start with the file's name; the lines that print them
 * name it already, after --db. */
static const char *without_path(const char *msg, const char *path) {
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

/* Each rank's pid, for ranks.pid (the latest attempt's). */
static void started(void *ctx, const launch_info *info, const pid_t *pids) {
    run_job *job = ctx;
    if (!job->coll) return;
    for (int l = 0; l < info->nproc_per_node; l++)
        collector_set_pid(job->coll, info->node_rank * info->nproc_per_node + l, (int)pids[l]);
}

/* Shared-memory rings a rank created before a peer attached (the peer died
 * first) are removed once the attempt's workers are gone. */
static void after_attempt(void *ctx, const launch_info *info, const launch_result *res) {
    run_job *job = ctx;
    (void)res;
    job->progress_next = run_progress_stop(job->progress);
    job->progress = NULL;
    char job_key[192];
    snprintf(job_key, sizeof job_key, "%s-a%d", info->run_id, info->attempt);
    comm_cleanup(job_key, info->world_size);
}

/* A job too short for the live refresh (its steps reached the database
 * after the progress display saw them) still gets its planned timeline at
 * its measured costs, from the latest step with statistics. */
static void plan_at_the_end(run_job *job) {
    if (job->cfg.model.kind == MODEL_TIMED) return; /* planned at the model's own costs from the start */
    sqlite3 *sql = db_sqlite(job->db);
    sqlite3_stmt *st;
    int simulated = 1, step = -1;
    if (sqlite3_prepare_v2(sql, "SELECT (SELECT count(sim_start_ns) FROM plan WHERE job_id=?1),"
                                " (SELECT max(step) FROM step_stats WHERE job_id=?1)", -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, job->job_id);
    if (sqlite3_step(st) == SQLITE_ROW) {
        simulated = sqlite3_column_int(st, 0) > 0;
        if (sqlite3_column_type(st, 1) != SQLITE_NULL) step = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);
    pp_err err;
    if (!simulated && step >= 0 && run_plan_resimulate(job->db, job->job_id, job->plan, &job->cfg, step, &err) < 0)
        fprintf(stderr, "pprun run: planned timeline not written: %s\n", err.msg);
}

/* --- main ------------------------------------------------------------------------- */

static int build_worker_argv(run_job *job, pp_err *err) {
    if (job->program) return 0; /* the user's, as parsed */
    ssize_t n = readlink("/proc/self/exe", job->self_exe, sizeof job->self_exe - 1);
    if (n <= 0) return pp_fail(err, "cannot find the pprun executable (/proc/self/exe): %s", strerror(errno));
    job->self_exe[n] = '\0';
    job->worker_argv[0] = job->self_exe;
    job->worker_argv[1] = "worker";
    int argc = run_config_to_args(&job->cfg, job->worker_argv, 2, job->worker_args);
    if (argc < 0) return pp_fail(err, "out of memory");
    job->lo.prog_argv = job->worker_argv;
    job->lo.prog_argc = argc;
    return 0;
}

/* The database file and SQLite's WAL and shared-memory files beside it. */
static void remove_db_files(const char *path) {
    char side[sizeof ((run_config *)0)->db + 8];
    remove(path);
    snprintf(side, sizeof side, "%s-wal", path);
    remove(side);
    snprintf(side, sizeof side, "%s-shm", path);
    remove(side);
}

static void wait_for_interrupt(const char *url) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    fprintf(stderr, "pprun run: the job is over; the dashboard stays at %s until Ctrl-C\n", url);
    int sig;
    sigwait(&set, &sig);
}

static const char *job_status(const launch_result *res) {
    return res->status == LAUNCH_OK ? "succeeded" : res->status == LAUNCH_SIGNALED ? "stopped" : "failed";
}

/* The last non-empty line of a rank's stderr tail: the error it died
 * with, as a rule (a worker's message, a Python exception). */
static int last_line(const char *tail, const char **line) {
    int end = (int)strlen(tail);
    while (end > 0 && (tail[end - 1] == '\n' || tail[end - 1] == ' ')) end--;
    int start = end;
    while (start > 0 && tail[start - 1] != '\n') start--;
    *line = tail + start;
    return end - start;
}

static void failure_text(const launch_result *res, char *buf, size_t n) {
    char sigbuf[16];
    const launch_failure *f = &res->failure;
    const char *line;
    int len = last_line(f->stderr_tail, &line);
    if (res->status == LAUNCH_FAILED && f->global_rank < 0 && f->signal)
        snprintf(buf, n, "the launcher of node rank %d (on %s) got %s", f->node_rank, f->host,
                 launch_signal_name(f->signal, sigbuf));
    else if (res->status == LAUNCH_FAILED && f->global_rank < 0) /* its message is its stderr's first line */
        snprintf(buf, n, "the launcher of node rank %d (on %s) failed: %.*s", f->node_rank, f->host,
                 (int)strcspn(f->stderr_tail, "\n"), f->stderr_tail);
    else if (res->status == LAUNCH_FAILED && f->signal)
        snprintf(buf, n, "rank %d (local rank %d on %s) was killed by %s", f->global_rank, f->local_rank, f->host,
                 launch_signal_name(f->signal, sigbuf));
    else if (res->status == LAUNCH_FAILED)
        snprintf(buf, n, "rank %d (local rank %d on %s) exited with code %d%s%.*s", f->global_rank, f->local_rank,
                 f->host, f->exit_code, len ? ": " : "", len, line);
    else if (res->status == LAUNCH_SIGNALED)
        snprintf(buf, n, "pprun was stopped by %s", launch_signal_name(res->signal, sigbuf));
    else
        snprintf(buf, n, "the launcher failed");
}

int cmd_run(int argc, char **argv) {
    static run_job job; /* large: keep it off the stack */
    pp_err err;
    run_config_default(&job.cfg);

    /* The launcher's parser wants "-- PROGRAM": the user's program when they
     * wrote one, else this binary's worker. */
    for (int i = 1; i < argc && !job.program; i++) job.program = strcmp(argv[i], "--") == 0;
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return 1;
    memcpy(args, argv, (size_t)argc * sizeof *args);
    args[argc] = "--";
    args[argc + 1] = "worker";
    /* the program's argv stays in main's argv (launch_parse points into it) */
    int prc = job.program ? launch_parse(argc, argv, &job.lo, job_option, &job, &err)
                          : launch_parse(argc + 2, args, &job.lo, job_option, &job, &err);
    free(args);
    if (prc == 1) return 0;
    if (prc != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        return 2;
    }
    if (launch_check_token(&job.lo, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        return 2;
    }
    if (!job.program && job.lo.prog_argc != 1) {
        fprintf(stderr, "pprun run: unexpected argument '%s' (pprun run takes options only)\n", job.lo.prog_argv[0]);
        return 2;
    }
    if (!(job.lo.given & LAUNCH_GIVEN_NPROC)) job.lo.nproc_per_node = 4;
    if (check_job(&job, &err) != 0 || build_worker_argv(&job, &err) != 0 ||
        (job.program && launch_check_program(&job.lo, &err) != 0)) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        sched_free(job.plan);
        return 2;
    }
    if (job.costs_about[0]) {
        const sched_costs *c = &job.cfg.schedule_costs;
        fprintf(stderr, "pprun run: zb-v ordered for F %.3f ms, B %.3f ms, W %.3f ms, send %.3f ms per op (%s, %s)\n",
                c->f / 1e6, c->b / 1e6, c->w / 1e6, c->comm / 1e6, job.cfg.schedule_costs_db, job.costs_about);
    }
    if (job.lo.node_rank == 0 && job.lo.run_id[0] == '\0')
        snprintf(job.lo.run_id, sizeof job.lo.run_id, "run-%llx-%d", (unsigned long long)(pp_wall_ns() / 1000000),
                 (int)getpid());
    /* One node: the ranks' TCP ports (--transport tcp) stay on loopback. */
    node_address(job.lo.nnodes > 1 ? job.lo.master_addr : "127.0.0.1", job.node_addr, sizeof job.node_addr);

    int exit_code = 2;
    /* The server starts before the job is written: a refused --serve (a
     * taken port, no token for a public address) leaves no job behind, and
     * no database either when this run created it (the server reads it, so
     * it must exist first). */
    int db_existed = access(job.cfg.db, F_OK) == 0;
    if (job.cfg.trace && job.lo.node_rank == 0 && db_open(job.cfg.db, &job.db, &err) != 0) {
        fprintf(stderr, "pprun run: --db %s: %s\n", job.cfg.db, without_path(err.msg, job.cfg.db));
        goto out;
    }
    if (job.cfg.serve && job.lo.node_rank == 0) {
        http_options ho = {
            .listen = job.cfg.serve_addr, .listen_flag = "--serve", .token = job.cfg.token, .db_path = job.cfg.db};
        if (http_start(&ho, &job.web, &err) != 0) {
            fprintf(stderr, "pprun run: %s\n", err.msg); /* it names --serve */
            if (job.db && !db_existed) {
                db_close(job.db);
                job.db = NULL;
                remove_db_files(job.cfg.db);
            }
            goto out;
        }
        fprintf(stderr, "pprun run: dashboard at %s\n", http_url(job.web));
    }
    int nlost = 0;
    if (job.db && (db_mark_lost(job.db, &nlost, &err) != 0 || write_job(&job, &err) != 0)) {
        fprintf(stderr, "pprun run: --db %s: %s\n", job.cfg.db, without_path(err.msg, job.cfg.db));
        goto out;
    }
    if (nlost)
        fprintf(stderr, "pprun run: --db %s: %d earlier job%s still said running, but %s launcher is gone: marked lost\n",
                job.cfg.db, nlost, nlost > 1 ? "s" : "", nlost > 1 ? "their" : "its");

    launch_hooks hooks = {
        .ctx = &job, .before_attempt = before_attempt, .rank_env = rank_env, .started = started,
        .after_attempt = after_attempt};
    launch_result res;
    int lrc = launch_job(&job.lo, &hooks, &res, &err);
    exit_code = res.exit_code;
    if (lrc != 0)
        fprintf(stderr, "pprun run: %s\n", err.msg);
    else if (res.status == LAUNCH_FAILED)
        launch_print_summary(stderr, &job.lo, &res);
    else if (res.status == LAUNCH_SIGNALED) {
        char sigbuf[16];
        fprintf(stderr, "pprun run: stopped by %s", launch_signal_name(res.signal, sigbuf));
        if (job.db) fprintf(stderr, "; what ran is in %s (job %lld)", job.cfg.db, (long long)job.job_id);
        fputc('\n', stderr);
    }

    /* Everything the ranks recorded reaches the database, dead ranks too. */
    pp_err trace_err = {""};
    if (job.coll) {
        if (lrc != 0 || res.status != LAUNCH_OK) collector_last_step_cut(job.coll);
        if (collector_stop(job.coll, &trace_err) != 0) {
            fprintf(stderr, "pprun run: trace collector: %s\n", trace_err.msg);
            if (exit_code == 0) exit_code = 1;
        }
        job.coll = NULL;
    }
    if (job.db) {
        /* After a failed write (a full disk) what room is left goes to the
         * job's end, not to the plan. */
        if (!trace_err.msg[0]) plan_at_the_end(&job);
        char failure[sizeof err.msg + 64] = "";
        if (lrc != 0)
            snprintf(failure, sizeof failure, "%s", err.msg);
        else if (res.status != LAUNCH_OK)
            failure_text(&res, failure, sizeof failure);
        else if (trace_err.msg[0]) /* the training succeeded, its trace did not: why pprun exits 1 */
            snprintf(failure, sizeof failure, "the trace stopped early: %s", trace_err.msg);
        pp_err ferr;
        int failed_rank = lrc == 0 && res.status == LAUNCH_FAILED ? res.failure.global_rank : -1;
        const char *status = lrc != 0 ? "failed" : job_status(&res);
        if (db_finish_job(job.db, job.job_id, status, exit_code, failed_rank, failure[0] ? failure : NULL, &ferr) !=
            0) {
            fprintf(stderr,
                    "pprun run: --db %s: the job's end (%s) could not be recorded: %s; readers on this machine "
                    "will show job %lld as lost\n",
                    job.cfg.db, status, without_path(ferr.msg, job.cfg.db), (long long)job.job_id);
            if (exit_code == 0) exit_code = 1;
        }
        if (exit_code == 0) { /* where the time went, in two lines */
            job_summary s;
            whatif_report w;
            if (summary_read(db_sqlite(job.db), job.job_id, 0, &s, &ferr) == 0)
                report_brief(stderr, "pprun run", &s, whatif_read(db_sqlite(job.db), &s, &w, &ferr) == 0 ? &w : NULL,
                             job.cfg.db);
            summary_free(&s);
        }
        db_close(job.db);
        job.db = NULL;
    }
    if (job.web) {
        if (res.status != LAUNCH_SIGNALED) wait_for_interrupt(http_url(job.web));
        http_stop(job.web);
        job.web = NULL;
    }
out:
    if (job.web) http_stop(job.web);
    run_progress_stop(job.progress);
    if (job.coll) collector_stop(job.coll, &err);
    free(job.rings); /* the rings themselves belonged to the collector */
    if (job.db) db_close(job.db);
    run_config_free_args(job.worker_args);
    sched_free(job.plan);
    return exit_code;
}
