/* enginecheck.c: runs the engine's GPU path (runner/worker/engine.c with
 * --device cuda) without a GPU: forked ranks, the real host comm (shm)
 * between them, the GPU stage (gpu_stage.c) with the CPU references for
 * kernels (gpu_layers_standin.c) on the CUDA runtime stand-in
 * (cudart_standin.c), and devcomm replaced by a stand-in that carries
 * "device" buffers over the host comm. It checks what the engine does with
 * device boundaries: every stage switched to device buffers, boundary
 * tensors allocated by the stage that writes them, handed between stages of
 * one rank in the mailbox, sent and received through devcomm (never comm)
 * as device memory, and released into the reading stage's pool; and that
 * the losses and final weights equal the one-rank run's bit for bit, over
 * devcomm and with --transport shm (host staging). A buffer used on the
 * wrong side (a host buffer given to devcomm, a device buffer uploaded)
 * fails the rank. It proves the engine's wiring, nothing about CUDA IPC,
 * NCCL or kernels.
 *
 * Built a second time with ENGINECHECK_DEVCOMM (gpu_enginecheck_devcomm),
 * it runs the real devcomm instead of the stand-in: runner/comm/devcomm.c
 * and its cuda-ipc and nccl transports, over the same CUDA runtime stand-in
 * (device memory in shared memfd mappings, streams as threads) and the
 * NCCL stand-in (nccl_standin.c, loaded through PPRUN_NCCL_LIB). Ranks
 * "share one GPU" or "have their own" through the PCI bus id the stand-in
 * reports (PPRUN_STUB_BUSID), and the check asks devcomm which transport
 * each neighbour got.
 *
 *   ./build/gpu_enginecheck          (one line per job; exit 1 on any failure)
 *   ./build/gpu_enginecheck_devcomm
 *
 * Built by tests/gpu_emu/CMakeLists.txt; run by test_gpu_cli. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <cuda_runtime_api.h>
#include <ftw.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "helpers/comm_file_exchange.h"
#include "runner/comm/devcomm.h"
#include "runner/worker/engine.h"

#ifndef ENGINECHECK_DEVCOMM
/* --- devcomm stand-in: "device" buffers over the host comm ------------------- */

struct devcomm {
    comm *host;
    _Atomic long sends, recvs; /* an overlapped pair's two threads count too */
};

/* devcomm takes device memory only (cudart_standin.c knows which is). */
static int device_buffer(const void *p, const char *what, pp_err *err) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice)
        return pp_fail(err, "%s is host memory, expected device memory", what);
    return 0;
}

int devcomm_open(const devcomm_config *cfg, devcomm **out, pp_err *err) {
    if (!(*out = calloc(1, sizeof **out))) return pp_fail(err, "out of memory");
    (*out)->host = cfg->host;
    return 0;
}
int devcomm_send(devcomm *d, int peer, uint64_t tag, const void *dev, size_t len, pp_err *err) {
    if (device_buffer(dev, "devcomm_send's buffer", err) != 0) return -1;
    d->sends++;
    return comm_send(d->host, peer, tag, dev, len, err);
}
int devcomm_recv(devcomm *d, int peer, uint64_t tag, void *dev, size_t len, int timeout_ms, pp_err *err) {
    if (device_buffer(dev, "devcomm_recv's buffer", err) != 0) return -1;
    d->recvs++;
    return comm_recv(d->host, peer, tag, dev, len, timeout_ms, err);
}
int devcomm_flush(devcomm *d, int timeout_ms, pp_err *err) { return comm_flush(d->host, timeout_ms, err); }
void devcomm_close(devcomm *d) { free(d); }
const char *devcomm_transport_name(const devcomm *d, int peer) {
    (void)d, (void)peer;
    return "stand-in";
}
static long dc_sends(const devcomm *d) { return d ? d->sends : 0; }
static long dc_recvs(const devcomm *d) { return d ? d->recvs : 0; }
#else
/* the real devcomm counts nothing for us */
static long dc_sends(const devcomm *d) { return d ? -1 : 0; }
static long dc_recvs(const devcomm *d) { return d ? -1 : 0; }
#endif

/* --- one rank ---------------------------------------------------------------- */

#define MODEL "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"

/* gpus: 1 = every rank on one GPU, else a GPU per rank (the real devcomm
 * build's stand-in bus ids); expect: the transport devcomm must pick for a
 * neighbour ("-" without devcomm). */
typedef struct job {
    const char *what, *schedule, *device, *transport;
    int ranks, virtual_stages, device_boundaries, gpus;
    const char *expect;
} job;

