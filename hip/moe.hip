// MXFP4 mixture of experts on the GPU (NVIDIA sm_80+): align, the expert GEMM of both
// stages, and stage 2's top-k sum. Semantics in include/quantgemm.h; pair p = t * top_k + j
// is token t's j-th expert, P = T * top_k marks a padding slot.
//
// The routing tables are device data the host never reads, so the kernels treat what they
// cannot use as padding instead of trusting it: an expert id outside [0, E) routes its pair
// nowhere (align), a sorted id outside [0, P) is a padding slot, a tile of an expert outside
// [0, E) is skipped, and num_sorted is clamped to the tables' size.
//
// moe_gemm, one thread block per (128 weight rows, expert tile of tile_m tokens): the tile's
// tokens are gathered into a shared x chunk [tile_m, 128] by cp.async (a ring of
// GEMM_X_STAGES, zero rows for padding slots), each lane's frag pieces of its warp's two row
// blocks come global -> registers two chunks ahead (decode_frag's pipeline), and mma.sync
// m16n8k16 runs only over the 8-token column tiles that hold a real pair (T = 1: one of them).
// bf16 x takes the E8M0 scale into the A registers (E2M1 value x 2^(e - 127) is exact in bf16:
// the prefill's FOLD, hip/prefill_wgmma.h), fp16 x sums each group of 32 in fp32 and scales
// it there (decode_frag's arithmetic).
#include <stdint.h>

#include "compat.h"
#include "glu.h"
#include "mma.h"
#include "moe_kernels.h"
#include "quantgemm.h"

