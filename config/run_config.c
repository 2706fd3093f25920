/* run_config.c: parsing, checking and forwarding the options of `pprun run`;
 * the names of its enums, each spelt once in its table. */
#include "config/run_config.h"

#include "config/model_act.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/shape.h"

void run_config_default(run_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->schedule = RUN_SCHEDULE_1F1B;
    cfg->microbatches = RUN_DEFAULT_MICROBATCHES;
    cfg->steps = 20;
    snprintf(cfg->model_text, sizeof cfg->model_text, "gpt");
    cfg->device = RUN_DEVICE_CPU;
    cfg->dtype = RUN_DTYPE_FP32;
    cfg->seed = 1234;
    model_optim_default(&cfg->optim);
    snprintf(cfg->db, sizeof cfg->db, "pprun.db");
    cfg->trace = 1;
    cfg->cupti = -1;
    snprintf(cfg->serve_addr, sizeof cfg->serve_addr, "127.0.0.1:8080");
    cfg->recv_timeout_ms = 120000;
    cfg->transport = RUN_TRANSPORT_AUTO;
    cfg->progress = RUN_PROGRESS_AUTO;
    cfg->fail_at.phase = -1;
    cfg->fail_at.mb = -1;
    cfg->dp_overlap = 1;
    cfg->dp_bucket = 1u << 20;
}

static int copy_text(char *dst, size_t cap, const char *opt, const char *value, pp_err *err) {
    if (!value || !*value) return pp_fail(err, "%s: expected a value", opt);
    if (strlen(value) >= cap) return pp_fail(err, "%s: value is too long (at most %zu characters)", opt, cap - 1);
    memcpy(dst, value, strlen(value) + 1);
    return 0;
}

static int in_list(const char *value, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (value && strcmp(value, list[i]) == 0) return 1;
    return 0;
}

/* ---- the enums' names --------------------------------------------------------
 *
 * One table per enum (run_config.h), in the order an error lists them. */
typedef struct enum_name {
    int value;
    const char *name;
} enum_name;

/* csv:FILE is the one kind without a name of its own (parse_schedule) */
static const enum_name schedule_names[] = {
    {RUN_SCHEDULE_GPIPE, "gpipe"}, {RUN_SCHEDULE_1F1B, "1f1b"}, {RUN_SCHEDULE_INTERLEAVED_1F1B, "interleaved-1f1b"},
    {RUN_SCHEDULE_ZB_H1, "zb-h1"}, {RUN_SCHEDULE_ZB_V, "zb-v"}, {RUN_SCHEDULE_DUALPIPEV, "dualpipev"}, {0, NULL}};
static const enum_name device_names[] = {{RUN_DEVICE_CPU, "cpu"}, {RUN_DEVICE_CUDA, "cuda"}, {0, NULL}};
static const enum_name transport_names[] = {{RUN_TRANSPORT_AUTO, "auto"}, {RUN_TRANSPORT_SHM, "shm"},
                                            {RUN_TRANSPORT_TCP, "tcp"},   {RUN_TRANSPORT_CUDA_IPC, "cuda-ipc"},
                                            {RUN_TRANSPORT_NCCL, "nccl"}, {0, NULL}};
static const enum_name mps_names[] = {{RUN_MPS_AUTO, "auto"}, {RUN_MPS_ON, "on"}, {RUN_MPS_OFF, "off"}, {0, NULL}};
static const enum_name dtype_names[] = {{RUN_DTYPE_FP32, "fp32"}, {RUN_DTYPE_BF16, "bf16"}, {0, NULL}};
static const enum_name progress_names[] = {
    {RUN_PROGRESS_AUTO, "auto"}, {RUN_PROGRESS_ON, "on"}, {RUN_PROGRESS_OFF, "off"}, {0, NULL}};
static const enum_name optimizer_names[] = {{MODEL_ADAMW, "adamw"}, {MODEL_SGD, "sgd"}, {0, NULL}};
static const enum_name recompute_names[] = {
    {RUN_RECOMPUTE_NONE, "none"}, {RUN_RECOMPUTE_FULL, "full"}, {RUN_RECOMPUTE_SELECTIVE, "selective"}, {0, NULL}};
/* --fail-at phase= */
static const enum_name phase_names[] = {
    {SCHED_F, "F"}, {SCHED_B, "B"}, {SCHED_W, "W"}, {RUN_FAIL_AT_ALLREDUCE, "allreduce"}, {0, NULL}};
/* --trace and --cupti */
static const enum_name on_off_names[] = {{1, "on"}, {0, "off"}, {0, NULL}};

static const char *name_of(const enum_name *table, int value) {
    for (int i = 0; table[i].name; i++)
        if (table[i].value == value) return table[i].name;
    return "?"; /* not a value of the table's enum */
}

/* "a|b|c", for an error */
static void names_list(const enum_name *table, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; table[i].name && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, i ? "|%s" : "%s", table[i].name);
}

/* 1 with *out the value named `value`; 0 when the table has no such name. */
static int find_name(const enum_name *table, const char *value, int *out) {
    for (int i = 0; value && table[i].name; i++)
        if (strcmp(value, table[i].name) == 0) {
            *out = table[i].value;
            return 1;
        }
    return 0;
}

static int parse_name(const enum_name *table, const char *opt, const char *value, int *out, pp_err *err) {
    if (find_name(table, value, out)) return 0;
    char list[256];
    names_list(table, list, sizeof list);
    return pp_fail(err, "%s: '%s' is not accepted; accepted: %s", opt, value ? value : "", list);
}

const char *run_device_name(run_device device) { return name_of(device_names, device); }
const char *run_transport_name(run_transport transport) { return name_of(transport_names, transport); }
const char *run_dtype_name(run_dtype dtype) { return name_of(dtype_names, dtype); }
const char *run_optimizer_name(model_optim_kind kind) { return name_of(optimizer_names, kind); }
const char *run_recompute_name(run_recompute mode) { return name_of(recompute_names, mode); }
const char *run_mps_name(run_mps mode) { return name_of(mps_names, mode); }

