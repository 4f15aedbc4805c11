// Compression negotiated in the handshake (docs/ucx.md 4.5): each side
// announces the codecs it reads, an endpoint writes only codecs both have,
// by default nothing towards a peer on this host and sampled lz4 towards
// another host; the option forces a codec or none. Compressed frames go on
// the wire and come back equal; compressed frames in a codec the receiver
// did not announce, or corrupt ones, fail the receive with
// GSER_ERR_COMPRESSED and close the endpoint.
#include "ucx_common.hpp"

#include <functional>
#include <random>

#include <lz4.h>

extern "C" {
#include "internal.h"
}

namespace {

constexpr size_t kBig = 1 << 20;

// A message of one buffer of n bytes that compresses well (runs of a
// counter), borrowed from bytes.
MsgPtr runs_msg(gser_context_t *ctx, std::vector<unsigned char> &bytes, size_t n)
{
    bytes.resize(n);
    for (size_t i = 0; i < n; i++)
        bytes[i] = (unsigned char)(i / 4096);
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    MsgPtr p(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = bytes.data();
    d.nbytes = n;
    gser_value_t *v;
    EXPECT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    EXPECT_EQ(gser_msg_set_root(m, v), GSER_OK);
    return p;
}

// runs_msg's message of kBig bytes serialized with codec (m and bytes must
// outlive the frames, which borrow them).
FramesPtr runs_frames(gser_context_t *ctx, int codec, MsgPtr &m, std::vector<unsigned char> &bytes)
{
    m = runs_msg(ctx, bytes, kBig);
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = codec;
    return serialize(ctx, m.get(), &so);
}

bool same_bytes(gser_msg_t *m, const std::vector<unsigned char> &want)
{
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    if (gser_value_get_buffer(gser_msg_get_root(m), &d) != GSER_OK)
        return false;
    return d.nbytes == want.size() && std::memcmp(d.data, want.data(), want.size()) == 0;
}

int codec_of(gser_ucx_ep_t *ep)
{
    int c = -1;
    EXPECT_EQ(gser_ucx_ep_get_compression(ep, &c), GSER_OK) << gser_ucx_get_last_error();
    return c;
}

gser_ucx_worker_options_t with_compression(int c)
{
    gser_ucx_worker_options_t o = GSER_UCX_WORKER_OPTIONS_INIT;
    o.compression = c;
    return o;
}

// A pair whose sides announce the given codecs (the hook acts on handshakes
// started afterwards, so the workers are made first, then connected).
struct CodecPair {
    Pair p;
    void open(int server_mode, int client_mode, uint32_t server_codecs = GUX_CODECS, uint32_t client_codecs = GUX_CODECS,
              bool server_chunked = true, const gser_limits_t *server_limits = nullptr)
    {
        gser_ucx_worker_options_t so = with_compression(server_mode), co = with_compression(client_mode);
        so.limits = server_limits;
        co.thread_mode = GSER_UCX_THREAD_SERIALIZED; // a test's send_msg may run on a thread of its own
        p.ctx = make_ucx_ctx();
        ASSERT_TRUE(p.ctx);
        p.server = make_worker(p.ctx.get(), &so);
        p.client = make_worker(p.ctx.get(), &co);
        ASSERT_TRUE(p.server && p.client);
        gux_worker_set_announce_codecs(p.server.get(), server_codecs);
        gux_worker_set_announce_codecs(p.client.get(), client_codecs);
        gux_worker_set_announce_chunked(p.server.get(), server_chunked);
        p.listener = listen_local(p.server.get());
        ASSERT_TRUE(p.listener);
        p.connect(&p.cep, &p.sep);
    }
};

TEST(Compress, HostIsLocal)
{
    EXPECT_TRUE(gux_host_is_local("127.0.0.1", ""));
    EXPECT_TRUE(gux_host_is_local("127.1.2.3", "10.0.0.1"));
    EXPECT_TRUE(gux_host_is_local("::1", ""));
    EXPECT_TRUE(gux_host_is_local("::ffff:127.0.0.1", ""));
    EXPECT_TRUE(gux_host_is_local("10.0.0.2", "10.0.0.2")); // this host's own address
    EXPECT_FALSE(gux_host_is_local("10.0.0.2", "10.0.0.1"));
    EXPECT_FALSE(gux_host_is_local("fd00::2", "fd00::1"));
    EXPECT_FALSE(gux_host_is_local("::ffff:10.0.0.2", "::ffff:10.0.0.1"));
    EXPECT_FALSE(gux_host_is_local("", ""));
    EXPECT_FALSE(gux_host_is_local("not an address", "x"));
}

TEST(Compress, Announced)
{
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, 0));
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(cp.p.cep.get(), &info));
    EXPECT_EQ(info.caps & (GSER_UCX_CAP_LZ4 | GSER_UCX_CAP_ZSTD), GSER_UCX_CAP_LZ4 | GSER_UCX_CAP_ZSTD);
    EXPECT_EQ(info.gser_wire_version, (uint32_t)GSER_WIRE_VERSION);
}

