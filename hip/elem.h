// Device element loads and stores for fp16 / bf16 / fp32, shared by every kernel family.
// 16-bit floats travel as raw bits (uint16_t) so that the same code builds against the HIP
// headers of older ROCm releases as well as CUDA's.
#pragma once

#include <stdint.h>

#include "compat.h"

namespace qg {

enum ElemType : int { ELEM_F16 = 0, ELEM_BF16 = 1, ELEM_F32 = 2 };

__device__ __forceinline__ float bits_to_float(uint16_t b, int type) {
    if (type == ELEM_BF16) return __uint_as_float(static_cast<uint32_t>(b) << 16);
    return __half2float(__ushort_as_half(b));
}

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make Inf).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

// y[idx] = v in the output type (fp32, bf16 or fp16, round to nearest even).
__device__ __forceinline__ void store_out(void* y, int64_t idx, float v, int type) {
    if (type == ELEM_F32) {
        static_cast<float*>(y)[idx] = v;
    } else if (type == ELEM_BF16) {
        static_cast<uint16_t*>(y)[idx] = float_to_bf16_bits(v);
    } else {
        static_cast<uint16_t*>(y)[idx] = __half_as_ushort(__float2half_rn(v));
    }
}

// The optional bias [N] of a GEMM's output (p == nullptr: none), of type ELEM_*.
struct BiasRef {
    const void* p;
    int type;
};

// bias[n] as fp32 (n < N), or -0.0f without a bias: v + -0.0f is v for every v, -0 included,
// so an epilogue adds it to each fp32 sum unconditionally (the CPU tier's order: the sum, then
// the output's one rounding), loaded once per output row where its stores unroll.
__device__ __forceinline__ float bias_at(const BiasRef& b, int64_t n) {
    if (b.p == nullptr) return -0.0f;
    if (b.type == ELEM_F32) return static_cast<const float*>(b.p)[n];
    return bits_to_float(static_cast<const uint16_t*>(b.p)[n], b.type);
}

}  // namespace qg
