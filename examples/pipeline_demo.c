/* pipeline_demo.c: a program of your own, traced by pprun. Run it as
 *
 *     pprun run --schedule 1f1b --microbatches 8 --steps 20 -- ./build/pipeline_demo
 *
 * and it trains a tiny model as a pipeline, following the schedule pprun
 * gives it in its environment, and records every op through
 * libpprun_trace (tracer/pprun_trace.h, docs/trace-api.md). It is the
 * shape a real training program takes: read PPRUN_ACTIONS, run each action,
 * wrap each in pprun_trace_op.
 *
 * The model: stage s holds one weight w_s and maps a vector x to
 * tanh(w_s * x); the last stage's loss is mean((y - 0.5)^2). F sends y to
 * the next stage, B sends dL/dx back, W accumulates dL/dw, and the
 * optimizer step is plain SGD. Each op also sleeps --op-ms, so the timeline
 * is easy to read. Stages talk over abstract Unix datagram sockets named
 * after the run, the attempt and the rank (nothing to clean up).
 *
 * Options: --op-ms MS (default 2), --fail-at STEP (exit 3 at the start of
 * that step on the last rank, in the first attempt only: a crashed rank
 * that `--max-restarts` recovers from), --lr X (default 0.5). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tracer/pprun_trace.h"

#define DEMO_DIM 256
#define DEMO_MAX_STAGES 64
#define DEMO_MAX_MB 256

typedef struct demo_msg {
    int kind; /* 0 activation (F), 1 gradient (B) */
    int stage, mb, step;
    float v[DEMO_DIM];
} demo_msg;

static struct {
    int rank, world, attempt, stages, microbatches, steps;
    int stage_rank[DEMO_MAX_STAGES];
    const char *run_id;
    int sock;
    double op_ms, lr;
    int fail_at;
    demo_msg *early; /* messages that arrived before they were wanted */
    int nearly, early_cap;
    /* per stage: the weight, its gradient, and per microbatch the input and output */
    float w[DEMO_MAX_STAGES], dw[DEMO_MAX_STAGES];
    float (*x)[DEMO_MAX_MB][DEMO_DIM], (*y)[DEMO_MAX_MB][DEMO_DIM], (*dy)[DEMO_MAX_MB][DEMO_DIM];
} d;

static int env_int(const char *name) {
    const char *v = getenv(name);
    if (!v) {
        fprintf(stderr, "pipeline_demo: %s is not set: run me as `pprun run [options] -- pipeline_demo`\n", name);
        exit(2);
    }
    return atoi(v);
}

static void sock_name(int rank, struct sockaddr_un *a, socklen_t *len) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "pprun-demo/%s/%d/%d", d.run_id, d.attempt, rank);
    if (n < 0 || (size_t)n >= sizeof a->sun_path - 1) {
        fprintf(stderr, "pipeline_demo: the run id '%s' is too long for a socket name\n", d.run_id);
        exit(2);
    }
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void send_msg(int to, const demo_msg *m) {
    struct sockaddr_un a;
    socklen_t len;
    sock_name(to, &a, &len);
    /* The peer may not have bound its socket yet: retry for 30 s. */
    for (int tries = 0; sendto(d.sock, m, sizeof *m, 0, (struct sockaddr *)&a, len) < 0; tries++) {
        if ((errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN) || tries > 30000) {
            fprintf(stderr, "pipeline_demo: rank %d cannot send to rank %d: %s\n", d.rank, to, strerror(errno));
            exit(1);
        }
        sleep_ms(1);
    }
}

/* Blocks until the message (kind, stage, mb, step) arrives. */
static void recv_msg(int kind, int stage, int mb, int step, demo_msg *out) {
    for (;;) {
        for (int i = 0; i < d.nearly; i++)
            if (d.early[i].kind == kind && d.early[i].stage == stage && d.early[i].mb == mb &&
                d.early[i].step == step) {
                *out = d.early[i];
                d.early[i] = d.early[--d.nearly];
                return;
            }
        demo_msg m;
        if (recv(d.sock, &m, sizeof m, 0) != (ssize_t)sizeof m) {
            fprintf(stderr, "pipeline_demo: rank %d: receive failed: %s\n", d.rank, strerror(errno));
            exit(1);
        }
        if (d.nearly == d.early_cap) {
            fprintf(stderr, "pipeline_demo: rank %d: more than %d messages ahead of the schedule\n", d.rank, d.nearly);
            exit(1);
        }
        d.early[d.nearly++] = m;
    }
}

