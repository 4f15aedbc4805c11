// Link-aware compression (docs/ucx.md 4.5): the model that picks raw, lz4 or
// zstd from the measured send rate and codec speeds, with measurements
// injected so that every decision is deterministic; the endpoint's rate
// measurement from timed sends; and on real endpoints: the decision the
// endpoint reports, a forced codec that stays forced, a peer without codecs
// that gets raw frames, small messages that cost no sample.
#include "ucx_common.hpp"

#include <limits>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/mman.h>
#include <random>
#include <thread>
#include <type_traits>

extern "C" {
#include "internal.h"
}

namespace {

constexpr double kMiB = 1 << 20;
constexpr size_t k64M = 64u << 20;

using LinkCodec = std::remove_reference_t<decltype(gux_link_model_t{}.codec[0])>;

// A codec as sampled once: ratio, seconds a byte each way (the same on
// data it shrank, where it did).
LinkCodec sampled(double ratio, double ctime, double dtime)
{
    LinkCodec c{};
    c.known = true;
    c.ratio = ratio;
    c.ctime = c.shrunk_ctime = ctime;
    c.dtime = c.shrunk_dtime = dtime;
    c.shrunk = ratio <= GSER_COMPRESS_THRESHOLD;
    return c;
}

// Speeds of this kind of machine's cores (bytes per second).
gux_link_model_t model(double rate)
{
    gux_link_model_t m{};
    m.rate = rate;
    m.codec[0] = sampled(0.5, 1 / 500e6, 1 / 2e9);  // lz4: halves, fast
    m.codec[1] = sampled(0.3, 1 / 150e6, 1 / 800e6); // zstd: smaller, slower
    return m;
}

// lz4 and zstd sampled at model()'s speeds.
void add_model_codecs(gux_link_t *l)
{
    gux_link_model_t ref = model(0);
    gux_link_add_codec(l, GSER_COMPRESSION_LZ4, ref.codec[0].ratio, ref.codec[0].ctime, ref.codec[0].dtime);
    gux_link_add_codec(l, GSER_COMPRESSION_ZSTD, ref.codec[1].ratio, ref.codec[1].ctime, ref.codec[1].dtime);
}

TEST(LinkModel, Times)
{
    gux_link_model_t m = model(100e6);
    EXPECT_DOUBLE_EQ(gux_link_time(&m, GSER_COMPRESSION_NONE, 100000000, 0), 1.0);
    // whole: compress, send, decompress in turn (the codecs' sampled times
    // 1.5 times: a sample is small and cached)
    EXPECT_NEAR(gux_link_time(&m, GSER_COMPRESSION_LZ4, 100000000, 0), 0.3 + 0.5 + 0.075, 1e-9);
    // 4 chunks of 25 MB: the wire (0.125 s each) sets the pace against the
    // codecs (0.075 + 0.01875), the first compression and the last
    // decompression fill and drain the pipe
    EXPECT_NEAR(gux_link_time(&m, GSER_COMPRESSION_LZ4, 100000000, 25000000), 3 * 0.125 + 0.075 + 0.125 + 0.01875,
                1e-9);
    // where compressing is slower than the wire, it sets the pace
    m.rate = 1e9;
    EXPECT_NEAR(gux_link_time(&m, GSER_COMPRESSION_LZ4, 100000000, 25000000), 3 * 0.075 + 0.075 + 0.0125 + 0.01875,
                1e-9);
    gux_link_model_t unknown{};
    EXPECT_LT(gux_link_time(&unknown, GSER_COMPRESSION_NONE, 1, 0), 0);
    m.codec[1].known = false;
    EXPECT_LT(gux_link_time(&m, GSER_COMPRESSION_ZSTD, 1, 0), 0);
}

// The first large message goes raw: it measures the link.
TEST(LinkModel, UnmeasuredLinkGoesRaw)
{
    gux_link_model_t m = model(0);
    EXPECT_EQ(gux_link_choose(&m, k64M, 0, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GSER_UCX_CAP_ZSTD, nullptr), GSER_COMPRESSION_NONE);
}

TEST(LinkModel, SlowLinkTakesTheSmallest)
{
    gux_link_model_t m = model(12.5e6); // 100 Mbit/s
    double t[3];
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GUX_CODECS, t), GSER_COMPRESSION_ZSTD);
    EXPECT_LT(t[2], t[1]);
    EXPECT_LT(t[1], t[0]);
    // without zstd on both sides, lz4
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GSER_UCX_CAP_LZ4, nullptr), GSER_COMPRESSION_LZ4);
}

TEST(LinkModel, FastLinkSendsRaw)
{
    gux_link_model_t m = model(2e9); // faster than either codec compresses
    double t[3];
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GUX_CODECS, t), GSER_COMPRESSION_NONE);
    EXPECT_LT(t[0], t[1]);
    EXPECT_LT(t[0], t[2]);
}

TEST(LinkModel, DataThatDoesNotShrinkGoesRaw)
{
    gux_link_model_t m = model(12.5e6);
    m.codec[0].ratio = 1;
    m.codec[1].ratio = 1;
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    // shrinking, but not to gser's threshold (0.9: the serializer and the
    // chunks would send it as it is), on a link where the model would
    // still have it pay: raw
    m = model(125e6);
    m.codec[0].ratio = 1;
    m.codec[1] = sampled(0.94, 1 / 2e9, 1 / 4e9); // random float64 under zstd
    gux_link_model_t pays = m;
    pays.codec[1].ratio = 0.9;
    double t[3];
    ASSERT_EQ(gux_link_choose(&pays, k64M, 4 << 20, GUX_CODECS, t), GSER_COMPRESSION_ZSTD);
    ASSERT_LT(gux_link_time(&m, GSER_COMPRESSION_ZSTD, k64M, 4 << 20), 0.97 * t[0]);
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GUX_CODECS, t), GSER_COMPRESSION_NONE);
    EXPECT_EQ(t[2], 0);
}