run_recompute run_config_recompute_of(const run_config *cfg, int stage) {
    if (!cfg->nrecompute_stages) return cfg->recompute;
    for (int i = 0; i < cfg->nrecompute_stages; i++)
        if (cfg->recompute_stages[i] == stage) return cfg->recompute;
    return RUN_RECOMPUTE_NONE;
}

const char *run_schedule_text(const run_config *cfg, char *buf, size_t n) {
    if (cfg->schedule == RUN_SCHEDULE_CSV)
        snprintf(buf, n, "csv:%s", cfg->schedule_csv);
    else
        snprintf(buf, n, "%s", name_of(schedule_names, cfg->schedule));
    return buf;
}

/* --schedule NAME or csv:FILE */
static int parse_schedule(run_config *cfg, const char *value, pp_err *err) {
    int kind;
    if (value && strncmp(value, "csv:", 4) == 0 && value[4]) {
        if (strlen(value) >= RUN_SCHEDULE_TEXT_MAX)
            return pp_fail(err, "--schedule: value is too long (at most %d characters)", RUN_SCHEDULE_TEXT_MAX - 1);
        memcpy(cfg->schedule_csv, value + 4, strlen(value + 4) + 1);
        cfg->schedule = RUN_SCHEDULE_CSV;
        return 0;
    }
    if (!find_name(schedule_names, value, &kind)) {
        char list[256];
        names_list(schedule_names, list, sizeof list);
        return pp_fail(err, "--schedule: '%s' is not accepted; accepted: %s|csv:FILE", value ? value : "", list);
    }
    cfg->schedule = (run_schedule_kind)kind;
    cfg->schedule_csv[0] = '\0';
    return 0;
}

static int parse_int(const char *opt, const char *value, long min, long max, int *out, pp_err *err) {
    long v;
    if (pp_parse_long(value, min, max, opt, &v, err) != 0) return -1;
    *out = (int)v;
    return 0;
}

_Static_assert(RUN_FAIL_AT_ALLREDUCE > SCHED_BW, "--fail-at phase=allreduce is no sched_op");

int run_fail_at_names(const run_fail_at *f, int op, int mb) {
    int phase = f->phase < 0 || f->phase == op || (op == SCHED_BW && (f->phase == SCHED_B || f->phase == SCHED_W));
    return phase && (f->mb < 0 || f->mb == mb);
}

/* --fail-at step=S,rank=R[,phase=F|B|W|allreduce,mb=M] */
static int fail_at_pair(void *ctx, const char *key, const char *value, pp_err *err) {
    run_fail_at *f = ctx;
    if (strcmp(key, "step") == 0) return parse_int("--fail-at step", value, 0, 1 << 30, &f->step, err);
    if (strcmp(key, "rank") == 0) return parse_int("--fail-at rank", value, 0, 1 << 20, &f->rank, err);
    if (strcmp(key, "mb") == 0) return parse_int("--fail-at mb", value, 0, 1 << 20, &f->mb, err);
    if (strcmp(key, "phase") == 0) return parse_name(phase_names, "--fail-at phase", value, &f->phase, err);
    return pp_fail(err, "--fail-at: unknown key '%s'; accepted: step, rank, phase, mb", key);
}

static int parse_fail_at(run_fail_at *f, const char *value, pp_err *err) {
    char buf[256];
    if (copy_text(buf, sizeof buf, "--fail-at", value, err) != 0) return -1;
    run_fail_at parsed = {.enabled = 1, .step = -1, .rank = -1, .phase = -1, .mb = -1};
    snprintf(parsed.text, sizeof parsed.text, "%s", buf); /* before the list is split in place */
    if (pp_parse_kv_list(buf, "--fail-at", fail_at_pair, &parsed, err) != 0) return -1;
    if (parsed.step < 0 || parsed.rank < 0)
        return pp_fail(err, "--fail-at: needs step=S and rank=R (e.g. step=1,rank=2[,phase=B,mb=3])");
    if (parsed.phase == RUN_FAIL_AT_ALLREDUCE && parsed.mb >= 0)
        return pp_fail(err, "--fail-at: phase=allreduce takes no mb (the all-reduce runs once per step)");
    *f = parsed;
    return 0;
}

static int parse_cuts(run_config *cfg, const char *value, pp_err *err) {
    int *cuts, n;
    if (sched_parse_cuts(value, &cuts, &n, err) != 0) return -1;
    int rc = n > RUN_MAX_CUTS ? pp_fail(err, "--pipeline-cuts: at most %d cuts", RUN_MAX_CUTS) : 0;
    if (rc == 0) {
        if (n) memcpy(cfg->cuts, cuts, sizeof *cuts * (size_t)n);
        cfg->ncuts = n;
    }
    free(cuts);
    return rc;
}

/* --recompute-stages S,S-S,...: stage indices, increasing (the text the
 * workers get back is the list's own). */
static int parse_recompute_stages(run_config *cfg, const char *value, pp_err *err) {
    const char *opt = "--recompute-stages";
    if (!value || !*value) return pp_fail(err, "%s: expected stages such as 0,1 or 0-2", opt);
    int n = 0, last = -1;
    for (const char *p = value; *p;) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item)
            return pp_fail(err, "%s: '%s' is not a list of stages such as 0,1 or 0-2", opt, value);
        memcpy(item, p, len);
        item[len] = '\0';
        char *dash = strchr(item + 1, '-');
        long lo, hi;
        if (dash) *dash = '\0';
        if (pp_parse_long(item, 0, 65535, opt, &lo, err) != 0) return -1;
        hi = lo;
        if (dash && pp_parse_long(dash + 1, 0, 65535, opt, &hi, err) != 0) return -1;
        if (lo <= last || hi < lo) return pp_fail(err, "%s: '%s': stages must increase", opt, value);
        for (long st = lo; st <= hi; st++) {
            if (n == RUN_MAX_CUTS + 1) return pp_fail(err, "%s: at most %d stages", opt, RUN_MAX_CUTS + 1);
            cfg->recompute_stages[n++] = (int)st;
        }
        last = (int)hi;
        p += len + (p[len] == ',');
        if (p[-1] == ',' && !*p) return pp_fail(err, "%s: '%s' ends with a comma", opt, value);
    }
    cfg->nrecompute_stages = n;
    return 0;
}

