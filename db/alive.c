/* alive.c: is a job's launcher still there? A job's row says `running`
 * until its launcher records how the job ended, and a launcher killed by
 * SIGKILL or the OOM killer, or whose machine went down, never does (nor
 * one that cannot write the database any more: a full disk). So
 * `pprun run` records who its launcher is (config_json "launcher": host,
 * boot id, pid namespace, pid and the process's start time), and a reader
 * on the same machine can tell when that process is gone: the job is then
 * `lost`. Readers show it so (the SQL functions below, used by the API,
 * the dashboard and `pprun stats`); the next `pprun run` on the file
 * stores it (db_mark_lost).
 *
 * The start time tells a reused pid from the launcher; the boot id a
 * machine that restarted; a reader on another machine or in another pid
 * namespace (a container) cannot tell, and shows what is stored. */
#include "db/alive.h"

#include "base/net.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* This boot of this machine: a new id at each boot. */
#define BOOT_ID "/proc/sys/kernel/random/boot_id"

/* The first line of a small file, without its newline; 0 or -1. */
static int read_line(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

/* A process's state letter and start time (clock ticks after boot) from
 * /proc/PID/stat; its name, in parentheses, may hold spaces and ')', so
 * fields are counted from the last ')'. 0, or -1 when there is no such
 * process. */
static int proc_start(const char *pid, char *state, unsigned long long *start) {
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    if (read_line(path, line, sizeof line) != 0) return -1;
    const char *p = strrchr(line, ')');
    if (!p) return -1;
    /* after ')': state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime cutime
     * cstime priority nice num_threads itrealvalue starttime(22) */
    if (sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", state,
               start) != 2)
        return -1;
    return 0;
}

static int pid_namespace(char *buf, size_t n) {
    ssize_t k = readlink("/proc/self/ns/pid", buf, n - 1);
    if (k <= 0) return -1;
    buf[k] = 0;
    return 0;
}

int alive_identity(cJSON *config) {
    char host[256], boot[64], ns[64], state;
    unsigned long long start;
    if (net_host_name(host, sizeof host) != 0 || read_line(BOOT_ID, boot, sizeof boot) != 0 ||
        pid_namespace(ns, sizeof ns) != 0 || proc_start("self", &state, &start) != 0)
        return -1;
    cJSON *l = cJSON_AddObjectToObject(config, "launcher");
    if (!l || !cJSON_AddStringToObject(l, "host", host) || !cJSON_AddStringToObject(l, "boot_id", boot) ||
        !cJSON_AddStringToObject(l, "pid_ns", ns) || !cJSON_AddNumberToObject(l, "pid", (double)getpid()) ||
        !cJSON_AddNumberToObject(l, "start", (double)start))
        return -1;
    return 0;
}

static const char *member(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int alive_check(const char *config_json, char *why, size_t n) {
    if (why && n) why[0] = 0;
    cJSON *o = config_json ? cJSON_Parse(config_json) : NULL;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "launcher");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(l, "pid");
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(l, "start");
    const char *host = member(l, "host"), *boot = member(l, "boot_id"), *ns = member(l, "pid_ns");
    char my_host[256], my_boot[64], my_ns[64], pidtext[32], state = 0;
    unsigned long long now_start = 0;
    int verdict = ALIVE_UNKNOWN;
    if (!host || !boot || !ns || !cJSON_IsNumber(pid) || !cJSON_IsNumber(start) || pid->valuedouble < 1 ||
        net_host_name(my_host, sizeof my_host) != 0 || strcmp(host, my_host) != 0 ||
        read_line(BOOT_ID, my_boot, sizeof my_boot) != 0)
        goto out; /* written by an older pprun, or on another machine */
    snprintf(pidtext, sizeof pidtext, "%.0f", pid->valuedouble);
    if (strcmp(boot, my_boot) != 0) {
        verdict = ALIVE_GONE;
        if (why) snprintf(why, n, "its launcher (pid %s on %s) is gone: the machine restarted since", pidtext, host);
        goto out;
    }
    if (pid_namespace(my_ns, sizeof my_ns) != 0 || strcmp(ns, my_ns) != 0) goto out; /* its pids are not ours */
    if (proc_start(pidtext, &state, &now_start) == 0 && state != 'Z' && (double)now_start == start->valuedouble) {
        verdict = ALIVE_YES;
        goto out;
    }
    verdict = ALIVE_GONE;
    if (why)
        snprintf(why, n,
                 "its launcher (pid %s on %s) ended without recording how the job ended: it was killed (e.g. by "
                 "SIGKILL or the OOM killer), or it could not write the database (e.g. disk full)",
                 pidtext, host);
out:
    cJSON_Delete(o);
    return verdict;
}

/* Whether a job row (status, config_json) is a running job whose launcher
 * is gone; why, when not NULL, says how we know. */
static int sql_lost(sqlite3_value **argv, char *why, size_t n) {
    const char *status = (const char *)sqlite3_value_text(argv[0]);
    return status && strcmp(status, "running") == 0 &&
           alive_check((const char *)sqlite3_value_text(argv[1]), why, n) == ALIVE_GONE;
}

/* pprun_job_status(status, config_json): 'lost' for a 'running' job whose
 * launcher is gone, else status. */
static void sql_status(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    (void)argc;
    if (sql_lost(argv, NULL, 0)) sqlite3_result_text(ctx, "lost", -1, SQLITE_STATIC);
    else sqlite3_result_value(ctx, argv[0]);
}

/* pprun_job_failure(status, config_json, failure): why a lost job is lost,
 * else failure. */
static void sql_failure(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    (void)argc;
    char why[512];
    if (sql_lost(argv, why, sizeof why)) sqlite3_result_text(ctx, why, -1, SQLITE_TRANSIENT);
    else sqlite3_result_value(ctx, argv[2]);
}

int alive_register(sqlite3 *db) {
    /* Innocuous: they read /proc and change nothing, so views and user SQL
     * (SQLITE_DBCONFIG_TRUSTED_SCHEMA off) may call them. */
    int flags = SQLITE_UTF8 | SQLITE_INNOCUOUS;
    if (sqlite3_create_function(db, "pprun_job_status", 2, flags, NULL, sql_status, NULL, NULL) != SQLITE_OK ||
        sqlite3_create_function(db, "pprun_job_failure", 3, flags, NULL, sql_failure, NULL, NULL) != SQLITE_OK)
        return -1;
    return 0;
}
