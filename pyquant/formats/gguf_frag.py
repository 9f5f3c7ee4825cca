"""GGUF "frag" layout: the numpy reference (specification) of qg_gguf_repack.

The .gguf blocks are what files ship. The frag layout is the one-time repack that the W4A16
frag decode and prefill kernels read (pyquant.formats.int4_frag, docs/w4a16-layout.md). Both
planes keep every bit of the blocks (nothing is rounded: unpack(repack(raw)) == raw for finite
and non-finite fp16 fields alike); N is padded to 16 rows and K to 128 with code 0 and scale
or record 0, which add exactly nothing.

q4_0: its weight d * (q - 8) is exactly a W4A16 weight of G = 32, symmetric (zero-point 8),
whose group scale is the block's fp16 d, so the two planes are

  w       int32 [RB, KT, 32, 4]        int4_frag.pack_nibbles of the codes q [N, K] (0..15)
  scales  float16 [RB, KC, 8, 4, 2]    int4_frag.pack_scales of d [N, K/32], bit for bit

q4_K: its weight (d * sc) * q - (dmin * m) (the gguf package's float32 steps) has 6-bit
integers sc, m per 32 elements and fp16 d, dmin per 256. The weights plane is q4_0's (the
codes q in element order); the scales plane is uint16, one flat array of two parts:

  records  [RB, KC, 8, 4, 2]      int4_frag.pack_scales of sc | m << 8 [N, K/32]
  d, dmin  [RB, KC/2, 8, 2, 2]    [rb, sb, g, f, h] = the fp16 bits of d (f = 0) or dmin
                                  (f = 1) of row 16 rb + g + 8 h, super-block sb

so that a lane (row g of a 16-row block) finds its rows' records where the W4A16 scales are
and, per 256 elements, one 8-byte word pair: d of rows g | g + 8 << 16, then dmin the same way.

iq4_xs: its weight (d * (ls - 32)) * KVALUES_IQ4NL[q] (q a 4-bit index into the codebook, ls
6-bit per 32, d fp16 per 256) takes q4_K's planes: the indices as the codes, ls as the record
(high byte 0), d as q4_K's d and 0 where q4_K's dmin is (4.625 bits a weight against the
blocks' 4.25). Its nibbles are placed by register (place_codebook_nibbles below).

q8_0: its weight d * q (q an int8 code, d fp16 per 32) keeps q4_0's scales plane (float16,
each block's d) and takes a byte plane for the codes, twice the nibble plane's size:

  w       int32 [RB, KB, 32, 4]        pack_bytes of the codes q [N, K] (int8, as uint8 bytes)

KB = Kp/32: tile (rb, kb) is rows 16 rb.., k 32 kb.. (one q8_0 block a row, two k16 steps);
lane l = 4 g + t holds 4 words, word w the A register pair of k16 step w // 2: byte b of word
w is register p = 2 (w % 2) + b % 2 (a0..a3 of mma.m16n8k16), half h = b // 2, so

  row = 16 rb + g + 8 (b % 2),   k = 32 kb + 16 (w // 2) + 2 t + b // 2 + 8 (w % 2)

and `w & 0x00ff00ff` is register 2 (w % 2) with its two bytes in order, `(w >> 8) & 0x00ff00ff`
the next (one shift a word, then the exponent-bias trick on bytes). 8.5 bits a weight, as the
blocks. A 128-k chunk of a lane's row block is 4 of its 16-byte loads, load c holding group c.

q6_K: its weight (d * sc) * (q - 32) (q a 6-bit code, sc an int8 scale per 16 elements, d fp16
per 256) takes q8_0's byte plane for the codes less 32 (int8 -32..31, as uint8 bytes) and q4_K's
scales plane: the record of 32 elements j holds the int8 scales of its two halves, sc[2j] (low
byte) | sc[2j + 1] << 8 (their bits), d where q4_K's d is and 0 for dmin. 8.625 bits a weight
against the blocks' 6.5625: the 6-bit codes widened to bytes, so that the kernels read them as
q8_0's (docs/gguf-layout.md says what a tighter plane would cost).

iq3_xxs: its weight ((d * (0.5 + ls)) * 0.5) * grid * sign (grid one of the 8 magnitudes 4, 12,
.., 52, 62 that IQ3XXS_GRID gives each element 4 at a time, sign from the 7 stored bits of each
8 elements and their parity, ls 4-bit per 32, d fp16 per 256) is a 4-bit code per element,
IQ3_CODEBOOK's index (grid - 4) // 8 | sign << 3, and takes iq4_xs's planes: those codes, ls as
the record, d and 0 (4.625 bits a weight against the blocks' 3.0625: a grid entry's 4 magnitudes
span two lanes' k pairs of the A fragment, so each element keeps its own code). Every block
round-trips; unpack refuses planes no block gives (4 magnitudes not in the grid, 8 signs of odd
parity, a record above 15).

The codebook formats (iq4_xs, iq3_xxs) place their nibbles by A register: pack_nibbles' nibble j
of a word (register p = j % 4, half h = j // 4) moves to nibble 2 p + h, so that byte p of a word
holds register p's two codes and the GPU decode looks up the pair of values by one byte
(place_codebook_nibbles; hip/mma.h codebook_pairs).

(RB = Np/16, KT = Kp/64, KC = Kp/128, KB = Kp/32.) The library's CPU repack (src/gguf_layout.cpp) and GPU
repack (hip/w4a16_repack.hip) must produce these bytes; docs/gguf-layout.md, "The frag layout".
"""
from __future__ import annotations

