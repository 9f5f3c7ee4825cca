"""MXFP4 mixture of experts on the GPU tiers (marked `gpu`: skipped where no GPU context can
be created, and where the build has no GPU tier for moe) against the numpy reference.

align: the GPU tables equal reference.moe_align element for element (sorted ids, tile
experts, count) for tile_m 16 / 32 / 64, T in 1, 3, 64, 300, experts with no tokens and all
tokens on one expert. The layer (align + stage 1 + stage 2, pyquant.moe on device arrays,
the experts in the MoE frag layout of pyquant.moe_repack): tile_m x activation x gate / up
layout x activation dtype; T in 1, 3, 64, 300; biases; intermediate = 32 (one row block
pair for stage 1's first thread block, whose other warps own no channel) and hidden = 96
(stage 2's last row tile partial); K split in 4 / 2 parts (T = 1, H = 2048, I = 1024); tile_m = 64 on
the grouped wgmma tier and on the mma.sync tiles, each forced by name; the output poisoned with guard bands, every element
compared (normalised error under a named bound, no fraction escape). Stage 1 alone writes
every pair's row of act and nothing outside it (guard rows poisoned). K cut in 1, 2 or 4
slices inside a block of the tile_m = 16 launches (forced in a child process), and the rule
that slices GPT-OSS's stage 1 at T = 1.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant import DeviceArray, _lib, tiers
from pyquant.formats import reference
from test_api_cpu import moe_bound, random_mxfp4

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def _need(gpu_ctx):
    names = tiers.tiers().get("moe", [])
    if not any(tiers.backend_of(t) in ("cuda", "hip") for t in names):
        pytest.skip(f"this build has no GPU tier for moe: {pyquant.build_info()}")


def _routing(rng, t, e, top_k, one_expert=False):
    if one_expert:  # every token on expert e - 1 (the others get no pair), top_k = 1
        return np.full((t, 1), e - 1, np.int32), np.ones((t, 1), np.float32)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, size=(t, top_k)).astype(np.float32)
    return ids, wts / wts.sum(axis=1, keepdims=True)


def _align_gpu(gpu_ctx, ids, e, tile_m):
    t, top_k = ids.shape
    ms, mt = ctypes.c_int64(), ctypes.c_int64()
    _lib.qg_moe_align_sizes(t, top_k, e, tile_m, ctypes.byref(ms), ctypes.byref(mt))
    d_ids = DeviceArray.from_numpy(ids, gpu_ctx)
    # poisoned outputs: the kernel must write every element
    sv = DeviceArray.from_numpy(np.full(ms.value, -7, np.int32), gpu_ctx)
    tv = DeviceArray.from_numpy(np.full(mt.value, -7, np.int32), gpu_ctx)
    nv = DeviceArray.from_numpy(np.full(1, -7, np.int32), gpu_ctx)
    _lib.qg_moe_align(gpu_ctx.handle, ctypes.byref(_lib.qg_moe_align_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=tile_m, topk_ids=d_ids.ptr, sorted_ids=sv.ptr,
        tile_experts=tv.ptr, num_sorted=nv.ptr)), None)
    gpu_ctx.synchronize()
    return sv.to_numpy(), tv.to_numpy(), int(nv.to_numpy()[0])


@pytest.mark.parametrize("tile_m", [16, 32, 64])
@pytest.mark.parametrize("t,e,top_k,one", [(1, 128, 4, False), (3, 8, 2, False), (64, 32, 4, False),
                                           (300, 16, 4, False), (64, 8, 1, True), (300, 1024, 8, False)])
def test_gpu_align_is_the_reference(rng, gpu_ctx, tile_m, t, e, top_k, one):
    _need(gpu_ctx)
    ids, _ = _routing(rng, t, e, top_k, one)
    s, te, n = _align_gpu(gpu_ctx, ids, e, tile_m)
    rs, rte, rn = reference.moe_align(ids, e, tile_m)
    assert n == rn, f"num_sorted {n} != {rn}"
    assert np.array_equal(s, rs), f"sorted_ids differ at {np.flatnonzero(s != rs)[:8]}"
    assert np.array_equal(te, rte), f"tile_experts differ at {np.flatnonzero(te != rte)[:8]}"


def _layer(rng, t, e, top_k, h, inter, x_dt, bias=True, one=False):
    w13 = random_mxfp4(rng, (e, 2 * inter), h, bias_dtype=F32 if bias else None)
    w2 = random_mxfp4(rng, (e, h), inter, bias_dtype=BF16 if bias else None)
    x = rng.standard_normal((t, h)).astype(np.float32)
    if x_dt == F16:
        x *= 0.25  # keeps silu_glu's quadratic growth inside fp16 (tests/test_api_cpu.py)
    ids, wts = _routing(rng, t, e, top_k, one)
    return x.astype(x_dt), ids, wts, w13, w2


def _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, layout, activation, tile_m, y_dt):
    d13, d2 = pyquant.moe_repack(w13, w2, layout, ctx=gpu_ctx)
    g = poisoned_output(x.shape[0], x.shape[1], y_dt, device_ctx=gpu_ctx)
    dx, dids, dwts = (DeviceArray.from_numpy(a, gpu_ctx) for a in (x, ids, wts))
    pyquant.moe(dx, dids, dwts, d13, d2, activation=activation, gate_up_layout=layout, tile_m=tile_m,
                ctx=gpu_ctx, out=g.y)
    gpu_ctx.synchronize()
    return g.value()


@pytest.mark.parametrize("tile_m", [16, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("activation", ["swiglu_oai", "silu_glu"])
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@pytest.mark.parametrize("x_dt", [BF16, F16])
def test_gpu_moe_against_reference(rng, gpu_ctx, poisoned_output, assert_close, tile_m, activation, layout, x_dt):
    _need(gpu_ctx)
    e, top_k, h, inter = 8, 2, 96, 32
    if tile_m in (80, 96, 256) and x_dt == F16:  # no fp16 wgmma tile of 80, 96, 256 tokens: refused, naming why
        x, ids, wts, w13, w2 = _layer(rng, 3, e, top_k, h, inter, x_dt)
        with pytest.raises(pyquant.QuantGemmError, match="tile_m"):
            _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, layout, activation, tile_m, x_dt)
        return
    for t in (1, 3, 64, 300):
        x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, x_dt)
        y = _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, layout, activation, tile_m, x_dt)
        ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), np.asarray(w13.bias),
                            np.asarray(w2.bias).astype(np.float32), activation=activation,
                            gate_up_layout=layout, act_dtype=x_dt)
        assert_close(y, ref, moe_bound(h, inter, x_dt, x_dt),
                     f"gpu moe {activation} {layout} x={x_dt} tile_m={tile_m} t={t}")


@pytest.mark.parametrize("case", ["one_expert", "gpt_oss_shape", "gpt_oss_t1", "split_k", "fp32_out", "no_bias"])
def test_gpu_moe_shapes(rng, gpu_ctx, poisoned_output, assert_close, case):
    """All tokens on one expert (the others idle); GPT-OSS sizes (H = I = 2880: K not a
    multiple of 128, many row tiles) at T = 5 with 32 experts, and at T = 1 (stage 2's own
    split of K in 4 parts: its 92 blocks in use fill no GPU of 92 SMs or more); T = 1 with
    H = 2048, I = 1024 and the split_k option at 4 (K in 4 and 2 parts, added in order); fp32 y;
    no biases."""
    _need(gpu_ctx)
    e, top_k, h, inter, t, y_dt, bias = 8, 2, 128, 64, 40, BF16, True
    if case == "gpt_oss_shape":
        e, top_k, h, inter, t = 32, 4, 2880, 2880, 5
    if case == "gpt_oss_t1":
        e, top_k, h, inter, t = 32, 4, 2880, 2880, 1
    if case == "split_k":  # split_k = 4: stage 1 K = 2048 in 4 parts, stage 2 K = 1024 in 2
        e, top_k, h, inter, t = 8, 2, 2048, 1024, 1
    if case == "fp32_out":
        y_dt = F32
    if case == "no_bias":
        bias = False
    x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, BF16, bias=bias, one=case == "one_expert")
    gpu_ctx.set_option("split_k", 4 if case == "split_k" else 0)
    try:
        y = _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, "interleaved", "swiglu_oai", 16, y_dt)
    finally:
        gpu_ctx.set_option("split_k", 0)
    b13 = None if not bias else np.asarray(w13.bias)
    b2 = None if not bias else np.asarray(w2.bias).astype(np.float32)
    ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), b13, b2, act_dtype=BF16)
    assert_close(y, ref, moe_bound(h, inter, BF16, y_dt), f"gpu moe {case}")


@pytest.mark.parametrize("tile_m", [32, 64])
@pytest.mark.parametrize("tier", ["moe_wgmma", "moe_mma"])
def test_gpu_moe_tiers_by_name_at_tiles_32_and_64(rng, gpu_ctx, poisoned_output, assert_close, tier, tile_m):
    """tile_m = 32 and 64 (bf16 x) run on the grouped wgmma tier under auto (sm_90a); each
    stage tier forced by name in turn (the mma.sync tiles serve them as well), against the
    reference: T = 300 and 5 (tiles mostly empty), 16 experts, K not a multiple of 128 in both
    stages."""
    _need(gpu_ctx)
    name = next((t for t in tiers.tiers().get("moe", []) if t.endswith(f":{tier}")), None)
    if name is None:
        pytest.skip(f"no {tier} tier in this build: {pyquant.build_info()}")
    e, top_k, h, inter = 16, 4, 352, 160
    gpu_ctx.set_tier("moe", name)
    try:
        for t in (300, 5):
            x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, BF16)
            try:
                y = _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, "concat", "swiglu_oai", tile_m, BF16)
            except pyquant.QuantGemmError as err:
                if tier == "moe_wgmma" and "sm_90" in str(err):
                    pytest.skip(f"no wgmma here: {err}")
                raise
            ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), np.asarray(w13.bias),
                                np.asarray(w2.bias).astype(np.float32), gate_up_layout="concat", act_dtype=BF16)
            assert_close(y, ref, moe_bound(h, inter, BF16, BF16), f"gpu moe {name} tile_m={tile_m} t={t}")
    finally:
        gpu_ctx.set_tier("moe", "auto")


def test_gpu_moe_default_tile_falls_back_where_128_is_refused(rng, gpu_ctx, poisoned_output, assert_close):
    """pyquant.moe without tile_m takes 256-token expert tiles for bf16 x on a GPU above 136 rows
    an expert (default_tile_m); where the stages refuse it (here: the mma.sync tier forced by
    name, as on a GPU without the grouped wgmma tier) the call reruns at 64, the context
    remembers it, and the result is the reference's."""
    _need(gpu_ctx)
    name = next((t for t in tiers.tiers().get("moe", []) if t.endswith(":moe_mma")), None)
    if name is None:
        pytest.skip(f"no moe_mma tier in this build: {pyquant.build_info()}")
    e, top_k, h, inter, t = 4, 2, 256, 128, 600  # 300 rows an expert: default tile 256 (bf16 x)
    assert pyquant.api.default_tile_m(t, top_k, e, 256) == 256
    x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, BF16)
    gpu_ctx.set_tier("moe", name)
    try:
        y = _run_moe(gpu_ctx, poisoned_output, x, ids, wts, w13, w2, "interleaved", "swiglu_oai", None, BF16)
        assert gpu_ctx._moe_widest == 64
    finally:
        gpu_ctx.set_tier("moe", "auto")
        gpu_ctx.__dict__.pop("_moe_widest", None)
    ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), np.asarray(w13.bias),
                        np.asarray(w2.bias).astype(np.float32), act_dtype=BF16)
    assert_close(y, ref, moe_bound(h, inter, BF16, BF16), "gpu moe default tile after the fallback")


