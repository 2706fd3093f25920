/* job_options.c: `pprun run`'s command line (job_options.h). */
#include "runner/job/job_options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: pprun run [job options] [launcher options] [-- PROGRAM [ARGS...] | -m MODULE [ARGS...]]\n\n"
            "Runs a pipeline-parallel training job: one worker per rank, traced into --db.\n"
            "With -- PROGRAM (or -m MODULE: python3 -m MODULE), your own program runs on every\n"
            "rank instead of pprun's worker (as many steps as it likes: --steps is what it is asked),\n"
            "gets the schedule in its environment and records its ops with libpprun_trace\n"
            "(docs/trace-api.md); the job options marked * configure pprun's worker only.\n\n"
            "job options:\n"
            "  --schedule S          gpipe|1f1b|interleaved-1f1b|zb-h1|zb-v|dualpipev|csv:FILE\n"
            "                        (default 1f1b)\n"
            "  --microbatches M      microbatches per step (default 8)\n"
            "  --virtual-stages V    model chunks per rank (interleaved-1f1b, zb-v, dualpipev: 2)\n"
            "* --pipeline-cuts L,..  first layer of stages 1..S-1, or even (the default)\n"
            "  --schedule-costs C    order zb-v for these op costs: f=3.8ms,b=3.5ms,w=1.6ms,comm=66us,\n"
            "                        or DB[:JOB] for a job's measured ones (default: the model's)\n"
            "  --max-mem N           zb-h1, zb-v: built so that no rank holds more than N microbatch-stages,\n"
            "                        or bytes (64MiB) as the model's shapes (or DB:JOB's measured bytes)\n"
            "                        say; any other schedule: checked against it\n"
            "  --act-bytes F[:B],..  bytes one microbatch holds per stage after F and B, for --max-mem\n"
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
            "* --mps auto|on|off     NVIDIA's MPS daemon for ranks that share a GPU, started and stopped\n"
            "                        with the job (default auto: when they share one and\n"
            "                        nvidia-cuda-mps-control is on PATH; on: always, or exit 2)\n"
            "  --serve [HOST:PORT]   live dashboard (default 127.0.0.1:8080); stays up after\n"
            "                        the job until Ctrl-C\n"
            "  --token T             required for a non-loopback --serve, 16 bytes at least (or PPRUN_TOKEN)\n"
            "  --allow-host NAME     a Host name --serve answers besides localhost, 127.0.0.1\n"
            "                        and [::1]; repeatable\n"
            "* --checkpoint-dir D  --checkpoint-every K  --resume\n"
            "* --init-from FILE      start from a checkpoint file (pprun checkpoint merge) on any layout\n"
            "* --recompute none|full|selective   drop activations after F, recompute them before B\n"
            "* --recompute-stages S,S-S          the stages --recompute applies to (default every one)\n"
            "* --metrics FILE        JSON lines, one per step\n"
            "* --save-weights DIR    every stage's final weights (raw float32)\n"
            "* --fail-at step=S,rank=R[,phase=F|B|W,mb=M]   fault injection (first attempt)\n"
            "  --recv-timeout T      how long a receive waits for its peer (default 120s); with\n"
            "                        -- PROGRAM, a PyTorch rank waiting longer says for what\n"
            "* --transport T         auto|shm|tcp|cuda-ipc|nccl (default auto: with --device cuda,\n"
            "                        boundary tensors stay in GPU memory, cuda-ipc between ranks\n"
            "                        on one GPU, nccl otherwise; shm|tcp stage them through the host)\n"
            "* --progress auto|on|off  the progress line (its numbers come from pprun's worker;\n"
            "                        with -- PROGRAM there is none, and off is accepted)\n"
            "  --pp P  --dp D        P ranks per pipeline, D pipelines side by side (data parallel):\n"
            "                        P x D ranks; either one follows from the other and the world\n"
            "                        (default: one pipeline of --nproc-per-node x --nnodes ranks)\n"
            "* --zero1               shard the optimizer state over each data-parallel group\n"
            "* --dp-overlap on|off   all-reduce a stage's gradient at its last W (default on) or after\n"
            "                        the rank's last action\n"
            "* --dp-bucket SIZE      gradient bytes per all-reduce bucket (default 1MiB)\n"
            "* --eval-every K  --eval-microbatches N  --eval-data FILE\n"
            "                        a forward-only evaluation step after every K-th step, N microbatches\n"
            "                        per pipeline (default --microbatches) of FILE (default: the\n"
            "                        training data's last tenth, held out)\n\n"
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
    /* --progress off asks for what a program's job has anyway (pprun prints
     * no progress for it: the numbers come from pprun's worker), and
     * scripts pass it to every job: a no-op, not a worker option. */
    int progress_off = strcmp(opt, "--progress") == 0 && val && strcmp(val, "off") == 0;
    if (run_config_worker_only(opt) && !job->worker_flag[0] && !progress_off)
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
    if (run_config_is_flag(opt)) return run_config_option(&job->cfg, opt, NULL, err) < 0 ? -1 : 1;
    if (!run_config_takes_value(opt)) return 0;
    if (!val) return pp_fail(err, "%s needs a value", opt);
    int rc = run_config_option(&job->cfg, opt, val, err);
    if (rc >= 0 && strcmp(opt, "--microbatches") == 0) job->microbatches_given = 1;
    if (rc >= 0 && strcmp(opt, "--db") == 0) job->db_given = 1;
    return rc < 0 ? -1 : rc == 1 ? 2 : 0;
}

