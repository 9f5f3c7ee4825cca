// The CPU tier's one GEMM loop, shared by every format: decode a tile of weight rows
// for one K chunk into a float buffer once, then dot it against every activation row.
//
//   for each K chunk (TILE_K elements, a multiple of every block and group size):
//       wbuf[r, :] = decode(row r of the tile, chunk)          r < R <= TILE_N
//       acc[m, r] += xrows[m][chunk] . wbuf[r, :]               m < M
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
// K chunk: 16 rows x 1024 floats = 64 KiB of decoded weights (L2). Long chunks keep each
// row's bytes one sequential run that the row decoders prefetch ahead (dequant.h); at
// 256 the M = 1 GEMM was latency-bound on cold weights (bench/NOTES.md, "CPU tier").
constexpr int64_t TILE_K = 1024;

// acc[m * R + r] += sum_{k < kc} xrows[m][k_off + k] * w[r * ldw + k]   (kc % 16 == 0)
void dot_tile(const float* const* xrows, int64_t k_off, int64_t M, const float* w, int64_t ldw, int R,
              int64_t kc, float* acc);

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
    float* wbuf = scratch_floats((size_t)TILE_N * TILE_K, 2);
    std::fill(acc, acc + M * R, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, K - k0);
        for (int r = 0; r < R; ++r) decode(r, k0, kc, wbuf + r * TILE_K);
        dot_tile(xrows, k0, M, wbuf, TILE_K, R, kc, acc);
    }
}

}  // namespace cpu
}  // namespace qg
