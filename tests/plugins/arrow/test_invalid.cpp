// Invalid Arrow input is refused with a specific status and a message naming
// the column path; so are unsupported types and device types. The receiver
// checks the sub-tree as untrusted input (a hand-made "arrow.array" sender
// produces the bad ones).
#include "arrow_common.hpp"

using namespace arrowtest;

namespace {

CtxPtr ctx_for(const char *backend)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = backend;
    gser_context_t *c = nullptr;
    if (gser_context_create(&o, &c) != GSER_OK)
        return nullptr;
    EXPECT_EQ(gser_arrow_register(c), GSER_OK);
    return CtxPtr(c);
}

class ArrowInvalid : public ::testing::TestWithParam<const char *> {
  public:
    void SetUp() override
    {
        device_ = std::string(GetParam()) != "host";
        ctx_ = ctx_for(device_ ? GetParam() : "none");
        if (!ctx_)
            GTEST_SKIP() << GetParam() << " backend unavailable: " << gser_context_get_last_error(nullptr);
    }
    gser_context_t *ctx() { return ctx_.get(); }

    // A fresh valid table: a int64, b utf8, c list<int32>, d struct<x int32>.
    std::unique_ptr<Node> table20(int64_t rows = 20)
    {
        Gen g({0.2, false, 3});
        auto t = g.make(table({S("l", "a"), S("u", "b"), S("+l", "c", {S("i", "item")}),
                               S("+s", "d", {S("i", "x")})}),
                        rows);
        return t;
    }

    // Serialize root (finished beforehand, possibly mutated) with the send
    // flags: the status, and the context's message in *why. When recv is
    // given and serializing worked, also deserialize the frames, as a peer
    // would: its status in *recv and its message in *recv_why.
    gser_status_t serialize(Node &root, std::string *why, int device_type = 0, unsigned flags = 0,
                            gser_status_t *recv = nullptr, std::string *recv_why = nullptr)
    {
        ArrowDeviceArray da{};
        da.array = root.array;
        da.device_type = device_type ? device_type : device_ ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
        gser_msg_t *m;
        EXPECT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *map, *v;
        EXPECT_EQ(gser_msg_new_map(m, &map), GSER_OK);
        gser_arrow_send_options_t so = GSER_ARROW_SEND_OPTIONS_INIT;
        so.flags = flags;
        EXPECT_EQ(gser_arrow_new_value(m, &da, &root.schema, &so, &v), GSER_OK);
        EXPECT_EQ(gser_map_put_cstr(map, "table", v), GSER_OK);
        EXPECT_EQ(gser_msg_set_root(m, map), GSER_OK);
        gser_frames_t *f = nullptr;
        gser_status_t st = gser_serialize(ctx(), m, nullptr, &f);
        *why = gser_context_get_last_error(ctx());
        if (st == GSER_OK && recv) {
            gser_msg_t *back = nullptr;
            *recv = gser_deserialize(ctx(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &back);
            *recv_why = gser_context_get_last_error(ctx());
            gser_msg_destroy(back);
        }
        gser_frames_destroy(f);
        return st;
    }

    // Expect status and every fragment in the message.
    void expect(Node &root, gser_status_t status, std::vector<std::string> fragments, int device_type = 0,
                unsigned flags = 0)
    {
        std::string why;
        EXPECT_EQ(serialize(root, &why, device_type, flags), status) << why;
        for (auto &f : fragments)
            EXPECT_NE(why.find(f), std::string::npos) << "\"" << f << "\" not in: " << why;
        EXPECT_NE(why.find("$.table"), std::string::npos) << "the value's path: " << why;
    }

    bool device_ = false;
    CtxPtr ctx_;
};

TEST_P(ArrowInvalid, NegativeLengthOffsetAndNullCount)
{
    auto t = table20();
    t->finish(ctx(), device_);
    t->array.length = -1;
    expect(*t, GSER_ERR_INVALID_ARG, {"the table (format \"+s\")", "negative length (-1)"});
    t->finish(ctx(), device_);
    t->children[1]->array.offset = -3;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"b\" (format \"u\")", "negative offset (-3)"});
    t->finish(ctx(), device_);
    t->children[0]->array.null_count = -2;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"a\"", "negative null_count (-2)"});
    t->finish(ctx(), device_);
    t->children[3]->children[0]->array.length = -5;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"d.x\" (format \"i\")", "negative length"});
    // null_count -1 ("not computed") is the spec's, and fine.
    t->finish(ctx(), device_);
    t->children[0]->array.null_count = -1;
    std::string why;
    EXPECT_EQ(serialize(*t, &why), GSER_OK) << why;
}

