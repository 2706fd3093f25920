/* test_web_host.c: who may ask the server (web/guard.h), over real
 * sockets: a page whose name was rebound to 127.0.0.1 (DNS rebinding: any
 * Host but the loopback names and those given with --allow-host is a 403
 * naming it and the option), a page of another site (an Origin other than
 * the server's own is a 403, whatever it asks; none is a navigation and
 * passes), and a body a page may send cross-site without a CORS preflight
 * (anything but Content-Type: application/json is a 415). With a token on
 * a public address the Host is free and the Origin still checked. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/usersql.h"
#include "helpers/web_client.h"
#include "helpers/web_fixture.h"
#include "web/http.h"

static char dbpath[256];
static http_server *srv;
static int port, serve_pid;

static void start_with(http_options o) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
    fixture_fresh(dbpath, sizeof dbpath, "webhost", 2, "succeeded");
    o.db_path = dbpath;
    if (!o.listen) o.listen = "127.0.0.1:0";
    o.sql_exe = PPRUN_BIN; /* this test program is not pprun: its queries run in pprun */
    cr_assert_eq(http_start(&o, &srv, &err), 0, "%s", err.msg);
    port = http_port(srv);
}

static void setup(void) { start_with((http_options){.conn_timeout_s = 5}); }

static void teardown(void) {
    if (serve_pid > 0) {
        kill(serve_pid, SIGTERM);
        waitpid(serve_pid, NULL, 0);
        serve_pid = 0;
    }
    http_stop(srv);
    srv = NULL;
    fixture_remove(dbpath);
}

TestSuite(web_host, .init = setup, .fini = teardown, .timeout = 60);

/* The exact request of the attack: a rebinding page's POST of text/plain. */
#define LEAK_SQL "{\"sql\":\"SELECT name, config_json FROM jobs\"}"

/* Sends `method path` with Host host (NULL: none, HTTP/1.0), the extra
 * headers and body (sent with its Content-Length), on a new connection. */
static void ask(const char *method, const char *path, const char *host, const char *headers, const char *body,
                webclient_resp *r) {
    char req[4096];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.%d\r\n", method, path, host ? 1 : 0);
    if (host) n += snprintf(req + n, sizeof req - (size_t)n, "Host: %s\r\n", host);
    n += snprintf(req + n, sizeof req - (size_t)n, "Connection: close\r\n%s", headers ? headers : "");
    if (body) n += snprintf(req + n, sizeof req - (size_t)n, "Content-Length: %zu\r\n", blen);
    n += snprintf(req + n, sizeof req - (size_t)n, "\r\n%s", body ? body : "");
    cr_assert_lt(n, (int)sizeof req);
    cr_assert_eq(webclient_raw(port, req, (size_t)n, r), 0);
}

#define JSON "Content-Type: application/json\r\n"

/* `method path` with Host host answers want, its body holding each of the
 * NULL-ended texts; returns nothing, fails naming the request. */
static void expect(const char *method, const char *path, const char *host, const char *headers, const char *body,
                   int want, const char *const *says) {
    webclient_resp r;
    ask(method, path, host, headers, body, &r);
    cr_assert_eq(r.status, want, "%s %s, Host %s, %s: %d %.400s", method, path, host ? host : "(none)",
                 headers ? headers : "", r.status, r.body);
    for (; says && *says; says++)
        cr_assert(strstr(r.body, *says), "%s %s, Host %s: no '%s' in %.400s", method, path, host ? host : "(none)",
                  *says, r.body);
    if (want >= 400) cr_assert(!strstr(r.body, "config_json") && !strstr(r.body, "fixture"), "%.400s", r.body);
    webclient_free(&r);
}

/* ---- Host: DNS rebinding ------------------------------------------------------ */

