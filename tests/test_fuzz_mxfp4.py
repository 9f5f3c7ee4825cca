"""ABI fuzz of qg_mxfp4_gemm and its workspace query, qg_mxfp4_gemm_workspace_size: on a CPU
context and (marked gpu) on a GPU context.

tests/fuzz_harness.py says how the fuzz works (the VALID / INVALID / EITHER model, the
forked worker, the guard bands) and holds what the families share.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzz_harness import (  # noqa: E402
    ALIGNED, BF16, CPU_ENV, Expect, F16, F32, FLOAT_DTYPES, FUZZ_SETTINGS, HUGE, I32, LD_PAD, M_VALUES,
    NOT_ENUM, NP_DTYPE, N_MUTATIONS, REQUIRES_LIBRARY, SIZE_FIELDS, U4X8, U8, accepted_output,
    allow_empty, args_and_ctx, args_mutation, assert_close, base_spec, call, layout_read,
    check_misaligned_args_refused, common_expect, drive, examples, float_input,
    force_fault_next_to_huge, frag_gpu_x, gemm_sizes_expect, is_sane, mxfp4_weight, output_matrix, ptr_mutation,
    rng_of, run_case, run_gpu_case, small, workspace_step, bias_dtype_mutation, bias_expect, bias_input,
    bias_spec, with_bias,
)
from fuzz_harness import fuzz_worker, gpu_env  # noqa: E402,F401 (fixtures: the worker, the GPU context)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import mxfp4, reference  # noqa: E402

pytestmark = REQUIRES_LIBRARY


# ================================================================ MXFP4 dense

@st.composite
def mxfp4_specs(draw, gpu=False):
    """A call; gpu: for a GPU context, whose tiers (the frag kernels) take 16-bit x, 16-byte
    aligned with ldx % 8 == 0 (fuzz_harness.frag_gpu_x); other x there is QG_ERR_UNSUPPORTED."""
    s = base_spec(draw)
    x_dtype = draw(st.sampled_from((F16, BF16) if gpu else FLOAT_DTYPES))
    s.update(m=draw(M_VALUES), n=draw(st.integers(1, 40)), k=32 * draw(st.integers(1, 8)),
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])),
             huge=[])
    s["ldx"] = s["k"] + draw(LD_PAD)
    s["ldy"] = s["n"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "blocks", "scales", "y")}
    if gpu:
        frag_gpu_x(draw, s)
    bias_spec(draw, s)
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "x_dtype", "y_dtype", "bias_dtype", "ldx",
                                     "ldy", "ptr", "args", "huge", "layout"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "layout":
            # not a qg_mxfp4_layout value (1 = frag is valid, but these buffers are canonical)
            s["layout"] = draw(st.sampled_from([2, -1, 7, 2 ** 31 - 1]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -32, 16, s["k"] + 8, 33]))
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
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "blocks", "scales", "bias", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 32
            s["huge"].append(f)
    exp = mxfp4_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def mxfp4_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_mxfp4_gemm_args)
    m, n, k = s["m"], s["n"], s["k"]
    gemm_sizes_expect(exp, m, n, k)
    exp.bad(k % 32 != 0, "k")
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    bias_expect(exp, s, L.qg_mxfp4_gemm_args, pointers)
    # a first-version struct (size 120) has no layout field: canonical whatever it holds
    exp.bad(layout_read(L.qg_mxfp4_gemm_args, s) != 0, "layout")
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        for p in ("blocks", "scales"):
            exp.bad(s["ptr"][p] == "null", p)
            exp.open(s["ptr"][p] == "mis", p)  # byte arrays
    allow_empty(exp, m == 0, "m")
    return exp


def mxfp4_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = mxfp4_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy"))
    m, n, k = s["m"], s["n"], s["k"]
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k, 256))
    ldx, ldy = (s["ldx"], s["ldy"]) if sane else (small(s["ldx"]), small(s["ldy"]))
    blocks, scales = mxfp4_weight(rng, an, ak)
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    bias_ptr, bias = bias_input(rng, mem, s, an)
    ptr = s["ptr"]
    a = L.qg_mxfp4_gemm_args(m=m, n=n, k=k, x_dtype=s["x_dtype"], y_dtype=s["y_dtype"],
                             x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
                             blocks=mem.input("blocks", blocks, ptr["blocks"]),
                             scales=mem.input("scales", scales, ptr["scales"]),
                             bias=bias_ptr, bias_dtype=s["bias_dtype"],
                             ldy=s["ldy"], layout=s.get("layout", 0))
    y_elems = output_matrix(mem, a, am, an, ldy, ydt, ptr["y"])
    pa, ctx = args_and_ctx(mem, s, a, env)
    workspace_step(env, mem, "qg_mxfp4_gemm_workspace_size", L.qg_mxfp4_gemm_workspace_size, ctx, pa, a,
                   mxfp4_expect(s, pointers=False))

    def verify():
        y = accepted_output(mem, m, n, ldy, y_elems, ydt)
        if y is None:
            return
        # a pointer at +1 still points at our payload (the byte before it is slack)
        w = mxfp4.dequantize(blocks, scales)
        ref, abs_ref = with_bias(reference.gemm(x_dense, w), reference.gemm(np.abs(x_dense), np.abs(w)), bias)
        assert_close("y", y, ref, ydt, abs_ref, k)
    return drive("qg_mxfp4_gemm", lambda: call(L.qg_mxfp4_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(700), **FUZZ_SETTINGS)
@given(mxfp4_specs())
def test_fuzz_mxfp4_gemm(spec):
    run_case("qg_mxfp4_gemm", mxfp4_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(200), **FUZZ_SETTINGS)
@given(spec=mxfp4_specs(gpu=True))
def test_fuzz_mxfp4_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_mxfp4_gemm", mxfp4_case, spec)


# ================================================================ known bugs, pinned

@pytest.mark.parametrize("fn_name", ["qg_mxfp4_gemm"])
def test_misaligned_args_struct_is_refused(fn_name):
    check_misaligned_args_refused(fn_name, getattr(L, fn_name + "_args"))
