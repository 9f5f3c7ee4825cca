// The frag-layout GPU kernels (hip/w4a16_decode_frag.hip, hip/prefill_wgmma.h) behind three
// families' tiers: W4A16 (CODE_INT4, src/gpu/w4a16_*launch.cpp), MXFP4 (CODE_E2M1, which
// src/gpu/mxfp4_launch.cpp states as a W4A16 frag call of G = 32, bf16 scales, no zeros) and
// GGUF Q4_0 / Q4_K / IQ4_XS / Q8_0 / Q6_K / IQ3_XXS (CODE_INT4 / CODE_Q4_K / CODE_IQ4_XS / CODE_Q8_0 /
// CODE_Q6_K / CODE_IQ3_XXS, src/gpu/gguf_frag_launch.cpp, G = 32, no zeros).
// Arguments were validated by src/api.cpp; `usable` states what the kernels need.
#pragma once

#include <stddef.h>

#include "formats/gguf_frag.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace frag_launch {

// Names for QG_LOG lines: the family of a code, and what its nibbles and scales are.
inline const char* family_name(int code) {
    return code == w4a16::CODE_E2M1     ? "mxfp4"
           : code == w4a16::CODE_Q4_K   ? "gguf q4_K"
           : code == w4a16::CODE_IQ4_XS ? "gguf iq4_xs"
           : code == w4a16::CODE_Q8_0   ? "gguf q8_0"
           : code == w4a16::CODE_Q6_K   ? "gguf q6_K"
           : code == w4a16::CODE_IQ3_XXS ? "gguf iq3_xxs"
                                        : "w4a16";
}
inline const char* code_name(int code, bool asym) {
    return code == w4a16::CODE_E2M1     ? "e2m1"
           : code == w4a16::CODE_Q4_K   ? "q4_K"
           : code == w4a16::CODE_IQ4_XS ? "iq4_xs"
           : code == w4a16::CODE_Q8_0   ? "q8_0"
           : code == w4a16::CODE_Q6_K   ? "q6_K"
           : code == w4a16::CODE_IQ3_XXS ? "iq3_xxs"
           : asym                       ? "asym"
                                        : "sym";
}
// "<family> decode_frag" / "<family> prefill_wgmma": the kernels' names in errors and logs.
inline const char* kernel_name(int code, bool prefill) {
    static const char* const decode[] = {"w4a16 decode_frag", "mxfp4 decode_frag", "gguf q4_K decode_frag",
                                         "gguf iq4_xs decode_frag", "gguf q8_0 decode_frag", "gguf q6_K decode_frag",
                                         "gguf iq3_xxs decode_frag"};
    static const char* const pf[] = {"w4a16 prefill_wgmma", "mxfp4 prefill_wgmma", "gguf q4_K prefill_wgmma",
                                     "gguf iq4_xs prefill_wgmma", "gguf q8_0 prefill_wgmma", "gguf q6_K prefill_wgmma",
                                     "gguf iq3_xxs prefill_wgmma"};
    const int i = code >= w4a16::CODE_INT4 && code <= w4a16::CODE_IQ3_XXS ? code : 0;
    return prefill ? pf[i] : decode[i];
}
// CODE_Q4_K / CODE_IQ4_XS / CODE_Q6_K / CODE_IQ3_XXS: the super-block words, after the records in the call's scales
// plane (src/formats/gguf_frag.h); nullptr for the other codes.
inline const uint2* q4_k_superblocks(const qg_w4a16_gemm_args& a, int code) {
    if (!w4a16::has_superblocks(code)) return nullptr;
    const frag::Geometry geo(a.n, a.k, a.group_size);
    return reinterpret_cast<const uint2*>(static_cast<const char*>(a.scales) + gguf_frag::q4_K_sb_offset(geo));
}

constexpr int kDecodeRows = 16;  // rows of x per decode launch (decode_mma, decode_frag): two n8 mma tiles

// decode_frag: M <= 16 per launch (larger M: one launch per 16 rows), mma.sync (sm_80+)
bool decode_usable(const qg_context* ctx, const qg_w4a16_gemm_args& a, const char** why);
size_t decode_workspace(const qg_context* ctx, const qg_w4a16_gemm_args& a, int code);
qg_status decode(const qg_context* ctx, const qg_w4a16_gemm_args& a, int code, qg_stream stream);

// prefill_wgmma: any M, wgmma + TMA (sm_90a)
bool prefill_usable(const qg_context* ctx, const qg_w4a16_gemm_args& a, const char** why);
size_t prefill_workspace(const qg_context* ctx, const qg_w4a16_gemm_args& a, int code);  // stream-K sums
int prefill_smem(int bn);  // dynamic shared memory of the kernel of a token tile of bn (32, 64, 80, 96, 128, 256, fused)
qg_status prefill(const qg_context* ctx, const qg_w4a16_gemm_args& a, int code, qg_stream stream);

// The repack kernels (hip/w4a16_repack.hip) on `stream`.
qg_status repack(const w4a16::RepackParams& p, qg_stream stream);

}  // namespace frag_launch
}  // namespace qg
