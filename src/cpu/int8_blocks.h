// The int8 path's block decoders, one per GGUF block type, in two parts (shared by the
// portable row decoders of int8_decode.cpp and the AVX2 row kernels of int8_rows.cpp):
//   scales(block, sw, mw, sub, stride): the float32 scales (and q4_K mins, q6_K integer
//       sub-block scales) of the block's 32-element blocks j at sw[j * stride] (sub:
//       sub[u * stride] for its 16-element halves u); false if one is not finite;
//   codes(block, out): the stored codes of its elements, k order (int8_decode.h's table).
// The scales are the float32 products of dequant.h's decoders, so bit for bit gguf-py's.
#pragma once

#include "cpu/int8_decode.h"

namespace qg {
namespace cpu {

// Forced inline so that each ISA clone of a row decoder compiles them for its own target
// (a call would run the baseline copy).
#define QG_INLINE inline __attribute__((always_inline))

QG_INLINE bool finite(float f) { return (float_bits(f) & 0x7f800000u) != 0x7f800000u; }

// q6_K's int8 scale of 16 elements, in both 16-bit halves of an int32 (vpmaddwd pairs).
QG_INLINE int32_t sub_pair(int8_t sc) { return (int32_t)((uint32_t)(uint16_t)sc * 0x10001u); }

// 16 codes out[i] = table[(q[i] >> shift) & 15]: one byte shuffle with GCC's vector
// extensions (pshufb in the v3/v4 clones), scalar elsewhere; the same bytes either way.
#if defined(__GNUC__) && !defined(__clang__)
QG_INLINE void lut16_codes(const int8_t* table, const uint8_t* q, int shift, int8_t* out) {
    qg_v16i8 t;
    qg_v16u8 c;
    memcpy(&t, table, 16);
    memcpy(&c, q, 16);
    const qg_v16i8 v = __builtin_shuffle(t, (qg_v16i8)((c >> shift) & 15));
    memcpy(out, &v, 16);
}
#else
QG_INLINE void lut16_codes(const int8_t* table, const uint8_t* q, int shift, int8_t* out) {
    for (int i = 0; i < 16; ++i) out[i] = table[(q[i] >> shift) & 15];
}
#endif

template <class Block>
struct Int8Block;

// Formats of one fp16 scale per 32 elements (q8_0, q4_0): sw = d.
template <class Block>
struct Int8BlockD {
    QG_INLINE static bool scales(const uint8_t* b, float* sw, float*, int32_t*, int) {
        sw[0] = ld_f16(b + offsetof(Block, d));
        return finite(sw[0]);
    }
};

template <>
struct Int8Block<block_q8_0> : Int8BlockD<block_q8_0> {
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        memcpy(out, b + offsetof(block_q8_0, qs), 32);
    }
};

template <>
struct Int8Block<block_q4_0> : Int8BlockD<block_q4_0> {
    // stored q = w + 8: element i < 16 = low nibble of qs[i], i + 16 = its high nibble
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        const uint8_t* __restrict__ qs = b + offsetof(block_q4_0, qs);
        for (int i = 0; i < 16; ++i) out[i] = (int8_t)(qs[i] & 0x0f);
        for (int i = 0; i < 16; ++i) out[i + 16] = (int8_t)(qs[i] >> 4);
    }
};

template <>
struct Int8Block<block_q4_K> {
    QG_INLINE static bool scales(const uint8_t* b, float* sw, float* mw, int32_t*, int stride) {
        const float d = ld_f16(b + offsetof(block_q4_K, d));
        const float dmin = ld_f16(b + offsetof(block_q4_K, dmin));
        const uint8_t* s = b + offsetof(block_q4_K, scales);
        for (int j = 0; j < 8; ++j) {
            int sc, m;
            q4_K_scale_min(s, j, &sc, &m);
            sw[j * stride] = d * (float)sc;
            mw[j * stride] = dmin * (float)m;
        }
        return finite(d) && finite(dmin);
    }
    // sub-block 2c = low nibbles of qs[32c .. 32c + 31], 2c + 1 = their high nibbles
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        const uint8_t* __restrict__ qs = b + offsetof(block_q4_K, qs);
        for (int c = 0; c < 4; ++c) {
            const uint8_t* __restrict__ q = qs + 32 * c;
            int8_t* __restrict__ o = out + 64 * c;
            for (int i = 0; i < 32; ++i) o[i] = (int8_t)(q[i] & 0x0f);
            for (int i = 0; i < 32; ++i) o[i + 32] = (int8_t)(q[i] >> 4);
        }
    }
};

