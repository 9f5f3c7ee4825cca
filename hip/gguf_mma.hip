// GGUF block-format GEMM, decode tier on the integer tensor cores (NVIDIA sm_80+: mma.sync
// m16n8k32 / m16n8k16 with 8-bit operands), HIP dialect.
//
//   y[m, n] = sum_k x[m, k] * dequant(W)[n, k]     m < 8 per launch, n < N, k < K
//
// Two kernels per launch of up to 8 rows of x:
//   1. prep: x is quantized once per 32-element slice and row m (ggml's q8_1 idea):
//        dx = amax / 127,  xq[k] = rint(x[k] * (1 / dx))  (round to nearest even, +-127)
//      and written to the workspace in the order the mma B fragments read it, with the
//      per-slice terms the epilogue needs (the "prepared x", Slice below).
//   2. the GEMM: each warp streams 16 rows of W (one mma M tile) with cp.async into a
//      double-buffered shared-memory ring, turns the codes of every 32-element slice into
//      an int8 A fragment in registers (one or two LOP3 per 4 codes for the nibble
//      formats, byte permutes for the codebooks), and runs one integer mma per slice
//      against all 8 x rows at once. Per slice and row n, with its integer codes c and
//      the format's code bias b (8 for q4_0, 32 for q6_K, else 0):
//        D   = sum_k c[k] xq[k] - b * sum_k xq[k]      (exact, int32, inside the mma)
//        acc += sw[n] * (dx * float(D))  [- mw[n] * sum_k x[k]   (q4_K's min term)]
//      where sw (and mw) are the slice's scale as the gguf package computes it in float32
//      (q4_K: d * sc, dmin * m; q6_K: d * sc per 16 elements, one k16 mma each).
//   A block of 4 warps takes 64 rows (16 per warp) and walks its K range a step at a
//   time; the step's x slices ride in the same shared-memory ring stage. K is split over
//   blockIdx.y for about four rounds of resident blocks; the last block of a row tile to
//   arrive adds the splits' partial sums in split order, writes y and zeroes what it read.
//
// Numerics (docs/gguf-layout.md section 6): the weights are exact; the only
// approximation is x ~ dx * xq, |x - dx * xq| <= dx / 2 per element. pyquant's
// formats/int8_act.py (gemm_model) models this exactly (same dx, same xq) and the tests compare
// to it with an fp32 accumulation bound. A non-finite x makes dx NaN for its slice, so
// every output that slice feeds is NaN (the float reference may give +-inf there).
//
// The workspace (caller memory, zero before a call and zero after it) holds the arrival
// counters at a fixed place, the prepared x and, with a K split, the partial sums. The
// last block of each K split to finish zeroes that split's prepared x.
#include <stdint.h>

#include "compat.h"
#include "gguf_device.h"
#include "gguf_kernels.h"

