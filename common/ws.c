/* ws.c - the RFC 6455 (WebSocket) codec (see ws.h): SHA-1 and base64 from
 * OpenSSL, which the tree links already. */
#include "ws.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/evp.h>

static const char WS_GUID[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

static int is_b64(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

int ws_accept_key(const char *key, char out[29]) {
    out[0] = '\0';
    /* 16 bytes in base64: 22 characters and "==" */
    if (strlen(key) != 24 || key[22] != '=' || key[23] != '=') return -1;
    for (int i = 0; i < 22; i++)
        if (!is_b64(key[i])) return -1;
    char in[24 + sizeof WS_GUID];
    memcpy(in, key, 24);
    memcpy(in + 24, WS_GUID, sizeof WS_GUID - 1);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(in, 24 + sizeof WS_GUID - 1, md, &mdlen, EVP_sha1(), NULL) || mdlen != 20) return -1;
    /* 20 bytes: 28 characters and the NUL */
    if (EVP_EncodeBlock((unsigned char *)out, md, 20) != 28) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

int ws_key_new(char out[25]) {
    unsigned char raw[16];
    out[0] = '\0';
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return -1;
    if (EVP_EncodeBlock((unsigned char *)out, raw, sizeof raw) != 24) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

int ws_frame_key(buf *b, int fin, int opcode, const void *p, size_t n, const uint8_t *mask) {
    if ((opcode & 0x8) && (n > WS_CONTROL_MAX || !fin)) return -1;
    uint8_t h[WS_HEAD_MAX];
    size_t k = 0;
    h[k++] = (uint8_t)((fin ? 0x80 : 0) | (opcode & 0x0F));
    uint8_t mbit = mask ? 0x80 : 0;
    if (n < 126) {
        h[k++] = (uint8_t)(mbit | n);
    } else if (n <= 0xFFFF) {
        h[k++] = (uint8_t)(mbit | 126);
        h[k++] = (uint8_t)(n >> 8);
        h[k++] = (uint8_t)n;
    } else {
        h[k++] = (uint8_t)(mbit | 127);
        for (int i = 7; i >= 0; i--) h[k++] = (uint8_t)((uint64_t)n >> (8 * i));
    }
    if (mask) {
        memcpy(h + k, mask, 4);
        k += 4;
    }
    if (n > SIZE_MAX - k - 1 || b->len + k + n > b->max) return -1;
    size_t at = b->len;
    if (buf_append(b, h, k) < 0) return -1;
    if (n && buf_append(b, p, n) < 0) {
        b->len = at;
        b->data[at] = '\0';
        return -1;
    }
    if (mask) {
        uint8_t *q = (uint8_t *)b->data + at + k;
        for (size_t i = 0; i < n; i++) q[i] ^= mask[i & 3];
    }
    return 0;
}

int ws_frame(buf *b, int opcode, const void *p, size_t n, int masked) {
    uint8_t key[4];
    if (masked && getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) return -1;
    return ws_frame_key(b, 1, opcode, p, n, masked ? key : NULL);
}

void ws_decoder_init(ws_decoder *d, int masked, size_t frame_max, size_t msg_max) {
    memset(d, 0, sizeof *d);
    d->masked = masked;
    d->frame_max = frame_max;
    d->msg_max = msg_max;
    buf_init(&d->msg, msg_max);
}

void ws_decoder_release(ws_decoder *d) { buf_release(&d->msg); }

int ws_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) need = 1, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) need = 2, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) need = 3, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (n - i - 1 < need) return 0;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

static int fail(ws_decoder *d, int code, const char *why) {
    d->close_code = code;
    snprintf(d->err, sizeof d->err, "%s", why);
    return -1;
}

/* A close code an endpoint may send (RFC 6455 7.4.1, 7.4.2). */
static int close_code_ok(int c) {
    return (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1011) || (c >= 3000 && c <= 4999);
}

