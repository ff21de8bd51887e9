/* check_sigv4.c - tests for common/sigv4: AWS's documented S3 examples
 * (presigned GET, header-signed GET with Range, PUT with a '$' in the key,
 * GET ?lifecycle, GET ?max-keys&prefix), and our own cases, whose
 * signatures were computed by botocore 1.43.11 (S3SigV4QueryAuth /
 * S3SigV4Auth) at 2026-11-28T17:30:05Z: an UploadPart URL (partNumber and
 * uploadId among the X-Amz-* parameters, a host with a port, Content-MD5
 * signed), a key needing %-encoding, response-content-disposition, a
 * session token, header-signed POST ?uploads= and ListObjectsV2; then the
 * bounds (expiry, buffers, reserved names). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sigv4.h"
#include "../common/util.h"

#define AWS_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define T2013 ((time_t)1369353600)   /* 2013-05-24T00:00:00Z, AWS's examples */
#define T2026 ((time_t)1795887005)   /* 2026-11-28T17:30:05Z, ours */

static const sigv4_creds aws = {"AKIAIOSFODNN7EXAMPLE", AWS_SECRET, NULL, "us-east-1"};
static const sigv4_creds ours = {"AKIDEXAMPLE", AWS_SECRET, NULL, "us-east-1"};

static const char *sig_of(const char *s) {
    const char *p = strstr(s, "Signature=");
    ck_assert_ptr_nonnull(p);
    return p + 10;
}

