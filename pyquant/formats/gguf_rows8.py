"""GGUF "rows8" layout: the numpy reference (specification) of qg_gguf_repack's CPU layout.

The CPU tier's rows kernel reads 8 weight rows a pass (src/cpu/int8_rows.h). In the .gguf
blocks those are 8 streams a row stride apart; the rows8 layout puts the blocks of each 8
consecutive rows side by side, block by block, so that a pass reads one stream (the
mechanism of ggml's CPU "repack" buffers: rows grouped once, at load time, for the kernel).
Blocks are moved whole: every bit is kept, and the CPU tier's results are the block layout's,
bit for bit. N is padded to a multiple of 8 with zero blocks (scale 0: they add nothing).

  plane   uint8 [ceil(N / 8), K / block_elems, 8, block_bytes]
          [g, b, r] = block b of row 8 g + r   (src/formats/gguf_rows8.h)
"""
from __future__ import annotations

import numpy as np

ROWS = 8  # rows side by side: the ymm rows kernel's pass


def plane_shape(n: int, k: int, block_elems: int, block_bytes: int) -> tuple:
    return (-(-n // ROWS), k // block_elems, ROWS, block_bytes)


def pack(raw: np.ndarray, block_elems: int, block_bytes: int) -> np.ndarray:
    """The rows8 plane (flat uint8) of the .gguf blocks raw [N, (K / block_elems) * block_bytes]."""
    n, row_bytes = raw.shape
    nb = row_bytes // block_bytes
    n_pad = -(-n // ROWS) * ROWS
    rows = np.zeros((n_pad, nb, block_bytes), np.uint8)
    rows[:n] = np.asarray(raw, np.uint8).reshape(n, nb, block_bytes)
    return np.ascontiguousarray(rows.reshape(n_pad // ROWS, ROWS, nb, block_bytes).transpose(0, 2, 1, 3)).reshape(-1)


def unpack(plane: np.ndarray, n: int, k: int, block_elems: int, block_bytes: int) -> np.ndarray:
    """The .gguf blocks uint8 [N, (K / block_elems) * block_bytes] of a rows8 plane."""
    g, nb, rows, bb = plane_shape(n, k, block_elems, block_bytes)
    blocks = np.asarray(plane, np.uint8).reshape(g, nb, rows, bb).transpose(0, 2, 1, 3).reshape(g * rows, nb * bb)
    return np.ascontiguousarray(blocks[:n])
