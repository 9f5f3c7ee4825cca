// Activation quantization of the int8 path (see q8_act.h), compiled once per ISA level
// (cpu/clones.h). Every step is a float32 operation that rounds the same at any vector
// width, so every clone gives the same codes.
#include "cpu/q8_act.h"

#include <math.h>

#include <algorithm>

#include "cpu/clones.h"
#include "cpu/convert.h"
#include "cpu/cpu_isa.h"
#include "cpu/int8_avx2.h"
#include "cpu/int8_kernels.h"
#include "cpu/parallel.h"

namespace qg {
namespace cpu {

namespace {

// Round to nearest even for |t| <= 2^22: adding 1.5 * 2^23 leaves a float of spacing 1
// whose rounding is the IEEE one; subtracting it back is exact. Plain float32 adds (no
// -ffast-math), so it vectorises without SSE4.1's roundps and gives nearbyint's result.
constexpr float ROUND_MAGIC = 12582912.0f;  // 1.5 * 2^23
constexpr float Q8_MAX = 127.0f;

// One row: returns false if it holds a NaN or an infinity (its codes are then zeros).
QG_CPU_CLONES bool quantize_row(const float* __restrict__ v, int64_t k, int8_t* __restrict__ q,
                                float* __restrict__ dx, float* __restrict__ dS, int32_t* __restrict__ S,
                                int32_t* __restrict__ S16) {
    bool finite = true;
    for (int64_t j = 0; j < k / Q8_BLOCK; ++j) {
        const float* __restrict__ s = v + j * Q8_BLOCK;
        float amax = 0.0f;
        uint32_t special = 0;  // exponent all ones somewhere: NaN or inf
        for (int i = 0; i < Q8_BLOCK; ++i) {
            const float a = fabsf(s[i]);
            amax = a > amax ? a : amax;
            special |= (float_bits(a) >= 0x7f800000u) ? 1u : 0u;
        }
        int8_t* __restrict__ o = q + j * Q8_BLOCK;
        if (special != 0) {
            finite = false;
            for (int i = 0; i < Q8_BLOCK; ++i) o[i] = 0;
            dx[j] = dS[j] = 0.0f;
            S[j] = S16[2 * j] = S16[2 * j + 1] = 0;
            continue;
        }
        const float d = amax / Q8_MAX;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        int32_t sum[2] = {0, 0};
        for (int i = 0; i < Q8_BLOCK; ++i) {
            float t = s[i] * id;  // NaN only as 0 * inf (id = inf when 1/d overflows)
            t = t > Q8_MAX ? Q8_MAX : t;
            t = t < -Q8_MAX ? -Q8_MAX : t;
            const float r = (t + ROUND_MAGIC) - ROUND_MAGIC;
            const int c = r == r ? (int)r : 0;
            o[i] = (int8_t)c;
            sum[i / 16] += c;
        }
        dx[j] = d;
        S16[2 * j] = sum[0];
        S16[2 * j + 1] = sum[1];
        S[j] = sum[0] + sum[1];
        dS[j] = d * (float)S[j];
    }
    return finite;
}

#if QG_INT8_HAVE_AVX2
// quantize_row on ymm, reading x in its own dtype (AVX2 and up, int8_isa() >= AVX2). GCC
// left quantize_row scalar at every clone (its per-block amax, the NaN guard and the
// halves' sums), 3.3 ns an element: a third of an M = 256 GEMM (q4_0 1024 x 3584, 2 threads,
// 1.45 of 4.4 ms) and ~10 us of an M = 1 one at K = 3584 (bench/NOTES.md, session 50).
// The same float32 operations on each element, so the same codes and scales:
//   widening bf16 (a shift) and fp16 (vcvtph2ps) is exact, as to_float_row's;
//   amax by vmaxps in any order (max is exact); d and id by vdivps on a splat of amax;
//   the clamp by vminps(127, t) / vmaxps(-127, t), which return t when t is NaN, as the
//   scalar compares do; rounding by the same ROUND_MAGIC adds (not vcvtps2dq's rounding:
//   the same only in the default rounding mode); a NaN (0 * inf) to code 0.
template <qg_dtype DT>
QG_AVX2_INLINE __m256 load8(const void* src, int64_t i) {
    if constexpr (DT == QG_DTYPE_F32) {
        return _mm256_loadu_ps((const float*)src + i);
    } else {
        const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)src + i));
        if constexpr (DT == QG_DTYPE_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
    }
}

template <qg_dtype DT>
QG_AVX2 bool quantize_row_avx2(const void* src, int64_t k, int8_t* __restrict__ q, float* __restrict__ dx,
                               float* __restrict__ dS, int32_t* __restrict__ S, int32_t* __restrict__ S16) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i max_finite = _mm256_set1_epi32(0x7f7fffff);
    const __m256 qmax = _mm256_set1_ps(Q8_MAX), qmin = _mm256_set1_ps(-Q8_MAX);
    const __m256 magic = _mm256_set1_ps(ROUND_MAGIC);
    // bytes 0..3 of lane 0, 0..3 of lane 1, ... after the two packs (see below)
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    bool finite = true;
    for (int64_t j = 0; j < k / Q8_BLOCK; ++j) {
        __m256 v[4], a[4];
        __m256i special = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
            v[i] = load8<DT>(src, j * Q8_BLOCK + 8 * i);
            a[i] = _mm256_and_ps(v[i], sign);
            special = _mm256_or_si256(special, _mm256_cmpgt_epi32(_mm256_castps_si256(a[i]), max_finite));
        }
        int8_t* o = q + j * Q8_BLOCK;
        if (!_mm256_testz_si256(special, special)) {
            finite = false;
            _mm256_storeu_si256((__m256i*)o, _mm256_setzero_si256());
            dx[j] = dS[j] = 0.0f;
            S[j] = S16[2 * j] = S16[2 * j + 1] = 0;
            continue;
        }
        // amax in every lane: the four vectors, then the lanes' butterfly
        __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
        const __m256 d = _mm256_div_ps(m, qmax);
        const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
                                        _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_GT_OQ));
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
            __m256 t = _mm256_mul_ps(v[i], id);
            t = _mm256_max_ps(qmin, _mm256_min_ps(qmax, t));
            const __m256 r = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
            c[i] = _mm256_and_si256(_mm256_cvttps_epi32(r), _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_ORD_Q)));
        }
        // packs: [c0 0-3, c1 0-3, c2 0-3, c3 0-3 | c0 4-7, c1 4-7, c2 4-7, c3 4-7] -> K order
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i*)o, _mm256_permutevar8x32_epi32(p, order));
        // the halves' sums: hadd twice -> [h0 of lane, h1 of lane, ..], the lanes added
        const __m256i h01 = _mm256_add_epi32(c[0], c[1]), h23 = _mm256_add_epi32(c[2], c[3]);
        __m256i h = _mm256_hadd_epi32(h01, h23);
        h = _mm256_hadd_epi32(h, h);
        const __m128i hs = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        const int32_t s0 = _mm_cvtsi128_si32(hs), s1 = _mm_extract_epi32(hs, 1);
        const float df = _mm256_cvtss_f32(d);
        dx[j] = df;
        S16[2 * j] = s0;
        S16[2 * j + 1] = s1;
        S[j] = s0 + s1;
        dS[j] = df * (float)S[j];
    }
    return finite;
}
#endif

}  // namespace

