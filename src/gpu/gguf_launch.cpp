// Launcher of the GGUF GEMM float decode tier (gguf_tier 1, device code: hip/gguf.hip):
// the GGUF table's entry gpu_gguf_float_tier (src/tier_table.h; the choice between it and
// the int8 tier of src/gpu/gguf_mma_launch.cpp: src/gguf_tiers.cpp).
//
// api.cpp has already checked every argument the ABI defines (pointers and their element
// alignment, format, shapes, K % block_elems, ldw >= row bytes and even, dtypes, m > 0,
// the workspace against this tier's need); this file picks a configuration and launches
// on the caller's stream.
//
// M > 4 is served by one decode launch per chunk of 4 rows of x (a chunk of 3 runs the
// 4-row kernel with the 4th row masked): correct, not fast; the prefill tier and a
// matrix-unit decode path will take those shapes over.
#include <stddef.h>
#include <stdint.h>

#include <atomic>

// This file is the GPU tier: compiled only in GPU builds, where CMake defines
// QG_HAVE_GPU; defined here too so that the file also compiles on its own.
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

using gguf::DecodeParams;
using gguf::FormatFacts;
using gguf::Tune;
using gguf::kThreads;
using gguf::kMaxMTile;
using launch_util::align16;
using launch_util::ceil_div;
using launch_util::dtype_bytes;

// ------------------------------------------------------------------ tuning table
// Speed only: results never depend on these (tests force split_k through
// qg_context_set_option("split_k", ...) to exercise every path).

// Bytes of fp32 x (plus Q4_K's sums) staged per thread block. MT <= 2: a whole
// 6144-element k-range per block (K = 5376 needs no split); with the double-buffered
// row buffers that is 60-80 KB per block: 3 (2 for Q6_K) blocks of 8 warps per H200 SM.
constexpr int kXStageBytesSmall = 24 * 1024;   // MT <= 2
constexpr int kXStageBytesLarge = 40 * 1024;   // MT >= 3 (one row per warp: smaller buffers)
constexpr int kMaxAutoSplitK = 16;
constexpr int kMaxGridY = 65535;
// Shared memory the runtime reserves per block on NVIDIA sm_80+ (occupancy estimate).
constexpr int kSmemReservedPerBlock = 1024;

// Widest global load (16, 8, 4, 2, 1 bytes) that every row start w + n * ldw allows.
int load_bytes_for(const void* w, int64_t ldw)
{
    const uint64_t bits = (uint64_t)(uintptr_t)w | (uint64_t)ldw;
    int l = 16;
    while (l > 1 && (bits & (uint64_t)(l - 1)) != 0) l /= 2;
    return l;
}

// One launch's configuration (one chunk of at most kMaxMTile rows of x).
struct Plan {
    int mt;            // rows of x of this launch
    int rows_per_warp; // R
    int tiles;         // gridDim.x: row tiles
    int split_k;       // gridDim.y: K splits
    bool split_forced; // split_k came from ctx->split_k
    int kxb;           // blocks of K per staged x chunk
    int x_chunks;      // x chunks per split (1 unless x does not fit shared memory)
    int load_bytes;
    bool async;        // cp.async double-buffered kernel (NVIDIA sm_80+, load_bytes >= 4, one x chunk)
    int blocks_per_sm; // occupancy estimate behind `tiles`
    size_t dyn_smem;   // dynamic shared memory bytes
    size_t ws_bytes;   // workspace bytes (split_k > 1): counter region, then partial[split_k][mt][N]
};

// The split-K workspace starts with one arrival counter per possible row tile of this
// context (tiles <= resident blocks <= SMs x the largest launch-bounds floor), at a
// fixed place for every shape: a workspace reused sequentially for other shapes (an
// engine's one scratch buffer for every layer) never has partial sums where another
// call's counters live. Every call leaves its counters at zero.
constexpr int kMaxBlocksPerSm = 3;   // >= every Tune<MT>::kMinBlocks
size_t counter_region_bytes(const qg_context* ctx)
{
    const size_t slots = (size_t)(ctx->sm_count > 0 ? ctx->sm_count : 1) * kMaxBlocksPerSm;
    return align16(slots * 4);
}

using gguf::kAsyncBuild;  // the cp.async kernel: CUDA builds (sm_80+ devices) only

bool async_capable(const qg_context* ctx) { return kAsyncBuild && ctx->cc_major >= 8; }

template <int FMT, int MT>
int static_smem(bool async)
{
    return async ? gguf::static_smem_bytes<FMT, MT, true>(32) : gguf::static_smem_bytes<FMT, MT, false>(32);
}

