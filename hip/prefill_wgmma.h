// prefill_wgmma: the prefill kernel of the frag layout (W4A16, MXFP4, the GGUF codes), NVIDIA sm_90a (wgmma + TMA).
//
// y[M, N] = x[M, K] @ W^T for any M, the weight as wgmma's A operand (weights are the
// 64-row M side of each wgmma, tokens the N side: A/B swapped so that the int4 weight can
// come from registers, which only A may). A tile: 128 weight rows x BN tokens, 8 warps in 2
// warpgroups, warp w owning row block w of the tile's 8. A block a tile, or (dense calls with
// fewer tiles than the SMs hold, src/gpu/w4a16_prefill_launch.cpp) a grid of resident blocks
// sharing the tiles' K as stream-K (at prefill_wgmma).
//
// Per 64-k step:
//   - each lane's 16-byte frag tile (its A registers for four k16 steps) comes straight
//     from global memory into registers, two 128-k chunks ahead of its use, with the
//     chunk's scale words and zero bytes;
//   - thread 0 keeps STAGES - 2 x stages in flight by TMA (tiles [BN x 64], 128-byte swizzle,
//     zero fill past M and K; a stage is one tile, or two for the folded 64- and 128-token
//     kernels: XStages), each completing a `full` mbarrier; every warp releases a stage
//     through an `empty` mbarrier once the wgmmas reading it have completed;
//   - the nibbles become A registers with the exponent-bias trick (q - z exact), and four
//     wgmma m64nBNk16 accumulate the quantization group's sum in fp32 (`grp`); at the end
//     of a group the warpgroup waits for its wgmmas and adds scale * grp into `acc`.
// Numerics of that path (fp16 x) are the decode tiers': exact (q - z), fp32 products and sums,
// the scale applied to the fp32 group sum (one-hot x gives float(q - z) * float(s) bit for bit).
//
// bf16 x (FOLD, prefill_fold in w4a16_kernels.h) takes the scale into the A registers instead,
// so that each weight the wgmmas see is the weight rounded once to bf16 (round to nearest even),
// as Marlin and Machete do: one bf16 multiply per register pair with bf16 scales (FOLD_BF16),
// a multiply by the exact low part and a fused multiply-add by the high part with fp16 scales
// (FOLD_F16, fold_f16_scales: the same single rounding):
//   - W4A16: bf16((q - z) * s). |q - z| <= 15 (4 bits) times an 8-bit (bf16) or 11-bit (fp16)
//     significand is exact in fp32, so this is pyquant.formats.int4.dequantize_folded,
//     bf16(float32 weight): at most half a bf16 ulp (2^-8 relative) from the exact weight the
//     group-sum path uses; one-hot x gives the rounded weight bit for bit. The products with x
//     and the sums are fp32.
//   - MXFP4 (CODE_E2M1): e2m1 * 2^(e - 127) is exact in bf16 for every e (at most two
//     significant bits; the smallest, 2^-128, is a bf16 subnormal; overflow to inf exactly
//     where float32 overflows): nothing is rounded.
// Then the wgmmas accumulate all of K into `acc` with no group sum, no per-group wait, and the
// warpgroup keeps one step's wgmmas in flight while it dequantizes the next; the registers of
// `grp` go to a 256-token tile.
//
// The release rule makes the refill safe: the stage refilled at stage kt is the one of stage
// kt - 2, which every group (2 steps at most, G = 128) and every folded wgmma has finished
// with by the end of stage kt - 1, so thread 0 never waits on its own warpgroup's future.
//
// The kernel template and its lookup have internal linkage (an anonymous namespace): a
// translation unit that includes this header instantiates only the kernels it looks up. The
// ~190 instantiations compile as two units in parallel: hip/w4a16_prefill.hip the kernels of a
// block a tile and prefill_kernel, hip/w4a16_prefill_sk.hip the stream-K ones (CI's CUDA build
// waited ~7 minutes on the one unit they made before).
#pragma once

#include <stdint.h>

#include "compat.h"
#include "glu.h"
#include "mma.h"
#include "w4a16_kernels.h"
#include "wgmma.h"

namespace qg {
namespace w4a16 {

#if defined(QG_HAVE_TENSOR_MAPS)

#if defined(QG_HAS_WGMMA)
namespace {

// One 128-k chunk of a lane's row block: two frag tiles (the byte plane of CODE_Q8_0 and
// CODE_Q6_K: four 32-k tiles, WT = chunk_loads), GC scale words, GC zero bytes.
template <int GC, int WT>
struct Chunk {
    uint4 w[WT];
    uint32_t s[GC];
    uint32_t z;
    uint2 dm;  // CODE_Q4_K / IQ4_XS / Q6_K: the super-block words (d; dmin)
};

template <int GC, bool ASYM, int CODE>
__device__ __forceinline__ void load_chunk(Chunk<GC, chunk_loads(CODE)>& c, const PrefillParams& p, int rb, int kc,
                                           int lane, bool in) {
    constexpr int WT = chunk_loads(CODE);
    if (!in) {
#pragma unroll
        for (int j = 0; j < WT; ++j) c.w[j] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < GC; ++i) c.s[i] = 0;
        c.z = 0;
        c.dm = make_uint2(0, 0);
        return;
    }
    if (has_superblocks(CODE))
        c.dm = __ldg(p.superblocks + (static_cast<int64_t>(rb) * (p.k_chunks / 2) + kc / 2) * 8 + (lane >> 2));
    const uint4* w = reinterpret_cast<const uint4*>(p.qweight) +
                     (static_cast<int64_t>(rb) * p.k_tiles * (WT / 2) + WT * static_cast<int64_t>(kc)) * 32 + lane;
#pragma unroll
    for (int j = 0; j < WT; ++j) c.w[j] = __ldg(w + 32 * j);
    const int64_t rec = (static_cast<int64_t>(rb) * p.k_chunks + kc) * 8 + (lane >> 2);
    const uint32_t* s = p.scales + rec * GC;
    if constexpr (GC == 4) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(s));
        c.s[0] = v.x, c.s[1] = v.y, c.s[2] = v.z, c.s[3] = v.w;
    } else if constexpr (GC == 2) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(s));
        c.s[0] = v.x, c.s[1] = v.y;
    } else {
        c.s[0] = __ldg(s);
    }
    c.z = 0x88888888u;  // symmetric: z = 8 in every nibble
    if (ASYM) {
        const uint8_t* z = p.qzeros + rec * GC;
        c.z = GC == 4 ? __ldg(reinterpret_cast<const uint32_t*>(z))
                      : GC == 2 ? static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(z))) : __ldg(z);
    }
}

