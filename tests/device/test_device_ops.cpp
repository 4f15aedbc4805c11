// The two device ops that compact sliced Arrow columns (offsets rebase, bit
// range copy), over every device backend: emulated (always) and CUDA when a
// GPU is present (skipped visibly otherwise). Outputs are poisoned first and
// checked byte by byte, the bytes around them included.
#include <algorithm>
#include <random>

#include "host/common.hpp"

#include <gser/arrow.h>

namespace {

class DeviceOpsTest : public ::testing::TestWithParam<const char *> {
  public:
    void SetUp() override
    {
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        o.trace = -1;
        o.device_backend = GetParam();
        gser_context_t *c = nullptr;
        if (gser_context_create(&o, &c) != GSER_OK)
            GTEST_SKIP() << GetParam() << " backend unavailable: " << gser_context_get_last_error(nullptr);
        ctx_.reset(c);
    }
    void TearDown() override
    {
        for (auto &a : allocs_)
            gser_device_free(ctx(), a.first, a.second, nullptr);
    }

    gser_context_t *ctx() { return ctx_.get(); }

    void *dalloc(size_t n)
    {
        void *p = nullptr;
        EXPECT_EQ(gser_device_alloc(ctx(), n, nullptr, &p), GSER_OK) << gser_context_get_last_error(ctx());
        allocs_.emplace_back(p, n);
        return p;
    }
    void put(void *dst, const void *src, size_t n)
    {
        ASSERT_EQ(gser_device_memcpy(ctx(), dst, GSER_MEMORY_DEVICE, src, GSER_MEMORY_HOST, n, nullptr), GSER_OK);
        ASSERT_EQ(gser_stream_wait(ctx(), nullptr), GSER_OK);
    }
    std::vector<unsigned char> get(const void *src, size_t n)
    {
        std::vector<unsigned char> out(n);
        EXPECT_EQ(gser_device_memcpy(ctx(), out.data(), GSER_MEMORY_HOST, src, GSER_MEMORY_DEVICE, n, nullptr),
                  GSER_OK);
        EXPECT_EQ(gser_stream_wait(ctx(), nullptr), GSER_OK);
        return out;
    }

