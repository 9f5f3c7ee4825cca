"""The tier tables (src/tier_table.h) as the ABI shows them, on the CPU.

qg_build_info lists each family's tiers by name; qg_context_set_tier forces one by name or
goes back to "auto"; an unknown family or tier is an InvalidArgumentError naming what is
valid; a forced tier that cannot serve the call is QG_ERR_UNSUPPORTED naming it and why,
and writes nothing; the numeric *_tier option replaces a forced name. A frag-layout weight
runs on the CPU tier with the same bits as its canonical twin (the CPU tier unpacks it).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant import _lib, tiers
from pyquant.formats import reference
from conftest import FP32_EXACT

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_build_info_lists_every_family_with_a_cpu_tier():
    listed = tiers.tiers()
    assert set(listed) == {"w4a16", "gguf", "mxfp4", "moe"}, listed
    for family, names in listed.items():
        assert names[0] == "cpu", (family, names)
        assert len(set(names)) == len(names), names
        for n in names[1:]:
            assert tiers.backend_of(n) in ("cuda", "hip") and ":" in n, n


def test_parse_old_and_new_build_strings():
    old = "quantgemm 0.1.0 format 1; backends: cpu cuda(sm_90a); tiers: w4a16=cpu,cuda gguf=cpu,cuda(sm_90a) " \
          "mxfp4=cpu moe=cpu; build: Release g++"
    assert tiers.parse(old)["gguf"] == ["cpu", "cuda(sm_90a)"]
    assert tiers.has_backend(old, "gguf", "cuda") and not tiers.has_backend(old, "moe", "cuda")
    new = "quantgemm 0.1.0 format 2; backends: cpu cuda(sm_90a); tiers: w4a16=cpu,cuda:simt,cuda:decode_frag " \
          "gguf=cpu mxfp4=cpu moe=cpu; build: Release g++"
    assert tiers.parse(new)["w4a16"] == ["cpu", "cuda:simt", "cuda:decode_frag"]
    assert tiers.has_backend(new, "w4a16", "cuda") and not tiers.has_backend(new, "gguf", "cuda")
    assert tiers.has_backend("no tier list", "w4a16", "cuda")


def _int4(rng, n=64, k=256, g=64):
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = rng.uniform(0.5, 2.0, size=(n, k // g)).astype(np.float32).astype(BF16)
    qzeros = rng.integers(0, 2 ** 32, size=(n // 8, k // g), dtype=np.uint32).view(np.int32)
    return pyquant.Int4Weight(qweight, scales, qzeros, g)


def test_set_tier_by_name_and_back_to_auto(rng, assert_close):
    ctx = pyquant.Context("cpu")
    ctx.set_option("cpu_precision", FP32_EXACT)  # the bound below is the fp32-exact path's
    w = _int4(rng)
    x = rng.standard_normal((3, 256)).astype(np.float32).astype(BF16)
    xd = pyquant.DeviceArray.from_numpy(x, ctx)
    wd = w.to_device(ctx)
    ref = reference.gemm(x, w.dequantize())
    ctx.set_tier("w4a16", "cpu")
    assert_close(pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy(), ref, 1e-5, "forced cpu")
    ctx.set_tier("w4a16", "auto")
    assert_close(pyquant.gemm(xd, wd, out_dtype=np.float32).to_numpy(), ref, 1e-5, "auto")


def test_set_tier_refuses_unknown_names():
    ctx = pyquant.Context("cpu")
    with pytest.raises(pyquant.InvalidArgumentError, match=r'family="bogus" is not a kernel family \(w4a16, gguf'):
        ctx.set_tier("bogus", "cpu")
    with pytest.raises(pyquant.InvalidArgumentError, match=r'tier="nope" is not a w4a16 tier of this build \(auto, cpu'):
        ctx.set_tier("w4a16", "nope")
    with pytest.raises(pyquant.InvalidArgumentError, match="tier is NULL"):
        _lib.qg_context_set_tier(ctx.handle, b"w4a16", None)


def test_forced_gpu_tier_on_a_cpu_context_is_refused_and_writes_nothing(rng):
    """In a GPU build the GPU tiers are listed; forced on a CPU context they answer
    QG_ERR_UNSUPPORTED with their name and the reason, and y is untouched."""
    gpu_names = [t for t in tiers.tiers()["w4a16"] if t != "cpu"]
    if not gpu_names:
        pytest.skip("CPU-only build: no GPU tier to force")
    ctx = pyquant.Context("cpu")
    ctx.set_option("cpu_precision", FP32_EXACT)  # the bound below is the fp32-exact path's
    w = _int4(rng)
    x = rng.standard_normal((3, 256)).astype(np.float32).astype(BF16)
    y = np.full((3, 64), np.nan, np.float32)
    ctx.set_tier("w4a16", gpu_names[0])
    with pytest.raises(pyquant.QuantGemmError, match=f"{gpu_names[0]}.*cannot serve this call.*CPU context") as e:
        pyquant.gemm(x, w, out=y, ctx=ctx)
    assert e.value.status == _lib.Status.QG_ERR_UNSUPPORTED
    assert np.isnan(y).all()


def test_numeric_option_replaces_a_forced_name(rng):
    """Setting w4a16_tier (any value) clears a name forced with set_tier: on a CPU context
    the numeric option never applies, so the call runs on the CPU tier again."""
    ctx = pyquant.Context("cpu")
    names = tiers.tiers()["w4a16"]
    forced = names[-1] if len(names) > 1 else None
    w = _int4(rng)
    x = rng.standard_normal((2, 256)).astype(np.float32).astype(BF16)
    if forced is not None:
        ctx.set_tier("w4a16", forced)
        with pytest.raises(pyquant.QuantGemmError):
            pyquant.gemm(x, w, ctx=ctx)
    ctx.set_option("w4a16_tier", 2)
    pyquant.gemm(x, w, ctx=ctx)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("g", [32, 64, 128])
def test_frag_layout_on_the_cpu_tier_is_bitwise_the_canonical_result(rng, g, symmetric, assert_bitwise_equal):
    """N = 40 and K = 3 * 128 + G need padding in the frag layout; the CPU tier unpacks the
    planes exactly, so every output bit matches the canonical weight's."""
    n, k = 40, 3 * 128 + g
    w = _int4(rng, n, k, g)
    if symmetric:
        w = pyquant.Int4Weight(w.qweight, w.scales, None, g)
    f = w.repack()
    assert f.layout == "frag" and f.shape == w.shape
    x = rng.standard_normal((5, k)).astype(np.float32).astype(BF16)
    assert_bitwise_equal(pyquant.gemm(x, f, out_dtype=np.float32), pyquant.gemm(x, w, out_dtype=np.float32),
                         f"frag vs canonical g{g}")
    assert f.repack("frag") is f
    back = f.repack("canonical")
    np.testing.assert_array_equal(back.qweight, w.qweight)