typedef struct rank_ctx {
    const char *dir;
} rank_ctx;

/* The last stage's losses, appended as raw floats. */
static int on_step(void *ctx, const engine_step_report *r, pp_err *err) {
    rank_ctx *rc = ctx;
    char path[512];
    snprintf(path, sizeof path, "%s/losses.f32", rc->dir);
    FILE *f = fopen(path, "ab");
    if (!f || fwrite(r->losses, sizeof(float), (size_t)r->microbatches, f) != (size_t)r->microbatches) {
        if (f) fclose(f);
        return pp_fail(err, "cannot write %s", path);
    }
    return fclose(f) == 0 ? 0 : pp_fail(err, "cannot write %s", path);
}

static int set(run_config *cfg, const char *opt, const char *val, pp_err *err) {
    return run_config_option(cfg, opt, val, err) == 1 ? 0 : pp_wrap(err, "%s %s", opt, val);
}

/* Runs rank `rank` of the job; writes DIR/rank_R.txt ("sends recvs
 * device_boundaries transport") and returns 0, or -1 with err. */
static int run_rank(const job *j, const char *dir, int rank, pp_err *err) {
#ifdef ENGINECHECK_DEVCOMM
    char bus[32];
    snprintf(bus, sizeof bus, "0000:%02x:00.0", j->gpus == 1 ? 0x10 : 0x20 + rank);
    setenv("PPRUN_STUB_BUSID", bus, 1);
    setenv("PPRUN_NCCL_LIB", PPRUN_NCCL_STANDIN, 1);
#endif
    run_config cfg;
    char vs[16], wdir[512];
    snprintf(vs, sizeof vs, "%d", j->virtual_stages);
    snprintf(wdir, sizeof wdir, "%s/w", dir);
    run_config_default(&cfg);
    if (set(&cfg, "--model", MODEL, err) || set(&cfg, "--schedule", j->schedule, err) ||
        set(&cfg, "--microbatches", "4", err) || set(&cfg, "--steps", "2", err) ||
        set(&cfg, "--device", j->device, err) || set(&cfg, "--transport", j->transport, err) ||
        set(&cfg, "--save-weights", wdir, err) || set(&cfg, "--recv-timeout", "30s", err) ||
        (j->virtual_stages && set(&cfg, "--virtual-stages", vs, err)) || run_config_finish(&cfg, err))
        return -1;
    sched_plan *plan = NULL;
    data_source *data = NULL;
    comm *c = NULL;
    devcomm *dc = NULL;
    int nodes[8] = {0};
    char job_key[64];
    snprintf(job_key, sizeof job_key, "enginecheck-%d", (int)getppid());
    rank_ctx ctx = {dir};
    engine e = {0};
    int rc = -1;
    if (run_config_plan(&cfg, j->ranks, NULL, &plan, err) != 0 || data_open(NULL, 64, &data, err) != 0) goto out;
    if (j->ranks > 1) {
        comm_config cc = {.rank = rank, .world = j->ranks, .rank_node = nodes, .job_key = job_key,
                          .exchange = fx_exchange(dir), .connect_timeout_ms = 30000,
                          .transport = run_config_device_boundaries(&cfg) ? "auto" : run_transport_name(cfg.transport)};
        if (comm_open(&cc, &c, err) != 0) goto out;
        devcomm_config dcfg = {.host = c, .transport = run_transport_name(cfg.transport)};
        if (run_config_device_boundaries(&cfg) && devcomm_open(&dcfg, &dc, err) != 0) goto out;
    }
    e = (engine){.cfg = &cfg, .plan = plan, .rank = rank, .local_rank = rank,
                 .comm = c, .devcomm = dc, .data = data, .hooks = {.ctx = &ctx, .on_step = on_step}};
    if (engine_init(&e, err) != 0 || engine_run(&e, err) != 0) goto out;
    if (dc && devcomm_flush(dc, 30000, err) != 0) goto out;
    if (c && comm_flush(c, 30000, err) != 0) goto out;
    char path[512];
    snprintf(path, sizeof path, "%s/rank_%d.txt", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        pp_fail(err, "cannot write %s", path);
        goto out;
    }
    int peer = plan->stage_rank[0] != rank ? plan->stage_rank[0] : plan->stage_rank[1 % plan->stages];
    fprintf(f, "%ld %ld %d %s\n", dc_sends(dc), dc_recvs(dc), e.device_boundaries,
            dc && peer != rank ? devcomm_transport_name(dc, peer) : "-");
    fclose(f);
    rc = 0;
out:
    engine_free(&e);
    if (dc) devcomm_close(dc);
    comm_close(c);
    data_close(data);
    sched_free(plan);
    return rc;
}

