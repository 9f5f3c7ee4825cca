// AVX2 helpers shared by the int8 kernels (int8_dot.cpp, int8_rows.cpp). Functions carry
// their target attribute, so the library's baseline build stays portable; callers check
// cpu::int8_isa() first. x86-64 with GCC or clang only (QG_INT8_HAVE_AVX2).
#pragma once

#include "cpu/int8_kernels.h"

#if QG_INT8_HAVE_AVX2
#include <immintrin.h>

#define QG_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QG_AVX2_INLINE inline __attribute__((always_inline, target("avx2,fma,f16c")))
// AVX-512 VNNI (F, BW, VL and VNNI: cpu::Isa::AVX512_VNNI); the AVX2 helpers inline into it
#define QG_AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define QG_AVX512 __attribute__((target(QG_AVX512_TARGET)))
#define QG_AVX512_INLINE inline __attribute__((always_inline, target(QG_AVX512_TARGET)))

namespace qg {
namespace cpu {

// 8 weight rows x one 32-element block, given as rows (i, i + 4) per 128-bit lane
// (lo[i] = [row i, k 0..15 | row i + 4, k 0..15], hi[i] the same for k 16..31), to the 8
// k4 groups of the panel layout (int8_kernels.h): a 4 x 4 transpose of 32-bit words in each
// lane, no lane-crossing shuffle.
//   t0 = unpacklo32(A0, A1) = [r0 g0, r1 g0, r0 g1, r1 g1 | r4 g0, r5 g0, r4 g1, r5 g1]
//   G0 = unpacklo64(t0, t2) = [r0 g0, r1 g0, r2 g0, r3 g0 | r4 g0, r5 g0, r6 g0, r7 g0]
// out points at group 0 of the 8 rows (stride PANEL_ROWS * 4 bytes between groups).
QG_AVX2_INLINE void store_k4_groups(const __m256i* lo, const __m256i* hi, int8_t* out) {
    for (int half = 0; half < 2; ++half) {  // k 0..15 (groups 0..3), k 16..31 (groups 4..7)
        const __m256i* a = half == 0 ? lo : hi;
        const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
        const __m256i g[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
        for (int j = 0; j < 4; ++j) _mm256_storeu_si256((__m256i*)(out + (4 * half + j) * PANEL_ROWS * 4), g[j]);
    }
}

}  // namespace cpu
}  // namespace qg
#endif  // QG_INT8_HAVE_AVX2
