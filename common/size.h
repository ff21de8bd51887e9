/* size.h - sizes written as text ("512MiB", "1.5GiB", "2G", "800 M", or a
 * plain number of bytes) read exactly and checked against a range, the one
 * parser behind every size the service takes: the job spec's
 * resources.memory and logs.max_size, a team's storage_quota, the agent's
 * --memory and the server's size flags (their bounds: docs/jobspec.md,
 * "Sizes").
 *
 * The text is a number (digits, optionally a point and 1 to 9 more digits),
 * then optional spaces and a unit written exactly so: B or none = bytes;
 * KiB MiB GiB TiB PiB = powers of 1024; K M G T P and KB MB GB TB PB =
 * powers of 1000. No sign, no exponent, no space before the number or after
 * the unit.
 *
 * defines: size_status, size_parse, size_text */
#ifndef TRAINYARD_SIZE_H
#define TRAINYARD_SIZE_H

#include <stddef.h>
#include <stdint.h>

typedef enum size_status {
    SIZE_OK = 0,
    SIZE_SYNTAX,   /* no number where one belongs ("GiB", "", " 4GiB", "1.GiB") */
    SIZE_DECIMALS, /* more than 9 digits after the point */
    SIZE_UNIT,     /* a unit not in the list ("4gib", "4XB", "4GiB ") */
    SIZE_BELOW,    /* less than min bytes, or negative ("-1GiB") */
    SIZE_ABOVE,    /* more than max bytes */
} size_status;

/* Reads TEXT as a size and checks it against [min, max] bytes (0 <= min <=
 * max <= 2^62), comparing the exact value ("16777215.5" is below 16 MiB).
 * SIZE_OK with *bytes the value rounded up to a whole byte; otherwise the
 * reason, *bytes untouched, and *unit (may be NULL) pointing into TEXT at
 * what was read as the unit (for SIZE_UNIT's message). */
size_status size_parse(const char *text, int64_t min, int64_t max, int64_t *bytes, const char **unit);

/* BYTES as the shortest exact text size_parse reads back: the largest
 * binary unit it is a whole multiple of ("16MiB", "64TiB", "1536KiB",
 * "0B", "1000B"). Truncated to cap (always NUL-terminated when cap > 0). */
const char *size_text(int64_t bytes, char *out, size_t cap);

#endif
