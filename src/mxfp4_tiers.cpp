// The MXFP4 tier tables: dense GEMM and the three MoE launches. Dense GEMM:
//
//   name                 option  layouts          where
//   cpu                  -       both             CPU contexts (src/cpu/mxfp4.cpp)
//   <gpu>:decode_frag    2       frag             NVIDIA sm_80+, mma.sync, M <= 16 per launch
//   <gpu>:prefill_wgmma  3       frag             NVIDIA sm_90a, wgmma, any M
//
// (the W4A16 frag kernels on E2M1 nibbles: src/gpu/mxfp4_launch.cpp). The MoE launches, one
// tier per backend (src/gpu/moe_launch.cpp):
//
//   launch   name             layouts               where
//   align    cpu              -                     CPU contexts (src/cpu/moe.cpp)
//            <gpu>:moe_align  -                     NVIDIA sm_80+, one block, E <= 1024
//   stage1/2 cpu              canonical             CPU contexts
//            <gpu>:moe_mma    MoE frag (qg_moe_repack)  NVIDIA sm_80+, mma.sync expert tiles (tile_m <= 64)
//            <gpu>:moe_wgmma  MoE frag              NVIDIA sm_90a, tile_m 64 / 128 (and 32 / 80 / 96 /
//                                                   256 with bf16 x): the W4A16 prefill kernel
//                                                   grouped over the experts
#include "tier_table.h"

namespace qg {
namespace {

template <class Args>
bool cpu_usable(const qg_context* ctx, const Args&, const char** why) {
    return cpu_context_only(ctx, why);
}

// The CPU stages read canonical expert stacks (the MoE frag layout is the GPU tiers').
template <class Args>
bool cpu_stage_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!cpu_context_only(ctx, why)) return false;
    if (a.layout == QG_MXFP4_LAYOUT_CANONICAL) return true;
    *why = "reads canonical expert stacks (the MoE frag layout is the GPU tiers')";
    return false;
}

qg_status gemm_launch(const qg_context* ctx, const qg_mxfp4_gemm_args& a, qg_stream) {
    return a.layout == QG_MXFP4_LAYOUT_FRAG ? cpu_mxfp4_gemm_frag(ctx, &a) : cpu_mxfp4_gemm(ctx, &a);
}
qg_status align_launch(const qg_context* ctx, const qg_moe_align_args& a, qg_stream) { return cpu_moe_align(ctx, &a); }
qg_status stage1_launch(const qg_context* ctx, const qg_moe_stage1_args& a, qg_stream) { return cpu_moe_stage1(ctx, &a); }
qg_status stage2_launch(const qg_context* ctx, const qg_moe_stage2_args& a, qg_stream) { return cpu_moe_stage2(ctx, &a); }

const Tier<qg_mxfp4_gemm_args> kGemmCpu = {"cpu", 0, cpu_usable<qg_mxfp4_gemm_args>, nullptr, gemm_launch};
const Tier<qg_moe_align_args> kAlignCpu = {"cpu", 0, cpu_usable<qg_moe_align_args>, nullptr, align_launch};
const Tier<qg_moe_stage1_args> kStage1Cpu = {"cpu", 0, cpu_stage_usable<qg_moe_stage1_args>, nullptr, stage1_launch};
const Tier<qg_moe_stage2_args> kStage2Cpu = {"cpu", 0, cpu_stage_usable<qg_moe_stage2_args>, nullptr, stage2_launch};

const Tier<qg_mxfp4_gemm_args>* const kGemmTiers[] = {
    &kGemmCpu,
#if defined(QG_HAVE_GPU)
    &gpu_mxfp4_decode_frag_tier,
    &gpu_mxfp4_prefill_tier,
#endif
};

