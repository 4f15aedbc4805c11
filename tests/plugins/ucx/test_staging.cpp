// Device frames through the transport. Debian's UCX cannot touch device
// memory, so they are staged through pinned bounce buffers in chunks; here
// over the emulated device backend (device memory is host memory, every
// device code path runs), and over CUDA when this machine has a GPU.
#include "ucx_common.hpp"

namespace {

CtxPtr device_ctx(const char *backend)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = backend;
    gser_context_t *c = nullptr;
    if (gser_context_create(&o, &c) != GSER_OK)
        return nullptr;
    return CtxPtr(c);
}

// Device memory with a known pattern.
struct DevBuf {
    gser_context_t *ctx;
    void *p = nullptr;
    size_t n;
    DevBuf(gser_context_t *c, size_t size, unsigned seed) : ctx(c), n(size)
    {
        EXPECT_EQ(gser_device_alloc(ctx, n ? n : 1, nullptr, &p), GSER_OK) << gser_context_get_last_error(ctx);
        std::vector<unsigned char> h(n);
        TestMsg::fill(h.data(), n, seed);
        if (n) {
            EXPECT_EQ(gser_device_memcpy(ctx, p, GSER_MEMORY_DEVICE, h.data(), GSER_MEMORY_HOST, n, nullptr),
                      GSER_OK);
        }
        EXPECT_EQ(gser_stream_wait(ctx, nullptr), GSER_OK);
    }
    ~DevBuf() { gser_device_free(ctx, p, n ? n : 1, nullptr); }
};

// Bytes of a received frame, wherever it lives.
std::vector<unsigned char> read_back(gser_context_t *ctx, const void *p, size_t n, gser_memory_t m)
{
    std::vector<unsigned char> h(n);
    if (!n)
        return h;
    if (m == GSER_MEMORY_DEVICE) {
        EXPECT_EQ(gser_device_memcpy(ctx, h.data(), GSER_MEMORY_HOST, p, GSER_MEMORY_DEVICE, n, nullptr), GSER_OK);
        EXPECT_EQ(gser_stream_wait(ctx, nullptr), GSER_OK);
    } else {
        std::memcpy(h.data(), p, n);
    }
    return h;
}

class Staging : public ::testing::TestWithParam<const char *> {
  protected:
    void SetUp() override
    {
        dctx_ = device_ctx(GetParam());
        if (!dctx_) {
            if (std::string(GetParam()) == "cuda")
                GTEST_SKIP() << "no usable CUDA device here";
            FAIL() << "no " << GetParam() << " backend: " << gser_context_get_last_error(nullptr);
        }
    }

    // A pair whose workers use the device context; small chunks so that
    // frames take many of them.
    void open(size_t send_chunk, size_t recv_chunk, bool recv_device = true, unsigned depth = 2)
    {
        gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
        gser_ucx_worker_options_t co = GSER_UCX_WORKER_OPTIONS_INIT;
        co.gser_ctx = dctx_.get();
        co.staging_chunk = send_chunk;
        co.staging_depth = depth;
        so.gser_ctx = recv_device ? dctx_.get() : nullptr;
        so.staging_chunk = recv_chunk;
        so.staging_depth = depth;
        ASSERT_NO_FATAL_FAILURE(pair_.open(&so, &co));
    }

