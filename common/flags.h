/* flags.h - command-line flags from one table.
 *
 * A program's flags are a table (as Redis' config.c keeps its directives):
 * each row says the flag's name, its kind, where its value goes in the
 * program's options struct, its bounds, and what it wants (the error a
 * refused value gets). flags_parse builds getopt_long's table from the
 * rows, checks and stores each value, and says one line per refusal; a flag
 * that needs more than a kind (an address, a size or a percentage, two
 * flags at once) names a parser of its own. The rows are written with the
 * FLAG_* macros below. The checks that span flags stay with the program.
 *
 * defines: flag_kind, flag_def, FLAG_SWITCH_AT, FLAG_TEXT_AT, FLAG_PATH_AT,
 *          FLAG_INT_AT, FLAG_LONG_AT, FLAG_CHOICE_AT, FLAG_FUNC_AT,
 *          flags_parse
 */
#ifndef TRAINYARD_FLAGS_H
#define TRAINYARD_FLAGS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    FLAG_SWITCH, /* no value: the int at off becomes 1 */
    FLAG_TEXT,   /* a string into char[size] at off */
    FLAG_PATH,   /* an absolute path into char[size] at off */
    FLAG_INT,    /* a whole number in [min, max] into the int at off */
    FLAG_LONG,   /* the same into the long at off */
    FLAG_CHOICE, /* one of choices[] (NULL-terminated): its index into the int at off */
    FLAG_FUNC,   /* parse(opts, arg): 0, or -1 (the row's want is said) */
} flag_kind;

typedef struct flag_def {
    const char *name; /* without the dashes */
    flag_kind kind;
    size_t off;
    size_t size;
    long min, max;
    const char *const *choices;
    int (*parse)(void *opts, const char *arg);
    const char *want; /* "seconds (1-86400)": "--NAME wants WANT, got 'ARG'" */
} flag_def;

#define FLAG_SWITCH_AT(name, type, field) {name, FLAG_SWITCH, offsetof(type, field), 0, 0, 0, NULL, NULL, NULL}
#define FLAG_TEXT_AT(name, type, field, want) \
    {name, FLAG_TEXT, offsetof(type, field), sizeof(((type *)0)->field), 0, 0, NULL, NULL, want}
#define FLAG_PATH_AT(name, type, field, want) \
    {name, FLAG_PATH, offsetof(type, field), sizeof(((type *)0)->field), 0, 0, NULL, NULL, want}
#define FLAG_INT_AT(name, type, field, lo, hi, want) \
    {name, FLAG_INT, offsetof(type, field), 0, lo, hi, NULL, NULL, want}
#define FLAG_LONG_AT(name, type, field, lo, hi, want) \
    {name, FLAG_LONG, offsetof(type, field), 0, lo, hi, NULL, NULL, want}
#define FLAG_CHOICE_AT(name, type, field, choices, want) \
    {name, FLAG_CHOICE, offsetof(type, field), 0, 0, 0, choices, NULL, want}
#define FLAG_FUNC_AT(name, fn, want) {name, FLAG_FUNC, 0, 0, 0, 0, NULL, fn, want}

/* Parses argv[1..] (getopt_long; no positional arguments) against defs
 * (ended by a row with a NULL name) into opts. --help prints usage to
 * stdout and returns 1. A refused value prints "PROG: --NAME wants WANT,
 * got 'ARG'" to stderr and returns -1 (FLAG_FUNC's parser may print its own
 * line first and return -2 to say that is enough); an unknown flag prints
 * usage to stderr, -1. 0: every flag parsed. */
int flags_parse(const flag_def *defs, void *opts, int argc, char **argv, const char *prog, void (*usage)(FILE *));

#endif
