"""GPU tiers against the numpy reference (marked `gpu`: skipped where no GPU context can be
created, e.g. CI and this project's development machines).

W4A16 for every x dtype x group size x {sym, asym} at decode M (1..16) and prefill M
(17, 33), N in 8, 24, 4104; the prefill tier with bf16 x and bf16 scales against the weights
it multiplies (each rounded once to bf16: pyquant.formats.int4.dequantize_folded), its
256-token tile included; GGUF for every format at M in 1..8 and N in 1, 7, 4099; every
tier the build offers forced in turn (STYLE 3: a rarely chosen tier must still be right);
one-hot activations on the device; guard bands around device outputs; a float16
zero-point tensor refused. Fresh random inputs (seed printed on failure).
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import Guarded, assert_elementwise, one_hot_case, registry_formats
from pyquant import _lib, tiers
from pyquant import formats as F
from pyquant.formats import bf16_tile, gguf_frag, int4, int4_frag, int8_act, reference

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
U32 = 2.0 ** -24
UNIT_ROUNDOFF = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}
GGUF_FORMATS = registry_formats("gguf")
TIERS = {"w4a16": (0, 1, 2, 3), "gguf": (0, 1, 2, 3, 4, 5)}  # qg_context_set_option values (gguf 4, 5: frag)


def w4a16_bound(k: int, y_dtype) -> float:
    """GPU W4A16: the decoded weight (q - z) is exact in fp16/bf16 and x is exact, products
    and sums are fp32 (mma or FMA) and the group scale is applied in fp32, so the CPU-tier
    argument holds: u_y for rounding y plus about k * u32 for accumulation (random walk,
    sum|x w| ~ sqrt(k)|y|), x4 margin; split-K adds one fp32 addition per split (absorbed)."""
    return UNIT_ROUNDOFF[np.dtype(y_dtype)] + 4 * k * U32


# The GGUF float tier (gguf_tier 1) keeps x exact in fp32: the same argument.
gguf_float_bound = w4a16_bound


FUSED_BN = 272  # hip/w4a16_kernels.h PF_FUSED_BN (a 256-token tile and 16 tokens more)
FUSED_TILES = 2  # src/gpu/w4a16_prefill_launch.cpp kFusedTiles


def fused_tail_on() -> bool:
    return os.environ.get("QG_EXP_FUSED_TAIL", "1") != "0"


def fused_tiles(m: int) -> int:
    """Token tiles of FUSED_BN a folded call of m tokens runs on, or 0 where it runs on
    256-token tiles: plan_launches takes the fused tile where it needs fewer token tiles than
    256 does, at most FUSED_TILES (257 .. 272 and 513 .. 544 tokens)."""
    fused = -(-m // FUSED_BN)
    return fused if fused < -(-m // 256) and fused <= FUSED_TILES and fused_tail_on() else 0


def prefill_decode_tail(m: int, folds: bool) -> int:
    """The first token of a prefill call (auto tile) that runs on decode_frag, else m: the
    plan (src/gpu/w4a16_prefill_launch.cpp, plan_launches) takes a token tile of 64 up to 64
    tokens, 128 up to 128 or where the scale does not fold into A, else 256, and runs a
    ragged tail of at most 16 tokens past the last full tile on decode_frag, except where
    the call fits fused tiles of 272 (fused_tiles; the wide-tile test asserts it from the
    QG_LOG lines; QG_EXP_FUSED_TAIL=0 turns it off)."""
    tile = 64 if m <= 64 else 128 if m <= 128 or not folds else 256
    tail = m % tile
    if tile == 256 and fused_tiles(m):
        return m
    return m - tail if m >= tile and 0 < tail <= 16 else m


def check_w4a16(y, x, w, y_dtype, name, assert_close, prefill=None, tile_forced=False):
    """y of a W4A16 call with host weight w (Int4Weight) against the reference.

    Where the prefill tier folds the scale into A (bf16 x and bf16 scales, int4.prefill_folds),
    it multiplies bf16(float32((q - z) * s)) (int4.dequantize_folded) by x:
      prefill="forced" (the prefill tier ran): against x @ folded^T, FOLD_BOUND =
          bf16_tile.accumulation_bound, elementwise: the products of bf16 x and bf16 weights
          are exact in fp32, what is left is k fp32 additions (2^-22 each, truncating) and the
          rounding of y (pyquant/formats/bf16_tile.py has the derivation);
      prefill="maybe" (auto at M > 16 on the frag layout: the prefill where it runs, else a
          decode tier): against the exact weights within bf16_tile.error_bound, which adds the
          weight rounding (2^-8 |x| @ |w|^T) to the same sums and so holds for the decode
          tiers' exact products too.
      A forced call whose plan runs a ragged tail of at most 16 tokens on decode_frag
          (prefill_decode_tail; tile_forced: the prefill_tile option is set, so it does not):
          those rows against the exact weights within bf16_tile.accumulation_bound (the
          decode's fp32 sums; it does not round the weights).
    Every other call: the exact weights within w4a16_bound, normwise."""
    folds = prefill is not None and int4.prefill_folds(x.dtype, w.scales.dtype)
    u_y = UNIT_ROUNDOFF[np.dtype(y_dtype)]
    if folds and prefill == "forced":
        m1 = len(x) if tile_forced else prefill_decode_tail(len(x), True)
        wf = int4.dequantize_folded(w.qweight, w.scales, w.qzeros, w.group_size)
        assert_elementwise(y[:m1], reference.gemm(x[:m1], wf), bf16_tile.accumulation_bound(x[:m1], wf, u_y),
                           f"{name} (folded prefill)", what="folded reference")
        if m1 < len(x):
            w_deq = w.dequantize()
            assert_elementwise(y[m1:], reference.gemm(x[m1:], w_deq), bf16_tile.accumulation_bound(x[m1:], w_deq, u_y),
                               f"{name} (tokens {m1}.. on decode_frag)")
    elif folds:
        w_deq = w.dequantize()
        assert_elementwise(y, reference.gemm(x, w_deq), bf16_tile.error_bound(x, w_deq, u_y), f"{name} (maybe folded)")
    else:
        assert_close(y, reference.gemm(x, w.dequantize()), w4a16_bound(x.shape[1], y_dtype), name)


def _tiers_built(family: str) -> bool:
    """True when qg_build_info lists a GPU tier for `family` ("w4a16=cpu,cuda:simt,...")."""
    return any(tiers.backend_of(t) in ("cuda", "hip") for t in tiers.tiers().get(family, []))


def _need(family: str):
    if not _tiers_built(family):
        pytest.skip(f"this build has no GPU tier for {family}: {pyquant.build_info()}")


def random_x(rng, m, k, dtype):
    x = rng.standard_normal((m, k))
    return np.where(np.abs(x) < 1e-3, 0.5, x).astype(np.float32).astype(dtype)


def random_int4(rng, n, k, g, symmetric, scale_dtype):
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = (rng.uniform(0.5, 2.0, size=(n, k // g)) * 2.0 ** -4).astype(np.float32).astype(scale_dtype)
    qzeros = None if symmetric else rng.integers(0, 2 ** 32, size=(n // 8, k // g),
                                                 dtype=np.uint32).view(np.int32)
    return pyquant.Int4Weight(qweight, scales, qzeros, g)


def _run_tiers(gpu_ctx, family, call):
    """call() under every tier option; a tier this shape or build cannot serve answers
    QG_ERR_UNSUPPORTED (skipped); auto (0) must always run. Returns the tiers that ran."""
    ran = []
    try:
        for tier in TIERS[family]:
            gpu_ctx.set_option(f"{family}_tier", tier)
            try:
                call(tier)
            except pyquant.QuantGemmError as e:
                if tier == 0 or e.status != _lib.Status.QG_ERR_UNSUPPORTED:
                    raise
                continue
            ran.append(tier)
    finally:
        gpu_ctx.set_option(f"{family}_tier", 0)
    return ran


def _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt):
    g = poisoned_output(m, n, y_dt, device_ctx=gpu_ctx)
    pyquant.gemm(xd, wd, out=g.y)
    return g.value()


# ---------------------------------------------------------------- W4A16

LAYOUTS = ("frag", "canonical")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [8, 24, 4104], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [32, 64, 128], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("x_dt", [F16, BF16], ids=["fp16", "bf16"])
def test_w4a16_gpu(rng, gpu_ctx, x_dt, group_size, symmetric, n, layout, poisoned_output, assert_close):
    """Every tier on both layouts (the frag layout pads N to 16 and K to 128: N = 8, 24 and
    K = one group exercise the padding)."""
    _need("w4a16")
    k = {8: group_size, 24: 4 * group_size, 4104: 4096}[n]  # one group; a few; a real K
    w = random_int4(rng, n, k, group_size, symmetric, BF16 if n % 16 else F16)
    wd = w.to_device(gpu_ctx, layout=layout)
    assert wd.layout == layout
    for i, m in enumerate((1, 2, 3, 5, 8, 16, 17, 33)):
        y_dt = (x_dt, F32)[i % 2]
        x = random_x(rng, m, k, x_dt)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

        def check(tier):
            y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt)
            check_w4a16(y, x, w, y_dt, f"w4a16 tier={tier} g{group_size} {'sym' if symmetric else 'asym'} "
                        f"x={x_dt} y={y_dt} m={m} n={n} k={k} {layout}", assert_close,
                        _prefill_may_run(layout, tier, m))
        assert 0 in _run_tiers(gpu_ctx, "w4a16", check)


def _prefill_may_run(layout: str, tier: int, m: int):
    """check_w4a16's prefill argument for a call under qg_context_set_option("w4a16_tier",
    tier): 3 forces the prefill tier (the frag layout only: the canonical one refuses it);
    auto may take it above 16 rows on the frag layout."""
    if layout != "frag":
        return None
    return "forced" if tier == 3 else "maybe" if tier == 0 and m > 16 else None


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("split_k", [1, 2, 3, 8])
def test_w4a16_gpu_forced_split_k(rng, gpu_ctx, split_k, layout, poisoned_output, assert_close):
    """split_k only changes the order of fp32 sums (same bound); the workspace counters
    re-arm, so back-to-back calls on one workspace stay right. N = 264 is two row tiles of
    the frag decode (one partial) and five row blocks of the canonical one; M = 40 and 300
    run the frag layout's prefill, where split_k spreads each tile's K over about split_k
    blocks (stream-K: partial sums added by the block holding the tile's last k-chunk, slots
    zeroed once read)."""
    _need("w4a16")
    _check_split_k_calls(rng, gpu_ctx, poisoned_output, assert_close, 264, 2048, layout, split_k, (1, 7, 16, 40, 300))


def _check_split_k_calls(rng, gpu_ctx, poisoned_output, assert_close, n, k, layout, split_k, ms):
    """A random g128 asymmetric weight n x k in `layout`, the split_k option set (0: auto), each
    M in `ms` called twice on one workspace against the reference (the prefill where auto may
    take it)."""
    w = random_int4(rng, n, k, 128, False, BF16)
    wd = w.to_device(gpu_ctx, layout=layout)
    gpu_ctx.set_option("split_k", split_k)
    try:
        for m in ms:
            x = random_x(rng, m, k, BF16)
            xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
            for repeat in range(2):
                y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, F32)
                check_w4a16(y, x, w, F32, f"w4a16 {layout} {n}x{k} split_k={split_k} m={m} call {repeat}",
                            assert_close, _prefill_may_run(layout, 0, m))
    finally:
        gpu_ctx.set_option("split_k", 0)


@pytest.mark.parametrize("n,split_k", [(264, 0), (264, 17), (264, 32), (2056, 0)])
def test_w4a16_gpu_frag_decode_fixup(rng, gpu_ctx, n, split_k, poisoned_output, assert_close):
    """decode_frag's fix-up with many contributors a row tile: K = 4096 is 32 chunks and
    N = 264 two row tiles, so split_k = 17 and 32 give a row tile 17 and 32 contributors (the
    last to arrive loads 8 at a time: three and four rounds, the last one partial at 17); auto
    (0) there gives every block one chunk at any M. N = 2056 is nine row tiles, the last one
    8 rows: auto at M = 1 runs the persistent grid (264 blocks: one or two chunks each), at
    M >= 2 the split grid of few row tiles (132 SMs: 14 blocks a row tile, 2.3 chunks each, so
    blocks straddle two row tiles). M = 1, 2, 4, 5, 8, 9 and 16: one, two and four float4 slots
    a thread. Every call twice on one workspace (the counters re-arm, the slots are cleared once
    read); the bound is the decode tier's."""
    _need("w4a16")
    _check_split_k_calls(rng, gpu_ctx, poisoned_output, assert_close, n, 4096, "frag", split_k, (1, 2, 4, 5, 8, 9, 16))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_w4a16_gpu_one_hot(rng, gpu_ctx, layout, assert_bitwise_equal):
    """x = one-hot rows: (q - z) * s is formed once in fp32 from exact factors, so y (fp32)
    is the decoded weight bit for bit on every tier; the prefill with bf16 x and bf16 scales
    multiplies each weight rounded once to bf16 (int4.dequantize_folded), so there y is that
    weight bit for bit (forced: tier 3; auto at M > 16 on the frag layout: either, whole)."""
    _need("w4a16")
    for g in (32, 64, 128):
        for symmetric in (False, True):
            n, k = 24, 2 * g
            w = random_int4(rng, n, k, g, symmetric, BF16)
            wd = w.to_device(gpu_ctx, layout=layout)
            folded = int4.dequantize_folded(w.qweight, w.scales, w.qzeros, g)
            for m_extra, x_dt in ((0, F16), (k, BF16)):  # M = K, and M = 2K (prefill sizes)
                x, want = one_hot_case(rng, w.dequantize(), m_extra)
                fold_want = np.ascontiguousarray(folded[:, x.argmax(axis=1)].T + np.float32(0))  # same rows
                xd = pyquant.DeviceArray.from_numpy(x.astype(x_dt), gpu_ctx)

                def check(tier):
                    y = pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy()
                    name = f"one-hot w4a16 tier={tier} g{g} sym={symmetric} m={len(x)} x={x_dt} {layout}"
                    prefill = _prefill_may_run(layout, tier, len(x)) if int4.prefill_folds(x_dt, BF16) else None
                    wants = {None: [want], "forced": [fold_want], "maybe": [want, fold_want]}[prefill]
                    if not any(np.array_equal(y.view(np.uint32), v.view(np.uint32)) for v in wants[:-1]):
                        assert_bitwise_equal(y, wants[-1], name)
                _run_tiers(gpu_ctx, "w4a16", check)


