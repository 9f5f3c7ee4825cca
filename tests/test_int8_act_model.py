"""The numpy model of the int8-activation GGUF GEMM (pyquant.formats.int8_act), CPU only.

- decompose: sw * (codes - bias) - mw equals the format module's dequantize bit for bit.
- quantize_x: the rounding bound |x - dx*xq| <= dx/2, the int8 range, the slice maximum at
  +-127, dx as the IEEE float32 quotient amax/127, non-finite and all-zero slices.
- gemm_model: within exact_error_bound of the exact float64 product x @ dequantize(raw)^T,
  and, on one-hot rows, within a few float32 ulps of the dequantized weights.
Fixed seeds (one per parametrisation), so every run draws the same numbers; no library.
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from conftest import format_entry, registry_formats
from pyquant import formats
from pyquant.formats import int8_act, reference

FMTS = registry_formats("gguf")  # the GPU int8 tier serves every GGUF format
# (code min, code max, bias, unit, min term) of each format as the kernel sees it; read
# through code_spec, so that a GGUF format without a row fails naming it
CODE_SPEC = {
    "q8_0": (-128, 127, 0, 32, False),
    "q4_0": (0, 15, 8, 32, False),
    "q4_K": (0, 15, 0, 32, True),
    "q6_K": (0, 63, 32, 16, False),
    "iq4_xs": (-127, 113, 0, 32, False),
    "iq3_xxs": (-62, 62, 0, 32, False),
}
D_RANGES = [pytest.param(None, id="any_f16"), pytest.param((1e-3, 1e-1), id="d_1e-3_1e-1")]
X_DTYPES = [pytest.param(np.dtype(np.float32), id="fp32"), pytest.param(np.dtype(np.float16), id="fp16"),
            pytest.param(np.dtype(ml_dtypes.bfloat16), id="bf16")]
EPS32 = 2.0 ** -23  # float32 ulp of 1
MIN_NORMAL_DX_AMAX = 127 * 2.0 ** -126  # smallest amax whose dx = amax/127 is a normal float32


def code_spec(fmt: str) -> tuple:
    return format_entry(CODE_SPEC, "CODE_SPEC of tests/test_int8_act_model.py", fmt)


def seeded(*key) -> np.random.Generator:
    """A generator with a fixed seed per test parametrisation."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def expand(a: np.ndarray, times: int) -> np.ndarray:
    """Per-unit values [N, K/times] repeated along K -> [N, K]."""
    return np.repeat(a, times, axis=1)


