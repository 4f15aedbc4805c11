// The Arrow plugin's device paths against the emulated backend's real
// queues: a table still being written on its producer's stream when it is
// sent (its sync_event must be waited for before gser reads offsets or
// validity bits), and which GPU a received table says it is on.
#include "arrow_common.hpp"

using namespace arrowtest;

namespace {

CtxPtr ctx_on(const char *backend, int ordinal)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = backend;
    o.device = ordinal;
    o.pack_max = 4096;
    gser_context_t *c = nullptr;
    if (gser_context_create(&o, &c) != GSER_OK)
        return nullptr;
    EXPECT_EQ(gser_arrow_register(c), GSER_OK);
    return CtxPtr(c);
}

// Table da serialized with one family: the message and its frames, whose
// device work is done (frames null after a reported failure).
struct Sent {
    MsgPtr msg;
    FramesPtr frames;
};

Sent send_with(gser_context_t *ctx, ArrowDeviceArray *da, ArrowSchema *schema, const char *family)
{
    Sent out;
    gser_msg_t *m;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    out.msg.reset(m);
    gser_value_t *v;
    EXPECT_EQ(gser_arrow_new_value(m, da, schema, nullptr, &v), GSER_OK);
    EXPECT_EQ(gser_msg_set_root(m, v), GSER_OK);
    const char *fams[] = {family};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = fams;
    so.nfamilies = 1;
    gser_frames_t *f = nullptr;
    gser_status_t st = gser_serialize(ctx, m, &so, &f);
    EXPECT_EQ(st, GSER_OK) << gser_context_get_last_error(ctx);
    out.frames.reset(f);
    if (f) {
        EXPECT_EQ(gser_frames_wait(f), GSER_OK);
    }
    return out;
}

// Give every device buffer of n garbage now and its right bytes later: a copy
// from pinned memory queued on stream, which runs only once something waits
// for that stream (on a GPU: a producer's kernel still running).
void produce_late(gser_context_t *ctx, Node &n, void *stream, std::vector<std::pair<void *, size_t>> &pinned)
{
    for (auto &c : n.children)
        produce_late(ctx, *c, stream, pinned);
    if (n.dictionary)
        produce_late(ctx, *n.dictionary, stream, pinned);
    for (size_t b = 0; b < n.bufs.size(); b++) {
        size_t size = n.bufs[b].size();
        if (n.buf_null[b] || !size)
            continue;
        void *dev = const_cast<void *>(n.ptrs[b]);
        std::vector<uint8_t> garbage(size, 0xEE);
        ASSERT_EQ(gser_device_memcpy(ctx, dev, GSER_MEMORY_DEVICE, garbage.data(), GSER_MEMORY_HOST, size, nullptr),
                  GSER_OK);
        ASSERT_EQ(gser_stream_wait(ctx, nullptr), GSER_OK);
        void *p = nullptr;
        ASSERT_EQ(gser_pinned_alloc(ctx, size, &p), GSER_OK);
        std::memcpy(p, n.bufs[b].data(), size);
        pinned.emplace_back(p, size);
        ASSERT_EQ(gser_device_memcpy(ctx, dev, GSER_MEMORY_DEVICE, p, GSER_MEMORY_HOST, size, stream), GSER_OK);
    }
}

} // namespace

