// The one-pass decoder (values made in msgpack-c's parse callbacks), borrowed
// map keys, and the messages and frames a context reuses.
#include <cstdio>
#include <thread>

#include "host/common.hpp"
#include "host/craft.hpp"

namespace {

gser_status_t decode_with(gser_context_t *ctx, const std::string &h, const gser_limits_t *lim, MsgPtr *out = nullptr)
{
    gser_frame_t f = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.limits = lim;
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize(ctx, &f, 1, &o, &m);
    if (out)
        out->reset(m);
    else
        gser_msg_destroy(m);
    return st;
}

// n lists nested in one another; the innermost holds `inner` (nothing if NULL).
auto nested_lists(int n, void (*inner)(msgpack_packer *))
{
    return [n, inner](msgpack_packer *pk) {
        for (int i = 0; i < n; i++)
            msgpack_pack_array(pk, i + 1 < n || inner ? 1 : 0);
        if (inner)
            inner(pk);
    };
}

} // namespace

using DecoderValues = CtxTest;

TEST_F(DecoderValues, LiteralKeysAreBorrowedNotCopied)
{
    auto m = new_msg();
    gser_value_t *root, *v, *k, *got;
    gser_msg_new_map(m.get(), &root);
    gser_msg_new_int(m.get(), 7, &v);
    static const char op[] = "op";
    ASSERT_EQ(GSER_MAP_PUT_LITERAL(root, "op", v), GSER_OK);
    ASSERT_EQ(gser_map_put_borrowed(root, op, 2, v), GSER_OK);
    ASSERT_EQ(gser_map_get_at(root, 1, &k, nullptr), GSER_OK);
    const char *s;
    size_t n;
    ASSERT_EQ(gser_value_get_str(k, &s, &n), GSER_OK);
    EXPECT_EQ(s, op) << "the key is the caller's string";
    EXPECT_EQ(n, 2u);
    ASSERT_EQ(gser_map_find_cstr(root, "op", &got), GSER_OK);
    EXPECT_EQ(got, v);
    EXPECT_EQ(gser_map_put_borrowed(root, "opx", 2, v), GSER_ERR_INVALID_ARG) << "key[len] must be the NUL";
    EXPECT_EQ(gser_map_put_borrowed(root, nullptr, 0, v), GSER_ERR_INVALID_ARG);
    gser_msg_set_root(m.get(), root);
    auto frames = serialize(ctx(), m.get());
    auto back = deserialize(ctx(), frames.get());
    EXPECT_TRUE(gser_value_equal(root, gser_msg_get_root(back.get())));
}

TEST_F(DecoderValues, DecodedContainersHaveTheirExactSizeAndStillGrow)
{
    auto m = new_msg();
    gser_value_t *root, *l, *v;
    gser_msg_new_map(m.get(), &root);
    gser_msg_new_list(m.get(), &l);
    gser_list_append_cstr(l, "a");
    gser_list_append_int(l, 1);
    gser_map_put_cstr(root, "l", l);
    gser_msg_set_root(m.get(), root);
    auto frames = serialize(ctx(), m.get());
    auto back = deserialize(ctx(), frames.get());
    gser_value_t *r = gser_msg_get_root(back.get()), *bl;
    ASSERT_EQ(gser_map_find_cstr(r, "l", &bl), GSER_OK);
    for (int i = 0; i < 100; i++) {
        ASSERT_EQ(gser_list_append_int(bl, i), GSER_OK);
        gser_msg_new_int(back.get(), i, &v);
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        ASSERT_EQ(gser_map_put_cstr(r, key, v), GSER_OK);
    }
    EXPECT_EQ(gser_value_get_len(bl), 102u);
    EXPECT_EQ(gser_value_get_len(r), 101u);
    auto again = serialize(ctx(), back.get());
    auto back2 = deserialize(ctx(), again.get());
    EXPECT_TRUE(gser_value_equal(r, gser_msg_get_root(back2.get())));
}

