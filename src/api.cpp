// The C ABI of include/quantgemm.h: the only file that implements it.
//
// Every entry point: read the argument struct (size-checked), check every argument and
// name the exact failed condition, return at once on an empty problem, then route to the
// tier of the context's backend (qg::cpu_* or qg::gpu_*, src/tiers.h). No exception
// leaves this file: each entry point runs inside guarded().
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>
#include <thread>

#include "dtypes.h"
#include "formats/blocks.h"
#include "formats/gguf_formats.h"
#include "formats/gguf_frag.h"
#include "formats/gguf_rows8.h"
#include "formats/w4a16_frag.h"
#include "moe_sizes.h"
#include "quantgemm.h"
#include "tier_table.h"
#include "tiers.h"

namespace qg {
const char* last_error();  // src/error.cpp
}

namespace {

using qg::dtype_name;
using qg::dtype_size;
using qg::gguf_format;
using qg::GgufFormat;
using qg::set_error;

// ------------------------------------------------------------------ helpers

#define QG_CHECK(cond, ...)                                                       \
    do {                                                                          \
        if (!(cond)) return ::qg::set_error(QG_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

#define QG_TRY(expr)                      \
    do {                                  \
        const qg_status qg_st_ = (expr);  \
        if (qg_st_ != QG_OK) return qg_st_; \
    } while (0)

// Runs an entry point's body; a C++ exception becomes a status and a sentence.
template <class F>
qg_status guarded(const char* fn, F&& body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return set_error(QG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    } catch (const std::exception& e) {
        return set_error(QG_ERR_INTERNAL, "%s: %s", fn, e.what());
    } catch (...) {
        return set_error(QG_ERR_INTERNAL, "%s: unknown C++ exception", fn);
    }
}

typedef long long ll;  // printf of int64_t

// Name of an enum value, or its number (in a per-call buffer) when it is not one.
struct EnumText {
    char buf[32];
    const char* operator()(const char* name, int value) {
        if (name != nullptr) return name;
        snprintf(buf, sizeof(buf), "%d", value);
        return buf;
    }
};

const char* backend_name(int b) {
    switch (b) {
        case QG_BACKEND_CPU: return "QG_BACKEND_CPU";
        case QG_BACKEND_CUDA: return "QG_BACKEND_CUDA";
        case QG_BACKEND_HIP: return "QG_BACKEND_HIP";
        default: return nullptr;
    }
}

// "QG_FORMAT_Q4_K", or nullptr when f is not a qg_format value (the GGUF names come from
// the one table of formats/gguf_formats.h).
const char* format_name(int f) {
    if (f == QG_FORMAT_INT4) return "QG_FORMAT_INT4";
    if (f == QG_FORMAT_MXFP4) return "QG_FORMAT_MXFP4";
    const GgufFormat* g = gguf_format(f);
    return g != nullptr ? g->enum_name : nullptr;
}

// The GPU backend compiled into this build, if any.
#if defined(QG_GPU_IS_CUDA)
constexpr int kGpuBackend = QG_BACKEND_CUDA;
[[maybe_unused]] constexpr const char* kGpuName = "CUDA";
#elif defined(QG_GPU_IS_HIP)
constexpr int kGpuBackend = QG_BACKEND_HIP;
[[maybe_unused]] constexpr const char* kGpuName = "HIP";
#else
constexpr int kGpuBackend = -1;
[[maybe_unused]] constexpr const char* kGpuName = "";
#endif

bool is_gpu(const qg_context* ctx) { return ctx->backend != QG_BACKEND_CPU; }

qg_status check_ctx(const qg_context* ctx) {
    QG_CHECK(ctx != nullptr, "ctx is NULL");
    return QG_OK;
}

// p non-NULL and aligned to `align` bytes; `why` says where the alignment comes from.
qg_status check_ptr(const void* p, const char* name, size_t align, const char* why) {
    QG_CHECK(p != nullptr, "%s is NULL", name);
    QG_CHECK((uintptr_t)p % align == 0, "%s=%p is not aligned to %zu bytes (%s)", name, p, align, why);
    return QG_OK;
}

// Like check_ptr, but NULL is allowed (optional operands: qzeros, bias).
qg_status check_opt_ptr(const void* p, const char* name, size_t align, const char* why) {
    if (p == nullptr) return QG_OK;
    return check_ptr(p, name, align, why);
}

// Float-like dtypes accepted as activations, outputs or biases: bit i set = dtype i allowed.
constexpr unsigned kF32 = 1u << QG_DTYPE_F32, kF16 = 1u << QG_DTYPE_F16, kBF16 = 1u << QG_DTYPE_BF16;

// field=value must be one of `allowed`; `what` names the operation and the accepted set.
qg_status check_dtype(const char* field, int v, unsigned allowed, const char* what) {
    EnumText t;
    QG_CHECK(dtype_name(v) != nullptr, "%s=%s is not a qg_dtype value", field, t(nullptr, v));
    QG_CHECK((allowed >> v) & 1u, "%s=%s is not supported by %s", field, dtype_name(v), what);
    return QG_OK;
}

// The optional bias [N] of a dense GEMM: its dtype when there is one (bias_dtype is ignored
// without it); `what` names the family ("W4A16 bias").
qg_status check_bias(const void* bias, int bias_dtype, const char* what, bool pointers) {
    if (bias == nullptr) return QG_OK;
    char valid[64];
    snprintf(valid, sizeof(valid), "%s (fp32, fp16 or bf16)", what);
    QG_TRY(check_dtype("bias_dtype", bias_dtype, kF32 | kF16 | kBF16, valid));
    return pointers ? check_ptr(bias, "bias", dtype_size(bias_dtype), dtype_name(bias_dtype)) : QG_OK;
}

// Output dtype: the activation dtype or F32.
qg_status check_y_dtype(const char* field, int y, const char* x_field, int x) {
    EnumText t;
    QG_CHECK(dtype_name(y) != nullptr, "%s=%s is not a qg_dtype value", field, t(nullptr, y));
    QG_CHECK(y == x || y == QG_DTYPE_F32, "%s=%s must be %s=%s or QG_DTYPE_F32", field, dtype_name(y), x_field,
             dtype_name(x));
    return QG_OK;
}

qg_status check_positive(const char* field, int64_t v) {
    QG_CHECK(v > 0, "%s=%lld must be positive", field, (ll)v);
    return QG_OK;
}

qg_status check_ld(const char* ld_name, int64_t ld, const char* dim_name, int64_t dim) {
    QG_CHECK(ld >= dim, "%s=%lld < %s=%lld", ld_name, (ll)ld, dim_name, (ll)dim);
    return QG_OK;
}

// `array` has `rows` rows of stride ld_name=ld elements of esize bytes: its byte offsets
// must fit in int64 (a guard against sizes that wrap around before memory is touched).
qg_status check_extent(const char* ld_name, int64_t ld, const char* array, int64_t rows, int64_t esize) {
    QG_CHECK(rows <= 0 || ld <= 0 || ld <= INT64_MAX / esize / rows,
             "%s=%lld is too large: %lld rows of %s overflow 64-bit byte offsets", ld_name, (ll)ld, (ll)rows, array);
    return QG_OK;
}

[[maybe_unused]] qg_status check_workspace(void* ws, size_t ws_bytes, size_t required, const char* query) {
    if (required == 0) return QG_OK;
    QG_CHECK(ws_bytes >= required, "workspace_bytes=%zu < %zu bytes required (%s)", ws_bytes, required, query);
    return check_ptr(ws, "workspace", 16, "workspace");
}

// Argument structs: accept the size of any version of the struct, or a larger one (a newer
// caller), and read only the fields that fit; fields a version lacks read as zero (NULL).
// Every struct lists the sizes of its older versions here, written as numbers (LP64):
// sizeof(T) is always the newest.
template <class T>
struct ArgsInfo;
#define QG_ARGS_INFO(T, ...)                                                     \
    template <>                                                                  \
    struct ArgsInfo<T> {                                                         \
        static constexpr const char* name = #T;                                  \
        static constexpr size_t sizes[] = {__VA_ARGS__ sizeof(T)};  /* oldest first */ \
    };
// qg_w4a16_gemm_args: 128 bytes, then `layout` (format 2): 136, then `bias`, `bias_dtype`.
QG_ARGS_INFO(qg_w4a16_gemm_args, 128, 136, )
QG_ARGS_INFO(qg_w4a16_repack_args, )
// qg_gguf_gemm_args: 112 bytes, then `bias`, `bias_dtype`: 128, then `w_scales`, `layout` (format 5).
QG_ARGS_INFO(qg_gguf_gemm_args, 112, 128, )
QG_ARGS_INFO(qg_gguf_repack_args, )
// qg_mxfp4_gemm_args: 120 bytes, then `layout` (format 3).
QG_ARGS_INFO(qg_mxfp4_gemm_args, 120, )
QG_ARGS_INFO(qg_mxfp4_repack_args, )
QG_ARGS_INFO(qg_moe_align_args, )
// qg_moe_stage1_args / qg_moe_stage2_args: 152 bytes, then `layout`, `workspace`,
// `workspace_bytes` (format 4).
QG_ARGS_INFO(qg_moe_stage1_args, 152, )
QG_ARGS_INFO(qg_moe_stage2_args, 152, )
QG_ARGS_INFO(qg_moe_repack_args, )
#undef QG_ARGS_INFO
static_assert(sizeof(void*) != 8 || (offsetof(qg_moe_stage1_args, layout) == 152 &&
                                     offsetof(qg_moe_stage2_args, layout) == 152),
              "qg_moe_stage1_args / qg_moe_stage2_args: their first version ends at byte 152");
static_assert(sizeof(void*) != 8 || (offsetof(qg_w4a16_gemm_args, layout) == 128 &&
                                     offsetof(qg_w4a16_gemm_args, bias) == 136),
              "qg_w4a16_gemm_args: its first version ends at byte 128, the second at 136");
static_assert(sizeof(void*) != 8 || (offsetof(qg_gguf_gemm_args, bias) == 112 &&
                                     offsetof(qg_gguf_gemm_args, w_scales) == 128),
              "qg_gguf_gemm_args: its first version ends at byte 112, the second at 128");
static_assert(sizeof(void*) != 8 || offsetof(qg_mxfp4_gemm_args, layout) == 120,
              "qg_mxfp4_gemm_args: its first version ends at byte 120");

// "128, 136 or 152 bytes": the sizes of T's versions, for a message (thread-local text).
template <class T>
const char* version_sizes() {
    thread_local char buf[96];
    constexpr size_t versions = sizeof(ArgsInfo<T>::sizes) / sizeof(ArgsInfo<T>::sizes[0]);
    int used = 0;
    for (size_t v = 0; v < versions && used < (int)sizeof(buf); ++v) {
        const char* sep = v == 0 ? "" : v + 1 == versions ? " or " : ", ";
        used += snprintf(buf + used, sizeof(buf) - (size_t)used, "%s%zu", sep, ArgsInfo<T>::sizes[v]);
    }
    if (used < (int)sizeof(buf)) snprintf(buf + used, sizeof(buf) - (size_t)used, " bytes");
    return buf;
}

template <class T>
qg_status read_args(const T* in, T* out) {
    typedef ArgsInfo<T> I;
    constexpr size_t versions = sizeof(I::sizes) / sizeof(I::sizes[0]);
    QG_CHECK(in != nullptr, "args is NULL");
    QG_CHECK(reinterpret_cast<uintptr_t>(in) % alignof(T) == 0, "args=%p is not %zu-byte aligned (%s)",
             static_cast<const void*>(in), alignof(T), I::name);
    QG_CHECK(in->size >= I::sizes[0], "args->size=%zu is smaller than the oldest known struct (%s is %zu bytes)",
             in->size, I::name, I::sizes[0]);
    // a size between two versions would cut a field in half: only a version's own size
    // or one at least this build's (a newer, larger struct) is a struct
    bool known = in->size >= sizeof(T);
    for (size_t v = 0; v < versions; ++v) known = known || in->size == I::sizes[v];
    QG_CHECK(known, "args->size=%zu is not the size of a version of %s (%s)", in->size, I::name, version_sizes<T>());
    memset(out, 0, sizeof(T));
    memcpy(out, in, std::min(in->size, sizeof(T)));
    return QG_OK;
}

// ------------------------------------------------------------------ per-family checks

qg_status check_w4a16_layout(int layout) {
    EnumText t;
    QG_CHECK(layout == QG_W4A16_LAYOUT_CANONICAL || layout == QG_W4A16_LAYOUT_FRAG,
             "layout=%s is not a qg_w4a16_layout value (0 canonical, 1 frag)", t(nullptr, layout));
    return QG_OK;
}

qg_status check_w4a16(const qg_w4a16_gemm_args& a, bool pointers) {
    QG_CHECK(a.m >= 0, "m=%lld is negative", (ll)a.m);
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    const int G = a.group_size;
    QG_CHECK(G == 32 || G == 64 || G == 128, "group_size=%d is not one of 32, 64, 128", G);
    QG_CHECK(a.k % G == 0, "k=%lld is not a multiple of group_size=%d", (ll)a.k, G);
    QG_CHECK(a.n % 8 == 0, "n=%lld is not a multiple of 8 (qzeros pack 8 rows per word)", (ll)a.n);
    QG_TRY(check_dtype("x_dtype", a.x_dtype, kF16 | kBF16, "W4A16 (fp16 or bf16)"));
    QG_TRY(check_y_dtype("y_dtype", a.y_dtype, "x_dtype", a.x_dtype));
    QG_TRY(check_dtype("scale_dtype", a.scale_dtype, kF16 | kBF16, "W4A16 scales (fp16 or bf16)"));
    QG_TRY(check_bias(a.bias, a.bias_dtype, "W4A16 bias", false));
    if (a.qzeros != nullptr) {
        EnumText t;
        const int z = a.zero_dtype;
        QG_CHECK(dtype_name(z) != nullptr, "zero_dtype=%s is not a qg_dtype value", t(nullptr, z));
        QG_CHECK(z == QG_DTYPE_U4X8, "zero_dtype=%s: zero-points must be packed 4-bit words (QG_DTYPE_U4X8)%s",
                 dtype_name(z),
                 (z == QG_DTYPE_F16 || z == QG_DTYPE_BF16 || z == QG_DTYPE_F32) ? ", not the activation dtype" : "");
    }
    QG_TRY(check_ld("ldx", a.ldx, "k", a.k));
    QG_TRY(check_ld("ldy", a.ldy, "n", a.n));
    QG_TRY(check_extent("ldx", a.ldx, "x", a.m, (int64_t)dtype_size(a.x_dtype)));
    QG_TRY(check_extent("ldy", a.ldy, "y", a.m, (int64_t)dtype_size(a.y_dtype)));
    QG_TRY(check_extent("k", a.k, "qweight (k/8 words per row)", a.n, 1));
    QG_TRY(check_w4a16_layout(a.layout));
    const bool frag = a.layout == QG_W4A16_LAYOUT_FRAG;
    if (pointers) {
        QG_TRY(check_ptr(a.x, "x", dtype_size(a.x_dtype), dtype_name(a.x_dtype)));
        if (frag) {
            // the frag planes are read with 16-byte loads (qg_malloc's alignment is larger)
            QG_TRY(check_ptr(a.qweight, "qweight", 16, "frag layout: 16-byte fragment loads"));
            QG_TRY(check_ptr(a.scales, "scales", 16, "frag layout: 16-byte scale records"));
            QG_TRY(check_opt_ptr(a.qzeros, "qzeros", 16, "frag layout: 16-byte zero records"));
        } else {
            QG_TRY(check_ptr(a.qweight, "qweight", 4, "int32 words"));
            QG_TRY(check_ptr(a.scales, "scales", dtype_size(a.scale_dtype), dtype_name(a.scale_dtype)));
            QG_TRY(check_opt_ptr(a.qzeros, "qzeros", 4, "int32 words"));
        }
        QG_TRY(check_bias(a.bias, a.bias_dtype, "W4A16 bias", true));
        QG_TRY(check_ptr(a.y, "y", dtype_size(a.y_dtype), dtype_name(a.y_dtype)));
    }
    return QG_OK;
}

// [lo, lo + bytes) and [lo2, lo2 + bytes2) share no byte
bool disjoint(const void* p, size_t bytes, const void* q, size_t bytes2) {
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return p == nullptr || q == nullptr || a + bytes <= b || b + bytes2 <= a;
}

qg_status check_w4a16_repack(const qg_w4a16_repack_args& a, bool pointers) {
    EnumText t;
    QG_CHECK(a.layout == QG_W4A16_LAYOUT_FRAG, "layout=%s: qg_w4a16_repack produces QG_W4A16_LAYOUT_FRAG (1) only",
             t(a.layout == QG_W4A16_LAYOUT_CANONICAL ? "QG_W4A16_LAYOUT_CANONICAL" : nullptr, a.layout));
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    const int G = a.group_size;
    QG_CHECK(G == 32 || G == 64 || G == 128, "group_size=%d is not one of 32, 64, 128", G);
    QG_CHECK(a.k % G == 0, "k=%lld is not a multiple of group_size=%d", (ll)a.k, G);
    QG_CHECK(a.n % 8 == 0, "n=%lld is not a multiple of 8 (qzeros pack 8 rows per word)", (ll)a.n);
    QG_TRY(check_dtype("scale_dtype", a.scale_dtype, kF16 | kBF16, "W4A16 scales (fp16 or bf16)"));
    QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "qweight (k/8 words per row)", a.n + qg::frag::kRowBlock, 1));
    if (!pointers) return QG_OK;
    QG_TRY(check_ptr(a.qweight, "qweight", 4, "int32 words"));
    QG_TRY(check_ptr(a.scales, "scales", 2, dtype_name(a.scale_dtype)));
    QG_TRY(check_opt_ptr(a.qzeros, "qzeros", 4, "int32 words"));
    QG_TRY(check_ptr(a.out_qweight, "out_qweight", 16, "frag layout: 16-byte fragment loads"));
    QG_TRY(check_ptr(a.out_scales, "out_scales", 16, "frag layout: 16-byte scale records"));
    QG_CHECK((a.qzeros == nullptr) == (a.out_qzeros == nullptr),
             "out_qzeros must be given exactly when qzeros is (it is %s, qzeros is %s)", a.out_qzeros ? "set" : "NULL",
             a.qzeros ? "set" : "NULL");
    QG_TRY(check_opt_ptr(a.out_qzeros, "out_qzeros", 16, "frag layout: 16-byte zero records"));
    const qg::frag::Geometry geo(a.n, a.k, G);
    const size_t in_q = (size_t)a.n * (size_t)(a.k / 8) * 4, in_s = (size_t)a.n * (size_t)(a.k / G) * 2;
    const size_t in_z = a.qzeros ? (size_t)(a.n / 8) * (size_t)(a.k / G) * 4 : 0;
    const void* outs[3] = {a.out_qweight, a.out_scales, a.out_qzeros};
    const size_t out_bytes[3] = {(size_t)geo.qweight_bytes(), (size_t)geo.scales_bytes(), (size_t)geo.qzeros_bytes()};
    const char* out_names[3] = {"out_qweight", "out_scales", "out_qzeros"};
    for (int i = 0; i < 3; ++i) {
        QG_CHECK(disjoint(outs[i], out_bytes[i], a.qweight, in_q) && disjoint(outs[i], out_bytes[i], a.scales, in_s) &&
                     disjoint(outs[i], out_bytes[i], a.qzeros, in_z),
                 "%s overlaps an input array (the repack reads the canonical arrays while it writes)", out_names[i]);
        for (int j = 0; j < i; ++j)
            QG_CHECK(disjoint(outs[i], out_bytes[i], outs[j], out_bytes[j]), "%s overlaps %s", out_names[i],
                     out_names[j]);
    }
    return QG_OK;
}

// The GGUF block format of a qg_format value (gemm and repack).
qg_status check_gguf_format(int format, const GgufFormat** out) {
    EnumText t;
    *out = gguf_format(format);
    QG_CHECK(format_name(format) != nullptr, "format=%s is not a qg_format value", t(nullptr, format));
    QG_CHECK(*out != nullptr, "format=%s is not a GGUF block format (%s)", format_name(format), qg::kGgufFormatNames);
    return QG_OK;
}

// The row stride of the .gguf blocks of a [*, k] weight (gemm on the block layout, repack).
qg_status check_gguf_rows(const GgufFormat* f, int64_t k, int64_t ldw) {
    const int64_t row_bytes = k / f->elems * f->bytes;
    QG_CHECK(ldw >= row_bytes, "ldw=%lld < %lld bytes per row (k=%lld is %lld %s blocks of %d bytes)", (ll)ldw,
             (ll)row_bytes, (ll)k, (ll)(k / f->elems), f->name, f->bytes);
    QG_CHECK(ldw % 2 == 0, "ldw=%lld is odd: GGUF rows must start 2-byte aligned (fp16 scales)", (ll)ldw);
    return QG_OK;
}

// The frag layout of a GGUF format (qg_gguf_repack): every GGUF format has one since IQ3_XXS's;
// the check keeps a format added later without one from reaching the repacks.
qg_status check_gguf_frag_format(const GgufFormat* f) {
    QG_CHECK(qg::gguf_frag::has_frag_layout(f->format),
             "format=%s has no frag layout yet (QG_GGUF_LAYOUT_FRAG: q8_0, q4_0, q4_K, iq4_xs, q6_K and iq3_xxs only)",
             f->name);
    return QG_OK;
}

qg_status check_gguf(const qg_gguf_gemm_args& a, bool pointers) {
    QG_CHECK(a.m >= 0, "m=%lld is negative", (ll)a.m);
    EnumText t;
    const GgufFormat* f = nullptr;
    QG_TRY(check_gguf_format(a.format, &f));
    QG_CHECK(a.layout == QG_GGUF_LAYOUT_BLOCKS || a.layout == QG_GGUF_LAYOUT_FRAG || a.layout == QG_GGUF_LAYOUT_ROWS8,
             "layout=%s is not a qg_gguf_layout value (0 blocks, 1 frag, 2 rows8)", t(nullptr, a.layout));
    const bool frag = a.layout == QG_GGUF_LAYOUT_FRAG, rows8 = a.layout == QG_GGUF_LAYOUT_ROWS8;
    if (frag) QG_TRY(check_gguf_frag_format(f));
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    QG_CHECK(a.k % f->elems == 0, "k=%lld is not a multiple of the %s block (%d elements)", (ll)a.k, f->name,
             f->elems);
    QG_CHECK(a.k / f->elems <= INT64_MAX / f->bytes, "k=%lld is too large: a row's bytes overflow int64", (ll)a.k);
    if (!frag && !rows8) QG_TRY(check_gguf_rows(f, a.k, a.ldw));  // the repacked planes have no row stride
    QG_TRY(check_dtype("x_dtype", a.x_dtype, kF32 | kF16 | kBF16, "GGUF GEMM (fp32, fp16 or bf16)"));
    QG_TRY(check_y_dtype("y_dtype", a.y_dtype, "x_dtype", a.x_dtype));
    QG_TRY(check_bias(a.bias, a.bias_dtype, "GGUF bias", false));
    QG_TRY(check_ld("ldx", a.ldx, "k", a.k));
    QG_TRY(check_ld("ldy", a.ldy, "n", a.n));
    QG_TRY(check_extent("ldx", a.ldx, "x", a.m, (int64_t)dtype_size(a.x_dtype)));
    QG_TRY(check_extent("ldy", a.ldy, "y", a.m, (int64_t)dtype_size(a.y_dtype)));
    if (frag)  // the planes hold N and K padded to 16 and 128
        QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "w (the frag plane: k/2 or k bytes per padded row)",
                            a.n + qg::frag::kRowBlock, 1));
    else if (rows8)  // the plane holds N padded to 8
        QG_TRY(check_extent("k", a.k / f->elems * f->bytes, "w (the rows8 plane)", a.n + qg::gguf_rows8::kRows, 1));
    else
        QG_TRY(check_extent("ldw", a.ldw, "w", a.n, 1));
    if (pointers) {
        QG_TRY(check_ptr(a.x, "x", dtype_size(a.x_dtype), dtype_name(a.x_dtype)));
        if (frag) {
            QG_TRY(check_ptr(a.w, "w", 16, "frag layout: 16-byte fragment loads"));
            QG_TRY(check_ptr(a.w_scales, "w_scales", 16, "frag layout: 16-byte scale records"));
        } else {
            QG_TRY(check_ptr(a.w, "w", 2, "GGUF blocks hold fp16 scales"));
        }
        QG_TRY(check_bias(a.bias, a.bias_dtype, "GGUF bias", true));
        QG_TRY(check_ptr(a.y, "y", dtype_size(a.y_dtype), dtype_name(a.y_dtype)));
    }
    return QG_OK;
}