import numpy as np

from . import gguf_common as gc
from . import int4_frag as _frag
from . import iq3_xxs as _iq3_xxs
from . import iq4_xs as _iq4_xs
from . import q4_0 as _q4_0
from . import q4_k as _q4_k
from . import q6_k as _q6_k
from . import q8_0 as _q8_0
from .iq_tables import IQ3XXS_GRID, KSIGNS_IQ2XS

__all__ = ["FORMATS", "AUTO_FRAG", "GROUP", "IQ3_CODEBOOK", "CODEBOOK_FORMATS", "plane_shapes", "scales_dtype", "repack",
           "unpack", "split_superblocks", "decode_magnitudes", "byte_coords", "pack_bytes", "unpack_bytes",
           "code_nibble", "place_codebook_nibbles", "unplace_codebook_nibbles"]

FORMATS = ("q8_0", "q4_0", "q4_K", "iq4_xs", "q6_K", "iq3_xxs")   # the GGUF formats with a frag layout
# Those that GGUFWeight.to_device(layout="auto") repacks for a GPU context: the formats whose frag
# kernels have run and passed their tests on a GPU (q8_0's and q6_K's since 2026-12-04: the H200;
# iq3_xxs's since 2026-12-06).
AUTO_FRAG = ("q4_0", "q8_0", "q4_K", "iq4_xs", "q6_K", "iq3_xxs")
_SCALED = {"q4_0": _q4_0, "q8_0": _q8_0}       # d per 32 (the float16 scales plane)
_SUPER = {"q4_K": _q4_k, "iq4_xs": _iq4_xs, "q6_K": _q6_k, "iq3_xxs": _iq3_xxs}  # with the super-block part
# iq3_xxs's code c -> its value: the grid magnitude index c & 7, negative where c & 8
_IQ3_MAGS = np.array([4, 12, 20, 28, 36, 44, 52, 62], np.int8)
IQ3_CODEBOOK = np.concatenate([_IQ3_MAGS, -_IQ3_MAGS])
# the grid index of 4 magnitude indices m0 | m1 << 3 | m2 << 6 | m3 << 9, -1 where the grid has none
_IQ3_KEYS = np.sum(((IQ3XXS_GRID.astype(np.int64) - 4) >> 3) << (3 * np.arange(4)), axis=-1)
_IQ3_INDEX = np.full(4096, -1, np.int16)
_IQ3_INDEX[_IQ3_KEYS] = np.arange(256)
BYTE_PLANE = ("q8_0", "q6_K")  # the formats whose codes are a byte plane (pack_bytes)
CODEBOOK_FORMATS = ("iq4_xs", "iq3_xxs")  # the formats whose nibbles are placed by register (module docstring)
GROUP = 32                   # one scale (q4_0) or record (q4_K) per 32 elements