namespace qg {
namespace moe {

#if defined(QG_HAS_MMA_SYNC)
namespace {

constexpr unsigned kFull = 0xffffffffu;

// Lanes of this warp holding the same key (every lane calls it).
__device__ __forceinline__ unsigned same_key_lanes(int key) { return __match_any_sync(kFull, key); }

// Expert of pair i of this warp's step, or -1 (past the segment, or an id outside [0, E)).
__device__ __forceinline__ int pair_expert(const AlignParams& p, int i, int hi) {
    if (i >= hi) return -1;
    const int e = p.topk_ids[i];
    return e >= 0 && e < p.experts ? e : -1;
}

}  // namespace
#endif

// One block of align_threads(P, E) threads, W warps (at most ALIGN_THREADS: fewer where the
// pairs and experts are few, T = 1 on GPT-OSS taking 128 threads, whose barriers and per-warp
// counts cost a fraction of 1024's). Warp w owns the pairs [w S, (w + 1) S): pass 1 counts each
// expert's pairs per warp, the counts become each warp's base inside its expert (a prefix over
// warps) and the experts' padded starts a prefix over experts; pass 2 places the pairs, which
// keeps them in pair order inside each expert (what the CPU tier gives), then the tiles.
__global__ void __launch_bounds__(ALIGN_THREADS) moe_align(const AlignParams p) {
#if defined(QG_HAS_MMA_SYNC)
    qg_wait_prior_grid();  // launched after the previous kernel (moe_launch.cpp)
    extern __shared__ int align_smem[];
    const int E = p.experts, P = p.pairs;
    const int threads = blockDim.x, warps = threads >> 5;  // threads >= E, a multiple of 32
    int* cnt = align_smem;               // [warps][E]
    int* total = cnt + ALIGN_WARPS * E;  // [E] pairs per expert
    int* start = total + E;              // [E + 1] padded starts
    int* wsum = start + E + 1;           // [ALIGN_WARPS] scan of the warps' sums
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int seg = (P + warps - 1) / warps;
    const int lo = min(P, warp * seg), hi = min(P, lo + seg);

    for (int i = tid; i < warps * E; i += threads) cnt[i] = 0;
    for (int i = tid; i < p.max_sorted; i += threads) p.sorted_ids[i] = P;
    __syncthreads();
    for (int base = lo; base < hi; base += 32) {
        const int e = pair_expert(p, base + lane, hi);
        const unsigned same = same_key_lanes(e);
        if (e >= 0 && lane == __ffs(same) - 1) cnt[warp * E + e] += __popc(same);
        __syncwarp();  // the next step's leader of e may be another lane (racecheck: a hazard without it)
    }
    __syncthreads();
    for (int e = tid; e < E; e += threads) {
        int s = 0;
        for (int w = 0; w < warps; ++w) {
            const int c = cnt[w * E + e];
            cnt[w * E + e] = s;
            s += c;
        }
        total[e] = s;
    }
    __syncthreads();
    // exclusive scan of the padded counts (E <= threads: one expert per thread)
    const int v = tid < E ? (total[tid] + p.tile_m - 1) / p.tile_m * p.tile_m : 0;
    int incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += n;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int s = lane < warps ? wsum[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(kFull, s, o);
            if (lane >= o) s += n;
        }
        wsum[lane] = s;
    }
    __syncthreads();
    if (tid < E) start[tid] = incl - v + (warp > 0 ? wsum[warp - 1] : 0);
    if (tid == 0) start[E] = wsum[warps - 1];
    __syncthreads();
    for (int base = lo; base < hi; base += 32) {
        const int i = base + lane;
        const int e = pair_expert(p, i, hi);
        const unsigned same = same_key_lanes(e);
        if (e >= 0) p.sorted_ids[start[e] + cnt[warp * E + e] + __popc(same & ((1u << lane) - 1u))] = i;
        __syncwarp();
        if (e >= 0 && lane == __ffs(same) - 1) cnt[warp * E + e] += __popc(same);
        __syncwarp();
    }
    const int used = start[E];
    for (int t = tid; t < p.max_tiles; t += threads) {
        int e = -1;
        const int s = t * p.tile_m;
        if (s < used) {  // the last expert whose start is <= s (empty experts share a start)
            int a = 0, b = E;  // start[a] <= s < start[b]
            while (b - a > 1) {
                const int mid = (a + b) / 2;
                if (start[mid] <= s) a = mid; else b = mid;
            }
            e = a;
        }
        p.tile_experts[t] = e;
    }
    if (tid == 0) p.num_sorted[0] = used;
#else
    qg_device_trap();
#endif
}

#if defined(QG_HAS_MMA_SYNC)
namespace {

// One 128-k chunk of a lane's two row blocks: frag pieces (two 64-k tiles) and scale words.
struct ChunkRegs {
    uint4 w[2][2];
    uint4 s[2];  // the chunk's 4 groups: s[g] | s[g + 8] << 16 as bf16 bits
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace
#endif

// SL > 1: at most 128 registers, so that two blocks of 2 slices (or one of 4) stay resident an SM
template <int XT, int MT, int STAGE, int SL>
__global__ void __launch_bounds__(GEMM_THREADS * SL, SL == 1 ? 0 : SL == 2 ? 2 : 1) moe_gemm(const GemmParams p) {
#if defined(QG_HAS_MMA_SYNC)
    constexpr bool FOLD = XT == ELEM_BF16;
    constexpr int TM = MT * 8;
    constexpr int X_BYTES = TM * GEMM_XS_STRIDE * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int slot_pair[TM];
    __shared__ int used_slots;

    const int tid = threadIdx.x, lane = tid & 31;
    const int slice = SL == 1 ? 0 : tid / GEMM_THREADS;    // K slice of the block (moe_kernels.h)
    const int stid = SL == 1 ? tid : tid % GEMM_THREADS;   // thread in its slice
    const int warp = stid >> 5;                // the warp's row blocks
    const int g = lane >> 2, t = lane & 3;
    // split-K (gridDim.z splits of SL slices each): this slice's chunks [kc0, kc0 + KC) of the KC_ALL
    const int KC_ALL = p.k_chunks;
    const int64_t KT = 2 * static_cast<int64_t>(KC_ALL);
    const int part = static_cast<int>(blockIdx.z) * SL + slice, parts = static_cast<int>(gridDim.z) * SL;
    const int kc0 = part * KC_ALL / parts;
    const int KC = (part + 1) * KC_ALL / parts - kc0;
    // the slices walk their chunks in step, through block barriers, as many steps as the
    // block's longest slice has chunks (a shorter slice keeps the barriers only)
    int KC_STEPS = KC;
    if constexpr (SL > 1) {
#pragma unroll
        for (int s2 = 0; s2 < SL; ++s2) {
            const int q = static_cast<int>(blockIdx.z) * SL + s2;
            KC_STEPS = max(KC_STEPS, (q + 1) * KC_ALL / parts - q * KC_ALL / parts);
        }
    }
    const int k_left = p.k - kc0 * 128;
    const int RBp = p.part_blocks;
    // this warp's row blocks inside one expert's part(s): stage 1 block j of gate and of up
    // (parts 0 and 1), stage 2 blocks j, j + 1 of the one part
    const int j = STAGE == STAGE_GATE_UP ? blockIdx.x * GEMM_WARPS + warp : (blockIdx.x * GEMM_WARPS + warp) * 2;
    bool in[2];
    in[0] = j < RBp;
    in[1] = STAGE == STAGE_GATE_UP ? in[0] : j + 1 < RBp;
    qg_wait_prior_grid();  // launched after the previous kernel (moe_launch.cpp): nothing read before
    const int n_sorted = min(max(p.num_sorted[0], 0), p.max_tiles * p.tile_m);
    const int tiles = n_sorted / p.tile_m;

    for (int tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int e = p.tile_experts[tile];
        if (e < 0 || e >= p.experts) continue;  // the same for the whole block
        __syncthreads();                        // the previous tile is done with slot_pair
        if (tid == 0) used_slots = 0;
        __syncthreads();
        if (tid < TM) {
            const int q = p.sorted_ids[static_cast<int64_t>(tile) * TM + tid];
            const bool real = q >= 0 && q < p.pairs;
            slot_pair[tid] = real ? q : -1;
            if (real) atomicMax(&used_slots, tid + 1);
        }
        __syncthreads();
        const int used = used_slots;  // slots [0, used) hold every real pair (a prefix from align)
        if (used == 0) continue;

        // x rows: thread copies pieces stid + 128 i (row / 16, 16-byte piece % 16), i < MT, into
        // its slice's ring
        const uint16_t* xsrc[MT];
        bool xreal[MT];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const int q = slot_pair[(stid + GEMM_THREADS * i) >> 4];
            xreal[i] = q >= 0;
            xsrc[i] = p.x + (xreal[i] ? static_cast<int64_t>(q / p.x_row_div) * p.ldx : 0) + ((stid & 15) * 8) + kc0 * 128;
        }
        unsigned char* ring = smem + slice * GEMM_X_STAGES * X_BYTES;
        auto load_x = [&](int kc, int slot) {
            uint16_t* dst = reinterpret_cast<uint16_t*>(ring + slot * X_BYTES);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int q = stid + GEMM_THREADS * i;
                const bool in_k = kc * 128 + (q & 15) * 8 < k_left;  // K % 32 == 0: pieces are whole
                cp_async16(dst + (q >> 4) * GEMM_XS_STRIDE + (q & 15) * 8, xsrc[i] + kc * 128, xreal[i] && in_k);
            }
        };