// acc += s * grp for one warpgroup tile: rows g use the low scale, rows g + 8 the high one.
template <int BN>
__device__ __forceinline__ void add_scaled(WgAcc<BN>& acc, const WgAcc<BN>& grp, uint32_t scale_word, int type) {
    const float s_lo = bits_to_float(static_cast<uint16_t>(scale_word & 0xffffu), type);
    const float s_hi = bits_to_float(static_cast<uint16_t>(scale_word >> 16), type);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        acc.d[4 * j + 0] = fmaf(s_lo, grp.d[4 * j + 0], acc.d[4 * j + 0]);
        acc.d[4 * j + 1] = fmaf(s_lo, grp.d[4 * j + 1], acc.d[4 * j + 1]);
        acc.d[4 * j + 2] = fmaf(s_hi, grp.d[4 * j + 2], acc.d[4 * j + 2]);
        acc.d[4 * j + 3] = fmaf(s_hi, grp.d[4 * j + 3], acc.d[4 * j + 3]);
    }
}

// A registers of the four k16 steps of one frag tile (word j = step j), zero-points of the
// lane's rows g (nz0) and g + 8 (nz1) per step's group.
template <int XT>
__device__ __forceinline__ void dequant_tile(uint32_t (&a)[4][4], const uint4& w, const uint32_t (&nz0)[4],
                                             const uint32_t (&nz1)[4]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        a[j][0] = dequant_pair<XT>(words[j], nz0[j]);
        a[j][1] = dequant_pair<XT>(words[j] >> 4, nz1[j]);
        a[j][2] = dequant_pair<XT>(words[j] >> 8, nz0[j]);
        a[j][3] = dequant_pair<XT>(words[j] >> 12, nz1[j]);
    }
}

// FOLD: the A registers of half h's four k16 steps times their scales, in bf16. Step j is in
// group c = (64 h + 16 j) / G, whose word holds s[g] | s[g + 8] << 16; registers a0, a2 are row
// g (the low scale in both halves: byte_perm 0x1010), a1, a3 row g + 8 (0x3232).
//   G     c of steps j = 0..3 (h = 0 | h = 1)
//   32    0 0 1 1 | 2 2 3 3
//   64    0 0 0 0 | 1 1 1 1
//   128   0 0 0 0 | 0 0 0 0
template <int G, int GC>
__device__ __forceinline__ void fold_scales(uint32_t (&a)[4][4], const uint32_t (&s)[GC], int h) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t sw = s[(64 * h + 16 * j) / G];
        const uint32_t s_g = __byte_perm(sw, 0, 0x1010), s_g8 = __byte_perm(sw, 0, 0x3232);
        a[j][0] = mul_bf16x2(a[j][0], s_g);
        a[j][1] = mul_bf16x2(a[j][1], s_g8);
        a[j][2] = mul_bf16x2(a[j][2], s_g);
        a[j][3] = mul_bf16x2(a[j][3], s_g8);
    }
}

// An fp16 scale word s[g] | s[g + 8] << 16 as two bf16 words hi, lo with hi + lo == s exactly
// in each half (FOLD_F16, w4a16_kernels.h): hi = bf16(s), lo = bf16(s - hi), exact (s - hi
// has at most the 3 significand bits bf16 drops). A non-finite s keeps lo = 0, so hi carries
// inf or NaN into the product as the group-sum path would.
__device__ __forceinline__ void split_f16_scale(uint32_t sw, uint32_t& hi, uint32_t& lo) {
    const float f0 = bits_to_float(static_cast<uint16_t>(sw & 0xffffu), ELEM_F16);
    const float f1 = bits_to_float(static_cast<uint16_t>(sw >> 16), ELEM_F16);
    hi = pack_bf16x2(f0, f1);
    const float r0 = f0 - __uint_as_float(hi << 16), r1 = f1 - __uint_as_float(hi & 0xffff0000u);
    lo = pack_bf16x2(isfinite(f0) ? r0 : 0.f, isfinite(f1) ? r1 : 0.f);
}

// FOLD_F16: as fold_scales, each register pair times its fp16 scale rounded once to bf16:
// (q - z) * lo is exact (4 + 3 significand bits), then one fused multiply-add with hi.
template <int G, int GC>
__device__ __forceinline__ void fold_f16_scales(uint32_t (&a)[4][4], const uint32_t (&s)[GC], int h) {
    uint32_t hi[GC], lo[GC];
#pragma unroll
    for (int c = 0; c < GC; ++c)
        if (c * G < 64 * (h + 1) && (c + 1) * G > 64 * h) split_f16_scale(s[c], hi[c], lo[c]);  // this half's groups
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = (64 * h + 16 * j) / G;
        const uint32_t hi_g = __byte_perm(hi[c], 0, 0x1010), hi_g8 = __byte_perm(hi[c], 0, 0x3232);
        const uint32_t lo_g = __byte_perm(lo[c], 0, 0x1010), lo_g8 = __byte_perm(lo[c], 0, 0x3232);
        a[j][0] = fma_bf16x2(a[j][0], hi_g, mul_bf16x2(a[j][0], lo_g));
        a[j][1] = fma_bf16x2(a[j][1], hi_g8, mul_bf16x2(a[j][1], lo_g8));
        a[j][2] = fma_bf16x2(a[j][2], hi_g, mul_bf16x2(a[j][2], lo_g));
        a[j][3] = fma_bf16x2(a[j][3], hi_g8, mul_bf16x2(a[j][3], lo_g8));
    }
}

// Two float32 as the x type's packed pair (lo in the low half), each rounded to nearest even.
template <int XT>
__device__ __forceinline__ uint32_t pack_x2(float lo, float hi) {
    if constexpr (XT == ELEM_BF16) {
        return pack_bf16x2(lo, hi);
    } else {
        uint32_t out;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
        return out;
    }
}

