// GGUF weight layouts on the host: the CPU repack of Q8_0, Q4_0, Q4_K, IQ4_XS, Q6_K and IQ3_XXS blocks into the frag layout
// (qg_gguf_repack on a CPU context) and its inverse, which lets the CPU tier serve a
// frag-layout call. The frag planes are the W4A16 ones of G = 32 (src/formats/gguf_frag.h);
// pyquant/formats/gguf_frag.py is the specification the tests hold both directions to, byte
// for byte. And the repack into the rows8 layout (src/formats/gguf_rows8.h), the CPU tier's
// own, which cpu_gguf_gemm reads as it is.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <new>

#include "formats/gguf_formats.h"
#include "formats/gguf_frag.h"
#include "formats/gguf_rows8.h"
#include "formats/iq_tables.h"
#include "formats/w4a16_frag.h"
#include "frag_planes.h"
#include "tiers.h"

namespace qg {
namespace {

using gguf_frag::kGroup;

const uint32_t kIq3xxsGrid[256] = QG_IQ3XXS_GRID;

// IQ3_XXS's inverse: the grid index of 4 magnitude indices m0 | m1 << 3 | m2 << 6 | m3 << 9, or -1
// where the grid has no such entry.
struct Iq3GridIndex {
    int16_t of[4096];
    Iq3GridIndex() {
        for (int16_t& v : of) v = -1;
        for (int i = 0; i < 256; ++i) {
            int key = 0;
            for (int j = 0; j < 4; ++j)
                key |= static_cast<int>(gguf_frag::iq3_xxs_mag_index((kIq3xxsGrid[i] >> (8 * j)) & 255u)) << (3 * j);
            of[key] = static_cast<int16_t>(i);
        }
    }
};

// One IQ3_XXS block from its 256 frag codes, 8 records and d; false (the block partly written)
// where the codes or records are none a block gives (see src/formats/gguf_frag.h).
bool iq3_xxs_put(uint8_t* block, const uint8_t* codes, const uint16_t (&rec)[8], uint16_t d) {
    static const Iq3GridIndex grid;
    gguf_frag::put_f16_at(block, 0, d);
    for (int q = 0; q < 64; ++q) {  // grid index q: elements 4 q .. 4 q + 3
        int key = 0;
        for (int j = 0; j < 4; ++j) key |= (codes[4 * q + j] & 7) << (3 * j);
        if (grid.of[key] < 0) return false;
        block[gguf_frag::kIQ3_XXSGrid + q] = static_cast<uint8_t>(grid.of[key]);
    }
    for (int j = 0; j < 8; ++j) {  // sub-block j: the 7 stored signs of each group of 8, then ls
        if (rec[j] > 15) return false;
        uint32_t word = static_cast<uint32_t>(rec[j]) << 28;
        for (int l = 0; l < 4; ++l) {
            uint32_t signs = 0;
            for (int i = 0; i < 8; ++i) signs |= static_cast<uint32_t>(codes[32 * j + 8 * l + i] >> 3) << i;
            if (__builtin_popcount(signs) & 1) return false;
            word |= (signs & 127u) << (7 * l);
        }
        for (int b = 0; b < 4; ++b) block[gguf_frag::kIQ3_XXSSigns + 4 * j + b] = static_cast<uint8_t>(word >> (8 * b));
    }
    return true;
}

// Calls f(word index, shift, n, k) for every element of the logical [n, k] weight: where its
// code sits in the format's weights plane (gguf_frag::code_word_index).
template <class F>
void for_each_code(int format, const frag::Geometry& geo, F&& f) {
    for (int64_t n = 0; n < geo.n; ++n)
        for (int64_t k = 0; k < geo.k; ++k) {
            int shift = 0;
            const int64_t word = gguf_frag::code_word_index(format, geo, n, k, &shift);
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

}  // namespace

void gguf_repack_frag_host(const qg_gguf_repack_args& a) {
    const frag::Geometry geo(a.n, a.k, kGroup);
    const gguf_frag::FragFormat ff(a.format, kIq3xxsGrid);
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    auto block_of = [&](int64_t n, int64_t k) { return w + n * a.ldw + (k / ff.elems) * ff.bytes; };
    uint32_t* out_q = static_cast<uint32_t*>(a.out_w);
    memset(out_q, 0, static_cast<size_t>(gguf_frag::weights_plane_bytes(a.format, geo)));  // padding: q = 0
    for_each_code(a.format, geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        out_q[word] |= ff.code(block_of(n, k), static_cast<int>(k % ff.elems)) << shift;
    });
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    memset(out_s, 0, static_cast<size_t>(gguf_frag::scales_plane_bytes(a.format, geo)));
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (real) out_s[i] = ff.record(block_of(n, grp * kGroup), static_cast<int>((grp * kGroup % ff.elems) / kGroup));
    });
    if (gguf_frag::has_superblocks(a.format))
        for_each_superblock(geo, [&](int64_t i, int64_t n, int64_t sb) {
            const uint8_t* block = w + n * a.ldw + sb * ff.bytes;
            out_s[i] = ff.field(block, 0);
            out_s[i + 2] = ff.field(block, 1);
        });
}

