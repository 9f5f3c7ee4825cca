// W4A16 prefill tier (hip/w4a16_prefill.hip): its table entry, the tensor map of x and the
// launch. NVIDIA sm_90a only (wgmma, TMA); on other builds and devices it is not usable.
#include <stdint.h>

#include <algorithm>

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

size_t prefill_workspace(const qg_context* ctx, const Args& a) {
    return frag_launch::prefill_workspace(ctx, a);
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

namespace {

// Tile width, grid and split-K of one prefill call, from the sweep of every tile x split on
// the H200 (bench/sweep_prefill.py; bench/NOTES.md, "Prefill plan from the sweep"):
//   - the token tile by M alone: 64 up to 64 tokens, 128 up to 128, else 256 where the kernel
//     folds the scale into A (bf16 x and bf16 scales, MXFP4 or W4A16: prefill_folds; the
//     registers of the group sums go to the larger accumulator), else 128. The 256-token tile
//     did half the dequantization per FLOP and measured 1.3-1.9x faster than 128 from M = 256
//     on every shape, short grids included (a rule on the block count had kept 64 or 128 there);
//   - split-K where the grid leaves most of one wave idle and K is long (narrow N with long K:
//     32 or 42 row tiles on 4096 x 14336 and 5376 x 21504): as many splits as fill one wave of
//     block slots (two a SM at 64 tokens, one at 128 and 256), each at least 16 chunks (2048
//     of K); the partial sums go to the workspace and prefill_reduce adds them in split order
//     (deterministic), then the bias. Splits past one wave, or of K = 4096 / 5376, measured
//     slower (a wave and a half leaves SMs with two blocks beside SMs with one).
struct PrefillPlan {
    bool fold = false;  // the kernel takes the scale into A (prefill_folds)
    int bn = 128, splits = 1;
    int64_t row_tiles = 0, token_tiles = 0;
};

PrefillPlan prefill_plan(const qg_context* ctx, const Args& a) {
    PrefillPlan pl;
    const frag::Geometry geo(a.n, a.k, a.group_size);
    const int64_t sms = std::max(ctx->sm_count, 1);
    pl.row_tiles = ceil_div(a.n, PF_ROWS);
    pl.fold = prefill_folds(elem_type(a.x_dtype), elem_type(a.scale_dtype));
    pl.bn = a.m <= 64 ? 64 : a.m <= 128 || !pl.fold ? 128 : 256;
    if (ctx->prefill_tile > 0) pl.bn = ctx->prefill_tile == 256 && !pl.fold ? 128 : static_cast<int>(ctx->prefill_tile);
    pl.token_tiles = ceil_div(a.m, pl.bn);
    const int64_t blocks = pl.row_tiles * pl.token_tiles;
    const int64_t slots = sms * (pl.bn == 64 ? 2 : 1);
    constexpr int64_t kMinChunks = 16, kMaxSplits = 8, kMinK = 8192;
    if (2 * blocks <= slots && a.k >= kMinK)
        pl.splits = static_cast<int>(std::max<int64_t>(1, std::min({slots / blocks, geo.k_chunks / kMinChunks, kMaxSplits})));
    if (ctx->split_k > 0) pl.splits = static_cast<int>(std::min<int64_t>(ctx->split_k, geo.k_chunks));  // tests
    return pl;
}

size_t partial_bytes(const PrefillPlan& pl, const Args& a) {
    return pl.splits > 1 ? static_cast<size_t>(pl.splits) * static_cast<size_t>(a.m) * static_cast<size_t>(a.n) * 4 : 0;
}

// The ragged tail of M: past a multiple of 256 tokens, a tail of at most 128 would cost a whole
// 256-token tile of every row tile (M = 300: 2.1x M = 256; M = 517: 1.7x M = 512, measured).
// It runs as a second launch on the rows after the last full 256-token tile, with the tile its
// own M picks (64 or 128), so that it costs about what a call of that M costs. Returns the tokens
// of the first launch (all of M when there is no such tail).
int64_t main_tokens(const qg_context* ctx, const Args& a, const PrefillPlan& pl) {
    const int64_t tail = a.m % pl.bn;
    if (pl.bn != 256 || ctx->prefill_tile > 0 || a.m < pl.bn || tail == 0 || tail > 128) return a.m;
    return a.m - tail;
}

// The call on tokens [m0, m0 + rows) (rows of x and y).
Args token_slice(const Args& a, int64_t m0, int64_t rows) {
    Args s = a;
    s.m = rows;
    s.x = static_cast<const char*>(a.x) + m0 * a.ldx * static_cast<int64_t>(dtype_size(a.x_dtype));
    s.y = static_cast<char*>(a.y) + m0 * a.ldy * static_cast<int64_t>(dtype_size(a.y_dtype));
    return s;
}

// The call on row tiles [t0, t0 + tiles) of W (columns of y): the frag planes are row-block
// major, so a row tile's planes start where those of the tiles before it end.
Args row_tile_slice(const Args& a, int64_t t0, int64_t tiles) {
    const frag::Geometry before(t0 * PF_ROWS, a.k, a.group_size);
    Args s = a;
    s.n = std::min<int64_t>(a.n - t0 * PF_ROWS, tiles * PF_ROWS);
    s.qweight = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(a.qweight) + before.qweight_bytes());
    s.scales = static_cast<const char*>(a.scales) + before.scales_bytes();
    if (a.qzeros != nullptr)
        s.qzeros = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(a.qzeros) + before.qzeros_bytes());
    if (a.bias != nullptr) s.bias = static_cast<const char*>(a.bias) + t0 * PF_ROWS * static_cast<int64_t>(dtype_size(a.bias_dtype));
    s.y = static_cast<char*>(a.y) + t0 * PF_ROWS * static_cast<int64_t>(dtype_size(a.y_dtype));
    return s;
}

