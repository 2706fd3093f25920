/* test_attack_files.c: the standing attack battery for what a user names
 * on the command line and what pprun prints: real pprun processes
 * (./build/pprun) on real files in a folder of their own.
 *
 * - Outputs: every file pprun writes at a path the user gives (--out,
 *   --csv-out, --metrics, --db and SQLite's files beside it, the files of
 *   --save-weights and --checkpoint-dir, the logs of --log-dir) with a
 *   device node, a FIFO, a directory, a symbolic link (to a file, and
 *   dangling) planted there, in a missing folder and in a read-only one:
 *   each is refused, names the flag, the path and what is there, and
 *   leaves everything as it was (the target's type, inode and content,
 *   the file a link points to, no temporary file). And a symbolic link
 *   planted at every temporary name a writer might use: the write succeeds
 *   and none of them is followed.
 * - Inputs: every file pprun reads at a path the user gives (--data, a
 *   schedule CSV, --rdzv-token-file, the databases of stats, query,
 *   export, serve and --schedule-costs, a checkpoint) as a device, a FIFO,
 *   a directory, a /proc pseudo-file, a file over its cap, a missing file:
 *   each is refused at once (no hang, no memory), naming the problem.
 * - Standard output on a full device, for every command: exit 1 naming the
 *   error.
 * - Control bytes (ESC sequences, an OSC title, a C1 byte) in CSV cells,
 *   file names, --model, options and names in a database: what reaches the
 *   terminal shows them as escapes, never raw.
 *
 * Device nodes are made here with mknod (root only: those tests skip
 * otherwise), never the system's: a pprun that replaced its target would
 * replace only this folder's node. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"

/* A job that takes a fraction of a second: no model to train. */
#define TIMED "--model timed:f=1ms,b=1ms,w=1ms --steps 1 --nproc-per-node 2 --progress off"

static char dir[256];     /* this test's folder; the commands run in it */
static char out[1 << 16]; /* the last command's stderr (and stdout, unless sent elsewhere) */
static size_t out_len;

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/pprun-attack-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", dir, dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

TestSuite(attack, .init = setup, .fini = teardown, .timeout = 600);

/* dir/NAME in one of a few buffers that take turns. */
static const char *at(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    int n = snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    cr_assert(n > 0 && (size_t)n < sizeof bufs[0], "a path too long: %s", name);
    return b;
}

static void make_folder(const char *name) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", at(name));
    cr_assert_eq(system(cmd), 0);
}

/* `pprun ARGS` in dir through the shell (ARGS is a command line), at most
 * 20 s (exit 124 when it hung), its stdout to stdout_to (a path in dir,
 * or NULL: into `out` with its stderr), run by `wrap` (a command prefix,
 * or ""). Returns the exit status. */
static int run_in(const char *wrap, const char *stdout_to, const char *args) {
    char cap[300], cmd[8192];
    snprintf(cap, sizeof cap, "%s.out", dir); /* beside the folder: its listing is checked */
    if (stdout_to)
        snprintf(cmd, sizeof cmd, "cd '%s' && %s timeout -k 5 20 '%s' %s >'%s' 2>'%s' </dev/null", dir, wrap, PPRUN_BIN,
                 args, stdout_to, cap);
    else
        snprintf(cmd, sizeof cmd, "cd '%s' && %s timeout -k 5 20 '%s' %s >'%s' 2>&1 </dev/null", dir, wrap, PPRUN_BIN,
                 args, cap);
    int st = system(cmd);
    FILE *f = fopen(cap, "rb");
    out_len = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[out_len] = '\0';
    if (f) fclose(f);
    unlink(cap);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int pprun(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int pprun(const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return run_in("", NULL, args);
}

/* A trace database with job 1 in it, as dir/t.db, read once. */
static void make_db(void) {
    int rc = pprun("run " TIMED " --db t.db");
    cr_assert_eq(rc, 0, "%s", out);
    rc = pprun("query --db t.db 'SELECT 1'");
    cr_assert_eq(rc, 0, "%s", out);
}

/* ---- what a path is, and whether it changed ------------------------------ */

typedef struct snap {
    int exists;
    unsigned mode;
    unsigned long long ino, rdev, size, hash; /* hash: a regular file's bytes */
    char link[512];                           /* a symbolic link's target */
} snap;

static snap take(const char *path) {
    snap s;
    memset(&s, 0, sizeof s);
    struct stat st;
    if (lstat(path, &st) != 0) return s;
    s.exists = 1;
    s.mode = st.st_mode;
    s.ino = st.st_ino, s.rdev = st.st_rdev, s.size = (unsigned long long)st.st_size;
    if (S_ISLNK(st.st_mode) && readlink(path, s.link, sizeof s.link - 1) < 0) s.link[0] = '\0';
    if (S_ISREG(st.st_mode)) {
        int fd = open(path, O_RDONLY | O_NOFOLLOW);
        unsigned char b[4096];
        ssize_t n;
        s.hash = 1469598103934665603ull;
        while (fd >= 0 && (n = read(fd, b, sizeof b)) > 0)
            for (ssize_t i = 0; i < n; i++)
                s.hash = (s.hash ^ b[i]) * 1099511628211ull;
        if (fd >= 0) close(fd);
    }
    return s;
}

static void assert_same(const snap *a, const snap *b, const char *what) {
    cr_assert_eq(a->exists, b->exists, "%s: %s", what, a->exists ? "was removed" : "was created");
    cr_assert_eq(a->mode, b->mode, "%s: mode %o became %o", what, a->mode, b->mode);
    cr_assert_eq(a->ino, b->ino, "%s: replaced (inode %llu became %llu)", what, a->ino, b->ino);
    cr_assert_eq(a->rdev, b->rdev, "%s: device changed", what);
    cr_assert_eq(a->size, b->size, "%s: size %llu became %llu", what, a->size, b->size);
    cr_assert_eq(a->hash, b->hash, "%s: content changed", what);
    cr_assert_str_eq(a->link, b->link, "%s: link changed", what);
}

/* What shell command `cmd` prints, its first 128 KiB (malloc'd). */
static char *output_of(const char *cmd) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *text = calloc(1, 1 << 17);
    size_t n = fread(text, 1, (1 << 17) - 1, p);
    text[n] = '\0';
    pclose(p);
    return text;
}

/* Every path under dir, one a line, sorted (malloc'd). */
static char *listing(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -mindepth 1 | LC_ALL=C sort", dir);
    return output_of(cmd);
}

/* ---- what is planted at a path -------------------------------------------- */

enum plant { DEVICE, FIFO, DIRECTORY, LINK, DANGLING_LINK, NPLANTS };
static const char *const plant_name[] = {"a device node", "a FIFO", "a directory", "a link to a file",
                                         "a dangling link"};
/* What the refusal says it is. */
static const char *const plant_words[] = {"is a character device", "is a FIFO", "is a directory", "is a symbolic link",
                                          "is a symbolic link"};

static int is_root(void) {
    return geteuid() == 0;
}

/* Makes the folders above path (in dir), then plants `what` at path: a
 * device node is the null device's numbers (1, 3), made here; a link to a
 * file points at dir/precious.txt. */
static void plant(const char *path, enum plant what) {
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    cr_assert_eq(system(cmd), 0);
    int rc = what == DEVICE      ? mknod(path, S_IFCHR | 0666, makedev(1, 3))
             : what == FIFO      ? mkfifo(path, 0666)
             : what == DIRECTORY ? mkdir(path, 0755)
             : what == LINK      ? symlink(at("precious.txt"), path)
                                 : symlink(at("nothing-here"), path);
    cr_assert_eq(rc, 0, "planting %s at %s: %s", plant_name[what], path, strerror(errno));
}

/* Removes everything in dir but the database t.db; writes precious.txt. */
static void wipe(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "chmod -R u+rwx '%s'; find '%s' -mindepth 1 -maxdepth 1 ! -name 't.db*' -exec rm -rf {} +", dir, dir);
    cr_assert_eq(system(cmd), 0);
    tfix_write(at("precious.txt"), "precious\n");
}

