"""ABI fuzz of the MoE entry points on a CPU context: qg_moe_align, qg_moe_align_sizes,
qg_moe_stage1 and qg_moe_stage2.

tests/fuzz_harness.py says how the fuzz works (the VALID / INVALID / EITHER model, the
forked worker, the guard bands) and holds what the families share.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzz_harness import (  # noqa: E402
    ALIGNED, DTYPE_BYTES, Expect, F32, FLOAT_DTYPES, FUZZ_SETTINGS, HUGE, HUGE_TOKENS, I32, LD_PAD,
    Mem, NOT_ENUM, NP_DTYPE, N_MUTATIONS, REQUIRES_LIBRARY, SIZE_FIELDS, U4X8, U8, accepted_output,
    allow_empty, args_and_ctx, args_mutation, assert_close, base_spec, call,
    check_misaligned_args_refused, common_expect, drive, examples, float_input,
    force_fault_next_to_huge, is_sane, mxfp4_weight, output_matrix, ptr_mutation, rng_of, run_case,
    small,
)
from fuzz_harness import fuzz_worker  # noqa: E402,F401 (fixture: this file's worker)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import mxfp4, reference  # noqa: E402

pytestmark = REQUIRES_LIBRARY


# ================================================================ MoE

def routing_expect(exp, s):
    T, top_k, E, tile_m = s["T"], s["top_k"], s["E"], s["tile_m"]
    exp.bad(T < 0, "num_tokens")
    exp.bad(E < 1, "num_experts")
    exp.bad(top_k < 1, "top_k")
    exp.open(top_k > E, "top_k", "num_experts")  # distinct experts per token: not in the header
    exp.bad(tile_m not in reference.TILE_M_VALUES, "tile_m")


def topk_ids_for(rng, T, top_k, E):
    ids = np.zeros((T, top_k), np.int32)
    for t in range(T):
        ids[t] = rng.permutation(max(E, top_k))[:top_k] % max(E, 1)
    return ids


@st.composite
def moe_base(draw):
    s = base_spec(draw)
    E = draw(st.integers(1, 6))
    s.update(T=draw(st.sampled_from([1, 2, 3, 5, 8, 12])), E=E,
             top_k=draw(st.integers(1, min(E, 4))), tile_m=draw(st.sampled_from([16, 32, 64, 80, 96, 128])),
             huge=[], corrupt=None)
    return s


def routing_mutation(draw, s):
    what = draw(st.sampled_from(["T", "E", "top_k", "tile_m"]))
    if what == "T":
        s["T"] = draw(st.sampled_from([0, -1, -2 ** 63]))
    elif what == "E":
        s["E"] = draw(st.sampled_from([0, -1, -2 ** 31]))
    elif what == "top_k":
        s["top_k"] = draw(st.sampled_from([0, -1, s["E"] + 1]))
    else:
        s["tile_m"] = draw(st.sampled_from([0, 8, 48, 72, 112, 512, -16, 2 ** 31 - 1]))


@st.composite
def align_specs(draw):
    s = draw(moe_base())
    s["ptr"] = {p: draw(ALIGNED) for p in ("topk_ids", "sorted_ids", "tile_experts", "num_sorted")}
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "ids", "ptr", "args", "huge"]))
        if what == "routing":
            routing_mutation(draw, s)
        elif what == "ids":
            s["corrupt"] = draw(st.sampled_from([-1, "E", 2 ** 31 - 1, -2 ** 31]))
        elif what == "ptr":
            ptr_mutation(draw, s, list(s["ptr"]))
        elif what == "args":
            args_mutation(draw, s)
        else:
            s["T"] = draw(st.sampled_from(HUGE_TOKENS))
            s["huge"].append("num_tokens")
    exp = align_expect(s)
    force_fault_next_to_huge(s, exp, ["num_tokens"] if s["huge"] else [],
                             lambda s: s.update(tile_m=7))
    return s


def align_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_align_args)
    routing_expect(exp, s)
    exp.bad(s["corrupt"] is not None, "topk_ids")
    exp.open(bool(s["huge"]), "num_tokens", "top_k", *SIZE_FIELDS)
    for p, mode in s["ptr"].items():
        exp.bad(mode in ("null", "mis"), p)
    allow_empty(exp, s["T"] == 0, "num_tokens")
    return exp


def align_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = align_expect(s)
    sane = is_sane(exp, s, ("T", "top_k", "E"))
    T, top_k, E, tile_m = s["T"], s["top_k"], s["E"], s["tile_m"]
    aT, ak, aE = (T, max(top_k, 1), max(E, 1)) if sane else (small(T, 12), small(top_k, 6), max(small(E, 6), 1))
    ids = topk_ids_for(rng, aT, ak, aE)
    if s["corrupt"] is not None and ids.size:
        bad = E if s["corrupt"] == "E" else s["corrupt"]
        ids.reshape(-1)[rng.integers(ids.size)] = np.array(bad).astype(np.int32)
    at = tile_m if tile_m in reference.TILE_M_VALUES else 16
    max_sorted, max_tiles = reference.moe_align_sizes(aT, ak, aE, at)
    ptr = s["ptr"]
    a = L.qg_moe_align_args(num_tokens=T, top_k=top_k, num_experts=E, tile_m=tile_m,
                            topk_ids=mem.input("topk_ids", ids, ptr["topk_ids"]),
                            sorted_ids=mem.output("sorted_ids", 4 * max_sorted, ptr["sorted_ids"]),
                            tile_experts=mem.output("tile_experts", 4 * max_tiles, ptr["tile_experts"]),
                            num_sorted=mem.output("num_sorted", 4, ptr["num_sorted"]))
    pa, ctx = args_and_ctx(mem, s, a)

    def verify():
        if T == 0:
            mem.check_untouched()
            return
        mem.check_untouched({"sorted_ids": np.ones(4 * max_sorted, bool),
                             "tile_experts": np.ones(4 * max_tiles, bool),
                             "num_sorted": np.ones(4, bool)})
        ref_sorted, ref_tiles, ref_num = reference.moe_align(ids, E, tile_m)
        num = int(mem.payload("num_sorted", np.int32)[0])
        assert num == ref_num, f"num_sorted={num}, reference {ref_num}"
        tiles = mem.payload("tile_experts", np.int32)
        assert np.array_equal(tiles, ref_tiles), f"tile_experts {tiles} != reference {ref_tiles}"
        got = mem.payload("sorted_ids", np.int32)[:num]
        # within one expert the order of pairs is not part of the contract: compare sets
        for e in range(E):
            sl = np.repeat(ref_tiles[:num // tile_m] == e, tile_m)
            assert sorted(got[sl]) == sorted(ref_sorted[:num][sl]), (
                f"expert {e}: sorted_ids {sorted(got[sl])} != reference {sorted(ref_sorted[:num][sl])}")
    return drive("qg_moe_align", lambda: call(L.qg_moe_align, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(500), **FUZZ_SETTINGS)
@given(align_specs())
def test_fuzz_moe_align(spec):
    run_case("qg_moe_align", align_case, spec)


@st.composite
def align_sizes_specs(draw):
    s = draw(moe_base())
    s.update(ms="ok", mt="ok")
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "ms", "mt"]))
        if what == "routing":
            routing_mutation(draw, s)
        else:
            s[what] = "null"
    return s


def align_sizes_case(s):
    mem = Mem(rng_of(s))
    exp = Expect()
    routing_expect(exp, s)
    exp.bad(s["ms"] == "null", "max_sorted")
    exp.bad(s["mt"] == "null", "max_tiles")
    ms = mem.output("max_sorted", 8, s["ms"])
    mt = mem.output("max_tiles", 8, s["mt"])
    i64p = ctypes.POINTER(ctypes.c_int64)

    def verify():
        mem.check_untouched({"max_sorted": np.ones(8, bool), "max_tiles": np.ones(8, bool)})
        want = reference.moe_align_sizes(s["T"], s["top_k"], s["E"], s["tile_m"])
        got = (int(mem.payload("max_sorted", np.int64)[0]), int(mem.payload("max_tiles", np.int64)[0]))
        assert got == want, f"qg_moe_align_sizes gave {got}, reference {want}"
    return drive("qg_moe_align_sizes",
                 lambda: call(L.qg_moe_align_sizes, s["T"], s["top_k"], s["E"], s["tile_m"],
                              ctypes.cast(ms, i64p), ctypes.cast(mt, i64p)), exp, mem, verify)


@settings(max_examples=examples(250), **FUZZ_SETTINGS)
@given(align_sizes_specs())
def test_fuzz_moe_align_sizes(spec):
    run_case("qg_moe_align_sizes", align_sizes_case, spec)


def routing_tables(rng, s, aT, ak, aE, at):
    """Routing of random distinct experts per token by the reference align, padded to
    the qg_moe_align_sizes extents, with the corruption of s["corrupt"] applied."""
    ids = topk_ids_for(rng, aT, ak, aE)
    sorted_ids, tile_experts, num = reference.moe_align(ids, aE, at)
    sorted_ids, tile_experts = sorted_ids.copy(), tile_experts.copy()
    c = s["corrupt"]
    if c is not None:
        kind, value = c
        if kind == "num_sorted":
            num = {"neg": -at, "odd": num + 1 if num % at == 0 else num, "big": len(sorted_ids) + at,
                   "max": 2 ** 31 - 1}[value]
        elif kind == "sorted_ids" and num > 0:
            sorted_ids[rng.integers(num)] = {"neg": -1, "big": aT * ak + 1, "max": 2 ** 31 - 1}[value]
        elif kind == "tile_experts" and num > 0:
            tile_experts[rng.integers(num // at)] = {"neg": -2, "big": aE, "max": 2 ** 31 - 1}[value]
    return ids, sorted_ids, tile_experts, np.array([num], np.int32)


def routing_corrupt(draw, s):
    kind = draw(st.sampled_from(["num_sorted", "sorted_ids", "tile_experts"]))
    values = ["neg", "odd", "big", "max"] if kind == "num_sorted" else ["neg", "big", "max"]
    s["corrupt"] = (kind, draw(st.sampled_from(values)))


def routing_corrupt_expect(exp, s):
    if s["corrupt"] is not None:
        exp.bad(True, s["corrupt"][0])


def activation_ref(act, gate, up, alpha, limit):
    if act == 1:
        return reference.swiglu_oai(gate, up, alpha=alpha, limit=limit)
    return reference.silu_glu(gate, up)


def stage_mutation(draw, s, what, ld):
    """The mutations both stages share (`ld`: the stage's row stride field, "ldx" or "ldy");
    False for a `what` that is not one of them."""
    if what == "routing":
        routing_mutation(draw, s)
    elif what == "corrupt":
        routing_corrupt(draw, s)
    elif what in ("H", "I"):
        s[what] = draw(st.sampled_from([0, -32, 16, 40]))
    elif what == ld:
        s[ld] = draw(st.sampled_from([s["H"] - 1, 0, -1, -2 ** 63]))
    elif what == "ptr":
        ptr_mutation(draw, s, list(s["ptr"]))
    elif what == "args":
        args_mutation(draw, s)
    elif what == "huge":
        f = draw(st.sampled_from(["T", "H", "I", ld]))
        s[f] = draw(st.sampled_from(HUGE_TOKENS if f == "T" else HUGE))
        if f in ("H", "I"):
            s[f] -= s[f] % 32
        s["huge"].append({"T": "num_tokens", "H": "hidden", "I": "intermediate"}.get(f, f))
    else:
        return False
    return True


@st.composite
def stage1_specs(draw):
    s = draw(moe_base())
    x_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    s.update(H=32 * draw(st.integers(1, 3)), I=32 * draw(st.integers(1, 2)), x_dtype=x_dtype,
             bias_dtype=draw(st.sampled_from(FLOAT_DTYPES)), activation=draw(st.sampled_from([0, 1])),
             layout=draw(st.sampled_from([0, 1])),
             alpha=draw(st.sampled_from([1.702, 1.0, 0.25])), limit=draw(st.sampled_from([7.0, 1.5, 100.0])))
    s["ldx"] = s["H"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "sorted_ids", "tile_experts", "num_sorted", "w13_blocks",
                                  "w13_scales", "act")}
    s["ptr"]["w13_bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "corrupt", "H", "I", "x_dtype", "bias_dtype", "ldx",
                                     "activation", "layout", "swiglu", "ptr", "args", "huge"]))
        if stage_mutation(draw, s, what, "ldx"):
            continue
        if what == "x_dtype":
            s["x_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "bias_dtype":
            s["bias_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "activation":
            s["activation"] = draw(st.sampled_from([2, -1, 2 ** 31 - 1]))
        elif what == "layout":
            s["layout"] = draw(st.sampled_from([2, -1, 2 ** 31 - 1]))
        else:  # swiglu
            s["activation"] = 1
            s[draw(st.sampled_from(["alpha", "limit"]))] = draw(
                st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -7.0]))
    exp = stage1_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def stage1_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_stage1_args)
    routing_expect(exp, s)
    routing_corrupt_expect(exp, s)
    H, I = s["H"], s["I"]
    exp.bad(H <= 0, "hidden")
    exp.bad(I < 0, "intermediate")
    exp.open(I == 0, "intermediate")
    exp.bad(H % 32 != 0, "hidden")
    exp.open(I % 32 != 0, "intermediate")  # the header asks it of stage 2 only
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["ldx"] < H, "ldx")
    exp.bad(s["activation"] not in (0, 1), "activation")
    exp.bad(s["layout"] not in (0, 1), "gate_up_layout")
    if s["activation"] == 1:
        exp.open(not math.isfinite(s["alpha"]), "swiglu_alpha")
        exp.open(not (math.isfinite(s["limit"]) and s["limit"] > 0), "swiglu_limit")
    has_bias = s["ptr"]["w13_bias"] != "null"
    exp.bad(has_bias and s["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    for p in ("x", "sorted_ids", "tile_experts", "num_sorted", "act"):
        exp.bad(s["ptr"][p] in ("null", "mis"), p)
    exp.bad(s["ptr"]["w13_bias"] == "mis", "w13_bias")
    for p in ("w13_blocks", "w13_scales"):
        exp.bad(s["ptr"][p] == "null", p)
        exp.open(s["ptr"][p] == "mis", p)
    allow_empty(exp, s["T"] == 0, "num_tokens")
    return exp


def moe_dims(s, exp):
    """Sizes to build buffers with: the arguments themselves for calls the library may
    accept (an empty problem may come with E = 0 or a bad tile_m: those are clamped, as
    nothing is read then), small stand-ins otherwise."""
    sane = is_sane(exp, s, ("T", "top_k", "E", "H", "I"))
    T, top_k, E, tile_m, H, I = s["T"], s["top_k"], s["E"], s["tile_m"], s["H"], s["I"]
    tile_m = tile_m if tile_m in reference.TILE_M_VALUES else 16
    if sane:
        return T, max(top_k, 1), max(E, 1), tile_m, H, I
    return (small(T, 12), max(small(top_k, 6), 1), max(small(E, 6), 1), tile_m,
            max(small(H, 96), 32), max(small(I, 64), 1))


def stage1_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = stage1_expect(s)
    aT, ak, aE, at, aH, aI = moe_dims(s, exp)
    ldx = s["ldx"] if is_sane(exp, s, ("ldx",)) else small(s["ldx"], 128)
    ids, sorted_ids, tile_experts, num = routing_tables(rng, s, aT, ak, aE, at)
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    bdt = s["bias_dtype"] if s["bias_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, aT, aH, ldx, xdt)
    hb = -(-aH // 32)
    blocks, scales = mxfp4_weight(rng, aE * 2 * aI, hb * 32)
    bias = rng.standard_normal((aE, 2 * aI)).astype(NP_DTYPE[bdt])
    P = aT * ak
    ptr = s["ptr"]
    a = L.qg_moe_stage1_args(
        num_tokens=s["T"], top_k=s["top_k"], num_experts=s["E"], tile_m=s["tile_m"],
        hidden=s["H"], intermediate=s["I"], x_dtype=s["x_dtype"],
        x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
        sorted_ids=mem.input("sorted_ids", sorted_ids, ptr["sorted_ids"]),
        tile_experts=mem.input("tile_experts", tile_experts, ptr["tile_experts"]),
        num_sorted=mem.input("num_sorted", num, ptr["num_sorted"]),
        w13_blocks=mem.input("w13_blocks", blocks, ptr["w13_blocks"]),
        w13_scales=mem.input("w13_scales", scales, ptr["w13_scales"]),
        w13_bias=mem.input("w13_bias", bias, ptr["w13_bias"]), bias_dtype=s["bias_dtype"],
        activation=s["activation"], gate_up_layout=s["layout"],
        swiglu_alpha=s["alpha"], swiglu_limit=s["limit"])
    esize = DTYPE_BYTES[xdt]
    a.act = mem.output("act", P * aI * esize, ptr["act"])
    pa, ctx = args_and_ctx(mem, s, a)

    def verify():
        if s["T"] == 0:
            mem.check_untouched()
            return
        mem.check_untouched({"act": np.ones(P * aI * esize, bool)})
        w13 = mxfp4.dequantize(blocks, scales).reshape(aE, 2 * aI, aH)
        act = mem.payload("act", NP_DTYPE[xdt]).reshape(P, aI)
        ref, sens = np.zeros((P, aI)), np.zeros((P, aI))
        split = (lambda h: (h[:, 0::2], h[:, 1::2])) if s["layout"] == 1 else (lambda h: (h[:, :aI], h[:, aI:]))
        for e in range(aE):
            tok, slot = np.nonzero(ids == e)
            if tok.size == 0:
                continue
            b = None if ptr["w13_bias"] == "null" else bias[e]
            gate, up = split(reference.gemm(x_dense[tok], w13[e], b))
            gabs, uabs = split(reference.gemm(np.abs(x_dense[tok]), np.abs(w13[e]),
                                              None if b is None else np.abs(b.astype(np.float64))))
            ref[tok * ak + slot] = activation_ref(s["activation"], gate, up, s["alpha"], s["limit"])
            # how far an error in gate/up moves the activation: |d act / d up| <= |g| and
            # |d act / d gate| <= 1.1 (|u| + 1) for both SiLU-GLU and SwiGLU-OAI (|alpha| <= 1.702)
            sens[tok * ak + slot] = 1.1 * (np.abs(up) + 1) * gabs + np.abs(gate) * uabs
        # 4 roundings: expf and the division of the activation (a few fp32 ulps) + the store
        assert_close("act", act, ref, xdt, sens, aH, roundings=4)
    return drive("qg_moe_stage1", lambda: call(L.qg_moe_stage1, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(600), **FUZZ_SETTINGS)
@given(stage1_specs())
def test_fuzz_moe_stage1(spec):
    run_case("qg_moe_stage1", stage1_case, spec)


@st.composite
def stage2_specs(draw):
    s = draw(moe_base())
    s.update(H=32 * draw(st.integers(1, 3)), I=32 * draw(st.integers(1, 2)),
             act_dtype=draw(st.sampled_from(FLOAT_DTYPES)), y_dtype=draw(st.sampled_from(FLOAT_DTYPES)),
             bias_dtype=draw(st.sampled_from(FLOAT_DTYPES)))
    s["ldy"] = s["H"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("act", "sorted_ids", "tile_experts", "num_sorted", "w2_blocks",
                                  "w2_scales", "topk_weights", "y")}
    s["ptr"]["w2_bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "corrupt", "H", "I", "act_dtype", "y_dtype",
                                     "bias_dtype", "ldy", "ptr", "args", "huge"]))
        if stage_mutation(draw, s, what, "ldy"):
            continue
        s[what] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))  # act_dtype, y_dtype, bias_dtype
    exp = stage2_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(act_dtype=100))
    return s


def stage2_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_stage2_args)
    routing_expect(exp, s)
    routing_corrupt_expect(exp, s)
    H, I = s["H"], s["I"]
    exp.bad(H < 0, "hidden")
    exp.open(H == 0, "hidden")
    exp.bad(I <= 0, "intermediate")
    exp.open(H % 32 != 0, "hidden")  # the header asks it of stage 1 only
    exp.bad(I % 32 != 0, "intermediate")
    for f in ("act_dtype", "y_dtype"):
        exp.bad(s[f] not in FLOAT_DTYPES, f)
    has_bias = s["ptr"]["w2_bias"] != "null"
    exp.bad(has_bias and s["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    exp.bad(s["ldy"] < H, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    for p in ("act", "sorted_ids", "tile_experts", "num_sorted", "topk_weights", "y"):
        exp.bad(s["ptr"][p] in ("null", "mis"), p)
    exp.bad(s["ptr"]["w2_bias"] == "mis", "w2_bias")
    for p in ("w2_blocks", "w2_scales"):
        exp.bad(s["ptr"][p] == "null", p)
        exp.open(s["ptr"][p] == "mis", p)
    allow_empty(exp, s["T"] == 0, "num_tokens")
    return exp


def stage2_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = stage2_expect(s)
    aT, ak, aE, at, aH, aI = moe_dims(s, exp)
    aI = -(-aI // 32) * 32
    ldy = s["ldy"] if is_sane(exp, s, ("ldy",)) else small(s["ldy"], 128)
    ids, sorted_ids, tile_experts, num = routing_tables(rng, s, aT, ak, aE, at)
    adt = s["act_dtype"] if s["act_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    bdt = s["bias_dtype"] if s["bias_dtype"] in FLOAT_DTYPES else F32
    P = aT * ak
    act = rng.standard_normal((P, aI)).astype(NP_DTYPE[adt])
    blocks, scales = mxfp4_weight(rng, aE * aH, aI)
    bias = rng.standard_normal((aE, aH)).astype(NP_DTYPE[bdt])
    weights = rng.uniform(0.0, 1.0, size=(aT, ak)).astype(np.float32)
    ptr = s["ptr"]
    a = L.qg_moe_stage2_args(
        num_tokens=s["T"], top_k=s["top_k"], num_experts=s["E"], tile_m=s["tile_m"],
        hidden=s["H"], intermediate=s["I"], act_dtype=s["act_dtype"],
        act=mem.input("act", act, ptr["act"]),
        sorted_ids=mem.input("sorted_ids", sorted_ids, ptr["sorted_ids"]),
        tile_experts=mem.input("tile_experts", tile_experts, ptr["tile_experts"]),
        num_sorted=mem.input("num_sorted", num, ptr["num_sorted"]),
        w2_blocks=mem.input("w2_blocks", blocks, ptr["w2_blocks"]),
        w2_scales=mem.input("w2_scales", scales, ptr["w2_scales"]),
        w2_bias=mem.input("w2_bias", bias, ptr["w2_bias"]), bias_dtype=s["bias_dtype"],
        topk_weights=mem.input("topk_weights", weights, ptr["topk_weights"]),
        y_dtype=s["y_dtype"], ldy=s["ldy"])
    y_elems = output_matrix(mem, a, aT, aH, ldy, ydt, ptr["y"])
    pa, ctx = args_and_ctx(mem, s, a)

    def verify():
        T, H = s["T"], s["H"]
        y = accepted_output(mem, T, H, ldy, y_elems, ydt)
        if y is None:
            return
        w2 = mxfp4.dequantize(blocks, scales).reshape(aE, aH, aI)
        ref, abs_ref = np.zeros((T, H)), np.zeros((T, H))
        a64 = act.astype(np.float64)
        for t in range(T):
            for j in range(ak):
                e = ids[t, j]
                w_e = w2[e].astype(np.float64)
                out = a64[t * ak + j] @ w_e.T
                mag = np.abs(a64[t * ak + j]) @ np.abs(w_e).T
                if ptr["w2_bias"] != "null":
                    out = out + bias[e].astype(np.float64)
                    mag = mag + np.abs(bias[e].astype(np.float64))
                ref[t] += float(weights[t, j]) * out
                abs_ref[t] += abs(float(weights[t, j])) * mag
        assert_close("y", y, ref, ydt, abs_ref, aI + ak)
    return drive("qg_moe_stage2", lambda: call(L.qg_moe_stage2, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(600), **FUZZ_SETTINGS)
@given(stage2_specs())
def test_fuzz_moe_stage2(spec):
    run_case("qg_moe_stage2", stage2_case, spec)


# ================================================================ known bugs, pinned

@pytest.mark.parametrize("fn_name", ['qg_moe_align', 'qg_moe_stage1', 'qg_moe_stage2'])
def test_misaligned_args_struct_is_refused(fn_name):
    check_misaligned_args_refused(fn_name, getattr(L, fn_name + "_args"))