namespace qg {
namespace gguf_mma {

using gguf::half_bits_to_float;
using gguf::ld_words_a2;
using gguf::ld_u16;
using gguf::load_x;
using gguf::mul_rn;
using gguf::store_y;

// ------------------------------------------------------------------ the x prep
// Prepares the Slice<mp> of x (hip/gguf_kernels.h) for every 32-element slice of K.
// Grid: ceil(nslices / kWarps) blocks of kThreads; warp w of block i prepares slice
// i * kWarps + w, lane = element of the slice. xq = rint(x * (1/dx)) clamped to
// [-127, 127]: the clamp only acts when 1/dx overflows (a slice whose largest |x| is
// below ~127 * 2^-128, where dx is subnormal) and keeps the sign there.
__global__ void __launch_bounds__(kThreads) gguf_mma_prep_kernel(const PrepParams p)
{
    const int lane = threadIdx.x % 32, j = blockIdx.x * kWarps + threadIdx.x / 32;
    if (j >= p.nslices) return;
    uint8_t* s = p.xp + (int64_t)j * (48 * p.mp);
    // B-fragment position of element `lane`: t = (lane % 16) / 4, second register at 16+
    const int pos = ((lane & 15) >> 2) * 8 + (lane >> 4) * 4 + (lane & 3);
    for (int m = 0; m < p.mp; ++m) {
        const float v = m < p.m_valid ? load_x(p.x, m * p.ldx + (int64_t)j * 32 + lane, p.x_dtype) : 0.0f;
        int bad = isfinite(v) ? 0 : 1;   // any lane's non-finite x poisons the slice
        float amax = fabsf(v);
        float sum = v;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) {
            bad |= __shfl_xor(bad, o, 32);
            amax = fmaxf(amax, __shfl_xor(amax, o, 32));
            sum += __shfl_xor(sum, o, 32);
        }
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d > 0.0f ? __frcp_rn(d) : 0.0f;
        int q = __float2int_rn(__fmul_rn(v, id));
        q = bad ? 0 : q < -127 ? -127 : q > 127 ? 127 : q;
        s[m * 32 + pos] = (uint8_t)(int8_t)q;
        // sums of q over each half (lanes 0-15, 16-31): butterfly within 16 lanes
        int h = q;
#pragma unroll
        for (int o = 8; o > 0; o /= 2) h += __shfl_xor(h, o, 32);
        const int h1 = __shfl_sync_all(h, 16);
        if (lane == 0) {
            int32_t* cinit = reinterpret_cast<int32_t*>(s + 32 * p.mp);
            cinit[m] = p.unit16 ? -p.bias * h : -p.bias * (h + h1);
            cinit[p.mp + m] = p.unit16 ? -p.bias * h1 : 0;
            reinterpret_cast<float*>(s + 40 * p.mp)[m] = bad ? __int_as_float(0x7fc00000) : d;
            reinterpret_cast<float*>(s + 44 * p.mp)[m] = bad ? __int_as_float(0x7fc00000) : sum;
        }
    }
}

// ------------------------------------------------------------------ the mma
// The integer mma and cp.async exist on NVIDIA sm_80+ only (QG_HAS_MMA_SYNC); elsewhere
// the code compiles (the AMD compile check covers it) and traps: the launcher never
// picks this tier there.

// D = A (16x32, int8 codes, row-major) * B (32x8 int8 xq, column-major) + C, int32.
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k32", g = lane / 4, t = lane % 4):
//   a0 row g, k 4t..4t+3; a1 row g+8, same k; a2 row g, k 16+4t..; a3 row g+8, k 16+4t..
//   b0 k 4t..4t+3, col g; b1 k 16+4t..; d0, d1 row g, cols 2t, 2t+1; d2, d3 row g+8.
template <bool SIGNED_A>
__device__ __forceinline__ void mma_k32(const uint32_t (&a)[4], uint2 b, const int2 c, int (&d)[4])
{
#if defined(QG_HAS_MMA_SYNC)
    if (SIGNED_A)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%11,%12,%13};\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(c.x), "r"(c.y), "r"(c.x),
                       "r"(c.y));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%11,%12,%13};\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(c.x), "r"(c.y), "r"(c.x),
                       "r"(c.y));
#else
    (void)a, (void)b, (void)c;
    d[0] = d[1] = d[2] = d[3] = 0;
    qg_device_trap();
#endif
}

// The k16 shape (q6_K's 16-element scales): a0 row g, k 4t..4t+3; a1 row g+8; b0 k 4t..4t+3.
__device__ __forceinline__ void mma_k16_u8(uint32_t a0, uint32_t a1, uint32_t b, const int2 c, int (&d)[4])
{
#if defined(QG_HAS_MMA_SYNC)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(c.x), "r"(c.y), "r"(c.x), "r"(c.y));
#else
    (void)a0, (void)a1, (void)b, (void)c;
    d[0] = d[1] = d[2] = d[3] = 0;
    qg_device_trap();
#endif
}