Test(web_host, a_rebound_name_is_refused_with_a_403_naming_the_host_and_the_option) {
    char host[128];
    snprintf(host, sizeof host, "attacker.example.com:%d", port);
    const char *says[] = {"Host 'attacker.example.com:", "is not a name of this server", "DNS rebinding",
                          "--allow-host attacker.example.com", NULL};
    /* the attack as it was found: a text/plain POST from the rebound page */
    char origin[256];
    snprintf(origin, sizeof origin, "Origin: http://%s\r\nContent-Type: text/plain\r\n", host);
    expect("POST", "/api/sql", host, origin, LEAK_SQL, 403, says);
    /* and every kind of route, read the plain way */
    static const char *const paths[] = {"/api/jobs", "/api/jobs/1", "/api/jobs/1/events", "/metrics", "/",
                                        "/app.js", "/nonexistent", "/api/nope"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) expect("GET", paths[i], host, NULL, NULL, 403, says);
    expect("POST", "/api/sql", host, JSON, LEAK_SQL, 403, says);
    /* names that only look local, and spellings of a host that are none */
    static const char *const hosts[] = {
        "attacker.example.com", "localhost.attacker.example.com", "127.0.0.1.nip.io", "localhost.",
        "localhostx",           "0177.0.0.1",                     "2130706433",       "127.1",
        "[::2]",                "[::1]x",                         "::1",              "[::1",
        "localhost:",           "localhost:80:80",                "localhost:123456", "localhost:8o",
        "[fe80::1]:80",         "0.0.0.0",                        "",                 "localhost:65536",
        "localhost:99999",      "localhost :80",
    };
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        const char *quoted[] = {"is not a name of this server", "--allow-host", NULL};
        expect("GET", "/api/jobs", hosts[i], NULL, NULL, 403, quoted);
    }
}

Test(web_host, every_loopback_host_form_is_accepted_in_any_case_with_or_without_a_port) {
    char forms[16][64];
    const char *fmt[] = {"localhost", "localhost:%d", "LocalHost:%d", "LOCALHOST", "127.0.0.1", "127.0.0.1:%d",
                         "127.255.0.9:1", "127.0.0.2:%d", "[::1]", "[::1]:%d", "[0:0:0:0:0:0:0:1]:%d",
                         "[::ffff:127.0.0.1]:%d", "[::FFFF:7f00:1]", "127.0.0.1:%d  ", "localhost\t"};
    size_t n = sizeof fmt / sizeof fmt[0];
    for (size_t i = 0; i < n; i++) snprintf(forms[i], sizeof forms[i], fmt[i], port);
    for (size_t i = 0; i < n; i++) {
        const char *says[] = {"\"jobs\"", NULL};
        expect("GET", "/api/jobs", forms[i], NULL, NULL, 200, says);
        const char *rows[] = {"[[42]]", NULL};
        expect("POST", "/api/sql", forms[i], JSON, "{\"sql\":\"SELECT 42\"}", 200, rows);
        expect("GET", "/", forms[i], NULL, NULL, 200, NULL);
    }
    /* HTTP/1.0 without a Host: no browser sends one (frame.c requires it of
     * HTTP/1.1), so it is no rebinding page */
    expect("GET", "/api/jobs", NULL, NULL, NULL, 200, NULL);
}

Test(web_host, allow_host_admits_the_names_given_and_no_other) {
    http_stop(srv);
    srv = NULL;
    serve_pid = webclient_start_serve(dbpath, "--allow-host dash.example --allow-host 'Other.Example,[fe80::1]'", &port);
    cr_assert_gt(serve_pid, 0, "pprun serve --allow-host did not start");
    char host[64];
    snprintf(host, sizeof host, "dash.example:%d", port);
    static const char *const ok[] = {"dash.example", "DASH.example:8080", "other.example", "[fe80::1]:9",
                                     "localhost", "127.0.0.1"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) expect("GET", "/api/jobs", ok[i], NULL, NULL, 200, NULL);
    char origin[128];
    snprintf(origin, sizeof origin, "Origin: http://%s\r\n" JSON, host);
    expect("POST", "/api/sql", host, origin, "{\"sql\":\"SELECT 42\"}", 200, NULL);
    const char *says[] = {"Host 'sub.dash.example' is not a name of this server", "and the names given with --allow-host",
                          "--allow-host sub.dash.example", NULL};
    expect("GET", "/api/jobs", "sub.dash.example", NULL, NULL, 403, says);
    expect("GET", "/api/jobs", "dash.example.evil", NULL, NULL, 403, NULL);
    /* a name with a port, a URL, an empty one: refused at start */
    static const char *const bad[] = {"dash.example:80", "http://dash.example", "dash.example/x", "''", "a,,b",
                                      "'[::1]:80'", "'bad name'"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' serve --db '%s' --listen 127.0.0.1:0 --allow-host %s 2>&1", PPRUN_BIN, dbpath,
                 bad[i]);
        FILE *p = popen(cmd, "r");
        char out[512] = "";
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = 0;
        int st = pclose(p);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--allow-host %s: status %d, %s", bad[i], st, out);
        cr_assert(strstr(out, "--allow-host"), "--allow-host %s: %s", bad[i], out);
    }
}