// The configuration of one launch. load_bytes is the widest load the rows allow
// (load_bytes_for); the workspace query passes both extremes so that its answer does not
// depend on the weight pointer.
template <int FMT, int MT>
Plan make_plan(const qg_context* ctx, const qg_gguf_gemm_args* a, int load_bytes)
{
    typedef FormatFacts<FMT> F;
    Plan pl = {};
    pl.mt = MT;
    pl.rows_per_warp = Tune<MT>::kRows;
    const int64_t n = a->n, nb = a->k / F::BE;
    const int warps = kThreads / 32;   // host view (NVIDIA / RDNA); CDNA has half as many, wider

    // staged x: blocks of K per chunk
    const int x_budget = MT <= 2 ? kXStageBytesSmall : kXStageBytesLarge;
    const int per_block = gguf::dynamic_smem_bytes<FMT, MT>(F::BE);
    const int kxb_cap = x_budget / per_block > 0 ? x_budget / per_block : 1;

    // The kernel variant: cp.async needs 4-byte aligned rows and x staged once per split
    // (the auto split below guarantees the latter; a forced split may not).
    pl.load_bytes = load_bytes;
    const bool async_ok = async_capable(ctx) && pl.load_bytes >= 4;

    // resident blocks per SM: the launch-bounds floor, or fewer if shared memory says so
    const int smem_block = static_smem<FMT, MT>(async_ok) + x_budget + kSmemReservedPerBlock;
    static_assert(Tune<MT>::kMinBlocks <= kMaxBlocksPerSm, "counter region covers every tile");
    int bps = gpu_smem_per_sm(ctx) / smem_block;
    bps = bps < 1 ? 1 : bps > Tune<MT>::kMinBlocks ? Tune<MT>::kMinBlocks : bps;
    pl.blocks_per_sm = bps;
    const int64_t slots = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1) * bps;

    // Split K and row tiles. All blocks are resident at once (tiles * split_k <= slots),
    // so the time is that of the busiest warp: ceil(groups of its tile / warps) groups,
    // each of ceil(nb / split) blocks = ceil(that / WC) steps. A step costs a round of
    // jobs whether or not it is full (idle lanes still take issue slots) and its bytes,
    // so the auto split minimizes the busiest warp's steps, then its blocks, then the
    // split itself, with every split's x fitting the staging buffer.
    const int64_t wc = gguf::step_blocks<FMT>(32);
    const int64_t groups = ceil_div(n, pl.rows_per_warp);
    auto tiles_for = [&](int64_t split) {
        int64_t t = slots / split;
        if (t > groups) t = groups;
        return t < 1 ? (int64_t)1 : t;
    };
    auto busiest_warp = [&](int64_t split, int64_t* blocks) {
        const int64_t g = ceil_div(ceil_div(ceil_div(n, tiles_for(split)), pl.rows_per_warp), warps);
        *blocks = g * ceil_div(nb, split);
        return g * ceil_div(ceil_div(nb, split), wc);
    };
    int64_t split;
    if (ctx->split_k > 0) {
        split = ctx->split_k;
        pl.split_forced = true;
    } else {
        const int64_t min_split = ceil_div(nb, kxb_cap);   // x of a split must fit: no re-staging
        const int64_t max_split = nb < kMaxAutoSplitK ? nb : kMaxAutoSplitK;
        split = min_split < max_split ? min_split : max_split;
        int64_t best_blocks = 0, best_steps = busiest_warp(split, &best_blocks);
        for (int64_t s = split + 1; s <= max_split; ++s) {
            int64_t blocks = 0;
            const int64_t steps = busiest_warp(s, &blocks);
            if (steps < best_steps || (steps == best_steps && blocks < best_blocks)) {
                best_steps = steps;
                best_blocks = blocks;
                split = s;
            }
        }
    }
    if (split > nb) split = nb;               // every split keeps at least one block
    if (split > kMaxGridY) split = kMaxGridY;
    if (split < 1) split = 1;
    pl.split_k = (int)split;

    const int64_t split_blocks = ceil_div(nb, split);
    pl.kxb = (int)(split_blocks < kxb_cap ? split_blocks : kxb_cap);
    pl.x_chunks = (int)ceil_div(split_blocks, pl.kxb);
    pl.tiles = (int)tiles_for(split);

    pl.async = async_ok && pl.x_chunks == 1;
    pl.dyn_smem = (size_t)gguf::dynamic_smem_bytes<FMT, MT>(pl.kxb * F::BE);
    pl.ws_bytes = pl.split_k > 1 ? counter_region_bytes(ctx) + (size_t)pl.split_k * MT * (size_t)n * 4 : 0;
    return pl;
}

