"""DLPack in and out, and activations [..., K].

Without torch the producers are numpy (DLPack 1.0 capsules) and wrappers that hide
everything but __dlpack__ (so the DLPack path, not the numpy one, is taken), including a
pre-1.0 producer that refuses max_version. With torch (CPU in CI) torch tensors go in and
torch.from_dlpack takes the results out. The device side is checked without a GPU by a
producer that claims CUDA memory: the stream it is handed and the refusal that follows
(no GPU context); the GPU tests at the end run where a CUDA device is.

Every comparison is bit for bit against the same call on numpy arrays: a DLPack operand
is the same memory, so nothing may change by the route it took.
"""
from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant import dlpack

BF16 = np.dtype(ml_dtypes.bfloat16)


class OnlyDLPack:
    """An array seen only through __dlpack__ / __dlpack_device__ (like a JAX array)."""

    def __init__(self, a, legacy: bool = False):
        self.a, self.legacy, self.calls = a, legacy, []

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None, **kw):
        self.calls.append(dict(stream=stream, max_version=max_version))
        if self.legacy and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if self.legacy:
            return self.a.__dlpack__(stream=stream)
        return self.a.__dlpack__(stream=stream, max_version=max_version)


class ClaimsCUDA:
    """A producer that says its memory is on CUDA device 0 (a pyquant host capsule under a
    CUDA device tag): never dereferenced, the call is refused before any launch."""

    def __init__(self, a):
        self.a, self.streams = a, []

    def __dlpack_device__(self):
        return dlpack.KDL_CUDA, 0

    def __dlpack__(self, stream=None, max_version=None, **kw):
        self.streams.append(stream)
        return dlpack.export_capsule(self.a.ctypes.data, self.a.shape, self.a.dtype, self.a.strides,
                                     (dlpack.KDL_CUDA, 0), self.a, versioned=True)


def _weights(rng, n=24, k=256):
    W = rng.standard_normal((n, k)).astype(np.float32)
    return {"int4": pyquant.quantize(W, "int4", group_size=64),
            "q4_K": pyquant.quantize(W, "q4_K"),
            "mxfp4": pyquant.quantize(W, "mxfp4")}


def _assert_same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    assert a.tobytes() == b.tobytes(), f"{what}: values differ"


# ---------------------------------------------------------------- activations [..., K]

@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 3), (2, 1, 4), (0, 5)])
def test_x_of_any_leading_shape_gives_y_of_that_shape(rng, lead):
    w = _weights(rng)["q4_K"]
    x = rng.standard_normal(lead + (256,)).astype(np.float16)
    y = pyquant.gemm(x, w)
    assert y.shape == lead + (24,) and y.dtype == np.float16
    rows = pyquant.gemm(x.reshape(-1, 256), w)
    _assert_same(y.reshape(-1, 24), rows, f"x {lead + (256,)}")


def test_strided_numpy_x_is_copied_and_out_must_collapse(rng):
    w = _weights(rng)["q4_K"]
    x = rng.standard_normal((3, 2, 256)).astype(np.float32).transpose(1, 0, 2)  # rows not evenly spaced
    _assert_same(pyquant.gemm(x, w), pyquant.gemm(np.ascontiguousarray(x), w), "transposed x")
    out = np.empty((3, 2, 24), np.float32).transpose(1, 0, 2)
    with pytest.raises(pyquant.QuantGemmError, match=r"out has shape \(2, 3, 24\) .* do not collapse "
                                                     r"into rows \[6, 24\] in place"):
        pyquant.gemm(x, w, out=out)
    out = np.empty((2, 3, 24), np.float32)
    assert pyquant.gemm(x, w, out=out) is out
    _assert_same(out, pyquant.gemm(x, w), "out [2, 3, 24]")


def test_device_array_x_of_three_axes(rng, ctx):
    w = _weights(rng)["mxfp4"]
    x = rng.standard_normal((2, 3, 256)).astype(BF16)
    y = pyquant.gemm(pyquant.DeviceArray.from_numpy(x, ctx), w)
    assert isinstance(y, pyquant.DeviceArray) and y.shape == (2, 3, 24)
    _assert_same(y.to_numpy(), pyquant.gemm(x, w), "DeviceArray x [2, 3, K]")