/* The data: microbatch mb of step `step`, the same on every run. */
static void input(int step, int mb, float *x) {
    for (int i = 0; i < DEMO_DIM; i++) x[i] = (float)sin(0.1 * i + 0.37 * mb + 0.011 * step);
}

static void forward(int step, int s, int mb) {
    uint64_t t0 = pprun_trace_now_ns();
    if (s == 0) {
        input(step, mb, d.x[s][mb]);
    } else {
        demo_msg m;
        int from = d.stage_rank[s - 1];
        if (from != d.rank) {
            recv_msg(0, s, mb, step, &m);
            pprun_trace_op("RECV_F", step, mb, s, from, sizeof m.v, t0, pprun_trace_now_ns());
            t0 = pprun_trace_now_ns();
            memcpy(d.x[s][mb], m.v, sizeof m.v);
        } else {
            memcpy(d.x[s][mb], d.y[s - 1][mb], sizeof m.v);
        }
    }
    for (int i = 0; i < DEMO_DIM; i++) d.y[s][mb][i] = tanhf(d.w[s] * d.x[s][mb][i]);
    sleep_ms(d.op_ms);
    pprun_trace_op("F", step, mb, s, -1, 0, t0, pprun_trace_now_ns());
    if (s + 1 < d.stages && d.stage_rank[s + 1] != d.rank) {
        demo_msg m = {.kind = 0, .stage = s + 1, .mb = mb, .step = step};
        memcpy(m.v, d.y[s][mb], sizeof m.v);
        uint64_t t1 = pprun_trace_now_ns();
        send_msg(d.stage_rank[s + 1], &m);
        pprun_trace_op("SEND_F", step, mb, s, d.stage_rank[s + 1], sizeof m.v, t1, pprun_trace_now_ns());
    }
}

static void backward_input(int step, int s, int mb) {
    uint64_t t0 = pprun_trace_now_ns();
    float *dy = d.dy[s][mb];
    if (s == d.stages - 1) {
        double loss = 0;
        for (int i = 0; i < DEMO_DIM; i++) {
            float e = d.y[s][mb][i] - 0.5f;
            loss += (double)e * e / DEMO_DIM;
            dy[i] = 2 * e / DEMO_DIM;
        }
        pprun_trace_loss(step, mb, s, loss);
    } else if (d.stage_rank[s + 1] != d.rank) {
        demo_msg m;
        recv_msg(1, s, mb, step, &m);
        pprun_trace_op("RECV_B", step, mb, s, d.stage_rank[s + 1], sizeof m.v, t0, pprun_trace_now_ns());
        t0 = pprun_trace_now_ns();
        memcpy(dy, m.v, sizeof m.v);
    } /* else the next stage, on this rank, wrote dy already */
    demo_msg g = {.kind = 1, .stage = s - 1, .mb = mb, .step = step};
    for (int i = 0; i < DEMO_DIM; i++) g.v[i] = dy[i] * (1 - d.y[s][mb][i] * d.y[s][mb][i]) * d.w[s];
    sleep_ms(d.op_ms);
    pprun_trace_op("B", step, mb, s, -1, 0, t0, pprun_trace_now_ns());
    if (s == 0) return;
    if (d.stage_rank[s - 1] == d.rank) {
        memcpy(d.dy[s - 1][mb], g.v, sizeof g.v);
        return;
    }
    uint64_t t1 = pprun_trace_now_ns();
    send_msg(d.stage_rank[s - 1], &g);
    pprun_trace_op("SEND_B", step, mb, s, d.stage_rank[s - 1], sizeof g.v, t1, pprun_trace_now_ns());
}

static void backward_weight(int step, int s, int mb) {
    uint64_t t0 = pprun_trace_now_ns();
    for (int i = 0; i < DEMO_DIM; i++)
        d.dw[s] += d.dy[s][mb][i] * (1 - d.y[s][mb][i] * d.y[s][mb][i]) * d.x[s][mb][i];
    sleep_ms(d.op_ms);
    pprun_trace_op("W", step, mb, s, -1, 0, t0, pprun_trace_now_ns());
}

