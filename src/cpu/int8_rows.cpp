// The small-M kernels of the int8 path (int8_kernels.h, rows_*): weight rows read in their
// own layout and decoded in registers, 8 rows at a time, against M <= ROWS_M activation
// rows. At M = 1 a weight is used once, so decoding it to a panel first (a store and a
// load of every code, and a transpose) cost more than the multiply: one thread, q4_K
// 7168x4096, 7.5 ms of CPU time through the panel against 3.9 here.
//
// Lanes run along K here. One ymm holds 16 codes of weight row r (low 128 bits) and of row
// r + 4 (high), so a pass over 8 rows is 4 such pairs; vpmaddubsw gives the products in
// pairs, and a transpose-and-add of the 4 pairs' vectors gives the rows' exact block sums
// D, rows 0..3 in the low half and 4..7 in the high. From D on, the arithmetic is the
// panel kernels' (the same float32 operations in the same order): both paths give the same
// bits. This Zen 1 core decodes about 4 instructions a cycle, which bounds this kernel more
// than its one integer multiplier does: instructions are what the layout saves.
#include <string.h>

#include <type_traits>

#include "cpu/int8_rows.h"

#include "cpu/cpu_isa.h"
#include "cpu/int8_avx2.h"
#include "cpu/int8_blocks.h"
#include "cpu/iq3_xxs_vbmi.h"

namespace qg {
namespace cpu {

#if QG_INT8_HAVE_AVX2
namespace {

constexpr int GROUP = ROWS_GROUP;  // weight rows per pass: one ymm of block sums
// Bytes ahead of each row's reads that the kernel prefetches, once a cache line (8 rows
// stream at once); 256, 2048 and 4096 measured within this VM's noise of it.
constexpr int PREFETCH_BYTES = 1024;

// Prefetches line `off` of a row PREFETCH_BYTES ahead and the same line of the row a group
// further on (int8_rows.h, SRC_ROWS: this panel's next 8 rows, or the next panel's first
// 8), which the next pass will read: without it every pass began with its 8 rows cold
// (one q4_0 row of K = 4096 is 36 lines, 16 of them before the prefetch distance).
QG_AVX2_INLINE void prefetch_row(const void* row, const void* next, int64_t off) {
    _mm_prefetch((const char*)row + off + PREFETCH_BYTES, _MM_HINT_T0);
    _mm_prefetch((const char*)next + off, _MM_HINT_T0);
}

// Rows r (low 128 bits) and r + 4 (high) of 16 bytes each.
QG_AVX2_INLINE __m256i load2(const uint8_t* r, const uint8_t* r4) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)r)),
                                   _mm_loadu_si128((const __m128i*)r4), 1);
}
QG_AVX2_INLINE __m256i set2(int32_t a, int32_t b) { return _mm256_setr_epi32(a, a, a, a, b, b, b, b); }

// 16 bytes of each lane -> elements i (low nibble of byte i) in lo, i + 16 (its high) in hi
QG_AVX2_INLINE void nibbles_lo_hi(__m256i c, __m256i& lo, __m256i& hi) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    lo = _mm256_and_si256(c, m);
    hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m);
}
// ... -> elements 2i, 2i + 1 = the low, high nibble of byte i (vpunpck works per lane)
QG_AVX2_INLINE void nibbles_interleaved(__m256i c, __m256i& lo, __m256i& hi) {
    __m256i l, h;
    nibbles_lo_hi(c, l, h);
    lo = _mm256_unpacklo_epi8(l, h);
    hi = _mm256_unpackhi_epi8(l, h);
}

QG_AVX2_INLINE __m256i table16(const int8_t* t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)t));
}

// Lanes r of v whose exponent is not all ones (finite), as bits r of the result.
QG_AVX2_INLINE unsigned finite_mask(__m256 v) {
    const __m256 e = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, e), e, _CMP_NEQ_OQ));
}

// out[j] = lane r of in[r] for j, r < 8 (8 x 8 floats transposed).
QG_AVX2_INLINE void transpose8(const __m256* in, float* out) {
    const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
    const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
    const __m256 t4 = _mm256_unpacklo_ps(in[4], in[5]), t5 = _mm256_unpackhi_ps(in[4], in[5]);
    const __m256 t6 = _mm256_unpacklo_ps(in[6], in[7]), t7 = _mm256_unpackhi_ps(in[6], in[7]);
    const __m256 u[8] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xee),
                         _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xee),
                         _mm256_shuffle_ps(t4, t6, 0x44), _mm256_shuffle_ps(t4, t6, 0xee),
                         _mm256_shuffle_ps(t5, t7, 0x44), _mm256_shuffle_ps(t5, t7, 0xee)};
    for (int j = 0; j < 4; ++j) {  // u[j]: rows 0..3 in the low half, 4..7 in the high, j and j + 4
        _mm256_store_ps(out + 8 * j, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
        _mm256_store_ps(out + 8 * (j + 4), _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
    }
}

// The fp16 at byte offset `off` of each row's format block fb, as 8 floats (F16C converts
// exactly, as f16_to_f32 does; a NaN's bits may differ, but a NaN scale sends its row to
// the fp32-exact path). Packed in general registers (the empty asm keeps GCC from turning
// it into vector inserts): the shuffle pipes are the busiest ones in this kernel, and 8
// vpinsrw cost 10 % of an M = 1 GEMM.
template <class F>
QG_AVX2_INLINE __m256 f16_rows(const F& f, int64_t fb, int off) {
    uint64_t h[2];
    for (int q = 0; q < 2; ++q) {
        uint64_t v = 0;
        for (int r = 0; r < 4; ++r) v |= (uint64_t)ld_u16(f.at(4 * q + r, fb) + off) << (16 * r);
        __asm__("" : "+r"(v));
        h[q] = v;
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)h[1], (long long)h[0]));
}