// cp.async of 16 bytes and its group fences (gguf.hip); plain copies where it is missing.
__device__ __forceinline__ void copy16(uint8_t* dst, const uint8_t* src)
{
#if defined(QG_GGUF_ASYNC_COPY)
    gguf::cp_async<16>(dst, src);
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}
__device__ __forceinline__ void copy_commit()
{
#if defined(QG_GGUF_ASYNC_COPY)
    gguf::cp_async_commit();
#endif
}
__device__ __forceinline__ void copy_wait_all()
{
#if defined(QG_GGUF_ASYNC_COPY)
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// What a lane needs of slice j of the x staged in shared memory (xs: the step's slices).
// Lanes of rows g >= MP (and columns 2t >= MP) read nothing: zeros.
template <int MP>
struct XFrag {
    uint2 b;      // B fragment
    float2 dx;    // cols 2t, 2t+1
    const uint8_t* s;
    int t;
    __device__ __forceinline__ XFrag(const uint8_t* xs, int j, int g, int t_) : s(xs + j * Slice<MP>::kBytes), t(t_)
    {
        b = g < MP ? *reinterpret_cast<const uint2*>(s + Slice<MP>::kXq + g * 32 + t * 8) : make_uint2(0u, 0u);
        dx = 2 * t < MP ? *reinterpret_cast<const float2*>(s + Slice<MP>::kDx + t * 8) : make_float2(0.0f, 0.0f);
    }
    __device__ __forceinline__ int2 cinit(int half) const
    {
        return 2 * t < MP ? *reinterpret_cast<const int2*>(s + Slice<MP>::kCinit + half * 4 * MP + t * 8)
                          : make_int2(0, 0);
    }
    __device__ __forceinline__ float2 sx() const
    {
        return 2 * t < MP ? *reinterpret_cast<const float2*>(s + Slice<MP>::kSx + t * 8) : make_float2(0.0f, 0.0f);
    }
};

// acc (rows g, g+8 x cols 2t, 2t+1) += sw_row * (dx_col * D)
__device__ __forceinline__ void accumulate(float (&acc)[4], const int (&d)[4], float sw0, float sw1, float2 dx)
{
    acc[0] += sw0 * (dx.x * (float)d[0]);
    acc[1] += sw0 * (dx.y * (float)d[1]);
    acc[2] += sw1 * (dx.x * (float)d[2]);
    acc[3] += sw1 * (dx.y * (float)d[3]);
}

// One k32 slice: codes a (rows g, g+8), scales sw0 (row g), sw1 (row g+8).
template <bool SIGNED_A, int MP>
__device__ __forceinline__ void slice_k32(const uint8_t* xs, int j, int g, int t, const uint32_t (&a)[4], float sw0,
                                          float sw1, float (&acc)[4])
{
    const XFrag<MP> f(xs, j, g, t);
    int d[4];
    mma_k32<SIGNED_A>(a, f.b, f.cinit(0), d);
    accumulate(acc, d, sw0, sw1, f.dx);
}

// ------------------------------------------------------------------ formats
// Block<FMT>::run<MP>(rg, r8, off, j0, g, t, xs, acc, grid): lane (g, t)'s part of one
// block of rows g (buffer rg) and g+8 (r8), the block at byte `off` of the buffers, its
// first slice j0 among the step's x slices staged at xs.
//
// A format's facts (geometry BE, BB; WC blocks per step; kBias the code bias of the x
// prep; kUnit16 and kGridWords, what the x prep and the generic kernel do for it) are
// BlockFacts<FMT> in hip/gguf_kernels.h, where the launcher plans with them; Block<FMT>
// derives from them and adds the device code: run, and stage_grid, which fills the
// kGridWords codebook block-wide before the kernel's first barrier (BlockDefaults: a
// plain format's, nothing).

template <int FMT>
struct Block;

template <int FMT>
struct BlockDefaults : BlockFacts<FMT> {
    static __device__ __forceinline__ void stage_grid(uint32_t* /*grid*/) {}
};

__device__ __forceinline__ uint32_t word_at(const uint8_t* buf, int off)   // 2-aligned off
{
    uint32_t w[1];
    ld_words_a2<1>(buf, off, w);
    return w[0];
}
__device__ __forceinline__ float half_at(const uint8_t* buf, int off) { return half_bits_to_float(ld_u16(buf, off)); }

// Q8_0: fp16 d, int8 q[32]: codes are the bytes.
template <>
struct Block<QG_FORMAT_Q8_0> : BlockDefaults<QG_FORMAT_Q8_0> {
    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t*)
    {
        const uint32_t a[4] = {word_at(rg, off + 2 + 4 * t), word_at(r8, off + 2 + 4 * t),
                               word_at(rg, off + 18 + 4 * t), word_at(r8, off + 18 + 4 * t)};
        slice_k32<true, MP>(xs, j0, g, t, a, half_at(rg, off), half_at(r8, off), acc);
    }
};

// Q4_0: fp16 d, qs[16]: byte j low nibble = element j, high = element 16 + j. u8 codes,
// bias 8 (w = d * (q - 8)).
template <>
struct Block<QG_FORMAT_Q4_0> : BlockDefaults<QG_FORMAT_Q4_0> {
    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t*)
    {
        const uint32_t wg = word_at(rg, off + 2 + 4 * t), w8 = word_at(r8, off + 2 + 4 * t);
        const uint32_t a[4] = {wg & 0x0F0F0F0Fu, w8 & 0x0F0F0F0Fu, (wg >> 4) & 0x0F0F0F0Fu, (w8 >> 4) & 0x0F0F0F0Fu};
        slice_k32<false, MP>(xs, j0, g, t, a, half_at(rg, off), half_at(r8, off), acc);
    }
};