// qg_gguf_repack into the rows8 layout (every format; one plane, the blocks moved whole).
qg_status check_gguf_repack_rows8(const qg_gguf_repack_args& a, const GgufFormat* f, bool pointers) {
    const int64_t row_bytes = a.k / f->elems * f->bytes;
    QG_TRY(check_extent("k", row_bytes, "out_w (the rows8 plane)", a.n + qg::gguf_rows8::kRows, 1));
    if (!pointers) return QG_OK;
    QG_TRY(check_gguf_rows(f, a.k, a.ldw));
    QG_TRY(check_extent("ldw", a.ldw, "w", a.n, 1));
    QG_TRY(check_ptr(a.w, "w", 2, "GGUF blocks hold fp16 scales"));
    QG_TRY(check_ptr(a.out_w, "out_w", 2, "GGUF blocks hold fp16 scales"));
    const size_t in_w = (size_t)(a.n - 1) * (size_t)a.ldw + (size_t)row_bytes;
    const size_t out_w = (size_t)qg::gguf_rows8::plane_bytes(a.n, a.k / f->elems, f->bytes);
    QG_CHECK(disjoint(a.out_w, out_w, a.w, in_w), "out_w overlaps w (the repack reads the blocks while it writes)");
    return QG_OK;
}

qg_status check_gguf_repack(const qg_gguf_repack_args& a, bool pointers) {
    EnumText t;
    QG_CHECK(a.layout == QG_GGUF_LAYOUT_FRAG || a.layout == QG_GGUF_LAYOUT_ROWS8,
             "layout=%s: qg_gguf_repack produces QG_GGUF_LAYOUT_FRAG (1) or QG_GGUF_LAYOUT_ROWS8 (2)",
             t(a.layout == QG_GGUF_LAYOUT_BLOCKS ? "QG_GGUF_LAYOUT_BLOCKS" : nullptr, a.layout));
    const GgufFormat* f = nullptr;
    QG_TRY(check_gguf_format(a.format, &f));
    const bool rows8 = a.layout == QG_GGUF_LAYOUT_ROWS8;
    if (!rows8) QG_TRY(check_gguf_frag_format(f));
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    QG_CHECK(a.k % f->elems == 0, "k=%lld is not a multiple of the %s block (%d elements)", (ll)a.k, f->name, f->elems);
    if (rows8) {
        QG_CHECK(a.k / f->elems <= INT64_MAX / f->bytes, "k=%lld is too large: a row's bytes overflow int64", (ll)a.k);
        return check_gguf_repack_rows8(a, f, pointers);
    }
    QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "out_w (k/2 or k bytes per padded row)", a.n + qg::frag::kRowBlock, 1));
    if (!pointers) return QG_OK;
    QG_TRY(check_gguf_rows(f, a.k, a.ldw));
    QG_TRY(check_extent("ldw", a.ldw, "w", a.n, 1));
    QG_TRY(check_ptr(a.w, "w", 2, "GGUF blocks hold fp16 scales"));
    QG_TRY(check_ptr(a.out_w, "out_w", 16, "frag layout: 16-byte fragment loads"));
    QG_TRY(check_ptr(a.out_scales, "out_scales", 16, "frag layout: 16-byte scale records"));
    const qg::frag::Geometry geo(a.n, a.k, 32);
    const size_t in_w = (size_t)(a.n - 1) * (size_t)a.ldw + (size_t)(a.k / f->elems * f->bytes);
    const size_t out_w = (size_t)qg::gguf_frag::weights_plane_bytes(a.format, geo),
                 out_s = (size_t)qg::gguf_frag::scales_plane_bytes(a.format, geo);
    QG_CHECK(disjoint(a.out_w, out_w, a.w, in_w), "out_w overlaps w (the repack reads the blocks while it writes)");
    QG_CHECK(disjoint(a.out_scales, out_s, a.w, in_w), "out_scales overlaps w (the repack reads the blocks while it writes)");
    QG_CHECK(disjoint(a.out_scales, out_s, a.out_w, out_w), "out_scales overlaps out_w");
    return QG_OK;
}

