// Sizes of the qg_moe_align outputs, shared by the ABI layer (qg_moe_align_sizes) and
// the tiers (the CPU one checks the routing tables it is given against them), and the
// geometry of the MoE frag layout (qg_moe_repack: its size query and both repacks).
#pragma once

#include <stdint.h>

#include "formats/w4a16_frag.h"
#include "quantgemm.h"

namespace qg {

// Each expert's pair list is padded up to a multiple of tile_m, adding at most
// tile_m - 1 pads per expert: max_sorted = T*top_k + E*(tile_m - 1), rounded up to a
// multiple of tile_m; max_tiles = max_sorted / tile_m.
inline void moe_align_sizes(int64_t num_tokens, int32_t top_k, int32_t num_experts, int32_t tile_m,
                            int64_t* max_sorted, int64_t* max_tiles) {
    const int64_t worst = num_tokens * top_k + (int64_t)num_experts * (tile_m - 1);
    *max_sorted = (worst + tile_m - 1) / tile_m * tile_m;
    *max_tiles = *max_sorted / tile_m;
}

// The parts of one expert in the MoE frag layout (include/quantgemm.h, qg_moe_repack_args):
// part h of expert e is a dense frag weight of `rows` rows whose row r is canonical row
// first_row(e, h) + r * row_step; its planes start at (e * parts + h) times one part's bytes.
struct MoePart {
    int64_t n = 0, rows = 0, row_step = 1;
    int32_t parts = 1;
    bool interleaved = false;
    int64_t blocks_bytes = 0, scales_bytes = 0;  // of one part

    explicit MoePart(const qg_moe_repack_args& a)
        : n(a.n), rows(a.parts > 0 ? a.n / a.parts : 0), parts(a.parts),
          interleaved(a.parts == 2 && a.gate_up_layout == QG_GATE_UP_INTERLEAVED) {
        row_step = interleaved ? 2 : 1;
        const frag::Geometry geo(rows, a.k, 32);
        blocks_bytes = geo.qweight_bytes();
        scales_bytes = geo.scales_bytes();
    }
    int64_t first_row(int64_t e, int64_t h) const { return e * n + (interleaved ? h : h * rows); }
    int64_t blocks_offset(int64_t e, int64_t h) const { return (e * parts + h) * blocks_bytes; }
    int64_t scales_offset(int64_t e, int64_t h) const { return (e * parts + h) * scales_bytes; }
};

}  // namespace qg
