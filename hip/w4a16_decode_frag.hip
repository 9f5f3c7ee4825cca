// W4A16 decode tier on the frag layout (M <= 16 per launch): decode_frag, NVIDIA sm_80+.
//
// y[M, N] = x[M, K] @ W^T, W[n, k] = (q - z) * s, the weight read from the planes of
// qg_w4a16_repack (src/formats/w4a16_frag.h, pyquant/formats/int4_frag.py). Each lane's
// 16 bytes of a fragment tile are its mma.sync m16n8k16 A registers for four k16 steps,
// nibble pairs in the order the exponent-bias dequant extracts them, so neither the weights
// nor the activations are permuted here (the canonical tier spends ~10 instructions per
// word on that: bench/NOTES.md).
//
// Work split. A thread block has 8 warps; warp w owns row blocks 2w, 2w+1 (32 rows) of the
// block's 256-row "row tile". A unit is one row tile x one 128-k chunk: 32 KB of weights
// plus their scales and zeros, and the x chunk [M, 128] that all 8 warps share. Units are
// numbered row-tile-major (u = rt * KC + kc) and block b of P owns the contiguous range
// [b U / P, (b + 1) U / P) (stream-K): every block moves the same number of weight bytes
// whatever N and K are, and a row tile split between blocks is summed by the last of them
// to arrive, in block order (deterministic).
//
// Pipeline. A FRAG_STAGES-deep ring in shared memory, filled by cp.async: per stage each
// lane copies its own four fragment tiles (and reads them back itself), and the block
// copies the unit's x chunk, scale words and zero bytes once. One barrier per unit.
//
// Numerics: (q - z) is exact in fp16/bf16, the mma accumulates in fp32 per quantization
// group, and the group scale multiplies that fp32 sum: with one-hot x the output is
// float(q - z) * float(s) bit for bit, as the numpy reference.
#include <stdint.h>

#include "compat.h"
#include "mma.h"
#include "w4a16_kernels.h"

