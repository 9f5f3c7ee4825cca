// The CPU tier's row decoders (declared in cpu/dequant.h): the block math of dequant.h
// applied along a row, compiled once per x86-64 ISA level (cpu/clones.h) so that the
// element loops vectorise with the machine's widest registers. Still built with
// -ffp-contract=off: every clone rounds each step as gguf-py does, bit for bit.
#include "cpu/clones.h"
#include "cpu/dequant.h"

namespace qg {
namespace cpu {

namespace {
template <class Block>
inline void decode_blocks(const uint8_t* row, int64_t b0, int64_t nb, float* out) {
    prefetch_range(row, (b0 + nb) * (int64_t)sizeof(Block), nb * (int64_t)sizeof(Block));
    for (int64_t i = 0; i < nb; ++i) {
        Decoder<Block>::decode(row + (b0 + i) * (int64_t)sizeof(Block), out + i * Decoder<Block>::elems);
    }
}
}  // namespace

#define QG_X(NAME, BLOCK, ELEMS)                                                                    \
    QG_CPU_CLONES void decode_row_blocks(const BLOCK*, const uint8_t* row, int64_t b0, int64_t nb, \
                                         float* out) {                                             \
        decode_blocks<BLOCK>(row, b0, nb, out);                                                    \
    }
QG_GGUF_FORMATS(QG_X)
#undef QG_X

QG_CPU_CLONES void decode_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t b0, int64_t nb, float* out) {
    prefetch_range(blocks, (b0 + nb) * MXFP4_BLOCK_BYTES, nb * MXFP4_BLOCK_BYTES);
    prefetch_range(scales, b0 + nb, nb);
    for (int64_t i = 0; i < nb; ++i) {
        lut16_pairs(kvalues_mxfp4_x2, blocks + (b0 + i) * MXFP4_BLOCK_BYTES, e8m0_half(scales[b0 + i]),
                    out + i * MXFP4_BLOCK);
    }
}

QG_CPU_CLONES void decode_int4_row(const int32_t* qweight_row, const void* scales_row, qg_dtype scale_dtype,
                                   const int32_t* qzeros, int64_t n, int64_t groups_per_row, int group_size,
                                   int64_t k0, int64_t kc, float* out) {
    prefetch_range(qweight_row, (k0 + kc) / 2, kc / 2);
    const int sb = dtype_bytes(scale_dtype);
    prefetch_range(scales_row, (k0 + kc) / group_size * sb, kc / group_size * sb);
    for (int64_t k = k0; k < k0 + kc; k += group_size) {
        const int64_t g = k / group_size;
        const float s = load_float(scale_dtype, scales_row, g);
        const int z = qzeros == nullptr
                          ? 8
                          : (int)(((uint32_t)qzeros[(n / 8) * groups_per_row + g] >> (4 * (n % 8))) & 15u);
        // byte i of the little-endian words holds elements 2i (low nibble) and 2i + 1
        const uint8_t* __restrict__ bytes = (const uint8_t*)(qweight_row + k / 8);
        float* __restrict__ o = out + (k - k0);
        for (int i = 0; i < group_size / 2; ++i) {
            o[2 * i] = (float)((int)(bytes[i] & 15u) - z) * s;
            o[2 * i + 1] = (float)((int)(bytes[i] >> 4) - z) * s;
        }
    }
}

}  // namespace cpu
}  // namespace qg
