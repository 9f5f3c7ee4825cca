// The panel kernel on AMX-INT8 tiles (int8_kernels.h; panel_dot sends here when
// cpu::int8_isa() is AMX and M >= AMX_MIN_M). A panel block is exactly an AMX B tile: 8
// rows (k4 groups) of 64 bytes (16 weight rows x 4 codes). Per block and 16 activation
// rows: one A tile (16 rows x the block's 32 codes), one B tile, one C tile of int32
// block sums D (tdpbssd: unsigned codes are made signed first, so D needs no offset * S),
// stored and then scaled with AVX-512 in the arithmetic of int8_kernels.h: exact D, the
// same float32 steps, so the same bits as every other level. q6_K (an integer scale per
// 16-element half of a block) takes each half apart: tiles of K = 16 (dot_amx_sub), its
// two exact half sums times their scales, exactly, as on AVX-512 VNNI.
//
// Tiles (palette 1; the Intel AMX chapter of the Intel SDM, vol. 1):
//   dot_amx_rows: tmm0, tmm1 = C (16 x 16 int32), tmm2, tmm3 = A (16 x 32 bytes), tmm4,
//                 tmm5 = B (8 x 64 bytes): blocks alternate between (0, 2, 4) and (1, 3, 5);
//   dot_amx_sub:  tmm0, tmm1 = C (half 0 / 1), tmm2, tmm3 = A (16 x 16 bytes: one half),
//                 tmm4, tmm5 = B (4 x 64 bytes: the half's 4 k4 groups).
// Each call loads its tile configuration and releases the tiles on return.
#include "cpu/int8_kernels.h"

#if QG_INT8_HAVE_AMX
#include <immintrin.h>
#include <string.h>

// GCC 12 warns about its own _mm512_undefined_ps (self-initialised on purpose) inside
// _mm512_cvtepi32_ps: a false positive (as in int8_dot.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace qg {
namespace cpu {

namespace {

#define QG_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// ldtilecfg's 64-byte operand (SDM: palette, start row, 16 x bytes per row, 16 x rows)
struct alignas(64) TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// ldtilecfg with the whole 64 bytes as its operand: GCC 12's _tile_loadconfig names only
// the first 8 (an "m" operand of *(const void**)), so its dead-store elimination may drop
// the rows / colsb stores (it did in a non-inlined configure() at -O2: every tile 0 x 0,
// and the first tileloadd raised SIGILL).
QG_AMX inline void load_tile_config(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" ::"m"(c)); }

// Loads a palette-1 configuration of tiles 0 .. n - 1, tile t rows[t] x colsb[t] bytes.
QG_AMX void configure(int n, const uint8_t* rows, const uint16_t* colsb) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < n; ++t) c.rows[t] = rows[t], c.colsb[t] = colsb[t];
    load_tile_config(c);
}

constexpr int HALF = Q8_BLOCK / 2;  // elements of K per q6_K sub-block scale

// Rows per pass of dot_amx_rows: one C tile's, so that their float32 accumulators stay in
// 16 zmm registers across the K chunk (with 32 rows a pass they went through memory).
constexpr int AMX_PASS = 16;

// Block b's tile work for activation rows q .. q + 15 into d: A, B and C tiles of parity
// T (0 or 1: blocks alternate between tiles 0, 2, 4 and 1, 3, 5), B signed, so tdpbssd's
// int32 sums are D itself.
template <int T>
QG_AMX inline void block_tiles(const int8_t* q, int64_t ldq, const int8_t* wb, int32_t* d) {
    // the tile intrinsics take their tile numbers as literals (GCC pastes them into the asm)
    if constexpr (T == 0) {
        _tile_loadd(2, q, ldq);
        _tile_loadd(4, wb, PANEL_ROWS * 4);
        _tile_zero(0);
        _tile_dpbssd(0, 2, 4);
        _tile_stored(0, d, PANEL_ROWS * 4);
    } else {
        _tile_loadd(3, q, ldq);
        _tile_loadd(5, wb, PANEL_ROWS * 4);
        _tile_zero(1);
        _tile_dpbssd(1, 3, 5);
        _tile_stored(1, d, PANEL_ROWS * 4);
    }
}

// The float32 steps of block b (int8_kernels.h) for the pass's 16 rows from their sums d;
// dx, dS: the first row's activation scale and dx * S of the block, row i's at i * lds.
template <bool MW>
QG_AMX inline void block_update(__m512* a, const int32_t* d, const Panel& p, const float* dx, const float* dS,
                                int64_t lds, int64_t b) {
    const __m512 sw = _mm512_loadu_ps(p.sw + b * PANEL_ROWS);
    const __m512 mw = MW ? _mm512_loadu_ps(p.mw + b * PANEL_ROWS) : sw;
#pragma GCC unroll 16  // a[] in registers (GCC kept q4_K's rolled, a[] on the stack)
    for (int i = 0; i < AMX_PASS; ++i) {
        const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(dx[i * lds]));
        a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(d + i * PANEL_ROWS)), s));
        if (MW) a[i] = _mm512_sub_ps(a[i], _mm512_mul_ps(mw, _mm512_set1_ps(dS[i * lds])));
    }
}

