/* cmd_serve.c: `pprun serve --db FILE [--listen HOST:PORT] [--token T]
 * [--allow-host NAME]...`:
 * the dashboard and API over an existing trace database until SIGINT or
 * SIGTERM. A job another process is writing shows live. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/term.h"
#include "runner/cmd/cli.h"
#include "web/http.h"

static void usage(FILE *out) {
    fprintf(out, "usage: pprun serve --db FILE [--listen HOST:PORT] [--token TOKEN] [--allow-host NAME]...\n"
                 "                   [--threads N] [--timeout DURATION]\n"
                 "  Serves the dashboard and the JSON API (docs/api.md) over a trace database.\n"
                 "  --listen   address to bind (default 127.0.0.1:8080; port 0 picks a free one)\n"
                 "  --token    required for a non-loopback address, 16 bytes at least (or set\n"
                 "             PPRUN_TOKEN); clients send 'Authorization: Bearer TOKEN'; the\n"
                 "             dashboard takes it from #token=TOKEN\n"
                 "  --allow-host NAME  a Host name to answer besides localhost, 127.0.0.1 and [::1]\n"
                 "             (an /etc/hosts alias, a tunnel's name); repeatable, or NAME,NAME\n"
                 "  --threads  HTTP worker threads (default 4)\n"
                 "  --timeout  how long a connection may sit idle, and a request may take to arrive\n"
                 "             whole, headers and body: whole seconds, 1 to 3600 (default 30; or 2s)\n");
}

int cmd_serve(int argc, char **argv) {
    http_options o = {0};
    pp_err err;
    long v;
    char allow[4096] = ""; /* --allow-host, gathered: NAME,NAME,... */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        int takes = !strcmp(a, "--db") || !strcmp(a, "--listen") || !strcmp(a, "--token") ||
                    !strcmp(a, "--allow-host") || !strcmp(a, "--threads") || !strcmp(a, "--timeout");
        if (!takes) {
            fprintf(stderr, "pprun serve: unknown option '%s'; see pprun serve --help\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "pprun serve: %s needs a value\n", a);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "--db")) o.db_path = val;
        else if (!strcmp(a, "--listen")) o.listen = val;
        else if (!strcmp(a, "--token")) o.token = val;
        else if (!strcmp(a, "--allow-host")) {
            size_t have = strlen(allow);
            if (!*val) {
                fprintf(stderr, "pprun serve: --allow-host needs a host name\n");
                return 2;
            }
            if (have + strlen(val) + 2 > sizeof allow) {
                fprintf(stderr, "pprun serve: --allow-host: more names than fit in %zu bytes\n", sizeof allow);
                return 2;
            }
            snprintf(allow + have, sizeof allow - have, "%s%s", have ? "," : "", val);
            o.allow_hosts = allow;
        } else if (!strcmp(a, "--threads")) {
            if (pp_parse_long(val, 1, 64, "--threads", &v, &err) != 0) goto bad;
            o.threads = (unsigned)v;
        } else {
            /* as every pprun timeout; libmicrohttpd counts whole seconds */
            uint64_t ns;
            if (pp_parse_seconds_ns(val, "--timeout", &ns, &err) != 0) goto bad;
            if (ns % 1000000000ull != 0 || ns < 1000000000ull || ns > 3600000000000ull) {
                fprintf(stderr, "pprun serve: --timeout: whole seconds from 1 to 3600 (30, 2s), got '%s'\n", val);
                return 2;
            }
            o.conn_timeout_s = (unsigned)(ns / 1000000000ull);
        }
    }
    if (!o.db_path) {
        fprintf(stderr, "pprun serve: --db FILE is required\n");
        return 2;
    }
    if (!o.token) o.token = getenv("PPRUN_TOKEN");
    /* Block the signals in every thread; this one waits for them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    http_server *s;
    if (http_start(&o, &s, &err) != 0) {
        fprintf(stderr, "pprun serve: %s\n", err.msg);
        return 2;
    }
    fputs("pprun serve: serving ", stdout);
    term_write(stdout, o.db_path, strlen(o.db_path), 0);
    printf(" at %s\n", http_url(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "pprun serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    http_stop(s);
    return 0;
bad:
    fprintf(stderr, "pprun serve: %s\n", err.msg);
    return 2;
}