// At 1 Gbit/s lz4 compressing to half loses whole (5 + 4 + 1.5 ns a byte,
// the codecs' sampled 3.3 and 1 times 1.5, against 8) and wins pipelined
// (compressing, 5, the slowest stage, against raw's 8).
TEST(LinkModel, PipeliningCounts)
{
    gux_link_model_t m{};
    m.rate = 125e6;
    m.codec[0] = sampled(0.5, 1 / 300e6, 1 / 1e9);
    EXPECT_EQ(gux_link_choose(&m, k64M, 0, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    EXPECT_EQ(gux_link_choose(&m, k64M, 4 << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_LZ4);
}

// A codec that saves less than the margin leaves the data raw (no CPU
// spent on either side for nothing measurable).
TEST(LinkModel, MarginKeepsRaw)
{
    gux_link_model_t m{};
    m.rate = 100e6;
    m.codec[0] = sampled(0.98, 1 / 1e12, 1 / 1e12); // 2 % smaller, for free
    EXPECT_EQ(gux_link_choose(&m, k64M, 0, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    m.codec[0].ratio = 0.9;
    EXPECT_EQ(gux_link_choose(&m, k64M, 0, GUX_CODECS, nullptr), GSER_COMPRESSION_LZ4);
}

// A link that gets busy: the rate's moving average follows it within a
// few windows, and the choice turns from raw to zstd; and back.
TEST(LinkModel, FollowsALinkThatGetsBusy)
{
    gux_link_t l{};
    add_model_codecs(&l);
    for (int i = 0; i < 5; i++)
        gux_link_add_rate(&l, 2e9, true);
    EXPECT_EQ(gux_link_choose(&l.m, k64M, 4 << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    int n = 0;
    while (gux_link_choose(&l.m, k64M, 4 << 20, GUX_CODECS, nullptr) != GSER_COMPRESSION_ZSTD && n < 100) {
        gux_link_add_rate(&l, 12.5e6, true);
        n++;
    }
    EXPECT_GE(n, 2);
    EXPECT_LE(n, 12);
    for (n = 0; gux_link_choose(&l.m, k64M, 4 << 20, GUX_CODECS, nullptr) != GSER_COMPRESSION_NONE && n < 100; n++)
        gux_link_add_rate(&l, 2e9, true);
    EXPECT_LE(n, 12);
    EXPECT_GE(l.rate_samples, 7u);
    // nonsense measurements are ignored
    double before = l.m.rate;
    gux_link_add_rate(&l, 0, true);
    gux_link_add_rate(&l, -1, true);
    gux_link_add_rate(&l, std::numeric_limits<double>::infinity(), true);
    EXPECT_EQ(l.m.rate, before);
}

// Compressed sends may have waited on CPU, or completed into socket
// buffers: their rate is kept apart, never the link's.
TEST(LinkModel, CompressedSendsDoNotSetTheRate)
{
    gux_link_t l{};
    gux_link_add_rate(&l, 1e9, true);
    for (double r : {1e8, 4e9})
        for (int i = 0; i < 10; i++)
            gux_link_add_rate(&l, r, false);
    EXPECT_DOUBLE_EQ(l.m.rate, 1e9);
    EXPECT_GT(l.zrate, 3.5e9);
    EXPECT_EQ(l.rate_samples, 21u);
}

// The rate of timed sends is bytes over busy time, a window being a whole
// busy period (or GUX_LINK_WIN_MS of one) of at least 8 MiB: gaps with
// nothing in flight (compressing, idle) do not count.
TEST(LinkModel, RateFromTimedSends)
{
    gux_link_t l{};
    // the first busy period: 8 MiB in 20 ms (nothing measured yet: any
    // period of a mebibyte counts)
    gux_link_posted(&l, 0, true);
    gux_link_posted(&l, 0, true);
    gux_link_done(&l, 4 << 20, 10);
    EXPECT_EQ(l.rate_samples, 0u); // the period goes on
    gux_link_done(&l, 4 << 20, 20);
    ASSERT_EQ(l.rate_samples, 1u);
    EXPECT_NEAR(l.m.rate, 8 * kMiB / 0.020, 1);
    // 980 ms idle, then 16 MiB in 40 ms: the gap does not count
    gux_link_posted(&l, 1000, true);
    gux_link_done(&l, 16 << 20, 1040);
    EXPECT_EQ(l.rate_samples, 2u);
    EXPECT_NEAR(l.m.rate, 8 * kMiB / 0.020, 1);
    // a busy period under 8 MiB measures nothing once the link is measured,
    // and is not joined to the next
    gux_link_posted(&l, 2000, true);
    gux_link_done(&l, 4 << 20, 2001);
    EXPECT_EQ(l.rate_samples, 2u);
    EXPECT_EQ(l.win_bytes, 0);
    EXPECT_EQ(l.inflight, 0u);
    // a long busy period is measured every GUX_LINK_WIN_MS
    for (int i = 0; i < 4; i++)
        gux_link_posted(&l, 3000, true);
    gux_link_done(&l, 8 << 20, 3600);
    EXPECT_EQ(l.rate_samples, 2u);
    gux_link_done(&l, 8 << 20, 4100);
    EXPECT_EQ(l.rate_samples, 3u);
    EXPECT_EQ(l.inflight, 2u);
    // a window of raw and compressed sends measures neither
    gux_link_t m{};
    gux_link_posted(&m, 0, true);
    gux_link_posted(&m, 0, false);
    gux_link_done(&m, 4 << 20, 10);
    gux_link_done(&m, 4 << 20, 20);
    EXPECT_EQ(m.rate_samples, 0u);
    EXPECT_EQ(m.win_bytes, 0);
    gux_link_posted(&m, 30, false);
    gux_link_done(&m, 8 << 20, 40);
    EXPECT_EQ(m.rate_samples, 1u);
    EXPECT_NEAR(m.zrate, 8 * kMiB / 0.010, 1);
    // compressed sends that UCX completed at once leave no trace in the
    // next raw message's window
    gux_link_posted(&m, 100, false);
    gux_link_at_once(&m, 1 << 20, 100, true);
    gux_link_posted(&m, 200, true);
    gux_link_done(&m, 8 << 20, 220);
    EXPECT_EQ(m.rate_samples, 2u);
    EXPECT_NEAR(m.m.rate, 8 * kMiB / 0.020, 1);
}

// After idle, the sockets' buffers take a buffer-full at once and sends
// complete early; the rate is not what they say. The completions of a
// 64 MiB message of three 22.4 MB columns at 1 Gbit/s (tbf, 120 MB/s of
// payload), as measured: 238, 272 and 541 ms after posting (the second
// 34 ms after the first). In 20 ms windows these measured 209 MB/s.
TEST(LinkModel, BufferBurstIsNotTheLinksRate)
{
    const double col = 22369620, link = 3 * col / 0.541;
    gux_link_t l{};
    for (int msg = 0; msg < 3; msg++) {
        double t0 = 1000.0 * msg;
        for (int i = 0; i < 3; i++)
            gux_link_posted(&l, t0, true);
        for (double at : {238.0, 272.0, 541.0})
            gux_link_done(&l, (size_t)col, t0 + at);
    }
    EXPECT_EQ(l.rate_samples, 3u);
    EXPECT_NEAR(l.m.rate, link, 0.01 * link);
    // buffer-sized bursts after idle (messages the buffers take at once)
    // do not raise it
    for (int i = 0; i < 20; i++) {
        gux_link_posted(&l, 5000 + 100 * i, true);
        gux_link_done(&l, 4 << 20, 5000 + 100 * i + 1);
    }
    EXPECT_NEAR(l.m.rate, link, 0.01 * link);
}

// A codec whose messages take twice what the model says (its sample is
// small and cached; a message is neither) gets de-rated from its own
// sends: the choice turns to the other codec. The run is measured from its
// decision to its last completion, once its bytes crossed.
TEST(LinkModel, CodecSlowerThanItsSampleIsDerated)
{
    gux_link_t l{};
    add_model_codecs(&l);
    gux_link_add_rate(&l, 60e6, true);
    l.warm = true; // past the endpoint's first, cold, compressed message (ColdRunIsNotMeasured)
    const size_t chunk = 4 << 20;
    double t[3];
    ASSERT_EQ(gux_link_choose(&l.m, k64M, chunk, GUX_CODECS, t), GSER_COMPRESSION_LZ4);
    ASSERT_LT(t[1], t[2]);
    ASSERT_GT(2 * t[1], t[2]);
    double est = t[1];
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, est, 0);
    // the pipe drains before the run's bytes crossed (the sender is still
    // compressing the rest): not measured yet
    gux_link_posted(&l, 1, false);
    gux_link_done(&l, 1 << 20, 10);
    EXPECT_EQ(l.runs, 0u);
    // the rest, done at twice the model's time
    gux_link_posted(&l, 20, false);
    gux_link_done(&l, 31 << 20, 2 * est * 1e3);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[0].fix, 2.0, 1e-9);
    EXPECT_NEAR(gux_link_time(&l.m, GSER_COMPRESSION_LZ4, k64M, chunk), 2 * est, 1e-9);
    EXPECT_EQ(gux_link_choose(&l.m, k64M, chunk, GUX_CODECS, nullptr), GSER_COMPRESSION_ZSTD);
    // zstd, its sends completing at once (they fit the buffers): its run
    // ends with the last of them, at the model's time: fix 1
    double zest = gux_link_time(&l.m, GSER_COMPRESSION_ZSTD, k64M, chunk);
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, zest, 10000);
    for (int i = 1; i <= 4; i++) {
        gux_link_posted(&l, 10000, false);
        gux_link_at_once(&l, (size_t)(0.3 * k64M / 4), 10000 + i * zest * 1e3 / 4, true);
    }
    ASSERT_EQ(l.runs, 2u);
    EXPECT_NEAR(l.m.codec[1].fix, 1.0, 1e-9);
    // lz4 faster on the next run: the fix averages toward it
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, est, 20000);
    gux_link_posted(&l, 20000, false);
    gux_link_done(&l, 32 << 20, 20000 + est * 1e3);
    EXPECT_NEAR(l.m.codec[0].fix, 1.5, 1e-9);
    // nonsense is ignored
    gux_link_add_fix(&l, GSER_COMPRESSION_LZ4, 0, 1);
    gux_link_add_fix(&l, GSER_COMPRESSION_LZ4, 1, 0);
    gux_link_add_fix(&l, GSER_COMPRESSION_NONE, 1, 1);
    EXPECT_EQ(l.runs, 3u);
}

// A message marked posted (gser_ucx_ep_mark_posted) is timed by its send
// requests, however small their sends: a 100 Mbit/s shuffle's message of
// 22.7 MB went zstd in frames of under 64 KiB each, which time nothing; its
// run, timed by the bytes its sample predicted, stayed open through the
// sends after it and "took" 3 s for 0.6 s of wire (fix 6.25: the endpoint
// went raw, the shuffle 1.8 times slower).
TEST(LinkModel, MarkedMessageIsTimedByItsRequests)
{
    gux_link_t l{};
    add_model_codecs(&l);
    gux_link_add_rate(&l, 12.5e6, true);
    l.warm = true;
    const double raw = 22.7e6, est = 0.5;
    // unmarked (as before): the run's timed bytes fall short of the
    // sample's prediction, and a later message's timed send extends it
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, raw, est, 0);
    gux_link_posted(&l, 1, false);
    gux_link_done(&l, 1 << 20, 550);
    EXPECT_EQ(l.runs, 0u);
    gux_link_posted(&l, 2900, false); // the next message's, undecided (under 1 MiB)
    gux_link_done(&l, 100 << 10, 3000);
    gux_link_run_settle(&l);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[1].fix, 6.0, 1e-9);

    // marked: the run ends with its last request, at 1.1 times the model
    gux_link_t m{};
    add_model_codecs(&m);
    gux_link_add_rate(&m, 12.5e6, true);
    m.warm = true;
    gux_link_run_note(&m, GSER_COMPRESSION_ZSTD, raw, est, 0);
    uint64_t a = gux_link_run_join(&m, 0, false), b = gux_link_run_join(&m, 0, false);
    ASSERT_NE(a, 0u);
    ASSERT_EQ(a, b); // (its two parts)
    gux_link_run_posted(&m);
    EXPECT_EQ(gux_link_run_join(&m, 0, false), 0u); // a send after the message is not the run's
    gux_link_posted(&m, 1, false);
    gux_link_done(&m, 1 << 20, 300); // its timed sends say nothing of its end
    gux_link_run_req_done(&m, a, true, 400);
    EXPECT_EQ(m.runs, 0u);
    gux_link_run_req_done(&m, b, true, 550);
    ASSERT_EQ(m.runs, 1u);
    EXPECT_NEAR(m.m.codec[1].fix, 1.1, 1e-9);
    gux_link_posted(&m, 2900, false);
    gux_link_done(&m, 100 << 10, 3000);
    gux_link_run_settle(&m);
    EXPECT_EQ(m.runs, 1u);
    EXPECT_NEAR(m.m.codec[1].fix, 1.1, 1e-9);

    // a message queued behind an open run joins it until it is posted too;
    // a request of an older run, or a failed one, times nothing
    gux_link_run_note(&m, GSER_COMPRESSION_ZSTD, raw, est, 5000);
    uint64_t c = gux_link_run_join(&m, 0, false);
    gux_link_run_posted(&m);
    gux_link_run_note(&m, GSER_COMPRESSION_ZSTD, raw, est, 5100);
    uint64_t d = gux_link_run_join(&m, 0, false);
    ASSERT_EQ(c, d);
    gux_link_run_req_done(&m, a, true, 5200); // (the closed run's id)
    gux_link_run_req_done(&m, c, true, 5300);
    EXPECT_EQ(m.runs, 1u); // d is still out, and the second message not marked
    gux_link_run_posted(&m);
    gux_link_run_req_done(&m, d, true, 6100); // both: 1.1 s for 1.0 modelled
    ASSERT_EQ(m.runs, 2u);
    EXPECT_NEAR(m.m.codec[1].fix, 0.5 * 1.1 + 0.5 * 1.1, 1e-9);
    gux_link_run_note(&m, GSER_COMPRESSION_ZSTD, raw, est, 7000);
    uint64_t e = gux_link_run_join(&m, 0, false);
    gux_link_run_posted(&m);
    gux_link_run_req_done(&m, e, false, 9000);
    gux_link_run_settle(&m);
    EXPECT_EQ(m.runs, 2u);
}

// A marked run's requests say how many bytes its messages compressed to:
// over what the samples' ratio said, that corrects the codec's ratio in the
// model (rfix). A shuffle's samples said 0.04-0.17 under zstd where its
// messages went at 0.29.
TEST(LinkModel, MessagesRatioCorrectsTheSamples)
{
    gux_link_t l{};
    add_model_codecs(&l); // lz4 0.5, zstd 0.3
    gux_link_add_rate(&l, 12.5e6, true);
    l.warm = true;
    const size_t raw = 22u << 20, chunk = 4u << 20;
    ASSERT_EQ(gux_link_choose(&l.m, raw, chunk, GUX_CODECS, nullptr), GSER_COMPRESSION_ZSTD);
    const double zt = gux_link_time(&l.m, GSER_COMPRESSION_ZSTD, raw, chunk);
    const double lt = gux_link_time(&l.m, GSER_COMPRESSION_LZ4, raw, chunk);
    // zstd's message compressed to 0.6, in two parts, and took the wire's
    // time for that: its last send completed as the socket's buffer took
    // its last 3 MiB, which went on the wire after (the wire sets this
    // pipe's pace: the buffer was full)
    const double sent = 2 * (double)(size_t)(0.3 * raw), zreal = sent / 12.5e6;
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)raw, zt, 0);
    uint64_t a = gux_link_run_join(&l, (size_t)(0.3 * raw), false);
    uint64_t b = gux_link_run_join(&l, (size_t)(0.3 * raw), false);
    gux_link_run_posted(&l);
    gux_link_run_req_done(&l, a, true, 100);
    gux_link_run_req_done(&l, b, true, (sent - (3u << 20)) / 12.5e6 * 1e3);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[1].rfix, 2.0, 1e-6);
    EXPECT_NEAR(l.m.codec[1].fix, zreal / zt, 1e-9);
    EXPECT_EQ(l.m.codec[0].rfix, 0.0); // lz4's own messages say nothing yet
    EXPECT_NEAR(gux_link_time(&l.m, GSER_COMPRESSION_LZ4, raw, chunk), lt, 1e-12);
    // zstd at 0.6 moves more bytes than lz4 at 0.5
    EXPECT_GT(gux_link_time(&l.m, GSER_COMPRESSION_ZSTD, raw, chunk), lt);
    EXPECT_EQ(gux_link_choose(&l.m, raw, chunk, GUX_CODECS, nullptr), GSER_COMPRESSION_LZ4);
    // a message compressed in chunks as it goes (route 3) says nothing of its size
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)raw, zt, 5000);
    uint64_t c = gux_link_run_join(&l, 1000, true);
    gux_link_run_posted(&l);
    gux_link_run_req_done(&l, c, true, 5000 + zt * 1e3);
    ASSERT_EQ(l.runs, 2u);
    EXPECT_NEAR(l.m.codec[1].rfix, 2.0, 1e-6);
    // a message whose bytes fit the socket's buffer completes as it takes
    // them: it took at least its bytes' time on the wire, from its start
    // (a 100 Mbit/s shuffle's zstd messages "took" 10 ms where the model
    // said 0.1 s, and set zstd's fix to its floor)
    const size_t small = 3300000;
    const double st = gux_link_time(&l.m, GSER_COMPRESSION_ZSTD, small, 0);
    const double fix = l.m.codec[1].fix;
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)small, st, 7000);
    uint64_t s = gux_link_run_join(&l, (size_t)(0.3 * small), false); // at its sample's ratio
    gux_link_run_posted(&l);
    gux_link_run_req_done(&l, s, true, 7010);
    EXPECT_EQ(l.runs, 3u);
    const double wire = (double)(size_t)(0.3 * small) / 12.5e6;
    ASSERT_GT(wire, 0.01 * 4);
    EXPECT_NEAR(l.m.codec[1].fix, 0.5 * fix + 0.5 * ((0.01 + wire) / st), 1e-9);
    EXPECT_NEAR(l.m.codec[1].rfix, 0.5 * 2.0 + 0.5 * 1.0, 1e-6);
    // nor does an unmarked run; and the corrected ratio never passes raw's
    gux_link_t u = l;
    u.marks_posted = false;
    gux_link_run_note(&u, GSER_COMPRESSION_ZSTD, (double)raw, zt, 9000);
    gux_link_posted(&u, 9001, false);
    gux_link_done(&u, raw, 9000 + zt * 1e3);
    EXPECT_NEAR(u.m.codec[1].rfix, 1.5, 1e-6);
    gux_link_model_t big = l.m;
    big.codec[1].rfix = 10;
    gux_link_model_t one = l.m;
    one.codec[1].ratio = 1;
    one.codec[1].rfix = 1;
    EXPECT_NEAR(gux_link_time(&big, GSER_COMPRESSION_ZSTD, raw, 0), gux_link_time(&one, GSER_COMPRESSION_ZSTD, raw, 0),
                1e-12);
}