/* The list back as text: runs of stages as S-S. */
static void recompute_stages_text(const run_config *cfg, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < cfg->nrecompute_stages && len < n; i++) {
        int j = i;
        while (j + 1 < cfg->nrecompute_stages && cfg->recompute_stages[j + 1] == cfg->recompute_stages[j] + 1) j++;
        len += (size_t)snprintf(buf + len, n - len, j > i ? "%s%d-%d" : "%s%d", i ? "," : "",
                                cfg->recompute_stages[i], cfg->recompute_stages[j]);
        i = j;
    }
}

/* --schedule-costs f=..,b=..,w=..[,comm=..] or DB[:JOB] (run_config.h). */
static int parse_schedule_costs(run_config *cfg, const char *value, pp_err *err) {
    if (!value || !*value)
        return pp_fail(err, "--schedule-costs: expected f=F,b=B,w=W[,comm=C] or a database DB[:JOB], got nothing");
    cfg->has_schedule_costs = 0;
    cfg->schedule_costs_db[0] = '\0';
    cfg->schedule_costs_job = 0;
    if (strchr(value, '=')) {
        sched_costs c = {NAN, NAN, NAN, 0, 0, 0};
        if (sched_parse_costs(value, "--schedule-costs", &c, err) != 0) return -1;
        if (isnan(c.f) || isnan(c.b) || isnan(c.w))
            return pp_fail(err, "--schedule-costs: '%s' needs f, b and w (comm is 0 when not given)", value);
        if (c.f <= 0 || c.b <= 0)
            return pp_fail(err, "--schedule-costs: f and b must be more than 0, got f=%g b=%g", c.f, c.b);
        cfg->schedule_costs = c;
        cfg->has_schedule_costs = 1;
        return 0;
    }
    /* DB:JOB when what follows the last ':' is a number (a job id, or one
     * out of range: said so, not looked for as a file), else all of it is DB */
    const char *colon = strrchr(value, ':');
    size_t path_len = strlen(value);
    const char *digits = colon ? colon + 1 + (colon[1] == '-') : NULL;
    if (colon && *digits && strspn(digits, "0123456789") == strlen(digits)) {
        if (pp_parse_long(colon + 1, 1, 0x7fffffffL, "--schedule-costs DB:JOB", &cfg->schedule_costs_job, err) != 0)
            return -1;
        path_len = (size_t)(colon - value);
    }
    if (path_len == 0) return pp_fail(err, "--schedule-costs: '%s' names no database before ':'", value);
    if (path_len >= sizeof cfg->schedule_costs_db)
        return pp_fail(err, "--schedule-costs: the database path is longer than %zu bytes",
                       sizeof cfg->schedule_costs_db - 1);
    memcpy(cfg->schedule_costs_db, value, path_len);
    cfg->schedule_costs_db[path_len] = '\0';
    return 0;
}

/* --act-bytes F[:B],... (sched_parse_act) into cfg->act. */
static int parse_act_bytes(run_config *cfg, const char *value, pp_err *err) {
    sched_act *act;
    int n;
    if (sched_parse_act(value, "--act-bytes", &act, &n, err) != 0) return -1;
    int rc = n > RUN_MAX_ACT ? pp_fail(err, "--act-bytes: at most %d stages", RUN_MAX_ACT) : 0;
    if (rc == 0) memcpy(cfg->act, act, sizeof *act * (size_t)n), cfg->nact = n;
    free(act);
    return rc;
}

/* The options run_config_option reads: whether each takes a value, and
 * whether it configures pprun's own worker only (marked * in pprun run's
 * usage: meaningless to a user's program). --serve is cmd_run's (its value
 * is optional). */
static const struct {
    const char *name;
    int takes_value, worker_only;
} options[] = {
    {"--schedule", 1, 0},
    {"--microbatches", 1, 0},
    {"--virtual-stages", 1, 0},
    {"--steps", 1, 0},
    {"--device", 1, 0},
    {"--db", 1, 0},
    {"--trace", 1, 0},
    {"--token", 1, 0},
    {"--allow-host", 1, 0},
    {"--schedule-costs", 1, 0},
    {"--model", 1, 1},
    {"--data", 1, 1},
    {"--seed", 1, 1},
    {"--lr", 1, 1},
    {"--optimizer", 1, 1},
    {"--weight-decay", 1, 1},
    {"--checkpoint-dir", 1, 1},
    {"--checkpoint-every", 1, 1},
    {"--fail-at", 1, 1},
    {"--metrics", 1, 1},
    {"--pipeline-cuts", 1, 1},
    {"--recv-timeout", 1, 0}, /* a program: how long a p2p wait is before its rank says so */
    {"--transport", 1, 1},
    {"--progress", 1, 1},
    {"--save-weights", 1, 1},
    {"--dtype", 1, 1},
    {"--cupti", 1, 1},
    {"--mps", 1, 1},
    {"--resume", 0, 1},
    {"--init-from", 1, 1},
    {"--recompute", 1, 1},
    {"--recompute-stages", 1, 1},
    {"--pp", 1, 0},
    {"--dp", 1, 0},
    {"--zero1", 0, 1},
    {"--dp-overlap", 1, 1},
    {"--dp-bucket", 1, 1},
    {"--eval-every", 1, 1},
    {"--eval-microbatches", 1, 1},
    {"--eval-data", 1, 1},
    {"--max-mem", 1, 0},
    {"--act-bytes", 1, 0},
};

static int option_index(const char *opt) {
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (strcmp(opt, options[i].name) == 0) return (int)i;
    return -1;
}

int run_config_takes_value(const char *opt) {
    int i = option_index(opt);
    return i >= 0 && options[i].takes_value;
}

int run_config_is_flag(const char *opt) {
    int i = option_index(opt);
    return i >= 0 && !options[i].takes_value;
}

int run_config_worker_only(const char *opt) {
    int i = option_index(opt);
    return i >= 0 && options[i].worker_only;
}

