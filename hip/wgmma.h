// Hopper (sm_90a) wrappers: mbarriers, the bulk tensor copy (TMA) into shared memory, and
// warpgroup mma (wgmma) with the A operand in registers. Compiled only where QG_HAS_WGMMA
// is set (hip/compat.h); the tiers using them are gated on the host (sm_90a built, cc 9.0).
// PTX ISA references: "mbarrier", "cp.async.bulk.tensor", "wgmma.mma_async",
// "Matrix Descriptor Format" (shared-memory matrix descriptors of wgmma).
#pragma once

#include <stdint.h>

#include "compat.h"
#include "elem.h"

namespace qg {

#if defined(QG_HAS_WGMMA)
// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) as well.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Each takes the barrier as a shared-memory address (the `_at` forms: a kernel that computes
// its ring's addresses once keeps the generic-to-shared conversion out of its loop) or as a
// pointer.
__device__ __forceinline__ void mbar_arrive_at(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive_at(smem_addr(bar)); }
// The arrival of a TMA producer: one arrival plus `bytes` the copies will complete.
__device__ __forceinline__ void mbar_arrive_expect_tx_at(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    mbar_arrive_expect_tx_at(smem_addr(bar), bytes);
}
// Waits until the barrier's phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait_at(uint32_t a, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(a),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait_at(smem_addr(bar), parity); }

// ---------------------------------------------------------------- named barriers
// bar.sync waits until `count` threads have arrived at barrier `id` (1..15; 0 is
// __syncthreads'); bar.arrive counts the calling warp's threads without waiting. Two
// warpgroups hand a turn to each other with one of each (warp-granular, 128 + 128).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// ---------------------------------------------------------------- TMA
// 2-D tile load: box at element coordinates (c0 inner, c1 outer) of the tensor map into
// shared memory, completing `bar`'s transaction count. Out-of-range elements read as zero.
__device__ __forceinline__ void tma_load_2d_at(uint32_t smem_dst, const void* tensor_map, uint32_t bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_dst),
        "l"(tensor_map), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* tensor_map, uint64_t* bar, int c0, int c1) {
    tma_load_2d_at(smem_addr(smem_dst), tensor_map, smem_addr(bar), c0, c1);
}
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tensor_map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map) : "memory");
}