// FOLD_FP32 (CODE_Q4_K, CODE_IQ4_XS, CODE_Q8_0, CODE_Q6_K, CODE_IQ3_XXS): the A registers of half
// h's four k16 steps, each weight s * value - b in float32 as the gguf package computes it
// (superblock_group: Q4_K's (d * sc) * q - dmin * m, where the product is exact so one fused
// multiply-add rounds as its multiply and subtract do; IQ4_XS's (d * (ls - 32)) * kvalues[q] and
// IQ3_XXS's ((d * (0.5 + ls)) * 0.5) * value, b = 0: the fma is the multiply; scale_group: Q8_0's d * q, b = 0; q6_group: Q6_K's (d * sc) * (q - 32), b = 0, sc of
// the 16-element half j % 2) rounded once to x's type. Step j is in group 2h + j / 2; register p
// of a step is row g (p even) or g + 8 (odd), its values made exact fp16 pairs (the W4A16
// dequant with z = 0 of the nibbles at bits 4p and 16 + 4p, Marlin's two pairs a shift;
// codebook_word's lookup; q8_word on words 2 (j % 2), + 1 of 32-k tile 2h + j / 2) and
// widened to float32 (HADD2.F32).
template <int XT, int CODE, int GC>
__device__ __forceinline__ void float32_tile(uint32_t (&a)[4][4], const Chunk<GC, chunk_loads(CODE)>& c, int h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const SuperGroup q32 = CODE == CODE_Q8_0 ? scale_group(c.s[2 * h + half])
                                                 : superblock_group<super_scale_of(CODE)>(c.s[2 * h + half], c.dm);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const int j = 2 * half + jj;
            const SuperGroup q = CODE == CODE_Q6_K ? q6_group(c.s[2 * h + half], c.dm, jj) : q32;
            const float s[2] = {q.s_lo, q.s_hi}, nb[2] = {-q.b_lo, -q.b_hi};
            uint32_t v[4];  // the values as fp16 pairs, exact
            if constexpr (byte_codes(CODE)) {
                const uint4 t = c.w[2 * h + half];
                q8_word<ELEM_F16>(jj ? t.z : t.x, v[0], v[1]);
                q8_word<ELEM_F16>(jj ? t.w : t.y, v[2], v[3]);
            } else {
                const uint4& t = c.w[h];
                const uint32_t word = j == 0 ? t.x : j == 1 ? t.y : j == 2 ? t.z : t.w;
                if constexpr (CODE == CODE_Q4_K)
                    dequant_word<ELEM_F16>(word, zero_pairs<ELEM_F16>(0u, 0u), v);
                else
                    codebook_word<ELEM_F16, codebook_of(CODE)>(word, v);
            }
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const __half2 vh = *reinterpret_cast<const __half2*>(&v[p]);
                a[j][p] = pack_x2<XT>(fmaf(s[p & 1], __low2float(vh), nb[p & 1]),
                                      fmaf(s[p & 1], __high2float(vh), nb[p & 1]));
            }
        }
    }
}

// The x ring in shared memory by address (computed once per block, so that the generic-to-shared
// conversion stays out of the loop): STAGES tiles of B_BYTES from `tiles`, then a `full` and an
// `empty` mbarrier per stage, 8 bytes each.
struct XRing {
    uint32_t tiles, full, empty;
};

// A step's place in the ring: its stage and the parity of the stage's phase, advanced one step
// at a time (q % STAGES and q / STAGES of a runtime q cost a multiply-high where STAGES is 5).
// `reused`: the stage has held an earlier step (q >= STAGES), whose release the copy waits for.
template <int STAGES>
struct RingPos {
    uint32_t s, phase;
    bool reused;
    __device__ __forceinline__ explicit RingPos(int q)
        : s(static_cast<uint32_t>(q) % STAGES), phase((static_cast<uint32_t>(q) / STAGES) & 1), reused(q >= STAGES) {}
    __device__ __forceinline__ void next() {
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
            reused = true;
        }
    }
};

// The x ring of a kernel, in the shared memory of PrefillSmem<BN>: stages of TILES 64-k tiles
// (TMA boxes of BN tokens x 64 k, 128 bytes a token), one `full` and one `empty` mbarrier a
// stage. The folded kernels of 64 and 128 tokens take a 128-k chunk a stage (TILES = 2): one
// barrier wait, one copy issue, one release and one ring step a chunk instead of a 64-k step
// (their loop's own instructions, not the dequant, were ~100 of a step's ~160: bench/NOTES.md,
// session 52), the ring half as many stages of twice the bytes, so 2 chunks (4 steps) in flight
// instead of 6 steps. The group-sum kernels wait inside a step (a group ends there), and the
// 256-token ones have 5 stages of 32 KB already: a 64-k step a stage.
template <int BN, int FOLD>
struct XStages {
    static constexpr int TILES = FOLD != FOLD_NONE && BN <= 128 ? 2 : 1;
    static constexpr int STAGES = PrefillSmem<BN>::STAGES / TILES;
    static constexpr int TILE_BYTES = PrefillSmem<BN>::B_BYTES;
    static constexpr int BYTES = TILES * TILE_BYTES;
    static_assert(STAGES >= 3, "a stage is refilled two stages after its release");
};

