// Shared helpers of the UCX transport tests: RAII handles, an in-process
// pair of connected endpoints, messages with frames of chosen sizes, and
// child processes (the test binary re-executed with --child) that are
// always waited for with a deadline and killed when it passes.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gser/gser.h>
#include <gser/ucx.h>

#include "host/common.hpp"

#define UCX_OK(expr)                                                                                        \
    do {                                                                                                    \
        gser_status_t st_ = (expr);                                                                         \
        ASSERT_EQ(st_, GSER_OK) << #expr << " -> " << gser_status_str(st_) << ": " << gser_ucx_get_last_error(); \
    } while (0)

// Every wait in the tests is bounded by this (ms).
constexpr int kWaitMs = 20000;

struct UcxCtxDeleter {
    void operator()(gser_ucx_context_t *c) const { gser_ucx_context_destroy(c); }
};
struct WorkerDeleter {
    void operator()(gser_ucx_worker_t *w) const { gser_ucx_worker_destroy(w); }
};
struct ListenerDeleter {
    void operator()(gser_ucx_listener_t *l) const { gser_ucx_listener_destroy(l); }
};
// Close, then destroy. Both flush what the endpoint sent before they hang
// up, and UCX's tcp flush waits for the peer's acknowledgement: a peer in
// this thread, not driven meanwhile, makes them wait out their bound (2 s);
// close_driving drives it.
inline void ep_close_destroy(gser_ucx_ep_t *e)
{
    if (e)
        gser_ucx_ep_close(e);
    gser_ucx_ep_destroy(e);
}
struct EpDeleter {
    void operator()(gser_ucx_ep_t *e) const { ep_close_destroy(e); }
};
struct ReqDeleter {
    void operator()(gser_ucx_request_t *r) const { gser_ucx_request_free(r); }
};
using UcxCtxPtr = std::unique_ptr<gser_ucx_context_t, UcxCtxDeleter>;
using WorkerPtr = std::unique_ptr<gser_ucx_worker_t, WorkerDeleter>;
using ListenerPtr = std::unique_ptr<gser_ucx_listener_t, ListenerDeleter>;
using EpPtr = std::unique_ptr<gser_ucx_ep_t, EpDeleter>;
using ReqPtr = std::unique_ptr<gser_ucx_request_t, ReqDeleter>;

// Close and destroy ep while a thread drives the peer's worker, as a live
// peer's own progress would: the close's flush then ends at once.
inline void close_driving(EpPtr &ep, gser_ucx_worker_t *peer)
{
    if (!ep)
        return;
    std::atomic<bool> stop{false};
    std::thread t([&] {
        while (!stop)
            gser_ucx_worker_progress(peer);
    });
    ep.reset();
    stop = true;
    t.join();
}

// Unsets the variables names and sets those of set while it lives; puts
// back what was there (UCX reads its settings when a context or worker is
// made).
class ScopedEnv {
  public:
    ScopedEnv(std::initializer_list<const char *> names, const std::map<std::string, std::string> &set)
    {
        for (const char *n : names)
            save(n);
        for (auto &kv : set)
            save(kv.first.c_str());
        for (auto &kv : saved_)
            unsetenv(kv.first.c_str());
        for (auto &kv : set)
            setenv(kv.first.c_str(), kv.second.c_str(), 1);
    }
    ~ScopedEnv()
    {
        for (auto &kv : saved_) {
            if (kv.second)
                setenv(kv.first.c_str(), kv.second->c_str(), 1);
            else
                unsetenv(kv.first.c_str());
        }
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

  private:
    void save(const char *n)
    {
        if (saved_.count(n))
            return;
        const char *v = std::getenv(n);
        saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
    }
    std::map<std::string, std::optional<std::string>> saved_;
};

// The shared-memory FIFO's variables (docs/ucx.md, section 7).
#define GSER_TEST_FIFO_ENV "UCX_MM_FIFO_SIZE", "UCX_SYSV_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE"

inline UcxCtxPtr make_ucx_ctx(unsigned peer_timeout_ms = 0)
{
    gser_ucx_context_options_t o = GSER_UCX_CONTEXT_OPTIONS_INIT;
    o.peer_timeout_ms = peer_timeout_ms;
    gser_ucx_context_t *c = nullptr;
    gser_status_t st = gser_ucx_context_create(&o, &c);
    EXPECT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
    return UcxCtxPtr(c);
}

inline WorkerPtr make_worker(gser_ucx_context_t *c, const gser_ucx_worker_options_t *opts = nullptr)
{
    gser_ucx_worker_t *w = nullptr;
    gser_status_t st = gser_ucx_worker_create(c, opts, &w);
    EXPECT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
    return WorkerPtr(w);
}

// Progress both workers until req completes (bounded).
inline gser_status_t drive(std::initializer_list<gser_ucx_worker_t *> ws, gser_ucx_request_t *req,
                           int timeout_ms = kWaitMs)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (gser_ucx_request_query(req) == GSER_INPROGRESS) {
        for (auto *w : ws)
            gser_ucx_worker_progress(w);
        if (std::chrono::steady_clock::now() > end)
            return GSER_ERR_TIMEOUT;
    }
    return gser_ucx_request_query(req);
}