// ---------------------------------------------------------------- stmatrix
// Four 8x8 16-bit matrices from mma accumulator-style registers into shared memory, each
// stored transposed (PTX ISA "stmatrix", .trans): r[i] of lane 4 g + t holds row g, columns
// 2 t and 2 t + 1 of matrix i; column c of matrix i (8 elements, 16 bytes) goes to the
// address that lane 8 i + c gives. A warp stores 512 bytes with one instruction where 16-bit
// stores would take 128.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
// 16 bytes from shared memory by address (ld.shared: a generic pointer into shared memory
// compiles to a generic LD).
__device__ __forceinline__ uint4 lds128_at(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
                 : "memory");
    return v;
}
// A float into shared memory by address.
__device__ __forceinline__ void sts32_at(uint32_t addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
// Orders this thread's generic-proxy accesses of shared memory before later async-proxy ones
// (a TMA copy into the same bytes: PTX ISA "Proxies", fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---------------------------------------------------------------- wgmma
// Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle that TMA's
// CU_TENSOR_MAP_SWIZZLE_128B writes: rows of 64 16-bit elements (128 B), 8-row swizzle
// atoms 1024 B apart (stride byte offset), leading byte offset 16 B (unused by this
// layout, set as CUTLASS does), layout type 1 = 128B swizzle in bits 62..63. The tile
// must start 1024-byte aligned (base offset 0); the k16 steps inside it start 32 B apart.
__device__ __forceinline__ uint64_t wgmma_desc_k128b_at(uint32_t tile) {
    return ((uint64_t(tile) & 0x3ffffull) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
           (1ull << 62);
}
__device__ __forceinline__ uint64_t wgmma_desc_k128b(const void* tile) { return wgmma_desc_k128b_at(smem_addr(tile)); }
// The descriptor of the tile `bytes` further on (a k16 step: 32): the start address field (the
// low 14 bits) holds the address in 16-byte units, and a shared-memory address stays below 2^18,
// so no carry leaves the field: the add is on the low word alone (a 64-bit add compiles to a
// carry chain and register copies).
__device__ __forceinline__ uint64_t wgmma_desc_offset(uint64_t desc, uint32_t bytes) {
    return (desc & 0xffffffff00000000ull) | (static_cast<uint32_t>(desc) + (bytes >> 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Accumulators of one warpgroup's m64nNk16: N/2 fp32 per thread. Thread (warp w of the
// warpgroup, lane 4g + t) holds d[4j + i]: row 16w + g + 8 (i >> 1), column 8j + 2t + (i & 1).
template <int N>
struct WgAcc {
    float d[N / 2];
};

// Pins the accumulators to their registers across a wgmma still in flight (an empty asm
// reading and writing each): without it the compiler may copy them between the issue and
// the wait, and ptxas then serializes every wgmma (its warning C7514).
template <int N>
__device__ __forceinline__ void wgmma_fence_acc(WgAcc<N>& c) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(c.d[i])::"memory");
}

// D (+)= A (64 x 16, registers: the mma.m16n8k16 A fragment of each warp's 16 rows) x
// B (16 x N, K-major in shared memory, descriptor `desc`); scale_d = 0 overwrites D.
// XT: ELEM_F16 or ELEM_BF16 (fp32 accumulation).
// OFF: the first of the instruction's accumulators in c (a fused tile: n256 from 0, its tail from 128).
#define QG_WGMMA_OPS8(i) "+f"(c.d[OFF + i]), "+f"(c.d[OFF + i + 1]), "+f"(c.d[OFF + i + 2]), "+f"(c.d[OFF + i + 3]), \
                         "+f"(c.d[OFF + i + 4]), "+f"(c.d[OFF + i + 5]), "+f"(c.d[OFF + i + 6]), "+f"(c.d[OFF + i + 7])

template <int XT, int OFF = 0>
__device__ __forceinline__ void wgmma_m64n128k16(WgAcc<128>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_128(TYPE)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                                  \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                 \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                 \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                \
                 "{%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"                                                     \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8), QG_WGMMA_OPS8(16), QG_WGMMA_OPS8(24), QG_WGMMA_OPS8(32),     \
                   QG_WGMMA_OPS8(40), QG_WGMMA_OPS8(48), QG_WGMMA_OPS8(56)                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_128("bf16");
    else QG_WGMMA_128("f16");
#undef QG_WGMMA_128
}

template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n64k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_64(TYPE)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                                   \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                \
                 "{%32, %33, %34, %35}, %37, p, 1, 1, 0;\n}\n"                                                     \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8), QG_WGMMA_OPS8(16), QG_WGMMA_OPS8(24)                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_64("bf16");
    else QG_WGMMA_64("f16");
#undef QG_WGMMA_64
}
template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n256k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_256(TYPE)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %132, 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                                  \
                 "{"                                                                                                \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                           \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                 \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                 \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                 \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                 \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                 \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "     \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
                 "{%128, %129, %130, %131}, %133, p, 1, 1, 0;\n}\n"                                             \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8), QG_WGMMA_OPS8(16), QG_WGMMA_OPS8(24), QG_WGMMA_OPS8(32),     \
                   QG_WGMMA_OPS8(40), QG_WGMMA_OPS8(48), QG_WGMMA_OPS8(56), QG_WGMMA_OPS8(64), QG_WGMMA_OPS8(72),   \
                   QG_WGMMA_OPS8(80), QG_WGMMA_OPS8(88), QG_WGMMA_OPS8(96), QG_WGMMA_OPS8(104),                     \
                   QG_WGMMA_OPS8(112), QG_WGMMA_OPS8(120)                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_256("bf16");
    else QG_WGMMA_256("f16");
#undef QG_WGMMA_256
}