TEST(ArrowDeviceOrder, SendWaitsForTheTablesSyncEventBeforeReadingIt)
{
    CtxPtr ctx = ctx_on("emulated", 0);
    ASSERT_TRUE(ctx) << gser_context_get_last_error(nullptr);
    // Strings and lists (their offsets are read on the host), sliced with
    // nulls (validity bits are read and compacted on the device).
    Gen g({0.3, true, 21});
    auto root = g.make(table({S("u", "s"), S("+l", "l", {S("i", "item")}), S("l", "x"), S("b", "flag")}), 400);
    root->slice(5, 390);
    root->finish(ctx.get(), true);

    void *producer = nullptr;
    ASSERT_EQ(gser_stream_create(ctx.get(), &producer), GSER_OK);
    std::vector<std::pair<void *, size_t>> pinned;
    produce_late(ctx.get(), *root, producer, pinned);
    gser_event_t *ev;
    ASSERT_EQ(gser_event_create(ctx.get(), &ev), GSER_OK);
    ASSERT_EQ(gser_event_record(ev, producer), GSER_OK);
    void *handle = gser_event_get_handle(ev);
    ArrowDeviceArray da{};
    da.array = root->array;
    da.device_type = ARROW_DEVICE_CUDA;
    da.sync_event = &handle;

    for (const char *family : {"device", "host"}) {
        Sent sent = send_with(ctx.get(), &da, &root->schema, family);
        ASSERT_TRUE(sent.frames);
        gser_frames_t *f = sent.frames.get();
        gser_msg_t *rm;
        GSER_OK_OR_FAIL(ctx.get(),
                        gser_deserialize(ctx.get(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &rm));
        MsgPtr rmp(rm);
        ArrowDeviceArray out{};
        ArrowSchema schema{};
        GSER_OK_OR_FAIL(ctx.get(), gser_arrow_take_value(gser_msg_get_root(rm), nullptr, &out, &schema));
        bool on_device = out.device_type == ARROW_DEVICE_CUDA;
        auto got = mirror(ctx.get(), &out.array, &schema, on_device);
        EXPECT_TRUE(same_rows(*root, 0, *got, 0, root->length, "$")) << family << ": read before it was written";
        check_null_counts(*root, root->offset, root->length, *got, "$");
        out.array.release(&out.array);
        schema.release(&schema);
    }
    gser_event_destroy(ev);
    gser_stream_destroy(ctx.get(), producer);
    for (auto &p : pinned)
        gser_pinned_free(ctx.get(), p.first, p.second);
}

// A table received on a context whose GPU is 1 says it is on GPU 1, whether
// its buffers are views into device frames or copies the take made.
TEST(ArrowDeviceOrder, ReceivedTablesNameTheReceiversGpu)
{
    CtxPtr tx = ctx_on("emulated", 1), rx = ctx_on("emulated", 1);
    ASSERT_TRUE(tx && rx) << gser_context_get_last_error(nullptr);
    Gen g({0.0, false, 5});
    auto root = g.make(table({S("l", "a"), S("u", "b")}), 100);
    root->finish(tx.get(), true);
    ArrowDeviceArray da{};
    da.array = root->array;
    da.device_type = ARROW_DEVICE_CUDA;
    da.device_id = 1;
    for (const char *family : {"device", "host"}) {
        for (unsigned take : {0u, (unsigned)GSER_ARROW_TO_DEVICE}) {
            Sent sent = send_with(tx.get(), &da, &root->schema, family);
            ASSERT_TRUE(sent.frames);
            gser_frames_t *f = sent.frames.get();
            const gser_frame_t *fr = gser_frames_get_array(f);
            for (size_t i = 1; i < gser_frames_get_count(f); i++)
                if (fr[i].memory == GSER_MEMORY_DEVICE) {
                    EXPECT_EQ(fr[i].device, 1) << "a device frame names its GPU";
                }
            gser_msg_t *rm;
            GSER_OK_OR_FAIL(rx.get(), gser_deserialize(rx.get(), fr, gser_frames_get_count(f), nullptr, &rm));
            MsgPtr rmp(rm);
            gser_arrow_take_options_t to = GSER_ARROW_TAKE_OPTIONS_INIT;
            to.flags = take;
            ArrowDeviceArray out{};
            ArrowSchema schema{};
            GSER_OK_OR_FAIL(rx.get(), gser_arrow_take_value(gser_msg_get_root(rm), &to, &out, &schema));
            if (out.device_type == ARROW_DEVICE_CUDA) {
                EXPECT_EQ(out.device_id, 1) << family << " family, take flags " << take;
            }
            auto got = mirror(rx.get(), &out.array, &schema, out.device_type == ARROW_DEVICE_CUDA);
            EXPECT_TRUE(same_rows(*root, 0, *got, 0, root->length, "$"));
            out.array.release(&out.array);
            schema.release(&schema);
        }
    }
}
