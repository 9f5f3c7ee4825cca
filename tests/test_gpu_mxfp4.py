"""MXFP4 dense GEMM on the GPU tiers against the numpy reference (marked `gpu`: skipped
where no GPU context can be created, and where the build has no GPU tier for mxfp4).

The GPU tiers read the frag layout (pyquant.formats.mxfp4_frag, made by to_device on a GPU
context through qg_mxfp4_repack): "decode_frag" (M <= 16 per launch) and "prefill_wgmma"
(larger M), each forced by name in turn as well as run under auto (STYLE 3). Cases: M in
1, 2, 4, 8, 16, 17, 64, 300, 517, 262 (a fused 272-token tile); N in 8, 136, 4104 (one padded row block, a partial row
tile, many tiles); K in 32 (one block, padded to 128), 96 (padded), 4096 + 32; fp16 and
bf16 x; y in x's dtype and fp32; a bias. One-hot activations give the decoded weight bit
for bit; a block with e = 255 gives NaN; guard bands around every output; the GPU repack
writes the numpy planes byte for byte; a canonical weight on a GPU context is served or
refused naming the repack. Fresh random inputs (seed printed on failure).
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import one_hot_case
from test_api_cpu import random_mxfp4
from pyquant import _lib, tiers
from pyquant.formats import mxfp4_frag, reference

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
U32 = 2.0 ** -24
UNIT_ROUNDOFF = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}
M_VALUES = (1, 2, 4, 8, 16, 17, 64, 300, 517, 262)
E_FINITE = (118, 130)   # E8M0 scales 2^-9 .. 2^3: finite sums far from overflow
K_OF_N = {8: 32, 136: 96, 4104: 4096 + 32}   # one block; three (padded); a real K


def mxfp4_bound(k: int, y_dtype) -> float:
    """GPU MXFP4: each E2M1 value (at most 2 significant bits, |v| <= 6) is exact in fp16 and
    bf16 and x is exact, so every product is exact in fp32; the 32 products of a block are
    summed in fp32 (tensor-core order), times the scale 2^(e - 127) (a power of two: exact),
    and the blocks summed in fp32 -- W4A16's argument for G = 32 (tests/test_gpu_gemm.py,
    w4a16_bound): u_y for rounding y plus about k * u32 for accumulation (random walk,
    sum|x w| ~ sqrt(k)|y|), x4 margin; the bias is one more fp32 addition (absorbed)."""
    return UNIT_ROUNDOFF[np.dtype(y_dtype)] + 4 * k * U32


def _gpu_tiers() -> list[str]:
    return [t for t in tiers.tiers().get("mxfp4", []) if tiers.backend_of(t) in ("cuda", "hip")]


def _need():
    if not _gpu_tiers():
        pytest.skip(f"this build has no GPU tier for mxfp4: {pyquant.build_info()}")


def _tier(suffix: str) -> str | None:
    return next((t for t in _gpu_tiers() if t.endswith(f":{suffix}")), None)


def random_x(rng, m, k, dtype):
    x = rng.standard_normal((m, k))
    return np.where(np.abs(x) < 1e-3, 0.5, x).astype(np.float32).astype(dtype)


def _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt):
    g = poisoned_output(m, n, y_dt, device_ctx=gpu_ctx)
    pyquant.gemm(xd, wd, out=g.y)
    return g.value()


def _force(gpu_ctx, tier, call):
    """call() with `tier` forced by name ("auto": none); the forcing is undone afterwards."""
    gpu_ctx.set_tier("mxfp4", tier)
    try:
        return call()
    finally:
        gpu_ctx.set_tier("mxfp4", "auto")


def _each_tier(gpu_ctx, call):
    """call(tier) under auto and under every GPU tier forced by name; a forced tier that
    cannot serve the call answers QG_ERR_UNSUPPORTED naming itself (skipped), auto must run.
    Returns the tiers that ran."""
    ran = []
    for tier in ["auto"] + _gpu_tiers():
        try:
            _force(gpu_ctx, tier, lambda: call(tier))
        except pyquant.QuantGemmError as e:
            if tier == "auto" or e.status != _lib.Status.QG_ERR_UNSUPPORTED or tier not in str(e):
                raise
            continue
        ran.append(tier)
    return ran


@pytest.mark.parametrize("n", sorted(K_OF_N), ids=lambda n: f"n{n}")
@pytest.mark.parametrize("x_dt", [F16, BF16], ids=["fp16", "bf16"])
def test_mxfp4_gpu(rng, gpu_ctx, x_dt, n, poisoned_output, assert_close):
    """Every tier at every M against the reference, on the frag weight to_device makes; y
    alternates between x's dtype and fp32, the bias between none and one."""
    _need()
    k = K_OF_N[n]
    plain = random_mxfp4(rng, (n,), k, E_FINITE)
    biased = plain.with_bias(rng.standard_normal(n).astype(np.float32).astype(BF16))
    w_deq = plain.dequantize()
    devs = {False: plain.to_device(gpu_ctx), True: biased.to_device(gpu_ctx)}
    assert devs[False].layout == "frag" and devs[True].layout == "frag"
    ran = set()
    for i, m in enumerate(M_VALUES):
        y_dt, with_bias = (x_dt, F32)[i % 2], (i // 2) % 2 == 1
        x = random_x(rng, m, k, x_dt)
        ref = reference.gemm(x, w_deq, biased.bias if with_bias else None)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

        def check(tier):
            y = _guarded_gemm(gpu_ctx, poisoned_output, xd, devs[with_bias], m, n, y_dt)
            assert_close(y, ref, mxfp4_bound(k, y_dt),
                         f"mxfp4 tier={tier} x={x_dt} y={y_dt} bias={with_bias} m={m} n={n} k={k}")
        ran.update(_each_tier(gpu_ctx, check))
    assert _tier("decode_frag") in ran, f"the decode tier never ran: {ran}"


def test_mxfp4_gpu_one_hot(rng, gpu_ctx, assert_bitwise_equal):
    """x = one-hot rows (a single 1.0 at column k): each block's fp32 sum is one exact E2M1
    value and the scale 2^(e - 127) is exact, so y (fp32) is e2m1(code[n, k]) * 2^(e[n, k/32]
    - 127), the decoded weight, bit for bit on every tier, for every finite E8M0 byte whose
    products stay finite in fp32 (e <= 252: 6 * 2^125 < 2^128), subnormals (e = 0, 1)
    included. The sign of an exactly zero sum (code 8 is -0) depends on the summation
    order, which is not specified: zeros are compared as +0."""
    _need()
    for n, k in ((136, 256), (24, 96)):
        w = random_mxfp4(rng, (n,), k, e_range=(0, 252))
        w.scales.reshape(-1)[:3] = (0, 1, 252)   # the host arrays of w: the extremes, before to_device
        wd = w.to_device(gpu_ctx)
        for m_extra, x_dt in ((0, F16), (k, BF16)):   # M = K (decode and prefill sizes), M = 2K
            x, want = one_hot_case(rng, w.dequantize(), m_extra)
            xd = pyquant.DeviceArray.from_numpy(x.astype(x_dt), gpu_ctx)

            def check(tier):
                y = pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy() + np.float32(0)
                assert_bitwise_equal(y, want, f"one-hot mxfp4 tier={tier} n={n} k={k} m={len(x)} x={x_dt}")
            _each_tier(gpu_ctx, check)


def test_mxfp4_gpu_wide_prefill_tile(rng, gpu_ctx, poisoned_output, assert_close, assert_bitwise_equal):
    """bf16 prefill above 128 tokens (N = 132 row tiles of 128, M = 520: three token tiles,
    the last ragged; src/gpu/w4a16_prefill_launch.cpp picks the 256-token tile there, the
    W4A16 test of it asserts the choice): the reference within the bound, and one-hot rows
    bit for bit."""
    _need()
    n, k, m = 128 * 132, 256, 520
    w = random_mxfp4(rng, (n,), k, E_FINITE)
    wd = w.to_device(gpu_ctx)
    w_deq = w.dequantize()
    x = random_x(rng, m, k, BF16)
    y = _guarded_gemm(gpu_ctx, poisoned_output, pyquant.DeviceArray.from_numpy(x, gpu_ctx), wd, m, n, F32)
    assert_close(y, reference.gemm(x, w_deq), mxfp4_bound(k, F32), f"mxfp4 wide prefill m={m} n={n} k={k}")
    x1, want = one_hot_case(rng, w_deq, m - k)
    y1 = pyquant.gemm(pyquant.DeviceArray.from_numpy(x1.astype(BF16), gpu_ctx), wd, out_dtype=np.float32)
    assert_bitwise_equal(y1.to_numpy() + np.float32(0), want, f"one-hot mxfp4 wide prefill m={len(x1)}")


def test_mxfp4_gpu_nan_scale(rng, gpu_ctx, poisoned_output):
    """A block with e = 255 (NaN in MX) makes its row of y NaN; the other rows stay finite."""
    _need()
    n, k = 40, 224
    w = random_mxfp4(rng, (n,), k, E_FINITE)
    nan_rows = [3, 17, 39]
    for r, blk in zip(nan_rows, (0, 3, 6)):
        w.scales[r, blk] = 255
    wd = w.to_device(gpu_ctx)
    for m in (1, 16, 17, 64):
        x = random_x(rng, m, k, BF16)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

        def check(tier):
            y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, F32)
            finite = np.setdiff1d(np.arange(n), nan_rows)
            assert np.isnan(y[:, nan_rows]).all(), f"tier={tier} m={m}: an e = 255 row is not NaN"
            assert np.isfinite(y[:, finite]).all(), f"tier={tier} m={m}: NaN outside the e = 255 rows"
        _each_tier(gpu_ctx, check)


