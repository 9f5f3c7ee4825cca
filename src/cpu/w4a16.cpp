// W4A16 on the CPU tier: y = x @ dequant(W)^T (+ bias), dequant(W)[n, k] = float(q - z) * float(s), on
// the int8 path (int8_gemm.h) or the fp32-exact one (dense_gemm.h): the cpu_precision option.
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "cpu/int8_gemm.h"
#include "tiers.h"

namespace qg {

qg_status cpu_w4a16_gemm(const qg_context* ctx, const qg_w4a16_gemm_args* a) {
    const int64_t K = a->k;
    const int G = a->group_size;
    const int64_t groups = K / G;
    const int sbytes = cpu::dtype_bytes(a->scale_dtype);
    const int32_t* qzeros = a->qzeros;
    const auto scales_row = [&](int64_t n) { return (const char*)a->scales + n * groups * sbytes; };
    const auto fdecode = [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        cpu::decode_int4_row(a->qweight + n * (K / 8), scales_row(n), a->scale_dtype, qzeros, n, groups, G, k0, kc,
                             dst);
    };
    const cpu::OutputStore store = cpu::output_store(a);
    if (!cpu::use_int8(ctx)) {
        cpu::dense_gemm(ctx, a->m, a->n, K, a->x_dtype, a->x, a->ldx, fdecode, store);
        return QG_OK;
    }
    cpu::log_int8("w4a16", "int4", a->m, a->n, K);
    cpu::int8_gemm(
        ctx, cpu::KIND_INT4, a->m, a->n, K, a->x_dtype, a->x, a->ldx,
        [&](int64_t n0, int count) {
            cpu::Int4Src src;
            for (int r = 0; r < cpu::PANEL_ROWS; ++r) {
                const int64_t n = cpu::panel_row(n0, count, r);
                src.qweight[r] = a->qweight + n * (K / 8);
                src.scales_row[r] = scales_row(n);
                src.n[r] = n;
            }
            for (int r = cpu::PANEL_ROWS; r < cpu::SRC_ROWS; ++r)
                src.qweight[r] = a->qweight + cpu::src_row(n0, count, a->n, r) * (K / 8);
            src.scale_dtype = a->scale_dtype;
            src.qzeros = qzeros;
            src.groups = groups;
            src.group_size = G;
            return src;
        },
        [&](int64_t n, int64_t k0, int64_t kc, const cpu::Int8Out& out) {
            return cpu::decode_int8_int4_row(a->qweight + n * (K / 8), scales_row(n), a->scale_dtype, qzeros, n,
                                             groups, G, k0, kc, out);
        },
        fdecode, store);
    return QG_OK;
}

}  // namespace qg
