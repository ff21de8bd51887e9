/* migrate.h - `trainyard migrate` (cmd/migrate.c; docs/postgres.md,
 * "Moving a cluster from SQLite").
 *
 * defines: cmd_migrate */
#ifndef TRAINYARD_CMD_MIGRATE_H
#define TRAINYARD_CMD_MIGRATE_H

/* `trainyard migrate --from DATA --to postgres://... [--force]
 * [--db-password-file FILE] [--blob-store SPEC [--blob-credentials FILE]]
 * [--json]`. argv[0] is "migrate". Returns the exit status: 0 copied and
 * every table matches, 1 refused or failed (one line on stderr), 2 bad
 * arguments, 3 copied but a table differs. */
int cmd_migrate(int argc, char **argv);

#endif