// One kernel launch of a call: the call on a slice of tokens and row tiles, and its plan.
struct Launch {
    Args a;
    PrefillPlan pl;
};

// The last partial wave: with one block an SM (the 128- and 256-token tiles) a grid of one full
// wave and a few blocks more runs two waves, the second mostly idle (5376 x 21504 at M = 1024:
// 168 blocks on 132 SMs). The row tiles of those blocks run as a second launch with K split to
// fill one wave of SMs, the rest as the full wave: 455 -> 354 us on the H200. Behind more full
// waves the same split measured -3 % to +4 % (43008 x 5376 M = 512, 14336 x 4096 M = 1024:
// bench/NOTES.md), so only one full wave takes it.
int wave_launches(const qg_context* ctx, const Args& a, const PrefillPlan& pl, Launch* out) {
    const int64_t sms = std::max(ctx->sm_count, 1);
    const frag::Geometry geo(a.n, a.k, a.group_size);
    const int64_t blocks = pl.row_tiles * pl.token_tiles, left = blocks % sms;
    const int64_t tail_tiles = ceil_div(left, pl.token_tiles);
    const int64_t splits = std::min<int64_t>(sms / std::max<int64_t>(tail_tiles * pl.token_tiles, 1), geo.k_chunks);
    const bool split_tail = pl.bn != 64 && pl.splits == 1 && ctx->prefill_tile == 0 && ctx->split_k == 0 &&
                            blocks > sms && blocks < 2 * sms && 2 * left <= sms && splits >= 2 &&
                            tail_tiles < pl.row_tiles;
    if (!split_tail) {
        out[0] = Launch{a, pl};
        return 1;
    }
    const int64_t head_tiles = pl.row_tiles - tail_tiles;
    out[0] = Launch{row_tile_slice(a, 0, head_tiles), pl};
    out[0].pl.row_tiles = head_tiles;
    out[1] = Launch{row_tile_slice(a, head_tiles, tail_tiles), pl};
    out[1].pl.row_tiles = tail_tiles;
    out[1].pl.splits = static_cast<int>(splits);
    return 2;
}

