/* size.c - sizes as text, read exactly and checked against a range
 * (size.h). */
#include "size.h"

#include <stdio.h>
#include <string.h>

typedef unsigned __int128 u128;

typedef struct size_unit {
    const char *name;
    uint64_t mult;
} size_unit;

static const size_unit UNITS[] = {
    {"", 1ULL},
    {"B", 1ULL},
    {"KiB", 1ULL << 10},
    {"MiB", 1ULL << 20},
    {"GiB", 1ULL << 30},
    {"TiB", 1ULL << 40},
    {"PiB", 1ULL << 50},
    {"K", 1000ULL},
    {"KB", 1000ULL},
    {"M", 1000000ULL},
    {"MB", 1000000ULL},
    {"G", 1000000000ULL},
    {"GB", 1000000000ULL},
    {"T", 1000000000000ULL},
    {"TB", 1000000000000ULL},
    {"P", 1000000000000000ULL},
    {"PB", 1000000000000000ULL},
    {NULL, 0},
};

#define SIZE_LIMIT ((int64_t)1 << 62)

size_status size_parse(const char *text, int64_t min, int64_t max, int64_t *bytes, const char **unit) {
    if (unit) *unit = text;
    if (!text || min < 0 || max < min || max > SIZE_LIMIT) return SIZE_SYNTAX;
    const char *p = text;
    if (*p == '-') return SIZE_BELOW;
    /* the number as ip + frac / scale; ip is capped just past max (it is
     * then too large whatever the unit) */
    u128 ip = 0, frac = 0, scale = 1;
    int digits = 0, fdigits = 0, huge = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        ip = ip * 10 + (u128)(*p - '0');
        if (ip > (u128)max) {
            huge = 1;
            ip = (u128)max + 1;
        }
    }
    if (*p == '.') {
        p++;
        for (; *p >= '0' && *p <= '9'; p++, fdigits++) {
            if (fdigits == 9) return SIZE_DECIMALS;
            frac = frac * 10 + (u128)(*p - '0');
            scale *= 10;
        }
        if (fdigits == 0) digits = 0;
    }
    if (digits == 0) return SIZE_SYNTAX;
    while (*p == ' ') p++;
    if (unit) *unit = p;
    const size_unit *u = NULL;
    for (int i = 0; UNITS[i].name && !u; i++)
        if (strcmp(p, UNITS[i].name) == 0) u = &UNITS[i];
    if (!u) return SIZE_UNIT;
    /* ip * mult > max: above whatever the fraction. Past this check
     * ip * mult <= 2^62, so the exact product below stays under 2^93. */
    if (huge || ip > (u128)max / u->mult) return SIZE_ABOVE;
    u128 num = (ip * scale + frac) * (u128)u->mult; /* bytes * scale, exactly */
    if (num < (u128)min * scale) return SIZE_BELOW;
    if (num > (u128)max * scale) return SIZE_ABOVE;
    *bytes = (int64_t)((num + scale - 1) / scale);
    return SIZE_OK;
}

const char *size_text(int64_t bytes, char *out, size_t cap) {
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (cap == 0) return out;
    int k = 0;
    int64_t v = bytes;
    while (k < 5 && v != 0 && v % 1024 == 0) {
        v /= 1024;
        k++;
    }
    snprintf(out, cap, "%lld%s", (long long)v, names[k]);
    return out;
}
