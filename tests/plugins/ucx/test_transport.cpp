// The UCX transport in one process: two workers, connected over 127.0.0.1
// with whatever transports UCX_TLS allows (ctest runs this suite over tcp
// and over shared memory).
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>

#include "ucx_common.hpp"

namespace {

class Transport : public PairTest {
  protected:
    gser_context_t *ctx() { return ctx_.get(); }

    // Send msg from the client and receive it on the server.
    MsgPtr round_trip(const gser_msg_t *msg) { return send_recv(pair_, ctx(), msg); }
};

TEST_F(Transport, HandshakeReportsVersionsAndCaps)
{
    gser_ucx_peer_info_t pi = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(pair_.cep.get(), &pi));
    EXPECT_EQ(pi.wire_version, (uint32_t)GSER_UCX_WIRE_VERSION);
    EXPECT_EQ(pi.gser_wire_version, (uint32_t)GSER_WIRE_VERSION);
    EXPECT_EQ(pi.caps, gser_ucx_context_get_caps(pair_.ctx.get()));
    // The connection's addresses, as each side's TCP control socket has them.
    EXPECT_STREQ(pi.local_host, "127.0.0.1");
    EXPECT_STREQ(pi.peer_host, "127.0.0.1");
    EXPECT_EQ(pi.peer_port, gser_ucx_listener_get_port(pair_.listener.get()));
    EXPECT_NE(pi.local_port, 0);
    EXPECT_NE(pi.local_port, pi.peer_port);
    gser_ucx_peer_info_t si = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(pair_.sep.get(), &si));
    EXPECT_EQ(si.wire_version, (uint32_t)GSER_UCX_WIRE_VERSION);
    EXPECT_STREQ(si.local_host, "127.0.0.1");
    EXPECT_EQ(si.local_port, pi.peer_port);
    EXPECT_EQ(si.peer_port, pi.local_port);
    EXPECT_EQ(gser_ucx_ep_get_worker(pair_.cep.get()), pair_.client.get());
    // A caller built against the struct before the addresses gets the
    // fields it knows and nothing written past them.
    struct {
        gser_ucx_peer_info_t head;
        unsigned char guard[64];
    } old = {};
    old.head.size = offsetof(gser_ucx_peer_info_t, local_host);
    memset(old.head.local_host, 0x5a, sizeof old.head.local_host);
    memset(old.guard, 0x5a, sizeof old.guard);
    UCX_OK(gser_ucx_ep_get_peer_info(pair_.cep.get(), &old.head));
    EXPECT_EQ(old.head.wire_version, (uint32_t)GSER_UCX_WIRE_VERSION);
    EXPECT_EQ((unsigned char)old.head.local_host[0], 0x5a);
}

TEST_F(Transport, EmptyMessage)
{
    auto m = std::make_unique<TestMsg>(ctx(), std::vector<size_t>{});
    MsgPtr nil_msg;
    {
        gser_msg_t *raw = nullptr;
        ASSERT_EQ(gser_msg_create(ctx(), &raw), GSER_OK);
        nil_msg.reset(raw);
    }
    auto got = round_trip(nil_msg.get());
    ASSERT_TRUE(got);
    EXPECT_EQ(gser_value_get_kind(gser_msg_get_root(got.get())), GSER_KIND_NIL);
    got = round_trip(m->msg.get());
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), {}, 1));
}

TEST_F(Transport, FrameSizes)
{
    // Inline (in the header or in the head send), tag sends around the
    // inline limit, and rendezvous sizes.
    std::vector<size_t> sizes = {0, 1, 255, 256, 4095, 8192, 8193, 65536, 65537, (size_t)1 << 20, 3000001};
    TestMsg m(ctx(), sizes, 7);
    auto got = round_trip(m.msg.get());
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), sizes, 7));
}

// Frames straight through the transport, without gser content checks:
// zero-byte frames, one byte, and what arrives is what was sent.
TEST_F(Transport, RawFramesZeroAndOneByte)
{
    unsigned char hdr[3] = {1, 2, 3}, one = 0xab;
    std::vector<unsigned char> big(100000, 0x5a);
    gser_frame_t f[5] = {};
    f[0].data = hdr, f[0].size = sizeof hdr;
    f[1].data = nullptr, f[1].size = 0;
    f[2].data = &one, f[2].size = 1;
    f[3].data = big.data(), f[3].size = big.size();
    f[4].data = hdr, f[4].size = 0;
    gser_ucx_request_t *sr, *rr;
    UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), f, 5, nullptr, &sr));
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr s(sr), r(rr);
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr));
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
    EXPECT_EQ(gser_ucx_request_get_ep(rr), pair_.sep.get());
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    UCX_OK(gser_ucx_request_take(rr, &got));
    ASSERT_EQ(got.nframes, 5u);
    EXPECT_EQ(got.ep, pair_.sep.get());
    EXPECT_EQ(got.frames[0].size, 3u);
    EXPECT_EQ(std::memcmp(got.frames[0].data, hdr, 3), 0);
    EXPECT_EQ(got.frames[1].size, 0u);
    EXPECT_NE(got.frames[1].data, nullptr); // a zero-byte frame still points somewhere
    ASSERT_EQ(got.frames[2].size, 1u);
    EXPECT_EQ(*(const unsigned char *)got.frames[2].data, 0xab);
    ASSERT_EQ(got.frames[3].size, big.size());
    EXPECT_EQ(std::memcmp(got.frames[3].data, big.data(), big.size()), 0);
    EXPECT_EQ((uintptr_t)got.frames[3].data % 64, 0u);
    EXPECT_EQ(got.frames[4].size, 0u);
    for (size_t i = 0; i < 5; i++)
        EXPECT_EQ(got.frames[i].memory, GSER_MEMORY_HOST);
    // A second take fails: the frames are the caller's now.
    gser_ucx_recv_t again = GSER_UCX_RECV_INIT;
    EXPECT_EQ(gser_ucx_request_take(rr, &again), GSER_ERR_STATE);
    gser_ucx_recv_release(&got, false);
    EXPECT_EQ(got.frames, nullptr);
}

