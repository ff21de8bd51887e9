/* check_sweep_logic.c - tests for scheduler/sweep: a table of bad searches,
 * each with the status, code and field a client would see; defaults and the
 * normalized JSON's round trip; the grid's order; random draws (seeded,
 * reproducible, in range, log-uniform spread by decade, integer bounds hit);
 * a trial's values written into real specs (examples/) and the ones the spec
 * refuses, named by parameter; ASHA's rungs and two scripted sweeps whose
 * every promotion and total epochs are worked out by hand. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../scheduler/sweep.h"
#include "../spec/jobspec.h"

/* Searches are written with ' for " to stay readable; q() swaps them. */
static cJSON *qjson(const char *s) {
    char *t = xstrdup(s);
    for (char *p = t; *p; p++)
        if (*p == '\'') *p = '"';
    cJSON *j = cJSON_Parse(t);
    ck_assert_msg(j != NULL, "test JSON does not parse: %s", t);
    free(t);
    return j;
}

static void parse_ok(const char *text, sweep_search *s) {
    cJSON *j = qjson(text);
    spec_error e;
    int rc = sweep_search_parse(j, s, &e);
    ck_assert_msg(rc == 0, "expected success for %s\ngot %d %s %s: %s", text, e.status, e.code, e.field,
                  e.message);
    cJSON_Delete(j);
}

static char *print(const cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    ck_assert_ptr_nonnull(t);
    return t;
}

#define GOOD_PARAMS "'parameters':{'fit.batch_size':{'values':[32,64]}}"
#define TAIL "'metric':'val_accuracy','mode':'max'"
#define RANDOM(p) "{'method':'random','parameters':{" p "},'max_trials':5," TAIL "}"
#define GRID(p) "{'method':'grid','parameters':{" p "}," TAIL "}"
#define ASHA(extra) "{'method':'asha'," GOOD_PARAMS "," TAIL "," extra "}"
#define V11 "{'values':[1,2,3,4,5,6,7,8,9,10,11]}"

typedef struct bad_case {
    const char *search;
    int status;
    const char *code;
    const char *field;
} bad_case;

static const bad_case BAD[] = {
    {"[]", 422, "invalid_type", "search"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'foo':1}", 422, "unknown_field", "search.foo"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'seed':1,'seed':2}", 400, "bad_json", "search.seed"},
    {"{" GOOD_PARAMS "," TAIL "}", 422, "missing_field", "search.method"},
    {"{'method':'bayes'," GOOD_PARAMS "," TAIL "}", 422, "invalid_value", "search.method"},
    {"{'method':1," GOOD_PARAMS "," TAIL "}", 422, "invalid_type", "search.method"},
    {"{'method':'grid'," TAIL "}", 422, "missing_field", "search.parameters"},
    {"{'method':'grid','parameters':[]," TAIL "}", 422, "invalid_type", "search.parameters"},
    {"{'method':'grid','parameters':{}," TAIL "}", 422, "invalid_value", "search.parameters"},
    {GRID("'fit..batch_size':{'values':[1]}"), 422, "invalid_value", "search.parameters.fit..batch_size"},
    {GRID("'model.layers[01].units':{'values':[1]}"), 422, "invalid_value",
     "search.parameters.model.layers[01].units"},
    {GRID("'[1].units':{'values':[1]}"), 422, "invalid_value", "search.parameters.[1].units"},
    {GRID("'fit.batch_size':[32,64]"), 422, "invalid_type", "search.parameters.fit.batch_size"},
    {GRID("'fit.batch_size':{}"), 422, "missing_field", "search.parameters.fit.batch_size"},
    {GRID("'fit.batch_size':{'valuez':[1]}"), 422, "unknown_field", "search.parameters.fit.batch_size.valuez"},
    {RANDOM("'fit.batch_size':{'values':[1],'int':[1,2]}"), 422, "invalid_value",
     "search.parameters.fit.batch_size.int"},
    {GRID("'fit.batch_size':{'values':[]}"), 422, "invalid_value", "search.parameters.fit.batch_size.values"},
    {GRID("'fit.batch_size':{'values':5}"), 422, "invalid_type", "search.parameters.fit.batch_size.values"},
    {GRID("'fit.batch_size':{'values':[1,[2]]}"), 422, "invalid_type",
     "search.parameters.fit.batch_size.values[1]"},
    {GRID("'fit.batch_size':{'values':[null]}"), 422, "invalid_type",
     "search.parameters.fit.batch_size.values[0]"},
    {RANDOM("'x':{'uniform':[1]}"), 422, "invalid_type", "search.parameters.x.uniform"},
    {RANDOM("'x':{'uniform':[1,'2']}"), 422, "invalid_type", "search.parameters.x.uniform"},
    {RANDOM("'x':{'uniform':[2,1]}"), 422, "invalid_value", "search.parameters.x.uniform"},
    {RANDOM("'x':{'uniform':[1,1]}"), 422, "invalid_value", "search.parameters.x.uniform"},
    {RANDOM("'x':{'uniform':[-1e308,1e308]}"), 422, "invalid_value", "search.parameters.x.uniform"},
    {RANDOM("'x':{'log_uniform':[0,1]}"), 422, "invalid_value", "search.parameters.x.log_uniform"},
    {RANDOM("'x':{'int':[1.5,3]}"), 422, "invalid_type", "search.parameters.x.int"},
    {RANDOM("'x':{'int':[3,3]}"), 422, "invalid_value", "search.parameters.x.int"},
    {GRID("'x':{'uniform':[0,1]}"), 422, "invalid_value", "search.parameters.x.uniform"},
    {GRID("'fit.batch_size':{'values':[1]},'fit.batch_size':{'values':[2]}"), 400, "bad_json",
     "search.parameters.fit.batch_size"},
    {GRID("'fit':{'values':[1]},'fit.batch_size':{'values':[2]}"), 422, "invalid_value",
     "search.parameters.fit.batch_size"},
    {GRID("'model.layers[1].units':{'values':[1]},'model.layers':{'values':[2]}"), 422, "invalid_value",
     "search.parameters.model.layers"},
    {"{'method':'asha','parameters':{'fit.epochs':{'values':[1,2]}}," TAIL ",'max_epochs':9}", 422,
     "invalid_value", "search.parameters.fit.epochs"},
    {"{'method':'grid'," GOOD_PARAMS ",'mode':'max'}", 422, "missing_field", "search.metric"},
    {"{'method':'grid'," GOOD_PARAMS ",'metric':'val acc','mode':'max'}", 422, "invalid_value", "search.metric"},
    {"{'method':'grid'," GOOD_PARAMS ",'metric':'','mode':'max'}", 422, "invalid_value", "search.metric"},
    {"{'method':'grid'," GOOD_PARAMS ",'metric':3,'mode':'max'}", 422, "invalid_type", "search.metric"},
    {"{'method':'grid'," GOOD_PARAMS ",'metric':'val_loss'}", 422, "missing_field", "search.mode"},
    {"{'method':'grid'," GOOD_PARAMS ",'metric':'val_loss','mode':'maximize'}", 422, "invalid_value",
     "search.mode"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'max_trials':0}", 422, "invalid_value", "search.max_trials"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'max_trials':1001}", 422, "invalid_value", "search.max_trials"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'max_trials':2.5}", 422, "invalid_type", "search.max_trials"},
    {"{'method':'random','parameters':{'x':{'uniform':[0,1]}}," TAIL "}", 422, "missing_field",
     "search.max_trials"},
    {"{'method':'random','parameters':{'a':" V11 ",'b':" V11 ",'c':" V11 "}," TAIL "}", 422, "missing_field",
     "search.max_trials"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'max_trials':3}", 422, "invalid_value", "search.max_trials"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'max_concurrent':0}", 422, "invalid_value",
     "search.max_concurrent"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'max_concurrent':101}", 422, "invalid_value",
     "search.max_concurrent"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'seed':-1}", 422, "invalid_value", "search.seed"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'seed':1.5}", 422, "invalid_type", "search.seed"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'seed':'7'}", 422, "invalid_type", "search.seed"},
    {"{'method':'grid'," GOOD_PARAMS "," TAIL ",'max_epochs':9}", 422, "unknown_field", "search.max_epochs"},
    {"{'method':'random'," GOOD_PARAMS "," TAIL ",'reduction_factor':3}", 422, "unknown_field",
     "search.reduction_factor"},
    {"{'method':'asha'," GOOD_PARAMS "," TAIL "}", 422, "missing_field", "search.max_epochs"},
    {ASHA("'max_epochs':0"), 422, "invalid_value", "search.max_epochs"},
    {ASHA("'max_epochs':10001"), 422, "invalid_value", "search.max_epochs"},
    {ASHA("'max_epochs':9,'min_epochs':10"), 422, "invalid_value", "search.min_epochs"},
    {ASHA("'max_epochs':9,'min_epochs':0"), 422, "invalid_value", "search.min_epochs"},
    {ASHA("'max_epochs':9,'reduction_factor':1"), 422, "invalid_value", "search.reduction_factor"},
    {ASHA("'max_epochs':9,'reduction_factor':11"), 422, "invalid_value", "search.reduction_factor"},
    {GRID("'a':" V11 ",'b':" V11 ",'c':" V11), 422, "invalid_value", "search.parameters"},
};

