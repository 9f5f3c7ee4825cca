// The MXFP4 frag layout (qg_mxfp4_repack): by definition the W4A16 frag layout of
// src/formats/w4a16_frag.h for G = 32 without a zero plane, the E2M1 codes as the nibbles
// and each E8M0 scale e as the bf16 bits of 2^(e - 127). Shared by the CPU repack
// (src/mxfp4_layout.cpp) and the device code; pyquant/formats/mxfp4_frag.py is the
// specification, docs/w4a16-layout.md ("MXFP4") says why bf16.
//
//   blocks  int32 [RB][KT][32 lanes][4 words]   = frag qweight plane of the [N, K] codes
//   scales  bf16  [RB][KC][8 g][4][2]           = frag scales plane of G = 32
#pragma once

#include <stdint.h>

#include "formats/w4a16_frag.h"

namespace qg {
namespace frag {

constexpr int kMxfp4Group = 32;  // one E8M0 scale per 32 elements: the frag group size

// Geometry of the MXFP4 planes of an [n, k] weight.
QG_FRAG_HD inline Geometry mxfp4_geometry(int64_t n, int64_t k) { return Geometry(n, k, kMxfp4Group); }

// bf16 bits of 2^(e - 127), exactly: e in 1..254 is a normal bf16 (biased exponent e, zero
// mantissa), e = 0 is the bf16 subnormal 2^-127 (mantissa bit 6: 2^-126 * 2^-1), e = 255 the
// MX NaN (the canonical quiet NaN 0x7fc0).
QG_FRAG_HD inline uint16_t e8m0_to_bf16(uint8_t e) {
    return e == 0 ? uint16_t(0x0040) : e == 255 ? uint16_t(0x7fc0) : uint16_t(uint16_t(e) << 7);
}

// The inverse on every value e8m0_to_bf16 writes (their low 7 bits are 0 but for 0x0040 and
// 0x7fc0).
QG_FRAG_HD inline uint8_t bf16_to_e8m0(uint16_t bits) {
    return bits == 0x0040 ? uint8_t(0) : bits == 0x7fc0 ? uint8_t(255) : uint8_t(bits >> 7);
}

}  // namespace frag
}  // namespace qg
