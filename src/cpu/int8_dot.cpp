// panel_dot and panel_interleave (cpu/int8_kernels.h) at each ISA level, and the choice
// between them (cpu::int8_isa, once per process). Every level computes the arithmetic of
// int8_kernels.h: exact integer block sums D, then the same float32 operations per output
// in the same order, so all of them give the same bits (.ci/isa_check.sh).
//
//   scalar      plain C++, any CPU.
//   AVX2        w * q with vpmaddubsw, which needs an unsigned operand: |w| times q with
//               w's sign (vpsignb), products summed in int16 pairs for Int8Kind::i16_groups
//               k4 groups (no overflow: int8_decode.h), then widened by vpmaddwd (by the
//               q6_K sub-block scale where there is one). 4 activation rows x 8 weight rows.
//   AVX-512     vpdpbusd sums u8 x s8 products straight into int32: (w + 128) * q, minus
//   VNNI        128 * sum(q) (Q8Rows::S, S16). 4 activation rows x 16 weight rows.
// AMX tiles serve large M from their own driver (int8_amx.cpp).
#include <string.h>

#include <vector>

#include "cpu/cpu_isa.h"
#include "cpu/int8_avx2.h"
#include "cpu/int8_kernels.h"

#if QG_INT8_X86
#include <immintrin.h>
#endif

