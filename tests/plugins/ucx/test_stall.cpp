// Peers that stall (SIGSTOP) past the peer timeout while large
// (rendezvous) sends wait for them: each send ends with its endpoint's
// error, UCX gives back everything it held for them before
// gser_ucx_ep_destroy returns, and a long-lived worker that meets many such
// peers keeps nothing of them (no requests, no memory, no warning from UCX
// when it goes). A worker destroyed with such sends still pending fails
// them first. The peer is a child process that receives, stopped in the
// middle of a transfer: UCX then holds the sends after its close until its
// progress gives them back, which is what used to be left behind.
//
// The peer timeout is short (200 ms) so that a cycle takes a fraction of a
// second; what the cycle exercises does not depend on its length.
#include <fstream>

#include "internal.h"
#include "ucx_common.hpp"

namespace {

constexpr unsigned kStallTimeoutMs = 200;
constexpr size_t kBig = 32u << 20; // rendezvous on every transport
constexpr int kSends = 48;        // each 32 MiB: its 4,096 fragments of 8 KiB overfill the peer's shared-memory FIFO (1,024 segments, gser's setting)
constexpr int kCycles = 100;
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// ---- the peer: accepts, receives and drops, lets failed endpoints go ---------------------

struct Hold {
    ChildEnv e;
    ListenerPtr l;
    std::vector<gser_ucx_ep_t *> eps;
};
Hold *g_hold;

void hold_post(gser_ucx_ep_t *ep);

void hold_recv(gser_ucx_request_t *req, gser_status_t st, void *user_data)
{
    if (st != GSER_OK)
        return;
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    if (gser_ucx_request_take(req, &got) == GSER_OK)
        gser_ucx_recv_release(&got, false);
    hold_post(static_cast<gser_ucx_ep_t *>(user_data));
}

void hold_post(gser_ucx_ep_t *ep)
{
    gser_ucx_op_params_t p = GSER_UCX_OP_PARAMS_INIT;
    p.cb = hold_recv;
    p.user_data = ep;
    gser_ucx_ep_recv_nb(ep, &p, nullptr); // fails once the endpoint has: it is let go then
}

void hold_accept(gser_ucx_listener_t *, gser_ucx_ep_t *ep, gser_status_t st, void *)
{
    if (st == GSER_OK) {
        g_hold->eps.push_back(ep);
        hold_post(ep);
    }
    alarm(60); // still wanted: the parent is still connecting
}

// hold <timeout_ms>: "port <n>", then serve until killed.
int child_hold(unsigned timeout_ms)
{
    Hold h;
    g_hold = &h;
    if (!child_setup(&h.e, timeout_ms))
        return 10;
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    lo.accept_cb = hold_accept;
    gser_ucx_listener_t *l;
    if (gser_ucx_listener_create(h.e.worker.get(), &lo, &l) != GSER_OK)
        return 11;
    h.l.reset(l);
    say("port " + std::to_string(gser_ucx_listener_get_port(l)));
    for (;;) {
        gser_ucx_worker_wait(h.e.worker.get(), 50);
        for (size_t i = 0; i < h.eps.size();) {
            if (gser_ucx_ep_get_status(h.eps[i]) == GSER_OK) {
                i++;
                continue;
            }
            gser_ucx_ep_destroy(h.eps[i]);
            h.eps.erase(h.eps.begin() + (long)i);
        }
    }
}

ChildRole hold_role("hold", [](const std::vector<std::string> &a) {
    return a.size() == 1 ? child_hold((unsigned)std::atoi(a[0].c_str())) : 2;
});

// ---- what the parent looks at ------------------------------------------------------------

// Requests of w that are not freed yet, and those of them whose UCX
// operations UCX has not given back.
size_t live_requests(gser_ucx_worker_t *w)
{
    size_t n = 0;
    for (gux_list_t *l = w->all.next; l != &w->all; l = l->next)
        n++;
    return n;
}

size_t held_by_ucx(gser_ucx_worker_t *w)
{
    size_t n = 0;
    for (gux_list_t *l = w->all.next; l != &w->all; l = l->next)
        n += gux_container(l, gser_ucx_request_t, alink)->outstanding > 0;
    return n;
}

size_t self_rss_kib()
{
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0)
            return std::strtoul(line.c_str() + 6, nullptr, 10);
    return 0;
}

bool ucx_warned(const std::string &out)
{
    return out.find("UCX  WARN") != std::string::npos || out.find("UCX  ERROR") != std::string::npos ||
           out.find("not returned to mpool") != std::string::npos;
}

