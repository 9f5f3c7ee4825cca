"""ABI fuzz of qg_gguf_gemm and its workspace query, qg_gguf_gemm_workspace_size, over every GGUF
format of the registry: on a CPU context and (marked gpu) on a GPU context.

Both layouts of w (args->layout): the .gguf blocks (N rows of stride ldw) and the frag layout
(QG_GGUF_LAYOUT_FRAG, the formats of gguf_frag.FORMATS, every one since iq3_xxs's: w and w_scales
the two planes of pyquant.formats.gguf_frag.repack, 16-byte aligned, ldw not read). A frag call
draws its faults too: a format without a frag layout (while one is left), w or w_scales NULL or
off 16 bytes, a layout that is no
qg_gguf_layout value; a struct of an older version (args->size 112 or 128) ends before
w_scales and layout, so the frag fields past its end are not read and w holds the blocks. On a
CPU context a valid frag call must give the output of the same call on the block layout bit for
bit (the CPU tier unpacks the planes to those blocks), and both the reference within its bound.
The case counter lists the calls that read the frag layout apart ("qg_gguf_gemm [frag]").
The rows8 layout (QG_GGUF_LAYOUT_ROWS8, the CPU tier's) is not drawn here: its calls are the
block layout's with the blocks moved, tested by tests/test_gguf_rows8_layout.py.

tests/fuzz_harness.py says how the fuzz works (the VALID / INVALID / EITHER model, the
forked worker, the guard bands) and holds what the families share.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import _assert_bitwise_equal, assert_elementwise  # noqa: E402
from fuzz_harness import (  # noqa: E402
    ALIGNED, BF16, CPU_ENV, Expect, F16, F32, FLOAT_DTYPES, FUZZ_SETTINGS, GpuEnv, HUGE, I32, LD_PAD, M_VALUES,
    NP_DTYPE, NOT_ENUM, N_MUTATIONS, REQUIRES_LIBRARY, SIZE_FIELDS, U32, U4X8, U8, UNIT_ROUNDOFF,
    accepted_output, allow_empty, args_and_ctx, args_mutation, assert_close, base_spec, call,
    check_misaligned_args_refused, common_expect, drive, examples, float_input,
    force_fault_next_to_huge, frag_gpu_x, gemm_sizes_expect, is_sane, layout_read, matrix_index, output_matrix,
    ptr_mutation, reads_field, rng_of,
    run_case, run_gpu_case, small, workspace_step, bias_dtype_mutation, bias_expect, bias_input, bias_spec,
    has_bias, with_bias,
)
from fuzz_harness import fuzz_worker, gpu_env  # noqa: E402,F401 (fixtures: the worker, the GPU context)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import FORMATS, bf16_tile, gguf_frag, int8_act, reference  # noqa: E402

pytestmark = REQUIRES_LIBRARY

GGUF_SPECS = {s.qg_format: s for s in FORMATS.values() if s.kind == "gguf"}
BLOCKS, FRAG = int(L.GGUFLayout.QG_GGUF_LAYOUT_BLOCKS), int(L.GGUFLayout.QG_GGUF_LAYOUT_FRAG)
FRAG_FORMATS = sorted(f for f, fs in GGUF_SPECS.items() if fs.name in gguf_frag.FORMATS)
NO_FRAG_FORMATS = sorted(set(GGUF_SPECS) - set(FRAG_FORMATS))   # GGUF formats without a frag layout
ROWS8 = int(L.GGUFLayout.QG_GGUF_LAYOUT_ROWS8)                 # drawn only as a value the check accepts
NOT_LAYOUT = (3, -1, 7, 2 ** 31 - 1, -2 ** 31)                 # no qg_gguf_layout value
FRAG_PTR_FAULTS = ("null", "mis", "shift")                     # the planes need 16-byte alignment


# ================================================================ GGUF

@st.composite
def gguf_specs(draw, gpu=False):
    """A call; gpu: for a GPU context, whose frag tiers take 16-bit x only (fp32 x on the frag
    layout is QG_ERR_UNSUPPORTED there, as the header says), 16-byte aligned with ldx % 8 == 0
    (fuzz_harness.frag_gpu_x)."""
    s = base_spec(draw)
    layout = draw(st.sampled_from([BLOCKS, FRAG]))
    fmt = draw(st.sampled_from(FRAG_FORMATS if layout == FRAG else sorted(GGUF_SPECS)))
    fs = GGUF_SPECS[fmt]
    x_dtype = draw(st.sampled_from((F16, BF16) if gpu and layout == FRAG else FLOAT_DTYPES))
    k = fs.block_elems * draw(st.integers(1, 2 if fs.block_elems == 256 else 4))
    row = k // fs.block_elems * fs.block_bytes
    s.update(format=fmt, m=draw(M_VALUES), n=draw(st.integers(1, 40)), k=k,
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])), huge=[])
    s["ldx"] = k + draw(LD_PAD)
    s["ldy"] = s["n"] + draw(LD_PAD)
    s["ldw"] = row + draw(st.sampled_from([0, 0, 2, 6, 64]))
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "w", "y")}
    s["layout"] = layout
    if layout == FRAG:
        s["ptr"]["w"] = s["ptr"]["w_scales"] = "ok"  # 16-byte aligned (+4 is a fault here)
        if gpu:
            frag_gpu_x(draw, s)
        # a caller built before the frag layout (args->size 112 or 128): the frag fields past
        # its struct are not read, the call is a block call (w holds the blocks)
        s["size_delta"] = draw(st.sampled_from([0, 0, 0, "v0", "v1"]))
    else:  # a block call's w_scales: NULL, or a stray pointer (the header gives it no meaning)
        s["ptr"]["w_scales"] = draw(st.sampled_from(["null"] * 5 + ["ok"]))
    bias_spec(draw, s)
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "format", "x_dtype", "y_dtype", "bias_dtype", "ldx",
                                     "ldy", "ldw", "ptr", "args", "huge", "layout", "frag"]))
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
            ptr_mutation(draw, s, ["x", "w", "w_scales", "bias", "y"])
        elif what == "layout":
            s["layout"] = draw(st.sampled_from(NOT_LAYOUT))
        elif what == "frag":  # the faults of a frag call (on a block call: a format change, w at +4)
            f = draw(st.sampled_from(["format", "w", "w_scales"] if NO_FRAG_FORMATS else ["w", "w_scales"]))
            if f == "format":
                s["format"] = draw(st.sampled_from(NO_FRAG_FORMATS))
            else:
                s["ptr"][f] = draw(st.sampled_from(FRAG_PTR_FAULTS))
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
    layout = layout_read(L.qg_gguf_gemm_args, s)
    frag = layout == FRAG
    exp.bad(fs is None, "format")
    exp.bad(layout not in (BLOCKS, FRAG, ROWS8), "layout")
    exp.bad(frag and fs is not None and fs.name not in gguf_frag.FORMATS, "format")
    gemm_sizes_expect(exp, m, n, k)
    if fs is not None:
        exp.bad(k % fs.block_elems != 0, "k")
    if not frag:  # the frag planes have no row stride: ldw is not read
        if fs is not None:
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
        if frag:
            for p in ("w", "w_scales"):
                exp.bad(s["ptr"][p] in FRAG_PTR_FAULTS, p)
        else:
            exp.open(s["ptr"]["w"] == "mis", "w")  # byte rows: the header asks no alignment
            # w_scales is the frag layout's: the header does not say what a block call's means
            exp.open(s["ptr"]["w_scales"] != "null" and reads_field(L.qg_gguf_gemm_args, s, "w_scales"),
                     "w_scales")
    allow_empty(exp, m == 0, "m")
    return exp


def w_buffers(rng, fs, raw, an, row, ldw, frag):
    """(w, w_scales) of a case: the frag planes of raw (gguf_frag.repack: the bytes
    qg_gguf_repack writes) where the library reads the frag layout of a format that has one,
    else the blocks in rows of stride ldw (random bytes between) and a small stand-in scales
    buffer, which only a stray or unread w_scales points at."""
    if frag and fs.name in gguf_frag.FORMATS and an and raw.shape[1]:
        return gguf_frag.repack(fs.name, np.ascontiguousarray(raw))
    w_extent = max((an - 1) * ldw + row, 0) if an else 0
    w_flat = rng.integers(0, 256, size=w_extent, dtype=np.uint8)
    if ldw >= row:
        for i in range(an):
            w_flat[i * ldw:i * ldw + row] = raw[i]
    return w_flat, rng.integers(0, 256, size=64, dtype=np.uint8)


def blocks_twin(ctx, a, raw, ydt, rows, cols, ldy, y_elems):
    """y [rows, cols] of the call of args a on the block layout (raw's rows contiguous, the
    newest struct, a fresh y): the CPU tier unpacks a frag weight to these very blocks."""
    b = type(a).from_buffer_copy(a)
    blocks = np.ascontiguousarray(raw)
    y = np.zeros(y_elems, NP_DTYPE[ydt])
    b.size, b.layout, b.w_scales = ctypes.sizeof(b), BLOCKS, None
    b.w, b.ldw, b.y = blocks.ctypes.data, blocks.shape[1], y.ctypes.data
    b.workspace, b.workspace_bytes = None, 0
    status, msg = call(L.qg_gguf_gemm, ctx, ctypes.byref(b), None)
    assert status == 0, f"qg_gguf_gemm on the block layout refused the twin of a valid frag call: {msg!r}"
    return y[matrix_index(rows, cols, ldy)].reshape(rows, cols)


def gguf_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = gguf_expect(s)
    frag = layout_read(L.qg_gguf_gemm_args, s) == FRAG
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy") + (() if frag else ("ldw",)))
    m, n, k = s["m"], s["n"], s["k"]
    fs = GGUF_SPECS.get(s["format"], GGUF_SPECS[1])
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k, 256))
    ldx, ldy, ldw = (s["ldx"], s["ldy"], s["ldw"]) if sane else (
        small(s["ldx"]), small(s["ldy"]), small(s["ldw"], 1024))
    nb = -(-ak // fs.block_elems)
    row = nb * fs.block_bytes
    raw = (fs.module.random_blocks(rng, max(an, 1), nb * fs.block_elems, d_range=(1e-3, 1e-2))[:an]
           if nb else np.zeros((an, 0), np.uint8))
    w_data, scales_data = w_buffers(rng, fs, raw, an, row, ldw, frag)
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    bias_ptr, bias = bias_input(rng, mem, s, an)
    bias = bias if has_bias(s, L.qg_gguf_gemm_args) else None
    ptr = s["ptr"]
    a = L.qg_gguf_gemm_args(format=s["format"], m=m, n=n, k=k, x_dtype=s["x_dtype"],
                            y_dtype=s["y_dtype"], x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
                            w=mem.input("w", w_data, ptr["w"]), ldw=s["ldw"], ldy=s["ldy"],
                            bias=bias_ptr, bias_dtype=s["bias_dtype"],
                            w_scales=mem.input("w_scales", scales_data, ptr["w_scales"]), layout=s["layout"])
    y_elems = output_matrix(mem, a, am, an, ldy, ydt, ptr["y"])
    pa, ctx = args_and_ctx(mem, s, a, env)
    tag = " [frag]" if frag else ""
    workspace_step(env, mem, "qg_gguf_gemm_workspace_size" + tag, L.qg_gguf_gemm_workspace_size, ctx, pa, a,
                   gguf_expect(s, pointers=False))

    def verify():
        y = accepted_output(mem, m, n, ldy, y_elems, ydt)
        if y is None:
            return
        w = fs.module.dequantize(np.ascontiguousarray(raw))
        ref = reference.gemm(x_dense, w)
        ref_b, abs_ref = with_bias(ref, reference.gemm(np.abs(x_dense), np.abs(w)), bias)
        if isinstance(env, GpuEnv):
            xq = np.ascontiguousarray(x_dense)
            u2 = 2 * UNIT_ROUNDOFF[ydt]
            with_b = 0.0 if bias is None else u2 * np.abs(bias)[None, :]
            if frag:
                # the frag tiers (tests/test_gpu_gemm.py::test_gguf_gpu_frag): the decode's
                # exact weights, its float32 sums scaling with gguf_frag.decode_magnitudes, or the
                # prefill's weights rounded once to 16 bits; either may have run
                terms = gguf_frag.decode_magnitudes(fs.name, np.ascontiguousarray(raw))
                bound = np.maximum(bf16_tile.accumulation_bound(xq, w, u2, terms=terms),
                                   bf16_tile.error_bound(xq, w, u2)) + with_b
                assert_elementwise(y, ref_b, bound, f"y ({fs.name} frag, GPU)", what="reference")
                return
            # the GPU's default tiers: the int8 tier quantizes x per 32 elements (held to the
            # exact product within that quantization's rigorous bound, pyquant.formats.int8_act,
            # plus the fp32 terms of assert_close); above 8 rows of bf16 x on sm_90 the prefill
            # tier rounds each weight to bf16 (pyquant.formats.bf16_tile): either may have run.
            # A bias moves the output's one rounding: u_y |ref + b| <= u_y (|ref| + |b|).
            bound = (int8_act.exact_error_bound(xq, fs.name, np.ascontiguousarray(raw))
                     + u2 * np.abs(ref) + with_b
                     + 4 * k * U32 * reference.gemm(np.abs(x_dense), np.abs(w)))
            if xdt == BF16 and am > 8:
                bound = np.maximum(bound, bf16_tile.error_bound(xq, w, u2) + with_b)
            assert_elementwise(y, ref_b, bound, f"y ({fs.name}, GPU)", what="reference")
            return
        assert_close(f"y ({fs.name}{tag})", y, ref_b, ydt, abs_ref, k)
        if frag:
            _assert_bitwise_equal(y, blocks_twin(ctx, a, raw, ydt, m, n, ldy, y_elems),
                                  f"y ({fs.name}) frag vs blocks, CPU tier")
    return drive("qg_gguf_gemm" + tag, lambda: call(L.qg_gguf_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(1100), **FUZZ_SETTINGS)
@given(gguf_specs())
def test_fuzz_gguf_gemm(spec):
    run_case("qg_gguf_gemm", gguf_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(300), **FUZZ_SETTINGS)
@given(spec=gguf_specs(gpu=True))
def test_fuzz_gguf_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_gguf_gemm", gguf_case, spec)


# ================================================================ known bugs, pinned

@pytest.mark.parametrize("fn_name", ["qg_gguf_gemm"])
def test_misaligned_args_struct_is_refused(fn_name):
    check_misaligned_args_refused(fn_name, getattr(L, fn_name + "_args"))