// Which codec each side writes with, for the modes and announcements of
// both sides, all over loopback (so the default is off).
TEST(Compress, NegotiationMatrix)
{
    struct Case {
        int smode, cmode;
        uint32_t scodecs, ccodecs;
        int swrites, cwrites;
    };
    const uint32_t all = GUX_CODECS, lz4 = GSER_UCX_CAP_LZ4, zstd = GSER_UCX_CAP_ZSTD;
    const Case cases[] = {
        // loopback: the default compresses nothing
        {GSER_UCX_COMPRESSION_DEFAULT, GSER_UCX_COMPRESSION_DEFAULT, all, all, GSER_COMPRESSION_NONE, GSER_COMPRESSION_NONE},
        // auto where both have everything: lz4, as Dask's auto
        {GSER_UCX_COMPRESSION_AUTO, GSER_UCX_COMPRESSION_AUTO, all, all, GSER_COMPRESSION_LZ4, GSER_COMPRESSION_LZ4},
        // forced codecs, each side its own
        {GSER_UCX_COMPRESSION_ZSTD, GSER_UCX_COMPRESSION_LZ4, all, all, GSER_COMPRESSION_ZSTD, GSER_COMPRESSION_LZ4},
        {GSER_UCX_COMPRESSION_NONE, GSER_UCX_COMPRESSION_ZSTD, all, all, GSER_COMPRESSION_NONE, GSER_COMPRESSION_ZSTD},
        // a side that announces no codec (a build without them): the two
        // still talk, and neither side compresses
        {GSER_UCX_COMPRESSION_AUTO, GSER_UCX_COMPRESSION_AUTO, 0, all, GSER_COMPRESSION_NONE, GSER_COMPRESSION_NONE},
        {GSER_UCX_COMPRESSION_ZSTD, GSER_UCX_COMPRESSION_ZSTD, all, 0, GSER_COMPRESSION_NONE, GSER_COMPRESSION_NONE},
        // only zstd in common: auto takes it, a forced lz4 gives nothing
        {GSER_UCX_COMPRESSION_AUTO, GSER_UCX_COMPRESSION_LZ4, zstd, all, GSER_COMPRESSION_ZSTD, GSER_COMPRESSION_NONE},
        {GSER_UCX_COMPRESSION_AUTO, GSER_UCX_COMPRESSION_AUTO, zstd, zstd, GSER_COMPRESSION_ZSTD, GSER_COMPRESSION_ZSTD},
        {GSER_UCX_COMPRESSION_LZ4, GSER_UCX_COMPRESSION_AUTO, lz4, zstd, GSER_COMPRESSION_NONE, GSER_COMPRESSION_NONE},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE("modes " + std::to_string(c.smode) + "/" + std::to_string(c.cmode) + ", codecs " +
                     std::to_string(c.scodecs) + "/" + std::to_string(c.ccodecs));
        CodecPair cp;
        ASSERT_NO_FATAL_FAILURE(cp.open(c.smode, c.cmode, c.scodecs, c.ccodecs));
        EXPECT_EQ(codec_of(cp.p.sep.get()), c.swrites);
        EXPECT_EQ(codec_of(cp.p.cep.get()), c.cwrites);
    }
}

// A peer that announces gser wire version 2 (it reads no compressed frame)
// is accepted and sent nothing compressed, whatever is forced; one that
// announces 1 is refused.
TEST(Compress, OlderGserWireVersionTalksUncompressed)
{
    auto ctx = make_ctx();
    gser_ucx_worker_options_t so = with_compression(GSER_UCX_COMPRESSION_LZ4),
                              co = with_compression(GSER_UCX_COMPRESSION_ZSTD);
    Pair p;
    p.ctx = make_ucx_ctx();
    ASSERT_TRUE(p.ctx);
    p.server = make_worker(p.ctx.get(), &so);
    p.client = make_worker(p.ctx.get(), &co);
    ASSERT_TRUE(p.server && p.client);
    gux_worker_set_announce_gser_version(p.client.get(), 2);
    p.listener = listen_local(p.server.get());
    ASSERT_TRUE(p.listener);
    ASSERT_NO_FATAL_FAILURE(p.connect(&p.cep, &p.sep));
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(p.sep.get(), &info));
    EXPECT_EQ(info.gser_wire_version, 2u);
    EXPECT_EQ(codec_of(p.sep.get()), GSER_COMPRESSION_NONE); // the peer reads no compressed frame
    std::vector<unsigned char> bytes;
    MsgPtr m = runs_msg(ctx.get(), bytes, 65536);
    gser_serialize_options_t o = GSER_SERIALIZE_OPTIONS_INIT;
    o.compression = GSER_COMPRESSION_LZ4;
    EXPECT_EQ(gser_ucx_ep_send_msg(p.sep.get(), ctx.get(), m.get(), &o, kWaitMs), GSER_ERR_UNSUPPORTED);

    gux_worker_set_announce_gser_version(p.client.get(), 1);
    Handshake h = handshake(p.server.get(), p.client.get(), p.listener.get());
    EXPECT_EQ(h.server_st, GSER_ERR_WIRE_VERSION);
    EXPECT_NE(h.client_st, GSER_OK); // (this client checks by the new rule: it sees the server close)
}

TEST(Compress, EndpointOverridesWorker)
{
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, GSER_UCX_COMPRESSION_NONE));
    EXPECT_EQ(codec_of(cp.p.cep.get()), GSER_COMPRESSION_NONE);
    UCX_OK(gser_ucx_ep_set_compression(cp.p.cep.get(), GSER_UCX_COMPRESSION_ZSTD));
    EXPECT_EQ(codec_of(cp.p.cep.get()), GSER_COMPRESSION_ZSTD);
    UCX_OK(gser_ucx_ep_set_compression(cp.p.cep.get(), GSER_UCX_COMPRESSION_DEFAULT)); // by transport: loopback
    EXPECT_EQ(codec_of(cp.p.cep.get()), GSER_COMPRESSION_NONE);
    EXPECT_EQ(gser_ucx_ep_set_compression(cp.p.cep.get(), 99), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_ucx_ep_set_compression(nullptr, 0), GSER_ERR_INVALID_ARG);
    int c;
    EXPECT_EQ(gser_ucx_ep_get_compression(nullptr, &c), GSER_ERR_INVALID_ARG);
}

TEST(Compress, WorkerOptionChecked)
{
    auto ctx = make_ucx_ctx();
    gser_ucx_worker_options_t o = with_compression(5);
    gser_ucx_worker_t *w = nullptr;
    EXPECT_EQ(gser_ucx_worker_create(ctx.get(), &o, &w), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(w, nullptr);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("compression"), std::string::npos);
}