// A send completes once the socket's buffer takes it. Where the wire sets a
// message's pace the buffer is full when its last send completes, and
// those bytes (up to 3 MiB) still take the wire: at 1 Gbit/s lz4's 64 MiB
// messages of columns completed as fast as zstd's, and took 0.16-0.19 s
// from end to end to zstd's 0.11-0.15. Where the codec sets the pace the
// buffer drains as it goes, and its run is timed as it completed.
TEST(LinkModel, WireBoundRunCountsItsBufferedTail)
{
    const double rate = 125e6, tail = (double)(3u << 20) / rate;
    const size_t raw = 64u << 20, chunk = 4u << 20;
    for (int pace_wire = 0; pace_wire < 2; pace_wire++) {
        gux_link_t l{};
        l.marks_posted = true;
        gux_link_add_rate(&l, rate, true);
        l.warm = true;
        // lz4 (0.25, sampled at 1.3 GB/s): the wire's 2 ns a byte beat its
        // 1.2; at 200 MB/s it sets the pace
        const double ctime = pace_wire ? 1 / 1.3e9 : 1 / 200e6;
        gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 0.25, ctime, 1 / 2e9);
        const double est = gux_link_time(&l.m, GSER_COMPRESSION_LZ4, raw, chunk);
        const double sent = 0.25 * raw, done = pace_wire ? 0.12 : 0.35; // (64 MiB at 200 MB/s: 0.34 s)
        gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)raw, est, 0);
        uint64_t id = gux_link_run_join(&l, (size_t)sent, false);
        gux_link_run_posted(&l);
        gux_link_run_req_done(&l, id, true, done * 1e3);
        ASSERT_EQ(l.runs, 1u);
        const double real = pace_wire ? done + tail : done;
        ASSERT_GT(real, sent / rate); // (not the floor)
        EXPECT_NEAR(l.m.codec[0].fix, real / est, 1e-9) << pace_wire;
    }
}

// An endpoint's first compressed message is cold (its compression path's
// first buffers, threads and pages; measured up to about 2.2 times the
// next): its run only bounds the codec's fix. Between 1 and 2.5 times the
// model it says nothing (not measured, a codec tried in it tried again);
// the next, warm, run is measured.
TEST(LinkModel, ColdRunBetweenTheBoundsIsNotMeasured)
{
    gux_link_t l{};
    gux_link_model_t ref = model(0);
    gux_link_add_codec(&l, GSER_COMPRESSION_ZSTD, ref.codec[1].ratio, ref.codec[1].ctime, ref.codec[1].dtime);
    l.m.codec[1].tried = true;
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, 1.0, 0);
    l.run.tried = true;
    gux_link_posted(&l, 1, false);
    gux_link_done(&l, 20 << 20, 2000);
    EXPECT_FALSE(l.run.open);
    EXPECT_EQ(l.runs, 0u);
    EXPECT_EQ(l.cold_runs, 0u);
    EXPECT_EQ(l.m.codec[1].fix, 0.0);
    EXPECT_TRUE(l.warm);
    EXPECT_FALSE(l.m.codec[1].tried);
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, 1.0, 4000);
    gux_link_posted(&l, 4001, false);
    gux_link_done(&l, 20 << 20, 5500);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[1].fix, 1.5, 1e-9);
}

// A cold run slower than 2.5 times the model: warm, the codec is still at
// least that much slower than modelled, so that is its fix from the first
// message (on the unshaped veth lz4 was modelled 1.15 times raw and took 5
// times: it went twice before its fix turned it away); the first warm run
// replaces it (not averaged with it).
TEST(LinkModel, ColdRunFarSlowerThanModelledTurnsTheCodecAway)
{
    gux_link_t l{};
    gux_link_model_t ref = model(0);
    ref.codec[0] = sampled(0.5, 1 / 1.5e9, 1 / 3e9); // lz4 as sampled here
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, ref.codec[0].ratio, ref.codec[0].ctime, ref.codec[0].dtime);
    gux_link_add_rate(&l, 0.7e9, true);
    gux_link_add_rate(&l, 0.7e9, true); // not the cold first measurement
    const size_t chunk = 4 << 20;
    double t[3];
    ASSERT_EQ(gux_link_choose(&l.m, k64M, chunk, GSER_UCX_CAP_LZ4, t), GSER_COMPRESSION_LZ4);
    ASSERT_GT(t[0], 1.1 * t[1]);
    double est = t[1];
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, est, 0);
    gux_link_posted(&l, 1, false);
    gux_link_done(&l, 32 << 20, 5 * est * 1e3); // five times the model, cold
    EXPECT_FALSE(l.run.open);
    EXPECT_EQ(l.runs, 0u);
    EXPECT_EQ(l.cold_runs, 1u);
    EXPECT_NEAR(l.m.codec[0].fix, 2.0, 1e-9);
    EXPECT_TRUE(l.m.codec[0].cold_fix);
    EXPECT_EQ(gux_link_choose(&l.m, k64M, chunk, GSER_UCX_CAP_LZ4, nullptr), GSER_COMPRESSION_NONE);
    // a warm run at 1.5 times the model replaces the bound
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, est, 10000);
    gux_link_posted(&l, 10001, false);
    gux_link_done(&l, 32 << 20, 10000 + 1.5 * est * 1e3);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[0].fix, 1.5, 1e-9);
    EXPECT_FALSE(l.m.codec[0].cold_fix);
}

