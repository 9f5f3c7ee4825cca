"""Calls one GPU GEMM a few times, for a profiler (ncu) to measure a single kernel.

    QG_LOG=1 ncu --clock-control none -k regex:decode python bench/profile_gemm.py w4a16 43008 5376 1
    python bench/profile_gemm.py gguf:q4_K 43008 5376 1
"""
import sys

import ml_dtypes
import numpy as np

import pyquant
from pyquant import formats as F


def make_weight(fam: str, n: int, k: int, rng):
    """A random host weight: "w4a16[:G]" (asymmetric, bf16 scales) or "gguf:<format>"."""
    if fam.startswith("w4a16"):
        g = int(fam.split(":")[1]) if ":" in fam else 128
        qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
        scales = (rng.uniform(0.5, 2, size=(n, k // g)) / 16).astype(ml_dtypes.bfloat16)
        qzeros = rng.integers(0, 2 ** 32, size=(n // 8, k // g), dtype=np.uint32).view(np.int32)
        return pyquant.Int4Weight(qweight, scales, qzeros, g)
    fmt = fam.split(":")[1]
    return pyquant.from_gguf(fmt, F.get(fmt).module.random_blocks(rng, n, k, d_range=(1e-3, 1e-2)), shape=(n, k))


def main(argv):
    fam, n, k, m = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    calls = int(argv[4]) if len(argv) > 4 else 5
    rng = np.random.default_rng(0)
    ctx = pyquant.default_context()
    wd = make_weight(fam, n, k, rng).to_device(ctx)
    x = pyquant.DeviceArray.from_numpy(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16), ctx)
    y = pyquant.DeviceArray.empty((m, n), ml_dtypes.bfloat16, ctx)
    for _ in range(calls):
        pyquant.gemm(x, wd, out=y, ctx=ctx)
    ctx.synchronize()
    print("ok", fam, n, k, m, float(np.abs(y.to_numpy().astype(np.float32)).mean()))


if __name__ == "__main__":
    main(sys.argv[1:])