// ---------------------------------------------------------------- formats
// Each gives, for the 8 weight rows of a pass and format block fb:
//   scales8(fb, sw, mw, sub): the scales of int8_blocks.h, sw[j * 8 + r] and mw[j * 8 + r]
//       for its 32-element blocks j, sub[r * 16 + u] (q6_K) for its 16-element parts u
//       (int4: sub[r], row r's zero-point); returns the rows whose scales are all finite,
//       as bits;
//   codes(i, fb, j, lo, hi): rows i and i + 4 (i < 4) of 32-element block j, elements
//       0..15 in lo and 16..31 in hi, each row in its own 128-bit half; as w (SIGNED) or as
//       w + OFF (unsigned; int4: w + z of the row's group, the kernel taking z * S off),
//       |code| <= MAX_CODE;
//   prefetch(fb): the rows' bytes PREFETCH_BYTES ahead, once a cache line.

template <class Block>
struct GgufRows {
    static constexpr Int8Kind kind = Int8Traits<Block>::kind;
    static constexpr int SUBS = Decoder<Block>::elems / Q8_BLOCK;
    static constexpr int BYTES = (int)sizeof(Block);
    static constexpr bool SIGNED = kind.offset < 0, SUB = kind.sub, MW = kind.mw, ROW_OFF = false;
    static constexpr int OFF = SIGNED ? 0 : kind.offset;
    static const int MAX_CODE;
    // the panel's representation of a row pair's codes (the same as this decoder's here)
    QG_AVX2_INLINE void to_panel(int, const int32_t*, __m256i&, __m256i&) const {}
    const uint8_t *row[GROUP], *next[GROUP];
    GgufRows(const GgufSrc<Block>& src, int g0) {
        for (int r = 0; r < GROUP; ++r) {
            row[r] = src.row[g0 + r];
            next[r] = src.row[g0 + GROUP + r];
        }
    }
    QG_AVX2_INLINE const uint8_t* at(int r, int64_t fb) const { return row[r] + fb * BYTES; }
    // every line that starts in block fb (relative to the row start): blocks of more than
    // 64 bytes span several, and one prefetch per block had left q6_K (210 bytes) 2/3 cold
    QG_AVX2_INLINE void prefetch(int64_t fb) const {
        for (int64_t off = (fb * BYTES + 63) & ~(int64_t)63; off < (fb + 1) * BYTES; off += 64)
            for (int r = 0; r < GROUP; ++r) prefetch_row(row[r], next[r], off);
    }
    QG_AVX2_INLINE unsigned scales8(int64_t fb, float* sw, float* mw, int32_t* sub) const;
    template <int J>
    QG_AVX2_INLINE void codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const;
    // q6_K only, for the vpdpbusd kernel: scales8 with the sub-block scales as bytes
    // subt[u * 8 + r], and the codes as w + 32 (unsigned)
    QG_AVX2_INLINE unsigned scales8_t(int64_t fb, float* sw, int8_t* subt) const;
    template <int J>
    QG_AVX2_INLINE void codes_u(int i, int64_t fb, __m256i& lo, __m256i& hi) const;
    QG_AVX2_INLINE __m256i at2(int i, int64_t fb, int off) const { return load2(at(i, fb) + off, at(i + 4, fb) + off); }
};

template <>
const int GgufRows<block_q8_0>::MAX_CODE = 128;
// q8_0, q4_0: sw = d, one fp16 per 32 elements (at byte 0); q6_K: the same d for each of
// its `blocks` 32-element blocks (at byte off)
template <class F>
QG_AVX2_INLINE unsigned d_scales8(const F& f, int64_t fb, float* sw, int off = 0, int blocks = 1) {
    const __m256 d = f16_rows(f, fb, off);
    for (int j = 0; j < blocks; ++j) _mm256_store_ps(sw + j * GROUP, d);
    return finite_mask(d);
}
static_assert(offsetof(block_q8_0, d) == 0 && offsetof(block_q4_0, d) == 0, "d_scales8 reads d at byte 0");

template <>
QG_AVX2_INLINE unsigned GgufRows<block_q8_0>::scales8(int64_t fb, float* sw, float*, int32_t*) const {
    return d_scales8(*this, fb, sw);
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_q8_0>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    lo = at2(i, fb, offsetof(block_q8_0, qs));
    hi = at2(i, fb, offsetof(block_q8_0, qs) + 16);
}

