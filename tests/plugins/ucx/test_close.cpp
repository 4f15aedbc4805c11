// What a peer sent before it closed: every message whose send completed
// before the peer closed or destroyed its endpoint is delivered, in order,
// and only then is the close reported (GSER_ERR_CONNECTION). The sender
// closes at once after its last send, in this process or in a child that
// exits right after; each case runs in a loop, since the close racing the
// data was a race.
#include <fcntl.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "internal.h"
#include "ucx_common.hpp"

namespace {

// Message i of a stream: small ones that travel inline in one UCX send,
// and multi-frame ones with large frames (tagged sends, rendezvous).
std::vector<size_t> sizes_of(int i)
{
    switch (i % 4) {
    case 0:
        return {100};
    case 1:
        return {10, 2000, 0};
    case 2:
        return {100, 200000, (size_t)3 << 20};
    default:
        return {64, (size_t)1 << 20, 5};
    }
}

enum class Close { destroy, close, close_destroy };

Close close_of(const std::string &s)
{
    return s == "destroy" ? Close::destroy : s == "close" ? Close::close : Close::close_destroy;
}

const char *name_of(Close c)
{
    return c == Close::destroy ? "destroy" : c == Close::close ? "close" : "close_destroy";
}

// Hang up the way the test asks: destroy (which flushes), close, or close
// then destroy at once.
void hang_up(gser_ucx_ep_t *ep, Close how)
{
    if (how != Close::destroy)
        gser_ucx_ep_close(ep);
    if (how != Close::close)
        gser_ucx_ep_destroy(ep);
}

// A child's start: connect to port and send n messages, each waited for.
// Returns 0, or the child's exit code for the step that failed.
int connect_and_send(ChildEnv *e, uint16_t port, int n, gser_ucx_ep_t **ep)
{
    if (int rc = child_setup_connect(e, port, ep))
        return rc;
    for (int i = 0; i < n; i++) {
        TestMsg m(e->gctx.get(), sizes_of(i), (unsigned)i);
        if (gser_ucx_ep_send_msg(*ep, e->gctx.get(), m.msg.get(), nullptr, kWaitMs))
            return 12;
    }
    return 0;
}

// send-close <port> <n> <how>: connect, send n messages (each send waited
// for), hang up at once and exit.
int child_send_close(uint16_t port, int n, Close how)
{
    ChildEnv e;
    gser_ucx_ep_t *ep;
    if (int rc = connect_and_send(&e, port, n, &ep))
        return rc;
    hang_up(ep, how);
    if (how == Close::close)
        gser_ucx_ep_destroy(ep); // the endpoint, closed, is still the caller's
    say("sent");
    return 0;
}

// The message a send-torn child leaves in flight when it hangs up.
const std::vector<size_t> kTornSizes = {64, (size_t)8 << 20};
const unsigned kTornSeed = 99;

// send-torn <port> <n> <how>: send n messages (each waited for), start one
// more with a large frame and hang up at once: that one is torn.
int child_send_torn(uint16_t port, int n, Close how)
{
    ChildEnv e;
    gser_ucx_ep_t *ep;
    if (int rc = connect_and_send(&e, port, n, &ep))
        return rc;
    TestMsg m(e.gctx.get(), kTornSizes, kTornSeed);
    auto frames = serialize(e.gctx.get(), m.msg.get());
    gser_ucx_request_t *r;
    if (gser_ucx_ep_send_nb(ep, gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), nullptr,
                            &r))
        return 13;
    hang_up(ep, how);
    if (how == Close::close)
        gser_ucx_ep_destroy(ep);
    gser_status_t st = gser_ucx_request_query(r);
    gser_ucx_request_free(r);
    say(st == GSER_ERR_CANCELED ? "torn" : std::string("send ended ") + gser_status_str(st));
    return 0;
}

