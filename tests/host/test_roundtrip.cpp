// Serialize -> deserialize round trips, the header as standard msgpack, and
// zero-copy of buffers and arrays.
#include <cmath>
#include <limits>

#include <msgpack.h>

#include "host/common.hpp"

namespace {

class RoundTrip : public CtxTest {
  protected:
    // Serialize msg, deserialize from frames and from the flattened form, and
    // check both give a tree equal to the original.
    MsgPtr round_trip(gser_msg_t *msg, const gser_serialize_options_t *o = nullptr)
    {
        frames_ = serialize(ctx(), msg, o);
        if (!frames_)
            return nullptr;
        auto back = deserialize(ctx(), frames_.get());
        if (!back)
            return nullptr;
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(msg), gser_msg_get_root(back.get())));
        flat_ = flatten(frames_.get());
        gser_msg_t *f = nullptr;
        EXPECT_EQ(gser_deserialize_flat(ctx(), flat_.data(), flat_.size(), nullptr, nullptr, nullptr, &f), GSER_OK)
            << gser_context_get_last_error(ctx());
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(msg), gser_msg_get_root(f)));
        gser_msg_destroy(f);
        return back;
    }
    FramesPtr frames_;
    std::vector<unsigned char> flat_;
};

gser_value_t *put(gser_value_t *map, const char *key, gser_value_t *v)
{
    EXPECT_EQ(gser_map_put_cstr(map, key, v), GSER_OK);
    return v;
}

} // namespace

TEST_F(RoundTrip, EveryKindAndNesting)
{
    auto m = new_msg();
    gser_msg_t *M = m.get();
    gser_value_t *root, *v, *l, *t, *inner, *k;
    ASSERT_EQ(gser_msg_new_map(M, &root), GSER_OK);
    gser_msg_new_nil(M, &v), put(root, "nil", v);
    gser_msg_new_bool(M, false, &v), put(root, "false", v);
    gser_msg_new_int(M, INT64_MIN, &v), put(root, "int_min", v);
    gser_msg_new_int(M, INT64_MAX, &v), put(root, "int_max", v);
    gser_msg_new_int(M, -1, &v), put(root, "minus_one", v);
    gser_msg_new_uint(M, UINT64_MAX, &v), put(root, "uint_max", v);
    gser_msg_new_uint(M, 3, &v), put(root, "small_uint", v);
    gser_msg_new_float(M, -0.0, &v), put(root, "neg_zero", v);
    gser_msg_new_float(M, std::numeric_limits<double>::infinity(), &v), put(root, "inf", v);
    gser_msg_new_float(M, std::nan(""), &v), put(root, "nan", v);
    gser_msg_new_str(M, "h\xc3\xa9llo\0x", 8, &v), put(root, "utf8 with NUL", v);
    static const unsigned char bin[] = {0, 255, 1, 254};
    gser_msg_new_bytes(M, bin, sizeof bin, &v), put(root, "bytes", v);
    // list [1, "two", [3.0, nil], (true,), {}]
    gser_msg_new_list(M, &l), put(root, "list", l);
    gser_list_append_int(l, 1);
    gser_list_append_cstr(l, "two");
    gser_msg_new_list(M, &inner), gser_list_append(l, inner);
    gser_list_append_float(inner, 3.0);
    gser_list_append_nil(inner);
    gser_msg_new_tuple(M, &t), gser_list_append(l, t);
    gser_list_append_bool(t, true);
    gser_msg_new_map(M, &v), gser_list_append(l, v);
    // map with every scalar key kind
    gser_msg_new_map(M, &inner), put(root, "keys", inner);
    gser_value_t *val;
    gser_msg_new_cstr(M, "v", &val);
    gser_msg_new_int(M, -7, &k), gser_map_put(inner, k, val);
    gser_msg_new_uint(M, UINT64_MAX, &k), gser_map_put(inner, k, val);
    gser_msg_new_float(M, 2.5, &k), gser_map_put(inner, k, val);
    gser_msg_new_bool(M, true, &k), gser_map_put(inner, k, val);
    gser_msg_new_nil(M, &k), gser_map_put(inner, k, val);
    gser_msg_new_bytes(M, bin, 2, &k), gser_map_put(inner, k, val);
    // buffers: shaped, inline-sized, empty
    static int16_t grid[3][5];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 5; c++)
            grid[r][c] = (int16_t)(r * 100 + c);
    int64_t shape[2] = {3, 5};
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = grid;
    d.nbytes = sizeof grid;
    d.dtype = GSER_DTYPE_INT16;
    d.ndim = 2;
    d.shape = shape;
    ASSERT_EQ(gser_msg_new_buffer(M, &d, &v), GSER_OK);
    put(root, "grid", v);
    gser_buffer_desc_t e = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_msg_new_buffer(M, &e, &v), GSER_OK);
    put(root, "empty_buffer", v);
    // five levels of nesting
    gser_value_t *deep = root;
    for (int i = 0; i < 5; i++) {
        gser_value_t *next;
        gser_msg_new_map(M, &next);
        put(deep, "down", next);
        deep = next;
    }
    gser_msg_new_cstr(M, "bottom", &v), put(deep, "here", v);
    gser_msg_set_root(M, root);

    auto back = round_trip(M);
    ASSERT_TRUE(back);
    gser_value_t *r = gser_msg_get_root(back.get()), *got;
    ASSERT_EQ(gser_map_find_cstr(r, "uint_max", &got), GSER_OK);
    EXPECT_EQ(gser_value_get_kind(got), GSER_KIND_UINT);
    ASSERT_EQ(gser_map_find_cstr(r, "small_uint", &got), GSER_OK);
    EXPECT_EQ(gser_value_get_kind(got), GSER_KIND_UINT) << "uint stays uint even when it fits an int";
    ASSERT_EQ(gser_map_find_cstr(r, "neg_zero", &got), GSER_OK);
    double dz;
    gser_value_get_float(got, &dz);
    EXPECT_TRUE(std::signbit(dz));
    ASSERT_EQ(gser_map_find_cstr(r, "grid", &got), GSER_OK);
    gser_buffer_desc_t gd = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(got, &gd), GSER_OK);
    EXPECT_EQ(gd.dtype, GSER_DTYPE_INT16);
    ASSERT_EQ(gd.ndim, 2u);
    EXPECT_EQ(gd.shape[0], 3);
    EXPECT_EQ(gd.shape[1], 5);
    EXPECT_EQ(static_cast<const int16_t *>(gd.data)[2 * 5 + 4], 204);
}

