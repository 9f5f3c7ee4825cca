// GGUF prefill tier (hip/gguf_prefill.hip): gguf_tier 3, the GGUF table's entry
// gpu_gguf_prefill_tier (the choice between it and the decode tiers: src/gguf_tiers.cpp).
// NVIDIA sm_90a only (wgmma, TMA), bf16 x; one launch, no workspace.
#include <stdint.h>

#include "formats/gguf_formats.h"
#include "gguf_kernels.h"
#include "launch_util.h"
#include "tier_table.h"
#include "wgmma_gate.h"

namespace qg {
namespace {

using namespace gguf_prefill;
using launch_util::ceil_div;
typedef qg_gguf_gemm_args Args;

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!wgmma_tier_usable(ctx, a.x, a.ldx, why) || !gguf_blocks_only(a, why)) return false;
    if (a.x_dtype != QG_DTYPE_BF16) {
        *why = "runs bf16 x only (the weights become bf16 tiles; fp16 and fp32 x stay on the decode tiers)";
        return false;
    }
    if ((reinterpret_cast<uintptr_t>(a.w) & 1u) != 0 || a.ldw % 2 != 0) {
        *why = "reads the blocks as 2-byte aligned words: w and ldw must be even";
        return false;
    }
    if (a.n >= (int64_t(1) << 31) || a.k >= (int64_t(1) << 31) || a.m >= (int64_t(1) << 31) ||
        a.ldx >= (int64_t(1) << 38) || ceil_div(a.n, kRows) > 65535) {
        *why = "m, n, k must be below 2^31, n below 2^23 (row tiles in gridDim.y) and ldx below 2^38";
        return false;
    }
    return true;
}

// Token tile: 256 above 128 rows of x (half the dequantization per FLOP; bench/NOTES.md,
// GGUF prefill p3), 128 below, where a 256-token tile would be mostly empty.
int token_tile(int64_t m) { return m > 128 ? 256 : 128; }

qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const int bn = token_tile(a.m);
    const void* kernel = prefill_kernel(static_cast<int>(a.format), bn);
    const int smem = with_gguf_format(
        a.format,
        [&](auto fmt) {
            constexpr int F = decltype(fmt)::value;
            return bn == 256 ? prefill_smem_bytes<F, 256>() : prefill_smem_bytes<F, 128>();
        },
        [] { return 0; });
    if (kernel == nullptr || smem == 0)
        return set_error(QG_ERR_INTERNAL, "gguf prefill_wgmma: no kernel for format=%d", static_cast<int>(a.format));
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, "gguf prefill_wgmma");
    if (st != QG_OK) return st;
    qg_tensor_map map;
    st = launch_util::encode_x_map(a.x, a.m, a.k, a.ldx, a.x_dtype, bn, &map, "gguf prefill");
    if (st != QG_OK) return st;
    const GgufFormat& f = *gguf_format(a.format);  // a GGUF format: api.cpp checked it
    PrefillParams p{};
    p.w = static_cast<const uint8_t*>(a.w);
    p.ldw = a.ldw;
    p.row_bytes = a.k / f.elems * f.bytes;
    p.w_end = p.w + (a.n - 1) * a.ldw + p.row_bytes;
    p.y = a.y;
    p.ldy = a.ldy;
    p.m = static_cast<int>(a.m);
    p.n = static_cast<int>(a.n);
    p.k = static_cast<int>(a.k);
    p.k_steps = static_cast<int>(ceil_div(a.k, 64));
    p.chunks = static_cast<int>(ceil_div(a.k, kChunk));
    p.y_type = launch_util::elem_type(a.y_dtype);
    p.bias = launch_util::bias_of(a);
    const dim3 grid(static_cast<unsigned>(ceil_div(a.m, bn)), static_cast<unsigned>(ceil_div(a.n, kRows)));
    if (log_enabled())
        log_once("gguf %s m=%lld n=%lld k=%lld: prefill_wgmma (bf16 tiles, wgmma) tile 128 rows x %d tokens, "
                 "grid %u x %u, smem %d",
                 gguf_registry_name(a.format), static_cast<long long>(a.m), static_cast<long long>(a.n),
                 static_cast<long long>(a.k), bn, grid.x, grid.y, smem);
    return launch_util::launch_with_map(kernel, grid, kThreads, smem, static_cast<hipStream_t>(stream), map, p,
                                        "gguf prefill_wgmma");
#else
    (void)ctx, (void)a, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: gguf prefill_wgmma without tensor maps");
#endif
}

}  // namespace

const Tier<Args> gpu_gguf_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable, nullptr,
                                          prefill_launch};

}  // namespace qg
