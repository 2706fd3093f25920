/* routes_sql.c: POST /api/sql (docs/api.md): a user's read-only query
 * (db/usersql.h) under the server's limits, its result as
 * report_sql_table writes it. The body is read on a worker of the SQL pool
 * (sqlpool.c), which runs the query in a process of its own (sqlproc.h)
 * and waits for it: it may take its whole time limit. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "db/usersql.h"
#include "web/routes.h"
#include "web/sqlproc.h"

/* What is wrong with the members of a parsed body (an object), or NULL:
 * a member given twice (cJSON would use the first silently), one that is
 * neither "sql" nor "max_rows" (a misspelt "max_row" would be ignored), or
 * a \u0000 in a string (cJSON's copy ends there: the SQL would be cut short
 * unseen). body is valid JSON here, so every backslash starts an escape. */
static const char *body_members_bad(const cJSON *req, const char *body, size_t len, char *msg, size_t msgsz) {
    if (!cJSON_IsObject(req)) return NULL; /* answered below */
    const cJSON *m;
    cJSON_ArrayForEach(m, req) {
        if (strcmp(m->string, "sql") != 0 && strcmp(m->string, "max_rows") != 0) {
            snprintf(msg, msgsz, "unknown member \"%.40s\" in the body: it takes \"sql\" and \"max_rows\"", m->string);
            return msg;
        }
        for (const cJSON *o = req->child; o != m; o = o->next)
            if (strcmp(o->string, m->string) == 0) {
                snprintf(msg, msgsz, "\"%s\" is given twice in the body", m->string);
                return msg;
            }
    }
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && strncmp(body + i + 2, "0000", 4) == 0)
            return "the body holds a \\u0000 (NUL) character: SQL cannot contain one";
        i++; /* the escaped character */
    }
    return NULL;
}

/* On a worker of the SQL pool: the query of q's body ({"sql": ...,
 * "max_rows": N}) run in a process of its own under the server's limits. */
static void sql_query(route_req *q, reply *r) {
    const http_options *o = &q->s->o;
    const char *body = q->body;
    size_t len = q->len;
    /* body is our own NUL-terminated copy of exactly len bytes: the NUL is
     * part of what cJSON may read, so that it can require it right after the
     * value (and whitespace); a NUL inside the body ends it early, caught by
     * the end check. */
    const char *nul = memchr(body, 0, len);
    if (nul) { /* inside a string cJSON would take it, and the SQL would end there unseen */
        reply_error(r, 400, "the body holds a NUL byte at byte %zu: send {\"sql\": \"SELECT ...\"}",
                    (size_t)(nul - body));
        return;
    }
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);
    if (!req || end != body + len) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        if (req) reply_error(r, 400, "unexpected text after the JSON body at byte %zu: send one {\"sql\": ...} object", at);
        else reply_error(r, 400, "malformed JSON body near byte %zu: send {\"sql\": \"SELECT ...\"}", at);
        cJSON_Delete(req);
        return;
    }
    char msg[160];
    const char *bad = body_members_bad(req, body, len, msg, sizeof msg);
    if (bad) {
        reply_error(r, 400, "%s", bad);
        cJSON_Delete(req);
        return;
    }
    const cJSON *sql = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "sql") : NULL;
    const cJSON *mr = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "max_rows") : NULL;
    if (!cJSON_IsString(sql) || !sql->valuestring) {
        cJSON_Delete(req);
        reply_error(r, 400, "the body must be a JSON object with a string member \"sql\"");
        return;
    }
    /* The raw result is capped as it is read, the JSON as it is written:
     * escaping makes it up to 6 times larger (a control char is \u00XX). */
    usersql_limits lim = {.max_rows = o->sql_max_rows, .time_limit_ns = o->sql_time_limit_ns,
                          .max_bytes = o->sql_max_bytes, .max_mem = o->sql_max_mem};
    if (mr) {
        if (!cJSON_IsNumber(mr) || mr->valuedouble < 1 || mr->valuedouble > (double)o->sql_max_rows ||
            mr->valuedouble != (double)(size_t)mr->valuedouble) {
            cJSON_Delete(req);
            reply_error(r, 400, "\"max_rows\" must be an integer from 1 to %zu", o->sql_max_rows);
            return;
        }
        lim.max_rows = (size_t)mr->valuedouble;
    }
    sqlproc_run(&q->s->sqlprocs, q->s->sql_exe, q->s->pool.path, sql->valuestring, &lim, r);
    cJSON_Delete(req);
}

void route_sql(route_req *q, reply *r) {
    (void)r;
    q->then = sql_query; /* all of it on a worker: the body is parsed there too */
}
