/* checkpoint.c: the WAL checkpointed off the writer's thread (checkpoint.h).
 *
 * The writer's WAL hook runs after each of its commits with the WAL's size
 * in pages; past CHECKPOINT_WAL_PAGES it sets `kicked` and signals. The
 * thread runs a PASSIVE checkpoint (it copies what no reader still needs
 * and never waits for a lock) and sleeps again. */
#include "db/checkpoint.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct checkpoint {
    sqlite3 *writer, *own;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* kicked, stop or !busy changed */
    int kicked, stop, busy;
};

static void *checkpoint_main(void *arg) {
    checkpoint *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->kicked && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) break;
        c->kicked = 0;
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        /* Errors (a full disk) leave the pages in the WAL, where readers
         * find them and the next checkpoint tries again: as SQLite's own
         * automatic checkpoint, which reports nothing either. */
        sqlite3_wal_checkpoint_v2(c->own, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* On the writer's thread, after each commit, with the WAL's size in pages. */
static int wal_hook(void *arg, sqlite3 *writer, const char *schema, int pages) {
    checkpoint *c = arg;
    if (pages < CHECKPOINT_WAL_PAGES) return SQLITE_OK;
    pthread_mutex_lock(&c->mu);
    if (pages < CHECKPOINT_WAL_MAX) {
        c->kicked = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return SQLITE_OK;
    }
    /* The thread cannot keep up: wait for its run to end (two checkpoints
     * at once: one gets SQLITE_BUSY) and copy everything from here, while
     * nothing is written. */
    while (c->busy) pthread_cond_wait(&c->cv, &c->mu);
    c->kicked = 0;
    pthread_mutex_unlock(&c->mu);
    sqlite3_wal_checkpoint_v2(writer, schema, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
}

/* Whether connection s reads its file as in WAL mode (PRAGMA journal_mode
 * reads the header, so it also puts a fresh connection in that mode). */
static int own_is_wal(sqlite3 *s) {
    sqlite3_stmt *st;
    int wal = 0;
    if (sqlite3_prepare_v2(s, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK) {
        wal = sqlite3_step(st) == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), "wal") == 0;
        sqlite3_finalize(st);
    }
    return wal;
}

int checkpoint_start(sqlite3 *writer, const char *path, checkpoint **out, pp_err *err) {
    *out = NULL;
    if (!own_is_wal(writer)) return 0;
    checkpoint *c = calloc(1, sizeof *c);
    if (!c) return pp_fail(err, "%s: out of memory", path);
    c->writer = writer;
    /* The file as the writer named it: its own URI parameters too. */
    const char *file = sqlite3_db_filename(writer, "main");
    int rc = sqlite3_open_v2(file && file[0] ? file : path, &c->own, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        pp_fail(err, "%s: cannot open a connection for checkpoints: %s", path,
                c->own ? sqlite3_errmsg(c->own) : sqlite3_errstr(rc));
        sqlite3_close(c->own);
        free(c);
        return -1;
    }
    /* A connection knows its file is in WAL mode once it has read the
     * header: until then sqlite3_wal_checkpoint_v2 on it returns
     * SQLITE_OK having done nothing (its log and checkpointed counts -1),
     * and every job's WAL grew to CHECKPOINT_WAL_MAX pages (256 MiB) before
     * the writer copied it in. */
    sqlite3_busy_timeout(c->own, CHECKPOINT_BUSY_MS); /* reading the header waits out a recovery, as db_open */
    if (!own_is_wal(c->own)) {
        int code = sqlite3_errcode(c->own);
        pp_fail(err, "%s: the checkpoint connection does not see the file in WAL mode%s%s", path,
                code != SQLITE_OK && code != SQLITE_DONE && code != SQLITE_ROW ? ": " : "",
                code != SQLITE_OK && code != SQLITE_DONE && code != SQLITE_ROW ? sqlite3_errmsg(c->own) : "");
        sqlite3_close(c->own);
        free(c);
        return -1;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    rc = pthread_create(&c->thread, NULL, checkpoint_main, c);
    if (rc != 0) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        sqlite3_close(c->own);
        free(c);
        return pp_fail(err, "%s: cannot start the checkpoint thread: %s", path, strerror(rc));
    }
    sqlite3_wal_hook(writer, wal_hook, c);
    *out = c;
    return 0;
}

void checkpoint_stop(checkpoint *c) {
    if (!c) return;
    sqlite3_wal_hook(c->writer, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    sqlite3_close(c->own);
    free(c);
}