START_TEST(test_bad_searches) {
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        cJSON *j = qjson(BAD[i].search);
        sweep_search s;
        spec_error e;
        int rc = sweep_search_parse(j, &s, &e);
        ck_assert_msg(rc == -1, "case %zu: expected failure for %s", i, BAD[i].search);
        ck_assert_msg(e.status == BAD[i].status && strcmp(e.code, BAD[i].code) == 0 &&
                          strcmp(e.field, BAD[i].field) == 0,
                      "case %zu (%s): expected %d %s %s, got %d %s %s: %s", i, BAD[i].search, BAD[i].status,
                      BAD[i].code, BAD[i].field, e.status, e.code, e.field, e.message);
        ck_assert_msg(e.message[0] != '\0', "case %zu: no message", i);
        cJSON_Delete(j);
    }
}
END_TEST

/* A grid of 11 x 11 = 121 trials with no max_trials is fine; with 11^3 it
 * is past SWEEP_MAX_TRIALS (the last table row). 17 parameters are one too
 * many. The messages say what a user needs to fix it. */
START_TEST(test_limits_and_messages) {
    sweep_search s;
    parse_ok(GRID("'a':" V11 ",'b':" V11), &s);
    ck_assert_int_eq(sweep_n_trials(&s), 121);
    sweep_search_release(&s);

    buf b;
    buf_init(&b, 4096);
    ck_assert_int_eq(buf_appends(&b, "{'method':'random','max_trials':3," TAIL ",'parameters':{"), 0);
    for (int i = 0; i < SWEEP_MAX_PARAMS + 1; i++)
        ck_assert_int_eq(buf_printf(&b, "%s'p%d':{'values':[1]}", i ? "," : "", i), 0);
    ck_assert_int_eq(buf_appends(&b, "}}"), 0);
    cJSON *j = qjson(b.data);
    buf_release(&b);
    spec_error e;
    ck_assert_int_eq(sweep_search_parse(j, &s, &e), -1);
    ck_assert_str_eq(e.field, "search.parameters");
    ck_assert_str_eq(e.message, "must hold 1 to 16 parameters, got 17");
    cJSON_Delete(j);

    j = qjson(GRID("'a':" V11 ",'b':" V11 ",'c':" V11));
    ck_assert_int_eq(sweep_search_parse(j, &s, &e), -1);
    ck_assert_str_eq(e.message, "a grid runs every combination, at most 1000; these values lists make 1331");
    cJSON_Delete(j);

    j = qjson(RANDOM("'x':{'uniform':[2,1]}"));
    ck_assert_int_eq(sweep_search_parse(j, &s, &e), -1);
    ck_assert_str_eq(e.message, "must be [lo, hi] with lo < hi, got [2, 1]");
    cJSON_Delete(j);
}
END_TEST

