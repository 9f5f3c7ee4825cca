// GGUF block formats on the CPU tier: y = x @ dequant(W)^T, W rows of GGUF blocks.
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "tiers.h"

namespace qg {

namespace {

template <class Block>
void gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    constexpr int E = cpu::Decoder<Block>::elems;
    const uint8_t* w = (const uint8_t*)a->w;
    const int64_t ldw = a->ldw;
    cpu::dense_gemm(
        ctx, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx,
        [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
            cpu::decode_row_blocks<Block>(w + n * ldw, k0 / E, kc / E, dst);
        },
        [&](int64_t m, int64_t n, float v) { cpu::store_float(a->y_dtype, a->y, m * a->ldy + n, v); });
}

}  // namespace

qg_status cpu_gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    switch ((int)a->format) {
#define QG_X(NAME, BLOCK, ELEMS)   \
    case QG_FORMAT_##NAME:         \
        gguf_gemm<BLOCK>(ctx, a);  \
        return QG_OK;
        QG_GGUF_FORMATS(QG_X)
#undef QG_X
        default:
            return set_error(QG_ERR_INTERNAL, "cpu_gguf_gemm reached with format=%d", (int)a->format);
    }
}

}  // namespace qg