TEST_F(Transport, Frame256MiB)
{
    const size_t n = (size_t)256 << 20;
    std::unique_ptr<unsigned char[]> big(new unsigned char[n]);
    for (size_t i = 0; i < n; i += 4096)
        big[i] = (unsigned char)(i >> 12);
    big[n - 1] = 0x77;
    unsigned char hdr[8] = {'h'};
    gser_frame_t f[2] = {};
    f[0].data = hdr, f[0].size = sizeof hdr;
    f[1].data = big.get(), f[1].size = n;
    gser_ucx_request_t *sr, *rr;
    UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), f, 2, nullptr, &sr));
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr s(sr), r(rr);
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr, 60000));
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr));
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    UCX_OK(gser_ucx_request_take(rr, &got));
    ASSERT_EQ(got.nframes, 2u);
    ASSERT_EQ(got.frames[1].size, n);
    EXPECT_EQ(std::memcmp(got.frames[1].data, big.get(), n), 0);
    gser_ucx_recv_release(&got, false);
}

// 100,000 small messages in order, with a window of sends in flight; the
// receiver checks each one's sequence number.
TEST_F(Transport, HundredThousandSmallMessages)
{
    const int total = 100000, window = 128;
    int sent = 0, received = 0, send_done = 0;
    std::vector<FramesPtr> live(window);
    std::vector<gser_ucx_request_t *> sends(window, nullptr);
    gser_ucx_request_t *recv = nullptr;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool ok = true;
    while (ok && received < total && std::chrono::steady_clock::now() < end) {
        // Reap completed sends, start new ones while the window allows.
        for (int k = 0; k < window && sent < total; k++) {
            if (sends[k] && gser_ucx_request_query(sends[k]) == GSER_INPROGRESS)
                continue;
            if (sends[k]) {
                ASSERT_EQ(gser_ucx_request_query(sends[k]), GSER_OK) << gser_ucx_get_last_error();
                gser_ucx_request_free(sends[k]);
                sends[k] = nullptr;
                send_done++;
            }
            gser_msg_t *m;
            gser_value_t *root, *v;
            ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
            MsgPtr mp(m);
            ASSERT_EQ(gser_msg_new_map(m, &root), GSER_OK);
            ASSERT_EQ(gser_msg_new_int(m, sent, &v), GSER_OK);
            ASSERT_EQ(gser_map_put_cstr(root, "i", v), GSER_OK);
            ASSERT_EQ(gser_msg_set_root(m, root), GSER_OK);
            gser_frames_t *fr;
            ASSERT_EQ(gser_serialize(ctx(), m, nullptr, &fr), GSER_OK);
            live[k].reset(fr); // the header frame lives until the send completes
            UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), gser_frames_get_array(fr), gser_frames_get_count(fr), nullptr,
                                       &sends[k]));
            sent++;
        }
        gser_ucx_worker_progress(pair_.client.get());
        gser_ucx_worker_progress(pair_.server.get());
        if (!recv)
            UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &recv));
        while (recv && gser_ucx_request_query(recv) != GSER_INPROGRESS) {
            gser_msg_t *m = nullptr;
            UCX_OK(gser_ucx_request_deserialize(recv, ctx(), nullptr, &m));
            MsgPtr mp(m);
            gser_value_t *v;
            int64_t i = -1;
            ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(m), "i", &v), GSER_OK);
            ASSERT_EQ(gser_value_get_int(v, &i), GSER_OK);
            if (i != received) {
                ADD_FAILURE() << "message " << i << " arrived where " << received << " was due";
                ok = false;
            }
            received++;
            gser_ucx_request_free(recv);
            recv = nullptr;
            if (received < total) {
                UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &recv));
                gser_ucx_worker_progress(pair_.server.get());
            }
        }
    }
    EXPECT_EQ(received, total);
    for (auto *s : sends) {
        if (s) {
            EXPECT_EQ(drive({pair_.client.get(), pair_.server.get()}, s), GSER_OK);
            gser_ucx_request_free(s);
        }
    }
    gser_ucx_request_free(recv);
}