START_TEST(test_defaults_and_round_trip) {
    sweep_search s;
    parse_ok(GRID("'compile.optimizer.learning_rate':{'values':[0.1,0.01,0.001]},"
                  "'fit.batch_size':{'values':[32,64]}"),
             &s);
    ck_assert_int_eq(s.method, SWEEP_GRID);
    ck_assert_int_eq(s.n_params, 2);
    ck_assert_str_eq(s.params[0].path, "compile.optimizer.learning_rate");
    ck_assert_int_eq(s.max_trials, 6);
    ck_assert_int_eq(sweep_n_trials(&s), 6);
    ck_assert_int_eq(sweep_grid_size(&s), 6);
    ck_assert_int_eq(s.max_concurrent, 2);
    ck_assert_int_eq(s.mode_max, 1);
    ck_assert_str_eq(s.metric, "val_accuracy");
    sweep_search_release(&s);
    sweep_search_release(&s); /* twice is safe */

    /* random with values only: the grid's size by default */
    parse_ok("{'method':'random','parameters':{'a':{'values':[1,2,3]},'b':{'values':[true,false]}},"
             "'metric':'val_loss','mode':'min','seed':9007199254740991}", &s);
    ck_assert_int_eq(s.max_trials, 6);
    ck_assert_int_eq(s.mode_max, 0);
    ck_assert(s.seed == 9007199254740991ULL);
    sweep_search_release(&s);

    parse_ok(ASHA("'max_epochs':27"), &s);
    ck_assert_int_eq(s.max_epochs, 27);
    ck_assert_int_eq(s.min_epochs, 1);
    ck_assert_int_eq(s.reduction_factor, 3);
    ck_assert_int_eq(s.max_trials, 2);
    sweep_search_release(&s);

    /* parse(to_json(parse(x))) == parse(x), for every method and distribution */
    static const char *const ROUND[] = {
        GRID("'fit.batch_size':{'values':[32,64]},'data.source':{'values':['mnist','fashion-mnist']}"),
        "{'method':'random','parameters':{'compile.optimizer.learning_rate':{'log_uniform':[1e-05,0.1]},"
        "'model.layers[1].units':{'int':[16,256]},'x':{'uniform':[0.1,0.30000000000000004]},"
        "'command.env.MODE':{'values':['a',true,2.5]}},"
        "'metric':'loss','mode':'min','max_trials':40,'max_concurrent':7,'seed':123}",
        "{'method':'asha','parameters':{'fit.batch_size':{'int':[-3,9007199254740991]}},'metric':'m.x-1',"
        "'mode':'max','max_trials':81,'max_epochs':81,'min_epochs':3,'reduction_factor':4}",
    };
    for (size_t i = 0; i < sizeof ROUND / sizeof ROUND[0]; i++) {
        sweep_search a, b;
        parse_ok(ROUND[i], &a);
        cJSON *ja = sweep_search_to_json(&a);
        ck_assert_ptr_nonnull(ja);
        spec_error e;
        ck_assert_msg(sweep_search_parse(ja, &b, &e) == 0, "%s: %s", e.field, e.message);
        cJSON *jb = sweep_search_to_json(&b);
        char *ta = print(ja), *tb = print(jb);
        ck_assert_str_eq(ta, tb);
        ck_assert_int_eq(a.method, b.method);
        ck_assert_int_eq(a.n_params, b.n_params);
        for (int k = 0; k < a.n_params; k++) {
            ck_assert_str_eq(a.params[k].path, b.params[k].path);
            ck_assert_int_eq(a.params[k].dist, b.params[k].dist);
            ck_assert(a.params[k].lo == b.params[k].lo && a.params[k].hi == b.params[k].hi);
            if (a.params[k].dist == SP_VALUES) ck_assert(cJSON_Compare(a.params[k].values, b.params[k].values, 1));
        }
        ck_assert_str_eq(a.metric, b.metric);
        ck_assert(a.mode_max == b.mode_max && a.max_trials == b.max_trials &&
                  a.max_concurrent == b.max_concurrent && a.seed == b.seed && a.max_epochs == b.max_epochs &&
                  a.min_epochs == b.min_epochs && a.reduction_factor == b.reduction_factor);
        free(ta);
        free(tb);
        cJSON_Delete(ja);
        cJSON_Delete(jb);
        sweep_search_release(&a);
        sweep_search_release(&b);
    }
    /* what the normalized form of a grid says, defaults filled in */
    sweep_search g;
    parse_ok(GRID("'fit.batch_size':{'values':[32,64]}"), &g);
    cJSON *jg = sweep_search_to_json(&g);
    char *tg = print(jg);
    ck_assert_str_eq(tg, "{\"method\":\"grid\",\"parameters\":{\"fit.batch_size\":{\"values\":[32,64]}},"
                         "\"metric\":\"val_accuracy\",\"mode\":\"max\",\"max_trials\":2,\"max_concurrent\":2,"
                         "\"seed\":0}");
    free(tg);
    cJSON_Delete(jg);
    sweep_search_release(&g);
}
END_TEST

/* ---------------------------------------------------------------- trials */

START_TEST(test_grid_order) {
    sweep_search s;
    parse_ok(GRID("'compile.optimizer.learning_rate':{'values':[0.1,0.01,0.001]},"
                  "'fit.batch_size':{'values':[32,64]}"),
             &s);
    static const char *const WANT[] = {
        "{\"compile.optimizer.learning_rate\":0.1,\"fit.batch_size\":32}",
        "{\"compile.optimizer.learning_rate\":0.1,\"fit.batch_size\":64}",
        "{\"compile.optimizer.learning_rate\":0.01,\"fit.batch_size\":32}",
        "{\"compile.optimizer.learning_rate\":0.01,\"fit.batch_size\":64}",
        "{\"compile.optimizer.learning_rate\":0.001,\"fit.batch_size\":32}",
        "{\"compile.optimizer.learning_rate\":0.001,\"fit.batch_size\":64}",
    };
    ck_assert_int_eq(sweep_n_trials(&s), 6);
    for (int t = 0; t < 6; t++) {
        cJSON *p = sweep_trial_params(&s, t);
        ck_assert_ptr_nonnull(p);
        char *txt = print(p);
        ck_assert_str_eq(txt, WANT[t]);
        free(txt);
        cJSON_Delete(p);
    }
    ck_assert_ptr_null(sweep_trial_params(&s, 6));
    ck_assert_ptr_null(sweep_trial_params(&s, -1));
    sweep_search_release(&s);

    /* three lists: trial 13 of 3x3x2 is (1, 0, 1) in mixed radix */
    parse_ok(GRID("'a':{'values':['a0','a1','a2']},'b':{'values':['b0','b1','b2']},'c':{'values':[false,true]}"), &s);
    ck_assert_int_eq(sweep_n_trials(&s), 18);
    cJSON *p = sweep_trial_params(&s, 13);
    char *txt = print(p);
    ck_assert_str_eq(txt, "{\"a\":\"a2\",\"b\":\"b0\",\"c\":true}");
    free(txt);
    cJSON_Delete(p);
    sweep_search_release(&s);

    /* max_trials below the grid: the first trials in the same order */
    parse_ok("{'method':'grid','parameters':{'a':{'values':[1,2,3]}}," TAIL ",'max_trials':2}", &s);
    ck_assert_int_eq(sweep_n_trials(&s), 2);
    ck_assert_ptr_null(sweep_trial_params(&s, 2));
    sweep_search_release(&s);
}
END_TEST

/* The generator docs/sweeps.md documents, written again from the page:
 * splitmix64, trial t's state mix(mix(seed) + t). */
static uint64_t ref_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t ref_next(uint64_t *st) {
    *st += 0x9E3779B97F4A7C15ULL;
    return ref_mix(*st);
}

#define DRAW_SEARCH(seed)                                                                          \
    "{'method':'random','parameters':{'u':{'uniform':[0.1,0.2]},'lr':{'log_uniform':[1e-05,0.1]}," \
    "'n':{'int':[1,3]},'v':{'values':['a','b','c']}},'metric':'val_loss','mode':'min',"           \
    "'max_trials':1000,'seed':" seed "}"

/* Random and ASHA over values only: the combinations without replacement,
 * shuffled by the seed; as many trials as combinations try each once. */
