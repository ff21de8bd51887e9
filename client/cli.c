/* cli.c - the command-line client. Human output is a table or key: value
 * lines; --json prints the server's JSON as it came, for scripts (watch
 * prints one JSON object per line). Exit codes (cli.h, README): 0 ok, 1 the
 * server refused (4xx), 2 usage, 3 server unreachable or 5xx, 4 the watched
 * job failed, 5 it was cancelled, 6 a download did not match its sha256. */
#include "cli.h"
#include "client.h"
#include "shell.h"
#include "../common/ctxtar.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct cli_opts {
    int json;
    char url[512];
    char token[256];
    const char *state;
    long limit;
    const char *reason;
    int download;
    const char *checkpoint;     /* --checkpoint CID (default: the newest) */
    const char *output;         /* -o FILE */
    int interval_ms;            /* watch */
    const char *context;        /* submit --context DIR */
    const char *from, *to, *by, *team; /* usage; --team is also the team every request acts in */
    int csv;                    /* usage --csv */
    char team_hdr[64];          /* --team, else TRAINYARD_TEAM: sent as Trainyard-Team */
} cli_opts;

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_JOB_FAILED = 4,
       EXIT_JOB_CANCELLED = 5, EXIT_CHECKSUM = 6 };

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "-";
}

/* A number of a reply; clamped to int's range, since callers print it as one
 * (casting a double outside it would be undefined behaviour). */
static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble != v->valuedouble) return 0;
    if (v->valuedouble > INT_MAX) return INT_MAX;
    if (v->valuedouble < INT_MIN) return INT_MIN;
    return v->valuedouble;
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

/* A client for o's server, token and team. 0 or -1. */
static int cli_client(client *c, const cli_opts *o) {
    if (client_init(c, o->url, o->token) < 0) return -1;
    snprintf(c->team, sizeof c->team, "%s", o->team_hdr);
    return 0;
}

/* One request; on success returns the parsed JSON (and prints it raw with
 * --json when print_raw), else prints the error and returns NULL. key: an
 * Idempotency-Key to send (a submission's, kept across the client's
 * retries: a lost answer is asked again without making a second job), or
 * NULL. */
static cJSON *call_keyed(const cli_opts *o, const char *key, const char *method, const char *path, const char *body,
                         size_t len, int print_raw, int *exit_code) {
    client c;
    if (cli_client(&c, o) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        *exit_code = 1;
        return NULL;
    }
    if (key) snprintf(c.idempotency_key, sizeof c.idempotency_key, "%s", key);
    client_reply r;
    int rc = client_request(&c, method, path, body, len, NULL, &r);
    client_release(&c);
    if (rc < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
        client_reply_release(&r);
        *exit_code = EXIT_UNREACHABLE;
        return NULL;
    }
    if (r.status >= 400) {
        if (o->json) fwrite(r.body.data ? r.body.data : "", 1, r.body.len, stdout);
        else print_error(&r);
        *exit_code = r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
        client_reply_release(&r);
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

static cJSON *call(const cli_opts *o, const char *method, const char *path, const char *body, size_t len,
                   int print_raw, int *exit_code) {
    return call_keyed(o, NULL, method, path, body, len, print_raw, exit_code);
}

/* A submission's call: with a fresh Idempotency-Key. */
static cJSON *call_submit(const cli_opts *o, const char *path, const char *body, size_t len, int *exit_code) {
    char key[37];
    if (client_idempotency_key(key) < 0) {
        fprintf(stderr, "error: no randomness for the Idempotency-Key: %s\n", strerror(errno));
        *exit_code = 1;
        return NULL;
    }
    return call_keyed(o, key, "POST", path, body, len, 1, exit_code);
}

/* "2" for a fixed gang; "2 (1-4)" for an elastic job running 2 workers of
 * 1 to 4 ("- (1-4)" before it first ran). */
static void workers_text(const cJSON *r, char *out, size_t cap) {
    int w = (int)jnum(r, "workers"), lo = (int)jnum(r, "workers_min"), now = (int)jnum(r, "workers_now");
    if (lo > 0 && lo < w) {
        if (now > 0) snprintf(out, cap, "%d (%d-%d)", now, lo, w);
        else snprintf(out, cap, "- (%d-%d)", lo, w);
    } else {
        snprintf(out, cap, "%d", w);
    }
}

static void print_job_row(const cJSON *j) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "resources");
    char res[48], wk[32];
    workers_text(r, wk, sizeof wk);
    snprintf(res, sizeof res, "%sx%d %s", wk, (int)jnum(r, "devices_per_worker"), jstr(r, "device"));
    printf("%-6d %-20.20s %-10.10s %-10s %4d %7d  %-12s %s\n", (int)jnum(j, "id"), jstr(j, "name"),
           jstr(j, "team"), jstr(j, "state"), (int)jnum(j, "priority"), (int)jnum(j, "attempt"), res,
           jstr(j, "reason"));
}

/* ---------------------------------------------------------------- contexts */

/* A byte count of a reply, not clamped (a context may pass 2 GiB). */
static double jbytes(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) && v->valuedouble == v->valuedouble ? v->valuedouble : 0;
}

/* Packs dir into a scratch file (read back into *data, *len bytes); the
 * scratch file and its folder are gone on return. 0, or an exit code. */
static int pack_context(const char *dir, ctx_info *info, char **data, size_t *len) {
    const char *t = getenv("TMPDIR");
    char tdir[PATH_MAX], out[PATH_MAX + 32], err[1024];
    if (sfmt(tdir, sizeof tdir, "%s/trainyard-context-XXXXXX", t && *t ? t : "/tmp") < 0 || !mkdtemp(tdir)) {
        fprintf(stderr, "error: cannot make a scratch folder to pack %s in: %s\n", dir, strerror(errno));
        return EXIT_USAGE;
    }
    snprintf(out, sizeof out, "%s/context.tar.gz", tdir);
    int rc = EXIT_OK;
    if (ctx_pack(dir, out, info, err, sizeof err) < 0) {
        fprintf(stderr, "error: --context %s: %s\n", dir, err);
        rc = EXIT_USAGE;
    } else if (!(*data = file_read_all(out, (size_t)info->packed + 1, len)) || (int64_t)*len != info->packed) {
        fprintf(stderr, "error: cannot read back the packed %s: %s\n", dir, strerror(errno));
        free(*data);
        *data = NULL;
        rc = EXIT_USAGE;
    }
    unlink(out);
    rmdir(tdir);
    return rc;
}

/* Packs dir and uploads it (POST /api/v1/contexts); id gets "sha256:HEX".
 * Says on stderr what was sent and whether the server had it already; with
 * print_raw and --json, prints the server's answer. Returns an exit code. */
static int push_context(const cli_opts *o, const char *dir, char *id, size_t idlen, int print_raw) {
    ctx_info info;
    char *data = NULL;
    size_t len = 0;
    int rc = pack_context(dir, &info, &data, &len);
    if (rc != EXIT_OK) return rc;
    client c;
    if (cli_client(&c, o) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        free(data);
        return EXIT_REFUSED;
    }
    c.timeout_ms = 30L * 60 * 1000; /* a big folder over a slow link */
    /* content-addressed (the same bytes, the same id): sent again safely
     * when its answer is lost */
    if (client_idempotency_key(c.idempotency_key) < 0) c.idempotency_key[0] = '\0';
    client_reply r;
    int sent = client_request(&c, "POST", "/api/v1/contexts", data, len, "application/gzip", &r);
    client_release(&c);
    free(data);
    if (sent < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
        client_reply_release(&r);
        return EXIT_UNREACHABLE;
    }
    if (r.status >= 400) {
        if (o->json && print_raw) fwrite(r.body.data ? r.body.data : "", 1, r.body.len, stdout);
        else print_error(&r);
        rc = r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
        client_reply_release(&r);
        return rc;
    }
    cJSON *v = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    char want[80];
    snprintf(want, sizeof want, "sha256:%s", info.sha256);
    const char *got = v ? jstr(v, "id") : "-";
    if (strcmp(got, want) != 0) {
        /* the server names a context by the sha256 of the bytes it got */
        fprintf(stderr, "error: the server answered HTTP %ld with the id %s for the context %s (sha256 %s)\n",
                r.status, got, dir, info.sha256);
        cJSON_Delete(v);
        client_reply_release(&r);
        return EXIT_REFUSED;
    }
    if (o->json && print_raw) fwrite(r.body.data ? r.body.data : "", 1, r.body.len, stdout);
    fprintf(stderr, "context: %s packed (%" PRId64 " files, %" PRId64 " KiB) as %s (%s)\n", dir, info.files,
            (info.packed + 1023) / 1024, want, r.status == 201 ? "uploaded" : "already on the server");
    snprintf(id, idlen, "%s", want);
    cJSON_Delete(v);
    client_reply_release(&r);
    return EXIT_OK;
}

