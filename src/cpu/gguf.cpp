// GGUF block formats on the CPU tier: y = x @ dequant(W)^T (+ bias), W rows of GGUF blocks, on the
// int8 path (int8_gemm.h) or the fp32-exact one (dense_gemm.h): the cpu_precision option.
#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "cpu/int8_gemm.h"
#include "tiers.h"

namespace qg {

namespace {

template <class Block>
void gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a, const char* name) {
    constexpr int E = cpu::Decoder<Block>::elems;
    const uint8_t* w = (const uint8_t*)a->w;
    const int64_t ldw = a->ldw;
    const auto fdecode = [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        cpu::decode_row_blocks<Block>(w + n * ldw, k0 / E, kc / E, dst);
    };
    const cpu::OutputStore store = cpu::output_store(a);
    if (!cpu::use_int8(ctx)) return cpu::dense_gemm(ctx, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx, fdecode, store);
    cpu::log_int8("gguf", name, a->m, a->n, a->k);
    cpu::int8_gemm(
        ctx, cpu::Int8Traits<Block>::kind, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx,
        [&](int64_t n0, int count) {
            cpu::GgufSrc<Block> src;
            for (int r = 0; r < cpu::SRC_ROWS; ++r) src.row[r] = w + cpu::src_row(n0, count, a->n, r) * ldw;
            return src;
        },
        [&](int64_t n, int64_t k0, int64_t kc, const cpu::Int8Out& out) {
            return cpu::decode_int8_row<Block>(w + n * ldw, k0 / E, kc / E, out);
        },
        fdecode, store);
}

}  // namespace

qg_status cpu_gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    switch ((int)a->format) {
#define QG_X(NAME, BLOCK, ELEMS)   \
    case QG_FORMAT_##NAME:         \
        gguf_gemm<BLOCK>(ctx, a, #NAME); \
        return QG_OK;
        QG_GGUF_FORMATS(QG_X)
#undef QG_X
        default:
            return set_error(QG_ERR_INTERNAL, "cpu_gguf_gemm reached with format=%d", (int)a->format);
    }
}

}  // namespace qg
