// Round trips of Arrow tables through gser: every supported type, with and
// without nulls, sliced, with children that have offsets of their own; empty
// tables, zero columns, one row, 512 columns, nested lists of structs,
// dictionaries; the device and host families; where the received table ends
// up; who owns what, and release callbacks that run exactly once.
//
// Parametrized over the table's memory: host (a CPU table, a context with no
// device backend), emulated device memory, and CUDA (skipped visibly without
// a GPU), times the family used ("device", "host").
#include "arrow_common.hpp"

using namespace arrowtest;

namespace {

struct Param {
    const char *backend; // "host", "emulated", "cuda"
    const char *family;  // "device", "host"
};

std::ostream &operator<<(std::ostream &os, const Param &p)
{
    return os << p.backend << "_" << p.family;
}

// Frames as a transport hands them over: copies the message owns, counted
// when released.
struct FrameCounter {
    std::atomic<int> released{0};
    int total = 0;
};

struct OwnedFrame {
    gser_context_t *ctx;
    size_t size;
    bool device;
    FrameCounter *counter;
};

void release_frame(void *data, void *arg)
{
    auto *o = static_cast<OwnedFrame *>(arg);
    if (o->device)
        gser_device_free(o->ctx, data, o->size, nullptr);
    else
        free(data);
    o->counter->released++;
    delete o;
}

CtxPtr arrow_ctx(const char *backend, size_t pack_max = 4096)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = backend;
    o.pack_max = pack_max;
    gser_context_t *c = nullptr;
    if (gser_context_create(&o, &c) != GSER_OK)
        return nullptr;
    EXPECT_EQ(gser_arrow_register(c), GSER_OK);
    return CtxPtr(c);
}

struct Taken {
    ArrowDeviceArray array{};
    ArrowSchema schema{};
    gser_status_t st = GSER_ERR_STATE;
    size_t nframes = 0;
    std::vector<gser_memory_t> frame_memory;
    ~Taken()
    {
        if (array.array.release)
            array.array.release(&array.array);
        if (schema.release)
            schema.release(&schema);
    }
};

class ArrowTest : public ::testing::TestWithParam<Param> {
  public:
    void SetUp() override
    {
        input_releases() = 0;
        const char *b = GetParam().backend;
        ctx_ = arrow_ctx(device() ? b : "none");
        if (!ctx_ && std::string(b) == "cuda")
            GTEST_SKIP() << "no usable CUDA device here: " << gser_context_get_last_error(nullptr);
        ASSERT_TRUE(ctx_) << gser_context_get_last_error(nullptr);
    }
    void TearDown() override { EXPECT_EQ(input_releases().load(), 0) << "gser called the input's release"; }

    gser_context_t *ctx() { return ctx_.get(); }
    bool device() const { return std::string(GetParam().backend) != "host"; }
    const char *family() const { return GetParam().family; }

    // The table's memory is the backend's: device memory unless "host".
    void finish(Node &root) { root.finish(ctx(), device()); }

    ArrowDeviceArray device_array(Node &root)
    {
        ArrowDeviceArray d{};
        d.array = root.array;
        d.device_type = device() ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
        d.device_id = device() ? 0 : -1;
        if (device()) {
            // A producer's event, which the packing waits for.
            if (!event_) {
                EXPECT_EQ(gser_event_create(ctx(), &event_), GSER_OK);
            }
            EXPECT_EQ(gser_event_record(event_, nullptr), GSER_OK);
            event_handle_ = gser_event_get_handle(event_);
            d.sync_event = &event_handle_;
        }
        return d;
    }

