// W4A16 int4 group-quantized GEMM, decode tier (M <= 16 per launch), HIP dialect.
//
// y[M, N] = x[M, K] @ W^T with W[n, k] = (q[n, k] - z[n, k/G]) * s[n, k/G], read straight
// from the canonical layout (no repack):
//   qweight [N, K/8]   int32, nibble i of word j holds q[n, 8j + i]
//   scales  [N, K/G]   fp16 or bf16
//   qzeros  [N/8, K/G] int32, row n -> word n/8, bits 4*(n%8); absent = symmetric (z = 8)
// Kernels take raw pointers and report nothing; src/gpu/w4a16_launch.cpp validates,
// chooses the tier and the split, and checks the launch.
//
// Two tiers live here side by side:
//   decode_mma  (NVIDIA sm_80+): the weight tile is the A operand of mma.sync m16n8k16,
//               dequantized in registers; the activations are the B operand (n8 = 8 rows
//               of x per mma, MT = 1 or 2 such tiles for M <= 16). fp32 accumulation.
//   decode_simt (every target): one warp per weight row, fp32 FMA. The portable tier.
#ifndef QG_HIP_W4A16_HIP
#define QG_HIP_W4A16_HIP

#include <stdint.h>

#include "compat.h"

namespace qg {
namespace w4a16 {

// ---------------------------------------------------------------- element conversions
// 16-bit floats travel as raw bits so that the same code builds against old HIP headers.
enum ElemType : int { ELEM_F16 = 0, ELEM_BF16 = 1, ELEM_F32 = 2 };

__device__ __forceinline__ float bits_to_float(uint16_t b, int type) {
    if (type == ELEM_BF16) return __uint_as_float(static_cast<uint32_t>(b) << 16);
    return __half2float(__ushort_as_half(b));
}

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make Inf).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ void store_out(void* y, int64_t idx, float v, int type) {
    if (type == ELEM_F32) {
        static_cast<float*>(y)[idx] = v;
    } else if (type == ELEM_BF16) {
        static_cast<uint16_t*>(y)[idx] = float_to_bf16_bits(v);
    } else {
        static_cast<uint16_t*>(y)[idx] = __half_as_ushort(__float2half_rn(v));
    }
}

// ---------------------------------------------------------------- parameters
struct Params {
    const uint16_t* x;       // [M, K] fp16/bf16 bits, row stride ldx elements
    const int32_t* qweight;  // [N, K/8] packed nibbles along K
    const uint16_t* scales;  // [N, K/G] fp16/bf16 bits
    const int32_t* qzeros;   // [N/8, K/G] packed nibbles along N, or nullptr (z = 8)
    void* y;                 // [M, N], row stride ldy elements, type y_type
    float* partial;          // [split_k, M, N] fp32 partial sums (split_k > 1 only)
    unsigned* counters;      // [gridDim.x] arrival counters, zero on entry, left zero
    int m, n, k;             // this launch's M (<= 16), N, K
    int64_t ldx, ldy;
    int group_size;          // G in {32, 64, 128}
    int scale_type;          // ELEM_F16 or ELEM_BF16
    int y_type;              // ELEM_F16, ELEM_BF16 or ELEM_F32
    int sc_per_split;        // superchunks (of SC_K) per blockIdx.y
};

// ---------------------------------------------------------------- decode_mma tier
// Block: 4 warps; warp w owns weight rows n0 + 16w .. n0 + 16w + 15 of the block's 64.
// The block walks its K slice in superchunks of SC_K = 512 (4 chunks of 128): each
// superchunk stages x[0:M, 512] and the 64 x (512/G) scales and zero offsets in shared
// memory, then every warp streams 16 rows x 64 bytes of qweight per chunk.
constexpr int MMA_WARPS = 4;
constexpr int MMA_THREADS = MMA_WARPS * 32;
constexpr int ROWS_PER_BLOCK = MMA_WARPS * 16;
constexpr int CHUNK_K = 128;
constexpr int SC_CHUNKS = 4;
constexpr int SC_K = CHUNK_K * SC_CHUNKS;
constexpr int SC_MAX_GROUPS = SC_K / 32;
// x row stride in shared memory, in 16-bit elements: 512 + 32 so that the two x rows
// read by one 8-lane phase of a 16-byte load fall in opposite bank halves (64 B apart).
constexpr int XS_STRIDE = SC_K + 32;

// Which k a thread's nibble is, inside one 128-wide chunk. Lane = 4g + t.
// After the optional quad transpose, thread t holds, for q = 0..3, word W_q of its two rows:
//   transposed   (G = 32, 64): W_q = chunk word 4q + t   -> k = 32q + 8t + i
//   untransposed (G = 128)   : W_q = chunk word 4t + q   -> k = 32t + 8q + i
// The mma for word q sums over its 16 logical k across the quad (t = 0..3), so with the
// transpose each mma stays inside one 32-wide k range (one group for every G >= 32);
// without it, inside one 128-wide chunk (one group only when G = 128).
// x is staged so that thread t always finds its 8 activations for word q at 16-byte unit
// 4q + t of the chunk: the untransposed layout stores chunk unit 4a + b at unit 4b + a.
//
// Nibbles -> mma fragments (PTX ISA, "mma.m16n8k16" fragment layouts, .f16/.bf16 A row-major):
//   a-reg 0: row g,   k 2t..2t+1     a-reg 1: row g+8, k 2t..2t+1
//   a-reg 2: row g,   k 2t+8..2t+9   a-reg 3: row g+8, k 2t+8..2t+9
//   b-reg 0: k 2t..2t+1, col g       b-reg 1: k 2t+8..2t+9, col g
//   c: c0,c1 = row g, cols 2t, 2t+1;  c2,c3 = row g+8, cols 2t, 2t+1
// A word's nibbles pair up as (0,4) (1,5) (2,6) (3,7) under the 0x000F000F mask (see
// dequant_pair); mma s = 0 of word q takes pairs (0,4),(1,5), s = 1 takes (2,6),(3,7), and
// the activation pairs are permuted identically with prmt, so the logical k order inside an
// mma is irrelevant: the dot product sums the same products.

#if defined(QG_HAS_MMA_SYNC)
// Nibble pair p of word w as two 16-bit floats (value 1024 + q in fp16, 128 + q in bf16:
// the exponent-bias trick, e.g. Marlin's 0x64006400 for fp16; 0x43004300 = bf16(128) for
// bf16, where 128..255 are exactly representable), then minus (bias + z) in the same type:
// the result q - z in -15..15 is exact.
template <int XT>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t w_shifted, uint32_t neg_bias_z) {
    constexpr uint32_t kBias = XT == ELEM_BF16 ? 0x43004300u : 0x64006400u;
    constexpr uint32_t kOne = XT == ELEM_BF16 ? 0x3f803f80u : 0x3c003c00u;
    const uint32_t biased = (w_shifted & 0x000f000fu) | kBias;
    uint32_t out;
    if (XT == ELEM_BF16) {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(kOne), "r"(neg_bias_z));
    } else {
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(kOne), "r"(neg_bias_z));
    }
    return out;
}

