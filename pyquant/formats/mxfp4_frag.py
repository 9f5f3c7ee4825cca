"""MXFP4 "frag" layout: the numpy reference (specification) of qg_mxfp4_repack.

By definition (but for the bit placement below) the W4A16 frag layout (pyquant.formats.int4_frag, docs/w4a16-layout.md) of
the [N, K] array of 4-bit E2M1 codes for group size G = 32, symmetric (no zero plane):

  blocks  int32 [RB, KT, 32 lanes, 4 words]   int4_frag.pack_nibbles of the codes [N, K],
                                              each word's bits then placed (place_bits)
  scales  bf16  [RB, KC, 8, 4, 2]             int4_frag.pack_scales of the scales [N, K/32],
                                              each E8M0 byte e as the bf16 value 2^(e - 127)
  RB = ceil(N / 16), KT = Kp / 64, KC = Kp / 128, Kp = K rounded up to 128.

Each blocks-plane word then has its 32 bits placed for the GPU decode (place_bits): code
bit c (0 mantissa, 1-2 exponent, 3 sign) of the word's code j (A register p = j % 4, half
h = j // 4 of the W4A16 word) moves to bit (TARGET[c] + 16 h - rot(p, c)) mod 32, TARGET =
6, 7, 8, 15, rot = 6, 2, 12 for p = 0, 1, 2 and, for p = 3, 8 for bit 0 and 0 for the rest.
Rotating a word left by rot(p, .) then puts pair p's sign at bit 15 (31) and its magnitude
at bits 6..8 (22..24), where bf16 keeps its top mantissa bit and two low exponent bits: the
kernel (hip/mma.h, e2m1_word) takes pairs 0..2 apart with one rotate and one mask each and
pair 3 with a rotate and two masks (docs/w4a16-layout.md, "MXFP4").

The E8M0 -> bf16 conversion is exact: e in 1..254 is the normal bf16 with biased exponent
e and mantissa 0 (bits e << 7); e = 0 is 2^-127, the bf16 subnormal 0x0040; e = 255, the MX
NaN, is the quiet NaN 0x7fc0. Padding (N to 16, K to 128) is code 0 with scale 0, which
adds exactly nothing. A bf16 scale is two bytes where E8M0 is one: 4.5 instead of 4.25 bits
per weight, so that the W4A16 kernels' 16-bit scale records serve MXFP4 unchanged.

Stacked experts (the MoE frag layout of qg_moe_repack, moe_repack below): each expert's
[N, K] rows split into `parts` matrices of N / parts rows (w2: 1; w13: 2, gate then up, the
gate rows being rows 2i (interleaved) or i < N/2 (concat) of the canonical expert), each
repacked as above and the planes stacked expert-major along RB: part h of expert e is row
blocks (e * parts + h) * RBp ... + RBp - 1, RBp = ceil(N / parts / 16).

The canonical blocks [N, K/32, 16] (byte j = element 2j low nibble, 2j + 1 high) read as
little-endian int32 words ARE the W4A16 canonical qweight [N, K/8] of the codes; this module
does not use that shortcut (it decodes the codes with pyquant.formats.mxfp4), so the tests
check the library's CPU repack, which does, against an independent statement.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from . import int4_frag as _frag
from . import mxfp4 as _mxfp4

__all__ = ["GROUP", "BF16_OF_E0", "BF16_NAN", "TARGET", "plane_shapes", "bit_position", "place_bits",
           "unplace_bits", "e8m0_to_bf16_bits", "bf16_bits_to_e8m0", "repack", "unpack", "moe_part_rows",
           "moe_plane_shapes", "moe_repack", "moe_unpack"]

GROUP = _mxfp4.BLOCK   # 32: one E8M0 scale per block = the frag group size
BF16_OF_E0 = 0x0040    # 2^-127 as a bf16 subnormal: mantissa bit 6 of 2^-126 * 2^-1
BF16_NAN = 0x7fc0      # e = 255 (NaN in MX)
_BF16 = np.dtype(ml_dtypes.bfloat16)


TARGET = (6, 7, 8, 15)  # bf16 bits of the code's mantissa, two exponent bits, sign


def _rot(p: int, c: int) -> int:
    return (6, 2, 12)[p] if p < 3 else (8 if c == 0 else 0)


def bit_position(j: int, c: int) -> int:
    """Bit of a blocks-plane word that holds bit c of the word's code j (module docstring)."""
    p, h = j % 4, j // 4
    return (TARGET[c] + 16 * h - _rot(p, c)) % 32


def place_bits(words: np.ndarray) -> np.ndarray:
    """W4A16-order plane words (code j in bits 4j..4j+3) -> the MXFP4 bit placement."""
    w = np.asarray(words).view(np.uint32)
    out = np.zeros_like(w)
    for j in range(8):
        for c in range(4):
            out |= ((w >> np.uint32(4 * j + c)) & np.uint32(1)) << np.uint32(bit_position(j, c))
    return out.view(np.int32)


def unplace_bits(words: np.ndarray) -> np.ndarray:
    """The inverse of place_bits."""
    w = np.asarray(words).view(np.uint32)
    out = np.zeros_like(w)
    for j in range(8):
        for c in range(4):
            out |= ((w >> np.uint32(bit_position(j, c))) & np.uint32(1)) << np.uint32(4 * j + c)
    return out.view(np.int32)


def plane_shapes(n: int, k: int) -> dict[str, tuple]:
    """Shapes of the two planes (element types: int32, bfloat16)."""
    shapes = _frag.plane_shapes(n, k, GROUP)
    return {"blocks": shapes["qweight"], "scales": shapes["scales"]}


