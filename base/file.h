/* file.h: the files a user names. Every path a user gives pprun to read or
 * to write goes through these, so that each refuses the same things in the
 * same words. Their messages start
 * with "WHAT PATH:" (e.g. "--data x.txt:"); WHAT is the flag. A command
 * that writes one file and reads another checks them against each other
 * (file_output_not_input) before it opens either, so that a user-named
 * output never replaces the command's own input. */
#ifndef PP_BASE_FILE_H
#define PP_BASE_FILE_H
#include <stdint.h>
#include <stdio.h>

#include "base/pp.h"

/* "a directory", "a FIFO (named pipe)", "a character device", "a block
 * device", "a socket", "a symbolic link", "a regular file": what st_mode is. */
const char *file_kind(unsigned mode);

/* Inputs: a regular file only (a symbolic link to one is fine): a FIFO, a
 * device, a directory, a socket, or a pseudo-file of /proc or /sys (whose
 * size is not what reading it yields) is refused, naming what it is. A
 * FIFO is never opened (nor waited on: the file is opened O_NONBLOCK, then
 * made blocking). A file of more than max_bytes is refused with its size
 * and the cap. *f is the file open for reading (the caller closes it);
 * size, when not NULL, gets its size. */
int file_input_open(const char *path, const char *what, uint64_t max_bytes, FILE **f, uint64_t *size, pp_err *err);
/* Whether path is on /proc or /sys (their files' sizes are not what
 * reading them yields): for a reader that opens by path (SQLite). */
int file_is_pseudo(const char *path);
/* file_input_open, then the whole file into *buf (malloc'ed, NUL-terminated;
 * the caller frees it); what reading yields counts against max_bytes too. */
int file_input_read(const char *path, const char *what, size_t max_bytes, char **buf, size_t *len, pp_err *err);

/* Outputs: nothing at path yet, or a regular file. Anything else there (a
 * device, a FIFO, a socket, a directory, a symbolic link, even to a regular
 * file) is refused, naming what it is, and left as it is; so is a path
 * whose folder is missing or not writable. Checks early, before a job
 * starts; file_output_begin and file_output_stream check again. */
int file_output_check(const char *path, const char *what, pp_err *err);

/* A folder made with its parents when it is missing (--log-dir): every
 * part of path that is there a directory (a symbolic link to one is
 * fine), the deepest of them writable. 1 when path is such a directory, 0
 * when it is to be made, -1 with err naming the part that is not a
 * directory ("--log-dir logs/x: logs is a regular file, not a
 * directory"). Checks early, before a job starts. */
int file_folder_check(const char *path, const char *what, pp_err *err);

/* An output that is one of the command's inputs: path (flag what) the same
 * file as in (flag in_what): the same device and inode, following
 * symbolic links, or, while neither is there yet, the same name in the same
 * folder. With FILE_INPUT_DIR, in is a folder the command reads (pprun
 * checkpoint merge's DIR), and an output anywhere inside it is refused too.
 * FILE_INPUT_WRITTEN says in the message that the command writes in as
 * well (pprun run's --db). A path that is "-" (standard output), empty or
 * in a folder that is not there is no file and passes (the other checks
 * name what is wrong with it). 0, or -1 with err naming both; the caller
 * exits 2 before anything is written. */
#define FILE_INPUT_DIR 1u
#define FILE_INPUT_WRITTEN 2u
int file_output_not_input(const char *path, const char *what, const char *in, const char *in_what, unsigned flags,
                          pp_err *err);

/* A whole file (--out, --csv-out, a checkpoint, saved weights), written
 * into a new temporary file of a random name beside the target (created
 * O_EXCL | O_NOFOLLOW: nothing planted there is opened), then synced and
 * renamed over it: the target holds the old content or all of the new,
 * never a part, and a failure leaves it and the folder as they were. A
 * file replaced keeps its permission bits (not its owner); a hard link
 * of it keeps the old content, as after any rename. */
typedef struct file_output {
    FILE *f;                 /* write the content here */
    int dir;                 /* the target's folder; -1 for standard output */
    int to_stdout;           /* f is an anonymous file, copied to stdout by commit */
    char name[256];          /* the target's name in dir */
    char tmp[256];           /* the temporary file's name in dir; "" when none; for standard
                              * output, the folder its anonymous file is in */
    const char *path, *what; /* the caller's, for messages */
} file_output;
/* FILE_OUTPUT_DASH: path "-" is standard output (for a command that
 * documents it), written whole too: the content goes to an anonymous
 * temporary file under $TMPDIR (else /tmp) and commit copies it to stdout,
 * so a command that fails half-way prints nothing (a user's `> out.json`
 * gets no half a file). Errors writing stdout are main's (one check at the
 * end, main.c). */
#define FILE_OUTPUT_DASH 1u
int file_output_begin(file_output *o, const char *path, const char *what, unsigned flags, pp_err *err);
/* Flushes, syncs, closes and renames into place; on failure the temporary
 * file is removed and -1 says why. Either way o is finished. */
int file_output_commit(file_output *o, pp_err *err);
/* Gives up: the temporary file is removed, the target untouched. */
void file_output_abort(file_output *o);
/* What file_output_begin left in folder `dir` when its process died
 * between begin and commit (SIGKILL, a teardown): regular files named
 * TARGET.<12 lowercase hex digits>.tmp, its temporary files, whose TARGET
 * `is_target` accepts. Removed, and nothing else: no other name, no
 * folder, no symbolic link (`dir` itself may be one). Only for a folder no live process
 * writes into (a temporary file unlinked under a writer fails its commit,
 * which leaves the target as it was). A folder that is not there: 0. The
 * number removed, or -1 with err naming the folder or the file. */
int file_output_sweep(const char *dir, int (*is_target)(const char *name), pp_err *err);

/* A file written as it goes, which cannot be renamed into place (the
 * --metrics lines, appended; a rank's log, begun empty): file_output_check,
 * then opened O_NOFOLLOW without waiting on a FIFO and refused unless it is
 * a regular file once open; only then emptied (truncate). The descriptor
 * (O_CLOEXEC), or -1 with err. */
int file_output_stream(const char *path, const char *what, int truncate, pp_err *err);

/* A private folder for files and sockets a job makes and removes again (the
 * MPS daemon's pipes and logs, docs/gpu.md): a new folder of a random name,
 * prefix followed by six characters, under $TMPDIR (else /tmp), made by
 * mkdtemp: mode 0700, never a path that was there, so nothing planted
 * (a folder, a symbolic link) is used. Its path into out (cap bytes). */
int file_private_dir_create(const char *prefix, char *out, size_t cap, pp_err *err);
/* Removes such a folder with everything in it, never following a symbolic
 * link (one inside is removed itself, not what it points to; a link at
 * path is refused); folders inside nest at most 8 deep. 0, or -1 with err
 * naming what stayed. */
int file_private_dir_remove(const char *path, pp_err *err);

#endif
