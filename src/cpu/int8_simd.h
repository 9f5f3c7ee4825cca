// The integer and float vector operations of the int8 rows kernel (int8_rows.cpp), under
// one name for each width, so that its decoders and kernel are written once:
//   Simd<256>: ymm (__m256i), AVX2 (dpbusd: AVX-512 VL + VNNI, called only from that copy);
//   Simd<512>: zmm (__m512i), AVX-512 F, BW and VNNI (QG_AVX512_TARGET).
// A vector is LANES 128-bit lanes; the rows kernel holds one weight row in each (rows i,
// i + 4, i + 8, i + 12 of a pass: int8_rows.cpp), so every lane-wise operation (unpack,
// vpshufb, vpdpbusd, the block sums' transpose) reads the same for either width.
#pragma once

#include <stdint.h>

#include "cpu/int8_avx2.h"

#if QG_INT8_HAVE_AVX2
namespace qg {
namespace cpu {

template <int BITS>
struct Simd;

template <>
struct Simd<256> {
    using V = __m256i;
    using F = __m256;
    static constexpr int LANES = 2;
    // constructors
    QG_AVX2_INLINE static __m256i zero() { return _mm256_setzero_si256(); }
    QG_AVX2_INLINE static __m256i splat8(int c) { return _mm256_set1_epi8((char)c); }
    QG_AVX2_INLINE static __m256i splat32(int32_t c) { return _mm256_set1_epi32(c); }
    // lane L = the 16 bytes at p[L]
    QG_AVX2_INLINE static __m256i lanes(const uint8_t* const* p) {
        return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)p[0])),
                                       _mm_loadu_si128((const __m128i*)p[1]), 1);
    }
    // every lane = the 16 bytes at p
    QG_AVX2_INLINE static __m256i bcast16(const void* p) {
        return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)p));
    }
    // every lane = elements 0, 2, .., 30 of the 32 bytes at p (e), 1, 3, .., 31 (o): each
    // half's evens, then odds (vpshufb), and the halves' evens (odds) joined (vpermq)
    QG_AVX2_INLINE static void bcast_even_odd(const void* p, __m256i& e, __m256i& o) {
        const __m256i idx = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8,
                                             10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)p), idx);
        e = _mm256_permute4x64_epi64(v, 0x88);  // qwords 0, 2, 0, 2
        o = _mm256_permute4x64_epi64(v, 0xdd);  // 1, 3, 1, 3
    }
    // lane L = the four words w[4 L .. 4 L + 3]
    QG_AVX2_INLINE static __m256i words(const int32_t* w) {
        return _mm256_setr_epi32(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
    }
    // every word of lane L = v[L]
    QG_AVX2_INLINE static __m256i per_lane(const int32_t* v) {
        return _mm256_setr_epi32(v[0], v[0], v[0], v[0], v[1], v[1], v[1], v[1]);
    }
    QG_AVX2_INLINE static __m256i load(const void* p) { return _mm256_load_si256((const __m256i*)p); }
    // 8 bytes at p, sign-extended to the 8 words
    QG_AVX2_INLINE static __m256i cvt8_32(const int8_t* p) {
        return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
    }
    // bytes
    QG_AVX2_INLINE static __m256i and_(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
    QG_AVX2_INLINE static __m256i or_(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
    QG_AVX2_INLINE static __m256i xor_(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }
    QG_AVX2_INLINE static __m256i add8(__m256i a, __m256i b) { return _mm256_add_epi8(a, b); }
    QG_AVX2_INLINE static __m256i sub8(__m256i a, __m256i b) { return _mm256_sub_epi8(a, b); }
    QG_AVX2_INLINE static __m256i srli16(__m256i a, int n) { return _mm256_srli_epi16(a, n); }
    QG_AVX2_INLINE static __m256i slli16(__m256i a, int n) { return _mm256_slli_epi16(a, n); }
    QG_AVX2_INLINE static __m256i shuffle8(__m256i table, __m256i idx) { return _mm256_shuffle_epi8(table, idx); }
    QG_AVX2_INLINE static __m256i unpacklo8(__m256i a, __m256i b) { return _mm256_unpacklo_epi8(a, b); }
    QG_AVX2_INLINE static __m256i unpackhi8(__m256i a, __m256i b) { return _mm256_unpackhi_epi8(a, b); }
    // bytes of mag negated where spread & bits (one bit a byte) is set
    QG_AVX2_INLINE static __m256i negate_where(__m256i mag, __m256i spread, __m256i bits) {
        const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        return _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg);
    }
    // words
    QG_AVX2_INLINE static __m256i add32(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
    QG_AVX2_INLINE static __m256i sub32(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
    QG_AVX2_INLINE static __m256i mullo32(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
    QG_AVX2_INLINE static __m256i madd16(__m256i a, __m256i b) { return _mm256_madd_epi16(a, b); }
    QG_AVX2_INLINE static __m256i packs32(__m256i a, __m256i b) { return _mm256_packs_epi32(a, b); }
    QG_AVX2_INLINE static __m256i unpacklo32(__m256i a, __m256i b) { return _mm256_unpacklo_epi32(a, b); }
    QG_AVX2_INLINE static __m256i unpackhi32(__m256i a, __m256i b) { return _mm256_unpackhi_epi32(a, b); }
    QG_AVX2_INLINE static __m256i unpacklo64(__m256i a, __m256i b) { return _mm256_unpacklo_epi64(a, b); }
    QG_AVX2_INLINE static __m256i unpackhi64(__m256i a, __m256i b) { return _mm256_unpackhi_epi64(a, b); }
    QG_AVX512_INLINE static __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
    // floats
    QG_AVX2_INLINE static __m256 loadf(const float* p) { return _mm256_load_ps(p); }
    QG_AVX2_INLINE static __m256 loaduf(const float* p) { return _mm256_loadu_ps(p); }
    QG_AVX2_INLINE static void storeuf(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
    // the 8-float halves h[0], h[1], ... as one vector at p (aligned): one store, so that
    // the kernel's vector load of it is forwarded (a zmm load of two ymm stores is not)
    QG_AVX2_INLINE static void store_halves(float* p, const __m256* h) { _mm256_store_ps(p, h[0]); }
    QG_AVX2_INLINE static __m256 splatf(float f) { return _mm256_set1_ps(f); }
    QG_AVX2_INLINE static __m256 cvtf(__m256i v) { return _mm256_cvtepi32_ps(v); }
    QG_AVX2_INLINE static __m256 addf(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
    QG_AVX2_INLINE static __m256 subf(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
    QG_AVX2_INLINE static __m256 mulf(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};

template <>
struct Simd<512> {
    using V = __m512i;
    using F = __m512;
    static constexpr int LANES = 4;
    QG_AVX512_INLINE static __m512i zero() { return _mm512_setzero_si512(); }
    QG_AVX512_INLINE static __m512i splat8(int c) { return _mm512_set1_epi8((char)c); }
    QG_AVX512_INLINE static __m512i splat32(int32_t c) { return _mm512_set1_epi32(c); }
    QG_AVX512_INLINE static __m512i lanes(const uint8_t* const* p) {
        const __m256i lo = Simd<256>::lanes(p), hi = Simd<256>::lanes(p + 2);
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    QG_AVX512_INLINE static __m512i bcast16(const void* p) {
        return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)p));
    }
    QG_AVX512_INLINE static void bcast_even_odd(const void* p, __m512i& e, __m512i& o) {
        __m256i e2, o2;
        Simd<256>::bcast_even_odd(p, e2, o2);
        e = _mm512_broadcast_i64x4(e2);
        o = _mm512_broadcast_i64x4(o2);
    }
    QG_AVX512_INLINE static __m512i words(const int32_t* w) {
        return _mm512_setr_epi32(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11], w[12],
                                 w[13], w[14], w[15]);
    }
    QG_AVX512_INLINE static __m512i per_lane(const int32_t* v) {
        return _mm512_setr_epi32(v[0], v[0], v[0], v[0], v[1], v[1], v[1], v[1], v[2], v[2], v[2], v[2], v[3], v[3],
                                 v[3], v[3]);
    }
    QG_AVX512_INLINE static __m512i load(const void* p) { return _mm512_load_si512(p); }
    QG_AVX512_INLINE static __m512i cvt8_32(const int8_t* p) {
        return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
    }
    QG_AVX512_INLINE static __m512i and_(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
    QG_AVX512_INLINE static __m512i or_(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
    QG_AVX512_INLINE static __m512i xor_(__m512i a, __m512i b) { return _mm512_xor_si512(a, b); }
    QG_AVX512_INLINE static __m512i add8(__m512i a, __m512i b) { return _mm512_add_epi8(a, b); }
    QG_AVX512_INLINE static __m512i sub8(__m512i a, __m512i b) { return _mm512_sub_epi8(a, b); }
    QG_AVX512_INLINE static __m512i srli16(__m512i a, int n) { return _mm512_srli_epi16(a, n); }
    QG_AVX512_INLINE static __m512i slli16(__m512i a, int n) { return _mm512_slli_epi16(a, n); }
    QG_AVX512_INLINE static __m512i shuffle8(__m512i table, __m512i idx) { return _mm512_shuffle_epi8(table, idx); }
    QG_AVX512_INLINE static __m512i unpacklo8(__m512i a, __m512i b) { return _mm512_unpacklo_epi8(a, b); }
    QG_AVX512_INLINE static __m512i unpackhi8(__m512i a, __m512i b) { return _mm512_unpackhi_epi8(a, b); }
    QG_AVX512_INLINE static __m512i negate_where(__m512i mag, __m512i spread, __m512i bits) {
        return _mm512_mask_sub_epi8(mag, _mm512_test_epi8_mask(spread, bits), _mm512_setzero_si512(), mag);
    }
    QG_AVX512_INLINE static __m512i add32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
    QG_AVX512_INLINE static __m512i sub32(__m512i a, __m512i b) { return _mm512_sub_epi32(a, b); }
    QG_AVX512_INLINE static __m512i mullo32(__m512i a, __m512i b) { return _mm512_mullo_epi32(a, b); }
    QG_AVX512_INLINE static __m512i madd16(__m512i a, __m512i b) { return _mm512_madd_epi16(a, b); }
    QG_AVX512_INLINE static __m512i packs32(__m512i a, __m512i b) { return _mm512_packs_epi32(a, b); }
    QG_AVX512_INLINE static __m512i unpacklo32(__m512i a, __m512i b) { return _mm512_unpacklo_epi32(a, b); }
    QG_AVX512_INLINE static __m512i unpackhi32(__m512i a, __m512i b) { return _mm512_unpackhi_epi32(a, b); }
    QG_AVX512_INLINE static __m512i unpacklo64(__m512i a, __m512i b) { return _mm512_unpacklo_epi64(a, b); }
    QG_AVX512_INLINE static __m512i unpackhi64(__m512i a, __m512i b) { return _mm512_unpackhi_epi64(a, b); }
    QG_AVX512_INLINE static __m512i dpbusd(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
    QG_AVX512_INLINE static __m512 loadf(const float* p) { return _mm512_load_ps(p); }
    QG_AVX512_INLINE static __m512 loaduf(const float* p) { return _mm512_loadu_ps(p); }
    QG_AVX512_INLINE static void storeuf(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
    QG_AVX512_INLINE static void store_halves(float* p, const __m256* h) {
        const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(h[0]));
        _mm512_store_ps(p, _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(h[1]), 1)));
    }
    QG_AVX512_INLINE static __m512 splatf(float f) { return _mm512_set1_ps(f); }
    QG_AVX512_INLINE static __m512 cvtf(__m512i v) { return _mm512_cvtepi32_ps(v); }
    QG_AVX512_INLINE static __m512 addf(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
    QG_AVX512_INLINE static __m512 subf(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
    QG_AVX512_INLINE static __m512 mulf(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
};

}  // namespace cpu
}  // namespace qg
#endif  // QG_INT8_HAVE_AVX2
