"""The GGUF prefill tier (gguf_tier 3, `<gpu>:prefill_wgmma`, hip/gguf_prefill.hip) against
the exact product of the reference weights (marked `gpu`: skipped without a GPU, and where
the tier does not run: builds without sm_90a, GPUs other than sm_90).

Every format of the registry, bf16 x, y in bf16 and fp32, M around and past the 128- and
256-token tiles and the auto policy's 8- and 16-row limits (1, 9, 16, 17, 100, 130, 300, 517:
a 5-token tail past 512), N past the 128-row tile (200), K not a multiple of the 64-k step or
of the 256-element chunk where the format allows it; rows of the weight 16-byte padded (as
GGUFWeight.to_device lays them) and unpadded, 2 bytes off a word; guard bands around y;
auto taking the tier above 8 rows of bf16 x. Bounds: pyquant.formats.bf16_tile (rigorous).
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import assert_elementwise, registry_formats
from pyquant import _lib, tiers
from pyquant import formats as F
from pyquant.formats import bf16_tile, reference

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
UNIT_ROUNDOFF = {F32: 2.0 ** -24, BF16: 2.0 ** -8}
GGUF_FORMATS = registry_formats("gguf")
SUFFIX = ":prefill_wgmma"


def _tier_name() -> str:
    name = next((t for t in tiers.tiers().get("gguf", []) if t.endswith(SUFFIX)), None)
    if name is None:
        pytest.skip(f"this build has no GGUF prefill tier: {pyquant.build_info()}")
    return name


def _k_for(spec) -> int:
    # 32-element formats: 11 blocks (K = 352: a partial 64-k step and a partial chunk);
    # 256-element formats: 3 blocks (768: the chunk loop runs more than twice)
    return 11 * 32 if spec.block_elems == 32 else 3 * 256


def _assert_within(y, x, w_deq, y_dt, name):
    ref = reference.gemm(x, w_deq)
    bound = bf16_tile.error_bound(x, w_deq, UNIT_ROUNDOFF[np.dtype(y_dt)])
    assert np.all(np.isfinite(np.asarray(y, np.float64))), f"{name}: non-finite output"
    assert_elementwise(y, ref, bound, name)


def _run(gpu_ctx, tier, call):
    gpu_ctx.set_tier("gguf", tier)
    try:
        return call()
    except pyquant.QuantGemmError as e:
        if tier != "auto" and e.status == _lib.Status.QG_ERR_UNSUPPORTED:
            pytest.skip(f"{tier} does not run here: {e}")
        raise
    finally:
        gpu_ctx.set_tier("gguf", "auto")


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_prefill_every_format(rng, gpu_ctx, fmt, poisoned_output):
    name = _tier_name()
    spec = F.get(fmt)
    n, k = 200, _k_for(spec)
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    wd, w_deq = w.to_device(gpu_ctx, layout="canonical"), w.dequantize()  # the blocks (q4_0 has a frag layout too)
    for i, m in enumerate((1, 9, 16, 17, 100, 130, 300, 517)):
        y_dt = (BF16, F32)[i % 2]
        x = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
        xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)

        def call():
            g = poisoned_output(m, n, y_dt, device_ctx=gpu_ctx)
            pyquant.gemm(xd, wd, out=g.y)
            return g.value()
        y = _run(gpu_ctx, name, call)
        _assert_within(y, x, w_deq, y_dt, f"{fmt} {name} m={m} n={n} k={k} y={y_dt}")


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_prefill_unpadded_rows(rng, gpu_ctx, fmt):
    """Rows packed back to back (ldw = K / BE * BB, 2 mod 4 for an odd number of q8_0 or
    q6_K blocks): the kernel's aligned word copies start 2 bytes before a row and must not
    read past the last block (compute-sanitizer memcheck checks the latter)."""
    name = _tier_name()
    spec = F.get(fmt)
    n, m = 131, 40
    k = 5 * spec.block_elems if spec.block_elems == 256 else 13 * 32
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    x = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    dev = gpu_ctx
    W = pyquant.DeviceArray.from_numpy(np.ascontiguousarray(raw), dev)
    X = pyquant.DeviceArray.from_numpy(x, dev)
    Y = pyquant.DeviceArray.empty((m, n), F32, dev)
    a = _lib.qg_gguf_gemm_args(format=spec.qg_format, m=m, n=n, k=k, x_dtype=_lib.DType.QG_DTYPE_BF16,
                               y_dtype=_lib.DType.QG_DTYPE_F32, x=X.ptr, ldx=k, w=W.ptr, ldw=raw.shape[1],
                               y=Y.ptr, ldy=n)
    _run(gpu_ctx, name, lambda: _lib.qg_gguf_gemm(gpu_ctx.handle, ctypes.byref(a), None))
    gpu_ctx.synchronize()
    _assert_within(Y.to_numpy(), x, spec.module.dequantize(raw), F32, f"{fmt} unpadded ldw={raw.shape[1]}")


def test_gguf_prefill_auto_above_eight_rows(rng, gpu_ctx):
    """auto runs the prefill tier for bf16 x above 8 rows where it is usable (above 16 when
    its grid is under one wave, as here): the result is within its bound and, forced, the
    tier gives the same bits."""
    name = _tier_name()
    spec = F.get("q4_K")
    n, k, m = 256, 512, 64
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.from_gguf("q4_K", raw, shape=(n, k))
    wd = w.to_device(gpu_ctx, layout="canonical")  # the blocks (q4_K has a frag layout too)
    x = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    xd = pyquant.DeviceArray.from_numpy(x, gpu_ctx)
    forced = _run(gpu_ctx, name, lambda: pyquant.gemm(xd, wd, out_dtype=F32).to_numpy())
    auto = pyquant.gemm(xd, wd, out_dtype=F32).to_numpy()
    _assert_within(auto, x, w.dequantize(), F32, "q4_K auto m=64")
    assert np.array_equal(auto.view(np.uint32), forced.view(np.uint32)), "auto above 8 rows is not the prefill tier"


def test_gguf_prefill_refuses_fp16_x(rng, gpu_ctx):
    """Forced on fp16 x the tier answers QG_ERR_UNSUPPORTED naming why (bf16 only)."""
    name = _tier_name()
    spec = F.get("q8_0")
    raw = spec.module.random_blocks(rng, 16, 64, d_range=(2.0 ** -8, 2.0 ** -4))
    wd = pyquant.from_gguf("q8_0", raw, shape=(16, 64)).to_device(gpu_ctx, layout="canonical")  # this tier's blocks
    xd = pyquant.DeviceArray.from_numpy(rng.standard_normal((20, 64)).astype(np.float16), gpu_ctx)
    gpu_ctx.set_tier("gguf", name)
    try:
        with pytest.raises(pyquant.QuantGemmError, match="bf16 x only"):
            pyquant.gemm(xd, wd)
    finally:
        gpu_ctx.set_tier("gguf", "auto")
