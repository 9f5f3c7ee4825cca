"""GGUF Q4_0: 32 weights per 18-byte block, w = d * (q - 8), q unsigned 4-bit.

Block (ggml's block_q4_0, src/formats/blocks.h):
    bytes 0..1   d   fp16 scale
    bytes 2..17  qs  element i (i < 16) = low nibble of qs[i], element i + 16 = high nibble
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc

BLOCK_ELEMS = 32
BLOCK_BYTES = 2 + 32 // 2  # d, qs
NAME = "q4_0"


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """[..., 18] block bytes -> [..., 32] uint8 quants 0..15 in element order."""
    qs = blocks[..., 2:]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*18] -> float32 [N, nb*32]; float32 ops as gguf: d * float32(q - 8)."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0)[..., None]
    q = unpack_quants(blocks).astype(np.int8) - np.int8(8)
    return (d * q.astype(np.float32)).reshape(n, nb * BLOCK_ELEMS)


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/32*18].

    The element of largest magnitude (first one on ties) maps to q = 0, i.e. d = max / -8,
    so the full -8 end of the range is used; q = min(15, trunc(x / d + 8.5)). This is the
    arithmetic of ggml's quantize_row_q4_0_ref, so the bytes match gguf.quants.quantize.
    """
    W = gc.check_weight(W, BLOCK_ELEMS, NAME)
    n, k = W.shape
    x = W.reshape(n, k // BLOCK_ELEMS, BLOCK_ELEMS)
    imax = np.abs(x).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(x, imax, axis=-1)              # signed, [N, nb, 1]
    d = vmax / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    # x * inv lies in [-8, 8] up to rounding, so x * inv + 8.5 >= 0 and trunc is floor.
    q = np.minimum(np.trunc(x * inv + np.float32(8.5)), 15).astype(np.uint8)
    out = np.empty((n, k // BLOCK_ELEMS, BLOCK_BYTES), dtype=np.uint8)
    out[..., 0:2] = gc.f16_bytes(gc.to_f16(d[..., 0], NAME, "d"))
    out[..., 2:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/32*18]: every nibble random, d any finite fp16 (or in d_range)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, 0, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