namespace qg {
namespace cpu {

namespace {

// ------------------------------------------------------------------ scalar

// Plain C++ for any CPU and any Int8Kind (the reference the vector kernels must match).
void dot_scalar(Int8Kind kind, const Panel& p, const Q8Rows& x, float* acc) {
    for (int64_t m = 0; m < x.m; ++m) {
        const int8_t* q = x.q + m * x.ldq;
        for (int r = 0; r < PANEL_ROWS; ++r) {
            float a = acc[m * PANEL_ROWS + r];
            for (int64_t b = 0; b < p.nb; ++b) {
                int32_t half[2] = {0, 0};  // k 0..15 and 16..31 of the block
                for (int g = 0; g < GROUPS; ++g) {
                    const int8_t* w = p.codes + ((b * GROUPS + g) * PANEL_ROWS + r) * 4;
                    const int8_t* v = q + b * Q8_BLOCK + 4 * g;
                    for (int i = 0; i < 4; ++i) {
                        const int wi = kind.offset < 0 ? (int)w[i] : (int)(uint8_t)w[i] - kind.offset;
                        half[g / 4] += wi * v[i];
                    }
                }
                int32_t d = half[0] + half[1];
                if (kind.sub) {
                    const int32_t* sc = p.sub + 2 * b * PANEL_ROWS + r;
                    d = (int16_t)sc[0] * half[0] + (int16_t)sc[PANEL_ROWS] * half[1];
                }
                const float s = p.sw[b * PANEL_ROWS + r] * x.dx[m * x.lds + b];
                a = a + (float)d * s;
                if (kind.mw) a = a - p.mw[b * PANEL_ROWS + r] * x.dS[m * x.lds + b];
            }
            acc[m * PANEL_ROWS + r] = a;
        }
    }
}

void interleave_scalar(const int8_t* rows, int64_t ld, int64_t nb, int8_t* codes) {
    for (int64_t b = 0; b < nb; ++b)
        for (int g = 0; g < GROUPS; ++g)
            for (int r = 0; r < PANEL_ROWS; ++r)
                memcpy(codes + ((b * GROUPS + g) * PANEL_ROWS + r) * 4, rows + r * ld + b * Q8_BLOCK + 4 * g, 4);
}

#if QG_INT8_HAVE_AVX2
// ------------------------------------------------------------------ AVX2

constexpr int AVX2_MR = 4;  // activation rows per pass of the signed kernel

inline QG_AVX2 __m256i bcast32(const int8_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// The float steps of one block for 8 panel rows: facc += float(d) * (sw * dx), minus the
// min term; d exact.
template <bool MW>
inline QG_AVX2 __m256 block_update(__m256 facc, __m256i d, const Panel& p, const Q8Rows& x, int64_t m, int64_t b,
                                   int h) {
    const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(p.sw + b * PANEL_ROWS + 8 * h), _mm256_set1_ps(x.dx[m * x.lds + b]));
    facc = _mm256_add_ps(facc, _mm256_mul_ps(_mm256_cvtepi32_ps(d), s));
    if (MW) {
        const __m256 mw = _mm256_loadu_ps(p.mw + b * PANEL_ROWS + 8 * h);
        facc = _mm256_sub_ps(facc, _mm256_mul_ps(mw, _mm256_set1_ps(x.dS[m * x.lds + b])));
    }
    return facc;
}

// Signed codes: rows 8h .. 8h + 7 of the panel against activation rows m0 .. m0 + MR - 1,
// |w| times q with w's sign.
template <int MR, int I16, bool SUB, bool MW>
QG_AVX2 void dot_avx2_signed(const Panel& p, const Q8Rows& x, int64_t m0, int h, float* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* q[MR];
    __m256 facc[MR];
    for (int i = 0; i < MR; ++i) {
        q[i] = x.q + (m0 + i) * x.ldq;
        facc[i] = _mm256_loadu_ps(acc + (m0 + i) * PANEL_ROWS + 8 * h);
    }
    for (int64_t b = 0; b < p.nb; ++b) {
        const int8_t* wb = p.codes + b * PANEL_BLOCK_BYTES + 32 * h;
        __m256i d32[MR];
        for (int i = 0; i < MR; ++i) d32[i] = _mm256_setzero_si256();
        for (int g0 = 0; g0 < GROUPS; g0 += I16) {
            __m256i a16[MR];
            for (int i = 0; i < MR; ++i) a16[i] = _mm256_setzero_si256();
            // not unrolled further: fully unrolled, GCC computed every product first and
            // spilled them to the stack
#pragma GCC unroll 2
            for (int g = g0; g < g0 + I16; ++g) {
                const __m256i w = _mm256_loadu_si256((const __m256i*)(wb + g * PANEL_ROWS * 4));
                const __m256i aw = _mm256_abs_epi8(w);
                for (int i = 0; i < MR; ++i) {
                    const __m256i xs = _mm256_sign_epi8(bcast32(q[i] + b * Q8_BLOCK + 4 * g), w);
                    a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(aw, xs));
                }
            }
            const __m256i scl =
                SUB ? _mm256_loadu_si256((const __m256i*)(p.sub + (2 * b + g0 / 4) * PANEL_ROWS + 8 * h)) : ones;
            for (int i = 0; i < MR; ++i) d32[i] = _mm256_add_epi32(d32[i], _mm256_madd_epi16(a16[i], scl));
        }
        for (int i = 0; i < MR; ++i) facc[i] = block_update<MW>(facc[i], d32[i], p, x, m0 + i, b, h);
    }
    for (int i = 0; i < MR; ++i) _mm256_storeu_ps(acc + (m0 + i) * PANEL_ROWS + 8 * h, facc[i]);
}

// Unsigned codes u = w + OFF: all 16 panel rows (two ymm per k4 group) against activation
// rows m0 .. m0 + MR - 1, each activation broadcast once for both; D = sum(u q) - OFF * S.
// MR <= 2 keeps the float accumulators in registers too (4 x 3 of the 16 ymm); 4 rows
// with the accumulators in memory took 86 ms of CPU time where this takes 68 (one thread,
// q4_K 7168x4096, M = 64).
template <int MR, int I16, bool MW, int OFF>
QG_AVX2 void dot_avx2_unsigned(const Panel& p, const Q8Rows& x, int64_t m0, float* acc) {
    static_assert(MR <= 2, "register budget");
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* q[MR];
    __m256 facc[MR][2];
    for (int i = 0; i < MR; ++i) {
        q[i] = x.q + (m0 + i) * x.ldq;
        for (int h = 0; h < 2; ++h) facc[i][h] = _mm256_loadu_ps(acc + (m0 + i) * PANEL_ROWS + 8 * h);
    }
    for (int64_t b = 0; b < p.nb; ++b) {
        const int8_t* wb = p.codes + b * PANEL_BLOCK_BYTES;
        __m256i d32[MR][2];
        for (int i = 0; i < MR; ++i) d32[i][0] = d32[i][1] = _mm256_setzero_si256();
        for (int g0 = 0; g0 < GROUPS; g0 += I16) {
            __m256i a16[MR][2];
            for (int i = 0; i < MR; ++i) a16[i][0] = a16[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int g = g0; g < g0 + I16; ++g) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i*)(wb + g * PANEL_ROWS * 4));
                const __m256i w1 = _mm256_loadu_si256((const __m256i*)(wb + g * PANEL_ROWS * 4 + 32));
                for (int i = 0; i < MR; ++i) {
                    const __m256i xb = bcast32(q[i] + b * Q8_BLOCK + 4 * g);
                    a16[i][0] = _mm256_add_epi16(a16[i][0], _mm256_maddubs_epi16(w0, xb));
                    a16[i][1] = _mm256_add_epi16(a16[i][1], _mm256_maddubs_epi16(w1, xb));
                }
            }
            for (int i = 0; i < MR; ++i)
                for (int h = 0; h < 2; ++h) d32[i][h] = _mm256_add_epi32(d32[i][h], _mm256_madd_epi16(a16[i][h], ones));
        }
        for (int i = 0; i < MR; ++i) {
            const __m256i corr = _mm256_set1_epi32(OFF * x.S[(m0 + i) * x.lds + b]);
            for (int h = 0; h < 2; ++h)
                facc[i][h] = block_update<MW>(facc[i][h], OFF ? _mm256_sub_epi32(d32[i][h], corr) : d32[i][h], p, x,
                                              m0 + i, b, h);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(acc + (m0 + i) * PANEL_ROWS + 8 * h, facc[i][h]);
}

template <int I16, bool SUB, bool MW, int OFF>
QG_AVX2 void dot_avx2(const Panel& p, const Q8Rows& x, float* acc) {
    int64_t m0 = 0;
    if (OFF < 0) {
        for (; m0 + AVX2_MR <= x.m; m0 += AVX2_MR)
            for (int h = 0; h < 2; ++h) dot_avx2_signed<AVX2_MR, I16, SUB, MW>(p, x, m0, h, acc);
        for (int h = 0; h < 2; ++h) {
            switch (x.m - m0) {
                case 3: dot_avx2_signed<3, I16, SUB, MW>(p, x, m0, h, acc); break;
                case 2: dot_avx2_signed<2, I16, SUB, MW>(p, x, m0, h, acc); break;
                case 1: dot_avx2_signed<1, I16, SUB, MW>(p, x, m0, h, acc); break;
                default: break;
            }
        }
    } else {
        constexpr int off = OFF < 0 ? 0 : OFF;
        for (; m0 + 2 <= x.m; m0 += 2) dot_avx2_unsigned<2, I16, MW, off>(p, x, m0, acc);
        if (m0 < x.m) dot_avx2_unsigned<1, I16, MW, off>(p, x, m0, acc);
    }
}

// Row-major codes of 8 rows x one block -> the panel's k4 groups (store_k4_groups).
QG_AVX2 void interleave_8rows(const int8_t* rows, int64_t ld, int8_t* out /* group 0, row 0 */) {
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
        const int8_t *r = rows + i * ld, *r4 = rows + (i + 4) * ld;
        lo[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)r)),
                                        _mm_loadu_si128((const __m128i*)r4), 1);
        hi[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(r + 16))),
                                        _mm_loadu_si128((const __m128i*)(r4 + 16)), 1);
    }
    store_k4_groups(lo, hi, out);
}

