// The emulated backend as CI's stand-in for a GPU: work queued on a stream
// runs only once something waits for it, so code that reads a result before
// waiting sees stale bytes here as it could on a GPU; and the pinned block
// cache that both backends share.
#include <random>

#include "host/common.hpp"

extern "C" {
#include "device/pincache.h"
}

namespace {

CtxPtr emulated()
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.device_backend = "emulated";
    o.trace = -1;
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&o, &c), GSER_OK) << gser_context_get_last_error(nullptr);
    return CtxPtr(c);
}

// Pinned host memory the test fills and reads directly.
struct Pinned {
    gser_context_t *ctx;
    size_t n;
    unsigned char *p = nullptr;
    Pinned(gser_context_t *c, size_t size) : ctx(c), n(size)
    {
        EXPECT_EQ(gser_pinned_alloc(ctx, n, reinterpret_cast<void **>(&p)), GSER_OK);
    }
    ~Pinned() { gser_pinned_free(ctx, p, n); }
};

} // namespace

TEST(EmulatedStreams, WorkRunsOnlyOnceSomethingWaitsForIt)
{
    auto ctx = emulated();
    const size_t n = 4096;
    Pinned in(ctx.get(), n), out(ctx.get(), n);
    std::memset(in.p, 0x5A, n);
    void *dev;
    ASSERT_EQ(gser_device_alloc(ctx.get(), n, nullptr, &dev), GSER_OK);
    // Pinned memory on both sides: both copies are queued, nothing has run.
    ASSERT_EQ(gser_device_memcpy(ctx.get(), dev, GSER_MEMORY_DEVICE, in.p, GSER_MEMORY_HOST, n, nullptr), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), out.p, GSER_MEMORY_HOST, dev, GSER_MEMORY_DEVICE, n, nullptr), GSER_OK);
    EXPECT_EQ(out.p[0], 0xDB) << "read before waiting: fresh pinned memory, not the result";
    EXPECT_EQ(out.p[n - 1], 0xDB);
    ASSERT_EQ(gser_stream_wait(ctx.get(), nullptr), GSER_OK);
    EXPECT_EQ(out.p[0], 0x5A);
    EXPECT_EQ(out.p[n - 1], 0x5A);
    gser_device_free(ctx.get(), dev, n, nullptr);
}

TEST(EmulatedStreams, EventsCompleteLateAndOrderOtherStreams)
{
    auto ctx = emulated();
    const size_t n = 1000;
    Pinned in(ctx.get(), n), out(ctx.get(), n);
    std::memset(in.p, 0x11, n);
    void *a = nullptr, *b = nullptr, *s1 = nullptr, *s2 = nullptr;
    ASSERT_EQ(gser_stream_create(ctx.get(), &s1), GSER_OK);
    ASSERT_EQ(gser_stream_create(ctx.get(), &s2), GSER_OK);
    ASSERT_EQ(gser_device_alloc(ctx.get(), n, s1, &a), GSER_OK);
    ASSERT_EQ(gser_device_alloc(ctx.get(), n, s2, &b), GSER_OK);
    gser_event_t *ev;
    ASSERT_EQ(gser_event_create(ctx.get(), &ev), GSER_OK);
    EXPECT_EQ(gser_event_query(ev), GSER_OK) << "an event never recorded is complete";
    ASSERT_EQ(gser_device_memcpy(ctx.get(), a, GSER_MEMORY_DEVICE, in.p, GSER_MEMORY_HOST, n, s1), GSER_OK);
    ASSERT_EQ(gser_event_record(ev, s1), GSER_OK);
    EXPECT_EQ(gser_event_query(ev), GSER_INPROGRESS) << "the first answer is always: not yet";
    // s2 copies what s1 produced, ordered after the event: waiting for s2
    // alone must run s1's work first.
    ASSERT_EQ(gser_stream_order_after(ctx.get(), s2, ev), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), b, GSER_MEMORY_DEVICE, a, GSER_MEMORY_DEVICE, n, s2), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), out.p, GSER_MEMORY_HOST, b, GSER_MEMORY_DEVICE, n, s2), GSER_OK);
    ASSERT_EQ(gser_stream_wait(ctx.get(), s2), GSER_OK);
    EXPECT_EQ(out.p[0], 0x11);
    EXPECT_EQ(out.p[n - 1], 0x11);
    ASSERT_EQ(gser_event_wait(ev), GSER_OK);
    EXPECT_EQ(gser_event_query(ev), GSER_OK);
    gser_event_destroy(ev);
    gser_device_free(ctx.get(), a, n, s1);
    gser_device_free(ctx.get(), b, n, s2);
    gser_stream_destroy(ctx.get(), s1);
    gser_stream_destroy(ctx.get(), s2);
}

