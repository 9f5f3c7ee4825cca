"""ABI fuzz of qg_gguf_gemm and its workspace query, qg_gguf_gemm_workspace_size, over every GGUF
format of the registry: on a CPU context and (marked gpu) on a GPU context.

tests/fuzz_harness.py says how the fuzz works (the VALID / INVALID / EITHER model, the
forked worker, the guard bands) and holds what the families share.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import assert_elementwise  # noqa: E402
from fuzz_harness import (  # noqa: E402
    ALIGNED, BF16, CPU_ENV, Expect, F32, FLOAT_DTYPES, FUZZ_SETTINGS, GpuEnv, HUGE, I32, LD_PAD, M_VALUES,
    NOT_ENUM, N_MUTATIONS, REQUIRES_LIBRARY, SIZE_FIELDS, U32, U4X8, U8, UNIT_ROUNDOFF,
    accepted_output, allow_empty, args_and_ctx, args_mutation, assert_close, base_spec, call,
    check_misaligned_args_refused, common_expect, drive, examples, float_input,
    force_fault_next_to_huge, gemm_sizes_expect, is_sane, output_matrix, ptr_mutation, rng_of,
    run_case, run_gpu_case, small, workspace_step, bias_dtype_mutation, bias_expect, bias_input, bias_spec,
    has_bias, with_bias,
)
from fuzz_harness import fuzz_worker, gpu_env  # noqa: E402,F401 (fixtures: the worker, the GPU context)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import FORMATS, bf16_tile, int8_act, reference  # noqa: E402

pytestmark = REQUIRES_LIBRARY

GGUF_SPECS = {s.qg_format: s for s in FORMATS.values() if s.kind == "gguf"}


# ================================================================ GGUF

@st.composite
def gguf_specs(draw):
    s = base_spec(draw)
    fmt = draw(st.sampled_from(sorted(GGUF_SPECS)))
    fs = GGUF_SPECS[fmt]
    x_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    k = fs.block_elems * draw(st.integers(1, 2 if fs.block_elems == 256 else 4))
    row = k // fs.block_elems * fs.block_bytes
    s.update(format=fmt, m=draw(M_VALUES), n=draw(st.integers(1, 40)), k=k,
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])), huge=[])
    s["ldx"] = k + draw(LD_PAD)
    s["ldy"] = s["n"] + draw(LD_PAD)
    s["ldw"] = row + draw(st.sampled_from([0, 0, 2, 6, 64]))
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "w", "y")}
    bias_spec(draw, s)
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "format", "x_dtype", "y_dtype", "bias_dtype", "ldx",
                                     "ldy", "ldw", "ptr", "args", "huge"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -32, 16, k + 32, k + 8]))
        elif what == "format":
            s["format"] = draw(st.sampled_from([0, 7, *NOT_ENUM]))
        elif what == "x_dtype":
            s["x_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "y_dtype":
            s["y_dtype"] = draw(st.sampled_from([d for d in FLOAT_DTYPES if d not in (x_dtype, F32)]
                                                + [I32, U8, *NOT_ENUM]))
        elif what == "bias_dtype":
            bias_dtype_mutation(draw, s)
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["k"] - 1, 0, -1, -2 ** 63]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["n"] - 1, 0, -1, -2 ** 63]))
        elif what == "ldw":
            s["ldw"] = draw(st.sampled_from([row - 2, row + 1, row + 3, 0, -2, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "w", "bias", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy", "ldw"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 256
            if f == "ldw":
                s["ldw"] -= s["ldw"] % 2
            s["huge"].append(f)
    exp = gguf_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def gguf_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_gguf_gemm_args)
    m, n, k = s["m"], s["n"], s["k"]
    fs = GGUF_SPECS.get(s["format"])
    exp.bad(fs is None, "format")
    gemm_sizes_expect(exp, m, n, k)
    if fs is not None:
        exp.bad(k % fs.block_elems != 0, "k")
        exp.bad(s["ldw"] < max(k, 0) // fs.block_elems * fs.block_bytes, "ldw")
    exp.open(s["ldw"] % 2 != 0, "ldw")  # the header does not ask for even row strides
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    bias_expect(exp, s, L.qg_gguf_gemm_args, pointers)
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        exp.bad(s["ptr"]["w"] == "null", "w")
        exp.open(s["ptr"]["w"] == "mis", "w")  # byte rows: the header asks no alignment
    allow_empty(exp, m == 0, "m")
    return exp


def gguf_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = gguf_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy", "ldw"))
    m, n, k = s["m"], s["n"], s["k"]
    fs = GGUF_SPECS.get(s["format"], GGUF_SPECS[1])
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k, 256))
    ldx, ldy, ldw = (s["ldx"], s["ldy"], s["ldw"]) if sane else (
        small(s["ldx"]), small(s["ldy"]), small(s["ldw"], 1024))
    nb = -(-ak // fs.block_elems)
    row = nb * fs.block_bytes
    raw = (fs.module.random_blocks(rng, max(an, 1), nb * fs.block_elems, d_range=(1e-3, 1e-2))[:an]
           if nb else np.zeros((an, 0), np.uint8))
    w_extent = max((an - 1) * ldw + row, 0) if an else 0
    w_flat = rng.integers(0, 256, size=w_extent, dtype=np.uint8)
    if ldw >= row:
        for i in range(an):
            w_flat[i * ldw:i * ldw + row] = raw[i]
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    bias_ptr, bias = bias_input(rng, mem, s, an)
    bias = bias if has_bias(s, L.qg_gguf_gemm_args) else None
    ptr = s["ptr"]
    a = L.qg_gguf_gemm_args(format=s["format"], m=m, n=n, k=k, x_dtype=s["x_dtype"],
                            y_dtype=s["y_dtype"], x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
                            w=mem.input("w", w_flat, ptr["w"]), ldw=s["ldw"], ldy=s["ldy"],
                            bias=bias_ptr, bias_dtype=s["bias_dtype"])
    y_elems = output_matrix(mem, a, am, an, ldy, ydt, ptr["y"])
    pa, ctx = args_and_ctx(mem, s, a, env)
    workspace_step(env, mem, "qg_gguf_gemm_workspace_size", L.qg_gguf_gemm_workspace_size, ctx, pa, a,
                   gguf_expect(s, pointers=False))

    def verify():
        y = accepted_output(mem, m, n, ldy, y_elems, ydt)
        if y is None:
            return
        w = fs.module.dequantize(np.ascontiguousarray(raw))
        ref = reference.gemm(x_dense, w)
        ref_b, abs_ref = with_bias(ref, reference.gemm(np.abs(x_dense), np.abs(w)), bias)
        if isinstance(env, GpuEnv):
            # the GPU's default tiers: the int8 tier quantizes x per 32 elements (held to the
            # exact product within that quantization's rigorous bound, pyquant.formats.int8_act,
            # plus the fp32 terms of assert_close); above 8 rows of bf16 x on sm_90 the prefill
            # tier rounds each weight to bf16 (pyquant.formats.bf16_tile): either may have run.
            # A bias moves the output's one rounding: u_y |ref + b| <= u_y (|ref| + |b|).
            xq = np.ascontiguousarray(x_dense)
            u2 = 2 * UNIT_ROUNDOFF[ydt]
            with_b = 0.0 if bias is None else u2 * np.abs(bias)[None, :]
            bound = (int8_act.exact_error_bound(xq, fs.name, np.ascontiguousarray(raw))
                     + u2 * np.abs(ref) + with_b
                     + 4 * k * U32 * reference.gemm(np.abs(x_dense), np.abs(w)))
            if xdt == BF16 and am > 8:
                bound = np.maximum(bound, bf16_tile.error_bound(xq, w, u2) + with_b)
            assert_elementwise(y, ref_b, bound, f"y ({fs.name}, GPU)", what="reference")
            return
        assert_close(f"y ({fs.name})", y, ref_b, ydt, abs_ref, k)
    return drive("qg_gguf_gemm", lambda: call(L.qg_gguf_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(900), **FUZZ_SETTINGS)
@given(gguf_specs())
def test_fuzz_gguf_gemm(spec):
    run_case("qg_gguf_gemm", gguf_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(300), **FUZZ_SETTINGS)
@given(spec=gguf_specs())
def test_fuzz_gguf_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_gguf_gemm", gguf_case, spec)


# ================================================================ known bugs, pinned

@pytest.mark.parametrize("fn_name", ["qg_gguf_gemm"])
def test_misaligned_args_struct_is_refused(fn_name):
    check_misaligned_args_refused(fn_name, getattr(L, fn_name + "_args"))
