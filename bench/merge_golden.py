#!/usr/bin/env python3
"""Merge the rows of per-run golden files (`python -m pyquant bench --record`) into a device's
golden file (bench/golden/<device>.json).

    python3 bench/merge_golden.py bench/golden/h200.json RUN.json [RUN.json ...] --note "..."

A row is a case (family, format, variant, n, k, m). Only rows recorded reproducible (within
the run's noise band) are merged: each replaces the golden row of the same case or is added.
A run recorded on another device is refused (its header's `device` must equal the golden's;
a new golden file takes the first run's header). The note is appended to the golden's `note`.
Prints what it replaced, added and left out; writes nothing when a run is refused.
"""
import argparse
import json
import os
import sys


def case(row):
    return (row["family"], row["format"], row["variant"], row["n"], row["k"], row["m"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("golden", help="the device's golden file (created from the first run's header if absent)")
    ap.add_argument("runs", nargs="+", help="per-run files written by bench --record")
    ap.add_argument("--note", default="", help="appended to the golden's note (what was recorded, with which build)")
    args = ap.parse_args(argv)

    runs = [json.load(open(p)) for p in args.runs]
    if os.path.exists(args.golden):
        golden = json.load(open(args.golden))
    else:
        golden = {k: v for k, v in runs[0].items() if k != "rows"}
        golden["rows"], golden["note"] = [], ""
    for path, run in zip(args.runs, runs):
        if run.get("device") != golden.get("device"):
            sys.exit(f"{path}: recorded on {run.get('device')!r}, the golden file is {golden.get('device')!r}")

    index = {case(r): i for i, r in enumerate(golden["rows"])}
    replaced = added = left = 0
    for path, run in zip(args.runs, runs):
        for row in run["rows"]:
            if not row.get("reproducible"):
                left += 1
                print(f"left out (not reproducible): {path}: {' '.join(map(str, case(row)))}")
                continue
            key = case(row)
            if key in index:
                golden["rows"][index[key]] = row
                replaced += 1
            else:
                index[key] = len(golden["rows"])
                golden["rows"].append(row)
                added += 1
    if args.note:
        golden["note"] = (golden.get("note", "") + " " + args.note).strip()
    with open(args.golden, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"{args.golden}: {replaced} rows replaced, {added} added, {left} left out")


if __name__ == "__main__":
    main()
