// MXFP4 MoE GPU tiers (hip/moe.hip): the table entries of align, stage 1 and stage 2, and the
// device side of qg_moe_repack. NVIDIA sm_80+ (mma.sync); the stages read the MoE frag layout
// only (a canonical expert stack on the GPU would be repacked on every call: more than a GB for
// GPT-OSS-120b, so the tier refuses it and names qg_moe_repack). Arguments were validated by
// src/api.cpp; the routing tables are device data, which the kernels never trust (hip/moe.hip).
#include <stdint.h>

#include <algorithm>

#include "formats/w4a16_frag.h"
#include "frag_launch.h"
#include "launch_util.h"
#include "moe_kernels.h"
#include "moe_sizes.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using launch_util::aligned16;
using launch_util::ceil_div;
using launch_util::elem_type;
using launch_util::mma_sync_device;

constexpr int kGroup = 32;             // one E8M0 scale per 32 elements
constexpr int kMaxGridY = 65535;       // tiles beyond it are walked by the blocks (hip/moe.hip)
constexpr size_t kWorkspaceAlign = 256;
constexpr int kMinSplitChunks = 8;     // stage 2 splits K in two only where each half has 4 chunks

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
    int stage = 0, mt = 0, splits = 1;
    int64_t tiles_bound = 0;  // the tiles a launch walks at most (min(max_tiles, pairs): each used tile holds a pair)
};

GemmCall gemm_call(int stage, int64_t T, int32_t top_k, int32_t E, int32_t tile_m, int64_t rows, int64_t k,
                   qg_dtype x_dtype, const void* x, int64_t ldx, const int32_t* sorted_ids, const int32_t* tile_experts,
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
    (void)x_dtype;
    return c;
}

qg_status launch_gemm(const qg_context* ctx, const GemmCall& c, qg_dtype x_dtype, qg_stream stream, const char* what) {
    const void* kernel = moe::gemm_kernel(elem_type(x_dtype), c.mt, c.stage);
    const int smem = moe::gemm_smem_bytes(c.mt);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, what);
    if (st != QG_OK) return st;
    const int64_t gx = ceil_div(c.p.part_blocks, moe::gemm_block_rbs(c.stage));
    const int64_t gy = std::max<int64_t>(1, std::min<int64_t>(c.tiles_bound, kMaxGridY));
    if (log_enabled())
        log_once("%s: tile_m=%d grid=%lldx%lldx%d (row tiles x expert tiles x k splits) chunks=%d smem=%d", what,
                 c.p.tile_m, static_cast<long long>(gx), static_cast<long long>(gy), c.splits, c.p.k_chunks, smem);
    return launch_util::launch(kernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), c.splits),
                               moe::GEMM_THREADS, smem, static_cast<hipStream_t>(stream), c.p, what);
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
    return launch_util::launch(kernel, dim3(1), moe::ALIGN_THREADS, smem, static_cast<hipStream_t>(stream), p,
                               "moe_align");
}

// ---------------------------------------------------------------- stage 1

bool stage1_usable(const qg_context* ctx, const qg_moe_stage1_args& a, const char** why) {
    return stage_usable(ctx, a.layout, a.x_dtype, a.x, a.ldx, why);
}

qg_status stage1_launch(const qg_context* ctx, const qg_moe_stage1_args& a, qg_stream stream) {
    GemmCall c = gemm_call(moe::STAGE_GATE_UP, a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.intermediate,
                           a.hidden, a.x_dtype, a.x, a.ldx, a.sorted_ids, a.tile_experts, a.num_sorted, a.w13_blocks,
                           a.w13_scales, a.w13_bias, a.bias_dtype);
    c.p.act = a.act;
    c.p.act_type = elem_type(a.x_dtype);
    c.p.concat = a.gate_up_layout == QG_GATE_UP_CONCAT;
    c.p.activation = a.activation;
    c.p.alpha = a.swiglu_alpha;
    c.p.limit = a.swiglu_limit;
    return launch_gemm(ctx, c, a.x_dtype, stream, "moe stage1");
}

// ---------------------------------------------------------------- stage 2

size_t stage2_workspace(const qg_context*, const qg_moe_stage2_args& a) {
    const size_t bytes = static_cast<size_t>(a.num_tokens * a.top_k) * static_cast<size_t>(a.hidden) * sizeof(float);
    return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

bool stage2_usable(const qg_context* ctx, const qg_moe_stage2_args& a, const char** why) {
    return stage_usable(ctx, a.layout, a.act_dtype, a.act, a.intermediate, why);
}

qg_status stage2_launch(const qg_context* ctx, const qg_moe_stage2_args& a, qg_stream stream) {
    GemmCall c = gemm_call(moe::STAGE_DOWN, a.num_tokens, a.top_k, a.num_experts, a.tile_m, a.hidden,
                           a.intermediate, a.act_dtype, a.act, a.intermediate, a.sorted_ids, a.tile_experts,
                           a.num_sorted, a.w2_blocks, a.w2_scales, a.w2_bias, a.bias_dtype);
    c.p.out = static_cast<float*>(a.workspace);
    // Under one wave of blocks (few tokens: T = 1 gives 4 tiles x 23 row tiles on GPT-OSS), the
    // two halves of K go to two blocks, which add into the zeroed workspace (hip/moe.hip: the
    // order of two additions to 0 does not change the sum).
    const int64_t blocks = ceil_div(c.p.part_blocks, moe::gemm_block_rbs(c.stage)) * c.tiles_bound;
    if (blocks < std::max(ctx->sm_count, 1) && c.p.k_chunks >= kMinSplitChunks) c.splits = 2;
    qg_status st = launch_gemm(ctx, c, a.act_dtype, stream, "moe stage2");
    if (st != QG_OK) return st;
    moe::CombineParams q{};
    q.out = static_cast<float*>(a.workspace);
    q.topk_weights = a.topk_weights;
    q.y = a.y;
    q.ldy = a.ldy;
    q.tokens = static_cast<int>(a.num_tokens);
    q.top_k = a.top_k;
    q.hidden = static_cast<int>(a.hidden);
    q.y_type = elem_type(a.y_dtype);
    const int64_t blocks = ceil_div(a.num_tokens * a.hidden, moe::COMBINE_THREADS);
    return launch_util::launch(reinterpret_cast<const void*>(&moe::moe_combine), dim3(static_cast<unsigned>(blocks)),
                               moe::COMBINE_THREADS, 0, static_cast<hipStream_t>(stream), q, "moe combine");
}

}  // namespace

const Tier<qg_moe_align_args> gpu_moe_align_tier = {QG_GPU_RUNTIME_NAME ":moe_align", 0, align_usable, nullptr,
                                                    align_launch};
const Tier<qg_moe_stage1_args> gpu_moe_stage1_tier = {QG_GPU_RUNTIME_NAME ":moe_mma", 0, stage1_usable, nullptr,
                                                      stage1_launch};
const Tier<qg_moe_stage2_args> gpu_moe_stage2_tier = {QG_GPU_RUNTIME_NAME ":moe_mma", 0, stage2_usable,
                                                      stage2_workspace, stage2_launch};

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
