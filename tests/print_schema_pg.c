/* print_schema_pg.c - prints storage/schema_pg.c's schema_pg_baseline to
 * standard output, as the compiler reads the C string: what
 * tests/schema_pg_check.py applies to a real PostgreSQL. Built by that
 * script (cc tests/print_schema_pg.c storage/schema_pg.c). */
#include <stdio.h>

#include "../storage/schema_pg.h"

int main(void) {
    if (fputs(schema_pg_baseline, stdout) == EOF || fflush(stdout) != 0) {
        perror("print_schema_pg");
        return 1;
    }
    return 0;
}