    // Serialize root in the family, hand the frames over (owned copies, or
    // borrowed), deserialize in rx (default: the same context), take.
    void send(Node &root, Taken &out, FrameCounter *counter = nullptr, gser_context_t *rx = nullptr,
              unsigned deser_flags = 0, unsigned take_flags = 0, bool owned_frames = true)
    {
        rx = rx ? rx : ctx();
        ArrowDeviceArray da = device_array(root);
        gser_msg_t *m;
        GSER_OK_OR_FAIL(ctx(), gser_msg_create(ctx(), &m));
        MsgPtr mp(m);
        gser_value_t *v;
        GSER_OK_OR_FAIL(ctx(), gser_arrow_new_value(m, &da, &root.schema, nullptr, &v));
        ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
        const char *fams[] = {family()};
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.families = fams;
        so.nfamilies = 1;
        gser_frames_t *f;
        GSER_OK_OR_FAIL(ctx(), gser_serialize(ctx(), m, &so, &f));
        FramesPtr fp(f);
        ASSERT_EQ(gser_frames_wait(f), GSER_OK);
        const gser_frame_t *fr = gser_frames_get_array(f);
        size_t n = gser_frames_get_count(f);
        out.nframes = n;
        for (size_t i = 0; i < n; i++)
            out.frame_memory.push_back(fr[i].memory);
        std::vector<gser_frame_t> frames(fr, fr + n);
        if (owned_frames) {
            for (auto &x : frames) {
                bool dev = x.memory == GSER_MEMORY_DEVICE;
                void *copy = nullptr;
                if (dev) {
                    ASSERT_EQ(gser_device_alloc(ctx(), x.size ? x.size : 1, nullptr, &copy), GSER_OK);
                    ASSERT_EQ(gser_device_memcpy(ctx(), copy, GSER_MEMORY_DEVICE, x.data, GSER_MEMORY_DEVICE, x.size,
                                                 nullptr),
                              GSER_OK);
                } else {
                    copy = malloc(x.size ? x.size : 1);
                    std::memcpy(copy, x.data, x.size);
                }
                x.data = copy;
                x.release = release_frame;
                x.release_arg = new OwnedFrame{ctx(), x.size ? x.size : 1, dev, counter};
                counter->total++;
            }
            if (device()) {
                ASSERT_EQ(gser_stream_wait(ctx(), nullptr), GSER_OK);
            }
        }
        gser_deserialize_options_t dopt = GSER_DESERIALIZE_OPTIONS_INIT;
        dopt.flags = deser_flags;
        gser_msg_t *rm;
        GSER_OK_OR_FAIL(rx, gser_deserialize(rx, frames.data(), frames.size(), &dopt, &rm));
        MsgPtr rmp(rm);
        gser_arrow_take_options_t topt = GSER_ARROW_TAKE_OPTIONS_INIT;
        topt.flags = take_flags;
        out.st = gser_arrow_take_value(gser_msg_get_root(rm), &topt, &out.array, &out.schema);
        // The sender's frames, its message and the receiver's message all go
        // now: the arrays must not need any of them.
    }

    // The received table equals root (logically) and is where it should be.
    void verify(Node &root, Taken &t, gser_context_t *rx = nullptr, int want_device_type = 0)
    {
        rx = rx ? rx : ctx();
        ASSERT_EQ(t.st, GSER_OK) << gser_status_str(t.st) << ": " << gser_context_get_last_error(rx);
        if (!want_device_type)
            want_device_type = device() && std::string(family()) == "device" ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
        EXPECT_EQ(t.array.device_type, want_device_type);
        bool on_device = t.array.device_type == ARROW_DEVICE_CUDA;
        if (!on_device) {
            EXPECT_EQ(t.array.device_id, -1);
        }
        EXPECT_EQ(t.array.sync_event != nullptr, on_device)
            << "sync_event: an event for device arrays (their copies are queued), NULL for CPU arrays";
        EXPECT_TRUE(same_schema(root, &t.schema, "$"));
        auto got = mirror(rx, &t.array.array, &t.schema, on_device);
        EXPECT_EQ(got->length, root.length);
        EXPECT_TRUE(same_rows(root, 0, *got, 0, root.length, "$"));
        check_null_counts(root, root.offset, root.length, *got, "$");
        if (root.layout().kind == Layout::Struct)
            for (size_t c = 0; c < root.children.size(); c++)
                check_null_counts(*root.children[c], root.children[c]->offset + root.offset, root.length,
                                  *got->children[c], "$." + root.children[c]->name);
    }