START_TEST(test_values_without_replacement) {
    for (int method = 0; method < 2; method++) {
        for (int trials = 12; trials >= 5; trials -= 7) {
            char text[512];
            snprintf(text, sizeof text,
                     "{'method':'%s','parameters':{'lr':{'values':[0.0003,0.001,0.003,0.01]},"
                     "'bs':{'values':[32,64,128]}},'metric':'val_accuracy','mode':'max','max_trials':%d,'seed':3%s}",
                     method ? "asha" : "random", trials, method ? ",'max_epochs':9" : "");
            sweep_search a, b;
            parse_ok(text, &a);
            parse_ok(text, &b);
            char seen[12][64];
            for (int t = 0; t < trials; t++) {
                cJSON *pa = sweep_trial_params(&a, t), *pb = sweep_trial_params(&b, t);
                ck_assert(pa && pb);
                ck_assert(cJSON_Compare(pa, pb, 1)); /* the same seed, the same order */
                snprintf(seen[t], sizeof seen[t], "%g/%g", cJSON_GetObjectItem(pa, "lr")->valuedouble,
                         cJSON_GetObjectItem(pa, "bs")->valuedouble);
                for (int k = 0; k < t; k++) ck_assert_msg(strcmp(seen[k], seen[t]) != 0, "%s twice", seen[t]);
                cJSON_Delete(pa);
                cJSON_Delete(pb);
            }
            /* not the grid's own order */
            if (trials == 12) ck_assert_msg(strcmp(seen[0], "0.0003/32") != 0 || strcmp(seen[1], "0.0003/64") != 0,
                                            "the combinations were not shuffled");
            sweep_search_release(&a);
            sweep_search_release(&b);
        }
    }
}
END_TEST

START_TEST(test_random_draws) {
    /* the reference generator is splitmix64: seed 1234567 gives Vigna's published first outputs */
    uint64_t st = 1234567;
    ck_assert(ref_next(&st) == 6457827717110365317ULL);
    ck_assert(ref_next(&st) == 3203168211198807973ULL);

    sweep_search a, b, c;
    parse_ok(DRAW_SEARCH("7"), &a);
    parse_ok(DRAW_SEARCH("7"), &b);
    parse_ok(DRAW_SEARCH("8"), &c);
    int decade[4] = {0}, ints[4] = {0}, vals[3] = {0}, differ = 0;
    double usum = 0;
    for (int t = 0; t < 1000; t++) {
        cJSON *pa = sweep_trial_params(&a, t), *pb = sweep_trial_params(&b, t), *pc = sweep_trial_params(&c, t);
        ck_assert(pa && pb && pc);
        ck_assert_msg(cJSON_Compare(pa, pb, 1), "trial %d differs for the same seed", t);
        if (!cJSON_Compare(pa, pc, 1)) differ++;
        double u = cJSON_GetObjectItem(pa, "u")->valuedouble;
        double lr = cJSON_GetObjectItem(pa, "lr")->valuedouble;
        double n = cJSON_GetObjectItem(pa, "n")->valuedouble;
        const char *v = cJSON_GetObjectItem(pa, "v")->valuestring;
        ck_assert(u >= 0.1 && u <= 0.2);
        ck_assert(lr >= 1e-5 && lr <= 0.1);
        ck_assert(n == 1 || n == 2 || n == 3);
        ck_assert(v[0] >= 'a' && v[0] <= 'c' && v[1] == '\0');
        usum += u;
        int d = (int)floor(log10(lr) + 5);
        decade[d < 0 ? 0 : d > 3 ? 3 : d]++;
        ints[(int)n]++;
        vals[v[0] - 'a']++;
        /* the documented rule, reproduced: one 64-bit draw for u, then lr (int and
         * values reject a draw below 2^64 mod n, too rare to show here) */
        if (t < 20) {
            uint64_t s = ref_mix(ref_mix(7) + (uint64_t)t);
            double du = 0.1 + (double)(ref_next(&s) >> 11) * 0x1.0p-53 * (0.2 - 0.1);
            double dl = exp(log(1e-5) + (double)(ref_next(&s) >> 11) * 0x1.0p-53 * (log(0.1) - log(1e-5)));
            ck_assert_msg(du == u && dl == lr, "trial %d: %.17g %.17g, reference %.17g %.17g", t, u, lr, du, dl);
            uint64_t r = ref_next(&s);
            ck_assert(n == (double)(1 + r % 3));
            r = ref_next(&s);
            ck_assert(v[0] == (char)('a' + r % 3));
        }
        cJSON_Delete(pa);
        cJSON_Delete(pb);
        cJSON_Delete(pc);
    }
    ck_assert_int_ge(differ, 990);
    /* uniform in log space: each of the 4 decades gets about a quarter */
    for (int d = 0; d < 4; d++) ck_assert_msg(decade[d] > 180 && decade[d] < 320, "decade %d: %d", d, decade[d]);
    ck_assert(fabs(usum / 1000 - 0.15) < 0.005);
    /* both ends of the integer range are drawn */
    ck_assert(ints[1] > 250 && ints[2] > 250 && ints[3] > 250);
    ck_assert(vals[0] > 250 && vals[1] > 250 && vals[2] > 250);
    /* a trial is the same whatever was drawn before it */
    cJSON *late = sweep_trial_params(&a, 999), *again = sweep_trial_params(&b, 999);
    ck_assert(cJSON_Compare(late, again, 1));
    cJSON_Delete(late);
    cJSON_Delete(again);
    sweep_search_release(&a);
    sweep_search_release(&b);
    sweep_search_release(&c);

    /* a 2-wide integer range and a huge one stay inside their bounds */
    parse_ok("{'method':'asha','parameters':{'k':{'int':[-1,0]},'big':{'int':[-9007199254740991,"
             "9007199254740991]}},'metric':'m','mode':'max','max_trials':200,'max_epochs':3}", &a);
    int seen[2] = {0};
    for (int t = 0; t < 200; t++) {
        cJSON *p = sweep_trial_params(&a, t);
        double k = cJSON_GetObjectItem(p, "k")->valuedouble;
        double big = cJSON_GetObjectItem(p, "big")->valuedouble;
        ck_assert(k == -1 || k == 0);
        seen[(int)k + 1]++;
        ck_assert(big == floor(big) && fabs(big) <= 9007199254740991.0);
        cJSON_Delete(p);
    }
    ck_assert(seen[0] > 0 && seen[1] > 0);
    sweep_search_release(&a);
}
END_TEST

/* ---------------------------------------------------------------- apply */

static cJSON *load_example(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "examples/%s", name);
    size_t len = 0;
    char *text = file_read_all(path, 1 << 20, &len);
    ck_assert_msg(text != NULL, "cannot read %s (run from the repository root)", path);
    cJSON *j = cJSON_Parse(text);
    ck_assert_ptr_nonnull(j);
    free(text);
    return j;
}

/* Applies params to spec: returns rc, fills the parsed result (on success)
 * or e and field. */
static int apply(const cJSON *spec, const char *params, jobspec *js, spec_error *e, char *field) {
    cJSON *p = qjson(params);
    char *out = NULL;
    int rc = sweep_apply(spec, p, &out, field, 128, e);
    cJSON_Delete(p);
    if (rc == 0) {
        ck_assert_ptr_nonnull(out);
        spec_error pe;
        ck_assert_msg(jobspec_parse(out, strlen(out), js, &pe) == 0, "normalized spec refused: %s", pe.message);
        free(out);
    } else {
        ck_assert_ptr_null(out);
    }
    return rc;
}

