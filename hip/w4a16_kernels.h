// W4A16 GPU kernels: their parameters, tile shapes and instantiation lists, shared by the
// kernel files (hip/w4a16_*.hip, one compilation unit each) and the launcher
// (src/gpu/w4a16_launch.cpp). Kernels take raw pointers and report nothing.
//
//   kernel          file                        layout     tier
//   decode_simt     hip/w4a16_simt.hip          both       <gpu>:simt (portable)
//   decode_mma      hip/w4a16_decode_mma.hip    canonical  <gpu>:decode_mma (sm_80+)
//   decode_frag     hip/w4a16_decode_frag.hip   frag       <gpu>:decode_frag (sm_80+)
//   prefill_wgmma   hip/prefill_wgmma.h         frag       <gpu>:prefill_wgmma (sm_90a)
//                   (instantiated in hip/w4a16_prefill.hip and hip/w4a16_prefill_sk.hip)
//   repack_frag     hip/w4a16_repack.hip        -> frag    qg_w4a16_repack on a GPU context
#pragma once

#include <stdint.h>

#include "compat.h"
#include "elem.h"

namespace qg {
namespace w4a16 {

// What a frag-layout nibble codes: a W4A16 integer q (the weight is (q - z) * s), an MXFP4
// E2M1 value (the weight is e2m1(q) * s, G = 32, s = 2^(e - 127) from the E8M0 byte), or a
// GGUF Q4_K code (the weight is (d * sc) * q - dmin * m, G = 32: the scale words hold the
// records sc | m << 8 of src/formats/gguf_frag.h, `superblocks` the fp16 d and dmin per 256),
// or a GGUF IQ4_XS codebook index (the weight is (d * (ls - 32)) * kvalues[q], G = 32: the
// records hold ls, `superblocks` d), or a GGUF Q8_0 byte (not a nibble: the int8 q of weight
// d * q, G = 32, the scale words Q4_0's fp16 d; its weights plane is the byte plane of
// src/formats/gguf_frag.h, twice the nibble plane), or a GGUF Q6_K byte (q - 32 of weight
// (d * sc) * (q - 32): Q8_0's byte plane with Q4_K's records, two int8 scales sc of 16
// elements each, and super-block words d; its groups are 16 elements), or a GGUF IQ3_XXS code (a
// signed grid magnitude's index into its codebook, IQ4_XS's planes otherwise: the weight is
// ((d * (0.5 + ls)) * 0.5) * value). The frag kernels serve all seven; the code-to-A-register step
// and the group's epilogue differ.
enum WeightCode {
    CODE_INT4 = 0, CODE_E2M1 = 1, CODE_Q4_K = 2, CODE_IQ4_XS = 3, CODE_Q8_0 = 4, CODE_Q6_K = 5, CODE_IQ3_XXS = 6
};
// The codes whose scale words are records with super-block words (src/formats/gguf_frag.h).
__host__ __device__ constexpr bool has_superblocks(int code) {
    return code == CODE_Q4_K || code == CODE_IQ4_XS || code == CODE_Q6_K || code == CODE_IQ3_XXS;
}
// The codes that index a 16-entry codebook (hip/mma.h codebook_word), and which one.
__host__ __device__ constexpr bool codebook_codes(int code) { return code == CODE_IQ4_XS || code == CODE_IQ3_XXS; }
__host__ __device__ constexpr int codebook_of(int code) { return code == CODE_IQ3_XXS ? 1 : 0; }  // BOOK_*
// decode_frag's table of codebook value pairs in shared memory (hip/mma.h codebook_pairs): 256
// rows of 256 bytes, after the x ring.
constexpr int CODEBOOK_PAIRS_BYTES = 256 * 256;
// A super-block code's group scale (hip/mma.h superblock_group's SUPER_*; Q6_K has its own, q6_group).
__host__ __device__ constexpr int super_scale_of(int code) {
    return code == CODE_Q4_K ? 0 : code == CODE_IQ3_XXS ? 2 : 1;
}
// The codes of the byte plane (int8 codes, two k16 steps a 16-byte load).
__host__ __device__ constexpr bool byte_codes(int code) { return code == CODE_Q8_0 || code == CODE_Q6_K; }
// 16-byte weight loads a lane makes per row block and 128-k chunk: 2 of nibbles, 4 of bytes.
__host__ __device__ constexpr int chunk_loads(int code) { return byte_codes(code) ? 4 : 2; }
// The codes whose prefill computes each weight in float32 as the gguf package does and rounds it
// once to x's type (FOLD_FP32 below).
__host__ __device__ constexpr bool float32_weights(int code) { return has_superblocks(code) || code == CODE_Q8_0; }

// ---------------------------------------------------------------- decode_mma (canonical, v5)
struct Params {
    const uint16_t* x;       // [M, K] fp16/bf16 bits, row stride ldx elements
    const int32_t* qweight;  // [N, K/8] packed nibbles along K
    const uint16_t* scales;  // [N, K/G] fp16/bf16 bits
    const int32_t* qzeros;   // [N/8, K/G] packed nibbles along N, or nullptr (z = 8)
    void* y;                 // [M, N], row stride ldy elements, type y_type
    float* partial;          // [row_blocks, max_contributors, 16, 64] fp32 partial sums
    unsigned* counters;      // [row_blocks] arrival counters, zero on entry, left zero
    int m, n, k;             // this launch's M (<= 16), N, K
    int64_t ldx, ldy;
    int group_size;          // G in {32, 64, 128}
    int scale_type;          // ELEM_F16 or ELEM_BF16
    int y_type;              // ELEM_F16, ELEM_BF16 or ELEM_F32
    int row_blocks;          // ceil(N / 64): blocks of weight rows (decode_mma)
    int max_contributors;    // most persistent blocks sharing one row block (decode_mma)
    BiasRef bias;            // [N], added to each output once (after the split sum)
};

constexpr int MMA_WARPS = 4;
constexpr int MMA_THREADS = MMA_WARPS * 32;
constexpr int ROWS_PER_BLOCK = MMA_WARPS * 16;
constexpr int CHUNK_K = 128;
constexpr int SC_CHUNKS = 2;
constexpr int SC_K = CHUNK_K * SC_CHUNKS;
constexpr int SC_MAX_GROUPS = SC_K / 32;
constexpr int STAGES = 3;
// x row stride in shared memory, in 16-bit elements: 256 + 32 so that the two x rows
// read by one 8-lane phase of a 16-byte load fall in opposite bank halves (64 B apart).
constexpr int XS_STRIDE = SC_K + 32;
constexpr int W_STAGE_BYTES = ROWS_PER_BLOCK * SC_K / 2;                 // 8 KB of packed nibbles
constexpr int S_STAGE_BYTES = ROWS_PER_BLOCK * SC_MAX_GROUPS * 2;        // scale bits [64][8]
constexpr int Z_STAGE_BYTES = (ROWS_PER_BLOCK / 8) * SC_MAX_GROUPS * 4;  // zero words [8][8]
__host__ __device__ constexpr int stage_bytes(int mt) {
    return W_STAGE_BYTES + mt * 8 * XS_STRIDE * 2 + S_STAGE_BYTES + Z_STAGE_BYTES;
}
__host__ __device__ constexpr int mma_smem_bytes(int mt) { return STAGES * stage_bytes(mt); }

// The kernels are templates instantiated in their own file; a launcher reaches an
// instantiation through its file's lookup function (the address of its host stub, for
// hipLaunchKernel and the occupancy queries), because nvcc's whole-program mode keeps
// template stubs local to the file that instantiates them.

// decode_mma<XT, MT, G>: activation type, 8-row tiles of x (1: M <= 8, 2: M <= 16), group
// size; nullptr for a combination not in the list below.
const void* decode_mma_kernel(int x_type, int mt, int group_size);

// Every decode_mma instantiation: x type x tile width x group size, listed once.
#define QG_W4A16_MMA_KERNELS(X)                                            \
    X(ELEM_F16, 1, 32) X(ELEM_F16, 1, 64) X(ELEM_F16, 1, 128)              \
    X(ELEM_F16, 2, 32) X(ELEM_F16, 2, 64) X(ELEM_F16, 2, 128)              \
    X(ELEM_BF16, 1, 32) X(ELEM_BF16, 1, 64) X(ELEM_BF16, 1, 128)           \
    X(ELEM_BF16, 2, 32) X(ELEM_BF16, 2, 64) X(ELEM_BF16, 2, 128)

// ---------------------------------------------------------------- decode_simt (both layouts)
struct SimtParams {
    const uint16_t* x;       // [M, K], row stride ldx elements
    const void* qweight;     // canonical [N, K/8] int32, or the frag plane
    const uint16_t* scales;  // canonical [N, K/G], or the frag plane
    const void* qzeros;      // canonical [N/8, K/G] int32, frag plane uint8, or nullptr
    void* y;
    int m, n, k;             // m <= SIMT_MAX_M
    int64_t ldx, ldy;
    int group_size;
    int x_type, scale_type, y_type;
    int frag;                // 1: the three pointers are frag planes
    BiasRef bias;            // [N]
};
constexpr int SIMT_THREADS = 128;
constexpr int SIMT_MAX_M = 16;
__global__ void decode_simt(const SimtParams p);

// ---------------------------------------------------------------- decode_frag (frag layout)
struct FragParams {
    const uint16_t* x;       // [M, K] fp16/bf16 bits, row stride ldx elements
    const uint32_t* qweight; // frag plane: [RB][KT][32 lanes][4 words] (CODE_Q8_0: [RB][2 KT][32][4])
    const uint32_t* scales;  // frag plane as words: [RB][KC][8 g][GC] = s[g] | s[g + 8] << 16
    const uint8_t* qzeros;   // frag plane [RB][KC][8 g][GC] (z[g] | z[g+8] << 4), or nullptr
    void* y;                 // [M, N], row stride ldy elements, type y_type
    float* partial;          // [row_tiles][max_contributors][16 tokens][256 rows] fp32
    unsigned* counters;      // [row_tiles] arrival counters, zero on entry, left zero
    int m, n, k;             // this launch's M (<= 16), N, K
    int64_t ldx, ldy;
    int k_chunks;            // KC = Kp / 128: the units of a row tile
    int row_blocks;          // RB = Np / 16
    int row_tiles;           // RT = ceil(RB / FRAG_TILE_RB)
    int scale_type;          // ELEM_F16 or ELEM_BF16
    int y_type;              // ELEM_F16, ELEM_BF16 or ELEM_F32
    int max_contributors;    // most thread blocks sharing one row tile
    BiasRef bias;            // [N], added to each output once (after the split sum)
    const uint2* superblocks;  // CODE_Q4_K / IQ4_XS / Q6_K: [RB][KC/2][8 g] (d[g] | d[g+8] << 16, dmin or 0 the same), fp16 bits
};

// Thread block: 8 warps, each owning 2 row blocks (32 weight rows): 256 rows per block.
// Work unit: 256 rows x one 128-k chunk (32 KB of weights + its scales and zeros). The
// weights, scales and zeros go global -> registers, each lane its own, two units ahead;
// only the unit's x chunk is shared, through a FRAG_X_STAGES ring in shared memory.
constexpr int FRAG_WARPS = 8;
constexpr int FRAG_THREADS = FRAG_WARPS * 32;
// QG_FRAG_RB_PER_WARP / QG_FRAG_MIN_BLOCKS: build-time overrides for measuring other
// geometries (bench/NOTES.md), host and device alike; the defaults are what ships.
#ifndef QG_FRAG_RB_PER_WARP
#define QG_FRAG_RB_PER_WARP 2
#endif
#ifndef QG_FRAG_MIN_BLOCKS
#define QG_FRAG_MIN_BLOCKS 2
#endif
constexpr int FRAG_RB_PER_WARP = QG_FRAG_RB_PER_WARP;
constexpr int FRAG_MIN_BLOCKS = QG_FRAG_MIN_BLOCKS;  // thread blocks an SM the registers are cut for
constexpr int FRAG_TILE_RB = FRAG_WARPS * FRAG_RB_PER_WARP;  // 16 row blocks
constexpr int FRAG_TILE_ROWS = FRAG_TILE_RB * 16;            // 256 rows
constexpr int FRAG_X_STAGES = 4;
// x row stride in shared memory (16-bit elements): 128 + 8, so that the 8 rows one ldmatrix
// phase reads start 272 bytes = 4 banks apart and cover all 32 banks once.
constexpr int FRAG_XS_STRIDE = 128 + 8;

__host__ __device__ constexpr int align16c(int v) { return (v + 15) / 16 * 16; }
template <int MT>
struct FragStage {
    static constexpr int X_BYTES = align16c(MT * 8 * FRAG_XS_STRIDE * 2);  // one x chunk
    static constexpr int SMEM = FRAG_X_STAGES * X_BYTES;                  // the x ring
};
// decode_frag's dynamic shared memory: the x ring, then for the codebook codes their table.
__host__ __device__ constexpr int frag_smem_bytes(int mt, int code) {
    return (mt == 1 ? FragStage<1>::SMEM : FragStage<2>::SMEM) + (codebook_codes(code) ? CODEBOOK_PAIRS_BYTES : 0);
}

// decode_frag<XT, MT, G, ASYM, CODE> (ASYM: zero-points given).
const void* decode_frag_kernel(int x_type, int mt, int group_size, bool asym, int code = CODE_INT4);

#define QG_W4A16_FRAG_KERNELS(X)                                                                     \
    X(ELEM_F16, 1, 32, true) X(ELEM_F16, 1, 64, true) X(ELEM_F16, 1, 128, true)                     \
    X(ELEM_F16, 2, 32, true) X(ELEM_F16, 2, 64, true) X(ELEM_F16, 2, 128, true)                     \
    X(ELEM_BF16, 1, 32, true) X(ELEM_BF16, 1, 64, true) X(ELEM_BF16, 1, 128, true)                  \
    X(ELEM_BF16, 2, 32, true) X(ELEM_BF16, 2, 64, true) X(ELEM_BF16, 2, 128, true)                  \
    X(ELEM_F16, 1, 32, false) X(ELEM_F16, 1, 64, false) X(ELEM_F16, 1, 128, false)                  \
    X(ELEM_F16, 2, 32, false) X(ELEM_F16, 2, 64, false) X(ELEM_F16, 2, 128, false)                  \
    X(ELEM_BF16, 1, 32, false) X(ELEM_BF16, 1, 64, false) X(ELEM_BF16, 1, 128, false)               \
    X(ELEM_BF16, 2, 32, false) X(ELEM_BF16, 2, 64, false) X(ELEM_BF16, 2, 128, false)
// MXFP4 (CODE_E2M1) and GGUF Q4_K (CODE_Q4_K): G = 32, no zero-points
#define QG_MXFP4_FRAG_KERNELS(X) X(ELEM_F16, 1) X(ELEM_F16, 2) X(ELEM_BF16, 1) X(ELEM_BF16, 2)
#define QG_Q4_K_FRAG_KERNELS(X) QG_MXFP4_FRAG_KERNELS(X)
#define QG_IQ4_XS_FRAG_KERNELS(X) QG_MXFP4_FRAG_KERNELS(X)
#define QG_Q8_0_FRAG_KERNELS(X) QG_MXFP4_FRAG_KERNELS(X)
#define QG_Q6_K_FRAG_KERNELS(X) QG_MXFP4_FRAG_KERNELS(X)
#define QG_IQ3_XXS_FRAG_KERNELS(X) QG_MXFP4_FRAG_KERNELS(X)

// ---------------------------------------------------------------- prefill_wgmma (frag, sm_90a)
// Thread block: 2 warpgroups (8 warps); warp w owns row block w of the block's 128 weight
// rows (each warpgroup one wgmma m64 tile), all warps share the block's BN tokens. The
// weights go global -> registers (each lane's 16-byte fragment per 64-k step, two chunks
// ahead), dequantized there as wgmma's A operand; x tiles [BN tokens x 64 k] come by TMA
// into a ring of PrefillSmem<BN>::STAGES in shared memory (128-byte swizzle) as the B operand.
struct PrefillParams {
    const uint32_t* qweight;  // frag plane [RB][KT][32][4 words]
    const uint32_t* scales;   // frag plane as words [RB][KC][8][GC]
    const uint8_t* qzeros;    // frag plane [RB][KC][8][GC], or nullptr (symmetric)
    void* y;                  // [M, N], row stride ldy elements, type y_type
    int64_t ldy;
    int m, n;                 // tokens, weight rows
    int k_tiles;              // KT = Kp / 64: the k-steps of the loop
    int k_chunks;             // KC = Kp / 128
    int row_blocks;           // RB = Np / 16
    int scale_type;           // ELEM_F16 or ELEM_BF16
    int y_type;               // ELEM_F16, ELEM_BF16 or ELEM_F32
    BiasRef bias;             // [N]
    // Dense calls (tile_experts nullptr) on the stream-K kernel (prefill_kernel's stream_k): a
    // grid of resident blocks sharing the tiles t = row tile * token_tiles + token tile.
    int token_tiles, tiles;
    int row_tile0;            // dense calls: the first row tile of the launch (a row split's tail launch)
    uint32_t* sk_count;       // [tiles] arrivals per stream-K tile, zero before and after
    float* partial;           // [gridDim.x][BN / 8][PF_THREADS] float4: a block's stream-K sums, zeroed once read
    // Grouped (MoE experts, src/gpu/moe_launch.cpp): x holds the tokens gathered by
    // expert tile, token tile bx is expert tile_experts[bx]'s (BN = the tile), the weight planes
    // are stacked by expert (expert e's row block rb is row block e * row_blocks + rb). Gathered
    // row r goes to output row out_rows[r] (nowhere where that is < 0 or >= out_limit), column
    // n only where n % part_rows < part_valid (an expert of parts padded to part_rows rows: gate
    // and up), plus bias[e * bias_stride + n].
    const int32_t* tile_experts;  // nullptr: not grouped
    const int32_t* num_sorted;    // [1] gathered rows in use
    const int32_t* out_rows;      // [gathered rows]
    int out_limit, experts;
    int part_rows, part_valid;
    int64_t bias_stride;
    // Grouped stage 1 with its gated activation in the epilogue (act != nullptr; CODE_E2M1, whole
    // tiles): row tile rt is channels [64 rt, 64 rt + 64) of the expert, warps 0-3 its gate row
    // blocks (part 0), warps 4-7 the same channels' up row blocks (part 1), and each gathered row
    // r in use writes act[out_rows[r] * part_valid + c] = glu(gate + bias, up + bias) in x's type
    // for c < part_valid (bias: [E, 2 part_valid], gate / up at c / part_valid + c (concat) or
    // 2 c / 2 c + 1), where the unfused path wrote fp32 gate / up rows for moe_act.
    void* act;
    int concat, activation;
    float alpha, limit;
    const uint2* superblocks;     // CODE_Q4_K: as FragParams::superblocks
};
constexpr int PF_THREADS = 256;
constexpr int PF_ROWS = 128;          // weight rows per block
// x tiles in flight: STAGES - 2 ahead of the k-step; 8 for tiles of 32 to 128 tokens, 5 for
// 256 and the fused tile (32 / 34 KB a tile: the ring stays under the 227 KB of shared memory).
// The fused tile (PF_FUSED_BN tokens) is a 256-token one with a tail: a call of 257 .. 272
// tokens (src/gpu/w4a16_prefill_launch.cpp, plan_launches), its extra tokens one more wgmma
// (n16) on the same A registers, so that the tail does not read and dequantize every weight a
// second time. W4A16 (bf16 x, folded) and MXFP4 only: the GGUF codes' 256-token kernels are at
// 255 registers already, and the 8 more spilled 100-1200 bytes (q6_K's fused tile: +36 % time).
// A wider tail (n32 .. n64, hip/wgmma.h) spills everywhere (bench/NOTES.md, sessions 39, 40).
#ifndef QG_PF_FUSED_BN
#define QG_PF_FUSED_BN 272
#endif
constexpr int PF_FUSED_BN = QG_PF_FUSED_BN;
// Token rows of one TMA box of x for a token tile of bn: a box holds at most 256 rows, so the
// fused tile copies two boxes of bn / 2 a step. The launchers' tensor maps and the kernel's
// copies both take it from here.
__host__ __device__ constexpr int prefill_box_rows(int bn) { return bn > 256 ? bn / 2 : bn; }
__host__ __device__ constexpr int prefill_stages(int bn) { return bn >= 256 ? 5 : 8; }
// The dynamic shared memory of the kernel of a token tile of bn: the x ring, its mbarriers and
// 1024 bytes of alignment slack (PrefillSmem<bn>::SMEM; the launchers ask for it by bn).
__host__ __device__ constexpr int prefill_ring_smem(int bn) {
    return 1024 + prefill_stages(bn) * bn * 64 * 2 + 2 * prefill_stages(bn) * 8;
}
template <int BN>
struct PrefillSmem {
    static constexpr int STAGES = prefill_stages(BN);
    static constexpr int B_BYTES = BN * 64 * 2;           // one x tile, 128-byte rows
    static constexpr int BAR_OFF = STAGES * B_BYTES;      // full[] then empty[] mbarriers
    static constexpr int SMEM = prefill_ring_smem(BN);
    static_assert(SMEM == 1024 + BAR_OFF + 2 * STAGES * 8, "the ring, its barriers, 1024 bytes of slack");
};

// The prefill takes the scale into its A registers ("fold", hip/prefill_wgmma.h) where x is
// bf16: each weight (q - z) * s (W4A16) or e2m1 * 2^(e - 127) (MXFP4, whose E8M0 scales reach
// the kernel as bf16 bits) is rounded once to bf16, round to nearest even, and the wgmmas sum
// all of K in one accumulator set. bf16 scales: one bf16 multiply (FOLD_BF16). fp16 scales
// (FOLD_F16: AWQ's, and GGUF Q4_0's d): the scale split exactly into two bf16 parts
// s = hi + lo (an fp16 significand has 11 bits, bf16 8, so lo holds the other 3), then
// (q - z) * lo, exact, and one fused multiply-add (q - z) * hi + that: the same single
// rounding of the exact product, two instructions a register instead of one. fp16 x keeps the
// fp32 group scale (FOLD_NONE: 15 s can overflow fp16 where fp32 does not). GGUF Q4_K and
// IQ4_XS, Q8_0, Q6_K and IQ3_XXS (FOLD_FP32, either x type) compute each weight as the gguf package
// does in float32, (d * sc) * q - dmin * m (the product exact, so one fused multiply-add rounds as
// its multiply and subtract do), (d * (ls - 32)) * kvalues[q], ((d * (0.5 + ls)) * 0.5) * grid *
// sign (exact: 11 x 5 x 6 bits), d * q (exact: 11 x 8 bits) or
// (d * sc) * (q - 32) (exact: 11 x 8 x 6 bits), rounded
// once to x's type (bf16, or fp16, which overflows to inf only past 65504). Q8_0 cannot take
// FOLD_F16: q * lo has 8 + 3 significant bits, more than bf16's 8. The launcher's plan and the kernel list below both
// ask prefill_fold.
enum PrefillFold { FOLD_NONE = 0, FOLD_BF16 = 1, FOLD_F16 = 2, FOLD_FP32 = 3 };
__host__ __device__ constexpr int prefill_fold(int x_type, int scale_type, int code = CODE_INT4) {
    return float32_weights(code)         ? FOLD_FP32
           : x_type != ELEM_BF16         ? FOLD_NONE
           : scale_type == ELEM_BF16     ? FOLD_BF16
                                         : FOLD_F16;
}
__host__ __device__ constexpr bool prefill_folds(int x_type, int scale_type, int code = CODE_INT4) {
    return prefill_fold(x_type, scale_type, code) != FOLD_NONE;
}

#if defined(QG_HAVE_TENSOR_MAPS)
// prefill_wgmma<XT, BN, G, ASYM, CODE, FOLD>(tmap_x, params); tmap_x: x [M, K] as a 2-D tensor
// map, box [BN tokens, 64 k], 128-byte swizzle. scale_type picks FOLD (prefill_fold).
// stream_k: the kernel of a stream-K grid (the launcher sizes it), else of a block a tile.
const void* prefill_kernel(int x_type, int scale_type, int bn, int group_size, bool asym, int code = CODE_INT4,
                           bool stream_k = false);

// Every W4A16 prefill_wgmma instantiation, (x type, tile width, G, ASYM, FOLD), listed once:
// fp16 x on the group-sum path at 64 and 128 tokens; bf16 x folded (bf16 or fp16 scales), at
// 32 (17 .. 32 tokens), 64, 128 and 256 tokens (the fold frees the group-sum registers for the
// larger accumulator).
#define QG_W4A16_PREFILL_G(X, XT, BN, ASYM, FOLD) X(XT, BN, 32, ASYM, FOLD) X(XT, BN, 64, ASYM, FOLD) X(XT, BN, 128, ASYM, FOLD)
#define QG_W4A16_PREFILL_ZG(X, XT, BN, FOLD) QG_W4A16_PREFILL_G(X, XT, BN, true, FOLD) QG_W4A16_PREFILL_G(X, XT, BN, false, FOLD)
#define QG_W4A16_PREFILL_KERNELS(X)                                                                             \
    QG_W4A16_PREFILL_ZG(X, ELEM_F16, 64, FOLD_NONE) QG_W4A16_PREFILL_ZG(X, ELEM_F16, 128, FOLD_NONE)            \
    QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 32, FOLD_F16) QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 32, FOLD_BF16)            \
    QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 64, FOLD_F16) QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 128, FOLD_F16)            \
    QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 256, FOLD_F16) QG_W4A16_PREFILL_ZG(X, ELEM_BF16, PF_FUSED_BN, FOLD_F16)           \
    QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 64, FOLD_BF16) QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 128, FOLD_BF16)          \
    QG_W4A16_PREFILL_ZG(X, ELEM_BF16, 256, FOLD_BF16) QG_W4A16_PREFILL_ZG(X, ELEM_BF16, PF_FUSED_BN, FOLD_BF16)
