// MXFP4 weight layouts on the host: the CPU repack (canonical -> frag, qg_mxfp4_repack on a
// CPU context) and its inverse, which lets the CPU tier serve a frag-layout call. The frag
// layout is the W4A16 one of G = 32 (src/formats/w4a16_frag.h): the canonical blocks, read
// as words, go through the W4A16 plane loops of src/frag_planes.h, each plane word's bits
// then placed for the E2M1 decode (frag::e2m1_place), and the scale values differ (E8M0
// bytes <-> bf16 bits: frag::e8m0_bf16, frag::e8m0_of_bf16).
// pyquant/formats/mxfp4_frag.py is the specification the tests hold both directions to,
// byte for byte. The MoE frag layout (qg_moe_repack) is that repack per part of each expert.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <new>
#include <vector>

#include "formats/blocks.h"
#include "formats/w4a16_frag.h"
#include "frag_planes.h"
#include "moe_sizes.h"
#include "tiers.h"

namespace qg {

void mxfp4_repack_frag_host(const qg_mxfp4_repack_args& a) {
    const frag::Geometry geo = frag::Geometry(a.n, a.k, MXFP4_BLOCK);
    frag_pack_words(geo, a.blocks, static_cast<uint32_t*>(a.out_blocks), frag::e2m1_place);
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        out_s[i] = real ? frag::e8m0_bf16(a.scales[n * geo.groups + grp]) : 0;
    });
}

void moe_repack_frag_host(const qg_moe_repack_args& a) {
    const MoePart part(a);
    const int64_t row_bytes = a.k / 2, row_scales = a.k / MXFP4_BLOCK;
    // a part's canonical rows, gathered when they are interleaved (every other row)
    std::vector<uint8_t> b(static_cast<size_t>(part.rows * row_bytes)), s(static_cast<size_t>(part.rows * row_scales));
    for (int32_t e = 0; e < a.num_experts; ++e)
        for (int32_t h = 0; h < a.parts; ++h) {
            const int64_t first = part.first_row(e, h);
            for (int64_t r = 0; r < part.rows; ++r) {
                const int64_t src = first + r * part.row_step;
                memcpy(b.data() + r * row_bytes, a.blocks + src * row_bytes, static_cast<size_t>(row_bytes));
                memcpy(s.data() + r * row_scales, a.scales + src * row_scales, static_cast<size_t>(row_scales));
            }
            qg_mxfp4_repack_args one{};
            one.size = sizeof(one);
            one.layout = QG_MXFP4_LAYOUT_FRAG;
            one.n = part.rows;
            one.k = a.k;
            one.blocks = b.data();
            one.scales = s.data();
            one.out_blocks = static_cast<char*>(a.out_blocks) + part.blocks_offset(e, h);
            one.out_scales = static_cast<char*>(a.out_scales) + part.scales_offset(e, h);
            mxfp4_repack_frag_host(one);
        }
}

void mxfp4_frag_to_canonical_host(const qg_mxfp4_gemm_args& a, uint8_t* blocks, uint8_t* scales) {
    const frag::Geometry geo = frag::Geometry(a.n, a.k, MXFP4_BLOCK);
    frag_unpack_words(geo, reinterpret_cast<const uint32_t*>(a.blocks), blocks, frag::e2m1_unplace);
    const uint16_t* in_s = reinterpret_cast<const uint16_t*>(a.scales);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (real) scales[n * geo.groups + grp] = frag::e8m0_of_bf16(in_s[i]);
    });
}

// CPU tier on a frag-layout weight: unpack into temporary canonical arrays (host memory of
// the weight's size) and run the canonical CPU GEMM, as cpu_w4a16_gemm_frag does.
qg_status cpu_mxfp4_gemm_frag(const qg_context* ctx, const qg_mxfp4_gemm_args* a) {
    const size_t nblk = static_cast<size_t>(a->n) * static_cast<size_t>(a->k / MXFP4_BLOCK);
    const size_t block_bytes = nblk * MXFP4_BLOCK_BYTES;
    std::unique_ptr<uint8_t[]> b(new (std::nothrow) uint8_t[block_bytes]);
    std::unique_ptr<uint8_t[]> s(new (std::nothrow) uint8_t[nblk]);
    if (!b || !s)
        return set_error(QG_ERR_OUT_OF_MEMORY, "mxfp4 cpu tier: no host memory to unpack the frag layout (%zu bytes)",
                         block_bytes + nblk);
    mxfp4_frag_to_canonical_host(*a, b.get(), s.get());
    qg_mxfp4_gemm_args c = *a;
    c.layout = QG_MXFP4_LAYOUT_CANONICAL;
    c.blocks = b.get();
    c.scales = s.get();
    return cpu_mxfp4_gemm(ctx, &c);
}

}  // namespace qg