static int do_context_push(const cli_opts *o, const char *dir) {
    char id[80];
    int rc = push_context(o, dir, id, sizeof id, 1);
    if (rc == EXIT_OK && !o->json) printf("%s\n", id);
    return rc;
}

static int do_context_list(const cli_opts *o) {
    int ec;
    cJSON *v = call(o, "GET", "/api/v1/contexts", NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%-71s %12s %7s %4s  %-24s %s\n", "ID", "BYTES", "FILES", "JOBS", "CREATED", "USED");
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(v, "contexts"))
            printf("%-71s %12.0f %7.0f %4d  %-24s %s\n", jstr(x, "id"), jbytes(x, "bytes"), jbytes(x, "files"),
                   (int)jnum(x, "jobs"), jstr(x, "created_at"), jstr(x, "used_at"));
        if (cJSON_GetObjectItemCaseSensitive(v, "quota_bytes"))
            printf("%.0f of %.0f bytes of the team's quota in use\n", jbytes(v, "used_bytes"), jbytes(v, "quota_bytes"));
    }
    cJSON_Delete(v);
    return 0;
}

/* submit FILE --context DIR: the job must be a command job (or an
 * interactive one); DIR is packed and uploaded first, and the job submitted
 * with command.context (interactive.context) set to the id, so the tasks
 * start in an unpacked copy of it (a notebook opens there). */
static char *spec_with_context(const cli_opts *o, const char *file, const char *spec, size_t len, int *ec) {
    cJSON *j = cJSON_ParseWithLength(spec, len);
    cJSON *cmd = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "command") : NULL;
    if (!cmd && cJSON_IsObject(j)) cmd = cJSON_GetObjectItemCaseSensitive(j, "interactive");
    if (!cJSON_IsObject(cmd)) {
        fprintf(stderr,
                "error: --context goes with a command job (\"command\": {\"argv\": [...]}) or an interactive one, "
                "and %s %s; the built-in engine's jobs take no folder\n",
                file, j ? "has neither a \"command\" nor an \"interactive\" object" : "is not JSON");
        cJSON_Delete(j);
        *ec = EXIT_USAGE;
        return NULL;
    }
    char id[80];
    *ec = push_context(o, o->context, id, sizeof id, 0);
    if (*ec != EXIT_OK) {
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(cmd, "context");
    if (!cJSON_AddStringToObject(cmd, "context", id)) {
        fprintf(stderr, "error: out of memory\n");
        abort();
    }
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!out) {
        fprintf(stderr, "error: out of memory\n");
        abort();
    }
    return out;
}

static int do_submit(const cli_opts *o, const char *file) {
    size_t len = 0;
    char *spec = file_read_all(file, 1u << 20, &len);
    if (!spec) {
        fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    int ec;
    if (o->context) {
        char *with = spec_with_context(o, file, spec, len, &ec);
        free(spec);
        if (!with) return ec;
        spec = with;
        len = strlen(with);
    }
    cJSON *j = call_submit(o, "/api/v1/jobs", spec, len, &ec);
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

/* 1 when id is an id; else says what was given instead of a `kind` id. */
static int id_ok(const char *id, const char *kind) {
    if (valid_id(id)) return 1;
    fprintf(stderr, "error: '%s' is not a %s id\n", id, kind);
    return 0;
}

static int finished(const char *st) {
    return strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0;
}

static void fmt_secs(double s, char *out, size_t n) {
    long v = s > 0 ? (long)(s + 0.5) : 0;
    if (v < 60) snprintf(out, n, "%lds", v);
    else if (v < 3600) snprintf(out, n, "%ldm%02lds", v / 60, v % 60);
    else snprintf(out, n, "%ldh%02ldm", v / 3600, v / 60 % 60);
}

/* The tasks: where each runs and how it is. */
static void print_tasks(const cJSON *j) {
    const cJSON *t;
    int first = 1;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(j, "tasks")) {
        printf("%s %-10s on %s (%s:%d)  %s", first ? "tasks:     " : "           ", jstr(t, "name"), jstr(t, "node"),
               jstr(t, "address"), (int)jnum(t, "port"), jstr(t, "state"));
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(t, "exit_code");
        if (cJSON_IsNumber(code)) printf(", exit %d", code->valueint);
        printf("\n");
        first = 0;
    }
}

/* A metric of obj, "%.4f", or "-" when it has none. */
static const char *metric_text(const cJSON *obj, const char *k, char *out, size_t n) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, k) : NULL;
    if (cJSON_IsNumber(v)) snprintf(out, n, "%.4f", v->valuedouble);
    else snprintf(out, n, "-");
    return out;
}

/* Keras' class name of a spec's layer type ("conv2d" -> "Conv2D"), as
 * model.summary() shows it; the type itself when it is not known here. */
static const char *keras_class(const char *type) {
    static const char *const names[][2] = {
        {"dense", "Dense"},
        {"dropout", "Dropout"},
        {"flatten", "Flatten"},
        {"activation", "Activation"},
        {"conv2d", "Conv2D"},
        {"max_pooling2d", "MaxPooling2D"},
        {"average_pooling2d", "AveragePooling2D"},
        {"global_average_pooling2d", "GlobalAveragePooling2D"},
        {"batch_normalization", "BatchNormalization"},
        {"reshape", "Reshape"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(type, names[i][0]) == 0) return names[i][1];
    return type;
}

/* A count with thousands separators, as Keras prints it ("54,538"). */
static const char *count_text(const cJSON *o, const char *k, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    long long x = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e15 ? (long long)v->valuedouble : 0;
    char d[32];
    int len = snprintf(d, sizeof d, "%lld", x);
    size_t w = 0;
    for (int i = 0; i < len && w + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0) out[w++] = ',';
        out[w++] = d[i];
    }
    out[w] = '\0';
    return out;
}

/* The model as Keras' model.summary() prints it, from the job's
 * model_summary (absent or null for a command job: nothing printed); the
 * columns as wide as their longest entry. */