int ws_decode(ws_decoder *d, uint8_t *in, size_t len, size_t *used, ws_msg *m) {
    *used = 0;
    memset(m, 0, sizeof *m);
    if (d->close_code) return -1; /* a violation ends the stream */
    if (len < 2) return 0;
    int fin = in[0] & 0x80, op = in[0] & 0x0F, mbit = in[1] & 0x80;
    if (in[0] & 0x70) return fail(d, 1002, "a frame with reserved bits set (no extension was agreed)");
    if (!(op <= WS_BINARY || (op >= WS_CLOSE && op <= WS_PONG))) return fail(d, 1002, "a frame with a reserved opcode");
    if (d->masked && !mbit) return fail(d, 1002, "an unmasked frame from a client");
    if (!d->masked && mbit) return fail(d, 1002, "a masked frame from a server");
    size_t k = 2;
    uint64_t n = in[1] & 0x7F;
    if (n == 126) {
        if (len < 4) return 0;
        n = ((uint64_t)in[2] << 8) | in[3];
        k = 4;
    } else if (n == 127) {
        if (len < 10) return 0;
        if (in[2] & 0x80) return fail(d, 1002, "a 64-bit frame length with its top bit set");
        n = 0;
        for (int i = 0; i < 8; i++) n = (n << 8) | in[2 + i];
        k = 10;
    }
    if (op & 0x8) {
        if (!fin) return fail(d, 1002, "a fragmented control frame");
        if (n > WS_CONTROL_MAX) return fail(d, 1002, "a control frame over 125 bytes");
    }
    if (n > d->frame_max) return fail(d, 1009, "a frame over the largest size taken");
    const uint8_t *key = NULL;
    if (mbit) {
        if (len < k + 4) return 0;
        key = in + k;
        k += 4;
    }
    if (len - k < n) return 0; /* the payload is not all in */
    uint8_t *p = in + k;
    for (size_t i = 0; key && i < n; i++) p[i] ^= key[i & 3];
    size_t total = k + (size_t)n; /* taken once it decodes: a refusal takes nothing */

    if (op & 0x8) {
        m->opcode = op;
        m->data = p;
        m->len = (size_t)n;
        if (op == WS_CLOSE) {
            if (n == 1) return fail(d, 1002, "a close frame with a 1-byte payload");
            m->close_code = 1005;
            if (n >= 2) {
                m->close_code = (p[0] << 8) | p[1];
                if (!close_code_ok(m->close_code)) return fail(d, 1002, "a close frame with a code no endpoint sends");
                if (!ws_utf8_valid(p + 2, (size_t)n - 2)) return fail(d, 1007, "a close reason that is not UTF-8");
            }
        }
        *used = total;
        return 1;
    }
    if (op == WS_CONT) {
        if (!d->msg_op) return fail(d, 1002, "a continuation frame with no message begun");
    } else {
        if (d->msg_op) return fail(d, 1002, "a new message inside a fragmented one");
        if (fin) { /* the common case: a whole message in one frame, no copy */
            if (n > d->msg_max) return fail(d, 1009, "a message over the largest size taken");
            if (op == WS_TEXT && !ws_utf8_valid(p, (size_t)n)) return fail(d, 1007, "a text message that is not UTF-8");
            m->opcode = op;
            m->data = p;
            m->len = (size_t)n;
            *used = total;
            return 1;
        }
        d->msg_op = op;
        buf_reset(&d->msg);
    }
    if (buf_append(&d->msg, p, (size_t)n) < 0) return fail(d, 1009, "a message over the largest size taken");
    *used = total;
    if (!fin) return 0;
    if (d->msg_op == WS_TEXT && !ws_utf8_valid((const uint8_t *)d->msg.data, d->msg.len)) {
        *used = 0;
        return fail(d, 1007, "a text message that is not UTF-8");
    }
    m->opcode = d->msg_op;
    m->data = (uint8_t *)d->msg.data;
    m->len = d->msg.len;
    d->msg_op = 0;
    return 1;
}
