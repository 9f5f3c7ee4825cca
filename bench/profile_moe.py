"""Device time of each launch of the GPU MoE layer (align, stage 1, stage 2 + its top-k sum)
and of the whole layer replayed from a CUDA graph (torch), which the bench's per-call Python
cannot show at small T. The bench's routing and weights; the experts in the MoE frag layout.

    python bench/profile_moe.py gpt-oss-120b 1,8,64,512,2048 [sides]
    QG_SPLIT_K=4 python bench/profile_moe.py gpt-oss-120b 1,8      (the context's split_k option)
    QG_MOE_TIER=cuda:moe_wgmma python bench/profile_moe.py gpt-oss-20b 512 64   (a forced tier)
    QG_ROUTING=balanced python bench/profile_moe.py gpt-oss-20b 2048 256   (every expert t k / e rows)
    python bench/profile_moe.py gpt-oss-120b 768,1024 32:cuda:moe_mma,32,64   (sides, interleaved)

sides: a comma list, each a tile_m (0: pyquant's default_tile_m) with an optional forced stage
tier after a colon; every T runs each side in turn, REPS times (environment, default 1), over
one set of experts.
    ncu -k regex:moe_gemm --launch-skip 3 --launch-count 2 python bench/profile_moe.py gpt-oss-120b 2048 0 ncu
"""
import ctypes
import itertools
import os
import sys

import ml_dtypes
import numpy as np

import pyquant
from pyquant import DeviceArray, _lib
from pyquant.api import default_tile_m
from pyquant.bench import cases as C

BF16 = ml_dtypes.bfloat16


ROUTINGS = 4  # distinct routings cycled through: the experts they hit rotate past the 60 MB L2
# QG_ROUTING=balanced: token t's experts (t k + j + r) % e, so that every expert holds the same
# rows (t k / e where e divides t k): the layer with no expert tile spilling past its rows,
# against which the random routing's padding cost reads
BALANCED = os.environ.get("QG_ROUTING", "random") == "balanced"


