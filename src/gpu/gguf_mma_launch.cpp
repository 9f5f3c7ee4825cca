// Launcher of the GGUF GEMM decode tier on the integer tensor cores (device code:
// hip/gguf_mma.hip): gguf_tier 2, the GGUF table's entry gpu_gguf_int8_tier
// (src/tier_table.h; the choice between it and the float tier: src/gguf_tiers.cpp).
// Each chunk of up to 8 rows of x is two launches on the caller's stream: the x prep
// (int8 quantization per 32 elements into the workspace), then the GEMM.
#include <stddef.h>
#include <stdint.h>

#include <atomic>

#if !defined(QG_HAVE_GPU)
#define QG_HAVE_GPU 1
#endif
#include "tier_table.h"
#include "tiers.h"
#include "gguf_kernels.h"
#include "formats/gguf_formats.h"
#include "launch_util.h"

namespace qg {
namespace {

using gguf_mma::kCols;
using launch_util::align16;
using launch_util::ceil_div;
using launch_util::dtype_bytes;
using gguf_mma::kThreads;
using gguf_mma::kWarps;

// Workspace: a fixed counter region first (the same place for every shape, so one zeroed
// buffer serves every call), then the prepared x, then the K split's partial sums.
//   [0, kMaxSplitTiles)                 arrival counters of split row tiles
//   [kMaxSplitTiles, + kMaxSplit)       finished blocks per split (prepared-x zeroing)
constexpr int kMaxSplitTiles = 4096;   // row tiles a K split is allowed for (N <= 262144)
constexpr int kMaxSplit = 64;
constexpr size_t kCounterBytes = (size_t)(kMaxSplitTiles + kMaxSplit) * 4;


struct Plan {
    int mp;             // rows of x per launch rounded up: 2, 4 or 8 (Slice<MP>)
    int tiles;          // gridDim.x: 64-row tiles
    int split;          // gridDim.y: K splits
    bool forced;        // split from ctx->split_k
    int blocks_per_sm;  // occupancy estimate (shared memory)
    size_t smem;        // dynamic shared memory per block
    size_t xp_bytes;    // prepared x of one launch
    size_t part_bytes;  // partial sums [split][mp][N] fp32 (split > 1)
};

int mp_for(int64_t m) { return m <= 2 ? 2 : m <= 4 ? 4 : 8; }

// K split: enough blocks for about 4 rounds of the resident slots (the hardware hands a
// finished block's slot to the next: short blocks keep the tail short), as long as every
// block keeps two steps (WC blocks) of K; never more than kMaxSplit.
template <int FMT>
Plan make_plan(const qg_context* ctx, const qg_gguf_gemm_args* a)
{
    typedef gguf_mma::Shape<FMT> S;
    Plan pl = {};
    const int64_t nb = a->k / S::B::BE;
    pl.mp = mp_for(a->m < kCols ? a->m : kCols);
    pl.smem = (size_t)S::smem_bytes(pl.mp);
    pl.tiles = (int)ceil_div(a->n, S::ROWS);
    int bps = gpu_smem_per_sm(ctx) / (int)(pl.smem + S::B::kGridWords * 4 + 1024 + 16);
    pl.blocks_per_sm = bps < 1 ? 1 : bps > 16 ? 16 : bps;
    int64_t split = 1;
    if (ctx->split_k > 0) {
        split = ctx->split_k;
    } else {
        const int64_t slots = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1) * pl.blocks_per_sm;
        split = ceil_div(4 * slots, pl.tiles);
        const int64_t by_steps = nb / (2 * S::B::WC);
        if (split > by_steps) split = by_steps;
    }
    if (split > nb) split = nb;
    if (split > kMaxSplit) split = kMaxSplit;
    if (pl.tiles > kMaxSplitTiles || split < 1) split = 1;
    pl.split = (int)split;
    pl.forced = ctx->split_k > 0 && split == ctx->split_k;   // not when a forced split was clamped
    pl.xp_bytes = (size_t)(a->k / 32) * 48 * pl.mp;
    pl.part_bytes = pl.split > 1 ? (size_t)pl.split * pl.mp * (size_t)a->n * 4 : 0;
    return pl;
}

template <int FMT>
size_t workspace_of(const qg_context* ctx, const qg_gguf_gemm_args* a)
{
    // the largest of the launches: full 8-row chunks and the remainder
    size_t bytes = 0;
    const int64_t rows[2] = {a->m < kCols ? a->m : kCols, a->m > kCols ? a->m % kCols : 0};
    for (int64_t r : rows) {
        if (r == 0) continue;
        qg_gguf_gemm_args chunk = *a;
        chunk.m = r;
        const Plan pl = make_plan<FMT>(ctx, &chunk);
        const size_t b = kCounterBytes + align16(pl.xp_bytes) + pl.part_bytes;
        bytes = b > bytes ? b : bytes;
    }
    return bytes;
}

// Raises a kernel's dynamic shared-memory limit to its plan's bytes, once per device.
template <int FMT, int MP>
qg_status ensure_smem_limit(const qg_context* ctx, size_t bytes)
{
    static std::atomic<uint64_t> done_mask{0};
    return launch_util::raise_smem_limit(ctx, gguf_mma::mma_kernel(FMT, MP), (int)bytes, done_mask,
                                    "gguf decode_mma");
}

template <int FMT, int MP>
qg_status launch_gemm(const qg_context* ctx, const Plan& pl, hipStream_t stream, const gguf_mma::MmaParams& p)
{
    // every kernel raises its limit once: with the static shared memory even 48 KB of
    // dynamic passes the default
    const qg_status st = ensure_smem_limit<FMT, MP>(ctx, pl.smem);
    if (st != QG_OK) return st;
    const dim3 grid((unsigned)pl.tiles, (unsigned)pl.split, 1);
    return launch_util::launch(gguf_mma::mma_kernel(FMT, MP), grid, kThreads, pl.smem, stream, p, "gguf decode_mma");
}


template <int FMT>
qg_status launch(const qg_context* ctx, const qg_gguf_gemm_args* a, hipStream_t stream)
{
    typedef gguf_mma::Shape<FMT> S;
    uint8_t* ws = static_cast<uint8_t*>(a->workspace);
    const int nslices = (int)(a->k / 32);
    const int64_t chunks = ceil_div(a->m, kCols);
    // Every kernel this call launches gets its shared-memory limit first: a failure then
    // returns before the first prep has written the workspace (the call leaves it zeroed).
    for (int64_t c = 0; c < chunks; c += chunks > 1 ? chunks - 1 : 1) {
        qg_gguf_gemm_args chunk = *a;
        chunk.m = a->m - c * kCols < kCols ? a->m - c * kCols : kCols;
        const Plan pl = make_plan<FMT>(ctx, &chunk);
        const qg_status st = pl.mp == 2   ? ensure_smem_limit<FMT, 2>(ctx, pl.smem)
                             : pl.mp == 4 ? ensure_smem_limit<FMT, 4>(ctx, pl.smem)
                                          : ensure_smem_limit<FMT, 8>(ctx, pl.smem);
        if (st != QG_OK) return st;
    }
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t m0 = c * kCols;
        const int m_valid = (int)(a->m - m0 < kCols ? a->m - m0 : kCols);
        qg_gguf_gemm_args chunk = *a;
        chunk.m = m_valid;
        const Plan pl = make_plan<FMT>(ctx, &chunk);
        if (c == 0 && log_enabled()) {
            log_once("gguf %s m=%lld n=%lld k=%lld x=%s y=%s: decode_mma (int8 x per 32, mma.sync) mp=%d "
                     "tiles=%d split_k=%d%s blocks/SM~%d smem=%zu%s",
                     gguf_registry_name(a->format), (long long)a->m, (long long)a->n, (long long)a->k,
                     dtype_short_name(a->x_dtype), dtype_short_name(a->y_dtype), pl.mp, pl.tiles, pl.split,
                     pl.forced ? " (forced)" : "", pl.blocks_per_sm, pl.smem,
                     chunks > 1 ? "; m > 8: one launch pair per 8 rows" : "");
        }

        gguf_mma::PrepParams pp;
        pp.x = static_cast<const char*>(a->x) + m0 * a->ldx * dtype_bytes(a->x_dtype);
        pp.ldx = a->ldx;
        pp.xp = ws + kCounterBytes;
        pp.nslices = nslices;
        pp.m_valid = m_valid;
        pp.mp = pl.mp;
        pp.x_dtype = (int)a->x_dtype;
        pp.bias = S::B::kBias;
        pp.unit16 = S::B::kUnit16;
        qg_status st = launch_util::launch(reinterpret_cast<const void*>(&gguf_mma::gguf_mma_prep_kernel),
                                           dim3((unsigned)ceil_div(nslices, kWarps)), kThreads, 0, stream, pp,
                                           "gguf decode_mma x prep");
        if (st != QG_OK) return st;

        gguf_mma::MmaParams p;
        p.w = static_cast<const uint8_t*>(a->w);
        p.ldw = a->ldw;
        p.xp = pp.xp;
        p.y = static_cast<char*>(a->y) + m0 * a->ldy * dtype_bytes(a->y_dtype);
        p.ldy = a->ldy;
        p.partial = pl.part_bytes > 0 ? reinterpret_cast<float*>(ws + kCounterBytes + align16(pl.xp_bytes)) : nullptr;
        p.tile_count = reinterpret_cast<uint32_t*>(ws);
        p.split_count = reinterpret_cast<uint32_t*>(ws) + kMaxSplitTiles;
        p.n = (int)a->n;
        p.nb = (int)(a->k / S::B::BE);
        p.m_valid = m_valid;
        p.y_dtype = (int)a->y_dtype;
        p.bias = launch_util::bias_of(*a);
        p.split_k = pl.split;
        st = pl.mp == 2   ? launch_gemm<FMT, 2>(ctx, pl, stream, p)
             : pl.mp == 4 ? launch_gemm<FMT, 4>(ctx, pl, stream, p)
                          : launch_gemm<FMT, 8>(ctx, pl, stream, p);
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

bool int8_usable(const qg_context* ctx, const qg_gguf_gemm_args& a, const char** why)
{
    if (!gpu_context_only(ctx, why) || !gguf_blocks_only(a, why)) return false;
    if (!kGpuIsCuda) {
        *why = "the int8 mma tier exists for NVIDIA GPUs only (mma.sync)";
        return false;
    }
    if (ctx->cc_major < 8) {
        *why = "the int8 mma.sync tier needs an sm_80 or newer GPU";
        return false;
    }
    if (a.n > INT32_MAX || a.k > INT32_MAX) {
        *why = "the gguf GPU tiers index rows and blocks with 32-bit ints (n, k <= 2^31 - 1)";
        return false;
    }
    if ((((uintptr_t)a.w) | (uint64_t)a.ldw) & 15) {
        *why = "the int8 mma tier reads rows with 16-byte copies: w and ldw must be multiples of 16 "
               "(GGUFWeight.to_device pads rows so)";
        return false;
    }
    return true;
}

size_t int8_workspace(const qg_context* ctx, const qg_gguf_gemm_args& a)
{
    return with_gguf_format(
        a.format, [&](auto fmt) { return workspace_of<decltype(fmt)::value>(ctx, &a); }, [] { return (size_t)0; });
}

qg_status int8_launch(const qg_context* ctx, const qg_gguf_gemm_args& a, qg_stream stream)
{
    return with_gguf_format(
        a.format, [&](auto fmt) { return launch<decltype(fmt)::value>(ctx, &a, (hipStream_t)stream); },
        [&] { return set_error(QG_ERR_INVALID_ARGUMENT, "format=%d is not a GGUF format", (int)a.format); });
}

}  // namespace

const Tier<qg_gguf_gemm_args> gpu_gguf_int8_tier = {QG_GPU_RUNTIME_NAME ":int8_mma", 2, int8_usable, int8_workspace,
                                                    int8_launch};

}  // namespace qg