int run_config_option(run_config *cfg, const char *opt, const char *value, pp_err *err) {
    int rc = 0, v;
    if (strcmp(opt, "--schedule") == 0)
        rc = parse_schedule(cfg, value, err);
    else if (strcmp(opt, "--schedule-costs") == 0)
        rc = parse_schedule_costs(cfg, value, err);
    else if (strcmp(opt, "--microbatches") == 0)
        rc = parse_int(opt, value, 1, 4096, &cfg->microbatches, err);
    else if (strcmp(opt, "--virtual-stages") == 0)
        rc = parse_int(opt, value, 1, PP_SHAPE_MAX_VIRTUAL, &cfg->virtual_stages, err);
    else if (strcmp(opt, "--steps") == 0)
        rc = parse_int(opt, value, 1, 1 << 24, &cfg->steps, err);
    else if (strcmp(opt, "--model") == 0)
        rc = copy_text(cfg->model_text, sizeof cfg->model_text, opt, value, err);
    else if (strcmp(opt, "--data") == 0)
        rc = copy_text(cfg->data, sizeof cfg->data, opt, value, err);
    else if (strcmp(opt, "--dtype") == 0) {
        if ((rc = parse_name(dtype_names, opt, value, &v, err)) == 0) cfg->dtype = (run_dtype)v;
    } else if (strcmp(opt, "--device") == 0) {
        if ((rc = parse_name(device_names, opt, value, &v, err)) == 0) cfg->device = (run_device)v;
    } else if (strcmp(opt, "--seed") == 0) {
        long seed;
        rc = pp_parse_long(value, 0, 0x7fffffffffffffffL, opt, &seed, err);
        if (rc == 0) cfg->seed = (uint64_t)seed;
    } else if (strcmp(opt, "--lr") == 0) {
        double lr;
        rc = pp_parse_double(value, 0.0, 10.0, opt, &lr, err);
        if (rc == 0) cfg->optim.lr = (float)lr;
    } else if (strcmp(opt, "--weight-decay") == 0) {
        double wd;
        rc = pp_parse_double(value, 0.0, 1.0, opt, &wd, err);
        if (rc == 0) cfg->optim.weight_decay = (float)wd;
    } else if (strcmp(opt, "--optimizer") == 0) {
        if ((rc = parse_name(optimizer_names, opt, value, &v, err)) == 0) cfg->optim.kind = (model_optim_kind)v;
    } else if (strcmp(opt, "--db") == 0)
        rc = copy_text(cfg->db, sizeof cfg->db, opt, value, err);
    else if (strcmp(opt, "--trace") == 0) {
        if ((rc = parse_name(on_off_names, opt, value, &v, err)) == 0) cfg->trace = v;
    } else if (strcmp(opt, "--cupti") == 0) {
        if ((rc = parse_name(on_off_names, opt, value, &v, err)) == 0) cfg->cupti = v;
    } else if (strcmp(opt, "--mps") == 0) {
        if ((rc = parse_name(mps_names, opt, value, &v, err)) == 0) cfg->mps = (run_mps)v;
    } else if (strcmp(opt, "--serve") == 0) {
        cfg->serve = 1;
        if (value) rc = copy_text(cfg->serve_addr, sizeof cfg->serve_addr, opt, value, err);
    } else if (strcmp(opt, "--token") == 0)
        rc = copy_text(cfg->token, sizeof cfg->token, opt, value, err);
    else if (strcmp(opt, "--allow-host") == 0) {
        size_t have = strlen(cfg->allow_hosts);
        if (!*value)
            rc = pp_fail(err, "--allow-host needs a host name");
        else if (have + strlen(value) + 2 > sizeof cfg->allow_hosts)
            rc = pp_fail(err, "--allow-host: more names than fit in %zu bytes", sizeof cfg->allow_hosts);
        else
            snprintf(cfg->allow_hosts + have, sizeof cfg->allow_hosts - have, "%s%s", have ? "," : "", value);
    }
    else if (strcmp(opt, "--checkpoint-dir") == 0)
        rc = copy_text(cfg->checkpoint_dir, sizeof cfg->checkpoint_dir, opt, value, err);
    else if (strcmp(opt, "--checkpoint-every") == 0)
        rc = parse_int(opt, value, 1, 1 << 24, &cfg->checkpoint_every, err);
    else if (strcmp(opt, "--resume") == 0)
        cfg->resume = 1;
    else if (strcmp(opt, "--init-from") == 0)
        rc = copy_text(cfg->init_from, sizeof cfg->init_from, opt, value, err);
    else if (strcmp(opt, "--fail-at") == 0)
        rc = parse_fail_at(&cfg->fail_at, value, err);
    else if (strcmp(opt, "--metrics") == 0)
        rc = copy_text(cfg->metrics, sizeof cfg->metrics, opt, value, err);
    else if (strcmp(opt, "--save-weights") == 0)
        rc = copy_text(cfg->save_weights, sizeof cfg->save_weights, opt, value, err);
    else if (strcmp(opt, "--pipeline-cuts") == 0)
        rc = parse_cuts(cfg, value, err);
    else if (strcmp(opt, "--recv-timeout") == 0) {
        uint64_t ns;
        rc = pp_parse_seconds_ns(value, opt, &ns, err);
        if (rc == 0 && (ns < 1000000 || ns > 86400ull * 1000000000ull))
            rc = pp_fail(err, "--recv-timeout: accepted: 1ms to 86400s (a day), got '%s'", value);
        if (rc == 0) cfg->recv_timeout_ms = (int)(ns / 1000000);
    } else if (strcmp(opt, "--transport") == 0) {
        if ((rc = parse_name(transport_names, opt, value, &v, err)) == 0) cfg->transport = (run_transport)v;
    } else if (strcmp(opt, "--progress") == 0) {
        if ((rc = parse_name(progress_names, opt, value, &v, err)) == 0) cfg->progress = (run_progress_mode)v;
    } else if (strcmp(opt, "--recompute") == 0) {
        if ((rc = parse_name(recompute_names, opt, value, &v, err)) == 0) cfg->recompute = (run_recompute)v;
    } else if (strcmp(opt, "--recompute-stages") == 0)
        rc = parse_recompute_stages(cfg, value, err);
    else if (strcmp(opt, "--pp") == 0)
        rc = parse_int(opt, value, 1, 1 << 16, &cfg->pp, err);
    else if (strcmp(opt, "--dp") == 0)
        rc = parse_int(opt, value, 1, 1 << 16, &cfg->dp, err);
    else if (strcmp(opt, "--zero1") == 0)
        cfg->zero1 = 1;
    else if (strcmp(opt, "--dp-overlap") == 0) {
        if ((rc = parse_name(on_off_names, opt, value, &v, err)) == 0) cfg->dp_overlap = v;
        if (!cfg->dp_tuned) cfg->dp_tuned = "--dp-overlap";
    } else if (strcmp(opt, "--dp-bucket") == 0) {
        rc = pp_parse_size(value, opt, &cfg->dp_bucket, err);
        if (rc == 0 && (cfg->dp_bucket < 4096 || cfg->dp_bucket > (1ull << 30)))
            rc = pp_fail(err, "--dp-bucket: accepted: 4KiB to 1GiB, got '%s'", value);
        if (!cfg->dp_tuned) cfg->dp_tuned = "--dp-bucket";
    } else if (strcmp(opt, "--eval-every") == 0)
        rc = parse_int(opt, value, 1, 1 << 24, &cfg->eval_every, err);
    else if (strcmp(opt, "--eval-microbatches") == 0)
        rc = parse_int(opt, value, 1, 4096, &cfg->eval_microbatches, err);
    else if (strcmp(opt, "--eval-data") == 0)
        rc = copy_text(cfg->eval_data, sizeof cfg->eval_data, opt, value, err);
    else if (strcmp(opt, "--max-mem") == 0)
        rc = sched_parse_max_mem(value, opt, &cfg->max_mem, &cfg->max_mem_bytes, err);
    else if (strcmp(opt, "--act-bytes") == 0)
        rc = parse_act_bytes(cfg, value, err);
    else
        return 0;
    return rc == 0 ? 1 : -1;
}