// Pageable host memory follows CUDA: a device-to-host copy returns done, a
// host-to-device copy takes its source before returning.
TEST(EmulatedStreams, PageableCopiesFollowCudasRules)
{
    auto ctx = emulated();
    std::vector<unsigned char> src(300, 0x22), dst(300, 0);
    void *dev;
    ASSERT_EQ(gser_device_alloc(ctx.get(), 300, nullptr, &dev), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), dev, GSER_MEMORY_DEVICE, src.data(), GSER_MEMORY_HOST, 300, nullptr),
              GSER_OK);
    std::fill(src.begin(), src.end(), 0x33); // the copy took the bytes already
    ASSERT_EQ(gser_device_memcpy(ctx.get(), dst.data(), GSER_MEMORY_HOST, dev, GSER_MEMORY_DEVICE, 300, nullptr),
              GSER_OK);
    EXPECT_EQ(dst, std::vector<unsigned char>(300, 0x22));
    gser_device_free(ctx.get(), dev, 300, nullptr);
}

// Reading a packed frame without waiting for the frames sees stale bytes:
// the check this backend exists to make possible.
TEST(EmulatedStreams, PackedFramesReadBeforeWaitingAreStale)
{
    auto ctx = emulated();
    std::vector<unsigned char> bytes(1000, 0x44);
    void *dev;
    ASSERT_EQ(gser_device_alloc(ctx.get(), 1000, nullptr, &dev), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), dev, GSER_MEMORY_DEVICE, bytes.data(), GSER_MEMORY_HOST, 1000, nullptr),
              GSER_OK);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = dev;
    d.nbytes = 1000;
    d.memory = GSER_MEMORY_DEVICE;
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f;
    ASSERT_EQ(gser_serialize(ctx.get(), m, nullptr, &f), GSER_OK);
    FramesPtr fp(f);
    const gser_frame_t &packed = gser_frames_get_array(f)[1];
    // Read on a stream of our own, not ordered after the frames: stale.
    // (Before any query: a query lets the work run, racing this read.)
    void *other;
    ASSERT_EQ(gser_stream_create(ctx.get(), &other), GSER_OK);
    std::vector<unsigned char> got(1000);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), got.data(), GSER_MEMORY_HOST, packed.data, GSER_MEMORY_DEVICE, 1000, other),
              GSER_OK);
    EXPECT_NE(got, bytes) << "the pack kernel ran though nothing waited for it";
    EXPECT_EQ(gser_frames_query(f), GSER_INPROGRESS);
    // Ordered after the frames' event: right.
    ASSERT_EQ(gser_stream_order_after_handle(ctx.get(), other, gser_frames_get_event(f)), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(ctx.get(), got.data(), GSER_MEMORY_HOST, packed.data, GSER_MEMORY_DEVICE, 1000, other),
              GSER_OK);
    EXPECT_EQ(got, bytes);
    gser_stream_destroy(ctx.get(), other);
    gser_device_free(ctx.get(), dev, 1000, nullptr);
}

// The pinned cache keeps blocks by bytes, not by count: a steady stream of
// same-size transfers never gives a block back (with CUDA, cudaFreeHost
// waits for the whole device); past the budget blocks go back.
TEST(PinnedCache, KeepsBlocksUpToItsBudgetWhateverTheirCount)
{
    devl_pincache_t c;
    devl_pincache_init(&c, 64 * 4096);
    EXPECT_EQ(devl_pincache_class_size(1), 4096u);
    EXPECT_EQ(devl_pincache_class_size(4097), 8192u);
    std::vector<std::vector<char>> blocks(70, std::vector<char>(4096));
    size_t kept = 0;
    for (auto &b : blocks)
        kept += devl_pincache_put(&c, b.data(), 4000);
    EXPECT_EQ(kept, 64u) << "64 blocks of 4 KiB fit the budget, more than any per-class count of 8";
    for (size_t i = 0; i < 64; i++)
        EXPECT_NE(devl_pincache_get(&c, 100), nullptr);
    EXPECT_EQ(devl_pincache_get(&c, 100), nullptr);
    EXPECT_EQ(devl_pincache_get(&c, 5000), nullptr) << "another class";
    EXPECT_TRUE(devl_pincache_put(&c, blocks[0].data(), 4096));
    static int released;
    released = 0;
    devl_pincache_drain(&c, [](void *, size_t size) { released += size == 4096; });
    EXPECT_EQ(released, 1);
}
