/* fuzz_http_route.c - libFuzzer target for server/http.c's pure request
 * handling, reached by #including http.c (its helpers are static): the
 * strict %-decoder MHD calls for the path and query (unescape_strict), the
 * control-character check, the Content-Type test, route matching and {x}
 * capture against every API route table on the decoded path, the 405 Allow
 * list, id parsing (http_param_id), body parsing (http_body_json) and the
 * JSON error replies that echo the method and path. Splitting the query
 * string is libmicrohttpd's: fuzz_http_server covers it.
 * Input: "METHOD PATH\nBODY". Invariants: the decoder never grows its input
 * and either flags it or leaves no control character; a match rebuilds the
 * path from its pattern and captures; every reply body is valid JSON.
 * docs/reliability.md, "Fuzzing". */
#include "server/http.c"

#include "api/routes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reply must be one JSON object ending in a newline. */
static void check_reply(http_res *res) {
    if (!res->body || res->len == 0 || res->body[res->len - 1] != '\n') abort();
    cJSON *v = cJSON_ParseWithLength(res->body, res->len);
    if (!cJSON_IsObject(v)) {
        fprintf(stderr, "reply is not a JSON object: %.*s\n", (int)res->len, res->body);
        abort();
    }
    cJSON_Delete(v);
    free(res->body);
    memset(res, 0, sizeof *res);
    res->fd = -1;
}

/* pattern + captures must give back path. */
static void check_rebuild(const route *r, const http_req *req, const char *path) {
    char out[8192];
    size_t o = 0;
    int k = 0;
    for (const char *p = r->pattern; *p;) {
        if (*p == '{') {
            const char *e = strchr(p, '}');
            if (!e || k >= req->nparams) abort();
            size_t n = strlen(req->params[k]);
            if (n == 0 || n >= HTTP_PARAM_MAX || memchr(req->params[k], '/', n) || o + n >= sizeof out) abort();
            memcpy(out + o, req->params[k++], n);
            o += n;
            p = e + 1;
        } else {
            if (o + 1 >= sizeof out) abort();
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    if (k != req->nparams || strcmp(out, path) != 0) {
        fprintf(stderr, "route %s %s matched '%s' but rebuilds '%s'\n", r->method, r->pattern, path, out);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t line = nl ? (size_t)(nl - data) : size;
    if (line > 4096) return 0;
    char head[4097];
    memcpy(head, data, line);
    head[line] = '\0';
    char method[16] = "GET";
    const char *path = head;
    char *sp = strchr(head, ' ');
    if (sp && sp - head < (long)sizeof method) {
        memcpy(method, head, (size_t)(sp - head));
        method[sp - head] = '\0';
        path = sp + 1;
    }
    const uint8_t *body = nl ? nl + 1 : data + size;
    size_t blen = (size_t)(data + size - body);

    /* %-decoding as MHD does it with our callback, then the checks on_request makes */
    (void)json_content_type(path);
    size_t raw = strlen(path);
    char *dec = head + (path - head); /* in place, as MHD decodes its own copy */
    size_t dn = unescape_strict(NULL, NULL, dec);
    if (dn > raw || dec[dn] != '\0') abort();
    int flagged = dn > 0 && dec[0] == '\x01';
    if (!flagged)
        for (size_t i = 0; i < dn; i++)
            if ((unsigned char)dec[i] < 0x20 || dec[i] == 0x7f) abort();
    if (has_ctl(dec, dn)) {
        if (!flagged && dn) abort();
        return 0; /* request_check answers 400 */
    }

    http_req *req = calloc(1, sizeof *req);
    if (!req) abort();
    req->method = method;
    req->path = path;
    http_res res;
    res_init(&res);
    int known = 0, slot = -1;
    const route *r = route_find(api_route_tables, method, path, req, &known, &slot);
    if (r) {
        if (!known || slot < 0 || strcmp(r->method, method) != 0) abort();
        check_rebuild(r, req, path);
        for (int i = 0; i <= req->nparams; i++) {
            int64_t id = http_param_id(req, &res, i, "thing");
            if (id < 0) check_reply(&res);
        }
        req->route = r;
        buf_init(&req->body, r->max_body ? r->max_body : HTTP_BODY_DEFAULT);
        if (buf_append(&req->body, body, blen) == 0) {
            cJSON *v = http_body_json(req, &res);
            if (v) {
                if (!cJSON_IsObject(v)) abort();
                http_json(&res, 200, v);
            }
            check_reply(&res);
        }
        buf_release(&req->body);
    } else if (known) {
        char allow[128];
        allowed_methods(api_route_tables, path, allow, sizeof allow);
        if (!allow[0]) abort();
        http_error(&res, 405, "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)", method, path,
                   allow);
        check_reply(&res);
    } else {
        http_error(&res, 404, "not_found", NULL, "no such endpoint: %s %s", method, path);
        check_reply(&res);
    }
    char actor[64];
    http_actor(req, actor, sizeof actor);
    res_release(&res);
    free(req);
    return 0;
}
