// The W4A16 frag layout: sizes and element positions, shared by the CPU repack
// (src/w4a16_layout.cpp), the GPU repack kernel (hip/w4a16_repack.hip) and the GPU tiers
// that read it. pyquant/formats/int4_frag.py is the specification (with a worked table);
// docs/w4a16-layout.md says why the layout is what it is.
//
//   qweight  int32 [RB][KT][32 lanes][4 words]   tile (rb, kt) = rows 16rb.., k 64kt..
//   scales   16-bit [RB][KC][8 g][GC][2]         (s[16rb+g], s[16rb+g+8]) per group
//   qzeros   uint8 [RB][KC][8 g][GC]             z[16rb+g] | z[16rb+g+8] << 4
// RB = Np/16, KT = Kp/64, KC = Kp/128, GC = 128/G; Np = N rounded up to 16, Kp = K rounded
// up to 128 (padding: q = 0, zero 0, scale 0).
#pragma once

#include <stddef.h>
#include <stdint.h>

// Callable from host and device code: the GPU compilers (nvcc, hipcc/clang -x hip) define
// __CUDACC__ or __HIPCC__ and know __host__ __device__; a host compiler does not.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define QG_FRAG_HD __host__ __device__
#else
#define QG_FRAG_HD
#endif

namespace qg {
namespace frag {

constexpr int kRowBlock = 16;                 // rows of a tile: the mma M of one warp
constexpr int kKTile = 64;                    // k of a tile: 4 k16 mma steps
constexpr int kKChunk = 128;                  // k of one scale/zero record (K padding unit)
constexpr int kLanes = 32;
constexpr int kWordsPerLane = 4;              // one 16-byte load: the A fragments of 4 k16 steps
constexpr int kTileWords = kLanes * kWordsPerLane;   // 128 words = 512 bytes
constexpr int kTileBytes = kTileWords * 4;

QG_FRAG_HD inline int64_t padded_n(int64_t n) { return (n + kRowBlock - 1) / kRowBlock * kRowBlock; }
QG_FRAG_HD inline int64_t padded_k(int64_t k) { return (k + kKChunk - 1) / kKChunk * kKChunk; }

// Element position of nibble j (0..7) of word s (0..3) of lane `lane` in a tile: the row in
// the 16-row block and the k in the 64-k tile. p = j % 4 is the A register (a0..a3 of the
// PTX m16n8k16 layout: rows g / g+8, k 2t / 2t+8), h = j / 4 its 16-bit half.
QG_FRAG_HD inline int nibble_row(int lane, int j) { return (lane >> 2) + 8 * (j & 1); }
QG_FRAG_HD inline int nibble_k(int lane, int s, int j) {
    return 16 * s + 2 * (lane & 3) + (j >> 2) + 8 * ((j >> 1) & 1);
}

// The inverse: where q[n][k] lives. Returns the index of its word in the qweight plane
// (k_tiles = Kp / 64) and sets *shift to its bit position in that word.
QG_FRAG_HD inline int64_t q_word_index(int64_t k_tiles, int64_t n, int64_t k, int* shift) {
    const int r = static_cast<int>(n % kRowBlock), kk = static_cast<int>(k % kKTile);
    const int s = kk / 16, c = kk % 16;                 // k16 step, k inside it
    const int p = (r >= 8 ? 1 : 0) + (c >= 8 ? 2 : 0);  // A register a0..a3
    const int lane = 4 * (r % 8) + (c % 8) / 2, j = p + 4 * (c % 2);
    *shift = 4 * j;
    return (((n / kRowBlock) * k_tiles + k / kKTile) * kLanes + lane) * kWordsPerLane + s;
}

// MXFP4 in the frag layout (qg_mxfp4_repack): the planes of G = 32, E2M1 codes as the nibbles,
// each E8M0 scale e as the bf16 bits of 2^(e - 127), exact: e << 7, the subnormal 0x0040 for
// e = 0, NaN (0x7fc0) for e = 255. e8m0_of_bf16 is the inverse on those values.
QG_FRAG_HD inline uint16_t e8m0_bf16(uint8_t e) {
    return e == 0 ? uint16_t(0x0040) : e == 255 ? uint16_t(0x7fc0) : static_cast<uint16_t>(e << 7);
}
QG_FRAG_HD inline uint8_t e8m0_of_bf16(uint16_t b) {
    return b == 0x0040 ? uint8_t(0) : b == 0x7fc0 ? uint8_t(255) : static_cast<uint8_t>(b >> 7);
}

struct Geometry {
    int64_t n, k;          // logical shape
    int group_size;        // G
    int64_t row_blocks;    // RB
    int64_t k_tiles;       // KT
    int64_t k_chunks;      // KC
    int groups_per_chunk;  // GC
    int64_t groups;        // K / G (logical)

    QG_FRAG_HD Geometry(int64_t n_, int64_t k_, int g)
        : n(n_), k(k_), group_size(g), row_blocks(padded_n(n_) / kRowBlock), k_tiles(padded_k(k_) / kKTile),
          k_chunks(padded_k(k_) / kKChunk), groups_per_chunk(kKChunk / g), groups(k_ / g) {}

    // bytes of each plane
    QG_FRAG_HD int64_t qweight_bytes() const { return row_blocks * k_tiles * kTileBytes; }
    QG_FRAG_HD int64_t scale_count() const { return row_blocks * k_chunks * 8 * groups_per_chunk * 2; }
    QG_FRAG_HD int64_t scales_bytes() const { return scale_count() * 2; }
    QG_FRAG_HD int64_t qzeros_bytes() const { return row_blocks * k_chunks * 8 * groups_per_chunk; }

    // index of the scale of (row block rb, chunk kc, lane row g, group c of the chunk, half h)
    QG_FRAG_HD int64_t scale_index(int64_t rb, int64_t kc, int g, int c, int h) const {
        return (((rb * k_chunks + kc) * 8 + g) * groups_per_chunk + c) * 2 + h;
    }
    QG_FRAG_HD int64_t zero_index(int64_t rb, int64_t kc, int g, int c) const {
        return ((rb * k_chunks + kc) * 8 + g) * groups_per_chunk + c;
    }
};

}  // namespace frag
}  // namespace qg
