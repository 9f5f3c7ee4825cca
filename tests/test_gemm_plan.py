"""pyquant.gemm_plan: gemm() prepared once. A plan's launch must give gemm()'s bits, see x
refilled in place, write the `out` it was built with, and refuse an x it would copy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyquant

BF16 = np.dtype(ml_dtypes.bfloat16)


def weights(rng, n, k):
    W = rng.standard_normal((n, k)).astype(np.float32)
    return {"int4": pyquant.quantize(W, "int4", group_size=64),
            "q4_K": pyquant.quantize(W, "q4_K"),
            "mxfp4": pyquant.quantize(W, "mxfp4")}


@pytest.mark.parametrize("fmt", ["int4", "q4_K", "mxfp4"])
def test_plan_matches_gemm_and_sees_x_refilled(rng, fmt):
    n, k, m = 24, 256, 3
    w = weights(rng, n, k)[fmt]
    x = rng.standard_normal((m, k)).astype(BF16)
    plan = pyquant.gemm_plan(x, w)
    for _ in range(3):
        want = pyquant.gemm(x.copy(), w)
        got = plan()
        assert got is plan.out
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), fmt
        x[...] = rng.standard_normal((m, k)).astype(BF16)   # refilled in place


def test_plan_writes_the_given_out(rng):
    n, k, m = 16, 256, 2
    w = weights(rng, n, k)["q4_K"]
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    plan = pyquant.gemm_plan(x, w, out=out)
    assert plan() is out
    assert np.array_equal(out, pyquant.gemm(x, w, out_dtype=np.float32))


def test_plan_refuses_an_x_it_would_have_to_copy(rng):
    w = weights(rng, 16, 256)["int4"]
    x = rng.standard_normal((256, 4)).astype(BF16).T      # columns not unit-strided
    with pytest.raises(pyquant.InvalidArgumentError, match="a copy would not see x refilled"):
        pyquant.gemm_plan(x, w)
    assert pyquant.gemm(x, w).shape == (4, 16)            # gemm() copies such an x, fine