// Several endpoints from one client worker, sends interleaved across them;
// each endpoint's messages arrive in order, whether received per endpoint
// or from any endpoint.
TEST_F(Transport, InterleavedEndpoints)
{
    const int neps = 4, per_ep = 50;
    std::vector<EpPtr> ceps(neps), seps(neps);
    for (int e = 0; e < neps; e++)
        ASSERT_NO_FATAL_FAILURE(pair_.connect(&ceps[e], &seps[e]));
    std::vector<std::unique_ptr<TestMsg>> msgs;
    std::vector<FramesPtr> frames;
    std::vector<ReqPtr> sends;
    for (int k = 0; k < per_ep; k++) {
        for (int e = 0; e < neps; e++) {
            std::vector<size_t> sizes = {(size_t)(k % 3 == 0 ? 70000 : 16 * k)};
            msgs.push_back(std::make_unique<TestMsg>(ctx(), sizes, (unsigned)(e * 1000 + k)));
            frames.push_back(serialize(ctx(), msgs.back()->msg.get()));
            gser_ucx_request_t *r;
            UCX_OK(gser_ucx_ep_send_nb(ceps[e].get(), gser_frames_get_array(frames.back().get()),
                                       gser_frames_get_count(frames.back().get()), nullptr, &r));
            sends.emplace_back(r);
        }
    }
    // The first half from any endpoint, the rest per endpoint.
    std::map<gser_ucx_ep_t *, int> next;
    for (int i = 0; i < neps * per_ep / 2; i++) {
        gser_ucx_request_t *rr;
        UCX_OK(gser_ucx_worker_recv_nb(pair_.server.get(), nullptr, &rr));
        ReqPtr r(rr);
        UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
        gser_ucx_ep_t *from = gser_ucx_request_get_ep(rr);
        int e = (int)(std::find_if(seps.begin(), seps.end(), [&](const EpPtr &p) { return p.get() == from; }) -
                      seps.begin());
        ASSERT_LT(e, neps) << "message from an unknown endpoint";
        gser_msg_t *m;
        UCX_OK(gser_ucx_request_deserialize(rr, ctx(), nullptr, &m));
        MsgPtr mp(m);
        int k = next[from]++;
        std::vector<size_t> sizes = {(size_t)(k % 3 == 0 ? 70000 : 16 * k)};
        EXPECT_TRUE(same_msg(m, sizes, (unsigned)(e * 1000 + k)));
    }
    for (int e = 0; e < neps; e++) {
        for (int k = next[seps[e].get()]; k < per_ep; k++) {
            gser_msg_t *m = nullptr;
            // Blocking receives progress only the server's worker: the
            // client's sends are buffered or wait for it, so drive it too.
            gser_ucx_request_t *rr;
            UCX_OK(gser_ucx_ep_recv_nb(seps[e].get(), nullptr, &rr));
            ReqPtr r(rr);
            UCX_OK(drive({pair_.client.get(), pair_.server.get()}, rr));
            UCX_OK(gser_ucx_request_deserialize(rr, ctx(), nullptr, &m));
            MsgPtr mp(m);
            std::vector<size_t> sizes = {(size_t)(k % 3 == 0 ? 70000 : 16 * k)};
            EXPECT_TRUE(same_msg(m, sizes, (unsigned)(e * 1000 + k)));
        }
    }
    for (auto &s : sends)
        EXPECT_EQ(drive({pair_.client.get(), pair_.server.get()}, s.get()), GSER_OK);
    sends.clear();
    for (auto &ep : seps)
        close_driving(ep, pair_.client.get());
    for (auto &ep : ceps)
        close_driving(ep, pair_.server.get());
}

// Receives posted before the sends, several in flight, completion callbacks
// (including fire-and-forget sends whose request is freed after the callback).
TEST_F(Transport, CallbacksAndPostedReceives)
{
    struct Counts {
        int sends = 0, recvs = 0;
        std::vector<gser_ucx_request_t *> done;
    } counts;
    auto send_cb = [](gser_ucx_request_t *, gser_status_t st, void *ud) {
        EXPECT_EQ(st, GSER_OK);
        static_cast<Counts *>(ud)->sends++;
    };
    auto recv_cb = [](gser_ucx_request_t *req, gser_status_t st, void *ud) {
        EXPECT_EQ(st, GSER_OK);
        auto *c = static_cast<Counts *>(ud);
        c->recvs++;
        c->done.push_back(req);
    };
    gser_ucx_op_params_t rp{sizeof rp, recv_cb, &counts};
    std::vector<gser_ucx_request_t *> recvs(10);
    for (auto &r : recvs)
        UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), &rp, &r));
    std::vector<std::unique_ptr<TestMsg>> msgs;
    std::vector<FramesPtr> frames;
    gser_ucx_op_params_t sp{sizeof sp, send_cb, &counts};
    for (unsigned i = 0; i < 10; i++) {
        msgs.push_back(std::make_unique<TestMsg>(ctx(), std::vector<size_t>{100 * i, 20000}, i));
        frames.push_back(serialize(ctx(), msgs.back()->msg.get()));
        UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), gser_frames_get_array(frames.back().get()),
                                   gser_frames_get_count(frames.back().get()), &sp, nullptr));
    }
    EXPECT_EQ(counts.sends, 0); // callbacks never run inside the starting call
    ASSERT_TRUE(drive_until({pair_.client.get(), pair_.server.get()},
                            [&] { return counts.sends == 10 && counts.recvs == 10; }));
    // Completed in the order posted, each with the message sent in that order.
    ASSERT_EQ(counts.done, recvs);
    for (unsigned i = 0; i < 10; i++) {
        gser_msg_t *m;
        UCX_OK(gser_ucx_request_deserialize(recvs[i], ctx(), nullptr, &m));
        MsgPtr mp(m);
        EXPECT_TRUE(same_msg(m, {100 * i, 20000}, i));
        gser_ucx_request_free(recvs[i]);
    }
}