qg_status check_mxfp4_layout(int layout) {
    EnumText t;
    QG_CHECK(layout == QG_MXFP4_LAYOUT_CANONICAL || layout == QG_MXFP4_LAYOUT_FRAG,
             "layout=%s is not a qg_mxfp4_layout value (0 canonical, 1 frag)", t(nullptr, layout));
    return QG_OK;
}

qg_status check_mxfp4(const qg_mxfp4_gemm_args& a, bool pointers) {
    QG_CHECK(a.m >= 0, "m=%lld is negative", (ll)a.m);
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    QG_CHECK(a.k % 32 == 0, "k=%lld is not a multiple of 32 (MXFP4 blocks)", (ll)a.k);
    QG_TRY(check_dtype("x_dtype", a.x_dtype, kF32 | kF16 | kBF16, "MXFP4 GEMM (fp32, fp16 or bf16)"));
    QG_TRY(check_y_dtype("y_dtype", a.y_dtype, "x_dtype", a.x_dtype));
    QG_TRY(check_bias(a.bias, a.bias_dtype, "MXFP4 bias", false));
    QG_TRY(check_ld("ldx", a.ldx, "k", a.k));
    QG_TRY(check_ld("ldy", a.ldy, "n", a.n));
    QG_TRY(check_extent("ldx", a.ldx, "x", a.m, (int64_t)dtype_size(a.x_dtype)));
    QG_TRY(check_extent("ldy", a.ldy, "y", a.m, (int64_t)dtype_size(a.y_dtype)));
    QG_TRY(check_mxfp4_layout(a.layout));
    const bool frag = a.layout == QG_MXFP4_LAYOUT_FRAG;
    if (frag)  // the planes hold N and K padded to 16 and 128
        QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "blocks (the frag plane: k/2 bytes per padded row)",
                            a.n + qg::frag::kRowBlock, 1));
    else
        QG_TRY(check_extent("k", a.k, "blocks (k/2 bytes per row)", a.n, 1));
    if (pointers) {
        QG_TRY(check_ptr(a.x, "x", dtype_size(a.x_dtype), dtype_name(a.x_dtype)));
        if (frag) {
            // the frag planes are read with 16-byte loads (qg_malloc's alignment is larger)
            QG_TRY(check_ptr(a.blocks, "blocks", 16, "frag layout: 16-byte fragment loads"));
            QG_TRY(check_ptr(a.scales, "scales", 16, "frag layout: 16-byte scale records"));
        } else {
            QG_TRY(check_ptr(a.blocks, "blocks", 1, "bytes"));
            QG_TRY(check_ptr(a.scales, "scales", 1, "bytes"));
        }
        QG_TRY(check_bias(a.bias, a.bias_dtype, "MXFP4 bias", true));
        QG_TRY(check_ptr(a.y, "y", dtype_size(a.y_dtype), dtype_name(a.y_dtype)));
    }
    return QG_OK;
}

