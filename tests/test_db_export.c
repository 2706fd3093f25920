/* test_db_export.c: Chrome trace export, read back with cJSON as Perfetto
 * would: one X event per traced op, names, counters; `pprun export` errors. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/analyze.h"
#include "db/critpath.h"
#include "db/db.h"
#include "db/export.h"
#include "helpers/trace_fixture.h"
#include "helpers/web_fixture.h"

/* A database with two steps of the fixture, analysed; returns the job id. */
static int64_t make_db(const char *path) {
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    n += tfix_events(1, 2000000, ev + n);
    ev[0].start_ns += 1; /* 0F0 of step 0 starts 1 ns late: ns precision must show */
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    db_close(d);
    return job;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

/* Job `job` of s exported (db_export_chrome), parsed: the caller frees it
 * with cJSON_Delete. */
static cJSON *exported(sqlite3 *s, int64_t job) {
    char *text = NULL;
    size_t len = 0;
    pp_err err;
    FILE *out = open_memstream(&text, &len);
    cr_assert_not_null(out);
    cr_assert_eq(db_export_chrome(s, job, NULL, NULL, "ranks", out, &err), 0, "%s", err.msg);
    fclose(out);
    cJSON *root = cJSON_Parse(text);
    cr_assert_not_null(root, "the export is valid JSON: %.300s", text);
    free(text);
    return root;
}

/* An export written to path, parsed: fails the test unless it is JSON. */
static cJSON *read_json(const char *path) {
    char *text = slurp(path);
    cr_assert_not_null(text, "%s was not written", path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(root, "the export in %s is not valid JSON", path);
    return root;
}

static int run(const char *args, const char *errfile) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s export %s >/dev/null 2>%s", PPRUN_BIN, args, errfile);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static cJSON *find_meta(cJSON *evs, const char *name, int pid, int tid) {
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "M") != 0) continue;
        if (strcmp(cJSON_GetObjectItem(e, "name")->valuestring, name) != 0) continue;
        if (cJSON_GetObjectItem(e, "pid")->valueint == pid && (tid < 0 || cJSON_GetObjectItem(e, "tid")->valueint == tid))
            return e;
    }
    return NULL;
}

Test(db_export, chrome_json_has_one_x_event_per_op_names_and_counters) {
    const char *path = tfix_path("exp.db");
    int64_t job = make_db(path);
    char args[1024];
    const char *out = tfix_path("trace.json"), *errf = tfix_path("err.txt");
    snprintf(args, sizeof args, "--db %s --job %lld --format chrome --out %s", path, (long long)job, out);
    cr_assert_eq(run(args, errf), 0);
    cJSON *root = read_json(out);
    cJSON *evs = cJSON_GetObjectItem(root, "traceEvents");
    cr_assert(cJSON_IsArray(evs));
    int x = 0, c_loss = 0, c_bubble = 0, comm_on_compute_tid = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        if (strcmp(ph, "X") == 0) {
            x++;
            cJSON *a = cJSON_GetObjectItem(e, "args");
            cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(a, "step")));
            const char *phase = cJSON_GetObjectItem(a, "phase")->valuestring;
            int tid = cJSON_GetObjectItem(e, "tid")->valueint, pid = cJSON_GetObjectItem(e, "pid")->valueint;
            if (strncmp(phase, "SEND", 4) == 0 || strncmp(phase, "RECV", 4) == 0) {
                if (tid % 16 == 0) comm_on_compute_tid++;
            } else if (strcmp(phase, "OPT") != 0) {
                cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(a, "microbatch")));
                cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(a, "stage")));
            }
            cr_assert_not_null(find_meta(evs, "thread_name", pid, tid), "thread %d of process %d is named", tid, pid);
            if (strcmp(name, "0F0") == 0 && cJSON_GetObjectItem(a, "step")->valueint == 0) {
                /* t0 = 1 ms; 0F0 starts at 1 ms + 1 ns, lasts 10 µs - 1 ns. */
                cr_assert_float_eq(cJSON_GetObjectItem(e, "ts")->valuedouble, 0.001, 1e-9);
                cr_assert_float_eq(cJSON_GetObjectItem(e, "dur")->valuedouble, 9.999, 1e-9);
                cr_assert_eq(pid, 1, "node 0's process is pid 1 (Perfetto keeps pid 0 for the kernel)");
            }
        } else if (strcmp(ph, "C") == 0) {
            if (strcmp(name, "loss") == 0) c_loss++;
            if (strncmp(name, "bubble ratio", 12) == 0) c_bubble++;
        }
    }
    cr_assert_eq(x, 28, "one X event per traced op (2 steps x 14)");
    cr_assert_eq(c_loss, 4);
    cr_assert_eq(c_bubble, 4);
    cr_assert_eq(comm_on_compute_tid, 0, "communication has its own thread");
    cJSON *p1 = find_meta(evs, "process_name", 2, -1); /* node 1's */
    cr_assert_not_null(p1);
    cr_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(p1, "args"), "name")->valuestring, "beta"));
    cr_assert_not_null(find_meta(evs, "process_sort_index", 2, -1));
    cr_assert_not_null(find_meta(evs, "thread_sort_index", 2, 16));
    cJSON_Delete(root);
}

Test(db_export, pprun_export_errors_name_the_problem_and_exit_2) {
    const char *path = tfix_path("e.db"), *errf = tfix_path("err.txt");
    make_db(path);
    char args[1024];
    snprintf(args, sizeof args, "--db %s --job 42 --format chrome", path);
    cr_assert_eq(run(args, errf), 2);
    char *m = slurp(errf);
    cr_assert(strstr(m, "no job 42") && strstr(m, "e.db"), "%s", m);
    free(m);

    cr_assert_eq(run("--db /nonexistent/x.db --job 1", errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "/nonexistent/x.db"), "%s", m);
    free(m);

    snprintf(args, sizeof args, "--db %s --job 1 --format svg", path);
    cr_assert_eq(run(args, errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "--format") && strstr(m, "chrome"), "%s", m);
    free(m);

    snprintf(args, sizeof args, "--db %s --job one", path);
    cr_assert_eq(run(args, errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "--job"), "%s", m);
    free(m);

    cr_assert_eq(run("--job 1", errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "--db"), "%s", m);
    free(m);

    FILE *f = fopen(tfix_path("bad.db"), "w");
    fprintf(f, "%0200d\n", 7);
    fclose(f);
    snprintf(args, sizeof args, "--db %s --job 1", tfix_path("bad.db"));
    cr_assert_eq(run(args, errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "bad.db") && strstr(m, "not an SQLite database"), "%s", m);
    free(m);

    /* An unwritable --out leaves nothing behind and says so. */
    snprintf(args, sizeof args, "--db %s --job 1 --out /nonexistent/t.json", path);
    cr_assert_eq(run(args, errf), 2);
    m = slurp(errf);
    cr_assert(strstr(m, "/nonexistent/t.json"), "%s", m);
    free(m);
}

/* Output that cannot be written (a full disk) is a failure, exit 1 as for
 * pprun query, not bad usage; the message says so once. */