int run_config_finish(run_config *cfg, pp_err *err) {
    if (model_parse_spec(cfg->model_text, &cfg->model, err) != 0) return -1; /* its messages name --model */
    int cuda = cfg->device == RUN_DEVICE_CUDA;
    if (cfg->dtype == RUN_DTYPE_BF16 && !cuda)
        return pp_fail(err, "--dtype bf16 needs --device cuda (the CPU backend computes in fp32)");
    if (cfg->cupti == 1 && !cuda)
        return pp_fail(err, "--cupti on needs --device cuda (CUPTI traces GPU kernels; this job runs on --device %s)",
                       run_device_name(cfg->device));
    if (cfg->cupti == 1 && !cfg->trace)
        return pp_fail(err, "--cupti on needs --trace on (GPU spans go into the trace; --trace off keeps none)");
    if (cfg->cupti < 0) cfg->cupti = cuda && cfg->trace;
    if (cfg->mps == RUN_MPS_ON && !cuda)
        return pp_fail(err, "--mps on needs --device cuda (MPS shares a GPU between ranks; this job runs on --device %s)",
                       run_device_name(cfg->device));
    if (cfg->resume && !cfg->checkpoint_dir[0]) return pp_fail(err, "--resume needs --checkpoint-dir DIR");
    if (cfg->resume && cfg->init_from[0])
        return pp_fail(err, "--init-from %s and --resume both say where the job starts; give one", cfg->init_from);
    if (cfg->checkpoint_every && !cfg->checkpoint_dir[0])
        return pp_fail(err, "--checkpoint-every needs --checkpoint-dir DIR");
    if (cfg->nrecompute_stages && cfg->recompute == RUN_RECOMPUTE_NONE)
        return pp_fail(err,
                       "--recompute-stages says where --recompute applies: it needs --recompute full or selective");
    if (cfg->recompute != RUN_RECOMPUTE_NONE && cfg->model.kind != MODEL_GPT)
        return pp_fail(err, "--recompute %s applies to the gpt model; --model %s saves no activations to recompute",
                       run_recompute_name(cfg->recompute), cfg->model_text);
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    run_schedule_text(cfg, schedule, sizeof schedule);
    int v_placed = cfg->schedule == RUN_SCHEDULE_ZB_V || cfg->schedule == RUN_SCHEDULE_DUALPIPEV;
    if (v_placed && cfg->virtual_stages && cfg->virtual_stages != 2)
        return pp_fail(err, "--schedule %s needs --virtual-stages 2 (two chunks per rank in V placement), got %d",
                       schedule, cfg->virtual_stages);
    /* under --max-mem zb-h1's order is the greedy's too (sched_build_bounded) */
    int costed = cfg->schedule == RUN_SCHEDULE_ZB_V || (cfg->schedule == RUN_SCHEDULE_ZB_H1 && cfg->max_mem > 0);
    if ((cfg->has_schedule_costs || cfg->schedule_costs_db[0]) && !costed)
        return pp_fail(err, "--schedule-costs: only zb-v's order depends on op costs; --schedule %s is the same for "
                            "any costs (zb-h1's too, but under --max-mem)", schedule);
    if (cfg->nact && !(cfg->max_mem > 0 && cfg->max_mem_bytes))
        return pp_fail(err, "--act-bytes says what a stage holds for a --max-mem in bytes (e.g. --max-mem 64MiB)");
    if (cfg->schedule == RUN_SCHEDULE_CSV && cfg->virtual_stages)
        return pp_fail(err, "--virtual-stages does not apply to --schedule %s: the file defines the stages", schedule);
    int gpu_transport = cfg->transport == RUN_TRANSPORT_CUDA_IPC || cfg->transport == RUN_TRANSPORT_NCCL;
    if (gpu_transport && !cuda)
        return pp_fail(err, "--transport %s moves tensors in GPU memory: it needs --device cuda (with --device %s use "
                       "--transport auto, shm or tcp)", run_transport_name(cfg->transport), run_device_name(cfg->device));
    if ((cfg->eval_microbatches || cfg->eval_data[0]) && !cfg->eval_every)
        return pp_fail(err, "%s needs --eval-every K (evaluation steps are off without it)",
                       cfg->eval_microbatches ? "--eval-microbatches" : "--eval-data");
    if (cfg->eval_every && !cfg->eval_microbatches) cfg->eval_microbatches = cfg->microbatches;
    if (cfg->token[0] == '\0') {
        const char *env = getenv("PPRUN_TOKEN");
        if (env && strlen(env) < sizeof cfg->token) snprintf(cfg->token, sizeof cfg->token, "%s", env);
    }
    return 0;
}