static void print_model(const cJSON *j) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model_summary");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(m, "layers");
    if (!cJSON_IsObject(m) || !cJSON_IsArray(layers)) return;
    int n = cJSON_GetArraySize(layers);
    if (n <= 0 || n > 1024) return;
    char(*rows)[3][128] = xmalloc((size_t)n * sizeof *rows);
    int w[3] = {(int)strlen("Layer (type)"), (int)strlen("Output Shape"), (int)strlen("Param #")};
    int i = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, layers) {
        snprintf(rows[i][0], sizeof rows[i][0], "%s (%s)", jstr(l, "name"), keras_class(jstr(l, "type")));
        size_t at = (size_t)snprintf(rows[i][1], sizeof rows[i][1], "(None");
        const cJSON *d;
        cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(l, "output_shape")) {
            if (at < sizeof rows[i][1])
                at += (size_t)snprintf(rows[i][1] + at, sizeof rows[i][1] - at, ", %d", (int)d->valuedouble);
        }
        if (at < sizeof rows[i][1]) snprintf(rows[i][1] + at, sizeof rows[i][1] - at, ")");
        count_text(l, "params", rows[i][2], sizeof rows[i][2]);
        for (int c = 0; c < 3; c++)
            if ((int)strlen(rows[i][c]) > w[c]) w[c] = (int)strlen(rows[i][c]);
        i++;
    }
    int width = w[0] + 2 + w[1] + 2 + w[2];
    printf("model:\n  %-*s  %-*s  %*s\n  ", w[0], "Layer (type)", w[1], "Output Shape", w[2], "Param #");
    for (int k = 0; k < width; k++) putchar('=');
    putchar('\n');
    for (i = 0; i < n; i++) printf("  %-*s  %-*s  %*s\n", w[0], rows[i][0], w[1], rows[i][1], w[2], rows[i][2]);
    free(rows);
    printf("  ");
    for (int k = 0; k < width; k++) putchar('=');
    char a[32], b[32], c[32];
    printf("\n  Total params: %s\n  Trainable params: %s\n  Non-trainable params: %s\n",
           count_text(m, "total_params", a, sizeof a), count_text(m, "trainable_params", b, sizeof b),
           count_text(m, "non_trainable_params", c, sizeof c));
}

/* The progress for a person: epoch and step of the total, the newest loss
 * and accuracy, validation and test metrics, samples/s and the ETA. */
static void print_progress(const cJSON *j) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "progress");
    if (!cJSON_IsObject(p)) {
        printf("progress:   none yet\n");
        return;
    }
    const char *st = jstr(j, "state");
    const cJSON *le = cJSON_GetObjectItemCaseSensitive(p, "latest_epoch");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(p, "latest");
    const cJSON *te = cJSON_GetObjectItemCaseSensitive(p, "test");
    char a[32], b[32], eta[32] = "-";
    int epochs = (int)jnum(p, "epochs");
    int done = cJSON_IsObject(le) ? (int)jnum(le, "epoch") : 0; /* epochs completed */
    int total = (int)jnum(p, "total_steps");
    if (epochs > 0)
        printf("epoch:      %d of %d%s\n", done < epochs && !finished(st) ? done + 1 : done, epochs,
               done < epochs && !finished(st) ? " (running)" : "");
    if (total > 0) printf("step:       %d of %d (%.0f%%)\n", (int)jnum(p, "step"), total, 100.0 * jnum(p, "fraction"));
    else printf("step:       %d\n", (int)jnum(p, "step"));
    if (cJSON_IsObject(lt) || cJSON_IsObject(le))
        printf("train:      loss %s  accuracy %s\n", metric_text(cJSON_IsObject(lt) ? lt : le, "loss", a, sizeof a),
               metric_text(le, "accuracy", b, sizeof b));
    if (cJSON_IsObject(le) && cJSON_GetObjectItemCaseSensitive(le, "val_loss"))
        printf("validation: loss %s  accuracy %s  (epoch %d)\n", metric_text(le, "val_loss", a, sizeof a),
               metric_text(le, "val_accuracy", b, sizeof b), done);
    if (cJSON_IsObject(te))
        printf("test:       loss %s  accuracy %s\n", metric_text(te, "test_loss", a, sizeof a),
               metric_text(te, "test_accuracy", b, sizeof b));
    if (!finished(st) && jnum(p, "eta_s") > 0) fmt_secs(jnum(p, "eta_s"), eta, sizeof eta);
    /* running: the current speed; finished: the run's mean (its completed
     * epochs' samples over their training time), or the last figure when no
     * epoch ended */
    double mean = jnum(p, "mean_samples_per_sec"), secs = jnum(p, "train_seconds");
    if (finished(st) && mean > 0 && secs > 0)
        printf("speed:      %.0f samples/s (mean: %.0f samples in %.1f s of training)\n", mean, mean * secs, secs);
    else if (finished(st) && jnum(p, "samples_per_sec") > 0)
        printf("speed:      %.0f samples/s (the last reported)\n", jnum(p, "samples_per_sec"));
    else if (jnum(p, "samples_per_sec") > 0)
        printf("speed:      %.0f samples/s   ETA %s\n", jnum(p, "samples_per_sec"), eta);
}

static int do_status(const cli_opts *o, const char *id) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
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
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(r, "memory");
        char wk[32];
        workers_text(r, wk, sizeof wk);
        printf("resources:  workers %s x %d %s, %d ps, memory %s per task\n", wk,
               (int)jnum(r, "devices_per_worker"), jstr(r, "device"), (int)jnum(r, "ps"),
               cJSON_IsString(mem) ? mem->valuestring : "the node's share");
        printf("created:    %s\n", jstr(j, "created_at"));
        printf("started:    %s\n", jstr(j, "started_at"));
        printf("finished:   %s\n", jstr(j, "finished_at"));
        print_tasks(j);
        print_progress(j);
        print_model(j);
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
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
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

/* DELETE /jobs/{id}: a finished job's logs, checkpoints and metrics go. */
static int do_delete(const cli_opts *o, const char *id) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%s", id);
    int ec;
    cJSON *j = call(o, "DELETE", path, NULL, 0, 1, &ec);
    if (!j) return ec;
    if (!o->json) printf("job %d: deleted, %.0f bytes freed\n", (int)jnum(j, "id"), jnum(j, "freed_bytes"));
    cJSON_Delete(j);
    return 0;
}

/* Prints the job's log for a task from offset 0; with follow, keeps
 * polling once a second until the job has finished and the log is drained. */
static int do_logs(const cli_opts *o, const char *id, const char *task, int follow) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
    client c;
    if (cli_client(&c, o) < 0) {
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
            if (cJSON_IsNumber(q)) snprintf(quota, sizeof quota, "%.0f", q->valuedouble);
            else snprintf(quota, sizeof quota, "-");
            printf("%-5d %-20.20s %6.2f %9d %6s %7d %8d %7d\n", (int)jnum(t, "id"), jstr(t, "name"),
                   jnum(t, "weight"), (int)jnum(t, "guarantee"), quota, (int)jnum(t, "jobs_queued"),
                   (int)jnum(t, "jobs_running"), (int)jnum(t, "devices_in_use"));
        }
    }
    cJSON_Delete(v);
    return 0;
}

/* ---------------------------------------------------------------- watch */

static int state_exit(const char *st) {
    if (strcmp(st, "failed") == 0) return EXIT_JOB_FAILED;
    if (strcmp(st, "cancelled") == 0) return EXIT_JOB_CANCELLED;
    return EXIT_OK;
}

/* One line for a job: a bar of its steps, epoch, step, the newest loss and
 * accuracy, the ETA and the state. */
static void watch_line(const cJSON *j, char *out, size_t n) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "progress");
    const char *st = jstr(j, "state");
    double frac = cJSON_IsObject(p) ? jnum(p, "fraction") : 0;
    if (strcmp(st, "succeeded") == 0) frac = 1;
    if (frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    char bar[32];
    int w = 24, full = (int)(frac * w + 0.5);
    for (int i = 0; i < w; i++) bar[i] = i < full ? '#' : '.';
    bar[w] = '\0';
    char tail[256] = "";
    if (cJSON_IsObject(p)) {
        const cJSON *le = cJSON_GetObjectItemCaseSensitive(p, "latest_epoch");
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(p, "latest");
        int epoch = cJSON_IsObject(le) ? (int)jnum(le, "epoch") : (int)jnum(p, "epoch");
        char eta[32] = "-";
        if (!finished(st)) fmt_secs(jnum(p, "eta_s"), eta, sizeof eta);
        const cJSON *acc = cJSON_IsObject(le) ? cJSON_GetObjectItemCaseSensitive(le, "val_accuracy") : NULL;
        char accs[32] = "";
        if (cJSON_IsNumber(acc)) snprintf(accs, sizeof accs, "  val_acc %.4f", acc->valuedouble);
        snprintf(tail, sizeof tail, "epoch %d/%d  step %d/%d  loss %.4f%s  ETA %s", epoch, (int)jnum(p, "epochs"),
                 (int)jnum(p, "step"), (int)jnum(p, "total_steps"), cJSON_IsObject(lt) ? jnum(lt, "loss") : 0, accs, eta);
    }
    snprintf(out, n, "[%s] %3d%%  %s  %s", bar, (int)(frac * 100 + 0.5), tail[0] ? tail : "waiting for the first step", st);
}

