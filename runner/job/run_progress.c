/* run_progress.c: the progress display of `pprun run` (run_progress.h). */
#include "runner/job/run_progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/token.h"
#include "runner/store/store.h"

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
        /* Redrawn from its start with \r, which stderr's escaping writes as
         * "\r" in any message (runner/main.c: a quoted line must not
         * overwrite what came before): this text is pprun's own numbers,
         * written to the descriptor itself after what stderr holds. */
        char line[160];
        int n = snprintf(line, sizeof line, "\r[%s] step %d/%d  loss %.4f  %.1f ms/step  %.0f tok/s  ETA %.0fs ", bar,
                         done, p->steps, loss, step_ms, tok_s, eta);
        fflush(stderr);
        if (n > 0 && write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
            /* a closed stderr: nothing to draw on */
        }
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

int run_progress_start(const char *store_addr, const char *store_token, int steps, int first_step,
                       run_progress_mode mode, run_progress **out, pp_err *err) {
    *out = NULL;
    if (mode == RUN_PROGRESS_OFF) return 0;
    run_progress *p = calloc(1, sizeof *p);
    if (!p) return pp_fail(err, "out of memory");
    if (store_parse_addr(store_addr, p->host, sizeof p->host, &p->port, err) != 0) {
        free(p);
        return -1;
    }
    if (store_token) snprintf(p->token, sizeof p->token, "%s", store_token);
    p->steps = steps;
    p->bar = mode == RUN_PROGRESS_ON || (mode == RUN_PROGRESS_AUTO && isatty(STDERR_FILENO));
    p->first_step = first_step;
    p->last_step = first_step - 1;
    p->t_start = pp_now_ns();
    pthread_mutex_init(&p->lock, NULL);
    pp_cond_init_monotonic(&p->wake);
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
