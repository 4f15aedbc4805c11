// Closing, destroying or aborting an endpoint in the middle of large sends
// (issue 38). Over UCX's tcp transport this used to crash the process now
// and then: UCX tore its tcp endpoint down with a send backlog, and the
// peer's own close then freed it in the read half of an epoll event whose
// write half still used it (docs/ucx.md, "Closing over tcp").
//
// Each scenario runs in a child process ("midclose"), so that a crash fails
// one test instead of ending the suite; the child runs the cycles against a
// peer child of its own ("hold", test_stall.cpp: accepts, receives and
// drops) and says what it saw. The parent checks the child's exit status:
// 0, or why it failed (below), or a signal.
#include <fstream>

#include "internal.h"
#include "ucx_common.hpp"

namespace {

constexpr unsigned kPeerTimeoutMs = 200;

// Exit codes of the closer child besides 0 (10, 11: setup, connect).
enum : int {
    kExitSendFailed = 13,  // a send could not be posted
    kExitNotFailed = 14,   // the stopped peer was not failed in time
    kExitSendsLeft = 15,   // a send still in flight after its endpoint went
    kExitRequestsLeft = 16, // requests outlived their endpoint
    kExitPeerDied = 17,    // the peer (not killed by the test) died
    kExitWarned = 18,      // UCX warned (mpool, errors)
    kExitPeerStart = 19,   // the peer did not start
};

size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? (size_t)std::strtoull(v, nullptr, 10) : dflt;
}

bool warned(const std::string &out)
{
    return out.find("UCX  WARN") != std::string::npos || out.find("UCX  ERROR") != std::string::npos ||
           out.find("not returned to mpool") != std::string::npos;
}

size_t live_reqs(gser_ucx_worker_t *w)
{
    size_t n = 0;
    for (gux_list_t *l = w->all.next; l != &w->all; l = l->next)
        n++;
    return n;
}

// Whether a scenario kills its peers (killed, stop_kill, killed_port).
bool kills_peer(const std::string &scenario)
{
    return scenario.find("kill") != std::string::npos;
}

bool peer_alive(Child &p)
{
    int status;
    return p.pid > 0 && waitpid(p.pid, &status, WNOHANG) == 0;
}

