"""The error model of a GPU tier that rounds each dequantized weight to bf16 before the
matrix instruction: the GGUF prefill tier (gguf_tier 3, hip/gguf_prefill.hip).

The tier decodes every weight in float32 exactly as the `gguf` package does (the same
operations in the same order, no fused multiply-add), rounds it once to bf16 (round to
nearest even: relative error <= 2^-9), multiplies it with the bf16 activation exactly and
sums in the tensor cores' float32. So, against the exact product of the reference weights
w (float32, `<format>.dequantize`) and x (bf16, exact):

    |y - x @ w^T| <= (2^-9 + (k + 32) * 2^-22) * (|x| @ |w|^T) + u_y * (|x @ w^T| + |x| @ |w|^T)

2^-22 per addition is one unit of float32 truncation (the tensor cores' adder need not
round to nearest), k + 32 covers the k products' sums and the block's partial sums, and
u_y rounds the stored y. The bound is rigorous, not statistical: it holds for any seed.
"""
from __future__ import annotations

import numpy as np

from . import reference

U_BF16 = 2.0 ** -9      # bf16 unit roundoff (8-bit significand, round to nearest even)
U_ADD = 2.0 ** -22      # one float32 addition in the tensor cores, truncating


def error_bound(x: np.ndarray, w: np.ndarray, y_unit_roundoff: float) -> np.ndarray:
    """Elementwise bound [M, N] on |y - x @ w^T| for x [M, K] and reference weights w [N, K]."""
    k = np.asarray(x).shape[1]
    mag = reference.gemm(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)))
    ref = np.abs(reference.gemm(x, w))
    return (U_BF16 + (k + 32) * U_ADD) * mag + y_unit_roundoff * (ref + mag)