// Progress the workers until pred() (bounded). Returns whether it held.
template <class Pred>
inline bool drive_until(std::initializer_list<gser_ucx_worker_t *> ws, Pred pred, int timeout_ms = kWaitMs)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!pred()) {
        for (auto *w : ws)
            gser_ucx_worker_progress(w);
        if (std::chrono::steady_clock::now() > end)
            return false;
    }
    return true;
}

// Progress server until req (a receive) is done, and client too once
// sender, the status of a send running on another thread (GSER_INPROGRESS
// until it returns), says the send returned: that thread progresses client
// until then (one thread at a time), and UCX's tcp may still hold the
// message's last bytes, sent only as client progresses again, as a live
// process's worker does (under ASan and load a receiver that progressed
// only server waited for the peer timeout in 2 of 30 runs).
inline gser_status_t drive_recv(gser_ucx_worker_t *server, gser_ucx_worker_t *client, gser_ucx_request_t *req,
                                const std::atomic<int> &sender, int timeout_ms = kWaitMs)
{
    if (!drive_until({server}, [&] {
            return sender.load() != GSER_INPROGRESS || gser_ucx_request_query(req) != GSER_INPROGRESS;
        }, timeout_ms))
        return GSER_ERR_TIMEOUT;
    return drive({client, server}, req, timeout_ms);
}

// A listener of w on 127.0.0.1, on a free port (nullptr on failure, which
// the test reports).
inline ListenerPtr listen_local(gser_ucx_worker_t *w, gser_ucx_accept_fn cb = nullptr, void *user_data = nullptr)
{
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    lo.accept_cb = cb;
    lo.user_data = user_data;
    gser_ucx_listener_t *l = nullptr;
    gser_status_t st = gser_ucx_listener_create(w, &lo, &l);
    EXPECT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
    return ListenerPtr(l);
}

// A client of worker cw connecting to listener l of worker sw, both driven
// here until each side has its outcome: the endpoints (when they got one)
// and each side's status (GSER_ERR_TIMEOUT for the listener: no outcome).
struct Handshake {
    EpPtr client, server;
    gser_status_t client_st = GSER_INPROGRESS, server_st = GSER_ERR_TIMEOUT;
};

inline Handshake handshake(gser_ucx_worker_t *sw, gser_ucx_worker_t *cw, gser_ucx_listener_t *l)
{
    Handshake h;
    gser_ucx_ep_t *c = nullptr, *s = nullptr;
    gser_status_t st = gser_ucx_ep_connect_nb(cw, "127.0.0.1", gser_ucx_listener_get_port(l), &c);
    EXPECT_EQ(st, GSER_OK) << gser_ucx_get_last_error();
    h.client.reset(c);
    if (!c)
        return h;
    bool done = drive_until({sw, cw}, [&] {
        if (h.server_st == GSER_ERR_TIMEOUT)
            h.server_st = gser_ucx_listener_accept(l, 0, &s);
        h.client_st = gser_ucx_ep_get_status(c);
        return h.server_st != GSER_ERR_TIMEOUT && h.client_st != GSER_INPROGRESS;
    });
    EXPECT_TRUE(done) << "the handshake did not finish on both sides";
    h.server.reset(s);
    return h;
}

