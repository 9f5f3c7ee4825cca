"""The MoE frag layout (qg_moe_repack) on the CPU: the library's repack against the numpy
specification (pyquant.formats.mxfp4_frag.moe_repack) byte for byte, the inverse, the size
query, and the refusals (the CPU MoE tier reads canonical experts; a frag weight's gate / up
split must be the one moe() is told). Fresh random inputs (seed printed on failure)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pyquant
from pyquant import _lib
from pyquant.formats import mxfp4_frag
from test_api_cpu import random_mxfp4

# (experts, rows per expert, K): I = N / 2 a multiple of 16, one that is not (part padding),
# K padded to 128, K one block
SHAPES = ((3, 64, 256), (2, 80, 96), (1, 32, 32))


def _canonical(rng, e, n, k):
    w = random_mxfp4(rng, (e, n), k, e_range=(0, 255))  # every scale byte, NaN included
    return w, np.asarray(w.blocks), np.asarray(w.scales)


@pytest.mark.parametrize("e,n,k", SHAPES)
@pytest.mark.parametrize("parts,gate_up", [(1, None), (2, "interleaved"), (2, "concat")])
def test_library_repack_is_the_numpy_specification(rng, assert_bitwise_equal, e, n, k, parts, gate_up):
    w, blocks, scales = _canonical(rng, e, n, k)
    got = w.moe_repack(parts, gate_up, pyquant.cpu_context())
    fb, fs = mxfp4_frag.moe_repack(blocks, scales, parts, gate_up or "interleaved")
    name = f"E={e} N={n} K={k} parts={parts} {gate_up}"
    assert_bitwise_equal(np.asarray(got.blocks).reshape(fb.shape), fb, f"blocks {name}")
    assert_bitwise_equal(np.asarray(got.scales).reshape(fs.shape), fs, f"scales {name}")
    back_b, back_s = got.canonical_arrays()
    assert_bitwise_equal(back_b, blocks, f"round trip blocks {name}")
    assert_bitwise_equal(back_s, scales, f"round trip scales {name}")
    nb, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
    args = _lib.qg_moe_repack_args(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, num_experts=e,
                                   parts=parts, n=n, k=k)
    _lib.qg_moe_repack_size(ctypes.byref(args), ctypes.byref(nb), ctypes.byref(ns))
    assert (nb.value, ns.value) == (fb.nbytes, fs.nbytes)


def test_parts_hold_gate_and_up_rows(rng):
    """Part 0 of expert e is its gate rows, part 1 its up rows, in either canonical order."""
    e, n, k = 2, 64, 64
    _, blocks, scales = _canonical(rng, e, n, k)
    inter = n // 2
    for gate_up, gate in (("interleaved", np.arange(0, n, 2)), ("concat", np.arange(inter))):
        fb, fs = mxfp4_frag.moe_repack(blocks, scales, 2, gate_up)
        rbp = fb.shape[0] // (2 * e)
        b, s = mxfp4_frag.unpack(fb[:rbp], fs[:rbp], inter, k)  # part 0: expert 0, gate
        assert np.array_equal(b, blocks[0, gate]) and np.array_equal(s, scales[0, gate])
        b, s = mxfp4_frag.unpack(fb[3 * rbp:], fs[3 * rbp:], inter, k)  # part 3: expert 1, up
        up = gate + (1 if gate_up == "interleaved" else inter)
        assert np.array_equal(b, blocks[1, up]) and np.array_equal(s, scales[1, up])


def test_cpu_moe_refuses_frag_experts_and_a_mismatched_split(rng):
    e, h, inter, t, top_k = 4, 64, 32, 3, 2
    w13 = random_mxfp4(rng, (e, 2 * inter), h)
    w2 = random_mxfp4(rng, (e, h), inter)
    x = rng.standard_normal((t, h)).astype(np.float32)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t)]).astype(np.int32)
    wts = np.full((t, top_k), 0.5, np.float32)
    cpu = pyquant.cpu_context()
    f13, f2 = pyquant.moe_repack(w13, w2, "concat", ctx=cpu)
    with pytest.raises(pyquant.QuantGemmError, match="reads canonical expert stacks"):
        pyquant.moe(x, ids, wts, f13, f2, gate_up_layout="concat", ctx=cpu)
    with pytest.raises(pyquant.QuantGemmError, match="repacked with gate_up='concat'"):
        pyquant.moe(x, ids, wts, f13, f2, gate_up_layout="interleaved", ctx=cpu)
    with pytest.raises(pyquant.QuantGemmError, match="both experts in one layout"):
        pyquant.moe(x, ids, wts, f13, w2, gate_up_layout="concat", ctx=cpu)


@pytest.mark.parametrize("field,value,match", [
    ("parts", 3, "parts=3 is not 1"), ("n", 63, "not a multiple of parts=2"),
    ("k", 48, "not a multiple of 32"), ("layout", 0, "produces QG_MXFP4_LAYOUT_FRAG"),
    ("num_experts", 0, "num_experts=0 must be positive"), ("gate_up_layout", 7, "not a qg_gate_up_layout"),
])
def test_repack_refuses_bad_arguments(field, value, match):
    args = _lib.qg_moe_repack_args(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, num_experts=2, parts=2,
                                   n=64, k=64)
    setattr(args, field, value)
    nb, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
    with pytest.raises(pyquant.QuantGemmError, match=match):
        _lib.qg_moe_repack_size(ctypes.byref(args), ctypes.byref(nb), ctypes.byref(ns))


def test_stage_layout_and_workspace_query_are_checked():
    """An unknown layout value is refused naming it; the stages' workspace queries refuse a
    NULL result pointer and answer 0 on a CPU context (its tier needs none)."""
    cpu = pyquant.cpu_context()
    common = dict(num_tokens=3, top_k=2, num_experts=4, tile_m=16, hidden=64, intermediate=32)
    a1 = _lib.qg_moe_stage1_args(x_dtype=_lib.DType.QG_DTYPE_F32, ldx=64, **common)
    a2 = _lib.qg_moe_stage2_args(act_dtype=_lib.DType.QG_DTYPE_F32, y_dtype=_lib.DType.QG_DTYPE_F32, ldy=64,
                                 **common)
    for query, args in ((_lib.qg_moe_stage1_workspace_size, a1), (_lib.qg_moe_stage2_workspace_size, a2)):
        nbytes = ctypes.c_size_t(7)
        query(cpu.handle, ctypes.byref(args), ctypes.byref(nbytes))
        assert nbytes.value == 0
        with pytest.raises(pyquant.QuantGemmError, match="bytes is NULL"):
            query(cpu.handle, ctypes.byref(args), None)
        args.layout = 7
        with pytest.raises(pyquant.QuantGemmError, match="layout=7 is not a qg_mxfp4_layout value"):
            query(cpu.handle, ctypes.byref(args), ctypes.byref(nbytes))
