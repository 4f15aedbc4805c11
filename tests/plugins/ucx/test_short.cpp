// The short head (docs/ucx.md 4.1): a message whose only frame is a gser
// header travels as one UCX send of kind 5 that leaves out the header's
// 7-byte magic. What goes on the wire is checked on UCX's queue before gser
// takes it; hand-written short heads, as a second implementation would send
// them, are received; and bad ones (empty, out of order, over the limits,
// not a header) fail the receive and close the endpoint.
#include "internal.h"
#include "ucx_common.hpp"

namespace {

// A one-frame message: {"op": "data", "x": 8 bytes}, as gser-bench-ucx sends.
MsgPtr small_msg(gser_context_t *ctx)
{
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    MsgPtr p(m);
    gser_value_t *root, *v;
    EXPECT_EQ(gser_msg_new_map(m, &root), GSER_OK);
    EXPECT_EQ(gser_msg_new_cstr(m, "data", &v), GSER_OK);
    EXPECT_EQ(gser_map_put_cstr(root, "op", v), GSER_OK);
    static const unsigned char payload[8] = {1, 2, 3, 4, 5, 6, 7, 8}; // borrowed by the message
    EXPECT_EQ(gser_msg_new_bytes(m, payload, sizeof payload, &v), GSER_OK);
    EXPECT_EQ(gser_map_put_cstr(root, "x", v), GSER_OK);
    EXPECT_EQ(gser_msg_set_root(m, root), GSER_OK);
    return p;
}

bool is_small_msg(gser_msg_t *m)
{
    gser_value_t *v;
    const char *s;
    size_t n;
    const void *b;
    return gser_map_find_cstr(gser_msg_get_root(m), "op", &v) == GSER_OK && gser_value_get_str(v, &s, &n) == GSER_OK &&
           n == 4 && std::memcmp(s, "data", 4) == 0 && gser_map_find_cstr(gser_msg_get_root(m), "x", &v) == GSER_OK &&
           gser_value_get_bytes(v, &b, &n) == GSER_OK && n == 8 && ((const unsigned char *)b)[7] == 8;
}

class ShortHead : public PairTest {
  protected:
    // The next message on UCX's queue of the server's worker (not taken off
    // it): its tag and length. Waits until one is there.
    ::testing::AssertionResult peek(ucp_tag_recv_info_t *info)
    {
        gser_ucx_worker_t *sw = pair_.server.get();
        bool seen = drive_until({pair_.client.get()}, [&] {
            ucp_worker_progress(sw->ucp); // UCX's own progress: no gser receive takes it
            return ucp_tag_probe_nb(sw->ucp, 0, 0, 0, info) != nullptr;
        });
        return seen ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "nothing arrived";
    }

    // Send len bytes from the client's UCX endpoint, as a peer would, with
    // the tag of a message of this kind and sequence number.
    void inject(const void *bytes, size_t len, unsigned kind, uint32_t seq)
    {
        gser_ucx_ep_t *cep = pair_.cep.get();
        ucp_request_param_t p{};
        ucs_status_ptr_t r = ucp_tag_send_nbx(cep->ucp, bytes, len, gux_tag(cep->peer_id, kind, seq), &p);
        ASSERT_FALSE(UCS_PTR_IS_ERR(r));
        if (r) {
            ASSERT_TRUE(drive_until({pair_.client.get(), pair_.server.get()},
                                    [&] { return ucp_request_check_status(r) != UCS_INPROGRESS; }));
            ucp_request_free(r);
        }
    }

    // Receive one message on the server end and deserialize it; the status.
    gser_status_t receive(MsgPtr *out)
    {
        gser_msg_t *m = nullptr;
        gser_status_t st = gser_ucx_ep_recv_msg(pair_.sep.get(), ctx_.get(), nullptr, kWaitMs, &m);
        out->reset(m);
        return st;
    }

