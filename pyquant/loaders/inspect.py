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
    """One row per loaded name (a quantized layer groups its file tensors: `members`),
    then one per name that could not be loaded (format "unsupported", tier the reason):
    together the rows name every tensor of the file. Columns: name, source, format,
    shape, bytes, bits per weight, tier, members."""
    rows = []
    for name, t in ckpt.tensors.items():
        if isinstance(t, np.ndarray):
            rows.append(dict(name=name, source=ckpt.source.get(name, ""), format=str(t.dtype),
                             shape=list(t.shape), bytes=int(t.nbytes),
                             bits_per_weight=float(t.dtype.itemsize * 8), tier="-",
                             members=ckpt.members_of(name)))
            continue
        shape = [int(d) for d in t.shape]
        fmt = t.format
        variant = fmt
        if fmt == "int4":
            variant = f"int4 g{t.group_size} {'sym' if t.qzeros is None else 'asym'}"
        rows.append(dict(name=name, source=ckpt.source.get(name, ""), format=variant,
                         shape=shape, bytes=int(t.nbytes),
                         bits_per_weight=float(t.bits_per_weight),
                         tier=tier_for(fmt, build_info, backend, experts=len(shape) == 3),
                         members=ckpt.members_of(name)))
    for name, why in ckpt.unsupported.items():
        rows.append(dict(name=name, source=ckpt.container, format="unsupported", shape=[],
                         bytes=0, bits_per_weight=0.0, tier=f"unsupported: {why}",
                         members=ckpt.members_of(name)))
    return rows


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _looks_like_safetensors(head: bytes) -> bool:
    return len(head) >= 9 and head[8:9] == b"{"


def load(path: str) -> Checkpoint:
    """Pick the loader by what the file holds, then by its name: the GGUF magic is read as
    GGUF, an 8-byte length followed by JSON as safetensors (whatever the extension says:
    misnamed() tells), any other .gguf file as GGUF (whose refusal says what it is), the
    rest and directories (of shards) as safetensors."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(9)
        if head[:4] == b"GGUF":
            return load_gguf(path)
        if path.lower().endswith(".gguf") and not _looks_like_safetensors(head):
            return load_gguf(path)
    return load_safetensors(path)


def misnamed(path: str, container: str) -> str | None:
    """A note when a file's extension names another container than the one it holds."""
    ext = os.path.splitext(path)[1].lower()
    named = {".gguf": "gguf", ".safetensors": "safetensors"}.get(ext)
    if os.path.isfile(path) and named is not None and named != container:
        return f"note: {os.path.basename(path)} is named {ext} but holds a {container} file (read as {container})"
    return None


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
    note = misnamed(args.file, ckpt.container)
    if note:
        print(f"inspect: {note}", file=sys.stderr)
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
                          "build_info": build_info, "file_tensors": len(ckpt.file_tensors),
                          "tensors": rows, "unsupported": ckpt.unsupported}, indent=1))
        return

    loaded = [r for r in rows if r["format"] != "unsupported"]
    for r in rows:
        r["shape"] = "x".join(str(d) for d in r["shape"]) or "-"
        r["bits/w"] = f"{r['bits_per_weight']:.3f}" if r["format"] != "unsupported" else "-"
        if r["format"] == "unsupported":
            r["bytes"] = "-"
        grouped = r["members"] != [r["name"]]
        r["source"] = f"{r['source']} ({', '.join(m.rsplit('.', 1)[-1] for m in r['members'])})" \
            if grouped else r["source"]
    n_quant = sum(1 for r in loaded if r["tier"] != "-")
    print(f"{args.file} ({ckpt.container}: {len(ckpt.file_tensors)} tensors in the file -> "
          f"{n_quant} quantized weights, {len(loaded) - n_quant} other tensors, "
          f"{len(ckpt.unsupported)} unsupported, all listed below)")
    print(_table(rows, ["name", "source", "format", "shape", "bytes", "bits/w", "tier"]))

    totals: dict[str, list[int]] = {}
    for r in loaded:
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
    print(f"\nbackend: {backend}; build: {build_info}")


if __name__ == "__main__":
    sys.exit(main())
