// W4A16 GPU launcher: picks the tier and the split, launches hip/w4a16.hip kernels.
// Compiled as CUDA (nvcc) or HIP; arguments were validated by src/api.cpp already.
#include <algorithm>
#include <stdint.h>

#include "tiers.h"
#include "w4a16.hip"

namespace qg {
namespace {

using w4a16::Params;

int elem_type(qg_dtype d) {
    return d == QG_DTYPE_BF16 ? w4a16::ELEM_BF16 : d == QG_DTYPE_F32 ? w4a16::ELEM_F32 : w4a16::ELEM_F16;
}
size_t elem_bytes(qg_dtype d) { return d == QG_DTYPE_F32 ? 4 : 2; }

constexpr int kMaxDecodeM = 16;   // rows of x per decode launch: two n8 mma tiles
constexpr size_t kCounterBytes = 256;

enum Tier { TIER_SIMT = 1, TIER_MMA = 2 };

struct Plan {
    int tier = TIER_SIMT;
    int row_blocks = 0;    // blockIdx.x extent of the mma tier
    int split_k = 1;       // blockIdx.y extent
    int sc_per_split = 0;  // superchunks of 512 k per split
};

bool mma_available(const qg_context* ctx) {
#if defined(QG_GPU_CUDA)
    return ctx->cc_major >= 8;  // mma.sync m16n8k16 f16/bf16: sm_80+
#else
    (void)ctx;
    return false;
#endif
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// mma tier reads x and qweight with 16-byte loads
bool mma_layout_ok(const qg_w4a16_gemm_args* a) {
    return aligned16(a->x) && a->ldx % 8 == 0 && aligned16(a->qweight);
}

qg_status make_plan(const qg_context* ctx, const qg_w4a16_gemm_args* a, Plan* plan) {
    const int64_t forced = ctx->w4a16_tier;
    if (forced == 3)
        return set_error(QG_ERR_UNSUPPORTED, "w4a16_tier=3 (prefill) is not built yet; use 0, 1 or 2");
    if (forced == 2 && !mma_available(ctx))
        return set_error(QG_ERR_UNSUPPORTED,
                         "w4a16_tier=2 needs mma.sync (NVIDIA compute capability 8.0+); this device is %d.%d",
                         ctx->cc_major, ctx->cc_minor);
    if (forced == 2 && !mma_layout_ok(a))
        return set_error(QG_ERR_INVALID_ARGUMENT,
                         "w4a16_tier=2 needs x and qweight 16-byte aligned and ldx=%lld a multiple of 8",
                         static_cast<long long>(a->ldx));
    const bool use_mma = forced == 2 || (forced == 0 && mma_available(ctx) && mma_layout_ok(a));
    plan->tier = use_mma ? TIER_MMA : TIER_SIMT;
    if (!use_mma) return QG_OK;

    plan->row_blocks = static_cast<int>((a->n + w4a16::ROWS_PER_BLOCK - 1) / w4a16::ROWS_PER_BLOCK);
    const int total_sc = static_cast<int>((a->k + w4a16::SC_K - 1) / w4a16::SC_K);
    // 4 resident blocks of 4 warps per SM keep enough 16-byte loads in flight to cover
    // HBM latency; split K only when the row blocks alone cannot fill the machine.
    const int blocks_to_fill = 4 * std::max(ctx->sm_count, 1);
    int split = static_cast<int>((blocks_to_fill + plan->row_blocks - 1) / plan->row_blocks);
    if (ctx->split_k > 0) split = static_cast<int>(ctx->split_k);
    split = std::max(1, std::min(split, total_sc));
    plan->sc_per_split = (total_sc + split - 1) / split;
    plan->split_k = (total_sc + plan->sc_per_split - 1) / plan->sc_per_split;
    return QG_OK;
}

size_t workspace_for(const Plan& plan, int64_t n) {
    if (plan.tier != TIER_MMA || plan.split_k == 1) return 0;
    const size_t counters = (static_cast<size_t>(plan.row_blocks) * sizeof(unsigned) + kCounterBytes - 1) /
                            kCounterBytes * kCounterBytes;
    return counters + static_cast<size_t>(plan.split_k) * kMaxDecodeM * static_cast<size_t>(n) * sizeof(float);
}

template <int XT, int MT, bool TRANS>
void launch_mma(const Plan& plan, const Params& p, hipStream_t stream) {
    dim3 grid(plan.row_blocks, plan.split_k);
    w4a16::decode_mma<XT, MT, TRANS><<<grid, w4a16::MMA_THREADS, 0, stream>>>(p);
}

void dispatch_mma(const Plan& plan, const Params& p, int x_type, hipStream_t stream) {
    const bool trans = p.group_size < 128;  // one mma must not mix groups (see w4a16.hip)
    const int mt = p.m > 8 ? 2 : 1;
#define QG_W4A16_CASE(XT, MT, TR) \
    if (x_type == XT && mt == MT && trans == TR) return launch_mma<XT, MT, TR>(plan, p, stream);
    QG_W4A16_CASE(w4a16::ELEM_F16, 1, false)
    QG_W4A16_CASE(w4a16::ELEM_F16, 1, true)
    QG_W4A16_CASE(w4a16::ELEM_F16, 2, false)
    QG_W4A16_CASE(w4a16::ELEM_F16, 2, true)
    QG_W4A16_CASE(w4a16::ELEM_BF16, 1, false)
    QG_W4A16_CASE(w4a16::ELEM_BF16, 1, true)
    QG_W4A16_CASE(w4a16::ELEM_BF16, 2, false)
    QG_W4A16_CASE(w4a16::ELEM_BF16, 2, true)
#undef QG_W4A16_CASE
}

}  // namespace

size_t gpu_w4a16_gemm_workspace(const qg_context* ctx, const qg_w4a16_gemm_args* a) {
    Plan plan;
    if (make_plan(ctx, a, &plan) != QG_OK) return 0;
    return workspace_for(plan, a->n);
}

qg_status gpu_w4a16_gemm(const qg_context* ctx, const qg_w4a16_gemm_args* a, qg_stream stream) {
    Plan plan;
    qg_status st = make_plan(ctx, a, &plan);
    if (st != QG_OK) return st;
    const size_t need = workspace_for(plan, a->n);
    if (need > 0 && (a->workspace == nullptr || a->workspace_bytes < need))
        return set_error(QG_ERR_INVALID_ARGUMENT,
                         "workspace_bytes=%zu < %zu needed (qg_w4a16_gemm_workspace_size) for split_k=%d",
                         a->workspace == nullptr ? size_t(0) : a->workspace_bytes, need, plan.split_k);
    if (log_enabled())
        log_once("w4a16 m=%lld n=%lld k=%lld g=%d %s: %s split_k=%d", static_cast<long long>(a->m),
                 static_cast<long long>(a->n), static_cast<long long>(a->k), a->group_size,
                 a->qzeros ? "asym" : "sym", plan.tier == TIER_MMA ? "decode_mma" : "decode_simt",
                 plan.split_k);

    Params p{};
    p.qweight = a->qweight;
    p.scales = static_cast<const uint16_t*>(a->scales);
    p.qzeros = a->qzeros;
    p.n = static_cast<int>(a->n);
    p.k = static_cast<int>(a->k);
    p.ldx = a->ldx;
    p.ldy = a->ldy;
    p.group_size = a->group_size;
    p.scale_type = elem_type(a->scale_dtype);
    p.y_type = elem_type(a->y_dtype);
    p.sc_per_split = plan.sc_per_split;
    if (need > 0) {
        const size_t counters = need - static_cast<size_t>(plan.split_k) * kMaxDecodeM * a->n * sizeof(float);
        p.counters = static_cast<unsigned*>(a->workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(a->workspace) + counters);
    }
    const int x_type = elem_type(a->x_dtype);
    hipStream_t s = static_cast<hipStream_t>(stream);
    // M > 16: one decode launch per 16 rows of x (correct for every M; the prefill tier
    // on the matrix units replaces this for large M).
    for (int64_t m0 = 0; m0 < a->m; m0 += kMaxDecodeM) {
        p.m = static_cast<int>(std::min<int64_t>(kMaxDecodeM, a->m - m0));
        p.x = static_cast<const uint16_t*>(a->x) + m0 * a->ldx;
        p.y = static_cast<char*>(a->y) + m0 * a->ldy * elem_bytes(a->y_dtype);
        if (plan.tier == TIER_MMA) {
            dispatch_mma(plan, p, x_type, s);
        } else {
            const int warps = w4a16::SIMT_THREADS / QG_WARP_SIZE;
            const int blocks = static_cast<int>((a->n + warps - 1) / warps);
            w4a16::decode_simt<kMaxDecodeM><<<blocks, w4a16::SIMT_THREADS, 0, s>>>(p, x_type);
        }
        st = gpu_check_launch(plan.tier == TIER_MMA ? "w4a16 decode_mma" : "w4a16 decode_simt");
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

}  // namespace qg
