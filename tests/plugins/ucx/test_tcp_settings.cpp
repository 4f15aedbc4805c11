// The UCX settings gser's context chooses for tcp when the user's
// environment has not: seen in what UCX made of them (its endpoint's
// protocol ranges), and a user's own UCX_* winning over them.
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

} // namespace
