/* audit.h - the audit trail: one row per mutating request of a person, a
 * team's service token or the admin, and per refused request (401, 403).
 * The server writes a change's row in the change's own transaction (db.h,
 * db_precommit; a submission's in the group commit's savepoint, store.h)
 * and sets its status once answered; a refusal's row alone.
 *
 * defines: audit_row, audit_insert, audit_set_status, audit_filter,
 *          audit_query, audit_prune */
#ifndef TRAINYARD_AUDIT_H
#define TRAINYARD_AUDIT_H

#include <stdint.h>
#include "db.h"
#include "../common/util.h"

typedef struct audit_row {
    int64_t at;                  /* ms */
    char actor[96];              /* "user:ada", "team:vision (service)", "admin", "anonymous" */
    int64_t user_id, token_id, team_id;   /* 0: none */
    char method[8];
    char route[96];              /* the route's pattern ("/api/v1/jobs/{id}/cancel"), or the path when none matched */
    char target[160];            /* the path's parameters ("id=12"), or "" */
    char client[48];             /* the peer's address */
    int status;                  /* 0 until answered */
} audit_row;
int audit_insert(db *d, const audit_row *r, int64_t *id);
int audit_set_status(db *d, int64_t id, int status);

typedef struct audit_filter {
    int64_t since, until;        /* ms; 0: open */
    const char *user;            /* a user's name, NULL: any */
    int64_t team_id;             /* 0: any */
    const char *action;          /* a substring of "METHOD ROUTE", NULL: any */
    int64_t before;              /* rows with id below (0: from the newest) */
    int limit;
} audit_filter;
/* Rows newest first, as a JSON array or CSV (with a header line) appended
 * to out; *next the cursor of the next page (0: none). */
int audit_query(db *d, const audit_filter *f, int csv, buf *out, int64_t *next);
/* Deletes rows older than before (ms) among the 10,000 oldest (ids grow
 * with time: a call reads 10,000 rows at most, and no index on the time
 * is needed); *n how many. */
int audit_prune(db *d, int64_t before, int *n);

#endif