    // The server end failed with st, saying why in words that contain what.
    void expect_closed(gser_status_t st, const char *what)
    {
        MsgPtr m;
        EXPECT_EQ(receive(&m), st) << gser_ucx_get_last_error();
        EXPECT_NE(std::string(gser_ucx_get_last_error()).find(what), std::string::npos) << gser_ucx_get_last_error();
        EXPECT_EQ(gser_ucx_ep_get_status(pair_.sep.get()), st);
        EXPECT_TRUE(drive_until({pair_.client.get(), pair_.server.get()},
                                [&] { return gser_ucx_ep_get_status(pair_.cep.get()) != GSER_OK; }));
    }
};

TEST_F(ShortHead, AOneFrameMessageIsItsHeaderWithoutTheMagic)
{
    MsgPtr m = small_msg(ctx_.get());
    auto frames = serialize(ctx_.get(), m.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 1u);
    const gser_frame_t &h = gser_frames_get_array(frames.get())[0];
    ASSERT_GT(h.size, (size_t)GUX_SHORT_PREFIX_LEN);
    ASSERT_EQ(std::memcmp(h.data, GUX_SHORT_PREFIX, GUX_SHORT_PREFIX_LEN), 0);

    UCX_OK(gser_ucx_ep_send(pair_.cep.get(), gser_frames_get_array(frames.get()), 1, kWaitMs));
    ucp_tag_recv_info_t info;
    ASSERT_TRUE(peek(&info));
    EXPECT_EQ(gux_tag_kind(info.sender_tag), (unsigned)GUX_KIND_SHORT);
    EXPECT_EQ(gux_tag_seq(info.sender_tag), 0u);
    EXPECT_EQ(gux_tag_conn(info.sender_tag), pair_.sep.get()->local_id);
    EXPECT_EQ(info.length, h.size - GUX_SHORT_PREFIX_LEN);
    // 30 bytes of header, 23 on the wire: within the first cache line of a
    // slot of UCX's shared-memory queue, where a 78-byte head was not.
    EXPECT_LE(info.length, 28u);

    // The receiver puts the magic back: the frame is the sender's header.
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr r(rr);
    UCX_OK(drive({pair_.server.get()}, rr));
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    UCX_OK(gser_ucx_request_take(rr, &got));
    ASSERT_EQ(got.nframes, 1u);
    ASSERT_EQ(got.frames[0].size, h.size);
    EXPECT_EQ(std::memcmp(got.frames[0].data, h.data, h.size), 0);
    EXPECT_EQ(got.frames[0].memory, GSER_MEMORY_HOST);
    gser_msg_t *dm = nullptr;
    UCX_OK(gser_deserialize(ctx_.get(), got.frames, got.nframes, nullptr, &dm));
    gser_ucx_recv_release(&got, true); // the message owns the head buffer now
    MsgPtr d(dm);
    EXPECT_TRUE(is_small_msg(dm));
}

TEST_F(ShortHead, OtherMessagesKeepTheHead)
{
    // Two frames; one frame that is not a gser header; a header in device
    // memory is refused either way (frame 0 must be host memory).
    TestMsg two(ctx_.get(), {100000});
    auto frames = serialize(ctx_.get(), two.msg.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    gser_ucx_request_t *sr;
    UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), gser_frames_get_array(frames.get()), 2, nullptr, &sr));
    ReqPtr s(sr);
    ucp_tag_recv_info_t info;
    ASSERT_TRUE(peek(&info));
    EXPECT_EQ(gux_tag_kind(info.sender_tag), (unsigned)GUX_KIND_HEAD);
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr r(rr);
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr));
    gser_msg_t *gm = nullptr;
    UCX_OK(gser_ucx_request_deserialize(rr, ctx_.get(), nullptr, &gm));
    MsgPtr got(gm);
    EXPECT_TRUE(same_msg(got.get(), {100000}, 1));

    unsigned char raw[12] = {0x94, 0xd6, 0x01, 'G', 'S', 'E', 'X', 1, 2, 3, 4, 5}; // one byte off the magic
    gser_frame_t f{};
    f.data = raw;
    f.size = sizeof raw;
    UCX_OK(gser_ucx_ep_send(pair_.cep.get(), &f, 1, kWaitMs));
    ASSERT_TRUE(peek(&info));
    EXPECT_EQ(gux_tag_kind(info.sender_tag), (unsigned)GUX_KIND_HEAD);
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    r.reset(rr);
    UCX_OK(drive({pair_.server.get()}, rr));
    gser_ucx_recv_t raw_got = GSER_UCX_RECV_INIT;
    UCX_OK(gser_ucx_request_take(rr, &raw_got));
    ASSERT_EQ(raw_got.nframes, 1u);
    ASSERT_EQ(raw_got.frames[0].size, sizeof raw);
    EXPECT_EQ(std::memcmp(raw_got.frames[0].data, raw, sizeof raw), 0);
    gser_ucx_recv_release(&raw_got, false);
}

TEST_F(ShortHead, ShortAndFullHeadsInterleaveInOrder)
{
    MsgPtr small = small_msg(ctx_.get());
    for (unsigned i = 0; i < 200; i++) {
        if (i % 3 == 2) {
            TestMsg big(ctx_.get(), {20000, 3}, i);
            MsgPtr got = send_recv(pair_, ctx_.get(), big.msg.get());
            ASSERT_TRUE(got && same_msg(got.get(), {20000, 3}, i)) << "message " << i;
        } else {
            MsgPtr got = send_recv(pair_, ctx_.get(), small.get());
            ASSERT_TRUE(got && is_small_msg(got.get())) << "message " << i;
        }
    }
}