def experts(ctx, variant, rng):
    """The model's W13 and W2 stacks of random MXFP4 experts, in the MoE frag layout on ctx."""
    mo = C.MOE_MODELS[variant]
    e, h, i = mo.experts, mo.hidden, mo.intermediate
    w13 = pyquant.from_mxfp4(rng.integers(0, 256, (e, 2 * i, h // 32, 16), dtype=np.uint8),
                             rng.integers(118, 128, (e, 2 * i, h // 32), dtype=np.uint8),
                             rng.uniform(-0.1, 0.1, (e, 2 * i)).astype(BF16))
    w2 = pyquant.from_mxfp4(rng.integers(0, 256, (e, h, i // 32, 16), dtype=np.uint8),
                            rng.integers(118, 128, (e, h, i // 32), dtype=np.uint8),
                            rng.uniform(-0.1, 0.1, (e, h)).astype(BF16))
    return pyquant.moe_repack(w13, w2, "interleaved", ctx=ctx)


def layer_calls(ctx, variant, weights, t, tile_m, rng):
    """Per routing r: launch[r] = (align, stage 1, stage 2) callables of a stream, device
    operands and argument structs built once; and the mean bytes of the experts hit."""
    mo = C.MOE_MODELS[variant]
    e, k, h, i = mo.experts, mo.top_k, mo.hidden, mo.intermediate
    tm = tile_m or default_tile_m(t, k, e, widest=256)  # bf16 on a build with the grouped tier
    d13, d2 = weights
    ms, mt = ctypes.c_int64(), ctypes.c_int64()
    _lib.qg_moe_align_sizes(t, k, e, tm, ctypes.byref(ms), ctypes.byref(mt))
    keep = [d13, d2]
    dev = lambda a: keep.append(DeviceArray.from_numpy(np.ascontiguousarray(a), ctx)) or keep[-1]  # noqa: E731
    x = dev(rng.standard_normal((t, h)).astype(BF16))
    act, y = dev(np.zeros((t * k, i), BF16)), dev(np.zeros((t, h), BF16))
    bf = _lib.DType.QG_DTYPE_BF16
    frag = _lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG
    launches, hits = [], []
    for r in range(ROUTINGS):
        if BALANCED:  # every expert t * k / e rows (when e divides t * k): no tile spills
            ids = ((np.arange(t)[:, None] * k + np.arange(k)[None, :] + r) % e).astype(np.int32)
        else:
            ids = np.argsort(rng.random((t, e)), axis=1)[:, :k].astype(np.int32)
        wts = np.full((t, k), 1.0 / k, np.float32)
        hits.append(np.unique(ids).size)
        dids, dw = dev(ids), dev(wts)
        sv, tv, nv = dev(np.zeros(ms.value, np.int32)), dev(np.zeros(mt.value, np.int32)), dev(np.zeros(1, np.int32))
        a0 = _lib.qg_moe_align_args(num_tokens=t, top_k=k, num_experts=e, tile_m=tm, topk_ids=dids.ptr,
                                    sorted_ids=sv.ptr, tile_experts=tv.ptr, num_sorted=nv.ptr)
        a1 = _lib.qg_moe_stage1_args(
            num_tokens=t, top_k=k, num_experts=e, tile_m=tm, hidden=h, intermediate=i, x_dtype=bf, x=x.ptr,
            ldx=h, sorted_ids=sv.ptr, tile_experts=tv.ptr, num_sorted=nv.ptr, w13_blocks=d13.blocks.ptr,
            w13_scales=d13.scales.ptr, w13_bias=d13.bias.ptr, bias_dtype=bf,
            activation=_lib.Activation.QG_ACT_SWIGLU_OAI, gate_up_layout=_lib.GateUpLayout.QG_GATE_UP_INTERLEAVED,
            swiglu_alpha=1.702, swiglu_limit=7.0, act=act.ptr, layout=frag)
        a2 = _lib.qg_moe_stage2_args(
            num_tokens=t, top_k=k, num_experts=e, tile_m=tm, hidden=h, intermediate=i, act_dtype=bf,
            act=act.ptr, sorted_ids=sv.ptr, tile_experts=tv.ptr, num_sorted=nv.ptr, w2_blocks=d2.blocks.ptr,
            w2_scales=d2.scales.ptr, w2_bias=d2.bias.ptr, bias_dtype=bf, topk_weights=dw.ptr, y_dtype=bf,
            y=y.ptr, ldy=h, layout=frag)
        nbytes = ctypes.c_size_t()
        _lib.qg_moe_stage1_workspace_size(ctx.handle, ctypes.byref(a1), ctypes.byref(nbytes))
        a1.workspace, a1.workspace_bytes = ctx.workspace(nbytes.value, None, purpose="profile1")
        _lib.qg_moe_stage2_workspace_size(ctx.handle, ctypes.byref(a2), ctypes.byref(nbytes))
        a2.workspace, a2.workspace_bytes = ctx.workspace(nbytes.value, None, purpose="profile2")
        keep += [a0, a1, a2]
        launches.append((lambda s, a=a0: _lib.qg_moe_align(ctx.handle, ctypes.byref(a), s),
                         lambda s, a=a1: _lib.qg_moe_stage1(ctx.handle, ctypes.byref(a), s),
                         lambda s, a=a2: _lib.qg_moe_stage2(ctx.handle, ctypes.byref(a), s)))
    weight_bytes = float(np.mean(hits)) * (2 * i * h + h * i) / 32 * 17
    return launches, weight_bytes, tm, keep


def main(argv):
    variant = argv[0]
    ts = [int(v) for v in argv[1].split(",")]
    sides = [(int(v.split(":", 1)[0]), v.split(":", 1)[1] if ":" in v else "")
             for v in (argv[2] if len(argv) > 2 else "0").split(",")]
    ncu = len(argv) > 3 and argv[3] == "ncu"
    ctx = pyquant.gpu_context()
    ctx.set_option("split_k", int(os.environ.get("QG_SPLIT_K", "0")))
    tier = os.environ.get("QG_MOE_TIER", "auto")  # e.g. cuda:moe_wgmma at tile_m 64 (both tiers take it)
    rng = np.random.default_rng(0)
    weights = experts(ctx, variant, rng)
    if ncu:
        ctx.set_tier("moe", sides[0][1] or tier)
        launches, _, _, _ = layer_calls(ctx, variant, weights, ts[0], sides[0][0], rng)
        for r in range(3):
            for f in launches[r % ROUTINGS]:
                f(None)
        ctx.synchronize()
        return
    import torch
    s = torch.cuda.Stream()
    h = s.cuda_stream
    print(f"{variant}: device us per launch (48 back to back) and per layer (graph of 20 layers), "
          f"{ROUTINGS} routings cycled; bandwidth over the mean bytes of the experts hit; "
          f"{C.MOE_MODELS[variant]}")
    print(f"{'T':>5} {'tile_m':>6} {'align':>7} {'stage1':>7} {'stage2':>7} {'sum':>7} {'graph':>7} "
          f"{'MB hit':>7} {'GB/s':>7} tier")
    for t, _rep, (tile_m, side_tier) in itertools.product(ts, range(int(os.environ.get("REPS", "1"))), sides):
        ctx.set_tier("moe", side_tier or tier)
        launches, wbytes, tm, keep = layer_calls(ctx, variant, weights, t, tile_m, rng)
        with torch.cuda.stream(s):
            for r in range(ROUTINGS):
                for f in launches[r]:
                    f(h)
            per = []
            for stage in range(3):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                for c in range(48):
                    launches[c % ROUTINGS][stage](h)
                b.record(s)
                b.synchronize()
                per.append(a.elapsed_time(b) * 1000 / 48)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for c in range(20):
                    for f in launches[c % ROUTINGS]:
                        f(h)
            g.replay()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            for _ in range(5):
                g.replay()
            b.record(s)
            b.synchronize()
            layer = a.elapsed_time(b) * 1000 / 100
        print(f"{t:>5} {tm:>6} {per[0]:7.1f} {per[1]:7.1f} {per[2]:7.1f} {sum(per):7.1f} {layer:7.1f} "
              f"{wbytes / 1e6:7.1f} {wbytes / layer / 1e3:7.0f} {side_tier or tier}")
        del keep


if __name__ == "__main__":
    main(sys.argv[1:])
