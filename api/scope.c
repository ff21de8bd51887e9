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