START_TEST(test_apply_training) {
    cJSON *spec = load_example("fashion_mnist_quick.json");
    char *before = print(spec);
    jobspec js;
    spec_error e;
    char field[128];
    int rc = apply(spec, "{'compile.optimizer.learning_rate':0.01,'fit.batch_size':128,'model.layers[1].units':64}",
                   &js, &e, field);
    ck_assert_msg(rc == 0, "%s %s", e.field, e.message);
    ck_assert(js.optimizer.learning_rate == 0.01f);
    ck_assert_int_eq(js.optimizer.type, OPT_ADAM);
    ck_assert_int_eq(js.fit.batch_size, 128);
    ck_assert_int_eq(js.layers[1].units, 64);
    ck_assert_int_eq(js.fit.epochs, 2); /* the rest of the spec as it was */
    ck_assert_int_eq(js.layers[2].units, 10);
    jobspec_release(&js);
    /* the caller's spec is not changed */
    char *after = print(spec);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);

    /* refused values name the parameter; the spec's own error says why */
    ck_assert_int_eq(apply(spec, "{'compile.optimizer.learning_rate':0.01,'fit.batch_size':0}", &js, &e, field), -1);
    ck_assert_str_eq(field, "fit.batch_size");
    ck_assert_int_eq(e.status, 422);
    ck_assert_str_eq(e.field, "fit.batch_size");
    ck_assert_str_eq(e.message, "must be an integer between 1 and 65536, got 0");

    ck_assert_int_eq(apply(spec, "{'fit.batch_size':32,'model.layers[1].units':-1}", &js, &e, field), -1);
    ck_assert_str_eq(field, "model.layers[1].units");
    ck_assert_str_eq(e.field, "model.layers[1].units");

    ck_assert_int_eq(apply(spec, "{'fit.batch_size':32,'model.layers[9].units':16}", &js, &e, field), -1);
    ck_assert_str_eq(field, "model.layers[9].units");
    ck_assert_int_eq(e.status, 422);
    ck_assert_str_eq(e.field, "model.layers[9]");
    ck_assert_str_eq(e.message, "model.layers has 3 entries: there is no [9]");

    /* a field the spec does not have: its unknown_field error lies above the path */
    ck_assert_int_eq(apply(spec, "{'fit.batch_size':32,'fit.epochz':3}", &js, &e, field), -1);
    ck_assert_str_eq(e.code, "unknown_field");
    ck_assert_str_eq(e.field, "fit.epochz");
    ck_assert_str_eq(field, "fit.epochz");
    ck_assert_int_eq(apply(spec, "{'fit.batch_size':32,'model.layers[1].units.x':3}", &js, &e, field), -1);
    ck_assert_str_eq(e.code, "invalid_type");
    ck_assert_str_eq(e.field, "model.layers[1].units");
    ck_assert_str_eq(field, "model.layers[1].units.x");
    ck_assert_int_eq(apply(spec, "{'fit.batch_size':32,'name[0]':3}", &js, &e, field), -1);
    ck_assert_str_eq(field, "name[0]");
    ck_assert_str_eq(e.field, "name");
    /* a refusal of the whole spec that names no parameter: the first one */
    ck_assert_int_eq(apply(spec, "{'data.validation_split':0.5,'data.source':'mnist'}", &js, &e, field), -1);
    ck_assert_str_eq(field, "data.validation_split");
    cJSON_Delete(spec);

    /* "optimizer": "sgd" is {"type": "sgd"}: a learning rate can be varied on it */
    spec = load_example("synthetic_binary.json");
    cJSON *opt = cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "compile"), "optimizer");
    ck_assert_ptr_nonnull(opt);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(spec, "compile"), "optimizer", cJSON_CreateString("sgd"));
    ck_assert_int_eq(apply(spec, "{'compile.optimizer.learning_rate':0.125,'compile.optimizer.momentum':0.5}",
                           &js, &e, field), 0);
    ck_assert_int_eq(js.optimizer.type, OPT_SGD);
    ck_assert(js.optimizer.learning_rate == 0.125f && js.optimizer.momentum == 0.5f);
    jobspec_release(&js);
    /* missing objects are created: a checkpoint block the spec did not have */
    ck_assert_int_eq(apply(spec, "{'checkpoint.keep':7}", &js, &e, field), 0);
    ck_assert_int_eq(js.checkpoint.keep, 7);
    jobspec_release(&js);
    cJSON_Delete(spec);
}
END_TEST

static const char *env_of(const jobspec *js, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < js->command.n_env; i++)
        if (strncmp(js->command.env[i], name, n) == 0 && js->command.env[i][n] == '=') return js->command.env[i] + n + 1;
    return NULL;
}

START_TEST(test_apply_command) {
    cJSON *spec = load_example("tf_config_check.json");
    ck_assert_ptr_null(cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "command"), "env"));
    jobspec js;
    spec_error e;
    char field[128];
    int rc = apply(spec, "{'command.env.LR':0.001,'command.env.LAYERS':3,'command.env.BIG':100000,"
                         "'command.env.SUM':0.30000000000000004,'command.env.AMSGRAD':true,"
                         "'command.env.OPT':'adam','command.argv[1]':'examples/other.py'}",
                   &js, &e, field);
    ck_assert_msg(rc == 0, "%s %s", e.field, e.message);
    ck_assert_int_eq(js.kind, JOB_KIND_COMMAND);
    ck_assert_str_eq(env_of(&js, "LR"), "0.001");
    ck_assert_str_eq(env_of(&js, "LAYERS"), "3");
    ck_assert_str_eq(env_of(&js, "BIG"), "100000");
    ck_assert_str_eq(env_of(&js, "SUM"), "0.30000000000000004");
    ck_assert_str_eq(env_of(&js, "AMSGRAD"), "true");
    ck_assert_str_eq(env_of(&js, "OPT"), "adam");
    ck_assert_str_eq(js.command.argv[1], "examples/other.py");
    jobspec_release(&js);

    /* a drawn float keeps every digit: the text reads back as the same double */
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "command.env.LR", 0.00123456789012345678);
    char *out = NULL;
    ck_assert_int_eq(sweep_apply(spec, p, &out, field, sizeof field, &e), 0);
    ck_assert_int_eq(jobspec_parse(out, strlen(out), &js, &e), 0);
    ck_assert(strtod(env_of(&js, "LR"), NULL) == 0.00123456789012345678);
    jobspec_release(&js);
    free(out);
    cJSON_Delete(p);

    /* names trainyard sets are refused, named by parameter */
    ck_assert_int_eq(apply(spec, "{'command.env.LR':0.1,'command.env.RANK':1}", &js, &e, field), -1);
    ck_assert_str_eq(field, "command.env.RANK");
    ck_assert_str_eq(e.field, "command.env.RANK");
    /* a training field on a command job */
    ck_assert_int_eq(apply(spec, "{'command.env.LR':0.1,'fit.batch_size':64}", &js, &e, field), -1);
    ck_assert_str_eq(field, "fit.batch_size");
    ck_assert_str_eq(e.field, "fit");
    cJSON_Delete(spec);
}
END_TEST

