"""The GGUF rows8 layout (pyquant.formats.gguf_rows8, qg_gguf_repack on a CPU context): every
GGUF format.

1. The numpy reference against its definition (src/formats/gguf_rows8.h: block b of row n at
   block index (n // 8 * nb + b) * 8 + n % 8), round trips, and the padding rows all zero.
2. The library's CPU repack writes the reference bytes, rows of any even stride ldw included,
   and its size query is the plane's size.
3. The CPU tier on a rows8 weight gives the block weight's output bit for bit: the blocks
   are moved whole and read by the same kernels (small-M rows kernel, panels, AMX tiles,
   the portable decoders and the fp32-exact path, which gather a row's blocks), at every M
   that picks a different kernel, with and without a bias; on the int8 path that is the
   model's result (pyquant.formats.cpu_int8) too. Non-finite scales in a rows8 weight take
   the fp32-exact path as the blocks do.
4. Refusals: bad repack arguments (nothing written), a bad layout value; pyquant's
   GGUFWeight(layout="rows8") checks its plane, and a rows8 weight is a CPU weight.
The ISA levels: tests/test_cpu_int8.py::test_every_isa_level_gives_the_same_bits runs the
rows8 layout under every QG_CPU_ISA cap, and .ci/isa_check.sh's int8_dump.cpp dumps it.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import FP32_EXACT, aligned_bytes, call, pinned_precision
from pyquant import _lib
from pyquant import formats as F
from pyquant.formats import cpu_int8
from pyquant.formats import gguf_rows8 as R8

BF16 = np.dtype(ml_dtypes.bfloat16)
GGUF = [f for f, s in F.FORMATS.items() if s.kind == "gguf"]
INT8 = 2  # cpu_precision (include/quantgemm.h)
# N off the 8-row group (5, 37: padding rows), one group, several panels; K one block and more
SHAPES = [(5, 1), (8, 2), (37, 5), (40, 3)]
# M: the rows kernel (1, 2), panels with 4- and 2-row tails (3, 17), AMX tiles where the CPU
# has them with a VNNI tail (40, 70)
MS = (1, 2, 3, 17, 40, 70)


def _spec(fmt):
    return F.get(fmt)


def _raw(rng, fmt, n, blocks):
    """Random valid blocks (every code bit random, small finite scales)."""
    s = _spec(fmt)
    return s.module.random_blocks(rng, n, blocks * s.block_elems, d_range=(2.0 ** -10, 2.0 ** -6))


@pytest.mark.parametrize("fmt", GGUF)
@pytest.mark.parametrize("n,blocks", SHAPES)
def test_plane_is_its_definition(rng, fmt, n, blocks):
    s = _spec(fmt)
    k = blocks * s.block_elems
    raw = rng.integers(0, 256, size=(n, blocks * s.block_bytes), dtype=np.uint8)
    plane = R8.pack(raw, s.block_elems, s.block_bytes)
    n_pad = -(-n // 8) * 8
    assert plane.shape == (n_pad * blocks * s.block_bytes,)
    for row in range(n_pad):
        for b in range(blocks):
            at = ((row // 8 * blocks + b) * 8 + row % 8) * s.block_bytes
            got = plane[at: at + s.block_bytes]
            want = raw[row, b * s.block_bytes: (b + 1) * s.block_bytes] if row < n else 0
            np.testing.assert_array_equal(got, want, err_msg=f"{fmt} row {row} block {b}")
    np.testing.assert_array_equal(R8.unpack(plane, n, k, s.block_elems, s.block_bytes), raw)


@pytest.mark.parametrize("fmt", GGUF)
@pytest.mark.parametrize("n,blocks", SHAPES)
def test_library_cpu_repack_matches_reference(rng, fmt, n, blocks, assert_bitwise_equal):
    s = _spec(fmt)
    k = blocks * s.block_elems
    raw = rng.integers(0, 256, size=(n, blocks * s.block_bytes), dtype=np.uint8)  # any bytes: moved, not read
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    r = w.repack("rows8")
    assert r.layout == "rows8" and r.shape == (n, k) and r.ldw == 0 and r.scales is None
    assert_bitwise_equal(np.asarray(r.raw), R8.pack(raw, s.block_elems, s.block_bytes), f"{fmt} {n}x{k}")
    assert r.nbytes == R8.pack(raw, s.block_elems, s.block_bytes).nbytes
    assert_bitwise_equal(r.canonical_raw(), raw, "round trip")
    assert_bitwise_equal(np.asarray(r.repack("canonical").raw), raw, "repack('canonical')")
    assert r.repack("rows8") is r


@pytest.mark.parametrize("fmt,n,blocks,ldw", [("q6_K", 9, 2, 432), ("q4_0", 24, 3, 64)])
def test_library_cpu_repack_reads_strided_rows(rng, fmt, n, blocks, ldw, assert_bitwise_equal):
    """Rows of stride ldw > row bytes (to_device pads GGUF rows to 16 bytes): the same plane."""
    s = _spec(fmt)
    raw = rng.integers(0, 256, size=(n, blocks * s.block_bytes), dtype=np.uint8)
    padded = np.zeros((n, ldw), np.uint8)
    padded[:, :raw.shape[1]] = raw
    r = pyquant.from_gguf(fmt, padded[:, :raw.shape[1]], shape=(n, blocks * s.block_elems)).repack("rows8")
    assert_bitwise_equal(np.asarray(r.raw), R8.pack(raw, s.block_elems, s.block_bytes), f"ldw = {ldw}")


def test_repack_size_is_the_plane_size():
    for fmt in GGUF:
        s = _spec(fmt)
        for n, blocks in SHAPES:
            a = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_ROWS8, format=s.qg_format, n=n,
                                         k=blocks * s.block_elems)
            nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(7)
            _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(nw), ctypes.byref(ns))
            assert (nw.value, ns.value) == (-(-n // 8) * 8 * blocks * s.block_bytes, 0), (fmt, n, blocks)


@pytest.mark.parametrize("precision", [INT8, FP32_EXACT], ids=["int8", "fp32"])
@pytest.mark.parametrize("fmt", GGUF)
def test_cpu_tier_on_rows8_is_the_block_result(rng, fmt, precision, assert_bitwise_equal):
    s = _spec(fmt)
    gen = pinned_precision(precision)
    next(gen)
    try:
        for n, blocks in ((37, 5), (8, 2)):
            k = blocks * s.block_elems
            raw = _raw(rng, fmt, n, blocks)
            b = rng.standard_normal(n).astype(np.float32) if n == 37 else None
            w = pyquant.from_gguf(fmt, raw, shape=(n, k)).with_bias(b)
            r = w.repack("rows8")
            assert (r.bias is None) == (b is None)
            for m in MS:
                for x_dt in (np.float32, np.float16, BF16):
                    x = rng.standard_normal((m, k)).astype(x_dt)
                    want = pyquant.gemm(x, w, out_dtype=np.float32)
                    assert_bitwise_equal(pyquant.gemm(x, r, out_dtype=np.float32), want,
                                         f"{fmt} {n}x{k} m={m} x={np.dtype(x_dt).name}")
                    if precision == INT8 and x_dt == np.float16 and b is None:
                        with np.errstate(over="ignore", invalid="ignore"):
                            model, fallback = cpu_int8.gemm(x, fmt, raw)
                        assert not fallback.any()
                        assert_bitwise_equal(pyquant.gemm(x, r, out_dtype=np.float32), model, f"model m={m}")
            y16 = pyquant.gemm(x.astype(np.float16), r)  # y in x's dtype too
            assert y16.dtype == np.float16
    finally:
        gen.close()


def test_non_finite_scales_take_the_fp32_path_as_the_blocks_do(rng, assert_bitwise_equal):
    """A NaN and an inf d (q6_K's d: the block's last 2 bytes) in rows 3 and 20: their columns
    come from the fp32-exact path, whose decoders read the rows8 weight's gathered blocks."""
    n, blocks = 37, 3
    raw = _raw(rng, "q6_K", n, blocks)
    for row, bits in ((3, 0x7e00), (20, 0x7c00)):
        raw[row, 210 + 208: 210 + 210] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
    w = pyquant.from_gguf("q6_K", raw, shape=(n, blocks * 256))
    r = w.repack("rows8")
    for m in (1, 5):
        x = rng.standard_normal((m, blocks * 256)).astype(np.float32)
        want = pyquant.gemm(x, w)
        assert np.isnan(want[:, 3]).all() and not np.isfinite(want[:, 20]).any()
        assert_bitwise_equal(pyquant.gemm(x, r), want, f"m={m}")