/* Follows a job until it finishes: a progress bar redrawn in place on a
 * terminal, a line per change otherwise, one JSON object per change with
 * --json. The exit code tells how the job ended. */
static int do_watch(const cli_opts *o, const char *id) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
    char path[128], line[512], last[512] = "";
    snprintf(path, sizeof path, "/api/v1/jobs/%s", id);
    int tty = !o->json && isatty(STDOUT_FILENO);
    cli_opts q = *o;
    q.json = 0;
    int ec = EXIT_OK, misses = 0;
    for (;;) {
        cJSON *j = call(&q, "GET", path, NULL, 0, 0, &ec);
        if (!j) {
            if (ec == EXIT_UNREACHABLE && ++misses < 10) { /* a restarting server: try again */
                usleep(1000 * 1000);
                continue;
            }
            if (tty) fputc('\n', stdout);
            return ec;
        }
        misses = 0;
        char st[16];
        snprintf(st, sizeof st, "%s", jstr(j, "state"));
        if (o->json) {
            cJSON *out = cJSON_CreateObject();
            cJSON_AddNumberToObject(out, "id", jnum(j, "id"));
            cJSON_AddStringToObject(out, "state", st);
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "progress");
            cJSON_AddItemToObject(out, "progress", cJSON_IsObject(p) ? cJSON_Duplicate(p, 1) : cJSON_CreateNull());
            char *s = cJSON_PrintUnformatted(out);
            cJSON_Delete(out);
            if (s && strcmp(s, last) != 0) {
                printf("%s\n", s);
                snprintf(last, sizeof last, "%.*s", (int)sizeof last - 1, s);
            }
            free(s);
        } else {
            watch_line(j, line, sizeof line);
            if (tty) printf("\r\033[K#%s %s", id, line);
            else if (strcmp(line, last) != 0) printf("#%s %s\n", id, line);
            snprintf(last, sizeof last, "%s", line);
        }
        fflush(stdout);
        if (finished(st)) {
            if (tty) fputc('\n', stdout);
            if (!o->json && strcmp(st, "succeeded") != 0) printf("job %s %s: %s\n", id, st, jstr(j, "reason"));
            cJSON_Delete(j);
            return state_exit(st);
        }
        cJSON_Delete(j);
        usleep((useconds_t)o->interval_ms * 1000);
    }
}

/* ---------------------------------------------------------------- queue, cluster, events */

static int do_queue(const cli_opts *o) {
    int ec;
    cJSON *v = call(o, "GET", "/api/v1/queue", NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%d queued\n", (int)jnum(v, "queued"));
        printf("%-4s %-6s %-12s %4s  %-24s %-24s %s\n", "POS", "JOB", "TEAM", "PRI", "QUEUED", "ESTIMATED START", "WHY IT WAITS");
        const cJSON *j;
        cJSON_ArrayForEach(j, cJSON_GetObjectItemCaseSensitive(v, "jobs")) {
            printf("%-4d %-6d %-12.12s %4d  %-24s %-24s %s\n", (int)jnum(j, "position"), (int)jnum(j, "id"),
                   jstr(j, "team"), (int)jnum(j, "priority"), jstr(j, "queued_at"),
                   cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "estimated_start")) ? jstr(j, "estimated_start") : "unknown",
                   jstr(j, "reason"));
        }
    }
    cJSON_Delete(v);
    return 0;
}

/* "7" or "another team" for a holder. */
static void holder(const cJSON *job, char *out, size_t n) {
    if (cJSON_IsNumber(job)) snprintf(out, n, "job %.0f", job->valuedouble);
    else if (cJSON_IsString(job)) snprintf(out, n, "%s", job->valuestring);
    else snprintf(out, n, "free");
}

static int do_cluster(const cli_opts *o) {
    int ec;
    cJSON *v = call(o, "GET", "/api/v1/cluster", NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "utilisation");
        printf("nodes %d/%d ready, gpus %d/%d in use, cpu slots %d/%d in use\n", (int)jnum(u, "nodes_ready"),
               (int)jnum(u, "nodes"), (int)jnum(u, "gpus_used"), (int)jnum(u, "gpus"), (int)jnum(u, "cpu_slots_used"),
               (int)jnum(u, "cpu_slots"));
        const cJSON *n;
        cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(v, "nodes")) {
            const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(n, "cpu_slots");
            printf("%-20.20s %-8s %-16s cpu %d/%d", jstr(n, "hostname"), jstr(n, "state"), jstr(n, "address"),
                   (int)jnum(cpu, "used"), (int)jnum(cpu, "total"));
            const cJSON *h;
            cJSON_ArrayForEach(h, cJSON_GetObjectItemCaseSensitive(cpu, "holders")) {
                char who[48];
                holder(cJSON_GetObjectItemCaseSensitive(h, "job"), who, sizeof who);
                printf("  [%s: %d]", who, (int)jnum(h, "slots"));
            }
            printf("\n");
            /* memory the scheduler places by, and what keeps teams apart there */
            const cJSON *iso = cJSON_GetObjectItemCaseSensitive(n, "isolation");
            char enforced[256] = "";
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(iso, "enforced")) {
                size_t l = strlen(enforced);
                if (cJSON_IsString(e)) snprintf(enforced + l, sizeof enforced - l, "%s%s", l ? "," : "", e->valuestring);
            }
            printf("    memory %d/%d MiB in use; isolation %s%s%s%s%s\n", (int)jnum(n, "memory_used_mb"),
                   (int)jnum(n, "memory_mb"), jstr(iso, "mode"), enforced[0] ? " (" : "", enforced,
                   enforced[0] ? ")" : "", strcmp(jstr(iso, "mode"), "none") == 0 ? ": teams are NOT isolated" : "");
            const cJSON *g;
            cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(n, "gpus")) {
                char who[48];
                holder(cJSON_GetObjectItemCaseSensitive(g, "job"), who, sizeof who);
                printf("    gpu:%-3d %-24.24s %7d MiB  %s\n", (int)jnum(g, "index"), jstr(g, "model"),
                       (int)jnum(g, "memory_mb"), who);
            }
        }
    }
    cJSON_Delete(v);
    return 0;
}

static int do_events(const cli_opts *o, const char *id) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/events?limit=1000", id);
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(v, "events")) {
            const char *to = jstr(e, "to");
            printf("%s  %-10s %-16s %s\n", jstr(e, "time"), strcmp(to, "-") ? to : jstr(e, "kind"), jstr(e, "actor"),
                   jstr(e, "reason"));
        }
    }
    cJSON_Delete(v);
    return 0;
}

/* ---------------------------------------------------------------- checkpoints */