/* --- the check ------------------------------------------------------------------ */

/* The whole file (caller frees), or NULL. */
static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    pp_err e;
    return file_input_read(path, "check output", (size_t)1 << 30, &buf, len, &e) == 0 ? buf : NULL;
}

/* Losses followed by every stage's weights, in stage order (caller frees). */
static char *result_bytes(const char *dir, int stages, size_t *len) {
    char path[512];
    snprintf(path, sizeof path, "%s/losses.f32", dir);
    char *all = slurp(path, len);
    for (int s = 0; all && s < stages; s++) {
        size_t n;
        snprintf(path, sizeof path, "%s/w/stage_%d.f32", dir, s);
        char *part = slurp(path, &n);
        char *grown = part ? realloc(all, *len + n) : NULL;
        if (!grown) {
            free(part), free(all);
            return NULL;
        }
        memcpy(grown + *len, part, n);
        *len += n, all = grown;
        free(part);
    }
    return all;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : -1;
}

/* Removes dir and everything under it (links are removed, not followed). */
static int rm_tree(const char *dir) { return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Forks the job's ranks in a fresh directory; 0 when every rank succeeded,
 * else -1 with the first rank's error in msg. */
static int run_job(const job *j, char *dir, size_t dircap, char *msg, size_t msgcap) {
    snprintf(dir, dircap, "/tmp/pprun-enginecheck-XXXXXX");
    if (!mkdtemp(dir)) return snprintf(msg, msgcap, "mkdtemp failed"), -1;
    pid_t pids[8];
    int failed = -1, failed_status = 0;
    for (int r = 0; r < j->ranks; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) < 0 && failed < 0) failed = r; /* no rank_%d.err: "(no message)" */
        if (pids[r] == 0) {
            pp_err err;
            int rc = run_rank(j, dir, r, &err);
            if (rc != 0) {
                char path[512];
                snprintf(path, sizeof path, "%s/rank_%d.err", dir, r);
                FILE *f = fopen(path, "w");
                if (f) fprintf(f, "%s", err.msg), fclose(f);
            }
            _exit(rc == 0 ? 0 : 1);
        }
    }
    for (int r = 0; r < j->ranks; r++) {
        int status;
        if (pids[r] < 0) continue;
        waitpid(pids[r], &status, 0);
        if (failed < 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failed = r, failed_status = status;
    }
    char key[64];
    snprintf(key, sizeof key, "enginecheck-%d", (int)getpid());
    comm_cleanup(key);
    if (failed < 0) return 0;
    char path[512];
    size_t n;
    snprintf(path, sizeof path, "%s/rank_%d.err", dir, failed);
    char *why = slurp(path, &n);
    if (WIFSIGNALED(failed_status)) /* e.g. SIGABRT: host free() of "device" memory (a memfd mapping) */
        snprintf(msg, msgcap, "rank %d was killed by signal %d", failed, WTERMSIG(failed_status));
    else
        snprintf(msg, msgcap, "rank %d failed: %s", failed, why ? why : "(no message)");
    free(why);
    return -1;
}

