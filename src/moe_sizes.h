// Sizes of the qg_moe_align outputs, shared by the ABI layer (qg_moe_align_sizes) and
// the CPU tier (which checks the routing tables it is given against them).
#pragma once

#include <stdint.h>

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

}  // namespace qg