static int do_download(const cli_opts *o, const char *id) {
    if (o->checkpoint && !valid_id(o->checkpoint)) {
        fprintf(stderr, "error: --checkpoint wants a checkpoint id\n");
        return EXIT_USAGE;
    }
    char path[160], out[1024];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/checkpoints/%s", id, o->checkpoint ? o->checkpoint : "latest");
    if (o->output) snprintf(out, sizeof out, "%s", o->output);
    else snprintf(out, sizeof out, "job-%s-checkpoint-%s.safetensors", id, o->checkpoint ? o->checkpoint : "latest");
    client c;
    if (cli_client(&c, o) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        return EXIT_UNREACHABLE;
    }
    long status = 0;
    char want[65], got[65], loc[1024], err[512];
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 64 * 1024);
    int rc = client_download(&c, path, out, &status, want, got, loc, sizeof loc, &size, &eb, err, sizeof err);
    client_release(&c);
    int ret = EXIT_OK;
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", err);
        ret = status ? EXIT_REFUSED : EXIT_UNREACHABLE;
    } else if (status >= 400) {
        client_reply r = {.status = status, .body = eb};
        if (o->json) fwrite(eb.data ? eb.data : "", 1, eb.len, stdout);
        else print_error(&r);
        ret = status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
    } else if (!want[0] || strcmp(want, got) != 0) {
        fprintf(stderr, "error: %s: sha256 %s does not match the server's %s; removed\n", out, got, want[0] ? want : "(none)");
        unlink(out);
        ret = EXIT_CHECKSUM;
    } else if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", out);
        cJSON_AddNumberToObject(j, "size", (double)size);
        cJSON_AddStringToObject(j, "sha256", got);
        cJSON_AddStringToObject(j, "location", loc);
        char *s = cJSON_PrintUnformatted(j);
        if (s) printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("saved %s (%llu bytes, sha256 %s verified)\n", out, (unsigned long long)size, got);
    }
    buf_release(&eb);
    return ret;
}

static int do_checkpoints(const cli_opts *o, const char *id) {
    if (!id_ok(id, "job"))
        return EXIT_USAGE;
    if (o->download) return do_download(o, id);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/checkpoints", id);
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%-6s %6s %8s %10s  %-24s %s\n", "ID", "EPOCH", "STEP", "BYTES", "CREATED", "SHA256");
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(v, "checkpoints"))
            printf("%-6d %6d %8d %10.0f  %-24s %s\n", (int)jnum(c, "id"), (int)jnum(c, "epoch"), (int)jnum(c, "step"),
                   jnum(c, "size"), jstr(c, "created_at"), jstr(c, "sha256"));
    }
    cJSON_Delete(v);
    return 0;
}

/* ---------------------------------------------------------------- usage */

/* s with every byte but unreserved ones %-escaped (an ISO time's '+'). */
static int query_escape(const char *s, char *out, size_t cap) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                    *p == '-' || *p == '_' || *p == '.' || *p == '~';
        if (n + (plain ? 1 : 3) >= cap) return -1;
        if (plain) out[n++] = (char)*p;
        else n += (size_t)snprintf(out + n, cap - n, "%%%02X", *p);
    }
    out[n] = '\0';
    return 0;
}

/* A number of a reply as it is (jnum clamps to int's range). */
static double jdouble(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void wait_text(const cJSON *w, const char *k, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(w, k);
    if (cJSON_IsNumber(v)) fmt_secs(v->valuedouble, out, n);
    else snprintf(out, n, "-");
}

static void bytes_text(double b, char *out, size_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    if (u == 0) snprintf(out, n, "%.0f B", b);
    else snprintf(out, n, "%.1f %s", b, unit[u]);
}

/* One line of the table: its key, then the numbers in sreport's manner. */
static void usage_line(const cJSON *r, const char *key, int by_team) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(r, "jobs"), *w = cJSON_GetObjectItemCaseSensitive(r, "wait_s");
    char med[32], p95[32];
    wait_text(w, "median", med, sizeof med);
    wait_text(w, "p95", p95, sizeof p95);
    printf("%-30.30s %10.3f %10.3f %5.0f %5.0f %5.0f %5.0f %5.0f %9s %9s", key, jdouble(r, "gpu_seconds") / 3600,
           jdouble(r, "cpu_slot_seconds") / 3600, jdouble(j, "run"), jdouble(j, "succeeded"), jdouble(j, "failed"),
           jdouble(j, "cancelled"), jdouble(j, "preempted"), med, p95);
    if (by_team) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(r, "storage_bytes");
        char l[24], c[24], x[24];
        bytes_text(jdouble(s, "logs"), l, sizeof l);
        bytes_text(jdouble(s, "checkpoints"), c, sizeof c);
        bytes_text(jdouble(s, "contexts"), x, sizeof x);
        printf(" %10s %10s %10s", l, c, x);
    }
    printf("\n");
}

static int do_usage(const cli_opts *o) {
    char path[1200] = "/api/v1/usage?", esc[256];
    const char *keys[] = {"from", "to", "by", "team"};
    const char *vals[] = {o->from, o->to, o->by, o->team};
    for (int i = 0; i < 4; i++) {
        if (!vals[i]) continue;
        if (query_escape(vals[i], esc, sizeof esc) < 0) {
            fprintf(stderr, "error: --%s is too long\n", keys[i]);
            return EXIT_USAGE;
        }
        size_t l = strlen(path);
        snprintf(path + l, sizeof path - l, "%s%s=%s", path[l - 1] == '?' ? "" : "&", keys[i], esc);
    }
    if (o->csv) {
        client c;
        if (cli_client(&c, o) < 0) {
            fprintf(stderr, "error: cannot initialise the HTTP client\n");
            return EXIT_REFUSED;
        }
        snprintf(c.accept, sizeof c.accept, "text/csv");
        client_reply r;
        int rc = client_request(&c, "GET", path, NULL, 0, NULL, &r);
        client_release(&c);
        int ret = EXIT_OK;
        if (rc < 0) {
            fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
            ret = EXIT_UNREACHABLE;
        } else if (r.status >= 400) {
            print_error(&r);
            ret = r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
        } else if (r.body.len && fwrite(r.body.data, 1, r.body.len, stdout) != r.body.len) {
            ret = EXIT_UNREACHABLE;
        }
        client_reply_release(&r);
        return ret;
    }
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        const char *by = jstr(v, "by");
        int by_team = strcmp(by, "team") == 0, by_job = strcmp(by, "job") == 0, by_day = strcmp(by, "day") == 0;
        static const char rule[] = "------------------------------------------------------------------------------"
                                   "-------------------------";
        printf("%s\nUsage %s - %s, by %s\n"
               "Device time in hours; jobs run in the window, ended in it, preempted in it; wait: submission to\n"
               "first placement of the jobs first placed in it%s\n%s\n",
               rule, jstr(v, "from"), jstr(v, "to"), by, by_team ? "; storage held now" : "", rule);
        printf("%-30s %10s %10s %5s %5s %5s %5s %5s %9s %9s", by_job ? "JOB NAME (TEAM)" : by_day ? "DAY        TEAM" : "TEAM",
               "GPU-HOURS", "CPU-HOURS", "RUN", "OK", "FAIL", "CANC", "PREEM", "WAIT-MED", "WAIT-P95");
        if (by_team) printf(" %10s %10s %10s", "LOGS", "CHECKPTS", "CONTEXTS");
        printf("\n");
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(v, "rows")) {
            char key[160];
            if (by_job) snprintf(key, sizeof key, "%.0f %s (%s)", jdouble(r, "job"), jstr(r, "name"), jstr(r, "team"));
            else if (by_day) snprintf(key, sizeof key, "%s %s", jstr(r, "day"), jstr(r, "team"));
            else snprintf(key, sizeof key, "%s", jstr(r, "team"));
            usage_line(r, key, by_team);
        }
        printf("%s\n", rule);
        usage_line(cJSON_GetObjectItemCaseSensitive(v, "totals"), "TOTAL", by_team);
    }
    cJSON_Delete(v);
    return 0;
}

/* ---------------------------------------------------------------- sweeps */