TEST_F(RoundTrip, EmptyContainersAndScalarRoots)
{
    for (int kind = 0; kind < 6; kind++) {
        auto m = new_msg();
        gser_value_t *v = nullptr;
        switch (kind) {
        case 0: gser_msg_new_list(m.get(), &v); break;
        case 1: gser_msg_new_tuple(m.get(), &v); break;
        case 2: gser_msg_new_map(m.get(), &v); break;
        case 3: gser_msg_new_str(m.get(), "", 0, &v); break;
        case 4: gser_msg_new_bytes(m.get(), nullptr, 0, &v); break;
        case 5: gser_msg_new_int(m.get(), 42, &v); break;
        }
        ASSERT_NE(v, nullptr);
        gser_msg_set_root(m.get(), v);
        auto back = round_trip(m.get());
        ASSERT_TRUE(back);
        EXPECT_EQ(gser_value_get_kind(gser_msg_get_root(back.get())), gser_value_get_kind(v)) << kind;
        EXPECT_EQ(gser_frames_get_count(frames_.get()), 1u) << "no data frames for " << kind;
    }
    auto m = new_msg(); // root left nil
    auto back = round_trip(m.get());
    ASSERT_TRUE(back);
    EXPECT_EQ(gser_value_get_kind(gser_msg_get_root(back.get())), GSER_KIND_NIL);
}