template <int XT>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    if (XT == ELEM_BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// 4x4 transpose of words across the 4 lanes of a quad: lane t holds w[0..3] = chunk words
// 4t..4t+3 on entry and chunk words t, t+4, t+8, t+12 on exit. Two 2x2-block stages:
// swap the off-diagonal 2x2 blocks between lanes t and t^2, then transpose each 2x2 block
// between lanes t and t^1. Selects, never a run-time register index.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int t) {
    const bool hi2 = (t & 2) != 0;
    uint32_t s0 = hi2 ? w[0] : w[2];
    uint32_t s1 = hi2 ? w[1] : w[3];
    uint32_t r0 = __shfl_xor(s0, 2, 32);
    uint32_t r1 = __shfl_xor(s1, 2, 32);
    if (hi2) { w[0] = r0; w[1] = r1; } else { w[2] = r0; w[3] = r1; }
    const bool hi1 = (t & 1) != 0;
    s0 = hi1 ? w[0] : w[1];
    s1 = hi1 ? w[2] : w[3];
    r0 = __shfl_xor(s0, 1, 32);
    r1 = __shfl_xor(s1, 1, 32);
    if (hi1) { w[0] = r0; w[2] = r1; } else { w[1] = r0; w[3] = r1; }
}
#endif  // QG_HAS_MMA_SYNC

