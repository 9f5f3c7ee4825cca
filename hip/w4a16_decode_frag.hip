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
// Pipeline. Each lane loads its own four 16-byte fragment tiles, scale words and zero bytes
// of a unit straight into registers, two units ahead, in two static buffers (the loop is
// unrolled by two: no register that a load is still writing is ever moved, which would
// stall on the load). Only the x chunk is shared: a FRAG_X_STAGES ring in shared memory
// filled by cp.async, one barrier per unit. The budget that binds is the integer pipe
// (lop3, shifts, integer multiply-adds at half rate on sm_90: bench/NOTES.md), so the
// per-unit bookkeeping is a handful of pointer additions.
//
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

// One unit of a lane: its two row blocks' fragment tiles (w[r][j]: row block r, 64-k tile j
// of the chunk; the byte plane of CODE_Q8_0 and CODE_Q6_K: 32-k tile j, WT = 4), scale words (GC groups each) and
// zero bytes.
template <int GC, int WT>
struct UnitRegs {
    uint4 w[FRAG_RB_PER_WARP][WT];
    uint32_t s[FRAG_RB_PER_WARP][GC];
    uint32_t z[FRAG_RB_PER_WARP];
    uint2 dm[FRAG_RB_PER_WARP];  // CODE_Q4_K / IQ4_XS / Q6_K: the super-block words (d; dmin)
};

template <int GC>
__device__ __forceinline__ void load_group_words(uint32_t (&s)[GC], const uint32_t* p) {
    if constexpr (GC == 4) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
        s[0] = v.x, s[1] = v.y, s[2] = v.z, s[3] = v.w;
    } else if constexpr (GC == 2) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
        s[0] = v.x, s[1] = v.y;
    } else {
        s[0] = __ldg(p);
    }
}

template <int GC>
__device__ __forceinline__ uint32_t load_group_bytes(const uint8_t* p) {
    return GC == 4 ? __ldg(reinterpret_cast<const uint32_t*>(p))
                   : GC == 2 ? static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p))) : __ldg(p);
}

// Where a lane's data of unit (rt, kc) lives: first row block of the warp's pair, then the
// per-row-block strides (the loads add constants). Built where a row tile starts; the next
// chunk's is a constant step (unit_step).
struct UnitAddr {
    const uint4* w;        // tile (rb0, 2 kc), this lane's 16 bytes
    const uint32_t* s;     // scale record (rb0, kc), lane row g
    const uint8_t* z;      // zero record (rb0, kc), lane row g
    const uint2* dm;       // CODE_Q4_K / IQ4_XS: the super-block words (rb0, kc / 2), lane row g
    bool in[FRAG_RB_PER_WARP];
};

}  // namespace
#endif

// XT: activation type. MT: n8 tiles of x (1: M <= 8, 2: M <= 16). G: group size (a template
// argument: every group index below is a compile-time constant). ASYM: zero-points given.
// CODE: what a nibble codes (WeightCode: W4A16 integers, MXFP4 E2M1 values with G = 32, or
// GGUF Q4_K codes / IQ4_XS codebook indices with G = 32: their group records and super-block
// words), or GGUF Q8_0's bytes (G = 32, fp16 d: the W4A16 group close), or GGUF Q6_K's bytes
// (G = 32 records of two 16-element groups: a group closes every k16 step).
// w4a16_kernels.h names hip/mma.h's codebooks and group scales by number (it does not include mma.h)
static_assert(codebook_of(CODE_IQ4_XS) == BOOK_IQ4NL && codebook_of(CODE_IQ3_XXS) == BOOK_IQ3XXS &&
                  super_scale_of(CODE_Q4_K) == SUPER_Q4_K && super_scale_of(CODE_IQ4_XS) == SUPER_IQ4_XS &&
                  super_scale_of(CODE_IQ3_XXS) == SUPER_IQ3_XXS,
              "codebook_of / super_scale_of and hip/mma.h's enums disagree");