/* ---- outputs ---------------------------------------------------------------- */

/* A file pprun writes at a path the user gives. */
typedef struct output {
    const char *flag;     /* the flag, which its refusal names */
    const char *args;     /* pprun's arguments, %s the path given to the flag */
    const char *attacked; /* the file written, %s that path (its own, one inside it, one beside it) */
    int refused;          /* the exit status of a refusal: 2 when checked before anything starts */
    int makes_folders;    /* the folders on the way are made (--log-dir): a missing one is no attack */
    int unwritable;       /* the exit status in a read-only folder (0: refused's) */
} output;

static const output outputs[] = {
    {"--out", "export --db t.db --job 1 --out %s", "%s", 2, 0, 0},
    {"--csv-out", "schedule --schedule 1f1b --stages 2 --microbatches 2 --csv-out %s", "%s", 2, 0, 0},
    {"--metrics", "run " TIMED " --trace off --metrics %s", "%s", 2, 0, 0},
    {"--db", "run " TIMED " --db %s", "%s", 2, 0, 0},
    {"--db", "run " TIMED " --db %s", "%s-wal", 2, 0, 0},
    {"--db", "run " TIMED " --db %s", "%s-shm", 2, 0, 0},
    {"--db", "run " TIMED " --db %s", "%s-journal", 2, 0, 0},
    {"--save-weights", "run " TIMED " --trace off --save-weights %s", "%s/stage_1.f32", 2, 0, 0},
    {"--checkpoint-dir", "run " TIMED " --trace off --checkpoint-dir %s", "%s/latest", 2, 0, 0},
    /* a step folder there already (a run's before): its stage files too, before the job starts (one
     * planted while it runs fails the job, naming it: file_output_begin in the rank) */
    {"--checkpoint-dir", "run " TIMED " --trace off --checkpoint-dir %s", "%s/step_0/stage_1.ckpt", 2, 0, 0},
    /* the folder and the first attempt's log files are checked before the
     * job starts (launch_check_start: exit 2, nothing written); their
     * folders are made, and a later attempt's files opened, as it starts
     * its ranks */
    {"--log-dir", "launch --nproc-per-node 1 --run-id r1 --log-dir %s -- true", "%s/r1/attempt_0/0/stdout.log", 2, 1,
     0},
    {"--log-dir", "run " TIMED " --trace off --run-id r1 --log-dir %s", "%s/r1/attempt_0/0/stdout.log", 2, 1, 0},
};
#define NOUTPUTS (sizeof outputs / sizeof outputs[0])

static void fmt_path(char *buf, size_t n, const char *fmt, const char *given) {
    snprintf(buf, n, fmt, given); /* fmt is one of the table's: "%s" and a suffix */
}

/* Runs output o on `given`, whose file is `attacked`, and checks the refusal
 * (exit status; the flag, the path `named` and `words` in the message) and
 * that nothing in dir changed. */
static void expect_refused(const output *o, const char *given, const char *attacked, const char *named,
                           const char *words, const char *attack) {
    char *before = listing();
    snap t0 = take(at(attacked)), p0 = take(at("precious.txt"));
    char args[2048];
    snprintf(args, sizeof args, o->args, given);
    int rc = run_in("", NULL, args);
    cr_assert_eq(rc, o->refused, "%s with %s: exit %d, expected %d:\n%s", o->flag, attack, rc, o->refused, out);
    cr_assert(strstr(out, o->flag) && strstr(out, named) && strstr(out, words),
              "%s with %s: the refusal does not say '%s' of %s:\n%s", o->flag, attack, words, named, out);
    snap t1 = take(at(attacked)), p1 = take(at("precious.txt"));
    assert_same(&t0, &t1, attacked);
    assert_same(&p0, &p1, "precious.txt");
    char *after = listing();
    cr_assert_str_eq(before, after, "%s with %s: the folder changed:\n%s", o->flag, attack, out);
    free(before);
    free(after);
}

