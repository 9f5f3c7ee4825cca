// Small helpers shared by the GPU launchers (src/gpu/*_launch.cpp): sizes and the
// once-per-device shared-memory limit. Dtype sizes and names: src/dtypes.h; GGUF format
// names and the format switch: src/formats/gguf_formats.h.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <mutex>

#include "compat.h"
#include "dtypes.h"
#include "elem.h"
#include "tiers.h"

namespace qg {
namespace launch_util {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline size_t align16(size_t v) { return (v + 15) & ~(size_t)15; }

// Bytes of one element of an activation or output dtype (src/dtypes.h), as an int for
// pointer offsets.
inline int dtype_bytes(qg_dtype d) { return (int)dtype_size(d); }

// The device element type (hip/elem.h) of an fp32 / fp16 / bf16 dtype.
inline int elem_type(qg_dtype d) { return d == QG_DTYPE_BF16 ? ELEM_BF16 : d == QG_DTYPE_F32 ? ELEM_F32 : ELEM_F16; }

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

// Launches `kernel` (a lookup function's answer: the address of a kernel's host stub,
// hip/gguf_kernels.h) with its one parameter struct, and reports as gpu_check_launch does
// after a <<<>>> launch (whose stub calls hipLaunchKernel too): a failed launch is this
// thread's last error, named with `what`.
template <class P>
qg_status launch(const void* kernel, dim3 grid, int threads, size_t smem, hipStream_t stream, const P& params,
                 const char* what)
{
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "%s: no kernel for this configuration", what);
    void* args[] = {const_cast<P*>(&params)};
    (void)hipLaunchKernel(kernel, grid, dim3(threads), args, smem, stream);   // its error: gpu_check_launch's
    return gpu_check_launch(what);
}

// Per-kernel facts asked of the runtime once: the dynamic shared-memory limit raised to
// `smem` on this device, and the resident blocks per SM at `threads` x `smem` (0 when the
// kernel cannot be resident or the runtime refused). Defined in src/gpu/runtime.cpp.
int resident_blocks(const qg_context* ctx, const void* kernel, int threads, int smem);
// Raises `kernel`'s dynamic shared-memory limit to `smem` once per device and kernel.
qg_status prepare_kernel(const qg_context* ctx, const void* kernel, int smem, const char* what);

}  // namespace launch_util
}  // namespace qg
