// The transport's wire layout on its own (plugins/ucx/wire.c): the
// handshake record and the message head, written and read back, and every
// malformed head rejected with its own status, never read out of bounds.
#include <random>

#include "ucx_common.hpp"

extern "C" {
#include "wire.h"
}

namespace {

TEST(Wire, HelloRoundTripAndMagic)
{
    gux_hello_t h{GSER_UCX_WIRE_VERSION, GSER_WIRE_VERSION, GSER_UCX_CAP_CUDA, GUX_HELLO_SECRET, 0x00312345u, 1024, {}};
    for (int i = 0; i < GUX_NONCE_LEN; i++)
        h.nonce[i] = (unsigned char)(i + 1);
    unsigned char b[GUX_HELLO_LEN];
    gux_hello_encode(&h, b);
    // Little-endian at fixed offsets (docs/ucx.md).
    EXPECT_EQ(b[0], 0x89);
    EXPECT_EQ(std::memcmp(b + 1, "GSERUCX", 7), 0);
    EXPECT_EQ(b[8], GSER_UCX_WIRE_VERSION);
    EXPECT_EQ(b[20], GUX_HELLO_SECRET);
    EXPECT_EQ(b[24], 0x45);
    EXPECT_EQ(b[27], 0x00);
    EXPECT_EQ(b[28], 0x00); // the FIFO size, 1024 = 0x400
    EXPECT_EQ(b[29], 0x04);
    EXPECT_EQ(b[30], 0x00);
    EXPECT_EQ(b[31], 0x00);
    EXPECT_EQ(b[32], 1);
    EXPECT_EQ(b[63], 32);
    gux_hello_t g{};
    ASSERT_EQ(gux_hello_decode(b, &g), GSER_OK);
    EXPECT_EQ(g.wire_version, h.wire_version);
    EXPECT_EQ(g.gser_wire_version, h.gser_wire_version);
    EXPECT_EQ(g.caps, h.caps);
    EXPECT_EQ(g.flags, h.flags);
    EXPECT_EQ(g.timeout_ms, h.timeout_ms);
    EXPECT_EQ(g.mm_fifo, 1024u);
    EXPECT_EQ(std::memcmp(g.nonce, h.nonce, GUX_NONCE_LEN), 0);
    // Unknown flags are refused in this version ...
    unsigned char c[GUX_HELLO_LEN];
    std::memcpy(c, b, sizeof c);
    c[21] = 1;
    EXPECT_EQ(gux_hello_decode(c, &g), GSER_ERR_FORMAT);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("flags"), std::string::npos);
    // ... and left to another version, whose hello is read for its
    // versions; bytes 28..31 are a FIFO size only in version 5 (version 4
    // had them reserved).
    c[8] = 99;
    ASSERT_EQ(gux_hello_decode(c, &g), GSER_OK);
    EXPECT_EQ(g.wire_version, 99u);
    EXPECT_EQ(g.mm_fifo, 0u);
    std::memcpy(c, b, sizeof c);
    c[8] = 4;
    ASSERT_EQ(gux_hello_decode(c, &g), GSER_OK);
    EXPECT_EQ(g.wire_version, 4u);
    EXPECT_EQ(g.mm_fifo, 0u);
    b[3] ^= 1;
    EXPECT_EQ(gux_hello_decode(b, &g), GSER_ERR_BAD_MAGIC);
}

