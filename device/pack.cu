// The copy kernel: one launch works through a whole copy plan (gather when
// packing, scatter when unpacking). Each warp takes chunks of at most
// DEVL_CHUNK_BYTES, so huge buffers spread over the whole GPU while tiny ones
// cost one warp pass each; the per-warp copy is copy_impl.h, shared with the
// emulated backend.
#include <cuda_runtime.h>

#include "copy_impl.h"
#include "plan.h"

#define GSER_BLOCK 256
#define GSER_WARPS_PER_BLOCK (GSER_BLOCK / 32)

__global__ void __launch_bounds__(GSER_BLOCK) gser_copy_kernel(const devl_chunk_t *__restrict__ chunks, size_t n)
{
    const unsigned lane = threadIdx.x & 31u;
    const size_t warps = (size_t)gridDim.x * GSER_WARPS_PER_BLOCK;
    for (size_t c = (size_t)blockIdx.x * GSER_WARPS_PER_BLOCK + threadIdx.x / 32; c < n; c += warps) {
        const devl_chunk_t ch = chunks[c];
        gser_run_chunk_lane(&ch, lane);
    }
}

extern "C" cudaError_t gser_cuda_launch_copy(const devl_chunk_t *chunks, size_t nchunks, int sm_count,
                                             cudaStream_t stream)
{
    if (nchunks == 0)
        return cudaSuccess;
    // Enough warps to cover the chunks, at most a few waves of resident blocks
    // (the grid-stride loop takes the rest).
    size_t blocks = (nchunks + GSER_WARPS_PER_BLOCK - 1) / GSER_WARPS_PER_BLOCK;
    size_t cap = (size_t)(sm_count > 0 ? sm_count : 1) * 16;
    if (blocks > cap)
        blocks = cap;
    gser_copy_kernel<<<(unsigned)blocks, GSER_BLOCK, 0, stream>>>(chunks, nchunks);
    return cudaGetLastError();
}