TEST_F(RoundTrip, MillionElementListsBecomeOneZeroCopyFrame)
{
    const size_t n = 1000000;
    for (gser_kind_t kind : {GSER_KIND_FLOAT, GSER_KIND_INT, GSER_KIND_UINT, GSER_KIND_BOOL}) {
        auto m = new_msg();
        gser_value_t *l;
        ASSERT_EQ(gser_msg_new_list(m.get(), &l), GSER_OK);
        for (size_t i = 0; i < n; i++) {
            gser_status_t st = kind == GSER_KIND_FLOAT  ? gser_list_append_float(l, 1.5 + (double)i)
                               : kind == GSER_KIND_INT  ? gser_list_append_int(l, -(int64_t)i)
                               : kind == GSER_KIND_UINT ? gser_list_append_uint(l, UINT64_MAX - i)
                                                        : gser_list_append_bool(l, i % 3 == 0);
            ASSERT_EQ(st, GSER_OK);
        }
        gser_msg_set_root(m.get(), l);
        auto back = round_trip(m.get());
        ASSERT_TRUE(back);
        const size_t es = kind == GSER_KIND_BOOL ? 1 : 8;
        ASSERT_EQ(gser_frames_get_count(frames_.get()), 2u) << gser_kind_str(kind);
        EXPECT_LT(gser_frames_get_array(frames_.get())[0].size, 64u) << "the elements are not in the header";
        const gser_frame_t &f = gser_frames_get_array(frames_.get())[1];
        EXPECT_EQ(f.size, n * es);

        gser_kind_t k;
        const void *sent, *got;
        size_t count;
        ASSERT_EQ(gser_list_get_array(l, &k, &sent, &count), GSER_OK);
        EXPECT_EQ(f.data, sent) << "the frame is the list's own storage";
        gser_value_t *r = gser_msg_get_root(back.get());
        EXPECT_EQ(gser_value_get_kind(r), GSER_KIND_LIST);
        ASSERT_EQ(gser_list_get_array(r, &k, &got, &count), GSER_OK);
        EXPECT_EQ(k, kind);
        EXPECT_EQ(count, n);
        EXPECT_EQ(got, f.data) << "the received array is the frame (zero-copy)";
        gser_value_t *e;
        ASSERT_EQ(gser_list_get(r, n - 1, &e), GSER_OK);
        EXPECT_EQ(gser_value_get_kind(e), kind);
    }
}

TEST_F(RoundTrip, MixedListsStayElementWise)
{
    auto m = new_msg();
    gser_value_t *root, *mixed, *with_nil, *v;
    gser_msg_new_map(m.get(), &root);
    gser_msg_new_list(m.get(), &mixed);
    gser_msg_new_list(m.get(), &with_nil);
    for (int i = 0; i < 1000; i++) {
        gser_list_append_float(mixed, i);
        gser_list_append_int(mixed, i);
        gser_list_append_int(with_nil, i);
    }
    gser_list_append_nil(with_nil);
    put(root, "mixed", mixed);
    put(root, "with_nil", with_nil);
    gser_msg_set_root(m.get(), root);
    auto back = round_trip(m.get());
    ASSERT_TRUE(back);
    EXPECT_EQ(gser_frames_get_count(frames_.get()), 1u) << "mixed lists stay element-wise";
    gser_value_t *got, *e;
    gser_kind_t k;
    const void *data;
    size_t count;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(back.get()), "mixed", &got), GSER_OK);
    EXPECT_EQ(gser_list_get_array(got, &k, &data, &count), GSER_ERR_TYPE_MISMATCH);
    ASSERT_EQ(gser_value_get_len(got), 2000u);
    gser_list_get(got, 10, &e);
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_FLOAT);
    gser_list_get(got, 11, &e);
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_INT);
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(back.get()), "with_nil", &got), GSER_OK);
    gser_list_get(got, 1000, &e);
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_NIL);
    (void)v;
}