// Send msg with gser_ucx_ep_send_msg from cp's client (on a thread of its
// own: a frame that is not compressed needs the receiver's progress).
gser_status_t send_msg_async(CodecPair &cp, gser_context_t *ctx, gser_msg_t *msg,
                             const gser_serialize_options_t *so, std::thread *t, std::atomic<int> *st)
{
    st->store(GSER_INPROGRESS);
    *t = std::thread([&cp, ctx, msg, so, st] {
        st->store(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx, msg, so, kWaitMs));
    });
    return GSER_OK;
}

// Receive one message on the server's end of cp.
// sender: the status of a send_msg_async (drive_recv).
gser_status_t recv_one(CodecPair &cp, gser_context_t *ctx, MsgPtr *out, const std::atomic<int> *sender = nullptr)
{
    gser_ucx_request_t *rr = nullptr;
    EXPECT_EQ(gser_ucx_ep_recv_nb(cp.p.sep.get(), nullptr, &rr), GSER_OK) << gser_ucx_get_last_error();
    ReqPtr r(rr);
    gser_status_t st = sender ? drive_recv(cp.p.server.get(), cp.p.client.get(), rr, *sender)
                              : drive({cp.p.client.get(), cp.p.server.get()}, rr);
    if (st)
        return st;
    gser_msg_t *m = nullptr;
    st = gser_ucx_request_deserialize(rr, ctx, nullptr, &m);
    out->reset(m);
    return st;
}

// What the sender's options ask for becomes compressed frames on the wire
// (the received frame's wire size is the compressed one), equal on arrival.
TEST(Compress, ForcedCodecOnTheWire)
{
    auto ctx = make_ctx();
    for (int mode : {GSER_UCX_COMPRESSION_LZ4, GSER_UCX_COMPRESSION_ZSTD, GSER_UCX_COMPRESSION_NONE}) {
        SCOPED_TRACE("mode " + std::to_string(mode));
        CodecPair cp;
        ASSERT_NO_FATAL_FAILURE(cp.open(0, mode));
        std::vector<unsigned char> bytes;
        MsgPtr m = runs_msg(ctx.get(), bytes, kBig);
        std::thread t;
        std::atomic<int> sst;
        send_msg_async(cp, ctx.get(), m.get(), nullptr, &t, &sst);
        MsgPtr got;
        gser_status_t rst = recv_one(cp, ctx.get(), &got, &sst);
        t.join();
        UCX_OK((gser_status_t)sst.load());
        UCX_OK(rst);
        ASSERT_TRUE(got);
        EXPECT_TRUE(same_bytes(got.get(), bytes));
        int codec = -1;
        size_t wire = 0;
        ASSERT_EQ(gser_msg_get_frame_codec(got.get(), 1, &codec, &wire), GSER_OK);
        int want = mode == GSER_UCX_COMPRESSION_LZ4 ? GSER_COMPRESSION_LZ4
                   : mode == GSER_UCX_COMPRESSION_ZSTD ? GSER_COMPRESSION_ZSTD
                                                       : GSER_COMPRESSION_NONE;
        EXPECT_EQ(codec, want);
        if (want)
            EXPECT_LT(wire, kBig / 10);
        else
            EXPECT_EQ(wire, kBig);
    }
}

// Sampling: data that does not shrink travels as it is, even when forced.
TEST(Compress, IncompressibleStaysAsItIs)
{
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, GSER_UCX_COMPRESSION_AUTO));
    TestMsg t(ctx.get(), {100000}, 7);
    std::thread th;
    std::atomic<int> sst;
    send_msg_async(cp, ctx.get(), t.msg.get(), nullptr, &th, &sst);
    MsgPtr got;
    gser_status_t rst = recv_one(cp, ctx.get(), &got, &sst);
    th.join();
    UCX_OK((gser_status_t)sst.load());
    UCX_OK(rst);
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_msg(got.get(), {100000}, 7));
    int codec = -1;
    size_t wire = 0;
    ASSERT_EQ(gser_msg_get_frame_codec(got.get(), 1, &codec, &wire), GSER_OK);
    EXPECT_EQ(codec, GSER_COMPRESSION_NONE);
}

// The caller's own codec: used when the peer has it, refused when not.
TEST(Compress, CallerCodecNeedsThePeer)
{
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, 0, GSER_UCX_CAP_LZ4, GUX_CODECS));
    std::vector<unsigned char> bytes;
    MsgPtr m = runs_msg(ctx.get(), bytes, kBig);
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = GSER_COMPRESSION_ZSTD;
    EXPECT_EQ(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx.get(), m.get(), &so, kWaitMs), GSER_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("zstd"), std::string::npos);
    UCX_OK(gser_ucx_ep_get_status(cp.p.cep.get())); // nothing was sent: the endpoint goes on
    so.compression = GSER_COMPRESSION_AUTO;          // what both have: lz4
    UCX_OK(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx.get(), m.get(), &so, kWaitMs));
    MsgPtr got;
    UCX_OK(recv_one(cp, ctx.get(), &got));
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_bytes(got.get(), bytes));
    int codec = -1;
    size_t wire = 0;
    ASSERT_EQ(gser_msg_get_frame_codec(got.get(), 1, &codec, &wire), GSER_OK);
    EXPECT_EQ(codec, GSER_COMPRESSION_LZ4);
}