template <>
const int GgufRows<block_q4_0>::MAX_CODE = 15;
template <>
QG_AVX2_INLINE unsigned GgufRows<block_q4_0>::scales8(int64_t fb, float* sw, float*, int32_t*) const {
    return d_scales8(*this, fb, sw);
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_q4_0>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    nibbles_lo_hi(at2(i, fb, offsetof(block_q4_0, qs)), lo, hi);
}

// q4_K: the 6-bit scales and mins of the 8 sub-blocks (ggml's kmask steps on the 12 scale
// bytes; the same values as q4_K_scale_min), times d and dmin, for the 8 rows at once: the
// scale words u0, u1, u2 of row r in lane r of three vectors (a 4 x 4 dword transpose within
// the 128-bit lanes of rows (i, i + 4)), the kmask steps once on them, then byte k of each
// result word converted and multiplied by the row's d (dmin) in place, so sw[j * 8 + r]
// comes out with no transpose. Per row, scalar kmask steps and a 16-byte load of 4 dword
// stores (a store-forwarding miss) had been ~40 % of the M = 1 kernel (bench/NOTES.md,
// stop 21 round 2). The products d * s are the same: the same bits.
template <>
const int GgufRows<block_q4_K>::MAX_CODE = 15;
template <>
QG_AVX2_INLINE unsigned GgufRows<block_q4_K>::scales8(int64_t fb, float* sw, float* mw, int32_t*) const {
    const __m256 d = f16_rows(*this, fb, offsetof(block_q4_K, d));
    const __m256 dmin = f16_rows(*this, fb, offsetof(block_q4_K, dmin));
    // 16 bytes from `scales`: its 12 and the first 4 of qs (unused), inside the block
    static_assert(offsetof(block_q4_K, scales) + 16 <= sizeof(block_q4_K), "q4_K scales8 reads 16 bytes");
    __m256i v[4];
    for (int i = 0; i < 4; ++i) v[i] = at2(i, fb, offsetof(block_q4_K, scales));  // [u0 u1 u2 - | row i + 4's]
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // lane r: word 0 / 1 / 2 of row r
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i m2 = _mm256_set1_epi32(0x03030303);
    const __m256i w[4] = {
        _mm256_and_si256(u0, m6),  // sc 0..3
        _mm256_or_si256(_mm256_and_si256(u2, m4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4)),
        _mm256_and_si256(u1, m6),  // m 0..3
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4))};
    const __m256i ff = _mm256_set1_epi32(0xff);
    for (int q = 0; q < 4; ++q) {  // w[q]: sub-blocks 4 (q & 1) .. + 3 of the scales (q < 2) or mins
        float* out = (q < 2 ? sw : mw) + 4 * (q & 1) * GROUP;
        const __m256 dd = q < 2 ? d : dmin;
        for (int k = 0; k < 4; ++k) {
            const __m256i byte = _mm256_and_si256(_mm256_srli_epi32(w[q], 8 * k), ff);
            _mm256_store_ps(out + k * GROUP, _mm256_mul_ps(dd, _mm256_cvtepi32_ps(byte)));
        }
    }
    return finite_mask(d) & finite_mask(dmin);
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_q4_K>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    constexpr int j = J;
    const int off = offsetof(block_q4_K, qs) + 32 * (j / 2);  // sub-block 2c: low nibbles, 2c + 1: high
    const __m256i m = _mm256_set1_epi8(0x0f);
    lo = at2(i, fb, off);
    hi = at2(i, fb, off + 16);
    if constexpr (j & 1) {
        lo = _mm256_srli_epi16(lo, 4);
        hi = _mm256_srli_epi16(hi, 4);
    }
    lo = _mm256_and_si256(lo, m);
    hi = _mm256_and_si256(hi, m);
}

