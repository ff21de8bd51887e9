/* ws.h - a small RFC 6455 (WebSocket) codec that both ends of a shell into
 * a task use (the CLI is a client end, the agent's exec relay the server
 * end): the handshake's Sec-WebSocket-Accept, a frame encoder, and an
 * incremental decoder over a byte buffer. No I/O here.
 *
 * The decoder takes the bytes read so far and hands back one message at a
 * time: a data message (text or binary) once all its fragments are in, or a
 * control frame (close, ping, pong), which may come between the fragments
 * of a data message. It refuses what RFC 6455 forbids, with the close code
 * to answer (1002 protocol error, 1007 a text message that is not UTF-8,
 * 1009 a frame or message over the decoder's bounds) and a one-line reason:
 * reserved bits or opcodes, a mask where none belongs or none where one
 * must be, a fragmented or over-125-byte control frame, a continuation with
 * no message begun, a new message inside one, a 64-bit length with its top
 * bit set, a close payload of 1 byte or with a code no endpoint may send.
 *
 * defines: ws_opcode, ws_accept_key, ws_key_new, ws_frame, ws_frame_key,
 *          ws_decoder, ws_msg, ws_decoder_init, ws_decoder_release, ws_decode,
 *          ws_utf8_valid */
#ifndef TRAINYARD_WS_H
#define TRAINYARD_WS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum ws_opcode { WS_CONT = 0x0, WS_TEXT = 0x1, WS_BINARY = 0x2, WS_CLOSE = 0x8, WS_PING = 0x9, WS_PONG = 0xA };

#define WS_HEAD_MAX 14           /* the longest frame header: 2 + 8 (length) + 4 (mask) */
#define WS_CONTROL_MAX 125       /* a control frame's most payload bytes */

/* The Sec-WebSocket-Accept answering key (a client's Sec-WebSocket-Key):
 * base64(SHA-1(key + the RFC's GUID)), 28 characters, into out. 0, or -1
 * when key is not 24 base64 characters (16 bytes) or the digest failed. */
int ws_accept_key(const char *key, char out[29]);

/* A fresh Sec-WebSocket-Key (16 random bytes, base64) into out. 0 or -1. */
int ws_key_new(char out[25]);

/* Appends one final frame (FIN set) with opcode and payload p (n bytes) to
 * b: masked with a fresh random key when masked (a client's frames),
 * unmasked otherwise (a server's). The length takes 7, 16 or 64 bits as n
 * needs. 0, or -1 when b cannot take it (b unchanged) or a control frame's
 * payload is over 125 bytes. */
int ws_frame(buf *b, int opcode, const void *p, size_t n, int masked);

/* The same with fin and the mask key given (NULL: unmasked): fragments,
 * and frames a test knows byte for byte. */
int ws_frame_key(buf *b, int fin, int opcode, const void *p, size_t n, const uint8_t *mask);

typedef struct ws_decoder {
    int masked;                  /* 1: the peer is a client, its frames must be masked (the
                                  * server end); 0: they must not be (the client end) */
    size_t frame_max;            /* a frame's most payload bytes */
    size_t msg_max;              /* a data message's most bytes, its fragments together */
    int msg_op;                  /* WS_TEXT or WS_BINARY while fragments are gathered, else 0 */
    buf msg;                     /* the fragments so far */
    int close_code;              /* after an error: the code to close with (1002, 1007, 1009) */
    char err[160];               /* after an error: why */
} ws_decoder;

typedef struct ws_msg {
    int opcode;                  /* WS_TEXT, WS_BINARY, WS_CLOSE, WS_PING or WS_PONG */
    uint8_t *data;               /* the payload, unmasked: into the input or the decoder's
                                  * buffer, valid until the next ws_decode */
    size_t len;
    int close_code;              /* WS_CLOSE: its code, 1005 when it carried none */
} ws_msg;

/* masked: whether the peer's frames must be masked (see ws_decoder). */
void ws_decoder_init(ws_decoder *d, int masked, size_t frame_max, size_t msg_max);
void ws_decoder_release(ws_decoder *d);

/* Decodes from in (len bytes, unmasked in place) at most one frame:
 * 1: a message is in *m; 0: nothing yet (a whole frame is not in, or it was
 * a fragment: gathered); -1: a protocol violation (d->err, d->close_code;
 * the connection is to be closed, nothing more is decoded; *used 0). *used: the
 * bytes of in that were taken (the caller drops them) - call again while it
 * is non-zero. */
int ws_decode(ws_decoder *d, uint8_t *in, size_t len, size_t *used, ws_msg *m);

/* 1 when s (n bytes) is well-formed UTF-8 (no overlongs, no surrogates,
 * nothing past U+10FFFF). */
int ws_utf8_valid(const uint8_t *s, size_t n);

#endif
