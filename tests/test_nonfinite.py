"""Non-finite input propagates the way the float reference does; it never hangs or reads out of bounds.

The contract (docs/guarantees.md): every output element falls in the same class as the
float64 reference computed from the same inputs -- NaN, +inf, -inf or finite -- and the
finite ones meet the usual error bound. That is IEEE arithmetic on the dequantized
weights: a NaN activation makes its whole output row NaN (NaN * 0 is NaN), an infinite
activation gives +-inf where the weight is non-zero and NaN where it is zero or where
+inf and -inf meet, a non-finite scale poisons the columns of its block or group, and
the GPT-OSS SwiGLU clamp turns an infinite gate or up back into a finite value, as the
reference does. The sign and payload of a NaN are not part of the contract.

Non-finite values are also planted where the library must NOT look -- the ld padding of
x, the padding bytes after each GGUF row -- and the outputs must stay finite: a read out
of bounds would show up as NaN. Each call runs in a forked child with a time limit, so
a hang fails the test instead of blocking it. GPU variants are marked `gpu`.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from isolation import run_isolated
from conftest import FP32_EXACT, format_entry, log_margin, registry_formats
from raw_gpu import RawGpu
from pyquant import _lib as L
from pyquant.formats import FORMATS, int4, mxfp4, reference

pytestmark = pytest.mark.skipif(not L.library_loaded(), reason="libquantgemm is not loaded")

F32, F16, BF16 = 0, 1, 2
NP = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), BF16: np.dtype(ml_dtypes.bfloat16)}
DT_IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
NONFINITE = (np.nan, np.inf, -np.inf)

# Bounds on the finite elements, ||y - y_ref|| / ||y_ref|| over the positions where the
# reference is finite: fp32 accumulation (K <= 512: about sqrt(K) * 2^-24 < 2e-6) plus
# one rounding to the output dtype (2^-11 fp16, 2^-8 bf16), each about twice the worst.
REL_BOUND = {F32: 2e-5, F16: 1e-3, BF16: 8e-3}

GGUF = sorted(registry_formats("gguf"))  # sorted: the activation dtype of test_gguf_cpu cycles over it
# Byte offset of the fp16 super-block scale d inside each GGUF block (ggml-common.h), read
# through format_entry: a GGUF format without its offset fails naming it.
GGUF_D_OFFSET = {"q8_0": 0, "q4_0": 0, "q4_K": 0, "q6_K": 208, "iq4_xs": 0, "iq3_xxs": 0}




def cpu_ctx():
    ctx = L.qg_context_p()
    L.qg_context_create(L.Backend.QG_BACKEND_CPU, 0, ctypes.byref(ctx))
    # these bounds are the fp32-exact path's; tests/test_cpu_int8*.py hold the int8 path
    L.qg_context_set_option(ctx, b"cpu_precision", FP32_EXACT)
    return ctx


def classes(a):
    """0 NaN, 1 +inf, 2 -inf, 3 finite."""
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isnan(a), 0, np.where(a == np.inf, 1, np.where(a == -np.inf, 2, 3)))


CLASS_NAME = {0: "NaN", 1: "+inf", 2: "-inf", 3: "finite"}


def assert_like_reference(name, got, ref, ydt, expect_nonfinite=True, exact_class=True):
    """exact_class=False: only finite vs non-finite must match (see test_gpu)."""
    got = np.asarray(got).astype(np.float64)
    cg, cr = classes(got), classes(ref)
    if not exact_class:
        cg, cr = np.minimum(cg, 3) // 3 * 3, np.minimum(cr, 3) // 3 * 3  # 0 non-finite, 3 finite
    bad = np.argwhere(cg != cr)
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(
            f"{name}: at {i} the library gives {CLASS_NAME[int(cg[i])]} ({got[i]!r}) where the float "
            f"reference gives {CLASS_NAME[int(cr[i])]} ({ref[i]!r}); {len(bad)} of {got.size} elements differ "
            f"in class (reference: {int((cr == 0).sum())} NaN, {int((cr == 1).sum())} +inf, "
            f"{int((cr == 2).sum())} -inf)")
    if expect_nonfinite:
        assert (cr != 3).any(), f"{name}: the test planted nothing that reaches the output"
    fin = cr == 3
    if fin.any():
        norm = np.linalg.norm(ref[fin])
        if norm > 0:
            err = np.linalg.norm(got[fin] - ref[fin]) / norm
            assert err <= REL_BOUND[ydt], f"{name}: finite elements: normalised error {err:.3e}"
            log_margin(name, err, REL_BOUND[ydt])


def plant(rng, a, count, values=NONFINITE):
    """Sets `count` random elements of a (any float dtype, in place) to values drawn
    from `values`; returns the flat positions."""
    pos = rng.choice(a.size, size=min(count, a.size), replace=False)
    a[np.unravel_index(pos, a.shape)] = np.array(rng.choice(np.array(values), size=pos.size)).astype(a.dtype)
    return pos


def padded(rng, rows, cols, pad, dt):
    """[rows, cols + pad] in dtype dt, N(0,1) values, NaN in the padding columns."""
    full = rng.standard_normal((rows, cols + pad)).astype(NP[dt])
    full[:, cols:] = np.nan
    return full


# ================================================================ CPU tier

WHERE = ["x", "weights", "x+weights", "padding-only", "all-x"]


def biased(rng, n, where, bias):
    """(scalars, arrays, reference bias) of a GEMM's optional bias [N]: fp32, with two
    non-finite values where the weights get theirs; none when bias is False."""
    if not bias:
        return {}, {}, None
    b = rng.standard_normal(n).astype(np.float32)
    if where in ("weights", "x+weights"):
        plant(rng, b, 2)
    return {"bias_dtype": F32}, {"bias": b}, b


def w4a16_run(rng, where, xdt, ydt, gemm, bias=True):
    m, n, k, G, pad = 5, 48, 256, 64, 8
    W = rng.standard_normal((n, k)).astype(np.float32)
    qw, sc, qz = int4.quantize(W, group_size=G, scale_dtype="bf16" if xdt == BF16 else "fp16")
    x = padded(rng, m, k, pad, xdt)
    if where in ("x", "x+weights"):
        plant(rng, x[:, :k], 3)
    if where in ("weights", "x+weights"):
        plant(rng, sc, 2)
    bs, ba, b = biased(rng, n, where, bias)
    if where == "all-x":
        x[:, :k] = np.array(rng.choice(np.array(NONFINITE), size=(m, k))).astype(x.dtype)
    y = gemm("w4a16", dict(m=m, n=n, k=k, group_size=G, x_dtype=xdt, y_dtype=ydt,
                           scale_dtype=BF16 if xdt == BF16 else F16, zero_dtype=5, **bs),
             dict(x=x, qweight=qw, scales=sc, qzeros=qz, **ba), ldx=k + pad, out=(m, n, ydt))
    return y, reference.gemm(x[:, :k], int4.dequantize(qw, sc, qz, G), b)


def gguf_run(rng, where, xdt, ydt, gemm, fmt, bias=True):
    spec = FORMATS[fmt]
    m, n, pad = 4, 40, 8
    k = spec.block_elems * (2 if spec.block_elems == 256 else 8)
    raw = spec.module.random_blocks(rng, n, k, d_range=(1e-3, 1e-2))
    row = raw.shape[1]
    ldw = row + 6
    w = np.full((n, ldw), 0xFF, np.uint8)  # padding bytes 0xFF: fp16 NaN wherever read
    w[:, :row] = raw
    if where in ("weights", "x+weights"):
        at = format_entry(GGUF_D_OFFSET, "GGUF_D_OFFSET of tests/test_nonfinite.py", fmt)
        for _ in range(2):
            r, b = rng.integers(n), rng.integers(row // spec.block_bytes)
            d = np.array([rng.choice(np.array(NONFINITE))], np.float16).view(np.uint8)
            w[r, b * spec.block_bytes + at:b * spec.block_bytes + at + 2] = d
    x = padded(rng, m, k, pad, xdt)
    if where in ("x", "x+weights"):
        plant(rng, x[:, :k], 3)
    if where == "all-x":
        x[:, :k] = np.array(rng.choice(np.array(NONFINITE), size=(m, k))).astype(x.dtype)
    bs, ba, b = biased(rng, n, where, bias)
    y = gemm("gguf", dict(format=spec.qg_format, m=m, n=n, k=k, x_dtype=xdt, y_dtype=ydt, ldw=ldw, **bs),
             dict(x=x, w=w, **ba), ldx=k + pad, out=(m, n, ydt))
    return y, reference.gemm(x[:, :k], spec.module.dequantize(np.ascontiguousarray(w[:, :row])), b)


def mxfp4_run(rng, where, xdt, ydt, gemm):
    m, n, k, pad = 5, 40, 256, 8
    blocks = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 129, (n, k // 32), dtype=np.uint8)
    bias = rng.standard_normal(n).astype(np.float32)
    if where in ("weights", "x+weights"):
        scales.reshape(-1)[rng.choice(scales.size, 2, replace=False)] = 255  # E8M0 NaN
        plant(rng, bias, 2)
    x = padded(rng, m, k, pad, xdt)
    if where in ("x", "x+weights"):
        plant(rng, x[:, :k], 3)
    if where == "all-x":
        x[:, :k] = np.array(rng.choice(np.array(NONFINITE), size=(m, k))).astype(x.dtype)
    y = gemm("mxfp4", dict(m=m, n=n, k=k, x_dtype=xdt, y_dtype=ydt, bias_dtype=F32),
             dict(x=x, blocks=blocks, scales=scales, bias=bias), ldx=k + pad, out=(m, n, ydt))
    return y, reference.gemm(x[:, :k], mxfp4.dequantize(blocks, scales), bias)


STRUCTS = {"w4a16": (L.qg_w4a16_gemm_args, "qg_w4a16_gemm"), "gguf": (L.qg_gguf_gemm_args, "qg_gguf_gemm"),
           "mxfp4": (L.qg_mxfp4_gemm_args, "qg_mxfp4_gemm")}


def cpu_gemm(kind, scalars, arrays, ldx, out):
    """Host call with y between NaN-free guard rows and columns (0x7B bytes)."""
    struct, fn = STRUCTS[kind]
    m, n, ydt = out
    guard = 3
    ybuf = np.full(((m + 2 * guard) * (n + 2 * guard)) * NP[ydt].itemsize, 0x7B, np.uint8)
    before = ybuf.copy()
    ld = n + 2 * guard
    start = (guard * ld + guard) * NP[ydt].itemsize
    a = struct(**scalars, ldx=ldx, ldy=ld, y=ybuf.ctypes.data + start,
               **{k: v.ctypes.data for k, v in arrays.items()})
    keep = {k: v.copy() for k, v in arrays.items()}
    getattr(L, fn)(cpu_ctx(), ctypes.byref(a), None)
    for k, v in arrays.items():
        assert np.array_equal(v.view(np.uint8), keep[k].view(np.uint8)), f"input {k} was modified"
    grid = ybuf.view(NP[ydt]).reshape(m + 2 * guard, ld)
    mask = np.ones(grid.shape, bool)
    mask[guard:guard + m, guard:guard + n] = False
    changed = (ybuf != before).reshape(m + 2 * guard, ld, NP[ydt].itemsize).any(-1) & mask
    assert not changed.any(), f"guard band written at {np.argwhere(changed)[0]}"
    return grid[guard:guard + m, guard:guard + n].copy()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("xdt,ydt", [(F16, F16), (BF16, BF16), (BF16, F32)], ids=["f16", "bf16", "bf16-f32"])
def test_w4a16_cpu(rng, where, xdt, ydt):
    def child():
        y, ref = w4a16_run(rng, where, xdt, ydt, cpu_gemm)
        assert_like_reference(f"w4a16 {where}", y, ref, ydt, expect_nonfinite=where != "padding-only")
        return "ok"
    run_isolated(child)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("fmt", GGUF)
def test_gguf_cpu(rng, where, fmt):
    xdt = [F32, F16, BF16][GGUF.index(fmt) % 3]

    def child():
        y, ref = gguf_run(rng, where, xdt, F32, cpu_gemm, fmt)
        assert_like_reference(f"{fmt} {where}", y, ref, F32, expect_nonfinite=where != "padding-only")
        return "ok"
    run_isolated(child)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("xdt,ydt", [(F32, F32), (F16, F16), (BF16, BF16)], ids=["f32", "f16", "bf16"])
def test_mxfp4_cpu(rng, where, xdt, ydt):
    def child():
        y, ref = mxfp4_run(rng, where, xdt, ydt, cpu_gemm)
        assert_like_reference(f"mxfp4 {where}", y, ref, ydt, expect_nonfinite=where != "padding-only")
        return "ok"
    run_isolated(child)


# ---------------------------------------------------------------- MoE

def moe_case(rng, where, activation, xdt):
    T, E, top_k, H, I, tile_m = 6, 4, 2, 64, 32, 16
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(T)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (T, top_k)).astype(np.float32)
    x = padded(rng, T, H, 8, xdt)
    b13 = rng.integers(0, 256, (E, 2 * I, H // 32, 16), dtype=np.uint8)
    s13 = rng.integers(120, 129, (E, 2 * I, H // 32), dtype=np.uint8)
    b2 = rng.integers(0, 256, (E, H, I // 32, 16), dtype=np.uint8)
    s2 = rng.integers(120, 129, (E, H, I // 32), dtype=np.uint8)
    bias13 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    bias2 = rng.standard_normal((E, H)).astype(np.float32)
    if where == "x":
        plant(rng, x[:, :H], 2)
    elif where == "gate-up-bias":
        plant(rng, bias13, 3)  # +-inf gate/up is clamped by SwiGLU-OAI, not by SiLU-GLU
        # Smaller w13 scales (2^-7 .. 2^-3: |gate| stays under ~40): an infinite up times the silu
        # of a very negative finite gate is -inf in the float64 reference, but float32's
        # g / (1 + exp(-g)) is -0 below g = -88.7 (exp overflows), and no float32 form is
        # nonzero below ~-104 (exp(g) underflows), so 0 * inf = NaN: one seed of a 12-seed margins
        # sweep drew a gate of -89 at the other cases' scales, 2^-7 .. 2^1 (2026-12-04).
        s13 = rng.integers(120, 125, (E, 2 * I, H // 32), dtype=np.uint8)
    elif where == "scales":
        # in experts some token is routed to (an unused expert's NaN reaches nothing)
        s13[ids[rng.integers(T), 0], rng.integers(2 * I), rng.integers(H // 32)] = 255
        s2[ids[rng.integers(T), 1], rng.integers(H), rng.integers(I // 32)] = 255
    elif where == "topk_weights":
        plant(rng, wts, 2)
    elif where == "down-bias":
        for _ in range(2):
            bias2[ids[rng.integers(T), rng.integers(top_k)], rng.integers(H)] = rng.choice(np.array(NONFINITE))
    return dict(T=T, E=E, top_k=top_k, H=H, I=I, tile_m=tile_m, ids=ids, wts=wts, x=x, b13=b13, s13=s13,
                b2=b2, s2=s2, bias13=bias13, bias2=bias2, activation=activation, xdt=xdt)


def moe_cpu(c):
    ctx = cpu_ctx()
    ms, mt = ctypes.c_int64(), ctypes.c_int64()
    L.qg_moe_align_sizes(c["T"], c["top_k"], c["E"], c["tile_m"], ctypes.byref(ms), ctypes.byref(mt))
    sorted_ids, tiles, num = np.empty(ms.value, np.int32), np.empty(mt.value, np.int32), np.empty(1, np.int32)
    route = dict(num_tokens=c["T"], top_k=c["top_k"], num_experts=c["E"], tile_m=c["tile_m"])
    a = L.qg_moe_align_args(topk_ids=c["ids"].ctypes.data, sorted_ids=sorted_ids.ctypes.data,
                            tile_experts=tiles.ctypes.data, num_sorted=num.ctypes.data, **route)
    L.qg_moe_align(ctx, ctypes.byref(a), None)
    tables = dict(sorted_ids=sorted_ids.ctypes.data, tile_experts=tiles.ctypes.data, num_sorted=num.ctypes.data,
                  hidden=c["H"], intermediate=c["I"], **route)
    act = np.zeros((c["T"] * c["top_k"], c["I"]), NP[c["xdt"]])
    a1 = L.qg_moe_stage1_args(x_dtype=c["xdt"], x=c["x"].ctypes.data, ldx=c["x"].shape[1],
                              w13_blocks=c["b13"].ctypes.data, w13_scales=c["s13"].ctypes.data,
                              w13_bias=c["bias13"].ctypes.data, bias_dtype=F32, activation=c["activation"],
                              gate_up_layout=1, swiglu_alpha=1.702, swiglu_limit=7.0, act=act.ctypes.data, **tables)
    L.qg_moe_stage1(ctx, ctypes.byref(a1), None)
    y = np.zeros((c["T"], c["H"]), np.float32)
    a2 = L.qg_moe_stage2_args(act_dtype=c["xdt"], act=act.ctypes.data, w2_blocks=c["b2"].ctypes.data,
                              w2_scales=c["s2"].ctypes.data, w2_bias=c["bias2"].ctypes.data, bias_dtype=F32,
                              topk_weights=c["wts"].ctypes.data, y_dtype=F32, y=y.ctypes.data, ldy=c["H"], **tables)
    L.qg_moe_stage2(ctx, ctypes.byref(a2), None)
    return y


def moe_reference(c):
    return reference.moe(c["x"][:, :c["H"]], c["ids"], c["wts"], mxfp4.dequantize(c["b13"], c["s13"]),
                         mxfp4.dequantize(c["b2"], c["s2"]), c["bias13"], c["bias2"],
                         activation="swiglu_oai" if c["activation"] == 1 else "silu_glu",
                         gate_up_layout="interleaved", act_dtype=NP[c["xdt"]])


@pytest.mark.parametrize("where", ["x", "gate-up-bias", "scales", "topk_weights", "down-bias", "padding-only"])
@pytest.mark.parametrize("activation", [1, 0], ids=["swiglu_oai", "silu_glu"])
@pytest.mark.parametrize("xdt", [F32, BF16], ids=["f32", "bf16"])
def test_moe_cpu(rng, where, activation, xdt):
    def child():
        c = moe_case(rng, where, activation, xdt)
        y = moe_cpu(c)
        ref = moe_reference(c)
        # an infinite gate/up bias can be clamped away entirely by SwiGLU-OAI
        nonfinite_expected = where not in ("padding-only", "gate-up-bias")
        assert_like_reference(f"moe {where}", y, ref, xdt, expect_nonfinite=nonfinite_expected)
        return "ok"
    run_isolated(child)


@pytest.mark.parametrize("case", ["clamped", "negative-gate"])
def test_swiglu_clamps_infinite_gate_and_up_like_the_reference(rng, case):
    """The SwiGLU-OAI clamp in isolation, driving gate/up to +-inf through the w13 bias
    (interleaved rows: 2i is gate i, 2i+1 is up i). "clamped": a +inf gate becomes
    `limit` and a -inf up becomes -limit, so every output stays finite, as in the
    reference. "negative-gate": -inf * sigmoid(-inf) is NaN, in the reference too."""
    def child():
        c = moe_case(rng, "none", 1, F32)
        if case == "clamped":
            c["bias13"][:, 0] = np.inf    # gate 0
            c["bias13"][:, 3] = -np.inf   # up 1
            c["bias13"][:, 5] = np.inf    # up 2
        else:
            c["bias13"][:, 4] = -np.inf   # gate 2
        y = moe_cpu(c)
        ref = moe_reference(c)
        assert_like_reference(f"swiglu {case}", y, ref, F32, expect_nonfinite=case != "clamped")
        return "ok"
    run_isolated(child)


# ================================================================ GPU

@pytest.fixture
def gpu():
    g = RawGpu()
    yield g
    g.close()


def gpu_gemm_with(gpu):
    def gemm(kind, scalars, arrays, ldx, out):
        struct, fn = STRUCTS[kind]
        m, n, ydt = out
        guard = 3
        ld = n + 2 * guard
        nbytes = (m + 2 * guard) * ld * NP[ydt].itemsize
        ybuf = gpu.alloc(nbytes, fill=0x7B)
        start = (guard * ld + guard) * NP[ydt].itemsize
        a = struct(**scalars, ldx=ldx, ldy=ld, y=ybuf + start, **{k: gpu.upload(v) for k, v in arrays.items()})
        size = ctypes.c_size_t(0)
        getattr(L, fn + "_workspace_size")(gpu.ctx, ctypes.byref(a), ctypes.byref(size))
        if size.value:
            a.workspace, a.workspace_bytes = gpu.alloc(size.value, fill=0), size.value
        try:
            getattr(L, fn)(gpu.ctx, ctypes.byref(a), None)
        except L.QuantGemmError as e:
            if e.status == L.Status.QG_ERR_UNSUPPORTED:
                pytest.skip(str(e))
            raise
        raw = gpu.download(ybuf, (nbytes,), np.uint8)
        grid = raw.view(NP[ydt]).reshape(m + 2 * guard, ld)
        mask = np.ones(grid.shape, bool)
        mask[guard:guard + m, guard:guard + n] = False
        changed = (raw != 0x7B).reshape(m + 2 * guard, ld, NP[ydt].itemsize).any(-1) & mask
        assert not changed.any(), f"guard band written at {np.argwhere(changed)[0]}"
        return grid[guard:guard + m, guard:guard + n].copy()
    return gemm


@pytest.mark.gpu
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("family", ["w4a16", "mxfp4"] + GGUF)
def test_gpu(gpu, rng, where, family):
    """Non-finite activations: the exact class, as on the CPU tier. Non-finite scales:
    only "non-finite where the reference is non-finite, finite elsewhere": GPU kernels
    apply a group's (block's) scale to the group's partial dot product, so an infinite
    scale gives +-inf where the reference, which scales each weight first, has
    (q - z) * inf = NaN for q = z (docs/guarantees.md)."""
    gemm = gpu_gemm_with(gpu)
    if family == "w4a16":
        y, ref = w4a16_run(rng, where, F16, F16, gemm)
        ydt = F16
    elif family == "mxfp4":
        y, ref = mxfp4_run(rng, where, F16, F16, gemm)
        ydt = F16
    else:
        y, ref = gguf_run(rng, where, F16, F32, gemm, family)
        ydt = F32
    # GGUF on the GPU: the int8 tier (auto) turns a slice of x holding NaN or inf into
    # dx = NaN, and the float tier factors q4_K's min out of the block sum, so NaN may
    # stand where the reference has +-inf: only "non-finite exactly where the reference is".
    exact = where not in ("weights", "x+weights") and family not in GGUF
    assert_like_reference(f"GPU {family} {where}", y, ref, ydt, expect_nonfinite=where != "padding-only",
                          exact_class=exact)