template <>
const int GgufRows<block_q6_K>::MAX_CODE = 32;
template <>
QG_AVX2_INLINE unsigned GgufRows<block_q6_K>::scales8(int64_t fb, float* sw, float*, int32_t* sub) const {
    const unsigned finite = d_scales8(*this, fb, sw, offsetof(block_q6_K, d), SUBS);
    for (int r = 0; r < GROUP; ++r) {  // int8 scales -> int16 in both halves of an int32
        const __m256i s16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(at(r, fb) + offsetof(block_q6_K, scales))));
        const __m256i lo = _mm256_unpacklo_epi16(s16, s16), hi = _mm256_unpackhi_epi16(s16, s16);
        // unpack works per 128-bit lane: lo = parts 0..3 | 8..11, hi = 4..7 | 12..15
        _mm_storeu_si128((__m128i*)(sub + r * 16 + 0), _mm256_castsi256_si128(lo));
        _mm_storeu_si128((__m128i*)(sub + r * 16 + 4), _mm256_castsi256_si128(hi));
        _mm_storeu_si128((__m128i*)(sub + r * 16 + 8), _mm256_extracti128_si256(lo, 1));
        _mm_storeu_si128((__m128i*)(sub + r * 16 + 12), _mm256_extracti128_si256(hi, 1));
    }
    return finite;
}
template <>
QG_AVX2_INLINE unsigned GgufRows<block_q6_K>::scales8_t(int64_t fb, float* sw, int8_t* subt) const {
    const unsigned finite = d_scales8(*this, fb, sw, offsetof(block_q6_K, d), SUBS);
    // the 8 rows' 16 scale bytes transposed: bytes, then pairs, then quads of rows interleaved
    __m128i a[GROUP], b[GROUP];
    for (int r = 0; r < GROUP; ++r) a[r] = _mm_loadu_si128((const __m128i*)(at(r, fb) + offsetof(block_q6_K, scales)));
    for (int p = 0; p < 4; ++p) {  // b[2p]: parts 0..7 of rows 2p, 2p + 1; b[2p + 1]: parts 8..15
        b[2 * p] = _mm_unpacklo_epi8(a[2 * p], a[2 * p + 1]);
        b[2 * p + 1] = _mm_unpackhi_epi8(a[2 * p], a[2 * p + 1]);
    }
    for (int q = 0; q < 2; ++q)      // a[4q + h * 2 + e]: rows 4q .. 4q + 3 of parts 8h + 4e .. + 3
        for (int h = 0; h < 2; ++h) {
            a[4 * q + 2 * h] = _mm_unpacklo_epi16(b[4 * q + h], b[4 * q + 2 + h]);
            a[4 * q + 2 * h + 1] = _mm_unpackhi_epi16(b[4 * q + h], b[4 * q + 2 + h]);
        }
    for (int g = 0; g < 4; ++g) {  // parts 4g .. 4g + 3, 8 rows each
        _mm_storeu_si128((__m128i*)(subt + 32 * g), _mm_unpacklo_epi32(a[g], a[4 + g]));
        _mm_storeu_si128((__m128i*)(subt + 32 * g + 16), _mm_unpackhi_epi32(a[g], a[4 + g]));
    }
    return finite;
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_q6_K>::codes_u(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    constexpr int j = J;
    constexpr int h = j / 4, part = j % 4;  // Decoder<block_q6_K>: r = 32 part + i within half h
    const int ql = offsetof(block_q6_K, ql) + 64 * h + 32 * (part & 1), qh = offsetof(block_q6_K, qh) + 32 * h;
    __m256i c[2];
    for (int k = 0; k < 2; ++k) {
        const __m256i l =
            _mm256_and_si256(_mm256_srli_epi16(at2(i, fb, ql + 16 * k), 4 * (part >> 1)), _mm256_set1_epi8(0x0f));
        const __m256i u = _mm256_and_si256(_mm256_srli_epi16(at2(i, fb, qh + 16 * k), 2 * part), _mm256_set1_epi8(0x03));
        c[k] = _mm256_or_si256(l, _mm256_slli_epi16(u, 4));
    }
    lo = c[0];
    hi = c[1];
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_q6_K>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    codes_u<J>(i, fb, lo, hi);
    lo = _mm256_sub_epi8(lo, _mm256_set1_epi8(32));
    hi = _mm256_sub_epi8(hi, _mm256_set1_epi8(32));
}

// iq4_xs: ls_j = (nibble j%2 of scales_l[j/2]) | (bits 2j..2j+1 of scales_h) << 4, one lane per j
template <>
const int GgufRows<block_iq4_xs>::MAX_CODE = 127;
template <>
QG_AVX2_INLINE unsigned GgufRows<block_iq4_xs>::scales8(int64_t fb, float* sw, float*, int32_t*) const {
    const __m256 d = f16_rows(*this, fb, offsetof(block_iq4_xs, d));
    alignas(32) float dr[GROUP];
    _mm256_store_ps(dr, d);
    const __m256i lo_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i hi_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256 v[GROUP];
    for (int r = 0; r < GROUP; ++r) {
        const uint8_t* b = at(r, fb);
        const __m256i sl = _mm256_set1_epi32((int)ld_u32(b + offsetof(block_iq4_xs, scales_l)));
        const __m256i sh = _mm256_set1_epi32((int)ld_u16(b + offsetof(block_iq4_xs, scales_h)));
        const __m256i ls = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(sl, lo_shift), _mm256_set1_epi32(15)),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(sh, hi_shift),
                                                                              _mm256_set1_epi32(3)),
                                                             4));
        v[r] = _mm256_mul_ps(_mm256_broadcast_ss(dr + r),
                             _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
    }
    transpose8(v, sw);
    return finite_mask(d);
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_iq4_xs>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    constexpr int j = J;
    nibbles_lo_hi(at2(i, fb, offsetof(block_iq4_xs, qs) + 16 * j), lo, hi);
    lo = _mm256_shuffle_epi8(table16(kvalues_iq4nl), lo);
    hi = _mm256_shuffle_epi8(table16(kvalues_iq4nl), hi);
}