    CtxPtr ctx_;
    std::vector<std::pair<void *, size_t>> allocs_;
};

template <typename T>
void check_rebase(DeviceOpsTest *t, size_t count, size_t at, uint32_t seed)
{
    std::mt19937_64 rng(seed);
    std::vector<T> src(at + count + 4);
    T v = (T)(rng() % 100000);
    for (auto &x : src) {
        x = v;
        v = (T)(v + rng() % 50);
    }
    const size_t guard = 16; // poisoned elements after the output
    void *dsrc = t->dalloc(src.size() * sizeof(T));
    void *ddst = t->dalloc((count + guard) * sizeof(T));
    t->put(dsrc, src.data(), src.size() * sizeof(T));
    std::vector<unsigned char> poison((count + guard) * sizeof(T), 0xA5);
    t->put(ddst, poison.data(), poison.size());
    GSER_EXPECT(t->ctx(), GSER_OK,
                gser_device_rebase_offsets(t->ctx(), ddst, (const T *)dsrc + at, count, sizeof(T), nullptr));
    auto got = t->get(ddst, poison.size());
    for (size_t i = 0; i < count; i++) {
        T g;
        std::memcpy(&g, &got[i * sizeof(T)], sizeof(T));
        ASSERT_EQ(g, (T)(src[at + i] - src[at])) << "offset " << i << " of " << count;
    }
    for (size_t i = count * sizeof(T); i < got.size(); i++)
        ASSERT_EQ(got[i], 0xA5) << "byte " << i << " past the output was written";
}

TEST_P(DeviceOpsTest, RebaseOffsetsInt32AndInt64)
{
    size_t counts[] = {1, 2, 3, 31, 32, 33, 255, 256, 257, 1000, 65537, (1u << 20) + 3};
    uint32_t seed = 1;
    for (size_t count : counts)
        for (size_t at : {0, 1, 7}) {
            check_rebase<int32_t>(this, count, at, seed++);
            check_rebase<int64_t>(this, count, at, seed++);
        }
}

// The reference: bit i of the output is bit src_bit + i of the input.
std::vector<unsigned char> ref_bits(const std::vector<unsigned char> &in, uint64_t src_bit, uint64_t nbits)
{
    std::vector<unsigned char> out((nbits + 7) / 8, 0);
    for (uint64_t i = 0; i < nbits; i++)
        if (in[(src_bit + i) / 8] >> ((src_bit + i) % 8) & 1)
            out[i / 8] |= (unsigned char)(1u << (i % 8));
    return out;
}

TEST_P(DeviceOpsTest, CopyBitsEveryShiftAndLength)
{
    std::mt19937 rng(7);
    std::vector<uint64_t> lengths;
    for (uint64_t n = 1; n <= 80; n++)
        lengths.push_back(n);
    for (uint64_t n : {127, 128, 129, 1000, 4095, 4096, 4097, 100003, 8000001})
        lengths.push_back(n);
    for (uint64_t src_bit : {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1001}) {
        for (uint64_t nbits : lengths) {
            if (nbits > 100000 && src_bit % 7)
                continue; // the big ones at a few shifts are enough
            // The input ends with the range's last byte, so that a read past
            // it is caught (ASan for the emulated backend, whose allocations
            // are rounded up to 256 bytes though; compute-sanitizer for CUDA).
            uint64_t in_end = (src_bit + nbits + 7) / 8;
            std::vector<unsigned char> in(in_end);
            for (auto &b : in)
                b = (unsigned char)rng();
            size_t out_bytes = (size_t)((nbits + 7) / 8), guard = 8;
            unsigned char *din = (unsigned char *)dalloc(in_end);
            unsigned char *dout = (unsigned char *)dalloc(out_bytes + guard);
            put(din, in.data(), in_end);
            std::vector<unsigned char> poison(out_bytes + guard, 0x5A);
            put(dout, poison.data(), poison.size());
            GSER_EXPECT(ctx(), GSER_OK, gser_device_copy_bits(ctx(), dout, din, src_bit, nbits, nullptr));
            auto got = get(dout, poison.size());
            auto want = ref_bits(in, src_bit, nbits);
            for (size_t i = 0; i < out_bytes; i++)
                ASSERT_EQ(got[i], want[i]) << "byte " << i << ", src_bit " << src_bit << ", nbits " << nbits;
            for (size_t i = out_bytes; i < got.size(); i++)
                ASSERT_EQ(got[i], 0x5A) << "byte " << i << " past the output was written";
            gser_device_free(ctx(), din, in_end, nullptr);
            gser_device_free(ctx(), dout, out_bytes + guard, nullptr);
            allocs_.resize(allocs_.size() - 2);
        }
    }
}

TEST_P(DeviceOpsTest, EmptyAndInvalidArguments)
{
    void *a = dalloc(64), *b = dalloc(64);
    // Nothing to do is fine, with any pointers.
    GSER_EXPECT(ctx(), GSER_OK, gser_device_rebase_offsets(ctx(), nullptr, nullptr, 0, 4, nullptr));
    GSER_EXPECT(ctx(), GSER_OK, gser_device_copy_bits(ctx(), nullptr, nullptr, 3, 0, nullptr));
    EXPECT_EQ(gser_device_rebase_offsets(ctx(), b, a, 4, 2, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("width"), std::string::npos);
    EXPECT_EQ(gser_device_rebase_offsets(ctx(), (char *)b + 2, a, 4, 4, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("aligned"), std::string::npos);
    EXPECT_EQ(gser_device_rebase_offsets(ctx(), (char *)a + 8, a, 4, 4, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("overlap"), std::string::npos);
    EXPECT_EQ(gser_device_rebase_offsets(ctx(), nullptr, a, 4, 8, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_device_copy_bits(ctx(), a, (char *)a + 1, 0, 16, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_device_copy_bits(ctx(), b, nullptr, 0, 16, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_device_copy_bits(ctx(), b, a, UINT64_MAX - 3, 16, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_device_rebase_offsets(nullptr, b, a, 1, 4, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_device_copy_bits(nullptr, b, a, 0, 1, nullptr), GSER_ERR_INVALID_ARG);
}

TEST(DeviceOpsNoBackend, NeedADeviceBackend)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = "none";
    CtxPtr c = make_ctx(&o);
    uint32_t src[2] = {5, 9}, dst[2];
    EXPECT_EQ(gser_device_rebase_offsets(c.get(), dst, src, 2, 4, nullptr), GSER_ERR_NO_DEVICE);
    EXPECT_EQ(gser_device_copy_bits(c.get(), dst, src, 1, 8, nullptr), GSER_ERR_NO_DEVICE);
    EXPECT_NE(std::string(gser_context_get_last_error(c.get())).find("device backend"), std::string::npos);
}

// The receiver's check of a peer's offsets in device memory.
template <typename T> uint32_t verdict_of(DeviceOpsTest *t, const std::vector<T> &offs, uint64_t end)
{
    void *d = t->dalloc(offs.size() * sizeof(T) + 1);
    if (!offs.empty())
        t->put(d, offs.data(), offs.size() * sizeof(T));
    uint32_t v = 0xdead;
    EXPECT_EQ(gser_device_check_offsets(t->ctx(), d, offs.size(), sizeof(T), end, nullptr, &v), GSER_OK)
        << gser_context_get_last_error(t->ctx());
    return v;
}

TEST_P(DeviceOpsTest, CheckOffsetsFindsEveryKindOfBadOffsets)
{
    std::vector<int32_t> good(100001);
    for (size_t i = 1; i < good.size(); i++)
        good[i] = good[i - 1] + (int32_t)(i % 5);
    uint64_t end = (uint64_t)good.back();
    EXPECT_EQ(verdict_of(this, good, end), 0u);
    EXPECT_EQ(verdict_of(this, good, end + 1), (uint32_t)GSER_OFFSETS_LAST);
    auto bad = good;
    bad[0] = 3;
    EXPECT_EQ(verdict_of(this, bad, end), (uint32_t)(GSER_OFFSETS_FIRST | GSER_OFFSETS_DECREASE));
    bad = good;
    bad[77777] = -5; // a decrease deep inside, and a negative value
    EXPECT_EQ(verdict_of(this, bad, end), (uint32_t)GSER_OFFSETS_DECREASE);
    bad = good;
    bad.back() = 1 << 30; // ends far past the data (what a hostile peer sends)
    EXPECT_EQ(verdict_of(this, bad, end), (uint32_t)GSER_OFFSETS_LAST);
    std::vector<int64_t> wide = {0, 10, 10, 4000000000ll};
    EXPECT_EQ(verdict_of(this, wide, 4000000000ull), 0u);
    EXPECT_EQ(verdict_of(this, wide, UINT64_MAX), (uint32_t)GSER_OFFSETS_LAST);
    EXPECT_EQ(verdict_of(this, std::vector<int32_t>{0}, 0), 0u) << "an empty column";
    uint32_t v;
    EXPECT_EQ(gser_device_check_offsets(ctx(), nullptr, 0, 4, 0, nullptr, &v), GSER_OK);
    EXPECT_EQ(v, 0u);
    EXPECT_EQ(gser_device_check_offsets(ctx(), dalloc(16), 2, 3, 0, nullptr, &v), GSER_ERR_INVALID_ARG);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOpsTest, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

} // namespace
