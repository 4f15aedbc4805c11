// gser-bench-device: packing device buffers, against anchors measured in the
// same run on the same GPU.
//
//   gser-bench-device [--json] [--quick]
//
// For each shape (count x size) the same bytes are gathered by
//   - gser's pack kernel alone, its plan (sources and sizes) already in device
//     memory -- as CUB's arrays are -- so only device work is timed
//     ("pack_<shape>": the kernel's rows, against one contiguous copy of the
//     same bytes, cub::DeviceMemcpy::Batched and a cudaMemcpyAsync loop);
//   - gser_serialize end to end ("serialize_<shape>"): host encoding, the
//     plan's upload or kernel parameters, the scan and the kernel, timed from
//     an event before the call to one after the work, so host time that
//     leaves the GPU idle counts; against CUB plus the upload of its arrays.
// Times are device time between events (median of repetitions after
// warm-up). Then the host family: 10 device columns of 8 MB to pinned host
// memory, against ten pageable D2H copies (what cuDF's host_serialize does).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cub/device/device_memcpy.cuh>
#include <cuda_runtime.h>

#include <gser/gser.h>

extern "C" {
#include "bench_util.h"
#include "device/device.h"
devl_t *bench_ctx_devl(gser_context_t *ctx); // bench/bench_devl.c
}

#define CUDA_CHECK(call)                                                                                     \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#define GSER_CHECK(call)                                                                                     \
    do {                                                                                                     \
        gser_status_t st_ = (call);                                                                          \
        if (st_ != GSER_OK) {                                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, gser_status_str(st_),                    \
                    gser_context_get_last_error(g_ctx));                                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static gser_context_t *g_ctx;
static cudaStream_t g_stream;
static cudaEvent_t g_e0, g_e1;

// Random-looking bytes, never zeros.
__global__ void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        p[i] = (unsigned char)(x ^ (x >> 15)) | 1u;
    }
}

// Median device time (ms) of fn() between two events on g_stream.
template <class F> static double device_ms(F fn, int warmup, int reps)
{
    for (int i = 0; i < warmup; i++)
        fn();
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    std::vector<double> t(reps);
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaEventRecord(g_e0, g_stream));
        fn();
        CUDA_CHECK(cudaEventRecord(g_e1, g_stream));
        CUDA_CHECK(cudaEventSynchronize(g_e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, g_e0, g_e1));
        t[i] = ms;
    }
    qsort(t.data(), t.size(), sizeof(double), bench_cmp_double);
    return t[reps / 2];
}

struct Shape {
    size_t count, size;
    const char *name;
};

// The packed bytes: buffer i at i * its size rounded up to 64, zeros between
// (every 97th buffer checked when there are many).
static void check_packed(const Shape &s, const std::vector<void *> &srcs, const unsigned char *packed, size_t n)
{
    std::vector<unsigned char> got(n), want(s.size);
    CUDA_CHECK(cudaMemcpy(got.data(), packed, n, cudaMemcpyDeviceToHost));
    const size_t step = (s.size + 63) / 64 * 64;
    for (size_t i = 0; i < s.count; i += (s.count > 1000 ? 97 : 1)) {
        CUDA_CHECK(cudaMemcpy(want.data(), srcs[i], s.size, cudaMemcpyDeviceToHost));
        if (memcmp(got.data() + i * step, want.data(), s.size) != 0) {
            fprintf(stderr, "%s: packed buffer %zu differs\n", s.name, i);
            exit(1);
        }
        for (size_t z = s.size; z < step; z++)
            if (got[i * step + z]) {
                fprintf(stderr, "%s: padding after buffer %zu is not zero\n", s.name, i);
                exit(1);
            }
    }
}

