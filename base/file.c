/* file.c: the files a user names, read and written safely (file.h). */
#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

const char *file_kind(unsigned mode) {
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a file pprun knows";
}

/* "1.5 GiB", "64 MiB", "300 bytes": a size for a message. */
static void fmt_size(uint64_t n, char *buf, size_t cap) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, u++;
    if (u == 0) snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
    else if (v == (double)(uint64_t)v) snprintf(buf, cap, "%.0f %s", v, units[u]);
    else snprintf(buf, cap, "%.1f %s", v, units[u]);
}

static int too_big(const char *path, const char *what, uint64_t size, uint64_t max_bytes, int at_least, pp_err *err) {
    char has[64], cap[64];
    fmt_size(size, has, sizeof has);
    fmt_size(max_bytes, cap, sizeof cap);
    if (size >= 1024 && (double)size < (double)max_bytes * 1.1) { /* near the cap, a rounded size reads as it: 1025 MiB, "1.0 GiB" */
        size_t n = strlen(has), k = strlen(cap);
        snprintf(has + n, sizeof has - n, " (%llu bytes)", (unsigned long long)size);
        snprintf(cap + k, sizeof cap - k, " (%llu bytes)", (unsigned long long)max_bytes);
    }
    return pp_fail(err, "%s %s: is %s%s, over the cap of %s", what, path, at_least ? "more than " : "", has, cap);
}

/* /proc and /sys, and the kernel's file systems mounted under them: their
 * files say they are regular, with a size that is not what reading them
 * yields (0, 4096), or say nothing true at all (/proc/self/mem,
 * /proc/kcore); writing one sets a knob of the kernel. */
static int is_pseudo_fs(const struct statfs *fs) {
    static const unsigned long kinds[] = {
        PROC_SUPER_MAGIC, SYSFS_MAGIC,    CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, /* /sys/fs/cgroup */
        DEBUGFS_MAGIC,    TRACEFS_MAGIC,  SECURITYFS_MAGIC,   BPF_FS_MAGIC,        /* /sys/kernel, /sys/fs/bpf */
        EFIVARFS_MAGIC,   PSTOREFS_MAGIC, BINFMTFS_MAGIC,     0x62656570 /* configfs */};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if ((unsigned long)fs->f_type == kinds[i]) return 1;
    return 0;
}

static int is_pseudo_file(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && is_pseudo_fs(&fs);
}

int file_is_pseudo(const char *path) {
    struct statfs fs;
    return statfs(path, &fs) == 0 && is_pseudo_fs(&fs);
}

int file_input_open(const char *path, const char *what, uint64_t max_bytes, FILE **f, uint64_t *size, pp_err *err) {
    *f = NULL;
    /* Looked at before it is opened: opening a device can do something
     * (a tape rewinds), and opening a FIFO waits for a writer. */
    struct stat st;
    if (stat(path, &st) != 0) return pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return pp_fail(err, "%s %s: is %s, not a regular file", what, path, file_kind(st.st_mode));
    /* Swapped for a FIFO since: O_NONBLOCK opens it at once, fstat says. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = pp_fail(err, "%s %s: is %s, not a regular file", what, path, file_kind(st.st_mode));
    else if (is_pseudo_file(fd))
        rc = pp_fail(err, "%s %s: is a pseudo-file of /proc or /sys, not a regular file", what, path);
    else if ((uint64_t)st.st_size > max_bytes) rc = too_big(path, what, (uint64_t)st.st_size, max_bytes, 0, err);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(*f = fdopen(fd, "rb")))
        rc = pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (rc != 0) {
        close(fd);
        return -1;
    }
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

int file_input_read(const char *path, const char *what, size_t max_bytes, char **buf, size_t *len, pp_err *err) {
    FILE *f;
    uint64_t size;
    if (file_input_open(path, what, max_bytes, &f, &size, err) != 0) return -1;
    /* Room for what it says it holds and one byte more, to see it grew. */
    size_t cap = (size_t)size + 1, n = 0;
    char *data = malloc(cap + 1);
    int rc = 0;
    while (data && rc == 0) {
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n > max_bytes) rc = too_big(path, what, max_bytes, max_bytes, 1, err);
        else if (n == cap) {
            size_t more = cap > max_bytes - cap ? max_bytes + 1 : 2 * cap;
            char *bigger = realloc(data, more + 1);
            if (!bigger) free(data);
            data = bigger;
            cap = more;
        }
    }
    if (rc == 0 && !data) rc = pp_fail(err, "%s %s: out of memory reading the file", what, path);
    if (rc == 0 && ferror(f)) rc = pp_fail(err, "%s %s: read error: %s", what, path, strerror(errno));
    fclose(f);
    if (rc != 0) {
        free(data);
        return -1;
    }
    data[n] = '\0';
    *buf = data, *len = n;
    return 0;
}

