// Host decoders of every quantized format: the ONE definition of each format's math
// in host code (gguf.cpp, mxfp4.cpp, moe.cpp and w4a16.cpp call these).
//
// GGUF decoders are bit-exact with gguf.quants.dequantize (gguf-py): the same float32
// operations in the same order, each rounded (the library is built with
// -ffp-contract=off so that no multiply-add is fused). The order is quoted above each
// decoder. Blocks are read through byte pointers: GGUF rows have a byte stride and
// blocks of 34 or 18 bytes, so fields are not naturally aligned.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/convert.h"
#include "formats/blocks.h"
#include "formats/iq_tables.h"

// The decoders read multi-byte words byte by byte (int4 qweight words, IQ3_XXS grid entries).
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the CPU tier's decoders assume a little-endian host"
#endif

namespace qg {
namespace cpu {

inline uint16_t ld_u16(const uint8_t* p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
inline uint32_t ld_u32(const uint8_t* p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
inline float ld_f16(const uint8_t* p) { return f16_to_f32(ld_u16(p)); }

// Asks for the cache lines of [base + offset, base + offset + bytes) ahead of use. The
// row decoders call it for the part of their row that the next K chunk will decode, so the
// row streams from memory while this chunk is decoded and multiplied. Past the row's end
// (or the buffer's) it is harmless: a prefetch never faults, and the address is formed as
// an integer, not by pointer arithmetic out of bounds. Measured: bench/NOTES.md, "CPU tier".
inline void prefetch_range(const void* base, int64_t offset, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
    const uintptr_t a = (uintptr_t)base + (uintptr_t)offset;
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch((const void*)(a + (uintptr_t)off));
#endif
}

static const int8_t kvalues_iq4nl[16] = QG_KVALUES_IQ4NL;

// 16-entry table lookups of 4-bit codes, scaled: the decoders of IQ4_XS and MXFP4.
//   lut16_run:   out[i] = scale * (float)table[(q[i] >> shift) & 15],       i < 16
//   lut16_pairs: out[2i] = scale * (float)table[q[i] & 15],
//                out[2i + 1] = scale * (float)table[q[i] >> 4],           i < 16
// With GCC's vector extensions the lookup is one byte shuffle (pshufb from SSSE3 on, so in
// the x86-64-v3/v4 clones) and the conversion two widenings; scalar code elsewhere. Either
// way each output is the same one rounding of scale * table value. A plain loop over the
// table instead compiles to gathers in the AVX2 clones, which measured slower than scalar
// code (bench/NOTES.md, "CPU tier").
#if defined(__GNUC__) && !defined(__clang__)
typedef int8_t qg_v16i8 __attribute__((vector_size(16)));
typedef uint8_t qg_v16u8 __attribute__((vector_size(16)));
typedef int32_t qg_v16i32 __attribute__((vector_size(64)));
typedef float qg_v16f __attribute__((vector_size(64)));

inline void lut16_store(qg_v16i8 table, qg_v16u8 idx, float scale, float* out) {
    const qg_v16i8 v = __builtin_shuffle(table, (qg_v16i8)idx);
    const qg_v16f r = __builtin_convertvector(__builtin_convertvector(v, qg_v16i32), qg_v16f) * scale;
    memcpy(out, &r, 64);
}

inline void lut16_run(const int8_t* table, const uint8_t* q, int shift, float scale, float* out) {
    qg_v16i8 t;
    qg_v16u8 c;
    memcpy(&t, table, 16);
    memcpy(&c, q, 16);
    lut16_store(t, (qg_v16u8)(c >> shift) & 15, scale, out);
}

inline void lut16_pairs(const int8_t* table, const uint8_t* q, float scale, float* out) {
    qg_v16i8 t;
    qg_v16u8 c;
    memcpy(&t, table, 16);
    memcpy(&c, q, 16);
    const qg_v16u8 lo = c & 15, hi = c >> 4;
    const qg_v16u8 first = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    const qg_v16u8 second = first + 8;  // 8, 24, 9, 25, ...
    lut16_store(t, __builtin_shuffle(lo, hi, first), scale, out);
    lut16_store(t, __builtin_shuffle(lo, hi, second), scale, out + 16);
}
#else
inline void lut16_run(const int8_t* table, const uint8_t* q, int shift, float scale, float* out) {
    for (int i = 0; i < 16; ++i) out[i] = scale * (float)table[(q[i] >> shift) & 15];
}

inline void lut16_pairs(const int8_t* table, const uint8_t* q, float scale, float* out) {
    for (int i = 0; i < 16; ++i) {
        out[2 * i] = scale * (float)table[q[i] & 15];
        out[2 * i + 1] = scale * (float)table[q[i] >> 4];
    }
}
#endif
static const uint32_t iq3xxs_grid[256] = QG_IQ3XXS_GRID;
static const uint8_t ksigns_iq2xs[128] = QG_KSIGNS_IQ2XS;

// IQ3_XXS sub-block j (aux: its scale-and-signs word): the 32 grid magnitudes (byte 4l + b
// of grid[] is byte b of grid entry l, little-endian) and the sign bits (bit e: element e
// negative; four 7-bit indices into the 8-bit sign patterns).
inline uint32_t iq3_xxs_sub_block(const uint8_t* qs, int j, uint32_t aux, uint8_t mag[32]) {
    uint32_t grid[8];
    for (int l = 0; l < 8; ++l) grid[l] = iq3xxs_grid[qs[8 * j + l]];
    memcpy(mag, grid, 32);
    uint32_t signs = 0;
    for (int g = 0; g < 4; ++g) signs |= (uint32_t)ksigns_iq2xs[(aux >> (7 * g)) & 127] << (8 * g);
    return signs;
}

// Block decoders: Decoder<block>::decode(block bytes, out[elems]).
template <class Block>
struct Decoder;

// Q8_0: x * d
template <>
struct Decoder<block_q8_0> {
    static constexpr int elems = 32;
    static void decode(const uint8_t* b, float* __restrict__ out) {
        const float d = ld_f16(b + offsetof(block_q8_0, d));
        const int8_t* __restrict__ qs = (const int8_t*)(b + offsetof(block_q8_0, qs));
        for (int i = 0; i < 32; ++i) out[i] = (float)qs[i] * d;
    }
};

// Q4_0: d * (q - 8); element i < 16 = low nibble of qs[i], element i + 16 = high nibble
template <>
struct Decoder<block_q4_0> {
    static constexpr int elems = 32;
    static void decode(const uint8_t* b, float* __restrict__ out) {
        const float d = ld_f16(b + offsetof(block_q4_0, d));
        const uint8_t* __restrict__ qs = b + offsetof(block_q4_0, qs);
        // two contiguous runs (low nibbles, then high) so that each loop vectorises
        for (int i = 0; i < 16; ++i) out[i] = d * (float)((int)(qs[i] & 0x0f) - 8);
        for (int i = 0; i < 16; ++i) out[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
};

// 6-bit scale and min of sub-block j (0..7) of a Q4_K block, from its 12 scale bytes:
// j < 4 : sc = s[j] & 63,                         m = s[j+4] & 63
// j >= 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m = (s[j+4] >> 4) | ((s[j] >> 6) << 4)
inline void q4_K_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: (d * sc) * q - (dmin * m); sub-block 2c = low nibbles of qs[32c..32c+31],
// sub-block 2c+1 = their high nibbles
template <>
struct Decoder<block_q4_K> {
    static constexpr int elems = QK_K;
    static void decode(const uint8_t* b, float* __restrict__ out) {
        const float d = ld_f16(b + offsetof(block_q4_K, d));
        const float dmin = ld_f16(b + offsetof(block_q4_K, dmin));
        const uint8_t* scales = b + offsetof(block_q4_K, scales);
        const uint8_t* qs = b + offsetof(block_q4_K, qs);
        for (int c = 0; c < 4; ++c) {
            int sc0, m0, sc1, m1;
            q4_K_scale_min(scales, 2 * c, &sc0, &m0);
            q4_K_scale_min(scales, 2 * c + 1, &sc1, &m1);
            const float d0 = d * (float)sc0, dm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, dm1 = dmin * (float)m1;
            const uint8_t* __restrict__ q = qs + 32 * c;
            float* __restrict__ o = out + 64 * c;
            for (int i = 0; i < 32; ++i) o[i] = d0 * (float)(q[i] & 0x0f) - dm0;
            for (int i = 0; i < 32; ++i) o[i + 32] = d1 * (float)(q[i] >> 4) - dm1;
        }
    }
};

// Q6_K: (d * sc[e/16]) * (q - 32), q = low 4 bits from ql | high 2 bits from qh << 4.
// Element e, half h = e/128, r = e%128:
//   low  = ql[64h + r%64] >> (4 * (r/64)) & 15,   high = qh[32h + r%32] >> (2 * (r/32)) & 3
template <>
struct Decoder<block_q6_K> {
    static constexpr int elems = QK_K;
    static void decode(const uint8_t* b, float* __restrict__ out) {
        const uint8_t* __restrict__ ql = b + offsetof(block_q6_K, ql);
        const uint8_t* __restrict__ qh = b + offsetof(block_q6_K, qh);
        const int8_t* sc = (const int8_t*)(b + offsetof(block_q6_K, scales));
        const float d = ld_f16(b + offsetof(block_q6_K, d));
        // r = 32 * part + i: the shifts are constant along each 16-element run (one scale)
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
            for (int part = 0; part < 4; ++part) {
                const uint8_t* __restrict__ lo_src = ql + 64 * h + 32 * (part & 1);
                const uint8_t* __restrict__ hi_src = qh + 32 * h;
                const int lo_shift = 4 * (part >> 1), hi_shift = 2 * part;
#pragma GCC unroll 2
                for (int half = 0; half < 2; ++half) {
                    const int e0 = 128 * h + 32 * part + 16 * half;
                    const float ds = d * (float)sc[e0 >> 4];
                    for (int i = 16 * half; i < 16 * half + 16; ++i) {
                        const int lo = (lo_src[i] >> lo_shift) & 0x0f;
                        const int hi = (hi_src[i] >> hi_shift) & 0x03;
                        out[e0 + i - 16 * half] = ds * (float)((lo | (hi << 4)) - 32);
                    }
                }
            }
        }
    }
};

// IQ4_XS: (d * (ls - 32)) * kvalues_iq4nl[q]; ls = low nibble j%2 of scales_l[j/2] |
// (bits 2j..2j+1 of scales_h) << 4; sub-block j: element i < 16 low nibble of qs[16j+i],
// element i + 16 its high nibble
template <>
struct Decoder<block_iq4_xs> {
    static constexpr int elems = QK_K;
    static void decode(const uint8_t* b, float* out) {
        const float d = ld_f16(b + offsetof(block_iq4_xs, d));
        const uint16_t scales_h = ld_u16(b + offsetof(block_iq4_xs, scales_h));
        const uint8_t* scales_l = b + offsetof(block_iq4_xs, scales_l);
        const uint8_t* qs = b + offsetof(block_iq4_xs, qs);
        for (int j = 0; j < 8; ++j) {
            const int ls = ((scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((scales_h >> (2 * j)) & 0x03) << 4);
            const float dl = d * (float)(ls - 32);
            lut16_run(kvalues_iq4nl, qs + 16 * j, 0, dl, out + 32 * j);
            lut16_run(kvalues_iq4nl, qs + 16 * j, 4, dl, out + 32 * j + 16);
        }
    }
};

// IQ3_XXS: db = (d * (0.5 + s)) * 0.5, w = (db * grid) * sign.
// Sub-block j: word aux = qs[64 + 4j .. 64 + 4j + 3] (s = aux >> 28); grid index l (0..7)
// is qs[8j + l], giving elements 4l..4l+3; the 8 elements 8g..8g+7 take their signs from
// ksigns_iq2xs[(aux >> 7g) & 127], bit i = element 8g+i negative.
template <>
struct Decoder<block_iq3_xxs> {
    static constexpr int elems = QK_K;
    static void decode(const uint8_t* b, float* __restrict__ out) {
        const float d = ld_f16(b + offsetof(block_iq3_xxs, d));
        const uint8_t* qs = b + offsetof(block_iq3_xxs, qs);
        for (int j = 0; j < 8; ++j) {
            const uint32_t aux = ld_u32(qs + QK_K / 4 + 4 * j);
            const float db = (d * (0.5f + (float)(aux >> 28))) * 0.5f;
            uint8_t mag[32];
            const uint32_t signs = iq3_xxs_sub_block(qs, j, aux, mag);
            float* __restrict__ o = out + 32 * j;
            for (int e = 0; e < 32; ++e) {
                // +-1.0f from the sign bit, without a branch (random signs mispredict)
                const float sign = bits_float(0x3f800000u | (((signs >> e) & 1u) << 31));
                o[e] = (db * (float)mag[e]) * sign;
            }
        }
    }
};

// Row decoders (decode_rows.cpp, compiled once per ISA level: cpu/clones.h). Each also
// prefetches the part of its row that the next K chunk will decode.
// Decodes blocks [b0, b0 + nb) of one GGUF row into out[nb * elems]. One plain function
// per format (the Block pointer only picks the overload): clang 19 crashes on
// target_clones on a function template.
#define QG_X(NAME, BLOCK, ELEMS) void decode_row_blocks(const BLOCK*, const uint8_t* row, int64_t b0, int64_t nb, float* out);
QG_GGUF_FORMATS(QG_X)
#undef QG_X

template <class Block>
inline void decode_row_blocks(const uint8_t* row, int64_t b0, int64_t nb, float* out) {
    decode_row_blocks(static_cast<const Block*>(nullptr), row, b0, nb, out);
}

// ------------------------------------------------------------------ MXFP4 (OCP layout)

// E2M1 code -> value times two (the gguf package's doubled table), so that the value is
// kvalue * 2^(e - 128); both factors are exact, as is their product in float (gguf-py
// computes the same product). Code 8 (OCP -0) decodes to +0 as in gguf-py's int8 table.
static const int8_t kvalues_mxfp4_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// E8M0 scale byte -> 2^(e - 128) as float bits (half the OCP scale 2^(e - 127));
// e = 255 is NaN in OCP MX, e < 2 are float subnormals.
inline float e8m0_half(uint8_t e) {
    if (e == 255) return bits_float(0x7fc00000u);
    if (e < 2) return bits_float(0x00200000u << e);
    return bits_float((uint32_t)(e - 1) << 23);
}

// Decodes 32-element blocks [b0, b0 + nb) of one MXFP4 row: blocks [nblk, 16], scales [nblk].
void decode_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t b0, int64_t nb, float* out);

// ------------------------------------------------------------------ int4 group (W4A16)

// Decodes k in [k0, k0 + kc) of row n: w = float(q - z) * float(s).
//   qweight row [K/8] words, nibble i of word j = k 8j+i;  scales row [K/G] (F16 or BF16);
//   zero z = nibble n%8 of qzeros[n/8][g] (row stride K/G words), or 8 when qzeros is NULL.
// k0 and kc are multiples of G.
void decode_int4_row(const int32_t* qweight_row, const void* scales_row, qg_dtype scale_dtype,
                     const int32_t* qzeros, int64_t n, int64_t groups_per_row, int group_size, int64_t k0,
                     int64_t kc, float* out);

}  // namespace cpu
}  // namespace qg
