// GGUF frag-layout GPU tiers: their table entries (src/tier_table.h) and the device repack. A
// Q4_0 weight in the frag layout (qg_gguf_repack) is a W4A16 frag weight of G = 32, symmetric,
// with fp16 scales, a Q4_K or IQ4_XS one the same planes with its records and super-block
// words, a Q8_0 one Q4_0's scales with a byte plane for its codes, a Q6_K one that byte plane
// with Q4_K's records and super-block words, an IQ3_XXS one IQ4_XS's planes with its own codebook
// (src/formats/gguf_frag.h), so both tiers are the W4A16 frag kernels (src/gpu/frag_launch.h) on
// the same call stated in W4A16 terms, Q4_K, IQ4_XS, Q8_0, Q6_K and IQ3_XXS with their own codes
// (CODE_Q4_K, CODE_IQ4_XS, CODE_Q8_0, CODE_Q6_K, CODE_IQ3_XXS).
// Arguments were validated by src/api.cpp.
#include <stdint.h>

#include "formats/gguf_frag.h"
#include "frag_launch.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using namespace w4a16;
typedef qg_gguf_gemm_args Args;

// The same call as a W4A16 frag call: w and w_scales are the qweight and scales planes.
qg_w4a16_gemm_args as_frag_call(const Args& a) {
    qg_w4a16_gemm_args w{};
    w.size = sizeof(w);
    w.m = a.m, w.n = a.n, w.k = a.k;
    w.group_size = gguf_frag::kGroup;
    w.x_dtype = a.x_dtype;
    w.y_dtype = a.y_dtype;
    w.scale_dtype = QG_DTYPE_F16;
    w.x = a.x;
    w.ldx = a.ldx;
    w.qweight = static_cast<const int32_t*>(a.w);
    w.scales = a.w_scales;
    w.qzeros = nullptr;  // Q4_0's d * (q - 8): z = 8; the others: no zero-points (their codes)
    w.y = a.y;
    w.ldy = a.ldy;
    w.workspace = a.workspace;
    w.workspace_bytes = a.workspace_bytes;
    w.layout = QG_W4A16_LAYOUT_FRAG;
    w.bias = a.bias;
    w.bias_dtype = a.bias_dtype;
    return w;
}

// What both tiers need of a GGUF call before the frag kernels' own conditions.
bool frag_call(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (a.layout != QG_GGUF_LAYOUT_FRAG) {
        *why = "reads the frag layout (qg_gguf_repack); the .gguf blocks have their own tiers";
        return false;
    }
    if (a.x_dtype != QG_DTYPE_F16 && a.x_dtype != QG_DTYPE_BF16) {
        *why = "takes fp16 or bf16 x (the codes enter the matrix units in x's type; fp32 x: the block layout)";
        return false;
    }
    return true;
}

// What the frag kernels take the nibbles for.
int code_of(const Args& a) {
    return a.format == QG_FORMAT_Q4_K     ? CODE_Q4_K
           : a.format == QG_FORMAT_IQ4_XS ? CODE_IQ4_XS
           : a.format == QG_FORMAT_Q8_0   ? CODE_Q8_0
           : a.format == QG_FORMAT_Q6_K   ? CODE_Q6_K
           : a.format == QG_FORMAT_IQ3_XXS ? CODE_IQ3_XXS
                                          : CODE_INT4;
}

bool decode_usable(const qg_context* ctx, const Args& a, const char** why) {
    return frag_call(ctx, a, why) && frag_launch::decode_usable(ctx, as_frag_call(a), why);
}
size_t decode_workspace(const qg_context* ctx, const Args& a) {
    return frag_launch::decode_workspace(ctx, as_frag_call(a), code_of(a));
}
qg_status decode_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::decode(ctx, as_frag_call(a), code_of(a), stream);
}

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    return frag_call(ctx, a, why) && frag_launch::prefill_usable(ctx, as_frag_call(a), why);
}
size_t prefill_workspace(const qg_context* ctx, const Args& a) {
    return frag_launch::prefill_workspace(ctx, as_frag_call(a), code_of(a));
}
qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::prefill(ctx, as_frag_call(a), code_of(a), stream);
}

}  // namespace

const Tier<Args> gpu_gguf_decode_frag_tier = {QG_GPU_RUNTIME_NAME ":decode_frag", 4, decode_usable, decode_workspace,
                                              decode_launch};
const Tier<Args> gpu_gguf_prefill_frag_tier = {QG_GPU_RUNTIME_NAME ":prefill_frag", 5, prefill_usable,
                                               prefill_workspace, prefill_launch};

// The W4A16 repack kernels reading the codes and scales of the blocks of a frag format
// (src/formats/gguf_frag.h).
qg_status gpu_gguf_repack(const qg_context*, const qg_gguf_repack_args& a, qg_stream stream) {
    RepackParams p{};
    p.gguf = static_cast<const uint8_t*>(a.w);
    p.gguf_format = a.format;
    p.ldw = a.ldw;
    p.out_qweight = static_cast<uint32_t*>(a.out_w);
    p.out_scales = static_cast<uint16_t*>(a.out_scales);
    p.n = a.n;
    p.k = a.k;
    p.group_size = gguf_frag::kGroup;
    return frag_launch::repack(p, stream);
}

}  // namespace qg