namespace qg {
namespace w4a16 {

#if defined(QG_HAS_MMA_SYNC)
namespace {

// Thread block that owns unit u (see the file comment).
__device__ __forceinline__ int frag_owner(int64_t u, int64_t units, int64_t blocks) {
    return static_cast<int>(((u + 1) * blocks - 1) / units);
}

// Scale words and zero bytes of a lane's row block for one chunk: GC of each.
template <int GC>
struct GroupRecord;
template <>
struct GroupRecord<4> {  // G = 32
    static __device__ __forceinline__ void load_scales(uint32_t (&s)[4], const uint32_t* p) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        s[0] = v.x, s[1] = v.y, s[2] = v.z, s[3] = v.w;
    }
    static __device__ __forceinline__ uint32_t load_zeros(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
};
template <>
struct GroupRecord<2> {  // G = 64
    static __device__ __forceinline__ void load_scales(uint32_t (&s)[2], const uint32_t* p) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        s[0] = v.x, s[1] = v.y;
    }
    static __device__ __forceinline__ uint32_t load_zeros(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};
template <>
struct GroupRecord<1> {  // G = 128
    static __device__ __forceinline__ void load_scales(uint32_t (&s)[1], const uint32_t* p) { s[0] = *p; }
    static __device__ __forceinline__ uint32_t load_zeros(const uint8_t* p) { return *p; }
};

}  // namespace
#endif

// XT: activation type. MT: n8 tiles of x (1: M <= 8, 2: M <= 16). G: group size (a template
// argument: every group index below is a compile-time constant). ASYM: zero-points given.
template <int XT, int MT, int G, bool ASYM>
__global__ void __launch_bounds__(FRAG_THREADS, 2) decode_frag(const FragParams p) {
#if defined(QG_HAS_MMA_SYNC)
    typedef FragStage<MT, G> St;
    constexpr int GC = St::GC;
    constexpr int KS = 8;                        // k16 steps per unit
    constexpr int STEPS_PER_GROUP = G / 16;      // 2, 4, 8
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned last_block;

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int KC = p.k_chunks;
    const int64_t KT = 2 * static_cast<int64_t>(KC);
    const int64_t U = static_cast<int64_t>(p.row_tiles) * KC;
    const int64_t P = gridDim.x;
    const int64_t u_begin = static_cast<int64_t>(blockIdx.x) * U / P;
    const int64_t u_end = (static_cast<int64_t>(blockIdx.x) + 1) * U / P;

    // ---- fixed copy roles of this thread (per unit only the chunk offset changes)
    // weights: this lane's 16 bytes of tiles (rb0 + r, 2 kc + j), r, j in {0, 1}
    // x: row tid / 16, 16-byte piece tid % 16 of the chunk (MT * 128 copies)
    // scales: row block tid / (2 GC) of the tile, 16-byte piece tid % (2 GC) of its record
    // zeros: row block (tid - Z_FIRST) / Z_PER_RB, piece of Z_BYTES bytes
    constexpr int X_COPIES = MT * 8 * 16;
    constexpr int S_COPIES = FRAG_TILE_RB * 2 * GC;
    constexpr int Z_RB_BYTES = 8 * GC;                       // 8, 16, 32
    constexpr int Z_PIECE = Z_RB_BYTES < 16 ? Z_RB_BYTES : 16;
    constexpr int Z_PER_RB = Z_RB_BYTES / Z_PIECE;           // 1 or 2
    constexpr int Z_COPIES = FRAG_TILE_RB * Z_PER_RB;
    constexpr int Z_FIRST = FRAG_THREADS - Z_COPIES;
    static_assert(S_COPIES <= Z_FIRST || !ASYM, "scale and zero copies share no thread");

    const int x_row = tid >> 4, x_piece = tid & 15;
    const bool x_copier = tid < X_COPIES;
    const uint16_t* x_src = p.x + static_cast<int64_t>(x_row < p.m ? x_row : 0) * p.ldx + x_piece * 8;
    const bool x_row_in = x_row < p.m;
    const int s_rb = tid / (2 * GC), s_piece = tid % (2 * GC);
    const int z_rb = (tid - Z_FIRST) / Z_PER_RB, z_piece = (tid - Z_FIRST) % Z_PER_RB;

    // per row tile (refreshed when the fetch moves to another): sources at chunk 0
    const uint32_t* w_src[FRAG_RB_PER_WARP];
    bool w_in[FRAG_RB_PER_WARP];
    const uint32_t* s_src = p.scales;
    bool s_in = false;
    const uint8_t* z_src = p.qzeros;
    bool z_in = false;
    int fetch_rt = -1;
    auto enter_row_tile = [&](int rt) {
        const int rb0 = rt * FRAG_TILE_RB;
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
            const int rb = rb0 + warp * FRAG_RB_PER_WARP + r;
            w_in[r] = rb < p.row_blocks;
            w_src[r] = p.qweight + (static_cast<int64_t>(w_in[r] ? rb : 0) * KT * 32 + lane) * 4;
        }
        s_in = tid < S_COPIES && rb0 + s_rb < p.row_blocks;
        s_src = p.scales + static_cast<int64_t>(s_in ? rb0 + s_rb : 0) * KC * 8 * GC + s_piece * 4;
        if (ASYM) {
            z_in = tid >= Z_FIRST && rb0 + z_rb < p.row_blocks;
            z_src = p.qzeros + static_cast<int64_t>(z_in ? rb0 + z_rb : 0) * KC * Z_RB_BYTES + z_piece * Z_PIECE;
        }
        fetch_rt = rt;
    };

    auto load_unit = [&](int rt, int kc, int slot) {
        if (rt != fetch_rt) enter_row_tile(rt);
        unsigned char* base = smem + slot * St::BYTES;
        // weights: 4 x 16 B, each lane its own, laid out [rb r][tile j][lane]
        unsigned char* wdst = base + warp * (32 * 64) + lane * 16;
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r)
#pragma unroll
            for (int j = 0; j < 2; ++j)
                cp_async16(wdst + (r * 2 + j) * 512, w_src[r] + (2 * static_cast<int64_t>(kc) + j) * 128, w_in[r]);
        if (x_copier) {
            uint16_t* xs = reinterpret_cast<uint16_t*>(base + St::X_OFF);
            const bool in_k = kc * 128 + x_piece * 8 < p.k;   // K % 32 == 0: pieces are whole
            cp_async16(xs + x_row * FRAG_XS_STRIDE + x_piece * 8, x_src + kc * 128, x_row_in && in_k);
        }
        if (tid < S_COPIES) {
            uint32_t* ss = reinterpret_cast<uint32_t*>(base + St::S_OFF);
            cp_async16(ss + s_rb * 8 * GC + s_piece * 4, s_src + static_cast<int64_t>(kc) * 8 * GC, s_in);
        }
        if (ASYM && tid >= Z_FIRST) {
            uint8_t* zs = base + St::Z_OFF + z_rb * Z_RB_BYTES + z_piece * Z_PIECE;
            const uint8_t* src = z_src + static_cast<int64_t>(kc) * Z_RB_BYTES;
            if (Z_PIECE == 16) cp_async16(zs, src, z_in);
            else cp_async8(zs, src, z_in);
        }
    };

