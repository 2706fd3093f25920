/* cmd_serve_query.c: `pprun serve-query`: one POST /api/sql query, which
 * the server (`pprun serve`, `pprun run --serve`) runs in a process of its
 * own and kills at its deadline (web/sqlproc.h). Not for users, and not
 * listed by `pprun --help`. */
#include "runner/cmd/cli.h"
#include "web/sqlproc.h"

int cmd_serve_query(int argc, char **argv) { return sqlproc_child_main(argc, argv); }