static void bench_shape(const Shape &s, bool json, bool quick)
{
    const size_t stride = (s.size + 255) / 256 * 256; // separate, aligned buffers, as cudaMalloc gives
    const size_t total = s.count * s.size;
    unsigned char *src, *dst;
    CUDA_CHECK(cudaMalloc(&src, s.count * stride));
    CUDA_CHECK(cudaMalloc(&dst, s.count * stride + 64 * s.count));
    fill<<<1024, 256, 0, g_stream>>>(src, s.count * stride, (unsigned)s.count);
    CUDA_CHECK(cudaGetLastError());

    std::vector<void *> srcs(s.count), dsts(s.count);
    std::vector<size_t> sizes(s.count, s.size);
    for (size_t i = 0; i < s.count; i++) {
        srcs[i] = src + i * stride;
        dsts[i] = dst + i * s.size;
    }
    const int reps = quick ? 3 : 21;

    // (a) one contiguous copy of the same number of bytes
    double t_one = device_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, total, cudaMemcpyDeviceToDevice, g_stream)); },
                             3, reps);

    // (b) CUB, with its pointer and size arrays already on the device
    void **d_srcs, **d_dsts;
    size_t *d_sizes;
    CUDA_CHECK(cudaMalloc(&d_srcs, s.count * sizeof(void *)));
    CUDA_CHECK(cudaMalloc(&d_dsts, s.count * sizeof(void *)));
    CUDA_CHECK(cudaMalloc(&d_sizes, s.count * sizeof(size_t)));
    CUDA_CHECK(cudaMemcpy(d_srcs, srcs.data(), s.count * sizeof(void *), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dsts, dsts.data(), s.count * sizeof(void *), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_sizes, sizes.data(), s.count * sizeof(size_t), cudaMemcpyHostToDevice));
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceMemcpy::Batched(nullptr, temp_bytes, d_srcs, d_dsts, d_sizes, (int64_t)s.count, g_stream));
    void *temp;
    CUDA_CHECK(cudaMalloc(&temp, temp_bytes ? temp_bytes : 1));
    double t_cub = device_ms(
        [&] {
            CUDA_CHECK(cub::DeviceMemcpy::Batched(temp, temp_bytes, d_srcs, d_dsts, d_sizes, (int64_t)s.count, g_stream));
        },
        3, reps);

    // (c) one cudaMemcpyAsync per buffer (slow with many buffers: fewer runs)
    int loop_reps = s.count >= 10000 ? 1 : reps;
    double t_loop = device_ms(
        [&] {
            for (size_t i = 0; i < s.count; i++)
                CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], s.size, cudaMemcpyDeviceToDevice, g_stream));
        },
        s.count >= 10000 ? 0 : 2, loop_reps);

    // gser's pack kernel alone: sources and sizes already on the device.
    std::vector<uint64_t> sizes64(s.count, s.size);
    const void **d_gsrc;
    uint64_t *d_gsize;
    unsigned char *packed;
    const uint64_t padded = (uint64_t)s.count * ((s.size + 63) / 64 * 64);
    CUDA_CHECK(cudaMalloc(&d_gsrc, s.count * sizeof(void *)));
    CUDA_CHECK(cudaMalloc(&d_gsize, s.count * sizeof(uint64_t)));
    CUDA_CHECK(cudaMalloc(&packed, padded));
    CUDA_CHECK(cudaMemcpy(d_gsrc, srcs.data(), s.count * sizeof(void *), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_gsize, sizes64.data(), s.count * sizeof(uint64_t), cudaMemcpyHostToDevice));
    devl_t *dl = bench_ctx_devl(g_ctx);
    double t_kernel = device_ms(
        [&] { GSER_CHECK(devl_gather_resident(dl, d_gsrc, d_gsize, s.count, padded, packed, g_stream)); }, 3, reps);
    check_packed(s, srcs, packed, padded);

    // CUB end to end: its arrays uploaded from the host first, as a caller
    // without them on the device would.
    double t_cub_e2e = device_ms(
        [&] {
            CUDA_CHECK(cudaMemcpyAsync(d_srcs, srcs.data(), s.count * sizeof(void *), cudaMemcpyHostToDevice, g_stream));
            CUDA_CHECK(cudaMemcpyAsync(d_dsts, dsts.data(), s.count * sizeof(void *), cudaMemcpyHostToDevice, g_stream));
            CUDA_CHECK(cudaMemcpyAsync(d_sizes, sizes.data(), s.count * sizeof(size_t), cudaMemcpyHostToDevice,
                                       g_stream));
            CUDA_CHECK(cub::DeviceMemcpy::Batched(temp, temp_bytes, d_srcs, d_dsts, d_sizes, (int64_t)s.count, g_stream));
        },
        3, reps);

    // gser_serialize end to end: a message of count device buffers, all
    // packed into one frame.
    gser_msg_t *msg;
    gser_value_t *list, *v;
    GSER_CHECK(gser_msg_create(g_ctx, &msg));
    GSER_CHECK(gser_msg_new_list(msg, &list));
    for (size_t i = 0; i < s.count; i++) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = srcs[i];
        d.nbytes = s.size;
        d.memory = GSER_MEMORY_DEVICE;
        GSER_CHECK(gser_msg_new_buffer(msg, &d, &v));
        GSER_CHECK(gser_list_append(list, v));
    }
    GSER_CHECK(gser_msg_set_root(msg, list));
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.pack_max = SIZE_MAX; // everything packed, even 64 MiB buffers
    so.stream = g_stream;
    double host_us = 0;
    int calls = 0;
    gser_frames_t *f = nullptr;
    double t_gser = device_ms(
        [&] {
            gser_frames_destroy(f); // the previous run's, complete by now
            double t0 = bench_now_us();
            GSER_CHECK(gser_serialize(g_ctx, msg, &so, &f));
            host_us += bench_now_us() - t0;
            calls++;
        },
        3, reps);
    host_us /= calls;
    GSER_CHECK(gser_frames_wait(f));
    const gser_frame_t *fr = gser_frames_get_array(f);
    check_packed(s, srcs, (const unsigned char *)fr[1].data, fr[1].size);
    gser_frames_destroy(f);
    gser_msg_destroy(msg);

    char name[64], note[160];
    snprintf(name, sizeof name, "pack_%s", s.name);
    snprintf(note, sizeof note, "kernel alone, plan on the device; %.1f GB/s read", total / (t_kernel * 1e6));
    bench_result_t r1 = {name, t_kernel, "ms", "one contiguous cudaMemcpyAsync (ms)", t_one, "<= 1.25", note};
    bench_print(&r1, json);
    snprintf(name, sizeof name, "pack_%s_vs_cub", s.name);
    bench_result_t r2 = {name, t_kernel, "ms", "cub::DeviceMemcpy::Batched (ms)", t_cub, "<= 1", NULL};
    bench_print(&r2, json);
    snprintf(name, sizeof name, "pack_%s_vs_loop", s.name);
    bench_result_t r3 = {name, t_kernel, "ms", "cudaMemcpyAsync per buffer (ms)", t_loop, "<= 1", NULL};
    bench_print(&r3, json);
    snprintf(name, sizeof name, "serialize_%s", s.name);
    snprintf(note, sizeof note, "gser_serialize end to end; host time in the call %.0f us", host_us);
    bench_result_t r4 = {name, t_gser, "ms", "CUB incl. uploading its arrays (ms)", t_cub_e2e, "<= 1", note};
    bench_print(&r4, json);

    CUDA_CHECK(cudaFree(d_gsrc));
    CUDA_CHECK(cudaFree(d_gsize));
    CUDA_CHECK(cudaFree(packed));
    CUDA_CHECK(cudaFree(temp));
    CUDA_CHECK(cudaFree(d_srcs));
    CUDA_CHECK(cudaFree(d_dsts));
    CUDA_CHECK(cudaFree(d_sizes));
    CUDA_CHECK(cudaFree(src));
    CUDA_CHECK(cudaFree(dst));
}