    CtxPtr ctx_;
    gser_event_t *event_ = nullptr;
    void *event_handle_ = nullptr;
    ~ArrowTest() override { gser_event_destroy(event_); }
};

std::vector<Spec> all_types()
{
    Spec meta_col = S("l", "with_metadata");
    meta_col.metadata = metadata({{"unit", "ms"}, {"", ""}, {"source", "sensor-7"}});
    Spec entries = S("+s", "entries", {S("u", "key"), S("i", "value")});
    entries.children[0].flags = 0; // map keys are not nullable
    entries.flags = 0;
    Spec map = S("+m", "map", {entries});
    map.flags |= ARROW_FLAG_MAP_KEYS_SORTED;
    Spec ordered = Dict("s", S("g", "values"), "dict_ordered");
    ordered.flags |= ARROW_FLAG_DICTIONARY_ORDERED;
    return {S("n", "null"),
            S("b", "bool"),
            S("c", "int8"),
            S("C", "uint8"),
            S("s", "int16"),
            S("S", "uint16"),
            S("i", "int32"),
            S("I", "uint32"),
            S("l", "int64"),
            S("L", "uint64"),
            S("e", "float16"),
            S("f", "float32"),
            S("g", "float64"),
            S("tdD", "date32"),
            S("tdm", "date64"),
            S("tts", "time32_s"),
            S("ttm", "time32_ms"),
            S("ttu", "time64_us"),
            S("ttn", "time64_ns"),
            S("tss:", "ts_s"),
            S("tsm:UTC", "ts_ms_utc"),
            S("tsu:Europe/Paris", "ts_us_paris"),
            S("tsn:+07:30", "ts_ns_offset"),
            S("tDs", "duration_s"),
            S("tDm", "duration_ms"),
            S("tDu", "duration_us"),
            S("tDn", "duration_ns"),
            S("tiM", "interval_months"),
            S("tiD", "interval_days_ms"),
            S("tin", "interval_mdn"),
            S("d:10,2", "decimal128"),
            S("d:38,-3,128", "decimal128_neg_scale"),
            S("d:9,2,32", "decimal32"),
            S("d:18,4,64", "decimal64"),
            S("d:70,5,256", "decimal256"),
            S("u", "utf8"),
            S("z", "binary"),
            S("U", "large_utf8"),
            S("Z", "large_binary"),
            S("w:5", "fixed_binary5"),
            S("+l", "list_int32", {S("i", "item")}),
            S("+L", "large_list_utf8", {S("u", "item")}),
            S("+w:3", "fixed_list_float", {S("f", "item")}),
            S("+s", "struct", {S("l", "a"), S("u", "b"), S("b", "c")}),
            map,
            Dict("i", S("u", "values"), "dict_utf8"),
            Dict("c", S("l", "values"), "dict_int64"),
            ordered,
            meta_col};
}

std::vector<Spec> supported_types()
{
    return all_types();
}

TEST_P(ArrowTest, EverySupportedTypeRoundTrips)
{
    for (double null_p : {0.0, 0.3})
        for (bool sliced : {false, true})
            for (bool child_offsets : {false, true}) {
                SCOPED_TRACE(testing::Message() << "nulls " << null_p << ", sliced " << sliced << ", child offsets "
                                                << child_offsets);
                Gen g({null_p, child_offsets, (uint32_t)(1 + sliced + 2 * child_offsets)});
                auto root = g.make(table(supported_types()), 50);
                if (sliced)
                    root->slice(3, 41); // starts mid-byte: bitmaps are shifted, offsets rebased
                finish(*root);
                FrameCounter frames;
                {
                    Taken t;
                    send(*root, t, &frames);
                    verify(*root, t);
                }
                EXPECT_EQ(frames.released.load(), frames.total) << "every frame released exactly once";
            }
}