// midclose <scenario> <how> <cycles>: scenario running | stop_cont |
// stop_destroy | killed | stop_kill (stopped, then killed: its end resets
// the connection with data unread) | killed_port (killed, and the next peer
// listens for UCX on the killed one's port, as a worker restarted on a fixed
// port does); how close (gser_ucx_ep_close, then destroy) or
// destroy. Sizes: GSER_TEST_MIDCLOSE_SENDS x GSER_TEST_MIDCLOSE_MIB.
int child_midclose(const std::string &scenario, const std::string &how, int cycles)
{
    size_t nsends = env_size("GSER_TEST_MIDCLOSE_SENDS", 8);
    size_t big = env_size("GSER_TEST_MIDCLOSE_MIB", 16) << 20;
    bool killed = kills_peer(scenario), stop = scenario.rfind("stop", 0) == 0;
    // killed_port: the peer's UCX listens on ucx_port. UCX binds it without
    // SO_REUSEADDR, so while a connection of the killed peer waits out
    // TIME_WAIT on it (one it had read to the end) the next peer takes
    // another; its failed bind, said on its stderr, is not this side's.
    uint16_t ucx_port = 0;
    int same_port = 0; // cycles whose peer took the killed one's port
    auto peer_opts = [&] {
        ChildOpts o;
        if (ucx_port)
            o.env = {"UCX_TCP_PORT_RANGE=" + std::to_string(ucx_port) + "-" + std::to_string(ucx_port),
                     "UCX_LOG_LEVEL=fatal"};
        return o;
    };
    const char *tls = getenv("UCX_TLS");
    bool tcp = tls && std::string(tls) == "tcp";
    setpgid(0, 0); // its peers go with it (the parent ends the group)
    std::vector<unsigned char> buf(big, 7);
    uint64_t seq = 0;
    int rc = 0;
    std::unique_ptr<Child> peer;
    uint16_t port = 0;
    int later = 0; // cycles whose sends ended after the destroy
    std::string out = output_of([&] {
        ChildEnv e;
        if (!child_setup(&e, kPeerTimeoutMs)) {
            rc = 10;
            return;
        }
        for (int c = 0; c < cycles && !rc; c++) {
            alarm(60);
            if (!peer || killed) {
                for (int tries = 0; tries < 5; tries++) {
                    if (scenario == "killed_port" && (tries > 0 || !ucx_port) && !(ucx_port = unused_port()))
                        break;
                    peer = std::make_unique<Child>(
                        std::vector<std::string>{"hold", std::to_string(10 * kPeerTimeoutMs)}, peer_opts());
                    if ((port = port_of(peer->read_line())) != 0) {
                        same_port += scenario == "killed_port" && c > 0 && tries == 0;
                        break;
                    }
                }
                if (port == 0) {
                    rc = kExitPeerStart;
                    break;
                }
            }
            gser_ucx_ep_t *ep = nullptr;
            gser_status_t st = GSER_ERR_TIMEOUT;
            for (double end = mono_ms() + kWaitMs; st != GSER_OK && mono_ms() < end;)
                st = gser_ucx_ep_connect(e.worker.get(), "127.0.0.1", port, kWaitMs, &ep);
            if (st) {
                say(std::string("connect: ") + gser_ucx_get_last_error());
                rc = 11;
                break;
            }
            std::vector<gser_ucx_request_t *> sends;
            for (size_t i = 0; i < nsends; i++) {
                gser_frame_t f[2] = {};
                f[0].data = &seq, f[0].size = sizeof seq;
                f[1].data = buf.data(), f[1].size = big;
                gser_ucx_request_t *r = nullptr;
                if (gser_ucx_ep_send_nb(ep, f, 2, nullptr, &r)) {
                    rc = kExitSendFailed;
                    break;
                }
                sends.push_back(r);
            }
            // The peer takes the first messages in; the rest are in flight.
            progress_for(e.worker.get(), 20);
            if (scenario == "stop_kill") {
                // Stopped, the peer reads nothing more: this side's socket
                // fills with a send halfway out; killed, the peer's end
                // resets the connection with data unread.
                kill(peer->pid, SIGSTOP);
                progress_for(e.worker.get(), 20);
                kill(peer->pid, SIGKILL);
                progress_for(e.worker.get(), 5);
            } else if (killed) {
                kill(peer->pid, SIGKILL);
                progress_for(e.worker.get(), 5);
            } else if (stop) {
                kill(peer->pid, SIGSTOP);
                if (!drive_until({e.worker.get()}, [&] { return gser_ucx_ep_get_status(ep) != GSER_OK; }, 5000))
                    rc = kExitNotFailed;
                if (scenario == "stop_cont")
                    kill(peer->pid, SIGCONT);
            }
            if (how == "close")
                gser_ucx_ep_close(ep);
            gser_ucx_ep_destroy(ep);
            if (scenario == "stop_destroy")
                kill(peer->pid, SIGCONT);
            // Every send ends with its endpoint: at once when the peer takes
            // the rest or is gone, else once the stopped peer runs again
            // (UCX reads the caller's buffers until then: docs/ucx.md).
            auto ended = [&] {
                for (auto *r : sends)
                    if (gser_ucx_request_query(r) == GSER_INPROGRESS)
                        return false;
                return true;
            };
            if (!ended()) {
                later++;
                if (!drive_until({e.worker.get()}, ended, 5000) && !rc)
                    rc = kExitSendsLeft;
            }
            for (auto *r : sends)
                gser_ucx_request_free(r);
            // UCX gives back what it held of them (it may still have had the
            // caller's buffers when they ended: the peer had stopped). Over
            // shared memory UCX keeps what a killed peer never read until
            // the worker goes (docs/ucx.md, "Close").
            if (!rc && !(killed && !tcp) &&
                !drive_until({e.worker.get()}, [&] { return live_reqs(e.worker.get()) == 0; }, 5000))
                rc = kExitRequestsLeft;
            // The worker goes on with the next peer meanwhile (a peer that
            // came back may still say something to this side).
            progress_for(e.worker.get(), 5);
            if (!killed && !rc && !peer_alive(*peer))
                rc = kExitPeerDied;
            if (killed)
                peer.reset();
        }
        e.worker.reset();
        e.ctx.reset();
    });
    if (!rc && warned(out))
        rc = kExitWarned;
    say("sends ended after the destroy in " + std::to_string(later) + " of " + std::to_string(cycles) + " cycles");
    if (scenario == "killed_port")
        say("the peer took the killed one's port in " + std::to_string(same_port) + " of " + std::to_string(cycles - 1) +
            " cycles");
    if (rc)
        say("failed: " + std::to_string(rc) + "\n" + out);
    return rc;
}

