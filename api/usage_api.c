/* usage_api.c - who used what: device time, jobs, waits and storage per
 * team, job or UTC day (storage/usage_store.h says how each is counted).
 *
 *   GET /api/v1/usage?from=&to=&by=team|job|day[&team=NAME]   (admin, team)
 *
 * from, to: ISO 8601 (2026-11-01, 2026-11-01T12:00:00Z, with a fraction
 * or an offset such as +02:00; no offset is UTC) or ms since the epoch;
 * default the 30 days before now. to > from, at most 400 days apart. An
 * admin token sees every team (or one with team=), a team token its own
 * (team= another team: 403). JSON, or CSV with Accept: text/csv. */
#include "usage_api.h"
#include "../server/server.h"
#include "../storage/store.h"
#include "../storage/usage_store.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_SPAN_MS (30 * USAGE_DAY_MS)
#define MAX_SPAN_DAYS 400

/* ---------------------------------------------------------------- times */

/* n digits at *p as a number (advances *p); -1 when they are not there. */
static int digits(const char **p, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*p)[i])) return -1;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    return v;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's
 * days_from_civil), so no time zone or locale is involved. */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "2026-11-01", "2026-11-01T12:30[:05[.250]]" with "Z", "+02:00", "+0200"
 * or nothing (UTC), or digits (ms since the epoch). 0 and *ms, or -1. */
static int parse_when(const char *s, int64_t *ms) {
    size_t n = strlen(s);
    if (n == 0 || n > 40) return -1;
    size_t k = 0;
    while (k < n && isdigit((unsigned char)s[k])) k++;
    if (k == n) {
        if (n > 15) return -1; /* past the year 30000 */
        *ms = strtoll(s, NULL, 10);
        return 0;
    }
    const char *p = s;
    int y = digits(&p, 4);
    if (y < 1970 || *p++ != '-') return -1;
    int mo = digits(&p, 2);
    if (mo < 1 || mo > 12 || *p++ != '-') return -1;
    int d = digits(&p, 2);
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap)) return -1;
    int64_t t = days_from_civil(y, mo, d) * USAGE_DAY_MS;
    if (*p == 'T' || *p == 't' || (*p == ' ' && isdigit((unsigned char)p[1]))) {
        p++;
        int hh = digits(&p, 2);
        if (hh < 0 || hh > 23 || *p++ != ':') return -1;
        int mi = digits(&p, 2);
        if (mi < 0 || mi > 59) return -1;
        int ss = 0, frac = 0;
        if (*p == ':') {
            p++;
            ss = digits(&p, 2);
            if (ss < 0 || ss > 59) return -1;
            if (*p == '.' || *p == ',') {
                p++;
                int nd = 0;
                while (isdigit((unsigned char)*p)) {
                    if (nd < 3) frac = frac * 10 + (*p - '0');
                    nd++;
                    p++;
                }
                if (nd == 0 || nd > 9) return -1;
                for (; nd < 3; nd++) frac *= 10;
            }
        }
        t += ((int64_t)hh * 3600 + mi * 60 + ss) * 1000 + frac;
        /* a '+' left unescaped in a query string arrives as a space */
        if (*p == 'Z' || *p == 'z') {
            p++;
        } else if (*p == '+' || *p == '-' || *p == ' ') {
            int sign = *p == '-' ? -1 : 1;
            p++;
            int oh = digits(&p, 2);
            if (oh < 0 || oh > 23) return -1;
            if (*p == ':') p++;
            int om = digits(&p, 2);
            if (om < 0 || om > 59) return -1;
            t -= sign * ((int64_t)oh * 3600 + om * 60) * 1000;
        }
    }
    if (*p) return -1;
    *ms = t;
    return 0;
}