// One segment of a block's work: chunks [kc0, kc0 + KC) of K for the block's 128 rows (warp w:
// row block rbw, in N where rb_in) and the BN tokens from tok0, summed into acc (zeroed here).
// ks counts the steps of the block's earlier segments: the x ring's stages and mbarrier parities
// run on across segments, and every step's x tile is released by the time this returns, so the
// next segment's copies never wait on this one's future.
template <int XT, int BN, int G, bool ASYM, int CODE, int FOLD>
__device__ __forceinline__ void run_segment(WgAcc<BN>& acc, const qg_tensor_map& tmap_x, const PrefillParams& p,
                                            const XRing& ring, int tok0, int rbw, bool rb_in, int kc0, int KC,
                                            int& ks) {
    typedef XStages<BN, FOLD> Xs;
    constexpr int GC = 128 / G;
    constexpr int STAGES = Xs::STAGES, TILES = Xs::TILES;
    constexpr int PD = STAGES - 2;  // stages in flight ahead of the current one
    const int tid = threadIdx.x, lane = tid & 31;
    const int KT = 2 * KC / TILES, k0 = ks;  // KT: the segment's stages

    RingPos<STAGES> copy(k0);  // thread 0: the next stage to copy, in k order
    auto issue = [&](int kt) {  // thread 0: the x tiles of stage kt of the segment
        const uint32_t full = ring.full + 8 * copy.s;
        if (copy.reused) mbar_wait_at(ring.empty + 8 * copy.s, copy.phase ^ 1);
        mbar_arrive_expect_tx_at(full, Xs::BYTES);
        constexpr int BOX = prefill_box_rows(BN);  // the map's box: BOX tokens x 64 k, 128 bytes a token
#pragma unroll
        for (int i = 0; i < TILES; ++i)
#pragma unroll
            for (int b = 0; b < BN / BOX; ++b)
                tma_load_2d_at(ring.tiles + copy.s * Xs::BYTES + i * Xs::TILE_BYTES + b * BOX * 128, &tmap_x, full,
                               (2 * kc0 + TILES * kt + i) * 64, tok0 + b * BOX);
        copy.next();
    };
    if (tid == 0)
        for (int kt = 0; kt < PD && kt < KT; ++kt) issue(kt);

    // chunk registers, loaded two chunks ahead of their use: a ring of 3 slots, the loop unrolled
    // by 3 so that the slots are fixed registers, not copies per chunk (the fold kernels of 128
    // and 256 tokens: 16 % fewer instructions a chunk, no spill; of 64 tokens at G >= 64, where
    // two blocks an SM cap the registers at 128: a few bytes spilled in the prologue only; of 32
    // tokens at every G, whose 16 accumulators leave room: 125-128 registers, no spill). The
    // copies cost more than instructions: the copy of the slot loaded one chunk before waits for
    // that load, so the rotating form has one chunk of cover, not two (SASS: the moves of the
    // loaded registers open each iteration). Elsewhere (64 tokens at G = 32, and the group-sum
    // kernels near 255 registers) the unrolled loop spilled inside the loop, and the slots rotate.
    constexpr bool UNROLL3 = FOLD && (BN != 64 || G >= 64);
    Chunk<GC, chunk_loads(CODE)> cb[3];
    load_chunk<GC, ASYM, CODE>(cb[0], p, rbw, kc0, lane, rb_in);
    load_chunk<GC, ASYM, CODE>(cb[1], p, rbw, kc0 + 1, lane, rb_in && 1 < KC);

    WgAcc<BN> grp;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc.d[i] = grp.d[i] = 0.f;

    // the stage the warps compute; broadcast from lane 0 (the same value) so that ptxas knows it
    // warp-uniform and keeps the ring and the wgmma descriptors in uniform registers (SASS:
    // two uniform instructions a wgmma instead of four, no stack frame; bench/NOTES.md, session 53)
    RingPos<STAGES> use(__shfl_sync(0xffffffffu, k0, 0));
    uint32_t prev = ring.empty;  // `empty` of the stage before (FOLD and G = 128 release it)
    uint32_t a[2][4][4];  // A registers of the chunk's two steps (outside the loop: FOLD keeps one in flight)
    auto run_chunk = [&](const Chunk<GC, chunk_loads(CODE)>& cur, int kc) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int kt = (2 * kc + h) / TILES;       // the stage of this 64-k step
            const bool opens = h % TILES == 0;          // the step opens its stage
            if (opens && tid == 0 && kt + PD < KT) issue(kt + PD);
            // zero-points of the four k16 steps: step j of half h is in group (64 h + 16 j) / G
            if constexpr (float32_weights(CODE)) {
                float32_tile<XT, CODE, GC>(a[h], cur, h);
            } else if constexpr (CODE == CODE_E2M1) {
                const uint32_t words[4] = {cur.w[h].x, cur.w[h].y, cur.w[h].z, cur.w[h].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) e2m1_word<XT>(words[j], a[h][j]);
            } else {
                uint32_t nz0[4], nz1[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int c = (64 * h + 16 * j) / G;
                    const uint32_t zb = ASYM ? cur.z >> (8 * c) : 0x88u;
                    nz0[j] = neg_bias_z<XT>(zb & 15u);
                    nz1[j] = neg_bias_z<XT>((zb >> 4) & 15u);
                }
                dequant_tile<XT>(a[h], cur.w[h], nz0, nz1);
            }
            if constexpr (FOLD == FOLD_BF16) fold_scales<G, GC>(a[h], cur.s, h);
            if constexpr (FOLD == FOLD_F16) fold_f16_scales<G, GC>(a[h], cur.s, h);
            const uint32_t empty = ring.empty + 8 * use.s;
            if (opens) mbar_wait_at(ring.full + 8 * use.s, use.phase);
            // k16 step j: + 32 j bytes
            const uint64_t desc =
                wgmma_desc_k128b_at(ring.tiles + use.s * Xs::BYTES + (h % TILES) * Xs::TILE_BYTES);
            wgmma_fence();
            if constexpr (FOLD) {
                // all of K into acc; wait for the previous step only (at a stage's first step
                // that is the stage before's last, so its tiles go back to the ring)
#pragma unroll
                for (int j = 0; j < 4; ++j) wgmma_m64k16<XT, BN>(acc, a[h][j], wgmma_desc_offset(desc, 32 * j), 1);
                wgmma_commit();
                wgmma_fence_acc(acc);
                wgmma_wait<1>();
                if (opens && lane == 0 && kt > 0) mbar_arrive_at(prev);
            } else if constexpr (G == 32) {
                // two groups per step: each is two k16 wgmmas, waited for and scaled
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    wgmma_m64k16<XT, BN>(grp, a[h][2 * half], wgmma_desc_offset(desc, 64 * half), 0);
                    wgmma_m64k16<XT, BN>(grp, a[h][2 * half + 1], wgmma_desc_offset(desc, 64 * half + 32), 1);
                    wgmma_commit();
                    wgmma_wait<0>();
                    add_scaled<BN>(acc, grp, cur.s[2 * h + half], p.scale_type);
                    if (half == 0) wgmma_fence();
                }
                if (lane == 0) mbar_arrive_at(empty);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    wgmma_m64k16<XT, BN>(grp, a[h][j], wgmma_desc_offset(desc, 32 * j),
                                         (j == 0 && (G == 64 || h == 0)) ? 0 : 1);
                wgmma_commit();
                if (G == 64 || h == 1) {  // the group ends with this step
                    wgmma_wait<0>();
                    add_scaled<BN>(acc, grp, cur.s[G == 64 ? h : 0], p.scale_type);
                    if (lane == 0) {
                        mbar_arrive_at(empty);
                        if (G == 128) mbar_arrive_at(prev);
                    }
                }
            }
            if ((h + 1) % TILES == 0) {  // the step closes its stage
                prev = empty;
                use.next();
            }
        }
    };
    if constexpr (UNROLL3) {
        for (int kc = 0; kc < KC; kc += 3) {
#pragma unroll
            for (int u = 0; u < 3; ++u) {
                if (u == 0 || kc + u < KC) {
                    // slot (u + 2) % 3 held chunk kc + u - 1, spent in the step before
                    load_chunk<GC, ASYM, CODE>(cb[(u + 2) % 3], p, rbw, kc0 + kc + u + 2, lane, rb_in && kc + u + 2 < KC);
                    run_chunk(cb[u], kc + u);
                }
            }
        }
    } else {
        for (int kc = 0; kc < KC; ++kc) {
            cb[2] = cb[0];
            cb[0] = cb[1];
            load_chunk<GC, ASYM, CODE>(cb[1], p, rbw, kc0 + kc + 2, lane, rb_in && kc + 2 < KC);
            run_chunk(cb[2], kc);
        }
    }
    if constexpr (FOLD) {  // the last step's wgmmas, then its tile back to the ring
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive_at(prev);
    }
    ks = k0 + KT;
}

