// Activations of the int8 path, quantized once per call: per row and per 32-element
// block of K (ggml's q8_0 / q8_1 blocks; the GPU tier's int8_act model quantizes alike).
//
//   amax = max |v|, v = float(x)            over the block
//   dx   = amax / 127                       float32 division
//   id   = dx > 0 ? 1 / dx : 0              float32 division
//   q    = rint(clamp(v * id, -127, 127))   ties to even; NaN (0 * inf) gives 0
//   S    = sum of q (exact),  dS = dx * float(S);  S16: the sums of each half
//
// -128 never occurs, so a code's negation fits (the AVX2 kernels' sign trick). A row
// holding a NaN or an infinity is marked non-finite: the int8 GEMM computes its outputs
// with the fp32-exact path instead, so that they propagate as the float reference does.
// Per 32 rather than per 256 (ggml's q8_K): one quantizer for every format (the GPU
// tier's), whose block scale follows its own largest value; dropping the per-block float
// steps changed q4_0, q8_0 and q6_K at M = 1 by nothing measurable, q4_K by ~40 % (its
// mins): bench/NOTES.md, "CPU tier: the int8 path".
#pragma once

#include <stdint.h>

#include <vector>

#include "quantgemm.h"

namespace qg {
namespace cpu {

struct Q8Act {
    int64_t m = 0, k = 0;
    std::vector<int8_t> q;         // [m][k]
    std::vector<float> dx, dS;     // [m][k / 32]
    std::vector<int32_t> S;        // [m][k / 32]
    std::vector<int32_t> S16;      // [m][k / 16]: sums of each 16 codes
    std::vector<uint8_t> finite;   // [m]: 1 when the row holds no NaN or infinity
    bool all_finite = true;
};

// Quantizes rows [0, m) of x (dtype dt, row stride ldx elements, k % 32 == 0).
void quantize_activations(qg_dtype dt, const void* x, int64_t ldx, int64_t m, int64_t k, int threads, Q8Act* out);

}  // namespace cpu
}  // namespace qg