START_TEST(aws_presigned_get) {
    sigv4_req r = {.method = "GET", .host = "examplebucket.s3.amazonaws.com", .path = "/test.txt", .now = T2013,
                   .expires_s = 86400};
    char q[2048];
    ck_assert_int_eq(sigv4_presign(&aws, &r, q, sizeof q), 0);
    ck_assert_str_eq(q, "X-Amz-Algorithm=AWS4-HMAC-SHA256"
                        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
                        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
                        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}
END_TEST

START_TEST(aws_header_signed_get_range) {
    const char *h[] = {"Range: bytes=0-9", NULL};
    sigv4_req r = {.method = "GET", .host = "examplebucket.s3.amazonaws.com", .path = "/test.txt", .headers = h,
                   .payload_hash = SIGV4_EMPTY_SHA256, .now = T2013};
    char canon[2048], sh[256];
    const char *extra[] = {"x-amz-content-sha256:" SIGV4_EMPTY_SHA256, "x-amz-date:20130524T000000Z", NULL};
    ck_assert_int_eq(sigv4_canonical_request(&r, NULL, extra, canon, sizeof canon, sh, sizeof sh), 0);
    ck_assert_str_eq(canon, "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
                            "x-amz-content-sha256:" SIGV4_EMPTY_SHA256 "\nx-amz-date:20130524T000000Z\n\n"
                            "host;range;x-amz-content-sha256;x-amz-date\n" SIGV4_EMPTY_SHA256);
    ck_assert_str_eq(sh, "host;range;x-amz-content-sha256;x-amz-date");
    char auth[512], date[17];
    ck_assert_int_eq(sigv4_authorize(&aws, &r, auth, sizeof auth, date), 0);
    ck_assert_str_eq(date, "20130524T000000Z");
    ck_assert_str_eq(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                           "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                           "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}
END_TEST

START_TEST(aws_header_signed_put_dollar_key) {
    char body_sha[65];
    sha256_hex("Welcome to Amazon S3.", 21, body_sha);
    ck_assert_str_eq(body_sha, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
    const char *h[] = {"Date: Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class: REDUCED_REDUNDANCY", NULL};
    sigv4_req r = {.method = "PUT", .host = "examplebucket.s3.amazonaws.com", .path = "/test$file.text", .headers = h,
                   .payload_hash = body_sha, .now = T2013};
    char auth[512], date[17];
    ck_assert_int_eq(sigv4_authorize(&aws, &r, auth, sizeof auth, date), 0);
    ck_assert_ptr_nonnull(strstr(auth, "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,"));
    ck_assert_str_eq(sig_of(auth), "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}
END_TEST

START_TEST(aws_header_signed_bucket_queries) {
    const char *lifecycle[] = {"lifecycle=", NULL};
    sigv4_req r = {.method = "GET", .host = "examplebucket.s3.amazonaws.com", .path = "/", .query = lifecycle,
                   .payload_hash = SIGV4_EMPTY_SHA256, .now = T2013};
    char auth[512], date[17], q[256];
    ck_assert_int_eq(sigv4_authorize(&aws, &r, auth, sizeof auth, date), 0);
    ck_assert_str_eq(sig_of(auth), "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
    ck_assert_int_eq(sigv4_query_string(&r, q, sizeof q), 0);
    ck_assert_str_eq(q, "lifecycle=");
    const char *list[] = {"prefix=J", "max-keys=2", NULL}; /* given out of order: sorted */
    r.query = list;
    ck_assert_int_eq(sigv4_authorize(&aws, &r, auth, sizeof auth, date), 0);
    ck_assert_str_eq(sig_of(auth), "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
    ck_assert_int_eq(sigv4_query_string(&r, q, sizeof q), 0);
    ck_assert_str_eq(q, "max-keys=2&prefix=J");
}
END_TEST

START_TEST(upload_part_url) {
    const char *query[] = {"uploadId=2~abc/def+", "partNumber=3", NULL};
    const char *h[] = {"Content-MD5:1B2M2Y8AsgTpgAmY7PhCfg==", NULL};
    sigv4_req r = {.method = "PUT", .host = "127.0.0.1:7480", .path = "/ckpt/checkpoints/12/2-ab.safetensors",
                   .query = query, .headers = h, .now = T2026, .expires_s = 900};
    char q[2048];
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), 0);
    /* byte order: X-Amz-* before partNumber and uploadId; the signature last */
    ck_assert_str_eq(q, "X-Amz-Algorithm=AWS4-HMAC-SHA256"
                        "&X-Amz-Credential=AKIDEXAMPLE%2F20261128%2Fus-east-1%2Fs3%2Faws4_request"
                        "&X-Amz-Date=20261128T173005Z&X-Amz-Expires=900&X-Amz-SignedHeaders=content-md5%3Bhost"
                        "&partNumber=3&uploadId=2~abc%2Fdef%2B"
                        "&X-Amz-Signature=f8a0eed2cf4ce51ce2488f85bacaea7bb22016f50677a75c6d0e84bcdf7a72da");
    /* another part, another id, another md5, another method: another signature */
    const char *query2[] = {"uploadId=2~abc/def+", "partNumber=4", NULL};
    r.query = query2;
    char q2[2048];
    ck_assert_int_eq(sigv4_presign(&ours, &r, q2, sizeof q2), 0);
    ck_assert_str_ne(sig_of(q), sig_of(q2));
    r.query = query;
    const char *h2[] = {"Content-MD5:AAAAAAAAAAAAAAAAAAAAAA==", NULL};
    r.headers = h2;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q2, sizeof q2), 0);
    ck_assert_str_ne(sig_of(q), sig_of(q2));
    r.headers = h;
    r.method = "GET";
    ck_assert_int_eq(sigv4_presign(&ours, &r, q2, sizeof q2), 0);
    ck_assert_str_ne(sig_of(q), sig_of(q2));
}
END_TEST

START_TEST(keys_needing_encoding) {
    char enc[256];
    ck_assert_int_eq(sigv4_uri_encode("/ckpt/a b/\xc3\xbc+$=~x", 1, enc, sizeof enc), 0);
    ck_assert_str_eq(enc, "/ckpt/a%20b/%C3%BC%2B%24%3D~x");
    ck_assert_int_eq(sigv4_uri_encode("a/b c", 0, enc, sizeof enc), 0);
    ck_assert_str_eq(enc, "a%2Fb%20c");
    ck_assert_int_eq(sigv4_uri_encode("abc", 0, enc, 3), -1); /* no room for the NUL */
    ck_assert_str_eq(enc, "");
    ck_assert_int_eq(sigv4_uri_encode(" ", 0, enc, 3), -1);
    ck_assert_int_eq(sigv4_uri_encode(" ", 0, enc, 4), 0);
    ck_assert_str_eq(enc, "%20");
    sigv4_req r = {.method = "GET", .host = "127.0.0.1:7480", .path = "/ckpt/a b/\xc3\xbc+$=~x", .now = T2026,
                   .expires_s = 60};
    char q[2048];
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), 0);
    ck_assert_str_eq(sig_of(q), "3d1b65ccef8df38572db437d17dbc22aaff03bb38843f62b4be3c31287e31aba");
    const char *disp[] = {"response-content-disposition=attachment; filename=\"job-1.safetensors\"", NULL};
    sigv4_req g = {.method = "GET", .host = "127.0.0.1:7480", .path = "/ckpt/checkpoints/1/x.safetensors",
                   .query = disp, .now = T2026, .expires_s = 900};
    ck_assert_int_eq(sigv4_presign(&ours, &g, q, sizeof q), 0);
    ck_assert_ptr_nonnull(strstr(q, "&response-content-disposition=attachment%3B%20filename%3D%22job-1.safetensors%22&"));
    ck_assert_str_eq(sig_of(q), "c9538b8e7f097c85a5635f18ee38b00b75f41f55ea5ed69cff8e6aabaf95c8a8");
}
END_TEST

START_TEST(session_token) {
    sigv4_creds c = ours;
    c.token = "FQoGZXIvYXdz/token+==";
    sigv4_req r = {.method = "GET", .host = "s3.example.com", .path = "/ckpt/k", .now = T2026, .expires_s = 604800};
    char q[2048];
    ck_assert_int_eq(sigv4_presign(&c, &r, q, sizeof q), 0);
    ck_assert_ptr_nonnull(strstr(q, "&X-Amz-Security-Token=FQoGZXIvYXdz%2Ftoken%2B%3D%3D&"));
    ck_assert_str_eq(sig_of(q), "477463f66ab2b5bdfa4a4c9b7ed12c4398d6d3ae8d32a7479f9d0566913ad18b");
    const char *uploads[] = {"uploads=", NULL};
    const char *meta[] = {"x-amz-meta-job:12/2", NULL};
    sigv4_req p = {.method = "POST", .host = "127.0.0.1:7480", .path = "/ckpt/k", .query = uploads, .headers = meta,
                   .payload_hash = SIGV4_EMPTY_SHA256, .now = T2026};
    char auth[512], date[17];
    ck_assert_int_eq(sigv4_authorize(&c, &p, auth, sizeof auth, date), 0);
    ck_assert_ptr_nonnull(strstr(auth, "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-meta-job;x-amz-security-token,"));
    ck_assert_str_eq(sig_of(auth), "ddd54c675f8bfa83499034dc24f48bb7cd299c5b2accecc7dadb1742df0e358d");
    ck_assert_ptr_null(strstr(auth, AWS_SECRET));
}
END_TEST

START_TEST(list_objects_v2) {
    const char *query[] = {"list-type=2", "prefix=checkpoints/1/", "continuation-token=a+b=", NULL};
    sigv4_req r = {.method = "GET", .host = "127.0.0.1:7480", .path = "/ckpt", .query = query,
                   .payload_hash = SIGV4_EMPTY_SHA256, .now = T2026};
    char auth[512], date[17], q[256];
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), 0);
    ck_assert_str_eq(sig_of(auth), "d17eebd1557e5718896920aa4139777c91e5f6c951b8e22d570257fa3fcc3d20");
    ck_assert_int_eq(sigv4_query_string(&r, q, sizeof q), 0);
    ck_assert_str_eq(q, "continuation-token=a%2Bb%3D&list-type=2&prefix=checkpoints%2F1%2F");
}
END_TEST