// Driving a worker from an event loop: arm, poll the fd, progress.
TEST_F(Transport, EventFdLoop)
{
    int sfd = -1;
    UCX_OK(gser_ucx_worker_get_efd(pair_.server.get(), &sfd));
    ASSERT_GE(sfd, 0);
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    ReqPtr r(rr);
    // Nothing was sent: once armed, the fd stays quiet.
    gser_status_t st;
    while ((st = gser_ucx_worker_arm(pair_.server.get())) == GSER_INPROGRESS)
        gser_ucx_worker_progress(pair_.server.get());
    ASSERT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
    pollfd p{sfd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 50), 0);

    // A frame past every eager limit (tcp's 512 KiB segment included): it
    // needs the server's answer, so the server has to sleep and wake.
    TestMsg m(ctx(), {10, 2 << 20}, 3);
    auto frames = serialize(ctx(), m.msg.get());
    gser_ucx_request_t *sr;
    UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()),
                               nullptr, &sr));
    ReqPtr s(sr);
    // The client is driven by a thread; the server sleeps on its fd.
    std::atomic<bool> stop{false};
    std::thread t([&] {
        while (!stop)
            gser_ucx_worker_progress(pair_.client.get());
    });
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
    int sleeps = 0, wakeups = 0;
    while (gser_ucx_request_query(rr) == GSER_INPROGRESS && std::chrono::steady_clock::now() < end) {
        if (gser_ucx_worker_progress(pair_.server.get()))
            continue;
        if (gser_ucx_worker_arm(pair_.server.get()) != GSER_OK)
            continue;
        sleeps++;
        if (poll(&p, 1, 100) > 0)
            wakeups++;
    }
    stop = true;
    t.join();
    UCX_OK(gser_ucx_request_query(rr));
    // Where the server armed and slept, the fd woke it (a broken fd leaves
    // every sleep to its 100 ms timeout). Under load the client may have
    // sent everything while the server was still progressing, so that it
    // never slept: nothing to check then.
    if (sleeps > 0) {
        EXPECT_GT(wakeups, 0) << sleeps << " sleeps";
    }
    gser_msg_t *got;
    UCX_OK(gser_ucx_request_deserialize(rr, ctx(), nullptr, &got));
    MsgPtr gp(got);
    EXPECT_TRUE(same_msg(got, {10, 2 << 20}, 3));
    UCX_OK(drive({pair_.client.get(), pair_.server.get()}, sr));
}

// The blocking calls, with their timeouts.
TEST_F(Transport, BlockingCallsAndTimeouts)
{
    gser_msg_t *got = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(gser_ucx_ep_recv_msg(pair_.sep.get(), ctx(), nullptr, 100, &got), GSER_ERR_TIMEOUT);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(ms, 90);
    EXPECT_LT(ms, 5000);
    EXPECT_EQ(got, nullptr);
    // A receive that timed out before anything arrived leaves the endpoint usable.
    UCX_OK(gser_ucx_ep_get_status(pair_.sep.get()));
    // Waiting for any event returns within its bound (UCX may have some of its own).
    gser_status_t st = gser_ucx_worker_wait(pair_.server.get(), 30);
    EXPECT_TRUE(st == GSER_OK || st == GSER_ERR_TIMEOUT) << gser_status_str(st);

    TestMsg m(ctx(), {5, 900}, 11);
    // Small messages complete locally without the receiver (larger ones
    // wait for it: this thread drives one worker at a time).
    UCX_OK(gser_ucx_ep_send_msg(pair_.cep.get(), ctx(), m.msg.get(), nullptr, kWaitMs));
    UCX_OK(gser_ucx_ep_recv_msg(pair_.sep.get(), ctx(), nullptr, kWaitMs, &got));
    MsgPtr gp(got);
    EXPECT_TRUE(same_msg(got, {5, 900}, 11));

    TestMsg m2(ctx(), {3}, 12);
    UCX_OK(gser_ucx_ep_send_msg(pair_.sep.get(), ctx(), m2.msg.get(), nullptr, kWaitMs));
    gser_ucx_ep_t *from = nullptr;
    UCX_OK(gser_ucx_worker_recv_msg(pair_.client.get(), ctx(), nullptr, kWaitMs, &got, &from));
    MsgPtr gp2(got);
    EXPECT_EQ(from, pair_.cep.get());
    EXPECT_TRUE(same_msg(got, {3}, 12));
}

TEST_F(Transport, CancelReceiveBeforeItStarts)
{
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &rr));
    gser_ucx_worker_progress(pair_.server.get());
    UCX_OK(gser_ucx_request_cancel(rr));
    EXPECT_EQ(gser_ucx_request_query(rr), GSER_ERR_CANCELED);
    gser_ucx_request_free(rr);
    // Free of a running receive cancels it too.
    UCX_OK(gser_ucx_worker_recv_nb(pair_.server.get(), nullptr, &rr));
    gser_ucx_request_free(rr);
    // The endpoint still works, and the next message goes to the next receive.
    TestMsg m(ctx(), {1}, 5);
    auto got = round_trip(m.msg.get());
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), {1}, 5));
}

