// The GGUF frag layout (qg_gguf_repack): where a GGUF block's codes and scale go in the W4A16
// frag planes (src/formats/w4a16_frag.h). Q4_0 so far: its weight d * (q - 8) is a W4A16
// weight of G = 32, symmetric (z = 8), with the block's fp16 d as the group's scale, so the
// planes hold the block's bits reordered and nothing is rounded. Shared by the CPU repack
// (src/gguf_layout.cpp) and the GPU one (hip/w4a16_repack.hip);
// pyquant/formats/gguf_frag.py is the specification.
#pragma once

#include <stdint.h>

#include "formats/w4a16_frag.h"

namespace qg {
namespace gguf_frag {

constexpr int kGroup = 32;         // a Q4_0 block: one scale per 32 elements
constexpr int kQ4_0Bytes = 18;     // fp16 d, then qs[16]
constexpr int kQ4_0Codes = 2;      // byte offset of qs

// Code q (0..15) of element e (0..31) of a Q4_0 block: qs[e] low nibble for e < 16, qs[e - 16]
// high nibble above.
QG_FRAG_HD inline uint32_t q4_0_code(const uint8_t* block, int e) {
    return (static_cast<uint32_t>(block[kQ4_0Codes + (e & 15)]) >> ((e & 16) ? 4 : 0)) & 15u;
}
// The block's fp16 d, its bits (little-endian at byte 0; rows are 2-byte aligned).
QG_FRAG_HD inline uint16_t q4_0_d(const uint8_t* block) {
    return static_cast<uint16_t>(block[0] | (block[1] << 8));
}

}  // namespace gguf_frag
}  // namespace qg