// A cold run faster than the model: warm, the codec is faster still, so
// the cold run's ratio is its fix (and a codec tried in it is not tried
// again); a cold run never changes a fix that warm runs set (an earlier
// endpoint's, shared by host).
TEST(LinkModel, ColdRunFasterThanModelledCounts)
{
    gux_link_t l{};
    add_model_codecs(&l);
    gux_link_add_rate(&l, 60e6, true);
    const size_t chunk = 4 << 20;
    double t[3];
    ASSERT_EQ(gux_link_choose(&l.m, k64M, chunk, GUX_CODECS, t), GSER_COMPRESSION_LZ4);
    ASSERT_LT(0.5 * t[2], t[1]); // zstd at half its model would win
    l.m.codec[1].tried = true;
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, t[2], 0);
    l.run.tried = true;
    gux_link_posted(&l, 1, false);
    gux_link_done(&l, 20 << 20, 0.5 * t[2] * 1e3);
    EXPECT_EQ(l.cold_runs, 1u);
    EXPECT_NEAR(l.m.codec[1].fix, 0.5, 1e-9);
    EXPECT_TRUE(l.m.codec[1].tried);
    EXPECT_EQ(gux_link_choose(&l.m, k64M, chunk, GUX_CODECS, nullptr), GSER_COMPRESSION_ZSTD);
    // shared from a host whose warm runs set lz4's fix: a cold run keeps it
    gux_link_t h{};
    h.m = l.m;
    h.m.codec[0].fix = 1.2;
    h.m.codec[0].runs = 3;
    gux_link_run_note(&h, GSER_COMPRESSION_LZ4, (double)k64M, 1.0, 0);
    gux_link_posted(&h, 1, false);
    gux_link_done(&h, 32 << 20, 6000);
    EXPECT_EQ(h.cold_runs, 0u);
    EXPECT_NEAR(h.m.codec[0].fix, 1.2, 1e-9);
    EXPECT_TRUE(h.warm);
}

// A run whose sends queue behind another codec's is not measured, nor one
// that starts with sends in flight; a run's bytes finer than the sample's
// ratio said close at the next decision.
TEST(LinkModel, MixedRunsAreNotMeasured)
{
    gux_link_t l{};
    add_model_codecs(&l);
    l.warm = true;
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, 1.0, 0);
    gux_link_posted(&l, 1, false);
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, 1.0, 5);
    EXPECT_FALSE(l.run.open);
    gux_link_posted(&l, 6, false);
    gux_link_done(&l, 32 << 20, 3000);
    gux_link_done(&l, 16 << 20, 3000);
    gux_link_run_note(&l, GSER_COMPRESSION_ZSTD, (double)k64M, 1.0, 4000);
    EXPECT_EQ(l.runs, 0u);
    // one run: 8 MiB on the wire (the sample said 19.2), measured at the next decision
    gux_link_posted(&l, 4001, false);
    gux_link_done(&l, 8 << 20, 4500);
    EXPECT_EQ(l.runs, 0u);
    gux_link_run_settle(&l);
    ASSERT_EQ(l.runs, 1u);
    EXPECT_NEAR(l.m.codec[1].fix, 0.5, 1e-9);
    // a run opened with raw sends still in flight is not
    gux_link_posted(&l, 5000, true);
    gux_link_run_note(&l, GSER_COMPRESSION_LZ4, (double)k64M, 1.0, 5001);
    EXPECT_FALSE(l.run.open);
}

// Raw wins whatever the data exactly where the model takes raw for data
// that shrinks to nothing. Whole: fix (c + d) rate >= 0.97 (c, d: the
// samples' seconds a byte times 1.5); in n chunks, fix ((n - 1) max(c, d) +
// c + d) rate >= 0.97 n. Just past that rate, raw wins for every ratio;
// just short of it, some ratio has a codec chosen.
TEST(LinkModel, RawWinsWhateverTheRatio)
{
    gux_link_model_t m = model(0);
    m.codec[1].known = false; // lz4 only: its bound is the one checked
    const double c = 1.5 * m.codec[0].ctime, d = 1.5 * m.codec[0].dtime;
    const size_t chunk = 4u << 20, n = k64M / chunk;
    for (double fix : {0.0, 0.5, 2.0}) {
        m.codec[0].fix = fix;
        const double f = fix > 0 ? fix : 1;
        for (size_t ch : {(size_t)0, chunk}) {
            SCOPED_TRACE("fix " + std::to_string(fix) + " chunk " + std::to_string(ch));
            const double at = ch ? 0.97 * (double)n / (f * ((double)(n - 1) * std::max(c, d) + c + d))
                                 : 0.97 / (f * (c + d));
            gux_link_model_t k = m;
            k.rate = at * 1.001;
            EXPECT_TRUE(gux_link_raw_wins(&k, k64M, ch, GSER_UCX_CAP_LZ4));
            for (double r : {0.001, 0.01, 0.1, 0.5, 0.9}) {
                k.codec[0].ratio = r;
                EXPECT_EQ(gux_link_choose(&k, k64M, ch, GSER_UCX_CAP_LZ4, nullptr), GSER_COMPRESSION_NONE) << r;
            }
            k = m;
            k.rate = at * 0.999;
            EXPECT_FALSE(gux_link_raw_wins(&k, k64M, ch, GSER_UCX_CAP_LZ4));
            k.codec[0].ratio = 1e-4;
            EXPECT_EQ(gux_link_choose(&k, k64M, ch, GSER_UCX_CAP_LZ4, nullptr), GSER_COMPRESSION_LZ4);
        }
    }
    // every codec the peer reads counts: at 200 MB/s raw beats zstd
    // whatever it does (compressing, the pipe's pace, takes 10 ns a byte
    // against the wire's 5), not lz4 (3 ns)
    gux_link_model_t both = model(200e6);
    EXPECT_FALSE(gux_link_raw_wins(&both, k64M, chunk, GUX_CODECS));
    EXPECT_TRUE(gux_link_raw_wins(&both, k64M, chunk, GSER_UCX_CAP_ZSTD));
    EXPECT_TRUE(gux_link_raw_wins(&both, k64M, chunk, 0)); // no codec: raw
    // a codec not sampled yet could win; an unmeasured link is not known to
    both.codec[1].known = false;
    EXPECT_FALSE(gux_link_raw_wins(&both, k64M, chunk, GSER_UCX_CAP_ZSTD));
    gux_link_model_t unmeasured = model(0);
    EXPECT_FALSE(gux_link_raw_wins(&unmeasured, k64M, chunk, GSER_UCX_CAP_ZSTD));
}

// A codec is far faster on data it cannot shrink (lz4: 13.8 GB/s on random
// float64, 1.3-1.46 on columns, on these cores): the bound takes its
// speeds on samples it shrank, so random data after columns still goes raw
// on a 1.5 GB/s link; a codec that never shrank a sample is not known to
// lose.
TEST(LinkModel, RawWinsOnTheCodecsSpeedOnDataItShrinks)
{
    gux_link_t l{};
    l.m.rate = 1.5e9;
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 1.0, 1 / 13.8e9, 1 / 43e9); // random only
    EXPECT_FALSE(gux_link_raw_wins(&l.m, k64M, 4u << 20, GSER_UCX_CAP_LZ4));
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 0.23, 1 / 1.4e9, 1 / 3.4e9); // columns
    EXPECT_TRUE(gux_link_raw_wins(&l.m, k64M, 4u << 20, GSER_UCX_CAP_LZ4));
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 1.0, 1 / 13.8e9, 1 / 43e9); // random again
    EXPECT_TRUE(gux_link_raw_wins(&l.m, k64M, 4u << 20, GSER_UCX_CAP_LZ4));
    // the speeds averaged over both kinds (2.5 GB/s compressing) would beat the link
    gux_link_model_t mixed = l.m;
    mixed.codec[0].shrunk_ctime = mixed.codec[0].ctime;
    mixed.codec[0].shrunk_dtime = mixed.codec[0].dtime;
    EXPECT_FALSE(gux_link_raw_wins(&mixed, k64M, 4u << 20, GSER_UCX_CAP_LZ4));
    // columns that lz4 compresses faster than the link moves raw: not raw
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 0.1, 1 / 6e9, 1 / 8e9);
    gux_link_add_codec(&l, GSER_COMPRESSION_LZ4, 0.1, 1 / 6e9, 1 / 8e9);
    EXPECT_FALSE(gux_link_raw_wins(&l.m, k64M, 4u << 20, GSER_UCX_CAP_LZ4));
}

// ---- on endpoints (loopback; the mode forced to AUTO, since the default
// compresses nothing towards this host) ----

struct LinkPair {
    Pair p;
    void open(int client_mode, uint32_t server_codecs = GUX_CODECS)
    {
        gser_ucx_worker_options_t co = GSER_UCX_WORKER_OPTIONS_INIT;
        co.compression = client_mode;
        co.thread_mode = GSER_UCX_THREAD_SERIALIZED;
        p.ctx = make_ucx_ctx();
        ASSERT_TRUE(p.ctx);
        p.server = make_worker(p.ctx.get(), nullptr);
        p.client = make_worker(p.ctx.get(), &co);
        ASSERT_TRUE(p.server && p.client);
        gux_worker_set_announce_codecs(p.server.get(), server_codecs);
        p.listener = listen_local(p.server.get());
        ASSERT_TRUE(p.listener);
        p.connect(&p.cep, &p.sep);
    }
    gser_ucx_link_stats_t stats()
    {
        gser_ucx_link_stats_t s = GSER_UCX_LINK_STATS_INIT;
        EXPECT_EQ(gser_ucx_ep_get_link_stats(p.cep.get(), &s), GSER_OK) << gser_ucx_get_last_error();
        return s;
    }
    // Inject the link's rate (the tests' only white-box step).
    void set_rate(double rate)
    {
        gux_lock(p.client.get());
        p.cep->link.m.rate = rate;
        gux_unlock(p.client.get());
    }
};

// Compressible bytes: runs of a counter, with a little noise.
std::vector<unsigned char> runs(size_t n)
{
    std::vector<unsigned char> b(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i / 4096 + (i % 7 == 0 ? i % 3 : 0));
    return b;
}

gser_frame_t host_frame(const std::vector<unsigned char> &b)
{
    gser_frame_t f{};
    f.data = const_cast<unsigned char *>(b.data());
    f.size = b.size();
    f.memory = GSER_MEMORY_HOST;
    return f;
}

int choose(LinkPair &lp, const std::vector<unsigned char> &b, bool pipelined = true)
{
    gser_frame_t f[2] = {gser_frame_t{}, host_frame(b)};
    int c = -1;
    EXPECT_EQ(gser_ucx_ep_choose_compression(lp.p.cep.get(), f, 2, pipelined, 1, &c), GSER_OK)
        << gser_ucx_get_last_error();
    return c;
}

