/* run_config.h: the options of a pipeline training job (`pprun run`).
 *
 * The launcher parses them (through the launcher's own option parser, which
 * hands it every flag it does not know), validates them once, and passes them
 * to every worker as the same flags (`pprun worker FLAGS`), so launcher and
 * workers always agree on the job. */
#ifndef PP_RUN_CONFIG_H
#define PP_RUN_CONFIG_H
#include <stdint.h>

#include "base/pp.h"
#include "config/model_spec.h"
#include "sched/sched.h"

#define RUN_MAX_CUTS 256
#define RUN_MAX_ACT 2048 /* --act-bytes: zb-v's stages on 1024 ranks */
#define RUN_DEFAULT_MICROBATCHES 8 /* --microbatches, pprun run's and pprun schedule's */

/* The options that take one of a few names are enums, parsed once here;
 * run_config.c maps each enum's names and values in one table, which parses
 * the option, lists the accepted names in its error and writes the value
 * back (the workers' flags, the database, PPRUN_* for a user's program). */
typedef enum run_schedule_kind {
    RUN_SCHEDULE_GPIPE,
    RUN_SCHEDULE_1F1B,
    RUN_SCHEDULE_INTERLEAVED_1F1B,
    RUN_SCHEDULE_ZB_H1,
    RUN_SCHEDULE_ZB_V,
    RUN_SCHEDULE_DUALPIPEV, /* its F+BW pairs run side by side (sched_plan.overlap) */
    RUN_SCHEDULE_CSV, /* csv:FILE, FILE in run_config.schedule_csv */
} run_schedule_kind;
typedef enum run_device { RUN_DEVICE_CPU, RUN_DEVICE_CUDA } run_device;
/* cuda-ipc and nccl: --device cuda only */
typedef enum run_transport {
    RUN_TRANSPORT_AUTO,
    RUN_TRANSPORT_SHM,
    RUN_TRANSPORT_TCP,
    RUN_TRANSPORT_CUDA_IPC,
    RUN_TRANSPORT_NCCL,
} run_transport;
typedef enum run_dtype { RUN_DTYPE_FP32, RUN_DTYPE_BF16 } run_dtype;
/* --mps: NVIDIA's MPS daemon for ranks that share a GPU (docs/gpu.md) */
typedef enum run_mps { RUN_MPS_AUTO, RUN_MPS_ON, RUN_MPS_OFF } run_mps;
typedef enum run_progress_mode { RUN_PROGRESS_AUTO, RUN_PROGRESS_ON, RUN_PROGRESS_OFF } run_progress_mode;
/* --recompute: what F drops and recomputes before B (model_recompute's
 * values, in its order; gpt only) */
typedef enum run_recompute { RUN_RECOMPUTE_NONE, RUN_RECOMPUTE_FULL, RUN_RECOMPUTE_SELECTIVE } run_recompute;

/* Bytes that hold any --schedule text (run_schedule_text) with its NUL:
 * csv:FILE may be 511 characters long. */
#define RUN_SCHEDULE_TEXT_MAX 512

/* --fail-at phase=allreduce: inside the step's gradient all-reduce (the
 * data-parallel collective, runner/worker/engine_dp.c), after this rank sent
 * its part of the first bucket and before it received anything. Not a
 * sched_op's value (it was SCHED_BW's, and a rank with a fused backward
 * died at its first BW instead). */
#define RUN_FAIL_AT_ALLREDUCE 4

typedef struct run_fail_at {
    int enabled;
    int step, rank;
    int phase; /* -1 = at the start of the step, else sched_op or RUN_FAIL_AT_ALLREDUCE */
    int mb;    /* -1 = any microbatch (of the rank's replica: 0 .. --microbatches - 1) */
    char text[256]; /* the spec as given ("step=1,rank=2,phase=allreduce"): what messages name */
} run_fail_at;

/* 1 when --fail-at's phase and mb name an op `op` of the rank's microbatch
 * `mb` (op: a sched_op; -1 with mb -1 for the start of a step;
 * RUN_FAIL_AT_ALLREDUCE with mb -1 for the all-reduce): phase F, B or W
 * names that op, and a fused BW is both a B and a W; no phase, any op; no
 * mb, any microbatch. Its step and rank are the caller's to compare. The
 * worker (engine_maybe_fail) and the launcher's check that the point
 * exists in the plan ask the same question. */
int run_fail_at_names(const run_fail_at *f, int op, int mb);

