// A peer that goes silent is failed in bounded time (heartbeats): a process
// stopped with SIGSTOP, one that stops calling progress, and a network
// partition between two network namespaces. Heartbeats keep idle healthy
// connections up; a stop shorter than the timeout loses nothing.
//
// Children report with CLOCK_MONOTONIC timestamps (the same clock in every
// process), so the parent measures when each side noticed.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>

#include <atomic>
#include <dirent.h>

#include "ucx_common.hpp"

namespace {

// ---- child roles -----------------------------------------------------------------

std::string line_of(const char *what, gser_status_t st)
{
    return std::string(what) + " " + std::to_string(mono_ms()) + " " + gser_status_str(st) + " | " +
           gser_ucx_get_last_error();
}

// Set up, and connect to host:port: 0, or the child's exit code (an
// "error ..." line says why).
int child_connect(ChildEnv *e, const std::string &host, uint16_t port, unsigned timeout_ms, EpPtr *out)
{
    if (!child_setup(e, timeout_ms))
        return 10;
    gser_ucx_ep_t *ep;
    gser_status_t st = gser_ucx_ep_connect(e->worker.get(), host.c_str(), port, kWaitMs, &ep);
    if (st) {
        say(line_of("error", st));
        return 11;
    }
    out->reset(ep);
    return 0;
}

// idle-client <host> <port> <timeout_ms>: connect, post a receive, say
// "connected", and wait for the receive: "recv <ms> <status> | <message>".
int child_idle_client(const std::string &host, uint16_t port, unsigned timeout_ms)
{
    ChildEnv e;
    EpPtr epp;
    if (int rc = child_connect(&e, host, port, timeout_ms, &epp))
        return rc;
    gser_ucx_request_t *r;
    if (gser_ucx_ep_recv_nb(epp.get(), nullptr, &r))
        return 12;
    ReqPtr rp(r);
    say("connected");
    gser_status_t st = gser_ucx_request_wait(r, 50000);
    say(line_of("recv", st));
    return 0;
}

// stream-client <host> <port> <timeout_ms> <duration_ms> <frame_bytes>:
// connect, then for duration_ms send messages (a sequence number and a
// frame of frame_bytes) and check each echo; "started" after the first,
// "done <count>" at the end, "error <ms> <status> | <message>" on failure.
int child_stream_client(const std::string &host, uint16_t port, unsigned timeout_ms, int duration_ms, size_t bytes)
{
    ChildEnv e;
    EpPtr epp;
    if (int rc = child_connect(&e, host, port, timeout_ms, &epp))
        return rc;
    gser_ucx_ep_t *ep = epp.get();
    gser_status_t st;
    say("connected");
    std::vector<unsigned char> big(bytes);
    TestMsg::fill(big.data(), bytes, 5);
    double end = mono_ms() + duration_ms;
    uint64_t n = 0;
    for (; mono_ms() < end; n++) {
        gser_frame_t f[2] = {};
        f[0].data = &n, f[0].size = sizeof n;
        f[1].data = big.data(), f[1].size = bytes;
        gser_ucx_request_t *r;
        if ((st = gser_ucx_ep_recv_nb(ep, nullptr, &r)) || (st = gser_ucx_ep_send(ep, f, bytes ? 2 : 1, 60000))) {
            say(line_of("error", st));
            return 0;
        }
        ReqPtr rp(r);
        if ((st = gser_ucx_request_wait(r, 60000))) {
            say(line_of("error", st));
            return 0;
        }
        gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
        if (gser_ucx_request_take(r, &got))
            return 13;
        bool ok = got.nframes == (bytes ? 2u : 1u) && got.frames[0].size == sizeof n &&
                  std::memcmp(got.frames[0].data, &n, sizeof n) == 0 &&
                  (!bytes || (got.frames[1].size == bytes && std::memcmp(got.frames[1].data, big.data(), bytes) == 0));
        gser_ucx_recv_release(&got, false);
        if (!ok) {
            say("wrong echo " + std::to_string(n));
            return 14;
        }
        if (n == 0)
            say("started");
    }
    say("done " + std::to_string(n));
    return 0;
}

// knock <host> <port> <bind_ip> <bytes as hex>: connect from bind_ip
// (within a second) and send the bytes; "connected" or "not connected".
int child_knock(const std::string &host, uint16_t port, const std::string &bind_ip, const std::string &hex)
{
    int fd = raw_connect(port, host.c_str(), 1000, bind_ip.c_str());
    if (fd < 0) {
        say("not connected");
        return 0;
    }
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        bytes += (char)std::stoi(hex.substr(i, 2), nullptr, 16);
    if (send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
        /* said below */
    }
    say("connected");
    usleep(200000);
    ::close(fd);
    return 0;
}

ChildRole knock_role("knock", [](const std::vector<std::string> &a) {
    return a.size() == 4 ? child_knock(a[0], (uint16_t)std::atoi(a[1].c_str()), a[2], a[3]) : 2;
});

ChildRole idle_client_role("idle-client", [](const std::vector<std::string> &a) {
    return a.size() == 3 ? child_idle_client(a[0], (uint16_t)std::atoi(a[1].c_str()), (unsigned)std::atoi(a[2].c_str()))
                         : 2;
});
ChildRole stream_client_role("stream-client", [](const std::vector<std::string> &a) {
    return a.size() == 5 ? child_stream_client(a[0], (uint16_t)std::atoi(a[1].c_str()),
                                               (unsigned)std::atoi(a[2].c_str()), std::atoi(a[3].c_str()),
                                               (size_t)std::atoll(a[4].c_str()))
                         : 2;
});

// "<word> <ms> <status> | <message>" from a child.
struct Report {
    std::string word;
    double ms = 0;
    std::string status, message;
};

Report parse(const std::string &line)
{
    Report r;
    size_t a = line.find(' '), b = a == std::string::npos ? a : line.find(' ', a + 1);
    r.word = line.substr(0, a);
    if (b == std::string::npos)
        return r;
    r.ms = std::atof(line.c_str() + a + 1);
    size_t bar = line.find(" | ", b);
    r.status = line.substr(b + 1, bar == std::string::npos ? std::string::npos : bar - b - 1);
    if (bar != std::string::npos)
        r.message = line.substr(bar + 3);
    return r;
}

bool has(const std::string &s, const char *what)
{
    return s.find(what) != std::string::npos;
}

const std::string kConnection = gser_status_str(GSER_ERR_CONNECTION);

// How long past the timeout a side may take to notice: a heartbeat
// interval, a timer tick, and a loaded machine's scheduling.
constexpr double kSlackMs = 2000;

// ---- this process as the server ----------------------------------------------------------

constexpr unsigned kTimeoutMs = 1500;

class Silence : public ::testing::Test {
  protected:
    void start(unsigned timeout_ms)
    {
        ctx_ = make_ucx_ctx(timeout_ms);
        worker_ = make_worker(ctx_.get());
        ASSERT_TRUE(worker_);
        listener_ = listen_local(worker_.get());
        ASSERT_TRUE(listener_);
        port_ = std::to_string(gser_ucx_listener_get_port(listener_.get()));
    }
    // Listen with a timeout of kTimeoutMs, and accept an idle client child
    // with the same timeout.
    void idle_peer()
    {
        ASSERT_NO_FATAL_FAILURE(start(kTimeoutMs));
        peer_ = std::make_unique<Child>(std::vector<std::string>{"idle-client", "127.0.0.1", port_,
                                                                 std::to_string(kTimeoutMs)});
        gser_ucx_ep_t *ep;
        UCX_OK(gser_ucx_listener_accept(listener_.get(), kWaitMs, &ep));
        peer_ep_.reset(ep);
        ASSERT_EQ(peer_->read_line(), "connected");
    }
    void TearDown() override
    {
        peer_ep_.reset();
        peer_.reset();
        listener_.reset();
        worker_.reset();
        ctx_.reset();
    }
    UcxCtxPtr ctx_;
    WorkerPtr worker_;
    ListenerPtr listener_;
    std::string port_;
    std::unique_ptr<Child> peer_; // idle_peer's
    EpPtr peer_ep_;
};

// A peer stopped for longer than the timeout: this side fails it within the
// timeout (plus slack), saying it went silent; the stopped side, once
// continued, fails too, within the slack, hearing that it was given up on.
TEST_F(Silence, StoppedPeerIsFailedOnBothSides)
{
    ASSERT_NO_FATAL_FAILURE(idle_peer());
    Child &c = *peer_;
    gser_ucx_ep_t *ep = peer_ep_.get();
    gser_ucx_request_t *rr;
    UCX_OK(gser_ucx_ep_recv_nb(ep, nullptr, &rr));
    ReqPtr r(rr);
    progress_for(worker_.get(), 300); // heartbeats both ways
    ASSERT_EQ(gser_ucx_request_query(rr), GSER_INPROGRESS);

    double stop = mono_ms();
    ASSERT_EQ(kill(c.pid, SIGSTOP), 0);
    gser_status_t st = gser_ucx_request_wait(rr, 4 * kTimeoutMs + (int)kSlackMs);
    double noticed = mono_ms() - stop;
    std::string msg = gser_ucx_get_last_error();
    EXPECT_EQ(st, GSER_ERR_CONNECTION) << msg;
    EXPECT_TRUE(has(msg, "went silent")) << msg;
    EXPECT_GE(noticed, kTimeoutMs / 2.0) << "failed before it could have been silent for the timeout";
    EXPECT_LE(noticed, kTimeoutMs + kSlackMs);
    EXPECT_EQ(gser_ucx_ep_get_status(ep), GSER_ERR_CONNECTION);

    // Stopped for well over the timeout, then continued.
    while (mono_ms() < stop + 2.5 * kTimeoutMs)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    double cont = mono_ms();
    ASSERT_EQ(kill(c.pid, SIGCONT), 0);
    Report rep = parse(c.read_line());
    EXPECT_EQ(rep.word, "recv");
    EXPECT_EQ(rep.status, kConnection) << rep.message;
    EXPECT_TRUE(has(rep.message, "heard nothing from this side")) << rep.message;
    EXPECT_LE(rep.ms - cont, kSlackMs) << "the continued side noticed late";
    std::cout << "[          ] stopped peer: failed here after " << noticed << " ms (timeout " << kTimeoutMs
              << "), there " << rep.ms - cont << " ms after SIGCONT" << std::endl;
    EXPECT_EQ(c.wait(), 0);
}

// This process stops calling progress (hung, busy): the peer fails it in
// bounded time, and so does this side as soon as it progresses again.
TEST_F(Silence, AProcessThatStopsProgressingIsFailed)
{
    ASSERT_NO_FATAL_FAILURE(idle_peer());
    Child &c = *peer_;
    gser_ucx_ep_t *ep = peer_ep_.get();
    progress_for(worker_.get(), 300);
    double hang = mono_ms();
    Report rep = parse(c.read_line(2 * kTimeoutMs + (int)kSlackMs)); // no progress here meanwhile
    EXPECT_EQ(rep.word, "recv");
    EXPECT_EQ(rep.status, kConnection) << rep.message;
    EXPECT_TRUE(has(rep.message, "went silent")) << rep.message;
    EXPECT_LE(rep.ms - hang, kTimeoutMs + kSlackMs);
    double resume = mono_ms();
    EXPECT_TRUE(drive_until({worker_.get()}, [&] { return gser_ucx_ep_get_status(ep) != GSER_OK; },
                            (int)kSlackMs));
    EXPECT_EQ(gser_ucx_ep_get_status(ep), GSER_ERR_CONNECTION);
    EXPECT_LE(mono_ms() - resume, kSlackMs);
    gser_msg_t *m;
    EXPECT_EQ(gser_ucx_ep_recv_msg(ep, make_ctx().get(), nullptr, 0, &m), GSER_ERR_CONNECTION);
    EXPECT_TRUE(has(gser_ucx_get_last_error(), "heard nothing from this side")) << gser_ucx_get_last_error();
}

// A stop shorter than the timeout, in the middle of a stream of echoed
// messages: nothing is lost and nothing is raised on either side.
TEST_F(Silence, ShortStopLosesNothing)
{
    const unsigned timeout = 3000;
    ASSERT_NO_FATAL_FAILURE(start(timeout));
    Child c({"stream-client", "127.0.0.1", port_, std::to_string(timeout), "2500", "65536"});
    gser_ucx_ep_t *ep;
    UCX_OK(gser_ucx_listener_accept(listener_.get(), kWaitMs, &ep));
    EpPtr epp(ep);
    std::thread stopper([&] {
        if (c.read_line() != "connected" || c.read_line() != "started")
            return;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        kill(c.pid, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(timeout / 3));
        kill(c.pid, SIGCONT);
    });
    uint64_t echoed = 0;
    gser_status_t st;
    for (;;) {
        gser_ucx_request_t *rr;
        UCX_OK(gser_ucx_ep_recv_nb(ep, nullptr, &rr));
        ReqPtr r(rr);
        if ((st = gser_ucx_request_wait(rr, kWaitMs)))
            break;
        gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
        UCX_OK(gser_ucx_request_take(rr, &got));
        st = gser_ucx_ep_send(ep, got.frames, got.nframes, kWaitMs);
        gser_ucx_recv_release(&got, false);
        if (st)
            break;
        echoed++;
    }
    stopper.join();
    // The stream ended because the client hung up when it was done.
    std::string msg = gser_ucx_get_last_error();
    EXPECT_EQ(st, GSER_ERR_CONNECTION) << msg;
    EXPECT_TRUE(has(msg, "closed the connection")) << msg;
    EXPECT_FALSE(has(msg, "silent")) << msg;
    EXPECT_EQ(c.read_line(), "done " + std::to_string(echoed));
    EXPECT_EQ(c.wait(), 0);
    EXPECT_GT(echoed, 1u);
}

// Idle, healthy, for several timeouts: heartbeats keep it up, with one side
// asleep on its event fd (the timer wakes it) and the other in a blocking wait.
TEST(Heartbeats, KeepAnIdleHealthyConnectionUp)
{
    const unsigned timeout = 1000; // heartbeats every 250 ms; a loaded machine may stall a thread for 100s of ms
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.open(nullptr, nullptr, timeout));
    auto gctx = make_ctx();
    std::atomic<bool> stop{false};
    std::thread server([&] {
        int efd;
        gser_ucx_worker_get_efd(p.server.get(), &efd);
        pollfd pf{efd, POLLIN, 0};
        while (!stop) {
            if (gser_ucx_worker_progress(p.server.get()))
                continue;
            if (gser_ucx_worker_arm(p.server.get()) == GSER_OK)
                poll(&pf, 1, -1); // no timeout of its own: only the fd wakes it
        }
    });
    double end = mono_ms() + 3 * timeout;
    while (mono_ms() < end)
        gser_ucx_worker_wait(p.client.get(), 1000);
    UCX_OK(gser_ucx_ep_get_status(p.cep.get()));
    TestMsg m(gctx.get(), {10}, 1);
    UCX_OK(gser_ucx_ep_send_msg(p.cep.get(), gctx.get(), m.msg.get(), nullptr, kWaitMs)); // wakes the server
    stop = true;
    server.join();
    UCX_OK(gser_ucx_ep_get_status(p.sep.get()));
    gser_msg_t *got;
    UCX_OK(gser_ucx_ep_recv_msg(p.sep.get(), gctx.get(), nullptr, kWaitMs, &got));
    MsgPtr gp(got);
    EXPECT_TRUE(same_msg(got, {10}, 1));
    p.close();
}