@pytest.mark.parametrize("tile_m", [16, 32, 128])
def test_gpu_stage1_writes_every_pair_row_and_nothing_else(rng, gpu_ctx, assert_close, tile_m):
    """Stage 1 alone into an act buffer with poisoned guard rows before and after: every
    pair's row is the reference activation, the guards keep their bits. tile_m = 16: the
    mma.sync tiles; 32 and 128: the grouped wgmma tier on sm_90a (32 on the mma.sync tiles
    elsewhere), its activation in the epilogue, I = 32 half of one row tile's 64 channels; the
    workspace is zero again afterwards."""
    _need(gpu_ctx)
    if tile_m == 128 and not any(t.endswith(":moe_wgmma") for t in tiers.tiers().get("moe", [])):
        pytest.skip(f"no moe_wgmma tier in this build: {pyquant.build_info()}")
    e, top_k, h, inter, t, guard = 4, 2, 64, 32, 7, 3
    x, ids, _, w13, w2 = _layer(rng, t, e, top_k, h, inter, BF16)
    d13, _ = pyquant.moe_repack(w13, w2, "interleaved", ctx=gpu_ctx)
    ms, mt = ctypes.c_int64(), ctypes.c_int64()
    _lib.qg_moe_align_sizes(t, top_k, e, tile_m, ctypes.byref(ms), ctypes.byref(mt))
    s, te, n = reference.moe_align(ids, e, tile_m)
    dx, ds, dte, dn = (DeviceArray.from_numpy(a, gpu_ctx) for a in (x, s, te, np.array([n], np.int32)))
    poison = np.full((guard + t * top_k + guard, inter), np.nan, np.float32).astype(BF16)
    act = DeviceArray.from_numpy(poison, gpu_ctx)
    row_bytes = inter * 2
    args = _lib.qg_moe_stage1_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=tile_m, hidden=h, intermediate=inter,
        x_dtype=_lib.DType.QG_DTYPE_BF16, x=dx.ptr, ldx=h, sorted_ids=ds.ptr, tile_experts=dte.ptr,
        num_sorted=dn.ptr, w13_blocks=d13.blocks.ptr, w13_scales=d13.scales.ptr, w13_bias=d13.bias.ptr,
        bias_dtype=_lib.DType.QG_DTYPE_F32, activation=_lib.Activation.QG_ACT_SWIGLU_OAI,
        gate_up_layout=_lib.GateUpLayout.QG_GATE_UP_INTERLEAVED, swiglu_alpha=1.702, swiglu_limit=7.0,
        act=act.ptr + guard * row_bytes, layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG)
    ws_bytes = ctypes.c_size_t()
    _lib.qg_moe_stage1_workspace_size(gpu_ctx.handle, ctypes.byref(args), ctypes.byref(ws_bytes))
    ws = DeviceArray.from_numpy(np.zeros(max(ws_bytes.value, 1), np.uint8), gpu_ctx)
    args.workspace, args.workspace_bytes = (ws.ptr, ws_bytes.value) if ws_bytes.value else (None, 0)
    _lib.qg_moe_stage1(gpu_ctx.handle, ctypes.byref(args), None)
    gpu_ctx.synchronize()
    assert not ws.to_numpy().any(), "stage 1 left its workspace non-zero"
    got = act.to_numpy()
    assert np.isnan(got[:guard].astype(np.float32)).all() and np.isnan(got[-guard:].astype(np.float32)).all(), \
        "stage 1 wrote outside act"
    rows = got[guard:-guard].astype(np.float64)
    w13d = w13.dequantize().astype(np.float64)
    b13 = np.asarray(w13.bias).astype(np.float64)
    want = np.empty_like(rows)
    for p in range(t * top_k):
        hrow = x[p // top_k].astype(np.float64) @ w13d[ids.flat[p]].T + b13[ids.flat[p]]
        want[p] = reference.swiglu_oai(hrow[0::2], hrow[1::2])
    assert_close(rows, want, moe_bound(h, 0, BF16, BF16), "stage 1 act rows")


def _stage2_planes(gpu_ctx, t, e, top_k, h, inter):
    """fp32 planes of [P, H] in stage 2's workspace at tile_m = 16 (no split_k option): the
    workspace query alone, which reads no operand (every pointer NULL)."""
    args = _lib.qg_moe_stage2_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=16, hidden=h, intermediate=inter,
        act_dtype=_lib.DType.QG_DTYPE_BF16, bias_dtype=_lib.DType.QG_DTYPE_BF16, y_dtype=_lib.DType.QG_DTYPE_BF16,
        ldy=h, layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG)
    got = ctypes.c_size_t()
    _lib.qg_moe_stage2_workspace_size(gpu_ctx.handle, ctypes.byref(args), ctypes.byref(got))
    plane = t * top_k * h * 4
    assert got.value % plane < 256, f"{got.value} bytes is not whole planes of {plane}"
    return got.value // plane


