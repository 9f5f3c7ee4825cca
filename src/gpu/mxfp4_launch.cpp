// MXFP4 dense GPU tiers: their table entries (src/tier_table.h) and the device repack. An
// MXFP4 weight in the frag layout (qg_mxfp4_repack) is a W4A16 frag weight of G = 32 with
// bf16 scales, no zero-points and E2M1 values for nibbles, so both tiers are the W4A16 frag
// kernels instantiated for CODE_E2M1 (src/gpu/frag_launch.h); this file states the call in
// those terms (a canonical weight is repacked into the workspace first). Arguments were
// validated by src/api.cpp.
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
constexpr size_t kPlaneAlign = 256;

size_t aligned(size_t v) { return (v + kPlaneAlign - 1) / kPlaneAlign * kPlaneAlign; }

// A canonical weight is repacked into the front of the workspace on every call, which is
// zeroed again after the kernel (the workspace contract: the library leaves it as it found
// it): correct, and slow (the weight is read twice, its planes written and cleared once more
// per call); a caller that repacks once with qg_mxfp4_repack (pyquant: MXFP4Weight.to_device)
// skips it.
struct Staging {
    size_t blocks_bytes = 0, scales_bytes = 0, bytes = 0;  // bytes = 0: the weight is frag already
};
Staging staging_of(const Args& a) {
    Staging st;
    if (a.layout == QG_MXFP4_LAYOUT_FRAG) return st;
    const frag::Geometry geo(a.n, a.k, kGroup);
    st.blocks_bytes = static_cast<size_t>(geo.qweight_bytes());
    st.scales_bytes = static_cast<size_t>(geo.scales_bytes());
    st.bytes = aligned(st.blocks_bytes) + aligned(st.scales_bytes);
    return st;
}

// The same call as a W4A16 frag call of G = 32 with bf16 scales: blocks and scales are the
// two planes (a canonical weight's are staged at the front of the workspace).
qg_w4a16_gemm_args as_frag_call(const Args& a) {
    const Staging st = staging_of(a);
    char* ws = static_cast<char*>(a.workspace);
    qg_w4a16_gemm_args w{};
    w.size = sizeof(w);
    w.m = a.m, w.n = a.n, w.k = a.k;
    w.group_size = kGroup;
    w.x_dtype = a.x_dtype;
    w.y_dtype = a.y_dtype;
    w.scale_dtype = QG_DTYPE_BF16;
    w.x = a.x;
    w.ldx = a.ldx;
    w.qweight = reinterpret_cast<const int32_t*>(st.bytes ? ws : reinterpret_cast<const char*>(a.blocks));
    w.scales = st.bytes ? ws + aligned(st.blocks_bytes) : static_cast<const void*>(a.scales);
    w.qzeros = nullptr;
    w.y = a.y;
    w.ldy = a.ldy;
    w.workspace = st.bytes && ws ? ws + st.bytes : a.workspace;
    w.workspace_bytes = a.workspace_bytes > st.bytes ? a.workspace_bytes - st.bytes : 0;
    w.layout = QG_W4A16_LAYOUT_FRAG;
    w.bias = a.bias;
    w.bias_dtype = a.bias_dtype;
    return w;
}

// What both tiers need of an MXFP4 call before the frag kernels' own conditions.
bool mxfp4_gpu_call(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (a.x_dtype != QG_DTYPE_F16 && a.x_dtype != QG_DTYPE_BF16) {
        *why = "takes fp16 or bf16 x (the E2M1 values enter the matrix units in x's type)";
        return false;
    }
    if (a.layout == QG_MXFP4_LAYOUT_CANONICAL && (reinterpret_cast<uintptr_t>(a.blocks) & 3u) != 0) {
        *why = "repacks a canonical weight 4 bytes at a time: blocks must be 4-byte aligned";
        return false;
    }
    return true;
}

// The staging repack of a canonical weight, the kernel, the staging cleared.
template <class Kernel>
qg_status staged(const qg_context* ctx, const Args& a, qg_stream stream, Kernel run) {
    const Staging st = staging_of(a);
    if (st.bytes) {
        const qg_w4a16_gemm_args w = as_frag_call(a);
        qg_mxfp4_repack_args r{};
        r.size = sizeof(r);
        r.layout = QG_MXFP4_LAYOUT_FRAG;
        r.n = a.n, r.k = a.k;
        r.blocks = a.blocks;
        r.scales = a.scales;
        r.out_blocks = const_cast<int32_t*>(w.qweight);
        r.out_scales = const_cast<void*>(w.scales);
        if (log_enabled())
            log_once("mxfp4 canonical weight on the GPU: repacked into the workspace on every call (%zu bytes); "
                     "qg_mxfp4_repack once instead", st.bytes);
        const qg_status s = gpu_mxfp4_repack(ctx, r, stream);
        if (s != QG_OK) return s;
    }
    const qg_status s = run(as_frag_call(a));
    if (s != QG_OK || !st.bytes) return s;
    return gpu_memset(ctx, a.workspace, 0, st.bytes, stream);
}

bool decode_usable(const qg_context* ctx, const Args& a, const char** why) {
    return mxfp4_gpu_call(ctx, a, why) && frag_launch::decode_usable(ctx, as_frag_call(a), why);
}
size_t decode_workspace(const qg_context* ctx, const Args& a) {
    return staging_of(a).bytes + frag_launch::decode_workspace(ctx, as_frag_call(a), CODE_E2M1);
}
qg_status decode_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return staged(ctx, a, stream, [&](const qg_w4a16_gemm_args& w) { return frag_launch::decode(ctx, w, CODE_E2M1, stream); });
}

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    return mxfp4_gpu_call(ctx, a, why) && frag_launch::prefill_usable(ctx, as_frag_call(a), why);
}
size_t prefill_workspace(const qg_context* ctx, const Args& a) {
    return staging_of(a).bytes + frag_launch::prefill_workspace(ctx, as_frag_call(a), CODE_E2M1);
}
qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return staged(ctx, a, stream, [&](const qg_w4a16_gemm_args& w) { return frag_launch::prefill(ctx, w, CODE_E2M1, stream); });
}

}  // namespace

const Tier<Args> gpu_mxfp4_decode_frag_tier = {QG_GPU_RUNTIME_NAME ":decode_frag", 2, decode_usable,
                                               decode_workspace, decode_launch};
const Tier<Args> gpu_mxfp4_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable,
                                           prefill_workspace, prefill_launch};

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
