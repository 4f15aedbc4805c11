// Compressed frames: writing (sampling, codecs, wire versions), reading
// (decompression into owned frames, bounded sizes, hostile data), the
// flattened form and descriptors, and device frames that stay as they are.
#include <msgpack.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "common.hpp"

namespace {

constexpr size_t kBig = 1 << 20;

std::vector<int64_t> sorted_keys(size_t n)
{
    std::vector<int64_t> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (int64_t)(i / 3);
    return v;
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed = 7)
{
    std::mt19937_64 g(seed);
    std::vector<unsigned char> v(n);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = g();
        std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
    }
    return v;
}

// [big buffer, small buffer]: the small one is under the minimum size.
MsgPtr two_buffers(gser_context_t *ctx, const void *big, size_t nbig, const void *small, size_t nsmall,
                   gser_memory_t mem = GSER_MEMORY_HOST)
{
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    gser_value_t *root, *v;
    gser_msg_new_list(m, &root);
    for (auto [p, n] : {std::pair<const void *, size_t>{big, nbig}, {small, nsmall}}) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = p;
        d.nbytes = n;
        d.dtype = GSER_DTYPE_UINT8;
        d.memory = mem;
        EXPECT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK) << gser_context_get_last_error(ctx);
        gser_list_append(root, v);
    }
    gser_msg_set_root(m, root);
    return MsgPtr(m);
}

std::string buffer_bytes(gser_msg_t *m, size_t k)
{
    gser_value_t *e = nullptr;
    EXPECT_EQ(gser_list_get(gser_msg_get_root(m), k, &e), GSER_OK);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    EXPECT_EQ(gser_value_get_buffer(e, &d), GSER_OK);
    return std::string(static_cast<const char *>(d.data), d.nbytes);
}

FramesPtr serialize_with(gser_context_t *ctx, gser_msg_t *m, int compression, int level = 0)
{
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = compression;
    so.compression_level = level;
    return serialize(ctx, m, &so);
}

unsigned header_version(const gser_frames_t *f)
{
    return (unsigned char)header_bytes(f)[7];
}

// The header with its frame table rewritten by edit (msgpack-c unpacks it,
// edit changes the table, msgpack-c packs it again).
std::string retable(const std::string &hdr, const std::function<void(msgpack_object &table, msgpack_zone *)> &edit,
                    uint64_t version = 3)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    EXPECT_EQ(msgpack_unpack_next(&up, hdr.data(), hdr.size(), &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_object top = up.data;
    top.via.array.ptr[1].via.u64 = version;
    edit(top.via.array.ptr[3], up.zone);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, top);
    std::string out(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&up);
    return out;
}

// Frame table entry i (0-based data frame) field k.
msgpack_object &field(msgpack_object &table, size_t i, size_t k)
{
    return table.via.array.ptr[i].via.array.ptr[k];
}

struct Decoded {
    gser_status_t st;
    std::string err;
    MsgPtr msg;
};

Decoded decode(gser_context_t *ctx, const std::string &hdr, const std::vector<std::string> &data,
               const gser_limits_t *lim = nullptr, gser_memory_t mem = GSER_MEMORY_HOST)
{
    std::vector<gser_frame_t> fr(1 + data.size());
    fr[0] = gser_frame_t{};
    fr[0].data = hdr.data();
    fr[0].size = hdr.size();
    for (size_t i = 0; i < data.size(); i++) {
        fr[i + 1] = gser_frame_t{};
        fr[i + 1].data = data[i].data();
        fr[i + 1].size = data[i].size();
        fr[i + 1].memory = mem;
    }
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.limits = lim;
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize(ctx, fr.data(), fr.size(), &o, &m);
    return {st, gser_context_get_last_error(ctx), MsgPtr(st == GSER_OK ? m : nullptr)};
}

class Compress : public CtxTest {};

TEST_F(Compress, EachCodecRoundTripsAndShrinksCompressibleFrames)
{
    auto keys = sorted_keys(kBig / 8);
    std::string small(10, 'x');
    for (int c : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD, GSER_COMPRESSION_AUTO}) {
        SCOPED_TRACE(c);
        auto m = two_buffers(ctx(), keys.data(), kBig, small.data(), small.size());
        auto f = serialize_with(ctx(), m.get(), c, c == GSER_COMPRESSION_ZSTD ? 1 : 0);
        ASSERT_TRUE(f);
        // small buffers are inline; the big one is a frame of its own
        ASSERT_EQ(gser_frames_get_count(f.get()), 2u);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        EXPECT_LT(fr[1].size, kBig / 2) << "sorted keys compress well";
        EXPECT_NE(fr[1].data, (const void *)keys.data());
        EXPECT_EQ(header_version(f.get()), 3u) << "a compressed frame needs version 3";
        auto back = deserialize(ctx(), f.get());
        ASSERT_TRUE(back);
        EXPECT_EQ(buffer_bytes(back.get(), 0), std::string((const char *)keys.data(), kBig));
        EXPECT_EQ(buffer_bytes(back.get(), 1), small);
        size_t n = 0;
        const gser_frame_t *got = gser_msg_get_frames(back.get(), &n);
        ASSERT_EQ(n, 2u);
        EXPECT_EQ(got[1].size, kBig) << "the message holds the decompressed frame";
        EXPECT_EQ((uintptr_t)got[1].data % 64, 0u);
        int codec = -1;
        size_t wire = 0;
        ASSERT_EQ(gser_msg_get_frame_codec(back.get(), 1, &codec, &wire), GSER_OK);
        EXPECT_EQ(codec, c == GSER_COMPRESSION_ZSTD ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4);
        EXPECT_EQ(wire, fr[1].size);
        ASSERT_EQ(gser_msg_get_frame_codec(back.get(), 0, &codec, &wire), GSER_OK);
        EXPECT_EQ(codec, GSER_COMPRESSION_NONE);
        EXPECT_EQ(gser_msg_get_frame_codec(back.get(), 2, &codec, &wire), GSER_ERR_OUT_OF_RANGE);
    }
}

TEST_F(Compress, NoneWritesTodaysBytes)
{
    auto keys = sorted_keys(kBig / 8);
    std::string small(1000, 'x');
    auto m = two_buffers(ctx(), keys.data(), kBig, small.data(), small.size());
    auto plain = serialize(ctx(), m.get());
    auto none = serialize_with(ctx(), m.get(), GSER_COMPRESSION_NONE);
    ASSERT_TRUE(plain && none);
    EXPECT_EQ(header_bytes(plain.get()), header_bytes(none.get()));
    EXPECT_EQ(header_version(none.get()), 2u);
    EXPECT_EQ(gser_frames_get_array(none.get())[1].data, (const void *)keys.data()) << "still zero-copy";
}