TEST(Wire, ControlRecords)
{
    unsigned char b[GUX_REC_LEN];
    gux_rec_t r{GUX_REC_BYE, GUX_BYE_SILENT, GUX_BYE_LEN};
    gux_rec_encode(&r, b);
    EXPECT_EQ(std::memcmp(b, "GSXR", 4), 0);
    gux_rec_t g{};
    const unsigned all = 1u << GUX_REC_PROOF | 1u << GUX_REC_SETUP | 1u << GUX_REC_HEARTBEAT | 1u << GUX_REC_BYE;
    ASSERT_EQ(gux_rec_decode(b, all, &g), GSER_OK);
    EXPECT_EQ(g.type, GUX_REC_BYE);
    EXPECT_EQ(g.reason, GUX_BYE_SILENT);
    EXPECT_EQ(g.len, (uint32_t)GUX_BYE_LEN);
    // A type the step does not take, with its name in the message.
    EXPECT_EQ(gux_rec_decode(b, 1u << GUX_REC_HEARTBEAT, &g), GSER_ERR_FORMAT);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("bye"), std::string::npos);
    // Each type's body length is fixed or bounded; reasons only on a bye.
    struct Case {
        gux_rec_t r;
        gser_status_t want;
    } cases[] = {
        {{GUX_REC_PROOF, 0, GUX_MAC_LEN}, GSER_OK},
        {{GUX_REC_PROOF, 0, GUX_MAC_LEN - 1}, GSER_ERR_FORMAT},
        {{GUX_REC_SETUP, 0, GUX_SETUP_FIXED}, GSER_ERR_FORMAT},
        {{GUX_REC_SETUP, 0, GUX_SETUP_FIXED + 1}, GSER_OK},
        {{GUX_REC_SETUP, 0, GUX_SETUP_MAX}, GSER_OK},
        {{GUX_REC_SETUP, 0, GUX_SETUP_MAX + 1}, GSER_ERR_FORMAT},
        {{GUX_REC_SETUP, 0, 0xffffffffu}, GSER_ERR_FORMAT},
        {{GUX_REC_HEARTBEAT, 0, 0}, GSER_OK},
        {{GUX_REC_HEARTBEAT, 0, 1}, GSER_ERR_FORMAT},
        {{GUX_REC_HEARTBEAT, GUX_BYE_SILENT, 0}, GSER_ERR_FORMAT},
        {{GUX_REC_BYE, 0, GUX_BYE_LEN}, GSER_ERR_FORMAT},
        {{GUX_REC_BYE, 99, GUX_BYE_LEN}, GSER_ERR_FORMAT},
        {{0, 0, 0}, GSER_ERR_FORMAT},
        {{0xffff, 0, 0}, GSER_ERR_FORMAT},
    };
    for (auto &c : cases) {
        gux_rec_encode(&c.r, b);
        EXPECT_EQ(gux_rec_decode(b, all | 1u, &g), c.want) << "type " << c.r.type << " len " << c.r.len;
    }
    gux_rec_encode(&cases[0].r, b);
    b[12] = 1; // reserved
    EXPECT_EQ(gux_rec_decode(b, all, &g), GSER_ERR_FORMAT);
    b[0] = 'X';
    EXPECT_EQ(gux_rec_decode(b, all, &g), GSER_ERR_BAD_MAGIC);

    // A setup: connection id, two addresses, then the worker address.
    unsigned char body[GUX_SETUP_FIXED + 2 * GUX_IP_LEN + 3] = {0x78, 0x56, 0x34, 0x12, 2, 0, 0, 0};
    body[GUX_SETUP_FIXED] = 0xaa;
    body[GUX_SETUP_FIXED + GUX_IP_LEN] = 0xbb;
    body[sizeof body - 3] = 7, body[sizeof body - 1] = 9;
    gux_setup_t su{};
    ASSERT_EQ(gux_setup_decode(body, sizeof body, &su), GSER_OK);
    EXPECT_EQ(su.conn_id, 0x12345678u);
    EXPECT_EQ(su.nips, 2u);
    EXPECT_EQ(su.ips, body + GUX_SETUP_FIXED);
    EXPECT_EQ(su.ips[GUX_IP_LEN], 0xbb);
    EXPECT_EQ(su.addr, body + GUX_SETUP_FIXED + 2 * GUX_IP_LEN);
    EXPECT_EQ(su.addr_len, 3u);
    EXPECT_EQ(su.addr[0], 7);
    // More addresses than the record holds (no worker address left), too many, reserved bits.
    body[4] = 3;
    EXPECT_EQ(gux_setup_decode(body, sizeof body, &su), GSER_ERR_FORMAT);
    body[4] = GUX_SETUP_IPS_MAX + 1;
    EXPECT_EQ(gux_setup_decode(body, sizeof body, &su), GSER_ERR_FORMAT);
    body[4] = 2;
    body[6] = 1;
    EXPECT_EQ(gux_setup_decode(body, sizeof body, &su), GSER_ERR_FORMAT);
    body[6] = 0;
    EXPECT_EQ(gux_setup_decode(body, GUX_SETUP_FIXED, &su), GSER_ERR_FORMAT);
    EXPECT_EQ(gux_setup_decode(body, GUX_SETUP_FIXED + 2 * GUX_IP_LEN, &su), GSER_ERR_FORMAT);
}

