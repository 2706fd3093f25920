/* stats_json.c: `pprun stats --format json`: the API's answers without a
 * server. The same route code fills each body as for GET /api/..., so a
 * script reads from the terminal exactly what the dashboard reads. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "web/http.h"
#include "web/routes.h"

/* r's error message into err (r is not a 200). */
static int reply_fail(const http_reply *r, pp_err *err) {
    cJSON *body = r->body ? cJSON_ParseWithLength(r->body, r->len) : NULL;
    const cJSON *msg = cJSON_GetObjectItem(body, "error");
    pp_fail(err, "%s", cJSON_IsString(msg) ? msg->valuestring : "out of memory");
    cJSON_Delete(body);
    return -1;
}

int http_stats_json(sqlite3 *db, long job, long vs, char **json, size_t *len, pp_err *err) {
    *json = NULL;
    *len = 0;
    http_reply parts[3] = {{0}};
    job_info j;
    int ret = 0;
    if (routes_load_job(db, job, &j, &parts[0]) != 0) {
        ret = reply_fail(&parts[0], err);
    } else if (vs > 0) {
        routes_compare(db, &j, vs, &parts[0]);
        if (parts[0].status != 200) ret = reply_fail(&parts[0], err);
        else *json = parts[0].body, *len = parts[0].len, parts[0].body = NULL;
    } else {
        static const char *const keys[3] = {"summary", "whatif", "critpath"};
        route_summary(db, &j, &parts[0]);
        route_whatif(db, &j, &parts[1]);
        routes_critpath(db, &j, -1, &parts[2]);
        jw w;
        jw_init(&w);
        jw_obj(&w);
        jw_kint(&w, "job", job);
        for (int k = 0; ret == 0 && k < 3; k++) {
            if (parts[k].status != 200) {
                ret = reply_fail(&parts[k], err);
                break;
            }
            jw_key(&w, keys[k]);
            jw_json(&w, parts[k].body, parts[k].len);
        }
        jw_obj_end(&w);
        if (ret == 0 && !(*json = jw_take(&w, len))) ret = pp_fail(err, "out of memory");
        jw_free(&w);
    }
    for (int k = 0; k < 3; k++) free(parts[k].body);
    return ret;
}
