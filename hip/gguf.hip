// GGUF block-format GEMM, decode tier (up to 4 rows of x per launch), HIP dialect.
//
//   y[m, n] = sum_k x[m, k] * dequant(W)[n, k]     m < MT <= 4, n < N, k < K
//
// The weight is read exactly as a .gguf file stores it: row n starts at byte n * ldw
// and holds K / BE blocks of BB bytes (Q8_0, Q4_0, Q4_K, Q6_K, IQ4_XS, IQ3_XXS; the
// list is QG_GGUF_FORMATS in src/formats/blocks.h). docs/gguf-layout.md explains the
// layout choices; src/gpu/gguf_launch.cpp picks the configuration and launches.
//
// Decode is memory bound (one byte of weight feeds a handful of FMAs), so the design
// is about bytes:
//   * Each warp streams R whole rows of W (R = 2 at MT <= 2, so that one x value read
//     from shared memory feeds two rows). A row is read a "step" (WC blocks) at a time
//     into a per-warp shared buffer: the lanes copy contiguous bytes with the widest
//     unit that the alignment of w and ldw allows (16, 8, 4 or 2 bytes). Blocks of
//     210, 98, 34 or 18 bytes are not 16-byte aligned; the buffer absorbs that: lanes
//     then decode from shared memory with whatever indexing the format needs ("jobs").
//     On NVIDIA sm_80+ the copy is cp.async into two buffers, so the next step is in
//     flight while the current one is decoded; elsewhere it goes through registers.
//   * x[0:MT, k-range] is staged once per thread block as fp32 in shared memory and
//     shared by all warps of the block (warps of a block work on different rows of
//     the same k-range). Q4_K also stages the sum of x over every 32-element
//     sub-block, for its "- dmin * m" term.
//   * K may be split across blockIdx.y (split_k); partial sums go to a caller
//     workspace and the last block of each row tile to arrive adds them in a fixed
//     order (deterministic), writes y and resets its arrival counter to zero.
//
// Numerics. x is converted to fp32, products are accumulated in fp32 and y is
// rounded once at the end (round to nearest even). Scale factors are applied per
// sub-block: sum_k x_k * q_k is accumulated over the sub-block's integer codes q_k
// (exact small integers as fp32), then multiplied by the sub-block scale computed in
// the gguf package's float32 operation order, with non-fused multiplies and
// subtractions (mul_rn / sub_rn) where the package rounds twice:
//   Q8_0  d * q                         Q4_0   d * (q - 8)
//   Q4_K  (d * sc) * q - (dmin * m)     Q6_K   (d * sc) * (q - 32)
//   IQ4_XS (d * (ls - 32)) * kvalue     IQ3_XXS ((d * (0.5 + ls)) * 0.5) * grid * sign
// For a one-hot x row (a single 1.0, zeros elsewhere) every sub-block sum is either
// exactly one code or exactly zero, so the fp32 output equals gguf.quants.dequantize
// bit for bit (up to the sign of a zero: IEEE 0 + (-0) is +0).
//
// Integer codes become fp32 with the 2^23 trick: the float with bits 0x4B000000 is
// 2^23, whose ulp is 1, so OR-ing an 8-bit integer v into its low mantissa bits gives
// exactly 2^23 + v; one FADD of -(2^23 + bias) then yields v - bias exactly.
#include <stdint.h>

#include "compat.h"
#include "formats/iq_tables.h"
#include "gguf_device.h"
#include "gguf_kernels.h"

