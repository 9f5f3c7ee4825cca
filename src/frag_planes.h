// The host loops over the frag planes (src/formats/w4a16_frag.h), shared by the W4A16
// layout (src/w4a16_layout.cpp) and the MXFP4 one (src/mxfp4_layout.cpp), which is the
// W4A16 frag layout of G = 32 with E2M1 codes as the nibbles and bf16 scales:
//   - the qweight plane of a canonical nibble array [N, K/8] of 32-bit words (nibble i of
//     word j of row n = element 8j + i). MXFP4 blocks [N, K/32, 16] are that array read as
//     little-endian words (byte b of a block = elements 2b, 2b + 1), so both formats pass
//     their canonical bytes here unchanged; words are loaded and stored with memcpy, so
//     byte arrays need no 4-byte alignment;
//   - the order of the scales plane, as a visitor: one loop serves the W4A16 scales and
//     zero bytes and the MXFP4 bf16 scales, in both directions.
#pragma once

#include <stdint.h>

#include "formats/w4a16_frag.h"

namespace qg {

// The frag qweight plane (geo.qweight_bytes(), 16-byte aligned) of the canonical words
// [geo.n, geo.k / 8]; padding nibbles are 0. `place`, when given, maps each plane word (its
// 8 nibbles in the W4A16 order) to the format's bit placement (MXFP4: frag::e2m1_place).
void frag_pack_words(const frag::Geometry& geo, const void* canonical, uint32_t* plane,
                     uint32_t (*place)(uint32_t) = nullptr);
// The inverse: canonical [geo.n, geo.k / 8] words from the plane (padding dropped); `unplace`
// undoes `place` (frag::e2m1_unplace).
void frag_unpack_words(const frag::Geometry& geo, const uint32_t* plane, void* canonical,
                       uint32_t (*unplace)(uint32_t) = nullptr);

// Calls f(i, n, grp, real) for every element i of the scales plane of geo, in plane order:
// the scale of row n, group grp; real is false for padding (n >= N or grp >= K / G).
// Element i = 2 * (zero record) + h, h = 0 for row g and 1 for row g + 8 of the record
// (frag::Geometry::scale_index and zero_index), so f also finds the zero byte i / 2.
template <class F>
inline void for_each_scale(const frag::Geometry& geo, F&& f) {
    int64_t i = 0;
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kc = 0; kc < geo.k_chunks; ++kc)
            for (int g = 0; g < 8; ++g)
                for (int c = 0; c < geo.groups_per_chunk; ++c)
                    for (int h = 0; h < 2; ++h, ++i) {
                        const int64_t n = rb * frag::kRowBlock + g + 8 * h;
                        const int64_t grp = kc * geo.groups_per_chunk + c;
                        f(i, n, grp, n < geo.n && grp < geo.groups);
                    }
}

}  // namespace qg
