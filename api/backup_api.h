/* backup_api.h - POST /api/v1/backups (admin): a backup of the data
 * directory taken while the server serves, and the periodic backups of
 * --backup-to/--backup-every/--backup-keep (storage/backup.h does the
 * work; docs/reliability.md, "Backups and restore").
 *
 * defines: api_backup_routes, api_backup_tick, api_backup_stop,
 *          api_backup_metrics */
#ifndef TRAINYARD_BACKUP_API_H
#define TRAINYARD_BACKUP_API_H

#include "../common/util.h"
#include "../server/http.h"

struct server;

extern const route api_backup_routes[];

/* server_app.tick: starts a periodic backup when one is due (on a thread
 * of its own; the tick never waits for it). */
void api_backup_tick(struct server *srv);

/* Waits for a periodic backup under way to end (the server stops). */
void api_backup_stop(struct server *srv);

/* /metrics' lines: trainyard_backup_last_success_seconds (the unix time of
 * the last backup that completed, 0: none since the start) and the
 * failures counted. 0, or -1 when b is full. */
int api_backup_metrics(buf *b);

#endif
