/* fuzz_s3_xml.c - libFuzzer target for the s3 blob store's XML scanner
 * (storage/blob_s3.c: s3_xml_text, s3_xml_list), which reads what the
 * store answers: <Code>, <Message>, <UploadId>, ListObjectsV2 pages. The
 * first byte picks the output size and how much of each key to strip; the
 * rest is the answer. Whatever the bytes: nothing read or written out of
 * bounds, every value found NUL-terminated within its buffer, every key
 * handed to the callback a string no longer than the page.
 * docs/reliability.md, "Fuzzing". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/blob_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct seen {
    size_t page, keys;
    int stop_at;
} seen;

static int on_key(void *ctx, const char *key, int64_t sz) {
    seen *s = ctx;
    if (!key || strlen(key) > s->page || sz < 0) abort();
    s->keys++;
    return s->stop_at && (int)s->keys >= s->stop_at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const size_t caps[] = {1, 2, 8, 64, 256, 1100};
    size_t cap = caps[data[0] % 6];
    size_t strip = (size_t)(data[0] >> 4) % 6;
    /* a copy of exactly the input's length, no NUL after it: the scanner must keep to len */
    size_t len = size - 1;
    char *xml = malloc(len ? len : 1);
    if (!xml) return 0;
    memcpy(xml, data + 1, len);
    static const char *const tags[] = {"Code", "Message", "UploadId", "Key", "Size", "ETag", "IsTruncated",
                                       "NextContinuationToken"};
    char *out = malloc(cap);
    if (!out) abort();
    for (size_t t = 0; t < sizeof tags / sizeof tags[0]; t++) {
        size_t pos = 0, last = 0;
        for (int i = 0; i < 64; i++) {
            int rc = s3_xml_text(xml, len, tags[t], &pos, out, cap);
            if (memchr(out, '\0', cap) == NULL) abort();
            if (rc != 0) break;
            if (pos > len || pos <= last) abort();
            last = pos;
        }
    }
    char token[1100];
    int stopped = 0, truncated = 0;
    seen s = {len, 0, data[0] & 8 ? 2 : 0};
    int rc = s3_xml_list(xml, len, strip, on_key, &s, &stopped, &truncated, token, sizeof token);
    if (memchr(token, '\0', sizeof token) == NULL) abort();
    if (rc == 0 && truncated && !token[0]) abort();
    if (stopped && (!s.stop_at || (int)s.keys != s.stop_at)) abort();
    free(out);
    free(xml);
    return 0;
}