def _repack_args(fmt="q6_K", n=9, blocks=2):
    s = _spec(fmt)
    return _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_ROWS8, format=s.qg_format, n=n,
                                    k=blocks * s.block_elems, ldw=blocks * s.block_bytes)


@pytest.mark.parametrize("change,pattern", [
    ({"k": 300}, "not a multiple of the Q6_K block"),
    ({"n": 0}, "n=0"),
    ({"ldw": 100}, "ldw=100 <"),
    ({"ldw": 421}, "ldw=421 is odd"),
    ({"w": None}, "w"),
    ({"out_w": None}, "out_w"),
    ({"out_w": "overlap"}, "out_w overlaps w"),
])
def test_repack_refuses_bad_arguments_and_writes_nothing(rng, change, pattern):
    a = _repack_args()
    src = aligned_bytes(9 * 420 + 64)
    src[:] = rng.integers(0, 256, size=src.shape, dtype=np.uint8)
    out = aligned_bytes(16 * 420 + 64)
    out[:] = 0xAB
    a.w, a.out_w = src.ctypes.data, out.ctypes.data
    for name, v in change.items():
        setattr(a, name, src.ctypes.data + 2 if v == "overlap" else v)
    st, msg = call(_lib.qg_gguf_repack, pyquant.cpu_context().handle, ctypes.byref(a), None)
    assert st == _lib.Status.QG_ERR_INVALID_ARGUMENT and pattern in msg, msg
    assert (out == 0xAB).all(), "a refused repack wrote its output"


