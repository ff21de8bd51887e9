/* main.c - the one trainyard binary: dispatches to its subcommands.
 * server, up (server + local agent), agent, worker, train, and the client
 * commands (submit, jobs, status, cancel, teams). */
#include <stdio.h>
#include <string.h>

#include "../server/server.h"
#include "up.h"
#include "../executor/agent.h"
#include "../executor/worker.h"
#include "../client/cli.h"
#include "../api/routes.h"
#include "../executor/train_cmd.h"
#include "../common/util.h"

static void usage(FILE *f) {
    fprintf(f,
            "trainyard - distributed training for teams that share a cluster\n\n"
            "usage: trainyard COMMAND [options]\n\n"
            "service:\n"
            "  up        server and a local agent on this machine (the embedded default)\n"
            "  server    the control plane: REST API, scheduler, store\n"
            "  agent     a node agent: registers devices, runs the tasks assigned to it\n"
            "  worker    one task of a job (started by the agent)\n"
            "  train     train a job spec locally, no server needed\n"
            "client:\n"
            "  submit FILE | jobs | status ID | cancel ID | logs ID [-f] | teams\n\n"
            "Run 'trainyard COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "server") == 0) return cmd_server(argc - 1, argv + 1, &api_app);
    if (strcmp(cmd, "up") == 0) return cmd_up(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "agent") == 0) return cmd_agent(argc - 1, argv + 1);
    if (strcmp(cmd, "worker") == 0) return cmd_worker(argc - 1, argv + 1);
    int rc = cmd_cli(argc - 1, argv + 1);
    if (rc >= 0) return rc;
    fprintf(stderr, "trainyard: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
