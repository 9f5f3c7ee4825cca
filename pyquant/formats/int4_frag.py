"""int4 W4A16 "frag" layout: the numpy reference (specification) of qg_w4a16_repack.

The canonical layout (pyquant.formats.int4) is what checkpoints ship. The frag layout is
the one-time repack that the GPU decode and prefill tiers read: every 16-byte load of a
lane IS its tensor-core A fragments, so the kernels never permute weights or activations.
docs/w4a16-layout.md explains the choices; this module is the exact definition, and the
library's CPU repack (src/w4a16_layout.cpp) and GPU repack kernel must produce these bytes.
The MXFP4 frag layout (pyquant.formats.mxfp4_frag) is this one for G = 32 without zeros:
it is built on pack_nibbles / pack_scales below.

Padding: N is padded to Np = 16 * ceil(N / 16) rows and K to Kp = 128 * ceil(K / 128)
(a multiple of every group size). Padded weights are q = 0 with zero-point 0 and scale 0,
so they contribute exactly 0 to any product with finite activations (the kernels read
activations past K as zeros).

Three planes (G = group size, GC = 128 / G groups per 128-k chunk, RB = Np / 16 row
blocks, KT = Kp / 64 k-tiles, KC = Kp / 128 k-chunks):

  qweight  int32 [RB, KT, 32 lanes, 4 words]            = Np * Kp / 8 words
      Tile (rb, kt) covers rows 16 rb .. 16 rb + 15 and k 64 kt .. 64 kt + 63. Lane
      l = 4 g + t (g = l // 4, t = l % 4) holds 4 words; word s is its A fragment of the
      mma.sync m16n8k16 / wgmma m64nNk16 k16 step s (PTX ISA, "Matrix fragments for
      mma.m16n8k16", .bf16/.f16 A row-major; wgmma's register A has the same layout per
      warp). Nibble j of word s holds q[row, k] with
          p = j % 4 (which 32-bit A register: a0..a3), h = j // 4 (low/high half),
          row = 16 rb + g + 8 * (p % 2),
          k   = 64 kt + 16 s + 2 t + h + 8 * (p // 2).
      So `(word >> 4p) & 0x000F000F` is A register p with its two 16-bit halves in order,
      the form the exponent-bias dequant trick wants (one lop3 + one fma per register).

      Worked table, one word (lane g, t; k relative to 64 kt + 16 s):
          nibble   0      1       2        3         4        5         6        7
          row      g      g+8     g        g+8       g        g+8       g        g+8
          k        2t     2t      2t+8     2t+8      2t+1     2t+1      2t+9     2t+9

  scales   16-bit [RB, KC, 8 (g), GC, 2]                = Np * Kp / G values
      Element (rb, kc, g, c, h) is the scale of row 16 rb + g + 8 h for group
      kc * GC + c (fp16 or bf16 bits, as given). Lane (g, t) finds the scales of both of its
      rows for all GC groups of a 128-k chunk in one contiguous 4 * GC-byte load.

  qzeros   uint8 [RB, KC, 8 (g), GC]                    = Np * Kp / (2 G) bytes
      Byte (rb, kc, g, c) = z[16 rb + g, grp] | z[16 rb + g + 8, grp] << 4, grp = kc * GC + c:
      zero-points stay 4-bit (the same bytes as the canonical qzeros, reordered). Absent
      for symmetric weights (z = 8).
"""
from __future__ import annotations

import numpy as np

from . import int4 as _int4

__all__ = ["ROW_BLOCK", "K_TILE", "K_CHUNK", "padded_shape", "plane_shapes", "repack", "unpack",
           "fragment_coords", "pack_nibbles", "unpack_nibbles", "pack_scales", "unpack_scales"]

ROW_BLOCK = 16   # rows of one fragment tile (the mma M)
K_TILE = 64      # k of one fragment tile: 4 k16 steps, 16 bytes per lane
K_CHUNK = 128    # k of one scale/zero record; K is padded to a multiple of it