def code_nibble(j: int) -> int:
    """The nibble of a codebook format's word that holds pack_nibbles' nibble j (module docstring)."""
    return 2 * (j % 4) + j // 4


def _move_nibbles(words: np.ndarray, src, dst) -> np.ndarray:
    """Each word's nibble src(j) moved to nibble dst(j), j = 0..7."""
    w = np.asarray(words).view(np.uint32)
    out = np.zeros_like(w)
    for j in range(8):
        out |= ((w >> np.uint32(4 * src(j))) & np.uint32(15)) << np.uint32(4 * dst(j))
    return out.view(np.int32)


def place_codebook_nibbles(words: np.ndarray) -> np.ndarray:
    """pack_nibbles' words -> the codebook formats' placement (nibble j at nibble code_nibble(j))."""
    return _move_nibbles(words, lambda j: j, code_nibble)


def unplace_codebook_nibbles(words: np.ndarray) -> np.ndarray:
    """The inverse of place_codebook_nibbles."""
    return _move_nibbles(words, code_nibble, lambda j: j)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} has no frag layout yet ({', '.join(FORMATS)} only)")


def scales_dtype(fmt: str) -> np.dtype:
    """The scales plane's dtype: float16 (q4_0's and q8_0's d) or uint16 (the super-block formats'
    integer records and fp16 bits)."""
    _check_format(fmt)
    return np.dtype(np.float16 if fmt in _SCALED else np.uint16)