TEST_F(ShortHead, ManyInFlightBeforeThePeerLooksArriveInOrder)
{
    // More short heads than UCX's shared-memory queue holds (64 slots), sent
    // before the receiver looks: the first go out at once, the later ones
    // cannot and take the path that posts and waits. The full heads in
    // between keep their places.
    const unsigned n = 600;
    auto full = [](unsigned i) { return i % 50 == 7; };
    std::vector<std::unique_ptr<TestMsg>> msgs;
    std::vector<FramesPtr> frames;
    std::vector<ReqPtr> sends;
    unsigned waiting = 0;
    for (unsigned i = 0; i < n; i++) {
        msgs.push_back(std::make_unique<TestMsg>(ctx_.get(), full(i) ? std::vector<size_t>{100000} : std::vector<size_t>{}, i));
        frames.push_back(serialize(ctx_.get(), msgs.back()->msg.get()));
        ASSERT_EQ(gser_frames_get_count(frames.back().get()), full(i) ? 2u : 1u);
        gser_ucx_request_t *sr = nullptr;
        UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), gser_frames_get_array(frames.back().get()),
                                   gser_frames_get_count(frames.back().get()), nullptr, &sr));
        sends.emplace_back(sr);
        waiting += gser_ucx_request_query(sr) == GSER_INPROGRESS;
    }
    for (unsigned i = 0; i < n; i++) {
        gser_ucx_request_t *rr = nullptr;
        UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
        ReqPtr r(rr);
        UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
        gser_msg_t *gm = nullptr;
        UCX_OK(gser_ucx_request_deserialize(rr, ctx_.get(), nullptr, &gm));
        MsgPtr got(gm);
        ASSERT_TRUE(same_msg(got.get(), full(i) ? std::vector<size_t>{100000} : std::vector<size_t>{}, i))
            << "message " << i;
    }
    for (auto &sr : sends)
        UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr.get()));
    const char *tls = std::getenv("UCX_TLS");
    if (tls && std::string(tls).find("posix") != std::string::npos) {
        EXPECT_GT(waiting, 0u) << "every send went out at once: the waiting path was not taken";
    }
    // The stream drained: the next short head is tried at once again.
    MsgPtr got = send_recv(pair_, ctx_.get(), msgs[0]->msg.get());
    ASSERT_TRUE(got && same_msg(got.get(), {}, 0));
    EXPECT_FALSE(pair_.cep.get()->short_queued);
}

TEST_F(ShortHead, ASmallHeadsBufferServesAgainOnlyOnceReleased)
{
    // Receive one small message and take its frames (the caller owns the
    // head buffer); frame 0's address.
    auto take_one = [&](gser_ucx_recv_t *got) -> const void * {
        MsgPtr m = small_msg(ctx_.get());
        EXPECT_EQ(gser_ucx_ep_send_msg(pair_.cep.get(), ctx_.get(), m.get(), nullptr, kWaitMs), GSER_OK);
        gser_ucx_request_t *rr = nullptr;
        EXPECT_EQ(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr), GSER_OK);
        ReqPtr r(rr);
        EXPECT_EQ(drive({pair_.client.get(), pair_.server.get()}, rr), GSER_OK);
        EXPECT_EQ(gser_ucx_request_take(rr, got), GSER_OK) << gser_ucx_get_last_error();
        return got->nframes ? got->frames[0].data : nullptr;
    };
    gser_ucx_recv_t a = GSER_UCX_RECV_INIT, b = GSER_UCX_RECV_INIT, c = GSER_UCX_RECV_INIT;
    const void *pa = take_one(&a);
    const void *pb = take_one(&b);
    EXPECT_NE(pa, pb) << "two heads held at once share a buffer";
    size_t size = a.frames[0].size;
    gser_ucx_recv_release(&a, false); // its buffer is kept for the next head
    void *other = std::malloc(size); // what free() gave back would be this
    const void *pc = take_one(&c);
    EXPECT_EQ(pc, pa) << "a released small head's buffer was not used again";
    EXPECT_NE(pc, pb);
    EXPECT_NE(other, pc); // (uses other: a malloc never read may be left out)
    std::free(other);
    // Both still intact: each is its own sender's header.
    MsgPtr m = small_msg(ctx_.get());
    auto frames = serialize(ctx_.get(), m.get());
    const gser_frame_t &h = gser_frames_get_array(frames.get())[0];
    for (gser_ucx_recv_t *g : {&b, &c}) {
        ASSERT_EQ(g->frames[0].size, h.size);
        EXPECT_EQ(std::memcmp(g->frames[0].data, h.data, h.size), 0);
    }
    gser_ucx_recv_release(&b, false);
    gser_ucx_recv_release(&c, false);
}