        const int64_t part0 = static_cast<int64_t>(e) * (STAGE == STAGE_GATE_UP ? 2 : 1) * RBp;
        const uint4* wbase[2];
        const uint4* sbase[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t rb = part0 + (STAGE == STAGE_GATE_UP ? r * RBp + j : j + r);
            wbase[r] = reinterpret_cast<const uint4*>(p.qweight) + (rb * KT + 2 * kc0) * 32 + lane;
            sbase[r] = reinterpret_cast<const uint4*>(p.scales + ((rb * KC_ALL + kc0) * 8 + g) * 4);
        }
        auto load_chunk = [&](ChunkRegs& c, int kc) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (in[r] && kc < KC) {
                    c.w[r][0] = __ldg(wbase[r] + 2 * static_cast<int64_t>(kc) * 32);
                    c.w[r][1] = __ldg(wbase[r] + (2 * static_cast<int64_t>(kc) + 1) * 32);
                    c.s[r] = __ldg(sbase[r] + static_cast<int64_t>(kc) * 8);
                } else {
                    c.w[r][0] = c.w[r][1] = c.s[r] = make_uint4(0, 0, 0, 0);
                }
            }
        };

        float acc[2][MT][4], grp[2][MT][4];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[r][mt][i] = grp[r][mt][i] = 0.f;

#pragma unroll
        for (int s = 0; s < GEMM_X_STAGES - 1; ++s) {
            if (s < KC) load_x(s, s);
            cp_async_commit();
        }
        ChunkRegs ra, rb;  // two named register sets (an indexed array cost fp16 x 50 registers)
        load_chunk(ra, 0);
        load_chunk(rb, 1);