@pytest.mark.parametrize("t,e,planes", [(1, 128, 4), (2, 128, 2), (4, 128, 1), (8, 128, 2), (8, 32, 1), (64, 32, 2),
                                        (128, 32, 1), (64, 4, 1)])
def test_gpu_moe_stage2_splits_by_its_waves(gpu_ctx, t, e, planes):
    """Stage 2 on the mma.sync tiles, no split_k option, GPT-OSS's H = I = 2880 (23 row tiles),
    top 4, tile_m 16, on the 132 SMs of an H100 or H200 (4 blocks an SM: 528 slots; blocks in
    use estimated from the experts a uniform routing hits, src/gpu/moe_launch.cpp
    mma_splits): fewer blocks than SMs (T = 1: 23 x 4 = 92) 4 parts; below half a wave
    (T = 2 of 128 experts: ~8 hit, 184 blocks) 2; within one wave (T = 4 of 128: ~16 hit,
    368; T = 8 of 32: ~21 hit, 483; T = 64 of 4: 18 tiles, 414) none; past one wave by at
    most half (T = 8 of 128: ~29 hit, 667; T = 64 of 32: all 32, 736) 2; past one and a half
    (T = 128 of 32: ~48 tiles, 1104) none. The sums of split parts are checked against the
    reference by test_gpu_moe_shapes (gpt_oss_t1) and the layer tests at T = 3 and 64."""
    _need(gpu_ctx)
    if not any(name in gpu_ctx.device_name for name in ("H100", "H200")):  # 132 SMs (the rule's numbers)
        pytest.skip(f"the block counts here are an H100's or H200's, not {gpu_ctx.device_name}'s")
    assert _stage2_planes(gpu_ctx, t, e, 4, 2880, 2880) == planes


