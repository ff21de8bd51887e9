/* cli.c - the command-line client. Human output is a table or key: value
 * lines; --json prints the server's JSON as it came, for scripts. */
#include "cli.h"
#include "client.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cli_opts {
    int json;
    char url[512];
    char token[256];
    const char *state;
    long limit;
    const char *reason;
} cli_opts;

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "-";
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* Prints an error reply as "error: message (field: f)". */
static void print_error(const client_reply *r) {
    cJSON *o = cJSON_ParseWithLength(r->body.data ? r->body.data : "", r->body.len);
    const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "error") : NULL;
    if (e) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "field");
        if (cJSON_IsString(f) && f->valuestring[0])
            fprintf(stderr, "error: %s (field: %s) [HTTP %ld %s]\n", jstr(e, "message"), f->valuestring, r->status,
                    jstr(e, "code"));
        else
            fprintf(stderr, "error: %s [HTTP %ld %s]\n", jstr(e, "message"), r->status, jstr(e, "code"));
    } else {
        fprintf(stderr, "error: HTTP %ld: %.*s\n", r->status, (int)(r->body.len > 300 ? 300 : r->body.len),
                r->body.data ? r->body.data : "");
    }
    cJSON_Delete(o);
}

/* One request; on success returns the parsed JSON (and prints it raw with
 * --json when print_raw), else prints the error and returns NULL. */
static cJSON *call(const cli_opts *o, const char *method, const char *path, const char *body, size_t len,
                   int print_raw, int *exit_code) {
    client c;
    if (client_init(&c, o->url, o->token) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        *exit_code = 1;
        return NULL;
    }
    client_reply r;
    int rc = client_request(&c, method, path, body, len, NULL, &r);
    client_release(&c);
    if (rc < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
        client_reply_release(&r);
        *exit_code = 1;
        return NULL;
    }
    if (r.status >= 400) {
        if (o->json) fwrite(r.body.data ? r.body.data : "", 1, r.body.len, stdout);
        else print_error(&r);
        client_reply_release(&r);
        *exit_code = 1;
        return NULL;
    }
    if (o->json && print_raw) fwrite(r.body.data ? r.body.data : "", 1, r.body.len, stdout);
    cJSON *v = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    client_reply_release(&r);
    if (!v) {
        fprintf(stderr, "error: the server's reply is not JSON\n");
        *exit_code = 1;
        return NULL;
    }
    *exit_code = 0;
    return v;
}

static void print_job_row(const cJSON *j) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "resources");
    char res[48];
    snprintf(res, sizeof res, "%dx%d %s", (int)jnum(r, "workers"), (int)jnum(r, "devices_per_worker"),
             jstr(r, "device"));
    printf("%-6d %-20.20s %-10.10s %-10s %4d %7d  %-12s %s\n", (int)jnum(j, "id"), jstr(j, "name"),
           jstr(j, "team"), jstr(j, "state"), (int)jnum(j, "priority"), (int)jnum(j, "attempt"), res,
           jstr(j, "reason"));
}

static int do_submit(const cli_opts *o, const char *file) {
    size_t len = 0;
    char *spec = file_read_all(file, 1u << 20, &len);
    if (!spec) {
        fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    int ec;
    cJSON *j = call(o, "POST", "/api/v1/jobs", spec, len, 1, &ec);
    free(spec);
    if (!j) return ec;
    if (!o->json) printf("submitted job %d (%s): %s\n", (int)jnum(j, "id"), jstr(j, "name"), jstr(j, "state"));
    cJSON_Delete(j);
    return 0;
}

static int do_jobs(const cli_opts *o) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/jobs?limit=%ld%s%s", o->limit, o->state ? "&state=" : "",
             o->state ? o->state : "");
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%-6s %-20s %-10s %-10s %4s %7s  %-12s %s\n", "ID", "NAME", "TEAM", "STATE", "PRI", "ATTEMPT",
               "RESOURCES", "REASON");
        const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(v, "jobs");
        const cJSON *j;
        cJSON_ArrayForEach(j, jobs) print_job_row(j);
    }
    cJSON_Delete(v);
    return 0;
}

static int valid_id(const char *s) {
    long v;
    return parse_long(s, 1, 1L << 53, &v) == 0;
}