TEST_P(ArrowInvalid, OffsetsOutOfBoundsOrDecreasing)
{
    {
        auto t = table20();
        int32_t v = 1000; // the list's last offset past its child
        std::memcpy(&t->children[2]->bufs[1][20 * 4], &v, 4);
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_OUT_OF_RANGE, {"column \"c\" (format \"+l\")", "of child 0 are needed"});
    }
    {
        auto t = table20();
        int32_t v = -4; // a negative first offset
        std::memcpy(&t->children[1]->bufs[1][0], &v, 4);
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_OUT_OF_RANGE, {"column \"b\" (format \"u\")", "offset 0 is negative"});
    }
    {
        // Decreasing in the middle. By default the sender checks the first
        // and last offset only, unless it read them all anyway (a short
        // device column); the receiver finds it either way. With
        // GSER_ARROW_CHECK_OFFSETS the sender finds it too.
        auto t = table20();
        int32_t v = -1;
        std::memcpy(&t->children[1]->bufs[1][6 * 4], &v, 4);
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_OUT_OF_RANGE, {"column \"b\"", "offset 6 (-1) is less than offset 5"}, 0,
               GSER_ARROW_CHECK_OFFSETS);
        std::string why, recv_why;
        gser_status_t recv = GSER_OK;
        if (device_) {
            expect(*t, GSER_ERR_OUT_OF_RANGE, {"column \"b\"", "offset 6 (-1) is less than offset 5"});
        } else {
            ASSERT_EQ(serialize(*t, &why, 0, 0, &recv, &recv_why), GSER_OK) << why;
            EXPECT_EQ(recv, GSER_ERR_FORMAT) << recv_why;
            EXPECT_NE(recv_why.find("offset 6 is less than offset 5"), std::string::npos) << recv_why;
        }
    }
    {
        // A long column, decreasing in the middle: in device memory the
        // sender reads only the first and last offset; with the flag it
        // checks the rest on the device. The receiver always finds it.
        auto t = table20(200);
        int32_t v = 3;
        std::memcpy(&t->children[1]->bufs[1][120 * 4], &v, 4);
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_OUT_OF_RANGE,
               {"column \"b\"", device_ ? "offsets 0..200 decrease somewhere (checked on the device)"
                                         : "offset 120 (3) is less than offset 119"},
               0, GSER_ARROW_CHECK_OFFSETS);
        std::string why, recv_why;
        gser_status_t recv = GSER_OK;
        ASSERT_EQ(serialize(*t, &why, 0, 0, &recv, &recv_why), GSER_OK) << why;
        EXPECT_EQ(recv, GSER_ERR_FORMAT) << recv_why;
        EXPECT_NE(recv_why.find(device_ ? "decrease" : "offset 120 is less than offset 119"), std::string::npos)
            << recv_why;
        EXPECT_NE(recv_why.find("$.table"), std::string::npos) << recv_why;
    }
    {
        // A long column: the end before the start is found without the flag.
        auto t = table20(200);
        auto &offs = t->children[1]->bufs[1];
        int32_t first = 50, last = 10;
        std::memcpy(&offs[0], &first, 4);
        std::memcpy(&offs[200 * 4], &last, 4);
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_OUT_OF_RANGE, {"column \"b\"", "offset 200 (10) is less than offset 0 (50)"});
    }
}

