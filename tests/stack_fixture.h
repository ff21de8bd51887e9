/* stack_fixture.h - a service for integration tests that restart it: either
 * `trainyard up --cpu-slots 2`, or `trainyard server` on a port it keeps
 * across restarts with one agent of 2 slots. Include after testlib.h; it
 * defines the test file's srv, agent, team_tok and admin_tok.
 *
 *   stack_up(name)            up, data under a mktemp dir named after name
 *   stack_server_agent(name)  server + agent "<name>-node"
 *   stack_server_restart()    the server again on the same port and data
 *   stack_stop()              agent and server stopped, the data removed */
#ifndef TRAINYARD_TESTS_STACK_FIXTURE_H
#define TRAINYARD_TESTS_STACK_FIXTURE_H

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static pid_t agent;
static char stack_listen[64];

static void stack_tokens(void) {
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void stack_up(const char *name) {
    memset(&srv, 0, sizeof srv);
    agent = 0;
    ty_mkdtemp(srv.dir, sizeof srv.dir, name);
    const char *extra[] = {"--cpu-slots", "2", NULL};
    ty_server_start_args(&srv, "up", extra);
    stack_tokens();
}

static void stack_server_restart(void) {
    const char *extra[] = {"--listen", stack_listen, "--heartbeat-timeout", "30", NULL};
    ty_server_start_args(&srv, "server", extra);
}

static void stack_server_agent(const char *name) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, name);
    snprintf(stack_listen, sizeof stack_listen, "127.0.0.1:%d", ty_free_port());
    stack_server_restart();
    stack_tokens();
    char node[64];
    snprintf(node, sizeof node, "%s-node", name);
    agent = ty_agent_start(&srv, node, "2");
}

static void stack_stop(void) {
    if (agent > 0) {
        ty_proc a = {.pid = agent};
        ty_kill(&a, SIGTERM);
        agent = 0;
    }
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

#endif
