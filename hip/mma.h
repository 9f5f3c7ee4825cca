// NVIDIA matrix-unit and async-copy wrappers (sm_80+): cp.async, ldmatrix, mma.sync
// m16n8k16, and the nibble-to-fp16/bf16 dequantization of int4 weights. Only compiled
// where QG_HAS_MMA_SYNC is set (hip/compat.h); every kernel that uses them has a host gate.
#pragma once

#include <stdint.h>

#include "compat.h"
#include "formats/iq_tables.h"
#include "elem.h"

namespace qg {

// The 16-entry codebooks of codebook_word and the group scales of superblock_group (below),
// outside the mma gate: hip/w4a16_kernels.h's codebook_of and super_scale_of name them.
enum Codebook { BOOK_IQ4NL = 0, BOOK_IQ3XXS = 1 };
enum SuperScale { SUPER_Q4_K = 0, SUPER_IQ4_XS = 1, SUPER_IQ3_XXS = 2 };

#if defined(QG_HAS_MMA_SYNC)
// cp.async: global -> shared copies that bypass registers. A false `valid` copies nothing
// and zero-fills the destination (src-size 0). .cg caches in L2 only (streamed data).
// dst: a shared-space address (smem_addr), for loops that step it without a conversion a copy
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    cp_async16(smem_addr(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ldmatrix.x4: four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8,
// and receives in register j row (lane / 4), elements 2 (lane % 4), +1 of matrix j: for
// rows = tokens and columns = k that is the mma.m16n8k16 B fragment (b0 = k 0..7, b1 = 8..15).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) { ldmatrix_x4(r, smem_addr(smem_row)); }

// D = A (16x16, row) * B (16x8, col) + C, fp32 accumulators; XT selects fp16 or bf16 inputs.
template <int XT>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    if (XT == ELEM_BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// Nibble pair p of a word (bits 4p..4p+3 and 16+4p..) as two 16-bit floats equal to
// q - z exactly. The exponent-bias trick (Marlin's 0x64006400 for fp16): or-ing a nibble
// into the mantissa of 1024 (fp16 0x6400) gives 1024 + q; for bf16, 128 (0x4300) gives
// 128 + q, exact because bf16 spaces 128..255 one apart. One fma with -(bias + z) then
// leaves q - z in -15..15, exact. `w_shifted` = word >> 4p; `neg_bias_z` = the packed
// pair -(bias + z) in the same type (see neg_bias_z below).
template <int XT>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t w_shifted, uint32_t neg_bias_z) {
    constexpr uint32_t kBias = XT == ELEM_BF16 ? 0x43004300u : 0x64006400u;
    constexpr uint32_t kOne = XT == ELEM_BF16 ? 0x3f803f80u : 0x3c003c00u;
    // (w & 0x000f000f) | bias in one lop3 (0xea = (a & b) | c); the bias sits in a register
    // operand so that the instruction takes a single immediate.
    uint32_t biased, bias = kBias;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(biased) : "r"(w_shifted), "n"(0x000f000f), "r"(bias));
    uint32_t out;
    if (XT == ELEM_BF16) {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(kOne), "r"(neg_bias_z));
    } else {
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(kOne), "r"(neg_bias_z));
    }
    return out;
}

// E2M1 (MXFP4) codes as 16-bit floats equal to their values {0, .5, 1, 1.5, 2, 3, 4, 6} with
// sign, exactly. A pair's sign goes to bit 15 and its three magnitude bits (exponent e1 e0,
// mantissa m) to the format's two low exponent bits and top mantissa bit: read as bf16 that
// is the value times 2^-126 (fp16: 2^-14), the code 0.5 a subnormal; one fma by 2^126 (fp16
// 2^14), a power of two on half-precision arithmetic that keeps subnormals, gives the value
// (the fma adds -0, which keeps a negative zero's sign).
template <int XT>
__device__ __forceinline__ uint32_t e2m1_scale(uint32_t placed) {
    constexpr uint32_t kScale = XT == ELEM_BF16 ? 0x7e807e80u : 0x74007400u;  // 2^126, 2^14
    uint32_t out;
    if (XT == ELEM_BF16) {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(placed), "r"(kScale), "r"(0x80008000u));
    } else {
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(placed), "r"(kScale), "r"(0x80008000u));
    }
    return out;
}

__device__ __forceinline__ uint32_t rotl32(uint32_t w, int r) { return __funnelshift_l(w, w, r); }