/* A device node, a FIFO, a directory, a link to a file and a dangling link
 * at each file written: refused before a byte is written (a link's file
 * keeps its content, a dangling link stays dangling), the node and the
 * FIFO keep their inode. The code before wrote the node into a regular
 * file of the same name, through the link, and into a FIFO forever. */
Test(attack, a_special_file_at_an_output_is_refused_and_left_as_it_is) {
    if (!is_root()) cr_skip_test("mknod needs root");
    wipe();
    make_db();
    for (size_t i = 0; i < NOUTPUTS; i++) {
        const output *o = &outputs[i];
        for (int p = 0; p < NPLANTS; p++) {
            wipe();
            char attacked[256];
            fmt_path(attacked, sizeof attacked, o->attacked, "o");
            plant(at(attacked), (enum plant)p);
            expect_refused(o, "o", attacked, attacked, plant_words[p], plant_name[p]);
        }
    }
}

/* A file pprun would make in a folder of /proc or /sys (root may write
 * some there: a knob of the kernel, which SQLite or a checkpoint would
 * have written over) is refused, naming the folder, and nothing is made. */
Test(attack, an_output_in_a_folder_of_proc_or_sys_is_refused) {
    wipe();
    make_db();
    const char *given = "/sys/kernel/pprun-attack-o";
    for (size_t i = 0; i < NOUTPUTS; i++) {
        const output *o = &outputs[i];
        if (o->makes_folders || strncmp(o->attacked, "%s-", 3) == 0) continue; /* --log-dir: mkdir refuses there */
        char args[2048];
        snprintf(args, sizeof args, o->args, given);
        int rc = run_in("", NULL, args);
        cr_assert_eq(rc, o->refused, "%s in /sys: exit %d:\n%s", o->flag, rc, out);
        cr_assert(strstr(out, o->flag) && strstr(out, given) && strstr(out, "/sys/kernel is a folder of /proc or /sys"),
                  "%s in /sys:\n%s", o->flag, out);
        cr_assert_neq(access(given, F_OK), 0, "%s: %s was made", o->flag, given);
    }
}

/* A path in a folder that is not there, and one in a folder that cannot be
 * written (as root: run without CAP_DAC_OVERRIDE, so that the folder's mode
 * counts). Nothing is created. */
Test(attack, an_output_in_a_missing_or_read_only_folder_is_refused) {
    wipe();
    make_db();
    const char *wrap = is_root() ? "setpriv --bounding-set -dac_override,-dac_read_search" : "";
    for (size_t i = 0; i < NOUTPUTS; i++) {
        const output *o = &outputs[i];
        char attacked[256];
        if (strncmp(o->attacked, "%s-", 3) == 0) continue; /* a file beside --db: its folder is --db's */
        if (!o->makes_folders) {
            wipe();
            fmt_path(attacked, sizeof attacked, o->attacked, "missing/o");
            expect_refused(o, "missing/o", attacked, "missing/o", "does not exist", "a missing folder");
        }
        wipe();
        /* the folder the file is written in is read-only: for a file of a
         * folder flag, that folder (made here), else the one holding it */
        fmt_path(attacked, sizeof attacked, o->attacked, "ro/o");
        char folder[300], cmd[700];
        snprintf(folder, sizeof folder, "%s", at(attacked));
        *strrchr(folder, '/') = '\0';
        if (o->makes_folders) snprintf(folder, sizeof folder, "%s", at("ro/o"));
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && chmod 555 '%s'", folder, folder);
        cr_assert_eq(system(cmd), 0);
        char *before = listing();
        char args[2048];
        snprintf(args, sizeof args, o->args, "ro/o");
        int rc = run_in(wrap, NULL, args);
        cr_assert_eq(rc, o->unwritable ? o->unwritable : o->refused, "%s in a read-only folder: exit %d:\n%s", o->flag,
                     rc, out);
        cr_assert(strstr(out, o->flag) && strstr(out, "Permission denied"), "%s in a read-only folder:\n%s", o->flag,
                  out);
        char *after = listing();
        cr_assert_str_eq(before, after, "%s in a read-only folder: the folder changed", o->flag);
        free(before);
        free(after);
    }
}

/* A folder flag's path: a file in the way of the folders --log-dir makes
 * is refused before anything starts (the job's database not made: the
 * code before failed the job once its row was written); a folder not
 * there yet may be given with a trailing slash. */
Test(attack, a_folder_flag_refuses_a_file_in_its_way_and_takes_a_trailing_slash) {
    wipe();
    tfix_write(at("f"), "a file\n");
    const char *const logs[] = {"f", "f/x", "./f/x/"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        int rc = pprun("run " TIMED " --db new.db --log-dir %s", logs[i]);
        cr_assert_eq(rc, 2, "--log-dir %s: exit %d:\n%s", logs[i], rc, out);
        cr_assert(strstr(out, "--log-dir") && strstr(out, "f is a regular file, not a directory"),
                  "--log-dir %s: the refusal does not name the file in the way:\n%s", logs[i], out);
        cr_assert(!take(at("new.db")).exists, "--log-dir %s: the job's database was made", logs[i]);
        rc = pprun("launch --nproc-per-node 1 --log-dir %s -- true", logs[i]);
        cr_assert_eq(rc, 2, "launch --log-dir %s: exit %d:\n%s", logs[i], rc, out);
    }
    cr_assert_eq(pprun("run " TIMED " --trace off --save-weights w/"), 0, "%s", out);
    cr_assert(take(at("w/stage_1.f32")).exists, "--save-weights w/ wrote no weights");
    cr_assert_eq(pprun("run " TIMED " --trace off --checkpoint-dir c/"), 0, "%s", out);
    cr_assert(take(at("c/latest")).exists, "--checkpoint-dir c/ wrote no checkpoint");
    cr_assert_eq(pprun("run " TIMED " --trace off --log-dir l/a/"), 0, "%s", out);
}