// Closing an endpoint with sends and receives in flight completes all of
// them with GSER_ERR_CANCELED at once; the peer's pending receive fails
// with a connection error.
TEST_F(Transport, CloseWithTrafficInFlight)
{
    const size_t big = (size_t)32 << 20;
    std::vector<unsigned char> data(big, 1);
    unsigned char hdr[4] = {1};
    gser_frame_t f[2] = {};
    f[0].data = hdr, f[0].size = sizeof hdr;
    f[1].data = data.data(), f[1].size = big;
    std::vector<gser_ucx_request_t *> reqs;
    for (int i = 0; i < 4; i++) {
        gser_ucx_request_t *r;
        UCX_OK(gser_ucx_ep_send_nb(pair_.cep.get(), f, 2, nullptr, &r));
        reqs.push_back(r);
    }
    for (int i = 0; i < 3; i++) {
        gser_ucx_request_t *r;
        UCX_OK(gser_ucx_ep_recv_nb(pair_.cep.get(), nullptr, &r));
        reqs.push_back(r);
    }
    // The server starts receiving the first message, then stops driving.
    gser_ucx_request_t *srr;
    UCX_OK(gser_ucx_ep_recv_nb(pair_.sep.get(), nullptr, &srr));
    ReqPtr sr(srr);
    for (int i = 0; i < 20; i++) {
        gser_ucx_worker_progress(pair_.client.get());
        gser_ucx_worker_progress(pair_.server.get());
    }
    auto t0 = std::chrono::steady_clock::now();
    UCX_OK(gser_ucx_ep_close(pair_.cep.get()));
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 3000);
    EXPECT_EQ(gser_ucx_ep_get_status(pair_.cep.get()), GSER_ERR_CANCELED);
    int canceled = 0;
    for (auto *r : reqs) {
        gser_status_t st = gser_ucx_request_query(r);
        EXPECT_NE(st, GSER_INPROGRESS);
        canceled += st == GSER_ERR_CANCELED;
        gser_ucx_request_free(r);
    }
    // A send that completed before the close stays completed.
    EXPECT_GE(canceled, 4);
    // New operations on the closed endpoint fail at once.
    gser_ucx_request_t *r;
    EXPECT_EQ(gser_ucx_ep_send_nb(pair_.cep.get(), f, 2, nullptr, &r), GSER_ERR_CANCELED);
    EXPECT_EQ(gser_ucx_ep_recv_nb(pair_.cep.get(), nullptr, &r), GSER_ERR_CANCELED);
    // The server's receive either got the first message whole or fails.
    gser_status_t st = drive({pair_.server.get(), pair_.client.get()}, srr);
    EXPECT_TRUE(st == GSER_OK || st == GSER_ERR_CONNECTION) << gser_status_str(st);
    ASSERT_TRUE(drive_until({pair_.server.get()}, [&] { return gser_ucx_ep_get_status(pair_.sep.get()) != GSER_OK; }));
    EXPECT_EQ(gser_ucx_ep_get_status(pair_.sep.get()), GSER_ERR_CONNECTION);
}

// Messages that fully arrived before the peer hung up are still delivered.
TEST_F(Transport, MessagesBeforeDisconnectAreDelivered)
{
    TestMsg m(ctx(), {100, 2000}, 21);
    auto frames = serialize(ctx(), m.msg.get());
    for (int i = 0; i < 3; i++)
        UCX_OK(gser_ucx_ep_send(pair_.cep.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()),
                                kWaitMs));
    // A graceful destroy flushes (the peer takes part: a thread drives it),
    // then hangs up.
    {
        std::atomic<bool> stop{false};
        std::thread t([&] {
            while (!stop)
                gser_ucx_worker_progress(pair_.server.get());
        });
        auto t0 = std::chrono::steady_clock::now();
        gser_ucx_ep_destroy(pair_.cep.release());
        auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        stop = true;
        t.join();
        EXPECT_LT(ms, 1500);
    }
    ASSERT_TRUE(drive_until({pair_.server.get(), pair_.client.get()},
                            [&] { return gser_ucx_ep_get_status(pair_.sep.get()) != GSER_OK; }));
    for (int i = 0; i < 3; i++) {
        gser_msg_t *got = nullptr;
        UCX_OK(gser_ucx_ep_recv_msg(pair_.sep.get(), ctx(), nullptr, kWaitMs, &got));
        MsgPtr gp(got);
        EXPECT_TRUE(same_msg(got, {100, 2000}, 21));
    }
    gser_msg_t *got = nullptr;
    EXPECT_EQ(gser_ucx_ep_recv_msg(pair_.sep.get(), ctx(), nullptr, kWaitMs, &got), GSER_ERR_CONNECTION);
}

// A header that is not a gser header: deserialize rejects it and the
// endpoint is closed; the process and the listener go on.
TEST_F(Transport, MalformedHeaderClosesEndpoint)
{
    unsigned char junk[40];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)(i * 37);
    gser_frame_t f{};
    f.data = junk;
    f.size = sizeof junk;
    UCX_OK(gser_ucx_ep_send(pair_.cep.get(), &f, 1, kWaitMs));
    gser_msg_t *got = nullptr;
    gser_status_t st = gser_ucx_ep_recv_msg(pair_.sep.get(), ctx(), nullptr, kWaitMs, &got);
    EXPECT_EQ(st, GSER_ERR_BAD_MAGIC) << gser_ucx_get_last_error();
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("closed"), std::string::npos) << gser_ucx_get_last_error();
    EXPECT_EQ(gser_ucx_ep_get_status(pair_.sep.get()), GSER_ERR_BAD_MAGIC);
    ASSERT_TRUE(drive_until({pair_.client.get(), pair_.server.get()},
                            [&] { return gser_ucx_ep_get_status(pair_.cep.get()) != GSER_OK; }));
    EXPECT_EQ(gser_ucx_ep_get_status(pair_.cep.get()), GSER_ERR_CONNECTION);
    // A new connection works.
    EpPtr c2, s2;
    ASSERT_NO_FATAL_FAILURE(pair_.connect(&c2, &s2));
    TestMsg m(ctx(), {64}, 4);
    UCX_OK(gser_ucx_ep_send_msg(c2.get(), ctx(), m.msg.get(), nullptr, kWaitMs));
    UCX_OK(gser_ucx_ep_recv_msg(s2.get(), ctx(), nullptr, kWaitMs, &got));
    MsgPtr gp(got);
    EXPECT_TRUE(same_msg(got, {64}, 4));
}