def random_x(rng, m: int, k: int, dtype, exp_range=(-4, 4)) -> np.ndarray:
    """Gaussian x [m, k] in `dtype`, each 32-element slice scaled by its own power of two."""
    scale = 2.0 ** rng.integers(exp_range[0], exp_range[1] + 1, size=(m, k // 32))
    return (rng.standard_normal((m, k)) * expand(scale, 32)).astype(dtype)


# ------------------------------------------------------------------ decompose

@pytest.mark.parametrize("d_range", D_RANGES)
@pytest.mark.parametrize("fmt", FMTS)
def test_decomposition_bit_exact(fmt, d_range, assert_bitwise_equal):
    module = formats.get(fmt).module
    n, k = 24, 1024
    raw = module.random_blocks(seeded("dec", fmt, d_range), n, k, d_range=d_range)
    dec = int8_act.decompose(fmt, raw)
    lo, hi, bias, unit, mins = code_spec(fmt)
    assert dec.codes.dtype == np.int32 and dec.codes.shape == (n, k)
    assert (dec.codes.min(), dec.codes.max()) == (lo, hi), "random blocks must reach both code ends"
    assert (dec.bias, dec.unit) == (bias, unit)
    assert dec.sw.dtype == np.float32 and dec.sw.shape == (n, k // unit)
    if mins:
        assert dec.mw is not None, f"{fmt}: a format with a min term must decompose with mw"
        assert dec.mw.dtype == np.float32 and dec.mw.shape == (n, k // 32)
    else:
        assert dec.mw is None
    w = expand(dec.sw, dec.unit) * (dec.codes - dec.bias).astype(np.float32)
    if dec.mw is not None:
        w = w - expand(dec.mw, 32)
    assert_bitwise_equal(w, module.dequantize(raw), f"{fmt}: sw * (codes - bias) - mw vs dequantize")


# the registry's other kinds, and a name that is no registry format (names are case-sensitive)
@pytest.mark.parametrize("fmt", [n for n in registry_formats() if n not in FMTS] + ["q4_k"])
def test_decompose_rejects_other_formats(fmt):
    with pytest.raises(ValueError, match="no int8-activation decomposition"):
        int8_act.decompose(fmt, np.zeros((1, 34), dtype=np.uint8))


# ------------------------------------------------------------------ quantize_x

def _extreme_slices(x: np.ndarray, dtype) -> None:
    """Row 0: slice 0 peaks at the smallest amax of a normal float32 dx (or the dtype's
    smallest value), slice 1 at the dtype's largest finite value (in place)."""
    fi = ml_dtypes.finfo(dtype)
    lo = max(MIN_NORMAL_DX_AMAX, float(fi.smallest_subnormal))
    hi = float(fi.max)
    for j, peak in ((0, lo), (1, hi)):
        s = x[0, 32 * j:32 * j + 32]
        s[:] = (np.linspace(-1, 1, 32) * peak).astype(dtype)
        s[7] = dtype.type(-peak)


@pytest.mark.parametrize("dtype", X_DTYPES)
def test_quantize_x_rounding(dtype):
    rng = seeded("qx", dtype.name)
    m, k = 5, 256
    exps = (-12, 10) if dtype == np.float16 else (-110, 110)
    x = random_x(rng, m, k, dtype, exps)
    x[1, rng.integers(0, k, size=40)] = 0                    # zeros inside nonzero slices
    _extreme_slices(x, dtype)
    xq, dx, sx = int8_act.quantize_x(x)
    assert (xq.dtype, dx.dtype, sx.dtype) == (np.int8, np.float32, np.float32)
    assert xq.shape == (m, k) and dx.shape == sx.shape == (m, k // 32)

    v = x.astype(np.float64).reshape(m, k // 32, 32)
    amax = np.abs(v).max(axis=-1)
    assert np.all(amax >= MIN_NORMAL_DX_AMAX), "the rounding bound below assumes dx normal"
    assert np.array_equal(dx, (amax / 127).astype(np.float32)), "dx = float32(amax) / 127, IEEE"
    q = xq.astype(np.int64).reshape(m, k // 32, 32)
    assert np.abs(q).max() <= 127
    at_max = np.take_along_axis(q, np.abs(v).argmax(axis=-1)[..., None], axis=-1)
    assert np.all(np.abs(at_max) == 127), "the slice maximum must map to +-127"
    # |v/dx - xq| <= 1/2 + the float32 roundings of 1/dx and v * (1/dx): < 2 ulps of amax
    err = np.abs(v - dx.astype(np.float64)[..., None] * q)
    allowed = dx.astype(np.float64) / 2 + 2 * EPS32 * amax
    worst = np.unravel_index(np.argmax(err / allowed[..., None]), err.shape)
    assert np.all(err <= allowed[..., None]), f"|x - dx*xq| > dx/2 + 2 ulp at {worst}"
    # sx: the prep kernel's float32 butterfly, lane 0 = halves added pairwise (i, i+16),
    # then (i, i+8), ... (written here as a halving tree), within 5 roundings of the sum
    t = x.astype(np.float32).reshape(m, k // 32, 32)
    for half in (16, 8, 4, 2, 1):
        t = t[..., :half] + t[..., half:2 * half]
    assert np.array_equal(sx, t[..., 0]), "sx = the butterfly sum of the slice, in float32"
    s64 = v.sum(axis=-1)
    assert np.all(np.abs(sx - s64) <= 5 * 2.0 ** -24 * np.abs(v).sum(axis=-1)), "sx within gamma_5"


@pytest.mark.parametrize("dtype", X_DTYPES)
def test_quantize_x_ties_to_even(dtype):
    """amax = 127 gives dx = 1 and 1/dx = 1 exactly, so xq = rint(x): halves go to the even
    neighbour (the kernel's __float2int_rn), not away from zero."""
    rng = seeded("ties", dtype.name)
    x = (rng.integers(-127, 127, size=(4, 64)) + 0.5).astype(dtype)
    x[:, ::32] = dtype.type(127)
    xq, dx, _ = int8_act.quantize_x(x)
    assert np.all(dx == 1)
    v = x.astype(np.float64)
    assert np.any(np.rint(v) != np.trunc(v + np.copysign(0.5, v))), "the draw must hold ties"
    assert np.array_equal(xq, np.rint(v).astype(np.int8))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", X_DTYPES)
def test_quantize_x_non_finite_slice(dtype, bad):
    rng = seeded("nonfinite", dtype.name, str(bad))
    x = random_x(rng, 3, 256, dtype)
    clean = x.copy()
    clean[1, 64:96] = 0
    x[1, 64 + rng.integers(0, 32)] = dtype.type(bad)
    xq, dx, sx = int8_act.quantize_x(x)
    assert np.isnan(dx[1, 2]) and np.isnan(sx[1, 2]), "a non-finite slice has dx = sx = NaN"
    assert not np.any(xq[1, 64:96]), "a non-finite slice has xq = 0"
    # every other slice is quantized as if the bad one were absent
    cq, cdx, csx = int8_act.quantize_x(clean)
    keep = np.ones(dx.shape, dtype=bool)
    keep[1, 2] = False
    assert np.array_equal(dx[keep], cdx[keep]) and np.array_equal(sx[keep], csx[keep])
    assert np.array_equal(np.delete(xq, np.s_[64:96], axis=1), np.delete(cq, np.s_[64:96], axis=1))
    # the model's row 1 is NaN everywhere (as the kernel's), the other rows finite
    raw = formats.get("q4_K").module.random_blocks(rng, 4, 256, d_range=(1e-3, 1e-1))
    y, _ = int8_act.gemm_model(x, "q4_K", raw)
    assert np.all(np.isnan(y[1])) and np.all(np.isfinite(y[[0, 2]]))


@pytest.mark.parametrize("dtype", X_DTYPES)
def test_quantize_x_zero_slice(dtype):
    x = random_x(seeded("zero", dtype.name), 2, 96, dtype)
    x[0, 32:64] = 0
    x[0, 40] = dtype.type(-0.0)
    xq, dx, sx = int8_act.quantize_x(x)
    assert dx[0, 1] == 0 and sx[0, 1] == 0 and not np.any(xq[0, 32:64])
    assert np.all(dx[:, [0, 2]] > 0) and np.all(dx[1] > 0)


@pytest.mark.parametrize("x, match", [
    (np.zeros((2, 48), np.float32), "multiple of 32"),
    (np.zeros((2, 64), np.float64), "float32, float16 or bfloat16"),
    (np.zeros(64, np.float32), "2-D"),
])
def test_quantize_x_rejects_bad_input(x, match):
    with pytest.raises(ValueError, match=match):
        int8_act.quantize_x(x)


# ------------------------------------------------------------------ gemm_model

def _check_against_exact(x, fmt, raw) -> None:
    """|gemm_model - x @ W^T| <= exact_error_bound + 1e-6 * mag, everywhere."""
    y, mag = int8_act.gemm_model(x, fmt, raw)
    ref = reference.gemm(x, formats.get(fmt).module.dequantize(raw))
    bound = int8_act.exact_error_bound(x, fmt, raw)
    assert y.shape == mag.shape == bound.shape == ref.shape
    assert np.all(np.isfinite(y)) and np.all(mag > 0)
    excess = np.abs(y - ref) - (bound + 1e-6 * mag)
    i = np.unravel_index(np.argmax(excess), excess.shape)
    assert np.all(excess <= 0), (f"{fmt}: model {y[i]!r} vs exact {ref[i]!r} at {i}: error "
                                 f"{abs(y[i] - ref[i]):.3e} > bound {bound[i]:.3e} + 1e-6 * mag {mag[i]:.3e}")


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("dtype", X_DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_model_within_quantization_bound(fmt, dtype, m):
    rng = seeded("gemm", fmt, dtype.name, m)
    raw = formats.get(fmt).module.random_blocks(rng, 5, 512, d_range=(1e-3, 1e-1))
    _check_against_exact(random_x(rng, m, 512, dtype), fmt, raw)


@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_model_within_bound_any_f16_scales(fmt):
    rng = seeded("gemm-any", fmt)
    raw = formats.get(fmt).module.random_blocks(rng, 7, 512, d_range=None)
    _check_against_exact(random_x(rng, 4, 512, np.float32), fmt, raw)


@pytest.mark.parametrize("d_range", D_RANGES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_model_one_hot_rows(fmt, d_range):
    """x = diag(v): row k picks column k of W, quantized exactly to +-127 with dx = v/127
    (float32). The model must give v * W[n, k] within 4 float32 ulps of the term size
    |v| * (|sw*(code-bias)| + |mw|)."""
    rng = seeded("onehot", fmt, d_range)
    module = formats.get(fmt).module
    k = 512
    raw = module.random_blocks(rng, 6, k, d_range=d_range)
    v = (rng.standard_normal(k) * 2.0 ** rng.integers(-20, 20, size=k)).astype(np.float32)
    y, _ = int8_act.gemm_model(np.diag(v), fmt, raw)                          # [K, N]
    dec = int8_act.decompose(fmt, raw)
    size = np.abs(expand(dec.sw, dec.unit).astype(np.float64) * (dec.codes - dec.bias))
    if dec.mw is not None:
        size += np.abs(expand(dec.mw, 32))
    want = v[:, None].astype(np.float64) * module.dequantize(raw).T
    tol = 4 * EPS32 * np.abs(v)[:, None] * size.T
    i = np.unravel_index(np.argmax(np.abs(y - want) - tol), y.shape)
    assert np.all(np.abs(y - want) <= tol), f"{fmt}: one-hot row {i}: {y[i]!r} vs {want[i]!r}"


def test_exact_bound_covers_a_cancelling_min_sum():
    """q4_K's min term uses the kernel's float32 butterfly sum of x (review finding): a
    slice {2^24, -2^24, 1, 0, ...} sums to 0 in that order (2^24 + 1 rounds to 2^24), so
    with all codes 0, d = dmin = 1 and m = 1 on sub-block 0 (W = -1 there) the model gives
    y = 0 where the exact product is -1; exact_error_bound must cover that."""
    from pyquant.formats import q4_k
    block = np.zeros(144, np.uint8)
    block[0:2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)    # d
    block[2:4] = np.frombuffer(np.float16(1).tobytes(), np.uint8)    # dmin
    m = np.zeros(8, np.uint8)
    m[0] = 1
    block[4:16] = q4_k.pack_scales_mins(np.ones(8, np.uint8), m)
    raw = block[None, :]
    x = np.zeros((1, 256), np.float32)
    x[0, :3] = (2.0 ** 24, -2.0 ** 24, 1.0)
    y, _ = int8_act.gemm_model(x, "q4_K", raw)
    exact = reference.gemm(x, q4_k.dequantize(raw))
    assert exact[0, 0] == -1.0 and y[0, 0] == 0.0, (exact, y)
    bound = int8_act.exact_error_bound(x, "q4_K", raw)
    assert abs(y[0, 0] - exact[0, 0]) <= bound[0, 0] <= 2.0