// Two workers in this process: a server with a listener on 127.0.0.1 and a
// client, and one connected endpoint on each side.
struct Pair {
    UcxCtxPtr ctx;
    WorkerPtr server, client;
    ListenerPtr listener;
    EpPtr sep, cep; // server side, client side

    // Connect one more client endpoint; *accepted is the server's end.
    void connect(EpPtr *client_ep, EpPtr *server_ep)
    {
        Handshake h = handshake(server.get(), client.get(), listener.get());
        ASSERT_EQ(h.server_st, GSER_OK) << gser_status_str(h.server_st) << ": " << gser_ucx_get_last_error();
        UCX_OK(h.client_st);
        UCX_OK(gser_ucx_ep_get_status(h.server.get()));
        *client_ep = std::move(h.client);
        *server_ep = std::move(h.server);
    }

    void open(const gser_ucx_worker_options_t *sopts = nullptr, const gser_ucx_worker_options_t *copts = nullptr,
              unsigned peer_timeout_ms = 0)
    {
        ctx = make_ucx_ctx(peer_timeout_ms);
        ASSERT_TRUE(ctx);
        server = make_worker(ctx.get(), sopts);
        client = make_worker(ctx.get(), copts);
        ASSERT_TRUE(server && client);
        listener = listen_local(server.get());
        ASSERT_TRUE(listener);
        ASSERT_NE(gser_ucx_listener_get_port(listener.get()), 0);
        connect(&cep, &sep);
    }

    ~Pair() { close(); }

    void close()
    {
        close_driving(cep, server.get());
        sep.reset();
        listener.reset();
        client.reset();
        server.reset();
        ctx.reset();
    }
};

// Send msg from p's client end and receive it on its server end, driving
// both workers (a large frame needs the receiver's progress to leave);
// the message deserialized, or null after a failed expectation.
inline MsgPtr send_recv(Pair &p, gser_context_t *ctx, const gser_msg_t *msg)
{
    auto frames = serialize(ctx, const_cast<gser_msg_t *>(msg));
    gser_ucx_request_t *sr = nullptr, *rr = nullptr;
    EXPECT_EQ(gser_ucx_ep_send_nb(p.cep.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()),
                                  nullptr, &sr),
              GSER_OK)
        << gser_ucx_get_last_error();
    EXPECT_EQ(gser_ucx_ep_recv_nb(p.sep.get(), nullptr, &rr), GSER_OK) << gser_ucx_get_last_error();
    ReqPtr s(sr), r(rr);
    EXPECT_EQ(drive({p.client.get(), p.server.get()}, sr), GSER_OK) << gser_ucx_get_last_error();
    EXPECT_EQ(drive({p.client.get(), p.server.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_ucx_request_deserialize(rr, ctx, nullptr, &m), GSER_OK) << gser_ucx_get_last_error();
    return MsgPtr(m);
}

// A test with a gser context and a connected pair in this process.
class PairTest : public ::testing::Test {
  protected:
    void SetUp() override
    {
        ctx_ = make_ctx();
        pair_.open();
    }
    void TearDown() override { pair_.close(); }

    CtxPtr ctx_;
    Pair pair_;
};

// A message: a map with a name and n buffers of the given sizes, filled with
// a pattern derived from seed. Frames are made by gser_serialize.
struct TestMsg {
    std::vector<std::vector<unsigned char>> bufs;
    MsgPtr msg;

    TestMsg(gser_context_t *ctx, const std::vector<size_t> &sizes, unsigned seed = 1)
    {
        gser_msg_t *m = nullptr;
        EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
        msg.reset(m);
        gser_value_t *map, *v, *list;
        EXPECT_EQ(gser_msg_new_map(m, &map), GSER_OK);
        EXPECT_EQ(gser_msg_new_uint(m, seed, &v), GSER_OK);
        EXPECT_EQ(gser_map_put_cstr(map, "seed", v), GSER_OK);
        EXPECT_EQ(gser_msg_new_list(m, &list), GSER_OK);
        bufs.resize(sizes.size());
        for (size_t i = 0; i < sizes.size(); i++) {
            bufs[i].resize(sizes[i]);
            fill(bufs[i].data(), sizes[i], seed + (unsigned)i);
            gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
            d.data = bufs[i].data();
            d.nbytes = sizes[i];
            EXPECT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
            EXPECT_EQ(gser_list_append(list, v), GSER_OK);
        }
        EXPECT_EQ(gser_map_put_cstr(map, "bufs", list), GSER_OK);
        EXPECT_EQ(gser_msg_set_root(m, map), GSER_OK);
    }

    static void fill(unsigned char *p, size_t n, unsigned seed)
    {
        uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            std::memcpy(p + i, &x, 8);
        }
        for (; i < n; i++)
            p[i] = (unsigned char)(seed + i);
    }
};

