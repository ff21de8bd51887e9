/* print_schema_pg.c - prints storage/schema_pg.c's schema_pg_baseline to
 * standard output, then the PostgreSQL text of every later migration
 * (storage/schema.c), as the compiler reads the C strings: what
 * tests/schema_pg_check.py applies to a real PostgreSQL, as db_open does.
 * Built by that script (cc tests/print_schema_pg.c storage/schema_pg.c
 * storage/schema.c). */
#include <stdio.h>

#include "../storage/schema.h"
#include "../storage/schema_pg.h"

int main(void) {
    if (fputs(schema_pg_baseline, stdout) == EOF) {
        perror("print_schema_pg");
        return 1;
    }
    for (int i = 0; i < schema_migrations_n; i++) {
        const migration *m = &schema_migrations[i];
        if (m->version <= SCHEMA_PG_BASE) continue;
        if (!m->pg) {
            fprintf(stderr, "print_schema_pg: migration %d has no PostgreSQL text\n", m->version);
            return 1;
        }
        if (printf("\n%s\n", m->pg) < 0) {
            perror("print_schema_pg");
            return 1;
        }
    }
    if (fflush(stdout) != 0) {
        perror("print_schema_pg");
        return 1;
    }
    return 0;
}
