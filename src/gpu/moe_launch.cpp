// MXFP4 MoE GPU tiers (hip/moe.hip): the table entries of align, stage 1 and stage 2 (mma.sync
// expert tiles of up to 64 tokens, sm_80+; and, for tiles of 32 to 256 tokens on sm_90a, the
// W4A16 prefill kernel grouped over the experts), and the device side of qg_moe_repack. The
// stages read the MoE frag layout only (a canonical expert stack on the GPU would be repacked
// on every call: more than a GB for GPT-OSS-120b, so the tier refuses it and names
// qg_moe_repack). Arguments were validated by src/api.cpp; the routing tables are device data,
// which the kernels never trust (hip/moe.hip).
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>

#include "formats/w4a16_frag.h"
#include "frag_launch.h"
#include "launch_util.h"
#include "moe_kernels.h"
#include "moe_sizes.h"
#include "tier_table.h"
#include "w4a16_kernels.h"
#include "wgmma_gate.h"

namespace qg {
namespace {

using launch_util::aligned16;
using launch_util::ceil_div;
using launch_util::elem_type;
using launch_util::mma_sync_device;

constexpr int kGroup = 32;             // one E8M0 scale per 32 elements
constexpr int kMaxGridY = 65535;       // tiles beyond it are walked by the blocks (hip/moe.hip)
constexpr size_t kWorkspaceAlign = 256;
constexpr int kSplitMinChunks = 4;     // a split-K part covers at least 4 chunks (512 of K)
constexpr int64_t kMaxAutoSplits = 4;  // stage 2's own split (mma_splits): 4 parts measured best at T = 1

size_t ws_align(size_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
int64_t padded_rows(int64_t rows) { return frag::padded_n(rows); }

// What every MoE GPU tier needs of the device.
bool moe_gpu(const qg_context* ctx, const char** why) { return gpu_context_only(ctx, why) && mma_sync_device(ctx, why); }

// What both stages need of their weight and activations.
bool stage_usable(const qg_context* ctx, qg_mxfp4_layout layout, qg_dtype x_dtype, const void* x, int64_t ldx,
                  const char** why) {
    if (!moe_gpu(ctx, why)) return false;
    if (layout != QG_MXFP4_LAYOUT_FRAG) {
        *why = "reads the MoE frag layout (qg_moe_repack once; pyquant: moe_repack)";
        return false;
    }
    if (x_dtype != QG_DTYPE_F16 && x_dtype != QG_DTYPE_BF16) {
        *why = "takes fp16 or bf16 activations (the E2M1 values enter the matrix units in their type)";
        return false;
    }
    if (!aligned16(x) || ldx % 8 != 0) {
        *why = "gathers activation rows 16 bytes at a time: they must be 16-byte aligned, the row stride a multiple of 8";
        return false;
    }
    return true;
}

// The expert GEMM of one stage: routing, planes and sizes; the stage's epilogue fields are
// filled by the caller.
struct GemmCall {
    moe::GemmParams p{};
    int stage = 0, mt = 0, splits = 1, slices = 1;
    int64_t tiles_bound = 0;  // the tiles a launch walks at most (min(max_tiles, pairs): each used tile holds a pair)
};

GemmCall gemm_call(int stage, int64_t T, int32_t top_k, int32_t E, int32_t tile_m, int64_t rows, int64_t k,
                   const void* x, int64_t ldx, const int32_t* sorted_ids, const int32_t* tile_experts,
                   const int32_t* num_sorted, const uint8_t* blocks, const uint8_t* scales, const void* bias,
                   qg_dtype bias_dtype) {
    GemmCall c;
    int64_t max_sorted = 0, max_tiles = 0;
    moe_align_sizes(T, top_k, E, tile_m, &max_sorted, &max_tiles);
    const frag::Geometry geo(rows, k, kGroup);
    c.stage = stage;
    c.mt = tile_m / 8;
    c.tiles_bound = std::min<int64_t>(max_tiles, T * top_k);
    moe::GemmParams& p = c.p;
    p.x = static_cast<const uint16_t*>(x);
    p.ldx = ldx;
    p.x_row_div = stage == moe::STAGE_GATE_UP ? top_k : 1;
    p.sorted_ids = sorted_ids;
    p.tile_experts = tile_experts;
    p.num_sorted = num_sorted;
    p.tile_m = tile_m;
    p.max_tiles = static_cast<int>(max_tiles);
    p.pairs = static_cast<int>(T * top_k);
    p.experts = E;
    p.qweight = reinterpret_cast<const uint32_t*>(blocks);
    p.scales = reinterpret_cast<const uint32_t*>(scales);
    p.rows = static_cast<int>(rows);
    p.k = static_cast<int>(k);
    p.k_chunks = static_cast<int>(geo.k_chunks);
    p.part_blocks = static_cast<int>(geo.row_blocks);
    p.bias = BiasRef{bias, bias ? elem_type(bias_dtype) : ELEM_F32};
    return c;
}

// Thread blocks of a launch along the rows (one part's row tiles), and those that hold a tile
// in use at most (the tiles walked are at most one a pair).
int64_t row_tiles(const GemmCall& c) { return ceil_div(c.p.part_blocks, moe::gemm_block_rbs(c.stage)); }
int64_t blocks_in_use(const GemmCall& c) { return row_tiles(c) * std::max<int64_t>(1, c.tiles_bound); }

qg_status launch_gemm(const qg_context* ctx, const GemmCall& c, qg_dtype x_dtype, qg_stream stream, const char* what) {
    const void* kernel = moe::gemm_kernel(elem_type(x_dtype), c.mt, c.stage, c.slices);
    const int smem = moe::gemm_smem_bytes(c.mt, c.slices);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, what);
    if (st != QG_OK) return st;
    const int64_t gx = row_tiles(c);
    const int64_t gy = std::max<int64_t>(1, std::min<int64_t>(c.tiles_bound, kMaxGridY));
    if (log_enabled())
        log_once("%s: tile_m=%d grid=%lldx%lldx%d (row tiles x expert tiles x k splits) slices=%d chunks=%d smem=%d",
                 what, c.p.tile_m, static_cast<long long>(gx), static_cast<long long>(gy), c.splits, c.slices,
                 c.p.k_chunks, smem);
    return launch_util::launch_after_prior(ctx, kernel,
                                           dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), c.splits),
                                           moe::GEMM_THREADS * c.slices, smem, static_cast<hipStream_t>(stream), c.p,
                                           what);
}