/* Names a writer might put a file under while it writes, beside the file:
 * a link planted at any of them, each to a file of its own, is not
 * followed. The code before wrote through FILE.tmp. */
static const char *const temp_patterns[] = {"%s.tmp", ".%s.tmp", "%s.tmp.0", "%s~",    "%s.new", "%s.part",
                                            "%s.swp", ".%s.swp", "%s.lock",  "%s.bak", "#%s#",   ".#%s"};
#define NPATTERNS (sizeof temp_patterns / sizeof temp_patterns[0])

/* Each writer with every file it writes. */
static const struct {
    const char *args;
    const char *written[3];
} writers[] = {
    {"export --db t.db --job 1 --out o", {"o"}},
    {"export --db t.db --job 1 --out o.json", {"o.json"}},
    {"schedule --schedule 1f1b --stages 2 --microbatches 2 --csv-out o", {"o"}},
    {"run " TIMED " --trace off --metrics o", {"o"}},
    {"run " TIMED " --db o", {"o"}},
    {"run " TIMED " --trace off --save-weights o", {"o/stage_0.f32", "o/stage_1.f32"}},
    {"run " TIMED " --trace off --checkpoint-dir o", {"o/latest", "o/step_0/stage_0.ckpt", "o/step_0/stage_1.ckpt"}},
    {"launch --nproc-per-node 1 --run-id r1 --log-dir o -- true",
     {"o/r1/attempt_0/0/stdout.log", "o/r1/attempt_0/0/stderr.log"}},
};

Test(attack, links_at_every_temporary_name_are_not_followed) {
    wipe();
    make_db();
    for (size_t w = 0; w < sizeof writers / sizeof writers[0]; w++) {
        wipe();
        int planted = 0;
        snap before[3 * NPATTERNS];
        char link_path[3 * NPATTERNS][512], precious[3 * NPATTERNS][64];
        for (int f = 0; f < 3 && writers[w].written[f]; f++) {
            const char *file = writers[w].written[f], *slash = strrchr(file, '/');
            char folder[256] = "";
            if (slash) snprintf(folder, sizeof folder, "%.*s/", (int)(slash - file), file);
            for (size_t p = 0; p < NPATTERNS; p++, planted++) {
                char name[256];
                snprintf(name, sizeof name, temp_patterns[p], slash ? slash + 1 : file);
                snprintf(precious[planted], sizeof precious[0], "precious-%d", planted);
                tfix_write(at(precious[planted]), "precious\n");
                snprintf(link_path[planted], sizeof link_path[0], "%s", at(folder));
                snprintf(link_path[planted] + strlen(link_path[planted]),
                         sizeof link_path[0] - strlen(link_path[planted]), "%s", name);
                char cmd[1200];
                snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -s '%s' '%s'", at(folder), at(precious[planted]),
                         link_path[planted]);
                cr_assert_eq(system(cmd), 0);
                before[planted] = take(at(precious[planted]));
            }
        }
        int rc = pprun("%s", writers[w].args);
        cr_assert_eq(rc, 0, "%s:\n%s", writers[w].args, out);
        for (int i = 0; i < planted; i++) {
            snap now = take(at(precious[i]));
            assert_same(&before[i], &now, precious[i]);
            struct stat st;
            cr_assert(lstat(link_path[i], &st) == 0 && S_ISLNK(st.st_mode), "%s: the link was replaced", link_path[i]);
        }
        for (int f = 0; f < 3 && writers[w].written[f]; f++) {
            struct stat st;
            cr_assert(lstat(at(writers[w].written[f]), &st) == 0 && S_ISREG(st.st_mode), "%s: %s not written",
                      writers[w].args, writers[w].written[f]);
        }
        /* nothing else named like a temporary file: pprun's own are gone */
        char *all = listing();
        for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
            struct stat st;
            if (!strstr(line, ".tmp") || (lstat(at(line + 2), &st) == 0 && S_ISLNK(st.st_mode))) continue;
            cr_assert_fail("%s: %s left behind", writers[w].args, line);
        }
        free(all);
    }
}

/* A step folder of --checkpoint-dir that is a file: refused before the
 * job starts (it failed the job at its last step), the file as it was;
 * one of a step the job does not save (not one of its, before a resumed
 * job's start), or not a step's name, is no concern of it. */
Test(attack, a_checkpoint_step_folder_that_is_a_file_is_refused_before_the_job) {
    wipe();
    cr_assert_eq(mkdir(at("c"), 0755), 0);
    tfix_write(at("c/step_0"), "mine\n");
    tfix_write(at("c/step_5"), "mine\n");
    tfix_write(at("c/step_00"), "mine\n");
    snap f0 = take(at("c/step_0"));
    int rc = pprun("run " TIMED " --trace off --checkpoint-dir c");
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--checkpoint-dir: c/step_0, where step 0's checkpoint goes, is a regular file, not a "
                          "directory"),
              "%s", out);
    snap f1 = take(at("c/step_0"));
    assert_same(&f0, &f1, "c/step_0");
    cr_assert_eq(unlink(at("c/step_0")), 0);
    cr_assert_eq(pprun("run " TIMED " --trace off --checkpoint-dir c"), 0, "%s", out);
    /* a resumed job writes from its start on: what is before it is not its concern */
    cr_assert_eq(pprun("run --model timed:f=1ms,b=1ms,w=1ms --steps 2 --nproc-per-node 2 --progress off --trace off "
                       "--checkpoint-dir d --checkpoint-every 1"),
                 0, "%s", out);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -r '%s' && echo mine > '%s'", at("d/step_0"), at("d/step_0"));
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(pprun("run --model timed:f=1ms,b=1ms,w=1ms --steps 3 --nproc-per-node 2 --progress off --trace off "
                       "--checkpoint-dir d --checkpoint-every 1 --resume"),
                 0, "%s", out);
}