@pytest.mark.parametrize("n,k", [(40, 224), (8, 32), (4104, 4096 + 32)])
def test_mxfp4_gpu_repack_matches_reference(rng, gpu_ctx, n, k):
    """qg_mxfp4_repack on the GPU writes the numpy reference's planes byte for byte (every
    E8M0 byte 0..255 and every code; N and K that need padding, and a real size), and the
    canonical arrays read back from the planes are the original ones."""
    _need()
    w = random_mxfp4(rng, (n,), k, e_range=(0, 255))
    count = min(256, w.scales.size)
    w.scales.reshape(-1)[:count] = np.arange(count, dtype=np.uint8)
    r = w.to_device(gpu_ctx, layout="frag")
    fb, fs = mxfp4_frag.repack(w.blocks, w.scales)
    np.testing.assert_array_equal(r.blocks.to_numpy().reshape(fb.shape), fb)
    np.testing.assert_array_equal(r.scales.to_numpy().view(np.uint16).reshape(fs.shape), fs.view(np.uint16))
    blocks, scales = r.canonical_arrays()
    np.testing.assert_array_equal(blocks, w.blocks)
    np.testing.assert_array_equal(scales, w.scales)
    # the same kernel through repack() of a weight already on the device
    c = w.to_device(gpu_ctx, layout="canonical")
    assert c.layout == "canonical" and c.is_device
    r2 = c.repack("frag")
    np.testing.assert_array_equal(r2.blocks.to_numpy().reshape(fb.shape), fb)
    with pytest.raises(pyquant.InvalidArgumentError, match="repack to canonical runs on host weights"):
        r2.repack("canonical")