def _q4_k_sb_shape(n: int, k: int) -> tuple:
    rb, kc = _frag.plane_shapes(n, k, GROUP)["scales"][:2]
    return (rb, kc // 2, 8, 2, 2)


def plane_shapes(fmt: str, n: int, k: int) -> dict[str, tuple]:
    """Shapes of the two planes (int32 words; the scales plane in scales_dtype) of an [n, k] weight."""
    _check_format(fmt)
    shapes = _frag.plane_shapes(n, k, GROUP)
    rb, kt = shapes["qweight"][:2]
    w = (rb, 2 * kt, 32, 4) if fmt in BYTE_PLANE else shapes["qweight"]
    if fmt in _SCALED:
        return {"w": w, "scales": shapes["scales"]}
    return {"w": w, "scales": (int(np.prod(shapes["scales"])) + int(np.prod(_q4_k_sb_shape(n, k))),)}


def byte_coords(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of every byte of a byte plane (q8_0, q6_K): two int64 arrays [RB, KB, 32, 4, 4]
    (the last axis is the byte b of a word), per the formula above."""
    np_, kp = _frag.padded_shape(n, k)
    rb = np.arange(np_ // 16).reshape(-1, 1, 1, 1, 1)
    kb = np.arange(kp // 32).reshape(1, -1, 1, 1, 1)
    lane = np.arange(32).reshape(1, 1, -1, 1, 1)
    w = np.arange(4).reshape(1, 1, 1, -1, 1)
    b = np.arange(4).reshape(1, 1, 1, 1, -1)
    g, t = lane // 4, lane % 4
    row = 16 * rb + g + 8 * (b % 2) + 0 * (kb + w)
    kk = 32 * kb + 16 * (w // 2) + 2 * t + b // 2 + 8 * (w % 2) + 0 * rb
    return row, kk


def pack_bytes(q: np.ndarray) -> np.ndarray:
    """The byte plane (q8_0's, q6_K's) int32 [RB, KB, 32, 4] of the byte codes q [N, K] (any 8-bit
    dtype, bits kept), padding 0."""
    n, k = q.shape
    np_, kp = _frag.padded_shape(n, k)
    q_pad = np.zeros((np_, kp), np.uint32)
    q_pad[:n, :k] = np.asarray(q).view(np.uint8)
    row, kk = byte_coords(n, k)
    words = np.bitwise_or.reduce(q_pad[row, kk] << (np.arange(4, dtype=np.uint32) * 8), axis=-1)
    return words.astype(np.uint32).view(np.int32)


def unpack_bytes(fw: np.ndarray, n: int, k: int) -> np.ndarray:
    """Inverse of pack_bytes: the codes uint8 [N, K] (padding dropped)."""
    np_, kp = _frag.padded_shape(n, k)
    fw = np.asarray(fw).reshape(np_ // 16, kp // 32, 32, 4).view(np.uint32)
    row, kk = byte_coords(n, k)
    q = np.zeros((np_, kp), np.uint8)
    q[row, kk] = (fw[..., None] >> (np.arange(4, dtype=np.uint32) * 8)) & np.uint32(255)
    return q[:n, :k]


_Q6_SC, _Q6_D = 192, 208  # q6_K's scales[16] and d


def _q6_k_codes(blocks: np.ndarray) -> np.ndarray:
    """q6_K blocks [N, nb, 210] -> the byte codes q - 32 [N, nb * 256] (int8 -32..31 as uint8)."""
    n = blocks.shape[0]
    return (_q6_k.unpack_quants(blocks).astype(np.int16) - 32).astype(np.int8).view(np.uint8).reshape(n, -1)


def _fields(blocks: np.ndarray, off: int) -> np.ndarray:
    """The fp16 field at byte `off` of every block as its uint16 bits (moved as integers)."""
    return np.ascontiguousarray(blocks[..., off:off + 2]).view("<u2")[..., 0]


def _q4_k_sb_pack(d: np.ndarray, dmin: np.ndarray, n: int, k: int) -> np.ndarray:
    """[N, K/256] d and dmin bits -> the super-block part [RB, KC/2, 8, 2, 2] (padding 0)."""
    rb_, sb_ = _q4_k_sb_shape(n, k)[:2]
    pad = np.zeros((2, rb_ * 16, sb_), np.uint16)
    pad[0, :n], pad[1, :n] = d, dmin
    # [f, rb, h, g, sb] -> [rb, sb, g, f, h]
    return np.ascontiguousarray(pad.reshape(2, rb_, 2, 8, sb_).transpose(1, 4, 3, 0, 2))


def _iq3_xxs_codes(blocks: np.ndarray) -> np.ndarray:
    """iq3_xxs blocks [N, nb, 98] -> the 4-bit codes [N, nb * 256]: magnitude index | sign << 3."""
    n, nb, _ = blocks.shape
    idx, sidx, _ = _iq3_xxs.unpack(blocks)
    mag = ((IQ3XXS_GRID[idx] - 4) >> 3).reshape(n, nb, 8, 4, 8)              # (sub, group, elem)
    sign = (KSIGNS_IQ2XS[sidx][..., None] >> np.arange(8, dtype=np.uint8)) & 1  # [N, nb, 8, 4, 8]
    return (mag | (sign << 3)).astype(np.uint8).reshape(n, nb * 256)


def _iq3_xxs_blocks(codes: np.ndarray, rec: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The inverse: codes [N, K], records [N, K/32], d bits [N, K/256] -> blocks [N, K/256, 98];
    ValueError where no block gives these planes."""
    n, k = codes.shape
    nb = k // 256
    q = codes.astype(np.int64).reshape(n, nb, 64, 4)
    idx = _IQ3_INDEX[np.sum((q & 7) << (3 * np.arange(4)), axis=-1)]         # [N, nb, 64]
    signs = np.sum((q.reshape(n, nb, 8, 4, 8) >> 3) << np.arange(8), axis=-1)  # [N, nb, 8, 4]
    parity = np.bitwise_xor.reduce((signs[..., None] >> np.arange(8)) & 1, axis=-1)
    rec = rec.reshape(n, nb, 8).astype(np.int64)
    for bad, what in ((idx < 0, "4 magnitudes outside the grid"), (parity != 0, "8 signs of odd parity"),
                      (rec > 15, "a record above 15")):
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise ValueError(f"row {row} is not an iq3_xxs frag weight ({what}): no block gives these planes")
    words = (np.sum((signs & 127) << (7 * np.arange(4)), axis=-1) | (rec << 28)).astype("<u4")
    out = np.empty((n, nb, 98), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    out[..., 2:66] = idx.astype(np.uint8)
    out[..., 66:] = words.view(np.uint8).reshape(n, nb, 32)
    return out


def _records(fmt: str, blocks: np.ndarray) -> np.ndarray:
    """[N, nb, bytes] -> the 16-bit records [N, nb, 8] of a super-block format."""
    if fmt == "iq3_xxs":
        return _iq3_xxs.unpack(blocks)[2].astype(np.uint16)
    if fmt == "q4_K":
        sc, m = _q4_k.unpack_scales_mins(blocks)
        return sc.astype(np.uint16) | (m.astype(np.uint16) << 8)
    if fmt == "q6_K":  # the int8 scales of sub-blocks 2j, 2j + 1 as bytes
        return np.ascontiguousarray(blocks[..., _Q6_SC:_Q6_D]).view("<u2")
    return _iq4_xs.unpack_scales(blocks).astype(np.uint16)


def repack(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """.gguf blocks uint8 [N, row_bytes] -> (w int32 [RB, KT, 32, 4], the scales plane)."""
    _check_format(fmt)
    if fmt in _SCALED:
        spec = _SCALED[fmt]
        blocks = gc.check_raw(raw, spec.BLOCK_BYTES, spec.NAME)
        n, nb, _ = blocks.shape
        k = nb * spec.BLOCK_ELEMS
        scales = _frag.pack_scales(_fields(blocks, 0), k, GROUP).view(np.float16)
        if fmt == "q8_0":
            return pack_bytes(np.ascontiguousarray(blocks[..., 2:]).reshape(n, k)), scales
        return _frag.pack_nibbles(_q4_0.unpack_quants(blocks).reshape(n, k)), scales
    spec = _SUPER[fmt]
    blocks = gc.check_raw(raw, spec.BLOCK_BYTES, spec.NAME)
    n, nb, _ = blocks.shape
    k = nb * spec.BLOCK_ELEMS
    records = _frag.pack_scales(_records(fmt, blocks).reshape(n, nb * 8), k, GROUP)
    dmin = _fields(blocks, 2) if fmt == "q4_K" else np.zeros((n, nb), np.uint16)
    sb = _q4_k_sb_pack(_fields(blocks, _Q6_D if fmt == "q6_K" else 0), dmin, n, k)
    scales = np.concatenate([records.reshape(-1), sb.reshape(-1)])
    if fmt == "q6_K":
        return pack_bytes(_q6_k_codes(blocks)), scales
    codes = _iq3_xxs_codes(blocks) if fmt == "iq3_xxs" else spec.unpack_quants(blocks).reshape(n, k)
    w = _frag.pack_nibbles(codes)
    return (place_codebook_nibbles(w) if fmt in CODEBOOK_FORMATS else w), scales


def split_superblocks(scales: np.ndarray, n: int, k: int):
    """A super-block format's scales plane -> (records [N, K/32] uint16, d [N, K/256] uint16 bits,
    second field [N, K/256] uint16 bits: q4_K's dmin, the others' 0), padding dropped."""
    flat = np.asarray(scales).reshape(-1).view(np.uint16)
    nrec = int(np.prod(_frag.plane_shapes(n, k, GROUP)["scales"]))
    rec = _frag.unpack_scales(flat[:nrec], n, k, GROUP)
    rb_, sb_ = _q4_k_sb_shape(n, k)[:2]
    pad = flat[nrec:].reshape(rb_, sb_, 8, 2, 2).transpose(3, 0, 4, 2, 1).reshape(2, rb_ * 16, sb_)
    return rec, np.ascontiguousarray(pad[0, :n, : k // 256]), np.ascontiguousarray(pad[1, :n, : k // 256])


def unpack(fmt: str, w: np.ndarray, scales: np.ndarray, n: int, k: int) -> np.ndarray:
    """Inverse of repack: the .gguf blocks uint8 [N, row_bytes]."""
    _check_format(fmt)
    spec = _SUPER.get(fmt) or _SCALED[fmt]
    if k % spec.BLOCK_ELEMS:
        raise ValueError(f"k={k} is not a multiple of the {spec.BLOCK_ELEMS}-element {fmt} block")
    nb = k // spec.BLOCK_ELEMS
    out = np.empty((n, nb, spec.BLOCK_BYTES), np.uint8)
    if fmt in _SCALED:
        d = _frag.unpack_scales(np.asarray(scales).view("<u2"), n, k, GROUP)
        out[..., 0:2] = np.ascontiguousarray(d).view(np.uint8).reshape(n, nb, 2)
        if fmt == "q8_0":
            out[..., 2:] = unpack_bytes(w, n, k).reshape(n, nb, GROUP)
        else:
            codes = _frag.unpack_nibbles(w, n, k).reshape(n, nb, GROUP)
            out[..., 2:] = codes[..., :16] | (codes[..., 16:] << 4)
        return out.reshape(n, -1)
    rec, d, second = split_superblocks(scales, n, k)
    if fmt == "q6_K":
        q = (unpack_bytes(w, n, k).view(np.int8).astype(np.int16) + 32).astype(np.uint8)
        out[..., :_Q6_SC] = _q6_k.pack_quants(q.reshape(n, nb, 256))
        out[..., _Q6_SC:_Q6_D] = np.ascontiguousarray(rec).view(np.uint8).reshape(n, nb, 16)
        out[..., _Q6_D:] = d.view(np.uint8).reshape(n, nb, 2)
        return out.reshape(n, -1)
    codes = _frag.unpack_nibbles(unplace_codebook_nibbles(w) if fmt in CODEBOOK_FORMATS else w, n, k)
    if fmt == "iq3_xxs":
        return _iq3_xxs_blocks(codes, rec, d).reshape(n, -1)
    out[..., 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    if fmt == "q4_K":
        out[..., 2:4] = second.view(np.uint8).reshape(n, nb, 2)
        out[..., 4:16] = _q4_k.pack_scales_mins((rec & 0xFF).reshape(n, nb, 8), (rec >> 8).reshape(n, nb, 8))
        q = codes.reshape(n, nb, 4, 2, 32)                               # sub-block 2p + i, element
        out[..., 16:] = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(n, nb, 128)
    else:
        out[..., 2:8] = _iq4_xs.pack_scales((rec & 0xFF).reshape(n, nb, 8))
        q = codes.reshape(n, nb, 8, 32)                                  # sub-block j, element
        out[..., 8:] = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, nb, 128)
    return out.reshape(n, -1)


def decode_magnitudes(fmt: str, raw: np.ndarray) -> np.ndarray:
    """float64 [N, K]: per weight, the magnitude of the terms the frag decode sums. q4_0, q8_0:
    |w| (their weights d * (q - 8), d * q are exact). q4_K: |d sc q| + |dmin m|: the decode multiplies the
    group's sum of q * x by d * sc and the group's sum of x by dmin * m and subtracts (one mma
    against a ones fragment gives the x sums), so its float32 rounding scales with both terms,
    not with their difference (bf16_tile.accumulation_bound's `terms`). iq4_xs, q6_K, iq3_xxs: |w|
    (the codebook values and q - 32 are exact, d * (ls - 32), d * sc or (d * (0.5 + ls)) * 0.5
    applied to a group's float32 sum)."""
    _check_format(fmt)
    if fmt in ("q8_0", "q4_0", "iq4_xs", "q6_K", "iq3_xxs"):
        spec = {"q8_0": _q8_0, "q4_0": _q4_0, "iq4_xs": _iq4_xs, "q6_K": _q6_k, "iq3_xxs": _iq3_xxs}[fmt]
        return np.abs(spec.dequantize(raw).astype(np.float64))
    blocks = gc.check_raw(raw, _q4_k.BLOCK_BYTES, _q4_k.NAME)
    n, nb, _ = blocks.shape
    d = gc.f16_field(blocks, 0).astype(np.float64)[..., None, None]
    dmin = gc.f16_field(blocks, 2).astype(np.float64)[..., None, None]
    sc, m = _q4_k.unpack_scales_mins(blocks)
    q = _q4_k.unpack_quants(blocks).astype(np.float64)                # [N, nb, 8, 32]
    mag = np.abs(d * sc[..., None] * q) + np.abs(dmin * m[..., None])
    return mag.reshape(n, nb * _q4_k.BLOCK_ELEMS)