// iq3_xxs: db_j = (d * (0.5 + s_j)) * 0.5, s_j the top 4 bits of sub-block j's word
template <>
const int GgufRows<block_iq3_xxs>::MAX_CODE = 62;
template <>
QG_AVX2_INLINE unsigned GgufRows<block_iq3_xxs>::scales8(int64_t fb, float* sw, float*, int32_t*) const {
    const __m256 d = f16_rows(*this, fb, offsetof(block_iq3_xxs, d));
    alignas(32) float dr[GROUP];
    _mm256_store_ps(dr, d);
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256 v[GROUP];
    for (int r = 0; r < GROUP; ++r) {
        const __m256i aux = _mm256_loadu_si256((const __m256i*)(at(r, fb) + offsetof(block_iq3_xxs, qs) + QK_K / 4));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28));
        v[r] = _mm256_mul_ps(_mm256_mul_ps(_mm256_broadcast_ss(dr + r), _mm256_add_ps(half, s)), half);
    }
    transpose8(v, sw);
    return finite_mask(d);  // db is finite where d is: |d| <= 65504 and s <= 15
}
template <>
template <int J>
QG_AVX2_INLINE void GgufRows<block_iq3_xxs>::codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
    constexpr int j = J;
    const uint8_t* q0 = at(i, fb) + offsetof(block_iq3_xxs, qs);
    const uint8_t* q4 = at(i + 4, fb) + offsetof(block_iq3_xxs, qs);
    const uint8_t *a = q0 + 8 * j, *b = q4 + 8 * j;  // grid indices, 4 elements each
    const auto sign_bits = [](const uint8_t* qs, int j) {  // bit e: element e negative
        const uint32_t aux = ld_u32(qs + QK_K / 4 + 4 * j);
        uint32_t s = 0;
        for (int g = 0; g < 4; ++g) s |= (uint32_t)ksigns_iq2xs[(aux >> (7 * g)) & 127] << (8 * g);
        return (int32_t)s;
    };
    const __m256i s32 = set2(sign_bits(q0, j), sign_bits(q4, j));
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i c[2];
    for (int k = 0; k < 2; ++k) {  // elements 16k .. 16k + 15 of both rows
        const uint8_t *x = a + 4 * k, *y = b + 4 * k;
        const __m256i mag = _mm256_setr_epi32(
            (int)iq3xxs_grid[x[0]], (int)iq3xxs_grid[x[1]], (int)iq3xxs_grid[x[2]], (int)iq3xxs_grid[x[3]],
            (int)iq3xxs_grid[y[0]], (int)iq3xxs_grid[y[1]], (int)iq3xxs_grid[y[2]], (int)iq3xxs_grid[y[3]]);
        // byte e of the mask is all ones where sign bit 16k + e is set: byte 2k + e/8 of
        // the row's sign word to every byte, then one bit test per byte
        const char b0 = (char)(2 * k), b1 = (char)(2 * k + 1);
        const __m256i spread = _mm256_shuffle_epi8(
            s32, _mm256_setr_epi8(b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1, b0, b0, b0, b0, b0,
                                  b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1));
        const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        c[k] = _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg);  // neg ? -mag : mag
    }
    lo = c[0];
    hi = c[1];
}

// iq3_xxs where the CPU has AVX-512 VBMI (cpu::int8_vbmi()): the 8 rows' codes of each
// format block decoded at once by iq3_xxs_codes_vbmi into buf when its scales are (scales8
// comes first for every format block, in the rows kernel and the panel fill), then read as
// q8_0's codes are; the scales as GgufRows<block_iq3_xxs>. The same codes: the same bits.
struct Iq3xxsVbmiRows : GgufRows<block_iq3_xxs> {
    using GgufRows::GgufRows;
    alignas(64) mutable int8_t buf[GROUP * QK_K];  // [row][element] of the current format block
    QG_AVX2_INLINE unsigned scales8(int64_t fb, float* sw, float* mw, int32_t* sub) const {
        const uint8_t* blocks[GROUP];
        for (int r = 0; r < GROUP; ++r) blocks[r] = at(r, fb);
        iq3_xxs_codes_vbmi(blocks, buf);
        return GgufRows::scales8(fb, sw, mw, sub);
    }
    template <int J>
    QG_AVX2_INLINE void codes(int i, int64_t, __m256i& lo, __m256i& hi) const {
        const uint8_t* a = (const uint8_t*)buf + i * QK_K + Q8_BLOCK * J;
        const uint8_t* b = a + 4 * QK_K;  // row i + 4
        lo = load2(a, b);
        hi = load2(a + 16, b + 16);
    }
};
static_assert(IQ3_VBMI_ROWS == GROUP, "iq3_xxs_codes_vbmi decodes one pass of rows");

// The decoder F's AVX-512 VBMI form, where a format has one (void: none).
template <class F>
struct VbmiForm {
    using type = void;
};
template <>
struct VbmiForm<GgufRows<block_iq3_xxs>> {
    using type = Iq3xxsVbmiRows;
};

