"""ABI fuzz of qg_w4a16_gemm and its workspace query, qg_w4a16_gemm_workspace_size: on a CPU
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
    ALIGNED, BF16, CPU_ENV, Expect, F16, F32, FLOAT_DTYPES, FUZZ_SETTINGS, HUGE, I32,
    LD_PAD, M_VALUES, NOT_ENUM, NP_DTYPE, N_MUTATIONS, REQUIRES_LIBRARY, SIZE_FIELDS, U4X8, U8,
    accepted_output, allow_empty, args_and_ctx, args_mutation, assert_close, base_spec, call,
    check_misaligned_args_refused, common_expect, drive, examples, float_input,
    force_fault_next_to_huge, gemm_sizes_expect, is_sane, output_matrix, ptr_mutation, rng_of,
    run_case, run_gpu_case, small, workspace_step, bias_dtype_mutation, bias_expect, bias_input, bias_spec,
    has_bias, layout_read, with_bias,
)
from fuzz_harness import fuzz_worker, gpu_env  # noqa: E402,F401 (fixtures: the worker, the GPU context)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import int4, reference  # noqa: E402

pytestmark = REQUIRES_LIBRARY


# ================================================================ W4A16

@st.composite
def w4a16_specs(draw):
    s = base_spec(draw)
    G = draw(st.sampled_from([32, 64, 128]))
    x_dtype = draw(st.sampled_from([F16, BF16]))
    s.update(m=draw(M_VALUES), n=8 * draw(st.integers(1, 6)), k=G * draw(st.integers(1, 4)), G=G,
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])),
             scale_dtype=draw(st.sampled_from([F16, BF16])), zero_dtype=U4X8,
             ldx_pad=draw(LD_PAD), ldy_pad=draw(LD_PAD), huge=[])
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "qweight", "scales", "y")}
    s["ptr"]["qzeros"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))  # NULL = symmetric
    bias_spec(draw, s)
    s["ldx"], s["ldy"] = s["k"] + s["ldx_pad"], s["n"] + s["ldy_pad"]
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "G", "x_dtype", "y_dtype", "scale_dtype",
                                     "zero_dtype", "bias_dtype", "ldx", "ldy", "ptr", "args", "huge",
                                     "layout"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "layout":
            # not a qg_w4a16_layout value (1 = frag is valid, but these buffers are canonical)
            s["layout"] = draw(st.sampled_from([2, -1, 7, 2 ** 31 - 1]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -8, 1, 4, 12, 7]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -G, G // 2, G + 8, 8]))
        elif what == "G":
            s["G"] = draw(st.sampled_from([0, -32, 8, 16, 48, 96, 256, 2 ** 31 - 1]))
        elif what in ("x_dtype", "scale_dtype"):
            s[what] = draw(st.sampled_from([F32, I32, U8, U4X8, *NOT_ENUM]))
        elif what == "y_dtype":
            other = BF16 if s["x_dtype"] == F16 else F16
            s[what] = draw(st.sampled_from([other, I32, U8, U4X8, *NOT_ENUM]))
        elif what == "zero_dtype":
            s[what] = draw(st.sampled_from([F16, BF16, F32, I32, U8, *NOT_ENUM]))
        elif what == "bias_dtype":
            bias_dtype_mutation(draw, s)
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["k"] - 1, 0, -1, s["k"] // 2, -2 ** 63]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["n"] - 1, 0, -1, s["n"] // 2, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "qweight", "scales", "qzeros", "bias", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 128
            s["huge"].append(f)
    exp = w4a16_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def w4a16_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_w4a16_gemm_args)
    m, n, k, G = s["m"], s["n"], s["k"], s["G"]
    gemm_sizes_expect(exp, m, n, k)
    exp.bad(G not in (32, 64, 128), "group_size")
    exp.bad(G in (32, 64, 128) and k % G != 0, "k", "group_size")
    exp.bad(n % 8 != 0, "n")
    exp.bad(s["x_dtype"] not in (F16, BF16), "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    exp.bad(s["scale_dtype"] not in (F16, BF16), "scale_dtype")
    exp.bad(s["ptr"]["qzeros"] != "null" and s["zero_dtype"] != U4X8, "zero_dtype")
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    # a first-version struct (size 128) has no layout field: canonical whatever it holds
    exp.bad(layout_read(L.qg_w4a16_gemm_args, s) != 0, "layout")
    bias_expect(exp, s, L.qg_w4a16_gemm_args, pointers)
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "qweight", "scales", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        exp.bad(s["ptr"]["qzeros"] == "mis", "qzeros")
    allow_empty(exp, m == 0, "m")
    return exp


def w4a16_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = w4a16_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy"))
    m, n, k, G = s["m"], s["n"], s["k"], s["G"]
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k))
    aG = G if G in (32, 64, 128) else 32
    ldx, ldy = (s["ldx"], s["ldy"]) if sane else (small(s["ldx"]), small(s["ldy"]))
    groups = -(-ak // aG)
    xdt = s["x_dtype"] if s["x_dtype"] in (F16, BF16) else F16
    sdt = s["scale_dtype"] if s["scale_dtype"] in (F16, BF16) else F16
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    qweight = rng.integers(0, 2 ** 32, size=(an, -(-ak // 8)), dtype=np.uint32).view(np.int32)
    sign = rng.choice([-1.0, 1.0], size=(an, groups))
    scales = (sign * rng.uniform(0.005, 0.02, size=(an, groups))).astype(NP_DTYPE[sdt])
    qzeros = rng.integers(0, 2 ** 32, size=(-(-an // 8), groups), dtype=np.uint32).view(np.int32)
    bias_ptr, bias = bias_input(rng, mem, s, an)
    bias = bias if has_bias(s, L.qg_w4a16_gemm_args) else None
    ptr = s["ptr"]
    a = L.qg_w4a16_gemm_args(
        m=m, n=n, k=k, group_size=G, x_dtype=s["x_dtype"], y_dtype=s["y_dtype"],
        scale_dtype=s["scale_dtype"], zero_dtype=s["zero_dtype"],
        x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
        qweight=mem.input("qweight", qweight, ptr["qweight"]),
        scales=mem.input("scales", scales, ptr["scales"]),
        qzeros=mem.input("qzeros", qzeros, ptr["qzeros"]), ldy=s["ldy"], layout=s.get("layout", 0),
        bias=bias_ptr, bias_dtype=s["bias_dtype"])
    y_elems = output_matrix(mem, a, am, an, ldy, ydt, ptr["y"])
    pa, ctx = args_and_ctx(mem, s, a, env)
    workspace_step(env, mem, "qg_w4a16_gemm_workspace_size", L.qg_w4a16_gemm_workspace_size, ctx, pa, a,
                   w4a16_expect(s, pointers=False))

    def verify():
        y = accepted_output(mem, m, n, ldy, y_elems, ydt)
        if y is None:
            return
        w = int4.dequantize(qweight, scales, None if ptr["qzeros"] == "null" else qzeros, G)
        ref, abs_ref = with_bias(reference.gemm(x_dense, w), reference.gemm(np.abs(x_dense), np.abs(w)), bias)
        assert_close("y", y, ref, ydt, abs_ref, k)
    return drive("qg_w4a16_gemm", lambda: call(L.qg_w4a16_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(900), **FUZZ_SETTINGS)
@given(w4a16_specs())
def test_fuzz_w4a16_gemm(spec):
    run_case("qg_w4a16_gemm", w4a16_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(300), **FUZZ_SETTINGS)
@given(spec=w4a16_specs())
def test_fuzz_w4a16_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_w4a16_gemm", w4a16_case, spec)


# ================================================================ known bugs, pinned

@pytest.mark.parametrize("fn_name", ["qg_w4a16_gemm"])
def test_misaligned_args_struct_is_refused(fn_name):
    check_misaligned_args_refused(fn_name, getattr(L, fn_name + "_args"))
