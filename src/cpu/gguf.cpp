// GGUF block formats on the CPU tier: y = x @ dequant(W)^T (+ bias), W rows of GGUF blocks (the
// .gguf rows, or the rows8 layout: formats/gguf_rows8.h), on the int8 path (int8_gemm.h) or the
// fp32-exact one (dense_gemm.h): the cpu_precision option.
#include <string.h>

#include <vector>

#include "cpu/dense_gemm.h"
#include "cpu/dequant.h"
#include "cpu/int8_gemm.h"
#include "formats/gguf_rows8.h"
#include "tiers.h"

namespace qg {

namespace {

static_assert(gguf_rows8::kRows == cpu::ROWS_GROUP, "the rows8 layout is a ymm pass of the rows kernel");

// Blocks [b0, b0 + nb) of row n of a rows8 weight, gathered into this thread's buffer for the
// decoders that read a row's blocks in a run (the fp32-exact path, the portable int8 one).
template <class Block>
const uint8_t* rows8_run(const uint8_t* w, int64_t n, int64_t b0, int64_t nb, int64_t row_blocks) {
    thread_local std::vector<uint8_t> buf;
    buf.resize((size_t)nb * sizeof(Block));
    for (int64_t i = 0; i < nb; ++i)
        memcpy(buf.data() + i * sizeof(Block), w + gguf_rows8::block_offset(n, b0 + i, row_blocks, sizeof(Block)),
               sizeof(Block));
    return buf.data();
}

template <class Block>
void gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a, const char* name) {
    constexpr int E = cpu::Decoder<Block>::elems;
    const uint8_t* w = (const uint8_t*)a->w;
    const int64_t ldw = a->ldw, nb = a->k / E;
    const bool rows8 = a->layout == QG_GGUF_LAYOUT_ROWS8;  // else the .gguf rows
    // where row n's block 0 starts (the rows kernel's sources)
    const auto row_at = [&](int64_t n) {
        return rows8 ? w + gguf_rows8::block_offset(n, 0, nb, sizeof(Block)) : w + n * ldw;
    };
    // row n's blocks of k0 .. k0 + kc as one run in memory (the row decoders' source): in
    // place in the .gguf rows, gathered into this thread's buffer from a rows8 plane
    const auto run_at = [&](int64_t n, int64_t k0, int64_t kc) {
        return rows8 ? rows8_run<Block>(w, n, k0 / E, kc / E, nb) : row_at(n) + k0 / E * (int64_t)sizeof(Block);
    };
    const auto fdecode = [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        cpu::decode_row_blocks<Block>(run_at(n, k0, kc), 0, kc / E, dst);
    };
    const cpu::OutputStore store = cpu::output_store(a);
    if (!cpu::use_int8(ctx)) return cpu::dense_gemm(ctx, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx, fdecode, store);
    cpu::log_int8("gguf", name, a->m, a->n, a->k);
    cpu::int8_gemm(
        ctx, cpu::Int8Traits<Block>::kind, a->m, a->n, a->k, a->x_dtype, a->x, a->ldx,
        [&](int64_t n0, int count) {
            cpu::GgufSrc<Block> src;
            for (int r = 0; r < cpu::SRC_ROWS; ++r) src.row[r] = row_at(cpu::src_row(n0, count, a->n, r));
            src.stride = rows8 ? gguf_rows8::block_stride(sizeof(Block)) : (int64_t)sizeof(Block);
            return src;
        },
        [&](int64_t n, int64_t k0, int64_t kc, const cpu::Int8Out& out) {
            return cpu::decode_int8_row<Block>(run_at(n, k0, kc), 0, kc / E, out);
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
