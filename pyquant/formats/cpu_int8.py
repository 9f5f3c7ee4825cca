"""Numpy model of the CPU tier's int8 path (src/cpu/int8_kernels.h), bit for bit.

    y[m, n] = sum_k x[m, k] * W[n, k],   W = the dequantized weight of any format

1. decompose(fmt, weight): every weight as W[n, k] = sw[n, b] * w[n, k] (- mw[n, b] for
   q4_K), b = k // 32, with integer codes w and float32 scales, bit for bit the factors
   of the format's dequantize (the q6_K sub-block scales stay integers: sub[n, k // 16]).
2. quantize_x(x): activation codes q and scales dx per 32 elements of each row, as
   int8_act.quantize_x computes them (the same quantizer as the GPU tier), with the sums S
   of each block's codes and dS = float32(dx * S).
3. gemm(x, fmt, weight): the library's float32 result, as the kernel computes it, for
   each output and each block b in K order, starting from acc = 0:
       D   = sum_{k in b} w[n, k] * q[m, k]        (q6_K: sum over halves h of sub * the half's sum)
       acc = acc + float32(D) * float32(sw[n, b] * dx[m, b])
       acc = acc - float32(mw[n, b] * dS[m, b])      (q4_K)
   every product and sum rounded to float32 (no fused multiply-add), then the bias
   (MXFP4) added in float32. Outputs whose row of x holds NaN or inf, or whose weight row
   has a non-finite scale (or an MXFP4 scale byte >= 253, whose float decode overflows),
   come from the fp32-exact path instead: `fallback` marks them.
4. error_bound(...): how far gemm may lie from the exact product x @ W^T.

Only numpy (and ml_dtypes for bfloat16 x): no library.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import gguf_common as gc
from . import int4 as int4_fmt
from . import int8_act
from . import mxfp4 as mxfp4_fmt
from . import q6_k

__all__ = ["Int8Weight", "decompose", "quantize_x", "gemm", "error_bound", "BLOCK", "U32"]

BLOCK = 32             # elements of K per scale (weights and activations)
U32 = 2.0 ** -24       # float32 unit roundoff
MXFP4_E_OVERFLOW = 253  # scale bytes from here on decode 8 * 2^(e - 128) to inf in float32
# ggml's doubled E2M1 table (values times two, the scale halved): code -> int8
KVALUES_MXFP4_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int32)


@dataclass(frozen=True)
class Int8Weight:
    """W[n, k] = sw[n, k // 32] * w[n, k] - mw[n, k // 32] (float32 steps, as dequantize).

    w       int32 [N, K]        the signed codes the kernels multiply (|w| <= 128)
    sw      float32 [N, K/32]   scale of each 32-element block
    mw      float32 [N, K/32]   q4_K's min term dmin * m, else None
    sub     int32 [N, K/16]     q6_K's int8 sub-block scales (W = sw * (sub * w)), else None
    finite  bool [N]            False where the kernel hands the row to the fp32-exact path
    """
    w: np.ndarray
    sw: np.ndarray
    mw: np.ndarray | None
    sub: np.ndarray | None
    finite: np.ndarray


def _finite_rows(*scales) -> np.ndarray:
    ok = np.ones(scales[0].shape[0], dtype=bool)
    for s in scales:
        if s is not None:
            ok &= np.isfinite(s).all(axis=1)
    return ok


def _gguf(fmt: str, raw) -> Int8Weight:
    dec = int8_act.decompose(fmt, raw)
    w = dec.codes - dec.bias
    if fmt == q6_k.NAME:   # sw = d per 32 elements; the int8 sub-block scales stay integers
        blocks = gc.check_raw(raw, q6_k.BLOCK_BYTES, fmt)
        n = blocks.shape[0]
        d = np.repeat(gc.f16_field(blocks, q6_k._D), gc.QK_K // BLOCK, axis=1).reshape(n, -1)
        sub = blocks[..., q6_k._SC:q6_k._D].view(np.int8).astype(np.int32).reshape(n, -1)
        return Int8Weight(w, d, None, sub, _finite_rows(d))
    return Int8Weight(w, dec.sw, dec.mw, None, _finite_rows(dec.sw, dec.mw))


def _int4(qweight, scales, qzeros, group_size) -> Int8Weight:
    n, k, g = int4_fmt._check_canonical(qweight, scales, qzeros, group_size)
    q = int4_fmt.unpack_k(qweight).astype(np.int32)
    z = int4_fmt._zeros_or_symmetric(qzeros, n, k // g).astype(np.int32)
    sw = np.repeat(np.asarray(scales).astype(np.float32), g // BLOCK, axis=1)
    return Int8Weight(q - np.repeat(z, g, axis=1), sw, None, None, _finite_rows(sw))


def _mxfp4(blocks, scales) -> Int8Weight:
    blocks, scales = mxfp4_fmt._check_blocks_scales(blocks, scales)
    if blocks.ndim != 3:
        raise ValueError(f"cpu_int8: MXFP4 blocks must be [N, K/32, 16], got shape {blocks.shape}")
    n = blocks.shape[0]
    w = KVALUES_MXFP4_X2[mxfp4_fmt.decode_codes(blocks)].reshape(n, -1)
    e = scales.astype(np.int32)
    # 2^(e - 128) in float32 (e8m0_half): subnormal for e < 2, NaN for e = 255
    with np.errstate(over="ignore"):
        sw = np.ldexp(np.float32(1), e - 128).astype(np.float32)
    sw = np.where(e == mxfp4_fmt.E8M0_NAN, np.float32(np.nan), sw).astype(np.float32)
    return Int8Weight(w, sw, None, None, (e < MXFP4_E_OVERFLOW).all(axis=1))


def decompose(fmt: str, *weight, group_size: int | None = None) -> Int8Weight:
    """The int8 codes and scales of a weight, as the kernels see it:
        GGUF formats: decompose(fmt, raw)                    raw uint8 [N, nb * block_bytes]
        int4:         decompose("int4", qweight, scales, qzeros, group_size=G)
        mxfp4:        decompose("mxfp4", blocks, scales)     blocks [N, K/32, 16], scales [N, K/32]
    """
    if fmt == "int4":
        return _int4(*weight, group_size)
    if fmt == "mxfp4":
        return _mxfp4(*weight)
    return _gguf(fmt, *weight)


def dequantize(dec: Int8Weight) -> np.ndarray:
    """float32 [N, K] from the decomposition, in the format's float32 steps: q6_K as
    (d * sc) * w, q4_K as (d * sc) * q - dmin * m (its subtraction is the one rounding; the
    products are exact), the others sw * w."""
    s = np.repeat(dec.sw, BLOCK, axis=1)
    if dec.sub is not None:
        s = s * np.repeat(dec.sub, 16, axis=1).astype(np.float32)
    out = s * dec.w.astype(np.float32)
    if dec.mw is not None:
        out = out - np.repeat(dec.mw, BLOCK, axis=1)
    return out.astype(np.float32)


@dataclass(frozen=True)
class Q8X:
    """Quantized activations: q int8 [M, K], dx, dS float32 [M, K/32], S int64 [M, K/32],
    finite bool [M] (rows with NaN or inf take the fp32-exact path)."""
    q: np.ndarray
    dx: np.ndarray
    dS: np.ndarray
    S: np.ndarray
    finite: np.ndarray


def quantize_x(x) -> Q8X:
    """x [M, K] float32 / float16 / bfloat16 -> Q8X (src/cpu/q8_act.h)."""
    q, dx, _ = int8_act.quantize_x(x)
    m, k = q.shape
    finite = np.isfinite(np.asarray(x).astype(np.float32)).all(axis=1)
    S = q.astype(np.int64).reshape(m, k // BLOCK, BLOCK).sum(axis=-1)
    with np.errstate(invalid="ignore"):
        dS = (dx * S.astype(np.float32)).astype(np.float32)
    return Q8X(q, dx, dS, S, finite)


def _block_dots(qx: Q8X, dec: Int8Weight, b: int) -> np.ndarray:
    """D [M, N] of block b: exact (float64 holds every partial sum exactly, |D| < 2^25)."""
    cols = slice(b * BLOCK, (b + 1) * BLOCK)
    xq = qx.q[:, cols].astype(np.float64)
    w = dec.w[:, cols].astype(np.float64)
    if dec.sub is None:
        return xq @ w.T
    lo, hi = slice(0, 16), slice(16, 32)
    return (xq[:, lo] @ w[:, lo].T) * dec.sub[:, 2 * b] + (xq[:, hi] @ w[:, hi].T) * dec.sub[:, 2 * b + 1]


def gemm(x, fmt: str, *weight, group_size: int | None = None, bias=None):
    """The int8 path's float32 y [M, N] and fallback bool [M, N] (True: the library gives
    the fp32-exact path's value there; y holds garbage at those places)."""
    qx = quantize_x(x)
    dec = decompose(fmt, *weight, group_size=group_size)
    m, k = qx.q.shape
    n = dec.w.shape[0]
    if dec.w.shape[1] != k:
        raise ValueError(f"cpu_int8: x has k={k} but the weight has k={dec.w.shape[1]}")
    acc = np.zeros((m, n), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(k // BLOCK):
            s = dec.sw[:, b][None, :] * qx.dx[:, b][:, None]
            acc = acc + _block_dots(qx, dec, b).astype(np.float32) * s
            if dec.mw is not None:
                acc = acc - dec.mw[:, b][None, :] * qx.dS[:, b][:, None]
        if bias is not None:
            acc = acc + np.asarray(bias).astype(np.float32)[None, :]
    fallback = ~qx.finite[:, None] | ~dec.finite[None, :]
    return acc, fallback


def error_bound(x, fmt: str, *weight, group_size: int | None = None) -> np.ndarray:
    """Bound on |gemm(x, ...) - x @ W^T| (exact product, W = the format's dequantize),
    float64 [M, N], where gemm does not fall back:

        sum_k |W*[n, k]| * |x[m, k] - dx * q[m, k]|      activation quantization
      + sum_k |W*[n, k] - W[n, k]| * |x[m, k]|           q4_K's rounded W (zero elsewhere)
      + gamma(2 nb + 2) * sum_b (|sw dx D| + |mw dS|)    the float32 steps of gemm

    W* = sw * w - mw in exact arithmetic; gemm's exact value is sum_k W*[n, k] * dx * q[m, k]
    (S sums the same codes), so the first two sums bound that against x @ W^T. Each block
    adds one or two terms, each the float32 product of exact factors rounded twice (dx*S
    once more), and the sum of nb (2 nb) terms is within gamma(terms) of exact: Higham,
    Accuracy and Stability, (3.5) and Lemma 3.1, gamma(n) = n u / (1 - n u).
    """
    qx = quantize_x(x)
    dec = decompose(fmt, *weight, group_size=group_size)
    v = np.asarray(x).astype(np.float64)
    m, k = v.shape
    nb = k // BLOCK
    dxk = np.repeat(qx.dx.astype(np.float64), BLOCK, axis=1)
    w = dec.w if dec.sub is None else dec.w * np.repeat(dec.sub, 16, axis=1)
    ws = np.repeat(dec.sw.astype(np.float64), BLOCK, axis=1) * w
    if dec.mw is not None:
        ws = ws - np.repeat(dec.mw.astype(np.float64), BLOCK, axis=1)
    w_deq = dequantize(dec).astype(np.float64)
    bound = np.abs(v - dxk * qx.q) @ np.abs(ws).T + np.abs(v) @ np.abs(ws - w_deq).T
    mag = np.zeros((m, dec.w.shape[0]))
    for b in range(nb):
        mag += np.abs(_block_dots(qx, dec, b) * qx.dx[:, b, None].astype(np.float64) * dec.sw[None, :, b])
        if dec.mw is not None:
            mag += np.abs(qx.dS[:, b, None].astype(np.float64) * dec.mw[None, :, b])
    terms = 2 * nb + 2
    return bound + terms * U32 / (1 - terms * U32) * mag
