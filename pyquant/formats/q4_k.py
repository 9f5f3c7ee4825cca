"""GGUF Q4_K: 256 weights per 144-byte super-block, 8 sub-blocks of 32,
w = (d * sc[j]) * q - dmin * m[j], q unsigned 4-bit, sc and m unsigned 6-bit.

Block (ggml's block_q4_K, src/formats/blocks.h):
    bytes 0..1    d       fp16 super-scale of the sub-block scales
    bytes 2..3    dmin    fp16 super-scale of the sub-block mins
    bytes 4..15   scales  8 scales + 8 mins, 6 bits each, packed in 12 bytes:
                  byte i    (i < 4): sc[i]   | (sc[i+4] >> 4) << 6
                  byte 4+i  (i < 4): m[i]    | (m[i+4]  >> 4) << 6
                  byte 8+i  (i < 4): (sc[i+4] & 15) | (m[i+4] & 15) << 4
    bytes 16..143 qs      4 chunks c of 32 bytes: low nibbles = sub-block 2c,
                          high nibbles = sub-block 2c+1 (element i of the sub-block = byte i)
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc

BLOCK_ELEMS = gc.QK_K
K_SCALE_SIZE = 12
BLOCK_BYTES = 2 * 2 + K_SCALE_SIZE + gc.QK_K // 2  # d, dmin, scales, qs
NAME = "q4_K"
SUB = 32  # elements per sub-block

# Candidate shrink factors of the sub-block range [min, max] tried by the quantizer
# (clipping a Gaussian's tails a little lowers the rounding error of the rest).
_SHRINK = np.array([1.0, 0.94, 0.88, 0.82, 0.76], dtype=np.float32)


def unpack_scales_mins(blocks: np.ndarray):
    """[..., 144] block bytes -> (sc, m), each [..., 8] uint8 in 0..63."""
    s = blocks[..., 4:16]
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, m


def pack_scales_mins(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(sc, m) [..., 8] values 0..63 -> [..., 12] packed bytes (inverse of unpack_scales_mins)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    lo = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    mid = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    hi = (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=-1)


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """[..., 144] -> [..., 8, 32] uint8 quants 0..15 (sub-block, element)."""
    qs = blocks[..., 16:].reshape(*blocks.shape[:-1], 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2)        # [..., 4, 2, 32]
    return q.reshape(*blocks.shape[:-1], 8, SUB)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*144] -> float32 [N, nb*256]; float32 ops as gguf: (d*sc)*q - (dmin*m)."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0)[..., None]
    dmin = gc.f16_field(blocks, 2)[..., None]
    sc, m = unpack_scales_mins(blocks)
    ds = (d * sc.astype(np.float32))[..., None]              # [N, nb, 8, 1]
    dm = (dmin * m.astype(np.float32))[..., None]
    q = unpack_quants(blocks).astype(np.float32)             # [N, nb, 8, 32]
    return (ds * q - dm).reshape(n, nb * BLOCK_ELEMS)


def _fit_sub_blocks(x: np.ndarray):
    """Per sub-block asymmetric 4-bit fit: x ~ s * q - mn with s >= 0, mn >= 0.

    x [..., 8, 32] -> (s, mn) [..., 8] float32. Tries each (low shrink, high shrink) pair
    of _SHRINK on [min(x, 0), max(x)], keeps the lowest squared error, then refits s and
    mn by least squares with the chosen q fixed (kept only where it stays valid and helps).
    """
    lo0 = np.minimum(x.min(axis=-1), 0)                      # the min is never positive:
    hi0 = x.max(axis=-1)                                     # m is stored unsigned
    best_err = np.full(lo0.shape, np.inf, dtype=np.float32)
    best_s = np.zeros_like(lo0)
    best_lo = np.zeros_like(lo0)
    for a in _SHRINK:
        for b in _SHRINK:
            lo = lo0 * a
            s = np.maximum(hi0 * b - lo, 0) / np.float32(15)
            inv = np.where(s > 0, 1 / np.where(s > 0, s, 1), 0).astype(np.float32)
            q = np.clip(np.rint((x - lo[..., None]) * inv[..., None]), 0, 15)
            err = np.sum((s[..., None] * q + lo[..., None] - x) ** 2, axis=-1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s, best_s)
            best_lo = np.where(better, lo, best_lo)
    # Least-squares refit of (s, lo) for the chosen quants: x ~ s*q + lo.
    inv = np.where(best_s > 0, 1 / np.where(best_s > 0, best_s, 1), 0).astype(np.float32)
    q = np.clip(np.rint((x - best_lo[..., None]) * inv[..., None]), 0, 15)
    nq = np.float32(x.shape[-1])
    sq, sqq, sx, sqx = q.sum(-1), (q * q).sum(-1), x.sum(-1), (q * x).sum(-1)
    det = nq * sqq - sq * sq
    ok = det > 0
    det1 = np.where(ok, det, 1)
    s_ls = (nq * sqx - sq * sx) / det1
    lo_ls = (sqq * sx - sq * sqx) / det1
    err_ls = np.sum((s_ls[..., None] * q + lo_ls[..., None] - x) ** 2, axis=-1)
    use = ok & (s_ls > 0) & (lo_ls <= 0) & (err_ls < best_err)
    s = np.where(use, s_ls, best_s).astype(np.float32)
    mn = -np.where(use, lo_ls, best_lo).astype(np.float32)
    return s, mn


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/256*144].

    Per sub-block: a 4-bit min/scale fit with a small range-shrink search (_fit_sub_blocks).
    Per super-block: d = max(s)/63 and dmin = max(mn)/63 (fp16), so the largest sub-block
    scale and min use all 6 bits; sc = round(s/d), m = round(mn/dmin). The quants are then
    re-rounded against the scales as stored: q = clip(round((x + dmin*m) / (d*sc)), 0, 15).
    """
    W = gc.check_weight(W, BLOCK_ELEMS, NAME)
    n, k = W.shape
    nb = k // BLOCK_ELEMS
    x = W.reshape(n, nb, 8, SUB)
    # The search runs on each super-block divided by its largest |x| (no float32 overflow
    # in the squared errors of huge weights, no underflow for tiny ones).
    amax = np.abs(x).max(axis=(-2, -1), keepdims=True)
    norm = np.where(amax > 0, amax, 1)
    s, mn = _fit_sub_blocks(x / norm)
    s, mn = s * norm[..., 0], mn * norm[..., 0]
    d16 = gc.to_f16(s.max(axis=-1) / np.float32(63), NAME, "d")
    dmin16 = gc.to_f16(mn.max(axis=-1) / np.float32(63), NAME, "dmin")
    d = d16.astype(np.float32)[..., None]
    dmin = dmin16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d > 0, s / d, 0)), 0, 63)
        m = np.clip(np.rint(np.where(dmin > 0, mn / dmin, 0)), 0, 63)
    ds = (d * sc.astype(np.float32))[..., None]               # as dequantize computes them
    dm = (dmin * m.astype(np.float32))[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(ds > 0, np.rint((x + dm) / ds), 0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(n, nb, 4, 2, SUB)
    out = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    out[..., 0:2] = gc.f16_bytes(d16)
    out[..., 2:4] = gc.f16_bytes(dmin16)
    out[..., 4:16] = pack_scales_mins(sc, m)
    out[..., 16:] = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(n, nb, 128)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/256*144]: scales/mins/quants bytes random (all 6 bits of every
    sc and m), d and dmin any finite fp16 (or in d_range)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, 0, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    gc.put_f16_bits(blocks, 2, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
