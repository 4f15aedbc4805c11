// Untrusted input: limits, truncation, corruption, crafted headers.
#include <random>

#include <msgpack.h>

#include "host/common.hpp"
#include "host/craft.hpp"

namespace {

// A sample message with every marker: map, tuple, array frame, inline array,
// buffer frame, inline buffer, typed object with a frame.
struct Sample {
    CtxPtr ctx;
    MsgPtr msg;
    FramesPtr frames;
    Blob blob{3, "three", std::vector<double>(40, 0.5)};
    std::vector<double> floats = std::vector<double>(300, 1.5);
    std::vector<int32_t> ints = std::vector<int32_t>(500, 7);
};

void make_sample(Sample &s, BlobStats *stats)
{
    s.ctx = make_ctx();
    register_blob(s.ctx.get(), stats, {"host"});
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(s.ctx.get(), &m), GSER_OK);
    s.msg.reset(m);
    gser_value_t *root, *v, *t;
    gser_msg_new_map(m, &root);
    gser_msg_new_cstr(m, "op", &v), gser_map_put_cstr(root, "op", v);
    gser_msg_new_tuple(m, &t), gser_list_append_int(t, 1), gser_list_append_cstr(t, "k"), gser_list_append_uint(t, 9);
    gser_map_put_cstr(root, "prio", t);
    gser_msg_new_array(m, GSER_KIND_FLOAT, s.floats.data(), s.floats.size(), 0, &v), gser_map_put_cstr(root, "f", v);
    gser_msg_new_array(m, GSER_KIND_FLOAT, s.floats.data(), 4, 0, &v), gser_map_put_cstr(root, "small", v);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    int64_t shape[2] = {25, 20};
    d.data = s.ints.data();
    d.nbytes = s.ints.size() * 4;
    d.dtype = GSER_DTYPE_INT32;
    d.ndim = 2;
    d.shape = shape;
    gser_msg_new_buffer(m, &d, &v), gser_map_put_cstr(root, "buf", v);
    d.nbytes = 8;
    d.ndim = 0;
    gser_msg_new_buffer(m, &d, &v), gser_map_put_cstr(root, "tiny", v);
    gser_msg_new_object(m, "test.blob", &s.blob, &v), gser_map_put_cstr(root, "obj", v);
    gser_msg_set_root(m, root);
    s.frames = serialize(s.ctx.get(), m);
}

std::vector<gser_frame_t> copy_frames(const gser_frames_t *f)
{
    return std::vector<gser_frame_t>(gser_frames_get_array(f), gser_frames_get_array(f) + gser_frames_get_count(f));
}

} // namespace

TEST(Safety, EveryTruncationOfTheHeaderFails)
{
    BlobStats stats;
    Sample s;
    make_sample(s, &stats);
    auto fr = copy_frames(s.frames.get());
    const size_t full = fr[0].size;
    std::vector<unsigned char> copy(static_cast<const unsigned char *>(fr[0].data),
                                   static_cast<const unsigned char *>(fr[0].data) + full);
    for (size_t len = 0; len < full; len++) {
        // A fresh heap copy of exactly len bytes, so ASan sees any overread.
        std::unique_ptr<unsigned char[]> h(new unsigned char[len ? len : 1]);
        std::memcpy(h.get(), copy.data(), len);
        fr[0].data = h.get();
        fr[0].size = len;
        gser_status_t st = expect_failure(s.ctx.get(), fr.data(), fr.size());
        EXPECT_TRUE(st == GSER_ERR_TRUNCATED || st == GSER_ERR_BAD_MAGIC || st == GSER_ERR_FORMAT ||
                    st == GSER_ERR_FRAME)
            << len << ": " << gser_status_str(st);
    }
    EXPECT_EQ(stats.destroyed, stats.deserialized) << "nothing leaked from failed decodes";
}