namespace qg {
namespace gguf {

// ------------------------------------------------------------------ small helpers

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// Warp-level barrier between the lanes' stores to a warp's shared buffer and other
// lanes' loads from it (hip/compat.h).
__device__ __forceinline__ void sync_warp() { qg_sync_warp(); }

// Byte B of w (unsigned) as a float, minus BIAS: 2^23 trick (file comment).
template <int B, int BIAS>
__device__ __forceinline__ float byte_f(uint32_t w)
{
    // NVIDIA: PRMT, result bytes = {w.B, 0, 0, 0x4B}, selector nibbles picking bytes of
    // {w, 0x4B000000}; AMD: shift and mask (HIP 5.2's __byte_perm goes through scratch)
    const uint32_t bits = kGpuIsCuda ? __byte_perm(w, 0x4B000000u, 0x7440u | B)
                                     : 0x4B000000u | ((w >> (8 * B)) & 0xFFu);
    return __uint_as_float(bits) - (8388608.0f + (float)BIAS);
}

// A small unsigned integer (< 2^23) as an exact float, minus BIAS.
template <int BIAS>
__device__ __forceinline__ float small_f(uint32_t v)
{
    return __uint_as_float(0x4B000000u | v) - (8388608.0f + (float)BIAS);
}

__device__ __forceinline__ float4 ld_x4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// ------------------------------------------------------------------ tables

// IQ4_NL codebook packed for byte permutes: word i holds kvalues[4i .. 4i+3] + 128 as
// unsigned bytes (the +128 lets the 2^23 trick convert them; BIAS 128 takes it off).
constexpr int8_t kKvaluesIq4nl[16] = QG_KVALUES_IQ4NL;
constexpr uint32_t kvalue_word(int i)
{
    return (uint32_t)(uint8_t)(kKvaluesIq4nl[4 * i + 0] + 128) |
           (uint32_t)(uint8_t)(kKvaluesIq4nl[4 * i + 1] + 128) << 8 |
           (uint32_t)(uint8_t)(kKvaluesIq4nl[4 * i + 2] + 128) << 16 |
           (uint32_t)(uint8_t)(kKvaluesIq4nl[4 * i + 3] + 128) << 24;
}
constexpr uint32_t kKvWord0 = kvalue_word(0), kKvWord1 = kvalue_word(1);
constexpr uint32_t kKvWord2 = kvalue_word(2), kKvWord3 = kvalue_word(3);

// The IQ2_XS sign table (used by IQ3_XXS) is "7 stored bits, bit 7 = parity"; the
// decoder computes it with a popcount. Checked here against gguf's table.
constexpr uint8_t kKsignsIq2xs[128] = QG_KSIGNS_IQ2XS;
constexpr int popcount7(int v) { return (v & 1) + (v >> 1 & 1) + (v >> 2 & 1) + (v >> 3 & 1) + (v >> 4 & 1) + (v >> 5 & 1) + (v >> 6 & 1); }
constexpr bool ksigns_is_parity_completion()
{
    for (int i = 0; i < 128; ++i)
        if (kKsignsIq2xs[i] != (uint8_t)(i | (popcount7(i) & 1) << 7)) return false;
    return true;
}
static_assert(ksigns_is_parity_completion(), "ksigns[i] == i | parity(i) << 7");

// ------------------------------------------------------------------ formats
//
// Each format decodes "jobs": a lane's unit of work, a fixed set of elements of one
// block (whole sub-blocks, so that one scale applies to each partial sum), decoded for
// the warp's R rows at once (same k, so x is read once for R rows). A block has
// kJobsPerBlock jobs; a step of WC blocks has WC * kJobsPerBlock = kJobsPerLane * warp
// jobs, lane j taking jobs j, j + warp, ... (consecutive lanes read consecutive bytes:
// few shared-memory bank conflicts). With a 32-wide warp:
//
//   format   job                               elements  jobs/block  jobs/lane  WC  step bytes
//   Q8_0     the block                               32          1          1   32        1088
//   Q4_0     the block                               32          1          2   64        1152
//   Q4_K     qs[32c..32c+31]: sub-blocks 2c, 2c+1    64          4          1    8        1152
//   Q6_K     half h, 16-byte column p (below)        64          4          1    8        1680
//   IQ4_XS   sub-blocks 2c, 2c+1                     64          4          1    8        1088
//   IQ3_XXS  sub-block s                             32          8          2    8         784
//
// job(wb, off, part, x, xst, xsum, sst, grid, acc):
//   wb[r]   shared buffer of row r; the block starts at byte `off` (2-aligned; 16-aligned
//           for Q4_K, 8-aligned for IQ4_XS: 144 and 136 are multiples of 16 and 8)
//   part    job index within the block, 0 .. kJobsPerBlock-1
//   x       staged x of this block's first element, row m at x + m * xst (fp32)
//   xsum    Q4_K only: sum of x over the block's 8 sub-blocks, row m at xsum + m * sst
//   grid    IQ3_XXS only: the grid in shared memory
//   acc     [R][MT] fp32 accumulators of this lane
//
// A format's facts (block geometry BE, BB; kJobsPerBlock, kJobsPerLane; kXsum and
// kGridWords, what the generic kernel stages for it) are FormatFacts<FMT> in
// hip/gguf_kernels.h, where the launcher plans with them; Format<FMT> derives from them
// and adds the device code: job, and stage_grid, which fills the kGridWords codebook
// block-wide before the kernel's first barrier (FormatDefaults: a plain format's, nothing).

template <int FMT>
struct Format;

template <int FMT>
struct FormatDefaults : FormatFacts<FMT> {
    static __device__ __forceinline__ void stage_grid(uint32_t* /*grid*/) {}
};

// Q8_0: 34 bytes = fp16 d, 32 x int8 q. One job = one block.
//   byte  0..1   d
//   byte  2..33  q[0..31]          element i = d * q[i]
template <>
struct Format<QG_FORMAT_Q8_0> : FormatDefaults<QG_FORMAT_Q8_0> {
    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int /*part*/,
                                               const float* x, int xst, const float*, int, const uint32_t*,
                                               float (&acc)[R][MT])
    {
        float d[R];
        uint32_t q[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            d[r] = half_bits_to_float(ld_u16(wb[r], off));
            ld_words_a2<8>(wb[r], off + 2, q[r]);
#pragma unroll
            for (int i = 0; i < 8; ++i) q[r][i] ^= 0x80808080u;   // int8 -> uint8 + 128
        }
        float s[R][MT] = {};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float f[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                f[r][0] = byte_f<0, 128>(q[r][i]);
                f[r][1] = byte_f<1, 128>(q[r][i]);
                f[r][2] = byte_f<2, 128>(q[r][i]);
                f[r][3] = byte_f<3, 128>(q[r][i]);
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const float4 xv = ld_x4(x + m * xst + 4 * i);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    s[r][m] += xv.x * f[r][0] + xv.y * f[r][1] + xv.z * f[r][2] + xv.w * f[r][3];
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) acc[r][m] += d[r] * s[r][m];
    }
};

// Q4_0: 18 bytes = fp16 d, 16 bytes of nibbles. One job = one block.
//   byte 2 + j: low nibble = element j, high nibble = element 16 + j;  w = d * (q - 8)
template <>
struct Format<QG_FORMAT_Q4_0> : FormatDefaults<QG_FORMAT_Q4_0> {
    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int /*part*/,
                                               const float* x, int xst, const float*, int, const uint32_t*,
                                               float (&acc)[R][MT])
    {
        float d[R];
        uint32_t q[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            d[r] = half_bits_to_float(ld_u16(wb[r], off));
            ld_words_a2<4>(wb[r], off + 2, q[r]);
        }
        float s[R][MT] = {};
#pragma unroll
        for (int i = 0; i < 4; ++i) {   // word i: elements 4i..4i+3 (low) and 16+4i.. (high)
            float lo[R][4], hi[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint32_t l = q[r][i] & 0x0F0F0F0Fu, h = (q[r][i] >> 4) & 0x0F0F0F0Fu;
                lo[r][0] = byte_f<0, 8>(l); lo[r][1] = byte_f<1, 8>(l);
                lo[r][2] = byte_f<2, 8>(l); lo[r][3] = byte_f<3, 8>(l);
                hi[r][0] = byte_f<0, 8>(h); hi[r][1] = byte_f<1, 8>(h);
                hi[r][2] = byte_f<2, 8>(h); hi[r][3] = byte_f<3, 8>(h);
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const float4 xl = ld_x4(x + m * xst + 4 * i);
                const float4 xh = ld_x4(x + m * xst + 16 + 4 * i);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    s[r][m] += xl.x * lo[r][0] + xl.y * lo[r][1] + xl.z * lo[r][2] + xl.w * lo[r][3] +
                               xh.x * hi[r][0] + xh.y * hi[r][1] + xh.z * hi[r][2] + xh.w * hi[r][3];
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) acc[r][m] += d[r] * s[r][m];
    }
};

// Q4_K: 144 bytes = fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, m) for 8 sub-blocks of
// 32, 128 bytes of nibbles. Job c (0..3) = qs bytes 32c..32c+31 = sub-blocks 2c (low
// nibbles) and 2c+1 (high nibbles), 64 elements:
//   qs byte 32c + j, j < 32:  low  -> element 64c + j       (sub-block 2c)
//                             high -> element 64c + 32 + j  (sub-block 2c+1)
//   scale bytes s[0..11] (gguf get_scale_min): for sub-block j < 4: sc = s[j] & 63,
//   m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
//   m = (s[j+4] >> 4) | (s[j] >> 6) << 4.  Four at a time, as bytes of a word:
//     sc[0..3] = S0 & 0x3F3F3F3F              m[0..3] = S1 & 0x3F3F3F3F
//     sc[4..7] = (S2 & 0x0F..) | (S0 >> 2 & 0x30..)   m[4..7] = (S2 >> 4 & 0x0F..) | (S1 >> 2 & 0x30..)
//   (S0, S1, S2 = s[0..3], s[4..7], s[8..11] as little-endian words.)
template <>
struct Format<QG_FORMAT_Q4_K> : FormatDefaults<QG_FORMAT_Q4_K> {
    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int part,
                                               const float* x, int xst, const float* xsum, int sst,
                                               const uint32_t*, float (&acc)[R][MT])
    {
        const int c = part;
        float ds[R][2], dm[R][2];
        uint4 q[R][2];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4 h = *reinterpret_cast<const uint4*>(wb[r] + off);   // d, dmin, s[0..11]
            const float d = half_bits_to_float(h.x & 0xFFFFu), dmin = half_bits_to_float(h.x >> 16);
            const uint32_t sc_lo = h.y & 0x3F3F3F3Fu, m_lo = h.z & 0x3F3F3F3Fu;
            const uint32_t sc_hi = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
            const uint32_t m_hi = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
            const uint32_t scw = c < 2 ? sc_lo : sc_hi, mw = c < 2 ? m_lo : m_hi;
            const unsigned sh = (unsigned)(c & 1) * 16u;   // sub-block 2c is byte (2c) % 4
            ds[r][0] = mul_rn(d, small_f<0>((scw >> sh) & 0xFFu));
            ds[r][1] = mul_rn(d, small_f<0>((scw >> (sh + 8)) & 0xFFu));
            dm[r][0] = mul_rn(dmin, small_f<0>((mw >> sh) & 0xFFu));
            dm[r][1] = mul_rn(dmin, small_f<0>((mw >> (sh + 8)) & 0xFFu));
            q[r][0] = *reinterpret_cast<const uint4*>(wb[r] + off + 16 + 32 * c);
            q[r][1] = *reinterpret_cast<const uint4*>(wb[r] + off + 32 + 32 * c);
        }
        // sub-block 2c + hn: low nibbles (hn = 0), then high nibbles (hn = 1)
#pragma unroll
        for (int hn = 0; hn < 2; ++hn) {
            float sq[R][MT] = {};
#pragma unroll
            for (int i = 0; i < 8; ++i) {   // word i: elements 64c + 32hn + 4i .. +3
                float f[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const uint4& v = q[r][i >> 2];
                    const uint32_t w = (i & 3) == 0 ? v.x : (i & 3) == 1 ? v.y : (i & 3) == 2 ? v.z : v.w;
                    const uint32_t nib = (w >> (4 * hn)) & 0x0F0F0F0Fu;
                    f[r][0] = byte_f<0, 0>(nib); f[r][1] = byte_f<1, 0>(nib);
                    f[r][2] = byte_f<2, 0>(nib); f[r][3] = byte_f<3, 0>(nib);
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    const float4 xv = ld_x4(x + m * xst + 64 * c + 32 * hn + 4 * i);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        sq[r][m] += xv.x * f[r][0] + xv.y * f[r][1] + xv.z * f[r][2] + xv.w * f[r][3];
                }
            }
            // (d*sc) * sum(x q) - (dmin*m) * sum(x): gguf's (d*sc)*q - (dmin*m), summed over x
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const float sx = xsum[m * sst + 2 * c + hn];
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][m] += sub_rn(mul_rn(ds[r][hn], sq[r][m]), mul_rn(dm[r][hn], sx));
            }
        }
    }
};