TEST_F(DecoderValues, MarkersAndKeysAreCheckedWhereTheyAre)
{
    std::string err;
    // An empty ext is a marker only as the first item of an array.
    EXPECT_EQ(decode_crafted(ctx(), craft([](msgpack_packer *pk) {
                                 msgpack_pack_array(pk, 2);
                                 msgpack_pack_int(pk, 1);
                                 msgpack_pack_ext(pk, 0, 2);
                             }),
                             &err),
              GSER_ERR_FORMAT);
    EXPECT_NE(err.find("$[1]: ext type 2 of 0 bytes where a value was expected"), std::string::npos) << err;
    EXPECT_EQ(decode_crafted(ctx(), craft([](msgpack_packer *pk) { msgpack_pack_ext(pk, 0, 4); }), &err),
              GSER_ERR_FORMAT);
    EXPECT_EQ(decode_crafted(ctx(), craft([](msgpack_packer *pk) {
                                 msgpack_pack_map(pk, 1);
                                 msgpack_pack_str_with_body(pk, "k", 1);
                                 msgpack_pack_ext(pk, 0, 2);
                             }),
                             &err),
              GSER_ERR_FORMAT);
    EXPECT_NE(err.find("$.k: ext type 2"), std::string::npos) << err;
    // A container as a map key is refused before it is read.
    EXPECT_EQ(decode_crafted(ctx(), craft([](msgpack_packer *pk) {
                                 msgpack_pack_map(pk, 2);
                                 msgpack_pack_int(pk, 1);
                                 msgpack_pack_nil(pk);
                                 msgpack_pack_map(pk, 1);
                                 msgpack_pack_nil(pk);
                                 msgpack_pack_nil(pk);
                                 msgpack_pack_nil(pk);
                             }),
                             &err),
              GSER_ERR_FORMAT);
    EXPECT_NE(err.find("$[1]: map key 1 is not a scalar"), std::string::npos) << err;
    // A marker's fields hold integers, not containers.
    auto field = [](bool map) {
        return craft([map](msgpack_packer *pk) {
            msgpack_pack_array(pk, 5);
            msgpack_pack_ext(pk, 0, 4);
            msgpack_pack_uint8(pk, GSER_DTYPE_UINT8);
            msgpack_pack_array(pk, 1);
            if (map)
                msgpack_pack_map(pk, 0);
            else
                msgpack_pack_array(pk, 0);
            msgpack_pack_bin_with_body(pk, "x", 1);
            msgpack_pack_uint8(pk, 0);
        });
    };
    EXPECT_EQ(decode_crafted(ctx(), field(false), &err), GSER_ERR_FORMAT);
    EXPECT_NE(err.find("a marker field holds a nested array"), std::string::npos) << err;
    EXPECT_EQ(decode_crafted(ctx(), field(true), &err), GSER_ERR_FORMAT);
    EXPECT_NE(err.find("a marker field holds a map"), std::string::npos) << err;
    // A uint given as an ext is a value, not a marker field's integer.
    EXPECT_EQ(decode_crafted(ctx(), craft([](msgpack_packer *pk) {
                                 msgpack_pack_array(pk, 5);
                                 msgpack_pack_ext(pk, 0, 4);
                                 msgpack_pack_ext_with_body(pk, "\x06\0\0\0\0\0\0\0", 8, 3);
                                 msgpack_pack_nil(pk);
                                 msgpack_pack_bin_with_body(pk, "x", 1);
                                 msgpack_pack_uint8(pk, 0);
                             }),
                             &err),
              GSER_ERR_FORMAT);
}

TEST_F(DecoderValues, TheDepthLimitHoldsAtItsEdge)
{
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_depth = 3;
    // Three levels of lists: the third may be empty, not hold a value.
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(3, nullptr)), &lim), GSER_OK);
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(3, [](msgpack_packer *pk) { msgpack_pack_nil(pk); })), &lim),
              GSER_ERR_LIMIT_DEPTH);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("$[0][0][0]: header nests deeper than the limit of 3"),
              std::string::npos)
        << gser_context_get_last_error(ctx());
    // A buffer or an empty tuple at the limit is fine; a tuple with an element is not.
    auto buffer = [](msgpack_packer *pk) {
        msgpack_pack_array(pk, 5);
        msgpack_pack_ext(pk, 0, 4);
        msgpack_pack_uint8(pk, GSER_DTYPE_UINT8);
        msgpack_pack_array(pk, 1);
        msgpack_pack_uint8(pk, 2);
        msgpack_pack_bin_with_body(pk, "xy", 2);
        msgpack_pack_uint8(pk, 0);
    };
    auto empty_tuple = [](msgpack_packer *pk) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_ext(pk, 0, 2);
    };
    auto tuple = [](msgpack_packer *pk) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_ext(pk, 0, 2);
        msgpack_pack_nil(pk);
    };
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(2, buffer)), &lim), GSER_OK) << gser_context_get_last_error(ctx());
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(2, empty_tuple)), &lim), GSER_OK);
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(2, tuple)), &lim), GSER_ERR_LIMIT_DEPTH);
    // A map at the limit cannot hold a pair.
    EXPECT_EQ(decode_with(ctx(), craft(nested_lists(2,
                                                    [](msgpack_packer *pk) {
                                                        msgpack_pack_map(pk, 1);
                                                        msgpack_pack_nil(pk);
                                                        msgpack_pack_nil(pk);
                                                    })),
                          &lim),
              GSER_ERR_LIMIT_DEPTH);
}