    // Send raw frames [hdr, device frames...] and take them on the other side.
    void send_recv(const std::vector<size_t> &sizes, gser_ucx_recv_t *got)
    {
        std::vector<std::unique_ptr<DevBuf>> bufs;
        unsigned char hdr[16] = {'H'};
        std::vector<gser_frame_t> f(1);
        f[0].data = hdr;
        f[0].size = sizeof hdr;
        for (size_t i = 0; i < sizes.size(); i++) {
            bufs.push_back(std::make_unique<DevBuf>(dctx_.get(), sizes[i], 100 + (unsigned)i));
            gser_frame_t d{};
            d.data = bufs.back()->p;
            d.size = sizes[i];
            d.memory = GSER_MEMORY_DEVICE;
            f.push_back(d);
        }
        gser_ucx_request_t *sr, *rr;
        UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
        UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), f.data(), f.size(), nullptr, &sr));
        ReqPtr s(sr), r(rr);
        UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr, 60000));
        UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr));
        UCX_OK(gser_ucx_request_take(rr, got));
    }

    // Start sending [hdr, 16 MiB device frame] with 64 KiB chunks and drive
    // both sides a little: the frame is halfway through staging.
    void start_staging(std::unique_ptr<DevBuf> *big, ReqPtr *send, ReqPtr *recv)
    {
        ASSERT_NO_FATAL_FAILURE(open(64 << 10, 64 << 10));
        *big = std::make_unique<DevBuf>(dctx_.get(), 16 << 20, 1);
        gser_frame_t f[2] = {};
        f[0].data = staging_hdr_, f[0].size = sizeof staging_hdr_;
        f[1].data = (*big)->p, f[1].size = (*big)->n, f[1].memory = GSER_MEMORY_DEVICE;
        gser_ucx_request_t *sr, *rr;
        UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
        recv->reset(rr);
        UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), f, 2, nullptr, &sr));
        send->reset(sr);
        for (int i = 0; i < 30; i++) {
            gser_ucx_worker_progress(pair_.client.get());
            gser_ucx_worker_progress(pair_.server.get());
        }
    }
    unsigned char staging_hdr_[8] = {1};

    void check(const gser_ucx_recv_t &got, const std::vector<size_t> &sizes, gser_memory_t want_mem)
    {
        ASSERT_EQ(got.nframes, sizes.size() + 1);
        for (size_t i = 0; i < sizes.size(); i++) {
            const gser_frame_t &fr = got.frames[i + 1];
            ASSERT_EQ(fr.size, sizes[i]);
            if (sizes[i]) {
                EXPECT_EQ(fr.memory, want_mem) << "frame " << i + 1;
            }
            std::vector<unsigned char> want(sizes[i]);
            TestMsg::fill(want.data(), sizes[i], 100 + (unsigned)i);
            EXPECT_EQ(read_back(dctx_.get(), fr.data, fr.size, fr.memory), want) << "frame " << i + 1;
        }
    }

    CtxPtr dctx_;
    Pair pair_;
};

// Chunks of 64 KiB, two in flight: frames of one chunk, of several, of a
// chunk and a byte, and an empty one (which travels inline).
TEST_P(Staging, DeviceFramesThroughBounceBuffers)
{
    ASSERT_NO_FATAL_FAILURE(open(64 << 10, 64 << 10));
    std::vector<size_t> sizes = {1, 0, 65536, 65537, 1000003, (size_t)5 << 20};
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    ASSERT_NO_FATAL_FAILURE(send_recv(sizes, &got));
    check(got, sizes, GSER_MEMORY_DEVICE);
    gser_ucx_recv_release(&got, false);
    pair_.close();
}

// The sender's chunk size is what counts; the receiver adapts.
TEST_P(Staging, PeersWithDifferentChunks)
{
    ASSERT_NO_FATAL_FAILURE(open(256 << 10, 32 << 10, true, 3));
    std::vector<size_t> sizes = {300000, 4 << 20};
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    ASSERT_NO_FATAL_FAILURE(send_recv(sizes, &got));
    check(got, sizes, GSER_MEMORY_DEVICE);
    gser_ucx_recv_release(&got, false);
}

// A receiver without a device backend gets the bytes in host memory.
TEST_P(Staging, ReceiverWithoutDeviceGetsHostFrames)
{
    ASSERT_NO_FATAL_FAILURE(open(64 << 10, 0, false));
    std::vector<size_t> sizes = {1000, 200000};
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    ASSERT_NO_FATAL_FAILURE(send_recv(sizes, &got));
    check(got, sizes, GSER_MEMORY_HOST);
    gser_ucx_recv_release(&got, false);
}