// Q4_K: fp16 d, dmin, 12 bytes of 6-bit (sc, m), qs[128]; sub-blocks 2c (low nibbles)
// and 2c+1 (high nibbles) of qs bytes 32c .. 32c+31. w = (d*sc) * q - (dmin*m).
// (Scale unpacking as in gguf.hip's Format<QG_FORMAT_Q4_K>.)
template <>
struct Block<QG_FORMAT_Q4_K> : BlockDefaults<QG_FORMAT_Q4_K> {
    struct Scales {
        float d, dmin;
        uint32_t sc_lo, sc_hi, m_lo, m_hi;
    };
    static __device__ __forceinline__ Scales scales(const uint8_t* r, int off)   // off 16-aligned
    {
        const uint4 h = *reinterpret_cast<const uint4*>(r + off);
        Scales s;
        s.d = half_bits_to_float(h.x & 0xFFFFu);
        s.dmin = half_bits_to_float(h.x >> 16);
        s.sc_lo = h.y & 0x3F3F3F3Fu;
        s.m_lo = h.z & 0x3F3F3F3Fu;
        s.sc_hi = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
        s.m_hi = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
        return s;
    }
    static __device__ __forceinline__ float byte_of(uint32_t w, int i) { return (float)((w >> (8 * i)) & 0xFFu); }

    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t*)
    {
        const Scales sg = scales(rg, off), s8 = scales(r8, off);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint32_t lg = *reinterpret_cast<const uint32_t*>(rg + off + 16 + 32 * c + 4 * t);
            const uint32_t hg = *reinterpret_cast<const uint32_t*>(rg + off + 32 + 32 * c + 4 * t);
            const uint32_t l8 = *reinterpret_cast<const uint32_t*>(r8 + off + 16 + 32 * c + 4 * t);
            const uint32_t h8 = *reinterpret_cast<const uint32_t*>(r8 + off + 32 + 32 * c + 4 * t);
#pragma unroll
            for (int hn = 0; hn < 2; ++hn) {
                const int sb = 2 * c + hn;   // sub-block
                const uint32_t a[4] = {(lg >> (4 * hn)) & 0x0F0F0F0Fu, (l8 >> (4 * hn)) & 0x0F0F0F0Fu,
                                       (hg >> (4 * hn)) & 0x0F0F0F0Fu, (h8 >> (4 * hn)) & 0x0F0F0F0Fu};
                const uint32_t scg = sb < 4 ? sg.sc_lo : sg.sc_hi, mg = sb < 4 ? sg.m_lo : sg.m_hi;
                const uint32_t sc8 = sb < 4 ? s8.sc_lo : s8.sc_hi, m8 = sb < 4 ? s8.m_lo : s8.m_hi;
                const XFrag<MP> f(xs, j0 + sb, g, t);
                int d[4];
                mma_k32<false>(a, f.b, make_int2(0, 0), d);
                accumulate(acc, d, mul_rn(sg.d, byte_of(scg, sb & 3)), mul_rn(s8.d, byte_of(sc8, sb & 3)), f.dx);
                const float mwg = mul_rn(sg.dmin, byte_of(mg, sb & 3)), mw8 = mul_rn(s8.dmin, byte_of(m8, sb & 3));
                const float2 sx = f.sx();
                acc[0] -= mwg * sx.x;
                acc[1] -= mwg * sx.y;
                acc[2] -= mw8 * sx.x;
                acc[3] -= mw8 * sx.y;
            }
        }
    }
};

