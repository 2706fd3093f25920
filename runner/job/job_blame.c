/* job_blame.c: the rank a failure of a `pprun run` job comes from
 * (job_blame.h). */
#include "runner/job/job_blame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/comm/comm.h"
#include "runner/store/store.h"

/* Beyond comm_wait_note_ms: the store's round trips, a busy machine. */
#define BLAME_SLACK_NS 300000000ull
#define BLAME_STORE_NS 5000000000ull
/* Ranks named one by one in the why line; then how many more. */
#define BLAME_LIST 8

typedef struct blame {
    const run_job *job;
    const launch_info *info;
    store_client *store;
    char job_key[192]; /* the attempt's, as the workers' comm has it */
    char *seen;        /* [world_size]: on the way already */
} blame;

/* The rank r says it waits for, or -1: nobody (or nothing readable);
 * *gone 1 where r failed because that rank died or closed ("<rank>
 * gone"). */
static int note_of(blame *b, int r, int *gone) {
    char key[320];
    snprintf(key, sizeof key, COMM_WAIT_KEY_FMT, b->job_key, r);
    void *v;
    size_t len;
    pp_err e;
    *gone = 0;
    if (store_get(b->store, key, &v, &len, &e) != 0) return -1;
    long peer = -1;
    char *text = v, *sp = len ? memchr(text, ' ', len) : NULL;
    int went = sp && (size_t)(text + len - sp - 1) == strlen(COMM_WAIT_GONE) &&
               memcmp(sp + 1, COMM_WAIT_GONE, strlen(COMM_WAIT_GONE)) == 0;
    if (went) *sp = 0; /* the number before it */
    if (len == 0 || (sp && !went) || pp_parse_long(text, 0, b->info->world_size - 1, "wait note", &peer, &e) != 0)
        peer = -1;
    if (peer >= 0) *gone = went;
    free(v);
    return (int)peer;
}

/* What r waits for, giving it the time a receive takes to say so: a rank
 * may have begun to wait just before the failure. */
static int note_within(blame *b, int r, int *gone) {
    uint64_t until =
        pp_now_ns() + (uint64_t)comm_wait_note_ms(b->job->cfg.recv_timeout_ms) * 1000000ull + BLAME_SLACK_NS;
    for (;;) {
        int p = note_of(b, r, gone);
        if (p >= 0 || pp_now_ns() >= until) return p;
        pp_sleep_ns(20000000ull);
    }
}

/* Rank r runs on this node and is stopped (SIGSTOP, SIGTSTP): whatever it
 * said it waits for, it answers nobody. Not a tracing stop ('t'): a rank
 * that is exiting is stopped so for a moment by the tools that look at it
 * (LeakSanitizer's scan, a core dumper), and it says whom it waited for. */
static int stopped_here(const blame *b, int r) {
    int lr = r - b->info->node_rank * b->info->nproc_per_node;
    if (lr < 0 || lr >= b->info->nproc_per_node || b->job->rank_pids[lr] <= 0) return 0;
    return launch_proc_state(b->job->rank_pids[lr]) == 'T';
}

/* The rank a cycle of notes blames: the first on it that the one before
 * waits for ("N") and that failed because the next one ended ("N gone"):
 * the rank waited for, whose own failure was only the waiter's end (the
 * rank that timed out, and the one it waited for, which then failed
 * sending to it). cyc[i]'s note, of kind gone[i], names cyc[i + 1] (the
 * last's the first). -1 for a cycle of waits only. */
static int cycle_root(const int *cyc, const int *gone, int len) {
    for (int i = 0; i < len; i++)
        if (gone[i] && !gone[(i + len - 1) % len]) return cyc[i];
    return -1;
}

/* From the rank the failed one's note names (first, a "gone" note with
 * first_gone), along the notes, to one that waits for nobody or is
 * stopped. chain gets the ranks on the way (the root last), gone[k] the
 * kind of chain[k]'s note. Notes that come back round (none stopped here)
 * blame the rank cycle_root names; ranks that only wait for each other,
 * the first the failed rank waited for; ranks each taken down by the
 * other's end (which cannot both be so), none: the failed rank's own
 * failure stands, as it does where it is the root (returned as such). */
static int follow(blame *b, int failed, int first, int first_gone, int *chain, int *gone, int *n) {
    int world = b->info->world_size;
    int *cyc = malloc((size_t)(world + 1) * 2 * sizeof *cyc); /* a cycle's ranks, then their notes' kinds */
    int r = first, root = -1;
    b->seen[failed] = 1;
    for (*n = 0; root < 0;) {
        chain[(*n)++] = r;
        int next = !cyc || stopped_here(b, r) ? -1 : note_within(b, r, &gone[*n - 1]);
        if (next < 0) {
            root = r;
        } else if (!b->seen[next]) {
            b->seen[r] = 1;
            r = next;
        } else { /* round from next (the failed rank, or one on the way) to r */
            int m = 0, all_gone = 1, *kind = cyc + world + 1;
            if (next == failed) cyc[m] = failed, kind[m++] = first_gone;
            for (int k = 0, on = next == failed; k < *n; k++)
                if ((on |= chain[k] == next)) cyc[m] = chain[k], kind[m++] = gone[k];
            for (int k = 0; k < m; k++)
                all_gone &= kind[k];
            root = cycle_root(cyc, kind, m);
            if (root < 0) root = all_gone ? failed : chain[0];
            for (int k = 0; k < *n; k++) /* the chain ends at the root */
                if (chain[k] == root) *n = k + 1;
        }
    }
    free(cyc);
    return root;
}

