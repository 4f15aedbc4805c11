// device/cuda.c on a fake CUDA runtime (tests/device/fake_cuda): the CUDA
// backend's own logic, checked without a GPU. Which GPU is current for each
// runtime call (the context's, whatever the caller had), what gser does to
// the runtime's last-error slot (never takes the application's errors),
// how the copy kernel's plan is built (few copies as parameters, many
// uploaded and scanned), and when pinned memory is given back.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "cuda_runtime_api.h"
#include "device/backend.h"
}

namespace {

const devl_backend_t &cu = devl_backend_cuda;

struct Opened {
    devl_bstate_t *s = nullptr;
    explicit Opened(int ordinal) { EXPECT_EQ(cu.open(ordinal, &s), GSER_OK); }
    ~Opened()
    {
        if (s)
            cu.close(s);
    }
};

} // namespace

// Every call gser makes runs on the context's GPU (1), and the caller's
// current device (0) is what it finds afterwards.
TEST(CudaBackend, EveryCallRunsOnTheContextsGpuAndTheCallersDeviceIsKept)
{
    fake_reset(2);
    Opened o(1);
    ASSERT_TRUE(o.s);
    void *p = nullptr, *ev = nullptr, *st = nullptr, *pin = nullptr;
    ASSERT_EQ(cu.alloc(o.s, 256, nullptr, &p), GSER_OK);
    ASSERT_EQ(cu.event_create(o.s, &ev), GSER_OK);
    ASSERT_EQ(cu.stream_create(o.s, &st), GSER_OK);
    ASSERT_EQ(cu.memcpy(o.s, p, p, 10, DEVL_D2D, st), GSER_OK);
    ASSERT_EQ(cu.event_record(o.s, ev, st), GSER_OK);
    ASSERT_EQ(cu.stream_wait_event(o.s, nullptr, ev), GSER_OK);
    ASSERT_EQ(cu.event_query(o.s, ev), GSER_OK);
    ASSERT_EQ(cu.event_sync(o.s, ev), GSER_OK);
    ASSERT_EQ(cu.stream_sync(o.s, nullptr), GSER_OK);
    ASSERT_EQ(cu.pinned_alloc(o.s, 100, &pin), GSER_OK);
    const unsigned char *src[1] = {static_cast<unsigned char *>(p)};
    uint64_t size[1] = {10};
    devl_xfer_t x = {src, nullptr, size, 1, static_cast<unsigned char *>(p) + 64, 64, 64, DEVL_ARRAYS_HOST};
    ASSERT_EQ(cu.xfer(o.s, &x, nullptr), GSER_OK);
    cu.pinned_free(o.s, pin, 100);
    cu.event_destroy(o.s, ev);
    cu.stream_destroy(o.s, st);
    cu.free(o.s, p, 256, nullptr);
    int now = -1;
    cudaGetDevice(&now);
    EXPECT_EQ(now, 0) << "the caller's current device is given back";
    const fake_call_t *calls;
    size_t n = fake_calls(&calls);
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        std::string name = calls[i].name;
        if (name == "cudaSetDevice" || name == "cudaGetDeviceCount")
            continue;
        EXPECT_EQ(calls[i].device, 1) << name << " ran on GPU " << calls[i].device;
        checked++;
    }
    EXPECT_GE(checked, 15u);
}

// An error the application left in the slot is neither taken by gser's
// successful calls nor by a query's "not ready"; gser's own failure does not
// stay behind for the application to find.
TEST(CudaBackend, TheApplicationsLastErrorIsNeverTakenOrBlamed)
{
    fake_reset(1);
    Opened o(0);
    ASSERT_TRUE(o.s);
    void *p = nullptr, *ev = nullptr;
    ASSERT_EQ(cu.event_create(o.s, &ev), GSER_OK);
    fake_set_last_error(cudaErrorInvalidValue);
    ASSERT_EQ(cu.alloc(o.s, 256, nullptr, &p), GSER_OK);
    const unsigned char *src[1] = {static_cast<unsigned char *>(p)};
    uint64_t size[1] = {10};
    devl_xfer_t x = {src, nullptr, size, 1, static_cast<unsigned char *>(p) + 64, 64, 64, DEVL_ARRAYS_HOST};
    ASSERT_EQ(cu.xfer(o.s, &x, nullptr), GSER_OK) << "a launch's success is its own, not the slot's";
    fake_event_not_ready(1);
    EXPECT_EQ(cu.event_query(o.s, ev), GSER_INPROGRESS);
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue) << "the application's error is still there";
    cudaGetLastError();
    fake_fail_next("cudaEventRecord", cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cu.event_record(o.s, ev, nullptr), GSER_ERR_DEVICE);
    EXPECT_NE(std::string(cu.last_error(o.s)).find("cudaEventRecord"), std::string::npos) << cu.last_error(o.s);
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "gser's own error does not stay behind";
    fake_fail_next("launch_few", cudaErrorLaunchFailure);
    EXPECT_EQ(cu.xfer(o.s, &x, nullptr), GSER_ERR_DEVICE);
    cu.event_destroy(o.s, ev);
    cu.free(o.s, p, 256, nullptr);
}