static void day_text(int64_t day_ms, char *out, size_t cap) {
    time_t s = (time_t)(day_ms / 1000);
    struct tm tm;
    if (!gmtime_r(&s, &tm)) {
        snprintf(out, cap, "?");
        return;
    }
    snprintf(out, cap, "%04d-%02d-%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
}

/* ---------------------------------------------------------------- JSON */

/* Seconds to the millisecond: the sums are of whole milliseconds times devices. */
static double secs(double s) { return (double)llround(s * 1000.0) / 1000.0; }

static void add_numbers(cJSON *o, const usage_row *r, usage_by by) {
    cJSON_AddNumberToObject(o, "gpu_seconds", secs(r->gpu_s));
    cJSON_AddNumberToObject(o, "cpu_slot_seconds", secs(r->cpu_s));
    cJSON *j = cJSON_AddObjectToObject(o, "jobs");
    cJSON_AddNumberToObject(j, "run", (double)r->jobs.run);
    cJSON_AddNumberToObject(j, "succeeded", (double)r->jobs.succeeded);
    cJSON_AddNumberToObject(j, "failed", (double)r->jobs.failed);
    cJSON_AddNumberToObject(j, "cancelled", (double)r->jobs.cancelled);
    cJSON_AddNumberToObject(j, "preempted", (double)r->jobs.preempted);
    cJSON *w = cJSON_AddObjectToObject(o, "wait_s");
    if (r->n_waits > 0) {
        cJSON_AddNumberToObject(w, "median", secs(r->wait_median_s));
        cJSON_AddNumberToObject(w, "p95", secs(r->wait_p95_s));
    } else {
        cJSON_AddNullToObject(w, "median");
        cJSON_AddNullToObject(w, "p95");
    }
    cJSON_AddNumberToObject(w, "jobs", r->n_waits);
    if (by == USAGE_BY_TEAM) {
        cJSON *s = cJSON_AddObjectToObject(o, "storage_bytes");
        cJSON_AddNumberToObject(s, "logs", (double)r->logs_bytes);
        cJSON_AddNumberToObject(s, "checkpoints", (double)r->checkpoints_bytes);
        cJSON_AddNumberToObject(s, "contexts", (double)r->contexts_bytes);
    }
}

static const char *const BY_NAME[] = {"team", "job", "day", "user"};

static cJSON *report_json(const usage_report *rep, int64_t from, int64_t to, usage_by by) {
    cJSON *o = cJSON_CreateObject();
    store_json_time_ms(o, "from", from);
    store_json_time_ms(o, "to", to);
    cJSON_AddStringToObject(o, "by", BY_NAME[by]);
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; i < rep->n_rows; i++) {
        const usage_row *r = &rep->rows[i];
        cJSON *x = cJSON_CreateObject();
        if (by == USAGE_BY_JOB) {
            cJSON_AddNumberToObject(x, "job", (double)r->job_id);
            cJSON_AddStringToObject(x, "name", r->job_name);
        } else if (by == USAGE_BY_DAY) {
            char day[40];
            day_text(r->day, day, sizeof day);
            cJSON_AddStringToObject(x, "day", day);
        } else if (by == USAGE_BY_USER) {
            if (r->user[0]) cJSON_AddStringToObject(x, "user", r->user);
            else cJSON_AddNullToObject(x, "user"); /* the team's service token, the admin */
        }
        cJSON_AddStringToObject(x, "team", r->team);
        add_numbers(x, r, by);
        cJSON_AddItemToArray(rows, x);
    }
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    add_numbers(t, &rep->total, by);
    return o;
}

/* ---------------------------------------------------------------- CSV */

static int csv_numbers(buf *b, const usage_row *r, usage_by by) {
    int rc = buf_printf(b, ",%.3f,%.3f,%lld,%lld,%lld,%lld,%lld", secs(r->gpu_s), secs(r->cpu_s),
                        (long long)r->jobs.run, (long long)r->jobs.succeeded, (long long)r->jobs.failed,
                        (long long)r->jobs.cancelled, (long long)r->jobs.preempted);
    if (r->n_waits > 0) rc |= buf_printf(b, ",%.3f,%.3f", secs(r->wait_median_s), secs(r->wait_p95_s));
    else rc |= buf_appends(b, ",,");
    rc |= buf_printf(b, ",%d", r->n_waits);
    if (by == USAGE_BY_TEAM)
        rc |= buf_printf(b, ",%lld,%lld,%lld", (long long)r->logs_bytes, (long long)r->checkpoints_bytes,
                         (long long)r->contexts_bytes);
    return rc | buf_appends(b, "\r\n");
}

/* The columns, in an order that stays: the row's key, then the numbers as
 * the JSON nests them (docs/server.md, "Usage"). */
