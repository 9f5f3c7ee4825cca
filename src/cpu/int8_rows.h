// The int8 path's small-M kernels (int8_rows.cpp): M <= ROWS_M activation rows at a time
// against 8 weight rows read in their own layout and decoded in registers; the panel
// path's arithmetic (int8_kernels.h), so the same bits. AVX2 and up; rows_available()
// says whether this process has them (else the panel path serves every M).
#pragma once

#include <stdint.h>

#include "cpu/int8_decode.h"
#include "cpu/int8_kernels.h"

namespace qg {
namespace cpu {

constexpr int ROWS_GROUP = 8;  // weight rows per call
// Activation rows per pass. Each weight block is decoded once per pass; up to this M the
// decode in registers beat the panel (bench/NOTES.md, "CPU tier").
constexpr int ROWS_M = 2;
// The largest M the driver sends here rather than to the panel kernels.
constexpr int64_t ROWS_MAX_M = 2;

bool rows_available();

// acc[m * PANEL_ROWS + r] (m < x.m, r < 8) continues with weight rows row[0..7], all of K;
// ok[r] &= every scale of row r is finite.
#define QG_X(NAME, BLOCK, ELEMS) \
    void rows_gguf(const BLOCK*, const uint8_t* const* row, int64_t K, const Q8Rows& x, float* acc, bool* ok);
QG_GGUF_FORMATS(QG_X)
#undef QG_X

void rows_mxfp4(const uint8_t* const* blocks, const uint8_t* const* scales, int64_t K, const Q8Rows& x, float* acc,
                bool* ok);

struct RowsInt4 {
    const int32_t* qweight[ROWS_GROUP];  // row starts, [K/8] words
    const void* scales_row[ROWS_GROUP];  // [K/G]
    int64_t n[ROWS_GROUP];               // row indices (zero-points)
    qg_dtype scale_dtype;
    const int32_t* qzeros;               // [N/8][K/G] or null (symmetric)
    int64_t groups;                      // K/G
    int group_size;
};
void rows_int4(const RowsInt4& w, int64_t K, const Q8Rows& x, float* acc, bool* ok);

}  // namespace cpu
}  // namespace qg