def test_w4a16_gpu_fp16_zero_points_refused(rng, gpu_ctx, poisoned_output):
    """Zero-points in the activation dtype are refused, in Python and at the C layer."""
    _need("w4a16")
    w = random_int4(rng, 8, 128, 32, False, F16).to_device(gpu_ctx, layout="canonical")
    zeros_f16 = pyquant.DeviceArray.from_numpy(np.full((8, 4), 8, np.float16), gpu_ctx)
    with pytest.raises(pyquant.QuantGemmError, match=r"qzeros has dtype float16: zero-points must stay 4-bit"):
        pyquant.Int4Weight(w.qweight, w.scales, zeros_f16, 32)
    g = poisoned_output(2, 8, F16, device_ctx=gpu_ctx)
    xd = pyquant.DeviceArray.from_numpy(random_x(rng, 2, 128, F16), gpu_ctx)
    args = _lib.qg_w4a16_gemm_args(
        m=2, n=8, k=128, group_size=32, x_dtype=_lib.DType.QG_DTYPE_F16,
        y_dtype=_lib.DType.QG_DTYPE_F16, scale_dtype=_lib.DType.QG_DTYPE_F16,
        zero_dtype=_lib.DType.QG_DTYPE_F16, x=xd.ptr, ldx=128, qweight=w.qweight.ptr,
        scales=w.scales.ptr, qzeros=zeros_f16.ptr, y=g.y.ptr, ldy=g.ld)
    with pytest.raises(pyquant.QuantGemmError, match=r"zero_dtype=\S*F16: zero-points must be packed 4-bit"):
        _lib.qg_w4a16_gemm(gpu_ctx.handle, ctypes.byref(args), None)
    gpu_ctx.synchronize()
    assert g.unchanged(), "a refused call wrote into the device output"