int codec_of(gser_ucx_ep_t *ep)
{
    int c = -1;
    EXPECT_EQ(gser_ucx_ep_get_compression(ep, &c), GSER_OK) << gser_ucx_get_last_error();
    return c;
}

TEST(Link, EndpointDecidesByItsLink)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto b = runs(8u << 20);
    gser_ucx_link_stats_t s = lp.stats();
    EXPECT_TRUE(s.link_aware);
    EXPECT_EQ(s.decisions, 0u);
    EXPECT_EQ(s.codec, GSER_COMPRESSION_LZ4); // not measured yet: as Dask's auto
    lp.set_rate(1e6);                         // a slow link: a codec pays
    int slow = choose(lp, b);
    EXPECT_NE(slow, GSER_COMPRESSION_NONE);
    EXPECT_EQ(codec_of(lp.p.cep.get()), slow); // what the endpoint reports (and the binding serializes with)
    s = lp.stats();
    EXPECT_EQ(s.decisions, 1u);
    EXPECT_EQ(s.samples, 1u);
    EXPECT_LT(s.ratio[0], 0.5);
    EXPECT_LT(s.ratio[1], 0.5);
    EXPECT_GT(s.compress_rate[0], 0);
    EXPECT_GT(s.decompress_rate[1], 0);
    EXPECT_GT(s.estimate[0], s.estimate[slow == GSER_COMPRESSION_LZ4 ? 1 : 2]);
    lp.set_rate(1e12); // a link faster than any codec: raw
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE);
    EXPECT_EQ(codec_of(lp.p.cep.get()), GSER_COMPRESSION_NONE);
    EXPECT_EQ(lp.stats().samples, 1u); // the codecs' speeds were fresh: not timed again
    // random bytes do not shrink: raw, even on the slow link, once sampled
    std::vector<unsigned char> rnd(8u << 20);
    std::mt19937_64 g(1);
    for (auto &x : rnd)
        x = (unsigned char)g();
    lp.set_rate(1e6);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    EXPECT_EQ(choose(lp, rnd), GSER_COMPRESSION_NONE);
    EXPECT_EQ(lp.stats().samples, 2u);
}

// Messages under a mebibyte keep the last decision and cost no sample.
TEST(Link, SmallMessagesCostNothing)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto b = runs(200u << 10);
    lp.set_rate(1e12);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_LZ4); // the undecided default
    gser_ucx_link_stats_t s = lp.stats();
    EXPECT_EQ(s.decisions, 0u);
    EXPECT_EQ(s.samples, 0u);
}

// The model injected on an endpoint (white-box: no sample replaces it).
void inject(LinkPair &lp, const gux_link_model_t &m)
{
    gux_lock(lp.p.client.get());
    lp.p.cep->link.m = m;
    lp.p.cep->link.sampled_at = gux_now_ms() + 1e9;
    gux_unlock(lp.p.client.get());
}

// An auto endpoint that decided once (raw, on a link faster than any
// codec), so that its codecs are sampled: a model injected next stays.
void open_sampled(LinkPair &lp, const std::vector<unsigned char> &b)
{
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    lp.set_rate(1e12);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE);
}

// A codec never run on the link, close to the chosen one, is tried once
// (its sample may be what misleads the model); never instead of raw. A
// rate of one cold measurement is re-measured by one raw probe after one
// compressed message, where raw is modelled within 3 times the codec.
TEST(Link, CloseCodecTriedOnceAndColdRateProbedOnce)
{
    LinkPair lp;
    auto b = runs(8u << 20);
    ASSERT_NO_FATAL_FAILURE(open_sampled(lp, b));
    gux_link_model_t m = model(60e6); // lz4 the model's choice, zstd within 1.2 times, raw 2 times
    m.cold = true;
    inject(lp, m);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_ZSTD); // tried
    EXPECT_EQ(lp.stats().explores, 1u);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_LZ4);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE); // the cold rate's probe
    EXPECT_EQ(lp.stats().probes, 1u);
    for (int i = 0; i < 3; i++)
        EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_LZ4);
    gser_ucx_link_stats_t s = lp.stats();
    EXPECT_EQ(s.explores, 1u);
    EXPECT_EQ(s.probes, 1u);
    EXPECT_EQ(s.runs, 0u); // nothing was sent: no run measured
    // a slow link's first message reads it as it is: no cold probe there
    LinkPair slow;
    ASSERT_NO_FATAL_FAILURE(open_sampled(slow, b));
    gux_link_model_t sm = model(12.5e6);
    sm.cold = true;
    inject(slow, sm);
    for (int i = 0; i < 6; i++)
        EXPECT_NE(choose(slow, b), GSER_COMPRESSION_NONE);
    EXPECT_EQ(slow.stats().probes, 0u);
    // raw the choice, a codec close to it: not tried
    LinkPair fast;
    ASSERT_NO_FATAL_FAILURE(fast.open(GSER_UCX_COMPRESSION_AUTO));
    fast.set_rate(1e12);
    EXPECT_EQ(choose(fast, b), GSER_COMPRESSION_NONE);
    m = model(100e6);
    m.codec[0] = sampled(0.5, 3e-9, 1e-9); // halves, but costs a little more than it saves
    m.codec[1].known = false;
    inject(fast, m);
    double t[3];
    ASSERT_EQ(gux_link_choose(&m, 8u << 20, 0, GUX_CODECS, t), GSER_COMPRESSION_NONE);
    ASSERT_LT(t[1], 1.25 * t[0]);
    for (int i = 0; i < 3; i++)
        EXPECT_EQ(choose(fast, b, false), GSER_COMPRESSION_NONE);
    EXPECT_EQ(fast.stats().explores, 0u);
}

// While compressing, a probe comes once the compressed messages since the
// last one saved 50 times what it costs (in the model), and at least 4 of
// them and 1 s after it: not after idle time. Spaced by time, a 100 Mbit/s
// shuffle's first round after a pause sent 8 of its 24 messages raw.
TEST(Link, ProbesAreSpacedByWhatCompressingSavedNotByIdleTime)
{
    auto small = runs(8u << 20), large = runs(64u << 20);
    for (bool pipelined : {false, true}) {
        SCOPED_TRACE(pipelined);
        LinkPair lp;
        ASSERT_NO_FATAL_FAILURE(open_sampled(lp, small));
        gux_link_model_t m = model(20e6);                   // a codec saves most of raw's time
        m.codec[0].tried = m.codec[1].tried = true;          // no codec left to try
        inject(lp, m);
        auto idle = [&](double ms) { // as if the endpoint's last probe was ms ago
            gux_lock(lp.p.client.get());
            lp.p.cep->link.probed_at = gux_now_ms() - ms;
            gux_unlock(lp.p.client.get());
        };
        auto &b = pipelined ? large : small;
        double t[3];
        int want = gux_link_choose(&m, b.size(), pipelined ? (4u << 20) : 0, GUX_CODECS, t);
        ASSERT_NE(want, GSER_COMPRESSION_NONE);
        // a probe of a message in parts costs its first 16 MiB, of a whole
        // one all of it: it comes after 50 times that share's savings, at
        // the message after them (12.5 messages' worth: the 14th)
        unsigned every = pipelined ? 14 : 51;
        idle(3.6e6); // an hour without messages
        uint64_t probes = lp.stats().probes;
        for (unsigned k = 1; k < every; k++)
            ASSERT_EQ(choose(lp, b, pipelined), want) << k;
        EXPECT_EQ(lp.stats().probes, probes) << "idle time alone calls no probe";
        EXPECT_EQ(choose(lp, b, pipelined), GSER_COMPRESSION_NONE) << "saved 50 times the probe's cost";
        EXPECT_EQ(lp.stats().probes, probes + 1);
        // saved enough again, but within a second of the last probe
        for (unsigned k = 0; k < every + 5; k++)
            ASSERT_EQ(choose(lp, b, pipelined), want) << k;
        idle(1100);
        EXPECT_EQ(choose(lp, b, pipelined), GSER_COMPRESSION_NONE);
        for (unsigned k = 0; k < 3; k++) // and at least 4 compressed messages between probes
            ASSERT_EQ(choose(lp, b, pipelined), want) << k;
        idle(1100);
        EXPECT_EQ(choose(lp, b, pipelined), want);
        EXPECT_EQ(lp.stats().probes, probes + 2);
    }
}

// Every busy period after idle starts on empty buffers, not only the
// first: a probe's first send goes in at once, and the rate is that of the
// sends after it. At 1 Gbit/s gser://'s 8 MiB probes read 230-243 MB/s
// over the whole period, and lz4 was chosen over zstd on that rate.
TEST(LinkModel, ProbeAfterIdleIsNotTheBuffers)
{
    const double link = 125e6, part = 4194304;
    gux_link_t l{};
    for (int msg = 0; msg < 2; msg++) { // measured: 16 MiB periods at the link's rate
        double t0 = 1000.0 * msg;
        gux_link_posted(&l, t0, true);
        gux_link_done(&l, 16u << 20, t0 + 16 * kMiB / link * 1e3);
    }
    ASSERT_NEAR(l.m.rate, link, 1e3);
    gux_link_posted(&l, 5000, true);
    gux_link_posted(&l, 5000, true);
    gux_link_done(&l, (size_t)part, 5001);                          // into the buffers
    gux_link_done(&l, (size_t)part, 5001 + part / link * 1e3);      // the wire
    EXPECT_EQ(l.rate_samples, 3u);
    EXPECT_NEAR(l.m.rate, link, 0.01 * link); // not 0.7 * 125 + 0.3 * 249 MB/s
    // a window that goes on from a busy one (split at GUX_LINK_WIN_MS)
    // started on full buffers: its first completion is the wire's, and
    // the rate is the whole window's
    for (int i = 0; i < 4; i++)
        gux_link_posted(&l, 10000, true);
    gux_link_done(&l, 8u << 20, 10067);
    gux_link_done(&l, 8u << 20, 11001); // a second busy: the window closes (far below: held)
    ASSERT_EQ(l.rate_samples, 4u);
    EXPECT_TRUE(l.win_cont);
    double before = l.m.rate;
    gux_link_done(&l, 8u << 20, 11011);
    gux_link_done(&l, 8u << 20, 11078);
    ASSERT_EQ(l.rate_samples, 5u);
    EXPECT_NEAR(l.m.rate, 0.7 * before + 0.3 * 16 * kMiB / 0.077, 0.01 * link); // not after the first: 125
}