// One MXFP4 frag word (the bit placement of src/formats/w4a16_frag.h, e2m1_bit) -> the four A
// registers of its k16 step, a[p] = pair p. bf16: the rotation puts pair p's bits at 6, 7, 8,
// 15 (+16): 1 rotate + 1 lop3 for pairs 0..2, 1 rotate + 2 lop3 for pair 3, 4 fma. fp16 wants
// the magnitude three bits higher (9..11): one more rotate per pair.
template <int XT>
__device__ __forceinline__ void e2m1_word(uint32_t w, uint32_t (&a)[4]) {
    constexpr uint32_t kSign = 0x80008000u, kMag = 0x01c001c0u;
    if (XT == ELEM_BF16) {
        a[0] = e2m1_scale<XT>(rotl32(w, 6) & (kSign | kMag));
        a[1] = e2m1_scale<XT>(rotl32(w, 2) & (kSign | kMag));
        a[2] = e2m1_scale<XT>(rotl32(w, 12) & (kSign | kMag));
        a[3] = e2m1_scale<XT>((w & 0x81808180u) | (rotl32(w, 8) & 0x00400040u));
    } else {
        a[0] = e2m1_scale<XT>((rotl32(w, 6) & kSign) | (rotl32(w, 9) & (kMag << 3)));
        a[1] = e2m1_scale<XT>((rotl32(w, 2) & kSign) | (rotl32(w, 5) & (kMag << 3)));
        a[2] = e2m1_scale<XT>((rotl32(w, 12) & kSign) | (rotl32(w, 15) & (kMag << 3)));
        a[3] = e2m1_scale<XT>((w & kSign) | (rotl32(w, 3) & 0x0c000c00u) | (rotl32(w, 11) & 0x02000200u));
    }
}

// 4-bit codes that index a 16-entry codebook -> values: IQ4_NL / IQ4_XS's (BOOK_IQ4NL) and
// IQ3_XXS's frag codes, its 8 grid magnitudes and their negatives (BOOK_IQ3XXS, code = magnitude
// index | sign << 3: src/formats/gguf_frag.h). The 16 values + 128 are four words of bytes, and
// one byte lookup of four indices is two byte permutes (entries 0-7, 8-15) and a third choosing
// per byte by the index's bit 3 (as ggml-cuda's table lookups do).
__host__ __device__ constexpr int codebook_value(int book, int i) {
    constexpr int kv[16] = QG_KVALUES_IQ4NL;
    constexpr int mag[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    return book == BOOK_IQ4NL ? kv[i] : i < 8 ? mag[i] : -mag[i - 8];
}
__host__ __device__ constexpr uint32_t codebook_table_word(int book, int i) {
    return static_cast<uint32_t>(codebook_value(book, 4 * i) + 128) |
           static_cast<uint32_t>(codebook_value(book, 4 * i + 1) + 128) << 8 |
           static_cast<uint32_t>(codebook_value(book, 4 * i + 2) + 128) << 16 |
           static_cast<uint32_t>(codebook_value(book, 4 * i + 3) + 128) << 24;
}
template <int BOOK>
__device__ __forceinline__ uint32_t codebook_lookup4(uint32_t idx) {  // the 4 indices in bits 0..15
    const uint32_t i = idx & 0x7777u;
    const uint32_t lo = __byte_perm(codebook_table_word(BOOK, 0), codebook_table_word(BOOK, 1), i);
    const uint32_t hi = __byte_perm(codebook_table_word(BOOK, 2), codebook_table_word(BOOK, 3), i);
    return __byte_perm(lo, hi, ((idx >> 1) & 0x4444u) | 0x3210u);
}

// One codebook frag word (8 indices placed by register: byte p holds A register p's two, low
// half in the low nibble; src/formats/gguf_frag.h code_nibble) -> the four A registers of its
// k16 step, each pair as its two codebook values, exact: the value + 128 as a byte b under an
// exponent bias. fp16: 1024 + b (one lop3), minus 1152. bf16 spaces 128..255 one apart, so
// 128 + (b & 127) less 128 (b >= 128: the value >= 0) or 256 (b < 128), the subtrahend's bit 7
// being b's bit 7 inverted (one lop3 each). Per word 13 instructions of lookup, then 3 (fp16)
// or 4 (bf16) a register. The decode takes the pairs from a table instead (codebook_pairs).
template <int XT, int BOOK>
__device__ __forceinline__ void codebook_word(uint32_t w, uint32_t (&a)[4]) {
    const uint32_t v0 = codebook_lookup4<BOOK>(w), v1 = codebook_lookup4<BOOK>(w >> 16);  // registers 0-1, 2-3
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const uint32_t q = 4 * (p >> 1) + 2 * (p & 1);            // register p's first byte in v0:v1
        const uint32_t t = __byte_perm(v0, v1, q | ((q + 1) << 8));  // its two b at bytes 0, 2
        uint32_t x;
        if (XT == ELEM_BF16) {
            uint32_t y, bias = 0x43004300u, neg = 0xc300c300u;
            asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x) : "r"(t), "n"(0x007f007f), "r"(bias));   // (t & m) | c
            asm("lop3.b32 %0, %1, %2, %3, 0xae;" : "=r"(y) : "r"(t), "n"(0x00800080), "r"(neg));    // (~t & m) | c
            asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(a[p]) : "r"(x), "r"(0x3f803f80u), "r"(y));
        } else {
            uint32_t bias = 0x64006400u;
            asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x) : "r"(t), "n"(0x00ff00ff), "r"(bias));
            asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[p]) : "r"(x), "r"(0x3c003c00u), "r"(0xe480e480u));
        }
    }
}

