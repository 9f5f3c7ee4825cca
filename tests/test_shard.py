"""Weight shards for tensor and expert parallelism (pyquant.shard, docs/tensor-parallel.md).

1. Every format and layout, column-parallel (axis n) and row-parallel (axis k), into 2, 4
   and 8 parts: each part is a valid weight whose decode is exactly the slice of the whole
   weight's decode; the parts' outputs concatenated (n) or summed in fp32 as an all-reduce
   sums them (k) reproduce the unsharded gemm within a bound derived from the suite's fp32
   accumulation bound (test_api_cpu.cancelling_gemm_bound).
2. The frag layout: a shard on whole 16-row blocks and 128-k chunks is byte for byte the
   repack (library and numpy reference) of the canonical shard, padded tails included.
3. plan(): each Copy (offset, pitch, width, height) gathered from the raw bytes of the
   source buffer is the shard's component, byte for byte (what a C engine copies).
4. Refusals name the rule: packed words, groups, blocks, frag tiles, parts and indices.
5. MoE: expert-parallel (axis expert) and tensor-parallel (w13 on n, w2 on k) layers summed
   over the parts reproduce the unsharded layer.
6. Device-resident weights (a CPU context's DeviceArrays: the same calls as device memory)
   shard to the same bytes as host weights, in their context.
"""
from __future__ import annotations

import numpy as np
import pytest

import pyquant
from pyquant import shard as S
from pyquant.formats import int4_frag as FR
from pyquant.formats import reference
from test_api_cpu import (BF16, F16, F32, GGUF_FORMATS, U32, _moe_inputs, cancelling_gemm_bound,
                          moe_bound, random_gguf, random_int4, random_mxfp4, random_x)

PARTS = (2, 4, 8)
M = 5  # activation rows


def _int4(g, symmetric, scale_dtype, layout="canonical", bias_dtype=None):
    def make(rng, n, k):
        w = random_int4(rng, n, k, g, symmetric, scale_dtype)
        if bias_dtype is not None:
            w = w.with_bias(rng.standard_normal(n).astype(bias_dtype))
        return w.repack() if layout == "frag" else w
    return make


def _gguf_bias(fmt, bias_dtype):
    def make(rng, n, k):
        return random_gguf(rng, fmt, n, k).with_bias(rng.standard_normal(n).astype(bias_dtype))
    return make


# name -> (make(rng, n, k), N, K): N and K split into 8 parts on every rule of the case
# (int4 N/8 a multiple of 8, frag N/8 of 16 and K/8 of 128, GGUF K/8 of the block,
# MXFP4 K/8 of 32); GGUF and MXFP4 parts of N = 5 rows.
CASES = {
    "int4-g128-asym-bf16": (_int4(128, False, BF16), 192, 1024),
    "int4-g32-sym-fp16": (_int4(32, True, F16), 64, 256),
    "int4-frag-g64-asym": (_int4(64, False, BF16, "frag"), 128, 1024),
    "int4-frag-g128-sym": (_int4(128, True, F16, "frag"), 128, 1024),
    "int4-g64-asym-bias": (_int4(64, False, F16, bias_dtype=F32), 64, 512),
    "int4-frag-g128-bias": (_int4(128, False, BF16, "frag", bias_dtype=BF16), 128, 1024),
    "q4_K-bias": (_gguf_bias("q4_K", F16), 40, 2048),
    **{fmt: (lambda rng, n, k, fmt=fmt: random_gguf(rng, fmt, n, k), 40,
             8 * pyquant.formats.get(fmt).block_elems) for fmt in GGUF_FORMATS},
    "mxfp4": (lambda rng, n, k: random_mxfp4(rng, (n,), k), 40, 768),
    "mxfp4-bias": (lambda rng, n, k: random_mxfp4(rng, (n,), k, bias_dtype=BF16), 40, 768),
    "mxfp4-frag-bias": (lambda rng, n, k: random_mxfp4(rng, (n,), k, bias_dtype=BF16).repack(), 128, 1024),
}


def _bias(w):
    return None if getattr(w, "bias", None) is None else np.asarray(w.bias, np.float64)


