// The GGUF frag layout (qg_gguf_repack): where a GGUF block's codes and scales go in the W4A16
// frag planes (src/formats/w4a16_frag.h). Shared by the CPU repack (src/gguf_layout.cpp), the
// GPU one (hip/w4a16_repack.hip) and the GPU tiers that read it;
// pyquant/formats/gguf_frag.py is the specification, docs/gguf-layout.md says why.
//
// Q4_0: its weight d * (q - 8) is a W4A16 weight of G = 32, symmetric (z = 8), with the
// block's fp16 d as the group's scale, so the planes hold the block's bits reordered.
//
// Q4_K: its weight (d * sc) * q - (dmin * m) (sc, m: 6-bit integers per 32 elements; d, dmin:
// fp16 per 256) keeps every integer as it is: the codes plane as Q4_0's, and the scales plane
//   records  uint16 [RB][KC][8 g][4 c][2 h]   sc | m << 8 of row 16 rb + g + 8 h, group 4 kc + c
//            (the W4A16 scales plane of G = 32, these records in place of the scales)
//   then     uint16 [RB][KC / 2][8 g][2 f][2 h] the fp16 bits of d (f = 0) and dmin (f = 1) of
//            row 16 rb + g + 8 h, super-block kc / 2: two 32-bit words per lane row g, each
//            row g in the low half and g + 8 in the high one, as the scale words
// (K % 256 == 0, so KC is even and no chunk straddles a super-block). 4.625 bits a weight
// against the blocks' 4.5: the 6-bit scales unpacked to bytes. Nothing is rounded.
//
// Q8_0: its weight d * q (q: an int8 code, d: fp16 per 32) keeps Q4_0's scales plane (each
// block's d) and has a byte plane for the codes, twice the nibble plane's size:
//   w  uint32 [RB][KB = Kp / 32][32 lanes][4 words]   tile (rb, kb) = rows 16 rb.., k 32 kb..
// byte b of word w of lane 4 g + t: row g + 8 (b % 2), k 16 (w / 2) + 2 t + b / 2 + 8 (w % 2) of
// the tile (byte_row, byte_k): word w is the A register pair 2 (w % 2), + 1 of k16 step w / 2,
// bytes 0, 2 the first register's halves, 1, 3 the second's. 8.5 bits a weight, as the blocks.
//
// IQ4_XS: its weight (d * (ls - 32)) * kvalues[q] (q: a 4-bit index into the IQ4_NL codebook,
// ls: 6-bit per 32, d: fp16 per 256) takes Q4_K's planes: the indices as the codes, ls as the
// record (high byte 0), d where Q4_K's d is and 0 for dmin. 4.625 bits a weight against the
// blocks' 4.25 (the same planes for both formats; a tighter IQ4_XS plane is left for later). Its
// nibbles are placed by register (code_nibble below), as IQ3_XXS's are.
//
// Q6_K: its weight (d * sc) * (q - 32) (q: a 6-bit code, sc: an int8 scale per 16 elements, d:
// fp16 per 256) takes Q8_0's byte plane for the codes less 32 (int8 -32..31) and Q4_K's scales
// plane: the record of sub-block pair j holds sc[2j] | sc[2j + 1] << 8 (their bytes), d where
// Q4_K's d is and 0 for dmin. 8.625 bits a weight against the blocks' 6.5625 (the codes widened
// to bytes: the kernels read them as Q8_0's). Nothing is rounded.
//
// IQ3_XXS: its weight ((d * (0.5 + ls)) * 0.5) * grid * sign (grid: one of the 8 magnitudes 4, 12,
// .., 52, 62 that a 256-entry grid gives each element, 4 at a time; sign: 7 stored bits per 8
// elements, the 8th their parity; ls: 4-bit per 32, d: fp16 per 256) is a 4-bit code per element,
// magnitude index | sign << 3 (the index (grid - 4) / 8, 62 -> 7), valued by a 16-entry codebook
// as IQ4_XS's indices are: IQ4_XS's planes, ls as the record, d where Q4_K's d is and 0 for dmin.
// 4.625 bits a weight against the blocks' 3.0625: the grid's 12 bits of 4 magnitudes and the
// signs' parity spelled out, so that a lane's registers come from its own nibbles (a grid entry
// spans two lanes' k pairs). Every block round-trips; the inverse (the CPU tier on a frag
// weight) refuses planes no block gives: 4 magnitudes not in the grid, 8 signs of odd parity, a
// record above 15.
#pragma once

