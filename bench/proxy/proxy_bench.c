/* proxy_bench.c - the reverse proxy alone, for bench/proxy/run.sh: a daemon
 * (server/http.c) whose one route, any method on any path, forwards to an
 * app on loopback (server/proxy.c), as a job's port will be reached.
 *
 *   proxy_bench APP_PORT PORTFILE
 *
 * Listens on a free loopback port, writes it to PORTFILE, serves until
 * SIGTERM or SIGINT, then prints the proxy's counts as one JSON line. */
#include "../../server/http.h"
#include "../../server/proxy.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static int g_app;

static void forward(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    proxy_target t = {.host = "127.0.0.1", .port = g_app};
    proxy_forward(req, res, &t);
}

static const route g_routes[] = {
    {"*", "/{rest*}", forward, ALLOW_NONE, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
static const route *const g_tables[] = {g_routes, NULL};

int main(int argc, char **argv) {
    long app;
    if (argc != 3 || parse_long(argv[1], 1, 65535, &app) < 0) {
        fprintf(stderr, "usage: proxy_bench APP_PORT PORTFILE\n");
        return 2;
    }
    g_app = (int)app;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return 1; /* every thread after this blocks them */
    signal(SIGPIPE, SIG_IGN);
    log_set_level(LOG_WARN);
    char err[256];
    int port = 0;
    http_daemon *h = http_start(NULL, NULL, 0, "127.0.0.1", 0, g_tables, NULL, NULL, &port, err, sizeof err);
    if (!h) {
        fprintf(stderr, "proxy_bench: %s\n", err);
        return 1;
    }
    char tmp[4096];
    if (sfmt(tmp, sizeof tmp, "%s.tmp", argv[2]) < 0) return 1;
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, argv[2]) != 0) {
        fprintf(stderr, "proxy_bench: cannot write %s\n", argv[2]);
        return 1;
    }
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return 1;
    http_stop(h);
    proxy_stats st;
    proxy_stats_get(&st);
    printf("{\"requests\": %llu, \"bad_gateway\": %llu}\n", (unsigned long long)st.requests,
           (unsigned long long)st.bad_gateway);
    return 0;
}