// Raises the kernel's dynamic shared-memory limit once per device when static +
// dynamic bytes pass the 48 KB default.
template <int FMT, int MT, bool ASYNC>
qg_status ensure_smem_limit(const qg_context* ctx)
{
    static std::atomic<uint64_t> done_mask{0};
    const int max_dyn = gguf::dynamic_smem_bytes<FMT, MT>(0) + (MT <= 2 ? kXStageBytesSmall : kXStageBytesLarge);
    return launch_util::raise_smem_limit(ctx, gguf::decode_kernel(FMT, MT, ASYNC), max_dyn, done_mask,
                                    "gguf decode");
}

// Chunks of x rows: full chunks of kMaxMTile, then the remainder.
struct Chunks {
    int64_t full;  // chunks of kMaxMTile rows
    int tail;      // rows of the last chunk, 0 if none
};
Chunks chunks_of(int64_t m)
{
    Chunks c;
    c.full = m / kMaxMTile;
    c.tail = (int)(m % kMaxMTile);
    return c;
}

// Raises the shared-memory limit if needed, then launches the chosen kernel variant.
template <int FMT, int MT>
qg_status launch_kernel(const qg_context* ctx, const Plan& pl, hipStream_t stream, const DecodeParams& p)
{
    const dim3 grid((unsigned)pl.tiles, (unsigned)pl.split_k, 1);
    const bool big = static_smem<FMT, MT>(pl.async) + (int)pl.dyn_smem > 48 * 1024;
    if constexpr (kAsyncBuild) {
        if (pl.async) {
            if (big) {
                const qg_status st = ensure_smem_limit<FMT, MT, true>(ctx);
                if (st != QG_OK) return st;
            }
            return launch_util::launch(gguf::decode_kernel(FMT, MT, true), grid, kThreads, pl.dyn_smem, stream, p,
                                       "gguf decode");
        }
    }
    if (big) {
        const qg_status st = ensure_smem_limit<FMT, MT, false>(ctx);
        if (st != QG_OK) return st;
    }
    return launch_util::launch(gguf::decode_kernel(FMT, MT, false), grid, kThreads, pl.dyn_smem, stream, p,
                               "gguf decode");
}

template <int FMT, int MT>
struct Variant {
    // Bytes for any weight pointer: the larger of the two kernel variants' needs.
    static size_t workspace(const qg_context* ctx, const qg_gguf_gemm_args* a)
    {
        const size_t fast = make_plan<FMT, MT>(ctx, a, 16).ws_bytes, slow = make_plan<FMT, MT>(ctx, a, 2).ws_bytes;
        return fast > slow ? fast : slow;
    }

    // Launches rows [m0, m0 + MT) of x.
    static qg_status launch(const qg_context* ctx, const qg_gguf_gemm_args* a, int64_t m0, hipStream_t stream,
                            int launches)
    {
        const Plan pl = make_plan<FMT, MT>(ctx, a, load_bytes_for(a->w, a->ldw));
        if (pl.ws_bytes > 0 && (a->workspace == nullptr || a->workspace_bytes < pl.ws_bytes)) {
            // api.cpp checked the workspace against this tier's need before any launch
            return set_error(QG_ERR_INTERNAL, "gguf decode plan needs %zu workspace bytes, more than the query's %zu",
                             pl.ws_bytes, a->workspace_bytes);
        }
        if (m0 == 0 && log_enabled()) {
            log_once("gguf %s m=%lld n=%lld k=%lld x=%s y=%s: decode mt=%d rows/warp=%d tiles=%d split_k=%d%s "
                     "x_chunks=%d load=%dB%s blocks/SM~%d smem=%zu+%d%s",
                     gguf_registry_name(a->format), (long long)a->m, (long long)a->n, (long long)a->k,
                     dtype_short_name(a->x_dtype), dtype_short_name(a->y_dtype), pl.mt, pl.rows_per_warp, pl.tiles,
                     pl.split_k, pl.split_forced ? " (forced)" : "", pl.x_chunks, pl.load_bytes, pl.async ? " cp.async" : "",
                     pl.blocks_per_sm, pl.dyn_smem, static_smem<FMT, MT>(pl.async),
                     launches > 1 ? "; m > 4: one decode launch per 4 rows (prefill tier not built yet)" : "");
        }

        DecodeParams p;
        p.w = static_cast<const uint8_t*>(a->w);
        p.ldw = a->ldw;
        p.x = static_cast<const char*>(a->x) + m0 * a->ldx * dtype_bytes(a->x_dtype);
        p.ldx = a->ldx;
        p.y = static_cast<char*>(a->y) + m0 * a->ldy * dtype_bytes(a->y_dtype);
        p.ldy = a->ldy;
        uint8_t* ws = static_cast<uint8_t*>(a->workspace);
        p.counters = pl.ws_bytes > 0 ? reinterpret_cast<uint32_t*>(ws) : nullptr;
        p.partial = pl.ws_bytes > 0 ? reinterpret_cast<float*>(ws + counter_region_bytes(ctx)) : nullptr;
        p.n = (int)a->n;
        p.nb = (int)(a->k / FormatFacts<FMT>::BE);
        p.m_valid = (int)(a->m - m0 < MT ? a->m - m0 : MT);
        p.x_dtype = (int)a->x_dtype;
        p.y_dtype = (int)a->y_dtype;
        p.bias = launch_util::bias_of(*a);
        p.load_bytes = pl.load_bytes;
        p.split_k = pl.split_k;
        p.kxb = pl.kxb;

        return launch_kernel<FMT, MT>(ctx, pl, stream, p);
    }
};