def _gemm32(x, w):
    return np.asarray(pyquant.gemm(x, w, out_dtype=F32), np.float64)


def all_reduce_error(parts: list) -> float:
    """Bound on ||sum_i y_i - x @ W^T|| for the fp32 sum of the parts' results y_i: each y_i
    (of its x_i, W_i and exact result r_i, over its own K_i) sits within its fp32
    accumulation bound of r_i, and the sum of p fp32 values rounds p - 1 times, each time
    by at most u32 * |partial sum| <= u32 * sum_i |r_i| (to first order).
    parts: [(x_i, W_i decoded, r_i)]."""
    total = sum(cancelling_gemm_bound(xi, wi, ri, F32) * np.linalg.norm(ri) for xi, wi, ri in parts)
    return total + (len(parts) - 1) * U32 * np.linalg.norm(sum(np.abs(ri) for _, _, ri in parts))


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("axis", ["n", "k"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.usefixtures("fp32_exact")  # cancelling_gemm_bound is the fp32-exact path's
def test_shards_reproduce_the_unsharded_gemm(rng, case, axis, parts, assert_close, assert_bitwise_equal):
    make, n, k = CASES[case]
    w = make(rng, n, k)
    deq = w.dequantize()
    x = random_x(rng, M, k, BF16)
    y = _gemm32(x, w)
    exact = reference.gemm(x, deq, _bias(w))
    shards = [w.shard(axis, parts, i) for i in range(parts)]
    step = (n if axis == "n" else k) // parts
    for i, s in enumerate(shards):
        cut = slice(i * step, (i + 1) * step)
        assert type(s) is type(w) and s.format == w.format
        assert getattr(s, "layout", None) == getattr(w, "layout", None)
        assert s.shape == ((step, k) if axis == "n" else (n, step))
        assert_bitwise_equal(s.dequantize(), deq[cut] if axis == "n" else deq[:, cut],
                             f"{case} part {i} decode")
    name = f"{case} {axis} x{parts}"
    unsharded = cancelling_gemm_bound(x, deq, exact, F32) * np.linalg.norm(exact)  # ||y - exact||
    if axis == "n":
        # each output feature is the same dot product of K terms as in y: within the
        # unsharded bound of the exact result, hence within twice that of y
        y_cat = np.concatenate([_gemm32(x, s) for s in shards], axis=1)
        assert_close(y_cat, exact, unsharded / np.linalg.norm(exact), f"{name}: concatenated vs exact")
        assert_close(y_cat, y, 2 * unsharded / np.linalg.norm(y), f"{name}: concatenated vs unsharded")
        return
    partial, parts_info = np.zeros((M, n), np.float32), []
    for i, s in enumerate(shards):
        xi = x[:, i * step:(i + 1) * step]
        partial += _gemm32(xi, s).astype(np.float32)  # the all-reduce: fp32, one part at a time
        parts_info.append((xi, s.dequantize(), reference.gemm(xi, s.dequantize(), _bias(s))))
    if w.bias is not None:  # the all-reduce adds the parts' outputs: one part holds the bias
        assert shards[0].bias is not None and all(s.bias is None for s in shards[1:])
    reduced = all_reduce_error(parts_info)
    assert_close(partial, exact, reduced / np.linalg.norm(exact), f"{name}: summed parts vs exact")
    assert_close(partial, y, (reduced + unsharded) / np.linalg.norm(y), f"{name}: summed parts vs unsharded")


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_frag_shard_is_the_repack_of_the_canonical_shard(rng, group_size, symmetric, assert_bitwise_equal):
    """Cuts on 16-row blocks and 128-k chunks, equal and unequal parts; N = 40 and (for
    G < 128) K = 320 are padded in the frag planes (to 48 and 384), and the last part keeps
    that padding, exactly as the repack of its canonical shard pads it."""
    k = 320 if group_size < 128 else 640
    w = random_int4(rng, 40, k, group_size, symmetric, BF16)
    f = w.repack()
    splits = [("n", [16, 24]), ("n", [32, 8]), ("k", [128, k - 128]), ("k", [256, k - 256]),
              ("n", 1), ("k", 1)]
    for axis, parts in splits:
        for i in range(parts if isinstance(parts, int) else len(parts)):
            got, canon = f.shard(axis, parts, i), w.shard(axis, parts, i)
            want = canon.repack()
            ref = FR.repack(canon.qweight, canon.scales, canon.qzeros, group_size)
            for c, r in zip(("qweight", "scales", "qzeros"), ref):
                if r is None:
                    assert getattr(got, c) is None
                    continue
                name = f"frag {axis} {parts} part {i} {c}"
                flat = np.asarray(getattr(got, c)).reshape(-1)
                assert_bitwise_equal(flat, np.asarray(getattr(want, c)).reshape(-1), name)
                assert_bitwise_equal(flat, r.reshape(-1), name + " (numpy repack)")
    g = random_int4(rng, 64, 512, group_size, symmetric, BF16)
    for axis in ("n", "k"):
        for i in range(4):
            got, want = g.repack().shard(axis, 4, i), g.shard(axis, 4, i).repack()
            for c in ("qweight", "scales", "qzeros"):
                if getattr(want, c) is not None:
                    assert_bitwise_equal(getattr(got, c), getattr(want, c), f"frag {axis} x4 part {i} {c}")


def _source_bytes(w, component: str, padded=None) -> np.ndarray:
    """The bytes of a host component as they lie in memory (a GGUF raw with padded rows:
    the padded buffer it is a window of)."""
    if padded is not None:
        return padded.reshape(-1)
    return np.ascontiguousarray(getattr(w, component)).reshape(-1).view(np.uint8)


def _gather(buf: np.ndarray, c) -> bytes:
    """cudaMemcpy2D as the plan states it: `height` runs of `width` bytes, `pitch` apart."""
    return b"".join(buf[c.offset + r * c.pitch: c.offset + r * c.pitch + c.width].tobytes()
                    for r in range(c.height))


@pytest.mark.parametrize("axis", ["n", "k"])
@pytest.mark.parametrize("case", ["int4-g128-asym-bf16", "int4-frag-g64-asym", "q6_K", "mxfp4-bias",
                                  "mxfp4-frag-bias", "int4-frag-g128-bias", "q4_K-bias", "gguf-padded-rows"])
def test_plan_copies_are_the_byte_slices(rng, case, axis):
    if case == "gguf-padded-rows":  # rows 16 bytes apart in host memory, as to_device() lays them
        raw = pyquant.formats.get("q6_K").module.random_blocks(rng, 40, 1024)  # rows of 840 bytes
        padded = np.zeros((40, 848), np.uint8)
        padded[:, :840] = raw
        w = pyquant.GGUFWeight("q6_K", padded[:, :840])
        assert w.ldw == 848
    else:
        make, n, k = CASES[case]
        w, padded = make(rng, n, k), None
    for parts in (2, [w.shape[0] - 8, 8] if axis == "n" and "frag" not in case else 4):
        count = parts if isinstance(parts, int) else len(parts)
        for i in range(count):
            p = S.plan(w, axis, parts, i)
            s = w.shard(axis, parts, i)
            assert p.shape == s.shape
            for c in p.copies:
                src = _source_bytes(w, c.component, padded)
                got = _gather(src, c)
                assert got == np.ascontiguousarray(getattr(s, c.component)).tobytes(), \
                    f"{case} {axis} {parts} part {i}: plan copy {c} is not the shard's bytes"
                assert c.contiguous == (c.height == 1 or c.pitch == c.width)


def _refusal(w, axis, parts, index=0) -> str:
    with pytest.raises(pyquant.InvalidArgumentError) as e:
        w.shard(axis, parts, index)
    return str(e.value)


def test_refusals_name_the_rule(rng):
    w = random_int4(rng, 48, 1024, 128, False, BF16)
    assert _refusal(w, "k", 3) == (
        "k=1024: a row-parallel split of an int4 weight with group_size=128 must cut K at "
        "multiples of 128 (one scale and zero-point cover 128 inputs); 1024/3 is not")
    assert _refusal(w, "k", 16).endswith("must cut K at multiples of 128 (one scale and zero-point "
                                         "cover 128 inputs); 1024/16 = 64 is not")
    assert _refusal(w, "n", 4) == (
        "n=48: a column-parallel split of an int4 weight with group_size=128 must cut N at "
        "multiples of 8 (qzeros pack the zero-points of 8 rows into one int32 word); 48/4 = 12 is not")
    assert "the cut at K=704 (parts=[704, 320]) is not" in _refusal(w, "k", [704, 320])
    f = w.repack()
    assert _refusal(f, "n", 6) == (
        "n=48: a column-parallel split of a frag-layout int4 weight (group_size=128) must cut N at "
        "multiples of 16 (whole 16-row blocks of the frag planes); 48/6 = 8 is not; to cut elsewhere, "
        "shard the canonical weight and repack each part: w.repack('canonical').shard(...).repack() "
        "on host weights")
    f32 = random_int4(rng, 32, 1024, 32, True, BF16).repack()
    assert "must cut K at multiples of 128 (whole 128-k chunks of the frag planes); 1024/16 = 64 is not" \
        in _refusal(f32, "k", 16)
    assert "the cut at N=8 (parts=[8, 24]) is not" in _refusal(f32, "n", [8, 24])
    q = random_gguf(rng, "q4_K", 40, 2048)
    assert _refusal(q, "k", 16) == (
        "k=2048: a row-parallel split of a q4_K weight must cut K at multiples of 256 (one q4_K "
        "block covers 256 inputs); 2048/16 = 128 is not")
    assert _refusal(q, "n", 3) == (
        "n=40: a column-parallel split of a q4_K weight into 3 equal parts needs N % parts == 0; "
        "40/3 is not an integer (parts may be a list of sizes)")
    assert q.shard("n", [14, 13, 13], 2).shape == (13, 2048)
    m = random_mxfp4(rng, (8,), 96)
    assert "must cut K at multiples of 32 (one E8M0 scale covers a block of 32 inputs); 96/2 = 48 is not" \
        in _refusal(m, "k", 2)
    assert _refusal(m, "expert", 2) == ("axis='expert': MXFP4Weight of shape (8, 96) has no expert axis "
                                        "(its axes are n, k)")
    assert _refusal(m, "m", 2) == "axis='m' is not one of 'n', 'k' or an index into shape (8, 96)"
    assert _refusal(m, 2, 2).startswith("axis=2 is not one of")
    assert _refusal(m, "n", 0) == "parts=0 must be at least 1"
    assert _refusal(m, "n", [4, 3]) == "parts=[4, 3] must be positive sizes that add up to N=8"
    assert _refusal(m, "n", [8, 0]).startswith("parts=[8, 0] must be positive sizes")
    assert _refusal(m, "n", 2, 2) == "index=2 is not a part of 2 (0..1)"
    assert _refusal(m, "n", 2, -1) == "index=-1 is not a part of 2 (0..1)"
    bad = pyquant.Int4Weight(np.zeros((8, 12), np.int32), np.ones((8, 1), F16), None, 128)  # K = 96
    said = _refusal(bad, "n", 1)
    assert said.startswith("cannot shard") and said.endswith("k=96 is not a multiple of group_size=128")


def test_axes_by_index_and_one_part(rng, assert_bitwise_equal):
    w = random_mxfp4(rng, (4, 16), 64, bias_dtype=F32)  # stacked experts: axes expert, n, k
    assert S.axes(w) == ("expert", "n", "k")
    for by_index, by_name in ((0, "expert"), (1, "n"), (-1, "k"), ("N", "n")):
        a, b = w.shard(by_index, 2, 1), w.shard(by_name, 2, 1)
        assert_bitwise_equal(a.blocks, b.blocks, f"axis {by_index!r}")
    whole = w.shard("k", 1, 0)
    for c in ("blocks", "scales", "bias"):
        assert_bitwise_equal(getattr(whole, c), getattr(w, c), f"one part: {c}")
    assert whole.blocks is not w.blocks  # a copy, never an alias of the source


def _moe_sum(x, ids, wts, parts):
    y = np.zeros((x.shape[0], parts[0][1].shape[1]), np.float32)
    for w13, w2, ids_r, wts_r in parts:
        y += np.asarray(pyquant.moe(x, ids_r, wts_r, w13, w2, out_dtype=F32), np.float32)
    return y


def _moe_error(h, inter_parts, refs) -> float:
    """all_reduce_error for MoE layers: each part within moe_bound of its exact result (fp32
    x: the activation stays fp32), and p - 1 fp32 roundings of the sum."""
    total = sum(moe_bound(h, i, F32, F32) * np.linalg.norm(r) for i, r in zip(inter_parts, refs))
    return total + (len(refs) - 1) * U32 * np.linalg.norm(sum(np.abs(r) for r in refs))


def _check_moe_sum(got, y, exact, h, inter, inter_parts, refs, name, assert_close):
    reduced = _moe_error(h, inter_parts, refs)
    assert_close(got, exact, reduced / np.linalg.norm(exact), f"{name}: summed parts vs exact")
    unsharded = moe_bound(h, inter, F32, F32) * np.linalg.norm(exact)
    assert_close(got, y, (reduced + unsharded) / np.linalg.norm(y), f"{name}: summed parts vs unsharded")


@pytest.mark.parametrize("parts", PARTS)
def test_expert_parallel_moe(rng, parts, assert_close, assert_bitwise_equal):
    """Each part owns E/p whole experts (biases with them); a token-expert pair of another
    part's expert is given to local expert 0 with weight 0 (qg_moe_align takes ids in
    [0, E) only), so each part's layer is its experts' share and the sum is the layer."""
    e, top_k, h, inter, t = 16, 2, 64, 64, 9  # 8 parts of 2 experts: top_k <= E of a part
    x, ids, wts, w13, w2 = _moe_inputs(rng, t, e, top_k, h, inter, F32, True)
    y = np.asarray(pyquant.moe(x, ids, wts, w13, w2, out_dtype=F32), np.float64)
    exact = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), _bias(w13), _bias(w2))
    per = e // parts
    runs, refs = [], []
    for r in range(parts):
        a, b = w13.shard("expert", parts, r), w2.shard("expert", parts, r)
        assert a.shape == (per, 2 * inter, h) and b.shape == (per, h, inter)
        own = slice(r * per, (r + 1) * per)
        assert_bitwise_equal(a.dequantize(), w13.dequantize()[own], f"w13 experts of part {r}")
        assert_bitwise_equal(np.asarray(b.bias), np.asarray(w2.bias)[own], f"w2 bias of part {r}")
        mine = (ids >= r * per) & (ids < (r + 1) * per)
        ids_r = np.where(mine, ids - r * per, 0).astype(np.int32)
        wts_r = np.where(mine, wts, 0).astype(np.float32)
        runs.append((a, b, ids_r, wts_r))
        refs.append(reference.moe(x, ids_r, wts_r, a.dequantize(), b.dequantize(), _bias(a), _bias(b)))
    _check_moe_sum(_moe_sum(x, ids, wts, runs), y, exact, h, inter, [inter] * parts, refs,
                   f"expert-parallel moe x{parts}", assert_close)


