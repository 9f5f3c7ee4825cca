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
    int mt = 1;              // 8-row x tiles per launch (decode_mma)
    bool trans = false;      // quad transpose, G < 128 (decode_mma)
    int row_blocks = 0;      // ceil(N / 64)
    int blocks = 0;          // persistent blocks P (decode_mma, stream-K)
    int max_contributors = 1;
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

// mma tier copies x and qweight 16 bytes and scales 4 bytes (two groups) at a time
bool mma_layout_ok(const qg_w4a16_gemm_args* a) {
    return aligned16(a->x) && a->ldx % 8 == 0 && aligned16(a->qweight) &&
           (reinterpret_cast<uintptr_t>(a->scales) & 3u) == 0 && (a->k / a->group_size) % 2 == 0;
}

typedef void (*MmaKernel)(const Params);

// Every decode_mma instantiation: x type x tile width x group size, listed once.
#define QG_W4A16_MMA_KERNELS(X)                                          \
    X(w4a16::ELEM_F16, 1, 32) X(w4a16::ELEM_F16, 1, 64) X(w4a16::ELEM_F16, 1, 128)    \
    X(w4a16::ELEM_F16, 2, 32) X(w4a16::ELEM_F16, 2, 64) X(w4a16::ELEM_F16, 2, 128)    \
    X(w4a16::ELEM_BF16, 1, 32) X(w4a16::ELEM_BF16, 1, 64) X(w4a16::ELEM_BF16, 1, 128) \
    X(w4a16::ELEM_BF16, 2, 32) X(w4a16::ELEM_BF16, 2, 64) X(w4a16::ELEM_BF16, 2, 128)

MmaKernel mma_kernel(int x_type, int mt, int group_size) {
#define QG_W4A16_CASE(XT, MT, G) \
    if (x_type == XT && mt == MT && group_size == G) return w4a16::decode_mma<XT, MT, G>;
    QG_W4A16_MMA_KERNELS(QG_W4A16_CASE)
#undef QG_W4A16_CASE
    return nullptr;
}

int mt_of(MmaKernel kernel) {
#define QG_W4A16_MT(XT, MT, G) \
    if (kernel == w4a16::decode_mma<XT, MT, G>) return MT;
    QG_W4A16_MMA_KERNELS(QG_W4A16_MT)
#undef QG_W4A16_MT
    return 1;
}

// Resident blocks per SM of a kernel, asked once per kernel (the answer never changes);
// also lifts the kernel's dynamic shared-memory limit to its ring size (> 48 KB).
int resident_blocks(MmaKernel kernel) {
    static int cache[16] = {0};
    static MmaKernel keys[16] = {nullptr};
    for (int i = 0; i < 16; ++i) {
        if (keys[i] == kernel) return cache[i];
        if (keys[i] == nullptr) {
            const int smem = w4a16::mma_smem_bytes(mt_of(kernel));
            int blocks = 0;
            if (hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                    hipFuncAttributeMaxDynamicSharedMemorySize, smem) != hipSuccess ||
                hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, w4a16::MMA_THREADS, smem) !=
                    hipSuccess) {
                (void)hipGetLastError();
                blocks = 0;
            }
            cache[i] = blocks;
            keys[i] = kernel;
            return blocks;
        }
    }
    return 0;
}