TEST(Safety, EveryTruncationOfTheFlattenedFormFails)
{
    BlobStats stats;
    Sample s;
    make_sample(s, &stats);
    auto flat = flatten(s.frames.get());
    for (size_t len = 0; len < flat.size(); len++) {
        std::unique_ptr<unsigned char[]> b(new unsigned char[len ? len : 1]);
        std::memcpy(b.get(), flat.data(), len);
        gser_msg_t *m = nullptr;
        gser_status_t st = gser_deserialize_flat(s.ctx.get(), b.get(), len, nullptr, nullptr, nullptr, &m);
        ASSERT_TRUE(is_error(st)) << len;
        ASSERT_EQ(m, nullptr);
        if (len >= 8) {
            ASSERT_NE(st, GSER_ERR_BAD_MAGIC) << len;
        }
    }
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize_flat(s.ctx.get(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &m), GSER_OK);
    gser_value_t *sent, *got;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(s.msg.get()), "buf", &sent), GSER_OK);
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(m), "buf", &got), GSER_OK);
    EXPECT_TRUE(gser_value_equal(sent, got)) << "the untruncated message decodes";
    gser_msg_destroy(m);
    flat.push_back(0);
    EXPECT_EQ(gser_deserialize_flat(s.ctx.get(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &m),
              GSER_ERR_FORMAT)
        << "trailing bytes";
}

TEST(Safety, RandomBitFlipsNeverCrash)
{
    BlobStats stats;
    Sample s;
    make_sample(s, &stats);
    auto flat = flatten(s.frames.get());
    // The prefix, size table and header: where every byte means something.
    const size_t structure = 16 + 8 * gser_frames_get_count(s.frames.get()) + gser_frames_get_array(s.frames.get())[0].size;
    std::mt19937_64 rng(12345);
    int ok = 0, failed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        std::vector<unsigned char> b = flat;
        int flips = 1 + (int)(rng() % 4);
        for (int i = 0; i < flips; i++) {
            // Mostly in the structure; every fourth message anywhere.
            size_t limit = iter % 4 == 0 ? b.size() : structure;
            size_t pos = rng() % limit;
            b[pos] ^= (unsigned char)(1u << (rng() % 8));
        }
        unsigned flags = iter % 3 == 0 ? GSER_DESERIALIZE_KEEP_SERIALIZED : 0;
        gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
        o.flags = flags;
        gser_msg_t *m = nullptr;
        gser_status_t st = gser_deserialize_flat(s.ctx.get(), b.data(), b.size(), nullptr, nullptr, &o, &m);
        if (st == GSER_OK) {
            ok++;
            // Whatever decoded must be usable: re-serialize it.
            gser_frames_t *f = nullptr;
            if (gser_serialize(s.ctx.get(), m, nullptr, &f) == GSER_OK)
                gser_frames_destroy(f);
            gser_msg_destroy(m);
        } else {
            ASSERT_TRUE(is_error(st));
            ASSERT_EQ(m, nullptr);
            failed++;
        }
    }
    EXPECT_GT(failed, 10000) << "most corruptions are detected (" << ok << " decoded)";
    EXPECT_EQ(stats.destroyed, stats.deserialized);
}