// A connection's first measured period whose sends after the first
// completion went more than 1.5 times faster than the whole waited at its
// start (the receiver's first receive, slow start): their rate is the
// link's. On a slow link the sockets' buffers make the rest look faster,
// but not that much: the whole period's rate stands. Where they went
// slower than the whole, the buffers took the first send at once: their
// rate is the link's.
TEST(LinkModel, FirstRateSkipsAColdStart)
{
    const double part = 4194304; // gser://'s first 8 MiB of a message that measures the link
    gux_link_t buffered{};
    for (int i = 0; i < 2; i++)
        gux_link_posted(&buffered, 0, true);
    gux_link_done(&buffered, (size_t)part, 19.5);
    gux_link_done(&buffered, (size_t)part, 55.2);
    EXPECT_NEAR(buffered.m.rate, part / 0.0357, 1e3); // 117 MB/s, not 152 over the whole

    const double col = 22.4e6; // a 64 MiB message's three columns
    gux_link_t cold{};
    for (int i = 0; i < 3; i++)
        gux_link_posted(&cold, 0, true);
    gux_link_done(&cold, (size_t)col, 200);
    gux_link_done(&cold, (size_t)col, 215);
    gux_link_done(&cold, (size_t)col, 230);
    EXPECT_NEAR(cold.m.rate, 2 * col / 0.030, 1e3); // 1.49 GB/s, not 0.29 over the whole
    EXPECT_TRUE(cold.m.cold);
    gux_link_t slow{}; // measured at 1 Gbit/s
    for (int i = 0; i < 3; i++)
        gux_link_posted(&slow, 0, true);
    gux_link_done(&slow, (size_t)col, 238);
    gux_link_done(&slow, (size_t)col, 272);
    gux_link_done(&slow, (size_t)col, 541);
    EXPECT_NEAR(slow.m.rate, 3 * col / 0.541, 1e3);
    // later periods are whole ones (this one far below: held until the
    // next, taken with it where that is below too)
    for (double start : {1000.0, 2000.0}) {
        for (int i = 0; i < 3; i++)
            gux_link_posted(&cold, start, true);
        gux_link_done(&cold, (size_t)col, start + 200);
        gux_link_done(&cold, (size_t)col, start + 215);
        gux_link_done(&cold, (size_t)col, start + 230);
        if (start < 2000) {
            EXPECT_NEAR(cold.m.rate, 2 * col / 0.030, 1e3); // held
        }
    }
    EXPECT_NEAR(cold.m.rate, 3 * col / 0.230, 1e3);
    EXPECT_FALSE(cold.m.cold);
}

// A codec close to the choice and never run is tried once, whatever the
// chosen codec's own fix: one that went as fast as modelled (fix 1 or
// less) says nothing of the other's model. Kept from the try, lz4 stayed
// the choice at 1 Gbit/s at 0.72 of zstd forced.
TEST(Link, CloseCodecTriedWhateverTheChoicesFix)
{
    auto b = runs(8u << 20);
    gux_link_model_t m = model(60e6); // lz4 the model's choice, zstd close to it
    double t[3];
    ASSERT_EQ(gux_link_choose(&m, 8u << 20, 4u << 20, GUX_CODECS, t), GSER_COMPRESSION_LZ4);
    ASSERT_LT(t[2], 1.6 * t[1]);
    for (double fix : {0.9, 1.0, 1 + (t[2] / t[1] - 1) / 2}) {
        SCOPED_TRACE("fix " + std::to_string(fix));
        LinkPair lp;
        ASSERT_NO_FATAL_FAILURE(open_sampled(lp, b));
        gux_link_model_t k = m;
        k.codec[0].fix = fix;
        k.codec[0].runs = 1;
        ASSERT_EQ(gux_link_choose(&k, 8u << 20, 4u << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_LZ4);
        inject(lp, k);
        EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_ZSTD); // tried once
        for (int i = 0; i < 3; i++)
            EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_LZ4);
        EXPECT_EQ(lp.stats().explores, 1u);
    }
}

// lz4 is never tried instead of zstd chosen, however close its model:
// lz4's sample errs fast (1.6 times its model at 1 Gbit/s), so a model
// that puts it behind zstd is right, and a try cost a message at 0.45 of
// zstd's speed.
TEST(Link, LighterCodecIsNotTriedInsteadOfZstd)
{
    auto b = runs(8u << 20);
    gux_link_model_t m{};
    double t[3];
    bool found = false;
    for (double rate = 1e6; rate < 1e9 && !found; rate *= 1.1) { // zstd chosen, lz4 within 1.6 times
        m = model(rate);
        found = gux_link_choose(&m, 8u << 20, 4u << 20, GUX_CODECS, t) == GSER_COMPRESSION_ZSTD &&
                t[1] < 1.6 * t[2] && t[1] > t[2];
    }
    ASSERT_TRUE(found);
    for (double fix : {0.0, 1.0}) { // zstd's messages not timed yet, or timed as modelled
        SCOPED_TRACE("fix " + std::to_string(fix));
        LinkPair lp;
        ASSERT_NO_FATAL_FAILURE(open_sampled(lp, b));
        gux_link_model_t k = m;
        k.codec[1].fix = fix;
        k.codec[1].runs = fix > 0;
        inject(lp, k);
        for (int i = 0; i < 4; i++)
            EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_ZSTD) << i;
        EXPECT_EQ(lp.stats().explores, 0u);
    }
}

// The first measurement of a link is taken as it is and replaced by the
// next (a connection's first message is slow); later ones are averaged.
TEST(LinkModel, ColdRateIsReplaced)
{
    gux_link_t l{};
    gux_link_add_rate(&l, 384e6, true);
    EXPECT_TRUE(l.m.cold);
    gux_link_add_rate(&l, 1.2e9, true);
    EXPECT_DOUBLE_EQ(l.m.rate, 1.2e9);
    EXPECT_FALSE(l.m.cold);
    gux_link_add_rate(&l, 0.8e9, true);
    EXPECT_NEAR(l.m.rate, 1.08e9, 1);
}

// A raw window below half the rate is held until the next: a single one
// (load on either end) is dropped, and the decisions go on by the rate
// before it; two in a row are both taken (the link slowed). The run that
// showed it: the unshaped veth measured 1.6 GB/s, then 0.30 under load,
// and lz4 went 45 messages before a probe measured it fast again.
TEST(LinkModel, LowWindowIsHeldUntilTheNext)
{
    gux_link_t l{};
    add_model_codecs(&l);
    gux_link_add_rate(&l, 1.6e9, true);
    ASSERT_EQ(gux_link_choose(&l.m, k64M, 4 << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    gux_link_add_rate(&l, 0.30e9, true);
    EXPECT_DOUBLE_EQ(l.m.rate, 1.6e9); // held
    EXPECT_TRUE(l.m.cold);
    EXPECT_EQ(gux_link_choose(&l.m, k64M, 4 << 20, GUX_CODECS, nullptr), GSER_COMPRESSION_NONE);
    gux_link_add_rate(&l, 1.5e9, true); // the next is not low: the held one is dropped
    EXPECT_DOUBLE_EQ(l.m.rate, 1.5e9);  // (replacing the cold first)
    EXPECT_EQ(l.held, 0.0);
    gux_link_add_rate(&l, 0.3e9, true);
    EXPECT_DOUBLE_EQ(l.m.rate, 1.5e9);
    gux_link_add_rate(&l, 0.3e9, true); // two in a row: both taken
    double r = 0.7 * (0.7 * 1.5e9 + 0.3 * 0.3e9) + 0.3 * 0.3e9;
    EXPECT_NEAR(l.m.rate, r, 1);
    EXPECT_EQ(l.held, 0.0);
    gux_link_add_rate(&l, 0.1e9, true); // and the low ones after them at once
    EXPECT_NEAR(l.m.rate, r = 0.7 * r + 0.3 * 0.1e9, 1);
    gux_link_add_rate(&l, 0.1e9, true);
    EXPECT_NEAR(l.m.rate, r = 0.7 * r + 0.3 * 0.1e9, 1);
    gux_link_add_rate(&l, 0.6 * r, true); // not low (a drop of less than half): taken at once
    EXPECT_NEAR(l.m.rate, r = 0.7 * r + 0.3 * 0.6 * r, 1);
    gux_link_add_rate(&l, 0.2 * r, true); // low again, after one that was not: held
    EXPECT_DOUBLE_EQ(l.m.rate, r);
    EXPECT_EQ(l.rate_samples, 9u);
}

// With nothing measured, one endpoint of a worker to a host measures the
// link with a raw message; the others to that host meanwhile compress with
// lz4 where the sample shrinks (as Dask's "auto"), and the rate it measures
// is theirs at once, not after its next decision: Dask opens a comm for a
// few messages (a shuffle's first wave went raw on every endpoint).
TEST(Link, OneEndpointMeasuresAHostForTheOthers)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto b = runs(8u << 20);
    gser_frame_t f[2] = {gser_frame_t{}, host_frame(b)};
    auto choose2 = [&](gser_ucx_ep_t *ep) {
        int c = -1;
        EXPECT_EQ(gser_ucx_ep_choose_compression(ep, f, 2, true, 1, &c), GSER_OK) << gser_ucx_get_last_error();
        return c;
    };
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE); // nothing measured: raw, to measure
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE); // (the measuring endpoint, again)
    EpPtr cep2, sep2, cep3, sep3;
    ASSERT_NO_FATAL_FAILURE(lp.p.connect(&cep2, &sep2));
    EXPECT_EQ(choose2(cep2.get()), GSER_COMPRESSION_LZ4); // another measures: lz4, the sample shrinks
    auto noise = std::vector<unsigned char>(8u << 20);
    std::mt19937 rng(7);
    for (auto &x : noise)
        x = (unsigned char)rng();
    gser_frame_t g[2] = {gser_frame_t{}, host_frame(noise)};
    int c = -1;
    ASSERT_NO_FATAL_FAILURE(lp.p.connect(&cep3, &sep3));
    ASSERT_EQ(gser_ucx_ep_choose_compression(cep3.get(), g, 2, true, 1, &c), GSER_OK);
    EXPECT_EQ(c, GSER_COMPRESSION_NONE); // data that does not shrink: raw
    gser_ucx_worker_t *w = lp.p.client.get();
    gux_lock(w);
    double t0 = gux_now_ms();
    gux_link_posted(&lp.p.cep->link, t0, true);
    gux_ep_link_done(lp.p.cep.get(), 8u << 20, t0 + 671); // 12.5 MB/s
    gux_unlock(w);
    ASSERT_NEAR(lp.stats().send_rate, 12.5e6, 0.1e6);
    EXPECT_NE(choose2(cep2.get()), GSER_COMPRESSION_NONE); // by the model now, on the host's rate
    gser_ucx_link_stats_t s = GSER_UCX_LINK_STATS_INIT;
    ASSERT_EQ(gser_ucx_ep_get_link_stats(cep2.get(), &s), GSER_OK);
    EXPECT_NEAR(s.send_rate, 12.5e6, 0.1e6);
    EXPECT_GT(s.estimate[0], 0.0);
}