template <int XT, int MT, int G, bool ASYM, int CODE>
// Two blocks an SM, except for the byte plane's codes (Q8_0, Q6_K): Q8_0's four tile loads a row block and unit need 250 registers
// (ptxas), which two blocks an SM cut to 128 with 92-104 bytes spilled; one block an SM keeps
// them and measured 0.84-0.98x the time on the H200 at M = 1..16 (bench/NOTES.md, 2026-12-04).
__global__ void __launch_bounds__(FRAG_THREADS, byte_codes(CODE) ? FRAG_MIN_BLOCKS / 2 : FRAG_MIN_BLOCKS) decode_frag(const FragParams p) {
#if defined(QG_HAS_MMA_SYNC)
    typedef FragStage<MT> St;
    constexpr int GC = 128 / G;
    constexpr int WT = chunk_loads(CODE);        // 16-byte weight loads a row block and unit
    constexpr int KS = 8;                        // k16 steps per unit
    constexpr int STEPS_PER_GROUP = CODE == CODE_Q6_K ? 1 : G / 16;  // 2, 4, 8 (Q6_K: 1)
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

    // ---- per-lane data of unit (rt, kc)
    const int64_t w_rb_stride = KT * 32 * (WT / 2);  // uint4 per row block
    const int64_t s_rb_stride = static_cast<int64_t>(KC) * 8 * GC;  // words / bytes per row block
    auto unit_addr = [&](int rt, int kc) {
        UnitAddr a;
        const int rb0 = rt * FRAG_TILE_RB + warp * FRAG_RB_PER_WARP;
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r) a.in[r] = rb0 + r < p.row_blocks;
        const int64_t rec = (static_cast<int64_t>(rb0) * KC + kc) * 8 + g;
        a.w = reinterpret_cast<const uint4*>(p.qweight) + static_cast<int64_t>(rb0) * w_rb_stride +
              WT * static_cast<int64_t>(kc) * 32 + lane;
        a.s = p.scales + rec * GC;
        a.z = p.qzeros + rec * GC;
        if (has_superblocks(CODE)) a.dm = p.superblocks + (static_cast<int64_t>(rb0) * (KC / 2) + kc / 2) * 8 + g;
        return a;
    };
    // a's unit -> the next one, (rt, kc) (advance's result): a new row tile rebuilds the
    // pointers (64-bit products), a chunk inside one steps them (no product a unit)
    // q4_K's MT = 2 kernel holds its superblock state across the loop: a running address there
    // spilled (16 -> 48 bytes, +3 % on the H100), so it rebuilds the address a unit as before
    constexpr bool STEP = CODE != CODE_Q4_K;
    auto unit_step = [&](UnitAddr& a, int rt, int kc) {
        if (!STEP) return;
        if (kc == 0) {
            a = unit_addr(rt, 0);
            return;
        }
        a.w += WT * 32;
        a.s += 8 * GC;
        a.z += 8 * GC;
        if (has_superblocks(CODE) && kc % 2 == 0) a.dm += 8;
    };
    auto load_unit = [&](UnitRegs<GC, WT>& d, const UnitAddr& a) {
#pragma unroll
        for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
            if (a.in[r]) {
#pragma unroll
                for (int j = 0; j < WT; ++j) d.w[r][j] = __ldg(a.w + r * w_rb_stride + 32 * j);
                load_group_words<GC>(d.s[r], a.s + r * s_rb_stride);
                d.z[r] = ASYM ? load_group_bytes<GC>(a.z + r * s_rb_stride) : 0u;
                if (has_superblocks(CODE)) d.dm[r] = __ldg(a.dm + r * (KC / 2) * 8);
            } else {  // a row block past N (padding of the last row tile): zeros, never stored
#pragma unroll
                for (int j = 0; j < WT; ++j) d.w[r][j] = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int c = 0; c < GC; ++c) d.s[r][c] = 0;
                d.z[r] = 0;
                d.dm[r] = make_uint2(0, 0);
            }
        }
    };

    // ---- the codebook codes' table of value pairs, after the x ring (read after the first
    // unit's barrier)
    unsigned char* const pairs = smem + St::SMEM;
    const uint32_t lane4 = 4u * static_cast<uint32_t>(lane);
    if constexpr (codebook_codes(CODE)) codebook_pairs_fill<XT, codebook_of(CODE)>(pairs, tid, FRAG_THREADS);

    // ---- x chunk of unit (rt, kc) into ring slot `slot`: row tid / 16, 16-byte piece tid % 16
    const int x_row = tid >> 4, x_piece = tid & 15;
    const bool x_copier = tid < MT * 8 * 16;
    const bool x_row_in = x_row < p.m;
    const uint16_t* x_src = p.x + static_cast<int64_t>(x_row_in ? x_row : 0) * p.ldx + x_piece * 8;
    const uint32_t x_dst = smem_addr(smem) + (x_row * FRAG_XS_STRIDE + x_piece * 8) * 2;
    auto load_x = [&](int kc, int slot) {
        if (x_copier) {
            const bool in_k = kc * 128 + x_piece * 8 < p.k;  // K % 32 == 0: pieces are whole
            cp_async16(x_dst + slot * St::X_BYTES, x_src + kc * 128, x_row_in && in_k);
        }
    };
    // this lane's ldmatrix row of the B fragments (x tile mt adds 8 rows, step ks 32 bytes)
    const uint32_t x_frag = smem_addr(smem) + ((lane & 7) * FRAG_XS_STRIDE + (lane >> 3) * 8) * 2;

    float acc[FRAG_RB_PER_WARP][MT][4];
    float grp[FRAG_RB_PER_WARP][MT][4];  // the running group's sum
    // CODE_Q4_K: the running group's sums of x (tokens 2t, 2t + 1: elements 0, 1; 2 and 3 are the
    // same sums), from one mma a step against an A fragment of ones: the accumulator layout of
    // grp with no shuffles, for the group's "- dmin * m * sum x" term
    float xsum[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) xsum[mt][i] = 0.f;