// Q6_K: ql[128], qh[64], int8 scales[16], fp16 d. Element 128h + 32u + l (u = 0..3,
// l = 0..31): q = (ql[64h + 32(u&1) + l] >> 4(u>>1)) & 15 | ((qh[32h + l] >> 2u) & 3) << 4,
// w = (d * scales[8h + 2u + l/16]) * (q - 32). One k16 mma per 16 elements (own scale).
template <>
struct Block<QG_FORMAT_Q6_K> : BlockDefaults<QG_FORMAT_Q6_K> {
    static __device__ __forceinline__ uint32_t codes(uint32_t ql, uint32_t qh, int u)
    {
        return ((ql >> (4 * (u >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * u)) & 0x03030303u) << 4);
    }
    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t*)
    {
        const float dg = half_at(rg, off + 208), d8 = half_at(r8, off + 208);
        uint32_t scg[4], sc8[4];
        ld_words_a2<4>(rg, off + 192, scg);
        ld_words_a2<4>(r8, off + 192, sc8);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t qhg0 = word_at(rg, off + 128 + 32 * h + 4 * t), qhg1 = word_at(rg, off + 144 + 32 * h + 4 * t);
            const uint32_t qh80 = word_at(r8, off + 128 + 32 * h + 4 * t), qh81 = word_at(r8, off + 144 + 32 * h + 4 * t);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int qo = off + 64 * h + 32 * (u & 1) + 4 * t;
                const uint32_t qlg0 = word_at(rg, qo), qlg1 = word_at(rg, qo + 16);
                const uint32_t ql80 = word_at(r8, qo), ql81 = word_at(r8, qo + 16);
                const int si = 8 * h + 2 * u;   // scale of the first 16; si + 1 of the second
                const float swg0 = mul_rn(dg, (float)(int8_t)(scg[si >> 2] >> (8 * (si & 3))));
                const float swg1 = mul_rn(dg, (float)(int8_t)(scg[si >> 2] >> (8 * (si & 3) + 8)));
                const float sw80 = mul_rn(d8, (float)(int8_t)(sc8[si >> 2] >> (8 * (si & 3))));
                const float sw81 = mul_rn(d8, (float)(int8_t)(sc8[si >> 2] >> (8 * (si & 3) + 8)));
                const XFrag<MP> f(xs, j0 + 4 * h + u, g, t);
                int d[4];
                mma_k16_u8(codes(qlg0, qhg0, u), codes(ql80, qh80, u), f.b.x, f.cinit(0), d);
                accumulate(acc, d, swg0, sw80, f.dx);
                mma_k16_u8(codes(qlg1, qhg1, u), codes(ql81, qh81, u), f.b.y, f.cinit(1), d);
                accumulate(acc, d, swg1, sw81, f.dx);
            }
        }
    }
};

// IQ4_NL codebook as signed bytes, 4 per word, for byte permutes.
constexpr int8_t kKvalues[16] = QG_KVALUES_IQ4NL;
constexpr uint32_t kv_word(int i)
{
    return (uint32_t)(uint8_t)kKvalues[4 * i] | (uint32_t)(uint8_t)kKvalues[4 * i + 1] << 8 |
           (uint32_t)(uint8_t)kKvalues[4 * i + 2] << 16 | (uint32_t)(uint8_t)kKvalues[4 * i + 3] << 24;
}

// Codebook bytes of the 4 nibbles in the low 4 bits of each byte of `nib` (byte i ->
// result byte i): two permutes select within each half of the codebook, a third picks
// the half by the nibble's bit 3.
__device__ __forceinline__ uint32_t kvalues4(uint32_t nib)
{
    const uint32_t sel = __byte_perm(nib | (nib >> 4), 0u, 0x0020u);   // nibbles i at bits 4i
    const uint32_t lo = __byte_perm(kv_word(0), kv_word(1), sel & 0x7777u);
    const uint32_t hi = __byte_perm(kv_word(2), kv_word(3), sel & 0x7777u);
    return __byte_perm(lo, hi, ((sel & 0x8888u) >> 1) | 0x3210u);
}

// IQ4_XS: fp16 d, uint16 scales_h, 4 bytes scales_l, qs[128]; sub-block s: qs byte
// 16s + j low nibble -> element 32s + j, high -> 32s + 16 + j (j < 16);
// w = (d * (ls - 32)) * kvalues[q], ls = (scales_l >> 4s & 15) | (scales_h >> 2s & 3) << 4.
template <>
struct Block<QG_FORMAT_IQ4_XS> : BlockDefaults<QG_FORMAT_IQ4_XS> {
    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t*)
    {
        // off is 8-aligned (136 = 8 * 17, rows 16-aligned)
        const uint2 hg = *reinterpret_cast<const uint2*>(rg + off), h8 = *reinterpret_cast<const uint2*>(r8 + off);
        const float dg = half_bits_to_float(hg.x & 0xFFFFu), d8 = half_bits_to_float(h8.x & 0xFFFFu);
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const int lsg = (int)(((hg.y >> (4 * s)) & 15u) | (((hg.x >> (16 + 2 * s)) & 3u) << 4));
            const int ls8 = (int)(((h8.y >> (4 * s)) & 15u) | (((h8.x >> (16 + 2 * s)) & 3u) << 4));
            const uint32_t wg = *reinterpret_cast<const uint32_t*>(rg + off + 8 + 16 * s + 4 * t);
            const uint32_t w8 = *reinterpret_cast<const uint32_t*>(r8 + off + 8 + 16 * s + 4 * t);
            const uint32_t a[4] = {kvalues4(wg & 0x0F0F0F0Fu), kvalues4(w8 & 0x0F0F0F0Fu),
                                   kvalues4((wg >> 4) & 0x0F0F0F0Fu), kvalues4((w8 >> 4) & 0x0F0F0F0Fu)};
            slice_k32<true, MP>(xs, j0 + s, g, t, a, mul_rn(dg, (float)(lsg - 32)), mul_rn(d8, (float)(ls8 - 32)), acc);
        }
    }
};

