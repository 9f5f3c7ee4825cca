"""GGUF Q8_0: 32 weights per 34-byte block, w = d * q.

Block (ggml's block_q8_0, src/formats/blocks.h):
    bytes 0..1   d   fp16 scale
    bytes 2..33  qs  int8 quants, element i = qs[i]
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc

BLOCK_ELEMS = 32
BLOCK_BYTES = 2 + 32  # d, qs
NAME = "q8_0"


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*34] -> float32 [N, nb*32]; float32 ops as gguf: float32(q) * d."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0)[..., None]                  # [N, nb, 1]
    q = blocks[..., 2:].view(np.int8).astype(np.float32)    # [N, nb, 32]
    return (q * d).reshape(n, nb * BLOCK_ELEMS)


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/32*34]. Round to nearest with d = amax / 127.

    Same arithmetic as ggml's quantize_row_q8_0_ref (the float32 d, not its fp16
    rounding, scales the quants; roundf halves away from zero), so the bytes match
    gguf.quants.quantize exactly.
    """
    W = gc.check_weight(W, BLOCK_ELEMS, NAME)
    n, k = W.shape
    x = W.reshape(n, k // BLOCK_ELEMS, BLOCK_ELEMS)
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = gc.round_half_away(x * inv).astype(np.int8)
    out = np.empty((n, k // BLOCK_ELEMS, BLOCK_BYTES), dtype=np.uint8)
    out[..., 0:2] = gc.f16_bytes(gc.to_f16(d[..., 0], NAME, "d"))
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/32*34]: every quant byte random (-128 included), d any finite
    fp16 (or |d| in d_range, see gguf_common.random_f16_bits)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, 0, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
