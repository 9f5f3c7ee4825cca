// Block layouts of the quantized formats, shared by the CPU tier (src/cpu) and the
// device code (hip/). Plain C++ with no host- or device-only construct, so both
// compilers accept it. Every block sits next to its size check (ggml-common.h habit);
// pyquant/formats checks the same sizes from Python.
//
// Byte layouts follow ggml's ggml-common.h; the executable reference is the Python
// package `gguf` (gguf.quants.dequantize) and pyquant/formats/*.py.
#pragma once

#include <stdint.h>

namespace qg {

// fp16 stored as its bit pattern: blocks are read byte-exact from files.
typedef uint16_t half_bits;

constexpr int QK_K = 256;      // super-block of the K-quants and i-quants
constexpr int K_SCALE_SIZE = 12;

// Q8_0: 32 weights, w = d * q, q int8.
struct block_q8_0 {
    half_bits d;     // fp16 scale
    int8_t qs[32];   // quants, element i = qs[i]
};
static_assert(sizeof(block_q8_0) == 2 + 32, "q8_0 block is 34 bytes");

// Q4_0: 32 weights, w = d * (q - 8), q unsigned 4-bit.
struct block_q4_0 {
    half_bits d;
    uint8_t qs[16];  // element i (i < 16) = low nibble of qs[i]; element i + 16 = high nibble
};
static_assert(sizeof(block_q4_0) == 2 + 16, "q4_0 block is 18 bytes");

// Q4_K: 256 weights in 8 sub-blocks of 32, w = d * sc[j] * q - dmin * m[j],
// sc and m 6-bit, packed in 12 bytes (see get_scale_min_k4 in the CPU tier).
struct block_q4_K {
    half_bits d;                 // super-block scale for the sub-block scales
    half_bits dmin;              // super-block scale for the sub-block mins
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];        // 4 chunks of 64 weights: 32 bytes, low nibbles = sub-block 2c,
                                 // high nibbles = sub-block 2c+1
};
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "q4_K block is 144 bytes");

// Q6_K: 256 weights in 16 sub-blocks of 16, w = d * sc[j] * (q - 32), q 6-bit, sc int8.
struct block_q6_K {
    uint8_t ql[QK_K / 2];        // low 4 bits
    uint8_t qh[QK_K / 4];        // high 2 bits
    int8_t scales[QK_K / 16];    // 16 int8 sub-block scales
    half_bits d;
};
static_assert(sizeof(block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "q6_K block is 210 bytes");

// IQ4_XS: 256 weights in 8 sub-blocks of 32, w = d * (ls - 32) * kvalues_iq4nl[q],
// ls 6-bit = low 4 bits in scales_l, high 2 bits in scales_h.
struct block_iq4_xs {
    half_bits d;
    uint16_t scales_h;           // 2 high bits of sub-block j at bits 2j..2j+1
    uint8_t scales_l[QK_K / 64]; // 4 low bits of sub-block j at nibble j%2 of byte j/2
    uint8_t qs[QK_K / 2];        // per sub-block 16 bytes: element i low nibble, i+16 high
};
static_assert(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "iq4_xs block is 136 bytes");

// IQ3_XXS: 256 weights, 8 sub-blocks of 32; qs[0..63] are grid indices (4 weights each),
// qs[64..95] hold one uint32 per sub-block: 4 x 7 sign-index bits + 4-bit scale at 28..31.
// w = d * (0.5 + scale) * 0.5 * grid[idx] * sign.
struct block_iq3_xxs {
    half_bits d;
    uint8_t qs[3 * QK_K / 8];
};
static_assert(sizeof(block_iq3_xxs) == 2 + 3 * QK_K / 8, "iq3_xxs block is 98 bytes");

// MXFP4 (OCP layout, as GPT-OSS ships it): blocks and scales are separate arrays;
// this struct only documents one block of 32 elements.
constexpr int MXFP4_BLOCK = 32;
constexpr int MXFP4_BLOCK_BYTES = 16;   // 32 E2M1 codes, element 2j low nibble of byte j

}  // namespace qg

// X-macro of the GGUF block formats: X(enum suffix, block struct, elements per block).
// One list generates the runtime -> template dispatch, the name table and the size table.
#define QG_GGUF_FORMATS(X)                  \
    X(Q8_0, block_q8_0, 32)                 \
    X(Q4_0, block_q4_0, 32)                 \
    X(Q4_K, block_q4_K, 256)                \
    X(Q6_K, block_q6_K, 256)                \
    X(IQ4_XS, block_iq4_xs, 256)            \
    X(IQ3_XXS, block_iq3_xxs, 256)
