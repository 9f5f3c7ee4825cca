// MXFP4 mixture of experts on the CPU tier: align, stage 1 (gate_up GEMM + activation),
// stage 2 (down GEMM + bias + top-k weighted sum). Semantics in quantgemm.h; pair
// p = t * top_k + j is token t's j-th expert, T * top_k marks a padding slot.
#include <math.h>

#include <algorithm>
#include <vector>

#include "cpu/convert.h"
#include "cpu/dequant.h"
#include "moe_sizes.h"
#include "cpu/parallel.h"
#include "cpu/tile_gemm.h"
#include "tiers.h"

namespace qg {

namespace {

constexpr int MAX_TILE_M = 256;

// The routing tables come from qg_moe_align, or from the caller: check them before any
// output is written. Returns the number of tiles in use.
qg_status check_routing(const char* stage, int64_t T, int32_t top_k, int32_t E, int32_t tile_m,
                        const int32_t* sorted_ids, const int32_t* tile_experts, const int32_t* num_sorted,
                        int64_t* n_tiles) {
    int64_t max_sorted, max_tiles;
    moe_align_sizes(T, top_k, E, tile_m, &max_sorted, &max_tiles);
    const int64_t ns = num_sorted[0];
    if (ns < 0 || ns % tile_m != 0 || ns > max_sorted)
        return set_error(QG_ERR_INVALID_ARGUMENT,
                         "%s: num_sorted=%lld is not a multiple of tile_m=%d in [0, max_sorted=%lld]", stage,
                         (long long)ns, tile_m, (long long)max_sorted);
    const int64_t pad = T * top_k;
    for (int64_t i = 0; i < ns; ++i) {
        if (sorted_ids[i] < 0 || sorted_ids[i] > pad)
            return set_error(QG_ERR_INVALID_ARGUMENT,
                             "%s: sorted_ids[%lld]=%d is not a pair index in [0, T*top_k=%lld] (T*top_k pads)",
                             stage, (long long)i, sorted_ids[i], (long long)pad);
    }
    for (int64_t i = 0; i < ns / tile_m; ++i) {
        if (tile_experts[i] < -1 || tile_experts[i] >= E)
            return set_error(QG_ERR_INVALID_ARGUMENT, "%s: tile_experts[%lld]=%d is not in [-1, num_experts=%d)",
                             stage, (long long)i, tile_experts[i], E);
    }
    *n_tiles = ns / tile_m;
    return QG_OK;
}

// The real (non-padding) pairs of one tile, and their activation rows.
struct TileRows {
    int count = 0;
    int32_t pair[MAX_TILE_M];
    const float* row[MAX_TILE_M];
};

template <class RowOf>
void gather(const int32_t* sorted_ids, int64_t tile, int32_t tile_m, int64_t pad, RowOf&& row_of, TileRows* out) {
    out->count = 0;
    for (int s = 0; s < tile_m; ++s) {
        const int32_t p = sorted_ids[tile * tile_m + s];
        if (p == pad) continue;
        out->pair[out->count] = p;
        out->row[out->count] = row_of(p);
        ++out->count;
    }
}

// Rows [0, rows) of a float-like matrix with row stride ld elements, as float rows:
// pointers into the caller's array for F32, else into a converted copy.
std::vector<const float*> float_rows(qg_dtype dt, const void* src, int64_t rows, int64_t cols, int64_t ld,
                                     std::vector<float>* copy) {
    std::vector<const float*> out((size_t)rows);
    if (dt == QG_DTYPE_F32) {
        for (int64_t r = 0; r < rows; ++r) out[r] = (const float*)src + r * ld;
        return out;
    }
    copy->resize((size_t)(rows * cols));
    const int esize = cpu::dtype_bytes(dt);
    for (int64_t r = 0; r < rows; ++r) {
        cpu::to_float_row(dt, (const char*)src + r * ld * esize, cols, copy->data() + r * cols);
        out[r] = copy->data() + r * cols;
    }
    return out;
}

inline float activation(qg_activation act, float g, float u, float alpha, float limit) {
    if (act == QG_ACT_SILU_GLU) return g / (1.0f + expf(-g)) * u;
    // GPT-OSS SwiGLU: gate clamped from above, up clamped both ways, then (u + 1)
    g = std::min(g, limit);
    u = std::min(std::max(u, -limit), limit);
    return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

}  // namespace

qg_status cpu_moe_align(const qg_context* ctx, const qg_moe_align_args* a) {
    const int64_t P = a->num_tokens * a->top_k;  // pairs; P is also the padding value
    const int32_t E = a->num_experts, tile_m = a->tile_m;
    std::vector<int64_t> count((size_t)E, 0);
    for (int64_t p = 0; p < P; ++p) {
        const int32_t e = a->topk_ids[p];
        if (e < 0 || e >= E)
            return set_error(QG_ERR_INVALID_ARGUMENT, "topk_ids[%lld]=%d is not in [0, num_experts=%d)",
                             (long long)p, e, E);
        ++count[e];
    }
    int64_t max_sorted, max_tiles;
    moe_align_sizes(a->num_tokens, a->top_k, E, tile_m, &max_sorted, &max_tiles);

    // expert e owns slots [start[e], start[e] + count[e] rounded up to tile_m)
    std::vector<int64_t> start((size_t)E + 1, 0);
    for (int32_t e = 0; e < E; ++e) start[e + 1] = start[e] + (count[e] + tile_m - 1) / tile_m * tile_m;
    const int64_t total = start[E];

    std::fill(a->sorted_ids, a->sorted_ids + max_sorted, (int32_t)P);
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < P; ++p) a->sorted_ids[fill[a->topk_ids[p]]++] = (int32_t)p;  // stable: p ascending

