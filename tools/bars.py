#!/usr/bin/env python3
"""The GPU issues' bar rows (issues 12-16) read from a golden file: each bar's measured value,
its threshold and whether it holds, and the bar rows the file has no row for.

    python3 tools/bars.py bench/golden/h100.json [--issue 14] [--failing]

Values, as the issues define them: a decode row's share of copy bandwidth is GB/s / the
file's copy_GBps ("not slower per byte": within the file's noise_band); "x cuBLAS" is cuBLAS bf16's time / ours (>= 0.85: ours at 85 % of its
TFLOP/s); roofline is the row's roofline_pct; the ragged-M cliff compares time(M) with
1.15 x time(M0) x M / M0 of the same case at M0 = 512 (M = 517) or 256 (M = 300).
The issues ask for these rows on an H200: read another device's file as what it says.
"""
from __future__ import annotations

import argparse
import json
import sys

W4_DECODE_SHAPES = ("43008x5376", "16384x5376", "5376x21504", "14336x4096", "4096x14336")
PREFILL_SHAPES = ("43008x5376", "5376x21504", "4096x14336")
GGUF_SHAPES = ("43008x5376", "5376x21504")
GGUF_FORMATS = ("q8_0", "q4_0", "q4_K", "q6_K", "iq4_xs", "iq3_xxs")
W4_VARIANTS = ("g128-asym-bf16", "g32-asym-bf16")
MOE_MODELS = ("gpt-oss-120b", "gpt-oss-20b")


def shape_of(row):
    return f"{row['n']}x{row['k']}"


class Golden:
    """Rows of a golden file by case (family, format, variant, NxK, m)."""

    def __init__(self, doc):
        self.copy = float(doc["copy_GBps"])
        self.band = float(doc.get("noise_band", 0.0))  # "not slower" holds within the run's noise
        self.rows = {(r["family"], r["format"], r["variant"], shape_of(r), r["m"]): r for r in doc["rows"]}

    def get(self, family, fmt, variant, shape, m):
        return self.rows.get((family, fmt, variant, shape, m))


# A bar check: (issue, description, value or None (no row), threshold, holds)
def check(out, issue, what, value, threshold, holds=None):
    if value is None:
        out.append((issue, what, None, threshold, None))
    else:
        out.append((issue, what, value, threshold, value >= threshold if holds is None else holds))


def copy_share(g, row):
    return None if row is None else 100.0 * row["GBps"] / g.copy


def per_byte(a, b):
    """GB/s of row a over row b's, or None where either is missing."""
    return None if a is None or b is None else a["GBps"] / b["GBps"]


def x_cublas(row):
    if row is None or "cublas_bf16" not in (row.get("peers") or {}):
        return None
    return row["peers"]["cublas_bf16"] / row["median_us"]


def cliff(out, issue, g, family, fmt, variant, shape, m, m0):
    a, b = g.get(family, fmt, variant, shape, m), g.get(family, fmt, variant, shape, m0)
    what = f"{family} {fmt} {variant} {shape} t(M={m}) / (1.15 t({m0}) {m}/{m0}), at most 1"
    if a is None or b is None:
        check(out, issue, what, None, 1.0)
        return
    ratio = a["median_us"] / (1.15 * b["median_us"] * m / m0)
    out.append((issue, what, ratio, 1.0, ratio <= 1.0))