// A side whose check is off still heartbeats for a peer whose check is on:
// each side sends often enough for the shorter timeout of the two.
TEST(Heartbeats, FollowTheShorterTimeoutOfTheTwoSides)
{
    auto off = make_ucx_ctx(GSER_UCX_PEER_TIMEOUT_NONE), on = make_ucx_ctx(1000);
    auto sw = make_worker(off.get()), cw = make_worker(on.get());
    auto l = listen_local(sw.get());
    ASSERT_TRUE(l);
    Handshake h = handshake(sw.get(), cw.get(), l.get());
    ASSERT_EQ(h.server_st, GSER_OK);
    gser_ucx_ep_t *c = h.client.get(), *s = h.server.get();
    double end = mono_ms() + 3000;
    drive_until({sw.get(), cw.get()}, [&] { return mono_ms() > end || gser_ucx_ep_get_status(c) != GSER_OK; }, 6000);
    UCX_OK(gser_ucx_ep_get_status(c));
    UCX_OK(gser_ucx_ep_get_status(s));
}

// ---- a network partition between two namespaces -----------------------------------------

// Two network namespaces joined by a veth pair: A (10.77.0.1) and B
// (10.77.0.2), names with this process's id. B's sending side is rate
// limited so that a large transfer takes seconds. A partition drops every
// packet both ends send.
class Partition : public ::testing::Test {
  protected:
    static bool sh(const std::string &cmd, std::string *err = nullptr)
    {
        int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
        if (rc != 0 && err)
            *err = cmd;
        return rc == 0;
    }