#include <stdint.h>

#include "formats/w4a16_frag.h"
#include "quantgemm.h"

namespace qg {
namespace gguf_frag {

constexpr int kGroup = 32;         // one scale (record) per 32 elements in every format
constexpr int kQ4_0Bytes = 18;     // fp16 d, then qs[16]
constexpr int kQ4_0Codes = 2;      // byte offset of qs
constexpr int kQ8_0Bytes = 34;     // fp16 d, then qs[32] (int8)
constexpr int kQ8_0Codes = 2;
constexpr int kByteTileK = 32;     // k of a Q8_0 weights tile (16 bytes a lane: two k16 steps)
constexpr int kQ4_KElems = 256;    // a Q4_K super-block
constexpr int kQ4_KBytes = 144;    // fp16 d, fp16 dmin, scales[12], qs[128]
constexpr int kQ4_KScales = 4;
constexpr int kQ4_KCodes = 16;
constexpr int kIQ4_XSBytes = 136;  // fp16 d, scales_h (uint16), scales_l[4], qs[128]
constexpr int kIQ4_XSCodes = 8;
constexpr int kQ6_KBytes = 210;    // ql[128], qh[64], scales[16] (int8), fp16 d
constexpr int kQ6_KHigh = 128;     // byte offset of qh
constexpr int kQ6_KScales = 192;
constexpr int kQ6_KD = 208;
constexpr int kIQ3_XXSBytes = 98;  // fp16 d, qs[64] (grid indices), then 8 uint32 sign / scale words
constexpr int kIQ3_XXSGrid = 2;
constexpr int kIQ3_XXSSigns = 66;

// The fp16 bits at byte `off` of a block (little-endian; rows are 2-byte aligned): Q4_0's d
// at 0, Q4_K's d at 0 and dmin at 2; and the inverse.
QG_FRAG_HD inline uint16_t f16_at(const uint8_t* block, int off) {
    return static_cast<uint16_t>(block[off] | (block[off + 1] << 8));
}
QG_FRAG_HD inline void put_f16_at(uint8_t* block, int off, uint16_t bits) {
    block[off] = static_cast<uint8_t>(bits & 0xffu);
    block[off + 1] = static_cast<uint8_t>(bits >> 8);
}

// The record sc | m << 8 of sub-block j (0..7): the 6-bit fields of scales[12] as ggml's
// get_scale_min_k4 reads them.
QG_FRAG_HD inline uint16_t q4_K_record(const uint8_t* block, int j) {
    const uint8_t* s = block + kQ4_KScales;
    const uint32_t sc = j < 4 ? s[j] & 63u : (s[j + 4] & 15u) | ((s[j - 4] >> 6) << 4);
    const uint32_t m = j < 4 ? s[j + 4] & 63u : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    return static_cast<uint16_t>(sc | (m << 8));
}
// The inverse: scales[12] from the 8 records of a block.
QG_FRAG_HD inline void q4_K_pack_records(const uint16_t (&rec)[8], uint8_t* block) {
    uint8_t* s = block + kQ4_KScales;
    for (int j = 0; j < 4; ++j) {
        const uint32_t sc = rec[j] & 63u, m = (rec[j] >> 8) & 63u;
        const uint32_t sc4 = rec[j + 4] & 63u, m4 = (rec[j + 4] >> 8) & 63u;
        s[j] = static_cast<uint8_t>(sc | ((sc4 >> 4) << 6));
        s[j + 4] = static_cast<uint8_t>(m | ((m4 >> 4) << 6));
        s[j + 8] = static_cast<uint8_t>((sc4 & 15u) | ((m4 & 15u) << 4));
    }
}

// The record of sub-block j: ls (6 bits: the low 4 in scales_l, the high 2 in scales_h).
QG_FRAG_HD inline uint16_t iq4_xs_record(const uint8_t* block, int j) {
    const uint32_t sh = block[2] | (block[3] << 8);
    return static_cast<uint16_t>(((block[4 + j / 2] >> (4 * (j & 1))) & 15u) | (((sh >> (2 * j)) & 3u) << 4));
}
// The inverse: scales_h and scales_l from the 8 records of a block.
QG_FRAG_HD inline void iq4_xs_pack_records(const uint16_t (&rec)[8], uint8_t* block) {
    uint32_t sh = 0;
    for (int j = 0; j < 8; ++j) sh |= ((rec[j] >> 4) & 3u) << (2 * j);
    block[2] = static_cast<uint8_t>(sh & 0xffu);
    block[3] = static_cast<uint8_t>(sh >> 8);
    for (int j = 0; j < 4; ++j) block[4 + j] = static_cast<uint8_t>((rec[2 * j] & 15u) | ((rec[2 * j + 1] & 15u) << 4));
}

// Q6_K's 6-bit code of element e (0..255) of a block: the low nibble in ql, the high two bits in
// qh (ggml's block_q6_K: e = 128 h + 32 j + l keeps its nibble in ql[64 h + 32 (j & 1) + l] at
// bit 4 (j >> 1), its high bits in qh[32 h + l] at bit 2 j); and the inverse, ORed into a zeroed
// block.
QG_FRAG_HD inline uint32_t q6_K_code(const uint8_t* block, int e) {
    const int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
    const uint32_t lo = (block[64 * h + 32 * (j & 1) + l] >> (4 * (j >> 1))) & 15u;
    const uint32_t hi = (block[kQ6_KHigh + 32 * h + l] >> (2 * j)) & 3u;
    return lo | (hi << 4);
}
QG_FRAG_HD inline void q6_K_put_code(uint8_t* block, int e, uint32_t q) {
    const int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
    block[64 * h + 32 * (j & 1) + l] |= static_cast<uint8_t>((q & 15u) << (4 * (j >> 1)));
    block[kQ6_KHigh + 32 * h + l] |= static_cast<uint8_t>(((q >> 4) & 3u) << (2 * j));
}

// IQ3_XXS: the sign / scale word of sub-block j, and element e's 4-bit code: its grid magnitude's
// index (grid: the 256-entry IQ3_XXS grid, 4 magnitudes a word, src/formats/iq_tables.h) | its
// sign << 3, the sign bit i of 8 being bit i of the stored 7 and their parity.
QG_FRAG_HD inline uint32_t iq3_xxs_word(const uint8_t* block, int j) {
    const uint8_t* b = block + kIQ3_XXSSigns + 4 * j;
    return b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
}
// The magnitude index of a grid byte: 4, 12, .., 52 -> 0..6, 62 -> 7.
QG_FRAG_HD inline uint32_t iq3_xxs_mag_index(uint32_t mag) { return (mag - 4u) >> 3; }
QG_FRAG_HD inline uint32_t iq3_xxs_code(const uint8_t* block, int e, const uint32_t* grid) {
    const int i = e & 7, l = (e >> 3) & 3;
    const uint32_t mag = (grid[block[kIQ3_XXSGrid + (e >> 2)]] >> (8 * (e & 3))) & 255u;
    uint32_t s7 = (iq3_xxs_word(block, e >> 5) >> (7 * l)) & 127u, parity = 0;
    for (uint32_t t = s7; t; t >>= 1) parity ^= t & 1u;
    const uint32_t sign = i < 7 ? (s7 >> i) & 1u : parity;
    return iq3_xxs_mag_index(mag) | (sign << 3);
}

// Q4_K's (and IQ4_XS's, Q6_K's, IQ3_XXS's) super-block part of the scales plane: its byte offset (the records before it) and
// the index (in uint16) of the d (f = 0) or dmin (f = 1) of (rb, super-block sb, g, h).
QG_FRAG_HD inline int64_t q4_K_sb_offset(const frag::Geometry& geo) { return geo.scales_bytes(); }
QG_FRAG_HD inline int64_t q4_K_sb_index(const frag::Geometry& geo, int64_t rb, int64_t sb, int g, int f, int h) {
    return (((rb * (geo.k_chunks / 2) + sb) * 8 + g) * 2 + f) * 2 + h;
}

// Q8_0's byte plane: the row and k (in the 32-k tile) of byte b of word w of `lane`, and the
// inverse: the index of q[n][k]'s word in the plane (k_tiles = Kp / 64) and *shift its bit.
QG_FRAG_HD inline int byte_row(int lane, int b) { return (lane >> 2) + 8 * (b & 1); }
QG_FRAG_HD inline int byte_k(int lane, int w, int b) { return 16 * (w >> 1) + 2 * (lane & 3) + (b >> 1) + 8 * (w & 1); }
QG_FRAG_HD inline int64_t byte_word_index(int64_t k_tiles, int64_t n, int64_t k, int* shift) {
    const int r = static_cast<int>(n % frag::kRowBlock), kk = static_cast<int>(k % kByteTileK);
    const int c = kk % 16;
    const int lane = 4 * (r % 8) + (c % 8) / 2, w = 2 * (kk / 16) + (c >= 8 ? 1 : 0);
    *shift = 8 * ((r >= 8 ? 1 : 0) + 2 * (c % 2));
    return (((n / frag::kRowBlock) * (2 * k_tiles) + k / kByteTileK) * frag::kLanes + lane) * frag::kWordsPerLane + w;
}

// The formats with a frag layout, the bits of their codes, and the bytes of a format's planes
// (geo of G = 32).
QG_FRAG_HD inline bool has_frag_layout(int format) {
    return format == QG_FORMAT_Q8_0 || format == QG_FORMAT_Q4_0 || format == QG_FORMAT_Q4_K ||
           format == QG_FORMAT_IQ4_XS || format == QG_FORMAT_Q6_K || format == QG_FORMAT_IQ3_XXS;
}
QG_FRAG_HD inline int code_bits(int format) { return format == QG_FORMAT_Q8_0 || format == QG_FORMAT_Q6_K ? 8 : 4; }
QG_FRAG_HD inline int64_t weights_plane_bytes(int format, const frag::Geometry& geo) {
    return geo.qweight_bytes() * (code_bits(format) / 4);
}
// The codebook formats (IQ4_XS, IQ3_XXS): a code indexes a 16-entry codebook, and a decode
// looks the values up rather than computing them. Their nibble plane places the W4A16 order's
// nibble j (A register p = j % 4, half h = j / 4) at nibble 2 p + h, so that byte p of a word is
// register p's two codes: one byte indexes a table of value pairs (hip/mma.h, codebook_pairs).
QG_FRAG_HD inline bool codebook_format(int format) {
    return format == QG_FORMAT_IQ4_XS || format == QG_FORMAT_IQ3_XXS;
}
QG_FRAG_HD inline int code_nibble(int format, int j) { return codebook_format(format) ? 2 * (j & 3) + (j >> 2) : j; }
// Where q[n][k]'s code sits in the weights plane: its word, and *shift its bit (the nibble
// plane's frag::q_word_index with the format's nibble placement, or the byte plane's).
QG_FRAG_HD inline int64_t code_word_index(int format, const frag::Geometry& geo, int64_t n, int64_t k, int* shift) {
    if (code_bits(format) == 8) return byte_word_index(geo.k_tiles, n, k, shift);
    const int64_t word = frag::q_word_index(geo.k_tiles, n, k, shift);
    *shift = 4 * code_nibble(format, *shift / 4);
    return word;
}
// Formats whose scales plane has the super-block part (Q4_K's planes).
QG_FRAG_HD inline bool has_superblocks(int format) {
    return format == QG_FORMAT_Q4_K || format == QG_FORMAT_IQ4_XS || format == QG_FORMAT_Q6_K ||
           format == QG_FORMAT_IQ3_XXS;
}
QG_FRAG_HD inline int64_t scales_plane_bytes(int format, const frag::Geometry& geo) {
    return has_superblocks(format) ? geo.scales_bytes() + geo.row_blocks * (geo.k_chunks / 2) * 8 * 2 * 2 * 2
                                   : geo.scales_bytes();
}

// One GGUF block format with a frag layout, as the repacks see it: its block, and where an
// element's code, a sub-block's record (the scale plane's 16 bits) and the super-block's two
// fp16 fields (Q4_K: d, dmin; IQ4_XS, Q6_K, IQ3_XXS: d, none) are. IQ3_XXS's codes need its grid
// (the caller's copy: host memory or device constant memory); put_code does not serve it (a
// grid index is 4 elements' codes at once: the CPU inverse encodes whole groups, iq3_xxs_put).
struct FragFormat {
    int format, bytes, elems;
    uint32_t code_mask;  // 15, or 255 for the byte plane's codes (Q8_0, Q6_K)
    const uint32_t* grid;
    QG_FRAG_HD explicit FragFormat(int f, const uint32_t* iq3_grid = nullptr)
        : format(f),
          bytes(f == QG_FORMAT_Q4_K     ? kQ4_KBytes
                : f == QG_FORMAT_IQ4_XS  ? kIQ4_XSBytes
                : f == QG_FORMAT_Q8_0    ? kQ8_0Bytes
                : f == QG_FORMAT_Q6_K    ? kQ6_KBytes
                : f == QG_FORMAT_IQ3_XXS ? kIQ3_XXSBytes
                                         : kQ4_0Bytes),
          elems(f == QG_FORMAT_Q4_0 || f == QG_FORMAT_Q8_0 ? kGroup : kQ4_KElems),
          code_mask(code_bits(f) == 8 ? 255u : 15u),
          grid(iq3_grid) {}
    // Where the block keeps element e's code: the byte offset, and *shift its bits.
    //   Q8_0: qs[e], the whole byte;
    //   Q4_0: qs[e] low nibble for e < 16, qs[e - 16] high nibble above;
    //   Q4_K: sub-blocks 2p and 2p + 1 are the low and high nibbles of qs[32 p .. 32 p + 31];
    //   IQ4_XS: sub-block j owns qs[16 j .. 16 j + 15], element i < 16 of it the low nibble of
    //           qs[16 j + i], i + 16 its high nibble.
    // (Q6_K's codes are split between two bytes: q6_K_code, q6_K_put_code.)
    QG_FRAG_HD int code_byte(int e, int* shift) const {
        if (format == QG_FORMAT_Q8_0) {
            *shift = 0;
            return kQ8_0Codes + e;
        }
        if (format == QG_FORMAT_Q4_K) {
            *shift = 4 * ((e >> 5) & 1);
            return kQ4_KCodes + 32 * (e >> 6) + (e & 31);
        }
        *shift = (e & 16) ? 4 : 0;
        return format == QG_FORMAT_IQ4_XS ? kIQ4_XSCodes + 16 * (e >> 5) + (e & 15) : kQ4_0Codes + (e & 15);
    }
    // The plane's code of element e: the block's code, Q6_K's less 32 (an int8 byte).
    QG_FRAG_HD uint32_t code(const uint8_t* block, int e) const {
        if (format == QG_FORMAT_Q6_K) return (q6_K_code(block, e) - 32u) & 255u;
        if (format == QG_FORMAT_IQ3_XXS) return iq3_xxs_code(block, e, grid);
        int shift = 0;
        const int b = code_byte(e, &shift);
        return (static_cast<uint32_t>(block[b]) >> shift) & code_mask;
    }
    // The inverse: the plane's code c of element e ORed into a zeroed block.
    QG_FRAG_HD void put_code(uint8_t* block, int e, uint32_t c) const {
        if (format == QG_FORMAT_Q6_K) return q6_K_put_code(block, e, (c + 32u) & 63u);
        int shift = 0;
        uint8_t* b = block + code_byte(e, &shift);
        *b = static_cast<uint8_t>(*b | ((c & code_mask) << shift));
    }
    // the 16 bits of 32-element sub-block j (0..elems/32-1): Q4_0's and Q8_0's d, Q4_K's
    // sc | m << 8, IQ4_XS's and IQ3_XXS's ls, Q6_K's int8 scales of its two 16-element halves (bytes)
    QG_FRAG_HD uint16_t record(const uint8_t* block, int j) const {
        return format == QG_FORMAT_Q4_K      ? q4_K_record(block, j)
               : format == QG_FORMAT_IQ4_XS  ? iq4_xs_record(block, j)
               : format == QG_FORMAT_IQ3_XXS ? static_cast<uint16_t>(iq3_xxs_word(block, j) >> 28)
               : format == QG_FORMAT_Q6_K    ? f16_at(block, kQ6_KScales + 2 * j)
                                             : f16_at(block, 0);
    }
    // the super-block's fp16 fields: d (f = 0; Q6_K's at byte 208), Q4_K's dmin (f = 1) or 0
    QG_FRAG_HD uint16_t field(const uint8_t* block, int f) const {
        return f == 0 ? f16_at(block, format == QG_FORMAT_Q6_K ? kQ6_KD : 0)
                      : format == QG_FORMAT_Q4_K ? f16_at(block, 2) : uint16_t(0);
    }
};

}  // namespace gguf_frag
}  // namespace qg