// Over tcp too the peer stops in the middle of a transfer: UCX 1.13's tcp
// transport crashed there (a closed endpoint met its peer's goodbye) until
// endpoint.c closed UCX's endpoints in steps (issue 38, docs/ucx.md).
bool mid_transfer_ok()
{
    return true;
}

class Stall : public ::testing::Test {
  protected:
    void SetUp() override
    {
        // The peer's own timeout is longer: it is the one that stalls.
        peer_ = std::make_unique<Child>(std::vector<std::string>{"hold", std::to_string(10 * kStallTimeoutMs)});
        port_ = port_of(peer_->read_line());
        ASSERT_NE(port_, 0) << "the peer did not start";
        ctx_ = make_ucx_ctx(kStallTimeoutMs);
        ASSERT_TRUE(ctx_);
        client_ = make_worker(ctx_.get());
        ASSERT_TRUE(client_);
        big_.resize(kBig);
        TestMsg::fill(big_.data(), kBig, 3);
    }
    void TearDown() override
    {
        if (peer_)
            kill(peer_->pid, SIGCONT);
        client_.reset();
        ctx_.reset();
        peer_.reset();
    }

    // Connect, post kSends large sends, and stop the peer (SIGSTOP); with
    // until_failed, drive this side until it fails the silent peer. The
    // endpoint and the sends are left to the caller; the peer stays stopped.
    void stall(EpPtr *ep_out, std::vector<gser_ucx_request_t *> *sends, bool until_failed = true,
               bool mid_transfer = true)
    {
        // A handshake has the peer timeout too: on a loaded machine one may
        // run out, which is not what this test is about.
        gser_ucx_ep_t *ep = nullptr;
        gser_status_t st = GSER_ERR_TIMEOUT;
        for (double end = mono_ms() + kWaitMs; st != GSER_OK && mono_ms() < end;)
            st = gser_ucx_ep_connect(client_.get(), "127.0.0.1", port_, kWaitMs, &ep);
        UCX_OK(st);
        ep_out->reset(ep);
        if (!mid_transfer) {
            ASSERT_EQ(kill(peer_->pid, SIGSTOP), 0);
        }
        for (int i = 0; i < kSends; i++) {
            gser_frame_t f[2] = {};
            f[0].data = &seq_, f[0].size = sizeof seq_;
            f[1].data = big_.data(), f[1].size = kBig;
            gser_ucx_request_t *r = nullptr;
            UCX_OK(gser_ucx_ep_send_nb(ep, f, 2, nullptr, &r));
            sends->push_back(r);
        }
        // The peer takes the first messages in, then stalls in the middle of one.
        progress_for(client_.get(), 30);
        if (mid_transfer) {
            ASSERT_EQ(kill(peer_->pid, SIGSTOP), 0);
        }
        progress_for(client_.get(), 10);
        // On a loaded machine the peer may have gone quiet for the timeout
        // before it was stopped: the cycle then has no send caught by the
        // stall (counted by the caller).
        gser_status_t last = gser_ucx_request_wait(sends->back(), 0);
        caught_ = last == GSER_ERR_TIMEOUT;
        if (!caught_)
            std::cout << "[          ] no send caught by the stall: " << gser_status_str(last) << ": "
                      << gser_ucx_get_last_error() << std::endl;
        if (!until_failed)
            return;
        ASSERT_TRUE(drive_until({client_.get()}, [&] { return gser_ucx_ep_get_status(ep) != GSER_OK; }))
            << "this side did not fail its silent peer";
        EXPECT_EQ(gser_ucx_ep_get_status(ep), GSER_ERR_CONNECTION);
    }

    std::unique_ptr<Child> peer_;
    uint16_t port_ = 0;
    UcxCtxPtr ctx_;
    WorkerPtr client_;
    std::vector<unsigned char> big_;
    uint64_t seq_ = 0;
    bool caught_ = false; // the last stall() caught sends in flight
};