TEST_F(Compress, AutoLeavesIncompressibleAndSmallFramesAlone)
{
    auto rnd = random_bytes(kBig);
    std::string below(GSER_COMPRESS_MIN_SIZE - 1, 'a'); // compressible but under the minimum
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = GSER_COMPRESSION_AUTO;
    so.inline_max = 16; // both buffers in frames
    for (int c : {GSER_COMPRESSION_AUTO, GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        so.compression = c;
        auto m = two_buffers(ctx(), rnd.data(), rnd.size(), below.data(), below.size());
        auto f = serialize(ctx(), m.get(), &so);
        ASSERT_TRUE(f);
        ASSERT_EQ(gser_frames_get_count(f.get()), 3u);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        EXPECT_EQ(fr[1].data, (const void *)rnd.data()) << c;
        EXPECT_EQ(fr[1].size, rnd.size());
        EXPECT_EQ(fr[2].data, (const void *)below.data());
        EXPECT_EQ(header_version(f.get()), 2u) << "nothing compressed: the version-2 wire";
    }
}

TEST_F(Compress, AFrameThatOnlyLooksCompressibleInTheSampleIsKeptWhole)
{
    // compressible where the samples fall, random elsewhere: the sample says
    // yes, the whole frame says no, and the frame is sent as it is
    auto rnd = random_bytes(kBig);
    size_t step = (kBig - GSER_COMPRESS_SAMPLE_SIZE) / (GSER_COMPRESS_NSAMPLES - 1);
    for (size_t k = 0; k < GSER_COMPRESS_NSAMPLES; k++)
        std::memset(&rnd[k * step], 0, GSER_COMPRESS_SAMPLE_SIZE);
    std::string small(10, 's');
    auto m = two_buffers(ctx(), rnd.data(), rnd.size(), small.data(), small.size());
    auto f = serialize_with(ctx(), m.get(), GSER_COMPRESSION_LZ4);
    ASSERT_TRUE(f);
    EXPECT_EQ(gser_frames_get_array(f.get())[1].data, (const void *)rnd.data());
    EXPECT_EQ(header_version(f.get()), 2u);
}

// Random bytes at the given sample pieces of a frame of n bytes (k of
// GSER_COMPRESS_NSAMPLES evenly spread, as sample_pays takes them; the
// middle one, k = 2, is also the one piece of a frame of up to
// GSER_COMPRESS_SAMPLE_WHOLE), zeros elsewhere.
std::vector<unsigned char> random_at(size_t n, std::initializer_list<size_t> pieces)
{
    std::vector<unsigned char> v(n, 0);
    auto rnd = random_bytes(GSER_COMPRESS_SAMPLE_SIZE * GSER_COMPRESS_NSAMPLES);
    size_t step = (n - GSER_COMPRESS_SAMPLE_SIZE) / (GSER_COMPRESS_NSAMPLES - 1);
    for (size_t k : pieces)
        std::memcpy(&v[k * step], &rnd[k * GSER_COMPRESS_SAMPLE_SIZE], GSER_COMPRESS_SAMPLE_SIZE);
    return v;
}

TEST_F(Compress, FramesUpToSampleWholeAreJudgedByTheirMiddleAndLargerOnesByFiveSamples)
{
    // Up to GSER_COMPRESS_SAMPLE_WHOLE bytes the sample is one piece from
    // the middle: random at the other four places, the frame is compressed
    // (it shrinks to about a quarter); one byte more, random at all five,
    // and the five samples say no.
    std::string small(10, 's');
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        for (size_t n : {(size_t)GSER_COMPRESS_SAMPLE_WHOLE, (size_t)GSER_COMPRESS_SAMPLE_WHOLE + 1}) {
            SCOPED_TRACE(std::to_string(codec) + " " + std::to_string(n));
            auto v = n > GSER_COMPRESS_SAMPLE_WHOLE ? random_at(n, {0, 1, 2, 3, 4}) : random_at(n, {0, 1, 3, 4});
            auto m = two_buffers(ctx(), v.data(), n, small.data(), small.size());
            auto f = serialize_with(ctx(), m.get(), codec);
            ASSERT_TRUE(f);
            const gser_frame_t *fr = gser_frames_get_array(f.get());
            if (n > GSER_COMPRESS_SAMPLE_WHOLE) {
                EXPECT_EQ(fr[1].data, (const void *)v.data()) << "sampled: the samples are random";
                EXPECT_EQ(header_version(f.get()), 2u);
                continue;
            }
            EXPECT_LT(fr[1].size, n / 3) << "compressed whole";
            EXPECT_EQ(header_version(f.get()), 3u);
            auto back = deserialize(ctx(), f.get());
            ASSERT_TRUE(back);
            EXPECT_EQ(buffer_bytes(back.get(), 0), std::string((const char *)v.data(), n));
        }
        // random only in the middle: the one piece says no (though the
        // whole would shrink), and a frame that shrinks nowhere costs that
        // piece, not its whole compression
        auto v = random_at(GSER_COMPRESS_SAMPLE_WHOLE, {2});
        auto m = two_buffers(ctx(), v.data(), v.size(), small.data(), small.size());
        auto f = serialize_with(ctx(), m.get(), codec);
        ASSERT_TRUE(f);
        EXPECT_EQ(gser_frames_get_array(f.get())[1].data, (const void *)v.data()) << codec;
    }
    // and a frame of that size that only looks compressible where its
    // piece falls is still sent as it is: its own compression decides
    auto rnd = random_bytes(GSER_COMPRESS_SAMPLE_WHOLE);
    size_t step = (rnd.size() - GSER_COMPRESS_SAMPLE_SIZE) / (GSER_COMPRESS_NSAMPLES - 1);
    for (size_t k = 0; k < GSER_COMPRESS_NSAMPLES; k++)
        std::memset(&rnd[k * step], 0, GSER_COMPRESS_SAMPLE_SIZE / 4);
    auto m = two_buffers(ctx(), rnd.data(), rnd.size(), small.data(), small.size());
    auto f = serialize_with(ctx(), m.get(), GSER_COMPRESSION_ZSTD);
    ASSERT_TRUE(f);
    EXPECT_EQ(gser_frames_get_array(f.get())[1].data, (const void *)rnd.data());
    EXPECT_EQ(header_version(f.get()), 2u);
}

TEST_F(Compress, TheThresholdDecidesFrameByFrame)
{
    // a counter shrinks to about half with lz4, zeros to almost nothing
    std::vector<int64_t> counter(kBig / 8);
    for (size_t i = 0; i < counter.size(); i++)
        counter[i] = (int64_t)i;
    std::string zeros(kBig, '\0');
    for (double threshold : {0.0, 0.9, 0.3}) {
        auto m = two_buffers(ctx(), counter.data(), kBig, zeros.data(), zeros.size());
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.compression = GSER_COMPRESSION_LZ4;
        so.compression_threshold = threshold;
        auto f = serialize(ctx(), m.get(), &so);
        ASSERT_TRUE(f);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        EXPECT_LT(fr[2].size, kBig / 50) << threshold << ": zeros are compressed at any threshold";
        if (threshold == 0.3) {
            EXPECT_EQ(fr[1].data, (const void *)counter.data()) << "the counter travels as it is";
            EXPECT_EQ(fr[1].size, kBig);
        } else {
            EXPECT_GT(fr[1].size, kBig / 4) << threshold;
            EXPECT_LT(fr[1].size, kBig * 9 / 10) << threshold << ": the default (0.9) compresses the counter";
        }
        // kept alive: the decoded message borrows the frames that came uncompressed
        std::vector<std::string> data{std::string((const char *)fr[1].data, fr[1].size),
                                      std::string((const char *)fr[2].data, fr[2].size)};
        auto d = decode(ctx(), header_bytes(f.get()), data);
        ASSERT_EQ(d.st, GSER_OK) << d.err;
        EXPECT_TRUE(buffer_bytes(d.msg.get(), 0) == std::string((const char *)counter.data(), kBig)) << threshold;
        EXPECT_TRUE(buffer_bytes(d.msg.get(), 1) == zeros) << threshold;
    }
}

