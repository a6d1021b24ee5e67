/* Tests of SHA-256 and HMAC-SHA256: FIPS 180-2 and RFC 4231 vectors, a cross-check against
 * Python's hashlib and hmac on generated keys and messages, wiping, constant-time compare. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "meshtrain/hmac.h"

/* Parses a hex string into out (at most MT_SHA256_BYTES bytes); returns the byte count. */
static size_t from_hex(const char *hex, unsigned char *out)
{
    size_t n = 0;
    for (; hex[0] && hex[1] && n < MT_SHA256_BYTES; hex += 2) {
        unsigned byte = 0;
        sscanf(hex, "%2x", &byte);
        out[n++] = (unsigned char)byte;
    }
    return n;
}

/* Whether the first bytes of got match the hex string want; prints both when they do not. */
static int matches(const unsigned char got[MT_SHA256_BYTES], const char *want, const char *what)
{
    unsigned char expect[MT_SHA256_BYTES];
    size_t n = from_hex(want, expect);
    if (memcmp(got, expect, n) == 0)
        return 1;
    fprintf(stderr, "%s: got ", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%02x", got[i]);
    fprintf(stderr, ", want %s\n", want);
    return 0;
}

static void test_sha256_vectors(void)
{
    unsigned char out[MT_SHA256_BYTES];
    mt_sha256_digest(NULL, 0, out);
    CHECK(matches(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                  "empty"));
    mt_sha256_digest("abc", 3, out);
    CHECK(matches(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                  "abc"));
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    mt_sha256_digest(two_blocks, strlen(two_blocks), out);
    CHECK(matches(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                  "448-bit"));
    /* The same message in two uneven pieces crosses the partial-block path. */
    mt_sha256 h;
    mt_sha256_init(&h);
    mt_sha256_update(&h, two_blocks, 5);
    mt_sha256_update(&h, two_blocks + 5, strlen(two_blocks) - 5);
    mt_sha256_final(&h, out);
    CHECK(matches(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                  "448-bit in pieces"));
}

/* One million 'a' in pieces of cycling odd sizes, so every path of the buffering runs: filling
 * a partial block without completing it, completing one, whole blocks from the caller's
 * memory, and a remainder left behind. */
static void test_sha256_million(void)
{
    static unsigned char as[1000];
    memset(as, 'a', sizeof as);
    static const size_t pieces[] = {1, 3, 7, 13, 55, 56, 63, 64, 65, 127, 129, 0, 999};
    size_t npieces = sizeof pieces / sizeof pieces[0];
    mt_sha256 h;
    mt_sha256_init(&h);
    size_t left = 1000000;
    for (size_t i = 0; left > 0; i++) {
        size_t n = pieces[i % npieces];
        if (n > left)
            n = left;
        mt_sha256_update(&h, as, n);
        left -= n;
    }
    unsigned char out[MT_SHA256_BYTES];
    mt_sha256_final(&h, out);
    CHECK(matches(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                  "million a"));
}

/* RFC 4231 test cases 1 to 7. Case 5's tag is truncated to 128 bits there, so only its first
 * 16 bytes are compared. */
static void test_hmac_rfc4231(void)
{
    unsigned char key20_0b[20], key20_aa[20], key25[25], key20_0c[20], key131[131];
    unsigned char data50_dd[50], data50_cd[50];
    memset(key20_0b, 0x0b, sizeof key20_0b);
    memset(key20_aa, 0xaa, sizeof key20_aa);
    for (int i = 0; i < 25; i++)
        key25[i] = (unsigned char)(i + 1);
    memset(key20_0c, 0x0c, sizeof key20_0c);
    memset(key131, 0xaa, sizeof key131);
    memset(data50_dd, 0xdd, sizeof data50_dd);
    memset(data50_cd, 0xcd, sizeof data50_cd);
    const char *msg6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const char *msg7 = "This is a test using a larger than block-size key and a larger than "
                       "block-size data. The key needs to be hashed before being used by the "
                       "HMAC algorithm.";
    struct {
        const void *key;
        size_t key_bytes;
        const void *data;
        size_t bytes;
        const char *tag;
    } cases[] = {
        {key20_0b, 20, "Hi There", 8,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {key20_aa, 20, data50_dd, 50,
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {key25, 25, data50_cd, 50,
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {key20_0c, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
        {key131, 131, msg6, strlen(msg6),
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {key131, 131, msg7, strlen(msg7),
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char out[MT_SHA256_BYTES];
        char what[32];
        snprintf(what, sizeof what, "RFC 4231 case %zu", c + 1);
        mt_hmac_sha256_digest(cases[c].key, cases[c].key_bytes, cases[c].data, cases[c].bytes, out);
        CHECK_MSG(matches(out, cases[c].tag, what), "%s", what);
    }
}

/* The cross-check's generator: xorshift64 (shifts 13, 7, 17) from a fixed seed; each byte is
 * the top byte of the next word, and each case takes its key's bytes, then its message's. */
static uint64_t xorshift_state;

static unsigned char next_byte(void)
{
    uint64_t x = xorshift_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    xorshift_state = x;
    return (unsigned char)(x >> 56);
}

/* Key and message lengths (0 to 300 bytes, with messages of 55, 56, 63, 64 and 65 bytes around
 * the padding and block boundaries, and keys below, at and above a block), with the digests
 * that Python computed once from the same bytes, by this script (not kept in the repository):
 *
 *   import hashlib, hmac
 *   M, s = (1 << 64) - 1, 0x9E3779B97F4A7C15
 *   def nxt():
 *       global s
 *       s ^= (s << 13) & M; s ^= s >> 7; s ^= (s << 17) & M
 *       return s
 *   take = lambda n: bytes(nxt() >> 56 for _ in range(n))
 *   for kl, ml in cases:   # the lengths below, in order
 *       k, m = take(kl), take(ml)
 *       print(kl, ml, hashlib.sha256(m).hexdigest(), hmac.new(k, m, hashlib.sha256).hexdigest())
 */
static const struct {
    size_t key_bytes, bytes;
    const char *sha256, *hmac;
} python_cases[] = {
    {0, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
     "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"},
    {1, 1, "18ac3e7343f016890c510e93f935261169d9e3f565436429830faf0934f4f8e4",
     "d9fbd77cc0809d519afe0918857d25ca290d179e25acdd42c0d624a0eb94ef31"},
    {3, 55, "146855764f01b1295f99b9c6cf00925799b3d39959dc81832645a9630cf14772",
     "41fa1df5e1a9a19b2634f3179f9f19b44d0f2f44db44a23777433f755cc1f6d2"},
    {16, 56, "0b3bfbae704a5bc9e5d1162e2fda357eb546fb9bbb2c7b1f30e26096d85ce0d2",
     "d3a63384fed7381e9931c8829ccf344466c5b8ececa34c9f037255acf880a62c"},
    {20, 57, "564f968eb4c3afee6acd907d6e657ff82d34eaf5522963463d11d37a59e79a05",
     "78c22d234a3162ea8606be76f52fb7ee21357ab1642887551fb1dc7e4e9327d4"},
    {32, 63, "d49400fd7866d764ed5986cfb8d82408475f7c838b7f13d11f6545bda6ec4667",
     "76c40afb60e1cefbb8d4697ff8c970450b3f28ba585a93b70e868ceb50cc3ea3"},
    {55, 64, "bac0c314f752ff0968e3ec35141e10f08604a7a4c9d4c18d0c6450010de50097",
     "1a3bde2d14cd4a3687ba12b496b189a9aa01163069111f12331cc59e99beccdd"},
    {56, 65, "a0ef78e507c3d5e4a4fe8e48533b4255ab06c9d592f2ca66605d8bdef6d8f736",
     "cbe45eef6ea02cd9d3610980ec2f87a2d1745014403f1fdfe88002e73a0f02ca"},
    {63, 100, "d9f4b9236534d0e6651a7c82d3d934e6d629b49c7b70eb5b577756c1c27f0c35",
     "c528f81516520e9f6c596689103479e64a2ea7fc0560be4870113606c6eb7a33"},
    {64, 119, "ec7a9b5d5932d42dd800b79cef82fe7db1d785bd353e4f92439a21c4f8f4312e",
     "12e4473eef37b8b36f581bb8eed7feaba8ce953e9f94b26ecb97b9e6058f4da1"},
    {65, 120, "a6f463d01621b20c28b3fe94d009c21703022dd4cbf94c238eb093067f778e29",
     "eda7364cff43a8a7e1cfc6324f59ba89a1d436a52c405ca42db3d1b801bbde6b"},
    {100, 127, "914e04bfb7c4d557dd2bd4fa41d2e8b355347a130b4dcc5ac3150d516704c8f0",
     "163ffae6ab1acf92cbcc611a7d0297eb02e300922479004a0eb456f8fef7502d"},
    {127, 128, "651bd6d2ccbc4c83c8e927fc03c3f14a10f1d7a27f816fb86c5d1ba152bcfb6c",
     "e49ca535de74ee191c28f5d1832f5aaa843793929e3ddc11a87821b572bf8091"},
    {128, 129, "c4e3bcdff2553a6e39bf2eb106865a7d9338e8e2aee3fc47dfcf6d840c8d4e9c",
     "d66b34939a674e668748a5efd83f42e32a023a08c046b8501283bde63b94a2d0"},
    {131, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
     "5375f5676c10b4e1ab00b8ae7ae810b422180376c6cbb8b4aec4c1a401141220"},
    {200, 183, "0a132966f88770f0372c88d807654da4c2577686e37563f91a0ca6b63662c1ae",
     "41c685d5a8d7a15d4a4889a464863d4ec5b0818f15fcecc02095b34d56ee84d9"},
    {255, 255, "925c5b8a276a224da218b8239dfe966a2140550d792676bc3a2ad0fe4aa106a2",
     "5d2ea4660257e99a8be4be9711ad31ff613716490b95b27426f0e287153d5389"},
    {300, 256, "3b1a56ad26cf6a9a32704ca06be3be967f9adbdad780455b40f84ba8a74a79b3",
     "edde2616d31da845613b59e2b7dafc3c2790d67b7370899bb58027bbb817e0e8"},
    {64, 300, "adbe50bdee7977ecef74ae7b68bb04f5d30cff97b09c093fe1f293b3e9b6d3b5",
     "e6bf4064e910938f72d91634ddaf5ea93622be9a71211f93818220b0ab798e60"},
    {7, 64, "ffb7bc541f60558cc97ffaed4c515a76f9178cf12966e1c08f704330ab4aa3c1",
     "f0f27a3a8c5c817b21e1e075e7a2c9073b6630edff2672a92ed787b8a036b278"},
};

/* Feeds data to an HMAC in three pieces split at a and b (clamped to the length). */
static void hmac_in_pieces(const unsigned char *key, size_t key_bytes, const unsigned char *data,
                           size_t bytes, size_t a, size_t b, unsigned char out[MT_SHA256_BYTES])
{
    if (a > bytes)
        a = bytes;
    if (b < a)
        b = a;
    if (b > bytes)
        b = bytes;
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, key, key_bytes);
    mt_hmac_sha256_update(&h, data, a);
    mt_hmac_sha256_update(&h, data + a, b - a);
    mt_hmac_sha256_update(&h, data + b, bytes - b);
    mt_hmac_sha256_final(&h, out);
}

static void test_python_cross_check(void)
{
    xorshift_state = 0x9E3779B97F4A7C15ull;
    for (size_t c = 0; c < sizeof python_cases / sizeof python_cases[0]; c++) {
        unsigned char key[300], data[300], out[MT_SHA256_BYTES];
        size_t key_bytes = python_cases[c].key_bytes, bytes = python_cases[c].bytes;
        for (size_t i = 0; i < key_bytes; i++)
            key[i] = next_byte();
        for (size_t i = 0; i < bytes; i++)
            data[i] = next_byte();
        char what[64];
        snprintf(what, sizeof what, "python case %zu (key %zu, message %zu)", c, key_bytes,
                 bytes);

        mt_sha256_digest(data, bytes, out);
        CHECK_MSG(matches(out, python_cases[c].sha256, what), "%s: sha256", what);
        mt_hmac_sha256_digest(key, key_bytes, data, bytes, out);
        CHECK_MSG(matches(out, python_cases[c].hmac, what), "%s: hmac", what);
        /* Splits on and off block boundaries give the same tag as one call. */
        hmac_in_pieces(key, key_bytes, data, bytes, 1, 64, out);
        CHECK_MSG(matches(out, python_cases[c].hmac, what), "%s: hmac split 1/64", what);
        hmac_in_pieces(key, key_bytes, data, bytes, bytes / 3, bytes - 1, out);
        CHECK_MSG(matches(out, python_cases[c].hmac, what), "%s: hmac split thirds", what);
    }
}

/* Both finals leave no key-derived state behind in the caller's struct. */
static void test_wiping(void)
{
    static const unsigned char zero[sizeof(mt_hmac_sha256)];
    unsigned char out[MT_SHA256_BYTES];
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, "secret key", 10);
    mt_hmac_sha256_update(&h, "challenge", 9);
    mt_hmac_sha256_final(&h, out);
    CHECK(memcmp(&h, zero, sizeof h) == 0);

    mt_sha256 s;
    mt_sha256_init(&s);
    mt_sha256_update(&s, "abc", 3);
    mt_sha256_final(&s, out);
    CHECK(memcmp(&s, zero, sizeof s) == 0);
}

static void test_bytes_equal(void)
{
    unsigned char a[64], b[64];
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = (unsigned char)(i * 37 + 5);
    CHECK(mt_bytes_equal_const_time(a, b, sizeof a) == 1);
    CHECK(mt_bytes_equal_const_time(a, b, 0) == 1);
    CHECK(mt_bytes_equal_const_time(NULL, NULL, 0) == 1);
    /* A difference in any single bit of the first, a middle or the last byte is seen. */
    static const size_t positions[] = {0, 31, 63};
    for (size_t p = 0; p < 3; p++) {
        for (int bit = 0; bit < 8; bit++) {
            b[positions[p]] ^= (unsigned char)(1u << bit);
            CHECK_MSG(mt_bytes_equal_const_time(a, b, sizeof a) == 0, "byte %zu bit %d",
                      positions[p], bit);
            b[positions[p]] ^= (unsigned char)(1u << bit);
        }
    }
    /* Only the first bytes given are compared. */
    b[63] ^= 0xff;
    CHECK(mt_bytes_equal_const_time(a, b, 63) == 1);
    CHECK(mt_bytes_equal_const_time(a, b, 64) == 0);
}

int main(void)
{
    test_sha256_vectors();
    test_sha256_million();
    test_hmac_rfc4231();
    test_python_cross_check();
    test_wiping();
    test_bytes_equal();
    return check_summary("test_hmac");
}
