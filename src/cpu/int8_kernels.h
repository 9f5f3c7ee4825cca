// The CPU tier's int8 path: weights decoded to signed int8 codes with a float scale per
// 32 elements of K, activations quantized to int8 per 32 elements (cpu/q8_act.h), and
// integer dot products (int8_dot.cpp: AVX2, AVX-512 VNNI, AMX, scalar).
//
// The arithmetic, the same at every ISA level (pyquant/formats/cpu_int8.py models it bit
// for bit). For output (m, n) and each 32-element block b of K in order, with w the codes
// of weight row n, q the activation codes of row m and sc the q6_K sub-block scales:
//   D   = sum_{k in b} w[k] * q[k]              exact int32 (q6_K: sum over its two halves h
//                                               of sc[h] * the half's sum), |D| < 2^24
//   acc = acc + float(D) * (sw[n,b] * dx[m,b])   two float32 products, one float32 sum
//   acc = acc - mw[n,b] * dS[m,b]                q4_K only: its min term, dS = dx * sum(q)
// starting from acc = 0; y[m, n] = acc. Each rounding is IEEE float32, no fused
// multiply-add (the library is built with -ffp-contract=off), so the vector width, the
// tiling and the thread count cannot change a bit.
//
// Weights reach the kernels as a panel: PANEL_ROWS rows x one K chunk, the codes
// interleaved by groups of 4 along K ("k4 groups") so that one 64-byte row of the panel is
// one k4 group of every row -- the layout of vpdpbusd on zmm and of an AMX B tile:
//
//   codes[((b * GROUPS + g) * PANEL_ROWS + r) * 4 + i] = code of row r, k = 32 b + 4 g + i
//
//   b: block, g: group 0..7, r: row 0..15, i: 0..3.  Block 0, rows 0..2:
//   byte  0.. 3: row 0, k 0..3    byte 64..67: row 0, k 4..7
//   byte  4.. 7: row 1, k 0..3    byte 68..71: row 1, k 4..7
//   byte  8..11: row 2, k 0..3    ...
#pragma once

#include <stddef.h>
#include <stdint.h>

// x86-64 kernels need GCC or clang (target attributes, <immintrin.h>); AMX intrinsics
// arrived in GCC 11 and clang 12. Elsewhere only the scalar kernels are built.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QG_INT8_X86 1
#define QG_INT8_HAVE_AVX2 1
#define QG_INT8_HAVE_AVX512 1
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)
#define QG_INT8_HAVE_AMX 1
#else
#define QG_INT8_HAVE_AMX 0
#endif
#else
#define QG_INT8_X86 0
#define QG_INT8_HAVE_AVX2 0
#define QG_INT8_HAVE_AVX512 0
#define QG_INT8_HAVE_AMX 0
#endif

namespace qg {
namespace cpu {

constexpr int PANEL_ROWS = 16;  // weight rows per panel (one parallel task, = TILE_N)
constexpr int Q8_BLOCK = 32;    // elements of K per activation scale and per weight scale
constexpr int GROUPS = Q8_BLOCK / 4;
constexpr int PANEL_BLOCK_BYTES = Q8_BLOCK * PANEL_ROWS;  // 512

// How a format's codes are stored and summed. vpmaddubsw multiplies an unsigned byte by a
// signed one and adds the products in pairs into int16 lanes:
//   offset >= 0: codes are stored unsigned, u = w + offset (4-bit formats: q4_0 keeps its
//                q = w + 8), and D = sum(u * q) - offset * S with S the activation sum;
//   offset < 0:  codes are stored as w (signed); the AVX2 kernels multiply |w| by q with
//                w's sign (vpsignb), the VNNI ones (w + 128) by q.
// i16_groups is how many k4 groups may add up in the int16 lanes before they are widened:
// i16_groups * 2 * max(stored code) * 127 <= 32767 (checked in int8_decode.h).
struct Int8Kind {
    int i16_groups;  // 1, 2, 4 or 8
    bool sub;        // q6_K: two int sub-block scales per block (sub[], one per 16 elements)
    bool mw;         // q4_K: a min term per block (mw[])
    int offset;      // see above; -1: signed codes
};

// One panel: PANEL_ROWS weight rows x nb blocks (rows past the weight's last are zeros).
struct Panel {
    const int8_t* codes;  // [nb][GROUPS][PANEL_ROWS][4], see above
    const float* sw;      // [nb][PANEL_ROWS]    scale of block b of row r
    const float* mw;      // [nb][PANEL_ROWS]    q4_K min term, else null
    const int32_t* sub;   // [nb][2][PANEL_ROWS] q6_K sub-block scale in both 16-bit halves, else null
    int64_t nb;
};

// M activation rows, quantized (cpu/q8_act.h), at the panel's K chunk.
struct Q8Rows {
    const int8_t* q;   // row m at q + m * ldq: the chunk's nb * 32 codes
    const float* dx;   // row m at dx + m * lds: nb block scales
    const float* dS;   // row m at dS + m * lds: nb values dx * float(sum of the block's codes)
    const int32_t* S;  // row m at S + m * lds: nb sums of the block's codes
    const int32_t* S16;  // row m at S16 + 2 * m * lds: 2 nb sums of 16 codes (q6_K on VNNI)
    int64_t ldq, lds;
    int64_t m;
};

// acc[m * PANEL_ROWS + r] = the arithmetic above over the panel's blocks, continued from
// its value (zero before a row's first chunk). One entry per ISA level; int8_dot.cpp
// picks by cpu::int8_isa().
void panel_dot(Int8Kind kind, const Panel& p, const Q8Rows& x, float* acc);

// AMX (int8_amx.cpp): a multiple of its passes' activation rows (16). The panel kernels use
// tiles from this M on, on the rows [0, M - M % AMX_MIN_M); AVX-512 VNNI takes the rest.
constexpr int AMX_MIN_M = 32;
// The most blocks a Panel holds on the AMX path (its signed copy of unsigned codes is a
// stack buffer): int8_gemm.h's K chunk, INT8_TILE_K, is 512 elements.
constexpr int64_t AMX_MAX_NB = 16;
// panel_dot on AMX tiles for activation rows [0, rows), rows % AMX_MIN_M == 0; false (and
// nothing done) for a kind it does not serve (one the formats do not use) or a panel of
// more than AMX_MAX_NB blocks.
bool panel_dot_amx(Int8Kind kind, const Panel& p, const Q8Rows& x, int64_t rows, float* acc);

// Row-major codes [PANEL_ROWS][ld] (blocks [0, nb) of each row) -> panel codes.
void panel_interleave(const int8_t* rows, int64_t ld, int64_t nb, int8_t* codes);

}  // namespace cpu
}  // namespace qg
