// MXFP4 mixture-of-experts GPU kernels (hip/moe.hip): their parameters, tile shapes and
// instantiation list, shared with the launcher (src/gpu/moe_launch.cpp). Kernels take raw
// pointers and report nothing; the launcher has checked every size.
//
//   kernel       launch            what
//   moe_align    qg_moe_align      pairs sorted by expert, padded per expert to tile_m (one block)
//   moe_gemm     qg_moe_stage1/2   one expert tile of tokens x 128 weight rows, mma.sync
//   moe_combine  qg_moe_stage2     y[t] = sum_j w[t, j] * out[t * top_k + j] (j ascending)
//
// Weights are the MoE frag layout of qg_moe_repack: every expert's matrix (w2: [H, I]) or
// two matrices (w13: gate [I, H], then up [I, H]) as W4A16 frag planes of G = 32 with E2M1
// nibbles (docs/w4a16-layout.md, "MXFP4"), stacked along the row blocks: row block rb of
// part h of expert e is row block (e * parts + h) * RBp + rb, RBp = ceil(rows / 16).
#pragma once

#include <stdint.h>

#include "compat.h"
#include "elem.h"

namespace qg {
namespace moe {

// ---------------------------------------------------------------- align
struct AlignParams {
    const int32_t* topk_ids;  // [P] = [T, top_k]
    int32_t* sorted_ids;      // [max_sorted]
    int32_t* tile_experts;    // [max_tiles]
    int32_t* num_sorted;      // [1]
    int pairs;                // P = T * top_k (also the padding value)
    int experts;              // E <= ALIGN_MAX_EXPERTS
    int tile_m;
    int max_sorted, max_tiles;
};
constexpr int ALIGN_THREADS = 1024;
constexpr int ALIGN_WARPS = ALIGN_THREADS / 32;
constexpr int ALIGN_MAX_EXPERTS = 1024;  // per-warp counts [32][E] int32 in shared memory
// The block of moe_align: a thread a pair or an expert, whichever are more, in whole warps, at
// most ALIGN_THREADS (the kernel needs one thread an expert for its scan).
__host__ __device__ constexpr int align_threads(int64_t pairs, int experts) {
    return static_cast<int>(
        ((pairs > experts ? (pairs < ALIGN_THREADS ? pairs : ALIGN_THREADS) : experts) + 31) / 32 * 32);
}
__host__ __device__ constexpr int align_smem_bytes(int experts) { return (ALIGN_WARPS + 2) * experts * 4 + 64 * 4; }
__global__ void moe_align(const AlignParams p);

// ---------------------------------------------------------------- expert GEMM (both stages)
enum Stage { STAGE_GATE_UP = 1, STAGE_DOWN = 2 };

struct GemmParams {
    const uint16_t* x;          // stage 1: x [T, K]; stage 2: act [P, K]; 16-bit, row stride ldx
    int64_t ldx;
    int x_row_div;              // x row of pair p: p / x_row_div (stage 1: top_k; stage 2: 1)
    const int32_t* sorted_ids;  // [tiles * tile_m]
    const int32_t* tile_experts;
    const int32_t* num_sorted;
    int tile_m;                 // 8 * MT
    int max_tiles;              // the tiles the routing tables can hold (bound on num_sorted / tile_m)
    int pairs;                  // P: a sorted id >= P is padding
    int experts;                // E: a tile of another expert id is skipped
    const uint32_t* qweight;    // MoE frag planes (file comment)
    const uint32_t* scales;     // bf16 2^(e - 127) pairs, as words
    int rows;                   // rows of one part: I (stage 1) or H (stage 2)
    int k;                      // K: H (stage 1) or I (stage 2)
    int k_chunks;               // KC = Kp / 128
    int part_blocks;            // RBp = ceil(rows / 16)
    BiasRef bias;               // canonical [E, 2I] (stage 1) or [E, H] (stage 2), or none
    // stage 1: act[p, c] = activation(gate + b, up + b), x's type
    void* act;
    int act_type;
    int concat;                 // gate/up rows of the bias: 1 concatenated, 0 interleaved
    int activation;             // QG_ACT_SILU_GLU or QG_ACT_SWIGLU_OAI
    float alpha, limit;
    // stage 2: out[p, n] = sum + b, fp32 (the workspace; moe_combine reads and clears it)
    float* out;
    // split-K (gridDim.z = splits > 1): split z writes its fp32 sums into plane z of `part`
    // (planes of `plane` floats, row q at q * ld_part: stage 1 gate at c, up at part_rows + c;
    // stage 2 n, its bias in plane 0), which moe_act / moe_combine add in split order
    float* part;
    int64_t plane;
    int ld_part, part_rows;
};

// Thread block: a slice of 4 warps, each two row blocks (stage 1: gate and up of one block of
// 16 channels, so a lane holds both values of its outputs; stage 2: two consecutive row
// blocks), all sharing the tile's x chunk [tile_m, 128] through a ring of GEMM_X_STAGES in
// shared memory; the weights go global -> registers, each lane its own 16-byte pieces, two
// chunks ahead. SL slices a block (SL > 1 only at tile_m 16: GPT-OSS at T = 1 has 180 stage-1
// blocks for 132 SMs) cut the block's K in SL contiguous parts, each slice with its own x ring,
// all walking their chunks in step through the block's barriers; the slices' sums meet in
// shared memory (the rings' space), added in slice order by slice 0, which alone runs the
// epilogue.
constexpr int GEMM_WARPS = 4;
constexpr int GEMM_THREADS = GEMM_WARPS * 32;
constexpr int GEMM_X_STAGES = 4;
constexpr int GEMM_XS_STRIDE = 128 + 8;  // ldmatrix rows 272 bytes apart: the 8 rows of a phase cover the banks
constexpr int GEMM_MAX_SLICES = 4;
// row blocks of one part a block covers: stage 1 one per warp (its gate and up), stage 2 two
__host__ __device__ constexpr int gemm_block_rbs(int stage) { return stage == STAGE_GATE_UP ? GEMM_WARPS : 2 * GEMM_WARPS; }
__host__ __device__ constexpr int gemm_smem_bytes(int mt, int slices) {
    return slices * GEMM_X_STAGES * mt * 8 * GEMM_XS_STRIDE * 2;
}
// the fp32 sums slices 1 .. SL - 1 hand to slice 0: two row blocks x MT x 4 a lane
__host__ __device__ constexpr int gemm_slice_sum_bytes(int mt, int slices) {
    return (slices - 1) * GEMM_THREADS * 2 * mt * 4 * 4;
}
static_assert(gemm_slice_sum_bytes(2, GEMM_MAX_SLICES) <= gemm_smem_bytes(2, GEMM_MAX_SLICES),
              "the slices' sums must fit the x rings they reuse");

// moe_gemm<XT, MT, STAGE, SL>: x type (fp16 / bf16), tile_m / 8, stage, slices; nullptr if
// not listed.
const void* gemm_kernel(int x_type, int mt, int stage, int slices);

#define QG_MOE_GEMM_KERNELS(X)                                                                          \
    X(ELEM_BF16, 2, 1, 1) X(ELEM_BF16, 4, 1, 1) X(ELEM_BF16, 8, 1, 1) X(ELEM_BF16, 2, 2, 1)             \
    X(ELEM_BF16, 4, 2, 1) X(ELEM_BF16, 8, 2, 1) X(ELEM_F16, 2, 1, 1) X(ELEM_F16, 4, 1, 1)               \
    X(ELEM_F16, 8, 1, 1) X(ELEM_F16, 2, 2, 1) X(ELEM_F16, 4, 2, 1) X(ELEM_F16, 8, 2, 1)                 \
    X(ELEM_BF16, 2, 1, 2) X(ELEM_BF16, 2, 2, 2) X(ELEM_F16, 2, 1, 2) X(ELEM_F16, 2, 2, 2)               \
    X(ELEM_BF16, 2, 1, 4) X(ELEM_BF16, 2, 2, 4) X(ELEM_F16, 2, 1, 4) X(ELEM_F16, 2, 2, 4)

// ---------------------------------------------------------------- grouped wgmma path (tile_m 64..256)
// Many tokens per expert: each stage gathers its activation rows by expert tile into the
// workspace (moe_gather) and runs the W4A16 prefill kernel grouped (hip/prefill_wgmma.h,
// PrefillParams::tile_experts): stage 1 with the activation in its epilogue (a row tile holds
// gate and up of 64 channels, PrefillParams::act), stage 2 into fp32 rows per pair for
// moe_combine; the gathered rows are cleared by a memset. moe_act serves the mma.sync tiles'
// split-K, and the grouped stage 1 under QG_EXP_MOE_FUSED_ACT=0 (fp32 gate / up rows, which it
// clears).
struct GatherParams {
    const uint16_t* src;        // x [T, K] (row stride ld) or act [P, K]
    int64_t ld;
    int row_div;                // source row of pair p: p / row_div
    const int32_t* sorted_ids;
    const int32_t* num_sorted;
    int max_rows;               // rows of dst (max_sorted)
    int pairs;
    int k;                      // K, a multiple of 8
    uint16_t* dst;              // [max_rows, K]: row r = the source row of sorted_ids[r] (padding: left 0)
};
constexpr int GATHER_THREADS = 256;
__global__ void moe_gather(const GatherParams p);

struct ActParams {
    float* h;                   // splits planes [P, 2 Ip] fp32: gate columns [0, I), up [Ip, Ip + I); cleared
    int64_t plane;              // floats of one plane
    int splits;                 // planes added in order (split-K of the mma tiles; 1: the grouped tier)
    int ld_h;                   // 2 Ip
    int part_rows;              // Ip
    const int32_t* sorted_ids;
    const int32_t* tile_experts;
    const int32_t* num_sorted;
    int tile_m, max_rows, pairs, experts;
    int inter;                  // I
    BiasRef bias;               // canonical [E, 2I]
    int concat, activation;
    float alpha, limit;
    void* act;                  // [P, I]
    int act_type;
};
constexpr int ACT_THREADS = 256;
constexpr int ACT_UNROLL = 4;  // columns a thread reads before it writes (hip/moe.hip)
__global__ void moe_act(const ActParams p);

// ---------------------------------------------------------------- combine (stage 2)
struct CombineParams {
    float* out;                // splits planes [P, H] fp32 (added in order), zeroed as read
    int64_t plane;
    int splits;
    const float* topk_weights; // [T, top_k]
    void* y;                   // [T, H], row stride ldy
    int64_t ldy;
    int tokens, top_k, hidden;
    int y_type;
};
constexpr int COMBINE_THREADS = 256;
__global__ void moe_combine(const CombineParams p);

}  // namespace moe
}  // namespace qg