# MoE layers in a fresh interpreter (the library reads QG_EXP_MOE_FUSED_ACT, QG_EXP_MOE_SLICES
# and QG_LOG once per process): argv holds pairs of inputs (.npz of _layer_file) and the file
# for y's bits.
_LAYER_CHILD = """
import sys
import ml_dtypes, numpy as np, pyquant
ctx = pyquant.gpu_context()
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
    d = np.load(src)
    w13 = pyquant.from_mxfp4(d["b13"], d["s13"], d["bias13"])
    w2 = pyquant.from_mxfp4(d["b2"], d["s2"], d["bias2"])
    layout, activation, tile_m = str(d["layout"]), str(d["activation"]), int(d["tile_m"])
    d13, d2 = pyquant.moe_repack(w13, w2, layout, ctx=ctx)
    x = pyquant.DeviceArray.from_numpy(d["x"].view(np.dtype(str(d["x_dt"]))), ctx)
    ids, wts = (pyquant.DeviceArray.from_numpy(d[k], ctx) for k in ("ids", "wts"))
    y = pyquant.moe(x, ids, wts, d13, d2, activation=activation, gate_up_layout=layout, tile_m=tile_m, ctx=ctx)
    ctx.synchronize()
    np.save(dst, np.ascontiguousarray(y.to_numpy()).view(np.uint16))
"""