// A whole message with device buffers: serialized with the "device" family
// (small buffers packed into one device frame, large ones zero-copy), sent,
// and rebuilt with its buffers in device memory.
TEST_P(Staging, DeviceMessageRoundTrip)
{
    ASSERT_NO_FATAL_FAILURE(open(128 << 10, 128 << 10));
    std::vector<size_t> sizes = {10, 4000, 2 << 20, 3 << 20};
    std::vector<std::unique_ptr<DevBuf>> bufs;
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(dctx_.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *list, *v;
    ASSERT_EQ(gser_msg_new_list(m, &list), GSER_OK);
    for (size_t i = 0; i < sizes.size(); i++) {
        bufs.push_back(std::make_unique<DevBuf>(dctx_.get(), sizes[i], 100 + (unsigned)i));
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = bufs.back()->p;
        d.nbytes = sizes[i];
        d.memory = GSER_MEMORY_DEVICE;
        ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
        ASSERT_EQ(gser_list_append(list, v), GSER_OK);
    }
    ASSERT_EQ(gser_msg_set_root(m, list), GSER_OK);
    // The client sends (blocking) while a thread drives the server, whose
    // receive is posted first (rendezvous frames wait for it).
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr rp(rr);
    std::atomic<bool> stop{false};
    std::thread t([&] {
        while (!stop)
            gser_ucx_worker_progress(pair_.server.get());
    });
    gser_status_t st = gser_ucx_ep_send_msg(pair_.cep.get(), dctx_.get(), m, nullptr, kWaitMs);
    stop = true;
    t.join();
    UCX_OK(st);
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
    gser_msg_t *got = nullptr;
    UCX_OK(gser_ucx_request_deserialize(rr, dctx_.get(), nullptr, &got));
    MsgPtr gp(got);
    gser_value_t *root = gser_msg_get_root(got);
    ASSERT_EQ(gser_value_get_len(root), sizes.size());
    for (size_t i = 0; i < sizes.size(); i++) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        ASSERT_EQ(gser_list_get(root, i, &v), GSER_OK);
        ASSERT_EQ(gser_value_get_buffer(v, &d), GSER_OK);
        ASSERT_EQ(d.nbytes, sizes[i]);
        EXPECT_EQ(d.memory, GSER_MEMORY_DEVICE);
        std::vector<unsigned char> want(sizes[i]);
        TestMsg::fill(want.data(), sizes[i], 100 + (unsigned)i);
        EXPECT_EQ(read_back(dctx_.get(), d.data, d.nbytes, d.memory), want) << i;
    }
}

// Closing an endpoint while a staged frame is halfway: everything ends
// canceled, bounce buffers and device memory go back (LeakSanitizer).
TEST_P(Staging, CloseWhileStaging)
{
    std::unique_ptr<DevBuf> big;
    ReqPtr s, r;
    ASSERT_NO_FATAL_FAILURE(start_staging(&big, &s, &r));
    gser_ucx_request_t *sr = s.get(), *rr = r.get();
    UCX_OK(gser_ucx_ep_close(pair_.sep.get()));
    EXPECT_EQ(gser_ucx_request_query(rr), GSER_ERR_CANCELED);
    gser_status_t st = drive({pair_.client.get(), pair_.server.get()}, sr);
    EXPECT_TRUE(st == GSER_ERR_CONNECTION || st == GSER_OK) << gser_status_str(st) << ": " << gser_ucx_get_last_error();
}

// The same, closing the sending side.
TEST_P(Staging, CloseSenderWhileStaging)
{
    std::unique_ptr<DevBuf> big;
    ReqPtr s, r;
    ASSERT_NO_FATAL_FAILURE(start_staging(&big, &s, &r));
    gser_ucx_request_t *sr = s.get(), *rr = r.get();
    auto t0 = std::chrono::steady_clock::now();
    UCX_OK(gser_ucx_ep_close(pair_.cep.get()));
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 1500);
    EXPECT_EQ(gser_ucx_request_query(sr), GSER_ERR_CANCELED);
    gser_status_t st = drive({pair_.client.get(), pair_.server.get()}, rr);
    EXPECT_EQ(st, GSER_ERR_CONNECTION) << gser_status_str(st) << ": " << gser_ucx_get_last_error();
}

// Without a device backend on the sending side, device frames are refused.
TEST(StagingSetup, SenderWithoutDeviceRefusesDeviceFrames)
{
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open());
    unsigned char hdr[8] = {1}, data[100] = {2};
    gser_frame_t f[2] = {};
    f[0].data = hdr, f[0].size = sizeof hdr;
    f[1].data = data, f[1].size = sizeof data, f[1].memory = GSER_MEMORY_DEVICE;
    gser_ucx_request_t *r = nullptr;
    EXPECT_EQ(gser_ucx_ep_send_nb(p.cep.get(), f, 2, nullptr, &r), GSER_ERR_NO_DEVICE);
    EXPECT_EQ(r, nullptr);
    // Nothing went out: the endpoint still works.
    f[1].memory = GSER_MEMORY_HOST;
    UCX_OK(gser_ucx_ep_send_nb(p.cep.get(), f, 2, nullptr, &r));
    ReqPtr rp(r);
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr));
    ReqPtr rrp(rr);
    UCX_OK(drive({p.client.get(), p.server.get()}, rr));
    p.close();
}

INSTANTIATE_TEST_SUITE_P(Backends, Staging, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

} // namespace