    float acc[FRAG_RB_PER_WARP][MT][4];
    float grp[FRAG_RB_PER_WARP][MT][4];  // the running group's sum
#pragma unroll
    for (int r = 0; r < FRAG_RB_PER_WARP; ++r)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][mt][i] = grp[r][mt][i] = 0.f;

    // (rt, kc): the unit being decoded; (prt, pkc): the next one to fetch. No division in the loop.
    int rt = static_cast<int>(u_begin / KC), kc = static_cast<int>(u_begin % KC);
    int prt = rt, pkc = kc;
    auto advance = [&](int& r, int& c) {
        if (++c == KC) {
            c = 0;
            ++r;
        }
    };
#pragma unroll
    for (int s = 0; s < FRAG_STAGES - 1; ++s) {
        if (u_begin + s < u_end) {
            load_unit(prt, pkc, s);
            advance(prt, pkc);
        }
        cp_async_commit();
    }

    int slot = 0;
    for (int64_t u = u_begin; u < u_end; ++u) {
        cp_async_wait<FRAG_STAGES - 2>();  // unit u has landed (this thread's copies)
        __syncthreads();                   // ... everyone's, and slot (u - 1) is free again
        if (u + FRAG_STAGES - 1 < u_end) {
            load_unit(prt, pkc, slot == 0 ? FRAG_STAGES - 1 : slot - 1);
            advance(prt, pkc);
        }
        cp_async_commit();

        const unsigned char* base = smem + slot * St::BYTES;
        const uint4* ws = reinterpret_cast<const uint4*>(base + warp * (32 * 64)) + lane;
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(base + St::X_OFF);
        const uint32_t* ss = reinterpret_cast<const uint32_t*>(base + St::S_OFF);
        const uint8_t* zs = base + St::Z_OFF;

        uint32_t sw[FRAG_RB_PER_WARP][GC];   // scale words: s[g] | s[g+8] << 16, per group
        uint32_t zw[FRAG_RB_PER_WARP];       // zero bytes, one per group
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
            const int rbl = warp * FRAG_RB_PER_WARP + r;
            GroupRecord<GC>::load_scales(sw[r], ss + (rbl * 8 + g) * GC);
            zw[r] = ASYM ? GroupRecord<GC>::load_zeros(zs + (rbl * 8 + g) * GC) : 0u;
        }
        uint4 wv[FRAG_RB_PER_WARP];
        uint32_t nz0[FRAG_RB_PER_WARP], nz1[FRAG_RB_PER_WARP];  // -(bias + z) of rows g, g + 8
        uint32_t bfrag[MT][4];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int c = ks / STEPS_PER_GROUP;  // group inside the chunk (compile-time)
            if (ks % 4 == 0) {
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) wv[r] = ws[(r * 2 + ks / 4) * 32];
            }
            if (ks % STEPS_PER_GROUP == 0) {
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                    const uint32_t zb = ASYM ? zw[r] >> (8 * c) : 0x88u;  // symmetric: z = 8
                    nz0[r] = neg_bias_z<XT>(zb & 15u);
                    nz1[r] = neg_bias_z<XT>((zb >> 4) & 15u);
                }
            }
            if (ks % 2 == 0) {
                // B fragments of steps ks and ks + 1: matrix i / 8 = k 16 ks + 8 (i / 8), row i % 8
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(bfrag[mt], xs + (mt * 8 + (lane & 7)) * FRAG_XS_STRIDE + ks * 16 + (lane >> 3) * 8);
            }
            const int bh = (ks % 2) * 2;