static int report_csv(buf *b, const usage_report *rep, usage_by by) {
    static const char *const key[] = {"team", "job,name,team", "day,team", "user,team"};
    int rc = buf_printf(b,
                        "%s,gpu_seconds,cpu_slot_seconds,jobs_run,jobs_succeeded,jobs_failed,jobs_cancelled,"
                        "jobs_preempted,wait_median_s,wait_p95_s,wait_jobs%s\r\n",
                        key[by],
                        by == USAGE_BY_TEAM ? ",storage_logs_bytes,storage_checkpoints_bytes,storage_contexts_bytes"
                                            : "");
    for (int i = 0; i < rep->n_rows && rc == 0; i++) {
        const usage_row *r = &rep->rows[i];
        if (by == USAGE_BY_JOB) {
            rc |= buf_printf(b, "%lld,", (long long)r->job_id);
            rc |= buf_csv_field(b, r->job_name);
            rc |= buf_appends(b, ",");
        } else if (by == USAGE_BY_DAY) {
            char day[40];
            day_text(r->day, day, sizeof day);
            rc |= buf_printf(b, "%s,", day);
        } else if (by == USAGE_BY_USER) {
            rc |= buf_csv_field(b, r->user);
            rc |= buf_appends(b, ",");
        }
        rc |= buf_csv_field(b, r->team);
        rc |= csv_numbers(b, r, by);
    }
    return rc;
}

int api_wants_csv(http_req *req) {
    const char *a = http_header(req, "Accept");
    return a && strstr(a, "text/csv") != NULL;
}

/* ---------------------------------------------------------------- the route */

int api_time_arg(http_req *req, http_res *res, const char *key, int64_t *ms) {
    const char *v = http_query(req, key);
    if (!v) return 0;
    if (parse_when(v, ms) < 0) {
        http_error(res, 422, "invalid_value", key,
                   "%s must be an ISO 8601 time (2026-11-01, 2026-11-01T12:00:00Z, +02:00 offsets) or ms since "
                   "the epoch, got '%.60s'",
                   key, v);
        return -1;
    }
    return 1;
}

/* GET /api/v1/usage */
static void usage_get(server *srv, http_req *req, http_res *res) {
    int64_t now = now_ms(), from = 0, to = now;
    int hf = api_time_arg(req, res, "from", &from);
    if (hf < 0) return;
    int ht = api_time_arg(req, res, "to", &to);
    if (ht < 0) return;
    if (!hf) from = to - DEFAULT_SPAN_MS;
    if (to <= from) {
        http_error(res, 422, "invalid_value", "to", "to must be after from");
        return;
    }
    if (to - from > (int64_t)MAX_SPAN_DAYS * USAGE_DAY_MS) {
        http_error(res, 422, "invalid_value", "from", "from must be at most %d days before to", MAX_SPAN_DAYS);
        return;
    }
    usage_by by = USAGE_BY_TEAM;
    const char *b = http_query(req, "by");
    if (b) {
        if (strcmp(b, "team") == 0) by = USAGE_BY_TEAM;
        else if (strcmp(b, "job") == 0) by = USAGE_BY_JOB;
        else if (strcmp(b, "day") == 0) by = USAGE_BY_DAY;
        else if (strcmp(b, "user") == 0) by = USAGE_BY_USER;
        else {
            http_error(res, 422, "invalid_value", "by", "by must be team, user, job or day, got '%.40s'", b);
            return;
        }
    }
    int64_t team_id = req->who.kind == TOKEN_TEAM ? req->who.team_id : 0;
    const char *tn = http_query(req, "team");
    if (tn && req->who.kind == TOKEN_TEAM && strcmp(tn, req->who.team) != 0) {
        http_error(res, 403, "forbidden", "team", "a team token sees its own team's usage only");
        return;
    }
    if (tn && req->who.kind != TOKEN_TEAM) {
        int rc = store_team_find(srv->db, tn, &team_id);
        if (rc == STORE_NOT_FOUND) {
            http_error(res, 422, "invalid_value", "team", "no team named '%.64s'", tn);
            return;
        }
        if (rc != STORE_OK) {
            http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
            return;
        }
    }
    usage_report rep;
    if (usage_query(srv->db, from, to, now, by, team_id, &rep) != STORE_OK) {
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    if (api_wants_csv(req)) {
        buf out;
        buf_init(&out, (size_t)64 << 20);
        if (report_csv(&out, &rep, by) < 0) {
            http_error(res, 500, "internal", NULL, "the report is too large for CSV: ask for a shorter window");
        } else {
            http_text(res, 200, "text/csv; charset=utf-8", out.data ? out.data : "", out.len);
        }
        buf_release(&out);
    } else {
        http_json(res, 200, report_json(&rep, from, to, by));
    }
    usage_report_release(&rep);
}

const route api_usage_routes[] = {
    {"GET", "/api/v1/usage", usage_get, ALLOW_USER, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
