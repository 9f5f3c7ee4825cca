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

// Where channel c's gate and up biases sit among an expert's 2 x inter stage-1 biases:
// concatenated, c and inter + c, or interleaved, 2c and 2c + 1.
__device__ __forceinline__ int gate_index(int concat, int c) { return concat ? c : 2 * c; }
__device__ __forceinline__ int up_index(int concat, int inter, int c) { return concat ? inter + c : 2 * c + 1; }

}  // namespace qg
