// W4A16 GPU tiers: their table entries (src/tier_table.h), plans and launches of the
// kernels in hip/w4a16_*.hip. Arguments were validated by src/api.cpp already; each tier's
// usable() states only what that tier itself needs.
#include <stdint.h>

#include <algorithm>

#include "formats/w4a16_frag.h"
#include "frag_launch.h"
#include "launch_util.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using namespace w4a16;
using launch_util::ceil_div;

typedef qg_w4a16_gemm_args Args;

using launch_util::aligned16;
using launch_util::elem_type;
using launch_util::mma_sync_device;

using frag_launch::kDecodeRows;
constexpr size_t kCounterAlign = 256;

bool is_frag(const Args& a) { return a.layout == QG_W4A16_LAYOUT_FRAG; }


// The kernels index rows and k with 32-bit ints (row offsets in 64 bits).
bool fits_int32(const Args& a, const char** why) {
    if (a.n < (int64_t(1) << 31) && a.k < (int64_t(1) << 31)) return true;
    *why = "the GPU W4A16 tiers need n and k below 2^31";
    return false;
}

// Launches `kernel` (a lookup function's answer) with one parameter struct.
template <class P>
qg_status launch(const void* kernel, dim3 grid, int threads, int smem, hipStream_t stream, const P& params,
                 const char* what) {
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "%s: no kernel for this configuration", what);
    void* args[] = {const_cast<P*>(&params)};
    const hipError_t e = hipLaunchKernel(kernel, grid, dim3(threads), args, smem, stream);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        return set_error(QG_ERR_DEVICE, "launch of %s failed: %s", what, hipGetErrorString(e));
    }
    return gpu_check_launch(what);
}

// A decode tier serves at most kDecodeRows rows of x per launch: larger M runs one launch per
// 16 rows, each with p.m, p.x, p.y set for its rows and the n8-tile count mt it needs (the
// last chunk may need one tile where the plan has two).
template <class P, class KernelFor, class SmemFor>
qg_status launch_by_16_rows(const Args& a, P& p, int plan_mt, int blocks, int threads, KernelFor kernel_for,
                            SmemFor smem_for, qg_stream stream, const char* what) {
    for (int64_t m0 = 0; m0 < a.m; m0 += kDecodeRows) {
        p.m = static_cast<int>(std::min<int64_t>(kDecodeRows, a.m - m0));
        p.x = static_cast<const uint16_t*>(a.x) + m0 * a.ldx;
        p.y = static_cast<char*>(a.y) + m0 * a.ldy * launch_util::dtype_bytes(a.y_dtype);
        const int mt = std::min(p.m > 8 ? 2 : 1, plan_mt);
        const qg_status st =
            launch(kernel_for(mt), dim3(blocks), threads, smem_for(mt), static_cast<hipStream_t>(stream), p, what);
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

// Stream-K: the block whose contiguous range of `units` holds unit u (P blocks).
int owner_of(int64_t u, int64_t units, int64_t blocks) { return static_cast<int>(((u + 1) * blocks - 1) / units); }

// Most blocks sharing one group of `per_group` consecutive units.
int most_contributors(int64_t groups, int64_t per_group, int64_t blocks) {
    const int64_t units = groups * per_group;
    int most = 1;
    for (int64_t r = 0; r < groups; ++r)
        most = std::max(most, owner_of(r * per_group + per_group - 1, units, blocks) -
                                  owner_of(r * per_group, units, blocks) + 1);
    return most;
}

size_t counters_bytes(int64_t groups) {
    return (static_cast<size_t>(groups) * sizeof(unsigned) + kCounterAlign - 1) / kCounterAlign * kCounterAlign;
}

// The fields every W4A16 kernel's parameters share (SimtParams, Params): the weight, its
// shape and strides, group size, scale and output element types, the bias.
template <class P>
void set_weight_fields(P& p, const Args& a) {
    p.qweight = a.qweight;
    p.scales = static_cast<const uint16_t*>(a.scales);
    p.qzeros = a.qzeros;
    p.n = static_cast<int>(a.n);
    p.k = static_cast<int>(a.k);
    p.ldx = a.ldx;
    p.ldy = a.ldy;
    p.group_size = a.group_size;
    p.scale_type = elem_type(a.scale_dtype);
    p.y_type = elem_type(a.y_dtype);
    p.bias = launch_util::bias_of(a);
}

// ================================================================ simt (portable, both layouts)

bool simt_usable(const qg_context* ctx, const Args& a, const char** why) {
    return gpu_context_only(ctx, why) && fits_int32(a, why);
}

qg_status simt_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    SimtParams p{};
    set_weight_fields(p, a);
    p.x_type = elem_type(a.x_dtype);
    p.frag = is_frag(a) ? 1 : 0;
    const int warps = SIMT_THREADS / QG_WARP_SIZE;
    const unsigned blocks = static_cast<unsigned>(ceil_div(a.n, warps));
    for (int64_t m0 = 0; m0 < a.m; m0 += SIMT_MAX_M) {
        p.m = static_cast<int>(std::min<int64_t>(SIMT_MAX_M, a.m - m0));
        p.x = static_cast<const uint16_t*>(a.x) + m0 * a.ldx;
        p.y = static_cast<char*>(a.y) + m0 * a.ldy * launch_util::dtype_bytes(a.y_dtype);
        decode_simt<<<blocks, SIMT_THREADS, 0, static_cast<hipStream_t>(stream)>>>(p);
        const qg_status st = gpu_check_launch("w4a16 decode_simt");
        if (st != QG_OK) return st;
    }
    return QG_OK;
}

// ================================================================ decode_mma (canonical, v5)

int mma_resident(const qg_context* ctx, int x_type, int mt, int group_size) {
    return launch_util::resident_blocks(ctx, decode_mma_kernel(x_type, mt, group_size), MMA_THREADS,
                                        mma_smem_bytes(mt));
}

// The mma tier copies x and qweight 16 bytes and scales 4 bytes (two groups) at a time.
bool decode_mma_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why) || !fits_int32(a, why) || !mma_sync_device(ctx, why)) return false;
    if (is_frag(a)) {
        *why = "reads the canonical layout (decode_frag serves the frag layout)";
        return false;
    }
    if (!(aligned16(a.x) && a.ldx % 8 == 0 && aligned16(a.qweight) &&
          (reinterpret_cast<uintptr_t>(a.scales) & 3u) == 0 && (a.k / a.group_size) % 2 == 0)) {
        *why = "needs x and qweight 16-byte aligned, ldx a multiple of 8, scales 4-byte aligned and an even "
               "number of groups per row";
        return false;
    }
    return true;
}

