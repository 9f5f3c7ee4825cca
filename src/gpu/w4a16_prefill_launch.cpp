// W4A16 prefill tier (hip/w4a16_prefill.hip): its table entry, the tensor map of x and the
// launch. NVIDIA sm_90a only (wgmma, TMA); on other builds and devices it is not usable.
#include <stdint.h>

#include "formats/w4a16_frag.h"
#include "frag_launch.h"
#include "launch_util.h"
#include "tier_table.h"
#include "wgmma_gate.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using namespace w4a16;
using launch_util::ceil_div;
typedef qg_w4a16_gemm_args Args;

using launch_util::elem_type;

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (a.layout != QG_W4A16_LAYOUT_FRAG) {
        *why = "reads the frag layout (qg_w4a16_repack)";
        return false;
    }
    return frag_launch::prefill_usable(ctx, a, why);
}

qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::prefill(ctx, a, CODE_INT4, stream);
}

}  // namespace

bool frag_prefill_starved(const qg_context* ctx, int64_t m, int64_t n, int64_t k) {
    const int64_t prefill_blocks = (n + PF_ROWS - 1) / PF_ROWS * ((m + 63) / 64);
    return prefill_blocks < ctx->sm_count && k >= 8192 && m <= 48;
}

bool frag_launch::prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!wgmma_tier_usable(ctx, a.x, a.ldx, why)) return false;
    if (a.n >= (int64_t(1) << 31) || a.k >= (int64_t(1) << 31) || a.m >= (int64_t(1) << 31) ||
        a.ldx >= (int64_t(1) << 38)) {
        *why = "m, n, k must be below 2^31 and ldx below 2^38 (32-bit indices, TMA strides)";
        return false;
    }
    return true;
}

qg_status frag_launch::prefill(const qg_context* ctx, const Args& a, int code, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const char* what = code == CODE_E2M1 ? "mxfp4 prefill_wgmma" : "w4a16 prefill_wgmma";
    const frag::Geometry geo(a.n, a.k, a.group_size);
    // 64-token tiles when 128 would leave most of one empty (m <= 64) or the grid short of
    // two waves (measured: bench/NOTES.md, "W4A16 prefill")
    const int64_t row_tiles = ceil_div(a.n, PF_ROWS);
    const bool small_m = a.m <= 64;
    const bool few_blocks = row_tiles * ceil_div(a.m, 128) < 2 * static_cast<int64_t>(ctx->sm_count);
    // MXFP4 with bf16 x (the scale folded into A, no group sum) also has a 256-token tile: half
    // the dequantization per FLOP, where the grid still holds two waves of it
    const bool fold = code == CODE_E2M1 && a.x_dtype == QG_DTYPE_BF16;
    const bool wide = fold && row_tiles * ceil_div(a.m, 256) >= 2 * static_cast<int64_t>(ctx->sm_count);
    const int bn = small_m || few_blocks ? 64 : wide ? 256 : 128;
    const int x_type = elem_type(a.x_dtype);
    const bool asym = a.qzeros != nullptr;
    const void* kernel = prefill_kernel(x_type, bn, a.group_size, asym, code);
    const int smem = bn == 256 ? PrefillSmem<256>::SMEM : bn == 128 ? PrefillSmem<128>::SMEM : PrefillSmem<64>::SMEM;
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "%s: no kernel for bn=%d", what, bn);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, what);
    if (st != QG_OK) return st;
    qg_tensor_map map;
    st = launch_util::encode_x_map(a.x, a.m, a.k, a.ldx, a.x_dtype, bn, &map, "w4a16 prefill");
    if (st != QG_OK) return st;
    PrefillParams p{};
    p.qweight = reinterpret_cast<const uint32_t*>(a.qweight);
    p.scales = static_cast<const uint32_t*>(a.scales);
    p.qzeros = reinterpret_cast<const uint8_t*>(a.qzeros);
    p.y = a.y;
    p.ldy = a.ldy;
    p.m = static_cast<int>(a.m);
    p.n = static_cast<int>(a.n);
    p.k_tiles = static_cast<int>(geo.k_tiles);
    p.k_chunks = static_cast<int>(geo.k_chunks);
    p.row_blocks = static_cast<int>(geo.row_blocks);
    p.scale_type = elem_type(a.scale_dtype);
    p.y_type = elem_type(a.y_dtype);
    p.bias = launch_util::bias_of(a);
    const dim3 grid(static_cast<unsigned>(ceil_div(a.m, bn)), static_cast<unsigned>(row_tiles));
    if (log_enabled())
        log_once("%s m=%lld n=%lld k=%lld g=%d %s: tile 128 rows x %d tokens, grid %u x %u, smem %d", what,
                 static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k), a.group_size,
                 code == CODE_E2M1 ? "e2m1" : asym ? "asym" : "sym", bn, grid.x, grid.y, smem);
    return launch_util::launch_with_map(kernel, grid, PF_THREADS, smem, static_cast<hipStream_t>(stream), map, p,
                                        what);
#else
    (void)ctx, (void)a, (void)code, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: prefill_wgmma without tensor maps");
#endif
}

const Tier<Args> gpu_w4a16_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable, nullptr,
                                           prefill_launch};

}  // namespace qg
