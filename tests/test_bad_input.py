"""Bad input is refused with a sentence naming the failed condition, and writes nothing.

Each case runs against a poisoned, guarded output buffer and checks afterwards that the
whole buffer (output and bands) is byte-identical: "on error nothing is written"
(include/quantgemm.h). Cases go through the Python API where Python can express them and
through pyquant._lib directly for what only a C caller can get wrong (NULL pointers,
ldx < k, zero_dtype)."""
from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant import _lib
from pyquant._lib import DType

BF16 = np.dtype(ml_dtypes.bfloat16)


def _int4_arrays(rng, n, k, g, asym=True, scale_dtype=np.float16):
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = rng.uniform(0.01, 0.1, size=(n, -(-k // g))).astype(scale_dtype)
    qzeros = rng.integers(0, 2 ** 32, size=(max(n // 8, 1), -(-k // g)),
                          dtype=np.uint32).view(np.int32) if asym else None
    return qweight, scales, qzeros


def _expect(exc_type, pattern, fn, guarded):
    """fn() raises exc_type whose message matches `pattern`; the guarded buffer is untouched."""
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    assert re.search(pattern, msg), f"message {msg!r} does not name the condition /{pattern}/"
    assert guarded.unchanged(), f"output buffer changed by a refused call ({msg})"
    return info.value


# ---------------------------------------------------------------- through the Python API

def test_k_not_a_multiple_of_the_group_size(rng, poisoned_output):
    w = pyquant.Int4Weight(*_int4_arrays(rng, 8, 96, 64), group_size=64)
    g = poisoned_output(2, 8, np.float16)
    x = rng.standard_normal((2, 96)).astype(np.float16)
    e = _expect(pyquant.QuantGemmError, r"k=96 is not a multiple of group_size=64",
                lambda: pyquant.gemm(x, w, out=g.y), g)
    assert isinstance(e, ValueError) and e.status == _lib.Status.QG_ERR_INVALID_ARGUMENT


def test_n_not_a_multiple_of_8_for_int4(rng, poisoned_output):
    w = pyquant.Int4Weight(*_int4_arrays(rng, 12, 64, 32, asym=False), group_size=32)
    g = poisoned_output(3, 12, BF16)
    x = rng.standard_normal((3, 64)).astype(BF16)
    _expect(ValueError, r"n=12 is not a multiple of 8", lambda: pyquant.gemm(x, w, out=g.y), g)


def test_fp32_activations_for_w4a16(rng, poisoned_output):
    w = pyquant.Int4Weight(*_int4_arrays(rng, 8, 64, 32), group_size=32)
    g = poisoned_output(2, 8, np.float32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    _expect(pyquant.QuantGemmError, r"x_dtype=\S*F32.*not supported by W4A16",
            lambda: pyquant.gemm(x, w, out=g.y), g)


def test_unknown_format(rng):
    W = rng.standard_normal((8, 64)).astype(np.float32)
    for call in (lambda: pyquant.quantize(W, "q5_1"),
                 lambda: pyquant.from_gguf("q5_1", np.zeros((8, 44), np.uint8), shape=(8, 64))):
        with pytest.raises(pyquant.QuantGemmError, match=r"unknown format 'q5_1'; known formats: int4"):
            call()


def test_unknown_format_at_the_c_layer(rng, ctx, poisoned_output):
    g = poisoned_output(1, 8, np.float32)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    w = np.zeros((8, 34), np.uint8)
    args = _lib.qg_gguf_gemm_args(format=99, m=1, n=8, k=32, x_dtype=DType.QG_DTYPE_F32,
                                  y_dtype=DType.QG_DTYPE_F32, x=x.ctypes.data, ldx=32,
                                  w=w.ctypes.data, ldw=34, y=g.y.ctypes.data, ldy=g.ld)
    _expect(pyquant.QuantGemmError, r"format=99 is not a qg_format value",
            lambda: _lib.qg_gguf_gemm(ctx.handle, ctypes.byref(args), None), g)


def test_mismatched_shapes(rng, poisoned_output):
    w = pyquant.Int4Weight(*_int4_arrays(rng, 8, 64, 32), group_size=32)
    g = poisoned_output(2, 8, np.float16)
    x = rng.standard_normal((2, 96)).astype(np.float16)
    _expect(ValueError, r"x has K=96 columns but the weight has K=64",
            lambda: pyquant.gemm(x, w, out=g.y), g)
    # out of the wrong shape
    g2 = poisoned_output(3, 8, np.float16)
    x2 = rng.standard_normal((2, 64)).astype(np.float16)
    _expect(ValueError, r"out has shape \(3, 8\), expected \(2, 8\)",
            lambda: pyquant.gemm(x2, w, out=g2.y), g2)
    # x is [..., K] (a vector [K] included); a 0-d x has no K axis
    _expect(ValueError, r"x must have at least one axis \[\.\.\., K\], got a 0-d array",
            lambda: pyquant.gemm(x2[0, 0, ...], w, out=g2.y), g2)
    # a vector x [K] gives y [N]: an out [M, N] is the wrong shape for it
    _expect(ValueError, r"out has shape \(3, 8\), expected \(8,\)",
            lambda: pyquant.gemm(x2[0], w, out=g2.y), g2)


def test_scales_of_the_wrong_extent(rng):
    qweight, scales, qzeros = _int4_arrays(rng, 8, 128, 32)
    with pytest.raises(ValueError, match=r"scales has shape \(8, 2\), expected \[N, K/G\] = \(8, 4\)"):
        pyquant.Int4Weight(qweight, scales[:, :2], qzeros, group_size=32)


def test_fp16_zero_points_rejected_in_python(rng):
    """Zero-points expanded to the activation dtype are refused by name: they must stay 4-bit."""
    qweight, scales, _ = _int4_arrays(rng, 8, 64, 32)
    zeros_f16 = rng.integers(0, 16, size=(8, 2)).astype(np.float16)
    with pytest.raises(pyquant.QuantGemmError, match=r"qzeros has dtype float16: zero-points must stay 4-bit"):
        pyquant.Int4Weight(qweight, scales, zeros_f16, group_size=32)


def test_wrong_activation_dtype_in_python(rng, poisoned_output):
    w = pyquant.from_gguf("q8_0", np.zeros((8, 34), np.uint8), shape=(8, 32))
    g = poisoned_output(1, 8, np.float32)
    x = rng.standard_normal((1, 32))  # float64
    _expect(ValueError, r"x has dtype float64; expected float16, bfloat16 or float32",
            lambda: pyquant.gemm(x, w, out=g.y), g)


def test_host_device_mix_up(rng):
    """A device-resident operand next to a numpy one is named, never copied silently."""
    class FakeDevice:  # a foreign device array (never dereferenced: refused before launch)
        __cuda_array_interface__ = {"shape": (2, 64), "typestr": "<f2", "data": (0x10000, False),
                                    "version": 3, "strides": None}
    w = pyquant.Int4Weight(*_int4_arrays(rng, 8, 64, 32), group_size=32)
    with pytest.raises(ValueError, match=r"w\.qweight, w\.scales, w\.qzeros in host memory but x in device memory"):
        pyquant.gemm(FakeDevice(), w)


# ---------------------------------------------------------------- through _lib directly

def _w4a16_args(rng, g, m=2, n=8, k=64, **over):
    x = rng.standard_normal((m, k)).astype(np.float16)
    qweight, scales, qzeros = _int4_arrays(rng, n, k, 32)
    keep = (x, qweight, scales, qzeros)
    fields = dict(m=m, n=n, k=k, group_size=32, x_dtype=DType.QG_DTYPE_F16,
                  y_dtype=DType.QG_DTYPE_F16, scale_dtype=DType.QG_DTYPE_F16,
                  zero_dtype=DType.QG_DTYPE_U4X8, x=x.ctypes.data, ldx=k,
                  qweight=qweight.ctypes.data, scales=scales.ctypes.data,
                  qzeros=qzeros.ctypes.data, y=g.y.ctypes.data, ldy=g.ld)
    fields.update(over)
    return _lib.qg_w4a16_gemm_args(**fields), keep


def test_valid_c_call_writes_the_output(rng, ctx, poisoned_output):
    """Control for the cases below: the same arguments, unmodified, are accepted."""
    g = poisoned_output(2, 8, np.float16)
    args, keep = _w4a16_args(rng, g)
    _lib.qg_w4a16_gemm(ctx.handle, ctypes.byref(args), None)
    assert np.isfinite(g.value().astype(np.float32)).all()


def test_null_pointer(rng, ctx, poisoned_output):
    g = poisoned_output(2, 8, np.float16)
    for field in ("x", "qweight", "scales", "y"):
        args, keep = _w4a16_args(rng, g, **{field: None})
        _expect(pyquant.QuantGemmError, rf"\b{field} is NULL",
                lambda: _lib.qg_w4a16_gemm(ctx.handle, ctypes.byref(args), None), g)
    args, keep = _w4a16_args(rng, g)
    _expect(ValueError, r"ctx is NULL", lambda: _lib.qg_w4a16_gemm(None, ctypes.byref(args), None), g)
    _expect(ValueError, r"args is NULL", lambda: _lib.qg_w4a16_gemm(ctx.handle, None, None), g)


def test_ldx_smaller_than_k(rng, ctx, poisoned_output):
    g = poisoned_output(2, 8, np.float16)
    args, keep = _w4a16_args(rng, g, ldx=48)
    _expect(ValueError, r"ldx=48 < k=64",
            lambda: _lib.qg_w4a16_gemm(ctx.handle, ctypes.byref(args), None), g)


def test_fp16_zero_dtype_rejected_at_the_c_layer(rng, ctx, poisoned_output):
    g = poisoned_output(2, 8, np.float16)
    args, keep = _w4a16_args(rng, g, zero_dtype=DType.QG_DTYPE_F16)
    _expect(ValueError, r"zero_dtype=\S*F16: zero-points must be packed 4-bit words",
            lambda: _lib.qg_w4a16_gemm(ctx.handle, ctypes.byref(args), None), g)


def test_errors_carry_status_and_are_value_errors_only_for_bad_arguments(ctx):
    with pytest.raises(pyquant.InvalidArgumentError) as info:
        ctx.set_option("no_such_option", 1)
    assert isinstance(info.value, ValueError) and "no_such_option" in str(info.value)
    err = pyquant.QuantGemmError(_lib.Status.QG_ERR_DEVICE, "boom")
    assert not isinstance(err, ValueError) and err.status_name == "QG_ERR_DEVICE"


# ---------------------------------------------------------------- the bias fields and struct versions

def _gguf_args(rng, g, m=2, n=8, **over):
    raw = pyquant.formats.get("q8_0").module.random_blocks(rng, n, 64, d_range=(2.0 ** -8, 2.0 ** -4))
    x = rng.standard_normal((m, 64)).astype(np.float32)
    fields = dict(format=_lib.Format.QG_FORMAT_Q8_0, m=m, n=n, k=64, x_dtype=DType.QG_DTYPE_F32,
                  y_dtype=DType.QG_DTYPE_F32, x=x.ctypes.data, ldx=64, w=raw.ctypes.data,
                  ldw=raw.shape[1], y=g.y.ctypes.data, ldy=g.ld)
    fields.update(over)
    return _lib.qg_gguf_gemm_args(**fields), (raw, x)


def _mxfp4_args(rng, g, m=2, n=8, **over):
    blocks = rng.integers(0, 256, size=(n, 2, 16), dtype=np.uint8)
    scales = rng.integers(118, 130, size=(n, 2), dtype=np.uint8)
    x = rng.standard_normal((m, 64)).astype(np.float32)
    fields = dict(m=m, n=n, k=64, x_dtype=DType.QG_DTYPE_F32, y_dtype=DType.QG_DTYPE_F32, x=x.ctypes.data,
                  ldx=64, blocks=blocks.ctypes.data, scales=scales.ctypes.data, y=g.y.ctypes.data, ldy=g.ld)
    fields.update(over)
    return _lib.qg_mxfp4_gemm_args(**fields), (blocks, scales, x)


FAMILIES = {"w4a16": (_w4a16_args, _lib.qg_w4a16_gemm, np.float16, "W4A16"),
            "gguf": (_gguf_args, _lib.qg_gguf_gemm, np.float32, "GGUF"),
            "mxfp4": (_mxfp4_args, _lib.qg_mxfp4_gemm, np.float32, "MXFP4")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bias_dtype_and_alignment_are_checked(rng, ctx, poisoned_output, family):
    make, fn, y_dt, name = FAMILIES[family]
    g = poisoned_output(2, 8, y_dt)
    bias = np.ones(9, np.float32)
    args, keep = make(rng, g, bias=bias.ctypes.data, bias_dtype=DType.QG_DTYPE_I32)
    _expect(ValueError, rf"bias_dtype=QG_DTYPE_I32 is not supported by {name} bias \(fp32, fp16 or bf16\)",
            lambda: fn(ctx.handle, ctypes.byref(args), None), g)
    args, keep = make(rng, g, bias=bias.ctypes.data + 2, bias_dtype=DType.QG_DTYPE_F32)
    _expect(ValueError, r"bias=0x[0-9a-f]+ is not aligned to 4 bytes \(QG_DTYPE_F32\)",
            lambda: fn(ctx.handle, ctypes.byref(args), None), g)


def _call_with_size(fn, ctx, args, size):
    """fn on a copy of args whose size field says `size` (the bytes past it are still there:
    the library must not read them)."""
    buf = (ctypes.c_uint8 * ctypes.sizeof(args)).from_buffer_copy(bytes(args))
    view = type(args).from_buffer(buf)
    view.size = size
    return fn(ctx.handle, ctypes.byref(view), None)


@pytest.mark.parametrize("family,older", [("w4a16", 128), ("w4a16", 136), ("gguf", 112)])  # mxfp4 always had one
def test_an_older_struct_has_no_bias(rng, ctx, poisoned_output, family, older, assert_bitwise_equal):
    """A caller built against a struct version before the bias passes that version's size:
    whatever lies past it (here a bias pointer that would be refused, misaligned, with a
    dtype that is no qg_dtype) is not read, and y is the product without a bias."""
    make, fn, y_dt, _ = FAMILIES[family]
    g0, g1 = poisoned_output(2, 8, y_dt), poisoned_output(2, 8, y_dt)
    args, keep = make(rng, g0)
    fn(ctx.handle, ctypes.byref(args), None)
    stale = type(args).from_buffer_copy(bytes(args))
    stale.y, stale.bias, stale.bias_dtype = g1.y.ctypes.data, 0x1001, 100
    _call_with_size(fn, ctx, stale, older)
    assert_bitwise_equal(g1.value(), g0.value(), f"{family} struct of {older} bytes")
    with pytest.raises(ValueError, match=r"bias_dtype=100 is not a qg_dtype value"):
        _call_with_size(fn, ctx, stale, ctypes.sizeof(stale))


@pytest.mark.parametrize("family,size,versions", [
    ("w4a16", 144, "128, 136 or 152 bytes"), ("w4a16", 130, "128, 136 or 152 bytes"),
    ("gguf", 120, "112, 128 or 144 bytes"), ("gguf", 136, "112, 128 or 144 bytes"),
    ("mxfp4", 124, "120 or 128 bytes")])
def test_a_size_between_versions_is_refused(rng, ctx, poisoned_output, family, size, versions):
    make, fn, y_dt, _ = FAMILIES[family]
    g = poisoned_output(2, 8, y_dt)
    args, keep = make(rng, g)
    name = type(args).__name__
    _expect(ValueError, rf"args->size={size} is not the size of a version of {name} \({versions}\)",
            lambda: _call_with_size(fn, ctx, args, size), g)


@pytest.mark.parametrize("stale_layout", [_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, 7], ids=["frag", "not-a-layout"])
def test_an_older_mxfp4_struct_reads_the_canonical_layout(rng, ctx, poisoned_output, stale_layout,
                                                          assert_bitwise_equal):
    """qg_mxfp4_gemm_args before `layout` (120 bytes): whatever lies past its end (here FRAG
    next to canonical, byte-aligned arrays, or no layout value at all) is not read, and the
    weight is canonical."""
    make, fn, y_dt, _ = FAMILIES["mxfp4"]
    g0, g1 = poisoned_output(2, 8, y_dt), poisoned_output(2, 8, y_dt)
    args, keep = make(rng, g0)
    fn(ctx.handle, ctypes.byref(args), None)
    stale = type(args).from_buffer_copy(bytes(args))
    stale.y, stale.layout = g1.y.ctypes.data, stale_layout
    _call_with_size(fn, ctx, stale, 120)
    assert_bitwise_equal(g1.value(), g0.value(), "mxfp4 struct of 120 bytes")


@pytest.mark.parametrize("older", [112, 128])
def test_an_older_gguf_struct_reads_the_blocks(rng, ctx, poisoned_output, older, assert_bitwise_equal):
    """qg_gguf_gemm_args before `w_scales` and `layout` (112 or 128 bytes): the FRAG layout
    and the planes pointer lying past its end are not read, and the weight is the blocks."""
    make, fn, y_dt, _ = FAMILIES["gguf"]
    g0, g1 = poisoned_output(2, 8, y_dt), poisoned_output(2, 8, y_dt)
    args, keep = make(rng, g0)
    args.bias = None
    fn(ctx.handle, ctypes.byref(args), None)
    stale = type(args).from_buffer_copy(bytes(args))
    stale.y, stale.layout, stale.w_scales = g1.y.ctypes.data, _lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG, 16
    _call_with_size(fn, ctx, stale, older)
    assert_bitwise_equal(g1.value(), g0.value(), f"gguf struct of {older} bytes")


def test_mxfp4_layout_value_is_checked(rng, ctx, poisoned_output):
    g = poisoned_output(2, 8, np.float32)
    args, keep = _mxfp4_args(rng, g, layout=2)
    _expect(ValueError, r"layout=2 is not a qg_mxfp4_layout value \(0 canonical, 1 frag\)",
            lambda: _lib.qg_mxfp4_gemm(ctx.handle, ctypes.byref(args), None), g)
    nbytes = ctypes.c_size_t(0)
    _expect(ValueError, r"layout=2 is not a qg_mxfp4_layout value",
            lambda: _lib.qg_mxfp4_gemm_workspace_size(ctx.handle, ctypes.byref(args), ctypes.byref(nbytes)), g)


@pytest.mark.parametrize("plane,why", [("blocks", "16-byte fragment loads"), ("scales", "16-byte scale records")])
def test_mxfp4_frag_planes_must_be_16_byte_aligned(rng, ctx, poisoned_output, plane, why):
    """The canonical arrays are bytes (any address); the frag planes are read 16 bytes at a
    time, and a plane off by 4 bytes is refused by name before anything is written."""
    g = poisoned_output(2, 40, np.float32)
    w = pyquant.from_mxfp4(rng.integers(0, 256, size=(40, 7, 16), dtype=np.uint8),
                           rng.integers(118, 130, size=(40, 7), dtype=np.uint8)).repack()
    shifted = {n: np.asarray(getattr(w, n)) for n in ("blocks", "scales")}
    buf = np.zeros(shifted[plane].nbytes + 64, np.uint8)
    at = (-buf.ctypes.data) % 16 + 4
    buf[at: at + shifted[plane].nbytes] = shifted[plane].view(np.uint8).reshape(-1)
    shifted[plane] = buf[at: at + shifted[plane].nbytes]
    x = rng.standard_normal((2, 224)).astype(np.float32)
    args, keep = _mxfp4_args(rng, g, n=40, k=224, x=x.ctypes.data, ldx=224,
                             blocks=shifted["blocks"].ctypes.data, scales=shifted["scales"].ctypes.data,
                             layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG)
    _expect(ValueError, rf"{plane}=0x[0-9a-f]+ is not aligned to 16 bytes \(frag layout: {why}\)",
            lambda: _lib.qg_mxfp4_gemm(ctx.handle, ctypes.byref(args), None), g)
