"""int4 group quantization (W4A16): the numpy reference for the canonical layout.

Canonical layout (include/quantgemm.h, DESIGN.md "Weight formats"); row n = output feature,
k = input feature, G = group size in {32, 64, 128}:

    qweight [N, K/8]  int32  nibble i (bits 4i..4i+3) of word j of row n holds q[n, 8j + i],
                             unsigned 0..15
    scales  [N, K/G]  float16 or ml_dtypes.bfloat16
    qzeros  [N/8, K/G] int32 packed along N: z[n, g] sits in word n // 8 of column g at
                             bits 4 * (n % 8); None for symmetric weights (z = 8)

    w[n, k] = float32(q[n, k] - z[n, k // G]) * float32(s[n, k // G])

Worked example of the qweight nibble order (one word, row n, word j):
    bits   31..28 27..24 23..20 19..16 15..12 11..8  7..4   3..0
    k      8j+7   8j+6   8j+5   8j+4   8j+3   8j+2   8j+1   8j+0

Checkpoint conventions converted by the importers (each checked against the packer of the
project that writes the checkpoint; facts only, the code here is ours):

  AWQ (AutoAWQ, awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear):
      qweight [K, N/8], qzeros [K/G, N/8] packed along N; nibble slot i of word j holds
      column 8j + AWQ_ORDER[i] with AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7); zero points are
      stored as they are; scales [K/G, N] fp16.
  GPTQ v1 (AutoGPTQ, auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, QuantLinear.pack):
      qweight [K/8, N] packed along K with sequential nibbles (word r of column n holds
      k = 8r + i at bits 4i); qzeros [K/G, N/8] packed along N with sequential nibbles and
      the zero point stored minus one (readers add one back); scales [K/G, N];
      g_idx [K] maps k to its group (act-order checkpoints permute it).
  compressed-tensors pack-quantized (compressed-tensors,
      src/compressed_tensors/compressors/quantized_compressors/pack_quantized.py,
      pack_to_int32): weight_packed [N, K/8] packed along K with sequential nibbles, each
      value stored as signed + 8; weight_scale [N, K/G]; weight_zero_point (asymmetric)
      [N/8, K/G] packed along N (packed_dim=0), also signed + 8. Dequantization there is
      (q_signed - zp_signed) * s, which equals (q_unsigned - zp_unsigned) * s, so the
      stored nibbles ARE the canonical nibbles. Older checkpoints keep the zero point
      unpacked as int8 [N, K/G] (signed); that form is accepted too.

Zero points stay 4-bit end to end: every importer returns them packed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "GROUP_SIZES",
    "AWQ_ORDER",
    "quantize",
    "dequantize",
    "dequantize_folded",
    "prefill_folds",
    "pack_k",
    "unpack_k",
    "pack_zeros",
    "unpack_zeros",
    "from_awq",
    "from_gptq",
    "from_compressed_tensors",
    "to_awq",
    "to_gptq",
    "to_compressed_tensors",
]

GROUP_SIZES = (32, 64, 128)
PACK = 8  # 4-bit values per int32 word
SYMMETRIC_ZERO = 8  # z used when qzeros is None
# AutoAWQ's order_map: nibble slot i of a word holds column 8j + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)

_SCALE_DTYPES = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "f16": np.dtype(np.float16),
    "float16": np.dtype(np.float16),
}
_SHIFTS = np.arange(PACK, dtype=np.uint32) * np.uint32(4)


# ---------------------------------------------------------------- validation helpers


def _check_group_size(group_size) -> int:
    if not isinstance(group_size, (int, np.integer)) or int(group_size) not in GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r} is not one of {GROUP_SIZES}")
    return int(group_size)


def _check_k(k: int, group_size: int) -> None:
    if k <= 0:
        raise ValueError(f"k={k} must be positive")
    if k % group_size != 0:
        raise ValueError(f"k={k} is not a multiple of group_size={group_size}")


def _check_n(n: int) -> None:
    if n <= 0:
        raise ValueError(f"n={n} must be positive")
    if n % PACK != 0:
        raise ValueError(f"n={n} is not a multiple of 8 (one packed int32 word of zero points)")


def _check_array(name: str, a, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a


def _check_packed(name: str, a, ndim: int = 2) -> np.ndarray:
    a = _check_array(name, a, ndim)
    if a.dtype not in (np.int32, np.uint32):
        raise ValueError(f"{name} must be int32 (8 packed 4-bit values per word), got {a.dtype}")
    return a


def _check_shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {tuple(shape)}")


def _check_scales(name: str, s) -> np.ndarray:
    s = _check_array(name, s, 2)
    if s.dtype not in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise ValueError(f"{name} must be float16 or bfloat16, got {s.dtype}")
    return s


def _scale_dtype(scale_dtype) -> np.dtype:
    if isinstance(scale_dtype, str):
        if scale_dtype.lower() not in _SCALE_DTYPES:
            raise ValueError(f"scale_dtype={scale_dtype!r} is not one of 'bf16', 'fp16'")
        return _SCALE_DTYPES[scale_dtype.lower()]
    dt = np.dtype(scale_dtype)
    if dt not in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise ValueError(f"scale_dtype={dt} is not float16 or bfloat16")
    return dt


def _infer_group_size(k: int, groups: int, group_size, what: str) -> int:
    """Group size from the scale shape, cross-checked against the one given (if any)."""
    if groups <= 0 or k % groups != 0:
        raise ValueError(f"{what}: k={k} is not a multiple of the {groups} scale groups")
    inferred = k // groups
    if group_size is None:
        return _check_group_size(inferred)
    g = _check_group_size(group_size)
    _check_k(k, g)
    if g != inferred:
        raise ValueError(
            f"{what}: group_size={g} does not match the scales, which hold {groups} groups "
            f"for k={k} (group_size={inferred})"
        )
    return g


# ---------------------------------------------------------------- nibble packing


def _pack_last(v: np.ndarray, order=None) -> np.ndarray:
    """Pack 8 consecutive entries of the last axis into one int32 word.

    Entry 8j + order[i] goes to bits 4i of word j (order = identity by default)."""
    *lead, m = v.shape
    g = v.reshape(*lead, m // PACK, PACK).astype(np.uint32)
    if order is not None:
        g = g[..., list(order)]
    words = np.bitwise_or.reduce(g << _SHIFTS, axis=-1)
    return np.ascontiguousarray(words.astype(np.uint32)).view(np.int32)


def _unpack_last(words: np.ndarray, order=None) -> np.ndarray:
    """Inverse of _pack_last: int32 words [..., m] -> uint8 nibbles [..., 8m]."""
    w = np.ascontiguousarray(words).view(np.uint32)
    nib = ((w[..., None] >> _SHIFTS) & np.uint32(0xF)).astype(np.uint8)  # [..., m, slot]
    if order is not None:
        out = np.empty_like(nib)
        out[..., list(order)] = nib  # slot i holds entry order[i]
        nib = out
    return nib.reshape(*w.shape[:-1], w.shape[-1] * PACK)


def _check_nibbles(name: str, v) -> np.ndarray:
    if not isinstance(v, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(v).__name__}")
    if v.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got {v.dtype}")
    if v.size and (v.min() < 0 or v.max() > 15):
        raise ValueError(f"{name} holds values outside 0..15 (min {v.min()}, max {v.max()})")
    return v


def pack_k(q: np.ndarray) -> np.ndarray:
    """q uint8 [N, K] (values 0..15) -> qweight int32 [N, K/8], nibble i of word j = k 8j+i."""
    q = _check_nibbles("q", _check_array("q", q, 2))
    if q.shape[1] % PACK != 0:
        raise ValueError(f"k={q.shape[1]} is not a multiple of 8 (one packed int32 word)")
    return _pack_last(q)


def unpack_k(qweight: np.ndarray) -> np.ndarray:
    """qweight int32 [N, K/8] -> q uint8 [N, K]."""
    return _unpack_last(_check_packed("qweight", qweight))


def pack_zeros(z: np.ndarray) -> np.ndarray:
    """z uint8 [N, K/G] (values 0..15) -> qzeros int32 [N/8, K/G], row n -> word n//8, bits 4*(n%8)."""
    z = _check_nibbles("z", _check_array("z", z, 2))
    _check_n(z.shape[0])
    return np.ascontiguousarray(_pack_last(np.ascontiguousarray(z.T)).T)