struct MmaPlan {
    int mt = 1, row_blocks = 0, blocks = 0, max_contributors = 1;
};

bool mma_plan(const qg_context* ctx, const Args& a, MmaPlan* plan) {
    plan->mt = std::min<int64_t>(a.m, kDecodeRows) > 8 ? 2 : 1;
    plan->row_blocks = static_cast<int>(ceil_div(a.n, ROWS_PER_BLOCK));
    const int64_t S = ceil_div(a.k, SC_K);
    const int64_t units = plan->row_blocks * S;
    const int x_type = elem_type(a.x_dtype);
    // both tile widths may run (the last 16-row chunk of a large M can be narrower)
    const int resident = std::min(mma_resident(ctx, x_type, plan->mt, a.group_size),
                                  mma_resident(ctx, x_type, 1, a.group_size));
    if (resident == 0) return false;
    int64_t blocks = static_cast<int64_t>(std::max(ctx->sm_count, 1)) * resident;
    if (ctx->split_k > 0) blocks = plan->row_blocks * ctx->split_k;  // tests reach every reduction path
    blocks = std::max<int64_t>(1, std::min(blocks, units));
    plan->blocks = static_cast<int>(blocks);
    plan->max_contributors = most_contributors(plan->row_blocks, S, blocks);
    return true;
}

size_t decode_mma_workspace(const qg_context* ctx, const Args& a) {
    MmaPlan plan;
    if (!mma_plan(ctx, a, &plan) || plan.max_contributors == 1) return 0;
    return counters_bytes(plan.row_blocks) + static_cast<size_t>(plan.row_blocks) * plan.max_contributors *
                                                 kDecodeRows * ROWS_PER_BLOCK * sizeof(float);
}

qg_status decode_mma_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    MmaPlan plan;
    if (!mma_plan(ctx, a, &plan))
        return set_error(QG_ERR_DEVICE, "w4a16 decode_mma cannot be made resident (%d bytes of shared memory)",
                         mma_smem_bytes(plan.mt));
    if (log_enabled())
        log_once("w4a16 decode_mma m=%lld n=%lld k=%lld g=%d: mt=%d blocks=%d max_contributors=%d%s",
                 static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k), a.group_size,
                 plan.mt, plan.blocks, plan.max_contributors, a.m > kDecodeRows ? " (one launch per 16 rows)" : "");
    Params p{};
    set_weight_fields(p, a);
    p.row_blocks = plan.row_blocks;
    p.max_contributors = plan.max_contributors;
    if (plan.max_contributors > 1) {
        p.counters = static_cast<unsigned*>(a.workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + counters_bytes(plan.row_blocks));
    }
    const int x_type = elem_type(a.x_dtype);
    return launch_by_16_rows(
        a, p, plan.mt, plan.blocks, MMA_THREADS, [&](int mt) { return decode_mma_kernel(x_type, mt, a.group_size); },
        [](int mt) { return mma_smem_bytes(mt); }, stream, "w4a16 decode_mma");
}