// Post a receive on the server's end of cp and drive both workers until
// it completes (frames not yet deserialized).
ReqPtr recv_done(CodecPair &cp)
{
    gser_ucx_request_t *rr = nullptr;
    EXPECT_EQ(gser_ucx_ep_recv_nb(cp.p.sep.get(), nullptr, &rr), GSER_OK) << gser_ucx_get_last_error();
    ReqPtr r(rr);
    EXPECT_EQ(drive({cp.p.client.get(), cp.p.server.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
    return r;
}

// What a completed receive came as, before deserializing: its bytes as sent
// and whether its header says frames are compressed (what a caller decides
// by whether to decompress off its event loop).
TEST(Compress, SizeOfAReceiveAsItCame)
{
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, GSER_UCX_COMPRESSION_LZ4));
    std::vector<unsigned char> bytes;
    MsgPtr m = runs_msg(ctx.get(), bytes, kBig);
    UCX_OK(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx.get(), m.get(), nullptr, kWaitMs));
    gser_ucx_request_t *pending = nullptr;
    UCX_OK(gser_ucx_ep_recv_nb(cp.p.sep.get(), nullptr, &pending));
    ReqPtr p(pending);
    size_t n = 7;
    bool compressed = true;
    EXPECT_EQ(gser_ucx_request_get_size(pending, nullptr, &compressed), GSER_ERR_INVALID_ARG);
    UCX_OK(drive({cp.p.client.get(), cp.p.server.get()}, pending));
    UCX_OK(gser_ucx_request_get_size(pending, &n, &compressed));
    EXPECT_TRUE(compressed);
    EXPECT_GT(n, 0u);
    EXPECT_LT(n, kBig / 10); // the compressed frame at its size as sent

    UCX_OK(gser_ucx_ep_set_compression(cp.p.cep.get(), GSER_UCX_COMPRESSION_NONE));
    std::thread t;
    std::atomic<int> sst;
    send_msg_async(cp, ctx.get(), m.get(), nullptr, &t, &sst);
    gser_ucx_request_t *plain = nullptr;
    UCX_OK(gser_ucx_ep_recv_nb(cp.p.sep.get(), nullptr, &plain));
    ReqPtr q(plain);
    size_t n2 = 0;
    bool c2 = true;
    EXPECT_EQ(gser_ucx_request_get_size(plain, &n2, &c2), GSER_ERR_STATE); // still running
    EXPECT_EQ(n2, 0u);
    gser_status_t rst = drive_recv(cp.p.server.get(), cp.p.client.get(), plain, sst);
    t.join();
    UCX_OK((gser_status_t)sst.load());
    UCX_OK(rst);
    UCX_OK(gser_ucx_request_get_size(plain, &n2, &c2));
    EXPECT_FALSE(c2);
    EXPECT_GT(n2, kBig);

    gser_msg_t *got = nullptr;
    UCX_OK(gser_ucx_request_deserialize(pending, ctx.get(), nullptr, &got));
    MsgPtr g(got);
    EXPECT_TRUE(same_bytes(got, bytes));
    EXPECT_EQ(gser_ucx_request_get_size(pending, &n, &compressed), GSER_ERR_STATE); // taken
}

// The detached half decompresses on a thread of its own while the worker's
// thread goes on with the same endpoint; the message arrives equal.
TEST(Compress, DetachedDeserializeRunsOffTheWorkersThread)
{
    auto ctx = make_ctx();
    CodecPair cp;
    // the whole-frame path (8 MiB would go in compressed chunks, decompressed on arrival)
    ASSERT_NO_FATAL_FAILURE(cp.open(0, GSER_UCX_COMPRESSION_ZSTD, GUX_CODECS, GUX_CODECS, false));
    std::vector<unsigned char> bytes;
    MsgPtr m = runs_msg(ctx.get(), bytes, 8 * kBig);
    UCX_OK(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx.get(), m.get(), nullptr, kWaitMs));
    ReqPtr big = recv_done(cp);
    ASSERT_TRUE(big);
    gser_msg_t *got = nullptr;
    std::atomic<int> dst{GSER_INPROGRESS};
    std::thread off([&] { dst.store(gser_ucx_request_deserialize_detached(big.get(), ctx.get(), nullptr, &got)); });
    // Meanwhile, on this thread: small messages both ways on the same endpoints.
    for (int i = 0; i < 20; i++) {
        TestMsg small(ctx.get(), {100}, i);
        UCX_OK(gser_ucx_ep_send_msg(cp.p.cep.get(), ctx.get(), small.msg.get(), nullptr, kWaitMs));
        MsgPtr back;
        UCX_OK(recv_one(cp, ctx.get(), &back));
        ASSERT_TRUE(back);
        EXPECT_TRUE(same_msg(back.get(), {100}, i));
    }
    off.join();
    UCX_OK((gser_status_t)dst.load());
    MsgPtr g(got);
    ASSERT_TRUE(got);
    EXPECT_TRUE(same_bytes(got, bytes));
    int codec = -1;
    size_t wire = 0;
    ASSERT_EQ(gser_msg_get_frame_codec(got, 1, &codec, &wire), GSER_OK);
    EXPECT_EQ(codec, GSER_COMPRESSION_ZSTD);
    gser_msg_t *again = nullptr;
    EXPECT_EQ(gser_ucx_request_deserialize_detached(big.get(), ctx.get(), nullptr, &again), GSER_ERR_STATE);
    EXPECT_EQ(again, nullptr);
    UCX_OK(gser_ucx_ep_get_status(cp.p.sep.get()));
}

// A peer that does not follow the handshake: frames compressed by hand
// (gser_serialize) and sent as they are.
class CompressHostile : public ::testing::TestWithParam<int> {};