// send-kill <port> <n> <wait>: send n messages (each waited for, or, with
// wait 0, only posted), then die.
int child_send_kill(uint16_t port, int n, bool wait)
{
    ChildEnv e;
    gser_ucx_ep_t *ep;
    if (int rc = child_setup_connect(&e, port, &ep))
        return rc;
    std::vector<std::unique_ptr<TestMsg>> msgs;
    std::vector<FramesPtr> frames;
    for (int i = 0; i < n; i++) {
        msgs.push_back(std::make_unique<TestMsg>(e.gctx.get(), sizes_of(i), (unsigned)i));
        if (wait) {
            if (gser_ucx_ep_send_msg(ep, e.gctx.get(), msgs.back()->msg.get(), nullptr, kWaitMs))
                return 12;
            continue;
        }
        frames.push_back(serialize(e.gctx.get(), msgs.back()->msg.get()));
        gser_ucx_op_params_t p = GSER_UCX_OP_PARAMS_INIT;
        p.cb = [](gser_ucx_request_t *, gser_status_t, void *) {};
        if (gser_ucx_ep_send_nb(ep, gser_frames_get_array(frames.back().get()),
                                gser_frames_get_count(frames.back().get()), &p, nullptr))
            return 13;
        gser_ucx_worker_progress(e.worker.get());
    }
    say("sent");
    raise(SIGKILL);
    return 14;
}

ChildRole send_torn_role("send-torn", [](const std::vector<std::string> &a) {
    return a.size() == 3 ? child_send_torn((uint16_t)std::atoi(a[0].c_str()), std::atoi(a[1].c_str()), close_of(a[2]))
                         : 2;
});
ChildRole send_kill_role("send-kill", [](const std::vector<std::string> &a) {
    return a.size() == 3 ? child_send_kill((uint16_t)std::atoi(a[0].c_str()), std::atoi(a[1].c_str()),
                                           std::atoi(a[2].c_str()) != 0)
                         : 2;
});

ChildRole send_close_role("send-close", [](const std::vector<std::string> &a) {
    return a.size() == 3 ? child_send_close((uint16_t)std::atoi(a[0].c_str()), std::atoi(a[1].c_str()), close_of(a[2]))
                         : 2;
});

class CloseAfterSend : public ::testing::TestWithParam<Close> {
  protected:
    void SetUp() override { gctx_ = make_ctx(); }
    CtxPtr gctx_;
};

class CloseAfterSendNoParam : public ::testing::Test {
  protected:
    void SetUp() override { gctx_ = make_ctx(); }
    CtxPtr gctx_;
};

// Receive on ep until it fails: the messages in order, then
// GSER_ERR_CONNECTION. Returns how many arrived. With torn, the sender
// hung up with one more message in flight: it may come too, but only whole
// (all its bytes can reach this side before the close does, and no sender
// can know that they did), and the count returned leaves it out.
int receive_all(gser_ucx_ep_t *ep, gser_context_t *gctx, int n, bool torn = false)
{
    int got = 0;
    bool torn_came = false;
    for (;; got++) {
        gser_msg_t *m = nullptr;
        gser_status_t st = gser_ucx_ep_recv_msg(ep, gctx, nullptr, kWaitMs, &m);
        if (st != GSER_OK) {
            EXPECT_EQ(st, GSER_ERR_CONNECTION) << "after " << got << " messages: " << gser_ucx_get_last_error();
            EXPECT_EQ(got, n + (torn_came ? 1 : 0))
                << "the close was reported before the messages: " << gser_ucx_get_last_error();
            return torn_came ? got - 1 : got;
        }
        MsgPtr mp(m);
        if (torn && got == n) {
            EXPECT_TRUE(same_msg(m, kTornSizes, kTornSeed)) << "the message in flight at the close, after " << n;
            torn_came = true;
            std::printf("note: the message in flight at the close came whole\n");
            continue;
        }
        EXPECT_LT(got, n);
        EXPECT_TRUE(same_msg(m, sizes_of(got), (unsigned)got)) << "message " << got;
    }
}

