"""Runs the C example gguf_gemm on a tensor of a .gguf file and compares its y with
pyquant's float64 reference of the same product (the x pattern is gguf_gemm.c's).

    python examples/c/check_gguf_gemm.py ./gguf_gemm FILE.gguf TENSOR [M]

Exit status 0 when ||y - ref|| / ||ref|| is within the bound, 1 otherwise.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np

import pyquant
from pyquant.formats import reference


def x_pattern(m: int, k: int) -> np.ndarray:
    """gguf_gemm.c's x[i][k] = ((i*131 + k*31) % 17 - 8) / 8 (exact in fp32)."""
    i, c = np.meshgrid(np.arange(m), np.arange(k), indexing="ij")
    return (((i * 131 + c * 31) % 17 - 8) / 8.0).astype(np.float32)


def run(binary: str, path: str, tensor: str, m: int = 2) -> tuple[float, float, str]:
    """(error, bound, backend line) of one gguf_gemm run."""
    out = subprocess.run([binary, path, tensor, str(m)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} exited {out.returncode}: {out.stderr.strip()}")
    head, *rows = out.stdout.strip().splitlines()
    y = np.array([[float(v) for v in row.split()] for row in rows])
    w = pyquant.load_gguf(path)[tensor]
    ref = reference.gemm(x_pattern(m, w.shape[1]), w.dequantize())
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    # fp32 x and y: decoded weights are exact in fp32, so the error is fp32 accumulation
    # over K terms (about K * 2^-24 normwise, x4) plus the 9 printed digits; the GPU's
    # int8 tier and the CPU tier's default precision (cpu_precision auto) quantize x per
    # 32 elements (x here is eighths in [-1, 1]: exact in int8 only up to the block
    # scale's rounding, about 2^-8). A wrong layout is of order 1.
    k = w.shape[1]
    bound = 4 * k * 2.0 ** -24 + 1e-8 + 4 * 2.0 ** -8
    return err, bound, head


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    err, bound, head = run(argv[0], argv[1], argv[2], int(argv[3]) if len(argv) == 4 else 2)
    print(f"{head.lstrip('# ')}: ||y - ref|| / ||ref|| = {err:.2e} (bound {bound:.1e})")
    return 0 if err <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