// Blocks as tdpbssd tiles: 16 activation rows a pass (AMX_PASS) with their accumulators in
// registers over the whole chunk, block b + 1's tile work (loads, tdpbssd, the store of its
// sums) issued before block b's float steps, in the other set of tiles and sum buffer.
// Unsigned codes (u = w + OFF) are made signed once a call (w = u - OFF, in -15..15 for the
// kinds of int8_decode.h), so tdpbssd's sums are D without the OFF * S correction: the same
// integers. Against 32-row passes with the accumulators in memory and the sums stored after
// each block (bench/NOTES.md, session 50; q4_0 1024 x 3584 M = 256, 2 threads, in process):
// the whole call 3.5 -> 2.1-2.2 ms. Knock-outs put its tile work at ~1.0 ms and its float
// steps at ~0.7: they still barely overlap.
template <int OFF, bool MW>
QG_AMX void dot_amx_rows(const Panel& p, const Q8Rows& x, int64_t rows, float* acc) {
    alignas(64) int32_t d[2][AMX_PASS * PANEL_ROWS];
    alignas(64) int8_t signed_codes[OFF > 0 ? AMX_MAX_NB * PANEL_BLOCK_BYTES : 64];
    const int8_t* codes = p.codes;
    if constexpr (OFF > 0) {
        const __m512i off = _mm512_set1_epi8((char)OFF);
        for (int64_t i = 0; i < p.nb * PANEL_BLOCK_BYTES; i += 64)
            _mm512_store_si512(signed_codes + i, _mm512_sub_epi8(_mm512_loadu_si512(p.codes + i), off));
        codes = signed_codes;
    }
    static const uint8_t rows_of[] = {AMX_PASS, AMX_PASS, AMX_PASS, AMX_PASS, GROUPS, GROUPS};  // C C A A B B
    static const uint16_t colsb_of[] = {64, 64, Q8_BLOCK, Q8_BLOCK, PANEL_ROWS * 4, PANEL_ROWS * 4};
    configure(6, rows_of, colsb_of);
    for (int64_t m0 = 0; m0 < rows; m0 += AMX_PASS) {
        const int8_t* q = x.q + m0 * x.ldq;
        __m512 a[AMX_PASS];
#pragma GCC unroll 16
        for (int i = 0; i < AMX_PASS; ++i) a[i] = _mm512_loadu_ps(acc + (m0 + i) * PANEL_ROWS);
        block_tiles<0>(q, x.ldq, codes, d[0]);
        for (int64_t b = 0; b < p.nb; b += 2) {  // b even: tiles and sums of set 0, b + 1: set 1
            if (b + 1 < p.nb)
                block_tiles<1>(q + (b + 1) * Q8_BLOCK, x.ldq, codes + (b + 1) * PANEL_BLOCK_BYTES, d[1]);
            block_update<MW>(a, d[0], p, x.dx + m0 * x.lds + b, x.dS + m0 * x.lds + b, x.lds, b);
            if (b + 1 >= p.nb) break;
            if (b + 2 < p.nb)
                block_tiles<0>(q + (b + 2) * Q8_BLOCK, x.ldq, codes + (b + 2) * PANEL_BLOCK_BYTES, d[0]);
            block_update<MW>(a, d[1], p, x.dx + m0 * x.lds + b + 1, x.dS + m0 * x.lds + b + 1, x.lds, b + 1);
        }
#pragma GCC unroll 16
        for (int i = 0; i < AMX_PASS; ++i) _mm512_storeu_ps(acc + (m0 + i) * PANEL_ROWS, a[i]);
    }
    _tile_release();
}

// q6_K, one block b for 16 activation rows q: h = the exact int32 sums of its two halves
// (tdpbssd on K = 16: both operands signed), h[0 .. 255] half 0, h[256 ..] half 1, a row
// of 16 weight rows each. dot_vnni_rows forms the same h0, h1 (as (w + 128) * q minus
// 128 * S16), so sub_update's D is its D: the same bits.
QG_AMX inline void sub_tiles(const int8_t* q, int64_t ldq, const int8_t* wb /* block b's codes */, int32_t* h) {
    _tile_loadd(2, q, ldq);                                      // half 0's activations
    _tile_loadd(3, q + HALF, ldq);                               // half 1's
    _tile_loadd(4, wb, PANEL_ROWS * 4);                          // k4 groups 0..3: half 0
    _tile_loadd(5, wb + PANEL_BLOCK_BYTES / 2, PANEL_ROWS * 4);  // k4 groups 4..7: half 1
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, h, PANEL_ROWS * 4);
    _tile_stored(1, h + AMX_PASS * PANEL_ROWS, PANEL_ROWS * 4);
}