/* POST /sweeps with FILE ({"name", "job", "search"}, docs/sweeps.md). */
static int do_sweep(const cli_opts *o, const char *file) {
    size_t len = 0;
    char *body = file_read_all(file, 1u << 20, &len);
    if (!body) {
        fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    int ec;
    cJSON *s = call_submit(o, "/api/v1/sweeps", body, len, &ec);
    free(body);
    if (!s) return ec;
    if (!o->json)
        printf("submitted sweep %d (%s): %d trials, %s\n", (int)jnum(s, "id"), jstr(s, "name"),
               (int)jnum(s, "n_trials"), jstr(s, "state"));
    cJSON_Delete(s);
    return 0;
}

static int do_sweeps(const cli_opts *o) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/sweeps?limit=%ld", o->limit > 200 ? 200L : o->limit);
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("%-6s %-20s %-10s %-10s %-7s %-7s %s\n", "ID", "NAME", "TEAM", "STATE", "METHOD", "TRIALS",
               "METRIC");
        const cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(v, "sweeps")) {
            const cJSON *q = cJSON_GetObjectItemCaseSensitive(s, "search");
            printf("%-6d %-20.20s %-10.10s %-10s %-7s %-7d %s (%s)\n", (int)jnum(s, "id"), jstr(s, "name"),
                   jstr(s, "team"), jstr(s, "state"), jstr(q, "method"), (int)jnum(s, "n_trials"), jstr(q, "metric"),
                   jstr(q, "mode"));
        }
    }
    cJSON_Delete(v);
    return 0;
}

/* Trials by their metric, best first (mode max: highest); those without
 * one after, in trial order. */
static int g_sweep_max;
static int trial_cmp(const void *a, const void *b) {
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(x, "metric"), *my = cJSON_GetObjectItemCaseSensitive(y, "metric");
    int hx = cJSON_IsNumber(mx), hy = cJSON_IsNumber(my);
    if (hx != hy) return hx ? -1 : 1;
    if (hx && mx->valuedouble != my->valuedouble) {
        int first = g_sweep_max ? mx->valuedouble > my->valuedouble : mx->valuedouble < my->valuedouble;
        return first ? -1 : 1;
    }
    return (int)jnum(x, "trial") - (int)jnum(y, "trial");
}

static int do_sweep_status(const cli_opts *o, const char *id) {
    if (!id_ok(id, "sweep"))
        return EXIT_USAGE;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/sweeps/%s", id);
    int ec;
    cJSON *v = call(o, "GET", path, NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(v, "search");
        const char *metric = jstr(q, "metric");
        g_sweep_max = strcmp(jstr(q, "mode"), "max") == 0;
        printf("sweep %d (%s): %s%s%s\n", (int)jnum(v, "id"), jstr(v, "name"), jstr(v, "state"),
               cJSON_IsString(cJSON_GetObjectItemCaseSensitive(v, "reason")) ? ": " : "",
               cJSON_IsString(cJSON_GetObjectItemCaseSensitive(v, "reason")) ? jstr(v, "reason") : "");
        printf("search: %s, %s %s, at most %d at once\n", jstr(q, "method"), metric, jstr(q, "mode"),
               (int)jnum(q, "max_concurrent"));
        const cJSON *trials = cJSON_GetObjectItemCaseSensitive(v, "trials");
        int n = cJSON_GetArraySize(trials), k = 0;
        const cJSON **rows = calloc((size_t)(n > 0 ? n : 1), sizeof *rows);
        if (!rows) {
            cJSON_Delete(v);
            fprintf(stderr, "error: out of memory\n");
            return 1;
        }
        const cJSON *t;
        cJSON_ArrayForEach(t, trials) rows[k++] = t;
        qsort(rows, (size_t)k, sizeof *rows, trial_cmp);
        printf("%-5s %-10s %6s %6s %4s %-12s %s\n", "TRIAL", "STATE", "JOB", "EPOCHS", "RUNG", metric, "PARAMS");
        for (int i = 0; i < k; i++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(rows[i], "metric");
            char mt[32], job[24];
            if (cJSON_IsNumber(m)) snprintf(mt, sizeof mt, "%.6g", m->valuedouble);
            else snprintf(mt, sizeof mt, "-");
            const cJSON *j = cJSON_GetObjectItemCaseSensitive(rows[i], "job_id");
            if (cJSON_IsNumber(j)) snprintf(job, sizeof job, "%d", (int)j->valuedouble);
            else snprintf(job, sizeof job, "-");
            char *params = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(rows[i], "params"));
            printf("%-5d %-10s %6s %6d %4d %-12s %s\n", (int)jnum(rows[i], "trial"), jstr(rows[i], "state"), job,
                   (int)jnum(rows[i], "epochs"), (int)jnum(rows[i], "rung"), mt, params ? params : "{}");
            free(params);
        }
        free(rows);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(v, "best");
        if (cJSON_IsObject(b)) {
            const cJSON *ck = cJSON_GetObjectItemCaseSensitive(b, "checkpoint");
            printf("best: trial %d (job %d), %s %.6g", (int)jnum(b, "trial"), (int)jnum(b, "job_id"), metric,
                   jdouble(b, "metric"));
            if (cJSON_IsNumber(ck)) printf(", checkpoint %d", (int)ck->valuedouble);
            printf("\n");
        }
    }
    cJSON_Delete(v);
    return 0;
}

/* ---------------------------------------------------------------- sign-in */

/* The error code of an error reply ("" when none). */
static void reply_code(const client_reply *r, char *out, size_t n, int *interval) {
    out[0] = '\0';
    cJSON *o = cJSON_ParseWithLength(r->body.data ? r->body.data : "", r->body.len);
    const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "error") : NULL;
    const cJSON *c = e ? cJSON_GetObjectItemCaseSensitive(e, "code") : NULL;
    if (cJSON_IsString(c)) snprintf(out, n, "%s", c->valuestring);
    const cJSON *iv = o ? cJSON_GetObjectItemCaseSensitive(o, "interval") : NULL;
    if (interval && cJSON_IsNumber(iv) && iv->valuedouble >= 1 && iv->valuedouble <= 600) *interval = (int)iv->valuedouble;
    cJSON_Delete(o);
}

/* Makes the directories of path (mode 0700, as ~/.config is) and writes
 * the token there, 0600. 0 or -1 (message printed). */
