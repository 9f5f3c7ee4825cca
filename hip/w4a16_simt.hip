// W4A16 portable tier (every GPU target): decode_simt. One warp per weight row, lanes
// stride over the row's k, fp32 FMA, warp reduction with __shfl_xor. Reads either layout:
// the canonical arrays, or the frag planes through src/formats/w4a16_frag.h's index
// functions (slow but exact: this tier is the fallback where no matrix-unit tier runs).
#include <stdint.h>

#include "compat.h"
#include "elem.h"
#include "formats/w4a16_frag.h"
#include "w4a16_kernels.h"

namespace qg {
namespace w4a16 {

namespace {

// (q, s, z) of element (n, k) for either layout
struct Weight {
    float s;
    int qz;  // q - z
};

__device__ __forceinline__ Weight weight_at(const SimtParams& p, int n, int k) {
    const int g = k / p.group_size;
    const int groups = p.k / p.group_size;
    if (!p.frag) {
        const uint32_t w = static_cast<const uint32_t*>(p.qweight)[static_cast<int64_t>(n) * (p.k / 8) + k / 8];
        const int q = (w >> (4 * (k % 8))) & 15;
        const int z = p.qzeros ? (static_cast<const uint32_t*>(p.qzeros)[static_cast<int64_t>(n >> 3) * groups + g] >>
                                  (4 * (n & 7))) & 15
                               : 8;
        return {bits_to_float(p.scales[static_cast<int64_t>(n) * groups + g], p.scale_type), q - z};
    }
    const frag::Geometry geo(p.n, p.k, p.group_size);
    int shift = 0;
    const int64_t wi = frag::q_word_index(geo.k_tiles, n, k, &shift);
    const int q = (static_cast<const uint32_t*>(p.qweight)[wi] >> shift) & 15;
    const int r = n % frag::kRowBlock;
    const int64_t rb = n / frag::kRowBlock, kc = g / geo.groups_per_chunk;
    const int c = g % geo.groups_per_chunk;
    const float s = bits_to_float(p.scales[geo.scale_index(rb, kc, r % 8, c, r / 8)], p.scale_type);
    const int z = p.qzeros ? (static_cast<const uint8_t*>(p.qzeros)[geo.zero_index(rb, kc, r % 8, c)] >> (4 * (r / 8))) & 15
                           : 8;
    return {s, q - z};
}

}  // namespace

__global__ void __launch_bounds__(SIMT_THREADS) decode_simt(const SimtParams p) {
    const int warps = SIMT_THREADS / QG_WARP_SIZE;
    const int lane = threadIdx.x % QG_WARP_SIZE;
    const int n = blockIdx.x * warps + threadIdx.x / QG_WARP_SIZE;
    if (n >= p.n) return;
    float acc[SIMT_MAX_M];
#pragma unroll
    for (int m = 0; m < SIMT_MAX_M; ++m) acc[m] = 0.f;
    for (int k = lane; k < p.k; k += QG_WARP_SIZE) {
        const Weight w = weight_at(p, n, k);
        // (q - z) * s formed once in fp32 from exact factors, as the numpy reference does
        const float wv = static_cast<float>(w.qz) * w.s;
#pragma unroll
        for (int m = 0; m < SIMT_MAX_M; ++m)
            if (m < p.m) acc[m] = fmaf(bits_to_float(p.x[m * p.ldx + k], p.x_type), wv, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < SIMT_MAX_M; ++m) {
        float v = acc[m];
        for (int off = QG_WARP_SIZE / 2; off > 0; off >>= 1) v += __shfl_xor(v, off, QG_WARP_SIZE);
        if (lane == 0 && m < p.m) store_out(p.y, m * p.ldy + n, v + bias_at(p.bias, n), p.y_type);
    }
}

}  // namespace w4a16
}  // namespace qg
