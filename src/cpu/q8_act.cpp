// Activation quantization of the int8 path (see q8_act.h), compiled once per ISA level
// (cpu/clones.h). Every step is a float32 operation that rounds the same at any vector
// width, so every clone gives the same codes.
#include "cpu/q8_act.h"

#include <math.h>

#include <algorithm>

#include "cpu/clones.h"
#include "cpu/convert.h"
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