TEST(Link, ForcedCodecStaysForced)
{
    for (int mode : {GSER_UCX_COMPRESSION_LZ4, GSER_UCX_COMPRESSION_ZSTD, GSER_UCX_COMPRESSION_NONE}) {
        SCOPED_TRACE("mode " + std::to_string(mode));
        LinkPair lp;
        ASSERT_NO_FATAL_FAILURE(lp.open(mode));
        int want = mode == GSER_UCX_COMPRESSION_LZ4    ? GSER_COMPRESSION_LZ4
                   : mode == GSER_UCX_COMPRESSION_ZSTD ? GSER_COMPRESSION_ZSTD
                                                       : GSER_COMPRESSION_NONE;
        auto b = runs(8u << 20);
        for (double rate : {1e6, 1e12}) {
            lp.set_rate(rate);
            EXPECT_EQ(choose(lp, b), want);
        }
        gser_ucx_link_stats_t s = lp.stats();
        EXPECT_FALSE(s.link_aware);
        EXPECT_EQ(s.codec, want);
        EXPECT_EQ(s.decisions, 0u);
    }
}

bool raw_wins(LinkPair &lp, size_t bytes, bool pipelined = true)
{
    bool raw = false;
    EXPECT_EQ(gser_ucx_ep_raw_wins(lp.p.cep.get(), bytes, pipelined, &raw), GSER_OK) << gser_ucx_get_last_error();
    return raw;
}

// Where the measurements say raw wins whatever the data, a message is
// decided raw without a sample (the caller then sends it as forced None
// does); where a codec could win, nothing is decided; the codecs are timed
// again after 16 such messages (or 10 s).
TEST(Link, RawWinsDecidesWithoutASample)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto b = runs(8u << 20);
    EXPECT_FALSE(raw_wins(lp, b.size())); // nothing decided, nothing sampled yet
    lp.set_rate(1e12);
    EXPECT_FALSE(raw_wins(lp, b.size()));
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE); // sampled, decided raw
    gser_ucx_link_stats_t s = lp.stats();
    ASSERT_EQ(s.samples, 1u);
    ASSERT_EQ(s.decisions, 1u);
    EXPECT_FALSE(raw_wins(lp, (1u << 20) - 1)); // small messages keep the last decision
    for (unsigned i = 1; i <= 16; i++)
        EXPECT_TRUE(raw_wins(lp, b.size())) << i;
    s = lp.stats();
    EXPECT_EQ(s.raw_wins, 16u);
    EXPECT_EQ(s.decisions, 17u);
    EXPECT_EQ(s.samples, 1u); // none taken
    EXPECT_EQ(s.codec, GSER_COMPRESSION_NONE);
    EXPECT_GT(s.estimate[0], 0);
    // the 17th message goes to be sampled, once the last sample is 100 ms old
    EXPECT_TRUE(raw_wins(lp, b.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    EXPECT_FALSE(raw_wins(lp, b.size()));
    EXPECT_EQ(lp.stats().raw_wins, 17u);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE);
    EXPECT_EQ(lp.stats().samples, 2u);
    EXPECT_TRUE(raw_wins(lp, b.size()));
    // a link slower than the codecs: nothing decided, the sample decides
    lp.set_rate(1e6);
    s = lp.stats();
    EXPECT_FALSE(raw_wins(lp, b.size()));
    gser_ucx_link_stats_t t = lp.stats();
    EXPECT_EQ(t.decisions, s.decisions);
    EXPECT_EQ(t.raw_wins, s.raw_wins);
    EXPECT_NE(choose(lp, b), GSER_COMPRESSION_NONE);
    // and 10 s after the last sample, one is due whatever the count
    LinkPair idle;
    ASSERT_NO_FATAL_FAILURE(idle.open(GSER_UCX_COMPRESSION_AUTO));
    idle.set_rate(1e12);
    EXPECT_EQ(choose(idle, b), GSER_COMPRESSION_NONE);
    EXPECT_TRUE(raw_wins(idle, b.size()));
    gux_lock(idle.p.client.get());
    double sampled = idle.p.cep->link.sampled_at;
    idle.p.cep->link.sampled_at = sampled - 9900; // (white-box: the clock moved on)
    gux_unlock(idle.p.client.get());
    EXPECT_TRUE(raw_wins(idle, b.size()));
    gux_lock(idle.p.client.get());
    idle.p.cep->link.sampled_at = sampled - 10001;
    gux_unlock(idle.p.client.get());
    EXPECT_FALSE(raw_wins(idle, b.size()));
    EXPECT_EQ(idle.stats().raw_wins, 2u);
    // forced codecs are never decided by the link
    for (int mode : {GSER_UCX_COMPRESSION_LZ4, GSER_UCX_COMPRESSION_NONE}) {
        LinkPair f;
        ASSERT_NO_FATAL_FAILURE(f.open(mode));
        f.set_rate(1e12);
        choose(f, b);
        EXPECT_FALSE(raw_wins(f, b.size()));
        EXPECT_EQ(f.stats().decisions, 0u);
    }
}

// A message decided raw by the measurements alone is timed as raw: its
// sends measure the link's rate, as a sampled raw decision's do, even
// where the decision before it was a codec.
TEST(Link, RawWinsSendsMeasureTheLink)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto b = runs(12u << 20);
    lp.set_rate(1e6);
    ASSERT_NE(choose(lp, b), GSER_COMPRESSION_NONE); // sampled; a codec
    inject(lp, model(2e9));                         // then the link measured faster than either codec
    ASSERT_TRUE(raw_wins(lp, b.size()));
    EXPECT_EQ(codec_of(lp.p.cep.get()), GSER_COMPRESSION_NONE);
    gser_ucx_link_stats_t before = lp.stats();
    gser_frame_t f = host_frame(b);
    gser_ucx_request_t *sr = nullptr, *rr = nullptr;
    ASSERT_EQ(gser_ucx_ep_recv_nb(lp.p.sep.get(), nullptr, &rr), GSER_OK);
    ReqPtr r(rr);
    ASSERT_EQ(gser_ucx_ep_send_nb(lp.p.cep.get(), &f, 1, nullptr, &sr), GSER_OK) << gser_ucx_get_last_error();
    ReqPtr sp(sr);
    EXPECT_EQ(drive({lp.p.server.get(), lp.p.client.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
    EXPECT_EQ(drive({lp.p.server.get(), lp.p.client.get()}, sr), GSER_OK) << gser_ucx_get_last_error();
    gser_ucx_link_stats_t after = lp.stats();
    gux_lock(lp.p.client.get());
    double zrate = lp.p.cep->link.zrate, held = lp.p.cep->link.held;
    unsigned inflight = lp.p.cep->link.inflight;
    gux_unlock(lp.p.client.get());
    EXPECT_EQ(inflight, 0u);
    if (after.rate_samples == before.rate_samples)
        GTEST_SKIP() << "UCX completed the 12 MiB send at once here: nothing timed";
    // a raw window: the link's rate, or held until the next where it was
    // below half the injected 2 GB/s (loopback tcp on a loaded machine)
    EXPECT_TRUE(after.send_rate != before.send_rate || held > 0) << after.send_rate;
    EXPECT_EQ(zrate, 0); // not a compressed one
}

// A peer that announces no codec gets raw frames, link or not.
TEST(Link, PeerWithoutCodecsGetsRaw)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO, 0));
    auto b = runs(8u << 20);
    lp.set_rate(1e6);
    EXPECT_EQ(choose(lp, b), GSER_COMPRESSION_NONE);
    EXPECT_FALSE(lp.stats().link_aware);
    // and what gser_ucx_ep_send_msg sends arrives uncompressed
    auto ctx = make_ctx();
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = b.data();
    d.nbytes = b.size();
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    std::atomic<int> sst{GSER_INPROGRESS};
    std::thread t([&] { sst = gser_ucx_ep_send_msg(lp.p.cep.get(), ctx.get(), m, nullptr, kWaitMs); });
    gser_ucx_request_t *rr = nullptr;
    ASSERT_EQ(gser_ucx_ep_recv_nb(lp.p.sep.get(), nullptr, &rr), GSER_OK);
    ReqPtr r(rr);
    EXPECT_EQ(drive_recv(lp.p.server.get(), lp.p.client.get(), rr, sst), GSER_OK);
    t.join();
    EXPECT_EQ(sst.load(), GSER_OK);
    size_t wire = 0;
    bool compressed = true;
    ASSERT_EQ(gser_ucx_request_get_size(rr, &wire, &compressed), GSER_OK) << gser_ucx_get_last_error();
    EXPECT_GE(wire, b.size()); // raw on the wire
}

