// What every wgmma + TMA tier asks before its own conditions (src/gpu/w4a16_prefill_launch.cpp,
// src/gpu/gguf_prefill_launch.cpp): a GPU context, sm_90a in this build, an sm_90 device,
// and an x that a TMA tensor map can describe.
#pragma once

#include <stdint.h>

#include "tier_table.h"

namespace qg {

#if defined(QG_HAVE_TENSOR_MAPS) && defined(QG_BUILT_SM90A)
constexpr bool kWgmmaBuilt = true;
#else
constexpr bool kWgmmaBuilt = false;
#endif

// True when ctx can run a wgmma tier and x (row stride ldx elements of 16 bits) can go
// through a TMA tensor map; otherwise false with *why.
inline bool wgmma_tier_usable(const qg_context* ctx, const void* x, int64_t ldx, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (!kWgmmaBuilt) {
        *why = "needs wgmma and TMA: a CUDA build with sm_90a among QG_CUDA_ARCHS";
        return false;
    }
    if (ctx->cc_major != 9 || ctx->cc_minor != 0) {
        *why = "needs an sm_90 GPU (H100, H200): wgmma is compiled for sm_90a";
        return false;
    }
    if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0 || ldx % 8 != 0) {
        *why = "x goes through a TMA tensor map: x must be 16-byte aligned and ldx a multiple of 8";
        return false;
    }
    return true;
}

}  // namespace qg