// The dense epilogue of one tile: y = acc + bias, rounded once, rows past N and tokens past M
// not stored. d[4j + i] is row 16 w + g + 8 (i >> 1) of the tile, token 8 j + 2 t + (i & 1).
// This form stores each element on its own (2-byte stores, a bounds test and the output type's
// switch each): fp32 y, and y whose rows are not 16-byte aligned. store_tile_staged is the rule.
template <int BN>
__device__ __forceinline__ void store_tile(WgAcc<BN>& acc, const PrefillParams& p, int tok0, int rb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n0 = rb * 16 + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int tok = tok0 + 8 * j + 2 * t + (i & 1);
            const int n = n0 + 8 * (i >> 1);
            if (tok < p.m && n < p.n)
                store_out(p.y, static_cast<int64_t>(tok) * p.ldy + n, acc.d[4 * j + i], p.y_type);
        }
}

// The staged tile: BN token rows of the tile's 128 weight rows (256 bytes of 16-bit y), padded
// by 16 bytes so that the 8 rows of a stmatrix (and the quarter-warps of a 16-byte read) fall in
// distinct banks. It lies where the x ring was (PrefillSmem: at least BN x 256 bytes a stage).
constexpr int PF_STAGE_STRIDE = PF_ROWS * 2 + 16;

// The dense epilogue through shared memory, where y is x's 16-bit type and its rows are 16-byte
// aligned (the block's test: y_staged): each warp turns its accumulators into x's type (one
// cvt a pair: the same round to nearest even as store_out) and stores them transposed, one
// stmatrix for four 8 x 8 blocks; then each thread copies 16-byte pieces (8 weight rows of one
// token) to y. 16 instructions a thread for the shared stores and 16 pairs of 16-byte load and
// store at BN = 256, where store_tile spends ~27 instructions on each of its 128 stores
// (H200 source counters: 16 % of the warps' time at 43008 x 5376, M = 512; bench/NOTES.md).
// All threads of the block call it (two barriers); the x ring must be idle: every wgmma done,
// no copy in flight. `more`: the block's x ring is used again after this (stream-K's next
// segment), so the shared reads are fenced against the copies to come.
template <int XT, int BN>
__device__ __forceinline__ void store_tile_staged(WgAcc<BN>& acc, const PrefillParams& p, unsigned char* stage,
                                                  int tok0, int rb, bool more) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    __syncthreads();  // every warp's wgmmas have read their last x tile
    // stmatrix j2 covers tokens 16 j2 .. + 15: matrix q = lane / 8 is token block 2 j2 + q / 2,
    // rows 16 warp + 8 (q % 2); lane 8 q + i addresses its token row i
    const int q = lane >> 3, i = lane & 7;
    const uint32_t base = smem_addr(stage) + ((q >> 1) * 8 + i) * PF_STAGE_STRIDE + (16 * warp + 8 * (q & 1)) * 2;
#pragma unroll
    for (int j2 = 0; j2 < BN / 16; ++j2) {
        const float* d = acc.d + 8 * j2;
        stmatrix_x4_trans(base + j2 * 16 * PF_STAGE_STRIDE, pack_x2<XT>(d[0], d[1]), pack_x2<XT>(d[2], d[3]),
                          pack_x2<XT>(d[4], d[5]), pack_x2<XT>(d[6], d[7]));
    }
    __syncthreads();
    // thread tid copies weight rows 8 (tid % 16) .. + 7 of token rows tid / 16 + 16 it: a warp
    // stores two whole 256-byte token rows of the tile an instruction
    const int piece = tid & 15, row0 = tid >> 4;
    const int n = (rb - warp) * 16 + 8 * piece;
    const bool whole = n + 8 <= p.n;  // else N ends inside the piece (GGUF weights: any N)
    const uint32_t src = smem_addr(stage) + row0 * PF_STAGE_STRIDE + 16 * piece;
    uint16_t* dst = static_cast<uint16_t*>(p.y) + static_cast<int64_t>(tok0 + row0) * p.ldy + n;
    const int64_t dst_step = 16 * p.ldy;
#pragma unroll
    for (int it = 0; it < BN / 16; ++it, dst += dst_step) {
        if (tok0 + row0 + 16 * it >= p.m) break;
        const uint4 v = lds128_at(src + it * 16 * PF_STAGE_STRIDE);
        if (whole) {
            *reinterpret_cast<uint4*>(dst) = v;
        } else {
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (n + e < p.n) dst[e] = static_cast<uint16_t>(w[e >> 1] >> (16 * (e & 1)));
        }
    }
    if (more) {
        fence_proxy_async_shared();
        __syncthreads();
    }
}

// y = acc + bias for a dense tile (bias added in fp32 first, then one rounding): staged where
// y_staged allows it. `y_staged` is the same for every thread of the block.
template <int XT, int BN>
__device__ __forceinline__ void store_dense(WgAcc<BN>& acc, const PrefillParams& p, unsigned char* stage,
                                            bool y_staged, int tok0, int rb, bool more) {
    const int g = (threadIdx.x & 31) >> 2;
    const int n0 = rb * 16 + g;
    const float bias_n[2] = {n0 < p.n ? bias_at(p.bias, n0) : 0.0f, n0 + 8 < p.n ? bias_at(p.bias, n0 + 8) : 0.0f};
    // the bias first, in registers, so that the store loop stays what it is without one
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc.d[4 * j + i] += bias_n[i >> 1];
    if (y_staged)
        store_tile_staged<XT, BN>(acc, p, stage, tok0, rb, more);
    else
        store_tile<BN>(acc, p, tok0, rb);
}

