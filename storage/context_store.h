/* context_store.h - the contexts teams upload (gzip'd tars of their code)
 * as rows: one per team and digest (hex sha256 of the bytes), with their
 * sizes and times. The bytes are the file DATA/contexts/<digest> (or the
 * object contexts/<digest> of the blob store the row's store names),
 * shared by every team that uploaded the same bytes: the caller removes it
 * when ctx_store_digest_held says no row refers to it any more.
 *
 * A context is "in use" while a queued, starting or running job of its team
 * names it (jobs.context): it cannot be deleted then, and the garbage
 * collection passes it by. Storage only: callers (api/contexts_api.c)
 * decide who may do what and keep the files.
 *
 * Return codes as store.h. Functions that write one statement do not begin
 * a transaction; ctx_store_delete and ctx_store_gc_drop check and delete in
 * one statement, so a job inserted meanwhile is never left without its
 * context.
 *
 * defines: ctx_row, ctx_store_insert, ctx_store_touch, ctx_store_get,
 *          ctx_store_list, ctx_store_usage, ctx_store_delete,
 *          ctx_store_digest_held, ctx_store_gc_candidates, ctx_store_gc_drop,
 *          ctx_store_job_names, ctx_store_node_needs, ctx_store_digest_store */
#ifndef TRAINYARD_CONTEXT_STORE_H
#define TRAINYARD_CONTEXT_STORE_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "db.h"
#include "store_base.h"

typedef struct ctx_row {
    int64_t team_id;
    char digest[65];                  /* hex sha256 of the gzip'd tar */
    int64_t bytes;                    /* the gzip'd tar */
    int64_t files;                    /* regular files in it */
    int64_t unpacked;                 /* bytes of file data once unpacked */
    int64_t created_at, used_at;      /* ms since the epoch */
    char store[256];                  /* where the bytes are: '' the data directory, else the blob
                                       * store's URL (schema 18); written by ctx_store_insert */
} ctx_row;

/* A new row (created_at = used_at = now): STORE_OK, STORE_CONFLICT when the
 * team already holds the digest, STORE_ERROR. */
int ctx_store_insert(db *d, const ctx_row *r);

/* used_at = now for the team's row: STORE_OK, STORE_NOT_FOUND (the team
 * does not hold it), STORE_ERROR. */
int ctx_store_touch(db *d, int64_t team_id, const char *digest, int64_t now);

/* The team's row: STORE_OK with *out, STORE_NOT_FOUND, STORE_ERROR. */
int ctx_store_get(db *d, int64_t team_id, const char *digest, ctx_row *out);

/* The team's contexts, newest first, as a JSON array of {"id": "sha256:HEX",
 * "bytes", "files", "unpacked_bytes", "created_at", "used_at", "jobs": the
 * number of its queued, starting or running jobs naming it}. */
int ctx_store_list(db *d, int64_t team_id, cJSON **out);

/* The bytes of the team's contexts together. */
int ctx_store_usage(db *d, int64_t team_id, int64_t *bytes);

/* Removes the team's row unless a queued, starting or running job of the
 * team names it: STORE_OK, STORE_NOT_FOUND, STORE_CONFLICT (*jobs gets how
 * many name it), STORE_ERROR. */
int ctx_store_delete(db *d, int64_t team_id, const char *digest, int *jobs);

/* 1 when some team's row holds the digest, 0 when none, -1 on error. */
int ctx_store_digest_held(db *d, const char *digest);

/* Up to max rows no queued, starting or running job of their team names,
 * unused since before `before` (used_at), and whose naming jobs all
 * finished before it: *n gets how many. */
int ctx_store_gc_candidates(db *d, int64_t before, ctx_row *out, int max, int *n);

/* Removes the row when it is still a candidate as ctx_store_gc_candidates
 * says (a submission or upload since then keeps it): STORE_OK (removed),
 * STORE_NOT_FOUND (kept or gone), STORE_ERROR. */
int ctx_store_gc_drop(db *d, int64_t team_id, const char *digest, int64_t before);

/* 1 when the job names the digest (jobs.context), 0 when not, -1 on error. */
int ctx_store_job_names(db *d, int64_t job_id, const char *digest);

/* 1 when a job naming the digest has a task on the node that has not
 * exited (the node's agent unpacks it for that task), 0 when none, -1. */
int ctx_store_node_needs(db *d, int64_t node_id, const char *digest);

/* The store holding the digest's bytes and their size: the row of `prefer`
 * (the server's store) when a team holds it there, else any row's.
 * STORE_NOT_FOUND when no row holds the digest. */
int ctx_store_digest_store(db *d, const char *digest, const char *prefer, char *out, size_t cap, int64_t *bytes);

#endif
