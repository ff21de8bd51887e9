/* backup.h - `trainyard backup` and `trainyard restore` (cmd/backup.c;
 * docs/reliability.md, "Backups and restore").
 *
 * defines: cmd_backup, cmd_restore */
#ifndef TRAINYARD_CMD_BACKUP_H
#define TRAINYARD_CMD_BACKUP_H

/* `trainyard backup DEST [--url U --token T --ca-cert F] [--json]`: asks the
 * running server (POST /api/v1/backups, the admin's token); with `--data
 * DIR`, backs up a data directory no server runs on. argv[0] is "backup".
 * Returns the exit status. */
int cmd_backup(int argc, char **argv);

/* `trainyard restore SRC --data DIR [--force]`: one summary line. */
int cmd_restore(int argc, char **argv);

#endif
