/* test_alive.c: telling a job whose launcher is gone (db/alive.c) from one
 * that runs, with real processes: a child records its identity the way
 * `pprun run` does, then runs, exits unreaped (a zombie) or is reaped; the
 * SQL functions over a real SQLite connection. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/alive.h"

/* A child that writes its config_json with its identity to the parent,
 * then waits until the parent closes *release. */
static pid_t identified_child(char *json, size_t n, int *release) {
    int out[2], hold[2];
    cr_assert_eq(pipe(out), 0);
    cr_assert_eq(pipe(hold), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(out[0]), close(hold[1]);
        cJSON *o = cJSON_CreateObject();
        char *text = alive_identity(o) == 0 ? cJSON_PrintUnformatted(o) : NULL;
        if (text) (void)!write(out[1], text, strlen(text));
        close(out[1]);
        char c;
        (void)!read(hold[0], &c, 1);
        _exit(0);
    }
    close(out[1]), close(hold[0]);
    ssize_t k, len = 0;
    while ((k = read(out[0], json + len, n - 1 - (size_t)len)) > 0) len += k;
    json[len] = 0;
    close(out[0]);
    cr_assert_gt(len, 0, "the child could not record its identity");
    *release = hold[1];
    return pid;
}

/* json with member `key` of its launcher replaced by `value` (a JSON text). */
static void with_launcher(const char *json, const char *key, const char *value, char *out, size_t n) {
    cJSON *o = cJSON_Parse(json);
    cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "launcher");
    cJSON_ReplaceItemInObjectCaseSensitive(l, key, cJSON_Parse(value));
    char *text = cJSON_PrintUnformatted(o);
    snprintf(out, n, "%s", text);
    free(text);
    cJSON_Delete(o);
}

Test(alive, a_running_launcher_then_a_zombie_then_a_reaped_one) {
    char json[2048], why[512];
    int release;
    pid_t pid = identified_child(json, sizeof json, &release);
    cr_assert_eq(alive_check(json, why, sizeof why), ALIVE_YES, "%s", json);
    close(release);
    /* exited, not yet reaped: dead all the same */
    for (int i = 0; i < 1000 && alive_check(json, NULL, 0) == ALIVE_YES; i++) usleep(10000);
    cr_assert_eq(alive_check(json, why, sizeof why), ALIVE_GONE);
    char want[128];
    snprintf(want, sizeof want, "its launcher (pid %d on ", (int)pid);
    cr_assert(strstr(why, want) && strstr(why, "ended without recording how the job ended"), "%s", why);
    waitpid(pid, NULL, 0);
    cr_assert_eq(alive_check(json, NULL, 0), ALIVE_GONE);
}

Test(alive, a_reused_pid_or_a_restarted_machine_is_gone) {
    char json[2048], other[2048], why[512];
    int release;
    pid_t pid = identified_child(json, sizeof json, &release);
    /* the same pid, started at another time: another process */
    with_launcher(json, "start", "1", other, sizeof other);
    cr_assert_eq(alive_check(other, NULL, 0), ALIVE_GONE, "%s", other);
    with_launcher(json, "boot_id", "\"00000000-0000-0000-0000-000000000000\"", other, sizeof other);
    cr_assert_eq(alive_check(other, why, sizeof why), ALIVE_GONE);
    cr_assert(strstr(why, "the machine restarted since"), "%s", why);
    close(release);
    waitpid(pid, NULL, 0);
}

/* Nothing is claimed where this machine cannot know. */
Test(alive, another_machine_another_pid_namespace_or_no_record_is_unknown) {
    char json[2048], other[2048];
    int release;
    pid_t pid = identified_child(json, sizeof json, &release);
    close(release);
    waitpid(pid, NULL, 0);
    with_launcher(json, "host", "\"some-other-host\"", other, sizeof other);
    cr_assert_eq(alive_check(other, NULL, 0), ALIVE_UNKNOWN);
    with_launcher(json, "pid_ns", "\"pid:[1]\"", other, sizeof other);
    cr_assert_eq(alive_check(other, NULL, 0), ALIVE_UNKNOWN);
    with_launcher(json, "pid", "\"12\"", other, sizeof other);
    cr_assert_eq(alive_check(other, NULL, 0), ALIVE_UNKNOWN, "a pid that is not a number");
    static const char *const unknown[] = {NULL, "", "not json", "{}", "{\"schedule\":\"1f1b\"}", "{\"launcher\":3}"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        cr_assert_eq(alive_check(unknown[i], NULL, 0), ALIVE_UNKNOWN, "%s", unknown[i] ? unknown[i] : "NULL");
}

static const char *one_text(sqlite3 *db, const char *sql, const char *json) {
    static char buf[512];
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, json, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(st, 0);
    snprintf(buf, sizeof buf, "%s", t ? (const char *)t : "NULL");
    sqlite3_finalize(st);
    return buf;
}

Test(alive, the_sql_functions_change_only_a_running_job_whose_launcher_is_gone) {
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(":memory:", &db), SQLITE_OK);
    cr_assert_eq(alive_register(db), 0);
    char json[2048];
    int release;
    pid_t pid = identified_child(json, sizeof json, &release);
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_status('running', ?1)", json), "running");
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_failure('running', ?1, NULL)", json), "NULL");
    close(release);
    waitpid(pid, NULL, 0);
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_status('running', ?1)", json), "lost");
    cr_assert(strstr(one_text(db, "SELECT pprun_job_failure('running', ?1, NULL)", json), "its launcher (pid "));
    /* a job that ended says what it recorded */
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_status('failed', ?1)", json), "failed");
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_failure('failed', ?1, 'rank 1 exited with code 1')", json),
                     "rank 1 exited with code 1");
    cr_assert_str_eq(one_text(db, "SELECT pprun_job_status('running', ?1)", "{}"), "running");
    sqlite3_close(db);
}