TEST_F(ShortHead, AHandWrittenShortHeadIsReceived)
{
    // What a second implementation following docs/ucx.md would send.
    MsgPtr m = small_msg(ctx_.get());
    auto frames = serialize(ctx_.get(), m.get());
    const gser_frame_t &h = gser_frames_get_array(frames.get())[0];
    ASSERT_NO_FATAL_FAILURE(inject((const unsigned char *)h.data + 7, h.size - 7, 5, 0));
    pair_.cep.get()->send_seq = 1;
    MsgPtr got;
    UCX_OK(receive(&got));
    EXPECT_TRUE(is_small_msg(got.get()));
    // gser's own sends follow on the same sequence.
    UCX_OK(gser_ucx_ep_send_msg(pair_.cep.get(), ctx_.get(), m.get(), nullptr, kWaitMs));
    UCX_OK(receive(&got));
    EXPECT_TRUE(is_small_msg(got.get()));
}

TEST_F(ShortHead, AnEmptyOneIsTruncated)
{
    unsigned char none = 0;
    ASSERT_NO_FATAL_FAILURE(inject(&none, 0, GUX_KIND_SHORT, 0));
    expect_closed(GSER_ERR_TRUNCATED, "0-byte message head (short form) is shorter");
}

TEST_F(ShortHead, OneOutOfOrderIsAFormatError)
{
    MsgPtr m = small_msg(ctx_.get());
    auto frames = serialize(ctx_.get(), m.get());
    const gser_frame_t &h = gser_frames_get_array(frames.get())[0];
    ASSERT_NO_FATAL_FAILURE(inject((const unsigned char *)h.data + 7, h.size - 7, GUX_KIND_SHORT, 1));
    expect_closed(GSER_ERR_FORMAT, "message 1 arrived where message 0 was due");
}

TEST_F(ShortHead, OneThatIsNotAHeaderFailsToDeserialize)
{
    // The 7 bytes put back, then a version the reader does not know.
    unsigned char rest[4] = {0x63, 0x80, 0x90, 0xc0};
    ASSERT_NO_FATAL_FAILURE(inject(rest, sizeof rest, GUX_KIND_SHORT, 0));
    expect_closed(GSER_ERR_WIRE_VERSION, "closed");
}

TEST(ShortHeadLimits, OneOverTheLimitsIsRefusedBeforeItIsMoved)
{
    auto gctx = make_ctx();
    gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_limits_t lims = GSER_LIMITS_INIT;
    lims.max_bytes = 4096;
    so.limits = &lims;
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
    // A one-frame message of 4,200 bytes: a short head of 4,193 bytes.
    gser_msg_t *raw = nullptr;
    ASSERT_EQ(gser_msg_create(gctx.get(), &raw), GSER_OK);
    MsgPtr m(raw);
    std::vector<unsigned char> blob(4180, 0x5a);
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_bytes(raw, blob.data(), blob.size(), &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(raw, v), GSER_OK);
    auto frames = serialize(gctx.get(), raw);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 1u);
    ASSERT_GT(gser_frames_get_array(frames.get())[0].size, (size_t)4096);
    UCX_OK(gser_ucx_ep_send(p.cep.get(), gser_frames_get_array(frames.get()), 1, kWaitMs));
    gser_msg_t *got = nullptr;
    EXPECT_EQ(gser_ucx_ep_recv_msg(p.sep.get(), gctx.get(), nullptr, kWaitMs, &got), GSER_ERR_LIMIT_BYTES)
        << gser_ucx_get_last_error();
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("short form"), std::string::npos) << gser_ucx_get_last_error();
    EXPECT_EQ(gser_ucx_ep_get_status(p.sep.get()), GSER_ERR_LIMIT_BYTES);
    // At the limit, it is received.
    EpPtr c, s;
    ASSERT_NO_FATAL_FAILURE(p.connect(&c, &s));
    blob.resize(4096 - (gser_frames_get_array(frames.get())[0].size - 4180));
    ASSERT_EQ(gser_msg_create(gctx.get(), &raw), GSER_OK);
    MsgPtr m2(raw);
    ASSERT_EQ(gser_msg_new_bytes(raw, blob.data(), blob.size(), &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(raw, v), GSER_OK);
    auto f2 = serialize(gctx.get(), raw);
    ASSERT_EQ(gser_frames_get_array(f2.get())[0].size, (size_t)4096);
    UCX_OK(gser_ucx_ep_send(c.get(), gser_frames_get_array(f2.get()), 1, kWaitMs));
    UCX_OK(gser_ucx_ep_recv_msg(s.get(), gctx.get(), nullptr, kWaitMs, &got));
    MsgPtr gp(got);
    close_driving(c, p.server.get());
    s.reset();
    p.close();
}

} // namespace
