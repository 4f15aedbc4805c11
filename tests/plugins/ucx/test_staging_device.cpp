// Device frames staged through pinned buffers, as the device layer sees
// them: a received frame says it is on the receiving context's GPU, and the
// staging copies run on a stream of the worker's own (not the per-thread
// stream of whichever thread drives progress, where they would queue behind
// that thread's work). Over the emulated backend, whose streams really queue.
#include <mutex>

#include "ucx_common.hpp"

namespace {

// A device allocator over another context that records each allocation's stream.
struct Recorder {
    gser_context_t *base = nullptr;
    std::mutex lock;
    std::vector<std::pair<void *, void *>> allocs; // (pointer, stream)
    static gser_status_t alloc(void *u, size_t size, void *stream, void **p)
    {
        auto *r = static_cast<Recorder *>(u);
        gser_status_t st = gser_device_alloc(r->base, size, stream, p);
        if (st == GSER_OK) {
            std::lock_guard<std::mutex> g(r->lock);
            r->allocs.emplace_back(*p, stream);
        }
        return st;
    }
    static void release(void *u, void *p, size_t size, void *stream)
    {
        gser_device_free(static_cast<Recorder *>(u)->base, p, size, stream);
    }
};

CtxPtr emulated_on(int ordinal, const gser_allocator_t *a = nullptr)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = "emulated";
    o.device = ordinal;
    o.device_allocator = a;
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&o, &c), GSER_OK) << gser_context_get_last_error(nullptr);
    return CtxPtr(c);
}

} // namespace

TEST(StagingDevice, ReceivedFramesAreOnTheReceiversGpuAndStagedOnTheirOwnStream)
{
    CtxPtr tx = emulated_on(0), base = emulated_on(1);
    Recorder rec;
    rec.base = base.get();
    gser_allocator_t a{sizeof a, Recorder::alloc, Recorder::release, &rec};
    CtxPtr rx = emulated_on(1, &a);
    ASSERT_TRUE(tx && base && rx);

    gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT, co = GSER_UCX_WORKER_OPTIONS_INIT;
    so.gser_ctx = rx.get();
    co.gser_ctx = tx.get();
    so.staging_chunk = co.staging_chunk = 16 << 10;
    Pair pair;
    ASSERT_NO_FATAL_FAILURE(pair.open(&so, &co));

    const size_t n = 200000;
    std::vector<unsigned char> bytes(n);
    TestMsg::fill(bytes.data(), n, 7);
    void *dev = nullptr;
    ASSERT_EQ(gser_device_alloc(tx.get(), n, nullptr, &dev), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(tx.get(), dev, GSER_MEMORY_DEVICE, bytes.data(), GSER_MEMORY_HOST, n, nullptr), GSER_OK);
    ASSERT_EQ(gser_stream_wait(tx.get(), nullptr), GSER_OK);
    unsigned char hdr[16] = {'H'};
    gser_frame_t f[2] = {};
    f[0].data = hdr, f[0].size = sizeof hdr;
    f[1].data = dev, f[1].size = n, f[1].memory = GSER_MEMORY_DEVICE;

    gser_ucx_request_t *sr, *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair.sep.get(), nullptr, &rr));
    UCX_OK(gser_ucx_ep_send_nb(pair.cep.get(), f, 2, nullptr, &sr));
    ReqPtr s(sr), r(rr);
    UCX_OK(drive({pair.client.get(), pair.server.get()}, rr, 60000));
    UCX_OK(drive({pair.client.get(), pair.server.get()}, sr));
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    UCX_OK(gser_ucx_request_take(rr, &got));
    ASSERT_EQ(got.nframes, 2u);
    const gser_frame_t &g = got.frames[1];
    EXPECT_EQ(g.memory, GSER_MEMORY_DEVICE);
    EXPECT_EQ(g.device, 1) << "the receiver's GPU, not the sender's (0)";
    std::vector<unsigned char> back(n);
    ASSERT_EQ(gser_device_memcpy(rx.get(), back.data(), GSER_MEMORY_HOST, g.data, GSER_MEMORY_DEVICE, n, nullptr),
              GSER_OK);
    EXPECT_EQ(back, bytes);
    {
        std::lock_guard<std::mutex> lk(rec.lock);
        bool found = false;
        for (auto &al : rec.allocs)
            if (al.first == g.data) {
                found = true;
                EXPECT_NE(al.second, nullptr) << "allocated on the per-thread stream, not the staging stream";
            }
        EXPECT_TRUE(found);
    }
    gser_ucx_recv_release(&got, false);
    gser_device_free(tx.get(), dev, n, nullptr);
}
