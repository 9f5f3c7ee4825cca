// W4A16 prefill tier (hip/w4a16_prefill.hip): its table entry, the tensor map of x and the
// launch. NVIDIA sm_90a only (wgmma, TMA); on other builds and devices it is not usable.
#include <stdint.h>

#include "formats/w4a16_frag.h"
#include "launch_util.h"
#include "tier_table.h"
#include "w4a16_kernels.h"

namespace qg {
namespace {

using namespace w4a16;
using launch_util::ceil_div;
typedef qg_w4a16_gemm_args Args;

using launch_util::elem_type;

#if defined(QG_HAVE_TENSOR_MAPS) && defined(QG_BUILT_SM90A)
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

bool prefill_usable(const qg_context* ctx, const Args& a, const char** why) {
    if (!gpu_context_only(ctx, why)) return false;
    if (!kBuilt) {
        *why = "needs wgmma and TMA: a CUDA build with sm_90a among QG_CUDA_ARCHS";
        return false;
    }
    if (ctx->cc_major != 9 || ctx->cc_minor != 0) {
        *why = "needs an sm_90 GPU (H100, H200): wgmma is compiled for sm_90a";
        return false;
    }
    if (a.layout != QG_W4A16_LAYOUT_FRAG) {
        *why = "reads the frag layout (qg_w4a16_repack)";
        return false;
    }
    if ((reinterpret_cast<uintptr_t>(a.x) & 15u) != 0 || a.ldx % 8 != 0) {
        *why = "x goes through a TMA tensor map: x must be 16-byte aligned and ldx a multiple of 8";
        return false;
    }
    if (a.n >= (int64_t(1) << 31) || a.k >= (int64_t(1) << 31) || a.m >= (int64_t(1) << 31) ||
        a.ldx >= (int64_t(1) << 38)) {
        *why = "m, n, k must be below 2^31 and ldx below 2^38 (32-bit indices, TMA strides)";
        return false;
    }
    return true;
}

#if defined(QG_HAVE_TENSOR_MAPS)
// x [M, K] (row stride ldx) as a 2-D tensor map: box [bn tokens x 64 k], 128-byte swizzle
// (the layout the wgmma descriptors of the kernel expect), zeros past M and K.
qg_status encode_x(const Args& a, int bn, qg_tensor_map* map) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode =
        reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(qg_driver_entry_point("cuTensorMapEncodeTiled"));
    if (encode == nullptr)
        return set_error(QG_ERR_DEVICE, "w4a16 prefill: the driver has no cuTensorMapEncodeTiled (CUDA 12.0+ driver)");
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.m)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.ldx) * 2};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(bn)};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r = encode(map, a.x_dtype == QG_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                              2, const_cast<void*>(a.x), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return set_error(QG_ERR_DEVICE, "w4a16 prefill: cuTensorMapEncodeTiled failed (%d) for x m=%lld k=%lld ldx=%lld",
                         static_cast<int>(r), static_cast<long long>(a.m), static_cast<long long>(a.k),
                         static_cast<long long>(a.ldx));
    return QG_OK;
}
#endif

qg_status prefill_launch(const qg_context* ctx, const Args& a, qg_stream stream) {
#if defined(QG_HAVE_TENSOR_MAPS)
    const frag::Geometry geo(a.n, a.k, a.group_size);
    // 64-token tiles when 128 would leave most of one empty (m <= 64) or the grid short of
    // two waves (measured: bench/NOTES.md, "W4A16 prefill")
    const int64_t row_tiles = ceil_div(a.n, PF_ROWS);
    const bool small_m = a.m <= 64;
    const bool few_blocks = row_tiles * ceil_div(a.m, 128) < 2 * static_cast<int64_t>(ctx->sm_count);
    const int bn = small_m || few_blocks ? 64 : 128;
    const int x_type = elem_type(a.x_dtype);
    const bool asym = a.qzeros != nullptr;
    const void* kernel = prefill_kernel(x_type, bn, a.group_size, asym);
    const int smem = bn == 128 ? PrefillSmem<128>::SMEM : PrefillSmem<64>::SMEM;
    if (kernel == nullptr) return set_error(QG_ERR_INTERNAL, "w4a16 prefill_wgmma: no kernel for bn=%d", bn);
    qg_status st = launch_util::prepare_kernel(ctx, kernel, smem, "w4a16 prefill_wgmma");
    if (st != QG_OK) return st;
    qg_tensor_map map;
    st = encode_x(a, bn, &map);
    if (st != QG_OK) return st;
    PrefillParams p{};
    p.qweight = reinterpret_cast<const uint32_t*>(a.qweight);
    p.scales = static_cast<const uint32_t*>(a.scales);
    p.qzeros = reinterpret_cast<const uint8_t*>(a.qzeros);
    p.y = a.y;
    p.ldy = a.ldy;
    p.m = static_cast<int>(a.m);
    p.n = static_cast<int>(a.n);
    p.k_tiles = static_cast<int>(geo.k_tiles);
    p.k_chunks = static_cast<int>(geo.k_chunks);
    p.row_blocks = static_cast<int>(geo.row_blocks);
    p.scale_type = elem_type(a.scale_dtype);
    p.y_type = elem_type(a.y_dtype);
    const dim3 grid(static_cast<unsigned>(ceil_div(a.m, bn)), static_cast<unsigned>(row_tiles));
    if (log_enabled())
        log_once("w4a16 prefill_wgmma m=%lld n=%lld k=%lld g=%d %s: tile 128 rows x %d tokens, grid %u x %u, smem %d",
                 static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k), a.group_size,
                 asym ? "asym" : "sym", bn, grid.x, grid.y, smem);
    void* args[] = {&map, &p};
    const hipError_t e = hipLaunchKernel(kernel, grid, dim3(PF_THREADS), args, smem, static_cast<hipStream_t>(stream));
    if (e != hipSuccess) {
        (void)hipGetLastError();
        return set_error(QG_ERR_DEVICE, "launch of w4a16 prefill_wgmma failed: %s", hipGetErrorString(e));
    }
    return gpu_check_launch("w4a16 prefill_wgmma");
#else
    (void)ctx, (void)a, (void)stream;
    return set_error(QG_ERR_INTERNAL, "unreachable: prefill_wgmma without tensor maps");
#endif
}

}  // namespace

const Tier<Args> gpu_w4a16_prefill_tier = {QG_GPU_RUNTIME_NAME ":prefill_wgmma", 3, prefill_usable, nullptr,
                                           prefill_launch};

}  // namespace qg