def test_gemm_refuses_a_bad_layout(rng):
    w = pyquant.from_gguf("q6_K", _raw(rng, "q6_K", 8, 1), shape=(8, 256)).repack("rows8")
    x = np.ones((1, 256), np.float32)
    y = np.zeros((1, 8), np.float32)
    a = _lib.qg_gguf_gemm_args(format=w.spec.qg_format, m=1, n=8, k=256, x_dtype=_lib.DType.QG_DTYPE_F32,
                               y_dtype=_lib.DType.QG_DTYPE_F32, x=x.ctypes.data, ldx=256,
                               w=np.asarray(w.raw).ctypes.data, ldw=0, y=y.ctypes.data, ldy=8, layout=3)
    st, msg = call(_lib.qg_gguf_gemm, pyquant.cpu_context().handle, ctypes.byref(a), None)
    assert st == _lib.Status.QG_ERR_INVALID_ARGUMENT and "layout=3" in msg and "2 rows8" in msg, msg


def test_rows8_weight_checks_its_plane(rng):
    raw = _raw(rng, "q6_K", 9, 2)
    plane = R8.pack(raw, 256, 210)
    w = pyquant.GGUFWeight("q6_K", plane, shape=(9, 512), layout="rows8")
    np.testing.assert_array_equal(w.canonical_raw(), raw)
    with pytest.raises(pyquant.InvalidArgumentError, match="rows8 plane holds"):
        pyquant.GGUFWeight("q6_K", plane[:-1], shape=(9, 512), layout="rows8")
    with pytest.raises(pyquant.InvalidArgumentError, match="needs shape"):
        pyquant.GGUFWeight("q6_K", plane, layout="rows8")
    with pytest.raises(pyquant.InvalidArgumentError, match="not one of"):
        pyquant.from_gguf("q6_K", raw, shape=(9, 512)).repack("rows16")
    ctx = pyquant.cpu_context()
    d = pyquant.from_gguf("q6_K", raw, shape=(9, 512)).to_device(ctx, layout="rows8")
    assert d.layout == "rows8" and d.ctx is ctx
    np.testing.assert_array_equal(d.to_host().canonical_raw(), raw)
    assert d.to_device(ctx, layout="canonical").layout == "canonical"
    f = w.repack("frag")  # through the blocks
    assert f.layout == "frag" and f.repack("rows8").layout == "rows8"
    np.testing.assert_array_equal(f.repack("rows8").canonical_raw(), raw)