TEST(Safety, RandomGarbageHeaders)
{
    auto ctx = make_ctx();
    std::mt19937_64 rng(99);
    for (int iter = 0; iter < 5000; iter++) {
        size_t len = rng() % 200;
        std::vector<unsigned char> h(len + 7);
        const unsigned char magic[] = {0x94, 0xd6, 0x01, 'G', 'S', 'E', 'R'};
        std::memcpy(h.data(), magic, 7); // get past the magic check
        for (size_t i = 7; i < h.size(); i++)
            h[i] = (unsigned char)rng();
        std::unique_ptr<unsigned char[]> exact(new unsigned char[h.size()]);
        std::memcpy(exact.get(), h.data(), h.size());
        gser_frame_t f = {exact.get(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
        gser_msg_t *m = nullptr;
        gser_status_t st = gser_deserialize(ctx.get(), &f, 1, nullptr, &m);
        ASSERT_TRUE(st == GSER_OK || is_error(st));
        gser_msg_destroy(m);
    }
}

TEST(Safety, LimitsAreEnforcedWithTheirOwnStatus)
{
    BlobStats stats;
    Sample s;
    make_sample(s, &stats);
    auto fr = copy_frames(s.frames.get());
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_frames = 2;
    EXPECT_EQ(expect_failure(s.ctx.get(), fr.data(), fr.size(), 0, &lim), GSER_ERR_LIMIT_FRAMES);
    lim = GSER_LIMITS_INIT;
    lim.max_bytes = 1000;
    EXPECT_EQ(expect_failure(s.ctx.get(), fr.data(), fr.size(), 0, &lim), GSER_ERR_LIMIT_BYTES);
    lim = GSER_LIMITS_INIT;
    lim.max_nodes = 20;
    EXPECT_EQ(expect_failure(s.ctx.get(), fr.data(), fr.size(), 0, &lim), GSER_ERR_LIMIT_NODES);
    lim = GSER_LIMITS_INIT;
    lim.max_depth = 1;
    EXPECT_EQ(expect_failure(s.ctx.get(), fr.data(), fr.size(), 0, &lim), GSER_ERR_LIMIT_DEPTH);
    lim = GSER_LIMITS_INIT;
    lim.max_depth = 3; // root map (1), its tuple (2), the object's sub-tree map (3) and its values (4)
    EXPECT_EQ(expect_failure(s.ctx.get(), fr.data(), fr.size(), 0, &lim), GSER_ERR_LIMIT_DEPTH);
    EXPECT_NE(std::string(gser_context_get_last_error(s.ctx.get())).find("$.obj"), std::string::npos)
        << gser_context_get_last_error(s.ctx.get());

    // Limits in the context apply when the call gives none.
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    gser_limits_t clim = GSER_LIMITS_INIT;
    clim.max_frames = 1;
    o.limits = &clim;
    auto small = make_ctx(&o);
    EXPECT_EQ(expect_failure(small.get(), fr.data(), fr.size(), GSER_DESERIALIZE_ALLOW_UNKNOWN),
              GSER_ERR_LIMIT_FRAMES);
    clim.max_depth = GSER_DEPTH_MAX + 1;
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&o, &c), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(c, nullptr);
}

// Many buffer references to one small frame: inside every other limit, but
// each costs the decoder far more memory than its dozen header bytes.
// max_expansion bounds that cost relative to the message's size.
TEST(Safety, DecodingCostIsBoundedByTheMessagesSize)
{
    auto ctx = make_ctx();
    const size_t n = 100000;
    std::string h = craft(
        [&](msgpack_packer *pk) {
            msgpack_pack_array(pk, n);
            for (size_t i = 0; i < n; i++)
                pack_buffer_ref(pk, GSER_DTYPE_UINT8, 0, 0, 1);
        },
        GSER_WIRE_VERSION, {1});
    static const unsigned char one[1] = {7};
    gser_frame_t fr[2] = {{h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}},
                          {one, 1, GSER_MEMORY_HOST, 0, nullptr, nullptr, {}}};
    // The default (64 times the size) holds this message: it decodes.
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), fr, 2, nullptr, &m), GSER_OK) << gser_context_get_last_error(ctx.get());
    gser_msg_destroy(m);
    // Twice its size (plus the fixed allowance) does not.
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_expansion = 2;
    EXPECT_EQ(expect_failure(ctx.get(), fr, 2, 0, &lim), GSER_ERR_LIMIT_BYTES);
    std::string err = gser_context_get_last_error(ctx.get());
    EXPECT_NE(err.find("max_expansion 2"), std::string::npos) << err;
    EXPECT_NE(err.find("for a message of " + std::to_string(h.size() + 1) + " bytes"), std::string::npos) << err;
    // The limit is the context's when the call gives none, and 0 means the default.
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.limits = &lim;
    gser_context_t *c2 = nullptr;
    ASSERT_EQ(gser_context_create(&o, &c2), GSER_OK);
    EXPECT_EQ(expect_failure(c2, fr, 2), GSER_ERR_LIMIT_BYTES);
    gser_limits_t got = GSER_LIMITS_INIT;
    ASSERT_EQ(gser_context_get_limits(c2, &got), GSER_OK);
    EXPECT_EQ(got.max_expansion, 2u);
    gser_context_destroy(c2);
    ASSERT_EQ(gser_context_get_limits(ctx.get(), &got), GSER_OK);
    EXPECT_EQ(got.max_expansion, 64u);
    // A message well inside its bound decodes under the small limit too.
    std::string small = craft([&](msgpack_packer *pk) { pack_buffer_ref(pk, GSER_DTYPE_UINT8, 0, 0, 1); },
                              GSER_WIRE_VERSION, {1});
    gser_frame_t sfr[2] = {{small.data(), small.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}}, fr[1]};
    gser_deserialize_options_t dopt = GSER_DESERIALIZE_OPTIONS_INIT;
    dopt.limits = &lim;
    ASSERT_EQ(gser_deserialize(ctx.get(), sfr, 2, &dopt, &m), GSER_OK) << gser_context_get_last_error(ctx.get());
    gser_msg_destroy(m);
}