// XT: activation type (ELEM_F16 / ELEM_BF16). MT: 8-row tiles of x (1: M <= 8, 2: M <= 16).
// TRANS: quad transpose of the weight words (needed when G < 128, see the table above).
template <int XT, int MT, bool TRANS>
__global__ void __launch_bounds__(MMA_THREADS)
decode_mma(const Params p) {
#if defined(QG_HAS_MMA_SYNC)
    __shared__ __align__(16) uint16_t xs[MT * 8][XS_STRIDE];       // staged activations
    __shared__ float ss[ROWS_PER_BLOCK][SC_MAX_GROUPS];             // scales as float
    __shared__ uint32_t zs[ROWS_PER_BLOCK][SC_MAX_GROUPS];          // -(bias + z), x2 packed
    __shared__ unsigned last_block;

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int n_block = blockIdx.x * ROWS_PER_BLOCK;
    const int n_warp = n_block + warp * 16;
    const int words_per_row = p.k >> 3;
    const int groups = p.k / p.group_size;
    const int sc_groups = SC_K / p.group_size;          // groups per superchunk: 16, 8, 4
    const int total_sc = (p.k + SC_K - 1) / SC_K;
    const int sc_begin = blockIdx.y * p.sc_per_split;
    const int sc_end = min(total_sc, sc_begin + p.sc_per_split);
    const uint32_t neg_bias = XT == ELEM_BF16 ? 0xc300u : 0xe400u;  // -(128) bf16, -(1024) fp16

    const bool row_g_ok = n_warp + g < p.n;
    const bool row_h_ok = n_warp + g + 8 < p.n;
    const int32_t* wrow_g = p.qweight + static_cast<int64_t>(n_warp + g) * words_per_row;
    const int32_t* wrow_h = wrow_g + 8 * static_cast<int64_t>(words_per_row);

    float acc[MT][4];
    float accg[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = accg[mt][i] = 0.f;

    for (int sc = sc_begin; sc < sc_end; ++sc) {
        const int k_sc = sc * SC_K;
        // 1. Weights of the whole superchunk first: 8 x 16-byte loads per thread in flight.
        uint4 wg[SC_CHUNKS], wh[SC_CHUNKS];
#pragma unroll
        for (int c = 0; c < SC_CHUNKS; ++c) {
            const int word = (k_sc + c * CHUNK_K) / 8 + 4 * t;   // first of the 4 words
            const bool in_k = word < words_per_row;
            wg[c] = (row_g_ok && in_k) ? __ldg(reinterpret_cast<const uint4*>(wrow_g + word))
                                       : make_uint4(0, 0, 0, 0);
            wh[c] = (row_h_ok && in_k) ? __ldg(reinterpret_cast<const uint4*>(wrow_h + word))
                                       : make_uint4(0, 0, 0, 0);
        }
        __syncthreads();  // the previous superchunk's readers of xs/ss/zs are done
        // 2. Stage x[0:M, k_sc : k_sc + 512] (zero past M and K), 16 bytes per step.
        for (int i = tid; i < MT * 8 * (SC_K / 8); i += MMA_THREADS) {
            const int row = i / (SC_K / 8), unit = i % (SC_K / 8);
            const int k0 = k_sc + unit * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (row < p.m && k0 < p.k)
                v = *reinterpret_cast<const uint4*>(p.x + row * p.ldx + k0);
            int dst = unit;  // 16-byte unit inside the superchunk
            if (!TRANS) {    // chunk unit 4a + b -> 4b + a (see the table above)
                const int cu = unit & 15;
                dst = (unit & ~15) | ((cu & 3) << 2) | (cu >> 2);
            }
            *reinterpret_cast<uint4*>(&xs[row][dst * 8]) = v;
        }
        // 3. Stage scales (as float) and zero offsets for 64 rows x sc_groups groups.
        for (int i = tid; i < ROWS_PER_BLOCK * sc_groups; i += MMA_THREADS) {
            const int r = i / sc_groups, gi = i % sc_groups;
            const int n = n_block + r, grp = k_sc / p.group_size + gi;
            float s = 0.f;
            uint32_t z = 8;
            if (n < p.n && grp < groups) {
                s = bits_to_float(p.scales[static_cast<int64_t>(n) * groups + grp], p.scale_type);
                if (p.qzeros)
                    z = (static_cast<uint32_t>(p.qzeros[static_cast<int64_t>(n >> 3) * groups + grp])
                         >> (4 * (n & 7))) & 15u;
            }
            ss[r][gi] = s;
            const uint32_t nz = neg_bias + z;  // bits of -(bias + z): z adds 1 ulp per step
            zs[r][gi] = nz | (nz << 16);
        }
        __syncthreads();

        // 4. Consume the 4 chunks.
        const int r_g = warp * 16 + g, r_h = r_g + 8;
#pragma unroll
        for (int c = 0; c < SC_CHUNKS; ++c) {
            uint32_t wgw[4] = {wg[c].x, wg[c].y, wg[c].z, wg[c].w};
            uint32_t whw[4] = {wh[c].x, wh[c].y, wh[c].z, wh[c].w};
            if (TRANS) {
                quad_transpose(wgw, t);
                quad_transpose(whw, t);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                // group of this word's k range, relative to the superchunk
                const int gi = TRANS ? (c * CHUNK_K + 32 * q) / p.group_size
                                     : (c * CHUNK_K) / p.group_size;
                const uint32_t zg = zs[r_g][gi], zh = zs[r_h][gi];
                const uint32_t a00 = dequant_pair<XT>(wgw[q], zg);
                const uint32_t a01 = dequant_pair<XT>(whw[q], zh);
                const uint32_t a02 = dequant_pair<XT>(wgw[q] >> 4, zg);
                const uint32_t a03 = dequant_pair<XT>(whw[q] >> 4, zh);
                const uint32_t a10 = dequant_pair<XT>(wgw[q] >> 8, zg);
                const uint32_t a11 = dequant_pair<XT>(whw[q] >> 8, zh);
                const uint32_t a12 = dequant_pair<XT>(wgw[q] >> 12, zg);
                const uint32_t a13 = dequant_pair<XT>(whw[q] >> 12, zh);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const uint4 xv = *reinterpret_cast<const uint4*>(
                        &xs[mt * 8 + g][(c * 16 + 4 * q + t) * 8]);
                    // x elements v0..v7 of this word; pairs (v0,v4) (v1,v5) (v2,v6) (v3,v7)
                    const uint32_t b00 = __byte_perm(xv.x, xv.z, 0x5410);
                    const uint32_t b01 = __byte_perm(xv.x, xv.z, 0x7632);
                    const uint32_t b10 = __byte_perm(xv.y, xv.w, 0x5410);
                    const uint32_t b11 = __byte_perm(xv.y, xv.w, 0x7632);
                    mma16816<XT>(accg[mt], a00, a01, a02, a03, b00, b01);
                    mma16816<XT>(accg[mt], a10, a11, a12, a13, b10, b11);
                }
                // close the group after its last word: acc += s * (sum of (q - z) * x)
                const bool group_ends = TRANS ? ((32 * (q + 1)) % p.group_size == 0) : (q == 3);
                if (group_ends) {
                    const float sg = ss[r_g][gi], sh = ss[r_h][gi];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        acc[mt][0] = fmaf(sg, accg[mt][0], acc[mt][0]);
                        acc[mt][1] = fmaf(sg, accg[mt][1], acc[mt][1]);
                        acc[mt][2] = fmaf(sh, accg[mt][2], acc[mt][2]);
                        acc[mt][3] = fmaf(sh, accg[mt][3], acc[mt][3]);
                        accg[mt][0] = accg[mt][1] = accg[mt][2] = accg[mt][3] = 0.f;
                    }
                }
            }
        }
    }

    // 5. Output. c0,c1: row n_warp+g, x rows 2t, 2t+1 (+8 mt); c2,c3: row n_warp+g+8.
    const int split_k = gridDim.y;
    if (split_k == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = mt * 8 + 2 * t + (i & 1);
                const int n = n_warp + g + ((i & 2) ? 8 : 0);
                if (m < p.m && n < p.n) store_out(p.y, m * p.ldy + n, acc[mt][i], p.y_type);
            }
        return;
    }
    // Split-K: publish partial sums, the last block of this row range adds them up in a
    // fixed order (deterministic) and re-arms the counter for the next launch.
    float* part = p.partial + static_cast<int64_t>(blockIdx.y) * p.m * p.n;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = mt * 8 + 2 * t + (i & 1);
            const int n = n_warp + g + ((i & 2) ? 8 : 0);
            if (m < p.m && n < p.n) part[m * p.n + n] = acc[mt][i];
        }
    __threadfence();
    __syncthreads();
    if (tid == 0) last_block = atomicAdd(&p.counters[blockIdx.x], 1u) == static_cast<unsigned>(split_k - 1);
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    const volatile float* vpart = p.partial;
    for (int i = tid; i < p.m * ROWS_PER_BLOCK; i += MMA_THREADS) {
        const int m = i / ROWS_PER_BLOCK, n = n_block + i % ROWS_PER_BLOCK;
        if (n >= p.n) continue;
        float s = 0.f;
        for (int sk = 0; sk < split_k; ++sk) s += vpart[(static_cast<int64_t>(sk) * p.m + m) * p.n + n];
        store_out(p.y, m * p.ldy + n, s, p.y_type);
    }
    if (tid == 0) p.counters[blockIdx.x] = 0;
