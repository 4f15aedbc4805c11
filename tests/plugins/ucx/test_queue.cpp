// The worker's check of its own receive queue (plugins/ucx/probe.c): after
// a peer dies, a worker sends itself a message; when it does not arrive (a
// local peer killed mid-write blocks UCX 1.13's shared-memory queue for
// good), the worker fails, every endpoint with it, and says why. The
// blocked queue itself cannot be made on purpose: the fault hook drops the
// check's message instead.
#include <csignal>

#include "ucx_common.hpp"

namespace {

// Whether this run loads UCX's shared-memory transports (the check runs only
// then: without them no queue is shared).
bool shm_run()
{
    const char *tls = std::getenv("UCX_TLS");
    if (!tls)
        return true;
    std::string t = std::string(",") + tls + ",";
    for (const char *n : {",all,", ",sm,", ",shm,", ",posix,", ",sysv,", ",mm,"})
        if (t.find(n) != std::string::npos)
            return true;
    return false;
}

#define NEED_SHM()                                                                                                    \
    if (!shm_run())                                                                                                   \
    GTEST_SKIP() << "UCX_TLS loads no shared-memory transport: the worker has no shared queue to check "             \
                    "(QueueCheck.NoneWithoutSharedMemory covers this run)"

// Progress until the worker's check is over; its status then.
gser_status_t check_outcome(std::initializer_list<gser_ucx_worker_t *> ws, gser_ucx_worker_t *w)
{
    gser_status_t st = GSER_INPROGRESS;
    drive_until(ws, [&] { return (st = gser_ucx_worker_get_status(w)) != GSER_INPROGRESS; }, 20000);
    return st;
}

// A child connects to l, sends two messages and dies; w sees it gone.
void peer_dies(gser_ucx_worker_t *w, gser_ucx_listener_t *l)
{
    Child child({"send-kill", std::to_string(gser_ucx_listener_get_port(l)), "2", "1"});
    gser_ucx_ep_t *ep;
    UCX_OK(gser_ucx_listener_accept(l, kWaitMs, &ep));
    EpPtr epp(ep);
    EXPECT_EQ(child.wait(), 128 + SIGKILL);
    EXPECT_TRUE(drive_until({w}, [&] { return gser_ucx_ep_get_status(ep) == GSER_ERR_CONNECTION; }));
}

TEST(QueueCheck, AHealthyWorkerPassesAndServesOn)
{
    NEED_SHM();
    auto gctx = make_ctx();
    Pair p;
    p.open();
    EXPECT_EQ(gser_ucx_worker_get_status(p.server.get()), GSER_OK);
    UCX_OK(gser_ucx_worker_check_queue(p.server.get()));
    EXPECT_EQ(gser_ucx_worker_get_status(p.server.get()), GSER_INPROGRESS); // nothing progressed yet
    EXPECT_EQ(check_outcome({p.server.get(), p.client.get()}, p.server.get()), GSER_OK)
        << gser_ucx_get_last_error();
    TestMsg m(gctx.get(), {100, 300000}, 7);
    auto frames = serialize(gctx.get(), m.msg.get());
    gser_ucx_request_t *sr, *rr;
    UCX_OK(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()),
                               nullptr, &sr));
    UCX_OK(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr));
    ReqPtr s(sr), r(rr);
    EXPECT_EQ(drive({p.server.get(), p.client.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
    gser_msg_t *got = nullptr;
    UCX_OK(gser_ucx_request_deserialize(rr, gctx.get(), nullptr, &got));
    MsgPtr g(got);
    EXPECT_TRUE(same_msg(got, {100, 300000}, 7));
}

TEST(QueueCheck, ABlockedQueueFailsTheWorkerAndEveryEndpointSayingWhy)
{
    NEED_SHM();
    Pair p;
    p.open();
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr)); // waiting when the worker fails
    ReqPtr r(rr);
    UCX_OK(gser_ucx_worker_set_check_fault(p.server.get(), 1));
    UCX_OK(gser_ucx_worker_check_queue(p.server.get()));
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(check_outcome({p.server.get(), p.client.get()}, p.server.get()), GSER_ERR_CONNECTION);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(ms, 1900); // never declared before its deadline
    std::string why = gser_ucx_get_last_error();
    EXPECT_NE(why.find("shared-memory receive queue is blocked"), std::string::npos) << why;
    // The receive that was waiting, the endpoint, and the peer's end.
    EXPECT_EQ(drive({p.server.get(), p.client.get()}, rr, 5000), GSER_ERR_CONNECTION);
    EXPECT_EQ(gser_ucx_ep_get_status(p.sep.get()), GSER_ERR_CONNECTION);
    EXPECT_TRUE(drive_until({p.server.get(), p.client.get()},
                            [&] { return gser_ucx_ep_get_status(p.cep.get()) == GSER_ERR_CONNECTION; }, 10000));
    // No new connection, either way, and the status stays.
    gser_ucx_ep_t *ep = nullptr;
    EXPECT_EQ(gser_ucx_ep_connect_nb(p.server.get(), "127.0.0.1", gser_ucx_listener_get_port(p.listener.get()), &ep),
              GSER_ERR_CONNECTION);
    EXPECT_EQ(ep, nullptr);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("use a new worker"), std::string::npos);
    Handshake h = handshake(p.server.get(), p.client.get(), p.listener.get());
    EXPECT_NE(h.client_st, GSER_OK);
    EXPECT_EQ(gser_ucx_worker_get_status(p.server.get()), GSER_ERR_CONNECTION);
    // A new worker is fine.
    WorkerPtr fresh = make_worker(p.ctx.get());
    ListenerPtr l = listen_local(fresh.get());
    ASSERT_TRUE(l);
    Handshake ok = handshake(fresh.get(), p.client.get(), l.get());
    EXPECT_EQ(ok.client_st, GSER_OK) << gser_ucx_get_last_error();
    EXPECT_EQ(gser_ucx_worker_get_status(fresh.get()), GSER_OK);
}