typedef struct run_config {
    run_schedule_kind schedule;                   /* --schedule */
    char schedule_csv[RUN_SCHEDULE_TEXT_MAX - 4]; /* its FILE with csv:FILE, else "" */
    /* --schedule-costs: the op costs zb-v's order is built for (default: the
     * timed model's, else f=b=w=1). Given as numbers, or as DB[:JOB], a
     * database whose job's measured costs the launcher reads into
     * schedule_costs (runner/job/job_checks.c) before any worker starts. */
    int has_schedule_costs;
    sched_costs schedule_costs;
    char schedule_costs_db[512]; /* "" = none, or not yet read */
    long schedule_costs_job;     /* 0 = the newest job there */
    int microbatches;   /* m */
    int virtual_stages; /* v (0 = the schedule's default) */
    int steps;
    char model_text[256];
    model_spec model;
    char data[512];  /* "" = the embedded default corpus */
    run_device device;
    uint64_t seed;
    model_optim optim;
    char db[512];
    int trace;            /* 1 = on */
    int serve;            /* 1 = --serve given */
    char serve_addr[128]; /* HOST:PORT */
    char token[256];
    char allow_hosts[1024]; /* --allow-host, gathered: NAME,NAME,... ("" = none; web/guard.h) */
    char checkpoint_dir[512];
    int checkpoint_every; /* steps; 0 = only at the end when a dir is given */
    int resume;
    char init_from[512]; /* --init-from FILE: a checkpoint file to start from (docs/checkpoint.md); "" = none */
    run_fail_at fail_at;
    char metrics[512];      /* JSON lines per step, "" = none */
    char save_weights[512]; /* directory for each stage's final weights, "" = none */
    int ncuts;
    int cuts[RUN_MAX_CUTS];
    int recv_timeout_ms;
    run_transport transport;
    run_progress_mode progress;
    run_dtype dtype;       /* GEMM operands; bf16 only with --device cuda */
    int cupti;             /* --cupti: 1 on, 0 off; -1 (not given) becomes on with --device cuda and --trace on */
    run_mps mps;           /* --mps: the launcher starts MPS or not (docs/gpu.md); never passed to the workers */
    run_recompute recompute;                /* --recompute */
    int nrecompute_stages;                  /* --recompute-stages; 0: every stage */
    int recompute_stages[RUN_MAX_CUTS + 1]; /* the stages --recompute applies to, increasing */

    /* The mesh (docs/cli.md, "Data parallel"): --pp P ranks per pipeline,
     * --dp D pipelines side by side, P·D ranks in all. 0 = not given:
     * run_config_mesh fills both from the world size (one pipeline when
     * neither is given). Global rank r is replica r / P, pipeline rank r % P. */
    int pp, dp;
    int zero1;            /* --zero1: optimizer state sharded over each data-parallel group */
    int dp_overlap;       /* --dp-overlap on|off: a stage's all-reduce starts at its last W (on) or after the rank's last action (off) */
    uint64_t dp_bucket;   /* --dp-bucket SIZE: bytes of gradient per all-reduce bucket */
    const char *dp_tuned; /* the first of --dp-overlap, --dp-bucket given (NULL: none): they need dp > 1 */
    int eval_every;       /* --eval-every K: an evaluation step after every K-th training step; 0 = never */
    int eval_microbatches; /* --eval-microbatches N: per replica and evaluation step (0 = --microbatches) */
    char eval_data[512];  /* --eval-data FILE; "" = the last tenth of the training data, held out */
    /* --max-mem (docs/schedules.md, "Memory-bounded zero bubble"): zb-h1
     * and zb-v built so that no rank holds more, any other schedule
     * checked against it; 0: none. Microbatch-stages, or bytes
     * (max_mem_bytes) of each stage as the model's shapes say
     * (config/model_act.h), or as --act-bytes gives them: what the launcher
     * reads from --schedule-costs DB[:JOB] (a job's measured bytes) and
     * hands the workers. */
    double max_mem;
    int max_mem_bytes;
    int nact;                      /* --act-bytes entries; 0: the model's */
    sched_act act[RUN_MAX_ACT];
} run_config;

void run_config_default(run_config *cfg);

/* Each value's name, as the options spell it ("cuda", "cuda-ipc", "bf16",
 * "sgd"). */
const char *run_device_name(run_device device);
const char *run_transport_name(run_transport transport);
const char *run_dtype_name(run_dtype dtype);
const char *run_optimizer_name(model_optim_kind kind);
const char *run_recompute_name(run_recompute mode);
const char *run_mps_name(run_mps mode);
/* --recompute for stage s: the mode where --recompute-stages names s (or
 * names no stage), else none. */
run_recompute run_config_recompute_of(const run_config *cfg, int stage);
/* --schedule as given: the generator's name ("zb-v") or "csv:FILE"; into
 * buf (RUN_SCHEDULE_TEXT_MAX bytes hold any), which it returns. */
const char *run_schedule_text(const run_config *cfg, char *buf, size_t n);

/* Offers one option to the job's parser. `value` is the option's argument
 * (NULL for flags that take none). Returns 1 if consumed, 0 if not a job
 * option, -1 on a bad value (err names the option and what it accepts). */