TEST_P(ArrowTest, EmptyTablesZeroColumnsAndOneRow)
{
    for (int64_t rows : {0, 1}) {
        SCOPED_TRACE(testing::Message() << rows << " rows");
        Gen g({0.5, true, 9});
        auto root = g.make(table(supported_types()), rows);
        finish(*root);
        FrameCounter frames;
        Taken t;
        send(*root, t, &frames);
        verify(*root, t);
    }
    // A table without columns still has rows.
    Gen g({0, false, 3});
    auto none = g.make(table({}), 5);
    finish(*none);
    FrameCounter frames;
    Taken t;
    send(*none, t, &frames);
    verify(*none, t);
    EXPECT_EQ(t.array.array.n_children, 0);
    EXPECT_EQ(t.array.array.length, 5);
    // And a sliced table that keeps no row.
    auto all = Gen({0.3, false, 4}).make(table(supported_types()), 20);
    all->slice(13, 0);
    finish(*all);
    Taken t2;
    send(*all, t2, &frames);
    verify(*all, t2);
}

TEST_P(ArrowTest, EmptyColumnsMayLeaveTheirBuffersOut)
{
    // Producers may give NULL buffers (offsets included) for empty arrays.
    Gen g({0, false, 13});
    auto root = g.make(table({S("b", "flags"), S("l", "n"), S("u", "s"), S("+l", "l", {S("i", "item")})}), 0);
    for (auto &c : root->children) {
        c->offset = 5;
        for (size_t b = 0; b < c->buf_null.size(); b++)
            c->buf_null[b] = true;
    }
    finish(*root);
    FrameCounter frames;
    Taken t;
    send(*root, t, &frames);
    verify(*root, t);
    ASSERT_EQ(t.st, GSER_OK);
    // A receiver still gets the one offset an empty string column has.
    const ArrowArray *s = t.array.array.children[2];
    ASSERT_NE(s->buffers[1], nullptr);
    auto off = fetch(ctx(), s->buffers[1], 4, t.array.device_type == ARROW_DEVICE_CUDA);
    EXPECT_EQ(off, std::vector<uint8_t>(4, 0));
}

// Every buffer an array has (all but an absent validity bitmap) is a
// non-NULL pointer, with no bytes behind it or not: Arrow's exporter never
// hands out NULL for one, as older consumers dereference it. Buffer 0 is
// the validity bitmap in every layout that has buffers.
void expect_no_null_buffers(const ArrowArray *a, const std::string &path)
{
    for (int64_t b = 1; b < a->n_buffers; b++)
        EXPECT_NE(a->buffers[b], nullptr) << path << ": buffer " << b << " (length " << a->length << ")";
    if (a->n_buffers && a->null_count != 0) {
        EXPECT_NE(a->buffers[0], nullptr) << path << ": the validity bitmap";
    }
    for (int64_t c = 0; c < a->n_children; c++)
        expect_no_null_buffers(a->children[c], path + "[" + std::to_string(c) + "]");
    if (a->dictionary)
        expect_no_null_buffers(a->dictionary, path + ".dictionary");
}

TEST_P(ArrowTest, ZeroLengthBuffersAreNotNull)
{
    // Every type with no rows (zero-length values and data), and strings and
    // binaries whose values are all empty (zero-length data).
    Gen g({0, false, 21});
    auto empty = g.make(table(supported_types()), 0);
    finish(*empty);
    auto strings = Gen({0, false, 22}).make(table({S("u", "s"), S("z", "b"), S("U", "ls")}), 4);
    for (auto &c : strings->children) {
        std::fill(c->bufs[1].begin(), c->bufs[1].end(), 0); // every value ""
        c->bufs[2].clear();
    }
    finish(*strings);
    // And a producer that gave NULL for them, as the interface allows.
    auto nulls = Gen({0, false, 23}).make(table({S("b", "flags"), S("l", "n"), S("u", "s")}), 0);
    for (auto &c : nulls->children)
        for (size_t b = 0; b < c->buf_null.size(); b++)
            c->buf_null[b] = true;
    finish(*nulls);
    for (Node *root : {empty.get(), strings.get(), nulls.get()})
        for (unsigned take : {0u, (unsigned)GSER_ARROW_BORROW, (unsigned)GSER_ARROW_TO_HOST,
                              (unsigned)GSER_ARROW_TO_DEVICE}) {
            if (take == GSER_ARROW_TO_DEVICE && !device())
                continue;
            SCOPED_TRACE(testing::Message() << root->length << " rows, take flags " << take);
            FrameCounter frames;
            Taken t;
            send(*root, t, &frames, nullptr, 0, take);
            ASSERT_EQ(t.st, GSER_OK) << gser_context_get_last_error(ctx());
            expect_no_null_buffers(&t.array.array, "$");
            if (take == 0) { // (borrowed arrays need the message send() let go: their pointers only)
                verify(*root, t);
            }
        }
}

