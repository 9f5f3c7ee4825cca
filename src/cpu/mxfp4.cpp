// MXFP4 dense GEMM on the CPU tier: y = x @ dequant(W)^T + bias, OCP layout
// (blocks [N, K/32, 16], scales [N, K/32]).
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "tiers.h"

namespace qg {

qg_status cpu_mxfp4_gemm(const qg_context* ctx, const qg_mxfp4_gemm_args* a) {
    const int64_t nblk = a->k / MXFP4_BLOCK;  // blocks per row
    cpu::dense_gemm(
        ctx, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx,
        [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
            cpu::decode_mxfp4_row(a->blocks + n * nblk * MXFP4_BLOCK_BYTES, a->scales + n * nblk, k0 / MXFP4_BLOCK,
                                  kc / MXFP4_BLOCK, dst);
        },
        [&](int64_t m, int64_t n, float v) {
            if (a->bias != nullptr) v += cpu::load_float(a->bias_dtype, a->bias, n);
            cpu::store_float(a->y_dtype, a->y, m * a->ldy + n, v);
        });
    return QG_OK;
}

}  // namespace qg
