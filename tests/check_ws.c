/* check_ws.c - tests for common/ws (the WebSocket codec of shells into
 * tasks): the handshake's accept key (RFC 6455's own example), frames
 * encoded byte for byte (RFC 6455 5.7's examples; 7-, 16- and 64-bit
 * lengths; masked and not), the decoder fed whole, byte by byte and in odd
 * chunks (fragments with control frames between them, payloads unmasked),
 * its bounds (frame, message) and each protocol violation it refuses with
 * the close code to answer. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../common/ws.h"

START_TEST(accept_key_of_the_rfc) {
    char out[29];
    ck_assert_int_eq(ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out), 0);
    ck_assert_str_eq(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    /* not 16 bytes of base64 */
    ck_assert_int_eq(ws_accept_key("dGhlIHNhbXBsZSBub25jZQ=", out), -1);
    ck_assert_int_eq(ws_accept_key("dGhlIHNhbXBsZSBub25jZQ=x", out), -1);
    ck_assert_int_eq(ws_accept_key("dGhlIHNhbXBsZSBub2*jZQ==", out), -1);
    ck_assert_int_eq(ws_accept_key("", out), -1);
    char k1[25], k2[25];
    ck_assert_int_eq(ws_key_new(k1), 0);
    ck_assert_int_eq(ws_key_new(k2), 0);
    ck_assert_int_eq((int)strlen(k1), 24);
    ck_assert_str_ne(k1, k2);
    ck_assert_int_eq(ws_accept_key(k1, out), 0); /* a key of ours is one a server takes */
}
END_TEST

static void expect_bytes(const buf *b, const uint8_t *want, size_t n) {
    ck_assert_uint_eq(b->len, n);
    ck_assert_msg(memcmp(b->data, want, n) == 0, "frame bytes differ");
}

START_TEST(encode_rfc_examples) {
    buf b;
    buf_init(&b, 1 << 20);
    /* a single-frame unmasked text message */
    static const uint8_t hello[] = {0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_TEXT, "Hello", 5, NULL), 0);
    expect_bytes(&b, hello, sizeof hello);
    /* a single-frame masked text message */
    buf_reset(&b);
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    static const uint8_t hello_m[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_TEXT, "Hello", 5, key), 0);
    expect_bytes(&b, hello_m, sizeof hello_m);
    /* a fragmented unmasked text message */
    buf_reset(&b);
    static const uint8_t frag[] = {0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f};
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_TEXT, "Hel", 3, NULL), 0);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CONT, "lo", 2, NULL), 0);
    expect_bytes(&b, frag, sizeof frag);
    /* unmasked ping */
    buf_reset(&b);
    static const uint8_t ping[] = {0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    ck_assert_int_eq(ws_frame(&b, WS_PING, "Hello", 5, 0), 0);
    expect_bytes(&b, ping, sizeof ping);
    /* 256 bytes binary: a 16-bit length; 64 KiB: a 64-bit length */
    uint8_t *big = xcalloc(65536, 1);
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_BINARY, big, 256, 0), 0);
    static const uint8_t h256[] = {0x82, 0x7E, 0x01, 0x00};
    ck_assert_uint_eq(b.len, 4 + 256);
    ck_assert(memcmp(b.data, h256, 4) == 0);
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_BINARY, big, 65536, 0), 0);
    static const uint8_t h64k[] = {0x82, 0x7F, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00};
    ck_assert_uint_eq(b.len, 10 + 65536);
    ck_assert(memcmp(b.data, h64k, 10) == 0);
    /* the edges: 125 (7 bits), 126 and 65535 (16 bits) */
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_BINARY, big, 125, 0), 0);
    ck_assert_uint_eq(b.len, 2 + 125);
    ck_assert_uint_eq((uint8_t)b.data[1], 125);
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_BINARY, big, 126, 0), 0);
    ck_assert_uint_eq(b.len, 4 + 126);
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_BINARY, big, 65535, 1), 0); /* masked: 4 more */
    ck_assert_uint_eq(b.len, 4 + 4 + 65535);
    ck_assert_uint_eq((uint8_t)b.data[1], 0x80 | 126);
    /* a control frame over 125 bytes, or fragmented, is not made */
    buf_reset(&b);
    ck_assert_int_eq(ws_frame(&b, WS_PING, big, 126, 0), -1);
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_CLOSE, "\x03\xe8", 2, NULL), -1);
    ck_assert_uint_eq(b.len, 0);
    /* a buffer that cannot take it is left as it was */
    buf small;
    buf_init(&small, 100);
    ck_assert_int_eq(ws_frame(&small, WS_TEXT, "ab", 2, 0), 0);
    ck_assert_int_eq(ws_frame(&small, WS_BINARY, big, 97, 0), -1);
    ck_assert_uint_eq(small.len, 4);
    buf_release(&small);
    free(big);
    buf_release(&b);
}
END_TEST

