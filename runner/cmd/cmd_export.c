/* cmd_export.c: `pprun export --db FILE [--job ID] [--steps A-B] [--ranks LIST] [--format chrome] [--out FILE]`:
 * a job's trace as Chrome trace JSON (opens in Perfetto, chrome://tracing).
 * The database is opened read-only; the trace appears only when complete,
 * on stdout as in a --out file, and with --out only where nothing but a
 * regular file was (file_output). */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "db/db.h"
#include "db/export.h"
#include "runner/cmd/cli.h"

static void export_usage(FILE *out) {
    fprintf(out, "usage: pprun export --db FILE [--job ID] [--steps A-B] [--ranks LIST] [--format chrome] [--out FILE]\n"
                 "  --db FILE      trace database written by `pprun run`\n"
                 "  --job ID       job id (default: the newest; `pprun query --db FILE\n"
                 "                 \"SELECT id, name FROM jobs\"` lists them)\n"
                 "  --steps A-B    only steps A to B (or one step, N): a long job's whole trace\n"
                 "                 is more than Perfetto's UI can open\n"
                 "  --ranks LIST   only these ranks' ops, kernels and bubble ratios: N or FIRST-LAST,\n"
                 "                 separated by commas (e.g. 0-7,512); the losses stay whole\n"
                 "  --format NAME  chrome (the default): Chrome trace JSON for Perfetto / chrome://tracing\n"
                 "  --out FILE     write there instead of stdout ('-' is stdout); FILE must be a\n"
                 "                 regular file or not there yet\n");
}

int cmd_export(int argc, char **argv) {
    const char *dbpath = NULL, *job_s = NULL, *steps_s = NULL, *ranks = NULL, *format = NULL, *outpath = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            export_usage(stdout);
            return 0;
        }
        const char **slot = strcmp(a, "--db") == 0       ? &dbpath
                            : strcmp(a, "--job") == 0    ? &job_s
                            : strcmp(a, "--steps") == 0  ? &steps_s
                            : strcmp(a, "--ranks") == 0  ? &ranks
                            : strcmp(a, "--format") == 0 ? &format
                            : strcmp(a, "--out") == 0    ? &outpath
                                                         : NULL;
        if (!slot) {
            if (a[0] == '-') fprintf(stderr, "pprun export: unknown option '%s'; see pprun export --help\n", a);
            else fprintf(stderr, "pprun export: unexpected argument '%s' (pprun export takes options only)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "pprun export: %s needs a value\n", a);
            return 2;
        }
        *slot = argv[++i];
    }
    if (!dbpath) {
        fprintf(stderr, "pprun export: --db is required\n");
        export_usage(stderr);
        return 2;
    }
    if (!format) format = "chrome";
    if (strcmp(format, "chrome") != 0) {
        fprintf(stderr, "pprun export: --format '%s': expected one of chrome\n", format);
        return 2;
    }
    pp_err err;
    /* --out over --db (or the files SQLite keeps beside it) would replace
     * the database, every job in it, by one job's JSON */
    for (size_t i = 0; outpath && i < DB_FILES; i++) {
        char file[PATH_MAX + 16]; /* db_file_path resolves links */
        db_file_path(dbpath, i, file, sizeof file);
        if (file_output_not_input(outpath, "--out", file, "--db", 0, &err) != 0) {
            /* named as the user gave it: --db main.db, whose WAL file main.db-wal is */
            if (i)
                pp_fail(&err, "--out %s: is the %s of --db %s, which this command reads: writing it would damage the "
                              "database; name another file (nothing was changed)", outpath, db_file_roles[i], dbpath);
            fprintf(stderr, "pprun export: %s\n", err.msg);
            return 2;
        }
    }
    long job = 0;
    if (job_s && pp_parse_long(job_s, 1, 0x7fffffffL, "--job", &job, &err) != 0) {
        fprintf(stderr, "pprun export: %s\n", err.msg);
        return 2;
    }
    db_export_steps steps;
    if (steps_s && db_export_parse_steps(steps_s, &steps, &err) != 0) {
        fprintf(stderr, "pprun export: --steps: %s\n", err.msg);
        return 2;
    }
    /* its form now; the ranks the job has once it is read */
    if (ranks && pp_parse_ranks(ranks, 0, "--ranks", NULL, &err) != 0) {
        fprintf(stderr, "pprun export: %s\n", err.msg);
        return 2;
    }
    sqlite3 *sql;
    if (db_open_readonly("--db", dbpath, &sql, &err) != 0) {
        fprintf(stderr, "pprun export: %s\n", err.msg);
        return 2;
    }
    if (!job_s) {
        int64_t newest = db_newest_job(sql, &err);
        if (newest <= 0) {
            fprintf(stderr, "pprun export: %s: %s\n", dbpath, newest < 0 ? err.msg : "no job in this database yet");
            db_reader_close(sql);
            return 2;
        }
        job = (long)newest;
    }
    file_output out;
    if (file_output_begin(&out, outpath ? outpath : "-", "--out", FILE_OUTPUT_DASH, &err) != 0) {
        fprintf(stderr, "pprun export: %s\n", err.msg);
        db_reader_close(sql);
        return 2;
    }
    /* Standard output too gets the trace only once it is whole
     * (file_output), so a refusal at a bad row prints nothing. */
    int rc = db_export_chrome(sql, job, steps_s ? &steps : NULL, ranks, "--ranks", out.f, &err);
    db_reader_close(sql);
    /* A job or steps that are not there are bad input (2); output that
     * could not be written is a failure (1), as for pprun query. Errors
     * writing stdout itself are main's, as for every command's output. */
    int status = rc != 0 && ferror(out.f) ? 1 : 2;
    /* Standard output's trace is held on $TMPDIR's disk, which may be a
     * small tmpfs where stdout's (a pipe, another disk) had room. */
    if (status == 1 && out.to_stdout)
        pp_fail(&err, "writing the trace failed: standard output is held whole in a temporary file under %s "
                      "($TMPDIR) before it is written, and writing there failed (a full disk, a quota or file-size "
                      "limit?); set TMPDIR to a folder with room, or give --out FILE", out.tmp);
    if (rc != 0) file_output_abort(&out);
    else if (file_output_commit(&out, &err) != 0) rc = -1, status = 1;
    if (rc == 0) return 0;
    fprintf(stderr, "pprun export: %s\n", err.msg);
    return status;
}
