// The copy kernel and the plan scan: one launch works through a whole batch
// of copies (a gather when packing, a scatter when unpacking). The virtual
// bytes of the batch are cut into equal tiles, one warp each, in a
// grid-stride loop over a grid the size of what is resident at once: large
// buffers spread over every block, small ones share a warp (one lane each
// when tiny). The per-lane copy is copy_impl.h, shared with the emulated
// backend.
//
// Positions come from a scan: for a few copies the host computes them and
// the whole plan travels as a kernel parameter (no upload); for many the
// sizes are scanned on the device (two small kernels), so only the sources
// and sizes cross PCIe, or nothing when they are already on the device.
#include <cuda_runtime.h>

#include "copy_impl.h"
#include "plan.h"

#define DEVL_BLOCK 256
#define DEVL_WARPS_PER_BLOCK (DEVL_BLOCK / 32)
// Full occupancy on sm_80 and sm_90: 8 blocks of 256 threads per SM, so at
// most 32 registers a thread.
#define DEVL_MIN_BLOCKS 8

static __device__ __forceinline__ void tile_warp(const devl_plan_t *p, const devl_few_t *f, uint64_t t, unsigned lane)
{
    const uint64_t t0 = t * p->tile, t1 = devl_tile_end(p, t0);
    const uint64_t first = devl_find(p, f, t0);
    for (uint64_t b = first;; b += DEVL_LANES) {
        const uint64_t j = b + lane;
        const bool valid = j < p->n && devl_pos(p, f, j) < t1;
        if (!__any_sync(0xffffffffu, valid))
            break;
        devl_piece_t pc = {0, 0, 0, 0};
        if (valid)
            pc = devl_piece_of(p, f, j, t0, t1);
        const bool alone = valid && devl_piece_alone(&pc);
        if (alone)
            devl_piece_lane(&pc, 0, 1);
        unsigned big = __ballot_sync(0xffffffffu, valid && !alone);
        while (big) {
            const int k = __ffs(big) - 1;
            big &= big - 1;
            devl_piece_t q;
            q.src = (const unsigned char *)__shfl_sync(0xffffffffu, (unsigned long long)pc.src, k);
            q.dst = (unsigned char *)__shfl_sync(0xffffffffu, (unsigned long long)pc.dst, k);
            q.len = __shfl_sync(0xffffffffu, pc.len, k);
            q.zlen = __shfl_sync(0xffffffffu, pc.zlen, k);
            devl_piece_lane(&q, lane, DEVL_LANES);
        }
    }
}

static __device__ __forceinline__ void tiles(const devl_plan_t *p, const devl_few_t *f)
{
    const unsigned lane = threadIdx.x & 31u;
    const uint64_t warps = (uint64_t)gridDim.x * DEVL_WARPS_PER_BLOCK;
    const uint64_t ntiles = (p->total + p->tile - 1) / p->tile;
    for (uint64_t t = (uint64_t)blockIdx.x * DEVL_WARPS_PER_BLOCK + threadIdx.x / 32; t < ntiles; t += warps)
        tile_warp(p, f, t, lane);
}

__global__ void __launch_bounds__(DEVL_BLOCK, DEVL_MIN_BLOCKS) devl_copy_kernel(const devl_plan_t plan)
{
    tiles(&plan, nullptr);
}

// The few-copies form: the plan's arrays are the parameter itself
// (__grid_constant__: read in place, never copied to local memory). Its
// generic loads from parameter space need a few more registers: at 8 blocks
// an SM (32 registers) it spills, at 6 (40 registers, 75 % occupancy, still
// four 16-byte loads in flight per lane) it does not.
#define DEVL_FEW_MIN_BLOCKS 6
__global__ void __launch_bounds__(DEVL_BLOCK, DEVL_FEW_MIN_BLOCKS) devl_copy_few_kernel(const __grid_constant__ devl_few_t few)
{
    tiles(&few.plan, &few);
}

// ---- the scan of sizes into positions ------------------------------------------

// Exclusive scan of v over the block (up to 1024 threads); *total gets the sum.
static __device__ __forceinline__ uint64_t block_scan(uint64_t v, uint64_t *total)
{
    __shared__ uint64_t warp_sum[32];
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    uint64_t x = v;
    for (unsigned d = 1; d < 32; d *= 2) {
        uint64_t y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d)
            x += y;
    }
    if (lane == 31)
        warp_sum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t w = lane < nwarps ? warp_sum[lane] : 0;
        for (unsigned d = 1; d < 32; d *= 2) {
            uint64_t y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d)
                w += y;
        }
        if (lane < nwarps)
            warp_sum[lane] = w; // inclusive over warps
    }
    __syncthreads();
    const uint64_t before = warp ? warp_sum[warp - 1] : 0;
    *total = warp_sum[nwarps - 1];
    __syncthreads(); // warp_sum is reused by the next call
    return before + x - v;
}

