// Shared helpers of the UCX transport tests: RAII handles, an in-process
// pair of connected endpoints, messages with frames of chosen sizes, and
// child processes (the test binary re-executed with --child) that are
// always waited for with a deadline and killed when it passes.
#pragma once

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
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
// Tests close endpoints before destroying them: a graceful destroy flushes,
// and UCX's flush waits for the peer, which a one-thread test may not be
// driving at that moment (tested on its own in GracefulDestroy).
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
        gser_ucx_ep_t *c = nullptr, *s = nullptr;
        UCX_OK(gser_ucx_ep_connect_nb(client.get(), "127.0.0.1", gser_ucx_listener_get_port(listener.get()), &c));
        client_ep->reset(c);
        gser_status_t st = GSER_ERR_TIMEOUT;
        ASSERT_TRUE(drive_until({server.get(), client.get()}, [&] {
            if (!s) {
                st = gser_ucx_listener_accept(listener.get(), 0, &s);
                if (st != GSER_OK && st != GSER_ERR_TIMEOUT)
                    return true;
            }
            return s && gser_ucx_ep_get_status(c) != GSER_INPROGRESS;
        })) << "no connection";
        ASSERT_TRUE(s) << gser_status_str(st) << ": " << gser_ucx_get_last_error();
        server_ep->reset(s);
        UCX_OK(gser_ucx_ep_get_status(c));
        UCX_OK(gser_ucx_ep_get_status(s));
    }

    void open(const gser_ucx_worker_options_t *sopts = nullptr, const gser_ucx_worker_options_t *copts = nullptr,
              unsigned peer_timeout_ms = 0)
    {
        ctx = make_ucx_ctx(peer_timeout_ms);
        ASSERT_TRUE(ctx);
        server = make_worker(ctx.get(), sopts);
        client = make_worker(ctx.get(), copts);
        ASSERT_TRUE(server && client);
        gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
        lo.address = "127.0.0.1";
        gser_ucx_listener_t *l = nullptr;
        UCX_OK(gser_ucx_listener_create(server.get(), &lo, &l));
        listener.reset(l);
        ASSERT_NE(gser_ucx_listener_get_port(l), 0);
        connect(&cep, &sep);
    }

    void close()
    {
        cep.reset();
        sep.reset();
        listener.reset();
        client.reset();
        server.reset();
        ctx.reset();
    }
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

// A child process: this binary with --child <args>; killed if still alive
// when destroyed.
struct Child {
    pid_t pid = -1;
    int out_fd = -1; // the child's stdout (one line per event)

    explicit Child(const std::vector<std::string> &args)
    {
        int p[2];
        if (pipe(p) != 0)
            return;
        std::string exe = self_exe();
        pid = fork();
        if (pid == 0) {
            dup2(p[1], 1);
            ::close(p[0]);
            ::close(p[1]);
            std::vector<char *> argv;
            argv.push_back(const_cast<char *>(exe.c_str()));
            argv.push_back(const_cast<char *>("--child"));
            for (auto &a : args)
                argv.push_back(const_cast<char *>(a.c_str()));
            argv.push_back(nullptr);
            execv(exe.c_str(), argv.data());
            _exit(127);
        }
        ::close(p[1]);
        out_fd = p[0];
    }
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;

    // Read one line from the child's stdout, waiting at most timeout_ms.
    std::string read_line(int timeout_ms = kWaitMs)
    {
        std::string line;
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (std::chrono::steady_clock::now() < end) {
            fd_set fds;
            FD_ZERO(&fds);
            FD_SET(out_fd, &fds);
            timeval tv{0, 20000};
            if (select(out_fd + 1, &fds, nullptr, nullptr, &tv) <= 0)
                continue;
            char c;
            if (read(out_fd, &c, 1) != 1)
                break;
            if (c == '\n')
                return line;
            line += c;
        }
        return line;
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
        if (out_fd >= 0)
            ::close(out_fd);
    }
};

// Implemented by the test files that have child roles; 0 = success.
int ucx_child_main(int argc, char **argv);