def test_frag_weight_checks_its_planes(rng):
    w = _int4(rng)
    f = w.repack()
    with pytest.raises(pyquant.InvalidArgumentError, match="needs shape="):
        pyquant.Int4Weight(f.qweight, f.scales, f.qzeros, 64, layout="frag")
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag qweight plane holds \d+ elements"):
        pyquant.Int4Weight(f.qweight[:1], f.scales, f.qzeros, 64, layout="frag", shape=w.shape)
    with pytest.raises(pyquant.InvalidArgumentError, match="frag qzeros plane has dtype int32"):
        pyquant.Int4Weight(f.qweight, f.scales, f.qzeros.astype(np.int32), 64, layout="frag", shape=w.shape)
    with pytest.raises(pyquant.InvalidArgumentError, match="layout='tiled' is not one of"):
        pyquant.Int4Weight(f.qweight, f.scales, f.qzeros, 64, layout="tiled", shape=w.shape)


def test_repack_args_are_checked():
    """qg_w4a16_repack refuses what it cannot do before touching memory."""
    ctx = pyquant.Context("cpu")
    q = np.zeros((64, 32), np.int32)
    s = np.zeros((64, 2), np.float16)
    out = np.zeros(1 << 16, np.uint8)
    a = _lib.qg_w4a16_repack_args(layout=_lib.W4A16Layout.QG_W4A16_LAYOUT_CANONICAL, n=64, k=256,
                                  group_size=128, scale_dtype=_lib.DType.QG_DTYPE_F16,
                                  qweight=q.ctypes.data, scales=s.ctypes.data,
                                  out_qweight=out.ctypes.data, out_scales=out.ctypes.data + 32768)
    import ctypes
    with pytest.raises(pyquant.InvalidArgumentError, match="produces QG_W4A16_LAYOUT_FRAG"):
        _lib.qg_w4a16_repack(ctx.handle, ctypes.byref(a), None)
    a.layout = _lib.W4A16Layout.QG_W4A16_LAYOUT_FRAG
    a.out_scales = out.ctypes.data + 64   # overlaps out_qweight (8 KB)
    with pytest.raises(pyquant.InvalidArgumentError, match="out_scales overlaps out_qweight"):
        _lib.qg_w4a16_repack(ctx.handle, ctypes.byref(a), None)
    a.out_scales = q.ctypes.data          # overlaps an input
    with pytest.raises(pyquant.InvalidArgumentError, match="overlaps an input"):
        _lib.qg_w4a16_repack(ctx.handle, ctypes.byref(a), None)
    a.out_scales = out.ctypes.data + 32768
    a.out_qzeros = out.ctypes.data + 49152  # qzeros is NULL
    with pytest.raises(pyquant.InvalidArgumentError, match="out_qzeros must be given exactly when qzeros is"):
        _lib.qg_w4a16_repack(ctx.handle, ctypes.byref(a), None)
    assert not out.any(), "a refused repack wrote its output"
