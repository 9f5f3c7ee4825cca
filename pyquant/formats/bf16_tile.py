"""The error model of a GPU tier that rounds each dequantized weight to bf16 before the
matrix instruction: the GGUF prefill tier (gguf_tier 3, hip/gguf_prefill.hip) and the W4A16
prefill tier with bf16 x and bf16 scales (the scale folded into A, hip/prefill_wgmma.h;
its weights are pyquant.formats.int4.dequantize_folded).

The tier decodes every weight in float32 exactly as the reference does (the `gguf` package's
operations in the same order, no fused multiply-add; for W4A16 the exact float32 product
(q - z) * s), rounds it once to bf16 (round to nearest even: relative error <= 2^-8, half an
ulp of bf16's 8-bit significand), multiplies it with the bf16 activation exactly (8 x 8
significant bits fit float32's 24) and sums in the tensor cores' float32. So, against the
exact product of the reference weights w (float32, `<format>.dequantize`) and x (bf16, exact):

    |y - x @ w^T| <= (2^-8 + (k + 32) * 2^-22) * (|x| @ |w|^T) + u_y * (|x @ w^T| + |x| @ |w|^T)

2^-22 per addition is one unit of float32 truncation (the tensor cores' adder need not
round to nearest), k + 32 covers the k products' sums and the block's partial sums (split-K
partial sums and their reduction too: at most 16 splits), and u_y rounds the stored y.
Against the weights the tier really multiplies (the bf16-rounded ones, `accumulation_bound`)
the 2^-8 term goes: what is left is the float32 sums and y's rounding. The bounds are
rigorous, not statistical: they hold for any seed (bf16 subnormal weights aside, whose
rounding error is absolute: no test weight comes near 2^-126).
"""
from __future__ import annotations

import numpy as np

from . import reference

U_BF16 = 2.0 ** -8      # bf16 unit roundoff (8-bit significand, round to nearest even)
U_ADD = 2.0 ** -22      # one float32 addition in the tensor cores, truncating


def _magnitudes(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return reference.gemm(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)))


def accumulation_bound(x: np.ndarray, w: np.ndarray, y_unit_roundoff: float, terms: np.ndarray | None = None) -> np.ndarray:
    """Elementwise bound [M, N] on |y - x @ w^T| for a tier whose weights ARE w (x [M, K],
    w [N, K] already in bf16): exact products, k float32 sums, one rounding of y.

    terms [N, K] (>= |w|): where the tier sums parts of each weight separately (the frag
    decode of q4_K: (d sc) * sum(q x) - (dmin m) * sum(x), gguf_frag.decode_magnitudes), the
    float32 sums scale with |x| @ terms^T, not with |x| @ |w|^T."""
    k = np.asarray(x).shape[1]
    mag = _magnitudes(x, w if terms is None else terms)
    ref = np.abs(reference.gemm(x, w))
    return (k + 32) * U_ADD * mag + y_unit_roundoff * (ref + mag)


def error_bound(x: np.ndarray, w: np.ndarray, y_unit_roundoff: float) -> np.ndarray:
    """Elementwise bound [M, N] on |y - x @ w^T| for x [M, K] and reference weights w [N, K]
    that the tier rounds to bf16 first."""
    return U_BF16 * _magnitudes(x, w) + accumulation_bound(x, w, y_unit_roundoff)