TEST_P(ArrowInvalid, MissingBuffersAndCountsThatDoNotMatchTheFormat)
{
    auto t = table20();
    t->children[0]->buf_null[1] = true;
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"a\" (format \"l\")", "buffer 1 (values) is NULL"});
    t = table20();
    t->children[1]->buf_null[2] = true;
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"b\"", "buffer 2 (data) is NULL"});
    t = table20();
    t->children[1]->buf_null[1] = true;
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"b\"", "buffer 1 (offsets) is NULL"});
    t = table20();
    t->children[0]->buf_null[0] = true; // nulls, but no bitmap
    t->children[0]->null_count = 3;
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"a\"", "null_count is 3 but the validity bitmap is NULL"});
    t = table20();
    t->finish(ctx(), device_);
    t->children[0]->array.n_buffers = 3;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"a\"", "n_buffers is 3, the format has 2"});
    t->finish(ctx(), device_);
    t->children[2]->array.n_children = 0;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"c\"", "n_children is 1 in the schema and 0 in the array"});
    t->finish(ctx(), device_);
    t->children[3]->schema.n_children = 2;
    t->children[3]->array.n_children = 2;
    t->children[3]->schema_children.push_back(nullptr);
    t->children[3]->array_children.push_back(nullptr);
    t->children[3]->schema.children = t->children[3]->schema_children.data();
    t->children[3]->array.children = t->children[3]->array_children.data();
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"d.[1]\"", "the schema is NULL"});
    t = table20();
    t->finish(ctx(), device_);
    t->array.buffers = nullptr;
    expect(*t, GSER_ERR_INVALID_ARG, {"the table", "buffers is NULL"});
}

TEST_P(ArrowInvalid, ReleasedStructsAreRefused)
{
    auto t = table20();
    t->finish(ctx(), device_);
    t->children[3]->array.release = nullptr;
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"d\" (format \"+s\")", "the array's release callback is NULL"});
    t->finish(ctx(), device_);
    t->schema.release = nullptr;
    expect(*t, GSER_ERR_INVALID_ARG, {"the table", "the schema's release callback is NULL"});
}

TEST_P(ArrowInvalid, UnsupportedTypesAndDeviceTypes)
{
    auto t = table20();
    t->children[3]->children[0]->format = "vu"; // a string view
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_UNSUPPORTED, {"column \"d.x\" (format \"vu\")", "type \"vu\" is not supported"});
    for (const char *bad : {"+ud:0,1", "+r", "d:0,2", "d:10,2,100", "w:0", "tsx:", "ttz", "Q", ""}) {
        t = table20();
        t->children[0]->format = bad;
        t->finish(ctx(), device_);
        expect(*t, GSER_ERR_UNSUPPORTED, {"column \"a\"", std::string("type \"") + bad + "\" is not supported"});
    }
    t = table20();
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_UNSUPPORTED, {"device type 8 is not supported"}, ARROW_DEVICE_METAL);
    // Dictionary indices must be integers.
    t = table20();
    t->children[0]->format = "g";
    t->children[0]->dictionary = Gen({0, false, 1}).make(S("u"), 3);
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_INVALID_ARG, {"column \"a\" (format \"g\")", "dictionary indices must be an integer type"});
}

TEST_P(ArrowInvalid, NestingDeeperThanTheLimit)
{
    Spec s = S("i", "leaf");
    for (int d = 0; d < 70; d++)
        s = S("+s", "s" + std::to_string(d), {s});
    auto t = Gen({0, false, 1}).make(table({s}), 2);
    t->finish(ctx(), device_);
    expect(*t, GSER_ERR_LIMIT_DEPTH, {"types nest deeper than 64 levels"});
}