    int64_t tile = 0;
    for (int32_t e = 0; e < E; ++e)
        for (int64_t s = start[e]; s < start[e + 1]; s += tile_m) a->tile_experts[tile++] = e;
    for (; tile < max_tiles; ++tile) a->tile_experts[tile] = -1;
    a->num_sorted[0] = (int32_t)total;
    return QG_OK;
}

qg_status cpu_moe_stage1(const qg_context* ctx, const qg_moe_stage1_args* a) {
    const int64_t T = a->num_tokens, H = a->hidden, I = a->intermediate, P = T * a->top_k;
    int64_t n_tiles = 0;
    if (qg_status st = check_routing("qg_moe_stage1", T, a->top_k, a->num_experts, a->tile_m, a->sorted_ids,
                                     a->tile_experts, a->num_sorted, &n_tiles))
        return st;

    std::vector<float> xcopy;
    const std::vector<const float*> xrows = float_rows(a->x_dtype, a->x, T, H, a->ldx, &xcopy);
    const int64_t hblk = H / MXFP4_BLOCK;           // blocks per w13 row
    const bool concat = a->gate_up_layout == QG_GATE_UP_CONCAT;
    constexpr int IB = cpu::TILE_N / 2;             // intermediate columns per task: IB gate + IB up rows
    const int64_t n_iblk = (I + IB - 1) / IB;

    cpu::parallel_for(n_tiles * n_iblk, cpu::thread_count(ctx), [&](int64_t task, int) {
        const int64_t tile = task / n_iblk, i0 = (task % n_iblk) * IB;
        const int32_t e = a->tile_experts[tile];
        if (e < 0) return;
        TileRows tr;
        gather(a->sorted_ids, tile, a->tile_m, P, [&](int32_t p) { return xrows[p / a->top_k]; }, &tr);
        if (tr.count == 0) return;
        const int nb = (int)std::min<int64_t>(IB, I - i0);
        const int R = 2 * nb;
        // tile row r < nb is gate column i0 + r, row nb + r is up column i0 + r
        auto w13_row = [&](int r) -> int64_t {
            const int64_t i = i0 + (r < nb ? r : r - nb);
            const bool up = r >= nb;
            return (int64_t)e * 2 * I + (concat ? (up ? I + i : i) : (2 * i + (up ? 1 : 0)));
        };
        float* acc = cpu::scratch_floats((size_t)tr.count * R, 0);
        cpu::tile_gemm(
            tr.row, tr.count, R, H,
            [&](int r, int64_t k0, int64_t kc, float* dst) {
                const int64_t row = w13_row(r);
                cpu::decode_mxfp4_row(a->w13_blocks + row * hblk * MXFP4_BLOCK_BYTES, a->w13_scales + row * hblk,
                                      k0 / MXFP4_BLOCK, kc / MXFP4_BLOCK, dst);
            },
            acc);
        for (int q = 0; q < tr.count; ++q) {
            for (int c = 0; c < nb; ++c) {
                float g = acc[q * R + c], u = acc[q * R + nb + c];
                if (a->w13_bias != nullptr) {
                    g += cpu::load_float(a->bias_dtype, a->w13_bias, w13_row(c));
                    u += cpu::load_float(a->bias_dtype, a->w13_bias, w13_row(nb + c));
                }
                const float v = activation(a->activation, g, u, a->swiglu_alpha, a->swiglu_limit);
                cpu::store_float(a->x_dtype, a->act, (int64_t)tr.pair[q] * I + i0 + c, v);
            }
        }
    });
    return QG_OK;
}

qg_status cpu_moe_stage2(const qg_context* ctx, const qg_moe_stage2_args* a) {
    const int64_t T = a->num_tokens, H = a->hidden, I = a->intermediate, P = T * a->top_k;
    int64_t n_tiles = 0;
    if (qg_status st = check_routing("qg_moe_stage2", T, a->top_k, a->num_experts, a->tile_m, a->sorted_ids,
                                     a->tile_experts, a->num_sorted, &n_tiles))
        return st;

    std::vector<float> actcopy;
    const std::vector<const float*> arows = float_rows(a->act_dtype, a->act, P, I, I, &actcopy);
    // out[p, h] = act[p] . w2[e, h] + b2[e, h] in fp32; pairs no tile covers stay 0
    std::vector<float> out((size_t)(P * H), 0.0f);
    const int64_t iblk = I / MXFP4_BLOCK;  // blocks per w2 row
    const int64_t n_hblk = (H + cpu::TILE_N - 1) / cpu::TILE_N;
    const int threads = cpu::thread_count(ctx);

    cpu::parallel_for(n_tiles * n_hblk, threads, [&](int64_t task, int) {
        const int64_t tile = task / n_hblk, h0 = (task % n_hblk) * cpu::TILE_N;
        const int32_t e = a->tile_experts[tile];
        if (e < 0) return;
        TileRows tr;
        gather(a->sorted_ids, tile, a->tile_m, P, [&](int32_t p) { return arows[p]; }, &tr);
        if (tr.count == 0) return;
        const int R = (int)std::min<int64_t>(cpu::TILE_N, H - h0);
        float* acc = cpu::scratch_floats((size_t)tr.count * R, 0);
        cpu::tile_gemm(
            tr.row, tr.count, R, I,
            [&](int r, int64_t k0, int64_t kc, float* dst) {
                const int64_t row = (int64_t)e * H + h0 + r;
                cpu::decode_mxfp4_row(a->w2_blocks + row * iblk * MXFP4_BLOCK_BYTES, a->w2_scales + row * iblk,
                                      k0 / MXFP4_BLOCK, kc / MXFP4_BLOCK, dst);
            },
            acc);
        for (int q = 0; q < tr.count; ++q) {
            float* o = out.data() + (int64_t)tr.pair[q] * H + h0;
            for (int r = 0; r < R; ++r) {
                float v = acc[q * R + r];
                if (a->w2_bias != nullptr) v += cpu::load_float(a->bias_dtype, a->w2_bias, (int64_t)e * H + h0 + r);
                o[r] = v;
            }
        }
    });

    // y[t, h] = sum_j topk_weights[t, j] * out[t*top_k + j, h]: fp32 across the k experts
    // (j ascending), one rounding to y_dtype at the end
    const int64_t top_k = a->top_k;
    cpu::parallel_for(T, threads, [&](int64_t t, int) {
        for (int64_t h = 0; h < H; ++h) {
            float s = 0.0f;
            for (int64_t j = 0; j < top_k; ++j) s += a->topk_weights[t * top_k + j] * out[(t * top_k + j) * H + h];
            cpu::store_float(a->y_dtype, a->y, t * a->ldy + h, s);
        }
    });
    return QG_OK;
}

}  // namespace qg
