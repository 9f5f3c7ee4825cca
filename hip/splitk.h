// The split-K fix-up shared by the decode kernels whose blocks split one output tile's K
// (hip/gguf.hip, hip/gguf_mma.hip, hip/w4a16_decode_mma.hip): which block arrives last, and
// its ordered sum of the others' partial sums. HIP dialect.
#pragma once

#include <stdint.h>

#include "compat.h"

namespace qg {

// Split-K arrival of a block at its output tile's counter: true in every thread of the last of
// `splits` blocks to arrive. The barrier orders every thread's partial-sum stores before thread
// 0's release add (cumulative), and thread 0's acquire fence, taken after the last add, before
// the block's reads of the other blocks' sums (the barrier again): no __threadfence() in every
// thread (MEMBAR.SC.GPU and an L1 invalidation per block; bench/NOTES.md "GGUF decode").
// `flag` is the caller's __shared__ int.
__device__ __forceinline__ bool last_split_to_arrive(unsigned* counter, int splits, int& flag)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        flag = qg_atomic_add_release_gpu(counter, 1u) == (unsigned)(splits - 1);
        if (flag) qg_fence_acquire_gpu();
    }
    __syncthreads();
    return flag != 0;
}

// sum over s < splits of part[s * stride], added in split order (deterministic) and each
// cleared once read (a call leaves its workspace zeroed). Eight splits' loads are issued
// before their adds: a loop of one load, add and store per split waits one L2 round trip per
// split (the decode_frag fix-up measured that, bench/NOTES.md stop 21).
__device__ __forceinline__ float sum_and_clear_splits(volatile float* part, int64_t stride, int splits)
{
    constexpr int CB = 8;
    float sum = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += CB) {
        float q[CB];
#pragma unroll
        for (int c = 0; c < CB; ++c) q[c] = s0 + c < splits ? part[(int64_t)(s0 + c) * stride] : 0.0f;
#pragma unroll
        for (int c = 0; c < CB; ++c) {
            if (s0 + c >= splits) break;
            sum += q[c];
            part[(int64_t)(s0 + c) * stride] = 0.0f;
        }
    }
    return sum;
}

}  // namespace qg
