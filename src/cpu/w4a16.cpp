// W4A16 on the CPU tier: y = x @ dequant(W)^T, dequant(W)[n, k] = float(q - z) * float(s).
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "tiers.h"

namespace qg {

qg_status cpu_w4a16_gemm(const qg_context* ctx, const qg_w4a16_gemm_args* a) {
    const int64_t K = a->k;
    const int G = a->group_size;
    const int64_t groups = K / G;
    const int sbytes = cpu::dtype_bytes(a->scale_dtype);
    const int32_t* qzeros = a->qzeros;
    cpu::dense_gemm(
        ctx, a->m, a->n, K, a->x_dtype, a->x, a->ldx,
        [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
            cpu::decode_int4_row(a->qweight + n * (K / 8), (const char*)a->scales + n * groups * sbytes,
                                 a->scale_dtype, qzeros, n, groups, G, k0, kc, dst);
        },
        [&](int64_t m, int64_t n, float v) { cpu::store_float(a->y_dtype, a->y, m * a->ldy + n, v); });
    return QG_OK;
}

}  // namespace qg