/* ---- inputs ----------------------------------------------------------------- */

typedef struct input {
    const char *flag; /* named in the refusal */
    const char *args; /* pprun's arguments, %s the file */
    uint64_t cap;     /* a file past this many bytes is refused; 0: no cap */
    int sqlite;       /* a database: a missing file is "no such file" */
} input;

static const input inputs[] = {
    {"--data", "run --steps 1 --nproc-per-node 2 --progress off --trace off --data %s", 1ull << 30, 0},
    {"schedule CSV", "schedule --schedule csv:%s", 64ull << 20, 0},
    {"schedule CSV", "schedule --csv-in %s", 64ull << 20, 0},
    {"schedule CSV", "run " TIMED " --trace off --schedule csv:%s", 64ull << 20, 0},
    {"--rdzv-token-file", "launch --rdzv-token-file %s -- true", 320, 0},
    {"--rdzv-token-file", "run " TIMED " --trace off --rdzv-token-file %s", 320, 0},
    {"--schedule-costs", "run " TIMED " --trace off --schedule zb-v --schedule-costs %s", 0, 1},
    {"--db", "stats --db %s", 0, 1},
    {"--db", "query --db %s 'SELECT 1'", 0, 1},
    {"--db", "export --db %s", 0, 1},
    {"--db", "serve --db %s --listen 127.0.0.1:0", 0, 1},
};
#define NINPUTS (sizeof inputs / sizeof inputs[0])

enum bad_input { ZERO_DEVICE, IN_FIFO, IN_DIRECTORY, PROC_MEM, PROC_STATUS, CGROUP, OVER_CAP, MISSING, NBAD };
static const char *const bad_name[] = {"a zero device",     "a FIFO",        "a directory",         "/proc/self/mem",
                                       "/proc/self/status", "a cgroup file", "a file over the cap", "a missing file"};

/* A file of the cgroup file system under /sys/fs/cgroup (v2's, or v1's cpu
 * controller), NULL where none is mounted. */
static const char *cgroup_file(void) {
    static const char *const files[] = {"/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/cpu/cgroup.procs"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (access(files[i], R_OK) == 0) return files[i];
    return NULL;
}

/* Each input as each bad file: refused with exit 2 in well under the 20 s
 * limit (the code before read /dev/zero until the kernel killed it, and
 * waited on a FIFO forever), the message naming the path and the problem,
 * the file as it was and nothing beside it. */
Test(attack, a_bad_input_is_refused_at_once) {
    if (!is_root()) cr_skip_test("mknod needs root");
    wipe();
    for (size_t i = 0; i < NINPUTS; i++) {
        const input *in = &inputs[i];
        for (int b = 0; b < NBAD; b++) {
            if (b == OVER_CAP && !in->cap) continue;
            wipe();
            /* /proc/self/status says it is a regular file of 0 bytes, which
             * SQLite took for an empty database: pprun query ran on it; so
             * did a cgroup file, of a file system mounted under /sys */
            if (b == CGROUP && !cgroup_file()) continue;
            int proc = b == PROC_MEM || b == PROC_STATUS || b == CGROUP;
            const char *path = b == PROC_MEM      ? "/proc/self/mem"
                               : b == PROC_STATUS ? "/proc/self/status"
                               : b == CGROUP      ? cgroup_file()
                                                  : "in";
            const char *words = b == ZERO_DEVICE    ? "is a character device"
                                : b == IN_FIFO      ? "is a FIFO"
                                : b == IN_DIRECTORY ? "is a directory"
                                : proc              ? "is a pseudo-file of /proc or /sys"
                                : b == OVER_CAP     ? "over the cap of"
                                : in->sqlite        ? "no such file"
                                                    : "cannot open: No such file";
            if (b == ZERO_DEVICE) cr_assert_eq(mknod(at("in"), S_IFCHR | 0666, makedev(1, 5)), 0);
            if (b == IN_FIFO) cr_assert_eq(mkfifo(at("in"), 0666), 0);
            if (b == IN_DIRECTORY) cr_assert_eq(mkdir(at("in"), 0755), 0);
            if (b == OVER_CAP) { /* sparse: no disk taken */
                int fd = open(at("in"), O_WRONLY | O_CREAT, 0644);
                cr_assert(fd >= 0 && ftruncate(fd, (off_t)in->cap + 1) == 0);
                close(fd);
            }
            char *before = listing();
            snap s0 = take(proc ? path : at("in"));
            char args[2048];
            snprintf(args, sizeof args, in->args, path);
            int rc = pprun("%s", args);
            cr_assert_eq(rc, 2, "%s %s: exit %d (124: it hung):\n%s", in->flag, bad_name[b], rc, out);
            cr_assert(strstr(out, in->flag) && strstr(out, path) && strcasestr(out, words),
                      "%s %s: the refusal does not say '%s':\n%s", in->flag, bad_name[b], words, out);
            if (!proc) {
                snap s1 = take(at("in"));
                assert_same(&s0, &s1, bad_name[b]);
            }
            char *after = listing();
            cr_assert_str_eq(before, after, "%s %s: the folder changed", in->flag, bad_name[b]);
            free(before);
            free(after);
        }
    }
}

/* A checkpoint read back: DIR/latest and a stage file as a FIFO or a
 * device are refused, not waited on or read; before launch, since the
 * launcher reads the step's stage files to check them against the job. */
Test(attack, a_special_checkpoint_file_is_refused) {
    if (!is_root()) cr_skip_test("mknod needs root");
    wipe();
    plant(at("c/latest"), FIFO);
    int rc = pprun("run " TIMED " --trace off --checkpoint-dir c --resume");
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "c/latest: is a FIFO"), "%s", out);
    wipe();
    make_folder("c");
    tfix_write(at("c/latest"), "0 r1\n");
    plant(at("c/step_0/stage_0.ckpt"), FIFO);
    cr_assert_eq(mknod(at("c/step_0/stage_1.ckpt"), S_IFCHR | 0666, makedev(1, 5)), 0);
    rc = pprun("run --model timed:f=1ms,b=1ms,w=1ms --steps 3 --nproc-per-node 2 --progress off --trace off "
               "--checkpoint-dir c --resume");
    cr_assert_eq(rc, 2, "exit %d (124: it hung):\n%s", rc, out);
    cr_assert(strstr(out, "checkpoint c/step_0/stage_0.ckpt: is a FIFO") ||
                  strstr(out, "checkpoint c/step_0/stage_1.ckpt: is a character device"),
              "%s", out);
}

