// The shared-memory FIFO size in the handshake (docs/ucx.md, sections 2.4
// and 7): UCX's sender indexes its peer's FIFO by its own FIFO size, so two
// processes of one host whose sizes differ would fail each other's large
// messages or wait forever. Each side's hello carries its size; an endpoint
// whose lanes go through shared memory is refused, on both sides and
// before any message of the caller's, where the sizes differ. Here the two
// sides are two contexts of one process, each made (and its UCX worker
// started) in its own environment.
#include "ucx_common.hpp"

namespace {

bool on_tcp_only()
{
    const char *tls = std::getenv("UCX_TLS");
    return tls && std::string(tls) == "tcp";
}

// One side: a context and a worker made in the environment env (the
// FIFO's variables otherwise unset), and a listener on 127.0.0.1 for a
// server. transports: the context's UCX_TLS (nullptr: the environment's).
struct Side {
    UcxCtxPtr ctx;
    WorkerPtr worker;
    ListenerPtr listener;

    Side(const std::map<std::string, std::string> &env, bool server, const char *transports = nullptr)
    {
        ScopedEnv e({GSER_TEST_FIFO_ENV}, env);
        gser_ucx_context_options_t o = GSER_UCX_CONTEXT_OPTIONS_INIT;
        o.transports = transports;
        gser_ucx_context_t *c = nullptr;
        EXPECT_EQ(gser_ucx_context_create(&o, &c), GSER_OK) << gser_ucx_get_last_error();
        ctx.reset(c);
        if (!c)
            return;
        worker = make_worker(c);
        if (server && worker)
            listener = listen_local(worker.get()); // its UCX worker starts here
    }
};

// A handshake of client with server, the client's UCX worker started in
// client_env; each side's outcome with its words, got as each side's
// caller gets them.
struct Outcome {
    EpPtr cep, sep;
    gser_status_t cst = GSER_INPROGRESS, sst = GSER_ERR_TIMEOUT;
    std::string cwhy, swhy;
};

Outcome connect_in(Side &server, Side &client, const std::map<std::string, std::string> &client_env)
{
    Outcome o;
    gser_ucx_ep_t *c = nullptr, *s = nullptr;
    {
        ScopedEnv e({GSER_TEST_FIFO_ENV}, client_env);
        EXPECT_EQ(gser_ucx_ep_connect_nb(client.worker.get(), "127.0.0.1",
                                         gser_ucx_listener_get_port(server.listener.get()), &c),
                  GSER_OK)
            << gser_ucx_get_last_error();
    }
    o.cep.reset(c);
    if (!c)
        return o;
    bool done = drive_until({server.worker.get(), client.worker.get()}, [&] {
        if (o.sst == GSER_ERR_TIMEOUT) {
            o.sst = gser_ucx_listener_accept(server.listener.get(), 0, &s);
            if (o.sst != GSER_ERR_TIMEOUT)
                o.swhy = gser_ucx_get_last_error();
        }
        if (o.cst == GSER_INPROGRESS) {
            o.cst = gser_ucx_ep_get_status(c);
            if (o.cst != GSER_INPROGRESS)
                o.cwhy = gser_ucx_get_last_error();
        }
        return o.sst != GSER_ERR_TIMEOUT && o.cst != GSER_INPROGRESS;
    });
    EXPECT_TRUE(done) << "the handshake did not end on both sides within " << kWaitMs << " ms";
    o.sep.reset(s);
    return o;
}

// A message of one frame of n bytes each way over a connected pair, checked.
void moves(Side &server, Side &client, Outcome &o, size_t n)
{
    auto gctx = make_ctx();
    Pair p; // borrows the two sides for send_recv, then gives them back
    p.server.reset(server.worker.release());
    p.client.reset(client.worker.release());
    p.cep = std::move(o.cep);
    p.sep = std::move(o.sep);
    TestMsg m(gctx.get(), {n}, 7);
    auto got = send_recv(p, gctx.get(), m.msg.get());
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), {n}, 7));
    std::swap(p.cep, p.sep); // and back, the server's end sending
    std::swap(p.client, p.server);
    TestMsg back(gctx.get(), {n}, 8);
    got = send_recv(p, gctx.get(), back.msg.get());
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), {n}, 8));
    std::swap(p.client, p.server);
    server.worker.reset(p.server.release());
    client.worker.reset(p.client.release());
    o.sep = std::move(p.cep);
    o.cep = std::move(p.sep);
}

uint32_t peer_fifo(gser_ucx_ep_t *ep)
{
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    EXPECT_EQ(gser_ucx_ep_get_peer_info(ep, &info), GSER_OK) << gser_ucx_get_last_error();
    return info.mm_fifo_size;
}

// Connect client to server (the client's UCX worker started in
// client_env), check the FIFO size each side heard from the other
// (server_fifo: the server's), and move a message of n bytes each way.
void connects_and_moves(Side &server, Side &client, const std::map<std::string, std::string> &client_env,
                        uint32_t server_fifo, uint32_t client_fifo, size_t n)
{
    Outcome o = connect_in(server, client, client_env);
    ASSERT_EQ(o.sst, GSER_OK) << o.swhy;
    ASSERT_EQ(o.cst, GSER_OK) << o.cwhy;
    EXPECT_EQ(peer_fifo(o.cep.get()), server_fifo);
    EXPECT_EQ(peer_fifo(o.sep.get()), client_fifo);
    moves(server, client, o, n);
    close_driving(o.cep, server.worker.get());
}

