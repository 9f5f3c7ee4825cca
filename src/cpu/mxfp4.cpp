// MXFP4 dense GEMM on the CPU tier: y = x @ dequant(W)^T + bias, OCP layout
// (blocks [N, K/32, 16], scales [N, K/32]), on the int8 path (int8_gemm.h) or the
// fp32-exact one (dense_gemm.h): the cpu_precision option.
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "cpu/int8_gemm.h"
#include "tiers.h"

namespace qg {

qg_status cpu_mxfp4_gemm(const qg_context* ctx, const qg_mxfp4_gemm_args* a) {
    const int64_t nblk = a->k / MXFP4_BLOCK;  // blocks per row
    const auto row_blocks = [&](int64_t n) { return a->blocks + n * nblk * MXFP4_BLOCK_BYTES; };
    const auto fdecode = [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        cpu::decode_mxfp4_row(row_blocks(n), a->scales + n * nblk, k0 / MXFP4_BLOCK, kc / MXFP4_BLOCK, dst);
    };
    const cpu::OutputStore store = cpu::output_store(a);
    if (!cpu::use_int8(ctx)) {
        cpu::dense_gemm(ctx, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx, fdecode, store);
        return QG_OK;
    }
    cpu::log_int8("mxfp4", "mxfp4", a->m, a->n, a->k);
    cpu::int8_gemm(
        ctx, cpu::KIND_MXFP4, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx,
        [&](int64_t n0, int count) {
            cpu::Mxfp4Src src;
            for (int r = 0; r < cpu::SRC_ROWS; ++r) {
                const int64_t n = cpu::src_row(n0, count, a->n, r);
                src.blocks[r] = row_blocks(n);
                src.scales[r] = a->scales + n * nblk;
            }
            return src;
        },
        [&](int64_t n, int64_t k0, int64_t kc, const cpu::Int8Out& out) {
            return cpu::decode_int8_mxfp4_row(row_blocks(n), a->scales + n * nblk, k0 / MXFP4_BLOCK,
                                              kc / MXFP4_BLOCK, out);
        },
        fdecode, store);
    return QG_OK;
}

}  // namespace qg