TEST(TransportSetup, ConnectToNobodyFailsInBoundedTime)
{
    auto uctx = make_ucx_ctx();
    auto w = make_worker(uctx.get());
    // Find a port nobody listens on: listen, note it, stop listening.
    gser_ucx_listener_t *l;
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    UCX_OK(gser_ucx_listener_create(w.get(), &lo, &l));
    uint16_t port = gser_ucx_listener_get_port(l);
    gser_ucx_listener_destroy(l);
    gser_ucx_ep_t *ep = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    gser_status_t st = gser_ucx_ep_connect(w.get(), "127.0.0.1", port, 10000, &ep);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(st, GSER_ERR_CONNECTION) << gser_status_str(st) << ": " << gser_ucx_get_last_error();
    EXPECT_EQ(ep, nullptr);
    EXPECT_LT(ms, 10000);
    EXPECT_EQ(gser_ucx_ep_connect(w.get(), "no-such-host.invalid", 1, 1000, &ep), GSER_ERR_INVALID_ARG);
}

TEST(TransportSetup, VersionMismatchIsAnErrorOnBothSides)
{
    auto uctx = make_ucx_ctx();
    auto server = make_worker(uctx.get());
    auto client = make_worker(uctx.get());
    UCX_OK(gser_ucx_worker_set_announce_version(client.get(), 99));
    auto lp = listen_local(server.get());
    ASSERT_TRUE(lp);
    gser_ucx_listener_t *l = lp.get();
    uint16_t port = gser_ucx_listener_get_port(l);

    Handshake h = handshake(server.get(), client.get(), l);
    EXPECT_EQ(h.client_st, GSER_ERR_WIRE_VERSION);
    EXPECT_EQ(h.server_st, GSER_ERR_WIRE_VERSION);
    EXPECT_EQ(h.server, nullptr);
    h.client.reset();

    // The blocking connect says so too, with both versions in the message.
    gser_ucx_ep_t *ep2 = nullptr;
    std::atomic<bool> stop{false};
    std::thread t([&] {
        gser_ucx_ep_t *s = nullptr;
        EXPECT_EQ(gser_ucx_listener_accept(l, kWaitMs, &s), GSER_ERR_WIRE_VERSION);
        while (!stop) // the server's hello still has to reach the client
            gser_ucx_worker_progress(server.get());
    });
    EXPECT_EQ(gser_ucx_ep_connect(client.get(), "127.0.0.1", port, kWaitMs, &ep2), GSER_ERR_WIRE_VERSION);
    stop = true;
    t.join();
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("99"), std::string::npos) << gser_ucx_get_last_error();

    // The listener keeps serving peers that speak its version.
    auto good = make_worker(uctx.get());
    Handshake g = handshake(server.get(), good.get(), l);
    UCX_OK(g.server_st);
    UCX_OK(g.client_st);
}

// Send a message of frames of these sizes from c to s over p: the status of
// its receive, and (in *send_st) of its send.
static gser_status_t send_one(Pair &p, gser_ucx_ep_t *c, gser_ucx_ep_t *s, gser_context_t *gctx,
                              const std::vector<size_t> &sizes, gser_status_t *send_st)
{
    TestMsg m(gctx, sizes, 1);
    auto frames = serialize(gctx, m.msg.get());
    gser_ucx_request_t *sr = nullptr, *rr = nullptr;
    EXPECT_EQ(gser_ucx_ep_send_nb(c, gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), nullptr, &sr),
              GSER_OK);
    ReqPtr sp(sr);
    EXPECT_EQ(gser_ucx_ep_recv_nb(s, nullptr, &rr), GSER_OK);
    ReqPtr rp(rr);
    if (!sr || !rr)
        return GSER_ERR_STATE;
    gser_status_t st = drive({p.server.get(), p.client.get()}, rr);
    *send_st = drive({p.server.get(), p.client.get()}, sr);
    return st;
}

// An incoming message over the receiver's limits is rejected before
// anything is allocated for it, and its endpoint closed.
TEST(TransportSetup, MessageOverLimitsIsRejected)
{
    auto gctx = make_ctx();
    gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_limits_t lims = GSER_LIMITS_INIT;
    lims.max_frames = 2;
    lims.max_bytes = 1 << 20;
    so.limits = &lims;
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
    for (int which = 0; which < 2; which++) {
        EpPtr c, s;
        if (which == 0) {
            c = std::move(p.cep);
            s = std::move(p.sep);
        } else {
            ASSERT_NO_FATAL_FAILURE(p.connect(&c, &s));
        }
        // Too many frames, then too many bytes.
        std::vector<size_t> sizes = which == 0 ? std::vector<size_t>{1000, 1000, 1000}
                                               : std::vector<size_t>{(size_t)2 << 20};
        gser_status_t sst;
        gser_status_t st = send_one(p, c.get(), s.get(), gctx.get(), sizes, &sst);
        EXPECT_EQ(st, which == 0 ? GSER_ERR_LIMIT_FRAMES : GSER_ERR_LIMIT_BYTES) << gser_ucx_get_last_error();
        EXPECT_EQ(gser_ucx_ep_get_status(s.get()), st);
        // The sender learns that the connection is gone.
        EXPECT_TRUE(sst == GSER_OK || sst == GSER_ERR_CONNECTION) << gser_status_str(sst);
        ASSERT_TRUE(drive_until({p.server.get(), p.client.get()},
                                [&] { return gser_ucx_ep_get_status(c.get()) != GSER_OK; }));
    }
    // Within the limits, it works.
    EpPtr c, s;
    ASSERT_NO_FATAL_FAILURE(p.connect(&c, &s));
    TestMsg m(gctx.get(), {1000, 1000}, 2);
    UCX_OK(gser_ucx_ep_send_msg(c.get(), gctx.get(), m.msg.get(), nullptr, kWaitMs));
    gser_msg_t *got;
    UCX_OK(gser_ucx_ep_recv_msg(s.get(), gctx.get(), nullptr, kWaitMs, &got));
    MsgPtr gp(got);
    EXPECT_TRUE(same_msg(got, {1000, 1000}, 2));
    close_driving(c, p.server.get());
    s.reset();
    p.close();
}