TEST_P(CompressHostile, UnannouncedCodecRefused)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    CodecPair cp;
    uint32_t announced = codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_CAP_ZSTD : GSER_UCX_CAP_LZ4;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, 0, announced, GUX_CODECS));
    std::vector<unsigned char> bytes;
    MsgPtr m;
    auto f = runs_frames(ctx.get(), codec, m, bytes);
    ASSERT_TRUE(f);
    gser_ucx_request_t *sr = nullptr;
    UCX_OK(gser_ucx_ep_send_nb(cp.p.cep.get(), gser_frames_get_array(f.get()), gser_frames_get_count(f.get()), nullptr,
                               &sr));
    ReqPtr s(sr);
    MsgPtr got;
    EXPECT_EQ(recv_one(cp, ctx.get(), &got), GSER_ERR_COMPRESSED);
    std::string why = gser_ucx_get_last_error();
    EXPECT_NE(why.find("did not announce"), std::string::npos) << why;
    EXPECT_NE(why.find(codec == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd"), std::string::npos) << why;
    EXPECT_FALSE(got);
    EXPECT_EQ(gser_ucx_ep_get_status(cp.p.sep.get()), GSER_ERR_COMPRESSED); // the endpoint was closed
}

// Compressed data that is garbage, or cut to a different length than the
// header says, fails the receive with GSER_ERR_COMPRESSED or the frame
// error, and closes the endpoint; nothing crashes.
TEST_P(CompressHostile, CorruptDataRefused)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    for (int how = 0; how < 3; how++) {
        SCOPED_TRACE("corruption " + std::to_string(how));
        CodecPair cp;
        ASSERT_NO_FATAL_FAILURE(cp.open(0, 0));
        std::vector<unsigned char> bytes;
        MsgPtr m;
        auto f = runs_frames(ctx.get(), codec, m, bytes);
        ASSERT_TRUE(f);
        ASSERT_EQ(gser_frames_get_count(f.get()), 2u);
        std::vector<gser_frame_t> frames(gser_frames_get_array(f.get()), gser_frames_get_array(f.get()) + 2);
        std::vector<unsigned char> data((const unsigned char *)frames[1].data,
                                        (const unsigned char *)frames[1].data + frames[1].size);
        ASSERT_LT(data.size(), kBig / 10); // it was compressed
        if (how == 0)
            std::fill(data.begin(), data.end(), 0xff); // garbage
        else if (how == 1)
            std::fill(data.begin() + data.size() / 2, data.end(), 0); // the second half lost
        else
            data.resize(data.size() / 2); // shorter than the header says
        frames[1].data = data.data();
        frames[1].size = data.size();
        frames[1].release = nullptr;
        gser_ucx_request_t *sr = nullptr;
        UCX_OK(gser_ucx_ep_send_nb(cp.p.cep.get(), frames.data(), frames.size(), nullptr, &sr));
        ReqPtr s(sr);
        MsgPtr got;
        gser_status_t st = recv_one(cp, ctx.get(), &got);
        EXPECT_FALSE(got);
        if (how < 2) {
            EXPECT_EQ(st, GSER_ERR_COMPRESSED) << gser_status_str(st) << ": " << gser_ucx_get_last_error();
            EXPECT_EQ(gser_ucx_ep_get_status(cp.p.sep.get()), GSER_ERR_COMPRESSED);
        } else {
            EXPECT_TRUE(st == GSER_ERR_FRAME || st == GSER_ERR_COMPRESSED)
                << gser_status_str(st) << ": " << gser_ucx_get_last_error();
            EXPECT_NE(gser_ucx_ep_get_status(cp.p.sep.get()), GSER_OK);
        }
        drive({cp.p.client.get(), cp.p.server.get()}, sr, 2000);
    }
}

// Corrupt compressed data through the two halves: the detached one fails
// without touching the endpoint; reject then closes it, saying why. A
// status that is not about the bytes closes nothing.
TEST_P(CompressHostile, DetachedFailureClosesTheEndpointOnlyWhenRejected)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, 0));
    std::vector<unsigned char> bytes;
    MsgPtr m;
    auto f = runs_frames(ctx.get(), codec, m, bytes);
    ASSERT_TRUE(f);
    std::vector<gser_frame_t> frames(gser_frames_get_array(f.get()), gser_frames_get_array(f.get()) + 2);
    std::vector<unsigned char> data(frames[1].size, 0xff); // garbage in place of the compressed bytes
    frames[1].data = data.data();
    frames[1].release = nullptr;
    gser_ucx_request_t *sr = nullptr;
    UCX_OK(gser_ucx_ep_send_nb(cp.p.cep.get(), frames.data(), frames.size(), nullptr, &sr));
    ReqPtr s(sr);
    ReqPtr r = recv_done(cp);
    ASSERT_TRUE(r);
    size_t n = 0;
    bool compressed = false;
    UCX_OK(gser_ucx_request_get_size(r.get(), &n, &compressed));
    EXPECT_TRUE(compressed);
    gser_msg_t *got = nullptr;
    std::atomic<int> dst{GSER_INPROGRESS};
    std::string why;
    std::thread off([&] {
        dst.store(gser_ucx_request_deserialize_detached(r.get(), ctx.get(), nullptr, &got));
        why = gser_ucx_get_last_error(); // this thread's message
    });
    off.join();
    EXPECT_EQ(dst.load(), GSER_ERR_COMPRESSED);
    EXPECT_EQ(got, nullptr);
    EXPECT_NE(why.find("frame 1"), std::string::npos) << why;
    UCX_OK(gser_ucx_ep_get_status(cp.p.sep.get())); // not closed by the detached half
    EXPECT_EQ(gser_ucx_request_reject(r.get(), GSER_ERR_NO_MEMORY), GSER_ERR_NO_MEMORY);
    UCX_OK(gser_ucx_ep_get_status(cp.p.sep.get())); // not about the bytes: nothing closed
    EXPECT_EQ(gser_ucx_request_reject(r.get(), GSER_ERR_COMPRESSED), GSER_ERR_COMPRESSED);
    std::string closed = gser_ucx_get_last_error();
    EXPECT_NE(closed.find("the endpoint was closed"), std::string::npos) << closed;
    EXPECT_EQ(gser_ucx_ep_get_status(cp.p.sep.get()), GSER_ERR_COMPRESSED);
    EXPECT_EQ(gser_ucx_request_reject(nullptr, GSER_ERR_COMPRESSED), GSER_ERR_COMPRESSED);
    drive({cp.p.client.get(), cp.p.server.get()}, sr, 2000);
}

