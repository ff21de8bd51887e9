/* json_out.c - compact JSON text of a cJSON tree. See json_out.h. */
#include "json_out.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* buf_append with the common case inline: the text fits the capacity
 * (which never exceeds the maximum, so no check is skipped). */
static inline int put(buf *b, const void *p, size_t n) {
    if (b->data && b->len + n < b->cap) {
        memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = '\0';
        return 0;
    }
    return buf_append(b, p, n);
}

int json_write_int(buf *out, int64_t v) {
    char tmp[24];
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    char *e = tmp + sizeof tmp, *p = e;
    do {
        *--p = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    return put(out, p, (size_t)(e - p));
}

static int put_number(buf *b, double d) {
    char tmp[40];
    if (isnan(d) || isinf(d)) return put(b, "null", 4);
    if (d == floor(d) && fabs(d) <= 9007199254740992.0) return json_write_int(b, (int64_t)d); /* exactly */
    int n = snprintf(tmp, sizeof tmp, "%.15g", d);
    if (n > 0 && strtod(tmp, NULL) != d) n = snprintf(tmp, sizeof tmp, "%.17g", d);
    if (n <= 0 || (size_t)n >= sizeof tmp) return -1;
    return put(b, tmp, (size_t)n);
}

/* A JSON string: " \ and the control characters escaped, as cJSON does
 * (\b \f \n \r \t, else \u00XX); other bytes as they are. */
static int put_string(buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    if (!s) return put(b, "\"\"", 2);
    if (put(b, "\"", 1) < 0) return -1;
    const unsigned char *p = (const unsigned char *)s, *run = p;
    for (;; p++) {
        unsigned char c = *p;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (p > run && put(b, run, (size_t)(p - run)) < 0) return -1;
        if (!c) break;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t n = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        }
        if (put(b, esc, n) < 0) return -1;
        run = p + 1;
    }
    return put(b, "\"", 1);
}

int json_write_string(buf *out, const char *s) { return put_string(out, s); }

int json_write(buf *out, const cJSON *v) {
    if (!v) return put(out, "null", 4);
    switch (v->type & 0xFF) {
    case cJSON_False: return put(out, "false", 5);
    case cJSON_True: return put(out, "true", 4);
    case cJSON_NULL: return put(out, "null", 4);
    case cJSON_Number: return put_number(out, v->valuedouble);
    case cJSON_String: return put_string(out, v->valuestring);
    case cJSON_Raw: return v->valuestring ? buf_appends(out, v->valuestring) : -1;
    case cJSON_Array:
    case cJSON_Object: {
        int obj = (v->type & 0xFF) == cJSON_Object;
        if (put(out, obj ? "{" : "[", 1) < 0) return -1;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child && put(out, ",", 1) < 0) return -1;
            if (obj && (put_string(out, c->string) < 0 || put(out, ":", 1) < 0)) return -1;
            if (json_write(out, c) < 0) return -1;
        }
        return put(out, obj ? "}" : "]", 1);
    }
    default: return -1; /* cJSON_Invalid: cJSON prints nothing either */
    }
}

char *json_print(const cJSON *v, size_t *len) {
    buf b;
    buf_init(&b, (size_t)1 << 31);
    if (json_write(&b, v) < 0) {
        buf_release(&b);
        return NULL;
    }
    return buf_detach(&b, len);
}