// The grouped MoE tiles of 80 and 96 tokens (experts of ~64 +- 8 rows in one tile, where the
// 64-token tile spills half of them into a second, mostly padded one).
template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n80k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_80(TYPE)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %44, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32." TYPE "." TYPE " "                                   \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                 \
                 "%32, %33, %34, %35, %36, %37, %38, %39}, "                                                         \
                 "{%40, %41, %42, %43}, %45, p, 1, 1, 0;\n}\n"                                                     \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8), QG_WGMMA_OPS8(16), QG_WGMMA_OPS8(24), QG_WGMMA_OPS8(32)      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_80("bf16");
    else QG_WGMMA_80("f16");
#undef QG_WGMMA_80
}
template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n96k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_96(TYPE)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %52, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32." TYPE "." TYPE " "                                   \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                 \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "                 \
                 "{%48, %49, %50, %51}, %53, p, 1, 1, 0;\n}\n"                                                     \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8), QG_WGMMA_OPS8(16), QG_WGMMA_OPS8(24), QG_WGMMA_OPS8(32),     \
                   QG_WGMMA_OPS8(40)                                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_96("bf16");
    else QG_WGMMA_96("f16");
#undef QG_WGMMA_96
}

// The 32-token tile (17 .. 32 tokens: half the tensor work of the 64-token one there).
template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n32k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_32(TYPE)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %20, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                                   \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                          \
                 "{%16, %17, %18, %19}, %21, p, 1, 1, 0;\n}\n"                                                     \
                 : QG_WGMMA_OPS8(0), QG_WGMMA_OPS8(8)                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_32("bf16");
    else QG_WGMMA_32("f16");
#undef QG_WGMMA_32
}

// The narrow tail of a fused tile (256 + 16 tokens).
template <int XT, int OFF = 0, int N>
__device__ __forceinline__ void wgmma_m64n16k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#define QG_WGMMA_16(TYPE)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %12, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE " "                                   \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %13, p, 1, 1, 0;\n}\n"                      \
                 : QG_WGMMA_OPS8(0)                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc))
    if (XT == ELEM_BF16) QG_WGMMA_16("bf16");
    else QG_WGMMA_16("f16");
#undef QG_WGMMA_16
}
// N = 256 + T (T = 16 or 64): a fused tile, whose last T tokens are a second wgmma on the same
// A registers, its B from the tile's row 256 (32 KB on: whole 1024-byte swizzle atoms) and its
// accumulators from d[128]. (n32 / n48 forms would follow the n16 one; every fused tile wider
// than 272 spilled, bench/NOTES.md session 40.)
template <int XT, int N>
__device__ __forceinline__ void wgmma_m64k16(WgAcc<N>& c, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
    if constexpr (N > 256) {
        static_assert(N == 272 || N == 320, "a fused tile is 256 + 16 or 64 tokens");
        wgmma_m64n256k16<XT, 0>(c, a, desc, scale_d);
        const uint64_t tail = wgmma_desc_offset(desc, 256 * 128);
        if constexpr (N == 272) wgmma_m64n16k16<XT, 128>(c, a, tail, scale_d);
        else wgmma_m64n64k16<XT, 128>(c, a, tail, scale_d);
    } else if constexpr (N == 256) wgmma_m64n256k16<XT>(c, a, desc, scale_d);
    else if constexpr (N == 128) wgmma_m64n128k16<XT>(c, a, desc, scale_d);
    else if constexpr (N == 96) wgmma_m64n96k16<XT>(c, a, desc, scale_d);
    else if constexpr (N == 80) wgmma_m64n80k16<XT>(c, a, desc, scale_d);
    else if constexpr (N == 64) wgmma_m64n64k16<XT>(c, a, desc, scale_d);
    else {
        static_assert(N == 32, "a token tile is 32, 64, 80, 96, 128, 256 or a fused one");
        wgmma_m64n32k16<XT>(c, a, desc, scale_d);
    }
}
#undef QG_WGMMA_OPS8
#endif  // QG_HAS_WGMMA

}  // namespace qg
