// The small-M kernels of the int8 path (int8_kernels.h, rows_*): weight rows read in their
// own layout and decoded in registers, a pass of rows at a time, against M <= ROWS_M
// activation rows. At M = 1 a weight is used once, so decoding it to a panel first (a store
// and a load of every code, and a transpose) cost more than the multiply: one thread, q4_K
// 7168x4096, 7.5 ms of CPU time through the panel against 3.9 here.
//
// Lanes run along K here. Each 128-bit lane of a vector holds 16 codes of one weight row:
// on ymm rows r and r + 4 (8 rows a pass), on zmm rows r, r + 4, r + 8 and r + 12 (16 rows,
// the whole panel); so a pass is 4 such vectors, and a transpose-and-add of their products
// within the lanes gives the rows' exact block sums D, rows 4L .. 4L + 3 in lane L. From D
// on, the arithmetic is the panel kernels' (the same float32 operations in the same order):
// every copy gives the same bits. The decoders and the kernel are one source
// (int8_rows_decoders.inc, int8_rows_kernel.inc, over int8_simd.h), included once per copy:
//   avx2: ymm, vpmaddubsw (and the panels' AVX2 fill, panel_fill);
//   vnni: ymm, vpdpbusd;
//   zmm:  zmm, vpdpbusd.
#include <string.h>

#include <type_traits>

#include "cpu/int8_rows.h"

#include "cpu/cpu_isa.h"
#include "cpu/int8_avx2.h"
#include "cpu/int8_blocks.h"
#include "cpu/int8_simd.h"
#include "cpu/iq3_xxs_vbmi.h"

// GCC 12 warns about its own _mm512_undefined_* (self-initialised on purpose) inside the
// zmm intrinsics (broadcast, insert, unpack, convert): a false positive (as in int8_amx.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace qg {
namespace cpu {

#if QG_INT8_HAVE_AVX2
namespace {

// Prefetches line `off` of the row a pass further on (int8_rows.h, SRC_ROWS: on ymm this
// panel's next 8 rows or the next panel's first 8, on zmm the next panel's 16), which the
// next pass will read: without it every pass began with its rows cold (one q4_0 row of
// K = 4096 is 36 lines). Into L2 (prefetcht1), and nothing ahead within the pass's own rows:
// on a Zen 4 (bench/NOTES.md, "CPU int8 at M = 1 on a Zen 4: prefetch into L2") the L1
// prefetches (prefetcht0 of the next pass and of each row 1024 bytes ahead) left cold M = 1
// at about the kernel's time plus the weight's streaming time; into L2 it is about the
// larger of the two (14336 x 4096, 2 threads: q8_0 2.5 -> 1.8 ms, q6_K 2.3 -> 1.7, q4_0
// 1.5 -> 1.0-1.3). A Xeon measured prefetcht1 within its noise (session 37).
QG_AVX2_INLINE void prefetch_row(const void* next, int64_t off) { _mm_prefetch((const char*)next + off, _MM_HINT_T1); }
// The lines at byte off, off + 64, .. < end of base, into L2, the line step in a register (the
// empty asm): GCC's constant step (a chain of add $64) issued them in a burst that measured
// slower (the rows8 stream: bench/NOTES.md, "CPU q6_K repacked rows"; q8_0's linear prefetch:
// up to 1.3x, "CPU read bandwidth at M = 1"; why is a guess: prefetches issued faster).
QG_AVX2_INLINE void prefetch_range(const void* base, int64_t off, int64_t end) {
    int64_t line = 64;
    __asm__("" : "+r"(line));
    for (; off < end; off += line) prefetch_row(base, off);
}
// A pass of at most this many bytes (8 rows on ymm) also prefetches the rows two passes on
// (prefetch2, as prefetch: into L2), so that the rows a pass on are asked for twice, one
// pass apart. On the AMX Xeon of session 48 (bench/NOTES.md, "CPU int8 at M = 1 on the AMX
// Xeon"), cold M = 1 on 2 threads, K = 1280 (passes of 5.8-10.9 KB): q8_0 0.91-0.94 of the
// time with one pass ahead, q4_0 0.86-0.88, q6_K 0.95, mxfp4 0.87-0.89, int4 0.90-0.92,
// q4_K 0.96, iq4_xs 0.98; two passes ahead alone 0.96-1.0. Passes of 14-16 KB (K = 3584):
// mxfp4 0.93, q4_0 0.95, int4 0.975, iq4_xs 0.98, q4_K 1.0; of 21-45 KB (q8_0 and q6_K at
// K = 3584, K = 5376) 1.0-1.08: off there. A linear prefetch 16-64 KB ahead of the pass's
// start instead (rows consecutive in memory) measured 1.0-1.24: the prefetches row by row
// are what pays.
constexpr int64_t AHEAD2_BYTES = 16384;
// Where a pass is that short, q6_K and q8_0 (the ymm VNNI copy: rows_group, linear_ahead)
// prefetch the rows two passes on as one range in memory order, a step's share of it at each
// step, instead of each row's lines of the next two passes, where the rows are consecutive
// in memory (.gguf rows without gaps): the next pass was the pass after next one pass earlier.
// 2 threads read 8-row passes ~20 % faster that way in a microbenchmark with a load of
// compute between the lines; cold M = 1 on the AMX Xeon, K = 1280: q8_0 0.80-0.90 of the
// time, q6_K 0.90-0.97 (bench/NOTES.md, "CPU read bandwidth at M = 1").
// How far ahead a pass that is one range in memory (the rows8 layout: consecutive passes
// follow each other too) prefetches its own stream, in bytes. q6_K M = 1 cold on 2 threads,
// 4 KiB pages, against the blocks (bench/NOTES.md, "CPU q6_K repacked rows"): 24 KiB
// 4096 x 1280 0.68-0.80, 1024 x 3584 0.98-1.02, 1280 x 5376 0.87-1.09; one pass ahead
// (two where a pass is short, as the blocks do) 0.76-0.88, 1.04-1.10, 1.0-1.03.
constexpr int64_t STREAM_AHEAD_BYTES = 24576;

// Rows r (low 128 bits) and r + 4 (high) of 16 bytes each.
QG_AVX2_INLINE __m256i load2(const uint8_t* r, const uint8_t* r4) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)r)),
                                   _mm_loadu_si128((const __m128i*)r4), 1);
}
QG_AVX2_INLINE __m256i set2(int32_t a, int32_t b) { return _mm256_setr_epi32(a, a, a, a, b, b, b, b); }

