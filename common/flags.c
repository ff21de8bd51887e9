/* flags.c - command-line flags from one table: see flags.h. */
#include "flags.h"

#include <getopt.h>
#include <string.h>

#include "util.h"

#define FLAGS_MAX 64

static int refuse(const char *prog, const flag_def *f, const char *arg)
{
    fprintf(stderr, "%s: --%s wants %s, got '%s'\n", prog, f->name, f->want ? f->want : "another value", arg);
    return -1;
}

static int store(const flag_def *f, void *opts, const char *arg, const char *prog)
{
    char *at = (char *)opts + f->off;
    long v = 0;
    switch (f->kind) {
    case FLAG_SWITCH:
        *(int *)at = 1;
        return 0;
    case FLAG_PATH:
        if (arg[0] != '/')
            return refuse(prog, f, arg);
        /* fall through */
    case FLAG_TEXT:
        if (sfmt(at, f->size, "%s", arg) < 0)
            return refuse(prog, f, arg);
        return 0;
    case FLAG_INT:
    case FLAG_LONG:
        if (parse_long(arg, f->min, f->max, &v) < 0)
            return refuse(prog, f, arg);
        if (f->kind == FLAG_INT)
            *(int *)at = (int)v;
        else
            *(long *)at = v;
        return 0;
    case FLAG_CHOICE:
        for (int k = 0; f->choices[k]; k++)
            if (strcmp(arg, f->choices[k]) == 0) {
                *(int *)at = k;
                return 0;
            }
        return refuse(prog, f, arg);
    case FLAG_FUNC: {
        int rc = f->parse(opts, arg);
        return rc == -2 ? -1 : rc < 0 ? refuse(prog, f, arg) : 0;
    }
    }
    return -1;
}

int flags_parse(const flag_def *defs, void *opts, int argc, char **argv, const char *prog, void (*usage)(FILE *))
{
    struct option longopts[FLAGS_MAX + 2];
    int n = 0;
    for (; defs[n].name; n++) {
        if (n == FLAGS_MAX) {
            fprintf(stderr, "%s: more than %d flags in its table\n", prog, FLAGS_MAX);
            return -1;
        }
        longopts[n] = (struct option){defs[n].name, defs[n].kind == FLAG_SWITCH ? no_argument : required_argument,
                                      NULL, 256 + n};
    }
    longopts[n] = (struct option){"help", no_argument, NULL, 256 + n};
    longopts[n + 1] = (struct option){NULL, 0, NULL, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        /* a row's val is 256 + its index, beyond getopt's own '?' and ':' */
        if (c == 256 + n) {
            usage(stdout);
            return 1;
        }
        if (c < 256 || c > 256 + n) {
            usage(stderr);
            return -1;
        }
        if (store(&defs[c - 256], opts, optarg ? optarg : "", prog) < 0)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return -1;
    }
    return 0;
}
