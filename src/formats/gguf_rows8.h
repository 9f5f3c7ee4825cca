// The GGUF rows8 layout (QG_GGUF_LAYOUT_ROWS8, include/quantgemm.h): the .gguf blocks of
// each 8 consecutive rows side by side, block by block, so that a pass of the CPU rows
// kernel (8 rows, src/cpu/int8_rows.h) reads one stream. Blocks are moved whole: every bit
// of the block layout, and the CPU tier's arithmetic on them, is kept. N is padded to a
// multiple of 8 with zero blocks (scale 0). pyquant/formats/gguf_rows8.py is the same
// mapping in numpy, which the tests hold the repack to byte for byte.
//
//   w block index of (row n, block b), nb = K / block_elems blocks a row:
//     (n / 8 * nb + b) * 8 + n % 8
//   e.g. nb = 5: row 0 -> 0, 8, 16, ..; row 7 -> 7, 15, ..; row 8 -> 40, 48, ..
#pragma once

#include <stdint.h>

namespace qg {
namespace gguf_rows8 {

constexpr int64_t kRows = 8;  // rows side by side (the ymm rows kernel's pass)

inline int64_t padded_rows(int64_t n) { return (n + kRows - 1) / kRows * kRows; }
// Bytes of the plane of an [n, nb blocks] weight of block_bytes blocks.
inline int64_t plane_bytes(int64_t n, int64_t nb, int64_t block_bytes) { return padded_rows(n) * nb * block_bytes; }
// Byte offset of block b of row n.
inline int64_t block_offset(int64_t n, int64_t b, int64_t nb, int64_t block_bytes) {
    return ((n / kRows * nb + b) * kRows + n % kRows) * block_bytes;
}
// Bytes from one block of a row to its next.
inline int64_t block_stride(int64_t block_bytes) { return kRows * block_bytes; }

}  // namespace gguf_rows8
}  // namespace qg