def _force(gpu_ctx, family, tier, call):
    """call() with `tier` forced by name; the forcing is undone afterwards."""
    gpu_ctx.set_tier(family, tier)
    try:
        return call()
    finally:
        gpu_ctx.set_tier(family, "auto")


def _prefill_tier_runs(gpu_ctx) -> bool:
    """The prefill tier exists in this build and runs on this device (sm_90a, cc 9.0)."""
    name = next((t for t in tiers.tiers().get("w4a16", []) if t.endswith(":prefill_wgmma")), None)
    if name is None:
        return False
    w = random_int4(np.random.default_rng(0), 16, 128, 128, True, BF16).to_device(gpu_ctx)
    x = pyquant.DeviceArray.from_numpy(np.ones((17, 128), BF16), gpu_ctx)
    try:
        _force(gpu_ctx, "w4a16", name, lambda: pyquant.gemm(x, w))
    except pyquant.QuantGemmError as e:
        if e.status == _lib.Status.QG_ERR_UNSUPPORTED:
            return False
        raise
    return True


def _need_prefill(gpu_ctx):
    _need("w4a16")
    if not _prefill_tier_runs(gpu_ctx):
        pytest.skip(f"the w4a16 prefill tier does not run here: {pyquant.build_info()}")


@pytest.mark.parametrize("scale_dt", [F16, BF16], ids=["s_fp16", "s_bf16"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [32, 64, 128], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("x_dt", [F16, BF16], ids=["fp16", "bf16"])
def test_w4a16_gpu_prefill(rng, gpu_ctx, x_dt, group_size, symmetric, scale_dt, poisoned_output, assert_close):
    """The prefill tier forced at M that are not multiples of its token tiles (64, 128),
    N = 264 (two 128-row tiles, the second partial, and a padded row block) and K = 384 + G
    (padded to a multiple of 128 unless G = 128), against the numpy reference: the exact
    weights on the group-sum path (fp16 x; bf16 x with fp16 scales), the bf16-rounded ones
    where the scale is folded into A (bf16 x and bf16 scales; check_w4a16)."""
    _need_prefill(gpu_ctx)
    name = next(t for t in tiers.tiers()["w4a16"] if t.endswith(":prefill_wgmma"))
    n, k = 264, 384 + group_size
    w = random_int4(rng, n, k, group_size, symmetric, scale_dt)
    wd = w.to_device(gpu_ctx, layout="frag")
    for i, m in enumerate((17, 32, 33, 64, 300, 517)):
        y_dt = (x_dt, F32)[i % 2]
        x = random_x(rng, m, k, x_dt)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
        y = _force(gpu_ctx, "w4a16", name, lambda: _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt))
        check_w4a16(y, x, w, y_dt, f"w4a16 prefill g{group_size} {'sym' if symmetric else 'asym'} x={x_dt} "
                    f"scales={scale_dt} y={y_dt} m={m}", assert_close, "forced")


def _check_forced_tile(gpu_ctx, rng, poisoned_output, assert_close, w, x_dt, m, tile, splits, what):
    """The prefill tier forced, its prefill_tile option set to `tile`, at each split_k of
    `splits` (0: the plan's own grid), on weight w and random x of m rows, against the numpy
    reference as the auto plan's calls are (check_w4a16); the options are undone afterwards."""
    _need_prefill(gpu_ctx)
    name = next(t for t in tiers.tiers()["w4a16"] if t.endswith(":prefill_wgmma"))
    n, k = w.shape
    wd = w.to_device(gpu_ctx, layout="frag")
    x = random_x(rng, m, k, x_dt)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    gpu_ctx.set_option("prefill_tile", tile)
    try:
        for split in splits:
            gpu_ctx.set_option("split_k", split)
            y = _force(gpu_ctx, "w4a16", name, lambda: _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, F32))
            check_w4a16(y, x, w, F32, f"w4a16 prefill {what} tile {tile} split_k {split} m={m}",
                        assert_close, "forced", tile_forced=True)
    finally:
        gpu_ctx.set_option("prefill_tile", 0)
        gpu_ctx.set_option("split_k", 0)


@pytest.mark.parametrize("x_dt,scale_dt", [(BF16, BF16), (F16, BF16)], ids=["fold", "grp"])
@pytest.mark.parametrize("tile", [32, 64, 128, 256])
def test_w4a16_gpu_prefill_forced_tile(rng, gpu_ctx, tile, x_dt, scale_dt, poisoned_output, assert_close):
    """The prefill_tile option (a speed choice: 32, 64, 128, 256 tokens; 256 only where the scale
    folds into A, else 128; 32 only with bf16 x, else 64) on its own and with split_k 3, at M = 300 (ragged in every tile),
    N = 264 (the second row tile partial), K = 1024 with G = 64 asym: against the numpy
    reference as the auto plan's calls are (check_w4a16)."""
    w = random_int4(rng, 264, 1024, 64, False, scale_dt)
    _check_forced_tile(gpu_ctx, rng, poisoned_output, assert_close, w, x_dt, 300, tile, (0, 3), f"x={x_dt}")


@pytest.mark.parametrize("group_size,symmetric", [(128, False), (32, True)], ids=["g128_asym", "g32_sym"])
@pytest.mark.parametrize("tile", [32, 64, 128, 256])
def test_w4a16_gpu_prefill_many_chunks(rng, gpu_ctx, tile, group_size, symmetric, poisoned_output, assert_close):
    """The prefill's chunk pipeline (registers loaded two chunks ahead, the x ring's stages and
    mbarrier phases running on across a block's stream-K segments) over many more chunks than
    its slots and stages: K = 19 x 128 (an odd chunk count, so that slots and phases wrap
    unevenly), G = 128 asym and G = 32 sym, whole tiles and split_k 5 (stream-K: a block runs
    several segments), N = 264 (warps of the second row tile past N), M = 300, bf16 x folded:
    against the numpy reference."""
    w = random_int4(rng, 264, 19 * 128, group_size, symmetric, BF16)
    _check_forced_tile(gpu_ctx, rng, poisoned_output, assert_close, w, BF16, 300, tile, (0, 5),
                       f"chunks g{group_size}")