TEST(Decoder, ObjectsAreRebuiltOnlyOnceTheFrameTableChecksOut)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    Blob blob{1, "one", std::vector<double>(64, 1.0)};
    auto m = blob_msg(ctx.get(), &blob);
    auto frames = serialize(ctx.get(), m.get());
    std::vector<gser_frame_t> fr(gser_frames_get_array(frames.get()),
                                 gser_frames_get_array(frames.get()) + gser_frames_get_count(frames.get()));
    ASSERT_EQ(fr.size(), 2u);
    fr[1].size -= 8; // the table says 512 bytes
    EXPECT_EQ(expect_failure(ctx.get(), fr.data(), fr.size()), GSER_ERR_FRAME);
    EXPECT_EQ(stats.deserialized, 0) << "no type code runs for a message that is refused";
    fr[1].size += 8;
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), fr.data(), fr.size(), nullptr, &back), GSER_OK);
    EXPECT_EQ(stats.deserialized, 1);
    gser_msg_destroy(back);
}

TEST(Decoder, TracesSayWhatEachArrayIs)
{
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    auto ctx = make_trace_ctx(f);
    std::string h = craft([](msgpack_packer *pk) {
        msgpack_pack_map(pk, 3);
        msgpack_pack_str_with_body(pk, "t", 1);
        msgpack_pack_array(pk, 3);
        msgpack_pack_ext(pk, 0, 2);
        msgpack_pack_int(pk, 1);
        msgpack_pack_array(pk, 0);
        msgpack_pack_str_with_body(pk, "l", 1);
        msgpack_pack_array(pk, 1);
        msgpack_pack_map(pk, 0);
        msgpack_pack_str_with_body(pk, "b", 1);
        msgpack_pack_array(pk, 5);
        msgpack_pack_ext(pk, 0, 4);
        msgpack_pack_uint8(pk, GSER_DTYPE_UINT8);
        msgpack_pack_nil(pk);
        msgpack_pack_bin_with_body(pk, "xy", 2);
        msgpack_pack_uint8(pk, 0);
    });
    gser_frame_t fr = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), &fr, 1, nullptr, &m), GSER_OK);
    gser_msg_destroy(m);
    std::string out = read_all(f);
    fclose(f);
    const char *want[] = {"deserialize $  map n=3\n", "deserialize $.t  tuple n=2\n", "deserialize $.t[0]  int 1\n",
                          "deserialize $.t[1]  list n=0\n", "deserialize $.l  list n=1\n",
                          "deserialize $.l[0]  map n=0\n", "deserialize $.b  buffer uint8 ndim=0 bytes=2 inline\n"};
    size_t at = 0;
    for (const char *w : want) {
        size_t p = out.find(w, at);
        ASSERT_NE(p, std::string::npos) << w << "in order, in:\n" << out;
        at = p;
    }
    EXPECT_EQ(out.find("list n=5"), std::string::npos) << "a marker is not traced as a list:\n" << out;
}