QG_AVX2 void interleave_avx2(const int8_t* rows, int64_t ld, int64_t nb, int8_t* codes) {
    for (int64_t b = 0; b < nb; ++b)
        for (int h = 0; h < 2; ++h)
            interleave_8rows(rows + 8 * h * ld + b * Q8_BLOCK, ld, codes + b * PANEL_BLOCK_BYTES + 32 * h);
}
#endif  // QG_INT8_HAVE_AVX2

#if QG_INT8_HAVE_AVX512
// ------------------------------------------------------------------ AVX-512 VNNI

// GCC 12 warns about its own _mm512_undefined_ps (self-initialised on purpose) inside
// _mm512_cvtepi32_ps: a false positive, silenced for this section only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr int VNNI_MR = 4;

// All 16 panel rows (one zmm per k4 group) against activation rows m0 .. m0 + MR - 1.
// vpdpbusd(acc, u, q) adds u[4l + j] * q[4l + j] over j into lane l, u unsigned: the stored
// code (Int8Kind::offset >= 0) or w + 128 (w xor 0x80), and the block's offset * sum(q) is
// taken off once.
template <int MR, bool SUB, bool MW, int OFF>
QG_AVX512 void dot_vnni_rows(const Panel& p, const Q8Rows& x, int64_t m0, float* acc) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    constexpr int32_t off = OFF < 0 ? 128 : OFF;
    const int8_t* q[MR];
    __m512 facc[MR];
    for (int i = 0; i < MR; ++i) {
        q[i] = x.q + (m0 + i) * x.ldq;
        facc[i] = _mm512_loadu_ps(acc + (m0 + i) * PANEL_ROWS);
    }
    for (int64_t b = 0; b < p.nb; ++b) {
        const int8_t* wb = p.codes + b * PANEL_BLOCK_BYTES;
        __m512i d32[MR];
        for (int u = 0; u < (SUB ? 2 : 1); ++u) {  // q6_K: the block's two 16-element halves apart
            const int g_end = SUB ? 4 * u + 4 : GROUPS;
            __m512i s32[MR];
            for (int i = 0; i < MR; ++i) s32[i] = _mm512_setzero_si512();
            for (int g = SUB ? 4 * u : 0; g < g_end; ++g) {
                __m512i w = _mm512_loadu_si512(wb + g * PANEL_ROWS * 4);
                if (OFF < 0) w = _mm512_xor_si512(w, flip);
                for (int i = 0; i < MR; ++i) {
                    int32_t v;
                    memcpy(&v, q[i] + b * Q8_BLOCK + 4 * g, 4);
                    s32[i] = _mm512_dpbusd_epi32(s32[i], w, _mm512_set1_epi32(v));
                }
            }
            for (int i = 0; i < MR; ++i) {
                if (SUB) {
                    const int32_t sum16 = x.S16[(m0 + i) * 2 * x.lds + 2 * b + u];
                    const __m512i part = _mm512_sub_epi32(s32[i], _mm512_set1_epi32(off * sum16));
                    const __m512i sc = _mm512_srai_epi32(
                        _mm512_loadu_si512(p.sub + (2 * b + u) * PANEL_ROWS), 16);  // sc in the high half
                    const __m512i t = _mm512_mullo_epi32(part, sc);
                    d32[i] = u == 0 ? t : _mm512_add_epi32(d32[i], t);
                } else {
                    d32[i] = _mm512_sub_epi32(s32[i], _mm512_set1_epi32(off * x.S[(m0 + i) * x.lds + b]));
                }
            }
        }
        const __m512 sw = _mm512_loadu_ps(p.sw + b * PANEL_ROWS);
        for (int i = 0; i < MR; ++i) {
            const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(x.dx[(m0 + i) * x.lds + b]));
            facc[i] = _mm512_add_ps(facc[i], _mm512_mul_ps(_mm512_cvtepi32_ps(d32[i]), s));
            if (MW) {
                const __m512 mw = _mm512_loadu_ps(p.mw + b * PANEL_ROWS);
                facc[i] = _mm512_sub_ps(facc[i], _mm512_mul_ps(mw, _mm512_set1_ps(x.dS[(m0 + i) * x.lds + b])));
            }
        }
    }
    for (int i = 0; i < MR; ++i) _mm512_storeu_ps(acc + (m0 + i) * PANEL_ROWS, facc[i]);
}