    void SetUp() override
    {
        const char *tls = std::getenv("UCX_TLS");
        if (!tls || std::string(tls) != "tcp")
            GTEST_SKIP() << "a partition is a network failure: the ucx.tcp suite runs it";
        if (geteuid() != 0 || !sh("ip -V"))
            GTEST_SKIP() << "network namespaces need root and iproute2";
        reap_stale();
        std::string id = std::to_string(getpid());
        a_ = "gux-a" + id, b_ = "gux-b" + id, va_ = "gux-va" + id, vb_ = "gux-vb" + id;
        std::string err;
        made_ = sh("ip netns add " + a_, &err) && sh("ip netns add " + b_, &err);
        bool ok = made_ && sh("ip link add " + va_ + " netns " + a_ + " type veth peer name " + vb_ + " netns " + b_, &err) &&
                  sh("ip -n " + a_ + " addr add 10.77.0.1/24 dev " + va_, &err) &&
                  sh("ip -n " + b_ + " addr add 10.77.0.2/24 dev " + vb_, &err) &&
                  sh("ip -n " + a_ + " link set lo up", &err) && sh("ip -n " + b_ + " link set lo up", &err) &&
                  sh("ip -n " + a_ + " link set " + va_ + " up", &err) &&
                  sh("ip -n " + b_ + " link set " + vb_ + " up", &err) &&
                  sh("ip netns exec " + b_ + " tc qdisc add dev " + vb_ + " root tbf rate 400mbit burst 256kb latency 50ms",
                     &err);
        if (!ok)
            GTEST_SKIP() << "cannot set up network namespaces: `" << err << "` failed";
        ASSERT_TRUE(running()) << "the veth pair did not come up";
    }

