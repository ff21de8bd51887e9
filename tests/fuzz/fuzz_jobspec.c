/* fuzz_jobspec.c - libFuzzer target for spec/jobspec.c: jobspec_parse on any
 * bytes; a spec it accepts must survive the normalized round trip
 * (to_json(parse(to_json(s))) == to_json(s)) and be released cleanly; a spec
 * it refuses must carry a 400/422 status and an error code.
 * Build and run: make fuzz && build/fuzz/fuzz_jobspec tests/fuzz/corpus/jobspec
 * (docs/reliability.md, "Fuzzing"). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/jobspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jobspec *s = calloc(2, sizeof *s); /* large structs: heap, so ASan sees overruns */
    if (!s) abort();
    spec_error err;
    memset(&err, 0, sizeof err);
    if (jobspec_parse((const char *)data, size, &s[0], &err) < 0) {
        if ((err.status != 400 && err.status != 422) || !err.code[0]) {
            fprintf(stderr, "refused without a status/code: %d '%s'\n", err.status, err.code);
            abort();
        }
        free(s);
        return 0;
    }
    char *j1 = NULL, *j2 = NULL;
    if (jobspec_to_json(&s[0], &j1) < 0) abort();
    if (jobspec_parse(j1, strlen(j1), &s[1], &err) < 0) {
        fprintf(stderr, "normalized spec refused: %s %s at %s\n%s\n", err.code, err.message, err.field, j1);
        abort();
    }
    if (jobspec_to_json(&s[1], &j2) < 0) abort();
    if (strcmp(j1, j2) != 0) {
        fprintf(stderr, "round trip differs:\n%s\n%s\n", j1, j2);
        abort();
    }
    (void)jobspec_replicas(&s[0]);
    (void)jobspec_devices(&s[0]);
    free(j1);
    free(j2);
    jobspec_release(&s[0]);
    jobspec_release(&s[1]);
    free(s);
    return 0;
}