#pragma unroll
    for (int r = 0; r < FRAG_RB_PER_WARP; ++r)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][mt][i] = grp[r][mt][i] = 0.f;

    // Units are walked with running (row tile, chunk) pairs: no division in the loop.
    auto advance = [&](int& r, int& c) {
        if (++c == KC) {
            c = 0;
            ++r;
        }
    };
    int rt = static_cast<int>(u_begin / KC), kc = static_cast<int>(u_begin % KC);
    int frt = rt, fkc = kc;   // next unit to load into registers
    int xrt = rt, xkc = kc;   // next unit whose x chunk to copy
#pragma unroll
    for (int s = 0; s < FRAG_X_STAGES - 1; ++s) {
        if (u_begin + s < u_end) {
            load_x(xkc, s);
            advance(xrt, xkc);
        }
        cp_async_commit();
    }
    UnitRegs<GC, WT> ra, rb;
    UnitAddr fa = unit_addr(frt, fkc);  // where unit (frt, fkc) lives (STEP)
    auto next_addr = [&]() { return STEP ? fa : unit_addr(frt, fkc); };
    if (u_begin < u_end) {
        load_unit(ra, next_addr());
        advance(frt, fkc);
        unit_step(fa, frt, fkc);
    }
    if (u_begin + 1 < u_end) {
        load_unit(rb, next_addr());
        advance(frt, fkc);
        unit_step(fa, frt, fkc);
    }

    // Decodes unit u (registers d, x in ring slot `slot`), refills d with unit u + 2, and
    // writes the row tile's output when the unit closes it.
    auto run_unit = [&](int64_t u, int slot, UnitRegs<GC, WT>& d) {
        cp_async_wait<FRAG_X_STAGES - 2>();  // unit u's x chunk has landed (this thread's copy)
        __syncthreads();                     // ... everyone's, and slot (u - 1) is free again
        if (u + FRAG_X_STAGES - 1 < u_end) {
            load_x(xkc, slot == 0 ? FRAG_X_STAGES - 1 : slot - 1);
            advance(xrt, xkc);
        }
        cp_async_commit();
        const uint32_t xs = x_frag + slot * St::X_BYTES;

        uint32_t bfrag[MT][4];
        ZeroPairs zp[FRAG_RB_PER_WARP];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int c = ks / (G / 16);  // group (scale word) inside the chunk (compile-time)
            if ((CODE == CODE_INT4 || CODE == CODE_Q4_K) && ks % STEPS_PER_GROUP == 0) {
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                    // symmetric: z = 8; Q4_K: the codes themselves (z = 0)
                    const uint32_t zb = CODE == CODE_Q4_K ? 0u : ASYM ? d.z[r] >> (8 * c) : 0x88u;
                    zp[r] = zero_pairs<XT>(zb & 15u, (zb >> 4) & 15u);
                }
            }
            if (ks % 2 == 0) {
                // B fragments of steps ks and ks + 1: matrix i / 8 = k 16 ks + 8 (i / 8), row i % 8
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(bfrag[mt], xs + (mt * 8 * FRAG_XS_STRIDE + ks * 16) * 2);
            }
            const int bh = (ks % 2) * 2;
            if constexpr (CODE == CODE_Q4_K) {
                constexpr uint32_t kOnes = XT == ELEM_BF16 ? 0x3f803f80u : 0x3c003c00u;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (mt > 0 && mt * 8 >= p.m) break;
                    mma16816<XT>(xsum[mt], kOnes, kOnes, kOnes, kOnes, bfrag[mt][bh], bfrag[mt][bh + 1]);
                }
            }