/* ---------------------------------------------------------------- ASHA */

static void rungs_are(int mn, int eta, int mx, const int *want, int n) {
    sweep_search s = {.method = SWEEP_ASHA, .min_epochs = mn, .reduction_factor = eta, .max_epochs = mx};
    int got[SWEEP_MAX_RUNGS];
    int k = asha_rung_epochs(&s, got, SWEEP_MAX_RUNGS);
    ck_assert_msg(k == n, "(%d, %d, %d): %d rungs, want %d", mn, eta, mx, k, n);
    for (int i = 0; i < n; i++) ck_assert_msg(got[i] == want[i], "(%d, %d, %d) rung %d: %d, want %d", mn, eta, mx, i, got[i], want[i]);
}

START_TEST(test_rungs) {
    rungs_are(1, 3, 9, (int[]){1, 3, 9}, 3);
    rungs_are(1, 3, 10, (int[]){1, 3, 9, 10}, 4);
    rungs_are(1, 3, 8, (int[]){1, 3, 8}, 3);
    rungs_are(2, 2, 16, (int[]){2, 4, 8, 16}, 4);
    rungs_are(5, 3, 5, (int[]){5}, 1);
    rungs_are(1, 4, 100, (int[]){1, 4, 16, 64, 100}, 5);
    rungs_are(1, 2, 10000, (int[]){1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 10000}, 15);
    /* a short array: the count all the same */
    sweep_search s = {.method = SWEEP_ASHA, .min_epochs = 1, .reduction_factor = 3, .max_epochs = 10};
    int two[2];
    ck_assert_int_eq(asha_rung_epochs(&s, two, 2), 4);
    ck_assert(two[0] == 1 && two[1] == 3);
    s.method = SWEEP_RANDOM;
    ck_assert_int_eq(asha_rung_epochs(&s, two, 2), 0);
}
END_TEST

START_TEST(test_score) {
    sweep_search s = {.mode_max = 1};
    ck_assert(asha_score(&s, 0.9) > asha_score(&s, 0.8));
    ck_assert(asha_score(&s, NAN) < asha_score(&s, -1e300));
    s.mode_max = 0;
    ck_assert(asha_score(&s, 0.1) > asha_score(&s, 0.2));
    ck_assert(asha_score(&s, NAN) < asha_score(&s, 1e300));
}
END_TEST

/* Runs a sweep one trial at a time (max_concurrent 1): each trial reports
 * metric[trial][rung] at the end of a rung. Writes each decision into log
 * ("S3" started trial 3, "P3>1" resumed trial 3 to rung 1, from its
 * checkpoint) and returns the epochs trained in all (a promoted trial goes
 * on from its checkpoint). With ask, a trial at a rung's end first asks
 * asha_continues, as its worker does: "C3>1", trial 3 went on to rung 1 in
 * its process, its slot kept; else the slot frees for asha_next. */
static int run_script_ask(const sweep_search *s, const double metric[][3], int ask, char *log, size_t cap,
                          int *reached) {
    int epochs[SWEEP_MAX_RUNGS];
    int nr = asha_rung_epochs(s, epochs, SWEEP_MAX_RUNGS);
    asha_rung_entry rows[64];
    int n = 0, started = 0, total = 0;
    log[0] = '\0';
    for (int step = 0; step < 100; step++) {
        int t = -1, r = -1;
        if (ask && n > 0) {
            /* the trial that just reported (the last row, not yet ranked by others) */
            asha_rung_entry *me = &rows[n - 1];
            int go = asha_continues(s, rows, n - 1, me->trial, me->rung, me->metric);
            ck_assert_int_ge(go, 0);
            if (go) {
                me->promoted = 1;
                t = me->trial;
                r = me->rung + 1;
                size_t used = strlen(log);
                ck_assert_int_eq(sfmt(log + used, cap - used, "C%d>%d ", t, r), 0);
                total += epochs[r] - epochs[r - 1];
                reached[t] = r;
                ck_assert(n < 64);
                rows[n++] = (asha_rung_entry){t, r, metric[t][r], 0};
                continue;
            }
        }
        /* a full machine waits */
        ck_assert_int_eq(asha_next(s, rows, n, started, s->max_concurrent, &t, &r), ASHA_WAIT);
        int what = asha_next(s, rows, n, started, 0, &t, &r);
        char ev[16];
        if (what == ASHA_DONE) return total;
        if (what == ASHA_START) {
            ck_assert_int_eq(t, started);
            ck_assert_int_eq(r, 0);
            started++;
            snprintf(ev, sizeof ev, "S%d ", t);
        } else {
            ck_assert_int_eq(what, ASHA_PROMOTE);
            ck_assert(r >= 1 && r < nr);
            int found = 0;
            for (int i = 0; i < n; i++)
                if (rows[i].trial == t && rows[i].rung == r - 1) {
                    ck_assert(!rows[i].promoted);
                    rows[i].promoted = 1;
                    found = 1;
                }
            ck_assert(found);
            snprintf(ev, sizeof ev, "P%d>%d ", t, r);
        }
        size_t used = strlen(log);
        ck_assert_int_eq(sfmt(log + used, cap - used, "%s", ev), 0);
        total += epochs[r] - (r > 0 ? epochs[r - 1] : 0);
        reached[t] = r;
        ck_assert(n < 64);
        rows[n++] = (asha_rung_entry){t, r, metric[t][r], 0};
    }
    ck_abort_msg("the sweep did not end");
    return -1;
}

static int run_script(const sweep_search *s, const double metric[][3], char *log, size_t cap, int *reached) {
    return run_script_ask(s, metric, 0, log, cap, reached);
}

/* The decisions of a log with every "C" (went on in its process) written
 * as the "P" (resumed from its checkpoint) it replaces. */
static void as_resumes(const char *log, char *out, size_t cap) {
    snprintf(out, cap, "%s", log);
    for (char *p = out; *p; p++)
        if (*p == 'C') *p = 'P';
}

