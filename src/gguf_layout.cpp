// GGUF weight layouts on the host: the CPU repack of Q4_0 and Q4_K blocks into the frag layout
// (qg_gguf_repack on a CPU context) and its inverse, which lets the CPU tier serve a
// frag-layout call. The frag planes are the W4A16 ones of G = 32 (src/formats/gguf_frag.h);
// pyquant/formats/gguf_frag.py is the specification the tests hold both directions to, byte
// for byte.
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

// Calls f(uint16 index of d, n, super-block) for every real row and super-block of a Q4_K
// scales plane (dmin is 2 further on: gguf_frag::q4_K_sb_index's f = 1).
template <class F>
void for_each_superblock(const frag::Geometry& geo, F&& f) {
    const int64_t base = gguf_frag::q4_K_sb_offset(geo) / 2;
    for (int64_t n = 0; n < geo.n; ++n)
        for (int64_t sb = 0; sb < geo.k / gguf_frag::kQ4_KElems; ++sb) {
            const int r = static_cast<int>(n % frag::kRowBlock);
            f(base + gguf_frag::q4_K_sb_index(geo, n / frag::kRowBlock, sb, r % 8, 0, r / 8), n, sb);
        }
}

struct Blocks {
    bool q4_K;
    int bytes, elems;
    explicit Blocks(int format)
        : q4_K(format == QG_FORMAT_Q4_K),
          bytes(q4_K ? gguf_frag::kQ4_KBytes : gguf_frag::kQ4_0Bytes),
          elems(q4_K ? gguf_frag::kQ4_KElems : kGroup) {}
    // the block of element (n, k) and k's place in it
    const uint8_t* at(const uint8_t* w, int64_t ldw, int64_t n, int64_t k) const {
        return w + n * ldw + (k / elems) * bytes;
    }
};

}  // namespace

void gguf_repack_frag_host(const qg_gguf_repack_args& a) {
    const frag::Geometry geo(a.n, a.k, kGroup);
    const Blocks bl(a.format);
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    uint32_t* out_q = static_cast<uint32_t*>(a.out_w);
    memset(out_q, 0, static_cast<size_t>(geo.qweight_bytes()));  // padding: q = 0
    for_each_code(geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        const uint8_t* block = bl.at(w, a.ldw, n, k);
        const int e = static_cast<int>(k % bl.elems);
        out_q[word] |= (bl.q4_K ? gguf_frag::q4_K_code(block, e) : gguf_frag::q4_0_code(block, e)) << shift;
    });
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    memset(out_s, 0, static_cast<size_t>(gguf_frag::scales_plane_bytes(a.format, geo)));
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (!real) return;
        const uint8_t* block = bl.at(w, a.ldw, n, grp * kGroup);
        out_s[i] = bl.q4_K ? gguf_frag::q4_K_record(block, static_cast<int>(grp % 8)) : gguf_frag::q4_0_d(block);
    });
    if (bl.q4_K)
        for_each_superblock(geo, [&](int64_t i, int64_t n, int64_t sb) {
            const uint8_t* block = w + n * a.ldw + sb * bl.bytes;
            out_s[i] = gguf_frag::f16_at(block, 0);
            out_s[i + 2] = gguf_frag::f16_at(block, 2);
        });
}

// CPU tier on a frag-layout weight: the .gguf blocks rebuilt in host memory of the weight's
// size, then the block-layout CPU GEMM (bit for bit what the blocks give: the same codes and
// fields). A frag weight is a GPU layout; this keeps every entry point served on the CPU.
qg_status cpu_gguf_gemm_frag(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    const frag::Geometry geo(a->n, a->k, kGroup);
    const Blocks bl(a->format);
    const int64_t ldw = a->k / bl.elems * bl.bytes;
    const size_t bytes = static_cast<size_t>(a->n) * static_cast<size_t>(ldw);
    std::unique_ptr<uint8_t[]> blocks(new (std::nothrow) uint8_t[bytes]);
    if (!blocks)
        return set_error(QG_ERR_OUT_OF_MEMORY, "gguf cpu tier: no host memory to unpack the frag layout (%zu bytes)",
                         bytes);
    memset(blocks.get(), 0, bytes);
    uint8_t* out = blocks.get();
    const uint32_t* in_q = static_cast<const uint32_t*>(a->w);
    for_each_code(geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        const int e = static_cast<int>(k % bl.elems);
        uint8_t* block = out + n * ldw + (k / bl.elems) * bl.bytes;
        uint8_t* code = bl.q4_K ? block + gguf_frag::kQ4_KCodes + 32 * (e >> 6) + (e & 31)
                                : block + gguf_frag::kQ4_0Codes + (e & 15);
        const int nib = bl.q4_K ? 4 * ((e >> 5) & 1) : ((e & 16) ? 4 : 0);
        *code = static_cast<uint8_t>(*code | (((in_q[word] >> shift) & 15u) << nib));
    });
    const uint16_t* in_s = static_cast<const uint16_t*>(a->w_scales);
    // Q4_K's records, gathered per block before the 6-bit packing
    std::unique_ptr<uint16_t[]> rec;
    if (bl.q4_K) {
        rec.reset(new (std::nothrow) uint16_t[static_cast<size_t>(a->n) * static_cast<size_t>(a->k / kGroup)]);
        if (!rec) return set_error(QG_ERR_OUT_OF_MEMORY, "gguf cpu tier: no host memory to unpack the frag layout");
    }
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (!real) return;
        if (bl.q4_K) {
            rec[n * (a->k / kGroup) + grp] = in_s[i];
        } else {
            uint8_t* block = out + n * ldw + grp * bl.bytes;
            block[0] = static_cast<uint8_t>(in_s[i] & 0xffu);
            block[1] = static_cast<uint8_t>(in_s[i] >> 8);
        }
    });
    if (bl.q4_K) {
        for_each_superblock(geo, [&](int64_t i, int64_t n, int64_t sb) {
            uint8_t* block = out + n * ldw + sb * bl.bytes;
            const uint16_t d = in_s[i], dmin = in_s[i + 2];
            block[0] = static_cast<uint8_t>(d & 0xffu), block[1] = static_cast<uint8_t>(d >> 8);
            block[2] = static_cast<uint8_t>(dmin & 0xffu), block[3] = static_cast<uint8_t>(dmin >> 8);
            uint16_t r[8];
            for (int j = 0; j < 8; ++j) r[j] = rec[n * (a->k / kGroup) + sb * 8 + j];
            gguf_frag::q4_K_pack_records(r, block);
        });
    }
    qg_gguf_gemm_args c = *a;
    c.layout = QG_GGUF_LAYOUT_BLOCKS;
    c.w = blocks.get();
    c.ldw = ldw;
    c.w_scales = nullptr;
    return cpu_gguf_gemm(ctx, &c);
}

}  // namespace qg
