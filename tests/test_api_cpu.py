"""CPU tier through the Python API, against the float64 reference (pyquant.formats.reference).

Every family and format; edge shapes (M in 1, 2, 3, 5, 8, 16, 17, 33, 300; N = 8, one
packed word; odd N for GGUF and MXFP4; K = one group / one block); outputs poisoned with
NaN and surrounded by guard bands (ldy > n, extra rows) checked after every call; a
one-hot activation test that makes gemm return the decoded weights bit for bit; MoE
against reference.moe. Fresh random inputs each run (seed printed on failure).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import FP32_EXACT, cancelling_gemm_bound, registry_formats
from pyquant import formats as F
from pyquant.formats import int4 as int4_ref
from pyquant.formats import mxfp4 as mxfp4_ref
from pyquant.formats import reference

# Every bound here is the fp32-exact path's (x and the decoded weight exact in fp32); the
# int8 path, the default, is held to its own numpy model in tests/test_cpu_int8*.py.
pytestmark = pytest.mark.usefixtures("fp32_exact")

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
DTYPES = {"fp16": F16, "bf16": BF16, "fp32": F32}

EDGE_MS = (1, 2, 3, 5, 8, 16, 17, 33, 300)
GGUF_FORMATS = registry_formats("gguf")

# ---------------------------------------------------------------- tolerances
U32 = 2.0 ** -24
# Unit roundoff of each output dtype (half an ulp at 1): fp32 24 significant bits, fp16 11,
# bf16 8.
UNIT_ROUNDOFF = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}


def gemm_bound(k: int, y_dtype) -> float:
    """Bound on ||y - y_ref|| / ||y_ref|| for the CPU tier (x and the decoded weight are exact
    in fp32; products and sums are fp32). Rounding y to its dtype costs at most one unit
    roundoff per element, hence <= u_y normwise; fp32 accumulation of k products is a random
    walk of k roundings of size u32 * |x w| (~ sqrt(k) u32 sum|x w|, and sum|x w| ~ sqrt(k)|y|
    for these random inputs), about k * u32 normwise; x4 margin."""
    return UNIT_ROUNDOFF[np.dtype(y_dtype)] + 4 * k * U32


def moe_bound(hidden: int, inter: int, act_dtype, y_dtype) -> float:
    """MoE: stage 1 and stage 2 accumulate over hidden and inter (k * u32 each, as gemm_bound);
    the stage-1 activation is rounded to act_dtype by both the library and the reference
    (reference.moe act_dtype), so they differ only where the fp32 and float64 values round
    to neighbouring act_dtype values: at most u_act on those elements; plus y's rounding."""
    return (UNIT_ROUNDOFF[np.dtype(y_dtype)] + UNIT_ROUNDOFF[np.dtype(act_dtype)]
            + 4 * (hidden + inter) * U32)


# ---------------------------------------------------------------- random operands

def random_x(rng, m, k, dtype):
    """Activations: standard normal, never zero (a zero would hide a dropped term)."""
    x = rng.standard_normal((m, k))
    x = np.where(np.abs(x) < 1e-3, 0.5, x)
    return x.astype(np.float32).astype(dtype)


