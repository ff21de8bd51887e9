/* fuzz_ctxtar.c - libFuzzer target for common/ctxtar.c (ctx_check), what the
 * server runs on every uploaded context. The first byte picks the form: odd,
 * the rest is taken as the upload itself (a gzip'd tar, as a client sends
 * it); even, the rest is gzip-compressed here first, so the fuzzer reaches
 * the tar headers, names and links rather than spending its time on gzip's
 * checksums. Small limits keep each run short; an accepted archive must
 * report counts within them. Seeds: tests/fuzz/corpus/ctxtar (valid and
 * hostile archives, raw-form). docs/reliability.md, "Fuzzing". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/ctxtar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* gzip of in (a gzip header, so ctx_check's magic check passes), or NULL. */
static unsigned char *gzip_of(const uint8_t *in, size_t n, size_t *out_len) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    unsigned char *out = malloc(cap);
    if (!out) abort();
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    ctx_limits lim = {.max_files = 2000, .max_unpacked = 8 << 20};
    ctx_info info;
    char err[512];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    unsigned char *z = NULL;
    if (!(data[0] & 1)) {
        z = gzip_of(p, n, &n);
        if (!z) return 0;
        p = z;
    }
    err[0] = '\0';
    int rc = ctx_check(p, n, &lim, &info, err, sizeof err);
    if (rc == 0) {
        if (info.entries > lim.max_files || info.files > info.entries || info.unpacked > lim.max_unpacked ||
            info.unpacked < 0 || info.packed != (int64_t)n) {
            fprintf(stderr, "accepted with counts out of bounds: %lld entries, %lld files, %lld bytes\n",
                    (long long)info.entries, (long long)info.files, (long long)info.unpacked);
            abort();
        }
    } else if (!err[0] || !memchr(err, '\0', sizeof err)) {
        fprintf(stderr, "refused without a message\n");
        abort();
    }
    free(z);
    return 0;
}