// Whether a received message equals what TestMsg(sizes, seed) built.
inline ::testing::AssertionResult same_msg(gser_msg_t *got, const std::vector<size_t> &sizes, unsigned seed)
{
    gser_value_t *root = gser_msg_get_root(got), *v, *list;
    uint64_t s = 0;
    if (gser_map_find_cstr(root, "seed", &v) || gser_value_get_uint(v, &s) || s != seed)
        return ::testing::AssertionFailure() << "seed " << s << " != " << seed;
    if (gser_map_find_cstr(root, "bufs", &list) || gser_value_get_len(list) != sizes.size())
        return ::testing::AssertionFailure() << "wrong buffer count";
    std::vector<unsigned char> want;
    for (size_t i = 0; i < sizes.size(); i++) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        if (gser_list_get(list, i, &v) || gser_value_get_buffer(v, &d))
            return ::testing::AssertionFailure() << "buffer " << i << " missing";
        if (d.nbytes != sizes[i])
            return ::testing::AssertionFailure() << "buffer " << i << " has " << d.nbytes << " bytes";
        want.resize(sizes[i]);
        TestMsg::fill(want.data(), sizes[i], seed + (unsigned)i);
        if (d.memory == GSER_MEMORY_HOST && sizes[i] && std::memcmp(d.data, want.data(), sizes[i]) != 0)
            return ::testing::AssertionFailure() << "buffer " << i << " differs";
    }
    return ::testing::AssertionSuccess();
}

// Where output_of keeps what it took, so that an abort (a failed assertion
// in UCX, say) still shows it: UCX writes why it aborts to stderr.
struct CapturedOutput {
    static inline volatile sig_atomic_t fd = -1, out = -1;
    static void on_abort(int sig)
    {
        if (fd >= 0 && out >= 0) {
            char buf[4096];
            ssize_t k;
            lseek(fd, 0, SEEK_SET);
            while ((k = read(fd, buf, sizeof buf)) > 0)
                if (write(out, buf, (size_t)k) != k)
                    break;
        }
        signal(sig, SIG_DFL);
        raise(sig);
    }
};

// What this process writes to its standard output and error while f runs.
template <typename F> inline std::string output_of(F f)
{
    fflush(stdout);
    fflush(stderr);
    char path[] = "/tmp/gser-test-output-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return "(mkstemp failed)";
    unlink(path);
    int out = dup(1), err = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    CapturedOutput::fd = fd;
    CapturedOutput::out = out;
    void (*was)(int) = signal(SIGABRT, CapturedOutput::on_abort);
    f();
    signal(SIGABRT, was);
    CapturedOutput::fd = CapturedOutput::out = -1;
    fflush(stdout);
    fflush(stderr);
    dup2(out, 1);
    dup2(err, 2);
    close(out);
    close(err);
    std::string text;
    char buf[4096];
    ssize_t k;
    lseek(fd, 0, SEEK_SET);
    while ((k = read(fd, buf, sizeof buf)) > 0)
        text.append(buf, (size_t)k);
    close(fd);
    return text;
}

// ---- child processes ------------------------------------------------------

// The path of this test binary, for re-executing it as a child.
inline std::string self_exe()
{
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        return {};
    buf[n] = '\0';
    return buf;
}

// How a child starts: in another network namespace (through `ip netns
// exec`, which also gives it that namespace's /sys, where UCX finds its
// devices), with environment variables set or removed ("NAME=" removes).
struct ChildOpts {
    std::string netns;
    std::vector<std::string> env;
};

// A child process: this binary with --child <args>; killed if still alive
// when destroyed.
struct Child {
    pid_t pid = -1;
    int out_fd = -1; // the child's stdout (one line per event)
    // A thread reads the child's lines as they come, so that a chatty child
    // never blocks on a full pipe.
    std::thread reader;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> lines;
    bool eof = false;