template <>
struct Int8Block<block_q6_K> {
    // sw = d for all 8 blocks of 32; the int8 scale of each 16 elements goes to sub[]
    QG_INLINE static bool scales(const uint8_t* b, float* sw, float*, int32_t* sub, int stride) {
        const int8_t* sc = (const int8_t*)(b + offsetof(block_q6_K, scales));
        const float d = ld_f16(b + offsetof(block_q6_K, d));
        for (int j = 0; j < 8; ++j) sw[j * stride] = d;
        for (int u = 0; u < 16; ++u) sub[u * stride] = sub_pair(sc[u]);
        return finite(d);
    }
    // codes q - 32 in the element order of Decoder<block_q6_K>
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        const uint8_t* __restrict__ ql = b + offsetof(block_q6_K, ql);
        const uint8_t* __restrict__ qh = b + offsetof(block_q6_K, qh);
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
            for (int part = 0; part < 4; ++part) {
                const uint8_t* __restrict__ lo_src = ql + 64 * h + 32 * (part & 1);
                const uint8_t* __restrict__ hi_src = qh + 32 * h;
                const int lo_shift = 4 * (part >> 1), hi_shift = 2 * part;
                int8_t* __restrict__ o = out + 128 * h + 32 * part;
                for (int i = 0; i < 32; ++i) {
                    const int lo = (lo_src[i] >> lo_shift) & 0x0f;
                    const int hi = (hi_src[i] >> hi_shift) & 0x03;
                    o[i] = (int8_t)((lo | (hi << 4)) - 32);
                }
            }
        }
    }
};

// ls of sub-block j: low nibble j%2 of scales_l[j/2] | (bits 2j..2j+1 of scales_h) << 4
QG_INLINE int iq4_xs_ls(const uint8_t* b, int j) {
    const uint16_t scales_h = ld_u16(b + offsetof(block_iq4_xs, scales_h));
    const uint8_t* scales_l = b + offsetof(block_iq4_xs, scales_l);
    return ((scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((scales_h >> (2 * j)) & 0x03) << 4);
}

template <>
struct Int8Block<block_iq4_xs> {
    QG_INLINE static bool scales(const uint8_t* b, float* sw, float*, int32_t*, int stride) {
        const float d = ld_f16(b + offsetof(block_iq4_xs, d));
        for (int j = 0; j < 8; ++j) sw[j * stride] = d * (float)(iq4_xs_ls(b, j) - 32);
        return finite(d);
    }
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        const uint8_t* qs = b + offsetof(block_iq4_xs, qs);
        for (int j = 0; j < 8; ++j) {
            lut16_codes(kvalues_iq4nl, qs + 16 * j, 0, out + 32 * j);
            lut16_codes(kvalues_iq4nl, qs + 16 * j, 4, out + 32 * j + 16);
        }
    }
};

template <>
struct Int8Block<block_iq3_xxs> {
    QG_INLINE static bool scales(const uint8_t* b, float* sw, float*, int32_t*, int stride) {
        const float d = ld_f16(b + offsetof(block_iq3_xxs, d));
        const uint8_t* qs = b + offsetof(block_iq3_xxs, qs);
        bool ok = true;
        for (int j = 0; j < 8; ++j) {
            const uint32_t aux = ld_u32(qs + QK_K / 4 + 4 * j);
            const float db = (d * (0.5f + (float)(aux >> 28))) * 0.5f;
            sw[j * stride] = db;
            ok = ok && finite(db);
        }
        return ok;
    }
    // Decoder<block_iq3_xxs>'s magnitudes and sign bits; w = mag, negated where the bit is set
    QG_INLINE static void codes(const uint8_t* b, int8_t* __restrict__ out) {
        const uint8_t* qs = b + offsetof(block_iq3_xxs, qs);
        for (int j = 0; j < 8; ++j) {
            uint8_t mag[32];
            const uint32_t signs = iq3_xxs_sub_block(qs, j, ld_u32(qs + QK_K / 4 + 4 * j), mag);
            int8_t* __restrict__ o = out + 32 * j;
            for (int e = 0; e < 32; ++e) {
                const int neg = (int)((signs >> e) & 1u);  // 0 or 1: (m ^ -neg) + neg = neg ? -m : m
                o[e] = (int8_t)(((int)mag[e] ^ -neg) + neg);
            }
        }
    }
};

// MXFP4 scale byte e -> 2^(e - 128) (the float decoder's e8m0_half; NaN for e = 255). From
// e = MXFP4_E_OVERFLOW on, the float decode of a code of 8 or 12 overflows to inf
// (8 * 2^125 = 2^128): such a block counts as non-finite, so that its row takes the
// fp32-exact path and gives the float reference's inf.
constexpr int MXFP4_E_OVERFLOW = 253;
QG_INLINE bool mxfp4_scale(uint8_t e, float* sw) {
    *sw = e8m0_half(e);
    return e < MXFP4_E_OVERFLOW;
}

// int4 group g of row n: its scale and the offset added to its nibbles q to store
// w + 15 = q - z + 15 (KIND_INT4); z = nibble n%8 of qzeros[n/8][g], or 8 when symmetric.
QG_INLINE bool int4_group(const void* scales_row, qg_dtype scale_dtype, const int32_t* qzeros, int64_t n,
                          int64_t groups_per_row, int64_t g, float* s, int* bias) {
    *s = load_float(scale_dtype, scales_row, g);
    const int z = qzeros == nullptr ? 8
                                    : (int)(((uint32_t)qzeros[(n / 8) * groups_per_row + g] >> (4 * (n % 8))) & 15u);
    *bias = KIND_INT4.offset - z;
    return finite(*s);
}

}  // namespace cpu
}  // namespace qg
