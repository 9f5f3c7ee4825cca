// The GGUF block formats on the host, generated from the X-macro QG_GGUF_FORMATS
// (formats/blocks.h): the one table of their ids, names and block geometry (api.cpp's
// checks, messages and qg_format_block; the GPU launchers' QG_LOG lines), and
// with_gguf_format, the one runtime-to-template switch of the GPU launchers.
// A format added to the X-macro appears in all of them with nothing written here.
#pragma once

#include <type_traits>

#include "formats/blocks.h"
#include "quantgemm.h"

namespace qg {

// A format's name as the pyquant registry spells it ("q4_K", "iq4_xs"): the enum suffix
// in lower case, except the K of the K-quants.
struct RegistryName {
    char text[16];
};
constexpr RegistryName registry_name(const char* suffix) {
    RegistryName r{};
    for (int i = 0; suffix[i] != 0 && i < 15; ++i) {
        const bool k_quant = suffix[i] == 'K' && i > 0 && suffix[i - 1] == '_';
        r.text[i] = (suffix[i] >= 'A' && suffix[i] <= 'Z' && !k_quant) ? (char)(suffix[i] - 'A' + 'a') : suffix[i];
    }
    return r;
}

struct GgufFormat {
    int format;             // QG_FORMAT_Q4_K
    const char* enum_name;  // "QG_FORMAT_Q4_K"
    const char* name;       // "Q4_K"
    RegistryName registry;  // "q4_K"
    int elems;              // elements per block
    int bytes;              // bytes per block: sizeof the block struct
};

inline constexpr GgufFormat kGgufFormats[] = {
#define QG_X(NAME, BLOCK, ELEMS) \
    {QG_FORMAT_##NAME, "QG_FORMAT_" #NAME, #NAME, registry_name(#NAME), ELEMS, (int)sizeof(BLOCK)},
    QG_GGUF_FORMATS(QG_X)
#undef QG_X
};

// "Q8_0, Q4_0, ...": the formats in X-macro order, for messages (", Q8_0, Q4_0, ..." from
// the X-macro, past its leading ", ").
#define QG_X(NAME, BLOCK, ELEMS) ", " #NAME
inline constexpr const char* kGgufFormatNames = &(QG_GGUF_FORMATS(QG_X))[2];
#undef QG_X

// The row of `format`, or nullptr when it is not a GGUF block format.
inline const GgufFormat* gguf_format(int format) {
    for (const GgufFormat& g : kGgufFormats)
        if (g.format == format) return &g;
    return nullptr;
}

// The registry name of `format` ("q4_K"), or "?" when it is not a GGUF block format.
inline const char* gguf_registry_name(int format) {
    const GgufFormat* g = gguf_format(format);
    return g != nullptr ? g->registry.text : "?";
}

// f(std::integral_constant<int, QG_FORMAT_X>{}) for the GGUF format `format` (a generic
// lambda reads it as the template argument decltype(fmt)::value), otherwise() when
// `format` is not one.
template <class F, class Otherwise>
auto with_gguf_format(int format, F&& f, Otherwise&& otherwise) -> decltype(otherwise()) {
    switch (format) {
#define QG_X(NAME, BLOCK, ELEMS) \
    case QG_FORMAT_##NAME: return f(std::integral_constant<int, QG_FORMAT_##NAME>{});
        QG_GGUF_FORMATS(QG_X)
#undef QG_X
        default: return otherwise();
    }
}

}  // namespace qg
