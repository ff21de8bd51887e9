/* scope.c - what a token may act for (see scope.h). */
#include "scope.h"

#include "../storage/store.h"

/* A node token acts for its own node only: 0, or -1 after answering 403. */
int api_node_scope(const http_req *req, http_res *res, int64_t node)
{
    if (req->who.kind == TOKEN_NODE && req->who.node_id != node) {
        http_error(res, 403, "forbidden", NULL, "the token of node %lld may not act for node %lld",
                   (long long)req->who.node_id, (long long)node);
        return -1;
    }
    return 0;
}

int api_own_or_admin(db *d, http_req *req, http_res *res, int sweep, int64_t id) {
    const principal *w = &req->who;
    if (w->kind == TOKEN_ADMIN) return 0;
    int64_t team = 0, user = 0;
    char name[64];
    int rc = store_owner(d, sweep, id, &team, &user, name);
    if (rc == STORE_OK && team != w->team_id) rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no %s %lld", sweep ? "sweep" : "job", (long long)id);
        return -1;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return -1;
    }
    if (w->role >= ROLE_ADMIN || (w->user_id > 0 && user == w->user_id)) return 0;
    http_error(res, 403, "forbidden", "role",
               "%s %s of another needs role admin in team %s; user %s is %s there and %s %lld is %s%s", req->method,
               req->route ? req->route->pattern : req->path, w->team, w->user, role_name(w->role),
               sweep ? "sweep" : "job", (long long)id, name[0] ? "user " : "the team's (service token or admin)",
               name);
    return -1;
}