Test(db_export, a_failed_write_exits_1_saying_so) {
    if (access("/dev/full", W_OK) != 0) cr_skip_test("no /dev/full");
    const char *path = tfix_path("full.db"), *errf = tfix_path("full-err.txt");
    make_db(path);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s export --db %s --job 1 >/dev/full 2>%s", PPRUN_BIN, path, errf);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d", WEXITSTATUS(st));
    char *m = slurp(errf);
    cr_assert(strstr(m, "pprun export: writing standard output failed: No space left on device"), "%s", m);
    free(m);
}

/* Without --job, the newest job, as `pprun stats`; a file without jobs
 * exits 2 saying so. */
Test(db_export, without_job_the_newest_is_exported) {
    const char *path = tfix_path("newest.db"), *out = tfix_path("newest.json"), *errf = tfix_path("err.txt");
    make_db(path);
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t second = tfix_job(d);
    db_close(d);
    char args[1024];
    snprintf(args, sizeof args, "--db %s --out %s", path, out);
    cr_assert_eq(run(args, errf), 0);
    cJSON *root = read_json(out);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "otherData"), "job")->valueint, second);
    cJSON_Delete(root);

    const char *empty = tfix_path("empty.db");
    db_close(tfix_open_fresh(empty));
    snprintf(args, sizeof args, "--db %s", empty);
    cr_assert_eq(run(args, errf), 2);
    char *m = slurp(errf);
    cr_assert(strstr(m, "empty.db") && strstr(m, "no job in this database yet"), "%s", m);
    free(m);
}

Test(db_export, export_opens_the_database_read_only) {
    const char *path = tfix_path("ro.db"), *errf = tfix_path("err.txt");
    int64_t job = make_db(path);
    char args[1024];
    snprintf(args, sizeof args, "--db %s --job %lld", path, (long long)job);
    cr_assert_eq(run(args, errf), 0);
    /* Read-only access leaves the file as it was: still one job, no new rows. */
    sqlite3 *s;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
    sqlite3_stmt *st;
    sqlite3_prepare_v2(s, "SELECT (SELECT count(*) FROM jobs) || ' ' || (SELECT count(*) FROM events)", -1, &st, NULL);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "1 28");
    sqlite3_finalize(st);
    sqlite3_close(s);
}

/* A diverged loss (stored as NULL) is null in the export, which stays JSON. */
Test(db_export, a_loss_that_was_not_finite_is_null_and_the_export_parses) {
    const char *path = tfix_path("nan.db");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == TRACE_LOSS) ev[i].value = k++ ? INFINITY : NAN;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cJSON *root = exported(db_sqlite(d), job);
    db_close(d);
    int nulls = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        if (strcmp(cJSON_GetObjectItem(e, "name")->valuestring, "loss") != 0) continue;
        nulls += cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "loss"));
    }
    cr_assert_eq(nulls, 2);
    cJSON_Delete(root);
}

/* ---- GPU job: kernels on their own threads ------------------------------- */

typedef struct span { double ts, end; } span;

static int by_ts(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->ts < y->ts ? -1 : x->ts > y->ts ? 1 : x->end > y->end ? -1 : x->end < y->end ? 1 : 0;
}

/* The X events of one thread nest: each starts after the open one ends or
 * ends inside it (what Perfetto needs to draw a thread). */
static int nests(cJSON *evs, int pid, int tid) {
    span s[4096];
    int n = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") != 0) continue;
        if (cJSON_GetObjectItem(e, "pid")->valueint != pid || cJSON_GetObjectItem(e, "tid")->valueint != tid) continue;
        cr_assert_lt(n, 4096);
        double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
        s[n++] = (span){ts, ts + cJSON_GetObjectItem(e, "dur")->valuedouble};
    }
    qsort(s, (size_t)n, sizeof *s, by_ts);
    double open[64];
    int depth = 0;
    for (int i = 0; i < n; i++) {
        while (depth > 0 && open[depth - 1] <= s[i].ts + 1e-9) depth--;
        if (depth > 0 && s[i].end > open[depth - 1] + 1e-9) return 0;
        if (depth < 64) open[depth++] = s[i].end;
    }
    return 1;
}

Test(db_export, kernels_get_a_thread_per_rank_and_stream_with_their_op) {
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "export-gpu", 1, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(db, &err), 0, "%s", err.msg);
    char args[1024];
    const char *out = tfix_path("gpu-trace.json"), *errf = tfix_path("gpu-err.txt");
    snprintf(args, sizeof args, "--db %s --job %d --format chrome --out %s", db, FIXTURE_GPU_JOB, out);
    cr_assert_eq(run(args, errf), 0);
    cJSON *root = read_json(out);
    cJSON *evs = cJSON_GetObjectItem(root, "traceEvents");
    int kernels = 0, gpu_spans = 0, host = 0, first_fwd = 0, nccl_ops = 0, no_op = 0;
    int tids[64][2], ntids = 0; /* (pid, tid) of kernel threads */
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") != 0) continue;
        const char *cat = cJSON_GetObjectItem(e, "cat")->valuestring;
        int pid = cJSON_GetObjectItem(e, "pid")->valueint, tid = cJSON_GetObjectItem(e, "tid")->valueint;
        cJSON *a = cJSON_GetObjectItem(e, "args");
        if (strcmp(cat, "gpu") == 0) {
            gpu_spans++;
            cr_assert(tid >= 1000000 && tid < 2000000, "gpu spans keep their thread");
            continue;
        }
        if (strcmp(cat, "kernel") != 0) {
            host++;
            cr_assert_lt(tid, 1000000);
            continue;
        }
        kernels++;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        int stream = cJSON_GetObjectItem(a, "stream")->valueint;
        cr_assert(stream == 7 || stream == 13, "stream %d", stream);
        const cJSON *op = cJSON_GetObjectItem(a, "op");
        if (!strcmp(name, "adam_update_kernel")) {
            cr_assert(cJSON_IsNull(op), "launched outside any op");
            no_op++;
        } else {
            cr_assert(cJSON_IsString(op), "%s has its op", name);
        }
        if (!strcmp(name, "ncclDevKernel_SendRecv")) {
            cr_assert_eq(stream, 13);
            cr_assert(strstr(op->valuestring, " to r") || strstr(op->valuestring, " from r"), "%s", op->valuestring);
            nccl_ops++;
        }
        /* rank 1's first forward kernel: 1F0, on the job clock in us */
        if (!strcmp(name, "gemm_fwd_kernel") && !strcmp(op->valuestring, "1F0")) {
            cr_assert_float_eq(cJSON_GetObjectItem(e, "ts")->valuedouble, 6050.0, 1e-9);
            cr_assert_float_eq(cJSON_GetObjectItem(e, "dur")->valuedouble, 400.0, 1e-9);
            cr_assert_eq(cJSON_GetObjectItem(a, "step")->valueint, 0);
            first_fwd++;
        }
        cr_assert(tid >= 2000000, "kernels are on their own threads, not the host's or the gpu spans'");
        cJSON *tn = find_meta(evs, "thread_name", pid, tid);
        cr_assert_not_null(tn, "kernel thread %d is named", tid);
        char want[64];
        snprintf(want, sizeof want, "stream %d", stream);
        cr_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(tn, "args"), "name")->valuestring, want));
        int seen = 0;
        for (int i = 0; i < ntids; i++) seen |= tids[i][0] == pid && tids[i][1] == tid;
        if (!seen && ntids < 64) {
            tids[ntids][0] = pid;
            tids[ntids++][1] = tid;
        }
    }
    cr_assert_eq(kernels, FIXTURE_KERNELS_PER_STEP, "one X event per kernel");
    cr_assert_eq(gpu_spans, FIXTURE_GPU_SPANS_PER_STEP, "the gpu spans are still there");
    cr_assert_eq(host, FIXTURE_EVENTS_PER_STEP);
    cr_assert_eq(first_fwd, 1);
    cr_assert_eq(nccl_ops, 96);
    cr_assert_eq(no_op, 4);
    cr_assert_eq(ntids, 8, "two streams on each of 4 ranks, one thread each (kernels of a stream nest)");
    for (int i = 0; i < ntids; i++) cr_assert(nests(evs, tids[i][0], tids[i][1]), "thread %d nests", tids[i][1]);
    /* every thread of the trace nests, host and gpu ones too */
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "M") || strcmp(cJSON_GetObjectItem(e, "name")->valuestring, "thread_name")) continue;
        int pid = cJSON_GetObjectItem(e, "pid")->valueint, tid = cJSON_GetObjectItem(e, "tid")->valueint;
        cr_assert(nests(evs, pid, tid), "thread %d nests", tid);
    }
    /* a rank's stream threads sort after its gpu thread, before the next rank */
    cJSON *k0 = find_meta(evs, "thread_sort_index", 1, tids[0][1]);
    cJSON *g0 = find_meta(evs, "thread_sort_index", 1, 1000000), *r1 = find_meta(evs, "thread_sort_index", 1, 16);
    cr_assert(k0 && g0 && r1);
    int ks = cJSON_GetObjectItem(cJSON_GetObjectItem(k0, "args"), "sort_index")->valueint;
    cr_assert_gt(ks, cJSON_GetObjectItem(cJSON_GetObjectItem(g0, "args"), "sort_index")->valueint);
    cr_assert_lt(ks, cJSON_GetObjectItem(cJSON_GetObjectItem(r1, "args"), "sort_index")->valueint);
    cJSON_Delete(root);
    unlink(db);
}