TEST_P(ArrowTest, FiveHundredTwelveColumns)
{
    std::vector<Spec> cols;
    for (int c = 0; c < 512; c++) {
        static const char *kinds[] = {"l", "g", "u", "+l"};
        Spec s = S(kinds[c % 4], "c" + std::to_string(c));
        if (s.format == "+l")
            s.children.push_back(S("i", "item"));
        cols.push_back(s);
    }
    Gen g({0.1, false, 512});
    auto root = g.make(table(cols), 64);
    root->slice(5, 50);
    finish(*root);
    FrameCounter frames;
    Taken t;
    send(*root, t, &frames);
    verify(*root, t);
    // Packing: far fewer frames than buffers (the "device" family gathers the
    // small device buffers into one frame; small host buffers are inlined).
    if (device()) { // host buffers of 256 bytes and more stay frames of their own (zero-copy)
        EXPECT_LT(t.nframes, (size_t)20) << "frames for 512 columns";
    }
    if (std::string(family()) == "host") {
        for (auto m : t.frame_memory) {
            EXPECT_EQ(m, GSER_MEMORY_HOST) << "the host family makes host frames only";
        }
    }
}

TEST_P(ArrowTest, NestedListsOfStructs)
{
    Spec inner = S("+s", "point", {S("i", "x"), S("u", "label"), S("+w:2", "pair", {S("s", "v")})});
    Spec col = S("+l", "groups",
                 {S("+s", "group", {S("+L", "points", {inner}), S("U", "title"), Dict("I", S("z", "tag"), "tag")})});
    for (bool sliced : {false, true}) {
        Gen g({0.25, true, 77});
        auto root = g.make(table({col, S("l", "id")}), 40);
        if (sliced)
            root->slice(7, 25);
        finish(*root);
        FrameCounter frames;
        Taken t;
        send(*root, t, &frames);
        verify(*root, t);
    }
}

TEST_P(ArrowTest, ColumnsAsRootAndEveryBitShift)
{
    // Not only tables: any array can be the root. Every start bit of a byte.
    for (int64_t off = 0; off < 9; off++) {
        SCOPED_TRACE(testing::Message() << "offset " << off);
        for (const char *fmt : {"b", "u", "L"}) {
            Gen g({0.4, false, (uint32_t)(off + 100)});
            auto root = g.make(S(fmt, "col"), 30);
            root->slice(off, 30 - off - 1);
            finish(*root);
            FrameCounter frames;
            Taken t;
            send(*root, t, &frames);
            verify(*root, t);
        }
    }
}