// The decode's codebook lookups from shared memory: a table of value pairs, entry e (a byte
// of codes, register p's two) the A register codebook_word makes of it, in 32 copies, one a
// bank: lane l reads entry e at byte 256 e + 4 l, so a warp's 32 lookups never share a bank
// whatever the codes (a row's other 128 bytes are unused: the byte offset is then one byte
// permute of the word and 4 l, CODEBOOK_PAIRS_BYTES in all). Per register 1 permute and 1
// shared load, against codebook_word's ~7 integer instructions (bench/NOTES.md, session 45).
template <int XT, int BOOK>
__device__ __forceinline__ void codebook_pairs_fill(unsigned char* table, int tid, int threads) {
    for (int e = tid; e < 256; e += threads) {
        uint32_t a[4];
        codebook_word<XT, BOOK>(static_cast<uint32_t>(e), a);  // byte 0 = e: register 0's pair
        uint4* row = reinterpret_cast<uint4*>(table + 256 * e);
#pragma unroll
        for (int i = 0; i < 8; ++i) row[i] = make_uint4(a[0], a[0], a[0], a[0]);
    }
}
// a[p] = the pair of byte p of w: lane4 = 4 * lane.
__device__ __forceinline__ void codebook_pairs(uint32_t w, const unsigned char* table, uint32_t lane4,
                                               uint32_t (&a)[4]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const uint32_t off = __byte_perm(w, lane4, 0x5504u | (p << 4));  // byte 0: 4 lane, byte 1: byte p of w
        a[p] = *reinterpret_cast<const uint32_t*>(table + off);
    }
}

// One GGUF Q8_0 frag word (bytes 0, 2: A register r0's halves; 1, 3: r1's; the byte plane of
// src/formats/gguf_frag.h) -> the two registers, each int8 pair exact in x's type. fp16: the
// byte with its sign bit flipped (q + 128) under the exponent of 1024, (b & 0xff) ^ 0x6480 in
// one lop3, minus 1152. bf16 spaces 128..255 one apart, too few bits for a byte: 128 + its low
// 7 bits, less 128 or 256 by its sign bit (q = low7 - 128 sign), one lop3 each. Per word 1 shift,
// then 1 lop3 + 1 fma (fp16) or 2 lop3 + 1 fma (bf16) a register.
template <int XT>
__device__ __forceinline__ void q8_word(uint32_t w, uint32_t& r0, uint32_t& r1) {
    const uint32_t w8 = w >> 8;
    if (XT == ELEM_BF16) {
        const uint32_t bias = 0x43004300u, neg = 0xc300c300u, one = 0x3f803f80u;
        uint32_t x0, y0, x1, y1;
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x0) : "r"(w), "n"(0x007f007f), "r"(bias));   // (w & m) | c
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(y0) : "r"(w), "n"(0x00800080), "r"(neg));
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x1) : "r"(w8), "n"(0x007f007f), "r"(bias));
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(y1) : "r"(w8), "n"(0x00800080), "r"(neg));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r0) : "r"(x0), "r"(one), "r"(y0));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r1) : "r"(x1), "r"(one), "r"(y1));
    } else {
        const uint32_t flip = 0x64806480u, one = 0x3c003c00u, neg = 0xe480e480u;  // 1024 | sign bit, 1, -1152
        uint32_t x0, x1;
        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(x0) : "r"(w), "n"(0x00ff00ff), "r"(flip));   // (w & m) ^ c
        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(x1) : "r"(w8), "n"(0x00ff00ff), "r"(flip));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r0) : "r"(x0), "r"(one), "r"(neg));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r1) : "r"(x1), "r"(one), "r"(neg));
    }
}