// Q6_K: 210 bytes = ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one
// per 16 elements), fp16 d. w = (d * sc) * (q - 32). Element e = 128h + r (h = 0, 1):
//   low bits  = ql[64h + r % 64] >> 4 * (r / 64)
//   high bits = qh[32h + r % 32] >> 2 * (r / 32)
// Job (h, p) with p = part & 1 takes r in {16p + t, 32 + 16p + t, 64 + 16p + t,
// 96 + 16p + t : t < 16}: words A = ql[64h + 16p ..], B = ql[64h + 32 + 16p ..],
// H = qh[32h + 16p ..] (4 words each). For word i (t = 4i .. 4i+3), as bytes:
//   u = 0: r = 16p + t         q = A & 0x0F | (H << 4) & 0x30    sub-block 8h + p
//   u = 1: r = 32 + 16p + t    q = B & 0x0F | (H << 2) & 0x30    sub-block 8h + 2 + p
//   u = 2: r = 64 + 16p + t    q = A >> 4 & 0x0F | H & 0x30      sub-block 8h + 4 + p
//   u = 3: r = 96 + 16p + t    q = B >> 4 & 0x0F | H >> 2 & 0x30 sub-block 8h + 6 + p
template <>
struct Format<QG_FORMAT_Q6_K> : FormatDefaults<QG_FORMAT_Q6_K> {
    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int part,
                                               const float* x, int xst, const float*, int, const uint32_t*,
                                               float (&acc)[R][MT])
    {
        const int h = part >> 1, p = part & 1;
        float d[R];
        uint32_t Q[R][4], H[R][4], S[R][2];   // Q: A words for u = 0, 2, then B words for u = 1, 3
#pragma unroll
        for (int r = 0; r < R; ++r) {
            ld_words_a2<4>(wb[r], off + 128 + 32 * h + 16 * p, H[r]);
            ld_words_a2<2>(wb[r], off + 192 + 8 * h, S[r]);   // scales[8h .. 8h+7]: sub-block 8h+p+2u = byte p+2u
            S[r][0] ^= 0x80808080u;                           // int8 -> uint8 + 128
            S[r][1] ^= 0x80808080u;
            d[r] = half_bits_to_float(ld_u16(wb[r], off + 208));
        }
        const float* xb = x + 128 * h + 16 * p;
        // u in the order 0, 2 (low bits from A), 1, 3 (from B): one of A, B live at a time
#pragma unroll
        for (int uu = 0; uu < 4; ++uu) {
            const int u = ((uu & 1) << 1) | (uu >> 1);   // 0, 2, 1, 3
            if (uu == 0 || uu == 2) {
#pragma unroll
                for (int r = 0; r < R; ++r) ld_words_a2<4>(wb[r], off + 64 * h + 32 * (uu >> 1) + 16 * p, Q[r]);
            }
            float s[R][MT] = {};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float f[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const uint32_t lo = (u & 2) ? (Q[r][i] >> 4) & 0x0F0F0F0Fu : Q[r][i] & 0x0F0F0F0Fu;
                    const uint32_t qb = lo | ((u == 0   ? H[r][i] << 4
                                               : u == 1 ? H[r][i] << 2
                                               : u == 2 ? H[r][i]
                                                        : H[r][i] >> 2) & 0x30303030u);
                    f[r][0] = byte_f<0, 32>(qb); f[r][1] = byte_f<1, 32>(qb);
                    f[r][2] = byte_f<2, 32>(qb); f[r][3] = byte_f<3, 32>(qb);
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    const float4 xv = ld_x4(xb + m * xst + 32 * u + 4 * i);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        s[r][m] += xv.x * f[r][0] + xv.y * f[r][1] + xv.z * f[r][2] + xv.w * f[r][3];
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint32_t sc = (S[r][u >> 1] >> (8 * p + 16 * (u & 1))) & 0xFFu;
                const float ds = mul_rn(d[r], small_f<128>(sc));   // gguf: d * scales
#pragma unroll
                for (int m = 0; m < MT; ++m) acc[r][m] += ds * s[r][m];
            }
        }
    }
};