TEST_P(ArrowTest, ReleaseCallbacksRunExactlyOnceAndChildrenCanMove)
{
    Gen g({0.2, false, 5});
    auto root = g.make(table({S("l", "a"), S("u", "b"), S("+l", "c", {S("g", "item")})}), 3000);
    finish(*root);
    FrameCounter frames;
    auto t = std::make_unique<Taken>();
    send(*root, *t, &frames);
    ASSERT_EQ(t->st, GSER_OK) << gser_context_get_last_error(ctx());
    int taken = frames.total - frames.released.load(); // held by the arrays now
    // Move column "c" and its schema out, as the C Data Interface allows.
    ArrowArray moved = *t->array.array.children[2];
    t->array.array.children[2]->release = nullptr;
    ArrowSchema moved_schema = *t->schema.children[2];
    t->schema.children[2]->release = nullptr;
    t->array.array.release(&t->array.array);
    EXPECT_EQ(t->array.array.release, nullptr) << "a released array is marked released";
    t->schema.release(&t->schema);
    EXPECT_EQ(t->schema.release, nullptr);
    if (taken) {
        EXPECT_LT(frames.released.load(), frames.total) << "the moved child still needs its frames";
    }
    // The moved child is intact.
    auto got = mirror(ctx(), &moved, &moved_schema, t->array.device_type == ARROW_DEVICE_CUDA);
    EXPECT_TRUE(same_rows(*root->children[2], 0, *got, 0, root->length, "$.c"));
    EXPECT_STREQ(moved_schema.name, "c");
    moved.release(&moved);
    moved_schema.release(&moved_schema);
    EXPECT_EQ(moved.release, nullptr);
    EXPECT_EQ(frames.released.load(), frames.total) << "the last release frees everything, once";
    t.reset();
    EXPECT_EQ(frames.released.load(), frames.total);
}