START_TEST(test_asha_script) {
    sweep_search s;
    parse_ok("{'method':'asha','parameters':{'compile.optimizer.learning_rate':{'log_uniform':[1e-4,1e-1]}},"
             "'metric':'val_accuracy','mode':'max','max_trials':9,'max_concurrent':1,'max_epochs':9}", &s);
    /* rungs 1, 3, 9 epochs; every 3 trials at a rung send their best on */
    static const double ACC[9][3] = {
        {0.5, 0, 0}, {0.9, 0.91, 0}, {0.3, 0, 0}, {0.4, 0, 0}, {0.8, 0.85, 0},
        {0.2, 0, 0}, {0.1, 0, 0}, {0.7, 0.95, 0.96}, {0.6, 0, 0},
    };
    char log[512];
    int reached[9];
    int total = run_script(&s, ACC, log, sizeof log, reached);
    /* after trials 0-2, 1 (0.9) is the top third; after 3-5, 4 (0.8) joins
     * it; after 6-8, 7 (0.7); at rung 1, 7 (0.95) beats 1 and 4 */
    ck_assert_str_eq(log, "S0 S1 S2 P1>1 S3 S4 S5 P4>1 S6 S7 S8 P7>1 P7>2 ");
    /* successive halving's budget: 9 x 1 + 3 x (3 - 1) + 1 x (9 - 3) */
    ck_assert_int_eq(total, 9 * 1 + 3 * 2 + 1 * 6);
    ck_assert_int_eq(total, 21);
    /* 7 completed the last rung; the others stop early at the rung they reached */
    int done = 0;
    for (int t = 0; t < 9; t++) done += reached[t] == 2;
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(reached[7], 2);
    ck_assert(reached[1] == 1 && reached[4] == 1 && reached[0] == 0);

    /* minimizing, with a late better trial: asynchronous promotions are
     * made on what is known, so 0 goes on after the first three and later
     * ranks out of the top third; 8 arrives last and best. */
    s.mode_max = 0;
    static const double LOSS[9][3] = {
        {0.3, 0.25, 0}, {0.5, 0, 0}, {0.6, 0, 0}, {0.1, 0.08, 0.07}, {0.2, 0.15, 0},
        {0.7, 0, 0}, {0.8, 0, 0}, {0.9, 0, 0}, {0.05, 0.04, 0.03},
    };
    total = run_script(&s, LOSS, log, sizeof log, reached);
    ck_assert_str_eq(log, "S0 S1 S2 P0>1 S3 P3>1 S4 S5 P4>1 P3>2 S6 S7 S8 P8>1 P8>2 ");
    ck_assert_int_eq(total, 9 * 1 + 4 * 2 + 2 * 6);
    sweep_search_release(&s);
}
END_TEST

/* Asynchronous promotion at a rung's end: the trial that reports asks
 * before it frees its slot, and goes on at once, in its process, when its
 * result ranks in the top 1/eta of its rung so far. The decisions are the
 * ones of the slot-by-slot controller (the same trials promoted to the
 * same rungs, in the same order, the same epochs), but a promotion at the
 * rung's end starts no process and reads no checkpoint. */
START_TEST(test_asha_script_continue) {
    sweep_search s;
    parse_ok("{'method':'asha','parameters':{'compile.optimizer.learning_rate':{'log_uniform':[1e-4,1e-1]}},"
             "'metric':'val_accuracy','mode':'max','max_trials':9,'max_concurrent':1,'max_epochs':9}", &s);
    static const double ACC[9][3] = {
        {0.5, 0, 0}, {0.9, 0.91, 0}, {0.3, 0, 0}, {0.4, 0, 0}, {0.8, 0.85, 0},
        {0.2, 0, 0}, {0.1, 0, 0}, {0.7, 0.95, 0.96}, {0.6, 0, 0},
    };
    char log[512], old[512], same[512];
    int reached[9], was[9];
    int before = run_script(&s, ACC, old, sizeof old, was);
    int total = run_script_ask(&s, ACC, 1, log, sizeof log, reached);
    /* 7 (0.95) is the best of the 3 at rung 1 when it reports: it goes on to rung 2 in its process */
    ck_assert_str_eq(log, "S0 S1 S2 P1>1 S3 S4 S5 P4>1 S6 S7 S8 P7>1 C7>2 ");
    as_resumes(log, same, sizeof same);
    ck_assert_str_eq(same, old);
    ck_assert_int_eq(total, before);
    ck_assert_int_eq(memcmp(reached, was, sizeof was), 0);

    /* minimizing: 3 and 8 each rank first at rung 0 when they report, and 8
     * first at rung 1 too: four promotions of six start no process */
    s.mode_max = 0;
    static const double LOSS[9][3] = {
        {0.3, 0.25, 0}, {0.5, 0, 0}, {0.6, 0, 0}, {0.1, 0.08, 0.07}, {0.2, 0.15, 0},
        {0.7, 0, 0}, {0.8, 0, 0}, {0.9, 0, 0}, {0.05, 0.04, 0.03},
    };
    before = run_script(&s, LOSS, old, sizeof old, was);
    total = run_script_ask(&s, LOSS, 1, log, sizeof log, reached);
    ck_assert_str_eq(log, "S0 S1 S2 P0>1 S3 C3>1 S4 S5 P4>1 P3>2 S6 S7 S8 C8>1 C8>2 ");
    as_resumes(log, same, sizeof same);
    ck_assert_str_eq(same, old);
    ck_assert_int_eq(total, before);
    ck_assert_int_eq(memcmp(reached, was, sizeof was), 0);
    sweep_search_release(&s);
}
END_TEST