/* ---- standard output ---------------------------------------------------------- */

/* Every command with output on stdout, stdout on a full device (made
 * here: the numbers of /dev/full): exit 1 naming the error, for all. The
 * code before: stats, serve, launch, run, version and --help exited 0
 * with nothing said. */
Test(attack, stdout_on_a_full_device_exits_1_for_every_command) {
    if (!is_root()) cr_skip_test("mknod needs root");
    wipe();
    make_db();
    cr_assert_eq(mknod(at("full"), S_IFCHR | 0666, makedev(1, 7)), 0);
    static const char *const commands[] = {
        "version",
        "--version",
        "--help",
        "run --help",
        "launch --help",
        "schedule --help",
        "query --help",
        "stats --help",
        "export --help",
        "serve --help",
        "schedule --schedule 1f1b --stages 2 --microbatches 2",
        "schedule --schedule 1f1b --stages 2 --microbatches 2 --format json",
        "query --db t.db 'SELECT * FROM jobs'",
        "query --db t.db --format csv 'SELECT 1'",
        "query --db t.db --format json 'SELECT 1'",
        "stats --db t.db",
        "stats --db t.db --format json",
        "export --db t.db",
        "export --db t.db --out -",
        "launch --nproc-per-node 2 -- echo hi",
        "run --nproc-per-node 2 --trace off -- sh -c 'echo hi'",
    };
    snap d0 = take(at("full"));
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        int rc = run_in("", "full", commands[i]);
        cr_assert_eq(rc, 1, "pprun %s >full: exit %d:\n%s", commands[i], rc, out);
        cr_assert(strstr(out, "writing standard output failed: No space left on device"), "pprun %s >full:\n%s",
                  commands[i], out);
    }
    /* a traced job whose ranks' output was lost: its row says the exit status pprun exits with */
    cr_assert_eq(run_in("", "full", "run --nproc-per-node 1 --db lost.db -- sh -c 'echo hi'"), 1, "%s", out);
    sqlite3 *lost;
    sqlite3_stmt *row;
    cr_assert_eq(sqlite3_open(at("lost.db"), &lost), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(lost, "SELECT status || ' ' || exit_code FROM jobs", -1, &row, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(row), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(row, 0), "succeeded 1");
    sqlite3_finalize(row);
    sqlite3_close(lost);
    /* serve says where it serves, then serves until a signal */
    char cmd[2048];
    snprintf(
        cmd, sizeof cmd,
        "cd '%s' && { '%s' serve --db t.db --listen 127.0.0.1:0 >full 2>'%s.out' & pid=$!; sleep 1; kill -TERM $pid; "
        "wait $pid; }",
        dir, PPRUN_BIN, dir);
    int st = system(cmd);
    char cap[300];
    snprintf(cap, sizeof cap, "%s.out", dir);
    FILE *f = fopen(cap, "r");
    out_len = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[out_len] = '\0';
    if (f) fclose(f);
    unlink(cap);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "pprun serve >full: status %d:\n%s", st, out);
    cr_assert(strstr(out, "pprun serve: writing standard output failed: No space left on device"), "%s", out);
    snap d1 = take(at("full"));
    assert_same(&d0, &d1, "the full device");
}

/* `pprun export` holds standard output whole in an anonymous file under
 * $TMPDIR; a $TMPDIR with no room (a small tmpfs on a cluster node; here a
 * file-size limit) while stdout has room: exit 1 naming that folder and
 * what to do, nothing on stdout. It said "disk full?" of stdout's disk.
 * The limit, `ulimit -f 64` in sh, is 64 blocks of 512 bytes: room for the
 * database's -shm (SQLite's reader writes it) and not for the export, of a
 * job of 6 steps (about 190 KB; make_db's single step made about 33 KB,
 * which fitted now and then). */
Test(attack, a_full_tmpdir_under_exports_stdout_is_named) {
    wipe();
    int rc = pprun("run --model timed:f=1ms,b=1ms,w=1ms --steps 6 --nproc-per-node 2 --progress off --db t.db");
    cr_assert_eq(rc, 0, "%s", out);
    make_folder("spool");
    rc = run_in("trap '' XFSZ; ulimit -f 64; TMPDIR=\"$PWD/spool\"", "trace.json", "export --db t.db");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "standard output is held whole in a temporary file under ") && strstr(out, "/spool ($TMPDIR)") &&
                  strstr(out, "set TMPDIR to a folder with room, or give --out FILE"),
              "%s", out);
    struct stat st;
    cr_assert_eq(stat(at("trace.json"), &st), 0);
    cr_assert_eq(st.st_size, 0, "stdout got %lld bytes of a failed export", (long long)st.st_size);
}

/* ---- the terminal --------------------------------------------------------------- */

/* No byte that drives a terminal in `out`: it is valid UTF-8 without C0
 * controls (but newline, tab and carriage return), DEL or C1 controls. */