INSTANTIATE_TEST_SUITE_P(Codecs, CompressHostile, ::testing::Values(GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd");
                         });

// ---- compressed chunks (GSER_UCX_CAP_CHUNKED, docs/ucx.md 4.6) --------------------------------

constexpr size_t kChunked = 40u << 20; // 10 chunks of the default 4 MiB

// kChunked bytes: runs (compressible) but for the last 8 MiB, random (two
// chunks that do not shrink and must travel raw).
void chunked_bytes(std::vector<unsigned char> &b)
{
    b.resize(kChunked);
    for (size_t i = 0; i < kChunked - (8u << 20); i++)
        b[i] = (unsigned char)(i / 4096);
    std::mt19937 rng(11);
    for (size_t i = kChunked - (8u << 20); i < kChunked; i += 4) {
        uint32_t v = rng();
        std::memcpy(&b[i], &v, 4);
    }
}

gser_ucx_chunk_stats_t chunk_stats(gser_ucx_ep_t *ep)
{
    gser_ucx_chunk_stats_t s = GSER_UCX_CHUNK_STATS_INIT;
    EXPECT_EQ(gser_ucx_ep_get_chunk_stats(ep, &s), GSER_OK) << gser_ucx_get_last_error();
    return s;
}

// A message whose root is one buffer of kChunked bytes (chunked_bytes, into bytes).
void large_msg(gser_context_t *ctx, std::vector<unsigned char> &bytes, MsgPtr *out)
{
    chunked_bytes(bytes);
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    out->reset(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = bytes.data();
    d.nbytes = bytes.size();
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
}

// Send kChunked bytes (chunked_bytes) from the client of cp with send_msg; got is the message received.
void send_large(CodecPair &cp, gser_context_t *ctx, std::vector<unsigned char> &bytes, MsgPtr *got)
{
    MsgPtr msg;
    ASSERT_NO_FATAL_FAILURE(large_msg(ctx, bytes, &msg));
    std::thread t;
    std::atomic<int> sst;
    send_msg_async(cp, ctx, msg.get(), nullptr, &t, &sst);
    gser_status_t rst = recv_one(cp, ctx, got, &sst);
    t.join();
    UCX_OK((gser_status_t)sst.load());
    UCX_OK(rst);
    ASSERT_TRUE(*got);
}

class Chunked : public ::testing::TestWithParam<int> {};

// A large compressible frame goes in compressed chunks, the incompressible
// ones raw, and arrives equal, uncompressed in the message.
TEST_P(Chunked, LargeFrameGoesInChunksAndArrivesEqual)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(
        cp.open(0, codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_COMPRESSION_LZ4 : GSER_UCX_COMPRESSION_ZSTD));
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(cp.p.cep.get(), &info));
    EXPECT_TRUE(info.caps & GSER_UCX_CAP_CHUNKED);
    std::vector<unsigned char> bytes;
    MsgPtr got;
    ASSERT_NO_FATAL_FAILURE(send_large(cp, ctx.get(), bytes, &got));
    EXPECT_TRUE(same_bytes(got.get(), bytes));
    int c = -1;
    size_t wire = 0;
    ASSERT_EQ(gser_msg_get_frame_codec(got.get(), 1, &c, &wire), GSER_OK);
    EXPECT_EQ(c, GSER_COMPRESSION_NONE) << "the transport decompressed it: the header has it raw";
    EXPECT_EQ(wire, kChunked);
    auto s = chunk_stats(cp.p.cep.get());
    EXPECT_EQ(s.frames_sent, 1u);
    EXPECT_EQ(s.chunks_sent, 10u);
    EXPECT_EQ(s.chunks_compressed, 8u) << "the two random chunks went raw";
    auto r = chunk_stats(cp.p.sep.get());
    EXPECT_EQ(r.frames_received, 1u);
    EXPECT_EQ(r.chunks_received, 10u);
    EXPECT_EQ(r.chunks_raw_received, 2u);
    // a second message on the same endpoints: sequence numbers and buffers carry on
    MsgPtr again;
    std::vector<unsigned char> bytes2;
    ASSERT_NO_FATAL_FAILURE(send_large(cp, ctx.get(), bytes2, &again));
    EXPECT_TRUE(same_bytes(again.get(), bytes2));
    EXPECT_EQ(chunk_stats(cp.p.sep.get()).chunks_received, 20u);
}

