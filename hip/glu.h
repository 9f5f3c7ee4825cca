// The gated activations of include/quantgemm.h (qg_activation) on the device, as the CPU tier
// computes them (src/cpu/moe.cpp), shared by the MoE expert tiles (hip/moe.hip) and the grouped
// prefill's fused stage-1 epilogue (hip/prefill_wgmma.h).
#pragma once

#include "compat.h"
#include "quantgemm.h"

namespace qg {

// act(gate, up) in fp32; the clamps are written as comparisons so that a NaN passes through as
// it does on the CPU.
__device__ __forceinline__ float glu(int act, float g, float u, float alpha, float limit) {
    if (act == QG_ACT_SILU_GLU) return g / (1.0f + expf(-g)) * u;
    g = limit < g ? limit : g;
    u = u < -limit ? -limit : u;
    u = limit < u ? limit : u;
    return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

}  // namespace qg