def test_w4a16_gpu_prefill_large(rng, gpu_ctx, poisoned_output, assert_close):
    """Many row and token tiles: N = 4104 (33 row tiles, the last partial), K = 2048, M = 517
    (5 tiles of 128 tokens, the last partial), under auto (which picks prefill here)."""
    _need_prefill(gpu_ctx)
    n, k, m = 4104, 2048, 517
    for g, x_dt in ((128, BF16), (32, F16)):
        w = random_int4(rng, n, k, g, False, BF16)
        wd = w.to_device(gpu_ctx)
        x = random_x(rng, m, k, x_dt)
        y = _guarded_gemm(gpu_ctx, poisoned_output, pyquant.DeviceArray.from_numpy(x, gpu_ctx), wd, m, n, F32)
        check_w4a16(y, x, w, F32, f"w4a16 prefill large g{g} x={x_dt}", assert_close, "maybe")


# One auto prefill call in a fresh interpreter under QG_LOG=1 (the library reads it once per
# process): its log lines name the SM count and the tile the plan took.
_TILE_CHILD = """
import sys
import ml_dtypes, numpy as np, pyquant
n, k, m, g, sym = (int(v) for v in sys.argv[1:6])
ctx = pyquant.gpu_context()
W = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
w = pyquant.quantize(W, "int4", group_size=g, symmetric=bool(sym), scale_dtype="bf16").to_device(ctx)
pyquant.gemm(pyquant.DeviceArray.from_numpy(np.ones((m, k), ml_dtypes.bfloat16), ctx), w)
ctx.synchronize()
"""