// Every launch of a call, in order (at most 3: the head's full waves, its last wave split, the
// ragged tail of M).
int plan_launches(const qg_context* ctx, const Args& a, Launch (&out)[3]) {
    const PrefillPlan pl = prefill_plan(ctx, a);
    const int64_t m1 = main_tokens(ctx, a, pl);
    if (m1 == a.m) return wave_launches(ctx, a, pl, out);
    const Args head = token_slice(a, 0, m1), tail = token_slice(a, m1, a.m - m1);
    const int count = wave_launches(ctx, head, prefill_plan(ctx, head), out);
    out[count] = Launch{tail, prefill_plan(ctx, tail)};
    return count + 1;
}

qg_status prefill_once(const qg_context* ctx, const Args& a, const PrefillPlan& pl, int code, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const char* what = code == CODE_E2M1 ? "mxfp4 prefill_wgmma" : "w4a16 prefill_wgmma";
    const frag::Geometry geo(a.n, a.k, a.group_size);
    const int bn = pl.bn;
    const int x_type = elem_type(a.x_dtype);
    const bool asym = a.qzeros != nullptr;
    const int scale_type = elem_type(a.scale_dtype);
    const void* kernel = prefill_kernel(x_type, scale_type, bn, a.group_size, asym, code);
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
    p.scale_type = scale_type;
    p.y_type = elem_type(a.y_dtype);
    p.bias = launch_util::bias_of(a);
    p.splits = pl.splits;
    p.partial = pl.splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
    const dim3 grid(static_cast<unsigned>(pl.token_tiles), static_cast<unsigned>(pl.row_tiles),
                    static_cast<unsigned>(pl.splits));
    if (log_enabled())
        log_once("%s m=%lld n=%lld k=%lld g=%d %s%s: tile 128 rows x %d tokens, grid %u x %u x %u (split-K), smem %d",
                 what, static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k),
                 a.group_size, code == CODE_E2M1 ? "e2m1" : asym ? "asym" : "sym",
                 pl.fold ? " (scale folded into A)" : "", bn, grid.x, grid.y, grid.z, smem);
    st = launch_util::launch_with_map(kernel, grid, PF_THREADS, smem, static_cast<hipStream_t>(stream), map, p, what);
    if (st != QG_OK || pl.splits == 1) return st;
    const int64_t reduce_blocks =
        std::min<int64_t>(ceil_div(a.m * a.n, PF_REDUCE_THREADS), 8 * static_cast<int64_t>(std::max(ctx->sm_count, 1)));
    prefill_reduce<<<static_cast<unsigned>(reduce_blocks), PF_REDUCE_THREADS, 0, static_cast<hipStream_t>(stream)>>>(p);
    return gpu_check_launch(code == CODE_E2M1 ? "mxfp4 prefill_reduce" : "w4a16 prefill_reduce");
#else
    (void)ctx, (void)a, (void)pl, (void)code, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: prefill_wgmma without tensor maps");
#endif
}

}  // namespace

size_t frag_launch::prefill_workspace(const qg_context* ctx, const Args& a) {
    Launch launches[3];
    const int count = plan_launches(ctx, a, launches);
    size_t most = 0;
    for (int i = 0; i < count; ++i) most = std::max(most, partial_bytes(launches[i].pl, launches[i].a));
    return most;
}

qg_status frag_launch::prefill(const qg_context* ctx, const Args& a, int code, qg_stream stream) {
    Launch launches[3];
    const int count = plan_launches(ctx, a, launches);
    for (int i = 0; i < count; ++i) {
        const qg_status st = prefill_once(ctx, launches[i].a, launches[i].pl, code, stream);
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

const Tier<Args> gpu_w4a16_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable,
                                           prefill_workspace, prefill_launch};

}  // namespace qg
