// Decoders of the int8 path: each weight format as signed int8 codes w and a float scale
// per 32 elements of K (cpu/int8_kernels.h has the arithmetic they feed), with
// dequant(W) = sw * w (- mw for q4_K) exactly as the float decoders of dequant.h compute
// it: the same float32 products, so sw and mw are bit for bit the factors gguf-py uses.
//
//   format   codes w                 stored as     sw per 32            extra
//   q8_0     q                       w             d
//   q4_0     q - 8                   w + 8 = q     d
//   q4_K     q (0..15)               w             d * sc               mw = dmin * m
//   q6_K     q - 32                  w             d                    sc per 16 (sub)
//   iq4_xs   kvalues_iq4nl[q]        w             d * (ls - 32)
//   iq3_xxs  grid byte * sign        w             (d * (0.5 + s)) / 2
//   mxfp4    kvalues_mxfp4_x2[q]     w + 12        2^(e - 128)
//   int4     q - z                   w + 15        s (fp16 / bf16)
// (stored unsigned with an offset where the codes are small: Int8Kind in int8_kernels.h)
//
// The codes are integers, so any vectorisation gives the same ones. A decoder returns
// false when one of its scales is not finite; the GEMM then computes that weight row with
// the fp32-exact path (NaN and inf propagate as the float reference says).
#pragma once

#include <stdint.h>

#include "cpu/dequant.h"
#include "cpu/int8_kernels.h"

namespace qg {
namespace cpu {

// Where one weight row's decode goes (the panel's per-block arrays have a stride of
// PANEL_ROWS: the pointers are at this row's entry of the first block).
struct Int8Out {
    int8_t* codes;  // [blocks * 32], k order
    float* sw;      // sw[b * PANEL_ROWS]
    float* mw;      // mw[b * PANEL_ROWS] (q4_K)
    int32_t* sub;   // sub[(2 b + h) * PANEL_ROWS] (q6_K)
};

// The vpmaddubsw int16 bound: i16_groups k4 groups of pairs code * 127 stay below 2^15
// (max_stored: the largest stored code, |w| for signed codes).
constexpr bool i16_safe(Int8Kind kind, int max_stored) { return kind.i16_groups * 2 * max_stored * 127 <= 32767; }

constexpr int SIGNED = -1;
constexpr Int8Kind KIND_Q8_0{1, false, false, SIGNED};
constexpr Int8Kind KIND_Q4_0{8, false, false, 8};     // stored q = w + 8, 0..15
constexpr Int8Kind KIND_Q4_K{8, false, true, 0};      // stored q, 0..15
constexpr Int8Kind KIND_Q6_K{4, true, false, SIGNED}; // 4 groups = one 16-element sub-block
constexpr Int8Kind KIND_IQ4_XS{1, false, false, SIGNED};
constexpr Int8Kind KIND_IQ3_XXS{2, false, false, SIGNED};
constexpr Int8Kind KIND_MXFP4{4, false, false, 12};   // stored w + 12, 0..24
constexpr Int8Kind KIND_INT4{4, false, false, 15};    // stored q - z + 15, 0..30
static_assert(i16_safe(KIND_Q8_0, 128) && i16_safe(KIND_Q4_0, 15) && i16_safe(KIND_Q4_K, 15) &&
                  i16_safe(KIND_Q6_K, 32) && i16_safe(KIND_IQ4_XS, 127) && i16_safe(KIND_IQ3_XXS, 62) &&
                  i16_safe(KIND_MXFP4, 24) && i16_safe(KIND_INT4, 30),
              "a format's codes would overflow vpmaddubsw's int16 sums");

// Int8Traits<Block>::kind: how the panel kernels take a GGUF format's codes.
template <class Block>
struct Int8Traits;
#define QG_INT8_TRAITS(BLOCK, KIND)                  \
    template <>                                      \
    struct Int8Traits<BLOCK> {                       \
        static constexpr Int8Kind kind = KIND;       \
    };
QG_INT8_TRAITS(block_q8_0, KIND_Q8_0)
QG_INT8_TRAITS(block_q4_0, KIND_Q4_0)
QG_INT8_TRAITS(block_q4_K, KIND_Q4_K)
QG_INT8_TRAITS(block_q6_K, KIND_Q6_K)
QG_INT8_TRAITS(block_iq4_xs, KIND_IQ4_XS)
QG_INT8_TRAITS(block_iq3_xxs, KIND_IQ3_XXS)
#undef QG_INT8_TRAITS

// Row decoders (int8_decode.cpp, one clone per ISA level). Each decodes format blocks
// [b0, b0 + nb) of one row (GGUF: blocks of 32 or 256; MXFP4: 32; int4: k in [k0, k0 + kc),
// multiples of G) and prefetches what its next chunk will read; true when every scale
// is finite.
#define QG_X(NAME, BLOCK, ELEMS) \
    bool decode_int8_row(const BLOCK*, const uint8_t* row, int64_t b0, int64_t nb, const Int8Out& out);
QG_GGUF_FORMATS(QG_X)
#undef QG_X

template <class Block>
inline bool decode_int8_row(const uint8_t* row, int64_t b0, int64_t nb, const Int8Out& out) {
    return decode_int8_row(static_cast<const Block*>(nullptr), row, b0, nb, out);
}

bool decode_int8_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t b0, int64_t nb, const Int8Out& out);

bool decode_int8_int4_row(const int32_t* qweight_row, const void* scales_row, qg_dtype scale_dtype,
                          const int32_t* qzeros, int64_t n, int64_t groups_per_row, int group_size, int64_t k0,
                          int64_t kc, const Int8Out& out);

}  // namespace cpu
}  // namespace qg