TEST_F(Compress, ACallerFromBeforeTheThresholdGetsTheDefault)
{
    // the caller's struct ends where compression_threshold begins: under
    // AddressSanitizer a read of the field would fault
    std::vector<int64_t> counter(kBig / 8);
    for (size_t i = 0; i < counter.size(); i++)
        counter[i] = (int64_t)i;
    std::string small(10, 's');
    auto m = two_buffers(ctx(), counter.data(), kBig, small.data(), small.size());
    gser_serialize_options_t full = GSER_SERIALIZE_OPTIONS_INIT;
    full.compression = GSER_COMPRESSION_LZ4;
    size_t bytes = offsetof(gser_serialize_options_t, compression_threshold);
    std::unique_ptr<unsigned char, decltype(&std::free)> old(static_cast<unsigned char *>(std::malloc(bytes)),
                                                             &std::free);
    std::memcpy(old.get(), &full, bytes);
    std::memcpy(old.get(), &bytes, sizeof bytes);
    gser_frames_t *f = nullptr;
    ASSERT_EQ(gser_serialize(ctx(), m.get(), reinterpret_cast<const gser_serialize_options_t *>(old.get()), &f),
              GSER_OK)
        << gser_context_get_last_error(ctx());
    FramesPtr fp(f);
    EXPECT_LT(gser_frames_get_array(f)[1].size, kBig * 9 / 10) << "compressed at the default 0.9";
}

TEST_F(Compress, BadOptionsAreRefused)
{
    std::string small(10, 's');
    auto m = two_buffers(ctx(), small.data(), small.size(), small.data(), small.size());
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    gser_frames_t *f = nullptr;
    so.compression = 9;
    GSER_EXPECT(ctx(), GSER_ERR_INVALID_ARG, gser_serialize(ctx(), m.get(), &so, &f));
    so.compression = GSER_COMPRESSION_ZSTD;
    so.compression_level = 1000;
    GSER_EXPECT(ctx(), GSER_ERR_INVALID_ARG, gser_serialize(ctx(), m.get(), &so, &f));
    so.compression_level = 0;
    for (double t : {-0.5, 1.5, std::nan("")}) {
        so.compression_threshold = t;
        GSER_EXPECT(ctx(), GSER_ERR_INVALID_ARG, gser_serialize(ctx(), m.get(), &so, &f));
        EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("compression_threshold"), std::string::npos);
    }
    EXPECT_EQ(f, nullptr);
}

// A compressed message's header and frames, for the hostile cases.
struct Sample {
    std::string hdr;
    std::vector<std::string> data;
    std::string raw;
};

Sample compressed_sample(gser_context_t *ctx, int codec)
{
    auto keys = sorted_keys(kBig / 8);
    std::string small(10, 's');
    auto m = two_buffers(ctx, keys.data(), kBig, small.data(), small.size());
    auto f = serialize_with(ctx, m.get(), codec);
    const gser_frame_t *fr = gser_frames_get_array(f.get());
    Sample s;
    s.hdr = header_bytes(f.get());
    s.data.emplace_back((const char *)fr[1].data, fr[1].size);
    s.raw.assign((const char *)keys.data(), kBig);
    return s;
}

TEST_F(Compress, HostileCompressedFramesGetSpecificErrorsNamingTheFrame)
{
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        SCOPED_TRACE(codec);
        Sample s = compressed_sample(ctx(), codec);
        ASSERT_TRUE(decode(ctx(), s.hdr, s.data).msg) << "the sample itself reads";
        const uint64_t raw = kBig, size = s.data[0].size();
        auto with = [&](uint64_t new_size, uint64_t new_raw) {
            return retable(s.hdr, [&](msgpack_object &t, msgpack_zone *) {
                field(t, 0, 0).via.u64 = new_size;
                field(t, 0, 4).via.u64 = new_raw;
            });
        };
        struct Case {
            const char *name;
            std::string hdr;
            std::string data;
            gser_status_t st;
            const char *says;
        };
        std::string garbage(size, '\xff');
        std::string cut = s.data[0].substr(0, size - 16);
        std::vector<Case> cases = {
            {"garbage data", s.hdr, garbage, GSER_ERR_COMPRESSED, "frame 1"},
            {"truncated data", with(cut.size(), raw), cut, GSER_ERR_COMPRESSED, "frame 1"},
            {"declared one byte more", with(size, raw + 1), s.data[0], GSER_ERR_COMPRESSED, "frame 1"},
            {"declared one byte less", with(size, raw - 1), s.data[0], GSER_ERR_COMPRESSED, "frame 1"},
            {"declared half", with(size, raw / 2), s.data[0], GSER_ERR_COMPRESSED, "frame 1"},
            // over the limit: refused before any allocation (2^50 bytes could not be allocated)
            {"declared a petabyte", with(size, 1ull << 50), s.data[0], GSER_ERR_LIMIT_BYTES, "frame 1 declares"},
        };
        if (codec == GSER_COMPRESSION_LZ4)
            cases.push_back({"more than lz4 can make", with(size, size * 255 + 1), s.data[0], GSER_ERR_COMPRESSED,
                             "more than lz4 can produce"});
        for (auto &c : cases) {
            SCOPED_TRACE(c.name);
            Decoded d = decode(ctx(), c.hdr, {c.data});
            EXPECT_EQ(d.st, c.st) << d.err;
            EXPECT_NE(d.err.find(c.says), std::string::npos) << d.err;
        }
        // a limit of the message's own size minus one: refused up front
        gser_limits_t lim = GSER_LIMITS_INIT;
        lim.max_bytes = s.hdr.size() + raw - 1;
        Decoded d = decode(ctx(), s.hdr, s.data, &lim);
        EXPECT_EQ(d.st, GSER_ERR_LIMIT_BYTES) << d.err;
        lim.max_bytes = s.hdr.size() + raw;
        EXPECT_EQ(decode(ctx(), s.hdr, s.data, &lim).st, GSER_OK) << "exactly at the limit";
        // a compressed frame in device memory, as given
        d = decode(ctx(), s.hdr, s.data, nullptr, GSER_MEMORY_DEVICE);
        EXPECT_EQ(d.st, GSER_ERR_FRAME) << d.err;
    }
}

TEST_F(Compress, MalformedCompressedEntriesAreFormatErrors)
{
    Sample s = compressed_sample(ctx(), GSER_COMPRESSION_LZ4);
    struct Case {
        const char *name;
        std::string hdr;
        gser_status_t st;
    };
    std::vector<Case> cases = {
        {"unknown codec", retable(s.hdr, [](msgpack_object &t, msgpack_zone *) { field(t, 0, 3).via.u64 = 7; }),
         GSER_ERR_FORMAT},
        {"zero uncompressed size",
         retable(s.hdr, [](msgpack_object &t, msgpack_zone *) { field(t, 0, 4).via.u64 = 0; }), GSER_ERR_FORMAT},
        {"device memory", retable(s.hdr, [](msgpack_object &t, msgpack_zone *) { field(t, 0, 1).via.u64 = 1; }),
         GSER_ERR_FORMAT},
        {"four fields", retable(s.hdr, [](msgpack_object &t, msgpack_zone *) { t.via.array.ptr[0].via.array.size = 4; }),
         GSER_ERR_FORMAT},
        // read as version 2, the root's reference is past the compressed frame's end
        {"a version-2 header", retable(s.hdr, [](msgpack_object &, msgpack_zone *) {}, 2), GSER_ERR_FRAME},
        {"version 4", retable(s.hdr, [](msgpack_object &, msgpack_zone *) {}, 4), GSER_ERR_WIRE_VERSION},
        {"codec as a string",
         retable(s.hdr,
                 [](msgpack_object &t, msgpack_zone *) {
                     field(t, 0, 3).type = MSGPACK_OBJECT_STR;
                     field(t, 0, 3).via.str = {3, "lz4"};
                 }),
         GSER_ERR_FORMAT},
    };
    for (auto &c : cases) {
        SCOPED_TRACE(c.name);
        Decoded d = decode(ctx(), c.hdr, s.data);
        EXPECT_EQ(d.st, c.st) << d.err;
    }
    // every cut of the header is refused, none crashes
    for (size_t n = 0; n < s.hdr.size(); n++)
        EXPECT_NE(decode(ctx(), s.hdr.substr(0, n), s.data).st, GSER_OK) << n;
}