#pragma unroll
            for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                uint32_t a[4];
                if constexpr (byte_codes(CODE)) {  // step ks: words 2 (ks % 2), + 1 of 32-k tile ks / 2
                    const uint4 wt = d.w[r][ks / 2];
                    q8_word<XT>(ks % 2 ? wt.z : wt.x, a[0], a[1]);
                    q8_word<XT>(ks % 2 ? wt.w : wt.y, a[2], a[3]);
                } else {
                    const uint4 wt = d.w[r][ks / 4];
                    const uint32_t w = (ks % 4 == 0) ? wt.x : (ks % 4 == 1) ? wt.y : (ks % 4 == 2) ? wt.z : wt.w;
                    if constexpr (CODE == CODE_E2M1)
                        e2m1_word<XT>(w, a);
                    else if constexpr (codebook_codes(CODE))
                        codebook_pairs(w, pairs, lane4, a);
                    else
                        dequant_word<XT>(w, zp[r], a);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (mt > 0 && mt * 8 >= p.m) break;  // an all-padding x tile adds nothing
                    mma16816<XT>(grp[r][mt], a[0], a[1], a[2], a[3], bfrag[mt][bh], bfrag[mt][bh + 1]);
                }
            }
            if (has_superblocks(CODE) && (ks + 1) % STEPS_PER_GROUP == 0) {
                // the group closes: acc += s * sum(value x) - b * sum(x) (superblock_group; IQ4_XS,
                // IQ3_XXS, Q6_K: b = 0; Q6_K's 16-element group: half ks % 2 of the record)
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                    const SuperGroup q = CODE == CODE_Q6_K ? q6_group(d.s[r][c], d.dm[r], ks % 2)
                                                           : superblock_group<super_scale_of(CODE)>(d.s[r][c], d.dm[r]);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            acc[r][mt][i] = fmaf(i < 2 ? q.s_lo : q.s_hi, grp[r][mt][i], acc[r][mt][i]);
                            if (CODE == CODE_Q4_K) acc[r][mt][i] = fmaf(-(i < 2 ? q.b_lo : q.b_hi), xsum[mt][i], acc[r][mt][i]);
                            grp[r][mt][i] = 0.f;
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) xsum[mt][0] = xsum[mt][1] = xsum[mt][2] = xsum[mt][3] = 0.f;
            } else if ((ks + 1) % STEPS_PER_GROUP == 0) {  // the group closes: acc += s * its sum
#pragma unroll
                for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                    const float s_lo = bits_to_float(static_cast<uint16_t>(d.s[r][c] & 0xffffu), p.scale_type);
                    const float s_hi = bits_to_float(static_cast<uint16_t>(d.s[r][c] >> 16), p.scale_type);
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
        // the registers of unit u are spent: refill them with unit u + 2
        if (u + 2 < u_end) {
            load_unit(d, next_addr());
            advance(frt, fkc);
            unit_step(fa, frt, fkc);
        }

        const int cur_rt = rt;
        const bool tile_done = kc == KC - 1 || u + 1 == u_end;
        advance(rt, kc);
        if (!tile_done) return;  // the row tile continues in this block

        // ---- output of row tile cur_rt. c0, c1: row g, tokens 2t, 2t+1 (+8 mt); c2, c3: row g+8.
        const int first = frag_owner(static_cast<int64_t>(cur_rt) * KC, U, P);
        const int contributors = frag_owner(static_cast<int64_t>(cur_rt) * KC + KC - 1, U, P) - first + 1;
        const int n_tile = cur_rt * FRAG_TILE_ROWS;
        if (contributors == 1) {
            // the bias first, in registers, so that the store loop stays what it is without one
#pragma unroll
            for (int r = 0; r < FRAG_RB_PER_WARP; ++r) {
                const int nr = n_tile + (warp * FRAG_RB_PER_WARP + r) * 16 + g;
                const float bias_n[2] = {nr < p.n ? bias_at(p.bias, nr) : 0.0f,
                                         nr + 8 < p.n ? bias_at(p.bias, nr + 8) : 0.0f};
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[r][mt][i] += bias_n[i >> 1];
            }
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
            return;
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
        // The block's stores are ordered before thread 0's fence by the barrier (the fence is
        // cumulative), so one thread fences, not 256 (ncu: membar stalls, stop 19); likewise the
        // last to arrive: thread 0 fences after its add, and the barrier orders the block's reads
        // of the other blocks' sums after that fence.
        __syncthreads();
        if (tid == 0) {
            __threadfence();
            last_block = atomicAdd(&p.counters[cur_rt], 1u) == static_cast<unsigned>(contributors - 1);
            if (last_block) __threadfence();
        }
        __syncthreads();
        if (last_block) {
            // Each thread sums its float4 slots (at most PER of a 16-token tile) over the
            // contributors in order, CB contributors' loads in flight at once: the loop of one
            // L2 round trip per contributor and slot was ~10 % of decode_frag's stall samples
            // at M = 16 (ncu, stop 21), and 5376 x 21504 shares a row tile among ~13 blocks.
            float* tile = p.partial + static_cast<int64_t>(cur_rt) * p.max_contributors * SLOT;
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            constexpr int PER = SLOT / 4 / FRAG_THREADS;  // float4 slots a thread holds at M = 16
            constexpr int CB = 8;
            const int slots = p.m * (FRAG_TILE_ROWS / 4);
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int i = tid + j * FRAG_THREADS;
                if (i >= slots) break;
                float4 v = zero;
                for (int c0 = 0; c0 < contributors; c0 += CB) {
                    float4 q[CB];
#pragma unroll
                    for (int c = 0; c < CB; ++c)
                        q[c] = c0 + c < contributors ? ld_cg_f4(tile + (c0 + c) * SLOT + 4 * i) : zero;
#pragma unroll
                    for (int c = 0; c < CB; ++c) {
                        if (c0 + c >= contributors) break;
                        v.x += q[c].x, v.y += q[c].y, v.z += q[c].z, v.w += q[c].w;
                        st_cg_f4(tile + (c0 + c) * SLOT + 4 * i, zero);
                    }
                }
                const int m = i / (FRAG_TILE_ROWS / 4), n = n_tile + 4 * (i % (FRAG_TILE_ROWS / 4));
                const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n + e < p.n) store_out(p.y, m * p.ldy + n + e, vs[e] + bias_at(p.bias, n + e), p.y_type);
            }
            if (tid == 0) p.counters[cur_rt] = 0;
        }
        __syncthreads();  // last_block is rewritten by the next row tile's arrival
    };

    int slot = 0;
    for (int64_t u = u_begin; u < u_end; u += 2) {
        run_unit(u, slot, ra);
        slot = slot == FRAG_X_STAGES - 1 ? 0 : slot + 1;
        if (u + 1 < u_end) {
            run_unit(u + 1, slot, rb);
            slot = slot == FRAG_X_STAGES - 1 ? 0 : slot + 1;
        }
    }
    cp_async_wait<0>();  // no copy may outlive the block