// Dense GEMM: the frag policy (choose_frag, src/tier_table.h), the same kernels as W4A16.
const Tier<qg_mxfp4_gemm_args>* choose_gemm(const qg_context* ctx, const qg_mxfp4_gemm_args& a,
                                             const char** reason) {
    if (!on_gpu(ctx)) {
        *reason = "CPU context";
        return &kGemmCpu;
    }
#if defined(QG_HAVE_GPU)
    if (const Tier<qg_mxfp4_gemm_args>* t = choose_frag(ctx, a, gpu_mxfp4_prefill_tier, gpu_mxfp4_decode_frag_tier, reason))
        return t;
#endif
    *reason = "";
    return nullptr;  // select_tier names every tier's reason
}
#if defined(QG_HAVE_GPU)
// choose_stage: the grouped wgmma tier where it is usable (on sm_90a tile_m 64, 128; 32, 80, 96
// and 256 with bf16 x), else the mma.sync tiles (every tile_m up to 64)
const Tier<qg_moe_align_args>* const kAlignTiers[] = {&kAlignCpu, &gpu_moe_align_tier};
const Tier<qg_moe_stage1_args>* const kStage1Tiers[] = {&kStage1Cpu, &gpu_moe_stage1_tier,
                                                        &gpu_moe_stage1_wgmma_tier};
const Tier<qg_moe_stage2_args>* const kStage2Tiers[] = {&kStage2Cpu, &gpu_moe_stage2_tier,
                                                        &gpu_moe_stage2_wgmma_tier};
#else
const Tier<qg_moe_align_args>* const kAlignTiers[] = {&kAlignCpu};
const Tier<qg_moe_stage1_args>* const kStage1Tiers[] = {&kStage1Cpu};
const Tier<qg_moe_stage2_args>* const kStage2Tiers[] = {&kStage2Cpu};
#endif

// The policy of a family with one tier per backend: the first usable one.
template <class Args, const TierTable<Args>& (*TABLE)()>
const Tier<Args>* choose_first(const qg_context* ctx, const Args& a, const char** reason) {
    *reason = on_gpu(ctx) ? "" : "CPU context";
    return first_usable(TABLE(), ctx, a);
}

// The stages: the first usable tier, with the reason it is chosen on a GPU.
bool is_grouped_wgmma(const char* name) {  // "<gpu>:moe_wgmma"
    const char* colon = name;
    while (*colon != 0 && *colon != ':') ++colon;
    return *colon == ':' && same_text(colon + 1, "moe_wgmma");
}

// The grouped wgmma tier wherever it is usable (at 64 it measured 12-20 % faster than the
// mma.sync tiles' 32 and the grouped 128 from 32 to 256 rows an expert, bench/NOTES.md session
// 48; at 32, bf16 x, 0.84-0.89x the mma.sync 32's layer time at 17-40 rows, session 55), else the
// first usable tier (the mma.sync tiles up to 64).
template <class Args, const TierTable<Args>& (*TABLE)()>
const Tier<Args>* choose_stage(const qg_context* ctx, const Args& a, const char** reason) {
    const TierTable<Args>& table = TABLE();
    const Tier<Args>* t = nullptr;
    for (int i = 0; i < table.count && t == nullptr; ++i)
        if (is_grouped_wgmma(table.tiers[i]->name) && usable(*table.tiers[i], ctx, a)) t = table.tiers[i];
    if (t == nullptr) t = first_usable(table, ctx, a);
    *reason = !on_gpu(ctx) ? "CPU context"
              : t != nullptr && is_grouped_wgmma(t->name)
                  ? "a wgmma token tile on sm_90a: the W4A16 prefill kernel grouped over the expert tiles"
                  : "mma.sync expert tiles (tile_m <= 64)";
    return t;
}

}  // namespace

#define QG_TABLE(FN, ARGS, FAMILY, TIERS, CHOOSE)                                                                  \
    const TierTable<ARGS>& FN() {                                                                          \
        static const TierTable<ARGS> table = {FAMILY, TIERS, sizeof(TIERS) / sizeof(TIERS[0]),             \
                                              CHOOSE<ARGS, FN>};                                           \
        return table;                                                                                      \
    }
const TierTable<qg_mxfp4_gemm_args>& mxfp4_tier_table() {
    static const TierTable<qg_mxfp4_gemm_args> table = {"mxfp4", kGemmTiers,
                                                        sizeof(kGemmTiers) / sizeof(kGemmTiers[0]), choose_gemm};
    return table;
}
QG_TABLE(moe_align_tier_table, qg_moe_align_args, "moe", kAlignTiers, choose_first)
QG_TABLE(moe_stage1_tier_table, qg_moe_stage1_args, "moe", kStage1Tiers, choose_stage)
QG_TABLE(moe_stage2_tier_table, qg_moe_stage2_args, "moe", kStage2Tiers, choose_stage)
#undef QG_TABLE

}  // namespace qg