// Split-K of the mma.sync tiles: K cut in parts of at least 4 chunks, each block's fp32 sums
// into its plane of the workspace, added in split order by the stage's last kernel (moe_act,
// moe_combine), so the result does not depend on which block finishes first. The split_k
// option sets the parts of both stages; QG_EXP_MOE_SPLIT2 those of stage 2 alone (the A/B of
// the rule below). Stage 1 does not split: the same split made it slower (25 -> 35 us at
// GPT-OSS T = 1), its fp32 gate / up planes and moe_act costing more than the warps gained.
// Stage 2's blocks, each one expert tile of 128 rows over all of K, stream their weights at
// what their loads in flight allow, so the stage runs in waves of the blocks an SM holds
// (slots), and its parts follow from the blocks in use, estimated for the experts a routing
// hits (stage2_blocks):
//   - fewer blocks than SMs (GPT-OSS at T = 1: 23 row tiles x 4 expert tiles = 92 for 132
//     SMs): 4 parts (on the H200 24.5 -> 17.4 us; 2 parts 19.9: bench/NOTES.md, session 43);
//   - below half a wave (T = 2: ~180 blocks of 528 slots): 2, more warps on the same bytes;
//   - more than one wave and at most one and a half (GPT-OSS-120b T = 8, 20b T = 16 .. 64): 2,
//     so that the last wave is not a few blocks alone (fewer parts make it so);
//   - else (one wave at most, or the waves already many) none.
// Measured on the H100 with each part count forced (bench/NOTES.md, session 50): the rule's
// choice was the fastest or within 1.5 % of it at every T from 1 to 512 (120b) and 160 (20b).
int forced_down_splits() {
    static const int k = launch_util::env_int("QG_EXP_MOE_SPLIT2", 0);
    return k >= 1 && k <= 16 ? k : 0;
}

// Stage 2's blocks in use for a routing that spreads the P pairs uniformly over the E experts:
// the experts hit, E (1 - (1 - 1 / E)^P), each ~max(1, rows / tile_m + 1/2) tiles (an expert of
// mean tile_m rows spills into a second tile about half the time), at most the tiles bound.
int64_t stage2_blocks(const GemmCall& c) {
    const double e = std::max(c.p.experts, 1), pairs = c.p.pairs;
    const double hit = std::max(1.0, e * (1.0 - std::pow(1.0 - 1.0 / e, pairs)));
    const double tiles = std::min(static_cast<double>(std::max<int64_t>(1, c.tiles_bound)),
                                  hit * std::max(1.0, pairs / hit / c.p.tile_m + 0.5));
    return static_cast<int64_t>(std::ceil(tiles)) * row_tiles(c);
}

