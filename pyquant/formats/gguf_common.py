"""Helpers shared by the GGUF block formats (q8_0.py ... iq3_xxs.py).

Argument checks that name the failed condition, fp16 fields read and written as their
little-endian bit patterns (blocks are byte-exact copies of what a .gguf file stores),
the rounding ggml uses, and random fp16 scale fields for random_blocks.
Only numpy: pyquant must not need the `gguf` package or the C source tree at runtime.
"""
from __future__ import annotations

import numpy as np

QK_K = 256  # super-block of the K-quants and i-quants (elements)

_F16_EXP_MASK = 0x7C00  # fp16 exponent field; all ones = inf or nan


def check_weight(W, block_elems: int, fmt: str) -> np.ndarray:
    """W as a C-contiguous float32 [N, K] array, K a multiple of block_elems."""
    W = np.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"{fmt}.quantize: W must be 2-D [N, K], got shape {W.shape}")
    if not (np.issubdtype(W.dtype, np.floating) or np.issubdtype(W.dtype, np.integer)):
        raise ValueError(f"{fmt}.quantize: W must be a real array, got dtype {W.dtype}")
    n, k = W.shape
    if k == 0 or k % block_elems != 0:
        raise ValueError(f"{fmt}.quantize: k={k} is not a positive multiple of the block size {block_elems}")
    W = np.ascontiguousarray(W, dtype=np.float32)
    if not np.isfinite(W).all():
        raise ValueError(f"{fmt}.quantize: W holds non-finite values (inf or nan)")
    return W


