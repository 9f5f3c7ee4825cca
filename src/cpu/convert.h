// fp16 / bf16 <-> float conversions on bit patterns, for the CPU tier.
// Widening is exact; narrowing rounds to nearest, ties to even (IEEE 754 default),
// like numpy's astype(float16) and ml_dtypes' bfloat16.
#pragma once

#include <stdint.h>
#include <string.h>

#include "quantgemm.h"

namespace qg {
namespace cpu {

inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// fp16 -> float, exact for every pattern (subnormals, infinities, NaN payloads).
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);              // inf / NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);     // normal: rebias 15 -> 127
    } else {
        // zero or subnormal: man * 2^-24 is exact in float
        const float v = (float)man * 5.9604644775390625e-08f;  // 2^-24
        bits = sign | float_bits(v);
    }
    return bits_float(bits);
}

// float -> fp16, round to nearest even; overflow gives infinity, NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
    const uint32_t x = float_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
    const int e = (int)(ax >> 23) - 127 + 15;  // fp16 biased exponent
    uint32_t man = ax & 0x7fffffu;
    if (e >= 31) return sign | 0x7c00;
    if (e <= 0) {
        // subnormal result: q = round(|f| / 2^-24); |f| < 2^-25 always rounds to 0
        if (e < -10) return sign;
        man |= 0x800000u;
        const int shift = 14 - e;  // 14..24
        uint32_t q = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return sign | (uint16_t)q;  // q may carry into the smallest normal, as it should
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    const uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach infinity: correct
    return sign | (uint16_t)h;
}

inline float bf16_to_f32(uint16_t b) { return bits_float((uint32_t)b << 16); }

// float -> bf16, round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Element i of a float-like array of dtype F32, F16 or BF16.
inline float load_float(qg_dtype dt, const void* p, int64_t i) {
    switch (dt) {
        case QG_DTYPE_F16: return f16_to_f32(((const uint16_t*)p)[i]);
        case QG_DTYPE_BF16: return bf16_to_f32(((const uint16_t*)p)[i]);
        default: return ((const float*)p)[i];
    }
}

inline void store_float(qg_dtype dt, void* p, int64_t i, float v) {
    switch (dt) {
        case QG_DTYPE_F16: ((uint16_t*)p)[i] = f32_to_f16(v); break;
        case QG_DTYPE_BF16: ((uint16_t*)p)[i] = f32_to_bf16(v); break;
        default: ((float*)p)[i] = v; break;
    }
}

// Size in bytes of one element of a float-like or integer dtype (U4X8: one word).
inline int dtype_bytes(qg_dtype dt) {
    switch (dt) {
        case QG_DTYPE_F16:
        case QG_DTYPE_BF16: return 2;
        case QG_DTYPE_U8: return 1;
        default: return 4;
    }
}

// The last step of every dense CPU GEMM: y[m * ldy + n] = v (+ bias[n]), v the output's
// float32 sum, the bias added in float32, then one rounding to y's dtype.
struct OutputStore {
    qg_dtype y_dtype;
    void* y;
    int64_t ldy;
    const void* bias;  // [N] or NULL
    qg_dtype bias_dtype;
    void operator()(int64_t m, int64_t n, float v) const {
        if (bias != nullptr) v += load_float(bias_dtype, bias, n);
        store_float(y_dtype, y, m * ldy + n, v);
    }
    // y[m, n0 .. n0 + count - 1] = v[0 .. count - 1]: the values operator() stores, with the
    // bias test and the dtype switch taken once for the row.
    void row(int64_t m, int64_t n0, const float* v, int count) const {
        if (bias != nullptr) {
            for (int i = 0; i < count; ++i) (*this)(m, n0 + i, v[i]);
            return;
        }
        const int64_t at = m * ldy + n0;
        if (y_dtype == QG_DTYPE_F16) {
            for (int i = 0; i < count; ++i) ((uint16_t*)y)[at + i] = f32_to_f16(v[i]);
        } else if (y_dtype == QG_DTYPE_BF16) {
            for (int i = 0; i < count; ++i) ((uint16_t*)y)[at + i] = f32_to_bf16(v[i]);
        } else {
            memcpy((float*)y + at, v, (size_t)count * sizeof(float));
        }
    }
    // Asks for y[m * ldy + n]'s cache line, for writing, ahead of its stores.
    void prefetch(int64_t m, int64_t n) const {
        __builtin_prefetch((const char*)y + (m * ldy + n) * dtype_bytes(y_dtype), 1, 3);
    }
};
template <class Args>
OutputStore output_store(const Args* a) {
    return OutputStore{a->y_dtype, a->y, a->ldy, a->bias, a->bias_dtype};
}

// n elements of dtype dt -> float (loops kept branch-free inside for vectorisation).
inline void to_float_row(qg_dtype dt, const void* src, int64_t n, float* dst) {
    if (dt == QG_DTYPE_F16) {
        const uint16_t* s = (const uint16_t*)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
    } else if (dt == QG_DTYPE_BF16) {
        const uint16_t* s = (const uint16_t*)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

}  // namespace cpu
}  // namespace qg
