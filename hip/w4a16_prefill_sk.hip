// The stream-K kernels of the frag layout's prefill tier (hip/prefill_wgmma.h), a translation
// unit of their own so that they compile in parallel with hip/w4a16_prefill.hip's.
#include "prefill_wgmma.h"

namespace qg {
namespace w4a16 {

#if defined(QG_HAVE_TENSOR_MAPS)
const void* prefill_kernel_stream_k(int x_type, int scale_type, int bn, int group_size, bool asym, int code) {
    return prefill_lookup<true>(x_type, scale_type, bn, group_size, asym, code);
}
#endif  // QG_HAVE_TENSOR_MAPS

}  // namespace w4a16
}  // namespace qg