TEST_F(RoundTrip, BoxedHomogeneousListsAreConvertedWhenSent)
{
    // An element-wise list on the wire (as a foreign encoder would send it)
    // arrives boxed; forwarding it converts it to one array frame.
    auto m = new_msg();
    gser_value_t *l;
    gser_msg_new_list(m.get(), &l);
    for (int i = 0; i < 1000; i++)
        gser_list_append_float(l, i + 0.5);
    gser_msg_set_root(m.get(), l);
    gser_serialize_options_t elementwise = GSER_SERIALIZE_OPTIONS_INIT;
    elementwise.array_min = SIZE_MAX;
    auto f1 = serialize(ctx(), m.get(), &elementwise);
    EXPECT_EQ(gser_frames_get_count(f1.get()), 1u);
    auto boxed = deserialize(ctx(), f1.get());
    gser_kind_t k;
    const void *data;
    size_t count;
    ASSERT_EQ(gser_list_get_array(gser_msg_get_root(boxed.get()), &k, &data, &count), GSER_ERR_TYPE_MISMATCH);
    auto f2 = serialize(ctx(), boxed.get());
    EXPECT_EQ(gser_frames_get_count(f2.get()), 2u) << "converted to a contiguous array frame";
    EXPECT_EQ(gser_frames_get_array(f2.get())[1].size, 8000u);
    auto back = deserialize(ctx(), f2.get());
    ASSERT_EQ(gser_list_get_array(gser_msg_get_root(back.get()), &k, &data, &count), GSER_OK);
    EXPECT_EQ(k, GSER_KIND_FLOAT);
    EXPECT_EQ(static_cast<const double *>(data)[999], 999.5);
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back.get())));
}

TEST_F(RoundTrip, ShortListsStartingWithAUintAreLists)
{
    // A uint is an ext on the wire: an element-wise list that starts with one
    // must not be mistaken for a marker.
    auto m = new_msg();
    gser_value_t *root, *l, *t;
    gser_msg_new_list(m.get(), &root);
    gser_msg_new_list(m.get(), &l);
    gser_list_append_uint(l, 5);
    gser_list_append_int(l, 1);
    gser_list_append(root, l);
    gser_msg_new_tuple(m.get(), &t);
    gser_list_append_uint(t, UINT64_MAX);
    gser_list_append_uint(t, 2);
    gser_list_append(root, t);
    gser_msg_set_root(m.get(), root);
    auto back = round_trip(m.get());
    ASSERT_TRUE(back);
    gser_value_t *got, *e;
    ASSERT_EQ(gser_list_get(gser_msg_get_root(back.get()), 0, &got), GSER_OK);
    EXPECT_EQ(gser_value_get_kind(got), GSER_KIND_LIST);
    ASSERT_EQ(gser_list_get(got, 0, &e), GSER_OK);
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_UINT);
    ASSERT_EQ(gser_list_get(gser_msg_get_root(back.get()), 1, &got), GSER_OK);
    EXPECT_EQ(gser_value_get_kind(got), GSER_KIND_TUPLE);
    EXPECT_EQ(gser_value_get_len(got), 2u);
}

TEST_F(RoundTrip, ArrayThresholdIsConfigurable)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.array_min = 4;
    o.inline_max = 1; // every non-empty array becomes a frame
    ctx_ = make_ctx(&o);
    for (size_t n : {3, 4}) {
        auto m = new_msg();
        gser_value_t *l, *v;
        gser_msg_new_list(m.get(), &l);
        for (size_t i = 0; i < n; i++) {
            // conversion is decided by the threshold at send time
            gser_msg_new_float(m.get(), (double)i, &v);
            gser_list_append(l, v);
        }
        gser_msg_set_root(m.get(), l);
        auto back = round_trip(m.get());
        ASSERT_TRUE(back);
        EXPECT_EQ(gser_frames_get_count(frames_.get()), n >= 4 ? 2u : 1u) << n;
        gser_kind_t k;
        const void *data;
        size_t count;
        EXPECT_EQ(gser_list_get_array(gser_msg_get_root(back.get()), &k, &data, &count),
                  n >= 4 ? GSER_OK : GSER_ERR_TYPE_MISMATCH);
    }
    // Per call override.
    auto m = new_msg();
    gser_value_t *l;
    gser_msg_new_list(m.get(), &l);
    for (int i = 0; i < 100; i++)
        gser_list_append_int(l, i);
    gser_msg_set_root(m.get(), l);
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.array_min = SIZE_MAX;
    auto frames = serialize(ctx(), m.get(), &so);
    EXPECT_EQ(gser_frames_get_count(frames.get()), 1u) << "conversion disabled";
}

