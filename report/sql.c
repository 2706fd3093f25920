/* sql.c: SQL results as JSON (sql.h): a user's query for `pprun query
 * --format json` and POST /api/sql; a statement's row for the API's lists
 * (jobs, ranks, gaps, the plan's actions). */
#include "report/sql.h"

#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cell_json(jw *w, const usersql_cell *c) {
    switch (c->type) {
    case USERSQL_INT: jw_int(w, c->i); break;
    case USERSQL_REAL: jw_num(w, c->r); break;
    case USERSQL_TEXT: jw_strn(w, c->s, c->len); break;
    case USERSQL_BLOB: jw_hex(w, c->s, c->len); break;
    default: jw_null(w);
    }
}

/* Whether `key` is one of names[0..n) or keys[0..k) (keys[j] NULL: names[j]'s). */
static int key_taken(const char *key, char *const *names, int n, char *const *keys, int k) {
    for (int j = 0; j < n; j++)
        if (strcmp(names[j], key) == 0) return 1;
    for (int j = 0; j < k; j++)
        if (keys[j] && strcmp(keys[j], key) == 0) return 1;
    return 0;
}

/* s as the JSON writer writes it (base/json.c): each byte that is not
 * part of a UTF-8 character as U+FFFD; malloc'd, NULL when out of memory.
 * Two names that differ only there are one key in the JSON. */
static char *as_written(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = malloc(3 * n + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (len == 0)
            memcpy(out + o, "\xef\xbf\xbd", 3), o += 3, i++;
        else
            memcpy(out + o, s + i, len), o += len, i += len;
    }
    out[o] = '\0';
    return out;
}

int report_sql_objects(jw *w, const usersql_result *r) {
    /* names[c]: the column's name as written; keys[c]: NULL where that is
     * its key, else "name:N", the first N that no column is named and no
     * key before it took; next[j]: for the first column of a name, the N
     * its next namesake tries first (so the tries of all namesakes add up
     * to the columns, not their square: 2,000 columns of one name,
     * SQLite's most, took 25 s) */
    size_t n = r->ncols > 0 ? (size_t)r->ncols : 1;
    char **names = calloc(n, sizeof *names), **keys = calloc(n, sizeof *keys);
    int *next = calloc(n, sizeof *next);
    int rc = names && keys && next ? 0 : -1;
    for (int c = 0; c < r->ncols && rc == 0; c++)
        if (!(names[c] = as_written(r->cols[c]))) rc = -1;
    for (int c = 0; c < r->ncols && rc == 0; c++) {
        int first = 0;
        while (first < c && strcmp(names[first], names[c]) != 0)
            first++;
        next[c] = 2;
        if (first == c) continue;
        size_t len = strlen(names[c]) + 16;
        if (!(keys[c] = malloc(len))) rc = -1;
        while (rc == 0) {
            snprintf(keys[c], len, "%s:%d", names[c], next[first]++);
            if (!key_taken(keys[c], names, r->ncols, keys, c)) break;
        }
    }
    if (rc == 0) {
        jw_arr(w);
        for (size_t i = 0; i < r->nrows; i++) {
            jw_obj(w);
            for (int c = 0; c < r->ncols; c++) {
                jw_key(w, keys[c] ? keys[c] : names[c]);
                cell_json(w, usersql_cell_at(r, i, c));
            }
            jw_obj_end(w);
        }
        jw_arr_end(w);
    }
    for (int c = 0; c < r->ncols; c++) {
        if (names) free(names[c]);
        if (keys) free(keys[c]);
    }
    free(names);
    free(keys);
    free(next);
    return rc;
}

int report_sql_table(jw *w, const usersql_result *r, size_t max_len) {
    jw_obj(w);
    jw_key(w, "columns");
    jw_arr(w);
    for (int c = 0; c < r->ncols; c++) jw_str(w, r->cols[c]);
    jw_arr_end(w);
    jw_key(w, "rows");
    jw_arr(w);
    for (size_t i = 0; i < r->nrows; i++) {
        jw_arr(w);
        for (int c = 0; c < r->ncols; c++) cell_json(w, usersql_cell_at(r, i, c));
        jw_arr_end(w);
        if (max_len && w->len > max_len) return -1;
    }
    jw_arr_end(w);
    jw_kint(w, "row_count", (int64_t)r->nrows);
    jw_key(w, "truncated");
    jw_bool(w, r->truncated);
    jw_obj_end(w);
    return 0;
}

void report_sql_cell(jw *w, sqlite3_stmt *st, int c) {
    jw_key(w, sqlite3_column_name(st, c));
    switch (sqlite3_column_type(st, c)) {
    case SQLITE_INTEGER: jw_int(w, sqlite3_column_int64(st, c)); break;
    case SQLITE_FLOAT: jw_num(w, sqlite3_column_double(st, c)); break;
    case SQLITE_TEXT: jw_strn(w, (const char *)sqlite3_column_text(st, c), (size_t)sqlite3_column_bytes(st, c)); break;
    default: jw_null(w);
    }
}

void report_sql_row(jw *w, sqlite3_stmt *st) {
    jw_obj(w);
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n; c++) report_sql_cell(w, st, c);
    jw_obj_end(w);
}

void report_sql_raw_text_cell(jw *w, sqlite3_stmt *st, int col) {
    jw_raw(w, ",", 1);
    if (sqlite3_column_type(st, col) == SQLITE_NULL) {
        jw_raw(w, "null", 4);
        return;
    }
    w->first[w->depth] = 1; /* the comma is written: none of the writer's before the string */
    jw_strn(w, (const char *)sqlite3_column_text(st, col), (size_t)sqlite3_column_bytes(st, col));
}