// A child sends, hangs up and exits; this side receives everything, then
// the close.
TEST_P(CloseAfterSend, FromAnotherProcess)
{
    UcxCtxPtr ctx = make_ucx_ctx();
    WorkerPtr w = make_worker(ctx.get());
    ListenerPtr l = listen_local(w.get());
    ASSERT_TRUE(l);
    const int n = 9;
    for (int round = 0; round < 6; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        Child child({"send-close", std::to_string(gser_ucx_listener_get_port(l.get())), std::to_string(n),
                     name_of(GetParam())});
        gser_ucx_ep_t *ep;
        UCX_OK(gser_ucx_listener_accept(l.get(), kWaitMs, &ep));
        EpPtr epp(ep);
        EXPECT_EQ(receive_all(ep, gctx_.get(), n), n);
        EXPECT_EQ(child.read_line(), "sent");
        EXPECT_EQ(child.wait(), 0);
        if (HasFailure())
            break;
    }
}

// The sender hangs up with a large message halfway out: the messages before
// it arrive, that one never in part (whole, rarely, when all its bytes beat
// the close), and its receive fails at once, not after the wait for what a
// closed peer sent (the peer timeout, 30 s here).
TEST_P(CloseAfterSend, TornMessageIsNeverDeliveredInPart)
{
    const unsigned timeout_ms = 30000;
    UcxCtxPtr ctx = make_ucx_ctx(timeout_ms);
    WorkerPtr w = make_worker(ctx.get());
    ListenerPtr l = listen_local(w.get());
    ASSERT_TRUE(l);
    const int n = 5;
    for (int round = 0; round < 4; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        Child child({"send-torn", std::to_string(gser_ucx_listener_get_port(l.get())), std::to_string(n),
                     name_of(GetParam())});
        gser_ucx_ep_t *ep;
        UCX_OK(gser_ucx_listener_accept(l.get(), kWaitMs, &ep));
        EpPtr epp(ep);
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(receive_all(ep, gctx_.get(), n, true), n);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(ms, timeout_ms);
        EXPECT_EQ(child.read_line(), "torn");
        EXPECT_EQ(child.wait(), 0);
        if (HasFailure())
            break;
    }
}

// A peer that dies sends no count: what had arrived whole is delivered, in
// order, and the death is reported at once (this side's peer timeout, 30 s,
// plays no part), whether the peer's sends had completed or were only
// posted (torn messages never hang a receive).
TEST(PeerKilled, AfterSendingIsReportedAtOnce)
{
    const unsigned timeout_ms = 30000;
    auto gctx = make_ctx();
    UcxCtxPtr ctx = make_ucx_ctx(timeout_ms);
    WorkerPtr w = make_worker(ctx.get());
    ListenerPtr l = listen_local(w.get());
    ASSERT_TRUE(l);
    const int n = 9;
    for (int round = 0; round < 6; round++) {
        bool wait = round % 2 == 0;
        SCOPED_TRACE("round " + std::to_string(round) + (wait ? ", sends waited for" : ", sends only posted"));
        Child child({"send-kill", std::to_string(gser_ucx_listener_get_port(l.get())), std::to_string(n),
                     wait ? "1" : "0"});
        gser_ucx_ep_t *ep;
        UCX_OK(gser_ucx_listener_accept(l.get(), kWaitMs, &ep));
        EpPtr epp(ep);
        if (!wait) { // receives start after the death
            ASSERT_EQ(child.read_line(), "sent");
        }
        int got = 0;
        gser_status_t st;
        for (;; got++) {
            gser_msg_t *m = nullptr;
            st = gser_ucx_ep_recv_msg(ep, gctx.get(), nullptr, kWaitMs, &m);
            if (st != GSER_OK)
                break;
            MsgPtr mp(m);
            EXPECT_TRUE(same_msg(m, sizes_of(got), (unsigned)got)) << "message " << got;
        }
        EXPECT_EQ(st, GSER_ERR_CONNECTION) << "after " << got << " messages: " << gser_ucx_get_last_error();
        EXPECT_LE(got, n);
        if (wait) {
            EXPECT_EQ(child.read_line(), "sent");
        }
        EXPECT_EQ(child.wait(), 128 + SIGKILL);
        if (HasFailure())
            break;
    }
}