TEST_F(RoundTrip, NarrowIntsGoAsNarrowAsTheirRangeAndComeBackAsInt64)
{
    // Each case: the items, and the element size narrow_ints writes.
    struct Case {
        std::vector<int64_t> v;
        size_t es;
    };
    std::vector<Case> cases = {
        {{0, 127, -128}, 1},
        {{0, 128}, 2},
        {{-129, 5}, 2},
        {{32767, -32768}, 2},
        {{32768}, 4},
        {{-32769}, 4},
        {{INT32_MAX, INT32_MIN}, 4},
        {{(int64_t)INT32_MAX + 1}, 8},
        {{(int64_t)INT32_MIN - 1}, 8},
        {{INT64_MIN, INT64_MAX}, 8},
    };
    gser_context_options_t co = GSER_CONTEXT_OPTIONS_INIT;
    co.inline_max = 1; // the data in a frame, whose size says the width
    ctx_ = make_ctx(&co);
    for (const Case &c : cases) {
        for (size_t n : {size_t(1249), size_t(1250), size_t(5000)}) { // from 10,000 bytes as int64
            for (bool narrow : {false, true}) {
                auto m = new_msg();
                gser_value_t *l;
                ASSERT_EQ(gser_msg_new_list(m.get(), &l), GSER_OK);
                for (size_t i = 0; i < n; i++)
                    ASSERT_EQ(gser_list_append_int(l, c.v[i % c.v.size()]), GSER_OK);
                gser_msg_set_root(m.get(), l);
                gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
                so.narrow_ints = narrow;
                auto back = round_trip(m.get(), &so); // equal to the original, from frames and flattened
                ASSERT_TRUE(back) << gser_context_get_last_error(ctx());
                ASSERT_EQ(gser_frames_get_count(frames_.get()), 2u);
                EXPECT_EQ(gser_frames_get_array(frames_.get())[1].size, n * (narrow && n >= 1250 ? c.es : 8))
                    << c.v[0] << " " << n;
                gser_kind_t k;
                const void *got;
                size_t count;
                ASSERT_EQ(gser_list_get_array(gser_msg_get_root(back.get()), &k, &got, &count), GSER_OK);
                EXPECT_EQ(k, GSER_KIND_INT);
                ASSERT_EQ(count, n);
                for (size_t i = 0; i < n; i++)
                    ASSERT_EQ(static_cast<const int64_t *>(got)[i], c.v[i % c.v.size()]) << i;
            }
        }
    }
}

TEST_F(RoundTrip, TuplesStayTuplesListsStayLists)
{
    auto m = new_msg();
    gser_value_t *root, *t, *big_t, *l, *empty_t, *v;
    gser_msg_new_list(m.get(), &root);
    gser_msg_new_tuple(m.get(), &t);
    gser_list_append_int(t, 1);
    gser_list_append_cstr(t, "a");
    gser_list_append(root, t);
    gser_msg_new_tuple(m.get(), &big_t);
    for (int i = 0; i < 100; i++)
        gser_list_append_float(big_t, i);
    gser_list_append(root, big_t);
    gser_msg_new_list(m.get(), &l);
    gser_list_append_int(l, 1);
    gser_list_append_cstr(l, "a");
    gser_list_append(root, l);
    gser_msg_new_tuple(m.get(), &empty_t);
    gser_list_append(root, empty_t);
    gser_msg_set_root(m.get(), root);
    auto back = round_trip(m.get());
    ASSERT_TRUE(back);
    gser_value_t *r = gser_msg_get_root(back.get());
    EXPECT_EQ(gser_value_get_kind(r), GSER_KIND_LIST);
    gser_list_get(r, 0, &v);
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_TUPLE);
    gser_list_get(r, 1, &v);
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_TUPLE) << "an array-backed tuple is still a tuple";
    gser_list_get(r, 2, &v);
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_LIST);
    gser_list_get(r, 3, &v);
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_TUPLE);
    EXPECT_EQ(gser_value_get_len(v), 0u);
}

TEST_F(RoundTrip, UserKeysCannotCollideWithMarkers)
{
    auto m = new_msg();
    gser_value_t *root, *v;
    gser_msg_new_map(m.get(), &root);
    gser_msg_new_int(m.get(), 0, &v);
    put(root, "__Serialized__", v);
    gser_msg_new_cstr(m.get(), "GSER", &v);
    put(root, "__tuple__", v);
    gser_msg_set_root(m.get(), root);
    auto back = round_trip(m.get());
    ASSERT_TRUE(back);
    gser_value_t *r = gser_msg_get_root(back.get());
    ASSERT_EQ(gser_value_get_kind(r), GSER_KIND_MAP);
    ASSERT_EQ(gser_value_get_len(r), 2u);
    gser_value_t *got;
    ASSERT_EQ(gser_map_find_cstr(r, "__Serialized__", &got), GSER_OK);
    int64_t i = -1;
    gser_value_get_int(got, &i);
    EXPECT_EQ(i, 0);
}

