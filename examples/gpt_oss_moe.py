"""One GPT-OSS mixture-of-experts layer from a checkpoint: router -> top-k -> pyquant.moe
(MXFP4 experts: gate_up GEMM + GPT-OSS SwiGLU, down GEMM + top-k weighted sum, biases).

    python examples/gpt_oss_moe.py CHECKPOINT [--layer 0] [--tokens 4] [--check]

CHECKPOINT is a .safetensors file or a folder of shards as openai/gpt-oss-20b and -120b
ship them (model.layers.N.mlp.router.*, model.layers.N.mlp.experts.{gate_up,down}_proj_
{blocks,scales,bias}); config.json beside it gives top-k and the SwiGLU limit.
examples/tiny_checkpoints.py writes a small one. The router is a plain bf16 linear layer
(numpy here: [T, H] x [H, E] is tiny); GPT-OSS takes the top-k logits and softmaxes over
those k. The experts run on the GPU when pyquant has one and its build has a MoE tier
there (python -m pyquant info lists the tiers), otherwise on the CPU tier.
--check compares with pyquant's float64 reference of the same layer (formats/reference.py)
and exits 1 past the bound.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import ml_dtypes
import numpy as np

import pyquant
from pyquant.formats import reference
from pyquant.loaders.inspect import tier_for


def load_layer(path: str, layer: int):
    ckpt = pyquant.load_safetensors(path)
    p = f"model.layers.{layer}.mlp."
    need = [p + n for n in ("router.weight", "experts.gate_up_proj", "experts.down_proj")]
    missing = [n for n in need if n not in ckpt]
    if missing:
        raise SystemExit(f"{path}: no {', '.join(missing)} (python -m pyquant inspect {path} lists "
                         "what it holds)")
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    config = {}
    if os.path.isfile(os.path.join(folder, "config.json")):
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
    return dict(router_w=np.asarray(ckpt[p + "router.weight"], np.float32),
                router_b=np.asarray(ckpt.get(p + "router.bias", 0), np.float32),
                w13=ckpt[p + "experts.gate_up_proj"], w2=ckpt[p + "experts.down_proj"],
                b13=ckpt.get(p + "experts.gate_up_proj_bias"), b2=ckpt.get(p + "experts.down_proj_bias"),
                top_k=int(config.get("num_experts_per_tok", 4)),
                limit=float(config.get("swiglu_limit", 7.0)))


def route(x: np.ndarray, layer: dict):
    """GPT-OSS routing: the top-k router logits, softmax over those k."""
    logits = x.astype(np.float32) @ layer["router_w"].T + layer["router_b"]
    k = layer["top_k"]
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, axis=-1)
    weights = np.exp(top - top.max(axis=-1, keepdims=True))
    return ids.astype(np.int32), (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help=".safetensors file or folder (examples/tiny_checkpoints.py writes one)")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="compare with the float64 reference")
    args = ap.parse_args(argv)

    layer = load_layer(args.checkpoint, args.layer)
    w13, w2 = layer["w13"], layer["w2"]
    e, two_i, hidden = w13.shape
    x = np.random.default_rng(0).standard_normal((args.tokens, hidden)).astype(ml_dtypes.bfloat16)
    ids, weights = route(x, layer)
    kw = dict(activation="swiglu_oai", gate_up_layout="interleaved", limit=layer["limit"],
              w13_bias=layer["b13"], w2_bias=layer["b2"])

    on_gpu = pyquant.gpu_available() and tier_for(
        "mxfp4", pyquant.build_info(), pyquant.gpu_context().backend, experts=True).startswith(
        pyquant.gpu_context().backend)
    if on_gpu:  # weights, biases and activations in device memory
        ctx = pyquant.gpu_context()
        dev = lambda a: None if a is None else pyquant.DeviceArray.from_numpy(np.ascontiguousarray(a), ctx)  # noqa: E731
        d13, d2 = pyquant.moe_repack(w13, w2, "interleaved", ctx=ctx)  # the MoE frag layout, once
        y = pyquant.moe(dev(x), dev(ids), dev(weights), d13, d2,
                        **{**kw, "w13_bias": dev(kw["w13_bias"]), "w2_bias": dev(kw["w2_bias"])}).to_numpy()
        where = ctx.backend
    else:
        y = pyquant.moe(x, ids, weights, w13, w2, **kw)
        where = "cpu" + ("" if not pyquant.gpu_available() else " (this build has no GPU MoE tier)")
    print(f"{args.checkpoint}: layer {args.layer} MoE ({e} experts, top-{layer['top_k']}, hidden {hidden}, "
          f"intermediate {two_i // 2}) on {where}: x {list(x.shape)} bf16 -> y {list(y.shape)}, "
          f"experts used {sorted(set(ids.ravel().tolist()))}")
    if args.check:
        ref = reference.moe(x, ids, weights, w13.dequantize(), w2.dequantize(),
                            None if layer["b13"] is None else np.asarray(layer["b13"], np.float32),
                            None if layer["b2"] is None else np.asarray(layer["b2"], np.float32),
                            activation="swiglu_oai", gate_up_layout="interleaved",
                            limit=layer["limit"], act_dtype="bf16")
        err = np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)
        # bf16 x and y: the reference rounds the stage-1 activation to bf16 as the library
        # does, so what is left is y's own rounding and fp32 sums (a few bf16 units, 2^-8
        # each); a wrong expert, layout or activation gives an error of order 1
        bound = 4 * 2.0 ** -8
        print(f"check: ||y - ref|| / ||ref|| = {err:.2e} (bound {bound:.1e})")
        if not err <= bound:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