def _layer_file(path, x, ids, wts, w13, w2, layout, activation, tile_m):
    np.savez(path, x=x.view(np.uint16), x_dt=np.array(x.dtype.name), ids=ids, wts=wts, b13=np.asarray(w13.blocks),
             s13=np.asarray(w13.scales), bias13=np.asarray(w13.bias), b2=np.asarray(w2.blocks),
             s2=np.asarray(w2.scales), bias2=np.asarray(w2.bias).astype(np.float32), layout=np.array(layout),
             activation=np.array(activation), tile_m=np.array(tile_m))


def _run_children(tmp_path, files, env):
    """y of each layer file (as uint16 bits) from one child process, and its stderr."""
    argv = []
    for f in files:
        argv += [str(f), str(f.with_suffix(".y.npy"))]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("QG_EXP_")}  # only `env`'s switches
    p = subprocess.run([sys.executable, "-c", _LAYER_CHILD, *argv], env=dict(child_env, **env),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"child failed:\n{p.stderr[-2000:]}"
    return [np.load(f.with_suffix(".y.npy")) for f in files], p.stderr


@pytest.mark.parametrize("tile_m,activation,layout", [(32, "swiglu_oai", "interleaved"), (128, "swiglu_oai", "interleaved"),
                                                      (128, "silu_glu", "concat"), (256, "swiglu_oai", "concat")])
def test_gpu_moe_fused_activation_is_moe_act_bit_for_bit(rng, gpu_ctx, tmp_path, assert_close, tile_m, activation,
                                                        layout):
    """The grouped wgmma tier applies stage 1's activation in its epilogue (gate and up of 64
    channels in one row tile); QG_EXP_MOE_FUSED_ACT=0 restores fp32 gate / up rows and moe_act.
    The same layer in two child processes, one each way (their QG_LOG lines show which ran):
    the same bits, and the reference's values. I = 160 leaves the last row tile half in use
    (32 of 64 channels), H = 352 is K not a multiple of 128; T = 300 on 16 experts."""
    _need(gpu_ctx)
    if not any(t.endswith(":moe_wgmma") for t in tiers.tiers().get("moe", [])):
        pytest.skip(f"no moe_wgmma tier in this build: {pyquant.build_info()}")
    e, top_k, h, inter, t = 16, 4, 352, 160, 300
    x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, BF16)
    src = tmp_path / "layer.npz"
    _layer_file(src, x, ids, wts, w13, w2, layout, activation, tile_m)
    ys = {}
    for fused in ("1", "0"):
        (ys[fused],), err = _run_children(tmp_path, [src], dict(QG_LOG="1", QG_EXP_MOE_FUSED_ACT=fused))
        stage1 = [ln for ln in err.splitlines() if "moe stage1: grouped prefill_wgmma" in ln]
        assert stage1 and all(("activation in the epilogue" in ln) == (fused == "1") for ln in stage1), err[-2000:]
    assert np.array_equal(ys["1"], ys["0"]), \
        f"{np.count_nonzero(ys['1'] != ys['0'])} of {ys['1'].size} elements differ between the fused and moe_act paths"
    ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), np.asarray(w13.bias),
                        np.asarray(w2.bias).astype(np.float32), activation=activation, gate_up_layout=layout,
                        act_dtype=BF16)
    assert_close(ys["1"].view(BF16), ref, moe_bound(h, inter, BF16, BF16), f"gpu moe fused activation tile_m={tile_m}")


