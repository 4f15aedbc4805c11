// The UCX settings gser's context chooses for tcp and shared memory when
// the user's environment has not: seen in what UCX made of them (its
// endpoint's protocol ranges, how far a sender gets ahead of its peer), and
// a user's own UCX_* winning over them.
#include "internal.h"
#include "ucx_common.hpp"

namespace {

// tcp's segment variables: the given ones set, the others unset.
#define GSER_TEST_SEG_ENV "UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "UCX_TX_SEG_SIZE", "UCX_RX_SEG_SIZE"

// The largest message UCX sends as one eager short message on the client's
// endpoint of an open pair: bounded by tcp's send segment. 0 if UCX's
// print-out does not say.
size_t eager_short_max(Pair &p)
{
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return 0;
    ucp_ep_print_info(p.cep->ucp, f);
    fclose(f);
    std::string info(buf ? buf : "");
    free(buf);
    // "tag_send: 0..<egr/short>..524281..<egr/zcopy>..."
    size_t at = info.find("tag_send:");
    size_t k = at == std::string::npos ? at : info.find("<egr/short>..", at);
    if (k == std::string::npos) {
        ADD_FAILURE() << "no eager short range in UCX's endpoint info:\n" << info;
        return 0;
    }
    return std::strtoull(info.c_str() + k + std::strlen("<egr/short>.."), nullptr, 10);
}

class TcpSettings : public ::testing::Test {
  protected:
    void SetUp() override
    {
        const char *tls = std::getenv("UCX_TLS");
        if (!tls || std::string(tls) != "tcp")
            GTEST_SKIP() << "tcp's settings show on tcp's lanes only";
    }