static int is_cat(cJSON *e, const char *cat) {
    cJSON *c = cJSON_GetObjectItem(e, "cat");
    return cJSON_IsString(c) && strcmp(c->valuestring, cat) == 0;
}

/* A time of the export in ns as Perfetto reads it: the µs as a double,
 * times 1000, truncated. */
static int64_t perfetto_ns(cJSON *v) {
    return (int64_t)(v->valuedouble * 1000.0);
}

/* Every flow end binds to the op it belongs to, as Perfetto binds it: to
 * the innermost slice open on its thread at its time. A transfer starts
 * in a SEND and ends in a RECV; a critical path's flow starts in an op
 * on the path and ends in the op whose event id it carries. For that no
 * op of a compute or communication thread may overlap another there (a
 * batched p2p's identical SEND and RECV, dualpipev's F beside a B): such
 * a thread holds one op at a time. Returns the flow ends checked. */
static int flows_bind_to_their_ops(cJSON *evs, const char *what) {
    enum { MAX_OPS = 8192 };
    static struct op_at {
        int pid, tid;
        int64_t s, e;
        cJSON *x;
    } ops[MAX_OPS];
    int n = 0, checked = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") != 0 ||
            !(is_cat(e, "compute") || is_cat(e, "comm") || is_cat(e, "optimizer")))
            continue;
        cr_assert_lt(n, MAX_OPS);
        int64_t s = perfetto_ns(cJSON_GetObjectItem(e, "ts"));
        ops[n++] = (struct op_at){cJSON_GetObjectItem(e, "pid")->valueint, cJSON_GetObjectItem(e, "tid")->valueint, s,
                                  s + perfetto_ns(cJSON_GetObjectItem(e, "dur")), e};
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            cr_assert(ops[i].pid != ops[j].pid || ops[i].tid != ops[j].tid || ops[i].e <= ops[j].s ||
                          ops[j].e <= ops[i].s,
                      "%s: %s and %s overlap on thread %d", what, cJSON_GetObjectItem(ops[i].x, "name")->valuestring,
                      cJSON_GetObjectItem(ops[j].x, "name")->valuestring, ops[i].tid);
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        int path = is_cat(e, "critical_path");
        if ((strcmp(ph, "s") != 0 && strcmp(ph, "f") != 0) || !(path || is_cat(e, "flow"))) continue;
        int pid = cJSON_GetObjectItem(e, "pid")->valueint, tid = cJSON_GetObjectItem(e, "tid")->valueint;
        int64_t t = perfetto_ns(cJSON_GetObjectItem(e, "ts"));
        cJSON *x = NULL;
        for (int i = 0; i < n && !x; i++)
            if (ops[i].pid == pid && ops[i].tid == tid && ops[i].s <= t && t < ops[i].e) x = ops[i].x;
        cr_assert_not_null(x, "%s: a %s flow at %lld ns on thread %d binds to no op", what,
                           cJSON_GetObjectItem(e, "name")->valuestring, (long long)t, tid);
        cJSON *a = cJSON_GetObjectItem(x, "args");
        const char *phase = cJSON_GetObjectItem(a, "phase")->valuestring,
                   *op = cJSON_GetObjectItem(x, "name")->valuestring;
        if (strncmp(phase, "EVAL_", 5) == 0) phase += 5;
        if (!path)
            cr_assert(strncmp(phase, *ph == 's' ? "SEND_" : "RECV_", 5) == 0, "%s: a transfer's flow %s binds to %s",
                      what, *ph == 's' ? "start" : "end", op);
        else if (*ph == 's')
            cr_assert_not_null(cJSON_GetObjectItem(a, "critical_path"), "%s: a path's flow starts in %s, off the path",
                               what, op);
        else
            cr_assert_eq((long long)cJSON_GetObjectItem(a, "event_id")->valuedouble,
                         strtoll(cJSON_GetObjectItem(e, "id")->valuestring, NULL, 16),
                         "%s: a path's flow into event %s binds to %s", what, cJSON_GetObjectItem(e, "id")->valuestring,
                         op);
        checked++;
    }
    return checked;
}

/* One end of a transfer: the X event of a SEND or RECV span. */
typedef struct comm_span {
    int pid, tid, send, fwd, step, mb, stage, peer, eval; /* eval: an evaluation step's EVAL_SEND_F, EVAL_RECV_F */
    double ts, end;
} comm_span;

/* The comm span on (pid, tid) whose time holds ts, or NULL. */
static const comm_span *enclosing(const comm_span *c, int n, int pid, int tid, double ts) {
    for (int i = 0; i < n; i++)
        if (c[i].pid == pid && c[i].tid == tid && ts >= c[i].ts - 5e-4 && ts <= c[i].end + 5e-4) return &c[i];
    return NULL;
}