def test_moe_takes_x_of_any_leading_shape(rng):
    e, h, inter, top_k = 4, 64, 32, 2
    w13 = pyquant.quantize(rng.standard_normal((e, 2 * inter, h)).astype(np.float32), "mxfp4")
    w2 = pyquant.quantize(rng.standard_normal((e, h, inter)).astype(np.float32), "mxfp4")
    x = rng.standard_normal((2, 3, h)).astype(np.float32)
    ids = rng.integers(0, e, (2, 3, top_k)).astype(np.int32)
    wts = rng.random((2, 3, top_k)).astype(np.float32)
    y = pyquant.moe(x, ids, wts, w13, w2)
    assert y.shape == (2, 3, h)
    flat = pyquant.moe(x.reshape(6, h), ids.reshape(6, top_k), wts.reshape(6, top_k), w13, w2)
    _assert_same(y.reshape(6, h), flat, "moe x [2, 3, H]")
    with pytest.raises(pyquant.QuantGemmError, match=r"topk_ids has 4 rows .* expected \[\.\.\., top_k\] "
                                                     r"with T=6 rows"):
        pyquant.moe(x, ids[:, :2].reshape(4, top_k), wts[:, :2].reshape(4, top_k), w13, w2)


# ---------------------------------------------------------------- DLPack in (no torch)

@pytest.mark.parametrize("legacy", [False, True])
def test_dlpack_x_weight_and_out(rng, legacy):
    w = _weights(rng)["int4"]
    x = rng.standard_normal((2, 3, 256)).astype(np.float16)
    want = pyquant.gemm(x, w)
    px = OnlyDLPack(x, legacy)
    y = pyquant.gemm(px, w)
    assert isinstance(y, pyquant.DeviceArray) and not y.on_device and y.shape == (2, 3, 24)
    _assert_same(np.asarray(y), want, "DLPack x")
    assert px.calls[-1]["stream"] is None  # host memory: no stream
    out = np.zeros((2, 3, 24), np.float16)
    assert pyquant.gemm(x, w, out=OnlyDLPack(out, legacy)) is not None
    _assert_same(out, want, "DLPack out")
    # bf16 scales: numpy cannot export bfloat16, a host DeviceArray can
    scales = pyquant.DeviceArray.from_numpy(w.scales, pyquant.cpu_context())
    wq = pyquant.Int4Weight(OnlyDLPack(w.qweight, legacy), OnlyDLPack(scales, legacy),
                            OnlyDLPack(w.qzeros, legacy), group_size=64)
    _assert_same(pyquant.gemm(x, wq), want, "DLPack weight components")


def test_bfloat16_round_trips_through_dlpack(rng):
    """numpy cannot export or import bfloat16 over DLPack; pyquant does, both ways."""
    w = _weights(rng)["q4_K"]
    x = rng.standard_normal((5, 256)).astype(BF16)
    y = pyquant.gemm(OnlyDLPack(pyquant.DeviceArray.from_numpy(x, pyquant.cpu_context())), w)
    back = dlpack.import_array(y, "y")           # our consumer on our producer's capsule
    assert back.dtype == BF16
    _assert_same(back, pyquant.gemm(x, w), "bf16 y")


def test_read_only_dlpack_out_is_refused(rng):
    w = _weights(rng)["q4_K"]
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out = np.zeros((2, 24), np.float32)
    out.flags.writeable = False  # numpy exports it with DLPack 1.0's read-only flag
    with pytest.raises(pyquant.QuantGemmError, match="out is a read-only array"):
        pyquant.gemm(x, w, out=OnlyDLPack(out))
    assert not out.any()