#else
    // Built for an architecture without mma.sync: the host gate never picks this tier there.
    qg_device_trap();
#endif
}

const void* decode_frag_kernel(int x_type, int mt, int group_size, bool asym, int code) {
#define QG_CASE(XT, MT, G, ASYM)                                                            \
    if (code == CODE_INT4 && x_type == XT && mt == MT && group_size == G && asym == ASYM)   \
        return reinterpret_cast<const void*>(&decode_frag<XT, MT, G, ASYM, CODE_INT4>);
    QG_W4A16_FRAG_KERNELS(QG_CASE)
#undef QG_CASE
// the G = 32 codes without zero-points, each through its list (QG_CODE: the code at hand)
#define QG_CASE(XT, MT)                                                                    \
    if (code == QG_CODE && x_type == XT && mt == MT && group_size == 32 && !asym)         \
        return reinterpret_cast<const void*>(&decode_frag<XT, MT, 32, false, QG_CODE>);
#define QG_CODE CODE_E2M1
    QG_MXFP4_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_Q4_K
    QG_Q4_K_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_IQ4_XS
    QG_IQ4_XS_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_Q8_0
    QG_Q8_0_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_Q6_K
    QG_Q6_K_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_IQ3_XXS
    QG_IQ3_XXS_FRAG_KERNELS(QG_CASE)
#undef QG_CODE
#undef QG_CASE
    return nullptr;
}

}  // namespace w4a16
}  // namespace qg