// A context reuses the messages and frames objects it gave back; they come
// back clean, and several threads may share the context.
TEST(Decoder, ReusedMessagesAndFramesStartClean)
{
    auto ctx = make_ctx();
    for (int round = 0; round < 3; round++) {
        gser_msg_t *m = nullptr;
        ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
        EXPECT_EQ(gser_value_get_kind(gser_msg_get_root(m)), GSER_KIND_NIL);
        size_t nf = 7;
        EXPECT_EQ(gser_msg_get_frames(m, &nf), nullptr);
        EXPECT_EQ(nf, 0u);
        gser_value_t *l;
        gser_msg_new_list(m, &l);
        for (int i = 0; i < 5000; i++) // the arena grows past its first chunk
            gser_list_append_cstr(l, "a string that takes room");
        gser_msg_set_root(m, l);
        auto frames = serialize(ctx.get(), m);
        auto back = deserialize(ctx.get(), frames.get());
        EXPECT_TRUE(gser_value_equal(l, gser_msg_get_root(back.get())));
        back.reset();
        frames.reset();
        gser_msg_destroy(m);
    }
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 2000; i++) {
                gser_msg_t *m = nullptr;
                gser_value_t *v;
                if (gser_msg_create(ctx.get(), &m) || gser_msg_new_int(m, t * 100000 + i, &v) ||
                    gser_msg_set_root(m, v)) {
                    bad++;
                    continue;
                }
                gser_frames_t *f = nullptr;
                gser_msg_t *back = nullptr;
                int64_t x = -1;
                if (gser_serialize(ctx.get(), m, nullptr, &f) ||
                    gser_deserialize(ctx.get(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &back) ||
                    gser_value_get_int(gser_msg_get_root(back), &x) || x != t * 100000 + i)
                    bad++;
                gser_msg_destroy(back);
                gser_frames_destroy(f);
                gser_msg_destroy(m);
            }
        });
    for (auto &th : threads)
        th.join();
    EXPECT_EQ(bad.load(), 0);
}

TEST_F(DecoderValues, NarrowIntArraysAreWidenedAndCheckedLikeOthers)
{
    // [ext(5), container, kind, count, data] with the data inline.
    auto array = [](uint8_t kind, uint64_t count, std::string data) {
        return craft([=](msgpack_packer *pk) {
            msgpack_pack_array(pk, 5);
            msgpack_pack_ext(pk, 0, 5);
            msgpack_pack_uint8(pk, 1); // a tuple
            msgpack_pack_uint8(pk, kind);
            msgpack_pack_uint64(pk, count);
            msgpack_pack_bin_with_body(pk, data.data(), data.size());
        });
    };
    // Sign-extended: 0xff is -1 in each width, little-endian.
    struct Case {
        uint8_t kind;
        std::string data;
        std::vector<int64_t> want;
    };
    for (const Case &c : {Case{32, std::string("\x80\xff\x7f", 3), {-128, -1, 127}},
                          Case{33, std::string("\x00\x80\xff\xff\x01\x00", 6), {-32768, -1, 1}},
                          Case{34, std::string("\x00\x00\x00\x80\xfe\xff\xff\xff\xff\xff\xff\x7f", 12),
                               {INT32_MIN, -2, INT32_MAX}}}) {
        MsgPtr back;
        ASSERT_EQ(decode_with(ctx(), array(c.kind, 3, c.data), nullptr, &back), GSER_OK)
            << gser_context_get_last_error(ctx());
        gser_value_t *r = gser_msg_get_root(back.get());
        EXPECT_EQ(gser_value_get_kind(r), GSER_KIND_TUPLE);
        gser_kind_t k;
        const void *got;
        size_t count;
        ASSERT_EQ(gser_list_get_array(r, &k, &got, &count), GSER_OK);
        EXPECT_EQ(k, GSER_KIND_INT) << "the value model has int64 only";
        ASSERT_EQ(count, 3u);
        for (size_t i = 0; i < 3; i++)
            EXPECT_EQ(static_cast<const int64_t *>(got)[i], c.want[i]) << int(c.kind) << " " << i;
    }
    std::string err;
    // A byte length that is not count x the width, and codes around the new ones.
    EXPECT_EQ(decode_crafted(ctx(), array(33, 3, std::string(5, '\0')), &err), GSER_ERR_FORMAT);
    EXPECT_EQ(decode_crafted(ctx(), array(34, 2, std::string(16, '\0')), &err), GSER_ERR_FORMAT);
    for (uint8_t kind : {0, 5, 31, 35, 255}) {
        EXPECT_EQ(decode_crafted(ctx(), array(kind, 1, std::string(1, '\0')), &err), GSER_ERR_FORMAT) << int(kind);
        EXPECT_NE(err.find("array marker needs"), std::string::npos) << err;
    }
    // Widening counts against max_expansion: 1,000,000 int8 items are 8 MB decoded.
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_expansion = 1;
    std::string mb(1000000, '\x01');
    EXPECT_EQ(decode_with(ctx(), array(32, mb.size(), mb), &lim), GSER_ERR_LIMIT_BYTES)
        << gser_context_get_last_error(ctx());
    lim.max_expansion = 16;
    EXPECT_EQ(decode_with(ctx(), array(32, mb.size(), mb), &lim), GSER_OK) << gser_context_get_last_error(ctx());
}