// The plan: a few copies go as the kernel's parameter with positions from
// the host; many are uploaded (sources and sizes, 16 bytes a copy for a
// gather) and scanned on the device, in scratch memory freed in stream
// order. Either way every byte lands where the gather puts it.
TEST(CudaBackend, FewCopiesTravelAsParametersManyAreUploadedAndScanned)
{
    fake_reset(1);
    Opened o(0);
    ASSERT_TRUE(o.s);
    std::mt19937 rng(3);
    for (size_t n : {(size_t)DEVL_FEW, (size_t)DEVL_FEW + 1, (size_t)3000}) {
        std::vector<std::vector<unsigned char>> bufs(n);
        std::vector<const unsigned char *> src(n);
        std::vector<uint64_t> size(n);
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            bufs[i].resize(1 + rng() % 300);
            for (auto &b : bufs[i])
                b = (unsigned char)rng();
            src[i] = bufs[i].data();
            size[i] = bufs[i].size();
            total += (size[i] + 63) / 64 * 64;
        }
        std::vector<unsigned char> out(total, 0xA5);
        // Many copies' arrays sit in pinned memory, laid out src[n], size[n].
        std::vector<uint64_t> pinned(2 * n);
        std::memcpy(pinned.data(), src.data(), n * 8);
        std::memcpy(pinned.data() + n, size.data(), n * 8);
        bool few = n <= DEVL_FEW;
        devl_xfer_t x = {few ? src.data() : reinterpret_cast<const unsigned char *const *>(pinned.data()),
                         nullptr,
                         few ? size.data() : pinned.data() + n,
                         n,
                         out.data(),
                         total,
                         64,
                         few ? DEVL_ARRAYS_HOST : DEVL_ARRAYS_PINNED};
        size_t before_few = fake_count("launch_few"), before_many = fake_count("launch_many");
        size_t before_up = fake_count("cudaMemcpyAsync"), before_free = fake_count("cudaFreeAsync");
        ASSERT_EQ(cu.xfer(o.s, &x, nullptr), GSER_OK);
        EXPECT_EQ(fake_count("launch_few") - before_few, few ? 1u : 0u) << n;
        EXPECT_EQ(fake_count("launch_many") - before_many, few ? 0u : 1u) << n;
        EXPECT_EQ(fake_count("cudaMemcpyAsync") - before_up, few ? 0u : 1u) << "one upload, of the arrays only";
        EXPECT_EQ(fake_count("cudaFreeAsync") - before_free, few ? 0u : 1u) << "scratch freed in stream order";
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ(0, std::memcmp(&out[at], bufs[i].data(), size[i])) << "copy " << i << " of " << n;
            for (size_t z = size[i]; z < (size[i] + 63) / 64 * 64; z++)
                ASSERT_EQ(out[at + z], 0) << "padding after copy " << i;
            at += (size[i] + 63) / 64 * 64;
        }
    }
}

// Pinned blocks go back to a cache of bytes: a transfer loop with 16 blocks
// of one size in flight never calls cudaFreeHost (which waits for the whole
// device); the cache is emptied when the backend closes.
TEST(CudaBackend, PinnedMemoryInSteadyUseIsNeverGivenBack)
{
    fake_reset(1);
    Opened o(0);
    ASSERT_TRUE(o.s);
    for (int round = 0; round < 10; round++) {
        void *p[16];
        for (auto &x : p)
            ASSERT_EQ(cu.pinned_alloc(o.s, 1 << 20, &x), GSER_OK);
        for (auto &x : p)
            cu.pinned_free(o.s, x, 1 << 20);
    }
    EXPECT_EQ(fake_count("cudaMallocHost"), 16u);
    EXPECT_EQ(fake_count("cudaFreeHost"), 0u);
    cu.close(o.s);
    o.s = nullptr;
    EXPECT_EQ(fake_count("cudaFreeHost"), 16u);
}