TEST(Fifo, DifferentSizesOverSharedMemoryAreRefusedOnBothSides)
{
    if (on_tcp_only())
        GTEST_SKIP() << "the FIFO is shared memory's";
    Side server({}, true); // gser's 1024
    Side client({{"UCX_MM_FIFO_SIZE", "64"}}, false);
    ASSERT_TRUE(server.listener && client.worker);
    auto t0 = std::chrono::steady_clock::now();
    Outcome o = connect_in(server, client, {{"UCX_MM_FIFO_SIZE", "64"}});
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(o.sst, GSER_ERR_WIRE_VERSION) << o.swhy;
    EXPECT_EQ(o.cst, GSER_ERR_WIRE_VERSION) << o.cwhy;
    EXPECT_EQ(o.sep, nullptr);
    EXPECT_NE(o.swhy.find("shared-memory FIFO holds 64 segments, this side's 1024"), std::string::npos) << o.swhy;
    EXPECT_NE(o.cwhy.find("shared-memory FIFO holds 1024 segments, this side's 64"), std::string::npos) << o.cwhy;
    for (const std::string &why : {o.swhy, o.cwhy})
        EXPECT_NE(why.find("set UCX_MM_FIFO_SIZE alike in every process of a host"), std::string::npos) << why;
    EXPECT_LT(ms, 5000) << "refused at once, not after a timeout";
    // Sending on the refused endpoint is refused too, never put into a FIFO.
    auto gctx = make_ctx();
    TestMsg m(gctx.get(), {1 << 20});
    auto frames = serialize(gctx.get(), m.msg.get());
    gser_ucx_request_t *r = nullptr;
    EXPECT_NE(gser_ucx_ep_send_nb(o.cep.get(), gser_frames_get_array(frames.get()),
                                  gser_frames_get_count(frames.get()), nullptr, &r),
              GSER_OK);
    ReqPtr rp(r);
    if (r) {
        EXPECT_NE(drive({server.worker.get(), client.worker.get()}, r), GSER_OK);
    }

    // The listener goes on, and a client of its size moves a message
    // larger than the FIFO (8 MiB) both ways.
    Side good({}, false);
    connects_and_moves(server, good, {}, 1024, 1024, 16u << 20);
}

TEST(Fifo, TheSmallerSideConnectingIsRefusedToo)
{
    if (on_tcp_only())
        GTEST_SKIP() << "the FIFO is shared memory's";
    Side server({{"UCX_MM_FIFO_SIZE", "64"}}, true);
    Side client({}, false);
    ASSERT_TRUE(server.listener && client.worker);
    Outcome o = connect_in(server, client, {});
    EXPECT_EQ(o.sst, GSER_ERR_WIRE_VERSION) << o.swhy;
    EXPECT_EQ(o.cst, GSER_ERR_WIRE_VERSION) << o.cwhy;
    EXPECT_NE(o.swhy.find("holds 1024 segments, this side's 64"), std::string::npos) << o.swhy;
    EXPECT_NE(o.cwhy.find("holds 64 segments, this side's 1024"), std::string::npos) << o.cwhy;
}

TEST(Fifo, EqualSizesByTheEnvironmentMoveMessagesLargerThanTheFifo)
{
    // 64 segments of 8 KiB: 512 KiB; 4 MiB goes through the FIFO 8 times.
    const std::map<std::string, std::string> env = {{"UCX_MM_FIFO_SIZE", "64"}};
    Side server(env, true);
    Side client(env, false);
    ASSERT_TRUE(server.listener && client.worker);
    connects_and_moves(server, client, env, 64, 64, 4u << 20);
}

TEST(Fifo, DifferentSizesBetweenHostsConnectAndWork)
{
    // tcp lanes only (as between hosts): the FIFO is never used, and sizes
    // that differ are no reason to refuse.
    Side server({{"UCX_MM_FIFO_SIZE", "256"}}, true, "tcp");
    Side client({}, false, "tcp");
    ASSERT_TRUE(server.listener && client.worker);
    // The client's 64 is UCX's own: gser sets none where shared memory is not used.
    connects_and_moves(server, client, {}, 256, 64, 4u << 20);
}

TEST(Fifo, APeerOfWireVersion4IsRefusedAsAnotherVersion)
{
    // A gser of transport wire version 4 sends no FIFO size (its bytes 28..31
    // are reserved, zero): refused like any other version, on both sides.
    Side server({}, true);
    Side client({}, false);
    ASSERT_TRUE(server.listener && client.worker);
    UCX_OK(gser_ucx_worker_set_announce_version(client.worker.get(), 4));
    Outcome o = connect_in(server, client, {});
    EXPECT_EQ(o.sst, GSER_ERR_WIRE_VERSION) << o.swhy;
    EXPECT_EQ(o.cst, GSER_ERR_WIRE_VERSION) << o.cwhy;
    EXPECT_NE(o.swhy.find("transport wire version 4"), std::string::npos) << o.swhy;
    EXPECT_NE(o.swhy.find("this side 5"), std::string::npos) << o.swhy;
    EXPECT_NE(o.cwhy.find("transport wire version 5"), std::string::npos) << o.cwhy;
    EXPECT_NE(o.cwhy.find("this side 4"), std::string::npos) << o.cwhy;
}

} // namespace