def random_int4(rng, n, k, group_size, symmetric, scale_dtype) -> pyquant.Int4Weight:
    """Canonical int4 arrays with every bit random: all 16 nibble values, all zero-points."""
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = (rng.uniform(0.5, 2.0, size=(n, k // group_size)) * 2.0 ** -4).astype(np.float32)
    scales = scales.astype(scale_dtype)
    qzeros = None if symmetric else rng.integers(0, 2 ** 32, size=(n // 8, k // group_size),
                                                 dtype=np.uint32).view(np.int32)
    return pyquant.Int4Weight(qweight, scales, qzeros, group_size)


def random_gguf(rng, fmt, n, k, d_range=(2.0 ** -8, 2.0 ** -4)) -> pyquant.GGUFWeight:
    """Random valid GGUF blocks (every quant bit random); scales in d_range keep y finite
    in fp16 (d_range=None: every finite fp16 scale, for the fp32-output one-hot test)."""
    raw = F.get(fmt).module.random_blocks(rng, n, k, d_range=d_range)
    return pyquant.from_gguf(fmt, raw, shape=(n, k))


def random_mxfp4(rng, lead, k, e_range=(127 - 6, 127 + 1), bias_dtype=None) -> pyquant.MXFP4Weight:
    """Every E2M1 code (random bytes); E8M0 scales in e_range (inclusive)."""
    blocks = rng.integers(0, 256, size=(*lead, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(e_range[0], e_range[1] + 1, size=(*lead, k // 32), dtype=np.uint8)
    bias = None
    if bias_dtype is not None:
        bias = rng.standard_normal(lead).astype(np.float32).astype(bias_dtype)
    return pyquant.from_mxfp4(blocks, scales, bias)


def _bias_of(w):
    return None if getattr(w, "bias", None) is None else np.asarray(w.bias).astype(np.float64)


def check_gemm(x, w, y_dtype, name, poisoned_output, assert_close):
    """gemm into a poisoned, guarded output; compares with reference.gemm; returns y."""
    m, n = x.shape[0], w.shape[0]
    g = poisoned_output(m, n, y_dtype)
    ret = pyquant.gemm(x, w, out=g.y)
    assert ret is g.y
    y = g.value()
    w_deq = w.dequantize()
    ref = reference.gemm(x, w_deq, _bias_of(w))
    assert_close(y, ref, cancelling_gemm_bound(x, w_deq, ref, y_dtype), name)
    return y


# ---------------------------------------------------------------- W4A16

@pytest.mark.parametrize("group_size", int4_ref.GROUP_SIZES)
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("x_name", ["fp16", "bf16"])
@pytest.mark.parametrize("scale_name", ["fp16", "bf16"])
def test_w4a16_edges(rng, group_size, symmetric, x_name, scale_name, poisoned_output, assert_close):
    x_dt = DTYPES[x_name]
    for n, k in ((8, group_size), (24, 3 * group_size)):
        w = random_int4(rng, n, k, group_size, symmetric, DTYPES[scale_name])
        for i, m in enumerate(EDGE_MS):
            y_dt = (x_dt, F32)[i % 2]  # both output dtypes over the M sweep
            x = random_x(rng, m, k, x_dt)
            check_gemm(x, w, y_dt, f"w4a16 g{group_size} {'sym' if symmetric else 'asym'} "
                       f"x={x_name} s={scale_name} y={y_dt} m={m} n={n} k={k}",
                       poisoned_output, assert_close)


def test_w4a16_default_output_dtype_and_layout(rng, assert_close):
    """y defaults to x's dtype; a strided x (ldx > k) is read through its row stride."""
    w = random_int4(rng, 16, 256, 64, False, BF16)
    big = random_x(rng, 7, 300, BF16)
    x = big[:, :256]
    y = pyquant.gemm(x, w)
    assert y.dtype == BF16 and y.shape == (7, 16)
    assert_close(y, reference.gemm(x, w.dequantize()), gemm_bound(256, BF16), "strided x")


def test_w4a16_quantize_roundtrip(rng, assert_close):
    """pyquant.quantize(W, "int4") -> gemm close to x @ W^T, elementwise and rigorously.
    quantize() guarantees |w - w_q| <= s/2 for every element (its docstring: the scale is
    rounded up and 0 lies in the group's range), so |x (W_q - W)^T| <= |x| @ (S/2)^T with S
    each element's group scale. The kernel's own error against x @ W_q^T is fp32
    accumulation of k products, at most (k + 1) * u32 * |x| @ |W_q|^T (the standard
    gamma_k bound, y rounded once to fp32). The sum of the two bounds every element."""
    W = rng.standard_normal((32, 256)).astype(np.float32)
    w = pyquant.quantize(W, "int4", group_size=32, symmetric=False, scale_dtype="fp16")
    assert isinstance(w, pyquant.Int4Weight) and w.shape == (32, 256)
    x = random_x(rng, 4, 256, F16)
    y = pyquant.gemm(x, w, out_dtype=np.float32)
    wq = np.asarray(w.dequantize(), np.float64)
    assert_close(y, reference.gemm(x, wq), gemm_bound(256, F32), "int4 vs its decode")
    s = np.repeat(np.asarray(w.scales, np.float64), 32, axis=1)
    assert np.all(np.abs(wq - W) <= s / 2), "quantize broke |w - w_q| <= s/2"
    ax = np.abs(np.asarray(x, np.float64))
    bound = ax @ (s / 2).T + (256 + 1) * U32 * (ax @ np.abs(wq).T)
    err = np.abs(np.asarray(y, np.float64) - np.asarray(x, np.float64) @ W.astype(np.float64).T)
    i = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"int4 vs the unquantized W: error {err[i]:.3e} > bound {bound[i]:.3e} at {i}"


@pytest.mark.parametrize("importer", ["awq", "gptq", "compressed_tensors"])
def test_int4_importers_give_the_same_gemm(rng, importer, assert_bitwise_equal):
    """A checkpoint layout imported with Int4Weight.from_* computes bit-identical results to
    the canonical weight it was exported from (the importers are exact repacks)."""
    w = random_int4(rng, 16, 128, 32, False, F16)
    if importer == "gptq":  # GPTQ v1 stores zero - 1 in 4 bits: zero-points 1..15 only
        z = rng.integers(1, 16, size=(16, 128 // 32), dtype=np.uint8)
        w = pyquant.Int4Weight(w.qweight, w.scales, int4_ref.pack_zeros(z), 32)
    canon = (w.qweight, w.scales, w.qzeros)
    exported = getattr(int4_ref, f"to_{importer}")(*canon, 32)
    w2 = getattr(pyquant.Int4Weight, f"from_{importer}")(*exported)
    x = random_x(rng, 3, 128, F16)
    assert_bitwise_equal(pyquant.gemm(x, w2, out_dtype=np.float32),
                         pyquant.gemm(x, w, out_dtype=np.float32), f"from_{importer}")


# ---------------------------------------------------------------- GGUF

@pytest.mark.parametrize("fmt", GGUF_FORMATS)
@pytest.mark.parametrize("x_name", ["fp32", "fp16", "bf16"])
def test_gguf_edges(rng, fmt, x_name, poisoned_output, assert_close):
    x_dt = DTYPES[x_name]
    be = F.get(fmt).block_elems
    for n in (1, 7, 8):
        for k in (be, 2 * be):
            w = random_gguf(rng, fmt, n, k)
            for i, m in enumerate(EDGE_MS):
                y_dt = (x_dt, F32)[i % 2]
                x = random_x(rng, m, k, x_dt)
                check_gemm(x, w, y_dt, f"{fmt} x={x_name} y={y_dt} m={m} n={n} k={k}",
                           poisoned_output, assert_close)


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_padded_rows(rng, fmt, assert_close):
    """raw rows with a stride larger than their bytes (ldw > row bytes) are read in place."""
    spec = F.get(fmt)
    n, k = 5, 2 * spec.block_elems
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    padded = np.zeros((n, raw.shape[1] + 6), dtype=np.uint8)
    padded[:, :raw.shape[1]] = raw
    w = pyquant.GGUFWeight(fmt, padded[:, :raw.shape[1]])
    assert w.ldw == raw.shape[1] + 6
    x = random_x(rng, 3, k, F32)
    assert_close(pyquant.gemm(x, w), reference.gemm(x, spec.module.dequantize(raw)),
                 gemm_bound(k, F32), f"{fmt} padded rows")


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_to_device_pads_rows_to_16_bytes(rng, fmt, assert_close):
    """to_device() places rows 16 bytes apart (raw Q6_K / IQ3_XXS rows of an odd block
    count are 2-byte aligned); the padded copy gives the same GEMM and the same blocks.
    A CPU context's device arrays are host memory, so this runs the device-array path."""
    spec = F.get(fmt)
    n, k = 7, 3 * spec.block_elems
    raw = spec.module.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.GGUFWeight(fmt, raw)
    ctx = pyquant.Context("cpu")
    ctx.set_option("cpu_precision", FP32_EXACT)
    wd = w.to_device(ctx)
    assert wd.ldw % 16 == 0 and wd.ldw - raw.shape[1] < 16 and wd.nbytes == w.nbytes
    assert w.to_device(ctx, row_align=None).ldw == raw.shape[1]
    assert np.array_equal(wd.to_host().raw, raw)
    x = random_x(rng, 3, k, F32)
    y = pyquant.gemm(pyquant.DeviceArray.from_numpy(x, ctx), wd).to_numpy()
    assert_close(y, reference.gemm(x, spec.module.dequantize(raw)), gemm_bound(k, F32),
                 f"{fmt} rows padded by to_device")


# ---------------------------------------------------------------- bias

@pytest.mark.parametrize("fmt", ["int4", "int4-frag", *GGUF_FORMATS])
@pytest.mark.parametrize("bias_name", ["fp32", "fp16", "bf16"])
def test_bias_is_added_on_every_format(rng, fmt, bias_name, poisoned_output, assert_close):
    """An Int4Weight (either layout) or GGUFWeight with a bias: y = x @ W^T + bias against the
    reference, into a poisoned, guarded output, over M (the small-M and the panel kernels)
    and both output dtypes. The bias is of the output's size (standard normal): an output
    that left it out would miss by about its whole norm."""
    n = 24
    if fmt.startswith("int4"):
        k, x_dt = 256, BF16
        w = random_int4(rng, n, k, 64, False, F16)
        w = w.repack() if fmt == "int4-frag" else w
    else:
        k, x_dt = 2 * F.get(fmt).block_elems, F32
        w = random_gguf(rng, fmt, n, k)
    w = w.with_bias(rng.standard_normal(n).astype(DTYPES[bias_name]))
    assert w.nbytes == w.with_bias(None).nbytes + n * DTYPES[bias_name].itemsize
    for i, m in enumerate((1, 3, 17)):
        y_dt = (x_dt, F32)[i % 2]
        check_gemm(random_x(rng, m, k, x_dt), w, y_dt, f"{fmt} bias={bias_name} y={y_dt} m={m}",
                   poisoned_output, assert_close)


def test_bias_is_checked_like_the_weight(rng):
    """A bias of the wrong length, dtype or place is refused naming it."""
    w = random_int4(rng, 16, 128, 32, True, F16)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"bias has shape \(8,\), expected \(16,\)"):
        w.with_bias(np.zeros(8, np.float32))
    with pytest.raises(pyquant.InvalidArgumentError, match=r"bias has dtype int32; expected float32"):
        random_gguf(rng, "q8_0", 5, 32).with_bias(np.zeros(5, np.int32))

    class FakeDevice:  # a foreign device array (never dereferenced: refused before any use)
        __cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "data": (0x10000, False),
                                    "version": 3, "strides": None}
    with pytest.raises(pyquant.InvalidArgumentError,
                       match=r"qweight, scales in host memory but bias in device memory"):
        w.with_bias(FakeDevice())


# ---------------------------------------------------------------- MXFP4 dense

@pytest.mark.parametrize("x_name", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bias_name", [None, "fp32", "bf16"])
def test_mxfp4_edges(rng, x_name, bias_name, poisoned_output, assert_close):
    x_dt = DTYPES[x_name]
    for n in (1, 7, 8):
        for k in (32, 96):
            w = random_mxfp4(rng, (n,), k, bias_dtype=DTYPES.get(bias_name))
            for i, m in enumerate(EDGE_MS):
                y_dt = (x_dt, F32)[i % 2]
                x = random_x(rng, m, k, x_dt)
                check_gemm(x, w, y_dt, f"mxfp4 x={x_name} bias={bias_name} y={y_dt} m={m} n={n} k={k}",
                           poisoned_output, assert_close)


def test_mxfp4_gguf_blocks_are_repacked_not_misread(rng, assert_bitwise_equal):
    """GGUF's mxfp4 block (E8M0 first, elements 0..15 in low nibbles) and the OCP layout
    (element 2j low nibble) decode to the same weight through their own entry points; a
    mix-up would be a silent wrong answer, so both paths are checked bit for bit."""
    w = random_mxfp4(rng, (8,), 128)
    raw = mxfp4_ref.to_gguf_blocks(np.asarray(w.blocks), np.asarray(w.scales))
    wg = pyquant.from_gguf("mxfp4", raw, shape=(8, 128))
    assert isinstance(wg, pyquant.MXFP4Weight)
    assert_bitwise_equal(wg.dequantize(), w.dequantize(), "GGUF mxfp4 decode")
    x = random_x(rng, 3, 128, F32)
    assert_bitwise_equal(pyquant.gemm(x, wg), pyquant.gemm(x, w), "GGUF mxfp4 gemm")
    # reading the GGUF bytes as if they were OCP blocks gives a different weight
    assert not np.array_equal(mxfp4_ref.from_gguf_blocks(raw)[0],
                              raw.reshape(8, 4, 17)[..., 1:]), "test blocks are degenerate"


# ---------------------------------------------------------------- one-hot

def _one_hot_check(rng, w, x_dtype, name, assert_bitwise_equal):
    """x[i, k_i] = 1 (k_i a permutation of 0..K-1): y[i, n] = w[n, k_i] exactly, since every
    other product is an exact zero and fp32 output needs no rounding. -0.0 weights come out
    as +0.0 (a sum that starts from +0), hence the `+ 0.0` on the expected side."""
    n, k = w.shape
    perm = rng.permutation(k)
    x = np.zeros((k, k), dtype=np.float32)
    x[np.arange(k), perm] = 1.0
    y = pyquant.gemm(x.astype(x_dtype), w, out_dtype=np.float32)
    want = (w.dequantize()[:, perm].T + np.float32(0.0)).astype(np.float32)
    if getattr(w, "bias", None) is not None:
        want = want + np.asarray(w.bias).astype(np.float32)
    assert_bitwise_equal(y, np.ascontiguousarray(want), name)


@pytest.mark.parametrize("fmt", list(F.FORMATS))
def test_one_hot_returns_the_decoded_weights(rng, fmt, assert_bitwise_equal):
    spec = F.get(fmt)
    if spec.kind == "int4":
        cases = [(random_int4(rng, 16, 256, g, sym, sd), xd)
                 for g in int4_ref.GROUP_SIZES for sym in (False, True)
                 for sd in (F16, BF16) for xd in (F16, BF16)]
    elif spec.kind == "gguf":
        # every finite fp16 scale (d_range=None): fp32 output holds all decoded values
        cases = [(random_gguf(rng, fmt, 9, 2 * spec.block_elems, d_range=None), xd)
                 for xd in (F32, F16, BF16)]
    else:
        # E8M0 0..252: subnormal to near fp32 max (253..254 overflow fp32 to inf, and 0 * inf
        # would poison the one-hot sum)
        cases = [(random_mxfp4(rng, (9,), 96, e_range=(0, 252)), xd) for xd in (F32, F16, BF16)]
    for w, xd in cases:
        _one_hot_check(rng, w, xd, f"one-hot {fmt} {w!r} x={xd}", assert_bitwise_equal)


@pytest.mark.parametrize("fmt", list(F.FORMATS))
def test_one_hot_across_k_chunks(rng, fmt, assert_bitwise_equal):
    """The CPU tier decodes K in chunks of 1024 (src/cpu/tile_gemm.h TILE_K) and prefetches
    each row's next chunk: a K of more than one chunk, ending in a partial one, still
    returns every decoded weight bit for bit (rows > one 16-row tile as well)."""
    spec = F.get(fmt)
    if spec.kind == "int4":
        w = random_int4(rng, 24, 1024 + 128, 128, False, BF16)
    elif spec.kind == "gguf":
        w = random_gguf(rng, fmt, 17, 1024 + 2 * spec.block_elems, d_range=None)
    else:
        w = random_mxfp4(rng, (17,), 1024 + 64, e_range=(0, 252))
    _one_hot_check(rng, w, F32 if spec.kind != "int4" else BF16, f"one-hot {fmt} K={w.shape[1]}",
                   assert_bitwise_equal)


# ---------------------------------------------------------------- MoE

def _moe_inputs(rng, t, e, top_k, h, inter, x_dtype, with_bias):
    w13 = random_mxfp4(rng, (e, 2 * inter), h, bias_dtype=F32 if with_bias else None)
    w2 = random_mxfp4(rng, (e, h), inter, bias_dtype=BF16 if with_bias else None)
    x = random_x(rng, t, h, x_dtype)
    if x_dtype == F16:
        # silu_glu is unbounded and quadratic in x: a seed once reached |y| = 73413, past
        # fp16's 65504 (inf); a quarter of x keeps y a factor 16 inside fp16's range.
        x = (x.astype(np.float32) * 0.25).astype(F16)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, size=(t, top_k)).astype(np.float32)
    return x, ids, wts / wts.sum(axis=1, keepdims=True), w13, w2


@pytest.mark.parametrize("activation", ["swiglu_oai", "silu_glu"])
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("tile_m", [16, 32, 64, 80, 256])
def test_moe_against_reference(rng, activation, layout, with_bias, tile_m, assert_close):
    e, top_k, h, inter = 6, 2, 64, 32
    for t, x_dt in ((1, BF16), (5, F16), (33, F32), (70, BF16)):
        x, ids, wts, w13, w2 = _moe_inputs(rng, t, e, top_k, h, inter, x_dt, with_bias)
        for y_dt in (x_dt, F32):
            y = pyquant.moe(x, ids, wts, w13, w2, activation=activation, gate_up_layout=layout,
                            tile_m=tile_m, out_dtype=y_dt)
            assert y.shape == (t, h) and y.dtype == y_dt
            ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(),
                                _bias_of(w13), _bias_of(w2), activation=activation,
                                gate_up_layout=layout, act_dtype=x_dt)
            assert_close(y, ref, moe_bound(h, inter, x_dt, y_dt),
                         f"moe {activation} {layout} bias={with_bias} tile_m={tile_m} t={t} "
                         f"x={x_dt} y={y_dt}")


def test_moe_default_tile_m_and_int64_ids(rng, assert_close):
    """Defaults: tile_m from the heuristic, topk_ids as int64 (what argsort/topk give) and
    float64 weights are converted on the host."""
    e, top_k, h, inter, t = 4, 2, 32, 64, 9
    x, ids, wts, w13, w2 = _moe_inputs(rng, t, e, top_k, h, inter, BF16, False)
    y = pyquant.moe(x, ids.astype(np.int64), wts.astype(np.float64), w13, w2)
    ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), act_dtype=BF16)
    assert_close(y, ref, moe_bound(h, inter, BF16, BF16), "moe defaults")
    assert pyquant.api.default_tile_m(1, 4, 128) == 16
    assert pyquant.api.default_tile_m(4096, 4, 32) == 64            # capped at the CPU's widest
    assert pyquant.api.default_tile_m(4096, 4, 32, widest=256) == 256  # 512 rows per expert
    assert pyquant.api.default_tile_m(1280, 4, 32, widest=256) == 256  # 160 rows per expert
    assert pyquant.api.default_tile_m(1024, 4, 32, widest=256) == 64   # 128 rows per expert
    assert pyquant.api.default_tile_m(2048, 4, 32, widest=128) == 64   # 256 rows, no 256 tile (fp16 x)
    assert pyquant.api.default_tile_m(512, 4, 32, widest=128) == 64    # 64 rows, fp16 x: no 80 / 96 tile
    assert pyquant.api.default_tile_m(2560, 4, 32, widest=128) == 128  # 320 rows per expert
    assert pyquant.api.default_tile_m(8, 4, 1, widest=256) == 64       # 32 rows per expert
    assert pyquant.api.default_tile_m(6, 4, 1, widest=256) == 32       # 24 rows per expert
    assert pyquant.api.default_tile_m(2048, 4, 128, widest=256) == 80  # 64 rows: one 80 tile, not 1.5 of 64
    assert pyquant.api.default_tile_m(640, 4, 32, widest=256) == 96    # 80 rows per expert
    assert pyquant.api.default_tile_m(384, 4, 32, widest=256) == 64    # 48 rows per expert
    assert pyquant.api.default_tile_m(768, 4, 32, widest=256) == 64    # 96 rows per expert
    assert pyquant.api.default_tile_m(8, 4, 1, widest=64) == 32        # no grouped tier: 32 up to 32


# ---------------------------------------------------------------- API surface

def test_formats_and_build_info():
    import ctypes
    assert pyquant.formats() == list(F.FORMATS)
    # The library knows no format beyond the registry's (qg_format values are 0..n-1; the next
    # test checks each row against the library): the value after the last row is refused.
    e, b = ctypes.c_int32(), ctypes.c_int32()
    try:
        pyquant._lib.qg_format_block(len(F.FORMATS), ctypes.byref(e), ctypes.byref(b))
    except pyquant.InvalidArgumentError as err:
        assert f"format={len(F.FORMATS)} is not a qg_format value" in str(err), str(err)
    else:
        pytest.fail(f"the library knows format={len(F.FORMATS)} ({e.value} elements / {b.value} bytes a "
                    f"block), which has no row in the registry (pyquant/formats/__init__.py)")
    info = pyquant.build_info()
    assert "cpu" in info and pyquant.__version__ in info, info


def test_format_blocks_agree_with_the_registry():
    import ctypes
    for name, spec in F.FORMATS.items():
        e, b = ctypes.c_int32(), ctypes.c_int32()
        try:
            pyquant._lib.qg_format_block(spec.qg_format, ctypes.byref(e), ctypes.byref(b))
        except pyquant.InvalidArgumentError as err:
            pytest.fail(f"{name}: the library does not know the registry's format={spec.qg_format}: {err}")
        assert (e.value, b.value) == (spec.block_elems, spec.block_bytes), \
            f"{name}: library says {e.value} elements / {b.value} bytes"


@pytest.mark.parametrize("fmt", list(F.FORMATS))
def test_weight_attributes(rng, fmt):
    W = rng.standard_normal((16, 256)).astype(np.float32)
    w = pyquant.quantize(W, fmt)
    assert w.format == fmt and w.shape == (16, 256) and not w.is_device
    deq = w.dequantize()
    assert deq.dtype == np.float32 and deq.shape == (16, 256)
    assert w.nbytes == sum(np.asarray(a).nbytes for a in w._components().values())
    assert 3.0 <= w.bits_per_weight <= 8.6, w.bits_per_weight


def test_empty_problem_returns_at_once(rng):
    w = random_int4(rng, 8, 64, 32, True, F16)
    y = pyquant.gemm(np.zeros((0, 64), dtype=np.float16), w)
    assert y.shape == (0, 8)


def test_options_do_not_change_results(rng, ctx, assert_bitwise_equal):
    """cpu_threads is a tuning knob: automatic, one thread or several (explicit counts are
    used as given, so 2 and 3 really split the 5 row tiles) give the same bits."""
    w = random_gguf(rng, "q4_K", 80, 512)
    x = random_x(rng, 5, 512, F32)
    y_auto = pyquant.gemm(x, w)
    try:
        for threads in (1, 2, 3):
            ctx.set_option("cpu_threads", threads)
            assert_bitwise_equal(pyquant.gemm(x, w), y_auto, f"cpu_threads={threads} vs automatic")
    finally:
        ctx.set_option("cpu_threads", 0)