@pytest.mark.parametrize("parts", PARTS)
def test_tensor_parallel_moe(rng, parts, assert_close):
    """w13 (interleaved gate/up rows: row 2i gate i, 2i+1 up i) column-parallel, so a part
    of 2I/p rows holds gate and up of the same I/p intermediates; w2 row-parallel on those
    intermediates, its bias on part 0 only; every part routes all tokens."""
    e, top_k, h, inter, t = 4, 2, 64, 256, 9
    x, ids, wts, w13, w2 = _moe_inputs(rng, t, e, top_k, h, inter, F32, True)
    y = np.asarray(pyquant.moe(x, ids, wts, w13, w2, out_dtype=F32), np.float64)
    exact = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), _bias(w13), _bias(w2))
    runs, refs = [], []
    for r in range(parts):
        a, b = w13.shard("n", parts, r), w2.shard("k", parts, r)
        assert a.shape == (e, 2 * inter // parts, h) and b.shape == (e, h, inter // parts)
        assert (b.bias is None) == (r > 0)
        runs.append((a, b, ids, wts))
        refs.append(reference.moe(x, ids, wts, a.dequantize(), b.dequantize(), _bias(a), _bias(b)))
    _check_moe_sum(_moe_sum(x, ids, wts, runs), y, exact, h, inter, [inter // parts] * parts, refs,
                   f"tensor-parallel moe x{parts}", assert_close)


def _same_bytes(a, b) -> bool:
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


DEVICE_CASES = ["int4-g128-asym-bf16", "int4-frag-g64-asym", "q6_K", "q4_K", "mxfp4-bias", "mxfp4-frag-bias",
                "int4-frag-g128-bias", "q4_K-bias"]


def _device_shards(rng, ctx, case, axis):
    """(host shard, device shard) pairs of part 0 and 1; the device shard's bytes are checked
    against the host shard's, GGUF rows must stay 16 bytes apart."""
    make, n, k = CASES[case]
    w = make(rng, n, k)
    # int4, mxfp4: the host weight's own layout (a GPU context's "auto" would repack a
    # canonical weight to frag; the frag cases cover that layout)
    wd = w.to_device(ctx, layout=w.layout) if hasattr(w, "layout") else w.to_device(ctx)
    pairs = []
    for i in range(2):
        sh, sd = w.shard(axis, 2, i), wd.shard(axis, 2, i)
        assert sd.ctx is ctx and sd.shape == sh.shape
        assert getattr(sd, "layout", None) == getattr(sh, "layout", None)
        back = sd.to_host()
        for c in sh._component_names:
            a, b = getattr(sh, c), getattr(back, c)
            assert (a is None) == (b is None), f"{case} {axis} part {i}: {c}"
            assert a is None or _same_bytes(a, b), f"{case} {axis} part {i}: {c} bytes differ"
        if isinstance(wd, pyquant.GGUFWeight):
            assert sd.ldw % 16 == 0, f"{case} {axis} part {i}: rows {sd.ldw} bytes apart, not padded to 16"
        pairs.append((sh, sd))
    return pairs


@pytest.mark.parametrize("axis", ["n", "k"])
@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_resident_shards(rng, case, axis, assert_bitwise_equal):
    """n shards: one qg_memcpy per component (GGUF rows keep their 16-byte stride); k
    shards: through the host, GGUF rows padded again. A CPU context's DeviceArrays run the
    device path; the CPU tier gives the host shard's output bit for bit."""
    ctx = pyquant.Context("cpu")
    for i, (sh, sd) in enumerate(_device_shards(rng, ctx, case, axis)):
        x = random_x(rng, M, sh.shape[1], BF16)
        y_dev = pyquant.gemm(pyquant.DeviceArray.from_numpy(x, ctx), sd, out_dtype=F32).to_numpy()
        assert_bitwise_equal(y_dev, pyquant.gemm(x, sh, out_dtype=F32), f"{case} {axis} part {i}: gemm")


def test_device_resident_stacked_experts(rng, assert_bitwise_equal):
    ctx = pyquant.Context("cpu")
    w = random_mxfp4(rng, (4, 16), 64, bias_dtype=F32)
    wd = w.to_device(ctx)
    for axis in ("expert", "n", "k"):  # contiguous, strided (per expert), strided
        for i in range(2):
            sh, sd = w.shard(axis, 2, i), wd.shard(axis, 2, i).to_host()
            for c in ("blocks", "scales", "bias"):
                a, b = getattr(sh, c), getattr(sd, c)
                assert (a is None) == (b is None)
                if a is not None:
                    assert_bitwise_equal(b, a, f"stacked {axis} part {i} {c}")


@pytest.mark.gpu
@pytest.mark.parametrize("axis", ["n", "k"])
@pytest.mark.parametrize("case", DEVICE_CASES)
def test_gpu_resident_shards(rng, gpu_ctx, case, axis):
    """The same bytes on a GPU: device-to-device copies and host round trips (the GPU
    tiers' results on such weights are tests/test_gpu_gemm.py's business)."""
    _device_shards(rng, gpu_ctx, case, axis)