/* Every SEND span starts a flow that ends in the RECV span of the same
 * boundary tensor: the sender's peer is the receiver and back, same step
 * and microbatch, the receiving stage next to the sending one; an
 * evaluation step's sends too, on the comm thread, to its own receives.
 * Returns the export's events that say evaluation: EVAL_ comm spans and
 * "eval loss" counter points. */
static int check_flows(const char *sched, const char *extra) {
    char db[256], json[300], cmd[2048];
    fixture_tmp_path(db, sizeof db, "export-flows");
    snprintf(json, sizeof json, "%s.json", db);
    snprintf(cmd, sizeof cmd,
             "%s run --nproc-per-node 2 --schedule %s %s --microbatches 4 --steps 2 --model "
             "timed:f=1ms,b=1ms,w=1ms,act=4KiB --db %s --progress off >/dev/null 2>&1 && %s export --db %s --job 1 "
             "--format chrome --out %s",
             PPRUN_BIN, sched, extra, db, PPRUN_BIN, db, json);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cJSON *root = read_json(json);
    cJSON *evs = cJSON_GetObjectItem(root, "traceEvents"), *e;
    static comm_span c[512];
    int n = 0, sends = 0, recvs = 0, evals = 0;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") != 0 ||
            strcmp(cJSON_GetObjectItem(e, "cat")->valuestring, "comm") != 0)
            continue;
        cr_assert_lt(n, 512);
        cJSON *a = cJSON_GetObjectItem(e, "args");
        const char *phase = cJSON_GetObjectItem(a, "phase")->valuestring;
        int eval = strncmp(phase, "EVAL_", 5) == 0;
        if (eval) phase += 5;
        double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
        c[n] = (comm_span){cJSON_GetObjectItem(e, "pid")->valueint, cJSON_GetObjectItem(e, "tid")->valueint,
                           phase[0] == 'S', phase[5] == 'F', cJSON_GetObjectItem(a, "step")->valueint,
                           cJSON_GetObjectItem(a, "microbatch")->valueint, cJSON_GetObjectItem(a, "stage")->valueint,
                           cJSON_GetObjectItem(a, "peer")->valueint, eval, ts,
                           ts + cJSON_GetObjectItem(e, "dur")->valuedouble};
        evals += eval;
        sends += c[n].send;
        recvs += !c[n].send;
        n++;
    }
    cr_assert_gt(sends, 0, "%s has transfers", sched);
    cr_assert_eq(sends, recvs);
    cr_assert_geq(flows_bind_to_their_ops(evs, sched), 2 * sends, "%s: every transfer's flow checked", sched);
    int starts = 0, ends = 0;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        if (strcmp(ph, "s") != 0 || !is_cat(e, "flow")) continue;
        starts++;
        const char *id = cJSON_GetObjectItem(e, "id")->valuestring;
        const comm_span *s = enclosing(c, n, cJSON_GetObjectItem(e, "pid")->valueint,
                                       cJSON_GetObjectItem(e, "tid")->valueint, cJSON_GetObjectItem(e, "ts")->valuedouble);
        cr_assert(s && s->send, "%s: flow %s starts inside a SEND span", sched, id);
        const comm_span *r = NULL;
        int matches = 0;
        cJSON *f;
        cJSON_ArrayForEach(f, evs) {
            if (strcmp(cJSON_GetObjectItem(f, "ph")->valuestring, "f") != 0 || !is_cat(f, "flow") ||
                strcmp(cJSON_GetObjectItem(f, "id")->valuestring, id) != 0)
                continue;
            matches++;
            cr_assert_str_eq(cJSON_GetObjectItem(f, "bp")->valuestring, "e", "bound to the enclosing RECV span");
            cr_assert_str_eq(cJSON_GetObjectItem(f, "name")->valuestring, cJSON_GetObjectItem(e, "name")->valuestring);
            r = enclosing(c, n, cJSON_GetObjectItem(f, "pid")->valueint, cJSON_GetObjectItem(f, "tid")->valueint,
                          cJSON_GetObjectItem(f, "ts")->valuedouble);
        }
        cr_assert_eq(matches, 1, "%s: flow %s has one end", sched, id);
        cr_assert(r && !r->send, "%s: flow %s ends inside a RECV span", sched, id);
        double at_s = cJSON_GetObjectItem(e, "ts")->valuedouble, at_f = 0;
        cJSON_ArrayForEach(f, evs) if (strcmp(cJSON_GetObjectItem(f, "ph")->valuestring, "f") == 0 &&
                                       strcmp(cJSON_GetObjectItem(f, "id")->valuestring, id) == 0) at_f =
            cJSON_GetObjectItem(f, "ts")->valuedouble;
        /* Perfetto drops a flow whose end comes before its start: a receive
         * may end before the middle of its send (the send's span is the
         * sender's wait for its peer, the receive's the receiver's) */
        cr_assert_geq(at_f, at_s, "%s: flow %s ends at %.3f us, before it starts at %.3f us", sched, id, at_f, at_s);
        cr_assert(r->fwd == s->fwd && r->step == s->step && r->mb == s->mb && r->eval == s->eval, "%s: one tensor",
                  sched);
        cr_assert_eq(s->peer, r->tid / 16, "%s: the SEND's peer receives", sched);
        cr_assert_eq(r->peer, s->tid / 16, "%s: the RECV's peer sent", sched);
        cr_assert_eq(r->stage, s->stage + (s->fwd ? 1 : -1), "%s: the next stage receives", sched);
    }
    cJSON_ArrayForEach(e, evs) ends += strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "f") == 0 && is_cat(e, "flow");
    cr_assert_eq(starts, sends, "%s: a flow per transfer", sched);
    cr_assert_eq(ends, recvs);
    cJSON_ArrayForEach(e, evs) {
        cJSON *name = cJSON_GetObjectItem(e, "name");
        evals += strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "C") == 0 && cJSON_IsString(name) &&
                 strcmp(name->valuestring, "eval loss") == 0;
    }
    cJSON_Delete(root);
    unlink(json);
    fixture_tmp_path(db, sizeof db, "export-flows"); /* removes the database */
    return evals;
}

Test(db_export, each_transfer_is_a_flow_from_its_send_to_its_recv, .timeout = 120) {
    cr_assert_eq(check_flows("1f1b", ""), 0);
    check_flows("interleaved-1f1b", "--virtual-stages 2");
    check_flows("zb-v", "");
    check_flows("dualpipev", ""); /* an F runs beside a B: neither drawn inside the other */
    /* 2 evaluations of 2 microbatches: each a send and a receive, and a loss */
    cr_assert_eq(check_flows("1f1b", "--eval-every 1 --eval-microbatches 2"), 2 * 2 * 3,
                 "the evaluations' transfers on the comm thread and their losses as a counter");
}

/* A receive that ends before the middle of its send (the send's span
 * holds the sender's wait for its peer): the flow still runs forwards in
 * time, from the send's start to the receive's end. */