static void assert_terminal_safe(const char *what) {
    const unsigned char *s = (const unsigned char *)out;
    for (size_t i = 0; i < out_len;) {
        size_t n = s[i] < 0x80 ? 1 : s[i] >= 0xf0 ? 4 : s[i] >= 0xe0 ? 3 : s[i] >= 0xc2 ? 2 : 0;
        cr_assert(n && i + n <= out_len, "%s: a byte 0x%02x that is not UTF-8 at %zu:\n%s", what, s[i], i, out);
        unsigned cp = n == 1 ? s[i] : s[i] & (0x7f >> n);
        for (size_t k = 1; k < n; k++) {
            cr_assert((s[i + k] & 0xc0) == 0x80, "%s: bad UTF-8 at %zu:\n%s", what, i, out);
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        int control = (cp < 0x20 && cp != '\n' && cp != '\t' && cp != '\r') || (cp >= 0x7f && cp < 0xa0);
        cr_assert(!control, "%s: control character U+%04X sent raw at %zu:\n%s", what, cp, i, out);
        i += n;
    }
}

#define ESC_2J "$(printf '\\033[2J')"
#define OSC_TITLE "$(printf '\\033]0;owned\\007')"
#define C1_CSI "$(printf '\\302\\2332J')"

/* Cells of a schedule CSV with an ESC sequence, an OSC title and a C1
 * control, quoted in the error: the code before printed them raw. */
Test(attack, control_bytes_in_a_csv_cell_are_escaped) {
    wipe();
    static const char *const cells[] = {"\033[2J", "\033]0;owned\007", "\302\2332J", "0F0\033[31m"};
    static const char *const shown[] = {"\\x1b[2J", "\\x1b]0;owned\\x07", "\\u009b2J", "0F0\\x1b[31m"};
    for (size_t i = 0; i < sizeof cells / sizeof cells[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "0F0,%s\n1F0\n", cells[i]);
        tfix_write(at("evil.csv"), text);
        int rc = pprun("schedule --schedule csv:evil.csv");
        cr_assert_eq(rc, 2, "%s", out);
        assert_terminal_safe("pprun schedule");
        cr_assert(strstr(out, shown[i]), "expected %s in:\n%s", shown[i], out);
        rc = pprun("run " TIMED " --trace off --schedule csv:evil.csv");
        cr_assert_eq(rc, 2, "%s", out);
        assert_terminal_safe("pprun run");
        cr_assert(strstr(out, shown[i]), "expected %s in:\n%s", shown[i], out);
    }
}

/* Arguments quoted in messages: file names, --model, an unknown option,
 * a --run-id; and the name of a valid CSV file in the schedule's text. */
Test(attack, control_bytes_in_arguments_and_file_names_are_escaped) {
    wipe();
    make_db();
    const char *const commands[] = {
        "run --steps 1 --progress off --trace off --data " ESC_2J,
        "run --steps 1 --progress off --trace off --model gpt" OSC_TITLE,
        "run --steps 1 --progress off --trace off --run-id " C1_CSI,
        "run " TIMED " --trace off --metrics " ESC_2J "/m.jsonl",
        "export --db t.db --out " OSC_TITLE "/x.json",
        "export --db " C1_CSI,
        "stats --db t.db --format " ESC_2J,
        "query --db " OSC_TITLE " 'SELECT 1'",
        "schedule --schedule " C1_CSI " --stages 2 --microbatches 2",
        "schedule --schedule 1f1b --stages 2 --microbatches 2 --csv-out " ESC_2J "/o.csv",
        "launch --rdzv-token-file " ESC_2J " -- true",
        "stats --" OSC_TITLE,
        "nosuchcommand" ESC_2J,
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        int rc = pprun("%s", commands[i]);
        cr_assert_eq(rc, 2, "pprun %s: exit %d:\n%s", commands[i], rc, out);
        assert_terminal_safe(commands[i]);
        cr_assert(strstr(out, "\\x1b") || strstr(out, "\\u009b"), "pprun %s: no escape in:\n%s", commands[i], out);
    }
    /* a valid schedule in a file whose name holds an ESC sequence */
    char name[64];
    snprintf(name, sizeof name, "s\033[2J.csv");
    tfix_write(at(name), "0F0,0B0,0W0\n");
    int rc = pprun("schedule --schedule csv:"
                   "$(printf 's\\033[2J.csv')");
    cr_assert_eq(rc, 0, "%s", out);
    assert_terminal_safe("pprun schedule's text");
    cr_assert(strstr(out, "schedule csv:s\\x1b[2J.csv: 1 ranks"), "%s", out);
}

/* Names in a database (a job's name, model and schedule, a failure's
 * text) come from whoever wrote it: pprun stats' text and pprun query's
 * table show their control bytes as escapes. */
Test(attack, control_bytes_in_a_database_are_escaped) {
    wipe();
    make_db();
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(at("t.db"), &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db,
                          "UPDATE jobs SET name = 'job' || char(27) || '[2J', model = 'gpt' || char(27) || ']0;owned' "
                          "|| char(7), schedule = '1f1b' || char(155) || '2J', failure = 'boom' || char(27) || '[31m'",
                          NULL, NULL, &msg);
    cr_assert_eq(rc, SQLITE_OK, "%s", msg ? msg : "");
    sqlite3_close(db);
    rc = pprun("stats --db t.db");
    cr_assert_eq(rc, 0, "%s", out);
    assert_terminal_safe("pprun stats");
    cr_assert(strstr(out, "job\\x1b[2J") && strstr(out, "gpt\\x1b]0;owned\\x07") && strstr(out, "1f1b\\u009b2J"), "%s",
              out);
    rc = pprun("query --db t.db 'SELECT name, model, schedule, failure FROM jobs'");
    cr_assert_eq(rc, 0, "%s", out);
    assert_terminal_safe("pprun query");
}

/* ---- an output that is the command's own input ------------------------------ */

/* Every path under dir with its type, inode and size, and every regular
 * file's bytes (md5), one a line, sorted (malloc'd): equal before and after
 * when nothing in the folder changed. */
static char *tree(void) {
    char cmd[700];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && { find . -mindepth 1 -printf '%%p %%y %%i %%s\\n'; find . -type f -exec md5sum {} +; } | "
             "LC_ALL=C sort",
             dir);
    return output_of(cmd);
}