// A worker whose limits are unset takes its gser context's: the message that
// context would refuse is refused at the transport, before allocation.
TEST(TransportSetup, UnsetLimitsFollowTheGserContext)
{
    gser_context_options_t co = GSER_CONTEXT_OPTIONS_INIT;
    gser_limits_t clim = GSER_LIMITS_INIT;
    clim.max_frames = 2;
    co.limits = &clim;
    co.device_backend = "none";
    auto lctx = make_ctx(&co);
    gser_limits_t lim = GSER_LIMITS_INIT;
    ASSERT_EQ(gser_context_get_limits(lctx.get(), &lim), GSER_OK);
    EXPECT_EQ(lim.max_frames, 2u);
    EXPECT_EQ(lim.max_depth, (size_t)GSER_DEPTH_MAX) << "defaults are filled in";
    EXPECT_GT(lim.max_bytes, 0u);
    EXPECT_EQ(gser_context_get_limits(nullptr, &lim), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_context_get_limits(lctx.get(), nullptr), GSER_ERR_INVALID_ARG);

    auto gctx = make_ctx();
    gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
    so.gser_ctx = lctx.get();
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
    for (size_t nframes : {2, 3}) {
        EpPtr c, s;
        ASSERT_NO_FATAL_FAILURE(p.connect(&c, &s));
        gser_status_t sst;
        gser_status_t st = send_one(p, c.get(), s.get(), gctx.get(), std::vector<size_t>(nframes, 1000), &sst);
        EXPECT_EQ(st, nframes == 2 ? GSER_OK : GSER_ERR_LIMIT_FRAMES) << nframes << ": " << gser_ucx_get_last_error();
        EXPECT_TRUE(sst == GSER_OK || sst == GSER_ERR_CONNECTION) << gser_status_str(sst);
    }
    p.close();
}

// The receive cache: buffers of released frames are reused, and its limit
// grows to the host bytes of the largest message, up to its maximum.
TEST(TransportSetup, ReceiveCacheReusesBuffersAndGrowsToTheLargestMessage)
{
    const size_t MiB = (size_t)1 << 20;
    auto gctx = make_ctx();
    auto stats = [](gser_ucx_worker_t *w) {
        gser_ucx_cache_stats_t s = GSER_UCX_CACHE_STATS_INIT;
        EXPECT_EQ(gser_ucx_worker_get_cache_stats(w, &s), GSER_OK);
        return s;
    };
    // Send sizes from the client, receive and release them on the server.
    auto pass = [&](Pair &p, const std::vector<size_t> &sizes, unsigned seed) {
        TestMsg m(gctx.get(), sizes, seed);
        auto frames = serialize(gctx.get(), m.msg.get());
        gser_ucx_request_t *sr = nullptr, *rr = nullptr;
        UCX_OK(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()),
                                   nullptr, &sr));
        UCX_OK(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr));
        ReqPtr sp(sr), rp(rr);
        UCX_OK(drive({p.client.get(), p.server.get()}, sr));
        UCX_OK(drive({p.client.get(), p.server.get()}, rr));
        gser_msg_t *got = nullptr;
        UCX_OK(gser_ucx_request_deserialize(rr, gctx.get(), nullptr, &got));
        MsgPtr gp(got);
        EXPECT_TRUE(same_msg(got, sizes, seed));
    };
    const std::vector<size_t> four = {MiB, MiB, MiB, MiB};
    {
        gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
        so.recv_cache_bytes = MiB;
        so.recv_cache_max_bytes = 16 * MiB;
        Pair p;
        ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
        auto s = stats(p.server.get());
        EXPECT_EQ(s.limit_bytes, MiB);
        EXPECT_EQ(s.cached_bytes, 0u);
        pass(p, four, 1);
        s = stats(p.server.get());
        EXPECT_EQ(s.limit_bytes, 4 * MiB) << "grown to the message";
        EXPECT_EQ(s.cached_bytes, 4 * MiB) << "all four kept";
        EXPECT_EQ(s.misses, 4u);
        EXPECT_EQ(s.hits, 0u);
        pass(p, four, 2);
        s = stats(p.server.get());
        EXPECT_EQ(s.hits, 4u) << "the second message reuses every buffer";
        EXPECT_EQ(s.misses, 4u);
        // A larger frame takes the room of the smaller buffers when it is
        // released, so the next one of its size reuses it.
        pass(p, {4 * MiB}, 8);
        pass(p, {4 * MiB}, 9);
        s = stats(p.server.get());
        EXPECT_EQ(s.misses, 5u);
        EXPECT_EQ(s.hits, 5u) << "the second 4 MiB frame reuses the first one's buffer";
        EXPECT_EQ(s.cached_bytes, 4 * MiB);
        pass(p, {20 * MiB}, 3);
        EXPECT_EQ(stats(p.server.get()).limit_bytes, 16 * MiB) << "no further than the maximum";
        p.close();
    }
    {
        // A fixed limit: one of the four buffers is kept.
        gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
        so.recv_cache_bytes = MiB;
        so.recv_cache_max_bytes = MiB;
        Pair p;
        ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
        pass(p, four, 4);
        pass(p, four, 5);
        auto s = stats(p.server.get());
        EXPECT_EQ(s.limit_bytes, MiB);
        EXPECT_EQ(s.hits, 1u);
        EXPECT_EQ(s.misses, 7u);
        EXPECT_LE(s.cached_bytes, MiB);
        p.close();
    }
    {
        // 1: no cache at all.
        gser_ucx_worker_options_t so = GSER_UCX_WORKER_OPTIONS_INIT;
        so.recv_cache_bytes = 1;
        Pair p;
        ASSERT_NO_FATAL_FAILURE(p.open(&so, nullptr));
        pass(p, four, 6);
        pass(p, four, 7);
        auto s = stats(p.server.get());
        EXPECT_EQ(s.hits, 0u);
        EXPECT_EQ(s.cached_bytes, 0u);
        p.close();
    }
    gser_ucx_cache_stats_t s = GSER_UCX_CACHE_STATS_INIT;
    EXPECT_EQ(gser_ucx_worker_get_cache_stats(nullptr, &s), GSER_ERR_INVALID_ARG);
}

