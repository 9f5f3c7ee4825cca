"""The Python API at its edges: arrays numpy allows but the C ABI cannot take as they are,
freed or impossible device arrays, index arrays past int32, biases with padded rows, and
refusals that must be QuantGemmError (InvalidArgumentError, also a ValueError) with a
sentence that names the right argument. Each case was a defect found by a review (stop 10)."""
from __future__ import annotations

import numpy as np
import pytest

import pyquant
from pyquant import QuantGemmError
from pyquant import _lib as L

pytestmark = pytest.mark.skipif(not L.library_loaded(), reason="libquantgemm is not loaded")


def _weight(rng, n=64, k=256, fmt="q8_0"):
    return pyquant.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)


# ---------------------------------------------------------------- DeviceArray

@pytest.mark.parametrize("shape", [(-2, -4), (2 ** 60 + 1, 8), (2 ** 62, 2 ** 62)])
def test_device_array_refuses_negative_and_impossible_shapes(shape):
    with pytest.raises(QuantGemmError, match="negative extent|past the largest allocation"):
        pyquant.DeviceArray.empty(shape, np.float16, pyquant.cpu_context())


def test_device_array_is_dead_after_free(rng):
    w = _weight(rng)
    y = pyquant.DeviceArray.empty((4, 64), np.float32, pyquant.cpu_context())
    y.free()
    x = pyquant.DeviceArray.from_numpy(rng.standard_normal((4, 256)).astype(np.float32), pyquant.cpu_context())
    with pytest.raises(QuantGemmError, match="out: this DeviceArray was freed"):
        pyquant.gemm(x, w.to_device(pyquant.cpu_context()), out=y)
    for use in (y.to_numpy, y.view, lambda: y.window(0, 0, 1, 1), lambda: y.fill_bytes(0)):
        with pytest.raises(QuantGemmError, match="was freed"):
            use()
    y.free()  # a second free is harmless


def test_from_numpy_keeps_a_0d_shape():
    a = pyquant.DeviceArray.from_numpy(np.float32(3.5), pyquant.cpu_context())
    assert a.shape == () and a.to_numpy() == np.float32(3.5)


# ---------------------------------------------------------------- inputs numpy allows

def _layouts(x):
    """x as a broadcast (row stride 0), a misaligned C-contiguous and a reversed-row array."""
    m, k = x.shape
    buf = np.zeros(x.nbytes + 1, np.uint8)
    mis = np.frombuffer(buf.data, dtype=x.dtype, count=x.size, offset=1).reshape(m, k)
    mis[...] = x
    assert not mis.flags.aligned
    return {"broadcast": (np.broadcast_to(x[:1], (m, k)), np.repeat(x[:1], m, axis=0)),
            "misaligned": (mis, x),
            "reversed rows": (x[::-1], np.ascontiguousarray(x[::-1]))}


def test_inputs_the_abi_cannot_take_are_copied(rng, assert_bitwise_equal):
    w = _weight(rng)
    x = rng.standard_normal((4, 256)).astype(np.float16)
    for name, (odd, plain) in _layouts(x).items():
        assert_bitwise_equal(pyquant.gemm(odd, w), pyquant.gemm(plain, w), name)


def test_an_output_the_abi_cannot_take_is_refused_not_copied(rng):
    w = _weight(rng)
    out = np.frombuffer(bytearray(2 * 64 * 2 + 1), dtype=np.float16, count=128, offset=1).reshape(2, 64)
    with pytest.raises(QuantGemmError, match=r"out must have unit stride .* aligned=False"):
        pyquant.gemm(np.ones((2, 256), np.float16), w, out=out)


def test_non_native_byte_order_is_named(rng):
    with pytest.raises(QuantGemmError, match=r"x has dtype >f2 \(non-native byte order float16\)"):
        pyquant.gemm(np.ones((2, 256), ">f2"), _weight(rng))


# ---------------------------------------------------------------- moe

def _moe_case(rng, e=4, h=64, inter=32, t=5, top_k=2):
    w13 = pyquant.quantize(rng.standard_normal((e, 2 * inter, h)).astype(np.float32), "mxfp4")
    w2 = pyquant.quantize(rng.standard_normal((e, h, inter)).astype(np.float32), "mxfp4")
    x = rng.standard_normal((t, h)).astype(np.float32)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t)]).astype(np.int32)
    wts = rng.random((t, top_k)).astype(np.float32)
    return x, ids, wts, w13, w2


def test_moe_bias_with_padded_rows_equals_its_copy(rng, assert_bitwise_equal):
    """The C ABI takes biases without a row stride: a padded numpy bias is made contiguous."""
    x, ids, wts, w13, w2 = _moe_case(rng)
    e, two_i, h = w13.shape
    b13 = np.zeros((e, two_i + 8), np.float32)[:, :two_i]
    b13[...] = rng.standard_normal((e, two_i))
    b2 = np.zeros((e, h + 16), np.float32)[:, :h]
    b2[...] = rng.standard_normal((e, h))
    assert_bitwise_equal(pyquant.moe(x, ids, wts, w13, w2, w13_bias=b13, w2_bias=b2),
                         pyquant.moe(x, ids, wts, w13, w2, w13_bias=b13.copy(), w2_bias=b2.copy()),
                         "padded biases")


@pytest.mark.parametrize("bad", [1 + 2 ** 32, 2 ** 31, -(2 ** 31) - 1])
def test_moe_ids_past_int32_are_refused_not_wrapped(rng, bad):
    x, ids, wts, w13, w2 = _moe_case(rng)
    ids = ids.astype(np.int64)
    ids[1, 0] = bad
    with pytest.raises(QuantGemmError, match=f"topk_ids holds {bad}, outside int32"):
        pyquant.moe(x, ids, wts, w13, w2)


def test_moe_out_dtype_is_checked_first_and_named(rng):
    x, ids, wts, w13, w2 = _moe_case(rng)
    with pytest.raises(QuantGemmError, match="out_dtype float64 is not float32, float16 or bfloat16"):
        pyquant.moe(x, ids, wts, w13, w2, out_dtype=np.float64)


# ---------------------------------------------------------------- refusals are QuantGemmError

def test_refusals_are_quantgemm_errors(rng):
    W = rng.standard_normal((64, 256)).astype(np.float32)
    qw, qz, sc = (np.zeros((256, 8), np.int32), np.zeros((4, 8), np.int32),
                  np.ones((4, 64), np.float16))
    cases = {
        "quantize q8_0 K=100": lambda: pyquant.quantize(W[:, :100], "q8_0"),
        "quantize q8_0 N=0": lambda: pyquant.quantize(W[:0], "q8_0"),
        "quantize mxfp4 1-D": lambda: pyquant.quantize(W[0], "mxfp4"),
        "from_awq wrong group": lambda: pyquant.Int4Weight.from_awq(qw, qz, sc, group_size=128),
        "from_gptq no zeros": lambda: pyquant.Int4Weight.from_gptq(qw.T.copy(), None, sc),
        "Context(99)": lambda: pyquant.Context(99),
        "device_count('tpu')": lambda: pyquant.device_count("tpu"),
    }
    for name, call in cases.items():
        with pytest.raises(QuantGemmError):
            call()


def test_cpu_context_comes_back_after_close(rng):
    w = _weight(rng)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    want = pyquant.gemm(x, w)
    pyquant.cpu_context().close()
    np.testing.assert_array_equal(pyquant.gemm(x, w), want)
