"""GGUF IQ3_XXS: 256 weights per 98-byte super-block, 8 sub-blocks of 32, each made of
4 groups of 8 = 2 grid points of 4 magnitudes + 8 signs.
w = (d * (0.5 + sc[j]) * 0.5) * grid[idx] * sign, sc unsigned 4-bit.

Block (ggml's block_iq3_xxs, src/formats/blocks.h):
    bytes 0..1    d    fp16 super-scale
    bytes 2..65   qs   64 grid indices; index g covers elements 4g .. 4g+3 (IQ3XXS_GRID[g])
    bytes 66..97  8 uint32 little-endian, one per sub-block j:
                  bits 7l .. 7l+6 (l = 0..3) = sign index of group l (elements 32j+8l ..+7):
                      KSIGNS_IQ2XS[index] bit i set = element 8l+i negative
                  bits 28..31 = sc[j]
Only 7 sign bits are stored: the 8th completes an even number of minus signs.
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc
from .iq_tables import IQ3XXS_GRID, KSIGNS_IQ2XS

BLOCK_ELEMS = gc.QK_K
BLOCK_BYTES = 2 + 3 * gc.QK_K // 8  # d, qs (grid indices + sign/scale words)
NAME = "iq3_xxs"
SUB = 32
_QS, _SW = 2, 2 + gc.QK_K // 4  # byte offsets: grid indices, sign/scale words

_GRID = IQ3XXS_GRID.astype(np.float32)                                      # [256, 4]
_GRID_SQ = np.sum(_GRID * _GRID, axis=-1)                                   # [256]
# 8 sign bits of each table entry as +-1, [128, 8]
_SIGNS = np.where((KSIGNS_IQ2XS[:, None] >> np.arange(8, dtype=np.uint8)) & 1, -1.0, 1.0).astype(np.float32)
# Candidate sub-block scales: the largest target magnitude a_max maps to a_max / s = c
# grid units for each c (62 is the largest grid magnitude); least squares refits s.
_CANDIDATES = np.linspace(40.0, 66.0, 14, dtype=np.float32)
_CHUNK = 1 << 15  # quads per distance matrix: 32768 x 256 float32 = 32 MiB


def unpack(blocks: np.ndarray):
    """[..., 98] -> (grid indices [..., 64] uint8, sign indices [..., 8, 4] uint8 0..127,
    sc [..., 8] uint8 0..15)."""
    idx = blocks[..., _QS:_SW]
    words = np.ascontiguousarray(blocks[..., _SW:]).view("<u4")               # [..., 8]
    sidx = ((words[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 0x7F).astype(np.uint8)
    sc = (words >> 28).astype(np.uint8)
    return idx, sidx, sc


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*98] -> float32 [N, nb*256]; float32 ops as gguf:
    ((d * (0.5 + float32(sc))) * 0.5) * grid * sign."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0)[..., None]
    idx, sidx, sc = unpack(blocks)
    db = d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.5)   # [N, nb, 8]
    g = _GRID[idx].reshape(n, nb, 8, 4, 8)                                  # (sub, group, elem)
    s = _SIGNS[sidx]                                                        # [N, nb, 8, 4, 8]
    return (db[..., None, None] * g * s).reshape(n, nb * BLOCK_ELEMS)


def _nearest_grid(t: np.ndarray) -> np.ndarray:
    """t [..., 4] float32 targets in grid units -> index of the nearest grid point (brute force
    over all 256: argmin ||g||^2 - 2 t.g, one matrix product per chunk)."""
    flat = t.reshape(-1, 4)
    out = np.empty(flat.shape[0], dtype=np.uint8)
    for i in range(0, flat.shape[0], _CHUNK):
        dist = _GRID_SQ - 2 * (flat[i:i + _CHUNK] @ _GRID.T)                 # [chunk, 256]
        out[i:i + _CHUNK] = dist.argmin(axis=-1)
    return out.reshape(t.shape[:-1])


def _choose_signs(x: np.ndarray):
    """x [..., 8] -> (sign index 0..127, signed targets a [..., 8]).

    Minus where x < 0; if that gives an odd count, the element of smallest |x| takes the
    wrong sign (costing the least) so the pattern exists in KSIGNS_IQ2XS. The target
    magnitude is a = x * sign: |x|, or -|x| for the flipped element (the nearest grid
    point then goes to the smallest magnitude there).
    """
    neg = x < 0
    odd = (neg.sum(axis=-1) & 1).astype(bool)
    flip = (np.abs(x).argmin(axis=-1)[..., None] == np.arange(8)) & odd[..., None]
    neg ^= flip
    sign = np.where(neg, np.float32(-1), np.float32(1))
    bits = np.sum(neg[..., :7].astype(np.uint8) << np.arange(7, dtype=np.uint8), axis=-1, dtype=np.uint8)
    return bits, x * sign


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/256*98].

    Signs per group of 8 by parity completion (_choose_signs). Per sub-block of 32: scale
    search over _CANDIDATES, each 4-value quad to its nearest grid point by brute force,
    least-squares refit, lowest error wins. Per super-block: 0.5*d*(0.5 + sc) = s gives
    d = 2 * s_max / 15.5 (fp16) and sc = clip(round(2s/d - 0.5), 0, 15); the quads are
    then re-mapped to their nearest grid points under the stored scale.
    """
    W = gc.check_weight(W, BLOCK_ELEMS, NAME)
    n, k = W.shape
    nb = k // BLOCK_ELEMS
    x = W.reshape(n, nb, 8, 4, 8)                                           # sub, group, elem
    sbits, a = _choose_signs(x)                                             # [n,nb,8,4], [...,8]
    quads = a.reshape(n, nb, 8, 8, 4)                                       # sub, quad, elem
    # The search runs on each super-block divided by its largest |x| (no float32 overflow
    # in the squared errors of huge weights, no underflow for tiny ones).
    amax = np.abs(a).reshape(n, nb, 8, SUB).max(axis=-1)                    # [n, nb, 8]
    norm = amax.max(axis=-1, keepdims=True)
    norm = np.where(norm > 0, norm, np.float32(1))
    qn = quads / norm[..., None, None]
    amax = amax / norm
    best_err = np.full(amax.shape, np.inf, dtype=np.float32)
    best_s = np.zeros(amax.shape, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in _CANDIDATES:
            inv = np.where(amax > 0, c / amax, 0).astype(np.float32)
            g = _GRID[_nearest_grid(qn * inv[..., None, None])]             # [n,nb,8,8,4]
            s, err = gc.ls_scale(qn.reshape(n, nb, 8, SUB), g.reshape(n, nb, 8, SUB))
            better = (err < best_err) & (s > 0)
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s, best_s)
    best_s = best_s * norm
    d16 = gc.to_f16(best_s.max(axis=-1) * np.float32(2 / 15.5), NAME, "d")
    d = d16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d > 0, 2 * best_s / d - 0.5, 0)), 0, 15).astype(np.uint32)
        db = d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.5)  # as dequantize
        t = np.where(db[..., None, None] > 0, quads / db[..., None, None], 0).astype(np.float32)
    idx = _nearest_grid(t)                                                  # [n, nb, 8, 8]
    words = (sbits.astype(np.uint32) << (7 * np.arange(4, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    words |= sc << 28
    out = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    out[..., 0:2] = gc.f16_bytes(d16)
    out[..., _QS:_SW] = idx.reshape(n, nb, 64)
    out[..., _SW:] = np.ascontiguousarray(words.astype("<u4")).view(np.uint8).reshape(n, nb, 32)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/256*98]: grid indices, sign indices and 4-bit scales random
    (every bit of the sign/scale words), d any finite fp16 (or in d_range)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, 0, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