TEST_F(RoundTrip, HeaderIsStandardMsgpack)
{
    auto m = new_msg();
    gser_value_t *root, *v, *t;
    gser_msg_new_map(m.get(), &root);
    gser_msg_new_cstr(m.get(), "x", &v);
    put(root, "__Serialized__", v);
    gser_msg_new_tuple(m.get(), &t);
    gser_list_append_int(t, 5);
    put(root, "t", t);
    gser_msg_set_root(m.get(), root);
    auto frames = serialize(ctx(), m.get());
    const gser_frame_t &h = gser_frames_get_array(frames.get())[0];

    // Any msgpack decoder reads it: here, msgpack-c on its own.
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    ASSERT_EQ(msgpack_unpack_next(&up, static_cast<const char *>(h.data), h.size, &off), MSGPACK_UNPACK_SUCCESS);
    EXPECT_EQ(off, h.size);
    const msgpack_object &top = up.data;
    ASSERT_EQ(top.type, MSGPACK_OBJECT_ARRAY);
    ASSERT_EQ(top.via.array.size, 4u);
    const msgpack_object &magic = top.via.array.ptr[0];
    ASSERT_EQ(magic.type, MSGPACK_OBJECT_EXT);
    EXPECT_EQ(std::string(magic.via.ext.ptr, magic.via.ext.size), "GSER");
    EXPECT_EQ(top.via.array.ptr[1].via.u64, 2u) << "a message without compressed frames is version 2";
    const msgpack_object &tree = top.via.array.ptr[2];
    ASSERT_EQ(tree.type, MSGPACK_OBJECT_MAP) << "a user map is an ordinary msgpack map";
    ASSERT_EQ(tree.via.map.size, 2u);
    const msgpack_object_kv &kv = tree.via.map.ptr[0];
    ASSERT_EQ(kv.key.type, MSGPACK_OBJECT_STR);
    EXPECT_EQ(std::string(kv.key.via.str.ptr, kv.key.via.str.size), "__Serialized__");
    EXPECT_EQ(kv.val.type, MSGPACK_OBJECT_STR);
    const msgpack_object &tup = tree.via.map.ptr[1].val;
    ASSERT_EQ(tup.type, MSGPACK_OBJECT_ARRAY);
    ASSERT_EQ(tup.via.array.size, 2u);
    EXPECT_EQ(tup.via.array.ptr[0].type, MSGPACK_OBJECT_EXT) << "tuples are marked with an ext type";
    EXPECT_EQ(top.via.array.ptr[3].type, MSGPACK_OBJECT_ARRAY) << "frame table";
    msgpack_unpacked_destroy(&up);
}

TEST_F(RoundTrip, HostBuffersAreFramesWithoutCopies)
{
    std::vector<uint8_t> big(1 << 20);
    for (size_t i = 0; i < big.size(); i++)
        big[i] = (uint8_t)(i * 7);
    auto m = new_msg();
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = big.data();
    d.nbytes = big.size();
    d.dtype = GSER_DTYPE_UINT8;
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_OK);
    gser_msg_set_root(m.get(), v);
    auto frames = serialize(ctx(), m.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].data, big.data()) << "the frame points at the caller's bytes";
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].memory, GSER_MEMORY_HOST);
    auto back = deserialize(ctx(), frames.get());
    gser_buffer_desc_t got = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(gser_msg_get_root(back.get()), &got), GSER_OK);
    EXPECT_EQ(got.data, big.data()) << "and the received buffer points at the frame";
}