Test(db_export, a_flow_never_ends_before_it_starts) {
    const char *path = tfix_path("flow-order.db");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[2] = {
        {.version = TRACE_EVENT_VERSION,
         .phase = TRACE_SEND_F,
         .rank = 0,
         .stage = 0,
         .peer = 1,
         .bytes = 64,
         .start_ns = 1000000,
         .end_ns = 1100000},
        {.version = TRACE_EVENT_VERSION,
         .phase = TRACE_RECV_F,
         .rank = 1,
         .stage = 1,
         .peer = 0,
         .bytes = 64,
         .start_ns = 1010000,
         .end_ns = 1030000},
    };
    cr_assert_eq(db_insert_events(d, job, ev, 2, &err), 0, "%s", err.msg);
    db_close(d);
    sqlite3 *s;
    cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
    cJSON *root = exported(s, job), *e;
    sqlite3_close(s);
    double at[2] = {-1, -1}; /* s, f */
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        if (is_cat(e, "flow") && (!strcmp(ph, "s") || !strcmp(ph, "f")))
            at[ph[0] == 'f'] = cJSON_GetObjectItem(e, "ts")->valuedouble;
    }
    cr_assert(at[0] >= 0 && at[1] >= 0, "a flow from the send to the receive");
    cr_assert_geq(at[1], at[0], "the flow ends at %.3f us, before it starts at %.3f us", at[1], at[0]);
    cJSON_Delete(root);
}

/* A batched p2p's send and receive share their span (PyTorch's
 * pipelining waits for the batch as a whole): two identical spans on one
 * thread, one drawn inside the other, took the arrows of both. Each is
 * alone on a thread of the rank's, and each arrow leaves from its SEND
 * and arrives in its RECV. */
Test(db_export, a_batched_p2ps_identical_spans_each_keep_their_arrow) {
    const char *path = tfix_path("flow-batch.db");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    static const struct {
        int phase, rank, stage, peer;
    } ops[] = {{TRACE_SEND_F, 0, 0, 1}, {TRACE_RECV_B, 0, 0, 1}, {TRACE_RECV_F, 1, 1, 0}, {TRACE_SEND_B, 1, 1, 0}};
    trace_event ev[4];
    for (int i = 0; i < 4; i++)
        ev[i] = (trace_event){.version = TRACE_EVENT_VERSION,
                              .phase = (uint8_t)ops[i].phase,
                              .rank = ops[i].rank,
                              .stage = ops[i].stage,
                              .peer = ops[i].peer,
                              .bytes = 64,
                              .start_ns = 1000000,
                              .end_ns = 1100000};
    cr_assert_eq(db_insert_events(d, job, ev, 4, &err), 0, "%s", err.msg);
    db_close(d);
    sqlite3 *s;
    cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
    cJSON *root = exported(s, job);
    sqlite3_close(s);
    cr_assert_eq(flows_bind_to_their_ops(cJSON_GetObjectItem(root, "traceEvents"), "a batched p2p"), 4,
                 "both transfers' starts and ends");
    cJSON_Delete(root);
}

/* Held activation bytes: a counter per rank, on the rank's node, at each
 * F/B end; none for a trace that did not record them. */
Test(db_export, activations_held_are_a_counter_per_rank_at_each_op_end) {
    const char *path = tfix_path("act.db");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    /* after each op, in trace order: rank 0 0F0 0F1 0B0 0B1, rank 1 1F0 1B0 1F1 1B1 */
    static const int64_t held[2][4] = {{1000, 2000, 1500, 700}, {500, 200, 600, 100}};
    int k[2] = {0, 0};
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase <= TRACE_W) ev[i].bytes = (uint64_t)held[ev[i].rank][k[ev[i].rank]++];
    n += tfix_events(1, 2000000, ev + n); /* step 1: 0 after every op */
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    db_close(d);

    for (int recorded = 1; recorded >= 0; recorded--) {
        if (!recorded) {
            sqlite3 *s;
            cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
            cr_assert_eq(sqlite3_exec(s, "UPDATE events SET bytes = 0 WHERE phase IN ('F','B','W')", NULL, NULL, NULL),
                         SQLITE_OK);
            sqlite3_close(s);
        }
        sqlite3 *s;
        cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
        cJSON *root = exported(s, job);
        sqlite3_close(s);
        int count[2] = {0, 0}, seen0 = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
            const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
            if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "C") != 0 || strncmp(name, "activations held", 16))
                continue;
            int rank = name[strlen(name) - 1] - '0';
            cr_assert(strcmp(name, rank ? "activations held rank 1" : "activations held rank 0") == 0, "%s", name);
            cr_assert_eq(cJSON_GetObjectItem(e, "pid")->valueint, rank + 1, "rank %d's node, rank %d", rank, rank);
            double ts = cJSON_GetObjectItem(e, "ts")->valuedouble; /* us since t0 = 1 ms */
            int64_t bytes = (int64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "bytes")->valuedouble;
            if (ts < 1000) { /* step 0 ends by 100 us */
                cr_assert_eq(bytes, held[rank][count[rank]], "rank %d op %d", rank, count[rank]);
                if (rank == 0 && count[0] == 1) cr_assert_float_eq(ts, 20.0, 1e-9, "0F1 ends at 20 us");
                seen0++;
            } else {
                cr_assert_eq(bytes, 0);
            }
            count[rank]++;
        }
        if (recorded) {
            cr_assert_eq(count[0] + count[1], 16, "one per F/B of 2 steps: %d + %d", count[0], count[1]);
            cr_assert_eq(seen0, 8);
        } else {
            cr_assert_eq(count[0] + count[1], 0, "no counter for a trace without held bytes");
        }
        cJSON_Delete(root);
    }
}

/* The X event with args.event_id == id, or NULL. */
static cJSON *x_of(cJSON *evs, int64_t id) {
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "event_id");
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") == 0 && cJSON_IsNumber(v) &&
            (int64_t)v->valuedouble == id)
            return e;
    }
    return NULL;
}

/* The one flow event of phase ph ("s" or "f") and category critical_path
 * with the given id; it must lie inside x (same thread, within its time). */
static void assert_path_flow(cJSON *evs, const char *ph, int64_t to_id, cJSON *x) {
    char id[32];
    snprintf(id, sizeof id, "%llx", (unsigned long long)to_id);
    int found = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, ph) != 0 || !is_cat(e, "critical_path") ||
            strcmp(cJSON_GetObjectItem(e, "id")->valuestring, id) != 0)
            continue;
        found++;
        double ts = cJSON_GetObjectItem(e, "ts")->valuedouble, x0 = cJSON_GetObjectItem(x, "ts")->valuedouble;
        cr_assert_eq(cJSON_GetObjectItem(e, "pid")->valueint, cJSON_GetObjectItem(x, "pid")->valueint);
        cr_assert_eq(cJSON_GetObjectItem(e, "tid")->valueint, cJSON_GetObjectItem(x, "tid")->valueint);
        cr_assert(ts >= x0 && ts <= x0 + cJSON_GetObjectItem(x, "dur")->valuedouble, "flow %s %s inside its op", ph,
                  id);
        if (*ph == 'f') cr_assert_str_eq(cJSON_GetObjectItem(e, "bp")->valuestring, "e");
    }
    cr_assert_eq(found, 1, "one '%s' end of flow %s", ph, id);
}

/* Every complete step's critical path, as db/critpath.c finds it, is
 * marked in the export: its ops and no others carry args.critical_path
 * (how the path reached them) and the wait before them, and a
 * "critical path" flow runs from each op to the next on the path, so a
 * Perfetto user who selects one op sees the chain. */