def check_raw(raw, block_bytes: int, fmt: str) -> np.ndarray:
    """raw as a C-contiguous uint8 [N, nb, block_bytes] view of the block bytes."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise ValueError(f"{fmt}.dequantize: raw must be uint8 block bytes, got dtype {raw.dtype}")
    if raw.ndim != 2:
        raise ValueError(f"{fmt}.dequantize: raw must be 2-D [N, nb*{block_bytes}], got shape {raw.shape}")
    n, width = raw.shape
    if width == 0 or width % block_bytes != 0:
        raise ValueError(f"{fmt}.dequantize: row width {width} bytes is not a positive multiple of "
                         f"the block size {block_bytes} bytes")
    return np.ascontiguousarray(raw).reshape(n, width // block_bytes, block_bytes)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """fp16 field at byte `offset` of every block, widened to float32 (exact).

    blocks: [..., block_bytes] uint8 -> [...] float32.
    """
    return np.ascontiguousarray(blocks[..., offset:offset + 2]).view("<f2")[..., 0].astype(np.float32)


def to_f16(x: np.ndarray, fmt: str, what: str) -> np.ndarray:
    """float32 -> fp16 (round to nearest even, as ggml's GGML_FP32_TO_FP16); raises if it overflows."""
    with np.errstate(over="ignore"):  # overflow is reported below, by name
        h = np.asarray(x, dtype=np.float32).astype(np.float16)
    if not np.isfinite(h).all():
        raise ValueError(f"{fmt}.quantize: the {what} scale overflows fp16 (|W| too large for this format)")
    return h


def f16_bytes(h: np.ndarray) -> np.ndarray:
    """fp16 array [...] -> its little-endian bytes [..., 2] uint8."""
    return np.ascontiguousarray(h.astype("<f2")).view(np.uint8).reshape(*h.shape, 2)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """roundf(): nearest integer, halves away from zero (ggml's nearest rounding).

    Not trunc(x + 0.5): for x = 0.5 - 2^-25 the float32 sum rounds up to 1.0. Here
    a - floor(a) is exact, so the half-way test is exact too.
    """
    a = np.abs(x)
    r = np.floor(a)
    r += (a - r) >= np.float32(0.5)
    return np.copysign(r, x)


def random_f16_bits(rng: np.random.Generator, shape, d_range=None) -> np.ndarray:
    """Random finite fp16 values as uint16 bit patterns.

    d_range=None: every finite bit pattern (both signs, zeros, subnormals, up to 65504),
    uniformly; patterns with the all-ones exponent (inf/nan) are moved to exponent 15,
    so every bit still takes both values. d_range=(lo, hi): magnitudes uniform in
    [lo, hi) with a random sign, for callers that need realistic scales (GEMM tests).
    """
    if d_range is None:
        bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
        inf_nan = (bits & _F16_EXP_MASK) == _F16_EXP_MASK
        return np.where(inf_nan, bits ^ np.uint16(0x4000), bits).astype(np.uint16)
    lo, hi = d_range
    mag = rng.uniform(lo, hi, size=shape)
    sign = rng.choice(np.array([-1.0, 1.0]), size=shape)
    h = (sign * mag).astype(np.float16)
    if not np.isfinite(h).all():
        raise ValueError(f"random_blocks: d_range={d_range} exceeds the fp16 range")
    return h.view(np.uint16)


def put_f16_bits(blocks: np.ndarray, offset: int, bits: np.ndarray) -> None:
    """Write uint16 bit patterns little-endian at byte `offset` of every block (in place)."""
    blocks[..., offset] = (bits & 0xFF).astype(np.uint8)
    blocks[..., offset + 1] = (bits >> 8).astype(np.uint8)


def random_bytes(rng: np.random.Generator, n: int, k: int, block_elems: int, block_bytes: int,
                 fmt: str) -> np.ndarray:
    """Uniform random bytes shaped [n, k // block_elems, block_bytes] (fields patched by callers)."""
    if n < 0 or k <= 0 or k % block_elems != 0:
        raise ValueError(f"{fmt}.random_blocks: k={k} is not a positive multiple of the block size "
                         f"{block_elems} (n={n})")
    return rng.integers(0, 256, size=(n, k // block_elems, block_bytes), dtype=np.uint8)


def nearest_sorted(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of the ascending table `values` for every x (ties -> lower)."""
    mid = (values[1:].astype(np.float32) + values[:-1].astype(np.float32)) * np.float32(0.5)
    return np.searchsorted(mid, x, side="right").astype(np.uint8)


def ls_scale(x: np.ndarray, q: np.ndarray, axis=-1):
    """Least-squares scale s = <x, q> / <q, q> along `axis`, and the squared error left.

    Returns (s, err) with err = ||x||^2 - <x, q>^2 / <q, q> (0 where q is all zero, s = 0).
    """
    xq = np.sum(x * q, axis=axis)
    qq = np.sum(q * q, axis=axis)
    xx = np.sum(x * x, axis=axis)
    safe = qq > 0
    s = np.where(safe, xq / np.where(safe, qq, 1), 0).astype(np.float32)
    err = np.where(safe, xx - xq * xq / np.where(safe, qq, 1), xx)
    return s, err


def normalised_subblocks(W, block_elems: int, name: str, sub: int):
    """Setup of a per-sub-block scale search: W [N, K] checked and viewed as
    x [N, K/block_elems, block_elems/sub, sub]; the search runs on each super-block divided
    by its largest |x| (no float32 overflow in the squared errors of huge weights, no
    underflow for tiny ones). Returns (x, norm, xn, vmax): norm [N, nb, 1, 1] (1 for an
    all-zero super-block), xn = x / norm, vmax [N, nb, subs, 1] the signed element of
    largest magnitude of each normalised sub-block."""
    W = check_weight(W, block_elems, name)
    n, k = W.shape
    x = W.reshape(n, k // block_elems, block_elems // sub, sub)
    norm = np.abs(x).max(axis=(-2, -1), keepdims=True)
    norm = np.where(norm > 0, norm, np.float32(1))
    xn = x / norm
    imax = np.abs(xn).argmax(axis=-1)[..., None]
    return x, norm, xn, np.take_along_axis(xn, imax, axis=-1)


def search_subblock_scales(xn, vmax, candidates, codes):
    """Least-squares scale search per sub-block of xn [..., subs, sub]: for each candidate c
    the elements are coded as codes(xn * c / vmax) (code values, same shape), the scale is
    refit by least squares, and the lowest squared error wins. Returns the scales [..., subs]."""
    best_err = np.full(vmax.shape[:-1], np.inf, dtype=np.float32)
    best_s = np.zeros(vmax.shape[:-1], dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in candidates:
            inv = np.where(vmax != 0, c / vmax, 0).astype(np.float32)
            s, err = ls_scale(xn, codes(xn * inv))
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s, best_s)
    return best_s


def superblock_scale(best_s, norm, stored_max: float, name: str):
    """Sub-block scales back to the weights' size (best_s * norm) and the fp16 super-block
    scale d that stores the largest-magnitude one as `stored_max` (e.g. -32, -128).
    Returns (scales [N, nb, subs], d16 [N, nb] float16)."""
    best_s = best_s * norm[..., 0]
    jmax = np.abs(best_s).argmax(axis=-1)[..., None]
    smax = np.take_along_axis(best_s, jmax, axis=-1)[..., 0]
    return best_s, to_f16(smax / np.float32(stored_max), name, "d")