template <bool SUB, bool MW, int OFF>
QG_AVX512 void dot_vnni(const Panel& p, const Q8Rows& x, float* acc) {
    int64_t m0 = 0;
    for (; m0 + VNNI_MR <= x.m; m0 += VNNI_MR) dot_vnni_rows<VNNI_MR, SUB, MW, OFF>(p, x, m0, acc);
    switch (x.m - m0) {
        case 3: dot_vnni_rows<3, SUB, MW, OFF>(p, x, m0, acc); break;
        case 2: dot_vnni_rows<2, SUB, MW, OFF>(p, x, m0, acc); break;
        case 1: dot_vnni_rows<1, SUB, MW, OFF>(p, x, m0, acc); break;
        default: break;
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // QG_INT8_HAVE_AVX512

// ------------------------------------------------------------------ choice

using DotFn = void (*)(const Panel&, const Q8Rows&, float*);

// The Int8Kind values the formats use (int8_decode.h); any other runs the scalar kernel.
#define QG_INT8_KINDS(X) \
    X(1, false, false, -1) X(2, false, false, -1) X(4, true, false, -1) X(8, false, false, 8) X(8, false, true, 0) \
    X(4, false, false, 12) X(4, false, false, 15)

struct KindFn {
    Int8Kind kind;
    DotFn fn;
};

#if QG_INT8_HAVE_AVX512
#define QG_VNNI_FN(SUB, MW, OFF) &dot_vnni<SUB, MW, OFF>
#else
#define QG_VNNI_FN(SUB, MW, OFF) nullptr
#endif
#if QG_INT8_HAVE_AVX2
#define QG_AVX2_FN(I16, SUB, MW, OFF) &dot_avx2<I16, SUB, MW, OFF>
#else
#define QG_AVX2_FN(I16, SUB, MW, OFF) nullptr
#endif

// One function per kind at this process's ISA level (null: the scalar kernel).
std::vector<KindFn> kernels() {
    const Isa isa = int8_isa();
    std::vector<KindFn> out;
#define QG_K(I16, SUB, MW, OFF)                                                                \
    out.push_back({Int8Kind{I16, SUB, MW, OFF},                                                \
                   QG_INT8_HAVE_AVX512 && isa >= Isa::AVX512_VNNI ? QG_VNNI_FN(SUB, MW, OFF)   \
                   : QG_INT8_HAVE_AVX2 && isa >= Isa::AVX2        ? QG_AVX2_FN(I16, SUB, MW, OFF) \
                                                                  : nullptr});
    QG_INT8_KINDS(QG_K)
#undef QG_K
    return out;
}

}  // namespace

void panel_dot(Int8Kind kind, const Panel& p, const Q8Rows& x, float* acc) {
#if QG_INT8_HAVE_AMX
    static const bool amx = int8_isa() >= Isa::AMX;
    const int64_t tiled = amx ? x.m - x.m % AMX_MIN_M : 0;
    if (tiled > 0 && panel_dot_amx(kind, p, x, tiled, acc)) {
        if (tiled == x.m) return;
        Q8Rows rest = x;  // the last x.m % AMX_MIN_M rows, on AVX-512 VNNI
        rest.q += tiled * x.ldq;
        rest.dx += tiled * x.lds;
        rest.dS += tiled * x.lds;
        rest.S += tiled * x.lds;
        rest.S16 += 2 * tiled * x.lds;
        rest.m = x.m - tiled;
        return panel_dot(kind, p, rest, acc + tiled * PANEL_ROWS);
    }
#endif
    static const std::vector<KindFn> table = kernels();
    for (const KindFn& k : table) {
        if (k.kind.i16_groups == kind.i16_groups && k.kind.sub == kind.sub && k.kind.mw == kind.mw &&
            k.kind.offset == kind.offset && k.fn != nullptr)
            return k.fn(p, x, acc);
    }
    dot_scalar(kind, p, x, acc);
}

void panel_interleave(const int8_t* rows, int64_t ld, int64_t nb, int8_t* codes) {
#if QG_INT8_HAVE_AVX2
    static const bool avx2 = int8_isa() >= Isa::AVX2;
    if (avx2) return interleave_avx2(rows, ld, nb, codes);
#endif
    interleave_scalar(rows, ld, nb, codes);
}

}  // namespace cpu
}  // namespace qg