// The float32 steps of block b for the pass's 16 rows from their half sums h (sub_tiles);
// dx[i * lds] is row i's activation scale. D = sc0 h0 + sc1 h1 is formed in float32,
// exactly: |h| <= 16 * 32 * 127 (q6_K codes -32..31, activation codes -127..127), |sc| <=
// 128, so each product and their sum are integers below 2^24 and float(D) is that sum --
// the value dot_vnni_rows converts from its int32 D (vpmulld, 2 uops on one port a row and
// half, was the slower form: 3.3 against 2.8 ns a row and block, one thread,
// bench/NOTES.md session 38).
QG_AMX inline void sub_update(__m512* a, const int32_t* h, const Panel& p, const float* dx, int64_t lds,
                              int64_t b) {
    // the scales sit in both 16-bit halves of p.sub (for vpmaddwd): the high one, signed
    const __m512 sc0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_loadu_si512(p.sub + 2 * b * PANEL_ROWS), 16));
    const __m512 sc1 =
        _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_loadu_si512(p.sub + (2 * b + 1) * PANEL_ROWS), 16));
    const __m512 sw = _mm512_loadu_ps(p.sw + b * PANEL_ROWS);
    const int32_t* h1 = h + AMX_PASS * PANEL_ROWS;
#pragma GCC unroll 16
    for (int i = 0; i < AMX_PASS; ++i) {
        const __m512 d = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(h + i * PANEL_ROWS)), sc0),
                                       _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(h1 + i * PANEL_ROWS)), sc1));
        const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(dx[i * lds]));
        a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(d, s));
    }
}

// q6_K on tiles, as dot_amx_rows: 16 activation rows a pass with their accumulators in
// registers, block b + 1's tile work issued before block b's float steps (one set of tiles:
// a block takes six; its sums alternate between two buffers). Against 32-row passes with the
// accumulators in memory: bench/NOTES.md, session 50.
QG_AMX void dot_amx_sub(const Panel& p, const Q8Rows& x, int64_t rows, float* acc) {
    alignas(64) int32_t h[2][2 * AMX_PASS * PANEL_ROWS];  // [buffer][half][activation row][weight row]
    static const uint8_t rows_of[] = {AMX_PASS, AMX_PASS, AMX_PASS, AMX_PASS, HALF / 4, HALF / 4};  // C C A A B B
    static const uint16_t colsb_of[] = {64, 64, HALF, HALF, PANEL_ROWS * 4, PANEL_ROWS * 4};
    configure(6, rows_of, colsb_of);
    for (int64_t m0 = 0; m0 < rows; m0 += AMX_PASS) {
        const int8_t* q = x.q + m0 * x.ldq;
        const float* dx = x.dx + m0 * x.lds;
        __m512 a[AMX_PASS];
#pragma GCC unroll 16
        for (int i = 0; i < AMX_PASS; ++i) a[i] = _mm512_loadu_ps(acc + (m0 + i) * PANEL_ROWS);
        sub_tiles(q, x.ldq, p.codes, h[0]);
        for (int64_t b = 0; b < p.nb; ++b) {
            if (b + 1 < p.nb)
                sub_tiles(q + (b + 1) * Q8_BLOCK, x.ldq, p.codes + (b + 1) * PANEL_BLOCK_BYTES, h[(b + 1) & 1]);
            sub_update(a, h[b & 1], p, dx + b, x.lds, b);
        }
#pragma GCC unroll 16
        for (int i = 0; i < AMX_PASS; ++i) _mm512_storeu_ps(acc + (m0 + i) * PANEL_ROWS, a[i]);
    }
    _tile_release();
}

}  // namespace

// Every kind of int8_decode.h; false if it cannot serve this one.
QG_AMX bool panel_dot_amx(Int8Kind kind, const Panel& p, const Q8Rows& x, int64_t rows, float* acc) {
    if (p.nb > AMX_MAX_NB) return false;  // dot_amx_rows's signed copy holds AMX_MAX_NB blocks
    if (kind.sub) {
        if (kind.offset >= 0 || kind.mw) return false;  // q6_K's codes are signed, no min term
        dot_amx_sub(p, x, rows, acc);
        return true;
    }
#define QG_K(OFF, MW)                                   \
    if (kind.offset == OFF && kind.mw == MW) {          \
        dot_amx_rows<OFF, MW>(p, x, rows, acc);         \
        return true;                                    \
    }
    QG_K(-1, false) QG_K(8, false) QG_K(0, true) QG_K(12, false) QG_K(15, false)
#undef QG_K
    return false;
}

}  // namespace cpu
}  // namespace qg
#endif  // QG_INT8_HAVE_AMX