static int save_token(const char *path, const char *token) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = '\0';
    if (mkdir_p(dir, 0700) < 0) {
        fprintf(stderr, "error: cannot make %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char line[300];
    int n = snprintf(line, sizeof line, "%s\n", token);
    if (n < 0 || (size_t)n >= sizeof line || file_write_atomic(path, line, (size_t)n, 0600) < 0) {
        fprintf(stderr, "error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* trainyard login: the device flow against our server (which holds the
 * provider's client secret), the personal token stored for the CLI. */
static int do_login(const cli_opts *o) {
    char path[PATH_MAX];
    if (client_config_token_path(path, sizeof path) < 0) {
        fprintf(stderr, "error: neither XDG_CONFIG_HOME nor HOME names a directory to keep the token in\n");
        return EXIT_USAGE;
    }
    cli_opts anon = *o;
    anon.token[0] = '\0';
    int ec = 0;
    cJSON *d = call(&anon, "POST", "/api/v1/auth/device", "{}", 2, 0, &ec);
    if (!d) return ec;
    char handle[128], body[200];
    snprintf(handle, sizeof handle, "%s", jstr(d, "device"));
    int interval = (int)jnum(d, "interval");
    if (interval < 1) interval = 5;
    int64_t deadline = mono_ms() + (int64_t)(jnum(d, "expires_in") > 0 ? jnum(d, "expires_in") : 600) * 1000;
    if (o->json) {
        char *txt = cJSON_PrintUnformatted(d);
        printf("%s\n", txt ? txt : "{}");
        free(txt);
    } else {
        printf("To sign in, open %s\nand enter the code %s\n", jstr(d, "verification_uri"), jstr(d, "user_code"));
        printf("(or open %s)\nWaiting for the sign-in...\n", jstr(d, "verification_uri_complete"));
    }
    fflush(stdout);
    cJSON_Delete(d);
    snprintf(body, sizeof body, "{\"device\":\"%s\"}", handle);
    client c;
    if (cli_client(&c, &anon) < 0) {
        fprintf(stderr, "error: cannot initialise the HTTP client\n");
        return EXIT_REFUSED;
    }
    int rc = EXIT_REFUSED;
    for (;;) {
        if (mono_ms() > deadline) {
            fprintf(stderr, "error: the code expired before the sign-in: run trainyard login again\n");
            break;
        }
        struct timespec ts = {interval, 0};
        nanosleep(&ts, NULL);
        client_reply r;
        if (client_request(&c, "POST", "/api/v1/auth/device/token", body, strlen(body), NULL, &r) < 0) {
            fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
            client_reply_release(&r);
            rc = EXIT_UNREACHABLE;
            break;
        }
        char code[64];
        reply_code(&r, code, sizeof code, &interval);
        if (r.status == 400 && (strcmp(code, "authorization_pending") == 0 || strcmp(code, "slow_down") == 0)) {
            client_reply_release(&r);
            continue;
        }
        if (r.status != 201) {
            if (strcmp(code, "access_denied") == 0) fprintf(stderr, "error: the sign-in was refused at the provider\n");
            else if (strcmp(code, "expired_token") == 0)
                fprintf(stderr, "error: the code expired before the sign-in: run trainyard login again\n");
            else print_error(&r);
            rc = r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
            client_reply_release(&r);
            break;
        }
        cJSON *t = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        client_reply_release(&r);
        const cJSON *tok = t ? cJSON_GetObjectItemCaseSensitive(t, "token") : NULL;
        if (!cJSON_IsString(tok)) {
            fprintf(stderr, "error: the server's reply holds no token\n");
            cJSON_Delete(t);
            break;
        }
        if (save_token(path, tok->valuestring) == 0) {
            printf("Signed in as %s; the token (until %s) is in %s\n", jstr(t, "user"), jstr(t, "expires_at"), path);
            rc = EXIT_OK;
        }
        cJSON_Delete(t);
        break;
    }
    client_release(&c);
    return rc;
}

/* trainyard logout: the stored token revoked (DELETE /tokens/{id}) and its file removed. */
static int do_logout(const cli_opts *o) {
    char path[PATH_MAX], err[512];
    if (client_config_token_path(path, sizeof path) < 0) {
        fprintf(stderr, "error: neither XDG_CONFIG_HOME nor HOME is set\n");
        return EXIT_USAGE;
    }
    size_t len = 0;
    char *s = file_read_all(path, 1024, &len);
    if (!s) {
        fprintf(stderr, "error: not signed in with trainyard login (%s: %s)\n", path, strerror(errno));
        return EXIT_REFUSED;
    }
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ')) s[--len] = '\0';
    cli_opts me = *o;
    int too_long = sfmt(me.token, sizeof me.token, "%s", s) < 0;
    free(s);
    if (too_long) snprintf(me.token, sizeof me.token, "-");
    me.json = 0;
    client c;
    client_reply r;
    if (cli_client(&c, &me) < 0) return EXIT_REFUSED;
    int rc = client_request(&c, "GET", "/api/v1/me", NULL, 0, NULL, &r);
    if (rc < 0) {
        fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
        client_reply_release(&r);
        client_release(&c);
        return EXIT_UNREACHABLE;
    }
    int revoked = 0;
    if (r.status == 200) {
        cJSON *v = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        double id = jdouble(cJSON_GetObjectItemCaseSensitive(v, "credential"), "id");
        cJSON_Delete(v);
        client_reply_release(&r);
        char p[64];
        snprintf(p, sizeof p, "/api/v1/tokens/%.0f", id);
        if (client_request(&c, "DELETE", p, NULL, 0, NULL, &r) < 0) {
            fprintf(stderr, "error: cannot reach the server: %s\n", r.error);
            client_reply_release(&r);
            client_release(&c);
            return EXIT_UNREACHABLE;
        }
        if (r.status >= 400) {
            print_error(&r);
            client_reply_release(&r);
            client_release(&c);
            return r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
        }
        revoked = 1;
    } else if (r.status != 401) { /* 401: already revoked or expired; the file goes anyway */
        print_error(&r);
        client_reply_release(&r);
        client_release(&c);
        return r.status >= 500 ? EXIT_UNREACHABLE : EXIT_REFUSED;
    }
    client_reply_release(&r);
    client_release(&c);
    if (unlink(path) < 0) {
        snprintf(err, sizeof err, "%s", strerror(errno));
        fprintf(stderr, "error: cannot remove %s: %s\n", path, err);
        return EXIT_REFUSED;
    }
    printf("Signed out: %s; %s removed\n", revoked ? "the token is revoked" : "the token was no longer valid", path);
    return EXIT_OK;
}

/* trainyard whoami: GET /api/v1/me. */
static int do_whoami(const cli_opts *o) {
    int ec = 0;
    cJSON *v = call(o, "GET", "/api/v1/me", NULL, 0, 1, &ec);
    if (!v) return ec;
    if (!o->json) {
        printf("name:       %s\n", jstr(v, "name"));
        printf("kind:       %s%s\n", jstr(v, "kind"),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "cluster_admin")) ? " (cluster admin)" : "");
        const cJSON *email = cJSON_GetObjectItemCaseSensitive(v, "email");
        if (cJSON_IsString(email)) printf("email:      %s\n", email->valuestring);
        printf("signed in:  %s", jstr(v, "signed_in_via"));
        const cJSON *cr = cJSON_GetObjectItemCaseSensitive(v, "credential");
        if (cr) printf(" (%s %.0f, until %s)", jstr(cr, "kind"), jdouble(cr, "id"), jstr(cr, "expires_at"));
        printf("\nteams:      ");
        const cJSON *t;
        int n = 0;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(v, "teams"))
            printf("%s%s (%s)", n++ ? ", " : "", jstr(t, "team"), jstr(t, "role"));
        printf("%s\n", n ? "" : "none");
    }
    cJSON_Delete(v);
    return 0;
}

static void cli_usage(FILE *f) {

    fprintf(f,
            "usage: trainyard submit FILE [--context DIR]   submit a job spec (JSON); --context packs DIR\n"
            "                                        (less what DIR/.trainyardignore names), uploads it and\n"
            "                                        sets the command job's command.context to its id\n"
            "       trainyard jobs [--state S] [--limit N]\n"
            "       trainyard status ID              a job, its progress, its model (layers, shapes,\n"
            "                                        params, as Keras' model.summary()) and timeline\n"
            "       trainyard cancel ID [--reason R]\n"
            "       trainyard delete ID              a finished job's logs, checkpoints and metrics removed\n"
            "       trainyard logs ID [--task worker-0] [-f]   a task's output; -f follows until the job ends\n"
            "       trainyard teams\n"
            "       trainyard watch ID [--interval MS]   a progress bar until the job ends\n"
            "       trainyard queue                  queued jobs, why each waits, estimated start\n"
            "       trainyard cluster                nodes, devices and who holds them\n"
            "       trainyard events ID              a job's timeline\n"
            "       trainyard checkpoints ID [--download [--checkpoint CID] [-o FILE]]\n"
            "       trainyard context push DIR       pack and upload a folder; prints its id (sha256:...)\n"
            "       trainyard context list           the team's contexts, their size and the jobs using them\n"
            "       trainyard usage [--from T] [--to T] [--by team|job|day] [--team NAME] [--csv]\n"
            "                                        device hours, jobs, waits and storage (default: the last\n"
            "                                        30 days by team; T: ISO 8601 or ms); --csv: the server's CSV\n"
            "       trainyard login                  sign in with the cluster's single sign-on (a code to\n"
            "                                        enter in a browser); the token is kept in\n"
            "                                        ~/.config/trainyard/token (XDG_CONFIG_HOME), 0600\n"
            "       trainyard logout                 that token revoked and its file removed\n"
            "       trainyard whoami                 who the token speaks for, how signed in, teams and roles\n"
            "       trainyard shell ID [--task NAME] [-- CMD ...]   CMD (default: a login shell) in a running\n"
            "                                        task (default: the job's first running one); a terminal\n"
            "                                        on stdin gets a PTY; exits with CMD's status\n"
            "options: --json (print the server's JSON), --url URL[,URL...], --token TOKEN, --team NAME\n"
            "         (the team a person acts in: Trainyard-Team),\n"
            "         --ca-cert FILE (the CA to verify an https:// server with)\n"
            "exit: 0 ok, 1 refused by the server (4xx), 2 usage (or a folder that cannot be packed),\n"
            "      3 server unreachable or 5xx,\n"
            "      4 watched job failed, 5 watched job cancelled, 6 download sha256 mismatch\n"
            "servers: a comma-separated list (several servers on one database): each request goes to the\n"
            "         one that leads, moving past a server that is down or a standby for up to 15 s\n"
            "         (TRAINYARD_FAILOVER_MS); a submission carries an Idempotency-Key kept across retries\n"
            "env: TRAINYARD_URL (default http://127.0.0.1:8080), TRAINYARD_TOKEN (default: TRAINYARD_TOKEN_FILE,\n"
            "     else ./.trainyard/token, else trainyard login's token), TRAINYARD_TEAM (as --team),\n"
            "     TRAINYARD_CA (a CA file for https://; default: the system's store)\n");
}

int cmd_cli(int argc, char **argv) {
    const char *cmd = argv[0];
    static const char *cmds[] = {"submit", "jobs",  "status", "cancel", "delete", "teams", "logs",
                                 "watch",  "queue", "cluster", "events", "checkpoints", "context",
                                 "usage", "sweep", "sweeps", "sweep-status", "login", "logout", "whoami", "shell"};
    int known = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(cmd, cmds[i]) == 0) known = 1;
    if (!known) return -1;

    cli_opts o;
    memset(&o, 0, sizeof o);
    o.limit = 50;
    o.interval_ms = 500;
    const char *url = NULL, *token = NULL;
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},   {"url", required_argument, NULL, 'u'},
        {"token", required_argument, NULL, 't'}, {"state", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'n'}, {"reason", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},   {"task", required_argument, NULL, 'T'},
        {"follow", no_argument, NULL, 'f'}, {"download", no_argument, NULL, 'D'},
        {"checkpoint", required_argument, NULL, 'C'}, {"output", required_argument, NULL, 'o'},
        {"interval", required_argument, NULL, 'i'}, {"ca-cert", required_argument, NULL, 'A'},
        {"context", required_argument, NULL, 'X'},  {"from", required_argument, NULL, 'F'},
        {"to", required_argument, NULL, 'U'},       {"by", required_argument, NULL, 'B'},
        {"team", required_argument, NULL, 'M'},     {"csv", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    const char *task = "worker-0";
    int task_given = 0, follow = 0;
    /* shell: what follows "--" is the command, never options */
    int cmd_argc = 0;
    char **cmd_argv = NULL;
    if (strcmp(cmd, "shell") == 0)
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], "--") == 0) {
                cmd_argc = argc - i - 1;
                cmd_argv = argv + i + 1;
                argc = i;
                break;
            }
    long iv;
    while ((c = getopt_long(argc, argv, "fo:", longopts, NULL)) != -1) {
        switch (c) {
        case 'D': o.download = 1; break;
        case 'C': o.checkpoint = optarg; break;
        case 'o': o.output = optarg; break;
        case 'X': o.context = optarg; break;
        case 'F': o.from = optarg; break;
        case 'U': o.to = optarg; break;
        case 'B': o.by = optarg; break;
        case 'M': o.team = optarg; break;
        case 'V': o.csv = 1; break;
        case 'i':
            if (parse_long(optarg, 50, 60000, &iv) < 0) {
                fprintf(stderr, "error: --interval wants 50-60000 (ms)\n");
                return 2;
            }
            o.interval_ms = (int)iv;
            break;
        case 'j': o.json = 1; break;
        case 'T': task = optarg; task_given = 1; break;
        case 'f': follow = 1; break;
        case 'u': url = optarg; break;
        case 't': token = optarg; break;
        case 'A': {
            char cerr[512];
            if (client_trust_ca_file(optarg, "--ca-cert", cerr, sizeof cerr) < 0) {
                fprintf(stderr, "error: %s\n", cerr);
                return 2;
            }
            break;
        }
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
    char err[512];
    if (url ? sfmt(o.url, sizeof o.url, "%s", url) < 0 : (client_default_url(o.url, sizeof o.url), 0)) {
        fprintf(stderr, "error: --url: over %zu bytes\n", sizeof o.url - 1);
        return 2;
    }
    int n_urls = 0;
    if (client_url_list_check(o.url, url ? "--url" : "TRAINYARD_URL", &n_urls, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    const char *team_env = getenv("TRAINYARD_TEAM");
    if (sfmt(o.team_hdr, sizeof o.team_hdr, "%s", o.team ? o.team : team_env ? team_env : "") < 0) {
        fprintf(stderr, "error: --team wants a team's name (under 64 bytes)\n");
        return 2;
    }
    int nargs0 = argc - optind;
    if (strcmp(cmd, "login") == 0 || strcmp(cmd, "logout") == 0) { /* their own token, or none yet */
        if (nargs0 != 0) {
            cli_usage(stderr);
            return 2;
        }
        return strcmp(cmd, "login") == 0 ? do_login(&o) : do_logout(&o);
    }
    if (token) snprintf(o.token, sizeof o.token, "%s", token);
    else if (client_default_token(o.token, sizeof o.token, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    int nargs = argc - optind;
    if (o.context && strcmp(cmd, "submit") != 0) {
        fprintf(stderr, "error: --context goes with submit (trainyard context push DIR uploads a folder alone)\n");
        return 2;
    }
    if (strcmp(cmd, "context") == 0 && nargs == 2 && strcmp(argv[optind], "push") == 0)
        return do_context_push(&o, argv[optind + 1]);
    if (strcmp(cmd, "context") == 0 && nargs == 1 && strcmp(argv[optind], "list") == 0) return do_context_list(&o);
    if ((o.from || o.to || o.by || o.csv) && strcmp(cmd, "usage") != 0) {
        fprintf(stderr, "error: --from, --to, --by and --csv go with usage\n");
        return 2;
    }
    if (strcmp(cmd, "usage") == 0 && nargs == 0) return do_usage(&o);
    if (strcmp(cmd, "submit") == 0 && nargs == 1) return do_submit(&o, argv[optind]);
    if (strcmp(cmd, "sweep") == 0 && nargs == 1) return do_sweep(&o, argv[optind]);
    if (strcmp(cmd, "sweeps") == 0 && nargs == 0) return do_sweeps(&o);
    if (strcmp(cmd, "sweep-status") == 0 && nargs == 1) return do_sweep_status(&o, argv[optind]);
    if (strcmp(cmd, "jobs") == 0 && nargs == 0) return do_jobs(&o);
    if (strcmp(cmd, "status") == 0 && nargs == 1) return do_status(&o, argv[optind]);
    if (strcmp(cmd, "cancel") == 0 && nargs == 1) return do_cancel(&o, argv[optind]);
    if (strcmp(cmd, "delete") == 0 && nargs == 1) return do_delete(&o, argv[optind]);
    if (strcmp(cmd, "teams") == 0 && nargs == 0) return do_teams(&o);
    if (strcmp(cmd, "whoami") == 0 && nargs == 0) return do_whoami(&o);
    if (strcmp(cmd, "watch") == 0 && nargs == 1) return do_watch(&o, argv[optind]);
    if (strcmp(cmd, "queue") == 0 && nargs == 0) return do_queue(&o);
    if (strcmp(cmd, "cluster") == 0 && nargs == 0) return do_cluster(&o);
    if (strcmp(cmd, "events") == 0 && nargs == 1) return do_events(&o, argv[optind]);
    if (strcmp(cmd, "checkpoints") == 0 && nargs == 1) return do_checkpoints(&o, argv[optind]);
    if (strcmp(cmd, "shell") == 0 && nargs == 1) {
        shell_opts so = {.url = o.url, .token = o.token, .team = o.team_hdr, .job = argv[optind],
                         .task = task_given ? task : NULL, .argc = cmd_argc, .argv = cmd_argv};
        return shell_run(&so);
    }
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
