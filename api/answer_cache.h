/* answer_cache.h - answers of read-only routes kept by each server thread.
 *
 * An answer is kept with the database generation it was read at
 * (storage/db.h db_generation: it changes after every commit) and served
 * again, without a query, for as long as the generation is the same: a job
 * or a list page polled again (the dashboard, `trainyard watch`, a script's
 * loop) costs no SQLite read until something is written. Per thread, so no
 * lock: each of the HTTP pool's threads fills its own.
 *
 *   answer_ref ref;
 *   if (answer_cache_get(srv->db, key, res, &ref)) return;   // answered
 *   ... read and answer into res ...
 *   if (whole) answer_cache_put(&ref, res);                   // 200s only
 *
 * The key names everything the answer depends on besides the data: the
 * route, its parameters and the token's scope.
 *
 * defines: answer_cache_get, answer_cache_put */
#ifndef TRAINYARD_ANSWER_CACHE_H
#define TRAINYARD_ANSWER_CACHE_H

#include <stdint.h>

#include "../server/http.h"
#include "../storage/db.h"

#define ANSWER_KEY_MAX 160         /* longer keys are never kept */
#define ANSWER_BODY_MAX (256u << 10) /* nor longer answers */

typedef struct answer_ref {
    uint64_t gen;                  /* read before the query; 0: not to be kept */
    void *slot;
    char key[ANSWER_KEY_MAX];
} answer_ref;

/* 1 when res now holds the kept answer for key (200, application/json); 0
 * when the caller must answer, with ref set for answer_cache_put. */
int answer_cache_get(db *d, const char *key, http_res *res, answer_ref *ref);

/* Keeps res's body for ref's key if it is a 200 JSON answer small enough. */
void answer_cache_put(const answer_ref *ref, const http_res *res);

#endif