def _prefill_launches_logged(n: int, k: int, m: int, g: int, symmetric: bool) -> tuple[list, list, int]:
    """([(tokens, rows, tokens per tile, tiles, stream-K (0 / 1), blocks, first row tile) of each
    prefill launch], [tokens of each decode_frag launch], SMs) of the call a child process logs
    for bf16 x and scales."""
    p = subprocess.run([sys.executable, "-c", _TILE_CHILD, *(str(v) for v in (n, k, m, g, int(symmetric)))],
                       env=dict(os.environ, QG_LOG="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"child failed:\n{p.stderr[-2000:]}"
    launches = re.findall(rf"w4a16 prefill_wgmma m=(\d+) n=(\d+) k={k} g={g} \w+ \(scale folded into A\): "
                          rf"tile 128 rows x (\d+) tokens, (\d+) tiles \(\d+ x \d+\), (stream-K over|a block a tile,) "
                          rf"blocks: (\d+), smem \d+, row tiles from (\d+)", p.stderr)
    decodes = re.findall(rf"w4a16 decode_frag m=(\d+) n={n} k={k} g={g} ", p.stderr)
    sms = re.search(r"context \S+ device \d+: .*, (\d+) SMs", p.stderr)
    assert launches and sms, f"no folded prefill or context line in the child's QG_LOG output:\n{p.stderr[-2000:]}"
    return ([(*(int(v) for v in launch[:4]), int(launch[4] == "stream-K over"), int(launch[5]), int(launch[6]))
             for launch in launches], [int(v) for v in decodes], int(sms.group(1)))


@pytest.mark.parametrize("m", [520, 262])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [32, 64, 128], ids=lambda g: f"g{g}")
def test_w4a16_gpu_prefill_wide_tile(rng, gpu_ctx, group_size, symmetric, m, poisoned_output, assert_close,
                                     assert_bitwise_equal):
    """bf16 x and bf16 scales above 128 tokens: N = 128 x 132 (132 row tiles), K = 384 (3
    chunks: 12, 6 or 3 groups), M = 520 and M = 262. prefill_plan
    (src/gpu/w4a16_prefill_launch.cpp) takes the 256-token tile wherever the kernel folds and
    M > 128, and runs a tail of at most 16 tokens past the last full 256 on decode_frag,
    except where the call fits one or two fused tiles of 272 (257 .. 272, 513 .. 544 tokens):
    M = 520 then runs as two token tiles of 272 and M = 262 as one, in one launch
    (QG_EXP_FUSED_TAIL=0: 512 or 256 tokens on 256-token tiles and the tail of 8 or 6 on
    decode_frag). A child's QG_LOG=1 lines give each launch's tokens and tile. Against the
    folded reference (check_w4a16), and one-hot rows (M again) give each folded weight bit for
    bit (the exact weight on a decode_frag tail's rows)."""
    _need_prefill(gpu_ctx)
    n, k = 128 * 132, 384
    launches, decodes, sms = _prefill_launches_logged(n, k, m, group_size, symmetric)
    seen = f"{sms} SMs, M = {m}: the plan launched {launches} and decode_frag on {decodes} tokens"
    # 132 tiles a token tile (one wave on 132 SMs; elsewhere a row split may add a launch)
    if fused_tail_on():
        assert {v[:3] for v in launches} == {(m, n, FUSED_BN)} \
            and sum(v[3] for v in launches) == 132 * fused_tiles(m) and decodes == [], seen
    else:
        head = m - m % 256
        assert {v[:3] for v in launches} == {(head, n, 256)} and sum(v[3] for v in launches) == 132 * head // 256 \
            and decodes == [m - head], seen
    assert prefill_decode_tail(m, True) == (m if fused_tail_on() else m - m % 256)
    tile = 256
    name = next(t for t in tiers.tiers()["w4a16"] if t.endswith(":prefill_wgmma"))
    w = random_int4(rng, n, k, group_size, symmetric, BF16)
    wd = w.to_device(gpu_ctx)
    x = random_x(rng, m, k, BF16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    y = _force(gpu_ctx, "w4a16", name, lambda: _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, F32))
    label = f"w4a16 wide prefill g{group_size} {'sym' if symmetric else 'asym'} m={m} tile {tile}"
    check_w4a16(y, x, w, F32, label, assert_close, "forced")
    x1, want = one_hot_case(rng, int4.dequantize_folded(w.qweight, w.scales, w.qzeros, group_size), max(m - k, 0))
    x1, want = x1[:m], want[:m]  # M < K: M of the K columns, in a random order
    m1 = prefill_decode_tail(m, True)  # the decode_frag tail's rows: the exact weight
    want[m1:] = w.dequantize()[:, x1[m1:].argmax(axis=1)].T + np.float32(0)
    x1d = pyquant.DeviceArray.from_numpy(x1.astype(BF16), gpu_ctx)
    y1 = _force(gpu_ctx, "w4a16", name, lambda: pyquant.gemm(x1d, wd, out_dtype=np.float32).to_numpy())
    assert_bitwise_equal(y1, want, f"one-hot {label}")


@pytest.mark.parametrize("m", [17, 32, 33])
@pytest.mark.parametrize("group_size,symmetric", [(128, False), (32, True)], ids=["g128_asym", "g32_sym"])
def test_w4a16_gpu_prefill_narrow_tile(rng, gpu_ctx, group_size, symmetric, m, assert_bitwise_equal):
    """bf16 x and scales at 17 .. 32 tokens: prefill_plan (src/gpu/w4a16_prefill_launch.cpp)
    takes the 32-token tile (half the 64-token tile's wgmma work there), at 33 the 64-token one,
    one launch either way (N = 264, K = 2048: 3 row tiles, stream-K over the SMs). A child's
    QG_LOG=1 lines give the tile; one-hot rows give each folded weight bit for bit."""
    _need_prefill(gpu_ctx)
    n, k = 264, 2048
    launches, decodes, sms = _prefill_launches_logged(n, k, m, group_size, symmetric)
    assert [v[:3] for v in launches] == [(m, n, 32 if m <= 32 else 64)] and decodes == [], \
        f"{sms} SMs, M = {m}: the plan launched {launches} and decode_frag on {decodes} tokens"
    w = random_int4(rng, n, k, group_size, symmetric, BF16)
    wd = w.to_device(gpu_ctx)
    x1, want = one_hot_case(rng, int4.dequantize_folded(w.qweight, w.scales, w.qzeros, group_size))
    x1, want = x1[:m], want[:m]  # M < K: M of the K columns, in a random order
    x1d = pyquant.DeviceArray.from_numpy(x1.astype(BF16), gpu_ctx)
    y1 = pyquant.gemm(x1d, wd, out_dtype=np.float32).to_numpy()
    assert_bitwise_equal(y1, want, f"one-hot narrow prefill g{group_size} m={m}")


@pytest.mark.parametrize("m", [300, 262])
@pytest.mark.parametrize("waves", [1, 2])
def test_w4a16_gpu_prefill_stream_k(rng, gpu_ctx, waves, m, poisoned_output, assert_close, assert_bitwise_equal):
    """Tiles of 256 tokens (one block an SM) past a whole wave: waves x SMs + 4 row tiles (the
    last 120 rows), K = 2048, g128 asym bf16; M = 300 (one 256-token tile, then the ragged 44
    tokens as their own launch) and M = 262 (one fused tile of 272: the 256-token one with the
    ragged 6 as an n16 wgmma more; QG_EXP_FUSED_TAIL=0: the 6 on decode_frag). prefill_plan
    spreads one wave and 4 tiles over the SMs as stream-K (each tile's K in about two
    segments, the block ending it adding the other's partial sums); two waves and 4 tiles are
    a row split (row_split): the first SMs row tiles whole, a block a tile, then the last wave
    and the 4 tiles past it as a stream-K launch of their own over the SMs (its row tiles from
    SMs on). The child's QG_LOG=1 lines say which, and how many blocks. Against the folded
    reference; twice on one workspace (the counters re-arm, the slots are zeroed); with a
    bias, fl(y + bias) of the call without one, bit for bit (the bias is added once, after the
    partial sums)."""
    _need_prefill(gpu_ctx)
    _, _, sms = _prefill_launches_logged(512, 256, 300, 128, False)
    tiles = waves * sms + 4
    n, k = 128 * tiles - 8, 2048
    launches, decodes, _ = _prefill_launches_logged(n, k, m, 128, False)
    fused = fused_tiles(m) > 0
    tok, tile = (m, FUSED_BN) if fused else (256, 256)
    if waves == 1:
        heads = 1
        assert launches[0] == (tok, n, tile, tiles, 1, sms, 0), launches
    else:
        heads = 2
        assert launches[0] == (tok, n, tile, sms, 0, sms, 0), launches
        assert launches[1] == (tok, n, tile, sms + 4, 1, sms, sms), launches
    tail = [(44, n, 64)] if m == 300 else []
    assert [v[:3] for v in launches[heads:]] == tail, (launches, decodes)
    assert decodes == ([] if m == 300 or fused else [6]), (launches, decodes)
    if not fused and m == 262:
        return  # the decode tail's rows: test_w4a16_gpu_prefill_wide_tile and the ragged tests
    w = random_int4(rng, n, k, 128, False, BF16)
    wd = w.to_device(gpu_ctx)
    x = random_x(rng, m, k, BF16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    for repeat in range(2):
        y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, F32)
        check_w4a16(y, x, w, F32, f"w4a16 prefill stream-K m={m} n={n} call {repeat}", assert_close, "forced")
    b = rng.standard_normal(n).astype(np.float32).astype(BF16)
    yb = pyquant.gemm(xd, wd.with_bias(pyquant.DeviceArray.from_numpy(b, gpu_ctx)), out_dtype=F32).to_numpy()
    assert_bitwise_equal(yb, y + b.astype(np.float32)[None, :], "stream-K with a bias")
    # bf16 y, rows aligned: the staged epilogue between a block's segments (the x ring refilled
    # after the output tile passed through it)
    _staged_equals_rounded_fp32(gpu_ctx, xd, wd, m, n, BF16, "stream-K, staged bf16 output", assert_bitwise_equal)


def _staged_equals_rounded_fp32(gpu_ctx, xd, wd, m, n, x_dt, label, assert_bitwise_equal):
    """y of x's 16-bit type in a 16-byte-aligned guarded buffer (the prefill's staged epilogue)
    against the same call's float32 output rounded once to x's type: bit for bit."""
    g = Guarded(m, n, x_dt, device_ctx=gpu_ctx, aligned=True)
    pyquant.gemm(xd, wd, out=g.y)
    y16 = g.value()
    y32 = pyquant.gemm(xd, wd, out_dtype=F32).to_numpy()
    assert_bitwise_equal(y16, y32.astype(x_dt), label)


@pytest.mark.parametrize("case", ["int4-fold", "int4-grp", "q4_0-n4099"])
def test_gpu_prefill_staged_output(rng, gpu_ctx, case, assert_bitwise_equal):
    """The prefill's staged epilogue (hip/prefill_wgmma.h store_tile_staged: y of x's 16-bit
    type with 16-byte-aligned rows goes through shared memory by stmatrix and out in 16-byte
    pieces) against the element-wise epilogue of the float32 output of the same call, rounded
    once to x's type: the two must agree bit for bit (the same sums, the same one rounding),
    and the guard bands around the aligned output stay intact. Every tile (32, 64, 128, 256 tokens
    where the scale folds), M ragged in each (17, 300, 517), N = 264 (a partial row tile);
    a GGUF q4_0 weight with N = 4099, whose last 16-byte piece of each row N ends inside
    (element-wise stores there)."""
    _need_prefill(gpu_ctx)
    if case.startswith("int4"):
        x_dt, scale_dt, g = (BF16, BF16, 128) if case == "int4-fold" else (F16, BF16, 32)
        n, k = 264, 512
        wd = random_int4(rng, n, k, g, False, scale_dt).to_device(gpu_ctx, layout="frag")
        tiles = (32, 64, 128, 256) if case == "int4-fold" else (64, 128)
    else:
        x_dt, n, k = BF16, 4099, 512
        raw = F.get("q4_0").module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
        wd = pyquant.from_gguf("q4_0", raw, shape=(n, k)).to_device(gpu_ctx, layout="frag")
        tiles = (0,)
    try:
        for tile in tiles:
            gpu_ctx.set_option("prefill_tile", tile)
            for m in (17, 300, 517):
                xd = pyquant.DeviceArray.from_numpy(random_x(rng, m, k, x_dt), gpu_ctx)
                _staged_equals_rounded_fp32(gpu_ctx, xd, wd, m, n, x_dt, f"staged prefill {case} tile {tile} m={m}",
                                            assert_bitwise_equal)
    finally:
        gpu_ctx.set_option("prefill_tile", 0)


@pytest.mark.parametrize("scale_dt", [F16, BF16], ids=["s_fp16", "s_bf16"])
def test_w4a16_gpu_decode_and_prefill_agree(rng, gpu_ctx, scale_dt, assert_close):
    """Around the crossover both tiers compute the same function: at M = 16 and 17 the
    decode and prefill results differ by no more than their two bounds together. With bf16 x
    (either scale dtype: int4.prefill_folds) the prefill rounds each weight to bf16 and the
    decode does not: AGREE_BOUND, elementwise, is
    the prefill's distance from the exact product (bf16_tile.error_bound: the weight rounding
    2^-8 |x| @ |w|^T plus its fp32 sums) plus the decode's (bf16_tile.accumulation_bound: its
    fp32 sums, exact weights). Where neither rounds (fp16 x) both use the exact weights
    (normwise, 2 w4a16_bound)."""
    _need_prefill(gpu_ctx)
    names = {t.split(":")[1]: t for t in tiers.tiers()["w4a16"] if ":" in t}
    n, k = 520, 1024
    w = random_int4(rng, n, k, 64, False, scale_dt)
    wd, w_deq = w.to_device(gpu_ctx), w.dequantize()
    for m in (16, 17):
        x = random_x(rng, m, k, BF16)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
        got = {t: _force(gpu_ctx, "w4a16", names[t], lambda: pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy())
               for t in ("decode_frag", "prefill_wgmma")}
        name = f"decode vs prefill m={m} scales={scale_dt}"
        if int4.prefill_folds(BF16, scale_dt):
            agree_bound = bf16_tile.error_bound(x, w_deq, U32) + bf16_tile.accumulation_bound(x, w_deq, U32)
            assert_elementwise(got["prefill_wgmma"], got["decode_frag"].astype(np.float64), agree_bound, name,
                               what="decode_frag")
        else:
            assert_close(got["prefill_wgmma"], got["decode_frag"], 2 * w4a16_bound(k, F32), name)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [32, 64, 128], ids=lambda g: f"g{g}")
