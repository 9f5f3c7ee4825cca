"""One GEMM on one forced tier, checked against the numpy reference: the smallest run that
tells whether a GPU tier works (a fault poisons the process's context, so bench/gpu_smoke.sh
runs each case in a process of its own, under compute-sanitizer when it fails).

    python3 bench/gpu_tier_smoke.py TIER LAYOUT M N K G {asym|sym} {bf16|fp16}
    e.g. python3 bench/gpu_tier_smoke.py cuda:decode_frag frag 5 264 512 128 asym bf16

Prints one line "ok|FAIL tier ... err=<normwise error> bound=<bound>" and exits 0 / 1.
"""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

import pyquant
from pyquant.formats import reference


def main(argv: list[str]) -> int:
    tier, layout, m, n, k, g, sym, dt = argv
    m, n, k, g = int(m), int(n), int(k), int(g)
    x_dt = np.dtype(ml_dtypes.bfloat16) if dt == "bf16" else np.dtype(np.float16)
    rng = np.random.default_rng(1)
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = (rng.uniform(0.5, 2.0, size=(n, k // g)) * 2.0 ** -4).astype(np.float32).astype(x_dt)
    qzeros = None if sym == "sym" else rng.integers(0, 2 ** 32, size=(n // 8, k // g), dtype=np.uint32).view(np.int32)
    w = pyquant.Int4Weight(qweight, scales, qzeros, g)
    ctx = pyquant.gpu_context()
    wd = w.to_device(ctx, layout=layout)
    x = rng.standard_normal((m, k)).astype(np.float32).astype(x_dt)
    xd = pyquant.DeviceArray.from_numpy(x, ctx)
    ctx.set_tier("w4a16", tier)
    y = pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy()
    ref = reference.gemm(x, w.dequantize())
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    bound = 2.0 ** -24 + 4 * k * 2.0 ** -24
    ok = bool(np.isfinite(y).all()) and err <= bound
    print(f"{'ok  ' if ok else 'FAIL'} {tier} {layout} m={m} n={n} k={k} g={g} {sym} {dt}: err={err:.3g} bound={bound:.3g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