// IQ4_XS: 136 bytes = fp16 d, uint16 scales_h, 4 bytes scales_l, 128 bytes of nibbles
// indexing the IQ4_NL codebook; 8 sub-blocks of 32 with 6-bit scales ls:
//   ls[s] = (scales_l >> 4s & 15) | (scales_h >> 2s & 3) << 4,  w = (d * (ls - 32)) * kvalues[q]
//   qs byte 16s + j: low nibble -> element 32s + j, high -> 32s + 16 + j.
// Job c (0..3) = sub-blocks 2c, 2c+1. Codebook lookup: 4 nibbles (16 bits) of a qs
// word select 4 bytes from the 16-byte codebook with two byte permutes (entries 0-7
// and 8-15, nibble bits 0-2) and a third permute that picks by nibble bit 3. The
// nibbles of qs bytes j, j+1 come out as elements (j, 16+j, j+1, 16+j+1):
//   low half of word i  -> bytes {32s+4i, 32s+16+4i, 32s+4i+1, 32s+16+4i+1}
//   high half of word i -> bytes {32s+4i+2, 32s+16+4i+2, 32s+4i+3, 32s+16+4i+3}
template <>
struct Format<QG_FORMAT_IQ4_XS> : FormatDefaults<QG_FORMAT_IQ4_XS> {
    // Codebook bytes (+128) for the four nibbles in the low 16 bits of `sel`.
    static __device__ __forceinline__ uint32_t lookup4(uint32_t sel)
    {
        if constexpr (kGpuIsCuda) {
            const uint32_t idx = sel & 0x7777u;                        // entry within a half
            const uint32_t pick = ((sel & 0x8888u) >> 1) | 0x3210u;   // byte i from lo (i) or hi (4+i)
            const uint32_t lo = __byte_perm(kKvWord0, kKvWord1, idx);
            const uint32_t hi = __byte_perm(kKvWord2, kKvWord3, idx);
            return __byte_perm(lo, hi, pick);
        } else {
            // HIP 5.2's __byte_perm indexes a local array (scratch memory); shifts instead.
            constexpr uint64_t lo = (uint64_t)kKvWord1 << 32 | kKvWord0, hi = (uint64_t)kKvWord3 << 32 | kKvWord2;
            uint32_t out = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const uint32_t i = (sel >> (4 * b)) & 0xFu;
                out |= (uint32_t)(((i & 8u) ? hi : lo) >> (8u * (i & 7u)) & 0xFFu) << (8 * b);
            }
            return out;
        }
    }

    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int part,
                                               const float* x, int xst, const float*, int, const uint32_t*,
                                               float (&acc)[R][MT])
    {
        const int c = part;
        float dl[R][2];
        uint2 q[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint2 hd = *reinterpret_cast<const uint2*>(wb[r] + off);   // d | scales_h << 16, scales_l
            const float d = half_bits_to_float(hd.x & 0xFFFFu);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const unsigned sb = 2u * (unsigned)c + (unsigned)t;
                const uint32_t ls = ((hd.y >> (4u * sb)) & 0xFu) | (((hd.x >> (16u + 2u * sb)) & 3u) << 4);
                dl[r][t] = mul_rn(d, small_f<32>(ls));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) q[r][i] = *reinterpret_cast<const uint2*>(wb[r] + off + 8 + 32 * c + 8 * i);
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {       // sub-block 2c + t
            float s[R][MT] = {};
#pragma unroll
            for (int i = 0; i < 4; ++i) {   // word i of its 16 qs bytes
                float f[R][8];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const uint2& v = q[r][2 * t + (i >> 1)];
                    const uint32_t w = (i & 1) ? v.y : v.x;
                    const uint32_t k0 = lookup4(w & 0xFFFFu), k1 = lookup4(w >> 16);
                    f[r][0] = byte_f<0, 128>(k0); f[r][1] = byte_f<1, 128>(k0);
                    f[r][2] = byte_f<2, 128>(k0); f[r][3] = byte_f<3, 128>(k0);
                    f[r][4] = byte_f<0, 128>(k1); f[r][5] = byte_f<1, 128>(k1);
                    f[r][6] = byte_f<2, 128>(k1); f[r][7] = byte_f<3, 128>(k1);
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    const float* xs = x + m * xst + 64 * c + 32 * t + 4 * i;
                    const float4 xl = ld_x4(xs), xh = ld_x4(xs + 16);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        s[r][m] += xl.x * f[r][0] + xh.x * f[r][1] + xl.y * f[r][2] + xh.y * f[r][3] +
                                   xl.z * f[r][4] + xh.z * f[r][5] + xl.w * f[r][6] + xh.w * f[r][7];
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < MT; ++m) acc[r][m] += dl[r][t] * s[r][m];
        }
    }
};