// Large messages sent with gser_ucx_ep_send_msg are timed: the endpoint
// measures a rate and decides per message; every message arrives whole.
TEST(Link, SendsMeasureTheLink)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    auto ctx = make_ctx();
    auto b = runs(12u << 20);
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = b.data();
    d.nbytes = b.size();
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    constexpr int kN = 6;
    std::atomic<int> sst{GSER_INPROGRESS};
    std::thread t([&] {
        int st = GSER_OK;
        for (int i = 0; i < kN && st == GSER_OK; i++)
            st = gser_ucx_ep_send_msg(lp.p.cep.get(), ctx.get(), m, nullptr, kWaitMs);
        sst = st;
    });
    for (int i = 0; i < kN; i++) {
        gser_ucx_request_t *rr = nullptr;
        ASSERT_EQ(gser_ucx_ep_recv_nb(lp.p.sep.get(), nullptr, &rr), GSER_OK);
        ReqPtr r(rr);
        ASSERT_EQ(drive_recv(lp.p.server.get(), lp.p.client.get(), rr, sst), GSER_OK) << gser_ucx_get_last_error();
        gser_msg_t *got = nullptr;
        ASSERT_EQ(gser_ucx_request_deserialize(rr, ctx.get(), nullptr, &got), GSER_OK);
        MsgPtr g(got);
        gser_buffer_desc_t gd = GSER_BUFFER_DESC_INIT;
        ASSERT_EQ(gser_value_get_buffer(gser_msg_get_root(got), &gd), GSER_OK);
        ASSERT_EQ(gd.nbytes, b.size());
        EXPECT_EQ(std::memcmp(gd.data, b.data(), b.size()), 0);
    }
    t.join();
    EXPECT_EQ(sst.load(), GSER_OK);
    gser_ucx_link_stats_t s = lp.stats();
    EXPECT_EQ(s.decisions, (uint64_t)kN);
    EXPECT_GE(s.samples, 1u);
    EXPECT_GE(s.rate_samples, 1u);
    EXPECT_GT(s.send_rate, 0);
    gux_lock(lp.p.client.get());
    EXPECT_EQ(lp.p.cep->link.inflight, 0u); // every timed send was counted back
    gux_unlock(lp.p.client.get());
}

// A message of many frames each too small to time alone (a DataFrame's
// pieces: hundreds of 10-60 KB frames, the first inlined into the head) is
// timed as one send, from its first post to its last completion: its raw
// sends measure the link. Untimed, such a link was never measured and
// every message went raw to measure it.
TEST(Link, MessagesOfSmallFramesMeasureTheLink)
{
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    // 15 MiB in frames under GUX_LINK_PART_MIN, posted before the receiver
    // reads: more than the sockets' buffers take, so sends are left to
    // complete (over loopback a receiver reading meanwhile can take each
    // as it is posted)
    constexpr size_t kFrames = 640, kFrame = 24u << 10;
    static_assert(kFrame < GUX_LINK_PART_MIN, "each frame alone is untimed");
    auto b = runs(kFrames * kFrame);
    std::vector<unsigned char> head(64, 7);
    std::vector<gser_frame_t> f(kFrames + 1);
    f[0] = host_frame(head);
    for (size_t i = 0; i < kFrames; i++) {
        f[i + 1].data = b.data() + i * kFrame;
        f[i + 1].size = kFrame;
        f[i + 1].memory = GSER_MEMORY_HOST;
    }
    gser_ucx_request_t *sr = nullptr, *rr = nullptr;
    ASSERT_EQ(gser_ucx_ep_send_nb(lp.p.cep.get(), f.data(), f.size(), nullptr, &sr), GSER_OK)
        << gser_ucx_get_last_error();
    ReqPtr sp(sr);
    gux_lock(lp.p.client.get());
    unsigned posted = lp.p.cep->link.inflight;
    gux_unlock(lp.p.client.get());
    EXPECT_EQ(posted, 1u); // one timed send: the message
    ASSERT_EQ(gser_ucx_ep_recv_nb(lp.p.sep.get(), nullptr, &rr), GSER_OK);
    ReqPtr r(rr);
    ASSERT_EQ(drive({lp.p.server.get(), lp.p.client.get()}, rr), GSER_OK) << gser_ucx_get_last_error();
    ASSERT_EQ(drive({lp.p.server.get(), lp.p.client.get()}, sr), GSER_OK) << gser_ucx_get_last_error();
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    ASSERT_EQ(gser_ucx_request_take(rr, &got), GSER_OK) << gser_ucx_get_last_error();
    EXPECT_EQ(got.nframes, f.size());
    if (got.nframes == f.size()) {
        EXPECT_EQ(got.frames[kFrames].size, kFrame);
        EXPECT_EQ(std::memcmp(got.frames[kFrames].data, b.data() + (kFrames - 1) * kFrame, kFrame), 0);
    }
    gser_ucx_recv_release(&got, false);
    gser_ucx_link_stats_t s = lp.stats();
    EXPECT_EQ(s.rate_samples, 1u);
    EXPECT_GT(s.send_rate, 0);
    gux_lock(lp.p.client.get());
    unsigned inflight = lp.p.cep->link.inflight;
    gux_unlock(lp.p.client.get());
    EXPECT_EQ(inflight, 0u); // counted back
}

// A receiver joining a message sent in parts (gser://) takes its buffer from
// the receive cache: warm memory, reused, as received frames get.
TEST(Link, HostBuffersComeFromTheReceiveCache)
{
    auto ctx = make_ucx_ctx();
    ASSERT_TRUE(ctx);
    auto w = make_worker(ctx.get(), nullptr);
    ASSERT_TRUE(w);
    const size_t n = (size_t)24 << 20;
    gser_frame_t f{};
    ASSERT_EQ(gser_ucx_worker_alloc_host(w.get(), n, &f), GSER_OK) << gser_ucx_get_last_error();
    ASSERT_TRUE(f.data && f.release);
    EXPECT_EQ(f.size, n);
    EXPECT_EQ(f.memory, GSER_MEMORY_HOST);
    memset(const_cast<void *>(f.data), 7, n); // writable, all of it
    const void *first = f.data;
    f.release(const_cast<void *>(f.data), f.release_arg);
    gser_ucx_cache_stats_t before = GSER_UCX_CACHE_STATS_INIT, after = GSER_UCX_CACHE_STATS_INIT;
    ASSERT_EQ(gser_ucx_worker_get_cache_stats(w.get(), &before), GSER_OK);
    EXPECT_GE(before.cached_bytes, n);
    ASSERT_EQ(gser_ucx_worker_alloc_host(w.get(), n, &f), GSER_OK) << gser_ucx_get_last_error();
    ASSERT_EQ(gser_ucx_worker_get_cache_stats(w.get(), &after), GSER_OK);
    EXPECT_EQ(f.data, first); // the same buffer, its pages faulted in already
    EXPECT_EQ(after.hits, before.hits + 1);
    EXPECT_EQ(after.misses, before.misses);
    // released after the worker: the cache outlives it
    w.reset();
    f.release(const_cast<void *>(f.data), f.release_arg);
    EXPECT_EQ(gser_ucx_worker_alloc_host(nullptr, n, &f), GSER_ERR_INVALID_ARG);
    // sizes whose size class or alignment would overflow: refused, never a short buffer
    auto w2 = make_worker(ctx.get(), nullptr);
    ASSERT_TRUE(w2);
    for (size_t huge : {SIZE_MAX, SIZE_MAX / 2 + 2, SIZE_MAX - ((size_t)1 << 20)}) {
        gser_frame_t g{};
        EXPECT_EQ(gser_ucx_worker_alloc_host(w2.get(), huge, &g), GSER_ERR_NO_MEMORY) << huge;
        EXPECT_EQ(g.data, nullptr); // untouched on failure
        EXPECT_NE(std::string(gser_ucx_get_last_error()).find("gser_ucx_worker_alloc_host"), std::string::npos)
            << gser_ucx_get_last_error();
    }
}

// The VmFlags of the mapping holding p ("" where none does).
static std::string mapping_flags(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return "?";
    char line[512];
    bool in = false;
    std::string flags;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = a >= lo && a < hi;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            flags = line + 8;
            break;
        }
    }
    fclose(f);
    return flags;
}

// Receive buffers of 2 MiB and more are asked to use huge pages, and are
// mappings of their own: advice given to heap memory stays with the address
// range after the buffer is freed, and the heap then faults in what it puts
// there (numpy's arrays) 2 MiB at a time, each zeroed whole.
TEST(Link, LargeHostBuffersLeaveNoAdviceBehind)
{
    auto ctx = make_ucx_ctx();
    ASSERT_TRUE(ctx);
    auto w = make_worker(ctx.get(), nullptr);
    ASSERT_TRUE(w);
    const size_t n = (size_t)5 << 20;
#ifdef __GLIBC__
    // A heap that serves blocks this large and keeps them when freed, as
    // glibc's does once its dynamic thresholds rose with large blocks freed.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
    gser_frame_t f{};
    ASSERT_EQ(gser_ucx_worker_alloc_host(w.get(), n, &f), GSER_OK) << gser_ucx_get_last_error();
    memset(const_cast<void *>(f.data), 1, n);
    EXPECT_EQ((uintptr_t)f.data % ((uintptr_t)2 << 20), 0u);
#ifdef MADV_HUGEPAGE
    std::string held = mapping_flags(f.data);
    if (held != "?") {
        EXPECT_NE(held.find(" hg"), std::string::npos) << held; // advised
    }
#endif
    const void *p = f.data;
    w.reset(); // its cache closed: the release frees the buffer
    f.release(const_cast<void *>(f.data), f.release_arg);
    std::string after = mapping_flags(p);
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 128 << 10); // glibc's defaults
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
#endif
    EXPECT_EQ(after.find(" hg"), std::string::npos) << "the freed buffer's range is still advised: " << after;
}

TEST(Link, BadArguments)
{
    int c;
    EXPECT_EQ(gser_ucx_ep_choose_compression(nullptr, nullptr, 0, false, 0, &c), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_ucx_ep_get_link_stats(nullptr, nullptr), GSER_ERR_INVALID_ARG);
    bool raw = true;
    EXPECT_EQ(gser_ucx_ep_raw_wins(nullptr, 1u << 20, false, &raw), GSER_ERR_INVALID_ARG);
    EXPECT_TRUE(raw); // untouched on failure
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("gser_ucx_ep_raw_wins"), std::string::npos);
    EXPECT_EQ(gser_ucx_ep_mark_posted(nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_ucx_get_last_error()).find("gser_ucx_ep_mark_posted"), std::string::npos);
    LinkPair lp;
    ASSERT_NO_FATAL_FAILURE(lp.open(GSER_UCX_COMPRESSION_AUTO));
    EXPECT_EQ(gser_ucx_ep_raw_wins(lp.p.cep.get(), 1u << 20, false, nullptr), GSER_ERR_INVALID_ARG);
}

} // namespace