/* The folder and name of an output path: "a/b/c" is "a/b" and "c", "c" is
 * "." and "c", "/c" is "/" and "c". -1 for a path that names no file in a
 * folder ("", "a/"), or a name or a path too long. */
static int split_path(const char *path, const char *what, char *dir, size_t dcap, char *name, size_t ncap,
                      pp_err *err) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dlen = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
    if (!*base) return pp_fail(err, "%s %s: names a folder, not a file", what, *path ? path : "''");
    if (strlen(base) >= ncap || dlen + 2 > dcap) return pp_fail(err, "%s %s: the name is too long", what, path);
    if (slash) memcpy(dir, path, dlen), dir[dlen] = '\0';
    else snprintf(dir, dcap, ".");
    snprintf(name, ncap, "%s", base);
    return 0;
}

/* The target's folder (opened, to create and rename in it whatever
 * happens to the path meanwhile) and its name in it; the target must be
 * absent or a regular file. The folder's descriptor, or -1 with err. */
static int open_target(const char *path, const char *what, char *name, size_t ncap, pp_err *err) {
    char dir[4096];
    if (split_path(path, what, dir, sizeof dir, name, ncap, err) != 0) return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        if (errno == ENOENT) return pp_fail(err, "%s %s: the folder %s does not exist", what, path, dir);
        return pp_fail(err, "%s %s: cannot open the folder %s: %s", what, path, dir, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode))
            rc = pp_fail(err, "%s %s: is a symbolic link, not a regular file (pprun does not write through links: "
                              "name the file itself)", what, path);
        else if (!S_ISREG(st.st_mode))
            rc = pp_fail(err, "%s %s: is %s, not a regular file (pprun writes only regular files, and left it as "
                              "it is)", what, path, file_kind(st.st_mode));
    } else if (errno != ENOENT) {
        rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    }
    /* root may write there: a file of /sys that SQLite or a checkpoint
     * took for theirs would set the kernel's knob */
    struct statfs fs;
    if (rc == 0 && fstatfs(dfd, &fs) == 0 && is_pseudo_fs(&fs))
        rc = pp_fail(err, "%s %s: %s is a folder of /proc or /sys, not of files (pprun writes only regular files)",
                     what, path, dir);
    if (rc == 0 && faccessat(dfd, ".", W_OK, AT_EACCESS) != 0)
        rc = pp_fail(err, "%s %s: cannot write in the folder %s: %s", what, path, dir, strerror(errno));
    if (rc != 0) {
        close(dfd);
        return -1;
    }
    return dfd;
}

int file_output_check(const char *path, const char *what, pp_err *err) {
    char name[256];
    int dfd = open_target(path, what, name, sizeof name, err);
    if (dfd < 0) return -1;
    close(dfd);
    return 0;
}

int file_folder_check(const char *path, const char *what, pp_err *err) {
    char part[4096], deepest[4096]; /* deepest: the last part that is there */
    size_t n = strlen(path);
    if (n == 0) return pp_fail(err, "%s '': names no folder", what);
    if (n >= sizeof part) return pp_fail(err, "%s %.64s...: the path is too long", what, path);
    memcpy(part, path, n + 1);
    snprintf(deepest, sizeof deepest, "%s", path[0] == '/' ? "/" : ".");
    int missing = 0;
    /* each leading part in turn ("a", "a/b", "a/b/c") up to the first missing */
    for (size_t i = 1; i <= n && !missing; i++) {
        if (i < n && part[i] != '/') continue;
        char saved = part[i];
        part[i] = '\0';
        struct stat st;
        if (stat(part, &st) != 0) {
            if (errno != ENOENT) return pp_fail(err, "%s %s: %s: %s", what, path, part, strerror(errno));
            missing = 1; /* made then, with the parts below it */
        } else if (!S_ISDIR(st.st_mode)) {
            return pp_fail(err, "%s %s: %s is %s, not a directory", what, path, part, file_kind(st.st_mode));
        } else {
            memcpy(deepest, part, i + 1);
        }
        part[i] = saved;
    }
    if (access(deepest, W_OK | X_OK) != 0)
        return pp_fail(err, "%s %s: the folder %s is not writable: %s", what, path, deepest, strerror(errno));
    return !missing;
}