// IQ3_XXS: 98 bytes = fp16 d, qs[64] grid indices, 8 little-endian uint32 "aux" (one
// per sub-block of 32). Job s (0..7) = sub-block s, 4 groups l of 8 elements:
//   element 32s + 8l + i = grid[qs[8s + 2l + i/4]].byte(i % 4) * sign,
//   sign = -1 if bit i of ksigns[aux >> 7l & 127], scale = (d * (0.5 + (aux >> 28))) * 0.5
// Signs are applied on the packed bytes: the shared grid holds every byte | 0x80
// (= g + 128); a negative element becomes (~(g + 128) + 1) & 0xFF = 128 - g, so the
// 2^23 trick with BIAS 128 yields +-g. The byte mask comes from 4 sign bits spread
// to bit 0 of each byte: (bits * 0x00204081) & 0x01010101 (bit i lands on bit 8i;
// the other partial products land on distinct non-multiples of 8, so no carries).
template <>
struct Format<QG_FORMAT_IQ3_XXS> : FormatDefaults<QG_FORMAT_IQ3_XXS> {
    // The grid with every byte | 0x80 (= g + 128, the sign trick above).
    static __device__ __forceinline__ void stage_grid(uint32_t* grid)
    {
        for (int i = threadIdx.x; i < 256; i += kThreads) grid[i] = c_iq3xxs_grid[i] | 0x80808080u;
    }

    template <int MT, int R>
    static __device__ __forceinline__ void job(const uint8_t* const (&wb)[R], int off, int part,
                                               const float* x, int xst, const float*, int,
                                               const uint32_t* grid, float (&acc)[R][MT])
    {
        const int sblk = part;
        float db[R];
        uint32_t g[R][2], aux[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float d = half_bits_to_float(ld_u16(wb[r], off));
            ld_words_a2<2>(wb[r], off + 2 + 8 * sblk, g[r]);
            uint32_t a[1];
            ld_words_a2<1>(wb[r], off + 66 + 4 * sblk, a);
            aux[r] = a[0];
            db[r] = mul_rn(mul_rn(d, 0.5f + small_f<0>(aux[r] >> 28)), 0.5f);
        }
        float s[R][MT] = {};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            float f[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint32_t iw = g[r][l >> 1] >> (16 * (l & 1));
                const uint32_t g0 = grid[iw & 0xFFu], g1 = grid[(iw >> 8) & 0xFFu];
                const uint32_t si = (aux[r] >> (7 * l)) & 0x7Fu;
                const uint32_t sg = si | (uint32_t)(__popc(si) & 1) << 7;
                const uint32_t n0 = ((sg & 0xFu) * 0x00204081u) & 0x01010101u;
                const uint32_t n1 = ((sg >> 4) * 0x00204081u) & 0x01010101u;
                const uint32_t u0 = (g0 ^ (n0 * 0xFFu)) + n0, u1 = (g1 ^ (n1 * 0xFFu)) + n1;
                f[r][0] = byte_f<0, 128>(u0); f[r][1] = byte_f<1, 128>(u0);
                f[r][2] = byte_f<2, 128>(u0); f[r][3] = byte_f<3, 128>(u0);
                f[r][4] = byte_f<0, 128>(u1); f[r][5] = byte_f<1, 128>(u1);
                f[r][6] = byte_f<2, 128>(u1); f[r][7] = byte_f<3, 128>(u1);
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const float* xs = x + m * xst + 32 * sblk + 8 * l;
                const float4 x0 = ld_x4(xs), x1 = ld_x4(xs + 4);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    s[r][m] += x0.x * f[r][0] + x0.y * f[r][1] + x0.z * f[r][2] + x0.w * f[r][3] +
                               x1.x * f[r][4] + x1.y * f[r][5] + x1.z * f[r][6] + x1.w * f[r][7];
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) acc[r][m] += db[r] * s[r][m];
    }
};

// ------------------------------------------------------------------ kernel

// Stages x[0:MT, kb0*BE : kb1*BE) as fp32 into xs (row stride kx) and, for Q4_K, the
// sums over each 32 elements into xsum (row stride kx / 32). Block-wide; ends with a
// barrier. Rows m >= m_valid are zeros.
template <int FMT, int MT>
__device__ void stage_x(const DecodeParams& p, int kb0, int kb1, int kx, float* xs, float* xsum)
{
    constexpr int BE = Format<FMT>::BE;
    const int nk = (kb1 - kb0) * BE;
    const int64_t k0 = (int64_t)kb0 * BE;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const bool live = m < p.m_valid;
        for (int k = threadIdx.x; k < nk; k += kThreads)
            xs[m * kx + k] = live ? load_x(p.x, m * p.ldx + k0 + k, p.x_dtype) : 0.0f;
    }
    __syncthreads();
    if (Format<FMT>::kXsum) {
        const int n32 = nk / 32;
        for (int i = threadIdx.x; i < MT * n32; i += kThreads) {
            const int m = i / n32, j = i - m * n32;
            const float* v = xs + m * kx + 32 * j;
            float t = 0.0f;
            for (int e = 0; e < 32; ++e) t += v[e];
            xsum[m * (kx / 32) + j] = t;
        }
        __syncthreads();
    }
}

template <int L> struct LoadUnit;
template <> struct LoadUnit<16> { typedef uint4 T; };
template <> struct LoadUnit<8> { typedef uint2 T; };
template <> struct LoadUnit<4> { typedef uint32_t T; };
template <> struct LoadUnit<2> { typedef uint16_t T; };