int mma_splits(const qg_context* ctx, const GemmCall& c, qg_dtype x_dtype) {
    const int64_t most = std::max<int64_t>(1, c.p.k_chunks / kSplitMinChunks);
    if (ctx->split_k > 0) return static_cast<int>(std::min<int64_t>(ctx->split_k, most));
    if (c.stage != moe::STAGE_DOWN) return 1;
    if (forced_down_splits() > 0) return static_cast<int>(std::min<int64_t>(forced_down_splits(), most));
    const int64_t sms = std::max(ctx->sm_count, 1);
    if (blocks_in_use(c) < sms) return static_cast<int>(std::min(kMaxAutoSplits, most));
    const void* kernel = moe::gemm_kernel(elem_type(x_dtype), c.mt, c.stage, 1);
    const int64_t slots =
        sms * std::max(1, launch_util::resident_blocks(ctx, kernel, moe::GEMM_THREADS, moe::gemm_smem_bytes(c.mt, 1)));
    const int64_t blocks = stage2_blocks(c);
    const bool few = 2 * blocks < slots, ragged = blocks > slots && 2 * blocks <= 3 * slots;
    return few || ragged ? static_cast<int>(std::min<int64_t>(2, most)) : 1;
}

// QG_EXP_MOE_SLICES=1 / 2 / 4 sets the slices of both stages' tile_m = 16 launches (the A/B of
// bench/NOTES.md, session 44); unset or another value: mma_slices' rule. Read once a process.
int forced_slices() {
    static const int k = launch_util::env_int("QG_EXP_MOE_SLICES", 0);
    return k == 1 || k == 2 || k == 4 ? k : 0;
}

// K slices inside a block of the mma.sync tiles (hip/moe_kernels.h): more warps on the same
// blocks where the blocks in use are too few to keep the weight stream's loads in flight.
// GPT-OSS at T = 1: stage 1 has 45 row tiles x 4 expert tiles = 180 blocks of 4 warps for 132
// SMs (~1.4 warps a scheduler, 1.35 TB/s; bench/NOTES.md, session 43). The most slices whose
// blocks are all resident at once (one wave: more slices, fewer blocks an SM), each slice at
// least kSplitMinChunks chunks; tile_m 16 only, and not where K is split across blocks (stage
// 2 at T = 1 splits K in 4 already: its 368 blocks fill the SMs).
int mma_slices(const qg_context* ctx, const GemmCall& c, qg_dtype x_dtype) {
    if (c.mt != 2) return 1;
    if (forced_slices() > 0) return forced_slices();
    if (c.splits > 1) return 1;
    const int64_t blocks = blocks_in_use(c);
    for (int sl = moe::GEMM_MAX_SLICES; sl > 1; sl /= 2) {
        if (c.p.k_chunks < sl * kSplitMinChunks) continue;
        const void* kernel = moe::gemm_kernel(elem_type(x_dtype), c.mt, c.stage, sl);
        const int resident =
            launch_util::resident_blocks(ctx, kernel, moe::GEMM_THREADS * sl, moe::gemm_smem_bytes(c.mt, sl));
        if (blocks <= static_cast<int64_t>(resident) * ctx->sm_count) return sl;
    }
    return 1;
}

// ---------------------------------------------------------------- align

bool align_usable(const qg_context* ctx, const qg_moe_align_args& a, const char** why) {
    if (!moe_gpu(ctx, why)) return false;
    if (a.num_experts > moe::ALIGN_MAX_EXPERTS) {
        *why = "keeps per-warp counts of every expert in shared memory: num_experts <= 1024";
        return false;
    }
    return true;
}