// A staged fp32 token row: the tile's 128 weight rows, padded by 16 bytes (the stores of a warp's
// lanes, rows g and tokens 2 t, fall in 32 distinct banks).
constexpr int PF_STAGE_STRIDE_F32 = PF_ROWS * 4 + 16;

// The block's fp32 tile into shared memory: token row r of the tile at r * PF_STAGE_STRIDE_F32,
// its 128 weight rows (tile row 16 warp + g + 8 (i >> 1)) as consecutive floats. All threads
// call it; the x ring must be idle (the first barrier).
template <int BN>
__device__ __forceinline__ void stage_tile_f32(const WgAcc<BN>& acc, unsigned char* stage) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    __syncthreads();  // every warp's wgmmas have read their last x tile
    // d[4 j + i]: token 8 j + 2 t + (i & 1), row 16 warp + g + 8 (i >> 1)
    const uint32_t base = smem_addr(stage) + 2 * t * PF_STAGE_STRIDE_F32 + (16 * warp + g) * 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            sts32_at(base + (8 * j + (i & 1)) * PF_STAGE_STRIDE_F32 + 32 * (i >> 1), acc.d[4 * j + i]);
    __syncthreads();
}

// The grouped (MoE) epilogue through shared memory, for its fp32 pair rows (the launcher's y,
// 16-byte aligned rows): the tile's token rows of 128 fp32 (stage_tile_f32), then each thread copies
// 16-byte pieces (4 weight rows of one gathered token) to the token's output row, the
// expert's bias added: 16 pieces a thread at 128 tokens, where the element-wise form did 64
// stores, each behind its own out_rows load and four tests. Rows past N and the padding rows
// of a part (n % part_rows >= part_valid) are not stored, nor tokens whose out_rows entry is
// outside [0, out_limit). All threads of the block call it; the x ring must be idle.
template <int BN>
__device__ __forceinline__ void store_grouped_staged(const WgAcc<BN>& acc, const PrefillParams& p,
                                                     unsigned char* stage, int tok0, int rb, int64_t b0) {
    const int tid = threadIdx.x, warp = tid >> 5;
    stage_tile_f32<BN>(acc, stage);
    // thread tid: rows 4 (tid % 32) .. + 3 of token rows tid / 32 + 8 it (a warp: one 512-byte row)
    const int piece = tid & 31, row0 = tid >> 5;
    const int n = (rb - warp) * 16 + 4 * piece;
    bool in[4];
    float bias4[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        in[e] = n + e < p.n && (n + e) % p.part_rows < p.part_valid;
        bias4[e] = in[e] ? bias_at(p.bias, b0 + n + e) : 0.0f;
    }
    const bool whole = in[0] && in[1] && in[2] && in[3];
    const uint32_t src = smem_addr(stage) + row0 * PF_STAGE_STRIDE_F32 + 16 * piece;
#pragma unroll 4
    for (int it = 0; it < BN / 8; ++it) {
        const int row = p.out_rows[tok0 + row0 + 8 * it];
        if (row < 0 || row >= p.out_limit) continue;
        const uint4 v = lds128_at(src + it * 8 * PF_STAGE_STRIDE_F32);
        const float o[4] = {__uint_as_float(v.x) + bias4[0], __uint_as_float(v.y) + bias4[1],
                            __uint_as_float(v.z) + bias4[2], __uint_as_float(v.w) + bias4[3]};
        float* dst = static_cast<float*>(p.y) + static_cast<int64_t>(row) * p.ldy + n;
        if (whole) {
            *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (in[e]) dst[e] = o[e];
        }
    }
}

// Grouped stage 1, the gated activation fused (PrefillParams::act): the tile's gate sums are
// tile rows 0..63 (warps 0-3), the same channels' up sums rows 64..127 (warps 4-7); through
// shared memory, thread tid takes channels 4 (tid % 16) .. + 3 of token rows tid / 16 + 16 it
// and writes act = glu(gate + bias, up + bias) for them, rounded once to x's type (8-byte
// stores where the four are in range and the row allows). The fp32 sums and the bias are those
// moe_act adds to the unfused path's gate / up rows, so the bits are the same.
template <int XT, int BN>
__device__ __forceinline__ void store_glu_staged(const WgAcc<BN>& acc, const PrefillParams& p, unsigned char* stage,
                                                 int tok0, int rt, int64_t b0) {
    stage_tile_f32<BN>(acc, stage);
    const int tid = threadIdx.x, piece = tid & 15, row0 = tid >> 4;
    const int inter = p.part_valid, c = rt * (PF_ROWS / 2) + 4 * piece;
    bool in[4];
    float gate_b[4], up_b[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        in[e] = c + e < inter;
        gate_b[e] = in[e] ? bias_at(p.bias, b0 + gate_index(p.concat, c + e)) : 0.0f;
        up_b[e] = in[e] ? bias_at(p.bias, b0 + up_index(p.concat, inter, c + e)) : 0.0f;
    }
    const bool whole = in[3] && (inter & 3) == 0 && (reinterpret_cast<uintptr_t>(p.act) & 7) == 0;
    const uint32_t src = smem_addr(stage) + row0 * PF_STAGE_STRIDE_F32 + 16 * piece;
#pragma unroll 4
    for (int it = 0; it < BN / 16; ++it) {
        const int row = p.out_rows[tok0 + row0 + 16 * it];
        if (row < 0 || row >= p.out_limit) continue;
        const uint32_t at = src + it * 16 * PF_STAGE_STRIDE_F32;
        const uint4 gv = lds128_at(at), uv = lds128_at(at + PF_ROWS / 2 * 4);
        const float gs[4] = {__uint_as_float(gv.x), __uint_as_float(gv.y), __uint_as_float(gv.z), __uint_as_float(gv.w)};
        const float us[4] = {__uint_as_float(uv.x), __uint_as_float(uv.y), __uint_as_float(uv.z), __uint_as_float(uv.w)};
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = glu(p.activation, gs[e] + gate_b[e], us[e] + up_b[e], p.alpha, p.limit);
        const int64_t at_out = static_cast<int64_t>(row) * inter + c;
        if (whole) {
            *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.act) + at_out) =
                make_uint2(pack_x2<XT>(o[0], o[1]), pack_x2<XT>(o[2], o[3]));
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (in[e]) store_out(p.act, at_out + e, o[e], XT);
        }
    }
}