Test(db_export, each_steps_critical_path_is_marked_and_chained_by_flows, .timeout = 60) {
    char path[256], json[300], cmd[1024];
    fixture_fresh(path, sizeof path, "export-critpath", 3, "succeeded");
    snprintf(json, sizeof json, "%s.json", path);
    snprintf(cmd, sizeof cmd, "%s export --db %s --job 1 --out %s", PPRUN_BIN, path, json);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cJSON *root = read_json(json);
    cJSON *evs = cJSON_GetObjectItem(root, "traceEvents"), *e;
    sqlite3 *db;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &db, &err), 0, "%s", err.msg);
    size_t on_path = 0;
    for (int step = 0; step < 3; step++) {
        critpath_path p;
        cr_assert_eq(critpath_step(db, 1, step, &p, &err), 0, "%s", err.msg);
        int handoffs = 0;
        for (size_t i = 0; i < p.n; i++) {
            const critpath_op *o = &p.ops[i];
            cJSON *x = x_of(evs, o->op.id), *a = cJSON_GetObjectItem(x, "args");
            cr_assert_not_null(x, "step %d: path op %lld is exported", step, (long long)o->op.id);
            cr_assert_str_eq(cJSON_GetObjectItem(a, "critical_path")->valuestring, critpath_via_names[o->via]);
            cr_assert_float_eq(cJSON_GetObjectItem(a, "critical_wait_us")->valuedouble, o->lead_ns / 1e3, 1e-9);
            if (i + 1 < p.n) {
                assert_path_flow(evs, "s", p.ops[i + 1].op.id, x);
                assert_path_flow(evs, "f", p.ops[i + 1].op.id, x_of(evs, p.ops[i + 1].op.id));
            }
            handoffs += o->via == CRITPATH_DATA;
        }
        if (step == 1) {
            cr_assert_eq(p.n, 31, "the fixture's step: 3 F down, 23 ops of rank 3, 3 B up, a W and an OPT");
            cr_assert_eq(handoffs, 6, "microbatch 0's F going down, microbatch 7's B going up");
        }
        on_path += p.n;
        critpath_free(&p);
    }
    size_t marked = 0, starts = 0, ends = 0;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        marked += *ph == 'X' && cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "critical_path") != NULL;
        starts += *ph == 's' && is_cat(e, "critical_path");
        ends += *ph == 'f' && is_cat(e, "critical_path");
    }
    cr_assert_eq(marked, on_path, "only the paths' ops are marked");
    flows_bind_to_their_ops(evs, "a 3-step job's critical paths");
    cr_assert_eq(starts, on_path - 3, "a flow between consecutive ops of each step's path");
    cr_assert_eq(ends, starts);
    sqlite3_close(db);
    cJSON_Delete(root);
    unlink(json);
    fixture_remove(path);
}

static int count_rows(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* `pprun export --db path OPTION 'value' --out json` exits 2 saying `says`
 * and leaves no file. */
static void export_refuses(const char *path, const char *option, const char *value, const char *says,
                           const char *json) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "--db %s %s '%s' --out %s", path, option, value, json);
    cr_assert_eq(run(cmd, tfix_path("err.txt")), 2, "%s %s", option, value);
    char *m = slurp(tfix_path("err.txt"));
    cr_assert(strstr(m, says), "%s %s: %s", option, value, m);
    free(m);
    cr_assert_neq(access(json, F_OK), 0, "%s %s left %s behind", option, value, json);
}

/* --steps 1-2 of a 3-step job: those steps' ops, losses, bubble ratios and
 * critical paths, nothing of step 0, every thread still named. */
