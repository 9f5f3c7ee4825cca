// The MXFP4 tier tables: dense GEMM and the three MoE launches. Only the CPU tier exists
// so far (GPU tiers: issue "MXFP4 on the GPU"); a GPU context is refused by its tables.
#include "tier_table.h"

namespace qg {
namespace {

template <class Args>
bool cpu_usable(const qg_context* ctx, const Args&, const char** why) {
    return cpu_context_only(ctx, why);
}

qg_status gemm_launch(const qg_context* ctx, const qg_mxfp4_gemm_args& a, qg_stream) {
    return a.layout == QG_MXFP4_LAYOUT_FRAG ? cpu_mxfp4_gemm_frag(ctx, &a) : cpu_mxfp4_gemm(ctx, &a);
}
qg_status align_launch(const qg_context* ctx, const qg_moe_align_args& a, qg_stream) { return cpu_moe_align(ctx, &a); }
qg_status stage1_launch(const qg_context* ctx, const qg_moe_stage1_args& a, qg_stream) { return cpu_moe_stage1(ctx, &a); }
qg_status stage2_launch(const qg_context* ctx, const qg_moe_stage2_args& a, qg_stream) { return cpu_moe_stage2(ctx, &a); }

const Tier<qg_mxfp4_gemm_args> kGemmCpu = {"cpu", 0, cpu_usable<qg_mxfp4_gemm_args>, nullptr, gemm_launch};
const Tier<qg_moe_align_args> kAlignCpu = {"cpu", 0, cpu_usable<qg_moe_align_args>, nullptr, align_launch};
const Tier<qg_moe_stage1_args> kStage1Cpu = {"cpu", 0, cpu_usable<qg_moe_stage1_args>, nullptr, stage1_launch};
const Tier<qg_moe_stage2_args> kStage2Cpu = {"cpu", 0, cpu_usable<qg_moe_stage2_args>, nullptr, stage2_launch};

const Tier<qg_mxfp4_gemm_args>* const kGemmTiers[] = {&kGemmCpu};
const Tier<qg_moe_align_args>* const kAlignTiers[] = {&kAlignCpu};
const Tier<qg_moe_stage1_args>* const kStage1Tiers[] = {&kStage1Cpu};
const Tier<qg_moe_stage2_args>* const kStage2Tiers[] = {&kStage2Cpu};

// The policy of a family with one tier per backend: the first usable one.
template <class Args, const TierTable<Args>& (*TABLE)()>
const Tier<Args>* choose_first(const qg_context* ctx, const Args& a, const char** reason) {
    *reason = on_gpu(ctx) ? "" : "CPU context";
    return first_usable(TABLE(), ctx, a);
}

}  // namespace

#define QG_TABLE(FN, ARGS, FAMILY, TIERS)                                                                  \
    const TierTable<ARGS>& FN() {                                                                          \
        static const TierTable<ARGS> table = {FAMILY, TIERS, sizeof(TIERS) / sizeof(TIERS[0]),             \
                                              choose_first<ARGS, FN>};                                     \
        return table;                                                                                      \
    }
QG_TABLE(mxfp4_tier_table, qg_mxfp4_gemm_args, "mxfp4", kGemmTiers)
QG_TABLE(moe_align_tier_table, qg_moe_align_args, "moe", kAlignTiers)
QG_TABLE(moe_stage1_tier_table, qg_moe_stage1_args, "moe", kStage1Tiers)
QG_TABLE(moe_stage2_tier_table, qg_moe_stage2_args, "moe", kStage2Tiers)
#undef QG_TABLE

}  // namespace qg