def unpack_zeros(qzeros: np.ndarray) -> np.ndarray:
    """qzeros int32 [N/8, K/G] -> z uint8 [N, K/G]."""
    qzeros = _check_packed("qzeros", qzeros)
    return np.ascontiguousarray(_unpack_last(np.ascontiguousarray(qzeros.T)).T)


# ---------------------------------------------------------------- canonical validation


def _check_canonical(qweight, scales, qzeros, group_size):
    """Validate canonical arrays; returns (n, k, group_size)."""
    g = _check_group_size(group_size)
    qweight = _check_packed("qweight", qweight)
    scales = _check_scales("scales", scales)
    n, k = qweight.shape[0], qweight.shape[1] * PACK
    _check_n(n)
    _check_k(k, g)
    _check_shape("scales", scales, (n, k // g))
    if qzeros is not None:
        qzeros = _check_packed("qzeros", qzeros)
        _check_shape("qzeros", qzeros, (n // PACK, k // g))
    return n, k, g


def _zeros_or_symmetric(qzeros, n: int, groups: int) -> np.ndarray:
    if qzeros is None:
        return np.full((n, groups), SYMMETRIC_ZERO, dtype=np.uint8)
    return unpack_zeros(qzeros)


# ---------------------------------------------------------------- quantize / dequantize


def _round_up_to_dtype(s: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Smallest value of dtype dt (fp16 / bf16, positive) that is >= s (float64, > 0).

    Rounding the scale UP (never to nearest) keeps every value of the group inside the
    16-step grid, so no element is clipped and the error stays within half a step."""
    with np.errstate(over="ignore"):  # overflow to inf is reported by the caller
        r = s.astype(np.float32).astype(dt)
    low = r.astype(np.float64) < s
    if np.any(low):
        # fp16 and bf16 are sign-magnitude: for a positive value, bits + 1 is the next value up.
        bits = r.view(np.uint16).copy()
        bits[low] += np.uint16(1)
        r = bits.view(dt)
    return r


def quantize(W: np.ndarray, group_size: int = 128, symmetric: bool = False, scale_dtype="bf16"):
    """Round-to-nearest group quantization of W [N, K] into the canonical layout.

    Asymmetric: per group the range [min(w, 0), max(w, 0)] spans 15 steps:
        s = (hi - lo) / 15 rounded UP to scale_dtype, z = round(-lo / s) in 0..15.
    Symmetric (z = 8, q - z in -8..7):
        s = max(hi / 7, -lo / 8) rounded UP to scale_dtype.
    Then q = clip(round(w / s) + z, 0, 15) against the stored (rounded) scale, so
    dequantize() reproduces exactly what was quantized. Because the scale is rounded up
    and 0 lies in the range, w / s + z stays within [-0.5, 15.5]: every element satisfies
    |w - (q - z) * s| <= s / 2. A group of zeros gets s = 1.

    Returns (qweight int32 [N, K/8], scales [N, K/G] scale_dtype, qzeros int32 [N/8, K/G]
    or None when symmetric).
    """
    g = _check_group_size(group_size)
    dt = _scale_dtype(scale_dtype)
    W = _check_array("W", W, 2)
    if W.dtype.kind != "f" and W.dtype != np.dtype(ml_dtypes.bfloat16):
        raise ValueError(f"W must be a floating-point array, got {W.dtype}")
    n, k = W.shape
    _check_n(n)
    _check_k(k, g)
    w = W.astype(np.float64)
    if not np.all(np.isfinite(w)):
        raise ValueError("W holds non-finite values (inf or nan)")
    wg = w.reshape(n, k // g, g)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    lo = np.minimum(wg.min(axis=-1), 0.0)
    if symmetric:
        s = np.maximum(hi / 7.0, -lo / 8.0)
    else:
        s = (hi - lo) / 15.0
    s = np.where(s > 0, s, 1.0)
    s_q = _round_up_to_dtype(s, dt)
    if not np.all(np.isfinite(s_q.astype(np.float32))):
        raise ValueError(f"a group scale overflows {dt} (max |W| = {np.abs(w).max():g})")
    s64 = s_q.astype(np.float64)
    if symmetric:
        z = np.full((n, k // g), SYMMETRIC_ZERO, dtype=np.float64)
    else:
        z = np.clip(np.round(-lo / s64), 0, 15)
    q = np.clip(np.round(wg / s64[..., None]) + z[..., None], 0, 15).astype(np.uint8)
    qweight = pack_k(q.reshape(n, k))
    qzeros = None if symmetric else pack_zeros(z.astype(np.uint8))
    return qweight, s_q, qzeros


def dequantize(qweight: np.ndarray, scales: np.ndarray, qzeros, group_size: int) -> np.ndarray:
    """Canonical int4 -> float32 [N, K]: w = float32(q - z) * float32(s), z = 8 if qzeros is None."""
    n, k, g = _check_canonical(qweight, scales, qzeros, group_size)
    q = unpack_k(qweight).astype(np.int32)
    z = _zeros_or_symmetric(qzeros, n, k // g).astype(np.int32)
    z_full = np.repeat(z, g, axis=1)
    s_full = np.repeat(scales.astype(np.float32), g, axis=1)
    return (q - z_full).astype(np.float32) * s_full


# ---------------------------------------------------------------- the GPU prefill's weights (bf16 x)


def prefill_folds(x_dtype, scale_dtype) -> bool:
    """True where the GPU prefill tier folds the scale into its weights: bf16 x, with bf16 or
    fp16 scales (`prefill_folds` in hip/w4a16_kernels.h, which this mirrors; an fp16 scale is
    split exactly into two bf16 parts there, so both round each weight once). fp16 x keeps the
    exact float32 group scale of `dequantize`."""
    del scale_dtype  # either scale dtype folds
    return np.dtype(x_dtype) == np.dtype(ml_dtypes.bfloat16)


def dequantize_folded(qweight: np.ndarray, scales: np.ndarray, qzeros, group_size: int) -> np.ndarray:
    """The weights as the folded GPU prefill sees them (hip/prefill_wgmma.h, FOLD): each
    (q - z) * s rounded once to bf16, round to nearest even; float32 [N, K].

    |q - z| <= 15 has at most 4 significant bits and a bf16 (or fp16) scale at most 8 (11), so
    the float32 product of `dequantize` is exact and rounding it to bf16 is the one rounding
    of the kernel's bf16 multiply: the result is within half a bf16 ulp (2^-8 relative) of
    `dequantize`'s weight, and equal to it wherever (q - z) * s fits 8 significant bits (for
    example |q - z| in {0, 1, 2, 4, 8}). The kernel folds where x is bf16 (prefill_folds)."""
    with np.errstate(over="ignore"):  # a product past bf16's largest value is inf, as in the kernel
        return dequantize(qweight, scales, qzeros, group_size).astype(ml_dtypes.bfloat16).astype(np.float32)


# ---------------------------------------------------------------- AWQ


def from_awq(qweight, qzeros, scales, group_size=None):
    """AutoAWQ GEMM checkpoint -> canonical (qweight, scales, qzeros).

    qweight [K, N/8] and qzeros [K/G, N/8] int32 packed along N in AWQ_ORDER; scales [K/G, N].
    group_size is inferred from the scales when not given (and checked when given)."""
    qweight = _check_packed("awq qweight", qweight)
    qzeros = _check_packed("awq qzeros", qzeros)
    scales = _check_scales("awq scales", scales)
    k, n = qweight.shape[0], qweight.shape[1] * PACK
    _check_n(n)
    g = _infer_group_size(k, scales.shape[0], group_size, "awq")
    _check_shape("awq scales", scales, (k // g, n))
    _check_shape("awq qzeros", qzeros, (k // g, n // PACK))
    q_kn = _unpack_last(qweight, AWQ_ORDER)  # [K, N]
    z_gn = _unpack_last(qzeros, AWQ_ORDER)  # [K/G, N]
    return (
        pack_k(np.ascontiguousarray(q_kn.T)),
        np.ascontiguousarray(scales.T),
        pack_zeros(np.ascontiguousarray(z_gn.T)),
    )


def to_awq(qweight, scales, qzeros, group_size):
    """Canonical -> AutoAWQ GEMM (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]).

    Symmetric weights (qzeros None) are written with explicit zero points 8."""
    n, k, g = _check_canonical(qweight, scales, qzeros, group_size)
    q = unpack_k(qweight)  # [N, K]
    z = _zeros_or_symmetric(qzeros, n, k // g)  # [N, K/G]
    return (
        _pack_last(np.ascontiguousarray(q.T), AWQ_ORDER),
        _pack_last(np.ascontiguousarray(z.T), AWQ_ORDER),
        np.ascontiguousarray(scales.T),
    )


# ---------------------------------------------------------------- GPTQ


def _check_trivial_g_idx(g_idx, k: int, g: int, what: str) -> None:
    if g_idx is None:
        return
    g_idx = np.asarray(g_idx)
    if g_idx.shape != (k,):
        raise ValueError(f"{what} g_idx has shape {g_idx.shape}, expected ({k},)")
    expected = np.arange(k) // g
    bad = np.flatnonzero(g_idx != expected)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what} g_idx[{i}]={int(g_idx[i])} != {i} // group_size={g}: act-order "
            f"(desc_act) checkpoints permute the groups along K, which the canonical "
            f"layout (group = k // G) cannot express; act-order is not supported"
        )


def from_gptq(qweight, qzeros, scales, group_size=None, g_idx=None):
    """GPTQ (v1 format) checkpoint -> canonical (qweight, scales, qzeros).

    qweight [K/8, N] packed along K; qzeros [K/G, N/8] packed along N holding zero - 1;
    scales [K/G, N]; g_idx [K] accepted only when trivial (g_idx[k] == k // G)."""
    qweight = _check_packed("gptq qweight", qweight)
    qzeros = _check_packed("gptq qzeros", qzeros)
    scales = _check_scales("gptq scales", scales)
    k, n = qweight.shape[0] * PACK, qweight.shape[1]
    _check_n(n)
    g = _infer_group_size(k, scales.shape[0], group_size, "gptq")
    _check_shape("gptq scales", scales, (k // g, n))
    _check_shape("gptq qzeros", qzeros, (k // g, n // PACK))
    _check_trivial_g_idx(g_idx, k, g, "gptq")
    q_nk = _unpack_last(np.ascontiguousarray(qweight.T))  # [N, K]
    stored = _unpack_last(qzeros)  # [K/G, N], zero - 1
    if np.any(stored == 15):
        gi, ni = (int(v[0]) for v in np.nonzero(stored == 15))
        raise ValueError(
            f"gptq qzeros nibble at group {gi}, column {ni} is 15, i.e. zero point 16 after "
            f"GPTQ's +1, which does not fit in 4 bits (a v1 checkpoint whose zero point 0 "
            f"underflowed when stored as zero - 1)"
        )
    z_ng = np.ascontiguousarray((stored + 1).T)
    return pack_k(q_nk), np.ascontiguousarray(scales.T), pack_zeros(z_ng)


def to_gptq(qweight, scales, qzeros, group_size):
    """Canonical -> GPTQ v1 (qweight [K/8, N], qzeros [K/G, N/8] holding zero - 1, scales [K/G, N]).

    A zero point of 0 cannot be written (GPTQ readers would see 16) and raises ValueError."""
    n, k, g = _check_canonical(qweight, scales, qzeros, group_size)
    q = unpack_k(qweight)  # [N, K]
    z = _zeros_or_symmetric(qzeros, n, k // g)  # [N, K/G]
    if np.any(z == 0):
        ni, gi = (int(v[0]) for v in np.nonzero(z == 0))
        raise ValueError(
            f"zero point 0 at row {ni}, group {gi} cannot be stored in GPTQ v1 (it stores "
            f"zero - 1 in 4 bits)"
        )
    return (
        np.ascontiguousarray(_pack_last(q).T),  # [K/8, N]: word r of column n = k 8r..8r+7
        _pack_last(np.ascontiguousarray((z - 1).T)),
        np.ascontiguousarray(scales.T),
    )


# ---------------------------------------------------------------- compressed-tensors


def from_compressed_tensors(weight_packed, weight_scale, weight_zero_point=None, group_size=None,
                            g_idx=None):
    """compressed-tensors pack-quantized (4-bit, group strategy) -> canonical.

    weight_packed [N, K/8] int32; weight_scale [N, K/G]; weight_zero_point None (symmetric),
    packed int32 [N/8, K/G], or unpacked signed int8 [N, K/G] (older checkpoints).
    g_idx (weight_g_idx) is accepted only when trivial."""
    weight_packed = _check_packed("weight_packed", weight_packed)
    weight_scale = _check_scales("weight_scale", weight_scale)
    n, k = weight_packed.shape[0], weight_packed.shape[1] * PACK
    _check_n(n)
    g = _infer_group_size(k, weight_scale.shape[1], group_size, "compressed-tensors")
    _check_shape("weight_scale", weight_scale, (n, k // g))
    _check_trivial_g_idx(g_idx, k, g, "compressed-tensors")
    qweight = np.ascontiguousarray(weight_packed).view(np.int32).copy()
    if weight_zero_point is None:
        return qweight, weight_scale.copy(), None
    zp = _check_array("weight_zero_point", weight_zero_point, 2)
    if zp.dtype == np.int8:
        _check_shape("weight_zero_point", zp, (n, k // g))
        if zp.min() < -8 or zp.max() > 7:
            raise ValueError(
                f"weight_zero_point holds values outside -8..7 (min {zp.min()}, max {zp.max()})"
            )
        return qweight, weight_scale.copy(), pack_zeros((zp.astype(np.int16) + 8).astype(np.uint8))
    zp = _check_packed("weight_zero_point", zp)
    _check_shape("weight_zero_point", zp, (n // PACK, k // g))
    return qweight, weight_scale.copy(), np.ascontiguousarray(zp).view(np.int32).copy()


def to_compressed_tensors(qweight, scales, qzeros, group_size):
    """Canonical -> compressed-tensors pack-quantized (weight_packed, weight_scale,
    weight_zero_point packed [N/8, K/G] or None when symmetric). The nibbles are identical."""
    _check_canonical(qweight, scales, qzeros, group_size)
    zp = None if qzeros is None else np.ascontiguousarray(qzeros).view(np.int32).copy()
    return np.ascontiguousarray(qweight).view(np.int32).copy(), scales.copy(), zp
