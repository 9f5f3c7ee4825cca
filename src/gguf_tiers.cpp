// The GGUF tier table and its auto policy (src/tier_table.h says how a call is routed).
//
//   name             option  where
//   cpu              -       CPU contexts (src/cpu/gguf.cpp; every layout, rows8 its own)
//   <gpu>:float      1       every GPU: x kept in fp32, SIMT decode (hip/gguf.hip)
//   <gpu>:int8_mma   2       NVIDIA sm_80+: x quantized to int8 per 32, mma.sync (hip/gguf_mma.hip)
//   <gpu>:prefill_wgmma 3    NVIDIA sm_90a, bf16 x: weights dequantized to bf16 tiles, wgmma
//                            (hip/gguf_prefill.hip)
//   <gpu>:decode_frag   4    the frag layout (qg_gguf_repack: every format): the W4A16 frag decode
//   <gpu>:prefill_frag  5    the frag layout: the W4A16 frag prefill, wgmma (sm_90a)
//                            (src/gpu/gguf_frag_launch.cpp)
// The block-layout GPU tiers refuse a frag weight and the frag ones a block weight; the CPU
// tier serves both.
#include "tier_table.h"

namespace qg {
namespace {

bool cpu_usable(const qg_context* ctx, const qg_gguf_gemm_args&, const char** why) {
    return cpu_context_only(ctx, why);
}

qg_status cpu_launch(const qg_context* ctx, const qg_gguf_gemm_args& a, qg_stream) {
    return a.layout == QG_GGUF_LAYOUT_FRAG ? cpu_gguf_gemm_frag(ctx, &a) : cpu_gguf_gemm(ctx, &a);
}

const Tier<qg_gguf_gemm_args> kCpuTier = {"cpu", 0, cpu_usable, nullptr, cpu_launch};

const Tier<qg_gguf_gemm_args>* const kTiers[] = {
    &kCpuTier,
#if defined(QG_HAVE_GPU)
    &gpu_gguf_float_tier,
    &gpu_gguf_int8_tier,
    &gpu_gguf_prefill_tier,
    &gpu_gguf_decode_frag_tier,
    &gpu_gguf_prefill_frag_tier,
#endif
};

#if defined(QG_HAVE_GPU)
// Rows of x above which auto takes the prefill tier where it is usable: 8 (the decode
// tiers' launch width), 16 where the prefill grid is under one wave.
constexpr int64_t kGgufPrefillMinRows = 8;
constexpr int64_t kGgufPrefillMinRowsFewBlocks = 16;
#endif

const Tier<qg_gguf_gemm_args>* choose(const qg_context* ctx, const qg_gguf_gemm_args& a, const char** reason) {
    if (!on_gpu(ctx)) {
        *reason = "CPU context";
        return &kCpuTier;
    }
#if defined(QG_HAVE_GPU)
    if (a.layout == QG_GGUF_LAYOUT_FRAG)  // the W4A16 frag kernels, the frag policy (src/tier_table.h)
        return choose_frag(ctx, a, gpu_gguf_prefill_frag_tier, gpu_gguf_decode_frag_tier, reason);
    // Above 8 rows the decode tiers launch once per 8 rows of x and read every weight each
    // time; one prefill launch reads it once per 128 or 256 tokens on wgmma. Where the
    // prefill grid is under one wave (narrow N, few tokens: 5376 x 21504 has 42 row tiles)
    // its blocks each stream all of K and the decode launches win up to 16 rows (5376 x 21504
    // M = 16, decode vs prefill: q4_K 268 vs 288-371 us, iq3_xxs 171 vs 352; at M = 17 the
    // decode tiers take a third launch: q4_K 334 against ~325, prefill's time for any M up to
    // 128), except q8_0, whose decode is the slowest (M = 16: 454 vs 334; M = 17: 573 vs ~320;
    // docs/gguf-prefill.md section 6).
    const int64_t prefill_blocks = (a.n + 127) / 128 * ((a.m + 127) / 128);
    const bool prefill_under_a_wave = prefill_blocks < ctx->sm_count && a.format != QG_FORMAT_Q8_0;
    const bool many_rows = a.m > (prefill_under_a_wave ? kGgufPrefillMinRowsFewBlocks : kGgufPrefillMinRows);
    if (many_rows && usable(gpu_gguf_prefill_tier, ctx, a)) {
        *reason = "many rows of bf16 x: bf16 weight tiles on wgmma";
        return &gpu_gguf_prefill_tier;
    }
    // Q6_K at m = 1 stays on the float tier: on the H200 it is as fast there (43008 x 5376)
    // or faster (5376 x 21504: 58.6 vs 72.3 us), and exact in x (bench/NOTES.md, g3)
    const bool q6k_single_row = a.format == QG_FORMAT_Q6_K && a.m == 1;
    if (!q6k_single_row && usable(gpu_gguf_int8_tier, ctx, a)) {
        *reason = "int8 x on the matrix units";
        return &gpu_gguf_int8_tier;
    }
    if (!usable(gpu_gguf_float_tier, ctx, a)) return nullptr;  // select_tier names every tier's reason
    *reason = q6k_single_row ? "q6_K at m = 1: the float tier measured as fast" : "no int8 mma tier here: float x";
    return &gpu_gguf_float_tier;
#else
    *reason = "";
    return nullptr;
#endif
}

}  // namespace

const TierTable<qg_gguf_gemm_args>& gguf_tier_table() {
    static const TierTable<qg_gguf_gemm_args> table = {"gguf", kTiers, sizeof(kTiers) / sizeof(kTiers[0]), choose};
    return table;
}

}  // namespace qg