INSTANTIATE_TEST_SUITE_P(Backends, ArrowInvalid, ::testing::Values("host", "emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

TEST(ArrowInvalidSetup, DeviceTablesNeedADeviceBackendAndTheTypeRegistered)
{
    CtxPtr none = ctx_for("none");
    auto t = Gen({0, false, 1}).make(table({S("l", "a")}), 4);
    t->finish();
    ArrowDeviceArray da{};
    da.array = t->array;
    da.device_type = ARROW_DEVICE_CUDA; // claims device memory
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(none.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v;
    ASSERT_EQ(gser_arrow_new_value(m, &da, &t->schema, nullptr, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(none.get(), m, nullptr, &f), GSER_ERR_NO_DEVICE);
    EXPECT_NE(std::string(gser_context_get_last_error(none.get())).find("no device backend"), std::string::npos);

    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    CtxPtr plain = make_ctx(&o); // the plugin not registered
    gser_msg_t *m2;
    ASSERT_EQ(gser_msg_create(plain.get(), &m2), GSER_OK);
    MsgPtr mp2(m2);
    EXPECT_EQ(gser_arrow_new_value(m2, &da, &t->schema, nullptr, &v), GSER_ERR_NOT_FOUND);
    EXPECT_EQ(gser_arrow_register(nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_arrow_register(none.get()), GSER_ERR_STATE) << "registering after use";
    CtxPtr fresh = ctx_for("none");
    EXPECT_EQ(gser_arrow_register(fresh.get()), GSER_ERR_EXISTS) << "registered twice";
}

// ---- the receiver: a hand-made "arrow.array" sub-tree -------------------------------------------

using Builder = std::function<gser_value_t *(gser_msg_t *)>;

gser_status_t evil_serialize(gser_context_t *, const void *obj, gser_writer_t *w, void *)
{
    const Builder *b = static_cast<const Builder *>(obj);
    return gser_writer_set_root(w, (*b)(gser_writer_get_msg(w)));
}

gser_status_t evil_deserialize(gser_context_t *, gser_reader_t *, void **, void *)
{
    return GSER_ERR_UNSUPPORTED;
}

struct Wire {
    std::vector<std::vector<uint8_t>> keep; // buffer bytes, alive until serialized

    gser_value_t *list(gser_msg_t *m, std::vector<gser_value_t *> items)
    {
        gser_value_t *l;
        gser_msg_new_list(m, &l);
        for (auto *v : items)
            gser_list_append(l, v);
        return l;
    }
    gser_value_t *i(gser_msg_t *m, int64_t x)
    {
        gser_value_t *v;
        gser_msg_new_int(m, x, &v);
        return v;
    }
    gser_value_t *s(gser_msg_t *m, const char *x)
    {
        gser_value_t *v;
        gser_msg_new_cstr(m, x, &v);
        return v;
    }
    gser_value_t *nil(gser_msg_t *m)
    {
        gser_value_t *v;
        gser_msg_new_nil(m, &v);
        return v;
    }
    gser_value_t *b(gser_msg_t *m, bool x)
    {
        gser_value_t *v;
        gser_msg_new_bool(m, x, &v);
        return v;
    }
    gser_value_t *buf(gser_msg_t *m, std::vector<uint8_t> bytes)
    {
        keep.push_back(std::move(bytes));
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = keep.back().data();
        d.nbytes = keep.back().size();
        gser_value_t *v;
        gser_msg_new_buffer(m, &d, &v);
        return v;
    }
    gser_value_t *schema_node(gser_msg_t *m, const char *fmt, int64_t nchildren = 0, bool dict = false,
                              gser_value_t *meta = nullptr)
    {
        return list(m, {s(m, fmt), s(m, "col"), i(m, 2), meta ? meta : nil(m), i(m, nchildren), b(m, dict)});
    }
    gser_value_t *root(gser_msg_t *m, gser_value_t *schema, gser_value_t *array)
    {
        gser_value_t *map;
        gser_msg_new_map(m, &map);
        gser_map_put_cstr(map, "device", i(m, ARROW_DEVICE_CPU));
        gser_map_put_cstr(map, "schema", schema);
        gser_map_put_cstr(map, "array", array);
        return map;
    }
};

std::vector<uint8_t> i32s(std::vector<int32_t> v)
{
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

// Send what build makes as an "arrow.array"; the real plugin receives it.
void expect_refused(const Builder &build, gser_status_t status, const std::string &fragment)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    CtxPtr evil = make_ctx(&o);
    ASSERT_EQ(gser_type_register(evil.get(), GSER_ARROW_TYPE, GSER_ARROW_TYPE_VERSION, nullptr), GSER_OK);
    ASSERT_EQ(gser_type_add_family(evil.get(), GSER_ARROW_TYPE, "device", evil_serialize, evil_deserialize), GSER_OK);
    CtxPtr good = ctx_for("none");
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(evil.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_object(m, GSER_ARROW_TYPE, const_cast<Builder *>(&build), &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f;
    ASSERT_EQ(gser_serialize(evil.get(), m, nullptr, &f), GSER_OK) << gser_context_get_last_error(evil.get());
    FramesPtr fp(f);
    gser_msg_t *rm = nullptr;
    EXPECT_EQ(gser_deserialize(good.get(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &rm), status);
    std::string why = gser_context_get_last_error(good.get());
    EXPECT_NE(why.find(fragment), std::string::npos) << "\"" << fragment << "\" not in: " << why;
    gser_msg_destroy(rm);
}

TEST(ArrowReceiver, AValidHandMadeTableIsAccepted)
{
    Wire w;
    Builder ok = [&](gser_msg_t *m) {
        return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                      w.list(m, {w.list(m, {w.i(m, 2), w.i(m, 0), w.nil(m), w.buf(m, i32s({0, 1, 3})),
                                            w.buf(m, {'a', 'b', 'c'})})}));
    };
    expect_refused(ok, GSER_OK, "");
}

TEST(ArrowReceiver, MalformedSubTreesAreRefused)
{
    Wire w;
    auto utf8 = [&](gser_msg_t *m, int64_t len, int64_t nulls, gser_value_t *validity, std::vector<int32_t> offs,
                    std::vector<uint8_t> data) {
        return w.list(m, {w.i(m, len), w.i(m, nulls), validity, w.buf(m, i32s(offs)), w.buf(m, data)});
    };
    expect_refused([&](gser_msg_t *m) { return w.i(m, 5); }, GSER_ERR_FORMAT, "is not {device, schema, array}");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "vu")}), w.list(m, {w.list(m, {w.i(m, 0), w.i(m, 0)})}));
        },
        GSER_ERR_UNSUPPORTED, "type \"vu\" is not supported");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                          w.list(m, {utf8(m, 2, 0, w.nil(m), {1, 2, 3}, {'a', 'b'})}));
        },
        GSER_ERR_FORMAT, "offsets start at 1, not 0");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                          w.list(m, {utf8(m, 2, 0, w.nil(m), {0, 2, 1}, {'a', 'b'})}));
        },
        GSER_ERR_FORMAT, "offset 2 is less than offset 1");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                          w.list(m, {utf8(m, 2, 0, w.nil(m), {0, 1, 9}, {'a', 'b'})}));
        },
        GSER_ERR_FORMAT, "offsets end at 9, the data has 2");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                          w.list(m, {utf8(m, 3, 0, w.nil(m), {0, 1, 2}, {'a', 'b'})}));
        },
        GSER_ERR_FORMAT, "buffer 1 holds 12 bytes, 16 expected");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "u")}),
                          w.list(m, {utf8(m, 2, 1, w.nil(m), {0, 1, 2}, {'a', 'b'})}));
        },
        GSER_ERR_FORMAT, "1 nulls but no validity bitmap");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "+s", 1), w.schema_node(m, "i")}),
                          w.list(m, {w.list(m, {w.i(m, 2), w.i(m, 0), w.nil(m)}),
                                     w.list(m, {w.i(m, 3), w.i(m, 0), w.nil(m), w.buf(m, i32s({1, 2, 3}))})}));
        },
        GSER_ERR_FORMAT, "child 0 has 3 rows, the struct 2");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "+l", 0)}), w.list(m, {w.list(m, {w.i(m, 0)})}));
        },
        GSER_ERR_FORMAT, "bad number of children");
    expect_refused(
        [&](gser_msg_t *m) {
            gser_value_t *meta;
            static const char bad[] = {1, 0, 0, 0, 9, 0, 0, 0, 'k'};
            gser_msg_new_bytes(m, bad, sizeof bad, &meta);
            return w.root(m, w.list(m, {w.schema_node(m, "n", 0, false, meta)}),
                          w.list(m, {w.list(m, {w.i(m, 0), w.i(m, 0)})}));
        },
        GSER_ERR_FORMAT, "the metadata is malformed");
    expect_refused(
        [&](gser_msg_t *m) {
            // 70 structs, each the only child of the one before: a flat wire
            // list, but a nesting the receiver refuses.
            std::vector<gser_value_t *> schema, array;
            for (int d = 0; d < 70; d++) {
                schema.push_back(w.schema_node(m, "+s", 1));
                array.push_back(w.list(m, {w.i(m, 0), w.i(m, 0), w.nil(m)}));
            }
            schema.push_back(w.schema_node(m, "n"));
            array.push_back(w.list(m, {w.i(m, 0), w.i(m, 0)}));
            return w.root(m, w.list(m, schema), w.list(m, array));
        },
        GSER_ERR_LIMIT_DEPTH, "types nest deeper than 64 levels");
    expect_refused(
        [&](gser_msg_t *m) {
            return w.root(m, w.list(m, {w.schema_node(m, "+s", 2), w.schema_node(m, "n")}),
                          w.list(m, {w.list(m, {w.i(m, 0), w.i(m, 0), w.nil(m)}), w.list(m, {w.i(m, 0), w.i(m, 0)})}));
        },
        GSER_ERR_FORMAT, "bad number of children");
}

} // namespace