/* Feeds in (len bytes) to d in pieces of `chunk` bytes, as a reader that
 * keeps what is not decoded yet would; the messages go to out as
 * "op:payload;" (close: "8:CODE;"). Returns the last ws_decode result that
 * ended it: 0 (all taken) or -1. */
static int feed(ws_decoder *d, const uint8_t *in, size_t len, size_t chunk, buf *out) {
    buf pend;
    buf_init(&pend, 1 << 24);
    size_t off = 0;
    int rc = 0;
    while (off < len && rc >= 0) {
        size_t k = len - off < chunk ? len - off : chunk;
        ck_assert_int_eq(buf_append(&pend, in + off, k), 0);
        off += k;
        size_t at = 0;
        for (;;) {
            size_t used = 0;
            ws_msg m;
            rc = ws_decode(d, (uint8_t *)pend.data + at, pend.len - at, &used, &m);
            at += used;
            if (rc < 0) break;
            if (rc == 1) {
                if (m.opcode == WS_CLOSE) buf_printf(out, "8:%d;", m.close_code);
                else {
                    buf_printf(out, "%d:", m.opcode);
                    buf_append(out, m.data, m.len);
                    buf_appends(out, ";");
                }
            }
            if (!used) break;
        }
        memmove(pend.data, pend.data + at, pend.len - at);
        pend.len -= at;
        if (rc > 0) rc = 0;
    }
    if (rc == 0) ck_assert_msg(pend.len == 0, "%zu bytes left undecoded", pend.len);
    buf_release(&pend);
    return rc;
}

START_TEST(decode_in_any_chunks) {
    /* a client's stream (masked): text, a fragmented binary with a ping and
     * a pong between the fragments, an empty binary, a 70000-byte binary
     * (64-bit length), a close with code and reason */
    buf s;
    buf_init(&s, 1 << 20);
    ck_assert_int_eq(ws_frame(&s, WS_TEXT, "ls -l\n", 6, 1), 0);
    ck_assert_int_eq(ws_frame_key(&s, 0, WS_BINARY, "\x00" "ab", 3, (const uint8_t *)"k3y!"), 0);
    ck_assert_int_eq(ws_frame(&s, WS_PING, "p1", 2, 1), 0);
    ck_assert_int_eq(ws_frame_key(&s, 0, WS_CONT, "cd", 2, (const uint8_t *)"\x01\x02\x03\x04"), 0);
    ck_assert_int_eq(ws_frame(&s, WS_PONG, "", 0, 1), 0);
    ck_assert_int_eq(ws_frame_key(&s, 1, WS_CONT, "ef", 2, (const uint8_t *)"\xff\xfe\xfd\xfc"), 0);
    ck_assert_int_eq(ws_frame(&s, WS_BINARY, "", 0, 1), 0);
    char *big = xmalloc(70000);
    for (int i = 0; i < 70000; i++) big[i] = (char)('a' + i % 26);
    ck_assert_int_eq(ws_frame(&s, WS_BINARY, big, 70000, 1), 0);
    ck_assert_int_eq(ws_frame(&s, WS_CLOSE, "\x03\xe8" "bye", 5, 1), 0);
    buf want;
    buf_init(&want, 1 << 20);
    buf_appends(&want, "1:ls -l\n;9:p1;10:;2:");
    buf_append(&want, "\x00" "abcdef;2:;2:", 13);
    buf_append(&want, big, 70000);
    buf_appends(&want, ";8:1000;");
    static const size_t chunks[] = {1, 2, 3, 7, 13, 125, 4096, 1 << 20};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        uint8_t *copy = xmalloc(s.len); /* the decoder unmasks in place */
        memcpy(copy, s.data, s.len);
        ws_decoder d;
        ws_decoder_init(&d, 1, 1 << 17, 1 << 17);
        buf out;
        buf_init(&out, 1 << 20);
        ck_assert_int_eq(feed(&d, copy, s.len, chunks[c], &out), 0);
        ck_assert_msg(out.len == want.len && memcmp(out.data, want.data, want.len) == 0,
                      "chunks of %zu: got %.200s", chunks[c], out.data);
        buf_release(&out);
        ws_decoder_release(&d);
        free(copy);
    }
    /* a server's stream (unmasked) to a client end: status on channel 3 */
    buf srv;
    buf_init(&srv, 4096);
    ck_assert_int_eq(ws_frame(&srv, WS_BINARY, "\x03{\"exit\":3}", 11, 0), 0);
    ck_assert_int_eq(ws_frame(&srv, WS_CLOSE, "\x03\xe8", 2, 0), 0);
    ws_decoder d;
    ws_decoder_init(&d, 0, 1 << 16, 1 << 16);
    buf out;
    buf_init(&out, 4096);
    ck_assert_int_eq(feed(&d, (uint8_t *)srv.data, srv.len, 5, &out), 0);
    ck_assert_int_eq((int)out.len, 2 + 11 + 1 + 7);
    ck_assert(memcmp(out.data, "2:\x03{\"exit\":3};8:1000;", out.len) == 0);
    buf_release(&out);
    ws_decoder_release(&d);
    buf_release(&srv);
    free(big);
    buf_release(&want);
    buf_release(&s);
}
END_TEST

