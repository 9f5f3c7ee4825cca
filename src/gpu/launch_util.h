// Small helpers shared by the GPU launchers (src/gpu/*_launch.cpp): sizes, dtype and
// format names for QG_LOG lines, and the once-per-device shared-memory limit.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <mutex>

#include "compat.h"
#include "elem.h"
#include "formats/blocks.h"
#include "tiers.h"

namespace qg {
namespace launch_util {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline size_t align16(size_t v) { return (v + 15) & ~(size_t)15; }

inline int dtype_bytes(qg_dtype d) { return d == QG_DTYPE_F32 ? 4 : 2; }

// The device element type (hip/elem.h) of an fp32 / fp16 / bf16 dtype.
inline int elem_type(qg_dtype d) { return d == QG_DTYPE_BF16 ? ELEM_BF16 : d == QG_DTYPE_F32 ? ELEM_F32 : ELEM_F16; }

inline const char* dtype_name(qg_dtype d)
{
    return d == QG_DTYPE_F32 ? "f32" : d == QG_DTYPE_F16 ? "f16" : d == QG_DTYPE_BF16 ? "bf16" : "?";
}

// Registry name of a QG_GGUF_FORMATS entry: lower case except the K of the K-quants
// ("Q4_K" -> "q4_K", "IQ4_XS" -> "iq4_xs"). Writes into out[16].
inline const char* format_name(qg_format f, char* out)
{
    const char* in = "?";
    switch (f) {
#define QG_NAME(NAME, BLOCK, BE) \
    case QG_FORMAT_##NAME: in = #NAME; break;
        QG_GGUF_FORMATS(QG_NAME)
#undef QG_NAME
    default: break;
    }
    int i = 0;
    for (; in[i] != 0 && i < 15; ++i) {
        const bool k_quant = in[i] == 'K' && i > 0 && in[i - 1] == '_';
        out[i] = (in[i] >= 'A' && in[i] <= 'Z' && !k_quant) ? (char)(in[i] - 'A' + 'a') : in[i];
    }
    out[i] = 0;
    return out;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device: `done` is the
// kernel's own mask of devices already raised (a static of the caller, one per kernel).
inline qg_status raise_smem_limit(const qg_context* ctx, const void* kernel, int bytes, std::atomic<uint64_t>& done,
                                  const char* what)
{
    const int dev = ctx->device;
    const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t)1 << dev : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return QG_OK;
    const hipError_t e = hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != hipSuccess) {
        return set_error(QG_ERR_DEVICE, "%s: setting %d bytes of dynamic shared memory failed: %s", what, bytes,
                         hipGetErrorString(e));
    }
    if (bit) done.fetch_or(bit, std::memory_order_acq_rel);
    return QG_OK;
}

// Per-kernel facts asked of the runtime once: the dynamic shared-memory limit raised to
// `smem` on this device, and the resident blocks per SM at `threads` x `smem` (0 when the
// kernel cannot be resident or the runtime refused). Defined in src/gpu/runtime.cpp.
int resident_blocks(const qg_context* ctx, const void* kernel, int threads, int smem);
// Raises `kernel`'s dynamic shared-memory limit to `smem` once per device and kernel.
qg_status prepare_kernel(const qg_context* ctx, const void* kernel, int smem, const char* what);

}  // namespace launch_util
}  // namespace qg