        auto run_chunk = [&](int kc, ChunkRegs& d) {
            cp_async_wait<GEMM_X_STAGES - 2>();
            __syncthreads();  // chunk kc's x has landed everywhere; slot (kc - 1) is free
            if (kc + GEMM_X_STAGES - 1 < KC) load_x(kc + GEMM_X_STAGES - 1, (kc + GEMM_X_STAGES - 1) % GEMM_X_STAGES);
            cp_async_commit();
            if constexpr (SL > 1)
                if (kc >= KC) return;  // this slice's chunks are done
            const uint16_t* xs = reinterpret_cast<const uint16_t*>(ring + (kc % GEMM_X_STAGES) * X_BYTES);
            uint32_t bfrag[MT][4];
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                if (ks % 2 == 0) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        if (mt > 0 && mt * 8 >= used) break;
                        ldmatrix_x4(bfrag[mt], xs + (mt * 8 + (lane & 7)) * GEMM_XS_STRIDE + ks * 16 + (lane >> 3) * 8);
                    }
                }
                const int bh = (ks % 2) * 2;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    uint32_t a[4];
                    e2m1_word<XT>(word_of(d.w[r][ks / 4], ks % 4), a);
                    if constexpr (FOLD) {
                        const uint32_t sw = word_of(d.s[r], ks / 2);  // group ks / 2 of the chunk
                        const uint32_t s_g = __byte_perm(sw, 0, 0x1010), s_g8 = __byte_perm(sw, 0, 0x3232);
                        a[0] = mul_bf16x2(a[0], s_g);
                        a[1] = mul_bf16x2(a[1], s_g8);
                        a[2] = mul_bf16x2(a[2], s_g);
                        a[3] = mul_bf16x2(a[3], s_g8);
                    }
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        if (mt > 0 && mt * 8 >= used) break;
                        mma16816<XT>(FOLD ? acc[r][mt] : grp[r][mt], a[0], a[1], a[2], a[3], bfrag[mt][bh],
                                     bfrag[mt][bh + 1]);
                    }
                }
                if (!FOLD && ks % 2 == 1) {  // the group of 32 closes: acc += s * its sum
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const uint32_t sw = word_of(d.s[r], ks / 2);
                        const float s_lo = __uint_as_float(sw << 16), s_hi = __uint_as_float(sw & 0xffff0000u);
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
            load_chunk(d, kc + 2);  // the registers of chunk kc are spent
        };
        for (int kc = 0; kc < KC_STEPS; kc += 2) {
            run_chunk(kc, ra);
            if (kc + 1 < KC_STEPS) run_chunk(kc + 1, rb);
        }
        cp_async_wait<0>();
        if constexpr (SL > 1) {  // the slices' sums into slice 0's registers, in slice order
            float* sums = reinterpret_cast<float*>(smem);  // [slice - 1][r][mt][i][stid]
            __syncthreads();  // every slice is done with its ring
            if (slice > 0) {
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            sums[(((slice - 1) * 2 + r) * MT * 4 + mt * 4 + i) * GEMM_THREADS + stid] = acc[r][mt][i];
            }
            __syncthreads();
            if (slice > 0) continue;  // the next tile opens with a block barrier, as every slice does
#pragma unroll
            for (int s2 = 1; s2 < SL; ++s2)
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            acc[r][mt][i] += sums[(((s2 - 1) * 2 + r) * MT * 4 + mt * 4 + i) * GEMM_THREADS + stid];
        }

        // ---- epilogue. acc[r][mt][i]: row g + 8 (i >> 1) of row block r, token slot mt 8 + 2t + (i & 1)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int q = slot_pair[mt * 8 + 2 * t + (i & 1)];
                if (q < 0) continue;
                const int row = g + 8 * (i >> 1);
                if constexpr (STAGE == STAGE_GATE_UP) {
                    const int c = j * 16 + row;  // channel
                    if (!in[0] || c >= p.rows) continue;
                    if (gridDim.z > 1) {  // split-K: this split's gate and up sums; moe_act finishes
                        float* hq = p.part + blockIdx.z * p.plane + static_cast<int64_t>(q) * p.ld_part + c;
                        hq[0] = acc[0][mt][i];
                        hq[p.part_rows] = acc[1][mt][i];
                        continue;
                    }
                    const int64_t b0 = static_cast<int64_t>(e) * 2 * p.rows;
                    const float gate = acc[0][mt][i] + bias_at(p.bias, b0 + gate_index(p.concat, c));
                    const float up = acc[1][mt][i] + bias_at(p.bias, b0 + up_index(p.concat, p.rows, c));
                    store_out(p.act, static_cast<int64_t>(q) * p.rows + c, glu(p.activation, gate, up, p.alpha, p.limit),
                              p.act_type);
                } else {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int n = (j + r) * 16 + row;
                        if (!in[r] || n >= p.rows) continue;
                        // split z > 0 of a split K adds no bias (moe_combine adds the planes in order)
                        const float b = blockIdx.z == 0 ? bias_at(p.bias, static_cast<int64_t>(e) * p.rows + n) : 0.0f;
                        p.out[blockIdx.z * p.plane + static_cast<int64_t>(q) * p.rows + n] = acc[r][mt][i] + b;
                    }
                }
            }
    }
