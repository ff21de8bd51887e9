/* db_codes.h - the answers of db.h's statements (db_step) and columns
 * (db_col_type), shared by every engine under it (db.c, db_pg.c). */
#ifndef TRAINYARD_DB_CODES_H
#define TRAINYARD_DB_CODES_H

/* db_step's results (the SQLite values, so a log line reads the same). */
enum {
    DB_OK = 0,
    DB_ERR = 1,          /* any other failure: logged with the statement */
    DB_BUSY = 5,         /* the database stayed locked (SQLite's busy handler gave up) */
    DB_FULL = 13,        /* the disk is full */
    DB_CONSTRAINT = 19,  /* a UNIQUE, FOREIGN KEY, CHECK or NOT NULL constraint refused the row */
    DB_ROW = 100,        /* a row is ready: read it with db_col_* */
    DB_DONE = 101,       /* the statement ran to its end */
    DB_UNAVAILABLE = 300, /* PostgreSQL: the database does not answer (the outcome of a COMMIT is unknown) */
    DB_FENCED = 301      /* PostgreSQL: this server no longer holds the lease; nothing was written */
};

/* db_col_type's answers (SQLite's fundamental types). */
enum { DB_INTEGER = 1, DB_FLOAT = 2, DB_TEXT = 3, DB_BLOB = 4, DB_NULL = 5 };

#endif
