// W4A16 weight layouts on the host: the CPU repack (canonical -> frag, qg_w4a16_repack on
// a CPU context) and its inverse, which lets the CPU tier serve a frag-layout call.
// Positions come from src/formats/w4a16_frag.h; pyquant/formats/int4_frag.py is the
// specification the tests hold both directions to, byte for byte.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <new>

#include "formats/w4a16_frag.h"
#include "tiers.h"

namespace qg {
namespace {

// nibble (n, k) of the canonical qweight [N, K/8]
inline uint32_t canonical_q(const int32_t* qweight, int64_t k, int64_t n, int64_t kk) {
    return (static_cast<uint32_t>(qweight[n * (k / 8) + kk / 8]) >> (4 * (kk % 8))) & 15u;
}

// zero nibble of (row n, group grp) of the canonical qzeros [N/8, K/G]
inline uint32_t canonical_z(const int32_t* qzeros, int64_t groups, int64_t n, int64_t grp) {
    return (static_cast<uint32_t>(qzeros[(n / 8) * groups + grp]) >> (4 * (n % 8))) & 15u;
}

}  // namespace

void w4a16_repack_frag_host(const qg_w4a16_repack_args& a) {
    const frag::Geometry geo(a.n, a.k, a.group_size);
    uint32_t* out_q = static_cast<uint32_t*>(a.out_qweight);
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kt = 0; kt < geo.k_tiles; ++kt)
            for (int lane = 0; lane < frag::kLanes; ++lane)
                for (int s = 0; s < frag::kWordsPerLane; ++s) {
                    uint32_t word = 0;
                    for (int j = 0; j < 8; ++j) {
                        const int64_t n = rb * frag::kRowBlock + frag::nibble_row(lane, j);
                        const int64_t kk = kt * frag::kKTile + frag::nibble_k(lane, s, j);
                        if (n < a.n && kk < a.k) word |= canonical_q(a.qweight, a.k, n, kk) << (4 * j);
                    }
                    *out_q++ = word;
                }
    const uint16_t* scales = static_cast<const uint16_t*>(a.scales);
    uint16_t* out_s = static_cast<uint16_t*>(a.out_scales);
    uint8_t* out_z = static_cast<uint8_t*>(a.out_qzeros);
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kc = 0; kc < geo.k_chunks; ++kc)
            for (int g = 0; g < 8; ++g)
                for (int c = 0; c < geo.groups_per_chunk; ++c) {
                    const int64_t grp = kc * geo.groups_per_chunk + c;
                    uint32_t zb = 0;
                    for (int h = 0; h < 2; ++h) {
                        const int64_t n = rb * frag::kRowBlock + g + 8 * h;
                        const bool real = n < a.n && grp < geo.groups;
                        out_s[geo.scale_index(rb, kc, g, c, h)] = real ? scales[n * geo.groups + grp] : 0;
                        if (out_z != nullptr && real) zb |= canonical_z(a.qzeros, geo.groups, n, grp) << (4 * h);
                    }
                    if (out_z != nullptr) out_z[geo.zero_index(rb, kc, g, c)] = static_cast<uint8_t>(zb);
                }
}

void w4a16_frag_to_canonical_host(const qg_w4a16_gemm_args& a, int32_t* qweight, uint16_t* scales,
                                  int32_t* qzeros) {
    const frag::Geometry geo(a.n, a.k, a.group_size);
    memset(qweight, 0, static_cast<size_t>(a.n) * static_cast<size_t>(a.k / 8) * 4);
    const uint32_t* in_q = reinterpret_cast<const uint32_t*>(a.qweight);
    for (int64_t rb = 0; rb < geo.row_blocks; ++rb)
        for (int64_t kt = 0; kt < geo.k_tiles; ++kt)
            for (int lane = 0; lane < frag::kLanes; ++lane)
                for (int s = 0; s < frag::kWordsPerLane; ++s) {
                    const uint32_t word = *in_q++;
                    for (int j = 0; j < 8; ++j) {
                        const int64_t n = rb * frag::kRowBlock + frag::nibble_row(lane, j);
                        const int64_t kk = kt * frag::kKTile + frag::nibble_k(lane, s, j);
                        if (n >= a.n || kk >= a.k) continue;
                        const uint32_t q = (word >> (4 * j)) & 15u;
                        reinterpret_cast<uint32_t*>(qweight)[n * (a.k / 8) + kk / 8] |= q << (4 * (kk % 8));
                    }
                }
    const uint16_t* in_s = static_cast<const uint16_t*>(a.scales);
    const uint8_t* in_z = reinterpret_cast<const uint8_t*>(a.qzeros);
    if (qzeros != nullptr) memset(qzeros, 0, static_cast<size_t>(a.n / 8) * static_cast<size_t>(geo.groups) * 4);
    for (int64_t n = 0; n < a.n; ++n)
        for (int64_t grp = 0; grp < geo.groups; ++grp) {
            const int64_t rb = n / frag::kRowBlock, kc = grp / geo.groups_per_chunk;
            const int r = static_cast<int>(n % frag::kRowBlock), c = static_cast<int>(grp % geo.groups_per_chunk);
            const int g = r % 8, h = r / 8;
            scales[n * geo.groups + grp] = in_s[geo.scale_index(rb, kc, g, c, h)];
            if (qzeros != nullptr) {
                const uint32_t z = (in_z[geo.zero_index(rb, kc, g, c)] >> (4 * h)) & 15u;
                reinterpret_cast<uint32_t*>(qzeros)[(n / 8) * geo.groups + grp] |= z << (4 * (n % 8));
            }
        }
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