def test_w4a16_gpu_repack_matches_reference(rng, gpu_ctx, group_size, symmetric):
    """The GPU repack writes the numpy reference's planes byte for byte (N and K that need
    padding, and a real size), and unpacking them gives the canonical arrays back."""
    _need("w4a16")
    for n, k in ((24, 3 * group_size), (4104, 4096 + group_size)):
        w = random_int4(rng, n, k, group_size, symmetric, F16)
        r = w.to_device(gpu_ctx, layout="frag")
        fq, fs, fz = int4_frag.repack(w.qweight, w.scales, w.qzeros, group_size)
        np.testing.assert_array_equal(r.qweight.to_numpy(), fq)
        np.testing.assert_array_equal(r.scales.to_numpy().view(np.uint16), fs.view(np.uint16))
        if symmetric:
            assert r.qzeros is None
        else:
            np.testing.assert_array_equal(r.qzeros.to_numpy(), fz)
        back = r.canonical_arrays()
        np.testing.assert_array_equal(back[0], w.qweight)
        np.testing.assert_array_equal(back[1].view(np.uint16), w.scales.view(np.uint16))


def test_w4a16_gpu_every_tier_by_name(rng, gpu_ctx, assert_close):
    """qg_context_set_tier forces each GPU tier of the build by name: a tier runs or says
    why it cannot (QG_ERR_UNSUPPORTED naming the condition), never a wrong answer."""
    _need("w4a16")
    n, k, m = 64, 256, 3
    w = random_int4(rng, n, k, 64, False, BF16)
    x = random_x(rng, m, k, BF16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    ran = set()
    for layout in LAYOUTS:
        wd = w.to_device(gpu_ctx, layout=layout)
        for name in tiers.tiers()["w4a16"]:
            try:
                y = _force(gpu_ctx, "w4a16", name, lambda: pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy())
            except pyquant.QuantGemmError as e:
                assert e.status == _lib.Status.QG_ERR_UNSUPPORTED and name in str(e), str(e)
                continue
            check_w4a16(y, x, w, F32, f"tier {name} {layout}", assert_close,
                        "forced" if name.endswith(":prefill_wgmma") else None)
            ran.add(name)
    assert any(t.endswith(":simt") for t in ran) and any(":decode" in t for t in ran), ran


# ---------------------------------------------------------------- GGUF

@pytest.mark.parametrize("n", [1, 7, 4099], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("x_dt", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_gpu(rng, gpu_ctx, fmt, x_dt, n, poisoned_output, assert_close):
    _need("gguf")
    spec = F.get(fmt)
    k = 4096 if n == 4099 else 2 * max(spec.block_elems, 256)
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    wd, w_deq = w.to_device(gpu_ctx, layout="canonical"), w.dequantize()  # the blocks' tiers (frag: below)
    for i, m in enumerate((1, 2, 3, 5, 8)):
        y_dt = (x_dt, F32)[i % 2]
        x = random_x(rng, m, k, x_dt)
        ref = reference.gemm(x, w_deq)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

        def check(tier):
            y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt)
            name = f"{fmt} tier={tier} x={x_dt} y={y_dt} m={m} n={n} k={k}"
            if tier == 1:   # x kept in fp32
                assert_close(y, ref, gguf_float_bound(k, y_dt), name)
            elif tier == 3:  # the prefill tier (bf16 x only): weights rounded to bf16
                assert_bf16_tile_vs_exact(y, x, w_deq, y_dt, name)
            else:           # auto (the int8 tier where it runs, m <= 8) and the int8 tier
                assert_int8_vs_exact(y, x, fmt, raw, ref, y_dt, name)
            if tier == 2:
                assert_int8_model(y, x, fmt, raw, y_dt, name)
        assert 0 in _run_tiers(gpu_ctx, "gguf", check)


@pytest.mark.parametrize("n", [1, 7, 4099], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("x_dt", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fmt", gguf_frag.FORMATS)
def test_gguf_gpu_frag(rng, gpu_ctx, fmt, x_dt, n, poisoned_output):
    """The frag layout (qg_gguf_repack) on the W4A16 frag kernels: decode_frag (4), the
    prefill (5) and auto, at decode M, 16-row launches and prefill M with ragged tails.
    q4_0 and q8_0: the decode's weights are exact (fp16 d times q - 8 or q), the products exact in fp32 and
    each group's scale applied in fp32: bf16_tile.accumulation_bound against the exact product
    of the gguf reference weights (the decode_frag bound of check_w4a16); so is the prefill
    with fp16 x (its group sums). With bf16 x the prefill folds d into A (FOLD_F16: each weight
    rounded once to bf16, as the GGUF prefill tier does): bf16_tile.error_bound, which adds
    the 2^-8 weight rounding; q8_0's prefill takes d * q in float32 rounded once to x's type
    (FOLD_FP32, either x type): error_bound.
    q4_K: the decode sums q * x and x per group and applies d * sc and dmin * m in fp32, so its
    rounding scales with both terms (accumulation_bound with gguf_frag.decode_magnitudes);
    iq4_xs and iq3_xxs: the codebook values (kvalues, the signed grid magnitudes) are exact, d * (ls - 32)
    or (d * (0.5 + ls)) * 0.5 applied to each group's fp32 sum (the q4_0 bound). The prefill of these (either x type) takes each gguf float32 weight rounded once
    to x's type (fp16's 2^-11 is inside bf16's 2^-8): error_bound.
    N = 1 and 7 exercise the row padding to 16, q4_0's and q8_0's K = 224 the chunk padding to 128."""
    _need("gguf")
    spec = F.get(fmt)
    k = 4096 if n == 4099 else 224 if spec.block_elems == 32 else 512
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    auto = "frag" if fmt in gguf_frag.AUTO_FRAG else "canonical"
    assert w.to_device(gpu_ctx).layout == auto, "to_device(auto) gives a GPU context the frag layout of AUTO_FRAG"
    wd = w.to_device(gpu_ctx, layout="frag")
    w_deq = w.dequantize()
    terms = gguf_frag.decode_magnitudes(fmt, raw)
    for i, m in enumerate((1, 2, 3, 4, 5, 8, 16, 17, 64, 100)):
        y_dt = (x_dt, F32)[i % 2]
        x = random_x(rng, m, k, x_dt)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
        ref = reference.gemm(x, w_deq)
        exact = bf16_tile.accumulation_bound(x, w_deq, UNIT_ROUNDOFF[y_dt], terms=terms)
        folded = bf16_tile.error_bound(x, w_deq, UNIT_ROUNDOFF[y_dt])

        def check(tier):
            y = _guarded_gemm(gpu_ctx, poisoned_output, xd, wd, m, n, y_dt)
            prefill = tier == 5 or (tier == 0 and m > 16)
            # (M <= 128 here: one prefill launch, no decode_frag tail)
            bound = folded if prefill and (x_dt == BF16 or fmt != "q4_0") else exact
            assert_elementwise(y, ref, bound, f"{fmt} frag tier={tier} x={x_dt} y={y_dt} m={m} n={n} k={k}")
        ran = _run_tiers(gpu_ctx, "gguf", check)
        assert 4 in ran, f"decode_frag did not serve the frag layout (ran: {ran})"
        assert not set(ran) & {1, 2, 3}, f"a block-layout tier took a frag weight (ran: {ran})"


@pytest.mark.parametrize("fmt", gguf_frag.FORMATS)
def test_gguf_gpu_frag_repack_matches_reference(rng, gpu_ctx, fmt):
    """qg_gguf_repack on the device writes the bytes of pyquant.formats.gguf_frag (and of the
    CPU repack), rows of stride ldw included (to_device pads the block rows to 16 bytes; q4_K's
    144-byte rows are 16-byte multiples already, so one shape has unpadded rows too)."""
    _need("gguf")
    spec = F.get(fmt)
    shapes = ((1, 32), (7, 224), (40, 4096 + 32)) if spec.block_elems == 32 else ((1, 256), (7, 768), (40, 4096 + 256))
    for n, k in shapes:
        raw = rng.integers(0, 256, size=(n, k // spec.block_elems * spec.block_bytes), dtype=np.uint8)
        want_w, want_s = gguf_frag.repack(fmt, raw)  # every bit pattern: the repack moves bits
        blocks = pyquant.from_gguf(fmt, raw, shape=(n, k)).to_device(gpu_ctx, layout="canonical")
        r = blocks.repack("frag")
        assert r.layout == "frag" and r.is_device
        np.testing.assert_array_equal(r.raw.to_numpy().reshape(-1).view(np.uint32), want_w.reshape(-1).view(np.uint32))
        np.testing.assert_array_equal(r.scales.to_numpy().reshape(-1).view(np.uint16), want_s.reshape(-1).view(np.uint16))


def test_gguf_gpu_frag_refuses_fp32_x(rng, gpu_ctx, poisoned_output):
    """fp32 x on a frag weight: QG_ERR_UNSUPPORTED naming the 16-bit x the frag tiers take,
    and nothing written."""
    _need("gguf")
    raw = F.get("q4_0").module.random_blocks(rng, 16, 64, d_range=(2.0 ** -8, 2.0 ** -4))
    wd = pyquant.from_gguf("q4_0", raw, shape=(16, 64)).to_device(gpu_ctx, layout="frag")
    xd = pyquant.DeviceArray.from_numpy(random_x(rng, 3, 64, F32), gpu_ctx)
    g = poisoned_output(3, 16, F32, device_ctx=gpu_ctx)
    with pytest.raises(pyquant.QuantGemmError, match="fp16 or bf16 x") as e:
        pyquant.gemm(xd, wd, out=g.y)
    assert e.value.status == _lib.Status.QG_ERR_UNSUPPORTED
    assert g.unchanged(), "a refused call wrote its output"


def int8_model_bound(fmt: str, k: int, mag: np.ndarray, model: np.ndarray, y_dtype) -> np.ndarray:
    """|y - model| bound of the int8 tier: the model (pyquant.formats.int8_act) has the
    kernel's integer dot products and float32 scales exactly; what remains is fp32
    rounding: each term sw * (dx * D) (and q4_K's mw * sx) is rounded twice and the terms
    are summed one after another (K / 32 slices, twice that for q6_K's 16-element units
    and q4_K's min terms, plus the K splits' additions), so
    |err| <= (terms + 8) * u32 * sum|terms| (the standard gamma_n bound), plus rounding y."""
    terms = 2 * (k // 32) + 8
    return (terms + 3) * U32 * mag + UNIT_ROUNDOFF[np.dtype(y_dtype)] * np.abs(model)


def assert_int8_vs_exact(y, x, fmt, raw, ref, y_dtype, name):
    """Elementwise against the exact product: the activation quantization's rigorous bound
    (int8_act.exact_error_bound: sum_k |w| |x - dx xq|) plus the model's fp32 bound. A
    normwise bound does not fit small N: one output can cancel to far below its terms."""
    model, mag = int8_act.gemm_model(x, fmt, raw)
    bound = int8_act.exact_error_bound(x, fmt, raw) + int8_model_bound(fmt, x.shape[1], mag, model, y_dtype)
    assert_elementwise(y, ref, bound, name)


def assert_bf16_tile_vs_exact(y, x, w_deq, y_dtype, name):
    """The prefill tier's rigorous bound (pyquant.formats.bf16_tile), elementwise."""
    bound = bf16_tile.error_bound(x, w_deq, UNIT_ROUNDOFF[np.dtype(y_dtype)])
    assert_elementwise(y, reference.gemm(x, w_deq), bound, name)


def assert_int8_model(y, x, fmt, raw, y_dtype, name):
    model, mag = int8_act.gemm_model(x, fmt, raw)
    bound = int8_model_bound(fmt, x.shape[1], mag, model, y_dtype)
    assert_elementwise(y, model, bound, f"{name}: int8 tier against its model", what="model")


@pytest.mark.parametrize("layout", ["canonical", "frag"])
@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_gpu_one_hot(rng, gpu_ctx, fmt, layout, assert_bitwise_equal):
    """One-hot rows return the decoded weights: bit for bit on the tier that keeps x in
    floating point (1); the int8 tier (2) turns 1.0 into 127 * (1/127) and is held to its
    model (within fp32 rounding of each term: q4_K's (d*sc)*q - dmin*m can cancel, so a
    relative bound on the difference would not hold)."""
    _need("gguf")
    if layout == "frag" and fmt not in gguf_frag.FORMATS:
        pytest.skip(f"{fmt} has no frag layout")
    spec = F.get(fmt)
    n, k = 9, 2 * spec.block_elems
    raw = spec.module.random_blocks(rng, n, k, d_range=None)  # every finite fp16 scale
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    wd = w.to_device(gpu_ctx, layout=layout)
    perm = rng.permutation(k)
    x = np.zeros((k, k), np.float32 if layout == "canonical" else BF16)  # the frag tiers take 16-bit x
    x[np.arange(k), perm] = 1
    want = np.ascontiguousarray(w.dequantize()[:, perm].T + np.float32(0))
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

    def check(tier):
        y = pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy()
        if layout == "frag" and tier != 4:  # the frag prefill (m = k > 16, bf16 x): each weight rounded once to bf16
            assert_bitwise_equal(y, want.astype(BF16).astype(np.float32), f"one-hot {fmt} frag tier={tier}")
            return
        if tier == 2:   # int8 x: 1.0 becomes 127 * (1/127); the model says exactly what to expect
            assert_int8_model(y, x, fmt, raw, F32, f"one-hot {fmt} tier=2")
            return
        if not np.array_equal(y.view(np.uint32), want.view(np.uint32)):
            rel = np.abs(y.astype(np.float64) - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)
            worst = np.unravel_index(np.argmax(rel), rel.shape)
            assert rel[worst] <= 4 * 2.0 ** -23, (
                f"one-hot {fmt} tier={tier}: at {worst} got {y[worst]!r}, want {want[worst]!r}")
    _run_tiers(gpu_ctx, "gguf", check)


# ---------------------------------------------------------------- guard bands, streams

def test_gpu_guard_bands_and_stream(rng, gpu_ctx, poisoned_output, assert_close):
    """A launch on a created stream into a strided window of a larger device buffer writes
    only the window, and the result reports its stream in __cuda_array_interface__."""
    _need("w4a16")
    n, k, m = 40, 512, 9
    w = random_int4(rng, n, k, 64, False, F16)
    wd = w.to_device(gpu_ctx)
    x = random_x(rng, m, k, F16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    s = gpu_ctx.stream()
    g = poisoned_output(m, n, F16, device_ctx=gpu_ctx)
    pyquant.gemm(xd, wd, out=g.y, stream=s)
    s.synchronize()
    assert_close(g.value(), reference.gemm(x, w.dequantize()), w4a16_bound(k, F16), "guarded, stream")
    y = pyquant.gemm(xd, wd, stream=s)
    assert y.__cuda_array_interface__["stream"] == s.handle
    assert_close(y.to_numpy(stream=s), reference.gemm(x, w.dequantize()), w4a16_bound(k, F16), "new output")


# ---------------------------------------------------------------- interop

def test_torch_interop(rng, gpu_ctx, assert_close):
    """torch CUDA tensors in and out through __cuda_array_interface__: bf16 activations
    ('<V2' in current torch), weights held in torch tensors, a strided torch output, a
    torch stream; and torch reading pyquant's own DeviceArray."""
    _need("w4a16")
    torch = pytest.importorskip("torch")
    t = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    assert pyquant.DeviceView.from_object(t).dtype == BF16
    wh = random_int4(rng, 64, 256, 64, False, BF16)
    w = wh.to_device(gpu_ctx)
    ref = reference.gemm(t.float().cpu().numpy(), wh.dequantize())
    y = pyquant.gemm(t, w)
    assert isinstance(y, pyquant.DeviceArray) and y.dtype == BF16
    assert_close(y.to_numpy(), ref, w4a16_bound(256, BF16), "torch bf16 x")
    # torch exports bf16 as '<V2' but does not import it (it takes V2 as numpy void), so a
    # bf16 DeviceArray goes to torch as an int16 view, reinterpreted there
    yt = torch.as_tensor(y.view(dtype=np.int16), device="cuda").view(torch.bfloat16)
    assert_close(yt.float().cpu().numpy(), ref, w4a16_bound(256, BF16), "torch reads a DeviceArray")
    y32 = pyquant.gemm(t, w, out_dtype=np.float32)
    assert_close(torch.as_tensor(y32, device="cuda").cpu().numpy(), ref, w4a16_bound(256, F32),
                 "torch reads an fp32 DeviceArray")
    big = torch.full((8, 80), float("nan"), device="cuda", dtype=torch.float32)
    pyquant.gemm(t, w, out=big[2:6, 3:67])
    torch.cuda.synchronize()
    assert_close(big[2:6, 3:67].cpu().numpy(), ref, w4a16_bound(256, F32), "strided torch out")
    assert torch.isnan(big[:2]).all() and torch.isnan(big[6:]).all() and torch.isnan(big[:, :3]).all() \
        and torch.isnan(big[:, 67:]).all(), "guard band of a torch output written"
    wt = pyquant.Int4Weight(torch.as_tensor(wh.qweight).cuda(),
                            torch.as_tensor(wh.scales.view(np.int16)).cuda().view(torch.bfloat16),
                            torch.as_tensor(wh.qzeros).cuda(), 64)
    assert wt.is_device
    assert_close(pyquant.gemm(t, wt).to_numpy(), ref, w4a16_bound(256, BF16), "torch weights")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y3 = pyquant.gemm(t, w, stream=s)
    s.synchronize()
    assert y3.__cuda_array_interface__["stream"] == s.cuda_stream
    assert_close(y3.to_numpy(), ref, w4a16_bound(256, BF16), "torch stream")


def test_cupy_interop(rng, gpu_ctx, assert_close):
    _need("w4a16")
    cupy = pytest.importorskip("cupy")
    wh = random_int4(rng, 64, 256, 32, True, F16)
    w = wh.to_device(gpu_ctx)
    x = random_x(rng, 3, 256, F16)
    y = pyquant.gemm(cupy.asarray(x), w)
    assert_close(cupy.asnumpy(cupy.asarray(y)), reference.gemm(x, wh.dequantize()),
                 w4a16_bound(256, F16), "cupy x, cupy reads y")


def _to_16(y32: np.ndarray, dt) -> np.ndarray:
    """fp32 -> fp16 / bf16, round to nearest even (numpy's and ml_dtypes' casts)."""
    return y32.astype(dt)


@pytest.mark.parametrize("family", ["w4a16-frag", "w4a16-canonical", "gguf-q4_K", "gguf-q8_0", "gguf-iq3_xxs",
                                    "gguf-q4_0", "gguf-iq3_xxs-canonical"])  # gguf: the frag layout, or the blocks
@pytest.mark.parametrize("bias_dt", [F32, F16, BF16], ids=["b_fp32", "b_fp16", "b_bf16"])
def test_gpu_bias_is_added_once_in_the_epilogue(rng, gpu_ctx, family, bias_dt, assert_bitwise_equal):
    """Every tier, M through decode (1, 5), 16-row decode launches and prefill (17, 40, 300),
    W4A16 split-K forced too: the fp32 output with a bias is fl(y + bias) of the same call's
    output without one, bit for bit (the epilogue adds the bias to the fp32 sum, after the
    split-K reduction), and a 16-bit output is that fp32 value rounded once."""
    kind = family.split("-")[0]
    _need(kind)
    n = 200
    if kind == "w4a16":
        k, x_dt = 512, BF16
        w = random_int4(rng, n, k, 128, False, BF16).to_device(gpu_ctx, layout=family.split("-")[1])
    else:
        fmt, layout = (family.split("-") + ["auto"])[1:3]
        k, x_dt = 512, BF16
        raw = F.get(fmt).module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
        w = pyquant.from_gguf(fmt, raw, shape=(n, k)).to_device(gpu_ctx, layout=layout)
    b = rng.standard_normal(n).astype(np.float32).astype(bias_dt)
    wb = w.with_bias(pyquant.DeviceArray.from_numpy(b, gpu_ctx))
    splits = (0, 3) if kind == "w4a16" else (0,)
    for m in (1, 5, 17, 40, 300):
        xd = pyquant.DeviceArray.from_numpy(random_x(rng, m, k, x_dt), gpu_ctx)

        def check(tier):
            for split in splits:
                if kind == "w4a16":
                    gpu_ctx.set_option("split_k", split)
                name = f"{family} tier={tier} split_k={split} m={m} bias={bias_dt}"
                y0 = pyquant.gemm(xd, w, out_dtype=F32).to_numpy()
                y32 = pyquant.gemm(xd, wb, out_dtype=F32).to_numpy()
                assert_bitwise_equal(y32, y0 + b.astype(np.float32)[None, :], name)
                y16 = pyquant.gemm(xd, wb).to_numpy()
                assert_bitwise_equal(y16, _to_16(y32, x_dt), name + " (bf16 y)")
        try:
            _run_tiers(gpu_ctx, kind, check)
        finally:
            gpu_ctx.set_option("split_k", 0)