TEST(Safety, DeepNestingAndCyclesFailAtSerialize)
{
    auto ctx = make_ctx();
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *cur;
    gser_msg_new_list(m, &root);
    cur = root;
    for (int i = 2; i < GSER_DEPTH_MAX; i++) {
        gser_value_t *next;
        gser_msg_new_list(m, &next);
        gser_list_append(cur, next);
        cur = next;
    }
    gser_list_append_int(cur, 1); // the int is at depth GSER_DEPTH_MAX: still fine
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx.get(), m);
    ASSERT_TRUE(frames);
    auto back = deserialize(ctx.get(), frames.get());
    EXPECT_TRUE(gser_value_equal(root, gser_msg_get_root(back.get())));

    gser_value_t *deeper;
    gser_msg_new_list(m, &deeper);
    gser_list_append(cur, deeper);
    gser_list_append_int(deeper, 2);
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(ctx.get(), m, nullptr, &f), GSER_ERR_LIMIT_DEPTH);
    EXPECT_EQ(f, nullptr);

    // A cycle is caught by the same limit.
    gser_value_t *a, *b;
    gser_msg_new_list(m, &a);
    gser_msg_new_list(m, &b);
    gser_list_append(a, b);
    gser_list_append(b, a);
    gser_msg_set_root(m, a);
    EXPECT_EQ(gser_serialize(ctx.get(), m, nullptr, &f), GSER_ERR_LIMIT_DEPTH);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("cycle"), std::string::npos);
}