def _stage_slices(err, stage):
    """The slices= of each QG_LOG line of the stage's mma.sync launches."""
    return [int(ln.split("slices=")[1].split()[0]) for ln in err.splitlines()
            if f"moe {stage}: tile_m=" in ln and "slices=" in ln]


@pytest.mark.parametrize("slices", ["1", "2", "4"])
def test_gpu_moe_k_slices_against_reference(rng, gpu_ctx, tmp_path, assert_close, slices):
    """The mma.sync tiles at tile_m = 16 with K cut in 1, 2 or 4 slices inside a thread block
    (QG_EXP_MOE_SLICES, read once by the child process that runs the layers), both stages,
    against the reference: H = 1056 (stage 1's K is 9 chunks, the last partial: 2 or 3 a
    slice at 4), I = 544 (stage 2's K is 5 chunks: at 4 slices 1 or 2 each; stage 1's last row
    tile has 2 of its 4 warps in use), bf16 and fp16 x, T = 1 (top 4) and T = 3 (top 2) on 8
    experts. The QG_LOG lines name the slices each launch ran."""
    _need(gpu_ctx)
    e, h, inter = 8, 1056, 544
    cases, files = [], []
    for x_dt in (BF16, F16):
        for t, top_k in ((1, 4), (3, 2)):
            x, ids, wts, w13, w2 = _layer(rng, t, e, top_k, h, inter, x_dt)
            files.append(tmp_path / f"layer{len(files)}.npz")
            _layer_file(files[-1], x, ids, wts, w13, w2, "interleaved", "swiglu_oai", 16)
            cases.append((x_dt, t, x, ids, wts, w13, w2))
    ys, err = _run_children(tmp_path, files, dict(QG_LOG="1", QG_EXP_MOE_SLICES=slices))
    for stage in ("stage1", "stage2"):
        assert set(_stage_slices(err, stage)) == {int(slices)}, err[-2000:]
    for y, (x_dt, t, x, ids, wts, w13, w2) in zip(ys, cases):
        ref = reference.moe(x, ids, wts, w13.dequantize(), w2.dequantize(), np.asarray(w13.bias),
                            np.asarray(w2.bias).astype(np.float32), act_dtype=x_dt)
        assert_close(y.view(x_dt), ref, moe_bound(h, inter, x_dt, x_dt), f"gpu moe slices={slices} x={x_dt} t={t}")


