// iq3_xxs codes by AVX-512 VBMI byte permutes (iq3_xxs_vbmi.cpp): a whole format block
// (256 elements) of a row decoded in vector registers, where the AVX2 decoder
// (int8_rows.cpp) builds every 16 elements of a row pair from 8 scalar grid loads and
// their inserts, and looks up each sign pattern in a scalar load. The same integers as
// Int8Block<block_iq3_xxs>::codes (int8_blocks.h), so the same bits downstream.
// Callers check cpu::int8_vbmi() (cpu_isa.h) first.
#pragma once

#include <stdint.h>

namespace qg {
namespace cpu {

constexpr int IQ3_VBMI_ROWS = 8;  // rows per call: one pass of the rows decoders (ROWS_GROUP)

// out[r * 256 + e] = signed code w of element e of the iq3_xxs format block at blocks[r]
// (98 bytes each; only those bytes are read), r < IQ3_VBMI_ROWS.
void iq3_xxs_codes_vbmi(const uint8_t* const* blocks, int8_t* out);

}  // namespace cpu
}  // namespace qg
