"""Numpy model of the int8-activation GGUF GEMM (hip/gguf_mma.hip): the weights' integer
codes against activations quantized to int8 per 32-element slice of K (ggml's q8_1 idea).

    y[m, n] = sum_k x[m, k] * W[n, k],   W = dequantize(raw) of a GGUF block format

1. decompose(fmt, raw): every weight as W[n, k] = sw[n, u] * (codes[n, k] - bias) - mw[n, j]
   (u = k // unit, j = k // 32; the mw term for q4_K only), bit for bit what the format
   module's dequantize computes in float32.
2. quantize_x(x): per row m and slice j, dx = amax / 127 and xq = rint(x / dx) as int8,
   with the float32 operations of the kernel's prep step.
3. gemm_model(x, fmt, raw): the kernel's sum, acc += sw * (dx * D) - mw * sum(x), with the
   integer unit dot products D exact and the rest in float64; exact_error_bound bounds how
   far that lies from the exact product x @ W^T (the activation quantization error).

Only numpy (and ml_dtypes for bfloat16 x): no library, no GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import gguf_common as gc
from . import iq3_xxs, iq4_xs, q4_0, q4_k, q6_k, q8_0
from .iq_tables import IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL

__all__ = ["Decomposition", "decompose", "quantize_x", "gemm_model", "exact_error_bound", "SLICE"]

SLICE = 32  # elements of K per activation scale dx (and per q4_K min)
X_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_CHUNK_ELEMS = 1 << 22  # float64 elements of the unit dot products D held at once (32 MiB)


@dataclass(frozen=True)
class Decomposition:
    """W[n, k] = sw[n, k // unit] * float32(codes[n, k] - bias) - mw[n, k // 32] in float32.

    codes  int32 [N, K]         the integer the kernel feeds to the int8 mma for each weight
    bias   int                  subtracted from codes (8 for q4_0, 32 for q6_K, else 0)
    unit   int                  elements per sw (16 for q6_K, else 32)
    sw     float32 [N, K/unit]  the per-unit scale as gguf computes it in float32
    mw     float32 [N, K/32]    q4_K's dmin * m; None for the other formats (no subtraction)
    """
    codes: np.ndarray
    bias: int
    unit: int
    sw: np.ndarray
    mw: np.ndarray | None


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    """[N, nb, ...] -> [N, nb * ...]: per-block fields laid out along K."""
    return np.ascontiguousarray(a).reshape(n, -1)


def _q8_0(blocks: np.ndarray) -> Decomposition:
    """codes = q (int8); sw = d. gguf: float32(q) * d (the same product)."""
    n = blocks.shape[0]
    q = blocks[..., 2:].view(np.int8)
    return Decomposition(_rows(q, n).astype(np.int32), 0, 32, _rows(gc.f16_field(blocks, 0), n), None)


def _q4_0(blocks: np.ndarray) -> Decomposition:
    """codes = nibble 0..15, bias 8; sw = d. gguf: d * float32(q - 8)."""
    n = blocks.shape[0]
    q = q4_0.unpack_quants(blocks)
    return Decomposition(_rows(q, n).astype(np.int32), 8, 32, _rows(gc.f16_field(blocks, 0), n), None)


def _q4_k(blocks: np.ndarray) -> Decomposition:
    """codes = nibble 0..15; sw = d * float32(sc), mw = dmin * float32(m) (one float32
    multiply each). gguf: (d*sc) * float32(q) - (dmin*m): the product rounds, then the
    subtraction rounds."""
    n = blocks.shape[0]
    d = gc.f16_field(blocks, 0)[..., None]
    dmin = gc.f16_field(blocks, 2)[..., None]
    sc, m = q4_k.unpack_scales_mins(blocks)
    sw = d * sc.astype(np.float32)
    mw = dmin * m.astype(np.float32)
    q = q4_k.unpack_quants(blocks)
    return Decomposition(_rows(q, n).astype(np.int32), 0, 32, _rows(sw, n), _rows(mw, n))


def _q6_k(blocks: np.ndarray) -> Decomposition:
    """codes = 6-bit q 0..63, bias 32, unit 16; sw = d * float32(sc) (sc int8).
    gguf: (d*sc) * float32(q - 32)."""
    n = blocks.shape[0]
    d = gc.f16_field(blocks, q6_k._D)[..., None]
    sc = blocks[..., q6_k._SC:q6_k._D].view(np.int8).astype(np.float32)
    q = q6_k.unpack_quants(blocks)
    return Decomposition(_rows(q, n).astype(np.int32), 32, q6_k.SUB, _rows(d * sc, n), None)


def _iq4_xs(blocks: np.ndarray) -> Decomposition:
    """codes = KVALUES_IQ4NL[index] (-127..113); sw = d * float32(ls - 32).
    gguf: (d * float32(ls-32)) * float32(kv)."""
    n = blocks.shape[0]
    d = gc.f16_field(blocks, 0)[..., None]
    ls = iq4_xs.unpack_scales(blocks).astype(np.int8) - np.int8(32)
    kv = KVALUES_IQ4NL[iq4_xs.unpack_quants(blocks)]
    return Decomposition(_rows(kv, n).astype(np.int32), 0, 32, _rows(d * ls.astype(np.float32), n), None)


def _iq3_xxs(blocks: np.ndarray) -> Decomposition:
    """codes = grid magnitude * sign (-62..62); sw = ((d * (0.5 + float32(sc))) * 0.5), float32
    at each step. gguf: ((db * grid) * sign); the sign is +-1, so that equals db * (grid*sign)
    bit for bit (round to nearest is symmetric in sign)."""
    n = blocks.shape[0]
    d = gc.f16_field(blocks, 0)[..., None]
    idx, sidx, sc = iq3_xxs.unpack(blocks)
    sw = d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.5)
    grid = IQ3XXS_GRID[idx].astype(np.int32).reshape(*idx.shape[:-1], 8, 4, 8)   # sub, group, elem
    neg = (KSIGNS_IQ2XS[sidx][..., None] >> np.arange(8, dtype=np.uint8)) & 1     # [..., 8, 4, 8]
    codes = grid * (1 - 2 * neg.astype(np.int32))
    return Decomposition(_rows(codes, n), 0, 32, _rows(sw, n), None)


_DECOMPOSERS = {
    q8_0.NAME: (q8_0, _q8_0),
    q4_0.NAME: (q4_0, _q4_0),
    q4_k.NAME: (q4_k, _q4_k),
    q6_k.NAME: (q6_k, _q6_k),
    iq4_xs.NAME: (iq4_xs, _iq4_xs),
    iq3_xxs.NAME: (iq3_xxs, _iq3_xxs),
}


def decompose(fmt: str, raw) -> Decomposition:
    """Integer codes and float32 scales of GGUF blocks raw uint8 [N, nb*block_bytes].

    In float32, sw_expanded * (codes - bias).astype(float32) - mw_expanded (no subtraction
    where mw is None), with sw repeated `unit` times along K and mw 32 times, equals the
    format module's dequantize(raw) bit for bit.
    """
    if fmt not in _DECOMPOSERS:
        raise ValueError(f"int8_act: format {fmt!r} has no int8-activation decomposition; "
                         f"known: {', '.join(_DECOMPOSERS)}")
    module, split = _DECOMPOSERS[fmt]
    return split(gc.check_raw(raw, module.BLOCK_BYTES, fmt))


def _check_x(x) -> np.ndarray:
    """x as float32 [M, K] (exact widening), K a positive multiple of 32."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"int8_act: x must be 2-D [M, K], got shape {x.shape}")
    if x.dtype not in X_DTYPES:
        raise ValueError(f"int8_act: x must be float32, float16 or bfloat16, got dtype {x.dtype}")
    if x.shape[1] == 0 or x.shape[1] % SLICE != 0:
        raise ValueError(f"int8_act: k={x.shape[1]} is not a positive multiple of {SLICE}")
    return x.astype(np.float32)


def _cvt_rn_int8(t: np.ndarray) -> np.ndarray:
    """The kernel's xq: round half to even (NaN gives 0), clamped to [-127, 127]. Wherever
    1/dx is finite, every t of a finite slice lies in [-127.5, 127.5] and this is plain
    rint (for a normal dx by the error bound of two float32 roundings; for a subnormal dx
    checked over every amax). Only a slice with 0 < amax < ~3.7e-37 (float32 or bfloat16
    x), where 1/dx overflows to inf, reaches the clamp: its positive elements give 127,
    its negative ones -127.
    """
    r = np.clip(np.rint(t.astype(np.float64)), -127.0, 127.0)
    return np.where(np.isnan(r), 0, r).astype(np.int8)


def _butterfly_sum(s: np.ndarray) -> np.ndarray:
    """Sum over the last axis (32) as the prep kernel adds it: float32, each lane i adding
    lane i xor o's value for o = 16, 8, 4, 2, 1 (a __shfl_xor butterfly); lane 0's value.
    Not the correctly rounded sum: where a slice cancels the two differ (bound in
    exact_error_bound)."""
    t = s.astype(np.float32)
    lanes = np.arange(SLICE)
    for o in (16, 8, 4, 2, 1):
        t = t + t[..., lanes ^ o]
    return t[..., 0]


def quantize_x(x):
    """Activations x [M, K] (float32, float16 or bfloat16; K % 32 == 0) -> (xq, dx, sx).

    Per row m and slice j (elements 32j .. 32j+31), v = float32(x):
        amax = max |v|;  dx = float32(amax) / float32(127)   (IEEE float32 division)
        id = float32(1) / dx if dx > 0 else 0;  xq = rint(float32(v * id)) as int8
        sx = the float32 sum of v in the kernel's order: a butterfly over the 32 lanes
             (t_i += t_{i xor o} for o = 16, 8, 4, 2, 1), lane 0's value
    A slice holding a NaN or an inf gets dx = NaN, sx = NaN and xq = 0.
    Returns xq int8 [M, K], dx float32 [M, K/32], sx float32 [M, K/32].
    """
    v = _check_x(x)
    m, k = v.shape
    s = v.reshape(m, k // SLICE, SLICE)
    bad = ~np.isfinite(s).all(axis=-1)                                        # [M, K/32]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        dx = np.abs(s).max(axis=-1) / np.float32(127)
        inv = np.where(dx > 0, np.float32(1) / dx, np.float32(0))
        t = np.where(bad[..., None], np.float32(0), s * inv[..., None])
        sx = _butterfly_sum(s)
    nan = np.float32(np.nan)
    return (_cvt_rn_int8(t).reshape(m, k), np.where(bad, nan, dx).astype(np.float32),
            np.where(bad, nan, sx).astype(np.float32))


def _prepare(x, fmt: str, raw):
    """decompose + quantize_x, with the K of x and W checked to agree."""
    dec = decompose(fmt, raw)
    xq, dx, sx = quantize_x(x)
    if xq.shape[1] != dec.codes.shape[1]:
        raise ValueError(f"int8_act: x has k={xq.shape[1]} but the weight has k={dec.codes.shape[1]}")
    return dec, xq, dx, sx


def gemm_model(x, fmt: str, raw):
    """The kernel's y = x @ dequantize(raw)^T on int8 activations, in float64.

    With (xq, dx, sx) = quantize_x(x), decompose(fmt, raw), unit u covering elements
    k in [u*unit, (u+1)*unit) and s(u) its 32-element slice:
        D[m, n, u] = sum_k (codes[n, k] - bias) * xq[m, k]                    (exact integer)
        y[m, n]    = sum_u sw[n, u] * (dx[m, s(u)] * D[m, n, u]) - sum_j mw[n, j] * sx[m, j]
        mag[m, n]  = sum_u |sw[n, u] * dx[m, s(u)] * D[m, n, u]| + sum_j |mw[n, j] * sx[m, j]|
    (the mw terms for q4_K only). Each term is the float64 rounding of its exact value
    (|D| < 2^20, so dx * D and any product of two float32 are exact in float64); the sums
    run in float64. mag is the scale of an fp32-accumulation bound on the kernel. A row of
    x with a non-finite slice gives NaN across its row of y, as the kernel does.
    Returns (y, mag), float64 [M, N].
    """
    dec, xq, dx, sx = _prepare(x, fmt, raw)
    m = xq.shape[0]
    n, units = dec.sw.shape
    xu = xq.astype(np.float64).reshape(m, units, dec.unit).transpose(1, 0, 2)  # [U, M, unit]
    dxu = np.repeat(dx.astype(np.float64), SLICE // dec.unit, axis=1).T[..., None]  # [U, M, 1]
    swu = np.ascontiguousarray(dec.sw.T, dtype=np.float64)                     # [U, N]
    y = np.empty((m, n))
    mag = np.empty((m, n))
    step = max(1, _CHUNK_ELEMS // (units * m))
    for n0 in range(0, n, step):
        cols = slice(n0, n0 + step)
        cb = (dec.codes[cols] - dec.bias).astype(np.float64).reshape(-1, units, dec.unit)
        e = np.matmul(xu, cb.transpose(1, 2, 0))                               # D [U, M, n]
        e *= dxu                                                               # dx * D, exact
        sw = np.ascontiguousarray(swu[:, cols])
        y[:, cols] = np.einsum("umn,un->mn", e, sw)
        mag[:, cols] = np.einsum("umn,un->mn", np.abs(e, out=e), np.abs(sw))
    if dec.mw is not None:
        sx64, mw64 = sx.astype(np.float64), dec.mw.astype(np.float64)
        y -= sx64 @ mw64.T
        mag += np.abs(sx64) @ np.abs(mw64).T
    return y, mag


def exact_error_bound(x, fmt: str, raw) -> np.ndarray:
    """Bound on |gemm_model(x, fmt, raw)[0] - x @ dequantize(raw)^T| (exact arithmetic;
    float64 rounding ignored), float64 [M, N]:

        sum_k |ws[n, k]| * |x[m, k] - dx * xq[m, k]|  +  sum_k |ws[n, k] - mw[n, k//32] - W[n, k]| * |x[m, k]|

    with ws = sw * (codes - bias) in exact arithmetic and W = dequantize(raw). The first sum
    is the activation quantization error: the model multiplies ws by dx * xq, and (q4_K)
    the min term by sx. It uses |ws|, not |W|: for q4_K the two differ
    where ws and mw cancel. The second sum is q4_K's float32 rounding of the dequantized
    weight ((d*sc)*q - dmin*m, two roundings), which the model does not make; it is zero for
    the other formats (W = ws exactly, see decompose). q4_K adds
    sum_j |mw[n, j]| * |sx[m, j] - exact slice sum|: sx is the kernel's float32 butterfly
    (_butterfly_sum), which can lose a cancelling slice's small terms. Not finite where x
    is not.
    """
    dec, xq, dx, sx = _prepare(x, fmt, raw)
    v = np.asarray(x).astype(np.float64)
    err = np.abs(v - np.repeat(dx.astype(np.float64), SLICE, axis=1) * xq)
    ws = np.repeat(dec.sw.astype(np.float64), dec.unit, axis=1) * (dec.codes - dec.bias)
    w_model = ws if dec.mw is None else ws - np.repeat(dec.mw.astype(np.float64), SLICE, axis=1)
    w_deq = _DECOMPOSERS[fmt][0].dequantize(raw).astype(np.float64)
    bound = err @ np.abs(ws).T + np.abs(v) @ np.abs(w_model - w_deq).T
    if dec.mw is not None:   # the min term's slice sum is the kernel's float32 butterfly
        m, k = v.shape
        sx_err = np.abs(sx.astype(np.float64) - v.reshape(m, k // SLICE, SLICE).sum(axis=-1))
        bound = bound + sx_err @ np.abs(dec.mw.astype(np.float64)).T
    return bound