def test_dlpack_refusals_name_the_argument(rng):
    w = _weights(rng)["q4_K"]
    with pytest.raises(pyquant.QuantGemmError, match=r"x has dtype float64; expected float16, "
                                                     r"bfloat16 or float32 \(GGUF\) for pyquant.gemm "
                                                     r"with a q4_K weight"):
        pyquant.gemm(OnlyDLPack(np.zeros((2, 256), np.float64)), w)
    with pytest.raises(pyquant.QuantGemmError, match=r"x has DLPack dtype code 5 bits 64 lanes 1; "
                                                     r"pyquant reads float16, bfloat16, float32"):
        pyquant.gemm(OnlyDLPack(np.zeros((2, 256), np.complex64)), w)
    int4 = _weights(rng)["int4"]
    with pytest.raises(pyquant.QuantGemmError, match=r"x has dtype float64; expected float16 or "
                                                     r"bfloat16 \(W4A16\) for pyquant.gemm with an? int4"):
        pyquant.gemm(np.zeros((2, 256)), int4)

    class Vulkan(OnlyDLPack):
        def __dlpack_device__(self):
            return 7, 0
    with pytest.raises(pyquant.QuantGemmError, match=r"x lives on DLPack device Vulkan \(7\); pyquant "
                                                     r"reads host memory"):
        pyquant.gemm(Vulkan(np.zeros((2, 256), np.float32)), w)

    class Refuses(OnlyDLPack):
        def __dlpack__(self, **kw):
            raise BufferError("cannot export a lazy array")
    with pytest.raises(pyquant.QuantGemmError, match=r"x: Refuses.__dlpack__\(\) refused to export it: "
                                                     r"BufferError: cannot export a lazy array"):
        pyquant.gemm(Refuses(np.zeros((2, 256), np.float32)), w)


def test_device_dlpack_is_handed_the_launch_stream_then_refused_without_gpu(rng, monkeypatch):
    monkeypatch.setattr(pyquant.device, "_gpu_probe", (None, "test: no device"))
    w = _weights(rng)["q4_K"]
    x = ClaimsCUDA(np.zeros((2, 256), np.float16))
    with pytest.raises(pyquant.QuantGemmError, match=r"x in device memory"):
        pyquant.gemm(x, w)               # host weight next to device x: named, nothing copied
    assert x.streams == [1]              # no stream given: CUDA's legacy default stream is 1
    wd = pyquant.GGUFWeight("q4_K", ClaimsCUDA(w.raw))
    assert wd.is_device
    with pytest.raises(pyquant.QuantGemmError, match=r"no GPU context available \(test: no device\)"):
        pyquant.gemm(x, wd, stream=0x5000)
    assert x.streams[-1] == 0x5000       # a given stream is handed to the producer as is


# ---------------------------------------------------------------- DLPack out (no torch)

def test_host_device_array_exports_without_a_copy(rng):
    y = pyquant.DeviceArray.from_numpy(rng.standard_normal((3, 4)).astype(np.float32),
                                       pyquant.cpu_context())
    before = dlpack.exported_count()
    a = np.from_dlpack(y)
    assert np.shares_memory(a, np.asarray(y))
    a[1, 2] = 42.0
    assert y.to_numpy()[1, 2] == 42.0
    assert dlpack.exported_count() == before + 1
    del y
    gc.collect()
    assert a[1, 2] == 42.0                # the capsule keeps the memory alive
    del a
    gc.collect()
    assert dlpack.exported_count() == before


@pytest.mark.parametrize("max_version, name", [(None, "dltensor"), ((1, 0), "dltensor_versioned"),
                                               ((1, 3), "dltensor_versioned")])
def test_unconsumed_capsule_releases_its_array(max_version, name):
    y = pyquant.DeviceArray.empty((2, 3), np.float16, ctx=pyquant.cpu_context())
    before = dlpack.exported_count()
    cap = y.__dlpack__(max_version=max_version)
    assert f'"{name}"' in repr(cap)
    assert dlpack.exported_count() == before + 1
    del cap
    gc.collect()
    assert dlpack.exported_count() == before


def test_export_refusals():
    y = pyquant.DeviceArray.empty((2, 3), np.float32, ctx=pyquant.cpu_context())
    assert y.__dlpack_device__() == (dlpack.KDL_CPU, 0)
    with pytest.raises(BufferError, match="host memory takes stream=None"):
        y.__dlpack__(stream=1)
    with pytest.raises(BufferError, match=r"dl_device=\(2, 0\): this array lives on \(1, 0\)"):
        y.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy=True"):
        y.__dlpack__(copy=True)


# ---------------------------------------------------------------- torch (CPU in CI)

NP_OF = {"float16": np.float16, "bfloat16": BF16, "float32": np.float32}


def _torch():
    return pytest.importorskip("torch")


def _np(t):
    """numpy copy of a torch CPU tensor, bfloat16 included (numpy() refuses bf16)."""
    torch = _torch()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16).copy()
    return t.numpy().copy()


@pytest.mark.parametrize("fmt, dtype", [("int4", "float16"), ("int4", "bfloat16"), ("q4_K", "float32"),
                                        ("q4_K", "bfloat16"), ("mxfp4", "float16"), ("mxfp4", "bfloat16")])