/* An output named as one of the command's inputs (the same path, a hard
 * link, the input through a symbolic link, the file SQLite keeps beside a
 * database, a file inside the checkpoint folder merge reads) or as another
 * of its outputs: exit 2 naming both flags, and not a byte in the folder
 * changed. Before, export replaced the database by JSON, merge replaced
 * the folder's latest pointer, and run lost its metrics into its --db. */
Test(attack, an_output_that_is_an_input_is_refused_and_nothing_changes) {
    wipe();
    make_db();
    cr_assert_eq(pprun("run " TIMED " --trace off --checkpoint-dir c"), 0, "%s", out);
    cr_assert_eq(pprun("checkpoint merge c --out m.ckpt"), 0, "%s", out);
    cr_assert_eq(pprun("schedule --schedule 1f1b --stages 2 --microbatches 8 --csv-out s.csv"), 0, "%s", out);
    tfix_write(at("d.txt"), "some text to train on, long enough for nothing\n");
    cr_assert_eq(link(at("t.db"), at("h.db")), 0, "%s", strerror(errno));
    cr_assert_eq(symlink("t.db", at("l.db")), 0, "%s", strerror(errno));
    const struct {
        const char *args, *says[2]; /* the output's words and the input's */
    } cases[] = {
        {"export --db t.db --out t.db", {"--out t.db: is the same file as --db t.db", "reads"}},
        {"export --db t.db --out h.db", {"--out h.db: is the same file as --db t.db", "nothing was changed"}},
        {"export --db l.db --out t.db", {"--out t.db: is the same file as --db l.db", "nothing was changed"}},
        {"export --db t.db --out t.db-wal", {"--out t.db-wal: is the WAL file of --db t.db, which this command reads", "nothing was changed"}},
        /* SQLite keeps the WAL of a database named through a link beside the file it points to */
        {"export --db l.db --out t.db-wal", {"--out t.db-wal: is the WAL file of --db l.db, which this command reads", "nothing was changed"}},
        {"run " TIMED " --db l.db --metrics t.db-shm", {"--metrics t.db-shm: is the shared-memory file of --db l.db",
                                                        "also writes"}},
        {"checkpoint merge c --out c/latest", {"--out c/latest: is inside DIR c", "name a file outside it"}},
        {"checkpoint merge c --out c/step_0/merged.ckpt", {"--out c/step_0/merged.ckpt: is inside DIR c", "reads"}},
        {"checkpoint merge ./c/ --out c/new.ckpt", {"--out c/new.ckpt: is inside DIR ./c/", "reads"}},
        {"schedule --csv-in s.csv --csv-out s.csv", {"--csv-out s.csv: is the same file as --csv-in s.csv", "reads"}},
        {"schedule --schedule csv:s.csv --csv-out ./s.csv", {"--csv-out ./s.csv: is the same file as --schedule csv:s.csv", "reads"}},
        {"run " TIMED " --db t.db --metrics t.db", {"--metrics t.db: is the same file as --db t.db", "also writes"}},
        {"run " TIMED " --db n.db --metrics n.db", {"--metrics n.db: is the same file as --db n.db", "also writes"}},
        {"run " TIMED " --db n.db --metrics n.db-wal", {"--metrics n.db-wal: is the WAL file of --db n.db",
                                                        "also writes"}},
        {"run " TIMED " --db o.db --schedule-costs t.db --metrics h.db",
         {"--metrics h.db: is the same file as --schedule-costs t.db", "reads"}},
        {"run " TIMED " --trace off --schedule csv:s.csv --metrics s.csv",
         {"--metrics s.csv: is the same file as --schedule csv:s.csv", "reads"}},
        {"run --model gpt:layers=2,dim=8 --steps 1 --nproc-per-node 2 --progress off --data d.txt --db d.txt",
         {"--db d.txt: is the same file as --data d.txt", "reads"}},
        {"run --model gpt:layers=2,dim=8 --steps 1 --nproc-per-node 2 --progress off --trace off --data d.txt "
         "--metrics d.txt",
         {"--metrics d.txt: is the same file as --data d.txt", "reads"}},
        {"run " TIMED " --trace off --init-from m.ckpt --metrics m.ckpt",
         {"--metrics m.ckpt: is the same file as --init-from m.ckpt", "reads"}},
        {"run " TIMED " --trace off --checkpoint-dir c --metrics c/latest",
         {"--metrics c/latest: is the same file as --checkpoint-dir's c/latest", "also writes"}},
        {"run --model gpt:layers=2,dim=16,heads=2,seq=16,batch=2 --nproc-per-node 2 --save-weights . --db stage_1.f32",
         {"--db stage_1.f32: is the same file as --save-weights' ./stage_1.f32", "also writes"}},
        {"run --model gpt:layers=2,dim=16,heads=2,seq=16,batch=2 --nproc-per-node 2 --trace off --save-weights . "
         "--metrics stage_0.f32",
         {"--metrics stage_0.f32: is the same file as --save-weights' ./stage_0.f32", "also writes"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *before = tree();
        int rc = pprun("%s", cases[i].args);
        cr_assert_eq(rc, 2, "%s: exit %d:\n%s", cases[i].args, rc, out);
        for (int k = 0; k < 2; k++)
            cr_assert(strstr(out, cases[i].says[k]), "%s: the refusal does not say '%s':\n%s", cases[i].args,
                      cases[i].says[k], out);
        char *after = tree();
        cr_assert_str_eq(before, after, "%s: the folder changed:\n%s", cases[i].args, out);
        free(before);
        free(after);
    }
    /* the same commands with outputs of their own still work */
    cr_assert_eq(pprun("export --db t.db --out x.json"), 0, "%s", out);
    cr_assert_eq(pprun("checkpoint merge ./c --out c2.ckpt"), 0, "%s", out);
    cr_assert_eq(pprun("schedule --csv-in s.csv --csv-out s2.csv"), 0, "%s", out);
}
