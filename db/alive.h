/* alive.h: is a job's launcher still there (alive.c)? `pprun run` records
 * who its launcher is in the job's config_json; readers on the same machine
 * tell a `running` job whose launcher is gone, and call it `lost`. */
#ifndef PP_DB_ALIVE_H
#define PP_DB_ALIVE_H
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stddef.h>

enum { ALIVE_UNKNOWN = 0, ALIVE_YES, ALIVE_GONE };

/* Adds "launcher": {host, boot_id, pid_ns, pid, start} for this process to
 * config. 0, or -1 when /proc cannot say (or out of memory). */
int alive_identity(cJSON *config);
/* Whether the launcher a config_json names is running: ALIVE_YES, ALIVE_GONE
 * (why, when not NULL, says how we know), or ALIVE_UNKNOWN (no launcher
 * recorded, another machine or pid namespace). */
int alive_check(const char *config_json, char *why, size_t n);
/* Registers on db the SQL functions pprun_job_status(status, config_json)
 * ('lost' for a running job whose launcher is gone, else status) and
 * pprun_job_failure(status, config_json, failure) (why it is lost, else
 * failure). 0 or -1. */
int alive_register(sqlite3 *db);
/* A job's status and failure as readers show them, for a SELECT over jobs
 * (prefix: the table's alias and a dot, or ""). */
#define SQL_JOB_STATUS(prefix) "pprun_job_status(" prefix "status, " prefix "config_json)"
#define SQL_JOB_FAILURE(prefix) "pprun_job_failure(" prefix "status, " prefix "config_json, " prefix "failure)"

#endif
