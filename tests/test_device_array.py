"""Device arrays without a GPU: __cuda_array_interface__ parsing with stand-in objects,
dtype mapping (bfloat16 as '<V2'), stride checks, and pyquant.DeviceArray on the CPU
context (qg_malloc'd host memory), which runs the device-array code path of gemm/moe on
any machine."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant.device import DeviceView, parse_cuda_array_interface

BF16 = np.dtype(ml_dtypes.bfloat16)


class StandIn:
    """An object exposing a given __cuda_array_interface__ (never dereferenced here)."""

    def __init__(self, **cai):
        base = {"shape": (4, 8), "typestr": "<f2", "data": (0x7F0000001000, False), "version": 3}
        base.update(cai)
        self.__cuda_array_interface__ = {k: v for k, v in base.items() if v is not ...}


# ---------------------------------------------------------------- interface parsing

@pytest.mark.parametrize("typestr,dtype", [
    ("<f2", np.float16), ("<f4", np.float32), ("<V2", BF16), ("|u1", np.uint8),
    ("<i4", np.int32), ("<u4", np.uint32), ("=f4", np.float32),
])
def test_typestr_mapping(typestr, dtype):
    ptr, shape, strides, dt, stream = parse_cuda_array_interface(
        StandIn(typestr=typestr).__cuda_array_interface__)
    assert dt == np.dtype(dtype) and shape == (4, 8) and ptr == 0x7F0000001000
    assert strides == (8 * dt.itemsize, dt.itemsize)  # None -> explicit C strides
    assert stream is None


def test_bfloat16_typestr_is_what_ml_dtypes_reports():
    """'<V2' is np.dtype(ml_dtypes.bfloat16).str, and what PyTorch reports for bf16 tensors."""
    assert BF16.str == "<V2"
    v = DeviceView.from_object(StandIn(typestr="<V2"))
    assert v.dtype == BF16 and v.__cuda_array_interface__["typestr"] == "<V2"


def test_dtype_override_for_producers_that_label_bf16_as_f2():
    v = DeviceView.from_object(StandIn(typestr="<f2"), dtype="bfloat16")
    assert v.dtype == BF16
    with pytest.raises(ValueError, match=r"dtype override float32 has itemsize 4 but the interface reports typestr '<f2'"):
        DeviceView.from_object(StandIn(typestr="<f2"), dtype="float32")


def test_row_stride_is_accepted_and_reported():
    v = DeviceView.from_object(StandIn(shape=(3, 5), strides=(16, 2)))
    assert v.strides == (16, 2) and not v.is_c_contiguous()
    assert pyquant.api._ld(v, "x") == 8
    assert v.__cuda_array_interface__["strides"] == (16, 2)


@pytest.mark.parametrize("cai,pattern", [
    (dict(typestr=">f2"), r"typestr '>f2' is not a little-endian"),
    (dict(typestr="<f8x"), r"typestr '<f8x' is not supported"),
    (dict(typestr="<c8"), r"typestr '<c8' is not supported"),
    (dict(strides=(10, 3)), r"stride 3 bytes of axis 1 is not a multiple of the item size 2"),
    (dict(strides=(16,)), r"1 strides for a 2-D shape"),
    (dict(data=(0, False)), r"data pointer is NULL for a non-empty array"),
    (dict(mask=object()), r"masked arrays"),
    (dict(stream=0), r"stream 0 is disallowed"),
    (dict(version=4), r"version 4 is not 0..3"),
    (dict(shape=...), r"lacks the required key 'shape'"),
    (dict(data=12345), r"'data' must be a \(pointer, read_only\) tuple"),
])
def test_interface_errors(cai, pattern):
    with pytest.raises(pyquant.QuantGemmError, match=pattern) as info:
        DeviceView.from_object(StandIn(**cai), "x")
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("x: ")


def test_stream_is_read_from_v3_only():
    assert parse_cuda_array_interface(StandIn(stream=2).__cuda_array_interface__)[4] == 2
    assert parse_cuda_array_interface(StandIn(stream=2, version=2).__cuda_array_interface__)[4] is None


def test_column_stride_is_refused_for_activations():
    v = DeviceView.from_object(StandIn(shape=(4, 8), strides=(2, 8)))  # a transposed view
    with pytest.raises(ValueError, match=r"x must have unit stride along its columns"):
        pyquant.api._ld(v, "x")


def test_foreign_device_array_without_gpu_context(rng, monkeypatch):
    """x on a device but no GPU context: a clear error before anything is launched."""
    monkeypatch.setattr(pyquant.device, "_gpu_probe", (None, "test: no device"))
    w = pyquant.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q8_0")
    dev = w.to_host()  # host weight
    x = StandIn(shape=(2, 64), typestr="<f4")
    with pytest.raises(pyquant.QuantGemmError, match=r"in host memory but x in device memory"):
        pyquant.gemm(x, dev)
    wd = pyquant.GGUFWeight("q8_0", StandIn(shape=(8, 68), typestr="|u1"))
    assert wd.is_device and wd.shape == (8, 64)
    with pytest.raises(pyquant.QuantGemmError, match=r"no GPU context available \(test: no device\)"):
        pyquant.gemm(x, wd)


# ---------------------------------------------------------------- DeviceArray on the CPU context

@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32, np.uint8])
def test_roundtrip(rng, ctx, dtype, assert_bitwise_equal):
    a = (rng.standard_normal((5, 7)) * 100).astype(np.float32).astype(dtype)
    d = pyquant.DeviceArray.from_numpy(a, ctx)
    assert d.shape == (5, 7) and d.dtype == np.dtype(dtype) and d.nbytes == a.nbytes
    assert d.ptr % 64 == 0  # qg_malloc on the CPU backend: 64-byte aligned
    assert_bitwise_equal(d.to_numpy(), a, f"roundtrip {np.dtype(dtype)}")
    assert not hasattr(d, "__cuda_array_interface__")  # host memory has none


def test_empty_and_zero_size(ctx):
    d = pyquant.DeviceArray.empty((0, 4), np.float16, ctx)
    assert d.nbytes == 0 and d.to_numpy().shape == (0, 4)
    e = pyquant.DeviceArray.empty(16, np.uint8, ctx)
    e.fill_bytes(0xAB)
    assert (e.to_numpy() == 0xAB).all()


def test_window_keeps_the_row_stride(rng, ctx):
    a = rng.standard_normal((6, 10)).astype(np.float32)
    d = pyquant.DeviceArray.from_numpy(a, ctx)
    v = d.window(1, 2, 3, 4)
    assert v.strides == (40, 4) and v.ptr == d.ptr + (1 * 10 + 2) * 4
    with pytest.raises(ValueError, match=r"exceed shape"):
        d.window(4, 0, 3, 4)


def test_gemm_with_device_arrays_on_the_cpu_context(rng, ctx, poisoned_output, assert_bitwise_equal):
    """Weights moved with to_device(ctx) and DeviceArray activations give the same bits as
    numpy operands, and the result is a DeviceArray of that context."""
    W = rng.standard_normal((24, 128)).astype(np.float32)
    x = rng.standard_normal((5, 128)).astype(np.float32).astype(BF16)
    for fmt in ("int4", "q4_0", "mxfp4"):
        w = pyquant.quantize(W, fmt)
        wd = w.to_device(ctx)
        assert wd.ctx is ctx and not wd.is_device and wd.shape == w.shape
        assert wd.nbytes == w.nbytes
        y = pyquant.gemm(pyquant.DeviceArray.from_numpy(x, ctx), wd)
        assert isinstance(y, pyquant.DeviceArray) and y.ctx is ctx
        assert_bitwise_equal(y.to_numpy(), pyquant.gemm(x, w), f"{fmt} device path")
        assert_bitwise_equal(wd.dequantize(), w.dequantize(), f"{fmt} dequantize from device")
        # guard bands around a device output (ldy > n, rows before and after)
        g = poisoned_output(5, 24, BF16, device_ctx=ctx)
        pyquant.gemm(pyquant.DeviceArray.from_numpy(x, ctx), wd, out=g.y)
        assert_bitwise_equal(g.value(), y.to_numpy(), f"{fmt} into a guarded device output")


def test_moe_with_device_arrays_on_the_cpu_context(rng, ctx, assert_bitwise_equal):
    e, top_k, h, inter, t = 4, 2, 64, 32, 6
    W13 = rng.standard_normal((e, 2 * inter, h)).astype(np.float32)
    W2 = rng.standard_normal((e, h, inter)).astype(np.float32)
    w13, w2 = pyquant.quantize(W13, "mxfp4"), pyquant.quantize(W2, "mxfp4")
    x = rng.standard_normal((t, h)).astype(np.float32).astype(BF16)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t)]).astype(np.int32)
    wts = rng.uniform(0.1, 1, size=(t, top_k)).astype(np.float32)
    y_host = pyquant.moe(x, ids, wts, w13, w2)
    D = lambda a: pyquant.DeviceArray.from_numpy(a, ctx)  # noqa: E731
    y_dev = pyquant.moe(D(x), D(ids), D(wts), w13.to_device(ctx), w2.to_device(ctx))
    assert isinstance(y_dev, pyquant.DeviceArray)
    assert_bitwise_equal(y_dev.to_numpy(), y_host, "moe device path")
    with pytest.raises(ValueError, match=r"topk_ids has dtype int64; the kernels read int32"):
        pyquant.moe(D(x), D(ids.astype(np.int64)), D(wts), w13.to_device(ctx), w2.to_device(ctx))


def test_contexts_streams_events(ctx):
    assert ctx.backend == "cpu" and not ctx.is_gpu and ctx.device_name
    s = ctx.stream()
    start, stop = ctx.event(), ctx.event()
    start.record(s)
    sum(range(10000))
    stop.record(s)
    stop.synchronize()
    s.synchronize()
    ctx.synchronize(s)
    assert start.elapsed_ms(stop) >= 0.0
    with pytest.raises(pyquant.QuantGemmError, match=r"start was never recorded"):
        ctx.event().elapsed_ms(stop)


def test_default_context_honours_pyquant_backend(monkeypatch):
    monkeypatch.setenv("PYQUANT_BACKEND", "cpu")
    monkeypatch.setattr(pyquant.device, "_gpu_probe", None)
    monkeypatch.setattr(pyquant.device, "_default_ctx", None)
    assert pyquant.default_context().backend == "cpu"
    assert not pyquant.gpu_available()
    monkeypatch.setenv("PYQUANT_BACKEND", "tpu")
    monkeypatch.setattr(pyquant.device, "_gpu_probe", None)
    with pytest.raises(ValueError, match=r"PYQUANT_BACKEND='tpu' is not one of"):
        pyquant.gpu_available()


def test_mixed_contexts_are_refused(rng, ctx):
    other = pyquant.Context("cpu")
    w = pyquant.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q8_0").to_device(ctx)
    x = pyquant.DeviceArray.from_numpy(rng.standard_normal((2, 64)).astype(np.float32), other)
    with pytest.raises(ValueError, match=r"operands belong to different contexts"):
        pyquant.gemm(x, w)
