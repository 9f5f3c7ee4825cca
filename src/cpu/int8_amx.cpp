// The panel kernel on AMX-INT8 tiles (int8_kernels.h; panel_dot sends here when
// cpu::int8_isa() is AMX and M >= AMX_MIN_M). A panel block is exactly an AMX B tile: 8
// rows (k4 groups) of 64 bytes (16 weight rows x 4 codes). Per block and 32 activation
// rows: two A tiles (16 rows x the block's 32 codes each), one B tile, two C tiles of
// int32 block sums D (tdpbssd for signed codes, tdpbsud for the unsigned ones, minus
// offset * S), stored and then scaled with AVX-512 in the arithmetic of int8_kernels.h:
// exact D, the same float32 steps, so the same bits as every other level. q6_K (two
// integer sub-block scales per block) stays on AVX-512 VNNI.
//
// Tiles: tmm0, tmm1 = C (16 x 16 int32), tmm2, tmm3 = A (16 x 32 bytes), tmm4 = B (8 x 64 bytes)
// (palette 1; the Intel AMX chapter of the Intel SDM, vol. 1). Each call loads its tile
// configuration and releases the tiles on return.
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

QG_AMX void configure() {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 2; ++t) c.rows[t] = 16, c.colsb[t] = 64;                 // C
    for (int t = 2; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = Q8_BLOCK;           // A
    c.rows[4] = GROUPS, c.colsb[4] = PANEL_ROWS * 4;                             // B
    load_tile_config(c);
}

template <int OFF, bool MW>
QG_AMX void dot_amx_rows(const Panel& p, const Q8Rows& x, int64_t rows, float* acc) {
    alignas(64) int32_t d[AMX_MIN_M * PANEL_ROWS];
    configure();
    for (int64_t m0 = 0; m0 < rows; m0 += AMX_MIN_M) {
        for (int64_t b = 0; b < p.nb; ++b) {
            _tile_loadd(2, x.q + m0 * x.ldq + b * Q8_BLOCK, x.ldq);
            _tile_loadd(3, x.q + (m0 + 16) * x.ldq + b * Q8_BLOCK, x.ldq);
            _tile_loadd(4, p.codes + b * PANEL_BLOCK_BYTES, PANEL_ROWS * 4);
            _tile_zero(0);
            _tile_zero(1);
            if (OFF < 0) {  // activations (A) signed, codes (B) signed
                _tile_dpbssd(0, 2, 4);
                _tile_dpbssd(1, 3, 4);
            } else {        // ... codes unsigned
                _tile_dpbsud(0, 2, 4);
                _tile_dpbsud(1, 3, 4);
            }
            _tile_stored(0, d, PANEL_ROWS * 4);
            _tile_stored(1, d + 16 * PANEL_ROWS, PANEL_ROWS * 4);
            const __m512 sw = _mm512_loadu_ps(p.sw + b * PANEL_ROWS);
            for (int i = 0; i < AMX_MIN_M; ++i) {
                const int64_t m = m0 + i;
                __m512i v = _mm512_load_si512(d + i * PANEL_ROWS);
                if (OFF > 0) v = _mm512_sub_epi32(v, _mm512_set1_epi32(OFF * x.S[m * x.lds + b]));
                const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(x.dx[m * x.lds + b]));
                __m512 a = _mm512_loadu_ps(acc + m * PANEL_ROWS);
                a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(v), s));
                if (MW)
                    a = _mm512_sub_ps(a, _mm512_mul_ps(_mm512_loadu_ps(p.mw + b * PANEL_ROWS),
                                                       _mm512_set1_ps(x.dS[m * x.lds + b])));
                _mm512_storeu_ps(acc + m * PANEL_ROWS, a);
            }
        }
    }
    _tile_release();
}

}  // namespace

// The kinds without sub-block scales (int8_decode.h); false if it cannot serve this one.
QG_AMX bool panel_dot_amx(Int8Kind kind, const Panel& p, const Q8Rows& x, int64_t rows, float* acc) {
    if (kind.sub) return false;
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