Test(db_export, steps_exports_only_those_steps, .timeout = 60) {
    char path[256], json[300], cmd[1024];
    fixture_fresh(path, sizeof path, "export-steps", 3, "succeeded");
    snprintf(json, sizeof json, "%s.json", path);
    snprintf(cmd, sizeof cmd, "%s export --db %s --steps 1-2 --out %s", PPRUN_BIN, path, json);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cJSON *root = read_json(json), *e;
    cJSON *other = cJSON_GetObjectItem(root, "otherData"), *evs = cJSON_GetObjectItem(root, "traceEvents");
    cr_assert_eq(cJSON_GetObjectItem(other, "first_step")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(other, "last_step")->valueint, 2);
    sqlite3 *db;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &db, &err), 0, "%s", err.msg);
    int want_x = count_rows(db, "SELECT count(*) FROM events WHERE job_id=1 AND step BETWEEN 1 AND 2");
    int want_loss = count_rows(db, "SELECT count(*) FROM losses WHERE job_id=1 AND step BETWEEN 1 AND 2");
    int want_bubble = count_rows(db, "SELECT count(*) FROM step_stats WHERE job_id=1 AND step BETWEEN 1 AND 2");
    cr_assert_lt(want_x, count_rows(db, "SELECT count(*) FROM events WHERE job_id=1"), "step 0 has events");
    size_t on_path = 0;
    for (int step = 1; step <= 2; step++) {
        critpath_path p;
        cr_assert_eq(critpath_step(db, 1, step, &p, &err), 0, "%s", err.msg);
        on_path += p.n;
        critpath_free(&p);
    }
    int x = 0, loss = 0, bubble = 0, marked = 0;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring, *name = cJSON_GetObjectItem(e, "name")->valuestring;
        cJSON *a = cJSON_GetObjectItem(e, "args");
        if (*ph == 'X' && !is_cat(e, "kernel")) {
            x++;
            int step = cJSON_GetObjectItem(a, "step")->valueint;
            cr_assert(step >= 1 && step <= 2, "%s of step %d exported", name, step);
            marked += cJSON_GetObjectItem(a, "critical_path") != NULL;
            int pid = cJSON_GetObjectItem(e, "pid")->valueint, tid = cJSON_GetObjectItem(e, "tid")->valueint;
            cr_assert_not_null(find_meta(evs, "thread_name", pid, tid), "thread %d of process %d is named", tid, pid);
        }
        loss += *ph == 'C' && strcmp(name, "loss") == 0;
        bubble += *ph == 'C' && strncmp(name, "bubble ratio", 12) == 0;
    }
    cr_assert_eq(x, want_x);
    cr_assert_eq(loss, want_loss);
    cr_assert_eq(bubble, want_bubble);
    cr_assert_eq((size_t)marked, on_path, "the critical paths of steps 1 and 2");
    sqlite3_close(db);
    cJSON_Delete(root);
    unlink(json);

    /* One step; then steps the job does not have, and bad ranges: exit 2,
     * no file. */
    snprintf(cmd, sizeof cmd, "--db %s --steps 2 --out %s", path, json);
    cr_assert_eq(run(cmd, tfix_path("err.txt")), 0);
    root = read_json(json);
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        if (*cJSON_GetObjectItem(e, "ph")->valuestring == 'X')
            cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "step")->valueint, 2);
    }
    cJSON_Delete(root);
    unlink(json);
    static const struct {
        const char *steps, *says;
    } bad[] = {
        {"5-9", "job 1 has no traced step in 5-9: its steps are 0-2"},
        {"7", "job 1 has no traced step in 7: its steps are 0-2"},
        {"2-1", "--steps: '2-1': the last step comes before the first"},
        {"1-", "--steps: '1-' is not a step or a range of steps: give N or FIRST-LAST"},
        {"-1", "--steps: '-1' is not a step"},
        {"1-x", "--steps: '1-x' is not a step"},
        {"1-2-3", "--steps: '1-2-3' is not a step"},
        {"99999999999", "--steps: '99999999999' is not a step"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        export_refuses(path, "--steps", bad[i].steps, bad[i].says, json);
    fixture_remove(path);
}

/* --ranks 1-2 (with --steps 1): those ranks' ops, bubble ratios and
 * critical-path marks only, each flow into an op that is exported, every
 * loss; their threads alone named. Then ranks the job does not have and bad
 * lists: exit 2, no file. */
Test(db_export, ranks_exports_only_those_ranks, .timeout = 60) {
    char path[256], json[300], cmd[1024];
    fixture_fresh(path, sizeof path, "export-ranks", 3, "succeeded");
    snprintf(json, sizeof json, "%s.json", path);
    snprintf(cmd, sizeof cmd, "--db %s --steps 1 --ranks 1-2 --out %s", path, json);
    cr_assert_eq(run(cmd, tfix_path("err.txt")), 0, "%s", slurp(tfix_path("err.txt")));
    cJSON *root = read_json(json), *e;
    cJSON *other = cJSON_GetObjectItem(root, "otherData"), *evs = cJSON_GetObjectItem(root, "traceEvents");
    cr_assert_str_eq(cJSON_GetObjectItem(other, "ranks")->valuestring, "1-2");
    sqlite3 *db;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &db, &err), 0, "%s", err.msg);
    int want_x = count_rows(db, "SELECT count(*) FROM events WHERE job_id=1 AND step=1 AND rank IN (1,2)");
    int want_loss = count_rows(db, "SELECT count(*) FROM losses WHERE job_id=1 AND step=1");
    int want_bubble = count_rows(db, "SELECT count(*) FROM step_stats WHERE job_id=1 AND step=1 AND rank IN (1,2)");
    critpath_path p;
    cr_assert_eq(critpath_step(db, 1, 1, &p, &err), 0, "%s", err.msg);
    size_t on_path = 0;
    for (size_t i = 0; i < p.n; i++) on_path += p.ops[i].op.rank == 1 || p.ops[i].op.rank == 2;
    critpath_free(&p);
    cr_assert_gt(on_path, 0, "ranks 1 and 2 are on step 1's path");
    int x = 0, loss = 0, bubble = 0, marked = 0, flows_out = 0, flows_in = 0;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring, *name = cJSON_GetObjectItem(e, "name")->valuestring;
        cJSON *a = cJSON_GetObjectItem(e, "args");
        if (*ph == 'X') {
            cJSON *t = find_meta(evs, "thread_name", cJSON_GetObjectItem(e, "pid")->valueint,
                                 cJSON_GetObjectItem(e, "tid")->valueint);
            const char *thread = t ? cJSON_GetObjectItem(cJSON_GetObjectItem(t, "args"), "name")->valuestring : "?";
            cr_assert(strncmp(thread, "rank 1", 6) == 0 || strncmp(thread, "rank 2", 6) == 0, "%s on %s exported",
                      name, thread);
            x++;
            marked += cJSON_GetObjectItem(a, "critical_path") != NULL;
        }
        if (*ph == 'M' && strcmp(name, "thread_name") == 0) {
            const char *t = cJSON_GetObjectItem(a, "name")->valuestring;
            cr_assert(strncmp(t, "rank 1", 6) == 0 || strncmp(t, "rank 2", 6) == 0, "thread %s named", t);
        }
        if (is_cat(e, "critical_path")) flows_out += *ph == 's', flows_in += *ph == 'f';
        loss += *ph == 'C' && strcmp(name, "loss") == 0;
        bubble += *ph == 'C' && strncmp(name, "bubble ratio", 12) == 0;
    }
    cr_assert_eq(x, want_x);
    cr_assert_eq(loss, want_loss, "every loss, whichever rank computed it");
    cr_assert_eq(bubble, want_bubble);
    cr_assert_eq((size_t)marked, on_path, "the path's ops of ranks 1 and 2");
    cr_assert_eq(flows_out, flows_in, "no flow into an op that is not exported");
    sqlite3_close(db);
    cJSON_Delete(root);
    unlink(json);
    static const struct {
        const char *ranks, *says;
    } bad[] = {
        {"0-4", "--ranks '0-4': rank 4 is past the last, 3"},
        {"2147483647", "--ranks '2147483647': rank 2147483647 is past the last, 3"},
        {"2-1", "--ranks '2-1': in 2-1 the last rank comes before the first"},
        {"1,", "--ranks '1,' is not a list of ranks: give N or FIRST-LAST, separated by commas"},
        {"", "--ranks '' is not a list of ranks"},
        {"x", "--ranks 'x' is not a list of ranks"},
        {"+1", "--ranks '+1' is not a list of ranks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        export_refuses(path, "--ranks", bad[i].ranks, bad[i].says, json);

    /* every other rank of a 4,096-rank job (stage 0 of each pipeline, say):
     * 2,048 runs, past SQLite's 1,000 levels as a chain of ORs */
    sqlite3 *w;
    cr_assert_eq(sqlite3_open(path, &w), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(w, "UPDATE jobs SET world_size = 4096 WHERE id = 1", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(w);
    static char every_other[4096 * 3];
    for (int r = 0, at = 0; r < 4096; r += 2)
        at += snprintf(every_other + at, sizeof every_other - (size_t)at, "%s%d", r ? "," : "", r);
    cr_assert_eq(db_open_readonly("--db", path, &db, &err), 0, "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert_eq(db_export_chrome(db, 1, NULL, every_other, "--ranks", out, &err), 0, "%s", err.msg);
    fclose(out);
    sqlite3_close(db);
    root = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(root);
    int of_rank[4] = {0};
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        int tid = cJSON_GetObjectItem(e, "tid") ? cJSON_GetObjectItem(e, "tid")->valueint : -1;
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") == 0 && tid >= 0 && tid < 16 * 4)
            of_rank[tid / 16]++; /* a host thread: 16 x rank + lane */
    }
    cr_assert(of_rank[0] > 0 && of_rank[2] > 0 && of_rank[1] == 0 && of_rank[3] == 0,
              "ranks 0 and 2 of the 4 with events: %d %d %d %d", of_rank[0], of_rank[1], of_rank[2], of_rank[3]);
    cJSON_Delete(root);
    fixture_remove(path);
}

/* A GPU job's --steps 1: the kernels of step 1's ops and the optimizer's
 * (no op) of step 1, none of steps 0 and 2. */
Test(db_export, steps_keeps_the_kernels_of_those_steps) {
    char db[256];
    pp_err err;
    fixture_fresh(db, sizeof db, "export-gpu-steps", 3, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(db, &err), 0, "%s", err.msg);
    char args[1024];
    const char *out = tfix_path("gpu-steps.json"), *errf = tfix_path("gpu-steps-err.txt");
    snprintf(args, sizeof args, "--db %s --job %d --steps 1 --out %s", db, FIXTURE_GPU_JOB, out);
    cr_assert_eq(run(args, errf), 0);
    cJSON *root = read_json(out), *e;
    int kernels = 0, of_no_op = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        if (!is_cat(e, "kernel")) continue;
        kernels++;
        cJSON *a = cJSON_GetObjectItem(e, "args");
        if (cJSON_IsNull(cJSON_GetObjectItem(a, "op")))
            of_no_op++;
        else
            cr_assert_eq(cJSON_GetObjectItem(a, "step")->valueint, 1);
    }
    cr_assert_eq(kernels, FIXTURE_KERNELS_PER_STEP, "%d kernels", kernels);
    cr_assert_eq(of_no_op, 4, "one optimizer kernel per rank");
    cJSON_Delete(root);
    fixture_remove(db);
}

/* A PyTorch program's records (docs/torch.md): its full backward is named
 * as an op (0BW0, on the compute thread), its own spans by the names it
 * gave them, on a thread of their own under the rank ("rank R spans",
 * sorted after the rank's comm thread), nesting there, and they are no
 * point of the activations counter. */
Test(db_export, a_programs_bw_and_named_spans) {
    const char *path = tfix_path("program.db");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].phase == TRACE_B) ev[i].phase = TRACE_BW;
        if (ev[i].phase == TRACE_F || ev[i].phase == TRACE_BW) ev[i].bytes = 100;
    }
    trace_event base = {.rank = 1};
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "step \"data\"", ev + n);
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 2, "fetch", ev + n);
    /* rank 1: "step \"data\"" [1000us, 1050us) holding "fetch" [1010us, 1020us), over its ops */
    trace_event outer = {.version = TRACE_EVENT_VERSION, .phase = TRACE_SPAN, .rank = 1, .stage = -1,
                         .microbatch = -1, .peer = -1, .name = 1, .start_ns = 1000000, .end_ns = 1050000,
                         .bytes = 123};
    trace_event inner = outer;
    inner.name = 2, inner.start_ns = 1010000, inner.end_ns = 1020000;
    ev[n++] = outer;
    ev[n++] = inner;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    cJSON *root = exported(db_sqlite(d), job);
    db_close(d);
    cJSON *evs = cJSON_GetObjectItem(root, "traceEvents"), *e;
    int bw = 0, spans = 0, counters = 0, span_tid = -1;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring, *name = cJSON_GetObjectItem(e, "name")->valuestring;
        if (strcmp(ph, "C") == 0 && strncmp(name, "activations held rank 1", 23) == 0) counters++;
        if (strcmp(ph, "X") != 0) continue;
        cJSON *args = cJSON_GetObjectItem(e, "args");
        const char *phase = cJSON_GetObjectItem(args, "phase")->valuestring, *cat = cJSON_GetObjectItem(e, "cat")->valuestring;
        int tid = cJSON_GetObjectItem(e, "tid")->valueint;
        if (strcmp(phase, "BW") == 0) {
            bw++;
            cr_assert(strcmp(name, "0BW0") == 0 || strcmp(name, "0BW1") == 0 || strcmp(name, "1BW0") == 0 ||
                          strcmp(name, "1BW1") == 0, "%s", name);
            cr_assert_str_eq(cat, "compute");
            cr_assert_eq(tid, name[0] == '0' ? 0 : 16, "%s on its rank's compute thread", name);
        }
        if (strcmp(phase, "SPAN") == 0) {
            spans++;
            cr_assert_str_eq(cat, "span");
            cr_assert(strcmp(name, "step \"data\"") == 0 || strcmp(name, "fetch") == 0, "%s", name);
            cr_assert(span_tid < 0 || span_tid == tid, "both spans on one thread: they nest");
            span_tid = tid;
        }
    }
    cr_assert_eq(bw, 4);
    cr_assert_eq(spans, 2);
    cr_assert_eq(counters, 4, "rank 1's F and BW only: its spans are not ops");
    cJSON *tn = find_meta(evs, "thread_name", 2, span_tid);
    cr_assert_not_null(tn, "the spans' thread is named");
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(tn, "args"), "name")->valuestring, "rank 1 spans");
    int sort_spans =
        cJSON_GetObjectItem(cJSON_GetObjectItem(find_meta(evs, "thread_sort_index", 2, span_tid), "args"), "sort_index")
            ->valueint;
    cJSON *comm = find_meta(evs, "thread_sort_index", 2, 24), *rank2 = find_meta(evs, "thread_sort_index", 2, 32);
    cr_assert_not_null(comm, "rank 1's comm thread");
    cr_assert_gt(sort_spans, cJSON_GetObjectItem(cJSON_GetObjectItem(comm, "args"), "sort_index")->valueint);
    cr_assert(!rank2, "no rank 2");
    cJSON_Delete(root);
}