// Both ends in this process; the receiver is driven by a thread of its own
// while the sender sends and hangs up.
TEST_P(CloseAfterSend, InProcess)
{
    UcxCtxPtr ctx = make_ucx_ctx();
    const int n = 9;
    for (int round = 0; round < 10; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        gser_ucx_worker_options_t wo = GSER_UCX_WORKER_OPTIONS_INIT;
        wo.thread_mode = GSER_UCX_THREAD_SERIALIZED; // created here, driven by the receiving thread
        WorkerPtr sw = make_worker(ctx.get(), &wo), cw = make_worker(ctx.get());
        ListenerPtr l = listen_local(sw.get());
        ASSERT_TRUE(l);
        Handshake h = handshake(sw.get(), cw.get(), l.get());
        ASSERT_EQ(h.server_st, GSER_OK);
        UCX_OK(h.client_st);
        gser_ucx_ep_t *sep = h.server.get();
        int got = -1;
        std::thread receiver([&] { got = receive_all(sep, gctx_.get(), n); });
        for (int i = 0; i < n; i++) {
            TestMsg m(gctx_.get(), sizes_of(i), (unsigned)i);
            UCX_OK(gser_ucx_ep_send_msg(h.client.get(), gctx_.get(), m.msg.get(), nullptr, kWaitMs));
        }
        gser_ucx_ep_t *cep = h.client.release();
        hang_up(cep, GetParam());
        if (GetParam() == Close::close)
            gser_ucx_ep_destroy(cep);
        receiver.join();
        EXPECT_EQ(got, n);
        if (HasFailure())
            break;
    }
}

// Small messages the receiver has not asked for yet: their sends complete
// at once, the sender hangs up, and the receiver, driven only afterwards,
// still gets them all before the close.
TEST_P(CloseAfterSend, ReceiverLooksOnlyAfterTheClose)
{
    UcxCtxPtr ctx = make_ucx_ctx();
    const int n = 20;
    for (int round = 0; round < 10; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        Pair p;
        ASSERT_NO_FATAL_FAILURE(p.open());
        for (int i = 0; i < n; i++) {
            std::vector<size_t> sizes = {(size_t)(i * 300)};
            TestMsg m(gctx_.get(), sizes, (unsigned)i);
            auto frames = serialize(gctx_.get(), m.msg.get());
            gser_ucx_request_t *r;
            UCX_OK(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.get()),
                                       gser_frames_get_count(frames.get()), nullptr, &r));
            ReqPtr rp(r);
            ASSERT_EQ(drive({p.client.get()}, r), GSER_OK) << gser_ucx_get_last_error();
        }
        // In the first round nobody drives the receiver while the sender
        // hangs up: over tcp the sender's flush then runs out (UCX's tcp
        // flush waits for the peer's acknowledgement), and the messages,
        // in the kernel's buffers, still arrive. Later rounds drive its
        // worker meanwhile, without receiving.
        std::atomic<bool> stop{false};
        std::thread driver([&] {
            while (round > 0 && !stop)
                gser_ucx_worker_progress(p.server.get());
        });
        gser_ucx_ep_t *cep = p.cep.release();
        hang_up(cep, GetParam());
        if (GetParam() == Close::close)
            gser_ucx_ep_destroy(cep);
        stop = true;
        driver.join();
        for (int i = 0; i < n; i++) {
            gser_msg_t *m = nullptr;
            gser_status_t st = gser_ucx_ep_recv_msg(p.sep.get(), gctx_.get(), nullptr, kWaitMs, &m);
            ASSERT_EQ(st, GSER_OK) << "message " << i << ": " << gser_ucx_get_last_error();
            MsgPtr mp(m);
            EXPECT_TRUE(same_msg(m, {(size_t)(i * 300)}, (unsigned)i));
        }
        gser_msg_t *m = nullptr;
        EXPECT_EQ(gser_ucx_ep_recv_msg(p.sep.get(), gctx_.get(), nullptr, kWaitMs, &m), GSER_ERR_CONNECTION);
        p.close();
        if (HasFailure())
            break;
    }
}

