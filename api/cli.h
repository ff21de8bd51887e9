/* cli.h - `trainyard submit|jobs|status|cancel|teams`: the command-line
 * client over the REST API (TRAINYARD_URL, TRAINYARD_TOKEN).
 *
 * defines: cmd_cli */
#ifndef TRAINYARD_CLI_H
#define TRAINYARD_CLI_H

/* Runs client subcommand argv[0]; returns the exit status (0 ok, 1 the server
 * said no or was unreachable, 2 usage). -1 when argv[0] is not a client
 * subcommand. */
int cmd_cli(int argc, char **argv);

#endif
