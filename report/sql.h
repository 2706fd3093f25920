/* sql.h: SQL results as JSON: a user's query (db/usersql.h), and a row of
 * a statement as it steps. */
#ifndef PP_REPORT_SQL_H
#define PP_REPORT_SQL_H
#include <sqlite3.h>

#include "base/json.h"
#include "db/usersql.h"

/* An array of row objects (`pprun query --format json`), a key per
 * column: its name, and a name a column before it has as "name:2",
 * "name:3"... (a join's two start_ns: JSON readers keep only the last of
 * two equal keys). 0, or -1 out of memory (w unchanged). */
int report_sql_objects(jw *w, const usersql_result *r);
/* {"columns":[...],"rows":[[...]],"row_count":N,"truncated":B} (POST
 * /api/sql); stops and returns -1 once the text passes max_len bytes (0: no
 * limit); 0 otherwise. */
int report_sql_table(jw *w, const usersql_result *r, size_t max_len);
/* The current row of st as an object, its keys the columns' names. */
void report_sql_row(jw *w, sqlite3_stmt *st);
/* One of its members: column c's name, then its value. */
void report_sql_cell(jw *w, sqlite3_stmt *st, int c);
/* ",<col>" appended to a row array written raw (jw_rawf "[1,2,3"): the
 * text of st's column col as a JSON string, or null (the timeline's rows
 * end with an event's name). */
void report_sql_raw_text_cell(jw *w, sqlite3_stmt *st, int col);

#endif
