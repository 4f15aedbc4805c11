// The UCX settings gser's context chooses for tcp and shared memory when
// the user's environment has not: seen in what UCX made of them (its
// endpoint's protocol ranges, how far a sender gets ahead of its peer), and
// a user's own UCX_* winning over them.
#include <optional>

#include "internal.h"
#include "ucx_common.hpp"

namespace {

const char *const kSegEnv[] = {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "UCX_TX_SEG_SIZE", "UCX_RX_SEG_SIZE"};

// Sets the given variables (the others of kSegEnv unset) for one test; puts
// back what was there.
class SegEnv {
  public:
    explicit SegEnv(std::map<std::string, std::string> set)
    {
        for (const char *n : kSegEnv) {
            const char *v = std::getenv(n);
            saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
            unsetenv(n);
        }
        for (auto &kv : set)
            setenv(kv.first.c_str(), kv.second.c_str(), 1);
    }
    ~SegEnv()
    {
        for (auto &kv : saved_) {
            if (kv.second)
                setenv(kv.first.c_str(), kv.second->c_str(), 1);
            else
                unsetenv(kv.first.c_str());
        }
    }

  private:
    std::map<std::string, std::optional<std::string>> saved_;
};

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
        SegEnv e(std::move(env));
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
int sent_ahead(std::map<std::string, std::string> env, int n)
{
    const char *names[] = {"UCX_MM_FIFO_SIZE", "UCX_SYSV_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE"};
    std::map<std::string, std::optional<std::string>> saved;
    for (const char *name : names) {
        const char *v = std::getenv(name);
        saved[name] = v ? std::optional<std::string>(v) : std::nullopt;
        unsetenv(name);
    }
    for (auto &kv : env)
        setenv(kv.first.c_str(), kv.second.c_str(), 1);
    auto ctx = make_ctx();
    Pair p;
    p.open(); // the context reads the environment here
    for (auto &kv : saved) {
        if (kv.second)
            setenv(kv.first.c_str(), kv.second->c_str(), 1);
        else
            unsetenv(kv.first.c_str());
    }
    if (::testing::Test::HasFatalFailure() || !p.cep)
        return -1;
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
    // (docs/ucx.md, section 7).
    int done = sent_ahead({}, 400);
    EXPECT_GT(done, 128) << "messages sent while the receiver did not run";
}

TEST_F(ShmSettings, UsersFifoSizeWins)
{
    int done = sent_ahead({{"UCX_MM_FIFO_SIZE", "64"}}, 400);
    EXPECT_GE(done, 1);
    EXPECT_LE(done, 64);
}

} // namespace