// A GGUF super-block format's group (CODE_Q4_K, CODE_IQ4_XS, CODE_IQ3_XXS of hip/w4a16_kernels.h)
// for a lane's rows g (lo) and g + 8 (hi): weight = s * value - b, from the group's record word
// (row g's 16 bits low, g + 8's high) and the super-block's fp16 words dm (d; Q4_K's dmin).
// SUPER_Q4_K: s = d * sc, b = dmin * m, value = q; SUPER_IQ4_XS: s = d * (ls - 32), b = 0,
// value = kvalues[q]; SUPER_IQ3_XXS: s = (d * (0.5 + ls)) * 0.5, b = 0, value = the signed grid
// magnitude. Every product is exact in float32 (11 x 6 bits; IQ3_XXS 11 x 5 bits, then the
// power of two), as the gguf package's are.
struct SuperGroup {
    float s_lo, s_hi, b_lo, b_hi;
};
template <int SUPER>
__device__ __forceinline__ SuperGroup superblock_group(uint32_t rec, uint2 dm) {
    const float d_lo = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.x & 0xffffu)));
    const float d_hi = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.x >> 16)));
    SuperGroup q;
    if (SUPER == SUPER_IQ3_XXS) {
        q.s_lo = (d_lo * (0.5f + static_cast<float>(rec & 0xffu))) * 0.5f;
        q.s_hi = (d_hi * (0.5f + static_cast<float>((rec >> 16) & 0xffu))) * 0.5f;
        q.b_lo = q.b_hi = 0.0f;
    } else if (SUPER == SUPER_Q4_K) {
        q.s_lo = d_lo * static_cast<float>(rec & 0xffu);
        q.s_hi = d_hi * static_cast<float>((rec >> 16) & 0xffu);
        q.b_lo = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.y & 0xffffu))) *
                 static_cast<float>((rec >> 8) & 0xffu);
        q.b_hi = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.y >> 16))) * static_cast<float>(rec >> 24);
    } else {
        q.s_lo = d_lo * static_cast<float>(static_cast<int>(rec & 0xffu) - 32);
        q.s_hi = d_hi * static_cast<float>(static_cast<int>((rec >> 16) & 0xffu) - 32);
        q.b_lo = q.b_hi = 0.0f;
    }
    return q;
}
// Q6_K's 16-element group `half` (0, 1) of a record (row g's sc[2j] | sc[2j + 1] << 8 low, row
// g + 8's high): s = d * sc (the int8 scale; exact in float32: 11 x 8 bits), b = 0.
__device__ __forceinline__ SuperGroup q6_group(uint32_t rec, uint2 dm, int half) {
    const float d_lo = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.x & 0xffffu)));
    const float d_hi = __half2float(__ushort_as_half(static_cast<unsigned short>(dm.x >> 16)));
    SuperGroup q;
    q.s_lo = d_lo * static_cast<float>(static_cast<int8_t>((rec >> (8 * half)) & 0xffu));
    q.s_hi = d_hi * static_cast<float>(static_cast<int8_t>((rec >> (16 + 8 * half)) & 0xffu));
    q.b_lo = q.b_hi = 0.0f;
    return q;
}
// Q8_0's (and Q4_0's) group in the same terms: s = the fp16 d of the scale word, b = 0.
__device__ __forceinline__ SuperGroup scale_group(uint32_t word) {
    SuperGroup q;
    q.s_lo = __half2float(__ushort_as_half(static_cast<unsigned short>(word & 0xffffu)));
    q.s_hi = __half2float(__ushort_as_half(static_cast<unsigned short>(word >> 16)));
    q.b_lo = q.b_hi = 0.0f;
    return q;
}