TEST_F(Compress, OlderVersionsAndPlainVersion3HeadersStillRead)
{
    auto keys = sorted_keys(kBig / 8);
    std::string small(10, 's');
    auto m = two_buffers(ctx(), keys.data(), kBig, small.data(), small.size());
    auto f = serialize(ctx(), m.get());
    std::string hdr = header_bytes(f.get());
    std::string data((const char *)keys.data(), kBig);
    std::vector<std::string> frames{data}; // the message views them: they outlive it
    for (uint64_t v : {1u, 2u, 3u}) {
        std::string h = retable(hdr, [](msgpack_object &, msgpack_zone *) {}, v);
        Decoded d = decode(ctx(), h, frames);
        ASSERT_EQ(d.st, GSER_OK) << v << ": " << d.err;
        EXPECT_EQ(buffer_bytes(d.msg.get(), 0), data);
        EXPECT_EQ(buffer_bytes(d.msg.get(), 1), small);
    }
}

int g_released = 0;
void count_release(void *, void *) { g_released++; }

TEST_F(Compress, AHandedOverCompressedFrameIsReleasedOnSuccessOnly)
{
    Sample s = compressed_sample(ctx(), GSER_COMPRESSION_ZSTD);
    gser_frame_t fr[2] = {};
    fr[0].data = s.hdr.data();
    fr[0].size = s.hdr.size();
    fr[1].data = s.data[0].data();
    fr[1].size = s.data[0].size();
    fr[1].release = count_release;
    g_released = 0;
    std::string bad(s.data[0].size(), '\0');
    gser_frame_t badfr[2] = {fr[0], fr[1]};
    badfr[1].data = bad.data();
    gser_msg_t *m = nullptr;
    EXPECT_NE(gser_deserialize(ctx(), badfr, 2, nullptr, &m), GSER_OK);
    EXPECT_EQ(g_released, 0) << "the caller keeps it on failure";
    ASSERT_EQ(gser_deserialize(ctx(), fr, 2, nullptr, &m), GSER_OK) << gser_context_get_last_error(ctx());
    EXPECT_EQ(g_released, 1) << "decompressed, so no longer needed";
    EXPECT_EQ(buffer_bytes(m, 0), s.raw);
    gser_msg_destroy(m);
    EXPECT_EQ(g_released, 1);
}

// A message whose root is a list of two uint8 buffers of n bytes each.
MsgPtr two_buffers(gser_context_t *ctx, const void *a, const void *b, size_t n)
{
    gser_msg_t *m = nullptr;
    if (gser_msg_create(ctx, &m) != GSER_OK)
        return nullptr;
    MsgPtr mp(m);
    gser_value_t *root, *v;
    gser_msg_new_list(m, &root);
    for (const void *p : {a, b}) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = p;
        d.nbytes = n;
        d.dtype = GSER_DTYPE_UINT8;
        gser_msg_new_buffer(m, &d, &v);
        gser_list_append(root, v);
    }
    gser_msg_set_root(m, root);
    return mp;
}

TEST_F(Compress, FlattenedFormsAndDescriptorsCarryCompressedFrames)
{
    auto keys = sorted_keys(kBig / 8);
    auto rnd = random_bytes(kBig);
    MsgPtr mp = two_buffers(ctx(), keys.data(), rnd.data(), kBig);
    ASSERT_TRUE(mp);
    gser_msg_t *m = mp.get();
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        auto f = serialize_with(ctx(), m, codec);
        ASSERT_TRUE(f);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        ASSERT_LT(fr[1].size, kBig);
        ASSERT_EQ(fr[2].size, kBig) << "the random frame stays as it is";
        auto flat = flatten(f.get());
        gser_msg_t *back = nullptr;
        ASSERT_EQ(gser_deserialize_flat(ctx(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &back), GSER_OK)
            << gser_context_get_last_error(ctx());
        EXPECT_EQ(buffer_bytes(back, 0), std::string((const char *)keys.data(), kBig));
        EXPECT_EQ(buffer_bytes(back, 1), std::string((const char *)rnd.data(), kBig));
        gser_msg_destroy(back);

        FILE *tf = tmpfile();
        ASSERT_TRUE(tf);
        int fd = fileno(tf);
        ASSERT_EQ(gser_flat_write_fd(fr, gser_frames_get_count(f.get()), fd), GSER_OK);
        for (unsigned flags : {0u, (unsigned)GSER_DESERIALIZE_MMAP}) {
            SCOPED_TRACE(flags);
            ASSERT_EQ(lseek(fd, 0, SEEK_SET), 0);
            gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
            o.flags = flags;
            ASSERT_EQ(gser_deserialize_fd(ctx(), fd, &o, &back), GSER_OK) << gser_context_get_last_error(ctx());
            EXPECT_EQ(buffer_bytes(back, 0), std::string((const char *)keys.data(), kBig));
            EXPECT_EQ(buffer_bytes(back, 1), std::string((const char *)rnd.data(), kBig));
            size_t n = 0;
            const gser_frame_t *got = gser_msg_get_frames(back, &n);
            ASSERT_EQ(n, 3u);
            EXPECT_NE(got[1].release, nullptr) << "the decompressed frame is the message's own";
            // the uncompressed frame still views what was read or mapped, as the header does
            EXPECT_EQ(got[2].release, nullptr);
            EXPECT_GT((const char *)got[2].data, (const char *)got[0].data);
            EXPECT_LT((size_t)((const char *)got[2].data - (const char *)got[0].data), flat.size());
            gser_msg_destroy(back);
        }
        fclose(tf);
    }
}