/* The raw frame bytes r (n) decoded by a decoder for masked (client)
 * frames when masked: -1 expected, with code. */
static void expect_violation(const uint8_t *r, size_t n, int masked, int code, const char *needle) {
    uint8_t *copy = xmalloc(n);
    memcpy(copy, r, n);
    ws_decoder d;
    ws_decoder_init(&d, masked, 1024, 2048);
    buf out;
    buf_init(&out, 4096);
    int rc = feed(&d, copy, n, n, &out);
    ck_assert_msg(rc == -1, "accepted: %.100s", out.data ? out.data : "");
    ck_assert_int_eq(d.close_code, code);
    ck_assert_msg(strstr(d.err, needle) != NULL, "error '%s' lacks '%s'", d.err, needle);
    /* after a violation nothing more is decoded */
    size_t used = 1;
    ws_msg m;
    uint8_t ok[] = {0x82, 0x80, 0, 0, 0, 0};
    ck_assert_int_eq(ws_decode(&d, ok, sizeof ok, &used, &m), -1);
    ck_assert_uint_eq(used, 0);
    buf_release(&out);
    ws_decoder_release(&d);
    free(copy);
}

START_TEST(violations_are_refused) {
    /* reserved bits, reserved opcodes */
    expect_violation((const uint8_t *)"\xc2\x80\0\0\0\0", 6, 1, 1002, "reserved bits");
    expect_violation((const uint8_t *)"\x83\x80\0\0\0\0", 6, 1, 1002, "reserved opcode");
    expect_violation((const uint8_t *)"\x8b\x80\0\0\0\0", 6, 1, 1002, "reserved opcode");
    /* masks: a client's frame must be masked, a server's must not */
    expect_violation((const uint8_t *)"\x82\x01x", 3, 1, 1002, "unmasked");
    expect_violation((const uint8_t *)"\x82\x81\0\0\0\0x", 7, 0, 1002, "masked frame from a server");
    /* control frames: fragmented, or over 125 bytes */
    expect_violation((const uint8_t *)"\x09\x80\0\0\0\0", 6, 1, 1002, "fragmented control");
    expect_violation((const uint8_t *)"\x89\xfe\x00\x7e", 4, 1, 1002, "over 125");
    /* continuation without a message; a new message inside one */
    expect_violation((const uint8_t *)"\x80\x80\0\0\0\0", 6, 1, 1002, "no message begun");
    expect_violation((const uint8_t *)"\x02\x80\0\0\0\0\x82\x80\0\0\0\0", 12, 1, 1002, "inside a fragmented");
    /* a 64-bit length with its top bit set */
    expect_violation((const uint8_t *)"\x82\xff\x80\0\0\0\0\0\0\0", 10, 1, 1002, "top bit");
    /* bounds: a frame over 1024, fragments over 2048 together */
    expect_violation((const uint8_t *)"\x82\xfe\x04\x01", 4, 1, 1009, "frame over");
    buf b;
    buf_init(&b, 1 << 16);
    char kb[1000];
    memset(kb, 'x', sizeof kb);
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_BINARY, kb, 1000, (const uint8_t *)"abcd"), 0);
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_CONT, kb, 1000, (const uint8_t *)"abcd"), 0);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CONT, kb, 1000, (const uint8_t *)"abcd"), 0);
    expect_violation((const uint8_t *)b.data, b.len, 1, 1009, "message over");
    /* close: a 1-byte payload, a code nobody sends, a reason not UTF-8 */
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CLOSE, "\x03", 1, (const uint8_t *)"abcd"), 0);
    expect_violation((const uint8_t *)b.data, b.len, 1, 1002, "1-byte");
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CLOSE, "\x03\xed", 2, (const uint8_t *)"abcd"), 0); /* 1005 */
    expect_violation((const uint8_t *)b.data, b.len, 1, 1002, "code no endpoint");
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CLOSE, "\x03\xe8\xff", 3, (const uint8_t *)"abcd"), 0);
    expect_violation((const uint8_t *)b.data, b.len, 1, 1007, "not UTF-8");
    /* a text message that is not UTF-8: whole, and across fragments */
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_TEXT, "\xc0\xaf", 2, (const uint8_t *)"abcd"), 0);
    expect_violation((const uint8_t *)b.data, b.len, 1, 1007, "not UTF-8");
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_TEXT, "\xe2\x82", 2, (const uint8_t *)"abcd"), 0);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CONT, "\x41", 1, (const uint8_t *)"abcd"), 0);
    expect_violation((const uint8_t *)b.data, b.len, 1, 1007, "not UTF-8");
    /* ... while a code point split over fragments is fine */
    buf_reset(&b);
    ck_assert_int_eq(ws_frame_key(&b, 0, WS_TEXT, "\xe2\x82", 2, (const uint8_t *)"abcd"), 0);
    ck_assert_int_eq(ws_frame_key(&b, 1, WS_CONT, "\xac", 1, (const uint8_t *)"abcd"), 0);
    ws_decoder d;
    ws_decoder_init(&d, 1, 1024, 2048);
    buf out;
    buf_init(&out, 4096);
    ck_assert_int_eq(feed(&d, (uint8_t *)b.data, b.len, 1, &out), 0);
    ck_assert_str_eq(out.data, "1:\xe2\x82\xac;");
    /* a close without a code reads as 1005 */
    buf_reset(&b);
    buf_reset(&out);
    ck_assert_int_eq(ws_frame(&b, WS_CLOSE, "", 0, 1), 0);
    ck_assert_int_eq(feed(&d, (uint8_t *)b.data, b.len, 1, &out), 0);
    ck_assert_str_eq(out.data, "8:1005;");
    buf_release(&out);
    ws_decoder_release(&d);
    buf_release(&b);
}
END_TEST

START_TEST(utf8) {
    ck_assert(ws_utf8_valid((const uint8_t *)"", 0));
    ck_assert(ws_utf8_valid((const uint8_t *)"plain", 5));
    ck_assert(ws_utf8_valid((const uint8_t *)"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
    ck_assert(!ws_utf8_valid((const uint8_t *)"\x80", 1));             /* a lone continuation */
    ck_assert(!ws_utf8_valid((const uint8_t *)"\xc3", 1));             /* cut short */
    ck_assert(!ws_utf8_valid((const uint8_t *)"\xe0\x80\xaf", 3));     /* overlong */
    ck_assert(!ws_utf8_valid((const uint8_t *)"\xed\xa0\x80", 3));     /* a surrogate */
    ck_assert(!ws_utf8_valid((const uint8_t *)"\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
    ck_assert(!ws_utf8_valid((const uint8_t *)"\xff", 1));
}
END_TEST

int main(void) {
    Suite *s = suite_create("ws");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, accept_key_of_the_rfc);
    tcase_add_test(tc, encode_rfc_examples);
    tcase_add_test(tc, decode_in_any_chunks);
    tcase_add_test(tc, violations_are_refused);
    tcase_add_test(tc, utf8);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