qg_status align_launch(const qg_context* ctx, const qg_moe_align_args& a, qg_stream stream) {
    int64_t max_sorted = 0, max_tiles = 0;
    moe_align_sizes(a.num_tokens, a.top_k, a.num_experts, a.tile_m, &max_sorted, &max_tiles);
    moe::AlignParams p{};
    p.topk_ids = a.topk_ids;
    p.sorted_ids = a.sorted_ids;
    p.tile_experts = a.tile_experts;
    p.num_sorted = a.num_sorted;
    p.pairs = static_cast<int>(a.num_tokens * a.top_k);
    p.experts = a.num_experts;
    p.tile_m = a.tile_m;
    p.max_sorted = static_cast<int>(max_sorted);
    p.max_tiles = static_cast<int>(max_tiles);
    const void* kernel = reinterpret_cast<const void*>(&moe::moe_align);
    const int smem = moe::align_smem_bytes(a.num_experts);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, "moe_align");
    if (st != QG_OK) return st;
    return launch_util::launch_after_prior(ctx, kernel, dim3(1), moe::align_threads(p.pairs, a.num_experts), smem,
                                           static_cast<hipStream_t>(stream), p, "moe_align");
}

// ---------------------------------------------------------------- stage 1

// The mma.sync expert tiles hold at most 64 tokens (8 column tiles of 8).
bool mma_tile(int32_t tile_m, const char** why) {
    if (tile_m <= 64) return true;
    *why = "holds at most 64 tokens a tile (tile_m 128 and 256 run on moe_wgmma)";
    return false;
}

bool stage1_usable(const qg_context* ctx, const qg_moe_stage1_args& a, const char** why) {
    return stage_usable(ctx, a.layout, a.x_dtype, a.x, a.ldx, why) && mma_tile(a.tile_m, why);
}

// act = the activation of stage 1's fp32 gate / up rows h (the sum of `splits` planes of
// `plane` floats, rows [P, 2 Ip]) plus the bias, for every sorted slot in use (moe_act), which
// clears them.
qg_status activation(const qg_context* ctx, const qg_moe_stage1_args& a, const GemmCall& c, float* h, int64_t plane,
                     int splits, int64_t max_sorted, qg_stream stream) {
    moe::ActParams q{};
    q.h = h;
    q.plane = plane;
    q.splits = splits;
    q.part_rows = static_cast<int>(padded_rows(a.intermediate));
    q.ld_h = 2 * q.part_rows;
    q.sorted_ids = a.sorted_ids;
    q.tile_experts = a.tile_experts;
    q.num_sorted = a.num_sorted;
    q.tile_m = a.tile_m;
    q.max_rows = static_cast<int>(max_sorted);
    q.pairs = c.p.pairs;
    q.experts = a.num_experts;
    q.inter = static_cast<int>(a.intermediate);
    q.bias = c.p.bias;
    q.concat = a.gate_up_layout == QG_GATE_UP_CONCAT;
    q.activation = a.activation;
    q.alpha = a.swiglu_alpha;
    q.limit = a.swiglu_limit;
    q.act = a.act;
    q.act_type = elem_type(a.x_dtype);
    return launch_util::launch_after_prior(ctx, reinterpret_cast<const void*>(&moe::moe_act),
                                           dim3(static_cast<unsigned>(max_sorted)), moe::ACT_THREADS, 0,
                                           static_cast<hipStream_t>(stream), q, "moe stage1 activation");
}

GemmCall stage1_call(const qg_context* ctx, const qg_moe_stage1_args& a) {
    GemmCall c = gemm_call(moe::STAGE_GATE_UP, a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.intermediate,
                           a.hidden, a.x, a.ldx, a.sorted_ids, a.tile_experts, a.num_sorted, a.w13_blocks,
                           a.w13_scales, a.w13_bias, a.bias_dtype);
    c.p.act = a.act;
    c.p.act_type = elem_type(a.x_dtype);
    c.p.concat = a.gate_up_layout == QG_GATE_UP_CONCAT;
    c.p.activation = a.activation;
    c.p.alpha = a.swiglu_alpha;
    c.p.limit = a.swiglu_limit;
    c.splits = mma_splits(ctx, c, a.x_dtype);
    c.slices = mma_slices(ctx, c, a.x_dtype);
    c.p.part_rows = static_cast<int>(padded_rows(a.intermediate));
    c.p.ld_part = 2 * c.p.part_rows;
    c.p.plane = static_cast<int64_t>(c.p.pairs) * c.p.ld_part;
    return c;
}

size_t stage1_workspace(const qg_context* ctx, const qg_moe_stage1_args& a) {
    const GemmCall c = stage1_call(ctx, a);
    return c.splits > 1 ? ws_align(static_cast<size_t>(c.splits * c.p.plane) * sizeof(float)) : 0;
}