#pragma unroll
            for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                const uint32_t w = (ks % 4 == 0) ? wv[r].x : (ks % 4 == 1) ? wv[r].y : (ks % 4 == 2) ? wv[r].z : wv[r].w;
                const uint32_t a0 = dequant_pair<XT>(w, nz0[r]);
                const uint32_t a1 = dequant_pair<XT>(w >> 4, nz1[r]);
                const uint32_t a2 = dequant_pair<XT>(w >> 8, nz0[r]);
                const uint32_t a3 = dequant_pair<XT>(w >> 12, nz1[r]);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (mt > 0 && mt * 8 >= p.m) break;  // an all-padding x tile adds nothing
                    mma16816<XT>(grp[r][mt], a0, a1, a2, a3, bfrag[mt][bh], bfrag[mt][bh + 1]);
                }
            }
            if ((ks + 1) % STEPS_PER_GROUP == 0) {  // the group closes: acc += s * its sum
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                    const float s_lo = bits_to_float(static_cast<uint16_t>(sw[r][c] & 0xffffu), p.scale_type);
                    const float s_hi = bits_to_float(static_cast<uint16_t>(sw[r][c] >> 16), p.scale_type);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        acc[r][mt][0] = fmaf(s_lo, grp[r][mt][0], acc[r][mt][0]);
                        acc[r][mt][1] = fmaf(s_lo, grp[r][mt][1], acc[r][mt][1]);
                        acc[r][mt][2] = fmaf(s_hi, grp[r][mt][2], acc[r][mt][2]);
                        acc[r][mt][3] = fmaf(s_hi, grp[r][mt][3], acc[r][mt][3]);
                        grp[r][mt][0] = grp[r][mt][1] = grp[r][mt][2] = grp[r][mt][3] = 0.f;
                    }
                }
            }
        }

        const int cur_rt = rt;
        const bool tile_done = kc == KC - 1 || u + 1 == u_end;
        advance(rt, kc);
        slot = slot == FRAG_STAGES - 1 ? 0 : slot + 1;
        if (!tile_done) continue;  // the row tile continues in this block

        // ---- output of row tile cur_rt. c0, c1: row g, tokens 2t, 2t+1 (+8 mt); c2, c3: row g+8.
        const int first = frag_owner(static_cast<int64_t>(cur_rt) * KC, U, P);
        const int contributors = frag_owner(static_cast<int64_t>(cur_rt) * KC + KC - 1, U, P) - first + 1;
        const int n_tile = cur_rt * FRAG_TILE_ROWS;
        if (contributors == 1) {
#pragma unroll
            for (int r = 0; r < FRAG_RB_PER_WARP; ++r)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int m = mt * 8 + 2 * t + (i & 1);
                        const int n = n_tile + (warp * FRAG_RB_PER_WARP + r) * 16 + g + ((i & 2) ? 8 : 0);
                        if (m < p.m && n < p.n) store_out(p.y, m * p.ldy + n, acc[r][mt][i], p.y_type);
                        acc[r][mt][i] = 0.f;
                    }
            continue;
        }
        // Shared row tile: publish the partial sums in slot (this block - first); the last
        // contributor to arrive adds the slots in order, clears them and re-arms the counter.
        // partial layout: [row_tiles][max_contributors][16 tokens][256 rows]
        constexpr int SLOT = 16 * FRAG_TILE_ROWS;
        float* part = p.partial + (static_cast<int64_t>(cur_rt) * p.max_contributors + (blockIdx.x - first)) * SLOT;
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = mt * 8 + 2 * t + (i & 1);
                    const int row = (warp * FRAG_RB_PER_WARP + r) * 16 + g + ((i & 2) ? 8 : 0);
                    if (m < p.m) part[m * FRAG_TILE_ROWS + row] = acc[r][mt][i];
                    acc[r][mt][i] = 0.f;
                }
        __threadfence();
        __syncthreads();
        if (tid == 0) last_block = atomicAdd(&p.counters[cur_rt], 1u) == static_cast<unsigned>(contributors - 1);
        __syncthreads();
        if (last_block) {
            __threadfence();
            float* tile = p.partial + static_cast<int64_t>(cur_rt) * p.max_contributors * SLOT;
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int i = tid; i < p.m * (FRAG_TILE_ROWS / 4); i += FRAG_THREADS) {
                float4 v = zero;
                for (int c = 0; c < contributors; ++c) {
                    const float4 q = ld_cg_f4(tile + c * SLOT + 4 * i);
                    v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
                    st_cg_f4(tile + c * SLOT + 4 * i, zero);
                }
                const int m = i / (FRAG_TILE_ROWS / 4), n = n_tile + 4 * (i % (FRAG_TILE_ROWS / 4));
                const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n + e < p.n) store_out(p.y, m * p.ldy + n + e, vs[e], p.y_type);
            }
            if (tid == 0) p.counters[cur_rt] = 0;
        }
        __syncthreads();  // last_block is rewritten by the next row tile's arrival
    }
    cp_async_wait<0>();  // no copy may outlive the block
#else
    // Built for an architecture without mma.sync: the host gate never picks this tier there.
    qg_device_trap();
#endif
}

const void* decode_frag_kernel(int x_type, int mt, int group_size, bool asym) {
#define QG_CASE(XT, MT, G, ASYM)                                                  \
    if (x_type == XT && mt == MT && group_size == G && asym == ASYM)              \
        return reinterpret_cast<const void*>(&decode_frag<XT, MT, G, ASYM>);
    QG_W4A16_FRAG_KERNELS(QG_CASE)
#undef QG_CASE
    return nullptr;
}

}  // namespace w4a16
}  // namespace qg