// Copies bytes [a0, a0 + nbytes) of R rows (src[r] = row start in global memory) to
// dst[r] in shared memory, in L-byte units spread over the lanes (lane t takes units
// t, t + warp, ...: a warp reads contiguous bytes). a0 is a multiple of L; an
// L-unaligned tail (nbytes is even) goes in 2-byte pieces. MAXB bounds nbytes.
template <int L, int R, int MAXB>
__device__ __forceinline__ void copy_rows(uint8_t* const (&dst)[R], const uint8_t* const (&src)[R], int64_t a0,
                                          int nbytes, int lane)
{
    typedef typename LoadUnit<L>::T U;
    constexpr int kPerLane = (MAXB / L + QG_WARP_SIZE - 1) / QG_WARP_SIZE;
    // Loads in flight per lane, all issued before the first store: 16-byte units as many
    // as 24 registers hold (3 for each of two rows, 6 for one); narrower units 4 per row.
    constexpr int kFit = L == 16 ? 24 / (R * 4) : 4;
    constexpr int kBatch = kFit < kPerLane ? kFit : kPerLane;
    const int nu = nbytes / L;
#pragma unroll 1
    for (int base = 0; base < kPerLane; base += kBatch) {
        U v[R][kBatch];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
                const int u = (base + i) * QG_WARP_SIZE + lane;
                if (base + i < kPerLane && u < nu) v[r][i] = *reinterpret_cast<const U*>(src[r] + a0 + (int64_t)u * L);
            }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
                const int u = (base + i) * QG_WARP_SIZE + lane;
                if (base + i < kPerLane && u < nu) *reinterpret_cast<U*>(dst[r] + u * L) = v[r][i];
            }
    }
    if (L > 2) {
        const int tail = nbytes - nu * L;   // 0 .. L-2, even
        for (int t = 2 * lane; t < tail; t += 2 * QG_WARP_SIZE)
#pragma unroll
            for (int r = 0; r < R; ++r)
                *reinterpret_cast<uint16_t*>(dst[r] + nu * L + t) =
                    *reinterpret_cast<const uint16_t*>(src[r] + a0 + nu * L + t);
    }
}

#if defined(QG_GGUF_ASYNC_COPY)
// copy_rows with cp.async (L = 16, 8 or 4); the 2-byte tail is copied directly.
template <int L, int R, int MAXB>
__device__ __forceinline__ void copy_rows_async(uint8_t* const (&dst)[R], const uint8_t* const (&src)[R], int64_t a0,
                                                int nbytes, int lane)
{
    constexpr int kPerLane = (MAXB / L + QG_WARP_SIZE - 1) / QG_WARP_SIZE;
    const int nu = nbytes / L;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int u = i * QG_WARP_SIZE + lane;
        if (u < nu)
#pragma unroll
            for (int r = 0; r < R; ++r) cp_async<L>(dst[r] + u * L, src[r] + a0 + (int64_t)u * L);
    }
    const int tail = nbytes - nu * L;   // 0 .. L-2, even
    for (int t = 2 * lane; t < tail; t += 2 * QG_WARP_SIZE)
#pragma unroll
        for (int r = 0; r < R; ++r)
            *reinterpret_cast<uint16_t*>(dst[r] + nu * L + t) = *reinterpret_cast<const uint16_t*>(src[r] + a0 + nu * L + t);
}
#endif

// What a thread block works on (kernel below), shared by the load-width variants.
struct Tile {
    int r_begin, r_end;    // rows of W (and columns of y) of this block
    int kb_begin, kb_end;  // blocks of K of this split
    int split;             // blockIdx.y
    int nxc;               // x chunks of the split (1: staged once before the rows)
    int kx;                // staged x row stride, elements
    float* xs;             // staged x [MT][kx]
    float* xsum;           // Q4_K: staged sums [MT][kx / 32]
    const uint32_t* grid;  // IQ3_XXS: grid in shared memory
    uint8_t* wbuf;         // all warps' row buffers: [warp][stage][row][ROWBUF]
    int stages;            // stages of the layout (1 or 2)
};

template <int FMT, int MT>
struct TileShape {
    typedef Format<FMT> F;
    static constexpr int R = Tune<MT>::kRows;
    static constexpr int NW = kThreads / QG_WARP_SIZE;
    static constexpr int WC = step_blocks<FMT>(QG_WARP_SIZE);   // blocks per step
    static constexpr int STEP = WC * F::BB;                      // bytes per row per step
    static constexpr int ROWBUF = row_buffer_bytes(STEP);
    static_assert(WC * F::kJobsPerBlock == F::kJobsPerLane * QG_WARP_SIZE, "a step is one round of jobs");
};

// Decodes one step (nblk blocks, the first at byte `lead` of each row buffer) into acc:
// lane j of the warp takes jobs j, j + warp, ... (job j = part j % JB of block j / JB).
// kb_off = first block of the step relative to the staged x.
template <int FMT, int MT>
__device__ __forceinline__ void decode_step(const uint8_t* const (&rows)[Tune<MT>::kRows], int lead, int nblk,
                                            int kb_off, const Tile& t, int lane, float (&acc)[Tune<MT>::kRows][MT])
{
    typedef Format<FMT> F;
    const int njobs = nblk * F::kJobsPerBlock;
#pragma unroll
    for (int jj = 0; jj < F::kJobsPerLane; ++jj) {
        const int j = jj * QG_WARP_SIZE + lane;
        if (j >= njobs) continue;
        const int blk = j / F::kJobsPerBlock, part = j % F::kJobsPerBlock;
        const int xoff = (kb_off + blk) * F::BE;
        F::template job<MT, Tune<MT>::kRows>(rows, lead + blk * F::BB, part, t.xs + xoff, t.kx, t.xsum + xoff / 32,
                                             t.kx / 32, t.grid, acc);
    }
}

// Sums a group's accumulators over the warp (butterfly: fixed order, deterministic),
// lane 0 writes y (or the split's partial sums) and every lane's acc is reset.
template <int FMT, int MT>
__device__ __forceinline__ void finish_group(const DecodeParams& p, const Tile& t, int g, int lane,
                                             float (&acc)[Tune<MT>::kRows][MT])
{
    constexpr int R = Tune<MT>::kRows;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int o = QG_WARP_SIZE / 2; o > 0; o /= 2) acc[r][m] += __shfl_xor(acc[r][m], o, QG_WARP_SIZE);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int n = t.r_begin + g * R + r;
            if (n >= t.r_end) continue;
            const float bn = bias_at(p.bias, n);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m >= p.m_valid) continue;
                if (p.split_k > 1) p.partial[((int64_t)t.split * MT + m) * p.n + n] = acc[r][m];
                else store_y(p.y, m * p.ldy + n, acc[r][m] + bn, p.y_dtype);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
}