qg_status stage1_launch(const qg_context* ctx, const qg_moe_stage1_args& a, qg_stream stream) {
    GemmCall c = stage1_call(ctx, a);
    c.p.part = static_cast<float*>(a.workspace);
    qg_status st = launch_gemm(ctx, c, a.x_dtype, stream, "moe stage1");
    if (st != QG_OK || c.splits == 1) return st;
    int64_t max_sorted = 0, max_tiles = 0;
    moe_align_sizes(a.num_tokens, a.top_k, a.num_experts, a.tile_m, &max_sorted, &max_tiles);
    return activation(ctx, a, c, c.p.part, c.p.plane, c.splits, max_sorted, stream);
}

// ---------------------------------------------------------------- stage 2

// y = the top-k sum of the fp32 pair rows `out` (moe_combine: the sum of `splits` planes of
// `plane` floats), which clears them.
qg_status combine(const qg_context* ctx, const qg_moe_stage2_args& a, float* out, int64_t plane, int splits,
                  qg_stream stream) {
    moe::CombineParams q{};
    q.out = out;
    q.plane = plane;
    q.splits = splits;
    q.topk_weights = a.topk_weights;
    q.y = a.y;
    q.ldy = a.ldy;
    q.tokens = static_cast<int>(a.num_tokens);
    q.top_k = a.top_k;
    q.hidden = static_cast<int>(a.hidden);
    q.y_type = elem_type(a.y_dtype);
    const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(std::min<int64_t>(ceil_div(a.hidden, moe::COMBINE_THREADS), kMaxGridY)));
    return launch_util::launch_after_prior(ctx, reinterpret_cast<const void*>(&moe::moe_combine), grid,
                                           moe::COMBINE_THREADS, 0, static_cast<hipStream_t>(stream), q,
                                           "moe combine");
}

GemmCall stage2_call(const qg_context* ctx, const qg_moe_stage2_args& a) {
    GemmCall c = gemm_call(moe::STAGE_DOWN, a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.hidden,
                           a.intermediate, a.act, a.intermediate, a.sorted_ids, a.tile_experts,
                           a.num_sorted, a.w2_blocks, a.w2_scales, a.w2_bias, a.bias_dtype);
    c.splits = mma_splits(ctx, c, a.act_dtype);
    c.slices = mma_slices(ctx, c, a.act_dtype);
    c.p.plane = static_cast<int64_t>(c.p.pairs) * a.hidden;
    return c;
}

size_t stage2_workspace(const qg_context* ctx, const qg_moe_stage2_args& a) {
    return ws_align(static_cast<size_t>(stage2_call(ctx, a).splits * static_cast<int64_t>(a.num_tokens * a.top_k) *
                                        a.hidden) * sizeof(float));
}

bool stage2_usable(const qg_context* ctx, const qg_moe_stage2_args& a, const char** why) {
    return stage_usable(ctx, a.layout, a.act_dtype, a.act, a.intermediate, why) && mma_tile(a.tile_m, why);
}

qg_status stage2_launch(const qg_context* ctx, const qg_moe_stage2_args& a, qg_stream stream) {
    GemmCall c = stage2_call(ctx, a);
    c.p.out = static_cast<float*>(a.workspace);
    qg_status st = launch_gemm(ctx, c, a.act_dtype, stream, "moe stage2");
    if (st != QG_OK) return st;
    return combine(ctx, a, c.p.out, c.p.plane, c.splits, stream);
}


// ---------------------------------------------------------------- grouped wgmma (tile_m 32..256)
//
// Stage s: gather the activation rows by expert tile into the workspace (an expert tile = one
// token tile of the W4A16 prefill kernel, hip/prefill_wgmma.h), the prefill grouped over the
// experts' planes: stage 1 applying the activation in its epilogue (act written directly),
// stage 2 into fp32 rows per pair for its top-k sum (moe_combine, which clears them); then the
// gathered rows cleared.

// The prefill kernel of a token tile of tile_m (nullptr where none is built: 64 and 128 for
// both activation types, 32, 80, 96 and 256 for bf16). QG_EXP_MOE_GROUPED32=0 leaves tile_m 32
// to the mma.sync tiles (the A/B of bench/NOTES.md, session 55).
const void* grouped_kernel(qg_dtype x_dtype, int32_t tile_m) {
#if defined(QG_HAVE_TENSOR_MAPS)
    static const bool grouped32 = launch_util::env_int("QG_EXP_MOE_GROUPED32", 1) != 0;
    if (tile_m == 32 && !grouped32) return nullptr;
    return w4a16::prefill_kernel(elem_type(x_dtype), ELEM_BF16, tile_m, kGroup, false, w4a16::CODE_E2M1);
#else
    (void)x_dtype, (void)tile_m;
    return nullptr;
#endif
}

