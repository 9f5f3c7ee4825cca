// MXFP4 dense GPU tiers: their table entries (src/tier_table.h) and the device repack. An
// MXFP4 weight in the frag layout (qg_mxfp4_repack) is a W4A16 frag weight of G = 32 with
// bf16 scales, no zero-points and E2M1 values for nibbles, so both tiers are the W4A16 frag
// kernels instantiated for CODE_E2M1 (src/gpu/frag_launch.h); this file states the call in
// those terms. Arguments were validated by src/api.cpp.
#include <stdint.h>

#include "formats/w4a16_frag.h"
#include "frag_launch.h"
#include "launch_util.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using namespace w4a16;
typedef qg_mxfp4_gemm_args Args;

constexpr int kGroup = 32;  // one E8M0 scale per 32 elements

// The same call as a W4A16 frag call: blocks and scales are the two planes.
qg_w4a16_gemm_args as_frag_call(const Args& a) {
    qg_w4a16_gemm_args w{};
    w.size = sizeof(w);
    w.m = a.m, w.n = a.n, w.k = a.k;
    w.group_size = kGroup;
    w.x_dtype = a.x_dtype;
    w.y_dtype = a.y_dtype;
    w.scale_dtype = QG_DTYPE_BF16;
    w.x = a.x;
    w.ldx = a.ldx;
    w.qweight = reinterpret_cast<const int32_t*>(a.blocks);
    w.scales = a.scales;
    w.qzeros = nullptr;
    w.y = a.y;
    w.ldy = a.ldy;
    w.workspace = a.workspace;
    w.workspace_bytes = a.workspace_bytes;
    w.layout = QG_W4A16_LAYOUT_FRAG;
    w.bias = a.bias;
    w.bias_dtype = a.bias_dtype;
    return w;
}

// What both tiers need of an MXFP4 call before the frag kernels' own conditions.
bool mxfp4_gpu_call(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (a.layout != QG_MXFP4_LAYOUT_FRAG) {
        *why = "reads the frag layout: repack the weight once with qg_mxfp4_repack (pyquant: MXFP4Weight.to_device)";
        return false;
    }
    if (a.x_dtype != QG_DTYPE_F16 && a.x_dtype != QG_DTYPE_BF16) {
        *why = "takes fp16 or bf16 x (the E2M1 values enter the matrix units in x's type)";
        return false;
    }
    return true;
}

bool decode_usable(const qg_context* ctx, const Args& a, const char** why) {
    return mxfp4_gpu_call(ctx, a, why) && frag_launch::decode_usable(ctx, as_frag_call(a), why);
}
size_t decode_workspace(const qg_context* ctx, const Args& a) {
    return frag_launch::decode_workspace(ctx, as_frag_call(a), CODE_E2M1);
}
qg_status decode_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::decode(ctx, as_frag_call(a), CODE_E2M1, stream);
}

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    return mxfp4_gpu_call(ctx, a, why) && frag_launch::prefill_usable(ctx, as_frag_call(a), why);
}
qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::prefill(ctx, as_frag_call(a), CODE_E2M1, stream);
}

}  // namespace

const Tier<Args> gpu_mxfp4_decode_frag_tier = {QG_GPU_RUNTIME_NAME ":decode_frag", 2, decode_usable,
                                               decode_workspace, decode_launch};
const Tier<Args> gpu_mxfp4_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable, nullptr,
                                           prefill_launch};

// The W4A16 repack kernels with the E8M0 bytes converted to bf16 on the way (frag::e8m0_bf16).
qg_status gpu_mxfp4_repack(const qg_context*, const qg_mxfp4_repack_args& a, qg_stream stream) {
    RepackParams p{};
    p.qweight = reinterpret_cast<const uint32_t*>(a.blocks);
    p.e8m0 = a.scales;
    p.out_qweight = static_cast<uint32_t*>(a.out_blocks);
    p.out_scales = static_cast<uint16_t*>(a.out_scales);
    p.n = a.n;
    p.k = a.k;
    p.group_size = kGroup;
    return frag_launch::repack(p, stream);
}

}  // namespace qg
