// The W4A16 tier table and its auto policy (src/tier_table.h says how a call is routed).
//
//   name                 option  layouts          where
//   cpu                  -       both             CPU contexts (src/cpu/w4a16.cpp)
//   <gpu>:simt           1       both             every GPU (portable SIMT, fp32 FMA)
//   <gpu>:decode_mma     2       canonical        NVIDIA sm_80+, mma.sync, M <= 16 per launch
//   <gpu>:decode_frag    2       frag             NVIDIA sm_80+, mma.sync, M <= 16 per launch
//   <gpu>:prefill_wgmma  3       frag             NVIDIA sm_90a, wgmma, any M
#include "tier_table.h"

namespace qg {
namespace {

bool cpu_usable(const qg_context* ctx, const qg_w4a16_gemm_args&, const char** why) {
    return cpu_context_only(ctx, why);
}

qg_status cpu_launch(const qg_context* ctx, const qg_w4a16_gemm_args& a, qg_stream) {
    return a.layout == QG_W4A16_LAYOUT_FRAG ? cpu_w4a16_gemm_frag(ctx, &a) : cpu_w4a16_gemm(ctx, &a);
}

const Tier<qg_w4a16_gemm_args> kCpuTier = {"cpu", 0, cpu_usable, nullptr, cpu_launch};

const Tier<qg_w4a16_gemm_args>* const kTiers[] = {
    &kCpuTier,
#if defined(QG_HAVE_GPU)
    &gpu_w4a16_simt_tier,
    &gpu_w4a16_decode_mma_tier,
    &gpu_w4a16_decode_frag_tier,
    &gpu_w4a16_prefill_tier,
#endif
};

const Tier<qg_w4a16_gemm_args>* choose(const qg_context* ctx, const qg_w4a16_gemm_args& a, const char** reason) {
    if (!on_gpu(ctx)) {
        *reason = "CPU context";
        return &kCpuTier;
    }
#if defined(QG_HAVE_GPU)
    // the frag layout: prefill above 16 rows, else decode
    if (const Tier<qg_w4a16_gemm_args>* t = choose_frag(ctx, a, gpu_w4a16_prefill_tier, gpu_w4a16_decode_frag_tier, reason))
        return t;
    // the canonical layout: decode on the matrix units
    const bool many_rows = a.m > kFragDecodeRows;
    if (usable(gpu_w4a16_decode_mma_tier, ctx, a)) {
        *reason = many_rows ? "canonical layout (repack for prefill): decode per 16 rows"
                            : "m <= 16, canonical layout: memory-bound decode";
        return &gpu_w4a16_decode_mma_tier;
    }
    if (usable(gpu_w4a16_simt_tier, ctx, a)) {
        *reason = "no matrix-unit tier for this device or these pointers: portable SIMT";
        return &gpu_w4a16_simt_tier;
    }
    return nullptr;  // select_tier names every tier's reason (e.g. k past 2^31)
#else
    *reason = "";
    return nullptr;
#endif
}

}  // namespace

const TierTable<qg_w4a16_gemm_args>& w4a16_tier_table() {
    static const TierTable<qg_w4a16_gemm_args> table = {"w4a16", kTiers, sizeof(kTiers) / sizeof(kTiers[0]), choose};
    return table;
}

}  // namespace qg