def e8m0_to_bf16_bits(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> uint16 bf16 bits of 2^(e - 127), exactly (module docstring)."""
    e = np.asarray(e, np.uint8)
    bits = e.astype(np.uint16) << np.uint16(7)
    bits = np.where(e == 0, np.uint16(BF16_OF_E0), bits)
    return np.where(e == _mxfp4.E8M0_NAN, np.uint16(BF16_NAN), bits).astype(np.uint16)


def bf16_bits_to_e8m0(bits: np.ndarray) -> np.ndarray:
    """The inverse on every value e8m0_to_bf16_bits gives: 0x0040 -> 0, 0x7fc0 -> 255, else
    bits >> 7."""
    bits = np.asarray(bits, np.uint16)
    e = (bits >> np.uint16(7)).astype(np.uint8)
    e = np.where(bits == BF16_OF_E0, np.uint8(0), e)
    return np.where(bits == BF16_NAN, np.uint8(_mxfp4.E8M0_NAN), e).astype(np.uint8)


def repack(blocks: np.ndarray, scales: np.ndarray):
    """Canonical (blocks [N, K/32, 16] uint8, scales [N, K/32] uint8) -> frag planes (blocks
    int32 [RB, KT, 32, 4], scales bfloat16 [RB, KC, 8, 4, 2])."""
    blocks, scales = _mxfp4._check_blocks_scales(blocks, scales)
    if blocks.ndim != 3:
        raise ValueError(f"blocks must be [N, K/32, 16] (a dense weight), got shape {blocks.shape}")
    n, nb = scales.shape
    codes = _mxfp4.decode_codes(blocks).reshape(n, nb * GROUP)
    fb = place_bits(_frag.pack_nibbles(codes))
    fs = _frag.pack_scales(e8m0_to_bf16_bits(scales), nb * GROUP, GROUP)
    return fb, fs.view(_BF16)


def unpack(fb: np.ndarray, fs: np.ndarray, n: int, k: int):
    """Inverse of repack: frag planes -> canonical (blocks [N, K/32, 16], scales [N, K/32])."""
    if n <= 0 or k <= 0 or k % GROUP:
        raise ValueError(f"(n, k) = ({n}, {k}): both positive, k a multiple of {GROUP}")
    codes = _frag.unpack_nibbles(unplace_bits(fb), n, k).reshape(n, k // GROUP, GROUP)
    bits = _frag.unpack_scales(np.asarray(fs).view(np.uint16), n, k, GROUP)
    return np.ascontiguousarray(_mxfp4._encode_codes(codes)), bf16_bits_to_e8m0(bits)


def moe_part_rows(n: int, parts: int, gate_up: str, h: int) -> np.ndarray:
    """Canonical rows (within one expert of N rows) of part h: gate (h = 0) and up (h = 1) of
    w13 as gate_up ("interleaved" / "concat") lays them out; the one part of w2 is every row."""
    if parts == 1:
        return np.arange(n)
    if gate_up == "interleaved":
        return np.arange(h, n, 2)
    if gate_up == "concat":
        return np.arange(h * (n // 2), (h + 1) * (n // 2))
    raise ValueError(f"gate_up={gate_up!r} is not interleaved or concat")


def moe_plane_shapes(experts: int, n: int, k: int, parts: int) -> dict[str, tuple]:
    """Shapes of the two stacked planes: each part's planes with E * parts times its RB."""
    one = plane_shapes(n // parts, k)
    return {name: (experts * parts * shape[0],) + tuple(shape[1:]) for name, shape in one.items()}


def moe_repack(blocks: np.ndarray, scales: np.ndarray, parts: int, gate_up: str = "interleaved"):
    """Canonical experts (blocks [E, N, K/32, 16], scales [E, N, K/32]) -> the stacked frag
    planes of qg_moe_repack (module docstring)."""
    if blocks.ndim != 4 or scales.ndim != 3 or blocks.shape[:3] != scales.shape:
        raise ValueError(f"blocks [E, N, K/32, 16] and scales [E, N, K/32] expected, got {blocks.shape}, "
                         f"{scales.shape}")
    e, n = scales.shape[:2]
    if parts not in (1, 2) or n % parts:
        raise ValueError(f"parts={parts} must be 1 or 2 and divide N={n}")
    fbs, fss = [], []
    for ex in range(e):
        for h in range(parts):
            rows = moe_part_rows(n, parts, gate_up, h)
            fb, fs = repack(np.ascontiguousarray(blocks[ex, rows]), np.ascontiguousarray(scales[ex, rows]))
            fbs.append(fb)
            fss.append(fs)
    return np.concatenate(fbs), np.concatenate(fss)


def moe_unpack(fb: np.ndarray, fs: np.ndarray, experts: int, n: int, k: int, parts: int,
               gate_up: str = "interleaved"):
    """Inverse of moe_repack: stacked planes -> canonical (blocks [E, N, K/32, 16], scales
    [E, N, K/32])."""
    shapes = moe_plane_shapes(experts, n, k, parts)
    fb = np.asarray(fb).reshape(shapes["blocks"])
    fs = np.asarray(fs).reshape(shapes["scales"])
    rbp = shapes["blocks"][0] // (experts * parts)
    blocks = np.zeros((experts, n, k // GROUP, 16), np.uint8)
    scales = np.zeros((experts, n, k // GROUP), np.uint8)
    for ex in range(experts):
        for h in range(parts):
            i = (ex * parts + h) * rbp
            b, s = unpack(fb[i:i + rbp], fs[i:i + rbp], n // parts, k)
            rows = moe_part_rows(n, parts, gate_up, h)
            blocks[ex, rows], scales[ex, rows] = b, s
    return blocks, scales