def test_torch_cpu_tensors_in_and_out(rng, fmt, dtype):
    torch = _torch()
    w = _weights(rng)[fmt]
    xt = torch.randn(2, 3, 256, dtype=getattr(torch, dtype))
    y = pyquant.gemm(xt, w)
    yt = torch.from_dlpack(y)
    assert yt.dtype == xt.dtype and tuple(yt.shape) == (2, 3, 24)
    assert yt.data_ptr() == y.ptr                              # no copy on the way out
    _assert_same(_np(yt), pyquant.gemm(_np(xt), w), f"{fmt} {dtype}")
    out = torch.empty(2, 3, 24, dtype=xt.dtype)
    assert pyquant.gemm(xt, w, out=out) is out
    _assert_same(_np(out), _np(yt), f"{fmt} {dtype} out=")
    y32 = pyquant.gemm(xt, w, out_dtype=np.float32)
    assert torch.from_dlpack(y32).dtype == torch.float32


def test_torch_weight_components_and_moe(rng):
    torch = _torch()
    w = _weights(rng)["int4"]
    wt = pyquant.Int4Weight(torch.from_numpy(w.qweight), torch.from_numpy(w.scales.view(np.int16)).view(torch.bfloat16),
                            torch.from_numpy(w.qzeros), group_size=64)
    x = rng.standard_normal((4, 256)).astype(BF16)
    _assert_same(pyquant.gemm(x, wt), pyquant.gemm(x, w), "torch weight components")

    e, h, inter, top_k = 4, 64, 32, 2
    w13 = pyquant.quantize(rng.standard_normal((e, 2 * inter, h)).astype(np.float32), "mxfp4")
    w2 = pyquant.quantize(rng.standard_normal((e, h, inter)).astype(np.float32), "mxfp4")
    xt = torch.randn(2, 3, h, dtype=torch.bfloat16)
    ids = torch.randint(0, e, (2, 3, top_k), dtype=torch.int32)
    wts = torch.rand(2, 3, top_k)
    y = torch.from_dlpack(pyquant.moe(xt, ids, wts, w13, w2))
    assert tuple(y.shape) == (2, 3, h) and y.dtype == torch.bfloat16
    _assert_same(_np(y), pyquant.moe(_np(xt), ids.numpy(), wts.numpy(), w13, w2), "moe torch")


def test_torch_non_contiguous_x_is_read_where_it_lies(rng):
    torch = _torch()
    w = _weights(rng)["q4_K"]
    base = torch.randn(4, 512, dtype=torch.float32)
    xt = base[:, 128:384]                  # rows 512 elements apart: ldx = 512, no copy
    _assert_same(np.asarray(pyquant.gemm(xt, w)), pyquant.gemm(_np(xt), w), "torch column slice")


# ---------------------------------------------------------------- GPU (skipped without one)

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cuda_in_and_out_without_copies(rng, gpu_ctx, dtype):
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    w = _weights(rng)["q4_K"]
    wd = w.to_device(gpu_ctx)
    x = rng.standard_normal((2, 3, 256)).astype(NP_OF[dtype])
    xt = torch.from_dlpack(pyquant.DeviceArray.from_numpy(x, gpu_ctx))
    y = pyquant.gemm(xt, wd)                 # torch CUDA tensor in (__cuda_array_interface__)
    yt = torch.from_dlpack(y)                # DeviceArray out, zero-copy
    assert yt.is_cuda and yt.data_ptr() == y.ptr and yt.dtype == getattr(torch, dtype)
    y2 = pyquant.gemm(OnlyDLPack(xt), wd)    # the same tensor through __dlpack__ (stream 1)
    ref = pyquant.gemm(pyquant.DeviceArray.from_numpy(x, gpu_ctx), wd).to_numpy()
    torch.cuda.synchronize()
    eps = float(np.finfo(np.float16).eps) if dtype == "float16" else 2.0 ** -7
    for got, route in ((_np(yt.cpu()), "CAI in, DLPack out"), (y2.to_numpy(), "DLPack in")):
        err = np.linalg.norm(got.astype(np.float64) - ref.astype(np.float64)) / \
            np.linalg.norm(ref.astype(np.float64))
        # the same kernel on the same inputs as `ref`; a split-K summation order may differ
        # between runs, which moves an element by at most one rounding of y's dtype
        assert err <= 2 * eps, f"{route}: {err}"
