/* fuzz_ws.c - libFuzzer target for common/ws.c (ws_decode), the decoder of
 * the WebSocket stream a shell into a task reads from the network (the
 * agent's relay: a client's masked frames; the CLI: the server's unmasked
 * ones). The first byte picks the end (bit 0: masked frames expected) and
 * the size of the pieces the rest is fed in (1 to 128 bytes, or all at
 * once), as a reader keeping the undecoded tail would. Every message must
 * fit the bounds, a control frame 125 bytes, a text message be UTF-8; each
 * is encoded again and must decode to itself; a refusal must carry a close
 * code and a reason. docs/reliability.md, "Fuzzing". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "common/ws.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FRAME_MAX 4096
#define MSG_MAX 8192

/* m encoded again as the other end would send it decodes to m. */
static void round_trip(const ws_msg *m, int masked) {
    buf b;
    buf_init(&b, MSG_MAX + WS_HEAD_MAX);
    const uint8_t *p = m->data;
    size_t n = m->len;
    if (ws_frame(&b, m->opcode, p, n, masked) < 0) abort();
    ws_decoder d;
    ws_decoder_init(&d, masked, MSG_MAX, MSG_MAX);
    size_t used = 0;
    ws_msg back;
    if (ws_decode(&d, (uint8_t *)b.data, b.len, &used, &back) != 1 || used != b.len) abort();
    if (back.opcode != m->opcode || back.len != n || (n && memcmp(back.data, p, n) != 0)) abort();
    ws_decoder_release(&d);
    buf_release(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int masked = data[0] & 1;
    size_t chunk = (size_t)(data[0] >> 1) + 1; /* 1..128; 128: all at once */
    if (chunk == 128) chunk = size;
    ws_decoder d;
    ws_decoder_init(&d, masked, FRAME_MAX, MSG_MAX);
    buf pend;
    buf_init(&pend, 1u << 24);
    size_t off = 1;
    int rc = 0;
    while (off < size && rc >= 0) {
        size_t k = size - off < chunk ? size - off : chunk;
        if (buf_append(&pend, data + off, k) < 0) abort();
        off += k;
        size_t at = 0;
        for (;;) {
            size_t used = 0;
            ws_msg m;
            rc = ws_decode(&d, (uint8_t *)pend.data + at, pend.len - at, &used, &m);
            if (used > pend.len - at) abort();
            at += used;
            if (rc < 0) {
                if (used || !d.err[0] || (d.close_code != 1002 && d.close_code != 1007 && d.close_code != 1009))
                    abort();
                break;
            }
            if (rc == 1) {
                if (m.len > MSG_MAX || (m.len && !m.data)) abort();
                if ((m.opcode & 0x8) && m.len > WS_CONTROL_MAX) abort();
                if (m.opcode == WS_TEXT && !ws_utf8_valid(m.data, m.len)) abort();
                if (m.opcode != WS_CLOSE && m.opcode != WS_TEXT && m.opcode != WS_BINARY && m.opcode != WS_PING &&
                    m.opcode != WS_PONG)
                    abort();
                round_trip(&m, !masked);
            }
            if (!used) break;
        }
        if (at) {
            memmove(pend.data, pend.data + at, pend.len - at);
            pend.len -= at;
        }
        /* what waits undecoded is never more than one frame */
        if (rc >= 0 && pend.len > FRAME_MAX + WS_HEAD_MAX) abort();
    }
    buf_release(&pend);
    ws_decoder_release(&d);
    return 0;
}
