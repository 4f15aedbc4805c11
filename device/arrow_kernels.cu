// Two small kernels for compacting sliced Arrow columns (plugins/arrow):
// rebasing an offsets buffer so that it starts at 0, and moving a bit range of
// a bitmap to bit 0. The emulated backend runs the same arithmetic on the CPU
// (device/emulated.c). Both are memory-bound grid-stride loops.
#include <cuda_runtime.h>
#include <stdint.h>

#define GSER_ARROW_BLOCK 256

// dst[i] = src[i] - src[0]. Every thread reads src[0] itself (one cached
// load): no host round trip, and no second launch to broadcast it.
template <typename T>
__global__ void __launch_bounds__(GSER_ARROW_BLOCK)
    gser_rebase_kernel(T *__restrict__ dst, const T *__restrict__ src, size_t n)
{
    const T base = src[0];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i] - base;
}

// One output byte per iteration: bits [8j, 8j + 8) of the output are source
// bits from src_bit + 8j on, taken from at most two source bytes, never one
// past the range. Bits past nbits in the last byte are written as 0.
__global__ void __launch_bounds__(GSER_ARROW_BLOCK)
    gser_copy_bits_kernel(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src, unsigned shift,
                          uint64_t nbits, uint64_t nbytes, uint64_t in_bytes)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nbytes; j += stride) {
        unsigned v = (unsigned)src[j] >> shift;
        if (shift && j + 1 < in_bytes)
            v |= (unsigned)src[j + 1] << (8 - shift);
        if (j == nbytes - 1 && (nbits & 7))
            v &= (1u << (nbits & 7)) - 1;
        dst[j] = (unsigned char)v;
    }
}

// Validate offsets: bit 0 if the first is not 0, bit 1 if any decreases, bit
// 2 if the last is not end (or is negative). Each thread compares pairs; the
// flags meet in one word with atomicOr, set only when something is wrong.
template <typename T>
__global__ void __launch_bounds__(GSER_ARROW_BLOCK)
    gser_check_offsets_kernel(const T *__restrict__ o, size_t n, long long end, unsigned *verdict)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned v = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T cur = o[i];
        if (i == 0 && cur != 0)
            v |= 1u;
        if (i > 0 && cur < o[i - 1])
            v |= 2u;
        if (i + 1 == n && (cur < 0 || (long long)cur != end))
            v |= 4u;
    }
    if (v)
        atomicOr(verdict, v);
}

static unsigned grid_for(uint64_t n, int sm_count)
{
    uint64_t blocks = (n + GSER_ARROW_BLOCK - 1) / GSER_ARROW_BLOCK;
    uint64_t cap = (uint64_t)(sm_count > 0 ? sm_count : 1) * 16; // a few waves; the loop takes the rest
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks ? blocks : 1);
}

// cudaLaunchKernel returns the launch's own error (cudaGetLastError would also
// report, and clear, the application's). Arguments are passed by address and
// must have the kernel's parameter types.
template <typename K> static cudaError_t launch(K *kernel, unsigned grid, void **args, cudaStream_t stream)
{
    return cudaLaunchKernel(kernel, dim3(grid), dim3(GSER_ARROW_BLOCK), args, 0, stream);
}

extern "C" cudaError_t gser_cuda_launch_rebase_offsets(void *dst, const void *src, size_t count, unsigned width,
                                                      int sm_count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    void *args[] = {&dst, &src, &count};
    if (width == 4)
        return launch(gser_rebase_kernel<uint32_t>, grid_for(count, sm_count), args, stream);
    return launch(gser_rebase_kernel<uint64_t>, grid_for(count, sm_count), args, stream);
}

extern "C" cudaError_t gser_cuda_launch_copy_bits(void *dst, const void *src, uint64_t src_bit, uint64_t nbits,
                                                 int sm_count, cudaStream_t stream)
{
    if (nbits == 0)
        return cudaSuccess;
    unsigned shift = (unsigned)(src_bit & 7);
    uint64_t nbytes = (nbits + 7) / 8, in_bytes = (shift + nbits + 7) / 8;
    const unsigned char *from = (const unsigned char *)src + src_bit / 8;
    void *args[] = {&dst, &from, &shift, &nbits, &nbytes, &in_bytes};
    return launch(gser_copy_bits_kernel, grid_for(nbytes, sm_count), args, stream);
}

extern "C" cudaError_t gser_cuda_launch_check_offsets(const void *offsets, size_t count, unsigned width, uint64_t end,
                                                     uint32_t *verdict, int sm_count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    // An end past INT64_MAX cannot match a signed offset: flag it here.
    long long e = end > (uint64_t)INT64_MAX ? -1 : (long long)end;
    void *args[] = {&offsets, &count, &e, &verdict};
    if (width == 4)
        return launch(gser_check_offsets_kernel<int32_t>, grid_for(count, sm_count), args, stream);
    return launch(gser_check_offsets_kernel<int64_t>, grid_for(count, sm_count), args, stream);
}
