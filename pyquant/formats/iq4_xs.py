"""GGUF IQ4_XS: 256 weights per 136-byte super-block, 8 sub-blocks of 32,
w = (d * (ls[j] - 32)) * KVALUES_IQ4NL[q], q a 4-bit codebook index, ls unsigned 6-bit.

Block (ggml's block_iq4_xs, src/formats/blocks.h):
    bytes 0..1    d         fp16 super-scale
    bytes 2..3    scales_h  uint16 little-endian, bits 2j..2j+1 = high 2 bits of ls[j]
    bytes 4..7    scales_l  low 4 bits of ls[j] = nibble j % 2 of byte j // 2
    bytes 8..135  qs        sub-block j owns bytes 16j .. 16j+15: element i (i < 16) =
                            low nibble of byte 16j+i, element i + 16 = its high nibble
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc
from .iq_tables import KVALUES_IQ4NL

BLOCK_ELEMS = gc.QK_K
BLOCK_BYTES = 2 + 2 + gc.QK_K // 64 + gc.QK_K // 2  # d, scales_h, scales_l, qs
NAME = "iq4_xs"
SUB = 32

_KV = KVALUES_IQ4NL.astype(np.float32)               # ascending codebook, float32
# The largest-magnitude element x_max is mapped to x_max / s = v for each candidate v,
# near either end of the asymmetric codebook (+113 with s > 0, or -127 with s < 0);
# a least-squares refit of s for the chosen indices then picks the best candidate.
_CANDIDATES = np.concatenate([113 * np.linspace(0.8, 1.16, 10), -127 * np.linspace(0.8, 1.16, 10)]).astype(np.float32)


def unpack_scales(blocks: np.ndarray) -> np.ndarray:
    """[..., 136] -> [..., 8] uint8 ls in 0..63 (the stored 6-bit value; the scale is ls - 32)."""
    sh = np.ascontiguousarray(blocks[..., 2:4]).view("<u2")                # [..., 1]
    high = (sh >> (2 * np.arange(8, dtype=np.uint16))) & 0x3                # [..., 8]
    sl = blocks[..., 4:8, None]
    low = np.concatenate([sl & 0x0F, sl >> 4], axis=-1).reshape(*blocks.shape[:-1], 8)
    return low | (high.astype(np.uint8) << 4)


def pack_scales(ls: np.ndarray) -> np.ndarray:
    """ls [..., 8] in 0..63 -> [..., 6] bytes (scales_h then scales_l)."""
    ls = ls.astype(np.uint8)
    high = (ls >> 4).astype(np.uint16) << (2 * np.arange(8, dtype=np.uint16))
    sh = np.bitwise_or.reduce(high, axis=-1).astype("<u2")
    sl = (ls[..., 0::2] & 0x0F) | ((ls[..., 1::2] & 0x0F) << 4)
    sh_bytes = np.ascontiguousarray(sh).view(np.uint8).reshape(*ls.shape[:-1], 2)
    return np.concatenate([sh_bytes, sl], axis=-1)


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """[..., 136] -> [..., 8, 32] uint8 codebook indices (sub-block, element)."""
    qs = blocks[..., 8:].reshape(*blocks.shape[:-1], 8, 16)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*136] -> float32 [N, nb*256]; float32 ops as gguf: (d * float32(ls-32)) * kv[q]."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0)[..., None]
    ls = unpack_scales(blocks).astype(np.int8) - np.int8(32)
    dl = (d * ls.astype(np.float32))[..., None]                              # [N, nb, 8, 1]
    v = KVALUES_IQ4NL[unpack_quants(blocks)].astype(np.float32)              # [N, nb, 8, 32]
    return (dl * v).reshape(n, nb * BLOCK_ELEMS)


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/256*136].

    Per sub-block of 32: scale search over _CANDIDATES (each element to its nearest
    codebook value, least-squares refit of the scale, lowest error wins); the scale may
    be negative, which uses the long -127 end of the codebook for positive outliers.
    Per super-block: d = s_max / -32 (fp16; s_max the sub-block scale of largest
    magnitude, stored as ls - 32 = -32), ls - 32 = clip(round(s/d), -32, 31), then every
    element is re-mapped to its nearest codebook value under the stored scale d*(ls-32).
    """
    x, norm, xn, vmax = gc.normalised_subblocks(W, BLOCK_ELEMS, NAME, SUB)
    n, nb = x.shape[:2]
    best_s = gc.search_subblock_scales(xn, vmax, _CANDIDATES,
                                       lambda t: _KV[gc.nearest_sorted(KVALUES_IQ4NL, t)])
    best_s, d16 = gc.superblock_scale(best_s, norm, -32, NAME)
    d = d16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.clip(np.rint(np.where(d != 0, best_s / d, 0)), -32, 31).astype(np.int8)
        dl = (d * l.astype(np.float32))[..., None]                           # as dequantize
        t = np.where(dl != 0, x / dl, 0)
    q = gc.nearest_sorted(KVALUES_IQ4NL, t)                                  # [N, nb, 8, 32]
    out = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    out[..., 0:2] = gc.f16_bytes(d16)
    out[..., 2:8] = pack_scales((l + 32).astype(np.uint8))
    out[..., 8:] = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, nb, 128)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/256*136]: scales_h, scales_l and every index nibble random,
    d any finite fp16 (or in d_range)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, 0, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