// The workspace of a grouped stage: gathered rows [max_sorted, K] (16-bit), then fp32 rows
// [P, out_cols] per pair.
struct GroupedWs {
    size_t gathered = 0, rows = 0;
    GroupedWs(int64_t T, int32_t top_k, int32_t E, int32_t tile_m, int64_t k, int64_t out_cols) {
        int64_t max_sorted = 0, max_tiles = 0;
        moe_align_sizes(T, top_k, E, tile_m, &max_sorted, &max_tiles);
        gathered = ws_align(static_cast<size_t>(max_sorted) * static_cast<size_t>(k) * 2);
        rows = ws_align(static_cast<size_t>(T * top_k) * static_cast<size_t>(out_cols) * sizeof(float));
    }
    size_t bytes() const { return gathered + rows; }
};

bool grouped_usable(const qg_context* ctx, int32_t tile_m, qg_mxfp4_layout layout, qg_dtype x_dtype, const void* x,
                    int64_t ldx, const char** why) {
    if (!stage_usable(ctx, layout, x_dtype, x, ldx, why)) return false;
    if (!wgmma_tier_usable(ctx, nullptr, 8, why)) return false;  // the gathered rows are the workspace's
    if (grouped_kernel(x_dtype, tile_m) == nullptr) {
        *why = "runs an expert tile as one wgmma token tile: tile_m 64 or 128 (32, 80, 96, 256 for bf16)";
        return false;
    }
    return true;
}

#if defined(QG_HAVE_TENSOR_MAPS)
// The grouped prefill of one stage: gathered rows in ws (max_sorted x k), fp32 output rows
// [P, n_out] (row stride ld_out) at out; weights: each expert `parts` parts of part_rows rows.
// glu: stage 1's arguments where the activation is fused into the epilogue (out is not written
// then: act is), else nullptr.
qg_status launch_grouped(const qg_context* ctx, const GemmCall& c, qg_dtype x_dtype, const uint16_t* gathered,
                         int64_t max_sorted, int parts, int part_valid, float* out, int64_t ld_out,
                         const BiasRef& bias, int64_t bias_stride, const qg_moe_stage1_args* glu, qg_stream stream,
                         const char* what) {
    using namespace w4a16;
    const int x_type = elem_type(x_dtype);
    const int bn = c.p.tile_m;
    const void* kernel = grouped_kernel(x_dtype, bn);
    const int smem = frag_launch::prefill_smem(bn);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, what);
    if (st != QG_OK) return st;
    qg_tensor_map map;
    st = launch_util::encode_x_map(gathered, max_sorted, c.p.k, c.p.k, x_dtype, prefill_box_rows(bn), &map, what);
    if (st != QG_OK) return st;
    const int row_blocks = parts * c.p.part_blocks;
    PrefillParams p{};
    p.qweight = c.p.qweight;
    p.scales = c.p.scales;
    p.y = out;
    p.ldy = ld_out;
    p.m = static_cast<int>(max_sorted);
    p.n = row_blocks * 16;
    p.k_tiles = 2 * c.p.k_chunks;
    p.k_chunks = c.p.k_chunks;
    p.row_blocks = row_blocks;
    p.scale_type = ELEM_BF16;
    p.y_type = ELEM_F32;
    p.bias = bias;
    p.tile_experts = c.p.tile_experts;
    p.num_sorted = c.p.num_sorted;
    p.out_rows = c.p.sorted_ids;
    p.out_limit = c.p.pairs;
    p.experts = c.p.experts;
    p.part_rows = c.p.part_blocks * 16;
    p.part_valid = part_valid;
    p.bias_stride = bias_stride;
    if (glu != nullptr) {
        p.act = glu->act;
        p.concat = glu->gate_up_layout == QG_GATE_UP_CONCAT;
        p.activation = glu->activation;
        p.alpha = glu->swiglu_alpha;
        p.limit = glu->swiglu_limit;
    }
    // one-dimensional, row tiles fastest (the kernel's grouped grid)
    const int64_t row_tiles = ceil_div(row_blocks, PF_ROWS / 16), blocks = row_tiles * c.p.max_tiles;
    if (blocks > INT32_MAX)
        return set_error(QG_ERR_UNSUPPORTED, "%s: %lld token tiles x %lld row tiles exceed one grid", what,
                         static_cast<long long>(c.p.max_tiles), static_cast<long long>(row_tiles));
    const dim3 grid(static_cast<unsigned>(blocks));
    if (log_enabled())
        log_once("%s: grouped prefill_wgmma, expert tiles of %d tokens, %lld token tiles x %lld row tiles (row tiles "
                 "fastest), smem %d%s", what, bn, static_cast<long long>(c.p.max_tiles), static_cast<long long>(row_tiles), smem,
                 glu != nullptr ? ", activation in the epilogue" : "");
    return launch_util::launch_with_map(kernel, grid, PF_THREADS, smem, static_cast<hipStream_t>(stream), map, p, what);
}