// A file read by gser hands back the whole huge pages of a compressed
// frame's bytes once the frame is decompressed: the message keeps the read
// buffer for the frames that view it, and would otherwise hold the frame
// twice. Huge pages, not pages: the buffer is advised for them and
// recycled, and a huge page cut at the frame's ends is refaulted 4 KiB at a
// time when the memory is used again.
TEST_F(Compress, AFileReadGivesBackTheHugePagesOfItsCompressedFrames)
{
    const size_t kHalf = 16u << 20, kHuge = 2u << 20;
    // 32 random bytes, then 32 zeros: compresses to about half, so the
    // compressed frame spans several whole huge pages.
    auto rnd = random_bytes(kHalf);
    std::vector<unsigned char> half(kHalf, 0);
    for (size_t i = 0; i < kHalf; i += 64)
        std::memcpy(&half[i], &rnd[i], 32);
    MsgPtr mp = two_buffers(ctx(), half.data(), rnd.data(), kHalf);
    ASSERT_TRUE(mp);
    gser_msg_t *m = mp.get();
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        SCOPED_TRACE(codec);
        auto f = serialize_with(ctx(), m, codec);
        ASSERT_TRUE(f);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        ASSERT_LT(fr[1].size, kHalf * 9 / 10);
        ASSERT_EQ(fr[2].size, kHalf) << "the random frame stays as it is";
        FILE *tf = tmpfile();
        ASSERT_TRUE(tf);
        int fd = fileno(tf);
        ASSERT_EQ(gser_flat_write_fd(fr, gser_frames_get_count(f.get()), fd), GSER_OK);
        ASSERT_EQ(lseek(fd, 0, SEEK_SET), 0);
        gser_msg_t *back = nullptr;
        ASSERT_EQ(gser_deserialize_fd(ctx(), fd, nullptr, &back), GSER_OK) << gser_context_get_last_error(ctx());
        MsgPtr bp(back);
        fclose(tf);
        EXPECT_EQ(buffer_bytes(back, 0), std::string((const char *)half.data(), kHalf));
        EXPECT_EQ(buffer_bytes(back, 1), std::string((const char *)rnd.data(), kHalf));
        size_t n = 0;
        const gser_frame_t *got = gser_msg_get_frames(back, &n);
        ASSERT_EQ(n, 3u);
        ASSERT_EQ(got[2].release, nullptr) << "the uncompressed frame views the read buffer, as the header does";
        // The compressed bytes read lie between the header and the random frame.
        uintptr_t lo = ((uintptr_t)got[0].data + got[0].size + kHuge - 1) & ~(uintptr_t)(kHuge - 1);
        uintptr_t hi = (uintptr_t)got[2].data & ~(uintptr_t)(kHuge - 1);
        ASSERT_GE(hi, lo + kHuge) << "the compressed frame spans whole huge pages";
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        std::vector<unsigned char> in((hi - lo) / pg);
        ASSERT_EQ(mincore((void *)lo, hi - lo, in.data()), 0) << strerror(errno);
        size_t resident = 0;
        for (unsigned char c : in)
            resident += c & 1;
        EXPECT_EQ(resident, 0u) << "of " << in.size() << " pages of compressed bytes";
    }
}

// Pages of [lo, hi) in memory (mincore), lo and hi rounded inwards to pages.
size_t resident_pages(const void *from, const void *to)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)from + pg - 1) / pg * pg, hi = (uintptr_t)to / pg * pg;
    if (hi <= lo)
        return 0;
    std::vector<unsigned char> in((hi - lo) / pg);
    EXPECT_EQ(mincore((void *)lo, hi - lo, in.data()), 0) << strerror(errno);
    size_t n = 0;
    for (unsigned char c : in)
        n += c & 1;
    return n;
}

TEST_F(Compress, DecompressedFramesOfAFewMiBReuseMemoryAlreadyFaultedIn)
{
    // A message received in 4 MiB parts decompresses each into a buffer of
    // its own: those must come back already faulted in for the next message
    // (the heap's thread arenas gave them back to the kernel every time).
    const size_t n = 6u << 20;
    auto keys = sorted_keys(n / 8);
    std::string small(10, 's');
    auto m = two_buffers(ctx(), keys.data(), n, small.data(), small.size());
    gser_bigbuf_stats_reset();
    auto f = serialize_with(ctx(), m.get(), GSER_COMPRESSION_LZ4);
    ASSERT_TRUE(f);
    const gser_frame_t *fr = gser_frames_get_array(f.get());
    ASSERT_LT(fr[1].size, n / 2);
    std::vector<std::string> data;
    for (size_t i = 1; i < gser_frames_get_count(f.get()); i++)
        data.emplace_back((const char *)fr[i].data, fr[i].size);
    std::string hdr = header_bytes(f.get());
    f.reset();
    gser_bigbuf_stats_t st;
    gser_bigbuf_stats_get(&st);
    ASSERT_EQ(st.mapped, 1u) << "the compressed frame's buffer";
    gser_bigbuf_stats_reset(); // and its mapping
    for (int round = 0; round < 3; round++) {
        SCOPED_TRACE(round);
        Decoded d = decode(ctx(), hdr, data);
        ASSERT_EQ(d.st, GSER_OK) << d.err;
        EXPECT_EQ(buffer_bytes(d.msg.get(), 0), std::string((const char *)keys.data(), n));
        gser_bigbuf_stats_get(&st);
        EXPECT_EQ(st.mapped, 1u) << "mapped once, for the first message";
        EXPECT_EQ(st.reused, (size_t)round);
    }
    // That buffer, now kept and faulted in, serves a smaller frame's
    // compression: its pages past the compressed bytes are given back (the
    // frame may be held long).
    auto m5 = two_buffers(ctx(), keys.data(), n - (1u << 20), small.data(), small.size());
    auto g = serialize_with(ctx(), m5.get(), GSER_COMPRESSION_LZ4);
    ASSERT_TRUE(g);
    gser_bigbuf_stats_get(&st);
    EXPECT_EQ(st.mapped, 1u);
    EXPECT_EQ(st.reused, 3u);
    const gser_frame_t *gr = gser_frames_get_array(g.get());
    ASSERT_LT(gr[1].size, n / 2);
    const char *at = (const char *)gr[1].data;
    EXPECT_GT(resident_pages(at, at + gr[1].size), 0u);
    EXPECT_EQ(resident_pages(at + gr[1].size, at + n - (1u << 20)), 0u) << "past the compressed bytes";
}

// The size of a zstd frame's header (RFC 8878 3.1.1): where its first block
// starts; SIZE_MAX where f is no zstd frame.
size_t zstd_header_size(const std::string &f)
{
    if (f.size() < 5 || (unsigned char)f[0] != 0x28 || (unsigned char)f[1] != 0xb5 || (unsigned char)f[2] != 0x2f ||
        (unsigned char)f[3] != 0xfd)
        return SIZE_MAX;
    unsigned fhd = (unsigned char)f[4];
    bool single = fhd >> 5 & 1;
    static const size_t did[4] = {0, 1, 2, 4}, fcs[4] = {0, 2, 4, 8};
    return 5 + (single ? 0 : 1) + did[fhd & 3] + ((fhd >> 6) == 0 ? (single ? 1 : 0) : fcs[fhd >> 6]);
}

