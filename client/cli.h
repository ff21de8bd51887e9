/* cli.h - `trainyard submit|jobs|status|cancel|teams|logs|watch|queue|
 * cluster|events|checkpoints|context`: the command-line
 * client over the REST API (TRAINYARD_URL, TRAINYARD_TOKEN).
 *
 * defines: cmd_cli */
#ifndef TRAINYARD_CLI_H
#define TRAINYARD_CLI_H

/* Runs client subcommand argv[0]; returns the exit status: 0 ok, 1 the
 * server refused (4xx), 2 usage (or a --context folder that cannot be
 * packed), 3 the server was unreachable or answered
 * 5xx, 4 the watched job failed, 5 it was cancelled, 6 a downloaded
 * checkpoint did not match its sha256. -1 when argv[0] is not a client
 * subcommand. */
int cmd_cli(int argc, char **argv);

#endif
