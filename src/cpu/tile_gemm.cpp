// dot_tile: the inner product kernel of the CPU tier (see tile_gemm.h).
//
// Written so that the compiler vectorises it without -ffast-math: each row keeps 16
// independent partial sums (lane l sums k = l mod 16), which is a plain elementwise
// loop, and only the final 16 -> 1 reduction is sequential. Four weight rows share each
// activation load. This file alone is built with -ffp-contract=fast (CMakeLists.txt), so
// the AVX2/AVX-512 clones use fused multiply-adds; the decoders, built without, keep
// every dequantization step rounded as gguf-py does. The summation order differs from numpy's, which is why GEMM
// results are compared with a tolerance while dequantization is compared bit for bit.
#include "cpu/tile_gemm.h"

#include "cpu/clones.h"

namespace qg {
namespace cpu {

namespace {
constexpr int LANES = 16;

inline float hsum(const float* s) {
    float t = 0.0f;
    for (int l = 0; l < LANES; ++l) t += s[l];
    return t;
}
}  // namespace

QG_CPU_CLONES  // one clone per x86-64 ISA level (cpu/clones.h)
void dot_tile(const float* const* xrows, int64_t k_off, int64_t M, const float* w, int64_t ldw, int R,
              int64_t kc, float* acc, int64_t ldacc) {
    for (int64_t m = 0; m < M; ++m) {
        const float* __restrict__ x = xrows[m] + k_off;
        float* a = acc + m * ldacc;
        int r = 0;
        for (; r + 4 <= R; r += 4) {
            const float* __restrict__ w0 = w + (r + 0) * ldw;
            const float* __restrict__ w1 = w + (r + 1) * ldw;
            const float* __restrict__ w2 = w + (r + 2) * ldw;
            const float* __restrict__ w3 = w + (r + 3) * ldw;
            float s0[LANES] = {0}, s1[LANES] = {0}, s2[LANES] = {0}, s3[LANES] = {0};
            for (int64_t k = 0; k < kc; k += LANES) {
                for (int l = 0; l < LANES; ++l) {
                    const float xv = x[k + l];
                    s0[l] += xv * w0[k + l];
                    s1[l] += xv * w1[k + l];
                    s2[l] += xv * w2[k + l];
                    s3[l] += xv * w3[k + l];
                }
            }
            a[r + 0] += hsum(s0);
            a[r + 1] += hsum(s1);
            a[r + 2] += hsum(s2);
            a[r + 3] += hsum(s3);
        }
        for (; r < R; ++r) {
            const float* __restrict__ w0 = w + r * ldw;
            float s0[LANES] = {0};
            for (int64_t k = 0; k < kc; k += LANES) {
                for (int l = 0; l < LANES; ++l) s0[l] += x[k + l] * w0[k + l];
            }
            a[r] += hsum(s0);
        }
    }
}

}  // namespace cpu
}  // namespace qg