// A block's partial-sum slot (stream-K): BN / 8 float4 per thread, thread-minor, so that every
// store and load of a slot is 16 consecutive bytes a lane.
template <int BN>
__device__ __forceinline__ float4* partial_slot(const PrefillParams& p, int block) {
    return reinterpret_cast<float4*>(p.partial) + static_cast<int64_t>(block) * (BN / 8) * PF_THREADS + threadIdx.x;
}

// Stream-K, a segment that does not end the tile's K (the first its block runs): its sums to
// the block's slot, then one arrival on the tile's counter (every thread's stores fenced before
// the barrier; one release).
template <int BN>
__device__ __forceinline__ void contribute(const WgAcc<BN>& acc, const PrefillParams& p, int sk_tile) {
    float4* slot = partial_slot<BN>(p, blockIdx.x);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
        __stcg(slot + j * PF_THREADS, make_float4(acc.d[4 * j], acc.d[4 * j + 1], acc.d[4 * j + 2], acc.d[4 * j + 3]));
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) qg_atomic_add_release_gpu(&p.sk_count[sk_tile], 1u);
}

// Stream-K, the segment that ends the tile's K after another block's (the last one its block
// runs): waits for the `contributors` blocks before it, adds their slots in block order
// (deterministic: the segmentation depends on the grid alone), zeroes the slots and re-arms
// the counter. The contributors ran these segments first, so the wait is short; and a block
// only ever waits for blocks of a lower index, which the GPU dispatched before it, so no
// residency (another kernel on the SMs, a smaller device share) can make the waits circular.
template <int BN>
__device__ __forceinline__ void gather_partials(WgAcc<BN>& acc, const PrefillParams& p, int sk_tile, int contributors) {
    if (threadIdx.x == 0) {
        while (qg_atomic_load_acquire_gpu(&p.sk_count[sk_tile]) < static_cast<unsigned>(contributors)) __nanosleep(128);
        p.sk_count[sk_tile] = 0;  // every contributor has arrived: no block touches it again this launch
    }
    __syncthreads();
    for (int c = static_cast<int>(blockIdx.x) - contributors; c < static_cast<int>(blockIdx.x); ++c) {
        float4* slot = partial_slot<BN>(p, c);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const float4 v = __ldcg(slot + j * PF_THREADS);
            __stcg(slot + j * PF_THREADS, make_float4(0.f, 0.f, 0.f, 0.f));
            acc.d[4 * j] += v.x, acc.d[4 * j + 1] += v.y, acc.d[4 * j + 2] += v.z, acc.d[4 * j + 3] += v.w;
        }
    }
}

}  // namespace
#endif  // QG_HAS_WGMMA

namespace {

// FOLD: the scale in A (file comment); the launcher passes prefill_folds(x type, scale type).
//
// SK = false: a block a tile (token tile bx, row tile row_tile0 + by), all of K. SK = true (dense
// calls only): a grid of P blocks over the tiles t = (row tile - row_tile0) * token_tiles + token
// tile: their
// (tile, chunk) units, tile-major, in equal contiguous ranges [b W / P, (b + 1) W / P) of the W
// units, each range run from its end backwards. A range splits a tile's K at most at its two
// ends: the block holding a tile's last unit ends it (its last segment: it adds the others'
// sums, gather_partials), the blocks before it contribute (their first segments). Two kernels,
// not one with a runtime switch: the whole-tile loop inside the stream-K one measured 9 %
// slower on the H200 (43008 x 5376 M = 512: 400 -> 440 us). Two blocks an SM (128 registers)
// for the 32-, 80- and 96-token tiles and the folded stream-K 64: the 80 / 96 ones at one block
// (139 / 146 registers) ran a pass 1.4x slower than the 64-token one at two (123 registers:
// its second block's warps hide the weight loads; bench/NOTES.md, session 55).
template <int XT, int BN, int G, bool ASYM, int CODE, int FOLD, bool SK>
__global__ void __launch_bounds__(PF_THREADS, (SK && BN == 64 && FOLD) || BN == 32 || BN == 80 || BN == 96 ? 2 : 1)
prefill_wgmma(const __grid_constant__ qg_tensor_map tmap_x, const PrefillParams p) {
#if defined(QG_HAS_WGMMA)
    static_assert(FOLD == FOLD_NONE || FOLD == FOLD_FP32 || XT == ELEM_BF16,
                  "the fold multiplies bf16 A registers by their scales");
    static_assert(float32_weights(CODE) == (FOLD == FOLD_FP32),
                  "the GGUF codes' weights are computed in float32 (FOLD_FP32)");
    static_assert(BN < 256 || FOLD, "a 256-token tile leaves no registers for the group sums");
    typedef PrefillSmem<BN> Sm;
    constexpr int STAGES = XStages<BN, FOLD>::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + Sm::BAR_OFF);
    uint64_t* empty = full + STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    // grouped: the expert of this token tile (a tile past the rows in use, or of no expert,
    // returns before any barrier or copy); its weight planes start e * row_blocks in. A
    // grouped grid is one-dimensional, row tiles fastest: the blocks running together share a
    // token tile (its x stays in L2 while the expert's row tiles stream by), where token tiles
    // fastest re-read all of the gathered x from DRAM for every row tile once it outgrows L2
    // (GPT-OSS-20b T = 2048: 59 MB, 45 row tiles). A dense grid: token tiles x row tiles.
    const bool grouped = !SK && p.tile_experts != nullptr;
    const int row_tiles = (p.row_blocks + PF_ROWS / 16 - 1) / (PF_ROWS / 16);
    const int tt = grouped ? static_cast<int>(blockIdx.x / row_tiles) : static_cast<int>(blockIdx.x);
    const int rt = grouped ? static_cast<int>(blockIdx.x % row_tiles) : static_cast<int>(blockIdx.y) + p.row_tile0;
    const int expert = grouped ? p.tile_experts[tt] : 0;
    if (grouped && (tt * BN >= p.num_sorted[0] || expert < 0 || expert >= p.experts)) return;