#else
    // Built for an architecture without mma.sync: the host gate never picks this tier there.
    qg_device_trap();
#endif
}

// ---------------------------------------------------------------- decode_simt tier
// Portable: one warp per weight row, lanes stride over the row's packed words, fp32 FMA,
// warp reduction with __shfl_xor. MMAX bounds M (registers are indexed by constants only).
constexpr int SIMT_THREADS = 128;

template <int MMAX>
__global__ void __launch_bounds__(SIMT_THREADS)
decode_simt(const Params p, int x_type) {
    const int warps = SIMT_THREADS / QG_WARP_SIZE;
    const int lane = threadIdx.x % QG_WARP_SIZE;
    const int n = blockIdx.x * warps + threadIdx.x / QG_WARP_SIZE;
    if (n >= p.n) return;
    const int words_per_row = p.k >> 3;
    const int groups = p.k / p.group_size;
    float acc[MMAX];
#pragma unroll
    for (int m = 0; m < MMAX; ++m) acc[m] = 0.f;
    for (int j = lane; j < words_per_row; j += QG_WARP_SIZE) {
        const uint32_t w = static_cast<uint32_t>(p.qweight[static_cast<int64_t>(n) * words_per_row + j]);
        const int grp = (8 * j) / p.group_size;
        const float s = bits_to_float(p.scales[static_cast<int64_t>(n) * groups + grp], p.scale_type);
        const int z = p.qzeros ? (static_cast<uint32_t>(p.qzeros[static_cast<int64_t>(n >> 3) * groups + grp])
                                  >> (4 * (n & 7))) & 15
                               : 8;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float wv = static_cast<float>(static_cast<int>((w >> (4 * i)) & 15u) - z) * s;
#pragma unroll
            for (int m = 0; m < MMAX; ++m)
                if (m < p.m) acc[m] = fmaf(bits_to_float(p.x[m * p.ldx + 8 * j + i], x_type), wv, acc[m]);
        }
    }
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
        float v = acc[m];
        for (int off = QG_WARP_SIZE / 2; off > 0; off >>= 1) v += __shfl_xor(v, off, QG_WARP_SIZE);
        if (lane == 0 && m < p.m) store_out(p.y, m * p.ldy + n, v, p.y_type);
    }
}

// The portable tier is instantiated here so that compiling this file alone (the AMD
// compile check in .ci/run) builds real device code, not just templates.
template __global__ void decode_simt<16>(const Params, int);

}  // namespace w4a16
}  // namespace qg

#endif  // QG_HIP_W4A16_HIP
