/* web_api.c - GET /api/v1/openapi.json and GET /api/v1/examples, from the
 * files compiled into the binary (server/static.h). tests/check_openapi.c
 * checks that the document and the route tables name the same routes. */
#include "web_api.h"
#include "../server/assets.h"
#include "../server/static.h"

#include <string.h>

/* GET /api/v1/openapi.json */
static void openapi_get(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    (void)req;
    const static_file *f = static_asset("api/openapi.json");
    if (!f) {
        http_error(res, 404, "not_found", NULL, "this build has no OpenAPI document");
        return;
    }
    http_text(res, 200, "application/json", (const char *)f->data, f->len);
}

/* GET /api/v1/examples: {"examples": [{"file": "x.json", "spec": {...}}]} */
static void examples_get(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    (void)req;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "examples");
    for (size_t i = 0; i < embed_assets_count; i++) {
        const embed_asset *a = &embed_assets[i];
        if (strncmp(a->path, "examples/", 9) != 0) continue;
        size_t n = strlen(a->path);
        if (n < 5 || strcmp(a->path + n - 5, ".json") != 0) continue;
        cJSON *spec = cJSON_ParseWithLength((const char *)a->data, a->len);
        if (!spec) continue; /* not JSON: not an example one can submit */
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", a->path + 9);
        cJSON_AddItemToObject(e, "spec", spec);
        cJSON_AddItemToArray(arr, e);
    }
    http_json(res, 200, o);
}

const route api_web_routes[] = {
    {"GET", "/api/v1/openapi.json", openapi_get, ALLOW_NONE, 0, ROLE_NONE},
    {"GET", "/api/v1/examples", examples_get, ALLOW_USER, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
