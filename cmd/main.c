/* main.c - the one trainyard binary: dispatches to its subcommands:
 * server, up (server + local agent), agent, worker, train, version, and
 * the client commands (client/cli.h). */
#include <stdio.h>
#include <string.h>

#include "../server/server.h"
#include "up.h"
#include "backup.h"
#include "migrate.h"
#include "../executor/agent.h"
#include "../executor/worker.h"
#include "../executor/exec_relay.h"
#include "../client/cli.h"
#include "../client/client.h"
#include "../api/routes.h"
#include "../executor/train_cmd.h"
#include "../common/util.h"
#include "../common/version.h"

static void usage(FILE *f) {
    fprintf(f,
            "trainyard " TRAINYARD_VERSION " - distributed training for teams that share a cluster\n\n"
            "usage: trainyard COMMAND [options]       trainyard COMMAND --help: its options\n\n"
            "the service:\n"
            "  up            a server and a local agent on this machine (the embedded default)\n"
            "  server        the control plane: REST API, dashboard, scheduler, store\n"
            "  agent         a node agent: registers the node, runs (and isolates) its tasks\n"
            "  worker        one task of a job (started by an agent)\n"
            "  train FILE    train a job spec here, no server needed\n"
            "  backup DEST   a consistent copy of the server's data, taken while it runs (admin)\n"
            "  restore SRC --data DIR   a backup into a data directory, checked\n"
            "  migrate --from DATA --to postgres://...   a stopped server's state into PostgreSQL, checked\n"
            "jobs (TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_CA for https; --json for scripts):\n"
            "  submit FILE [--context DIR]   submit a job spec; --context sends the folder along\n"
            "  context push DIR | list       a team's uploaded folders (command.context)\n"
            "  jobs          your team's jobs\n"
            "  status ID     a job: state, tasks, progress, metrics, ETA\n"
            "  watch ID      a progress bar until the job ends\n"
            "  logs ID [-f]  a task's output (--task worker-1), -f to follow\n"
            "  shell ID [-- CMD]   a shell (or CMD) in a running task of the job (--task worker-1)\n"
            "  events ID     the job's timeline\n"
            "  checkpoints ID [--download]   its checkpoints; the newest, sha256 checked\n"
            "  cancel ID     stop a job\n"
            "  delete ID     remove a finished job's logs, checkpoints and metrics\n"
            "  queue         what waits, why, and its estimated start\n"
            "  cluster       nodes, devices, memory, isolation, and who holds what\n"
            "  teams         teams, shares and quotas\n"
            "  usage         who used what: device hours, jobs, waits, storage (--by team|job|day)\n"
            "  sweep FILE    start a hyperparameter sweep (grid, random, asha) of a job spec\n"
            "  sweeps        your team's sweeps\n"
            "  sweep-status ID   a sweep's trials, best metric first\n"
            "people (single sign-on, docs/sso.md; --team NAME or TRAINYARD_TEAM: the team you act in):\n"
            "  login         sign in with a code in a browser; the token goes to ~/.config/trainyard/token\n"
            "  logout        revoke that token and remove it\n"
            "  whoami        who you are here, how you signed in, your teams and roles\n"
            "  version       this version and what it was built with\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        char build[256];
        trainyard_build(build, sizeof build);
        printf("trainyard %s (%s)\n", TRAINYARD_VERSION, build);
        return 0;
    }
    /* the CA every client of this process trusts for https:// (TRAINYARD_CA_PEM
     * or TRAINYARD_CA; the agent's and the CLI's --ca-cert/--ca-hash win) */
    if (strcmp(cmd, "server") != 0) {
        char err[512];
        if (client_trust_from_env(err, sizeof err) < 0) {
            fprintf(stderr, "trainyard: %s\n", err);
            return 2;
        }
    }
    if (strcmp(cmd, "server") == 0) return cmd_server(argc - 1, argv + 1, &api_app);
    if (strcmp(cmd, "up") == 0) return cmd_up(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "backup") == 0) return cmd_backup(argc - 1, argv + 1);
    if (strcmp(cmd, "restore") == 0) return cmd_restore(argc - 1, argv + 1);
    if (strcmp(cmd, "migrate") == 0) return cmd_migrate(argc - 1, argv + 1);
    if (strcmp(cmd, "agent") == 0) return cmd_agent(argc - 1, argv + 1);
    if (strcmp(cmd, "worker") == 0) return cmd_worker(argc - 1, argv + 1);
    /* hidden: one shell into a task, started by the agent (executor/exec_relay.h) */
    if (strcmp(cmd, "exec-relay") == 0) return cmd_exec_relay(argc - 1, argv + 1);
    int rc = cmd_cli(argc - 1, argv + 1);
    if (rc >= 0) return rc;
    fprintf(stderr, "trainyard: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