/* What a path names, to tell whether two paths are one file: the file's
 * device and inode when it is there (stat: a symbolic link is followed,
 * as a reader opening it would), else its folder's and its name (two
 * paths to a file neither has made yet are still one). 0 when neither
 * can be had (a folder that is not there): such a path is no file at all. */
typedef struct file_id {
    int there;       /* 1: the file's own; 2: its folder's and name */
    dev_t dev;
    ino_t ino;
    char name[256];
} file_id;

static int file_id_of(const char *path, file_id *id) {
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) == 0) {
        id->there = 1, id->dev = st.st_dev, id->ino = st.st_ino;
        return 1;
    }
    char dir[4096];
    pp_err ignored;
    if (split_path(path, "", dir, sizeof dir, id->name, sizeof id->name, &ignored) != 0 || stat(dir, &st) != 0)
        return 0;
    id->there = 2, id->dev = st.st_dev, id->ino = st.st_ino;
    return 1;
}

/* Whether the folder of output path, or a folder above it, is directory
 * `in` (device, inode): walked up from the folder's real path. */
static int inside(const char *path, dev_t dev, ino_t ino) {
    char dir[4096], name[256], real[PATH_MAX];
    pp_err ignored;
    if (split_path(path, "", dir, sizeof dir, name, sizeof name, &ignored) != 0 || !realpath(dir, real)) return 0;
    for (;;) {
        struct stat st;
        if (stat(real, &st) == 0 && st.st_dev == dev && st.st_ino == ino) return 1;
        char *slash = strrchr(real, '/');
        if (!slash || slash == real) {
            if (strcmp(real, "/") == 0) return 0;
            snprintf(real, sizeof real, "/");
        } else {
            *slash = '\0';
        }
    }
}

int file_output_not_input(const char *path, const char *what, const char *in, const char *in_what, unsigned flags,
                          pp_err *err) {
    if (!path || !*path || !in || !*in || strcmp(path, "-") == 0) return 0;
    file_id out_id, in_id;
    if (!file_id_of(path, &out_id) || !file_id_of(in, &in_id)) return 0;
    int same = out_id.there == in_id.there && out_id.dev == in_id.dev && out_id.ino == in_id.ino &&
               (out_id.there == 1 || strcmp(out_id.name, in_id.name) == 0);
    /* "--schedule csv:" and its file read as the user wrote them */
    const char *sep = *in_what && in_what[strlen(in_what) - 1] == ':' ? "" : " ";
    if (same)
        return pp_fail(err, "%s %s: is the same file as %s%s%s, which this command %s; name another file (nothing "
                            "was changed)", what, path, in_what, sep, in,
                       flags & FILE_INPUT_WRITTEN ? "also writes: one would overwrite the other"
                                                  : "reads: writing it would replace that input");
    struct stat st;
    if ((flags & FILE_INPUT_DIR) && stat(in, &st) == 0 && S_ISDIR(st.st_mode) && inside(path, st.st_dev, st.st_ino))
        return pp_fail(err, "%s %s: is inside %s%s%s, which this command reads: writing there could replace what "
                            "it reads (its latest pointer, its step folders); name a file outside it (nothing was "
                            "changed)", what, path, in_what, sep, in);
    return 0;
}

/* A name nobody can guess: 12 hex digits from getrandom (the clock and
 * the pid if that fails; O_EXCL is what keeps a planted file out). */
static void random_tag(char out[13]) {
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        uint64_t x = pp_now_ns() ^ (uint64_t)getpid() << 40;
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(x >> (8 * i));
    }
    for (size_t i = 0; i < sizeof r; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
}

/* Standard output's content, held until commit in a file that has no
 * name (O_TMPFILE; where the file system has none, one made by mkstemp and
 * unlinked at once): on disk, not in memory, as a whole trace runs to
 * gigabytes; gone with the process however it ends. */
static int spool_begin(file_output *o, pp_err *err) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/') tmp = "/tmp";
    int fd = open(tmp, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        char name[PATH_MAX];
        if (snprintf(name, sizeof name, "%s/pprun-out-XXXXXX", tmp) >= (int)sizeof name) errno = ENAMETOOLONG;
        else if ((fd = mkostemp(name, O_CLOEXEC)) >= 0) unlink(name);
    }
    if (fd < 0 || !(o->f = fdopen(fd, "w+"))) {
        int eno = errno;
        if (fd >= 0) close(fd);
        return pp_fail(err, "standard output: cannot make a temporary file under %s to hold it until it is whole "
                            "($TMPDIR): %s", tmp, strerror(eno));
    }
    o->to_stdout = 1;
    snprintf(o->tmp, sizeof o->tmp, "%s", tmp);
    return 0;
}