def test_gpu_moe_stage1_slices_where_its_blocks_are_few(rng, gpu_ctx, tmp_path):
    """No QG_EXP_MOE_SLICES: at T = 1 on GPT-OSS's H = I = 2880 (top 4), stage 1 has 45 row
    tiles x 4 expert tiles = 180 blocks, which at 2 slices (two blocks of 256 threads an SM)
    all fit the 132 SMs of an H100 or H200 at once: 2 slices; stage 2 splits K across blocks
    instead (test_gpu_moe_stage2_splits_where_its_blocks_cannot_fill_the_gpu) and keeps 1. The
    values of this launch: test_gpu_moe_shapes (gpt_oss_t1)."""
    _need(gpu_ctx)
    if not any(name in gpu_ctx.device_name for name in ("H100", "H200")):  # 132 SMs (the rule's numbers)
        pytest.skip(f"the block counts here are an H100's or H200's, not {gpu_ctx.device_name}'s")
    x, ids, wts, w13, w2 = _layer(rng, 1, 4, 4, 2880, 2880, BF16)
    src = tmp_path / "layer.npz"
    _layer_file(src, x, ids, wts, w13, w2, "interleaved", "swiglu_oai", 16)
    _, err = _run_children(tmp_path, [src], dict(QG_LOG="1"))
    assert _stage_slices(err, "stage1") == [2] and _stage_slices(err, "stage2") == [1], err[-2000:]


def test_gpu_moe_refuses_canonical_experts(rng, gpu_ctx):
    """A canonical expert stack on a GPU context: UNSUPPORTED, naming qg_moe_repack."""
    _need(gpu_ctx)
    x, ids, wts, w13, w2 = _layer(rng, 3, 4, 2, 64, 32, BF16)
    c13, c2 = w13.to_device(gpu_ctx, layout="canonical"), w2.to_device(gpu_ctx, layout="canonical")
    with pytest.raises(pyquant.QuantGemmError, match="qg_moe_repack"):
        pyquant.moe(*(DeviceArray.from_numpy(a, gpu_ctx) for a in (x, ids, wts)), c13, c2, ctx=gpu_ctx)


def test_gpu_repack_is_the_cpu_repack(rng, gpu_ctx, assert_bitwise_equal):
    """qg_moe_repack on the GPU writes the CPU repack's planes byte for byte."""
    _need(gpu_ctx)
    w = random_mxfp4(rng, (3, 80), 96, e_range=(0, 255))
    for parts, gate_up in ((1, None), (2, "interleaved"), (2, "concat")):
        cpu = w.moe_repack(parts, gate_up, pyquant.cpu_context())
        gpu = w.moe_repack(parts, gate_up, gpu_ctx)
        assert_bitwise_equal(gpu.blocks.to_numpy(), np.asarray(cpu.blocks).reshape(gpu.blocks.shape),
                             f"blocks parts={parts} {gate_up}")
        assert_bitwise_equal(gpu.scales.to_numpy(), np.asarray(cpu.scales).reshape(gpu.scales.shape),
                             f"scales parts={parts} {gate_up}")