START_TEST(test_continues_edges) {
    sweep_search s;
    parse_ok("{'method':'asha','parameters':{'x':{'int':[1,5]}},'metric':'m','mode':'max','max_trials':8,"
             "'max_concurrent':2,'max_epochs':9}", &s); /* rungs 1, 3, 9; eta 3 */
    /* the first results at a rung: floor(m / 3) is 0 until the third */
    ck_assert_int_eq(asha_continues(&s, NULL, 0, 0, 0, 0.9), 0);
    asha_rung_entry one[] = {{0, 0, 0.5, 0}};
    ck_assert_int_eq(asha_continues(&s, one, 1, 1, 0, 0.9), 0);
    asha_rung_entry two[] = {{0, 0, 0.5, 0}, {1, 0, 0.4, 0}};
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 0, 0.9), 1);  /* the best of 3 */
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 0, 0.45), 0); /* second of 3: 0 is the top third */
    /* promoted or not, those ahead of it count: the top third of 6 is 2 */
    asha_rung_entry five[] = {{0, 0, 0.5, 1}, {1, 0, 0.4, 0}, {2, 0, 0.9, 1}, {3, 0, 0.1, 0}, {4, 0, 0.2, 0}};
    ck_assert_int_eq(asha_continues(&s, five, 5, 5, 0, 0.6), 1);  /* second of 6 */
    ck_assert_int_eq(asha_continues(&s, five, 5, 5, 0, 0.45), 0); /* third of 6 */
    /* ties go to the lower trial; NaN is worst */
    ck_assert_int_eq(asha_continues(&s, five, 5, 5, 0, 0.5), 0);  /* ties with 0, which ranks first */
    asha_rung_entry tie[] = {{6, 0, 0.9, 0}, {1, 0, 0.4, 0}};
    ck_assert_int_eq(asha_continues(&s, tie, 2, 5, 0, 0.9), 1); /* ties with 6: 5 ranks first */
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 0, NAN), 0);
    /* only its own rung counts; rows at other rungs do not */
    asha_rung_entry mixed[] = {{0, 0, 0.5, 1}, {1, 0, 0.4, 0}, {0, 1, 0.99, 0}};
    ck_assert_int_eq(asha_continues(&s, mixed, 3, 2, 0, 0.6), 1);
    ck_assert_int_eq(asha_continues(&s, mixed, 3, 3, 1, 0.1), 0); /* second of 2 at rung 1 */
    /* the last rung goes nowhere */
    asha_rung_entry top[] = {{0, 2, 0.1, 0}, {1, 2, 0.2, 0}};
    ck_assert_int_eq(asha_continues(&s, top, 2, 2, 2, 0.9), 0);
    /* mode min: smaller is better */
    s.mode_max = 0;
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 0, 0.1), 1);
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 0, 0.9), 0);
    s.mode_max = 1;
    /* refused: its own row at that rung already, a rung or a row out of range */
    ck_assert_int_eq(asha_continues(&s, two, 2, 1, 0, 0.9), -1);
    ck_assert_int_eq(asha_continues(&s, two, 2, 2, 3, 0.9), -1);
    ck_assert_int_eq(asha_continues(&s, two, 2, 8, 0, 0.9), -1);
    asha_rung_entry bad[] = {{9, 0, 0.5, 0}};
    ck_assert_int_eq(asha_continues(&s, bad, 1, 2, 0, 0.9), -1);
    sweep_search_release(&s);
    /* a grid has no rungs */
    parse_ok(GRID("'a':{'values':[1,2,3]}"), &s);
    ck_assert_int_eq(asha_continues(&s, NULL, 0, 0, 0, 0.9), -1);
    sweep_search_release(&s);
    /* the end-to-end test's sweep (tests/check_sweeps.c, asha_continues_in_process):
     * with seed 1, trial 0 draws the tiny learning rate and trial 1 the good one */
    parse_ok("{'method':'asha','parameters':{'compile.optimizer.learning_rate':{'values':[0.003,0.00001]}},"
             "'metric':'val_loss','mode':'min','max_concurrent':1,'max_epochs':2,'reduction_factor':2,'seed':1}",
             &s);
    cJSON *p0 = sweep_trial_params(&s, 0), *p1 = sweep_trial_params(&s, 1);
    ck_assert(cJSON_GetObjectItem(p0, "compile.optimizer.learning_rate")->valuedouble == 0.00001);
    ck_assert(cJSON_GetObjectItem(p1, "compile.optimizer.learning_rate")->valuedouble == 0.003);
    cJSON_Delete(p0);
    cJSON_Delete(p1);
    sweep_search_release(&s);
}
END_TEST

START_TEST(test_next_edges) {
    sweep_search s;
    parse_ok("{'method':'asha','parameters':{'x':{'int':[1,5]}},'metric':'m','mode':'max','max_trials':4,"
             "'max_concurrent':2,'max_epochs':9}", &s);
    int t, r;
    ck_assert_int_eq(asha_next(&s, NULL, 0, 0, 0, &t, &r), ASHA_START);
    ck_assert_int_eq(t, 0);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 1, 1, &t, &r), ASHA_START);
    ck_assert_int_eq(t, 1);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 2, 2, &t, &r), ASHA_WAIT);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 4, 1, &t, &r), ASHA_WAIT);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 4, 0, &t, &r), ASHA_DONE);
    /* ties go to the lower trial index; a NaN never ranks first */
    asha_rung_entry rows[] = {{2, 0, 0.5, 0}, {1, 0, 0.5, 0}, {0, 0, NAN, 0}};
    ck_assert_int_eq(asha_next(&s, rows, 3, 3, 0, &t, &r), ASHA_PROMOTE);
    ck_assert_int_eq(t, 1);
    ck_assert_int_eq(r, 1);
    /* the highest rung first: with rung 1 holding 3 reports, its best goes to rung 2 */
    asha_rung_entry more[] = {{0, 0, 0.1, 1}, {1, 0, 0.2, 1}, {2, 0, 0.3, 1}, {3, 0, 0.9, 0},
                              {0, 1, 0.4, 0}, {1, 1, 0.6, 0}, {2, 1, 0.5, 0}};
    ck_assert_int_eq(asha_next(&s, more, 7, 4, 0, &t, &r), ASHA_PROMOTE);
    ck_assert_int_eq(t, 1);
    ck_assert_int_eq(r, 2);
    more[5].promoted = 1;
    ck_assert_int_eq(asha_next(&s, more, 7, 4, 0, &t, &r), ASHA_PROMOTE);
    ck_assert_int_eq(t, 3);
    ck_assert_int_eq(r, 1);
    /* rows out of range are refused */
    asha_rung_entry badrung[] = {{0, 3, 0.1, 0}};
    ck_assert_int_eq(asha_next(&s, badrung, 1, 1, 0, &t, &r), -1);
    asha_rung_entry badtrial[] = {{4, 0, 0.1, 0}};
    ck_assert_int_eq(asha_next(&s, badtrial, 1, 1, 0, &t, &r), -1);
    sweep_search_release(&s);

    /* grid and random: start up to max_concurrent, then done */
    parse_ok(GRID("'a':{'values':[1,2,3]}"), &s);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 0, 0, &t, &r), ASHA_START);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 1, 1, &t, &r), ASHA_START);
    ck_assert_int_eq(t, 1);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 2, 2, &t, &r), ASHA_WAIT);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 3, 1, &t, &r), ASHA_WAIT);
    ck_assert_int_eq(asha_next(&s, NULL, 0, 3, 0, &t, &r), ASHA_DONE);
    sweep_search_release(&s);
}
END_TEST

static Suite *sweep_suite(void) {
    Suite *s = suite_create("sweep_logic");
    TCase *parse = tcase_create("parse");
    tcase_add_test(parse, test_bad_searches);
    tcase_add_test(parse, test_limits_and_messages);
    tcase_add_test(parse, test_defaults_and_round_trip);
    suite_add_tcase(s, parse);
    TCase *trials = tcase_create("trials");
    tcase_add_test(trials, test_grid_order);
    tcase_add_test(trials, test_random_draws);
    tcase_add_test(trials, test_values_without_replacement);
    suite_add_tcase(s, trials);
    TCase *ap = tcase_create("apply");
    tcase_add_test(ap, test_apply_training);
    tcase_add_test(ap, test_apply_command);
    suite_add_tcase(s, ap);
    TCase *asha = tcase_create("asha");
    tcase_add_test(asha, test_rungs);
    tcase_add_test(asha, test_score);
    tcase_add_test(asha, test_asha_script);
    tcase_add_test(asha, test_next_edges);
    tcase_add_test(asha, test_asha_script_continue);
    tcase_add_test(asha, test_continues_edges);
    suite_add_tcase(s, asha);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(sweep_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