/* "rank 2", "ranks 0 and 2", "ranks 0, 2 and 3", "ranks 0, 1, ... and 40 more". */
static void say_ranks(char *buf, size_t cap, const int *r, int n) {
    size_t at = (size_t)snprintf(buf, cap, "rank%s", n > 1 ? "s" : "");
    for (int i = 0; i < n && i < BLAME_LIST && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", i == 0 ? " " : i == n - 1 ? " and " : ", ", r[i]);
    if (n > BLAME_LIST && at < cap) snprintf(buf + at, cap - at, ", ... and %d more", n - BLAME_LIST);
}

/* The link to chain[i] on the way: from the failed rank (i 0) or
 * chain[i - 1], and whether it is a "gone" note. */
static int link_from(const int *chain, int failed, int i) {
    return i ? chain[i - 1] : failed;
}
static int link_gone(const int *gone, int first_gone, int i) {
    return i ? gone[i - 1] : first_gone;
}

/* How we know: the ranks that were waiting for the root, the way from
 * the failed rank to it (a link of a "gone" note said as such: "rank 3
 * failed when rank 2 ended"), and, where the failed rank itself waited,
 * that it timed out first. gone[k] is the kind of chain[k]'s note,
 * first_gone the failed rank's. */
static void say_why(blame *b, int failed, int first_gone, const int *chain, const int *gone, int n, char *why,
                    size_t cap) {
    int root = chain[n - 1], world = b->info->world_size, count = 0;
    int *waiting = malloc((size_t)world * sizeof *waiting);
    for (int r = 0, went; waiting && r < world; r++) /* waiting: not taken down by its end */
        if (r != root && note_of(b, r, &went) == root && !went) waiting[count++] = r;
    char who[256], way[512] = "";
    if (count) say_ranks(who, sizeof who, waiting, count);
    else
        snprintf(who, sizeof who, "rank %d", link_from(chain, failed, n - 1));
    free(waiting);
    int at = count || !link_gone(gone, first_gone, n - 1)
                 ? snprintf(way, sizeof way, "%s %s waiting for it", who, count > 1 ? "were" : "was")
                 : snprintf(way, sizeof way, "%s failed when it ended", who);
    for (int i = n - 2; i >= 0 && at < (int)sizeof way; i--) {
        int from = link_from(chain, failed, i);
        at += link_gone(gone, first_gone, i)
                  ? snprintf(way + at, sizeof way - (size_t)at, ", rank %d failed when rank %d ended", from, chain[i])
                  : snprintf(way + at, sizeof way - (size_t)at, ", rank %d for rank %d", from, chain[i]);
    }
    int t = b->job->cfg.recv_timeout_ms;
    char limit[32];
    if (t % 1000 == 0) snprintf(limit, sizeof limit, "%ds", t / 1000);
    else snprintf(limit, sizeof limit, "%dms", t);
    if (first_gone)
        snprintf(why, cap, "%s", way);
    else
        snprintf(why, cap, "%s; rank %d timed out first (--recv-timeout %s)", way, failed, limit);
}

int job_blame(run_job *job, const launch_info *info, int failed_rank, char *why, size_t cap) {
    blame b = {.job = job, .info = info};
    comm_job_key(info->run_id, info->attempt, b.job_key, sizeof b.job_key);
    char host[256];
    int port, root = -1;
    pp_err e;
    int *chain = malloc((size_t)info->world_size * sizeof *chain),
        *gone = malloc((size_t)info->world_size * sizeof *gone);
    b.seen = calloc((size_t)info->world_size, 1);
    if (chain && gone && b.seen && store_parse_addr(info->store_addr, host, sizeof host, &port, &e) == 0 &&
        store_connect_token(host, port, info->rdzv_token, BLAME_STORE_NS, &b.store, &e) == 0) {
        store_set_timeout(b.store, BLAME_STORE_NS);
        int first_gone, first = note_of(&b, failed_rank, &first_gone), n = 0;
        if (first >= 0) root = follow(&b, failed_rank, first, first_gone, chain, gone, &n);
        if (root >= 0 && root != failed_rank) say_why(&b, failed_rank, first_gone, chain, gone, n, why, cap);
    }
    store_close(b.store);
    free(b.seen);
    free(gone);
    free(chain);
    return root;
}