START_TEST(bounds_and_refusals) {
    sigv4_req r = {.method = "GET", .host = "h", .path = "/b/k", .now = T2026, .expires_s = 0};
    char q[2048], auth[512], date[17];
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), -1);
    ck_assert_str_eq(q, "");
    r.expires_s = 604801;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), -1);
    r.expires_s = 604800;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), 0);
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, 40), -1); /* too small a buffer */
    ck_assert_str_eq(q, "");
    /* what the signer sets itself cannot be given */
    const char *xq[] = {"X-Amz-Expires=5", NULL};
    r.query = xq;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), -1);
    r.query = NULL;
    const char *hh[] = {"Host:evil", NULL};
    r.headers = hh;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), -1);
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    const char *dh[] = {"X-Amz-Date:20200101T000000Z", NULL};
    r.headers = dh;
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    const char *crlf[] = {"x-a:1\r\nx-b:2", NULL};
    r.headers = crlf;
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    const char *dup[] = {"X-A:1", "x-a:2", NULL};
    r.headers = dup;
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    /* values trimmed, inner runs of spaces one */
    const char *sp[] = {"X-Meta:  a   b\t c  ", NULL};
    r.headers = sp;
    char canon[1024];
    ck_assert_int_eq(sigv4_canonical_request(&r, NULL, NULL, canon, sizeof canon, NULL, 0), 0);
    ck_assert_ptr_nonnull(strstr(canon, "\nx-meta:a b c\n"));
    r.headers = NULL;
    /* a payload hash is 64 lower-case hex or UNSIGNED-PAYLOAD */
    r.payload_hash = "abc";
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    r.payload_hash = SIGV4_EMPTY_SHA256;
    ck_assert_int_eq(sigv4_presign(&ours, &r, q, sizeof q), -1); /* presigned: unsigned payload only */
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), 0);
    r.path = "b/k";
    ck_assert_int_eq(sigv4_authorize(&ours, &r, auth, sizeof auth, date), -1);
    r.path = "/b/k";
    sigv4_creds nos = ours;
    nos.secret = "";
    ck_assert_int_eq(sigv4_authorize(&nos, &r, auth, sizeof auth, date), -1);
    unsigned char key[32];
    ck_assert_int_eq(sigv4_signing_key(AWS_SECRET, "2013052", "us-east-1", key), -1);
    ck_assert_int_eq(sigv4_signing_key(AWS_SECRET, "20130524", "us-east-1", key), 0);
}
END_TEST

static Suite *sigv4_suite(void) {
    Suite *s = suite_create("sigv4");
    TCase *tc = tcase_create("aws");
    tcase_add_test(tc, aws_presigned_get);
    tcase_add_test(tc, aws_header_signed_get_range);
    tcase_add_test(tc, aws_header_signed_put_dollar_key);
    tcase_add_test(tc, aws_header_signed_bucket_queries);
    suite_add_tcase(s, tc);
    tc = tcase_create("ours");
    tcase_add_test(tc, upload_part_url);
    tcase_add_test(tc, keys_needing_encoding);
    tcase_add_test(tc, session_token);
    tcase_add_test(tc, list_objects_v2);
    tcase_add_test(tc, bounds_and_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(sigv4_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