// A frame in chunks over the receiver's limits (its raw size counts, not
// what the chunks will carry) is refused from the head, before any chunk
// buffer; the sender, whose chunks are then never received, learns that
// the connection is gone instead of waiting for its timeout.
TEST_P(Chunked, AFrameOverTheReceiversLimitsFailsBothSides)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    gser_limits_t lims = GSER_LIMITS_INIT;
    lims.max_bytes = 16u << 20; // the chunks of kChunked would carry less than this
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_COMPRESSION_LZ4
                                                                      : GSER_UCX_COMPRESSION_ZSTD,
                                    GUX_CODECS, GUX_CODECS, true, &lims));
    std::vector<unsigned char> bytes;
    MsgPtr msg;
    ASSERT_NO_FATAL_FAILURE(large_msg(ctx.get(), bytes, &msg));
    std::thread t;
    std::atomic<int> sst;
    send_msg_async(cp, ctx.get(), msg.get(), nullptr, &t, &sst);
    MsgPtr got;
    gser_status_t rst = recv_one(cp, ctx.get(), &got, &sst);
    EXPECT_EQ(rst, GSER_ERR_LIMIT_BYTES) << gser_ucx_get_last_error();
    EXPECT_EQ(gser_ucx_ep_get_status(cp.p.sep.get()), GSER_ERR_LIMIT_BYTES);
    // The receiving side goes on progressing, as a live process does.
    bool ended = drive_until({cp.p.server.get()}, [&] { return sst.load() != GSER_INPROGRESS; });
    t.join();
    EXPECT_TRUE(ended) << "the sender was still in send_msg after the receiver refused the message";
    // Where every chunk left the sender before the receiver's close arrived
    // (the receiver drains them, truncated, so that the rendezvous sends
    // complete), send_msg has nothing left to fail and returns OK; the
    // endpoint must still learn that the connection is gone.
    EXPECT_TRUE(sst.load() == GSER_ERR_CONNECTION || sst.load() == GSER_OK)
        << gser_status_str((gser_status_t)sst.load()) << ": " << gser_ucx_get_last_error();
    bool failed = drive_until({cp.p.server.get(), cp.p.client.get()},
                              [&] { return gser_ucx_ep_get_status(cp.p.cep.get()) != GSER_OK; });
    EXPECT_TRUE(failed) << "the sender's endpoint never learnt that the receiver closed";
    EXPECT_EQ(gser_ucx_ep_get_status(cp.p.cep.get()), GSER_ERR_CONNECTION);
    EXPECT_EQ(chunk_stats(cp.p.sep.get()).chunks_received, 0u);
}

// A peer that does not announce the capability (an older build) gets
// today's path: the frame compressed whole by the serializer, no chunk.
TEST_P(Chunked, APeerWithoutTheCapGetsWholeFrames)
{
    int codec = GetParam();
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_COMPRESSION_LZ4
                                                                      : GSER_UCX_COMPRESSION_ZSTD,
                                    GUX_CODECS, GUX_CODECS, false));
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(cp.p.cep.get(), &info));
    EXPECT_FALSE(info.caps & GSER_UCX_CAP_CHUNKED);
    std::vector<unsigned char> bytes;
    MsgPtr got;
    ASSERT_NO_FATAL_FAILURE(send_large(cp, ctx.get(), bytes, &got));
    EXPECT_TRUE(same_bytes(got.get(), bytes));
    int c = -1;
    size_t wire = 0;
    ASSERT_EQ(gser_msg_get_frame_codec(got.get(), 1, &c, &wire), GSER_OK);
    EXPECT_EQ(c, codec) << "compressed whole, as before";
    EXPECT_LT(wire, kChunked);
    EXPECT_EQ(chunk_stats(cp.p.cep.get()).chunks_sent, 0u);
    EXPECT_EQ(chunk_stats(cp.p.sep.get()).chunks_received, 0u);
}