// gpu: the repack runs on a GPU context, whose kernel reads the canonical blocks as 32-bit
// words (the host loop reads them at any alignment).
// The pointers of an MXFP4 repack (dense or MoE): canonical rows x k in, two planes of the
// given sizes out, none overlapping.
qg_status check_mxfp4_repack_ptrs(const uint8_t* blocks, const uint8_t* scales, const void* out_blocks,
                                  const void* out_scales, size_t rows, int64_t k, size_t out_b, size_t out_s,
                                  bool gpu) {
    QG_TRY(check_ptr(blocks, "blocks", gpu ? 4 : 1, gpu ? "the GPU repack reads them as 32-bit words" : "bytes"));
    QG_TRY(check_ptr(scales, "scales", 1, "bytes"));
    QG_TRY(check_ptr(out_blocks, "out_blocks", 16, "frag layout: 16-byte fragment loads"));
    QG_TRY(check_ptr(out_scales, "out_scales", 16, "frag layout: 16-byte scale records"));
    const size_t in_b = rows * (size_t)(k / 2), in_s = rows * (size_t)(k / 32);
    const void* outs[2] = {out_blocks, out_scales};
    const size_t out_bytes[2] = {out_b, out_s};
    const char* out_names[2] = {"out_blocks", "out_scales"};
    for (int i = 0; i < 2; ++i)
        QG_CHECK(disjoint(outs[i], out_bytes[i], blocks, in_b) && disjoint(outs[i], out_bytes[i], scales, in_s),
                 "%s overlaps an input array (the repack reads the canonical arrays while it writes)", out_names[i]);
    QG_CHECK(disjoint(outs[1], out_bytes[1], outs[0], out_bytes[0]), "out_scales overlaps out_blocks");
    return QG_OK;
}

qg_status check_mxfp4_repack(const qg_mxfp4_repack_args& a, bool pointers, bool gpu) {
    EnumText t;
    QG_CHECK(a.layout == QG_MXFP4_LAYOUT_FRAG, "layout=%s: qg_mxfp4_repack produces QG_MXFP4_LAYOUT_FRAG (1) only",
             t(a.layout == QG_MXFP4_LAYOUT_CANONICAL ? "QG_MXFP4_LAYOUT_CANONICAL" : nullptr, a.layout));
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    QG_CHECK(a.k % 32 == 0, "k=%lld is not a multiple of 32 (MXFP4 blocks)", (ll)a.k);
    QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "blocks (k/2 bytes per row)", a.n + qg::frag::kRowBlock, 1));
    if (!pointers) return QG_OK;
    const qg::frag::Geometry geo = qg::frag::Geometry(a.n, a.k, qg::MXFP4_BLOCK);
    return check_mxfp4_repack_ptrs(a.blocks, a.scales, a.out_blocks, a.out_scales, (size_t)a.n, a.k,
                                   (size_t)geo.qweight_bytes(), (size_t)geo.scales_bytes(), gpu);
}

qg_status check_moe_repack(const qg_moe_repack_args& a, bool pointers, bool gpu) {
    EnumText t;
    QG_CHECK(a.layout == QG_MXFP4_LAYOUT_FRAG, "layout=%s: qg_moe_repack produces QG_MXFP4_LAYOUT_FRAG (1) only",
             t(a.layout == QG_MXFP4_LAYOUT_CANONICAL ? "QG_MXFP4_LAYOUT_CANONICAL" : nullptr, a.layout));
    QG_CHECK(a.num_experts >= 1, "num_experts=%d must be positive", a.num_experts);
    QG_CHECK(a.parts == 1 || a.parts == 2, "parts=%d is not 1 (w2) or 2 (w13: gate, up)", a.parts);
    if (a.parts == 2)
        QG_CHECK(a.gate_up_layout == QG_GATE_UP_CONCAT || a.gate_up_layout == QG_GATE_UP_INTERLEAVED,
                 "gate_up_layout=%s is not a qg_gate_up_layout value", t(nullptr, a.gate_up_layout));
    QG_TRY(check_positive("n", a.n));
    QG_TRY(check_positive("k", a.k));
    QG_CHECK(a.n % a.parts == 0, "n=%lld is not a multiple of parts=%d (gate and up rows pair up)", (ll)a.n, a.parts);
    QG_CHECK(a.k % 32 == 0, "k=%lld is not a multiple of 32 (MXFP4 blocks)", (ll)a.k);
    // every plane, padded, must be addressable: E * (n + 16 parts) rows of k + 128 columns
    QG_CHECK(a.n + 16 * a.parts <= INT64_MAX / 8 / a.num_experts, "n=%lld x num_experts=%d overflows int64", (ll)a.n,
             a.num_experts);
    QG_TRY(check_extent("k", a.k + qg::frag::kKChunk, "blocks (k/2 bytes per row)",
                        (a.n + 16 * a.parts) * a.num_experts, 1));
    if (!pointers) return QG_OK;
    const qg::MoePart part(a);
    return check_mxfp4_repack_ptrs(a.blocks, a.scales, a.out_blocks, a.out_scales,
                                   (size_t)a.n * (size_t)a.num_experts, a.k, (size_t)part.blocks_offset(a.num_experts, 0),
                                   (size_t)part.scales_offset(a.num_experts, 0), gpu);
}

// Shared by align and both stages: routing sizes.
qg_status check_routing_sizes(int64_t T, int32_t top_k, int32_t E, int32_t tile_m) {
    QG_CHECK(T >= 0, "num_tokens=%lld is negative", (ll)T);
    QG_CHECK(E >= 1, "num_experts=%d must be positive", E);
    QG_CHECK(top_k >= 1, "top_k=%d is < 1", top_k);
    QG_CHECK(top_k <= E, "top_k=%d > num_experts=%d", top_k, E);
    QG_CHECK(tile_m == 16 || tile_m == 32 || tile_m == 64 || tile_m == 80 || tile_m == 96 || tile_m == 128 ||
                 tile_m == 256,
             "tile_m=%d is not one of 16, 32, 64, 80, 96, 128, 256", tile_m);
    // pair indices and sorted slots are int32: bound T*top_k before computing with it
    QG_CHECK(T <= INT32_MAX / top_k, "num_tokens=%lld x top_k=%d pairs do not fit int32 pair indices", (ll)T, top_k);
    int64_t max_sorted, max_tiles;
    qg::moe_align_sizes(T, top_k, E, tile_m, &max_sorted, &max_tiles);
    QG_CHECK(max_sorted <= INT32_MAX, "num_tokens=%lld x top_k=%d gives %lld sorted slots: more than int32 indices hold",
             (ll)T, top_k, (ll)max_sorted);
    return QG_OK;
}

qg_status check_routing_ptrs(const int32_t* sorted_ids, const int32_t* tile_experts, const int32_t* num_sorted) {
    QG_TRY(check_ptr(sorted_ids, "sorted_ids", 4, "int32"));
    QG_TRY(check_ptr(tile_experts, "tile_experts", 4, "int32"));
    QG_TRY(check_ptr(num_sorted, "num_sorted", 4, "int32"));
    return QG_OK;
}

qg_status check_moe_dims(int64_t T, int32_t top_k, int32_t E, int64_t hidden, int64_t intermediate) {
    QG_TRY(check_positive("hidden", hidden));
    QG_TRY(check_positive("intermediate", intermediate));
    QG_CHECK(hidden % 32 == 0, "hidden=%lld is not a multiple of 32 (MXFP4 blocks)", (ll)hidden);
    QG_CHECK(intermediate % 32 == 0, "intermediate=%lld is not a multiple of 32 (MXFP4 blocks)", (ll)intermediate);
    // w13 is [E, 2I, H/32, 16] bytes, w2 [E, H, I/32, 16], act [T*top_k, I]: no size may wrap
    QG_CHECK(hidden <= INT64_MAX / 4 / intermediate / E, "hidden=%lld x intermediate=%lld x num_experts=%d overflows int64",
             (ll)hidden, (ll)intermediate, E);
    QG_TRY(check_extent("intermediate", intermediate, "act", T * top_k, 4));
    return QG_OK;
}

qg_status check_mxfp4_layout_value(const char* name, int layout) {
    EnumText t;
    QG_CHECK(layout == QG_MXFP4_LAYOUT_CANONICAL || layout == QG_MXFP4_LAYOUT_FRAG,
             "%s=%s is not a qg_mxfp4_layout value (0 canonical, 1 frag)", name, t(nullptr, layout));
    return QG_OK;
}

qg_status check_moe_stage1(const qg_moe_stage1_args& a, bool pointers) {
    QG_TRY(check_routing_sizes(a.num_tokens, a.top_k, a.num_experts, a.tile_m));
    QG_TRY(check_moe_dims(a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate));
    QG_TRY(check_mxfp4_layout_value("layout", a.layout));
    QG_TRY(check_dtype("x_dtype", a.x_dtype, kF32 | kF16 | kBF16, "MoE (fp32, fp16 or bf16)"));
    QG_TRY(check_ld("ldx", a.ldx, "hidden", a.hidden));
    QG_TRY(check_extent("ldx", a.ldx, "x", a.num_tokens, (int64_t)dtype_size(a.x_dtype)));
    EnumText t;
    QG_CHECK(a.activation == QG_ACT_SILU_GLU || a.activation == QG_ACT_SWIGLU_OAI,
             "activation=%s is not a qg_activation value", t(nullptr, a.activation));
    QG_CHECK(a.gate_up_layout == QG_GATE_UP_CONCAT || a.gate_up_layout == QG_GATE_UP_INTERLEAVED,
             "gate_up_layout=%s is not a qg_gate_up_layout value", t(nullptr, a.gate_up_layout));
    if (a.activation == QG_ACT_SWIGLU_OAI) {
        QG_CHECK(isfinite(a.swiglu_alpha), "swiglu_alpha=%g is not finite", (double)a.swiglu_alpha);
        QG_CHECK(isfinite(a.swiglu_limit) && a.swiglu_limit > 0, "swiglu_limit=%g must be finite and > 0",
                 (double)a.swiglu_limit);
    }
    if (a.w13_bias != nullptr)
        QG_TRY(check_dtype("bias_dtype", a.bias_dtype, kF32 | kF16 | kBF16, "MoE bias (fp32, fp16 or bf16)"));
    if (!pointers) return QG_OK;
    QG_TRY(check_ptr(a.x, "x", dtype_size(a.x_dtype), dtype_name(a.x_dtype)));
    QG_TRY(check_routing_ptrs(a.sorted_ids, a.tile_experts, a.num_sorted));
    QG_TRY(check_ptr(a.w13_blocks, "w13_blocks", 1, "bytes"));
    QG_TRY(check_ptr(a.w13_scales, "w13_scales", 1, "bytes"));
    if (a.w13_bias != nullptr)
        QG_TRY(check_ptr(a.w13_bias, "w13_bias", dtype_size(a.bias_dtype), dtype_name(a.bias_dtype)));
    QG_TRY(check_ptr(a.act, "act", dtype_size(a.x_dtype), dtype_name(a.x_dtype)));
    return QG_OK;
}

