// W4A16 decode tier on the canonical layout (v5: bench/NOTES.md), HIP dialect: decode_mma.
//
// y[M, N] = x[M, K] @ W^T with W[n, k] = (q[n, k] - z[n, k/G]) * s[n, k/G], read straight
// from the canonical layout (no repack):
//   qweight [N, K/8]   int32, nibble i of word j holds q[n, 8j + i]
//   scales  [N, K/G]   fp16 or bf16
//   qzeros  [N/8, K/G] int32, row n -> word n/8, bits 4*(n%8); absent = symmetric (z = 8)
// The weight tile is the A operand of mma.sync m16n8k16, dequantized in registers; the
// activations are the B operand (n8 = 8 rows of x per mma, MT = 1 or 2 such tiles for
// M <= 16). fp32 accumulation. The frag layout's decode tier (hip/w4a16_decode_frag.hip)
// is the faster one; this tier serves weights that were not repacked.

#include <stdint.h>

#include "compat.h"
#include "mma.h"
#include "splitk.h"
#include "w4a16_kernels.h"

namespace qg {
namespace w4a16 {

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

// Work split (stream-K): the (row block, superchunk) units are laid out row-block-major,
// u = r * S + s with S superchunks per row, and persistent block b of P owns the contiguous
// units [b*U/P, (b+1)*U/P) of U = row_blocks * S. Every block gets the same amount of
// weight bytes whatever N and K are (no partial last wave), and a row block whose K range
// is shared by several blocks is summed by the last of them to arrive (fixed order).
//   owner(u) = ((u + 1) * P - 1) / U     the block whose range holds unit u
//   contributors(r) = owner(r*S + S - 1) - owner(r*S) + 1
__device__ __forceinline__ int owner_of(int64_t u, int64_t units, int64_t blocks) {
    return static_cast<int>(((u + 1) * blocks - 1) / units);
}

// Shared weight tile: row r, 16-byte unit j (4 words, 32 k) lives at unit r*8 + (j ^ 4*(r&1)):
// a thread (g, t) reads unit 4c + t of rows g and g+8, so without the swizzle lanes of rows
// g and g+1 in one 8-lane phase would hit the same 16 banks.
__device__ __forceinline__ int w_unit(int r, int j) { return r * (SC_K / 32) + (j ^ ((r & 1) << 2)); }

// XT: activation type (ELEM_F16 / ELEM_BF16). MT: 8-row tiles of x (1: M <= 8, 2: M <= 16).
// G: group size (32, 64, 128), a template argument so that every group index below is a
// compile-time constant; the quad transpose (TRANS) is needed when G < 128 (table above).
template <int XT, int MT, int G>
__global__ void __launch_bounds__(MMA_THREADS) decode_mma(const Params p) {
#if defined(QG_HAS_MMA_SYNC)
    extern __shared__ __align__(16) unsigned char smem[];   // STAGES x stage_bytes(MT)
    __shared__ int last_block;

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int words_per_row = p.k >> 3;
    constexpr bool TRANS = G < 128;
    constexpr int sc_groups = SC_K / G;                 // groups per unit: 8, 4, 2
    const int groups = p.k / G;
    const int S = (p.k + SC_K - 1) / SC_K;              // units per row block
    const int64_t U = static_cast<int64_t>(p.row_blocks) * S;
    const int64_t P = gridDim.x;
    const int r_g = warp * 16 + g, r_h = r_g + 8;                    // rows inside the block

    const int64_t u_begin = (static_cast<int64_t>(blockIdx.x) * U) / P;
    const int64_t u_end = ((static_cast<int64_t>(blockIdx.x) + 1) * U) / P;

    // Fill ring slot `slot` with unit (rb, sc): weights, x (zero past M and K), scales and zero
    // words. Each thread's share of the copies is fixed: its offsets are computed once here,
    // and a unit only adds its row-block and k bases (bounds tests only on edge units).
    constexpr int W_COPIES = ROWS_PER_BLOCK * (SC_K / 32) / MMA_THREADS;   // 4 x 16 B
    constexpr int X_COPIES = MT * 8 * (SC_K / 8) / MMA_THREADS;            // 2 or 4 x 16 B
    constexpr int S_PAIRS = ROWS_PER_BLOCK * sc_groups / 2;                // 4-byte scale pairs
    constexpr int S_COPIES = (S_PAIRS + MMA_THREADS - 1) / MMA_THREADS;
    const int w_col = tid & 7;                      // 16-byte unit of a weight row
    const int x_col = tid & 31;                     // 16-byte unit of an x row
    int x_dst = x_col;                              // untransposed: chunk unit 4a + b -> 4b + a
    if (!TRANS) x_dst = (x_col & ~15) | ((x_col & 3) << 2) | ((x_col & 15) >> 2);
    const int z_oct = tid / sc_groups, z_gi = tid % sc_groups;
    const bool z_copier = tid < (ROWS_PER_BLOCK / 8) * sc_groups;

    // Per row block (refreshed when the fetch moves to another one): this thread's source
    // pointers at superchunk 0 and whether each copy is inside N; x rows are fixed.
    const int32_t* w_src[W_COPIES];
    bool w_in[W_COPIES];
    const uint16_t* s_src[S_COPIES];
    bool s_in[S_COPIES];
    const int32_t* z_src = p.qzeros;
    bool z_in = false;
    int fetch_rb = -1;
    auto enter_row_block = [&](int rb) {
        const int n0 = rb * ROWS_PER_BLOCK;
#pragma unroll
        for (int j = 0; j < W_COPIES; ++j) {
            const int n = n0 + (tid >> 3) + j * (MMA_THREADS / 8);
            w_in[j] = n < p.n;
            w_src[j] = p.qweight + static_cast<int64_t>(w_in[j] ? n : 0) * words_per_row + w_col * 4;
        }
#pragma unroll
        for (int j = 0; j < S_COPIES; ++j) {
            const int i = tid + j * MMA_THREADS;
            const int n = n0 + i / (sc_groups / 2);
            s_in[j] = n < p.n && (S_PAIRS % MMA_THREADS == 0 || i < S_PAIRS);
            s_src[j] = p.scales + static_cast<int64_t>(s_in[j] ? n : 0) * groups + 2 * (i % (sc_groups / 2));
        }
        z_in = p.qzeros && z_copier && n0 + 8 * z_oct < p.n;
        if (z_in) z_src = p.qzeros + static_cast<int64_t>((n0 >> 3) + z_oct) * groups + z_gi;
        fetch_rb = rb;
    };
    const uint16_t* x_src[X_COPIES];
    bool x_in[X_COPIES];
#pragma unroll
    for (int j = 0; j < X_COPIES; ++j) {
        const int row = (tid >> 5) + j * (MMA_THREADS / 32);
        x_in[j] = row < p.m;
        x_src[j] = p.x + (x_in[j] ? row : 0) * p.ldx + x_col * 8;
    }

    auto load_unit = [&](int rb, int sc, int slot) {
        if (rb != fetch_rb) enter_row_block(rb);
        unsigned char* base = smem + slot * stage_bytes(MT);
        uint16_t* xs = reinterpret_cast<uint16_t*>(base + W_STAGE_BYTES);
        uint16_t* ss = reinterpret_cast<uint16_t*>(base + W_STAGE_BYTES + MT * 8 * XS_STRIDE * 2);
        uint32_t* zs = reinterpret_cast<uint32_t*>(base + W_STAGE_BYTES + MT * 8 * XS_STRIDE * 2 + S_STAGE_BYTES);
        // k bound: only the last superchunk of a row can be partial (K % 256 != 0)
        const bool k_full = (sc + 1) * SC_K <= p.k;
        const bool w_k = k_full || sc * (SC_K / 8) + w_col * 4 < words_per_row;
        const bool x_k = k_full || sc * SC_K + x_col * 8 < p.k;
#pragma unroll
        for (int j = 0; j < W_COPIES; ++j)
            cp_async16(base + w_unit((tid >> 3) + j * (MMA_THREADS / 8), w_col) * 16,
                       w_src[j] + sc * (SC_K / 8), w_in[j] && w_k);
#pragma unroll
        for (int j = 0; j < X_COPIES; ++j)
            cp_async16(xs + ((tid >> 5) + j * (MMA_THREADS / 32)) * XS_STRIDE + x_dst * 8, x_src[j] + sc * SC_K,
                       x_in[j] && x_k);
        const int grp0 = sc * sc_groups;
#pragma unroll
        for (int j = 0; j < S_COPIES; ++j) {
            const int i = tid + j * MMA_THREADS;
            if (S_PAIRS % MMA_THREADS == 0 || i < S_PAIRS)
                cp_async4(ss + (i / (sc_groups / 2)) * SC_MAX_GROUPS + 2 * (i % (sc_groups / 2)),
                          s_src[j] + grp0, s_in[j] && (k_full || grp0 + 2 * (i % (sc_groups / 2)) < groups));
        }
        if (z_copier) {
            if (p.qzeros)
                cp_async4(zs + z_oct * SC_MAX_GROUPS + z_gi, z_src + grp0, z_in && (k_full || grp0 + z_gi < groups));
            else
                zs[z_oct * SC_MAX_GROUPS + z_gi] = 0x88888888u;  // symmetric: z = 8 in every nibble
        }
    };

    float acc[MT][4];
    float accg[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = accg[mt][i] = 0.f;

    // Units are walked with running (row block, superchunk) pairs: no division in the loop.
    // (rb, sc) is the unit being decoded, (prb, psc) the next one to fetch.
    int rb = static_cast<int>(u_begin / S), sc = static_cast<int>(u_begin % S);
    int prb = rb, psc = sc;
    auto advance = [&](int& r, int& c) {
        if (++c == S) { c = 0; ++r; }
    };
    // prologue: STAGES - 1 units in flight (empty groups keep the wait count uniform)
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (u_begin + s < u_end) {
            load_unit(prb, psc, s);
            advance(prb, psc);
        }
        cp_async_commit();
    }

    int slot = 0;
    for (int64_t u = u_begin; u < u_end; ++u) {
        cp_async_wait<STAGES - 2>();   // unit u has landed (this thread's copies)
        __syncthreads();               // ... everyone's; and slot (u-1) % STAGES is free
        if (u + STAGES - 1 < u_end) {
            load_unit(prb, psc, slot == 0 ? STAGES - 1 : slot - 1);
            advance(prb, psc);
        }
        cp_async_commit();

        const unsigned char* base = smem + slot * stage_bytes(MT);
        const uint4* ws = reinterpret_cast<const uint4*>(base);
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(base + W_STAGE_BYTES);
        const uint16_t* ss = reinterpret_cast<const uint16_t*>(base + W_STAGE_BYTES + MT * 8 * XS_STRIDE * 2);
        const uint32_t* zs =
            reinterpret_cast<const uint32_t*>(base + W_STAGE_BYTES + MT * 8 * XS_STRIDE * 2 + S_STAGE_BYTES);
#pragma unroll
        for (int c = 0; c < SC_CHUNKS; ++c) {
            const uint4 vg = ws[w_unit(r_g, 4 * c + t)];
            const uint4 vh = ws[w_unit(r_h, 4 * c + t)];
            uint32_t wgw[4] = {vg.x, vg.y, vg.z, vg.w};
            uint32_t whw[4] = {vh.x, vh.y, vh.z, vh.w};
            if (TRANS) {
                quad_transpose(wgw, t);
                quad_transpose(whw, t);
            }
            uint32_t zg = 0, zh = 0;
            float sg = 0.f, sh = 0.f;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                // group of this word's k range, relative to the unit (compile-time)
                const int gi = TRANS ? (c * CHUNK_K + 32 * q) / G : (c * CHUNK_K) / G;
                if (TRANS ? (32 * q) % G == 0 : q == 0) {  // a group starts: its zero and scale
                    // -(bias + z) as a packed pair: z adds one ulp per step at this exponent
                    zg = neg_bias_z<XT>((zs[(r_g >> 3) * SC_MAX_GROUPS + gi] >> (4 * (r_g & 7))) & 15u);
                    zh = neg_bias_z<XT>((zs[(r_h >> 3) * SC_MAX_GROUPS + gi] >> (4 * (r_h & 7))) & 15u);
                    sg = bits_to_float(ss[r_g * SC_MAX_GROUPS + gi], p.scale_type);
                    sh = bits_to_float(ss[r_h * SC_MAX_GROUPS + gi], p.scale_type);
                }
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
                    if (mt > 0 && mt * 8 >= p.m) break;  // an all-padding x tile adds nothing
                    const uint4 xq = *reinterpret_cast<const uint4*>(
                        xs + (mt * 8 + g) * XS_STRIDE + (c * 16 + 4 * q + t) * 8);
                    // x elements v0..v7 of this word; pairs (v0,v4) (v1,v5) (v2,v6) (v3,v7)
                    const uint32_t b00 = __byte_perm(xq.x, xq.z, 0x5410);
                    const uint32_t b01 = __byte_perm(xq.x, xq.z, 0x7632);
                    const uint32_t b10 = __byte_perm(xq.y, xq.w, 0x5410);
                    const uint32_t b11 = __byte_perm(xq.y, xq.w, 0x7632);
                    mma16816<XT>(accg[mt], a00, a01, a02, a03, b00, b01);
                    mma16816<XT>(accg[mt], a10, a11, a12, a13, b10, b11);
                }
                // close the group after its last word: acc += s * (sum of (q - z) * x)
                if (TRANS ? (32 * (q + 1)) % G == 0 : q == 3) {
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

        const int cur_rb = rb;
        const bool row_done = sc == S - 1 || u + 1 == u_end;
        advance(rb, sc);
        slot = slot == STAGES - 1 ? 0 : slot + 1;
        if (!row_done) continue;  // the row block continues in this block

        // Output of row block cur_rb. c0,c1: row n_warp+g, x rows 2t, 2t+1 (+8 mt); c2,c3: +8.
        const int n_block = cur_rb * ROWS_PER_BLOCK;
        const int n_warp = n_block + warp * 16;
        const int first = owner_of(static_cast<int64_t>(cur_rb) * S, U, P);
        const int contributors = owner_of(static_cast<int64_t>(cur_rb) * S + S - 1, U, P) - first + 1;
        if (contributors == 1) {
            const int ng = n_warp + g;
            const float bias_n[2] = {ng < p.n ? bias_at(p.bias, ng) : 0.0f, ng + 8 < p.n ? bias_at(p.bias, ng + 8) : 0.0f};
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][i] += bias_n[i >> 1];  // then the stores as without one
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = mt * 8 + 2 * t + (i & 1);
                    const int n = n_warp + g + ((i & 2) ? 8 : 0);
                    if (m < p.m && n < p.n) store_out(p.y, m * p.ldy + n, acc[mt][i], p.y_type);
                    acc[mt][i] = 0.f;
                }
            continue;
        }
        // Shared row block: publish the partial sums in slot (this block - first), the last
        // contributor to arrive adds the slots in order and re-arms the counter.
        // partial layout: [row_blocks][max_contributors][16 x rows][64 weight rows]
        float* part = p.partial + (static_cast<int64_t>(cur_rb) * p.max_contributors + (blockIdx.x - first)) *
                                      (16 * ROWS_PER_BLOCK);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = mt * 8 + 2 * t + (i & 1);
                const int r = warp * 16 + g + ((i & 2) ? 8 : 0);
                if (m < p.m) part[m * ROWS_PER_BLOCK + r] = acc[mt][i];
                acc[mt][i] = 0.f;
            }
        // the last contributor to arrive (hip/splitk.h: one release add, one acquire fence)
        // adds the slots in order, eight contributors' loads at once, and clears each once
        // read: the call leaves its whole workspace zeroed, so a later call with another
        // shape (whose counters may lie where these partial sums were) finds zeros.
        if (last_split_to_arrive(&p.counters[cur_rb], contributors, last_block)) {
            float* tile = p.partial + static_cast<int64_t>(cur_rb) * p.max_contributors * (16 * ROWS_PER_BLOCK);
            for (int i = tid; i < p.m * ROWS_PER_BLOCK; i += MMA_THREADS) {
                const float v = sum_and_clear_splits(tile + i, 16 * ROWS_PER_BLOCK, contributors);
                const int n = n_block + i % ROWS_PER_BLOCK;
                if (n < p.n) store_out(p.y, (i / ROWS_PER_BLOCK) * p.ldy + n, v + bias_at(p.bias, n), p.y_type);
            }
            if (tid == 0) p.counters[cur_rb] = 0;
        }
        __syncthreads();  // last_block is rewritten by the next row block's arrival
    }
    cp_async_wait<0>();  // no copy may outlive the block
#else
    // Built for an architecture without mma.sync: the host gate never picks this tier there.
    qg_device_trap();
#endif
}

const void* decode_mma_kernel(int x_type, int mt, int group_size) {
#define QG_CASE(XT, MT, G) \
    if (x_type == XT && mt == MT && group_size == G) return reinterpret_cast<const void*>(&decode_mma<XT, MT, G>);
    QG_W4A16_MMA_KERNELS(QG_CASE)
#undef QG_CASE
    return nullptr;
}

}  // namespace w4a16
}  // namespace qg