int main(void) {
#ifndef ENGINECHECK_DEVCOMM
    static const job jobs[] = {
        {"1 rank (reference)", "1f1b", "cuda", "auto", 1, 0, 1, 1, "-"},
        {"4 ranks, 1f1b, devcomm", "1f1b", "cuda", "auto", 4, 0, 1, 1, "stand-in"},
        {"4 ranks, gpipe, --transport cuda-ipc", "gpipe", "cuda", "cuda-ipc", 4, 0, 1, 1, "stand-in"},
        {"2 ranks, interleaved-1f1b, devcomm + mailbox", "interleaved-1f1b", "cuda", "auto", 2, 2, 1, 1, "stand-in"},
        {"2 ranks, zb-v, devcomm + mailbox", "zb-v", "cuda", "nccl", 2, 2, 1, 1, "stand-in"},
        {"2 ranks, dualpipev, pairs on two threads", "dualpipev", "cuda", "auto", 2, 2, 1, 1, "stand-in"},
        {"4 ranks, 1f1b, --transport shm (host staging)", "1f1b", "cuda", "shm", 4, 0, 0, 1, "-"},
        {"4 ranks, 1f1b, --device cpu", "1f1b", "cpu", "auto", 4, 0, 0, 1, "-"},
    };
#else
    static const job jobs[] = {
        {"1 rank (reference)", "1f1b", "cuda", "auto", 1, 0, 1, 1, "-"},
        {"4 ranks on one GPU, 1f1b (auto)", "1f1b", "cuda", "auto", 4, 0, 1, 1, "cuda-ipc"},
        {"4 ranks on 4 GPUs, 1f1b (auto)", "1f1b", "cuda", "auto", 4, 0, 1, 4, "nccl"},
        {"4 ranks on one GPU, gpipe, cuda-ipc", "gpipe", "cuda", "cuda-ipc", 4, 0, 1, 1, "cuda-ipc"},
        {"2 ranks on one GPU, zb-v (auto) + mailbox", "zb-v", "cuda", "auto", 2, 2, 1, 1, "cuda-ipc"},
        {"2 ranks on 2 GPUs, interleaved, nccl + mailbox", "interleaved-1f1b", "cuda", "nccl", 2, 2, 1, 2, "nccl"},
        {"2 ranks on one GPU, dualpipev, pairs, cuda-ipc", "dualpipev", "cuda", "auto", 2, 2, 1, 1, "cuda-ipc"},
        {"2 ranks on 2 GPUs, dualpipev, pairs, nccl", "dualpipev", "cuda", "auto", 2, 2, 1, 2, "nccl"},
        {"4 ranks on one GPU, 1f1b, --transport shm", "1f1b", "cuda", "shm", 4, 0, 0, 1, "-"},
    };
#endif
    char *ref = NULL;
    size_t ref_len = 0;
    int failed = 0;
    for (size_t i = 0; i < sizeof jobs / sizeof *jobs; i++) {
        const job *j = &jobs[i];
        char dir[64], msg[1200] = "";
        int stages = j->ranks * (j->virtual_stages ? j->virtual_stages : 1);
        int ok = run_job(j, dir, sizeof dir, msg, sizeof msg) == 0;
        long sends = 0, recvs = 0;
        for (int r = 0; ok && r < j->ranks; r++) { /* every rank's counts */
            char path[512];
            size_t n;
            snprintf(path, sizeof path, "%s/rank_%d.txt", dir, r);
            char *text = slurp(path, &n);
            long s = 0, v = 0;
            int dev = 0;
            char used[32] = "";
            if (!text || sscanf(text, "%ld %ld %d %31s", &s, &v, &dev, used) != 4) {
                snprintf(msg, sizeof msg, "rank %d left no counts", r);
                ok = 0;
            } else if (dev != j->device_boundaries) {
                snprintf(msg, sizeof msg, "rank %d: device boundaries %d, expected %d", r, dev, j->device_boundaries);
                ok = 0;
            } else if (strcmp(used, j->ranks > 1 ? j->expect : "-") != 0) {
                snprintf(msg, sizeof msg, "rank %d: devcomm picked %s, expected %s", r, used, j->expect);
                ok = 0;
            }
            sends += s, recvs += v;
            free(text);
        }
        /* devcomm carries every cross-rank tensor with device boundaries, none otherwise */
        if (ok && j->device_boundaries && j->ranks > 1 && sends >= 0 && (sends == 0 || sends != recvs))
            snprintf(msg, sizeof msg, "devcomm: %ld sends, %ld receives", sends, recvs), ok = 0;
        if (ok && !j->device_boundaries && sends + recvs != 0)
            snprintf(msg, sizeof msg, "devcomm used by a host-boundary job (%ld sends)", sends), ok = 0;
        size_t len = 0;
        char *bytes = ok ? result_bytes(dir, stages, &len) : NULL;
        if (ok && !bytes) snprintf(msg, sizeof msg, "no losses or weights written"), ok = 0;
        if (ok && i == 0) {
            ref = bytes, ref_len = len;
            bytes = NULL;
        } else if (ok && (len != ref_len || memcmp(bytes, ref, len) != 0)) {
            snprintf(msg, sizeof msg, "losses or weights differ from the one-rank run");
            ok = 0;
        }
        free(bytes);
        if (ok && sends >= 0)
            snprintf(msg, sizeof msg, "%s (%ld devcomm messages)", i ? "same bits as one rank" : "ran", sends);
        else if (ok)
            snprintf(msg, sizeof msg, "%s%s%s", i ? "same bits as one rank" : "ran", j->ranks > 1 ? ", over " : "",
                     j->ranks > 1 ? j->expect : "");
        printf("%-48s %s%s\n", j->what, ok ? "" : "FAIL: ", msg);
        failed |= !ok;
        if (rm_tree(dir) < 0) failed = 1;
    }
    free(ref);
    printf("%s\n", failed ? "FAIL" : "ok");
    return failed;
}