int run_config_mesh(run_config *cfg, int world, const char *world_from, pp_err *err) {
    int pp = cfg->pp, dp = cfg->dp;
    if (pp && dp && (long)pp * dp != world)
        return pp_fail(err, "--pp %d --dp %d make %ld ranks, but %s start %d", pp, dp, (long)pp * dp, world_from, world);
    if (pp && !dp && world % pp != 0)
        return pp_fail(err, "--pp %d does not divide the %d ranks %s start", pp, world, world_from);
    if (dp && !pp && world % dp != 0)
        return pp_fail(err, "--dp %d does not divide the %d ranks %s start", dp, world, world_from);
    cfg->dp = dp ? dp : pp ? world / pp : 1;
    cfg->pp = world / cfg->dp;
    /* a step's microbatches are numbered over every replica (docs/schema.md):
     * past what every reader takes for one, they would refuse the job */
    if ((long)cfg->dp * cfg->microbatches > PP_SHAPE_MAX_MICROBATCHES)
        return pp_fail(err, "--dp %d x --microbatches %d: %ld microbatches a step over the replicas, more than %d",
                       cfg->dp, cfg->microbatches, (long)cfg->dp * cfg->microbatches, PP_SHAPE_MAX_MICROBATCHES);
    if (cfg->zero1 && cfg->dp < 2)
        return pp_fail(err, "--zero1 shards the optimizer state over the data-parallel group: it needs --dp 2 or more "
                       "(this job has %d pipeline%s)", cfg->dp, cfg->dp == 1 ? "" : "s");
    if (cfg->dp_tuned && cfg->dp < 2)
        return pp_fail(err, "%s tunes the data-parallel all-reduce: it needs --dp 2 or more (this job has %d "
                       "pipeline%s)", cfg->dp_tuned, cfg->dp, cfg->dp == 1 ? "" : "s");
    return 0;
}

int run_config_costs(const run_config *cfg, int stages, sched_costs *costs) {
    const model_spec *m = &cfg->model;
    if (m->kind != MODEL_TIMED) {
        *costs = (sched_costs){1, 1, 1, 0, 0, 0};
        return 0;
    }
    /* the mean stage (per=layer: an even split gives it within a layer) */
    double layers = stages > 0 ? (double)m->layers / stages : 1;
    *costs = (sched_costs){model_timed_op_ns(m, 0, layers), model_timed_op_ns(m, 1, layers),
                           model_timed_op_ns(m, 2, layers), 0, 0, 0};
    return 1;
}

int run_config_stage_costs(const run_config *cfg, int stages, sched_costs *each, pp_err *err) {
    if (cfg->model.kind != MODEL_TIMED) return 0;
    int *first = malloc(sizeof *first * (size_t)(stages + 1));
    if (!first) return pp_fail(err, "out of memory");
    int rc = sched_partition(cfg->model.layers, stages, cfg->ncuts ? cfg->cuts : NULL, cfg->ncuts, first, err);
    for (int s = 0; rc == 0 && s < stages; s++) {
        int layers = first[s + 1] - first[s];
        each[s] = (sched_costs){model_timed_op_ns(&cfg->model, 0, layers), model_timed_op_ns(&cfg->model, 1, layers),
                                model_timed_op_ns(&cfg->model, 2, layers), 0, 0, 0};
    }
    free(first);
    return rc == 0 ? 1 : -1;
}

int run_config_device_boundaries(const run_config *cfg) {
    return cfg->device == RUN_DEVICE_CUDA && cfg->transport != RUN_TRANSPORT_SHM && cfg->transport != RUN_TRANSPORT_TCP;
}

int run_config_check_gpu_transport(const run_config *cfg, const sched_plan *plan, int nproc_per_node, int devices,
                                   pp_err *err) {
    int ipc = cfg->transport == RUN_TRANSPORT_CUDA_IPC, nccl = cfg->transport == RUN_TRANSPORT_NCCL;
    if ((!ipc && !nccl) || cfg->device != RUN_DEVICE_CUDA || nproc_per_node < 1 || devices < 1) return 0;
    /* Every pair of the job, as devcomm_open checks them: NCCL's communicator
     * spans all ranks, and CUDA IPC handles open only within a node. */
    if (ipc && plan->ranks > nproc_per_node)
        return pp_fail(err, "--transport cuda-ipc works within one node: ranks %d and %d are on nodes 0 and 1; use "
                       "--transport auto or nccl", nproc_per_node - 1, nproc_per_node);
    if (nccl && plan->ranks > 1 && nproc_per_node > devices)
        return pp_fail(err, "--transport nccl: ranks 0 and %d share cuda:0 (%d ranks per node on %d GPU%s), and NCCL "
                       "refuses two ranks on one GPU; use --transport auto or cuda-ipc", devices, nproc_per_node,
                       devices, devices == 1 ? "" : "s");
    return 0;
}

