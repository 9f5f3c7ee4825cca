"""The CPU tier's int8 path (cpu_precision = 2, what auto picks) against its numpy model,
pyquant.formats.cpu_int8, and the model against the exact product.

- Bit for bit: every format, x fp32 / fp16 / bf16 (int4: fp16 / bf16), y in x's dtype
  and fp32, M over the edge sizes (1 and 2 take the small-M kernels, 3 and up the panel
  kernels, 300 two passes of 256 rows), N not a multiple of 8 or 16, K one block and K
  past a panel chunk (512) with a partial last one. Outputs poisoned and guarded.
- Every ISA level (QG_CPU_ISA caps it, in a fresh process each) gives the same bits.
- Rows of x with NaN or inf, and weight rows with a non-finite scale, give the fp32-exact
  path's values; the rest stays the model's.
- The model is within its derived error_bound of the exact float64 product.
- The decomposition dequantizes bit for bit as each format's own dequantize.
Fresh random inputs every run (the rng fixture prints its seed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import FP32_EXACT, format_entry, log_margin, pinned_precision
from pyquant import formats as F
from pyquant.formats import cpu_int8, int4 as int4_ref, mxfp4 as mxfp4_ref, reference
from test_nonfinite import GGUF_D_OFFSET

INT8 = 2  # qg_context_set_option "cpu_precision" (include/quantgemm.h)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
X_DTYPES = {"fp32": F32, "fp16": F16, "bf16": BF16}
FORMATS = list(F.FORMATS)
EDGE_MS = (1, 2, 3, 5, 8, 16, 17, 33, 300)
ISA_CAPS = ("scalar", "avx2", "avx512vnni", "amx")  # src/cpu/cpu_isa.h
# The small-M rows kernel's copies within a level (QG_CPU_ROWS, cpu_isa.h): ymm everywhere,
# zmm asked for at avx512vnni and up.
ISA_RUNS = tuple((cap, "ymm") for cap in ISA_CAPS) + (("avx512vnni", "zmm"), ("amx", "zmm"))
# The float64 reference's own rounding, relative to sum |x w|: K * 2^-53 is far below
# this for K <= 2^20 (a named slack, not a tolerance of the library).
F64_SLACK = 2.0 ** -40


@pytest.fixture
def int8_ctx():
    yield from pinned_precision(INT8)


# ---------------------------------------------------------------- operands

def block_elems(fmt: str) -> int:
    return {"int4": 32, "mxfp4": 32}.get(fmt, F.get(fmt).block_elems)


def make_weight(rng, fmt, n, k, group_size=64, symmetric=False, scale_dtype=F16, bias=False):
    """(pyquant weight, model args, model kwargs): random valid codes (every bit random),
    scales small enough that fp16 outputs stay finite; with bias, a float32 bias [N]."""
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    bkw = {} if b is None else {"bias": b}  # the model's kwarg (decompose takes none)
    if fmt == "int4":
        qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
        scales = (rng.uniform(0.5, 2.0, size=(n, k // group_size)) * 2.0 ** -6).astype(scale_dtype)
        qzeros = None if symmetric else rng.integers(0, 2 ** 32, size=(n // 8, k // group_size),
                                                     dtype=np.uint32).view(np.int32)
        w = pyquant.Int4Weight(qweight, scales, qzeros, group_size, bias=b)
        return w, (qweight, scales, qzeros), {"group_size": group_size, **bkw}
    if fmt == "mxfp4":
        blocks = rng.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
        scales = rng.integers(127 - 8, 127, size=(n, k // 32), dtype=np.uint8)
        return pyquant.from_mxfp4(blocks, scales, b), (blocks, scales), bkw
    raw = F.get(fmt).module.random_blocks(rng, n, k, d_range=(2.0 ** -10, 2.0 ** -6))
    return pyquant.from_gguf(fmt, raw, shape=(n, k)).with_bias(b), (raw,), bkw


def random_x(rng, m, k, dtype):
    """Gaussian x, each 32-element block scaled by its own power of two (the quantizer sees
    many block scales), never exactly zero."""
    s = 2.0 ** rng.integers(-3, 4, size=(m, k // 32))
    x = rng.standard_normal((m, k)) * np.repeat(s, 32, axis=1)
    return np.where(x == 0, 0.5, x).astype(np.float32).astype(dtype)


def edge_x(rng, m, k, dtype):
    """Rows of zeros but for one of the quantizer's edge blocks (src/cpu/q8_act.h), row r
    kind r % 4 at block r % (k / 32): 0, a few values below ~3.7e-37 among zeros (float32 and
    bfloat16: 1 / dx overflows to inf, so the zeros make 0 * inf = NaN, code 0, the rest
    +-127; fp16 has no such values: its smallest normal there); 1, amax 127 with halves (t = v:
    ties to even); 2, values up to 1e30 (fp16: 6e4); 3, one value among zeros. Every other
    block is zero (dx = 0): a row's output is its edge block's alone, so a wrong code shows
    even where its block's scale is tiny."""
    x = np.zeros((m, k), np.float32)
    tiny = np.float32(2.0 ** -14) if dtype == F16 else np.float32(1e-38)
    big = np.float32(6.0e4 if dtype == F16 else 1e30)
    halves = np.arange(32, dtype=np.float32) - np.float32(15.5)
    for r in range(m):
        b = slice(32 * (r % (k // 32)), 32 * (r % (k // 32) + 1))
        kind = r % 4
        if kind == 0:
            v = np.zeros(32, np.float32)
            v[r % 5::7] = tiny * rng.choice([-1.0, 1.0], size=len(v[r % 5::7]))
        elif kind == 1:
            v = rng.permutation(np.where(halves == halves[0], np.float32(-127.0), halves))
        elif kind == 2:
            v = big * rng.uniform(-1, 1, size=32).astype(np.float32)
        else:
            v = np.zeros(32, np.float32)
            v[r % 32] = np.float32(-0.75)
        x[r, b] = v
    return x.astype(dtype)


def model(x, fmt, args, kw, y_dtype):
    """The model's y in y_dtype (its one rounding of the float32 result) and fallback mask.
    Non-finite scales planted on purpose make NaN scale products (0 * inf): no warning."""
    with np.errstate(over="ignore", invalid="ignore"):
        y, fallback = cpu_int8.gemm(x, fmt, *args, **kw)
        return y.astype(y_dtype), fallback


def gemm_guarded(x, w, y_dtype, poisoned_output):
    g = poisoned_output(x.shape[0], w.shape[0], y_dtype)
    assert pyquant.gemm(x, w, out=g.y) is g.y
    return g.value()


def long_k(fmt) -> int:
    """K past a panel chunk (512) with a partial last one, a multiple of the format's block
    (int4: of its group, 64 here)."""
    return {"int4": 640}.get(fmt, 1280 if block_elems(fmt) == 256 else 608)


def shapes(fmt):
    """(n, k) pairs: N off the 8- and 16-row tiles, K one block (group) and long_k."""
    ns = (8, 40) if fmt == "int4" else (5, 37)
    ks = (64 if fmt == "int4" else block_elems(fmt), long_k(fmt))
    return [(n, k) for n in ns for k in ks]


def x_dtypes(fmt):
    return ["fp16", "bf16"] if fmt == "int4" else list(X_DTYPES)


# ---------------------------------------------------------------- bit for bit

@pytest.mark.parametrize("fmt", FORMATS)
def test_library_matches_model_bitwise(rng, fmt, int8_ctx, poisoned_output, assert_bitwise_equal):
    for x_name in x_dtypes(fmt):
        x_dt = X_DTYPES[x_name]
        for j, (n, k) in enumerate(shapes(fmt)):
            w, args, kw = make_weight(rng, fmt, n, k, bias=j % 2 == 1)  # each N with and without
            for i, m in enumerate(EDGE_MS):
                y_dt = (x_dt, F32)[i % 2]
                x = random_x(rng, m, k, x_dt)
                want, fallback = model(x, fmt, args, kw, y_dt)
                assert not fallback.any(), "finite inputs: no fp32 fallback"
                assert_bitwise_equal(gemm_guarded(x, w, y_dt, poisoned_output), want,
                                     f"{fmt} x={x_name} y={y_dt} m={m} n={n} k={k}")


@pytest.mark.parametrize("group_size", int4_ref.GROUP_SIZES)
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("scale_dtype", [F16, BF16], ids=["s_fp16", "s_bf16"])
def test_int4_variants_match_model(rng, group_size, symmetric, scale_dtype, int8_ctx, poisoned_output,
                                   assert_bitwise_equal):
    """Every int4 group size, zero-point kind and scale dtype; K spans several groups."""
    n, k = 24, 4 * max(group_size, 128)
    w, args, kw = make_weight(rng, "int4", n, k, group_size, symmetric, scale_dtype)
    for m in (1, 2, 7):
        x = random_x(rng, m, k, F16)
        want, _ = model(x, "int4", args, kw, F32)
        assert_bitwise_equal(gemm_guarded(x, w, F32, poisoned_output), want,
                             f"int4 g{group_size} {'sym' if symmetric else 'asym'} m={m}")


def test_q6_K_sums_at_their_bound(rng, int8_ctx, poisoned_output, assert_bitwise_equal):
    """q6_K's block sum D = sc0 h0 + sc1 h1 at its largest: every code -32 (quant 0), every
    sub-block scale -128, activation codes +-127 (x of +-1, one sign a 16-element half, one
    row all +1): |h| = 16 * 32 * 127, |D| up to 2 * 128 * 65024 = 16646144 < 2^24, which the
    AMX kernel forms in float32 (int8_amx.cpp sub_update) and the others in int32. M = 64
    (two tile passes) and 33 (one, then AVX-512 VNNI) on a CPU with AMX; bit for bit the
    model's either way."""
    n, k = 37, 1280
    raw = np.zeros((n, k // 256, 210), dtype=np.uint8)  # ql = qh = 0: quant 0, code -32
    raw[:, :, 192:208] = np.uint8(0x80)                # scales: int8 -128
    raw[:, :, 208:210] = np.array([2.0 ** -10], dtype=F16).view(np.uint8)  # d
    raw = raw.reshape(n, -1)
    w = pyquant.from_gguf("q6_K", raw, shape=(n, k))
    for m in (1, 5, 33, 64):
        signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(m, k // 16))
        signs[0] = 1.0
        x = np.repeat(signs, 16, axis=1).astype(F16)
        want, fallback = model(x, "q6_K", (raw,), {}, F32)
        assert not fallback.any()
        assert np.abs(want[0]).max() > 0, "the all +1 row reaches the bound"
        assert_bitwise_equal(gemm_guarded(x, w, F32, poisoned_output), want, f"q6_K at the bound m={m}")


# Weight rows for ranges of several panels on the small-M path (int8_gemm.h PanelRanges: a
# range of consecutive 16-row panels a thread, the others' tails taken from the back): 41
# panels, the last of 8 rows (int4's zero points are packed by 8 rows), give ranges of 41,
# 20-21, 13-14 and 8-9 panels on 1, 2, 3 and 5 threads.
MANY_PANELS_N = 16 * 40 + 8


def test_threads_do_not_change_results(rng, int8_ctx, assert_bitwise_equal):
    """cpu_threads only shares out the weight panels (one or several a task): every count
    gives the same bits, the model's."""
    for fmt in ("q4_K", "q8_0", "int4"):
        for n in (72, MANY_PANELS_N):
            w, args, kw = make_weight(rng, fmt, n, 512)
            for m in (1, 6):
                x = random_x(rng, m, 512, F16)
                want, _ = model(x, fmt, args, kw, F32)
                for threads in (1, 2, 3, 5):
                    int8_ctx.set_option("cpu_threads", threads)
                    assert_bitwise_equal(pyquant.gemm(x, w, out_dtype=np.float32), want,
                                         f"{fmt} n={n} m={m} threads={threads}")
            int8_ctx.set_option("cpu_threads", 0)


@pytest.mark.parametrize("x_name", list(X_DTYPES))
def test_activation_quantizer_edges_match_model(rng, x_name, int8_ctx, assert_bitwise_equal):
    """The activation quantizer's edge blocks (edge_x: zero, 1 / dx overflowing, ties,
    near-overflow values) give the model's codes and scales: the outputs are the model's
    bit for bit, through the small-M kernel (M = 1, 2) and the panels (M = 5, 40)."""
    x_dt = X_DTYPES[x_name]
    for fmt in ("q8_0", "q4_K"):
        k = 512
        w, args, kw = make_weight(rng, fmt, 37, k)
        for m in (1, 2, 5, 40):
            x = edge_x(rng, m, k, x_dt)
            want, fallback = model(x, fmt, args, kw, F32)
            assert not fallback.any(), "finite inputs: no fp32 fallback"
            assert_bitwise_equal(pyquant.gemm(x, w, out_dtype=np.float32), want, f"{fmt} x={x_name} m={m}")


# ---------------------------------------------------------------- ISA levels

_ISA_CHILD = r"""
import json, sys
import numpy as np, pyquant
from pyquant import formats as F
d = np.load(sys.argv[1], allow_pickle=True)
ctx = pyquant.cpu_context()
ctx.set_option("cpu_precision", 2)
out = {}
for key in json.loads(str(d["keys"])):
    fmt, m = key.split("/")
    x = d[key + "/x"]
    if fmt == "int4":
        qz = d[fmt + "/qzeros"]
        w = pyquant.Int4Weight(d[fmt + "/qweight"], d[fmt + "/scales"], qz if qz.size else None, 64)
    elif fmt == "mxfp4":
        w = pyquant.from_mxfp4(d[fmt + "/blocks"], d[fmt + "/scales"])
    else:
        raw = d[fmt + "/raw"]
        w = pyquant.from_gguf(fmt, raw, shape=(raw.shape[0], x.shape[1]))
        if m.endswith("r"):
            w = w.repack("rows8")
    out[key] = pyquant.gemm(x, w, out_dtype=np.float32)
np.savez(sys.argv[2], **out)
"""


def test_every_isa_level_gives_the_same_bits(rng, tmp_path, int8_ctx, assert_bitwise_equal):
    """One fresh process per QG_CPU_ISA cap and rows kernel copy (ISA_RUNS: both are chosen
    once per process), each computing every format at M = 1, 2 (small-M kernels; N = 40
    ends in a panel of 8 rows) and 5, 40 (panel kernels), every GGUF format once more at those
    M on its rows8 layout (key suffix r), and q8_0 and q4_K once more at
    M = 1 and 40 on float32 edge_x (the activation quantizer's edges), as this process does (its widest
    level, ymm rows); every result must be the model's (cpu_int8.gemm) bit for bit. A cap
    above what the machine has changes nothing; the level and rows kernel each child ran
    are read from its QG_LOG=1 lines, and the zmm copy must have run wherever the level
    has it."""
    arrays, keys, want = {}, [], {}
    for fmt in FORMATS:
        k = long_k(fmt)
        w, args, kw = make_weight(rng, fmt, 40, k)
        names = {"int4": ("qweight", "scales", "qzeros"), "mxfp4": ("blocks", "scales")}.get(fmt, ("raw",))
        for name, a in zip(names, args):
            arrays[f"{fmt}/{name}"] = np.zeros(0) if a is None else a
        rows8 = (1, 2, 5, 40) if fmt not in ("int4", "mxfp4") else ()  # GGUF: the rows8 layout too
        for m in (1, 2, 5, 40) + ((1, 40) if fmt in ("q8_0", "q4_K") else ()) + rows8:
            edge = (fmt in ("q8_0", "q4_K") and m in (1, 40) and f"{fmt}/{m}" in keys
                    and f"{fmt}/{m}e" not in keys)  # the second time: edge_x (float32)
            r8 = f"{fmt}/{m}" in keys and not edge
            key = f"{fmt}/{m}" + ("e" if edge else "r" if r8 else "")
            x = edge_x(rng, m, k, F32) if edge else random_x(rng, m, k, F16)
            arrays[key + "/x"] = x
            keys.append(key)
            want[key], _ = model(x, fmt, args, kw, F32)
            wk = w.repack("rows8") if r8 else w
            assert len(set(keys)) == len(keys), key
            assert_bitwise_equal(pyquant.gemm(x, wk, out_dtype=np.float32), want[key], f"this process: {key}")
    src = tmp_path / "in.npz"
    np.savez(src, keys=json.dumps(keys), **arrays)
    ran = {}
    for cap, rows in ISA_RUNS:
        run = f"QG_CPU_ISA={cap} QG_CPU_ROWS={rows}"
        dst = tmp_path / f"{cap}_{rows}.npz"
        env = dict(os.environ, QG_CPU_ISA=cap, QG_CPU_ROWS=rows, QG_LOG="1")
        p = subprocess.run([sys.executable, "-c", _ISA_CHILD, str(src), str(dst)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{run}: child failed:\n{p.stderr[-2000:]}"
        isa = _logged(p.stderr, "cpu int8 isa=")
        kernel = _logged(p.stderr, "cpu int8: rows kernel on ")
        assert isa in ISA_CAPS[:ISA_CAPS.index(cap) + 1], f"{run} ran {isa}"
        has_zmm = ISA_CAPS.index(isa) >= ISA_CAPS.index("avx512vnni")
        want_kernel = "zmm" if rows == "zmm" and has_zmm else "ymm" if isa != "scalar" else "?"
        assert kernel == want_kernel, f"{run} (ran isa={isa}): rows kernel on {kernel}, not {want_kernel}"
        ran[run] = f"isa={isa} rows={kernel}"
        got = np.load(dst)
        for key in keys:
            assert_bitwise_equal(got[key], want[key], f"{run} ({ran[run]}) {key}")
    print("isa levels run:", ran)


def _logged(stderr: str, prefix: str) -> str:
    """The first word after prefix in a QG_LOG=1 line, or "?" where no line has it."""
    line = [s for s in stderr.splitlines() if prefix in s]
    return line[0].split(prefix)[1].split()[0] if line else "?"


# ---------------------------------------------------------------- non-finite input

def _one_nan(a):
    """a with every NaN the same quiet NaN."""
    return np.where(np.isnan(a), np.float32(np.nan), a)


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_rows_take_the_fp32_path(rng, fmt, int8_ctx, assert_bitwise_equal):
    """A NaN or inf in a row of x, or a non-finite scale in a weight row: those outputs are
    the fp32-exact path's (so they propagate as the float reference says), the others the
    model's."""
    n, k = 24 if fmt == "int4" else 19, 2 * max(block_elems(fmt), 64)
    w, args, kw = make_weight(rng, fmt, n, k)
    bad_w = {3, 11}
    if fmt == "int4":
        args[1][sorted(bad_w), 0] = np.inf
    elif fmt == "mxfp4":
        args[1][3, 0], args[1][11, 1] = 255, 254   # NaN, and a scale whose decode overflows
    else:
        spec = F.get(fmt)
        d_off = format_entry(GGUF_D_OFFSET, "GGUF_D_OFFSET of tests/test_nonfinite.py", fmt)  # fp16 d
        for r in bad_w:
            args[0][r, d_off:d_off + 2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
        assert spec.block_bytes > d_off
    for m in (1, 2, 6):
        x = random_x(rng, m, k, F32 if fmt != "int4" else F16)
        x[m // 2, 5] = np.nan
        if m > 2:
            x[m - 1, k - 1] = -np.inf
        got = pyquant.gemm(x, w, out_dtype=np.float32)
        want, fallback = model(x, fmt, args, kw, F32)
        assert fallback[:, sorted(bad_w)].all() and fallback[m // 2].all()
        int8_ctx.set_option("cpu_precision", FP32_EXACT)
        exact = pyquant.gemm(x, w, out_dtype=np.float32)
        int8_ctx.set_option("cpu_precision", INT8)
        # bit for bit, NaN for NaN: the sign and payload of a NaN are not part of the contract
        # (docs/guarantees.md), and which operand's NaN an add keeps differs between the
        # fp32 path's kernels for one column and for all (one seed of the ASan build).
        assert_bitwise_equal(np.where(fallback, _one_nan(got), 0), np.where(fallback, _one_nan(exact), 0),
                             f"{fmt} m={m}: fallback")
        assert_bitwise_equal(np.where(fallback, 0, got), np.where(fallback, 0, want), f"{fmt} m={m}: the rest")


# ---------------------------------------------------------------- the model

@pytest.mark.parametrize("x_name", list(X_DTYPES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_model_within_error_bound(rng, fmt, x_name):
    """|cpu_int8.gemm - x @ W^T| <= error_bound + F64_SLACK * |x| @ |W|^T everywhere (the
    bound: activation quantization, q4_K's rounded weights, the float32 steps)."""
    if fmt == "int4" and x_name == "fp32":
        pytest.skip("W4A16 takes fp16 / bf16 activations")
    k = 1024
    w, args, kw = make_weight(rng, fmt, 24, k)
    x = random_x(rng, 6, k, X_DTYPES[x_name])
    y, fallback = cpu_int8.gemm(x, fmt, *args, **kw)
    assert not fallback.any()
    W = cpu_int8.dequantize(cpu_int8.decompose(fmt, *args, **{k_: v for k_, v in kw.items() if k_ != "bias"}))
    ref = reference.gemm(x, W, kw.get("bias"))
    mag = np.abs(np.asarray(x, np.float64)) @ np.abs(W.astype(np.float64)).T
    bound = cpu_int8.error_bound(x, fmt, *args, **{k_: v for k_, v in kw.items() if k_ != "bias"}) + F64_SLACK * mag
    err = np.abs(y.astype(np.float64) - ref)
    ratio = err / bound
    i = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert np.all(err <= bound), f"{fmt}: model {y[i]!r} vs exact {ref[i]!r} at {i}: {err[i]:.3e} > {bound[i]:.3e}"
    log_margin(f"{fmt} x={x_name}: model vs exact, elementwise", float(ratio.max()), 1.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decomposition_dequantizes_bit_exact(rng, fmt, assert_bitwise_equal):
    """sw * w (- mw), in the format's float32 steps, is the format's dequantize bit for bit
    (any finite fp16 scale; MXFP4 every scale byte but 255, NaN). MXFP4's code 8 (OCP -0)
    is the integer 0 here, as in the library's float decoder (dequant.h): +0 where the
    numpy reference gives -0, so MXFP4 is compared as values."""
    n, k = 16, 2 * max(block_elems(fmt), 64)
    if fmt == "int4":
        _, args, kw = make_weight(rng, fmt, n, k)
        want = int4_ref.dequantize(*args, kw["group_size"])
    elif fmt == "mxfp4":
        blocks = rng.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
        scales = rng.integers(0, 255, size=(n, k // 32), dtype=np.uint8)
        args, kw = (blocks, scales), {}
        with np.errstate(over="ignore"):
            want = mxfp4_ref.dequantize(blocks, scales)
    else:
        raw = F.get(fmt).module.random_blocks(rng, n, k, d_range=None)
        args, kw = (raw,), {}
        want = F.get(fmt).module.dequantize(raw)
    with np.errstate(over="ignore"):
        got = cpu_int8.dequantize(cpu_int8.decompose(fmt, *args, **kw))
    if fmt == "mxfp4":
        assert np.array_equal(got, want), f"{fmt}: decomposition"
        assert_bitwise_equal(got[want != 0], want[want != 0], f"{fmt}: decomposition, nonzero")
    else:
        assert_bitwise_equal(got, want, f"{fmt}: decomposition")