// A peer's offsets in device memory: the receiver checks them on the device
// (one pass, gser_device_check_offsets) before a consumer's kernel can read
// past the data. Found by fuzz_arrow.
TEST(ArrowReceiver, DeviceOffsetsFromAPeerAreChecked)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = "emulated";
    CtxPtr evil = make_ctx(&o);
    ASSERT_EQ(gser_type_register(evil.get(), GSER_ARROW_TYPE, GSER_ARROW_TYPE_VERSION, nullptr), GSER_OK);
    ASSERT_EQ(gser_type_add_family(evil.get(), GSER_ARROW_TYPE, "device", evil_serialize, evil_deserialize), GSER_OK);
    CtxPtr good = ctx_for("emulated");
    std::vector<void *> dev;
    auto devbuf = [&](gser_msg_t *m, std::vector<uint8_t> bytes) {
        void *p = nullptr;
        EXPECT_EQ(gser_device_alloc(evil.get(), bytes.size(), nullptr, &p), GSER_OK);
        EXPECT_EQ(gser_device_memcpy(evil.get(), p, GSER_MEMORY_DEVICE, bytes.data(), GSER_MEMORY_HOST, bytes.size(),
                                     nullptr),
                  GSER_OK);
        dev.push_back(p);
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = p;
        d.nbytes = bytes.size();
        d.memory = GSER_MEMORY_DEVICE;
        gser_value_t *v;
        gser_msg_new_buffer(m, &d, &v);
        return v;
    };
    Wire w;
    struct Case {
        std::vector<int32_t> offs;
        gser_status_t status;
        const char *fragment;
    } cases[] = {
        {{0, 1, 2}, GSER_OK, ""},
        {{0, 1, 4718592}, GSER_ERR_FORMAT, "do not end at the data's size"},
        {{0, 2, 1}, GSER_ERR_FORMAT, "decrease"},
        {{1, 1, 2}, GSER_ERR_FORMAT, "do not start at 0"},
    };
    for (const Case &c : cases) {
        Builder build = [&](gser_msg_t *m) {
            gser_value_t *root = w.root(
                m, w.list(m, {w.schema_node(m, "u")}),
                w.list(m, {w.list(m, {w.i(m, 2), w.i(m, 0), w.nil(m), devbuf(m, i32s(c.offs)), devbuf(m, {'a', 'b'})})}));
            gser_map_put_cstr(root, "device", w.i(m, ARROW_DEVICE_CUDA));
            return root;
        };
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(evil.get(), &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *v;
        ASSERT_EQ(gser_msg_new_object(m, GSER_ARROW_TYPE, &build, &v), GSER_OK);
        ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
        gser_frames_t *f;
        ASSERT_EQ(gser_serialize(evil.get(), m, nullptr, &f), GSER_OK) << gser_context_get_last_error(evil.get());
        FramesPtr fp(f);
        ASSERT_EQ(gser_frames_wait(f), GSER_OK);
        gser_msg_t *rm = nullptr;
        EXPECT_EQ(gser_deserialize(good.get(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &rm), c.status)
            << gser_context_get_last_error(good.get());
        if (c.status != GSER_OK) {
            std::string why = gser_context_get_last_error(good.get());
            EXPECT_NE(why.find(c.fragment), std::string::npos) << why;
        }
        gser_msg_destroy(rm);
    }
    for (void *p : dev)
        gser_device_free(evil.get(), p, 0, nullptr);
}