// An accept callback instead of the queue.
TEST(TransportSetup, AcceptCallback)
{
    auto uctx = make_ucx_ctx();
    auto server = make_worker(uctx.get());
    auto client = make_worker(uctx.get());
    std::vector<gser_ucx_ep_t *> accepted;
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    lo.accept_cb = [](gser_ucx_listener_t *, gser_ucx_ep_t *ep, gser_status_t st, void *ud) {
        EXPECT_EQ(st, GSER_OK);
        static_cast<std::vector<gser_ucx_ep_t *> *>(ud)->push_back(ep);
    };
    lo.user_data = &accepted;
    gser_ucx_listener_t *l;
    UCX_OK(gser_ucx_listener_create(server.get(), &lo, &l));
    ListenerPtr lp(l);
    std::vector<EpPtr> clients;
    for (int i = 0; i < 3; i++) {
        gser_ucx_ep_t *c;
        UCX_OK(gser_ucx_ep_connect_nb(client.get(), "127.0.0.1", gser_ucx_listener_get_port(l), &c));
        clients.emplace_back(c);
    }
    ASSERT_TRUE(drive_until({server.get(), client.get()}, [&] { return accepted.size() == 3; }));
    for (auto *ep : accepted)
        ep_close_destroy(ep);
}

// Several threads on one GSER_UCX_THREAD_MULTI worker.
TEST(TransportSetup, MultiThreadedWorker)
{
    auto gctx = make_ctx();
    gser_ucx_worker_options_t mt = GSER_UCX_WORKER_OPTIONS_INIT;
    mt.thread_mode = GSER_UCX_THREAD_MULTI;
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open(&mt, &mt));
    const int n = 200;
    std::atomic<int> errors{0};
    std::thread sender([&] {
        for (int i = 0; i < n; i++) {
            TestMsg m(gctx.get(), {(size_t)(i * 37 % 20000)}, (unsigned)i);
            if (gser_ucx_ep_send_msg(p.cep.get(), gctx.get(), m.msg.get(), nullptr, kWaitMs) != GSER_OK)
                errors++;
        }
    });
    std::thread progress([&] {
        for (int i = 0; i < 20000 && errors == 0; i++)
            gser_ucx_worker_progress(p.client.get());
    });
    for (int i = 0; i < n; i++) {
        gser_msg_t *got = nullptr;
        gser_status_t st = gser_ucx_ep_recv_msg(p.sep.get(), gctx.get(), nullptr, kWaitMs, &got);
        ASSERT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
        MsgPtr gp(got);
        EXPECT_TRUE(same_msg(got, {(size_t)(i * 37 % 20000)}, (unsigned)i));
    }
    sender.join();
    progress.join();
    EXPECT_EQ(errors, 0);
    p.close();
}

static void count_release(void *, void *arg)
{
    ++*static_cast<int *>(arg);
}

// gser_ucx_recv_finish, the former name of gser_ucx_recv_release, still
// builds, links and releases the same way (frame memory unless handed over,
// then the array).
TEST(TransportSetup, FormerNameRecvFinishReleasesLikeRecvRelease)
{
    int released = 0;
    for (bool handed_over : {false, true}) {
        gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
        got.frames = static_cast<gser_frame_t *>(calloc(2, sizeof(gser_frame_t)));
        ASSERT_NE(got.frames, nullptr);
        got.nframes = 2;
        got.frames[1].release = count_release;
        got.frames[1].release_arg = &released;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        gser_ucx_recv_finish(&got, handed_over);
        gser_ucx_recv_finish(nullptr, handed_over);
#pragma GCC diagnostic pop
        EXPECT_EQ(got.frames, nullptr);
        EXPECT_EQ(got.nframes, 0u);
        EXPECT_EQ(released, 1); // once, when not handed over
    }
}

TEST(TransportSetup, NullArgumentsAndDestroyNull)
{
    gser_ucx_context_destroy(nullptr);
    gser_ucx_worker_destroy(nullptr);
    gser_ucx_listener_destroy(nullptr);
    gser_ucx_ep_destroy(nullptr);
    gser_ucx_request_free(nullptr);
    gser_ucx_recv_release(nullptr, false);
    EXPECT_EQ(gser_ucx_context_create(nullptr, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_ucx_worker_progress(nullptr), 0u);
    EXPECT_EQ(gser_ucx_request_query(nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_ucx_ep_get_status(nullptr), GSER_ERR_INVALID_ARG);
    auto uctx = make_ucx_ctx();
    gser_ucx_worker_options_t bad = GSER_UCX_WORKER_OPTIONS_INIT;
    bad.staging_depth = 1;
    gser_ucx_worker_t *w = nullptr;
    EXPECT_EQ(gser_ucx_worker_create(uctx.get(), &bad, &w), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(w, nullptr);
    EXPECT_STRNE(gser_ucx_get_last_error(), "");
}

} // namespace