qg_status check_moe_stage2(const qg_moe_stage2_args& a, bool pointers) {
    QG_TRY(check_routing_sizes(a.num_tokens, a.top_k, a.num_experts, a.tile_m));
    QG_TRY(check_moe_dims(a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate));
    QG_TRY(check_mxfp4_layout_value("layout", a.layout));
    QG_TRY(check_dtype("act_dtype", a.act_dtype, kF32 | kF16 | kBF16, "MoE (fp32, fp16 or bf16)"));
    QG_TRY(check_dtype("y_dtype", a.y_dtype, kF32 | kF16 | kBF16, "MoE (fp32, fp16 or bf16)"));
    QG_TRY(check_ld("ldy", a.ldy, "hidden", a.hidden));
    QG_TRY(check_extent("ldy", a.ldy, "y", a.num_tokens, (int64_t)dtype_size(a.y_dtype)));
    if (a.w2_bias != nullptr)
        QG_TRY(check_dtype("bias_dtype", a.bias_dtype, kF32 | kF16 | kBF16, "MoE bias (fp32, fp16 or bf16)"));
    if (!pointers) return QG_OK;
    QG_TRY(check_ptr(a.act, "act", dtype_size(a.act_dtype), dtype_name(a.act_dtype)));
    QG_TRY(check_routing_ptrs(a.sorted_ids, a.tile_experts, a.num_sorted));
    QG_TRY(check_ptr(a.w2_blocks, "w2_blocks", 1, "bytes"));
    QG_TRY(check_ptr(a.w2_scales, "w2_scales", 1, "bytes"));
    if (a.w2_bias != nullptr)
        QG_TRY(check_ptr(a.w2_bias, "w2_bias", dtype_size(a.bias_dtype), dtype_name(a.bias_dtype)));
    QG_TRY(check_ptr(a.topk_weights, "topk_weights", 4, "float32"));
    QG_TRY(check_ptr(a.y, "y", dtype_size(a.y_dtype), dtype_name(a.y_dtype)));
    return QG_OK;
}

// Workspace queries read no pointer: the tiers are asked with every pointer NULL (aligned
// for every alignment test) and row strides rounded up to 16, so that the answer holds
// whatever pointers and strides the call brings.
int64_t round16(int64_t v) { return (v + 15) / 16 * 16; }
void strip_pointers(qg_w4a16_gemm_args* a) {
    // asymmetric stays asymmetric: an aligned stand-in, never dereferenced by a query
    if (a->qzeros != nullptr) a->qzeros = reinterpret_cast<const int32_t*>(256);
    if (a->bias != nullptr) a->bias = reinterpret_cast<const void*>(256);  // tiers that add no bias stay out
    a->x = a->scales = nullptr;
    a->qweight = nullptr;
    a->y = a->workspace = nullptr;
    a->ldx = round16(a->ldx);
    a->ldy = round16(a->ldy);
}
void strip_pointers(qg_gguf_gemm_args* a) {
    if (a->bias != nullptr) a->bias = reinterpret_cast<const void*>(256);  // as for W4A16
    a->x = a->w = a->w_scales = nullptr;
    a->y = a->workspace = nullptr;
    a->ldx = round16(a->ldx);
    a->ldw = round16(a->ldw);
    a->ldy = round16(a->ldy);
}
void strip_pointers(qg_moe_stage1_args* a) {
    if (a->w13_bias != nullptr) a->w13_bias = reinterpret_cast<const void*>(256);
    a->x = nullptr;
    a->sorted_ids = a->tile_experts = a->num_sorted = nullptr;
    a->w13_blocks = a->w13_scales = nullptr;
    a->act = a->workspace = nullptr;
    a->ldx = round16(a->ldx);
}
void strip_pointers(qg_moe_stage2_args* a) {
    if (a->w2_bias != nullptr) a->w2_bias = reinterpret_cast<const void*>(256);
    a->act = nullptr;
    a->sorted_ids = a->tile_experts = a->num_sorted = nullptr;
    a->w2_blocks = a->w2_scales = nullptr;
    a->topk_weights = nullptr;
    a->y = a->workspace = nullptr;
    a->ldy = round16(a->ldy);
}
void strip_pointers(qg_mxfp4_gemm_args* a) {
    if (a->bias != nullptr) a->bias = reinterpret_cast<const void*>(256);  // as for W4A16
    a->x = nullptr;
    a->blocks = a->scales = nullptr;
    a->y = a->workspace = nullptr;
    a->ldx = round16(a->ldx);
    a->ldy = round16(a->ldy);
}

// ------------------------------------------------------------------ contexts and events

// The CPU backend ignores streams; qg_stream_create hands out this token so that a
// created stream is never NULL.
char g_cpu_stream_token;


}  // namespace

// The event object behind qg_event*: a host timestamp (CPU) or a GPU runtime event.
struct qg_event {
    qg_backend backend = QG_BACKEND_CPU;
    void* gpu = nullptr;
    std::chrono::steady_clock::time_point time{};
    bool recorded = false;
};

namespace {

// An event must belong to the backend of the context it is used with.
qg_status check_event(const qg_context* ctx, const qg_event* e, const char* name) {
    QG_CHECK(e != nullptr, "%s is NULL", name);
    QG_CHECK(e->backend == ctx->backend, "%s was created by a %s context, not this %s context", name,
             backend_name(e->backend), backend_name(ctx->backend));
    return QG_OK;
}
}  // namespace

extern "C" {

// ------------------------------------------------------------------ status, build

QG_API const char* qg_status_string(qg_status status) {
    switch ((int)status) {
        case QG_OK: return "QG_OK";
        case QG_ERR_INVALID_ARGUMENT: return "QG_ERR_INVALID_ARGUMENT";
        case QG_ERR_UNSUPPORTED: return "QG_ERR_UNSUPPORTED";
        case QG_ERR_DEVICE: return "QG_ERR_DEVICE";
        case QG_ERR_OUT_OF_MEMORY: return "QG_ERR_OUT_OF_MEMORY";
        case QG_ERR_INTERNAL: return "QG_ERR_INTERNAL";
        default: return "unknown status";
    }
}

QG_API const char* qg_last_error(void) { return qg::last_error(); }

QG_API int qg_version(void) { return QG_VERSION_MAJOR * 10000 + QG_VERSION_MINOR * 100 + QG_VERSION_PATCH; }

QG_API int qg_format_version(void) { return QG_FORMAT_VERSION; }

QG_API const char* qg_build_info(void) { return qg::build_info(); }

QG_API qg_status qg_format_block(qg_format format, int32_t* block_elems, int32_t* block_bytes) {
    return guarded("qg_format_block", [&]() -> qg_status {
        QG_CHECK(block_elems != nullptr, "block_elems is NULL");
        QG_CHECK(block_bytes != nullptr, "block_bytes is NULL");
        EnumText t;
        const int f = format;
        QG_CHECK(format_name(f) != nullptr, "format=%s is not a qg_format value", t(nullptr, f));
        if (f == QG_FORMAT_INT4) {
            *block_elems = 8;  // one int32 word of 8 nibbles
            *block_bytes = 4;
        } else if (f == QG_FORMAT_MXFP4) {
            *block_elems = qg::MXFP4_BLOCK;
            *block_bytes = qg::MXFP4_BLOCK_BYTES + 1;  // 16 code bytes + one E8M0 scale byte
        } else {
            const GgufFormat* g = gguf_format(f);
            *block_elems = g->elems;
            *block_bytes = g->bytes;
        }
        return QG_OK;
    });
}

// ------------------------------------------------------------------ context

QG_API qg_status qg_device_count(qg_backend backend, int* count) {
    return guarded("qg_device_count", [&]() -> qg_status {
        QG_CHECK(count != nullptr, "count is NULL");
        EnumText t;
        const int b = backend;
        QG_CHECK(backend_name(b) != nullptr, "backend=%s is not a qg_backend value", t(nullptr, b));
        if (b == QG_BACKEND_CPU) {
            *count = 1;
            return QG_OK;
        }
        *count = 0;
#if defined(QG_HAVE_GPU)
        if (b == kGpuBackend) {
            int n = 0;
            if (qg::gpu_device_count(&n) == QG_OK) *count = n;  // no driver / no device: 0
        }
#endif
        return QG_OK;
    });
}

QG_API qg_status qg_context_create(qg_backend backend, int device, qg_context** ctx) {
    return guarded("qg_context_create", [&]() -> qg_status {
        QG_CHECK(ctx != nullptr, "ctx is NULL");
        EnumText t;
        const int b = backend;
        QG_CHECK(backend_name(b) != nullptr, "backend=%s is not a qg_backend value", t(nullptr, b));
        QG_CHECK(device >= 0, "device=%d is negative", device);
        if (b == QG_BACKEND_CPU) {
            QG_CHECK(device == 0, "device=%d: QG_BACKEND_CPU has the one device 0", device);
            qg_context* c = new qg_context();
            c->backend = QG_BACKEND_CPU;
            c->device = 0;
            qg::cpu_model_name(c->name, sizeof(c->name));
            *ctx = c;
            return QG_OK;
        }
        if (b != kGpuBackend) {
            return set_error(QG_ERR_UNSUPPORTED, "%s is not compiled into this build (%s)", backend_name(b),
                             qg::build_info());
        }
#if defined(QG_HAVE_GPU)
        int n = 0;
        if (qg::gpu_device_count(&n) != QG_OK) {
            char why[512];
            snprintf(why, sizeof(why), "%s", qg::last_error());
            return set_error(QG_ERR_DEVICE, "no %s device: %s", kGpuName, why);
        }
        if (n == 0) return set_error(QG_ERR_DEVICE, "no %s device: the runtime reports 0 devices", kGpuName);
        QG_CHECK(device < n, "device=%d is out of range: the %s runtime reports %d device(s)", device, kGpuName, n);
        qg_context* c = new qg_context();
        c->backend = (qg_backend)b;
        c->device = device;
        const qg_status st = qg::gpu_context_init(c);
        if (st != QG_OK) {
            delete c;
            return st;
        }
        qg::log_once("context %s device %d: %s, %d SMs, cc %d.%d, L2 %zu bytes", backend_name(b), device, c->name,
                     c->sm_count, c->cc_major, c->cc_minor, c->l2_bytes);
        *ctx = c;
        return QG_OK;
#else
        return set_error(QG_ERR_INTERNAL, "unreachable: GPU backend without QG_HAVE_GPU");
#endif
    });
}

QG_API qg_status qg_context_destroy(qg_context* ctx) {
    delete ctx;  // NULL is a no-op, as free(NULL) is
    return QG_OK;
}

QG_API qg_status qg_context_backend(const qg_context* ctx, qg_backend* backend) {
    QG_TRY(check_ctx(ctx));
    QG_CHECK(backend != nullptr, "backend is NULL");
    *backend = ctx->backend;
    return QG_OK;
}

QG_API qg_status qg_context_device_name(const qg_context* ctx, char* buf, size_t buf_size) {
    QG_TRY(check_ctx(ctx));
    QG_CHECK(buf != nullptr, "buf is NULL");
    QG_CHECK(buf_size > 0, "buf_size=0 leaves no room for the name");
    snprintf(buf, buf_size, "%s", ctx->name);
    return QG_OK;
}

QG_API qg_status qg_context_set_option(qg_context* ctx, const char* name, int64_t value) {
    QG_TRY(check_ctx(ctx));
    QG_CHECK(name != nullptr, "name is NULL");
    struct Option {
        const char* name;
        int64_t qg_context::*field;
        int64_t lo, hi;
        const char* values;  // accepted values, for the message
    };
    static const Option options[] = {
        {"cpu_threads", &qg_context::cpu_threads, 0, 4096, "0 (all hardware threads) .. 4096"},
        {"w4a16_tier", &qg_context::w4a16_tier, 0, 3, "0 auto, 1 portable SIMT, 2 decode, 3 prefill"},
        {"gguf_tier", &qg_context::gguf_tier, 0, 5,
         "0 auto, 1 float decode, 2 int8 mma decode, 3 prefill, 4 frag decode, 5 frag prefill"},
        {"split_k", &qg_context::split_k, 0, 256, "0 (auto) .. 256"},
        {"prefill_tile", &qg_context::prefill_tile, 0, 256, "0 (auto), 32, 64, 128 or 256"},
        {"cpu_precision", &qg_context::cpu_precision, 0, 2, "0 auto, 1 fp32-exact, 2 int8"},
    };
    for (const Option& o : options) {
        if (strcmp(o.name, name) != 0) continue;
        QG_CHECK(value >= o.lo && value <= o.hi, "option %s=%lld is out of range (%s)", name, (ll)value, o.values);
        QG_CHECK(o.field != &qg_context::prefill_tile || value == 0 || value == 32 || value == 64 || value == 128 ||
                     value == 256,
                 "option %s=%lld is not one of %s", name, (ll)value, o.values);
        ctx->*o.field = value;
        // a numeric tier option replaces a tier forced by name (qg_context_set_tier)
        if (o.field == &qg_context::w4a16_tier) ctx->forced_tier[qg::FAMILY_W4A16] = nullptr;
        if (o.field == &qg_context::gguf_tier) ctx->forced_tier[qg::FAMILY_GGUF] = nullptr;
        return QG_OK;
    }
    return set_error(QG_ERR_INVALID_ARGUMENT, "unknown option \"%s\" (known: cpu_threads, w4a16_tier, gguf_tier, split_k, prefill_tile, cpu_precision)",
                     name);
}

}  // extern "C"