TEST_P(ArrowTest, TakenOnceAndOnlyFromReceivedTables)
{
    Gen g({0, false, 6});
    auto root = g.make(table({S("i", "a")}), 10);
    finish(*root);
    ArrowDeviceArray da = device_array(*root);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v, *i;
    ASSERT_EQ(gser_arrow_new_value(m, &da, &root->schema, nullptr, &v), GSER_OK);
    ArrowDeviceArray oa{};
    ArrowSchema os{};
    EXPECT_EQ(gser_arrow_take_value(v, nullptr, &oa, &os), GSER_ERR_TYPE_MISMATCH) << "a table to send";
    ASSERT_EQ(gser_msg_new_int(m, 3, &i), GSER_OK);
    EXPECT_EQ(gser_arrow_take_value(i, nullptr, &oa, &os), GSER_ERR_TYPE_MISMATCH);
    EXPECT_EQ(gser_arrow_take_value(nullptr, nullptr, &oa, &os), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_arrow_new_value(m, nullptr, &root->schema, nullptr, &v), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(oa.array.release, nullptr) << "outputs are set only on success";

    // A received one: once.
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f;
    ASSERT_EQ(gser_serialize(ctx(), m, nullptr, &f), GSER_OK) << gser_context_get_last_error(ctx());
    FramesPtr fp(f);
    ASSERT_EQ(gser_frames_wait(f), GSER_OK);
    gser_msg_t *rm;
    ASSERT_EQ(gser_deserialize(ctx(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &rm), GSER_OK);
    MsgPtr rmp(rm);
    Taken t;
    ASSERT_EQ(gser_arrow_take_value(gser_msg_get_root(rm), nullptr, &t.array, &t.schema), GSER_OK);
    EXPECT_EQ(gser_arrow_take_value(gser_msg_get_root(rm), nullptr, &oa, &os), GSER_ERR_STATE);
    gser_arrow_take_options_t both = GSER_ARROW_TAKE_OPTIONS_INIT;
    both.flags = GSER_ARROW_TO_HOST | GSER_ARROW_TO_DEVICE;
    EXPECT_EQ(gser_arrow_take_value(gser_msg_get_root(rm), &both, &oa, &os), GSER_ERR_INVALID_ARG);
}

TEST_P(ArrowTest, BorrowedFramesAreCopiedAndBorrowKeepsViews)
{
    Gen g({0.3, true, 8});
    auto root = g.make(table({S("l", "a"), S("u", "b"), S("+l", "c", {S("d:12,3", "item")})}), 2000);
    root->slice(1, 1900);
    finish(*root);
    {
        // Frames without release: the message cannot hand them over, so the
        // arrays get a copy and outlive the sender's frames.
        Taken t;
        send(*root, t, nullptr, nullptr, 0, 0, /*owned_frames=*/false);
        verify(*root, t);
    }
    {
        // GSER_ARROW_BORROW: views into the message, nothing copied.
        ArrowDeviceArray da = device_array(*root);
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *v;
        ASSERT_EQ(gser_arrow_new_value(m, &da, &root->schema, nullptr, &v), GSER_OK);
        ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
        const char *fams[] = {family()};
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.families = fams;
        so.nfamilies = 1;
        gser_frames_t *f;
        ASSERT_EQ(gser_serialize(ctx(), m, &so, &f), GSER_OK) << gser_context_get_last_error(ctx());
        FramesPtr fp(f);
        ASSERT_EQ(gser_frames_wait(f), GSER_OK);
        gser_msg_t *rm;
        ASSERT_EQ(gser_deserialize(ctx(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &rm), GSER_OK);
        MsgPtr rmp(rm);
        gser_arrow_take_options_t topt = GSER_ARROW_TAKE_OPTIONS_INIT;
        topt.flags = GSER_ARROW_BORROW;
        Taken t;
        t.st = gser_arrow_take_value(gser_msg_get_root(rm), &topt, &t.array, &t.schema);
        verify(*root, t);
        // The int64 column's data points straight into a frame.
        const void *data = t.array.array.children[0]->buffers[1];
        bool in_frame = false;
        size_t nf;
        const gser_frame_t *frs = gser_msg_get_frames(rm, &nf);
        for (size_t i = 0; i < nf; i++)
            in_frame |= data >= frs[i].data && data < (const char *)frs[i].data + frs[i].size;
        EXPECT_TRUE(in_frame) << "a borrowed table is a view";
        t.array.array.release(&t.array.array); // before its message goes
    }
}

TEST_P(ArrowTest, PlacementOnTake)
{
    Gen g({0.3, false, 10});
    auto root = g.make(table({S("i", "a"), S("z", "b"), S("b", "c")}), 300);
    root->slice(2, 290);
    finish(*root);
    FrameCounter frames;
    {
        Taken t;
        send(*root, t, &frames, nullptr, 0, GSER_ARROW_TO_HOST);
        verify(*root, t, nullptr, ARROW_DEVICE_CPU);
    }
    {
        Taken t;
        send(*root, t, &frames, nullptr, 0, GSER_ARROW_TO_DEVICE);
        if (!device()) {
            EXPECT_EQ(t.st, GSER_ERR_NO_DEVICE) << "no device backend to put it on";
        } else {
            verify(*root, t, nullptr, ARROW_DEVICE_CUDA);
        }
    }
    if (device()) {
        // The host family restored on the device by gser_deserialize: the
        // arrays copy out of the message's device memory once.
        Taken t;
        send(*root, t, &frames, nullptr, GSER_DESERIALIZE_RESTORE_DEVICE);
        verify(*root, t, nullptr, ARROW_DEVICE_CUDA);
        Taken s;
        send(*root, s, &frames, nullptr, GSER_DESERIALIZE_SCATTER);
        verify(*root, s);
    }
    EXPECT_EQ(frames.released.load(), frames.total);
}

INSTANTIATE_TEST_SUITE_P(Backends, ArrowTest,
                         ::testing::Values(Param{"host", "device"}, Param{"host", "host"}, Param{"emulated", "device"},
                                           Param{"emulated", "host"}, Param{"cuda", "device"}, Param{"cuda", "host"}),
                         [](const ::testing::TestParamInfo<Param> &i) {
                             return std::string(i.param.backend) + "_" + i.param.family;
                         });

// ---- across contexts: a CPU peer and a GPU peer ------------------------------------------------

class ArrowPeers : public ::testing::TestWithParam<const char *> {};

TEST_P(ArrowPeers, CpuTableRebuiltOnTheDeviceAndDeviceTableOnACpuPeer)
{
    CtxPtr cpu = arrow_ctx("none");
    CtxPtr gpu = arrow_ctx(GetParam());
    if (!gpu)
        GTEST_SKIP() << GetParam() << " backend unavailable: " << gser_context_get_last_error(nullptr);
    ASSERT_TRUE(cpu);
    Gen g({0.2, true, 11});
    auto host_table = g.make(table(supported_types()), 60);
    host_table->slice(9, 50);
    host_table->finish();

    // CPU sender -> GPU receiver, which asks for the device.
    ArrowDeviceArray da{};
    da.array = host_table->array;
    da.device_type = ARROW_DEVICE_CPU;
    da.device_id = -1;
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(cpu.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v;
    ASSERT_EQ(gser_arrow_new_value(m, &da, &host_table->schema, nullptr, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f;
    ASSERT_EQ(gser_serialize(cpu.get(), m, nullptr, &f), GSER_OK) << gser_context_get_last_error(cpu.get());
    FramesPtr fp(f);
    gser_msg_t *rm;
    gser_deserialize_options_t dopt = GSER_DESERIALIZE_OPTIONS_INIT;
    dopt.flags = GSER_DESERIALIZE_RESTORE_DEVICE; // restores device-origin buffers only: these were host memory
    ASSERT_EQ(gser_deserialize(gpu.get(), gser_frames_get_array(f), gser_frames_get_count(f), &dopt, &rm), GSER_OK)
        << gser_context_get_last_error(gpu.get());
    MsgPtr rmp(rm);
    gser_arrow_take_options_t topt = GSER_ARROW_TAKE_OPTIONS_INIT;
    topt.flags = GSER_ARROW_TO_DEVICE;
    Taken t;
    ASSERT_EQ(gser_arrow_take_value(gser_msg_get_root(rm), &topt, &t.array, &t.schema), GSER_OK);
    rmp.reset();
    fp.reset();
    EXPECT_EQ(t.array.device_type, ARROW_DEVICE_CUDA);
    auto got = mirror(gpu.get(), &t.array.array, &t.schema, true);
    EXPECT_TRUE(same_rows(*host_table, 0, *got, 0, host_table->length, "$"));
    EXPECT_TRUE(same_schema(*host_table, &t.schema, "$"));

    // GPU sender (host family) -> CPU receiver without any device backend.
    auto dev_table = Gen({0.2, true, 12}).make(table(supported_types()), 60);
    dev_table->slice(11, 40);
    dev_table->finish(gpu.get(), true);
    ArrowDeviceArray dd{};
    dd.array = dev_table->array;
    dd.device_type = ARROW_DEVICE_CUDA;
    gser_msg_t *m2;
    ASSERT_EQ(gser_msg_create(gpu.get(), &m2), GSER_OK);
    MsgPtr mp2(m2);
    ASSERT_EQ(gser_arrow_new_value(m2, &dd, &dev_table->schema, nullptr, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m2, v), GSER_OK);
    const char *host_only[] = {"host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = host_only;
    so.nfamilies = 1;
    gser_frames_t *f2;
    ASSERT_EQ(gser_serialize(gpu.get(), m2, &so, &f2), GSER_OK) << gser_context_get_last_error(gpu.get());
    FramesPtr fp2(f2);
    ASSERT_EQ(gser_frames_wait(f2), GSER_OK);
    gser_msg_t *rm2;
    ASSERT_EQ(gser_deserialize(cpu.get(), gser_frames_get_array(f2), gser_frames_get_count(f2), nullptr, &rm2), GSER_OK)
        << gser_context_get_last_error(cpu.get());
    MsgPtr rmp2(rm2);
    Taken t2;
    ASSERT_EQ(gser_arrow_take_value(gser_msg_get_root(rm2), nullptr, &t2.array, &t2.schema), GSER_OK);
    rmp2.reset();
    fp2.reset();
    EXPECT_EQ(t2.array.device_type, ARROW_DEVICE_CPU);
    EXPECT_EQ(t2.array.sync_event, nullptr);
    auto got2 = mirror(cpu.get(), &t2.array.array, &t2.schema, false);
    EXPECT_TRUE(same_rows(*dev_table, 0, *got2, 0, dev_table->length, "$"));
}

INSTANTIATE_TEST_SUITE_P(Backends, ArrowPeers, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

} // namespace