struct Mxfp4Rows {
    static constexpr int SUBS = 1;
    // signed here (|w| <= 12 sums 16 products in int16; the panel stores w + 12)
    static constexpr bool SIGNED = true, SUB = false, MW = false, ROW_OFF = false;
    static constexpr int OFF = 0, MAX_CODE = 12;
    const uint8_t* blocks[GROUP];  // [K/32][16] of each row
    const uint8_t* next[GROUP];    // ... of the rows a group further on
    const uint8_t* e[GROUP];       // [K/32]
    Mxfp4Rows(const Mxfp4Src& src, int g0) {
        for (int r = 0; r < GROUP; ++r) {
            blocks[r] = src.blocks[g0 + r];
            next[r] = src.blocks[g0 + GROUP + r];
            e[r] = src.scales[g0 + r];
        }
    }
    // the panel stores w + 12 (KIND_MXFP4)
    QG_AVX2_INLINE void to_panel(int, const int32_t*, __m256i& lo, __m256i& hi) const {
        lo = _mm256_add_epi8(lo, _mm256_set1_epi8((char)KIND_MXFP4.offset));
        hi = _mm256_add_epi8(hi, _mm256_set1_epi8((char)KIND_MXFP4.offset));
    }
    QG_AVX2_INLINE void prefetch(int64_t fb) const {
        if ((fb & 3) == 0)
            for (int r = 0; r < GROUP; ++r) prefetch_row(blocks[r], next[r], fb * MXFP4_BLOCK_BYTES);
    }
    // mxfp4_scale for the 8 rows in vector lanes (8 scalar calls had cost about as much as
    // the block's multiply): the bytes packed in a general register as f16_rows packs
    // its halves, then e8m0_half's three cases by blends
    QG_AVX2_INLINE unsigned scales8(int64_t fb, float* sw, float*, int32_t*) const {
        uint64_t v = 0;
        for (int r = 0; r < GROUP; ++r) v |= (uint64_t)e[r][fb] << (8 * r);
        __asm__("" : "+r"(v));
        const __m256i ev = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(ev, _mm256_set1_epi32(1)), 23);  // (e - 1) << 23
        const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ev);  // e < 2: 0x00200000 << e
        __m256i bits = _mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), ev));
        bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(ev, _mm256_set1_epi32(255)));
        _mm256_store_ps(sw, _mm256_castsi256_ps(bits));
        const __m256i ok = _mm256_cmpgt_epi32(_mm256_set1_epi32(MXFP4_E_OVERFLOW), ev);
        return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(ok));
    }
    template <int J>
    QG_AVX2_INLINE void codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
        nibbles_interleaved(load2(blocks[i] + fb * MXFP4_BLOCK_BYTES, blocks[i + 4] + fb * MXFP4_BLOCK_BYTES), lo, hi);
        lo = _mm256_shuffle_epi8(table16(kvalues_mxfp4_x2), lo);
        hi = _mm256_shuffle_epi8(table16(kvalues_mxfp4_x2), hi);
    }
};

struct Int4Rows {
    static constexpr int SUBS = 1;
    // the nibbles q as they are, the kernel taking z * S off (the panel stores q - z + 15)
    static constexpr bool SIGNED = false, SUB = false, MW = false, ROW_OFF = true;
    static constexpr int OFF = 0, MAX_CODE = 15;
    const int32_t* qweight[GROUP];  // [K/8] of each row
    const int32_t* next[GROUP];     // ... of the rows a group further on
    const void* scales_row[GROUP];  // [K/G]
    int64_t n[GROUP];               // the row's index (for its zero-point)
    qg_dtype scale_dtype;
    const int32_t* qzeros;
    int64_t groups;
    int group_size;
    Int4Rows(const Int4Src& src, int g0)
        : scale_dtype(src.scale_dtype), qzeros(src.qzeros), groups(src.groups), group_size(src.group_size) {
        for (int r = 0; r < GROUP; ++r) {
            qweight[r] = src.qweight[g0 + r];
            next[r] = src.qweight[g0 + GROUP + r];
            scales_row[r] = src.scales_row[g0 + r];
            n[r] = src.n[g0 + r];
        }
    }
    // the panel stores q - z + 15 (KIND_INT4): z of rows i, i + 4 from scales8's sub[]
    QG_AVX2_INLINE void to_panel(int i, const int32_t* sub, __m256i& lo, __m256i& hi) const {
        const __m256i add = _mm256_sub_epi8(_mm256_set1_epi8((char)KIND_INT4.offset),
                                            _mm256_setr_epi32(sub[i], sub[i], sub[i], sub[i], sub[i + 4], sub[i + 4],
                                                              sub[i + 4], sub[i + 4]));
        // sub[] holds z (< 16) in the low byte of each word: spread it to every byte
        const __m256i bytes = _mm256_shuffle_epi8(add, _mm256_setzero_si256());
        lo = _mm256_add_epi8(lo, bytes);
        hi = _mm256_add_epi8(hi, bytes);
    }
    QG_AVX2_INLINE void prefetch(int64_t fb) const {
        if ((fb & 3) == 0)
            for (int r = 0; r < GROUP; ++r) prefetch_row(qweight[r], next[r], 4 * fb * (int64_t)sizeof(int32_t));
    }
    // The current group's scales and zero-points, decoded when a block starts a new group
    // (G / 32 blocks share them).
    mutable int64_t group = -1;
    mutable unsigned group_ok = 0;
    alignas(32) mutable float gs[GROUP];
    alignas(32) mutable int32_t gz[GROUP];
    // sub[r]: the zero-point z of row r's group (int16 pairs (z, 0) for vpmaddwd)
    QG_AVX2_INLINE unsigned scales8(int64_t fb, float* sw, float*, int32_t* sub) const {
        const int64_t g = fb * Q8_BLOCK / group_size;
        if (g != group) {
            group = g;
            group_ok = 0;
            for (int r = 0; r < GROUP; ++r) {
                int b;
                group_ok |= (int4_group(scales_row[r], scale_dtype, qzeros, n[r], groups, g, gs + r, &b) ? 1u : 0u) << r;
                gz[r] = KIND_INT4.offset - b;
            }
        }
        _mm256_store_ps(sw, _mm256_load_ps(gs));
        _mm256_store_si256((__m256i*)sub, _mm256_load_si256((const __m256i*)gz));
        return group_ok;
    }
    template <int J>
    QG_AVX2_INLINE void codes(int i, int64_t fb, __m256i& lo, __m256i& hi) const {
        nibbles_interleaved(load2((const uint8_t*)(qweight[i] + 4 * fb), (const uint8_t*)(qweight[i + 4] + 4 * fb)), lo,
                            hi);
    }
    // z of each row (from scales8) times the activation sum S: vpmaddwd of (z, 0) with S
    // in the low half
    QG_AVX2_INLINE __m256i zero_times(const int32_t* sub, int32_t sum) const {
        return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)sub), _mm256_set1_epi32(sum));
    }
};