TEST(Safety, CraftedHeadersAreRejectedPrecisely)
{
    auto ctx = make_ctx();
    std::string err;
    // Not gser at all.
    EXPECT_EQ(decode_crafted(ctx.get(), std::string("\x93\x01\x02\x03", 4)), GSER_ERR_BAD_MAGIC);
    // Future wire version.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) { msgpack_pack_nil(pk); }, 4), &err),
              GSER_ERR_WIRE_VERSION);
    EXPECT_NE(err.find("version 4, this build reads versions 1..3"), std::string::npos) << err;
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) { msgpack_pack_nil(pk); }, 0), &err),
              GSER_ERR_WIRE_VERSION);
    // An array that claims 2^32-1 elements in a few bytes: no allocation, truncated.
    std::string huge = craft([](msgpack_packer *pk) { msgpack_pack_array(pk, 0xffffffffu); });
    EXPECT_EQ(decode_crafted(ctx.get(), huge), GSER_ERR_TRUNCATED);
    // A map claiming 2^32-1 pairs.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) { msgpack_pack_map(pk, 0xffffffffu); })),
              GSER_ERR_TRUNCATED);
    // A str longer than the input.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) { msgpack_pack_str(pk, 1u << 30); })),
              GSER_ERR_TRUNCATED);
    // Unknown marker.
    EXPECT_EQ(decode_crafted(ctx.get(),
                             craft([](msgpack_packer *pk) {
                                 msgpack_pack_array(pk, 1);
                                 msgpack_pack_ext(pk, 0, 42);
                             }),
                             &err),
              GSER_ERR_FORMAT);
    EXPECT_NE(err.find("unknown marker ext type 42"), std::string::npos) << err;
    // A bare ext where a value belongs.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) { msgpack_pack_ext_with_body(pk, "abcd", 4, 9); })),
              GSER_ERR_FORMAT);
    // A buffer that references a frame that does not exist.
    EXPECT_EQ(decode_crafted(ctx.get(),
                             craft([](msgpack_packer *pk) {
                                 msgpack_pack_map(pk, 1);
                                 msgpack_pack_str_with_body(pk, "b", 1);
                                 pack_buffer_ref(pk, GSER_DTYPE_UINT8, 0, 0, 16);
                             }),
                             &err),
              GSER_ERR_FRAME);
    EXPECT_NE(err.find("$.b: frame reference 0 is outside this object's 0 frames"), std::string::npos) << err;
    // A buffer whose shape disagrees with its bytes.
    EXPECT_EQ(decode_crafted(ctx.get(),
                             craft([](msgpack_packer *pk) {
                                 msgpack_pack_array(pk, 5);
                                 msgpack_pack_ext(pk, 0, 4);
                                 msgpack_pack_uint8(pk, GSER_DTYPE_FLOAT64);
                                 msgpack_pack_array(pk, 1);
                                 msgpack_pack_uint8(pk, 3);
                                 msgpack_pack_bin_with_body(pk, "0123456789abcdef", 16);
                                 msgpack_pack_uint8(pk, GSER_MEMORY_HOST);
                             }),
                             &err),
              GSER_ERR_FORMAT);
    // A buffer whose origin is neither host nor device.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) {
                  msgpack_pack_array(pk, 5);
                  msgpack_pack_ext(pk, 0, 4);
                  msgpack_pack_uint8(pk, GSER_DTYPE_UINT8);
                  msgpack_pack_nil(pk);
                  msgpack_pack_bin_with_body(pk, "ab", 2);
                  msgpack_pack_uint8(pk, 7);
              })),
              GSER_ERR_FORMAT);
    // A bool array with a 2 in it.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) {
                  msgpack_pack_array(pk, 5);
                  msgpack_pack_ext(pk, 0, 5);
                  msgpack_pack_uint8(pk, 0);
                  msgpack_pack_uint8(pk, GSER_KIND_BOOL);
                  msgpack_pack_uint8(pk, 3);
                  msgpack_pack_bin_with_body(pk, "\x01\x02\x00", 3);
              })),
              GSER_ERR_FORMAT);
    // A map key that is a list.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) {
                  msgpack_pack_map(pk, 1);
                  msgpack_pack_array(pk, 0);
                  msgpack_pack_nil(pk);
              })),
              GSER_ERR_FORMAT);
    // An object whose frames lie outside the message.
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) {
                  pack_object_head(pk, "t", "host", 0, 5);
                  msgpack_pack_bin_with_body(pk, "\xc0", 1);
              })),
              GSER_ERR_FRAME);
    // An object whose sub-header is not msgpack (kept serialized: still checked).
    std::string bad_sub = craft([](msgpack_packer *pk) {
        pack_object_head(pk, "t", "host", 0, 0);
        msgpack_pack_bin_with_body(pk, "\x91\xc1", 2);
    });
    gser_frame_t f = {bad_sub.data(), bad_sub.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    EXPECT_EQ(expect_failure(ctx.get(), &f, 1, GSER_DESERIALIZE_ALLOW_UNKNOWN), GSER_ERR_FORMAT);
    // Nesting deeper than msgpack-c's unpacker can take: a clean limit error.
    std::string deep = craft([](msgpack_packer *pk) {
        for (int i = 0; i < 40; i++)
            msgpack_pack_array(pk, 1);
        msgpack_pack_nil(pk);
    });
    EXPECT_EQ(decode_crafted(ctx.get(), deep, &err), GSER_ERR_LIMIT_DEPTH);
    EXPECT_NE(err.find("header nests deeper than the limit"), std::string::npos) << err;
    // A byte msgpack never uses, in the header itself: refused, with where.
    std::string c1 = craft([](msgpack_packer *pk) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_nil(pk);
        pk->callback(pk->data, "\xc1", 1); // at byte 10: magic 7, version 1, array 1, nil 1
    });
    EXPECT_EQ(decode_crafted(ctx.get(), c1, &err), GSER_ERR_FORMAT);
    EXPECT_NE(err.find("header holds an invalid byte at byte 10 of 12"), std::string::npos) << err;
    // A map that declares more pairs than the bytes left could hold.
    std::string lying = craft([](msgpack_packer *pk) { msgpack_pack_map(pk, 1000); });
    EXPECT_EQ(decode_crafted(ctx.get(), lying, &err), GSER_ERR_TRUNCATED);
    EXPECT_NE(err.find("declares more items than it holds"), std::string::npos) << err;
    // Frame table disagreeing with the frames given.
    std::string ok = craft([](msgpack_packer *pk) { msgpack_pack_nil(pk); });
    gser_frame_t two[2] = {{ok.data(), ok.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}},
                           {"xx", 2, GSER_MEMORY_HOST, 0, nullptr, nullptr, {}}};
    EXPECT_EQ(expect_failure(ctx.get(), two, 2), GSER_ERR_FRAME);
    // And the same header with the right frame count decodes.
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_deserialize(ctx.get(), two, 1, nullptr, &m), GSER_OK);
    gser_msg_destroy(m);
}

