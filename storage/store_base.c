/* store_base.c - the floor under every storage module (see store_base.h). */
#include "store_base.h"

#include <time.h>

/* YYYY-MM-DDTHH:MM:SS.mmmZ by hand: a list page writes four per job, and
 * snprintf was a tenth of its time. */
void store_time_text(char out[25], int64_t ms) {
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    int year = tm.tm_year + 1900;
    if (year > 9999) year = 9999;
    int f[7][2] = {{year, 4}, {tm.tm_mon + 1, 2}, {tm.tm_mday, 2}, {tm.tm_hour, 2},
                   {tm.tm_min, 2}, {tm.tm_sec, 2}, {(int)(ms % 1000), 3}};
    static const char sep[7] = {'-', '-', 'T', ':', ':', '.', 'Z'};
    char *p = out;
    for (int i = 0; i < 7; i++) {
        for (int k = f[i][1] - 1, v = f[i][0]; k >= 0; k--, v /= 10) p[k] = (char)('0' + v % 10);
        p += f[i][1];
        *p++ = sep[i];
    }
    *p = '\0';
}

void store_json_time_ms(cJSON *o, const char *key, int64_t ms) {
    if (ms <= 0) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    char out[25];
    store_time_text(out, ms);
    cJSON_AddStringToObject(o, key, out);
}

void store_json_time(cJSON *o, const char *key, db_stmt *st, int col) {
    if (db_col_type(st, col) == DB_NULL) cJSON_AddNullToObject(o, key);
    else store_json_time_ms(o, key, db_col_int64(st, col));
}

int store_step_done(db_stmt *st) {
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

int store_step_one(db *d, db_stmt *st) {
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return db_changes(d) == 1 ? STORE_OK : STORE_CONFLICT;
}

int store_step_id(db_stmt *st, int64_t *id) {
    int rc = db_step(st);
    int64_t v = rc == DB_ROW ? db_col_int64(st, 0) : 0;
    /* to the end: SQLite (3.40) commits an autocommit statement that
     * returns rows at its end, and a reset before it skips the WAL hook
     * (the change log and the generations would miss the commit) */
    if (rc == DB_ROW && db_step(st) != DB_DONE) rc = DB_ERR;
    db_done(st);
    if (rc == DB_ROW) {
        if (id) *id = v;
        return STORE_OK;
    }
    return rc == DB_DONE || rc == DB_CONSTRAINT ? STORE_CONFLICT : STORE_ERROR;
}
