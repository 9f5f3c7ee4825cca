// The ONE place where HIP and CUDA names differ.
//
// Device and runtime code in hip/ and src/gpu/ is written in the HIP dialect
// (hipMalloc, hipStream_t, __shfl_xor, ...). Compiled by a HIP compiler this header
// only includes the HIP runtime; compiled by nvcc it maps each HIP name used in the
// project onto its CUDA twin (the reverse of what ggml's vendors/hip.h does).
// Add a name here, and only here, when the code needs a new one.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
// ------------------------------------------------------------------ HIP (ROCm)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define QG_GPU_HIP 1
#define QG_GPU_RUNTIME_NAME "hip"
#define qg_device_trap() __builtin_trap()
#define __shfl_sync_all(var, src_lane) __shfl((var), (src_lane))
constexpr bool kGpuIsCuda = false;
// Programmatic dependent launch is CUDA's (sm_90): HIP waits for the previous kernel as usual.
__device__ __forceinline__ void qg_wait_prior_grid() {}
inline hipError_t qg_launch_after_prior(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                        hipStream_t stream) {
    return hipLaunchKernel(kernel, grid, block, args, smem, stream);
}

// Warp-level barrier between lanes' shared-memory stores and other lanes' loads (HIP 5.2
// has no __syncwarp): a wavefront barrier between LDS fences.
__device__ __forceinline__ void qg_sync_warp() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// a * b and a - b rounded once, never fused into an FMA (HIP's __fmul_rn is a plain
// product that clang may contract; the pragma forbids it)
__device__ __forceinline__ float qg_fmul_rn(float a, float b) {
#pragma clang fp contract(off)
    return a * b;
}
__device__ __forceinline__ float qg_fsub_rn(float a, float b) {
#pragma clang fp contract(off)
    return a - b;
}
// Device-scope release RMW (*p += v, returns the old value) and acquire fence: the arrival
// of a block that is done with shared data, and the last arrival's claim on it.
__device__ __forceinline__ unsigned qg_atomic_add_release_gpu(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void qg_fence_acquire_gpu() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent"); }
// Device-scope acquire load: a waiter's read of another block's release RMW.
__device__ __forceinline__ unsigned qg_atomic_load_acquire_gpu(const unsigned* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}

#else
// ------------------------------------------------------------------ CUDA (nvcc)
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define QG_GPU_CUDA 1
#define QG_GPU_RUNTIME_NAME "cuda"
#define qg_device_trap() __trap()
constexpr bool kGpuIsCuda = true;
// Programmatic dependent launch (sm_90): a kernel launched by qg_launch_after_prior may start
// while the stream's previous kernel is still finishing (its blocks placed, its prologue run),
// and qg_wait_prior_grid blocks until that kernel has completed and its writes are visible.
// A kernel so launched must wait before it touches memory the previous one writes; launched
// plainly, the wait returns at once.
__device__ __forceinline__ void qg_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
inline cudaError_t qg_launch_after_prior(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                         cudaStream_t stream) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, kernel, args);
}
#define qg_sync_warp() __syncwarp()
#define qg_fmul_rn(a, b) __fmul_rn((a), (b))   // nvcc never contracts these into an FMA
#define qg_fsub_rn(a, b) __fsub_rn((a), (b))
// Device-scope release RMW and acquire fence (see the HIP side). In SASS (sm_90) the release
// RMW is MEMBAR.ALL.GPU and the atomic; __threadfence() is MEMBAR.SC.GPU plus an L1
// invalidation (CCTL.IVALL) that every other block on the SM pays for.
__device__ __forceinline__ unsigned qg_atomic_add_release_gpu(unsigned* p, unsigned v) {
    return cuda::atomic_ref<unsigned, cuda::thread_scope_device>(*p).fetch_add(v, cuda::memory_order_release);
}
__device__ __forceinline__ void qg_fence_acquire_gpu() {
    cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
}
__device__ __forceinline__ unsigned qg_atomic_load_acquire_gpu(const unsigned* p) {
    return cuda::atomic_ref<const unsigned, cuda::thread_scope_device>(*p).load(cuda::memory_order_acquire);
}

// runtime types and constants
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipErrorMemoryAllocation cudaErrorMemoryAllocation
#define hipErrorNoDevice cudaErrorNoDevice
#define hipErrorInsufficientDriver cudaErrorInsufficientDriver
#define hipStream_t cudaStream_t
#define hipEvent_t cudaEvent_t
#define hipDeviceProp_t cudaDeviceProp
#define hipMemcpyKind cudaMemcpyKind
#define hipMemcpyHostToHost cudaMemcpyHostToHost
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemcpyDefault cudaMemcpyDefault
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

// runtime functions
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipLaunchKernel cudaLaunchKernel
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor

// Tensor maps for the bulk tensor copy engine (TMA, sm_90): the driver API's types (header
// only: libcuda is opened lazily by the static runtime) and its encoder, reached through
// the runtime's entry-point query so that nothing links libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>
#define QG_HAVE_TENSOR_MAPS 1
typedef CUtensorMap qg_tensor_map;
inline void* qg_driver_entry_point(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        return nullptr;
    return fn;
}

// device intrinsics: HIP's shuffles take no mask; every lane of the warp participates
#define __shfl_xor(var, lane_mask, width) __shfl_xor_sync(0xffffffffu, (var), (lane_mask), (width))
#define __shfl_sync_all(var, src_lane) __shfl_sync(0xffffffffu, (var), (src_lane))
#endif

// Warp width as a compile-time constant: 64 on CDNA (gfx9: gfx90a, gfx942, gfx950),
// 32 on NVIDIA and RDNA (gfx10, gfx11, gfx12).
#if defined(__GFX9__)
#define QG_WARP_SIZE 64
#else
#define QG_WARP_SIZE 32
#endif

// NVIDIA matrix tiers: mma.sync needs sm_80+, wgmma needs sm_90a. Host code asks
// gpu_context_init's compute capability; device code uses these guards.
#if defined(QG_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define QG_HAS_MMA_SYNC 1
#endif
// wgmma, setmaxnreg and the TMA copies the prefill tier uses: the sm_90a feature set
// (nvcc defines __CUDA_ARCH_FEAT_SM90_ALL for -gencode arch=compute_90a).
#if defined(QG_GPU_CUDA) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QG_HAS_WGMMA 1
#endif

#if defined(QG_HAS_MMA_SYNC)
namespace qg {
// The shared-space address of a shared-memory pointer (the operand of cp.async, ldmatrix,
// mbarrier and TMA instructions).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
}  // namespace qg
#endif