// IQ3_XXS: fp16 d, qs[64] grid indices, 8 uint32 aux (sub-block s: 4 x 7 sign-index bits,
// scale in bits 28..31). Lane t's codes of sub-block s: elements 4t..4t+3 = grid[qs[8s+t]]
// with the signs of group t/2, nibble t%2; elements 16+4t.. = grid[qs[8s+4+t]], group
// 2 + t/2. Signs: the 7 stored bits plus even parity; a byte is negated as
// (mag ^ 0xFF) + 1, the byte masks spread from 4 bits by (bits * 0x00204081) & 0x01010101.
template <>
struct Block<QG_FORMAT_IQ3_XXS> : BlockDefaults<QG_FORMAT_IQ3_XXS> {
    // The grid as gguf stores it (magnitudes; signed_grid applies the signs).
    static __device__ __forceinline__ void stage_grid(uint32_t* grid)
    {
        for (int i = threadIdx.x; i < 256; i += kThreads) grid[i] = gguf::c_iq3xxs_grid[i];
    }
    static __device__ __forceinline__ uint32_t signed_grid(uint32_t mag, uint32_t aux, int group, int half)
    {
        const uint32_t si = (aux >> (7 * group)) & 0x7Fu;
        const uint32_t sg = (si | (uint32_t)(__popc(si) & 1) << 7) >> (4 * half);
        const uint32_t one = ((sg & 0xFu) * 0x00204081u) & 0x01010101u;
        return (mag ^ (one * 0xFFu)) + one;
    }
    template <int MP>
    static __device__ __forceinline__ void run(const uint8_t* rg, const uint8_t* r8, int off, int j0, int g, int t,
                                               const uint8_t* xs, float (&acc)[4], const uint32_t* grid)
    {
        const float dg = half_at(rg, off), d8 = half_at(r8, off);
        const int half = t & 1, grp = t >> 1;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const uint32_t auxg = word_at(rg, off + 66 + 4 * s), aux8 = word_at(r8, off + 66 + 4 * s);
            const int qo = off + 2 + 8 * s + t;
            const uint32_t a[4] = {signed_grid(grid[rg[qo]], auxg, grp, half), signed_grid(grid[r8[qo]], aux8, grp, half),
                                   signed_grid(grid[rg[qo + 4]], auxg, 2 + grp, half),
                                   signed_grid(grid[r8[qo + 4]], aux8, 2 + grp, half)};
            const float swg = mul_rn(mul_rn(dg, 0.5f + (float)(auxg >> 28)), 0.5f);
            const float sw8 = mul_rn(mul_rn(d8, 0.5f + (float)(aux8 >> 28)), 0.5f);
            slice_k32<true, MP>(xs, j0 + s, g, t, a, swg, sw8, acc);
        }
    }
};

// ------------------------------------------------------------------ the GEMM kernel
// (Shape<FMT>, the block's shared-memory layout, and MmaParams: hip/gguf_kernels.h)

// The warp's share of the copies: lane l copies row l / 2 of the warp's 16, 16-byte units
// l % 2, l % 2 + 2, ... of each step (two lanes per row: each load instruction reads 32
// contiguous bytes of 16 rows). The row's source pointer is fixed for the whole kernel.
struct RowCopy {
    const uint8_t* src;   // the lane's row of W (rows past N re-read row N - 1, never written)
    int dst;              // byte offset of that row's buffer in a stage's warp slice
    int unit0;            // first unit: lane % 2
};