qg_status gather(const GemmCall& c, const void* src, int64_t ld, int row_div, int64_t max_sorted, uint16_t* dst,
                 qg_stream stream, const char* what) {
    moe::GatherParams g{};
    g.src = static_cast<const uint16_t*>(src);
    g.ld = ld;
    g.row_div = row_div;
    g.sorted_ids = c.p.sorted_ids;
    g.num_sorted = c.p.num_sorted;
    g.max_rows = static_cast<int>(max_sorted);
    g.pairs = c.p.pairs;
    g.k = c.p.k;
    g.dst = dst;
    const int64_t blocks = ceil_div(max_sorted * (c.p.k / 8), moe::GATHER_THREADS);
    return launch_util::launch(reinterpret_cast<const void*>(&moe::moe_gather), dim3(static_cast<unsigned>(blocks)),
                               moe::GATHER_THREADS, 0, static_cast<hipStream_t>(stream), g, what);
}
#endif

// Stage 1's activation in the grouped prefill's epilogue (PrefillParams::act): no fp32 gate / up
// rows written, read back and cleared by moe_act (at GPT-OSS-20b T = 2048, 189 MB three times).
// QG_EXP_MOE_FUSED_ACT=0 restores the moe_act path (the A/B of bench/NOTES.md, session 43).
bool fused_act_enabled() {
    static const bool on = [] {
        const char* v = getenv("QG_EXP_MOE_FUSED_ACT");
        return v == nullptr || v[0] != '0';
    }();
    return on;
}

// The fp32 gate / up columns of a stage-1 pair row in the workspace (none where the activation
// is fused).
int64_t stage1_rows(const qg_moe_stage1_args& a) { return fused_act_enabled() ? 0 : 2 * padded_rows(a.intermediate); }

size_t stage1_grouped_workspace(const qg_context*, const qg_moe_stage1_args& a) {
    return GroupedWs(a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.hidden, stage1_rows(a)).bytes();
}

bool stage1_grouped_usable(const qg_context* ctx, const qg_moe_stage1_args& a, const char** why) {
    return grouped_usable(ctx, a.tile_m, a.layout, a.x_dtype, a.x, a.ldx, why);
}

qg_status stage1_grouped_launch(const qg_context* ctx, const qg_moe_stage1_args& a, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const GemmCall c = stage1_call(ctx, a);  // routing, planes, sizes (not its split: the mma tiles')
    const int64_t ld_h = stage1_rows(a);
    const GroupedWs ws(a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.hidden, ld_h);
    const int64_t max_sorted = static_cast<int64_t>(c.p.max_tiles) * a.tile_m;
    uint16_t* gathered = static_cast<uint16_t*>(a.workspace);
    qg_status st = gather(c, a.x, a.ldx, a.top_k, max_sorted, gathered, stream, "moe stage1 gather");
    if (st != QG_OK) return st;
    if (ld_h == 0) {  // the activation in the epilogue, bias and all
        st = launch_grouped(ctx, c, a.x_dtype, gathered, max_sorted, 2, static_cast<int>(a.intermediate), nullptr, 0,
                            c.p.bias, 2 * a.intermediate, &a, stream, "moe stage1");
    } else {  // fp32 gate / up rows, then moe_act (which clears them)
        float* h = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + ws.gathered);
        st = launch_grouped(ctx, c, a.x_dtype, gathered, max_sorted, 2, static_cast<int>(a.intermediate), h, ld_h,
                            BiasRef{nullptr, ELEM_F32}, 0, nullptr, stream, "moe stage1");
        if (st == QG_OK) st = activation(ctx, a, c, h, 0, 1, max_sorted, stream);
    }
    if (st != QG_OK) return st;
    return gpu_memset(ctx, gathered, 0, ws.gathered, stream);