/* A span name of bytes that are not UTF-8 (a program's, stored as given)
 * and a forged jobs.name: `pprun export` writes them as the /api routes
 * do (base/json.h), each bad byte U+FFFD, a C1 control (U+009B, CSI to
 * a terminal reading 8-bit controls) as \u009b, and python3's json reads
 * the file (it stopped at byte 0xff). */
Test(db_export, names_that_are_not_utf8_export_as_valid_json) {
    const char *path = tfix_path("badutf8.db"), *json = tfix_path("badutf8.json"), *py = tfix_path("badutf8.py");
    db *d = tfix_open_fresh(path);
    pp_err err;
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    trace_event base = {.rank = 1};
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "\xff\xfe\"\\x", ev + n);
    ev[n++] = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_SPAN, .rank = 1, .stage = -1,
                            .microbatch = -1, .peer = -1, .name = 1, .start_ns = 1000000, .end_ns = 1050000};
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    cr_assert_eq(sqlite3_exec(db_sqlite(d), "UPDATE jobs SET name = CAST(X'ff22c0c29b' AS TEXT)", NULL, NULL, NULL),
                 SQLITE_OK);
    db_close(d);
    FILE *f = fopen(py, "w");
    cr_assert_not_null(f);
    fputs("import json, sys\n"
          "d = json.load(open(sys.argv[1], encoding='utf-8'))\n"
          "spans = [e['name'] for e in d['traceEvents'] if e.get('cat') == 'span']\n"
          "assert spans == ['\\ufffd\\ufffd\"\\\\x'], spans\n"
          "assert d['otherData']['name'] == '\\ufffd\"\\ufffd\\x9b', d['otherData']\n"
          "assert b'\\xc2\\x9b' not in open(sys.argv[1], 'rb').read(), 'a raw C1 CSI'\n",
          f);
    fclose(f);
    char args[1024], cmd[2048];
    snprintf(args, sizeof args, "--db %s --job %lld --out %s", path, (long long)job, json);
    cr_assert_eq(run(args, tfix_path("badutf8.err")), 0);
    snprintf(cmd, sizeof cmd, "python3 %s %s", py, json);
    cr_assert_eq(system(cmd), 0, "python3's json reads the export, bad bytes as U+FFFD");
}
