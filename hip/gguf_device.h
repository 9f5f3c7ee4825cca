// Device helpers shared by the two GGUF kernel files (hip/gguf.hip, hip/gguf_mma.hip), HIP
// dialect: the rounding of the gguf package's float32 steps, loads from the shared-memory
// row buffers, x and y element conversion, cp.async and the IQ3_XXS grid. Included by
// kernel files only (the grid is a __constant__ array of each compilation unit).
#pragma once

#include <stdint.h>

#include "compat.h"
#include "splitk.h"
#include "quantgemm.h"
#include "formats/iq_tables.h"

namespace qg {
namespace gguf {

// Products and differences that must round exactly as the gguf package's float32
// numpy code does: never fused into an FMA (hip/compat.h's qg_fmul_rn, qg_fsub_rn).
__device__ __forceinline__ float mul_rn(float a, float b) { return qg_fmul_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return qg_fsub_rn(a, b); }

__device__ __forceinline__ float half_bits_to_float(uint32_t bits)
{
    return __half2float(__ushort_as_half((unsigned short)bits));
}

// N little-endian words starting at byte `off` (even) of a shared buffer whose base is
// 16-byte aligned: aligned word loads joined by funnel shifts (off % 4 is 0 or 2).
// Reads one aligned word past the range (row_buffer_bytes leaves room for it).
template <int N>
__device__ __forceinline__ void ld_words_a2(const uint8_t* buf, int off, uint32_t (&out)[N])
{
    const uint32_t* q = reinterpret_cast<const uint32_t*>(buf + (off & ~3));
    const unsigned shift = (unsigned)(off & 3) * 8u;
    uint32_t prev = q[0];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const uint32_t next = q[i + 1];
        out[i] = __funnelshift_r(prev, next, shift);
        prev = next;
    }
}

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* buf, int off)
{
    return *reinterpret_cast<const uint16_t*>(buf + off);
}

// x[i] of an fp32, fp16 or bf16 array (qg_dtype) as fp32; y[i] = v rounded to nearest even.
__device__ __forceinline__ float load_x(const void* x, int64_t i, int dtype)
{
    if (dtype == QG_DTYPE_F32) return static_cast<const float*>(x)[i];
    const uint32_t bits = static_cast<const uint16_t*>(x)[i];
    return dtype == QG_DTYPE_BF16 ? __uint_as_float(bits << 16) : half_bits_to_float(bits);
}

__device__ __forceinline__ void store_y(void* y, int64_t i, float v, int dtype)
{
    if (dtype == QG_DTYPE_F32) {
        static_cast<float*>(y)[i] = v;
    } else if (dtype == QG_DTYPE_F16) {
        static_cast<uint16_t*>(y)[i] = __half_as_ushort(__float2half_rn(v));
    } else {   // bf16, round to nearest even; NaN stays a (quiet) NaN
        uint32_t u = __float_as_uint(v);
        u = (u & 0x7FFFFFFFu) > 0x7F800000u ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
        static_cast<uint16_t*>(y)[i] = (uint16_t)(u >> 16);
    }
}

#if defined(QG_HAS_MMA_SYNC)
// NVIDIA sm_80+: cp.async (PTX ISA, "Data movement: cp.async") copies 4, 8 or 16 bytes
// from global to shared memory without staging them in registers, so a warp can have
// the next step in flight while it decodes the current one (two buffers per row).
// .cg (16-byte copies only) caches in L2 but not L1: weights are read once.
#define QG_GGUF_ASYNC_COPY 1

template <int L>
__device__ __forceinline__ void cp_async(uint8_t* dst, const uint8_t* src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (L == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(L) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for all of this thread's copy groups but the newest one.
__device__ __forceinline__ void cp_async_wait_all_but_newest() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
#endif

// IQ3_XXS grid (256 entries, four magnitudes 4..62 per word, gguf's table via
// tools/gen_iq_tables.py). Copied to shared memory by every block: lanes look up
// unrelated entries, which constant memory would serialize.
static __constant__ uint32_t c_iq3xxs_grid[256] = QG_IQ3XXS_GRID;

}  // namespace gguf
}  // namespace qg