int run_config_option(run_config *cfg, const char *opt, const char *value, pp_err *err);
/* Whether `opt` is a job option that takes a value (for the parser). */
int run_config_takes_value(const char *opt);
/* Whether `opt` is a job option that takes no value (--resume, --zero1). */
int run_config_is_flag(const char *opt);
/* Whether `opt` configures pprun's own worker only (marked * in pprun run's
 * usage): meaningless to a user's program (`-- PROGRAM`). */
int run_config_worker_only(const char *opt);

/* Cross-option checks, and the derived fields (model spec). */
int run_config_finish(run_config *cfg, pp_err *err);

/* The mesh of a job of `world` ranks: fills cfg->pp and cfg->dp (either or
 * both may be given; pp·dp must be world) and checks what depends on them
 * (--zero1 needs dp > 1). -1 with err naming the option: "--pp 2 --dp 3
 * make 6 ranks, but --nproc-per-node 4 x --nnodes 1 start 4";
 * `world_from` says where the world size comes from ("--nproc-per-node 4
 * x --nnodes 1", "WORLD_SIZE"). The launcher calls it before anything
 * starts, every worker again with its WORLD_SIZE. */
int run_config_mesh(run_config *cfg, int world, const char *world_from, pp_err *err);

/* Appends the job's options to argv (for `pprun worker`); returns the new
 * argc, or -1 when out of memory. argv must have room for RUN_CONFIG_MAX_ARGS
 * more entries and storage for RUN_CONFIG_MAX_ARGS + 1; the strings are owned
 * by `storage` (freed with run_config_free_args). */
#define RUN_CONFIG_MAX_ARGS 80
int run_config_to_args(const run_config *cfg, char **argv, int argc, char **storage);
void run_config_free_args(char **storage);

/* What every node of a job started on several nodes must agree on: the
 * workers' options (run_config_to_args) but those naming a file or folder
 * each node may keep elsewhere (--data, --checkpoint-dir, --init-from,
 * --metrics, --save-weights), and the ranks per node. One "FLAG VALUE" line each, into
 * buf; -1 when out of memory or buf is too small. Node 0 publishes its
 * text through the store, the others compare theirs with it. */
int run_config_node_text(const run_config *cfg, int nproc_per_node, char *buf, size_t n);
/* 0 when mine and node0's texts agree; else -1 with err naming the first
 * option that differs, e.g. "this node has --microbatches 8, node rank 0 has
 * --microbatches 4". */
int run_config_node_diff(const char *mine, const char *node0, pp_err *err);

/* The schedule's op costs over `stages` stages: the timed model's (ns; a
 * mean stage's with per=layer; returns 1), else unit costs (returns 0: the
 * real costs are known only once a step ran). */
int run_config_costs(const run_config *cfg, int stages, sched_costs *costs);
/* Each stage's own costs, each[stages], for the timed model (returns 1;
 * with per=layer they follow the partition, --pipeline-cuts or the even
 * split); 0 for gpt, whose costs are known once a step ran; -1 with err
 * when the cuts do not fit. */
int run_config_stage_costs(const run_config *cfg, int stages, sched_costs *each, pp_err *err);

/* 1 when boundary tensors stay in GPU memory and travel over devcomm:
 * --device cuda with --transport auto, cuda-ipc or nccl. --device cuda with
 * shm or tcp stages them through host memory; --device cpu never uses it. */
int run_config_device_boundaries(const run_config *cfg);

/* --transport cuda-ipc or nccl forced with --device cuda, checked before
 * anything starts, as devcomm_open would find it (rank r on node
 * r / nproc_per_node and device (r mod nproc_per_node) mod devices):
 * cuda-ipc needs every rank on one node, nccl every rank of a node on its own
 * GPU. 0 for any other transport; -1 naming the first pair that cannot. */
int run_config_check_gpu_transport(const run_config *cfg, const sched_plan *plan, int nproc_per_node, int devices,
                                   pp_err *err);

/* Builds the job's schedule for `ranks` ranks, validated; zb-v's order for
 * --schedule-costs when given, else for run_config_costs; within --max-mem
 * (zb-h1's and zb-v's order built under it, any other checked). csv: for
 * --schedule csv:FILE, the file as the caller already read it
 * (sched_load_csv), taken over (it becomes *out, or is freed): the launcher
 * reads the file once for its shape and its plan, so a file changed
 * meanwhile cannot give it one version's shape and another's plan. NULL:
 * the file is read here (a worker; any other schedule). */
int run_config_plan(const run_config *cfg, int ranks, sched_plan *csv, sched_plan **out, pp_err *err);

/* What each of a plan's `stages` stages holds per microbatch under
 * --max-mem, into act[stages]: --act-bytes, or the model's bytes
 * (model_act_bytes over the partition and --recompute), or {1, 1}
 * (microbatch-stages); mem points at act. -1 when --act-bytes has another
 * number of stages. */
int run_config_mem(const run_config *cfg, int stages, sched_act *act, sched_mem *mem, pp_err *err);

#endif