// Cycles of "the peer stalls past the timeout with large sends pending":
// when gser_ucx_ep_destroy returns, every send has ended with the
// endpoint's error and UCX holds nothing of them; the worker's requests,
// the process's memory and UCX's output stay flat over the cycles.
TEST_F(Stall, SendsToAStalledPeerEndBeforeTheEndpointGoes)
{
    bool mid_transfer = mid_transfer_ok();
    size_t rss_warm = 0;
    int caught = 0, cycles = 0;
    double t0 = mono_ms();
    std::string out = output_of([&] {
        // A cycle where the loaded machine let the peer time out before it
        // was stopped catches no send: such cycles are made up for, up to
        // twice the count, so the checks below still see kCycles * 3 / 4
        // stalls with sends in flight.
        for (int c = 0; (c < kCycles || (caught < kCycles * 3 / 4 && c < 2 * kCycles)) &&
                        !::testing::Test::HasFailure();
             c++, cycles++) {
            EpPtr ep;
            std::vector<gser_ucx_request_t *> sends;
            stall(&ep, &sends, true, mid_transfer);
            if (::testing::Test::HasFatalFailure())
                break;
            caught += caught_;
            // The stall ends (as one past the timeout does) and this side lets
            // the endpoint go at once.
            ASSERT_EQ(kill(peer_->pid, SIGCONT), 0);
            gser_ucx_ep_destroy(ep.release());
            // UCX gives the sends back once the peer runs again: its
            // endpoint closes only then (docs/ucx.md, "Closing over tcp").
            EXPECT_TRUE(drive_until({client_.get()}, [&] { return held_by_ucx(client_.get()) == 0; }, 5000))
                << "cycle " << c << ": UCX still holds sends of the destroyed endpoint";
            // Those the peer took whole before it stopped went out; the rest
            // ended with the endpoint.
            size_t failed = 0;
            for (auto *r : sends) {
                gser_status_t st = gser_ucx_request_query(r);
                if (st != GSER_OK) {
                    EXPECT_EQ(st, GSER_ERR_CONNECTION) << "cycle " << c << ": " << gser_status_str(st);
                }
                failed += st != GSER_OK;
                gser_ucx_request_free(r);
            }
            EXPECT_GT(failed, 0u) << "cycle " << c;
            EXPECT_EQ(live_requests(client_.get()), 0u) << "cycle " << c << ": requests outlive their endpoint";
            if (c == 9)
                rss_warm = self_rss_kib();
        }
        client_.reset();
    });
    std::cout << out; // what the cycles printed: failures included
    size_t rss_end = self_rss_kib();
    std::cout << "[          ] " << cycles << " stalled peers (" << caught << " with sends caught) in " << (mono_ms() - t0) / 1000
              << " s; RSS after 10 cycles " << rss_warm << " KiB, after " << cycles << " " << rss_end << " KiB"
              << std::endl;
    EXPECT_FALSE(ucx_warned(out)) << out;
    EXPECT_GE(caught, kCycles * 3 / 4) << "too few cycles caught sends in flight";
    // Under AddressSanitizer freed memory waits in its quarantine (RSS
    // grows by design); LeakSanitizer and the request counts above check
    // that build.
    if (rss_warm && !kSanitized) {
        EXPECT_LT(rss_end, rss_warm + 8192) << "memory grew by more than 8 MiB over the cycles";
    }
}

// A worker destroyed while sends to a stalled peer are still pending on an
// endpoint it still has (the peer not yet timed out, or timed out and
// failed): the sends fail first, and UCX gets all of them back (it warns
// about any request not returned when its worker goes).
TEST_F(Stall, AWorkerDestroyedWithSendsPendingFailsThemFirst)
{
    for (bool failed : {false, true}) {
        SCOPED_TRACE(failed ? "the endpoint failed first" : "the endpoint still up");
        if (!client_) {
            client_ = make_worker(ctx_.get());
            ASSERT_TRUE(client_);
        }
        std::vector<gser_ucx_request_t *> sends;
        std::string out = output_of([&] {
            EpPtr ep;
            stall(&ep, &sends, failed, mid_transfer_ok());
            ep.release(); // still the caller's when its worker goes: the worker closes it
            kill(peer_->pid, SIGCONT); // the stall ends, and this side's worker goes at once
            client_.reset();
        });
        std::cout << out;
        ASSERT_EQ(sends.size(), (size_t)kSends);
        EXPECT_NE(gser_ucx_request_query(sends.back()), GSER_OK);
        // Canceled by the worker's end, or failed with the endpoint (also
        // when the peer went quiet before it was stopped: a loaded machine).
        for (auto *r : sends) {
            gser_status_t st = gser_ucx_request_query(r);
            if (st != GSER_OK) { // (taken whole before the stall)
                EXPECT_TRUE(st == GSER_ERR_CANCELED || st == GSER_ERR_CONNECTION) << gser_status_str(st);
                if (failed) {
                    EXPECT_EQ(st, GSER_ERR_CONNECTION);
                }
            }
            gser_ucx_request_free(r);
        }
        EXPECT_FALSE(ucx_warned(out)) << out;
    }
}

} // namespace
