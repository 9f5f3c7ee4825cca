"""pyquant: Python side of libquantgemm (fused dequantize + GEMM for low-bit LLM weights).

    import pyquant
    w = pyquant.quantize(W, "int4", group_size=128)   # or from_gguf / from_mxfp4 / Int4Weight.from_awq
    y = pyquant.gemm(x, w)                             # numpy -> CPU tier; device arrays -> GPU tier

The library is loaded with ctypes (pyquant._lib, a one-to-one mirror of quantgemm.h);
$PYQUANT_LIB overrides where it is looked for. pyquant.formats (the numpy reference, the
specification of every format) works without the library.
"""

# Checked against qg_version() (major.minor) when the library loads; keep in step with
# QG_VERSION_* in include/quantgemm.h and the project version in CMakeLists.txt.
__version__ = "0.1.0"

from ._lib import InvalidArgumentError, LibraryNotFoundError, QuantGemmError  # noqa: E402
from .device import (  # noqa: E402
    Context,
    DeviceArray,
    DeviceView,
    Event,
    Stream,
    cpu_context,
    default_context,
    device_count,
    gpu_available,
    gpu_context,
)
from .weights import GGUFWeight, Int4Weight, MXFP4Weight  # noqa: E402
from .api import GemmPlan, build_info, from_gguf, from_mxfp4, gemm, gemm_plan, moe, moe_repack, quantize  # noqa: E402
from .loaders import load_gguf, load_safetensors  # noqa: E402
from . import formats  # noqa: E402
from . import tiers  # noqa: E402  (pyquant.tiers.tiers(): the tier names of this build)


# `pyquant.formats` is both the reference subpackage (pyquant.formats.get, .q4_k, ...) and,
# as DESIGN.md has it, a call listing the registered names: pyquant.formats() -> ["int4", ...].
# A plain function of that name would shadow the subpackage for `from pyquant import
# formats`, so the module itself is made callable.
class _CallableFormatsModule(type(formats)):
    def __call__(self) -> list:
        """Registered format names: "int4", "q8_0", "q4_0", "q4_K", "q6_K", "iq4_xs", "iq3_xxs", "mxfp4"."""
        return self.names()


formats.__class__ = _CallableFormatsModule

__all__ = [
    "__version__",
    "QuantGemmError", "InvalidArgumentError", "LibraryNotFoundError",
    "Context", "DeviceArray", "DeviceView", "Event", "Stream",
    "cpu_context", "default_context", "device_count", "gpu_available", "gpu_context",
    "Int4Weight", "GGUFWeight", "MXFP4Weight",
    "formats", "build_info", "quantize", "from_gguf", "from_mxfp4", "gemm", "gemm_plan", "GemmPlan", "moe", "moe_repack",
    "load_gguf", "load_safetensors", "tiers",
]