// Copies blocks [b0, b0 + nblk) of the lane's row into buf + rc.dst: 16-byte cp.async
// from the aligned byte a0 <= b0 * BB, so the first block sits at byte (b0 * BB) % 16 of
// the row buffer. Units past the end of the row (rows need not be a multiple of 16 bytes,
// only the last step reaches it) go in 2-byte pieces.
template <int FMT>
__device__ __forceinline__ void issue_row(const MmaParams& p, uint8_t* buf, const RowCopy& rc, int b0, int nblk)
{
    typedef Shape<FMT> S;
    const int64_t c0 = (int64_t)b0 * S::B::BB, a0 = c0 & ~(int64_t)15;
    const int units = (int)((c0 - a0 + (int64_t)nblk * S::B::BB + 15) / 16);
    const int64_t row_left = (int64_t)p.nb * S::B::BB - a0;   // bytes of the row from a0 on
    const int full = row_left / 16 < units ? (int)(row_left / 16) : units;
    const uint8_t* src = rc.src + a0;
    uint8_t* dst = buf + rc.dst;
#pragma unroll
    for (int i = 0; i < (S::UPR + 1) / 2; ++i) {
        const int c = rc.unit0 + 2 * i;
        if (c < full) {
            copy16(dst + 16 * c, src + 16 * c);
        } else if (c < units) {
            for (int b = 0; b < (int)(row_left - 16 * c); b += 2)
                *reinterpret_cast<uint16_t*>(dst + 16 * c + b) = *reinterpret_cast<const uint16_t*>(src + 16 * c + b);
        }
    }
}

// One step into ring stage `stage`: every lane its row, the whole block the x slices.
template <int FMT, int MP>
__device__ __forceinline__ void issue_step(const MmaParams& p, uint8_t* stage, const RowCopy& rc, int b0, int nblk)
{
    typedef Shape<FMT> S;
    issue_row<FMT>(p, stage, rc, b0, nblk);
    const int units = nblk * (S::B::BE / 32) * Slice<MP>::kBytes / 16;
    const uint8_t* src = p.xp + (int64_t)b0 * (S::B::BE / 32) * Slice<MP>::kBytes;
    for (int u = threadIdx.x; u < units; u += kThreads) copy16(stage + S::W_STAGE + 16 * u, src + 16 * u);
}

