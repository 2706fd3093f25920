/* cmd_stats.c: `pprun stats --db FILE [--job ID] [--vs OTHER] [--format
 * text|json]`: where a
 * job's time went, in a terminal (like `nsys stats`): step time, measured
 * and planned bubble, idle time by cause, op durations, loss; then every
 * schedule simulated at the job's measured costs. The same numbers as GET
 * /api/jobs/{id}/summary and /whatif, read by the same code (db/summary.h,
 * db/whatif.h). With --vs, the job beside another one instead
 * (db/compare.h): did the schedule change help, and was the what-if right.
 * --format json prints the API's bodies instead, written by the code the
 * routes call (report/json.h), for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/term.h"
#include "db/db.h"
#include "report/json.h"
#include "report/text.h"
#include "runner/cmd/cli.h"

static void usage(FILE *out) {
    fprintf(out, "usage: pprun stats --db FILE [--job ID] [--vs OTHER] [--format text|json]\n"
                 "  Where a job's time went: step time, measured and planned bubble, idle time\n"
                 "  by cause, op durations, loss; then each schedule simulated at the job's\n"
                 "  measured op costs (what if). Steps after the job's first (step 0, or a resumed\n"
                 "  job's first, pays for start-up).\n"
                 "  --db FILE    trace database written by `pprun run`\n"
                 "  --job ID     job id (default: the newest job in the file)\n"
                 "  --vs OTHER   instead, the job beside job OTHER of the same file: what differs\n"
                 "               in their configurations, their numbers side by side with the\n"
                 "               change from OTHER to the job (x: ratio, pp: percentage points),\n"
                 "               OTHER's what-if for the job's schedule against what the job\n"
                 "               measured, and whether their losses are bitwise equal\n"
                 "  --format F   text (default), or json: the API's bodies (docs/api.md), one object\n"
                 "               {job, summary, whatif, critpath}, or /compare's with --vs\n");
}

/* Prints w's bytes and a newline on stdout (what --format json prints);
 * 0, or 2 with the reason on stderr when w ran out of memory. */
static int print_json(jw *w) {
    size_t len;
    char *json = jw_take(w, &len);
    if (!json) {
        fprintf(stderr, "pprun stats: out of memory\n");
        return 2;
    }
    fwrite(json, 1, len, stdout);
    fputc('\n', stdout);
    free(json);
    return 0;
}

/* Job `job` beside job `vs` (both in db), as text on `text` or (json) as
 * the body of GET /api/jobs/{job}/compare?vs={vs} on stdout; 0, or 2 with
 * the reason on stderr and nothing on stdout. */
static int compare(sqlite3 *db, const char *dbpath, long job, long vs, int json, FILE *text) {
    job_summary s, o;
    whatif_report w[2];
    job_compare c = {0}; /* compare_free needs it zeroed when compare_read is not reached */
    pp_err err;
    int rc = 2, read_s = summary_read(db, job, SUMMARY_OPS, &s, &err) == 0;
    if (!read_s) fprintf(stderr, "pprun stats: %s: %s\n", dbpath, err.msg);
    else if (summary_read(db, vs, SUMMARY_OPS, &o, &err) != 0)
        fprintf(stderr, "pprun stats: --vs %ld: %s\n", vs, err.msg);
    else if (whatif_read(db, &s, &w[0], &err) != 0 || whatif_read(db, &o, &w[1], &err) != 0 ||
             compare_read(db, &s, &w[0], &o, &w[1], &c, &err) != 0)
        fprintf(stderr, "pprun stats: %s: %s\n", dbpath, err.msg);
    else if (!json) {
        report_compare(text, db, &s, &w[0], &o, &w[1], &c);
        rc = 0;
    } else {
        jw out;
        jw_init(&out);
        if (report_compare_json(&out, db, &s, &w[0], &o, &w[1], &c, &err) != 0)
            fprintf(stderr, "pprun stats: %s: %s\n", dbpath, err.msg);
        else rc = print_json(&out);
        jw_free(&out); /* empty once printed; what an error left */
    }
    compare_free(&c);
    if (read_s) summary_free(&o);
    summary_free(&s);
    return rc;
}

/* Job `job`'s summary, critical path, stage balance and what-if, as text
 * on `text` or (json) as {"job", "summary", "whatif", "critpath"} on
 * stdout; 0, or 2 with the reason on stderr (the text may have begun:
 * the caller prints it only on success). */