    if (tid == 0) {
        tma_prefetch_descriptor(&tmap_x);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], PF_THREADS / 32);
        }
        mbar_fence_init();
    }
    __syncthreads();

    const XRing ring{smem_addr(smem), smem_addr(full), smem_addr(empty)};
    // dense tiles stage their output through the x ring where y is 16-bit x-typed and 16-byte aligned
    static_assert(BN * PF_STAGE_STRIDE <= Sm::BAR_OFF && BN * PF_STAGE_STRIDE_F32 <= Sm::BAR_OFF,
                  "the staged output tiles fit in the x ring");
    const bool y_staged =
        p.y_type == XT && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0 && (p.ldy & 7) == 0;
    WgAcc<BN> acc;
    int ks = 0;  // steps run so far (run_segment)
    if constexpr (!SK) {
        const int tok0 = tt * BN;
        // grouped stage 1 with the activation fused: the tile is 64 channels' gate and up rows
        // (PrefillParams::act; the row tiles are as many: ceil(2 RBp / 8) = ceil(RBp / 4))
        const bool glu_tile = CODE == CODE_E2M1 && grouped && p.act != nullptr;
        const int part_blocks = p.part_rows / 16;
        const int rb = glu_tile ? rt * (PF_ROWS / 32) + (warp & 3) : rt * (PF_ROWS / 16) + warp;
        const int rb_plane = glu_tile ? (warp >> 2) * part_blocks + rb : rb;
        run_segment<XT, BN, G, ASYM, CODE, FOLD>(acc, tmap_x, p, ring, tok0, rb_plane + expert * p.row_blocks,
                                                 rb < (glu_tile ? part_blocks : p.row_blocks), 0, p.k_chunks, ks);
        if (!grouped) {
            store_dense<XT, BN>(acc, p, smem, y_staged, tok0, rb, false);
            return;
        }
        // grouped: scattered rows, the expert's bias, no padded column
        const int64_t b0 = expert * p.bias_stride;
        if (glu_tile) {
            store_glu_staged<XT, BN>(acc, p, smem, tok0, rt, b0);
            return;
        }
        if (p.y_type == ELEM_F32 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0 && (p.ldy & 3) == 0) {
            store_grouped_staged<BN>(acc, p, smem, tok0, rb, b0);
            return;
        }
        const int n0 = rb * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = p.out_rows[tok0 + 8 * j + 2 * t + (i & 1)];
                const int n = n0 + 8 * (i >> 1);
                if (row < 0 || row >= p.out_limit || n >= p.n || n % p.part_rows >= p.part_valid) continue;
                store_out(p.y, static_cast<int64_t>(row) * p.ldy + n, acc.d[4 * j + i] + bias_at(p.bias, b0 + n),
                          p.y_type);
            }
    } else {
        const int KC = p.k_chunks, P = gridDim.x, b = blockIdx.x;
        const int64_t W = static_cast<int64_t>(p.tiles) * KC;
        const int64_t u0 = b * W / P;
        for (int64_t e = (b + 1) * W / P; e > u0;) {  // segment [s, e): the range's last tile part first
            const int sk = static_cast<int>((e - 1) / KC);
            const int64_t t0 = static_cast<int64_t>(sk) * KC, s = u0 > t0 ? u0 : t0;
            const int kc0 = static_cast<int>(s - t0), chunks = static_cast<int>(e - s);
            const int tok0 = (sk % p.token_tiles) * BN, rb = (p.row_tile0 + sk / p.token_tiles) * (PF_ROWS / 16) + warp;
            run_segment<XT, BN, G, ASYM, CODE, FOLD>(acc, tmap_x, p, ring, tok0, rb, rb < p.row_blocks,
                                                     kc0, chunks, ks);
            if (kc0 + chunks < KC) {
                contribute<BN>(acc, p, sk);
            } else {
                // blocks from the one holding the tile's first unit up to this one contribute
                if (kc0 > 0) gather_partials<BN>(acc, p, sk, b - static_cast<int>(((t0 + 1) * P - 1) / W));
                store_dense<XT, BN>(acc, p, smem, y_staged, tok0, rb, s > u0);
            }
            e = s;
        }
    }
#else
    // Built without sm_90a: the host gate (sm_90a in the build, compute capability 9.0)
    // never picks this tier then.
    (void)tmap_x;
    (void)p;
    qg_device_trap();
#endif
}

// The kernel of (x type, scale type, tile, G, ASYM, code) among the instantiation lists of
// w4a16_kernels.h with stream-K flag SK, or nullptr. A translation unit that calls it for one
// SK instantiates that half of the kernels only (hip/w4a16_prefill.hip).
template <bool SK>
const void* prefill_lookup(int x_type, int scale_type, int bn, int group_size, bool asym, int code) {
    const int fold = prefill_fold(x_type, scale_type);
#define QG_CASE(XT, BN, G, ASYM, FOLD)                                                                      \
    if (code == CODE_INT4 && x_type == XT && bn == BN && group_size == G && asym == ASYM && fold == (FOLD)) \
        return reinterpret_cast<const void*>(&prefill_wgmma<XT, BN, G, ASYM, CODE_INT4, FOLD, SK>);
    QG_W4A16_PREFILL_KERNELS(QG_CASE)
#undef QG_CASE
#define QG_CASE(XT, BN)                                                                                     \
    if (code == CODE_E2M1 && x_type == XT && bn == BN && group_size == 32 && !asym &&                       \
        fold == prefill_fold(XT, ELEM_BF16))                                                               \
        return reinterpret_cast<const void*>(&prefill_wgmma<XT, BN, 32, false, CODE_E2M1, prefill_fold(XT, ELEM_BF16), SK>);
    QG_MXFP4_PREFILL_KERNELS(QG_CASE)
#undef QG_CASE
// the GGUF codes (FOLD_FP32), each through its list (QG_CODE: the code at hand)
#define QG_CASE(XT, BN)                                                                                     \
    if (code == QG_CODE && x_type == XT && bn == BN && group_size == 32 && !asym)                           \
        return reinterpret_cast<const void*>(&prefill_wgmma<XT, BN, 32, false, QG_CODE, FOLD_FP32, SK>);
#define QG_CODE CODE_Q4_K
    QG_Q4_K_PREFILL_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_IQ4_XS
    QG_IQ4_XS_PREFILL_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_Q8_0
    QG_Q8_0_PREFILL_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_Q6_K
    QG_Q6_K_PREFILL_KERNELS(QG_CASE)
#undef QG_CODE
#define QG_CODE CODE_IQ3_XXS
    QG_IQ3_XXS_PREFILL_KERNELS(QG_CASE)
#undef QG_CODE
#undef QG_CASE
    return nullptr;
}

}  // namespace

// The stream-K half of the lookup (hip/w4a16_prefill_sk.hip), for prefill_kernel.
const void* prefill_kernel_stream_k(int x_type, int scale_type, int bn, int group_size, bool asym, int code);

#endif  // QG_HAVE_TENSOR_MAPS

}  // namespace w4a16
}  // namespace qg