static int do_status(const cli_opts *o, const char *id) {
    if (!valid_id(id)) {
        fprintf(stderr, "error: '%s' is not a job id\n", id);
        return 2;
    }
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%s", id);
    int ec;
    cJSON *j = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!j) return ec;
    if (!o->json) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "resources");
        printf("job:        %d (%s)\n", (int)jnum(j, "id"), jstr(j, "name"));
        printf("team:       %s\n", jstr(j, "team"));
        printf("state:      %s\n", jstr(j, "state"));
        printf("reason:     %s\n", jstr(j, "reason"));
        printf("priority:   %d   attempt: %d of %d\n", (int)jnum(j, "priority"), (int)jnum(j, "attempt"),
               (int)jnum(j, "max_restarts") + 1);
        printf("resources:  %d worker(s) x %d %s, %d ps\n", (int)jnum(r, "workers"),
               (int)jnum(r, "devices_per_worker"), jstr(r, "device"), (int)jnum(r, "ps"));
        printf("created:    %s\n", jstr(j, "created_at"));
        printf("started:    %s\n", jstr(j, "started_at"));
        printf("finished:   %s\n", jstr(j, "finished_at"));
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "progress");
        if (cJSON_IsObject(p)) {
            char *s = cJSON_PrintUnformatted(p);
            if (s) printf("progress:   %s\n", s);
            free(s);
        }
        snprintf(path, sizeof path, "/api/v1/jobs/%s/events", id);
        cli_opts q = *o;
        q.json = 0;
        cJSON *ev = call(&q, "GET", path, NULL, 0, 0, &ec);
        if (ev) {
            printf("timeline:\n");
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(ev, "events")) {
                const char *to = jstr(e, "to");
                printf("  %s  %-10s %-14s %s\n", jstr(e, "time"), strcmp(to, "-") ? to : jstr(e, "kind"),
                       jstr(e, "actor"), jstr(e, "reason"));
            }
            cJSON_Delete(ev);
        }
    }
    cJSON_Delete(j);
    return 0;
}

static int do_cancel(const cli_opts *o, const char *id) {
    if (!valid_id(id)) {
        fprintf(stderr, "error: '%s' is not a job id\n", id);
        return 2;
    }
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/cancel", id);
    char *body = NULL;
    if (o->reason) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "reason", o->reason);
        body = cJSON_PrintUnformatted(b);
        cJSON_Delete(b);
    }
    int ec;
    cJSON *j = call(o, "POST", path, body, body ? strlen(body) : 0, 1, &ec);
    free(body);
    if (!j) return ec;
    if (!o->json) printf("job %d: %s\n", (int)jnum(j, "id"), jstr(j, "state"));
    cJSON_Delete(j);
    return 0;
}

/* Prints the job's log for a task from offset 0; with follow, keeps
 * polling once a second until the job has finished and the log is drained. */
static int do_logs(const cli_opts *o, const char *id, const char *task, int follow) {
    if (!valid_id(id)) {
        fprintf(stderr, "error: '%s' is not a job id\n", id);
        return 2;
    }
    client c;
    if (client_init(&c, o->url, o->token) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        return 1;
    }
    long long off = 0;
    int ret = 0, done = 0;
    for (;;) {
        char path[256];
        snprintf(path, sizeof path, "/api/v1/jobs/%s/logs?task=%s&since=%lld", id, task, off);
        client_reply r;
        if (client_request(&c, "GET", path, NULL, 0, NULL, &r) < 0) {
            fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
            client_reply_release(&r);
            ret = 1;
            break;
        }
        if (r.status >= 400) {
            print_error(&r);
            client_reply_release(&r);
            ret = 1;
            break;
        }
        if (r.body.len) fwrite(r.body.data, 1, r.body.len, stdout);
        fflush(stdout);
        off += (long long)r.body.len;
        int got = r.body.len > 0;
        client_reply_release(&r);
        if (!follow || (done && !got)) break;
        if (!got) {
            snprintf(path, sizeof path, "/api/v1/jobs/%s", id);
            if (client_request(&c, "GET", path, NULL, 0, NULL, &r) == 0 && r.status == 200) {
                cJSON *j = cJSON_ParseWithLength(r.body.data, r.body.len);
                const char *st = j ? jstr(j, "state") : "";
                done = strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0;
                cJSON_Delete(j);
            }
            client_reply_release(&r);
            if (!done) sleep(1);
        }
    }
    client_release(&c);
    return ret;
}