std::string hex(const unsigned char *p, size_t n)
{
    static const char *d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++)
        s += d[p[i] >> 4], s += d[p[i] & 15];
    return s;
}

// HMAC-SHA-256 against RFC 4231 (test cases 1, 2, 6 and 7: a short key, a
// short message, and keys longer than the block, which are hashed first).
TEST(Wire, HmacSha256MatchesRfc4231)
{
    auto mac = [](const std::string &key, const std::string &msg) {
        unsigned char out[GUX_MAC_LEN];
        const void *parts[] = {msg.data()};
        size_t lens[] = {msg.size()};
        gux_hmac_sha256(key.data(), key.size(), parts, lens, 1, out);
        return hex(out, sizeof out);
    };
    EXPECT_EQ(mac(std::string(20, '\x0b'), "Hi There"),
              "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    EXPECT_EQ(mac("Jefe", "what do ya want for nothing?"),
              "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    EXPECT_EQ(mac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
              "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    EXPECT_EQ(mac(std::string(131, '\xaa'),
                  "This is a test using a larger than block-size key and a larger than block-size data. The key "
                  "needs to be hashed before being used by the HMAC algorithm."),
              "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
    // Parts hash as one message.
    unsigned char a[GUX_MAC_LEN], b[GUX_MAC_LEN];
    const void *parts[] = {"what do ya ", "want for nothing?"};
    size_t lens[] = {11, 17};
    gux_hmac_sha256("Jefe", 4, parts, lens, 2, a);
    EXPECT_EQ(hex(a, sizeof a), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

    // A proof depends on the role, both hellos and the secret.
    unsigned char hc[GUX_HELLO_LEN] = {1}, hs[GUX_HELLO_LEN] = {2};
    gux_proof("s3cret", 6, false, hc, hs, a);
    gux_proof("s3cret", 6, true, hc, hs, b);
    EXPECT_FALSE(gux_mac_equal(a, b));
    gux_proof("s3cret", 6, false, hc, hs, b);
    EXPECT_TRUE(gux_mac_equal(a, b));
    hs[40] ^= 1;
    gux_proof("s3cret", 6, false, hc, hs, b);
    EXPECT_FALSE(gux_mac_equal(a, b));
    hs[40] ^= 1;
    gux_proof("s3creT", 6, false, hc, hs, b);
    EXPECT_FALSE(gux_mac_equal(a, b));
    b[31] ^= 0x80;
    gux_proof("s3cret", 6, false, hc, hs, b);
    b[31] ^= 0x80;
    EXPECT_FALSE(gux_mac_equal(a, b));

    unsigned char n1[GUX_NONCE_LEN], n2[GUX_NONCE_LEN];
    ASSERT_EQ(gux_nonce(n1), GSER_OK);
    ASSERT_EQ(gux_nonce(n2), GSER_OK);
    EXPECT_NE(std::memcmp(n1, n2, GUX_NONCE_LEN), 0);
}

TEST(Wire, Tags)
{
    uint64_t t = gux_tag(0xabcdef01u, GUX_KIND_FRAME, 0x1fffffffu);
    EXPECT_EQ(gux_tag_conn(t), 0xabcdef01u);
    EXPECT_EQ(gux_tag_seq(t), 0x0fffffffu); // the sequence wraps at 28 bits
    EXPECT_EQ((t & GUX_TAG_MASK_KIND) >> 28, (uint64_t)GUX_KIND_FRAME);
}

struct Built {
    std::vector<unsigned char> head;
    std::vector<uint8_t> routes;
};

Built build(const std::vector<gser_frame_t> &frames, const gux_route_policy_t &pol, uint32_t seq = 5,
            uint32_t chunk = 0)
{
    Built b;
    b.routes.resize(frames.size());
    size_t len = 0;
    EXPECT_EQ(gux_head_plan(frames.data(), frames.size(), &pol, b.routes.data(), &len), GSER_OK)
        << gser_ucx_get_last_error();
    b.head.resize(len);
    gux_head_write(frames.data(), frames.size(), b.routes.data(), seq, chunk, b.head.data(), len);
    return b;
}

gser_status_t parse(const std::vector<unsigned char> &head, std::vector<gux_head_frame_t> *out = nullptr,
                    size_t max_frames = 1000, uint64_t max_bytes = (uint64_t)1 << 40)
{
    gux_head_info_t info{};
    gser_status_t st = gux_head_parse_fixed(head.data(), head.size(), max_frames, &info);
    if (st)
        return st;
    std::vector<gux_head_frame_t> t(info.nframes);
    st = gux_head_parse_table(head.data(), head.size(), max_bytes, &info, t.data());
    if (!st && out)
        *out = t;
    return st;
}

gser_frame_t frame(const void *p, size_t n, gser_memory_t m = GSER_MEMORY_HOST)
{
    gser_frame_t f{};
    f.data = p;
    f.size = n;
    f.memory = m;
    return f;
}

TEST(Wire, HeadRoutesAndLayout)
{
    std::vector<unsigned char> hdr(37, 'h'), small(100, 's'), mid(5000, 'm'), big(20000, 'b');
    std::vector<gser_frame_t> f = {frame(hdr.data(), hdr.size()), frame(nullptr, 0),        frame(small.data(), 100),
                                   frame(big.data(), big.size()), frame(mid.data(), 5000), frame(mid.data(), 5000),
                                   frame(big.data(), 64, GSER_MEMORY_DEVICE)};
    gux_route_policy_t pol{8192, 6000, false, 0};
    Built b = build(f, pol, 77, 4096);
    // header and empty inline; 100 + 5000 fit the budget of 6000, the second 5000 does not.
    std::vector<uint8_t> want = {GUX_ROUTE_INLINE, GUX_ROUTE_INLINE, GUX_ROUTE_INLINE, GUX_ROUTE_TAG,
                                 GUX_ROUTE_INLINE, GUX_ROUTE_TAG,    GUX_ROUTE_STAGED};
    EXPECT_EQ(b.routes, want);
    std::vector<gux_head_frame_t> t;
    ASSERT_EQ(parse(b.head, &t), GSER_OK) << gser_ucx_get_last_error();
    ASSERT_EQ(t.size(), f.size());
    gux_head_info_t info{};
    ASSERT_EQ(gux_head_parse_fixed(b.head.data(), b.head.size(), 100, &info), GSER_OK);
    EXPECT_EQ(info.seq, 77u);
    EXPECT_EQ(info.chunk, 4096u);
    for (size_t i = 0; i < f.size(); i++) {
        EXPECT_EQ(t[i].size, f[i].size) << i;
        EXPECT_EQ(t[i].route, want[i]) << i;
        EXPECT_EQ(t[i].memory, (uint8_t)f[i].memory) << i;
        if (t[i].route == GUX_ROUTE_INLINE) {
            EXPECT_EQ(t[i].offset % GUX_HEAD_ALIGN, 0u) << i;
            if (f[i].size) {
                EXPECT_EQ(std::memcmp(b.head.data() + t[i].offset, f[i].data, f[i].size), 0) << i;
            }
        }
    }
    // With device-capable UCX on both sides device frames go as tag sends.
    pol.device_direct = true;
    EXPECT_EQ(build(f, pol).routes[6], GUX_ROUTE_TAG);
}

TEST(Wire, HeadPlanRejectsBadFrames)
{
    std::vector<unsigned char> hdr(8);
    gux_route_policy_t pol{8192, 65536, false, 0};
    uint8_t routes[2];
    size_t len;
    gser_frame_t dev = frame(hdr.data(), 8, GSER_MEMORY_DEVICE);
    EXPECT_EQ(gux_head_plan(&dev, 1, &pol, routes, &len), GSER_ERR_INVALID_ARG);
    gser_frame_t f[2] = {frame(hdr.data(), 8), frame(nullptr, 10)};
    EXPECT_EQ(gux_head_plan(f, 2, &pol, routes, &len), GSER_ERR_INVALID_ARG);
    f[1] = frame(hdr.data(), 8, (gser_memory_t)7);
    EXPECT_EQ(gux_head_plan(f, 2, &pol, routes, &len), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gux_head_plan(f, 0, &pol, routes, &len), GSER_ERR_INVALID_ARG);
}

TEST(Wire, HeadParseRejectsMalformed)
{
    std::vector<unsigned char> hdr(20, 'h'), big(30000, 'b'), small(10, 's');
    std::vector<gser_frame_t> f = {frame(hdr.data(), hdr.size()), frame(small.data(), 10), frame(big.data(), 30000)};
    Built b = build(f, {8192, 65536, false, 0});
    ASSERT_EQ(parse(b.head), GSER_OK);
    auto mut = [&](size_t off, unsigned char v) {
        auto h = b.head;
        h[off] = v;
        return parse(h);
    };
    const size_t t0 = GUX_HEAD_FIXED, e = GUX_HEAD_ENTRY;
    EXPECT_EQ(parse(std::vector<unsigned char>(b.head.begin(), b.head.begin() + 10)), GSER_ERR_TRUNCATED);
    EXPECT_EQ(mut(0, 'X'), GSER_ERR_BAD_MAGIC);
    EXPECT_EQ(mut(4, 9), GSER_ERR_WIRE_VERSION);
    EXPECT_EQ(mut(6, 1), GSER_ERR_FORMAT);           // flags
    EXPECT_EQ(mut(20, 1), GSER_ERR_FORMAT);          // reserved
    EXPECT_EQ(mut(8, 0), GSER_ERR_FORMAT);           // no frames
    EXPECT_EQ(mut(11, 0x10), GSER_ERR_LIMIT_FRAMES); // 2^28 + 3 frames
    EXPECT_EQ(parse(b.head, nullptr, 1), GSER_ERR_LIMIT_FRAMES);
    EXPECT_EQ(mut(8, 200), GSER_ERR_TRUNCATED);       // a table longer than the head
    EXPECT_EQ(mut(t0 + e + 8, 2), GSER_ERR_FORMAT);   // memory kind 2
    EXPECT_EQ(mut(t0 + e + 9, 4), GSER_ERR_FORMAT);   // route 4
    EXPECT_EQ(mut(t0 + 2 * e + 9, GUX_ROUTE_ZCHUNKED), GSER_ERR_COMPRESSED); // route 3 with codec 0
    EXPECT_EQ(mut(t0 + e + 10, 1), GSER_ERR_FORMAT);  // reserved bits
    EXPECT_EQ(mut(t0 + 8, 1), GSER_ERR_FORMAT);       // header in device memory
    EXPECT_EQ(mut(t0 + 9, GUX_ROUTE_TAG), GSER_ERR_FORMAT); // header not inline
    EXPECT_EQ(mut(t0 + e + 1, 1), GSER_ERR_TRUNCATED); // inline frame runs past the end
    EXPECT_EQ(mut(t0 + e, 9), GSER_ERR_FORMAT);        // ... or ends early
    EXPECT_EQ(mut(t0 + 2 * e + 9, GUX_ROUTE_STAGED), GSER_ERR_FORMAT); // staged with chunk 0
    EXPECT_EQ(parse(b.head, nullptr, 1000, 29999), GSER_ERR_LIMIT_BYTES);
    {
        auto h = b.head;
        std::memset(&h[t0 + 2 * e], 0, 8); // a tag frame of 0 bytes
        EXPECT_EQ(parse(h), GSER_ERR_FORMAT);
    }
    {
        auto h = b.head;
        std::memset(&h[t0 + 2 * e], 0xff, 8); // 2^64-1 bytes
        EXPECT_EQ(parse(h), GSER_ERR_LIMIT_BYTES);
    }
    auto h = b.head;
    h.push_back(0);
    EXPECT_EQ(parse(h), GSER_ERR_FORMAT); // trailing byte
    EXPECT_GE(gux_head_max(1000, 30000), b.head.size());
    EXPECT_EQ(gux_head_max(SIZE_MAX, UINT64_MAX - 5), UINT64_MAX);
}

// Random corruption of valid heads: every outcome is a status, and a head
// that parses describes frames inside its bytes (ASan checks the reads).
TEST(Wire, HeadParseSurvivesCorruption)
{
    std::mt19937 rng(1234);
    std::vector<unsigned char> data(3000);
    for (auto &c : data)
        c = (unsigned char)rng();
    for (int round = 0; round < 2000; round++) {
        size_t n = 1 + rng() % 6;
        std::vector<gser_frame_t> f;
        for (size_t i = 0; i < n; i++)
            f.push_back(frame(data.data() + rng() % 100, rng() % 1500));
        Built b = build(f, {1024, 2048, false, 0});
        size_t flips = 1 + rng() % 4;
        for (size_t k = 0; k < flips; k++)
            b.head[rng() % b.head.size()] ^= (unsigned char)(1u << (rng() % 8));
        if (rng() % 4 == 0)
            b.head.resize(rng() % (b.head.size() + 1));
        std::vector<gux_head_frame_t> t;
        if (parse(b.head, &t) == GSER_OK) {
            for (auto &e : t) {
                if (e.route == GUX_ROUTE_INLINE) {
                    ASSERT_LE(e.offset + e.size, b.head.size());
                }
            }
        }
    }
}

// Route 3 (compressed chunks): codec and chunk size in the entry, checked
// before anything is allocated; each chunk's flag byte and length.
TEST(Wire, ZchunkedEntries)
{
    std::vector<char> hdr(40, 'h');
    static char big;
    std::vector<gser_frame_t> f(2);
    f[0].data = hdr.data();
    f[0].size = hdr.size();
    f[1].data = &big;
    f[1].size = 9u << 20;
    Built b = build(f, {8192, 65536, false, 8u << 20});
    ASSERT_EQ(b.routes[1], GUX_ROUTE_ZCHUNKED);
    gux_head_set_zchunks(b.head.data(), 2, b.routes.data(), GSER_COMPRESSION_ZSTD, 1u << 20);
    std::vector<gux_head_frame_t> t;
    ASSERT_EQ(parse(b.head, &t), GSER_OK) << gser_ucx_get_last_error();
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[1].route, GUX_ROUTE_ZCHUNKED);
    EXPECT_EQ(t[1].codec, GSER_COMPRESSION_ZSTD);
    EXPECT_EQ(t[1].zchunk, 1u << 20);
    EXPECT_EQ(t[1].size, 9u << 20);
    const size_t e1 = GUX_HEAD_FIXED + GUX_HEAD_ENTRY;
    auto mut = [&](size_t at, unsigned char v) {
        auto h = b.head;
        h[at] = v;
        return parse(h);
    };
    EXPECT_EQ(mut(e1 + 8, 1), GSER_ERR_FORMAT);        // device memory
    EXPECT_EQ(mut(e1 + 10, 3), GSER_ERR_COMPRESSED);   // codec 3
    EXPECT_EQ(mut(e1 + 11, 1), GSER_ERR_COMPRESSED);   // codec 257
    EXPECT_EQ(mut(e1 + 14, 0), GSER_ERR_COMPRESSED);   // chunk of 0 bytes
    EXPECT_EQ(mut(e1 + 14, 0x80), GSER_ERR_COMPRESSED); // 8 MiB
    EXPECT_EQ(mut(e1 + 14, 0x40), GSER_OK);             // 4 MiB
    // a route-3 frame with the small policy stays a tag send
    Built small = build(f, {8192, 65536, false, 0});
    EXPECT_EQ(small.routes[1], GUX_ROUTE_TAG);

    unsigned char c[8] = {0};
    bool raw = false;
    EXPECT_EQ(gux_zchunk_check(c, 0, 1, 0, 2, 4, &raw), GSER_ERR_COMPRESSED); // empty
    EXPECT_EQ(gux_zchunk_check(c, 3, 1, 0, 2, 4, &raw), GSER_OK);             // 2 compressed bytes for 4
    EXPECT_FALSE(raw);
    EXPECT_EQ(gux_zchunk_check(c, 5, 1, 0, 2, 4, &raw), GSER_ERR_COMPRESSED); // compressed, not smaller
    c[0] = GUX_ZCHUNK_RAW;
    EXPECT_EQ(gux_zchunk_check(c, 5, 1, 0, 2, 4, &raw), GSER_OK);
    EXPECT_TRUE(raw);
    EXPECT_EQ(gux_zchunk_check(c, 4, 1, 0, 2, 4, &raw), GSER_ERR_COMPRESSED); // raw, short
    c[0] = GUX_ZCHUNK_LAST;
    EXPECT_EQ(gux_zchunk_check(c, 3, 1, 0, 2, 4, &raw), GSER_ERR_COMPRESSED); // last too early
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("frame 1, chunk 0"), std::string::npos);
    EXPECT_EQ(gux_zchunk_check(c, 3, 1, 1, 2, 4, &raw), GSER_OK);
    c[0] = 0;
    EXPECT_EQ(gux_zchunk_check(c, 3, 1, 1, 2, 4, &raw), GSER_ERR_COMPRESSED); // the last, unmarked
    c[0] = 4;
    EXPECT_EQ(gux_zchunk_check(c, 3, 1, 0, 2, 4, &raw), GSER_ERR_COMPRESSED); // unknown flag
}

} // namespace
