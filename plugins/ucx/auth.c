/* The shared secret's challenge-response (docs/ucx.md section 2.2):
 * HMAC-SHA-256 (FIPS 180-4, RFC 2104) over both hellos, each carrying a
 * nonce of its side, so that a proof is good for one connection only and
 * the secret never crosses the wire. Written out here because gser takes
 * no crypto library as a dependency; tested against the RFC 4231 vectors. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "error.h"
#include "wire.h"

typedef struct sha256 {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    unsigned char buf[64];
    size_t nbuf;
} sha256_t;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha256_block(sha256_t *s, const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha256_init(sha256_t *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->nbuf = 0;
}

static void sha256_update(sha256_t *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->len += n;
    while (n) {
        size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += k, p += k, n -= k;
        if (s->nbuf == 64) {
            sha256_block(s, s->buf);
            s->nbuf = 0;
        }
    }
}

static void sha256_final(sha256_t *s, unsigned char out[GUX_MAC_LEN])
{
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha256_update(s, &pad, 1);
    while (s->nbuf != 56)
        sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++)
            out[4 * i + k] = (unsigned char)(s->h[i] >> (24 - 8 * k));
}

void gux_hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *lens, size_t nparts,
                     unsigned char out[GUX_MAC_LEN])
{
    unsigned char k[64] = {0}, pad[64], inner[GUX_MAC_LEN];
    sha256_t s;
    if (key_len > sizeof k) { /* RFC 2104: long keys are hashed first */
        sha256_init(&s);
        sha256_update(&s, key, key_len);
        sha256_final(&s, k);
    } else if (key_len) {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    for (size_t i = 0; i < nparts; i++)
        sha256_update(&s, parts[i], lens[i]);
    sha256_final(&s, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, inner, sizeof inner);
    sha256_final(&s, out);
    /* The key's bytes do not outlive the call on the stack. */
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
    __asm__ __volatile__("" : : "r"(k), "r"(pad) : "memory");
}

void gux_proof(const void *secret, size_t secret_len, bool server, const unsigned char client_hello[GUX_HELLO_LEN],
               const unsigned char server_hello[GUX_HELLO_LEN], unsigned char out[GUX_MAC_LEN])
{
    /* The role keeps one side's proof from being reflected back as the
     * other's; both hellos (with both nonces, versions and flags) make it
     * good for this connection only. */
    static const char label[] = "gser-ucx proof v2";
    const char *role = server ? "server" : "client";
    const void *parts[] = {label, role, client_hello, server_hello};
    const size_t lens[] = {sizeof label - 1, 6, GUX_HELLO_LEN, GUX_HELLO_LEN};
    gux_hmac_sha256(secret, secret_len, parts, lens, 4, out);
}

bool gux_mac_equal(const unsigned char a[GUX_MAC_LEN], const unsigned char b[GUX_MAC_LEN])
{
    /* Constant time: how many bytes match must not show in the timing. */
    volatile unsigned char d = 0;
    for (size_t i = 0; i < GUX_MAC_LEN; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

gser_status_t gux_nonce(unsigned char out[GUX_NONCE_LEN])
{
    size_t got = 0;
    while (got < GUX_NONCE_LEN) {
        ssize_t n = getrandom(out + got, GUX_NONCE_LEN - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return gux_fail(GSER_ERR_IO, "handshake: getrandom failed: %s", strerror(errno));
        got += (size_t)n;
    }
    return GSER_OK;
}
