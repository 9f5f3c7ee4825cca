// Internal interface between the ABI layer (src/api.cpp) and the tiers.
//
// api.cpp validates every argument, handles empty problems and picks the backend;
// a tier function is only ever called with arguments that passed those checks.
// Tiers report failures through qg::set_error and return its status.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "quantgemm.h"

struct qg_context {
    qg_backend backend = QG_BACKEND_CPU;
    int device = 0;
    // options (qg_context_set_option); 0 = auto everywhere
    int64_t cpu_threads = 0;
    int64_t w4a16_tier = 0;
    int64_t gguf_tier = 0;
    int64_t split_k = 0;
    int64_t prefill_tile = 0;
    int64_t cpu_precision = 0;
    // tier forced by name per family (qg_context_set_tier): a tier table's static name, or
    // nullptr for the numeric option / auto; index: Family below
    const char* forced_tier[4] = {nullptr, nullptr, nullptr, nullptr};
    // GPU properties read once at creation (zero on the CPU backend)
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;
    size_t l2_bytes = 0;
    char name[256] = {0};
};

namespace qg {

// Kernel families, for qg_context::forced_tier and qg_context_set_tier's names.
enum Family { FAMILY_W4A16 = 0, FAMILY_GGUF = 1, FAMILY_MXFP4 = 2, FAMILY_MOE = 3, FAMILY_COUNT = 4 };

// Records `fmt` as this thread's qg_last_error() sentence and returns `status`.
qg_status set_error(qg_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// True when QG_LOG=1; log_once prints "[quantgemm] <line>" once per distinct line.
bool log_enabled();
void log_once(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

// ---------------------------------------------------------------- CPU tier (src/cpu/)
qg_status cpu_w4a16_gemm(const qg_context* ctx, const qg_w4a16_gemm_args* a);
qg_status cpu_gguf_gemm(const qg_context* ctx, const qg_gguf_gemm_args* a);
qg_status cpu_mxfp4_gemm(const qg_context* ctx, const qg_mxfp4_gemm_args* a);
qg_status cpu_moe_align(const qg_context* ctx, const qg_moe_align_args* a);
qg_status cpu_moe_stage1(const qg_context* ctx, const qg_moe_stage1_args* a);
qg_status cpu_moe_stage2(const qg_context* ctx, const qg_moe_stage2_args* a);
// The CPU model name from /proc/cpuinfo into buf, "CPU" where that is not available
// (src/cpu/cpu_info.cpp): the device name of a CPU context.
void cpu_model_name(char* buf, size_t size);

// W4A16 layouts on the host (src/w4a16_layout.cpp): the CPU repack, its inverse, and the CPU
// tier on a frag-layout weight (unpacks to canonical, then cpu_w4a16_gemm).
void w4a16_repack_frag_host(const qg_w4a16_repack_args& a);
void w4a16_frag_to_canonical_host(const qg_w4a16_gemm_args& a, int32_t* qweight, uint16_t* scales, int32_t* qzeros);
qg_status cpu_w4a16_gemm_frag(const qg_context* ctx, const qg_w4a16_gemm_args* a);

// MXFP4 layouts on the host (src/mxfp4_layout.cpp): the CPU repack (the W4A16 frag planes of
// G = 32, E2M1 codes, bf16 2^(e - 127) scales), its inverse, and the CPU tier on a
// frag-layout weight (unpacks to canonical, then cpu_mxfp4_gemm).
void mxfp4_repack_frag_host(const qg_mxfp4_repack_args& a);
void mxfp4_frag_to_canonical_host(const qg_mxfp4_gemm_args& a, uint8_t* blocks, uint8_t* scales);
qg_status cpu_mxfp4_gemm_frag(const qg_context* ctx, const qg_mxfp4_gemm_args* a);
// GGUF layouts on the host (src/gguf_layout.cpp): the CPU repack (Q4_0 into the W4A16 frag
// planes of G = 32, fp16 d as the scales), and the CPU tier on a frag-layout weight (unpacks
// to the .gguf blocks, then cpu_gguf_gemm).
void gguf_repack_frag_host(const qg_gguf_repack_args& a);
qg_status cpu_gguf_gemm_frag(const qg_context* ctx, const qg_gguf_gemm_args* a);
// qg_gguf_repack into the rows8 layout (src/formats/gguf_rows8.h), which cpu_gguf_gemm reads
// as it is (src/gguf_layout.cpp).
void gguf_repack_rows8_host(const qg_gguf_repack_args& a);
// qg_moe_repack on a CPU context: every part of every expert as mxfp4_repack_frag_host
// writes a dense weight (src/mxfp4_layout.cpp).
void moe_repack_frag_host(const qg_moe_repack_args& a);

// ---------------------------------------------------------------- GPU tier (src/gpu/)
// Compiled only when QG_HAVE_GPU is defined (CUDA or HIP build).
#if defined(QG_HAVE_GPU)
// runtime (src/gpu/runtime.cpp)
qg_status gpu_device_count(int* count);
qg_status gpu_context_init(qg_context* ctx);   // selects ctx->device, fills properties
qg_status gpu_malloc(const qg_context* ctx, size_t bytes, void** ptr);
qg_status gpu_free(const qg_context* ctx, void* ptr);
qg_status gpu_memcpy(const qg_context* ctx, void* dst, const void* src, size_t bytes,
                     qg_copy_kind kind, qg_stream stream);
qg_status gpu_memset(const qg_context* ctx, void* dst, int value, size_t bytes, qg_stream stream);
qg_status gpu_stream_create(const qg_context* ctx, qg_stream* stream);
qg_status gpu_stream_destroy(const qg_context* ctx, qg_stream stream);
qg_status gpu_stream_synchronize(const qg_context* ctx, qg_stream stream);
qg_status gpu_event_create(const qg_context* ctx, void** event);
qg_status gpu_event_destroy(const qg_context* ctx, void* event);
qg_status gpu_event_record(const qg_context* ctx, void* event, qg_stream stream);
qg_status gpu_event_synchronize(const qg_context* ctx, void* event);
qg_status gpu_event_elapsed_ms(const qg_context* ctx, void* start, void* stop, float* ms);
// Checks the launch that just happened; names `what` in the error.
qg_status gpu_check_launch(const char* what);

// The kernel families' GPU tiers are entries of their tier tables (src/tier_table.h),
// defined next to their launchers in src/gpu/*_launch.cpp.
// W4A16 repack into the frag layout on the device (src/gpu/w4a16_launch.cpp).
qg_status gpu_w4a16_repack(const qg_context* ctx, const qg_w4a16_repack_args& a, qg_stream stream);
// MXFP4 repack into its frag layout on the device (src/gpu/mxfp4_launch.cpp).
qg_status gpu_mxfp4_repack(const qg_context* ctx, const qg_mxfp4_repack_args& a, qg_stream stream);
// GGUF repack into its frag layout on the device (src/gpu/gguf_frag_launch.cpp).
qg_status gpu_gguf_repack(const qg_context* ctx, const qg_gguf_repack_args& a, qg_stream stream);
// MoE repack into its frag layout on the device (src/gpu/moe_launch.cpp).
qg_status gpu_moe_repack(const qg_context* ctx, const qg_moe_repack_args& a, qg_stream stream);
// Shared memory per SM in bytes (occupancy estimates of the launchers).
int gpu_smem_per_sm(const qg_context* ctx);
#endif

// Tiers compiled into this build, for qg_build_info (src/tier_table.cpp).
const char* build_info();

}  // namespace qg