namespace {
// The static name of tier `tier` in `t`, or nullptr; appends the table's names to `known`.
template <class Args>
const char* tier_name_in(const qg::TierTable<Args>& t, const char* tier, char* known, size_t size) {
    const char* found = nullptr;
    for (int i = 0; i < t.count; ++i) {
        if (qg::same_text(t.tiers[i]->name, tier)) found = t.tiers[i]->name;
        const size_t used = strlen(known);
        if (strstr(known, t.tiers[i]->name) == nullptr)
            snprintf(known + used, size - used, "%s%s", used ? ", " : "", t.tiers[i]->name);
    }
    return found;
}
}  // namespace

extern "C" {

QG_API qg_status qg_context_set_tier(qg_context* ctx, const char* family, const char* tier) {
    return guarded("qg_context_set_tier", [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        QG_CHECK(family != nullptr, "family is NULL");
        QG_CHECK(tier != nullptr, "tier is NULL");
        int f = -1;
        const char* families[qg::FAMILY_COUNT] = {"w4a16", "gguf", "mxfp4", "moe"};
        for (int i = 0; i < qg::FAMILY_COUNT; ++i)
            if (strcmp(families[i], family) == 0) f = i;
        QG_CHECK(f >= 0, "family=\"%s\" is not a kernel family (w4a16, gguf, mxfp4, moe)", family);
        if (strcmp(tier, "auto") == 0) {
            ctx->forced_tier[f] = nullptr;
            return QG_OK;
        }
        char known[512] = "";
        const char* name = nullptr;
        switch (f) {
            case qg::FAMILY_W4A16: name = tier_name_in(qg::w4a16_tier_table(), tier, known, sizeof(known)); break;
            case qg::FAMILY_GGUF: name = tier_name_in(qg::gguf_tier_table(), tier, known, sizeof(known)); break;
            case qg::FAMILY_MXFP4: name = tier_name_in(qg::mxfp4_tier_table(), tier, known, sizeof(known)); break;
            default: {
                // the MoE launches have one table each; a name must exist in one of them
                const char* a = tier_name_in(qg::moe_align_tier_table(), tier, known, sizeof(known));
                const char* b = tier_name_in(qg::moe_stage1_tier_table(), tier, known, sizeof(known));
                const char* c = tier_name_in(qg::moe_stage2_tier_table(), tier, known, sizeof(known));
                name = a ? a : b ? b : c;
            }
        }
        QG_CHECK(name != nullptr, "tier=\"%s\" is not a %s tier of this build (auto, %s)", tier, family, known);
        ctx->forced_tier[f] = name;
        return QG_OK;
    });
}

// ------------------------------------------------------------------ memory, streams, events

QG_API qg_status qg_malloc(qg_context* ctx, size_t bytes, void** ptr) {
    return guarded("qg_malloc", [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        QG_CHECK(ptr != nullptr, "ptr is NULL");
        if (is_gpu(ctx)) {
#if defined(QG_HAVE_GPU)
            return qg::gpu_malloc(ctx, bytes, ptr);
#endif
        }
        // 64-byte aligned host memory; aligned_alloc wants a multiple of the alignment
        QG_CHECK(bytes <= SIZE_MAX - 64, "bytes=%zu is too large", bytes);
        const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
        void* p = aligned_alloc(64, rounded);
        if (p == nullptr) return set_error(QG_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes of host memory", bytes);
        *ptr = p;
        return QG_OK;
    });
}

QG_API qg_status qg_free(qg_context* ctx, void* ptr) {
    QG_TRY(check_ctx(ctx));
    if (ptr == nullptr) return QG_OK;
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_free(ctx, ptr);
#endif
    free(ptr);
    return QG_OK;
}

QG_API qg_status qg_memcpy(qg_context* ctx, void* dst, const void* src, size_t bytes, qg_copy_kind kind,
                           qg_stream stream) {
    QG_TRY(check_ctx(ctx));
    const int k = kind;
    QG_CHECK(k >= QG_COPY_HOST_TO_HOST && k <= QG_COPY_DEVICE_TO_DEVICE, "kind=%d is not a qg_copy_kind value", k);
    if (bytes == 0) return QG_OK;
    QG_CHECK(dst != nullptr, "dst is NULL");
    QG_CHECK(src != nullptr, "src is NULL");
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_memcpy(ctx, dst, src, bytes, kind, stream);
#endif
    memmove(dst, src, bytes);  // CPU backend: every kind is host memory
    return QG_OK;
}

QG_API qg_status qg_memset(qg_context* ctx, void* dst, int value, size_t bytes, qg_stream stream) {
    QG_TRY(check_ctx(ctx));
    if (bytes == 0) return QG_OK;
    QG_CHECK(dst != nullptr, "dst is NULL");
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_memset(ctx, dst, value, bytes, stream);
#endif
    memset(dst, value, bytes);
    return QG_OK;
}

QG_API qg_status qg_stream_create(qg_context* ctx, qg_stream* stream) {
    QG_TRY(check_ctx(ctx));
    QG_CHECK(stream != nullptr, "stream is NULL");
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_stream_create(ctx, stream);
#endif
    *stream = &g_cpu_stream_token;
    return QG_OK;
}

QG_API qg_status qg_stream_destroy(qg_context* ctx, qg_stream stream) {
    QG_TRY(check_ctx(ctx));
    if (stream == nullptr) return QG_OK;  // the default stream is never destroyed
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_stream_destroy(ctx, stream);
#endif
    return QG_OK;
}

QG_API qg_status qg_stream_synchronize(qg_context* ctx, qg_stream stream) {
    QG_TRY(check_ctx(ctx));
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_stream_synchronize(ctx, stream);
#endif
    return QG_OK;  // the CPU backend runs synchronously
}

QG_API qg_status qg_event_create(qg_context* ctx, qg_event** event) {
    return guarded("qg_event_create", [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        QG_CHECK(event != nullptr, "event is NULL");
        qg_event* e = new qg_event();
        e->backend = ctx->backend;
#if defined(QG_HAVE_GPU)
        if (is_gpu(ctx)) {
            const qg_status st = qg::gpu_event_create(ctx, &e->gpu);
            if (st != QG_OK) {
                delete e;
                return st;
            }
        }
#endif
        *event = e;
        return QG_OK;
    });
}

QG_API qg_status qg_event_destroy(qg_context* ctx, qg_event* event) {
    QG_TRY(check_ctx(ctx));
    if (event == nullptr) return QG_OK;
    QG_TRY(check_event(ctx, event, "event"));
    qg_status st = QG_OK;
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) st = qg::gpu_event_destroy(ctx, event->gpu);
#endif
    delete event;
    return st;
}

QG_API qg_status qg_event_record(qg_context* ctx, qg_event* event, qg_stream stream) {
    QG_TRY(check_ctx(ctx));
    QG_TRY(check_event(ctx, event, "event"));
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) {
        QG_TRY(qg::gpu_event_record(ctx, event->gpu, stream));
        event->recorded = true;
        return QG_OK;
    }
#endif
    event->time = std::chrono::steady_clock::now();
    event->recorded = true;
    return QG_OK;
}

QG_API qg_status qg_event_synchronize(qg_context* ctx, qg_event* event) {
    QG_TRY(check_ctx(ctx));
    QG_TRY(check_event(ctx, event, "event"));
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_event_synchronize(ctx, event->gpu);
#endif
    return QG_OK;
}

QG_API qg_status qg_event_elapsed_ms(qg_context* ctx, qg_event* start, qg_event* stop, float* ms) {
    QG_TRY(check_ctx(ctx));
    QG_TRY(check_event(ctx, start, "start"));
    QG_TRY(check_event(ctx, stop, "stop"));
    QG_CHECK(ms != nullptr, "ms is NULL");
    QG_CHECK(start->recorded, "start was never recorded (qg_event_record)");
    QG_CHECK(stop->recorded, "stop was never recorded (qg_event_record)");
#if defined(QG_HAVE_GPU)
    if (is_gpu(ctx)) return qg::gpu_event_elapsed_ms(ctx, start->gpu, stop->gpu, ms);
#endif
    *ms = std::chrono::duration<float, std::milli>(stop->time - start->time).count();
    return QG_OK;
}


}  // extern "C"

