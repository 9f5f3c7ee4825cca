"""Bytes and FLOPs the bench charges each case, checked by hand for one case per family.

"By hand" here means: the arrays a kernel of that family must read and write are built
with numpy in their canonical shapes and dtypes (DESIGN.md's layout table), their nbytes
summed, and GGUF block sizes taken from gguf.GGML_QUANT_SIZES; nothing is shared with
pyquant/bench/cases.py except the Case itself. Shapes are drawn fresh each run (the seed
is printed on failure).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from pyquant.bench import cases as C
from pyquant.bench import roofline as R

gguf = pytest.importorskip("gguf")
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

NP_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy
    print(f"seed = {seed}")
    return np.random.default_rng(seed)


def nbytes(*arrays) -> int:
    return sum(a.nbytes for a in arrays)


def test_w4a16_worked_example():
    # N = K = 4096, G = 128, asymmetric, bf16, M = 1, written out term by term:
    #   qweight [4096, 512] int32      = 4096 * 512 * 4  = 8 MiB
    #   scales  [4096, 32]  bf16       = 4096 * 32 * 2
    #   qzeros  [512, 32]   int32      = 512 * 32 * 4
    #   x       [1, 4096]   bf16       = 4096 * 2
    #   y       [1, 4096]   bf16       = 4096 * 2
    case = C.Case("w4a16", "int4", "g128-asym-bf16", 1, 4096, 4096)
    assert C.case_bytes(case) == 8 * 2**20 + 4096 * 32 * 2 + 512 * 32 * 4 + 4096 * 2 + 4096 * 2
    assert C.case_flops(case) == 2 * 4096 * 4096  # one multiply + one add per weight


@pytest.mark.parametrize("variant", ["g128-asym-bf16", "g32-sym-fp16", "g64-asym-fp16"])
def test_w4a16_bytes_and_flops(rng, variant):
    v = C.parse_w4a16_variant(variant)
    n = 8 * int(rng.integers(1, 2000))
    k = v.group_size * int(rng.integers(1, 100))
    m = int(rng.integers(1, 300))
    dt = NP_DTYPE[v.dtype]
    arrays = [np.empty((n, k // 8), np.int32),                  # qweight
              np.empty((n, k // v.group_size), dt),             # scales
              np.empty((m, k), dt), np.empty((m, n), dt)]       # x, y
    if not v.symmetric:
        arrays.append(np.empty((n // 8, k // v.group_size), np.int32))  # qzeros packed along N
    case = C.Case("w4a16", "int4", variant, m, n, k)
    assert C.case_bytes(case) == nbytes(*arrays), (m, n, k)
    assert C.case_flops(case) == 2 * m * n * k


@pytest.mark.parametrize("fmt", C.GGUF_FORMATS)
@pytest.mark.parametrize("variant", ["bf16", "fp32"])
def test_gguf_bytes_and_flops(rng, fmt, variant):
    elems, block = GGML_QUANT_SIZES[GGMLQuantizationType[fmt.upper()]]
    n = int(rng.integers(1, 5000))
    k = elems * int(rng.integers(1, 60))
    m = int(rng.integers(1, 300))
    dt = NP_DTYPE[variant]
    raw = np.empty((n, (k // elems) * block), np.uint8)          # the .gguf rows, as stored
    case = C.Case("gguf", fmt, variant, m, n, k)
    assert C.case_bytes(case) == nbytes(raw, np.empty((m, k), dt), np.empty((m, n), dt)), (m, n, k)
    assert C.case_flops(case) == 2 * m * n * k


def test_mxfp4_bytes_and_flops(rng):
    n = int(rng.integers(1, 5000))
    k = 32 * int(rng.integers(1, 400))
    m = int(rng.integers(1, 300))
    blocks = np.empty((n, k // 32, 16), np.uint8)                 # E2M1 codes, 2 per byte
    scales = np.empty((n, k // 32), np.uint8)                     # E8M0
    x, y = np.empty((m, k), ml_dtypes.bfloat16), np.empty((m, n), ml_dtypes.bfloat16)
    case = C.Case("mxfp4", "mxfp4", "bf16", m, n, k)
    assert C.case_bytes(case) == nbytes(blocks, scales, x, y), (m, n, k)
    # Same weight bytes as GGUF's own 17-byte MXFP4 block (the two layouts hold the same data).
    elems, block = GGML_QUANT_SIZES[GGMLQuantizationType.MXFP4]
    assert nbytes(blocks, scales) == n * (k // elems) * block
    assert C.case_flops(case) == 2 * m * n * k


@pytest.mark.parametrize("variant", list(C.MOE_MODELS))
def test_moe_bytes_and_flops(rng, variant):
    t = int(rng.integers(1, 300))
    model = C.MOE_MODELS[variant]
    e, top_k, h, i = model.experts, model.top_k, model.hidden, model.intermediate
    case = C.Case("moe", "mxfp4", variant, t, 2 * i, h)
    ids, weights = C.moe_routing(case)
    hit = np.unique(ids).size
    bf16 = ml_dtypes.bfloat16
    one_expert = [np.empty((2 * i, h // 32, 16), np.uint8), np.empty((2 * i, h // 32), np.uint8),
                  np.empty((2 * i,), bf16),                                    # w13 + scales + bias
                  np.empty((h, i // 32, 16), np.uint8), np.empty((h, i // 32), np.uint8),
                  np.empty((h,), bf16)]                                        # w2 + scales + bias
    traffic = [np.empty((t, h), bf16), np.empty((t, h), bf16),                 # x read, y written
               np.empty((t * top_k, i), bf16), np.empty((t * top_k, i), bf16),  # act written, read
               np.empty((t, top_k), np.int32), np.empty((t, top_k), np.float32)]  # routing read
    assert C.case_bytes(case) == hit * nbytes(*one_expert) + nbytes(*traffic), (t, hit)
    # Each (token, expert) pair: stage 1 is [1, H] x [H, 2I], stage 2 is [1, I] x [I, H].
    assert C.case_flops(case) == t * top_k * (2 * h * 2 * i + 2 * i * h)


def test_moe_routing_is_valid_and_repeatable(rng):
    t = int(rng.integers(1, 500))
    case = C.Case("moe", "mxfp4", "gpt-oss-120b", t, 5760, 2880)
    ids, weights = C.moe_routing(case)
    model = case.moe_model()
    assert ids.shape == (t, model.top_k) and ids.dtype == np.int32
    assert ids.min() >= 0 and ids.max() < model.experts
    assert all(len(set(row)) == model.top_k for row in ids.tolist()), "experts of a token must differ"
    # float32 sums of 4 positive weights normalised to 1: a few ulps of error at most.
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)
    # Repeated measurements of one case must move the same bytes: routing is a function of the case.
    again, _ = C.moe_routing(case)
    np.testing.assert_array_equal(ids, again)


def test_roofline_pct_reaches_100_exactly_at_the_floor(rng):
    nbytes_, flops = float(rng.integers(1, 2**34)), float(rng.integers(1, 2**44))
    bw, peak = float(rng.uniform(1e11, 5e12)), float(rng.uniform(1e12, 1e15))
    floor = max(nbytes_ / bw, flops / peak)
    # Relative 1e-12: one division and one multiplication in float64.
    assert math.isclose(R.roofline_pct(nbytes_, flops, floor, bw, peak), 100.0, rel_tol=1e-12)
    assert math.isclose(R.roofline_pct(nbytes_, flops, 4 * floor, bw, peak), 25.0, rel_tol=1e-12)
    expected_bound = "flop" if flops / peak > nbytes_ / bw else "mem"
    assert R.bound(nbytes_, flops, bw, peak) == expected_bound
    # Without a measured FLOP ceiling only the bytes count.
    assert math.isclose(R.roofline_pct(nbytes_, flops, nbytes_ / bw, bw, None), 100.0, rel_tol=1e-12)


def test_cpu_scaled_suite_fits_every_format():
    suite = C.build_suite(cpu=True)
    assert suite, "the CPU suite is empty"
    for case in suite:
        assert case.m <= C.CPU_MAX_M
        assert case.k % 256 == 0 and case.n % 8 == 0, case  # 256: largest GGUF block; 8: int4 word
    full = C.build_suite()
    assert {c.family for c in suite} == {c.family for c in full}
    assert {c.format for c in suite} == {c.format for c in full}


def test_rotation_copies_push_weights_out_of_the_cache():
    flush = 3 * (60 << 20)  # 3 x the H200's L2
    budget = 8 << 30
    for touched in (1 << 20, 50 << 20, 117 << 20, 500 << 20):
        copies = C.rotation_copies(touched, touched, flush, budget)
        assert copies * touched >= flush, (touched, copies)         # enough to cycle the cache
        assert (copies - 1) * touched < flush, (touched, copies)    # and not more
    # The memory budget wins over the cache rule (footprint 1 GiB, budget 2 GiB).
    assert C.rotation_copies(1 << 20, 1 << 30, flush, 2 << 30) == 2