def bars(g):
    out = []
    # issue 12: W4A16 decode
    for v in W4_VARIANTS:
        for s in W4_DECODE_SHAPES:
            for m, t in ((1, 85), (4, 80), (8, 80), (16, 75)):
                check(out, 12, f"w4a16 {v} {s} M={m} % of copy", copy_share(g, g.get("w4a16", "int4", v, s, m)), t)
    check(out, 12, "w4a16 g128-asym-fp16 43008x5376 M=1 % of copy",
          copy_share(g, g.get("w4a16", "int4", "g128-asym-fp16", "43008x5376", 1)), 85)
    for s in W4_DECODE_SHAPES:
        for m in (1, 4, 8, 16):
            a, b = (g.get("w4a16", "int4", v, s, m) for v in W4_VARIANTS)
            check(out, 12, f"w4a16 {s} M={m} GB/s g128 / g32 (no group-size regression)", per_byte(a, b),
                  1.0 - g.band)
    # issue 13: GGUF decode
    for f in GGUF_FORMATS:
        for s in GGUF_SHAPES:
            for m, t in ((1, 75 if f == "iq3_xxs" else 85), (4, 75), (16, 65)):
                check(out, 13, f"gguf {f} bf16 {s} M={m} % of copy", copy_share(g, g.get("gguf", f, "bf16", s, m)), t)
            check(out, 13, f"gguf {f} bf16 {s} GB/s M=2 / M=1",
                  per_byte(g.get("gguf", f, "bf16", s, 2), g.get("gguf", f, "bf16", s, 1)), 1.0 - g.band)
    # issue 14: W4A16 prefill
    for v in W4_VARIANTS:
        for s in PREFILL_SHAPES:
            for m in (512, 2048):
                check(out, 14, f"w4a16 {v} {s} M={m} x cuBLAS", x_cublas(g.get("w4a16", "int4", v, s, m)), 0.85)
            for m in (32, 64, 128):
                row = g.get("w4a16", "int4", v, s, m)
                check(out, 14, f"w4a16 {v} {s} M={m} roofline %", None if row is None else row["roofline_pct"], 70)
                if m in (32, 64):
                    x = x_cublas(row)
                    check(out, 14, f"w4a16 {v} {s} M={m} x cuBLAS (faster)", x, 1.0,
                          None if x is None else x > 1.0)
            cliff(out, 14, g, "w4a16", "int4", v, s, 517, 512)
            cliff(out, 14, g, "w4a16", "int4", v, s, 300, 256)
    # issue 15: GGUF prefill
    for f in GGUF_FORMATS:
        for s in GGUF_SHAPES:
            for m in (512, 2048):
                check(out, 15, f"gguf {f} bf16 {s} M={m} x cuBLAS", x_cublas(g.get("gguf", f, "bf16", s, m)), 0.70)
            row = g.get("gguf", f, "bf16", s, 64)
            check(out, 15, f"gguf {f} bf16 {s} M=64 roofline %", None if row is None else row["roofline_pct"], 60)
            x = x_cublas(row)
            check(out, 15, f"gguf {f} bf16 {s} M=64 x cuBLAS (faster)", x, 1.0, None if x is None else x > 1.0)
            cliff(out, 15, g, "gguf", f, "bf16", s, 517, 512)
    # issue 16: MoE and dense MXFP4
    for model in MOE_MODELS:
        for t in (1, 8, 64, 512, 2048):
            row = g.get("moe", "mxfp4", model, "5760x2880", t)
            if t <= 64:
                check(out, 16, f"moe {model} T={t} % of copy", copy_share(g, row), 75)
            else:
                check(out, 16, f"moe {model} T={t} roofline %", None if row is None else row["roofline_pct"], 50)
            peer = None if row is None else (row.get("peers") or {}).get("torch_grouped_mm")
            x = None if peer is None else peer / row["median_us"]
            check(out, 16, f"moe {model} T={t} x torch._grouped_mm (faster)", x, 1.0, None if x is None else x > 1.0)
    check(out, 16, "mxfp4 bf16 43008x5376 M=1 % of copy", copy_share(g, g.get("mxfp4", "mxfp4", "bf16", "43008x5376", 1)),
          85)
    check(out, 16, "mxfp4 bf16 43008x5376 M=512 x cuBLAS", x_cublas(g.get("mxfp4", "mxfp4", "bf16", "43008x5376", 512)),
          0.70)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("golden", help="a golden file (bench/golden/<device>.json)")
    ap.add_argument("--issue", type=int, action="append", help="only these issues (repeatable)")
    ap.add_argument("--failing", action="store_true", help="only the bar rows that fail or have no row")
    args = ap.parse_args(argv)
    with open(args.golden) as f:
        doc = json.load(f)
    rows = [b for b in bars(Golden(doc)) if not args.issue or b[0] in args.issue]
    print(f"{args.golden}: {doc.get('device', '?')}, copy {doc['copy_GBps']} GB/s")
    for issue in sorted({b[0] for b in rows}):
        mine = [b for b in rows if b[0] == issue]
        held = sum(1 for b in mine if b[4])
        missing = sum(1 for b in mine if b[4] is None)
        print(f"\nissue {issue}: {held} of {len(mine)} bar rows hold, {len(mine) - held - missing} fail, "
              f"{missing} have no row")
        for _, what, value, threshold, holds in mine:
            if args.failing and holds:
                continue
            verdict = "no row" if holds is None else "ok" if holds else "FAIL"
            shown = "-" if value is None else f"{value:.2f}"
            print(f"  {verdict:6} {shown:>7} (bar {threshold:g})  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