// ================================================================ decode_frag (frag layout)

int frag_resident(const qg_context* ctx, int x_type, int mt, int group_size, bool asym, int code) {
    return launch_util::resident_blocks(ctx, decode_frag_kernel(x_type, mt, group_size, asym, code), FRAG_THREADS,
                                        frag_smem_bytes(mt, code));
}

bool decode_frag_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (!is_frag(a)) {
        *why = "reads the frag layout (qg_w4a16_repack); decode_mma serves the canonical one";
        return false;
    }
    return frag_launch::decode_usable(ctx, a, why);
}

}  // namespace

bool frag_launch::decode_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why) || !fits_int32(a, why) || !mma_sync_device(ctx, why)) return false;
    if (!aligned16(a.x) || a.ldx % 8 != 0) {
        *why = "copies x 16 bytes at a time: x must be 16-byte aligned and ldx a multiple of 8";
        return false;
    }
    return true;
}

namespace {

// The persistent grid (every resident block, stream-K over the (row tile, chunk) units) shares
// each row tile among blocks / row_tiles contributors, and the last to arrive adds their
// partial sums (M x 256 floats each) at the end of the kernel. With few row tiles and more
// than one token, a split grid of one block an SM (row_tiles x s blocks, s = SMs / row_tiles:
// each block about K / s of one row tile) halves the contributors and measured faster
// (H100, g128 asym bf16, bench/NOTES.md session 52): 4096x14336 (16 row tiles, s = 8) M = 4 / 8
// / 16 -5 / -14 / -22 %, 2048x8192 (s = 16) M = 2 / 4 / 16 -14 / -23 / -47 %, 4096x11008 M = 4 /
// 16 -9 / -27 %, 3584x18944 (s = 9) M = 16 -17 %; at M = 1 -8 .. +5 %, so M = 1 keeps the
// persistent grid, and 5376x21504 (21 row tiles, s = 6) gained under 5 % at M = 16 and lost 7 %
// at M = 2, so fewer than 8 blocks a row tile keep it too.
constexpr int64_t kSplitGridMinM = 2;
constexpr int64_t kSplitGridMinSplit = 8;

struct FragPlan {
    int mt = 1, k_chunks = 0, row_blocks = 0, row_tiles = 0, blocks = 0, max_contributors = 1;
};

bool frag_plan(const qg_context* ctx, const Args& a, int code, FragPlan* plan) {
    const frag::Geometry geo(a.n, a.k, a.group_size);
    plan->mt = std::min<int64_t>(a.m, kDecodeRows) > 8 ? 2 : 1;
    plan->k_chunks = static_cast<int>(geo.k_chunks);
    plan->row_blocks = static_cast<int>(geo.row_blocks);
    plan->row_tiles = static_cast<int>(ceil_div(geo.row_blocks, FRAG_TILE_RB));
    const int64_t units = static_cast<int64_t>(plan->row_tiles) * plan->k_chunks;
    const int x_type = elem_type(a.x_dtype);
    const bool asym = a.qzeros != nullptr;
    const int resident = std::min(frag_resident(ctx, x_type, plan->mt, a.group_size, asym, code),
                                  frag_resident(ctx, x_type, 1, a.group_size, asym, code));
    if (resident == 0) return false;
    const int64_t sms = std::max(ctx->sm_count, 1);
    int64_t split = ctx->split_k;  // blocks a row tile of a split grid; 0: the persistent grid
    if (split == 0 && a.m >= kSplitGridMinM && sms / plan->row_tiles >= kSplitGridMinSplit)
        split = sms / plan->row_tiles;
    int64_t blocks = split > 0 ? plan->row_tiles * split : sms * resident;
    blocks = std::max<int64_t>(1, std::min(blocks, units));
    plan->blocks = static_cast<int>(blocks);
    plan->max_contributors = most_contributors(plan->row_tiles, plan->k_chunks, blocks);
    return true;
}

size_t frag_partial_bytes(const FragPlan& plan) {
    return static_cast<size_t>(plan.row_tiles) * plan.max_contributors * 16 * FRAG_TILE_ROWS * sizeof(float);
}

}  // namespace

size_t frag_launch::decode_workspace(const qg_context* ctx, const Args& a, int code) {
    FragPlan plan;
    if (!frag_plan(ctx, a, code, &plan) || plan.max_contributors == 1) return 0;
    return counters_bytes(plan.row_tiles) + frag_partial_bytes(plan);
}

