"""MXFP4 (OCP Microscaling, E2M1 elements + E8M0 block scale): the numpy reference.

OCP layout, as GPT-OSS checkpoints ship it (include/quantgemm.h, qg_mxfp4_gemm_args):
    blocks [..., N, K/32, 16] uint8   byte j of a block holds element 2j in the low nibble
                                      and element 2j+1 in the high nibble
    scales [..., N, K/32]     uint8   E8M0: 2^(e - 127); e = 255 is NaN
E2M1 code c (OCP MX spec v1.0, section 5.3.3): bit 3 = sign, bits 0..2 index
    E2M1_VALUES = (0, 0.5, 1, 1.5, 2, 3, 4, 6); code 8 is -0.

Worked example of one OCP block byte vs one GGUF block byte (elements of the 32-block):
    OCP  byte j : low nibble = element 2j,  high nibble = element 2j + 1
    GGUF byte j : low nibble = element j,   high nibble = element j + 16
GGUF's mxfp4 block (ggml block_mxfp4, 17 bytes) is [e, qs[16]]. Its table kvalues_mxfp4 =
(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...) stores doubled values and its scale is halved
(ggml_e8m0_to_fp32_half(e) = 2^(e - 128)), so the SAME 4-bit code and the SAME e byte mean
the same value in both layouts; only the nibble positions differ. (ggml decodes e = 255 as
2^127 instead of NaN; finite scales e <= 254 agree.)
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BLOCK",
    "BLOCK_BYTES",
    "GGUF_BLOCK_BYTES",
    "E2M1_VALUES",
    "E8M0_NAN",
    "quantize",
    "dequantize",
    "decode_codes",
    "from_gguf_blocks",
    "to_gguf_blocks",
]

BLOCK = 32  # elements per block
BLOCK_BYTES = 16  # 32 E2M1 codes, two per byte
GGUF_BLOCK_BYTES = 17  # E8M0 byte + 16 code bytes
E8M0_BIAS = 127
E8M0_NAN = 255
E2M1_EMAX = 2  # exponent of the largest E2M1 magnitude, 6 = 1.5 * 2^2
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
_E2M1_SIGNED = np.concatenate([E2M1_VALUES, -E2M1_VALUES])  # index = 4-bit code
# Midpoints between consecutive E2M1 magnitudes, for round-to-nearest.
_MIDPOINTS = (E2M1_VALUES[1:].astype(np.float64) + E2M1_VALUES[:-1]) / 2.0


def _check_u8(name: str, a, min_ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise ValueError(f"{name} must be uint8, got {a.dtype}")
    if a.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {a.shape}")
    return a


def _check_blocks_scales(blocks, scales):
    blocks = _check_u8("blocks", blocks, 2)
    scales = _check_u8("scales", scales, 1)
    if blocks.shape[-1] != BLOCK_BYTES:
        raise ValueError(f"blocks last dimension is {blocks.shape[-1]}, expected {BLOCK_BYTES}")
    if scales.shape != blocks.shape[:-1]:
        raise ValueError(
            f"scales shape {scales.shape} does not match blocks shape {blocks.shape[:-1]} + (16,)"
        )
    return blocks, scales


def decode_codes(blocks: np.ndarray) -> np.ndarray:
    """blocks [..., nb, 16] uint8 -> E2M1 codes [..., nb, 32] uint8 (OCP nibble order)."""
    lo = blocks & np.uint8(0x0F)
    hi = blocks >> np.uint8(4)
    return np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], BLOCK)


def _encode_codes(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes [..., nb, 32] -> OCP blocks [..., nb, 16]."""
    pairs = codes.reshape(*codes.shape[:-1], BLOCK_BYTES, 2).astype(np.uint8)
    return pairs[..., 0] | (pairs[..., 1] << np.uint8(4))


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """OCP MXFP4 -> float32 [..., N, K]: E2M1 value * 2^(e - 127), computed with np.ldexp.

    Scale byte 255 gives NaN for the whole block; code 8 gives -0.0."""
    blocks, scales = _check_blocks_scales(blocks, scales)
    vals = _E2M1_SIGNED[decode_codes(blocks)]  # float32 [..., nb, 32]
    exp = scales.astype(np.int32)[..., None] - E8M0_BIAS
    # float32, exact: the smallest nonzero product, 0.5 * 2^-127, is a float32 subnormal;
    # the largest ones (|value| >= 2^128, e >= 253) exceed float32 and become +-inf, as in
    # any float32 decode of MXFP4 (ggml's included).
    with np.errstate(over="ignore"):
        out = np.ldexp(vals, exp)
    out = np.where(scales[..., None] == E8M0_NAN, np.float32(np.nan), out).astype(np.float32)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)


