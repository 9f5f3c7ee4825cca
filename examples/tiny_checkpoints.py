"""Writes the small checkpoint files the examples run on (CI runs them on these):

    python examples/tiny_checkpoints.py DIR
      DIR/tiny-llama.gguf          one Llama block's MLP: blk.0.ffn_{gate,up}.weight q4_K,
                                   blk.0.ffn_down.weight q6_K, blk.0.ffn_norm.weight f32
                                   (the mix of a Q4_K_M file), llama.* metadata
      DIR/tiny-gpt-oss/            one GPT-OSS MoE layer as the checkpoints ship it:
        model.safetensors          router (bf16), experts' gate_up / down as MXFP4
                                   `_blocks` + `_scales` with bf16 biases
        config.json                hidden_size, intermediate_size, experts, top-k, limit

The weights are random (a fixed seed) but shaped like the real models' tensors, so the
examples' code paths are the ones a real checkpoint takes. The files are quantized with
pyquant's reference quantizer and written with the gguf / safetensors packages
(pip install 'pyquant[all]').
"""
from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np

import pyquant

LLAMA = dict(hidden=256, ffn=512, eps=1e-5)
GPT_OSS = dict(hidden=128, intermediate=64, experts=8, top_k=4, limit=7.0)


def write_llama_gguf(path: str, seed: int = 0) -> str:
    import gguf
    rng = np.random.default_rng(seed)
    h, f = LLAMA["hidden"], LLAMA["ffn"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(f)
    writer.add_layer_norm_rms_eps(LLAMA["eps"])
    T = gguf.GGMLQuantizationType
    for name, shape, fmt in (("blk.0.ffn_gate.weight", (f, h), "q4_K"),
                             ("blk.0.ffn_up.weight", (f, h), "q4_K"),
                             ("blk.0.ffn_down.weight", (h, f), "q6_K")):
        W = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        writer.add_tensor(name, pyquant.quantize(W, fmt).raw, raw_dtype=T[fmt.upper()])
    writer.add_tensor("blk.0.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gpt_oss(folder: str, seed: int = 0) -> str:
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    h, i, e = GPT_OSS["hidden"], GPT_OSS["intermediate"], GPT_OSS["experts"]
    bf16 = ml_dtypes.bfloat16
    p = "model.layers.0.mlp."
    gate_up = pyquant.quantize((rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32), "mxfp4")
    down = pyquant.quantize((rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32), "mxfp4")
    tensors = {
        p + "router.weight": rng.standard_normal((e, h)).astype(bf16),
        p + "router.bias": (0.1 * rng.standard_normal(e)).astype(bf16),
        p + "experts.gate_up_proj_blocks": gate_up.blocks, p + "experts.gate_up_proj_scales": gate_up.scales,
        p + "experts.gate_up_proj_bias": (0.1 * rng.standard_normal((e, 2 * i))).astype(bf16),
        p + "experts.down_proj_blocks": down.blocks, p + "experts.down_proj_scales": down.scales,
        p + "experts.down_proj_bias": (0.1 * rng.standard_normal((e, h))).astype(bf16),
    }
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    config = {"model_type": "gpt_oss", "hidden_size": h, "intermediate_size": i,
              "num_local_experts": e, "num_experts_per_tok": GPT_OSS["top_k"],
              "swiglu_limit": GPT_OSS["limit"], "num_hidden_layers": 1,
              "quantization_config": {"quant_method": "mxfp4"}}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return folder


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    os.makedirs(argv[0], exist_ok=True)
    print(write_llama_gguf(os.path.join(argv[0], "tiny-llama.gguf")))
    print(write_gpt_oss(os.path.join(argv[0], "tiny-gpt-oss")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