/* The output and exit status of `pprun ARGS`. */
static int pprun_out(const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd /tmp && '%s' %s 2>&1", PPRUN_BIN, args);
    FILE *p = popen(cmd, "r");
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(web_host, pprun_run_takes_allow_host_with_serve_only_and_checks_its_names) {
    char db[256], out[1024];
    fixture_tmp_path(db, sizeof db, "webhost-run");
    char args[512];
    snprintf(args, sizeof args, "run --allow-host dash.example --db '%s' --steps 1", db);
    cr_assert_eq(pprun_out(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--allow-host names a host the dashboard answers to: it needs --serve"), "%s", out);
    snprintf(args, sizeof args, "run --serve 127.0.0.1:0 --allow-host dash.example:80 --db '%s' --steps 1", db);
    cr_assert_eq(pprun_out(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--allow-host 'dash.example:80': expected a host name or address alone"), "%s", out);
    cr_assert_neq(access(db, F_OK), 0, "a refused run left its database behind");
}

/* ---- Origin: another site's page ------------------------------------------------ */

Test(web_host, a_foreign_origin_is_refused_and_the_servers_own_accepted) {
    char host[64], own[128], other_port[128], other_host[128], https[128];
    snprintf(host, sizeof host, "127.0.0.1:%d", port);
    snprintf(own, sizeof own, "Origin: http://%s\r\n", host);
    snprintf(other_port, sizeof other_port, "Origin: http://127.0.0.1:%d\r\n", port == 1 ? 2 : port - 1);
    snprintf(other_host, sizeof other_host, "Origin: http://localhost:%d\r\n", port);
    snprintf(https, sizeof https, "Origin: HTTPS://%s\r\n", host);
    const char *foreign[] = {"Origin: http://attacker.example.com\r\n", "Origin: null\r\n", other_port, other_host,
                             "Origin: http://127.0.0.1\r\n", "Origin: file://\r\n", "Origin: \r\n"};
    const char *says[] = {"cross-origin request refused", "is not this server's own", NULL};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        char h[256];
        snprintf(h, sizeof h, "%s" JSON, foreign[i]);
        expect("POST", "/api/sql", host, h, LEAK_SQL, 403, says);
        expect("GET", "/api/jobs", host, foreign[i], NULL, 403, says);
        expect("GET", "/api/jobs/1/summary", host, foreign[i], NULL, 403, says);
        expect("GET", "/metrics", host, foreign[i], NULL, 403, says);
    }
    /* the server's own page (as the dashboard's fetches send it), and a
     * navigation or curl without an Origin */
    const char *same[] = {own, https, ""};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char h[256];
        snprintf(h, sizeof h, "%s" JSON, same[i]);
        const char *rows[] = {"config_json", NULL};
        webclient_resp r;
        ask("POST", "/api/sql", host, h, LEAK_SQL, &r);
        cr_assert_eq(r.status, 200, "%s: %d %s", same[i], r.status, r.body);
        cr_assert(strstr(r.body, rows[0]), "%s", r.body);
        webclient_free(&r);
        expect("GET", "/api/jobs", host, same[i], NULL, 200, NULL);
        expect("GET", "/", host, same[i], NULL, 200, NULL);
    }
}

/* ---- Content-Type: a body a page may send without a preflight --------------------- */

Test(web_host, a_body_that_is_not_declared_json_is_refused_with_a_415) {
    const char *host = "localhost";
    static const char *const types[] = {"Content-Type: text/plain\r\n",
                                        "Content-Type: text/plain;charset=UTF-8\r\n",
                                        "Content-Type: application/x-www-form-urlencoded\r\n",
                                        "Content-Type: multipart/form-data; boundary=x\r\n",
                                        "Content-Type: application/jsonx\r\n",
                                        "Content-Type: application/json-seq\r\n",
                                        "Content-Type: text/json\r\n",
                                        ""};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const char *says[] = {"a request body must be JSON: send 'Content-Type: application/json'", NULL};
        expect("POST", "/api/sql", host, types[i], LEAK_SQL, 415, says);
    }
    /* POST /api/sql takes only JSON, a body or none */
    const char *none[] = {"(got none)", NULL};
    expect("POST", "/api/sql", host, NULL, NULL, 415, none);
    static const char *const json[] = {JSON, "Content-Type: Application/JSON; charset=utf-8\r\n",
                                       "Content-Type: application/json ;charset=utf-8\r\n"};
    for (size_t i = 0; i < sizeof json / sizeof json[0]; i++) {
        const char *rows[] = {"config_json", NULL};
        webclient_resp r;
        ask("POST", "/api/sql", host, json[i], LEAK_SQL, &r);
        cr_assert_eq(r.status, 200, "%s: %d %s", json[i], r.status, r.body);
        cr_assert(strstr(r.body, rows[0]), "%s", r.body);
        webclient_free(&r);
    }
    /* any other route: a body must be JSON too; a method its route does
     * not take is still its 405 */
    const char *what[] = {"must be JSON", NULL};
    expect("GET", "/api/jobs", host, "Content-Type: text/plain\r\n", "x", 415, what);
    expect("POST", "/nonexistent", host, "Content-Type: text/plain\r\n", "x", 415, what);
    const char *nope[] = {"POST not allowed on /api/jobs", NULL};
    expect("POST", "/api/jobs", host, "Content-Type: text/plain\r\n", "x", 405, nope);
}

/* ---- with a token ------------------------------------------------------------------ */

Test(web_host, with_a_token_on_a_public_address_any_host_passes_and_the_origin_is_still_checked) {
    http_stop(srv);
    srv = NULL;
    fixture_remove(dbpath);
    start_with((http_options){.listen = "0.0.0.0:0", .token = "s3cret-token-0123", .conn_timeout_s = 5});
    const char *tok = "Authorization: Bearer s3cret-token-0123\r\n";
    /* a public address is reached by any name: the token stops a page that
     * does not know it */
    const char *says[] = {"\"jobs\"", NULL};
    expect("GET", "/api/jobs", "pprun.example.com:8080", tok, NULL, 200, says);
    expect("GET", "/api/jobs", "10.1.2.3", tok, NULL, 200, says);
    const char *no_token[] = {"missing or wrong token", NULL};
    expect("GET", "/api/jobs", "pprun.example.com:8080", NULL, NULL, 401, no_token);
    /* but never from another site's page, token or not */
    char h[256];
    snprintf(h, sizeof h, "%sOrigin: http://attacker.example.com\r\n", tok);
    const char *cross[] = {"cross-origin request refused", NULL};
    expect("GET", "/api/jobs", "pprun.example.com:8080", h, NULL, 403, cross);
    snprintf(h, sizeof h, "%sOrigin: https://pprun.example.com\r\n", tok);
    expect("GET", "/api/jobs", "pprun.example.com", h, NULL, 200, says);
    /* and a body must still be JSON */
    snprintf(h, sizeof h, "%sContent-Type: text/plain\r\n", tok);
    expect("POST", "/api/sql", "pprun.example.com", h, LEAK_SQL, 415, NULL);
}

Test(web_host, with_a_token_on_loopback_or_allow_host_on_a_public_address_the_host_is_checked) {
    http_stop(srv);
    srv = NULL;
    fixture_remove(dbpath);
    start_with((http_options){.token = "s3cret-token", .conn_timeout_s = 5});
    const char *tok = "Authorization: Bearer s3cret-token\r\n";
    const char *says[] = {"is not a name of this server", NULL};
    expect("GET", "/api/jobs", "attacker.example.com", tok, NULL, 403, says);
    expect("GET", "/api/jobs", "localhost", tok, NULL, 200, NULL);
    http_stop(srv);
    srv = NULL;
    fixture_remove(dbpath);
    start_with((http_options){.listen = "0.0.0.0:0", .token = "s3cret-token-0123", .allow_hosts = "pprun.example.com",
                              .conn_timeout_s = 5});
    tok = "Authorization: Bearer s3cret-token-0123\r\n";
    expect("GET", "/api/jobs", "pprun.example.com:8080", tok, NULL, 200, NULL);
    expect("GET", "/api/jobs", "localhost", tok, NULL, 200, NULL);
    expect("GET", "/api/jobs", "10.1.2.3:8080", tok, NULL, 403, says);
}