// zstd's contexts are kept per thread for the next frame: a context used
// at one level and size compresses right at another, one that read corrupt
// data reads the next frame right, threads at it at once keep to their own,
// and a thread's contexts go with it (LeakSanitizer checks, in CI).
TEST(CompressThreads, ZstdContextsKeptPerThreadServeEveryLevelSizeAndError)
{
    auto work = [](unsigned seed, std::string *fail) {
        auto ctx = make_ctx();
        std::string small(10, 's');
        for (int round = 0; round < 6; round++) {
            const size_t n = (round % 2 ? kBig : kBig / 8) + seed * 8;
            std::vector<int64_t> keys = sorted_keys(n / 8);
            keys[(size_t)round] = (int64_t)seed; // each thread's data its own
            auto m = two_buffers(ctx.get(), keys.data(), n, small.data(), small.size());
            auto f = serialize_with(ctx.get(), m.get(), GSER_COMPRESSION_ZSTD, round % 3 == 2 ? 19 : round % 3 + 1);
            if (!f || gser_frames_get_count(f.get()) != 2) {
                *fail = "serialize, round " + std::to_string(round);
                return;
            }
            const gser_frame_t *fr = gser_frames_get_array(f.get());
            std::string hdr = header_bytes(f.get()), good((const char *)fr[1].data, fr[1].size), bad = good;
            // the first block's type set to the reserved one (zstd has no
            // checksum here: changed literals would read as other data)
            size_t at = zstd_header_size(good);
            if (at >= bad.size()) {
                *fail = "no zstd frame header, round " + std::to_string(round);
                return;
            }
            bad[at] = (char)(bad[at] | 0x06);
            Decoded d = decode(ctx.get(), hdr, {bad});
            if (d.st != GSER_ERR_COMPRESSED) {
                *fail = "corrupt data read as " + std::string(gser_status_str(d.st)) + ", round " + std::to_string(round);
                return;
            }
            d = decode(ctx.get(), hdr, {good});
            if (d.st != GSER_OK || buffer_bytes(d.msg.get(), 0) != std::string((const char *)keys.data(), n)) {
                *fail = "round " + std::to_string(round) + ": " + d.err;
                return;
            }
        }
    };
    std::vector<std::string> fails(4);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < fails.size(); t++)
        threads.emplace_back(work, t + 1, &fails[t]);
    for (auto &t : threads)
        t.join();
    for (unsigned t = 0; t < fails.size(); t++)
        EXPECT_EQ(fails[t], "") << "thread " << t;
    std::string here; // and this thread, after them
    work(9, &here);
    EXPECT_EQ(here, "");
}

TEST(CompressDevice, DeviceAndStagedFramesAreNeverCompressed)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = "emulated";
    o.pack_max = 256;
    gser_context_t *c = nullptr;
    ASSERT_EQ(gser_context_create(&o, &c), GSER_OK) << gser_context_get_last_error(nullptr);
    CtxPtr ctx(c);
    void *dev = nullptr;
    ASSERT_EQ(gser_device_alloc(c, kBig, nullptr, &dev), GSER_OK);
    std::string zeros(kBig, '\0');
    ASSERT_EQ(gser_device_memcpy(c, dev, GSER_MEMORY_DEVICE, zeros.data(), GSER_MEMORY_HOST, kBig, nullptr), GSER_OK)
        << gser_context_get_last_error(c);
    ASSERT_EQ(gser_stream_wait(c, nullptr), GSER_OK);
    std::string small(10, 's');
    for (const char *family : {"device", "host"}) {
        SCOPED_TRACE(family);
        gser_msg_t *m = nullptr;
        ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *v;
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = dev;
        d.nbytes = kBig;
        d.dtype = GSER_DTYPE_UINT8;
        d.memory = GSER_MEMORY_DEVICE;
        ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
        gser_msg_set_root(m, v);
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.families = &family;
        so.nfamilies = 1;
        so.compression = GSER_COMPRESSION_AUTO;
        auto f = serialize(c, m, &so);
        ASSERT_TRUE(f);
        ASSERT_EQ(gser_frames_wait(f.get()), GSER_OK);
        ASSERT_EQ(gser_frames_get_count(f.get()), 2u);
        EXPECT_EQ(gser_frames_get_array(f.get())[1].size, kBig) << "zeros, yet left as they are";
        EXPECT_EQ(header_version(f.get()), 2u);
        if (std::string(family) == "device") {
            EXPECT_EQ(gser_frames_get_array(f.get())[1].data, dev);
        }
    }
    gser_device_free(c, dev, kBig, nullptr);
}

// ---- frames compressed in chunks (codecs 3 and 4) ----

constexpr size_t kChunk = 256 << 10;

// 3 MiB: zeros, random bytes, sorted keys, 1 MiB each, so that with
// kChunk the random third's 4 chunks cannot shrink and the other 8 do.
std::string mixed_frame()
{
    auto keys = sorted_keys(kBig / 8);
    auto noise = random_bytes(kBig);
    return std::string(kBig, '\0') + std::string((const char *)noise.data(), kBig) +
           std::string((const char *)keys.data(), kBig);
}

FramesPtr serialize_chunked(gser_context_t *ctx, gser_msg_t *m, int codec, size_t chunk, double threshold = 0)
{
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = codec;
    so.compression_chunk_size = chunk;
    so.compression_threshold = threshold;
    return serialize(ctx, m, &so);
}

struct Chunks {
    size_t chunk = 0, n = 0, squeezed = 0;
};

Chunks chunks_of(const gser_msg_t *m, size_t i)
{
    Chunks c;
    EXPECT_EQ(gser_msg_get_frame_chunks(m, i, &c.chunk, &c.n, &c.squeezed), GSER_OK);
    return c;
}

TEST_F(Compress, ChunksCompressOnlyWhereTheyShrink)
{
    std::string mixed = mixed_frame();
    std::string small(10, 's');
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        SCOPED_TRACE(codec);
        auto m = two_buffers(ctx(), mixed.data(), mixed.size(), small.data(), small.size());
        auto f = serialize_chunked(ctx(), m.get(), codec, kChunk);
        ASSERT_TRUE(f) << gser_context_get_last_error(ctx());
        EXPECT_EQ(header_version(f.get()), 3u);
        const gser_frame_t *fr = gser_frames_get_array(f.get());
        // the random MiB is stored as it is, plus the table; the rest shrinks
        EXPECT_GT(fr[1].size, kBig);
        EXPECT_LT(fr[1].size, kBig + kBig / 2);
        std::vector<std::string> data{std::string((const char *)fr[1].data, fr[1].size)};
        auto d = decode(ctx(), header_bytes(f.get()), data);
        ASSERT_EQ(d.st, GSER_OK) << d.err;
        EXPECT_TRUE(buffer_bytes(d.msg.get(), 0) == mixed);
        int got = -1;
        size_t wire = 0;
        ASSERT_EQ(gser_msg_get_frame_codec(d.msg.get(), 1, &got, &wire), GSER_OK);
        EXPECT_EQ(got, codec);
        EXPECT_EQ(wire, fr[1].size);
        Chunks c = chunks_of(d.msg.get(), 1);
        EXPECT_EQ(c.chunk, kChunk);
        EXPECT_EQ(c.n, 12u);
        EXPECT_EQ(c.squeezed, 8u) << "the 4 chunks of random bytes are stored as they are";
        c = chunks_of(d.msg.get(), 0);
        EXPECT_EQ(c.n, 0u) << "the header has no chunks";
        size_t a, b, e;
        EXPECT_EQ(gser_msg_get_frame_chunks(d.msg.get(), 2, &a, &b, &e), GSER_ERR_OUT_OF_RANGE);
    }
}