qg_status frag_launch::decode(const qg_context* ctx, const Args& a, int code, qg_stream stream) {
    const char* family = frag_launch::family_name(code);
    FragPlan plan;
    if (!frag_plan(ctx, a, code, &plan))
        return set_error(QG_ERR_DEVICE, "%s decode_frag cannot be made resident (%d bytes of shared memory)",
                         family, frag_smem_bytes(plan.mt, code));
    if (log_enabled())
        log_once("%s decode_frag m=%lld n=%lld k=%lld g=%d %s: mt=%d row_tiles=%d chunks=%d blocks=%d "
                 "max_contributors=%d smem=%d%s",
                 family, static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k),
                 a.group_size, frag_launch::code_name(code, a.qzeros != nullptr), plan.mt, plan.row_tiles, plan.k_chunks, plan.blocks,
                 plan.max_contributors, frag_smem_bytes(plan.mt, code),
                 a.m > kDecodeRows ? " (one launch per 16 rows)" : "");
    FragParams p{};
    p.qweight = reinterpret_cast<const uint32_t*>(a.qweight);
    p.scales = static_cast<const uint32_t*>(a.scales);
    p.qzeros = reinterpret_cast<const uint8_t*>(a.qzeros);
    p.n = static_cast<int>(a.n);
    p.k = static_cast<int>(a.k);
    p.ldx = a.ldx;
    p.ldy = a.ldy;
    p.k_chunks = plan.k_chunks;
    p.row_blocks = plan.row_blocks;
    p.row_tiles = plan.row_tiles;
    p.scale_type = elem_type(a.scale_dtype);
    p.y_type = elem_type(a.y_dtype);
    p.bias = launch_util::bias_of(a);
    p.max_contributors = plan.max_contributors;
    p.superblocks = frag_launch::q4_k_superblocks(a, code);
    if (plan.max_contributors > 1) {
        p.counters = static_cast<unsigned*>(a.workspace);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + counters_bytes(plan.row_tiles));
    }
    const int x_type = elem_type(a.x_dtype);
    const bool asym = a.qzeros != nullptr;
    return launch_by_16_rows(
        a, p, plan.mt, plan.blocks, FRAG_THREADS,
        [&](int mt) { return decode_frag_kernel(x_type, mt, a.group_size, asym, code); },
        [&](int mt) { return frag_smem_bytes(mt, code); }, stream, frag_launch::kernel_name(code, false));
}

namespace {
size_t decode_frag_workspace(const qg_context* ctx, const Args& a) {
    return frag_launch::decode_workspace(ctx, a, CODE_INT4);
}
qg_status decode_frag_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
    return frag_launch::decode(ctx, a, CODE_INT4, stream);
}
}  // namespace

const Tier<Args> gpu_w4a16_simt_tier = {QG_GPU_RUNTIME_NAME ":simt", 1, simt_usable, nullptr, simt_launch};
const Tier<Args> gpu_w4a16_decode_mma_tier = {QG_GPU_RUNTIME_NAME ":decode_mma", 2, decode_mma_usable,
                                              decode_mma_workspace, decode_mma_launch};
const Tier<Args> gpu_w4a16_decode_frag_tier = {QG_GPU_RUNTIME_NAME ":decode_frag", 2, decode_frag_usable,
                                               decode_frag_workspace, decode_frag_launch};

// ================================================================ repack on the device

qg_status frag_launch::repack(const RepackParams& p, qg_stream stream) {
    const frag::Geometry geo(p.n, p.k, p.group_size);
    const hipStream_t s = static_cast<hipStream_t>(stream);
    const int64_t w_bytes = p.gguf != nullptr ? gguf_frag::weights_plane_bytes(p.gguf_format, geo) : geo.qweight_bytes();
    repack_frag_weights<<<static_cast<unsigned>(ceil_div(w_bytes / 4, REPACK_THREADS)), REPACK_THREADS, 0, s>>>(p);
    qg_status st = gpu_check_launch("frag repack (weights)");
    if (st != QG_OK) return st;
    repack_frag_scales<<<static_cast<unsigned>(ceil_div(geo.qzeros_bytes(), REPACK_THREADS)), REPACK_THREADS, 0, s>>>(p);
    return gpu_check_launch("frag repack (scales, zeros)");
}

qg_status gpu_w4a16_repack(const qg_context*, const qg_w4a16_repack_args& a, qg_stream stream) {
    RepackParams p{};
    p.qweight = reinterpret_cast<const uint32_t*>(a.qweight);
    p.scales = static_cast<const uint16_t*>(a.scales);
    p.qzeros = reinterpret_cast<const uint32_t*>(a.qzeros);
    p.out_qweight = static_cast<uint32_t*>(a.out_qweight);
    p.out_scales = static_cast<uint16_t*>(a.out_scales);
    p.out_qzeros = static_cast<uint8_t*>(a.out_qzeros);
    p.n = a.n;
    p.k = a.k;
    p.group_size = a.group_size;
    return frag_launch::repack(p, stream);
}

}  // namespace qg