// Row pointers of group g (rows past the tile re-read its first row; never written).
template <int R>
__device__ __forceinline__ void group_rows(const DecodeParams& p, const Tile& t, int g, const uint8_t* (&src)[R])
{
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = t.r_begin + g * R + r;
        src[r] = p.w + (int64_t)(n < t.r_end ? n : t.r_begin) * p.ldw;
    }
}

// The rows of a tile with synchronous L-byte loads (every target; the only path on
// AMD, and on NVIDIA for 2-byte-aligned rows or x in several chunks). Warp w takes
// groups of R consecutive rows g = w, w + NW, ... and streams each over the split's
// k-range a step (WC blocks) at a time: copy to shared memory, then one round of jobs.
template <int L, int FMT, int MT>
__device__ __forceinline__ void decode_tile_sync(const DecodeParams& p, const Tile& t)
{
    typedef Format<FMT> F;
    typedef TileShape<FMT, MT> S;
    constexpr int R = S::R, NW = S::NW, WC = S::WC;
    const int lane = threadIdx.x % QG_WARP_SIZE, warp = threadIdx.x / QG_WARP_SIZE;
    uint8_t* wb[R];         // this warp's row buffers (written by the copy)
    const uint8_t* wbc[R];  // the same, read by the jobs
#pragma unroll
    for (int r = 0; r < R; ++r) {
        wb[r] = t.wbuf + (warp * t.stages * R + r) * S::ROWBUF;
        wbc[r] = wb[r];
    }
    const int ngroups = (t.r_end - t.r_begin + R - 1) / R;
    const int rounds = (ngroups + NW - 1) / NW;   // uniform over the block (x chunks need barriers)
    for (int round = 0; round < rounds; ++round) {
        const int g = round * NW + warp;
        const bool live = g < ngroups;   // warp-uniform
        const uint8_t* src[R];
        group_rows<R>(p, t, g, src);
        float acc[R][MT] = {};
        for (int xc = 0; xc < t.nxc; ++xc) {
            const int xb0 = t.kb_begin + xc * p.kxb, xb1 = imin(xb0 + p.kxb, t.kb_end);
            if (t.nxc > 1) {
                __syncthreads();   // every warp is done with the previous chunk
                stage_x<FMT, MT>(p, xb0, xb1, t.kx, t.xs, t.xsum);
            }
            if (!live) continue;
            for (int b0 = xb0; b0 < xb1; b0 += WC) {
                const int nblk = imin(WC, xb1 - b0);
                // Step bytes [c0, c0 + nblk*BB) of each row, loaded from the L-aligned a0 <= c0;
                // block blk of the step then sits at lead + blk*BB in the row buffer.
                const int64_t c0 = (int64_t)b0 * F::BB;
                const int64_t a0 = c0 & ~(int64_t)(L - 1);
                const int lead = (int)(c0 - a0);
                copy_rows<L, R, S::STEP + 16>(wb, src, a0, lead + nblk * F::BB, lane);
                sync_warp();
                decode_step<FMT, MT>(wbc, lead, nblk, b0 - xb0, t, lane, acc);
                sync_warp();   // before the next step overwrites the buffer
            }
        }
        if (live) finish_group<FMT, MT>(p, t, g, lane, acc);
    }
}

#if defined(QG_GGUF_ASYNC_COPY)
// The rows of a tile with cp.async double buffering (NVIDIA, L = 16, 8 or 4, x staged
// once). The warp's work is the sequence of items (group, step), groups g = w, w + NW,
// ..., steps 0 .. nsteps-1 of each; item i+1 is in flight while item i is decoded:
//   issue(0); commit
//   for i: issue(i+1) into buffer (i+1)%2; commit; wait for all but the newest group;
//          sync_warp; decode item i from buffer i%2; sync_warp
template <int L, int FMT, int MT>
__device__ __forceinline__ void decode_tile_async(const DecodeParams& p, const Tile& t)
{
    typedef Format<FMT> F;
    typedef TileShape<FMT, MT> S;
    constexpr int R = S::R, NW = S::NW, WC = S::WC;
    const int lane = threadIdx.x % QG_WARP_SIZE, warp = threadIdx.x / QG_WARP_SIZE;
    uint8_t* const my_buf = t.wbuf + warp * 2 * R * S::ROWBUF;   // [stage][row], two stages
    const int ngroups = (t.r_end - t.r_begin + R - 1) / R;
    const int nsteps = (t.kb_end - t.kb_begin + WC - 1) / WC;
    const int mine = warp < ngroups ? (ngroups - warp + NW - 1) / NW : 0;   // groups of this warp
    const int items = mine * nsteps;

    // next item to issue: group ig, step is
    int ig = warp, is = 0;
    auto issue = [&](int stage) {
        const uint8_t* src[R];
        group_rows<R>(p, t, ig, src);
        uint8_t* dst[R];
#pragma unroll
        for (int r = 0; r < R; ++r) dst[r] = my_buf + (stage * R + r) * S::ROWBUF;
        const int b0 = t.kb_begin + is * WC, nblk = imin(WC, t.kb_end - b0);
        const int64_t c0 = (int64_t)b0 * F::BB, a0 = c0 & ~(int64_t)(L - 1);
        copy_rows_async<L, R, S::STEP + 16>(dst, src, a0, (int)(c0 - a0) + nblk * F::BB, lane);
        if (++is == nsteps) {
            is = 0;
            ig += NW;
        }
    };
    if (items > 0) issue(0);
    cp_async_commit();

    float acc[R][MT] = {};
    int g = warp, step = 0;   // item being decoded
    for (int it = 0; it < items; ++it) {
        if (it + 1 < items) issue((it + 1) & 1);
        cp_async_commit();
        cp_async_wait_all_but_newest();
        sync_warp();
        const uint8_t* rows[R];
#pragma unroll
        for (int r = 0; r < R; ++r) rows[r] = my_buf + ((it & 1) * R + r) * S::ROWBUF;
        const int b0 = t.kb_begin + step * WC, nblk = imin(WC, t.kb_end - b0);
        const int lead = (int)(((int64_t)b0 * F::BB) & (L - 1));
        decode_step<FMT, MT>(rows, lead, nblk, b0 - t.kb_begin, t, lane, acc);
        if (++step == nsteps) {
            finish_group<FMT, MT>(p, t, g, lane, acc);
            step = 0;
            g += NW;
        }
        sync_warp();   // buffer it%2 is refilled by the issue of item it+2
    }
}
#endif

