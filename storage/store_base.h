/* store_base.h - the floor under every storage module: the return codes
 * they all answer with and the JSON form of a time column, so that a module
 * store.c itself calls (context_store.c) needs nothing of store.h.
 *
 * Return codes: STORE_OK, STORE_NOT_FOUND, STORE_CONFLICT (e.g. cancel of a
 * finished job, duplicate team name), STORE_EXPIRED (a token past its
 * expiry), STORE_ERROR (database failure).
 *
 * defines: STORE_OK, STORE_NOT_FOUND, STORE_CONFLICT, STORE_EXPIRED,
 *          STORE_ERROR, store_time_text, store_json_time_ms, store_json_time,
 *          store_step_done, store_step_one */
#ifndef TRAINYARD_STORE_BASE_H
#define TRAINYARD_STORE_BASE_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "db.h"

enum { STORE_OK = 0, STORE_NOT_FOUND = 1, STORE_CONFLICT = 2, STORE_EXPIRED = 3, STORE_ERROR = -1 };

/* ms since the epoch as ISO 8601 UTC with milliseconds,
 * "YYYY-MM-DDTHH:MM:SS.mmmZ", into out (24 characters and a NUL). */
void store_time_text(char out[25], int64_t ms);

/* o[key] = that time, or null for ms <= 0 ... */
void store_json_time_ms(cJSON *o, const char *key, int64_t ms);
/* ... or for a NULL column (st's column col, ms since the epoch). */
void store_json_time(cJSON *o, const char *key, db_stmt *st, int col);

/* Steps a write statement to its end and releases it (db_done):
 * STORE_OK, or STORE_ERROR when it did not run to DB_DONE. */
int store_step_done(db_stmt *st);
/* The same for a write that must change exactly one row: STORE_CONFLICT
 * when it changed none (or several). */
int store_step_one(db *d, db_stmt *st);
/* Steps an INSERT ... RETURNING id (one text for every engine, where
 * SQLite alone would read its last rowid) and releases it: STORE_OK with
 * *id; STORE_CONFLICT when a constraint refused the row or an ON CONFLICT
 * DO NOTHING skipped it (no row returned); else STORE_ERROR. */
int store_step_id(db_stmt *st, int64_t *id);

#endif
