/* upgrade.h - an HTTP/1.1 connection taken over after its answer (101
 * Switching Protocols: a WebSocket, the agent's exec stream). libcurl opens
 * it (CURLOPT_CONNECT_ONLY), so an https:// server is verified with the CA
 * the process trusts as every other request of client.h is; the request
 * line, the headers and every byte after are ours (curl_easy_send and
 * curl_easy_recv). Used by `trainyard shell` and the agent's exec relay.
 *
 * Reading: TLS may hold decrypted bytes that poll() on the socket does not
 * show, so a reader that stopped before client_conn_recv said "nothing now"
 * (-2) must call it again before it waits in poll().
 *
 * defines: client_conn, client_upgrade, client_conn_header, client_conn_send,
 *          client_conn_recv, client_conn_close */
#ifndef TRAINYARD_UPGRADE_H
#define TRAINYARD_UPGRADE_H

#include <sys/types.h>

#include "client.h"

typedef struct client_conn {
    void *curl;                  /* CURL*, connect-only */
    int fd;                      /* its socket, to poll (-1 none) */
    long status;                 /* the answer's status */
    buf head;                    /* the answer's status line and headers */
    buf body;                    /* a refusal's body (status other than 101; bounded) */
    buf extra;                   /* after a 101: the bytes read past the head (the new protocol's first) */
} client_conn;

/* Connects to c's server and sends `GET path HTTP/1.1` with Host,
 * Authorization (c->token, when set), Trainyard-Team (c->team, when set) and
 * the header lines of `headers` ("Name: value\r\n" each; NULL none), then
 * reads the answer's head (and, unless it is a 101, its body) within
 * timeout_ms. 0 with k->status set (any status; close k after), or -1 with
 * why in err (nothing left open). Over a URL list it starts at the one in
 * use and moves, once round, past a server that cannot be reached or that
 * answers 503 (a standby). */
int client_upgrade(const client *c, const char *path, const char *headers, long timeout_ms, client_conn *k,
                   char *err, size_t errlen);

/* The value of the answer's header name (case-insensitive, spaces trimmed)
 * into out: out, or NULL when it has none (or it does not fit). */
const char *client_conn_header(const client_conn *k, const char *name, char *out, size_t n);

/* Sends up to n bytes: the bytes taken (0: the socket is full now), -1 on
 * an error. */
ssize_t client_conn_send(client_conn *k, const void *p, size_t n);

/* Reads up to n bytes: the bytes read, 0 at the end of the stream, -2 when
 * nothing is there now, -1 on an error. */
ssize_t client_conn_recv(client_conn *k, void *p, size_t n);

void client_conn_close(client_conn *k);

#endif
