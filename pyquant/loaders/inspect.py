"""`python -m pyquant inspect FILE`: what a checkpoint holds and which tier would run it."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .. import formats as _formats
from .. import tiers as _tiers
from .checkpoint import Checkpoint
from .gguf_file import load_gguf
from .safetensors_file import load_safetensors

# Kernel family of each FormatSpec.kind, as qg_build_info() names families ("tiers: w4a16=...").
_FAMILY_OF_KIND = {"int4": "w4a16", "gguf": "gguf", "mxfp4": "mxfp4"}
def tier_for(fmt: str, build_info: str, backend: str, experts: bool = False) -> str:
    """Which tiers of a build (its qg_build_info text) can run a weight of format `fmt` on a
    context of `backend` ("cpu", "cuda", "hip"); experts=True for stacked MoE weights. The
    auto policy of the family's tier table picks among them by M, layout and device."""
    family = "moe" if experts else _FAMILY_OF_KIND[_formats.get(fmt).kind]
    listed = _tiers.parse(build_info).get(family, [])
    if backend == "cpu":
        return "cpu" if "cpu" in listed or not listed else f"none ({family} not built)"
    names = [t for t in listed if _tiers.backend_of(t) == backend]
    if not names:
        return f"cpu only (no {backend} tier for {family} in this build)"
    return " / ".join(names)


def _build_and_backend() -> tuple[str, str]:
    import pyquant

    return pyquant.build_info(), pyquant.default_context().backend


def describe(ckpt: Checkpoint, build_info: str, backend: str) -> list[dict]:
    """One row per tensor: name, source, format, shape, bytes, bits per weight, tier."""
    rows = []
    for name, t in ckpt.tensors.items():
        if isinstance(t, np.ndarray):
            rows.append(dict(name=name, source=ckpt.source.get(name, ""), format=str(t.dtype),
                             shape=list(t.shape), bytes=int(t.nbytes),
                             bits_per_weight=float(t.dtype.itemsize * 8), tier="-"))
            continue
        shape = [int(d) for d in t.shape]
        fmt = t.format
        variant = fmt
        if fmt == "int4":
            variant = f"int4 g{t.group_size} {'sym' if t.qzeros is None else 'asym'}"
        rows.append(dict(name=name, source=ckpt.source.get(name, ""), format=variant,
                         shape=shape, bytes=int(t.nbytes),
                         bits_per_weight=float(t.bits_per_weight),
                         tier=tier_for(fmt, build_info, backend, experts=len(shape) == 3)))
    return rows


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def load(path: str) -> Checkpoint:
    """Pick the loader: a file with the GGUF magic or a .gguf name is read as GGUF, any
    other file or a directory (of shards) as safetensors."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF" or path.lower().endswith(".gguf"):
                return load_gguf(path)
    return load_safetensors(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pyquant inspect",
        description="List the tensors of a .gguf or .safetensors file: format, shape, bytes, "
                    "bits per weight, and the tier of this build that would run each.")
    ap.add_argument("file", help=".gguf file, .safetensors file, or a directory of .safetensors shards")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--quantized", action="store_true", help="list quantized tensors only")
    args = ap.parse_args(argv)

    if not os.path.exists(args.file):
        print(f"inspect: no such file: {args.file}", file=sys.stderr)
        return 2
    try:
        ckpt = load(args.file)
    except Exception as e:  # malformed files and the reader libraries' own errors: one line
        msg = str(e) if isinstance(e, (OSError, ValueError, ImportError)) else f"{type(e).__name__}: {e}"
        if not msg.startswith(args.file):
            msg = f"{args.file}: {msg}"
        print(f"inspect: cannot read {msg}", file=sys.stderr)
        return 2
    build_info, backend = _build_and_backend()
    rows = describe(ckpt, build_info, backend)
    if args.quantized:
        rows = [r for r in rows if r["tier"] != "-"]
    try:
        _print_report(args, ckpt, rows, build_info, backend)
    except BrokenPipeError:  # `inspect FILE | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _print_report(args, ckpt: Checkpoint, rows: list[dict], build_info: str, backend: str) -> None:
    if args.json:
        print(json.dumps({"file": args.file, "container": ckpt.container, "backend": backend,
                          "build_info": build_info, "tensors": rows,
                          "unsupported": ckpt.unsupported}, indent=1))
        return

    for r in rows:
        r["shape"] = "x".join(str(d) for d in r["shape"])
        r["bits/w"] = f"{r['bits_per_weight']:.3f}"
    print(f"{args.file} ({ckpt.container}, {len(ckpt.tensors)} tensors)")
    print(_table(rows, ["name", "source", "format", "shape", "bytes", "bits/w", "tier"]))

    totals: dict[str, list[int]] = {}
    for r in rows:
        n_el = int(np.prod([int(d) for d in r["shape"].split("x") if d] or [1]))
        t = totals.setdefault(r["format"], [0, 0, 0])
        t[0] += 1
        t[1] += n_el
        t[2] += r["bytes"]
    print("\nby format:")
    print(_table([dict(format=f, tensors=c, weights=n, bytes=b,
                       **{"bits/w": f"{b * 8 / max(n, 1):.3f}"})
                  for f, (c, n, b) in totals.items()],
                 ["format", "tensors", "weights", "bytes", "bits/w"]))
    if ckpt.unsupported:
        print(f"\nnot loaded ({len(ckpt.unsupported)}):")
        for name, why in ckpt.unsupported.items():
            print(f"  {name}: {why}")
    print(f"\nbackend: {backend}; build: {build_info}")


if __name__ == "__main__":
    sys.exit(main())