#else
    (void)ctx, (void)a, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: grouped prefill without tensor maps");
#endif
}

size_t stage2_grouped_workspace(const qg_context*, const qg_moe_stage2_args& a) {
    return GroupedWs(a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.intermediate, a.hidden).bytes();
}

bool stage2_grouped_usable(const qg_context* ctx, const qg_moe_stage2_args& a, const char** why) {
    return grouped_usable(ctx, a.tile_m, a.layout, a.act_dtype, a.act, a.intermediate, why);
}

qg_status stage2_grouped_launch(const qg_context* ctx, const qg_moe_stage2_args& a, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const GemmCall c = stage2_call(ctx, a);  // routing, planes, sizes (not its split: the mma tiles')
    const GroupedWs ws(a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.intermediate, a.hidden);
    const int64_t max_sorted = static_cast<int64_t>(c.p.max_tiles) * a.tile_m;
    uint16_t* gathered = static_cast<uint16_t*>(a.workspace);
    float* out = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + ws.gathered);
    qg_status st = gather(c, a.act, a.intermediate, 1, max_sorted, gathered, stream, "moe stage2 gather");
    if (st == QG_OK)
        st = launch_grouped(ctx, c, a.act_dtype, gathered, max_sorted, 1, static_cast<int>(a.hidden), out, a.hidden,
                            c.p.bias, a.hidden, nullptr, stream, "moe stage2");
    if (st == QG_OK) st = gpu_memset(ctx, gathered, 0, ws.gathered, stream);
    if (st != QG_OK) return st;
    return combine(ctx, a, out, 0, 1, stream);
#else
    (void)ctx, (void)a, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: grouped prefill without tensor maps");
#endif
}

}  // namespace

const Tier<qg_moe_align_args> gpu_moe_align_tier = {QG_GPU_RUNTIME_NAME ":moe_align", 0, align_usable, nullptr,
                                                    align_launch};
const Tier<qg_moe_stage1_args> gpu_moe_stage1_tier = {QG_GPU_RUNTIME_NAME ":moe_mma", 0, stage1_usable,
                                                      stage1_workspace, stage1_launch};
const Tier<qg_moe_stage2_args> gpu_moe_stage2_tier = {QG_GPU_RUNTIME_NAME ":moe_mma", 0, stage2_usable,
                                                      stage2_workspace, stage2_launch};
const Tier<qg_moe_stage1_args> gpu_moe_stage1_wgmma_tier = {QG_GPU_RUNTIME_NAME ":moe_wgmma", 0, stage1_grouped_usable,
                                                            stage1_grouped_workspace, stage1_grouped_launch};
const Tier<qg_moe_stage2_args> gpu_moe_stage2_wgmma_tier = {QG_GPU_RUNTIME_NAME ":moe_wgmma", 0, stage2_grouped_usable,
                                                            stage2_grouped_workspace, stage2_grouped_launch};

// Each part of each expert through the MXFP4 repack kernels, its canonical rows picked by
// the source offset and row step (moe_part_rows, src/tiers.h).
qg_status gpu_moe_repack(const qg_context*, const qg_moe_repack_args& a, qg_stream stream) {
    const MoePart part(a);
    for (int32_t e = 0; e < a.num_experts; ++e)
        for (int32_t h = 0; h < a.parts; ++h) {
            const int64_t first = part.first_row(e, h);
            w4a16::RepackParams p{};
            p.qweight = reinterpret_cast<const uint32_t*>(a.blocks + first * (a.k / 2));
            p.e8m0 = a.scales + first * (a.k / kGroup);
            p.out_qweight = reinterpret_cast<uint32_t*>(static_cast<char*>(a.out_blocks) + part.blocks_offset(e, h));
            p.out_scales = reinterpret_cast<uint16_t*>(static_cast<char*>(a.out_scales) + part.scales_offset(e, h));
            p.n = part.rows;
            p.k = a.k;
            p.group_size = kGroup;
            p.src_row_step = part.row_step;
            const qg_status st = frag_launch::repack(p, stream);
            if (st != QG_OK) return st;
        }
    return QG_OK;
}

}  // namespace qg