static int stats(sqlite3 *db, const char *dbpath, long job, int json, FILE *text) {
    job_summary s;
    critpath_report cp = {0};
    pp_err err;
    int rc = 2;
    if (summary_read(db, job, SUMMARY_OPS, &s, &err) != 0) {
        fprintf(stderr, "pprun stats: %s: %s\n", dbpath, err.msg);
    } else {
        if (!json) report_full(text, db, &s);
        whatif_report w;
        if (critpath_read(db, s.job_id, s.world, &cp, &err) != 0) {
            fprintf(stderr, "pprun stats: %s: critical path: %s\n", dbpath, err.msg);
        } else if (whatif_read(db, &s, &w, &err) != 0) {
            fprintf(stderr, "pprun stats: %s: what-if: %s\n", dbpath, err.msg);
        } else if (!json) {
            report_critpath(text, &cp);
            report_balance(text, &w);
            report_whatif(text, &w);
            rc = 0;
        } else {
            jw out;
            jw_init(&out);
            report_stats_json(&out, &s, &w, &cp);
            rc = print_json(&out);
        }
    }
    critpath_report_free(&cp);
    summary_free(&s);
    return rc;
}

int cmd_stats(int argc, char **argv) {
    const char *dbpath = NULL, *job_s = NULL, *vs_s = NULL, *format = "text";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        const char **slot = strcmp(a, "--db") == 0    ? &dbpath
                            : strcmp(a, "--job") == 0 ? &job_s
                            : strcmp(a, "--vs") == 0  ? &vs_s
                            : strcmp(a, "--format") == 0 ? &format
                                                      : NULL;
        if (!slot) {
            if (a[0] == '-') fprintf(stderr, "pprun stats: unknown option '%s'; see pprun stats --help\n", a);
            else fprintf(stderr, "pprun stats: unexpected argument '%s' (pprun stats takes options only)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "pprun stats: %s needs a value\n", a);
            return 2;
        }
        *slot = argv[++i];
    }
    if (!dbpath) {
        fprintf(stderr, "pprun stats: --db is required\n");
        usage(stderr);
        return 2;
    }
    if (strcmp(format, "text") != 0 && strcmp(format, "json") != 0) {
        fprintf(stderr, "pprun stats: --format '%s': expected one of text, json\n", format);
        return 2;
    }
    int json = strcmp(format, "json") == 0;
    pp_err err;
    long job = 0, vs = 0;
    if ((job_s && pp_parse_long(job_s, 1, 0x7fffffffL, "--job", &job, &err) != 0) ||
        (vs_s && pp_parse_long(vs_s, 1, 0x7fffffffL, "--vs", &vs, &err) != 0)) {
        fprintf(stderr, "pprun stats: %s\n", err.msg);
        return 2;
    }
    if (job_s && vs == job) {
        fprintf(stderr, "pprun stats: --vs %ld is --job %ld itself: nothing to compare\n", vs, job);
        return 2;
    }
    sqlite3 *db;
    if (db_open_readonly("--db", dbpath, &db, &err) != 0) {
        fprintf(stderr, "pprun stats: %s\n", err.msg);
        return 2;
    }
    int rc = 2;
    if (!job_s) {
        int64_t newest = db_newest_job(db, &err);
        if (newest <= 0) {
            fprintf(stderr, "pprun stats: %s: %s\n", dbpath, newest < 0 ? err.msg : "no job in this database yet");
            goto out;
        }
        job = (long)newest;
        if (vs == job) {
            fprintf(stderr, "pprun stats: --vs %ld is the job itself (without --job, the newest: job %ld): "
                            "nothing to compare\n", vs, job);
            goto out;
        }
    }
    /* The text holds names from the database (the job's, its model's, its
     * hosts', a failure's words): it is written whole, then escaped onto
     * stdout so that none of them can drive the terminal. */
    char *text = NULL;
    size_t len = 0;
    FILE *tf = json ? NULL : open_memstream(&text, &len);
    if (!json && !tf) {
        fprintf(stderr, "pprun stats: out of memory\n");
        goto out;
    }
    rc = vs ? compare(db, dbpath, job, vs, json, tf) : stats(db, dbpath, job, json, tf);
    if (tf) {
        fclose(tf);
        if (rc == 0) term_write(stdout, text, len, TERM_LINES); /* a refusal prints none of the report */
        free(text);
    }
out:
    db_reader_close(db);
    return rc;
}