    explicit Child(const std::vector<std::string> &args, const ChildOpts &opts = {})
    {
        int p[2];
        if (pipe(p) != 0)
            return;
        std::string exe = self_exe();
        std::vector<std::string> argv;
        if (!opts.netns.empty())
            argv = {"ip", "netns", "exec", opts.netns};
        argv.push_back(exe);
        argv.push_back("--child");
        argv.insert(argv.end(), args.begin(), args.end());
        pid = fork();
        if (pid == 0) {
            dup2(p[1], 1);
            ::close(p[0]);
            ::close(p[1]);
            for (auto &e : opts.env) {
                size_t eq = e.find('=');
                if (eq + 1 == e.size())
                    unsetenv(e.substr(0, eq).c_str());
                else
                    setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
            }
            std::vector<char *> cargv;
            for (auto &a : argv)
                cargv.push_back(const_cast<char *>(a.c_str()));
            cargv.push_back(nullptr);
            execvp(cargv[0], cargv.data());
            _exit(127);
        }
        ::close(p[1]);
        out_fd = p[0];
        reader = std::thread([this] {
            std::string partial;
            char buf[4096];
            ssize_t n;
            while ((n = read(out_fd, buf, sizeof buf)) > 0) {
                std::lock_guard<std::mutex> g(mu);
                for (ssize_t i = 0; i < n; i++) {
                    if (buf[i] != '\n') {
                        partial += buf[i];
                        continue;
                    }
                    lines.push_back(partial);
                    partial.clear();
                }
                cv.notify_all();
            }
            std::lock_guard<std::mutex> g(mu);
            eof = true;
            cv.notify_all();
        });
    }
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;

    // The child's next line, waiting at most timeout_ms ("" if none came).
    std::string read_line(int timeout_ms = kWaitMs)
    {
        std::unique_lock<std::mutex> g(mu);
        cv.wait_for(g, std::chrono::milliseconds(timeout_ms), [&] { return !lines.empty() || eof; });
        if (lines.empty())
            return "";
        std::string l = lines.front();
        lines.pop_front();
        return l;
    }

    // Wait for the child to exit; its exit status, or -1 if it had to be killed.
    int wait(int timeout_ms = kWaitMs)
    {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        int status = 0;
        while (pid > 0) {
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            if (std::chrono::steady_clock::now() > end) {
                kill_now();
                return -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return -1;
    }

    void kill_now()
    {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
            pid = -1;
        }
    }

    ~Child()
    {
        kill_now();
        if (reader.joinable())
            reader.join();
        if (out_fd >= 0)
            ::close(out_fd);
    }
};

// Child roles: a test file registers a role by name (a static ChildRole);
// main() runs it when this binary is started as `--child <role> args...`.
// The role returns the child's exit status (0 = success).
using ChildRoleFn = int (*)(const std::vector<std::string> &args);
inline std::map<std::string, ChildRoleFn> &child_roles()
{
    static std::map<std::string, ChildRoleFn> roles;
    return roles;
}
struct ChildRole {
    ChildRole(const char *name, ChildRoleFn fn) { child_roles()[name] = fn; }
};
int ucx_child_main(int argc, char **argv);

// What a child sets up: a transport context (with the peer timeout given),
// a worker, and a gser context.
struct ChildEnv {
    UcxCtxPtr ctx;
    WorkerPtr worker;
    CtxPtr gctx;
};

inline bool child_setup(ChildEnv *e, unsigned peer_timeout_ms = 0)
{
    e->ctx = make_ucx_ctx(peer_timeout_ms);
    if (!e->ctx)
        return false;
    e->worker = make_worker(e->ctx.get());
    e->gctx = make_ctx();
    return e->worker && e->gctx;
}

// A line to the parent, on stdout.
inline void say(const std::string &line)
{
    std::string l = line + "\n";
    if (write(1, l.data(), l.size()) < 0)
        _exit(3);
}

// Progress for ms milliseconds, then stop driving UCX entirely.
inline void progress_for(gser_ucx_worker_t *w, int ms)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end)
        gser_ucx_worker_progress(w);
}