    // Until both ends of the veth pair run (UCX lists only running devices).
    bool running()
    {
        for (int i = 0; i < 100; i++) {
            if (sh("ip -n " + a_ + " link show " + va_ + " | grep -q LOWER_UP") &&
                sh("ip -n " + b_ + " link show " + vb_ + " | grep -q LOWER_UP"))
                return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }

    void TearDown() override
    {
        if (made_) {
            sh("ip netns del " + a_);
            sh("ip netns del " + b_); // the veth pair goes with them
        }
    }

    // Namespaces a crashed run of this test left behind.
    static void reap_stale()
    {
        DIR *d = opendir("/var/run/netns");
        if (!d)
            return;
        while (dirent *e = readdir(d)) {
            std::string n = e->d_name;
            if (n.rfind("gux-a", 0) != 0 && n.rfind("gux-b", 0) != 0)
                continue;
            pid_t pid = (pid_t)std::atoi(n.c_str() + 5);
            if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
                sh("ip netns del " + n);
        }
        closedir(d);
    }

    ChildOpts in(const std::string &ns) { return ChildOpts{ns, {"UCX_NET_DEVICES=", "UCX_TLS=tcp"}}; }
    // Cut the link both ways by dropping every packet each end sends (a
    // pfifo of length 0: this kernel has no netem), or mend it. The links
    // stay up, so each side still has its device, as across real nodes.
    void cut(bool drop)
    {
        const std::string tbf = " root tbf rate 400mbit burst 256kb latency 50ms";
        if (drop) {
            sh("ip netns exec " + a_ + " tc qdisc replace dev " + va_ + " root pfifo limit 0");
            sh("ip netns exec " + b_ + " tc qdisc replace dev " + vb_ + " root pfifo limit 0");
        } else {
            sh("ip netns exec " + a_ + " tc qdisc del dev " + va_ + " root");
            sh("ip netns exec " + b_ + " tc qdisc replace dev " + vb_ + tbf);
        }
    }

    std::string a_, b_, va_, vb_;
    bool made_ = false;
};

// Partition in the middle of a large transfer and while idle with a receive
// posted: every side gets GSER_ERR_CONNECTION within the timeout plus slack;
// the listener serves a peer on its own side meanwhile; after the link
// returns a new connection works.
TEST_F(Partition, BothSidesFailInBoundedTimeAndTheListenerServesOn)
{
    const unsigned timeout = 2000;
    const std::string t = std::to_string(timeout);
    Child server({"serve", "10.77.0.1", t}, in(a_));
    std::string port = std::to_string(port_of(server.read_line()));
    ASSERT_NE(port, "0") << "the server did not start in " << a_;
    Child big({"stream-client", "10.77.0.1", port, t, "60000", std::to_string(96 << 20)}, in(b_));
    Child idle({"idle-client", "10.77.0.1", port, t}, in(b_));
    ASSERT_EQ(big.read_line(), "connected");
    ASSERT_EQ(big.read_line(kWaitMs * 2), "started") << "the first large message did not get through";
    ASSERT_EQ(idle.read_line(), "connected");
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // the next one is on its way

    double t_cut = mono_ms();
    cut(true);
    Report rb = parse(big.read_line(timeout + (int)kSlackMs + 1000));
    Report ri = parse(idle.read_line(timeout + (int)kSlackMs + 1000));
    Report s1 = parse(server.read_line(timeout + (int)kSlackMs + 1000));
    Report s2 = parse(server.read_line(timeout + (int)kSlackMs + 1000));
    for (auto *r : {&rb, &ri, &s1, &s2}) {
        EXPECT_EQ(r->status, kConnection) << r->word << ": " << r->message;
        EXPECT_LE(r->ms - t_cut, timeout + kSlackMs) << r->word << ": " << r->message;
        std::cout << "[          ] " << r->word << " after " << r->ms - t_cut << " ms: " << r->message << std::endl;
    }
    EXPECT_EQ(rb.word, "error");
    EXPECT_EQ(ri.word, "recv");
    EXPECT_TRUE(has(ri.message, "went silent")) << ri.message;
    EXPECT_EQ(s1.word, "failed");
    EXPECT_EQ(s2.word, "failed");

    // The listener serves a peer on its own side of the partition.
    Child local({"stream-client", "10.77.0.1", port, t, "200", "4096"}, in(a_));
    EXPECT_EQ(local.read_line(), "connected");
    EXPECT_EQ(local.read_line(), "started");
    EXPECT_EQ(local.read_line().rfind("done ", 0), 0u);

    cut(false);
    Child after({"stream-client", "10.77.0.1", port, t, "200", "4096"}, in(b_));
    EXPECT_EQ(after.read_line(), "connected") << "no new connection after the link returned";
    EXPECT_EQ(after.read_line(), "started");
    EXPECT_EQ(after.read_line().rfind("done ", 0), 0u);
    EXPECT_EQ(after.wait(), 0);
}

// UCX's own ports on a server take connections only from admitted hosts:
// from 10.77.0.2, whose client the server admitted, a connection gets
// through; from 10.77.0.3, an address that appeared after the client
// listed its host's addresses, it does not, so the 13 bytes that abort a
// process through UCX's port never reach it.
TEST_F(Partition, UcxPortsDropHostsTheServerDidNotAdmit)
{
    if (std::getenv("GSER_UCX_FILTER") && std::string(std::getenv("GSER_UCX_FILTER")) == "0")
        GTEST_SKIP() << "GSER_UCX_FILTER=0 turns the admission filter off";
    Child server({"serve", "10.77.0.1", "2000"}, in(a_));
    uint16_t port = port_of(server.read_line());
    ASSERT_NE(port, 0);
    Child client({"idle-client", "10.77.0.1", std::to_string(port), "2000"}, in(b_));
    ASSERT_EQ(client.read_line(), "connected");
    ASSERT_TRUE(sh("ip -n " + b_ + " addr add 10.77.0.3/24 dev " + vb_));
    std::vector<uint16_t> ucx;
    for (auto &s : listening_sockets(server.pid))
        if (port_part(s) != port)
            ucx.push_back(port_part(s));
    ASSERT_FALSE(ucx.empty()) << "the server has no UCX port (UCX_TLS=tcp)";
    const std::string killer = "785634 12bebafeca" "4001000000";
    std::string hex;
    for (char ch : killer)
        if (ch != ' ')
            hex += ch;
    for (uint16_t up : ucx) {
        Child stranger({"knock", "10.77.0.1", std::to_string(up), "10.77.0.3", hex}, in(b_));
        EXPECT_EQ(stranger.read_line(), "not connected") << "a host the server never admitted reached UCX's port";
        Child known({"knock", "10.77.0.1", std::to_string(up), "10.77.0.2", ""}, in(b_));
        EXPECT_EQ(known.read_line(), "connected") << "the admitted host could not reach UCX's port";
    }
    EXPECT_EQ(waitpid(server.pid, nullptr, WNOHANG), 0) << "the server died";
    // The admitted client's connection still works.
    Child after({"stream-client", "10.77.0.1", std::to_string(port), "2000", "200", "4096"}, in(b_));
    EXPECT_EQ(after.read_line(), "connected");
    EXPECT_EQ(after.read_line(), "started");
}

} // namespace