// ---- messages nobody read ---------------------------------------------------

// Whether UCX holds a message for w that nobody has taken (its queue of
// unexpected messages), after the worker has taken in what arrived.
bool holds_unread(gser_ucx_worker_t *w)
{
    for (int i = 0; i < 100; i++)
        gser_ucx_worker_progress(w);
    ucp_tag_recv_info_t info;
    return ucp_tag_probe_nb(w->ucp, 0, 0, 0, &info) != nullptr;
}

// Messages the receiving side never asked for, small ones (one send each)
// and ones with large frames (rendezvous): once it destroys its endpoint,
// UCX holds none of them any more. They used to stay until the worker went.
TEST_F(CloseAfterSendNoParam, UnreadMessagesGoWithTheirEndpoint)
{
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open());
    std::vector<std::unique_ptr<TestMsg>> msgs;
    std::vector<FramesPtr> frames;
    std::vector<ReqPtr> sends;
    for (int i = 0; i < 8; i++) {
        msgs.push_back(std::make_unique<TestMsg>(gctx_.get(), sizes_of(i), (unsigned)i));
        frames.push_back(serialize(gctx_.get(), msgs.back()->msg.get()));
        gser_ucx_request_t *r;
        UCX_OK(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.back().get()),
                                   gser_frames_get_count(frames.back().get()), nullptr, &r));
        sends.emplace_back(r);
    }
    ASSERT_TRUE(drive_until({p.client.get(), p.server.get()}, [&] { return holds_unread(p.server.get()); }))
        << "nothing arrived";
    p.sep.reset();
    EXPECT_TRUE(drive_until({p.client.get(), p.server.get()}, [&] { return !holds_unread(p.server.get()); }))
        << "UCX still holds what the peer sent to the destroyed endpoint";
    // The sender's requests end one way or the other (the receiver is gone).
    for (auto &r : sends)
        EXPECT_NE(drive({p.client.get(), p.server.get()}, r.get()), GSER_INPROGRESS);
    sends.clear();
}

// A worker destroyed with unread messages on an endpoint it still has:
// they are dropped quietly (UCX warned about each one).
TEST_F(CloseAfterSendNoParam, UnreadMessagesGoQuietlyWithTheWorker)
{
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open());
    for (int i = 0; i < 3; i++) {
        TestMsg m(gctx_.get(), {(size_t)(100 * i)}, (unsigned)i);
        UCX_OK(gser_ucx_ep_send_msg(p.cep.get(), gctx_.get(), m.msg.get(), nullptr, kWaitMs));
    }
    ASSERT_TRUE(drive_until({p.server.get()}, [&] { return holds_unread(p.server.get()); }));
    // The server's worker closes its endpoint and listener itself.
    (void)p.sep.release();
    (void)p.listener.release();
    close_driving(p.cep, p.server.get());
    std::string text = output_of([&] { p.server.reset(); });
    EXPECT_EQ(text.find("not matched"), std::string::npos) << text;
    EXPECT_EQ(text.find("UCX  WARN"), std::string::npos) << text;
}

INSTANTIATE_TEST_SUITE_P(Ucx, CloseAfterSend, ::testing::Values(Close::destroy, Close::close, Close::close_destroy),
                         [](const ::testing::TestParamInfo<Close> &i) { return std::string(name_of(i.param)); });

} // namespace
