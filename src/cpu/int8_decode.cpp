// The int8 path's row decoders (declared in cpu/int8_decode.h, table there): the block
// layouts of formats/blocks.h as int8 codes and float32 scales. Compiled once per ISA
// level (cpu/clones.h); built with -ffp-contract=off like every decoder, so each scale is
// the float32 product gguf-py computes.
#include "cpu/int8_decode.h"

#include "cpu/clones.h"
#include "cpu/int8_blocks.h"

namespace qg {
namespace cpu {

namespace {

template <class Block>
QG_INLINE bool decode_blocks(const uint8_t* row, int64_t b0, int64_t nb, const Int8Out& out) {
    constexpr int sub32 = Decoder<Block>::elems / Q8_BLOCK;  // 32-element blocks per format block
    prefetch_range(row, (b0 + nb) * (int64_t)sizeof(Block), nb * (int64_t)sizeof(Block));
    bool ok = true;
    for (int64_t i = 0; i < nb; ++i) {
        const int64_t j = i * sub32;  // first 32-element block of this format block
        const uint8_t* b = row + (b0 + i) * (int64_t)sizeof(Block);
        ok &= Int8Block<Block>::scales(b, out.sw + j * PANEL_ROWS, out.mw ? out.mw + j * PANEL_ROWS : nullptr,
                                       out.sub ? out.sub + 2 * j * PANEL_ROWS : nullptr, PANEL_ROWS);
        Int8Block<Block>::codes(b, out.codes + j * Q8_BLOCK);
    }
    return ok;
}

}  // namespace

#define QG_X(NAME, BLOCK, ELEMS)                                                                              \
    QG_CPU_CLONES bool decode_int8_row(const BLOCK*, const uint8_t* row, int64_t b0, int64_t nb, const Int8Out& out) { \
        return decode_blocks<BLOCK>(row, b0, nb, out);                                                        \
    }
QG_GGUF_FORMATS(QG_X)
#undef QG_X

// MXFP4: element 2i = low nibble of byte i, 2i + 1 = its high nibble (E2M1 codes, doubled
// values, stored + 12: KIND_MXFP4); scales: mxfp4_scale (int8_blocks.h).
QG_CPU_CLONES bool decode_int8_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t b0, int64_t nb,
                                         const Int8Out& out) {
    prefetch_range(blocks, (b0 + nb) * MXFP4_BLOCK_BYTES, nb * MXFP4_BLOCK_BYTES);
    prefetch_range(scales, b0 + nb, nb);
    bool ok = true;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* __restrict__ q = blocks + (b0 + i) * MXFP4_BLOCK_BYTES;
        int8_t* __restrict__ o = out.codes + i * MXFP4_BLOCK;
        for (int j = 0; j < 16; ++j) {
            o[2 * j] = (int8_t)(kvalues_mxfp4_x2[q[j] & 15] + KIND_MXFP4.offset);
            o[2 * j + 1] = (int8_t)(kvalues_mxfp4_x2[q[j] >> 4] + KIND_MXFP4.offset);
        }
        ok &= mxfp4_scale(scales[b0 + i], out.sw + i * PANEL_ROWS);
    }
    return ok;
}

// int4: k in [k0, k0 + kc) of row n, w = q - z stored + 15 (KIND_INT4), sw = the group's scale (G >= 32, so every
// 32-element block lies in one group).
QG_CPU_CLONES bool decode_int8_int4_row(const int32_t* qweight_row, const void* scales_row, qg_dtype scale_dtype,
                                        const int32_t* qzeros, int64_t n, int64_t groups_per_row, int group_size,
                                        int64_t k0, int64_t kc, const Int8Out& out) {
    prefetch_range(qweight_row, (k0 + kc) / 2, kc / 2);
    const int sb = dtype_bytes(scale_dtype);
    prefetch_range(scales_row, (k0 + kc) / group_size * sb, kc / group_size * sb);
    bool ok = true;
    for (int64_t k = k0; k < k0 + kc; k += group_size) {
        float s;
        int bias;
        ok &= int4_group(scales_row, scale_dtype, qzeros, n, groups_per_row, k / group_size, &s, &bias);
        // byte i of the little-endian words holds elements 2i (low nibble) and 2i + 1
        const uint8_t* __restrict__ bytes = (const uint8_t*)(qweight_row + k / 8);
        int8_t* __restrict__ o = out.codes + (k - k0);
        for (int i = 0; i < group_size / 2; ++i) {
            o[2 * i] = (int8_t)((int)(bytes[i] & 15u) + bias);
            o[2 * i + 1] = (int8_t)((int)(bytes[i] >> 4) + bias);
        }
        for (int j = 0; j < group_size / Q8_BLOCK; ++j) out.sw[((k - k0) / Q8_BLOCK + j) * PANEL_ROWS] = s;
    }
    return ok;
}

}  // namespace cpu
}  // namespace qg