// Runtime (format, mt) -> Variant<FMT, MT>::op(args...): the format through the X-macro's
// switch (with_gguf_format), then the M-tile list: the one place where runtime values
// become template arguments.
#define QG_GGUF_MTILES(X) X(1) X(2) X(4)

template <int FMT, class Op>
auto dispatch_mt(int mt, Op& op) -> decltype(op.template run<FMT, 1>())
{
    // the smallest instantiated tile that holds mt rows (3 -> 4)
#define QG_MT_CASE(MT_) \
    if (mt <= MT_) return op.template run<FMT, MT_>();
    QG_GGUF_MTILES(QG_MT_CASE)
#undef QG_MT_CASE
    return op.template run<FMT, kMaxMTile>();   // unreachable: 1 <= mt <= kMaxMTile
}

template <class Op>
auto dispatch(qg_format format, int mt, Op& op) -> decltype(op.template run<QG_FORMAT_Q8_0, 1>())
{
    return with_gguf_format(
        format, [&](auto fmt) { return dispatch_mt<decltype(fmt)::value>(mt, op); }, [&] { return op.unknown(); });
}

struct WorkspaceOp {
    const qg_context* ctx;
    const qg_gguf_gemm_args* a;
    template <int FMT, int MT>
    size_t run() { return Variant<FMT, MT>::workspace(ctx, a); }
    size_t unknown() { return 0; }
};

struct LaunchOp {
    const qg_context* ctx;
    const qg_gguf_gemm_args* a;
    int64_t m0;
    hipStream_t stream;
    int launches;
    template <int FMT, int MT>
    qg_status run() { return Variant<FMT, MT>::launch(ctx, a, m0, stream, launches); }
    qg_status unknown()
    {
        return set_error(QG_ERR_INVALID_ARGUMENT, "format=%d is not a GGUF format", (int)a->format);
    }
};

// The float tier's workspace (gguf_tier 1).
size_t simt_workspace(const qg_context* ctx, const qg_gguf_gemm_args* a)
{
    WorkspaceOp op = {ctx, a};
    const Chunks c = chunks_of(a->m);
    size_t bytes = 0;
    if (c.full > 0) bytes = dispatch(a->format, kMaxMTile, op);
    if (c.tail > 0) {
        const size_t t = dispatch(a->format, c.tail, op);
        if (t > bytes) bytes = t;
    }
    return bytes;
}

}  // namespace

// ================================================================ the float tier (gguf_tier 1)
// gpu_gguf_int8_tier lives in src/gpu/gguf_mma_launch.cpp.

namespace {

bool float_usable(const qg_context* ctx, const qg_gguf_gemm_args& a, const char** why)
{
    if (!gpu_context_only(ctx, why) || !gguf_blocks_only(a, why)) return false;
    // 32-bit row and block indices
    if (a.n > INT32_MAX || a.k > INT32_MAX) {
        *why = "the gguf GPU tiers index rows and blocks with 32-bit ints (n, k <= 2^31 - 1)";
        return false;
    }
    return true;
}

size_t float_workspace(const qg_context* ctx, const qg_gguf_gemm_args& a) { return simt_workspace(ctx, &a); }

qg_status float_launch(const qg_context* ctx, const qg_gguf_gemm_args& a_, qg_stream stream)
{
    const qg_gguf_gemm_args* a = &a_;
    const Chunks c = chunks_of(a->m);
    const int launches = (int)(c.full + (c.tail > 0 ? 1 : 0));
    LaunchOp op = {ctx, a, 0, (hipStream_t)stream, launches};
    for (int64_t i = 0; i < c.full; ++i) {
        op.m0 = i * kMaxMTile;
        const qg_status st = dispatch(a->format, kMaxMTile, op);
        if (st != QG_OK) return st;
    }
    if (c.tail > 0) {
        op.m0 = c.full * kMaxMTile;
        return dispatch(a->format, c.tail, op);
    }
    return QG_OK;
}

}  // namespace

const Tier<qg_gguf_gemm_args> gpu_gguf_float_tier = {QG_GPU_RUNTIME_NAME ":float", 1, float_usable, float_workspace,
                                                     float_launch};

}  // namespace qg