// MXFP4 (CODE_E2M1): G = 32, no zero-points, bf16 scales (so bf16 x folds); 32-, 80-, 96- and
// 256-token tiles for bf16 only (80 and 96: the grouped MoE stages' expert tiles)
#define QG_MXFP4_PREFILL_KERNELS(X)                                                                              \
    X(ELEM_F16, 128) X(ELEM_BF16, 128) X(ELEM_F16, 64) X(ELEM_BF16, 64) X(ELEM_BF16, 32) X(ELEM_BF16, 256)       \
    X(ELEM_BF16, PF_FUSED_BN) X(ELEM_BF16, 80) X(ELEM_BF16, 96)
// GGUF Q4_K and IQ4_XS (CODE_Q4_K, CODE_IQ4_XS; FOLD_FP32): G = 32, no zero-points, every tile
// but the fused one for both x types (the 32-token kernels at 128 registers: Q6_K's with an
// 8-byte stack frame, the others none)
#define QG_Q4_K_PREFILL_KERNELS(X)                                                                         \
    X(ELEM_F16, 32) X(ELEM_F16, 64) X(ELEM_F16, 128) X(ELEM_F16, 256) X(ELEM_BF16, 32) X(ELEM_BF16, 64)   \
    X(ELEM_BF16, 128) X(ELEM_BF16, 256)
