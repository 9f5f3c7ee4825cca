"""One Llama-style MLP block from a .gguf file: h = x + down(silu(gate(n)) * up(n)),
n = rms_norm(x) * ffn_norm, the three projections run by pyquant on their GGUF blocks.

    python examples/llama_mlp.py FILE.gguf [--layer 0] [--tokens 4] [--dtype float32] [--check]

The GEMMs run on the GPU when pyquant has one (weights moved once with .to_device(), x and
the activations stay in device memory; the elementwise SiLU-GLU and the norm run in torch
on the device when torch is installed, else on the host), otherwise on the CPU tier.
--check compares h with a float64 numpy reference of the same block (the weights
dequantized by pyquant's reference) and exits 1 past the bound.
Real files work as they are (llama.cpp's Q4_K_M / Q6_K / Q8_0 ... Llama, Mistral or Qwen
checkpoints: blk.N.ffn_gate / ffn_up / ffn_down); examples/tiny_checkpoints.py writes a
small one.
"""
from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

import pyquant

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu_glu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float32)
    return g / (1.0 + np.exp(-g)) * up.astype(np.float32)


class MLP:
    """The block's weights, on the device when there is one."""

    def __init__(self, ckpt, layer: int, x_dtype=np.float32):
        p = f"blk.{layer}."
        missing = [n for n in ("ffn_gate", "ffn_up", "ffn_down") if p + n + ".weight" not in ckpt]
        if missing:
            raise SystemExit(f"{ckpt.path}: no {', '.join(p + m + '.weight' for m in missing)} "
                             f"(python -m pyquant inspect {ckpt.path} lists what it holds)")
        self.gate, self.up, self.down = (ckpt[p + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        norm = ckpt.get(p + "ffn_norm.weight")
        self.norm = np.ones(self.gate.shape[1], np.float32) if norm is None else np.asarray(norm, np.float32)
        self.eps = float(ckpt.metadata.get("llama.attention.layer_norm_rms_epsilon", 1e-5))
        self.gpu = pyquant.gpu_available()
        if self.gpu:  # one copy of each weight in device memory, rows padded for the GPU tier
            # (q4_0, q4_K, iq4_xs repacked for the frag kernels, which take 16-bit x: fp32 x keeps the blocks)
            ctx = pyquant.gpu_context()
            layout = "canonical" if np.dtype(x_dtype) == np.float32 else "auto"
            self.gate, self.up, self.down = (w.to_device(ctx, layout=layout) for w in (self.gate, self.up, self.down))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        n = rms_norm(x, self.norm, self.eps).astype(x.dtype)
        if not self.gpu:
            act = silu_glu(pyquant.gemm(n, self.gate), pyquant.gemm(n, self.up)).astype(x.dtype)
            return (x.astype(np.float32) + pyquant.gemm(act, self.down).astype(np.float32)).astype(x.dtype)
        ctx = pyquant.gpu_context()
        nd = pyquant.DeviceArray.from_numpy(n, ctx)
        g, u = pyquant.gemm(nd, self.gate), pyquant.gemm(nd, self.up)   # DeviceArrays
        try:
            import torch  # the elementwise part on the device, through DLPack (no copies)
        except ImportError:  # no torch: the elementwise part on the host
            act = silu_glu(g.to_numpy(), u.to_numpy()).astype(x.dtype)
            y = pyquant.gemm(pyquant.DeviceArray.from_numpy(act, ctx), self.down).to_numpy()
            return (x.astype(np.float32) + y.astype(np.float32)).astype(x.dtype)
        gt, ut = torch.from_dlpack(g), torch.from_dlpack(u)
        act = (torch.nn.functional.silu(gt.float()) * ut.float()).to(gt.dtype)
        y = torch.from_dlpack(pyquant.gemm(act, self.down))      # a torch tensor in, too
        xt = torch.from_dlpack(pyquant.DeviceArray.from_numpy(x, ctx))
        return _to_host((xt.float() + y.float()).to(y.dtype), x.dtype)


def _to_host(t, dtype) -> np.ndarray:
    import torch
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy().astype(dtype)


def reference(mlp: MLP, x: np.ndarray) -> np.ndarray:
    """float64 numpy: the same block on the dequantized weights (the numpy reference)."""
    deq = [w.dequantize().astype(np.float64) for w in (mlp.gate, mlp.up, mlp.down)]
    x64 = x.astype(np.float64)
    n = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + mlp.eps) * mlp.norm
    g, u = n @ deq[0].T, n @ deq[1].T
    return x64 + (g / (1 + np.exp(-g)) * u) @ deq[2].T


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help=".gguf file (examples/tiny_checkpoints.py writes a small one)")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=4, help="rows of x (M)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--check", action="store_true", help="compare with the float64 reference")
    args = ap.parse_args(argv)

    ckpt = pyquant.load_gguf(args.file)
    mlp = MLP(ckpt, args.layer, DTYPES[args.dtype])
    hidden = mlp.gate.shape[1]
    x = np.random.default_rng(0).standard_normal((args.tokens, hidden)).astype(DTYPES[args.dtype])
    h = mlp(x)
    where = pyquant.gpu_context().backend if mlp.gpu else "cpu"
    print(f"{args.file}: blk.{args.layer} MLP ({mlp.gate.format} gate/up {list(mlp.gate.shape)}, "
          f"{mlp.down.format} down {list(mlp.down.shape)}) on {where}: x {list(x.shape)} {args.dtype} "
          f"-> h {list(h.shape)}, |h| = {np.linalg.norm(h.astype(np.float64)):.4f}")
    if args.check:
        ref = reference(mlp, x)
        err = np.linalg.norm(h.astype(np.float64) - ref) / np.linalg.norm(ref)
        # fp32 x: the decoded weights are exact, the error is fp32 rounding through three
        # GEMMs (~1e-6); fp16 / bf16 x: x, the norm and the activation are rounded to the
        # dtype between the GEMMs (about its unit roundoff each), x4 for the three steps
        # plus the int8 activations (2^-8) that both the GPU tier and the CPU tier's
        # default precision (cpu_precision auto) feed the GGUF GEMM. A wrong layout or
        # activation gives an error of order 1.
        unit = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[args.dtype]
        bound = 4 * max(unit, 2.0 ** -8) + 1e-5
        print(f"check: ||h - ref|| / ||ref|| = {err:.2e} (bound {bound:.1e})")
        if not err <= bound:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
