// The CPU tier's one GEMM loop, shared by every format: decode weight rows for one K
// chunk into a float buffer once, then dot them against every activation row.
//
//   for each K chunk (TILE_K elements, a multiple of every block and group size):
//     for each group of GROUP_ROWS rows g of the tile (R <= TILE_N rows):
//       wbuf[r, :] = decode(row r, chunk)                       r in g
//       acc[m, r] += xrows[m][chunk] . wbuf[r, :]               m < M, r in g
//
// Activation rows are passed as pointers (float, already converted), so a MoE tile
// gathers its token rows for free.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <vector>

namespace qg {
namespace cpu {

constexpr int TILE_N = 16;       // weight rows decoded together (one parallel task)
// K chunk. Long chunks keep each row's bytes one sequential run that the row decoders
// prefetch ahead (dequant.h); at 256 the M = 1 GEMM was latency-bound on cold weights
// (bench/NOTES.md, "CPU tier").
constexpr int64_t TILE_K = 1024;
// Rows decoded per dot: 4 rows x 1024 floats = 16 KiB stay in L1 while every activation
// row is multiplied with them (dot_tile takes 4 rows at a time). Decoding all 16 rows
// first (64 KiB, L2) measured 15-25 % slower at M = 8 and 64 (bench/NOTES.md, "CPU tier").
constexpr int GROUP_ROWS = 4;

// acc[m * ldacc + r] += sum_{k < kc} xrows[m][k_off + k] * w[r * ldw + k]   (kc % 16 == 0)
void dot_tile(const float* const* xrows, int64_t k_off, int64_t M, const float* w, int64_t ldw, int R,
              int64_t kc, float* acc, int64_t ldacc);

// Per-thread scratch that grows as needed and lives as long as the thread.
inline float* scratch_floats(size_t n, int slot = 0) {
    thread_local std::vector<float> buffers[3];
    std::vector<float>& b = buffers[slot];
    if (b.size() < n) b.resize(n);
    return b.data();
}

// acc[M, R] = xrows[M][0:K] . W_tile[R, 0:K]^T, with decode(r, k0, kc, dst) writing
// dequantized elements [k0, k0 + kc) of tile row r into dst.
template <class Decode>
void tile_gemm(const float* const* xrows, int64_t M, int R, int64_t K, Decode&& decode, float* acc) {
    float* wbuf = scratch_floats((size_t)GROUP_ROWS * TILE_K, 2);
    std::fill(acc, acc + M * R, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, K - k0);
        for (int r0 = 0; r0 < R; r0 += GROUP_ROWS) {
            const int rg = std::min(GROUP_ROWS, R - r0);
            for (int r = 0; r < rg; ++r) decode(r0 + r, k0, kc, wbuf + r * TILE_K);
            dot_tile(xrows, k0, M, wbuf, TILE_K, rg, kc, acc + r0, R);
        }
    }
}

}  // namespace cpu
}  // namespace qg