def test_mxfp4_gpu_canonical_weight(rng, gpu_ctx, poisoned_output, assert_close):
    """The GPU tiers read the frag layout; a canonical weight on a GPU context is either
    served (right, within the bound) or refused with a sentence that names the way to the
    frag layout (qg_mxfp4_repack / to_device), writing nothing."""
    _need()
    n, k, m = 136, 96, 5
    w = random_mxfp4(rng, (n,), k, E_FINITE)
    wd = w.to_device(gpu_ctx, layout="canonical")
    x = random_x(rng, m, k, BF16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    g = poisoned_output(m, n, F32, device_ctx=gpu_ctx)
    try:
        pyquant.gemm(xd, wd, out=g.y)
    except pyquant.QuantGemmError as e:
        assert "qg_mxfp4_repack" in str(e) or "to_device" in str(e), str(e)
        gpu_ctx.synchronize()
        assert g.unchanged(), "a refused call wrote into the device output"
        return
    assert_close(g.value(), reference.gemm(x, w.dequantize()), mxfp4_bound(k, F32), "canonical on the GPU")


def test_mxfp4_gpu_fp32_x_is_refused(rng, gpu_ctx, poisoned_output):
    """The GPU tiers take fp16 or bf16 x; fp32 x on a GPU context is refused, nothing written."""
    _need()
    n, k = 24, 96
    wd = random_mxfp4(rng, (n,), k, E_FINITE).to_device(gpu_ctx)
    xd = pyquant.DeviceArray.from_numpy(random_x(rng, 3, k, F32), gpu_ctx)
    g = poisoned_output(3, n, F32, device_ctx=gpu_ctx)
    with pytest.raises(pyquant.QuantGemmError):
        pyquant.gemm(xd, wd, out=g.y)
    gpu_ctx.synchronize()
    assert g.unchanged(), "a refused call wrote into the device output"


def test_mxfp4_gpu_decode_and_prefill_agree(rng, gpu_ctx, assert_close):
    """Around the crossover both tiers compute the same function: at M = 16 and 17 the
    decode and prefill results differ by no more than their two bounds together."""
    _need()
    decode, prefill = _tier("decode_frag"), _tier("prefill_wgmma")
    if decode is None or prefill is None:
        pytest.skip(f"this build lacks one of the mxfp4 GPU tiers: {_gpu_tiers()}")
    n, k = 520, 1024
    wd = random_mxfp4(rng, (n,), k, E_FINITE).to_device(gpu_ctx)
    for m in (16, 17):
        xd = pyquant.DeviceArray.from_numpy(random_x(rng, m, k, BF16), gpu_ctx)
        got = {}
        for t in (decode, prefill):
            try:
                got[t] = _force(gpu_ctx, t, lambda: pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy())
            except pyquant.QuantGemmError as e:
                if e.status != _lib.Status.QG_ERR_UNSUPPORTED:
                    raise
                pytest.skip(f"{t} does not run here: {e}")
        assert_close(got[prefill], got[decode], 2 * mxfp4_bound(k, F32), f"decode vs prefill m={m}")


def test_mxfp4_gpu_repack_refuses_unaligned_blocks(rng, gpu_ctx):
    """The device repack reads the canonical blocks as 32-bit words: a blocks pointer that
    is not 4-byte aligned is refused by name on a GPU context, and nothing is written."""
    _need()
    n, k = 24, 96
    w = random_mxfp4(rng, (n,), k, E_FINITE)
    raw = pyquant.DeviceArray.from_numpy(np.concatenate([np.zeros(1, np.uint8), w.blocks.reshape(-1)]), gpu_ctx)
    sc = pyquant.DeviceArray.from_numpy(w.scales, gpu_ctx)
    shapes = mxfp4_frag.plane_shapes(n, k)
    out_b = pyquant.DeviceArray.from_numpy(np.zeros(shapes["blocks"], np.int32), gpu_ctx)
    out_s = pyquant.DeviceArray.from_numpy(np.zeros(shapes["scales"], np.uint16), gpu_ctx)
    a = _lib.qg_mxfp4_repack_args(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, n=n, k=k, blocks=raw.ptr + 1,
                                  scales=sc.ptr, out_blocks=out_b.ptr, out_scales=out_s.ptr)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"blocks=0x[0-9a-f]+ is not aligned to 4 bytes "
                                                           r"\(the GPU repack reads them as 32-bit words\)"):
        _lib.qg_mxfp4_repack(gpu_ctx.handle, ctypes.byref(a), None)
    gpu_ctx.synchronize()
    assert not out_b.to_numpy().any() and not out_s.to_numpy().any(), "a refused repack wrote its output"
