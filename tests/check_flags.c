/* check_flags.c - tests for common/flags: each kind of row stores its value
 * in the options struct, refuses what is out of bounds with the flag named,
 * --help and an unknown flag, positional arguments, a parser's own refusal. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/flags.h"
#include "../common/util.h"

typedef struct opts {
    int verbose;
    char name[8];
    char dir[32];
    int count;
    long big;
    int mode;
    int custom;
} opts;

static int usage_calls;
static void usage(FILE *f) { (void)f; usage_calls++; }

static int parse_even(void *o, const char *arg)
{
    long v = 0;
    if (parse_long(arg, 0, 100, &v) < 0) return -1;
    if (v % 2) {
        fprintf(stderr, "test: %ld is odd\n", v);
        return -2;
    }
    ((opts *)o)->custom = (int)v;
    return 0;
}

static const char *const MODES[] = {"off", "on", "auto", NULL};
static const flag_def DEFS[] = {
    FLAG_SWITCH_AT("verbose", opts, verbose),
    FLAG_TEXT_AT("name", opts, name, "a short name"),
    FLAG_PATH_AT("dir", opts, dir, "an absolute path"),
    FLAG_INT_AT("count", opts, count, 1, 10, "a number (1-10)"),
    FLAG_LONG_AT("big", opts, big, 0, 1L << 40, "a number"),
    FLAG_CHOICE_AT("mode", opts, mode, MODES, "off, on or auto"),
    FLAG_FUNC_AT("even", parse_even, "an even number (0-100)"),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL},
};

/* Runs flags_parse on a NULL-terminated list after argv[0]; stderr's first
 * line into said (when not NULL). */
static int run(opts *o, char *said, size_t n, ...)
{
    char *argv[16] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, n);
    for (const char *a; (a = va_arg(ap, const char *)) && argc < 15;)
        argv[argc++] = (char *)a;
    va_end(ap);
    fflush(stderr);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), 2), 0);
    int rc = flags_parse(DEFS, o, argc, argv, "prog", usage);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (said) {
        rewind(tmp);
        if (!fgets(said, (int)n, tmp)) said[0] = 0;
        said[strcspn(said, "\n")] = 0;
    }
    fclose(tmp);
    return rc;
}

START_TEST(test_kinds_store)
{
    opts o;
    memset(&o, 0, sizeof o);
    ck_assert_int_eq(run(&o, NULL, 0, "--verbose", "--name", "abc", "--dir", "/x/y", "--count", "10", "--big",
                         "1099511627776", "--mode", "auto", "--even", "42", NULL), 0);
    ck_assert_int_eq(o.verbose, 1);
    ck_assert_str_eq(o.name, "abc");
    ck_assert_str_eq(o.dir, "/x/y");
    ck_assert_int_eq(o.count, 10);
    ck_assert(o.big == 1L << 40);
    ck_assert_int_eq(o.mode, 2);
    ck_assert_int_eq(o.custom, 42);
    /* --flag=value as getopt_long takes it */
    ck_assert_int_eq(run(&o, NULL, 0, "--count=3", "--mode=off", NULL), 0);
    ck_assert_int_eq(o.count, 3);
    ck_assert_int_eq(o.mode, 0);
}
END_TEST

START_TEST(test_refusals_name_the_flag)
{
    struct {
        const char *flag, *arg, *said;
    } cases[] = {
        {"--count", "0", "prog: --count wants a number (1-10), got '0'"},
        {"--count", "11", "prog: --count wants a number (1-10), got '11'"},
        {"--count", "3x", "prog: --count wants a number (1-10), got '3x'"},
        {"--name", "longer-than-8", "prog: --name wants a short name, got 'longer-than-8'"},
        {"--dir", "relative", "prog: --dir wants an absolute path, got 'relative'"},
        {"--mode", "maybe", "prog: --mode wants off, on or auto, got 'maybe'"},
        {"--even", "x", "prog: --even wants an even number (0-100), got 'x'"},
        {"--even", "7", "test: 7 is odd"}, /* the parser said why itself */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        opts o;
        memset(&o, 0, sizeof o);
        o.count = 5;
        char said[256];
        ck_assert_int_eq(run(&o, said, sizeof said, cases[k].flag, cases[k].arg, NULL), -1);
        ck_assert_str_eq(said, cases[k].said);
        ck_assert_int_eq(o.count, 5); /* a refused value is not stored */
    }
}
END_TEST

START_TEST(test_help_unknown_positional)
{
    opts o;
    memset(&o, 0, sizeof o);
    usage_calls = 0;
    ck_assert_int_eq(run(&o, NULL, 0, "--help", NULL), 1);
    ck_assert_int_eq(usage_calls, 1);
    ck_assert_int_eq(run(&o, NULL, 0, "--nope", NULL), -1);
    ck_assert_int_eq(usage_calls, 2);
    ck_assert_int_eq(run(&o, NULL, 0, "--count", NULL), -1); /* a value missing */
    char said[256];
    ck_assert_int_eq(run(&o, said, sizeof said, "--verbose", "extra", NULL), -1);
    ck_assert_str_eq(said, "prog: unexpected argument 'extra'");
}
END_TEST

static Suite *flags_suite(void)
{
    Suite *s = suite_create("flags");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_kinds_store);
    tcase_add_test(tc, test_refusals_name_the_flag);
    tcase_add_test(tc, test_help_unknown_positional);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(flags_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