TEST_F(Compress, ChunksSpareTheCodecWhatTheWholeFrameWouldHaveSpentOnIt)
{
    // at 0.3, the whole mixed frame (about 0.45 with lz4) is not kept, while
    // its chunks of zeros are: only chunks can keep a frame whose parts differ
    std::string mixed = mixed_frame();
    std::string small(10, 's');
    auto m = two_buffers(ctx(), mixed.data(), mixed.size(), small.data(), small.size());
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = GSER_COMPRESSION_LZ4;
    so.compression_threshold = 0.3;
    auto whole = serialize(ctx(), m.get(), &so);
    ASSERT_TRUE(whole);
    EXPECT_EQ(gser_frames_get_array(whole.get())[1].data, (const void *)mixed.data()) << "as it is, whole";
    std::string part = mixed.substr(0, kBig) + mixed.substr(kBig, kBig / 4); // zeros, a quarter of noise
    auto m2 = two_buffers(ctx(), part.data(), part.size(), small.data(), small.size());
    auto f = serialize_chunked(ctx(), m2.get(), GSER_COMPRESSION_LZ4, kChunk, 0.3);
    ASSERT_TRUE(f);
    const gser_frame_t *fr = gser_frames_get_array(f.get());
    EXPECT_LT(fr[1].size, part.size() * 3 / 10) << "zeros squeezed, the noise chunk stored";
    EXPECT_GT(fr[1].size, kBig / 4);
    std::vector<std::string> data{std::string((const char *)fr[1].data, fr[1].size)};
    auto d = decode(ctx(), header_bytes(f.get()), data);
    ASSERT_EQ(d.st, GSER_OK) << d.err;
    EXPECT_TRUE(buffer_bytes(d.msg.get(), 0) == part);
    EXPECT_EQ(chunks_of(d.msg.get(), 1).squeezed, 4u);
    EXPECT_EQ(chunks_of(d.msg.get(), 1).n, 5u);
    // one chunk of zeros after 3 MiB of noise saves less than a tenth: not
    // worth copying the noise, the frame stays as it is
    auto noise = random_bytes(3 * kBig);
    std::string most = std::string((const char *)noise.data(), noise.size()) + std::string(kChunk, '\0');
    auto m3 = two_buffers(ctx(), most.data(), most.size(), small.data(), small.size());
    auto f3 = serialize_chunked(ctx(), m3.get(), GSER_COMPRESSION_LZ4, kChunk, 0.3);
    ASSERT_TRUE(f3);
    EXPECT_EQ(gser_frames_get_array(f3.get())[1].data, (const void *)most.data());
}

TEST_F(Compress, ChunkingLeavesSmallAndIncompressibleFramesAsBefore)
{
    auto keys = sorted_keys(kBig / 8);
    auto noise = random_bytes(3 * kBig);
    std::string small(10, 's');
    // no larger than a chunk: compressed whole, as without chunks
    auto m = two_buffers(ctx(), keys.data(), kBig, small.data(), small.size());
    auto f = serialize_chunked(ctx(), m.get(), GSER_COMPRESSION_LZ4, kBig);
    auto plain = serialize_with(ctx(), m.get(), GSER_COMPRESSION_LZ4);
    ASSERT_TRUE(f && plain);
    EXPECT_EQ(header_bytes(f.get()), header_bytes(plain.get())) << "codec 1, the same bytes";
    // nothing shrinks: the frame is the caller's, untouched
    auto m2 = two_buffers(ctx(), noise.data(), noise.size(), small.data(), small.size());
    auto f2 = serialize_chunked(ctx(), m2.get(), GSER_COMPRESSION_LZ4, kChunk);
    ASSERT_TRUE(f2);
    EXPECT_EQ(gser_frames_get_array(f2.get())[1].data, (const void *)noise.data());
    EXPECT_EQ(header_version(f2.get()), 2u);
}

TEST_F(Compress, BadChunkSizesAreRefusedAndOldCallersGetWholeFrames)
{
    std::string small(10, 's');
    auto m = two_buffers(ctx(), small.data(), small.size(), small.data(), small.size());
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = GSER_COMPRESSION_LZ4;
    gser_frames_t *f = nullptr;
    for (size_t c : {(size_t)1, GSER_COMPRESS_CHUNK_MIN - 1, GSER_COMPRESS_CHUNK_MAX + 1}) {
        so.compression_chunk_size = c;
        GSER_EXPECT(ctx(), GSER_ERR_INVALID_ARG, gser_serialize(ctx(), m.get(), &so, &f));
        EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("compression_chunk_size"), std::string::npos);
    }
    EXPECT_EQ(f, nullptr);
    // a struct that ends where compression_chunk_size begins (ASan faults on a read past it)
    std::string mixed = mixed_frame();
    auto m2 = two_buffers(ctx(), mixed.data(), mixed.size(), small.data(), small.size());
    gser_serialize_options_t full = GSER_SERIALIZE_OPTIONS_INIT;
    full.compression = GSER_COMPRESSION_LZ4;
    size_t bytes = offsetof(gser_serialize_options_t, compression_chunk_size);
    std::unique_ptr<unsigned char, decltype(&std::free)> old(static_cast<unsigned char *>(std::malloc(bytes)),
                                                             &std::free);
    std::memcpy(old.get(), &full, bytes);
    std::memcpy(old.get(), &bytes, sizeof bytes);
    ASSERT_EQ(gser_serialize(ctx(), m2.get(), reinterpret_cast<const gser_serialize_options_t *>(old.get()), &f),
              GSER_OK)
        << gser_context_get_last_error(ctx());
    FramesPtr fp(f);
    std::vector<std::string> data{std::string((const char *)gser_frames_get_array(f)[1].data,
                                              gser_frames_get_array(f)[1].size)};
    auto d = decode(ctx(), header_bytes(f), data);
    ASSERT_EQ(d.st, GSER_OK) << d.err;
    EXPECT_EQ(chunks_of(d.msg.get(), 1).n, 0u) << "compressed whole";
}

TEST_F(Compress, FramesOverTheMaxSizeAreLeftForTheTransport)
{
    // two compressible frames; the limit lies between their sizes
    auto keys = sorted_keys(kBig / 8);
    size_t half = kBig / 2;
    auto m = two_buffers(ctx(), keys.data(), kBig, keys.data(), half);
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = GSER_COMPRESSION_LZ4;
    so.compression_max_size = half;
    gser_frames_t *f = nullptr;
    ASSERT_EQ(gser_serialize(ctx(), m.get(), &so, &f), GSER_OK) << gser_context_get_last_error(ctx());
    FramesPtr fp(f);
    ASSERT_EQ(gser_frames_get_count(f), 3u);
    const gser_frame_t *fr = gser_frames_get_array(f);
    EXPECT_EQ(fr[1].data, (const void *)keys.data()) << "over the limit: the caller's bytes, uncompressed";
    EXPECT_EQ(fr[1].size, kBig);
    EXPECT_LT(fr[2].size, half / 2) << "at the limit: compressed";
    auto back = deserialize(ctx(), f);
    ASSERT_TRUE(back);
    EXPECT_EQ(buffer_bytes(back.get(), 0), std::string((const char *)keys.data(), kBig));
    EXPECT_EQ(buffer_bytes(back.get(), 1), std::string((const char *)keys.data(), half));
}

TEST_F(Compress, AFrameWhoseChunkSamplesCannotPayCostsNoBuffer)
{
    // 48 MiB of a counter (lz4: half) at 0.3: every chunk's sample says no,
    // so no 48 MiB buffer is mapped and nothing is copied
    std::vector<int64_t> counter((48u << 20) / 8);
    for (size_t i = 0; i < counter.size(); i++)
        counter[i] = (int64_t)i;
    std::string small(10, 's');
    auto m = two_buffers(ctx(), counter.data(), counter.size() * 8, small.data(), small.size());
    gser_bigbuf_stats_reset();
    auto f = serialize_chunked(ctx(), m.get(), GSER_COMPRESSION_LZ4, kBig, 0.3);
    ASSERT_TRUE(f);
    EXPECT_EQ(gser_frames_get_array(f.get())[1].data, (const void *)counter.data());
    gser_bigbuf_stats_t st;
    gser_bigbuf_stats_get(&st);
    EXPECT_EQ(st.mapped + st.reused, 0u);
    // at the default 0.9 the same frame is compressed, in a buffer of its own
    auto g = serialize_chunked(ctx(), m.get(), GSER_COMPRESSION_LZ4, kBig);
    ASSERT_TRUE(g);
    EXPECT_LT(gser_frames_get_array(g.get())[1].size, counter.size() * 8 * 6 / 10);
    gser_bigbuf_stats_get(&st);
    EXPECT_EQ(st.mapped + st.reused, 1u);
}