int run_config_mem(const run_config *cfg, int stages, sched_act *act, sched_mem *mem, pp_err *err) {
    *mem = (sched_mem){.max = cfg->max_mem, .act = act, .nact = stages, .bytes = cfg->max_mem_bytes};
    if (cfg->nact) {
        if (cfg->nact != 1 && cfg->nact != stages)
            return pp_fail(err, "--act-bytes gives %d stages; the job has %d", cfg->nact, stages);
        for (int s = 0; s < stages; s++) act[s] = cfg->act[cfg->nact == 1 ? 0 : s];
        return 0;
    }
    if (!cfg->max_mem_bytes) {
        for (int s = 0; s < stages; s++) act[s] = (sched_act){1, 1, 0};
        return 0;
    }
    int *first = malloc(sizeof *first * (size_t)(stages + 1));
    if (!first) return pp_fail(err, "out of memory");
    int rc = sched_partition(cfg->model.layers, stages, cfg->ncuts ? cfg->cuts : NULL, cfg->ncuts, first, err);
    for (int s = 0; rc == 0 && s < stages; s++)
        act[s] = model_act_bytes(&cfg->model, first[s + 1] - first[s], s == 0, s == stages - 1,
                                 (int)run_config_recompute_of(cfg, s));
    free(first);
    return rc;
}

/* The plan within --max-mem: a CSV's (csv, validated, taken over) checked
 * against the bound; a generator's built under it (sched_from_flag_mem). */
static int plan_bounded(const run_config *cfg, const char *schedule, int ranks, const sched_costs *costs,
                        sched_plan *csv, sched_plan **out, pp_err *err) {
    int stages;
    if (csv) {
        stages = csv->stages;
    } else {
        stages = ranks * (cfg->virtual_stages ? cfg->virtual_stages : sched_default_virtual(schedule));
    }
    sched_act *act = malloc(sizeof *act * (size_t)(stages > 0 ? stages : 1));
    sched_mem mem;
    int rc = act ? run_config_mem(cfg, stages, act, &mem, err) : pp_fail(err, "out of memory");
    if (rc == 0 && csv) rc = sched_validate_mem(csv, &mem, err);
    if (rc == 0 && csv) *out = csv, csv = NULL;
    else if (rc == 0)
        rc = sched_from_flag_mem(schedule, ranks, cfg->microbatches, cfg->virtual_stages, costs, &mem, out, err);
    sched_free(csv);
    free(act);
    return rc;
}

int run_config_plan(const run_config *cfg, int ranks, sched_plan *csv, sched_plan **out, pp_err *err) {
    *out = NULL;
    if (cfg->schedule != RUN_SCHEDULE_CSV) sched_free(csv), csv = NULL; /* no file to stand for */
    if (cfg->schedule_costs_db[0] && !cfg->has_schedule_costs) {
        sched_free(csv);
        return pp_fail(err, "--schedule-costs %s: the launcher reads the database (pprun run), not a worker",
                       cfg->schedule_costs_db);
    }
    sched_costs costs;
    /* only zb-v's order (and zb-h1's under --max-mem) depends on costs */
    run_config_costs(cfg, cfg->schedule == RUN_SCHEDULE_ZB_H1 ? ranks : ranks * 2, &costs);
    if (cfg->has_schedule_costs) costs = cfg->schedule_costs;
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    run_schedule_text(cfg, schedule, sizeof schedule);
    int rc = 0;
    sched_plan *file = NULL; /* csv:FILE's plan, validated */
    if (cfg->schedule == RUN_SCHEDULE_CSV) {
        rc = csv ? 0 : sched_load_csv(cfg->schedule_csv, &csv, err);
        if (rc == 0) rc = sched_from_csv(cfg->schedule_csv, csv, ranks, cfg->microbatches, &file, err);
    }
    if (rc == 0 && cfg->max_mem > 0) rc = plan_bounded(cfg, schedule, ranks, &costs, file, out, err);
    else if (rc == 0 && file) *out = file;
    else if (rc == 0) rc = sched_from_flag(schedule, ranks, cfg->microbatches, cfg->virtual_stages, &costs, out, err);
    return rc != 0 ? pp_wrap(err, "--schedule %s", schedule) : 0;
}

/* Appends a copy of text; on a full table or no memory the argument list is
 * cut short, which the caller checks (run_config_to_args returns -1). */
static int push(char **argv, int argc, char **storage, int *nstore, const char *text) {
    if (argc < 0 || *nstore >= RUN_CONFIG_MAX_ARGS) return -1;
    if (!(storage[*nstore] = strdup(text))) return -1;
    argv[argc] = storage[(*nstore)++];
    return argc + 1;
}

