// W4A16 prefill tier (hip/prefill_wgmma.h): its table entry, the tensor map of x and the
// launch. NVIDIA sm_90a only (wgmma, TMA); on other builds and devices it is not usable.
#include <stdint.h>

#include <stdlib.h>

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
using frag_launch::kDecodeRows;
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
    return frag_launch::prefill_workspace(ctx, a, CODE_INT4);
}
qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::prefill(ctx, a, CODE_INT4, stream);
}

}  // namespace

int frag_launch::prefill_smem(int bn) {
    return prefill_ring_smem(bn);
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

// The kernel of a call's x type, scales, tile, G and zero-points, whole tiles or stream-K (none
// without tensor maps: the tier is not usable there).
const void* kernel_of(const Args& a, int bn, int code, bool stream_k) {
#if defined(QG_HAVE_TENSOR_MAPS)
    return prefill_kernel(elem_type(a.x_dtype), elem_type(a.scale_dtype), bn, a.group_size, a.qzeros != nullptr, code,
                          stream_k);
#else
    (void)a, (void)bn, (void)code, (void)stream_k;
    return nullptr;
#endif
}

// Tile width and grid of one prefill launch (bench/NOTES.md, "Prefill plan from the sweep" and
// "Stream-K"):
//   - the token tile by M alone: 32 up to 32 tokens where the code has a 32-token kernel (W4A16
//     and MXFP4 with bf16 x, the GGUF codes), 64 up to 64, 128 up to 128, else 256 where the
//     kernel folds the scale into A (bf16 x and bf16 scales, MXFP4 or W4A16: prefill_folds; the
//     registers of the group sums go to the larger accumulator), else 128. The 256-token tile
//     did half the dequantization per FLOP and measured 1.3-1.9x faster than 128 from M = 256
//     on every shape, short grids included; at 17 .. 32 tokens the 64-token tile's wgmmas, half
//     of whose columns are past M, bound its time (bench/NOTES.md, session 53's knock-outs);
//   - the grid (bench/NOTES.md, "Stream-K in the frag prefill"): where there are fewer tiles
//     than resident block slots (SMs x the kernel's occupancy: 2 at 32 / 64 tokens, 1 above), each
//     tile's K is spread over several blocks as stream-K units of (tile, 128-k chunk): in equal
//     aligned parts where two or more fit a tile (split-K in effect, each part at least
//     kMinChunks chunks), else over every slot (5376 x 21504 at M = 512: 84 tiles on 132 SMs,
//     220 -> 192 us); likewise one full wave and at most half of another. Otherwise every tile
//     runs whole, a block a tile: stream-K across more waves measured slower (4096 x 14336
//     M = 2048, 256 tiles: 330 -> 376 us: the blocks no longer walk K in step, and x, 59 MB
//     there, stops being shared through L2), the lone blocks of a last partial wave run faster
//     than a full wave's, and a persistent grid taking whole tiles in a fixed order lost 5-10 %
//     to the GPU's own block scheduler (43008 x 5376 M = 512: 403 -> 442 us);
//   - split_k (tests) makes every tile stream-K over about split_k blocks.
// A plan covers row tiles [row_tile0, row_tile0 + row_tiles) of the weight (all of them but
// in a row split, plan_launches).
struct PrefillPlan {
    bool fold = false;  // the kernel takes the scale into A (prefill_folds)
    int bn = 128;
    int64_t row_tile0 = 0, row_tiles = 0, token_tiles = 0, tiles = 0;
    int64_t slots = 0;      // resident blocks of the stream-K kernel
    bool stream_k = false;  // else a block a tile
    int64_t grid = 0;       // stream-K blocks
};

// rows: the launch's row tiles from row_tile0 (0: all of the weight's); bn: the token tile (0: by M)
PrefillPlan prefill_plan(const qg_context* ctx, const Args& a, int code, int64_t row_tile0 = 0, int64_t rows = 0,
                         int bn = 0) {
    PrefillPlan pl;
    const frag::Geometry geo(a.n, a.k, a.group_size);
    pl.row_tile0 = row_tile0;
    pl.row_tiles = rows > 0 ? rows : ceil_div(a.n, PF_ROWS) - row_tile0;
    pl.fold = prefill_folds(elem_type(a.x_dtype), elem_type(a.scale_dtype), code);
    pl.bn = a.m <= 32 ? 32 : a.m <= 64 ? 64 : a.m <= 128 || !pl.fold ? 128 : 256;
    if (ctx->prefill_tile > 0) pl.bn = ctx->prefill_tile == 256 && !pl.fold ? 128 : static_cast<int>(ctx->prefill_tile);
    if (bn > 0) pl.bn = bn;
    // 32 tokens only where the code and x type have that kernel
    if (pl.bn == 32 && kernel_of(a, 32, code, false) == nullptr) pl.bn = 64;
    pl.token_tiles = ceil_div(a.m, pl.bn);
    pl.tiles = pl.row_tiles * pl.token_tiles;
    const int per_sm =
        launch_util::resident_blocks(ctx, kernel_of(a, pl.bn, code, true), PF_THREADS, frag_launch::prefill_smem(pl.bn));
    const int64_t slots = static_cast<int64_t>(std::max(ctx->sm_count, 1)) * std::max(per_sm, 1);
    pl.slots = slots;
    const int64_t units = pl.tiles * geo.k_chunks;
    constexpr int64_t kMinChunks = 8;
    if (ctx->split_k > 0) {
        pl.grid = std::min({slots, pl.tiles * ctx->split_k, units});
    } else if (pl.tiles < slots) {
        // fewer tiles than slots: each tile's K over `per` blocks in equal aligned parts where
        // at least two fit (the blocks of a tile's part run the same k-range in step, as split-K
        // did), else over every slot (tiles past half the slots)
        const int64_t per = std::min(slots / pl.tiles, geo.k_chunks / kMinChunks);
        pl.grid = per >= 2 ? pl.tiles * per : std::max(pl.tiles, std::min(slots, units / kMinChunks));
    } else if (pl.tiles < 2 * slots && pl.tiles % slots != 0 && 2 * (pl.tiles % slots) <= slots) {
        pl.grid = slots;  // one full wave and at most half of another: spread over one wave
    }
    // every block at least one unit: a block of none would still be counted among a tile's
    // contributors, and the block ending the tile would wait for it forever (each branch above
    // keeps this already; the clamp makes it a property of the plan, not of its arithmetic)
    pl.grid = std::min(pl.grid, units);
    pl.stream_k = pl.grid > 0 && (ctx->split_k > 0 || pl.grid != pl.tiles);
    return pl;
}

// Stream-K workspace: a counter per stream-K tile, then a partial-sum slot per block.
size_t counter_bytes(const PrefillPlan& pl) { return launch_util::align16(static_cast<size_t>(pl.tiles) * 4); }

size_t partial_bytes(const PrefillPlan& pl) {
    if (!pl.stream_k) return 0;
    return counter_bytes(pl) + static_cast<size_t>(pl.grid) * PF_THREADS * (pl.bn / 2) * sizeof(float);
}

// The call on tokens [m0, m0 + rows) (rows of x and y).
Args token_slice(const Args& a, int64_t m0, int64_t rows) {
    Args s = a;
    s.m = rows;
    s.x = static_cast<const char*>(a.x) + m0 * a.ldx * static_cast<int64_t>(dtype_size(a.x_dtype));
    s.y = static_cast<char*>(a.y) + m0 * a.ldy * static_cast<int64_t>(dtype_size(a.y_dtype));
    return s;
}

// One kernel launch of a call: the call on a slice of tokens, and its plan (a prefill launch,
// on some or all of the row tiles), or decode_frag on it.
struct Launch {
    Args a;
    PrefillPlan pl;
    bool decode = false;
};

// The row tiles a row split takes from the end of a whole-tile plan into a stream-K launch of
// their own, or 0 (bench/NOTES.md, "Prefill: the last partial wave as stream-K"). Past two waves
// of whole tiles (one wave and at most half of another is all stream-K already), a last wave of
// r = tiles % slots tiles, r at most 3/4 of the slots, leaves most SMs idle: its last R =
// ceil(r / token_tiles) row tiles (every token tile of them) run as stream-K over the slots
// instead. Measured on the H200: it pays where K is long (5376 x 21504 at M = 2048: -7 %) and is
// even elsewhere (43008 x 5376 at M = 512: -1 %), because a short last wave's lone blocks run at
// a higher clock than a full wave's (1.92 against 1.66 GHz) and a short stream-K part pays its
// prologue and fix-up. Where r is at most half the slots, the last whole wave joins those r
// tiles (r + slots tiles, rounded up to whole row tiles, over the slots: each block ~1 + r /
// slots tiles, prefill_plan's "one wave and at most half of another"): a stream-K launch of r
// tiles alone took a tile's time for a fifth of a tile's work (43008 x 5376 at M = 512: 12
// tiles, 51.9 us, where a whole wave takes 68.6), and with the wave joined M = 512 measured
// 392 -> 377 us (GGUF frag formats -3 to -4 %), M = 2048 (r = 48) within the noise. The head's
// fewer row tiles leave it at most its whole waves.
// wide: the form that joins the last whole wave (slice_launches tries it first).
int64_t row_split(const PrefillPlan& pl, const qg_context* ctx, bool wide) {
    if (pl.stream_k || ctx->split_k > 0 || pl.slots <= 0 || pl.tiles < 2 * pl.slots) return 0;
    const int64_t r = pl.tiles % pl.slots;
    if (r == 0 || 4 * r > 3 * pl.slots || (wide && 2 * r > pl.slots)) return 0;
    const int64_t rows = ceil_div(wide ? r + pl.slots : r, pl.token_tiles);
    return rows * pl.token_tiles < (wide ? 2 : 1) * pl.slots && rows < pl.row_tiles ? rows : 0;
}

// The launches of the call on one token slice, given its plan pl: that plan, or (row_split) its
// whole tiles on the first row tiles and then the last ones as stream-K. Returns how many (1 or
// 2) went to out.
int slice_launches(const qg_context* ctx, const Args& a, int code, const PrefillPlan& pl, Launch* out) {
    for (const bool wide : {true, false}) {
        const int64_t tail = row_split(pl, ctx, wide);
        if (tail <= 0) continue;
        const PrefillPlan head = prefill_plan(ctx, a, code, 0, pl.row_tiles - tail, pl.bn);
        const PrefillPlan last = prefill_plan(ctx, a, code, pl.row_tiles - tail, tail, pl.bn);
        if (!head.stream_k && last.stream_k) {
            out[0] = Launch{a, head};
            out[1] = Launch{a, last};
            return 2;
        }
    }
    out[0] = Launch{a, pl};
    return 1;
}

// Every launch of a call, in order: one, or (no prefill_tile option set) the full token tiles
// and then the ragged tail of M past the last of them, where
//   - a tail of at most kDecodeRows (16) tokens runs on decode_frag, which reads the same frag
//     layout: a tail of 5 tokens cost about an M = 32 prefill call (88 / 54 / 37 us on
//     43008 x 5376 / 5376 x 21504 / 4096 x 14336) where decode_frag takes 54 / 31 / 22 us
//     (bench/NOTES.md, "Ragged tails on decode_frag");
//   - else, past a multiple of 256 tokens, a tail of at most 128 would cost a whole 256-token
//     tile of every row tile (M = 300: 2.1x M = 256; M = 517: 1.7x M = 512, measured), so it
//     runs as a second prefill launch with the tile its own M picks (64 or 128). A ragged tile
//     of 128 costs no more than a second 128-token launch would.
// Before both: a call whose tokens fit one token tile fewer of PF_FUSED_BN (272) than of 256,
// at most kFusedTiles of them (257 .. 272 and 513 .. 544 tokens), runs on the fused tile
// (PrefillSmem: its 16 extra tokens one more wgmma n16 on the same A registers) where the
// kernel has one (W4A16 folded, MXFP4), so that no second launch reads and dequantizes every
// weight for the tail. Measured (H100, session 40): M = 262 / 272 15-26 % faster than with the
// decode_frag tail; the fused tile costs ~1.15x a 256-token one, so three of them (M = 769 ..
// 816: 0.45 of a tile more) would cost more than the tail. Session 40's M = 517 as the 256-token
// whole tiles and then one fused tile (two launches, a partial wave each) was no gain; the whole
// call on 272-token tiles is one launch (bench/NOTES.md, session 41). QG_EXP_FUSED_TAIL=0 turns
// it off (the A/B).
// Each token slice's launches are slice_launches': a row split may make them two.
constexpr int kMaxLaunches = 4;
constexpr int kFusedTiles = 2;
bool fused_tail_enabled() {
    static const bool on = [] {
        const char* v = getenv("QG_EXP_FUSED_TAIL");
        return v == nullptr || v[0] != '0';
    }();
    return on;
}
int plan_launches(const qg_context* ctx, const Args& a, int code, Launch (&out)[kMaxLaunches]) {
    const PrefillPlan pl = prefill_plan(ctx, a, code);
    const int64_t tail = a.m % pl.bn;
    const int64_t fused_tiles = ceil_div(a.m, PF_FUSED_BN);
    if (ctx->prefill_tile == 0 && pl.bn == 256 && fused_tiles < pl.token_tiles && fused_tiles <= kFusedTiles &&
        fused_tail_enabled() && kernel_of(a, PF_FUSED_BN, code, false) != nullptr)
        return slice_launches(ctx, a, code, prefill_plan(ctx, a, code, 0, 0, PF_FUSED_BN), out);
    if (ctx->prefill_tile == 0 && a.m > pl.bn && tail != 0) {
        const Args head = token_slice(a, 0, a.m - tail), rest = token_slice(a, a.m - tail, tail);
        const char* why = nullptr;
        const bool decode = tail <= kDecodeRows && frag_launch::decode_usable(ctx, rest, &why);
        if (decode || (pl.bn == 256 && tail <= 128)) {
            int count = slice_launches(ctx, head, code, prefill_plan(ctx, head, code), out);
            if (decode) {
                out[count++] = Launch{rest, PrefillPlan{}, true};
                return count;
            }
            return count + slice_launches(ctx, rest, code, prefill_plan(ctx, rest, code), out + count);
        }
    }
    return slice_launches(ctx, a, code, pl, out);
}

qg_status prefill_once(const qg_context* ctx, const Args& a, const PrefillPlan& pl, int code, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const char* what = frag_launch::kernel_name(code, true);
    const frag::Geometry geo(a.n, a.k, a.group_size);
    const int bn = pl.bn;
    const void* kernel = kernel_of(a, bn, code, pl.stream_k);
    const int smem = frag_launch::prefill_smem(bn);
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "%s: no kernel for bn=%d", what, bn);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, what);
    if (st != QG_OK) return st;
    qg_tensor_map map;
    st = launch_util::encode_x_map(a.x, a.m, a.k, a.ldx, a.x_dtype, prefill_box_rows(bn), &map, "w4a16 prefill");
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
    p.superblocks = frag_launch::q4_k_superblocks(a, code);
    p.token_tiles = static_cast<int>(pl.token_tiles);
    p.tiles = static_cast<int>(pl.tiles);
    p.row_tile0 = static_cast<int>(pl.row_tile0);
    if (pl.stream_k) {
        p.sk_count = static_cast<uint32_t*>(a.workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + counter_bytes(pl));
    }
    const dim3 grid = pl.stream_k ? dim3(static_cast<unsigned>(pl.grid))
                                  : dim3(static_cast<unsigned>(pl.token_tiles), static_cast<unsigned>(pl.row_tiles));
    if (log_enabled())
        log_once("%s m=%lld n=%lld k=%lld g=%d %s%s: tile 128 rows x %d tokens, %lld tiles (%lld x %lld), %s %lld, "
                 "smem %d, row tiles from %lld",
                 what, static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k),
                 a.group_size, frag_launch::code_name(code, a.qzeros != nullptr),
                 float32_weights(code) ? " (weights in float32, rounded once into A)" : pl.fold ? " (scale folded into A)" : "", bn, static_cast<long long>(pl.tiles),
                 static_cast<long long>(pl.row_tiles), static_cast<long long>(pl.token_tiles),
                 pl.stream_k ? "stream-K over blocks:" : "a block a tile, blocks:",
                 static_cast<long long>(pl.stream_k ? pl.grid : pl.tiles), smem, static_cast<long long>(pl.row_tile0));
    return launch_util::launch_with_map(kernel, grid, PF_THREADS, smem, static_cast<hipStream_t>(stream), map, p, what);
#else
    (void)ctx, (void)a, (void)pl, (void)code, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: prefill_wgmma without tensor maps");
#endif
}

}  // namespace

size_t frag_launch::prefill_workspace(const qg_context* ctx, const Args& a, int code) {
    Launch launches[kMaxLaunches];
    const int count = plan_launches(ctx, a, code, launches);
    size_t most = 0;
    for (int i = 0; i < count; ++i)
        most = std::max(most, launches[i].decode ? frag_launch::decode_workspace(ctx, launches[i].a, code)
                                                 : partial_bytes(launches[i].pl));
    return most;
}

qg_status frag_launch::prefill(const qg_context* ctx, const Args& a, int code, qg_stream stream) {
    Launch launches[kMaxLaunches];
    const int count = plan_launches(ctx, a, code, launches);
    for (int i = 0; i < count; ++i) {
        const Launch& l = launches[i];
        const qg_status st = l.decode ? frag_launch::decode(ctx, l.a, code, stream)
                                      : prefill_once(ctx, l.a, l.pl, code, stream);
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

const Tier<Args> gpu_w4a16_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable,
                                           prefill_workspace, prefill_launch};

}  // namespace qg
