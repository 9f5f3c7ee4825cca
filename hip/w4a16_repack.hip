// W4A16 repack into the frag layout on the GPU (qg_w4a16_repack on a GPU context): the
// same permutation as the CPU repack (src/w4a16_layout.cpp), one thread per output word
// (weights) or per output record (scales and zeros), positions from
// src/formats/w4a16_frag.h. pyquant/formats/int4_frag.py is the specification.
#include <stdint.h>

#include "compat.h"
#include "formats/gguf_frag.h"
#include "formats/iq_tables.h"
#include "formats/w4a16_frag.h"
#include "w4a16_kernels.h"

namespace qg {
namespace w4a16 {

__constant__ uint32_t c_repack_iq3xxs_grid[256] = QG_IQ3XXS_GRID;  // IQ3_XXS's codes (gguf_frag.h)

// Output word (rb, kt, lane, s): 8 nibbles from rows g and g+8 of the row block, k 16s + 2t
// (+1) and + 8 (+9) of the tile: two canonical words per row (k/8 = 8kt + 2s and + 1).
// Canonical row of output row n (RepackParams::src_row_step).
__device__ __forceinline__ int64_t source_row(const RepackParams& p, int64_t n) {
    return p.src_row_step > 1 ? n * p.src_row_step : n;
}

__global__ void __launch_bounds__(REPACK_THREADS) repack_frag_weights(const RepackParams p) {
    const frag::Geometry geo(p.n, p.k, p.group_size);
    const int64_t i = static_cast<int64_t>(blockIdx.x) * REPACK_THREADS + threadIdx.x;
    const bool bytes = p.gguf != nullptr && gguf_frag::code_bits(p.gguf_format) == 8;
    if (i >= (bytes ? gguf_frag::weights_plane_bytes(p.gguf_format, geo) : geo.qweight_bytes()) / 4) return;
    const int s = static_cast<int>(i % frag::kWordsPerLane);
    const int lane = static_cast<int>((i / frag::kWordsPerLane) % frag::kLanes);
    const int64_t tile = i / frag::kTileWords;
    uint32_t word = 0;
    if (bytes) {  // GGUF Q8_0's byte plane: tile (rb, kb) of 16 rows x 32 k, 4 codes a word
        const int64_t kbs = 2 * geo.k_tiles, rb = tile / kbs, kb = tile % kbs;
        const gguf_frag::FragFormat ff(p.gguf_format);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int64_t n = rb * frag::kRowBlock + gguf_frag::byte_row(lane, b);
            const int64_t k = kb * gguf_frag::kByteTileK + gguf_frag::byte_k(lane, s, b);
            if (n < p.n && k < p.k)
                word |= ff.code(p.gguf + n * p.ldw + (k / ff.elems) * ff.bytes, static_cast<int>(k % ff.elems)) << (8 * b);
        }
        p.out_qweight[i] = word;
        return;
    }
    const int64_t rb = tile / geo.k_tiles, kt = tile % geo.k_tiles;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int64_t n = rb * frag::kRowBlock + frag::nibble_row(lane, j);
        const int64_t k = kt * frag::kKTile + frag::nibble_k(lane, s, j);
        if (n < p.n && k < p.k) {
            uint32_t q;
            if (p.gguf != nullptr) {  // GGUF Q4_0 / Q4_K / IQ4_XS / IQ3_XXS: the code from its block
                const gguf_frag::FragFormat ff(p.gguf_format, c_repack_iq3xxs_grid);
                q = ff.code(p.gguf + n * p.ldw + (k / ff.elems) * ff.bytes, static_cast<int>(k % ff.elems));
            } else {
                const uint32_t w = p.qweight[source_row(p, n) * (p.k / 8) + k / 8];
                q = (w >> (4 * (k % 8))) & 15u;
            }
            word |= q << (4 * (p.gguf != nullptr ? gguf_frag::code_nibble(p.gguf_format, j) : j));
        }
    }
    p.out_qweight[i] = p.e8m0 ? frag::e2m1_place(word) : word;  // MXFP4: its bit placement
}

// Output record (rb, kc, g, c): the scales of rows g and g+8 for group kc * GC + c (W4A16:
// copied; MXFP4: E8M0 bytes as bf16; GGUF Q4_0, Q8_0: each block's d; Q4_K / IQ4_XS / IQ3_XXS: each
// sub-block's record, and where kc is even and c = 0 the super-block's fields), and their zero
// byte.
__global__ void __launch_bounds__(REPACK_THREADS) repack_frag_scales(const RepackParams p) {
    const frag::Geometry geo(p.n, p.k, p.group_size);
    const int64_t i = static_cast<int64_t>(blockIdx.x) * REPACK_THREADS + threadIdx.x;
    if (i >= geo.qzeros_bytes()) return;  // one record per zero byte
    const int c = static_cast<int>(i % geo.groups_per_chunk);
    const int g = static_cast<int>((i / geo.groups_per_chunk) % 8);
    const int64_t rbkc = i / (8 * geo.groups_per_chunk);
    const int64_t rb = rbkc / geo.k_chunks, kc = rbkc % geo.k_chunks;
    const int64_t grp = kc * geo.groups_per_chunk + c;
    const bool super = p.gguf != nullptr && gguf_frag::has_superblocks(p.gguf_format);
    const gguf_frag::FragFormat ff(p.gguf != nullptr ? p.gguf_format : QG_FORMAT_Q4_0);
    uint32_t zb = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int64_t n = rb * frag::kRowBlock + g + 8 * h;
        const bool real = n < p.n && grp < geo.groups;
        const int64_t src = source_row(p, n) * geo.groups + grp;
        p.out_scales[2 * i + h] =
            !real    ? 0
            : p.gguf ? ff.record(p.gguf + n * p.ldw + (grp * 32 / ff.elems) * ff.bytes,
                                 static_cast<int>((grp * 32 % ff.elems) / 32))
            : p.e8m0 ? frag::e8m0_bf16(p.e8m0[src])
                     : p.scales[src];
        if (p.qzeros != nullptr && real) zb |= ((p.qzeros[(n / 8) * geo.groups + grp] >> (4 * (n % 8))) & 15u) << (4 * h);
        if (super && kc % 2 == 0 && c == 0) {  // super-block kc / 2 of row n: its two fields
            const uint8_t* block = p.gguf + n * p.ldw + (kc / 2) * ff.bytes;
            const bool in = n < p.n;  // K % 256 == 0: every super-block of a real row is real
            uint16_t* sb = p.out_scales + gguf_frag::q4_K_sb_offset(geo) / 2;
            sb[gguf_frag::q4_K_sb_index(geo, rb, kc / 2, g, 0, h)] = in ? ff.field(block, 0) : 0;
            sb[gguf_frag::q4_K_sb_index(geo, rb, kc / 2, g, 1, h)] = in ? ff.field(block, 1) : 0;
        }
    }
    if (p.out_qzeros != nullptr) p.out_qzeros[i] = static_cast<uint8_t>(zb);
}

}  // namespace w4a16
}  // namespace qg