int run_config_to_args(const run_config *cfg, char **argv, int argc, char **storage) {
    int ns = 0;
    char buf[4096], schedule[RUN_SCHEDULE_TEXT_MAX];
#define ARG(flag, ...)                                                                                                 \
    do {                                                                                                               \
        argc = push(argv, argc, storage, &ns, flag);                                                                   \
        snprintf(buf, sizeof buf, __VA_ARGS__);                                                                        \
        argc = push(argv, argc, storage, &ns, buf);                                                                    \
    } while (0)
    ARG("--schedule", "%s", run_schedule_text(cfg, schedule, sizeof schedule));
    if (cfg->has_schedule_costs) {
        char costs[256];
        sched_costs_text(&cfg->schedule_costs, costs, sizeof costs);
        ARG("--schedule-costs", "%s", costs);
    }
    ARG("--microbatches", "%d", cfg->microbatches);
    if (cfg->virtual_stages) ARG("--virtual-stages", "%d", cfg->virtual_stages);
    ARG("--steps", "%d", cfg->steps);
    ARG("--model", "%s", cfg->model_text);
    if (cfg->data[0]) ARG("--data", "%s", cfg->data);
    ARG("--device", "%s", run_device_name(cfg->device));
    ARG("--dtype", "%s", run_dtype_name(cfg->dtype));
    ARG("--seed", "%llu", (unsigned long long)cfg->seed);
    ARG("--lr", "%.9g", (double)cfg->optim.lr);
    ARG("--weight-decay", "%.9g", (double)cfg->optim.weight_decay);
    ARG("--optimizer", "%s", run_optimizer_name(cfg->optim.kind));
    ARG("--trace", "%s", name_of(on_off_names, cfg->trace));
    ARG("--cupti", "%s", name_of(on_off_names, cfg->cupti > 0));
    if (cfg->checkpoint_dir[0]) ARG("--checkpoint-dir", "%s", cfg->checkpoint_dir);
    if (cfg->checkpoint_every) ARG("--checkpoint-every", "%d", cfg->checkpoint_every);
    if (cfg->resume) argc = push(argv, argc, storage, &ns, "--resume");
    if (cfg->init_from[0]) ARG("--init-from", "%s", cfg->init_from);
    if (cfg->fail_at.enabled) {
        int n = snprintf(buf, sizeof buf, "step=%d,rank=%d", cfg->fail_at.step, cfg->fail_at.rank);
        if (cfg->fail_at.phase >= 0)
            n += snprintf(buf + n, sizeof buf - n, ",phase=%s", name_of(phase_names, cfg->fail_at.phase));
        if (cfg->fail_at.mb >= 0) snprintf(buf + n, sizeof buf - n, ",mb=%d", cfg->fail_at.mb);
        argc = push(argv, argc, storage, &ns, "--fail-at");
        argc = push(argv, argc, storage, &ns, buf);
    }
    if (cfg->metrics[0]) ARG("--metrics", "%s", cfg->metrics);
    if (cfg->save_weights[0]) ARG("--save-weights", "%s", cfg->save_weights);
    if (cfg->ncuts) {
        sched_cuts_text(cfg->cuts, cfg->ncuts, buf, sizeof buf);
        argc = push(argv, argc, storage, &ns, "--pipeline-cuts");
        argc = push(argv, argc, storage, &ns, buf);
    }
    ARG("--recv-timeout", "%dms", cfg->recv_timeout_ms);
    ARG("--transport", "%s", run_transport_name(cfg->transport));
    if (cfg->recompute != RUN_RECOMPUTE_NONE) ARG("--recompute", "%s", run_recompute_name(cfg->recompute));
    if (cfg->nrecompute_stages) {
        recompute_stages_text(cfg, buf, sizeof buf);
        argc = push(argv, argc, storage, &ns, "--recompute-stages");
        argc = push(argv, argc, storage, &ns, buf);
    }
    /* The mesh, resolved by the launcher (run_config_mesh): the data-parallel
     * options only when there is more than one pipeline. */
    if (cfg->pp) ARG("--pp", "%d", cfg->pp);
    if (cfg->dp) ARG("--dp", "%d", cfg->dp);
    if (cfg->zero1) argc = push(argv, argc, storage, &ns, "--zero1");
    if (cfg->dp > 1) {
        ARG("--dp-overlap", "%s", name_of(on_off_names, cfg->dp_overlap));
        ARG("--dp-bucket", "%llu", (unsigned long long)cfg->dp_bucket);
    }
    if (cfg->eval_every) {
        ARG("--eval-every", "%d", cfg->eval_every);
        ARG("--eval-microbatches", "%d", cfg->eval_microbatches);
    }
    if (cfg->eval_data[0]) ARG("--eval-data", "%s", cfg->eval_data);
    if (cfg->max_mem > 0) ARG("--max-mem", cfg->max_mem_bytes ? "%.0fB" : "%.0f", cfg->max_mem);
    if (cfg->nact) { /* runs of equal stages as *N: a job of thousands of stages has a few kinds */
        argc = push(argv, argc, storage, &ns, "--act-bytes");
        argc = sched_act_text(cfg->act, cfg->nact, buf, sizeof buf) == 0 ? push(argv, argc, storage, &ns, buf) : -1;
    }
#undef ARG
    storage[ns] = NULL;
    if (argc < 0) return -1;
    argv[argc] = NULL;
    return argc;
}

void run_config_free_args(char **storage) {
    for (int i = 0; storage[i]; i++)
        free(storage[i]);
}

int run_config_node_text(const run_config *cfg, int nproc_per_node, char *buf, size_t n) {
    static const char *const per_node[] = {"--data", "--checkpoint-dir", "--init-from", "--metrics", "--save-weights",
                                           "--eval-data", NULL};
    char *argv[RUN_CONFIG_MAX_ARGS + 1], *storage[RUN_CONFIG_MAX_ARGS + 1];
    int argc = run_config_to_args(cfg, argv, 0, storage);
    if (argc < 0) return -1;
    size_t len = (size_t)snprintf(buf, n, "--nproc-per-node %d\n", nproc_per_node);
    for (int i = 0; i < argc && len < n; i++) {
        const char *flag = argv[i];
        const char *value = run_config_takes_value(flag) && i + 1 < argc ? argv[++i] : "";
        if (!in_list(flag, per_node)) len += (size_t)snprintf(buf + len, n - len, "%s %s\n", flag, value);
    }
    run_config_free_args(storage);
    return len < n ? 0 : -1;
}

/* The line of `flag` (flen bytes) in a run_config_node_text, without its
 * newline, and its length; NULL when the text has no such flag. */
static const char *node_line(const char *text, const char *flag, size_t flen, int *len) {
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        const char *end = strchr(line, '\n');
        if (!end) return NULL;
        if (strncmp(line, flag, flen) == 0 && line[flen] == ' ') {
            *len = (int)(end - line);
            return line;
        }
    }
    return NULL;
}

/* "--microbatches 8", or "--resume" for a flag without a value. */
static int shown_len(const char *line, int len) { return line[len - 1] == ' ' ? len - 1 : len; }

int run_config_node_diff(const char *mine, const char *node0, pp_err *err) {
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0: each of my flags against node 0's; pass 1: node 0's flags I lack. */
        const char *text = pass == 0 ? mine : node0, *other = pass == 0 ? node0 : mine;
        for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
            const char *sp = strchr(line, ' '), *end = strchr(line, '\n');
            if (!sp || !end || sp > end) return pp_fail(err, "malformed options from node rank 0");
            int len = (int)(end - line), olen = 0;
            const char *o = node_line(other, line, (size_t)(sp - line), &olen);
            if (o && olen == len && memcmp(o, line, (size_t)len) == 0) continue;
            if (pass == 1) return pp_fail(err, "node rank 0 has %.*s, this node does not", shown_len(line, len), line);
            if (!o) return pp_fail(err, "this node has %.*s, node rank 0 does not", shown_len(line, len), line);
            return pp_fail(err, "this node has %.*s, node rank 0 has %.*s", shown_len(line, len), line,
                           shown_len(o, olen), o);
        }
    }
    return 0;
}