#else
    qg_device_trap();
#endif
}

// Row r of dst = the source row of sorted slot r, for the slots in use that hold a pair; a
// thread per 16-byte piece.
__global__ void __launch_bounds__(GATHER_THREADS) moe_gather(const GatherParams p) {
    const int pieces = p.k / 8;
    const int rows = min(max(p.num_sorted[0], 0), p.max_rows);
    const int64_t i = static_cast<int64_t>(blockIdx.x) * GATHER_THREADS + threadIdx.x;
    if (i >= static_cast<int64_t>(rows) * pieces) return;
    const int r = static_cast<int>(i / pieces), c = static_cast<int>(i % pieces);
    const int q = p.sorted_ids[r];
    if (q < 0 || q >= p.pairs) return;
    const uint4* src = reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(q / p.row_div) * p.ld) + c;
    reinterpret_cast<uint4*>(p.dst + static_cast<int64_t>(r) * p.k)[c] = *src;
}

// act[p, c] = activation(h[p, c] + gate bias, h[p, Ip + c] + up bias) for each slot in use
// that holds a pair (its expert from the slot's tile), the two h values cleared. A block per
// slot; each thread reads ACT_UNROLL columns' gate and up values (of every split plane) before
// it clears or stores any, so that a thread keeps that many loads in flight (a thread per
// element, each waiting for its routing entry, then its loads, ran at ~0.25 TB/s).
__global__ void __launch_bounds__(ACT_THREADS) moe_act(const ActParams p) {
    qg_wait_prior_grid();
    const int rows = min(max(p.num_sorted[0], 0), p.max_rows);
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int q = p.sorted_ids[r];
    const int e = p.tile_experts[r / p.tile_m];
    if (q < 0 || q >= p.pairs || e < 0 || e >= p.experts) return;
    float* __restrict__ row = p.h + static_cast<int64_t>(q) * p.ld_h;
    const int64_t b0 = static_cast<int64_t>(e) * 2 * p.inter;
    for (int c0 = threadIdx.x; c0 < p.inter; c0 += ACT_UNROLL * ACT_THREADS) {
        float gate[ACT_UNROLL], up[ACT_UNROLL];
#pragma unroll
        for (int j = 0; j < ACT_UNROLL; ++j) {
            const int c = c0 + j * ACT_THREADS;
            gate[j] = up[j] = 0.0f;
            if (c >= p.inter) continue;
            for (int z = 0; z < p.splits; ++z) {  // the splits' sums in order (one plane: the sum itself)
                const float* hg = row + z * p.plane + c;
                gate[j] = z == 0 ? hg[0] : gate[j] + hg[0];
                up[j] = z == 0 ? hg[p.part_rows] : up[j] + hg[p.part_rows];
            }
        }
#pragma unroll
        for (int j = 0; j < ACT_UNROLL; ++j) {
            const int c = c0 + j * ACT_THREADS;
            if (c >= p.inter) continue;
            for (int z = 0; z < p.splits; ++z) {
                row[z * p.plane + c] = 0.0f;
                row[z * p.plane + c + p.part_rows] = 0.0f;
            }
            const float g = gate[j] + bias_at(p.bias, b0 + gate_index(p.concat, c));
            const float u = up[j] + bias_at(p.bias, b0 + up_index(p.concat, p.inter, c));
            store_out(p.act, static_cast<int64_t>(q) * p.inter + c, glu(p.activation, g, u, p.alpha, p.limit),
                      p.act_type);
        }
    }
}