// A peer that dies starts a check: with the check's message dropped, the
// death alone fails the worker.
TEST(QueueCheck, APeerThatDiesStartsACheck)
{
    NEED_SHM();
    UcxCtxPtr ctx = make_ucx_ctx();
    WorkerPtr w = make_worker(ctx.get());
    ListenerPtr l = listen_local(w.get());
    ASSERT_TRUE(l);
    UCX_OK(gser_ucx_worker_set_check_fault(w.get(), 1));
    peer_dies(w.get(), l.get());
    EXPECT_EQ(check_outcome({w.get()}, w.get()), GSER_ERR_CONNECTION);
}

// Without the fault, the check after a death passes and the worker serves
// the next peer; deaths during a check are checked again after it.
TEST(QueueCheck, AQueueADeadPeerDidNotBlockPassesAndServesOn)
{
    NEED_SHM();
    auto gctx = make_ctx();
    UcxCtxPtr ctx = make_ucx_ctx();
    WorkerPtr w = make_worker(ctx.get());
    ListenerPtr l = listen_local(w.get());
    ASSERT_TRUE(l);
    for (int round = 0; round < 3; round++)
        peer_dies(w.get(), l.get());
    EXPECT_EQ(check_outcome({w.get()}, w.get()), GSER_OK) << gser_ucx_get_last_error();
    Child next({"send-close", std::to_string(gser_ucx_listener_get_port(l.get())), "2", "close"});
    gser_ucx_ep_t *ep;
    UCX_OK(gser_ucx_listener_accept(l.get(), kWaitMs, &ep));
    EpPtr epp(ep);
    for (int i = 0; i < 2; i++) {
        gser_msg_t *m = nullptr;
        UCX_OK(gser_ucx_ep_recv_msg(ep, gctx.get(), nullptr, kWaitMs, &m));
        MsgPtr mp(m);
        EXPECT_TRUE(same_msg(m, i == 0 ? std::vector<size_t>{100} : std::vector<size_t>{10, 2000, 0}, (unsigned)i));
    }
    EXPECT_EQ(next.wait(), 0);
}

// Over tcp alone there is no shared queue, and a connection to the worker's
// own address would meet the admission filter: no check runs, whatever
// happens.
TEST(QueueCheck, NoneWithoutSharedMemory)
{
    if (shm_run())
        GTEST_SKIP() << "this run loads shared memory (the other QueueCheck tests cover it)";
    Pair p;
    p.open();
    UCX_OK(gser_ucx_worker_set_check_fault(p.server.get(), 1));
    UCX_OK(gser_ucx_worker_check_queue(p.server.get()));
    EXPECT_EQ(gser_ucx_worker_get_status(p.server.get()), GSER_OK);
    progress_for(p.server.get(), 2500);
    EXPECT_EQ(gser_ucx_worker_get_status(p.server.get()), GSER_OK);
    EXPECT_EQ(gser_ucx_ep_get_status(p.sep.get()), GSER_OK);
}

} // namespace