// a * m on two bf16 (an fma with -0, which keeps a negative zero's sign).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t m) {
    uint32_t out;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(m), "r"(0x80008000u));
    return out;
}

// a * m + c on two bf16, one rounding (fused).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t m, uint32_t c) {
    uint32_t out;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(m), "r"(c));
    return out;
}

// bf16(lo) | bf16(hi) << 16, each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t out;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
    return out;
}

// The packed pair -(bias + z) for zero-point z (0..15): at the bias's exponent z adds one
// unit in the last place per step, so -(bias + z) is the bias's negation plus z.
template <int XT>
__device__ __forceinline__ uint32_t neg_bias_z(uint32_t z) {
    constexpr uint32_t kNegBias = XT == ELEM_BF16 ? 0xc300u : 0xe400u;  // -128 bf16, -1024 fp16
    const uint32_t h = kNegBias + z;
    return h | (h << 16);
}

// The zero-point constants of one quantization group for a lane's two rows (g and g + 8):
// lo_* = -(bias + z) for nibbles taken at bit 0 of each half, hi_* = -(bias / 16 + z) for
// nibbles taken at bit 4 (fp16 only: see dequant_word).
struct ZeroPairs {
    uint32_t lo_g, lo_h, hi_g, hi_h;
};

template <int XT>
__device__ __forceinline__ ZeroPairs zero_pairs(uint32_t zg, uint32_t zh) {
    ZeroPairs p;
    p.lo_g = neg_bias_z<XT>(zg);
    p.lo_h = neg_bias_z<XT>(zh);
    // fp16 -(64 + z): 64 = 0x5400, where one unit is 16 ulps
    const uint32_t hg = 0xd400u + (zg << 4), hh = 0xd400u + (zh << 4);
    p.hi_g = hg | (hg << 16);
    p.hi_h = hh | (hh << 16);
    return p;
}

// One frag-layout word -> the four A registers of its k16 step (a[p]: pair p = nibbles p
// and p + 4; rows g for even p, g + 8 for odd p), each q - z exactly.
//   bf16: a[p] = ((w >> 4p) & 0x000f000f | 128) - (128 + z): 3 shifts, 4 lop3, 4 fma.
//   fp16: Marlin's two-pairs-per-shift form: (w & 0x000f000f) | 1024 gives pair 0,
//         (w & 0x00f000f0) | 1024 gives 1024 + 16 q for pair 1, scaled by 1/16 in the
//         same fma (exact: powers of two on small integers); w >> 8 gives pairs 2 and 3.
//         1 shift, 4 lop3, 4 fma: the integer pipe, half rate on sm_90, is what binds.
template <int XT>
__device__ __forceinline__ void dequant_word(uint32_t w, const ZeroPairs& z, uint32_t (&a)[4]) {
    if (XT == ELEM_BF16) {
        a[0] = dequant_pair<XT>(w, z.lo_g);
        a[1] = dequant_pair<XT>(w >> 4, z.lo_h);
        a[2] = dequant_pair<XT>(w >> 8, z.lo_g);
        a[3] = dequant_pair<XT>(w >> 12, z.lo_h);
    } else {
        const uint32_t bias = 0x64006400u, one = 0x3c003c00u, sixteenth = 0x2c002c00u;  // 1024, 1, 1/16
        const uint32_t w8 = w >> 8;
        uint32_t b0, b1, b2, b3;
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(b0) : "r"(w), "n"(0x000f000f), "r"(bias));
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(b1) : "r"(w), "n"(0x00f000f0), "r"(bias));
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(b2) : "r"(w8), "n"(0x000f000f), "r"(bias));
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(b3) : "r"(w8), "n"(0x00f000f0), "r"(bias));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[0]) : "r"(b0), "r"(one), "r"(z.lo_g));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[1]) : "r"(b1), "r"(sixteenth), "r"(z.hi_h));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[2]) : "r"(b2), "r"(one), "r"(z.lo_g));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[3]) : "r"(b3), "r"(sixteenth), "r"(z.hi_h));
    }
}

// 16-byte loads and stores that skip L1: partial sums written by other thread blocks must
// be read from L2 (L1 is not coherent across SMs).
__device__ __forceinline__ float4 ld_cg_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void st_cg_f4(float* p, float4 v) {
    asm volatile("st.global.cg.v4.f32 [%0], {%1,%2,%3,%4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w));
}
#endif  // QG_HAS_MMA_SYNC

}  // namespace qg
