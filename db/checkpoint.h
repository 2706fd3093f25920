/* checkpoint.h: the writer's WAL copied into the database file on a thread
 * of its own (docs/schema.md, "Writing, versions, concurrency").
 *
 * SQLite's automatic checkpoint runs inside the COMMIT that passes 1000
 * pages of WAL, on the writer's thread: a quarter to a third of the
 * collector's time at ingest (bench/trace.c). Here the writer only kicks
 * this thread, which checkpoints through a connection of its own while
 * the writer fills the next batch; the WAL file starts over at the next
 * commit after a checkpoint that caught up. When the thread falls behind
 * and the WAL passes CHECKPOINT_WAL_MAX pages, the writer waits for it and
 * checkpoints itself, so the WAL stays bounded as with SQLite's own.
 *
 * One per db handle (db_open). The writer's connection must not be used
 * from two threads at once; this one never touches it. */
#ifndef PP_DB_CHECKPOINT_H
#define PP_DB_CHECKPOINT_H
#include <sqlite3.h>

#include "base/pp.h"

/* SQLite's own threshold (SQLITE_DEFAULT_WAL_AUTOCHECKPOINT). */
#define CHECKPOINT_WAL_PAGES 1000
/* Past this, the writer checkpoints itself: 64k pages, 256 MiB at 4 KiB. */
#define CHECKPOINT_WAL_MAX 65536
/* How long the thread's connection waits for a lock when it first reads
 * the file (db.c's writer waits as long). */
#define CHECKPOINT_BUSY_MS 5000

typedef struct checkpoint checkpoint;

/* Opens a second connection to path and starts the thread; installs the
 * WAL hook on writer (replacing SQLite's automatic checkpoint). A file not
 * in WAL mode (in memory) needs none: *out is NULL and 0 is returned. */
int checkpoint_start(sqlite3 *writer, const char *path, checkpoint **out, pp_err *err);
/* Stops the thread (after the checkpoint it is running) and closes its
 * connection; the writer's own close then checkpoints what is left, as
 * SQLite does for the last connection. NULL: nothing. */
void checkpoint_stop(checkpoint *c);

#endif