def padded_shape(n: int, k: int) -> tuple[int, int]:
    """(Np, Kp): N rounded up to 16, K rounded up to 128."""
    return -(-n // ROW_BLOCK) * ROW_BLOCK, -(-k // K_CHUNK) * K_CHUNK


def plane_shapes(n: int, k: int, group_size: int) -> dict[str, tuple]:
    """Shapes of the three planes (element types: int32, scale dtype, uint8)."""
    g = _int4._check_group_size(group_size)
    np_, kp = padded_shape(n, k)
    rb, kt, kc, gc = np_ // ROW_BLOCK, kp // K_TILE, kp // K_CHUNK, K_CHUNK // g
    return {"qweight": (rb, kt, 32, 4), "scales": (rb, kc, 8, gc, 2), "qzeros": (rb, kc, 8, gc)}


def fragment_coords(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of every nibble of the qweight plane: two int64 arrays of shape
    [RB, KT, 32, 4, 8] (the last axis is the nibble j of a word), per the formula above."""
    np_, kp = padded_shape(n, k)
    rb = np.arange(np_ // ROW_BLOCK).reshape(-1, 1, 1, 1, 1)
    kt = np.arange(kp // K_TILE).reshape(1, -1, 1, 1, 1)
    lane = np.arange(32).reshape(1, 1, -1, 1, 1)
    s = np.arange(4).reshape(1, 1, 1, -1, 1)
    j = np.arange(8).reshape(1, 1, 1, 1, -1)
    g, t = lane // 4, lane % 4
    p, h = j % 4, j // 4
    row = ROW_BLOCK * rb + g + 8 * (p % 2) + 0 * (kt + s)
    kk = K_TILE * kt + 16 * s + 2 * t + h + 8 * (p // 2) + 0 * rb
    return row, kk


def _scale_coords(n: int, k: int, group_size: int):
    """(row, group) of every element of the scales plane [RB, KC, 8, GC, 2]."""
    rb_, kc_, _, gc_, _ = plane_shapes(n, k, group_size)["scales"]
    rb = np.arange(rb_).reshape(-1, 1, 1, 1, 1)
    kc = np.arange(kc_).reshape(1, -1, 1, 1, 1)
    g = np.arange(8).reshape(1, 1, -1, 1, 1)
    c = np.arange(gc_).reshape(1, 1, 1, -1, 1)
    h = np.arange(2).reshape(1, 1, 1, 1, -1)
    row = ROW_BLOCK * rb + g + 8 * h + 0 * (kc + c)
    grp = gc_ * kc + c + 0 * (rb + g + h)
    return row, grp


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """The qweight plane int32 [RB, KT, 32, 4] of the 4-bit values q [N, K] (0..15; any N,
    K a multiple of 8), padding 0. Shared with the MXFP4 frag layout (its E2M1 codes)."""
    n, k = q.shape
    np_, kp = padded_shape(n, k)
    q_pad = np.zeros((np_, kp), np.uint32)
    q_pad[:n, :k] = q
    row, kk = fragment_coords(n, k)
    nib = q_pad[row, kk]                                    # [RB, KT, 32, 4, 8]
    words = np.bitwise_or.reduce(nib << (np.arange(8, dtype=np.uint32) * 4), axis=-1)
    return words.astype(np.uint32).view(np.int32)


def unpack_nibbles(fq: np.ndarray, n: int, k: int) -> np.ndarray:
    """Inverse of pack_nibbles: the values uint8 [N, K] (padding dropped)."""
    np_, kp = padded_shape(n, k)
    fq = np.asarray(fq).reshape(np_ // ROW_BLOCK, kp // K_TILE, 32, 4).view(np.uint32)
    nib = (fq[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & np.uint32(15)
    row, kk = fragment_coords(n, k)
    q = np.zeros((np_, kp), np.uint8)
    q[row, kk] = nib
    return q[:n, :k]


def pack_scales(scales: np.ndarray, k: int, group_size: int) -> np.ndarray:
    """The scales plane [RB, KC, 8, GC, 2] of the per-group values scales [N, K/G] (any
    16-bit dtype, kept), padding 0."""
    n = scales.shape[0]
    np_, kp = padded_shape(n, k)
    s_pad = np.zeros((np_, kp // group_size), scales.dtype)
    s_pad[:n, : k // group_size] = scales
    srow, sgrp = _scale_coords(n, k, group_size)
    return np.ascontiguousarray(s_pad[srow, sgrp])


def unpack_scales(fs: np.ndarray, n: int, k: int, group_size: int) -> np.ndarray:
    """Inverse of pack_scales: [N, K/G] in the plane's dtype (padding dropped)."""
    fs = np.asarray(fs).reshape(plane_shapes(n, k, group_size)["scales"])
    np_, kp = padded_shape(n, k)
    srow, sgrp = _scale_coords(n, k, group_size)
    s_pad = np.zeros((np_, kp // group_size), fs.dtype)
    s_pad[srow, sgrp] = fs
    return np.ascontiguousarray(s_pad[:n, : k // group_size])


def repack(qweight: np.ndarray, scales: np.ndarray, qzeros, group_size: int):
    """Canonical (qweight [N, K/8] int32, scales [N, K/G], qzeros [N/8, K/G] or None) ->
    frag planes (qweight int32 [RB, KT, 32, 4], scales [RB, KC, 8, GC, 2] in the scale
    dtype, qzeros uint8 [RB, KC, 8, GC] or None)."""
    n, k, g = _int4._check_canonical(qweight, scales, qzeros, group_size)
    fq = pack_nibbles(_int4.unpack_k(qweight))
    fs = pack_scales(scales, k, g)
    fz = None
    if qzeros is not None:
        np_, kp = padded_shape(n, k)
        srow, sgrp = _scale_coords(n, k, g)
        z_pad = np.zeros((np_, kp // g), np.uint8)
        z_pad[:n, : k // g] = _int4.unpack_zeros(qzeros)
        lo, hi = z_pad[srow[..., 0], sgrp[..., 0]], z_pad[srow[..., 1], sgrp[..., 1]]
        fz = np.ascontiguousarray((lo | (hi << 4)).astype(np.uint8))
    return fq, fs, fz


def unpack(fq: np.ndarray, fs: np.ndarray, fz, n: int, k: int, group_size: int):
    """Inverse of repack: frag planes -> canonical (qweight, scales, qzeros or None)."""
    g = _int4._check_group_size(group_size)
    _int4._check_n(n)
    _int4._check_k(k, g)
    qweight = _int4.pack_k(unpack_nibbles(fq, n, k))
    scales = unpack_scales(fs, n, k, g)
    qzeros = None
    if fz is not None:
        np_, kp = padded_shape(n, k)
        srow, sgrp = _scale_coords(n, k, g)
        fz = np.asarray(fz).reshape(plane_shapes(n, k, g)["qzeros"])
        z_pad = np.zeros((np_, kp // g), np.uint8)
        z_pad[srow[..., 0], sgrp[..., 0]] = fz & 15
        z_pad[srow[..., 1], sgrp[..., 1]] = fz >> 4
        qzeros = _int4.pack_zeros(z_pad[:n, : k // g])
    return qweight, scales, qzeros