// ---------------------------------------------------------------- the kernel

// Block sums of rows i, i + 4 from their partial sums t0..t3 (pairs (0, 4), (1, 5), ...),
// exact; the int32 lane r of the result = row r:
//   int32 partials (4 lanes per row): pairs [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d];
//   int16 partials (8 lanes per row, when 16 products fit in int16): pairs
//       [a0+a4, b0+b4, a1+a5, ...], then [a0246, b0246, c0246, d0246, a1357, ...], then
//       widened (unpacked with their signs) and the two halves added.
// Every step works within 128-bit lanes: rows 0..3 in the low one, 4..7 in the high.
QG_AVX2_INLINE __m256i sum4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
QG_AVX2_INLINE __m256i sum4_i16(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
    const __m256i cd = _mm256_add_epi16(_mm256_unpacklo_epi16(c, d), _mm256_unpackhi_epi16(c, d));
    const __m256i w = _mm256_add_epi16(_mm256_unpacklo_epi32(ab, cd), _mm256_unpackhi_epi32(ab, cd));
    const __m256i sign = _mm256_srai_epi16(w, 15);
    return _mm256_add_epi32(_mm256_unpacklo_epi16(w, sign), _mm256_unpackhi_epi16(w, sign));
}

// int16 partial sums through the kernel's add tree while 16 products fit: 16 * max|w| * 127
// < 2^15 (no vpmaddwd until the block's sum)
template <class F>
constexpr bool rows_tree16() {
    return !F::SUB && 16 * F::MAX_CODE * 127 <= 32767;
}
// The AVX-512 VNNI copy of the kernel (vpdpbusd) serves every format where the CPU has it
// (rows_kernel below). One thread, 2048 x 4096, Zen 5, best of 0.4-1.5 s: M = 1 iq4_xs
// 0.30 -> 0.26 ms, q4_K 0.30 -> 0.28, the rest even; M = 2 5-25 % faster (mxfp4 0.45 -> 0.37).
// Built for AVX-512 before the MXFP4 scales were vectorised, the same kernel had made mxfp4
// slower (0.37 -> 0.47 ms at M = 1). q6_K (sub-block scales) takes its own steps there
// (block_sums_sub; bench/NOTES.md, "q6_K on vpdpbusd").

namespace avx2 {
#define QG_ROWS_VNNI 0
#define QG_ROWS_FN QG_AVX2
#define QG_ROWS_INLINE QG_AVX2_INLINE
#include "cpu/int8_rows_kernel.inc"
#undef QG_ROWS_VNNI
#undef QG_ROWS_FN
#undef QG_ROWS_INLINE
}  // namespace avx2

namespace vnni {
#define QG_ROWS_VNNI 1
#define QG_ROWS_FN QG_AVX512
#define QG_ROWS_INLINE QG_AVX512_INLINE
#include "cpu/int8_rows_kernel.inc"
#undef QG_ROWS_VNNI
#undef QG_ROWS_FN
#undef QG_ROWS_INLINE
}  // namespace vnni