int job_options_parse(run_job *job, int argc, char **argv, pp_err *err) {
    run_config_default(&job->cfg);
    /* The launcher's parser wants "-- PROGRAM": the user's program when they
     * wrote one (or torchrun's -m MODULE), else this binary's worker. */
    for (int i = 1; i < argc && !job->program; i++)
        job->program = !strcmp(argv[i], "--") || !strcmp(argv[i], "-m") || !strcmp(argv[i], "--module");
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return pp_fail(err, "out of memory");
    memcpy(args, argv, (size_t)argc * sizeof *args);
    args[argc] = "--";
    args[argc + 1] = "worker";
    /* the program's argv stays in main's argv (launch_parse points into it) */
    int rc = job->program ? launch_parse(argc, argv, &job->lo, job_option, job, err)
                          : launch_parse(argc + 2, args, &job->lo, job_option, job, err);
    if (rc == 0 && !job->program && job->lo.prog_argc != 1) {
        /* the command as it should have been: a script after python3, a program as it is */
        const char *a = job->lo.prog_argv[0];
        size_t n = strlen(a);
        int script = n > 3 && strcmp(a + n - 3, ".py") == 0;
        rc = pp_fail(err, "unexpected argument '%s': pprun run takes options only, for its own job; your program "
                          "runs on every rank after `--` (`-- %s%s%s`), or as a module with `-m MODULE`",
                     a, script ? "python3 " : "", a, job->lo.prog_argc > 3 ? " ..." : ""); /* past the "-- worker" added */
    }
    if (!job->program) /* it pointed into args: the worker's argv comes later (job_options_worker_argv) */
        job->lo.prog_argv = NULL, job->lo.prog_argc = 0;
    free(args);
    if (rc != 0) return rc;
    if (launch_check_token(&job->lo, err) != 0) return -1;
    if (!(job->lo.given & LAUNCH_GIVEN_NPROC)) {
        /* --pp P --dp D without --nproc-per-node: P x D ranks over the nodes */
        long mesh = (long)job->cfg.pp * job->cfg.dp, nodes = job->lo.nnodes > 0 ? job->lo.nnodes : 1;
        job->lo.nproc_per_node = mesh > 0 && mesh % nodes == 0 && mesh / nodes <= LAUNCH_MAX_NPROC ? (int)(mesh / nodes) : 4;
    }
    if (job->lo.node_rank == 0 && job->lo.run_id[0] == '\0')
        snprintf(job->lo.run_id, sizeof job->lo.run_id, "run-%llx-%d", (unsigned long long)(pp_wall_ns() / 1000000),
                 (int)getpid());
    return 0;
}

int job_options_worker_argv(run_job *job, pp_err *err) {
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
