// The int8 path's row decoders (int8_rows.cpp), one per format, reading weight rows in
// their own layout, a pass of 8 (ymm) or 16 (zmm) at a time, into registers. Two uses, with
// the panel path's arithmetic (int8_kernels.h) and so the same bits:
//   rows_kernel: small M, the decoded codes multiplied at once (no panel);
//   panel_fill:  a 16-row panel for the panel kernels, decoded and interleaved in one pass
//                (AVX2, 8 rows at a time).
// AVX2 and up; rows_available() says whether this process has them (else the portable
// decoders of int8_decode.h and panel_interleave serve every M).
#pragma once

#include <stdint.h>

#include "cpu/int8_decode.h"
#include "cpu/int8_kernels.h"

namespace qg {
namespace cpu {

constexpr int ROWS_GROUP = 8;  // weight rows per pass of the ymm decoders (zmm: PANEL_ROWS)
// Activation rows per pass of rows_kernel; each weight block is decoded once per pass.
constexpr int ROWS_M = 2;

bool rows_available();

// The largest M the driver gives rows_kernel rather than the panels (bench/NOTES.md, "CPU
// tier"): 4 on AVX2, where the panels measured 1.3-5x slower at M = 4 and even at M = 8
// (Zen 1); 2 with AVX-512 VNNI, whose panel dot (vpdpbusd, 16 rows a zmm) made the panels
// faster from M = 3 on and even at M = 2 (Zen 5). Either choice gives the same bits.
int64_t rows_max_m();

// The weight rows of one panel (PANEL_ROWS of them; rows past the weight's last repeat it),
// in the format's own layout. The codes' pointers (and MXFP4's scales') go on for the next
// panel's rows (SRC_ROWS in all; past the weight's last row, the last), which the decoders
// only prefetch: a pass prefetches the rows a pass further on.
constexpr int SRC_ROWS = 2 * PANEL_ROWS;
template <class Block>
struct GgufSrc {
    const uint8_t* row[SRC_ROWS];                // where each row's block 0 starts
    int64_t stride = (int64_t)sizeof(Block);     // bytes from a block of a row to its next: the
                                                 // .gguf rows', or 8 blocks (the rows8 layout)
};
struct Mxfp4Src {
    const uint8_t* blocks[SRC_ROWS];    // [K/32][16] of each row
    const uint8_t* scales[SRC_ROWS];    // [K/32]
};
struct Int4Src {
    const int32_t* qweight[SRC_ROWS];    // [K/8] words of each row
    const void* scales_row[PANEL_ROWS];  // [K/G]
    int64_t n[PANEL_ROWS];               // row indices (zero-points)
    qg_dtype scale_dtype;
    const int32_t* qzeros;               // [N/8][K/G] or null (symmetric)
    int64_t groups;                      // K/G
    int group_size;
};

// Where a panel goes (int8_kernels.h's Panel layout, writable).
struct PanelOut {
    int8_t* codes;
    float* sw;
    float* mw;
    int32_t* sub;
};

// rows_kernel: acc[m * PANEL_ROWS + r] (m < x.m, r < count, the panel's real rows; rows
// up to the pass's end may be computed too, repeating the last) continues with weight row r
// of src over all of K; ok[r] &= every scale of row r is finite.
// panel_fill: k in [k0, k0 + kc) of the 16 rows into out; ok as above.
#define QG_X(NAME, BLOCK, ELEMS)                                                                         \
    void rows_kernel(const GgufSrc<BLOCK>& src, int count, int64_t K, const Q8Rows& x, float* acc, bool* ok); \
    void panel_fill(const GgufSrc<BLOCK>& src, int64_t k0, int64_t kc, const PanelOut& out, bool* ok);
QG_GGUF_FORMATS(QG_X)
#undef QG_X
void rows_kernel(const Mxfp4Src& src, int count, int64_t K, const Q8Rows& x, float* acc, bool* ok);
void panel_fill(const Mxfp4Src& src, int64_t k0, int64_t kc, const PanelOut& out, bool* ok);
void rows_kernel(const Int4Src& src, int count, int64_t K, const Q8Rows& x, float* acc, bool* ok);
void panel_fill(const Int4Src& src, int64_t k0, int64_t kc, const PanelOut& out, bool* ok);

}  // namespace cpu
}  // namespace qg