// A peer that announces capability bits this build does not know is
// accepted as before (and sees ours); the chunk options are checked.
TEST(ChunkedCaps, UnknownBitsAreAcceptedAndOptionsChecked)
{
    Pair p;
    p.ctx = make_ucx_ctx();
    ASSERT_TRUE(p.ctx);
    p.server = make_worker(p.ctx.get());
    p.client = make_worker(p.ctx.get());
    ASSERT_TRUE(p.server && p.client);
    p.ctx->caps |= 1u << 20; // a bit of a later build, in every hello of this context
    p.listener = listen_local(p.server.get());
    ASSERT_TRUE(p.listener);
    ASSERT_NO_FATAL_FAILURE(p.connect(&p.cep, &p.sep));
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    UCX_OK(gser_ucx_ep_get_peer_info(p.sep.get(), &info));
    EXPECT_TRUE(info.caps & (1u << 20));
    EXPECT_TRUE(info.caps & GSER_UCX_CAP_CHUNKED);

    gser_ucx_worker_options_t o = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_ucx_worker_t *w = nullptr;
    for (size_t bad : {GSER_UCX_CHUNK_MIN - 1, GSER_UCX_CHUNK_MAX + 1}) {
        o.chunked_size = bad;
        EXPECT_EQ(gser_ucx_worker_create(p.ctx.get(), &o, &w), GSER_ERR_INVALID_ARG);
        EXPECT_NE(std::string(gser_ucx_get_last_error()).find("chunked_size"), std::string::npos);
    }
    EXPECT_EQ(w, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Codecs, Chunked, ::testing::Values(GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd");
                         });

// What a hostile sender puts on the wire by hand: a head with one frame in
// compressed chunks (entry fields patched), then chunk messages.
struct Crafted {
    uint64_t raw = 2u << 20;    // the frame's size in the head
    uint32_t chunk = 1u << 20;  // chunk size in the head
    unsigned codec = GSER_COMPRESSION_LZ4;
    std::vector<std::vector<unsigned char>> chunks; // each with its flag byte
};

std::vector<unsigned char> zchunk_of(const std::vector<unsigned char> &raw, unsigned flags, bool compress = true)
{
    std::vector<unsigned char> out(1 + LZ4_compressBound((int)raw.size()));
    out[0] = (unsigned char)flags;
    if (!compress) {
        out.resize(1);
        out.insert(out.end(), raw.begin(), raw.end());
        return out;
    }
    int n = LZ4_compress_default((const char *)raw.data(), (char *)out.data() + 1, (int)raw.size(),
                                 (int)out.size() - 1);
    out.resize(1 + (size_t)n);
    return out;
}

struct HostileCase {
    const char *name;
    gser_status_t want;
    const char *says;
    std::function<void(Crafted &)> make;
};

class ChunkedHostile : public ::testing::TestWithParam<HostileCase> {};

TEST_P(ChunkedHostile, RefusedWithItsStatusClosingOnlyThatEndpoint)
{
    const HostileCase &hc = GetParam();
    Crafted cr;
    hc.make(cr);
    std::vector<unsigned char> head;
    std::vector<void *> sends; // declared before the pair: their buffers outlive it
    auto ctx = make_ctx();
    CodecPair cp;
    ASSERT_NO_FATAL_FAILURE(cp.open(0, 0, GUX_CODECS, GUX_CODECS, std::string(hc.name) != "unannounced"));
    EpPtr cep2, sep2; // another peer of the same worker: untouched
    ASSERT_NO_FATAL_FAILURE(cp.p.connect(&cep2, &sep2));
    char hdr[32] = {1};
    static char dummy;
    gser_frame_t frames[2] = {};
    frames[0].data = hdr;
    frames[0].size = sizeof hdr;
    frames[1].data = &dummy;
    frames[1].size = (size_t)cr.raw;
    uint8_t routes[2];
    size_t len = 0;
    gux_route_policy_t pol = {8192, 65536, false, 1};
    ASSERT_EQ(gux_head_plan(frames, 2, &pol, routes, &len), GSER_OK);
    ASSERT_EQ(routes[1], GUX_ROUTE_ZCHUNKED);
    head.resize(len);
    gser_ucx_ep_t *ep = cp.p.cep.get();
    uint32_t seq = ep->send_seq++ & GUX_SEQ_MASK;
    gux_head_write(frames, 2, routes, seq, 0, head.data(), len);
    gux_head_set_zchunks(head.data(), 2, routes, (int)cr.codec, cr.chunk);
    auto post = [&](unsigned kind, const std::vector<unsigned char> &b) {
        ucp_request_param_t p;
        std::memset(&p, 0, sizeof p);
        ucs_status_ptr_t sp = ucp_tag_send_nbx(ep->ucp, b.data(), b.size(), gux_tag(ep->peer_id, kind, seq), &p);
        ASSERT_FALSE(UCS_PTR_IS_ERR(sp));
        if (sp)
            sends.push_back(sp);
    };
    post(GUX_KIND_HEAD, head);
    for (auto &c : cr.chunks)
        post(GUX_KIND_ZCHUNK, c);
    MsgPtr got;
    gser_status_t st = recv_one(cp, ctx.get(), &got);
    std::string why = gser_ucx_get_last_error();
    EXPECT_EQ(st, hc.want) << gser_status_str(st) << ": " << why;
    EXPECT_NE(why.find(hc.says), std::string::npos) << why;
    EXPECT_FALSE(got);
    EXPECT_EQ(gser_ucx_ep_get_status(cp.p.sep.get()), hc.want); // closed
    UCX_OK(gser_ucx_ep_get_status(sep2.get()));                 // the other peer goes on
    for (void *sp : sends) {
        drive_until({cp.p.client.get(), cp.p.server.get()},
                    [&] { return ucp_request_check_status(sp) != UCS_INPROGRESS; }, 2000);
        ucp_request_free(sp);
    }
    close_driving(cep2, cp.p.server.get());
}

std::vector<unsigned char> mib_of(unsigned char v, size_t n = 1u << 20) { return std::vector<unsigned char>(n, v); }

const HostileCase kHostile[] = {
    {"chunk_size", GSER_ERR_COMPRESSED, "compressed chunk size", [](Crafted &c) { c.chunk = 512u << 10; }},
    {"big_chunk_size", GSER_ERR_COMPRESSED, "compressed chunk size", [](Crafted &c) { c.chunk = 8u << 20; }},
    {"codec", GSER_ERR_COMPRESSED, "unknown codec", [](Crafted &c) { c.codec = 7; }},
    {"unannounced", GSER_ERR_COMPRESSED, "did not announce", [](Crafted &) {}},
    {"over_limits", GSER_ERR_LIMIT_BYTES, "limit", [](Crafted &c) { c.raw = (uint64_t)1 << 50; }},
    {"too_few", GSER_ERR_COMPRESSED, "frame 1, chunk 1: marked the last",
     [](Crafted &c) {
         c.raw = 3u << 20;
         c.chunks = {zchunk_of(mib_of(1), 0), zchunk_of(mib_of(2), GUX_ZCHUNK_LAST)};
     }},
    {"too_many", GSER_ERR_COMPRESSED, "frame 1, chunk 1: not marked the last",
     [](Crafted &c) {
         c.chunks = {zchunk_of(mib_of(1), 0), zchunk_of(mib_of(2), 0), zchunk_of(mib_of(3), GUX_ZCHUNK_LAST)};
     }},
    {"bomb", GSER_ERR_COMPRESSED, "frame 1, chunk 0:",
     [](Crafted &c) { c.chunks = {zchunk_of(mib_of(0, 64u << 20), 0), zchunk_of(mib_of(2), GUX_ZCHUNK_LAST)}; }},
    {"short", GSER_ERR_COMPRESSED, "frame 1, chunk 1:",
     [](Crafted &c) { c.chunks = {zchunk_of(mib_of(1), 0), zchunk_of(mib_of(2, 1000), GUX_ZCHUNK_LAST)}; }},
    {"raw_wrong_size", GSER_ERR_COMPRESSED, "frame 1, chunk 0: a raw chunk",
     [](Crafted &c) { c.chunks = {zchunk_of(mib_of(1, 1000), GUX_ZCHUNK_RAW, false)}; }},
    {"too_long", GSER_ERR_COMPRESSED, "frame 1, chunk 0: longer",
     [](Crafted &c) { c.chunks = {zchunk_of(mib_of(1, (1u << 20) + 100), GUX_ZCHUNK_RAW, false)}; }},
    {"flags", GSER_ERR_COMPRESSED, "frame 1, chunk 0: unknown flags",
     [](Crafted &c) { c.chunks = {zchunk_of(mib_of(1), 0x80)}; }},
};

INSTANTIATE_TEST_SUITE_P(Cases, ChunkedHostile, ::testing::ValuesIn(kHostile),
                         [](const ::testing::TestParamInfo<HostileCase> &i) { return std::string(i.param.name); });

} // namespace