int main(int argc, char **argv) {
    d.op_ms = 2, d.lr = 0.5, d.fail_at = -1;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 == argc) {
            fprintf(stderr, "pipeline_demo: %s needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--op-ms") == 0) d.op_ms = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--lr") == 0) d.lr = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--fail-at") == 0) d.fail_at = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "pipeline_demo: unknown option '%s' (--op-ms MS, --lr X, --fail-at STEP)\n", argv[i]);
            return 2;
        }
    }
    if (pprun_trace_init() < 0) {
        fprintf(stderr, "pipeline_demo: %s\n", pprun_trace_error());
        return 1;
    }
    d.rank = env_int("RANK"), d.world = env_int("WORLD_SIZE"), d.attempt = env_int("PPRUN_RESTART_COUNT");
    d.stages = env_int("PPRUN_NUM_STAGES"), d.microbatches = env_int("PPRUN_MICROBATCHES");
    d.steps = env_int("PPRUN_STEPS");
    d.run_id = getenv("PPRUN_RUN_ID") ? getenv("PPRUN_RUN_ID") : "run";
    if (d.stages > DEMO_MAX_STAGES || d.microbatches > DEMO_MAX_MB) {
        fprintf(stderr, "pipeline_demo: at most %d stages and %d microbatches\n", DEMO_MAX_STAGES, DEMO_MAX_MB);
        return 2;
    }
    const char *ranks = getenv("PPRUN_STAGE_RANKS"), *actions = getenv("PPRUN_ACTIONS");
    if (!ranks || !actions) {
        fprintf(stderr, "pipeline_demo: PPRUN_STAGE_RANKS and PPRUN_ACTIONS are not set: run me under pprun run\n");
        return 2;
    }
    for (int s = 0; s < d.stages; s++) {
        d.stage_rank[s] = atoi(ranks);
        ranks = strchr(ranks, ',') ? strchr(ranks, ',') + 1 : "";
        d.w[s] = 0.9f + 0.05f * (float)s; /* the same weights whatever the schedule */
    }
    d.x = calloc((size_t)d.stages, sizeof *d.x);
    d.y = calloc((size_t)d.stages, sizeof *d.y);
    d.dy = calloc((size_t)d.stages, sizeof *d.dy);
    /* pending at most: this step's gradients and the next step's activations */
    d.early_cap = d.stages * d.microbatches * 2;
    d.early = calloc((size_t)d.early_cap, sizeof *d.early);
    d.sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t len;
    sock_name(d.rank, &a, &len);
    if (!d.x || !d.y || !d.dy || !d.early || d.sock < 0 || bind(d.sock, (struct sockaddr *)&a, len) != 0) {
        fprintf(stderr, "pipeline_demo: rank %d: set-up failed: %s\n", d.rank, strerror(errno));
        return 1;
    }
    for (int step = 0; step < d.steps; step++) {
        if (step == d.fail_at && d.rank == d.world - 1 && d.attempt == 0) {
            fprintf(stderr, "pipeline_demo: rank %d fails at step %d (--fail-at)\n", d.rank, step);
            return 3;
        }
        /* One pass over this rank's actions ("0F0 0F1 0B0 0W0 ..."). */
        for (const char *p = actions; *p;) {
            int s, mb, used;
            char op;
            if (sscanf(p, "%d%c%d%n", &s, &op, &mb, &used) != 3) {
                fprintf(stderr, "pipeline_demo: cannot read PPRUN_ACTIONS at '%.20s'\n", p);
                return 2;
            }
            p += used;
            while (*p == ' ') p++;
            if (op == 'F') forward(step, s, mb);
            else if (op == 'B') backward_input(step, s, mb);
            else backward_weight(step, s, mb);
        }
        uint64_t t0 = pprun_trace_now_ns();
        for (int s = 0; s < d.stages; s++)
            if (d.stage_rank[s] == d.rank) {
                d.w[s] -= (float)(d.lr * d.dw[s] / d.microbatches);
                d.dw[s] = 0;
            }
        pprun_trace_op("OPT", step, -1, -1, -1, 0, t0, pprun_trace_now_ns());
    }
    close(d.sock);
    free(d.x), free(d.y), free(d.dy), free(d.early);
    pprun_trace_close();
    return 0;
}