void quantize_activations(qg_dtype dt, const void* x, int64_t ldx, int64_t m, int64_t k, int threads, Q8Act* out) {
    const int64_t nb = k / Q8_BLOCK;
    out->m = m;
    out->k = k;
    out->q.resize((size_t)(m * k));
    out->dx.resize((size_t)(m * nb));
    out->dS.resize((size_t)(m * nb));
    out->S.resize((size_t)(m * nb));
    out->S16.resize((size_t)(2 * m * nb));
    out->finite.assign((size_t)m, 1);
    const int esize = dtype_bytes(dt);
    // A row of 4096 elements takes a few microseconds: rows are shared out only when
    // there are enough of them to pay for the helpers' wake-up.
    constexpr int64_t ROWS_PER_THREAD = 16;
    const int t = (int)std::max<int64_t>(1, std::min<int64_t>(threads, m / ROWS_PER_THREAD));
#if QG_INT8_HAVE_AVX2
    static const bool avx2 = int8_isa() >= Isa::AVX2;
    if (avx2) {
        const auto row = dt == QG_DTYPE_BF16  ? &quantize_row_avx2<QG_DTYPE_BF16>
                         : dt == QG_DTYPE_F16 ? &quantize_row_avx2<QG_DTYPE_F16>
                                              : &quantize_row_avx2<QG_DTYPE_F32>;
        parallel_for(m, t, [&](int64_t r, int) {
            out->finite[r] = row((const char*)x + r * ldx * esize, k, out->q.data() + r * k, out->dx.data() + r * nb,
                                 out->dS.data() + r * nb, out->S.data() + r * nb, out->S16.data() + 2 * r * nb);
        });
        out->all_finite = std::all_of(out->finite.begin(), out->finite.end(), [](uint8_t f) { return f != 0; });
        return;
    }
#endif
    parallel_for(m, t, [&](int64_t r, int) {
        const void* src = (const char*)x + r * ldx * esize;
        const float* v = (const float*)src;
        if (dt != QG_DTYPE_F32) {
            float* buf = nullptr;
            thread_local std::vector<float> tmp;
            if ((int64_t)tmp.size() < k) tmp.resize((size_t)k);
            buf = tmp.data();
            to_float_row(dt, src, k, buf);
            v = buf;
        }
        out->finite[r] = quantize_row(v, k, out->q.data() + r * k, out->dx.data() + r * nb, out->dS.data() + r * nb,
                                      out->S.data() + r * nb, out->S16.data() + 2 * r * nb)
                             ? 1
                             : 0;
    });
    out->all_finite = std::all_of(out->finite.begin(), out->finite.end(), [](uint8_t f) { return f != 0; });
}

}  // namespace cpu
}  // namespace qg