TEST_F(RoundTrip, SmallBuffersAreInlinedBelowTheThreshold)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.inline_max = 64;
    ctx_ = make_ctx(&o);
    static const char bytes[64] = "payload";
    for (size_t n : {0, 1, 63, 64, 65}) {
        auto m = new_msg();
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = bytes;
        d.nbytes = n;
        gser_value_t *v;
        ASSERT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_OK);
        gser_msg_set_root(m.get(), v);
        std::vector<char> src(bytes, bytes + 64);
        if (n > 64) {
            src.assign(n, 'x');
            d.data = src.data();
            ASSERT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_OK);
            gser_msg_set_root(m.get(), v);
        }
        auto frames = serialize(ctx(), m.get());
        EXPECT_EQ(gser_frames_get_count(frames.get()), n < 64 ? 1u : 2u) << n;
        auto back = deserialize(ctx(), frames.get());
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back.get()))) << n;
    }
}

TEST_F(RoundTrip, MisalignedFramesAreCopiedToAlignedMemory)
{
    std::vector<double> vals(1000);
    for (size_t i = 0; i < vals.size(); i++)
        vals[i] = 0.25 * (double)i;
    auto m = new_msg();
    gser_value_t *l;
    ASSERT_EQ(gser_msg_new_array(m.get(), GSER_KIND_FLOAT, vals.data(), vals.size(), 0, &l), GSER_OK);
    gser_msg_set_root(m.get(), l);
    auto frames = serialize(ctx(), m.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    // Put the data frame at an odd address.
    std::vector<unsigned char> shifted(vals.size() * 8 + 1);
    std::memcpy(shifted.data() + 1, vals.data(), vals.size() * 8);
    gser_frame_t fr[2] = {gser_frames_get_array(frames.get())[0], gser_frames_get_array(frames.get())[1]};
    fr[1].data = shifted.data() + 1;
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize(ctx(), fr, 2, nullptr, &back), GSER_OK) << gser_context_get_last_error(ctx());
    gser_kind_t k;
    const void *data;
    size_t count;
    ASSERT_EQ(gser_list_get_array(gser_msg_get_root(back), &k, &data, &count), GSER_OK);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % alignof(double), 0u);
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back)));
    gser_msg_destroy(back);
}

static void count_frame_release(void *, void *arg)
{
    ++*static_cast<int *>(arg);
}

TEST_F(RoundTrip, FramesHandedOverAreReleasedOnceAndOnlyOnSuccess)
{
    auto m = new_msg();
    std::vector<double> vals(100, 2.0);
    gser_value_t *l;
    gser_msg_new_array(m.get(), GSER_KIND_FLOAT, vals.data(), vals.size(), 0, &l);
    gser_msg_set_root(m.get(), l);
    auto frames = serialize(ctx(), m.get());
    int released = 0;
    std::vector<gser_frame_t> fr(gser_frames_get_array(frames.get()),
                                 gser_frames_get_array(frames.get()) + gser_frames_get_count(frames.get()));
    for (auto &f : fr) {
        f.release = count_frame_release;
        f.release_arg = &released;
    }
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize(ctx(), fr.data(), fr.size(), nullptr, &back), GSER_OK);
    EXPECT_EQ(released, 0);
    gser_msg_destroy(back);
    EXPECT_EQ(released, 2);

    // Taking a frame moves its release to the caller.
    released = 0;
    ASSERT_EQ(gser_deserialize(ctx(), fr.data(), fr.size(), nullptr, &back), GSER_OK);
    gser_frame_t taken;
    ASSERT_EQ(gser_msg_take_frame(back, 1, &taken), GSER_OK);
    EXPECT_EQ(taken.data, fr[1].data);
    EXPECT_EQ(gser_msg_take_frame(back, 1, &taken), GSER_ERR_STATE) << "taken already";
    EXPECT_EQ(gser_msg_take_frame(back, 9, &taken), GSER_ERR_OUT_OF_RANGE);
    gser_msg_destroy(back);
    EXPECT_EQ(released, 1) << "only the header was released by the message";
    taken.release((void *)taken.data, taken.release_arg);
    EXPECT_EQ(released, 2);

    released = 0;
    fr[1].size -= 8; // now the frame table disagrees: the call fails
    EXPECT_EQ(gser_deserialize(ctx(), fr.data(), fr.size(), nullptr, &back), GSER_ERR_FRAME);
    EXPECT_EQ(released, 0) << "on failure the caller keeps ownership";
}