// Positions inside each block of DEVL_SCAN_BLOCK copies, and the blocks' sums.
__global__ void __launch_bounds__(DEVL_BLOCK) devl_scan_local_kernel(const uint64_t *__restrict__ size, uint64_t n,
                                                                     uint32_t pad_align, uint64_t *__restrict__ pos_local,
                                                                     uint64_t *__restrict__ block_sum)
{
    const uint64_t first = (uint64_t)blockIdx.x * DEVL_SCAN_BLOCK + threadIdx.x * 4;
    uint64_t v[4], sum = 0;
    for (int k = 0; k < 4; k++) {
        v[k] = first + k < n ? size[first + k] + devl_pad(size[first + k], pad_align) : 0;
        sum += v[k];
    }
    uint64_t total;
    uint64_t at = block_scan(sum, &total);
    for (int k = 0; k < 4; k++) {
        if (first + k < n)
            pos_local[first + k] = at;
        at += v[k];
    }
    if (threadIdx.x == 0)
        block_sum[blockIdx.x] = total;
}

// The blocks' starts: one block of 1024 threads walks the sums 4096 at a time.
__global__ void __launch_bounds__(1024) devl_scan_blocks_kernel(const uint64_t *__restrict__ block_sum, uint64_t nb,
                                                                uint64_t *__restrict__ pos_block)
{
    uint64_t carry = 0;
    for (uint64_t first = 0; first < nb; first += 4096) {
        const uint64_t at0 = first + threadIdx.x * 4;
        uint64_t v[4], sum = 0;
        for (int k = 0; k < 4; k++) {
            v[k] = at0 + k < nb ? block_sum[at0 + k] : 0;
            sum += v[k];
        }
        uint64_t total;
        uint64_t at = carry + block_scan(sum, &total);
        for (int k = 0; k < 4; k++) {
            if (at0 + k < nb)
                pos_block[at0 + k] = at;
            at += v[k];
        }
        carry += total;
    }
}

// ---- launchers (C linkage, called by device/cuda.c) ----------------------------------

// Blocks of each copy kernel resident at once on one SM.
extern "C" cudaError_t devl_cuda_copy_occupancy(int *many_per_sm, int *few_per_sm)
{
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(many_per_sm, devl_copy_kernel, DEVL_BLOCK, 0);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(few_per_sm, devl_copy_few_kernel, DEVL_BLOCK, 0);
    return e;
}

static unsigned grid_for(const devl_plan_t *p, int max_blocks)
{
    const uint64_t ntiles = (p->total + p->tile - 1) / p->tile;
    uint64_t blocks = (ntiles + DEVL_WARPS_PER_BLOCK - 1) / DEVL_WARPS_PER_BLOCK;
    if (blocks > (uint64_t)max_blocks)
        blocks = (uint64_t)max_blocks;
    return (unsigned)(blocks ? blocks : 1);
}

// Launches go through cudaLaunchKernel, which returns the launch's own error:
// cudaGetLastError would also report (and clear) the application's.
extern "C" cudaError_t devl_cuda_launch_few(const devl_few_t *few, int max_blocks, cudaStream_t stream)
{
    void *args[] = {(void *)few};
    return cudaLaunchKernel(devl_copy_few_kernel, dim3(grid_for(&few->plan, max_blocks)), dim3(DEVL_BLOCK), args, 0,
                            stream);
}

extern "C" cudaError_t devl_cuda_launch_many(const devl_plan_t *plan, uint64_t *block_sum, int max_blocks,
                                             cudaStream_t stream)
{
    uint64_t n = plan->n, nb = (plan->n + DEVL_SCAN_BLOCK - 1) / DEVL_SCAN_BLOCK;
    uint32_t pad_align = plan->pad_align;
    const uint64_t *size = plan->size;
    uint64_t *pos_local = (uint64_t *)plan->pos_local, *pos_block = (uint64_t *)plan->pos_block;
    void *a1[] = {&size, &n, &pad_align, &pos_local, &block_sum};
    cudaError_t e = cudaLaunchKernel(devl_scan_local_kernel, dim3((unsigned)nb), dim3(DEVL_BLOCK), a1, 0, stream);
    if (e != cudaSuccess)
        return e;
    const uint64_t *sums = block_sum;
    void *a2[] = {&sums, &nb, &pos_block};
    if ((e = cudaLaunchKernel(devl_scan_blocks_kernel, dim3(1), dim3(1024), a2, 0, stream)) != cudaSuccess)
        return e;
    void *a3[] = {(void *)plan};
    return cudaLaunchKernel(devl_copy_kernel, dim3(grid_for(plan, max_blocks)), dim3(DEVL_BLOCK), a3, 0, stream);
}