uint32_t le32(const std::string &s, size_t at)
{
    uint32_t v;
    std::memcpy(&v, s.data() + at, 4);
    return v;
}

void put_le32(std::string &s, size_t at, uint32_t v)
{
    std::memcpy(&s[at], &v, 4);
}

TEST_F(Compress, HostileChunkTablesGetSpecificErrorsNamingFrameAndChunk)
{
    std::string mixed = mixed_frame();
    std::string small(10, 's');
    for (int codec : {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD}) {
        SCOPED_TRACE(codec);
        auto m = two_buffers(ctx(), mixed.data(), mixed.size(), small.data(), small.size());
        auto f = serialize_chunked(ctx(), m.get(), codec, kChunk);
        ASSERT_TRUE(f);
        std::string hdr = header_bytes(f.get());
        std::string data((const char *)gser_frames_get_array(f.get())[1].data, gser_frames_get_array(f.get())[1].size);
        ASSERT_EQ(decode(ctx(), hdr, {data}).st, GSER_OK);
        const size_t table = 4, first = 4 + 4 * 12; // 12 chunks; chunk 4 is the first of noise (stored)
        ASSERT_EQ(le32(data, 0), kChunk);
        ASSERT_TRUE(le32(data, table + 4 * 4) & 0x80000000u);
        ASSERT_FALSE(le32(data, table + 4 * 0) & 0x80000000u);
        auto resized = [&](const std::string &d) {
            return retable(hdr, [&](msgpack_object &t, msgpack_zone *) { field(t, 0, 0).via.u64 = d.size(); });
       };
        auto with_raw = [&](uint64_t raw) {
            return retable(hdr, [&](msgpack_object &t, msgpack_zone *) { field(t, 0, 4).via.u64 = raw; });
       };
        struct Case {
            const char *name;
            std::string hdr, data;
            const char *says;
       };
        std::vector<Case> cases;
        for (uint32_t c : {0u, 4095u, (1u << 30) + 1, 0xffffffffu}) {
            std::string d = data;
            put_le32(d, 0, c);
            cases.push_back({"chunk size", hdr, d, "outside"});
        }
        cases.push_back({"no chunk size", resized("ab"), "ab", "hold no chunk size"});
        {
            std::string d = data; // 2 GiB in chunks of 4 KiB: a table of 2 MiB in a frame of about 1.3 MiB
            put_le32(d, 0, 4096);
            cases.push_back({"a table longer than the frame", with_raw(1ull << 31), d, "need a table"});
        }
        {
            std::string d = data;
            put_le32(d, table + 4 * 4, (uint32_t)(kChunk - 1) | 0x80000000u);
            cases.push_back({"a stored chunk of the wrong size", hdr, d, "frame 1, chunk 4 is stored as"});
        }
        {
            std::string d = data;
            put_le32(d, table + 4 * 11, 0x7fffffffu);
            cases.push_back({"a chunk past the end", hdr, d, "frame 1, chunk 11: 2147483647 bytes"});
        }
        {
            std::string d = data + "x";
            cases.push_back({"a byte left over", resized(d), d, "its chunks end at byte"});
        }
        {
            std::string d = data.substr(0, data.size() - 16);
            cases.push_back({"cut", resized(d), d, "frame 1, chunk 11"});
        }
        {
            std::string d = data;
            for (size_t k = first; k < first + le32(data, table); k++)
                d[k] = '\xff';
            cases.push_back({"garbage in chunk 0", hdr, d, "frame 1, chunk 0"});
        }
        cases.push_back({"declared one byte more", with_raw(3 * kBig + 1), data, "frame 1"});
        cases.push_back({"declared one byte less", with_raw(3 * kBig - 1), data, "frame 1"});
        for (auto &c : cases) {
            SCOPED_TRACE(c.name);
            Decoded d = decode(ctx(), c.hdr, {c.data});
            EXPECT_EQ(d.st, GSER_ERR_COMPRESSED) << d.err;
            EXPECT_NE(d.err.find(c.says), std::string::npos) << d.err;
        }
        // any byte of the table changed: a clean refusal or the same bytes, never a crash
        for (size_t k = 0; k < first; k++) {
            std::string d = data;
            d[k] ^= (char)(0x5a + k);
            Decoded r = decode(ctx(), hdr, {d});
            if (r.st == GSER_OK)
                EXPECT_TRUE(buffer_bytes(r.msg.get(), 0) == mixed) << k;
            else
                EXPECT_EQ(r.st, GSER_ERR_COMPRESSED) << k << ": " << r.err;
        }
    }
}

} // namespace

#ifdef GSER_INSPECT_PATH
namespace {
// What gser-inspect prints of f's flattened form.
std::string inspect(const gser_frames_t *f, const char *tag)
{
    std::string path = "/tmp/gser-test-" + std::to_string(getpid()) + "-" + tag + ".gser";
    FILE *out = fopen(path.c_str(), "wb");
    EXPECT_TRUE(out);
    if (!out)
        return "";
    EXPECT_EQ(gser_flat_write_file(gser_frames_get_array(f), gser_frames_get_count(f), out), GSER_OK);
    fclose(out);
    FILE *p = popen((std::string(GSER_INSPECT_PATH) + " " + path).c_str(), "r");
    EXPECT_TRUE(p);
    std::string text;
    char buf[4096];
    size_t n;
    while (p && (n = fread(buf, 1, sizeof buf, p)) > 0)
        text.append(buf, n);
    EXPECT_EQ(p ? pclose(p) : -1, 0) << text;
    unlink(path.c_str());
    return text;
}

TEST_F(Compress, InspectShowsTheCodecAndBothSizes)
{
    auto keys = sorted_keys(kBig / 8);
    std::string small(10, 's');
    auto m = two_buffers(ctx(), keys.data(), kBig, small.data(), small.size());
    auto f = serialize_with(ctx(), m.get(), GSER_COMPRESSION_LZ4);
    ASSERT_TRUE(f);
    size_t wire = gser_frames_get_array(f.get())[1].size;
    std::string text = inspect(f.get(), "compressed");
    EXPECT_NE(text.find("wire format 3"), std::string::npos) << text;
    EXPECT_NE(text.find("frame 1: " + std::to_string(wire) + " bytes, lz4 of 1048576 bytes"), std::string::npos)
        << text;
    EXPECT_NE(text.find("buffer uint8 1048576 bytes host, frame 1"), std::string::npos) << text;
}

TEST_F(Compress, InspectShowsTheChunks)
{
    std::string mixed = mixed_frame();
    std::string small(10, 's');
    auto m = two_buffers(ctx(), mixed.data(), mixed.size(), small.data(), small.size());
    auto f = serialize_chunked(ctx(), m.get(), GSER_COMPRESSION_ZSTD, kChunk);
    ASSERT_TRUE(f);
    size_t wire = gser_frames_get_array(f.get())[1].size;
    std::string text = inspect(f.get(), "chunks");
    EXPECT_NE(text.find("frame 1: " + std::to_string(wire) +
                        " bytes, zstd of 3145728 bytes in 12 chunks of 262144 bytes, 8 compressed"),
              std::string::npos)
        << text;
}
} // namespace
#endif