// A header from another msgpack writer may use any encoding of a value: every
// integer width (fixed ones included), float32, the 8/16/32 forms of str,
// bin, array and map, and ext forms. All of them decode to the same values.
TEST(Decoder, EveryMsgpackEncodingOfAValueDecodes)
{
    auto ctx = make_ctx();
    std::string h = craft([](msgpack_packer *pk) {
        msgpack_pack_array(pk, 16);
        msgpack_pack_fix_int8(pk, -5);
        msgpack_pack_fix_int16(pk, -300);
        msgpack_pack_fix_int32(pk, -70000);
        msgpack_pack_fix_int64(pk, -5000000000LL);
        msgpack_pack_fix_uint8(pk, 7);
        msgpack_pack_fix_uint16(pk, 65535);
        msgpack_pack_fix_uint32(pk, 4000000000u);
        msgpack_pack_fix_uint64(pk, 12);
        msgpack_pack_uint64(pk, UINT64_MAX); // above INT64_MAX: a uint
        msgpack_pack_float(pk, 1.5f);
        msgpack_pack_true(pk);
        // str 8, str 16 and bin 16 forms of short payloads
        pk->callback(pk->data, "\xd9\x02hi", 4);
        pk->callback(pk->data, "\xda\x00\x03hey", 6);
        pk->callback(pk->data, "\xc5\x00\x02\x01\x02", 5);
        // array 16 and map 16 forms
        pk->callback(pk->data, "\xdc\x00\x02\x01\x02", 5);
        pk->callback(pk->data, "\xde\x00\x01\xa1k\x03", 6);
    });
    gser_frame_t f = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), &f, 1, nullptr, &m), GSER_OK) << gser_context_get_last_error(ctx.get());
    MsgPtr mp(m);
    gser_value_t *r = gser_msg_get_root(m);
    ASSERT_EQ(gser_value_get_len(r), 16u);
    auto at = [&](size_t i) {
        gser_value_t *v = nullptr;
        EXPECT_EQ(gser_list_get(r, i, &v), GSER_OK);
        return v;
    };
    const int64_t ints[] = {-5, -300, -70000, -5000000000LL, 7, 65535, 4000000000LL, 12};
    for (size_t i = 0; i < 8; i++) {
        int64_t x = 0;
        ASSERT_EQ(gser_value_get_int(at(i), &x), GSER_OK) << i;
        EXPECT_EQ(x, ints[i]) << i;
    }
    uint64_t u = 0;
    ASSERT_EQ(gser_value_get_uint(at(8), &u), GSER_OK);
    EXPECT_EQ(u, UINT64_MAX);
    double d = 0;
    ASSERT_EQ(gser_value_get_float(at(9), &d), GSER_OK);
    EXPECT_EQ(d, 1.5);
    bool b = false;
    ASSERT_EQ(gser_value_get_bool(at(10), &b), GSER_OK);
    EXPECT_TRUE(b);
    const char *s;
    size_t n;
    ASSERT_EQ(gser_value_get_str(at(11), &s, &n), GSER_OK);
    EXPECT_EQ(std::string(s, n), "hi");
    EXPECT_EQ(s[n], '\0') << "strings are NUL-terminated copies";
    ASSERT_EQ(gser_value_get_str(at(12), &s, &n), GSER_OK);
    EXPECT_EQ(std::string(s, n), "hey");
    const void *bytes;
    ASSERT_EQ(gser_value_get_bytes(at(13), &bytes, &n), GSER_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(std::memcmp(bytes, "\x01\x02", 2), 0);
    EXPECT_EQ(gser_value_get_len(at(14)), 2u);
    gser_value_t *kv = nullptr;
    ASSERT_EQ(gser_map_find_cstr(at(15), "k", &kv), GSER_OK);
    int64_t x = 0;
    ASSERT_EQ(gser_value_get_int(kv, &x), GSER_OK);
    EXPECT_EQ(x, 3);
}

