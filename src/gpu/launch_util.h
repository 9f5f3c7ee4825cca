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

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The mma.sync tiers' device condition (NVIDIA sm_80+); *why names it otherwise.
inline bool mma_sync_device(const qg_context* ctx, const char** why) {
    if (!kGpuIsCuda) {
        *why = "needs NVIDIA mma.sync (no AMD matrix tier yet)";
        return false;
    }
    if (ctx->cc_major >= 8) return true;
    *why = "needs mma.sync (NVIDIA compute capability 8.0+)";
    return false;
}

// Bytes of one element of an activation or output dtype (src/dtypes.h), as an int for
// pointer offsets.
inline int dtype_bytes(qg_dtype d) { return (int)dtype_size(d); }

// The device element type (hip/elem.h) of an fp32 / fp16 / bf16 dtype.
inline int elem_type(qg_dtype d) { return d == QG_DTYPE_BF16 ? ELEM_BF16 : d == QG_DTYPE_F32 ? ELEM_F32 : ELEM_F16; }
// The kernels' view of a call's optional bias (bias_dtype is ignored without one).
template <class Args>
BiasRef bias_of(const Args& a) {
    return BiasRef{a.bias, a.bias ? elem_type(a.bias_dtype) : ELEM_F32};
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

// The integer value of the environment variable `name` (atoi), or `unset` where it is not set:
// the QG_EXP_* A/B switches, each read once a process by its caller (a static).
int env_int(const char* name, int unset);

// Whether a launch may be programmatic after the previous kernel (launch_after_prior): on a
// device that has it (sm_90) and unless QG_EXP_PDL=0 (read once a process).
bool pdl_enabled(const qg_context* ctx);

// Launches `kernel` (a lookup function's answer: the address of a kernel's host stub,
// hip/gguf_kernels.h) with its one parameter struct, and reports as gpu_check_launch does
// after a <<<>>> launch (whose stub calls hipLaunchKernel too): a failed launch is this
// thread's last error, named with `what`.
// `after_prior`: launched programmatically after the stream's previous kernel (hip/compat.h).
template <class P>
qg_status launch(const void* kernel, dim3 grid, int threads, size_t smem, hipStream_t stream, const P& params,
                 const char* what, bool after_prior = false)
{
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "%s: no kernel for this configuration", what);
    void* args[] = {const_cast<P*>(&params)};
    // their errors: gpu_check_launch's
    if (after_prior)
        (void)qg_launch_after_prior(kernel, grid, dim3(threads), args, smem, stream);
    else
        (void)hipLaunchKernel(kernel, grid, dim3(threads), args, smem, stream);
    return gpu_check_launch(what);
}

// launch, for a kernel that calls qg_wait_prior_grid before it reads anything the stream's
// previous kernel may write: programmatically after that kernel where ctx's device allows.
template <class P>
qg_status launch_after_prior(const qg_context* ctx, const void* kernel, dim3 grid, int threads, size_t smem,
                             hipStream_t stream, const P& params, const char* what)
{
    return launch(kernel, grid, threads, smem, stream, params, what, pdl_enabled(ctx));
}

#if defined(QG_HAVE_TENSOR_MAPS)
// Launches a wgmma tier's kernel(tensor map of x, parameter struct), reporting as launch()
// does.
template <class P>
qg_status launch_with_map(const void* kernel, dim3 grid, int threads, int smem, hipStream_t stream,
                          const qg_tensor_map& map, const P& params, const char* what)
{
    void* args[] = {const_cast<qg_tensor_map*>(&map), const_cast<P*>(&params)};
    (void)hipLaunchKernel(kernel, grid, dim3(threads), args, smem, stream);   // its error: gpu_check_launch's
    return gpu_check_launch(what);
}

// x [rows, k] of 16-bit elements (row stride ld elements) as the 2-D tensor map the wgmma
// tiers read their B operand through: box [box_rows x 64 k], 128-byte swizzle (the layout
// of wgmma_desc_k128b, hip/wgmma.h), zeros past rows and k. `what` names the tier in errors.
inline qg_status encode_x_map(const void* x, int64_t rows, int64_t k, int64_t ld, qg_dtype dtype, int box_rows,
                              qg_tensor_map* map, const char* what)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 encode =
        reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(qg_driver_entry_point("cuTensorMapEncodeTiled"));
    if (encode == nullptr)
        return set_error(QG_ERR_DEVICE, "%s: the driver has no cuTensorMapEncodeTiled (CUDA 12.0+ driver)", what);
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r =
        encode(map, dtype == QG_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
               const_cast<void*>(x), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return set_error(QG_ERR_DEVICE, "%s: cuTensorMapEncodeTiled failed (%d) for x m=%lld k=%lld ldx=%lld", what,
                         static_cast<int>(r), static_cast<long long>(rows), static_cast<long long>(k),
                         static_cast<long long>(ld));
    return QG_OK;
}
#endif

// Per-kernel facts asked of the runtime once: the dynamic shared-memory limit raised to
// `smem` on this device, and the resident blocks per SM at `threads` x `smem` (0 when the
// kernel cannot be resident or the runtime refused). Defined in src/gpu/runtime.cpp.
int resident_blocks(const qg_context* ctx, const void* kernel, int threads, int smem);
// Raises `kernel`'s dynamic shared-memory limit to `smem` once per device and kernel.
qg_status prepare_kernel(const qg_context* ctx, const void* kernel, int smem, const char* what);

}  // namespace launch_util
}  // namespace qg
