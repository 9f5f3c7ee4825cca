"""MXFP4 reference: OCP decode, quantize, and the GGUF block conversion (bit-exact with gguf)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from pyquant.formats import mxfp4

# OCP MX v1.0 E2M1 magnitudes, restated independently of the module under test.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _rng():
    seed = np.random.SeedSequence().entropy
    return np.random.default_rng(seed), seed


def _bits(a):
    """float32 bit patterns with -0.0 folded into +0.0: ggml's table has no -0 entry
    (kvalues_mxfp4[8] = 0), OCP code 8 is -0; both are zero in any product."""
    with np.errstate(over="ignore"):  # e >= 253 decodes past float32 range: +-inf both sides
        return (np.asarray(a, dtype=np.float32) + np.float32(0)).view(np.uint32)


def _assert_bits_equal(name, got, want, seed):
    got, want = _bits(got), _bits(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    assert bad.size == 0, (
        f"{name}: {len(bad)} mismatches, first at {tuple(bad[0])}: got "
        f"{got[tuple(bad[0])].view(np.float32)!r}, want {want[tuple(bad[0])].view(np.float32)!r}"
        f" (seed {seed})")


def _random_ocp(rng, n, nb, e_lo=0, e_hi=254):
    blocks = rng.integers(0, 256, size=(n, nb, 16), dtype=np.uint8)
    scales = rng.integers(e_lo, e_hi + 1, size=(n, nb), dtype=np.uint8)
    return blocks, scales


def _naive_decode(blocks, scales):
    """Per-element decode straight from the OCP definition."""
    n, nb, _ = blocks.shape
    out = np.empty((n, nb * 32), dtype=np.float64)
    for r in range(n):
        for b in range(nb):
            e = int(scales[r, b])
            for j in range(16):
                for half, code in ((0, blocks[r, b, j] & 0xF), (1, blocks[r, b, j] >> 4)):
                    mag = E2M1[code & 7]
                    val = (-mag if code & 8 else mag) * 2.0 ** (e - 127)
                    out[r, b * 32 + 2 * j + half] = np.nan if e == 255 else val
    return out


def test_dequantize_matches_definition():
    rng, seed = _rng()
    blocks, scales = _random_ocp(rng, 8, 12)
    blocks[0, 0] = np.arange(16, dtype=np.uint8) * 17  # every code in both nibbles
    scales[0, :4] = (0, 1, 127, 254)  # subnormal-producing and largest finite scales
    scales[1, 0] = 255  # NaN scale
    got = mxfp4.dequantize(blocks, scales)
    want = _naive_decode(blocks, scales)
    assert got.dtype == np.float32 and got.shape == (8, 12 * 32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan[1, :32].all()
    # exact: nonzero values are >= 0.5 * 2^-127, a float32 subnormal; values >= 2^128
    # (e >= 253) are +-inf in float32 on both sides
    _assert_bits_equal("dequantize", np.where(nan, 0, got), np.where(nan, 0, want), seed)
    # leading (expert) dimensions pass through
    stacked = mxfp4.dequantize(np.stack([blocks, blocks]), np.stack([scales, scales]))
    assert stacked.shape == (2, 8, 12 * 32)
    assert np.array_equal(stacked[1], got, equal_nan=True)


def test_quantize_scale_rule_and_nearest_value():
    rng, seed = _rng()
    n, k = 16, 256
    W = (rng.standard_normal((n, k)) * 2.0 ** rng.integers(-20, 20, size=(n, 1))).astype(np.float32)
    W[2, :32] = 0.0  # zero block
    blocks, scales = mxfp4.quantize(W)
    assert blocks.shape == (n, k // 32, 16) and scales.shape == (n, k // 32)
    x = W.astype(np.float64).reshape(n, k // 32, 32)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        want_e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0)
    assert np.array_equal(scales, want_e.astype(np.uint8)), f"seed {seed}"
    deq = mxfp4.dequantize(blocks, scales).astype(np.float64).reshape(x.shape)
    # nearest value: no representable value of the block's grid is strictly closer
    grid = np.array(E2M1 + tuple(-v for v in E2M1[1:]))
    cand = grid[None, None, None, :] * np.ldexp(1.0, scales.astype(int) - 127)[..., None, None]
    best = np.abs(cand - x[..., None]).min(-1)
    err = np.abs(deq - x)
    assert np.all(err <= best), f"not round-to-nearest (seed {seed})"
    # Bound QUARTER_AMAX: with unit = 2^(e-127), amax lies in [4, 8) units. Below 6 units
    # the error is at most half the widest gap (4 -> 6), 1 unit <= amax / 4; above 6 units
    # saturation costs amax - 6 units <= amax / 4 as well. So every error <= amax / 4.
    assert np.all(err.max(-1) <= 0.25 * amax), f"seed {seed}"
    # codes of zero results are +0 (code 0), never -0
    codes = mxfp4.decode_codes(blocks)
    assert not np.any(codes == 8)


def test_quantize_ties_go_to_even():
    rng, seed = _rng()
    e = int(rng.integers(100, 150))
    unit = 2.0 ** (e - 127)
    mids = (np.array(E2M1[1:]) + np.array(E2M1[:-1])) / 2  # every tie between neighbours
    row = np.zeros(32)
    row[0] = 4.0 * unit  # pins amax so that the block scale is 2^(e-127)
    row[1:1 + len(mids)] = mids * unit
    row[8:8 + len(mids)] = -mids * unit
    blocks, scales = mxfp4.quantize(row.reshape(1, 32).astype(np.float32))
    assert scales[0, 0] == e
    codes = mxfp4.decode_codes(blocks)[0, 0]
    tie_codes = np.concatenate([codes[1:1 + len(mids)], codes[8:8 + len(mids)]])
    # even = mantissa bit 0 of the E2M1 code (OCP v1.0 section 6.3: roundTiesToEven)
    assert np.all(tie_codes & 1 == 0), f"tie codes {tie_codes} (seed {seed})"
    # and each tie still lands on one of its two neighbours (half a gap away)
    deq = mxfp4.dequantize(blocks, scales)[0].astype(np.float64)
    half_gap = np.diff(np.array(E2M1)) / 2 * unit
    assert np.array_equal(np.abs(np.abs(deq[1:1 + len(mids)]) - mids * unit), half_gap)
    assert np.array_equal(np.abs(np.abs(deq[8:8 + len(mids)]) - mids * unit), half_gap)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="k=48 is not a positive multiple"):
        mxfp4.quantize(np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        mxfp4.quantize(np.full((2, 32), np.inf, np.float32))
    with pytest.raises(ValueError, match=r"scales shape \(2, 3\) does not match"):
        mxfp4.dequantize(np.zeros((2, 2, 16), np.uint8), np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="not a multiple of the 17-byte"):
        mxfp4.from_gguf_blocks(np.zeros((2, 33), np.uint8))


def _random_gguf(rng, n, nb):
    raw = rng.integers(0, 256, size=(n, nb, 17), dtype=np.uint8)
    # ggml decodes e = 255 as 2^127 where OCP says NaN: compare on finite scales only
    raw[..., 0] = rng.integers(0, 255, size=(n, nb), dtype=np.uint8)
    return raw.reshape(n, nb * 17)


def test_gguf_blocks_dequantize_bit_exact_with_gguf():
    rng, seed = _rng()
    raw = _random_gguf(rng, 12, 9)
    blocks, scales = mxfp4.from_gguf_blocks(raw)
    assert blocks.shape == (12, 9, 16) and scales.shape == (12, 9)
    with np.errstate(over="ignore"):  # gguf's float32 multiply overflows for e >= 253, as ours
        want = gq.dequantize(raw, GGMLQuantizationType.MXFP4)
    _assert_bits_equal("gguf mxfp4", mxfp4.dequantize(blocks, scales), want, seed)
    assert np.array_equal(mxfp4.to_gguf_blocks(blocks, scales), raw)


def test_gguf_bytes_read_as_ocp_give_a_different_answer():
    """The layout mix-up DESIGN.md warns about is detectable: GGUF code bytes fed as OCP
    blocks put element j+16 next to element j, so most values land in the wrong place."""
    rng, seed = _rng()
    raw = _random_gguf(rng, 8, 6)
    with np.errstate(over="ignore"):
        truth = gq.dequantize(raw, GGMLQuantizationType.MXFP4)
    b = raw.reshape(8, 6, 17)
    wrong = mxfp4.dequantize(np.ascontiguousarray(b[..., 1:]), np.ascontiguousarray(b[..., 0]))
    differ = _bits(wrong) != _bits(truth)
    # random codes: an element matches by chance about 1/8 of the time; demand a majority
    assert differ.mean() > 0.5, f"only {differ.mean():.2f} of elements differ (seed {seed})"
    right = mxfp4.dequantize(*mxfp4.from_gguf_blocks(raw))
    _assert_bits_equal("converted", right, truth, seed)


def test_quantize_agrees_with_gguf_quantize():
    rng, seed = _rng()
    n, k = 16, 512
    W = (rng.standard_normal((n, k)) * rng.uniform(0.01, 10, size=(n, 1))).astype(np.float32)
    W[3, 32:64] = 0.0
    ours = mxfp4.to_gguf_blocks(*mxfp4.quantize(W))
    theirs = gq.quantize(W, GGMLQuantizationType.MXFP4)
    assert ours.shape == theirs.shape
    o = ours.reshape(n, k // 32, 17)
    t = theirs.reshape(n, k // 32, 17)
    assert np.array_equal(o[..., 0], t[..., 0]), f"E8M0 scales differ (seed {seed})"
    # Codes agree except on exact ties: gguf's argmin keeps the first (smaller magnitude)
    # candidate, OCP rounds ties to even. Exclude elements sitting exactly on a midpoint.
    oc = np.concatenate([o[..., 1:] & 15, o[..., 1:] >> 4], -1)
    tc = np.concatenate([t[..., 1:] & 15, t[..., 1:] >> 4], -1)
    unit = np.ldexp(1.0, o[..., 0].astype(int) - 127)[..., None]
    v = np.abs(W.astype(np.float64).reshape(n, k // 32, 32)) / unit
    mids = (np.array(E2M1[1:]) + np.array(E2M1[:-1])) / 2
    tie = np.isin(v, mids)
    mism = (oc != tc) & ~tie
    assert not mism.any(), f"{mism.sum()} codes differ off ties (seed {seed})"
