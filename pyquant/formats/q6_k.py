"""GGUF Q6_K: 256 weights per 210-byte super-block, 16 sub-blocks of 16,
w = (d * sc[j]) * (q - 32), q unsigned 6-bit, sc int8.

Block (ggml's block_q6_K, src/formats/blocks.h). Element e = 128*h + r (half h = 0, 1;
r = 0..127) keeps its low 4 bits in ql and its high 2 bits in qh:
    bytes 0..127    ql      low nibble:  ql[64*h + r % 64] >> (4 * (r // 64))
    bytes 128..191  qh      high 2 bits: qh[32*h + r % 32] >> (2 * (r // 32))
    bytes 192..207  scales  int8 scale of sub-block j = elements 16j .. 16j+15
    bytes 208..209  d       fp16 super-scale
Worked example: e = 200 -> h = 1, r = 72: low nibble = high nibble of ql[64 + 8],
high bits = bits 4..5 of qh[32 + 8].
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc

BLOCK_ELEMS = gc.QK_K
BLOCK_BYTES = gc.QK_K // 2 + gc.QK_K // 4 + gc.QK_K // 16 + 2  # ql, qh, scales, d
NAME = "q6_K"
SUB = 16
_QL, _QH, _SC, _D = 0, 128, 192, 208  # byte offsets of the fields

# The element of largest magnitude is mapped to -c for each candidate c (the -32 end
# of the 6-bit range and a little inside or beyond it); least squares then refits the
# scale for the rounded quants, and the lowest error wins.
_CANDIDATES = np.arange(26.0, 34.01, 0.5, dtype=np.float32)


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """[..., 210] -> [..., 256] uint8 quants 0..63 in element order."""
    lead = blocks.shape[:-1]
    ql = blocks[..., _QL:_QH].reshape(*lead, 2, 1, 64)
    qh = blocks[..., _QH:_SC].reshape(*lead, 2, 1, 32)
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=-2).reshape(*lead, 2, 128)
    hi = np.concatenate([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], axis=-2).reshape(*lead, 2, 128)
    return (lo | (hi << 4)).reshape(*lead, BLOCK_ELEMS)


def pack_quants(q: np.ndarray) -> np.ndarray:
    """[..., 256] quants 0..63 -> [..., 192] bytes (ql then qh); inverse of unpack_quants."""
    lead = q.shape[:-1]
    q = q.astype(np.uint8).reshape(*lead, 2, 128)
    lo, hi = q & 0x0F, q >> 4
    ql = lo[..., :64] | (lo[..., 64:] << 4)                                   # [..., 2, 64]
    qh = hi[..., 0:32] | (hi[..., 32:64] << 2) | (hi[..., 64:96] << 4) | (hi[..., 96:] << 6)
    return np.concatenate([ql.reshape(*lead, 128), qh.reshape(*lead, 64)], axis=-1)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8 [N, nb*210] -> float32 [N, nb*256]; float32 ops as gguf: (d*sc) * float32(q-32)."""
    blocks = gc.check_raw(raw, BLOCK_BYTES, NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, _D)[..., None]
    sc = blocks[..., _SC:_D].view(np.int8).astype(np.float32)
    ds = (d * sc)[..., None]                                                 # [N, nb, 16, 1]
    q = (unpack_quants(blocks).astype(np.int8) - np.int8(32)).astype(np.float32)
    return (ds * q.reshape(n, nb, 16, SUB)).reshape(n, nb * BLOCK_ELEMS)


def quantize(W: np.ndarray) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, K/256*210].

    Per sub-block of 16: scale search over _CANDIDATES with a least-squares refit; the
    sub-block scale takes the sign that sends its largest-magnitude element to the -32
    end, so sc comes out with both signs. Per super-block: d = s_max / -128 (fp16; s_max
    the sub-block scale of largest magnitude, stored as sc = -128), sc = clip(round(s/d),
    -128, 127), then q = clip(round(x / (d*sc)), -32, 31) + 32 against the stored scales.
    """
    x, norm, xn, vmax = gc.normalised_subblocks(W, BLOCK_ELEMS, NAME, SUB)
    n, nb = x.shape[:2]
    best_s = gc.search_subblock_scales(xn, vmax, -_CANDIDATES, lambda t: np.clip(np.rint(t), -32, 31))
    best_s, d16 = gc.superblock_scale(best_s, norm, -128, NAME)
    d = d16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d != 0, best_s / d, 0)), -128, 127).astype(np.int8)
        ds = (d * sc.astype(np.float32))[..., None]                          # as dequantize
        q = np.where(ds != 0, np.rint(x / ds), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, nb, BLOCK_ELEMS)
    out = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    out[..., _QL:_SC] = pack_quants(q)
    out[..., _SC:_D] = sc.view(np.uint8)
    out[..., _D:] = gc.f16_bytes(d16)
    return out.reshape(n, -1)


def random_blocks(rng: np.random.Generator, n: int, k: int, *, d_range=None) -> np.ndarray:
    """Random valid blocks [n, k/256*210]: ql, qh and the int8 scales random (-128 included),
    d any finite fp16 (or in d_range)."""
    blocks = gc.random_bytes(rng, n, k, BLOCK_ELEMS, BLOCK_BYTES, NAME)
    gc.put_f16_bits(blocks, _D, gc.random_f16_bits(rng, blocks.shape[:2], d_range))
    return blocks.reshape(n, -1)