// ------------------------------------------------------------------ kernel entry points
//
// Every GEMM and MoE entry point is the same skeleton (run_entry): guard, read the struct,
// return at once on an empty problem, check every argument, pick the tier from the family's
// table (src/tier_table.h), check the workspace against what that tier needs, log, launch.
// Entry<Args> holds what differs between the families.

namespace {

using qg::Tier;
using qg::TierTable;

template <class Args>
struct Entry;

template <>
struct Entry<qg_w4a16_gemm_args> {
    static constexpr qg::Family family = qg::FAMILY_W4A16;
    static constexpr const char* query = "qg_w4a16_gemm_workspace_size";
    static const TierTable<qg_w4a16_gemm_args>& table() { return qg::w4a16_tier_table(); }
    static int64_t option(const qg_context* c) { return c->w4a16_tier; }
    static int64_t rows(const qg_w4a16_gemm_args& a) { return a.m; }
    static constexpr const char* rows_name = "m";
    static qg_status check(const qg_w4a16_gemm_args& a, bool pointers) { return check_w4a16(a, pointers); }
    static void log(const qg_w4a16_gemm_args& a, const char* tier, const char* reason) {
        qg::log_once("w4a16 tier=%s (%s) m=%lld n=%lld k=%lld group_size=%d %s %s layout=%s", tier, reason, (ll)a.m,
                     (ll)a.n, (ll)a.k, a.group_size, a.qzeros ? "asym" : "sym", dtype_name(a.x_dtype),
                     a.layout == QG_W4A16_LAYOUT_FRAG ? "frag" : "canonical");
    }
};

template <>
struct Entry<qg_gguf_gemm_args> {
    static constexpr qg::Family family = qg::FAMILY_GGUF;
    static constexpr const char* query = "qg_gguf_gemm_workspace_size";
    static const TierTable<qg_gguf_gemm_args>& table() { return qg::gguf_tier_table(); }
    static int64_t option(const qg_context* c) { return c->gguf_tier; }
    static int64_t rows(const qg_gguf_gemm_args& a) { return a.m; }
    static constexpr const char* rows_name = "m";
    static qg_status check(const qg_gguf_gemm_args& a, bool pointers) { return check_gguf(a, pointers); }
    static void log(const qg_gguf_gemm_args& a, const char* tier, const char* reason) {
        qg::log_once("gguf tier=%s (%s) format=%s m=%lld n=%lld k=%lld x=%s layout=%s", tier, reason,
                     format_name(a.format), (ll)a.m, (ll)a.n, (ll)a.k, dtype_name(a.x_dtype),
                     a.layout == QG_GGUF_LAYOUT_FRAG ? "frag" : "blocks");
    }
};

template <>
struct Entry<qg_mxfp4_gemm_args> {
    static constexpr qg::Family family = qg::FAMILY_MXFP4;
    static constexpr const char* query = "qg_mxfp4_gemm_workspace_size";
    static const TierTable<qg_mxfp4_gemm_args>& table() { return qg::mxfp4_tier_table(); }
    static int64_t option(const qg_context*) { return 0; }
    static int64_t rows(const qg_mxfp4_gemm_args& a) { return a.m; }
    static constexpr const char* rows_name = "m";
    static qg_status check(const qg_mxfp4_gemm_args& a, bool pointers) { return check_mxfp4(a, pointers); }
    static void log(const qg_mxfp4_gemm_args& a, const char* tier, const char* reason) {
        qg::log_once("mxfp4 tier=%s (%s) m=%lld n=%lld k=%lld x=%s bias=%s layout=%s", tier, reason, (ll)a.m, (ll)a.n,
                     (ll)a.k, dtype_name(a.x_dtype), a.bias ? "yes" : "no",
                     a.layout == QG_MXFP4_LAYOUT_FRAG ? "frag" : "canonical");
    }
};

// MoE launches take no workspace; their row count is the token count.
struct MoeEntry {
    static constexpr qg::Family family = qg::FAMILY_MOE;
    static constexpr const char* query = nullptr;
    static int64_t option(const qg_context*) { return 0; }
    static constexpr const char* rows_name = "num_tokens";
};

template <>
struct Entry<qg_moe_align_args> : MoeEntry {
    static const TierTable<qg_moe_align_args>& table() { return qg::moe_align_tier_table(); }
    static int64_t rows(const qg_moe_align_args& a) { return a.num_tokens; }
    static qg_status check(const qg_moe_align_args& a, bool) {
        QG_TRY(check_routing_sizes(a.num_tokens, a.top_k, a.num_experts, a.tile_m));
        QG_TRY(check_ptr(a.topk_ids, "topk_ids", 4, "int32"));
        return check_routing_ptrs(a.sorted_ids, a.tile_experts, a.num_sorted);
    }
    static void log(const qg_moe_align_args& a, const char* tier, const char* reason) {
        qg::log_once("moe_align tier=%s (%s) tokens=%lld top_k=%d experts=%d tile_m=%d", tier, reason,
                     (ll)a.num_tokens, a.top_k, a.num_experts, a.tile_m);
    }
};

template <>
struct Entry<qg_moe_stage1_args> : MoeEntry {
    static const TierTable<qg_moe_stage1_args>& table() { return qg::moe_stage1_tier_table(); }
    static int64_t rows(const qg_moe_stage1_args& a) { return a.num_tokens; }
    static constexpr const char* query = "qg_moe_stage1_workspace_size";
    static qg_status check(const qg_moe_stage1_args& a, bool pointers) { return check_moe_stage1(a, pointers); }
    static void log(const qg_moe_stage1_args& a, const char* tier, const char* reason) {
        qg::log_once("moe_stage1 tier=%s (%s) tokens=%lld hidden=%lld intermediate=%lld experts=%d top_k=%d", tier,
                     reason, (ll)a.num_tokens, (ll)a.hidden, (ll)a.intermediate, a.num_experts, a.top_k);
    }
};

template <>
struct Entry<qg_moe_stage2_args> : MoeEntry {
    static const TierTable<qg_moe_stage2_args>& table() { return qg::moe_stage2_tier_table(); }
    static int64_t rows(const qg_moe_stage2_args& a) { return a.num_tokens; }
    static constexpr const char* query = "qg_moe_stage2_workspace_size";
    static qg_status check(const qg_moe_stage2_args& a, bool pointers) { return check_moe_stage2(a, pointers); }
    static void log(const qg_moe_stage2_args& a, const char* tier, const char* reason) {
        qg::log_once("moe_stage2 tier=%s (%s) tokens=%lld hidden=%lld intermediate=%lld experts=%d top_k=%d", tier,
                     reason, (ll)a.num_tokens, (ll)a.hidden, (ll)a.intermediate, a.num_experts, a.top_k);
    }
};

// workspace fields, for the families that have them
template <class Args>
qg_status check_call_workspace(const Args& a, size_t need, const char* query) {
    return check_workspace(a.workspace, a.workspace_bytes, need, query);
}
template <>
qg_status check_call_workspace(const qg_moe_align_args&, size_t, const char*) { return QG_OK; }

// The tier name forced on the entry point's family, if any; a forced MoE name serves only the
// entry points that have a tier of that name (quantgemm.h, qg_context_set_tier).
template <class Args>
const char* forced_tier_of(const qg_context* ctx) {
    typedef Entry<Args> E;
    const char* forced = ctx->forced_tier[E::family];
    if (forced != nullptr && E::family == qg::FAMILY_MOE && qg::find_tier(E::table(), forced) == nullptr) return nullptr;
    return forced;
}

template <class Args>
qg_status run_entry(const char* fn, qg_context* ctx, const Args* args, qg_stream stream) {
    typedef Entry<Args> E;
    return guarded(fn, [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        Args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(E::rows(a) >= 0, "%s=%lld is negative", E::rows_name, (ll)E::rows(a));
        if (E::rows(a) == 0) return QG_OK;
        QG_TRY(E::check(a, true));
        const Tier<Args>* tier = nullptr;
        const char* reason = "";
        QG_TRY(qg::select_tier(ctx, E::table(), a, forced_tier_of<Args>(ctx), E::option(ctx), &tier, &reason));
        QG_TRY(check_call_workspace(a, tier->workspace ? tier->workspace(ctx, a) : 0, E::query));
        if (qg::log_enabled()) E::log(a, tier->name, reason);
        return tier->launch(ctx, a, stream);
    });
}

// The workspace query: the most any tier that the call could run on needs. It may not read
// pointers, so the tiers are asked with them replaced by NULL (which every alignment
// condition accepts): the answer then holds for any pointers the call brings.
template <class Args>
qg_status run_workspace_query(const char* fn, qg_context* ctx, const Args* args, size_t* bytes) {
    typedef Entry<Args> E;
    return guarded(fn, [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        Args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(bytes != nullptr, "bytes is NULL");
        QG_TRY(E::check(a, false));
        size_t need = 0;
        if (E::rows(a) > 0) {
            Args probe = a;
            strip_pointers(&probe);
            need = qg::workspace_bound(ctx, E::table(), probe, forced_tier_of<Args>(ctx), E::option(ctx));
        }
        *bytes = need;
        return QG_OK;
    });
}

// The repack entry points (qg_w4a16_repack, qg_mxfp4_repack): guard, read the struct, check
// every argument, log, then the host loop on a CPU context or the device kernel on a GPU one
// (on `stream`). Repack<Args> holds what differs between the formats.
template <class Args>
struct Repack;

template <>
struct Repack<qg_w4a16_repack_args> {
    static qg_status check(const qg_context*, const qg_w4a16_repack_args& a) { return check_w4a16_repack(a, true); }
    static void log(const qg_w4a16_repack_args& a, const char* where) {
        qg::log_once("w4a16 repack to %s on %s: n=%lld k=%lld group_size=%d %s", "frag", where, (ll)a.n, (ll)a.k,
                     a.group_size, a.qzeros ? "asym" : "sym");
    }
    static void host(const qg_w4a16_repack_args& a) { qg::w4a16_repack_frag_host(a); }
#if defined(QG_HAVE_GPU)
    static qg_status gpu(const qg_context* c, const qg_w4a16_repack_args& a, qg_stream s) {
        return qg::gpu_w4a16_repack(c, a, s);
    }
#endif
};

template <>
struct Repack<qg_mxfp4_repack_args> {
    static qg_status check(const qg_context* c, const qg_mxfp4_repack_args& a) {
        return check_mxfp4_repack(a, true, is_gpu(c));
    }
    static void log(const qg_mxfp4_repack_args& a, const char* where) {
        qg::log_once("mxfp4 repack to %s on %s: n=%lld k=%lld", "frag", where, (ll)a.n, (ll)a.k);
    }
    static void host(const qg_mxfp4_repack_args& a) { qg::mxfp4_repack_frag_host(a); }
#if defined(QG_HAVE_GPU)
    static qg_status gpu(const qg_context* c, const qg_mxfp4_repack_args& a, qg_stream s) {
        return qg::gpu_mxfp4_repack(c, a, s);
    }
#endif
};

template <>
struct Repack<qg_gguf_repack_args> {
    static qg_status check(const qg_context* c, const qg_gguf_repack_args& a) {
        if (is_gpu(c) && a.layout == QG_GGUF_LAYOUT_ROWS8)
            return set_error(QG_ERR_UNSUPPORTED,
                             "layout=QG_GGUF_LAYOUT_ROWS8 is the CPU tier's layout: repack on a CPU context (the GPU "
                             "tiers read QG_GGUF_LAYOUT_FRAG)");
        return check_gguf_repack(a, true);
    }
    static void log(const qg_gguf_repack_args& a, const char* where) {
        qg::log_once("gguf repack to %s on %s: format=%s n=%lld k=%lld",
                     a.layout == QG_GGUF_LAYOUT_ROWS8 ? "rows8" : "frag", where, format_name(a.format), (ll)a.n,
                     (ll)a.k);
    }
    static void host(const qg_gguf_repack_args& a) {
        if (a.layout == QG_GGUF_LAYOUT_ROWS8) return qg::gguf_repack_rows8_host(a);
        qg::gguf_repack_frag_host(a);
    }
#if defined(QG_HAVE_GPU)
    static qg_status gpu(const qg_context* c, const qg_gguf_repack_args& a, qg_stream s) {
        return qg::gpu_gguf_repack(c, a, s);
    }
#endif
};

template <>
struct Repack<qg_moe_repack_args> {
    static qg_status check(const qg_context* c, const qg_moe_repack_args& a) { return check_moe_repack(a, true, is_gpu(c)); }
    static void log(const qg_moe_repack_args& a, const char* where) {
        qg::log_once("moe repack to frag on %s: experts=%d parts=%d n=%lld k=%lld%s", where, a.num_experts, a.parts,
                     (ll)a.n, (ll)a.k,
                     a.parts == 1 ? "" : a.gate_up_layout == QG_GATE_UP_CONCAT ? " gate_up=concat" : " gate_up=interleaved");
    }
    static void host(const qg_moe_repack_args& a) { qg::moe_repack_frag_host(a); }
#if defined(QG_HAVE_GPU)
    static qg_status gpu(const qg_context* c, const qg_moe_repack_args& a, qg_stream s) {
        return qg::gpu_moe_repack(c, a, s);
    }
#endif
};

template <class Args>
qg_status run_repack(const char* fn, qg_context* ctx, const Args* args, qg_stream stream) {
    typedef Repack<Args> R;
    return guarded(fn, [&]() -> qg_status {
        QG_TRY(check_ctx(ctx));
        Args a;
        QG_TRY(read_args(args, &a));
        QG_TRY(R::check(ctx, a));
        R::log(a, is_gpu(ctx) ? "the GPU" : "the CPU");
        if (!is_gpu(ctx)) {
            R::host(a);
            return QG_OK;
        }
#if defined(QG_HAVE_GPU)
        return R::gpu(ctx, a, stream);
#else
        return set_error(QG_ERR_INTERNAL, "unreachable: GPU context without QG_HAVE_GPU");
#endif
    });
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ W4A16

QG_API qg_status qg_w4a16_gemm_workspace_size(qg_context* ctx, const qg_w4a16_gemm_args* args, size_t* bytes) {
    return run_workspace_query("qg_w4a16_gemm_workspace_size", ctx, args, bytes);
}

QG_API qg_status qg_w4a16_gemm(qg_context* ctx, const qg_w4a16_gemm_args* args, qg_stream stream) {
    return run_entry("qg_w4a16_gemm", ctx, args, stream);
}

QG_API qg_status qg_w4a16_repack_size(const qg_w4a16_repack_args* args, size_t* qweight_bytes, size_t* scales_bytes,
                                      size_t* qzeros_bytes) {
    return guarded("qg_w4a16_repack_size", [&]() -> qg_status {
        qg_w4a16_repack_args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(qweight_bytes != nullptr && scales_bytes != nullptr && qzeros_bytes != nullptr,
                 "qweight_bytes, scales_bytes and qzeros_bytes must not be NULL");
        QG_TRY(check_w4a16_repack(a, false));
        const qg::frag::Geometry geo(a.n, a.k, a.group_size);
        *qweight_bytes = (size_t)geo.qweight_bytes();
        *scales_bytes = (size_t)geo.scales_bytes();
        *qzeros_bytes = (size_t)geo.qzeros_bytes();
        return QG_OK;
    });
}

QG_API qg_status qg_w4a16_repack(qg_context* ctx, const qg_w4a16_repack_args* args, qg_stream stream) {
    return run_repack("qg_w4a16_repack", ctx, args, stream);
}

// ------------------------------------------------------------------ GGUF

QG_API qg_status qg_gguf_gemm_workspace_size(qg_context* ctx, const qg_gguf_gemm_args* args, size_t* bytes) {
    return run_workspace_query("qg_gguf_gemm_workspace_size", ctx, args, bytes);
}

QG_API qg_status qg_gguf_gemm(qg_context* ctx, const qg_gguf_gemm_args* args, qg_stream stream) {
    return run_entry("qg_gguf_gemm", ctx, args, stream);
}

QG_API qg_status qg_gguf_repack_size(const qg_gguf_repack_args* args, size_t* w_bytes, size_t* scales_bytes) {
    return guarded("qg_gguf_repack_size", [&]() -> qg_status {
        qg_gguf_repack_args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(w_bytes != nullptr && scales_bytes != nullptr, "w_bytes and scales_bytes must not be NULL");
        QG_TRY(check_gguf_repack(a, false));
        if (a.layout == QG_GGUF_LAYOUT_ROWS8) {
            const GgufFormat* f = gguf_format(a.format);
            *w_bytes = (size_t)qg::gguf_rows8::plane_bytes(a.n, a.k / f->elems, f->bytes);
            *scales_bytes = 0;
            return QG_OK;
        }
        const qg::frag::Geometry geo(a.n, a.k, 32);
        *w_bytes = (size_t)qg::gguf_frag::weights_plane_bytes(a.format, geo);
        *scales_bytes = (size_t)qg::gguf_frag::scales_plane_bytes(a.format, geo);
        return QG_OK;
    });
}

QG_API qg_status qg_gguf_repack(qg_context* ctx, const qg_gguf_repack_args* args, qg_stream stream) {
    return run_repack("qg_gguf_repack", ctx, args, stream);
}

// ------------------------------------------------------------------ MXFP4 dense

QG_API qg_status qg_mxfp4_gemm_workspace_size(qg_context* ctx, const qg_mxfp4_gemm_args* args, size_t* bytes) {
    return run_workspace_query("qg_mxfp4_gemm_workspace_size", ctx, args, bytes);
}

QG_API qg_status qg_mxfp4_gemm(qg_context* ctx, const qg_mxfp4_gemm_args* args, qg_stream stream) {
    return run_entry("qg_mxfp4_gemm", ctx, args, stream);
}

QG_API qg_status qg_mxfp4_repack_size(const qg_mxfp4_repack_args* args, size_t* blocks_bytes, size_t* scales_bytes) {
    return guarded("qg_mxfp4_repack_size", [&]() -> qg_status {
        qg_mxfp4_repack_args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(blocks_bytes != nullptr && scales_bytes != nullptr, "blocks_bytes and scales_bytes must not be NULL");
        QG_TRY(check_mxfp4_repack(a, false, false));
        const qg::frag::Geometry geo = qg::frag::Geometry(a.n, a.k, qg::MXFP4_BLOCK);
        *blocks_bytes = (size_t)geo.qweight_bytes();
        *scales_bytes = (size_t)geo.scales_bytes();
        return QG_OK;
    });
}

QG_API qg_status qg_mxfp4_repack(qg_context* ctx, const qg_mxfp4_repack_args* args, qg_stream stream) {
    return run_repack("qg_mxfp4_repack", ctx, args, stream);
}

// ------------------------------------------------------------------ MXFP4 MoE

QG_API qg_status qg_moe_align_sizes(int64_t num_tokens, int32_t top_k, int32_t num_experts, int32_t tile_m,
                                    int64_t* max_sorted, int64_t* max_tiles) {
    QG_TRY(check_routing_sizes(num_tokens, top_k, num_experts, tile_m));
    QG_CHECK(max_sorted != nullptr, "max_sorted is NULL");
    QG_CHECK(max_tiles != nullptr, "max_tiles is NULL");
    qg::moe_align_sizes(num_tokens, top_k, num_experts, tile_m, max_sorted, max_tiles);
    return QG_OK;
}

QG_API qg_status qg_moe_align(qg_context* ctx, const qg_moe_align_args* args, qg_stream stream) {
    return run_entry("qg_moe_align", ctx, args, stream);
}

QG_API qg_status qg_moe_stage1_workspace_size(qg_context* ctx, const qg_moe_stage1_args* args, size_t* bytes) {
    return run_workspace_query("qg_moe_stage1_workspace_size", ctx, args, bytes);
}

QG_API qg_status qg_moe_stage1(qg_context* ctx, const qg_moe_stage1_args* args, qg_stream stream) {
    return run_entry("qg_moe_stage1", ctx, args, stream);
}

QG_API qg_status qg_moe_stage2_workspace_size(qg_context* ctx, const qg_moe_stage2_args* args, size_t* bytes) {
    return run_workspace_query("qg_moe_stage2_workspace_size", ctx, args, bytes);
}

QG_API qg_status qg_moe_stage2(qg_context* ctx, const qg_moe_stage2_args* args, qg_stream stream) {
    return run_entry("qg_moe_stage2", ctx, args, stream);
}

QG_API qg_status qg_moe_repack_size(const qg_moe_repack_args* args, size_t* blocks_bytes, size_t* scales_bytes) {
    return guarded("qg_moe_repack_size", [&]() -> qg_status {
        qg_moe_repack_args a;
        QG_TRY(read_args(args, &a));
        QG_CHECK(blocks_bytes != nullptr && scales_bytes != nullptr, "blocks_bytes and scales_bytes must not be NULL");
        QG_TRY(check_moe_repack(a, false, false));
        const qg::MoePart part(a);
        *blocks_bytes = (size_t)part.blocks_offset(a.num_experts, 0);
        *scales_bytes = (size_t)part.scales_offset(a.num_experts, 0);
        return QG_OK;
    });
}

QG_API qg_status qg_moe_repack(qg_context* ctx, const qg_moe_repack_args* args, qg_stream stream) {
    return run_repack("qg_moe_repack", ctx, args, stream);
}

}  // extern "C"