// Listen on address, say the port, accept one peer: 0, or the child's exit code.
inline int child_accept(ChildEnv *e, ListenerPtr *lp, gser_ucx_ep_t **ep, const char *address = "127.0.0.1")
{
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = address;
    gser_ucx_listener_t *l;
    if (gser_ucx_listener_create(e->worker.get(), &lo, &l))
        return 11;
    lp->reset(l);
    say("port " + std::to_string(gser_ucx_listener_get_port(l)));
    return gser_ucx_listener_accept(l, kWaitMs, ep) ? 12 : 0;
}

// Set the child up and connect to 127.0.0.1:port: 0, or the child's exit
// code (10: setup, 11: connect).
inline int child_setup_connect(ChildEnv *e, uint16_t port, gser_ucx_ep_t **ep)
{
    if (!child_setup(e))
        return 10;
    return gser_ucx_ep_connect(e->worker.get(), "127.0.0.1", port, kWaitMs, ep) ? 11 : 0;
}

inline uint16_t port_of(const std::string &line)
{
    return line.rfind("port ", 0) == 0 ? (uint16_t)std::atoi(line.c_str() + 5) : 0;
}

// A TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick),
// or 0.
inline uint16_t unused_port()
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t len = sizeof sa;
    uint16_t port = 0;
    if (fd >= 0 && bind(fd, (sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        ::close(fd);
    return port;
}

// A TCP connection to host:port within timeout_ms, from bind_ip if given:
// its fd (blocking), or -1.
inline int raw_connect(uint16_t port, const char *host, int timeout_ms, const char *bind_ip = nullptr)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    if (bind_ip) {
        inet_pton(AF_INET, bind_ip, &sa.sin_addr);
        if (bind(fd, (sockaddr *)&sa, sizeof sa) != 0) {
            ::close(fd);
            return -1;
        }
    }
    sa.sin_port = htons(port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    int err = 0;
    socklen_t len = sizeof err;
    pollfd p{fd, POLLOUT, 0};
    if ((connect(fd, (sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) || poll(&p, 1, timeout_ms) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        ::close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// The listening TCP sockets of a process: "address:port" each.
inline std::vector<std::string> listening_sockets(pid_t pid)
{
    std::set<std::string> inodes;
    std::string fddir = "/proc/" + std::to_string(pid) + "/fd";
    if (DIR *d = opendir(fddir.c_str())) {
        while (dirent *e = readdir(d)) {
            char buf[64];
            ssize_t n = readlink((fddir + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
            if (n > 0) {
                buf[n] = '\0';
                if (std::strncmp(buf, "socket:[", 8) == 0)
                    inodes.insert(std::string(buf + 8, strlen(buf + 8) - 1));
            }
        }
        closedir(d);
    }
    std::vector<std::string> out;
    for (const char *f : {"tcp", "tcp6"}) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + f);
        std::string line;
        std::getline(in, line);
        while (std::getline(in, line)) {
            std::istringstream ls(line);
            std::string sl, local, remote, st, q, tr, rt, uid, to, inode;
            ls >> sl >> local >> remote >> st >> q >> tr >> rt >> uid >> to >> inode;
            if (st != "0A" || !inodes.count(inode))
                continue;
            size_t colon = local.find(':');
            std::string hexip = local.substr(0, colon);
            unsigned port = (unsigned)std::stoul(local.substr(colon + 1), nullptr, 16);
            char ip[INET6_ADDRSTRLEN] = "?";
            if (hexip.size() == 8) {
                in_addr a;
                a.s_addr = (in_addr_t)std::stoul(hexip, nullptr, 16);
                inet_ntop(AF_INET, &a, ip, sizeof ip);
            } else {
                in6_addr a;
                for (int i = 0; i < 4; i++) {
                    uint32_t w = (uint32_t)std::stoul(hexip.substr(8 * i, 8), nullptr, 16);
                    std::memcpy(a.s6_addr + 4 * i, &w, 4);
                }
                inet_ntop(AF_INET6, &a, ip, sizeof ip);
            }
            out.push_back(std::string(ip) + ":" + std::to_string(port));
        }
    }
    return out;
}

inline uint16_t port_part(const std::string &s)
{
    return (uint16_t)std::atoi(s.c_str() + s.rfind(':') + 1);
}

// Milliseconds on CLOCK_MONOTONIC: the same clock in every process, so a
// child's timestamps compare with the parent's.
inline double mono_ms()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