// The decode kernel. Grid (tiles, split_k), kThreads threads.
//   blockIdx.x = row tile: rows [x*N/tiles, (x+1)*N/tiles), split evenly so that every
//                SM gets the same bytes (tiles = resident blocks / split_k);
//   blockIdx.y = K split s: blocks [s*nb/split_k, (s+1)*nb/split_k) of every row.
// ASYNC (NVIDIA sm_80+, rows 4-byte aligned, x staged once): cp.async double buffering;
// otherwise synchronous copies. Two kernels rather than one with both paths: the
// register allocation of the fast path stays its own.
//
// Worked example, Q4_K, N = 43008, K = 5376 (nb = 21), M = 1, 132 SMs x 3 blocks:
//   tiles = 396, split_k = 1; a tile has 108 or 109 rows = 55 groups of R = 2 rows;
//   8 warps -> 6 or 7 groups per warp. Step = WC = 8 blocks (1152 bytes per row):
//   a row of 3024 bytes = steps of 8, 8 and 5 blocks; 16-byte copies: 72 per row per
//   full step, 2.25 per lane, 4.5 for the two rows; then lane j decodes job j % 4 of
//   block j / 4 (64 elements) for both rows.
template <int FMT, int MT, bool ASYNC>
__global__ void __launch_bounds__(kThreads, Tune<MT>::kMinBlocks) gguf_decode_kernel(const DecodeParams p)
{
    typedef Format<FMT> F;
    constexpr int R = Tune<MT>::kRows;
    constexpr int NW = kThreads / QG_WARP_SIZE;
    constexpr int ROWBUF = row_buffer_bytes(step_blocks<FMT>(QG_WARP_SIZE) * F::BB);

    __shared__ uint4 s_wbuf[NW * stages(ASYNC) * R * ROWBUF / 16];
    __shared__ uint32_t s_grid[F::kGridWords];
    __shared__ int s_last;
    extern __shared__ float4 s_dyn[];

    Tile t;
    const int tile = blockIdx.x, tiles = gridDim.x;
    t.split = blockIdx.y;
    t.r_begin = (int)((int64_t)tile * p.n / tiles);
    t.r_end = (int)((int64_t)(tile + 1) * p.n / tiles);
    t.kb_begin = (int)((int64_t)t.split * p.nb / p.split_k);
    t.kb_end = (int)((int64_t)(t.split + 1) * p.nb / p.split_k);
    t.kx = p.kxb * F::BE;
    t.xs = reinterpret_cast<float*>(s_dyn);
    t.xsum = t.xs + MT * t.kx;
    t.grid = s_grid;
    t.wbuf = reinterpret_cast<uint8_t*>(s_wbuf);
    t.stages = stages(ASYNC);
    t.nxc = (t.kb_end - t.kb_begin + p.kxb - 1) / p.kxb;

    F::stage_grid(s_grid);   // read after the barrier below
    if (t.nxc == 1) stage_x<FMT, MT>(p, t.kb_begin, t.kb_end, t.kx, t.xs, t.xsum);   // ends with a barrier
    else __syncthreads();                                                         // s_grid

    // One dispatch per kernel, outside every loop: each load width gets its own copy of
    // the row loop (a switch inside the step loop made the compiler spill).
#if defined(QG_GGUF_ASYNC_COPY)
    if (ASYNC) {   // the host picks it only with load_bytes >= 4 and one x chunk
        if (p.load_bytes == 16) decode_tile_async<16, FMT, MT>(p, t);
        else if (p.load_bytes == 8) decode_tile_async<8, FMT, MT>(p, t);
        else decode_tile_async<4, FMT, MT>(p, t);
    } else {       // 2-byte rows, several x chunks: correct, not tuned
        decode_tile_sync<2, FMT, MT>(p, t);
    }
#else
    // MT > 2 (compute bound in this SIMT tier) keeps only 16 and 2 bytes: compile time.
    if (p.load_bytes == 16) decode_tile_sync<16, FMT, MT>(p, t);
    else if (MT <= 2 && p.load_bytes == 8) decode_tile_sync<8, FMT, MT>(p, t);
    else if (MT <= 2 && p.load_bytes == 4) decode_tile_sync<4, FMT, MT>(p, t);
    else decode_tile_sync<2, FMT, MT>(p, t);
#endif
    if (p.split_k == 1) return;

    // Split-K: the last of the split_k blocks of this row tile adds the partial sums in
    // split order (deterministic), writes y, zeroes them and re-arms the counter.
    if (!last_split_to_arrive(&p.counters[tile], p.split_k, s_last)) return;
    const int rows = t.r_end - t.r_begin;
    for (int i = threadIdx.x; i < p.m_valid * rows; i += kThreads) {
        const int m = i / rows, n = t.r_begin + (i - m * rows);
        const float sum = sum_and_clear_splits(p.partial + (int64_t)m * p.n + n, (int64_t)MT * p.n, p.split_k);
        store_y(p.y, m * p.ldy + n, sum + bias_at(p.bias, n), p.y_dtype);
    }
    if (threadIdx.x == 0) p.counters[tile] = 0;
}

// The cp.async variant of an M tile: CUDA builds only (kAsyncBuild); a HIP build neither
// instantiates nor launches it.
template <int FMT, int MT>
const void* async_decode_kernel()
{
    if constexpr (kAsyncBuild) return reinterpret_cast<const void*>(&gguf_decode_kernel<FMT, MT, true>);
    return nullptr;
}

// The instantiations: every format of QG_GGUF_FORMATS x QG_GGUF_DECODE_MTILES x copy path.
const void* decode_kernel(int format, int mt, bool async)
{
#define QG_CASE(FMT, MT)                                                                                  \
    if (format == FMT && mt == MT)                                                                        \
        return async ? async_decode_kernel<FMT, MT>() : reinterpret_cast<const void*>(&gguf_decode_kernel<FMT, MT, false>);
#define QG_FORMAT_CASES(NAME, BLOCK, ELEMS) QG_GGUF_DECODE_MTILES(QG_CASE, QG_FORMAT_##NAME)
    QG_GGUF_FORMATS(QG_FORMAT_CASES)
#undef QG_FORMAT_CASES
#undef QG_CASE
    return nullptr;
}

}  // namespace gguf
}  // namespace qg
