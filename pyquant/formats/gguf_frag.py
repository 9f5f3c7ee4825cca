"""GGUF "frag" layout: the numpy reference (specification) of qg_gguf_repack.

The .gguf blocks are what files ship. The frag layout is the one-time repack that the W4A16
frag decode and prefill kernels read (pyquant.formats.int4_frag, docs/w4a16-layout.md). Q4_0
so far: its weight d * (q - 8) is exactly a W4A16 weight of G = 32, symmetric (zero-point 8),
whose group scale is the block's fp16 d, so the two planes are

  w       int32 [RB, KT, 32, 4]        int4_frag.pack_nibbles of the codes q [N, K] (0..15)
  scales  float16 [RB, KC, 8, 4, 2]    int4_frag.pack_scales of d [N, K/32], bit for bit

(RB = Np/16, KT = Kp/64, KC = Kp/128; N padded to 16 rows and K to 128 with q = 0 and scale 0,
which add exactly nothing). Nothing is rounded: unpack(repack(raw)) == raw for finite and
non-finite d alike. The library's CPU repack (src/gguf_layout.cpp) and GPU repack
(hip/w4a16_repack.hip) must produce these bytes; docs/gguf-layout.md, "The frag layout".
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc
from . import int4_frag as _frag
from . import q4_0 as _q4_0

__all__ = ["FORMATS", "GROUP", "plane_shapes", "repack", "unpack"]

FORMATS = ("q4_0",)   # the GGUF formats with a frag layout
GROUP = 32            # one scale per 32 elements: the Q4_0 block


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} has no frag layout yet ({', '.join(FORMATS)} only)")


def plane_shapes(fmt: str, n: int, k: int) -> dict[str, tuple]:
    """Shapes of the two planes (int32 words, float16 scales) of an [n, k] weight."""
    _check_format(fmt)
    shapes = _frag.plane_shapes(n, k, GROUP)
    return {"w": shapes["qweight"], "scales": shapes["scales"]}


def repack(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """.gguf blocks uint8 [N, K/32 * 18] -> (w int32 [RB, KT, 32, 4], scales float16 [RB, KC, 8, 4, 2])."""
    _check_format(fmt)
    blocks = gc.check_raw(raw, _q4_0.BLOCK_BYTES, _q4_0.NAME)
    n, nb, _ = blocks.shape
    codes = _q4_0.unpack_quants(blocks).reshape(n, nb * _q4_0.BLOCK_ELEMS)
    d = np.ascontiguousarray(blocks[..., 0:2]).view("<u2")[..., 0]   # [N, nb] fp16 bits, moved as integers
    return _frag.pack_nibbles(codes), _frag.pack_scales(d, nb * _q4_0.BLOCK_ELEMS, GROUP).view(np.float16)


def unpack(fmt: str, w: np.ndarray, scales: np.ndarray, n: int, k: int) -> np.ndarray:
    """Inverse of repack: the .gguf blocks uint8 [N, K/32 * 18]."""
    _check_format(fmt)
    if k % GROUP:
        raise ValueError(f"k={k} is not a multiple of the {GROUP}-element q4_0 block")
    codes = _frag.unpack_nibbles(w, n, k).reshape(n, k // GROUP, GROUP)
    d = _frag.unpack_scales(np.asarray(scales).view("<u2"), n, k, GROUP)
    out = np.empty((n, k // GROUP, _q4_0.BLOCK_BYTES), np.uint8)
    out[..., 0:2] = np.ascontiguousarray(d).view(np.uint8).reshape(n, k // GROUP, 2)
    out[..., 2:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(n, -1)