ChildRole midclose_role("midclose", [](const std::vector<std::string> &a) {
    return a.size() == 3 ? child_midclose(a[0], a[1], std::atoi(a[2].c_str())) : 2;
});

// Runs one scenario in a child: it must end with 0, and say nothing else.
void run_scenario(const char *scenario, const char *how)
{
    // Over shared memory the data does not go through UCX's tcp endpoints:
    // fewer cycles there, the same checks.
    const char *tls = getenv("UCX_TLS");
    bool tcp = tls && std::string(tls) == "tcp";
    if (!tcp && kills_peer(scenario))
        GTEST_SKIP() << "over shared memory UCX keeps the sends a killed peer never read until its worker goes, "
                        "and warns then (docs/ucx.md, \"Close\"): not this issue's fault";
    int cycles = (int)env_size("GSER_TEST_MIDCLOSE_CYCLES", tcp ? 50 : 10);
    double t0 = mono_ms();
    Child closer({"midclose", scenario, how, std::to_string(cycles)});
    pid_t group = closer.pid;
    int rc = closer.wait(170000);
    kill(-group, SIGKILL); // its peers (its process group), whatever became of it
    std::string said, line;
    while (!(line = closer.read_line(100)).empty())
        said += line + "\n";
    std::cout << said;
    std::cout << "[          ] " << scenario << "/" << how << ": " << cycles << " cycles in " << (mono_ms() - t0) / 1000
              << " s, exit " << rc << (rc > 128 ? " (signal " + std::to_string(rc - 128) + ")" : "") << std::endl;
    EXPECT_EQ(rc, 0) << said;
}

TEST(MidClose, DestroyWithThePeerRunning) { run_scenario("running", "destroy"); }
TEST(MidClose, CloseWithThePeerRunning) { run_scenario("running", "close"); }
TEST(MidClose, DestroyAfterTheStoppedPeerTimedOutAndContinued) { run_scenario("stop_cont", "destroy"); }
TEST(MidClose, CloseAfterTheStoppedPeerTimedOutAndContinued) { run_scenario("stop_cont", "close"); }
TEST(MidClose, DestroyBeforeTheStoppedPeerContinues) { run_scenario("stop_destroy", "destroy"); }
TEST(MidClose, CloseBeforeTheStoppedPeerContinues) { run_scenario("stop_destroy", "close"); }
TEST(MidClose, DestroyWithThePeerKilled) { run_scenario("killed", "destroy"); }
TEST(MidClose, CloseWithThePeerKilled) { run_scenario("killed", "close"); }
TEST(MidClose, DestroyWithThePeerKilledWhileStopped) { run_scenario("stop_kill", "destroy"); }
TEST(MidClose, CloseWithThePeerKilledWhileStopped) { run_scenario("stop_kill", "close"); }
// UCX pairs its tcp connections by the peer's address and a count of
// connections to it; a new process on an old port counts from 0 again, so
// the two sides' sockets are not paired and each direction has its own.
TEST(MidClose, DestroyWithThePeerKilledAndRestartedOnItsPort) { run_scenario("killed_port", "destroy"); }
TEST(MidClose, CloseWithThePeerKilledAndRestartedOnItsPort) { run_scenario("killed_port", "close"); }

} // namespace