static int do_teams(const cli_opts *o) {
    int ec;
    cJSON *v = call(o, "GET", "/api/v1/teams", NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%-5s %-20s %6s %9s %6s %7s %8s %7s\n", "ID", "NAME", "WEIGHT", "GUARANTEE", "QUOTA", "QUEUED",
               "RUNNING", "DEVICES");
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(v, "teams")) {
            const cJSON *q = cJSON_GetObjectItemCaseSensitive(t, "quota");
            char quota[16];
            if (cJSON_IsNumber(q)) snprintf(quota, sizeof quota, "%d", (int)q->valuedouble);
            else snprintf(quota, sizeof quota, "-");
            printf("%-5d %-20.20s %6.2f %9d %6s %7d %8d %7d\n", (int)jnum(t, "id"), jstr(t, "name"),
                   jnum(t, "weight"), (int)jnum(t, "guarantee"), quota, (int)jnum(t, "jobs_queued"),
                   (int)jnum(t, "jobs_running"), (int)jnum(t, "devices_in_use"));
        }
    }
    cJSON_Delete(v);
    return 0;
}

static void cli_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard submit FILE            submit a job spec (JSON)\n"
            "       trainyard jobs [--state S] [--limit N]\n"
            "       trainyard status ID              a job, its progress and timeline\n"
            "       trainyard cancel ID [--reason R]\n"
            "       trainyard logs ID [--task worker-0] [-f]   a task's output; -f follows until the job ends\n"
            "       trainyard teams\n"
            "options: --json (print the server's JSON), --url URL, --token TOKEN\n"
            "env: TRAINYARD_URL (default http://127.0.0.1:8080), TRAINYARD_TOKEN (default: ./.trainyard/token)\n");
}

int cmd_cli(int argc, char **argv) {
    const char *cmd = argv[0];
    static const char *cmds[] = {"submit", "jobs", "status", "cancel", "teams", "logs"};
    int known = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(cmd, cmds[i]) == 0) known = 1;
    if (!known) return -1;

    cli_opts o;
    memset(&o, 0, sizeof o);
    o.limit = 50;
    const char *url = NULL, *token = NULL;
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},   {"url", required_argument, NULL, 'u'},
        {"token", required_argument, NULL, 't'}, {"state", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'n'}, {"reason", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},   {"task", required_argument, NULL, 'T'},
        {"follow", no_argument, NULL, 'f'}, {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    const char *task = "worker-0";
    int follow = 0;
    while ((c = getopt_long(argc, argv, "f", longopts, NULL)) != -1) {
        switch (c) {
        case 'j': o.json = 1; break;
        case 'T': task = optarg; break;
        case 'f': follow = 1; break;
        case 'u': url = optarg; break;
        case 't': token = optarg; break;
        case 's': o.state = optarg; break;
        case 'r': o.reason = optarg; break;
        case 'n':
            if (parse_long(optarg, 1, 1000, &o.limit) < 0) {
                fprintf(stderr, "error: --limit wants 1-1000\n");
                return 2;
            }
            break;
        case 'h': cli_usage(stdout); return 0;
        default: cli_usage(stderr); return 2;
        }
    }
    if (url) snprintf(o.url, sizeof o.url, "%s", url);
    else client_default_url(o.url, sizeof o.url);
    char err[512];
    if (token) snprintf(o.token, sizeof o.token, "%s", token);
    else if (client_default_token(o.token, sizeof o.token, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    int nargs = argc - optind;
    if (strcmp(cmd, "submit") == 0 && nargs == 1) return do_submit(&o, argv[optind]);
    if (strcmp(cmd, "jobs") == 0 && nargs == 0) return do_jobs(&o);
    if (strcmp(cmd, "status") == 0 && nargs == 1) return do_status(&o, argv[optind]);
    if (strcmp(cmd, "cancel") == 0 && nargs == 1) return do_cancel(&o, argv[optind]);
    if (strcmp(cmd, "teams") == 0 && nargs == 0) return do_teams(&o);
    if (strcmp(cmd, "logs") == 0 && nargs == 1) {
        for (const char *p = task; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) {
                fprintf(stderr, "error: --task wants a name like worker-0\n");
                return 2;
            }
        return do_logs(&o, argv[optind], task, follow);
    }
    cli_usage(stderr);
    return 2;
}
