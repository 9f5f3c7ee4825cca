// y[M, N] = x[M, K] @ W[N, K]^T for one weight of any format, on the CPU tier:
// rows of x in blocks of M_BLOCK (converted to float once), weight rows in parallel
// tiles of TILE_N (each decoded once per M block, see tile_gemm.h).
#pragma once

#include <stdint.h>

#include <algorithm>
#include <vector>

#include "cpu/convert.h"
#include "cpu/parallel.h"
#include "cpu/tile_gemm.h"

namespace qg {
namespace cpu {

// Activation rows per pass: bounds the float copy of x (256 x K) and the per-tile
// accumulators (256 x 16 floats = 16 KiB); every weight tile is decoded once per pass.
constexpr int64_t M_BLOCK = 256;

constexpr int64_t MIN_WORK_PER_THREAD = 1 << 16;

// Threads for an M x N x K GEMM. cpu_threads = 0 (automatic): a helper costs a wake-up
// (about 5 us), so each thread gets at least MIN_WORK_PER_THREAD units of work (5-10 us),
// a unit being one weight element decoded or four multiply-adds of it (decoding costs
// about as much as four activation rows). An explicit cpu_threads is used as given (up to
// one thread per tile).
inline int gemm_threads(const qg_context* ctx, int64_t M, int64_t N, int64_t K) {
    int threads = thread_count(ctx);
    if (ctx == nullptr || ctx->cpu_threads <= 0) {
        const double work = (double)N * (double)K * (1.0 + (double)M / 4.0);
        threads = (int)std::max(1.0, std::min((double)threads, work / (double)MIN_WORK_PER_THREAD));
    }
    return threads;
}

// decode(n, k0, kc, dst): dequantized elements [k0, k0 + kc) of weight row n.
// store(m, n, v): writes the fp32 result v of y[m, n] (rounding is the caller's).
template <class Decode, class Store>
void dense_gemm(const qg_context* ctx, int64_t M, int64_t N, int64_t K, qg_dtype x_dtype, const void* x,
                int64_t ldx, Decode&& decode, Store&& store) {
    const int threads = gemm_threads(ctx, M, N, K);
    const int64_t n_tiles = (N + TILE_N - 1) / TILE_N;
    const int esize = dtype_bytes(x_dtype);
    std::vector<float> xf;
    std::vector<const float*> xrows;
    for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int64_t mb = std::min(M_BLOCK, M - m0);
        xrows.resize(mb);
        if (x_dtype == QG_DTYPE_F32) {
            for (int64_t i = 0; i < mb; ++i) xrows[i] = (const float*)x + (m0 + i) * ldx;
        } else {
            xf.resize((size_t)(mb * K));
            for (int64_t i = 0; i < mb; ++i) {
                to_float_row(x_dtype, (const char*)x + (m0 + i) * ldx * esize, K, xf.data() + i * K);
                xrows[i] = xf.data() + i * K;
            }
        }
        parallel_for(n_tiles, threads, [&](int64_t t, int) {
            const int64_t n0 = t * TILE_N;
            const int R = (int)std::min<int64_t>(TILE_N, N - n0);
            float* acc = scratch_floats((size_t)(mb * R), 0);
            tile_gemm(
                xrows.data(), mb, R, K, [&](int r, int64_t k0, int64_t kc, float* dst) { decode(n0 + r, k0, kc, dst); },
                acc);
            for (int64_t i = 0; i < mb; ++i)
                for (int r = 0; r < R; ++r) store(m0 + i, n0 + r, acc[i * R + r]);
        });
    }
}

}  // namespace cpu
}  // namespace qg
