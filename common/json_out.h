/* json_out.h - compact JSON text of a cJSON tree, written into a buf.
 *
 * The same text as cJSON_PrintUnformatted (the same escapes, members in
 * order) except for numbers: an integral value within ±2^53 is written with
 * its digits and no printf, and any other finite value as the shortest of
 * %.15g / %.17g that reads back exactly (cJSON checks that with sscanf);
 * NaN and infinities as null, as cJSON does. Debian 12's cJSON 1.7.15 formats
 * every number, integers included, through sprintf("%1.15g") and reads it back
 * with sscanf: in the profile of GET /api/v1/jobs that was a third of the
 * server's time (docs/server.md, "Answers").
 *
 * defines: json_write, json_write_string, json_write_int, json_print */
#ifndef TRAINYARD_JSON_OUT_H
#define TRAINYARD_JSON_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "util.h"

/* Appends v to out: 0, or -1 when out reached its maximum (out is then
 * left with a partial text; reset it). */
int json_write(buf *out, const cJSON *v);

/* One JSON string (escaped as json_write does) or integer, for code that
 * writes JSON text without a tree. 0, or -1 when out is full. */
int json_write_string(buf *out, const char *s);
int json_write_int(buf *out, int64_t v);

/* The text of v in a new heap string (free() it), *len its length (may be
 * NULL); NULL when out of memory. */
char *json_print(const cJSON *v, size_t *len);

#endif