def quantize(W: np.ndarray):
    """W [..., N, K] float -> (blocks uint8 [..., N, K/32, 16], scales uint8 [..., N, K/32]).

    Per block of 32 (OCP MX spec v1.0, section 6.3): e = floor(log2(amax)) - 2 + 127, clamped
    to 0..254 (amax = 0 gives e = 0, as gguf does), so amax / 2^(e-127) lies in [4, 8); each
    element is rounded to the nearest E2M1 value of x / 2^(e-127), ties to even (the code
    with mantissa bit 0), saturating at 6. A zero result is always stored as code 0 (+0).
    """
    if not isinstance(W, np.ndarray):
        raise ValueError(f"W must be a numpy array, got {type(W).__name__}")
    if W.ndim < 2:
        raise ValueError(f"W must have at least 2 dimensions [N, K], got shape {W.shape}")
    k = W.shape[-1]
    if k == 0 or k % BLOCK != 0:
        raise ValueError(f"k={k} is not a positive multiple of the MXFP4 block size {BLOCK}")
    x = np.asarray(W, dtype=np.float64).reshape(*W.shape[:-1], k // BLOCK, BLOCK)
    if not np.all(np.isfinite(x)):
        raise ValueError("W holds non-finite values (inf or nan)")
    amax = np.abs(x).max(axis=-1)
    _, ex = np.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1)  =>  floor(log2(amax)) = ex - 1
    e = np.where(amax > 0, (ex - 1) - E2M1_EMAX + E8M0_BIAS, 0)
    e = np.clip(e, 0, E8M0_NAN - 1).astype(np.uint8)
    v = np.abs(np.ldexp(x, -(e.astype(np.int32)[..., None] - E8M0_BIAS)))  # exact in float64
    left = np.searchsorted(_MIDPOINTS, v, side="left")  # midpoints < v
    right = np.searchsorted(_MIDPOINTS, v, side="right")  # midpoints <= v
    # On an exact tie, left and right differ by one: keep the even index (mantissa bit 0).
    mag = np.where((left != right) & (left % 2 == 1), right, left).astype(np.uint8)
    sign = ((x < 0) & (mag != 0)).astype(np.uint8) << np.uint8(3)
    return _encode_codes(mag | sign), e


def from_gguf_blocks(raw: np.ndarray):
    """GGUF mxfp4 rows raw [..., N, (K/32)*17] -> OCP (blocks [..., N, K/32, 16], scales [..., N, K/32])."""
    raw = _check_u8("raw", raw, 1)
    if raw.shape[-1] % GGUF_BLOCK_BYTES != 0:
        raise ValueError(
            f"raw row of {raw.shape[-1]} bytes is not a multiple of the {GGUF_BLOCK_BYTES}-byte "
            f"GGUF mxfp4 block"
        )
    b = raw.reshape(*raw.shape[:-1], raw.shape[-1] // GGUF_BLOCK_BYTES, GGUF_BLOCK_BYTES)
    scales = np.ascontiguousarray(b[..., 0])
    qs = b[..., 1:]
    codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)  # elements 0..31
    return np.ascontiguousarray(_encode_codes(codes)), scales


def to_gguf_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """OCP (blocks [..., N, K/32, 16], scales [..., N, K/32]) -> GGUF raw [..., N, (K/32)*17]."""
    blocks, scales = _check_blocks_scales(blocks, scales)
    codes = decode_codes(blocks)
    qs = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    out = np.concatenate([scales[..., None], qs], axis=-1)
    return np.ascontiguousarray(out.reshape(*out.shape[:-2], out.shape[-2] * GGUF_BLOCK_BYTES))
