/* dbpool.c: read-only SQLite connections for the request threads. Opening
 * a connection costs more than most API queries, so they are kept. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db.h"
#include "db/usersql.h"
#include "web/dbpool.h"

int dbpool_init(dbpool *p, const char *path, pp_err *err) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->path = strdup(path);
    if (!p->path) return pp_fail(err, "out of memory");
    /* Open one now so a bad path fails at start, not at the first request. */
    sqlite3 *db = dbpool_get(p, err);
    if (!db) {
        dbpool_close(p);
        return -1;
    }
    /* The routes read pprun's tables: a newer schema or another SQLite
     * file is refused as pprun stats and export refuse it. */
    int64_t version;
    char named[4200]; /* as usersql_open names it */
    snprintf(named, sizeof named, "--db %s", path);
    int rc = db_check_version(db, named, &version, err);
    if (rc == 0 && version == 0) rc = pp_fail(err, "%s: empty file, not a pprun trace database", named);
    if (rc != 0) {
        db_reader_close(db);
        dbpool_close(p);
        return -1;
    }
    dbpool_put(p, db);
    return 0;
}

sqlite3 *dbpool_get(dbpool *p, pp_err *err) {
    pthread_mutex_lock(&p->mu);
    sqlite3 *db = p->nidle > 0 ? p->idle[--p->nidle] : NULL;
    pthread_mutex_unlock(&p->mu);
    /* A kept connection outlives a writer's migration of the file. */
    if (db && db_reader_refresh(db) == 0) return db;
    db_reader_close(db);
    if (usersql_open(p->path, &db, err) != 0) return NULL;
    return db;
}

void dbpool_put(dbpool *p, sqlite3 *db) {
    if (!db) return;
    pthread_mutex_lock(&p->mu);
    if (p->nidle < (int)(sizeof p->idle / sizeof p->idle[0])) {
        p->idle[p->nidle++] = db;
        db = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    if (db) db_reader_close(db);
}

void dbpool_close(dbpool *p) {
    for (int i = 0; i < p->nidle; i++) db_reader_close(p->idle[i]);
    p->nidle = 0;
    free(p->path);
    p->path = NULL;
    pthread_mutex_destroy(&p->mu);
}