int owner_of(int64_t u, int64_t units, int64_t blocks) {
    return static_cast<int>(((u + 1) * blocks - 1) / units);
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
        return set_error(QG_ERR_UNSUPPORTED,
                         "w4a16_tier=2 needs x and qweight 16-byte aligned, ldx=%lld a multiple of 8, scales "
                         "4-byte aligned and an even number of groups per row (k/group_size=%lld)",
                         static_cast<long long>(a->ldx), static_cast<long long>(a->k / a->group_size));
    const bool use_mma = forced == 2 || (forced == 0 && mma_available(ctx) && mma_layout_ok(a));
    plan->tier = use_mma ? TIER_MMA : TIER_SIMT;
    if (!use_mma) return QG_OK;

    plan->mt = std::min<int64_t>(a->m, kMaxDecodeM) > 8 ? 2 : 1;
    plan->trans = a->group_size < 128;  // one mma must not mix groups (see w4a16.hip)
    plan->row_blocks = static_cast<int>((a->n + w4a16::ROWS_PER_BLOCK - 1) / w4a16::ROWS_PER_BLOCK);
    const int64_t S = (a->k + w4a16::SC_K - 1) / w4a16::SC_K;
    const int64_t units = plan->row_blocks * S;
    // Stream-K: exactly as many blocks as can be resident, each with the same number of
    // (64 rows x 512 k) units, so no wave is left half empty; "split_k" forces about that
    // many blocks per row block instead (tests use it to reach every reduction path).
    const int x_type = a->x_dtype == QG_DTYPE_BF16 ? w4a16::ELEM_BF16 : w4a16::ELEM_F16;
    // both tile widths may run (the last 16-row chunk of a large M can be narrower)
    const int resident = std::min(resident_blocks(mma_kernel(x_type, plan->mt, a->group_size)),
                                  resident_blocks(mma_kernel(x_type, 1, a->group_size)));
    if (resident == 0)
        return set_error(QG_ERR_DEVICE, "decode_mma cannot be made resident (%d bytes of shared memory)",
                         w4a16::mma_smem_bytes(plan->mt));
    int64_t blocks = static_cast<int64_t>(std::max(ctx->sm_count, 1)) * resident;
    if (ctx->split_k > 0) blocks = plan->row_blocks * ctx->split_k;
    blocks = std::max<int64_t>(1, std::min(blocks, units));
    plan->blocks = static_cast<int>(blocks);
    int most = 1;
    for (int64_t r = 0; r < plan->row_blocks; ++r)
        most = std::max(most, owner_of(r * S + S - 1, units, blocks) - owner_of(r * S, units, blocks) + 1);
    plan->max_contributors = most;
    return QG_OK;
}

size_t counter_bytes(const Plan& plan) {
    return (static_cast<size_t>(plan.row_blocks) * sizeof(unsigned) + kCounterBytes - 1) / kCounterBytes *
           kCounterBytes;
}

size_t workspace_for(const Plan& plan) {
    if (plan.tier != TIER_MMA || plan.max_contributors == 1) return 0;
    return counter_bytes(plan) + static_cast<size_t>(plan.row_blocks) * plan.max_contributors * kMaxDecodeM *
                                     w4a16::ROWS_PER_BLOCK * sizeof(float);
}

}  // namespace

size_t gpu_w4a16_gemm_workspace(const qg_context* ctx, const qg_w4a16_gemm_args* a) {
    Plan plan;
    if (make_plan(ctx, a, &plan) != QG_OK) return 0;
    return workspace_for(plan);
}

qg_status gpu_w4a16_gemm(const qg_context* ctx, const qg_w4a16_gemm_args* a, qg_stream stream) {
    // kernels index rows and k with 32-bit ints (row offsets in 64 bits)
    if (a->n >= (int64_t(1) << 31) || a->k >= (int64_t(1) << 31))
        return set_error(QG_ERR_UNSUPPORTED, "n=%lld, k=%lld: the GPU W4A16 tiers need n and k below 2^31",
                         static_cast<long long>(a->n), static_cast<long long>(a->k));
    Plan plan;
    qg_status st = make_plan(ctx, a, &plan);
    if (st != QG_OK) return st;
    const size_t need = workspace_for(plan);
    if (need > 0 && (a->workspace == nullptr || a->workspace_bytes < need))
        return set_error(QG_ERR_INVALID_ARGUMENT,
                         "workspace_bytes=%zu < %zu needed (qg_w4a16_gemm_workspace_size)",
                         a->workspace == nullptr ? size_t(0) : a->workspace_bytes, need);
    if (log_enabled())
        log_once("w4a16 m=%lld n=%lld k=%lld g=%d %s: %s mt=%d trans=%d blocks=%d max_contributors=%d",
                 static_cast<long long>(a->m), static_cast<long long>(a->n), static_cast<long long>(a->k),
                 a->group_size, a->qzeros ? "asym" : "sym",
                 plan.tier == TIER_MMA ? "decode_mma" : "decode_simt", plan.mt, plan.trans ? 1 : 0,
                 plan.blocks, plan.max_contributors);

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
    p.row_blocks = plan.row_blocks;
    p.max_contributors = plan.max_contributors;
    if (need > 0) {
        p.counters = static_cast<unsigned*>(a->workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(a->workspace) + counter_bytes(plan));
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
            // the last chunk of a large M may need only one x tile
            const int mt = p.m > 8 ? 2 : 1;
            const int use_mt = std::min(mt, plan.mt);
            mma_kernel(x_type, use_mt, a->group_size)<<<plan.blocks, w4a16::MMA_THREADS,
                                                     w4a16::mma_smem_bytes(use_mt), s>>>(p);
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
