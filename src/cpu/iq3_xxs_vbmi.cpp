// iq3_xxs_codes_vbmi (iq3_xxs_vbmi.h). Per row and format block, 256 elements:
//   magnitudes: the 64 grid indices permuted once (vpermb), then byte c of each index's
//       grid word from the grid's byte plane c (256 entries: two vpermi2b over 128 each,
//       chosen by the index's bit 7) for c = 0..3, and the 4 planes interleaved by 8 unpacks;
//   signs: the 32 7-bit sign fields put in bytes by one vpmultishiftqb, looked up in
//       ksigns_iq2xs (128 bytes, one vpermi2b): the 32 sign bytes are then the block's 256
//       sign bits in element order; each 64 elements' 8 bytes spread to one per element
//       (vpermb) and tested against the element's bit (vptestmb) give the mask of a masked
//       0 - w (vpsubb).
// About 50 instructions a row and block, where the AVX2 decoder takes about 400 for 8 rows
// and 32 elements (bench/NOTES.md, stop 21).
#include "cpu/iq3_xxs_vbmi.h"

#include <stddef.h>

#include "cpu/dequant.h"
#include "cpu/int8_avx2.h"

namespace qg {
namespace cpu {

#if QG_INT8_HAVE_AVX512
namespace {

#define QG_AVX512_VBMI __attribute__((target(QG_AVX512_TARGET ",avx512vbmi")))

// Byte tables of the decode, built once from the format's tables (dequant.h).
struct Iq3VbmiTables {
    // plane[c][e] = byte c of iq3xxs_grid[e]: element 4l + c of a sub-block's grid index l
    // (Decoder<block_iq3_xxs>; little-endian)
    alignas(64) uint8_t plane[4][QK_K];
    // perm[16 L + 4 s + p] = 16 s + 4 L + p (L, s, p < 4): the index order in which the
    // unpacks, which work per 128-bit lane, leave output vector s = elements 64 s .. 64 s + 63
    // in order. unpacklo/hi_epi8 of planes (0, 1) and (2, 3), then unpacklo/hi_epi16 of
    // those: lane L of vector s holds the planes of permuted positions 16 L + 4 s + p,
    // which must be grid index 16 s + 4 L + p (elements 64 s + 16 L + 4 p + c).
    alignas(64) uint8_t perm[64];
    // the bit offsets of the 7-bit sign fields in a 64-bit pair of scale-and-signs words
    // (sub-blocks 2t, 2t + 1): 7 g and 32 + 7 g for g < 4 (the byte's bit 7 is ignored by
    // the 128-entry vpermi2b)
    alignas(64) uint8_t fields[64];
    // spread[s][x] = 8 s + x / 8: the sign byte of element 64 s + x; bit[x] = 1 << x % 8
    alignas(64) uint8_t spread[4][64];
    alignas(64) uint8_t bit[64];
    alignas(64) uint8_t ksigns[128];
};

Iq3VbmiTables make_tables() {
    Iq3VbmiTables t;
    for (int c = 0; c < 4; ++c)
        for (int e = 0; e < QK_K; ++e) t.plane[c][e] = (uint8_t)(iq3xxs_grid[e] >> (8 * c));
    for (int L = 0; L < 4; ++L)
        for (int s = 0; s < 4; ++s)
            for (int p = 0; p < 4; ++p) t.perm[16 * L + 4 * s + p] = (uint8_t)(16 * s + 4 * L + p);
    for (int i = 0; i < 64; ++i) t.fields[i] = (uint8_t)(32 * (i % 8 / 4) + 7 * (i % 4));
    for (int s = 0; s < 4; ++s)
        for (int x = 0; x < 64; ++x) t.spread[s][x] = (uint8_t)(8 * s + x / 8);
    for (int x = 0; x < 64; ++x) t.bit[x] = (uint8_t)(1u << (x % 8));
    for (int i = 0; i < 128; ++i) t.ksigns[i] = ksigns_iq2xs[i];
    return t;
}

const Iq3VbmiTables& tables() {
    static const Iq3VbmiTables t = make_tables();
    return t;
}

inline QG_AVX512_VBMI __m512i load64(const uint8_t* p) { return _mm512_load_si512((const void*)p); }

}  // namespace

// GCC 12 warns about its own _mm512_undefined_epi32 (self-initialised on purpose) inside
// these intrinsics, as int8_dot.cpp notes: a false positive, silenced for this function.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
QG_AVX512_VBMI void iq3_xxs_codes_vbmi(const uint8_t* const* blocks, int8_t* out) {
    const Iq3VbmiTables& t = tables();
    __m512i grid[4][4];  // plane c, entries 64 q .. 64 q + 63
    for (int c = 0; c < 4; ++c)
        for (int q = 0; q < 4; ++q) grid[c][q] = load64(t.plane[c] + 64 * q);
    const __m512i perm = load64(t.perm), fields = load64(t.fields), bit = load64(t.bit);
    const __m512i ks_lo = load64(t.ksigns), ks_hi = load64(t.ksigns + 64), zero = _mm512_setzero_si512();
    for (int r = 0; r < IQ3_VBMI_ROWS; ++r) {
        const uint8_t* qs = blocks[r] + offsetof(block_iq3_xxs, qs);
        const __m512i idx = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512((const void*)qs));
        const __mmask64 upper = _mm512_movepi8_mask(idx);  // grid entries 128..255
        __m512i p[4];
        for (int c = 0; c < 4; ++c)
            p[c] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(grid[c][0], idx, grid[c][1]),
                                          _mm512_permutex2var_epi8(grid[c][2], idx, grid[c][3]));
        const __m512i l01 = _mm512_unpacklo_epi8(p[0], p[1]), h01 = _mm512_unpackhi_epi8(p[0], p[1]);
        const __m512i l23 = _mm512_unpacklo_epi8(p[2], p[3]), h23 = _mm512_unpackhi_epi8(p[2], p[3]);
        const __m512i mag[4] = {_mm512_unpacklo_epi16(l01, l23), _mm512_unpackhi_epi16(l01, l23),
                                _mm512_unpacklo_epi16(h01, h23), _mm512_unpackhi_epi16(h01, h23)};
        // the 8 scale-and-signs words (bytes 64..95 of qs: the block's last bytes)
        const __m256i aux = _mm256_loadu_si256((const __m256i*)(qs + QK_K / 4));
        const __m512i f7 = _mm512_multishift_epi64_epi8(fields, _mm512_zextsi256_si512(aux));
        const __m512i signs = _mm512_permutex2var_epi8(ks_lo, f7, ks_hi);  // bytes 0..31
        for (int s = 0; s < 4; ++s) {
            const __mmask64 neg = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(load64(t.spread[s]), signs), bit);
            _mm512_storeu_si512((void*)(out + r * QK_K + 64 * s), _mm512_mask_sub_epi8(mag[s], neg, zero, mag[s]));
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
void iq3_xxs_codes_vbmi(const uint8_t* const*, int8_t*) {}  // never called: int8_vbmi() is false
#endif

}  // namespace cpu
}  // namespace qg
