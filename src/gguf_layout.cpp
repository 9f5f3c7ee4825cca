// GGUF weight layouts on the host: the CPU repack of Q4_0 blocks into the frag layout
// (qg_gguf_repack on a CPU context) and its inverse, which lets the CPU tier serve a
// frag-layout call. The frag layout is the W4A16 one of G = 32, symmetric, fp16 scales
// (src/formats/gguf_frag.h); pyquant/formats/gguf_frag.py is the specification the tests
// hold both directions to, byte for byte.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <new>

#include "formats/gguf_frag.h"
#include "formats/w4a16_frag.h"
#include "frag_planes.h"
#include "tiers.h"

namespace qg {
namespace {

using gguf_frag::kGroup;
using gguf_frag::kQ4_0Bytes;
using gguf_frag::kQ4_0Codes;

// Calls f(q word index, shift, n, k) for every element of the logical [n, k] weight: where its
// code sits in the qweight plane (frag::q_word_index).
template <class F>
void for_each_code(const frag::Geometry& geo, F&& f) {
    for (int64_t n = 0; n < geo.n; ++n)
        for (int64_t k = 0; k < geo.k; ++k) {
            int shift = 0;
            const int64_t word = frag::q_word_index(geo.k_tiles, n, k, &shift);
            f(word, shift, n, k);
        }
}

}  // namespace

void gguf_repack_frag_host(const qg_gguf_repack_args& a) {
    const frag::Geometry geo(a.n, a.k, kGroup);
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    uint32_t* out_q = static_cast<uint32_t*>(a.out_w);
    memset(out_q, 0, static_cast<size_t>(geo.qweight_bytes()));  // padding: q = 0
    for_each_code(geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        const uint8_t* block = w + n * a.ldw + (k / kGroup) * kQ4_0Bytes;
        out_q[word] |= gguf_frag::q4_0_code(block, static_cast<int>(k % kGroup)) << shift;
    });
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        out_s[i] = real ? gguf_frag::q4_0_d(w + n * a.ldw + grp * kQ4_0Bytes) : 0;
    });
}

// CPU tier on a frag-layout weight: the .gguf blocks rebuilt in host memory of the weight's
// size, then the block-layout CPU GEMM (bit for bit what the blocks give: the same codes and
// d). A frag weight is a GPU layout; this keeps every entry point served on the CPU.
qg_status cpu_gguf_gemm_frag(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    const frag::Geometry geo(a->n, a->k, kGroup);
    const int64_t ldw = geo.groups * kQ4_0Bytes;
    const size_t bytes = static_cast<size_t>(a->n) * static_cast<size_t>(ldw);
    std::unique_ptr<uint8_t[]> blocks(new (std::nothrow) uint8_t[bytes]);
    if (!blocks)
        return set_error(QG_ERR_OUT_OF_MEMORY, "gguf cpu tier: no host memory to unpack the frag layout (%zu bytes)",
                         bytes);
    memset(blocks.get(), 0, bytes);
    const uint32_t* in_q = static_cast<const uint32_t*>(a->w);
    for_each_code(geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        const int e = static_cast<int>(k % kGroup);
        uint8_t* code = blocks.get() + n * ldw + (k / kGroup) * kQ4_0Bytes + kQ4_0Codes + (e & 15);
        *code = static_cast<uint8_t>(*code | (((in_q[word] >> shift) & 15u) << ((e & 16) ? 4 : 0)));
    });
    const uint16_t* in_s = static_cast<const uint16_t*>(a->w_scales);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (!real) return;
        uint8_t* block = blocks.get() + n * ldw + grp * kQ4_0Bytes;
        block[0] = static_cast<uint8_t>(in_s[i] & 0xffu);
        block[1] = static_cast<uint8_t>(in_s[i] >> 8);
    });
    qg_gguf_gemm_args c = *a;
    c.layout = QG_GGUF_LAYOUT_BLOCKS;
    c.w = blocks.get();
    c.ldw = ldw;
    c.w_scales = nullptr;
    return cpu_gguf_gemm(ctx, &c);
}

}  // namespace qg