    // Open a pair in the environment env and check that a 1 MiB message
    // crosses it; the eager short bound of its endpoint, 0 on failure.
    size_t open_with(std::map<std::string, std::string> env)
    {
        ScopedEnv e({GSER_TEST_SEG_ENV}, env);
        auto ctx = make_ctx();
        Pair p;
        p.open();
        if (::testing::Test::HasFatalFailure() || !p.cep)
            return 0;
        TestMsg m(ctx.get(), {1 << 20});
        auto got = send_recv(p, ctx.get(), m.msg.get());
        EXPECT_TRUE(got);
        return eager_short_max(p);
    }
};

TEST_F(TcpSettings, LargeSegmentsByDefault)
{
    // UCX's own 8 KiB send segment would bound it at about 8 KiB.
    size_t max = open_with({});
    EXPECT_GT(max, (size_t)256 << 10);
    EXPECT_LE(max, (size_t)512 << 10);
}

TEST_F(TcpSettings, UsersSegmentsWin)
{
    size_t max = open_with({{"UCX_TCP_TX_SEG_SIZE", "16k"}, {"UCX_TCP_RX_SEG_SIZE", "32k"}});
    EXPECT_GT(max, (size_t)8 << 10);
    EXPECT_LE(max, (size_t)16 << 10);
}

TEST_F(TcpSettings, UsersReceiveSegmentAloneKeepsUcxsSendSegment)
{
    // A 512 KiB send segment with the user's 64 KiB receive one: UCX would
    // refuse to make the worker.
    size_t max = open_with({{"UCX_TCP_RX_SEG_SIZE", "64k"}});
    EXPECT_GT(max, (size_t)0);
    EXPECT_LE(max, (size_t)8 << 10);
}

TEST_F(TcpSettings, UsersSendSegmentAloneKeepsUcxsReceiveSegment)
{
    size_t max = open_with({{"UCX_TCP_TX_SEG_SIZE", "16k"}});
    EXPECT_GT(max, (size_t)8 << 10);
    EXPECT_LE(max, (size_t)16 << 10);
}

// How many of n messages of one 4 KiB frame the client end of a pair opened
// in the environment env sends while only the client's worker runs: over
// shared memory each goes into the receiver's FIFO, and what does not fit
// waits there for the receiver. Then the server takes all n, each checked.
// *fifo: the FIFO size the client's peer announced (-1 on failure).
int sent_ahead(const std::map<std::string, std::string> &env, int n, long *fifo)
{
    auto ctx = make_ctx();
    Pair p;
    {
        ScopedEnv e({GSER_TEST_FIFO_ENV}, env);
        p.open(); // the contexts and workers read the environment here
    }
    *fifo = -1;
    if (::testing::Test::HasFatalFailure() || !p.cep)
        return -1;
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    EXPECT_EQ(gser_ucx_ep_get_peer_info(p.cep.get(), &info), GSER_OK) << gser_ucx_get_last_error();
    *fifo = info.mm_fifo_size;
    TestMsg m(ctx.get(), {4096});
    auto frames = serialize(ctx.get(), m.msg.get());
    std::vector<ReqPtr> sends;
    for (int i = 0; i < n; i++) {
        gser_ucx_request_t *r = nullptr;
        EXPECT_EQ(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.get()),
                                      gser_frames_get_count(frames.get()), nullptr, &r),
                  GSER_OK)
            << gser_ucx_get_last_error();
        sends.emplace_back(r);
    }
    for (int k = 0; k < 1000; k++)
        gser_ucx_worker_progress(p.client.get());
    int done = 0;
    for (auto &r : sends)
        done += gser_ucx_request_query(r.get()) == GSER_OK;
    for (int i = 0; i < n; i++) {
        gser_ucx_request_t *rr = nullptr;
        EXPECT_EQ(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr), GSER_OK) << gser_ucx_get_last_error();
        ReqPtr r(rr);
        EXPECT_EQ(drive({p.client.get(), p.server.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
        gser_msg_t *got = nullptr;
        EXPECT_EQ(gser_ucx_request_deserialize(rr, ctx.get(), nullptr, &got), GSER_OK) << gser_ucx_get_last_error();
        MsgPtr g(got);
        if (!got)
            return -1;
    }
    for (auto &r : sends)
        EXPECT_EQ(drive({p.client.get(), p.server.get()}, r.get()), GSER_OK) << gser_ucx_get_last_error();
    return done;
}

class ShmSettings : public ::testing::Test {
  protected:
    void SetUp() override
    {
        const char *tls = std::getenv("UCX_TLS");
        if (tls && std::string(tls) == "tcp")
            GTEST_SKIP() << "the FIFO is shared memory's";
    }
};

TEST_F(ShmSettings, SenderGetsAheadOfAPeerThatDoesNotRun)
{
    // UCX's own FIFO holds 64 segments: at most 64 messages would leave.
    // gser's 1024 let a sender go on while its peer waits for a CPU
    // (docs/ucx.md, section 7), and the handshake carries the size.
    long fifo = 0;
    int done = sent_ahead({}, 400, &fifo);
    EXPECT_GT(done, 128) << "messages sent while the receiver did not run";
    EXPECT_EQ(fifo, 1024);
}

TEST_F(ShmSettings, UsersFifoSizeWins)
{
    long fifo = 0;
    int done = sent_ahead({{"UCX_MM_FIFO_SIZE", "64"}}, 400, &fifo);
    EXPECT_GE(done, 1);
    EXPECT_LE(done, 64);
    EXPECT_EQ(fifo, 64);
}

TEST_F(ShmSettings, OneTransportsOwnSizeAsUcxReadsIt)
{
    // UCX_SYSV_FIFO_SIZE and UCX_POSIX_FIFO_SIZE inherit UCX_MM_FIFO_SIZE:
    // both set alike is one size, and the sender stays within it.
    long fifo = 0;
    int done = sent_ahead({{"UCX_POSIX_FIFO_SIZE", "128"}, {"UCX_SYSV_FIFO_SIZE", "128"}}, 400, &fifo);
    EXPECT_GT(done, 64);
    EXPECT_LE(done, 128);
    EXPECT_EQ(fifo, 128);
}

TEST_F(ShmSettings, PosixAndSysvOfDifferentSizesAreRefused)
{
    // The handshake carries one size: a context whose two shared-memory
    // transports would have different FIFOs says which and what to set.
    ScopedEnv e({GSER_TEST_FIFO_ENV}, {{"UCX_POSIX_FIFO_SIZE", "256"}});
    gser_ucx_context_t *c = nullptr;
    EXPECT_EQ(gser_ucx_context_create(nullptr, &c), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(c, nullptr);
    std::string why = gser_ucx_get_last_error();
    EXPECT_NE(why.find("256 segments (UCX_POSIX_FIFO_SIZE)"), std::string::npos) << why;
    EXPECT_NE(why.find("sysv's 64 (the default)"), std::string::npos) << why;
    EXPECT_NE(why.find("set UCX_MM_FIFO_SIZE"), std::string::npos) << why;
    // With one of them out of the transports, its size does not matter.
    gser_ucx_context_options_t o = GSER_UCX_CONTEXT_OPTIONS_INIT;
    o.transports = "posix,tcp";
    EXPECT_EQ(gser_ucx_context_create(&o, &c), GSER_OK) << gser_ucx_get_last_error();
    gser_ucx_context_destroy(c);
}

} // namespace