// Lanes r of v whose exponent is not all ones (finite), as bits r of the result.
QG_AVX2_INLINE unsigned finite_mask(__m256 v) {
    const __m256 e = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, e), e, _CMP_NEQ_OQ));
}

// out[j] lane r = lane j of in[r] for j, r < 8 (8 x 8 floats transposed).
QG_AVX2_INLINE void transpose8(const __m256* in, __m256* out) {
    const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
    const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
    const __m256 t4 = _mm256_unpacklo_ps(in[4], in[5]), t5 = _mm256_unpackhi_ps(in[4], in[5]);
    const __m256 t6 = _mm256_unpacklo_ps(in[6], in[7]), t7 = _mm256_unpackhi_ps(in[6], in[7]);
    const __m256 u[8] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xee),
                         _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xee),
                         _mm256_shuffle_ps(t4, t6, 0x44), _mm256_shuffle_ps(t4, t6, 0xee),
                         _mm256_shuffle_ps(t5, t7, 0x44), _mm256_shuffle_ps(t5, t7, 0xee)};
    for (int j = 0; j < 4; ++j) {  // u[j]: rows 0..3 in the low half, 4..7 in the high, j and j + 4
        out[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        out[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

// The 16 bits at byte offset `off` of format block fb of rows r0 .. r0 + 7 (u16_rows), and
// those of an fp16 as 8 floats (f16_rows; F16C converts
// exactly, as f16_to_f32 does; a NaN's bits may differ, but a NaN scale sends its row to
// the fp32-exact path). Packed in general registers (the empty asm keeps GCC from turning
// it into vector inserts): the shuffle pipes are the busiest ones in this kernel, and 8
// vpinsrw cost 10 % of an M = 1 GEMM.
template <class F>
QG_AVX2_INLINE __m128i u16_rows(const F& f, int r0, int64_t fb, int off) {
    uint64_t h[2];
    for (int q = 0; q < 2; ++q) {
        uint64_t v = 0;
        for (int r = 0; r < 4; ++r) v |= (uint64_t)ld_u16(f.at(r0 + 4 * q + r, fb) + off) << (16 * r);
        __asm__("" : "+r"(v));
        h[q] = v;
    }
    return _mm_set_epi64x((long long)h[1], (long long)h[0]);
}
template <class F>
QG_AVX2_INLINE __m256 f16_rows(const F& f, int r0, int64_t fb, int off) {
    return _mm256_cvtph_ps(u16_rows(f, r0, fb, off));
}

// iq3_xxs's sign bits to byte masks (GgufRows<block_iq3_xxs>::codes): byte e of a lane
// takes byte 2k + e / 8 of the row's 32 sign bits (ksign_spread[k], elements 16k .. 16k + 15)
// and tests bit e % 8 of it (ksign_bit_mask).
alignas(16) const int8_t ksign_spread[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                                {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
alignas(16) const uint8_t ksign_bit_mask[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};

// int16 partial sums through the AVX2 kernel's add tree while 16 products fit: 16 * max|w|
// * 127 < 2^15 (no vpmaddwd until the block's sum)
template <class F>
constexpr bool rows_tree16() {
    return !F::SUB && 16 * F::MAX_CODE * 127 <= 32767;
}

// The copies of the decoders and the kernel. The AVX-512 VNNI copies (vpdpbusd) serve every
// format where the CPU has it (rows_kernel below); q6_K (sub-block scales) takes its own
// steps there (block_sums_sub; bench/NOTES.md, "q6_K on vpdpbusd"). On ymm, one thread,
// 2048 x 4096, Zen 5, best of 0.4-1.5 s: M = 1 iq4_xs 0.30 -> 0.26 ms, q4_K 0.30 -> 0.28,
// the rest even; M = 2 5-25 % faster (mxfp4 0.45 -> 0.37) than the AVX2 copy. The zmm copy
// runs where cpu::int8_rows_zmm() asks for it (it measured slower on a Xeon: cpu_isa.h).

namespace avx2 {
#define QG_ROWS_BITS 256
#define QG_ROWS_VNNI 0
#include "cpu/int8_rows_kernel.inc"
static_assert(GROUP == ROWS_GROUP, "ymm passes are ROWS_GROUP rows");

// Blocks J .. SUBS - 1 of format block fb into the panel, panel block index pb + J.
template <class F, int J>
QG_AVX2_INLINE void fill_steps(const F& f, int64_t fb, int64_t pb, int h, const float* sw, const float* mw,
                               const int32_t* sub, const PanelOut& out) {
    if constexpr (J < F::SUBS) {
        const int64_t b = pb + J;
        _mm256_storeu_ps(out.sw + b * PANEL_ROWS + 8 * h, _mm256_load_ps(sw + J * GROUP));
        if constexpr (F::MW) _mm256_storeu_ps(out.mw + b * PANEL_ROWS + 8 * h, _mm256_load_ps(mw + J * GROUP));
        if constexpr (F::SUB) {
            for (int u = 0; u < 2; ++u)
                for (int r = 0; r < GROUP; ++r) out.sub[(2 * b + u) * PANEL_ROWS + 8 * h + r] = sub[r * 16 + 2 * J + u];
        }
        __m256i lo[4], hi[4];
        for (int i = 0; i < 4; ++i) {
            f.template codes<J>(i, fb, lo[i], hi[i]);
            f.to_panel(i, sub, lo[i], hi[i]);
        }
        store_k4_groups(lo, hi, out.codes + b * PANEL_BLOCK_BYTES + 32 * h);
        fill_steps<F, J + 1>(f, fb, pb, h, sw, mw, sub, out);
    }
}

// Format blocks [fb0, fb0 + nfb) of the 8 rows of f into rows 8h .. 8h + 7 of a panel.
template <class F>
QG_AVX2 void panel_run(const F& f, int64_t fb0, int64_t nfb, int h, const PanelOut& out, bool* ok) {
    constexpr int S = F::SUBS;
    alignas(32) float sw[S * GROUP], mw[S * GROUP];
    alignas(32) int32_t sub[2 * S * GROUP];
    unsigned finite = (1u << GROUP) - 1;
    for (int64_t i = 0; i < nfb; ++i) {
        f.prefetch(fb0 + i);
        finite &= f.scales8(fb0 + i, sw, mw, sub);
        fill_steps<F, 0>(f, fb0 + i, i * S, h, sw, mw, sub, out);
    }
    for (int r = 0; r < GROUP; ++r) ok[8 * h + r] = ok[8 * h + r] && ((finite >> r) & 1u);
}

}  // namespace avx2

namespace vnni {
#define QG_ROWS_BITS 256
#define QG_ROWS_VNNI 1
#include "cpu/int8_rows_kernel.inc"
static_assert(GROUP == ROWS_GROUP, "ymm passes are ROWS_GROUP rows");
}  // namespace vnni

namespace zmm {
#define QG_ROWS_BITS 512
#define QG_ROWS_VNNI 1
#include "cpu/int8_rows_kernel.inc"
static_assert(GROUP == PANEL_ROWS, "a zmm pass is the whole panel");
}  // namespace zmm

}  // namespace
#endif  // QG_INT8_HAVE_AVX2

bool rows_available() {
#if QG_INT8_HAVE_AVX2
    static const bool avx2 = int8_isa() >= Isa::AVX2;
    return avx2;
#else
    return false;
#endif
}

// The rows kernel's vpdpbusd copies at AVX-512 VNNI and up (ymm, or zmm where
// int8_rows_zmm() says so).
[[maybe_unused]] static bool rows_vnni() {
    static const bool vnni = int8_isa() >= Isa::AVX512_VNNI;
    return vnni;
}

int64_t rows_max_m() {
    const bool vnni_panels = rows_vnni();  // the panels' dot is vpdpbusd too
    return vnni_panels ? 2 : 4;
}

// Without AVX2 the entry points are never called (rows_available() is false) and compile
// to nothing.
#if QG_INT8_HAVE_AVX2
namespace {
template <class Src>
void rows_entry(const Src& src, int count, int64_t nfb, const Q8Rows& x, float* acc, bool* ok) {
    if (int8_rows_zmm()) return zmm::rows_pass(src, 0, nfb, x, acc, ok);  // the whole panel
    for (int g0 = 0; g0 < count; g0 += ROWS_GROUP) {
        if (rows_vnni())
            vnni::rows_pass(src, g0, nfb, x, acc, ok);
        else
            avx2::rows_pass(src, g0, nfb, x, acc, ok);
    }
}
template <class Src>
void fill_entry(const Src& src, int64_t fb0, int64_t nfb, const PanelOut& out, bool* ok) {
    for (int h = 0; h < PANEL_ROWS / ROWS_GROUP; ++h)
        avx2::with_rows(src, ROWS_GROUP * h, [&](const auto& f) { avx2::panel_run(f, fb0, nfb, h, out, ok); });
}
}  // namespace
#define QG_ROWS_ENTRIES(SRC, ELEMS)                                                                     \
    void rows_kernel(const SRC& src, int count, int64_t K, const Q8Rows& x, float* acc, bool* ok) {    \
        rows_entry(src, count, K / (ELEMS), x, acc, ok);                                                  \
    }                                                                                                     \
    void panel_fill(const SRC& src, int64_t k0, int64_t kc, const PanelOut& out, bool* ok) {             \
        fill_entry(src, k0 / (ELEMS), kc / (ELEMS), out, ok);                                             \
    }
#else
#define QG_ROWS_ENTRIES(SRC, ELEMS)                                                             \
    void rows_kernel(const SRC&, int, int64_t, const Q8Rows&, float*, bool*) {}                 \
    void panel_fill(const SRC&, int64_t, int64_t, const PanelOut&, bool*) {}
#endif
#define QG_X(NAME, BLOCK, ELEMS) QG_ROWS_ENTRIES(GgufSrc<BLOCK>, ELEMS)
QG_GGUF_FORMATS(QG_X)
#undef QG_X
QG_ROWS_ENTRIES(Mxfp4Src, MXFP4_BLOCK)
QG_ROWS_ENTRIES(Int4Src, Q8_BLOCK)
#undef QG_ROWS_ENTRIES

}  // namespace cpu
}  // namespace qg