/* The held content onto stdout, and the file closed. A short write to
 * stdout stops the copy: main reports stdout's error. */
static int spool_commit(file_output *o, pp_err *err) {
    errno = 0;
    int ok = fflush(o->f) == 0 && !ferror(o->f) && fseeko(o->f, 0, SEEK_SET) == 0;
    char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, o->f)) > 0)
        if (fwrite(buf, 1, n, stdout) != n) break;
    if (ok && ferror(o->f)) ok = 0;
    int eno = errno;
    fclose(o->f);
    o->f = NULL;
    o->to_stdout = 0;
    if (!ok)
        return pp_fail(err, "standard output: holding it in a temporary file ($TMPDIR) failed: %s",
                       eno ? strerror(eno) : "write error");
    return 0;
}

int file_output_begin(file_output *o, const char *path, const char *what, unsigned flags, pp_err *err) {
    memset(o, 0, sizeof *o);
    o->dir = -1;
    o->path = path, o->what = what;
    if ((flags & FILE_OUTPUT_DASH) && strcmp(path, "-") == 0) return spool_begin(o, err);
    if ((o->dir = open_target(path, what, o->name, sizeof o->name, err)) < 0) return -1;
    for (int tries = 0; tries < 100; tries++) {
        char tag[13];
        random_tag(tag);
        snprintf(o->tmp, sizeof o->tmp, "%.200s.%s.tmp", o->name, tag);
        int fd = openat(o->dir, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        /* a file replaced keeps its permissions (a trace kept 0600 stays
         * 0600), from the start: the new content is never more open */
        struct stat old;
        if (fd >= 0 && fstatat(o->dir, o->name, &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(old.st_mode) &&
            fchmod(fd, old.st_mode & 0777) != 0) {
            int eno = errno;
            close(fd);
            unlinkat(o->dir, o->tmp, 0);
            o->tmp[0] = '\0';
            file_output_abort(o);
            return pp_fail(err, "%s %s: cannot give the new file the old one's permissions: %s", what, path,
                           strerror(eno));
        }
        if (fd >= 0 && (o->f = fdopen(fd, "w"))) return 0;
        int eno = errno;
        if (fd >= 0) {
            close(fd);
            unlinkat(o->dir, o->tmp, 0);
        }
        if (fd >= 0 || eno != EEXIST) {
            o->tmp[0] = '\0';
            file_output_abort(o);
            return pp_fail(err, "%s %s: cannot create a file beside it: %s", what, path, strerror(eno));
        }
    }
    o->tmp[0] = '\0';
    file_output_abort(o);
    return pp_fail(err, "%s %s: cannot create a temporary file beside it: every name tried was taken", what, path);
}

int file_output_commit(file_output *o, pp_err *err) {
    if (o->to_stdout) return spool_commit(o, err);
    errno = 0;
    int ok = fflush(o->f) == 0 && !ferror(o->f) && fsync(fileno(o->f)) == 0;
    int eno = errno;
    if (fclose(o->f) != 0 && ok) ok = 0, eno = errno;
    o->f = NULL;
    int rc = 0;
    if (!ok) rc = pp_fail(err, "%s %s: writing it failed: %s", o->what, o->path, eno ? strerror(eno) : "write error");
    /* Checked again just before the rename: what appeared at the target
     * meanwhile is refused as it would have been at the start. */
    char name[256];
    int again = rc == 0 ? open_target(o->path, o->what, name, sizeof name, err) : -1;
    if (again >= 0) close(again);
    else rc = -1;
    if (rc == 0 && renameat(o->dir, o->tmp, o->dir, o->name) != 0)
        rc = pp_fail(err, "%s %s: cannot rename the finished file into place: %s", o->what, o->path, strerror(errno));
    if (rc == 0) {
        o->tmp[0] = '\0';
        fsync(o->dir); /* the rename itself, on disk */
    }
    file_output_abort(o);
    return rc;
}

void file_output_abort(file_output *o) {
    if (o->dir < 0) {
        if (o->to_stdout) fclose(o->f); /* nothing of it reaches stdout */
        o->f = NULL, o->to_stdout = 0;
        return;
    }
    if (o->f) fclose(o->f);
    if (o->tmp[0]) unlinkat(o->dir, o->tmp, 0);
    close(o->dir);
    o->f = NULL, o->dir = -1, o->tmp[0] = '\0';
}

/* TARGET.<12 hex>.tmp, as file_output_begin names its temporary file
 * (random_tag): TARGET into target (cap bytes); 0 for any other name. */
static int temp_target(const char *name, char *target, size_t cap) {
    static const char tail[] = ".tmp";
    size_t n = strlen(name), tag = 12, tl = sizeof tail - 1;
    if (n < 1 + 1 + tag + tl || strcmp(name + n - tl, tail) != 0) return 0;
    size_t dot = n - tl - tag - 1;
    if (name[dot] != '.') return 0;
    for (size_t i = dot + 1; i < dot + 1 + tag; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
    if (dot >= cap) return 0;
    memcpy(target, name, dot);
    target[dot] = '\0';
    return 1;
}

int file_output_sweep(const char *dir, int (*is_target)(const char *name), pp_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the caller's folder; nothing in it followed */
    if (fd < 0) return errno == ENOENT ? 0 : pp_fail(err, "%s: cannot open the folder: %s", dir, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return pp_fail(err, "%s: cannot read the folder: %s", dir, strerror(errno));
    }
    int removed = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char target[256];
        struct stat st;
        if (!temp_target(e->d_name, target, sizeof target) || !is_target(target)) continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
        else if (errno != ENOENT && rc == 0)
            rc = pp_fail(err, "%s/%s: cannot remove it: %s", dir, e->d_name, strerror(errno));
    }
    closedir(d);
    return rc != 0 ? -1 : removed;
}

int file_output_stream(const char *path, const char *what, int truncate, pp_err *err) {
    if (file_output_check(path, what, err) != 0) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (truncate ? 0 : O_APPEND),
                  0666);
    if (fd < 0) {
        if (errno == ELOOP) return pp_fail(err, "%s %s: is a symbolic link, not a regular file", what, path);
        return pp_fail(err, "%s %s: cannot open it for writing: %s", what, path, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = pp_fail(err, "%s %s: is %s, not a regular file", what, path, file_kind(st.st_mode));
    else if ((truncate && ftruncate(fd, 0) != 0) || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    if (rc != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- Private folders ------------------------------------------------------- */

int file_private_dir_create(const char *prefix, char *out, size_t cap, pp_err *err) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/') tmp = "/tmp";
    if (snprintf(out, cap, "%s/%sXXXXXX", tmp, prefix) >= (int)cap)
        return pp_fail(err, "a private folder under %s: the path is too long", tmp);
    if (!mkdtemp(out)) return pp_fail(err, "cannot make a private folder under %s: %s", tmp, strerror(errno));
    return 0;
}

/* Everything in the folder open at fd (closed here), depth folders deep;
 * path is that folder's, for the messages. */
static int remove_within(int fd, int depth, const char *path, pp_err *err) {
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return pp_fail(err, "%s: %s", path, strerror(errno));
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) continue;
        if (errno != EISDIR) {
            rc = pp_fail(err, "%s/%s: cannot remove it: %s", path, e->d_name, strerror(errno));
            break;
        }
        char inner[4096]; /* for messages only: the removal goes by descriptors */
        if (snprintf(inner, sizeof inner, "%s/%s", path, e->d_name) >= (int)sizeof inner) {
            rc = pp_fail(err, "%s/%s: the path is longer than %zu bytes", path, e->d_name, sizeof inner - 1);
            break;
        }
        if (depth >= 8) {
            rc = pp_fail(err, "%s: folders nest more than 8 deep", inner);
            break;
        }
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) rc = pp_fail(err, "%s: %s", inner, strerror(errno));
        else if ((rc = remove_within(sub, depth + 1, inner, err)) == 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR))
            rc = pp_fail(err, "%s: cannot remove it: %s", inner, strerror(errno));
        if (rc == 0) rewinddir(d); /* entries may have moved under readdir */
    }
    closedir(d);
    return rc;
}

int file_private_dir_remove(const char *path, pp_err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return pp_fail(err, "%s: not a folder pprun can open: %s", path, strerror(errno));
    if (remove_within(fd, 0, path, err) != 0) return -1;
    if (rmdir(path) != 0) return pp_fail(err, "%s: cannot remove it: %s", path, strerror(errno));
    return 0;
}

/* ---- Text for the terminal ------------------------------------------------ */