void gguf_repack_rows8_host(const qg_gguf_repack_args& a) {
    const GgufFormat* f = gguf_format(a.format);
    const int64_t nb = a.k / f->elems, bytes = f->bytes, n_pad = gguf_rows8::padded_rows(a.n);
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    uint8_t* out = static_cast<uint8_t*>(a.out_w);
    for (int64_t n = 0; n < n_pad; ++n)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* dst = out + gguf_rows8::block_offset(n, b, nb, bytes);
            if (n < a.n)
                memcpy(dst, w + n * a.ldw + b * bytes, static_cast<size_t>(bytes));
            else
                memset(dst, 0, static_cast<size_t>(bytes));  // padding: scale 0, adds nothing
        }
}

// CPU tier on a frag-layout weight: the .gguf blocks rebuilt in host memory of the weight's
// size, then the block-layout CPU GEMM (bit for bit what the blocks give: the same codes and
// fields). A frag weight is a GPU layout; this keeps every entry point served on the CPU.
// IQ3_XXS's codes are gathered first (a grid index holds 4 of them), and planes that no block
// gives are refused (QG_ERR_INVALID_ARGUMENT, y untouched).
qg_status cpu_gguf_gemm_frag(const qg_context* ctx, const qg_gguf_gemm_args* a) {
    const frag::Geometry geo(a->n, a->k, kGroup);
    const gguf_frag::FragFormat ff(a->format);
    const bool super = gguf_frag::has_superblocks(a->format);
    const bool iq3 = a->format == QG_FORMAT_IQ3_XXS;
    const int64_t ldw = a->k / ff.elems * ff.bytes;
    const size_t bytes = static_cast<size_t>(a->n) * static_cast<size_t>(ldw);
    const size_t records = super ? static_cast<size_t>(a->n) * static_cast<size_t>(a->k / kGroup) : 0;
    const size_t n_codes = iq3 ? static_cast<size_t>(a->n) * static_cast<size_t>(a->k) : 0;
    std::unique_ptr<uint8_t[]> blocks(new (std::nothrow) uint8_t[bytes]);
    std::unique_ptr<uint16_t[]> rec(records ? new (std::nothrow) uint16_t[records] : nullptr);
    std::unique_ptr<uint8_t[]> codes(n_codes ? new (std::nothrow) uint8_t[n_codes] : nullptr);
    if (!blocks || (records && !rec) || (n_codes && !codes))
        return set_error(QG_ERR_OUT_OF_MEMORY, "gguf cpu tier: no host memory to unpack the frag layout (%zu bytes)",
                         bytes + 2 * records + n_codes);
    memset(blocks.get(), 0, bytes);
    uint8_t* out = blocks.get();
    const uint32_t* in_q = static_cast<const uint32_t*>(a->w);
    for_each_code(a->format, geo, [&](int64_t word, int shift, int64_t n, int64_t k) {
        if (iq3)
            codes[n * a->k + k] = static_cast<uint8_t>((in_q[word] >> shift) & 15u);
        else
            ff.put_code(out + n * ldw + (k / ff.elems) * ff.bytes, static_cast<int>(k % ff.elems), in_q[word] >> shift);
    });
    const uint16_t* in_s = static_cast<const uint16_t*>(a->w_scales);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (!real) return;
        if (super) {  // gathered per block for the format's packing below
            rec[n * (a->k / kGroup) + grp] = in_s[i];
        } else {
            gguf_frag::put_f16_at(out + n * ldw + grp * ff.bytes, 0, in_s[i]);
        }
    });
    if (super) {
        int64_t bad_row = -1;
        for_each_superblock(geo, [&](int64_t i, int64_t n, int64_t sb) {
            uint8_t* block = out + n * ldw + sb * ff.bytes;
            uint16_t r[8];
            for (int j = 0; j < 8; ++j) r[j] = rec[n * (a->k / kGroup) + sb * 8 + j];
            if (iq3) {
                if (!iq3_xxs_put(block, codes.get() + n * a->k + sb * gguf_frag::kQ4_KElems, r, in_s[i]) && bad_row < 0)
                    bad_row = n;
                return;
            }
            if (a->format == QG_FORMAT_Q6_K) {  // the scales bytes as they were, then d
                for (int j = 0; j < 8; ++j) gguf_frag::put_f16_at(block, gguf_frag::kQ6_KScales + 2 * j, r[j]);
                gguf_frag::put_f16_at(block, gguf_frag::kQ6_KD, in_s[i]);
                return;
            }
            gguf_frag::put_f16_at(block, 0, in_s[i]);
            if (a->format == QG_FORMAT_Q4_K) {
                gguf_frag::put_f16_at(block, 2, in_s[i + 2]);
                gguf_frag::q4_K_pack_records(r, block);
            } else {
                gguf_frag::iq4_xs_pack_records(r, block);
            }
        });
        if (bad_row >= 0)
            return set_error(QG_ERR_INVALID_ARGUMENT,
                             "w: row %lld is not an iq3_xxs frag weight (4 magnitudes outside the grid, 8 signs of odd "
                             "parity or a record above 15): no block gives these planes",
                             static_cast<long long>(bad_row));
    }
    qg_gguf_gemm_args c = *a;
    c.layout = QG_GGUF_LAYOUT_BLOCKS;
    c.w = blocks.get();
    c.ldw = ldw;
    c.w_scales = nullptr;
    return cpu_gguf_gemm(ctx, &c);
}

}  // namespace qg
