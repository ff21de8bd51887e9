/* retention_api.h - what finished jobs leave on the server's disk: the files of
 * a deleted job (DELETE /jobs/{id}, api/jobs_api.c), the log retention
 * (--log-retention-days), the collection of a finished job's checkpoints
 * (the newest and, with checkpoint.best, the best), and the sweeps that
 * remove what a crash left of anything marked deleted. The rows are
 * storage/retention.c; here the files go, always after the commit that
 * marked them (docs/server.md, "Retention").
 *
 * defines: api_retention_delete_files, api_retention_tick,
 *          api_logs_purged_answer, api_ckpt_mark_best, api_ckpt_remove */
#ifndef TRAINYARD_RETENTION_API_H
#define TRAINYARD_RETENTION_API_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "../server/http.h"

struct server;
struct ckpt_ref;

/* After the commit that marked job_id deleted: removes its log and
 * checkpoint directories; *freed gets the bytes of the files removed.
 * TRAINYARD_TEST_DELETE_PAUSE_MS (tests only) waits that long first, so a
 * test can kill the server between the commit and the removal. */
void api_retention_delete_files(struct server *srv, int64_t job_id, int64_t *freed);

/* Periodic housekeeping (server_app.tick): at a bounded rate (a page of
 * finished jobs read and a few acted on per call), collects the checkpoints
 * of ended jobs, removes the logs of jobs past the retention, and sweeps the
 * files left of deleted jobs and checkpoints (a full sweep at start, then
 * every 10 minutes). Idempotent. */
void api_retention_tick(struct server *srv);

/* The 410 `logs_purged` of a job whose logs the retention removed at
 * purged_at (ms). */
void api_logs_purged_answer(struct server *srv, http_res *res, int64_t job_id, int64_t purged_at);

/* Adds "best": true to the best checkpoint of arr (the items of GET
 * /jobs/{id}/checkpoints) by the spec's checkpoint.best, "best": false to
 * the others. spec: the job's spec as submitted. */
void api_ckpt_mark_best(struct server *srv, int64_t job_id, const char *spec, cJSON *arr);

/* Removes a checkpoint's bytes after the commit that marked it deleted:
 * the file under the data directory (store ''), or the object in the blob
 * store the server runs with; a row of another store is left to a server
 * that runs with it. Its bytes when known to be removed, else 0. */
int64_t api_ckpt_remove(struct server *srv, const struct ckpt_ref *r);

#endif
