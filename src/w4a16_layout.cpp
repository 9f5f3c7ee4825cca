// W4A16 weight layouts on the host: the CPU repack (canonical -> frag, qg_w4a16_repack on
// a CPU context) and its inverse, which lets the CPU tier serve a frag-layout call, and the
// plane loops they share with the MXFP4 layout (src/frag_planes.h).
// Positions come from src/formats/w4a16_frag.h; pyquant/formats/int4_frag.py is the
// specification the tests hold both directions to, byte for byte.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <new>

#include "formats/w4a16_frag.h"
#include "frag_planes.h"
#include "tiers.h"

namespace qg {
namespace {

// word i of a canonical array of 32-bit words, at any alignment (MXFP4 blocks are bytes)
inline uint32_t load_word(const void* words, int64_t i) {
    uint32_t w;
    memcpy(&w, static_cast<const uint8_t*>(words) + 4 * i, 4);
    return w;
}

inline void or_word(void* words, int64_t i, uint32_t bits) {
    uint8_t* p = static_cast<uint8_t*>(words) + 4 * i;
    uint32_t w;
    memcpy(&w, p, 4);
    w |= bits;
    memcpy(p, &w, 4);
}

// zero nibble of (row n, group grp) of the canonical qzeros [N/8, K/G]
inline uint32_t canonical_z(const int32_t* qzeros, int64_t groups, int64_t n, int64_t grp) {
    return (static_cast<uint32_t>(qzeros[(n / 8) * groups + grp]) >> (4 * (n % 8))) & 15u;
}

}  // namespace

void frag_pack_words(const frag::Geometry& geo, const void* canonical, uint32_t* plane, uint32_t (*place)(uint32_t)) {
    const int64_t row_words = geo.k / 8;
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kt = 0; kt < geo.k_tiles; ++kt)
            for (int lane = 0; lane < frag::kLanes; ++lane)
                for (int s = 0; s < frag::kWordsPerLane; ++s) {
                    uint32_t word = 0;
                    for (int j = 0; j < 8; ++j) {
                        const int64_t n = rb * frag::kRowBlock + frag::nibble_row(lane, j);
                        const int64_t kk = kt * frag::kKTile + frag::nibble_k(lane, s, j);
                        if (n < geo.n && kk < geo.k)
                            word |= ((load_word(canonical, n * row_words + kk / 8) >> (4 * (kk % 8))) & 15u) << (4 * j);
                    }
                    *plane++ = place ? place(word) : word;
                }
}

void frag_unpack_words(const frag::Geometry& geo, const uint32_t* plane, void* canonical,
                       uint32_t (*unplace)(uint32_t)) {
    const int64_t row_words = geo.k / 8;
    memset(canonical, 0, static_cast<size_t>(geo.n) * static_cast<size_t>(row_words) * 4);
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kt = 0; kt < geo.k_tiles; ++kt)
            for (int lane = 0; lane < frag::kLanes; ++lane)
                for (int s = 0; s < frag::kWordsPerLane; ++s) {
                    const uint32_t word = unplace ? unplace(*plane) : *plane;
                    ++plane;
                    for (int j = 0; j < 8; ++j) {
                        const int64_t n = rb * frag::kRowBlock + frag::nibble_row(lane, j);
                        const int64_t kk = kt * frag::kKTile + frag::nibble_k(lane, s, j);
                        if (n >= geo.n || kk >= geo.k) continue;
                        or_word(canonical, n * row_words + kk / 8, ((word >> (4 * j)) & 15u) << (4 * (kk % 8)));
                    }
                }
}

void w4a16_repack_frag_host(const qg_w4a16_repack_args& a) {
    const frag::Geometry geo(a.n, a.k, a.group_size);
    frag_pack_words(geo, a.qweight, static_cast<uint32_t*>(a.out_qweight));
    const uint16_t* scales = static_cast<const uint16_t*>(a.scales);
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    uint8_t* out_z = static_cast<uint8_t*>(a.out_qzeros);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        out_s[i] = real ? scales[n * geo.groups + grp] : 0;
        if (out_z == nullptr) return;
        // byte i / 2 = z[row g] | z[row g + 8] << 4; its h = 0 half comes first
        const uint32_t z = real ? canonical_z(a.qzeros, geo.groups, n, grp) : 0;
        out_z[i / 2] = static_cast<uint8_t>(i % 2 == 0 ? z : out_z[i / 2] | (z << 4));
    });
}

void w4a16_frag_to_canonical_host(const qg_w4a16_gemm_args& a, int32_t* qweight, uint16_t* scales,
                                  int32_t* qzeros) {
    const frag::Geometry geo(a.n, a.k, a.group_size);
    frag_unpack_words(geo, reinterpret_cast<const uint32_t*>(a.qweight), qweight);
    const uint16_t* in_s = static_cast<const uint16_t*>(a.scales);
    const uint8_t* in_z = reinterpret_cast<const uint8_t*>(a.qzeros);
    if (qzeros != nullptr) memset(qzeros, 0, static_cast<size_t>(a.n / 8) * static_cast<size_t>(geo.groups) * 4);
    for_each_scale(geo, [&](int64_t i, int64_t n, int64_t grp, bool real) {
        if (!real) return;
        scales[n * geo.groups + grp] = in_s[i];
        if (qzeros != nullptr) {
            const uint32_t z = (in_z[i / 2] >> (4 * (i % 2))) & 15u;
            reinterpret_cast<uint32_t*>(qzeros)[(n / 8) * geo.groups + grp] |= z << (4 * (n % 8));
        }
    });
}

// CPU tier on a frag-layout weight: unpack into temporary canonical arrays (host memory of
// the weight's size) and run the canonical CPU GEMM. A frag weight is a GPU layout; this
// path keeps every entry point served on the CPU, at the cost of one unpack per call.
qg_status cpu_w4a16_gemm_frag(const qg_context* ctx, const qg_w4a16_gemm_args* a) {
    const frag::Geometry geo(a->n, a->k, a->group_size);
    const size_t words = static_cast<size_t>(a->n) * static_cast<size_t>(a->k / 8);
    const size_t svals = static_cast<size_t>(a->n) * static_cast<size_t>(geo.groups);
    const size_t zwords = a->qzeros ? static_cast<size_t>(a->n / 8) * static_cast<size_t>(geo.groups) : 0;
    std::unique_ptr<int32_t[]> q(new (std::nothrow) int32_t[words]);
    std::unique_ptr<uint16_t[]> s(new (std::nothrow) uint16_t[svals]);
    std::unique_ptr<int32_t[]> z(zwords ? new (std::nothrow) int32_t[zwords] : nullptr);
    if (!q || !s || (zwords && !z))
        return set_error(QG_ERR_OUT_OF_MEMORY, "w4a16 cpu tier: no host memory to unpack the frag layout (%zu bytes)",
                         words * 4 + svals * 2 + zwords * 4);
    w4a16_frag_to_canonical_host(*a, q.get(), s.get(), z.get());
    qg_w4a16_gemm_args c = *a;
    c.layout = QG_W4A16_LAYOUT_CANONICAL;
    c.qweight = q.get();
    c.scales = s.get();
    c.qzeros = z.get();
    return cpu_w4a16_gemm(ctx, &c);
}

}  // namespace qg