#define QG_IQ4_XS_PREFILL_KERNELS(X) QG_Q4_K_PREFILL_KERNELS(X)
#define QG_Q8_0_PREFILL_KERNELS(X) QG_Q4_K_PREFILL_KERNELS(X)
#define QG_Q6_K_PREFILL_KERNELS(X) QG_Q4_K_PREFILL_KERNELS(X)
#define QG_IQ3_XXS_PREFILL_KERNELS(X) QG_Q4_K_PREFILL_KERNELS(X)
#endif

// ---------------------------------------------------------------- repack (canonical -> frag)
struct RepackParams {
    const uint32_t* qweight;  // canonical [N, K/8] (MXFP4: the blocks [N, K/32, 16] as words)
    const uint16_t* scales;   // canonical [N, K/G], or nullptr when e8m0 is given
    const uint8_t* e8m0;      // MXFP4: canonical scales [N, K/32] as E8M0 bytes, else nullptr
    const uint32_t* qzeros;   // canonical [N/8, K/G] or nullptr
    uint32_t* out_qweight;    // frag planes
    uint16_t* out_scales;
    uint8_t* out_qzeros;      // nullptr when qzeros is
    int64_t n, k;
    int group_size;
    int64_t src_row_step;     // output row n reads canonical row n * src_row_step (MXFP4 experts'
                              // interleaved gate / up rows: 2); 0 or 1: dense (W4A16: always)
    const uint8_t* gguf;      // GGUF blocks of a frag format (qweight and scales unused), N rows of
    int64_t ldw;              // stride ldw bytes, read by src/formats/gguf_frag.h; else nullptr
    int gguf_format;          // QG_FORMAT_Q8_0 .. IQ3_XXS (Q8_0, Q6_K: the byte plane)
};
constexpr int REPACK_THREADS = 256;
__global__ void repack_frag_weights(const RepackParams p);   // one thread per output word
__global__ void repack_frag_scales(const RepackParams p);    // one thread per (rb, kc, g, c)
                                                             // (+ Q4_K's d, dmin per super-block)

}  // namespace w4a16
}  // namespace qg