// The host family: 10 device columns of 8 MB to host memory.
static void bench_host_family(bool json, bool quick)
{
    const size_t ncol = 10, size = 8u << 20;
    std::vector<unsigned char *> cols(ncol);
    for (auto &c : cols) {
        CUDA_CHECK(cudaMalloc(&c, size));
        fill<<<1024, 256, 0, g_stream>>>(c, size, 7);
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    const int reps = quick ? 3 : 15;

    // cuDF's way: one pageable D2H copy per column.
    std::vector<std::vector<unsigned char>> host(ncol, std::vector<unsigned char>(size));
    std::vector<double> t(reps);
    for (int r = -2; r < reps; r++) {
        double t0 = bench_now_us();
        for (size_t i = 0; i < ncol; i++)
            CUDA_CHECK(cudaMemcpy(host[i].data(), cols[i], size, cudaMemcpyDeviceToHost));
        if (r >= 0)
            t[r] = (bench_now_us() - t0) / 1e3;
    }
    qsort(t.data(), reps, sizeof(double), bench_cmp_double);
    double t_pageable = t[reps / 2];

    gser_msg_t *msg;
    gser_value_t *list, *v;
    GSER_CHECK(gser_msg_create(g_ctx, &msg));
    GSER_CHECK(gser_msg_new_list(msg, &list));
    for (size_t i = 0; i < ncol; i++) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = cols[i];
        d.nbytes = size;
        d.memory = GSER_MEMORY_DEVICE;
        GSER_CHECK(gser_msg_new_buffer(msg, &d, &v));
        GSER_CHECK(gser_list_append(list, v));
    }
    GSER_CHECK(gser_msg_set_root(msg, list));
    const char *const host_only[] = {"host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = host_only;
    so.nfamilies = 1;
    so.stream = g_stream;
    for (int r = -2; r < reps; r++) {
        gser_frames_t *f;
        double t0 = bench_now_us();
        GSER_CHECK(gser_serialize(g_ctx, msg, &so, &f));
        GSER_CHECK(gser_frames_wait(f));
        if (r >= 0)
            t[r] = (bench_now_us() - t0) / 1e3;
        if (r == reps - 1) {
            const gser_frame_t *fr = gser_frames_get_array(f);
            if (gser_frames_get_count(f) != 2 || memcmp((const char *)fr[1].data + 3 * size, host[3].data(), size) != 0) {
                fprintf(stderr, "host family: column 3 differs\n");
                exit(1);
            }
        }
        gser_frames_destroy(f);
    }
    qsort(t.data(), reps, sizeof(double), bench_cmp_double);
    char note[96];
    snprintf(note, sizeof note, "speedup %.2fx; %.1f GB/s", t_pageable / t[reps / 2], ncol * size / (t[reps / 2] * 1e6));
    bench_result_t r = {"host_family_10x8MB", t[reps / 2], "ms", "10 pageable cudaMemcpy D2H (ms)", t_pageable, "<= 1",
                        note};
    bench_print(&r, json);
    gser_msg_destroy(msg);
    for (auto &c : cols)
        CUDA_CHECK(cudaFree(c));
}

int main(int argc, char **argv)
{
    bool json = false, quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else {
            fprintf(stderr, "usage: gser-bench-device [--json] [--quick]\n");
            return 2;
        }
    }
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = "cuda";
    if (gser_context_create(&o, &g_ctx) != GSER_OK) {
        fprintf(stderr, "gser-bench-device: %s\n", gser_context_get_last_error(nullptr));
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (!json)
        printf("# %s, %d SMs, CUDA %d.%d\n", prop.name, prop.multiProcessorCount, CUDART_VERSION / 1000,
               CUDART_VERSION % 1000 / 10);
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&g_e0));
    CUDA_CHECK(cudaEventCreate(&g_e1));
    const Shape shapes[] = {{100000, 256, "100000x256B"}, {10000, 13, "10000x13B"},   {10000, 4096, "10000x4KiB"},
                            {1000, 65536, "1000x64KiB"},  {100, 1 << 20, "100x1MiB"}, {16, 64u << 20, "16x64MiB"}};
    for (const Shape &s : shapes)
        if (!quick || s.count * s.size < (64u << 20))
            bench_shape(s, json, quick);
    bench_host_family(json, quick);
    CUDA_CHECK(cudaEventDestroy(g_e0));
    CUDA_CHECK(cudaEventDestroy(g_e1));
    CUDA_CHECK(cudaStreamDestroy(g_stream));
    gser_context_destroy(g_ctx);
    return 0;
}