// The GEMM. Grid (ceil(N / 64), split_k), kThreads threads: block (x, s) takes rows
// [64x, 64x + 64) and blocks [s * nb / split_k, (s+1) * nb / split_k) of K, a step (WC
// blocks) at a time through a two-stage ring:
//   issue(0); commit
//   for each step i: wait for this thread's copies; barrier (every copy of step i has
//                    landed, every warp is done with step i-1, whose stage step i+1
//                    reuses); issue(i+1); commit; decode step i
// Worked example, q4_0, N = 43008, K = 5376 (nb = 168 blocks of 18 bytes), M = 1: 672
// row tiles; split_k = 4 (2688 blocks); a block takes 42 blocks of K = steps of 8 (WC)
// blocks, the last of 2; a step is 144 bytes of each of 64 rows (9 cp.async units per
// row, two lanes per row: 5 and 4) plus 8 slices of x (96 bytes each at MP = 2), then 8
// m16n8k32 mma per warp.
template <int FMT, int MP>
__global__ void __launch_bounds__(kThreads) gguf_mma_kernel(const MmaParams p)
{
    typedef Shape<FMT> S;
    typedef Block<FMT> B;
    extern __shared__ uint4 s_dyn[];   // S::smem_bytes(MP)
    __shared__ uint32_t s_grid[B::kGridWords];
    __shared__ int s_last_split, s_last_tile;

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * S::ROWS, split = blockIdx.y;
    const int kb0 = (int)((int64_t)split * p.nb / p.split_k), kb1 = (int)((int64_t)(split + 1) * p.nb / p.split_k);
    B::stage_grid(s_grid);   // read after the first step's barrier

    uint8_t* const ring = reinterpret_cast<uint8_t*>(s_dyn);
    constexpr int kStage = S::stage_bytes(MP);
    RowCopy rc;
    {
        const int r = warp * kTileRows + lane / 2, n = row0 + r < p.n ? row0 + r : p.n - 1;
        rc.src = p.w + (int64_t)n * p.ldw;
        rc.dst = r * S::ROW;
        rc.unit0 = lane % 2;
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int nsteps = (kb1 - kb0 + B::WC - 1) / B::WC;
    if (nsteps > 0) issue_step<FMT, MP>(p, ring, rc, kb0, kb1 - kb0 < B::WC ? kb1 - kb0 : B::WC);
    copy_commit();
    for (int s = 0; s < nsteps; ++s) {
        const int b0 = kb0 + s * B::WC, nblk = kb1 - b0 < B::WC ? kb1 - b0 : B::WC;
        copy_wait_all();
        __syncthreads();
        if (s + 1 < nsteps) {
            const int b1 = b0 + B::WC;
            issue_step<FMT, MP>(p, ring + ((s + 1) & 1) * kStage, rc, b1, kb1 - b1 < B::WC ? kb1 - b1 : B::WC);
        }
        copy_commit();
        const uint8_t* buf = ring + (s & 1) * kStage + warp * kTileRows * S::ROW;
        const uint8_t* xs = ring + (s & 1) * kStage + S::W_STAGE;
        const int lead = (int)(((int64_t)b0 * B::BB) & 15);
#pragma unroll
        for (int bi = 0; bi < B::WC; ++bi) {
            if (bi < nblk)
                B::template run<MP>(buf + g * S::ROW, buf + (g + 8) * S::ROW, lead + bi * B::BB, bi * (B::BE / 32), g,
                                    t, xs, acc, s_grid);
        }
    }

    // y (or this split's partial sums): lane (g, t) holds rows g, g+8 x cols 2t, 2t+1
    const int ng = row0 + warp * kTileRows + g;
    const float bias_g[2] = {ng < p.n ? bias_at(p.bias, ng) : 0.0f, ng + 8 < p.n ? bias_at(p.bias, ng + 8) : 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int n = ng + (i >= 2 ? 8 : 0), m = 2 * t + (i & 1);
        if (n >= p.n || m >= p.m_valid) continue;
        if (p.split_k == 1) store_y(p.y, m * p.ldy + n, acc[i] + bias_g[i >> 1], p.y_dtype);
        else p.partial[((int64_t)split * MP + m) * p.n + n] = acc[i];
    }

    // The prepared x of this split is read by gridDim.x blocks; the last to finish zeroes it.
    // One thread arrives with a release RMW after the barrier (which orders every thread's
    // reads of it before the arrival), the last block acquires before it writes. Not a
    // __threadfence() in every thread of every block: that is MEMBAR.SC.GPU and an L1
    // invalidation (CCTL.IVALL) per block, added after the 2026-11-30 golden rows (q8_0,
    // q4_0, q4_K decode 3.3-5.7 % slower since; bench/NOTES.md "GGUF decode").
    __syncthreads();
    if (threadIdx.x == 0) s_last_split = qg_atomic_add_release_gpu(&p.split_count[split], 1u) == gridDim.x - 1;
    __syncthreads();
    if (s_last_split) {
        qg_fence_acquire_gpu();
        const int64_t j0 = (int64_t)kb0 * (B::BE / 32), j1 = (int64_t)kb1 * (B::BE / 32);
        uint4* z = reinterpret_cast<uint4*>(p.xp + j0 * Slice<MP>::kBytes);
        const int64_t words = (j1 - j0) * (Slice<MP>::kBytes / 16);
        for (int64_t i = threadIdx.x; i < words; i += kThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
        if (threadIdx.x == 0) p.split_count[split] = 0;
    }
    if (p.split_k == 1) return;

    // K split: the last block of this row tile to arrive adds the partial sums in split
    // order, writes y, zeroes the partial sums it read and re-arms the counter.
    if (!last_split_to_arrive(&p.tile_count[blockIdx.x], p.split_k, s_last_tile)) return;
    for (int i = threadIdx.x; i < p.m_valid * S::ROWS; i += kThreads) {
        const int m = i / S::ROWS, n = row0 + i % S::ROWS;
        if (n >= p.n) continue;
        const float sum = sum_and_clear_splits(p.partial + (int64_t)m * p.n + n, (int64_t)MP * p.n, p.split_k);
        store_y(p.y, m * p.ldy + n, sum + bias_at(p.bias, n), p.y_dtype);
    }
    if (threadIdx.x == 0) p.tile_count[blockIdx.x] = 0;
}

// The instantiations: every format of QG_GGUF_FORMATS x QG_GGUF_MMA_MPS.
const void* mma_kernel(int format, int mp)
{
#define QG_CASE(FMT, MP) \
    if (format == FMT && mp == MP) return reinterpret_cast<const void*>(&gguf_mma_kernel<FMT, MP>);
#define QG_FORMAT_CASES(NAME, BLOCK, ELEMS) QG_GGUF_MMA_MPS(QG_CASE, QG_FORMAT_##NAME)
    QG_GGUF_FORMATS(QG_FORMAT_CASES)
#undef QG_FORMAT_CASES
#undef QG_CASE
    return nullptr;
}

}  // namespace gguf_mma
}  // namespace qg