// Blocks J .. SUBS - 1 of format block fb into the panel, panel block index pb + J.
template <class F, int J>
QG_AVX2_INLINE void fill_steps(const F& f, int64_t fb, int64_t pb, int h, const float* sw, const float* mw,
                               const int32_t* sub, const PanelOut& out) {
    if constexpr (J < F::SUBS) {
        const int64_t b = pb + J;
        _mm256_storeu_ps(out.sw + b * PANEL_ROWS + 8 * h, _mm256_load_ps(sw + J * GROUP));
        if constexpr (F::MW) _mm256_storeu_ps(out.mw + b * PANEL_ROWS + 8 * h, _mm256_load_ps(mw + J * GROUP));
        if constexpr (F::SUB) {
            for (int u = 0; u < 2; ++u)
                for (int r = 0; r < GROUP; ++r) out.sub[(2 * b + u) * PANEL_ROWS + 8 * h + r] = sub[r * 16 + 2 * J + u];
        }
        __m256i lo[4], hi[4];
        for (int i = 0; i < 4; ++i) {
            f.template codes<J>(i, fb, lo[i], hi[i]);
            f.to_panel(i, sub, lo[i], hi[i]);
        }
        store_k4_groups(lo, hi, out.codes + b * PANEL_BLOCK_BYTES + 32 * h);
        fill_steps<F, J + 1>(f, fb, pb, h, sw, mw, sub, out);
    }
}

// Format blocks [fb0, fb0 + nfb) of the 8 rows of f into rows 8h .. 8h + 7 of a panel.
template <class F>
QG_AVX2 void panel_run(const F& f, int64_t fb0, int64_t nfb, int h, const PanelOut& out, bool* ok) {
    constexpr int S = F::SUBS;
    alignas(32) float sw[S * GROUP], mw[S * GROUP];
    alignas(32) int32_t sub[2 * S * GROUP];
    unsigned finite = (1u << GROUP) - 1;
    for (int64_t i = 0; i < nfb; ++i) {
        f.prefetch(fb0 + i);
        finite &= f.scales8(fb0 + i, sw, mw, sub);
        fill_steps<F, 0>(f, fb0 + i, i * S, h, sw, mw, sub, out);
    }
    for (int r = 0; r < GROUP; ++r) ok[8 * h + r] = ok[8 * h + r] && ((finite >> r) & 1u);
}

}  // namespace
#endif  // QG_INT8_HAVE_AVX2

bool rows_available() {
#if QG_INT8_HAVE_AVX2
    static const bool avx2 = int8_isa() >= Isa::AVX2;
    return avx2;
#else
    return false;
#endif
}

// The rows kernel's vpdpbusd copy (int8_rows_kernel.inc) at AVX-512 VNNI and up.
[[maybe_unused]] static bool rows_vnni() {
    static const bool vnni = int8_isa() >= Isa::AVX512_VNNI;
    return vnni;
}

int64_t rows_max_m() {
    const bool vnni_panels = rows_vnni();  // the panels' dot is vpdpbusd too
    return vnni_panels ? 2 : 4;
}

// The entry points build a decoder on 8 rows of the source; without AVX2 they are never
// called (rows_available() is false) and compile to nothing.
#if QG_INT8_HAVE_AVX2
// run(decoder F of rows g0 .. g0 + 7 of src), or of F's VBMI form where this CPU has VBMI.
template <class F, class Src, class Run>
void with_rows(const Src& src, int g0, Run&& run) {
    using V = typename VbmiForm<F>::type;
    if constexpr (!std::is_void<V>::value) {
        if (int8_vbmi()) return run(V(src, g0));
    }
    run(F(src, g0));
}

#define QG_ROWS_ENTRIES(SRC, F, ELEMS)                                                                     \
    void rows_kernel(const SRC& src, int g0, int64_t K, const Q8Rows& x, float* acc, bool* ok) {             \
        with_rows<F>(src, g0, [&](const auto& f) {                                                           \
            if (rows_vnni())                                                                                 \
                vnni::rows_run(f, K / (ELEMS), x, acc + g0, ok + g0);                                        \
            else                                                                                             \
                avx2::rows_run(f, K / (ELEMS), x, acc + g0, ok + g0);                                        \
        });                                                                                                  \
    }                                                                                                        \
    void panel_fill(const SRC& src, int64_t k0, int64_t kc, const PanelOut& out, bool* ok) {                 \
        for (int h = 0; h < 2; ++h)                                                                          \
            with_rows<F>(src, 8 * h, [&](const auto& f) { panel_run(f, k0 / (ELEMS), kc / (ELEMS), h, out, ok); }); \
    }
#else
#define QG_ROWS_ENTRIES(SRC, F, ELEMS)                                                             \
    void rows_kernel(const SRC&, int, int64_t, const Q8Rows&, float*, bool*) {}                      \
    void panel_fill(const SRC&, int64_t, int64_t, const PanelOut&, bool*) {}
#endif
#define QG_X(NAME, BLOCK, ELEMS) QG_ROWS_ENTRIES(GgufSrc<BLOCK>, GgufRows<BLOCK>, ELEMS)
QG_GGUF_FORMATS(QG_X)
#undef QG_X
QG_ROWS_ENTRIES(Mxfp4Src, Mxfp4Rows, MXFP4_BLOCK)
QG_ROWS_ENTRIES(Int4Src, Int4Rows, Q8_BLOCK)
#undef QG_ROWS_ENTRIES

}  // namespace cpu
}  // namespace qg