// y[t, h] = sum over j ascending of topk_weights[t, j] * out[t * top_k + j, h] in fp32 (out: the
// sum of the split planes in order), rounded once to y's type; out is zeroed as it is read (the
// workspace contract). Block (token, column range): each thread reads its column of every slot
// and plane before it clears any (restrict: the loads are not held behind the stores).
__global__ void __launch_bounds__(COMBINE_THREADS) moe_combine(const CombineParams p) {
    qg_wait_prior_grid();
    const int64_t tok = blockIdx.x;
    if (tok >= p.tokens) return;
    const float* __restrict__ weights = p.topk_weights + tok * p.top_k;
    for (int h = blockIdx.y * COMBINE_THREADS + threadIdx.x; h < p.hidden; h += gridDim.y * COMBINE_THREADS) {
        float* __restrict__ out = p.out + tok * p.top_k * p.hidden + h;
        float s = 0.0f;
        for (int jj = 0; jj < p.top_k; ++jj) {
            float v = 0.0f;
            for (int z = 0; z < p.splits; ++z) {  // the splits' sums in order
                const float o = out[z * p.plane + static_cast<int64_t>(jj) * p.hidden];
                v = z == 0 ? o : v + o;
            }
            s += weights[jj] * v;
        }
        for (int jj = 0; jj < p.top_k; ++jj)
            for (int z = 0; z < p.splits; ++z) out[z * p.plane + static_cast<int64_t>(jj) * p.hidden] = 0.0f;
        store_out(p.y, tok * p.ldy + h, s, p.y_type);
    }
}

const void* gemm_kernel(int x_type, int mt, int stage, int slices) {
#define QG_CASE(XT, MT, ST, SL)                                         \
    if (x_type == XT && mt == MT && stage == ST && slices == SL) \
        return reinterpret_cast<const void*>(&moe_gemm<XT, MT, ST, SL>);
    QG_MOE_GEMM_KERNELS(QG_CASE)
#undef QG_CASE
    return nullptr;
}

}  // namespace moe
}  // namespace qg