// An object's sub-tree starts at its depth + 1, kept or rebuilt: objects
// nested in objects cannot escape the depth limit.
TEST(Safety, ObjectsNestedInObjectsCountAgainstTheDepthLimit)
{
    auto ctx = make_ctx();
    for (unsigned flags : {(unsigned)GSER_DESERIALIZE_KEEP_SERIALIZED, (unsigned)GSER_DESERIALIZE_ALLOW_UNKNOWN}) {
        // 29 objects: the innermost's nil is at depth 30, the limit.
        std::string ok = craft_raw(nested_objects(GSER_DEPTH_MAX - 1));
        gser_frame_t f = {ok.data(), ok.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
        gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
        o.flags = flags;
        gser_msg_t *m = nullptr;
        ASSERT_EQ(gser_deserialize(ctx.get(), &f, 1, &o, &m), GSER_OK) << gser_context_get_last_error(ctx.get());
        MsgPtr mp(m);
        // Each sub-tree decodes one level deeper, down to the nil.
        gser_value_t *v = gser_msg_get_root(m);
        size_t levels = 0;
        while (gser_value_get_kind(v) == GSER_KIND_SERIALIZED) {
            ASSERT_EQ(gser_value_decode_serialized(m, v, &v), GSER_OK)
                << levels << ": " << gser_context_get_last_error(ctx.get());
            levels++;
        }
        EXPECT_EQ(levels, (size_t)GSER_DEPTH_MAX - 1);
        EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_NIL);

        // One more: refused as the message is decoded, not later.
        std::string deep = craft_raw(nested_objects(GSER_DEPTH_MAX));
        f = {deep.data(), deep.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
        EXPECT_EQ(expect_failure(ctx.get(), &f, 1, flags), GSER_ERR_LIMIT_DEPTH);
        EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("nests deeper than the limit"),
                  std::string::npos)
            << gser_context_get_last_error(ctx.get());

        // 60,000 of them (1.2 MB): the same refusal, in one pass, and no stack overflow.
        std::string huge = craft_raw(nested_objects(60000));
        f = {huge.data(), huge.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
        EXPECT_EQ(expect_failure(ctx.get(), &f, 1, flags), GSER_ERR_LIMIT_DEPTH);
    }

    // A lower limit in the options counts the same way.
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_depth = 5;
    std::string five = craft_raw(nested_objects(5));
    gser_frame_t f = {five.data(), five.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    EXPECT_EQ(expect_failure(ctx.get(), &f, 1, GSER_DESERIALIZE_KEEP_SERIALIZED, &lim), GSER_ERR_LIMIT_DEPTH);
    std::string four = craft_raw(nested_objects(4));
    f = {four.data(), four.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = GSER_DESERIALIZE_KEEP_SERIALIZED;
    o.limits = &lim;
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), &f, 1, &o, &m), GSER_OK) << gser_context_get_last_error(ctx.get());
    gser_msg_destroy(m);
}

// Numbers in errors are the ones the peer sent, not sums that wrapped; names
// from the wire are escaped like str values.
TEST(Safety, ErrorsQuoteThePeerFaithfullyAndSafely)
{
    auto ctx = make_ctx();
    std::string err;
    EXPECT_EQ(decode_crafted(ctx.get(), craft([](msgpack_packer *pk) {
                                 pack_object_head(pk, "t", "host", UINT64_MAX, 2);
                                 msgpack_pack_bin_with_body(pk, "\xc0", 1);
                             }),
                             &err),
              GSER_ERR_FRAME);
    EXPECT_NE(err.find("object frame base 18446744073709551615 and frame count 2 are outside the 0 frames"),
              std::string::npos)
        << err;
    std::string ref = craft(
        [](msgpack_packer *pk) {
            pack_buffer_ref(pk, GSER_DTYPE_UINT8, 0, UINT64_MAX, 2);
        },
        GSER_WIRE_VERSION, {8});
    gser_frame_t fr[2] = {{ref.data(), ref.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}},
                          {"01234567", 8, GSER_MEMORY_HOST, 0, nullptr, nullptr, {}}};
    EXPECT_EQ(expect_failure(ctx.get(), fr, 2), GSER_ERR_FRAME);
    err = gser_context_get_last_error(ctx.get());
    EXPECT_NE(err.find("2 bytes at offset 18446744073709551615 are outside frame 1 of 8 bytes"), std::string::npos)
        << err;

    // A type name that would clear the terminal and set its title.
    const std::string evil = "\x1b[2J\x1b]0;owned\x07";
    std::string h = craft_raw(nested_objects(1, evil));
    gser_frame_t f = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    EXPECT_EQ(expect_failure(ctx.get(), &f, 1), GSER_ERR_UNKNOWN_TYPE);
    err = gser_context_get_last_error(ctx.get());
    EXPECT_EQ(err.find('\x1b'), std::string::npos) << err;
    EXPECT_NE(err.find("type \"\\x1b[2J\\x1b]0;owned\\x07\" is not registered"), std::string::npos) << err;
}
