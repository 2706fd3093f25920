/* run_progress.c: progress display and planned timeline of `pprun run`. */
#include "runner/run_progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/analyze.h"
#include "runner/base/token.h"
#include "runner/store.h"

#define PROGRESS_POLL_NS (200ull * 1000000ull)

struct run_progress {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stop;
    char host[256];
    int port;
    char token[PP_TOKEN_MAX + 1];
    int steps, bar; /* bar: a bar (terminal) instead of lines */
    int first_step; /* the first step this display shows */
    int last_step;  /* last step shown */
    uint64_t t_start;
};

int run_progress_write_plan(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg,
                            const sched_costs *stage_costs, pp_err *err) {
    sched_costs *timed = NULL;
    if (!stage_costs) {
        if (!(timed = malloc(sizeof *timed * (size_t)plan->stages))) return pp_fail(err, "out of memory");
        int known = run_config_stage_costs(cfg, plan->stages, timed, err);
        if (known < 0) {
            free(timed);
            return -1;
        }
        if (known) stage_costs = timed;
    }
    sched_sim *sim = NULL;
    int simulated = stage_costs ? sched_simulate_stages(plan, stage_costs, &sim, err) : 0;
    free(timed);
    if (simulated != 0) return -1;
    size_t total = 0;
    for (int r = 0; r < plan->ranks; r++)
        total += (size_t)plan->len[r];
    db_plan_row *rows = calloc(total ? total : 1, sizeof *rows);
    char(*names)[16] = calloc(total ? total : 1, sizeof *names);
    if (!rows || !names) {
        free(rows), free(names), sched_sim_free(sim);
        return pp_fail(err, "out of memory");
    }
    static const char *phase[] = {"F", "B", "W"};
    size_t n = 0;
    for (int r = 0; r < plan->ranks; r++) {
        int k = 0; /* index into actions[r] (and the simulator's spans) */
        for (int slot = 0; slot < plan->nslots; slot++) {
            const sched_action *a = &plan->slots[r][slot];
            if (a->stage < 0) continue;
            sched_action_str(a, names[n]);
            rows[n] = (db_plan_row){
                .rank = r,
                .slot = slot,
                .action = names[n],
                .stage = a->stage,
                .phase = phase[a->op],
                .microbatch = a->mb,
                .sim_start_ns = -1,
                .sim_end_ns = -1,
            };
            if (sim && k < sim->nspans[r]) {
                rows[n].sim_start_ns = (int64_t)sim->spans[r][k].start;
                rows[n].sim_end_ns = (int64_t)sim->spans[r][k].end;
            }
            k++, n++;
        }
    }
    int rc = db_insert_plan(d, job_id, rows, n, err);
    free(rows), free(names), sched_sim_free(sim);
    return rc;
}

int run_progress_resimulate(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg, int step,
                            pp_err *err) {
    int stages = plan->stages;
    int64_t *med = calloc((size_t)stages * 3, sizeof *med);
    if (!med) return pp_fail(err, "out of memory");
    sched_costs *each = malloc(sizeof *each * (size_t)stages);
    int rc = !each ? pp_fail(err, "out of memory") : db_phase_medians(d, job_id, step, stages, med, err);
    int complete = rc == 0;
    for (int s = 0; complete && s < stages; s++) {
        for (int ph = 0; ph < 3; ph++) complete &= med[s * 3 + ph] >= 0;
        each[s] = (sched_costs){(double)med[s * 3], (double)med[s * 3 + 1], (double)med[s * 3 + 2], 0};
    }
    if (complete) rc = run_progress_write_plan(d, job_id, plan, cfg, each, err) == 0 ? 1 : -1;
    free(med), free(each);
    return rc;
}

static void show(run_progress *p, int step, double loss, double step_ms, double tok_s) {
    int done = step + 1, run_here = step + 1 - p->first_step;
    double elapsed = (double)(pp_now_ns() - p->t_start) / 1e9;
    double eta = run_here > 0 ? elapsed / run_here * (p->steps - done) : 0;
    if (p->bar) {
        char bar[31];
        int fill = p->steps ? done * 30 / p->steps : 30;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] step %d/%d  loss %.4f  %.1f ms/step  %.0f tok/s  ETA %.0fs ", bar, done, p->steps, loss,
                step_ms, tok_s, eta);
    } else {
        fprintf(stderr, "step %d/%d loss %.4f step_ms %.1f tokens_per_s %.0f eta_s %.0f\n", done, p->steps, loss,
                step_ms, tok_s, eta);
    }
    fflush(stderr);
}

/* Shows every step published since the last poll, in order. */
static void poll_once(run_progress *p, store_client *store) {
    for (;;) {
        char key[64];
        snprintf(key, sizeof key, "run/progress/%d", p->last_step + 1);
        void *val = NULL;
        size_t len;
        pp_err err;
        if (store_get(store, key, &val, &len, &err) != 0) return; /* not there yet, or the store is gone */
        double loss, ms, tok;
        int ok = sscanf(val, "%lf %lf %lf", &loss, &ms, &tok) == 3;
        free(val);
        if (!ok) return;
        /* Shown once, then gone: a long job keeps no key per step in the
         * store (its caps, store_limits.h, would end a job of millions of
         * steps). A restarted attempt publishes its steps again. */
        if (store_delete(store, key, &err) < 0) return;
        p->last_step++;
        show(p, p->last_step, loss, ms, tok);
    }
}

static void *progress_main(void *arg) {
    run_progress *p = arg;
    store_client *store = NULL;
    pp_err err;
    if (store_connect_token(p->host, p->port, p->token, 30ull * 1000000000ull, &store, &err) != 0) {
        fprintf(stderr, "pprun run: progress display off: %s\n", err.msg);
        return NULL;
    }
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        pthread_mutex_unlock(&p->lock);
        poll_once(p, store);
        pthread_mutex_lock(&p->lock);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)PROGRESS_POLL_NS;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        if (!p->stop) pthread_cond_timedwait(&p->wake, &p->lock, &until);
    }
    pthread_mutex_unlock(&p->lock);
    poll_once(p, store); /* the last step */
    store_close(store);
    if (p->bar) fputc('\n', stderr);
    return NULL;
}

int run_progress_start(const char *store_addr, const char *store_token, int steps, int first_step, const char *mode,
                       run_progress **out, pp_err *err) {
    *out = NULL;
    if (strcmp(mode, "off") == 0) return 0;
    run_progress *p = calloc(1, sizeof *p);
    if (!p) return pp_fail(err, "out of memory");
    if (store_parse_addr(store_addr, p->host, sizeof p->host, &p->port, err) != 0) {
        free(p);
        return -1;
    }
    if (store_token) snprintf(p->token, sizeof p->token, "%s", store_token);
    p->steps = steps;
    p->bar = strcmp(mode, "on") == 0 || (strcmp(mode, "auto") == 0 && isatty(STDERR_FILENO));
    p->first_step = first_step;
    p->last_step = first_step - 1;
    p->t_start = pp_now_ns();
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&p->thread, NULL, progress_main, p) != 0) {
        free(p);
        return pp_fail(err, "cannot start the progress thread");
    }
    *out = p;
    return 0;
}

int run_progress_stop(run_progress *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    int next = p->last_step + 1;
    free(p);
    return next;
}
