// The prefill tier of the frag layout (W4A16, MXFP4, the GGUF codes): the kernels of a block a
// tile and the lookup the launchers call. The kernel is hip/prefill_wgmma.h; its stream-K
// instantiations compile in hip/w4a16_prefill_sk.hip, in parallel with these.
#include "prefill_wgmma.h"

namespace qg {
namespace w4a16 {

#if defined(QG_HAVE_TENSOR_MAPS)
const void* prefill_kernel(int x_type, int scale_type, int bn, int group_size, bool asym, int code, bool stream_k) {
    return stream_k ? prefill_kernel_stream_k(x_type, scale_type, bn, group_size, asym, code)
                    : prefill_lookup<false>(x_type, scale_type, bn, group_size, asym, code);
}
#endif  // QG_HAVE_TENSOR_MAPS

}  // namespace w4a16
}  // namespace qg
